#pragma once

/// \file
/// What an optimizer is to unison: a small value type holding its hyperparameters
/// (change them between steps for schedules) that says
///   - `name` and `slot_names`: its state tensors, one element per parameter each
///     ("momentum"; "exp_avg", "exp_avg_sq"), which is what checkpoints record;
///   - `prepare<A>(step)`: the per-step constants, computed once on the host in the
///     compute type `A` (float for f32 master weights, double for f64);
///   - `update(constants, p, g, state)`: one element's step, `__host__ __device__`,
///     so the CUDA kernels (kernels/optimizer.cuh) and the host loop share it.
/// `g` arrives already unscaled (loss scale) and clipped. The optimizers themselves
/// are in sgd.hpp and adam.hpp; the sharding engine updates flat shards with them.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace unison::optim {

/// What the sharding engine and `partitioned_optimizer` need of an optimizer type.
template <class O>
concept optimizer = requires(const O& o) {
    { O::name } -> std::convertible_to<std::string_view>;
    { O::slots } -> std::convertible_to<std::size_t>;
    o.template prepare<float>(std::uint64_t{1});
    o.template prepare<double>(std::uint64_t{1});
};

} // namespace unison::optim
