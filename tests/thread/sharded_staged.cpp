// The sharded suite's training and accumulation cases (tests/suites/sharded.hpp) on the
// thread backend, with the model's values and gradients staged through the engine's
// memory as the device fixtures do.

#include "../suites/sharded.hpp"

TEST_CASE("thread sharded: training through staged copies equals single-process training") {
    unison::test::backend::thread::run([](auto& comm) {
        unison::test::sharded_training_cases<unison::test::staged_host_space>(comm);
        unison::test::accumulation_cases<unison::test::staged_host_space>(comm);
    });
}
