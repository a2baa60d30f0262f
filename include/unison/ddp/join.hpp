#pragma once

/// \file
/// `join`: training with uneven inputs. Ranks run out of batches at different
/// steps; a rank without a batch keeps taking part in every step's reductions with
/// zero gradients until no rank has data, so nobody waits forever, and the sum is
/// divided by the number of ranks that did contribute, so the average is the
/// average over the data that exists.
///
///     unison::join j(dp.reducer());
///     while (j.next(loader.has_next())) {
///         if (j.has_data()) { forward; backward (hooks call mark_ready); }
///         if (dp.finish()) {    // averaged gradients, on every rank
///             optimizer.step(); // every rank takes the same step: models stay equal
///         }
///     }
///
/// `next` is called once per synchronizing step (with accumulate_steps = K, once per
/// window of K micro-steps, before the window's first micro-step).

#include "unison/comm/collectives.hpp"
#include "unison/core/error.hpp"
#include "unison/parallel/detail/control.hpp"

#include <cstdint>
#include <span>

namespace unison {

template <class Reducer>
class join {
public:
    explicit join(Reducer& reducer) : reducer_(&reducer) {}

    /// Collective (one small all-reduce): reports whether this rank has data for the
    /// coming step and returns false once no rank has. When this rank has none, its
    /// zero contribution is registered with the reducer right away. (The count is
    /// staged through the reducer's device where the communicator moves device
    /// memory only, as NCCL does.)
    bool next(bool has_data) {
        std::int64_t active = has_data ? 1 : 0;
        detail::control_all_reduce(reducer_->step_communicator(), reducer_->placement(),
                                   std::span<std::int64_t>(&active, 1), reduce_op::sum);
        active_ = static_cast<int>(active);
        has_data_ = has_data;
        if (active_ == 0) {
            return false;
        }
        reducer_->set_contributing_ranks(active_);
        if (!has_data) {
            reducer_->contribute_zero();
        }
        return true;
    }

    /// Whether this rank had data at the last `next`.
    bool has_data() const noexcept { return has_data_; }
    /// How many ranks had data at the last `next`.
    int active_ranks() const noexcept { return active_; }

private:
    Reducer* reducer_;
    int active_ = 0;
    bool has_data_ = false;
};

} // namespace unison
