#pragma once

/// \file
/// What each sharding strategy keeps resident and how it reduces gradients: one
/// specialization of `sharding<Strategy>` per strategy tag (sharded/policies.hpp).
/// Each names its parts: `parameters<Request>` and `gradients`, where a unit's
/// parameters and gradients live (sharded/detail/residency.hpp), and `groups<C>`,
/// the ranks it shards over (sharded/detail/groups.hpp); and owns its allocation,
/// its gradient collective and the completion of that collective.
/// `sharded_parameters` calls these, so no code tests a stage or a strategy. The
/// named facts (`params_sharded`, ...) describe the strategy to its users (tests,
/// the LibTorch layer, checkpoints).
///
/// A unit's parameters lie back to back in one flat buffer padded to a multiple of
/// the shard group's size S; rank r's shard is elements [r * shard, (r + 1) * shard).

#include "unison/comm/collectives.hpp"
#include "unison/core/detail/policy.hpp"
#include "unison/core/dtype.hpp"
#include "unison/parallel/detail/placement.hpp"
#include "unison/sharded/detail/groups.hpp"
#include "unison/sharded/detail/residency.hpp"
#include "unison/sharded/policies.hpp"

#include <cstddef>
#include <string_view>
#include <type_traits>

namespace unison::detail {

/// Allocates, zeroed, what a strategy keeps resident for a unit: its parameters
/// (`Params`), master weights for the update range (the whole unit, or the shard
/// with `StateSharded`) and its gradients (`Grads`).
template <class Params, class Grads, bool StateSharded>
void allocate_resident(const unit_context& c) {
    Params::allocate(c);
    if (c.types.has_master) {
        c.u.master = zeroed_buffer(
            (StateSharded ? c.u.shard : c.u.padded) * size_of(c.types.master), c.place);
    }
    Grads::allocate(c);
}

/// The primary template: a type that is not a sharding strategy.
template <class Strategy>
struct sharding {
    static_assert(always_false<Strategy>,
                  "unison: no sharding strategy of this type; use policy::shard::full, grad_op, "
                  "hybrid, gradients, optimizer_state, none or policy::zero<0..3>");
};

/// ZeRO-0: everything replicated; the full gradients are all-reduced.
struct replicate_everything {
    static constexpr int stage = 0;
    static constexpr bool params_sharded = false; ///< full parameters resident (else a shard)
    static constexpr bool grads_sharded = false;  ///< full gradients resident (else a shard)
    static constexpr bool state_sharded =
        false;                               ///< master + state of the whole unit (else a shard)
    static constexpr bool publishes = false; ///< parameters all-gathered after each step
    static constexpr bool reshard_after_forward = false;
    static constexpr bool hybrid = false;
    static constexpr std::string_view layout_name = "zero0";

    template <class Request>
    using parameters = replicated_parameters<Request>;
    using gradients = full_gradients;
    template <class C>
    using groups = flat_groups<C>;

    static void allocate(const unit_context& c) {
        allocate_resident<resident_parameter_memory, gradients, state_sharded>(c);
    }
    /// Launches the reduction of `whole`, the unit's full gradient in the reduce dtype.
    template <class C>
    static typename C::request_type reduce(C& shard_comm, const unit_context& c, void* whole) {
        const buffer b{whole, c.u.padded, c.types.reduce, c.place.where()};
        return submit_tagged(
            shard_comm,
            all_reduce_call(site(shard_comm, operation::all_reduce), b, b, reduce_op::sum), c.tag);
    }
    /// After it completed: the sum times `scale`, in the parameter dtype, where the
    /// optimizer reads the gradient.
    template <class C>
    static void complete(C*, const unit_context& c, double scale) {
        const bool wire = c.types.reduce != c.types.param;
        c.place.scale_cast(c.u.full_grad.data(), c.types.param,
                           wire ? c.u.wire.data() : c.u.full_grad.data(), c.types.reduce,
                           c.u.padded, scale);
    }
};

/// ZeRO-1: the optimizer state and master weights of the owned shard only; the
/// full gradients are reduce-scattered in place and the new parameters published.
struct shard_optimizer_state {
    static constexpr int stage = 1;
    static constexpr bool params_sharded = false;
    static constexpr bool grads_sharded = false;
    static constexpr bool state_sharded = true;
    static constexpr bool publishes = true;
    static constexpr bool reshard_after_forward = false;
    static constexpr bool hybrid = false;
    static constexpr std::string_view layout_name = "zero1";

    template <class Request>
    using parameters = published_parameters<Request>;
    using gradients = full_gradients;
    template <class C>
    using groups = flat_groups<C>;

    static void allocate(const unit_context& c) {
        allocate_resident<resident_parameter_memory, gradients, state_sharded>(c);
    }
    template <class C>
    static typename C::request_type reduce(C& shard_comm, const unit_context& c, void* whole) {
        const call_site s = site(shard_comm, operation::reduce_scatter);
        const buffer b{whole, c.u.padded, c.types.reduce, c.place.where()};
        return submit_tagged(
            shard_comm, reduce_scatter_call(s, b, block_of(s, b), reduce_op::sum, true), c.tag);
    }
    template <class C>
    static void complete(C*, const unit_context& c, double scale) {
        const std::size_t at = static_cast<std::size_t>(c.shard_rank) * c.u.shard;
        const bool wire = c.types.reduce != c.types.param;
        const std::byte* src =
            (wire ? c.u.wire.data() : c.u.full_grad.data()) + at * size_of(c.types.reduce);
        c.place.scale_cast(c.u.full_grad.data() + at * size_of(c.types.param), c.types.param, src,
                           c.types.reduce, c.u.shard, scale);
    }
};

/// Reduce-scatter of a unit's full gradient into the owned gradient shard: what
/// ZeRO-2 and ZeRO-3 share.
struct reduce_into_shard {
    static constexpr bool grads_sharded = true;
    static constexpr bool state_sharded = true;
    using gradients = sharded_gradients;

    /// Into the shard itself, or, when it must be converted or added to what the
    /// shard holds (micro-batch accumulation), into a reduce-dtype staging shard.
    template <class C>
    static typename C::request_type reduce(C& shard_comm, const unit_context& c, void* whole) {
        void* out = c.u.shard_grad.data();
        if (c.types.reduce != c.types.param || c.accumulate) {
            c.u.wire_shard = flat_buffer(c.u.shard * size_of(c.types.reduce), c.place);
            out = c.u.wire_shard.data();
        }
        return submit_tagged(
            shard_comm,
            reduce_scatter_call(site(shard_comm, operation::reduce_scatter),
                                const_buffer(whole, c.u.padded, c.types.reduce, c.place.where()),
                                buffer{out, c.u.shard, c.types.reduce, c.place.where()},
                                reduce_op::sum, false),
            c.tag);
    }
    /// `replica` (hybrid only): the communicator across the shard groups, over which
    /// the shard's sum is all-reduced first. With `c.accumulate` the scaled sum is
    /// added to the shard.
    template <class C>
    static void complete(C* replica, const unit_context& c, double scale) {
        std::byte* got = c.u.wire_shard ? c.u.wire_shard.data() : c.u.shard_grad.data();
        if (replica != nullptr) {
            all_reduce(*replica, buffer{got, c.u.shard, c.types.reduce, c.place.where()});
        }
        c.place.scale_cast(c.u.shard_grad.data(), c.types.param, got, c.types.reduce, c.u.shard,
                           scale, c.accumulate);
    }
};

/// ZeRO-2: the gradients sharded too; the full gradient exists only from its first
/// write in backward until its reduce-scatter completes.
struct shard_gradients : reduce_into_shard {
    static constexpr int stage = 2;
    static constexpr bool params_sharded = false;
    static constexpr bool publishes = true;
    static constexpr bool reshard_after_forward = false;
    static constexpr bool hybrid = false;
    static constexpr std::string_view layout_name = "zero2";

    template <class Request>
    using parameters = published_parameters<Request>;
    template <class C>
    using groups = flat_groups<C>;

    static void allocate(const unit_context& c) {
        allocate_resident<resident_parameter_memory, gradients, state_sharded>(c);
    }
};

/// ZeRO-3 and FSDP: the parameters sharded too, gathered around their use.
/// `Reshard`: the gathered parameters are freed after forward (and gathered again
/// for backward). `Hybrid`: within shard groups, all-reduced across them.
template <bool Reshard, bool Hybrid>
struct shard_parameters : reduce_into_shard {
    static constexpr int stage = 3;
    static constexpr bool params_sharded = true;
    static constexpr bool publishes = false;
    static constexpr bool reshard_after_forward = Reshard;
    static constexpr bool hybrid = Hybrid;
    static constexpr std::string_view layout_name = Hybrid ? "fsdp_hybrid" : "zero3";

    template <class Request>
    using parameters = gathered_parameters<Request, Reshard>;
    template <class C>
    using groups = std::conditional_t<Hybrid, hybrid_groups<C>, flat_groups<C>>;

    static void allocate(const unit_context& c) {
        allocate_resident<sharded_parameter_memory, gradients, state_sharded>(c);
    }
};

template <>
struct sharding<policy::shard::none> : replicate_everything {};
template <>
struct sharding<policy::shard::optimizer_state> : shard_optimizer_state {};
template <>
struct sharding<policy::shard::gradients> : shard_gradients {};
template <>
struct sharding<policy::shard::full> : shard_parameters<true, false> {};
template <>
struct sharding<policy::shard::grad_op> : shard_parameters<false, false> {};
template <>
struct sharding<policy::shard::hybrid> : shard_parameters<true, true> {};

} // namespace unison::detail
