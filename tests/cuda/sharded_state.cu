// The sharded suite (tests/suites/sharded.hpp) on device memory: sharded_parameters and
// the partitioned optimizer placed on the GPU (unison::cuda::use_device), so that
// gathers, reductions, casts and the fused optimizer steps run there. On the thread
// backend, worlds of 1 to 4 ranks share GPU 0; with NCCL, one rank per visible GPU.
// This file: accounting, mixed precision and checkpoints, and ZeRO-3 and hybrid at 8
// thread ranks.

#include "../suites/sharded.hpp"
#include "backends.cuh"

UNISON_SHARDED_STATE_SUITE(unison::test::backend::thread_on_gpu);
#if UNISON_TEST_GPU_DEVICE_ONLY
// The same threads behind a communicator that moves device memory only, as NCCL
// does: the engines' bookkeeping collectives go through the GPU, at 1 to 4 ranks.
UNISON_SHARDED_STATE_SUITE(unison::test::backend::thread_on_gpu_device_only);
#endif
#if UNISON_HAS_NCCL()
UNISON_SHARDED_STATE_SUITE(unison::test::backend::nccl_engines);
#endif

// Beyond the suite's 1 to 4 ranks: 8 thread ranks on one GPU, hybrid in two groups
// of 4.
TEST_CASE("sharded on device: ZeRO-3 and hybrid at 8 thread ranks on one GPU") {
    unison::thread_world(8).run([](unison::thread_communicator& comm) {
        unison::cuda::use_device(comm, 0);
        using space = unison::test::device_engine_space;
        unison::test::mixed_precision_case<unison::policy::zero<3>, space>(
            comm, "bf16 parameters, f32 master, zero<3>, 8 ranks");
        unison::test::mixed_precision_case<unison::policy::shard::hybrid, space>(
            comm, "bf16 parameters, f32 master, hybrid, 8 ranks, clipped", 5.0);
    });
}
