/* Paces kernel launches against the container's GPU-time bucket: the entry points. */
#define _GNU_SOURCE
#include "pacer_state.h"

#include <stdlib.h>
#include <string.h>

#include "bucket.h"
#include "capture.h"
#include "driver.h"
#include "log.h"
#include "pace_windows.h"
#include "setup.h"

/* The lock is adaptive: a launch that finds it taken (by the pacing thread,
 * mostly, for a few us) spins a moment before it sleeps. On an H100 VM a
 * decoding loop's launching thread spent 5-77 us a token off its CPU under
 * a plain one, besides the lock's own time. */
struct pacer_shared pacer = {
    .lock = PTHREAD_ADAPTIVE_MUTEX_INITIALIZER_NP,
    .wake = PTHREAD_COND_INITIALIZER,
    .idle = PTHREAD_COND_INITIALIZER,
    .held = PTHREAD_COND_INITIALIZER,
    .typical_ns = FIRST_GUESS_NS,
};
__thread struct thread_run thread_run __attribute__((tls_model("initial-exec")));
uint32_t pacer_flags[MAX_CONTEXTS][FLAG_BYTES / sizeof(uint32_t)]
    __attribute__((aligned(FLAG_BYTES)));

static struct vc_pacer_context *find_context(CUcontext ctx)
{
    for (int i = 0; i < MAX_CONTEXTS; i++)
        if (pacer.contexts[i].ctx == ctx)
            return &pacer.contexts[i];
    return NULL;
}

/* The entry of ctx, the current context, added if new; NULL when all are taken. */
static struct vc_pacer_context *add_context(CUcontext ctx)
{
    CUdevice ordinal;
    if (vc_real_cuCtxGetDevice(&ordinal) != CUDA_SUCCESS)
        return NULL;
    const struct vc_device *d = vc_device_of(ordinal);
    pthread_mutex_lock(&pacer.lock);
    struct vc_pacer_context *c = find_context(ctx);
    if (!c && (c = find_context(NULL))) {
        memset(c, 0, offsetof(struct vc_pacer_context, free));
        c->ctx = ctx;
        c->ordinal = ordinal;
        c->device = d ? d->index : -1;
        c->published = -1;
        pthread_cond_signal(&pacer.wake);
    }
    pthread_mutex_unlock(&pacer.lock);
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

/* Lets launch l's stream go, if it holds it. */
static void let_go(struct vc_launch *l)
{
    if (l->hold)
        pacer_release(pacer_flag(l->context), l->hold);
    l->hold = 0;
}

/* Before launch l's start event: its stream waits until the launch lets it
 * go. A driver that cannot hold streams (no stream memory operations, or no
 * such entry point) times the context's launches without. Any other failure
 * (a driver out of memory, say) leaves only this launch unheld. */
static void hold_stream(struct vc_launch *l)
{
    struct vc_pacer_context *c = l->context;
    const unsigned geq = CU_STREAM_WAIT_VALUE_GEQ;
    CUresult r = l->ptsz ? vc_real_cuStreamWaitValue32_v2_ptsz(l->stream, c->flag_at, l->hold, geq)
                         : vc_real_cuStreamWaitValue32_v2(l->stream, c->flag_at, l->hold, geq);
    if (r == CUDA_SUCCESS)
        return;
    bool cannot = r == CUDA_ERROR_NOT_SUPPORTED || r == CUDA_ERROR_NOT_FOUND;
    pthread_mutex_lock(&pacer.lock);
    bool first = cannot && c->holds;
    c->holds = c->holds && !cannot;
    pacer.records[l->record % RECORDS].held = false;
    pthread_mutex_unlock(&pacer.lock);
    let_go(l);   /* its value: the watch would wait a millisecond to let it go */
    if (first)
        vc_log(VC_LOG_WARN, "cannot hold a stream until its launch is on the device (CUDA error "
               "%d): small kernels are charged their way to the device too", (int)r);
}

/* Closes launch l's record (or run). */
static void close_record(struct vc_launch *l, enum record_state state)
{
    pthread_mutex_lock(&pacer.lock);
    pacer_close_locked(l->record, l->context, state);
    if (state == VOID)
        pacer_remember_guess(l);
    pthread_mutex_unlock(&pacer.lock);
}

/* Whether l's stream has run everything queued on it. Asked in relaxed
 * capture mode: while any thread captures in the global mode the driver
 * counts the query as unsafe, and it would break that capture. */
static bool stream_idle(const struct vc_launch *l)
{
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    vc_real_cuThreadExchangeStreamCaptureMode(&mode);
    CUresult r = l->ptsz ? vc_real_cuStreamQuery_ptsz(l->stream) : vc_real_cuStreamQuery(l->stream);
    vc_real_cuThreadExchangeStreamCaptureMode(&mode);
    return r == CUDA_SUCCESS;
}

/* Before launch l, which waits for the bucket if waits: ends this thread's
 * open run unless l joins it. A run waiting or done would time an idle
 * device. On l's stream its end event is recorded now, right behind its last
 * launch, unless another thread's launches came behind that (the run was
 * overtaken); a run on another stream (which may be gone by now) is given up:
 * its launches keep what they were charged up front. A late run, one whose
 * end event comes after its kernels ran, is charged no more than their
 * estimates: an overtaken one, and one closed after its kernels should be
 * done, on a stream that has run dry (it would span the idle time since). */
static void end_run_before(const struct vc_launch *l, bool waits)
{
    if (!thread_run.open)
        return;
    uint64_t stream = pacer_stream_key(l->stream, l->ptsz);
    pthread_mutex_lock(&pacer.lock);
    struct record *r = pacer_open_run();
    const struct kernel *k = pacer_kernel(l->key);
    bool here = r && thread_run.context == l->context && thread_run.stream == stream;
    bool keep = here && !waits
                && pacer_joins_run(l, k, stream, vc_clock_ns());
    if (r && !here)
        pacer_close_locked(thread_run.seq, thread_run.context, VOID);
    CUevent end = here && !keep ? r->end : NULL;
    bool overtaken = end && r->overtaken;
    bool overdue = end && !overtaken && vc_clock_ns() > r->drained;
    uint32_t seq = thread_run.seq;
    thread_run.open = keep;
    pthread_mutex_unlock(&pacer.lock);
    if (!end)
        return;
    bool late = overtaken || (overdue && stream_idle(l));
    enum record_state state = record_event(end, l) == CUDA_SUCCESS ? ENDED : VOID;
    pthread_mutex_lock(&pacer.lock);
    if (r->seq == seq)
        r->late = late;
    pacer_close_locked(seq, l->context, state);
    pthread_mutex_unlock(&pacer.lock);
}

bool vc_pacer_begin(struct vc_launch *l, CUstream stream, bool ptsz, uint64_t key)
{
    if (!vc_pacing() || vc_unpaced_window())
        return false;
    /* A launch into a capturing stream is recorded in a graph, not run: the
     * graph's launches are paced instead. */
    CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
    CUcontext ctx = NULL;
    if (vc_capture_status(stream, ptsz, &status) != CUDA_SUCCESS
        || status != CU_STREAM_CAPTURE_STATUS_NONE || vc_real_cuCtxGetCurrent(&ctx) != CUDA_SUCCESS
        || !ctx)
        return false;
    pthread_mutex_lock(&pacer.lock);
    struct vc_pacer_context *c = find_context(ctx);
    if (!c) {
        pthread_mutex_unlock(&pacer.lock);
        if (!(c = add_context(ctx)))
            return false;
        pthread_mutex_lock(&pacer.lock);
    }
    bool paced = c->ctx == ctx && c->device >= 0;
    *l = (struct vc_launch){.context = c, .stream = stream, .ptsz = ptsz, .device = c->device,
                            .key = key};
    if (!paced) {
        pthread_mutex_unlock(&pacer.lock);
        return false;
    }
    pacer_start_thread();
    /* One launch in CHECK is timed alone, to see what its kernel takes. */
    l->check = pacer_one_in(CHECK);
    int64_t now = vc_clock_ns();
    int64_t wait = vc_bucket_wait(&vc_region()->bucket[l->device], now);
    bool waits = wait > 0;
    /* Most launches neither wait nor end a run: they keep the lock to the
     * timing plan (taking it twice cost a decoding loop 0.17 us a launch). */
    if (waits || thread_run.open) {
        pthread_mutex_unlock(&pacer.lock);
        end_run_before(l, waits);
        if (waits)
            pacer_wait(l->device, wait);
        pthread_mutex_lock(&pacer.lock);
        now = vc_clock_ns();
    }
    struct kernel *k = pacer_claim_kernel(key, l->device, now);
    l->guessed = k->costs < TRUSTED;
    l->charged = pacer_up_front(k);
    bool opened = pacer_plan_timing(l, k, waits, now);
    pacer.tally.up_front_ns += l->charged;
    pthread_mutex_unlock(&pacer.lock);
    pacer_charge(l->device, now, l->charged);
    struct record *timed = opened ? &pacer.records[l->record % RECORDS] : NULL;
    if (l->hold)
        hold_stream(l);
    if (timed && timed->start && record_event(timed->start, l) != CUDA_SUCCESS) {
        let_go(l);
        close_record(l, VOID);
        timed = NULL;
        l->timed = false;
    }
    l->opened = timed;
    return true;
}

CUresult vc_pacer_end(struct vc_launch *l, CUresult result)
{
    if (result != CUDA_SUCCESS) {
        let_go(l);
        pacer_charge(l->device, vc_clock_ns(), -l->charged);
        if (l->timed) {
            l->guessed = false;   /* nothing ran: nothing to correct */
            close_record(l, VOID);
        }
        return result;
    }
    /* The launch call's return bounds when its kernel reached the device:
     * the call's own time before that, after the start event, is the host's. */
    if (l->opened)
        pacer.records[l->record % RECORDS].submitted = vc_clock_ns();
    if (l->timed && l->ends) {
        if (pacer.records[l->record % RECORDS].launches)
            thread_run.filled = pacer_stream_key(l->stream, l->ptsz);
        CUevent end = pacer.records[l->record % RECORDS].end;
        close_record(l, record_event(end, l) == CUDA_SUCCESS ? ENDED : VOID);
        let_go(l);
    } else if (!l->timed && l->guessed) {
        pthread_mutex_lock(&pacer.lock);
        pacer_remember_guess(l);
        pthread_mutex_unlock(&pacer.lock);
    }
    return result;
}

static void forget(CUcontext ctx, CUdevice ordinal, bool by_context)
{
    if (!vc_pacing())
        return;
    pthread_mutex_lock(&pacer.lock);
    /* The thread may be reading this context's events: let it finish. */
    while (pacer.reading)
        pthread_cond_wait(&pacer.idle, &pacer.lock);
    for (int i = 0; i < MAX_CONTEXTS; i++) {
        struct vc_pacer_context *c = &pacer.contexts[i];
        if (!c->ctx || (by_context ? c->ctx != ctx : c->ordinal != ordinal))
            continue;
        /* Its events go with it. */
        for (uint32_t j = pacer.head; j != pacer.tail; j++)
            if (pacer.records[j % RECORDS].context == c)
                pacer.records[j % RECORDS].context = NULL;
        c->ctx = NULL;
        pacer.forgot = true;
    }
    pthread_mutex_unlock(&pacer.lock);
}

void vc_pacer_forget_context(CUcontext ctx) { forget(ctx, 0, true); }

void vc_pacer_forget_device(CUdevice ordinal) { forget(NULL, ordinal, false); }

void vc_pacer_before_fork(void) { pthread_mutex_lock(&pacer.lock); }

void vc_pacer_after_fork_in_parent(void) { pthread_mutex_unlock(&pacer.lock); }

/* The child runs one thread and none of the parent's contexts: its pacer starts afresh. */
void vc_pacer_forked(void)
{
    memset(&pacer, 0, sizeof pacer);
    pacer.lock = (pthread_mutex_t)PTHREAD_ADAPTIVE_MUTEX_INITIALIZER_NP;
    pacer.wake = pacer.idle = pacer.held = (pthread_cond_t)PTHREAD_COND_INITIALIZER;
    pacer.typical_ns = FIRST_GUESS_NS;
    thread_run = (struct thread_run){0};
}
