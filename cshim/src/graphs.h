/*
 * Memory of CUDA graphs' allocation nodes (captured stream-ordered
 * allocations, cuGraphAddMemAllocNode). The driver backs them with physical
 * memory when an executable graph is first uploaded or launched, from a
 * per-device graph memory reservation it reports itself
 * (cuDeviceGetGraphMemAttribute, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT):
 * that reservation is what is charged, read back after each upload or
 * launch. A graph's first upload or launch is charged up front what backing
 * it may add: the allocations it keeps (not freed by a free node of the
 * graph), and those it frees itself beyond the reservation that no kept
 * allocation holds (the driver reuses that memory, as measured on an H100).
 * One that does not fit fails with CUDA_ERROR_OUT_OF_MEMORY and the driver
 * never backs it.
 */
#ifndef VC_GRAPHS_H
#define VC_GRAPHS_H

#include <stdbool.h>
#include <stdint.h>

#include "api.h"

#define VC_GRAPH_PARTS 4

/* What a graph allocates on one device. */
struct vc_graph_part {
    const struct vc_device *device;
    CUdevice ordinal;
    uint64_t kept;        /* bytes of allocations the graph does not free */
    uint64_t transient;   /* bytes of allocations it frees itself */
    uint64_t charged;     /* up front, by an upload or launch in flight */
};

/* One upload or launch of an executable graph in flight. */
struct vc_graph_op {
    int nparts;
    struct vc_graph_part part[VC_GRAPH_PARTS];
    CUgraphExec exec;
};

/* Before uploading or launching exec on stream: charges what backing its
 * allocation nodes may take. CUDA_ERROR_OUT_OF_MEMORY when it does not fit. */
CUresult vc_graph_begin(struct vc_graph_op *op, CUgraphExec exec, CUstream stream, bool ptsz);

/* After the driver's call with its result: the charge becomes the driver's
 * reservation; returns result. */
CUresult vc_graph_end(struct vc_graph_op *op, CUresult result);

/* Re-reads the graph memory reservation of every device that has some. */
void vc_graphs_refresh(void);

/* In a forked child: the parent's graphs are not ours. */
void vc_graphs_forked(void);

#endif
