/* Counts the captures this process has open: launches outside any ask the driver nothing. */
#include "capture.h"

#include "driver.h"

/* Captures begun and not yet ended. Raised before a capture begins and
 * lowered after it ends, so that any launch into a capturing stream sees it
 * raised; a begin that fails gives its count back. */
static long open_captures;

static CUresult begun(CUresult r)
{
    if (r != CUDA_SUCCESS)
        __atomic_sub_fetch(&open_captures, 1, __ATOMIC_SEQ_CST);
    return r;
}

#define BEGIN(call) (__atomic_add_fetch(&open_captures, 1, __ATOMIC_SEQ_CST), begun(call))

/* An invalidated capture ends as well, without a graph; any other error (the
 * wrong thread, a stream that did not begin it) leaves it open. */
static CUresult ended(CUresult r)
{
    if (r == CUDA_SUCCESS || r == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED)
        __atomic_sub_fetch(&open_captures, 1, __ATOMIC_SEQ_CST);
    return r;
}

CUresult vc_capture_status(CUstream stream, bool ptsz, CUstreamCaptureStatus *status)
{
    if (!__atomic_load_n(&open_captures, __ATOMIC_SEQ_CST)) {
        *status = CU_STREAM_CAPTURE_STATUS_NONE;
        return CUDA_SUCCESS;
    }
    return ptsz ? vc_real_cuStreamIsCapturing_ptsz(stream, status)
                : vc_real_cuStreamIsCapturing(stream, status);
}

bool vc_capturing(CUstream stream, bool ptsz)
{
    CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
    return vc_capture_status(stream, ptsz, &status) == CUDA_SUCCESS
           && status != CU_STREAM_CAPTURE_STATUS_NONE;
}

/* The CUDA 10.0 form, without a mode. */
CUresult CUDAAPI cuStreamBeginCapture(CUstream hStream)
{
    return BEGIN(vc_real_cuStreamBeginCapture(hStream));
}

CUresult CUDAAPI cuStreamBeginCapture_ptsz(CUstream hStream)
{
    return BEGIN(vc_real_cuStreamBeginCapture_ptsz(hStream));
}

CUresult CUDAAPI cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode)
{
    return BEGIN(vc_real_cuStreamBeginCapture_v2(hStream, mode));
}

CUresult CUDAAPI cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode)
{
    return BEGIN(vc_real_cuStreamBeginCapture_v2_ptsz(hStream, mode));
}

CUresult CUDAAPI cuStreamBeginCaptureToGraph VC_BEGIN_TO_GRAPH_PARAMS
{
    return BEGIN(vc_real_cuStreamBeginCaptureToGraph VC_BEGIN_TO_GRAPH_ARGS);
}

CUresult CUDAAPI cuStreamBeginCaptureToGraph_ptsz VC_BEGIN_TO_GRAPH_PARAMS
{
    return BEGIN(vc_real_cuStreamBeginCaptureToGraph_ptsz VC_BEGIN_TO_GRAPH_ARGS);
}

CUresult CUDAAPI cuStreamEndCapture(CUstream hStream, CUgraph *phGraph)
{
    return ended(vc_real_cuStreamEndCapture(hStream, phGraph));
}

CUresult CUDAAPI cuStreamEndCapture_ptsz(CUstream hStream, CUgraph *phGraph)
{
    return ended(vc_real_cuStreamEndCapture_ptsz(hStream, phGraph));
}
