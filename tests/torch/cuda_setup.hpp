#pragma once

// What the LibTorch GPU tests (cuda.cpp, compiled by the host compiler with
// LibTorch) need from nvcc: device setups for the engine types they train, and the
// thread backend attached to a GPU. Defined in cuda_setup.cu, which includes no
// LibTorch header (LibTorch 1.x's headers do not compile under nvcc in C++20).

#include <unison/ddp.hpp>
#include <unison/parallel/device_setup.hpp>
#include <unison/sharded.hpp>
#include <unison/thread.hpp>
#if UNISON_TORCH_GPU_NCCL
#include <unison/nccl.hpp>
#endif

namespace unison::test::torch_gpu {

template <communicator C>
using ddp_engine = unison::ddp<C>;
template <communicator C>
using fsdp_f32_engine = unison::fsdp<C, policy::shard::full>;
template <communicator C>
using fsdp_f64_engine = unison::fsdp<C, policy::shard::full, policy::mixed_precision<dtype::f64>>;

/// The placement of an `Engine` on cuda:`dev`, on the default stream (LibTorch's).
template <class Engine>
device_setup<Engine> on_gpu(int dev);

/// The thread backend's rank `comm` on cuda:`dev`, with a stream of its own.
void attach_to_gpu(thread_communicator& comm, int dev);

} // namespace unison::test::torch_gpu
