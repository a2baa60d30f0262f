#pragma once

// Gradient accumulation under sharding: each rank splits its share of every global
// batch into three micro-batches of unequal size, runs forward and backward on each
// through the fsdp engine and takes one optimizer step per window, in the three ways
// the engine offers (accumulate_steps with the gradients reduced into the shards
// every micro-batch, accumulate_steps with the full gradients kept and reduced
// once, and no_sync() for all micro-batches but the last). A single-process
// reference trains on the whole batches; after every step every parameter is
// compared with it. Between micro-batches the test checks that nothing was updated
// and that exactly the memory each mode promises is held: no full gradient where
// micro-batches reduce into the shards, every unit's full gradient where they are
// kept. The cases run over a memory space (tests/support/memory_space.hpp): on a
// device space the engine is on the GPU and the host model reaches its memory
// through sharded_binding (training.hpp); the memory checks read engine.memory(),
// which counts the same bytes wherever they are placed.

#include "training.hpp"

#include <unison/sharded.hpp>

#include <optional>
#include <string>
#include <vector>

namespace unison::test {

/// How a case runs the micro-batches of one step.
enum class accumulate_how { in_shard, unsharded, no_sync };

inline const char* to_string(accumulate_how h) {
    switch (h) {
    case accumulate_how::in_shard:
        return "accumulate_steps 3, in_shard";
    case accumulate_how::unsharded:
        return "accumulate_steps 3, unsharded";
    case accumulate_how::no_sync:
        return "no_sync for 2 of 3 micro-batches";
    }
    return "?";
}

template <class Space, class T, class... Policies, communicator C>
void accumulation_case(C& comm, accumulate_how how, double tol, const std::string& what) {
    using engine_type = fsdp<C, optim::adamw, Policies...>;
    using strategy = typename engine_type::strategy;
    const std::string name = what + ", " + to_string(how);
    constexpr int micro = 3;
    const auto n = static_cast<std::size_t>(comm.size());
    require_even_batches(n);
    const auto rank = static_cast<std::size_t>(comm.rank());
    const auto data = nn::make_classification<T>(global_batch * training_steps, mlp_widths.front(),
                                                 mlp_widths.back(), 9);

    nn::mlp<T> model(mlp_widths, 200); // start() checks that every rank adds the same
    nn::mlp<T> reference(mlp_widths, 200);
    engine_type engine(comm,
                       {.optimizer = adamw_hyper(),
                        .shard_group_size = hybrid_group(comm.size()),
                        .accumulate_steps = how == accumulate_how::no_sync ? 1 : micro,
                        .accumulate = how == accumulate_how::unsharded ? accumulation::unsharded
                                                                       : accumulation::in_shard});
    sharded_binding<T, engine_type, Space> binding(model, engine); // puts the engine in Space
    engine.start();
    reference_optimizer<T> ref_opt(optimizer_kind::adamw, reference.parameters(), false);

    // What a rank holds between micro-batches beyond its resident state: the full
    // gradient of every unit where the gradients are kept unreduced, nothing where
    // each micro-batch reduces into the shards (or the full gradients are resident).
    std::size_t full_grad_bytes = 0;
    for (std::size_t k = 0; k < engine.unit_count(); ++k) {
        full_grad_bytes += engine.parameters().padded_numel(k) * sizeof(T);
    }
    const bool keeps_full = strategy::grads_sharded && how != accumulate_how::in_shard;
    const std::size_t held = keeps_full ? full_grad_bytes : 0;

    auto full_values = [&] {
        std::vector<std::vector<T>> out;
        for (const unit_handle& u : binding.units()) {
            for (std::size_t j = 0; j < u.size(); ++j) {
                const std::size_t id = u[j].id();
                out.emplace_back(engine.parameters().numel(id));
                engine.copy_full(u[j], out.back());
            }
        }
        return out;
    };

    const std::size_t shard = global_batch / n;
    outcome o;
    for (int step = 0; step < training_steps && o.first.empty(); ++step) {
        const std::size_t base = static_cast<std::size_t>(step) * global_batch + rank * shard;
        const std::string at = "step " + std::to_string(step);
        const auto before = step == 1 ? full_values() : std::vector<std::vector<T>>{};
        for (int m = 0; m < micro; ++m) {
            const bool last = m + 1 == micro;
            // Unequal micro-batches (for 8 samples: 2, 3, 3); each loss is scaled by
            // the rank's whole share, so the window sums to the share's mean loss.
            const std::size_t b = shard * static_cast<std::size_t>(m) / micro;
            const std::size_t e = shard * static_cast<std::size_t>(m + 1) / micro;
            const auto mine = nn::slice(data, base + b, base + e);
            std::optional<typename engine_type::no_sync_scope> quiet;
            if (how == accumulate_how::no_sync && !last) {
                quiet.emplace(engine.no_sync());
            }
            o.expect(engine.reduces_in_backward() ==
                         (last || (how == accumulate_how::in_shard && strategy::grads_sharded)),
                     at + " micro-batch " + std::to_string(m) + ": reduces_in_backward() is " +
                         (engine.reduces_in_backward() ? "true" : "false"));
            const auto loss = nn::softmax_cross_entropy<T>(model.forward(mine.x), mine.labels,
                                                           T(1) / static_cast<T>(shard));
            model.backward(loss.dlogits);
            if (how == accumulate_how::no_sync) {
                if (!last) {
                    o.expect(engine.memory().gathered_now == held,
                             at + " micro-batch " + std::to_string(m) + " under no_sync holds " +
                                 std::to_string(engine.memory().gathered_now) +
                                 " gathered bytes; expected " + std::to_string(held));
                    continue;
                }
            } else if (!last) {
                const step_result r = engine.step();
                o.expect(r.accumulated && !r.skipped,
                         at + " micro-batch " + std::to_string(m) +
                             ": step() did not report an accumulating micro-batch");
                o.expect(engine.micro_batch() == m + 1,
                         at + ": micro_batch() is " + std::to_string(engine.micro_batch()) +
                             " after micro-batch " + std::to_string(m));
                o.expect(engine.memory().gathered_now == held,
                         at + " after micro-batch " + std::to_string(m) + " holds " +
                             std::to_string(engine.memory().gathered_now) +
                             " gathered bytes; expected " + std::to_string(held));
                if (step == 1) {
                    o.expect(full_values() == before,
                             at + ": an accumulating micro-batch changed the parameters");
                }
                continue;
            }
            const std::uint64_t steps_before = engine.steps();
            const step_result r = engine.step();
            o.expect(!r.accumulated && !r.skipped && engine.steps() == steps_before + 1,
                     at + ": the window's last step() did not update");
            o.expect(engine.micro_batch() == 0 && !engine.accumulating(),
                     at + ": the window did not close");
        }

        reference.zero_grad();
        const auto whole = nn::slice(data, static_cast<std::size_t>(step) * global_batch,
                                     static_cast<std::size_t>(step + 1) * global_batch);
        const auto ref_loss = nn::softmax_cross_entropy<T>(reference.forward(whole.x), whole.labels,
                                                           T(1) / static_cast<T>(global_batch));
        reference.backward(ref_loss.dlogits);
        ref_opt.step();

        const auto got = binding.snapshot();
        const auto ref_params = reference.parameters();
        for (std::size_t p = 0; p < got.size(); ++p) {
            const double err = relative_error<T>(got[p], ref_params[p]->value);
            o.expect(err <= tol, [&] {
                return at + " parameter " + ref_params[p]->name + " relative error " +
                       std::to_string(err) + " against single-process";
            });
        }
    }
    o.expect(engine.memory().gathered_now == 0, "gathered memory left after the steps: " +
                                                    std::to_string(engine.memory().gathered_now) +
                                                    " bytes");
    UNISON_CHECK_CASE(comm, name, o);
}

template <class Space = host_space, communicator C>
void accumulation_cases(C& comm) {
    using namespace unison::policy;
    using f64 = mixed_precision<dtype::f64>;
    // f32 parameters reduced in f64: the reduction lands in a staging shard first.
    using wide_reduce = mixed_precision<dtype::f32, dtype::f64>;
    for (const accumulate_how how :
         {accumulate_how::in_shard, accumulate_how::unsharded, accumulate_how::no_sync}) {
        accumulation_case<Space, float, zero<0>>(comm, how, 1e-6, "zero<0>");
        accumulation_case<Space, float, zero<1>>(comm, how, 1e-6, "zero<1>");
        accumulation_case<Space, float, zero<2>>(comm, how, 1e-6, "zero<2>");
        accumulation_case<Space, double, zero<3>, f64>(comm, how, 1e-13, "zero<3> f64");
        accumulation_case<Space, float, shard::full>(comm, how, 1e-6, "shard::full");
        accumulation_case<Space, float, shard::grad_op>(comm, how, 1e-6, "shard::grad_op");
        accumulation_case<Space, float, shard::hybrid>(comm, how, 1e-6, "shard::hybrid");
        accumulation_case<Space, float, shard::full, wide_reduce>(comm, how, 1e-6,
                                                                  "shard::full, f64 reduction");
    }
}

} // namespace unison::test
