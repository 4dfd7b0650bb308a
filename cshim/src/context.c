/* Charges each context of this process by its measured size, and credits it when it goes. */
#define _GNU_SOURCE
#include "context.h"

#include <string.h>

#include "account.h"
#include "driver.h"
#include "log.h"
#include "memory.h"
#include "nvml.h"
#include "pacer.h"
#include "setup.h"
#include "track.h"

#define ORDINALS 64
#define MAX_CREATED 256

/* Charged to a context when measuring is impossible or gives an implausible figure. */
#define ESTIMATE (512ULL << 20)
#define MEASURE_MAX (2048ULL << 20)

/* One context creation in flight. */
struct vc_context_op {
    const struct vc_device *device;   /* NULL: not counted */
    CUdevice ordinal;
    bool primary;
    bool creates;                     /* a new context comes into being (and is charged) */
    bool locked;                      /* holds the account's context lock */
    bool known;                       /* this process measured a context on the device before */
    bool measured;                    /* before holds NVML's used bytes */
    uint64_t held;                    /* the container's bytes on the device then */
    uint64_t charged;                 /* charged up front: the size measured, else ESTIMATE */
    uint64_t before;
    int cancel;
};

struct primary {
    unsigned refs;
    bool creating;
    CUcontext context;
    uint64_t charged;
};

struct created {
    CUcontext context;
    const struct vc_device *device;
    uint64_t charged;
};

/* All guarded by vc_local_lock. */
static struct primary primaries[ORDINALS];
static uint64_t measured_size[ORDINALS];
static struct created created[MAX_CREATED];
static unsigned ncreated;

/* The device's used bytes as NVML sees them (all processes on it). */
static bool device_used(const char *uuid, uint64_t *used)
{
    nvmlMemory_t memory;
    if (!vc_nvml_memory(uuid, &memory))
        return false;
    *used = memory.used;
    return true;
}

/* Lets go of the context lock and the primary context's creating mark. */
static void finish(struct vc_context_op *op)
{
    if (op->locked) {
        struct vc_region *r = vc_region();
        vc_region_unlock(&r->context_lock, op->cancel);
        op->locked = false;
    }
    if (op->primary) {
        pthread_mutex_lock(&vc_local_lock);
        primaries[op->ordinal].creating = false;
        pthread_mutex_unlock(&vc_local_lock);
    }
}

/* Starts the creation of a context on dev (primary: retaining the primary
 * context, which creates one only if none is live): a new context is charged
 * its expected size up front and measuring begins. CUDA_ERROR_OUT_OF_MEMORY
 * when it does not fit: the driver is not called. */
static CUresult begin(struct vc_context_op *op, CUdevice dev, bool primary)
{
    memset(op, 0, sizeof *op);
    op->ordinal = dev;
    op->primary = primary;
    if (dev < 0 || dev >= ORDINALS || !(op->device = vc_device_of(dev)))
        return CUDA_SUCCESS;
    pthread_mutex_lock(&vc_local_lock);
    struct primary *p = &primaries[dev];
    /* Retaining a live primary context only counts a reference. */
    op->creates = !primary || (p->refs == 0 && !p->creating);
    if (primary && op->creates)
        p->creating = true;
    op->known = measured_size[dev] != 0;
    op->charged = op->known ? measured_size[dev] : ESTIMATE;
    pthread_mutex_unlock(&vc_local_lock);
    if (!op->creates)
        return CUDA_SUCCESS;
    struct vc_region *r = vc_region();
    op->locked = vc_region_lock(r, &r->context_lock, &op->cancel);
    if (vc_memory_charge(op->device, op->charged) != CUDA_SUCCESS) {
        vc_log(VC_LOG_INFO, "a new context on %s does not fit in the limit: out of memory",
               op->device->uuid);
        finish(op);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (op->known || !op->locked)
        return CUDA_SUCCESS;
    op->held = vc_account_used(op->device->index);
    op->measured = device_used(op->device->uuid, &op->before);
    return CUDA_SUCCESS;
}

/* NVML's figure for the new context; 0 when it was not measured (this
 * process measured one on the device before) or is not plausible. A
 * context's size on a device does not change within a process, and every
 * measurement is exposed to the container's other processes, which allocate
 * and free while it is made (only contexts are made one at a time): memory
 * freed meanwhile would make the context look smaller, and the container
 * could hold that much past its limit. So a process measures its first
 * context on a device (a forked child keeps its parent's figure), and a
 * measurement is not trusted when the container's memory changed meanwhile. */
static uint64_t measured_bytes(struct vc_context_op *op)
{
    uint64_t after;
    if (op->known)
        return 0;
    if (!op->measured || !device_used(op->device->uuid, &after) || after <= op->before
        || after - op->before > MEASURE_MAX
        || vc_account_used(op->device->index) != op->held) {
        vc_log(VC_LOG_INFO, "context size on %s not measurable: %llu bytes charged",
               op->device->uuid, (unsigned long long)op->charged);
        return 0;
    }
    vc_log(VC_LOG_INFO, "a context on %s takes %llu bytes", op->device->uuid,
           (unsigned long long)(after - op->before));
    return after - op->before;
}

/* After the driver's call with its result and the context it gave: the
 * up-front charge becomes the measured size. A context whose measured size
 * no longer fits is destroyed again and the answer is out of memory. */
static CUresult end(struct vc_context_op *op, CUresult result, CUcontext context)
{
    if (!op->device)
        return result;
    bool ok = result == CUDA_SUCCESS;
    if (!op->creates) {
        pthread_mutex_lock(&vc_local_lock);
        primaries[op->ordinal].refs += ok;
        pthread_mutex_unlock(&vc_local_lock);
        return result;
    }
    uint64_t measured = ok ? measured_bytes(op) : 0;
    uint64_t size = measured ? measured : op->charged;
    if (ok && size > op->charged && !vc_memory_reserve(op->device, size - op->charged)) {
        vc_log(VC_LOG_INFO, "a new context on %s takes %llu bytes, past the limit: out of memory",
               op->device->uuid, (unsigned long long)size);
        if (op->primary)
            vc_real_cuDevicePrimaryCtxRelease_v2(op->ordinal);
        else
            vc_real_cuCtxDestroy_v2(context);
        ok = false;
        result = CUDA_ERROR_OUT_OF_MEMORY;
    } else if (ok && size < op->charged) {
        vc_account_add(op->device->index, -(int64_t)(op->charged - size));
    }
    if (!ok)
        vc_account_add(op->device->index, -(int64_t)op->charged);
    finish(op);
    pthread_mutex_lock(&vc_local_lock);
    if (ok && measured)
        measured_size[op->ordinal] = measured;
    if (ok && op->primary) {
        struct primary *p = &primaries[op->ordinal];
        *p = (struct primary){p->refs + 1, false, context, size};
    } else if (ok && ncreated < MAX_CREATED) {
        created[ncreated++] = (struct created){context, op->device, size};
    } else if (ok) {
        vc_log(VC_LOG_WARN, "more than %d contexts: a destroyed one stays charged", MAX_CREATED);
    }
    pthread_mutex_unlock(&vc_local_lock);
    return result;
}

/* Whether releasing dev's primary context now destroys it (as far as this
 * process's retains through the shim tell; when unsure, yes). */
static bool last_reference(CUdevice dev)
{
    if (dev < 0 || dev >= ORDINALS)
        return true;
    pthread_mutex_lock(&vc_local_lock);
    bool last = primaries[dev].refs <= 1;
    pthread_mutex_unlock(&vc_local_lock);
    return last;
}

static void primary_released(CUdevice dev)
{
    if (dev < 0 || dev >= ORDINALS || !vc_device_of(dev))
        return;
    pthread_mutex_lock(&vc_local_lock);
    struct primary *p = &primaries[dev];
    struct primary gone = {0};
    if (p->refs > 0 && --p->refs == 0) {
        gone = *p;
        *p = (struct primary){0};
    }
    pthread_mutex_unlock(&vc_local_lock);
    /* The last release destroys the context and everything allocated in it. */
    if (gone.context) {
        vc_account_add(vc_device_of(dev)->index, -(int64_t)gone.charged);
        vc_track_drop_context(gone.context);
    }
}

static void primary_reset(CUdevice dev)
{
    if (dev < 0 || dev >= ORDINALS || !vc_device_of(dev))
        return;
    pthread_mutex_lock(&vc_local_lock);
    CUcontext context = primaries[dev].context;
    pthread_mutex_unlock(&vc_local_lock);
    if (context)
        vc_track_drop_context(context);
}

static void destroyed(CUcontext context)
{
    struct created gone = {0};
    pthread_mutex_lock(&vc_local_lock);
    for (unsigned i = 0; i < ncreated; i++) {
        if (created[i].context == context) {
            gone = created[i];
            created[i] = created[--ncreated];
            break;
        }
    }
    pthread_mutex_unlock(&vc_local_lock);
    if (gone.device) {
        vc_account_add(gone.device->index, -(int64_t)gone.charged);
        vc_track_drop_context(context);
    }
}

typedef CUresult (*create_fn)(CUcontext *, const void *, unsigned, CUdevice);

static CUresult create(CUcontext *pctx, const void *params, unsigned flags, CUdevice dev,
                       create_fn call)
{
    struct vc_context_op op;
    CUresult r = begin(&op, dev, false);
    if (r != CUDA_SUCCESS)
        return r;
    r = call(pctx, params, flags, dev);
    return end(&op, r, r == CUDA_SUCCESS ? *pctx : NULL);
}

static CUresult create_v2(CUcontext *pctx, const void *params, unsigned flags, CUdevice dev)
{
    (void)params;
    return vc_real_cuCtxCreate_v2(pctx, flags, dev);
}

struct affinity {
    CUexecAffinityParam *params;
    int count;
};

static CUresult create_v3(CUcontext *pctx, const void *params, unsigned flags, CUdevice dev)
{
    const struct affinity *a = params;
    return vc_real_cuCtxCreate_v3(pctx, a->params, a->count, flags, dev);
}

static CUresult create_v4(CUcontext *pctx, const void *params, unsigned flags, CUdevice dev)
{
    return vc_real_cuCtxCreate_v4(pctx, (CUctxCreateParams *)params, flags, dev);
}

CUresult CUDAAPI cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    return create(pctx, NULL, flags, dev, create_v2);
}

CUresult CUDAAPI cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray, int numParams,
                                unsigned int flags, CUdevice dev)
{
    struct affinity a = {paramsArray, numParams};
    return create(pctx, &a, flags, dev, create_v3);
}

CUresult CUDAAPI cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *ctxCreateParams,
                                unsigned int flags, CUdevice dev)
{
    return create(pctx, ctxCreateParams, flags, dev, create_v4);
}

CUresult CUDAAPI cuCtxDestroy_v2(CUcontext ctx)
{
    vc_pacer_forget_context(ctx);
    CUresult r = vc_real_cuCtxDestroy_v2(ctx);
    if (r == CUDA_SUCCESS)
        destroyed(ctx);
    return r;
}

CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    struct vc_context_op op;
    CUresult r = begin(&op, dev, true);
    if (r != CUDA_SUCCESS)
        return r;
    r = vc_real_cuDevicePrimaryCtxRetain(pctx, dev);
    return end(&op, r, r == CUDA_SUCCESS ? *pctx : NULL);
}

static CUresult release_primary(CUdevice dev, CUresult (*real)(CUdevice))
{
    if (last_reference(dev))
        vc_pacer_forget_device(dev);
    CUresult r = real(dev);
    if (r == CUDA_SUCCESS)
        primary_released(dev);
    return r;
}

static CUresult reset_primary(CUdevice dev, CUresult (*real)(CUdevice))
{
    vc_pacer_forget_device(dev);
    CUresult r = real(dev);
    if (r == CUDA_SUCCESS)
        primary_reset(dev);
    return r;
}

/* The CUDA runtime still asks for the original release and reset (version 7.0). */
CUresult CUDAAPI cuDevicePrimaryCtxRelease(CUdevice dev)
{
    return release_primary(dev, vc_real_cuDevicePrimaryCtxRelease);
}

CUresult CUDAAPI cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    return release_primary(dev, vc_real_cuDevicePrimaryCtxRelease_v2);
}

CUresult CUDAAPI cuDevicePrimaryCtxReset(CUdevice dev)
{
    return reset_primary(dev, vc_real_cuDevicePrimaryCtxReset);
}

CUresult CUDAAPI cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    return reset_primary(dev, vc_real_cuDevicePrimaryCtxReset_v2);
}

void vc_contexts_forked(void)
{
    memset(primaries, 0, sizeof primaries);
    memset(created, 0, sizeof created);
    ncreated = 0;
}
