#pragma once

/// \file
/// `mpi_launch`: this process's place in the job as MPI sees it, checked against
/// the launcher's environment (comm/launcher.hpp), and `mpi_environment`'s check
/// that the launcher and MPI agree on the job at all.
///
/// A launcher that starts N processes which each call MPI_Init without an MPI
/// launcher (torchrun, a Kubernetes job) gives N one-process MPI worlds: every
/// process would train alone and exit 0. The launcher's WORLD_SIZE says N; MPI says
/// 1; mpi_environment turns that into an error before anything runs.

#include "unison/comm/launcher.hpp"
#include "unison/core/error.hpp"
#include "unison/mpi/detail/mpi_check.hpp"

#include <mpi.h>

#include <string>

namespace unison {

namespace detail {

/// This rank's place among the ranks of `comm` on its node, from MPI itself
/// (MPI_Comm_split_type with MPI_COMM_TYPE_SHARED: the ranks that share memory).
/// Collective over `comm`.
inline void mpi_node_place(MPI_Comm comm, int& local_rank, int& local_size) {
    int rank = 0;
    UNISON_CHECK_MPI(MPI_Comm_rank(comm, &rank), -1, "mpi_launch");
    MPI_Comm node = MPI_COMM_NULL;
    UNISON_CHECK_MPI(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node),
                     rank, "mpi_launch");
    UNISON_CHECK_MPI(MPI_Comm_rank(node, &local_rank), rank, "mpi_launch");
    UNISON_CHECK_MPI(MPI_Comm_size(node, &local_size), rank, "mpi_launch");
    MPI_Comm_free(&node);
}

} // namespace detail

/// This process's place in the job: rank and size from MPI (`comm`, MPI_COMM_WORLD
/// by default), checked against the launcher's environment (argument_error when
/// they disagree), and the local rank and size from the launcher's variables or,
/// where no launcher gives them (MPICH's or Cray's launchers without their local
/// variables, an unknown launcher), from MPI_Comm_split_type. Collective over
/// `comm`; MPI must be initialized (mpi_environment).
inline launch_info mpi_launch(MPI_Comm comm = MPI_COMM_WORLD) {
    int rank = 0, size = 1;
    UNISON_CHECK_MPI(MPI_Comm_rank(comm, &rank), -1, "mpi_launch");
    UNISON_CHECK_MPI(MPI_Comm_size(comm, &size), rank, "mpi_launch");
    launch_info info = detect_launch();
    if (comm == MPI_COMM_WORLD) {
        detail::check_launch_matches(info, rank, size, "mpi_launch");
    }
    // Every rank calls the split (it is collective), so that no rank waits on
    // another that took its local rank from the environment.
    int local_rank = 0, local_size = 1;
    detail::mpi_node_place(comm, local_rank, local_size);
    if (info.launcher == "none" || !info.local_from_launcher || comm != MPI_COMM_WORLD) {
        info.launcher = info.launcher == "none" ? "mpi" : info.launcher;
        info.local_rank = local_rank;
        info.local_size = local_size;
        info.local_from_launcher = false;
    }
    info.rank = rank;
    info.size = size;
    return info;
}

} // namespace unison
