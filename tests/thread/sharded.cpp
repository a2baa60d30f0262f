// The sharded (FSDP / ZeRO) cases of tests/sharded on the thread backend, at 1 to 4 ranks.

#include "../sharded/accounting.hpp"
#include "../sharded/training.hpp"

#include <unison/thread.hpp>

namespace {

template <class Fn>
void on_worlds(Fn fn, int from = 1) {
    for (int ranks = from; ranks <= 4; ++ranks) {
        CAPTURE(ranks);
        unison::thread_world(ranks).run([&](unison::thread_communicator& comm) { fn(comm); });
    }
}

} // namespace

TEST_CASE("thread sharded: ZeRO and FSDP training equal DDP and single-process training") {
    on_worlds([](auto& comm) { unison::test::sharded_training_cases(comm); });
}
TEST_CASE("thread sharded: memory and traffic formulas, mixed precision, loss scaling") {
    on_worlds([](auto& comm) { unison::test::sharded_accounting_cases(comm); });
}
