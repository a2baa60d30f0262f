// The doctest main of the GPU tests (tests/cuda/*.cu: the kernels, the thread
// backend on device memory, DDP on device). Without a visible GPU nothing can
// run: it says so and exits with 77, which CTest reports as a skipped test.

#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cuda_runtime_api.h>

#include <cstdio>

int main(int argc, char** argv) {
    int devices = 0;
    const cudaError_t rc = cudaGetDeviceCount(&devices);
    if (rc != cudaSuccess || devices == 0) {
        std::printf("SKIPPED: no CUDA device is visible (%s); the GPU tests were compiled but "
                    "not run\n",
                    rc != cudaSuccess ? cudaGetErrorString(rc) : "0 devices");
        return 77;
    }
    cudaDeviceProp prop{};
    cudaGetDeviceProperties(&prop, 0);
    std::printf("GPU tests on %s (%d device(s) visible)\n", prop.name, devices);
    doctest::Context context(argc, argv);
    return context.run();
}
