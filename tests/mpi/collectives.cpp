// The collective cases of tests/collectives on the MPI backend, at the world size
// mpiexec started (CTest runs 2, 3 and 4 ranks).

#include "../collectives/cases.hpp"

#include <unison/mpi.hpp>

namespace {
unison::mpi_communicator world() {
    return unison::mpi_communicator(MPI_COMM_WORLD);
}
} // namespace

TEST_CASE("mpi: all_reduce") {
    auto comm = world();
    unison::test::all_reduce_cases(comm);
}
TEST_CASE("mpi: reduce_scatter") {
    auto comm = world();
    unison::test::reduce_scatter_cases(comm);
}
TEST_CASE("mpi: all_gather and all_gatherv") {
    auto comm = world();
    unison::test::all_gather_cases(comm);
}
TEST_CASE("mpi: broadcast") {
    auto comm = world();
    unison::test::broadcast_cases(comm);
}
TEST_CASE("mpi: reduce") {
    auto comm = world();
    unison::test::reduce_cases(comm);
}
TEST_CASE("mpi: all_to_all") {
    auto comm = world();
    unison::test::all_to_all_cases(comm);
}
TEST_CASE("mpi: send and recv") {
    auto comm = world();
    unison::test::send_recv_cases(comm);
}
TEST_CASE("mpi: non-blocking collectives and wait_all") {
    auto comm = world();
    unison::test::async_cases(comm);
}
TEST_CASE("mpi: split") {
    auto comm = world();
    unison::test::split_cases(comm);
}
TEST_CASE("mpi: invalid arguments throw and leave the communicator usable") {
    auto comm = world();
    unison::test::argument_error_cases(comm);
}
