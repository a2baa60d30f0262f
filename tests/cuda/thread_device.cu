// The thread backend on device memory (unison/thread/device.cuh): N ranks as
// threads sharing one GPU, each on its own stream, collectives as kernels reading
// the peers' buffers. Results are checked against the serial double-precision
// reference of tests/support/reference.hpp; DDP on device against DDP on the host
// with the same gradients, and both against the double-precision mean.

#include "../collectives/cases.hpp"
#include "backends.hpp"
#include "support.cuh"

#include <unison/comm.hpp>
#include <unison/ddp.hpp>
#include <unison/parallel/device.cuh>
#include <unison/thread.hpp>
#include <unison/thread/device.cuh>

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

using namespace unison;

// The collective suite runs on the thread backend on a GPU at 1 to 4 ranks
// (collectives.cu); this is a larger world of the reduction kernels.
TEST_CASE("thread backend on device: all_reduce at 8 ranks, in place and out of place") {
    thread_world(8).run([](thread_communicator& comm) {
        cuda::use_device(comm, 0);
        const int n = comm.size();
        for (dtype t : {dtype::f32, dtype::bf16, dtype::f16, dtype::f64, dtype::i32, dtype::u64}) {
            for (reduce_op op : {reduce_op::sum, reduce_op::avg, reduce_op::max, reduce_op::prod}) {
                if (op == reduce_op::avg && !is_floating(t)) {
                    continue;
                }
                for (std::size_t count : test::test_counts(t)) {
                    for (bool in_place : {true, false}) {
                        auto in = test::device_space::make(
                            comm, test::filled(t, count, op, 17, comm.rank()));
                        auto out = test::device_space::make(comm, test::host_buffer(t, count));
                        if (in_place) {
                            all_reduce(comm, in.view(), op);
                        } else {
                            all_reduce(comm, in.view(), out.view(), op);
                        }
                        const test::host_buffer got =
                            test::device_space::read(comm, in_place ? in : out);
                        std::string why;
                        for (std::size_t i = 0; i < count; ++i) {
                            if (!test::same(t, got[i], test::reference(t, op, 17, n, i), n, &why,
                                            i)) {
                                break;
                            }
                        }
                        CHECK_MESSAGE(why.empty(),
                                      test::case_name("all_reduce", t, op, count, in_place)
                                          << ": " << why);
                    }
                }
            }
        }
    });
}

TEST_CASE("thread backend on device: misuse is named before any data moves") {
    // No device attached.
    CHECK_THROWS_WITH_AS(thread_world(2).run([](thread_communicator& comm) {
        cuda::device_buffer<float> g(8, 0);
        all_reduce(comm, g);
    }),
                         doctest::Contains("no device is attached"), argument_error);
    // One rank passes host memory, the others device memory.
    CHECK_THROWS_WITH_AS(thread_world(3).run([](thread_communicator& comm) {
        cuda::use_device(comm, 0);
        cuda::device_buffer<float> g(8, 0);
        std::vector<float> h(8, 1.0f);
        if (comm.rank() == 1) {
            all_reduce(comm, h);
        } else {
            all_reduce(comm, g);
        }
    }),
                         doctest::Contains("passes data on"), mismatch_error);
}

namespace {

/// Steps of DDP over `sizes` gradients with the reducer `R`, gradients on `dev`
/// (host or cuda:0); returns every rank's final gradients as doubles.
template <class... Policies>
std::vector<std::vector<double>> run_ddp(int ranks, bool on_device, int steps,
                                         const std::vector<std::size_t>& sizes) {
    std::vector<std::vector<double>> result(static_cast<std::size_t>(ranks));
    thread_world(ranks).run([&](thread_communicator& comm) {
        if (on_device) {
            cuda::use_device(comm, 0);
        }
        cuda::stream compute;
        std::vector<std::vector<float>> host(sizes.size());
        std::vector<cuda::device_buffer<float>> dev;
        bucketed_reducer<thread_communicator, Policies...> reducer(
            comm, {.bucket_bytes = 64 * 1024, .first_bucket_bytes = 4096});
        if (on_device) {
            cuda::use_device(reducer, 0, compute);
        }
        for (std::size_t g = 0; g < sizes.size(); ++g) {
            host[g].resize(sizes[g]);
            if (on_device) {
                dev.emplace_back(sizes[g], 0);
                reducer.add(dev.back(), "g" + std::to_string(g));
            } else {
                reducer.add(host[g], "g" + std::to_string(g));
            }
        }
        reducer.start();
        // Where gradient g lives now: in its bucket with gradients_in_buckets (the
        // view moves at the rebuild), else the registered tensor.
        auto target = [&](std::size_t g) -> float* {
            if constexpr (decltype(reducer)::config::gradient_memory::in_buckets) {
                return reducer.template gradient<float>(g).data;
            } else {
                return on_device ? dev[g].data() : host[g].data();
            }
        };
        for (int step = 0; step < steps; ++step) {
            for (std::size_t g = 0; g < sizes.size(); ++g) {
                for (std::size_t i = 0; i < sizes[g]; ++i) {
                    host[g][i] =
                        static_cast<float>(test::mix(step, comm.rank(), g * 1000003 + i) >> 40) *
                            0x1.0p-23f -
                        1.0f;
                }
                if (on_device) {
                    UNISON_CHECK_CUDA(cudaMemcpyAsync(target(g), host[g].data(),
                                                      sizes[g] * sizeof(float),
                                                      cudaMemcpyHostToDevice, compute),
                                      comm.rank(), "test");
                } else if (target(g) != host[g].data()) {
                    std::memcpy(target(g), host[g].data(), sizes[g] * sizeof(float));
                }
            }
            // Ready in a rank-dependent order; the last gradient unused on odd steps.
            for (std::size_t k = 0; k < sizes.size(); ++k) {
                const std::size_t g =
                    (k * 7 + static_cast<std::size_t>(comm.rank())) % sizes.size();
                if (g == sizes.size() - 1 && step % 2 == 1) {
                    continue;
                }
                reducer.mark_ready(g);
            }
            (void)reducer.finish();
        }
        compute.synchronize();
        for (std::size_t g = 0; g < sizes.size(); ++g) {
            if (on_device) {
                UNISON_CHECK_CUDA(cudaMemcpy(host[g].data(), target(g), sizes[g] * sizeof(float),
                                             cudaMemcpyDeviceToHost),
                                  comm.rank(), "test");
            } else if (target(g) != host[g].data()) {
                std::memcpy(host[g].data(), target(g), sizes[g] * sizeof(float));
            }
        }
        auto& out = result[static_cast<std::size_t>(comm.rank())];
        for (const auto& v : host) {
            out.insert(out.end(), v.begin(), v.end());
        }
    });
    return result;
}

} // namespace

TEST_CASE("DDP on device (thread backend, one GPU) equals DDP on the host") {
    const std::vector<std::size_t> sizes{1, 7, 1000, 300001, 5, 65536, 3, 4096, 77777, 13};
    for (int ranks : {2, 3, 4, 8}) {
        CAPTURE(ranks);
        // Step 3 (odd: the last gradient unused, reduced as zero) after the rebuild.
        const auto host = run_ddp<>(ranks, false, 4, sizes);
        const auto dev = run_ddp<>(ranks, true, 4, sizes);
        const auto dev_in_buckets = run_ddp<policy::gradients_in_buckets>(ranks, true, 4, sizes);
        const auto host_in_buckets = run_ddp<policy::gradients_in_buckets>(ranks, false, 4, sizes);
        for (int r = 0; r < ranks; ++r) {
            const auto& h = host[static_cast<std::size_t>(r)];
            const auto& d = dev[static_cast<std::size_t>(r)];
            const auto& b = dev_in_buckets[static_cast<std::size_t>(r)];
            const auto& hb = host_in_buckets[static_cast<std::size_t>(r)];
            REQUIRE(h.size() == d.size());
            long bad = -1, bad_b = -1;
            for (std::size_t i = 0; i < h.size(); ++i) {
                if (bad < 0 && std::fabs(h[i] - d[i]) > 1e-6) {
                    bad = static_cast<long>(i);
                }
                if (bad_b < 0 && std::fabs(hb[i] - b[i]) > 1e-6) {
                    bad_b = static_cast<long>(i);
                }
            }
            CHECK_MESSAGE(bad < 0, "rank " << r << ": device differs from host at " << bad);
            CHECK_MESSAGE(bad_b < 0, "rank " << r
                                             << ", gradients_in_buckets: device differs "
                                                "from host at "
                                             << bad_b);
        }
        // The averages themselves, against the double-precision mean of the inputs.
        std::size_t at = 0;
        bool ok = true;
        for (std::size_t g = 0; g < sizes.size() && ok; ++g) {
            for (std::size_t i = 0; i < sizes[g] && ok; ++i, ++at) {
                double want = 0;
                for (int q = 0; q < ranks; ++q) {
                    const float v =
                        static_cast<float>(test::mix(3, q, g * 1000003 + i) >> 40) * 0x1.0p-23f -
                        1.0f;
                    want += g == sizes.size() - 1 ? 0.0 : v; // step 3: the last is unused
                }
                want /= ranks;
                ok = std::fabs(dev[0][at] - want) <= 1e-6;
                CHECK_MESSAGE(ok, "gradient " << g << " element " << i << ": " << dev[0][at]
                                              << " vs " << want);
            }
        }
    }
}
