// The sharded suite (tests/suites/sharded.hpp) on device memory: sharded_parameters
// and the partitioned optimizer placed on the GPU (unison::cuda::use_device), so that
// gathers, reductions, casts and the fused optimizer steps run there. On the thread
// backend, worlds of 1 to 4 ranks share GPU 0; with NCCL, one rank per visible GPU.

#include "../suites/sharded.hpp"
#include "backends.cuh"

UNISON_SHARDED_SUITE(unison::test::backend::thread_on_gpu);
#if UNISON_HAS_NCCL()
UNISON_SHARDED_SUITE(unison::test::backend::nccl_engines);
#endif
