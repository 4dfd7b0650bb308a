/*
 * Stream capture as the shim needs to know it: a launch or an allocation on a
 * capturing stream is recorded into a graph, not run, so it is neither paced
 * nor charged now. The driver is asked only while a capture begun in this
 * process may be open; the wrappers of the capture calls keep that count.
 * Asked at every launch, it was some 60 ns of a decoding loop's 0.6 us
 * launch wrapper on an H100.
 */
#ifndef VC_CAPTURE_H
#define VC_CAPTURE_H

#include <stdbool.h>

#include "api.h"

/* Stream's capture status, as cuStreamIsCapturing (_ptsz if ptsz) gives it;
 * CU_STREAM_CAPTURE_STATUS_NONE, without asking, while no capture is open. */
CUresult vc_capture_status(CUstream stream, bool ptsz, CUstreamCaptureStatus *status);

/* Whether stream is capturing (an error asking counts as not). */
bool vc_capturing(CUstream stream, bool ptsz);

#endif
