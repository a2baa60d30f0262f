#pragma once

// The device memory space and the NCCL backend's fixture (see
// tests/support/backends.hpp for what a fixture is). Needs the CUDA runtime (and
// NCCL for the fixture) but no CUDA compiler: unison-nccl-tests compiles it with the
// host compiler. The thread backend on a GPU, which needs nvcc, is in backends.cuh.

#include "../support/backends.hpp"

#include <unison/cuda/device_buffer.hpp>

#if UNISON_HAS_NCCL()
#include <unison/cuda/stream.hpp>
#include <unison/nccl.hpp>
#endif

#include <cstddef>
#include <cstdint>
#include <exception>
#include <span>
#include <thread>
#include <vector>

namespace unison::test {

/// A collective case's tensor on a GPU: the bytes of a host_buffer (its spare
/// byte included, so the data pointer is never null, even for 0 elements).
struct device_tensor {
    dtype type;
    std::size_t n;
    cuda::device_buffer<std::uint8_t> bytes;

    buffer view() { return {bytes.data(), n, type, device::cuda(bytes.device_index())}; }
};

/// Device memory: tensors on the communicator's GPU, copied there from the host
/// values. `read` synchronizes the communicator's stream before copying back: NCCL
/// enqueues its collectives on that stream, and the copy runs on the legacy default
/// stream, which is not ordered after a non-blocking one. (The thread backend on a
/// GPU returns once its results are complete, so there it finds nothing to wait for.)
struct device_space {
    using tensor = device_tensor;
    static constexpr bool on_host = false;

    template <device_communicator C>
    static device_tensor make(C& comm, const host_buffer& values) {
        const std::span<const std::uint8_t> bytes(
            reinterpret_cast<const std::uint8_t*>(values.bytes.data()), values.bytes.size());
        return {values.type, values.n,
                cuda::device_buffer<std::uint8_t>(bytes, comm.device_location().index)};
    }
    template <device_communicator C>
    static host_buffer read(C& comm, const device_tensor& t) {
        UNISON_CHECK_CUDA(cudaStreamSynchronize(static_cast<cudaStream_t>(comm.device_stream())),
                          comm.rank(), "device_space::read");
        host_buffer h(t.type, t.n);
        t.bytes.copy_to(std::span<std::uint8_t>(reinterpret_cast<std::uint8_t*>(h.bytes.data()),
                                                h.bytes.size()));
        return h;
    }
    /// Engines on this space enqueue their compute on the legacy default stream
    /// (see attach in backends.cuh), which orders these synchronous copies after
    /// it; the communicator's own stream is waited for first.
    template <device_communicator C>
    static void store(C& comm, buffer dst, const void* values) {
        UNISON_CHECK_CUDA(cudaStreamSynchronize(static_cast<cudaStream_t>(comm.device_stream())),
                          comm.rank(), "device_space::store");
        UNISON_CHECK_CUDA(
            cudaMemcpy(dst.data, values, dst.count * size_of(dst.type), cudaMemcpyHostToDevice),
            comm.rank(), "device_space::store");
    }
    template <device_communicator C>
    static void load(C& comm, const_buffer src, void* values) {
        UNISON_CHECK_CUDA(cudaStreamSynchronize(static_cast<cudaStream_t>(comm.device_stream())),
                          comm.rank(), "device_space::load");
        UNISON_CHECK_CUDA(
            cudaMemcpy(values, src.data, src.count * size_of(src.type), cudaMemcpyDeviceToHost),
            comm.rank(), "device_space::load");
    }
};

#if UNISON_HAS_NCCL()
namespace backend {

/// The NCCL backend: one rank per visible GPU in this process (ncclCommInitAll),
/// each driven from its own thread on its own stream, on device memory. A rank's
/// exception is rethrown here once every rank has finished.
struct nccl {
    using space = device_space;

    template <class F>
    static void run(F&& body) {
        int n = 0;
        REQUIRE(cudaGetDeviceCount(&n) == cudaSuccess);
        std::vector<ncclComm_t> comms(static_cast<std::size_t>(n));
        std::vector<int> devices(static_cast<std::size_t>(n));
        for (int i = 0; i < n; ++i) {
            devices[static_cast<std::size_t>(i)] = i;
        }
        REQUIRE(ncclCommInitAll(comms.data(), n, devices.data()) == ncclSuccess);
        std::vector<std::exception_ptr> errors(static_cast<std::size_t>(n));
        std::vector<std::thread> threads;
        for (int i = 0; i < n; ++i) {
            threads.emplace_back([&, i] {
                try {
                    UNISON_CHECK_CUDA(cudaSetDevice(i), i, "nccl fixture");
                    cuda::stream stream;
                    nccl_communicator comm(comms[static_cast<std::size_t>(i)], stream, i);
                    body(comm);
                } catch (...) {
                    errors[static_cast<std::size_t>(i)] = std::current_exception();
                }
            });
        }
        for (auto& t : threads) {
            t.join();
        }
        for (ncclComm_t c : comms) {
            ncclCommDestroy(c);
        }
        for (const std::exception_ptr& e : errors) {
            if (e) {
                std::rethrow_exception(e);
            }
        }
    }
};
static_assert(memory_space<nccl::space, nccl_communicator>);

} // namespace backend
#endif

} // namespace unison::test

#if UNISON_HAS_NCCL()
TYPE_TO_STRING_AS("nccl", unison::test::backend::nccl);
#endif
