// The doctest main of the LibTorch GPU tests (torch/cuda.cpp). They need a GPU and
// a LibTorch built with CUDA (Debian's is CPU-only); without either the binary says
// which is missing and exits with 77, which CTest reports as a skipped test.

#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <torch/cuda.h>

#include <cuda_runtime_api.h>

#include <cstdio>

int main(int argc, char** argv) {
    int devices = 0;
    const cudaError_t rc = cudaGetDeviceCount(&devices);
    if (rc != cudaSuccess || devices == 0) {
        std::printf("SKIPPED: no CUDA device is visible (%s); the LibTorch GPU tests were "
                    "compiled but not run\n",
                    rc != cudaSuccess ? cudaGetErrorString(rc) : "0 devices");
        return 77;
    }
    if (!torch::cuda::is_available()) {
        std::printf("SKIPPED: this LibTorch has no CUDA (torch::cuda::is_available() is false); "
                    "build against a CUDA LibTorch to run the LibTorch GPU tests\n");
        return 77;
    }
    doctest::Context context(argc, argv);
    return context.run();
}
