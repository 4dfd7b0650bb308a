/* The shared GPU-time bucket: a lock-free generic cell rate algorithm on one word. */
#include "bucket.h"

#include <stdbool.h>

int64_t vc_bucket_wait(const int64_t *bucket, int64_t now)
{
    int64_t level = __atomic_load_n(bucket, __ATOMIC_ACQUIRE);
    return level > now + VC_BUCKET_SLACK_NS ? level - now : 0;
}

void vc_bucket_charge(int64_t *bucket, int64_t now, int64_t gpu_ns, unsigned percent)
{
    int64_t wall = gpu_ns * 100 / (int64_t)(percent ? percent : 1);
    int64_t old = __atomic_load_n(bucket, __ATOMIC_ACQUIRE), level;
    do {
        /* Time left unused beyond the burst is lost; debt is capped, so a
         * corrupt or far-off value heals itself. */
        level = old < now - VC_BUCKET_BURST_NS ? now - VC_BUCKET_BURST_NS : old;
        level += wall;
        if (level < now - VC_BUCKET_BURST_NS)
            level = now - VC_BUCKET_BURST_NS;
        if (level > now + VC_BUCKET_DEBT_NS)
            level = now + VC_BUCKET_DEBT_NS;
    } while (!__atomic_compare_exchange_n(bucket, &old, level, true, __ATOMIC_ACQ_REL,
                                          __ATOMIC_ACQUIRE));
}
