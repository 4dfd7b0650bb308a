/* A kernel's GPU time: the mean of its recent samples near the fastest one seen lately. */
#include "estimate.h"

/* Samples count when within this of the floor: 10%, or 1 us (events' resolution). */
#define NEAR_PERCENT 10
#define NEAR_MIN_NS 1000
/* The floor rises by this much a second while no sample comes below it. */
#define RISE_PERCENT_PER_S 10

void vc_estimate_add(struct vc_estimate *e, int64_t ns, int64_t now)
{
    e->sample[e->next] = ns;
    e->next = (e->next + 1) % VC_ESTIMATE_SAMPLES;
    int64_t age = now - e->floor_at;
    int64_t floor = e->floor + (int64_t)((double)e->floor * RISE_PERCENT_PER_S / 100 * (double)age / 1e9);
    if (e->count++ == 0 || ns <= floor) {
        floor = e->floor = ns;
        e->floor_at = now;
    }
    int64_t near = floor * NEAR_PERCENT / 100;
    int64_t limit = floor + (near > NEAR_MIN_NS ? near : NEAR_MIN_NS);
    unsigned n = e->count < VC_ESTIMATE_SAMPLES ? e->count : VC_ESTIMATE_SAMPLES;
    int64_t sum = 0;
    unsigned kept = 0;
    for (unsigned i = 0; i < n; i++)
        if (e->sample[i] <= limit) {
            sum += e->sample[i];
            kept++;
        }
    /* Every recent sample stretched: the floor is the best guess. */
    e->ns = kept ? sum / kept : floor;
    e->steady = n >= VC_ESTIMATE_SETTLED && 2 * kept > n;
}
