/* What each live allocation of this process was charged, so its free gives it back. */
#ifndef VC_TRACK_H
#define VC_TRACK_H

#include <stdbool.h>
#include <stdint.h>

#include "api.h"
#include "devices.h"

/* VC_KIND_IPC: memory of another process, mapped by cuIpcOpenMemHandle.
 * VC_KIND_HANDLE: a VMM allocation (cuMemCreate, cuMemImportFromShareableHandle), by handle;
 * VC_KIND_MAPPING: a cuMemMap of one, by address (its bytes: the mapping's size). */
enum vc_kind {
    VC_KIND_POINTER = 1,
    VC_KIND_ARRAY,
    VC_KIND_MIPMAP,
    VC_KIND_HANDLE,
    VC_KIND_IPC,
    VC_KIND_MAPPING,
};

struct vc_charge {
    const struct vc_device *device;
    uint64_t bytes;
    CUcontext context;        /* freed with it; NULL for VMM handles, which outlive contexts */
    unsigned holds;           /* VC_KIND_HANDLE: its handle references and mappings */
    uint64_t handle;          /* VC_KIND_MAPPING: the VMM allocation mapped */
    bool in_host;             /* VC_KIND_POINTER: virtual memory, counted in host memory */
};

/* The account entry a charge is counted in. */
static inline int vc_charge_entry(const struct vc_charge *c)
{
    return c->in_host ? c->device->host_index : c->device->index;
}

/* Remembers the charge of the object (kind, key). */
void vc_track_add(enum vc_kind kind, uint64_t key, struct vc_charge charge);

/* Forgets (kind, key) and returns its charge; false if it was never charged. */
bool vc_track_take(enum vc_kind kind, uint64_t key, struct vc_charge *charge);

/* Adds bytes and holds to (kind, key)'s charge, at once for every thread, and
 * returns the charge as it is then; when holds takes the last one away, it is
 * forgotten (its bytes are the caller's to give back). false if (kind, key)
 * is not tracked. */
bool vc_track_adjust(enum vc_kind kind, uint64_t key, int64_t bytes, int holds,
                     struct vc_charge *now);

/* The driver freed every allocation of context: credits them all. */
void vc_track_drop_context(CUcontext context);

/* In a forked child: the parent's allocations are not ours. */
void vc_track_forked(void);

#endif
