/*
 * Test double of libnvidia-ml.so.1 for CI machines without a GPU: the NVML
 * calls libvcuda.so covers and the ones nvidia-smi-like tools use to list
 * devices and their memory. It reads the device state the fake libcuda.so.1
 * writes (fake_state.h), so it sees every process's memory, contexts included,
 * as NVML does. CUDA_VISIBLE_DEVICES does not apply to NVML.
 */
#define _GNU_SOURCE
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "fake_state.h"
#include "nvml_types.h"

struct nvmlDevice_st {
    int index;
};

#define NVML_MEMORY_V2 ((unsigned int)(sizeof(nvmlMemory_v2_t) | (2 << 24)))

static struct nvmlDevice_st devices[FAKE_MAX_DEVICES];
static int initialized;

nvmlReturn_t nvmlInit_v2(void)
{
    struct fake_state *s = fake_state();
    if (!s)
        return NVML_ERROR_UNINITIALIZED;
    for (unsigned i = 0; i < s->ndevices; i++)
        devices[i].index = (int)i;
    __atomic_add_fetch(&initialized, 1, __ATOMIC_ACQ_REL);
    return NVML_SUCCESS;
}

/* What pynvml's nvmlInit calls: the flags ask for nothing the double distinguishes. */
nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    (void)flags;
    return nvmlInit_v2();
}

nvmlReturn_t nvmlShutdown(void)
{
    return __atomic_load_n(&initialized, __ATOMIC_ACQUIRE) > 0
                   && __atomic_sub_fetch(&initialized, 1, __ATOMIC_ACQ_REL) >= 0
               ? NVML_SUCCESS
               : NVML_ERROR_UNINITIALIZED;
}

static bool ready(void) { return __atomic_load_n(&initialized, __ATOMIC_ACQUIRE) > 0; }

static struct nvmlDevice_st *valid(nvmlDevice_t d)
{
    return d >= devices && d < devices + fake_state()->ndevices ? d : NULL;
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count)
{
    if (!ready())
        return NVML_ERROR_UNINITIALIZED;
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = fake_state()->ndevices;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    if (!ready())
        return NVML_ERROR_UNINITIALIZED;
    if (!device || index >= fake_state()->ndevices)
        return NVML_ERROR_INVALID_ARGUMENT;
    *device = &devices[index];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    if (!ready())
        return NVML_ERROR_UNINITIALIZED;
    if (!valid(device) || !uuid)
        return NVML_ERROR_INVALID_ARGUMENT;
    char text[64];
    fake_uuid_string(device->index, text, sizeof text);
    if (strlen(text) >= length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(uuid, text);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    if (!ready())
        return NVML_ERROR_UNINITIALIZED;
    if (!uuid || !device)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned i = 0; i < fake_state()->ndevices; i++) {
        char text[64];
        fake_uuid_string((int)i, text, sizeof text);
        if (strcmp(text, uuid) == 0) {
            *device = &devices[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

/* Checks a memory query; fills total and used of device. */
static nvmlReturn_t memory_of(nvmlDevice_t device, const void *out, uint64_t *total, uint64_t *used)
{
    if (!ready())
        return NVML_ERROR_UNINITIALIZED;
    if (!valid(device) || !out)
        return NVML_ERROR_INVALID_ARGUMENT;
    *total = fake_state()->total[device->index];
    *used = fake_used(device->index);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    uint64_t total, used;
    nvmlReturn_t r = memory_of(device, memory, &total, &used);
    if (r == NVML_SUCCESS)
        *memory = (nvmlMemory_t){total, total - used, used};
    return r;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    uint64_t total, used;
    nvmlReturn_t r = memory_of(device, memory, &total, &used);
    if (r == NVML_SUCCESS && memory->version != NVML_MEMORY_V2)
        r = NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if (r == NVML_SUCCESS)
        *memory = (nvmlMemory_v2_t){NVML_MEMORY_V2, total, 0, total - used, used};
    return r;
}

/* The processes holding memory on device, as NVML lists them; v2: infos are
 * nvmlProcessInfo_v2_t, else nvmlProcessInfo_v1_t. */
static nvmlReturn_t processes(nvmlDevice_t device, unsigned int *count, void *infos, bool v2)
{
    if (!ready())
        return NVML_ERROR_UNINITIALIZED;
    if (!valid(device) || !count)
        return NVML_ERROR_INVALID_ARGUMENT;
    const struct fake_state *s = fake_state();
    unsigned n = 0;
    for (int i = 0; i < FAKE_MAX_PROCS; i++) {
        const struct fake_proc *p = &s->procs[i];
        uint64_t used = p->used[device->index];
        if (!used || !fake_proc_live(p))
            continue;
        if (infos && n < *count && v2)
            ((nvmlProcessInfo_v2_t *)infos)[n] =
                (nvmlProcessInfo_v2_t){(unsigned)p->pid, used, 0xFFFFFFFFu, 0xFFFFFFFFu};
        else if (infos && n < *count)
            ((nvmlProcessInfo_v1_t *)infos)[n] = (nvmlProcessInfo_v1_t){(unsigned)p->pid, used};
        n++;
    }
    bool fits = n <= *count && (infos || !n);
    *count = n;
    return fits ? NVML_SUCCESS : NVML_ERROR_INSUFFICIENT_SIZE;
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned int *count,
                                                  nvmlProcessInfo_v1_t *infos)
{
    return processes(device, count, infos, false);
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *count,
                                                     nvmlProcessInfo_v2_t *infos)
{
    return processes(device, count, infos, true);
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *count,
                                                     nvmlProcessInfo_v2_t *infos)
{
    return processes(device, count, infos, true);
}

/* What a node agent asks of each GPU beside its memory, answered as a GPU without MIG or
 * utilization counters answers. */
nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    if (!ready())
        return NVML_ERROR_UNINITIALIZED;
    if (!valid(device) || !name)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (snprintf(name, length, "vcuda test GPU %d", device->index) >= (int)length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor)
{
    if (!ready())
        return NVML_ERROR_UNINITIALIZED;
    if (!valid(device) || !major || !minor)
        return NVML_ERROR_INVALID_ARGUMENT;
    *major = 9;
    *minor = 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *current, unsigned int *pending)
{
    if (!ready())
        return NVML_ERROR_UNINITIALIZED;
    return valid(device) && current && pending ? NVML_ERROR_NOT_SUPPORTED
                                               : NVML_ERROR_INVALID_ARGUMENT;
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, void *utilization)
{
    if (!ready())
        return NVML_ERROR_UNINITIALIZED;
    return valid(device) && utilization ? NVML_ERROR_NOT_SUPPORTED : NVML_ERROR_INVALID_ARGUMENT;
}

/* No process was busy in the window asked (NVML's answer then). */
nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device, void *samples,
                                             unsigned int *count, unsigned long long since)
{
    (void)samples;
    (void)since;
    if (!ready())
        return NVML_ERROR_UNINITIALIZED;
    if (!valid(device) || !count)
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = 0;
    return NVML_ERROR_NOT_FOUND;
}
