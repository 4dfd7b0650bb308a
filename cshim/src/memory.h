/* Charging allocations and reporting memory, shared by the allocation, context and NVML wrappers. */
#ifndef VC_MEMORY_H
#define VC_MEMORY_H

#include <stdbool.h>
#include <stdint.h>

#include "api.h"
#include "devices.h"

/* n rounded up to a multiple of to: what an allocation of n takes at a granularity. */
#define VC_ROUND_UP(n, to) (((n) + (to) - 1) / (to) * (to))

/* Adds bytes of device memory to d's account when they fit (under its device part and
 * under its limit with what d holds in host memory). */
bool vc_memory_reserve(const struct vc_device *d, uint64_t bytes);

/* Charges bytes on d, first crediting what this process's pools and graphs gave back.
 * CUDA_ERROR_OUT_OF_MEMORY when the container's account has no room. */
CUresult vc_memory_charge(const struct vc_device *d, uint64_t bytes);

/* Re-reads what this process's pools and graphs hold from the driver. */
void vc_memory_refresh(void);

/* Rewrites the driver's figures for d: total becomes the limit (or the device's
 * size if smaller), used the container's use, free what is left of the limit
 * (never more than the device's free, never below 0). The device's figures
 * come from NVML where it answers, else they are the ones given. */
void vc_memory_report(const struct vc_device *d, uint64_t *total, uint64_t *free, uint64_t *used);

#endif
