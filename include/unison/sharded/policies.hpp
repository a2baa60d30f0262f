#pragma once

/// \file
/// The policies sharding is assembled from: the strategy (what each rank keeps
/// resident) and the precision (parallel/policies.hpp). The engine `fsdp` also takes
/// the optimizer type (unison::optim). Numbers (prefetch depth, live-unit limit,
/// hybrid group size, clipping) are options (sharded/options.hpp).
///
///     kind        policies                                             default
///     sharding    shard::full, grad_op, hybrid, gradients,             shard::full
///                 optimizer_state, none; zero<0..3> name the last four
///     precision   mixed_precision<Param, Reduce, Master>               all f32
///     optimizer   optim::sgd, optim::adam, optim::adamw, your own      optim::adamw (fsdp)
///
/// What each strategy keeps resident on a rank, for N ranks (Psi parameters):
///
///     strategy                      parameters  gradients  master + state  per step
///     shard::none       = zero<0>   full        full       full            all-reduce
///     shard::optimizer_state = zero<1>  full    full       1/N             RS + AG
///     shard::gradients  = zero<2>   full        1/N        1/N             RS + AG
///     shard::full       = zero<3>   1/N         1/N        1/N             AG, AG, RS
///     shard::grad_op                1/N         1/N        1/N             AG, RS
///     shard::hybrid                 1/G         1/G        1/G             AG, AG, RS, AR
///
/// `grad_op` is full sharding without resharding after forward (PyTorch's
/// SHARD_GRAD_OP): the parameters gathered in forward stay for backward. `hybrid`
/// shards over groups of G consecutive ranks (the `shard_group_size` option) and
/// replicates across the groups.

#include "unison/core/detail/policy.hpp"
#include "unison/core/dtype.hpp"
#include "unison/optim/optimizer.hpp"
#include "unison/parallel/policies.hpp"

namespace unison::policy {

namespace shard {
struct full;
} // namespace shard

namespace kind {
/// What each rank keeps resident, and so which collectives a step takes.
struct sharding {
    using default_policy = shard::full;
};
/// The optimizer the sharding engine steps (an unison::optim::optimizer type; its
/// hyperparameters are options).
struct optimizer {};
} // namespace kind

/// Sharding strategies (FSDP's ShardingStrategy, DeepSpeed's ZeRO stages).
namespace shard {
/// Nothing sharded: every rank holds everything and gradients are all-reduced (DDP).
struct none {
    using kind = kind::sharding;
};
/// The optimizer state (and master weights) sharded (ZeRO-1).
struct optimizer_state {
    using kind = kind::sharding;
};
/// The gradients too (ZeRO-2).
struct gradients {
    using kind = kind::sharding;
};
/// Parameters, gradients and optimizer state sharded over all ranks (ZeRO-3).
struct full {
    using kind = kind::sharding;
};
/// Like `full`, but parameters gathered in forward stay gathered until backward.
struct grad_op {
    using kind = kind::sharding;
};
/// `full` inside groups of consecutive ranks, replicated across the groups.
struct hybrid {
    using kind = kind::sharding;
};
} // namespace shard

template <int Stage>
struct zero_stage {
    static_assert(Stage >= 0 && Stage <= 3, "unison::policy::zero: the stage is 0, 1, 2 or 3");
};
template <>
struct zero_stage<0> {
    using type = shard::none;
};
template <>
struct zero_stage<1> {
    using type = shard::optimizer_state;
};
template <>
struct zero_stage<2> {
    using type = shard::gradients;
};
template <>
struct zero_stage<3> {
    using type = shard::full;
};

/// DeepSpeed's ZeRO stage `Stage` as a strategy: 0 replicates everything (DDP), 1
/// partitions the optimizer state, 2 also the gradients, 3 also the parameters.
template <int Stage>
using zero = typename zero_stage<Stage>::type;

} // namespace unison::policy

namespace unison::detail {

/// Optimizer types are policies of kind `optimizer` (they cannot name it themselves:
/// optim/ sits below the policies).
template <optim::optimizer O>
requires(!requires { typename O::kind; }) struct kind_of<O> {
    using type = policy::kind::optimizer;
};

} // namespace unison::detail
