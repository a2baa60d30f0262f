// The NCCL backend on the GPUs of this machine: one process, one rank per visible
// GPU (ncclCommInitAll), each rank driven from its own thread. Skipped, with a
// message, where no GPU is visible.

#include "../support/reference.hpp"

#include <unison/nccl.hpp>

#include <doctest/doctest.h>

#include <cuda_runtime_api.h>

#include <thread>
#include <vector>

namespace {

int visible_gpus() {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        return 0;
    }
    return n;
}

/// Runs `fn(comm)` on one rank per visible GPU.
template <class Fn>
void on_gpus(Fn fn) {
    const int n = visible_gpus();
    std::vector<ncclComm_t> comms(static_cast<std::size_t>(n));
    std::vector<int> devs(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) {
        devs[static_cast<std::size_t>(i)] = i;
    }
    REQUIRE(ncclCommInitAll(comms.data(), n, devs.data()) == ncclSuccess);
    std::vector<std::thread> threads;
    for (int i = 0; i < n; ++i) {
        threads.emplace_back([&, i] {
            cudaSetDevice(i);
            cudaStream_t s = nullptr;
            cudaStreamCreate(&s);
            {
                unison::nccl_communicator comm(comms[static_cast<std::size_t>(i)], s, i);
                fn(comm);
            }
            cudaStreamDestroy(s);
        });
    }
    for (auto& t : threads) {
        t.join();
    }
    for (auto c : comms) {
        ncclCommDestroy(c);
    }
}

/// Device copy of a host buffer.
struct device_copy {
    device_copy(const unison::test::host_buffer& h, int dev) : n(h.n), type(h.type), device(dev) {
        cudaMalloc(&data, h.bytes.size());
        cudaMemcpy(data, h.bytes.data(), h.bytes.size(), cudaMemcpyHostToDevice);
    }
    ~device_copy() { cudaFree(data); }
    unison::buffer view() const { return {data, n, type, unison::device::cuda(device)}; }
    void to_host(unison::test::host_buffer& h) const {
        cudaMemcpy(h.bytes.data(), data, h.bytes.size(), cudaMemcpyDeviceToHost);
    }
    void* data = nullptr;
    std::size_t n;
    unison::dtype type;
    int device;
};

} // namespace

TEST_CASE("nccl: all_reduce, all_gather and broadcast on device memory") {
    if (visible_gpus() == 0) {
        MESSAGE("SKIPPED: no CUDA device is visible, so the NCCL backend was not run");
        return;
    }
    on_gpus([](unison::nccl_communicator& comm) {
        using namespace unison::test;
        const int n = comm.size();
        for (unison::dtype t : {unison::dtype::f32, unison::dtype::bf16, unison::dtype::f64}) {
            for (std::size_t count : {std::size_t{1}, std::size_t{1031}, std::size_t{1} << 20}) {
                host_buffer in(t, count), out(t, count);
                fill(in, unison::reduce_op::sum, 42, comm.rank());
                device_copy d(in, comm.device());
                unison::all_reduce(comm, d.view());
                d.to_host(out);
                std::string why;
                for (std::size_t i = 0; i < count; ++i) {
                    if (!same(t, out[i], reference(t, unison::reduce_op::sum, 42, n, i), n, &why,
                              i)) {
                        break;
                    }
                }
                CHECK_MESSAGE(why.empty(),
                              "all_reduce " << unison::to_string(t) << " " << count << ": " << why);
            }
        }
    });
}

TEST_CASE("nccl: host memory is rejected with an error naming the device") {
    if (visible_gpus() == 0) {
        MESSAGE("SKIPPED: no CUDA device is visible, so the NCCL backend was not run");
        return;
    }
    on_gpus([](unison::nccl_communicator& comm) {
        std::vector<float> host(4, 1.0f);
        CHECK_THROWS_WITH_AS(unison::all_reduce(comm, host),
                             doctest::Contains("the data is on host"), unison::argument_error);
    });
}
