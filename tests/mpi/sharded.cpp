// The sharded (FSDP / ZeRO) cases of tests/sharded on the MPI backend.

#include "../sharded/accounting.hpp"
#include "../sharded/checkpoint.hpp"
#include "../sharded/misuse.hpp"
#include "../sharded/training.hpp"

#include <unison/mpi.hpp>

namespace {
unison::mpi_communicator world() {
    return unison::mpi_communicator(MPI_COMM_WORLD);
}
} // namespace

TEST_CASE("mpi sharded: ZeRO and FSDP training equal DDP and single-process training") {
    auto comm = world();
    unison::test::sharded_training_cases(comm);
}
TEST_CASE("mpi sharded: memory and traffic formulas, mixed precision, loss scaling") {
    auto comm = world();
    unison::test::sharded_accounting_cases(comm);
}
TEST_CASE("mpi sharded: checkpoints restage at the same world size, reject bad files") {
    auto comm = world();
    unison::test::checkpoint_restage_cases(comm);
    unison::test::checkpoint_rejection_cases(comm);
}

TEST_CASE("mpi sharded: misuse is reported") {
    auto comm = world();
    unison::test::sharded_misuse_cases(comm);
    unison::test::fsdp_misuse_cases(comm);
}
