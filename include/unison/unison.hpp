#pragma once

/// \file
/// The umbrella header: the core, the collectives, data parallelism, the rendezvous
/// without MPI (rendezvous.hpp) and every backend this
/// translation unit can use. The thread backend is always there; the MPI backend
/// when the target links `unison::mpi`, the Gloo backend with `unison::gloo`, the
/// NCCL backend with `unison::nccl`.

#include "unison/comm.hpp"
#include "unison/core.hpp"
#include "unison/ddp.hpp"
#include "unison/rendezvous.hpp"
#include "unison/sharded.hpp"
#include "unison/thread.hpp"

#if UNISON_HAS_MPI()
#include "unison/mpi.hpp"
#endif

#if UNISON_HAS_GLOO()
#include "unison/gloo.hpp"
#endif

#if UNISON_HAS_NCCL()
#include "unison/nccl.hpp"
#endif
