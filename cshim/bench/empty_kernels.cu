// Launch overhead: times N launches of an empty kernel (and, for context, M
// cudaMalloc/cudaFree pairs of 1 MiB), so a run under libvcuda.so can be
// compared with one without it. Prints "launch_us X" and "alloc_free_us Y".
#include <chrono>
#include <cstdio>
#include <cstdlib>

__global__ void empty() {}

static double seconds_since(std::chrono::steady_clock::time_point start)
{
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

int main(int argc, char **argv)
{
    long launches = argc > 1 ? std::atol(argv[1]) : 1000000;
    long pairs = argc > 2 ? std::atol(argv[2]) : 20000;
    empty<<<1, 1>>>();
    if (cudaDeviceSynchronize() != cudaSuccess) {
        std::fprintf(stderr, "no usable GPU\n");
        return 1;
    }
    auto start = std::chrono::steady_clock::now();
    for (long i = 0; i < launches; i++)
        empty<<<1, 1>>>();
    cudaError_t err = cudaDeviceSynchronize();
    double launch = seconds_since(start);
    start = std::chrono::steady_clock::now();
    for (long i = 0; i < pairs && err == cudaSuccess; i++) {
        void *p;
        err = cudaMalloc(&p, 1 << 20);
        if (err == cudaSuccess)
            err = cudaFree(p);
    }
    double alloc = seconds_since(start);
    if (err != cudaSuccess) {
        std::fprintf(stderr, "CUDA error: %s\n", cudaGetErrorName(err));
        return 1;
    }
    std::printf("launch_us %.4f\nalloc_free_us %.3f\n", launch / launches * 1e6, alloc / pairs * 1e6);
    return 0;
}
