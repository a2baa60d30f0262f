// The thread backend on device memory (unison/thread/device.cuh): N ranks as
// threads sharing one GPU, each on its own stream, collectives as kernels reading
// the peers' buffers. Results are checked against the serial double-precision
// reference of tests/support/reference.hpp; DDP on device against DDP on the host
// with the same gradients, and both against the double-precision mean.

#include "../support/reference.hpp"
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

namespace {

using namespace unison;

/// A device copy of a test host buffer on cuda:0.
struct device_bytes {
    explicit device_bytes(const test::host_buffer& h)
        : type(h.type), n(h.n), bytes(h.bytes.size(), 0) {
        bytes.copy_from(std::span<const std::uint8_t>(
            reinterpret_cast<const std::uint8_t*>(h.bytes.data()), h.bytes.size()));
    }
    buffer view() { return {bytes.data(), n, type, device::cuda(0)}; }
    void to_host(test::host_buffer& h) const {
        bytes.copy_to(std::span<std::uint8_t>(reinterpret_cast<std::uint8_t*>(h.bytes.data()),
                                              h.bytes.size()));
    }
    dtype type;
    std::size_t n;
    cuda::device_buffer<std::uint8_t> bytes;
};

template <class Fn>
void on_device_worlds(std::initializer_list<int> sizes, Fn fn) {
    for (int n : sizes) {
        CAPTURE(n);
        thread_world(n).run([&](thread_communicator& comm) {
            cuda::attach(comm, 0);
            fn(comm);
        });
    }
}

std::string check_all(const test::host_buffer& got, dtype t, reduce_op op, std::uint64_t seed,
                      int ranks, std::size_t first = 0) {
    std::string why;
    for (std::size_t i = 0; i < got.n; ++i) {
        if (!test::same(t, got[i], test::reference(t, op, seed, ranks, first + i), ranks, &why,
                        i)) {
            break;
        }
    }
    return why;
}

} // namespace

TEST_CASE("thread backend on device: all_reduce, in place and out of place") {
    on_device_worlds({1, 2, 3, 4, 8}, [](thread_communicator& comm) {
        const int n = comm.size();
        for (dtype t : {dtype::f32, dtype::bf16, dtype::f16, dtype::f64, dtype::i32}) {
            for (reduce_op op : {reduce_op::sum, reduce_op::avg, reduce_op::max, reduce_op::prod}) {
                if (op == reduce_op::avg && !is_floating(t)) {
                    continue;
                }
                for (std::size_t count : test::test_counts(t)) {
                    for (bool in_place : {true, false}) {
                        test::host_buffer in(t, count), out(t, count);
                        test::fill(in, op, 17, comm.rank());
                        device_bytes d_in(in), d_out(out);
                        if (in_place) {
                            all_reduce(comm, d_in.view(), op);
                            d_in.to_host(out);
                        } else {
                            all_reduce(comm, d_in.view(), d_out.view(), op);
                            d_out.to_host(out);
                        }
                        const std::string why = check_all(out, t, op, 17, n);
                        CHECK_MESSAGE(why.empty(),
                                      test::case_name("all_reduce", t, op, count, in_place)
                                          << ": " << why);
                    }
                }
            }
        }
    });
}

TEST_CASE("thread backend on device: reduce_scatter, all_gather in place, broadcast, all_to_all") {
    on_device_worlds({2, 3, 4}, [](thread_communicator& comm) {
        const int n = comm.size(), r = comm.rank();
        const auto un = static_cast<std::size_t>(n);
        for (dtype t : {dtype::f32, dtype::bf16}) {
            for (std::size_t count : {std::size_t{1}, std::size_t{1031}, std::size_t{65537}}) {
                // reduce_scatter: rank r receives block r of the sum.
                test::host_buffer in(t, count * un), out(t, count);
                test::fill(in, reduce_op::sum, 5, r);
                device_bytes d_in(in), d_out(out);
                reduce_scatter(comm, d_in.view(), d_out.view(), reduce_op::sum);
                d_out.to_host(out);
                std::string why = check_all(out, t, reduce_op::sum, 5, n, count * r);
                CHECK_MESSAGE(why.empty(), "reduce_scatter " << count << ": " << why);

                // all_gather, in place: block q is rank q's input.
                test::host_buffer all(t, count * un);
                for (std::size_t i = 0; i < count; ++i) {
                    all.set(count * r + i, test::input_value(t, reduce_op::sum, 9, r, i));
                }
                device_bytes d_all(all);
                all_gather(comm, d_all.view()); // in place: my block holds my input
                d_all.to_host(all);
                bool ok = true;
                for (int q = 0; q < n && ok; ++q) {
                    for (std::size_t i = 0; i < count && ok; ++i) {
                        ok = all[count * q + i] == test::input_value(t, reduce_op::sum, 9, q, i);
                    }
                }
                CHECK_MESSAGE(ok, "all_gather " << count);

                // broadcast from the last rank, out of place.
                test::host_buffer b(t, count), got(t, count);
                test::fill(b, reduce_op::sum, 13, n - 1);
                device_bytes d_b(b), d_got(got);
                broadcast(comm, d_b.view(), d_got.view(), n - 1);
                d_got.to_host(got);
                ok = true;
                for (std::size_t i = 0; i < count && ok; ++i) {
                    ok = got[i] == test::input_value(t, reduce_op::sum, 13, n - 1, i);
                }
                CHECK_MESSAGE(ok, "broadcast " << count);

                // all_to_all: block q of my output is block r of rank q's input.
                test::host_buffer a(t, count * un), a_out(t, count * un);
                test::fill(a, reduce_op::sum, 21, r);
                device_bytes d_a(a), d_a_out(a_out);
                all_to_all(comm, d_a.view(), d_a_out.view());
                d_a_out.to_host(a_out);
                ok = true;
                for (int q = 0; q < n && ok; ++q) {
                    for (std::size_t i = 0; i < count && ok; ++i) {
                        ok = a_out[count * q + i] ==
                             test::input_value(t, reduce_op::sum, 21, q, count * r + i);
                    }
                }
                CHECK_MESSAGE(ok, "all_to_all " << count);
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
        cuda::attach(comm, 0);
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
            cuda::attach(comm, 0);
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
            reducer.finish();
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
