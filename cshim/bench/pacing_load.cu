// A GPU load for the compute-share tests and benchmark: launches one kind of
// kernel back to back and reports the rate it got.
//
//   pacing_load KIND SECONDS [STREAMS [START_AT]]
//
// KIND is matmul (a bf16 8192x8192x8192 cublasGemmEx, about 1.7 ms on an
// H200; cuBLAS is opened at run time from $VCUDA_CUBLAS, else by its usual
// names) or elementwise (y = a*x + y over 4M floats, about 10 us). Kernels go
// round robin over STREAMS streams (default 1), at most DEPTH checkpoints
// ahead of the GPU. A warm-up runs until START_AT (CLOCK_REALTIME seconds, so
// several processes can measure the same interval), else for 0.5 s; then the
// kernels of the next SECONDS are counted. Prints one line:
//   kind K streams S kernels N seconds T rate R window_min A window_max B all M
// R is kernels a second until all of them completed; A and B, the lowest and
// highest rate over the 2-second windows inside the measurement; M, the
// kernels launched, warm-up included. With $PACING_LOAD_TRACE set, the
// checkpoints go to that file too, a line each: wall-clock seconds and the
// kernels counted by then (what a caller cuts into phases of its own).
#include <dlfcn.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#define DEPTH 3
#define MAX_STREAMS 16

typedef int (*cublas_create_fn)(void **);
typedef int (*cublas_set_stream_fn)(void *, cudaStream_t);
typedef int (*cublas_gemm_ex_fn)(void *, int, int, int, int, int, const void *, const void *, int,
                                 int, const void *, int, int, const void *, void *, int, int, int,
                                 int);

// cuBLAS values, declared here so no cuBLAS header is needed (cudaDataType comes with CUDA).
enum { CUBLAS_OP_N = 0, CUBLAS_COMPUTE_32F = 68, CUBLAS_GEMM_DEFAULT = -1 };
static const int MATMUL_N = 8192;
static const int ELEMENTS = 4 << 20;

__global__ void axpy(float a, const float *x, float *y, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        y[i] = a * x[i] + y[i];
}

__global__ void fill_bf16(unsigned short *p, size_t n)
{
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n)
        p[i] = 0x3c00;   // 0.0078125: products stay finite
}

static double now_s()
{
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

static void check(cudaError_t e, const char *what)
{
    if (e != cudaSuccess) {
        std::fprintf(stderr, "pacing_load: %s: %s\n", what, cudaGetErrorName(e));
        std::exit(1);
    }
}

struct load {
    bool matmul;
    int nstreams;
    cudaStream_t streams[MAX_STREAMS];
    void *handles[MAX_STREAMS];
    cublas_gemm_ex_fn gemm;
    void *a, *b, *c;
    float *x, *y;
};

static void open_cublas(load &l)
{
    const char *named = std::getenv("VCUDA_CUBLAS");
    const char *names[] = {named, "libcublas.so.13", "libcublas.so.12", "libcublas.so"};
    void *lib = nullptr;
    for (const char *name : names)
        if (name && !lib)
            lib = dlopen(name, RTLD_NOW | RTLD_GLOBAL);
    if (!lib) {
        std::fprintf(stderr, "pacing_load: cannot open cuBLAS (set VCUDA_CUBLAS): %s\n", dlerror());
        std::exit(1);
    }
    auto create = (cublas_create_fn)dlsym(lib, "cublasCreate_v2");
    auto set_stream = (cublas_set_stream_fn)dlsym(lib, "cublasSetStream_v2");
    l.gemm = (cublas_gemm_ex_fn)dlsym(lib, "cublasGemmEx");
    for (int i = 0; i < l.nstreams; i++)
        if (!create || !set_stream || !l.gemm || create(&l.handles[i]) != 0
            || set_stream(l.handles[i], l.streams[i]) != 0) {
            std::fprintf(stderr, "pacing_load: cuBLAS unusable\n");
            std::exit(1);
        }
}

static void prepare(load &l)
{
    for (int i = 0; i < l.nstreams; i++)
        check(cudaStreamCreateWithFlags(&l.streams[i], cudaStreamNonBlocking), "stream");
    if (l.matmul) {
        size_t n = (size_t)MATMUL_N * MATMUL_N;
        for (void **p : {&l.a, &l.b, &l.c})
            check(cudaMalloc(p, n * 2), "cudaMalloc");
        fill_bf16<<<(unsigned)((n + 255) / 256), 256>>>((unsigned short *)l.a, n);
        fill_bf16<<<(unsigned)((n + 255) / 256), 256>>>((unsigned short *)l.b, n);
        open_cublas(l);
    } else {
        check(cudaMalloc(&l.x, ELEMENTS * sizeof(float)), "cudaMalloc");
        check(cudaMalloc(&l.y, ELEMENTS * sizeof(float)), "cudaMalloc");
        check(cudaMemset(l.x, 0, ELEMENTS * sizeof(float)), "cudaMemset");
        check(cudaMemset(l.y, 0, ELEMENTS * sizeof(float)), "cudaMemset");
    }
    check(cudaDeviceSynchronize(), "set-up");
}

static void launch(load &l, long i)
{
    int s = (int)(i % l.nstreams);
    if (l.matmul) {
        const float one = 1.0f, zero = 0.0f;
        if (l.gemm(l.handles[s], CUBLAS_OP_N, CUBLAS_OP_N, MATMUL_N, MATMUL_N, MATMUL_N, &one, l.a,
                   CUDA_R_16BF, MATMUL_N, l.b, CUDA_R_16BF, MATMUL_N, &zero, l.c, CUDA_R_16BF,
                   MATMUL_N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) != 0) {
            std::fprintf(stderr, "pacing_load: cublasGemmEx failed\n");
            std::exit(1);
        }
    } else {
        axpy<<<ELEMENTS / 256, 256, 0, l.streams[s]>>>(1.0001f, l.x, l.y, ELEMENTS);
    }
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        std::fprintf(stderr, "usage: pacing_load matmul|elementwise SECONDS [STREAMS [START_AT]]\n");
        return 2;
    }
    load l = {};
    l.matmul = std::strcmp(argv[1], "matmul") == 0;
    double seconds = std::atof(argv[2]);
    l.nstreams = argc > 3 ? std::atoi(argv[3]) : 1;
    if (l.nstreams < 1 || l.nstreams > MAX_STREAMS || (!l.matmul && std::strcmp(argv[1], "elementwise"))) {
        std::fprintf(stderr, "pacing_load: bad kind or stream count\n");
        return 2;
    }
    prepare(l);
    long batch = l.matmul ? 1 : 64;
    cudaEvent_t marks[DEPTH][MAX_STREAMS];
    for (auto &row : marks)
        for (int s = 0; s < l.nstreams; s++)
            check(cudaEventCreateWithFlags(&row[s], cudaEventDisableTiming), "event");
    // The warm-up ends at START_AT (wall clock) or after 0.5 s.
    double start_at = argc > 4 ? std::atof(argv[4]) : 0;
    double wall_now = std::chrono::duration<double>(
                          std::chrono::system_clock::now().time_since_epoch()).count();
    double to_wall = wall_now - now_s();  // the trace's times are wall-clock seconds
    double warm_until = now_s() + (start_at > wall_now ? start_at - wall_now : 0.5);
    double start = 0, stop = 0;
    long counted_from = 0, i = 0;
    std::vector<std::pair<double, long>> checkpoints;
    for (long round = 0;; round++) {
        double t = now_s();
        if (!start && t >= warm_until) {
            start = t;
            stop = start + seconds;
            counted_from = i;
        }
        if (start) {
            checkpoints.push_back({t, i - counted_from});
            if (t >= stop)
                break;
        }
        for (long k = 0; k < batch; k++, i++)
            launch(l, i);
        for (int s = 0; s < l.nstreams; s++) {
            if (round >= DEPTH)
                check(cudaEventSynchronize(marks[round % DEPTH][s]), "checkpoint");
            check(cudaEventRecord(marks[round % DEPTH][s], l.streams[s]), "checkpoint");
        }
    }
    check(cudaDeviceSynchronize(), "the end");
    double elapsed = now_s() - start;
    long kernels = i - counted_from;
    double low = 1e30, high = 0;
    for (size_t a = 0, b = 0; a < checkpoints.size(); a++) {
        while (b < checkpoints.size() && checkpoints[b].first - checkpoints[a].first < 2.0)
            b++;
        if (b == checkpoints.size())
            break;
        double rate = (checkpoints[b].second - checkpoints[a].second)
                      / (checkpoints[b].first - checkpoints[a].first);
        low = rate < low ? rate : low;
        high = rate > high ? rate : high;
    }
    if (high == 0)
        low = high = kernels / elapsed;
    const char *trace = std::getenv("PACING_LOAD_TRACE");
    if (trace) {
        FILE *out = std::fopen(trace, "w");
        if (!out) {
            std::fprintf(stderr, "pacing_load: cannot write %s\n", trace);
            return 1;
        }
        for (auto &c : checkpoints)
            std::fprintf(out, "%.6f %ld\n", c.first + to_wall, c.second);
        std::fclose(out);
    }
    std::printf("kind %s streams %d kernels %ld seconds %.3f rate %.2f window_min %.2f "
                "window_max %.2f all %ld\n", argv[1], l.nstreams, kernels, elapsed, kernels / elapsed,
                low, high, i);
    return 0;
}
