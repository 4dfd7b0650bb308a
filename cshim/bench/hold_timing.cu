// What a small kernel's events time on an idle stream: a start event, the
// kernel and an end event launched with the host idle in between (as a
// launch-bound program launches), unheld and held (the stream waits on a
// host value written once the launch call returned, as libvcuda.so holds a
// timed launch), and ten kernels queued between two events. Run without the
// library. Elements 0: a held pair of events with no kernel between, what the
// events add to a held kernel's timing. Prints, per kernel size, the median,
// p10 and p90 of each, in us;
// and for the held launches, how much longer the stream stood at the wait
// than the host took from the wait to writing the value: the device's delay
// in seeing the value written, less an event's way to the device.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cuda.h>
#include <vector>

__global__ void add_one(float *x, unsigned n)
{
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        x[i] += 1.0f;
}

static void check(cudaError_t err, const char *what)
{
    if (err != cudaSuccess) {
        std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(err));
        std::exit(1);
    }
}

static void spin_us(double us)
{
    auto until = std::chrono::steady_clock::now() + std::chrono::nanoseconds((long)(us * 1000));
    while (std::chrono::steady_clock::now() < until)
        ;   // sleeping would oversleep the gap
}

enum way { UNHELD, HELD, QUEUED };

// Times n launches of add_one on x[size] the given way; per kernel, in us.
static std::vector<float> time_kernels(way how, float *x, unsigned size, unsigned *flag,
                                       CUdeviceptr flag_at, cudaStream_t stream, int n,
                                       std::vector<float> *seen)
{
    const int per = how == QUEUED ? 10 : 1;
    const unsigned blocks = (size + 255) / 256;
    std::vector<cudaEvent_t> befores(n), starts(n), ends(n);
    std::vector<double> host_us(n);
    for (int i = 0; i < n; i++) {
        check(cudaEventCreate(&befores[i]), "cudaEventCreate");
        check(cudaEventCreate(&starts[i]), "cudaEventCreate");
        check(cudaEventCreate(&ends[i]), "cudaEventCreate");
    }
    for (int i = 0; i < n; i++) {
        unsigned value = __atomic_load_n(flag, __ATOMIC_RELAXED) + 1;
        check(cudaEventRecord(befores[i], stream), "cudaEventRecord");
        auto waited = std::chrono::steady_clock::now();
        if (how == HELD && cuStreamWaitValue32((CUstream)stream, flag_at, value,
                                               CU_STREAM_WAIT_VALUE_GEQ) != CUDA_SUCCESS) {
            std::fprintf(stderr, "cuStreamWaitValue32 failed\n");
            std::exit(1);
        }
        check(cudaEventRecord(starts[i], stream), "cudaEventRecord");
        for (int k = 0; k < per && size; k++)
            add_one<<<blocks, 256, 0, stream>>>(x, size);
        check(cudaEventRecord(ends[i], stream), "cudaEventRecord");
        if (how == HELD)
            __atomic_store_n(flag, value, __ATOMIC_RELEASE);
        host_us[i] = std::chrono::duration<double, std::micro>(
            std::chrono::steady_clock::now() - waited).count();
        spin_us(20.0 * per);
    }
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    std::vector<float> us(n);
    for (int i = 0; i < n; i++) {
        float ms = 0;
        check(cudaEventElapsedTime(&ms, starts[i], ends[i]), "cudaEventElapsedTime");
        us[i] = ms * 1000 / per;
        check(cudaEventElapsedTime(&ms, befores[i], starts[i]), "cudaEventElapsedTime");
        if (seen)
            (*seen)[i] = (float)(ms * 1000 - host_us[i]);
        cudaEventDestroy(befores[i]);
        cudaEventDestroy(starts[i]);
        cudaEventDestroy(ends[i]);
    }
    std::sort(us.begin(), us.end());
    if (seen)
        std::sort(seen->begin(), seen->end());
    return us;
}

int main(int argc, char **argv)
{
    const int n = argc > 1 ? std::atoi(argv[1]) : 3000;
    const unsigned sizes[] = {0, 1, 1u << 18, 1u << 22};
    float *x;
    unsigned *flag;
    CUdeviceptr flag_at;
    cudaStream_t stream;
    check(cudaMalloc(&x, sizeof(float) << 22), "cudaMalloc");
    check(cudaHostAlloc(&flag, sizeof *flag, cudaHostAllocMapped), "cudaHostAlloc");
    check(cudaHostGetDevicePointer((void **)&flag_at, flag, 0), "cudaHostGetDevicePointer");
    check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    *flag = 0;
    const char *names[] = {"unheld", "held", "queued"};
    std::printf("elements  way      median    p10    p90  (us a kernel, %d launches)\n", n);
    for (unsigned size : sizes)
        for (way how : {UNHELD, HELD, QUEUED}) {
            if (!size && how != HELD)
                continue;
            int count = how == QUEUED ? n / 10 : n;
            std::vector<float> seen(count);
            std::vector<float> us = time_kernels(how, x, size, flag, flag_at, stream, count,
                                                 how == HELD ? &seen : nullptr);
            std::printf("%8u  %-7s %7.2f %6.2f %6.2f", size, names[how], us[count / 2],
                        us[count / 10], us[count * 9 / 10]);
            if (how == HELD)
                std::printf("   seen written %.2f us later (median; p90 %.2f)", seen[count / 2],
                            seen[count * 9 / 10]);
            std::printf("\n");
        }
    return 0;
}
