#pragma once

/// \file
/// Device memory on the thread backend: N ranks as threads of one process sharing
/// one GPU, each with its own stream, with collectives as kernels that read the
/// peers' buffers (kernels/reduce.cuh) and device-to-device copies. DDP, FSDP and
/// ZeRO then run with N ranks where only one GPU exists (NCCL cannot put two ranks
/// on one GPU).
///
///     #include <unison/thread/device.cuh>          // in a .cu file
///     unison::thread_world(4).run([](unison::thread_communicator& comm) {
///         unison::cuda::use_device(comm, 0);        // this rank: cuda:0, its own stream
///         unison::cuda::device_buffer<float> g(n);
///         unison::all_reduce(comm, g);              // data on cuda:0
///     });
///
/// A collective on device data returns once its results are complete on the
/// device (as the NCCL backend's do); the host waits for the rank's stream at most
/// the communicator's timeout. Work the rank enqueued on its stream before the
/// call is ordered before it: use `stream_of(comm)` for compute that produces the
/// inputs, or order another stream with an event. A non-blocking call is enqueued
/// when the rank's progress thread reaches it, not at submit (unlike NCCL): read
/// its results, or enqueue more work on `stream_of(comm)`, only after wait() or a
/// true test(). Send and recv remain host-only. Every rank's data must be on the
/// same GPU (the kernels read the peers' buffers without peer access).

#include "unison/core/error.hpp"
#include "unison/cuda/check.hpp"
#include "unison/cuda/stream.hpp"
#include "unison/kernels/reduce.cuh"
#include "unison/thread/thread_communicator.hpp"
#include "unison/thread/tuning.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <thread>

namespace unison::cuda {

namespace detail {

/// The device mover of one rank (see thread/detail/device_mover.hpp).
class thread_device_mover final : public unison::detail::device_mover {
public:
    /// On device `dev`, enqueuing on `s`; a stream is created (and owned) when `s` is null.
    thread_device_mover(int dev, cudaStream_t s) : device_(dev) {
        device_guard guard(dev);
        if (s == nullptr) {
            owned_ = std::make_shared<cuda::stream>();
            stream_ = owned_->get();
        } else {
            stream_ = s;
        }
        ready_ = event();
        done_ = event();
        complete_ = event();
    }

    int device() const override { return device_; }
    void* stream() const override { return stream_; }

    void* record_ready() override {
        device_guard guard(device_);
        ready_.record(stream_);
        return ready_.get();
    }

    void move(const collective_call* const* calls, void* const* ready, int rank, int n) override {
        device_guard guard(device_);
        for (int q = 0; q < n; ++q) {
            if (q != rank) {
                UNISON_CHECK_CUDA(cudaStreamWaitEvent(stream_, static_cast<cudaEvent_t>(ready[q])),
                                  rank, "device collective");
            }
        }
        const collective_call& call = *calls[rank];
        const std::size_t es = size_of(call.type);
        auto at = [es](const void* p, std::size_t elements) {
            return static_cast<const std::byte*>(p) + elements * es;
        };
        auto at_mut = [es](void* p, std::size_t elements) {
            return static_cast<std::byte*>(p) + elements * es;
        };
        auto copy = [&](void* dst, const void* src, std::size_t elements) {
            if (dst != src && elements != 0) {
                UNISON_CHECK_CUDA(
                    cudaMemcpyAsync(dst, src, elements * es, cudaMemcpyDeviceToDevice, stream_),
                    rank, std::string(to_string(call.op)));
            }
        };
        const bool reduces = call.op == operation::all_reduce || call.op == operation::reduce ||
                             call.op == operation::reduce_scatter;
        if (reduces && n > kernels::max_reduce_ranks) {
            throw argument_error(rank, to_string(call.op),
                                 "device reductions on the thread backend combine at most " +
                                     std::to_string(kernels::max_reduce_ranks) + " ranks, not " +
                                     std::to_string(n));
        }
        const int divisor = call.reduction == reduce_op::avg ? n : 1;
        switch (call.op) {
        case operation::all_reduce:
        case operation::reduce: {
            // My share of everyone's input, written to every output (or the root's).
            const auto [lo, hi] = thread_tuning::share_of(call.count, es, n, rank);
            if (lo == hi) {
                return;
            }
            kernels::reduce_pointers p;
            int outs = 0;
            for (int q = 0; q < n; ++q) {
                p.in[q] = at(calls[q]->send, lo);
                if (call.op == operation::all_reduce || q == call.root) {
                    p.out[outs++] = at_mut(calls[q]->recv, lo);
                }
            }
            kernels::device_reduce(call.type, call.reduction, p, n, outs, hi - lo, divisor,
                                   stream_);
            return;
        }
        case operation::reduce_scatter: {
            kernels::reduce_pointers p;
            for (int q = 0; q < n; ++q) {
                p.in[q] = at(calls[q]->send, call.count * static_cast<std::size_t>(rank));
            }
            p.out[0] = call.recv;
            kernels::device_reduce(call.type, call.reduction, p, n, 1, call.count, divisor,
                                   stream_);
            return;
        }
        case operation::all_gather:
            for (int q = 0; q < n; ++q) {
                copy(at_mut(call.recv, call.count * static_cast<std::size_t>(q)), calls[q]->send,
                     call.count);
            }
            return;
        case operation::all_gatherv: {
            std::size_t offset = 0;
            for (int q = 0; q < n; ++q) {
                const std::size_t c = call.counts[static_cast<std::size_t>(q)];
                copy(at_mut(call.recv, offset), calls[q]->send, c);
                offset += c;
            }
            return;
        }
        case operation::broadcast:
            copy(call.recv, calls[call.root]->send, call.count);
            return;
        case operation::all_to_all:
            for (int q = 0; q < n; ++q) {
                copy(at_mut(call.recv, call.count * static_cast<std::size_t>(q)),
                     at(calls[q]->send, call.count * static_cast<std::size_t>(rank)), call.count);
            }
            return;
        default:
            throw argument_error(rank, to_string(call.op),
                                 "not a collective the thread backend runs on device memory");
        }
    }

    void* record_done() override {
        device_guard guard(device_);
        done_.record(stream_);
        return done_.get();
    }

    void wait_peers(void* const* done, int n) override {
        device_guard guard(device_);
        for (int q = 0; q < n; ++q) {
            if (done[q] != done_.get()) {
                UNISON_CHECK_CUDA(cudaStreamWaitEvent(stream_, static_cast<cudaEvent_t>(done[q])),
                                  -1, "device collective");
            }
        }
    }

    void synchronize(int rank, const std::string& label,
                     std::chrono::milliseconds timeout) override {
        device_guard guard(device_);
        complete_.record(stream_);
        const auto deadline = std::chrono::steady_clock::now() + timeout;
        for (std::size_t polls = 1;; ++polls) {
            const cudaError_t q = cudaEventQuery(complete_.get());
            if (q == cudaSuccess) {
                return;
            }
            if (q != cudaErrorNotReady) {
                unison::detail::throw_cuda_error(q, rank, label, "cudaEventQuery");
            }
            if ((polls & 63) == 0 && std::chrono::steady_clock::now() >= deadline) {
                throw timeout_error(rank, label,
                                    "the device work was not complete after " +
                                        std::to_string(timeout.count()) + " ms",
                                    0);
            }
            std::this_thread::yield();
        }
    }

    std::unique_ptr<unison::detail::device_mover> clone() const override {
        auto m = std::make_unique<thread_device_mover>(device_, stream_);
        m->owned_ = owned_; // the stream lives as long as any communicator using it
        return m;
    }

private:
    int device_;
    std::shared_ptr<cuda::stream> owned_;
    cudaStream_t stream_ = nullptr;
    event ready_;
    event done_;
    event complete_;
};

} // namespace detail

/// Puts this rank of a thread world on CUDA device `dev` (the verb that puts the
/// engines' state on a device too: parallel/device.cuh): device data is then moved
/// on `stream` (a new non-blocking stream owned by the communicator when null).
/// Call it on every rank that passes device memory; communicators split from
/// `comm` afterwards inherit the device and stream.
inline void use_device(thread_communicator& comm, int dev, cudaStream_t stream = nullptr) {
    comm.install_device(std::make_unique<detail::thread_device_mover>(dev, stream));
}

/// The former name of use_device(comm, dev, stream).
[[deprecated("unison::cuda::attach is now unison::cuda::use_device")]] inline void
attach(thread_communicator& comm, int dev, cudaStream_t stream = nullptr) {
    use_device(comm, dev, stream);
}

/// The stream a rank's device collectives run on (null when none is attached).
inline cudaStream_t stream_of(const thread_communicator& comm) noexcept {
    return static_cast<cudaStream_t>(comm.device_stream());
}

} // namespace unison::cuda
