#pragma once

/// \file
/// The NCCL backend: `nccl_communicator` (link `unison::nccl`; its `from_mpi`
/// bootstrap also needs `unison::mpi`).

#include "unison/comm.hpp"
#include "unison/nccl/nccl_communicator.hpp"
