#pragma once

// The thread backend on a GPU's fixture (see tests/support/backends.hpp for what a
// fixture is). Needs nvcc: unison/thread/device.cuh launches the reduction kernels.

#include "backends.hpp"

#include <unison/thread/device.cuh>

namespace unison::test::backend {

/// The thread backend on device memory: the thread fixture's worlds of 1 to 4
/// ranks, every rank attached to GPU 0 (its own stream).
struct thread_on_gpu {
    using space = device_space;

    template <class F>
    static void run(F&& body) {
        thread::run([&](thread_communicator& comm) {
            cuda::use_device(comm, 0);
            body(comm);
        });
    }
};
static_assert(memory_space<thread_on_gpu::space, thread_communicator>);

} // namespace unison::test::backend

TYPE_TO_STRING_AS("thread_on_gpu", unison::test::backend::thread_on_gpu);
