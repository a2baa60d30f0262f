// nn: optimizers (SGD with momentum, AdamW), with PyTorch's update rules.
//
// Both read each parameter's gradient through parameter::grad, wherever it is bound,
// and update every parameter they were given on every step (a parameter whose
// gradient is zero still decays; pass a subset to exclude some).
#pragma once

#include "parameter.hpp"

#include <cmath>
#include <cstddef>
#include <utility>
#include <vector>

namespace nn {

/// torch.optim.SGD (dampening 0, no Nesterov):
///   g = grad + weight_decay * p
///   buf = momentum * buf + g          (buf starts at 0, so the first buf is g)
///   p -= lr * buf                     (p -= lr * g when momentum is 0)
template <class T>
class sgd {
public:
    T lr, momentum, weight_decay; ///< may be changed between steps (schedules)

    sgd(std::vector<parameter<T>*> params, T lr_, T momentum_ = T(0), T weight_decay_ = T(0))
        : lr(lr_), momentum(momentum_), weight_decay(weight_decay_), params_(std::move(params)) {
        for (const parameter<T>* p : params_)
            buf_.emplace_back(p->size(), T(0));
    }

    void step() {
        for (std::size_t k = 0; k < params_.size(); ++k) {
            parameter<T>& p = *params_[k];
            std::vector<T>& buf = buf_[k];
            for (std::size_t j = 0; j < p.size(); ++j) {
                const T g = p.grad[j] + weight_decay * p.value[j];
                if (momentum != T(0)) {
                    buf[j] = momentum * buf[j] + g;
                    p.value[j] -= lr * buf[j];
                } else {
                    p.value[j] -= lr * g;
                }
            }
        }
    }

    const std::vector<parameter<T>*>& params() const { return params_; }

private:
    std::vector<parameter<T>*> params_;
    std::vector<std::vector<T>> buf_;
};

/// torch.optim.AdamW (amsgrad off), in PyTorch's order of operations; t = steps():
///   p *= 1 - lr * weight_decay
///   m += (1 - beta1) * (g - m)        (= beta1 * m + (1 - beta1) * g)
///   v = beta2 * v + (1 - beta2) * g * g
///   p -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
/// which is p -= lr * mhat / (sqrt(vhat) + eps) with the usual bias corrections.
template <class T>
class adamw {
public:
    T lr, beta1, beta2, eps, weight_decay; ///< may be changed between steps

    adamw(std::vector<parameter<T>*> params, T lr_, T beta1_ = T(0.9), T beta2_ = T(0.999),
          T eps_ = T(1e-8), T weight_decay_ = T(0.01))
        : lr(lr_), beta1(beta1_), beta2(beta2_), eps(eps_), weight_decay(weight_decay_),
          params_(std::move(params)) {
        for (const parameter<T>* p : params_) {
            m_.emplace_back(p->size(), T(0));
            v_.emplace_back(p->size(), T(0));
        }
    }

    void step() {
        ++t_;
        const T t = static_cast<T>(t_);
        const T bias_correction1 = T(1) - std::pow(beta1, t);
        const T bias_correction2_sqrt = std::sqrt(T(1) - std::pow(beta2, t));
        const T step_size = lr / bias_correction1;
        const T decay = T(1) - lr * weight_decay;
        for (std::size_t k = 0; k < params_.size(); ++k) {
            parameter<T>& p = *params_[k];
            std::vector<T>& m = m_[k];
            std::vector<T>& v = v_[k];
            for (std::size_t j = 0; j < p.size(); ++j) {
                const T g = p.grad[j];
                p.value[j] *= decay;
                m[j] += (T(1) - beta1) * (g - m[j]);
                v[j] = beta2 * v[j] + (T(1) - beta2) * g * g;
                const T denom = std::sqrt(v[j]) / bias_correction2_sqrt + eps;
                p.value[j] -= step_size * (m[j] / denom);
            }
        }
    }

    /// The number of step() calls so far (PyTorch's `step` state).
    std::size_t steps() const { return t_; }
    const std::vector<parameter<T>*>& params() const { return params_; }

private:
    std::vector<parameter<T>*> params_;
    std::vector<std::vector<T>> m_, v_;
    std::size_t t_ = 0;
};

} // namespace nn
