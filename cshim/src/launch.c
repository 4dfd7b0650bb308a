/* The kernel and graph launch wrappers: each launch is paced (pacer.h) when a core limit is set. */
#define _GNU_SOURCE
#include <stdint.h>

#include "driver.h"
#include "graphs.h"
#include "pacer.h"

/* A 64-bit mix (splitmix64's finalizer). */
static uint64_t mix(uint64_t h, uint64_t v)
{
    h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ULL;
    h = (h ^ (h >> 27)) * 0x94d049bb133111ebULL;
    return h ^ (h >> 31);
}

/* A kernel is known by its function and its shape: the same key, about the same GPU time. */
static uint64_t kernel_key(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                           unsigned by, unsigned bz, unsigned shared)
{
    uint64_t h = mix((uintptr_t)f, (uint64_t)gx << 32 | gy);
    h = mix(h, (uint64_t)gz << 32 | bx);
    h = mix(h, (uint64_t)by << 32 | bz);
    return mix(h, shared) | 1;   /* never 0, which marks a free estimate */
}

static uint64_t graph_key(CUgraphExec exec) { return mix((uintptr_t)exec, 0x6772617068) | 1; }

/* Paces the launch `call` on stream, makes it and returns its result. */
#define PACED(stream, ptsz, key, call)                                                             \
    do {                                                                                           \
        struct vc_launch launch_;                                                                  \
        bool paced_ = vc_pacer_begin(&launch_, stream, ptsz, key);                                 \
        CUresult result_ = call;                                                                   \
        return paced_ ? vc_pacer_end(&launch_, result_) : result_;                                 \
    } while (0)

#define KERNEL_KEY kernel_key(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, \
                              sharedMemBytes)

CUresult CUDAAPI cuLaunchKernel VC_LAUNCH_KERNEL_PARAMS
{
    PACED(hStream, false, KERNEL_KEY, vc_real_cuLaunchKernel VC_LAUNCH_KERNEL_ARGS);
}

CUresult CUDAAPI cuLaunchKernel_ptsz VC_LAUNCH_KERNEL_PARAMS
{
    PACED(hStream, true, KERNEL_KEY, vc_real_cuLaunchKernel_ptsz VC_LAUNCH_KERNEL_ARGS);
}

CUresult CUDAAPI cuLaunchCooperativeKernel VC_LAUNCH_COOPERATIVE_PARAMS
{
    PACED(hStream, false, KERNEL_KEY,
          vc_real_cuLaunchCooperativeKernel VC_LAUNCH_COOPERATIVE_ARGS);
}

CUresult CUDAAPI cuLaunchCooperativeKernel_ptsz VC_LAUNCH_COOPERATIVE_PARAMS
{
    PACED(hStream, true, KERNEL_KEY,
          vc_real_cuLaunchCooperativeKernel_ptsz VC_LAUNCH_COOPERATIVE_ARGS);
}

#define CONFIG_KEY                                                                                 \
    kernel_key(f, config->gridDimX, config->gridDimY, config->gridDimZ, config->blockDimX,         \
               config->blockDimY, config->blockDimZ, config->sharedMemBytes)

/* Without a configuration there is no launch: the driver says what is wrong. */
CUresult CUDAAPI cuLaunchKernelEx VC_LAUNCH_EX_PARAMS
{
    if (!config)
        return vc_real_cuLaunchKernelEx VC_LAUNCH_EX_ARGS;
    PACED(config->hStream, false, CONFIG_KEY, vc_real_cuLaunchKernelEx VC_LAUNCH_EX_ARGS);
}

CUresult CUDAAPI cuLaunchKernelEx_ptsz VC_LAUNCH_EX_PARAMS
{
    if (!config)
        return vc_real_cuLaunchKernelEx_ptsz VC_LAUNCH_EX_ARGS;
    PACED(config->hStream, true, CONFIG_KEY, vc_real_cuLaunchKernelEx_ptsz VC_LAUNCH_EX_ARGS);
}

static CUresult paced_graph_launch(CUgraphExec exec, CUstream stream, bool ptsz)
{
    PACED(stream, ptsz, graph_key(exec),
          ptsz ? vc_real_cuGraphLaunch_ptsz(exec, stream) : vc_real_cuGraphLaunch(exec, stream));
}

/* Graph launches are wrapped under every memory limit: a graph's first launch
 * backs its allocation nodes (graphs.h). */
static CUresult graph_launch(CUgraphExec exec, CUstream stream, bool ptsz)
{
    struct vc_graph_op op;
    CUresult r = vc_graph_begin(&op, exec, stream, ptsz);
    return r != CUDA_SUCCESS ? r : vc_graph_end(&op, paced_graph_launch(exec, stream, ptsz));
}

CUresult CUDAAPI cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream)
{
    return graph_launch(hGraphExec, hStream, false);
}

CUresult CUDAAPI cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream)
{
    return graph_launch(hGraphExec, hStream, true);
}
