#pragma once

/// \file
/// The MPI backend: `mpi_environment` and `mpi_communicator`. Link `unison::mpi`.

#include "unison/comm.hpp"
#include "unison/mpi/environment.hpp"
#include "unison/mpi/launch.hpp"
#include "unison/mpi/mpi_communicator.hpp"
