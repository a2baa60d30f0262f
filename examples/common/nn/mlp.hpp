// nn: a multi-layer perceptron with autograd-style gradient hooks.
#pragma once

#include "layers.hpp"
#include "matrix.hpp"
#include "parameter.hpp"
#include "random.hpp"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace nn {

/// linear, relu, linear, relu, ..., linear: widths {32, 64, 64, 10} make three
/// linear layers 32->64->64->10, named "layers.0", "layers.1", "layers.2" (numbered
/// by linear layer; the relus have no parameters). Layer k is initialised from
/// derive_seed(seed, k).
///
/// Gradients accumulate: backward() adds to every parameter's grad; zero_grad()
/// clears them. During backward, `on_grad_ready` (when set) is called once per
/// parameter, right after that parameter's gradient has been accumulated, in exactly
/// the reverse of parameters() order: the last layer's bias, its weight, then the
/// layer before's bias, its weight, ... down to layers.0.weight.
///
/// with_unused_head adds a linear head widths.back() -> widths.back() named
/// "unused_head", registered last in parameters() but never used by forward or
/// backward: its gradient stays zero and on_grad_ready never fires for it (the
/// situation DDP's find_unused_parameters exists for).
template <class T>
class mlp {
public:
    grad_hook<T> on_grad_ready;
    /// Called with linear layer k's index right before and after its forward and its
    /// backward (a sharding wrapper's pre and post hooks: gather the layer's
    /// parameters before, release them after). Unset hooks are skipped.
    std::function<void(std::size_t)> before_forward, after_forward, before_backward, after_backward;

    mlp(const std::vector<std::size_t>& widths, std::uint64_t seed, bool with_unused_head = false)
        : widths_(widths) {
        if (widths.size() < 2) {
            throw std::invalid_argument("nn::mlp: needs at least an input and an output width");
        }
        for (std::size_t k = 0; k + 1 < widths.size(); ++k) {
            layers_.push_back(std::make_unique<linear<T>>(
                widths[k], widths[k + 1], derive_seed(seed, k), "layers." + std::to_string(k)));
        }
        relus_.resize(layers_.size() - 1);
        if (with_unused_head) {
            unused_head_ = std::make_unique<linear<T>>(
                widths.back(), widths.back(), derive_seed(seed, layers_.size()), "unused_head");
        }
    }

    const std::vector<std::size_t>& widths() const { return widths_; }

    /// x [batch x widths.front()] -> logits [batch x widths.back()].
    matrix<T> forward(const matrix<T>& x) {
        matrix<T> h = x;
        for (std::size_t k = 0; k < layers_.size(); ++k) {
            if (k > 0)
                h = relus_[k - 1].forward(h);
            call(before_forward, k);
            h = layers_[k]->forward(h);
            call(after_forward, k);
        }
        return h;
    }

    /// Back-propagates d(loss)/d(logits) of the last forward(), accumulating every
    /// used parameter's gradient and calling on_grad_ready for each (see above).
    void backward(const matrix<T>& dlogits) {
        matrix<T> d = dlogits;
        for (std::size_t k = layers_.size(); k-- > 0;) {
            call(before_backward, k);
            d = layers_[k]->backward(d, on_grad_ready, /*need_input_grad=*/k > 0);
            call(after_backward, k);
            if (k > 0)
                d = relus_[k - 1].backward(d);
        }
    }

    /// Every parameter, in registration (forward) order: layers.0.weight,
    /// layers.0.bias, layers.1.weight, ..., then unused_head.weight/bias if present.
    /// The pointers stay valid for the model's lifetime (also across moves).
    std::vector<parameter<T>*> parameters() {
        std::vector<parameter<T>*> out;
        for (auto& l : layers_) {
            out.push_back(&l->weight);
            out.push_back(&l->bias);
        }
        if (unused_head_) {
            out.push_back(&unused_head_->weight);
            out.push_back(&unused_head_->bias);
        }
        return out;
    }

    /// The number of linear layers (the unused head not counted).
    std::size_t layer_count() const { return layers_.size(); }
    /// Linear layer k's parameters: weight, bias.
    std::vector<parameter<T>*> layer_parameters(std::size_t k) {
        return {&layers_.at(k)->weight, &layers_.at(k)->bias};
    }

    /// Sets every parameter's grad (its own storage or the bound one) to zero.
    void zero_grad() {
        for (parameter<T>* p : parameters())
            p->zero_grad();
    }

    /// The number of scalars in all parameters (the unused head included).
    std::size_t parameter_count() const {
        std::size_t n = 0;
        for (const auto& l : layers_)
            n += l->weight.size() + l->bias.size();
        if (unused_head_)
            n += unused_head_->weight.size() + unused_head_->bias.size();
        return n;
    }

private:
    static void call(const std::function<void(std::size_t)>& hook, std::size_t k) {
        if (hook)
            hook(k);
    }

    std::vector<std::size_t> widths_;
    std::vector<std::unique_ptr<linear<T>>> layers_;
    std::vector<relu<T>> relus_;
    std::unique_ptr<linear<T>> unused_head_;
};

} // namespace nn
