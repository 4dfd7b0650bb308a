/* Runs once, at the first CUDA or NVML call: nothing happens in a process that makes none. */
#define _GNU_SOURCE
#include "setup.h"

#include <stdio.h>

#include "account.h"
#include "context.h"
#include "driver.h"
#include "graphs.h"
#include "log.h"
#include "pacer.h"
#include "pools.h"
#include "track.h"

pthread_mutex_t vc_local_lock = PTHREAD_MUTEX_INITIALIZER;

static pthread_once_t once = PTHREAD_ONCE_INIT;
static enum vc_mode mode;
static struct vc_limits limits;
static struct vc_region *region;

static void before_fork(void)
{
    pthread_mutex_lock(&vc_local_lock);
    vc_pacer_before_fork();
}

static void after_fork_in_parent(void)
{
    vc_pacer_after_fork_in_parent();
    pthread_mutex_unlock(&vc_local_lock);
}

/* The child is a new process: none of the parent's allocations, contexts or
 * account slot are its own. */
static void after_fork_in_child(void)
{
    pthread_mutex_init(&vc_local_lock, NULL);
    vc_account_forked();
    vc_track_forked();
    vc_pools_forked();
    vc_graphs_forked();
    vc_contexts_forked();
    vc_pacer_forked();
}

static void set_up(void)
{
    char path[PATH_MAX], err[PATH_MAX + 256];
    switch (vc_limits_load(&limits, path, sizeof path, err, sizeof err)) {
    case VC_LIMITS_NONE:
        vc_log(VC_LOG_INFO, "no limits file (%s, $%s): not limiting", VC_LIMITS_CONTAINER_PATH,
               VC_LIMITS_ENV);
        mode = VC_OFF;
        return;
    case VC_LIMITS_BROKEN:
        vc_log(VC_LOG_ERROR, "%s; CUDA is refused until the limits file is fixed", err);
        mode = VC_BROKEN;
        return;
    case VC_LIMITS_FOUND:
        break;
    }
    region = vc_region_open(limits.account, err, sizeof err);
    if (!region) {
        vc_log(VC_LOG_ERROR, "%s; CUDA is refused until the account is usable", err);
        mode = VC_BROKEN;
        return;
    }
    pthread_atfork(before_fork, after_fork_in_parent, after_fork_in_child);
    vc_log(VC_LOG_INFO, "limits from %s: memory=%llu bytes on %s, account %s", path,
           (unsigned long long)limits.memory, limits.ndevices ? "the listed devices" : "every device",
           *limits.account ? limits.account : "private to this process and its children");
    if (limits.cores < 100)
        vc_log(VC_LOG_INFO, "cores=%u: kernel launches are paced to %u%% of each device's time",
               limits.cores, limits.cores);
    mode = VC_ON;
}

enum vc_mode vc_mode(void)
{
    pthread_once(&once, set_up);
    return mode;
}

bool vc_pacing(void) { return vc_mode() == VC_ON && limits.cores < 100; }

const struct vc_limits *vc_limits(void) { return &limits; }

struct vc_region *vc_region(void) { return region; }

/* Every CUDA program calls cuInit first: the place to refuse CUDA outright
 * when a limits file exists but cannot be honoured. */
CUresult CUDAAPI cuInit(unsigned int Flags)
{
    return vc_mode() == VC_BROKEN ? CUDA_ERROR_NOT_PERMITTED : vc_real_cuInit(Flags);
}
