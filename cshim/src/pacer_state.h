/*
 * The pacer's private state, shared by its files (not part of the library's
 * interface): its limits, the structures it keeps and the one hidden state
 * they live in, guarded by pacer.lock. The pacer is split by concern:
 *
 *   pacer.c          the entry points: launches, contexts that go, fork;
 *   pacer_charge.c   the bucket: charging GPU time, waiting for it;
 *   pacer_kernels.c  each kernel's cost, learned from its timed launches;
 *   pacer_records.c  timing records: one launch, or a run of launches;
 *   pacer_thread.c   the thread that reads the records' events and charges
 *                    what each record's launches really took;
 *   pacer_slices.c   the time a context spent without the device, during
 *                    other processes' time slices, which it is not charged;
 *   pacer_watch.c    the thread that lets a held stream go when its holder
 *                    does not.
 */
#ifndef VC_PACER_STATE_H
#define VC_PACER_STATE_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "devices.h"
#include "estimate.h"
#include "pacer.h"

#define MAX_CONTEXTS 8
#define KERNELS 1024            /* estimates kept, by key */
#define HOME_SPAN 16            /* the entries from a key's home where it may be kept */
#define RECORDS 1024            /* timed launches not read yet, in launch order */
#define EVENTS 1024             /* per context: one per record */
#define EVENTS_LOW 64           /* the thread adds events to a context below this */
#define EVENTS_BATCH 256
#define REFS 4                  /* reference events per context, by generation */
#define AWAYS 64                /* per context: the latest spans it spent away from the device */
#define AWAY_MIN_NS 50000       /* a probe this late found the device away (see pacer_slices.c) */
#define LANES 64                /* streams whose last launch end a context remembers */
#define REBASE_NS 500000000LL   /* a new reference this often: float ms stay exact to 0.1 us */
#define REF_SLOP_NS 30000       /* a reference must complete this soon to place launches */
#define BATCH 256               /* records the thread reads at a time */
#define FIRST_GUESS_NS 100000   /* charged for a kernel never measured, before any other was */
#define TRUSTED 4               /* timed launches after which a kernel's cost is trusted */
#define SMALL_NS 200000         /* a kernel shorter than this is timed in runs */
#define ONE_STREAM 64           /* ... when the process's last launches all went to one stream */
#define RUN 32                  /* the most launches a run times with one pair of events */
#define SAMPLE 8                /* a thread behind its device times one launch in this many */
#define KNOWN 64                /* ... of a kernel with fewer samples, else one in KNOWN_SAMPLE */
#define KNOWN_SAMPLE 128
#define CHECK 128               /* one launch in this many, at random, is timed alone, start to end */
#define CHECK_WEIGHT 16         /* each weighs 1 / this in what a kernel's launches take, */
#define VARYING_WEIGHT 512      /* ... or 1 / this where all are timed (pacer_learn_check) */
#define VARYING_PERCENT 25      /* a kernel whose launches take this much more than its */
#define VARYING_SLACK_NS 2000   /* ... estimate, and this (an event's moment), varies */
#define QUEUED_NS 2000          /* a kernel this soon after its stream's last one queued behind it */
#define LATE_RETURN_NS 50000    /* a launch call returning this long after its start event ran was held */
#define HOLD_STALE_NS 1000000   /* a stream held this long is let go by the watch */
#define HOLDING_NS 100000000    /* streams held this lately: the watch looks, unasked */
#define PAIR_TRIES 8            /* held pairs of events timed to know what events take */
#define HELD_PAIR_PERCENT 50    /* of that, taken off a held record: see charge_record() */
#define RUN_STALE_NS 20000000   /* a run this long past its projected end is given up */
#define OVER_PERCENT 25         /* a launch is charged at most this much over its estimate */
#define RUN_OVER_PERCENT 10     /* ... in a run, whose mean time strays less than one's */
#define UNSTEADY_OVER_PERCENT 300 /* ... a kernel that is not steady: 4x its estimate */
#define TICK_NS 1000000         /* the thread reads completed events this often */
#define BESIDE_TICK_NS 250000   /* ... beside a busy neighbour, to see its slices sooner */
#define BESIDE_NS 100000000     /* beside one: its slice found this lately */
#define NAP_NS 20000000         /* a waiting launch looks at the bucket again this often */
#define REPORT_NS 1000000000LL  /* the thread logs each device's share this often (info) */
/* A thread behind its device draws its checks among its samples. */
_Static_assert(CHECK % SAMPLE == 0 && CHECK % KNOWN_SAMPLE == 0, "CHECK / a sample rate");

/* A reference event on the context's own stream, idle so it completes as soon
 * as it is recorded: a point of the context's timeline, and of the clock. */
struct ref {
    CUevent event;
    int64_t offset;             /* ns from the first reference */
    int64_t recorded;           /* vc_clock_ns() once it was seen complete */
};

/* A stream, as the thread saw it last. */
struct lane {
    uint64_t stream;            /* pacer_stream_key(); 0: none */
    int64_t end;                /* where its last timed launch ended on the timeline */
};

/* A span of a context's timeline. */
struct span {
    int64_t from, to;
};

/* The thread's event on a context's own stream that finds it away from the
 * device (pacer_slices.c). */
struct probe {
    CUevent event;
    bool pending;               /* recorded, not seen complete yet */
    int64_t generation;         /* the reference it is placed against */
    int64_t recorded;           /* vc_clock_ns() once its record call returned */
};

struct vc_pacer_context {
    CUcontext ctx;              /* NULL: a free entry */
    CUdevice ordinal;
    int device;                 /* in the account; -1: a device without limits */
    unsigned created, nfree;
    int64_t published;          /* the newest complete reference; -1: none yet */
    int64_t published_at;       /* when it was recorded */
    bool holds;                 /* its launches may hold their streams on its word */
    uint32_t held;              /* the last value a launch's stream waits for */
    int64_t held_at;            /* when */
    /* The thread's own, touched without the lock while it reads: */
    CUstream own;               /* a non-blocking stream for the references */
    CUdeviceptr flag_at;        /* pacer_flag()'s device address; 0: none, no holds */
    int64_t pair_ns;            /* a held pair of events with nothing between takes this */
    bool broken;                /* no stream or references: no timeline */
    struct ref refs[REFS];
    int64_t complete;           /* the newest reference; -1: none yet */
    int64_t recorded_at;        /* when it was recorded */
    int64_t covered;            /* the context is known busy up to here on its timeline */
    struct probe probe;
    struct span away[AWAYS];    /* a ring, newest last: spans another process had the device */
    uint32_t naway;             /* spans found */
    struct lane lanes[LANES];
    CUevent free[EVENTS];
};

/* What each launch reads comes first, next to its estimate's figures. */
struct kernel {
    uint64_t key;               /* 0: a free entry */
    int64_t cost;               /* what its timed launches were charged, lately (pacer_learn_cost) */
    int64_t launched;           /* its last launch (clock): the least recent makes room */
    uint32_t costs;             /* timed launches charged */
    int device;
    uint32_t untimed_guesses;   /* launches charged a guess and not timed: corrected */
    int64_t untimed_guess_ns;   /* once the cost is trusted */
    int64_t checked;            /* what its launches timed alone took, lately (a moving average) */
    bool varies;                /* ... far more than its estimate (pacer_learn_check) */
    struct vc_estimate estimate;
    int64_t first[TRUSTED];     /* what its first timed launches were charged, lowest first */
};

enum record_state { OPEN, ENDED, VOID };

/* The timing of one launch, or of a run: launches in a row on one stream,
 * timed together. */
struct record {
    struct vc_pacer_context *context;   /* NULL: its context is gone */
    CUevent start;              /* NULL, or recorded right before the (first) launch */
    CUevent end;                /* recorded right after the (last) launch */
    uint64_t stream;            /* pacer_stream_key() of its stream */
    uint64_t key;
    int device;
    int64_t generation;         /* the reference it is placed against; -1: none */
    int64_t charged;            /* what its launches were charged up front */
    int64_t submitted;          /* vc_clock_ns() when the (first) launch call returned */
    int64_t cap;                /* the most it is charged: a little over the estimates */
    uint32_t seq;               /* its number: a run's owner knows it by it */
    uint32_t launches;          /* it times; 0: a single launch, not a run */
    bool mixed;                 /* a run of several kernels: no one kernel's time */
    bool one_stream;            /* launched while the process launched on one stream */
    bool late;                  /* a run whose end event came after its kernels ran (see pacer.c) */
    bool overtaken;             /* a run behind which another thread's launch queued */
    bool held;                  /* its stream was held until its launch call returned */
    bool check;                 /* a launch drawn at random, or of a kernel timed at every launch */
    int64_t estimated;          /* its kernels' estimates added up */
    int64_t drained;            /* a run: when its launches' kernels should be done (clock) */
    enum record_state state;
};

/* The run this thread is adding its launches to, if open; the stream whose
 * run its last launch filled and ended, if any; and the stream of its last
 * launch, with when that launch's kernels should be done there. */
struct thread_run {
    bool open;
    uint32_t seq;
    struct vc_pacer_context *context;
    uint64_t stream;
    uint64_t filled;
    uint64_t launched;
    int64_t drained;
};

/* What the pacer did in this process, logged at exit (info): how its
 * launches were timed, how long they waited, what they were charged up
 * front and how much the timed records corrected that, the other
 * processes' time slices it found, the samples held back from a floor, and
 * the records left unsampled as their launch call returned late (and the
 * latest return). */
struct pacer_tally {
    uint64_t launches, alone, in_runs, untimed, waits, slices, held_back, late_returns;
    int64_t waited_ns, up_front_ns, corrected_ns, away_ns, latest_return_ns;
};

/* Everything the pacer's files share, guarded by lock, which is never held
 * across a driver call. */
struct pacer_shared {
    pthread_mutex_t lock;
    pthread_cond_t wake;                    /* work for the thread */
    pthread_cond_t idle;                    /* the thread stopped reading */
    pthread_cond_t held;                    /* a stream was held: for the watch */
    struct vc_pacer_context contexts[MAX_CONTEXTS];
    struct kernel kernels[KERNELS];
    struct record records[RECORDS];
    uint32_t head, tail;                    /* records head..tail-1 are in use, in launch order */
    bool started, stopping, reading;
    bool watched;                           /* the watch runs: streams may be held */
    bool watch_asleep;                      /* the watch waits to be told of a hold */
    int64_t last_hold;                      /* when a stream was last held */
    bool forgot;                            /* a context went: the thread's one may be gone */
    int64_t typical_ns;                     /* the guess for a kernel not trusted yet */
    uint64_t last_stream;                   /* pacer_stream_key() of the process's last launch */
    uint32_t same_stream;                   /* launches in a row on it */
    uint32_t last_run;                      /* the run a launch last opened or joined */
    int64_t slice_found;                    /* the thread's: when it last found another process's slice */
    uint64_t draws;                         /* the state of pacer_one_in(); 0: not seeded */
    uint64_t last_gpu_ns[VC_MAX_DEVICES];   /* each device's GPU time at the last report */
    unsigned read_lately;                   /* launches read since the last report */
    struct pacer_tally tally;
};

extern struct pacer_shared pacer;
/* Initial-exec, as the library is loaded at start-up (ld.so.preload or
 * LD_PRELOAD): a launch reads it without a call to find it. */
extern __thread struct thread_run thread_run __attribute__((tls_model("initial-exec")));

/* Each context entry's word that its held streams wait on, a page of the
 * library's own: registered with each context that takes the entry, and
 * never freed, so a launch that lets its stream go after its context went
 * writes to memory that is still there. */
#define FLAG_BYTES 4096
extern uint32_t pacer_flags[MAX_CONTEXTS][FLAG_BYTES / sizeof(uint32_t)];

static inline uint32_t *pacer_flag(const struct vc_pacer_context *c)
{
    return pacer_flags[c - pacer.contexts];
}

/* pacer_charge.c */
void pacer_nap(int64_t ns);
/* Charges gpu_ns to device at now (vc_clock_ns(): a launch passes the one it read). */
void pacer_charge(int device, int64_t now, int64_t gpu_ns);
void pacer_wait(int device, int64_t wait);

/* Whether the thread found another process's time slice lately (the thread's). */
static inline bool pacer_beside(int64_t now) { return now - pacer.slice_found < BESIDE_NS; }

/* ns and percent more: the most a launch is charged over an estimate. */
static inline int64_t pacer_over(int64_t ns, int64_t percent) { return ns + ns * percent / 100; }

/* When work of ns queued at now on a stream is done there, behind what was
 * queued before it and should be done at drained. */
static inline int64_t pacer_drains(int64_t drained, int64_t now, int64_t ns)
{
    return (drained > now ? drained : now) + ns;
}

/* pacer_kernels.c (lock held) */
struct kernel *pacer_kernel(uint64_t key);
struct kernel *pacer_claim_kernel(uint64_t key, int device, int64_t now);
int64_t pacer_estimate(const struct kernel *k);
int64_t pacer_up_front(const struct kernel *k);
int64_t pacer_cap(const struct kernel *k, int64_t percent);
void pacer_learn_cost(struct kernel *k, int64_t cost, bool first_sample);
void pacer_learn_check(struct kernel *k, int64_t each);
void pacer_remember_guess(const struct vc_launch *l);

/* Lets the streams waiting for values up to value go: the flag only moves
 * forward (cyclically, as the device compares). Any thread, lock or not. */
static inline void pacer_release(uint32_t *flag, uint32_t value)
{
    uint32_t old = __atomic_load_n(flag, __ATOMIC_RELAXED);
    while ((int32_t)(value - old) > 0
           && !__atomic_compare_exchange_n(flag, &old, value, true, __ATOMIC_RELEASE,
                                           __ATOMIC_RELAXED))
        ;
}

/* pacer_records.c (lock held) */
bool pacer_one_in(uint32_t n);
uint64_t pacer_stream_key(CUstream stream, bool ptsz);
struct record *pacer_open_run(void);
bool pacer_joins_run(const struct vc_launch *l, const struct kernel *k, uint64_t stream,
                     int64_t now);
bool pacer_plan_timing(struct vc_launch *l, struct kernel *k, bool waited, int64_t now);
void pacer_close_locked(uint32_t seq, struct vc_pacer_context *context, enum record_state state);

/* pacer_thread.c */
void pacer_start_thread(void);
/* The thread's, outside the lock: whether event, placed against c's
 * reference of generation, completed (then *ref is that reference, or NULL
 * if the event failed or the reference is gone); where on c's timeline an
 * event completed by a reference (-1 if unknown), and a moment of the
 * clock, lie. */
bool pacer_event_done(const struct vc_pacer_context *c, CUevent event, int64_t generation,
                      const struct ref **ref);
int64_t pacer_event_at(const struct ref *ref, CUevent event);
static inline int64_t pacer_clock_at(const struct ref *ref, int64_t clock)
{
    return ref->offset + (clock - ref->recorded);
}

/* pacer_slices.c (the thread's, outside the lock but while it reads) */
void pacer_probe(struct vc_pacer_context *c);
int64_t pacer_away(struct vc_pacer_context *c, int64_t from, int64_t to);

/* pacer_watch.c (lock held, but pacer_start_watch) */
bool pacer_holding(const struct vc_pacer_context *c);
void pacer_hold(struct vc_pacer_context *c, uint32_t value, int64_t now);
bool pacer_start_watch(void);

#endif
