// The NCCL backend on the GPUs of this machine: the collective suite
// (tests/suites/collectives.hpp) with one rank per visible GPU, each driven from its
// own thread (the `nccl` fixture of tests/cuda/backends.hpp), and what only NCCL
// rejects. main_nccl.cpp skips the whole binary, with a message, where no GPU is
// visible.

#include "../cuda/backends.hpp"
#include "../suites/collectives.hpp"

#include <unison/nccl.hpp>

#include <doctest/doctest.h>

#include <vector>

UNISON_COLLECTIVE_SUITE(unison::test::backend::nccl);

TEST_CASE("nccl: host memory is rejected with an error naming the device") {
    unison::test::backend::nccl::run([](unison::nccl_communicator& comm) {
        std::vector<float> host(4, 1.0f);
        CHECK_THROWS_WITH_AS(unison::all_reduce(comm, host),
                             doctest::Contains("the data is on host"), unison::argument_error);
    });
}

// NCCL 2.27 to 2.29.6 (NVIDIA/nccl#1950) leave the last `count % blocks` elements of
// a one-rank average unwritten out of place, and the suite's largest counts caught
// it on an H100 with NCCL 2.28.3. Over one rank an average must return the input
// exactly, at counts that leave such a remainder, for every reducing collective.
TEST_CASE("nccl: an average over one rank returns every element of the input") {
    using namespace unison;
    using space = test::device_space;
    test::backend::nccl::run([](nccl_communicator& world) {
        nccl_communicator one = world.split(world.rank(), 0);
        REQUIRE(one.size() == 1);
        std::uint64_t seed = 9000;
        for (dtype t : {dtype::f32, dtype::f64, dtype::bf16, dtype::f16}) {
            for (std::size_t count :
                 {std::size_t{4099}, std::size_t{65537}, std::size_t{70001}, std::size_t{786437}}) {
                ++seed;
                auto in = space::make(one, test::filled(t, count, reduce_op::avg, seed, 0));
                const test::host_buffer want = space::read(one, in);
                const std::size_t bytes = count * size_of(t);
                const auto check = [&](const char* what, const test::device_tensor& out) {
                    const test::host_buffer got = space::read(one, out);
                    std::size_t first_wrong = count;
                    for (std::size_t i = 0; i < bytes && first_wrong == count; ++i) {
                        if (got.bytes[i] != want.bytes[i]) {
                            first_wrong = i / size_of(t);
                        }
                    }
                    CHECK_MESSAGE(first_wrong == count, what << " " << to_string(t)
                                                             << " count=" << count << ": element "
                                                             << first_wrong << " differs");
                };
                auto ar = space::make(one, test::filled(t, count, reduce_op::avg, seed + 7, 0));
                all_reduce(one, in.view(), ar.view(), reduce_op::avg);
                check("all_reduce", ar);
                auto rd = space::make(one, test::filled(t, count, reduce_op::avg, seed + 8, 0));
                reduce(one, in.view(), rd.view(), 0, reduce_op::avg);
                check("reduce", rd);
                auto rs = space::make(one, test::filled(t, count, reduce_op::avg, seed + 9, 0));
                reduce_scatter(one, in.view(), rs.view(), reduce_op::avg);
                check("reduce_scatter", rs);
            }
        }
    });
}
