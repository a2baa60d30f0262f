// The sharded (FSDP / ZeRO) suite (tests/suites/sharded.hpp) on the MPI backend, at the
// world size mpiexec started: gradient accumulation in every mode, against one big
// batch.

#include "../suites/sharded.hpp"

UNISON_SHARDED_ACCUMULATION_SUITE(unison::test::backend::mpi);
