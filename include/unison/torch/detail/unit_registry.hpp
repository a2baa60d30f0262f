#pragma once

/// \file
/// How `unit_forward` finds the engine that runs a module as a unit. A
/// `torch::nn::Module` has no slot where an engine could attach itself, and
/// `unit_forward` sees only the module, so engines register their units here, by
/// module address, for their lifetime. The table is process-wide because the
/// thread backend runs several ranks' engines (on several ranks' modules) in one
/// process.

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <cstddef>
#include <mutex>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

namespace unison::torch::detail {

/// What runs a module's forward as a unit: an fsdp engine. `recompute`: the forward
/// is a recomputation inside backward (torch/recompute.hpp).
class unit_runner {
public:
    virtual void enter_forward(std::size_t unit, bool recompute) = 0;
    virtual void leave_forward(std::size_t unit, bool recompute) = 0;
    virtual void abandon_forward(std::size_t unit, bool recompute) noexcept = 0;
    virtual void hook_output(std::size_t unit, const at::Tensor& output) = 0;

protected:
    ~unit_runner() = default;
};

struct unit_entry {
    unit_runner* runner = nullptr;
    std::size_t unit = 0;
};

/// Which module is a unit of which engine.
class unit_registry {
public:
    static unit_registry& instance() {
        static unit_registry r;
        return r;
    }
    unit_entry find(const ::torch::nn::Module* m) {
        const std::lock_guard<std::mutex> lock(mutex_);
        const auto it = units_.find(m);
        return it == units_.end() ? unit_entry{} : it->second;
    }
    bool add(const ::torch::nn::Module* m, unit_entry e) {
        const std::lock_guard<std::mutex> lock(mutex_);
        return units_.emplace(m, e).second;
    }
    void remove(const ::torch::nn::Module* m) noexcept {
        const std::lock_guard<std::mutex> lock(mutex_);
        units_.erase(m);
    }

private:
    std::mutex mutex_;
    std::unordered_map<const ::torch::nn::Module*, unit_entry> units_;
};

/// Hooks every tensor of a unit's forward result: a tensor, a vector of them, or a
/// tuple or pair of those.
inline void hook_outputs(const unit_entry& e, const at::Tensor& t) {
    if (t.defined() && t.requires_grad()) {
        e.runner->hook_output(e.unit, t);
    }
}
inline void hook_outputs(const unit_entry& e, const std::vector<at::Tensor>& ts) {
    for (const at::Tensor& t : ts) {
        hook_outputs(e, t);
    }
}
template <class... Ts>
void hook_outputs(const unit_entry& e, const std::tuple<Ts...>& ts) {
    std::apply([&](const auto&... t) { (hook_outputs(e, t), ...); }, ts);
}
template <class A, class B>
void hook_outputs(const unit_entry& e, const std::pair<A, B>& p) {
    hook_outputs(e, p.first);
    hook_outputs(e, p.second);
}

template <class T>
concept unit_output = requires(const unit_entry& e, const T& t) {
    hook_outputs(e, t);
};

} // namespace unison::torch::detail
