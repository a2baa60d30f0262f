#pragma once

/// \file
/// The thread backend's tuning. The MPI backend picks among message schedules by
/// size and rank count (mpi/tuning.hpp); the thread backend sends no messages, so it
/// has one schedule for every size and rank count. Once every rank has published its
/// call and the calls match, each rank reduces its own share of the buffer straight
/// from every peer's input, folding the ranks in rank order, and writes the result
/// into every peer's output: the two halves of `algorithm::rank_ordered` (each block
/// folded by its owner, then all-gathered) fused into one pass over shared memory.
/// Its reductions therefore always give comm_options::deterministic's bits, on host
/// and device memory alike, and what is tuned here is how that pass touches memory:
/// where the shares start and end, and when outputs bypass the caches.
///
/// `comm_options::all_reduce_algorithm` (or UNISON_ALGORITHM) may name that schedule
/// (`automatic` or `rank_ordered`); naming any other is an argument_error when the
/// world is made, rather than silently running something else.

#include "unison/comm/algorithm.hpp"
#include "unison/core/error.hpp"

#include <algorithm>
#include <cstddef>
#include <string>

namespace unison::thread_tuning {

/// Each rank's share of a reduction starts and ends on a multiple of this many
/// bytes (as the element size allows), so that no two ranks write the same cache
/// line; a buffer of at most this many bytes is reduced by rank 0 alone.
inline constexpr std::size_t share_align_bytes = 256;

/// The elements [lo, hi) of a reduction that one rank folds and writes.
struct share {
    std::size_t lo = 0;
    std::size_t hi = 0;
};

/// Rank `rank`'s share of a reduction of `count` elements of `elem` bytes over
/// `ranks` ranks: equal shares rounded up to share_align_bytes, the last one short
/// and those past the end empty. Host and device memory share it.
constexpr share share_of(std::size_t count, std::size_t elem, int ranks, int rank) noexcept {
    const std::size_t per_block = std::max<std::size_t>(1, share_align_bytes / elem);
    std::size_t per_rank =
        (count + static_cast<std::size_t>(ranks) - 1) / static_cast<std::size_t>(ranks);
    per_rank = (per_rank + per_block - 1) / per_block * per_block;
    const std::size_t lo = std::min(count, per_rank * static_cast<std::size_t>(rank));
    return {lo, std::min(count, lo + per_rank)};
}

/// Out-of-place outputs at least this large are written with non-temporal stores:
/// they exceed the caches, and skipping the destination's read-for-ownership saves
/// a third of the memory traffic (without them, 1.9-2.5x a local `c = a + b` at 4-64
/// MiB out of place, with them 0.96-1.24x). In place, the lines were just read and
/// are in cache, so plain stores win there and streaming is never used. Measured at
/// 2 ranks: docs/measurements.md, "All-reduce, 2 ranks, float, sum: thread backend".
/// The tests build with 64 KiB to reach both paths at small sizes.
#ifndef UNISON_THREAD_STREAMING_MIN_BYTES
inline constexpr std::size_t streaming_min_bytes = std::size_t{1} << 20;
#else
inline constexpr std::size_t streaming_min_bytes = UNISON_THREAD_STREAMING_MIN_BYTES;
#endif

} // namespace unison::thread_tuning

namespace unison {

/// The all-reduce algorithm the thread backend runs when `forced` is asked for
/// (comm_options::all_reduce_algorithm): rank_ordered, for `automatic` and
/// `rank_ordered`. Any other is an argument_error naming it, from `operation`: the
/// thread backend has no other schedule to run, and running this one under
/// another's name would make a comparison of algorithms lie.
inline algorithm thread_all_reduce_algorithm(algorithm forced,
                                             const char* operation = "thread_world") {
    if (forced != algorithm::automatic && forced != algorithm::rank_ordered) {
        throw argument_error(
            -1, operation,
            "comm_options::all_reduce_algorithm (UNISON_ALGORITHM) forces " +
                std::string(to_string(forced)) +
                ", which the thread backend does not have: it reduces every size in one pass "
                "over shared memory, each rank folding its share in rank order (rank_ordered); "
                "force automatic or rank_ordered, or use the MPI backend");
    }
    return algorithm::rank_ordered;
}

} // namespace unison
