/*
 * Contexts: a context's own memory (code, stacks, heaps the driver reserves
 * for it) counts against the limit. It is measured as the change in the
 * device's used memory that NVML reports across the driver's call, with
 * context creation serialized across the container's processes. A context
 * that does not fit fails with CUDA_ERROR_OUT_OF_MEMORY: what the container
 * holds on the device never passes the limit.
 */
#ifndef VC_CONTEXT_H
#define VC_CONTEXT_H

/* In a forked child: the parent's contexts are not ours. */
void vc_contexts_forked(void);

#endif
