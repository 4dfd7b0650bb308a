// What the pacer's probe sees: how late an event on an idle stream of this
// process completes. Run without the library, alone, beside this process's
// own kernels (`self`: a spin kernel on every SM of another stream, back to
// back), or beside another process's load. Every PERIOD_US it records an
// event on its idle stream and waits for it; it prints the spread of how
// long that took (us), the share of the time spent waiting more than 30 us
// (away from the device), and how many such waits in a row it saw.
//
//   slice_probe SECONDS PERIOD_US [self]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <vector>

static long long now_ns()
{
    timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}

__global__ void spin(long long ns)
{
    long long start, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    while (t - start < ns);
}

static void check(cudaError_t err, const char *what)
{
    if (err != cudaSuccess) {
        std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(err));
        std::exit(1);
    }
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        std::fprintf(stderr, "usage: %s SECONDS PERIOD_US [self]\n", argv[0]);
        return 2;
    }
    double seconds = std::atof(argv[1]);
    long long period = std::atoll(argv[2]) * 1000;
    bool self = argc > 3 && !std::strcmp(argv[3], "self");
    cudaStream_t idle, busy;
    check(cudaStreamCreateWithFlags(&idle, cudaStreamNonBlocking), "stream");
    check(cudaStreamCreateWithFlags(&busy, cudaStreamNonBlocking), "stream");
    cudaEvent_t probe;
    check(cudaEventCreate(&probe), "event");
    check(cudaDeviceSynchronize(), "start-up");
    int sms;
    check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), "attribute");
    const long long spin_ns = 5000000;
    for (long long i = 0; self && i * spin_ns < (long long)(seconds * 1e9) + 1000000000LL; i++)
        spin<<<sms * 4, 128, 0, busy>>>(spin_ns);
    check(cudaGetLastError(), "spin launch");
    std::vector<long long> took;
    long long start = now_ns(), end = start + (long long)(seconds * 1e9), next = start;
    long long away = 0, spells = 0;
    bool in_spell = false;
    while (now_ns() < end) {
        while (now_ns() < next)
            ;
        long long recorded = now_ns();
        check(cudaEventRecord(probe, idle), "record");
        cudaError_t q;
        while ((q = cudaEventQuery(probe)) == cudaErrorNotReady)
            ;
        check(q, "query");
        long long ns = now_ns() - recorded;
        took.push_back(ns);
        bool late = ns > 30000;
        away += late ? ns : 0;
        spells += late && !in_spell;
        in_spell = late;
        next = recorded + period;
    }
    std::sort(took.begin(), took.end());
    size_t n = took.size();
    std::printf("%s: %zu probes, took p50 %.1f p90 %.1f p99 %.1f max %.1f us; away %.1f%% of "
                "the time, in %lld spells\n", self ? "beside its own kernels" : "idle process", n,
                took[n / 2] / 1e3, took[n * 9 / 10] / 1e3, took[n * 99 / 100] / 1e3,
                took[n - 1] / 1e3, 100.0 * away / (seconds * 1e9), spells);
    if (self)
        check(cudaStreamSynchronize(busy), "spin");
    return 0;
}
