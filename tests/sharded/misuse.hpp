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
        sharded_parameters<C, zero<3>, max_live_units<1>, prefetch<0>> sp(comm);
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
        CHECK_THROWS_WITH_AS((sharded_parameters<C, fsdp<shard::hybrid>>(comm, 2)),
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

} // namespace unison::test
