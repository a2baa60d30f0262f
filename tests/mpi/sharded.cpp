// The sharded (FSDP / ZeRO) suite (tests/suites/sharded.hpp) on the MPI backend, at
// the world size mpiexec started.

#include "../suites/sharded.hpp"

UNISON_SHARDED_SUITE(unison::test::backend::mpi);
