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
#undef cuIpcOpenMemHandle
#undef cuStreamBeginCapture
/* CUDA 12.8 headers map this to _v2; the original, in every driver, does what the shim needs. */
#undef cuEventElapsedTime

#include "nvml_types.h"

#include "intercept.h"

#define VC_EXPORT __attribute__((visibility("default")))

#define VC_DECLARE_CU(name, params, args) VC_EXPORT CUresult CUDAAPI name params;
#define VC_DECLARE_NVML(name, params, args) VC_EXPORT nvmlReturn_t name params;
VC_INTERCEPTED(VC_DECLARE_CU, VC_DECLARE_NVML, VC_DECLARE_CU)
#undef VC_DECLARE_CU
#undef VC_DECLARE_NVML

#endif
