// The DDP cases of tests/ddp on the thread backend, at 1 to 4 ranks.

#include "../ddp/cases.hpp"
#include "../ddp/training.hpp"

#include "worlds.hpp"

using unison::test::on_worlds;

TEST_CASE("thread ddp: every policy averages like the double reference") {
    on_worlds([](auto& comm) { unison::test::reducer_policy_cases(comm); });
}
TEST_CASE("thread ddp: gradient accumulation communicates once per window") {
    on_worlds([](auto& comm) { unison::test::reducer_accumulation_case(comm); });
}
TEST_CASE("thread ddp: unused parameters") {
    on_worlds([](auto& comm) { unison::test::reducer_unused_cases(comm); });
}
TEST_CASE("thread ddp: join with uneven inputs") {
    on_worlds([](auto& comm) { unison::test::reducer_join_case(comm); });
}
TEST_CASE("thread ddp: misuse is reported") {
    on_worlds([](auto& comm) { unison::test::reducer_error_cases(comm); });
}
TEST_CASE("thread ddp: training equals single-process training") {
    on_worlds([](auto& comm) { unison::test::ddp_training_cases(comm); });
}
TEST_CASE("thread ddp: loss normalization with uneven counts") {
    on_worlds([](auto& comm) { unison::test::loss_normalization_cases(comm); });
}
