#pragma once

// Misuse of sharded_parameters is reported with an error that names the parameter,
// unit or rank, before any collective is left half-issued.

#include "accounting.hpp"

namespace unison::test {

template <communicator C>
void sharded_misuse_cases(C& comm) {
    using namespace unison::policy;
    std::vector<float> ten(10, 0.5f);
    {
        sharded_parameters<C, zero<3>> sp(comm, {.max_live_units = 1});
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
        CHECK(sp.template parameter<float>(0).data[3] == 0.5f);
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
    if (comm.size() == 3) {
        CHECK_THROWS_WITH_AS((sharded_parameters<C, shard::hybrid>(comm, {.shard_group_size = 2})),
                             doctest::Contains("divides the 3 ranks; got 2"), argument_error);
    }
    if (comm.size() > 1) {
        // Another parameter size on the last rank: every rank learns who differs.
        sharded_parameters<C, zero<2>> sp(comm);
        sp.add_unit({{"w", comm.rank() + 1 == comm.size() ? std::size_t{11} : std::size_t{10}}});
        CHECK_THROWS_WITH_AS(sp.start(), doctest::Contains("other names or sizes"), mismatch_error);
    }
    if (comm.size() > 1) {
        // Other initial values on rank 1.
        sharded_parameters<C, zero<3>> sp(comm);
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
/// (which would otherwise mix their data silently) are errors naming the unit.
template <communicator C>
void fsdp_misuse_cases(C& comm) {
    using namespace unison::policy;
    std::vector<float> a(10, 0.5f), b(10, 0.25f);
    {
        fsdp<C, shard::full> engine(comm, {.prefetch = 0});
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
                             doctest::Contains("unit 0 is not inside its forward"), argument_error);
        {
            auto scope = engine.forward(u0);
            CHECK(engine.value(u0[0]).data[9] == 0.5f);
            CHECK_THROWS_WITH_AS(
                engine.before_forward(u0),
                doctest::Contains("unit 0 entered again before leaving its forward"),
                argument_error);
            CHECK_THROWS_WITH_AS(engine.step(),
                                 doctest::Contains("unit 0 is still inside its forward"),
                                 argument_error);
            CHECK_THROWS_WITH_AS((void)engine.gradient(u0[0]),
                                 doctest::Contains("outside its unit's backward"), argument_error);
        }
        CHECK_THROWS_WITH_AS((void)engine.value(u1[0]),
                             doctest::Contains("'b' read outside its unit's forward or backward"),
                             argument_error);
        CHECK_THROWS_AS((void)u1[1], std::out_of_range);
        fsdp<C> other(comm);
        const unit_handle w = other.add_unit({{"w", a}});
        CHECK_THROWS_WITH_AS(engine.before_forward(w),
                             doctest::Contains("does not belong to this engine"), argument_error);
        {
            auto scope = engine.backward(u1);
            engine.gradient(u1[0]).data[0] = 1.0f;
        }
        CHECK_THROWS_WITH_AS(engine.before_backward(u1),
                             doctest::Contains("unit 1 entered backward after its gradients were "
                                               "reduced in this step"),
                             argument_error);
        const step_result r = engine.step(); // unit 0 took no part: reduced as zero
        CHECK_FALSE(r.skipped);
        CHECK(engine.steps() == 1);
    }
    if (comm.size() > 1) {
        // Rank 1 runs the two units (of the same size) in the other order: where calls
        // are matched the first gather is an error naming the tag; elsewhere the
        // collectives complete with mixed data and step() refuses to apply it.
        fsdp<C, shard::full> engine(comm, {.prefetch = 0});
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
                engine.gradient((*u)[0]).data[0] = 1.0f;
            }
            engine.step();
        } catch (const mismatch_error& e) {
            what = e.what();
        }
        CHECK_MESSAGE((what.find("tag") != std::string::npos ||
                       what.find("other units than this rank") != std::string::npos),
                      "no mismatch_error naming the units: '" << what << "'");
    }
}

} // namespace unison::test
