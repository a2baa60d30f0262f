// An exception that leaves mpi_environment's scope on rank 0 alone, while the
// others wait for it in an all_reduce, on 2 or more processes. MPI_Finalize waits
// for every process, so rank 0 waits at the end of the job until the others give
// up at their timeout (3 s); after a second it says why it waits, since the
// exception's own message comes only after. Then every process reaches the end,
// the job ends normally, and rank 0 exits with 1. With --abort, rank 0 sleeps
// instead, and the others end the job as the examples do when their call times
// out: mpi_environment::abort_job(program, e), exit status 75. Run by CTest under
// mpiexec with a wrapper (tests/faults/expect_exit.sh) that checks the exit code,
// the messages and the time taken.

#include <unison/mpi.hpp>

#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <exception>
#include <stdexcept>
#include <string_view>
#include <thread>
#include <vector>

int main(int argc, char** argv) {
    using namespace std::chrono_literals;
    int rank = -1;
    const bool abort = argc > 1 && std::string_view(argv[1]) == "--abort";
    try {
        unison::mpi_environment env(argc, argv);
        unison::comm_options options;
        options.timeout = 3s;
        unison::mpi_communicator comm(MPI_COMM_WORLD, options);
        rank = comm.rank();
        std::vector<float> data(1024, 1.0f + static_cast<float>(rank));
        unison::all_reduce(comm, data); // everyone is here
        if (rank == 0 && abort) {
            std::this_thread::sleep_for(30s); // the others' abort ends this process
            return 3;
        }
        if (rank == 0) {
            throw std::runtime_error("rank 0 fails alone");
        }
        try {
            unison::all_reduce(comm, data);
            std::fprintf(stderr, "mpi_unwinding: rank %d: the all_reduce completed\n", rank);
            return 2;
        } catch (const unison::timeout_error& e) {
            if (abort) {
                unison::mpi_environment::abort_job("mpi_unwinding", e);
            }
            std::fprintf(stderr, "mpi_unwinding: rank %d caught: %s\n", rank, e.what());
        }
        return 0;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "mpi_unwinding: rank %d caught after mpi_environment ended: %s\n",
                     rank, e.what());
        return 1;
    }
}
