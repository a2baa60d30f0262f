// The doctest main of the MPI tests: every rank runs every test case, and the exit
// status is collective, so mpiexec (and with it CTest) fails when any rank failed.
// Rank 0 reports normally; the other ranks report only their failures.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <mpi.h>

#include <cstdio>

int main(int argc, char** argv) {
    int provided = 0;
    if (MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
        std::fprintf(stderr, "unison-mpi-tests: MPI_Init_thread failed\n");
        return 1;
    }
    int rank = 0;
    int size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);

    doctest::Context context;
    if (rank != 0) {
        // Set before the command line is applied, so an explicit option still wins.
        context.setOption("minimal", true);
        context.setOption("no-intro", true);
        context.setOption("no-version", true);
    }
    context.applyCommandLine(argc, argv);
    const int result = context.run();

    const int failed = result != 0 ? 1 : 0;
    if (failed != 0) { // doctest's report does not say which rank wrote it
        std::fprintf(stderr, "unison-mpi-tests: rank %d of %d failed (report above)\n", rank, size);
    }
    int any_failed = failed;
    MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (any_failed != 0 && failed == 0 && rank == 0) {
        std::fprintf(stderr, "unison-mpi-tests: rank 0 passed, but another rank failed\n");
    }
    MPI_Finalize();
    return any_failed;
}
