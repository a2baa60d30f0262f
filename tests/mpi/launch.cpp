// mpi_launch under the MPI's own launcher (Open MPI's mpiexec, or MPICH's Hydra):
// rank and size from MPI agree with the launcher's, and the local rank MPI derives
// (MPI_Comm_split_type, used where no launcher variable gives it: Cray, a bare PMI)
// equals the one the launcher's variables give.

#include <unison/mpi.hpp>

#include <doctest/doctest.h>

#include <cstdlib>
#include <string>

TEST_CASE("mpi: mpi_launch agrees with the launcher and derives the local rank from MPI") {
    int rank = 0, size = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    const unison::launch_info info = unison::mpi_launch();
    CHECK(info.rank == rank);
    CHECK(info.size == size);
    // Open MPI's mpiexec, or Hydra (MPICH, Intel MPI): PMI_RANK and MPI_LOCALRANKID.
    const bool open_mpi = std::getenv("OMPI_COMM_WORLD_RANK") != nullptr;
    const char* local = std::getenv(open_mpi ? "OMPI_COMM_WORLD_LOCAL_RANK" : "MPI_LOCALRANKID");
    const char* local_size =
        std::getenv(open_mpi ? "OMPI_COMM_WORLD_LOCAL_SIZE" : "MPI_LOCALNRANKS");
    REQUIRE(local != nullptr); // started by Open MPI's or MPICH's mpiexec
    REQUIRE(local_size != nullptr);
    CHECK(info.launcher == (open_mpi ? "openmpi" : "pmi"));
    CHECK(info.local_from_launcher);
    CHECK(info.local_rank == std::stoi(local));

    // What MPI itself says: the same, on one machine every rank is local.
    int derived_rank = -1, derived_size = -1;
    unison::detail::mpi_node_place(MPI_COMM_WORLD, derived_rank, derived_size);
    CHECK(derived_rank == std::stoi(local));
    CHECK(derived_size == std::stoi(local_size));
    CHECK(derived_size == size);

    // On another communicator the launcher's variables say nothing: MPI decides.
    MPI_Comm reversed = MPI_COMM_NULL;
    MPI_Comm_split(MPI_COMM_WORLD, 0, size - 1 - rank, &reversed);
    const unison::launch_info sub = unison::mpi_launch(reversed);
    CHECK(sub.rank == size - 1 - rank);
    CHECK_FALSE(sub.local_from_launcher);
    CHECK(sub.local_rank == size - 1 - rank);
    CHECK(sub.local_size == size);
    MPI_Comm_free(&reversed);
}
