// A peer that stops for good (SIGSTOP, never continued) in the middle of a large
// all_reduce, on 2 or more processes. The last rank stops; the others time out
// naming it, catch the error and return from main as a program would. MPI_Finalize
// would wait for the stopped rank forever; mpi_environment instead ends the job
// with MPI_Abort and exit code 75, after one more timeout. Run by CTest under
// mpiexec with a wrapper (tests/faults/expect_exit.sh) that checks the exit code,
// the message and the time taken.

#include <unison/mpi.hpp>

#include <mpi.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

int main(int argc, char** argv) {
    using namespace std::chrono_literals;
    unison::mpi_environment env(argc, argv);
    unison::comm_options options;
    options.timeout = 1s;
    unison::mpi_communicator comm(MPI_COMM_WORLD, options);
    const int stopper = comm.size() - 1;
    // 64 MiB: the ring takes long enough to stop inside it.
    std::vector<float> data(std::size_t{16} << 20, 1.0f + static_cast<float>(comm.rank()));
    unison::all_reduce(comm, data); // everyone is here
    if (comm.rank() == stopper) {
        auto request = unison::all_reduce_async(comm, data);
        const auto until = std::chrono::steady_clock::now() + 5ms;
        while (std::chrono::steady_clock::now() < until && !request.test()) {
        }
        ::raise(SIGSTOP); // for good: only the launcher's kill ends this process
        request.wait();
        return 0;
    }
    try {
        unison::all_reduce(comm, data);
        std::fprintf(stderr, "mpi_dead_peer: rank %d: the all_reduce completed\n", comm.rank());
        return 1;
    } catch (const unison::timeout_error& e) {
        std::fprintf(stderr, "mpi_dead_peer: rank %d caught: %s\n", comm.rank(), e.what());
    }
    std::fprintf(stderr, "mpi_dead_peer: rank %d returns from main\n", comm.rank());
    return 0; // mpi_environment's destructor decides how this process leaves
}
