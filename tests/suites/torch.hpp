#pragma once

// The LibTorch suite: unison::torch::ddp and unison::torch::fsdp of torch::nn modules against
// single-process LibTorch, written once over a backend fixture
// (tests/support/backends.hpp) and registered for a backend by
// UNISON_TORCH_SUITE(fixture) in its test file (tests/torch/).

#include "../support/backends.hpp"
#include "../torch/construction_cases.hpp"
#include "../torch/ddp_cases.hpp"
#include "../torch/device_cases.hpp"
#include "../torch/fsdp_cases.hpp"

#include <doctest/doctest.h>

/// One LibTorch thread per rank: the ranks are the parallelism.
#define UNISON_TORCH_ONE_THREAD() at::set_num_threads(1)

TEST_CASE_TEMPLATE_DEFINE("torch ddp: modules train as one process", Backend, torch_ddp_training) {
    UNISON_TORCH_ONE_THREAD();
    Backend::run([](auto& comm) { unison::test::torch_ddp_training_cases(comm); });
}
TEST_CASE_TEMPLATE_DEFINE("torch ddp: accumulation with no_sync and accumulate_steps", Backend,
                          torch_ddp_accumulation) {
    UNISON_TORCH_ONE_THREAD();
    Backend::run([](auto& comm) { unison::test::torch_ddp_accumulation_cases(comm); });
}
TEST_CASE_TEMPLATE_DEFINE("torch ddp: buffers", Backend, torch_ddp_buffers) {
    UNISON_TORCH_ONE_THREAD();
    Backend::run([](auto& comm) {
        unison::test::torch_ddp_buffer_case(comm, true);
        unison::test::torch_ddp_buffer_case(comm, false);
    });
}
TEST_CASE_TEMPLATE_DEFINE("torch ddp: misuse is reported", Backend, torch_ddp_misuse) {
    UNISON_TORCH_ONE_THREAD();
    Backend::run([](auto& comm) { unison::test::torch_ddp_error_cases(comm); });
}

TEST_CASE_TEMPLATE_DEFINE("torch: one engine per module", Backend, torch_second_engine) {
    UNISON_TORCH_ONE_THREAD();
    Backend::run([](auto& comm) { unison::test::torch_second_engine_cases(comm); });
}

TEST_CASE_TEMPLATE_DEFINE("torch fsdp: sharded modules train as one process", Backend,
                          torch_fsdp_training) {
    UNISON_TORCH_ONE_THREAD();
    Backend::run([](auto& comm) { unison::test::torch_fsdp_training_cases(comm); });
}
TEST_CASE_TEMPLATE_DEFINE("torch fsdp: micro-batches accumulated in every mode", Backend,
                          torch_fsdp_accumulation) {
    UNISON_TORCH_ONE_THREAD();
    Backend::run([](auto& comm) { unison::test::torch_fsdp_accumulation_cases(comm); });
}
TEST_CASE_TEMPLATE_DEFINE("torch fsdp: a unit used twice, an unused layer", Backend,
                          torch_fsdp_units) {
    UNISON_TORCH_ONE_THREAD();
    Backend::run([](auto& comm) { unison::test::torch_fsdp_unit_cases(comm); });
}
TEST_CASE_TEMPLATE_DEFINE("torch fsdp: misuse is reported", Backend, torch_fsdp_misuse) {
    UNISON_TORCH_ONE_THREAD();
    Backend::run([](auto& comm) { unison::test::torch_fsdp_error_cases(comm); });
}

TEST_CASE_TEMPLATE_DEFINE("torch: a failed construction leaves the module as it was", Backend,
                          torch_failed_construction) {
    UNISON_TORCH_ONE_THREAD();
    Backend::run([](auto& comm) {
        unison::test::torch_ddp_construction_cases(comm);
        unison::test::torch_fsdp_construction_cases(comm);
    });
}

TEST_CASE_TEMPLATE_DEFINE("torch: a module where the engine is not is refused", Backend,
                          torch_device_misuse) {
    UNISON_TORCH_ONE_THREAD();
    Backend::run([](auto& comm) { unison::test::torch_device_error_cases(comm); });
}

/// Registers every test case of the LibTorch suite for backend fixture `Backend`.
#define UNISON_TORCH_SUITE(Backend)                                                                \
    TEST_CASE_TEMPLATE_INVOKE(torch_ddp_training, Backend);                                        \
    TEST_CASE_TEMPLATE_INVOKE(torch_ddp_accumulation, Backend);                                    \
    TEST_CASE_TEMPLATE_INVOKE(torch_ddp_buffers, Backend);                                         \
    TEST_CASE_TEMPLATE_INVOKE(torch_ddp_misuse, Backend);                                          \
    TEST_CASE_TEMPLATE_INVOKE(torch_second_engine, Backend);                                       \
    TEST_CASE_TEMPLATE_INVOKE(torch_fsdp_training, Backend);                                       \
    TEST_CASE_TEMPLATE_INVOKE(torch_fsdp_accumulation, Backend);                                   \
    TEST_CASE_TEMPLATE_INVOKE(torch_fsdp_units, Backend);                                          \
    TEST_CASE_TEMPLATE_INVOKE(torch_fsdp_misuse, Backend);                                         \
    TEST_CASE_TEMPLATE_INVOKE(torch_failed_construction, Backend);                                 \
    TEST_CASE_TEMPLATE_INVOKE(torch_device_misuse, Backend)
