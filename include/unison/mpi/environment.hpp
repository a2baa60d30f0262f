#pragma once

/// \file
/// `mpi_environment`: MPI's initialization and finalization for a program that uses
/// the MPI backend (see mpi_communicator.hpp).

#include "unison/mpi/detail/mpi_check.hpp"

#include <mpi.h>

namespace unison {

/// Initializes MPI (MPI_THREAD_FUNNELED) unless it already is, and finalizes it on
/// destruction if this object initialized it.
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
