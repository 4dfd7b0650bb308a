/*
 * A kernel's GPU time, from timed launches of it. A launch's events measure
 * its kernel plus whatever else ran on the device between them: kernels of
 * other streams sharing the SMs, other processes' time slices, the device
 * starting up from idle. That only ever adds, and adds a lot, while a
 * kernel's own time varies little from launch to launch. So the estimate
 * starts from the floor, the fastest sample seen lately (it rises slowly, so
 * that a kernel that got slower is followed), and is the mean of the recent
 * samples close to it: stretched samples are left out. A kernel is steady
 * when most of its recent samples are that close: one whose time depends on
 * its arguments (same function and shape, other sizes) is not.
 */
#ifndef VC_ESTIMATE_H
#define VC_ESTIMATE_H

#include <stdbool.h>
#include <stdint.h>

#define VC_ESTIMATE_SAMPLES 16
/* Samples after which a kernel may be steady. */
#define VC_ESTIMATE_SETTLED 4

/* What a launch reads comes first, the samples last: it reads fewer cache lines. */
struct vc_estimate {
    int64_t ns;                            /* the estimate; valid once count > 0 */
    uint32_t count;                        /* samples taken (the ring holds the last ones) */
    bool steady;                           /* most recent samples are close to it */
    uint32_t next;
    int64_t floor, floor_at;               /* the fastest sample lately, and when */
    int64_t sample[VC_ESTIMATE_SAMPLES];   /* the latest samples, ns, in a ring */
};

/* Adds a sample of ns taken at now (ns, any clock) and updates the estimate.
 * False where the sample was held back from lowering the floor. */
bool vc_estimate_add(struct vc_estimate *e, int64_t ns, int64_t now);

#endif
