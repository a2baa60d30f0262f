#pragma once

/// \file
/// What the LibTorch wrappers need to know about devices: whether a module's
/// tensors are where its engine keeps state (host memory, or the device of a
/// `device_setup`), and a guard against waiting on autograd's shared device thread.

#include "unison/core/error.hpp"
#include "unison/core/tensor.hpp"
#include "unison/core/torch.hpp"

#include <c10/core/Device.h>
#include <torch/nn/module.h>

#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

namespace unison::torch::detail {

/// Why tensor `name` (a "parameter" or "buffer", `what`) cannot be used by an engine
/// whose state is on `placed` (nothing: host memory), or "" when it can.
inline std::string misplaced(const char* what, const std::string& name, const at::Tensor& t,
                             std::optional<device> placed) {
    const c10::Device d = t.device();
    const std::string where = std::string(what) + " '" + name + "' is on " + d.str();
    if (!d.is_cpu() && !d.is_cuda()) {
        return where + "; unison moves CPU and CUDA tensors";
    }
    if (!placed) {
        if (d.is_cpu()) {
            return "";
        }
        return where +
               ": a module on a GPU needs a device setup as the constructor's last "
               "argument (unison::cuda::on_device<engine_type>(" +
               std::to_string(d.has_index() ? d.index() : 0) +
               ", stream), parallel/device.cuh, made in a .cu file)";
    }
    const device here = unison::detail::torch_tensor_device(t);
    if (here == *placed) {
        return "";
    }
    return where + " but the device setup places the engine on " + to_string(*placed) +
           ": move the module there first (module->to(...)), or " +
           (here.is_host() ? std::string("construct without a device setup")
                           : "make the setup for " + to_string(here));
}

/// Why the first of `m`'s parameters and (defined) buffers that cannot be used by an
/// engine whose state is on `placed` cannot, or "" when all can.
inline std::string misplaced(const ::torch::nn::Module& m, std::optional<device> placed) {
    for (const auto& item : m.named_parameters(/*recurse=*/true)) {
        if (std::string why = misplaced("parameter", item.key(), item.value(), placed);
            !why.empty()) {
            return why;
        }
    }
    for (const auto& item : m.named_buffers(/*recurse=*/true)) {
        if (!item.value().defined()) {
            continue;
        }
        if (std::string why = misplaced("buffer", item.key(), item.value(), placed); !why.empty()) {
            return why;
        }
    }
    return "";
}

/// How many LibTorch engines have their module on each CUDA device, in this process.
class device_engines {
public:
    static device_engines& instance() {
        static device_engines e;
        return e;
    }
    void add(int dev) {
        const std::lock_guard<std::mutex> lock(mutex_);
        ++count_[dev];
    }
    void remove(int dev) {
        const std::lock_guard<std::mutex> lock(mutex_);
        if (--count_[dev] == 0) {
            count_.erase(dev);
        }
    }
    int on(int dev) {
        const std::lock_guard<std::mutex> lock(mutex_);
        const auto it = count_.find(dev);
        return it == count_.end() ? 0 : it->second;
    }

private:
    std::mutex mutex_;
    std::map<int, int> count_;
};

/// LibTorch runs the CUDA part of every backward on one worker thread per device,
/// shared by every thread of the process. Ranks of the thread backend on one GPU
/// would then wait for each other on that one thread (a rank's hook waiting for a
/// collective that the others' hooks, queued behind it, never start). This guard
/// turns that into an error at the first hook instead of a timeout: a hook that runs
/// on a thread other than the engine's own while another engine in this process
/// uses the same device.
class backward_thread_guard {
public:
    explicit backward_thread_guard(std::optional<device> placed)
        : owner_(std::this_thread::get_id()),
          device_(placed && !placed->is_host() ? placed->index : -1) {
        if (device_ >= 0) {
            device_engines::instance().add(device_);
        }
    }
    backward_thread_guard(const backward_thread_guard&) = delete;
    backward_thread_guard& operator=(const backward_thread_guard&) = delete;
    ~backward_thread_guard() {
        if (device_ >= 0) {
            device_engines::instance().remove(device_);
        }
    }

    /// Throws when this backward cannot proceed without stopping other ranks'.
    void check(int rank, const char* who) const {
        if (device_ < 0 || std::this_thread::get_id() == owner_) {
            return;
        }
        const int engines = device_engines::instance().on(device_);
        if (engines > 1) {
            throw argument_error(
                rank, who,
                "backward runs on LibTorch's autograd thread for cuda:" + std::to_string(device_) +
                    ", which the " + std::to_string(engines) +
                    " engines on that device in this process share, so their ranks would wait "
                    "for each other there; run backward on the thread that built the engine "
                    "(LibTorch >= 2.0: c10::AutogradState::get_tls_state()."
                    "set_multithreading_enabled(false) on each rank's thread), or use one "
                    "process per GPU");
        }
    }

private:
    std::thread::id owner_;
    int device_;
};

} // namespace unison::torch::detail
