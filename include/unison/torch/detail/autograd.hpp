#pragma once

/// \file
/// What differs between LibTorch versions in the autograd internals the wrappers
/// use.

#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/variable.h>

#include <utility>

namespace unison::torch::detail {

/// A parameter's gradient accumulator node as `grad_accumulator` returns it: a
/// `std::shared_ptr<Node>` in LibTorch 1.x, a `c10::intrusive_ptr<Node>` in 2.x.
/// Held to keep the node alive (a parameter holds it only weakly).
using accumulator_ptr =
    decltype(::torch::autograd::impl::grad_accumulator(std::declval<const at::Tensor&>()));

} // namespace unison::torch::detail
