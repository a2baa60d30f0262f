#pragma once

/// \file
/// The reduction kernel of the thread backend on device memory: N ranks, threads
/// of one process sharing one GPU, each reduce their share of every rank's input
/// and write it to every rank's output, reading the peers' buffers directly (one
/// pass, no staging copy). The arithmetic is `host_reduce`'s (core/detail/
/// host_reduce.hpp): combined in the accumulate type (float for f16/bf16), divided
/// by `divisor` for an average, rounded once, in rank order as the host loop folds:
/// the same inputs give the same bits on either (comm_options::deterministic).

#include "unison/core/detail/host_reduce.hpp"
#include "unison/core/dtype.hpp"
#include "unison/core/reduce_op.hpp"
#include "unison/kernels/detail/launch.cuh"

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace unison::kernels {

/// The most ranks one device reduction combines (the thread backend's device
/// worlds are at most this large).
inline constexpr int max_reduce_ranks = 32;

/// Input and output pointers of one device reduction, passed by value.
struct reduce_pointers {
    const void* in[max_reduce_ranks] = {};
    void* out[max_reduce_ranks] = {};
};

namespace detail {

template <class T, class Fn>
__global__ void __launch_bounds__(block_threads)
    reduce_kernel(reduce_pointers p, int n, int m, std::size_t count, int divisor, Fn fn) {
    using A = unison::detail::accumulate_t<T>;
    const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
    for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
         i += stride) {
        A acc = unison::detail::widen(static_cast<const T*>(p.in[0])[i]);
        for (int r = 1; r < n; ++r) {
            acc = fn(acc, unison::detail::widen(static_cast<const T*>(p.in[r])[i]));
        }
        if (divisor != 1) {
            acc = static_cast<A>(acc / static_cast<A>(divisor));
        }
        const T v = unison::detail::narrow<T>(acc);
        for (int o = 0; o < m; ++o) {
            static_cast<T*>(p.out[o])[i] = v;
        }
    }
}

template <class T>
void launch_reduce(reduce_op op, const reduce_pointers& p, int n, int m, std::size_t count,
                   int divisor, cudaStream_t stream) {
    const unsigned blocks = grid_blocks(count, 1);
    switch (op) {
    case reduce_op::sum:
    case reduce_op::avg:
        reduce_kernel<T><<<blocks, block_threads, 0, stream>>>(p, n, m, count, divisor,
                                                               unison::detail::sum_fn{});
        break;
    case reduce_op::prod:
        reduce_kernel<T><<<blocks, block_threads, 0, stream>>>(p, n, m, count, divisor,
                                                               unison::detail::prod_fn{});
        break;
    case reduce_op::min:
        reduce_kernel<T><<<blocks, block_threads, 0, stream>>>(p, n, m, count, divisor,
                                                               unison::detail::min_fn{});
        break;
    case reduce_op::max:
        reduce_kernel<T><<<blocks, block_threads, 0, stream>>>(p, n, m, count, divisor,
                                                               unison::detail::max_fn{});
        break;
    }
    check_launch("device reduce");
}

} // namespace detail

/// out[o][i] = (in[0][i] op ... op in[n-1][i]) / divisor for i < count and every
/// o < m, on `stream`. Pointers are device pointers of the current device (or of
/// peers that can access it); an output may alias an input only at the same index.
inline void device_reduce(dtype type, reduce_op op, const reduce_pointers& p, int n, int m,
                          std::size_t count, int divisor, cudaStream_t stream) {
    if (n < 1 || n > max_reduce_ranks || m < 0 || m > max_reduce_ranks) {
        throw std::invalid_argument("unison::kernels::device_reduce: " + std::to_string(n) +
                                    " inputs and " + std::to_string(m) + " outputs (at most " +
                                    std::to_string(max_reduce_ranks) + " each)");
    }
    if (count == 0 || m == 0) {
        return;
    }
    switch (type) {
    case dtype::f64:
        return detail::launch_reduce<double>(op, p, n, m, count, divisor, stream);
    case dtype::f32:
        return detail::launch_reduce<float>(op, p, n, m, count, divisor, stream);
    case dtype::f16:
        return detail::launch_reduce<half>(op, p, n, m, count, divisor, stream);
    case dtype::bf16:
        return detail::launch_reduce<bf16>(op, p, n, m, count, divisor, stream);
    case dtype::i64:
        return detail::launch_reduce<std::int64_t>(op, p, n, m, count, divisor, stream);
    case dtype::i32:
        return detail::launch_reduce<std::int32_t>(op, p, n, m, count, divisor, stream);
    case dtype::i8:
        return detail::launch_reduce<std::int8_t>(op, p, n, m, count, divisor, stream);
    case dtype::u8:
        return detail::launch_reduce<std::uint8_t>(op, p, n, m, count, divisor, stream);
    case dtype::u32:
        return detail::launch_reduce<std::uint32_t>(op, p, n, m, count, divisor, stream);
    case dtype::u64:
        return detail::launch_reduce<std::uint64_t>(op, p, n, m, count, divisor, stream);
    }
}

} // namespace unison::kernels
