/* Each kernel's cost: an estimate per kernel, learned from its timed launches. */
#define _GNU_SOURCE
#include "pacer_state.h"

#include <string.h>

#include "bucket.h"
#include "log.h"

/* A key is kept in the first of the HOME_SPAN entries from its home that is
 * free or its own. Entries are never freed, only taken over, so a key's
 * entries before its own are all taken. A training step launches some 90
 * kernels: kept in its home alone (and homes odd, as a key's lowest bit is
 * always set), a dozen of them took each other's entry at every step (300
 * to 2,200 times in a few seconds on an H100), and each was charged a guess
 * and timed afresh. */
static struct kernel *entry(uint64_t key, unsigned i)
{
    return &pacer.kernels[((key >> 1) + i) % KERNELS];
}

struct kernel *pacer_kernel(uint64_t key)
{
    for (unsigned i = 0; i < HOME_SPAN && entry(key, i)->key; i++)
        if (entry(key, i)->key == key)
            return entry(key, i);
    return NULL;
}

/* Where a new key goes: its first free entry, or, all taken, the least
 * recently launched kernel's, whose launches in flight then find no entry. */
static struct kernel *room_for(uint64_t key)
{
    struct kernel *k = entry(key, 0);
    for (unsigned i = 0; i < HOME_SPAN && k->key; i++)
        if (!entry(key, i)->key || entry(key, i)->launched < k->launched)
            k = entry(key, i);
    return k;
}

struct kernel *pacer_claim_kernel(uint64_t key, int device, int64_t now)
{
    struct kernel *k = pacer_kernel(key);
    if (!k) {
        k = room_for(key);
        memset(k, 0, sizeof *k);
        k->key = key;
        k->device = device;
    }
    k->launched = now;
    return k;
}

/* Kernel k's own GPU time as its timed launches tell it so far: what a
 * launch of it is charged up front, and how long it keeps its stream busy.
 * Its estimate, or what its launches were charged lately if that is lower:
 * an estimate can stay high, learned from a few samples that began behind a
 * launch call (a lazily loaded kernel's first one spends its loading there)
 * while the kernel never queues again to teach a lower one. Not what its
 * launches were charged if that is higher: it may hold idle time, and a run
 * predicted to drain later than it does would take in the device's idle
 * time. */
int64_t pacer_estimate(const struct kernel *k)
{
    if (k->varies)
        return k->checked;
    /* A record that gives a sample also teaches the cost: no sample, no lower figure. */
    return k->estimate.count && k->estimate.ns < k->cost ? k->estimate.ns : k->cost;
}

/* What a launch of kernel k is charged before it is timed. A kernel timed
 * once: no more than one never timed, as that one record may hold its
 * loading (first_costs_median()). */
int64_t pacer_up_front(const struct kernel *k)
{
    if (k->costs > 1)
        return pacer_estimate(k);
    return k->costs && k->cost < pacer.typical_ns ? k->cost : pacer.typical_ns;
}

/* The most a launch of kernel k is charged once timed: a steady kernel,
 * percent over its estimate (what exceeds that ran while another process had
 * the device); one that is not, 4x its estimate. Its own time may vary that
 * much from launch to launch, but beside a busy neighbour most records of a
 * launch-bound program span that one's time slices, which is what makes its
 * kernels unsteady: 2.4 ms slices beside a training step, in records of 6 us
 * decoding kernels on an H100. A kernel that varies, 4x what its launches
 * take on average. A kernel with no sample yet: what was measured. */
int64_t pacer_cap(const struct kernel *k, int64_t percent)
{
    if (k->varies)
        return pacer_over(k->checked, UNSTEADY_OVER_PERCENT);
    if (k->estimate.steady)
        return pacer_over(k->estimate.ns, percent);
    return k->estimate.count ? pacer_over(k->estimate.ns, UNSTEADY_OVER_PERCENT)
                             : INT64_MAX / (2 * RUN);
}

/* Kernel k's cost until it is trusted: the lower median of what its timed
 * launches so far were charged, cost the latest. One can take far longer than
 * the others: a lazily loaded kernel's code is loaded in its first launch
 * call, which returns that late, and its record is charged from its start
 * event (pacer_thread.c). On an H100 a decoding model's first pass had a
 * dozen 3-10 us kernels charged 0.27-3.2 ms so; learned as an average, such
 * a kernel was trusted at 0.18-4.2 ms and each launch charged up to that up
 * front until the average came down: 0.25-0.38 s of charges given back in
 * the first seconds, and a process that used some 20% of the device waited
 * 40-82 times for the bucket at 30 (0.26-0.37 s). */
static int64_t first_costs_median(struct kernel *k, int64_t cost)
{
    unsigned i = k->costs;
    for (; i > 0 && k->first[i - 1] > cost; i--)
        k->first[i] = k->first[i - 1];
    k->first[i] = cost;
    return k->first[k->costs / 2];
}

/* Takes what a timed launch of kernel k was charged into account: the next
 * launches are charged no more than about that much up front. The record
 * that gave the kernel's first sample starts it afresh: those before it told
 * none, as they timed more than the kernel (a small kernel's way to the
 * device, before its stream could be held: 24 us of a 5 us kernel's on the
 * test double, charged to its untimed launches until an eighth a record
 * brought it down). A kernel's lone first record is no guess for others: it
 * may hold its loading. */
void pacer_learn_cost(struct kernel *k, int64_t cost, bool first_sample)
{
    if (first_sample && k->costs < TRUSTED)
        k->costs = 0;
    if (k->costs < TRUSTED)
        k->cost = first_costs_median(k, cost);
    else
        k->cost = first_sample ? cost : k->cost + (cost - k->cost) / 8;
    if (++k->costs > 1)
        pacer.typical_ns = k->cost;
    /* Not at the first launch: it may have waited behind the untimed ones, so
     * for them the lower of the cost and the estimate (which leaves waits out). */
    if (k->costs == TRUSTED) {
        int64_t each = pacer_up_front(k);
        vc_log(VC_LOG_DEBUG, "kernel %016llx costs %lld ns", (unsigned long long)k->key,
               (long long)each);
        pacer_charge(k->device, vc_clock_ns(), each * k->untimed_guesses - k->untimed_guess_ns);
        k->untimed_guesses = 0;
        k->untimed_guess_ns = 0;
    }
}

/* A launch of kernel k, chosen at random and timed alone from its start to
 * its end, took each. The caps above, and what an untimed launch or a run
 * that ends late is charged, rest on the estimate, near the kernel's fastest
 * launches: right where a kernel takes about the same time at every launch.
 * But one kernel of one shape can take 16x as long at one launch as at the
 * next (a GEMM as its inner dimension says, a kernel that loops as its
 * argument says); charged so, a process at 30 that launched such a kernel
 * from one thread, or from two in turns, ran 58-94% busy on an H100. A
 * kernel whose launches take on average far more than its estimate varies:
 * each of its launches is timed alone and, away from a busy neighbour,
 * charged all it took (an average charged to untimed launches would not do:
 * a program could launch the long ones after a pause, when a thread's
 * launches go untimed). Its estimate is then that average. */
void pacer_learn_check(struct kernel *k, int64_t each)
{
    /* From the estimate: the first check weighs no more than the next. Some
     * 2,000 launches either way: one drawn in CHECK, or all. */
    int64_t was = k->checked ? k->checked : k->estimate.ns;
    k->checked = was + (each - was) / (k->varies ? VARYING_WEIGHT : CHECK_WEIGHT);
    bool varies = k->checked > pacer_over(k->estimate.ns, VARYING_PERCENT) + VARYING_SLACK_NS;
    if (varies != k->varies)
        vc_log(VC_LOG_DEBUG, "kernel %016llx %s: its launches take %lld ns, its estimate %lld",
               (unsigned long long)k->key, varies ? "varies" : "is steady again",
               (long long)k->checked, (long long)k->estimate.ns);
    k->varies = varies;
}

/* The untimed launch l of a kernel not trusted yet is corrected once it is. */
void pacer_remember_guess(const struct vc_launch *l)
{
    struct kernel *k = pacer_kernel(l->key);
    if (l->guessed && k) {
        k->untimed_guesses++;
        k->untimed_guess_ns += l->charged;
    }
}
