#pragma once

/// \file
/// Flat buffers of the training parts in host memory or on one CUDA device, the few
/// element operations they need there (scale-and-cast, zero fill, copies to and
/// from the host), the event that orders a communicator's stream after the compute
/// stream, and the staging of small bookkeeping collectives for NCCL. On the host these are the
/// loops of core/detail/convert.hpp; on a device they are the kernels of kernels/multi_tensor.cuh
/// (so a translation unit that places training state on a device is compiled by nvcc) and CUDA
/// runtime calls, ordered on the compute stream.

#include "unison/comm/collectives.hpp"
#include "unison/core/config.hpp"
#include "unison/core/detail/aligned_bytes.hpp"
#include "unison/core/detail/convert.hpp"
#include "unison/core/error.hpp"
#include "unison/core/tensor.hpp"

#if UNISON_HAS_CUDA()
#include "unison/cuda/check.hpp"
#include "unison/cuda/stream.hpp"

#include <cuda_runtime_api.h>
#endif
#if defined(__CUDACC__)
#include "unison/kernels/multi_tensor.cuh"
#endif

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>

namespace unison::detail {

inline namespace UNISON_TU_ABI {

/// Where training state lives and the stream device work is ordered on.
struct placement {
    device where = device::host();
    void* stream = nullptr; ///< cudaStream_t for device work (null: the legacy default stream)

    bool on_device() const noexcept { return where.is_cuda(); }

    /// Throws unless this translation unit can run device work (nvcc compiles it).
    static void require_device_code(int rank, const std::string& operation, device d) {
#if !defined(__CUDACC__)
        throw argument_error(rank, operation,
                             "state on " + to_string(d) +
                                 " needs the CUDA kernels: compile this translation unit with "
                                 "nvcc (a .cu file)");
#else
        (void)rank;
        (void)operation;
        (void)d;
#endif
    }
};

/// `bytes` bytes of uninitialized memory on the host (64-byte aligned) or on a CUDA
/// device (cudaMalloc). Move-only.
class flat_bytes {
public:
    flat_bytes() = default;
    flat_bytes(std::size_t bytes, device where) : where_(where) {
        if (where.is_host()) {
            host_ = aligned_bytes(bytes);
            return;
        }
#if UNISON_HAS_CUDA()
        if (bytes != 0) {
            cuda::device_guard guard(where.index);
            void* p = nullptr;
            UNISON_CHECK_CUDA(cudaMalloc(&p, bytes), -1,
                              "allocating " + std::to_string(bytes) + " bytes on " +
                                  to_string(where));
            device_.reset(static_cast<std::byte*>(p));
        }
        size_ = bytes;
#else
        throw argument_error(-1, "allocate",
                             "memory on " + to_string(where) +
                                 " needs unison::cuda (this build has no CUDA)");
#endif
    }

    std::byte* data() const noexcept {
        return where_.is_host() ? host_.data() : device_.get();
    }
    std::size_t size() const noexcept {
        return where_.is_host() ? host_.size() : size_;
    }
    explicit operator bool() const noexcept {
        return data() != nullptr;
    }
    device location() const noexcept {
        return where_;
    }
    void reset() noexcept {
        host_.reset();
        device_.reset();
        size_ = 0;
    }

private:
    struct device_free {
        void operator()(std::byte* p) const noexcept {
#if UNISON_HAS_CUDA()
            cudaFree(p); // waits for work still using it
#else
            (void)p;
#endif
        }
    };
    device where_ = device::host();
    aligned_bytes host_;
    std::unique_ptr<std::byte, device_free> device_;
    std::size_t size_ = 0;
};

/// dst = D(A(src) * scale) over `n` elements where `p` says (kernels on its stream).
inline void place_scale_cast(const placement& p, void* dst, dtype dst_type, const void* src,
                             dtype src_type, std::size_t n, double scale = 1.0) {
    if (!p.on_device()) {
        convert_scale(dst, dst_type, src, src_type, n, scale);
        return;
    }
#if defined(__CUDACC__)
    if (dst != src || scale != 1.0 || dst_type != src_type) {
        cuda::device_guard guard(p.where.index);
        kernels::scale_cast(dst, dst_type, src, src_type, n, scale, false,
                            static_cast<cudaStream_t>(p.stream));
    }
#else
    placement::require_device_code(-1, "scale_cast", p.where);
#endif
}

/// Zeroes `n` elements of `type` at `dst`.
inline void place_zero(const placement& p, void* dst, dtype type, std::size_t n) {
    if (!p.on_device()) {
        fill_zero(dst, type, n);
        return;
    }
#if UNISON_HAS_CUDA()
    if (n != 0) {
        cuda::device_guard guard(p.where.index);
        UNISON_CHECK_CUDA(
            cudaMemsetAsync(dst, 0, n * size_of(type), static_cast<cudaStream_t>(p.stream)), -1,
            "zero fill on " + to_string(p.where));
    }
#endif
}

/// Copies `bytes` between host memory and `p`'s memory (`upload`: from the host);
/// returns when done, after the work enqueued on `p`'s stream before it.
inline void place_copy(const placement& p, void* dst, const void* src, std::size_t bytes,
                       bool upload) {
    if (!p.on_device()) {
        if (bytes != 0 && dst != src) {
            std::memcpy(dst, src, bytes);
        }
        return;
    }
#if UNISON_HAS_CUDA()
    if (bytes != 0) {
        cuda::device_guard guard(p.where.index);
        auto s = static_cast<cudaStream_t>(p.stream);
        const std::string what = (upload ? "copy to " : "copy from ") + to_string(p.where);
        UNISON_CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes,
                                          upload ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost,
                                          s),
                          -1, what);
        UNISON_CHECK_CUDA(cudaStreamSynchronize(s), -1, what);
    }
#else
    (void)upload;
#endif
}
inline void place_from_host(const placement& p, void* dst, const void* src, std::size_t bytes) {
    place_copy(p, dst, src, bytes, true);
}
inline void place_to_host(const placement& p, void* dst, const void* src, std::size_t bytes) {
    place_copy(p, dst, src, bytes, false);
}

/// The stream a communicator moves device memory on: the NCCL backend's stream, or
/// the thread backend's attached device stream; null when it has none.
template <class C>
void* device_stream_of(C& c) {
    if constexpr (requires { c.stream(); }) {
        return static_cast<void*>(c.stream());
    } else if constexpr (requires { c.device_stream(); }) {
        return c.device_stream();
    } else {
        return nullptr;
    }
}

/// Orders a communicator's stream after the work enqueued so far on the compute
/// stream (an event recorded there, waited for there), so a collective launched
/// next reads what the compute stream wrote. No-op on the host.
class stream_fence {
public:
    template <class C>
    void order(const placement& p, C& comm, const std::string& operation) {
        if (!p.on_device()) {
            return;
        }
#if UNISON_HAS_CUDA()
        void* s = device_stream_of(comm);
        if (s == nullptr) {
            throw argument_error(comm.rank(), operation,
                                 "the data is on " + to_string(p.where) +
                                     " and the communicator has no device stream (attach one "
                                     "with unison::cuda::attach, or use the NCCL backend)");
        }
        cuda::device_guard guard(p.where.index);
        if (!event_) {
            event_.emplace();
        }
        event_->record(static_cast<cudaStream_t>(p.stream));
        event_->make_wait(static_cast<cudaStream_t>(s));
#else
        (void)comm;
        (void)operation;
#endif
    }

private:
#if UNISON_HAS_CUDA()
    std::optional<cuda::event> event_;
#endif
};

/// Whether `C` moves device memory only (the NCCL backend: it has stream() and
/// device()); the training parts then stage their small bookkeeping collectives.
template <class C>
inline constexpr bool device_only_communicator = requires(C& c) {
    c.stream();
    c.device();
};

/// The training parts' small host collectives (layout checks, a broadcast order):
/// on a device-only communicator, staged through its device's memory.
template <class C>
void control_all_gather(C& comm, std::span<const std::int64_t> mine, std::span<std::int64_t> all) {
#if UNISON_HAS_CUDA()
    if constexpr (device_only_communicator<C>) {
        const int dev = comm.device();
        cuda::device_guard guard(dev);
        flat_bytes in(mine.size_bytes(), device::cuda(dev)),
            out(all.size_bytes(), device::cuda(dev));
        UNISON_CHECK_CUDA(cudaMemcpyAsync(in.data(), mine.data(), mine.size_bytes(),
                                          cudaMemcpyHostToDevice, nullptr),
                          comm.rank(), "staging a bookkeeping all_gather");
        UNISON_CHECK_CUDA(cudaStreamSynchronize(nullptr), comm.rank(),
                          "staging a bookkeeping all_gather");
        all_gather(comm, const_buffer(in.data(), mine.size(), dtype::i64, device::cuda(dev)),
                   buffer{out.data(), all.size(), dtype::i64, device::cuda(dev)});
        UNISON_CHECK_CUDA(
            cudaMemcpy(all.data(), out.data(), all.size_bytes(), cudaMemcpyDeviceToHost),
            comm.rank(), "staging a bookkeeping all_gather");
        return;
    }
#endif
    all_gather(comm, mine, all);
}

template <class C>
void control_broadcast(C& comm, std::span<std::int64_t> v, int root) {
#if UNISON_HAS_CUDA()
    if constexpr (device_only_communicator<C>) {
        const int dev = comm.device();
        cuda::device_guard guard(dev);
        flat_bytes d(v.size_bytes(), device::cuda(dev));
        UNISON_CHECK_CUDA(
            cudaMemcpyAsync(d.data(), v.data(), v.size_bytes(), cudaMemcpyHostToDevice, nullptr),
            comm.rank(), "staging a bookkeeping broadcast");
        UNISON_CHECK_CUDA(cudaStreamSynchronize(nullptr), comm.rank(),
                          "staging a bookkeeping broadcast");
        broadcast(comm, buffer{d.data(), v.size(), dtype::i64, device::cuda(dev)}, root);
        UNISON_CHECK_CUDA(cudaMemcpy(v.data(), d.data(), v.size_bytes(), cudaMemcpyDeviceToHost),
                          comm.rank(), "staging a bookkeeping broadcast");
        return;
    }
#endif
    broadcast(comm, v, root);
}

} // namespace UNISON_TU_ABI

} // namespace unison::detail
