// The DDP suite (tests/suites/ddp.hpp) on the thread backend, at 1 to 4 ranks.

#include "../suites/ddp.hpp"

UNISON_DDP_SUITE(unison::test::backend::thread);

// The training cases as the device fixtures run them (ddp on copies of the model's
// parameters and gradients, staged around each step), on host memory.
TEST_CASE("thread ddp: training through staged copies equals single-process training") {
    unison::test::backend::thread::run([](auto& comm) {
        unison::test::ddp_training_cases<unison::test::staged_host_space>(comm);
        unison::test::loss_normalization_cases<unison::test::staged_host_space>(comm);
    });
}
