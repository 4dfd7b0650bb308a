// CUDA graphs that allocate memory, as a user writes them (nvcc, static cudart).
//
//   graph_alloc capture MODE GRAPHS MIB [free|keep]
//       GRAPHS stream captures in MODE (global, thread, relaxed), each of
//       cudaMallocAsync(MIB), a memset, a kernel that writes it, a copy of its
//       first half onto its second, and (free) cudaFreeAsync; each graph is
//       instantiated, uploaded, launched twice (free) or once (keep) and checked.
//   graph_alloc node GRAPHS MIB
//       the same graphs built with cudaGraphAddMemAllocNode and a kernel node.
//   graph_alloc unsafe
//       begins a global-mode capture, makes one driver call the library makes
//       for itself, captures a kernel and ends the capture: one line a call,
//       "unsafe NAME RESULT END-CAPTURE-RESULT", outside any library.
//
// Each graph prints "graph I capture=.. instantiate=.. upload=.. launch=.. check=..
// reserved=.. used=.." (the driver's graph memory of device 0 after it), then
// "done OK-GRAPHS" and the program waits for a line on stdin (the caller
// measures it from outside) before it exits.
#include <cuda.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

__global__ void fill(unsigned *p, size_t n, unsigned value)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        p[i] = value + (unsigned)i;
}

__global__ void count_wrong(const unsigned *p, size_t n, unsigned value, unsigned long long *wrong)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t half = n / 2;
        unsigned want = value + (unsigned)(i >= half ? i - half : i);
        if (p[i] != want)
            atomicAdd(wrong, 1ULL);
    }
}

static const char *name(cudaError_t e) { return cudaGetErrorName(e); }

static void graph_memory(unsigned long long *reserved, unsigned long long *used)
{
    *reserved = *used = 0;
    cudaDeviceGetGraphMemAttribute(0, cudaGraphMemAttrReservedMemCurrent, reserved);
    cudaDeviceGetGraphMemAttribute(0, cudaGraphMemAttrUsedMemCurrent, used);
}

static cudaStreamCaptureMode capture_mode(const char *text)
{
    if (!strcmp(text, "global"))
        return cudaStreamCaptureModeGlobal;
    if (!strcmp(text, "thread"))
        return cudaStreamCaptureModeThreadLocal;
    if (!strcmp(text, "relaxed"))
        return cudaStreamCaptureModeRelaxed;
    std::fprintf(stderr, "graph_alloc: capture mode must be global, thread or relaxed\n");
    std::exit(2);
}

// The body every graph runs on p (n words): memset, fill, copy first half onto second.
static void body(cudaStream_t s, unsigned *p, size_t n, unsigned value)
{
    cudaMemsetAsync(p, 0, n * sizeof *p, s);
    fill<<<1024, 256, 0, s>>>(p, n / 2, value);
    cudaMemcpyAsync(p + n / 2, p, n / 2 * sizeof *p, cudaMemcpyDeviceToDevice, s);
}

// The graph's check, run as one more captured-free step after a launch: a second
// buffer holds the count of wrong words. Needs p alive, so only for kept memory.
static unsigned long long wrong_words(cudaStream_t s, unsigned *p, size_t n, unsigned value)
{
    unsigned long long *wrong = nullptr, result = ~0ULL;
    if (cudaMalloc(&wrong, sizeof *wrong) != cudaSuccess)
        return result;
    cudaMemsetAsync(wrong, 0, sizeof *wrong, s);
    count_wrong<<<1024, 256, 0, s>>>(p, n, value, wrong);
    cudaMemcpyAsync(&result, wrong, sizeof result, cudaMemcpyDeviceToHost, s);
    cudaStreamSynchronize(s);
    cudaFree(wrong);
    return result;
}

struct built {
    cudaGraph_t graph = nullptr;
    unsigned *p = nullptr;
    cudaError_t made = cudaSuccess;
};

static built by_capture(cudaStream_t s, cudaStreamCaptureMode mode, size_t bytes, bool free_it,
                        unsigned value)
{
    built b;
    cudaError_t e = cudaStreamBeginCapture(s, mode);
    if (e != cudaSuccess) {
        b.made = e;
        return b;
    }
    cudaMallocAsync((void **)&b.p, bytes, s);
    body(s, b.p, bytes / sizeof *b.p, value);
    if (free_it)
        cudaFreeAsync(b.p, s);
    b.made = cudaStreamEndCapture(s, &b.graph);
    return b;
}

static built by_nodes(size_t bytes, unsigned value)
{
    built b;
    cudaGraphCreate(&b.graph, 0);
    cudaMemAllocNodeParams params = {};
    params.poolProps.allocType = cudaMemAllocationTypePinned;
    params.poolProps.location = {cudaMemLocationTypeDevice, 0};
    params.bytesize = bytes;
    cudaGraphNode_t alloc, kernel;
    b.made = cudaGraphAddMemAllocNode(&alloc, b.graph, nullptr, 0, &params);
    if (b.made != cudaSuccess)
        return b;
    b.p = (unsigned *)params.dptr;
    size_t n = bytes / sizeof *b.p;
    void *args[] = {&b.p, &n, &value};
    cudaKernelNodeParams k = {};
    k.func = (void *)fill;
    k.gridDim = dim3(1024);
    k.blockDim = dim3(256);
    k.kernelParams = args;
    b.made = cudaGraphAddKernelNode(&kernel, b.graph, &alloc, 1, &k);
    return b;
}

static int graphs(int argc, char **argv, bool capture)
{
    int shift = capture ? 1 : 0;
    if (argc < 4 + shift) {
        std::fprintf(stderr, "usage: graph_alloc capture MODE GRAPHS MIB [free|keep] | node GRAPHS MIB\n");
        return 2;
    }
    cudaStreamCaptureMode mode = capture ? capture_mode(argv[2]) : cudaStreamCaptureModeGlobal;
    int count = std::atoi(argv[2 + shift]);
    size_t bytes = (size_t)std::atol(argv[3 + shift]) << 20;
    bool free_it = capture && argc > 4 + shift && !strcmp(argv[4 + shift], "free");
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    cudaFree(nullptr);
    int ok = 0;
    std::vector<cudaGraphExec_t> kept;
    for (int i = 0; i < count; i++) {
        unsigned value = 1000u * (i + 1);
        built b = capture ? by_capture(s, mode, bytes, free_it, value) : by_nodes(bytes, value);
        cudaGetLastError();
        cudaGraphExec_t exec = nullptr;
        cudaError_t inst = b.made == cudaSuccess ? cudaGraphInstantiate(&exec, b.graph, 0)
                                                 : cudaErrorInvalidValue;
        cudaError_t upload = inst == cudaSuccess ? cudaGraphUpload(exec, s) : inst;
        cudaError_t launch = upload == cudaSuccess ? cudaGraphLaunch(exec, s) : upload;
        if (launch == cudaSuccess && free_it)
            launch = cudaGraphLaunch(exec, s);
        if (launch == cudaSuccess)
            launch = cudaStreamSynchronize(s);
        cudaGetLastError();
        unsigned long long wrong = ~0ULL;
        if (launch == cudaSuccess && !free_it)
            wrong = capture ? wrong_words(s, b.p, bytes / sizeof *b.p, value) : 0;
        bool good = launch == cudaSuccess && (free_it || wrong == 0);
        ok += good;
        unsigned long long reserved, used;
        graph_memory(&reserved, &used);
        std::printf("graph %d capture=%s instantiate=%s upload=%s launch=%s check=%s reserved=%llu used=%llu\n",
                    i, name(b.made), name(inst), name(upload), name(launch),
                    free_it ? "freed" : (wrong == 0 ? "ok" : "wrong"), reserved, used);
        std::fflush(stdout);
        if (exec)
            kept.push_back(exec);
        if (b.graph)
            cudaGraphDestroy(b.graph);
    }
    std::printf("done %d\n", ok);
    std::fflush(stdout);
    char line[16];
    if (!std::fgets(line, sizeof line, stdin))
        return 0;
    for (cudaGraphExec_t exec : kept)
        cudaGraphExecDestroy(exec);
    cudaDeviceSynchronize();
    unsigned long long reserved, used;
    graph_memory(&reserved, &used);
    std::printf("destroyed reserved=%llu used=%llu\n", reserved, used);
    cudaDeviceGraphMemTrim(0);
    graph_memory(&reserved, &used);
    std::printf("trimmed reserved=%llu used=%llu\n", reserved, used);
    return 0;
}

// One driver call the library makes on its own behalf, inside a global capture.
static CUresult unsafe_call(const std::string &which, CUstream s)
{
    CUcontext ctx;
    CUdevice dev;
    CUmemoryPool pool;
    cuuint64_t value;
    CUstreamCaptureStatus status;
    CUuuid uuid;
    size_t free_bytes, total_bytes;
    CUevent event;
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    cuDeviceGetMemPool(&pool, 0);
    if (which == "cuCtxGetCurrent") return cuCtxGetCurrent(&ctx);
    if (which == "cuCtxGetDevice") return cuCtxGetDevice(&dev);
    if (which == "cuDeviceGetMemPool") return cuDeviceGetMemPool(&pool, 0);
    if (which == "cuMemPoolGetAttribute") return cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &value);
    if (which == "cuMemPoolGetAttribute_used") return cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &value);
    if (which == "cuDeviceGetGraphMemAttribute") return cuDeviceGetGraphMemAttribute(0, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, &value);
    if (which == "cuStreamIsCapturing") return cuStreamIsCapturing(s, &status);
    if (which == "cuStreamIsCapturing_legacy") return cuStreamIsCapturing(CU_STREAM_LEGACY, &status);
    if (which == "cuDeviceGetUuid_v2") return cuDeviceGetUuid_v2(&uuid, 0);
    if (which == "cuMemGetInfo") return cuMemGetInfo(&free_bytes, &total_bytes);
    if (which == "cuEventQuery") {
        cuEventCreate(&event, CU_EVENT_DISABLE_TIMING);
        return cuEventQuery(event);
    }
    if (which == "cuMemPoolTrimTo") return cuMemPoolTrimTo(pool, ~(size_t)0);
    if (which == "cuDeviceGraphMemTrim") return cuDeviceGraphMemTrim(0);
    if (which == "relaxed_cuMemPoolGetAttribute") {
        cuThreadExchangeStreamCaptureMode(&mode);
        CUresult r = cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &value);
        cuThreadExchangeStreamCaptureMode(&mode);
        return r;
    }
    if (which == "relaxed_cuMemGetInfo") {
        cuThreadExchangeStreamCaptureMode(&mode);
        CUresult r = cuMemGetInfo(&free_bytes, &total_bytes);
        cuThreadExchangeStreamCaptureMode(&mode);
        return r;
    }
    if (which == "relaxed_cuDeviceGraphMemTrim") {
        cuThreadExchangeStreamCaptureMode(&mode);
        CUresult r = cuDeviceGraphMemTrim(0);
        cuThreadExchangeStreamCaptureMode(&mode);
        return r;
    }
    return CUDA_ERROR_NOT_FOUND;
}

static int unsafe()
{
    const char *calls[] = {"cuCtxGetCurrent", "cuCtxGetDevice", "cuDeviceGetMemPool",
                           "cuMemPoolGetAttribute", "cuMemPoolGetAttribute_used",
                           "cuDeviceGetGraphMemAttribute", "cuStreamIsCapturing",
                           "cuStreamIsCapturing_legacy", "cuDeviceGetUuid_v2", "cuMemGetInfo",
                           "cuEventQuery", "cuMemPoolTrimTo", "cuDeviceGraphMemTrim",
                           "relaxed_cuMemPoolGetAttribute", "relaxed_cuMemGetInfo",
                           "relaxed_cuDeviceGraphMemTrim"};
    cudaFree(nullptr);
    unsigned *p;
    cudaMalloc(&p, 1 << 20);
    for (const char *call : calls) {
        cudaStream_t s;
        cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
        cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
        const char *result = nullptr;
        cuGetErrorName(unsafe_call(call, (CUstream)s), &result);
        fill<<<1, 32, 0, s>>>(p, 32, 1);
        cudaGraph_t graph = nullptr;
        cudaError_t end = cudaStreamEndCapture(s, &graph);
        cudaGetLastError();
        std::printf("unsafe %s %s %s\n", call, result ? result : "?", name(end));
        if (graph)
            cudaGraphDestroy(graph);
        cudaStreamDestroy(s);
    }
    std::printf("done 0\n");
    return 0;
}

int main(int argc, char **argv)
{
    std::string what = argc > 1 ? argv[1] : "";
    if (what == "capture")
        return graphs(argc, argv, true);
    if (what == "node")
        return graphs(argc, argv, false);
    if (what == "unsafe")
        return unsafe();
    std::fprintf(stderr, "usage: graph_alloc capture MODE GRAPHS MIB [free|keep] | node GRAPHS MIB | unsafe\n");
    return 2;
}
