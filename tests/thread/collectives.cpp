// The collective cases of tests/collectives on the thread backend, at 1 to 4 ranks.

#include "../collectives/cases.hpp"

#include "worlds.hpp"

using unison::test::on_worlds;

TEST_CASE("thread: all_reduce") {
    on_worlds([](auto& comm) { unison::test::all_reduce_cases(comm); });
}
TEST_CASE("thread: reduce_scatter") {
    on_worlds([](auto& comm) { unison::test::reduce_scatter_cases(comm); });
}
TEST_CASE("thread: all_gather and all_gatherv") {
    on_worlds([](auto& comm) { unison::test::all_gather_cases(comm); });
}
TEST_CASE("thread: broadcast") {
    on_worlds([](auto& comm) { unison::test::broadcast_cases(comm); });
}
TEST_CASE("thread: reduce") {
    on_worlds([](auto& comm) { unison::test::reduce_cases(comm); });
}
TEST_CASE("thread: all_to_all") {
    on_worlds([](auto& comm) { unison::test::all_to_all_cases(comm); });
}
TEST_CASE("thread: send and recv") {
    on_worlds([](auto& comm) { unison::test::send_recv_cases(comm); });
}
TEST_CASE("thread: non-blocking collectives and wait_all") {
    on_worlds([](auto& comm) { unison::test::async_cases(comm); });
}
TEST_CASE("thread: split") {
    on_worlds([](auto& comm) { unison::test::split_cases(comm); });
}
TEST_CASE("thread: invalid arguments throw and leave the communicator usable") {
    on_worlds([](auto& comm) { unison::test::argument_error_cases(comm); });
}
