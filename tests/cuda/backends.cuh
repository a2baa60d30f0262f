#pragma once

// The fixtures that need nvcc (see tests/support/backends.hpp for what a fixture
// is): the thread backend on a GPU (unison/thread/device.cuh launches the reduction
// kernels), and the device space for the engines' cases, which puts engines on the
// GPU with unison::cuda::use_device (parallel/device.cuh), for it and for NCCL.

#include "backends.hpp"

#include <unison/parallel/device.cuh>
#include <unison/thread/device.cuh>

namespace unison::test {

/// Device memory for the engines' cases: the device space, and engines placed on
/// the communicator's GPU with their compute on the legacy default stream (which
/// the space's copies are ordered with).
struct device_engine_space : device_space {
    template <device_communicator C, class Engine>
    static void attach(C& comm, Engine& engine) {
        cuda::use_device(engine, comm.device_location().index);
    }
};

namespace backend {

/// The thread backend on device memory: the thread fixture's worlds of 1 to 4
/// ranks, every rank attached to GPU 0 (its own stream).
struct thread_on_gpu {
    using space = device_engine_space;

    template <class F>
    static void run(F&& body) {
        thread::run([&](thread_communicator& comm) {
            cuda::use_device(comm, 0);
            body(comm);
        });
    }
};
static_assert(engine_space<thread_on_gpu::space, thread_communicator>);

#if UNISON_HAS_NCCL()
/// The NCCL fixture with the engines placed on each rank's GPU.
struct nccl_engines : nccl {
    using space = device_engine_space;
};
static_assert(engine_space<nccl_engines::space, nccl_communicator>);
#endif

} // namespace backend
} // namespace unison::test

TYPE_TO_STRING_AS("thread_on_gpu", unison::test::backend::thread_on_gpu);
#if UNISON_HAS_NCCL()
TYPE_TO_STRING_AS("nccl_engines", unison::test::backend::nccl_engines);
#endif
