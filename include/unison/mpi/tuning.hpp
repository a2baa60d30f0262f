#pragma once

/// \file
/// The MPI backend's tuning: which algorithm carries an all-reduce of a given size
/// over a given number of ranks. Every threshold is defined here, once, with the
/// measurement behind it (docs/performance.md, "All-reduce at scale", has the
/// tables and the commands that reproduce them); the backend asks
/// `mpi_all_reduce_algorithm` and nothing else. `comm_options::all_reduce_algorithm`
/// (or UNISON_ALGORITHM) forces one algorithm on every call instead.
///
/// The algorithms (comm/algorithm.hpp has their costs):
/// - recursive_doubling: the data rides the call check's own messages (handshake.hpp),
///   log2(n) exchanges of the whole buffer: the fewest messages, so the choice for
///   small buffers;
/// - rabenseifner (rabenseifner.hpp): recursive halving then doubling, the call check
///   riding the halving: 2 log2(n) messages and twice the data, for medium buffers on
///   many ranks;
/// - ring (ring_allreduce.hpp): after the check, 2 (n - 1) messages of 1/n of the
///   buffer each, sent straight from and into the caller's tensors: the least data
///   per link and no scratch beyond one chunk, for large buffers and few ranks;
/// - native: after the check, MPI's own MPI_Iallreduce.

#include "unison/comm/algorithm.hpp"

#include <bit>
#include <cstddef>

namespace unison::mpi_tuning {

// ---- One node: every rank shares memory with every other (MPI_COMM_TYPE_SHARED).
// Measured on Open MPI 4.1 over shared memory at 2-4 processes (docs/performance.md,
// "MPI all-reduce"): recursive doubling rides the handshake's messages, and from 64
// KiB the ring, whose sends read straight from the tensors, matches MPI_Allreduce
// while recursive doubling's staging copies cost more than the ring's second step.

/// One node: recursive doubling below this many bytes, the ring from it on.
inline constexpr std::size_t node_ring_min_bytes = 64 * 1024;

// ---- Several nodes. Measured in simulation (bench/simulation/simulate.sh: flat,
// two-level and fat-tree clusters of 12.5 GB/s, 2 us links, 4-64 ranks; the tables
// are in docs/performance.md, "All-reduce at scale"). Recursive doubling moves the
// whole buffer log2(n) times and Rabenseifner twice, at twice the messages: with 4
// ranks they send equally many messages and recursive doubling stays ahead up to
// megabytes; from 8 ranks Rabenseifner is ahead from a few KiB on. The ring's
// 2 (n - 1) messages lost to Rabenseifner's 2 log2(n) at every size on every
// platform when n is a power of two; when it is not, Rabenseifner's fold sends the
// whole buffer twice more, which the ring wins back on large buffers.

/// Several nodes: recursive doubling below this many bytes, for up to
/// few_ranks ranks ...
inline constexpr int few_ranks = 4;
inline constexpr std::size_t few_ranks_rabenseifner_min_bytes = 2 * 1024 * 1024;
/// ... and for up to 8 ranks ...
inline constexpr int some_ranks = 8;
inline constexpr std::size_t some_ranks_rabenseifner_min_bytes = 16 * 1024;
/// ... and for more.
inline constexpr std::size_t many_ranks_rabenseifner_min_bytes = 8 * 1024;
/// Several nodes, a rank count that is not a power of two: the ring from this many
/// bytes per rank on (a ring step's message is then large enough that its
/// per-message cost is below the fold's extra transfer of the buffer).
inline constexpr std::size_t ring_min_bytes_per_rank = 512 * 1024;

static_assert(many_ranks_rabenseifner_min_bytes <= some_ranks_rabenseifner_min_bytes &&
                  some_ranks_rabenseifner_min_bytes <= few_ranks_rabenseifner_min_bytes,
              "the more ranks, the sooner recursive doubling's log2(n) whole-buffer "
              "exchanges cost more than Rabenseifner's extra messages");
static_assert(few_ranks < some_ranks);
static_assert(ring_min_bytes_per_rank * some_ranks > some_ranks_rabenseifner_min_bytes,
              "the ring takes over only above Rabenseifner's range");

/// The smallest all-reduce, in bytes, that Rabenseifner carries over `ranks` ranks
/// on several nodes.
constexpr std::size_t rabenseifner_min_bytes(int ranks) noexcept {
    return ranks <= few_ranks    ? few_ranks_rabenseifner_min_bytes
           : ranks <= some_ranks ? some_ranks_rabenseifner_min_bytes
                                 : many_ranks_rabenseifner_min_bytes;
}

/// The algorithm that carries an all-reduce of `bytes` over `ranks` ranks when
/// none is forced; `one_node` when every rank shares memory with every other.
constexpr algorithm all_reduce(std::size_t bytes, int ranks, bool one_node) noexcept {
    if (ranks <= 1) {
        return algorithm::recursive_doubling;
    }
    if (one_node) {
        return bytes < node_ring_min_bytes ? algorithm::recursive_doubling : algorithm::ring;
    }
    if (bytes < rabenseifner_min_bytes(ranks)) {
        return algorithm::recursive_doubling;
    }
    const bool power_of_two = std::has_single_bit(static_cast<unsigned>(ranks));
    if (!power_of_two && bytes / static_cast<std::size_t>(ranks) >= ring_min_bytes_per_rank) {
        return algorithm::ring;
    }
    return algorithm::rabenseifner;
}

} // namespace unison::mpi_tuning

namespace unison {

/// The algorithm the MPI backend runs for an all-reduce of `bytes` over `ranks`
/// ranks (`one_node`: all of them sharing memory), `forced` being
/// comm_options::all_reduce_algorithm. One rank has nothing to exchange, whatever
/// is forced: recursive doubling, which then only copies.
constexpr algorithm mpi_all_reduce_algorithm(algorithm forced, std::size_t bytes, int ranks,
                                             bool one_node) noexcept {
    if (ranks <= 1) {
        return algorithm::recursive_doubling;
    }
    return forced == algorithm::automatic ? mpi_tuning::all_reduce(bytes, ranks, one_node) : forced;
}

} // namespace unison
