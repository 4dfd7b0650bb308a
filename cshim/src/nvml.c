/* NVML's memory figures (nvidia-smi, pynvml) for limited devices: the limit and the container's use. */
#define _GNU_SOURCE
#include <stdint.h>

#include "devices.h"
#include "driver.h"
#include "memory.h"
#include "setup.h"

/* Rewrites NVML's figures for device when limits cover it. */
static void limit_figures(nvmlDevice_t device, unsigned long long *total, unsigned long long *free,
                          unsigned long long *used)
{
    char uuid[VC_UUID_LEN];
    if (vc_real_nvmlDeviceGetUUID(device, uuid, sizeof uuid) != NVML_SUCCESS)
        return;
    const struct vc_device *d = vc_device_by_uuid(uuid);
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
