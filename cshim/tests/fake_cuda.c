/*
 * Test double of libcuda.so.1 for CI machines without a GPU. It implements the
 * calls libvcuda.so covers with the driver's bookkeeping and errors: devices
 * (with CUDA_VISIBLE_DEVICES), contexts, allocations of every kind, pools that
 * keep freed memory until a synchronization, VMM allocations (mapped into
 * reserved address ranges, alive while a handle or a mapping holds them,
 * shared with other processes through POSIX file descriptors), and
 * cuGetProcAddress with versions and per-thread-stream flags; fake_gpu.c
 * runs kernels, streams, events and capture. Device memory is
 * shared by all processes through fake_state.h; a context takes
 * VCUDA_FAKE_CONTEXT_MIB of it. A forked child starts with no CUDA state.
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <stdbool.h>
#include <stdlib.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fake_gpu.h"
#include "fake_state.h"

/* The original (v1) names are exported too, as the real driver does. */
#undef cuGetProcAddress
#undef cuDevicePrimaryCtxRelease
#undef cuDevicePrimaryCtxReset
#undef cuDeviceGetUuid
#undef cuMemGetInfo
#undef cuIpcOpenMemHandle
CUresult cuIpcOpenMemHandle(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags);
CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags);
CUresult cuDevicePrimaryCtxRelease(CUdevice dev);
CUresult cuDevicePrimaryCtxReset(CUdevice dev);
CUresult cuMemGetInfo(unsigned int *free, unsigned int *total);
CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev);
PER_THREAD(cuMemAllocAsync)(CUdeviceptr *dptr, size_t bytesize, CUstream hStream);
PER_THREAD(cuMemAllocFromPoolAsync)(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                    CUstream hStream);
PER_THREAD(cuMemFreeAsync)(CUdeviceptr dptr, CUstream hStream);
CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev);
CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray, int numParams,
                        unsigned int flags, CUdevice dev);

#define MIB (1ULL << 20)
#define GRANULARITY (2 * MIB)
#define PITCH_ALIGN 512
#define MAX_CONTEXTS 64
#define MAX_ALLOCATIONS 8192
#define MAX_POOLS 64
#define ROUND_UP(n, to) (((n) + (to) - 1) / (to) * (to))

struct context {
    int ordinal;
    bool primary;
    bool alive;
};

struct pool {
    int ordinal;
    bool on_device;
    bool alive;
    uint64_t reserved, used, threshold;
};

/* K_GRAPH: a graph's allocation that outlives the graph (its memory is the graph memory's). */
/* K_IPC: another process's memory mapped here (the device memory is the exporter's). */
/* K_HANDLE: a VMM allocation; K_MAPPING: a cuMemMap of one (handle: its address);
 * K_RESERVED: a cuMemAddressReserve range (handle: its start). */
enum kind { K_POINTER = 1, K_ARRAY, K_MIPMAP, K_HANDLE, K_ASYNC, K_GRAPH, K_IPC, K_MAPPING,
            K_RESERVED };

struct vmm_export;

struct allocation {
    enum kind kind;                   /* 0: free entry */
    uint64_t handle;
    uint64_t bytes;
    int ordinal;
    struct context *context;          /* NULL for VMM handles */
    struct pool *pool;                /* K_ASYNC only */
    /* K_HANDLE: */
    unsigned refs, maps;              /* handle references and mappings; it goes when both are 0 */
    unsigned long long types;         /* the shareable handle types asked for at creation */
    struct vmm_export *shared;        /* once exported or imported: what processes share */
    int shared_fd;                    /* its file, open while shared */
    struct allocation *backing;       /* K_MAPPING: the allocation mapped */
    bool managed;                     /* K_POINTER of cuMemAllocManaged: not on the device */
};

static pid_t initialized_in;
static int visible[FAKE_MAX_DEVICES], nvisible;
static struct context contexts[MAX_CONTEXTS];
static struct context *primary[FAKE_MAX_DEVICES];
static unsigned primary_refs[FAKE_MAX_DEVICES];
static struct allocation allocations[MAX_ALLOCATIONS];
static struct pool pools[MAX_POOLS];
static struct pool *default_pool[FAKE_MAX_DEVICES], *current_pool[FAKE_MAX_DEVICES];
static uint64_t next_address = 0x7f0000000000ULL, next_handle = 1;
/* Graph memory of each device (by ordinal): reserved, and kept by live graph allocations. */
static uint64_t graph_reserved[FAKE_MAX_DEVICES], graph_kept[FAKE_MAX_DEVICES];
/* The thread's context stack; its top is the current context. */
#define STACK_DEPTH 16
static __thread struct context *stack[STACK_DEPTH];
static __thread int depth;
#define current (depth ? stack[depth - 1] : NULL)

static void push(struct context *c)
{
    if (depth < STACK_DEPTH)
        stack[depth++] = c;
}

static uint64_t context_bytes(void)
{
    const char *mib = getenv("VCUDA_FAKE_CONTEXT_MIB");
    return (mib ? strtoull(mib, NULL, 10) : 96) * MIB;
}

/* ---- devices ---- */

static bool ready(void) { return initialized_in == getpid(); }

static int physical(int ordinal) { return visible[ordinal]; }

static bool valid_ordinal(CUdevice dev) { return ready() && dev >= 0 && dev < nvisible; }

/* The driver's checks, in its order, for a call about dev (with_output: its
 * output pointer is not NULL). */
static CUresult check_device(bool with_output, CUdevice dev)
{
    if (!ready())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!with_output)
        return CUDA_ERROR_INVALID_VALUE;
    return valid_ordinal(dev) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

/* Parses CUDA_VISIBLE_DEVICES like the driver: indices or (prefixes of) UUIDs,
 * in any order, up to the first entry that names no device. */
static void choose_visible(const struct fake_state *s)
{
    const char *list = getenv("CUDA_VISIBLE_DEVICES");
    nvisible = 0;
    if (!list) {
        for (unsigned i = 0; i < s->ndevices; i++)
            visible[nvisible++] = (int)i;
        return;
    }
    char copy[1024];
    strncpy(copy, list, sizeof copy - 1);
    copy[sizeof copy - 1] = '\0';
    for (char *save, *item = strtok_r(copy, ",", &save); item && nvisible < FAKE_MAX_DEVICES;
         item = strtok_r(NULL, ",", &save)) {
        int found = -1;
        char *end;
        long index = strtol(item, &end, 10);
        if (*item && !*end && index >= 0 && index < (long)s->ndevices)
            found = (int)index;
        for (unsigned i = 0; found < 0 && i < s->ndevices; i++) {
            char uuid[64];
            fake_uuid_string((int)i, uuid, sizeof uuid);
            if (strncmp(uuid, item, strlen(item)) == 0 && strlen(item) > 4)
                found = (int)i;
        }
        if (found < 0)
            break;
        visible[nvisible++] = found;
    }
}

static void forget_process_state(void)
{
    memset(contexts, 0, sizeof contexts);
    memset(primary, 0, sizeof primary);
    memset(primary_refs, 0, sizeof primary_refs);
    memset(allocations, 0, sizeof allocations);
    memset(pools, 0, sizeof pools);
    memset(default_pool, 0, sizeof default_pool);
    memset(current_pool, 0, sizeof current_pool);
    memset(graph_reserved, 0, sizeof graph_reserved);
    memset(graph_kept, 0, sizeof graph_kept);
    depth = 0;
    fake_gpu_forget();
}

CUresult cuInit(unsigned int Flags)
{
    if (Flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (ready())
        return CUDA_SUCCESS;
    struct fake_state *s = fake_state();
    if (!s || !fake_self())
        return CUDA_ERROR_NO_DEVICE;
    forget_process_state();
    choose_visible(s);
    initialized_in = getpid();
    return CUDA_SUCCESS;
}

CUresult cuDriverGetVersion(int *driverVersion)
{
    if (!driverVersion)
        return CUDA_ERROR_INVALID_VALUE;
    *driverVersion = CUDA_VERSION;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int *count)
{
    if (!count)
        return CUDA_ERROR_INVALID_VALUE;
    if (!ready())
        return CUDA_ERROR_NOT_INITIALIZED;
    *count = nvisible;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *device, int ordinal)
{
    CUresult r = check_device(device != NULL, ordinal);
    if (r != CUDA_SUCCESS)
        return r;
    *device = ordinal;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev)
{
    CUresult r = check_device(uuid != NULL, dev);
    if (r != CUDA_SUCCESS)
        return r;
    memcpy(uuid->bytes, fake_state()->uuid[physical(dev)], 16);
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev) { return cuDeviceGetUuid_v2(uuid, dev); }

CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    CUresult r = check_device(bytes != NULL, dev);
    if (r != CUDA_SUCCESS)
        return r;
    *bytes = fake_state()->total[physical(dev)];
    return CUDA_SUCCESS;
}

/* Takes bytes of the device's memory for this process, as the driver would. */
static CUresult take(int ordinal, uint64_t bytes)
{
    int dev = physical(ordinal);
    if (fake_used(dev) + bytes > fake_state()->total[dev])
        return CUDA_ERROR_OUT_OF_MEMORY;
    __atomic_add_fetch(&fake_self()->used[dev], bytes, __ATOMIC_ACQ_REL);
    return CUDA_SUCCESS;
}

static void give_back(int ordinal, uint64_t bytes)
{
    __atomic_sub_fetch(&fake_self()->used[physical(ordinal)], bytes, __ATOMIC_ACQ_REL);
}

/* ---- contexts ---- */

static struct context *new_context(int ordinal, bool is_primary)
{
    for (int i = 0; i < MAX_CONTEXTS; i++) {
        if (!contexts[i].alive) {
            if (take(ordinal, context_bytes()) != CUDA_SUCCESS)
                return NULL;
            contexts[i] = (struct context){ordinal, is_primary, true};
            return &contexts[i];
        }
    }
    return NULL;
}

static void free_allocation(struct allocation *a);

/* Frees what the context holds (keep_context: a reset) or the context too. */
static void clear_context(struct context *c, bool keep_context)
{
    for (int i = 0; i < MAX_ALLOCATIONS; i++)
        if (allocations[i].kind && allocations[i].context == c)
            free_allocation(&allocations[i]);
    if (keep_context)
        return;
    give_back(c->ordinal, context_bytes());
    c->alive = false;
    /* Destroying the current context pops it. */
    if (current == c)
        depth--;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    CUresult r = check_device(pctx != NULL, dev);
    if (r != CUDA_SUCCESS)
        return r;
    if (!primary[dev] && !(primary[dev] = new_context(dev, true)))
        return CUDA_ERROR_OUT_OF_MEMORY;
    primary_refs[dev]++;
    *pctx = (CUcontext)primary[dev];
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    CUresult r = check_device(true, dev);
    if (r != CUDA_SUCCESS)
        return r;
    if (!primary_refs[dev])
        return CUDA_ERROR_INVALID_CONTEXT;
    if (--primary_refs[dev] == 0) {
        clear_context(primary[dev], false);
        primary[dev] = NULL;
    }
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease(CUdevice dev) { return cuDevicePrimaryCtxRelease_v2(dev); }

CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    CUresult r = check_device(true, dev);
    if (r != CUDA_SUCCESS)
        return r;
    if (primary[dev])
        clear_context(primary[dev], true);
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxReset(CUdevice dev) { return cuDevicePrimaryCtxReset_v2(dev); }

static CUresult create_context(CUcontext *pctx, CUdevice dev)
{
    CUresult r = check_device(pctx != NULL, dev);
    if (r != CUDA_SUCCESS)
        return r;
    struct context *c = new_context(dev, false);
    if (!c)
        return CUDA_ERROR_OUT_OF_MEMORY;
    push(c);
    *pctx = (CUcontext)c;
    return CUDA_SUCCESS;
}

CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    (void)flags;
    return create_context(pctx, dev);
}

CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray, int numParams,
                        unsigned int flags, CUdevice dev)
{
    (void)flags;
    if (numParams < 0 || (numParams && !paramsArray))
        return CUDA_ERROR_INVALID_VALUE;
    return create_context(pctx, dev);
}

CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *params, unsigned int flags,
                        CUdevice dev)
{
    (void)params;
    (void)flags;
    return create_context(pctx, dev);
}

static bool live_context(CUcontext ctx)
{
    struct context *c = (struct context *)ctx;
    return c >= contexts && c < contexts + MAX_CONTEXTS && c->alive;
}

CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    if (!ready())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!live_context(ctx) || ((struct context *)ctx)->primary)
        return CUDA_ERROR_INVALID_CONTEXT;
    clear_context((struct context *)ctx, false);
    return CUDA_SUCCESS;
}

CUresult cuCtxSetCurrent(CUcontext ctx)
{
    if (!ready())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (ctx && !live_context(ctx))
        return CUDA_ERROR_INVALID_CONTEXT;
    if (depth)
        stack[depth - 1] = (struct context *)ctx;
    else
        push((struct context *)ctx);
    return CUDA_SUCCESS;
}

CUresult cuCtxGetCurrent(CUcontext *pctx)
{
    if (!ready())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    *pctx = (CUcontext)current;
    return CUDA_SUCCESS;
}

/* The current context, or why there is none. */
static CUresult need_context(void)
{
    if (!ready())
        return CUDA_ERROR_NOT_INITIALIZED;
    return current && current->alive ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

CUresult fake_need_context(void) { return need_context(); }

int fake_current_device(void) { return physical(current->ordinal); }

CUresult cuCtxGetDevice(CUdevice *device)
{
    CUresult r = need_context();
    if (r != CUDA_SUCCESS)
        return r;
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    *device = current->ordinal;
    return CUDA_SUCCESS;
}

CUresult cuMemGetInfo_v2(size_t *free, size_t *total)
{
    CUresult r = need_context();
    if (r != CUDA_SUCCESS)
        return r;
    if (!free || !total)
        return CUDA_ERROR_INVALID_VALUE;
    int dev = physical(current->ordinal);
    *total = fake_state()->total[dev];
    *free = *total - fake_used(dev);
    return CUDA_SUCCESS;
}

/* The original of CUDA 2.0, with 32-bit sizes. */
CUresult cuMemGetInfo(unsigned int *free, unsigned int *total)
{
    size_t f, t;
    CUresult r = free && total ? cuMemGetInfo_v2(&f, &t) : CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS) {
        *free = f > UINT32_MAX ? UINT32_MAX : (unsigned int)f;
        *total = t > UINT32_MAX ? UINT32_MAX : (unsigned int)t;
    }
    return r;
}

/* ---- allocations ---- */

static struct allocation *record(enum kind kind, uint64_t handle, uint64_t bytes, int ordinal,
                                 struct context *c, struct pool *pool)
{
    for (int i = 0; i < MAX_ALLOCATIONS; i++)
        if (!allocations[i].kind) {
            allocations[i] = (struct allocation){.kind = kind, .handle = handle, .bytes = bytes,
                                                 .ordinal = ordinal, .context = c, .pool = pool};
            return &allocations[i];
        }
    return NULL;
}

static struct allocation *lookup(enum kind kind, uint64_t handle)
{
    for (int i = 0; i < MAX_ALLOCATIONS; i++)
        if (allocations[i].kind == kind && allocations[i].handle == handle)
            return &allocations[i];
    return NULL;
}

static void free_allocation(struct allocation *a)
{
    if (a->kind == K_ASYNC)
        a->pool->used -= a->bytes;   /* stays reserved by the pool */
    else if (a->kind == K_GRAPH)
        graph_kept[a->ordinal] -= a->bytes;   /* stays reserved as graph memory */
    else if (a->kind == K_IPC || a->managed)
        ;                                     /* the exporter's memory, or managed memory */
    else
        give_back(a->ordinal, a->bytes);
    a->kind = 0;
}

/* Takes bytes on the current context's device and records the allocation. */
static CUresult allocate(enum kind kind, uint64_t *handle, uint64_t bytes)
{
    CUresult r = need_context();
    if (r != CUDA_SUCCESS)
        return r;
    if (!handle || !bytes)
        return CUDA_ERROR_INVALID_VALUE;
    if ((r = take(current->ordinal, bytes)) != CUDA_SUCCESS)
        return r;
    *handle = kind == K_POINTER ? next_address : next_handle++;
    if (kind == K_POINTER)
        next_address += ROUND_UP(bytes, GRANULARITY);
    record(kind, *handle, bytes, current->ordinal, current, NULL);
    return CUDA_SUCCESS;
}

static CUresult release(enum kind kind, uint64_t handle)
{
    if (!ready())
        return CUDA_ERROR_NOT_INITIALIZED;
    struct allocation *a = lookup(kind, handle);
    if (!a && kind == K_POINTER)
        a = lookup(K_ASYNC, handle);   /* cuMemFree also frees stream-ordered memory */
    if (!a && (kind == K_POINTER || kind == K_ASYNC))
        a = lookup(K_GRAPH, handle);   /* and what a graph allocated */
    if (!a)
        return kind == K_POINTER ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_INVALID_HANDLE;
    free_allocation(a);
    return CUDA_SUCCESS;
}

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    return allocate(K_POINTER, (uint64_t *)dptr, bytesize);
}

/* The driver backs managed memory's pages where they are first touched, and the fake touches
 * none: managed memory takes no device memory here, and may be larger than the device. */
CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    CUresult r = need_context();
    if (r != CUDA_SUCCESS)
        return r;
    if (!dptr || !bytesize || (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST))
        return CUDA_ERROR_INVALID_VALUE;
    struct allocation *a = record(K_POINTER, next_address, bytesize, current->ordinal, current,
                                  NULL);
    if (!a)
        return CUDA_ERROR_OUT_OF_MEMORY;
    a->managed = true;
    *dptr = next_address;
    next_address += ROUND_UP(bytesize, GRANULARITY);
    return CUDA_SUCCESS;
}

/* The location form (CUDA 12.2 and later; CUDA 13's headers name only it): only managed
 * memory takes advice, on a range inside one allocation, for the host or a visible device. */
CUresult cuMemAdvise_v2(CUdeviceptr devPtr, size_t count, CUmem_advise advice,
                        CUmemLocation location)
{
    if (!ready())
        return CUDA_ERROR_NOT_INITIALIZED;
    struct allocation *a = lookup(K_POINTER, devPtr);
    bool advice_known = advice >= CU_MEM_ADVISE_SET_READ_MOSTLY
                        && advice <= CU_MEM_ADVISE_UNSET_ACCESSED_BY;
    bool place_known = location.type == CU_MEM_LOCATION_TYPE_HOST
                       || (location.type == CU_MEM_LOCATION_TYPE_DEVICE && location.id >= 0
                           && location.id < nvisible);
    if (!a || !a->managed || count == 0 || count > a->bytes || !advice_known || !place_known)
        return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height,
                            unsigned int ElementSizeBytes)
{
    if (!pPitch || (ElementSizeBytes != 4 && ElementSizeBytes != 8 && ElementSizeBytes != 16))
        return CUDA_ERROR_INVALID_VALUE;
    size_t pitch = ROUND_UP(WidthInBytes, PITCH_ALIGN);
    CUresult r = allocate(K_POINTER, (uint64_t *)dptr, (uint64_t)pitch * Height);
    if (r == CUDA_SUCCESS)
        *pPitch = pitch;
    return r;
}

CUresult cuMemFree_v2(CUdeviceptr dptr) { return release(K_POINTER, dptr); }

static uint64_t element_size(CUarray_format format)
{
    switch (format) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8:
        return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF:
        return 2;
    case CU_AD_FORMAT_UNSIGNED_INT32:
    case CU_AD_FORMAT_SIGNED_INT32:
    case CU_AD_FORMAT_FLOAT:
        return 4;
    default:
        return 0;
    }
}

/* Bytes of one level of an array, padded as the hardware lays rows out. */
static uint64_t level_bytes(const CUDA_ARRAY3D_DESCRIPTOR *d)
{
    uint64_t row = ROUND_UP((uint64_t)d->Width * d->NumChannels * element_size(d->Format), PITCH_ALIGN);
    return row * (d->Height ? d->Height : 1) * (d->Depth ? d->Depth : 1);
}

static bool valid_descriptor(const CUDA_ARRAY3D_DESCRIPTOR *d)
{
    return d && d->Width && element_size(d->Format)
           && (d->NumChannels == 1 || d->NumChannels == 2 || d->NumChannels == 4);
}

CUresult cuArray3DCreate_v2(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *desc)
{
    if (!valid_descriptor(desc))
        return CUDA_ERROR_INVALID_VALUE;
    return allocate(K_ARRAY, (uint64_t *)pHandle, level_bytes(desc));
}

CUresult cuArrayCreate_v2(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *desc)
{
    if (!desc)
        return CUDA_ERROR_INVALID_VALUE;
    CUDA_ARRAY3D_DESCRIPTOR d3 = {.Width = desc->Width, .Height = desc->Height,
                                  .Format = desc->Format, .NumChannels = desc->NumChannels};
    return cuArray3DCreate_v2(pHandle, &d3);
}

CUresult cuArrayDestroy(CUarray hArray) { return release(K_ARRAY, (uint64_t)hArray); }

CUresult cuMipmappedArrayCreate(CUmipmappedArray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *desc,
                                unsigned int numMipmapLevels)
{
    if (!valid_descriptor(desc) || numMipmapLevels == 0)
        return CUDA_ERROR_INVALID_VALUE;
    CUDA_ARRAY3D_DESCRIPTOR level = *desc;
    uint64_t bytes = 0;
    for (unsigned i = 0; i < numMipmapLevels && level.Width; i++) {
        bytes += level_bytes(&level);
        level.Width /= 2;
        level.Height /= 2;
        level.Depth /= 2;
    }
    return allocate(K_MIPMAP, (uint64_t *)pHandle, bytes);
}

CUresult cuMipmappedArrayDestroy(CUmipmappedArray h) { return release(K_MIPMAP, (uint64_t)h); }

static CUresult memory_requirements(CUDA_ARRAY_MEMORY_REQUIREMENTS *req, enum kind kind,
                                    uint64_t handle, CUdevice device)
{
    if (!ready())
        return CUDA_ERROR_NOT_INITIALIZED;
    struct allocation *a = lookup(kind, handle);
    if (!req || !a)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_ordinal(device))
        return CUDA_ERROR_INVALID_DEVICE;
    *req = (CUDA_ARRAY_MEMORY_REQUIREMENTS){.size = a->bytes, .alignment = PITCH_ALIGN};
    return CUDA_SUCCESS;
}

CUresult cuArrayGetMemoryRequirements(CUDA_ARRAY_MEMORY_REQUIREMENTS *req, CUarray array,
                                      CUdevice device)
{
    return memory_requirements(req, K_ARRAY, (uint64_t)array, device);
}

CUresult cuMipmappedArrayGetMemoryRequirements(CUDA_ARRAY_MEMORY_REQUIREMENTS *req,
                                               CUmipmappedArray mipmap, CUdevice device)
{
    return memory_requirements(req, K_MIPMAP, (uint64_t)mipmap, device);
}

/* ---- virtual memory management ---- */

static bool valid_device_prop(const CUmemAllocationProp *prop)
{
    return prop && prop->type == CU_MEM_ALLOCATION_TYPE_PINNED
           && prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE && valid_ordinal(prop->location.id);
}

CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
                                       CUmemAllocationGranularity_flags option)
{
    (void)option;
    if (!ready())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!granularity || !valid_device_prop(prop))
        return CUDA_ERROR_INVALID_VALUE;
    *granularity = GRANULARITY;
    return CUDA_SUCCESS;
}

CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                     const CUmemAllocationProp *prop, unsigned long long flags)
{
    if (!ready())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!handle || !size || size % GRANULARITY || flags || !valid_device_prop(prop))
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = take(prop->location.id, size);
    if (r != CUDA_SUCCESS)
        return r;
    struct allocation *a = record(K_HANDLE, next_handle, size, prop->location.id, NULL, NULL);
    if (!a) {
        give_back(prop->location.id, size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    a->refs = 1;
    a->types = prop->requestedHandleTypes;
    *handle = next_handle++;
    return CUDA_SUCCESS;
}

/*
 * What the processes that hold one VMM allocation share: a memory file that
 * an exported POSIX file descriptor opens. The memory stays in the books of
 * the process that created it until no process holds the allocation any more
 * (the driver's rule); if that process ends first, its books go with it.
 */
struct vmm_export {
    uint64_t magic;
    int32_t owner;                    /* the creating process */
    int32_t device;                   /* physical */
    uint64_t bytes;
    uint32_t holders;                 /* processes whose allocation is alive */
};

#define VMM_MAGIC 0x66616b65766d6d31ULL

/* A handle this process may use: one whose references it has not all released. */
static struct allocation *live_handle(CUmemGenericAllocationHandle handle)
{
    struct allocation *a = lookup(K_HANDLE, handle);
    return a && a->refs ? a : NULL;
}

/* The allocation goes once no handle reference and no mapping is left. */
static void let_go(struct allocation *a)
{
    if (a->refs || a->maps)
        return;
    struct vmm_export *x = a->shared;
    if (!x) {
        give_back(a->ordinal, a->bytes);
    } else {
        if (__atomic_sub_fetch(&x->holders, 1, __ATOMIC_ACQ_REL) == 0) {
            struct fake_state *s = fake_state();
            for (int i = 0; i < FAKE_MAX_PROCS; i++)
                if (s->procs[i].pid == x->owner && fake_proc_live(&s->procs[i]))
                    __atomic_sub_fetch(&s->procs[i].used[x->device], x->bytes, __ATOMIC_ACQ_REL);
        }
        munmap(x, sizeof *x);
        close(a->shared_fd);
    }
    a->kind = 0;
}

CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    if (!ready())
        return CUDA_ERROR_NOT_INITIALIZED;
    struct allocation *a = live_handle(handle);
    if (!a)
        return CUDA_ERROR_INVALID_VALUE;
    a->refs--;
    let_go(a);
    return CUDA_SUCCESS;
}

CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop,
                                                CUmemGenericAllocationHandle handle)
{
    if (!ready())
        return CUDA_ERROR_NOT_INITIALIZED;
    struct allocation *a = live_handle(handle);
    if (!prop || !a)
        return CUDA_ERROR_INVALID_VALUE;
    *prop = (CUmemAllocationProp){.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                  .location = {CU_MEM_LOCATION_TYPE_DEVICE, a->ordinal},
                                  .requestedHandleTypes = a->types};
    return CUDA_SUCCESS;
}

CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                             unsigned long long flags)
{
    (void)addr;   /* a hint */
    if (!ready())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!ptr || !size || size % GRANULARITY || flags || (alignment & (alignment - 1)))
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t align = alignment > GRANULARITY ? alignment : GRANULARITY;
    uint64_t start = ROUND_UP(next_address, align);
    if (!record(K_RESERVED, start, size, 0, NULL, NULL))
        return CUDA_ERROR_OUT_OF_MEMORY;
    next_address = start + size;
    *ptr = start;
    return CUDA_SUCCESS;
}

/* Whether any mapping overlaps [start, start + size). */
static bool mapped_in(uint64_t start, uint64_t size)
{
    for (int i = 0; i < MAX_ALLOCATIONS; i++) {
        const struct allocation *m = &allocations[i];
        if (m->kind == K_MAPPING && m->handle < start + size && start < m->handle + m->bytes)
            return true;
    }
    return false;
}

/* The end of the whole mappings that follow one another from start, up to end. */
static uint64_t mapped_until(uint64_t start, uint64_t end)
{
    const struct allocation *m;
    while (start < end && (m = lookup(K_MAPPING, start)))
        start += m->bytes;
    return start;
}

CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
    if (!ready())
        return CUDA_ERROR_NOT_INITIALIZED;
    struct allocation *r = lookup(K_RESERVED, ptr);
    if (!r || r->bytes != size || mapped_in(ptr, size))
        return CUDA_ERROR_INVALID_VALUE;
    r->kind = 0;
    return CUDA_SUCCESS;
}

CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                  unsigned long long flags)
{
    if (!ready())
        return CUDA_ERROR_NOT_INITIALIZED;
    struct allocation *a = live_handle(handle);
    bool reserved = false;
    for (int i = 0; i < MAX_ALLOCATIONS && !reserved; i++) {
        const struct allocation *r = &allocations[i];
        reserved = r->kind == K_RESERVED && r->handle <= ptr && ptr + size <= r->handle + r->bytes;
    }
    /* The offset must be 0 for now; the range a reservation's, not mapped yet. */
    if (!a || offset || !size || size % GRANULARITY || ptr % GRANULARITY || size > a->bytes
        || flags || !reserved || mapped_in(ptr, size))
        return CUDA_ERROR_INVALID_VALUE;
    struct allocation *m = record(K_MAPPING, ptr, size, a->ordinal, NULL, NULL);
    if (!m)
        return CUDA_ERROR_OUT_OF_MEMORY;
    m->backing = a;
    a->maps++;
    return CUDA_SUCCESS;
}

CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    if (!ready())
        return CUDA_ERROR_NOT_INITIALIZED;
    /* Whole mappings only, one after another from ptr. */
    if (!size || mapped_until(ptr, ptr + size) != ptr + size)
        return CUDA_ERROR_INVALID_VALUE;
    for (uint64_t at = ptr; at < ptr + size;) {
        struct allocation *m = lookup(K_MAPPING, at), *a = m->backing;
        at += m->bytes;
        m->kind = 0;
        a->maps--;
        let_go(a);
    }
    return CUDA_SUCCESS;
}

CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count)
{
    if (!ready())
        return CUDA_ERROR_NOT_INITIALIZED;
    bool whole = size && mapped_until(ptr, ptr + size) == ptr + size;
    return desc && count && whole ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr)
{
    if (!ready())
        return CUDA_ERROR_NOT_INITIALIZED;
    uint64_t at = (uint64_t)(uintptr_t)addr;
    for (int i = 0; handle && i < MAX_ALLOCATIONS; i++) {
        const struct allocation *m = &allocations[i];
        if (m->kind == K_MAPPING && m->handle <= at && at < m->handle + m->bytes) {
            m->backing->refs++;
            *handle = m->backing->handle;
            return CUDA_SUCCESS;
        }
    }
    return CUDA_ERROR_INVALID_VALUE;
}

CUresult cuMemExportToShareableHandle(void *shareableHandle, CUmemGenericAllocationHandle handle,
                                      CUmemAllocationHandleType handleType,
                                      unsigned long long flags)
{
    if (!ready())
        return CUDA_ERROR_NOT_INITIALIZED;
    struct allocation *a = live_handle(handle);
    if (!shareableHandle || !a || flags)
        return CUDA_ERROR_INVALID_VALUE;
    if (handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        return CUDA_ERROR_NOT_SUPPORTED;
    if (!(a->types & handleType))
        return CUDA_ERROR_INVALID_VALUE;   /* not asked for at creation */
    if (!a->shared) {
        int fd = memfd_create("fake-cuda-vmm", MFD_CLOEXEC);
        void *m = MAP_FAILED;
        if (fd >= 0 && ftruncate(fd, sizeof *a->shared) == 0)
            m = mmap(NULL, sizeof *a->shared, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (m == MAP_FAILED) {
            if (fd >= 0)
                close(fd);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        a->shared = m;
        *a->shared = (struct vmm_export){VMM_MAGIC, getpid(), physical(a->ordinal), a->bytes, 1};
        a->shared_fd = fd;
    }
    int fd = fcntl(a->shared_fd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *(int *)shareableHandle = fd;
    return CUDA_SUCCESS;
}

CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *osHandle,
                                        CUmemAllocationHandleType shHandleType)
{
    if (!ready())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (shHandleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        return CUDA_ERROR_NOT_SUPPORTED;
    int fd = (int)(intptr_t)osHandle;
    struct stat st;
    struct vmm_export *x = MAP_FAILED;
    if (handle && fstat(fd, &st) == 0 && st.st_size == sizeof *x)
        x = mmap(NULL, sizeof *x, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (x == MAP_FAILED)
        return CUDA_ERROR_INVALID_VALUE;
    int ordinal = -1;
    for (int i = 0; i < nvisible; i++)
        if (physical(i) == x->device)
            ordinal = i;
    bool valid = x->magic == VMM_MAGIC && __atomic_load_n(&x->holders, __ATOMIC_ACQUIRE);
    /* Not the driver's, or memory of a device this process does not see. */
    struct allocation *a = valid && ordinal >= 0
                               ? record(K_HANDLE, next_handle, x->bytes, ordinal, NULL, NULL)
                               : NULL;
    if (!a) {
        munmap(x, sizeof *x);
        return valid ? CUDA_ERROR_NOT_SUPPORTED : CUDA_ERROR_INVALID_VALUE;
    }
    __atomic_add_fetch(&x->holders, 1, __ATOMIC_ACQ_REL);
    a->refs = 1;
    a->types = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    a->shared = x;
    a->shared_fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    *handle = next_handle++;
    return CUDA_SUCCESS;
}

/* ---- stream-ordered allocation ---- */

static struct pool *new_pool(int ordinal, bool on_device)
{
    for (int i = 0; i < MAX_POOLS; i++)
        if (!pools[i].alive) {
            pools[i] = (struct pool){ordinal, on_device, true, 0, 0, 0};
            return &pools[i];
        }
    return NULL;
}

static struct pool *live_pool(CUmemoryPool handle)
{
    struct pool *p = (struct pool *)handle;
    return p >= pools && p < pools + MAX_POOLS && p->alive ? p : NULL;
}

static struct pool *device_default_pool(int ordinal)
{
    if (!default_pool[ordinal])
        default_pool[ordinal] = current_pool[ordinal] = new_pool(ordinal, true);
    return default_pool[ordinal];
}

/* Returns what the pool reserves beyond max(used, keep) to the device. */
static void shrink(struct pool *p, uint64_t keep)
{
    uint64_t floor = ROUND_UP(p->used > keep ? p->used : keep, GRANULARITY);
    if (p->reserved > floor) {
        if (p->on_device)
            give_back(p->ordinal, p->reserved - floor);
        p->reserved = floor;
    }
}

CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice dev)
{
    if (!pool || !valid_ordinal(dev))
        return ready() ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_NOT_INITIALIZED;
    *pool = (CUmemoryPool)device_default_pool(dev);
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev)
{
    if (!pool || !valid_ordinal(dev))
        return ready() ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_NOT_INITIALIZED;
    device_default_pool(dev);
    *pool = (CUmemoryPool)current_pool[dev];
    return CUDA_SUCCESS;
}

CUresult cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool)
{
    struct pool *p = valid_ordinal(dev) ? live_pool(pool) : NULL;
    if (!p || !p->on_device || p->ordinal != dev)
        return CUDA_ERROR_INVALID_VALUE;
    device_default_pool(dev);
    current_pool[dev] = p;
    return CUDA_SUCCESS;
}

CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props)
{
    if (!ready())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!pool || !props || props->allocType != CU_MEM_ALLOCATION_TYPE_PINNED)
        return CUDA_ERROR_INVALID_VALUE;
    bool on_device = props->location.type == CU_MEM_LOCATION_TYPE_DEVICE;
    if (on_device ? !valid_ordinal(props->location.id)
                  : props->location.type != CU_MEM_LOCATION_TYPE_HOST)
        return CUDA_ERROR_INVALID_VALUE;
    struct pool *p = new_pool(on_device ? props->location.id : 0, on_device);
    if (!p)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *pool = (CUmemoryPool)p;
    return CUDA_SUCCESS;
}

CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
    struct pool *p = live_pool(pool);
    if (!p || p == default_pool[p->ordinal])
        return CUDA_ERROR_INVALID_VALUE;
    p->used = 0;
    shrink(p, 0);
    p->alive = false;
    return CUDA_SUCCESS;
}

/* As on the driver, a pool's trim and attribute queries are unsafe in a capture. */
CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep)
{
    struct pool *p = live_pool(pool);
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = fake_unsafe_call();
    if (r != CUDA_SUCCESS)
        return r;
    shrink(p, minBytesToKeep);
    return CUDA_SUCCESS;
}

CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    struct pool *p = live_pool(pool);
    if (!p || !value)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = fake_unsafe_call();
    if (r != CUDA_SUCCESS)
        return r;
    switch (attr) {
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
        *(cuuint64_t *)value = p->reserved;
        return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT:
        *(cuuint64_t *)value = p->used;
        return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
        *(cuuint64_t *)value = p->threshold;
        return CUDA_SUCCESS;
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
}

CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    struct pool *p = live_pool(pool);
    if (!p || !value || attr != CU_MEMPOOL_ATTR_RELEASE_THRESHOLD)
        return CUDA_ERROR_INVALID_VALUE;
    p->threshold = *(cuuint64_t *)value;
    return CUDA_SUCCESS;
}

static CUresult allocate_from(struct pool *p, CUdeviceptr *dptr, size_t bytes)
{
    CUresult r = need_context();
    if (r != CUDA_SUCCESS)
        return r;
    if (!p || !dptr || !bytes)
        return CUDA_ERROR_INVALID_VALUE;
    /* The pool grows only when its free part cannot hold the request. */
    if (p->reserved - p->used < bytes) {
        uint64_t grow = ROUND_UP(bytes, GRANULARITY);
        if (p->on_device && (r = take(p->ordinal, grow)) != CUDA_SUCCESS)
            return r;
        p->reserved += grow;
    }
    p->used += bytes;
    *dptr = next_address;
    next_address += ROUND_UP(bytes, GRANULARITY);
    record(K_ASYNC, *dptr, bytes, p->ordinal, current, p);
    return CUDA_SUCCESS;
}

/* A stream-ordered allocation from p (NULL: the current pool) on stream h:
 * a node of the graph when the stream captures. */
static CUresult allocate_async(CUdeviceptr *dptr, size_t bytes, struct pool *p, bool from_current,
                               CUstream h, bool per_thread_default)
{
    CUresult r = need_context();
    if (r != CUDA_SUCCESS)
        return r;
    if (!dptr)
        return CUDA_ERROR_INVALID_VALUE;
    bool captured;
    if ((r = fake_capture_alloc(h, per_thread_default, bytes, dptr, &captured)) != CUDA_SUCCESS
        || captured)
        return r;
    if (from_current)
        p = current_pool[current->ordinal] ? current_pool[current->ordinal]
                                           : device_default_pool(current->ordinal);
    return allocate_from(p, dptr, bytes);
}

CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    return allocate_async(dptr, bytesize, NULL, true, hStream, false);
}

CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                 CUstream hStream)
{
    return allocate_async(dptr, bytesize, live_pool(pool), false, hStream, false);
}

static CUresult free_async(CUdeviceptr dptr, CUstream h, bool per_thread_default)
{
    bool captured;
    CUresult r = fake_capture_free(h, per_thread_default, dptr, &captured);
    return r != CUDA_SUCCESS || captured ? r : release(K_ASYNC, dptr);
}

CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)
{
    return free_async(dptr, hStream, false);
}

/* A synchronization returns what each pool holds beyond its release threshold. */
void fake_pools_synchronized(void)
{
    for (int i = 0; i < MAX_POOLS; i++)
        if (pools[i].alive)
            shrink(&pools[i], pools[i].threshold);
}

PER_THREAD(cuMemAllocAsync)(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    return allocate_async(dptr, bytesize, NULL, true, hStream, true);
}

PER_THREAD(cuMemAllocFromPoolAsync)(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                    CUstream hStream)
{
    return allocate_async(dptr, bytesize, live_pool(pool), false, hStream, true);
}

PER_THREAD(cuMemFreeAsync)(CUdeviceptr dptr, CUstream hStream)
{
    return free_async(dptr, hStream, true);
}

/* ---- memory of other processes ---- */

/* What an IPC handle carries here. */
struct ipc_handle {
    uint64_t magic;
    int32_t pid;
    int32_t ordinal;
    uint64_t address, bytes;
};

#define IPC_MAGIC 0x66616b6569706331ULL

CUresult cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr)
{
    struct allocation *a = ready() && pHandle ? lookup(K_POINTER, dptr) : NULL;
    if (!a)
        return ready() ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_NOT_INITIALIZED;
    struct ipc_handle h = {IPC_MAGIC, getpid(), a->ordinal, a->handle, a->bytes};
    _Static_assert(sizeof h <= sizeof *pHandle, "an IPC handle holds 64 bytes");
    memset(pHandle, 0, sizeof *pHandle);
    memcpy(pHandle, &h, sizeof h);
    return CUDA_SUCCESS;
}

/* Maps another process's allocation; as on the driver, not one of this process's own. */
CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags)
{
    (void)Flags;
    CUresult r = need_context();
    if (r != CUDA_SUCCESS)
        return r;
    struct ipc_handle h;
    memcpy(&h, &handle, sizeof h);
    if (!pdptr || h.magic != IPC_MAGIC || h.ordinal != current->ordinal)
        return CUDA_ERROR_INVALID_VALUE;
    if (h.pid == getpid())
        return CUDA_ERROR_INVALID_CONTEXT;
    *pdptr = next_address;
    next_address += ROUND_UP(h.bytes, GRANULARITY);
    record(K_IPC, *pdptr, h.bytes, current->ordinal, current, NULL);
    return CUDA_SUCCESS;
}

CUresult cuIpcOpenMemHandle(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags)
{
    return cuIpcOpenMemHandle_v2(pdptr, handle, Flags);
}

CUresult cuIpcCloseMemHandle(CUdeviceptr dptr) { return release(K_IPC, dptr); }

CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr)
{
    for (int i = 0; ready() && i < MAX_ALLOCATIONS; i++) {
        const struct allocation *a = &allocations[i];
        bool addressed = a->kind == K_POINTER || a->kind == K_ASYNC || a->kind == K_GRAPH
                         || a->kind == K_IPC;
        if (addressed && dptr >= a->handle && dptr < a->handle + a->bytes) {
            if (pbase)
                *pbase = a->handle;
            if (psize)
                *psize = a->bytes;
            return CUDA_SUCCESS;
        }
    }
    return ready() ? CUDA_ERROR_NOT_FOUND : CUDA_ERROR_NOT_INITIALIZED;
}

/* ---- graph memory ---- */

CUresult fake_graph_back(uint64_t transient, const CUdeviceptr *kept, const uint64_t *kept_bytes,
                         unsigned nkept)
{
    CUresult r = need_context();
    if (r != CUDA_SUCCESS)
        return r;
    int o = current->ordinal;
    /* As on the driver: a graph whose allocations are still live cannot run again. */
    for (unsigned i = 0; i < nkept; i++)
        if (lookup(K_GRAPH, kept[i]))
            return CUDA_ERROR_INVALID_VALUE;
    uint64_t keeps = 0;
    for (unsigned i = 0; i < nkept; i++)
        keeps += ROUND_UP(kept_bytes[i], GRANULARITY);
    uint64_t need = graph_kept[o] + keeps + ROUND_UP(transient, GRANULARITY);
    if (need > graph_reserved[o]) {
        if ((r = take(o, need - graph_reserved[o])) != CUDA_SUCCESS)
            return r;
        graph_reserved[o] = need;
    }
    for (unsigned i = 0; i < nkept; i++)
        record(K_GRAPH, kept[i], ROUND_UP(kept_bytes[i], GRANULARITY), o, current, NULL);
    graph_kept[o] += keeps;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetGraphMemAttribute(CUdevice device, CUgraphMem_attribute attr, void *value)
{
    if (!value || !valid_ordinal(device))
        return ready() ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_NOT_INITIALIZED;
    switch (attr) {
    case CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT:
    case CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT:
        /* As measured: the driver reports both alike. */
        *(cuuint64_t *)value = graph_reserved[device];
        return CUDA_SUCCESS;
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
}

/* Gives back graph memory that no live allocation keeps. */
CUresult cuDeviceGraphMemTrim(CUdevice device)
{
    if (!valid_ordinal(device))
        return ready() ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_NOT_INITIALIZED;
    if (graph_reserved[device] > graph_kept[device]) {
        give_back(device, graph_reserved[device] - graph_kept[device]);
        graph_reserved[device] = graph_kept[device];
    }
    return CUDA_SUCCESS;
}


CUresult cuGetErrorName(CUresult error, const char **pStr)
{
    static const struct { CUresult code; const char *name; } names[] = {
        {CUDA_SUCCESS, "CUDA_SUCCESS"},
        {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE"},
        {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY"},
        {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED"},
        {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE"},
        {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE"},
        {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT"},
        {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE"},
        {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND"},
        {CUDA_ERROR_NOT_PERMITTED, "CUDA_ERROR_NOT_PERMITTED"},
        {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY"},
        {CUDA_ERROR_INVALID_IMAGE, "CUDA_ERROR_INVALID_IMAGE"},
        {CUDA_ERROR_ILLEGAL_STATE, "CUDA_ERROR_ILLEGAL_STATE"},
        {CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"},
        {CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED"},
        {CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT"},
        {CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD"},
    };
    if (!pStr)
        return CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; i < sizeof names / sizeof *names; i++)
        if (names[i].code == error) {
            *pStr = names[i].name;
            return CUDA_SUCCESS;
        }
    *pStr = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

/* ---- entry points by name and version ---- */

enum flavour { LEGACY, PER_THREAD_STREAM };

struct entry {
    const char *symbol;
    int since;
    enum flavour flavour;
    void *fn;
};

#define E(symbol, since, fn) {symbol, since, LEGACY, (void *)fn}
#define PT(symbol, since, fn) {symbol, since, PER_THREAD_STREAM, (void *)fn}

static const struct entry entries[] = {
    E("cuInit", 2000, cuInit),
    E("cuDriverGetVersion", 2020, cuDriverGetVersion),
    E("cuDeviceGet", 2000, cuDeviceGet),
    E("cuDeviceGetCount", 2000, cuDeviceGetCount),
    E("cuDeviceGetUuid", 9020, cuDeviceGetUuid),
    E("cuDeviceGetUuid", 11040, cuDeviceGetUuid_v2),
    E("cuDeviceTotalMem", 3020, cuDeviceTotalMem_v2),
    E("cuDevicePrimaryCtxRetain", 7000, cuDevicePrimaryCtxRetain),
    E("cuDevicePrimaryCtxRelease", 7000, cuDevicePrimaryCtxRelease),
    E("cuDevicePrimaryCtxRelease", 11000, cuDevicePrimaryCtxRelease_v2),
    E("cuDevicePrimaryCtxReset", 7000, cuDevicePrimaryCtxReset),
    E("cuDevicePrimaryCtxReset", 11000, cuDevicePrimaryCtxReset_v2),
    E("cuCtxCreate", 3020, cuCtxCreate_v2),
    E("cuCtxCreate", 11040, cuCtxCreate_v3),
    E("cuCtxCreate", 12050, cuCtxCreate_v4),
    E("cuCtxDestroy", 4000, cuCtxDestroy_v2),
    E("cuCtxSetCurrent", 4000, cuCtxSetCurrent),
    E("cuCtxGetCurrent", 4000, cuCtxGetCurrent),
    E("cuCtxGetDevice", 2000, cuCtxGetDevice),
    E("cuCtxSynchronize", 2000, cuCtxSynchronize),
    E("cuMemGetInfo", 2000, cuMemGetInfo),
    E("cuMemGetInfo", 3020, cuMemGetInfo_v2),
    E("cuMemAlloc", 3020, cuMemAlloc_v2),
    E("cuMemAllocPitch", 3020, cuMemAllocPitch_v2),
    E("cuMemAllocManaged", 6000, cuMemAllocManaged),
    E("cuMemAdvise", 12020, cuMemAdvise_v2),
    E("cuMemFree", 3020, cuMemFree_v2),
    E("cuArrayCreate", 3020, cuArrayCreate_v2),
    E("cuArray3DCreate", 3020, cuArray3DCreate_v2),
    E("cuArrayDestroy", 2000, cuArrayDestroy),
    E("cuArrayGetMemoryRequirements", 11060, cuArrayGetMemoryRequirements),
    E("cuMipmappedArrayCreate", 5000, cuMipmappedArrayCreate),
    E("cuMipmappedArrayDestroy", 5000, cuMipmappedArrayDestroy),
    E("cuMipmappedArrayGetMemoryRequirements", 11060, cuMipmappedArrayGetMemoryRequirements),
    E("cuMemGetAllocationGranularity", 10020, cuMemGetAllocationGranularity),
    E("cuMemCreate", 10020, cuMemCreate),
    E("cuMemRelease", 10020, cuMemRelease),
    E("cuMemAddressReserve", 10020, cuMemAddressReserve),
    E("cuMemAddressFree", 10020, cuMemAddressFree),
    E("cuMemMap", 10020, cuMemMap),
    E("cuMemUnmap", 10020, cuMemUnmap),
    E("cuMemSetAccess", 10020, cuMemSetAccess),
    E("cuMemExportToShareableHandle", 10020, cuMemExportToShareableHandle),
    E("cuMemImportFromShareableHandle", 10020, cuMemImportFromShareableHandle),
    E("cuMemGetAllocationPropertiesFromHandle", 10020, cuMemGetAllocationPropertiesFromHandle),
    E("cuMemRetainAllocationHandle", 11000, cuMemRetainAllocationHandle),
    E("cuMemAllocAsync", 11020, cuMemAllocAsync),
    PT("cuMemAllocAsync", 11020, cuMemAllocAsync_ptsz),
    E("cuMemAllocFromPoolAsync", 11020, cuMemAllocFromPoolAsync),
    PT("cuMemAllocFromPoolAsync", 11020, cuMemAllocFromPoolAsync_ptsz),
    E("cuMemFreeAsync", 11020, cuMemFreeAsync),
    PT("cuMemFreeAsync", 11020, cuMemFreeAsync_ptsz),
    E("cuMemPoolCreate", 11020, cuMemPoolCreate),
    E("cuMemPoolDestroy", 11020, cuMemPoolDestroy),
    E("cuMemPoolTrimTo", 11020, cuMemPoolTrimTo),
    E("cuMemPoolGetAttribute", 11020, cuMemPoolGetAttribute),
    E("cuMemPoolSetAttribute", 11020, cuMemPoolSetAttribute),
    E("cuDeviceGetDefaultMemPool", 11020, cuDeviceGetDefaultMemPool),
    E("cuDeviceGetMemPool", 11020, cuDeviceGetMemPool),
    E("cuDeviceSetMemPool", 11020, cuDeviceSetMemPool),
    E("cuStreamSynchronize", 2000, cuStreamSynchronize),
    PT("cuStreamSynchronize", 7000, cuStreamSynchronize_ptsz),
    E("cuStreamCreate", 2000, cuStreamCreate),
    E("cuStreamDestroy", 4000, cuStreamDestroy_v2),
    E("cuStreamQuery", 2000, cuStreamQuery),
    PT("cuStreamQuery", 7000, cuStreamQuery_ptsz),
    E("cuStreamWaitValue32", 11070, cuStreamWaitValue32_v2),
    PT("cuStreamWaitValue32", 11070, cuStreamWaitValue32_v2_ptsz),
    E("cuMemHostAlloc", 3020, cuMemHostAlloc),
    E("cuMemHostGetDevicePointer", 3020, cuMemHostGetDevicePointer_v2),
    E("cuMemFreeHost", 2000, cuMemFreeHost),
    E("cuMemHostRegister", 6050, cuMemHostRegister_v2),
    E("cuMemHostUnregister", 4000, cuMemHostUnregister),
    E("cuModuleLoadData", 2000, cuModuleLoadData),
    E("cuModuleGetFunction", 2000, cuModuleGetFunction),
    E("cuModuleUnload", 2000, cuModuleUnload),
    E("cuLaunchKernel", 4000, cuLaunchKernel),
    PT("cuLaunchKernel", 7000, cuLaunchKernel_ptsz),
    E("cuLaunchKernelEx", 11060, cuLaunchKernelEx),
    PT("cuLaunchKernelEx", 11060, cuLaunchKernelEx_ptsz),
    E("cuLaunchCooperativeKernel", 9000, cuLaunchCooperativeKernel),
    PT("cuLaunchCooperativeKernel", 9000, cuLaunchCooperativeKernel_ptsz),
    E("cuMemsetD8Async", 3020, cuMemsetD8Async),
    PT("cuMemsetD8Async", 7000, cuMemsetD8Async_ptsz),
    E("cuEventCreate", 2000, cuEventCreate),
    E("cuEventDestroy", 4000, cuEventDestroy_v2),
    E("cuEventRecord", 2000, cuEventRecord),
    PT("cuEventRecord", 7000, cuEventRecord_ptsz),
    E("cuEventQuery", 2000, cuEventQuery),
    E("cuEventSynchronize", 2000, cuEventSynchronize),
    E("cuEventElapsedTime", 2000, cuEventElapsedTime),
    E("cuEventElapsedTime", 12080, cuEventElapsedTime_v2),
    E("cuThreadExchangeStreamCaptureMode", 10010, cuThreadExchangeStreamCaptureMode),
    E("cuStreamBeginCapture", 10000, cuStreamBeginCapture),
    PT("cuStreamBeginCapture", 10000, cuStreamBeginCapture_ptsz),
    E("cuStreamBeginCapture", 10010, cuStreamBeginCapture_v2),
    PT("cuStreamBeginCapture", 10010, cuStreamBeginCapture_v2_ptsz),
    E("cuStreamEndCapture", 10000, cuStreamEndCapture),
    PT("cuStreamEndCapture", 10000, cuStreamEndCapture_ptsz),
    E("cuStreamIsCapturing", 10000, cuStreamIsCapturing),
    PT("cuStreamIsCapturing", 10000, cuStreamIsCapturing_ptsz),
    E("cuGraphGetNodes", 10000, cuGraphGetNodes),
    E("cuGraphInstantiateWithFlags", 11040, cuGraphInstantiateWithFlags),
    E("cuGraphInstantiate", 10000, cuGraphInstantiate_v2),
    E("cuGraphInstantiate", 12000, cuGraphInstantiateWithFlags),
    E("cuGraphInstantiateWithParams", 12000, cuGraphInstantiateWithParams),
    PT("cuGraphInstantiateWithParams", 12000, cuGraphInstantiateWithParams_ptsz),
    E("cuGraphUpload", 11010, cuGraphUpload),
    PT("cuGraphUpload", 11010, cuGraphUpload_ptsz),
    E("cuGraphCreate", 10000, cuGraphCreate),
    E("cuGraphAddMemAllocNode", 11040, cuGraphAddMemAllocNode),
    E("cuGraphNodeGetType", 10000, cuGraphNodeGetType),
    E("cuGraphMemAllocNodeGetParams", 11040, cuGraphMemAllocNodeGetParams),
    E("cuGraphChildGraphNodeGetGraph", 10000, cuGraphChildGraphNodeGetGraph),
    E("cuGraphMemFreeNodeGetParams", 11040, cuGraphMemFreeNodeGetParams),
    E("cuDeviceGetGraphMemAttribute", 11040, cuDeviceGetGraphMemAttribute),
    E("cuDeviceGraphMemTrim", 11040, cuDeviceGraphMemTrim),
    E("cuIpcGetMemHandle", 4010, cuIpcGetMemHandle),
    E("cuIpcOpenMemHandle", 4010, cuIpcOpenMemHandle),
    E("cuIpcOpenMemHandle", 11000, cuIpcOpenMemHandle_v2),
    E("cuIpcCloseMemHandle", 4010, cuIpcCloseMemHandle),
    E("cuMemGetAddressRange", 3020, cuMemGetAddressRange_v2),
    E("cuGraphLaunch", 10000, cuGraphLaunch),
    PT("cuGraphLaunch", 10000, cuGraphLaunch_ptsz),
    E("cuGraphExecDestroy", 10000, cuGraphExecDestroy),
    E("cuGraphDestroy", 10000, cuGraphDestroy),
    E("cuGetErrorName", 6000, cuGetErrorName),
    E("cuGetProcAddress", 11030, cuGetProcAddress),
    E("cuGetProcAddress", 12000, cuGetProcAddress_v2),
};

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *symbolStatus)
{
    const cuuint64_t known = CU_GET_PROC_ADDRESS_LEGACY_STREAM
                             | CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
    if (!symbol || !pfn || (flags & ~known))
        return CUDA_ERROR_INVALID_VALUE;
    enum flavour wanted = flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM ? PER_THREAD_STREAM
                                                                                 : LEGACY;
    const struct entry *best = NULL;
    bool named = false;
    for (unsigned i = 0; i < sizeof entries / sizeof *entries; i++) {
        const struct entry *e = &entries[i];
        if (strcmp(e->symbol, symbol) != 0)
            continue;
        named = true;
        /* The newest version the caller was built for; the per-thread one if asked and there. */
        if (e->since > cudaVersion || (e->flavour == PER_THREAD_STREAM && wanted != PER_THREAD_STREAM))
            continue;
        if (!best || e->since > best->since || (e->since == best->since && e->flavour == wanted))
            best = e;
    }
    *pfn = best ? best->fn : NULL;
    if (symbolStatus)
        *symbolStatus = best    ? CU_GET_PROC_ADDRESS_SUCCESS
                        : named ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                                : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return best ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags)
{
    return cuGetProcAddress_v2(symbol, pfn, cudaVersion, flags, NULL);
}
