#pragma once

/// \file
/// The one seam between the training layer (ddp/, sharded/) and the GPU. The
/// classes there are host code that compiles the same in every translation unit;
/// the device work they need (memory, element operations, multi-tensor kernels,
/// stream ordering, the fused optimizer step) goes through these interfaces,
/// implemented in unison/parallel/device.cuh and installed from a CUDA translation
/// unit by `unison::cuda::use_device(object, device, stream)`. An object built in a
/// .cu file can then be used from a .cpp file and the other way round.

#include "unison/core/dtype.hpp"
#include "unison/core/tensor.hpp"
#include "unison/kernels/host.hpp"

#include <cstddef>
#include <memory>
#include <span>

namespace unison::detail {

/// Tables of a multi-tensor operation uploaded to the device, built once for a
/// layout that is used every step (the pieces' pointers, not their data).
class device_plan {
public:
    virtual ~device_plan() = default;
};

/// Device work for one CUDA device and one compute stream (the stream the
/// framework computes on; work is enqueued there in call order).
class device_ops {
public:
    virtual ~device_ops() = default;

    /// The device every buffer and kernel of this object is on.
    virtual device location() const noexcept = 0;
    /// The compute stream (a cudaStream_t; null is the legacy default stream).
    virtual void* stream() const noexcept = 0;

    /// `bytes` of uninitialized device memory; freed by `deallocate`.
    virtual void* allocate(std::size_t bytes) = 0;
    virtual void deallocate(void* p) noexcept = 0;
    /// Copies between host and device memory; returns when the copy is complete,
    /// after the work enqueued on the compute stream before it.
    virtual void copy_from_host(void* dst, const void* src, std::size_t bytes) = 0;
    virtual void copy_to_host(void* dst, const void* src, std::size_t bytes) = 0;
    /// Waits on the host for everything enqueued on the compute stream.
    virtual void synchronize() = 0;

    /// Enqueued on the compute stream: `bytes` zero bytes at `dst`.
    virtual void zero(void* dst, std::size_t bytes) = 0;
    /// Enqueued on the compute stream: dst = D(A(src) * scale) over `n` elements, or
    /// with `accumulate` dst = D(A(dst) + A(src) * scale) (kernels::scale_cast);
    /// no-op when it would copy a buffer onto itself.
    virtual void scale_cast(void* dst, dtype dst_type, const void* src, dtype src_type,
                            std::size_t n, double scale, bool accumulate) = 0;
    /// Uploads the tables of a multi-tensor copy or read; returns once they are there.
    virtual std::unique_ptr<device_plan> plan(std::span<const kernels::copy_piece> pieces) = 0;
    virtual std::unique_ptr<device_plan> plan(std::span<const kernels::read_piece> pieces) = 0;
    /// Enqueued on the compute stream: every piece of `p` (from plan(copy_piece))
    /// scaled and cast, one launch.
    virtual void multi_scale_cast(const device_plan& p, dtype dst_type, dtype src_type,
                                  double scale) = 0;
    /// Enqueued on the compute stream: sum of squares and non-finite count of every
    /// piece of `p` (from plan(read_piece)) into the device `kernels::norm_stats` at
    /// `stats`.
    virtual void multi_norm(const device_plan& p, dtype type, void* stats) = 0;

    /// Makes `comm_stream` (a cudaStream_t) wait for the work enqueued on the compute
    /// stream so far, so a collective launched there next reads what compute wrote.
    virtual void order_before(void* comm_stream) = 0;
};

/// The fused step of optimizer `O` with compute (master and state) type `A` on
/// flat device shards, enqueued on the compute stream of the device_ops it was
/// installed with.
template <class O, class A>
class device_optimizer_step {
public:
    virtual ~device_optimizer_step() = default;
    /// `count` elements: parameters and gradients of `param_type`, master weights
    /// (or null to step the parameters directly) and O::slots state arrays in A.
    virtual void step(const typename O::template constants<A>& constants, dtype param_type,
                      void* param, const void* grad, A* master, A* const* state, std::size_t count,
                      A grad_scale) = 0;
};

} // namespace unison::detail
