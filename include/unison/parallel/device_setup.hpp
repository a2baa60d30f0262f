#pragma once

/// \file
/// `unison::device_setup<Target>`: how to put a training object of type `Target`
/// (a ddp or fsdp engine) on a CUDA device, made where nvcc compiles and applied
/// where it does not. The kernels behind the device seam can only be instantiated
/// in a CUDA translation unit, but the code that builds the object may live in one
/// that cannot include CUDA headers, or cannot be compiled by nvcc at all: LibTorch
/// 1.x's headers do not compile under nvcc in C++20. A setup carries the placement
/// across:
///
///     // gpu.cu, compiled by nvcc, no LibTorch header:
///     #include <unison/parallel/device.cuh>
///     unison::device_setup<unison::ddp<unison::nccl_communicator>> on_gpu(int dev) {
///         return unison::cuda::on_device<unison::ddp<unison::nccl_communicator>>(dev);
///     }
///     // train.cpp, compiled by the host compiler with LibTorch:
///     unison::torch::ddp<unison::nccl_communicator> dp(comm, model, {}, on_gpu(local_rank));
///
/// A host header: no CUDA header, no nvcc needed to hold or pass one.

#include "unison/core/tensor.hpp"

#include <functional>
#include <utility>

namespace unison {

/// The placement of a `Target` on one CUDA device (see the file comment). Copyable;
/// applying it is `Target::install_device` with unison's kernels on that device and
/// the compute stream given to `cuda::on_device`.
template <class Target>
class device_setup {
public:
    /// `where`: the device the setup places state on; `install`: what applies it.
    device_setup(device where, std::function<void(Target&)> install)
        : where_(where), install_(std::move(install)) {}

    /// The device the target's state will live on (and its tensors must be on).
    device location() const noexcept { return where_; }

    /// Installs the device seam into `target` (before the target starts).
    void operator()(Target& target) const { install_(target); }

private:
    device where_;
    std::function<void(Target&)> install_;
};

} // namespace unison
