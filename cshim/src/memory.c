/* Wrappers of the allocation, free and memory-query calls: check, call the driver, account.
 * The virtual memory management calls are vmm.c's. */
#define _GNU_SOURCE
#include "memory.h"

#include <stdbool.h>

#include "account.h"
#include "driver.h"
#include "graphs.h"
#include "log.h"
#include "nvml.h"
#include "pools.h"
#include "track.h"

/* Rows are padded to the device's pitch alignment; this bound is replaced by the real pitch. */
#define PITCH_ESTIMATE_ALIGN 512

static CUresult free_pointer(uint64_t key) { return vc_real_cuMemFree_v2((CUdeviceptr)key); }
static CUresult free_array(uint64_t key) { return vc_real_cuArrayDestroy((CUarray)key); }
static CUresult free_mipmap(uint64_t key)
{
    return vc_real_cuMipmappedArrayDestroy((CUmipmappedArray)key);
}
static CUresult close_ipc(uint64_t key) { return vc_real_cuIpcCloseMemHandle((CUdeviceptr)key); }

static CUresult (*const destroy[])(uint64_t) = {
    [VC_KIND_POINTER] = free_pointer,
    [VC_KIND_ARRAY] = free_array,
    [VC_KIND_MIPMAP] = free_mipmap,
    [VC_KIND_IPC] = close_ipc,
};

bool vc_memory_reserve(const struct vc_device *d, uint64_t bytes)
{
    return vc_account_reserve(d->index, d->host_index, bytes, d->device_limit, d->limit);
}

CUresult vc_memory_charge(const struct vc_device *d, uint64_t bytes)
{
    if (vc_memory_reserve(d, bytes))
        return CUDA_SUCCESS;
    vc_memory_refresh();
    return vc_memory_reserve(d, bytes) ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

/* After the driver's call on an object charged estimate up front on d (NULL:
 * not charged): keeps its actual size charged, or gives the charge back if the
 * call failed. If the actual size no longer fits, the object is destroyed and
 * the answer is out of memory. */
static CUresult settle(const struct vc_device *d, CUresult result, uint64_t estimate,
                       uint64_t actual, enum vc_kind kind, uint64_t key)
{
    if (!d)
        return result;
    if (result != CUDA_SUCCESS) {
        vc_account_add(d->index, -(int64_t)estimate);
        return result;
    }
    if (actual > estimate && !vc_memory_reserve(d, actual - estimate)) {
        destroy[kind](key);
        vc_account_add(d->index, -(int64_t)estimate);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    vc_account_add(d->index, -(int64_t)(estimate - (actual < estimate ? actual : estimate)));
    CUcontext context = NULL;
    vc_real_cuCtxGetCurrent(&context);
    vc_track_add(kind, key, (struct vc_charge){.device = d, .bytes = actual, .context = context});
    return result;
}

/* Frees (kind, key) through the driver and gives its charge back. */
static CUresult release(enum vc_kind kind, uint64_t key)
{
    struct vc_charge c;
    /* Forgotten before the driver frees it: another thread may get the same
     * handle from the driver right after. */
    bool charged = vc_track_take(kind, key, &c);
    CUresult result = destroy[kind](key);
    if (charged && result == CUDA_SUCCESS)
        vc_account_add(vc_charge_entry(&c), -(int64_t)c.bytes);
    else if (charged)
        vc_track_add(kind, key, c);
    return result;
}

/* The limited device of the current context when an allocation is well formed, else NULL. */
static const struct vc_device *target(bool well_formed)
{
    return well_formed ? vc_device_current() : NULL;
}

/* Charges estimate on d (when d is not NULL). */
static CUresult charge(const struct vc_device *d, uint64_t estimate)
{
    return d ? vc_memory_charge(d, estimate) : CUDA_SUCCESS;
}

/* Managed memory kept in host memory, which device dev reads and writes over the bus
 * where it lies: no page faults, and no device memory taken from the GPU's other users. */
static CUresult alloc_in_host(CUdeviceptr *dptr, size_t bytes, CUdevice dev)
{
    CUresult r = vc_real_cuMemAllocManaged(dptr, bytes, CU_MEM_ATTACH_GLOBAL);
    if (r != CUDA_SUCCESS)
        return r;
    CUmemLocation host = {.type = CU_MEM_LOCATION_TYPE_HOST, .id = 0};
    CUmemLocation device = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = dev};
    r = vc_real_cuMemAdvise_v2(*dptr, bytes, CU_MEM_ADVISE_SET_PREFERRED_LOCATION, host);
    if (r == CUDA_SUCCESS)
        r = vc_real_cuMemAdvise_v2(*dptr, bytes, CU_MEM_ADVISE_SET_ACCESSED_BY, device);
    if (r != CUDA_SUCCESS)
        vc_real_cuMemFree_v2(*dptr);
    return r;
}

/* Past a virtual limit's device part, an allocation of device memory is served from host
 * memory (docs/LIBVCUDA.md, "Virtual device memory"), charged to d's host entry. */
static CUresult alloc_virtual(const struct vc_device *d, CUdeviceptr *dptr, size_t bytes)
{
    CUdevice dev;
    if (!vc_account_reserve(d->host_index, d->index, bytes, d->limit, d->limit))
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = vc_real_cuCtxGetDevice(&dev);
    if (r == CUDA_SUCCESS)
        r = alloc_in_host(dptr, bytes, dev);
    if (r != CUDA_SUCCESS) {
        vc_account_add(d->host_index, -(int64_t)bytes);
        vc_log(VC_LOG_WARN, "%zu bytes of virtual memory on %s: the driver refused managed "
               "memory (error %d)", bytes, d->uuid, (int)r);
        return r;
    }
    CUcontext context = NULL;
    vc_real_cuCtxGetCurrent(&context);
    vc_track_add(VC_KIND_POINTER, *dptr, (struct vc_charge){.device = d, .bytes = bytes,
                                                            .context = context, .in_host = true});
    vc_log(VC_LOG_DEBUG, "%zu bytes on %s in host memory: its device part is full", bytes,
           d->uuid);
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    const struct vc_device *d = target(dptr && bytesize);
    CUresult r = charge(d, bytesize);
    if (r != CUDA_SUCCESS)
        return d->host_index >= 0 ? alloc_virtual(d, dptr, bytesize) : r;
    r = vc_real_cuMemAlloc_v2(dptr, bytesize);
    return settle(d, r, bytesize, bytesize, VC_KIND_POINTER, d && r == CUDA_SUCCESS ? *dptr : 0);
}

CUresult CUDAAPI cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    const struct vc_device *d = target(dptr && bytesize);
    CUresult r = charge(d, bytesize);
    if (r != CUDA_SUCCESS)
        return r;
    r = vc_real_cuMemAllocManaged(dptr, bytesize, flags);
    return settle(d, r, bytesize, bytesize, VC_KIND_POINTER, d && r == CUDA_SUCCESS ? *dptr : 0);
}

CUresult CUDAAPI cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes,
                                    size_t Height, unsigned int ElementSizeBytes)
{
    uint64_t estimate = VC_ROUND_UP((uint64_t)WidthInBytes, PITCH_ESTIMATE_ALIGN) * Height;
    const struct vc_device *d = target(dptr && pPitch && estimate);
    CUresult r = charge(d, estimate);
    if (r != CUDA_SUCCESS)
        return r;
    r = vc_real_cuMemAllocPitch_v2(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
    bool made = d && r == CUDA_SUCCESS;
    return settle(d, r, estimate, made ? (uint64_t)*pPitch * Height : 0, VC_KIND_POINTER,
                  made ? *dptr : 0);
}

CUresult CUDAAPI cuMemFree_v2(CUdeviceptr dptr) { return release(VC_KIND_POINTER, dptr); }

/* Bytes of an array's (first level's) elements, at four bytes a channel and
 * before the driver's padding: the driver's own figure replaces it. */
static uint64_t array_estimate(const CUDA_ARRAY3D_DESCRIPTOR *desc)
{
    uint64_t height = desc->Height ? desc->Height : 1, depth = desc->Depth ? desc->Depth : 1;
    return (uint64_t)desc->Width * height * depth * desc->NumChannels * 4;
}

/* The driver's size of an array or mipmapped array; the estimate if it cannot tell. */
static uint64_t array_actual(CUarray array, CUmipmappedArray mipmap, uint64_t estimate)
{
    CUDA_ARRAY_MEMORY_REQUIREMENTS req;
    CUdevice dev;
    if (vc_real_cuCtxGetDevice(&dev) != CUDA_SUCCESS)
        return estimate;
    CUresult r = array ? vc_real_cuArrayGetMemoryRequirements(&req, array, dev)
                       : vc_real_cuMipmappedArrayGetMemoryRequirements(&req, mipmap, dev);
    return r == CUDA_SUCCESS ? req.size : estimate;
}

/* Charges, creates (through make) and settles an array described by desc. */
static CUresult create_array(CUarray *handle, const CUDA_ARRAY3D_DESCRIPTOR *desc,
                             CUresult (*make)(CUarray *, const void *), const void *arg)
{
    uint64_t estimate = handle && desc ? array_estimate(desc) : 0;
    const struct vc_device *d = target(estimate);
    CUresult r = charge(d, estimate);
    if (r != CUDA_SUCCESS)
        return r;
    r = make(handle, arg);
    bool made = d && r == CUDA_SUCCESS;
    return settle(d, r, estimate, made ? array_actual(*handle, NULL, estimate) : 0, VC_KIND_ARRAY,
                  made ? (uintptr_t)*handle : 0);
}

static CUresult make_2d(CUarray *h, const void *desc) { return vc_real_cuArrayCreate_v2(h, desc); }
static CUresult make_3d(CUarray *h, const void *desc) { return vc_real_cuArray3DCreate_v2(h, desc); }

CUresult CUDAAPI cuArrayCreate_v2(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *pAllocateArray)
{
    CUDA_ARRAY3D_DESCRIPTOR desc = {0};
    if (pAllocateArray)
        desc = (CUDA_ARRAY3D_DESCRIPTOR){.Width = pAllocateArray->Width,
                                         .Height = pAllocateArray->Height,
                                         .Format = pAllocateArray->Format,
                                         .NumChannels = pAllocateArray->NumChannels};
    return create_array(pHandle, pAllocateArray ? &desc : NULL, make_2d, pAllocateArray);
}

CUresult CUDAAPI cuArray3DCreate_v2(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *pAllocateArray)
{
    return create_array(pHandle, pAllocateArray, make_3d, pAllocateArray);
}

CUresult CUDAAPI cuArrayDestroy(CUarray hArray)
{
    return release(VC_KIND_ARRAY, (uintptr_t)hArray);
}

CUresult CUDAAPI cuMipmappedArrayCreate(CUmipmappedArray *pHandle,
                                        const CUDA_ARRAY3D_DESCRIPTOR *pMipmappedArrayDesc,
                                        unsigned int numMipmapLevels)
{
    uint64_t estimate = 0;
    if (pHandle && pMipmappedArrayDesc) {
        /* Each level halves every extent. */
        CUDA_ARRAY3D_DESCRIPTOR level = *pMipmappedArrayDesc;
        for (unsigned i = 0; i < numMipmapLevels && level.Width; i++) {
            estimate += array_estimate(&level);
            level.Width /= 2;
            level.Height /= 2;
            level.Depth /= 2;
        }
    }
    const struct vc_device *d = target(estimate);
    CUresult r = charge(d, estimate);
    if (r != CUDA_SUCCESS)
        return r;
    r = vc_real_cuMipmappedArrayCreate(pHandle, pMipmappedArrayDesc, numMipmapLevels);
    bool made = d && r == CUDA_SUCCESS;
    return settle(d, r, estimate, made ? array_actual(NULL, *pHandle, estimate) : 0,
                  VC_KIND_MIPMAP, made ? (uintptr_t)*pHandle : 0);
}

CUresult CUDAAPI cuMipmappedArrayDestroy(CUmipmappedArray hMipmappedArray)
{
    return release(VC_KIND_MIPMAP, (uintptr_t)hMipmappedArray);
}

/* Memory another process exported (cuIpcGetMemHandle) is charged to the
 * importer at its size, once mapped: the library cannot tell whether the
 * exporter is of the same container (and charged already) or not, so the
 * safe side is to count it. Refused (closed again, out of memory) when it
 * does not fit. */
static CUresult open_ipc(CUresult (*real)(CUdeviceptr *, CUipcMemHandle, unsigned),
                         CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned flags)
{
    const struct vc_device *d = target(pdptr != NULL);
    CUresult r = real(pdptr, handle, flags);
    uint64_t size = 0;
    CUdeviceptr base;
    size_t bytes;
    if (d && r == CUDA_SUCCESS && vc_real_cuMemGetAddressRange_v2(&base, &bytes, *pdptr) == CUDA_SUCCESS)
        size = bytes;
    return settle(d, r, 0, size, VC_KIND_IPC, d && r == CUDA_SUCCESS ? *pdptr : 0);
}

CUresult CUDAAPI cuIpcOpenMemHandle(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags)
{
    return open_ipc(vc_real_cuIpcOpenMemHandle, pdptr, handle, Flags);
}

CUresult CUDAAPI cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle,
                                       unsigned int Flags)
{
    return open_ipc(vc_real_cuIpcOpenMemHandle_v2, pdptr, handle, Flags);
}

CUresult CUDAAPI cuIpcCloseMemHandle(CUdeviceptr dptr) { return release(VC_KIND_IPC, dptr); }

void vc_memory_refresh(void)
{
    vc_pools_refresh();
    vc_graphs_refresh();
}

/* What d reports as its total on a device of device_total bytes: its device part, never more
 * than the device holds, and its part in host memory. */
static uint64_t reported_total(const struct vc_device *d, uint64_t device_total)
{
    uint64_t device_part = d->device_limit < device_total ? d->device_limit : device_total;
    return device_part + (d->limit - d->device_limit);
}

void vc_memory_report(const struct vc_device *d, uint64_t *total, uint64_t *free, uint64_t *used)
{
    /* The device's figures from one source (NVML, where it answers), so that
     * the CUDA and NVML views of a limited device agree. */
    nvmlMemory_t device;
    if (vc_nvml_memory(d->uuid, &device)) {
        *total = device.total;
        *free = device.free;
    }
    vc_memory_refresh();
    uint64_t in_host = d->host_index >= 0 ? vc_account_used(d->host_index) : 0;
    uint64_t in_device = vc_account_used(d->index);
    *used = in_device + in_host;
    /* A virtual limit may pass the device's size: its host part is not on the device. */
    uint64_t host_part = d->limit - d->device_limit;
    uint64_t limit = reported_total(d, *total);
    uint64_t device_part = limit - host_part;
    uint64_t device_left = device_part > in_device ? device_part - in_device : 0;
    device_left = device_left < *free ? device_left : *free;
    uint64_t left = limit > *used ? limit - *used : 0;
    uint64_t reachable = device_left + (host_part > in_host ? host_part - in_host : 0);
    *free = left < reachable ? left : reachable;
    *total = limit;
}

CUresult CUDAAPI cuMemGetInfo_v2(size_t *free, size_t *total)
{
    CUresult r = vc_real_cuMemGetInfo_v2(free, total);
    const struct vc_device *d = target(r == CUDA_SUCCESS);
    if (d) {
        uint64_t t = *total, f = *free, used;
        vc_memory_report(d, &t, &f, &used);
        *total = t;
        *free = f;
    }
    return r;
}

CUresult CUDAAPI cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    CUresult r = vc_real_cuDeviceTotalMem_v2(bytes, dev);
    const struct vc_device *d = r == CUDA_SUCCESS ? vc_device_of(dev) : NULL;
    if (d)
        *bytes = reported_total(d, *bytes);
    return r;
}
