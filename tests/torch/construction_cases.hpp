#pragma once

// A wrapper whose construction fails leaves the module as it was. A failure is
// injected at every stage that torch::ddp and torch::fsdp reach
// (torch/detail/prologue.hpp's construction_fault, per thread): on one rank in
// the rank's own checks, so that every rank must refuse together; on every rank
// after that. Each rank's module starts from its own seed, with a gradient on
// every trainable parameter, a frozen parameter and a buffer, so that anything
// overwritten (by rank 0's values, by zeros, by memory that went away with the
// engine) shows. Afterwards the module takes an engine again and trains.

#include "../collectives/cases.hpp"
#include "models.hpp"

#include <unison/torch.hpp>

#include <doctest/doctest.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace unison::test {

namespace tm = torch_models;

/// What a module holds, to compare after a failed construction: each parameter's
/// tensor and memory (identity), values, gradient and its memory, and the post
/// hooks on its AccumulateGrad node, and each buffer's values.
struct module_snapshot {
    std::vector<const c10::TensorImpl*> identity;
    std::vector<const void*> memory, grad_memory;
    std::vector<at::Tensor> values, grads, buffers;
    std::vector<std::size_t> hooks;
    /// The nodes, held so that the ones an engine hooked are the ones counted.
    std::vector<torch::detail::accumulator_ptr> nodes;

    explicit module_snapshot(const ::torch::nn::Module& m) {
        for (const at::Tensor& p : m.parameters()) {
            identity.push_back(p.unsafeGetTensorImpl());
            memory.push_back(p.data_ptr());
            grad_memory.push_back(p.grad().defined() ? p.grad().data_ptr() : nullptr);
            values.push_back(p.detach().clone());
            grads.push_back(p.grad().defined() ? p.grad().clone() : at::Tensor());
            nodes.push_back(p.requires_grad() ? ::torch::autograd::impl::grad_accumulator(p)
                                              : torch::detail::accumulator_ptr());
            hooks.push_back(nodes.back() ? nodes.back()->post_hooks().size() : 0);
        }
        for (const at::Tensor& b : m.buffers()) {
            buffers.push_back(b.clone());
        }
    }

    /// Says in `o` what of `m` differs from this snapshot; `values` gives the
    /// parameter values expected instead of the snapshot's (rank root's).
    void expect_same(outcome& o, const ::torch::nn::Module& m, const std::string& what,
                     const std::vector<at::Tensor>* values_now = nullptr,
                     const std::vector<at::Tensor>* buffers_now = nullptr) const {
        const auto params = m.parameters();
        const std::vector<at::Tensor>& want = values_now ? *values_now : values;
        const std::vector<at::Tensor>& want_buffers = buffers_now ? *buffers_now : buffers;
        for (std::size_t i = 0; i < params.size(); ++i) {
            const at::Tensor& p = params[i];
            const std::string name = what + ": parameter #" + std::to_string(i);
            o.expect(p.unsafeGetTensorImpl() == identity[i], name + " is another tensor");
            // Its own memory, not the engine's (which may hold equal values, then die).
            o.expect(p.defined() && p.numel() > 0 && p.data_ptr() == memory[i],
                     name + " is not on its own memory");
            o.expect(!p.grad().defined() || p.grad().data_ptr() == grad_memory[i],
                     name + "'s gradient is not on its own memory");
            o.expect(p.defined() && p.sizes() == want[i].sizes() && p.detach().equal(want[i]),
                     name + " lost its values");
            o.expect(p.grad().defined() == grads[i].defined() &&
                         (!grads[i].defined() || p.grad().equal(grads[i])),
                     name + " lost its gradient");
            o.expect(!nodes[i] || nodes[i]->post_hooks().size() == hooks[i],
                     name + " keeps a hook of the failed engine");
        }
        const auto now = m.buffers();
        for (std::size_t i = 0; i < now.size(); ++i) {
            o.expect(now[i].equal(want_buffers[i]),
                     what + ": buffer #" + std::to_string(i) + " changed");
        }
    }
};

/// Makes construction throw at `stage` on this thread while it lives.
class fault_at {
public:
    explicit fault_at(std::string stage) {
        torch::detail::construction_fault = [stage = std::move(stage)](std::string_view at) {
            if (at == stage) {
                throw std::runtime_error("injected at " + stage);
            }
        };
    }
    fault_at(const fault_at&) = delete;
    fault_at& operator=(const fault_at&) = delete;
    ~fault_at() { torch::detail::construction_fault = nullptr; }
};

/// A stack of three blocks from this rank's own seed, with a frozen parameter, a
/// buffer, and a gradient on every trainable parameter (one plain backward).
inline std::shared_ptr<tm::stack<tm::ffn>> module_with_state(int rank) {
    auto m = tm::make_stack<tm::ffn>(tm::stacking::plain, at::kFloat,
                                     200 + static_cast<std::uint64_t>(rank));
    m->stem->bias.set_requires_grad(false);
    m->register_buffer("running", at::randn({5}, at::detail::createCPUGenerator(300 + rank)));
    const tm::dataset data = tm::make_data(tm::stack_input_width<tm::ffn>(), at::kFloat, 4,
                                           400 + static_cast<std::uint64_t>(rank));
    ::torch::nn::functional::cross_entropy(m->forward(data.x), data.y).backward();
    return m;
}

/// Rank 0's copies of `t`.
template <communicator C>
std::vector<at::Tensor> rank0_values(C& comm, const std::vector<at::Tensor>& t) {
    std::vector<at::Tensor> out;
    for (const at::Tensor& v : t) {
        at::Tensor c = v.clone();
        broadcast(comm, c, 0);
        out.push_back(c);
    }
    return out;
}

/// Constructs with `make` under a fault at `stage` (on `faulty` ranks, every rank
/// when -1) and checks the error each rank gets: the injected one on a faulty
/// rank, one naming the lowest faulty rank on the others.
template <communicator C, class Make>
void expect_failed_construction(C& comm, outcome& o, const std::string& what,
                                const std::string& stage, int faulty, Make make) {
    const bool mine = faulty < 0 || faulty == comm.rank();
    std::string error;
    try {
        std::optional<fault_at> fault;
        if (mine) {
            fault.emplace(stage);
        }
        make();
        o.expect(false, what + ": constructed despite the fault");
        return;
    } catch (const std::exception& e) {
        error = e.what();
    }
    const std::string expected = mine
                                     ? "injected at " + stage
                                     : "rank " + std::to_string(faulty) + " cannot take its module";
    o.expect(error.find(expected) != std::string::npos,
             what + ": the error should say '" + expected + "': " + error);
}

template <class... Policies, communicator C>
void torch_fsdp_construction_case(C& comm, outcome& o, const std::string& label) {
    using engine_type = torch::fsdp<C, Policies...>;
    const int faulty_checker = comm.size() > 1 ? 1 : -1;
    for (const std::string stage : {"checked", "registered", "started", "attached"}) {
        const std::string what = label + " failing at '" + stage + "'";
        auto model = module_with_state(comm.rank());
        const module_snapshot before(*model);
        expect_failed_construction(comm, o, what, stage, stage == "checked" ? faulty_checker : -1,
                                   [&] { engine_type engine(comm, model, model->units(), {}); });
        before.expect_same(o, *model, what);
        for (const auto& block : model->blocks) {
            o.expect(torch::detail::unit_registry::instance().find(block.get()).runner == nullptr,
                     what + ": a block is still a unit");
        }
        // The module takes an engine again, which starts from rank 0's values.
        const std::vector<at::Tensor> root = rank0_values(comm, before.values);
        engine_type engine(comm, model, model->units(), {});
        const auto state = engine.full_state_dict();
        std::size_t i = 0;
        for (const auto& item : model->named_parameters()) {
            const at::Tensor* full = state.find(item.key());
            o.expect(full != nullptr && full->equal(root[i]),
                     what + ": the next engine does not hold rank 0's '" + item.key() + "'");
            ++i;
        }
        const tm::dataset data =
            tm::make_data(tm::stack_input_width<tm::ffn>(), at::kFloat, 4, 500);
        ::torch::nn::functional::cross_entropy(
            engine.forward([&] { return model->forward(data.x); }), data.y)
            .backward();
        engine.step();
        o.expect(!engine.full_state_dict().find("head.weight")->equal(*state.find("head.weight")),
                 what + ": the next engine does not train");
    }
}

template <communicator C>
void torch_fsdp_construction_cases(C& comm) {
    outcome o;
    // Parameters released between uses, and parameters resident from start().
    torch_fsdp_construction_case<policy::shard::full>(comm, o, "torch::fsdp (full sharding)");
    torch_fsdp_construction_case<policy::zero<1>>(comm, o, "torch::fsdp (ZeRO-1)");
    {
        // A buffer that no broadcast can move (bool) is refused on every rank
        // before anything moves, not halfway through copying rank 0's state.
        const std::string what = "torch::fsdp with a bool buffer";
        auto model = module_with_state(comm.rank());
        model->register_buffer("mask", at::ones({4}, at::kBool));
        const module_snapshot before(*model);
        try {
            torch::fsdp<C, policy::shard::full> engine(comm, model, model->units(), {});
            o.expect(false, what + ": accepted");
        } catch (const argument_error& e) {
            const std::string message = e.what();
            o.expect(message.find("buffer 'mask' is Bool") != std::string::npos,
                     what + ": the error should name the buffer: " + message);
        }
        before.expect_same(o, *model, what);
    }
    UNISON_CHECK_CASE(comm, "torch::fsdp: a failed construction leaves the module", o);
}

template <class... Policies, communicator C>
void torch_ddp_construction_case(C& comm, outcome& o, const std::string& label) {
    using ddp_type = torch::ddp<C, Policies...>;
    const int faulty_checker = comm.size() > 1 ? 1 : -1;
    for (const std::string stage : {"checked", "registered", "started", "hooked", "pointed"}) {
        const std::string what = label + " failing at '" + stage + "'";
        auto model = module_with_state(comm.rank());
        const module_snapshot before(*model);
        expect_failed_construction(comm, o, what, stage, stage == "checked" ? faulty_checker : -1,
                                   [&] { ddp_type dp(comm, model); });
        // From start() on the parameters and buffers hold rank 0's values (DDP's
        // broadcast); the gradients stay each rank's own.
        const bool from_root = stage != "checked" && stage != "registered";
        const std::vector<at::Tensor> root = rank0_values(comm, before.values);
        const std::vector<at::Tensor> root_buffers = rank0_values(comm, before.buffers);
        before.expect_same(o, *model, what, from_root ? &root : nullptr,
                           from_root ? &root_buffers : nullptr);
        // The module takes an engine again, and its backward averages.
        ddp_type dp(comm, model);
        model->zero_grad();
        const tm::dataset data = tm::make_data(tm::stack_input_width<tm::ffn>(), at::kFloat, 4,
                                               600 + static_cast<std::uint64_t>(comm.rank()));
        ::torch::nn::functional::cross_entropy(model->forward(data.x), data.y).backward();
        o.expect(dp.synchronized(), what + ": the next engine did not synchronize");
        for (const at::Tensor& p : model->parameters()) {
            if (p.requires_grad()) {
                at::Tensor g = p.grad().clone();
                broadcast(comm, g, 0);
                o.expect(g.equal(p.grad()), what + ": the next engine's gradients differ");
            }
        }
    }
}

template <communicator C>
void torch_ddp_construction_cases(C& comm) {
    outcome o;
    torch_ddp_construction_case(comm, o, "torch::ddp");
    torch_ddp_construction_case<policy::gradients_in_buckets>(comm, o,
                                                              "torch::ddp, gradients in buckets");
    UNISON_CHECK_CASE(comm, "torch::ddp: a failed construction leaves the module", o);
}

} // namespace unison::test
