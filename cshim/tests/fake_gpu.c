/*
 * The test double's device: modules with kernels that "run" for a simulated
 * time, streams, events, stream capture and graphs, on the real clock
 * (CLOCK_MONOTONIC, as the driver's events are to the host).
 *
 * Kernels come from a PTX text (cuModuleLoadData; any ".entry NAME" is a
 * function). A launch runs for the nanoseconds its first parameter points to
 * (a uint64_t), as the spin kernel of the tests does on a real GPU. The
 * device runs one kernel at a time, for all processes (its timeline is in
 * the shared state), as a time-sliced GPU does for processes and a kernel
 * that fills it does for streams: a stream's work starts when both the
 * stream and the device are free. An event completes when the work recorded
 * before it on its stream does, and, as a process's channels only run in
 * its time slices, not while another process's kernel runs; its time is
 * that moment. One recorded behind work still to run holds the device for a
 * moment, as on a real GPU (about 2 us on an H200; VCUDA_FAKE_EVENT_NS sets
 * it). Work reaches the device some us after the call that queued it
 * (VCUDA_FAKE_SUBMIT_NS), as a driver's submission does. Beside a busy
 * neighbour, some of it reaches the device during that one's time slice
 * (VCUDA_FAKE_SLICE_NS, VCUDA_FAKE_SLICE_PERCENT: neighbour_slice).
 *
 * A stream can wait for a 32-bit value in host memory (cuStreamWaitValue32,
 * GEQ only, on memory from cuMemHostAlloc or cuMemHostRegister): the work
 * queued behind the wait runs once the value is written, from the last
 * moment the double saw it unwritten (it looks at every call), as a device
 * that polls the value does; each event queued behind the wait holds the
 * stream its moment. Until then its events are not ready, and a
 * synchronization waits.
 *
 * Capture follows the driver: a launch or graph launch into a capturing
 * stream adds a node instead of running; an event recorded into it marks
 * the stream's position in the capture (and is counted, for the tests:
 * fakeRecordsInCapture; fakeEventRecords counts the others that cost the
 * device a moment, behind work or a wait; fakeCaptureQueries counts
 * cuStreamIsCapturing calls); the legacy stream cannot be
 * captured, and using it while a blocking stream captures invalidates that
 * capture. Querying or synchronizing (streams, events, the context) from a
 * thread whose capture mode forbids it while a capture runs fails with
 * CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidates the captures (as do
 * a pool's attribute query and trim: fake_cuda.c asks fake_unsafe_call).
 *
 * Graph memory follows the driver too (as measured on an H100): a
 * stream-ordered allocation (or free) in a capturing stream becomes an
 * allocation (free) node, and cuGraphAddMemAllocNode adds one; nothing is
 * allocated then. An upload or launch of the executable graph backs its
 * allocations from the process's graph memory of the device (fake_cuda.c,
 * fake_graph_back): what the graph frees itself is reused by the next
 * graph, what it keeps stays until freed, and the reservation only shrinks
 * at cuDeviceGraphMemTrim.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fake_gpu.h"
#include "fake_state.h"

#undef cuEventElapsedTime
CUresult cuEventElapsedTime(float *pMilliseconds, CUevent hStart, CUevent hEnd);

#define MAX_MODULES 16
#define MAX_FUNCTIONS 64
#define MAX_STREAMS 256
#define MAX_EVENTS 8192
#define MAX_GRAPHS 256
#define MAX_GRAPH_ALLOCS 16
/* Where graph allocations' addresses come from (apart from fake_cuda.c's). */
#define GRAPH_ADDRESSES 0x5f0000000000ULL

struct module {
    bool alive;
    char *text;
};

struct function {
    bool alive;
    struct module *module;
    bool launched;
};

struct graph {
    bool alive;
    unsigned nodes;          /* kernels, allocation and free nodes */
    int64_t ns;              /* the nodes run one after another */
    unsigned nallocs;        /* its first nallocs nodes are allocation nodes */
    struct graph_alloc {
        uint64_t bytes;
        CUdeviceptr address;
        bool freed;          /* by a free node of the same graph */
    } alloc[MAX_GRAPH_ALLOCS];
    bool uploaded;           /* backed by an upload: its next launch is too */
    unsigned nfrees;         /* the next nfrees nodes are free nodes */
    CUdeviceptr free[MAX_GRAPH_ALLOCS];
};

/* Work queued behind a wait for a value: a kernel's ns, or an event. */
struct held_work {
    int64_t ns;
    struct event *event;
};

#define MAX_HELD 64
#define HELD_AT INT64_MAX    /* the time of an event behind a wait not released yet */

struct stream {
    bool alive;
    bool blocking;           /* synchronizes with the legacy stream */
    int64_t tail;            /* when the work recorded on it so far ends */
    const uint32_t *wait;    /* the value its work waits for is here; NULL: none */
    uint32_t wait_for;
    int64_t unwritten_at;    /* the last time the double saw the value unwritten */
    unsigned nheld;
    struct held_work held[MAX_HELD];
    CUstreamCaptureStatus capture;
    CUstreamCaptureMode mode;
    pthread_t capturer;
    struct graph *graph;     /* being captured */
};

struct event {
    bool alive, recorded, captured;
    unsigned flags;
    int64_t time;
};

/* Index 0 is the legacy stream; per-thread streams take entries like created ones. */
static struct module modules[MAX_MODULES];
static struct function functions[MAX_FUNCTIONS];
static struct stream streams[MAX_STREAMS];
static struct event events[MAX_EVENTS];
static struct graph graphs[MAX_GRAPHS];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned long records_in_capture, records_run, capture_queries;
static CUdeviceptr next_graph_address = GRAPH_ADDRESSES;
static __thread struct stream *per_thread;
static __thread CUstreamCaptureMode thread_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;

#define LEGACY (&streams[0])

/* A call and its _ptsz twin, made by impl(args..., per_thread_default). What
 * the double has no use for (shared memory sizes, extra launch arguments) is
 * left unused. */
#pragma GCC diagnostic ignored "-Wunused-parameter"
#define TWINS(name, params, impl, ...)                                                             \
    CUresult name params { return impl(__VA_ARGS__, false); }                                      \
    CUresult name##_ptsz params { return impl(__VA_ARGS__, true); }

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Sleeps until t; HELD_AT: until some work held behind a wait runs (the caller asks again). */
static void sleep_until(int64_t t)
{
    if (t == HELD_AT) {
        nanosleep(&(struct timespec){0, 1000}, NULL);
        return;
    }
    for (int64_t left; (left = t - now_ns()) > 0;) {
        struct timespec ts = {left / 1000000000, left % 1000000000};
        nanosleep(&ts, NULL);
    }
}

void fake_gpu_forget(void)
{
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_MODULES; i++)
        free(modules[i].text);
    memset(modules, 0, sizeof modules);
    memset(functions, 0, sizeof functions);
    memset(streams, 0, sizeof streams);
    memset(events, 0, sizeof events);
    memset(graphs, 0, sizeof graphs);
    streams[0] = (struct stream){.alive = true, .blocking = true};
    records_in_capture = records_run = capture_queries = 0;
    next_graph_address = GRAPH_ADDRESSES;
    per_thread = NULL;
    pthread_mutex_unlock(&lock);
}

unsigned long fakeRecordsInCapture(void)
{
    pthread_mutex_lock(&lock);
    unsigned long n = records_in_capture;
    pthread_mutex_unlock(&lock);
    return n;
}

unsigned long fakeEventRecords(void)
{
    pthread_mutex_lock(&lock);
    unsigned long n = records_run;
    pthread_mutex_unlock(&lock);
    return n;
}

unsigned long fakeCaptureQueries(void)
{
    pthread_mutex_lock(&lock);
    unsigned long n = capture_queries;
    pthread_mutex_unlock(&lock);
    return n;
}

/* ---- handles (lock held) ---- */

static void *first_free(void *table, size_t size, size_t n, size_t alive)
{
    for (size_t i = 0; i < n; i++)
        if (!*(bool *)((char *)table + i * size + alive))
            return (char *)table + i * size;
    return NULL;
}

/* The first entry of a table of structures that is not alive, or NULL. */
#define FREE_ENTRY(table)                                                                          \
    ((__typeof__(&(table)[0]))first_free(table, sizeof *(table), sizeof(table) / sizeof *(table), \
                                         offsetof(__typeof__((table)[0]), alive)))

/* The stream a handle names; per_thread_default: a _ptsz call, where 0 is the per-thread stream. */
static struct stream *stream_of(CUstream h, bool per_thread_default)
{
    if ((!h && per_thread_default) || h == CU_STREAM_PER_THREAD) {
        if (!per_thread && (per_thread = FREE_ENTRY(streams)))
            *per_thread = (struct stream){.alive = true, .blocking = true};
        return per_thread;
    }
    if (!h || h == CU_STREAM_LEGACY)
        return LEGACY;
    struct stream *s = (struct stream *)h;
    return s > LEGACY && s < streams + MAX_STREAMS && s->alive ? s : NULL;
}

static struct event *event_of(CUevent h)
{
    struct event *e = (struct event *)h;
    return e >= events && e < events + MAX_EVENTS && e->alive ? e : NULL;
}

static struct graph *graph_of(void *h)
{
    struct graph *g = h;
    return g >= graphs && g < graphs + MAX_GRAPHS && g->alive ? g : NULL;
}

static struct graph *new_graph(unsigned nodes, int64_t ns)
{
    struct graph *g = FREE_ENTRY(graphs);
    if (g)
        *g = (struct graph){.alive = true, .nodes = nodes, .ns = ns};
    return g;
}

/* Adds an allocation node of bytes to g; its address in *address. */
static CUresult add_alloc_node(struct graph *g, uint64_t bytes, CUdeviceptr *address)
{
    if (!bytes)
        return CUDA_ERROR_INVALID_VALUE;
    if (g->nallocs == MAX_GRAPH_ALLOCS)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *address = next_graph_address;
    next_graph_address += (bytes + (2u << 20) - 1) / (2u << 20) * (2u << 20);
    g->alloc[g->nallocs++] = (struct graph_alloc){bytes, *address, false};
    g->nodes++;
    return CUDA_SUCCESS;
}

/* A graph's node i, as a handle: the graph's index and the node's, plus one each. */
static CUgraphNode node_handle(const struct graph *g, unsigned i)
{
    return (CUgraphNode)(uintptr_t)(((uintptr_t)(g - graphs) + 1) << 16 | (i + 1));
}

/* The graph and node index a handle names; NULL if none. */
static struct graph *node_of(CUgraphNode h, unsigned *i)
{
    uintptr_t v = (uintptr_t)h;
    uintptr_t g = (v >> 16) - 1;
    *i = (unsigned)(v & 0xffff) - 1;
    if (!v || g >= MAX_GRAPHS || !graphs[g].alive || *i >= graphs[g].nodes)
        return NULL;
    return &graphs[g];
}

/* ---- capture (lock held) ---- */

static bool blocking_capture(void)
{
    for (int i = 1; i < MAX_STREAMS; i++)
        if (streams[i].alive && streams[i].blocking
            && streams[i].capture == CU_STREAM_CAPTURE_STATUS_ACTIVE)
            return true;
    return false;
}

static void invalidate(bool blocking_only)
{
    for (int i = 1; i < MAX_STREAMS; i++)
        if (streams[i].alive && streams[i].capture == CU_STREAM_CAPTURE_STATUS_ACTIVE
            && (!blocking_only || streams[i].blocking))
            streams[i].capture = CU_STREAM_CAPTURE_STATUS_INVALIDATED;
}

/* A query or synchronization: refused (and the captures invalidated) when
 * the thread's capture mode forbids it while a capture runs. */
static CUresult unsafe_call(void)
{
    if (thread_mode == CU_STREAM_CAPTURE_MODE_RELAXED)
        return CUDA_SUCCESS;
    pthread_t self = pthread_self();
    bool forbidden = false;
    for (int i = 1; i < MAX_STREAMS && !forbidden; i++) {
        const struct stream *s = &streams[i];
        if (!s->alive || s->capture != CU_STREAM_CAPTURE_STATUS_ACTIVE)
            continue;
        bool own = pthread_equal(s->capturer, self);
        forbidden = own ? s->mode != CU_STREAM_CAPTURE_MODE_RELAXED
                        : thread_mode == CU_STREAM_CAPTURE_MODE_GLOBAL
                              && s->mode == CU_STREAM_CAPTURE_MODE_GLOBAL;
    }
    if (!forbidden)
        return CUDA_SUCCESS;
    invalidate(false);
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
}

CUresult fake_unsafe_call(void)
{
    pthread_mutex_lock(&lock);
    CUresult r = unsafe_call();
    pthread_mutex_unlock(&lock);
    return r;
}

/* Where work on s may start: after its own, and the legacy stream and the
 * blocking streams wait for one another. */
static int64_t ready_at(const struct stream *s)
{
    int64_t t = s->tail;
    if (s == LEGACY) {
        for (int i = 1; i < MAX_STREAMS; i++)
            if (streams[i].alive && streams[i].blocking && streams[i].tail > t)
                t = streams[i].tail;
    } else if (s->blocking && LEGACY->tail > t) {
        t = LEGACY->tail;
    }
    return t;
}

static struct fake_timeline *timeline_locked(void)
{
    struct fake_timeline *t = &fake_state()->timeline[fake_current_device()];
    while (__atomic_exchange_n(&t->lock, 1, __ATOMIC_ACQUIRE))
        sched_yield();
    return t;
}

static void timeline_unlock(struct fake_timeline *t) { __atomic_store_n(&t->lock, 0, __ATOMIC_RELEASE); }

/* A number the tests may set in the environment: a duration in ns, a
 * count, a switch or a CUresult. */
static int64_t number_from_env(const char *name, int64_t otherwise)
{
    const char *set = getenv(name);
    return set ? strtoll(set, NULL, 10) : otherwise;
}

/* When work queued now reaches the device: a driver's submission takes some
 * us after the call that queued it returns, for kernels and events alike
 * (VCUDA_FAKE_SUBMIT_NS, default 0). */
static int64_t reaches_device(void)
{
    static int64_t latency = -1;
    if (latency < 0)
        latency = number_from_env("VCUDA_FAKE_SUBMIT_NS", 0);
    return now_ns() + latency;
}

/* With VCUDA_FAKE_SLICE_NS=NS, VCUDA_FAKE_SLICE_PERCENT (default 50) of the
 * work this process runs reaches a device that another process holds for a
 * time slice of NS, as beside a busy neighbour on a real GPU: what was
 * queued before it, events too, is done, and it starts once the slice ends.
 * The slice's length, or 0 for work that finds the device free. */
static int64_t neighbour_slice(void)
{
    static int64_t slice = -1, percent, works;
    if (slice < 0) {
        slice = number_from_env("VCUDA_FAKE_SLICE_NS", 0);
        percent = number_from_env("VCUDA_FAKE_SLICE_PERCENT", 50);
    }
    works++;
    return works * percent / 100 != (works - 1) * percent / 100 ? slice : 0;
}

/* Runs ns of work on s that reaches the device at now: once s and the device
 * are both free, and after another process's slice if one holds it. */
static void run(struct stream *s, int64_t ns, int64_t now)
{
    int64_t start = ready_at(s), slice = neighbour_slice();
    struct fake_timeline *t = timeline_locked();
    int64_t begin = start > now ? start : now;
    begin = t->busy_until > begin ? t->busy_until : begin;
    if (slice) {
        t->kernel[t->next].start = begin;
        t->kernel[t->next].end = begin += slice;
        t->kernel[t->next].pid = 0;
        t->next = (t->next + 1) % FAKE_INTERVALS;
    }
    t->busy_until = s->tail = begin + ns;
    t->kernel[t->next].start = begin;
    t->kernel[t->next].end = begin + ns;
    t->kernel[t->next].pid = getpid();
    t->next = (t->next + 1) % FAKE_INTERVALS;
    timeline_unlock(t);
}

/* An event behind s's work: s waits a moment after it, and so does the device
 * if that work is the last it has. */
static void hold(struct stream *s, int64_t ns)
{
    struct fake_timeline *t = timeline_locked();
    if (t->busy_until == s->tail)
        t->busy_until += ns;
    s->tail += ns;
    timeline_unlock(t);
}

/* When an event on s that reaches the device at now completes: after s's
 * work, outside other processes' kernels. */
static int64_t event_at(const struct stream *s, int64_t now)
{
    int64_t at = ready_at(s);
    at = at > now ? at : now;
    pid_t self = getpid();   /* a system call: once, not once a kernel */
    struct fake_timeline *t = timeline_locked();
    for (unsigned i = 0; i < FAKE_INTERVALS; i++) {
        unsigned k = (t->next + i) % FAKE_INTERVALS;
        if (t->kernel[k].pid != self && t->kernel[k].start <= at && at < t->kernel[k].end)
            at = t->kernel[k].end;
    }
    timeline_unlock(t);
    return at;
}

/* What an event between two kernels costs the device. */
static int64_t event_cost_ns(void)
{
    static int64_t cost = -1;
    if (cost < 0)
        cost = number_from_env("VCUDA_FAKE_EVENT_NS", 2000);
    return cost;
}

/* Places event e on s, reaching the device at now. It holds the stream its
 * moment behind work still to run, or when it was queued behind a wait. */
static void place_event(struct event *e, struct stream *s, int64_t now, bool held)
{
    e->time = event_at(s, now);
    if (held && e->time > s->tail)
        s->tail = e->time;
    if (held || s->tail > now_ns())
        hold(s, event_cost_ns());
}

/* Whether the value at wait has reached value (a cyclic comparison, as the driver's GEQ). */
static bool written(const uint32_t *wait, uint32_t value)
{
    return (int32_t)(__atomic_load_n(wait, __ATOMIC_ACQUIRE) - value) >= 0;
}

/* Runs the work held on streams whose value was written (lock held). */
static void release_waits(void)
{
    int64_t now = now_ns();
    for (int i = 0; i < MAX_STREAMS; i++) {
        struct stream *s = &streams[i];
        if (!s->wait)
            continue;
        if (!written(s->wait, s->wait_for)) {
            s->unwritten_at = now;
            continue;
        }
        s->wait = NULL;
        for (unsigned j = 0; j < s->nheld; j++) {
            if (s->held[j].event)
                place_event(s->held[j].event, s, s->unwritten_at, true);
            else
                run(s, s->held[j].ns, s->unwritten_at);
        }
        s->nheld = 0;
    }
}

/* Queues work behind s's wait (the double keeps MAX_HELD). */
static CUresult hold_work(struct stream *s, struct held_work work)
{
    if (s->nheld == MAX_HELD)
        return CUDA_ERROR_NOT_SUPPORTED;
    s->held[s->nheld++] = work;
    return CUDA_SUCCESS;
}

/* Whether work can be put on s; *captured: it joins s's capture rather than run. */
static CUresult work_on(struct stream *s, bool *captured)
{
    *captured = s && s->capture == CU_STREAM_CAPTURE_STATUS_ACTIVE;
    if (!s)
        return CUDA_ERROR_INVALID_HANDLE;
    if (s->capture == CU_STREAM_CAPTURE_STATUS_INVALIDATED)
        return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    if (s == LEGACY && blocking_capture()) {
        invalidate(true);
        return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
    }
    return CUDA_SUCCESS;
}

/* Launches ns of work on stream h (or adds a node to its capture). */
static CUresult submit(CUstream h, bool per_thread_default, int64_t ns)
{
    pthread_mutex_lock(&lock);
    release_waits();
    struct stream *s = stream_of(h, per_thread_default);
    bool captured;
    CUresult r = work_on(s, &captured);
    if (r == CUDA_SUCCESS && captured) {
        s->graph->nodes++;
        s->graph->ns += ns;
    } else if (r == CUDA_SUCCESS && s->wait) {
        r = hold_work(s, (struct held_work){.ns = ns});
    } else if (r == CUDA_SUCCESS) {
        run(s, ns, reaches_device());
    }
    pthread_mutex_unlock(&lock);
    return r;
}

/* ---- stream-ordered allocation in a capture ---- */

CUresult fake_capture_alloc(CUstream h, bool per_thread_default, uint64_t bytes,
                            CUdeviceptr *dptr, bool *captured)
{
    pthread_mutex_lock(&lock);
    struct stream *s = stream_of(h, per_thread_default);
    CUresult r = work_on(s, captured);
    if (r == CUDA_SUCCESS && *captured)
        r = add_alloc_node(s->graph, bytes, dptr);
    pthread_mutex_unlock(&lock);
    return r;
}

CUresult fake_capture_free(CUstream h, bool per_thread_default, CUdeviceptr dptr, bool *captured)
{
    pthread_mutex_lock(&lock);
    struct stream *s = stream_of(h, per_thread_default);
    CUresult r = work_on(s, captured);
    if (r == CUDA_SUCCESS && *captured) {
        struct graph *g = s->graph;
        for (unsigned i = 0; i < g->nallocs; i++)
            if (g->alloc[i].address == dptr)
                g->alloc[i].freed = true;
        if (g->nfrees < MAX_GRAPH_ALLOCS)
            g->free[g->nfrees++] = dptr;
        g->nodes++;
    }
    pthread_mutex_unlock(&lock);
    return r;
}

/* ---- modules and launches ---- */

CUresult cuModuleLoadData(CUmodule *module, const void *image)
{
    CUresult r = fake_need_context();
    if (r != CUDA_SUCCESS)
        return r;
    if (!module || !image)
        return CUDA_ERROR_INVALID_VALUE;
    if (!strstr(image, ".entry "))
        return CUDA_ERROR_INVALID_IMAGE;
    pthread_mutex_lock(&lock);
    struct module *m = FREE_ENTRY(modules);
    if (m)
        *m = (struct module){true, strdup(image)};
    pthread_mutex_unlock(&lock);
    *module = (CUmodule)m;
    return m ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

static struct module *module_of(CUmodule h)
{
    struct module *m = (struct module *)h;
    return m >= modules && m < modules + MAX_MODULES && m->alive ? m : NULL;
}

/* Whether the PTX text declares an entry called name. */
static bool declares(const char *text, const char *name)
{
    size_t len = strlen(name);
    for (const char *p = text; (p = strstr(p, ".entry ")); p++) {
        const char *n = p + 7;
        if (strncmp(n, name, len) == 0 && (n[len] == '(' || n[len] == ' ' || n[len] == '\n'))
            return true;
    }
    return false;
}

CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name)
{
    if (!hfunc || !name)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct module *m = module_of(hmod);
    bool found = m && declares(m->text, name);
    struct function *fn = found ? FREE_ENTRY(functions) : NULL;
    if (fn)
        *fn = (struct function){.alive = true, .module = m};
    pthread_mutex_unlock(&lock);
    *hfunc = (CUfunction)fn;
    return fn ? CUDA_SUCCESS
              : !m ? CUDA_ERROR_INVALID_HANDLE : found ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_ERROR_NOT_FOUND;
}

CUresult cuModuleUnload(CUmodule hmod)
{
    pthread_mutex_lock(&lock);
    struct module *m = module_of(hmod);
    if (m) {
        for (int i = 0; i < MAX_FUNCTIONS; i++)
            if (functions[i].module == m)
                functions[i] = (struct function){0};
        free(m->text);
        *m = (struct module){0};
    }
    pthread_mutex_unlock(&lock);
    return m ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

/* The checks of a kernel launch; its simulated time in *ns. */
static CUresult check_launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                             unsigned by, unsigned bz, void **params, int64_t *ns)
{
    CUresult r = fake_need_context();
    if (r != CUDA_SUCCESS)
        return r;
    struct function *fn = (struct function *)f;
    pthread_mutex_lock(&lock);
    bool live = fn >= functions && fn < functions + MAX_FUNCTIONS && fn->alive;
    pthread_mutex_unlock(&lock);
    if (!live)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!gx || !gy || !gz || !bx || !by || !bz || (uint64_t)bx * by * bz > 1024)
        return CUDA_ERROR_INVALID_VALUE;
    if (!params || !params[0])
        return CUDA_ERROR_INVALID_VALUE;
    *ns = (int64_t) * (const uint64_t *)params[0];
    return CUDA_SUCCESS;
}

static void spin_ns(int64_t ns)
{
    for (int64_t until = now_ns() + ns; now_ns() < until;)
        ;
}

/* The host's time in a launch call before its kernel reaches the device
 * (VCUDA_FAKE_LAUNCH_NS, default 0): the driver's own work, a thread
 * descheduled. A function's first launch call takes VCUDA_FAKE_FIRST_LAUNCH_NS
 * more (default 0): a driver that loads modules lazily loads the function's
 * code then. */
static void launch_call_time(struct function *fn)
{
    static int64_t each = -1, first = -1;
    if (each < 0) {
        each = number_from_env("VCUDA_FAKE_LAUNCH_NS", 0);
        first = number_from_env("VCUDA_FAKE_FIRST_LAUNCH_NS", 0);
    }
    spin_ns(each + (__atomic_exchange_n(&fn->launched, true, __ATOMIC_RELAXED) ? 0 : first));
}

/* The host's time in a launch call after its kernel reached the device
 * (VCUDA_FAKE_RETURN_NS, default 0), in one launch call in
 * VCUDA_FAKE_RETURN_EVERY (default 1): a thread descheduled once the driver
 * pushed the kernel returns while the kernel runs, or after it ended. */
static void return_time(void)
{
    static int64_t late = -1, every, calls;
    if (late < 0) {
        late = number_from_env("VCUDA_FAKE_RETURN_NS", 0);
        every = number_from_env("VCUDA_FAKE_RETURN_EVERY", 1);
    }
    if (__atomic_fetch_add(&calls, 1, __ATOMIC_RELAXED) % (every > 0 ? every : 1) == 0)
        spin_ns(late);
}

/* Whether stream h, or any stream, waits for a value (lock held). */
static bool waits(CUstream h, bool per_thread_default, bool any)
{
    for (int i = 0; any && i < MAX_STREAMS; i++)
        if (streams[i].alive && streams[i].wait)
            return true;
    struct stream *s = any ? NULL : stream_of(h, per_thread_default);
    return s && s->wait;
}

/* With VCUDA_FAKE_HELD_BLOCKS=1, a launch call on a stream that waits for a
 * value returns only once the value is written, as a driver's does when the
 * stream's queue is full. With 2 it keeps the driver's lock meanwhile, so
 * every other call of the process waits too, and cuStreamCreate does the
 * same while any stream waits (any): on an H100 it spun under the lock until
 * a held stream ran. */
static void block_while_held(CUstream h, bool per_thread_default, bool any)
{
    static int64_t blocks = -1;
    if (blocks < 0)
        blocks = number_from_env("VCUDA_FAKE_HELD_BLOCKS", 0);
    if (!blocks || (any && blocks < 2))
        return;
    pthread_mutex_lock(&lock);
    for (;;) {
        release_waits();
        if (!waits(h, per_thread_default, any))
            break;
        if (blocks == 1)
            pthread_mutex_unlock(&lock);
        nanosleep(&(struct timespec){0, 10000}, NULL);
        if (blocks == 1)
            pthread_mutex_lock(&lock);
    }
    pthread_mutex_unlock(&lock);
}

static CUresult launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                       unsigned by, unsigned bz, CUstream s, void **params, bool per_thread)
{
    int64_t ns;
    CUresult r = check_launch(f, gx, gy, gz, bx, by, bz, params, &ns);
    if (r != CUDA_SUCCESS)
        return r;
    launch_call_time((struct function *)f);
    block_while_held(s, per_thread, false);
    r = submit(s, per_thread, ns);
    return_time();
    return r;
}

static CUresult launch_ex(const CUlaunchConfig *c, CUfunction f, void **params, bool per_thread)
{
    if (!c)
        return CUDA_ERROR_INVALID_VALUE;
    return launch(f, c->gridDimX, c->gridDimY, c->gridDimZ, c->blockDimX, c->blockDimY,
                  c->blockDimZ, c->hStream, params, per_thread);
}

TWINS(cuLaunchKernel,
      (CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
       unsigned shared, CUstream s, void **params, void **extra),
      launch, f, gx, gy, gz, bx, by, bz, s, params)
TWINS(cuLaunchCooperativeKernel,
      (CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
       unsigned shared, CUstream s, void **params),
      launch, f, gx, gy, gz, bx, by, bz, s, params)
TWINS(cuLaunchKernelEx,
      (const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra),
      launch_ex, config, f, kernelParams)

/* A memset on a stream: work as a kernel is, a nanosecond a byte (as the
 * copies and memsets a program queues between its kernels are). */
static CUresult memset_async(CUdeviceptr dst, unsigned char value, size_t bytes, CUstream s,
                             bool per_thread)
{
    (void)value;
    CUresult r = fake_need_context();
    if (r != CUDA_SUCCESS)
        return r;
    if (!dst)
        return CUDA_ERROR_INVALID_VALUE;
    return submit(s, per_thread, (int64_t)bytes);
}

TWINS(cuMemsetD8Async, (CUdeviceptr dst, unsigned char value, size_t bytes, CUstream s),
      memset_async, dst, value, bytes, s)

/* ---- streams ---- */

CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags)
{
    CUresult r = fake_need_context();
    if (r != CUDA_SUCCESS)
        return r;
    if (!phStream || (Flags & ~CU_STREAM_NON_BLOCKING))
        return CUDA_ERROR_INVALID_VALUE;
    block_while_held(NULL, false, true);
    pthread_mutex_lock(&lock);
    struct stream *s = FREE_ENTRY(streams);
    if (s)
        *s = (struct stream){.alive = true, .blocking = !(Flags & CU_STREAM_NON_BLOCKING)};
    pthread_mutex_unlock(&lock);
    *phStream = (CUstream)s;
    return s ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

CUresult cuStreamDestroy_v2(CUstream hStream)
{
    pthread_mutex_lock(&lock);
    struct stream *s = hStream && hStream != CU_STREAM_LEGACY && hStream != CU_STREAM_PER_THREAD
                           ? stream_of(hStream, false) : NULL;
    if (s)
        s->alive = false;
    pthread_mutex_unlock(&lock);
    return s ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

/* When the work on stream h ends (after checking the call is allowed); -1 on error in *r. */
static int64_t stream_end(CUstream h, bool per_thread_default, CUresult *r)
{
    pthread_mutex_lock(&lock);
    release_waits();
    struct stream *s = stream_of(h, per_thread_default);
    int64_t end = -1;
    if (!s)
        *r = CUDA_ERROR_INVALID_HANDLE;
    else if (s->capture != CU_STREAM_CAPTURE_STATUS_NONE)
        *r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    else if ((*r = unsafe_call()) == CUDA_SUCCESS)
        end = s->wait ? HELD_AT : ready_at(s);
    pthread_mutex_unlock(&lock);
    return end;
}

static CUresult stream_synchronize(CUstream h, bool per_thread_default)
{
    CUresult r = fake_need_context();
    int64_t end = r == CUDA_SUCCESS ? stream_end(h, per_thread_default, &r) : -1;
    for (; end == HELD_AT; end = stream_end(h, per_thread_default, &r))
        sleep_until(end);
    if (end < 0)
        return r;
    sleep_until(end);
    fake_pools_synchronized();
    return CUDA_SUCCESS;
}

TWINS(cuStreamSynchronize, (CUstream hStream), stream_synchronize, hStream)

static CUresult stream_query(CUstream h, bool per_thread_default)
{
    CUresult r = fake_need_context();
    int64_t end = r == CUDA_SUCCESS ? stream_end(h, per_thread_default, &r) : -1;
    if (end < 0)
        return r;
    return end <= now_ns() ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

TWINS(cuStreamQuery, (CUstream hStream), stream_query, hStream)

CUresult cuCtxSynchronize(void)
{
    CUresult r = fake_need_context();
    if (r != CUDA_SUCCESS)
        return r;
    int64_t end;
    do {
        pthread_mutex_lock(&lock);
        release_waits();
        end = 0;
        r = unsafe_call();
        for (int i = 0; i < MAX_STREAMS && r == CUDA_SUCCESS; i++) {
            int64_t done = streams[i].wait ? HELD_AT : streams[i].tail;
            if (streams[i].alive && done > end)
                end = done;
        }
        pthread_mutex_unlock(&lock);
        if (r != CUDA_SUCCESS)
            return r;
        sleep_until(end);
    } while (end == HELD_AT);
    fake_pools_synchronized();
    return CUDA_SUCCESS;
}

/* ---- host memory the device reads, and streams that wait on it ---- */

#define MAX_HOST_BLOCKS 64

static struct host_block {
    bool alive;
    bool allocated;          /* by cuMemHostAlloc; else registered */
    char *p;
    size_t bytes;
} host_blocks[MAX_HOST_BLOCKS];

/* The block holding bytes at p (lock held), or NULL. */
static struct host_block *host_block_of(const void *p, size_t bytes)
{
    for (int i = 0; i < MAX_HOST_BLOCKS; i++) {
        struct host_block *b = &host_blocks[i];
        if (b->alive && (const char *)p >= b->p && (const char *)p + bytes <= b->p + b->bytes)
            return b;
    }
    return NULL;
}

/* What an allocation or registration of host memory checks first: a
 * context, the memory (or where it goes) named, a size, flags it knows. */
static CUresult host_memory_call(const void *p, size_t bytes, unsigned flags, unsigned known)
{
    CUresult r = fake_need_context();
    return r == CUDA_SUCCESS && (!p || !bytes || (flags & ~known)) ? CUDA_ERROR_INVALID_VALUE : r;
}

CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags)
{
    CUresult r = host_memory_call(pp, bytesize, Flags, CU_MEMHOSTALLOC_PORTABLE
                                  | CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED);
    if (r != CUDA_SUCCESS)
        return r;
    pthread_mutex_lock(&lock);
    struct host_block *b = FREE_ENTRY(host_blocks);
    char *p = b ? calloc(1, bytesize) : NULL;
    if (p)
        *b = (struct host_block){.alive = true, .allocated = true, .p = p, .bytes = bytesize};
    pthread_mutex_unlock(&lock);
    *pp = p;
    return p ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

/* The double keeps registrations for the process, not a context: a second
 * one of the same memory is refused as already registered, as the driver
 * refuses one in the same context. */
CUresult cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int Flags)
{
    CUresult r = host_memory_call(p, bytesize, Flags, CU_MEMHOSTREGISTER_PORTABLE
                                  | CU_MEMHOSTREGISTER_DEVICEMAP | CU_MEMHOSTREGISTER_IOMEMORY
                                  | CU_MEMHOSTREGISTER_READ_ONLY);
    if (r != CUDA_SUCCESS)
        return r;
    pthread_mutex_lock(&lock);
    struct host_block *b = NULL;
    if (host_block_of(p, 1) || host_block_of((char *)p + bytesize - 1, 1))
        r = CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    else if (!(b = FREE_ENTRY(host_blocks)))
        r = CUDA_ERROR_OUT_OF_MEMORY;
    else
        *b = (struct host_block){.alive = true, .p = p, .bytes = bytesize};
    pthread_mutex_unlock(&lock);
    return r;
}

CUresult cuMemHostUnregister(void *p)
{
    pthread_mutex_lock(&lock);
    struct host_block *b = host_block_of(p, 1);
    bool registered = b && !b->allocated && b->p == p;
    if (registered)
        b->alive = false;
    pthread_mutex_unlock(&lock);
    return registered ? CUDA_SUCCESS : CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
}

/* The device reads host memory at the host's address (unified addressing). */
CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *pdptr, void *p, unsigned int Flags)
{
    if (!pdptr || Flags)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    bool known = host_block_of(p, 1);
    pthread_mutex_unlock(&lock);
    *pdptr = known ? (CUdeviceptr)(uintptr_t)p : 0;
    return known ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuMemFreeHost(void *p)
{
    pthread_mutex_lock(&lock);
    struct host_block *b = host_block_of(p, 1);
    bool start = b && b->allocated && b->p == p;
    if (start) {
        free(b->p);
        b->alive = false;
    }
    pthread_mutex_unlock(&lock);
    return start ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* A wait the tests make fail: with VCUDA_FAKE_WAIT_ERROR=CODE, waits fail
 * with that CUresult, as a device without stream memory operations refuses
 * them (CUDA_ERROR_NOT_SUPPORTED, 801) or a driver out of memory fails a
 * call (CUDA_ERROR_OUT_OF_MEMORY, 2); VCUDA_FAKE_WAIT_ERRORS=N: only the
 * first N do (default: every one). */
static CUresult injected_wait_error(void)
{
    static int64_t code = -1, failed, errors;
    if (code < 0) {
        errors = number_from_env("VCUDA_FAKE_WAIT_ERRORS", INT64_MAX);
        code = number_from_env("VCUDA_FAKE_WAIT_ERROR", 0);
    }
    return code && __atomic_fetch_add(&failed, 1, __ATOMIC_RELAXED) < errors ? (CUresult)code
                                                                             : CUDA_SUCCESS;
}

/* The work queued on stream h from now on waits until the 32-bit value at
 * addr reaches value (GEQ, cyclic). The double waits on host memory only,
 * one address a stream at a time, and not in a capture. */
static CUresult wait_value(CUstream h, CUdeviceptr addr, cuuint32_t value, unsigned flags,
                           bool per_thread_default)
{
    CUresult r = fake_need_context();
    if (r == CUDA_SUCCESS)
        r = injected_wait_error();
    if (r != CUDA_SUCCESS)
        return r;
    if (flags != CU_STREAM_WAIT_VALUE_GEQ)
        return CUDA_ERROR_NOT_SUPPORTED;
    const uint32_t *wait = (const uint32_t *)(uintptr_t)addr;
    pthread_mutex_lock(&lock);
    release_waits();
    struct stream *s = stream_of(h, per_thread_default);
    bool captured;
    if (addr % sizeof *wait || !host_block_of(wait, sizeof *wait))
        r = CUDA_ERROR_INVALID_VALUE;
    else if ((r = work_on(s, &captured)) == CUDA_SUCCESS && captured)
        r = CUDA_ERROR_NOT_SUPPORTED;
    else if (r == CUDA_SUCCESS && s->wait && s->wait != wait)
        r = CUDA_ERROR_NOT_SUPPORTED;
    else if (r == CUDA_SUCCESS && !written(wait, value)) {
        if (!s->wait)
            s->unwritten_at = now_ns();
        if (!s->wait || (int32_t)(value - s->wait_for) > 0)
            s->wait_for = value;
        s->wait = wait;
    }
    pthread_mutex_unlock(&lock);
    return r;
}

TWINS(cuStreamWaitValue32_v2, (CUstream stream, CUdeviceptr addr, cuuint32_t value, unsigned flags),
      wait_value, stream, addr, value, flags)

/* ---- events ---- */

CUresult cuEventCreate(CUevent *phEvent, unsigned int Flags)
{
    const unsigned known = CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;
    CUresult r = fake_need_context();
    if (r != CUDA_SUCCESS)
        return r;
    if (!phEvent || (Flags & ~known)
        || ((Flags & CU_EVENT_INTERPROCESS) && !(Flags & CU_EVENT_DISABLE_TIMING)))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct event *e = FREE_ENTRY(events);
    if (e)
        *e = (struct event){.alive = true, .flags = Flags};
    pthread_mutex_unlock(&lock);
    *phEvent = (CUevent)e;
    return e ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

CUresult cuEventDestroy_v2(CUevent hEvent)
{
    pthread_mutex_lock(&lock);
    struct event *e = event_of(hEvent);
    if (e)
        e->alive = false;
    pthread_mutex_unlock(&lock);
    return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

static CUresult event_record(CUevent hEvent, CUstream hStream, bool per_thread_default)
{
    CUresult r = fake_need_context();
    if (r != CUDA_SUCCESS)
        return r;
    pthread_mutex_lock(&lock);
    release_waits();
    struct event *e = event_of(hEvent);
    struct stream *s = stream_of(hStream, per_thread_default);
    bool captured;
    if (!e || (r = work_on(s, &captured)) != CUDA_SUCCESS) {
        r = e ? r : CUDA_ERROR_INVALID_HANDLE;
    } else if (captured) {
        /* It marks the stream's place in the capture, for other streams to join. */
        records_in_capture++;
        e->captured = true;
    } else {
        *e = (struct event){.alive = true, .recorded = true, .flags = e->flags, .time = HELD_AT};
        records_run += s->wait || s->tail > now_ns();   /* it costs the device a moment */
        if (s->wait)
            r = hold_work(s, (struct held_work){.event = e});
        else
            place_event(e, s, reaches_device(), false);
    }
    pthread_mutex_unlock(&lock);
    return r;
}

TWINS(cuEventRecord, (CUevent hEvent, CUstream hStream), event_record, hEvent, hStream)

/* The time event h completes (0: no work recorded), after the call checks; -1 with *r on error. */
static int64_t event_time(CUevent h, CUresult *r)
{
    pthread_mutex_lock(&lock);
    release_waits();
    struct event *e = event_of(h);
    int64_t t = -1;
    if (!e)
        *r = CUDA_ERROR_INVALID_HANDLE;
    else if (e->captured)
        *r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    else if ((*r = unsafe_call()) == CUDA_SUCCESS)
        t = e->recorded ? e->time : 0;
    pthread_mutex_unlock(&lock);
    return t;
}

CUresult cuEventQuery(CUevent hEvent)
{
    CUresult r;
    int64_t t = event_time(hEvent, &r);
    if (t < 0)
        return r;
    return t <= now_ns() ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CUresult cuEventSynchronize(CUevent hEvent)
{
    CUresult r;
    int64_t t = event_time(hEvent, &r);
    for (; t == HELD_AT; t = event_time(hEvent, &r))
        sleep_until(t);
    if (t < 0)
        return r;
    sleep_until(t);
    return CUDA_SUCCESS;
}

CUresult cuEventElapsedTime(float *pMilliseconds, CUevent hStart, CUevent hEnd)
{
    if (!pMilliseconds)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    release_waits();
    struct event *a = event_of(hStart), *b = event_of(hEnd);
    int64_t now = now_ns();
    CUresult r = CUDA_SUCCESS;
    if (!a || !b || !a->recorded || !b->recorded
        || ((a->flags | b->flags) & CU_EVENT_DISABLE_TIMING))
        r = CUDA_ERROR_INVALID_HANDLE;
    else if (a->time > now || b->time > now)
        r = CUDA_ERROR_NOT_READY;
    else
        *pMilliseconds = (float)((double)(b->time - a->time) / 1e6);
    pthread_mutex_unlock(&lock);
    return r;
}

CUresult cuEventElapsedTime_v2(float *pMilliseconds, CUevent hStart, CUevent hEnd)
{
    return cuEventElapsedTime(pMilliseconds, hStart, hEnd);
}

/* ---- capture and graphs ---- */

CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode)
{
    if (!mode || *mode > CU_STREAM_CAPTURE_MODE_RELAXED)
        return CUDA_ERROR_INVALID_VALUE;
    CUstreamCaptureMode old = thread_mode;
    thread_mode = *mode;
    *mode = old;
    return CUDA_SUCCESS;
}

static CUresult begin_capture(CUstream h, CUstreamCaptureMode mode, bool per_thread_default)
{
    CUresult r = fake_need_context();
    if (r != CUDA_SUCCESS)
        return r;
    if (mode > CU_STREAM_CAPTURE_MODE_RELAXED)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct stream *s = stream_of(h, per_thread_default);
    struct graph *g = NULL;
    if (!s)
        r = CUDA_ERROR_INVALID_HANDLE;
    else if (s == LEGACY)
        r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    else if (s->capture != CU_STREAM_CAPTURE_STATUS_NONE)
        r = CUDA_ERROR_ILLEGAL_STATE;
    else if (!(g = new_graph(0, 0)))
        r = CUDA_ERROR_OUT_OF_MEMORY;
    else {
        s->capture = CU_STREAM_CAPTURE_STATUS_ACTIVE;
        s->mode = mode;
        s->capturer = pthread_self();
        s->graph = g;
    }
    pthread_mutex_unlock(&lock);
    return r;
}

TWINS(cuStreamBeginCapture_v2, (CUstream hStream, CUstreamCaptureMode mode), begin_capture,
      hStream, mode)

/* The CUDA 10.0 call: a capture in the global mode, the only one it had. */
static CUresult begin_global_capture(CUstream h, bool per_thread_default)
{
    return begin_capture(h, CU_STREAM_CAPTURE_MODE_GLOBAL, per_thread_default);
}

TWINS(cuStreamBeginCapture, (CUstream hStream), begin_global_capture, hStream)

static CUresult end_capture(CUstream h, CUgraph *phGraph, bool per_thread_default)
{
    if (!phGraph)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct stream *s = stream_of(h, per_thread_default);
    CUresult r = CUDA_SUCCESS;
    if (!s)
        r = CUDA_ERROR_INVALID_HANDLE;
    else if (s->capture == CU_STREAM_CAPTURE_STATUS_NONE)
        r = CUDA_ERROR_ILLEGAL_STATE;
    else if (s->mode != CU_STREAM_CAPTURE_MODE_RELAXED && !pthread_equal(s->capturer, pthread_self()))
        r = CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
    else {
        bool valid = s->capture == CU_STREAM_CAPTURE_STATUS_ACTIVE;
        if (!valid)
            s->graph->alive = false;
        *phGraph = valid ? (CUgraph)s->graph : NULL;
        s->capture = CU_STREAM_CAPTURE_STATUS_NONE;
        s->graph = NULL;
        r = valid ? CUDA_SUCCESS : CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    }
    pthread_mutex_unlock(&lock);
    return r;
}

TWINS(cuStreamEndCapture, (CUstream hStream, CUgraph *phGraph), end_capture, hStream, phGraph)

static CUresult is_capturing(CUstream h, CUstreamCaptureStatus *status, bool per_thread_default)
{
    if (!status)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    capture_queries++;
    struct stream *s = stream_of(h, per_thread_default);
    CUresult r = CUDA_SUCCESS;
    if (!s)
        r = CUDA_ERROR_INVALID_HANDLE;
    else if (s == LEGACY && blocking_capture())
        r = CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
    else
        *status = s->capture;
    pthread_mutex_unlock(&lock);
    return r;
}

TWINS(cuStreamIsCapturing, (CUstream hStream, CUstreamCaptureStatus *captureStatus),
      is_capturing, hStream, captureStatus)

CUresult cuGraphGetNodes(CUgraph hGraph, CUgraphNode *nodes, size_t *numNodes)
{
    if (!numNodes)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct graph *g = graph_of(hGraph);
    if (g && nodes)
        for (size_t i = 0; i < *numNodes && i < g->nodes; i++)
            nodes[i] = node_handle(g, (unsigned)i);
    if (g)
        *numNodes = g->nodes;
    pthread_mutex_unlock(&lock);
    return g ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph,
                                     unsigned long long flags)
{
    (void)flags;
    if (!phGraphExec)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct graph *g = graph_of(hGraph), *exec = g ? new_graph(0, 0) : NULL;
    if (exec) {
        *exec = *g;
        *phGraphExec = (CUgraphExec)exec;
    }
    pthread_mutex_unlock(&lock);
    return exec ? CUDA_SUCCESS : g ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_ERROR_INVALID_VALUE;
}

static CUresult destroy_graph(void *h)
{
    pthread_mutex_lock(&lock);
    struct graph *g = graph_of(h);
    if (g)
        g->alive = false;
    pthread_mutex_unlock(&lock);
    return g ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGraphDestroy(CUgraph hGraph) { return destroy_graph(hGraph); }

CUresult cuGraphExecDestroy(CUgraphExec hGraphExec) { return destroy_graph(hGraphExec); }

/* Backs exec's allocations (fake_graph_back) unless s captures it as a node
 * or an upload did (upload: this is one). */
static CUresult back(CUgraphExec h, CUstream s, bool per_thread_default, bool upload, int64_t *ns)
{
    CUresult r = fake_need_context();
    if (r != CUDA_SUCCESS)
        return r;
    pthread_mutex_lock(&lock);
    struct graph *exec = graph_of(h);
    struct graph copy = exec ? *exec : (struct graph){0};
    struct stream *st = stream_of(s, per_thread_default);
    bool into_capture = st && st->capture != CU_STREAM_CAPTURE_STATUS_NONE;
    if (exec && !into_capture)
        exec->uploaded = upload;
    pthread_mutex_unlock(&lock);
    if (copy.uploaded && !upload)
        copy.nallocs = 0;
    if (!exec)
        return CUDA_ERROR_INVALID_VALUE;
    *ns = copy.ns;
    uint64_t transient = 0, kept_bytes[MAX_GRAPH_ALLOCS];
    CUdeviceptr kept[MAX_GRAPH_ALLOCS];
    unsigned nkept = 0;
    for (unsigned i = 0; i < copy.nallocs; i++) {
        if (copy.alloc[i].freed) {
            transient += copy.alloc[i].bytes;
        } else {
            kept[nkept] = copy.alloc[i].address;
            kept_bytes[nkept++] = copy.alloc[i].bytes;
        }
    }
    return copy.nallocs && !into_capture ? fake_graph_back(transient, kept, kept_bytes, nkept)
                                         : CUDA_SUCCESS;
}

static CUresult graph_launch(CUgraphExec h, CUstream s, bool per_thread_default)
{
    int64_t ns = 0;
    CUresult r = back(h, s, per_thread_default, false, &ns);
    /* Launched into a capture, the whole graph becomes one (child graph) node. */
    return r == CUDA_SUCCESS ? submit(s, per_thread_default, ns) : r;
}

TWINS(cuGraphLaunch, (CUgraphExec hGraphExec, CUstream hStream), graph_launch, hGraphExec,
      hStream)

static CUresult graph_upload(CUgraphExec h, CUstream s, bool per_thread_default)
{
    int64_t ns;
    return back(h, s, per_thread_default, true, &ns);
}

TWINS(cuGraphUpload, (CUgraphExec hGraphExec, CUstream hStream), graph_upload, hGraphExec,
      hStream)

CUresult cuGraphInstantiateWithParams(CUgraphExec *phGraphExec, CUgraph hGraph,
                                      CUDA_GRAPH_INSTANTIATE_PARAMS *params)
{
    return cuGraphInstantiateWithFlags(phGraphExec, hGraph, params ? params->flags : 0);
}

CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *phGraphExec, CUgraph hGraph,
                                           CUDA_GRAPH_INSTANTIATE_PARAMS *params)
{
    return cuGraphInstantiateWithParams(phGraphExec, hGraph, params);
}

CUresult cuGraphInstantiate_v2(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode,
                               char *logBuffer, size_t bufferSize)
{
    return cuGraphInstantiateWithFlags(phGraphExec, hGraph, 0);
}

CUresult cuGraphCreate(CUgraph *phGraph, unsigned int flags)
{
    if (!phGraph || flags)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct graph *g = new_graph(0, 0);
    if (g)
        *phGraph = (CUgraph)g;
    pthread_mutex_unlock(&lock);
    return g ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

CUresult cuGraphAddMemAllocNode(CUgraphNode *phGraphNode, CUgraph hGraph,
                                const CUgraphNode *dependencies, size_t numDependencies,
                                CUDA_MEM_ALLOC_NODE_PARAMS *nodeParams)
{
    if (!phGraphNode || !nodeParams
        || nodeParams->poolProps.location.type != CU_MEM_LOCATION_TYPE_DEVICE
        || nodeParams->poolProps.location.id != fake_current_device())
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct graph *g = graph_of(hGraph);
    CUresult r = g ? add_alloc_node(g, nodeParams->bytesize, &nodeParams->dptr)
                   : CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS)
        *phGraphNode = node_handle(g, g->nallocs - 1);
    pthread_mutex_unlock(&lock);
    return r;
}

CUresult cuGraphNodeGetType(CUgraphNode hNode, CUgraphNodeType *type)
{
    unsigned i;
    pthread_mutex_lock(&lock);
    struct graph *g = node_of(hNode, &i);
    if (g && type)
        *type = i < g->nallocs               ? CU_GRAPH_NODE_TYPE_MEM_ALLOC
                : i < g->nallocs + g->nfrees ? CU_GRAPH_NODE_TYPE_MEM_FREE
                                             : CU_GRAPH_NODE_TYPE_KERNEL;
    pthread_mutex_unlock(&lock);
    return g && type ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGraphMemAllocNodeGetParams(CUgraphNode hNode, CUDA_MEM_ALLOC_NODE_PARAMS *params_out)
{
    unsigned i;
    pthread_mutex_lock(&lock);
    struct graph *g = node_of(hNode, &i);
    bool ok = g && params_out && i < g->nallocs;
    if (ok) {
        memset(params_out, 0, sizeof *params_out);
        params_out->poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
        params_out->poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        params_out->poolProps.location.id = fake_current_device();
        params_out->bytesize = g->alloc[i].bytes;
        params_out->dptr = g->alloc[i].address;
    }
    pthread_mutex_unlock(&lock);
    return ok ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGraphMemFreeNodeGetParams(CUgraphNode hNode, CUdeviceptr *dptr_out)
{
    unsigned i;
    pthread_mutex_lock(&lock);
    struct graph *g = node_of(hNode, &i);
    bool ok = g && dptr_out && i >= g->nallocs && i < g->nallocs + g->nfrees;
    if (ok)
        *dptr_out = g->free[i - g->nallocs];
    pthread_mutex_unlock(&lock);
    return ok ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* The double's graphs never hold child graphs. */
CUresult cuGraphChildGraphNodeGetGraph(CUgraphNode hNode, CUgraph *phGraph)
{
    return CUDA_ERROR_INVALID_VALUE;
}
