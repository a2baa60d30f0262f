// The CUDA half of the mixed translation-unit test: compiled by nvcc, it builds a
// ddp and an fsdp engine, puts them on the GPU where one is visible
// (unison::cuda::use_device), and has host_side.cpp, compiled by the host compiler,
// train them. Results are checked against references computed here in double.
// Without a GPU the same objects stay in host memory: that half runs everywhere and
// still crosses the two kinds of translation unit.

#include "engines.hpp"

#include <unison/cuda/device_buffer.hpp>
#include <unison/cuda/stream.hpp>
#include <unison/parallel/device.cuh>
#include <unison/thread/device.cuh>

#include <doctest/doctest.h>

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

namespace {

using namespace unison;

bool gpu_visible() {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

const std::vector<std::size_t> sizes = {1000, 7, 4099};

/// Host data into `to`, which is host or device memory; returns when it is there.
void put(view<float> to, const std::vector<float>& from, cudaStream_t s) {
    if (to.location.is_host()) {
        std::memcpy(to.data, from.data(), from.size() * sizeof(float));
        return;
    }
    REQUIRE(cudaMemcpyAsync(to.data, from.data(), from.size() * sizeof(float),
                            cudaMemcpyHostToDevice, s) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
}

std::vector<float> get(view<float> from, cudaStream_t s) {
    std::vector<float> out(from.size);
    if (from.location.is_host()) {
        std::memcpy(out.data(), from.data, from.size * sizeof(float));
        return out;
    }
    REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
    REQUIRE(cudaMemcpy(out.data(), from.data, from.size * sizeof(float), cudaMemcpyDeviceToHost) ==
            cudaSuccess);
    return out;
}

/// On the GPU: attaches `comm` to device 0 and makes `compute`, the stream the
/// training objects compute on; on the host leaves both alone (the stream is null).
cudaStream_t place_rank(mixed::comm_type& comm, std::optional<cuda::stream>& compute,
                        bool on_device) {
    if (on_device) {
        cuda::use_device(comm, 0);
        compute.emplace();
    }
    return compute ? compute->get() : nullptr;
}

/// A ddp built here, synchronized by host_side.cpp, over `ranks` thread ranks.
void ddp_case(int ranks, bool on_device) {
    CAPTURE(ranks);
    CAPTURE(on_device);
    thread_world(ranks).run([&](mixed::comm_type& comm) {
        std::optional<cuda::stream> compute;
        const cudaStream_t s = place_rank(comm, compute, on_device);
        std::vector<std::vector<float>> host_p(sizes.size()), host_g(sizes.size());
        std::vector<cuda::device_buffer<float>> dev_p, dev_g;
        mixed::ddp_type dp(comm, {.bucket_bytes = 8192, .first_bucket_bytes = 1024});
        for (std::size_t t = 0; t < sizes.size(); ++t) {
            host_p[t].assign(sizes[t], 0.5f);
            host_g[t].assign(sizes[t], 0.0f);
            if (on_device) {
                dev_p.emplace_back(std::span<const float>(host_p[t]), 0);
                dev_g.emplace_back(sizes[t], 0);
            }
        }
        for (std::size_t t = 0; t < sizes.size(); ++t) {
            if (on_device) {
                dp.add_parameter(dev_p[t], dev_g[t], "p" + std::to_string(t));
            } else {
                dp.add_parameter(host_p[t], host_g[t], "p" + std::to_string(t));
            }
        }
        if (on_device) {
            cuda::use_device(dp, 0, s);
        }
        dp.start();
        auto grad = [&](std::size_t t) {
            return on_device ? view<float>{dev_g[t].data(), sizes[t], device::cuda(0)}
                             : view<float>{host_g[t].data(), sizes[t]};
        };
        for (int step = 0; step < 3; ++step) {
            for (std::size_t t = 0; t < sizes.size(); ++t) {
                std::vector<float> g(sizes[t]);
                for (std::size_t i = 0; i < g.size(); ++i) {
                    g[i] = static_cast<float>(mixed::grad_value(step, comm.rank(), t, i));
                }
                put(grad(t), g, s);
            }
            CHECK(mixed::ddp_sync(dp, sizes.size())); // in host_side.cpp
            for (std::size_t t = 0; t < sizes.size(); ++t) {
                const std::vector<float> got = get(grad(t), s);
                long bad = -1;
                for (std::size_t i = 0; i < got.size() && bad < 0; ++i) {
                    double want = 0.0;
                    for (int r = 0; r < ranks; ++r) {
                        want += mixed::grad_value(step, r, t, i);
                    }
                    want /= ranks;
                    if (!(std::abs(got[i] - want) <= 1e-6 * ranks)) {
                        bad = static_cast<long>(i);
                    }
                }
                CHECK_MESSAGE(bad < 0, "step " << step << " tensor " << t << " element " << bad);
            }
        }
    });
}

/// An fsdp engine (ZeRO-3, SGD) built here, trained by host_side.cpp; its
/// parameters must follow p -= lr * mean over ranks of the gradients.
void fsdp_case(int ranks, bool on_device) {
    CAPTURE(ranks);
    CAPTURE(on_device);
    constexpr double lr = 0.1;
    constexpr int steps = 3;
    auto initial = [](std::size_t t, std::size_t i) {
        return 0.25 * mixed::grad_value(-1, 0, t, i);
    };
    thread_world(ranks).run([&](mixed::comm_type& comm) {
        std::optional<cuda::stream> compute;
        const cudaStream_t s = place_rank(comm, compute, on_device);
        mixed::fsdp_type engine(comm, {.optimizer = {.lr = lr}});
        if (on_device) {
            cuda::use_device(engine, 0, s);
        }
        std::vector<std::vector<float>> init(sizes.size());
        std::vector<unit_handle> units;
        for (std::size_t t = 0; t < sizes.size(); ++t) {
            init[t].resize(sizes[t]);
            for (std::size_t i = 0; i < sizes[t]; ++i) {
                init[t][i] = static_cast<float>(initial(t, i));
            }
            units.push_back(engine.add_unit({{"p" + std::to_string(t), init[t]}}));
        }
        engine.start();
        int step = 0;
        const mixed::gradient_writer write = [&](std::size_t k, std::size_t, view<float> g) {
            std::vector<float> v(g.size);
            for (std::size_t i = 0; i < v.size(); ++i) {
                v[i] = static_cast<float>(mixed::grad_value(step, comm.rank(), k, i));
            }
            put(g, v, s);
        };
        for (; step < steps; ++step) {
            CHECK(mixed::fsdp_step(engine, units, write) > 0.0); // in host_side.cpp
        }
        const auto values =
            mixed::fsdp_values(engine, units, [&](view<float> v) { return get(v, s); });
        REQUIRE(values.size() == sizes.size());
        for (std::size_t t = 0; t < sizes.size(); ++t) {
            long bad = -1;
            for (std::size_t i = 0; i < sizes[t] && bad < 0; ++i) {
                double want = initial(t, i);
                for (int k = 0; k < steps; ++k) {
                    double mean = 0.0;
                    for (int r = 0; r < ranks; ++r) {
                        mean += mixed::grad_value(k, r, t, i);
                    }
                    want -= lr * mean / ranks;
                }
                if (!(std::abs(values[t][i] - want) <= 1e-5)) {
                    bad = static_cast<long>(i);
                }
            }
            CHECK_MESSAGE(bad < 0, "tensor " << t << " element " << bad);
        }
    });
}

} // namespace

TEST_CASE("a ddp and an fsdp engine built in a .cu file train from a .cpp file (host memory)") {
    for (int ranks : {1, 2, 3}) {
        ddp_case(ranks, false);
        fsdp_case(ranks, false);
    }
}

TEST_CASE("the same with their state on the GPU (thread backend, one GPU)") {
    if (!gpu_visible()) {
        MESSAGE("no CUDA device is visible: the device half was compiled but not run");
        return;
    }
    for (int ranks : {1, 2, 4}) {
        ddp_case(ranks, true);
        fsdp_case(ranks, true);
    }
}
