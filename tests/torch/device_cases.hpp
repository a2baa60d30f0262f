#pragma once

// Where a module's tensors are against where the engine keeps its state, checked
// before anything moves: a module on a GPU without a device setup, a CPU module
// with one, a GPU module with a buffer or parameter elsewhere. These run without a
// GPU: the "GPU" tensors are host memory tagged cuda:N (at::for_blob), which the
// wrappers must refuse before any read, write or collective touches them; the
// setups record whether they were applied. The GPU training itself is
// tests/torch/cuda.cpp.

#include "../collectives/cases.hpp"
#include "models.hpp"

#include <unison/torch.hpp>

#include <doctest/doctest.h>

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace unison::test {

/// A tensor that says it is on cuda:`dev` over host memory `mem` (never dereferenced).
inline at::Tensor tagged_cuda(std::vector<float>& mem, int dev) {
    const c10::Device d(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(dev));
    return at::for_blob(mem.data(), {static_cast<std::int64_t>(mem.size())})
        .options(at::TensorOptions().dtype(at::kFloat).device(d))
        .target_device(d)
        .make_tensor();
}

/// One parameter "w" on (tagged) cuda:`dev`, optionally a CPU buffer "stats".
struct tagged_module : ::torch::nn::Module {
    tagged_module(std::vector<float>& mem, int dev, bool cpu_buffer) {
        register_parameter("w", tagged_cuda(mem, dev));
        if (cpu_buffer) {
            register_buffer("stats", at::zeros({3}));
        }
    }
};

/// A setup for `Engine` on cuda:`dev` that only records being applied.
template <class Engine>
device_setup<Engine> recording_setup(int dev, bool& applied) {
    return device_setup<Engine>(device::cuda(dev), [&applied](Engine&) { applied = true; });
}

/// Constructs one wrapper with `make`; expects an argument_error whose message
/// holds every string of `expect`, a setup never applied and `mem` untouched.
template <class Make>
void expect_refused(outcome& o, const std::string& what, Make make,
                    const std::vector<std::string>& expect, const bool& applied,
                    const std::vector<float>& mem, const std::vector<float>& before) {
    try {
        make();
        o.expect(false, what + ": accepted");
    } catch (const argument_error& e) {
        const std::string message = e.what();
        for (const std::string& s : expect) {
            o.expect(message.find(s) != std::string::npos,
                     what + ": the error should say '" + s + "': " + message);
        }
    }
    o.expect(!applied, what + ": the device setup was applied");
    o.expect(mem == before, what + ": the tensor's memory changed");
}

template <class Wrapper, communicator C, class Make>
void torch_device_refusals(C& comm, outcome& o, const std::string& kind, Make construct) {
    using engine_type = typename Wrapper::engine_type;
    std::mt19937 gen(static_cast<std::uint32_t>(17 + comm.rank()));
    std::normal_distribution<float> normal;
    std::vector<float> mem(12);
    for (float& x : mem) {
        x = normal(gen);
    }
    const std::vector<float> before = mem;
    bool applied = false;

    expect_refused(
        o, kind + ", a GPU module without a setup",
        [&] {
            auto m = std::make_shared<tagged_module>(mem, 0, false);
            construct(m, std::nullopt);
        },
        {"parameter 'w' is on cuda:0", "device setup", "on_device"}, applied, mem, before);
    expect_refused(
        o, kind + ", a CPU module with a setup for cuda:1",
        [&] {
            auto m = torch_models::make(torch_models::kind::mlp, at::kFloat, 3);
            construct(m, recording_setup<engine_type>(1, applied));
        },
        {"parameter 'fc1.weight' is on cpu", "places the engine on cuda:1"}, applied, mem, before);
    expect_refused(
        o, kind + ", a GPU module on cuda:1 with a setup for cuda:0",
        [&] {
            auto m = std::make_shared<tagged_module>(mem, 1, false);
            construct(m, recording_setup<engine_type>(0, applied));
        },
        {"parameter 'w' is on cuda:1", "places the engine on cuda:0"}, applied, mem, before);
    expect_refused(
        o, kind + ", a GPU module and its setup on a rank not placed on that GPU",
        [&] {
            auto m = std::make_shared<tagged_module>(mem, 0, false);
            construct(m, recording_setup<engine_type>(0, applied));
        },
        {"places the engine on cuda:0", "this rank's communicator moves"}, applied, mem, before);
    expect_refused(
        o, kind + ", a GPU module with a CPU buffer",
        [&] {
            auto m = std::make_shared<tagged_module>(mem, 0, true);
            construct(m, recording_setup<engine_type>(0, applied));
        },
        {"buffer 'stats' is on cpu", "places the engine on cuda:0"}, applied, mem, before);
}

template <communicator C>
void torch_device_error_cases(C& comm) {
    outcome o;
    using ddp_type = torch::ddp<C>;
    torch_device_refusals<ddp_type>(
        comm, o, "torch::ddp",
        [&](std::shared_ptr<::torch::nn::Module> m,
            std::optional<device_setup<typename ddp_type::engine_type>> setup) {
            if (setup) {
                ddp_type dp(comm, m, {}, *setup);
            } else {
                ddp_type dp(comm, m);
            }
        });
    using fsdp_type = torch::fsdp<C, policy::shard::full>;
    torch_device_refusals<fsdp_type>(
        comm, o, "torch::fsdp",
        [&](std::shared_ptr<::torch::nn::Module> m,
            std::optional<device_setup<typename fsdp_type::engine_type>> setup) {
            if (setup) {
                fsdp_type engine(comm, m, {}, {}, *setup);
            } else {
                fsdp_type engine(comm, m, {});
            }
        });
    UNISON_CHECK_CASE(comm, "torch modules on the wrong device", o);
}

} // namespace unison::test
