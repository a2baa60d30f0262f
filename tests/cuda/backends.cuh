#pragma once

// The fixtures that need nvcc (see tests/support/backends.hpp for what a fixture
// is): the thread backend on a GPU (unison/thread/device.cuh launches the reduction
// kernels), and the device space for the engines' cases, which puts engines on the
// GPU with unison::cuda::use_device (parallel/device.cuh), for it and for NCCL.

#include "backends.hpp"

#include <unison/comm/detail/decorator.hpp>
#include <unison/parallel/device.cuh>
#include <unison/thread/device.cuh>

#include <memory>
#include <utility>

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

/// A communicator that declares it moves device memory only, as NCCL does, over
/// one that could move host memory too: the engines must then stage their small
/// bookkeeping collectives (layout checks, checkpoint votes, loss normalization,
/// join) through their device. The NCCL fixture has one rank per GPU, so on a
/// machine with one GPU only this wrapper runs those paths at several ranks.
template <communicator C>
class device_memory_only : public unison::detail::communicator_decorator<C> {
    using base = unison::detail::communicator_decorator<C>;
    using base::inner_;

public:
    static constexpr bool moves_host_memory = false;

    /// Wraps `inner`, which must outlive this object.
    explicit device_memory_only(C& inner) : base(inner) {}

    void execute(const collective_call& call) { inner_->execute(call); }
    typename C::request_type submit(const collective_call& call) { return inner_->submit(call); }
    device_memory_only split(int color, int key) {
        return device_memory_only(std::make_shared<C>(inner_->split(color, key)));
    }

private:
    explicit device_memory_only(std::shared_ptr<C> owned) : base(std::move(owned)) {}
};

/// Threads on one GPU behind device_memory_only: worlds of 1 to 4 ranks whose
/// engines can move nothing but device memory. The DDP and sharded suites are
/// registered for it unless UNISON_TEST_GPU_DEVICE_ONLY is 0 (CMake option of the
/// same name): a build that only compiles the GPU tests, without a GPU, may leave
/// it out, since NCCL's fixture instantiates the same device-only paths.
#ifndef UNISON_TEST_GPU_DEVICE_ONLY
#define UNISON_TEST_GPU_DEVICE_ONLY 1
#endif
struct thread_on_gpu_device_only {
    using space = device_engine_space;

    template <class F>
    static void run(F&& body) {
        thread::run([&](thread_communicator& comm) {
            cuda::use_device(comm, 0);
            device_memory_only<thread_communicator> only(comm);
            body(only);
        });
    }
};
static_assert(
    engine_space<thread_on_gpu_device_only::space, device_memory_only<thread_communicator>>);
static_assert(!moves_host_memory<device_memory_only<thread_communicator>>);

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
TYPE_TO_STRING_AS("thread_on_gpu_device_only", unison::test::backend::thread_on_gpu_device_only);
#if UNISON_HAS_NCCL()
TYPE_TO_STRING_AS("nccl_engines", unison::test::backend::nccl_engines);
#endif
