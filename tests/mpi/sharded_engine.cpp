// The sharded (FSDP / ZeRO) suite (tests/suites/sharded.hpp) on the MPI backend, at the
// world size mpiexec started: the fsdp engine's prefetch order, unit reuse and unused
// units.

#include "../suites/sharded.hpp"

UNISON_SHARDED_ENGINE_SUITE(unison::test::backend::mpi);
