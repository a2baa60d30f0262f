#pragma once

// A rank that skips one collective in a loop, on any backend that matches calls
// on every call (thread, MPI): with the loop's index stamped on each call (by a
// stepped_communicator, or the call's own call_stamp), every rank must fail at its
// first call after the skip, with a mismatch_error on the "step" field and nothing
// moved, where unstamped calls would pair each rank's call with the others' next
// one and mix data. And calls whose tags differ are an error on "tag".

#include <unison/comm.hpp>

#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

namespace unison::test {

enum class stamped_by { stepped_communicator, call_stamp };

template <communicator C>
void skipped_call_is_caught_at_once(C& comm, stamped_by how = stamped_by::stepped_communicator) {
    if (comm.size() < 2) {
        return;
    }
    const int skipper = comm.size() - 1;
    constexpr std::uint64_t skipped = 5;
    // Small integers: every sum is exact, so results compare with ==.
    auto value = [](int rank, std::uint64_t step, std::size_t j) {
        return static_cast<double>((static_cast<std::uint64_t>(rank + 1) * 31 + step * 7 + j * 3) %
                                   97) -
               48.0;
    };
    stepped_communicator<C> steps(comm);
    std::vector<double> x(257);
    std::uint64_t failed_at = ~std::uint64_t{0};
    std::string what;
    std::size_t wrong = 0;
    for (std::uint64_t i = 0; i < 16; ++i) {
        if (comm.rank() == skipper && i == skipped) {
            continue;
        }
        steps.set_step(i);
        for (std::size_t j = 0; j < x.size(); ++j) {
            x[j] = value(comm.rank(), i, j);
        }
        const std::vector<double> before = x;
        try {
            if (how == stamped_by::stepped_communicator) {
                all_reduce(steps, x);
            } else {
                all_reduce(comm, x, reduce_op::sum, {.step = i});
            }
        } catch (const mismatch_error& e) {
            failed_at = i;
            what = e.what();
            CHECK(e.field() == "step");
            CHECK(x == before); // nothing moved
            break;
        }
        for (std::size_t j = 0; j < x.size(); ++j) {
            double want = 0;
            for (int r = 0; r < comm.size(); ++r) {
                want += value(r, i, j);
            }
            wrong += x[j] != want ? 1 : 0;
        }
    }
    CHECK(wrong == 0);
    // the others fail at the skipped step, the skipper at the one after
    CHECK(failed_at == (comm.rank() == skipper ? skipped + 1 : skipped));
    CHECK(what.find("step " + std::to_string(skipped)) != std::string::npos);
    CHECK(what.find("step " + std::to_string(skipped + 1)) != std::string::npos);
}

template <communicator C>
void tag_mismatch_is_caught(C& comm) {
    if (comm.size() < 2) {
        return;
    }
    const int odd = comm.size() - 1;
    std::vector<float> x(100, static_cast<float>(comm.rank() + 1));
    const std::vector<float> before = x;
    try {
        all_reduce(comm, x, reduce_op::sum, {.tag = comm.rank() == odd ? 8 : 7});
        FAIL("calls with different tags were paired");
    } catch (const mismatch_error& e) {
        CHECK(e.field() == "tag");
        CHECK(std::string(e.what()).find("tag 8") != std::string::npos);
        CHECK(x == before);
    }
    all_reduce(comm, x, reduce_op::sum, {.tag = 7}); // alike: the communicator still works
    CHECK(x[0] == static_cast<float>(comm.size() * (comm.size() + 1) / 2));
}

} // namespace unison::test
