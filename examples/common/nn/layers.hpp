// nn: layers (linear, relu) and the softmax cross-entropy loss.
#pragma once

#include "matrix.hpp"
#include "parameter.hpp"
#include "random.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace nn {

/// Called for a parameter once its gradient for the current backward pass has been
/// accumulated into parameter::grad (an autograd post-accumulate-grad hook).
template <class T>
using grad_hook = std::function<void(parameter<T>&)>;

/// y = x W^T + b, with W [out x in] and b [out], initialised uniform(-1/sqrt(in),
/// 1/sqrt(in)) from `seed` (the PyTorch default range; bit-identical everywhere).
/// Parameters are named "<name>.weight" and "<name>.bias".
template <class T>
class linear {
public:
    parameter<T> weight, bias;

    linear(std::size_t in, std::size_t out, std::uint64_t seed, const std::string& name = "linear")
        : weight(name + ".weight", out * in), bias(name + ".bias", out), in_(in), out_(out) {
        if (in == 0 || out == 0) {
            throw std::invalid_argument("nn::linear '" + name + "': zero width");
        }
        splitmix64 g(seed);
        const double bound = 1.0 / std::sqrt(static_cast<double>(in));
        for (T& w : weight.value)
            w = static_cast<T>(g.uniform(-bound, bound));
        for (T& b : bias.value)
            b = static_cast<T>(g.uniform(-bound, bound));
    }

    std::size_t in_features() const { return in_; }
    std::size_t out_features() const { return out_; }

    /// x [batch x in] -> [batch x out]; keeps a copy of x for backward.
    matrix<T> forward(const matrix<T>& x) {
        if (x.cols != in_) {
            throw std::invalid_argument("nn::linear '" + weight.name + "': input has " +
                                        std::to_string(x.cols) + " columns, expected " +
                                        std::to_string(in_));
        }
        input_ = x;
        matrix<T> y = matrix<T>::zeros(x.rows, out_);
        for (std::size_t r = 0; r < x.rows; ++r) {
            const T* xr = &x.data[r * in_];
            for (std::size_t o = 0; o < out_; ++o) {
                const T* wo = &weight.value[o * in_];
                T acc = bias.value[o];
                for (std::size_t i = 0; i < in_; ++i)
                    acc += xr[i] * wo[i];
                y(r, o) = acc;
            }
        }
        return y;
    }

    /// dy [batch x out] -> dx [batch x in]. Adds this pass's dW and db to weight.grad
    /// and bias.grad (gradients accumulate), calling `on_grad_ready` for bias, then
    /// weight, right after each is accumulated. With need_input_grad false, dx is not
    /// computed and an empty matrix is returned (the first layer's case).
    matrix<T> backward(const matrix<T>& dy, const grad_hook<T>& on_grad_ready = {},
                       bool need_input_grad = true) {
        if (dy.rows != input_.rows || dy.cols != out_) {
            throw std::invalid_argument("nn::linear '" + weight.name +
                                        "': backward without a matching forward");
        }
        const std::size_t batch = dy.rows;

        // This pass's gradient is computed on its own, then added to grad in one
        // step, as autograd does: two passes give exactly twice one pass.
        scratch_.assign(out_, T(0));
        for (std::size_t r = 0; r < batch; ++r) {
            for (std::size_t o = 0; o < out_; ++o)
                scratch_[o] += dy(r, o);
        }
        accumulate(bias, on_grad_ready);

        scratch_.assign(out_ * in_, T(0));
        for (std::size_t r = 0; r < batch; ++r) { // dW[o][i] += dy[r][o] * x[r][i]
            const T* xr = &input_.data[r * in_];
            for (std::size_t o = 0; o < out_; ++o) {
                const T d = dy(r, o);
                T* so = &scratch_[o * in_];
                for (std::size_t i = 0; i < in_; ++i)
                    so[i] += d * xr[i];
            }
        }
        accumulate(weight, on_grad_ready);

        if (!need_input_grad)
            return {};
        matrix<T> dx = matrix<T>::zeros(batch, in_);
        for (std::size_t r = 0; r < batch; ++r) { // dx[r][i] += dy[r][o] * W[o][i]
            T* dxr = &dx.data[r * in_];
            for (std::size_t o = 0; o < out_; ++o) {
                const T d = dy(r, o);
                const T* wo = &weight.value[o * in_];
                for (std::size_t i = 0; i < in_; ++i)
                    dxr[i] += d * wo[i];
            }
        }
        return dx;
    }

private:
    void accumulate(parameter<T>& p, const grad_hook<T>& on_grad_ready) {
        for (std::size_t j = 0; j < scratch_.size(); ++j)
            p.grad[j] += scratch_[j];
        if (on_grad_ready)
            on_grad_ready(p);
    }

    std::size_t in_, out_;
    matrix<T> input_;
    std::vector<T> scratch_;
};

/// max(x, 0), elementwise.
template <class T>
class relu {
public:
    matrix<T> forward(const matrix<T>& x) {
        output_ = x;
        for (T& v : output_.data)
            v = std::max(v, T(0));
        return output_;
    }

    /// dy -> dy where the forward output was positive, 0 elsewhere.
    matrix<T> backward(const matrix<T>& dy) const {
        if (dy.rows != output_.rows || dy.cols != output_.cols) {
            throw std::invalid_argument("nn::relu: backward without a matching forward");
        }
        matrix<T> dx = dy;
        for (std::size_t j = 0; j < dx.data.size(); ++j) {
            if (!(output_.data[j] > T(0)))
                dx.data[j] = T(0);
        }
        return dx;
    }

private:
    matrix<T> output_;
};

template <class T>
struct loss_result {
    T loss;
    matrix<T> dlogits;
};

/// Cross-entropy of softmax(logits) against integer labels, times `scale`:
///   loss = scale * sum_i (logsumexp(logits_i) - logits_i[label_i])
///   dlogits = scale * (softmax(logits) - onehot(labels))
/// scale = 1/batch gives the mean over the batch, scale = 1 the sum. Stable for
/// any logits (each row's maximum is subtracted first).
template <class T>
loss_result<T> softmax_cross_entropy(const matrix<T>& logits, std::span<const int> labels,
                                     T scale) {
    if (labels.size() != logits.rows) {
        throw std::invalid_argument("nn::softmax_cross_entropy: " + std::to_string(labels.size()) +
                                    " labels for " + std::to_string(logits.rows) + " rows");
    }
    loss_result<T> out{T(0), matrix<T>::zeros(logits.rows, logits.cols)};
    for (std::size_t r = 0; r < logits.rows; ++r) {
        const int label = labels[r];
        if (label < 0 || static_cast<std::size_t>(label) >= logits.cols) {
            throw std::invalid_argument("nn::softmax_cross_entropy: label " +
                                        std::to_string(label) + " out of range [0, " +
                                        std::to_string(logits.cols) + ")");
        }
        const auto z = logits.row(r);
        const T max = *std::max_element(z.begin(), z.end());
        T sum = 0;
        for (const T v : z)
            sum += std::exp(v - max);
        const T log_sum = std::log(sum);
        const auto lbl = static_cast<std::size_t>(label);
        out.loss += log_sum - (z[lbl] - max);
        const auto d = out.dlogits.row(r);
        for (std::size_t c = 0; c < z.size(); ++c)
            d[c] = scale * (std::exp(z[c] - max) / sum);
        d[lbl] -= scale;
    }
    out.loss *= scale;
    return out;
}

/// The fraction of rows whose largest logit is at the label.
template <class T>
double accuracy(const matrix<T>& logits, std::span<const int> labels) {
    if (labels.size() != logits.rows) {
        throw std::invalid_argument("nn::accuracy: " + std::to_string(labels.size()) +
                                    " labels for " + std::to_string(logits.rows) + " rows");
    }
    if (logits.rows == 0)
        return 0.0;
    std::size_t right = 0;
    for (std::size_t r = 0; r < logits.rows; ++r) {
        const auto z = logits.row(r);
        const auto best =
            static_cast<std::size_t>(std::max_element(z.begin(), z.end()) - z.begin());
        if (best == static_cast<std::size_t>(labels[r]))
            ++right;
    }
    return static_cast<double>(right) / static_cast<double>(logits.rows);
}

} // namespace nn
