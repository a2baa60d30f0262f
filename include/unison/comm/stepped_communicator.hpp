#pragma once

/// \file
/// `stepped_communicator`: a decorator that stamps every collective it forwards
/// with a step number of the caller's choosing (collective_call::step), which call
/// matching compares across ranks. Backends match calls by their order, so a rank
/// that skips a call in a loop would otherwise be paired with the others' next
/// call of the same shape and mix data until the sequence runs out; stamped with
/// the loop's index, the first call after the skip is a `mismatch_error` (field
/// "step") on every rank, before any data moves:
///
///     unison::stepped_communicator steps(comm);
///     for (std::uint64_t i = 0; i < iterations; ++i) {
///         steps.set_step(i);
///         unison::all_reduce(steps, loss); // any collective; send/recv are not stamped
///     }
///
/// The thread and MPI backends compare steps on every call; NCCL with
/// check_matching (UNISON_DEBUG=1).
///
/// The training engines stamp their own count this way (ddp: backward passes;
/// sharded_parameters and fsdp: iterations). A count kept by the engine cannot see
/// a rank that skipped a whole iteration (its count skips it too), the loop's
/// index can: pass the engine a stepped_communicator and set its step each
/// iteration. Stamps nest, and the one nearest the backend is what travels, so the
/// loop's index replaces the engine's count on every call the engine makes.
/// Copies and the communicators split from this one share its step.

#include "unison/comm/collective.hpp"
#include "unison/comm/communicator.hpp"
#include "unison/comm/detail/decorator.hpp"

#include <cstdint>
#include <memory>
#include <utility>

namespace unison {

/// Stamps the collectives of `C` with a step (see the file comment). Models
/// `communicator`, and `device_communicator` when `C` does.
template <communicator C>
class stepped_communicator : public detail::communicator_decorator<C> {
    using base = detail::communicator_decorator<C>;
    using base::inner_;

public:
    using typename base::request_type;

    /// Wraps `inner`, which must outlive this object; calls carry `step` until
    /// set_step changes it.
    explicit stepped_communicator(C& inner, std::uint64_t step = 0)
        : base(inner), step_(std::make_shared<std::uint64_t>(step)) {}

    /// The step stamped on the calls that follow; every rank must pass the same one
    /// to its matching calls.
    void set_step(std::uint64_t step) noexcept { *step_ = step; }
    std::uint64_t step() const noexcept { return *step_; }

    void execute(const collective_call& call) { inner_->execute(stamped(call)); }
    request_type submit(const collective_call& call) { return inner_->submit(stamped(call)); }
    /// Collective, as C's split; the new communicator shares this one's step, so
    /// set_step on either stamps the calls of both.
    stepped_communicator split(int color, int key) {
        auto owned = std::make_shared<C>(inner_->split(color, key));
        return stepped_communicator(std::move(owned), step_);
    }

private:
    stepped_communicator(std::shared_ptr<C> owned, std::shared_ptr<std::uint64_t> step)
        : base(std::move(owned)), step_(std::move(step)) {}

    collective_call stamped(const collective_call& call) const noexcept {
        collective_call c = call;
        if (c.op != operation::send && c.op != operation::recv) {
            c.step = *step_;
        }
        return c;
    }

    std::shared_ptr<std::uint64_t> step_;
};

} // namespace unison
