#pragma once

/// \file
/// Multi-tensor L2 norm and inf/nan check in one pass: over every element of many
/// tensors, the sum of squares of the finite elements (in double) and the count of
/// non-finite ones, written to a device `norm_stats`, which is two doubles: all-reduce
/// it as it is for the global norm of sharded gradients.
///
/// Deterministic: each block writes its partial sums, and one block adds the
/// partials in a fixed order, so a given input gives the same bits every run. The
/// element math is `norm_accumulate` (kernels/element.hpp), shared with
/// `host::multi_norm`.

#include "unison/core/detail/convert.hpp"
#include "unison/core/dtype.hpp"
#include "unison/kernels/detail/launch.cuh"
#include "unison/kernels/element.hpp"
#include "unison/kernels/multi_tensor.cuh"

#include <cstddef>
#include <memory>
#include <span>

namespace unison::kernels {

namespace detail {

/// Block-wide sum of `s` into thread 0's return value (shared-memory tree, fixed order).
__device__ inline norm_stats block_sum(norm_stats s) {
    __shared__ double sq[block_threads];
    __shared__ double bad[block_threads];
    sq[threadIdx.x] = s.sum_sq;
    bad[threadIdx.x] = s.nonfinite;
    __syncthreads();
    for (int half = block_threads / 2; half > 0; half /= 2) {
        if (static_cast<int>(threadIdx.x) < half) {
            sq[threadIdx.x] += sq[threadIdx.x + half];
            bad[threadIdx.x] += bad[threadIdx.x + half];
        }
        __syncthreads();
    }
    return {sq[0], bad[0]};
}

template <class T>
__global__ void __launch_bounds__(block_threads)
    multi_norm_kernel(const copy_piece* pieces, const chunk* chunks, norm_stats* partials) {
    const chunk c = chunks[blockIdx.x];
    const copy_piece p = pieces[c.piece];
    const std::size_t left = p.count - c.begin;
    const std::size_t n = left < chunk_elements ? left : chunk_elements;
    const T* x = static_cast<const T*>(p.src) + c.begin;
    norm_stats s;
    constexpr int V = vec_width<T>;
    std::size_t done = 0;
    if (vec_aligned<T, V>(x)) {
        const std::size_t nv = n / V;
        const auto* xv = reinterpret_cast<const vec<T, V>*>(x);
        for (std::size_t k = threadIdx.x; k < nv; k += blockDim.x) {
            const vec<T, V> a = xv[k];
#pragma unroll
            for (int j = 0; j < V; ++j) {
                norm_accumulate(s, a.v[j]);
            }
        }
        done = nv * V;
    }
    for (std::size_t i = done + threadIdx.x; i < n; i += blockDim.x) {
        norm_accumulate(s, x[i]);
    }
    const norm_stats total = block_sum(s);
    if (threadIdx.x == 0) {
        partials[blockIdx.x] = total;
    }
}

/// One block adds `n` partials: thread t sums t, t + 256, ... in order, then the tree.
/// (A template, like every kernel here, so that including this header in several
/// translation units defines it once.)
template <int = 0>
__global__ void __launch_bounds__(block_threads)
    norm_finish_kernel(const norm_stats* partials, std::size_t n, norm_stats* out,
                       bool accumulate) {
    norm_stats s;
    for (std::size_t i = threadIdx.x; i < n; i += blockDim.x) {
        s.sum_sq += partials[i].sum_sq;
        s.nonfinite += partials[i].nonfinite;
    }
    const norm_stats total = block_sum(s);
    if (threadIdx.x == 0) {
        if (accumulate) {
            out->sum_sq += total.sum_sq;
            out->nonfinite += total.nonfinite;
        } else {
            *out = total;
        }
    }
}

} // namespace detail

/// Sum of squares and non-finite count over every element of the pieces of `plan`
/// (dtype `type`), written to `*out` in device memory (added to it with
/// `accumulate`); two launches on `stream`.
inline void multi_norm(const multi_tensor_plan& plan, dtype type, norm_stats* out,
                       cudaStream_t stream, bool accumulate = false) {
    const std::size_t n = plan.chunk_count();
    void* p = nullptr;
    UNISON_CHECK_CUDA(cudaMallocAsync(&p, (n == 0 ? 1 : n) * sizeof(norm_stats), stream), -1,
                      "multi_norm");
    std::unique_ptr<void, detail::stream_free> partials(p, detail::stream_free{stream});
    auto* part = static_cast<norm_stats*>(p);
    if (n != 0) {
        unison::detail::visit_floating(type, [&](auto tag) {
            detail::multi_norm_kernel<decltype(tag)>
                <<<static_cast<unsigned>(n), detail::block_threads, 0, stream>>>(
                    plan.device_pieces(), plan.device_chunks(), part);
        });
        detail::check_launch("multi_norm");
    }
    detail::norm_finish_kernel<><<<1, detail::block_threads, 0, stream>>>(part, n, out, accumulate);
    detail::check_launch("multi_norm (finish)");
}

/// One-shot form for a list of tensors that changes from call to call.
inline void multi_norm(std::span<const read_piece> pieces, dtype type, norm_stats* out,
                       cudaStream_t stream, bool accumulate = false) {
    const multi_tensor_plan plan(pieces);
    multi_norm(plan, type, out, stream, accumulate);
    // The plan's tables are freed with it (cudaFree waits for the device).
}

} // namespace unison::kernels
