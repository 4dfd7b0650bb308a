/* NVML as the library reads it for itself: a device's memory, by UUID. */
#ifndef VC_NVML_H
#define VC_NVML_H

#include <stdbool.h>

#include "api.h"

/* The device's memory as NVML reports it (every process on it); false when
 * NVML is missing or does not know the UUID. */
bool vc_nvml_memory(const char *uuid, nvmlMemory_t *memory);

#endif
