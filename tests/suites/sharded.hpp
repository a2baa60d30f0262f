#pragma once

// The sharded (FSDP / ZeRO) suite, written once over a backend fixture
// (tests/support/backends.hpp, tests/cuda/backends.cuh) and registered for a
// backend by UNISON_SHARDED_SUITE(fixture) in its test file. The accounting cases
// (memory and traffic, mixed precision against a double AdamW, clipping, loss
// scaling), training, accumulation, checkpoints and the fsdp engine's semantics
// run on the fixture's memory space, the GPU on the device fixtures: there the
// engine is on the GPU and the examples' host MLP loads its values and gradients
// from it around each layer (sharded_binding), and the DDP it is compared with
// works on copies in the same memory (staged_ddp_binding). Misuse and
// the skipped step run there too, with the engines on the GPU, so the argument and
// order checks are run against the device paths as well; the skipped step needs a
// communicator that compares every call across ranks, which NCCL does only with
// UNISON_DEBUG=1 (without it the case says so and returns).

#include "../sharded/accounting.hpp"
#include "../sharded/accumulation.hpp"
#include "../sharded/checkpoint.hpp"
#include "../sharded/engine.hpp"
#include "../sharded/misuse.hpp"
#include "../sharded/training.hpp"
#include "../support/backends.hpp"
#include "../support/skipped_step.hpp"

#include <doctest/doctest.h>

TEST_CASE_TEMPLATE_DEFINE("sharded: ZeRO and FSDP training equal DDP and single-process training",
                          Backend, sharded_training) {
    Backend::run(
        [](auto& comm) { unison::test::sharded_training_cases<typename Backend::space>(comm); });
}
TEST_CASE_TEMPLATE_DEFINE("sharded: gradient accumulation in every mode equals one big batch",
                          Backend, sharded_accumulation) {
    Backend::run(
        [](auto& comm) { unison::test::accumulation_cases<typename Backend::space>(comm); });
}
TEST_CASE_TEMPLATE_DEFINE("sharded: memory and traffic formulas, mixed precision, loss scaling",
                          Backend, sharded_accounting) {
    Backend::run(
        [](auto& comm) { unison::test::sharded_accounting_cases<typename Backend::space>(comm); });
}
TEST_CASE_TEMPLATE_DEFINE("sharded: checkpoints restage at the same world size, reject bad files",
                          Backend, sharded_checkpoints) {
    Backend::run([](auto& comm) {
        unison::test::checkpoint_restage_cases<typename Backend::space>(comm);
        unison::test::checkpoint_rejection_cases<typename Backend::space>(comm);
    });
}
TEST_CASE_TEMPLATE_DEFINE("sharded: the fsdp engine's prefetch order, unit reuse, unused units",
                          Backend, sharded_engine) {
    Backend::run(
        [](auto& comm) { unison::test::engine_semantics_cases<typename Backend::space>(comm); });
}
TEST_CASE_TEMPLATE_DEFINE("sharded: misuse is reported", Backend, sharded_misuse) {
    Backend::run([](auto& comm) {
        unison::test::sharded_misuse_cases<typename Backend::space>(comm);
        unison::test::fsdp_misuse_cases<typename Backend::space>(comm);
    });
}
TEST_CASE_TEMPLATE_DEFINE("sharded: a rank that skips a step is caught at the step's first call",
                          Backend, sharded_skipped_step) {
    Backend::run([](auto& comm) {
        using space = typename Backend::space;
        unison::test::fsdp_skipped_step_is_caught<unison::policy::shard::full, space>(comm);
        unison::test::fsdp_skipped_step_is_caught<unison::policy::shard::hybrid, space>(comm);
    });
}

// The suite in five parts, so that a backend can spread it over five files
// (tests/<backend>/sharded_*.cpp): one file instantiating all of it takes minutes on
// one core, the last thing a parallel build waits for.

/// Registers the training cases for backend fixture `Backend`.
#define UNISON_SHARDED_TRAINING_SUITE(Backend) TEST_CASE_TEMPLATE_INVOKE(sharded_training, Backend)

/// Registers the gradient-accumulation cases for backend fixture `Backend`.
#define UNISON_SHARDED_ACCUMULATION_SUITE(Backend)                                                 \
    TEST_CASE_TEMPLATE_INVOKE(sharded_accumulation, Backend)

/// Registers the accounting and checkpoint cases for backend fixture `Backend`.
#define UNISON_SHARDED_STATE_SUITE(Backend)                                                        \
    TEST_CASE_TEMPLATE_INVOKE(sharded_accounting, Backend);                                        \
    TEST_CASE_TEMPLATE_INVOKE(sharded_checkpoints, Backend)

/// Registers the fsdp engine's semantics cases for backend fixture `Backend`.
#define UNISON_SHARDED_ENGINE_SUITE(Backend) TEST_CASE_TEMPLATE_INVOKE(sharded_engine, Backend)

/// Registers the misuse and skipped-step cases for backend fixture `Backend`.
#define UNISON_SHARDED_MISUSE_SUITE(Backend)                                                       \
    TEST_CASE_TEMPLATE_INVOKE(sharded_misuse, Backend);                                            \
    TEST_CASE_TEMPLATE_INVOKE(sharded_skipped_step, Backend)

/// Registers every test case of the sharded suite for backend fixture `Backend`.
#define UNISON_SHARDED_SUITE(Backend)                                                              \
    UNISON_SHARDED_TRAINING_SUITE(Backend);                                                        \
    UNISON_SHARDED_ACCUMULATION_SUITE(Backend);                                                    \
    UNISON_SHARDED_STATE_SUITE(Backend);                                                           \
    UNISON_SHARDED_ENGINE_SUITE(Backend);                                                          \
    UNISON_SHARDED_MISUSE_SUITE(Backend)
