#pragma once

/// \file
/// The resolved policy list of `sharded_parameters` (and of `fsdp`, which adds the
/// optimizer kind).

#include "unison/core/detail/policy.hpp"
#include "unison/optim/adam.hpp"
#include "unison/parallel/policies.hpp"
#include "unison/sharded/detail/strategy.hpp"
#include "unison/sharded/policies.hpp"

namespace unison::detail {

/// Name the engines in policy errors: not_a_policy_of<unison::detail::fsdp_engine, Argument>.
struct sharded_engine;
struct fsdp_engine;

/// Sharding's precision without a mixed_precision policy: everything f32.
using sharded_default_precision = policy::mixed_precision<dtype::f32>;

template <class Engine, class Kinds, class... Ps>
struct sharded_config_of {
    using set = policy_set<Engine, Kinds, Ps...>;
    static_assert(set::valid);

    using sharding = typename set::template get<policy::kind::sharding>;
    using strategy = detail::sharding<sharding>;
    using precision =
        typename set::template get<policy::kind::precision, sharded_default_precision>;
    static constexpr unit_dtypes dtypes{precision::param, precision::reduce, precision::master,
                                        precision::master != precision::param};
};

/// sharded_parameters takes a strategy and a precision.
template <class... Ps>
using sharded_config =
    sharded_config_of<sharded_engine, kind_list<policy::kind::sharding, policy::kind::precision>,
                      Ps...>;

/// fsdp also takes the optimizer (AdamW unless given).
template <class... Ps>
struct fsdp_config
    : sharded_config_of<
          fsdp_engine,
          kind_list<policy::kind::sharding, policy::kind::precision, policy::kind::optimizer>,
          Ps...> {
    using base = sharded_config_of<
        fsdp_engine,
        kind_list<policy::kind::sharding, policy::kind::precision, policy::kind::optimizer>, Ps...>;
    using optimizer = typename base::set::template get<policy::kind::optimizer, optim::adamw>;
};

} // namespace unison::detail
