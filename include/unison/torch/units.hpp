#pragma once

/// \file
/// What a model's own code calls for `unison::torch::fsdp` (torch/fsdp.hpp): the
/// units argument made from a list of blocks, and `unit_forward` around each
/// unit's forward call. A model file includes only this header; without an engine
/// `unit_forward` just runs the forward.

#include "unison/torch/detail/recomputing.hpp"
#include "unison/torch/detail/unit_registry.hpp"

#include <torch/nn/module.h>

#include <exception>
#include <functional>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

namespace unison::torch {

/// The modules of `range` (module holders such as `torch::nn::Linear` or a
/// TORCH_MODULE type, or shared pointers to modules) as fsdp's units argument:
/// `unison::torch::modules(model->blocks)`.
template <class Range>
std::vector<std::shared_ptr<::torch::nn::Module>> modules(const Range& range) {
    std::vector<std::shared_ptr<::torch::nn::Module>> out;
    for (const auto& m : range) {
        if constexpr (requires { m.ptr(); }) {
            out.push_back(std::static_pointer_cast<::torch::nn::Module>(m.ptr()));
        } else {
            out.push_back(std::static_pointer_cast<::torch::nn::Module>(m));
        }
    }
    return out;
}

/// Runs `f` (a unit's forward: returns a tensor, a vector of tensors, or a tuple or
/// pair of those) as unit `module` of the engine it belongs to, or just runs it
/// when `module` is no engine's unit. Put it around each unit's forward call.
template <class F>
auto unit_forward(::torch::nn::Module& module, F&& f)
    -> std::remove_cvref_t<std::invoke_result_t<F&>> {
    using result = std::invoke_result_t<F&>;
    static_assert(detail::unit_output<std::remove_cvref_t<result>>,
                  "unison::torch::unit_forward: the unit's forward must return a tensor, a "
                  "std::vector of tensors, or a std::tuple or std::pair of those");
    const detail::unit_entry e = detail::unit_registry::instance().find(&module);
    if (e.runner == nullptr) {
        return std::invoke(f);
    }
    const bool recompute = detail::recomputing > 0;
    e.runner->enter_forward(e.unit, recompute);
    struct leave {
        const detail::unit_entry& e;
        bool recompute;
        int exceptions = std::uncaught_exceptions();
        bool hooked = false;
        ~leave() noexcept(false) {
            if (std::uncaught_exceptions() > exceptions || !hooked) {
                e.runner->abandon_forward(e.unit, recompute);
            } else {
                e.runner->leave_forward(e.unit, recompute);
            }
        }
    } scope{e, recompute};
    std::remove_cvref_t<result> out = std::invoke(f);
    detail::hook_outputs(e, out);
    scope.hooked = true;
    return out;
}

} // namespace unison::torch
