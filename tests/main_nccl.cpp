// The doctest main of the NCCL tests. Without a visible GPU nothing can run: it
// says so and exits with 77, which CTest reports as a skipped test rather than a
// pass.

#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cuda_runtime_api.h>

#include <cstdio>

int main(int argc, char** argv) {
    int devices = 0;
    const cudaError_t rc = cudaGetDeviceCount(&devices);
    if (rc != cudaSuccess || devices == 0) {
        std::printf("SKIPPED: no CUDA device is visible (%s); the NCCL backend was compiled "
                    "but not run\n",
                    rc != cudaSuccess ? cudaGetErrorString(rc) : "0 devices");
        return 77;
    }
    doctest::Context context(argc, argv);
    return context.run();
}
