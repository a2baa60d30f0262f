#pragma once

/// \file
/// Adam and AdamW as element math on flat shards, in PyTorch's order of operations
/// (see optimizer.hpp for the shape every optimizer has).

#include "unison/core/config.hpp"
#include "unison/optim/optimizer.hpp"

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace unison::optim {

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

static_assert(optimizer<adam>);
static_assert(optimizer<adamw>);

} // namespace unison::optim
