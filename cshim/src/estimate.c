/* A kernel's GPU time: the mean of its recent samples near the fastest one seen lately. */
#include "estimate.h"

/* Samples count when within this of the floor: 10%, or 1 us (events' resolution). */
#define NEAR_PERCENT 10
#define NEAR_MIN_NS 1000
/* The floor rises by this much a second while no sample comes below it. */
#define RISE_PERCENT_PER_S 10
/* Recent samples near the fastest one that make the floor hard to lower, and
 * those that must then lie near a sample far under it for it to lower it. */
#define BACKING 4
#define AGREEING 2

/* How far from ns a sample counts as near it. */
static int64_t near(int64_t ns)
{
    int64_t part = ns * NEAR_PERCENT / 100;
    return part > NEAR_MIN_NS ? part : NEAR_MIN_NS;
}

/* The samples among the first n of the ring, the newest left out, that lie near ns. */
static unsigned near_count(const struct vc_estimate *e, unsigned n, int64_t ns)
{
    unsigned newest = (e->next + VC_ESTIMATE_SAMPLES - 1) % VC_ESTIMATE_SAMPLES, count = 0;
    int64_t margin = near(ns);
    for (unsigned i = 0; i < n; i++)
        count += i != newest && e->sample[i] >= ns - margin && e->sample[i] <= ns + margin;
    return count;
}

bool vc_estimate_add(struct vc_estimate *e, int64_t ns, int64_t now)
{
    e->sample[e->next] = ns;
    e->next = (e->next + 1) % VC_ESTIMATE_SAMPLES;
    unsigned n = e->count < VC_ESTIMATE_SAMPLES ? e->count + 1 : VC_ESTIMATE_SAMPLES;
    int64_t age = now - e->floor_at;
    int64_t floor = e->floor + (int64_t)((double)e->floor * RISE_PERCENT_PER_S / 100 * (double)age / 1e9);
    /* A sample far under the fastest one seen lately, where BACKING recent
     * samples lie near that one, lowers the floor only once AGREEING recent
     * ones lie near it. A record cut short, part of its own kernel's time
     * taken for another process's slice, would otherwise set the floor and
     * the estimate with it: beside a decoding process on an H100 a 1.39 ms
     * matmul's floor fell to 0.24 ms, and a kernel not steady is charged at
     * most 4 times its estimate, 0.96 ms a launch for that matmul until the
     * floor rose back. The test is against the fastest sample, not the risen
     * floor: a kernel timed alone again after a spell of stretched samples
     * is back at its own time, and stretched samples may lie near the risen
     * floor. A floor few samples lie near (among samples mostly stretched a
     * kernel's own time is seldom seen twice) is lowered at once. The mean
     * is taken as ever: a sample held back is in it while in the ring. */
    bool agreed = e->count == 0 || ns >= e->floor - near(e->floor)
                  || near_count(e, n, e->floor) < BACKING || near_count(e, n, ns) >= AGREEING;
    if (e->count++ == 0 || (ns <= floor && agreed)) {
        floor = e->floor = ns;
        e->floor_at = now;
    }
    int64_t limit = floor + near(floor);
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
    return agreed;
}
