/*
 * The test double's device work (fake_gpu.c) and what it needs from the rest
 * of the double (fake_cuda.c): the current context and the pools that a
 * synchronization trims. Also the per-thread-stream entry points, which
 * cuda.h declares only for builds that ask for them.
 */
#ifndef FAKE_GPU_H
#define FAKE_GPU_H

#include <cuda.h>
#include <stdbool.h>
#include <stdint.h>

/* fake_cuda.c */
CUresult fake_need_context(void);      /* CUDA_SUCCESS when a live context is current */
int fake_current_device(void);         /* the physical device of the current context */
void fake_pools_synchronized(void);    /* pools give back what exceeds their threshold */
/* An upload or launch of a graph that frees transient bytes itself and keeps
 * nkept allocations: the current device's graph memory grows to hold them. */
CUresult fake_graph_back(uint64_t transient, const CUdeviceptr *kept, const uint64_t *kept_bytes,
                         unsigned nkept);

/* fake_gpu.c */
void fake_gpu_forget(void);            /* a new process: no streams, events, modules, graphs */
unsigned long fakeRecordsInCapture(void);
unsigned long fakeEventRecords(void);
unsigned long fakeCaptureQueries(void);
CUresult fake_unsafe_call(void);       /* a call the driver forbids in a capture (see fake_gpu.c) */
/* A stream-ordered allocation (free) on stream h: *captured when the stream
 * captures it as a node (the allocation's address in *dptr). */
CUresult fake_capture_alloc(CUstream h, bool per_thread_default, uint64_t bytes,
                            CUdeviceptr *dptr, bool *captured);
CUresult fake_capture_free(CUstream h, bool per_thread_default, CUdeviceptr dptr, bool *captured);

#define PER_THREAD(name) CUresult name##_ptsz
PER_THREAD(cuStreamSynchronize)(CUstream hStream);
PER_THREAD(cuStreamQuery)(CUstream hStream);
PER_THREAD(cuEventRecord)(CUevent hEvent, CUstream hStream);
PER_THREAD(cuStreamWaitValue32_v2)(CUstream stream, CUdeviceptr addr, cuuint32_t value,
                                   unsigned int flags);
PER_THREAD(cuMemsetD8Async)(CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream);
PER_THREAD(cuStreamBeginCapture_v2)(CUstream hStream, CUstreamCaptureMode mode);
/* The CUDA 10.0 form, without a mode, which the driver still exports. */
#undef cuStreamBeginCapture
CUresult cuStreamBeginCapture(CUstream hStream);
PER_THREAD(cuStreamBeginCapture)(CUstream hStream);
PER_THREAD(cuStreamEndCapture)(CUstream hStream, CUgraph *phGraph);
PER_THREAD(cuStreamIsCapturing)(CUstream hStream, CUstreamCaptureStatus *captureStatus);
PER_THREAD(cuGraphLaunch)(CUgraphExec hGraphExec, CUstream hStream);
PER_THREAD(cuGraphUpload)(CUgraphExec hGraphExec, CUstream hStream);
PER_THREAD(cuGraphInstantiateWithParams)(CUgraphExec *phGraphExec, CUgraph hGraph,
                                         CUDA_GRAPH_INSTANTIATE_PARAMS *params);
CUresult cuGraphInstantiate_v2(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode,
                               char *logBuffer, size_t bufferSize);
PER_THREAD(cuLaunchKernel)(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                           unsigned by, unsigned bz, unsigned shared, CUstream s, void **params,
                           void **extra);
PER_THREAD(cuLaunchKernelEx)(const CUlaunchConfig *config, CUfunction f, void **kernelParams,
                             void **extra);
PER_THREAD(cuLaunchCooperativeKernel)(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                      unsigned bx, unsigned by, unsigned bz, unsigned shared,
                                      CUstream s, void **params);
CUresult cuEventElapsedTime_v2(float *pMilliseconds, CUevent hStart, CUevent hEnd);

#endif
