#pragma once

/// \file
/// What both wrappers (torch::ddp, torch::fsdp) do with a module before any of its
/// values move, and the autograd hooks both put on its parameters.
///
/// Construction runs in this order on every rank: the rank's own checks (the
/// module claimed, the arguments, every tensor where the engine expects it, the
/// device setup where the communicator moves data), nothing collective, then the
/// engine's device setup (after the checks: a setup for a device that is not there
/// must not fail before the check that says so); one small all-reduce in which
/// every rank learns whether any rank's checks or setup failed, so that all refuse
/// together instead of some going on into a collective the others left; then,
/// with the device idle, the check that every rank built the same module. Each
/// wrapper then starts its engine and rolls back what it did if that fails.

#include "unison/comm/communicator.hpp"
#include "unison/core/error.hpp"
#include "unison/core/reduce_op.hpp"
#include "unison/core/tensor.hpp"
#include "unison/core/torch.hpp"
#include "unison/parallel/detail/control.hpp"
#include "unison/torch/detail/autograd.hpp"
#include "unison/torch/detail/same_module.hpp"

#include <ATen/core/Tensor.h>
#include <ATen/ops/full.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/cuda.h>
#include <torch/nn/module.h>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace unison::torch::detail {

/// For tests: called with the name of each stage a wrapper's construction reaches
/// on this thread ("checked", then the wrapper's own: see torch::ddp and
/// torch::fsdp); a test makes it throw to show what a failure there leaves behind.
inline thread_local std::function<void(std::string_view)> construction_fault;

inline void construction_stage(std::string_view stage) {
    if (construction_fault) {
        construction_fault(stage);
    }
}

/// Throws argument_error from `operation` unless `placed` (the device setup's GPU,
/// none for a host engine) is where `comm` moves data: a communicator that moves
/// device memory only needs a setup for its own GPU, and a thread backend rank on
/// a GPU (cuda::use_device(comm, ...)) one for that GPU.
template <communicator C>
void check_placement(C& comm, const std::optional<unison::device>& placed, const char* operation) {
    if constexpr (device_communicator<C>) {
        const unison::device mine = comm.device_location();
        if (!moves_host_memory<C> && !placed) {
            throw argument_error(comm.rank(), operation,
                                 "this communicator moves device memory only (" + to_string(mine) +
                                     "): give the wrapper a device setup for that GPU "
                                     "(cuda::on_device)");
        }
        if (placed && *placed != mine) {
            throw argument_error(comm.rank(), operation,
                                 "the device setup places the engine on " + to_string(*placed) +
                                     "; this rank's communicator moves data on " + to_string(mine) +
                                     " (cuda::use_device(comm, ...) for the thread backend)");
        }
    } else if (placed) {
        throw argument_error(comm.rank(), operation,
                             "the device setup places the engine on " + to_string(*placed) +
                                 "; this rank's communicator moves host memory only");
    }
}

/// Runs `checks` (this rank's own checks, then anything else that may fail on
/// one rank alone, such as applying a device setup; nothing collective) and
/// returns what they threw, for agree_to_start.
template <class F>
std::exception_ptr local_checks(F&& checks) noexcept {
    try {
        checks();
        construction_stage("checked");
        return nullptr;
    } catch (...) {
        return std::current_exception();
    }
}

/// Collective, before any other of construction: throws on every rank when some
/// rank's local checks failed (`failed`): that rank's own error there, on the
/// others an argument_error from `operation` naming the lowest such rank. With a
/// communicator that moves device memory only it goes through a LibTorch tensor on
/// the communicator's own GPU, which every rank has whatever its checks found.
template <communicator C>
void agree_to_start(C& comm, std::exception_ptr failed, const char* operation) {
    std::int64_t first = failed ? comm.rank() : comm.size();
    if constexpr (moves_host_memory<C>) {
        std::vector<std::int64_t> v{first};
        all_reduce(comm, v, reduce_op::min);
        first = v[0];
    } else {
        const c10::Device gpu(c10::DeviceType::CUDA,
                              static_cast<c10::DeviceIndex>(comm.device_location().index));
        at::Tensor v = at::full({1}, first, at::kLong).to(gpu);
        all_reduce(comm, v, reduce_op::min); // blocking: done when it returns
        first = v.to(at::kCPU).item<std::int64_t>();
    }
    if (failed) {
        std::rethrow_exception(failed);
    }
    if (first < comm.size()) {
        throw argument_error(comm.rank(), operation,
                             "rank " + std::to_string(first) +
                                 " cannot take its module (its own error says why; a module "
                                 "another engine drives, also another rank's, counts): nothing "
                                 "moved on any rank");
    }
}

/// Collective: waits for `placed`'s GPU (the collectives that follow run on the
/// communicator's stream and must read finished values: module->to(...),
/// initialization), then checks that every rank built the same module
/// (verify_same_module).
template <communicator C>
void verify_module(C& comm, const unison::detail::placement& place, const ::torch::nn::Module& m,
                   const std::optional<unison::device>& placed, const char* operation) {
    if (placed) {
        ::torch::cuda::synchronize(placed->index);
    }
    verify_same_module(comm, place, m, operation);
}

/// The post hooks a wrapper puts on its parameters' AccumulateGrad nodes (a post
/// hook runs once autograd has accumulated into p.grad; a tensor hook would run
/// before), removed when this goes away, also when construction fails halfway.
/// The nodes are held here: a parameter holds its node only weakly.
class gradient_hooks {
public:
    gradient_hooks() = default;
    gradient_hooks(const gradient_hooks&) = delete;
    gradient_hooks& operator=(const gradient_hooks&) = delete;
    ~gradient_hooks() { remove_all(); }

    /// Holds `p`'s AccumulateGrad node as node number size(), made now if need be
    /// (it records p's shape: take it while p has its real one); false when `p`
    /// has none (it does not require grad, or it is not a leaf).
    bool hold(const at::Tensor& p) {
        accumulator_ptr node = ::torch::autograd::impl::grad_accumulator(p);
        if (!node) {
            return false;
        }
        nodes_.push_back({std::move(node), 0, false});
        return true;
    }

    /// Calls `ready` after autograd has accumulated node k's gradient.
    void install(std::size_t k, std::function<void()> ready) {
        held& h = nodes_.at(k);
        h.key = h.node->add_post_hook(std::make_unique<::torch::autograd::utils::LambdaPostHook>(
            [ready = std::move(ready)](const ::torch::autograd::variable_list& outputs,
                                       const ::torch::autograd::variable_list&) {
                ready();
                return outputs;
            }));
        h.hooked = true;
    }

    /// Removes every hook installed (the nodes stay held).
    void remove_all() noexcept {
        for (held& h : nodes_) {
            if (h.hooked) {
                h.node->del_post_hook(h.key);
                h.hooked = false;
            }
        }
    }

    std::size_t size() const noexcept { return nodes_.size(); }

private:
    struct held {
        accumulator_ptr node;
        std::uintptr_t key;
        bool hooked;
    };
    std::vector<held> nodes_;
};

} // namespace unison::torch::detail
