// The sharded (FSDP / ZeRO) suite (tests/suites/sharded.hpp) on the MPI backend, at the
// world size mpiexec started: training, against DDP and single-process training.

#include "../suites/sharded.hpp"

UNISON_SHARDED_TRAINING_SUITE(unison::test::backend::mpi);
