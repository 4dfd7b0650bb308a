/* Lazy set-up at the first CUDA or NVML call: limits, shared account, fork handlers. */
#ifndef VC_SETUP_H
#define VC_SETUP_H

#include <pthread.h>
#include <stdbool.h>

#include "limits_file.h"
#include "region.h"

enum vc_mode {
    VC_OFF,     /* no limits file: every call goes straight to the driver */
    VC_ON,      /* limits in force */
    VC_BROKEN,  /* a limits file exists but cannot be honoured: CUDA is refused */
};

/* Runs the set-up once (the first caller does the work) and tells its outcome. */
enum vc_mode vc_mode(void);

/* Whether kernel launches are paced: limits in force with cores below 100. */
bool vc_pacing(void);

/* The limits and the shared account; only valid when vc_mode() is VC_ON. */
const struct vc_limits *vc_limits(void);
struct vc_region *vc_region(void);

/* Guards the per-process tables (tracked allocations, pools, contexts,
 * devices). Never held across a call that can block. Reset in a forked child. */
extern pthread_mutex_t vc_local_lock;

#endif
