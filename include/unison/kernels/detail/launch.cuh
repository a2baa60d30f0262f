#pragma once

/// \file
/// What every unison kernel shares: aligned vector loads, the launch shape, and the
/// launch check. A CUDA header: include it from a .cu file compiled by nvcc.

#include "unison/core/config.hpp"

#if !UNISON_CUDA_COMPILATION()
#error "unison/kernels/*.cuh are CUDA headers: include them from a .cu file compiled by nvcc"
#endif

#include "unison/cuda/check.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

namespace unison::kernels::detail {

/// Threads per block of every unison kernel.
inline constexpr int block_threads = 256;

/// `N` elements of `T` loaded or stored as one aligned access (16 bytes for four
/// floats, eight bf16 or two doubles).
template <class T, int N>
struct alignas(sizeof(T) * N) vec {
    T v[N];
};

/// Elements per vector access for `T`: 16 bytes' worth.
template <class T>
inline constexpr int vec_width = static_cast<int>(16 / sizeof(T)) > 0 ? 16 / sizeof(T) : 1;

/// Whether `p` is aligned for a `vec<T, N>` access.
template <class T, int N>
__host__ __device__ inline bool vec_aligned(const void* p) {
    return reinterpret_cast<std::uintptr_t>(p) % (sizeof(T) * N) == 0;
}

/// Streaming multiprocessors of device `dev` (cached per device; rank threads call
/// this concurrently).
inline int sm_count(int dev) {
    static std::atomic<int> cached[64] = {};
    if (dev >= 0 && dev < 64) {
        if (const int n = cached[dev].load(std::memory_order_relaxed); n > 0) {
            return n;
        }
    }
    int n = 0;
    UNISON_CHECK_CUDA(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev), -1,
                      "kernel launch");
    if (dev >= 0 && dev < 64) {
        cached[dev].store(n, std::memory_order_relaxed);
    }
    return n;
}

/// The current device of the calling thread.
inline int current_device() {
    int d = 0;
    UNISON_CHECK_CUDA(cudaGetDevice(&d), -1, "kernel launch");
    return d;
}

/// Blocks for a grid-stride loop over `n` items of `per_thread` elements each:
/// enough to cover the work, at most 8 blocks per SM resident at once (beyond that
/// extra blocks add launch cost and no bandwidth).
inline unsigned grid_blocks(std::size_t n, std::size_t per_thread) {
    const std::size_t per_block = static_cast<std::size_t>(block_threads) * per_thread;
    const std::size_t want = (n + per_block - 1) / per_block;
    const std::size_t cap = static_cast<std::size_t>(sm_count(current_device())) * 8;
    return static_cast<unsigned>(std::max<std::size_t>(1, std::min(want, cap)));
}

/// Throws `cuda_error` naming `what` if the launch just made failed.
inline void check_launch(const char* what) {
    UNISON_CHECK_CUDA(cudaGetLastError(), -1, std::string("kernel ") + what);
}

} // namespace unison::kernels::detail
