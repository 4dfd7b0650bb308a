/*
 * The vendor types the shim speaks: cuda.h (toolkit or wheel), the few NVML
 * types it needs (declared here, so no NVML header is required), and the
 * exported prototypes of every intercepted symbol, generated from intercept.h.
 */
#ifndef VC_API_H
#define VC_API_H

#include <cuda.h>

#if CUDA_VERSION < 12050
#error "libvcuda.so needs cuda.h from CUDA 12.5 or newer (cuCtxCreate_v4)"
#endif

/* cuda.h maps these plain names to _v2; the driver still exports the
 * originals, and the CUDA runtime asks for some of them. */
#undef cuGetProcAddress
#undef cuDevicePrimaryCtxRelease
#undef cuDevicePrimaryCtxReset
#undef cuGraphInstantiate
/* CUDA 12.8 headers map this to _v2; the original, in every driver, does what the shim needs. */
#undef cuEventElapsedTime

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NO_PERMISSION = 4,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_FUNCTION_NOT_FOUND = 13,
    NVML_ERROR_MEMORY = 20,
};
typedef struct nvmlDevice_st *nvmlDevice_t;

typedef struct {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;

typedef struct {
    unsigned int version;
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_v2_t;

/* nvmlDeviceGetComputeRunningProcesses fills v1; its _v2 and _v3 fill v2. */
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
} nvmlProcessInfo_v1_t;

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_v2_t;

#include "intercept.h"

#define VC_EXPORT __attribute__((visibility("default")))

#define VC_DECLARE_CU(name, params, args) VC_EXPORT CUresult CUDAAPI name params;
#define VC_DECLARE_NVML(name, params, args) VC_EXPORT nvmlReturn_t name params;
VC_INTERCEPTED(VC_DECLARE_CU, VC_DECLARE_NVML, VC_DECLARE_CU)
#undef VC_DECLARE_CU
#undef VC_DECLARE_NVML

#endif
