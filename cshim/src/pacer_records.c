/* Timing records: which launches are timed, alone or in runs, and with which events. */
#define _GNU_SOURCE
#include "pacer_state.h"

#include <pthread.h>

#include "bucket.h"

/* True once in n times, at random: which launches are timed alone must not
 * be foreseeable, or a program could give those its short kernels
 * (xorshift64, seeded by the clock). */
bool pacer_one_in(uint32_t n)
{
    uint64_t x = pacer.draws ? pacer.draws : (uint64_t)vc_clock_ns() | 1;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    pacer.draws = x;
    return x % n == 0;
}

/* The same key for the same stream: the per-thread default stream is a
 * stream of each thread, the legacy stream has two names. */
uint64_t pacer_stream_key(CUstream stream, bool ptsz)
{
    if (stream == CU_STREAM_PER_THREAD || (ptsz && !stream))
        return (uintptr_t)pthread_self() | 2;   /* handles are aligned: never | 2 */
    return !stream || stream == CU_STREAM_LEGACY ? 1 : (uintptr_t)stream;
}

/* Takes a record with the context's events for launch l of kernel k (two
 * with_start, else one); false if there are not enough. */
static bool take_record(struct vc_launch *l, const struct kernel *k, bool with_start, int64_t now)
{
    struct vc_pacer_context *c = l->context;
    if (c->nfree < EVENTS_LOW)
        pthread_cond_signal(&pacer.wake);
    if (c->nfree < 1u + with_start || pacer.tail - pacer.head == RECORDS)
        return false;
    l->record = pacer.tail++;
    /* A reference older than a rebase or two places launches imprecisely. */
    bool placed = c->published >= 0 && now - c->published_at < 3 * REBASE_NS;
    CUevent start = with_start ? c->free[--c->nfree] : NULL;
    pacer.records[l->record % RECORDS] = (struct record){
        .context = c,
        .start = start,
        .end = c->free[--c->nfree],
        .stream = pacer_stream_key(l->stream, l->ptsz),
        .key = l->key,
        .device = l->device,
        .generation = placed ? c->published : -1,
        .charged = l->charged,
        .cap = pacer_cap(k, OVER_PERCENT),
        .estimated = pacer_estimate(k),
        .one_stream = pacer.same_stream >= ONE_STREAM,
        .seq = l->record,
        .state = OPEN,
    };
    return true;
}

/* This thread's open run, if it is still open (lock held). */
struct record *pacer_open_run(void)
{
    struct record *r = &pacer.records[thread_run.seq % RECORDS];
    thread_run.open = thread_run.open && r->seq == thread_run.seq && r->state == OPEN
                      && r->context == thread_run.context;
    return thread_run.open ? r : NULL;
}

/* Whether launch l of kernel k (NULL: unknown), on stream at now, may join
 * this thread's open run: the same context and stream, the run not full, its
 * kernels still queued (else the device may idle inside it) and no other
 * thread's behind them, the kernel's cost known (one not trusted is timed
 * alone, to learn it), and l neither a check nor a launch of a kernel that
 * varies: those are timed alone, start to end (pacer_learn_check). */
bool pacer_joins_run(const struct vc_launch *l, const struct kernel *k, uint64_t stream,
                     int64_t now)
{
    const struct record *r = pacer_open_run();
    return r && k && k->costs >= TRUSTED && !l->check && !k->varies
           && thread_run.context == l->context && thread_run.stream == stream
           && r->launches < RUN && now <= r->drained && !r->overtaken;
}

/* Before a launch of this thread: the run a launch last opened or joined, if
 * another thread's and still open, has this launch behind it. Its
 * end event comes at its own thread's next launch, behind this one's kernel
 * and the device's idle time around it: in PyTorch the main thread's last
 * run of a training step's forward pass spans the whole backward pass,
 * launched by a thread of its own, and the backward thread's last run the
 * optimizer's step and the next forward pass (lock held). */
static void overtake_last_run(void)
{
    /* A thread's launch that does not join its run ends it first: a run
     * still open took its own thread's latest launch. */
    struct record *r = &pacer.records[pacer.last_run % RECORDS];
    bool others = !thread_run.open || thread_run.seq != pacer.last_run;
    if (others && r->seq == pacer.last_run && r->state == OPEN && r->launches)
        r->overtaken = true;
}

/* Opens a run with launch l of kernel k (lock held). */
static void open_run_with(struct vc_launch *l, const struct kernel *k, uint64_t stream,
                          int64_t now)
{
    struct record *r = &pacer.records[l->record % RECORDS];
    r->launches = 1;
    r->cap = pacer_cap(k, RUN_OVER_PERCENT);
    r->drained = now + r->estimated;
    thread_run.open = true;
    thread_run.seq = l->record;
    thread_run.context = l->context;
    thread_run.stream = stream;
    pacer.last_run = l->record;
}

/* Launch l of kernel k, whose estimate is estimate, joins this thread's open
 * run (lock held). */
static void join_run(struct vc_launch *l, const struct kernel *k, int64_t estimate, int64_t now)
{
    struct record *r = &pacer.records[thread_run.seq % RECORDS];
    r->launches++;
    r->charged += l->charged;
    r->cap += pacer_cap(k, RUN_OVER_PERCENT);
    r->estimated += estimate;
    r->mixed = r->mixed || k->key != r->key;
    r->drained = pacer_drains(r->drained, now, estimate);
    l->timed = true;
    l->record = thread_run.seq;
    l->ends = r->launches == RUN;
    pacer.last_run = thread_run.seq;
}

/* Launch l, timed alone by record r, holds its stream (lock held). A small
 * kernel's start event on a stream that ran dry completes as soon as it
 * reaches the idle device, and the kernel only some us later, once its
 * launch call pushed it there (2 us of a 3 us kernel's 5, on an H100): that
 * way would be charged as the kernel's. So its stream waits on the context's
 * flag from before the start event until the call returned and the end
 * event is queued behind it; then start event, kernel and end event run
 * back to back, and time the kernel alone. */
static void take_hold(struct vc_launch *l, struct record *r, int64_t now)
{
    struct vc_pacer_context *c = l->context;
    uint32_t next = c->held + 1;
    pacer_hold(c, next ? next : 1, now);   /* 0 marks a launch that holds nothing */
    l->hold = c->held;
    r->held = true;
}

/* Whether launch l of kernel k is timed, and how; true when it takes a new
 * record. A launch is timed by an event right behind it and, to know when its
 * kernel started, one right before it. But an event between two kernels of a
 * stream costs the device a moment (about 2 us on an H200, a sixth of a 12 us
 * kernel), and a launch timed alone is charged that moment too. So a small
 * kernel goes without the event before it (its start is when the launch before
 * it on its stream ended, or its launch call's return if later); and in a
 * process that launches on one stream, a small kernel whose cost is known opens
 * a run that the launches right after it join (any kernel whose cost is known),
 * up to RUN, timed by one pair of events. A run's start event matters: the
 * device may be running another process's time slice when it begins, and its
 * kernels start only after that. One right behind a full run has none: the full
 * run's end event is its start. A thread that launches slower than its kernels
 * run opens no runs, and times only a sample of its launches (below). Kernels
 * on several streams are all timed, to be on the timeline and count once where
 * they overlap. */
bool pacer_plan_timing(struct vc_launch *l, struct kernel *k, bool waited, int64_t now)
{
    uint64_t stream = pacer_stream_key(l->stream, l->ptsz);
    if (stream != pacer.last_stream)
        pacer.same_stream = 0;
    else if (pacer.same_stream < ONE_STREAM)
        pacer.same_stream++;
    pacer.last_stream = stream;
    bool trusted = k->costs >= TRUSTED, follows = thread_run.filled == stream;
    thread_run.filled = 0;
    bool here = thread_run.launched == stream;
    bool behind = !waited && here && now > thread_run.drained;
    int64_t estimate = pacer_estimate(k);
    thread_run.drained = pacer_drains(here ? thread_run.drained : now, now, estimate);
    thread_run.launched = stream;
    pacer.tally.launches++;
    overtake_last_run();
    if (pacer_joins_run(l, k, stream, now)) {
        join_run(l, k, estimate, now);
        pacer.tally.in_runs++;
        return false;
    }
    bool small = trusted && k->cost < SMALL_NS, one_stream = pacer.same_stream >= ONE_STREAM;
    /* A thread behind its device on one stream times a random sample of its
     * small launches (below), and draws its checks among those. */
    bool sampled = behind && small && one_stream;
    bool alone_now = k->varies || (l->check && !sampled);
    bool runs = small && one_stream && !alone_now;
    /* A thread whose stream ran dry before a launch it did not hold back for
     * the bucket is behind its device: its next launch would not come before
     * a run drained either. So the launch's end event goes right behind it,
     * not at that next launch: by then the program may have queued copies or
     * memsets on the stream (unseen here), and an end event behind them would
     * time the idle gap before them too. */
    bool opens = runs && !behind;
    /* Nor does it need each launch timed: it times one launch in SAMPLE of a
     * kernel, and the others keep their up-front charge, the kernel's estimate
     * (or what its timed launches were charged lately, if lower): its own time,
     * as such a launch finds its stream idle. Not what timed launches were
     * charged, which holds the idle moments inside runs (a thread is behind its
     * device only now and then): an elementwise loop alone on an H100 was
     * charged 8.7 us a launch where NVML counted it busy 8.5-8.6 and unlimited
     * 7.9; charged its estimate, 8.0-8.2 us, it did 5-6% more work at 30 and
     * 60. A timed launch costs its thread three driver calls (hold, start and
     * end event: 6 us in all for a decoding kernel on an H100, where the rest
     * of its pacing takes some 0.4 us) and its device a moment an event, paid
     * in a launch-bound program's speed: one in SAMPLE cost decoding 0.8 us a
     * launch, and one in 32 some 0.1-0.4 us a launch more than one in 128. So
     * once a kernel has KNOWN samples, one in KNOWN_SAMPLE is timed; not
     * before, as what its launches are charged is still being learned then,
     * from a start that can be far too high (records timed before the thread
     * could hold streams time a small kernel's way to the device too). Which
     * ones is drawn at random, and one in CHECK / sample of those is a check,
     * so that a launch after a pause is a check at the odds of any other
     * (pacer_learn_check): a check drawn besides would double what timing
     * costs a launch-bound thread. */
    uint32_t sample = k->estimate.count < KNOWN ? SAMPLE : KNOWN_SAMPLE;
    bool passes = runs && behind && !pacer_one_in(sample);
    l->timed = !passes && take_record(l, k, !small || alone_now || (runs && !follows), now);
    l->ends = !opens;
    pacer.tally.untimed += !l->timed;
    pacer.tally.in_runs += l->timed && opens;
    pacer.tally.alone += l->timed && !opens;
    if (l->timed && opens)
        open_run_with(l, k, stream, now);
    struct record *alone = l->timed && !opens ? &pacer.records[l->record % RECORDS] : NULL;
    /* A check holds its stream too, whatever it follows, to time its kernel
     * alone: the stream may have run dry behind launches left untimed. */
    if (alone && alone->start && small && (behind || l->check) && l->context->holds)
        take_hold(l, alone, now);
    if (alone)
        alone->check = alone_now || !small || (sampled && pacer_one_in(CHECK / sample));
    return l->timed;
}

/* Closes record seq, if still open (lock held): ENDED, or VOID when its timing failed. */
void pacer_close_locked(uint32_t seq, struct vc_pacer_context *context, enum record_state state)
{
    struct record *r = &pacer.records[seq % RECORDS];
    if (r->seq == seq && r->context == context && r->state == OPEN) {
        r->state = state;
        pthread_cond_signal(&pacer.wake);
    }
}
