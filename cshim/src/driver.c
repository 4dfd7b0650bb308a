/* Opens the real driver libraries at first use and resolves their symbols. */
#define _GNU_SOURCE
#include "driver.h"

#include <dlfcn.h>
#include <pthread.h>

#include "log.h"

struct vc_symbol {
    const char *name;
    enum vc_lib lib;
};

static const struct vc_symbol symbols[VC_ID_END] = {
#define VC_SYMBOL_CU(name, params, args) [VC_ID_##name] = {#name, VC_LIB_CUDA},
#define VC_SYMBOL_NVML(name, params, args) [VC_ID_##name] = {#name, VC_LIB_NVML},
    VC_INTERCEPTED(VC_SYMBOL_CU, VC_SYMBOL_NVML, VC_SYMBOL_CU)
    VC_HELPERS(VC_SYMBOL_CU, VC_SYMBOL_NVML)
#undef VC_SYMBOL_CU
#undef VC_SYMBOL_NVML
};

static const char *const sonames[] = {[VC_LIB_CUDA] = "libcuda.so.1", [VC_LIB_NVML] = "libnvidia-ml.so.1"};

static pthread_once_t opened[] = {PTHREAD_ONCE_INIT, PTHREAD_ONCE_INIT};
static void *real[VC_ID_END];
static vc_dlsym_fn libc_dlsym;
static __thread bool opening __attribute__((tls_model("initial-exec")));

vc_dlsym_fn vc_driver_dlsym(void)
{
    vc_dlsym_fn fn = __atomic_load_n(&libc_dlsym, __ATOMIC_ACQUIRE);
    if (fn)
        return fn;
    /* glibc 2.34 moved dlsym into libc under a new version; older ones keep the first. */
    static const char *const versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17"};
    for (unsigned i = 0; !fn && i < sizeof versions / sizeof *versions; i++)
        fn = (vc_dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", versions[i]);
    if (!fn)
        vc_log(VC_LOG_ERROR, "cannot find the C library's dlsym");
    __atomic_store_n(&libc_dlsym, fn, __ATOMIC_RELEASE);
    return fn;
}

static void open_lib(enum vc_lib lib)
{
    vc_dlsym_fn find = vc_driver_dlsym();
    opening = true;
    void *handle = dlopen(sonames[lib], RTLD_LAZY | RTLD_LOCAL);
    opening = false;
    if (!handle || !find) {
        vc_log(VC_LOG_WARN, "cannot open %s: %s", sonames[lib], handle ? "no dlsym" : dlerror());
        return;
    }
    for (int id = 0; id < VC_ID_END; id++)
        if (symbols[id].lib == lib)
            real[id] = find(handle, symbols[id].name);
    vc_log(VC_LOG_DEBUG, "opened %s", sonames[lib]);
}

static void open_cuda(void) { open_lib(VC_LIB_CUDA); }
static void open_nvml(void) { open_lib(VC_LIB_NVML); }

static void ensure_open(enum vc_lib lib)
{
    pthread_once(&opened[lib], lib == VC_LIB_CUDA ? open_cuda : open_nvml);
}

enum vc_lib vc_driver_lib(enum vc_id id) { return symbols[id].lib; }

const char *vc_driver_name(enum vc_id id) { return symbols[id].name; }

void *vc_driver_real(enum vc_id id)
{
    ensure_open(symbols[id].lib);
    return real[id];
}

bool vc_driver_loaded(enum vc_lib lib)
{
    void *handle = dlopen(sonames[lib], RTLD_LAZY | RTLD_NOLOAD);
    if (!handle)
        return false;
    dlclose(handle);
    ensure_open(lib);
    return true;
}

bool vc_driver_opening(void) { return opening; }
