/*
 * A container's share of a device's time, as a bucket of GPU time that all
 * its processes share through one 64-bit word of the account, updated
 * without a lock. The word holds the moment (CLOCK_MONOTONIC, ns) at which
 * the bucket is level again: each launch pushes it forward by its GPU time
 * divided by the share, wall time catches up with it, and a launch waits
 * while it lies in the future (the generic cell rate algorithm).
 */
#ifndef VC_BUCKET_H
#define VC_BUCKET_H

#include <stdint.h>
#include <time.h>

/* Idle wall time the bucket saves up. A program whose steps leave the device
 * idle for a while (a training step's host work, a sync) spends it in its
 * next busy spell instead of losing it: with 10 ms, training at 60 was
 * charged 56.6-58.3% in some runs and ran 54-58% busy. The share is judged
 * over windows of 1 s or more, and saved-up time adds at most
 * (burst + slack) x share to one: 4.2 points at 99%, inside the 5 allowed. */
#define VC_BUCKET_BURST_NS (40 * 1000 * 1000LL)
/* How far the bucket may run ahead of wall time before a launch waits; a
 * launch that waits waits until it is level again. So launches go in bursts
 * of this much wall time, and most of a burst queues behind its first launch
 * on the device rather than each launch starting it from idle. */
#define VC_BUCKET_SLACK_NS (2 * 1000 * 1000LL)
/* The most debt it holds, in wall time: no launch ever waits longer than this. */
#define VC_BUCKET_DEBT_NS (2 * 1000 * 1000 * 1000LL)

/* The bucket's clock: CLOCK_MONOTONIC in ns, the same in every process. */
static inline int64_t vc_clock_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Wall time (ns) a launch must wait at now before it may go; 0: at once. */
int64_t vc_bucket_wait(const int64_t *bucket, int64_t now);

/* Charges gpu_ns of GPU time (negative: gives it back) to a bucket that
 * fills at percent of wall time. */
void vc_bucket_charge(int64_t *bucket, int64_t now, int64_t gpu_ns, unsigned percent);

#endif
