#pragma once

/// \file
/// Training state on a CUDA device: the implementation of the device seam
/// (parallel/detail/device_ops.hpp) with unison's kernels, and `use_device`, which
/// installs it into a DDP or sharding object. Include it in a translation unit that
/// nvcc compiles; the object can then be used from any translation unit, .cpp or .cu:
///
///     #include <unison/parallel/device.cuh>             // in a .cu file
///     unison::cuda::use_device(dp, dev, compute);        // ddp / bucketed_reducer: device gradients
///     unison::cuda::use_device(engine, dev, compute);    // fsdp: every buffer on cuda:dev
///     auto setup = unison::cuda::on_device<Engine>(dev, compute); // the same, applied elsewhere
///
/// `compute` is the stream the framework computes on (the legacy default stream when
/// null): packing, casts, fills and optimizer steps are enqueued there in call
/// order, and each collective's stream (NCCL's, or the thread backend's attached
/// one) waits for it through an event first.

#include "unison/core/error.hpp"
#include "unison/cuda/check.hpp"
#include "unison/cuda/stream.hpp"
#include "unison/kernels/multi_tensor.cuh"
#include "unison/kernels/norm.cuh"
#include "unison/kernels/optimizer.cuh"
#include "unison/parallel/detail/device_ops.hpp"
#include "unison/parallel/device_setup.hpp"

#include <cuda_runtime.h>

#include <cstddef>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>

namespace unison::detail {

/// A multi_tensor_plan behind the seam.
class kernel_plan final : public device_plan {
public:
    explicit kernel_plan(kernels::multi_tensor_plan p) : plan(std::move(p)) {}
    kernels::multi_tensor_plan plan;
};

/// device_ops with unison's kernels on device `dev` and stream `compute`.
class kernel_device_ops final : public device_ops {
public:
    kernel_device_ops(int dev, cudaStream_t compute) : dev_(dev), stream_(compute) {
        int count = 0;
        UNISON_CHECK_CUDA(cudaGetDeviceCount(&count), -1, "use_device");
        if (dev < 0 || dev >= count) {
            throw argument_error(-1, "use_device",
                                 "device " + std::to_string(dev) + " does not exist (" +
                                     std::to_string(count) + " visible)");
        }
        cuda::device_guard guard(dev);
        event_.emplace();
    }

    device location() const noexcept override { return device::cuda(dev_); }
    void* stream() const noexcept override { return static_cast<void*>(stream_); }

    void* allocate(std::size_t bytes) override {
        cuda::device_guard guard(dev_);
        void* p = nullptr;
        UNISON_CHECK_CUDA(cudaMalloc(&p, bytes), -1,
                          "allocating " + std::to_string(bytes) +
                              " bytes on cuda:" + std::to_string(dev_));
        return p;
    }
    void deallocate(void* p) noexcept override {
        cuda::device_guard guard(dev_);
        cudaFree(p); // waits for the work still using it
    }
    void copy_from_host(void* dst, const void* src, std::size_t bytes) override {
        copy(dst, src, bytes, cudaMemcpyHostToDevice, "copy to ");
    }
    void copy_to_host(void* dst, const void* src, std::size_t bytes) override {
        copy(dst, src, bytes, cudaMemcpyDeviceToHost, "copy from ");
    }
    void synchronize() override {
        cuda::device_guard guard(dev_);
        UNISON_CHECK_CUDA(cudaStreamSynchronize(stream_), -1, "synchronize " + where());
    }

    void zero(void* dst, std::size_t bytes) override {
        if (bytes == 0) {
            return;
        }
        cuda::device_guard guard(dev_);
        UNISON_CHECK_CUDA(cudaMemsetAsync(dst, 0, bytes, stream_), -1, "zero fill on " + where());
    }
    void scale_cast(void* dst, dtype dst_type, const void* src, dtype src_type, std::size_t n,
                    double scale, bool accumulate) override {
        if (dst == src && scale == 1.0 && dst_type == src_type && !accumulate) {
            return;
        }
        cuda::device_guard guard(dev_);
        kernels::scale_cast(dst, dst_type, src, src_type, n, scale, accumulate, stream_);
    }
    std::unique_ptr<device_plan> plan(std::span<const kernels::copy_piece> pieces) override {
        cuda::device_guard guard(dev_);
        return std::make_unique<kernel_plan>(kernels::multi_tensor_plan(pieces));
    }
    std::unique_ptr<device_plan> plan(std::span<const kernels::read_piece> pieces) override {
        cuda::device_guard guard(dev_);
        return std::make_unique<kernel_plan>(kernels::multi_tensor_plan(pieces));
    }
    void multi_scale_cast(const device_plan& p, dtype dst_type, dtype src_type,
                          double scale) override {
        cuda::device_guard guard(dev_);
        kernels::multi_scale_cast(static_cast<const kernel_plan&>(p).plan, dst_type, src_type,
                                  scale, false, stream_);
    }
    void multi_norm(const device_plan& p, dtype type, void* stats) override {
        cuda::device_guard guard(dev_);
        kernels::multi_norm(static_cast<const kernel_plan&>(p).plan, type,
                            static_cast<kernels::norm_stats*>(stats), stream_);
    }

    void order_before(void* comm_stream) override {
        cuda::device_guard guard(dev_);
        event_->record(stream_);
        event_->make_wait(static_cast<cudaStream_t>(comm_stream));
    }

private:
    std::string where() const { return "cuda:" + std::to_string(dev_); }
    void copy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind,
              const char* what) {
        if (bytes == 0) {
            return;
        }
        cuda::device_guard guard(dev_);
        const std::string label = what + where();
        UNISON_CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, kind, stream_), -1, label);
        // Pageable host memory: the call may return before the copy lands.
        UNISON_CHECK_CUDA(cudaStreamSynchronize(stream_), -1, label);
    }

    int dev_;
    cudaStream_t stream_;
    std::optional<cuda::event> event_; // created on dev_
};

/// The fused optimizer step of `O` (kernels/optimizer.cuh) behind the seam.
template <class O, class A>
class kernel_optimizer_step final : public device_optimizer_step<O, A> {
public:
    kernel_optimizer_step(int dev, cudaStream_t compute) : dev_(dev), stream_(compute) {}

    void step(const typename O::template constants<A>& constants, dtype param_type, void* param,
              const void* grad, A* master, A* const* state, std::size_t count,
              A grad_scale) override {
        cuda::device_guard guard(dev_);
        visit_floating(param_type, [&](auto tag) {
            using P = decltype(tag);
            kernels::shard_ref<P, P, A, O::slots> s;
            s.param = static_cast<P*>(param);
            s.grad = static_cast<const P*>(grad);
            s.master = master;
            for (std::size_t k = 0; k < O::slots; ++k) {
                s.state[k] = state[k];
            }
            s.count = count;
            kernels::optimizer_step<O>(constants, s, grad_scale, nullptr, stream_);
        });
    }

private:
    int dev_;
    cudaStream_t stream_;
};

/// What `use_device` hands to an object's `install_device`: the device ops for one
/// device and compute stream, and the fused optimizer steps, instantiated here, in
/// the CUDA translation unit, for the optimizer type the object asks for.
class device_installer {
public:
    device_installer(int dev, cudaStream_t compute)
        : dev_(dev), stream_(compute), ops_(std::make_shared<kernel_device_ops>(dev, compute)) {}

    const std::shared_ptr<device_ops>& ops() const noexcept { return ops_; }

    template <class O, class A>
    std::unique_ptr<device_optimizer_step<O, A>> optimizer_step() const {
        return std::make_unique<kernel_optimizer_step<O, A>>(dev_, stream_);
    }

private:
    int dev_;
    cudaStream_t stream_;
    std::shared_ptr<device_ops> ops_;
};

} // namespace unison::detail

namespace unison::cuda {

/// An object whose state can be put on a device: ddp, bucketed_reducer, fsdp,
/// sharded_parameters, partitioned_optimizer.
template <class T>
concept device_placeable = requires(T& t, unison::detail::device_installer& i) {
    t.install_device(i);
};

/// Puts `target`'s state and device work on CUDA device `dev`, enqueued on `compute`
/// (see the file comment). For DDP the gradients registered must be on `dev`; for
/// sharding, call it before adding units (they are allocated as they are added).
template <device_placeable T>
void use_device(T& target, int dev, cudaStream_t compute = nullptr) {
    unison::detail::device_installer installer(dev, compute);
    target.install_device(installer);
}

/// The same placement as a value that code outside this CUDA translation unit can
/// apply (parallel/device_setup.hpp): the LibTorch wrappers take one, so that only a
/// small .cu file needs nvcc. `T` is the engine type (`unison::ddp<C, Ps...>`,
/// `unison::fsdp<C, Ps...>`; `unison::torch::ddp<...>::engine_type` names it).
template <device_placeable T>
device_setup<T> on_device(int dev, cudaStream_t compute = nullptr) {
    return device_setup<T>(device::cuda(dev),
                           [dev, compute](T& target) { use_device(target, dev, compute); });
}

} // namespace unison::cuda
