// The collective suite (tests/suites/collectives.hpp) on the thread backend, at 1 to 4 ranks,
// and its all-reduce cases at 6.

#include "../suites/collectives.hpp"

UNISON_COLLECTIVE_SUITE(unison::test::backend::thread);

// A world past four ranks that is not a power of two: the 8-bit types' sums wrap
// there (from 5 ranks for u8, 6 for i8), as the reference wraps them.
TEST_CASE("thread all_reduce at 6 ranks") {
    unison::thread_world(6).run([](unison::thread_communicator& comm) {
        unison::test::all_reduce_cases<unison::test::host_space>(comm);
    });
}
