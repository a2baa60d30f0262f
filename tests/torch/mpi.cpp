// The LibTorch suite (tests/suites/torch.hpp) on the MPI backend, at the world size
// mpiexec started.

#include "../suites/torch.hpp"

UNISON_TORCH_SUITE(unison::test::backend::mpi);
