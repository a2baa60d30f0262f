// DDP on device through the NCCL backend: one process, one rank per visible GPU
// (ncclCommInitAll), each rank's gradients on its GPU. With one GPU this is a
// one-rank world, which still runs the device path end to end: the layout check
// and the rebuild staged through device memory, the multi-tensor pack on the
// compute stream, the all-reduce on NCCL's stream ordered by an event, the unpack.

#include "../support/reference.hpp"
#include "support.cuh"

#include <unison/ddp.hpp>
#include <unison/nccl.hpp>
#include <unison/parallel/device.cuh>

#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <thread>
#include <vector>

TEST_CASE("DDP on device with the NCCL backend averages like the double reference") {
    using namespace unison;
    int n = 0;
    REQUIRE(cudaGetDeviceCount(&n) == cudaSuccess);
    std::vector<ncclComm_t> comms(static_cast<std::size_t>(n));
    std::vector<int> devs(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) {
        devs[static_cast<std::size_t>(i)] = i;
    }
    REQUIRE(ncclCommInitAll(comms.data(), n, devs.data()) == ncclSuccess);
    const std::vector<std::size_t> sizes{1, 7, 1000, 300001, 5, 65536, 3, 4096, 77777, 13};
    std::vector<std::string> failures(static_cast<std::size_t>(n));
    std::vector<std::thread> threads;
    for (int rank = 0; rank < n; ++rank) {
        threads.emplace_back([&, rank] {
            try {
                cudaSetDevice(rank);
                cuda::stream comm_stream, compute;
                nccl_communicator comm(comms[static_cast<std::size_t>(rank)], comm_stream, rank);
                bucketed_reducer<nccl_communicator> reducer(
                    comm, {.bucket_bytes = 64 * 1024, .first_bucket_bytes = 4096});
                cuda::use_device(reducer, rank, compute);
                std::vector<cuda::device_buffer<float>> grads;
                std::vector<std::vector<float>> host(sizes.size());
                for (std::size_t g = 0; g < sizes.size(); ++g) {
                    grads.emplace_back(sizes[g], rank);
                    reducer.add(grads.back());
                    host[g].resize(sizes[g]);
                }
                reducer.start();
                for (int step = 0; step < 3; ++step) {
                    for (std::size_t g = 0; g < sizes.size(); ++g) {
                        for (std::size_t i = 0; i < sizes[g]; ++i) {
                            host[g][i] =
                                static_cast<float>(test::mix(step, rank, g * 7919 + i) >> 40) *
                                    0x1.0p-23f -
                                1.0f;
                        }
                        cudaMemcpyAsync(grads[g].data(), host[g].data(), sizes[g] * 4,
                                        cudaMemcpyHostToDevice, compute);
                    }
                    for (std::size_t g = sizes.size(); g-- > 0;) {
                        reducer.mark_ready(g);
                    }
                    (void)reducer.finish();
                    compute.synchronize();
                    for (std::size_t g = 0; g < sizes.size(); ++g) {
                        const std::vector<float> got = grads[g].to_host();
                        for (std::size_t i = 0; i < sizes[g]; ++i) {
                            double want = 0;
                            for (int q = 0; q < n; ++q) {
                                want += static_cast<float>(test::mix(step, q, g * 7919 + i) >> 40) *
                                            0x1.0p-23f -
                                        1.0f;
                            }
                            want /= n;
                            if (std::fabs(got[i] - want) > 1e-6) {
                                failures[static_cast<std::size_t>(rank)] =
                                    "step " + std::to_string(step) + " gradient " +
                                    std::to_string(g) + " element " + std::to_string(i) + ": " +
                                    std::to_string(got[i]) + " vs " + std::to_string(want);
                                return;
                            }
                        }
                    }
                }
            } catch (const std::exception& e) {
                failures[static_cast<std::size_t>(rank)] = e.what();
            }
        });
    }
    for (auto& t : threads) {
        t.join();
    }
    for (auto c : comms) {
        ncclCommDestroy(c);
    }
    for (int r = 0; r < n; ++r) {
        CHECK_MESSAGE(failures[static_cast<std::size_t>(r)].empty(),
                      "rank " << r << ": " << failures[static_cast<std::size_t>(r)]);
    }
}
