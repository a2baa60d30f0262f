#pragma once

// The DDP suite: the bucketed reducer and ddp training, written once over a backend
// fixture (tests/support/backends.hpp, tests/cuda/backends.cuh) and registered for a
// backend by UNISON_DDP_SUITE(fixture) in its test file. Every case runs on the
// fixture's memory space (host memory, or the GPU of the NCCL and thread-on-GPU
// fixtures, where the reducer takes its device paths; the training cases' model
// computes on the host, and on the GPU ddp holds device copies of its parameters
// and gradients, staged to and from the model around each step). The misuse and
// skipped-step cases register their gradients in the space too, so the argument,
// layout and order checks are run against the device paths as well; the
// skipped-step case needs a communicator that compares every call across ranks,
// which NCCL does only with UNISON_DEBUG=1 (without it the case says so and
// returns).

#include "../ddp/cases.hpp"
#include "../ddp/training.hpp"
#include "../support/backends.hpp"
#include "../support/skipped_step.hpp"

#include <doctest/doctest.h>

TEST_CASE_TEMPLATE_DEFINE("ddp: every policy averages like the double reference", Backend,
                          ddp_policies) {
    Backend::run(
        [](auto& comm) { unison::test::reducer_policy_cases<typename Backend::space>(comm); });
}
TEST_CASE_TEMPLATE_DEFINE("ddp: gradient accumulation communicates once per window", Backend,
                          ddp_accumulation) {
    Backend::run(
        [](auto& comm) { unison::test::reducer_accumulation_case<typename Backend::space>(comm); });
}
TEST_CASE_TEMPLATE_DEFINE("ddp: unused parameters", Backend, ddp_unused) {
    Backend::run(
        [](auto& comm) { unison::test::reducer_unused_cases<typename Backend::space>(comm); });
}
TEST_CASE_TEMPLATE_DEFINE("ddp: a rebound gradient is reduced in its new memory", Backend,
                          ddp_rebind) {
    Backend::run(
        [](auto& comm) { unison::test::reducer_rebind_case<typename Backend::space>(comm); });
}
TEST_CASE_TEMPLATE_DEFINE("ddp: join with uneven inputs", Backend, ddp_join) {
    Backend::run(
        [](auto& comm) { unison::test::reducer_join_case<typename Backend::space>(comm); });
}
TEST_CASE_TEMPLATE_DEFINE("ddp: training equals single-process training", Backend, ddp_training) {
    Backend::run(
        [](auto& comm) { unison::test::ddp_training_cases<typename Backend::space>(comm); });
}
TEST_CASE_TEMPLATE_DEFINE("ddp: loss normalization with uneven counts", Backend,
                          ddp_loss_normalization) {
    Backend::run(
        [](auto& comm) { unison::test::loss_normalization_cases<typename Backend::space>(comm); });
}
TEST_CASE_TEMPLATE_DEFINE("ddp: misuse is reported", Backend, ddp_misuse) {
    Backend::run(
        [](auto& comm) { unison::test::reducer_error_cases<typename Backend::space>(comm); });
}
TEST_CASE_TEMPLATE_DEFINE("ddp: a rank that skips a step is caught at the step's first reduction",
                          Backend, ddp_skipped_step) {
    Backend::run([](auto& comm) {
        unison::test::ddp_skipped_step_is_caught<typename Backend::space>(comm);
    });
}

/// Registers every test case of the DDP suite for backend fixture `Backend`.
#define UNISON_DDP_SUITE(Backend)                                                                  \
    TEST_CASE_TEMPLATE_INVOKE(ddp_policies, Backend);                                              \
    TEST_CASE_TEMPLATE_INVOKE(ddp_accumulation, Backend);                                          \
    TEST_CASE_TEMPLATE_INVOKE(ddp_unused, Backend);                                                \
    TEST_CASE_TEMPLATE_INVOKE(ddp_rebind, Backend);                                                \
    TEST_CASE_TEMPLATE_INVOKE(ddp_join, Backend);                                                  \
    TEST_CASE_TEMPLATE_INVOKE(ddp_training, Backend);                                              \
    TEST_CASE_TEMPLATE_INVOKE(ddp_misuse, Backend);                                                \
    TEST_CASE_TEMPLATE_INVOKE(ddp_loss_normalization, Backend);                                    \
    TEST_CASE_TEMPLATE_INVOKE(ddp_skipped_step, Backend)
