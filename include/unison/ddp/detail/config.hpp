#pragma once

/// \file
/// The resolved policy list of a `bucketed_reducer` (and `ddp`).

#include "unison/core/detail/policy.hpp"
#include "unison/ddp/policies.hpp"
#include "unison/parallel/policies.hpp"

namespace unison::detail {

/// Names DDP in policy errors: not_a_policy_of<unison::detail::ddp_engine, Argument>.
struct ddp_engine;

/// DDP's precision without a mixed_precision policy: every gradient is reduced in
/// its own dtype.
struct gradient_precision {
    using kind = policy::kind::precision;
};

template <class... Ps>
struct ddp_config {
    using set =
        policy_set<ddp_engine,
                   kind_list<policy::kind::precision, policy::kind::comm_hook,
                             policy::kind::gradient_memory, policy::kind::unused_parameters>,
                   Ps...>;
    static_assert(set::valid);

    using precision = typename set::template get<policy::kind::precision, gradient_precision>;
    using hook = typename set::template get<policy::kind::comm_hook>::type;
    using gradient_memory = typename set::template get<policy::kind::gradient_memory>;
    using unused = typename set::template get<policy::kind::unused_parameters>;

    /// Whether each gradient is reduced in its own dtype (no mixed_precision given).
    static constexpr bool own_dtype = std::is_same_v<precision, gradient_precision>;

    static constexpr bool keeps_no_master = [] {
        if constexpr (own_dtype) {
            return true;
        } else {
            return precision::master == policy::default_master(precision::param);
        }
    }();
    static_assert(keeps_no_master, "unison DDP: DDP keeps no master weights; give "
                                   "mixed_precision<Param, Reduce> without a Master dtype");
    static constexpr bool buckets_hold_gradients = [] {
        if constexpr (own_dtype) {
            return true;
        } else {
            return precision::param == precision::reduce;
        }
    }();
    static_assert(!gradient_memory::in_buckets || buckets_hold_gradients,
                  "unison DDP: gradients_in_buckets keeps the gradients in bucket memory, so "
                  "they are reduced in their own dtype: mixed_precision<P, P> or none");
};

} // namespace unison::detail
