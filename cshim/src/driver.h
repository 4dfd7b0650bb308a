/*
 * The real driver: libcuda.so.1 and libnvidia-ml.so.1, opened at first use
 * (never linked), and the real entry point of every listed symbol.
 */
#ifndef VC_DRIVER_H
#define VC_DRIVER_H

#include <stdbool.h>

#include "api.h"

enum vc_lib { VC_LIB_CUDA, VC_LIB_NVML };

/* One id per row of intercept.h (wrapped symbols first, then helpers). */
enum vc_id {
#define VC_ID(name, params, args) VC_ID_##name,
    VC_INTERCEPTED(VC_ID, VC_ID, VC_ID)
    VC_ID_INTERCEPTED_END,
    VC_ID_HELPERS_BEFORE = VC_ID_INTERCEPTED_END - 1,
    VC_HELPERS(VC_ID, VC_ID)
#undef VC_ID
    VC_ID_END
};

/* The library a symbol comes from and its name. */
enum vc_lib vc_driver_lib(enum vc_id id);
const char *vc_driver_name(enum vc_id id);

/* The real entry point of id, opening its library on first use; NULL when
 * the library or the symbol is missing. */
void *vc_driver_real(enum vc_id id);

/* Whether lib is in this process already (loaded by anyone); opens it for the
 * shim's own use if so. Never loads a library that the program did not. */
bool vc_driver_loaded(enum vc_lib lib);

/* True while this thread is opening a library: dlsym must not recurse then. */
bool vc_driver_opening(void);

/* The C library's dlsym (the shim exports its own). */
typedef void *(*vc_dlsym_fn)(void *handle, const char *name);
vc_dlsym_fn vc_driver_dlsym(void);

/* vc_real_<name>(args...): call the real symbol, or report it missing. */
#define VC_REAL_CU(name, params, args)                                                            \
    static inline CUresult vc_real_##name params                                                   \
    {                                                                                              \
        CUresult (*fn) params = (CUresult (*) params)vc_driver_real(VC_ID_##name);                 \
        return fn ? fn args : CUDA_ERROR_NOT_FOUND;                                                \
    }
#define VC_REAL_NVML(name, params, args)                                                          \
    static inline nvmlReturn_t vc_real_##name params                                               \
    {                                                                                              \
        nvmlReturn_t (*fn) params = (nvmlReturn_t (*) params)vc_driver_real(VC_ID_##name);         \
        return fn ? fn args : NVML_ERROR_FUNCTION_NOT_FOUND;                                       \
    }
VC_INTERCEPTED(VC_REAL_CU, VC_REAL_NVML, VC_REAL_CU)
VC_HELPERS(VC_REAL_CU, VC_REAL_NVML)
#undef VC_REAL_CU
#undef VC_REAL_NVML

#endif
