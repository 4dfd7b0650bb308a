/*
 * Stream-ordered allocations (cuMemAllocAsync, pools): a pool's memory counts
 * as what the pool holds from the device (its reserved bytes), read back from
 * the driver, since the pool keeps or returns freed memory on its own schedule.
 */
#ifndef VC_POOLS_H
#define VC_POOLS_H

/* Re-reads every known pool: memory a pool returned to the device is credited. */
void vc_pools_refresh(void);

/* In a forked child: the parent's pools are not ours. */
void vc_pools_forked(void);

#endif
