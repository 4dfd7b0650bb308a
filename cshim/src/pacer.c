/* Paces kernel launches against the container's GPU-time bucket and times each of them. */
#define _GNU_SOURCE
#include "pacer.h"

#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bucket.h"
#include "devices.h"
#include "driver.h"
#include "estimate.h"
#include "log.h"
#include "setup.h"

#define MAX_CONTEXTS 8
#define KERNELS 1024            /* estimates kept, direct-mapped by key */
#define RECORDS 1024            /* timed launches not read yet, in launch order */
#define EVENTS 1024             /* per context: one per record */
#define EVENTS_LOW 64           /* the thread adds events to a context below this */
#define EVENTS_BATCH 256
#define REFS 4                  /* reference events per context, by generation */
#define LANES 64                /* streams whose last launch end a context remembers */
#define REBASE_NS 500000000LL   /* a new reference this often: float ms stay exact to 0.1 us */
#define REF_SLOP_NS 30000       /* a reference must complete this soon to place launches */
#define BATCH 256               /* records the thread reads at a time */
#define FIRST_GUESS_NS 100000   /* charged for a kernel never measured, before any other was */
#define SETTLED 4               /* timed launches after which a kernel's cost is trusted */
#define SMALL_NS 200000         /* a kernel shorter than this is timed in runs */
#define ONE_STREAM 64           /* ... when the process's last launches all went to one stream */
#define RUN 32                  /* the most launches a run times with one pair of events */
#define RUN_STALE_NS 20000000   /* a run this long past its projected end is given up */
#define OVER_PERCENT 25         /* a launch is charged at most this much over its estimate */
#define RUN_OVER_PERCENT 10     /* ... in a run, whose mean time strays less than one's */
#define TICK_NS 1000000         /* the thread reads completed events this often */
#define NAP_NS 20000000         /* a waiting launch looks at the bucket again this often */
#define REPORT_NS 1000000000LL  /* the thread logs each device's share this often (info) */

/* A reference event on the context's own stream, idle so it completes as soon
 * as it is recorded: a point of the context's timeline, and of the clock. */
struct ref {
    CUevent event;
    int64_t offset;             /* ns from the first reference */
    int64_t recorded;           /* vc_clock_ns() once it was seen complete */
};

/* A stream, as the thread saw it last. */
struct lane {
    uint64_t stream;            /* stream_key(); 0: none */
    int64_t end;                /* where its last timed launch ended on the timeline */
};

struct vc_pacer_context {
    CUcontext ctx;              /* NULL: a free entry */
    CUdevice ordinal;
    int device;                 /* in the account; -1: a device without limits */
    unsigned created, nfree;
    int64_t published;          /* the newest complete reference; -1: none yet */
    int64_t published_at;       /* when it was recorded */
    /* The thread's own, touched without the lock while it reads: */
    CUstream own;               /* a non-blocking stream for the references */
    bool broken;                /* no stream or references: no timeline */
    struct ref refs[REFS];
    int64_t complete;           /* the newest reference; -1: none yet */
    int64_t recorded_at;        /* when it was recorded */
    int64_t covered;            /* the context is known busy up to here on its timeline */
    struct lane lanes[LANES];
    CUevent free[EVENTS];
};

struct kernel {
    uint64_t key;               /* 0: a free entry */
    int device;
    uint32_t untimed_guesses;   /* launches charged a guess and not timed: corrected */
    int64_t untimed_guess_ns;   /* once the cost is settled */
    uint32_t costs;             /* timed launches charged */
    int64_t cost;               /* what they were charged, lately (a moving average) */
    struct vc_estimate estimate;
};

enum record_state { OPEN, ENDED, VOID };

/* The timing of one launch, or of a run: launches in a row on one stream,
 * timed together. */
struct record {
    struct vc_pacer_context *context;   /* NULL: its context is gone */
    CUevent start;              /* NULL, or recorded right before the (first) launch */
    CUevent end;                /* recorded right after the (last) launch */
    uint64_t stream;            /* stream_key() of its stream */
    uint64_t key;
    int device;
    int64_t generation;         /* the reference it is placed against; -1: none */
    int64_t charged;            /* what its launches were charged up front */
    int64_t launching;          /* vc_clock_ns() when the (first) launch call began */
    int64_t cap;                /* the most it is charged: a little over the estimates */
    uint32_t seq;               /* its number: a run's owner knows it by it */
    uint32_t launches;          /* it times; 0: a single launch, not a run */
    bool mixed;                 /* a run of several kernels: no one kernel's time */
    int64_t drained;            /* a run: when its launches' kernels should be done (clock) */
    enum record_state state;
};

/* The run this thread is adding its launches to, if open; and the stream
 * whose run its last launch filled and ended, if any. */
static __thread struct {
    bool open;
    uint32_t seq;
    struct vc_pacer_context *context;
    uint64_t stream;
    uint64_t filled;
} run;

/* What the thread read of one record, outside the lock: where on the
 * context's timeline its launch call began, its start event (if any) and
 * its end event completed. */
struct reading {
    bool complete, placed;
    int64_t launching, start, end;
};

/* Guarded by lock, which is never held across a driver call. */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wake = PTHREAD_COND_INITIALIZER;     /* work for the thread */
static pthread_cond_t settled = PTHREAD_COND_INITIALIZER;  /* the thread stopped reading */
static struct vc_pacer_context contexts[MAX_CONTEXTS];
static struct kernel kernels[KERNELS];
static struct record records[RECORDS];
static uint32_t head, tail;     /* records head..tail-1 are in use, in launch order */
static bool started, stopping, reading;
static bool forgot;              /* a context went: the thread's current one may be gone */
static int64_t typical_ns = FIRST_GUESS_NS;   /* the guess for a kernel not settled yet */
static uint64_t last_stream;    /* stream_key() of the process's last launch */
static uint32_t same_stream;    /* launches in a row on it */
static uint64_t last_gpu_ns[VC_MAX_DEVICES];
static unsigned measured;       /* launches read since the last report */

/* ---- the bucket ---- */

static void nap(int64_t ns)
{
    struct timespec ts = {ns / 1000000000, ns % 1000000000};
    nanosleep(&ts, NULL);
}

static void charge(int device, int64_t gpu_ns)
{
    struct vc_region *r = vc_region();
    vc_bucket_charge(&r->bucket[device], vc_clock_ns(), gpu_ns, vc_limits()->cores);
    __atomic_add_fetch(&r->gpu_ns[device], (uint64_t)gpu_ns, __ATOMIC_RELAXED);
}

/* Waits, holding no lock, until the device's bucket lets a launch through. */
static void wait_for(int device)
{
    int64_t *bucket = &vc_region()->bucket[device];
    int64_t wait;
    while ((wait = vc_bucket_wait(bucket, vc_clock_ns())) > 0)
        /* Other launches and corrections move the bucket meanwhile: look again now and then. */
        nap(wait < NAP_NS ? wait : NAP_NS);
}

/* ---- contexts, kernels and records (lock held) ---- */

static struct vc_pacer_context *find_context(CUcontext ctx)
{
    for (int i = 0; i < MAX_CONTEXTS; i++)
        if (contexts[i].ctx == ctx)
            return &contexts[i];
    return NULL;
}

static struct kernel *kernel_of(uint64_t key)
{
    struct kernel *k = &kernels[key % KERNELS];
    return k->key == key ? k : NULL;
}

static struct kernel *claim_kernel(uint64_t key, int device)
{
    struct kernel *k = &kernels[key % KERNELS];
    if (k->key != key) {
        /* Another kernel's estimate makes room; its launches in flight find no entry. */
        memset(k, 0, sizeof *k);
        k->key = key;
        k->device = device;
    }
    return k;
}

/* The same key for the same stream: the per-thread default stream is a
 * stream of each thread, the legacy stream has two names. */
static uint64_t stream_key(CUstream stream, bool ptsz)
{
    if (stream == CU_STREAM_PER_THREAD || (ptsz && !stream))
        return (uintptr_t)pthread_self() | 2;   /* handles are aligned: never | 2 */
    return !stream || stream == CU_STREAM_LEGACY ? 1 : (uintptr_t)stream;
}

/* The most a launch of kernel k is charged once timed: a steady kernel,
 * percent over its estimate (what exceeds that ran while another process had
 * the device); any other, what was measured. */
static int64_t cap_of(const struct kernel *k, int64_t percent)
{
    return k->estimate.steady ? k->estimate.ns + k->estimate.ns * percent / 100
                              : INT64_MAX / (2 * RUN);
}

/* Takes a record with the context's events for launch l of kernel k (two
 * with_start, else one); false if there are not enough. */
static bool take_record(struct vc_launch *l, const struct kernel *k, bool with_start, int64_t now)
{
    struct vc_pacer_context *c = l->context;
    if (c->nfree < EVENTS_LOW)
        pthread_cond_signal(&wake);
    if (c->nfree < 1u + with_start || tail - head == RECORDS)
        return false;
    l->record = tail++;
    /* A reference older than a rebase or two places launches imprecisely. */
    bool placed = c->published >= 0 && now - c->published_at < 3 * REBASE_NS;
    CUevent start = with_start ? c->free[--c->nfree] : NULL;
    records[l->record % RECORDS] = (struct record){
        c, start, c->free[--c->nfree], stream_key(l->stream, l->ptsz), l->key, l->device,
        placed ? c->published : -1, l->charged, 0, cap_of(k, OVER_PERCENT), l->record, 0, false, 0,
        OPEN};
    return true;
}

/* This thread's open run, if it is still open (lock held). */
static struct record *open_run(void)
{
    struct record *r = &records[run.seq % RECORDS];
    run.open = run.open && r->seq == run.seq && r->state == OPEN && r->context == run.context;
    return run.open ? r : NULL;
}

/* Whether launch l, on stream at now, of a kernel whose cost is settled or
 * not, may join this thread's open run: the same context and stream, the run
 * not full, its kernels still queued (else the device may idle inside it),
 * and the kernel's cost known (one not settled is timed alone, to learn it). */
static bool joins_run(const struct vc_launch *l, bool settled, uint64_t stream, int64_t now)
{
    const struct record *r = open_run();
    return r && settled && run.context == l->context && run.stream == stream
           && r->launches < RUN && now <= r->drained;
}

/* Opens a run with launch l of kernel k (lock held). */
static void open_run_with(struct vc_launch *l, const struct kernel *k, uint64_t stream,
                          int64_t now)
{
    struct record *r = &records[l->record % RECORDS];
    r->launches = 1;
    r->cap = cap_of(k, RUN_OVER_PERCENT);
    r->drained = now + l->charged;
    run.open = true;
    run.seq = l->record;
    run.context = l->context;
    run.stream = stream;
}

/* Launch l of kernel k joins this thread's open run (lock held). */
static void join_run(struct vc_launch *l, const struct kernel *k, int64_t now)
{
    struct record *r = &records[run.seq % RECORDS];
    r->launches++;
    r->charged += l->charged;
    r->cap += cap_of(k, RUN_OVER_PERCENT);
    r->mixed = r->mixed || k->key != r->key;
    r->drained = (r->drained > now ? r->drained : now) + l->charged;
    l->timed = true;
    l->record = run.seq;
    l->ends = r->launches == RUN;
}

/* Whether launch l of kernel k is timed, and how; true when it takes a new
 * record. A launch is timed by an event right behind it and, to know when
 * its kernel started, one right before it. But an event between two kernels
 * of a stream costs the device a moment (about 2 us on an H200, a sixth of a
 * 12 us kernel), and a launch timed alone is charged that moment too. So a
 * small kernel goes without the event before it (its start is when the
 * launch before it on its stream ended, or its launch call if later); and in
 * a process that launches on one stream, a small kernel whose cost is known
 * opens a run that the launches right after it join (any kernel whose cost
 * is known), up to RUN, timed by one pair of events. A run's start event
 * matters: the device may be running another process's time slice when it
 * begins, and its kernels start only after that. One right behind a full run
 * has none: the full run's end event is its start. Kernels on several
 * streams are all timed, to be on the timeline and count once where they
 * overlap. */
static bool plan_timing(struct vc_launch *l, struct kernel *k, int64_t now)
{
    uint64_t stream = stream_key(l->stream, l->ptsz);
    if (stream != last_stream)
        same_stream = 0;
    else if (same_stream < ONE_STREAM)
        same_stream++;
    last_stream = stream;
    bool settled = k->costs >= SETTLED, follows = run.filled == stream;
    run.filled = 0;
    if (joins_run(l, settled, stream, now)) {
        join_run(l, k, now);
        return false;
    }
    bool small = settled && k->cost < SMALL_NS;
    bool runs = small && same_stream >= ONE_STREAM;
    l->timed = take_record(l, k, !small || (runs && !follows), now);
    l->ends = !runs;
    if (l->timed && runs)
        open_run_with(l, k, stream, now);
    return l->timed;
}

/* The untimed launch l of a kernel not settled yet is corrected when it settles. */
static void remember_guess(const struct vc_launch *l)
{
    struct kernel *k = kernel_of(l->key);
    if (l->guessed && k) {
        k->untimed_guesses++;
        k->untimed_guess_ns += l->charged;
    }
}

/* ---- the thread that reads the events ---- */

/* Takes what a timed launch of kernel k was charged into account: the next
 * launches are charged about that much up front. */
static void learn_cost(struct kernel *k, int64_t cost)
{
    k->cost = k->costs++ ? k->cost + (cost - k->cost) / 8 : cost;
    typical_ns = k->cost;
    /* Not at the first launch: it may have waited behind the untimed ones, so
     * for them the lower of the cost and the estimate (which leaves waits out). */
    if (k->costs == SETTLED) {
        int64_t each = k->cost < k->estimate.ns ? k->cost : k->estimate.ns;
        vc_log(VC_LOG_DEBUG, "kernel %016llx costs %lld ns", (unsigned long long)k->key,
               (long long)each);
        charge(k->device, each * k->untimed_guesses - k->untimed_guess_ns);
        k->untimed_guesses = 0;
        k->untimed_guess_ns = 0;
    }
}

/* Charges what record r (a launch or a run) really cost. Its kernels started
 * when its start event completed, or else the launch before it on its stream
 * ended, or when its (first) launch call began if that was later: its time
 * is from then to its end event. It is charged the busy time it added to its
 * context (the union over its streams), at most its cap (a little over the
 * estimates of steady kernels): what exceeds that ran while another process
 * had the device. */
static void settle(struct record *r, const struct reading *m)
{
    struct vc_pacer_context *c = r->context;
    struct kernel *k = kernel_of(r->key);
    struct lane *lane = &c->lanes[r->stream % LANES];
    int64_t start = m->launching;
    if (m->start > start)
        start = m->start;
    else if (m->start < 0 && lane->stream == r->stream && lane->end > start)
        start = lane->end;
    *lane = (struct lane){r->stream, m->end};
    int64_t from = start > c->covered ? start : c->covered;
    int64_t cost = m->end > from ? m->end - from : 0;
    int64_t launches = r->launches ? r->launches : 1;
    if (m->end > c->covered)
        c->covered = m->end;
    cost = cost < r->cap ? cost : r->cap;
    /* A run of several kernels tells no one kernel's time: it only corrects the bucket. */
    if (k && !r->mixed && m->end > start)
        vc_estimate_add(&k->estimate, (m->end - start) / launches, vc_clock_ns());
    if (k && !r->mixed)
        learn_cost(k, cost / launches);
    charge(r->device, cost - r->charged);
    measured++;
}

/* The context that needs the thread's help: a stream, references or events. */
static struct vc_pacer_context *needy_context(void)
{
    for (int i = 0; i < MAX_CONTEXTS; i++) {
        struct vc_pacer_context *c = &contexts[i];
        if (c->ctx && c->device >= 0
            && ((!c->own && !c->broken) || (c->nfree < EVENTS_LOW && c->created < EVENTS)))
            return c;
    }
    return NULL;
}

static bool set_current(CUcontext ctx, CUcontext *current)
{
    if (ctx == *current)
        return true;
    if (vc_real_cuCtxSetCurrent(ctx) != CUDA_SUCCESS)
        return false;
    *current = ctx;
    return true;
}

/* Outside the lock: the context's own stream and references, then up to
 * want events into made. */
static unsigned equip(struct vc_pacer_context *c, CUcontext *current, CUevent *made,
                      unsigned want)
{
    if (!set_current(c->ctx, current))
        return 0;
    if (!c->own && !c->broken) {
        c->broken = vc_real_cuStreamCreate(&c->own, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS;
        for (int i = 0; i < REFS && !c->broken; i++)
            c->broken = vc_real_cuEventCreate(&c->refs[i].event, CU_EVENT_DEFAULT) != CUDA_SUCCESS;
        c->complete = -1;
        if (c->broken)
            vc_log(VC_LOG_WARN, "no stream or events for the timeline of a context: its "
                   "launches are charged without it");
    }
    unsigned n = 0;
    while (n < want && vc_real_cuEventCreate(&made[n], CU_EVENT_DEFAULT) == CUDA_SUCCESS)
        n++;
    return n;
}

/* Outside the lock: records a new reference when the last one is old. It
 * goes on the context's own stream, idle, so it completes at once; the thread
 * waits for that and reads the clock then, which places launches a little
 * early on the timeline: their kernels are charged a little more, never less.
 * One that takes long to complete could not place them closely: it is tried
 * again next round. */
static void advance_references(struct vc_pacer_context *c, CUcontext *current, int64_t now)
{
    if (!c->own || c->broken || (c->complete >= 0 && now - c->recorded_at < REBASE_NS)
        || !set_current(c->ctx, current))
        return;
    struct ref *last = c->complete >= 0 ? &c->refs[c->complete % REFS] : NULL;
    struct ref *next = &c->refs[(c->complete + 1) % REFS];
    int64_t before = vc_clock_ns(), done;
    if (vc_real_cuEventRecord(next->event, c->own) != CUDA_SUCCESS)
        return;
    CUresult q;
    do {
        q = vc_real_cuEventQuery(next->event);
        done = vc_clock_ns();
    } while (q == CUDA_ERROR_NOT_READY && done - before <= REF_SLOP_NS);
    float ms = 0;
    if (q != CUDA_SUCCESS || done - before > REF_SLOP_NS
        || (last && vc_real_cuEventElapsedTime(&ms, last->event, next->event) != CUDA_SUCCESS))
        return;
    next->recorded = done;
    next->offset = last ? last->offset + (int64_t)((double)ms * 1e6) : 0;
    c->complete++;
    c->recorded_at = now;
}

/* ns from ref to event, or -1. */
static int64_t since(CUevent ref, CUevent event)
{
    float ms;
    if (vc_real_cuEventElapsedTime(&ms, ref, event) != CUDA_SUCCESS || ms < 0)
        return -1;
    return (int64_t)((double)ms * 1e6);
}

/* Outside the lock: where record r's launch lies on its context's timeline,
 * once complete; its reference maps the clock onto the timeline. */
static void read_record(const struct record *r, struct reading *m, CUcontext *current)
{
    *m = (struct reading){false, false, -1, -1, -1};
    struct vc_pacer_context *c = r->context;
    if (!set_current(c->ctx, current))
        return;
    CUresult q = vc_real_cuEventQuery(r->end);
    if (q == CUDA_ERROR_NOT_READY)
        return;
    m->complete = true;
    /* Its reference is still there if no more than REFS - 1 newer ones were recorded. */
    if (q != CUDA_SUCCESS || r->generation < 0 || c->complete - r->generation >= REFS - 1)
        return;
    const struct ref *ref = &c->refs[r->generation % REFS];
    int64_t end = since(ref->event, r->end), start = r->start ? since(ref->event, r->start) : -1;
    if (end >= 0 && (!r->start || start >= 0)) {
        m->placed = true;
        m->launching = ref->offset + (r->launching - ref->recorded);
        m->start = r->start ? ref->offset + start : -1;
        m->end = ref->offset + end;
    }
}

/* Logs each device's share charged to the container (info level). */
static void report(int64_t now, int64_t *last)
{
    if (now - *last < REPORT_NS)
        return;
    struct vc_region *r = vc_region();
    bool done[VC_MAX_DEVICES] = {false};
    for (int i = 0; i < MAX_CONTEXTS; i++) {
        int dev = contexts[i].device;
        if (!contexts[i].ctx || dev < 0 || done[dev])
            continue;
        done[dev] = true;
        uint64_t total = __atomic_load_n(&r->gpu_ns[dev], __ATOMIC_RELAXED);
        if (last_gpu_ns[dev])
            vc_log(VC_LOG_INFO, "%s: %.1f%% of the device's time charged to the container over "
                   "%.2f s; %u launches read here", r->uuid[dev],
                   100.0 * (double)(int64_t)(total - last_gpu_ns[dev]) / (double)(now - *last),
                   (double)(now - *last) / 1e9, measured);
        last_gpu_ns[dev] = total;
    }
    measured = 0;
    *last = now;
}

/* A run whose kernels should long be done: its thread stopped launching (it
 * may have gone). It is given up, not to hold up the records behind it. */
static bool stale(const struct record *r, int64_t now)
{
    return r->state == OPEN && r->launches && now > r->drained + RUN_STALE_NS;
}

/* A run open at the head keeps the thread looking, to give it up when stale. */
static bool has_work(void)
{
    return needy_context()
           || (head != tail && (records[head % RECORDS].state != OPEN
                                || records[head % RECORDS].launches));
}

/* One round of the thread: equips a needy context, moves references on,
 * reads completed launches in launch order, charges them. Called with the
 * lock held; drops it while it calls the driver. */
static void read_round(CUcontext *current)
{
    static struct reading readings[BATCH];
    static CUevent made[EVENTS_BATCH];
    struct vc_pacer_context *needy = needy_context();
    unsigned want = needy && needy->created < EVENTS ? EVENTS - needy->created : 0;
    struct vc_pacer_context *live[MAX_CONTEXTS];
    int nlive = 0;
    for (int i = 0; i < MAX_CONTEXTS; i++)
        if (contexts[i].ctx && contexts[i].device >= 0)
            live[nlive++] = &contexts[i];
    if (forgot)
        *current = NULL;
    forgot = false;
    uint32_t first = head, n = 0;
    int64_t began = vc_clock_ns();
    for (; n < BATCH && first + n != tail; n++) {
        struct record *r = &records[(first + n) % RECORDS];
        if (stale(r, began))
            r->state = VOID;
        if (r->state == OPEN)
            break;
    }
    reading = true;
    pthread_mutex_unlock(&lock);

    unsigned nmade = needy ? equip(needy, current, made, want < EVENTS_BATCH ? want : EVENTS_BATCH)
                           : 0;
    int64_t now = vc_clock_ns();
    for (int i = 0; i < nlive; i++)
        advance_references(live[i], current, now);
    uint32_t done = 0;
    for (; done < n; done++) {
        const struct record *r = &records[(first + done) % RECORDS];
        if (r->state == VOID || !r->context)
            continue;
        read_record(r, &readings[done], current);
        if (!readings[done].complete)
            break;
    }

    pthread_mutex_lock(&lock);
    reading = false;
    pthread_cond_broadcast(&settled);
    if (needy) {
        /* A context that gives no more events is not asked again. */
        needy->created = nmade ? needy->created + nmade : EVENTS;
        for (unsigned i = 0; i < nmade; i++)
            needy->free[needy->nfree++] = made[i];
    }
    for (int i = 0; i < MAX_CONTEXTS; i++)
        if (contexts[i].ctx && contexts[i].complete > contexts[i].published) {
            contexts[i].published = contexts[i].complete;
            contexts[i].published_at = contexts[i].recorded_at;
        }
    for (uint32_t i = 0; i < done; i++) {
        struct record *r = &records[(first + i) % RECORDS];
        if (r->state == ENDED && r->context && readings[i].placed)
            settle(r, &readings[i]);
        if (r->context) {
            r->context->free[r->context->nfree++] = r->end;
            if (r->start)
                r->context->free[r->context->nfree++] = r->start;
        }
    }
    head = first + done;
}

static void *pacer_main(void *unused)
{
    (void)unused;
    /* Reading events while another thread captures a graph in the global mode
     * must not invalidate its capture. */
    CUstreamCaptureMode relaxed = CU_STREAM_CAPTURE_MODE_RELAXED;
    vc_real_cuThreadExchangeStreamCaptureMode(&relaxed);
    CUcontext current = NULL;
    int64_t last_report = vc_clock_ns();
    pthread_mutex_lock(&lock);
    while (!stopping) {
        if (!has_work()) {
            pthread_cond_wait(&wake, &lock);
            continue;
        }
        read_round(&current);
        report(vc_clock_ns(), &last_report);
        pthread_mutex_unlock(&lock);
        nap(TICK_NS);
        pthread_mutex_lock(&lock);
    }
    pthread_mutex_unlock(&lock);
    return NULL;
}

/* At exit, before the CUDA runtime tears the driver down, the thread stops
 * calling it. */
static void stop_at_exit(void)
{
    pthread_mutex_lock(&lock);
    stopping = true;
    pthread_cond_signal(&wake);
    while (reading)
        pthread_cond_wait(&settled, &lock);
    pthread_mutex_unlock(&lock);
}

static void register_exit(void) { atexit(stop_at_exit); }

static void start_thread(void)
{
    static pthread_once_t exit_once = PTHREAD_ONCE_INIT;
    if (started)
        return;
    started = true;
    pthread_once(&exit_once, register_exit);
    /* Signals stay with the program's own threads. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pthread_t thread;
    int rc = pthread_create(&thread, NULL, pacer_main, NULL);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        vc_log(VC_LOG_ERROR, "cannot start the pacing thread: launches are charged estimates "
               "that are never measured");
        return;
    }
    pthread_setname_np(thread, "vcuda-pacer");
    pthread_detach(thread);
}

/* ---- launches ---- */

/* The entry of ctx, the current context, added if new; NULL when all are taken. */
static struct vc_pacer_context *add_context(CUcontext ctx)
{
    CUdevice ordinal;
    if (vc_real_cuCtxGetDevice(&ordinal) != CUDA_SUCCESS)
        return NULL;
    const struct vc_device *d = vc_device_of(ordinal);
    pthread_mutex_lock(&lock);
    struct vc_pacer_context *c = find_context(ctx);
    if (!c && (c = find_context(NULL))) {
        memset(c, 0, offsetof(struct vc_pacer_context, free));
        c->ctx = ctx;
        c->ordinal = ordinal;
        c->device = d ? d->index : -1;
        c->published = -1;
        pthread_cond_signal(&wake);
    }
    pthread_mutex_unlock(&lock);
    if (!c)
        vc_log(VC_LOG_WARN, "more than %d contexts: launches in the others are not paced",
               MAX_CONTEXTS);
    return c;
}

static CUresult record_event(CUevent event, const struct vc_launch *l)
{
    return l->ptsz ? vc_real_cuEventRecord_ptsz(event, l->stream)
                   : vc_real_cuEventRecord(event, l->stream);
}

/* Closes record seq, if still open (lock held): ENDED, or VOID when its timing failed. */
static void close_locked(uint32_t seq, struct vc_pacer_context *context, enum record_state state)
{
    struct record *r = &records[seq % RECORDS];
    if (r->seq == seq && r->context == context && r->state == OPEN) {
        r->state = state;
        pthread_cond_signal(&wake);
    }
}

/* Closes launch l's record (or run). */
static void close_record(struct vc_launch *l, enum record_state state)
{
    pthread_mutex_lock(&lock);
    close_locked(l->record, l->context, state);
    if (state == VOID)
        remember_guess(l);
    pthread_mutex_unlock(&lock);
}

/* Before launch l, which waits for the bucket if waits: ends this thread's
 * open run unless l joins it. A run waiting or done would time an idle
 * device. On l's stream its end event is recorded now, right behind its last
 * launch; a run on another stream (which may be gone by now) is given up: its
 * launches keep what they were charged up front. */
static void end_run_before(const struct vc_launch *l, bool waits)
{
    if (!run.open)
        return;
    uint64_t stream = stream_key(l->stream, l->ptsz);
    pthread_mutex_lock(&lock);
    struct record *r = open_run();
    const struct kernel *k = kernel_of(l->key);
    bool here = r && run.context == l->context && run.stream == stream;
    bool keep = here && !waits && joins_run(l, k && k->costs >= SETTLED, stream, vc_clock_ns());
    if (r && !here)
        close_locked(run.seq, run.context, VOID);
    CUevent end = here && !keep ? r->end : NULL;
    uint32_t seq = run.seq;
    run.open = keep;
    pthread_mutex_unlock(&lock);
    if (!end)
        return;
    enum record_state state = record_event(end, l) == CUDA_SUCCESS ? ENDED : VOID;
    pthread_mutex_lock(&lock);
    close_locked(seq, l->context, state);
    pthread_mutex_unlock(&lock);
}

bool vc_pacer_begin(struct vc_launch *l, CUstream stream, bool ptsz, uint64_t key)
{
    if (!vc_pacing())
        return false;
    /* A launch into a capturing stream is recorded in a graph, not run: the
     * graph's launches are paced instead. */
    CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
    CUresult r = ptsz ? vc_real_cuStreamIsCapturing_ptsz(stream, &status)
                      : vc_real_cuStreamIsCapturing(stream, &status);
    CUcontext ctx = NULL;
    if (r != CUDA_SUCCESS || status != CU_STREAM_CAPTURE_STATUS_NONE
        || vc_real_cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || !ctx)
        return false;
    pthread_mutex_lock(&lock);
    struct vc_pacer_context *c = find_context(ctx);
    if (!c) {
        pthread_mutex_unlock(&lock);
        if (!(c = add_context(ctx)))
            return false;
        pthread_mutex_lock(&lock);
    }
    bool paced = c->ctx == ctx && c->device >= 0;
    *l = (struct vc_launch){c, stream, ptsz, false, false, false, 0, c->device, key, 0};
    if (paced)
        start_thread();
    pthread_mutex_unlock(&lock);
    if (!paced)
        return false;

    int64_t *bucket = &vc_region()->bucket[l->device];
    end_run_before(l, vc_bucket_wait(bucket, vc_clock_ns()) > 0);
    wait_for(l->device);

    pthread_mutex_lock(&lock);
    struct kernel *k = claim_kernel(key, l->device);
    l->guessed = k->costs < SETTLED;
    l->charged = k->costs ? k->cost : typical_ns;
    bool opened = plan_timing(l, k, vc_clock_ns());
    pthread_mutex_unlock(&lock);
    charge(l->device, l->charged);
    struct record *timed = opened ? &records[l->record % RECORDS] : NULL;
    if (timed && timed->start && record_event(timed->start, l) != CUDA_SUCCESS) {
        close_record(l, VOID);
        timed = NULL;
        l->timed = false;
    }
    if (timed)
        timed->launching = vc_clock_ns();
    return true;
}

CUresult vc_pacer_end(struct vc_launch *l, CUresult result)
{
    if (result != CUDA_SUCCESS) {
        charge(l->device, -l->charged);
        if (l->timed) {
            l->guessed = false;   /* nothing ran: nothing to correct */
            close_record(l, VOID);
        }
        return result;
    }
    if (l->timed && l->ends) {
        if (records[l->record % RECORDS].launches)
            run.filled = stream_key(l->stream, l->ptsz);
        close_record(l, record_event(records[l->record % RECORDS].end, l) == CUDA_SUCCESS ? ENDED
                                                                                          : VOID);
    } else if (!l->timed && l->guessed) {
        pthread_mutex_lock(&lock);
        remember_guess(l);
        pthread_mutex_unlock(&lock);
    }
    return result;
}

/* ---- contexts that go, fork ---- */

static void forget(CUcontext ctx, CUdevice ordinal, bool by_context)
{
    if (!vc_pacing())
        return;
    pthread_mutex_lock(&lock);
    /* The thread may be reading this context's events: let it finish. */
    while (reading)
        pthread_cond_wait(&settled, &lock);
    for (int i = 0; i < MAX_CONTEXTS; i++) {
        struct vc_pacer_context *c = &contexts[i];
        if (!c->ctx || (by_context ? c->ctx != ctx : c->ordinal != ordinal))
            continue;
        /* Its events go with it. */
        for (uint32_t j = head; j != tail; j++)
            if (records[j % RECORDS].context == c)
                records[j % RECORDS].context = NULL;
        c->ctx = NULL;
        forgot = true;
    }
    pthread_mutex_unlock(&lock);
}

void vc_pacer_forget_context(CUcontext ctx) { forget(ctx, 0, true); }

void vc_pacer_forget_device(CUdevice ordinal) { forget(NULL, ordinal, false); }

void vc_pacer_before_fork(void) { pthread_mutex_lock(&lock); }

void vc_pacer_after_fork_in_parent(void) { pthread_mutex_unlock(&lock); }

void vc_pacer_forked(void)
{
    pthread_mutex_init(&lock, NULL);
    pthread_cond_init(&wake, NULL);
    pthread_cond_init(&settled, NULL);
    memset(contexts, 0, sizeof contexts);
    memset(kernels, 0, sizeof kernels);
    memset(last_gpu_ns, 0, sizeof last_gpu_ns);
    head = tail = measured = same_stream = 0;
    last_stream = 0;
    run.open = false;
    run.filled = 0;
    started = stopping = reading = forgot = false;
    typical_ns = FIRST_GUESS_NS;
}
