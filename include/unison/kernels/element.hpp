#pragma once

/// \file
/// The element math of unison's fused kernels, written once as `__host__ __device__`
/// functions: the CUDA kernels (kernels/*.cuh) and their host counterparts
/// (kernels/host.hpp, which the DDP and ZeRO host paths run) call the same code,
/// so the host tests pin down what every kernel computes, element for element.
///
/// - `scale_cast_element`: dst = D(A(src) * scale), or dst = D(A(dst) + A(src) * scale);
///   the compute type A is float, or double when either side is f64; one rounding.
/// - `norm_accumulate`: adds v*v (in double) to a sum of squares when v is finite,
///   and counts it as non-finite otherwise.
/// - `optimizer_element`: one parameter's optimizer step on a flat shard: loads the
///   master weight (or the parameter), the unscaled gradient and the state, calls
///   the optimizer's `update` (optim/) and stores the master, the
///   state and the parameter rounded to its dtype.

#include "unison/core/config.hpp"
#include "unison/core/detail/convert.hpp"

#include <cmath>
#include <cstddef>

namespace unison::kernels {

/// The type `scale_cast` computes in for destination `D` and source `S`.
template <class D, class S>
using compute_t = unison::detail::convert_compute_t<D, S>;

/// One element of a scale-and-cast copy (pack, unpack, average-and-cast):
/// dst = D(A(src) * scale), or dst = D(A(dst) + A(src) * scale) with `accumulate`.
/// Defined next to the host loops that use it (core/detail/convert.hpp).
using unison::detail::scale_cast_element;

/// Whether `v` is neither infinite nor NaN, on host and device alike.
UNISON_HOST_DEVICE inline bool is_finite(double v) {
#if defined(__CUDA_ARCH__)
    return isfinite(v);
#else
    return std::isfinite(v);
#endif
}

/// A sum of squares and a count of non-finite elements: what the global gradient
/// norm and the inf/nan check of a step need, in one pass. Two doubles, so that a
/// device copy can be all-reduced as it is.
struct norm_stats {
    double sum_sq = 0.0;
    double nonfinite = 0.0;
};

/// Adds `v` to `s`: its square when finite, one non-finite element otherwise.
template <class T>
UNISON_HOST_DEVICE inline void norm_accumulate(norm_stats& s, T v) {
    const double x = unison::detail::load_as<double>(v);
    if (is_finite(x)) {
        s.sum_sq += x * x;
    } else {
        s.nonfinite += 1.0;
    }
}

/// Pointers of a flat shard that an optimizer steps: `count` elements of parameter
/// (dtype P), gradient (dtype G, usually P) and, optionally, master weights, and
/// `Slots` state tensors in the compute type A. Host or device pointers alike.
template <class P, class G, class A, std::size_t Slots>
struct shard_ref {
    P* param = nullptr;
    const G* grad = nullptr;
    A* master = nullptr; ///< f32/f64 master weights, or null to step `param` directly
    A* state[Slots] = {};
    std::size_t count = 0;
};

/// Element `i` of an optimizer step on `s`: the gradient is multiplied by
/// `grad_scale` (unscale and clip folded into one factor) before `O::update`.
template <class O, class A, class P, class G, std::size_t Slots>
UNISON_HOST_DEVICE inline void optimizer_element(const typename O::template constants<A>& c,
                                                 const shard_ref<P, G, A, Slots>& s, A grad_scale,
                                                 std::size_t i) {
    A p = s.master != nullptr ? s.master[i] : unison::detail::load_as<A>(s.param[i]);
    A st[Slots];
    for (std::size_t j = 0; j < Slots; ++j) {
        st[j] = s.state[j][i];
    }
    O::update(c, p, unison::detail::load_as<A>(s.grad[i]) * grad_scale, st);
    for (std::size_t j = 0; j < Slots; ++j) {
        s.state[j][i] = st[j];
    }
    if (s.master != nullptr) {
        s.master[i] = p;
    }
    s.param[i] = unison::detail::store_as<P>(p);
}

} // namespace unison::kernels
