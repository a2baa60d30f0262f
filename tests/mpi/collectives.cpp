// The collective suite (tests/suites/collectives.hpp) on the MPI backend, at the
// world size mpiexec started (CTest runs 2, 3 and 4 ranks).

#include "../suites/collectives.hpp"

UNISON_COLLECTIVE_SUITE(unison::test::backend::mpi);
