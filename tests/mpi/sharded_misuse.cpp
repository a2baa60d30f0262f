// The sharded (FSDP / ZeRO) suite (tests/suites/sharded.hpp) on the MPI backend, at the
// world size mpiexec started: misuse, and a rank that skips a step.

#include "../suites/sharded.hpp"

UNISON_SHARDED_MISUSE_SUITE(unison::test::backend::mpi);
