/* NVML's memory figures (nvidia-smi, pynvml) for limited devices: the limit and the container's use. */
#define _GNU_SOURCE
#include "nvml.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#include "account.h"
#include "devices.h"
#include "driver.h"
#include "memory.h"
#include "setup.h"

static pthread_once_t once = PTHREAD_ONCE_INIT;
static bool ready;

static void init(void) { ready = vc_real_nvmlInit_v2() == NVML_SUCCESS; }

bool vc_nvml_memory(const char *uuid, nvmlMemory_t *memory)
{
    pthread_once(&once, init);
    nvmlDevice_t handle;
    return ready && vc_real_nvmlDeviceGetHandleByUUID(uuid, &handle) == NVML_SUCCESS
           && vc_real_nvmlDeviceGetMemoryInfo(handle, memory) == NVML_SUCCESS;
}

/* The device under the limits that an NVML handle names; NULL when limits are off. */
static const struct vc_device *device_of(nvmlDevice_t device)
{
    char uuid[VC_UUID_LEN];
    if (vc_mode() != VC_ON || vc_real_nvmlDeviceGetUUID(device, uuid, sizeof uuid) != NVML_SUCCESS)
        return NULL;
    return vc_device_by_uuid(uuid);
}

/* Rewrites NVML's figures for device when limits cover it. */
static void limit_figures(nvmlDevice_t device, unsigned long long *total, unsigned long long *free,
                          unsigned long long *used)
{
    const struct vc_device *d = device_of(device);
    if (!d)
        return;
    uint64_t t = *total, f = *free, u;
    vc_memory_report(d, &t, &f, &u);
    *total = t;
    *free = f;
    *used = u;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    enum vc_mode mode = vc_mode();
    if (mode == VC_BROKEN)
        return NVML_ERROR_NO_PERMISSION;
    nvmlReturn_t r = vc_real_nvmlDeviceGetMemoryInfo(device, memory);
    if (r == NVML_SUCCESS && mode == VC_ON)
        limit_figures(device, &memory->total, &memory->free, &memory->used);
    return r;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    enum vc_mode mode = vc_mode();
    if (mode == VC_BROKEN)
        return NVML_ERROR_NO_PERMISSION;
    nvmlReturn_t r = vc_real_nvmlDeviceGetMemoryInfo_v2(device, memory);
    if (r == NVML_SUCCESS && mode == VC_ON) {
        /* The driver's own reservation is not the container's: none is shown. */
        memory->reserved = 0;
        limit_figures(device, &memory->total, &memory->free, &memory->used);
    }
    return r;
}

/* A limited device's compute processes are the container's, from the
 * account: the figures nvmlDeviceGetMemoryInfo adds up, so inference engines
 * that compare the two (vLLM's memory profiling) find them equal. Process ids
 * are as the container sees them. v2: infos are nvmlProcessInfo_v2_t. */
static nvmlReturn_t processes(nvmlDevice_t device, unsigned int *count, void *infos, bool v2,
                              nvmlReturn_t (*real)(nvmlDevice_t, unsigned int *, void *))
{
    if (vc_mode() == VC_BROKEN)
        return NVML_ERROR_NO_PERMISSION;
    const struct vc_device *d = device_of(device);
    if (!d)
        return real(device, count, infos);
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct vc_account_process *found = calloc(VC_REGION_SLOTS, sizeof *found);
    if (!found)
        return NVML_ERROR_MEMORY;
    vc_memory_refresh();
    unsigned n = vc_account_processes(d->index, found, VC_REGION_SLOTS);
    if (n > *count || (n && !infos)) {
        *count = n;
        free(found);
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned i = 0; i < n; i++) {
        if (v2)
            ((nvmlProcessInfo_v2_t *)infos)[i] = (nvmlProcessInfo_v2_t){
                (unsigned)found[i].pid, found[i].bytes, 0xFFFFFFFFu, 0xFFFFFFFFu};
        else
            ((nvmlProcessInfo_v1_t *)infos)[i] =
                (nvmlProcessInfo_v1_t){(unsigned)found[i].pid, found[i].bytes};
    }
    *count = n;
    free(found);
    return NVML_SUCCESS;
}

typedef nvmlReturn_t (*processes_fn)(nvmlDevice_t, unsigned int *, void *);

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned int *infoCount,
                                                  nvmlProcessInfo_v1_t *infos)
{
    return processes(device, infoCount, infos, false,
                     (processes_fn)vc_real_nvmlDeviceGetComputeRunningProcesses);
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount,
                                                     nvmlProcessInfo_v2_t *infos)
{
    return processes(device, infoCount, infos, true,
                     (processes_fn)vc_real_nvmlDeviceGetComputeRunningProcesses_v2);
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                     nvmlProcessInfo_v2_t *infos)
{
    return processes(device, infoCount, infos, true,
                     (processes_fn)vc_real_nvmlDeviceGetComputeRunningProcesses_v3);
}
