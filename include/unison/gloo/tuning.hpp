#pragma once

/// \file
/// The Gloo backend's tuning: Gloo runs every collective with its own algorithm
/// (an all-reduce is Gloo's ring, cut into segments of at most 1 MiB that are
/// reduced while the next ones travel), so the backend always runs
/// `algorithm::native`, and this file decides which comm_options it can honour: a
/// forced algorithm other than automatic, native or ring (what native is), or
/// comm_options::deterministic (the ring adds each segment's contributions in an
/// order that depends on the segment), is an argument_error when the communicator is
/// made, rather than silently ignored. Needs no Gloo, so that the rules are tested
/// everywhere.

#include "unison/comm/algorithm.hpp"
#include "unison/comm/options.hpp"
#include "unison/core/error.hpp"

#include <string>

namespace unison {

/// The all-reduce algorithm the Gloo backend runs when `forced` is asked for: native
/// (Gloo's ring) for automatic, native and ring. Any other is an argument_error on
/// `rank` from `operation`, naming it.
inline algorithm gloo_all_reduce_algorithm(algorithm forced, int rank, const char* operation) {
    if (forced != algorithm::automatic && forced != algorithm::native &&
        forced != algorithm::ring) {
        throw argument_error(rank, operation,
                             "comm_options::all_reduce_algorithm (UNISON_ALGORITHM) forces " +
                                 std::string(to_string(forced)) +
                                 ", which the Gloo backend does not run: Gloo all-reduces "
                                 "with its own ring (native); force automatic, native or ring");
    }
    return algorithm::native;
}

/// Refuses, with an argument_error on `rank` from `operation`, the comm_options the
/// Gloo backend cannot honour: comm_options::deterministic, and a forced all-reduce
/// algorithm it does not run (gloo_all_reduce_algorithm).
inline void gloo_check_options(const comm_options& options, int rank, const char* operation) {
    if (options.deterministic) {
        throw argument_error(rank, operation,
                             "comm_options::deterministic (UNISON_DETERMINISTIC) asks for "
                             "rank-order sums, which Gloo's ring does not give; use the "
                             "thread or MPI backend, or turn it off");
    }
    gloo_all_reduce_algorithm(options.all_reduce_algorithm, rank, operation);
}

} // namespace unison
