/* Keeps each pool's charge equal to the bytes the driver says the pool reserves. */
#define _GNU_SOURCE
#include "pools.h"

#include <string.h>

#include "account.h"
#include "capture.h"
#include "driver.h"
#include "log.h"
#include "memory.h"
#include "setup.h"

#define MAX_POOLS 256

/* One stream-ordered allocation in flight. */
struct vc_pool_op {
    const struct vc_device *device;   /* NULL: not counted */
    CUmemoryPool pool;
    uint64_t reserved;                /* bytes charged up front */
};

struct pool {
    CUmemoryPool handle;
    const struct vc_device *device;   /* NULL: memory not on a limited device */
    uint64_t charged;
};

static struct pool pools[MAX_POOLS];
static unsigned npools;

/* A pool's attribute. The driver counts the query as unsafe in a stream
 * capture (measured: a global-mode capture of the calling thread, or of any
 * thread, is invalidated): asked in relaxed mode, it never is. */
static uint64_t attribute(CUmemoryPool pool, CUmemPool_attribute attr, bool *ok)
{
    cuuint64_t value = 0;
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    vc_real_cuThreadExchangeStreamCaptureMode(&mode);
    *ok = vc_real_cuMemPoolGetAttribute(pool, attr, &value) == CUDA_SUCCESS;
    vc_real_cuThreadExchangeStreamCaptureMode(&mode);
    return value;
}

/* Needs vc_local_lock. */
static struct pool *lookup(CUmemoryPool handle)
{
    for (unsigned i = 0; i < npools; i++)
        if (pools[i].handle == handle)
            return &pools[i];
    return NULL;
}

/* Needs vc_local_lock. */
static struct pool *insert(CUmemoryPool handle, const struct vc_device *device)
{
    struct pool *p = lookup(handle);
    if (!p && npools < MAX_POOLS)
        p = &pools[npools++];
    if (!p)
        vc_log(VC_LOG_ERROR, "more than %d memory pools: a new one is charged as it grows only",
               MAX_POOLS);
    else if (p->handle != handle)
        *p = (struct pool){handle, device, 0};
    return p;
}

/* Needs vc_local_lock. Brings p's charge to what the pool now reserves;
 * returns false if the pool is gone. */
static bool settle(struct pool *p)
{
    bool ok;
    uint64_t reserved = attribute(p->handle, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &ok);
    if (!ok)
        reserved = 0;
    if (p->device && reserved != p->charged)
        vc_account_add(p->device->index, (int64_t)(reserved - p->charged));
    p->charged = reserved;
    return ok;
}

static void forget(struct pool *p)
{
    *p = pools[--npools];
}

/* Charges what allocating bytes from pool (current: the current device's
 * current pool) on stream may add to the pool's reservation. On a capturing
 * stream it becomes a node of the graph, charged when the graph is launched
 * (graphs.h), and takes nothing from the pool now. */
static CUresult begin(struct vc_pool_op *op, CUmemoryPool pool, bool current, size_t bytes,
                      CUstream stream, bool ptsz)
{
    *op = (struct vc_pool_op){NULL, pool, 0};
    CUdevice dev;
    if (vc_mode() != VC_ON || (!current && !pool) || vc_real_cuCtxGetDevice(&dev) != CUDA_SUCCESS
        || vc_capturing(stream, ptsz))
        return CUDA_SUCCESS;
    if (current && vc_real_cuDeviceGetMemPool(&op->pool, dev) != CUDA_SUCCESS)
        return CUDA_SUCCESS;
    pthread_mutex_lock(&vc_local_lock);
    struct pool *known = lookup(op->pool);
    const struct vc_device *device = known ? known->device : NULL;
    pthread_mutex_unlock(&vc_local_lock);
    /* A pool first seen here (a device's default pool) belongs to the current device. */
    op->device = known ? device : vc_device_of(dev);
    if (!op->device)
        return CUDA_SUCCESS;
    bool ok_reserved, ok_used;
    uint64_t reserved = attribute(op->pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &ok_reserved);
    uint64_t used = attribute(op->pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &ok_used);
    /* The pool grows only when its free part cannot hold the request. */
    op->reserved = ok_reserved && ok_used && reserved - used >= bytes ? 0 : bytes;
    CUresult r = vc_memory_charge(op->device, op->reserved);
    if (r != CUDA_SUCCESS)
        op->device = NULL;
    return r;
}

/* After the driver's call: replaces the up-front charge by what the pool now holds. */
static void end(const struct vc_pool_op *op)
{
    if (!op->device)
        return;
    pthread_mutex_lock(&vc_local_lock);
    struct pool *p = insert(op->pool, op->device);
    if (p)
        settle(p);
    pthread_mutex_unlock(&vc_local_lock);
    vc_account_add(op->device->index, -(int64_t)op->reserved);
}

static void created(CUmemoryPool pool, const CUmemPoolProps *props)
{
    if (vc_mode() != VC_ON)
        return;
    const struct vc_device *device = props->location.type == CU_MEM_LOCATION_TYPE_DEVICE
                                         ? vc_device_of(props->location.id)
                                         : NULL;
    pthread_mutex_lock(&vc_local_lock);
    insert(pool, device);
    pthread_mutex_unlock(&vc_local_lock);
}

static void destroyed(CUmemoryPool pool)
{
    pthread_mutex_lock(&vc_local_lock);
    struct pool *p = lookup(pool);
    if (p) {
        if (p->device && p->charged)
            vc_account_add(p->device->index, -(int64_t)p->charged);
        forget(p);
    }
    pthread_mutex_unlock(&vc_local_lock);
}

void vc_pools_refresh(void)
{
    pthread_mutex_lock(&vc_local_lock);
    for (unsigned i = 0; i < npools;) {
        if (settle(&pools[i]))
            i++;
        else
            forget(&pools[i]);
    }
    pthread_mutex_unlock(&vc_local_lock);
}

void vc_pools_forked(void)
{
    memset(pools, 0, sizeof pools);
    npools = 0;
}

typedef CUresult (*from_pool_fn)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);

static CUresult current_pool(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool, CUstream stream)
{
    (void)pool;
    return vc_real_cuMemAllocAsync(dptr, bytes, stream);
}

static CUresult current_pool_ptsz(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool,
                                  CUstream stream)
{
    (void)pool;
    return vc_real_cuMemAllocAsync_ptsz(dptr, bytes, stream);
}

/* Charges, allocates through the driver (call), and settles the pool's charge;
 * current: the allocation comes from the current pool, not from pool. */
static CUresult allocate(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool, bool current,
                         CUstream stream, bool ptsz, from_pool_fn call)
{
    struct vc_pool_op op;
    CUresult r = begin(&op, pool, current, bytes, stream, ptsz);
    if (r == CUDA_SUCCESS) {
        r = call(dptr, bytes, pool, stream);
        end(&op);
    }
    return r;
}

CUresult CUDAAPI cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    return allocate(dptr, bytesize, NULL, true, hStream, false, current_pool);
}

CUresult CUDAAPI cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    return allocate(dptr, bytesize, NULL, true, hStream, true, current_pool_ptsz);
}

CUresult CUDAAPI cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                         CUstream hStream)
{
    return allocate(dptr, bytesize, pool, false, hStream, false, vc_real_cuMemAllocFromPoolAsync);
}

CUresult CUDAAPI cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize,
                                              CUmemoryPool pool, CUstream hStream)
{
    return allocate(dptr, bytesize, pool, false, hStream, true,
                    vc_real_cuMemAllocFromPoolAsync_ptsz);
}

CUresult CUDAAPI cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *poolProps)
{
    CUresult r = vc_real_cuMemPoolCreate(pool, poolProps);
    if (r == CUDA_SUCCESS)
        created(*pool, poolProps);
    return r;
}

CUresult CUDAAPI cuMemPoolDestroy(CUmemoryPool pool)
{
    CUresult r = vc_real_cuMemPoolDestroy(pool);
    if (r == CUDA_SUCCESS)
        destroyed(pool);
    return r;
}

CUresult CUDAAPI cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep)
{
    CUresult r = vc_real_cuMemPoolTrimTo(pool, minBytesToKeep);
    if (r == CUDA_SUCCESS)
        vc_pools_refresh();
    return r;
}
