#pragma once

/// \file
/// Small owning wrappers of CUDA runtime handles: `cuda::stream` (non-blocking),
/// `cuda::event` and `cuda::device_guard` (sets the current device for a scope).
/// Link `unison::cuda`; no CUDA compiler is needed.

#include "unison/cuda/check.hpp"

#include <cuda_runtime_api.h>

#include <utility>

namespace unison::cuda {

/// Makes `dev` the calling thread's current device for this scope, and restores
/// the previous one after.
class device_guard {
public:
    explicit device_guard(int dev) {
        UNISON_CHECK_CUDA(cudaGetDevice(&previous_), -1, "device_guard");
        if (previous_ != dev) {
            UNISON_CHECK_CUDA(cudaSetDevice(dev), -1, "device_guard");
        }
        set_ = dev;
    }
    device_guard(const device_guard&) = delete;
    device_guard& operator=(const device_guard&) = delete;
    ~device_guard() {
        if (previous_ != set_) {
            cudaSetDevice(previous_);
        }
    }

private:
    int previous_ = 0;
    int set_ = 0;
};

/// A CUDA stream created with cudaStreamNonBlocking (it does not synchronize with
/// the legacy default stream); destroyed with the object. Move-only.
class stream {
public:
    stream() {
        UNISON_CHECK_CUDA(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking), -1, "stream");
    }
    stream(stream&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
    stream& operator=(stream&& o) noexcept {
        if (this != &o) {
            reset();
            s_ = std::exchange(o.s_, nullptr);
        }
        return *this;
    }
    stream(const stream&) = delete;
    stream& operator=(const stream&) = delete;
    ~stream() { reset(); }

    cudaStream_t get() const noexcept { return s_; }
    operator cudaStream_t() const noexcept { return s_; } // NOLINT: a stream is its handle
    /// Blocks the host until everything enqueued so far has completed.
    void synchronize() const {
        UNISON_CHECK_CUDA(cudaStreamSynchronize(s_), -1, "stream::synchronize");
    }

private:
    void reset() noexcept {
        if (s_ != nullptr) {
            cudaStreamDestroy(s_);
            s_ = nullptr;
        }
    }
    cudaStream_t s_ = nullptr;
};

/// A CUDA event; without `timing`, created with cudaEventDisableTiming (the cheap
/// kind used for ordering streams). Move-only.
class event {
public:
    explicit event(bool timing = false) {
        UNISON_CHECK_CUDA(
            cudaEventCreateWithFlags(&e_, timing ? cudaEventDefault : cudaEventDisableTiming), -1,
            "event");
    }
    event(event&& o) noexcept : e_(std::exchange(o.e_, nullptr)) {}
    event& operator=(event&& o) noexcept {
        if (this != &o) {
            reset();
            e_ = std::exchange(o.e_, nullptr);
        }
        return *this;
    }
    event(const event&) = delete;
    event& operator=(const event&) = delete;
    ~event() { reset(); }

    cudaEvent_t get() const noexcept { return e_; }
    /// Records the event after the work enqueued so far on `s`.
    void record(cudaStream_t s) { UNISON_CHECK_CUDA(cudaEventRecord(e_, s), -1, "event::record"); }
    /// Makes `s` wait for the work this event was recorded after (no host wait).
    void make_wait(cudaStream_t s) const {
        UNISON_CHECK_CUDA(cudaStreamWaitEvent(s, e_, 0), -1, "event::make_wait");
    }

private:
    void reset() noexcept {
        if (e_ != nullptr) {
            cudaEventDestroy(e_);
            e_ = nullptr;
        }
    }
    cudaEvent_t e_ = nullptr;
};

} // namespace unison::cuda
