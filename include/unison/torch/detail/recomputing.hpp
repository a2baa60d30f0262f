#pragma once

/// \file
/// Whether this thread is re-running a forward for `unison::torch::recompute`
/// (torch/recompute.hpp): `unit_forward` then enters the unit's recomputation
/// instead of a new forward use.

namespace unison::torch::detail {

/// Recomputations in progress on this thread.
inline thread_local int recomputing = 0;

/// Marks the thread as recomputing while it lives.
struct recomputing_scope {
    recomputing_scope() noexcept { ++recomputing; }
    ~recomputing_scope() { --recomputing; }
    recomputing_scope(const recomputing_scope&) = delete;
    recomputing_scope& operator=(const recomputing_scope&) = delete;
};

} // namespace unison::torch::detail
