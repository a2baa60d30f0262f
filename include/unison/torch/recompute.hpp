#pragma once

/// \file
/// `unison::torch::recompute`: activation recomputation (checkpointing) for a block
/// of a LibTorch model, with or without an engine. Forward runs the block without
/// keeping its intermediate activations (only its input is kept); when backward
/// reaches the block's output, the block's forward runs again with the same input
/// and random-number state, and backward goes through the re-run. Memory for
/// activations drops to one tensor per block, for one more forward per block.
///
///     for (auto& block : blocks) {
///         h = unison::torch::recompute([&](const at::Tensor& in) {
///             return unison::torch::unit_forward(*block, [&] { return block->forward(in); });
///         }, h);
///     }
///
/// Under `torch::fsdp` the re-run enters the unit's recomputation
/// (`unison::fsdp::recompute`): its parameters are gathered again where they were
/// released, it does not count as another use of the unit, and the unit stays
/// gathered for its backward, which then reduces its gradients as usual. Every rank
/// must recompute the same blocks. Without an engine, or under `torch::ddp`, it is
/// PyTorch's reentrant `torch.utils.checkpoint`.
///
/// Like that one: `f` must compute the same function on the re-run (the
/// random-number state of the CPU, and of the input's GPU, is restored for it), the
/// block's gradient flows only through its returned tensor, and backward through it
/// runs once (retain_graph is refused). Under `torch::NoGradGuard` (evaluation) `f`
/// simply runs. The generators are the process's: ranks of the thread backend share
/// them, so a block that draws random numbers (dropout) replays its draws exactly
/// only with one rank per process (MPI, NCCL).

#include "unison/core/error.hpp"
#include "unison/torch/detail/recomputing.hpp"

#include <ATen/Context.h>
#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/variable.h>

#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

namespace unison::torch {

namespace detail {

/// The random-number state of the CPU generator and of one GPU's, to replay a
/// forward's draws in its recomputation.
struct rng_state {
    at::Tensor cpu;
    std::optional<at::Device> device;
    at::Tensor on_device;

    static at::Tensor read(at::Generator g) {
        const std::lock_guard<std::mutex> lock(g.mutex());
        return g.get_state();
    }
    static void write(at::Generator g, const at::Tensor& state) {
        const std::lock_guard<std::mutex> lock(g.mutex());
        g.set_state(state);
    }
    /// The state now (of the CPU, and of `device` when it is a GPU).
    static rng_state capture(const at::Device& device) {
        rng_state s;
        s.cpu = read(at::detail::getDefaultCPUGenerator());
        if (device.is_cuda()) {
            s.device = device;
            s.on_device = read(at::globalContext().defaultGenerator(device));
        }
        return s;
    }
    void restore() const {
        write(at::detail::getDefaultCPUGenerator(), cpu);
        if (device) {
            write(at::globalContext().defaultGenerator(*device), on_device);
        }
    }
};

/// Sets the generators to `replay` while it lives, then back to what they were.
class replaying_rng {
public:
    explicit replaying_rng(const rng_state& replay)
        : before_(rng_state::capture(replay.device.value_or(at::Device(at::kCPU)))) {
        replay.restore();
    }
    ~replaying_rng() {
        try {
            before_.restore();
        } catch (...) { // a destructor must not throw; the state is what f left
        }
    }
    replaying_rng(const replaying_rng&) = delete;
    replaying_rng& operator=(const replaying_rng&) = delete;

private:
    rng_state before_;
};

/// The backward of one recompute() call: re-runs the block on its saved input with
/// gradients enabled, backpropagates the incoming gradient through the re-run (a
/// reentrant backward, which also accumulates the block's parameter gradients) and
/// returns the input's gradient.
class recompute_node final : public ::torch::autograd::Node {
public:
    recompute_node(std::function<at::Tensor(const at::Tensor&)> f, at::Tensor input,
                   bool input_requires_grad, rng_state rng)
        : f_(std::move(f)), input_(std::move(input)), input_requires_grad_(input_requires_grad),
          rng_(std::move(rng)) {}

    std::string name() const override { return "unison::torch::recompute"; }

    ::torch::autograd::variable_list apply(::torch::autograd::variable_list&& grads) override {
        if (!f_) {
            throw argument_error(-1, "unison::torch::recompute",
                                 "backward ran through this block a second time: its input was "
                                 "released after the first (retain_graph is not supported)");
        }
        at::Tensor x = input_.detach();
        x.requires_grad_(input_requires_grad_);
        at::Tensor y;
        {
            const replaying_rng replay(rng_);
            const c10::AutoGradMode enabled(true);
            const recomputing_scope recomputing;
            y = f_(x);
        }
        if (grads.at(0).defined() && y.requires_grad()) {
            ::torch::autograd::backward({y}, {grads[0]});
        }
        at::Tensor gx = input_requires_grad_ ? x.grad() : at::Tensor();
        release_variables();
        return {gx};
    }

    void release_variables() override {
        f_ = nullptr;
        input_ = at::Tensor();
    }

private:
    std::function<at::Tensor(const at::Tensor&)> f_;
    at::Tensor input_;
    bool input_requires_grad_;
    rng_state rng_;
};

} // namespace detail

/// Runs `f(input)` (a block's forward: one tensor in, one out) keeping none of its
/// activations, and recomputes it when backward reaches its result (see the file
/// comment).
inline at::Tensor recompute(std::function<at::Tensor(const at::Tensor&)> f,
                            const at::Tensor& input) {
    if (!c10::GradMode::is_enabled()) {
        return f(input);
    }
    detail::rng_state rng = detail::rng_state::capture(input.device());
    at::Tensor y;
    {
        const c10::AutoGradMode disabled(false);
        y = f(input).detach(); // a leaf of its own: the node below becomes its history
    }
    auto node = std::shared_ptr<detail::recompute_node>(
        new detail::recompute_node(f, input.detach(), input.requires_grad(), std::move(rng)),
        ::torch::autograd::deleteNode);
    node->set_next_edges(::torch::autograd::collect_next_edges(input));
    ::torch::autograd::set_history(y, node);
    return y;
}

} // namespace unison::torch
