/* Which devices are limited, known by UUID whatever CUDA_VISIBLE_DEVICES did to ordinals. */
#ifndef VC_DEVICES_H
#define VC_DEVICES_H

#include <stddef.h>
#include <stdint.h>

#include "api.h"
#include "limits_file.h"

struct vc_device {
    int index;                /* in the shared account's device table; -1: refused */
    int host_index;           /* the account's entry of bytes in host memory; -1: none */
    uint64_t limit;           /* bytes, in device and host memory together */
    uint64_t device_limit;    /* of limit, bytes in device memory */
    unsigned char bytes[16];  /* the UUID */
    char uuid[VC_UUID_LEN];   /* as NVML prints it */
};

/* The device with this UUID (GPU-... or MIG-..., any case) under the limits:
 * a limited one, or, for a device that the limits file does not list (or that
 * finds the account's device table full), the refused device: index -1,
 * limit 0, so nothing fits on it, a context there included. NULL only when
 * limits are off. */
const struct vc_device *vc_device_by_uuid(const char *uuid);

/* The same for a CUDA device ordinal of this process (NULL also when the
 * driver cannot tell its UUID). */
const struct vc_device *vc_device_of(CUdevice dev);

/* The same for the device of the calling thread's current context. */
const struct vc_device *vc_device_current(void);

#endif
