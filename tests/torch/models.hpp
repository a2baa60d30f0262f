#pragma once

// LibTorch models and data for the unison::torch tests: an MLP, a small
// transformer block (pre-norm attention and feed-forward with residuals), a model
// with batch normalization (buffers) and one with a parameter that forward never
// uses. Every model is initialized from its own generator, so rank threads can
// build them at once without sharing LibTorch's global one.

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace unison::test::torch_models {

/// A module with one tensor in and logits out.
struct net : ::torch::nn::Module {
    virtual at::Tensor forward(const at::Tensor& x) = 0;
};

inline constexpr std::int64_t features = 12, classes = 5;
inline constexpr std::int64_t seq = 6, width = 16, heads = 2;

struct mlp : net {
    explicit mlp(std::int64_t hidden = 24) {
        fc1 = register_module("fc1", ::torch::nn::Linear(features, hidden));
        fc2 = register_module("fc2", ::torch::nn::Linear(hidden, 16));
        fc3 = register_module("fc3", ::torch::nn::Linear(16, classes));
    }
    at::Tensor forward(const at::Tensor& x) override {
        return fc3(::torch::silu(fc2(::torch::silu(fc1(x)))));
    }
    ::torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
};

/// Pre-norm self-attention and feed-forward with residuals, then a mean-pooled head.
struct block : net {
    block() {
        ln1 = register_module("ln1", ::torch::nn::LayerNorm(::torch::nn::LayerNormOptions(
                                         std::vector<int64_t>{width})));
        // No bias: the keys' bias has no effect on softmax, so its gradient would be
        // rounding noise that Adam's normalization turns into full-size steps.
        qkv = register_module(
            "qkv", ::torch::nn::Linear(::torch::nn::LinearOptions(width, 3 * width).bias(false)));
        proj = register_module("proj", ::torch::nn::Linear(width, width));
        ln2 = register_module("ln2", ::torch::nn::LayerNorm(::torch::nn::LayerNormOptions(
                                         std::vector<int64_t>{width})));
        ff1 = register_module("ff1", ::torch::nn::Linear(width, 2 * width));
        ff2 = register_module("ff2", ::torch::nn::Linear(2 * width, width));
        head = register_module("head", ::torch::nn::Linear(width, classes));
    }
    at::Tensor forward(const at::Tensor& x) override { // x: [batch, seq * width]
        const std::int64_t b = x.size(0), dh = width / heads;
        at::Tensor h = x.reshape({b, seq, width});
        const auto parts = qkv(ln1(h)).chunk(3, -1);
        auto split = [&](const at::Tensor& t) {
            return t.reshape({b, seq, heads, dh}).transpose(1, 2);
        };
        const at::Tensor scores =
            ::torch::softmax(split(parts[0]).matmul(split(parts[1]).transpose(-2, -1)) /
                                 std::sqrt(static_cast<double>(dh)),
                             -1);
        h = h + proj(scores.matmul(split(parts[2])).transpose(1, 2).reshape({b, seq, width}));
        h = h + ff2(::torch::gelu(ff1(ln2(h))));
        return head(h.mean(1));
    }
    ::torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
    ::torch::nn::Linear qkv{nullptr}, proj{nullptr}, ff1{nullptr}, ff2{nullptr}, head{nullptr};
};

/// Linear, batch normalization (running statistics: buffers), Linear.
struct batch_norm_net : net {
    batch_norm_net() {
        fc1 = register_module("fc1", ::torch::nn::Linear(features, 24));
        bn = register_module("bn", ::torch::nn::BatchNorm1d(24));
        fc2 = register_module("fc2", ::torch::nn::Linear(24, classes));
    }
    at::Tensor forward(const at::Tensor& x) override { return fc2(::torch::silu(bn(fc1(x)))); }
    ::torch::nn::Linear fc1{nullptr}, fc2{nullptr};
    ::torch::nn::BatchNorm1d bn{nullptr};
};

/// An MLP with a second head that forward never uses.
struct unused_head_net : mlp {
    unused_head_net() { spare = register_module("spare", ::torch::nn::Linear(16, classes)); }
    ::torch::nn::Linear spare{nullptr};
};

enum class kind { mlp, block, batch_norm, unused_head };

inline const char* name(kind k) {
    switch (k) {
    case kind::mlp:
        return "MLP";
    case kind::block:
        return "transformer block";
    case kind::batch_norm:
        return "batch-norm MLP";
    case kind::unused_head:
        return "MLP with an unused head";
    }
    return "?";
}

/// Input features per sample.
inline std::int64_t input_width(kind k) {
    return k == kind::block ? seq * width : features;
}

/// Model `k` in `dtype`, its parameters drawn from a generator seeded with `seed`
/// (so two calls with one seed give equal models, and different seeds different ones).
inline std::shared_ptr<net> make(kind k, c10::ScalarType dtype, std::uint64_t seed) {
    std::shared_ptr<net> m;
    switch (k) {
    case kind::mlp:
        m = std::make_shared<mlp>();
        break;
    case kind::block:
        m = std::make_shared<block>();
        break;
    case kind::batch_norm:
        m = std::make_shared<batch_norm_net>();
        break;
    case kind::unused_head:
        m = std::make_shared<unused_head_net>();
        break;
    }
    m->to(dtype);
    auto gen = at::detail::createCPUGenerator(seed);
    ::torch::NoGradGuard no_grad;
    for (at::Tensor& p : m->parameters()) {
        const double scale = p.dim() > 1 ? 1.0 / std::sqrt(static_cast<double>(p.size(1))) : 0.2;
        p.copy_(at::randn(p.sizes(), gen, at::TensorOptions(at::kDouble)).mul_(scale) +
                (p.dim() == 1 ? 0.5 : 0.0));
    }
    return m;
}

/// A classification set of `samples` rows, the same for one seed on every rank.
struct dataset {
    at::Tensor x, y;
};
inline dataset make_data(kind k, c10::ScalarType dtype, std::int64_t samples, std::uint64_t seed) {
    auto gen = at::detail::createCPUGenerator(seed);
    const at::Tensor centres =
        at::randn({classes, input_width(k)}, gen, at::TensorOptions(at::kDouble));
    const at::Tensor y = at::randint(0, classes, {samples}, gen, at::TensorOptions(at::kLong));
    const at::Tensor noise =
        at::randn({samples, input_width(k)}, gen, at::TensorOptions(at::kDouble));
    return {(centres.index_select(0, y) + noise).to(dtype), y};
}

/// max |a - b| / max |b|: the error relative to the tensor's scale.
inline double relative_error(const at::Tensor& a, const at::Tensor& b) {
    const double scale = b.abs().max().item<double>();
    const double error = (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
    return scale > 0 ? error / scale : error;
}

/// Every parameter with a defined zero gradient, as DDP gives them at construction,
/// so that a reference's optimizer treats never-used parameters like DDP's does.
inline void zero_gradients(::torch::nn::Module& m) {
    for (at::Tensor& p : m.parameters()) {
        p.mutable_grad() = at::zeros_like(p);
    }
}

} // namespace unison::test::torch_models
