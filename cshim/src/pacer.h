/*
 * Launch pacing: holds a container to its share (cores) of each device's
 * time. Each paced launch waits while the device's bucket in the account is
 * in debt, then charges it the estimated GPU time of its kernel (estimate.h;
 * a kernel is known by its function and shape, a graph by its executable
 * graph). Launches are also timed by the shim's own events: around each
 * launch, or, for small kernels on one stream, around a run of launches in
 * a row, or, from a thread that launches slower than its kernels run, around
 * one launch in eight. A thread of the process reads the events as they
 * complete and charges the difference: the time the launches added to the
 * context's busy time on the device (the union over its streams), never much
 * more than the kernels' estimates, so that another process's time slice or
 * an idle device's start-up is not charged. Nothing is paced or recorded in
 * a capturing stream.
 */
#ifndef VC_PACER_H
#define VC_PACER_H

#include <stdbool.h>
#include <stdint.h>

#include "api.h"

/* One paced launch, from vc_pacer_begin to vc_pacer_end. */
struct vc_launch {
    struct vc_pacer_context *context;
    CUstream stream;
    bool ptsz;            /* a _ptsz call: stream 0 is the per-thread stream */
    bool guessed;         /* charged a guess: the kernel's cost was not trusted yet */
    bool timed;
    bool ends;            /* timed, and its record's end event goes right behind it */
    bool opened;          /* timed by a record it took, not by a run it joined */
    bool check;           /* drawn to be timed alone (see pacer_learn_check) */
    uint32_t record;      /* its timing record (or run), when timed */
    uint32_t hold;        /* the value its stream waits for before its start event; 0: none */
    int device;           /* in the account */
    uint64_t key;
    int64_t charged;      /* GPU ns */
};

/* Before a launch on stream of the kernel known by key: waits for the
 * device's bucket and charges it. False when the launch is not paced: no
 * core limit, no current context, a device without limits, or a stream that
 * is capturing (or whose capture status is an error, for the launch to
 * report). */
bool vc_pacer_begin(struct vc_launch *l, CUstream stream, bool ptsz, uint64_t key);

/* After the driver answered the launch: completes its timing, or gives its
 * charge back if it failed. Returns result. */
CUresult vc_pacer_end(struct vc_launch *l, CUresult result);

/* Before a context goes (destroyed; or a device's primary context released
 * or reset): the events recorded in it are forgotten. */
void vc_pacer_forget_context(CUcontext ctx);
void vc_pacer_forget_device(CUdevice ordinal);

/* fork: the child starts with no pacing thread and no events. */
void vc_pacer_before_fork(void);
void vc_pacer_after_fork_in_parent(void);
void vc_pacer_forked(void);

#endif
