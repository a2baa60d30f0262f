#pragma once

/// \file
/// Device memory as unison tensors: `cuda::device_buffer<T>`, a small owning
/// buffer of `T` on one CUDA device, and `cuda::device_view`, a non-owning view of
/// a raw device pointer. Both report `device::cuda(N)` through `tensor_traits`, so
/// every collective and training part takes them. Link `unison::cuda`; no CUDA
/// compiler is needed.

#include "unison/core/tensor.hpp"
#include "unison/cuda/check.hpp"
#include "unison/cuda/stream.hpp"

#include <cuda_runtime_api.h>

#include <cstddef>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace unison::cuda {

/// A view of `n` elements of `T` at the raw device pointer `p` on device `dev`.
template <element T>
view<T> device_view(T* p, std::size_t n, int dev) noexcept {
    return view<T>{p, n, device::cuda(dev)};
}

/// `count` elements of `T` in the memory of one CUDA device, allocated with
/// cudaMalloc (so 256-byte aligned) and freed on destruction. Move-only. The
/// elements are uninitialized; `zero` and `copy_from` fill them.
template <element T>
class device_buffer {
public:
    device_buffer() = default;
    /// Allocates `count` elements on device `dev` (the current device by default).
    explicit device_buffer(std::size_t count, int dev = current_device())
        : count_(count), dev_(dev) {
        if (count_ != 0) {
            device_guard guard(dev_);
            // cuda_runtime_api.h has only the untyped overload (the typed one is in
            // cuda_runtime.h), so this compiles without nvcc too.
            void* p = nullptr;
            UNISON_CHECK_CUDA(cudaMalloc(&p, count_ * sizeof(T)), -1,
                              "device_buffer of " + std::to_string(count_ * sizeof(T)) + " bytes");
            data_ = static_cast<T*>(p);
        }
    }
    /// A device copy of `host` on device `dev`.
    device_buffer(std::span<const T> host, int dev) : device_buffer(host.size(), dev) {
        copy_from(host);
    }
    device_buffer(device_buffer&& o) noexcept
        : data_(std::exchange(o.data_, nullptr)), count_(std::exchange(o.count_, 0)), dev_(o.dev_) {
    }
    device_buffer& operator=(device_buffer&& o) noexcept {
        if (this != &o) {
            release();
            data_ = std::exchange(o.data_, nullptr);
            count_ = std::exchange(o.count_, 0);
            dev_ = o.dev_;
        }
        return *this;
    }
    device_buffer(const device_buffer&) = delete;
    device_buffer& operator=(const device_buffer&) = delete;
    ~device_buffer() { release(); }

    T* data() noexcept { return data_; }
    const T* data() const noexcept { return data_; }
    std::size_t size() const noexcept { return count_; }
    int device_index() const noexcept { return dev_; }
    unison::view<T> view() noexcept { return {data_, count_, device::cuda(dev_)}; }
    unison::view<const T> view() const noexcept { return {data_, count_, device::cuda(dev_)}; }

    /// Copies `host` (exactly size() elements) in; returns once the copy has landed
    /// (a plain cudaMemcpy from pageable memory may return before its DMA completes,
    /// and a kernel on a non-blocking stream would not wait for it).
    void copy_from(std::span<const T> host) {
        check_size(host.size(), "copy_from");
        if (count_ != 0) {
            device_guard guard(dev_);
            UNISON_CHECK_CUDA(cudaMemcpyAsync(data_, host.data(), count_ * sizeof(T),
                                              cudaMemcpyHostToDevice, nullptr),
                              -1, "device_buffer::copy_from");
            UNISON_CHECK_CUDA(cudaStreamSynchronize(nullptr), -1, "device_buffer::copy_from");
        }
    }
    /// Copies the elements out to `host` (exactly size() elements), on the legacy
    /// default stream: synchronize the non-blocking streams that wrote them first.
    void copy_to(std::span<T> host) const {
        check_size(host.size(), "copy_to");
        if (count_ != 0) {
            UNISON_CHECK_CUDA(
                cudaMemcpy(host.data(), data_, count_ * sizeof(T), cudaMemcpyDeviceToHost), -1,
                "device_buffer::copy_to");
        }
    }
    /// The elements as a host vector; synchronous.
    std::vector<T> to_host() const {
        std::vector<T> h(count_);
        copy_to(h);
        return h;
    }
    /// Sets every element's bits to zero, ordered on `stream`.
    void zero(cudaStream_t stream = nullptr) {
        if (count_ != 0) {
            UNISON_CHECK_CUDA(cudaMemsetAsync(data_, 0, count_ * sizeof(T), stream), -1,
                              "device_buffer::zero");
        }
    }

private:
    static int current_device() {
        int d = 0;
        UNISON_CHECK_CUDA(cudaGetDevice(&d), -1, "device_buffer");
        return d;
    }
    void check_size(std::size_t n, const char* what) const {
        if (n != count_) {
            throw argument_error(-1, std::string("device_buffer::") + what,
                                 "the host span has " + std::to_string(n) +
                                     " elements and the buffer " + std::to_string(count_));
        }
    }
    void release() noexcept {
        if (data_ != nullptr) {
            cudaFree(data_);
            data_ = nullptr;
        }
    }

    T* data_ = nullptr;
    std::size_t count_ = 0;
    int dev_ = 0;
};

} // namespace unison::cuda

namespace unison {

template <element T>
struct tensor_traits<cuda::device_buffer<T>> {
    static void* data(cuda::device_buffer<T>& b) noexcept { return b.data(); }
    static const void* data(const cuda::device_buffer<T>& b) noexcept { return b.data(); }
    static std::size_t size(const cuda::device_buffer<T>& b) noexcept { return b.size(); }
    static dtype type(const cuda::device_buffer<T>&) noexcept { return dtype_of<T>; }
    static device location(const cuda::device_buffer<T>& b) noexcept {
        return device::cuda(b.device_index());
    }
};

static_assert(writable_tensor<cuda::device_buffer<float>&>);
static_assert(tensor<const cuda::device_buffer<float>&> &&
              !writable_tensor<const cuda::device_buffer<float>&>);

} // namespace unison
