#pragma once

/// \file
/// Where the training layer's state lives (host memory, or one CUDA device through
/// an installed `device_ops`), flat buffers there, and the few element operations
/// ddp/ and sharded/ run on them: scale-and-cast, zero fill, copies to and from the
/// host, and the ordering of a communicator's stream after the compute stream. On
/// the host these are the loops of core/detail/convert.hpp; on a device they are
/// calls through the device seam (parallel/detail/device_ops.hpp), so nothing here
/// depends on how the translation unit is compiled.

#include "unison/comm/communicator.hpp"
#include "unison/core/detail/aligned_bytes.hpp"
#include "unison/core/detail/convert.hpp"
#include "unison/core/error.hpp"
#include "unison/core/tensor.hpp"
#include "unison/parallel/detail/device_ops.hpp"

#include <cstddef>
#include <cstring>
#include <memory>
#include <string>
#include <utility>

namespace unison::detail {

/// Where training state lives: host memory (no ops) or the device of `ops`.
struct placement {
    std::shared_ptr<device_ops> ops;

    bool on_device() const noexcept { return ops != nullptr; }
    device where() const noexcept { return ops ? ops->location() : device::host(); }

    /// dst = D(A(src) * scale) over `n` elements, or with `accumulate`
    /// dst = D(A(dst) + A(src) * scale) (on the device: enqueued on the compute
    /// stream).
    void scale_cast(void* dst, dtype dst_type, const void* src, dtype src_type, std::size_t n,
                    double scale = 1.0, bool accumulate = false) const {
        if (ops) {
            ops->scale_cast(dst, dst_type, src, src_type, n, scale, accumulate);
        } else {
            convert_scale(dst, dst_type, src, src_type, n, scale, accumulate);
        }
    }
    /// Zeroes `n` elements of `type` at `dst`.
    void zero(void* dst, dtype type, std::size_t n) const {
        if (ops) {
            ops->zero(dst, n * size_of(type));
        } else {
            fill_zero(dst, type, n);
        }
    }
    /// Copies `bytes` from host memory to this placement's memory; returns when done.
    void copy_from_host(void* dst, const void* src, std::size_t bytes) const {
        if (ops) {
            ops->copy_from_host(dst, src, bytes);
        } else if (bytes != 0 && dst != src) {
            std::memcpy(dst, src, bytes);
        }
    }
    /// Copies `bytes` from this placement's memory to host memory, after the work
    /// enqueued before it; returns when done.
    void copy_to_host(void* dst, const void* src, std::size_t bytes) const {
        if (ops) {
            ops->copy_to_host(dst, src, bytes);
        } else if (bytes != 0 && dst != src) {
            std::memcpy(dst, src, bytes);
        }
    }
    /// Waits for the device work enqueued so far (no-op on the host).
    void synchronize() const {
        if (ops) {
            ops->synchronize();
        }
    }

    /// Orders `comm`'s device stream after the compute stream's work so far, so a
    /// collective launched next reads what compute wrote. No-op on the host.
    template <class C>
    void order_before(C& comm, const std::string& operation) const {
        if (!ops) {
            return;
        }
        if constexpr (device_communicator<C>) {
            if (void* s = comm.device_stream(); s != nullptr) {
                ops->order_before(s);
                return;
            }
        }
        throw argument_error(comm.rank(), operation,
                             "the data is on " + to_string(ops->location()) +
                                 " and the communicator moves no device memory (attach the "
                                 "thread backend with unison::cuda::use_device, or use the NCCL "
                                 "backend)");
    }
};

/// `bytes` bytes of uninitialized memory where `p` says: host memory (64-byte
/// aligned) or device memory from p's device_ops. Move-only.
class flat_buffer {
public:
    flat_buffer() = default;
    flat_buffer(std::size_t bytes, const placement& p) {
        if (!p.on_device()) {
            host_ = aligned_bytes(bytes);
            return;
        }
        size_ = bytes;
        if (bytes != 0) {
            device_ = p.ops->allocate(bytes);
            ops_ = p.ops;
        }
    }
    flat_buffer(flat_buffer&& o) noexcept
        : host_(std::move(o.host_)), ops_(std::move(o.ops_)),
          device_(std::exchange(o.device_, nullptr)), size_(std::exchange(o.size_, 0)) {}
    flat_buffer& operator=(flat_buffer&& o) noexcept {
        if (this != &o) {
            reset();
            host_ = std::move(o.host_);
            ops_ = std::move(o.ops_);
            device_ = std::exchange(o.device_, nullptr);
            size_ = std::exchange(o.size_, 0);
        }
        return *this;
    }
    flat_buffer(const flat_buffer&) = delete;
    flat_buffer& operator=(const flat_buffer&) = delete;
    ~flat_buffer() { reset(); }

    std::byte* data() const noexcept {
        return device_ != nullptr ? static_cast<std::byte*>(device_) : host_.data();
    }
    std::size_t size() const noexcept { return device_ != nullptr ? size_ : host_.size(); }
    explicit operator bool() const noexcept { return data() != nullptr; }

    void reset() noexcept {
        host_.reset();
        if (device_ != nullptr) {
            ops_->deallocate(device_);
            device_ = nullptr;
        }
        ops_.reset();
        size_ = 0;
    }

private:
    aligned_bytes host_;
    std::shared_ptr<device_ops> ops_; // keeps the allocator alive for the memory
    void* device_ = nullptr;
    std::size_t size_ = 0;
};

} // namespace unison::detail
