// The DDP suite (tests/suites/ddp.hpp) on the MPI backend, at the world size mpiexec started.

#include "../suites/ddp.hpp"

UNISON_DDP_SUITE(unison::test::backend::mpi);
