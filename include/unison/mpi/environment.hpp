#pragma once

/// \file
/// `mpi_environment`: MPI's initialization and finalization for a program that uses
/// the MPI backend (see mpi_communicator.hpp).

#include "unison/mpi/detail/mpi_check.hpp"
#include "unison/mpi/launch.hpp"

#include <mpi.h>

namespace unison {

/// Initializes MPI (MPI_THREAD_FUNNELED) unless it already is, and finalizes it on
/// destruction if this object initialized it. Then checks that the launcher's
/// environment and MPI agree on the job (mpi/launch.hpp): under torchrun without an
/// MPI launcher every process would otherwise be a world of its own and train
/// alone. On a disagreement it finalizes MPI (if it initialized it) and throws
/// argument_error naming the launcher's variables.
class mpi_environment {
public:
    mpi_environment(int& argc, char**& argv) {
        int initialized = 0;
        MPI_Initialized(&initialized);
        if (!initialized) {
            int provided = 0;
            UNISON_CHECK_MPI(MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided), -1,
                             "mpi_environment");
            owner_ = true;
        }
        int rank = 0, size = 1;
        MPI_Comm_rank(MPI_COMM_WORLD, &rank);
        MPI_Comm_size(MPI_COMM_WORLD, &size);
        try {
            detail::check_launch_matches(detect_launch(), rank, size, "mpi_environment");
        } catch (...) {
            if (owner_) {
                MPI_Finalize();
            }
            throw;
        }
    }
    mpi_environment(const mpi_environment&) = delete;
    mpi_environment& operator=(const mpi_environment&) = delete;
    ~mpi_environment() {
        int finalized = 0;
        MPI_Finalized(&finalized);
        if (owner_ && !finalized) {
            MPI_Finalize();
        }
    }

private:
    bool owner_ = false;
};

} // namespace unison
