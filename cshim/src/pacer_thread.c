/* The pacer's thread: reads the events of timed launches and charges what they took. */
#define _GNU_SOURCE
#include "pacer_state.h"

#include <signal.h>
#include <stdlib.h>

#include "bucket.h"
#include "driver.h"
#include "log.h"
#include "setup.h"

/* What the thread read of one record, outside the lock: where on the
 * context's timeline its (first) launch call returned, its start event (if
 * any) and its end event completed. */
struct reading {
    bool complete, placed;
    int64_t submitted, start, end;
};

/* Guarded by lock, which is never held across a driver call. */

/* Charges what record r (a launch or a run) really cost. Its kernels started
 * when its start event completed, or else the launch before it on its stream
 * ended, or when its (first) launch call returned if that was later (a call
 * spends some us before its kernel reaches the device, after the start
 * event: on an idle stream that time is the host's): its time is from then
 * to its end event. A held record's start event ran after its call returned,
 * so it starts there: the call's return is placed on the timeline by the
 * clock, which may err by some us, and placed late it cut held records of an
 * elementwise loop at 60 on an H100 to 6-7.5 us, where the rest took 8-9. It
 * is charged the busy time it added to its context (the union over its
 * streams), at most its cap (a little over the estimates of steady kernels):
 * what exceeds that ran while another process had the device. A kernel that
 * varies is timed alone, start to end: away from a busy neighbour nothing
 * else is in its record, and it is charged all of it (pacer_learn_check). */
static void charge_record(struct record *r, const struct reading *m)
{
    struct vc_pacer_context *c = r->context;
    struct kernel *k = pacer_kernel(r->key);
    struct lane *lane = &c->lanes[r->stream % LANES];
    int64_t start = m->submitted;
    /* But a thread held in its launch call (descheduled, or the driver busy)
     * returns long after its start event ran: held before its kernel reached
     * the device, the record is right; held after, the kernel ran that long
     * before the call returned, and the record would be cut by as much (its
     * cost learned from such records, a 3 ms kernel whose calls returned 2 ms
     * late one time in three was charged 1.4 ms a launch on the test double).
     * The thread cannot tell which, so such a record starts at its start
     * event, charged more rather than less, and teaches no sample. */
    int64_t returned_late = !r->held && m->start >= 0 ? m->submitted - m->start : 0;
    bool whole = returned_late <= LATE_RETURN_NS;
    if (!whole) {
        pacer.tally.late_returns++;
        if (returned_late > pacer.tally.latest_return_ns)
            pacer.tally.latest_return_ns = returned_late;
    }
    if (r->held || m->start > start || !whole)   /* a held record has a start event, placed */
        start = m->start;
    else if (m->start < 0 && lane->stream == r->stream && lane->end > start)
        start = lane->end;
    /* In a process launching on one stream: its first kernel queued behind
     * the stream's last one, and began as that one ended; else the stream was
     * idle, and its start event came some us before its kernel did, unless
     * the stream was held until the kernel was there too. */
    bool behind_last = lane->stream == r->stream
                       && (m->start >= 0 ? m->start : m->submitted) <= lane->end + QUEUED_NS;
    bool queued = r->held || !r->one_stream || behind_last;
    *lane = (struct lane){.stream = r->stream, .end = m->end};
    /* A held record's events run right around its kernel and take their own
     * moment on the device: a held pair with nothing between takes 1.2-1.3 us
     * on an H100, a quarter of a decoding launch's record. Half of that is
     * taken off, as NVML counts the rest busy: an elementwise loop at 60 kept
     * the device 52-57% busy with none taken off, 62-67% with all of it. */
    int64_t end = m->end - (r->held ? c->pair_ns * HELD_PAIR_PERCENT / 100 : 0);
    /* Nor is it charged the spans another process had the device. */
    int64_t from = start > c->covered ? start : c->covered;
    int64_t took = end > from ? end - from - pacer_away(c, from, end) : 0;
    int64_t launches = r->launches ? r->launches : 1;
    /* A late run, or a steady kernel that found its stream idle, is charged
     * no more than its kernels' estimates: past them the device idled, or
     * ran another thread's kernels, charged in their own records. */
    bool beside = pacer_beside(vc_clock_ns()), varies = k && k->varies;
    int64_t cap = r->cap, estimated = pacer_over(r->estimated, RUN_OVER_PERCENT);
    if (varies && !beside)
        cap = INT64_MAX;
    else if (r->late || (!queued && !r->mixed && k && k->estimate.steady && !varies))
        cap = cap < estimated ? cap : estimated;
    int64_t cost = took < cap ? took : cap;
    /* The context is known busy as far as the record was charged: past its
     * cap the time was not its kernels', and the records there are charged
     * their own. A run's end event comes at its thread's next launch: in
     * PyTorch a training step's forward pass leaves a run open on the main
     * thread while the backward pass is launched on the same stream by a
     * thread of its own, and the run's end spans the backward pass. Counted
     * busy to there, the backward pass's records were charged nothing. */
    int64_t reached = cost < took ? from + cost : m->end;
    if (reached > c->covered)
        c->covered = reached;
    /* A run of several kernels, or a late one, tells no one kernel's time:
     * it only corrects the bucket; nor does a small kernel's record that
     * found its stream idle, whose end event's moment and the device's
     * start-up would be much of it (taught as samples on an H100, they made
     * elementwise loops and two processes miss their shares). A large
     * kernel's is a sample (a kernel paced one launch at a time never
     * queues): its floor leaves out what another process ran. Large as its
     * launches so far were charged, not as this record took: a small
     * kernel's first launch can take long (a lazily loaded kernel's code is
     * loaded in it), and a small kernel that never queues would never teach
     * a lower sample. Nor is an unheld small kernel's record that starts at
     * its launch call's return: a thread descheduled after the driver pushed
     * the kernel returns when it is half done, and such samples made the
     * estimate of a 5 us kernel 0.9 us under CPU load (a large kernel's error
     * is small next to it, unless the thread was held long: below). */
    bool from_call = !r->held && start == m->submitted && end - start < SMALL_NS;
    /* Nor is a record whose launch call returned late (above), whatever its
     * kernel. */
    bool tells = k && !r->mixed && !r->late;
    int64_t each = (end - start - pacer_away(c, start, end)) / launches;
    bool sample = tells && whole && !from_call
                  && (queued || (k->cost >= SMALL_NS && each >= SMALL_NS)) && end > start;
    if (sample && !vc_estimate_add(&k->estimate, each, vc_clock_ns()))
        pacer.tally.held_back++;
    /* A check timed from its start to its end (its stream held, its start
     * event behind the stream's last timed kernel, or its kernel large),
     * away from a busy neighbour: what its kernel takes (pacer_learn_check).
     * A thread behind its device draws its checks among the launches it
     * times at random, at the same odds as any other launch, so a program
     * gains nothing by choosing which launches follow its pauses. */
    if (tells && whole && r->check && (r->held || behind_last || each >= SMALL_NS) && !beside
        && end > start && k->estimate.count >= VC_ESTIMATE_SETTLED)
        pacer_learn_check(k, each);
    if (tells)
        pacer_learn_cost(k, cost / launches, sample && k->estimate.count == 1);
    pacer_charge(r->device, vc_clock_ns(), cost - r->charged);
    pacer.tally.corrected_ns += cost - r->charged;
    pacer.read_lately++;
}

/* The context that needs the thread's help: a stream, references or events. */
static struct vc_pacer_context *needy_context(void)
{
    for (int i = 0; i < MAX_CONTEXTS; i++) {
        struct vc_pacer_context *c = &pacer.contexts[i];
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

/* Outside the lock: the context's flag, registered with it for the device
 * to read (a context that took the entry before may have left it
 * registered); none if it cannot be, or if no watch runs to let a held
 * stream go: then its launches hold no streams. */
static void make_flag(struct vc_pacer_context *c)
{
    uint32_t *flag = pacer_flag(c);
    if (!pacer.watched) {
        c->flag_at = 0;
        return;
    }
    CUresult r = vc_real_cuMemHostRegister_v2(flag, FLAG_BYTES, CU_MEMHOSTREGISTER_DEVICEMAP);
    if ((r != CUDA_SUCCESS && r != CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED)
        || vc_real_cuMemHostGetDevicePointer_v2(&c->flag_at, flag, 0) != CUDA_SUCCESS)
        c->flag_at = 0;
}

/* Waits for event e, recorded at before, to complete, for REF_SLOP_NS at
 * most: the event's last query, and when it was made (*done). */
static CUresult await_event(CUevent e, int64_t before, int64_t *done)
{
    CUresult q;
    do {
        q = vc_real_cuEventQuery(e);
        *done = vc_clock_ns();
    } while (q == CUDA_ERROR_NOT_READY && *done - before <= REF_SLOP_NS);
    return q;
}

/* ns from ref to event, or -1. */
static int64_t since(CUevent ref, CUevent event)
{
    float ms;
    if (vc_real_cuEventElapsedTime(&ms, ref, event) != CUDA_SUCCESS || ms < 0)
        return -1;
    return (int64_t)((double)ms * 1e6);
}

bool pacer_event_done(const struct vc_pacer_context *c, CUevent event, int64_t generation,
                      const struct ref **ref)
{
    CUresult q = vc_real_cuEventQuery(event);
    if (q == CUDA_ERROR_NOT_READY)
        return false;
    /* The reference is still there if no more than REFS - 1 newer ones were
     * recorded. */
    *ref = q == CUDA_SUCCESS && generation >= 0 && c->complete - generation < REFS - 1
           ? &c->refs[generation % REFS] : NULL;
    return true;
}

int64_t pacer_event_at(const struct ref *ref, CUevent event)
{
    int64_t ns = since(ref->event, event);
    return ns >= 0 ? ref->offset + ns : -1;
}

/* Outside the lock, before the context's launches hold streams: what a held
 * pair of events with nothing between takes on its own stream, the least of
 * PAIR_TRIES (0 if unknown). The watch lets the stream go should a driver
 * call here wait for it. */
static int64_t time_held_pair(struct vc_pacer_context *c, CUevent start, CUevent end)
{
    uint32_t *flag = pacer_flag(c);
    int64_t least = 0;
    for (int i = 0; i < PAIR_TRIES; i++) {
        uint32_t value = __atomic_load_n(flag, __ATOMIC_ACQUIRE) + 1;
        pthread_mutex_lock(&pacer.lock);
        pacer_hold(c, value, vc_clock_ns());
        pthread_mutex_unlock(&pacer.lock);
        bool queued = vc_real_cuStreamWaitValue32_v2(c->own, c->flag_at, value,
                                                     CU_STREAM_WAIT_VALUE_GEQ) == CUDA_SUCCESS
                      && vc_real_cuEventRecord(start, c->own) == CUDA_SUCCESS
                      && vc_real_cuEventRecord(end, c->own) == CUDA_SUCCESS;
        pacer_release(flag, value);
        int64_t done, ns = queued && await_event(end, vc_clock_ns(), &done) == CUDA_SUCCESS
                               ? since(start, end) : -1;
        if (ns < 0)
            break;
        if (!least || ns < least)
            least = ns;
    }
    return least;
}

/* Outside the lock: the context's own stream, references and flag (and the
 * time of a held pair of events), then up to want events into made. */
static unsigned equip(struct vc_pacer_context *c, CUcontext *current, CUevent *made,
                      unsigned want)
{
    if (!set_current(c->ctx, current))
        return 0;
    bool fresh = !c->own && !c->broken;
    if (fresh) {
        c->broken = vc_real_cuStreamCreate(&c->own, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS;
        for (int i = 0; i < REFS && !c->broken; i++)
            c->broken = vc_real_cuEventCreate(&c->refs[i].event, CU_EVENT_DEFAULT) != CUDA_SUCCESS;
        c->broken = c->broken
                    || vc_real_cuEventCreate(&c->probe.event, CU_EVENT_DEFAULT) != CUDA_SUCCESS;
        c->complete = -1;
        if (!c->broken)
            make_flag(c);
        if (c->broken)
            vc_log(VC_LOG_WARN, "no stream or events for the timeline of a context: its "
                   "launches are charged without it");
    }
    unsigned n = 0;
    while (n < want && vc_real_cuEventCreate(&made[n], CU_EVENT_DEFAULT) == CUDA_SUCCESS)
        n++;
    if (fresh && c->flag_at && n >= 2)
        c->pair_ns = time_held_pair(c, made[0], made[1]);
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
    CUresult q = await_event(next->event, before, &done);
    float ms = 0;
    if (q != CUDA_SUCCESS || done - before > REF_SLOP_NS
        || (last && vc_real_cuEventElapsedTime(&ms, last->event, next->event) != CUDA_SUCCESS))
        return;
    next->recorded = done;
    next->offset = last ? last->offset + (int64_t)((double)ms * 1e6) : 0;
    c->complete++;
    c->recorded_at = now;
}

/* Outside the lock: where record r's launch lies on its context's timeline,
 * once complete; its reference maps the clock onto the timeline. */
static void read_record(const struct record *r, struct reading *m, CUcontext *current)
{
    *m = (struct reading){.submitted = -1, .start = -1, .end = -1};
    struct vc_pacer_context *c = r->context;
    const struct ref *ref;
    if (!set_current(c->ctx, current) || !pacer_event_done(c, r->end, r->generation, &ref))
        return;
    m->complete = true;
    if (!ref)
        return;
    int64_t end = pacer_event_at(ref, r->end);
    int64_t start = r->start ? pacer_event_at(ref, r->start) : -1;
    if (end >= 0 && (!r->start || start >= 0)) {
        m->placed = true;
        m->submitted = pacer_clock_at(ref, r->submitted);
        m->start = start;
        m->end = end;
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
        int dev = pacer.contexts[i].device;
        if (!pacer.contexts[i].ctx || dev < 0 || done[dev])
            continue;
        done[dev] = true;
        uint64_t total = __atomic_load_n(&r->gpu_ns[dev], __ATOMIC_RELAXED);
        if (pacer.last_gpu_ns[dev])
            vc_log(VC_LOG_INFO, "%s: %.1f%% of the device's time charged to the container over "
                   "%.2f s; %u launches read here", r->uuid[dev],
                   100.0 * (double)(int64_t)(total - pacer.last_gpu_ns[dev])
                       / (double)(now - *last),
                   (double)(now - *last) / 1e9, pacer.read_lately);
        pacer.last_gpu_ns[dev] = total;
    }
    pacer.read_lately = 0;
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
           || (pacer.head != pacer.tail && (pacer.records[pacer.head % RECORDS].state != OPEN
                                || pacer.records[pacer.head % RECORDS].launches));
}

/* One round of the thread: equips a needy context, moves references on,
 * probes for other processes' time slices while launches are in flight,
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
        if (pacer.contexts[i].ctx && pacer.contexts[i].device >= 0)
            live[nlive++] = &pacer.contexts[i];
    if (pacer.forgot)
        *current = NULL;
    pacer.forgot = false;
    uint32_t first = pacer.head, n = 0;
    bool timing = first != pacer.tail;   /* launches in flight: see pacer_slices.c */
    int64_t began = vc_clock_ns();
    bool fresh = needy && !needy->own;   /* equipped for the first time: its word too */
    for (; n < BATCH && first + n != pacer.tail; n++) {
        struct record *r = &pacer.records[(first + n) % RECORDS];
        if (stale(r, began))
            r->state = VOID;
        if (r->state == OPEN)
            break;
    }
    pacer.reading = true;
    pthread_mutex_unlock(&pacer.lock);

    unsigned nmade = needy ? equip(needy, current, made, want < EVENTS_BATCH ? want : EVENTS_BATCH)
                           : 0;
    int64_t now = vc_clock_ns();
    for (int i = 0; i < nlive; i++) {
        advance_references(live[i], current, now);
        if (timing && set_current(live[i]->ctx, current))
            pacer_probe(live[i]);
    }
    uint32_t done = 0;
    for (; done < n; done++) {
        const struct record *r = &pacer.records[(first + done) % RECORDS];
        if (r->state == VOID || !r->context)
            continue;
        read_record(r, &readings[done], current);
        if (!readings[done].complete)
            break;
    }

    pthread_mutex_lock(&pacer.lock);
    pacer.reading = false;
    pthread_cond_broadcast(&pacer.idle);
    if (fresh && needy->flag_at) {
        /* Its launches wait for values past what the word holds. */
        needy->holds = true;
        needy->held = __atomic_load_n(pacer_flag(needy), __ATOMIC_ACQUIRE);
    }
    if (needy) {
        /* A context that gives no more events is not asked again. */
        needy->created = nmade ? needy->created + nmade : EVENTS;
        for (unsigned i = 0; i < nmade; i++)
            needy->free[needy->nfree++] = made[i];
    }
    for (int i = 0; i < MAX_CONTEXTS; i++)
        if (pacer.contexts[i].ctx && pacer.contexts[i].complete > pacer.contexts[i].published) {
            pacer.contexts[i].published = pacer.contexts[i].complete;
            pacer.contexts[i].published_at = pacer.contexts[i].recorded_at;
        }
    for (uint32_t i = 0; i < done; i++) {
        struct record *r = &pacer.records[(first + i) % RECORDS];
        if (r->state == ENDED && r->context && readings[i].placed)
            charge_record(r, &readings[i]);
        if (r->context) {
            r->context->free[r->context->nfree++] = r->end;
            if (r->start)
                r->context->free[r->context->nfree++] = r->start;
        }
    }
    pacer.head = first + done;
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
    pthread_mutex_lock(&pacer.lock);
    while (!pacer.stopping) {
        if (!has_work()) {
            pthread_cond_wait(&pacer.wake, &pacer.lock);
            continue;
        }
        read_round(&current);
        report(vc_clock_ns(), &last_report);
        bool beside = pacer_beside(vc_clock_ns());
        pthread_mutex_unlock(&pacer.lock);
        pacer_nap(beside ? BESIDE_TICK_NS : TICK_NS);
        pthread_mutex_lock(&pacer.lock);
    }
    pthread_mutex_unlock(&pacer.lock);
    return NULL;
}

/* At exit, before the CUDA runtime tears the driver down, the thread stops
 * calling it. */
static void stop_at_exit(void)
{
    pthread_mutex_lock(&pacer.lock);
    pacer.stopping = true;
    pthread_cond_signal(&pacer.wake);
    pthread_cond_signal(&pacer.held);
    while (pacer.reading)
        pthread_cond_wait(&pacer.idle, &pacer.lock);
    const struct pacer_tally *t = &pacer.tally;
    vc_log(VC_LOG_INFO, "paced %llu launches (%llu timed alone, %llu in runs, %llu untimed); "
           "%llu waited for the bucket, %.3f s in all; charged %.3f s up front, corrected by "
           "%+.3f s once timed; %llu time slices of other processes found, %.3f s in all; "
           "%llu samples far under their kernel's time held back from its floor; %llu records "
           "not sampled as their launch call returned late, by %.3f ms at most",
           (unsigned long long)t->launches, (unsigned long long)t->alone,
           (unsigned long long)t->in_runs, (unsigned long long)t->untimed,
           (unsigned long long)t->waits, (double)t->waited_ns / 1e9, (double)t->up_front_ns / 1e9,
           (double)t->corrected_ns / 1e9, (unsigned long long)t->slices, (double)t->away_ns / 1e9,
           (unsigned long long)t->held_back, (unsigned long long)t->late_returns,
           (double)t->latest_return_ns / 1e6);
    pthread_mutex_unlock(&pacer.lock);
}

static void register_exit(void) { atexit(stop_at_exit); }

void pacer_start_thread(void)
{
    static pthread_once_t exit_once = PTHREAD_ONCE_INIT;
    if (pacer.started)
        return;
    pacer.started = true;
    pthread_once(&exit_once, register_exit);
    /* Signals stay with the program's own threads. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pthread_t thread;
    int rc = pthread_create(&thread, NULL, pacer_main, NULL);
    pacer.watched = rc == 0 && pacer_start_watch();
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        vc_log(VC_LOG_ERROR, "cannot start the pacing thread: launches are charged estimates "
               "that are never measured");
        return;
    }
    pthread_setname_np(thread, "vcuda-pacer");
    pthread_detach(thread);
    if (!pacer.watched)
        vc_log(VC_LOG_WARN, "cannot start the thread that lets held streams go: launches "
               "are timed without holding their streams");
}
