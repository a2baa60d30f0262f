#pragma once

// LibTorch models and data for the unison::torch tests: an MLP, a small
// transformer block (pre-norm attention and feed-forward with residuals), a model
// with batch normalization (buffers) and one with a parameter that forward never
// uses. Every model is initialized from its own generator, so rank threads can
// build them at once without sharing LibTorch's global one.

#include <unison/torch/recompute.hpp>
#include <unison/torch/units.hpp>

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
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

/// Pre-norm self-attention and feed-forward with residuals on [batch, seq, width].
struct attention : ::torch::nn::Module {
    attention() {
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
    }
    at::Tensor forward(at::Tensor h) {
        const std::int64_t b = h.size(0), dh = width / heads;
        const auto parts = qkv(ln1(h)).chunk(3, -1);
        auto split = [&](const at::Tensor& t) {
            return t.reshape({b, seq, heads, dh}).transpose(1, 2);
        };
        const at::Tensor scores =
            ::torch::softmax(split(parts[0]).matmul(split(parts[1]).transpose(-2, -1)) /
                                 std::sqrt(static_cast<double>(dh)),
                             -1);
        h = h + proj(scores.matmul(split(parts[2])).transpose(1, 2).reshape({b, seq, width}));
        return h + ff2(::torch::gelu(ff1(ln2(h))));
    }
    ::torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
    ::torch::nn::Linear qkv{nullptr}, proj{nullptr}, ff1{nullptr}, ff2{nullptr};
};

/// A transformer block and a mean-pooled head.
struct block : net {
    block() {
        attn = register_module("attn", std::make_shared<attention>());
        head = register_module("head", ::torch::nn::Linear(width, classes));
    }
    at::Tensor forward(const at::Tensor& x) override { // x: [batch, seq * width]
        return head(attn->forward(x.reshape({x.size(0), seq, width})).mean(1));
    }
    std::shared_ptr<attention> attn;
    ::torch::nn::Linear head{nullptr};
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

/// A residual feed-forward block on [batch, width]; with `spare`, a layer that
/// forward uses only while `use_spare` is set.
struct ffn : ::torch::nn::Module {
    explicit ffn(bool with_spare = false) {
        fc1 = register_module("fc1", ::torch::nn::Linear(width, 2 * width));
        fc2 = register_module("fc2", ::torch::nn::Linear(2 * width, width));
        if (with_spare) {
            spare = register_module("spare", ::torch::nn::Linear(width, width));
        }
    }
    at::Tensor forward(const at::Tensor& h) {
        const at::Tensor out = h + fc2(::torch::silu(fc1(h)));
        return use_spare ? out + spare(h) : out;
    }
    ::torch::nn::Linear fc1{nullptr}, fc2{nullptr}, spare{nullptr};
    bool use_spare = false;
};

/// What a sharded model's forward does with its blocks.
enum class stacking {
    plain,       ///< each block once
    reuse_first, ///< block 0 twice (a unit used twice in one forward)
    spare,       ///< block 1 has a layer forward never uses
    sometimes,   ///< block 1 has a layer forward uses only in the steps use_spare says
    recompute,   ///< every block's activations recomputed in backward
};

/// A model for FSDP: an input layer and a head (the root unit) around `depth`
/// blocks (each a unit), every block's forward run through unit_forward, so that
/// it is a no-op wrapper without an engine and a unit with one. `Block` is ffn
/// (on [batch, width]) or attention (on [batch, seq, width]).
template <class Block>
struct stack : net {
    static constexpr bool tokens = std::is_same_v<Block, attention>;
    explicit stack(stacking how, int depth = 3) : how_(how) {
        stem = register_module("stem", ::torch::nn::Linear(tokens ? width : features, width));
        for (int i = 0; i < depth; ++i) {
            blocks.push_back(register_module(
                "block" + std::to_string(i),
                tokens
                    ? std::make_shared<Block>()
                    : make_ffn(i == 1 && (how == stacking::spare || how == stacking::sometimes))));
        }
        head = register_module("head", ::torch::nn::Linear(width, classes));
    }
    at::Tensor forward(const at::Tensor& x) override {
        at::Tensor h = tokens ? stem(x.reshape({x.size(0), seq, width})) : ::torch::silu(stem(x));
        for (std::size_t i = 0; i < blocks.size(); ++i) {
            const int runs = how_ == stacking::reuse_first && i == 0 ? 2 : 1;
            for (int r = 0; r < runs; ++r) {
                Block& b = *blocks[i];
                if (how_ == stacking::recompute) {
                    h = unison::torch::recompute(
                        [&b](const at::Tensor& in) {
                            return unison::torch::unit_forward(b, [&] { return b.forward(in); });
                        },
                        h);
                } else {
                    h = unison::torch::unit_forward(b, [&] { return b.forward(h); });
                }
            }
        }
        return head(tokens ? h.mean(1) : h);
    }
    /// stacking::sometimes: whether block 1's spare layer takes part in the next
    /// forward (nothing otherwise).
    void use_spare(bool on) {
        if constexpr (!tokens) {
            if (how_ == stacking::sometimes) {
                blocks[1]->use_spare = on;
            }
        }
    }
    /// Whether stacking::sometimes uses the spare layer in step `step`: one step in
    /// three, so that it sits out most steps and its step count falls behind.
    static bool spare_step(int step) { return step % 3 == 1; }
    /// The units an engine takes: the blocks.
    std::vector<std::shared_ptr<::torch::nn::Module>> units() const {
        return {blocks.begin(), blocks.end()};
    }
    std::vector<std::shared_ptr<Block>> blocks;
    ::torch::nn::Linear stem{nullptr}, head{nullptr};

private:
    static std::shared_ptr<Block> make_ffn(bool spare) {
        if constexpr (tokens) {
            return nullptr;
        } else {
            return std::make_shared<ffn>(spare);
        }
    }
    stacking how_;
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

/// Converts `m` to `dtype` and draws its parameters from a generator seeded with
/// `seed`.
inline void initialize(::torch::nn::Module& m, c10::ScalarType dtype, std::uint64_t seed) {
    m.to(dtype);
    auto gen = at::detail::createCPUGenerator(seed);
    ::torch::NoGradGuard no_grad;
    for (at::Tensor& p : m.parameters()) {
        const double scale = p.dim() > 1 ? 1.0 / std::sqrt(static_cast<double>(p.size(1))) : 0.2;
        p.copy_(at::randn(p.sizes(), gen, at::TensorOptions(at::kDouble)).mul_(scale) +
                (p.dim() == 1 ? 0.5 : 0.0));
    }
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
    initialize(*m, dtype, seed);
    return m;
}

/// A sharded-model stack of `Block`s (see stack) in `dtype`, drawn from `seed`.
template <class Block>
std::shared_ptr<stack<Block>> make_stack(stacking how, c10::ScalarType dtype, std::uint64_t seed) {
    auto m = std::make_shared<stack<Block>>(how);
    initialize(*m, dtype, seed);
    return m;
}

/// Input features per sample of a stack of `Block`s.
template <class Block>
std::int64_t stack_input_width() {
    return stack<Block>::tokens ? seq * width : features;
}

/// A classification set of `samples` rows, the same for one seed on every rank.
struct dataset {
    at::Tensor x, y;
};
inline dataset make_data(std::int64_t inputs, c10::ScalarType dtype, std::int64_t samples,
                         std::uint64_t seed) {
    auto gen = at::detail::createCPUGenerator(seed);
    const at::Tensor centres = at::randn({classes, inputs}, gen, at::TensorOptions(at::kDouble));
    const at::Tensor y = at::randint(0, classes, {samples}, gen, at::TensorOptions(at::kLong));
    const at::Tensor noise = at::randn({samples, inputs}, gen, at::TensorOptions(at::kDouble));
    return {(centres.index_select(0, y) + noise).to(dtype), y};
}
inline dataset make_data(kind k, c10::ScalarType dtype, std::int64_t samples, std::uint64_t seed) {
    return make_data(input_width(k), dtype, samples, seed);
}

/// max |a - b| / max |b|: the error relative to the tensor's scale (in double, on
/// the host, wherever a and b are).
inline double relative_error(const at::Tensor& a, const at::Tensor& b) {
    const double scale = b.abs().max().item<double>();
    const double error =
        (a.to(at::kCPU, at::kDouble) - b.to(at::kCPU, at::kDouble)).abs().max().item<double>();
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
