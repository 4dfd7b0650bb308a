/* Charges CUDA graphs' allocation nodes as the driver backs them (graphs.h). */
#define _GNU_SOURCE
#include "graphs.h"

#include <stdlib.h>
#include <string.h>

#include "account.h"
#include "capture.h"
#include "devices.h"
#include "driver.h"
#include "log.h"
#include "memory.h"
#include "setup.h"

/* Child graphs nest; deeper than this is not looked into. */
#define MAX_DEPTH 8

/* An executable graph with allocation nodes on limited devices. */
struct exec {
    CUgraphExec handle;
    bool backed;              /* uploaded or launched since made (or since a trim) */
    struct vc_graph_op need;  /* the bytes of its allocation nodes, per device */
};

/* Guarded by vc_local_lock. */
static struct exec *execs;
static size_t nexecs, capacity;
/* A device's graph memory, by account index: its ordinal here, what is charged
 * for it (the driver's reservation), and how much of it allocations that
 * graphs kept may hold (never less than they do: their frees are not seen,
 * so it only shrinks to the reservation at a trim). */
static struct {
    bool seen;
    CUdevice ordinal;
    uint64_t charged;
    uint64_t kept;
} reservation[VC_MAX_DEVICES];
/* nexecs, read without the lock: a launch of a process with no such graph costs nothing. */
static size_t tracked;

/* Adds an allocation node of bytes on ordinal to need (freed: by the graph). */
static void add_node(struct vc_graph_op *need, CUdevice ordinal, uint64_t bytes, bool freed)
{
    const struct vc_device *d = vc_device_of(ordinal);
    if (!d)
        return;
    int i = 0;
    while (i < need->nparts && need->part[i].ordinal != ordinal)
        i++;
    if (i == VC_GRAPH_PARTS) {
        /* Never seen: no graph spans this many devices; counted on the last one. */
        vc_log(VC_LOG_ERROR, "a graph allocates on more than %d devices", VC_GRAPH_PARTS);
        i--;
    } else if (i == need->nparts) {
        need->part[need->nparts++] = (struct vc_graph_part){.device = d, .ordinal = ordinal};
    }
    if (freed)
        need->part[i].transient += bytes;
    else
        need->part[i].kept += bytes;
}

/* A graph's nodes, children's included: its allocations and what it frees. */
struct nodes {
    size_t nallocs, nfrees;
    CUDA_MEM_ALLOC_NODE_PARAMS *allocs;
    CUdeviceptr *frees;
};

static bool append(void **array, size_t *n, size_t size, const void *item)
{
    if ((*n & (*n - 1)) == 0) {   /* a power of two (or 0): full */
        void *grown = realloc(*array, (*n ? 2 * *n : 1) * size);
        if (!grown)
            return false;
        *array = grown;
    }
    memcpy((char *)*array + (*n)++ * size, item, size);
    return true;
}

/* Collects the allocation and free nodes of graph and its children into found. */
static bool collect(CUgraph graph, struct nodes *found, int depth)
{
    size_t n = 0;
    if (depth > MAX_DEPTH || vc_real_cuGraphGetNodes(graph, NULL, &n) != CUDA_SUCCESS)
        return false;
    CUgraphNode *nodes = n ? calloc(n, sizeof *nodes) : NULL;
    bool ok = !n || (nodes && vc_real_cuGraphGetNodes(graph, nodes, &n) == CUDA_SUCCESS);
    for (size_t i = 0; ok && i < n; i++) {
        CUgraphNodeType type;
        CUDA_MEM_ALLOC_NODE_PARAMS alloc;
        CUdeviceptr freed;
        CUgraph child;
        if (vc_real_cuGraphNodeGetType(nodes[i], &type) != CUDA_SUCCESS)
            continue;
        if (type == CU_GRAPH_NODE_TYPE_MEM_ALLOC)
            ok = vc_real_cuGraphMemAllocNodeGetParams(nodes[i], &alloc) == CUDA_SUCCESS
                 && append((void **)&found->allocs, &found->nallocs, sizeof alloc, &alloc);
        else if (type == CU_GRAPH_NODE_TYPE_MEM_FREE)
            ok = vc_real_cuGraphMemFreeNodeGetParams(nodes[i], &freed) == CUDA_SUCCESS
                 && append((void **)&found->frees, &found->nfrees, sizeof freed, &freed);
        else if (type == CU_GRAPH_NODE_TYPE_GRAPH)
            ok = vc_real_cuGraphChildGraphNodeGetGraph(nodes[i], &child) == CUDA_SUCCESS
                 && collect(child, found, depth + 1);
    }
    free(nodes);
    return ok;
}

/* The bytes graph's allocation nodes need on each limited device. */
static void walk(CUgraph graph, struct vc_graph_op *need)
{
    struct nodes found = {0};
    if (!collect(graph, &found, 0))
        /* Counted as kept, whatever was found: the safe side. */
        vc_log(VC_LOG_ERROR, "cannot read all of a graph's nodes: its frees are not seen");
    for (size_t i = 0; i < found.nallocs; i++) {
        const CUDA_MEM_ALLOC_NODE_PARAMS *a = &found.allocs[i];
        bool freed = false;
        for (size_t j = 0; j < found.nfrees && !freed; j++)
            freed = found.frees[j] == a->dptr;
        if (a->poolProps.location.type == CU_MEM_LOCATION_TYPE_DEVICE)
            add_node(need, a->poolProps.location.id, a->bytesize, freed);
    }
    free(found.allocs);
    free(found.frees);
}

/* Needs vc_local_lock. */
static struct exec *find(CUgraphExec handle)
{
    for (size_t i = 0; i < nexecs; i++)
        if (execs[i].handle == handle)
            return &execs[i];
    return NULL;
}

/* Remembers a new executable graph made from graph (if it allocates on a limited device). */
static void made(CUgraphExec handle, CUgraph graph)
{
    struct exec e = {.handle = handle};
    walk(graph, &e.need);
    if (!e.need.nparts)
        return;
    pthread_mutex_lock(&vc_local_lock);
    struct exec *slot = find(handle);
    if (!slot && nexecs == capacity) {
        size_t bigger = capacity ? 2 * capacity : 64;
        struct exec *grown = realloc(execs, bigger * sizeof *grown);
        if (grown) {
            execs = grown;
            capacity = bigger;
        }
    }
    if (!slot && nexecs < capacity)
        slot = &execs[nexecs++];
    if (slot)
        *slot = e;
    else
        vc_log(VC_LOG_ERROR, "out of host memory: a graph's allocations are not charged");
    for (int i = 0; i < e.need.nparts; i++) {
        reservation[e.need.part[i].device->index].seen = true;
        reservation[e.need.part[i].device->index].ordinal = e.need.part[i].ordinal;
    }
    __atomic_store_n(&tracked, nexecs, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&vc_local_lock);
}

/* Needs vc_local_lock. Brings device index dev's charge to the driver's reservation. */
static void settle(int dev)
{
    cuuint64_t reserved = 0;
    if (!reservation[dev].seen
        || vc_real_cuDeviceGetGraphMemAttribute(reservation[dev].ordinal,
                                                CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT,
                                                &reserved) != CUDA_SUCCESS)
        return;
    vc_account_add(dev, (int64_t)(reserved - reservation[dev].charged));
    reservation[dev].charged = reserved;
}

void vc_graphs_refresh(void)
{
    pthread_mutex_lock(&vc_local_lock);
    for (int dev = 0; dev < VC_MAX_DEVICES; dev++)
        settle(dev);
    pthread_mutex_unlock(&vc_local_lock);
}

/* Charges what backing part may add on its device: what it keeps, and what it
 * frees itself beyond the reservation that kept allocations do not hold. */
static bool charge_part(struct vc_graph_part *part)
{
    pthread_mutex_lock(&vc_local_lock);
    uint64_t reserved = reservation[part->device->index].charged;
    uint64_t kept = reservation[part->device->index].kept;
    pthread_mutex_unlock(&vc_local_lock);
    uint64_t reusable = reserved > kept ? reserved - kept : 0;
    part->charged = part->kept + (part->transient > reusable ? part->transient - reusable : 0);
    return vc_memory_charge(part->device, part->charged) == CUDA_SUCCESS;
}

/* After the driver gave back ordinal's unused graph memory: what is left is
 * what kept allocations hold, and graphs launched again are backed again. */
static void trimmed(CUdevice ordinal)
{
    pthread_mutex_lock(&vc_local_lock);
    for (size_t i = 0; i < nexecs; i++)
        execs[i].backed = false;
    for (int dev = 0; dev < VC_MAX_DEVICES; dev++) {
        if (!reservation[dev].seen || reservation[dev].ordinal != ordinal)
            continue;
        settle(dev);
        reservation[dev].kept = reservation[dev].charged;
    }
    pthread_mutex_unlock(&vc_local_lock);
}

CUresult vc_graph_begin(struct vc_graph_op *op, CUgraphExec exec, CUstream stream, bool ptsz)
{
    op->nparts = 0;
    op->exec = exec;
    if (!__atomic_load_n(&tracked, __ATOMIC_ACQUIRE) || vc_mode() != VC_ON)
        return CUDA_SUCCESS;
    pthread_mutex_lock(&vc_local_lock);
    struct exec *e = find(exec);
    if (e && !e->backed)
        *op = e->need;
    pthread_mutex_unlock(&vc_local_lock);
    op->exec = exec;
    /* A graph launched into a capture becomes a node, backed by nothing now. */
    if (!op->nparts || vc_capturing(stream, ptsz)) {
        op->nparts = 0;
        return CUDA_SUCCESS;
    }
    vc_graphs_refresh();
    for (int i = 0; i < op->nparts; i++) {
        if (!charge_part(&op->part[i])) {
            vc_log(VC_LOG_INFO, "a graph's allocations (%llu bytes on %s) do not fit: out of memory",
                   (unsigned long long)op->part[i].charged, op->part[i].device->uuid);
            op->nparts = i;
            return vc_graph_end(op, CUDA_ERROR_OUT_OF_MEMORY);
        }
    }
    return CUDA_SUCCESS;
}

CUresult vc_graph_end(struct vc_graph_op *op, CUresult result)
{
    if (!op->nparts)
        return result;
    pthread_mutex_lock(&vc_local_lock);
    struct exec *e = result == CUDA_SUCCESS ? find(op->exec) : NULL;
    if (e)
        e->backed = true;
    for (int i = 0; i < op->nparts; i++) {
        int dev = op->part[i].device->index;
        vc_account_add(dev, -(int64_t)op->part[i].charged);
        if (e)
            reservation[dev].kept += op->part[i].kept;
        settle(dev);
    }
    pthread_mutex_unlock(&vc_local_lock);
    return result;
}

void vc_graphs_forked(void)
{
    free(execs);
    execs = NULL;
    nexecs = capacity = tracked = 0;
    memset(reservation, 0, sizeof reservation);
}

/* ---- wrappers ---- */

static CUresult instantiated(CUresult r, const CUgraphExec *exec, CUgraph graph)
{
    if (r == CUDA_SUCCESS && vc_mode() == VC_ON)
        made(*exec, graph);
    return r;
}

CUresult CUDAAPI cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph,
                                             unsigned long long flags)
{
    return instantiated(vc_real_cuGraphInstantiateWithFlags(phGraphExec, hGraph, flags),
                        phGraphExec, hGraph);
}

CUresult CUDAAPI cuGraphInstantiateWithParams(CUgraphExec *phGraphExec, CUgraph hGraph,
                                              CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams)
{
    return instantiated(vc_real_cuGraphInstantiateWithParams(phGraphExec, hGraph,
                                                             instantiateParams),
                        phGraphExec, hGraph);
}

CUresult CUDAAPI cuGraphInstantiateWithParams_ptsz(CUgraphExec *phGraphExec, CUgraph hGraph,
                                                   CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams)
{
    return instantiated(vc_real_cuGraphInstantiateWithParams_ptsz(phGraphExec, hGraph,
                                                                  instantiateParams),
                        phGraphExec, hGraph);
}

/* The CUDA 11 entry points, which programs built then still ask for. */
CUresult CUDAAPI cuGraphInstantiate(CUgraphExec *phGraphExec, CUgraph hGraph,
                                    CUgraphNode *phErrorNode, char *logBuffer, size_t bufferSize)
{
    return instantiated(vc_real_cuGraphInstantiate(phGraphExec, hGraph, phErrorNode, logBuffer,
                                                   bufferSize),
                        phGraphExec, hGraph);
}

CUresult CUDAAPI cuGraphInstantiate_v2(CUgraphExec *phGraphExec, CUgraph hGraph,
                                       CUgraphNode *phErrorNode, char *logBuffer,
                                       size_t bufferSize)
{
    return instantiated(vc_real_cuGraphInstantiate_v2(phGraphExec, hGraph, phErrorNode,
                                                      logBuffer, bufferSize),
                        phGraphExec, hGraph);
}

CUresult CUDAAPI cuGraphExecDestroy(CUgraphExec hGraphExec)
{
    CUresult r = vc_real_cuGraphExecDestroy(hGraphExec);
    if (r != CUDA_SUCCESS || !__atomic_load_n(&tracked, __ATOMIC_ACQUIRE))
        return r;
    pthread_mutex_lock(&vc_local_lock);
    struct exec *e = find(hGraphExec);
    if (e) {
        *e = execs[--nexecs];
        __atomic_store_n(&tracked, nexecs, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&vc_local_lock);
    return r;
}

CUresult CUDAAPI cuGraphUpload(CUgraphExec hGraphExec, CUstream hStream)
{
    struct vc_graph_op op;
    CUresult r = vc_graph_begin(&op, hGraphExec, hStream, false);
    return r != CUDA_SUCCESS ? r : vc_graph_end(&op, vc_real_cuGraphUpload(hGraphExec, hStream));
}

CUresult CUDAAPI cuGraphUpload_ptsz(CUgraphExec hGraphExec, CUstream hStream)
{
    struct vc_graph_op op;
    CUresult r = vc_graph_begin(&op, hGraphExec, hStream, true);
    return r != CUDA_SUCCESS ? r
                             : vc_graph_end(&op, vc_real_cuGraphUpload_ptsz(hGraphExec, hStream));
}

/* Memory given back to the device: graphs launched again must be backed again. */
CUresult CUDAAPI cuDeviceGraphMemTrim(CUdevice device)
{
    CUresult r = vc_real_cuDeviceGraphMemTrim(device);
    if (r == CUDA_SUCCESS && vc_mode() == VC_ON)
        trimmed(device);
    return r;
}
