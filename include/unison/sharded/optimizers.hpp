#pragma once

/// \file
/// Optimizers as element math on flat shards: SGD with momentum, Adam and AdamW, in
/// PyTorch's order of operations. Each optimizer is a small value type holding its
/// hyperparameters (change them between steps for schedules) and says
///   - `name` and `slot_names`: its state tensors, one element per parameter each
///     ("momentum"; "exp_avg", "exp_avg_sq"), which is what checkpoints record;
///   - `prepare<A>(step)`: the per-step constants, computed once on the host in the
///     compute type `A` (float for f32 master weights, double for f64);
///   - `update(constants, p, g, state)`: one element's step, `__host__ __device__`,
///     so the CUDA kernels and the host loop of `partitioned_optimizer` share it.
/// `g` arrives already unscaled (loss scale) and clipped.

#include "unison/core/config.hpp"

#include <array>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace unison::optim {

/// torch.optim.SGD (dampening 0, no Nesterov):
///   g += weight_decay * p;  buf = momentum * buf + g;  p -= lr * buf
/// The buffer starts at zero, so the first step's buffer is g, as in PyTorch.
struct sgd {
    double lr = 1e-2;
    double momentum = 0.0;
    double weight_decay = 0.0;

    static constexpr std::string_view name = "sgd";
    static constexpr std::size_t slots = 1;
    static constexpr std::array<std::string_view, slots> slot_names{"momentum"};

    template <class A>
    struct constants {
        A lr, momentum, weight_decay;
    };
    template <class A>
    constants<A> prepare(std::uint64_t /*step*/) const {
        return {static_cast<A>(lr), static_cast<A>(momentum), static_cast<A>(weight_decay)};
    }
    template <class A>
    UNISON_HOST_DEVICE static void update(const constants<A>& c, A& p, A g, A (&s)[slots]) {
        g = g + c.weight_decay * p;
        if (c.momentum != A(0)) {
            s[0] = c.momentum * s[0] + g;
            p -= c.lr * s[0];
        } else {
            p -= c.lr * g;
        }
    }
};

namespace detail {

/// Adam's moment update and step, shared by adam (L2 decay folded into g) and adamw
/// (decoupled decay applied to p first).
template <class A>
struct adam_constants {
    A beta1, beta2, one_minus_beta1, one_minus_beta2, eps, step_size, bias_correction2_sqrt, decay,
        l2;
};

/// The per-step constants, computed in double and rounded to A once each (as
/// PyTorch computes them in Python floats): 1 - beta2 from float(beta2) would be
/// 1.3e-5 off for beta2 = 0.999.
template <class A>
adam_constants<A> adam_prepare(double lr, double beta1, double beta2, double eps,
                               double weight_decay, std::uint64_t step, bool decoupled) {
    const double t = static_cast<double>(step);
    adam_constants<A> c{};
    c.beta1 = static_cast<A>(beta1);
    c.beta2 = static_cast<A>(beta2);
    c.one_minus_beta1 = static_cast<A>(1.0 - beta1);
    c.one_minus_beta2 = static_cast<A>(1.0 - beta2);
    c.eps = static_cast<A>(eps);
    c.step_size = static_cast<A>(lr / (1.0 - std::pow(beta1, t)));
    c.bias_correction2_sqrt = static_cast<A>(std::sqrt(1.0 - std::pow(beta2, t)));
    c.decay = static_cast<A>(decoupled ? 1.0 - lr * weight_decay : 1.0);
    c.l2 = static_cast<A>(decoupled ? 0.0 : weight_decay);
    return c;
}

template <class A>
UNISON_HOST_DEVICE void adam_update(const adam_constants<A>& c, A& p, A g, A& m, A& v) {
    using std::sqrt;
    g = g + c.l2 * p;
    p *= c.decay;
    m += c.one_minus_beta1 * (g - m);
    v = c.beta2 * v + c.one_minus_beta2 * g * g;
    const A denom = sqrt(v) / c.bias_correction2_sqrt + c.eps;
    p -= c.step_size * (m / denom);
}

} // namespace detail

namespace detail {

/// Adam and AdamW: the same moments; `Decoupled` picks AdamW's weight decay.
template <bool Decoupled>
struct adam_family {
    double lr = 1e-3;
    double beta1 = 0.9;
    double beta2 = 0.999;
    double eps = 1e-8;
    double weight_decay = Decoupled ? 1e-2 : 0.0;

    static constexpr std::string_view name = Decoupled ? "adamw" : "adam";
    static constexpr std::size_t slots = 2;
    static constexpr std::array<std::string_view, slots> slot_names{"exp_avg", "exp_avg_sq"};

    template <class A>
    using constants = adam_constants<A>;
    template <class A>
    constants<A> prepare(std::uint64_t step) const {
        return adam_prepare<A>(lr, beta1, beta2, eps, weight_decay, step, Decoupled);
    }
    template <class A>
    UNISON_HOST_DEVICE static void update(const constants<A>& c, A& p, A g, A (&s)[slots]) {
        adam_update(c, p, g, s[0], s[1]);
    }
};

} // namespace detail

/// torch.optim.Adam (amsgrad off): weight decay (default 0) is L2, added to the
/// gradient. Fields: lr, beta1, beta2, eps, weight_decay.
using adam = detail::adam_family<false>;

/// torch.optim.AdamW (amsgrad off): decoupled weight decay (default 1e-2),
/// p *= 1 - lr * weight_decay before the Adam step.
using adamw = detail::adam_family<true>;

/// What `partitioned_optimizer` needs of an optimizer type.
template <class O>
concept optimizer = requires(const O& o) {
    { O::name } -> std::convertible_to<std::string_view>;
    { O::slots } -> std::convertible_to<std::size_t>;
    o.template prepare<float>(std::uint64_t{1});
    o.template prepare<double>(std::uint64_t{1});
};

} // namespace unison::optim
