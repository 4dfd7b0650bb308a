/*
 * The one list of what libvcuda.so intercepts.
 *
 * Each row names a driver symbol exactly as libcuda.so.1 / libnvidia-ml.so.1
 * export it (with its _v2 / _ptsz suffix), its parameters and its arguments.
 * From this list come: the prototypes (checked by the compiler against the
 * vendor header), the table of real entry points, the exported wrappers, and
 * the map from a real entry point to its wrapper used by dlsym and
 * cuGetProcAddress. Adding a row without writing its wrapper fails the link.
 * Kernel launches are rows of their own kind: their wrappers are handed out
 * only when a core limit is set (cores < 100), so that an unlimited process
 * launches through the driver's own entry points.
 *
 * VC_HELPERS lists driver calls the shim makes for itself without
 * intercepting them; they get a real entry point but no export.
 */
#ifndef VC_INTERCEPT_H
#define VC_INTERCEPT_H

/* The parameters of the launch calls, shared by each one and its _ptsz twin. */
#define VC_LAUNCH_KERNEL_PARAMS                                                                    \
    (CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,            \
     unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,                       \
     unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra)
#define VC_LAUNCH_KERNEL_ARGS                                                                      \
    (f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream,    \
     kernelParams, extra)
#define VC_LAUNCH_EX_PARAMS                                                                        \
    (const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra)
#define VC_LAUNCH_EX_ARGS (config, f, kernelParams, extra)
#define VC_LAUNCH_COOPERATIVE_PARAMS                                                               \
    (CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,            \
     unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,                       \
     unsigned int sharedMemBytes, CUstream hStream, void **kernelParams)
#define VC_LAUNCH_COOPERATIVE_ARGS                                                                 \
    (f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream,    \
     kernelParams)
#define VC_BEGIN_TO_GRAPH_PARAMS                                                                   \
    (CUstream hStream, CUgraph hGraph, const CUgraphNode *dependencies,                            \
     const CUgraphEdgeData *dependencyData, size_t numDependencies, CUstreamCaptureMode mode)
#define VC_BEGIN_TO_GRAPH_ARGS (hStream, hGraph, dependencies, dependencyData, numDependencies, mode)

/* CU(name, params, args) for libcuda.so.1; NVML(name, params, args) for libnvidia-ml.so.1;
 * LAUNCH(name, params, args) for libcuda.so.1's kernel and graph launches. */
#define VC_INTERCEPTED(CU, NVML, LAUNCH)                                                           \
    CU(cuGetProcAddress, (const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags),      \
       (symbol, pfn, cudaVersion, flags))                                                           \
    CU(cuGetProcAddress_v2,                                                                         \
       (const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,                          \
        CUdriverProcAddressQueryResult *symbolStatus),                                              \
       (symbol, pfn, cudaVersion, flags, symbolStatus))                                             \
    CU(cuInit, (unsigned int Flags), (Flags))                                                       \
    CU(cuDeviceTotalMem_v2, (size_t *bytes, CUdevice dev), (bytes, dev))                            \
    CU(cuMemGetInfo_v2, (size_t *free, size_t *total), (free, total))                               \
    CU(cuDevicePrimaryCtxRetain, (CUcontext *pctx, CUdevice dev), (pctx, dev))                      \
    CU(cuDevicePrimaryCtxRelease, (CUdevice dev), (dev))                                            \
    CU(cuDevicePrimaryCtxRelease_v2, (CUdevice dev), (dev))                                         \
    CU(cuDevicePrimaryCtxReset, (CUdevice dev), (dev))                                              \
    CU(cuDevicePrimaryCtxReset_v2, (CUdevice dev), (dev))                                           \
    CU(cuCtxCreate_v2, (CUcontext *pctx, unsigned int flags, CUdevice dev), (pctx, flags, dev))     \
    CU(cuCtxCreate_v3,                                                                              \
       (CUcontext *pctx, CUexecAffinityParam *paramsArray, int numParams, unsigned int flags,       \
        CUdevice dev),                                                                              \
       (pctx, paramsArray, numParams, flags, dev))                                                  \
    CU(cuCtxCreate_v4,                                                                              \
       (CUcontext *pctx, CUctxCreateParams *ctxCreateParams, unsigned int flags, CUdevice dev),     \
       (pctx, ctxCreateParams, flags, dev))                                                         \
    CU(cuCtxDestroy_v2, (CUcontext ctx), (ctx))                                                     \
    CU(cuMemAlloc_v2, (CUdeviceptr *dptr, size_t bytesize), (dptr, bytesize))                       \
    CU(cuMemAllocPitch_v2,                                                                          \
       (CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height,                      \
        unsigned int ElementSizeBytes),                                                             \
       (dptr, pPitch, WidthInBytes, Height, ElementSizeBytes))                                      \
    CU(cuMemAllocManaged, (CUdeviceptr *dptr, size_t bytesize, unsigned int flags),                 \
       (dptr, bytesize, flags))                                                                     \
    CU(cuMemFree_v2, (CUdeviceptr dptr), (dptr))                                                    \
    CU(cuArrayCreate_v2, (CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *pAllocateArray),           \
       (pHandle, pAllocateArray))                                                                   \
    CU(cuArray3DCreate_v2, (CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *pAllocateArray),       \
       (pHandle, pAllocateArray))                                                                   \
    CU(cuArrayDestroy, (CUarray hArray), (hArray))                                                  \
    CU(cuMipmappedArrayCreate,                                                                      \
       (CUmipmappedArray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *pMipmappedArrayDesc,              \
        unsigned int numMipmapLevels),                                                              \
       (pHandle, pMipmappedArrayDesc, numMipmapLevels))                                             \
    CU(cuMipmappedArrayDestroy, (CUmipmappedArray hMipmappedArray), (hMipmappedArray))              \
    CU(cuMemCreate,                                                                                 \
       (CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,         \
        unsigned long long flags),                                                                  \
       (handle, size, prop, flags))                                                                 \
    CU(cuMemRelease, (CUmemGenericAllocationHandle handle), (handle))                               \
    CU(cuMemImportFromShareableHandle,                                                              \
       (CUmemGenericAllocationHandle *handle, void *osHandle,                                       \
        CUmemAllocationHandleType shHandleType),                                                    \
       (handle, osHandle, shHandleType))                                                            \
    CU(cuMemRetainAllocationHandle, (CUmemGenericAllocationHandle *handle, void *addr),             \
       (handle, addr))                                                                              \
    CU(cuMemMap,                                                                                    \
       (CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,           \
        unsigned long long flags),                                                                  \
       (ptr, size, offset, handle, flags))                                                          \
    CU(cuMemUnmap, (CUdeviceptr ptr, size_t size), (ptr, size))                                     \
    CU(cuMemAllocAsync, (CUdeviceptr *dptr, size_t bytesize, CUstream hStream),                     \
       (dptr, bytesize, hStream))                                                                   \
    CU(cuMemAllocAsync_ptsz, (CUdeviceptr *dptr, size_t bytesize, CUstream hStream),                \
       (dptr, bytesize, hStream))                                                                   \
    CU(cuMemAllocFromPoolAsync,                                                                     \
       (CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream),                   \
       (dptr, bytesize, pool, hStream))                                                             \
    CU(cuMemAllocFromPoolAsync_ptsz,                                                                \
       (CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream),                   \
       (dptr, bytesize, pool, hStream))                                                             \
    CU(cuMemPoolCreate, (CUmemoryPool *pool, const CUmemPoolProps *poolProps), (pool, poolProps))  \
    CU(cuMemPoolDestroy, (CUmemoryPool pool), (pool))                                               \
    CU(cuMemPoolTrimTo, (CUmemoryPool pool, size_t minBytesToKeep), (pool, minBytesToKeep))         \
    CU(cuIpcOpenMemHandle, (CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags),        \
       (pdptr, handle, Flags))                                                                      \
    CU(cuIpcOpenMemHandle_v2, (CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags),     \
       (pdptr, handle, Flags))                                                                      \
    CU(cuIpcCloseMemHandle, (CUdeviceptr dptr), (dptr))                                             \
    LAUNCH(cuLaunchKernel, VC_LAUNCH_KERNEL_PARAMS, VC_LAUNCH_KERNEL_ARGS)                          \
    LAUNCH(cuLaunchKernel_ptsz, VC_LAUNCH_KERNEL_PARAMS, VC_LAUNCH_KERNEL_ARGS)                     \
    LAUNCH(cuLaunchKernelEx, VC_LAUNCH_EX_PARAMS, VC_LAUNCH_EX_ARGS)                                \
    LAUNCH(cuLaunchKernelEx_ptsz, VC_LAUNCH_EX_PARAMS, VC_LAUNCH_EX_ARGS)                           \
    LAUNCH(cuLaunchCooperativeKernel, VC_LAUNCH_COOPERATIVE_PARAMS, VC_LAUNCH_COOPERATIVE_ARGS)     \
    LAUNCH(cuLaunchCooperativeKernel_ptsz, VC_LAUNCH_COOPERATIVE_PARAMS,                            \
           VC_LAUNCH_COOPERATIVE_ARGS)                                                              \
    CU(cuGraphLaunch, (CUgraphExec hGraphExec, CUstream hStream), (hGraphExec, hStream))            \
    CU(cuGraphLaunch_ptsz, (CUgraphExec hGraphExec, CUstream hStream), (hGraphExec, hStream))       \
    CU(cuGraphUpload, (CUgraphExec hGraphExec, CUstream hStream), (hGraphExec, hStream))            \
    CU(cuGraphUpload_ptsz, (CUgraphExec hGraphExec, CUstream hStream), (hGraphExec, hStream))       \
    CU(cuGraphInstantiateWithFlags,                                                                 \
       (CUgraphExec *phGraphExec, CUgraph hGraph, unsigned long long flags),                        \
       (phGraphExec, hGraph, flags))                                                                \
    CU(cuGraphInstantiateWithParams,                                                                \
       (CUgraphExec *phGraphExec, CUgraph hGraph, CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams), \
       (phGraphExec, hGraph, instantiateParams))                                                    \
    CU(cuGraphInstantiateWithParams_ptsz,                                                           \
       (CUgraphExec *phGraphExec, CUgraph hGraph, CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams), \
       (phGraphExec, hGraph, instantiateParams))                                                    \
    CU(cuGraphInstantiate,                                                                          \
       (CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode, char *logBuffer,        \
        size_t bufferSize),                                                                         \
       (phGraphExec, hGraph, phErrorNode, logBuffer, bufferSize))                                   \
    CU(cuGraphInstantiate_v2,                                                                       \
       (CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode, char *logBuffer,        \
        size_t bufferSize),                                                                         \
       (phGraphExec, hGraph, phErrorNode, logBuffer, bufferSize))                                   \
    CU(cuGraphExecDestroy, (CUgraphExec hGraphExec), (hGraphExec))                                  \
    CU(cuDeviceGraphMemTrim, (CUdevice device), (device))                                           \
    CU(cuStreamBeginCapture, (CUstream hStream), (hStream))                                         \
    CU(cuStreamBeginCapture_ptsz, (CUstream hStream), (hStream))                                    \
    CU(cuStreamBeginCapture_v2, (CUstream hStream, CUstreamCaptureMode mode), (hStream, mode))      \
    CU(cuStreamBeginCapture_v2_ptsz, (CUstream hStream, CUstreamCaptureMode mode),                  \
       (hStream, mode))                                                                             \
    CU(cuStreamBeginCaptureToGraph, VC_BEGIN_TO_GRAPH_PARAMS, VC_BEGIN_TO_GRAPH_ARGS)               \
    CU(cuStreamBeginCaptureToGraph_ptsz, VC_BEGIN_TO_GRAPH_PARAMS, VC_BEGIN_TO_GRAPH_ARGS)          \
    CU(cuStreamEndCapture, (CUstream hStream, CUgraph *phGraph), (hStream, phGraph))                \
    CU(cuStreamEndCapture_ptsz, (CUstream hStream, CUgraph *phGraph), (hStream, phGraph))           \
    NVML(nvmlDeviceGetMemoryInfo, (nvmlDevice_t device, nvmlMemory_t *memory), (device, memory))    \
    NVML(nvmlDeviceGetMemoryInfo_v2, (nvmlDevice_t device, nvmlMemory_v2_t *memory),                \
         (device, memory))                                                                          \
    NVML(nvmlDeviceGetComputeRunningProcesses,                                                      \
         (nvmlDevice_t device, unsigned int *infoCount, nvmlProcessInfo_v1_t *infos),               \
         (device, infoCount, infos))                                                                \
    NVML(nvmlDeviceGetComputeRunningProcesses_v2,                                                   \
         (nvmlDevice_t device, unsigned int *infoCount, nvmlProcessInfo_v2_t *infos),               \
         (device, infoCount, infos))                                                                \
    NVML(nvmlDeviceGetComputeRunningProcesses_v3,                                                   \
         (nvmlDevice_t device, unsigned int *infoCount, nvmlProcessInfo_v2_t *infos),               \
         (device, infoCount, infos))

#define VC_HELPERS(CU, NVML)                                                                       \
    CU(cuCtxGetCurrent, (CUcontext *pctx), (pctx))                                                  \
    CU(cuCtxGetDevice, (CUdevice *device), (device))                                                \
    CU(cuDeviceGetUuid_v2, (CUuuid *uuid, CUdevice dev), (uuid, dev))                               \
    CU(cuDeviceGetMemPool, (CUmemoryPool *pool, CUdevice dev), (pool, dev))                         \
    CU(cuMemPoolGetAttribute, (CUmemoryPool pool, CUmemPool_attribute attr, void *value),           \
       (pool, attr, value))                                                                         \
    CU(cuMemGetAllocationGranularity,                                                               \
       (size_t *granularity, const CUmemAllocationProp *prop,                                       \
        CUmemAllocationGranularity_flags option),                                                   \
       (granularity, prop, option))                                                                 \
    CU(cuMemGetAllocationPropertiesFromHandle,                                                      \
       (CUmemAllocationProp *prop, CUmemGenericAllocationHandle handle), (prop, handle))            \
    CU(cuArrayGetMemoryRequirements,                                                                \
       (CUDA_ARRAY_MEMORY_REQUIREMENTS *memoryRequirements, CUarray array, CUdevice device),        \
       (memoryRequirements, array, device))                                                         \
    CU(cuMipmappedArrayGetMemoryRequirements,                                                       \
       (CUDA_ARRAY_MEMORY_REQUIREMENTS *memoryRequirements, CUmipmappedArray mipmap,                \
        CUdevice device),                                                                           \
       (memoryRequirements, mipmap, device))                                                        \
    CU(cuCtxSetCurrent, (CUcontext ctx), (ctx))                                                     \
    CU(cuMemAdvise_v2,                                                                              \
       (CUdeviceptr devPtr, size_t count, CUmem_advise advice, CUmemLocation location),              \
       (devPtr, count, advice, location))                                                           \
    CU(cuMemGetAddressRange_v2, (CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr),             \
       (pbase, psize, dptr))                                                                        \
    CU(cuThreadExchangeStreamCaptureMode, (CUstreamCaptureMode *mode), (mode))                     \
    CU(cuStreamIsCapturing, (CUstream hStream, CUstreamCaptureStatus *captureStatus),              \
       (hStream, captureStatus))                                                                    \
    CU(cuStreamIsCapturing_ptsz, (CUstream hStream, CUstreamCaptureStatus *captureStatus),         \
       (hStream, captureStatus))                                                                    \
    CU(cuStreamCreate, (CUstream *phStream, unsigned int Flags), (phStream, Flags))                 \
    CU(cuStreamQuery, (CUstream hStream), (hStream))                                                \
    CU(cuStreamQuery_ptsz, (CUstream hStream), (hStream))                                           \
    CU(cuStreamWaitValue32_v2,                                                                      \
       (CUstream stream, CUdeviceptr addr, cuuint32_t value, unsigned int flags),                   \
       (stream, addr, value, flags))                                                                \
    CU(cuStreamWaitValue32_v2_ptsz,                                                                 \
       (CUstream stream, CUdeviceptr addr, cuuint32_t value, unsigned int flags),                   \
       (stream, addr, value, flags))                                                                \
    CU(cuMemHostRegister_v2, (void *p, size_t bytesize, unsigned int Flags), (p, bytesize, Flags)) \
    CU(cuMemHostGetDevicePointer_v2, (CUdeviceptr *pdptr, void *p, unsigned int Flags),             \
       (pdptr, p, Flags))                                                                           \
    CU(cuEventCreate, (CUevent *phEvent, unsigned int Flags), (phEvent, Flags))                     \
    CU(cuEventRecord, (CUevent hEvent, CUstream hStream), (hEvent, hStream))                        \
    CU(cuEventRecord_ptsz, (CUevent hEvent, CUstream hStream), (hEvent, hStream))                   \
    CU(cuEventQuery, (CUevent hEvent), (hEvent))                                                    \
    CU(cuEventElapsedTime, (float *pMilliseconds, CUevent hStart, CUevent hEnd),                    \
       (pMilliseconds, hStart, hEnd))                                                               \
    CU(cuGraphGetNodes, (CUgraph hGraph, CUgraphNode *nodes, size_t *numNodes),                    \
       (hGraph, nodes, numNodes))                                                                   \
    CU(cuGraphNodeGetType, (CUgraphNode hNode, CUgraphNodeType *type), (hNode, type))              \
    CU(cuGraphMemAllocNodeGetParams, (CUgraphNode hNode, CUDA_MEM_ALLOC_NODE_PARAMS *params_out),  \
       (hNode, params_out))                                                                         \
    CU(cuGraphChildGraphNodeGetGraph, (CUgraphNode hNode, CUgraph *phGraph), (hNode, phGraph))     \
    CU(cuGraphMemFreeNodeGetParams, (CUgraphNode hNode, CUdeviceptr *dptr_out), (hNode, dptr_out)) \
    CU(cuDeviceGetGraphMemAttribute, (CUdevice device, CUgraphMem_attribute attr, void *value),    \
       (device, attr, value))                                                                       \
    NVML(nvmlInit_v2, (void), ())                                                                   \
    NVML(nvmlDeviceGetHandleByUUID, (const char *uuid, nvmlDevice_t *device), (uuid, device))       \
    NVML(nvmlDeviceGetUUID, (nvmlDevice_t device, char *uuid, unsigned int length),                 \
         (device, uuid, length))

#endif
