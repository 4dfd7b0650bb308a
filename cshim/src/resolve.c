/*
 * How programs reach the wrappers. Programs linked to libcuda.so.1 bind to the
 * exported wrappers directly. The CUDA runtime and frameworks open the driver
 * with dlopen and ask dlsym (on that handle, which skips preloaded symbols)
 * for cuGetProcAddress or for each function: so dlsym is interposed too, and
 * both it and cuGetProcAddress hand out the wrapper of whatever real entry
 * point the driver gave. The driver chooses the version (_v2, _ptsz, ...) from
 * cudaVersion and flags; mapping its answer keeps that choice exact, and
 * anything not wrapped comes back as the driver gave it.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdbool.h>
#include <string.h>

#include "driver.h"
#include "setup.h"

static void *const wrappers[VC_ID_INTERCEPTED_END] = {
#define VC_WRAPPER(name, params, args) [VC_ID_##name] = (void *)name,
    VC_INTERCEPTED(VC_WRAPPER, VC_WRAPPER, VC_WRAPPER)
#undef VC_WRAPPER
};

/* Kernel launches are handed out wrapped only while they are paced. */
static const bool launch_row[VC_ID_INTERCEPTED_END] = {
#define VC_OTHER_ROW(name, params, args)
#define VC_LAUNCH_ROW(name, params, args) [VC_ID_##name] = true,
    VC_INTERCEPTED(VC_OTHER_ROW, VC_OTHER_ROW, VC_LAUNCH_ROW)
#undef VC_OTHER_ROW
#undef VC_LAUNCH_ROW
};

/* The wrapper of fn if fn is the real entry point of intercepted symbol id. */
static void *wrapper_if_real(int id, void *fn)
{
    bool wrapped = launch_row[id] ? vc_pacing() : vc_mode() != VC_OFF;
    return wrapped && fn == vc_driver_real(id) ? wrappers[id] : fn;
}

/* The wrapper of fn if fn is a real libcuda entry point that is intercepted, else fn. */
static void *cuda_wrapper_for(void *fn)
{
    for (int id = 0; fn && id < VC_ID_INTERCEPTED_END; id++)
        if (vc_driver_lib(id) == VC_LIB_CUDA && wrapper_if_real(id, fn) != fn)
            return wrappers[id];
    return fn;
}

/* The intercepted symbol called name, or -1. */
static int intercepted(const char *name)
{
    for (int id = 0; id < VC_ID_INTERCEPTED_END; id++)
        if (strcmp(vc_driver_name(id), name) == 0)
            return id;
    return -1;
}

/* A dlsym answer fn for name, swapped for its wrapper if it is the driver's
 * own entry point of an intercepted symbol. */
static void *resolved(void *fn, const char *name)
{
    int id = intercepted(name);
    /* Only a library the program already loaded can have given fn. */
    if (id < 0 || !fn || vc_driver_opening() || !vc_driver_loaded(vc_driver_lib(id)))
        return fn;
    return wrapper_if_real(id, fn);
}

VC_EXPORT void *dlsym(void *handle, const char *name)
{
    vc_dlsym_fn real = vc_driver_dlsym();
    if (!real)
        return NULL;
    if (handle != RTLD_NEXT && handle != RTLD_DEFAULT
        && ((name[0] == 'c' && name[1] == 'u') || strncmp(name, "nvml", 4) == 0))
        return resolved(real(handle, name), name);
    /* A tail call: the C library sees our caller's return address, which
     * RTLD_NEXT lookups are relative to. */
    return real(handle, name);
}

CUresult CUDAAPI cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
                                  cuuint64_t flags)
{
    CUresult r = vc_real_cuGetProcAddress(symbol, pfn, cudaVersion, flags);
    if (r == CUDA_SUCCESS && pfn)
        *pfn = cuda_wrapper_for(*pfn);
    return r;
}

CUresult CUDAAPI cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                                     cuuint64_t flags, CUdriverProcAddressQueryResult *symbolStatus)
{
    CUresult r = vc_real_cuGetProcAddress_v2(symbol, pfn, cudaVersion, flags, symbolStatus);
    if (r == CUDA_SUCCESS && pfn)
        *pfn = cuda_wrapper_for(*pfn);
    return r;
}
