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
