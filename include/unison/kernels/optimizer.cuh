#pragma once

/// \file
/// Fused optimizer steps on a flat shard: SGD with momentum, Adam and AdamW
/// (optim/), optionally with f32 master weights and the parameter
/// copied out in its own dtype (bf16, f16), in one pass over memory. With
/// `skip_if_nonfinite` pointing at a device `norm_stats` (from `multi_norm`, after
/// its all-reduce), the kernel returns without writing anything when any gradient
/// was inf or nan, so a skipped step needs no host round trip.
///
/// Each element runs `optimizer_element` (kernels/element.hpp), the function the
/// host step (`host::optimizer_step`, used by partitioned_optimizer) runs.

#include "unison/kernels/detail/launch.cuh"
#include "unison/kernels/element.hpp"
#include "unison/optim.hpp"

#include <cstddef>

namespace unison::kernels {

namespace detail {

/// Elements per thread and step: one 16-byte access of the f32 arrays.
inline constexpr int optimizer_vec = 4;

template <class O, class A, class P, class G, std::size_t Slots>
__global__ void __launch_bounds__(block_threads)
    optimizer_kernel(typename O::template constants<A> c, shard_ref<P, G, A, Slots> s, A grad_scale,
                     const norm_stats* skip_if_nonfinite) {
    if (skip_if_nonfinite != nullptr && skip_if_nonfinite->nonfinite > 0.0) {
        return;
    }
    constexpr int V = optimizer_vec;
    const std::size_t tid = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
    bool aligned = vec_aligned<P, V>(s.param) && vec_aligned<G, V>(s.grad) &&
                   (s.master == nullptr || vec_aligned<A, V>(s.master));
#pragma unroll
    for (std::size_t j = 0; j < Slots; ++j) {
        aligned = aligned && vec_aligned<A, V>(s.state[j]);
    }
    std::size_t done = 0;
    if (aligned) {
        const std::size_t nv = s.count / V;
        for (std::size_t k = tid; k < nv; k += stride) {
            // Registers for V elements, stepped by the shared element function
            // through a shard_ref that points at them.
            // With master weights the parameter is only written (28 bytes per
            // element for AdamW in either case).
            vec<P, V> p;
            vec<A, V> m;
            if (s.master != nullptr) {
                m = reinterpret_cast<const vec<A, V>*>(s.master)[k];
            } else {
                p = reinterpret_cast<const vec<P, V>*>(s.param)[k];
            }
            const vec<G, V> g = reinterpret_cast<const vec<G, V>*>(s.grad)[k];
            vec<A, V> st[Slots > 0 ? Slots : 1];
#pragma unroll
            for (std::size_t j = 0; j < Slots; ++j) {
                st[j] = reinterpret_cast<const vec<A, V>*>(s.state[j])[k];
            }
            shard_ref<P, G, A, Slots> r;
            r.param = p.v;
            r.grad = g.v;
            r.master = s.master != nullptr ? m.v : nullptr;
#pragma unroll
            for (std::size_t j = 0; j < Slots; ++j) {
                r.state[j] = st[j].v;
            }
            r.count = V;
#pragma unroll
            for (int e = 0; e < V; ++e) {
                optimizer_element<O>(c, r, grad_scale, static_cast<std::size_t>(e));
            }
            reinterpret_cast<vec<P, V>*>(s.param)[k] = p;
            if (s.master != nullptr) {
                reinterpret_cast<vec<A, V>*>(s.master)[k] = m;
            }
#pragma unroll
            for (std::size_t j = 0; j < Slots; ++j) {
                reinterpret_cast<vec<A, V>*>(s.state[j])[k] = st[j];
            }
        }
        done = nv * V;
    }
    for (std::size_t i = done + tid; i < s.count; i += stride) {
        optimizer_element<O>(c, s, grad_scale, i);
    }
}

} // namespace detail

/// One step of optimizer `O` over the flat shard `s` (device pointers, the current
/// device), with per-step constants `c` from `O::prepare<A>(step)` and the gradient
/// multiplied by `grad_scale` (loss-scale unscale and clipping in one factor). With
/// `skip_if_nonfinite` non-null, the step is skipped on the device when
/// `skip_if_nonfinite->nonfinite > 0`. One launch on `stream`.
template <class O, class A, class P, class G, std::size_t Slots>
void optimizer_step(const typename O::template constants<A>& c, const shard_ref<P, G, A, Slots>& s,
                    A grad_scale, const norm_stats* skip_if_nonfinite, cudaStream_t stream) {
    static_assert(Slots == O::slots, "unison::kernels::optimizer_step: the shard's state "
                                     "slots must be the optimizer's");
    if (s.count == 0) {
        return;
    }
    detail::optimizer_kernel<O, A, P, G, Slots>
        <<<detail::grid_blocks(s.count, detail::optimizer_vec), detail::block_threads, 0, stream>>>(
            c, s, grad_scale, skip_if_nonfinite);
    detail::check_launch("optimizer_step");
}

} // namespace unison::kernels
