#pragma once

/// \file
/// The policies `sharded_parameters` (and so FSDP and ZeRO) is assembled from. Give
/// them in any order, at most one per category:
///
/// | category              | policies                                       | default |
/// |-----------------------|------------------------------------------------|----------------------|
/// | sharding              | `zero<0..3>`, `fsdp<shard::full / grad_op /    | `fsdp<shard::full>` |
/// |                       | none / hybrid>`                                | | | precision |
/// `mixed_precision<Param, Reduce, Master>`       | all f32              | | reshard after forward
/// | `reshard_after_forward<bool>`                  | the sharding's       | | prefetch |
/// `prefetch<Depth>`                              | 1 unit ahead         | | live units |
/// `max_live_units<N>`                            | no limit (0)         |
///
/// What each sharding keeps resident on a rank, for N ranks (Psi parameters):
///
/// | sharding                 | parameters | gradients | master + optimizer state | per step      |
/// |--------------------------|------------|-----------|--------------------------|---------------|
/// | `zero<0>`, `fsdp<none>`  | full       | full      | full                     | all-reduce    |
/// | `zero<1>`                | full       | full      | 1/N                      | RS + AG       |
/// | `zero<2>`                | full       | 1/N       | 1/N                      | RS + AG       |
/// | `zero<3>`, `fsdp<full>`  | 1/N        | 1/N       | 1/N                      | AG, AG, RS    |
/// | `fsdp<grad_op>`          | 1/N        | 1/N       | 1/N                      | AG, RS        |
/// | `fsdp<hybrid>`           | 1/G        | 1/G       | 1/G                      | AG, AG, RS, AR|
///
/// `fsdp<grad_op>` is full sharding without resharding after forward (PyTorch's
/// SHARD_GRAD_OP): the parameters gathered in forward stay for backward. `fsdp<hybrid>`
/// shards over groups of G consecutive ranks and replicates across the groups (G is
/// a constructor argument of `sharded_parameters`).

#include "unison/core/detail/policy.hpp"
#include "unison/core/dtype.hpp"

#include <type_traits>

namespace unison::policy {

namespace category {
struct sharding {};
struct precision {};
struct reshard_after_forward {};
struct prefetch {};
struct live_units {};
} // namespace category

/// FSDP sharding strategies.
namespace shard {
/// Parameters, gradients and optimizer state sharded over all ranks (ZeRO-3).
struct full {};
/// Like `full`, but parameters gathered in forward stay gathered until backward.
struct grad_op {};
/// Nothing sharded: every rank holds everything and gradients are all-reduced (DDP).
struct none {};
/// `full` inside groups of consecutive ranks, replicated across the groups.
struct hybrid {};
} // namespace shard

/// DeepSpeed's ZeRO stage `Stage`: 0 replicates everything (DDP), 1 partitions the
/// optimizer state, 2 also the gradients, 3 also the parameters.
template <int Stage>
struct zero {
    static_assert(Stage >= 0 && Stage <= 3, "unison::policy::zero: the stage is 0, 1, 2 or 3");
    using category = category::sharding;
    static constexpr int stage = Stage;
    static constexpr bool hybrid = false;
    static constexpr bool reshard_after_forward = Stage == 3;
};

template <class Strategy>
struct fsdp {
    static_assert(sizeof(Strategy) == 0,
                  "unison::policy::fsdp: the strategy is shard::full, shard::grad_op, shard::none "
                  "or shard::hybrid");
};
template <>
struct fsdp<shard::full> : zero<3> {};
template <>
struct fsdp<shard::grad_op> : zero<3> {
    static constexpr bool reshard_after_forward = false;
};
template <>
struct fsdp<shard::none> : zero<0> {};
template <>
struct fsdp<shard::hybrid> : zero<3> {
    static constexpr bool hybrid = true;
};

/// Parameters are stored and gathered in `Param` (what forward and backward compute
/// in); gradients travel in `Reduce`; the optimizer updates `Master` copies of its
/// partition (kept only when `Master` differs from `Param`). The default master is
/// f32 for 16-bit parameters and the parameter dtype otherwise.
template <dtype Param, dtype Reduce = Param,
          dtype Master = (Param == dtype::f16 || Param == dtype::bf16) ? dtype::f32 : Param>
struct mixed_precision {
    static_assert(is_floating(Param) && is_floating(Reduce) && is_floating(Master),
                  "unison::policy::mixed_precision: dtypes are f64, f32, f16 or bf16");
    static_assert(Master != dtype::f16 && Master != dtype::bf16,
                  "unison::policy::mixed_precision: master weights are f32 or f64");
    using category = category::precision;
    static constexpr dtype param = Param;
    static constexpr dtype reduce = Reduce;
    static constexpr dtype master = Master;
};

/// Whether stage 3 frees a unit's gathered parameters after forward (and gathers
/// them again for backward), trading a third collective for memory.
template <bool Reshard>
struct reshard_after_forward {
    using category = category::reshard_after_forward;
    static constexpr bool value = Reshard;
};

/// How many units ahead (in forward order during forward, in reverse during
/// backward) `gather` starts gathering. 0 turns prefetching off.
template <int Depth>
struct prefetch {
    static_assert(Depth >= 0, "unison::policy::prefetch: the depth is not negative");
    using category = category::prefetch;
    static constexpr int depth = Depth;
};

/// At most `Units` units gathered (or being gathered) at once; 0 means no limit.
/// Prefetching stops at the limit; a `gather` past it is an error naming the units
/// still gathered (like FSDP's limit_all_gathers and DeepSpeed's max live parameters).
template <int Units>
struct max_live_units {
    static_assert(Units >= 0, "unison::policy::max_live_units: the limit is not negative");
    using category = category::live_units;
    static constexpr int units = Units;
};

} // namespace unison::policy

namespace unison::detail {

template <class C>
inline constexpr bool is_sharded_category =
    std::is_same_v<C, policy::category::sharding> ||
    std::is_same_v<C, policy::category::precision> ||
    std::is_same_v<C, policy::category::reshard_after_forward> ||
    std::is_same_v<C, policy::category::prefetch> ||
    std::is_same_v<C, policy::category::live_units>;

/// The resolved configuration of a `sharded_parameters` policy list.
template <class... Ps>
struct sharded_config {
    static_assert((is_sharded_category<category_of_t<Ps>> && ...),
                  "unison::sharded_parameters: every argument after the communicator must be a "
                  "sharding policy from unison::policy (zero, fsdp, mixed_precision, "
                  "reshard_after_forward, prefetch, max_live_units)");
    static_assert(count_category<policy::category::sharding, Ps...> <= 1,
                  "unison sharding policies: more than one sharding given (give one of zero<N>, "
                  "fsdp<...>)");
    static_assert(count_category<policy::category::precision, Ps...> <= 1,
                  "unison sharding policies: more than one mixed_precision given");
    static_assert(count_category<policy::category::reshard_after_forward, Ps...> <= 1,
                  "unison sharding policies: more than one reshard_after_forward given");
    static_assert(count_category<policy::category::prefetch, Ps...> <= 1,
                  "unison sharding policies: more than one prefetch given");
    static_assert(count_category<policy::category::live_units, Ps...> <= 1,
                  "unison sharding policies: more than one max_live_units given");

    using sharding =
        select_policy_t<policy::fsdp<policy::shard::full>, policy::category::sharding, Ps...>;
    using precision =
        select_policy_t<policy::mixed_precision<dtype::f32>, policy::category::precision, Ps...>;
    using reshard = select_policy_t<policy::reshard_after_forward<sharding::reshard_after_forward>,
                                    policy::category::reshard_after_forward, Ps...>;

    static constexpr int stage = sharding::stage;
    static constexpr bool hybrid = sharding::hybrid;
    static constexpr bool reshard_after_forward = reshard::value;
    static_assert(stage == 3 || !reshard::value,
                  "unison sharding policies: reshard_after_forward<true> needs sharded "
                  "parameters (zero<3> or fsdp<shard::full/grad_op/hybrid>)");
    static constexpr int prefetch_depth =
        select_policy_t<policy::prefetch<1>, policy::category::prefetch, Ps...>::depth;
    static constexpr int live_limit =
        select_policy_t<policy::max_live_units<0>, policy::category::live_units, Ps...>::units;
    static constexpr dtype param_dtype = precision::param;
    static constexpr dtype reduce_dtype = precision::reduce;
    static constexpr dtype master_dtype = precision::master;
    /// A separate master copy exists only when it differs from the parameters.
    static constexpr bool has_master = precision::master != precision::param;
};

} // namespace unison::detail
