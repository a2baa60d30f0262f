// The coalesced all-reduce suite (tests/suites/coalesced.hpp) on the MPI backend, at
// the world size mpiexec started (CTest runs 2, 3 and 4 ranks).

#include "../suites/coalesced.hpp"

UNISON_COALESCED_SUITE(unison::test::backend::mpi);
