// The DDP suite (tests/suites/ddp.hpp) on device memory: gradients on the GPU and
// the reducer placed there (unison::cuda::use_device), so that it takes its device
// paths (device-packed and gradients in device buckets). On the thread backend,
// worlds of 1 to 4 ranks share GPU 0; with NCCL, one rank per visible GPU (with one
// GPU a one-rank world, which still runs the device path end to end: the layout
// check and rebuild staged through device memory, the multi-tensor pack on the
// compute stream, the all-reduce on NCCL's stream ordered by an event, the unpack).

#include "../suites/ddp.hpp"
#include "backends.cuh"

UNISON_DDP_SUITE(unison::test::backend::thread_on_gpu);
#if UNISON_TEST_GPU_DEVICE_ONLY
// The same threads behind a communicator that moves device memory only, as NCCL
// does: the engines' bookkeeping collectives go through the GPU, at 1 to 4 ranks.
UNISON_DDP_SUITE(unison::test::backend::thread_on_gpu_device_only);
#endif
#if UNISON_HAS_NCCL()
UNISON_DDP_SUITE(unison::test::backend::nccl_engines);
#endif

// Beyond the suite's 1 to 4 ranks: every policy at 8 thread ranks on one GPU.
TEST_CASE("ddp on device: every policy at 8 thread ranks on one GPU") {
    unison::thread_world(8).run([](unison::thread_communicator& comm) {
        unison::cuda::use_device(comm, 0);
        unison::test::reducer_policy_cases<unison::test::device_engine_space>(comm);
    });
}
