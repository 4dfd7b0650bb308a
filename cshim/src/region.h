/*
 * The shared account: one file that every process of a container maps, with a
 * robust process-shared lock and one slot per process (layout: cshim/README.md).
 */
#ifndef VC_REGION_H
#define VC_REGION_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "limits_file.h"

#define VC_REGION_MAGIC "VCUDAACC"
#define VC_REGION_VERSION 2
#define VC_REGION_SLOTS 1024
#define VC_REGION_UUID_SIZE 96
#define VC_REGION_HEADER_SIZE 4096
/* The device table's entry "<UUID>+host" counts a device's bytes that live in host memory. */
#define VC_HOST_SUFFIX "+host"

struct vc_slot {
    int32_t pid;                      /* 0: free */
    uint32_t reserved;
    uint64_t start_time;              /* clock ticks since boot, /proc/<pid>/stat field 22 */
    uint64_t used[VC_MAX_DEVICES];    /* bytes this process holds on each device */
};

union vc_region_lock {
    pthread_mutex_t mutex;
    char size[64];
};

struct vc_region {
    char magic[8];
    uint32_t version;
    uint32_t header_size;
    uint32_t max_devices;
    uint32_t max_slots;
    uint32_t slot_size;
    uint32_t uuid_size;
    int64_t last_reap_ns;             /* CLOCK_MONOTONIC of the last sweep of dead slots */
    uint32_t ndevices;                /* entries of uuid[] in use */
    uint32_t slot_bound;              /* slots from this index on have never been used */
    char pad0[16];
    char uuid[VC_MAX_DEVICES][VC_REGION_UUID_SIZE];
    union vc_region_lock lock;        /* guards everything below the header fields */
    union vc_region_lock context_lock; /* serializes context creation, so it can be measured */
    int64_t bucket[VC_MAX_DEVICES];   /* each device's GPU-time bucket (bucket.h), lock-free */
    uint64_t gpu_ns[VC_MAX_DEVICES];  /* GPU time charged to the container on each device, ns */
    char pad1[VC_REGION_HEADER_SIZE - 64 - VC_MAX_DEVICES * VC_REGION_UUID_SIZE - 128
              - 16 * VC_MAX_DEVICES];
    struct vc_slot slots[VC_REGION_SLOTS];
};

/* Maps the account at path, creating and initializing it if needed; an empty
 * path gives a private one (shared with forked children only). NULL on error,
 * with the reason in err. */
struct vc_region *vc_region_open(const char *path, char *err, size_t errlen);

/* Takes the lock, repairing the region if its last holder died. Returns false
 * if the lock is unusable. Thread cancellation is off while it is held. */
bool vc_region_lock(struct vc_region *r, union vc_region_lock *lock, int *cancel_state);
void vc_region_unlock(union vc_region_lock *lock, int cancel_state);

/* The same, giving up (false) after ms milliseconds. */
bool vc_region_lock_within(struct vc_region *r, union vc_region_lock *lock, int *cancel_state,
                           int ms);

/* The following need r->lock held. */

/* Index of uuid in the region's device table, adding it if new; -1 if full. */
int vc_region_device(struct vc_region *r, const char *uuid);

/* The slot of the process (pid, start): its own if present (reset to zero),
 * else a free or dead one; NULL when every slot belongs to a live process. */
struct vc_slot *vc_region_claim(struct vc_region *r, int32_t pid, uint64_t start);

/* Empties a slot. */
void vc_region_free_slot(struct vc_slot *s);

/* Bytes held on device index dev by all slots. */
uint64_t vc_region_used(const struct vc_region *r, int dev);

/* Frees the slots of processes that are gone. */
void vc_region_reap(struct vc_region *r);

/* The same, unless the last sweep is less than a second old. */
void vc_region_reap_stale(struct vc_region *r);

#endif
