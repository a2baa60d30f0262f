// Measures what the simulation's clusters are made of, so that a simulated node or
// link can be set against a real one: the one-way time of a message between two
// ranks (half a ping-pong's round trip, the best of several rounds) from 8 bytes to
// 2 MiB by factors of 4, and what one MPI_Test of a receive that stays pending costs (what every
// poll of unison's waits costs, which the simulation charges at a fixed price).
// It uses MPI alone, not unison. bench/simulation/simulate.sh builds it with
// SimGrid's smpicxx and runs it under smpirun (`-d node_probe`: on two_level at 2
// ranks the pair shares one node, on flat it crosses the network); a real MPI runs
// the same source:
//
//   mpicxx -O2 bench/simulation/node_probe.cpp -o node_probe
//   scripts/mpiexec.sh -n 2 ./node_probe
//
// Output, one CSV row per measurement (rank 0):
//   ranks,what,bytes,us
// what is "one_way" (bytes: the message's size) or "test_pending" (bytes 0).
// Ranks beyond the first two wait in the final barrier.

#include <mpi.h>

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <vector>

int main(int argc, char** argv) {
    MPI_Init(&argc, &argv);
    int rank = 0;
    int size = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size < 2) {
        if (rank == 0)
            std::fprintf(stderr, "node_probe: needs 2 ranks, not %d\n", size);
        MPI_Finalize();
        return 2;
    }
    if (rank == 0)
        std::printf("ranks,what,bytes,us\n");
    constexpr std::size_t largest = std::size_t{2} << 20;
    std::vector<char> buffer(largest, 1);
    const int peer = rank == 0 ? 1 : 0;
    const bool pair = rank < 2;

    for (std::size_t bytes = 8; bytes <= largest; bytes *= 4) {
        const int count = static_cast<int>(bytes);
        const int trips = bytes >= (std::size_t{1} << 20) ? 20 : bytes >= 65536 ? 100 : 1000;
        double best = 1e30;
        for (int round = 0; round < 5; ++round) {
            MPI_Barrier(MPI_COMM_WORLD);
            const double start = MPI_Wtime();
            for (int trip = 0; pair && trip < trips; ++trip) {
                if (rank == 0) {
                    MPI_Send(buffer.data(), count, MPI_BYTE, peer, 0, MPI_COMM_WORLD);
                    MPI_Recv(buffer.data(), count, MPI_BYTE, peer, 0, MPI_COMM_WORLD,
                             MPI_STATUS_IGNORE);
                } else {
                    MPI_Recv(buffer.data(), count, MPI_BYTE, peer, 0, MPI_COMM_WORLD,
                             MPI_STATUS_IGNORE);
                    MPI_Send(buffer.data(), count, MPI_BYTE, peer, 0, MPI_COMM_WORLD);
                }
            }
            best = std::min(best, (MPI_Wtime() - start) / trips / 2);
        }
        if (rank == 0)
            std::printf("%d,one_way,%zu,%.4f\n", size, bytes, best * 1e6);
    }

    // Rank 0 polls a receive whose message rank 1 sends only once rank 0 has told
    // it that the polls are over: each MPI_Test finds nothing.
    char byte = 0;
    if (rank == 0) {
        MPI_Request request = MPI_REQUEST_NULL;
        MPI_Irecv(&byte, 1, MPI_BYTE, 1, 1, MPI_COMM_WORLD, &request);
        constexpr int polls = 100000;
        int done = 0;
        const double start = MPI_Wtime();
        for (int poll = 0; poll < polls; ++poll)
            MPI_Test(&request, &done, MPI_STATUS_IGNORE);
        const double each = (MPI_Wtime() - start) / polls;
        MPI_Send(&byte, 1, MPI_BYTE, 1, 2, MPI_COMM_WORLD);
        MPI_Wait(&request, MPI_STATUS_IGNORE);
        std::printf("%d,test_pending,0,%.4f\n", size, each * 1e6);
    } else if (rank == 1) {
        MPI_Recv(&byte, 1, MPI_BYTE, 0, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        MPI_Send(&byte, 1, MPI_BYTE, 0, 1, MPI_COMM_WORLD);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Finalize();
    return 0;
}
