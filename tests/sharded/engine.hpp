#pragma once

// What the fsdp engine adds to the parts, each checked against values computed here:
//   - prefetching follows the order units ran in the first step, not registration;
//   - a unit used twice in one forward gets two backward scopes, accumulates both
//     gradients and is reduced once, after the second;
//   - a unit that takes no part in a step's backward is reduced as zero on every
//     rank (its parameters move only by what the optimizer does with a zero
//     gradient);
//   - copy_full hands back the full values at every strategy;
//   - a unit's forward recomputed inside its backward sees the values forward saw,
//     is not a forward use (the unit is still reduced when its backward ends) and
//     leaves the unit gathered for that backward; training with recomputation equals
//     training that keeps what forward read, bit for bit.
// The engines live in the fixture's memory space (tests/support/memory_space.hpp):
// the "backward" below loads a gradient, adds to it and stores it back, as a
// framework's backward on that memory would.

#include "../support/skewed_completion.hpp"
#include "accounting.hpp"
#include "checkpoint.hpp"

#include <unison/comm/counting_communicator.hpp>
#include <unison/sharded.hpp>

#include <doctest/doctest.h>

#include <string>
#include <vector>

namespace unison::test {

template <class Strategy, class Space, communicator C>
void engine_semantics_case(C& comm, const std::string& name) {
    using engine_type = fsdp<C, Strategy, optim::sgd>;
    const int n = comm.size();
    const std::vector<std::size_t> sizes = {13, 40, 7};
    std::vector<std::vector<float>> init(sizes.size());
    for (std::size_t k = 0; k < sizes.size(); ++k) {
        init[k].resize(sizes[k]);
        for (std::size_t i = 0; i < sizes[k]; ++i) {
            init[k][i] = static_cast<float>(synthetic(5, 0, k * 100 + i));
        }
    }
    engine_type engine(comm, {.optimizer = {.lr = 0.5}, .prefetch = 1});
    Space::attach(comm, engine);
    std::vector<unit_handle> u;
    for (std::size_t k = 0; k < sizes.size(); ++k) {
        u.push_back(engine.add_unit({{"p" + std::to_string(k), init[k]}}));
    }
    engine.start();
    outcome o;
    // Each step: forward runs unit 2, then unit 0 twice, then unit 1; backward runs
    // unit 1, unit 0 twice; unit 2 takes no part in backward. Rank r adds
    // (r + 1) * (use + 1) to every element of unit 0's gradient in each use's
    // backward, and r + 1 to unit 1's.
    auto step = [&](bool check_prefetch) {
        {
            auto s = engine.forward(u[2]);
            if (check_prefetch && engine_type::strategy::params_sharded) {
                // The first step ran 2, 0, 0, 1: entering 2 prefetches 0, not 1 or 3.
                o.expect(engine.parameters().gathered(0) && !engine.parameters().gathered(1),
                         "entering unit 2 did not prefetch unit 0, the unit that followed it "
                         "in the first step");
            }
        }
        for (int use = 0; use < 2; ++use) {
            auto s = engine.forward(u[0]);
        }
        { auto s = engine.forward(u[1]); }
        {
            auto s = engine.backward(u[1]);
            add_to_view<Space>(comm, engine.gradient(u[1][0]),
                               [&](std::size_t) { return comm.rank() + 1; });
        }
        for (int use = 1; use >= 0; --use) {
            auto s = engine.backward(u[0]);
            add_to_view<Space>(comm, engine.gradient(u[0][0]),
                               [&](std::size_t) { return (comm.rank() + 1) * (use + 1); });
        }
        engine.step();
    };
    step(false);
    o.expect(engine.forward_order() == std::vector<std::size_t>{2, 0, 0, 1},
             "the observed forward order is not 2, 0, 0, 1");
    step(true);
    // Two steps of SGD (lr 0.5) on the mean over ranks of the gradients:
    // unit 0: 3 (r + 1), mean 3 (n + 1) / 2; unit 1: r + 1, mean (n + 1) / 2; unit 2: 0.
    const double mean1 = (n + 1) / 2.0;
    const double expected_shift[] = {2 * 0.5 * 3 * mean1, 2 * 0.5 * mean1, 0.0};
    for (std::size_t k = 0; k < sizes.size(); ++k) {
        std::vector<double> got(sizes[k]);
        engine.copy_full(u[k][0], got);
        for (std::size_t i = 0; i < sizes[k]; ++i) {
            const double want = init[k][i] - expected_shift[k];
            o.expect(std::abs(got[i] - want) <= 1e-5, [&] {
                return "unit " + std::to_string(k) + " element " + std::to_string(i) + ": " +
                       std::to_string(got[i]) + ", expected " + std::to_string(want);
            });
        }
    }
    if constexpr (engine_type::strategy::params_sharded) {
        o.expect(engine.memory().gathered_now == 0, "copy_full left a unit gathered");
    }
    UNISON_CHECK_CASE(comm, name, o);
}

/// Two engines train the same three units for three steps; the "activations" a
/// unit's backward needs are the values its forward read. One engine keeps them from
/// forward; the other drops them and recomputes the unit's forward inside its
/// backward. Their parameters must be equal bit for bit; the recomputing one must
/// start each unit's gradient reduction when the unit's backward ends.
template <class Strategy, class Space, communicator C>
void recompute_case(C& comm, const std::string& name) {
    using counted_type = counting_communicator<C>;
    using engine_type = fsdp<counted_type, Strategy, optim::adamw>;
    const std::vector<std::size_t> sizes = {13, 40, 7};
    std::vector<std::vector<float>> init(sizes.size());
    for (std::size_t k = 0; k < sizes.size(); ++k) {
        init[k].resize(sizes[k]);
        for (std::size_t i = 0; i < sizes[k]; ++i) {
            init[k][i] = static_cast<float>(synthetic(6, 0, k * 100 + i));
        }
    }
    counted_type kept_comm(comm), recomputing_comm(comm);
    const int group = engine_type::strategy::hybrid ? hybrid_group(comm.size()) : 0;
    engine_type kept(kept_comm, {.prefetch = 1, .shard_group_size = group});
    engine_type recomputing(recomputing_comm, {.prefetch = 1, .shard_group_size = group});
    Space::attach(comm, kept);
    Space::attach(comm, recomputing);
    std::vector<unit_handle> ku, ru;
    for (std::size_t k = 0; k < sizes.size(); ++k) {
        ku.push_back(kept.add_unit({{"p" + std::to_string(k), init[k]}}));
        ru.push_back(recomputing.add_unit({{"p" + std::to_string(k), init[k]}}));
    }
    kept.start();
    recomputing.start();
    const auto r = static_cast<float>(comm.rank() + 1);
    auto read = [&](engine_type& e, const unit_handle& u) {
        return load_view<Space>(comm, e.value(u[0]));
    };
    auto accumulate = [&](engine_type& e, const unit_handle& u, const std::vector<float>& seen) {
        add_to_view<Space>(comm, e.gradient(u[0]), [&](std::size_t i) {
            return seen[i] * seen[i] * r + static_cast<float>(u.index());
        });
    };
    outcome o;
    for (int step = 0; step < 3; ++step) {
        std::vector<std::vector<float>> activations;
        for (const unit_handle& u : ku) {
            auto s = kept.forward(u);
            activations.push_back(read(kept, u));
        }
        for (std::size_t k = sizes.size(); k-- > 0;) {
            auto s = kept.backward(ku[k]);
            accumulate(kept, ku[k], activations[k]);
        }
        kept.step();

        for (const unit_handle& u : ru) {
            auto s = recomputing.forward(u); // what it reads is dropped
            (void)read(recomputing, u);
        }
        const std::uint64_t reductions_before =
            recomputing_comm.of(operation::reduce_scatter).calls +
            recomputing_comm.of(operation::all_reduce).calls;
        for (std::size_t k = sizes.size(); k-- > 0;) {
            std::vector<float> seen;
            {
                auto s = recomputing.recompute(ru[k]);
                seen = read(recomputing, ru[k]);
            }
            o.expect(recomputing.parameters().gathered(k),
                     "unit " + std::to_string(k) + " was released after its recomputation");
            auto s = recomputing.backward(ru[k]);
            accumulate(recomputing, ru[k], seen);
        }
        const std::uint64_t reductions = recomputing_comm.of(operation::reduce_scatter).calls +
                                         recomputing_comm.of(operation::all_reduce).calls -
                                         reductions_before;
        o.expect(reductions >= sizes.size(),
                 "step " + std::to_string(step) + ": " + std::to_string(reductions) +
                     " unit reductions started in backward; a recomputation counted as a use?");
        recomputing.step();
    }
    for (std::size_t k = 0; k < sizes.size(); ++k) {
        std::vector<float> a(sizes[k]), b(sizes[k]);
        kept.copy_full(ku[k][0], a);
        recomputing.copy_full(ru[k][0], b);
        o.expect(a == b, "unit " + std::to_string(k) +
                             ": recomputation trained other values than kept activations");
        o.expect(a != init[k], "unit " + std::to_string(k) + " did not train");
    }
    o.expect(recomputing.memory().gathered_now == 0, "a recomputed unit was left gathered");
    UNISON_CHECK_CASE(comm, name, o);
}

/// A parameter without a gradient in some steps (`no_gradient`), against engines
/// that hold each parameter alone: without clipping, AdamW updates every parameter
/// by itself, so the model's "p1", which gets a gradient one step in three, must
/// equal bit for bit a lone "p1" whose engine steps only in those steps (with
/// set_grads_to_none) or in every step from its first use on, with zero gradients
/// (without); "p0", with a gradient in every step, a lone "p0" stepped every time.
/// Halfway the model is saved and resumed in an engine of strategy `Resumed`: each
/// parameter's own step count (AdamW's bias corrections) must come back with it.
/// The gradients are multiples of 1/64 below 1, whose sums are exact in any order,
/// so that hybrid's two-level reduction gives the lone engines' averages bit for bit.
template <class Strategy, class Resumed, class Space, communicator C>
void no_gradient_case(C& comm, bool set_to_none, const std::string& name) {
    using engine_type = fsdp<C, Strategy, optim::adamw>;
    using resumed_type = fsdp<C, Resumed, optim::adamw>;
    using lone_type = fsdp<C, policy::shard::full, optim::adamw>;
    CAPTURE(name);
    const std::vector<std::size_t> sizes = {13, 40};
    std::vector<std::vector<float>> init(sizes.size());
    for (std::size_t k = 0; k < sizes.size(); ++k) {
        init[k].resize(sizes[k]);
        for (std::size_t i = 0; i < sizes[k]; ++i) {
            init[k][i] = static_cast<float>(synthetic(9, 0, k * 100 + i));
        }
    }
    const auto options = [&](bool hybrid) {
        typename engine_type::options_type o{.optimizer = {.lr = 1e-2, .weight_decay = 0.1}};
        o.shard_group_size = hybrid ? hybrid_group(comm.size()) : 0;
        o.set_grads_to_none = set_to_none;
        return o;
    };
    auto add = [&](auto& e) {
        Space::attach(comm, e);
        std::vector<unit_handle> u;
        for (std::size_t k = 0; k < sizes.size(); ++k) {
            u.push_back(e.add_unit({{"p" + std::to_string(k), init[k]}}));
        }
        e.start();
        return u;
    };
    auto engine = std::make_unique<engine_type>(comm, options(engine_type::strategy::hybrid));
    std::unique_ptr<resumed_type> resumed;
    std::vector<unit_handle> units = add(*engine);
    std::vector<std::unique_ptr<lone_type>> lone;
    std::vector<unit_handle> lone_units;
    for (std::size_t k = 0; k < sizes.size(); ++k) {
        lone.push_back(std::make_unique<lone_type>(comm, options(false)));
        Space::attach(comm, *lone[k]);
        lone_units.push_back(lone[k]->add_unit({{"p" + std::to_string(k), init[k]}}));
        lone[k]->start();
    }
    auto write = [&](auto& e, const unit_handle& u, std::size_t k, int step) {
        auto scope = e.backward(u);
        const view<float> g = e.gradient(u[0]);
        std::vector<float> values(g.size);
        for (std::size_t i = 0; i < g.size; ++i) {
            const double x =
                synthetic(20 + static_cast<std::uint64_t>(step), comm.rank(), k * 100 + i);
            values[i] = static_cast<float>(std::round(x * 64) / 64);
        }
        store_view<Space>(comm, g, values);
    };
    auto full = [](auto& e, const unit_handle& u, std::size_t n) {
        std::vector<float> v(n);
        e.copy_full(u[0], v);
        return v;
    };
    const shared_temp_dir<C, Space> dir(comm, "no-gradient");
    outcome o;
    bool p1_started = false;
    for (int step = 0; step < 10; ++step) {
        const bool used = step % 3 == 1;
        if (step == 5) {
            save_checkpoint(dir.path(), *engine);
            resumed = std::make_unique<resumed_type>(comm, options(resumed_type::strategy::hybrid));
            units = add(*resumed); // the handles of the engine that trains on
            load_checkpoint(dir.path(), *resumed);
            engine.reset();
        }
        auto model_step = [&](auto& e) {
            { auto s = e.forward(units[0]); }
            if (used) { // forward reaches p1's unit only in these steps
                auto s = e.forward(units[1]);
            }
            write(e, units[0], 0, step);
            if (used) {
                write(e, units[1], 1, step);
            } else {
                e.no_gradient(units[1][0]);
            }
            (void)e.step();
        };
        if (resumed) {
            model_step(*resumed);
        } else {
            model_step(*engine);
        }
        write(*lone[0], lone_units[0], 0, step);
        (void)lone[0]->step();
        if (used) {
            write(*lone[1], lone_units[1], 1, step);
            p1_started = true;
        }
        if (used || (!set_to_none && p1_started)) {
            (void)lone[1]->step(); // not used: a zero gradient
        }
        for (std::size_t k = 0; k < sizes.size(); ++k) {
            const std::vector<float> got =
                resumed ? full(*resumed, units[k], sizes[k]) : full(*engine, units[k], sizes[k]);
            const std::uint64_t steps =
                resumed ? resumed->steps_of(units[k][0]) : engine->steps_of(units[k][0]);
            o.expect(got == full(*lone[k], lone_units[k], sizes[k]),
                     "step " + std::to_string(step) + ": p" + std::to_string(k) +
                         " differs from the lone parameter's training");
            o.expect(steps == lone[k]->steps(), "step " + std::to_string(step) + ": p" +
                                                    std::to_string(k) + " took " +
                                                    std::to_string(steps) + " steps, the lone " +
                                                    std::to_string(lone[k]->steps()));
        }
    }
    o.expect(lone[1]->steps() < lone[0]->steps(), "p1 sat no step out");
    UNISON_CHECK_CASE(comm, name, o);
}

template <class Space, communicator C>
void engine_semantics_cases(C& comm) {
    using namespace unison::policy;
    engine_semantics_case<zero<0>, Space>(comm, "engine semantics, zero<0>");
    engine_semantics_case<zero<1>, Space>(comm, "engine semantics, zero<1>");
    engine_semantics_case<zero<2>, Space>(comm, "engine semantics, zero<2>");
    engine_semantics_case<shard::full, Space>(comm, "engine semantics, shard::full");
    engine_semantics_case<shard::grad_op, Space>(comm, "engine semantics, shard::grad_op");
    recompute_case<zero<2>, Space>(comm, "recomputation, zero<2>");
    recompute_case<shard::full, Space>(comm, "recomputation, shard::full");
    recompute_case<shard::grad_op, Space>(comm, "recomputation, shard::grad_op");
    recompute_case<shard::hybrid, Space>(comm, "recomputation, shard::hybrid");
    // Gradient reductions that finish earlier on some ranks than on others (every
    // time here, now and then in real runs): a hybrid engine must still issue its
    // shard-group and replica-group calls in one order on every rank.
    skewed_completion<C> skewed(comm);
    recompute_case<shard::hybrid, Space>(skewed, "recomputation, shard::hybrid, reductions done "
                                                 "at different times on different ranks");
    recompute_case<shard::full, Space>(skewed, "recomputation, shard::full, reductions done at "
                                               "different times on different ranks");
    no_gradient_case<shard::full, zero<1>, Space>(comm, true,
                                                  "no gradient, set to none, full to zero<1>");
    no_gradient_case<zero<2>, shard::hybrid, Space>(comm, true,
                                                    "no gradient, set to none, zero<2> to hybrid");
    no_gradient_case<zero<1>, shard::full, Space>(comm, false,
                                                  "no gradient, zeroed in place, zero<1> to full");
}

} // namespace unison::test
