// mpi_launch under Open MPI's launcher: rank and size from MPI agree with the
// launcher's, and the local rank MPI derives (MPI_Comm_split_type, used where no
// launcher variable gives it: MPICH, Cray) equals the one Open MPI's variables give.

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
    const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
    const char* local_size = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    REQUIRE(local != nullptr); // started by Open MPI's mpiexec
    REQUIRE(local_size != nullptr);
    CHECK(info.launcher == "openmpi");
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
