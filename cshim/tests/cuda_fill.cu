// A plain CUDA runtime program (nvcc's default static cudart): reports the
// memory cudaMemGetInfo gives, then allocates 256 MiB blocks with cudaMalloc
// until an allocation fails, and reports how many it got and the error.
#include <cstdio>
#include <vector>

int main()
{
    size_t free_bytes = 0, total_bytes = 0;
    cudaError_t err = cudaMemGetInfo(&free_bytes, &total_bytes);
    std::printf("info %s %zu %zu\n", cudaGetErrorName(err), free_bytes, total_bytes);
    std::vector<void *> blocks;
    void *p = nullptr;
    while ((err = cudaMalloc(&p, 256u << 20)) == cudaSuccess)
        blocks.push_back(p);
    std::printf("filled %zu %s\n", blocks.size(), cudaGetErrorName(err));
    return 0;
}
