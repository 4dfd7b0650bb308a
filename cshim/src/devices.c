/* Maps CUDA ordinals and NVML UUIDs to the limited devices of the limits file. */
#define _GNU_SOURCE
#include "devices.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "driver.h"
#include "log.h"
#include "setup.h"
#include "uuid.h"

#define CACHED_ORDINALS 64

static struct vc_device devices[VC_MAX_DEVICES];
static unsigned ndevices;
/* An ordinal's device once known; &unlimited for one the limits do not cover. */
static const struct vc_device *by_ordinal[CACHED_ORDINALS];
static const struct vc_device unlimited;

static bool listed(const struct vc_limits *limits, const char *uuid)
{
    if (limits->ndevices == 0)
        return true;
    for (unsigned i = 0; i < limits->ndevices; i++)
        if (strcmp(limits->devices[i], uuid) == 0)
            return true;
    return false;
}

/* The account's index for uuid; -1 if its device table is full. */
static int account_index(const char *uuid)
{
    struct vc_region *r = vc_region();
    int cancel;
    if (!vc_region_lock(r, &r->lock, &cancel))
        return -1;
    int index = vc_region_device(r, uuid);
    vc_region_unlock(&r->lock, cancel);
    return index;
}

const struct vc_device *vc_device_by_uuid(const char *uuid)
{
    if (vc_mode() != VC_ON || !listed(vc_limits(), uuid))
        return NULL;
    const struct vc_device *found = NULL;
    pthread_mutex_lock(&vc_local_lock);
    for (unsigned i = 0; i < ndevices && !found; i++)
        if (strcmp(devices[i].uuid, uuid) == 0)
            found = &devices[i];
    if (!found && ndevices < VC_MAX_DEVICES) {
        int index = account_index(uuid);
        if (index >= 0) {
            struct vc_device *d = &devices[ndevices++];
            d->index = index;
            d->limit = vc_limits()->memory;
            snprintf(d->uuid, sizeof d->uuid, "%s", uuid);
            found = d;
        }
    }
    pthread_mutex_unlock(&vc_local_lock);
    if (!found)
        vc_log(VC_LOG_ERROR, "more than %d devices in one account: %s is not limited",
               VC_MAX_DEVICES, uuid);
    return found;
}

const struct vc_device *vc_device_of(CUdevice dev)
{
    if (vc_mode() != VC_ON)
        return NULL;
    bool cacheable = dev >= 0 && dev < CACHED_ORDINALS;
    const struct vc_device *d = cacheable ? __atomic_load_n(&by_ordinal[dev], __ATOMIC_ACQUIRE) : NULL;
    if (d)
        return d == &unlimited ? NULL : d;
    CUuuid raw;
    /* Not cached on failure: before cuInit, say, the answer is not final. */
    if (vc_real_cuDeviceGetUuid_v2(&raw, dev) != CUDA_SUCCESS)
        return NULL;
    char uuid[VC_UUID_LEN];
    vc_uuid_format((const unsigned char *)raw.bytes, uuid, sizeof uuid);
    d = vc_device_by_uuid(uuid);
    if (cacheable)
        __atomic_store_n(&by_ordinal[dev], d ? d : &unlimited, __ATOMIC_RELEASE);
    vc_log(VC_LOG_DEBUG, "device %d is %s%s", (int)dev, uuid, d ? "" : " (not limited)");
    return d;
}

const struct vc_device *vc_device_current(void)
{
    CUdevice dev;
    if (vc_mode() != VC_ON || vc_real_cuCtxGetDevice(&dev) != CUDA_SUCCESS)
        return NULL;
    return vc_device_of(dev);
}
