/*
 * A driver-API program that the tests run under libvcuda.so, against the test
 * double in CI and the real driver on a GPU machine. It reaches the driver the
 * way real programs do, chosen by its first argument:
 *   link          calls libcuda.so.1's exports (it is linked against it)
 *   dlsym         dlopen + dlsym of each versioned name (as XLA does)
 *   getproc       dlopen + dlsym("cuGetProcAddress_v2") + cuGetProcAddress
 *                 for everything, each at its own version (as the CUDA runtime does)
 *   getproc-ptsz  the same, asking for per-thread default stream versions
 * then runs the commands that follow, printing one line per command:
 *   init | ctx DEV | ctxnew DEV | ctxdestroy N | release DEV | reset DEV
 *   alloc BYTES | managed BYTES | pitch WIDTH HEIGHT | array W H | array3d W H D
 *   mipmap W H LEVELS | vmm BYTES DEV | granularity | async BYTES | pool BYTES | hostpool BYTES
 *   freeasync N | sync | trim BYTES | pooldestroy | free N | fill BYTES
 *   fillwith COMMAND...  (repeats an allocation command until it fails)
 *   info | total DEV | nvml | wait | sleep MS | fork CMD;CMD... | hammer BYTES|streams
 *   resolve | wrapped
 *   gcapture MODE BYTES free|keep | gnode BYTES | glaunch N | gupload N | gtrim | gmem
 *   ipcexport N | ipcopen HEX | bgcapture MODE | bgend
 *   vmmfd BYTES DEV | vmmexport N | vmmimport PID FD | vmmmap N BYTES | vmmmap2 N M BYTES
 *   vmmretain N
 *   module | load API NS MS STREAMS THREADS | capture API NS COUNT | replay MS
 *   gaps NS EVERY_US MS | gapsmemset NS EVERY_US MS BYTES | gapslate NS EVERY_US MS
 *   shapes NS COUNT ROUNDS | handoff NS COUNT ROUNDS OTHER_NS GAP_US
 *   varying NS COUNT ROUNDS OTHER_NS GAP_US
 *   badlaunch N | threads | records
 * N is the number an allocation or context command printed. Sizes take a
 * K, M or G suffix (powers of 1024).
 *
 * Kernels: `module` loads a PTX "spin" kernel that runs for the nanoseconds
 * of its parameter (on a GPU it spins on %globaltimer; the test double runs
 * it for that simulated time). API is how it is launched: kernel
 * (cuLaunchKernel), ex (cuLaunchKernelEx), coop (cuLaunchCooperativeKernel)
 * or graph (cuGraphLaunch of a captured graph holding one launch).
 *   load      THREADS threads launch spin kernels of NS back to back for MS
 *             ms, round robin over STREAMS streams of their own (0: the
 *             default stream), at most two checkpoints of 8 launches ahead;
 *             prints "load API LAUNCHES WALL_NS SHARE": the kernels' time
 *             over the wall time until all completed, in percent.
 *   capture   captures COUNT launches in global mode on a new stream, while
 *             launches made just before (5 of 10 ms) are still running, then
 *             instantiates the graph; prints "capture RESULT NODES RECORDS":
 *             RECORDS, events recorded into the capture (test double only,
 *             else -).
 *   replay    launches that graph back to back for MS ms, like load.
 *   gcapture  captures cuMemAllocAsync(BYTES) (and its cuMemFreeAsync, with
 *             free) in a capture of MODE (global, thread, relaxed) on a new
 *             stream and instantiates the graph; gnode builds the same with
 *             cuGraphAddMemAllocNode; both print "gcapture RESULT N".
 *   glaunch, gupload  launch or upload graph N on the legacy stream and
 *             synchronize; gtrim trims the current device's graph memory;
 *             gmem prints its reservation (CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT).
 *   gaps      launches a spin kernel of NS every EVERY_US us on the default
 *             stream for MS ms (a launch-bound program: the device idles
 *             between its kernels); prints "gaps LAUNCHES SLOW": the launches
 *             made, and how many of their calls took a millisecond or more.
 *             gapsmemset NS EVERY_US MS BYTES: the same, each launch right
 *             behind a cuMemsetD8Async of BYTES on the stream, as a program
 *             queues a memset or copy before a kernel. gapslate NS EVERY_US
 *             MS: the same, but from launch LATE_KERNEL_AFTER on, the kernel
 *             of a module loaded then (a kernel first launched when the
 *             program has long run on its stream); and each launch comes
 *             EVERY_US after the last one's call returned, as a loop that
 *             does its own work between launches (a slow call is never made
 *             up for with launches in a row, which would queue).
 *   shapes    launches a spin kernel of NS in COUNT shapes (grid widths 1 to
 *             COUNT: COUNT kernels to the shim) one after another, ROUNDS
 *             times, on the default stream, synchronizing after each round, as
 *             a training step launches its kernels; prints "shapes LAUNCHES".
 *   handoff   this thread launches COUNT spin kernels of NS on the default
 *             stream, then hands over to a new thread, which launches COUNT
 *             of OTHER_NS there while this one waits (as a training step's
 *             forward and backward passes do in PyTorch), then spins GAP_US
 *             on the host, ROUNDS times, without synchronizing; prints
 *             "handoff LAUNCHES WALL_NS SHARE": the kernels' time over the
 *             wall time until all completed, in percent. varying NS COUNT
 *             ROUNDS OTHER_NS GAP_US: the same in this thread alone (one
 *             kernel of one shape whose time depends on its argument, as a
 *             GEMM's on its inner dimension).
 *   vmmfd     creates BYTES of VMM memory on DEV that can be exported as a
 *             POSIX file descriptor; vmmexport exports handle N so and prints
 *             "vmmexport RESULT PID FD"; vmmimport takes that descriptor from
 *             process PID (pidfd_getfd) and imports it. vmmmap maps handle N
 *             (BYTES of it) into a range it reserves and makes it accessible to
 *             the current device (vmmmap2: handles N and M side by side, BYTES
 *             of each); `free` of a mapping unmaps it (in one call) and frees the
 *             range. vmmretain takes a new reference to the handle mapped by
 *             mapping N (cuMemRetainAllocationHandle); `free` releases it.
 *   bgcapture another thread begins a capture of MODE on a stream of its own
 *             and holds it open; bgend ends it and prints its result (a
 *             capture invalidated by this thread's calls meanwhile fails).
 *   badlaunch makes N launches of a function that does not exist.
 *   threads   prints how many threads the process has.
 *   records   prints how many events the process recorded (test double only, else -).
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "api.h"

/* Older C library headers lack them; the numbers are the same on every architecture. */
#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_pidfd_getfd
#define SYS_pidfd_getfd 438
#endif

struct api {
    CUresult (*Init)(unsigned);
    CUresult (*DeviceGetCount)(int *);
    CUresult (*DeviceTotalMem)(size_t *, CUdevice);
    CUresult (*PrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*PrimaryCtxRelease)(CUdevice);
    CUresult (*PrimaryCtxReset)(CUdevice);
    CUresult (*CtxCreate)(CUcontext *, CUctxCreateParams *, unsigned, CUdevice);
    CUresult (*CtxDestroy)(CUcontext);
    CUresult (*CtxSetCurrent)(CUcontext);
    CUresult (*CtxGetDevice)(CUdevice *);
    CUresult (*MemGetInfo)(size_t *, size_t *);
    CUresult (*MemAlloc)(CUdeviceptr *, size_t);
    CUresult (*MemAllocManaged)(CUdeviceptr *, size_t, unsigned);
    CUresult (*MemAllocPitch)(CUdeviceptr *, size_t *, size_t, size_t, unsigned);
    CUresult (*MemFree)(CUdeviceptr);
    CUresult (*ArrayCreate)(CUarray *, const CUDA_ARRAY_DESCRIPTOR *);
    CUresult (*Array3DCreate)(CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *);
    CUresult (*ArrayDestroy)(CUarray);
    CUresult (*MipmappedArrayCreate)(CUmipmappedArray *, const CUDA_ARRAY3D_DESCRIPTOR *, unsigned);
    CUresult (*MipmappedArrayDestroy)(CUmipmappedArray);
    CUresult (*MemGetAllocationGranularity)(size_t *, const CUmemAllocationProp *,
                                            CUmemAllocationGranularity_flags);
    CUresult (*MemCreate)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                          unsigned long long);
    CUresult (*MemRelease)(CUmemGenericAllocationHandle);
    CUresult (*MemAllocAsync)(CUdeviceptr *, size_t, CUstream);
    CUresult (*MemAllocFromPoolAsync)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
    CUresult (*MemFreeAsync)(CUdeviceptr, CUstream);
    CUresult (*MemPoolCreate)(CUmemoryPool *, const CUmemPoolProps *);
    CUresult (*MemPoolDestroy)(CUmemoryPool);
    CUresult (*MemPoolTrimTo)(CUmemoryPool, size_t);
    CUresult (*StreamSynchronize)(CUstream);
    CUresult (*GetProcAddress)(const char *, void **, int, cuuint64_t,
                               CUdriverProcAddressQueryResult *);
    CUresult (*GetErrorName)(CUresult, const char **);
    CUresult (*ModuleLoadData)(CUmodule *, const void *);
    CUresult (*ModuleGetFunction)(CUfunction *, CUmodule, const char *);
    CUresult (*StreamCreate)(CUstream *, unsigned);
    CUresult (*StreamDestroy)(CUstream);
    CUresult (*EventCreate)(CUevent *, unsigned);
    CUresult (*EventRecord)(CUevent, CUstream);
    CUresult (*EventSynchronize)(CUevent);
    CUresult (*CtxSynchronize)(void);
    CUresult (*MemsetD8Async)(CUdeviceptr, unsigned char, size_t, CUstream);
    CUresult (*LaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                             unsigned, unsigned, CUstream, void **, void **);
    CUresult (*LaunchKernelEx)(const CUlaunchConfig *, CUfunction, void **, void **);
    CUresult (*LaunchCooperativeKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned,
                                        unsigned, unsigned, unsigned, CUstream, void **);
    CUresult (*StreamBeginCapture)(CUstream, CUstreamCaptureMode);
    CUresult (*StreamEndCapture)(CUstream, CUgraph *);
    CUresult (*GraphGetNodes)(CUgraph, CUgraphNode *, size_t *);
    CUresult (*GraphInstantiate)(CUgraphExec *, CUgraph, unsigned long long);
    CUresult (*GraphLaunch)(CUgraphExec, CUstream);
    CUresult (*GraphUpload)(CUgraphExec, CUstream);
    CUresult (*GraphCreate)(CUgraph *, unsigned);
    CUresult (*GraphAddMemAllocNode)(CUgraphNode *, CUgraph, const CUgraphNode *, size_t,
                                     CUDA_MEM_ALLOC_NODE_PARAMS *);
    CUresult (*GraphExecDestroy)(CUgraphExec);
    CUresult (*DeviceGraphMemTrim)(CUdevice);
    CUresult (*DeviceGetGraphMemAttribute)(CUdevice, CUgraphMem_attribute, void *);
    CUresult (*IpcGetMemHandle)(CUipcMemHandle *, CUdeviceptr);
    CUresult (*IpcOpenMemHandle)(CUdeviceptr *, CUipcMemHandle, unsigned);
    CUresult (*IpcCloseMemHandle)(CUdeviceptr);
    CUresult (*MemAddressReserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
    CUresult (*MemAddressFree)(CUdeviceptr, size_t);
    CUresult (*MemMap)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                       unsigned long long);
    CUresult (*MemUnmap)(CUdeviceptr, size_t);
    CUresult (*MemSetAccess)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
    CUresult (*MemExportToShareableHandle)(void *, CUmemGenericAllocationHandle,
                                           CUmemAllocationHandleType, unsigned long long);
    CUresult (*MemImportFromShareableHandle)(CUmemGenericAllocationHandle *, void *,
                                             CUmemAllocationHandleType);
    CUresult (*MemRetainAllocationHandle)(CUmemGenericAllocationHandle *, void *);
    CUresult (*MemHostAlloc)(void **, size_t, unsigned);
    CUresult (*MemHostGetDevicePointer)(CUdeviceptr *, void *, unsigned);
    CUresult (*StreamWaitValue32)(CUstream, CUdeviceptr, cuuint32_t, unsigned);
    CUresult (*EventQuery)(CUevent);
};

struct binding {
    size_t offset;
    const char *base;        /* the name cuGetProcAddress knows */
    const char *versioned;   /* the exported symbol */
    void *linked;
    int version;             /* the CUDA version that introduced this signature */
};

/* Like the CUDA runtime, ask cuGetProcAddress for the version whose signature
 * is declared here: newer ones may take other arguments (cuCtxGetDevice_v2). */
#define BIND(member, base, symbol, version)                                                       \
    {offsetof(struct api, member), base, #symbol, (void *)symbol, version}

static const struct binding bindings[] = {
    BIND(Init, "cuInit", cuInit, 2000),
    BIND(DeviceGetCount, "cuDeviceGetCount", cuDeviceGetCount, 2000),
    BIND(DeviceTotalMem, "cuDeviceTotalMem", cuDeviceTotalMem_v2, 3020),
    BIND(PrimaryCtxRetain, "cuDevicePrimaryCtxRetain", cuDevicePrimaryCtxRetain, 7000),
    BIND(PrimaryCtxRelease, "cuDevicePrimaryCtxRelease", cuDevicePrimaryCtxRelease_v2, 11000),
    BIND(PrimaryCtxReset, "cuDevicePrimaryCtxReset", cuDevicePrimaryCtxReset_v2, 11000),
    BIND(CtxCreate, "cuCtxCreate", cuCtxCreate_v4, 12050),
    BIND(CtxDestroy, "cuCtxDestroy", cuCtxDestroy_v2, 4000),
    BIND(CtxSetCurrent, "cuCtxSetCurrent", cuCtxSetCurrent, 4000),
    BIND(CtxGetDevice, "cuCtxGetDevice", cuCtxGetDevice, 2000),
    BIND(MemGetInfo, "cuMemGetInfo", cuMemGetInfo_v2, 3020),
    BIND(MemAlloc, "cuMemAlloc", cuMemAlloc_v2, 3020),
    BIND(MemAllocManaged, "cuMemAllocManaged", cuMemAllocManaged, 6000),
    BIND(MemAllocPitch, "cuMemAllocPitch", cuMemAllocPitch_v2, 3020),
    BIND(MemFree, "cuMemFree", cuMemFree_v2, 3020),
    BIND(ArrayCreate, "cuArrayCreate", cuArrayCreate_v2, 3020),
    BIND(Array3DCreate, "cuArray3DCreate", cuArray3DCreate_v2, 3020),
    BIND(ArrayDestroy, "cuArrayDestroy", cuArrayDestroy, 2000),
    BIND(MipmappedArrayCreate, "cuMipmappedArrayCreate", cuMipmappedArrayCreate, 5000),
    BIND(MipmappedArrayDestroy, "cuMipmappedArrayDestroy", cuMipmappedArrayDestroy, 5000),
    BIND(MemGetAllocationGranularity, "cuMemGetAllocationGranularity", cuMemGetAllocationGranularity, 10020),
    BIND(MemCreate, "cuMemCreate", cuMemCreate, 10020),
    BIND(MemRelease, "cuMemRelease", cuMemRelease, 10020),
    BIND(MemAllocAsync, "cuMemAllocAsync", cuMemAllocAsync, 11020),
    BIND(MemAllocFromPoolAsync, "cuMemAllocFromPoolAsync", cuMemAllocFromPoolAsync, 11020),
    BIND(MemFreeAsync, "cuMemFreeAsync", cuMemFreeAsync, 11020),
    BIND(MemPoolCreate, "cuMemPoolCreate", cuMemPoolCreate, 11020),
    BIND(MemPoolDestroy, "cuMemPoolDestroy", cuMemPoolDestroy, 11020),
    BIND(MemPoolTrimTo, "cuMemPoolTrimTo", cuMemPoolTrimTo, 11020),
    BIND(StreamSynchronize, "cuStreamSynchronize", cuStreamSynchronize, 2000),
    BIND(GetProcAddress, "cuGetProcAddress", cuGetProcAddress_v2, 12000),
    BIND(GetErrorName, "cuGetErrorName", cuGetErrorName, 6000),
    BIND(ModuleLoadData, "cuModuleLoadData", cuModuleLoadData, 2000),
    BIND(ModuleGetFunction, "cuModuleGetFunction", cuModuleGetFunction, 2000),
    BIND(StreamCreate, "cuStreamCreate", cuStreamCreate, 2000),
    BIND(StreamDestroy, "cuStreamDestroy", cuStreamDestroy_v2, 4000),
    BIND(EventCreate, "cuEventCreate", cuEventCreate, 2000),
    BIND(EventRecord, "cuEventRecord", cuEventRecord, 2000),
    BIND(EventSynchronize, "cuEventSynchronize", cuEventSynchronize, 2000),
    BIND(CtxSynchronize, "cuCtxSynchronize", cuCtxSynchronize, 2000),
    BIND(MemsetD8Async, "cuMemsetD8Async", cuMemsetD8Async, 3020),
    BIND(LaunchKernel, "cuLaunchKernel", cuLaunchKernel, 4000),
    BIND(LaunchKernelEx, "cuLaunchKernelEx", cuLaunchKernelEx, 11060),
    BIND(LaunchCooperativeKernel, "cuLaunchCooperativeKernel", cuLaunchCooperativeKernel, 9000),
    BIND(StreamBeginCapture, "cuStreamBeginCapture", cuStreamBeginCapture_v2, 10010),
    BIND(StreamEndCapture, "cuStreamEndCapture", cuStreamEndCapture, 10000),
    BIND(GraphGetNodes, "cuGraphGetNodes", cuGraphGetNodes, 10000),
    BIND(GraphInstantiate, "cuGraphInstantiateWithFlags", cuGraphInstantiateWithFlags, 11040),
    BIND(GraphLaunch, "cuGraphLaunch", cuGraphLaunch, 10000),
    BIND(GraphUpload, "cuGraphUpload", cuGraphUpload, 11010),
    BIND(GraphCreate, "cuGraphCreate", cuGraphCreate, 10000),
    BIND(GraphAddMemAllocNode, "cuGraphAddMemAllocNode", cuGraphAddMemAllocNode, 11040),
    BIND(GraphExecDestroy, "cuGraphExecDestroy", cuGraphExecDestroy, 10000),
    BIND(DeviceGraphMemTrim, "cuDeviceGraphMemTrim", cuDeviceGraphMemTrim, 11040),
    BIND(DeviceGetGraphMemAttribute, "cuDeviceGetGraphMemAttribute", cuDeviceGetGraphMemAttribute,
         11040),
    BIND(IpcGetMemHandle, "cuIpcGetMemHandle", cuIpcGetMemHandle, 4010),
    BIND(IpcOpenMemHandle, "cuIpcOpenMemHandle", cuIpcOpenMemHandle_v2, 11000),
    BIND(IpcCloseMemHandle, "cuIpcCloseMemHandle", cuIpcCloseMemHandle, 4010),
    BIND(MemAddressReserve, "cuMemAddressReserve", cuMemAddressReserve, 10020),
    BIND(MemAddressFree, "cuMemAddressFree", cuMemAddressFree, 10020),
    BIND(MemMap, "cuMemMap", cuMemMap, 10020),
    BIND(MemUnmap, "cuMemUnmap", cuMemUnmap, 10020),
    BIND(MemSetAccess, "cuMemSetAccess", cuMemSetAccess, 10020),
    BIND(MemExportToShareableHandle, "cuMemExportToShareableHandle", cuMemExportToShareableHandle,
         10020),
    BIND(MemImportFromShareableHandle, "cuMemImportFromShareableHandle",
         cuMemImportFromShareableHandle, 10020),
    BIND(MemRetainAllocationHandle, "cuMemRetainAllocationHandle", cuMemRetainAllocationHandle,
         11000),
    BIND(MemHostAlloc, "cuMemHostAlloc", cuMemHostAlloc, 3020),
    BIND(MemHostGetDevicePointer, "cuMemHostGetDevicePointer", cuMemHostGetDevicePointer_v2, 3020),
    BIND(StreamWaitValue32, "cuStreamWaitValue32", cuStreamWaitValue32_v2, 11070),
    BIND(EventQuery, "cuEventQuery", cuEventQuery, 2000),
};

#define NBINDINGS (sizeof bindings / sizeof *bindings)

static struct api api;
static const char *prefix = "";

/* Prints one line of output, marked when it comes from a forked child. */
__attribute__((format(printf, 1, 2))) static void out(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("%s", prefix);
    vprintf(fmt, ap);
    va_end(ap);
}

static void die(const char *what, const char *detail)
{
    fprintf(stderr, "probe: %s %s\n", what, detail ? detail : "");
    exit(2);
}

/* The version to ask for: a program built for per-thread default streams is
 * built for CUDA 7.0 at least, where they came. */
static int version_for(const struct binding *b, cuuint64_t flags)
{
    bool per_thread = flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
    return per_thread && b->version < 7000 ? 7000 : b->version;
}

static void bind_all(const char *mode)
{
    void *handle = NULL;
    cuuint64_t flags = CU_GET_PROC_ADDRESS_DEFAULT;
    if (strcmp(mode, "link") != 0 && !(handle = dlopen("libcuda.so.1", RTLD_NOW)))
        die("cannot open libcuda.so.1:", dlerror());
    if (strcmp(mode, "getproc-ptsz") == 0)
        flags = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
    bool by_getproc = strncmp(mode, "getproc", 7) == 0;
    if (by_getproc && !(api.GetProcAddress = dlsym(handle, "cuGetProcAddress_v2")))
        die("no cuGetProcAddress_v2", NULL);
    for (size_t i = 0; i < NBINDINGS; i++) {
        const struct binding *b = &bindings[i];
        void **slot = (void **)((char *)&api + b->offset);
        if (strcmp(mode, "link") == 0)
            *slot = b->linked;
        else if (strcmp(mode, "dlsym") == 0)
            *slot = dlsym(handle, b->versioned);
        else if (!by_getproc)
            die("unknown mode", mode);
        else if (api.GetProcAddress(b->base, slot, version_for(b, flags), flags, NULL) != CUDA_SUCCESS)
            *slot = NULL;
        if (!*slot)
            die("cannot resolve", b->base);
    }
}

/* ---- objects the commands create ---- */

enum kind { POINTER, ARRAY, MIPMAP, HANDLE, ASYNC, CONTEXT, GRAPH, IPC, MAPPING };

struct object {
    enum kind kind;
    uint64_t handle;          /* MAPPING: its address */
    uint64_t size;            /* MAPPING: its size */
};

static struct object objects[65536];
static int nobjects;
static CUmemoryPool pool, host_pool;

static int keep(enum kind kind, uint64_t handle)
{
    if (nobjects == (int)(sizeof objects / sizeof *objects))
        die("too many objects", NULL);
    objects[nobjects] = (struct object){kind, handle, 0};
    return nobjects++;
}

static const char *name(CUresult r)
{
    const char *s = NULL;
    api.GetErrorName(r, &s);
    return s ? s : "CUDA_ERROR_UNKNOWN";
}

static size_t size_arg(const char *text)
{
    char *end;
    size_t n = strtoull(text, &end, 10);
    switch (*end) {
    case 'G':
        return n << 30;
    case 'M':
        return n << 20;
    case 'K':
        return n << 10;
    default:
        return n;
    }
}

static CUdevice current_device(void)
{
    CUdevice dev = 0;
    api.CtxGetDevice(&dev);
    return dev;
}

static CUmemAllocationProp device_prop(CUdevice dev)
{
    CUmemAllocationProp prop = {0};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    return prop;
}

static CUmemoryPool make_pool(CUmemLocationType where)
{
    CUmemPoolProps props = {0};
    CUmemoryPool p = NULL;
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.location.type = where;
    props.location.id = where == CU_MEM_LOCATION_TYPE_DEVICE ? current_device() : 0;
    CUresult r = api.MemPoolCreate(&p, &props);
    if (r != CUDA_SUCCESS)
        out("poolcreate %s\n", name(r));
    return p;
}

static CUresult free_object(int n)
{
    if (n < 0 || n >= nobjects)
        return CUDA_ERROR_INVALID_VALUE;
    struct object *o = &objects[n];
    switch (o->kind) {
    case POINTER:
        return api.MemFree(o->handle);
    case ARRAY:
        return api.ArrayDestroy((CUarray)o->handle);
    case MIPMAP:
        return api.MipmappedArrayDestroy((CUmipmappedArray)o->handle);
    case HANDLE:
        return api.MemRelease(o->handle);
    case ASYNC:
        return api.MemFreeAsync(o->handle, 0);
    case CONTEXT:
        return api.CtxDestroy((CUcontext)o->handle);
    case GRAPH:
        return api.GraphExecDestroy((CUgraphExec)o->handle);
    case IPC:
        return api.IpcCloseMemHandle(o->handle);
    case MAPPING: {
        CUresult r = api.MemUnmap(o->handle, o->size);
        return r == CUDA_SUCCESS ? api.MemAddressFree(o->handle, o->size) : r;
    }
    }
    return CUDA_ERROR_INVALID_VALUE;
}

/* The result of the last allocation command, for fillwith. */
static CUresult last_result;

static void report(const char *command, CUresult r, enum kind kind, uint64_t handle)
{
    last_result = r;
    if (r == CUDA_SUCCESS)
        out("%s %s %d\n", command, name(r), keep(kind, handle));
    else
        out("%s %s\n", command, name(r));
}

/* The symbol and library that an entry point belongs to. */
static void describe(void *fn, const char **lib, const char **sym)
{
    Dl_info info;
    *lib = *sym = "-";
    if (fn && dladdr(fn, &info)) {
        const char *slash = info.dli_fname ? strrchr(info.dli_fname, '/') : NULL;
        *lib = slash ? slash + 1 : info.dli_fname;
        *sym = info.dli_sname && info.dli_saddr == fn ? info.dli_sname : "?";
    }
}

/* What cuGetProcAddress hands out for each intercepted name (and a few that
 * are not) at several versions and stream flavours. */
static void resolve_all(void)
{
    static const char *const extra[] = {"cuMemFreeAsync", "cuStreamSynchronize", "cuCtxGetDevice"};
    static const int versions[] = {2000, 3020, 4000, 7000, 10000, 10020, 11000, 11020, 11040,
                                   12000, 12050, CUDA_VERSION};
    static const cuuint64_t flavours[] = {CU_GET_PROC_ADDRESS_DEFAULT,
                                          CU_GET_PROC_ADDRESS_LEGACY_STREAM,
                                          CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM};
    const char *names[128];
    char bases[128][128];
    int n = 0, nseen = 0;
#define VC_BASE_NAME(sym, params, args) names[n++] = #sym;
    VC_INTERCEPTED(VC_BASE_NAME, VC_BASE_NAME, VC_BASE_NAME)
#undef VC_BASE_NAME
    for (unsigned i = 0; i < sizeof extra / sizeof *extra; i++)
        names[n++] = extra[i];
    for (int i = 0; i < n; i++) {
        char base[128];
        snprintf(base, sizeof base, "%s", names[i]);
        /* cuMemAlloc_v2 and cuMemAllocAsync_ptsz are asked for as cuMemAlloc and cuMemAllocAsync. */
        char *suffix = strstr(base, "_ptsz");
        if (suffix)
            *suffix = '\0';
        suffix = strrchr(base, '_');
        if (suffix && suffix[1] == 'v' && suffix[2] >= '0' && suffix[2] <= '9')
            *suffix = '\0';
        bool seen = strncmp(base, "nvml", 4) == 0;
        for (int j = 0; j < nseen && !seen; j++)
            seen = strcmp(bases[j], base) == 0;
        if (seen)
            continue;
        snprintf(bases[nseen++], sizeof bases[0], "%s", base);
        for (unsigned v = 0; v < sizeof versions / sizeof *versions; v++)
            for (unsigned f = 0; f < sizeof flavours / sizeof *flavours; f++) {
                void *fn = NULL;
                CUresult r = api.GetProcAddress(base, &fn, versions[v], flavours[f], NULL);
                const char *lib, *sym;
                describe(fn, &lib, &sym);
                out("resolve %s %d %llu %s %s %s\n", base, versions[v],
                       (unsigned long long)flavours[f], name(r), lib, sym);
            }
    }
}

/* NVML reached as pynvml and nvidia-smi do: dlopen and dlsym. */
static void nvml_report(void)
{
    void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!h)
        die("cannot open libnvidia-ml.so.1:", dlerror());
    int (*init)(void) = dlsym(h, "nvmlInit_v2");
    int (*count)(unsigned *) = dlsym(h, "nvmlDeviceGetCount_v2");
    int (*by_index)(unsigned, nvmlDevice_t *) = dlsym(h, "nvmlDeviceGetHandleByIndex_v2");
    int (*uuid)(nvmlDevice_t, char *, unsigned) = dlsym(h, "nvmlDeviceGetUUID");
    int (*info)(nvmlDevice_t, nvmlMemory_t *) = dlsym(h, "nvmlDeviceGetMemoryInfo");
    int (*info2)(nvmlDevice_t, nvmlMemory_v2_t *) = dlsym(h, "nvmlDeviceGetMemoryInfo_v2");
    int (*procs1)(nvmlDevice_t, unsigned *, nvmlProcessInfo_v1_t *) =
        dlsym(h, "nvmlDeviceGetComputeRunningProcesses");
    int (*procs3)(nvmlDevice_t, unsigned *, nvmlProcessInfo_v2_t *) =
        dlsym(h, "nvmlDeviceGetComputeRunningProcesses_v3");
    unsigned n = 0;
    if (!init || !count || !by_index || !uuid || !info || !info2 || !procs1 || !procs3 || init()
        || count(&n))
        die("NVML unusable", NULL);
    for (unsigned i = 0; i < n; i++) {
        nvmlDevice_t d;
        char text[96] = "";
        nvmlMemory_t m = {0};
        nvmlMemory_v2_t m2 = {.version = (unsigned)(sizeof m2 | 2 << 24)};
        by_index(i, &d);
        uuid(d, text, sizeof text);
        int r1 = info(d, &m), r2 = info2(d, &m2);
        /* The processes, as pynvml asks: a count first, then the list. */
        nvmlProcessInfo_v1_t list1[64];
        nvmlProcessInfo_v2_t list3[64];
        unsigned n1 = 0, n3 = 0;
        procs3(d, &n3, NULL);
        n1 = n3 = 64;
        int r3 = procs3(d, &n3, list3), r4 = procs1(d, &n1, list1);
        unsigned long long sum3 = 0, sum1 = 0;
        int own = 0;
        for (unsigned k = 0; k < n3; k++) {
            sum3 += list3[k].usedGpuMemory;
            own |= list3[k].pid == (unsigned)getpid();
        }
        for (unsigned k = 0; k < n1; k++)
            sum1 += list1[k].usedGpuMemory;
        out("nvml %u %s %d %llu %llu %llu %d %llu %llu %llu %llu %d %u %llu %d %d %llu\n", i, text,
            r1, m.total, m.free, m.used, r2, m2.total, m2.reserved, m2.free, m2.used, r3, n3, sum3,
            own, r4, sum1);
    }
}

/* A capture that another thread holds open, for bgcapture and bgend. */
static struct {
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t changed;
    CUcontext context;
    CUstreamCaptureMode mode;
    int stage;              /* 1: capturing, 2: asked to end, 3: ended */
    CUresult begun, ended;
} bg = {.lock = PTHREAD_MUTEX_INITIALIZER, .changed = PTHREAD_COND_INITIALIZER};

static void bg_stage(int stage)
{
    pthread_mutex_lock(&bg.lock);
    bg.stage = stage;
    pthread_cond_broadcast(&bg.changed);
    pthread_mutex_unlock(&bg.lock);
}

static void bg_wait(int stage)
{
    pthread_mutex_lock(&bg.lock);
    while (bg.stage < stage)
        pthread_cond_wait(&bg.changed, &bg.lock);
    pthread_mutex_unlock(&bg.lock);
}

static void *bg_capture(void *unused)
{
    (void)unused;
    CUstream s;
    CUgraph graph = NULL;
    api.CtxSetCurrent(bg.context);
    bg.begun = api.StreamCreate(&s, CU_STREAM_NON_BLOCKING);
    if (bg.begun == CUDA_SUCCESS)
        bg.begun = api.StreamBeginCapture(s, bg.mode);
    bg_stage(1);
    bg_wait(2);
    bg.ended = bg.begun == CUDA_SUCCESS ? api.StreamEndCapture(s, &graph) : bg.begun;
    bg_stage(3);
    return NULL;
}

static volatile bool hammering;
static size_t hammer_bytes;   /* 0: streams */

/* Allocates and frees (or creates and destroys streams) in a loop, so a fork
 * can land while a thread is inside the shim, or a launch while another
 * thread is inside the driver. */
static void *hammer(void *context)
{
    api.CtxSetCurrent(context);
    while (hammering) {
        CUdeviceptr p;
        CUstream s;
        if (hammer_bytes && api.MemAlloc(&p, hammer_bytes) == CUDA_SUCCESS)
            api.MemFree(p);
        if (!hammer_bytes && api.StreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS)
            api.StreamDestroy(s);
    }
    return NULL;
}

/* ---- kernels ---- */

/* Spins for the nanoseconds of its parameter, on the GPU's global timer. */
static const char spin_ptx[] = ".version 7.0\n"
                               ".target sm_70\n"
                               ".address_size 64\n"
                               ".visible .entry spin(.param .u64 spin_ns)\n"
                               "{\n"
                               "    .reg .pred %p<2>;\n"
                               "    .reg .b64 %rd<5>;\n"
                               "    ld.param.u64 %rd1, [spin_ns];\n"
                               "    mov.u64 %rd2, %globaltimer;\n"
                               "$Lspin:\n"
                               "    mov.u64 %rd3, %globaltimer;\n"
                               "    sub.s64 %rd4, %rd3, %rd2;\n"
                               "    setp.lt.u64 %p1, %rd4, %rd1;\n"
                               "    @%p1 bra $Lspin;\n"
                               "    ret;\n"
                               "}\n";

enum api_kind { API_KERNEL, API_EX, API_COOP, API_GRAPH };

static CUfunction spin;
static CUgraphExec captured;        /* the graph of `capture`, for `replay` */
static uint64_t captured_ns;

static enum api_kind api_kind(const char *word)
{
    static const char *const names[] = {"kernel", "ex", "coop", "graph"};
    for (unsigned i = 0; i < sizeof names / sizeof *names; i++)
        if (!strcmp(word, names[i]))
            return (enum api_kind)i;
    die("unknown launch API", word);
    return API_KERNEL;
}

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* One launch of spin for ns on stream s the way kind says (graph: launches exec). */
static CUresult launch_spin(enum api_kind kind, uint64_t ns, CUstream s, CUgraphExec exec)
{
    void *params[] = {&ns};
    CUlaunchConfig config = {.gridDimX = 1, .gridDimY = 1, .gridDimZ = 1, .blockDimX = 1,
                             .blockDimY = 1, .blockDimZ = 1, .hStream = s};
    switch (kind) {
    case API_KERNEL:
        return api.LaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, s, params, NULL);
    case API_EX:
        return api.LaunchKernelEx(&config, spin, params, NULL);
    case API_COOP:
        return api.LaunchCooperativeKernel(spin, 1, 1, 1, 1, 1, 1, 0, s, params);
    case API_GRAPH:
        return api.GraphLaunch(exec, s);
    }
    return CUDA_ERROR_INVALID_VALUE;
}

/* Captures count launches of spin for ns on a new stream; the graph's node
 * count in *nodes. inner: the graph a graph launch launches. */
static CUresult capture_graph(enum api_kind kind, uint64_t ns, int count, CUstreamCaptureMode mode,
                              CUgraphExec inner, CUgraphExec *exec, size_t *nodes)
{
    CUstream s;
    CUgraph graph = NULL;
    CUresult r = api.StreamCreate(&s, CU_STREAM_NON_BLOCKING);
    if (r == CUDA_SUCCESS)
        r = api.StreamBeginCapture(s, mode);
    for (int i = 0; r == CUDA_SUCCESS && i < count; i++) {
        r = launch_spin(kind, ns, s, inner);
        /* Mid-capture, long enough for the shim's pacing thread to read events. */
        if (i == count / 2)
            usleep(20000);
    }
    CUresult ended = api.StreamEndCapture(s, &graph);
    r = r != CUDA_SUCCESS ? r : ended;
    *nodes = 0;
    if (r == CUDA_SUCCESS)
        r = api.GraphGetNodes(graph, NULL, nodes);
    if (r == CUDA_SUCCESS)
        r = api.GraphInstantiate(exec, graph, 0);
    return r;
}

struct loader {
    enum api_kind kind;
    uint64_t ns;                    /* of a kernel */
    CUgraphExec exec;               /* graph: what to launch (NULL: a graph of one kernel) */
    int64_t until;
    int nstreams;
    CUcontext context;
    long launches;
    CUresult error;
};

#define CHECKPOINT 8
#define MAX_LOAD_STREAMS 16

/* Launches back to back until l->until, at most two checkpoints ahead. */
static void *load_thread(void *arg)
{
    struct loader *l = arg;
    CUstream streams[MAX_LOAD_STREAMS] = {0};
    CUevent marks[2][MAX_LOAD_STREAMS];
    int n = l->nstreams ? l->nstreams : 1;
    size_t nodes;
    api.CtxSetCurrent(l->context);
    for (int i = 0; i < l->nstreams && !l->error; i++)
        l->error = api.StreamCreate(&streams[i], CU_STREAM_NON_BLOCKING);
    for (int i = 0; i < 2 * n && !l->error; i++)
        l->error = api.EventCreate(&marks[i / n][i % n], CU_EVENT_DISABLE_TIMING);
    if (!l->error && l->kind == API_GRAPH && !l->exec)
        l->error = capture_graph(API_KERNEL, l->ns, 1, CU_STREAM_CAPTURE_MODE_RELAXED, NULL,
                                 &l->exec, &nodes);
    for (long round = 0; !l->error && now_ns() < l->until; round++) {
        for (int k = 0; k < CHECKPOINT && !l->error; k++, l->launches++)
            l->error = launch_spin(l->kind, l->ns, streams[l->launches % n], l->exec);
        for (int i = 0; i < n && !l->error; i++) {
            if (round >= 2)
                api.EventSynchronize(marks[round % 2][i]);
            l->error = api.EventRecord(marks[round % 2][i], streams[i]);
        }
    }
    return NULL;
}

/* Runs threads loaders for ms and prints what they achieved. */
static void load(const char *label, enum api_kind kind, uint64_t ns, CUgraphExec exec,
                 uint64_t work_ns, int64_t ms, int nstreams, int threads)
{
    struct loader loaders[16];
    pthread_t ids[16];
    CUcontext ctx = NULL;
    api.PrimaryCtxRetain(&ctx, current_device());
    int64_t start = now_ns();
    threads = threads < 1 ? 1 : threads > 16 ? 16 : threads;
    for (int t = 0; t < threads; t++) {
        loaders[t] = (struct loader){kind, ns, exec, start + ms * 1000000, nstreams, ctx, 0,
                                     CUDA_SUCCESS};
        pthread_create(&ids[t], NULL, load_thread, &loaders[t]);
    }
    long launches = 0;
    CUresult error = CUDA_SUCCESS;
    for (int t = 0; t < threads; t++) {
        pthread_join(ids[t], NULL);
        launches += loaders[t].launches;
        error = error ? error : loaders[t].error;
    }
    CUresult synced = api.CtxSynchronize();
    int64_t wall = now_ns() - start;
    if (error || synced)
        out("%s %s\n", label, name(error ? error : synced));
    else
        out("%s %ld %lld %.2f\n", label, launches, (long long)wall,
            100.0 * (double)launches * (double)work_ns / (double)wall);
}

/* gapslate: the launch from which a newly loaded kernel is launched instead. */
#define LATE_KERNEL_AFTER 100

/* Launches a spin kernel of ns every every_ns for ms; prints what it made and how many
 * launch calls were slow. late: from launch LATE_KERNEL_AFTER on, the kernel of a module
 * loaded then; and each launch comes every_ns after the last one's call returned, so a
 * slow call is never made up for with launches in a row (which would queue). */
static void gaps(uint64_t ns, int64_t every_ns, int64_t ms, size_t memset_bytes, bool late)
{
    int64_t start = now_ns(), next = start;
    long launches = 0, slow = 0;
    CUfunction first = spin;
    CUdeviceptr buffer = 0;
    CUresult r = memset_bytes ? api.MemAlloc(&buffer, memset_bytes) : CUDA_SUCCESS;
    while (r == CUDA_SUCCESS && next < start + ms * 1000000) {
        while (now_ns() < next)
            ;   /* sleeping would oversleep the gap */
        CUmodule module;
        if (late && launches == LATE_KERNEL_AFTER
            && (r = api.ModuleLoadData(&module, spin_ptx)) == CUDA_SUCCESS)
            r = api.ModuleGetFunction(&spin, module, "spin");
        int64_t called = now_ns();
        if (memset_bytes && r == CUDA_SUCCESS)
            r = api.MemsetD8Async(buffer, 0, memset_bytes, NULL);
        if (r == CUDA_SUCCESS)
            r = launch_spin(API_KERNEL, ns, NULL, NULL);
        int64_t returned = now_ns();
        slow += returned - called >= 1000000;
        launches++;
        next = late ? returned + every_ns : start + launches * every_ns;
    }
    spin = first;
    CUresult synced = api.CtxSynchronize();
    if (r || synced)
        out("gaps %s\n", name(r ? r : synced));
    else
        out("gaps %ld %ld\n", launches, slow);
}

/* Launches spin for ns in count shapes, rounds times; prints the launches made. */
static void shapes(uint64_t ns, unsigned count, int rounds)
{
    void *params[] = {&ns};
    long launches = 0;
    CUresult r = CUDA_SUCCESS;
    for (int round = 0; r == CUDA_SUCCESS && round < rounds; round++) {
        for (unsigned width = 1; r == CUDA_SUCCESS && width <= count; width++, launches++)
            r = api.LaunchKernel(spin, width, 1, 1, 1, 1, 1, 0, NULL, params, NULL);
        r = r != CUDA_SUCCESS ? r : api.CtxSynchronize();
    }
    if (r)
        out("shapes %s\n", name(r));
    else
        out("shapes %ld\n", launches);
}

struct handoff {
    CUcontext ctx;
    uint64_t ns;
    int count;
    CUresult result;
};

/* Launches spin for ns count times on the default stream. */
static CUresult launch_spins(uint64_t ns, int count)
{
    CUresult r = CUDA_SUCCESS;
    for (int i = 0; r == CUDA_SUCCESS && i < count; i++)
        r = launch_spin(API_KERNEL, ns, NULL, NULL);
    return r;
}

static void *handed_over(void *arg)
{
    struct handoff *h = arg;
    h->result = api.CtxSetCurrent(h->ctx);
    if (h->result == CUDA_SUCCESS)
        h->result = launch_spins(h->ns, h->count);
    return NULL;
}

/* Launches spin for ns count times here, then for other_ns count times in a
 * new thread (here if !handing), then spins gap_ns on the host, rounds times. */
static void handoff(const char *label, uint64_t ns, int count, int rounds, uint64_t other_ns,
                    int64_t gap_ns, bool handing)
{
    struct handoff h = {.ns = other_ns, .count = count};
    CUresult r = api.PrimaryCtxRetain(&h.ctx, current_device());
    int64_t start = now_ns();
    long launches = 0;
    for (int round = 0; r == CUDA_SUCCESS && round < rounds; round++, launches += 2L * count) {
        pthread_t thread;
        r = launch_spins(ns, count);
        if (r == CUDA_SUCCESS && !handing) {
            handed_over(&h);
            r = h.result;
        } else if (r == CUDA_SUCCESS && pthread_create(&thread, NULL, handed_over, &h) != 0) {
            r = CUDA_ERROR_OPERATING_SYSTEM;
        } else if (r == CUDA_SUCCESS) {
            pthread_join(thread, NULL);
            r = h.result;
        }
        for (int64_t until = now_ns() + gap_ns; now_ns() < until;)
            ;   /* sleeping would oversleep the gap */
    }
    r = r != CUDA_SUCCESS ? r : api.CtxSynchronize();
    int64_t wall = now_ns() - start;
    if (r)
        out("%s %s\n", label, name(r));
    else
        out("%s %ld %lld %.2f\n", label, launches, (long long)wall,
            100.0 * (double)rounds * count * (double)(ns + other_ns) / (double)wall);
}

/* A stream waits for a value in host memory, written ms later: prints
 * whether an event behind the wait was done before the write, whether it is
 * once synchronized, and the ms that synchronization took. */
static void hold_stream(int ms)
{
    uint32_t *flag = NULL;
    CUdeviceptr at = 0;
    CUstream s = NULL;
    CUevent behind = NULL;
    CUresult r = api.MemHostAlloc((void **)&flag, sizeof *flag, CU_MEMHOSTALLOC_DEVICEMAP);
    if (r == CUDA_SUCCESS)
        r = api.MemHostGetDevicePointer(&at, flag, 0);
    if (r == CUDA_SUCCESS)
        r = api.StreamCreate(&s, CU_STREAM_NON_BLOCKING);
    if (r == CUDA_SUCCESS)
        r = api.EventCreate(&behind, 0);
    if (r == CUDA_SUCCESS) {
        __atomic_store_n(flag, 0, __ATOMIC_RELEASE);
        r = api.StreamWaitValue32(s, at, 1, CU_STREAM_WAIT_VALUE_GEQ);
    }
    if (r == CUDA_SUCCESS)
        r = api.EventRecord(behind, s);
    if (r != CUDA_SUCCESS) {
        out("hold %s\n", name(r));
        return;
    }
    usleep((useconds_t)ms * 1000);
    CUresult early = api.EventQuery(behind);
    __atomic_store_n(flag, 1, __ATOMIC_RELEASE);
    int64_t written = now_ns();
    r = api.EventSynchronize(behind);
    double took = (double)(now_ns() - written) / 1e6;
    CUresult late = r == CUDA_SUCCESS ? api.EventQuery(behind) : r;
    out("hold %s %s %.3f\n", name(early), name(late), took);
}

/* A count the test double keeps (its function's name), as text; "-" on a real driver. */
static const char *fake_count(const char *function, char text[32])
{
    unsigned long (*count)(void) = (unsigned long (*)(void))dlsym(RTLD_DEFAULT, function);
    snprintf(text, 32, count ? "%lu" : "-", count ? count() : 0);
    return text;
}

static int run(char **cmd, int n);

/* Runs one command starting at cmd[0]; returns how many words it used. */
static int step(char **cmd, int left)
{
    const char *c = cmd[0];
    CUresult r;
    CUdeviceptr p = 0;
    const char *a1 = left > 1 ? cmd[1] : "0", *a2 = left > 2 ? cmd[2] : "0",
               *a3 = left > 3 ? cmd[3] : "0";
    if (!strcmp(c, "init")) {
        out("init %s\n", name(api.Init(0)));
        return 1;
    }
    if (!strcmp(c, "ctx")) {
        CUcontext ctx;
        r = api.PrimaryCtxRetain(&ctx, atoi(a1));
        if (r == CUDA_SUCCESS)
            api.CtxSetCurrent(ctx);
        out("ctx %s\n", name(r));
        return 2;
    }
    if (!strcmp(c, "ctxnew")) {
        CUcontext ctx;
        r = api.CtxCreate(&ctx, NULL, 0, atoi(a1));
        report("ctxnew", r, CONTEXT, (uint64_t)(uintptr_t)ctx);
        return 2;
    }
    if (!strcmp(c, "release") || !strcmp(c, "reset")) {
        r = (!strcmp(c, "release") ? api.PrimaryCtxRelease : api.PrimaryCtxReset)(atoi(a1));
        out("%s %s\n", c, name(r));
        return 2;
    }
    if (!strcmp(c, "alloc") || !strcmp(c, "managed")) {
        r = c[0] == 'a' ? api.MemAlloc(&p, size_arg(a1))
                        : api.MemAllocManaged(&p, size_arg(a1), CU_MEM_ATTACH_GLOBAL);
        report(c, r, POINTER, p);
        return 2;
    }
    if (!strcmp(c, "pitch")) {
        size_t pitch = 0;
        r = api.MemAllocPitch(&p, &pitch, size_arg(a1), size_arg(a2), 4);
        last_result = r;
        if (r == CUDA_SUCCESS)
            out("pitch %s %zu %d\n", name(r), pitch, keep(POINTER, p));
        else
            out("pitch %s\n", name(r));
        return 3;
    }
    if (!strcmp(c, "array") || !strcmp(c, "array3d") || !strcmp(c, "mipmap")) {
        CUDA_ARRAY3D_DESCRIPTOR d = {.Width = size_arg(a1), .Height = size_arg(a2),
                                     .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 1};
        if (!strcmp(c, "array")) {
            CUDA_ARRAY_DESCRIPTOR d2 = {.Width = d.Width, .Height = d.Height, .Format = d.Format,
                                        .NumChannels = 1};
            CUarray a = NULL;
            r = api.ArrayCreate(&a, &d2);
            report(c, r, ARRAY, (uint64_t)(uintptr_t)a);
            return 3;
        }
        if (!strcmp(c, "array3d")) {
            CUarray a = NULL;
            d.Depth = size_arg(a3);
            r = api.Array3DCreate(&a, &d);
            report(c, r, ARRAY, (uint64_t)(uintptr_t)a);
            return 4;
        }
        CUmipmappedArray m = NULL;
        r = api.MipmappedArrayCreate(&m, &d, (unsigned)atoi(a3));
        report(c, r, MIPMAP, (uint64_t)(uintptr_t)m);
        return 4;
    }
    if (!strcmp(c, "vmm")) {
        CUmemAllocationProp prop = device_prop(atoi(a2));
        CUmemGenericAllocationHandle h = 0;
        r = api.MemCreate(&h, size_arg(a1), &prop, 0);
        report(c, r, HANDLE, h);
        return 3;
    }
    if (!strcmp(c, "vmmfd")) {
        CUmemAllocationProp prop = device_prop(atoi(a2));
        prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        CUmemGenericAllocationHandle h = 0;
        r = api.MemCreate(&h, size_arg(a1), &prop, 0);
        report(c, r, HANDLE, h);
        return 3;
    }
    if (!strcmp(c, "vmmexport")) {
        int n = atoi(a1), fd = -1;
        r = n >= 0 && n < nobjects && objects[n].kind == HANDLE
                ? api.MemExportToShareableHandle(&fd, objects[n].handle,
                                                 CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0)
                : CUDA_ERROR_INVALID_VALUE;
        /* Any process of this user may take the descriptor (Yama's ptrace scope 1). */
        prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
        out("vmmexport %s %d %d\n", name(r), (int)getpid(), fd);
        return 2;
    }
    if (!strcmp(c, "vmmimport")) {
        int pidfd = (int)syscall(SYS_pidfd_open, atoi(a1), 0);
        int fd = pidfd < 0 ? -1 : (int)syscall(SYS_pidfd_getfd, pidfd, atoi(a2), 0);
        if (fd < 0)
            die("cannot take the exported descriptor (pidfd_getfd):", strerror(errno));
        CUmemGenericAllocationHandle h = 0;
        r = api.MemImportFromShareableHandle(&h, (void *)(intptr_t)fd,
                                             CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
        close(fd);
        close(pidfd);
        report(c, r, HANDLE, h);
        return 3;
    }
    if (!strcmp(c, "vmmmap") || !strcmp(c, "vmmmap2")) {
        /* One handle, or two side by side in one range (unmapped together by `free`). */
        int count = c[6] ? 2 : 1, n[2] = {atoi(a1), atoi(count == 2 ? a2 : a1)};
        size_t size = size_arg(count == 2 ? a3 : a2);
        for (int i = 0; i < count; i++)
            if (n[i] < 0 || n[i] >= nobjects || objects[n[i]].kind != HANDLE)
                die("not a VMM handle:", i ? a2 : a1);
        CUdeviceptr at = 0;
        r = api.MemAddressReserve(&at, count * size, 0, 0, 0);
        for (int i = 0; i < count && r == CUDA_SUCCESS; i++)
            if ((r = api.MemMap(at + i * size, size, 0, objects[n[i]].handle, 0)) != CUDA_SUCCESS) {
                if (i)
                    api.MemUnmap(at, size);
                api.MemAddressFree(at, count * size);
            }
        if (r == CUDA_SUCCESS) {
            CUmemAccessDesc access = {{CU_MEM_LOCATION_TYPE_DEVICE, current_device()},
                                      CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
            r = api.MemSetAccess(at, count * size, &access, 1);
        }
        report(c, r, MAPPING, at);
        if (r == CUDA_SUCCESS)
            objects[nobjects - 1].size = count * size;
        return 2 + count;
    }
    if (!strcmp(c, "vmmretain")) {
        int n = atoi(a1);
        CUmemGenericAllocationHandle h = 0;
        r = n >= 0 && n < nobjects && objects[n].kind == MAPPING
                ? api.MemRetainAllocationHandle(&h, (void *)(uintptr_t)objects[n].handle)
                : CUDA_ERROR_INVALID_VALUE;
        report(c, r, HANDLE, h);
        return 2;
    }
    if (!strcmp(c, "granularity")) {
        CUmemAllocationProp prop = device_prop(current_device());
        size_t g = 0;
        r = api.MemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
        out("granularity %s %zu\n", name(r), g);
        return 1;
    }
    if (!strcmp(c, "async")) {
        r = api.MemAllocAsync(&p, size_arg(a1), 0);
        report(c, r, ASYNC, p);
        return 2;
    }
    if (!strcmp(c, "pool") || !strcmp(c, "hostpool")) {
        CUmemoryPool *which = c[0] == 'p' ? &pool : &host_pool;
        if (!*which)
            *which = make_pool(c[0] == 'p' ? CU_MEM_LOCATION_TYPE_DEVICE : CU_MEM_LOCATION_TYPE_HOST);
        r = *which ? api.MemAllocFromPoolAsync(&p, size_arg(a1), *which, 0) : CUDA_ERROR_INVALID_VALUE;
        report(c, r, ASYNC, p);
        return 2;
    }
    if (!strcmp(c, "sync")) {
        out("sync %s\n", name(api.StreamSynchronize(0)));
        return 1;
    }
    if (!strcmp(c, "trim")) {
        out("trim %s\n", name(api.MemPoolTrimTo(pool, size_arg(a1))));
        return 2;
    }
    if (!strcmp(c, "pooldestroy")) {
        out("pooldestroy %s\n", name(api.MemPoolDestroy(pool)));
        pool = NULL;
        return 1;
    }
    if (!strcmp(c, "free") || !strcmp(c, "freeasync") || !strcmp(c, "ctxdestroy")) {
        out("%s %s\n", c, name(free_object(atoi(a1))));
        return 2;
    }
    if (!strcmp(c, "fill")) {
        size_t chunk = size_arg(a1), count = 0;
        while ((r = api.MemAlloc(&p, chunk)) == CUDA_SUCCESS) {
            keep(POINTER, p);
            count++;
        }
        out("fill %zu %s\n", count, name(r));
        return 2;
    }
    if (!strcmp(c, "fillwith")) {
        /* Repeats the allocation command that follows until it fails. */
        size_t count = 0;
        int used = 1;
        const char *saved = prefix;
        prefix = "# ";
        do {
            used = step(cmd + 1, left - 1);
        } while (last_result == CUDA_SUCCESS && ++count < 100000);
        prefix = saved;
        out("fillwith %zu %s\n", count, name(last_result));
        return 1 + used;
    }
    if (!strcmp(c, "info")) {
        size_t free = 0, total = 0;
        r = api.MemGetInfo(&free, &total);
        out("info %s %zu %zu\n", name(r), free, total);
        return 1;
    }
    if (!strcmp(c, "total")) {
        size_t total = 0;
        r = api.DeviceTotalMem(&total, atoi(a1));
        out("total %s %zu\n", name(r), total);
        return 2;
    }
    if (!strcmp(c, "nvml")) {
        nvml_report();
        return 1;
    }
    if (!strcmp(c, "wait")) {
        char line[64];
        out("waiting\n");
        fflush(stdout);
        if (!fgets(line, sizeof line, stdin))
            exit(0);
        return 1;
    }
    if (!strcmp(c, "sleep")) {
        usleep((useconds_t)atoi(a1) * 1000);
        return 2;
    }
    if (!strcmp(c, "fork")) {
        char copy[1024], *words[128];
        int n = 0;
        snprintf(copy, sizeof copy, "%s", a1);
        for (char *save, *w = strtok_r(copy, "; ", &save); w && n < 128; w = strtok_r(NULL, "; ", &save))
            words[n++] = w;
        fflush(stdout);
        pid_t child = fork();
        if (child == 0) {
            prefix = "child ";
            run(words, n);
            exit(0);
        }
        int status = 0;
        waitpid(child, &status, 0);
        out("fork %d\n", WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
        return 2;
    }
    if (!strcmp(c, "hammer")) {
        static pthread_t thread;
        CUcontext ctx = NULL;
        api.PrimaryCtxRetain(&ctx, current_device());
        bool streams = !strcmp(a1, "streams");
        hammer_bytes = streams ? 0 : size_arg(a1);
        hammering = streams || hammer_bytes > 0;
        if (hammering)
            pthread_create(&thread, NULL, hammer, ctx);
        else
            pthread_join(thread, NULL);
        out("hammer %s\n", hammering ? "on" : "off");
        return 2;
    }
    if (!strcmp(c, "module")) {
        CUmodule module;
        r = api.ModuleLoadData(&module, spin_ptx);
        if (r == CUDA_SUCCESS)
            r = api.ModuleGetFunction(&spin, module, "spin");
        out("module %s\n", name(r));
        return 1;
    }
    if (!strcmp(c, "load")) {
        enum api_kind kind = api_kind(a1);
        uint64_t ns = strtoull(a2, NULL, 10);
        char label[64];
        snprintf(label, sizeof label, "load %s", a1);
        load(label, kind, ns, NULL, ns, atoll(a3), left > 4 ? atoi(cmd[4]) : 0,
             left > 5 ? atoi(cmd[5]) : 1);
        return 6;
    }
    if (!strcmp(c, "capture")) {
        enum api_kind kind = api_kind(a1);
        uint64_t ns = strtoull(a2, NULL, 10);
        int count = atoi(a3);
        CUgraphExec inner = NULL;
        size_t nodes = 0;
        r = kind == API_GRAPH ? capture_graph(API_KERNEL, ns, 1, CU_STREAM_CAPTURE_MODE_RELAXED,
                                              NULL, &inner, &nodes)
                              : CUDA_SUCCESS;
        /* Work still running while the capture goes on: the pacing thread reads its events. */
        CUstream busy;
        if (r == CUDA_SUCCESS)
            r = api.StreamCreate(&busy, CU_STREAM_NON_BLOCKING);
        /* Two blocks: another kernel to the pacing than the one-block launches. */
        uint64_t long_ns = 10000000;
        for (int i = 0; r == CUDA_SUCCESS && i < 5; i++)
            r = api.LaunchKernel(spin, 2, 1, 1, 1, 1, 1, 0, busy, (void *[]){&long_ns}, NULL);
        if (r == CUDA_SUCCESS)
            r = capture_graph(kind, ns, count, CU_STREAM_CAPTURE_MODE_GLOBAL, inner, &captured,
                              &nodes);
        captured_ns = ns * (uint64_t)count;
        char counted[32];
        out("capture %s %zu %s\n", name(r), nodes, fake_count("fakeRecordsInCapture", counted));
        return 4;
    }
    if (!strcmp(c, "gcapture") || !strcmp(c, "gnode")) {
        /* An executable graph of one allocation: captured (cuMemAllocAsync in
         * a capture of mode a1, freed in the graph if a3 is "free") or built
         * with cuGraphAddMemAllocNode. */
        CUgraph graph = NULL;
        CUgraphExec exec = NULL;
        bool capture = c[1] == 'c';
        if (capture) {
            CUstream s;
            CUstreamCaptureMode mode = !strcmp(a1, "global")   ? CU_STREAM_CAPTURE_MODE_GLOBAL
                                       : !strcmp(a1, "thread") ? CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
                                                               : CU_STREAM_CAPTURE_MODE_RELAXED;
            r = api.StreamCreate(&s, CU_STREAM_NON_BLOCKING);
            if (r == CUDA_SUCCESS)
                r = api.StreamBeginCapture(s, mode);
            CUresult allocated = api.MemAllocAsync(&p, size_arg(a2), s);
            if (allocated == CUDA_SUCCESS && !strcmp(a3, "free"))
                allocated = api.MemFreeAsync(p, s);
            CUresult ended = r == CUDA_SUCCESS ? api.StreamEndCapture(s, &graph) : r;
            r = allocated != CUDA_SUCCESS ? allocated : ended;
        } else {
            CUgraphNode node;
            CUDA_MEM_ALLOC_NODE_PARAMS params = {0};
            params.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
            params.poolProps.location = (CUmemLocation){CU_MEM_LOCATION_TYPE_DEVICE, current_device()};
            params.bytesize = size_arg(a1);
            r = api.GraphCreate(&graph, 0);
            if (r == CUDA_SUCCESS)
                r = api.GraphAddMemAllocNode(&node, graph, NULL, 0, &params);
        }
        if (r == CUDA_SUCCESS)
            r = api.GraphInstantiate(&exec, graph, 0);
        report(c, r, GRAPH, (uint64_t)(uintptr_t)exec);
        return capture ? 4 : 2;
    }
    if (!strcmp(c, "glaunch") || !strcmp(c, "gupload")) {
        int n = atoi(a1);
        if (n < 0 || n >= nobjects || objects[n].kind != GRAPH)
            die("not a graph:", a1);
        CUgraphExec exec = (CUgraphExec)objects[n].handle;
        r = c[1] == 'l' ? api.GraphLaunch(exec, 0) : api.GraphUpload(exec, 0);
        if (r == CUDA_SUCCESS)
            r = api.StreamSynchronize(0);
        out("%s %s\n", c, name(r));
        return 2;
    }
    if (!strcmp(c, "bgcapture")) {
        /* Another thread begins a capture of mode a1 and holds it open until bgend. */
        bg.mode = !strcmp(a1, "global")   ? CU_STREAM_CAPTURE_MODE_GLOBAL
                  : !strcmp(a1, "thread") ? CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
                                          : CU_STREAM_CAPTURE_MODE_RELAXED;
        api.PrimaryCtxRetain(&bg.context, current_device());
        bg.stage = 0;
        pthread_create(&bg.thread, NULL, bg_capture, NULL);
        bg_wait(1);
        out("bgcapture %s\n", name(bg.begun));
        return 2;
    }
    if (!strcmp(c, "bgend")) {
        bg_stage(2);
        bg_wait(3);
        pthread_join(bg.thread, NULL);
        out("bgend %s\n", name(bg.ended));
        return 1;
    }
    if (!strcmp(c, "ipcexport")) {
        /* Prints the IPC handle of allocation N as hex, for another process's ipcopen. */
        int n = atoi(a1);
        CUipcMemHandle h = {{0}};
        r = n >= 0 && n < nobjects ? api.IpcGetMemHandle(&h, objects[n].handle)
                                   : CUDA_ERROR_INVALID_VALUE;
        char hex[2 * sizeof h + 1] = "-";
        for (size_t i = 0; r == CUDA_SUCCESS && i < sizeof h; i++)
            snprintf(hex + 2 * i, 3, "%02x", (unsigned char)h.reserved[i]);
        out("ipcexport %s %s\n", name(r), hex);
        return 2;
    }
    if (!strcmp(c, "ipcopen")) {
        CUipcMemHandle h = {{0}};
        for (size_t i = 0; i < sizeof h && a1[2 * i] && a1[2 * i + 1]; i++) {
            unsigned byte = 0;
            sscanf(a1 + 2 * i, "%2x", &byte);
            h.reserved[i] = (char)byte;
        }
        r = api.IpcOpenMemHandle(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
        report(c, r, IPC, p);
        return 2;
    }
    if (!strcmp(c, "gtrim")) {
        out("gtrim %s\n", name(api.DeviceGraphMemTrim(current_device())));
        return 1;
    }
    if (!strcmp(c, "gmem")) {
        cuuint64_t reserved = 0;
        r = api.DeviceGetGraphMemAttribute(current_device(), CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT,
                                           &reserved);
        out("gmem %s %llu\n", name(r), (unsigned long long)reserved);
        return 1;
    }
    if (!strcmp(c, "badlaunch")) {
        void *params[] = {&(uint64_t){1000}};
        r = CUDA_SUCCESS;
        for (int i = 0; i < atoi(a1); i++)
            r = api.LaunchKernel(NULL, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL);
        out("badlaunch %s\n", name(r));
        return 2;
    }
    if (!strcmp(c, "hold")) {
        hold_stream(atoi(a1));
        return 2;
    }
    if (!strcmp(c, "gaps")) {
        gaps(strtoull(a1, NULL, 10), atoll(a2) * 1000, atoll(a3), 0, false);
        return 4;
    }
    if (!strcmp(c, "shapes")) {
        shapes(strtoull(a1, NULL, 10), (unsigned)atoi(a2), atoi(a3));
        return 4;
    }
    if (!strcmp(c, "handoff") || !strcmp(c, "varying")) {
        handoff(c, strtoull(a1, NULL, 10), atoi(a2), atoi(a3),
                left > 4 ? strtoull(cmd[4], NULL, 10) : 0, left > 5 ? atoll(cmd[5]) * 1000 : 0,
                !strcmp(c, "handoff"));
        return 6;
    }
    if (!strcmp(c, "gapslate")) {
        gaps(strtoull(a1, NULL, 10), atoll(a2) * 1000, atoll(a3), 0, true);
        return 4;
    }
    if (!strcmp(c, "gapsmemset")) {
        gaps(strtoull(a1, NULL, 10), atoll(a2) * 1000, atoll(a3),
             left > 4 ? strtoull(cmd[4], NULL, 10) : 0, false);
        return 5;
    }
    if (!strcmp(c, "records")) {
        char counted[32];
        out("records %s\n", fake_count("fakeEventRecords", counted));
        return 1;
    }
    if (!strcmp(c, "captureasks")) {
        char counted[32];
        out("captureasks %s\n", fake_count("fakeCaptureQueries", counted));
        return 1;
    }
    if (!strcmp(c, "threads")) {
        DIR *d = opendir("/proc/self/task");
        int n = 0;
        for (struct dirent *e; d && (e = readdir(d));)
            n += e->d_name[0] != '.';
        if (d)
            closedir(d);
        out("threads %d\n", n);
        return 1;
    }
    if (!strcmp(c, "replay")) {
        if (!captured)
            die("replay needs a capture first", NULL);
        load("replay", API_GRAPH, 0, captured, captured_ns, atoll(a1), 1, 1);
        return 2;
    }
    if (!strcmp(c, "resolve")) {
        resolve_all();
        return 1;
    }
    if (!strcmp(c, "wrapped")) {
#define VC_PRINT(sym, params, args) out("wrapped %s\n", #sym);
        VC_INTERCEPTED(VC_PRINT, VC_PRINT, VC_PRINT)
#undef VC_PRINT
        return 1;
    }
    die("unknown command", c);
    return 0;
}

static int run(char **cmd, int n)
{
    for (int i = 0; i < n;) {
        i += step(cmd + i, n - i);
        fflush(stdout);
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2)
        die("usage: probe link|dlsym|getproc|getproc-ptsz COMMAND...", NULL);
    bind_all(argv[1]);
    return run(argv + 2, argc - 2);
}
