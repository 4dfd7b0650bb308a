/* Maps CUDA ordinals and NVML UUIDs to the devices of the limits file. */
#define _GNU_SOURCE
#include "devices.h"

#include <ctype.h>
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
/* An ordinal's device once known. */
static const struct vc_device *by_ordinal[CACHED_ORDINALS];
/* Every device the limits do not cover: a tenant must not get one unlimited. */
static const struct vc_device refused = {
    .index = -1, .host_index = -1, .limit = 0, .device_limit = 0, .uuid = "(not listed)"};

/* NVML's spelling of a UUID: prefix in capitals, hex digits in lower case. */
static void canonical(const char *uuid, char *out, size_t len)
{
    snprintf(out, len, "%s", uuid);
    for (size_t i = 0; out[i]; i++)
        out[i] = (char)(i < 3 ? toupper((unsigned char)out[i]) : tolower((unsigned char)out[i]));
}

/* Whether the limits cover the device of these bytes; its name is then the
 * limits file's entry (a MIG UUID stays one), else the name given. */
static bool listed(const struct vc_limits *limits, const unsigned char bytes[16], const char *given,
                   char *name, size_t len)
{
    if (limits->ndevices == 0) {
        canonical(given, name, len);
        return true;
    }
    for (unsigned i = 0; i < limits->ndevices; i++) {
        unsigned char entry[16];
        if (vc_uuid_parse(limits->devices[i], entry) && memcmp(entry, bytes, 16) == 0) {
            canonical(limits->devices[i], name, len);
            return true;
        }
    }
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

/* The account's entry of the bytes of device uuid that live in host memory (virtual memory);
 * -1, and every allocation then in device memory, if the device table is full or the entry's
 * name does not fit it. */
static int host_index(const char *uuid)
{
    char name[VC_REGION_UUID_SIZE];
    int length = snprintf(name, sizeof name, "%s" VC_HOST_SUFFIX, uuid);
    int index = length >= 0 && (size_t)length < sizeof name ? account_index(name) : -1;
    if (index < 0)
        vc_log(VC_LOG_ERROR, "%s gets no host memory: the account's device table is full "
               "or its name is too long", uuid);
    return index;
}

/* The device of these bytes (given: its UUID as the caller had it). */
static const struct vc_device *by_bytes(const unsigned char bytes[16], const char *given)
{
    char name[VC_UUID_LEN];
    if (!listed(vc_limits(), bytes, given, name, sizeof name)) {
        vc_log(VC_LOG_WARN, "%s is not in the limits file's devices: it is refused", given);
        return &refused;
    }
    const struct vc_device *found = NULL;
    pthread_mutex_lock(&vc_local_lock);
    for (unsigned i = 0; i < ndevices && !found; i++)
        if (memcmp(devices[i].bytes, bytes, 16) == 0)
            found = &devices[i];
    if (!found && ndevices < VC_MAX_DEVICES) {
        int index = account_index(name);
        if (index >= 0) {
            struct vc_device *d = &devices[ndevices++];
            d->index = index;
            d->limit = vc_limits()->memory;
            d->device_limit = d->limit - vc_limits()->virtual_memory;
            d->host_index = d->device_limit < d->limit ? host_index(name) : -1;
            memcpy(d->bytes, bytes, 16);
            snprintf(d->uuid, sizeof d->uuid, "%s", name);
            found = d;
        }
    }
    pthread_mutex_unlock(&vc_local_lock);
    if (!found) {
        vc_log(VC_LOG_ERROR, "more than %d devices in one account: %s is refused",
               VC_MAX_DEVICES, name);
        return &refused;
    }
    return found;
}

const struct vc_device *vc_device_by_uuid(const char *uuid)
{
    if (vc_mode() != VC_ON)
        return NULL;
    unsigned char bytes[16];
    if (!vc_uuid_parse(uuid, bytes)) {
        vc_log(VC_LOG_WARN, "device UUID %s not understood: it is refused", uuid);
        return &refused;
    }
    return by_bytes(bytes, uuid);
}

const struct vc_device *vc_device_of(CUdevice dev)
{
    if (vc_mode() != VC_ON)
        return NULL;
    bool cacheable = dev >= 0 && dev < CACHED_ORDINALS;
    const struct vc_device *d = cacheable ? __atomic_load_n(&by_ordinal[dev], __ATOMIC_ACQUIRE) : NULL;
    if (d)
        return d;
    CUuuid raw;
    /* Not cached on failure: before cuInit, say, the answer is not final. */
    if (vc_real_cuDeviceGetUuid_v2(&raw, dev) != CUDA_SUCCESS)
        return NULL;
    char uuid[VC_UUID_LEN];
    vc_uuid_format((const unsigned char *)raw.bytes, uuid, sizeof uuid);
    d = by_bytes((const unsigned char *)raw.bytes, uuid);
    if (cacheable)
        __atomic_store_n(&by_ordinal[dev], d, __ATOMIC_RELEASE);
    vc_log(VC_LOG_DEBUG, "device %d is %s%s", (int)dev, d->uuid, d->index < 0 ? " (refused)" : "");
    return d;
}

const struct vc_device *vc_device_current(void)
{
    CUdevice dev;
    if (vc_mode() != VC_ON || vc_real_cuCtxGetDevice(&dev) != CUDA_SUCCESS)
        return NULL;
    return vc_device_of(dev);
}
