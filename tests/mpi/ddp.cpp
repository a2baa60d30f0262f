// The DDP cases of tests/ddp on the MPI backend, at the world size mpiexec started.

#include "../ddp/cases.hpp"
#include "../ddp/training.hpp"

#include <unison/mpi.hpp>

namespace {
unison::mpi_communicator world() {
    return unison::mpi_communicator(MPI_COMM_WORLD);
}
} // namespace

TEST_CASE("mpi ddp: every policy averages like the double reference") {
    auto comm = world();
    unison::test::reducer_policy_cases(comm);
}
TEST_CASE("mpi ddp: gradient accumulation communicates once per window") {
    auto comm = world();
    unison::test::reducer_accumulation_case(comm);
}
TEST_CASE("mpi ddp: unused parameters") {
    auto comm = world();
    unison::test::reducer_unused_cases(comm);
}
TEST_CASE("mpi ddp: join with uneven inputs") {
    auto comm = world();
    unison::test::reducer_join_case(comm);
}
TEST_CASE("mpi ddp: misuse is reported") {
    auto comm = world();
    unison::test::reducer_error_cases(comm);
}
TEST_CASE("mpi ddp: training equals single-process training") {
    auto comm = world();
    unison::test::ddp_training_cases(comm);
}
TEST_CASE("mpi ddp: loss normalization with uneven counts") {
    auto comm = world();
    unison::test::loss_normalization_cases(comm);
}
