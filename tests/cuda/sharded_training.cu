// The sharded suite (tests/suites/sharded.hpp) on device memory: sharded_parameters and
// the partitioned optimizer placed on the GPU (unison::cuda::use_device), so that
// gathers, reductions, casts and the fused optimizer steps run there. On the thread
// backend, worlds of 1 to 4 ranks share GPU 0; with NCCL, one rank per visible GPU.
// This file: the training cases.

#include "../suites/sharded.hpp"
#include "backends.cuh"

UNISON_SHARDED_TRAINING_SUITE(unison::test::backend::thread_on_gpu);
#if UNISON_TEST_GPU_DEVICE_ONLY
// The same threads behind a communicator that moves device memory only, as NCCL
// does: the engines' bookkeeping collectives go through the GPU, at 1 to 4 ranks.
UNISON_SHARDED_TRAINING_SUITE(unison::test::backend::thread_on_gpu_device_only);
#endif
#if UNISON_HAS_NCCL()
UNISON_SHARDED_TRAINING_SUITE(unison::test::backend::nccl_engines);
#endif
