// The sharded (FSDP / ZeRO) suite (tests/suites/sharded.hpp) on the MPI backend, at the
// world size mpiexec started: memory and traffic accounting, mixed precision, clipping,
// loss scaling and checkpoints.

#include "../suites/sharded.hpp"

UNISON_SHARDED_STATE_SUITE(unison::test::backend::mpi);
