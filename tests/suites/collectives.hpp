#pragma once

// The collective suite: one test case per collective, written once over a backend
// fixture (tests/support/backends.hpp, tests/cuda/backends.hpp, backends.cuh) and
// registered for a backend by UNISON_COLLECTIVE_SUITE(fixture) in its test file.
// The cases run on the fixture's memory space; the two host-memory-only ones
// (see send_recv_cases and argument_error_cases) are registered only for fixtures
// whose space is host memory.

#include "../collectives/cases.hpp"
#include "../support/backends.hpp"

#include <doctest/doctest.h>

TEST_CASE_TEMPLATE_DEFINE("all_reduce", Backend, collectives_all_reduce) {
    Backend::run([](auto& comm) { unison::test::all_reduce_cases<typename Backend::space>(comm); });
}
TEST_CASE_TEMPLATE_DEFINE("reduce_scatter", Backend, collectives_reduce_scatter) {
    Backend::run(
        [](auto& comm) { unison::test::reduce_scatter_cases<typename Backend::space>(comm); });
}
TEST_CASE_TEMPLATE_DEFINE("all_gather and all_gatherv", Backend, collectives_all_gather) {
    Backend::run([](auto& comm) { unison::test::all_gather_cases<typename Backend::space>(comm); });
}
TEST_CASE_TEMPLATE_DEFINE("broadcast", Backend, collectives_broadcast) {
    Backend::run([](auto& comm) { unison::test::broadcast_cases<typename Backend::space>(comm); });
}
TEST_CASE_TEMPLATE_DEFINE("reduce", Backend, collectives_reduce) {
    Backend::run([](auto& comm) { unison::test::reduce_cases<typename Backend::space>(comm); });
}
TEST_CASE_TEMPLATE_DEFINE("all_to_all", Backend, collectives_all_to_all) {
    Backend::run([](auto& comm) { unison::test::all_to_all_cases<typename Backend::space>(comm); });
}
TEST_CASE_TEMPLATE_DEFINE("non-blocking collectives and wait_all", Backend, collectives_async) {
    Backend::run([](auto& comm) { unison::test::async_cases<typename Backend::space>(comm); });
}
TEST_CASE_TEMPLATE_DEFINE("split", Backend, collectives_split) {
    Backend::run([](auto& comm) { unison::test::split_cases<typename Backend::space>(comm); });
}
// Host memory only (registered through if_host_memory).
TEST_CASE_TEMPLATE_DEFINE("send and recv", Backend, collectives_send_recv) {
    Backend::run([](auto& comm) { unison::test::send_recv_cases(comm); });
}
TEST_CASE_TEMPLATE_DEFINE("invalid arguments throw and leave the communicator usable", Backend,
                          collectives_argument_errors) {
    Backend::run([](auto& comm) { unison::test::argument_error_cases(comm); });
}

/// Registers every test case of the collective suite for backend fixture `Backend`.
#define UNISON_COLLECTIVE_SUITE(Backend)                                                           \
    TEST_CASE_TEMPLATE_INVOKE(collectives_all_reduce, Backend);                                    \
    TEST_CASE_TEMPLATE_INVOKE(collectives_reduce_scatter, Backend);                                \
    TEST_CASE_TEMPLATE_INVOKE(collectives_all_gather, Backend);                                    \
    TEST_CASE_TEMPLATE_INVOKE(collectives_broadcast, Backend);                                     \
    TEST_CASE_TEMPLATE_INVOKE(collectives_reduce, Backend);                                        \
    TEST_CASE_TEMPLATE_INVOKE(collectives_all_to_all, Backend);                                    \
    TEST_CASE_TEMPLATE_INVOKE(collectives_async, Backend);                                         \
    TEST_CASE_TEMPLATE_INVOKE(collectives_split, Backend);                                         \
    TEST_CASE_TEMPLATE_APPLY(collectives_send_recv, unison::test::if_host_memory<Backend>);        \
    TEST_CASE_TEMPLATE_APPLY(collectives_argument_errors, unison::test::if_host_memory<Backend>)
