#pragma once

// Misuse of sharded_parameters is reported with an error that names the parameter,
// unit or rank, before any collective is left half-issued. The engines live in the
// fixture's memory space (tests/support/memory_space.hpp): the values and gradients
// the cases write or read are stored to and loaded from it; initial values stay host
// vectors, which the engines copy in.

#include "accounting.hpp"

#include <filesystem>

namespace unison::test {

/// Sets element `i` of `v` (memory an engine hands out, in `Space`) to `x`, leaving
/// the others as they are.
template <class Space, communicator C, class T>
void set_in_view(C& comm, view<T> v, std::size_t i, T x) {
    std::vector<T> values = load_view<Space>(comm, v);
    values[i] = x;
    store_view<Space>(comm, v, values);
}

template <class Space, communicator C>
void sharded_misuse_cases(C& comm) {
    using namespace unison::policy;
    std::vector<float> ten(10, 0.5f);
    {
        sharded_parameters<C, zero<3>> sp(comm, {.max_live_units = 1});
        Space::attach(comm, sp);
        sp.add_unit({{"a", 10}});
        sp.add_unit({{"b", 7}, {"c", 3}});
        CHECK_THROWS_WITH_AS(sp.add_unit({{"a", 4}}), doctest::Contains("'a' used twice"),
                             argument_error);
        CHECK_THROWS_WITH_AS(sp.set_parameter(0, std::vector<float>(9)),
                             doctest::Contains("'a' has 10 elements; got 9"), argument_error);
        CHECK_THROWS_WITH_AS(sp.gather(0), doctest::Contains("start()"), argument_error);
        sp.set_parameter(0, ten);
        sp.start();
        CHECK_THROWS_WITH_AS((void)sp.template parameter<float>(1),
                             doctest::Contains("'b' of unit 1 is not gathered: call gather(1)"),
                             argument_error);
        CHECK_THROWS_WITH_AS((void)sp.template parameter<double>(0),
                             doctest::Contains("'a' is float, requested as double"),
                             argument_error);
        sp.gather(0);
        CHECK_THROWS_WITH_AS(sp.gather(1), doctest::Contains("limit 1); release one of units 0"),
                             argument_error);
        CHECK_FALSE(sp.prefetch(1)); // at the limit: prefetching stops quietly
        CHECK(load_view<Space>(comm, sp.template parameter<float>(0))[3] == 0.5f);
        sp.release(0);
        CHECK(sp.memory().live_units_peak == 1);
        (void)sp.template gradient<float>(2);
        sp.reduce_gradients(1);
        CHECK_THROWS_WITH_AS(sp.reduce_gradients(1), doctest::Contains("unit 1 reduced twice"),
                             argument_error);
        CHECK_THROWS_WITH_AS((void)sp.template gradient<float>(1),
                             doctest::Contains("after unit 1 was reduced"), argument_error);
        (void)sp.template gradient<float>(0); // unit 0 gets a gradient but is never reduced
        CHECK_THROWS_WITH_AS(sp.wait_gradients(),
                             doctest::Contains("unit 0 got gradients but reduce_gradients(0)"),
                             argument_error);
        sp.zero_grad();
    }
    {
        // Full gradients resident (ZeRO-0): a second reduction before zero_grad would
        // mix an average into the next sum, so it is refused; the values stay.
        sharded_parameters<C, zero<0>> sp(comm);
        Space::attach(comm, sp);
        sp.add_unit({{"a", 10}});
        sp.start();
        set_in_view<Space>(comm, sp.template gradient<float>(0), 2, 3.0f);
        sp.reduce_gradients(0);
        sp.wait_gradients();
        add_to_view<Space>(comm, sp.template gradient<float>(0),
                           [](std::size_t i) { return i == 2 ? 1.0f : 0.0f; });
        CHECK_THROWS_WITH_AS(sp.reduce_gradients(0),
                             doctest::Contains("unit 0 reduced again before zero_grad(): its "
                                               "full gradients already hold the average"),
                             argument_error);
        CHECK(load_view<Space>(comm, sp.template gradient<float>(0))[2] == 4.0f);
        sp.zero_grad();
    }
    {
        // Gradients sharded (ZeRO-2): a second reduction before zero_grad adds to the
        // shard. Rank r writes r + 1, then 10 * (r + 1): the shard holds the sum of
        // both averages, 11 * (n + 1) / 2.
        const int n = comm.size();
        sharded_parameters<C, zero<2>> sp(comm);
        Space::attach(comm, sp);
        sp.add_unit({{"a", 12}});
        sp.start();
        for (const float f : {1.0f, 10.0f}) {
            const view<float> g = sp.template gradient<float>(0);
            std::vector<float> values(g.size);
            for (std::size_t i = 0; i < g.size; ++i) {
                values[i] = f * static_cast<float>(comm.rank() + 1) + static_cast<float>(i);
            }
            store_view<Space>(comm, g, values);
            sp.reduce_gradients(0);
            sp.wait_gradients();
        }
        const auto part = sp.partition_of(0);
        const auto bytes = loaded<Space>(sp, part.grad, part.range.size(), dtype::f32);
        const auto* got = reinterpret_cast<const float*>(bytes.data());
        bool ok = true;
        for (std::size_t i = part.range.begin; i < part.range.end && i < 12; ++i) {
            const double want = 11.0 * (n + 1) / 2.0 + 2.0 * static_cast<double>(i);
            ok = ok && std::abs(got[i - part.range.begin] - want) <= 1e-5 * want;
        }
        CHECK_MESSAGE(ok, "rank " << comm.rank()
                                  << ": two reductions were not summed in the "
                                     "shard");
        sp.zero_grad();
    }
    if (comm.size() == 3) {
        CHECK_THROWS_WITH_AS((sharded_parameters<C, shard::hybrid>(comm, {.shard_group_size = 2})),
                             doctest::Contains("divides the 3 ranks; got 2"), argument_error);
    }
    if (comm.size() > 1) {
        // Another parameter size on the last rank: every rank learns who differs.
        sharded_parameters<C, zero<2>> sp(comm);
        Space::attach(comm, sp);
        sp.add_unit({{"w", comm.rank() + 1 == comm.size() ? std::size_t{11} : std::size_t{10}}});
        const std::string want = "parameter 'w' (" +
                                 std::string(comm.rank() + 1 == comm.size() ? "11" : "10") +
                                 " elements, unit 0), is different on rank";
        CHECK_THROWS_WITH_AS(sp.start(), doctest::Contains(want.c_str()), mismatch_error);
    }
    if (comm.size() > 1) {
        // Other initial values on rank 1.
        sharded_parameters<C, zero<3>> sp(comm);
        Space::attach(comm, sp);
        sp.add_unit({{"w", 10}});
        std::vector<float> v(10, comm.rank() == 1 ? 0.25f : 0.5f);
        sp.set_parameter(0, v);
        CHECK_THROWS_WITH_AS(sp.start(),
                             doctest::Contains("'w' was set to other initial values on rank"),
                             mismatch_error);
    }
}

/// Misuse of the fsdp engine: scopes out of order, handles of another engine, reads
/// outside a unit's scope, and ranks that run different units of the same size
/// (which would otherwise mix their data silently) are errors naming the unit. The
/// initial values are host vectors wherever the engine is (it copies them in).
template <class Space, communicator C>
void fsdp_misuse_cases(C& comm) {
    using namespace unison::policy;
    std::vector<float> a(10, 0.5f), b(10, 0.25f);
    {
        fsdp<C, shard::full> engine(comm, {.prefetch = 0});
        Space::attach(comm, engine);
        const std::vector<int> counts(4, 1);
        CHECK_THROWS_WITH_AS(engine.add_unit({{"n", counts}}),
                             doctest::Contains("initial values of 'n' are int32 on host; "
                                               "floating-point host values expected"),
                             argument_error);
        const unit_handle u0 = engine.add_unit({{"a", a}}); // the refused unit left no trace
        const unit_handle u1 = engine.add_unit({{"b", b}});
        CHECK(u0.index() == 0);
        CHECK_THROWS_WITH_AS(engine.before_forward(u0), doctest::Contains("start()"),
                             argument_error);
        engine.start();
        CHECK_THROWS_WITH_AS(engine.after_forward(u0),
                             doctest::Contains("unit 0 ('a') is not inside its forward"),
                             argument_error);
        {
            auto scope = engine.forward(u0);
            CHECK(load_view<Space>(comm, engine.value(u0[0]))[9] == 0.5f);
            CHECK_THROWS_WITH_AS(
                engine.before_forward(u0),
                doctest::Contains("unit 0 ('a') entered again before leaving its forward"),
                argument_error);
            CHECK_THROWS_WITH_AS(engine.step(),
                                 doctest::Contains("unit 0 ('a') is still inside its forward"),
                                 argument_error);
            CHECK_THROWS_WITH_AS((void)engine.gradient(u0[0]),
                                 doctest::Contains("outside its unit's backward"), argument_error);
        }
        CHECK_THROWS_WITH_AS((void)engine.value(u1[0]),
                             doctest::Contains("'b' read outside its unit's forward or backward"),
                             argument_error);
        CHECK_THROWS_AS((void)u1[1], std::out_of_range);
        fsdp<C> other(comm);
        Space::attach(comm, other);
        const unit_handle w = other.add_unit({{"w", a}});
        CHECK_THROWS_WITH_AS(engine.before_forward(w),
                             doctest::Contains("does not belong to this engine"), argument_error);
        {
            auto scope = engine.backward(u1);
            set_in_view<Space>(comm, engine.gradient(u1[0]), 0, 1.0f);
        }
        CHECK_THROWS_WITH_AS(
            engine.before_backward(u1),
            doctest::Contains("unit 1 ('b') entered backward after its gradients were "
                              "reduced in this step"),
            argument_error);
        CHECK_THROWS_WITH_AS(engine.before_backward(u1),
                             doctest::Contains("set fsdp_options::accumulate_steps and call "
                                               "step() after each, or run all but the last "
                                               "inside no_sync()"),
                             argument_error);
        const step_result r = engine.step(); // unit 0 took no part: reduced as zero
        CHECK_FALSE(r.skipped);
        CHECK(engine.steps() == 1);
    }
    {
        // Accumulation misused: step() inside no_sync, a checkpoint inside a window,
        // a window of no micro-batches. Nothing is lost: the window goes on.
        CHECK_THROWS_WITH_AS((fsdp<C, shard::full>(comm, {.accumulate_steps = 0})),
                             doctest::Contains("accumulate_steps is 0"), argument_error);
        fsdp<C, shard::full, optim::sgd> engine(comm,
                                                {.optimizer = {.lr = 1.0}, .accumulate_steps = 2});
        Space::attach(comm, engine);
        const unit_handle u = engine.add_unit({{"a", a}});
        engine.start();
        auto micro_batch = [&](float g) {
            { auto scope = engine.forward(u); }
            auto scope = engine.backward(u);
            add_to_view<Space>(comm, engine.gradient(u[0]), [&](std::size_t) { return g; });
        };
        {
            auto quiet = engine.no_sync();
            micro_batch(1.0f);
            CHECK_THROWS_WITH_AS(engine.step(),
                                 doctest::Contains("called inside no_sync(): the gradients of "
                                                   "this window are not reduced yet"),
                                 argument_error);
            CHECK(engine.accumulating());
            CHECK_THROWS_WITH_AS(
                save_checkpoint(std::filesystem::temp_directory_path() / "unison-never-written",
                                engine),
                doctest::Contains("inside an accumulation window"), argument_error);
        }
        CHECK_FALSE(engine.accumulating());
        CHECK(engine.step().accumulated); // micro-batch 1 of 2 (it ran under no_sync)
        CHECK(engine.accumulating());
        CHECK_THROWS_WITH_AS(
            load_checkpoint(std::filesystem::temp_directory_path() / "unison-never-written",
                            engine),
            doctest::Contains("1 micro-batch(es) ended by step()"), argument_error);
        micro_batch(2.0f);
        const step_result r = engine.step();
        CHECK_FALSE(r.accumulated);
        CHECK(engine.steps() == 1);
        std::vector<float> after(10);
        engine.copy_full(u[0], after);
        CHECK(after[4] == doctest::Approx(0.5 - 3.0)); // SGD, lr 1, the window's gradient 1 + 2
    }
    if (comm.size() > 1) {
        // Another parameter name on the last rank: the engine's error names the
        // parameter as the user gave it, the engine and its call (not its parts').
        const bool odd = comm.rank() + 1 == comm.size();
        fsdp<C, shard::full> engine(comm);
        Space::attach(comm, engine);
        engine.add_unit({{"fc.weight", a}});
        engine.add_unit({{odd ? "head.weight" : "head.bias", b}});
        const std::string want = "fsdp start: entry #1, on this rank parameter '" +
                                 std::string(odd ? "head.weight" : "head.bias") +
                                 "' (10 elements, unit 1), is different on rank " +
                                 std::to_string(odd ? 0 : comm.size() - 1) +
                                 ": every rank must add the same units (add_unit)";
        CHECK_THROWS_WITH_AS(engine.start(), doctest::Contains(want.c_str()), mismatch_error);
    }
    if (comm.size() > 1) {
        // Another accumulate_steps on the last rank: every rank learns it at start().
        const bool odd = comm.rank() + 1 == comm.size();
        fsdp<C, shard::full> engine(comm, {.accumulate_steps = odd ? 3 : 2});
        Space::attach(comm, engine);
        engine.add_unit({{"a", a}});
        const std::string want =
            "rank " + std::to_string(comm.size() - 1) + " has accumulate_steps = 3, this rank 2";
        CHECK_THROWS_WITH_AS(
            engine.start(),
            doctest::Contains(odd ? "accumulate_steps = 2, this rank 3" : want.c_str()),
            mismatch_error);
    }
    if (comm.size() > 1) {
        // Rank 1 runs the two units (of the same size) in the other order: where calls
        // are matched the first gather is an error naming the tag; elsewhere the
        // collectives complete with mixed data and step() refuses to apply it.
        fsdp<C, shard::full> engine(comm, {.prefetch = 0});
        Space::attach(comm, engine);
        const unit_handle u0 = engine.add_unit({{"a", a}});
        const unit_handle u1 = engine.add_unit({{"b", b}});
        engine.start();
        const unit_handle& first = comm.rank() == 1 ? u1 : u0;
        const unit_handle& second = comm.rank() == 1 ? u0 : u1;
        std::string what;
        try {
            { auto scope = engine.forward(first); }
            { auto scope = engine.forward(second); }
            for (const unit_handle* u : {&second, &first}) {
                auto scope = engine.backward(*u);
                set_in_view<Space>(comm, engine.gradient((*u)[0]), 0, 1.0f);
            }
            engine.step();
        } catch (const mismatch_error& e) {
            what = e.what();
        }
        // Matched calls name the units by their parameters; without matching the
        // step's fingerprint check names the rank.
        const bool named = what.find("ranks work on different units: rank ") != std::string::npos &&
                           what.find("unit 0 ('a')") != std::string::npos &&
                           what.find("unit 1 ('b')") != std::string::npos;
        CHECK_MESSAGE((named || what.find("other units than this rank") != std::string::npos),
                      "no mismatch_error naming the units: '" << what << "'");
    }
}

} // namespace unison::test
