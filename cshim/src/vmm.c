/*
 * Wrappers of the virtual memory management calls: an allocation made with
 * cuMemCreate or imported with cuMemImportFromShareableHandle is charged while
 * anything keeps it alive, which the driver says is a handle reference
 * (create, import, cuMemRetainAllocationHandle; each cuMemRelease ends one)
 * or a mapping (cuMemMap; cuMemUnmap ends it). So memory released while still
 * mapped stays charged until it is unmapped.
 *
 * A created allocation is charged its size, rounded up to the granularity,
 * at creation. An imported one is charged when it is mapped: the driver tells
 * its device (cuMemGetAllocationPropertiesFromHandle) but not its size, and a
 * mapping, which starts at offset 0, covers at most all of it; so its charge
 * is the largest mapping made of it. As for CUDA IPC, the library cannot tell
 * whether the exporter is of the same container (and charged already), so it
 * counts the memory again: the safe side. A mapping that does not fit is
 * refused (out of memory) before the driver maps it.
 */
#define _GNU_SOURCE
#include <stdbool.h>
#include <stdlib.h>

#include "account.h"
#include "devices.h"
#include "driver.h"
#include "log.h"
#include "memory.h"
#include "setup.h"
#include "track.h"

/* Ends one hold on the allocation of handle; gives its charge back once none is left. */
static void let_go(uint64_t handle)
{
    struct vc_charge now;
    if (vc_track_adjust(VC_KIND_HANDLE, handle, 0, -1, &now) && !now.holds)
        vc_account_add(now.device->index, -(int64_t)now.bytes);
}

/* Starts tracking an allocation that handle holds on d, charged bytes (already on the account). */
static void hold_new(uint64_t handle, const struct vc_device *d, uint64_t bytes)
{
    vc_track_add(VC_KIND_HANDLE, handle,
                 (struct vc_charge){.device = d, .bytes = bytes, .holds = 1});
}

CUresult CUDAAPI cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                             const CUmemAllocationProp *prop, unsigned long long flags)
{
    bool on_device = handle && prop && size && prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE;
    const struct vc_device *d = on_device ? vc_device_of(prop->location.id) : NULL;
    uint64_t bytes = size;
    size_t granularity;
    if (d && vc_real_cuMemGetAllocationGranularity(&granularity, prop,
                                                   CU_MEM_ALLOC_GRANULARITY_MINIMUM) == CUDA_SUCCESS
        && granularity)
        bytes = VC_ROUND_UP(bytes, granularity);
    CUresult r = d ? vc_memory_charge(d, bytes) : CUDA_SUCCESS;
    if (r != CUDA_SUCCESS)
        return r;
    r = vc_real_cuMemCreate(handle, size, prop, flags);
    if (d && r != CUDA_SUCCESS)
        vc_account_add(d->index, -(int64_t)bytes);
    else if (d)
        hold_new(*handle, d, bytes);
    return r;
}

CUresult CUDAAPI cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle,
                                                void *osHandle,
                                                CUmemAllocationHandleType shHandleType)
{
    CUresult r = vc_real_cuMemImportFromShareableHandle(handle, osHandle, shHandleType);
    struct vc_charge now;
    if (r != CUDA_SUCCESS || vc_mode() != VC_ON
        || vc_track_adjust(VC_KIND_HANDLE, *handle, 0, 1, &now))  /* one this process holds */
        return r;
    CUmemAllocationProp prop;
    CUresult asked = vc_real_cuMemGetAllocationPropertiesFromHandle(&prop, *handle);
    if (asked != CUDA_SUCCESS) {
        /* Memory of an unknown device cannot be charged: it is not taken in. */
        vc_log(VC_LOG_WARN, "an imported allocation's device is unknown (%d): refused", asked);
        vc_real_cuMemRelease(*handle);
        return asked;
    }
    const struct vc_device *d =
        prop.location.type == CU_MEM_LOCATION_TYPE_DEVICE ? vc_device_of(prop.location.id) : NULL;
    if (d)
        hold_new(*handle, d, 0);   /* charged when mapped: only then is its size known */
    return r;
}

CUresult CUDAAPI cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr)
{
    CUresult r = vc_real_cuMemRetainAllocationHandle(handle, addr);
    struct vc_charge now;
    if (r == CUDA_SUCCESS && vc_mode() == VC_ON)
        vc_track_adjust(VC_KIND_HANDLE, *handle, 0, 1, &now);
    return r;
}

CUresult CUDAAPI cuMemRelease(CUmemGenericAllocationHandle handle)
{
    struct vc_charge now;
    /* Let go of before the driver frees it: another thread may get the same
     * handle from the driver right after. */
    bool held = vc_track_adjust(VC_KIND_HANDLE, handle, 0, -1, &now);
    CUresult r = vc_real_cuMemRelease(handle);
    if (held && r != CUDA_SUCCESS && !now.holds)
        hold_new(handle, now.device, now.bytes);
    else if (held && r != CUDA_SUCCESS)
        vc_track_adjust(VC_KIND_HANDLE, handle, 0, 1, &now);
    else if (held && !now.holds)
        vc_account_add(now.device->index, -(int64_t)now.bytes);
    return r;
}

CUresult CUDAAPI cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                          CUmemGenericAllocationHandle handle, unsigned long long flags)
{
    if (vc_mode() != VC_ON)
        return vc_real_cuMemMap(ptr, size, offset, handle, flags);
    struct vc_charge now;
    uint64_t grown = 0, end = (uint64_t)offset + size;
    bool held = vc_track_adjust(VC_KIND_HANDLE, handle, 0, 0, &now);
    if (held && end > now.bytes) {   /* an imported allocation: its charge grows to the mapping */
        grown = end - now.bytes;
        if (vc_memory_charge(now.device, grown) != CUDA_SUCCESS)
            return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (held && !vc_track_adjust(VC_KIND_HANDLE, handle, (int64_t)grown, 1, &now)) {
        vc_account_add(now.device->index, -(int64_t)grown);   /* released meanwhile */
        held = false;
    }
    CUresult r = vc_real_cuMemMap(ptr, size, offset, handle, flags);
    if (r != CUDA_SUCCESS) {
        if (held && vc_track_adjust(VC_KIND_HANDLE, handle, -(int64_t)grown, -1, &now))
            vc_account_add(now.device->index, -(int64_t)(now.holds ? grown : now.bytes + grown));
        return r;
    }
    /* Every mapping, so that cuMemUnmap can walk a range of several. */
    vc_track_add(VC_KIND_MAPPING, ptr, (struct vc_charge){.bytes = size, .handle = handle});
    return r;
}

CUresult CUDAAPI cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    if (vc_mode() != VC_ON)
        return vc_real_cuMemUnmap(ptr, size);
    /* The mappings the range is made of, in order; forgotten before the driver
     * unmaps them, as another thread may map there right after. */
    struct vc_charge *mapped = NULL;
    size_t n = 0, room = 0;
    struct vc_charge m;
    for (uint64_t at = ptr; at < (uint64_t)ptr + size && vc_track_take(VC_KIND_MAPPING, at, &m);
         at += m.bytes) {
        if (n == room) {
            struct vc_charge *more = realloc(mapped, (room = room ? 2 * room : 8) * sizeof *more);
            if (!more) {   /* no host memory: keep what stays mapped charged */
                vc_track_add(VC_KIND_MAPPING, at, m);
                break;
            }
            mapped = more;
        }
        mapped[n++] = m;
        if (!m.bytes)
            break;
    }
    CUresult r = vc_real_cuMemUnmap(ptr, size);
    uint64_t at = ptr;
    for (size_t i = 0; i < n; at += mapped[i++].bytes) {
        if (r == CUDA_SUCCESS)
            let_go(mapped[i].handle);
        else
            vc_track_add(VC_KIND_MAPPING, at, mapped[i]);
    }
    free(mapped);
    return r;
}
