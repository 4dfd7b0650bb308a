/*
 * The diagnostic build's windows (make diag, never installed): with
 * VCUDA_PACE_WINDOW_MS=N set, launches in the even N ms windows of
 * CLOCK_MONOTONIC go unpaced, so one process measures its own rate paced and
 * unpaced, free of the spread between processes (scripts/bench-paced-windows).
 * In the library itself there are no such windows: the pod's environment is
 * the tenant's, and never a way out of its limit.
 */
#ifndef VC_PACE_WINDOWS_H
#define VC_PACE_WINDOWS_H

#include <stdbool.h>

#ifdef VC_PACE_WINDOWS
bool vc_unpaced_window(void);
#else
static inline bool vc_unpaced_window(void) { return false; }
#endif

#endif
