/* Which devices are limited, known by UUID whatever CUDA_VISIBLE_DEVICES did to ordinals. */
#ifndef VC_DEVICES_H
#define VC_DEVICES_H

#include <stddef.h>
#include <stdint.h>

#include "api.h"
#include "limits_file.h"

struct vc_device {
    int index;                /* in the shared account's device table */
    uint64_t limit;           /* bytes */
    char uuid[VC_UUID_LEN];
};

/* The limited device with this UUID; NULL when limits are off or do not cover it. */
const struct vc_device *vc_device_by_uuid(const char *uuid);

/* The same for a CUDA device ordinal of this process. */
const struct vc_device *vc_device_of(CUdevice dev);

/* The same for the device of the calling thread's current context. */
const struct vc_device *vc_device_current(void);

#endif
