#pragma once

/// \file
/// The MPI backend's tuning: which algorithm carries an all-reduce, a reduce_scatter
/// or an all_gather of a given size over a given number of ranks. Every threshold is
/// defined here, once, with the measurement behind it (docs/measurements.md, "All-
/// reduce at scale", has the tables and the commands that reproduce them); the
/// backend asks `mpi_all_reduce_algorithm`, `mpi_reduce_scatter_algorithm` and
/// `mpi_all_gather_algorithm` and nothing else. `comm_options::all_reduce_algorithm`
/// (or UNISON_ALGORITHM) forces one algorithm on every call instead, and
/// `comm_options::tuning` (UNISON_TUNING_FILE; comm/tuning_rules.hpp) holds rules,
/// measured on the user's own cluster, that come before the thresholds here.
///
/// The algorithms (comm/algorithm.hpp has their costs):
/// - recursive_doubling: the data rides the call check's own messages (handshake.hpp),
///   log2(n) exchanges of the whole buffer: the fewest messages, so the choice for
///   small buffers; for an all_gather, log2(n) exchanges of the blocks gathered so
///   far (rabenseifner.hpp), for small ones;
/// - two_level: recursive doubling that knows the nodes (schedule.hpp): each node's
///   ranks reduce into its lowest over a binomial tree, those leaders run recursive
///   doubling, the result goes back down, all inside the call check as well; for
///   small buffers over several nodes of several ranks each, whose NICs would
///   otherwise carry every rank's message at every step; for an all_gather over such
///   nodes, after the check (node_all_gather.hpp), each node's blocks gathered at
///   its leader, the leaders exchanging whole nodes, each sending the result to its
///   node, for mid-sized and large ones;
/// - rabenseifner (rabenseifner.hpp): recursive halving then doubling, the call check
///   riding the halving: 2 log2(n) messages and twice the data, for everything
///   larger; its halving alone is the reduce_scatter over several nodes (but from
///   128 KiB on two whose second holds one rank) and for small buffers on one;
/// - ring (ring_allreduce.hpp): after the check, 2 (n - 1) messages of 1/n of the
///   buffer each, sent straight from and into the caller's tensors: no scratch
///   beyond one chunk and no fold, for large buffers on two to four ranks of one
///   node and on rank counts that are not a power of two (on one node, or with a
///   rank per node past 8 ranks; never over nodes of several ranks);
/// - native: after the check, MPI's own MPI_Iallreduce;
/// - rank_ordered (rank_ordered.hpp): after the check, the direct exchange: each
///   block straight to its owner, reduced there in rank order, then straight to
///   every rank: two exchanges of n - 1 messages posted at once. What
///   comm_options::deterministic runs (and its reduce and reduce_scatter too); the
///   all-reduce for larger buffers on 3 to 8 ranks of a node each, and the
///   reduce_scatter for larger buffers on one node and on 3 to 8 ranks of a node each
///   (mpi_tuning::reduce_scatter, which runs the first half of Rabenseifner's,
///   recursive halving, for the rest).

#include "unison/comm/algorithm.hpp"
#include "unison/comm/options.hpp"
#include "unison/core/error.hpp"

#include <algorithm>
#include <bit>
#include <cstddef>
#include <string>

namespace unison::mpi_tuning {

/// The nodes that `ranks` ranks fill when launchers place them node by node, at
/// most `node_ranks` to a node ...
constexpr int nodes_of(int ranks, int node_ranks) noexcept {
    return (ranks + node_ranks - 1) / node_ranks;
}
/// ... and the ranks on the last of those nodes when it is not full (0 when it is).
constexpr int last_node_ranks(int ranks, int node_ranks) noexcept {
    return ranks % node_ranks;
}
/// The ranks on the second node when they fill exactly two nodes of several ranks
/// and the second is not full; else 0.
constexpr int second_node_ranks(int ranks, int node_ranks) noexcept {
    return node_ranks > 1 && nodes_of(ranks, node_ranks) == 2 ? last_node_ranks(ranks, node_ranks)
                                                              : 0;
}
/// Whether they fill two nodes, the second holding one rank: that rank's link
/// carries its own traffic alone (the reduce_scatter and the all_gather then run
/// MPI's own from some size on).
constexpr bool lone_second_node(int ranks, int node_ranks) noexcept {
    return second_node_ranks(ranks, node_ranks) == 1;
}

// Recursive doubling moves the whole buffer log2(n) times in log2(n) messages (three
// times a power of two ranks: log2(n / 3) steps, then one of three);
// Rabenseifner twice in 2 log2(n) messages; the ring twice in 2 (n - 1) messages.
// So recursive doubling wins on small buffers, Rabenseifner from where the extra
// copies of the buffer cost more than its extra messages, and the ring only where
// Rabenseifner's fold (n not a power of two: the ranks beyond the largest power of
// two hand their whole buffer over and get the result back) costs more than the
// ring's extra messages.

// ---- Measured on one node, for real: Open MPI 4.1 over shared memory at 2
// processes (docs/measurements.md, "All-reduce, 2 processes, float, sum: MPI
// backend vs raw MPI_Allreduce"). Recursive doubling's staging copies cost more
// than the ring's second step from 64 KiB (measured when it staged its whole input
// out of place too; it still does in place), and the ring, whose sends read
// straight from the tensors, matches MPI_Allreduce there.

/// Up to this many ranks on one node: recursive doubling, then the ring.
inline constexpr int node_ring_max_ranks = 3;
/// ... from this many bytes.
inline constexpr std::size_t node_ring_min_bytes = 64 * 1024;

// Measured for real at 4 processes of Open MPI 4.1 on one node (2 cores, so
// oversubscribed: a rough check; docs/measurements.md, "At 4 real processes" and
// "Scratch that sits like the tensors"). In place over raw MPI_Allreduce, medians
// of 4 runs on an AMD EPYC: at 2 and 4 MiB the ring, straight from and into the
// caller's buffer, 0.88 and 0.89x, Rabenseifner's, whose halves gather in scratch
// while the call check rides them, 1.16 and 1.15x; at 1 MiB both 1.04x. (On an
// Intel Xeon the day before, with the scratch at the wrong offset in its cache
// lines, Rabenseifner's was 1.25-1.40x at 8-16 MiB and the ring 0.86-0.99x.) The
// simulation, which charges a node's every message a network's latency factor
// (3.5 us for a large one on its 0.3 us loopback), prefers Rabenseifner's on a
// node of 4 by a fixed 7 us, the ring's two extra steps: the ring 1.30x MPI's best
// at 1 MiB, 1.19x at 2 MiB, 1.11x at 4 MiB and 1.06x at 8 MiB, Rabenseifner's
// 1.01-1.07x. Where the two disagree the real node decides. At 1 MiB real nodes
// disagree: the EPYC put the two even once and Rabenseifner's ahead another day
// (1.03x against the ring's 1.11x, 3 runs); an Intel Xeon (2026-12-07, 14 runs,
// each the median of 5 interleaved rounds) put the ring at 0.86-1.22x in place
// (median 0.96) and Rabenseifner's at 1.02-1.21x (median 1.14 over the 7 runs of
// the day that ran both alike), out of place 0.81-1.04x against 0.88-0.98x. The
// ring loses less where it loses, so it starts at 1 MiB. At 512 KiB it led on the
// Xeon too (0.91-1.03x in place against 1.13-1.24x, 4 runs; not measured on the
// EPYC); at 128-256 KiB Rabenseifner's led or tied (1.05-1.25x against
// 1.03-1.58x). 8 ranks on a node were not measured for real (too many for 2
// cores), so they keep Rabenseifner's.

/// Up to this many ranks on one node ...
inline constexpr int node_large_ring_max_ranks = 4;
/// ... the ring from this many bytes.
inline constexpr std::size_t node_large_ring_min_bytes = 1024 * 1024;
static_assert(node_large_ring_max_ranks > node_ring_max_ranks &&
                  node_large_ring_min_bytes > node_ring_min_bytes,
              "the ring takes over from Rabenseifner on one node later with more ranks");

// ---- Measured in simulation (bench/simulation/simulate.sh; docs/measurements.md,
// "All-reduce at scale": a flat cluster, nodes of 8 ranks and a fat tree, links of
// 12.5 GB/s and 2 us, 2 to 64 ranks): the smallest all-reduce for which
// Rabenseifner beat recursive doubling. Two ranks on two nodes: never (both move
// the buffer once each way, recursive doubling in one message).

// On one node the measure is less sure: the simulated node (a 100 GB/s, 0.3 us
// link) is not a real one. A node simulated with this machine's measured memory
// (--node-link 0.135us,8.5GBps; docs/measurements.md, "How far the simulated node
// is from a real one") put recursive doubling at 1.13-1.74x MPI's best at 16-128
// KiB on 4 and 8 ranks and Rabenseifner's at 0.99-1.14x; on the file's node
// recursive doubling led at 16-64 KiB (0.79-0.97x against 1.07-1.21x, SimGrid's
// 0.1 us poll). Real
// processes (4 on 2 cores, 2026-12-07) put recursive doubling ahead at 16-32 KiB
// (1.14-1.48x raw MPI against 1.44-1.69x) and Rabenseifner's a little at 64 KiB
// (medians of 5 to 8 runs out of place 1.27x against 1.42x, in place 1.39x
// against 1.40x). At 64 KiB Rabenseifner's is within 1.1x on both simulated nodes
// at 4 and 8 ranks (1.07 and 1.09x on the file's, 0.99 and 1.00x on the measured
// one) and recursive doubling is not (1.20 and 1.60x on the measured one); on one
// node of 16 and 32 it is 1.11 and 1.13x on the file's node (recursive doubling
// 1.06 and 1.17x) and 1.01-1.02x on the measured one (1.97-2.33x). So it starts
// there (128 KiB before).

/// More ranks on one node than node_ring_max_ranks (the node's memory shared by
/// all: nodes of 8 ranks, 4 and 8 of them).
inline constexpr std::size_t node_rabenseifner_min_bytes = 64 * 1024;
static_assert(node_large_ring_min_bytes > node_rabenseifner_min_bytes,
              "on a node of 4, Rabenseifner's has sizes before the ring takes over");
/// Several nodes, up to 4 ranks ...
inline constexpr std::size_t few_ranks_rabenseifner_min_bytes = 2 * 1024 * 1024;
/// ... up to 8 ...
inline constexpr std::size_t some_ranks_rabenseifner_min_bytes = 16 * 1024;
/// ... and more: the same. Over MPI's best at 16-128 ranks, one per node: at 8
/// KiB recursive doubling 0.78-1.04x on the flat cluster and 0.75-0.99x on the fat
/// tree, Rabenseifner 1.30-1.64x and 0.91-1.27x; at 16 KiB Rabenseifner 0.70-1.01x
/// and 0.41-1.02x, recursive doubling 0.77-1.01x and 0.92-2.14x (sweeps by factors
/// of 2; an 8 KiB threshold, read off a sweep by factors of 8, had left 8 KiB at
/// 1.30-1.38x on the flat cluster).
inline constexpr std::size_t many_ranks_rabenseifner_min_bytes = 16 * 1024;

// ---- Rank counts that are not a power of two, measured the same way at 3, 6, 12,
// 24, 48 and 96 ranks. Rabenseifner's fold makes the ranks beyond the largest power of two
// hand their whole buffer over and get the result back, which recursive doubling's
// fold costs too but the ring's 2 (n - 1) steps do not.

/// Up to 4 ranks, not a power of two: recursive doubling, then the ring from this
/// many bytes ...
inline constexpr std::size_t odd_few_ring_min_bytes = 64 * 1024;
/// ... up to odd_some_ranks: from this many.
inline constexpr int odd_some_ranks = 8;
inline constexpr std::size_t odd_some_ring_min_bytes = 2 * 1024 * 1024;
/// More ranks, not a power of two: recursive doubling below this many bytes, then
/// Rabenseifner ...
inline constexpr std::size_t odd_rabenseifner_min_bytes = 64 * 1024;
/// ... but across nodes from many_ranks_rabenseifner_min_bytes, as for a power of
/// two: the fold costs recursive doubling the same two steps (and 3, 5 or 7 times a
/// power of two fold nothing: schedule.hpp's groups). Simulated with a rank per
/// node at 16 and 32 KiB, over MPI's best on the flat cluster and the fat tree: at
/// 9, 11 and 13 ranks (folds) Rabenseifner's 0.90-1.08x, recursive doubling
/// 0.76-1.32x (1.07-1.32x on the fat tree); at 12, 24 and 48 (groups of three)
/// 0.51-0.78x against 0.59-1.53x; at 10, 20 and 40 (groups of five, 2026-12-06)
/// 0.46-0.67x against 0.48-1.58x. (While 10 ranks folded, recursive doubling led
/// there on the flat cluster, 0.82 and 0.98x against 1.11 and 1.29x.) One node of
/// so many ranks was not measured and keeps odd_rabenseifner_min_bytes.
/// ... and the ring from this many bytes per rank (its messages then large enough
/// that their number costs less than the fold). Over nodes of several ranks,
/// Rabenseifner's instead, from two_level_max_bytes (all_reduce, below).
inline constexpr std::size_t ring_min_bytes_per_rank = 512 * 1024;

// ---- Deterministic reductions (comm_options::deterministic; rank_ordered.hpp),
// measured in simulation the same way: two phases (each block to its owner, then
// the reduced blocks to every rank) cost two exchanges after the check; one phase
// (every rank's whole input to every rank) costs one, but (n - 1) times the input
// from every rank, which pays off while that is about what a link carries in a
// message's latency.

/// An all-reduce or reduce in rank order whose every rank would send at most this
/// many bytes in one phase ((n - 1) times its input) takes one phase.
inline constexpr std::size_t rank_ordered_direct_max_bytes = 64 * 1024;

/// Whether a rank-ordered all-reduce or reduce of `bytes` over `ranks` ranks takes
/// one phase.
constexpr bool rank_ordered_direct(std::size_t bytes, int ranks) noexcept {
    return ranks <= 1 ||
           bytes <= rank_ordered_direct_max_bytes / static_cast<std::size_t>(ranks - 1);
}

// ---- reduce_scatter. Three ways: recursive halving (rabenseifner.hpp: the first
// half of Rabenseifner's all-reduce, the call check riding it, log2(n) messages);
// the direct exchange (rank_ordered.hpp: after the check, each block straight to
// its owner, folded there: one step, but n - 1 messages per rank); MPI's own after
// the check (native).
//
// Measured in simulation (docs/measurements.md, "reduce_scatter and all_gather at
// scale"; 4 to 32 ranks, 1 KiB to 4 MiB in all): over several nodes, with n a power
// of two, the halving was 0.25-1.05x MPI's best at every size, where the direct
// exchange and native were 1.3-2.5x at 1-8 KiB (their separate check) and 2.9-3.5x
// on nodes of 8 ranks from 64 KiB (every block crossing the node's NIC on its own).
// With n not a power of two (6, 12, 24 ranks), the fold (a rank's whole input to
// its neighbour) made the halving 1.1-2.1x from 512 KiB, where MPI's own was
// 0.25-0.9x; below 64 KiB the halving was 0.98-1.08x against MPI's 1.36-1.9x.
//
// On one node, measured for real (Open MPI 4.1 over shared memory, 2 and 4
// processes): the halving's copies into scratch cost more than the direct
// exchange's one step from 16 KiB at 2 processes (8.3 us against 5.5 at 16 KiB,
// 88 against 45 at 256 KiB) and at 256 KiB at 4 (208 against 184); below that it
// was 0.7-0.9x the direct exchange's time (64 against 71 us at 64 KiB, 4
// processes). Simulated nodes of 4 and 8 ranks agree (the two within 10% at 64 KiB,
// the direct exchange 0.56-0.60x MPI's best from 128 KiB, the halving 0.69-0.73x),
// so the direct exchange takes over at 64 KiB. 3 ranks (a fold) were not measured.
//
// Over nodes of several ranks (nodes of 8, 10 to 24 ranks, 32 KiB to 2 MiB,
// 2026-12-06), the halving beat MPI's own after the check at every size and count:
// 0.15-1.35x MPI's best (1.03-1.35x at 512 KiB, where the simulated MPI's time
// drops below its 128 KiB one), MPI's own 0.65-3.54x (1.38-3.54x at 512 KiB;
// the direct exchange no better, 0.61-3.49x), so there the halving takes every
// size whatever the count, but on two nodes whose second holds one rank
// (lone_node_scatter_halving_max_bytes).
//
// With a rank per node, 3 to 8 ranks (flat cluster and fat tree, 2026-12-06, 128
// KiB to 4 MiB by factors of 2, every result checked): the direct exchange after
// the check beat the halving from 256 KiB in every cell, 0.37-0.95x MPI's best
// against 0.60-0.98x at 4 and 8 ranks (flat, 8 ranks, 1 MiB: 0.46 against 0.72),
// and still did with 0.5 us charged for posting each message, which the simulation
// leaves free (0.47-0.95x against 0.63-0.99x). At 128 KiB it led only with posting
// free (0.60-0.80x against 0.60-1.41x; with the charge 0.65-0.98x against
// 0.60-0.85x), and at 16 and 32 ranks from 256 KiB likewise (0.28-0.59x against
// 0.40-1.18x free, 0.53-0.98x against 0.44-0.90x charged). At 3, 5, 6 and 7 ranks
// it was within 0.02 of MPI's own after the check, which ran there before
// (0.24-0.94x). Its many-to-one traffic is what bounds it to 8 ranks, as the
// all-reduce's direct exchange (direct_max_ranks).

/// One node: recursive halving below this many bytes (the input), over 2 ranks ...
inline constexpr std::size_t pair_halving_max_bytes = 16 * 1024;
/// ... and more; the direct exchange from there.
inline constexpr std::size_t node_halving_max_bytes = 64 * 1024;
/// A rank per node, a rank count not a power of two: recursive halving below this
/// many bytes, MPI's own from there. (A power of two, or nodes of several ranks:
/// the halving at every size, but for 3 to 8 ranks of a node each and on two
/// nodes whose second holds one rank, below.)
inline constexpr std::size_t odd_halving_max_bytes = 64 * 1024;

/// A rank per node, 3 to this many ranks: the direct exchange from ...
inline constexpr int few_nodes_scatter_direct_max_ranks = 8;
/// ... this many bytes (the input) on.
inline constexpr std::size_t few_nodes_scatter_direct_min_bytes = 256 * 1024;

/// Two nodes, the second holding one rank (lone_second_node): the halving below
/// this many bytes, MPI's own from there (twice as many for a power of two ranks,
/// which fold nothing). The halving's fold (or, for a power of two, its steps)
/// sends whole halves through the lone rank's one link, where MPI's own sends it
/// only its share. Over MPI's best (2026-12-06, the two-level platform with 2 to 16
/// ranks placed on each host, 3 to 17 ranks): at 3, 5, 7, 9 and 17 ranks from 128
/// KiB to 4 MiB MPI's own led in every cell, 0.38-0.98x against the halving's
/// 0.52-1.88x (at 64 KiB and from 80 to 110 KiB by factors of 1.1 the halving
/// 0.92-1.06x, MPI's own 1.05-1.40x; at 117 KiB either leads); at 4, 8 and 16 ranks
/// the halving led at 128 KiB (0.53-0.55x against 0.57-0.71x) and MPI's own from
/// 256 KiB (0.31-1.06x against 0.51-1.60x; but at 4 ranks and 256 KiB 0.60 against
/// 0.56x). At 9 ranks and 16 and 64 MiB: 0.82 and 0.95x against 0.88 and 0.96x.
inline constexpr std::size_t lone_node_scatter_halving_max_bytes = 128 * 1024;
constexpr std::size_t lone_node_scatter_native_from(int ranks) noexcept {
    return std::has_single_bit(static_cast<unsigned>(ranks))
               ? 2 * lone_node_scatter_halving_max_bytes
               : lone_node_scatter_halving_max_bytes;
}

static_assert(odd_halving_max_bytes <= few_nodes_scatter_direct_min_bytes,
              "a rank count that is not a power of two leaves the halving first");
static_assert(pair_halving_max_bytes <= node_halving_max_bytes,
              "two ranks gain least from halving (one exchange, as the direct exchange "
              "after its check), so they leave it first");

/// The algorithm that carries a reduce_scatter of `bytes` in all (the input: count
/// times the ranks) over `ranks` ranks; `node_ranks` is the most ranks one node
/// holds (`ranks` when every rank shares memory with every other, 1 with one rank
/// per node).
constexpr algorithm reduce_scatter(std::size_t bytes, int ranks, int node_ranks) noexcept {
    if (ranks <= 1) {
        return algorithm::native;
    }
    if (node_ranks >= ranks) { // one node
        const std::size_t halving_below =
            ranks == 2 ? pair_halving_max_bytes : node_halving_max_bytes;
        return bytes < halving_below ? algorithm::rabenseifner : algorithm::rank_ordered;
    }
    if (node_ranks <= 1 && ranks >= 3 && ranks <= few_nodes_scatter_direct_max_ranks &&
        bytes >= few_nodes_scatter_direct_min_bytes) {
        return algorithm::rank_ordered;
    }
    if (node_ranks <= 1 && !std::has_single_bit(static_cast<unsigned>(ranks)) &&
        bytes >= odd_halving_max_bytes) {
        return algorithm::native;
    }
    if (lone_second_node(ranks, node_ranks) && bytes >= lone_node_scatter_native_from(ranks)) {
        return algorithm::native;
    }
    return algorithm::rabenseifner;
}

// ---- all_gather. Four ways: recursive doubling with the call check riding every
// message (rabenseifner.hpp's all_gather: log2(n) steps, the data gathered in
// scratch and copied out at the end); after the check (a recursive doubling of its
// own, before any data moves), the node-aware one (two_level, node_all_gather.hpp:
// each node's blocks gathered at its leader, the leaders exchanging whole nodes'
// blocks in ceil(log2 nodes) steps, each leader sending the result to its node),
// the ring (ring_allreduce.hpp's second half: n - 1 steps, each rank's block passed
// on to the next rank, straight into the outputs) or MPI's own (native).
//
// Measured in simulation (docs/measurements.md, "reduce_scatter and all_gather at
// scale"; 4 to 64 ranks on the three clusters): recursive doubling was 1.02-1.09x
// MPI's best at 1-8 KiB across nodes where native was 1.44-2.59x; at 64 KiB and
// more it was sometimes far behind (1.81-2.22x at 32 ranks on nodes of 8, where
// native was 1.33-2.43x). On one node, measured for real (Open MPI 4.1, 2
// processes): recursive doubling took 1.3-2.8 us at 2-8 KiB against native's
// 2.2-4.2, and 6.1 against 3.1-5.5 at 16 KiB (its 8 KiB messages cut in two, where
// MPI's shared-memory path copies once).
//
// Over nodes of several ranks, every message of recursive doubling and of the
// MPI's own crosses the node's one NIC beside the node's other ranks' (the
// simulated MPI's non-blocking all-gather posts every block to every rank at
// once); the ring, ranks numbered node by node, sends one block at a time out of
// each node but pays n - 1 latencies; the node-aware one sends one message per
// node and step, but its check runs before it and its leaders' messages are
// whole nodes (a rendezvous each from 64 KiB). Over MPI's best on nodes of 8
// (16, 32 and 64 ranks, 2026-12-06): at 4-16 KiB recursive doubling 1.04-1.06x
// (1.36x at 64 ranks and 16 KiB), two_level 1.53-1.95x, the ring 2.44-3.56x; at
// 32 KiB two_level 0.93 / 1.07x at 16 / 32 ranks, recursive doubling 0.89 /
// 1.48x; at 64 KiB two_level 0.66-0.83x, the ring 0.75-1.18x; from 128 to 512 KiB
// the ring 0.42-0.89x, two_level 0.38-1.22x; from 1 MiB two_level 0.11-0.77x, the
// ring 0.41-1.83x (1.83 at 16 ranks and 1 MiB, where its 64 KiB blocks each wait
// for a rendezvous). With one rank per node or on one node the ring lost to
// native at every size from 64 KiB (0.83-4.38x against 0.26-1.62x), and two_level
// too (1.02-2.03x on 8 and 32 ranks of the flat cluster and the fat tree, native
// 0.23-0.96x), so they run only over several nodes of several ranks (on nodes
// of 2, two_level only from pair_nodes_all_gather_two_level_min_bytes).

/// Recursive doubling below this many bytes (the output: count times the ranks)
/// over nodes of one rank, from there MPI's own (but see
/// all_gather_doubling_max_block_bytes) ...
inline constexpr std::size_t all_gather_doubling_max_bytes = 64 * 1024;
/// ... and on one node.
inline constexpr std::size_t node_all_gather_doubling_max_bytes = 16 * 1024;
/// With a rank per node, recursive doubling also while each rank's block is at most
/// this many bytes: MPI's own posts n - 1 messages of one block per rank, whose
/// number costs more than recursive doubling's log2(n) steps until the blocks are
/// large. Over MPI's best at 64 ranks (flat cluster / fat tree, 2026-11-30): at 64
/// KiB (1 KiB blocks) recursive doubling 1.01 / 1.03x, MPI's own 1.39 / 2.03x; at
/// 128 KiB recursive doubling 0.82 / 1.06x; at 32 ranks and 64 KiB (2 KiB blocks)
/// 0.93 / 1.04x against 1.06 / 1.11x. At 16 ranks and 64 KiB (4 KiB blocks) MPI's
/// own led on the fat tree (0.87 against 1.08x), so the bound is 2 KiB.
inline constexpr std::size_t all_gather_doubling_max_block_bytes = 2 * 1024;
/// Over nodes of several ranks: recursive doubling below this many bytes, then
/// two_level (nodes of 8 ranks and more; see nodes_all_gather_two_level_from) ...
inline constexpr std::size_t nodes_all_gather_two_level_min_bytes = 32 * 1024;
/// ... and on smaller nodes from this many bytes over a node's ranks. Recursive
/// doubling's steps between nodes send every rank's message through the node's
/// link at once; the fewer ranks share it, the longer recursive doubling leads.
/// Over MPI's best (2026-12-06, the two-level platform with 2, 4 or 16 ranks
/// placed on each host; docs/measurements.md): on nodes of 2 at 8 and 16 ranks,
/// 32-64 KiB, recursive doubling 0.89-1.21x, two_level 1.37-1.62x; on nodes of 4
/// at 32 KiB, 8 to 32 ranks, recursive doubling 0.84-1.04x, two_level 1.19-1.35x,
/// and at 64 KiB two_level 0.96-1.07x, recursive doubling 0.95-1.45x; on nodes of
/// 16 at 32 ranks two_level 0.72x at 32 KiB, recursive doubling 0.96x.
inline constexpr std::size_t small_nodes_all_gather_two_level_bytes = 256 * 1024;
/// ... the ring from this many ...
inline constexpr std::size_t nodes_all_gather_ring_min_bytes = 128 * 1024;
/// ... or sooner, once a node's blocks (the bytes over the ranks, times the ranks
/// of a full node) reach this many bytes: two_level's leaders exchange them in one
/// message, which from here waits for a rendezvous (the eager limit, as below),
/// while the ring's blocks stay small. Only below twice a node's ranks does this
/// come before nodes_all_gather_ring_min_bytes. On nodes of 8 (2026-12-06, 64 to
/// 128 KiB by factors of 1.1), over MPI's best: at 12 ranks and 103 KiB (69 KiB of
/// a node's blocks) the ring 0.50x, two_level 0.93x; at 14 ranks and 113 KiB (65
/// KiB) 0.47x against 0.83x; just below (12 ranks and 94 KiB, 14 ranks and 103
/// KiB: 62 and 59 KiB) the two within 0.02x of each other (0.69-0.93x).
inline constexpr std::size_t nodes_all_gather_leader_max_bytes = 64 * 1024;
/// ... and two_level again from this many, or once the ring's blocks (the bytes
/// over the ranks) are this large: each of its n - 1 steps then waits for a
/// rendezvous (the eager limit simulate.sh gives SMPI, Open MPI's over TCP). At 9
/// to 14 ranks on nodes of 8 (2026-12-06, 320 KiB to 1 MiB) the ring was
/// 0.48-1.13x MPI's best with blocks under 64 KiB and 1.87-3.52x from 65 KiB,
/// where two_level was 0.34-1.02x.
inline constexpr std::size_t nodes_all_gather_ring_max_bytes = 1024 * 1024;
inline constexpr std::size_t nodes_all_gather_ring_max_block_bytes = 64 * 1024;
/// Nodes of fewer ranks than this (nodes of 2) take the rule of a rank per node,
/// recursive doubling for small calls and MPI's own after the check from there,
/// up to pair_nodes_all_gather_two_level_min_bytes. Over MPI's best (2026-12-06,
/// the two-level platform with 2 ranks on each host, 8, 16 and 32 ranks, 16 KiB
/// to 4 MiB): MPI's own 0.58-1.01x from 64 KiB to 1 MiB (where the blocks are over
/// 2 KiB; at 32 ranks and 64 KiB recursive doubling stays, 1.21x against MPI's own
/// 1.20x), where the tuning for
/// larger nodes ran recursive doubling (up to 1.40x below 128 KiB) and the ring
/// (0.82-1.32x); below 64 KiB recursive doubling 0.89-1.04x, MPI's own
/// 1.14-1.81x.
inline constexpr int nodes_all_gather_min_node_ranks = 3;
/// On nodes of 2, two_level from this many bytes: 0.67-0.76x at 2 and 4 MiB (8
/// and 16 ranks), MPI's own 0.86-0.95x; at 1 MiB the two trade places (MPI's own
/// 0.59-0.87x at 8 to 32 ranks, two_level 0.65-0.86x).
inline constexpr std::size_t pair_nodes_all_gather_two_level_min_bytes = 2 * 1024 * 1024;
/// The smallest all_gather that two_level carries over nodes of `node_ranks` ranks,
/// 3 and more (the ring may take it first; nodes of 2: above).
constexpr std::size_t nodes_all_gather_two_level_from(int node_ranks) noexcept {
    return std::max(nodes_all_gather_two_level_min_bytes,
                    small_nodes_all_gather_two_level_bytes /
                        static_cast<std::size_t>(std::max(node_ranks, 1)));
}
static_assert(nodes_all_gather_two_level_from(8) == nodes_all_gather_two_level_min_bytes &&
                  nodes_all_gather_two_level_from(4) == 2 * nodes_all_gather_two_level_min_bytes,
              "from nodes of 8 the fixed bound; on nodes of 4 twice it");
static_assert(all_gather_doubling_max_bytes < pair_nodes_all_gather_two_level_min_bytes,
              "on nodes of 2 MPI's own has a range of sizes before two_level");
static_assert(nodes_all_gather_leader_max_bytes == nodes_all_gather_ring_max_block_bytes,
              "both bounds are the eager limit: two_level's leaders' messages and the "
              "ring's each wait for a rendezvous from there");

/// On two nodes whose second holds fewer than half a node (9 to 11 ranks on nodes
/// of 8), recursive doubling runs up to the ring (MPI's own where the second holds
/// one rank, below): two_level's check and its one leader gathering and handing out
/// a whole node cost more than the fold. At 64 KiB (2026-12-06): two_level
/// 1.44-1.80x MPI's best, recursive doubling 1.11-1.33x (MPI's own 1.23-1.40x).
/// With three or more nodes and a small last one (17, 18, 25, 26, 33 ranks) both
/// were within 1.02x at 64 KiB and two_level ahead at 128 KiB, so those keep the
/// full nodes' rule.
constexpr bool small_second_node(int ranks, int node_ranks) noexcept {
    const int second = second_node_ranks(ranks, node_ranks);
    return second != 0 && 2 * second < node_ranks;
}
/// On two nodes of at most this many ranks whose second holds half a node (12
/// ranks on nodes of 8, 6 on nodes of 4), recursive doubling runs until the ring
/// starts (once a node's blocks reach nodes_all_gather_leader_max_bytes, 96 KiB at
/// both) instead of two_level from nodes_all_gather_two_level_from: from 32 to 94
/// KiB by factors of 1.1 (2026-12-06) two_level was 0.95-1.27x MPI's best at 12
/// ranks and 1.27-1.34x at 6 from 64 KiB, recursive doubling 0.91-1.04x and
/// 1.04-1.07x. On nodes of 16 (24 ranks) two_level led from 36 KiB (0.75-0.94x,
/// recursive doubling 0.92-1.13x): a half node of 8 gains from its leader. Nodes
/// of 6 (9 ranks) take the rule without a measurement.
inline constexpr int half_second_node_max_ranks = 8;
constexpr bool half_second_node(int ranks, int node_ranks) noexcept {
    const int second = second_node_ranks(ranks, node_ranks);
    return second != 0 && node_ranks <= half_second_node_max_ranks && 2 * second == node_ranks;
}
/// There the ring takes over from recursive doubling at this many bytes: at 10
/// and 11 ranks recursive doubling went from 0.47 / 0.72x MPI's best at 103 KiB to
/// 0.97 / 1.11x at 113 KiB, where the ring was 0.71 / 0.78x (at 9 ranks it held
/// 0.43x to 113 KiB and was 0.97x at 125 KiB, the ring 0.78-0.79x; from there it
/// now runs MPI's own, lone_second_node below).
inline constexpr std::size_t small_second_node_ring_min_bytes = 112 * 1024;
static_assert(nodes_all_gather_two_level_min_bytes < small_second_node_ring_min_bytes &&
                  small_second_node_ring_min_bytes <= nodes_all_gather_ring_min_bytes,
              "the ring comes no later on a small second node than on full ones");
// On two nodes whose second holds one rank (lone_second_node) the all_gather runs
// MPI's own from small_second_node_ring_min_bytes on, where the ring and two_level
// run over other small second nodes. The lone rank's link carries only its own
// traffic, which MPI's non-blocking all-gather posts at once, while the ring's
// n - 1 steps and two_level's check and leaders each wait. Over MPI's best (2026-12-06,
// the two-level platform with 3, 4, 6, 8 or 16 ranks placed on each host, 128 KiB
// to 4 MiB by factors of 2, 9 ranks on nodes of 8 also by 1.25 from 112 KiB and at
// 8, 16 and 64 MiB): MPI's own 0.47-0.92x at 4, 5, 7, 9 and 17 ranks, where the
// tuning ran the ring (0.68-1.47x) and two_level (0.81-1.29x). A second node of 2
// (10 ranks on nodes of 8, 18 on nodes of 16) keeps the ring and two_level:
// 0.61-0.95x against MPI's own 0.54-1.05x.
static_assert(small_second_node(nodes_all_gather_min_node_ranks + 1,
                                nodes_all_gather_min_node_ranks) &&
                  lone_second_node(nodes_all_gather_min_node_ranks + 1,
                                   nodes_all_gather_min_node_ranks) &&
                  !lone_second_node(17, 8),
              "on the smallest nodes that take this rule a lone rank's node is a small "
              "second node (recursive doubling below the ring's bound), so it is on "
              "every larger one; three nodes are not two");

/// The node-aware all_gather hands a node of at most this many ranks the result
/// from its leader directly, a larger one down a binomial tree of its ranks. Over
/// nodes of 8 in simulation (16-64 ranks, 16 KiB-4 MiB, 2026-12-06) the tree took
/// 4-25% longer (its extra hops' latencies; a simulated node's ranks share one
/// loopback link, so it saves no bytes there): 1.09x against 1.03x MPI's best at
/// 32 ranks and 32 KiB, 0.35x against 0.28x at 16 ranks and 1 MiB. On a larger
/// node the leader's k - 1 sends of the whole buffer would queue behind its own
/// copies where the transport copies through shared buffers (not measured).
inline constexpr int node_all_gather_flat_max_ranks = 8;

static_assert(node_all_gather_doubling_max_bytes <= all_gather_doubling_max_bytes,
              "a node's shared memory makes MPI's own all-gather cheap sooner");
static_assert(all_gather_doubling_max_block_bytes * 16 < all_gather_doubling_max_bytes,
              "at 16 ranks and fewer the whole buffer's bound decides");
static_assert(nodes_all_gather_two_level_min_bytes < nodes_all_gather_ring_min_bytes &&
                  nodes_all_gather_ring_min_bytes < nodes_all_gather_ring_max_bytes,
              "over nodes of several ranks each algorithm has a range of sizes");
static_assert(nodes_all_gather_ring_max_bytes <= 16 * nodes_all_gather_ring_max_block_bytes,
              "from 16 ranks on the whole buffer's bound ends the ring");

/// The algorithm that carries an all_gather of `bytes` in all over `ranks` ranks;
/// `node_ranks` is the most ranks one node holds (`ranks` when every rank shares
/// memory with every other, 1 with one rank per node).
constexpr algorithm all_gather(std::size_t bytes, int ranks, int node_ranks) noexcept {
    if (ranks <= 1) {
        return algorithm::native;
    }
    if (node_ranks >= ranks) { // one node
        return bytes < node_all_gather_doubling_max_bytes ? algorithm::recursive_doubling
                                                          : algorithm::native;
    }
    if (node_ranks >= nodes_all_gather_min_node_ranks) {
        const std::size_t block = bytes / static_cast<std::size_t>(ranks);
        const bool small_second = small_second_node(ranks, node_ranks);
        if (bytes < (small_second ? small_second_node_ring_min_bytes
                                  : nodes_all_gather_two_level_from(node_ranks))) {
            return algorithm::recursive_doubling;
        }
        if (lone_second_node(ranks, node_ranks)) {
            return algorithm::native;
        }
        const bool ring_yet =
            small_second || bytes >= nodes_all_gather_ring_min_bytes ||
            block * static_cast<std::size_t>(node_ranks) >= nodes_all_gather_leader_max_bytes;
        if (!ring_yet && half_second_node(ranks, node_ranks)) {
            return algorithm::recursive_doubling;
        }
        const bool ring = ring_yet && bytes < nodes_all_gather_ring_max_bytes &&
                          block < nodes_all_gather_ring_max_block_bytes;
        return ring ? algorithm::ring : algorithm::two_level;
    }
    if (node_ranks > 1 && bytes >= pair_nodes_all_gather_two_level_min_bytes) {
        return algorithm::two_level;
    }
    return bytes < all_gather_doubling_max_bytes ||
                   bytes / static_cast<std::size_t>(ranks) <= all_gather_doubling_max_block_bytes
               ? algorithm::recursive_doubling
               : algorithm::native;
}

static_assert(many_ranks_rabenseifner_min_bytes <= some_ranks_rabenseifner_min_bytes &&
                  some_ranks_rabenseifner_min_bytes <= few_ranks_rabenseifner_min_bytes,
              "the more ranks, the sooner recursive doubling's log2(n) whole-buffer "
              "exchanges cost more than Rabenseifner's extra messages");
static_assert(ring_min_bytes_per_rank * (odd_some_ranks + 1) > odd_rabenseifner_min_bytes,
              "past odd_some_ranks, Rabenseifner has a range of sizes before the ring");
static_assert(odd_few_ring_min_bytes <= odd_some_ring_min_bytes);
/// The smallest all-reduce, in bytes, that Rabenseifner carries over `ranks` ranks,
/// a power of two; `one_node` when every rank shares memory with every other.
constexpr std::size_t rabenseifner_min_bytes(int ranks, bool one_node) noexcept {
    if (one_node) {
        return node_rabenseifner_min_bytes;
    }
    return ranks == 2   ? static_cast<std::size_t>(-1)
           : ranks <= 4 ? few_ranks_rabenseifner_min_bytes
           : ranks <= 8 ? some_ranks_rabenseifner_min_bytes
                        : many_ranks_rabenseifner_min_bytes;
}

/// The algorithm by size and rank count alone, as if each rank were a node of its
/// own unless `one_node` (every rank sharing memory with every other).
constexpr algorithm all_reduce_by_size(std::size_t bytes, int ranks, bool one_node) noexcept {
    if (ranks <= 1) {
        return algorithm::recursive_doubling;
    }
    if (one_node && ranks <= node_ring_max_ranks) {
        return bytes < node_ring_min_bytes ? algorithm::recursive_doubling : algorithm::ring;
    }
    if (one_node && ranks <= node_large_ring_max_ranks && bytes >= node_large_ring_min_bytes) {
        return algorithm::ring;
    }
    if (!std::has_single_bit(static_cast<unsigned>(ranks))) {
        if (ranks <= odd_some_ranks) {
            const std::size_t ring_from =
                ranks <= 4 ? odd_few_ring_min_bytes : odd_some_ring_min_bytes;
            return bytes < ring_from ? algorithm::recursive_doubling : algorithm::ring;
        }
        if (bytes < (one_node ? odd_rabenseifner_min_bytes : many_ranks_rabenseifner_min_bytes)) {
            return algorithm::recursive_doubling;
        }
        return bytes / static_cast<std::size_t>(ranks) >= ring_min_bytes_per_rank
                   ? algorithm::ring
                   : algorithm::rabenseifner;
    }
    return bytes < rabenseifner_min_bytes(ranks, one_node) ? algorithm::recursive_doubling
                                                           : algorithm::rabenseifner;
}

// ---- Several nodes of several ranks each, measured in simulation (nodes of 8
// ranks sharing one NIC, 16 to 64 ranks: 2 to 8 nodes; docs/measurements.md,
// "Nodes of several ranks: the two-level all-reduce"). Every step of recursive doubling sends every rank's whole
// buffer, and from the step at distance (ranks per node) on, all of a node's
// messages cross its NIC at once; the two-level schedule sends one per node, for
// 2 log2(ranks per node) more steps inside the node. Over MPI's best: recursive
// doubling 1.06-1.08 at 1-4 KiB on 2 nodes, 1.06-1.20 on 4, 1.11-1.42 on 8;
// two_level 1.11-1.18, 0.99-1.07 and 1.03-1.08. At 8-16 KiB two_level (0.81-0.99)
// also beats Rabenseifner (1.03-1.65: its 2 log2(n) steps, each crossing the NIC
// from every rank); at 32 KiB no longer (1.08-1.23 against 0.92-1.04).

// Rank counts that are not a power of two, over nodes of 8 (12 to 48 ranks,
// measured the same way, docs/measurements.md, "Nodes of several ranks"): from 32
// KiB Rabenseifner's, 0.92-1.02x MPI's best, where two_level (which by size alone
// carries them up to odd_rabenseifner_min_bytes) was 1.17-1.26x at 32 and 64 KiB,
// and the ring (which by size alone carries them from ring_min_bytes_per_rank,
// chosen with a rank per node) 1.32-2.69x from 4 MiB: each of its 2 (n - 1) steps
// waits for the one message that crosses between nodes. So past odd_some_ranks,
// over nodes of several ranks, Rabenseifner's from two_level_max_bytes.
//
// Up to odd_some_ranks over nodes of several ranks (2026-12-06, the two-level
// platform with 2, 3 or 4 ranks placed on each host: 3, 6 and 7 ranks on nodes of
// 2, 5 and 6 on nodes of 3, 6 and 7 on nodes of 4; 32 KiB to 16 MiB by factors of
// 4, 6 and 7 ranks on nodes of 2 by 8 from 8 B, every algorithm forced) the ring,
// which the size alone picks from odd_few_ring_min_bytes or
// odd_some_ring_min_bytes, was 1.12-2.45x MPI's best where it ran, for the same
// reason, but for 3 ranks at 128 KiB (1.00x) and 6 on nodes of 2 at 16 MiB (0.84x).
// There, on two nodes, two_level was 0.93-1.07x (its leaders exchange the buffer
// once, without the ring's steps) and Rabenseifner's 1.01-2.56x (a fold, the halves
// crossing between the nodes at every step); on 3 and 4 nodes (6 and 7 ranks on
// nodes of 2) Rabenseifner's 0.63-1.03x, two_level 0.79-1.24x (log2 of the nodes
// whole-buffer steps). So there the ring gives way to two_level on two nodes,
// Rabenseifner's on more.

/// Several nodes holding more than one rank each: two_level where recursive
/// doubling would run, from this many bytes on 2 nodes ...
inline constexpr std::size_t two_nodes_two_level_min_bytes = 8 * 1024;
/// ... on up to 4 ...
inline constexpr std::size_t few_nodes_two_level_min_bytes = 2 * 1024;
/// ... and on more.
inline constexpr std::size_t many_nodes_two_level_min_bytes = 1024;
/// Below this many bytes two_level runs where Rabenseifner would, too.
inline constexpr std::size_t two_level_max_bytes = 32 * 1024;

static_assert(many_nodes_two_level_min_bytes <= few_nodes_two_level_min_bytes &&
                  few_nodes_two_level_min_bytes <= two_nodes_two_level_min_bytes &&
                  two_nodes_two_level_min_bytes < two_level_max_bytes,
              "the more nodes, the sooner two_level pays; each node count has a range");
static_assert(many_ranks_rabenseifner_min_bytes < two_level_max_bytes,
              "two_level takes over some of Rabenseifner's sizes");

// Nodes that are not all full (ranks not a multiple of the ranks per node, the last
// node holding the rest, as launchers fill nodes in order), measured the same way
// (nodes of 8, 9 to 52 ranks, 1 KiB to 4 MiB; docs/measurements.md, "Nodes that are
// not all full"). Where the last node holds fewer than half a node, Rabenseifner's
// halving sends most of its rounds through that node's NIC (its few ranks meet a
// partner on another node at nearly every step), and recursive doubling pays the
// fold: at 9, 10, 11, 17, 18 and 26 ranks the tuning's choice was up to
// 1.20-2.36x MPI's best, two_level 0.38-1.06x at every size. On three nodes the
// leaders meet in one group of three: at 20 and 22 ranks two_level was 0.52-0.77x,
// the tuning's choice up to 1.12x. With the last node at least half full on 2, 4,
// 5 or 7 nodes (12-15, 28, 30, 36, 52 ranks) the tuning's choice stayed within
// 1.07x where two_level was up to 1.57x, and keeps them.

/// Whether `ranks` ranks on nodes of at most `node_ranks`, filled in order, take
/// two_level at every size: several nodes, the last not full, and either holding
/// fewer than half a node or one of three nodes.
constexpr bool uneven_two_level(int ranks, int node_ranks) noexcept {
    if (node_ranks <= 1 || ranks <= node_ranks) {
        return false;
    }
    const int last = last_node_ranks(ranks, node_ranks);
    return last != 0 && (2 * last < node_ranks || nodes_of(ranks, node_ranks) == 3);
}

// Larger nodes (2026-12-07, the two-level platform with 16 or 32 ranks placed on
// each host, 64 B to 64 KiB by factors of 2, recursive doubling and two_level
// forced; docs/measurements.md, "Nodes of 16 and 32 ranks"). Recursive doubling's
// steps across nodes send every rank's buffer through the node's one NIC at once,
// so the more ranks a node holds, the sooner two_level's one message per node pays.
// Over MPI's best, recursive doubling / two_level: two nodes of 16 at 2 and 4 KiB
// 1.10 / 0.98 and 1.21 / 0.98 (at 1 KiB 1.02 / 0.97), four nodes of 16 at 1 KiB
// 1.26 / 1.04, eight at 512 B 1.10 / 0.99; two nodes of 32 from 512 B to 4 KiB
// 1.10-1.72 / 1.04-1.05 (at 256 B 1.08 / 1.19), four at 512 B and 1 KiB 1.19 and
// 1.57 / 1.01-1.02 (at 256 B 1.02 / 1.01). The bounds above, measured on nodes of
// 8, fall with the square of the node's size: a quarter on nodes of 16 (2 KiB, 512
// B and 256 B), a sixteenth on nodes of 32 (512, 128 and 64 B). With them every
// cell of those runs is within 1.08x (64 B to 8 KiB; 8 B to 16 MiB by factors of 8
// within 1.09x); eight nodes of 32 (256 ranks) were not run. Nodes of 2 and 4 keep
// the bounds of 8 (every cell of 8 to 64 ranks, 8 B to 16 MiB by factors of 8,
// within 1.04x); past 32 ranks a node, which was not measured, is taken as 32.

/// The node size the two_level bounds above were measured on, and the largest they
/// are scaled to (two_level_min_bytes).
inline constexpr int two_level_bounds_node_ranks = 8;
inline constexpr int two_level_largest_scaled_node_ranks = 32;

/// The smallest all-reduce, in bytes, that two_level carries over `nodes` nodes of
/// at most `node_ranks` ranks each.
constexpr std::size_t two_level_min_bytes(int nodes, int node_ranks) noexcept {
    const std::size_t bound = nodes <= 2   ? two_nodes_two_level_min_bytes
                              : nodes <= 4 ? few_nodes_two_level_min_bytes
                                           : many_nodes_two_level_min_bytes;
    const auto size = static_cast<std::size_t>(
        std::clamp(node_ranks, two_level_bounds_node_ranks, two_level_largest_scaled_node_ranks));
    const auto measured = static_cast<std::size_t>(two_level_bounds_node_ranks);
    return bound * measured * measured / (size * size);
}

static_assert(two_level_min_bytes(2, 16) == 2 * 1024 && two_level_min_bytes(4, 16) == 512 &&
                  two_level_min_bytes(8, 16) == 256 && two_level_min_bytes(2, 32) == 512 &&
                  two_level_min_bytes(4, 32) == 128 && two_level_min_bytes(8, 32) == 64,
              "the bounds on nodes of 16 and 32 ranks that the measurements name");
static_assert(two_level_min_bytes(2, 4) == two_nodes_two_level_min_bytes &&
                  two_level_min_bytes(2, 64) == two_level_min_bytes(2, 32),
              "smaller nodes keep the bounds of nodes of 8; larger than 32 take 32's");

// ---- The direct exchange (rank_ordered.hpp), for speed: after the check, n - 1
// messages of m / n bytes from every rank to every other, twice: the ring's bytes
// in two steps instead of 2 (n - 1), or Rabenseifner's 2 log2(n) with twice the
// bytes. Measured in simulation (docs/measurements.md, "All-reduce at scale", "The
// direct exchange"; 2 to 16 ranks, 1 KiB to 16 MiB by factors of 2). Over MPI's
// best from 64 KiB: with a rank per node, at 3, 4 and 8 ranks, 0.47-1.04x on the
// flat cluster and 0.46-0.99x on the fat tree, where the tuning's choice before it
// was 0.49-1.24x and 0.47-1.17x (on one node of 4 or 8 ranks 0.17-0.88x, against
// recursive doubling's and Rabenseifner's 0.79-1.09x; see below). At 32 KiB, over
// 3 to 8 ranks (5 to 7 as well), it was 0.54-0.93x, where recursive doubling was
// 1.17x on 6 ranks and 1.27x on 4 of the fat tree, whose hops of 0.5 us make a
// step's latency cheap beside its bytes; Rabenseifner's, at 8, 1.02x. Below 32 KiB
// its n - 1 messages cost more than they save (1.03-1.25x at 16 KiB on 4 ranks,
// where recursive doubling was 0.70-0.82x). Over nodes of several ranks every rank's
// messages to another node cross that node's one NIC side by side (2.8-6.3x on two
// nodes of 8). On one node the simulation, which prices shared memory as a fast
// link and not its bandwidth shared by every copy, is not borne out for real: at 4
// processes of Open MPI 4.1 here (2 cores, so a rough check) it was 0.95-1.43x
// Rabenseifner's from 64 KiB to 4 MiB. So it runs only with a rank per node.
//
// Its 2 (n - 1) messages per rank are posted at once, and SMPI charges nothing for
// posting a message. With 0.5 us for each send and receive (smpi/os, ois, or) it
// still led at 4 and 8 ranks from 64 KiB (0.57-1.07x, the choice before it
// 0.67-1.15x), but no longer everywhere at 16 ranks (1.21x at 64 KiB on the fat
// tree); at 32 KiB it was 0.68-1.17x over 3 to 8 ranks (1.17 on 4 flat ranks, 1.15
// on 8 of the fat tree) where recursive doubling was 0.96-1.07x. The default
// settings decide, as everywhere in this file. The many-to-one traffic of more
// ranks, which the simulation does not price, is what real MPIs avoid it for, so
// it runs up to 8 ranks. On two ranks it is the ring's two steps (1.01-1.94x
// across nodes, recursive doubling 0.61-1.14x).

/// Up to this many ranks, each on a node of its own ...
inline constexpr int direct_max_ranks = 8;
/// ... from this many bytes, the direct exchange.
inline constexpr std::size_t direct_min_bytes = 32 * 1024;
static_assert(direct_max_ranks == few_nodes_scatter_direct_max_ranks,
              "the reduce_scatter's direct exchange stops where the all-reduce's does");

/// Whether an all-reduce of `bytes` over `ranks` ranks, at most `node_ranks` of
/// them on one node, takes the direct exchange.
constexpr bool direct_all_reduce(std::size_t bytes, int ranks, int node_ranks) noexcept {
    return node_ranks <= 1 && ranks >= 3 && ranks <= direct_max_ranks && bytes >= direct_min_bytes;
}

/// The algorithm that carries an all-reduce of `bytes` over `ranks` ranks when
/// none is forced; `node_ranks` is the most ranks one node holds (`ranks` when
/// every rank shares memory with every other, 1 with one rank per node).
constexpr algorithm all_reduce(std::size_t bytes, int ranks, int node_ranks) noexcept {
    if (direct_all_reduce(bytes, ranks, node_ranks)) {
        return algorithm::rank_ordered;
    }
    if (uneven_two_level(ranks, node_ranks)) {
        return algorithm::two_level;
    }
    const bool one_node = node_ranks >= ranks;
    const algorithm flat = all_reduce_by_size(bytes, ranks, one_node);
    if (one_node || node_ranks <= 1 ||
        bytes < two_level_min_bytes(nodes_of(ranks, node_ranks), node_ranks)) {
        return flat;
    }
    if (bytes < two_level_max_bytes) {
        return flat == algorithm::recursive_doubling || flat == algorithm::rabenseifner
                   ? algorithm::two_level
                   : flat;
    }
    if (ranks > odd_some_ranks) {
        return flat == algorithm::recursive_doubling || flat == algorithm::ring
                   ? algorithm::rabenseifner
                   : flat;
    }
    if (flat == algorithm::ring) { // up to odd_some_ranks, not a power of two
        return nodes_of(ranks, node_ranks) == 2 ? algorithm::two_level : algorithm::rabenseifner;
    }
    return flat == algorithm::recursive_doubling ? algorithm::two_level : flat;
}

} // namespace unison::mpi_tuning

namespace unison {

/// The all-reduce algorithm that `o` forces on the MPI backend (automatic: none):
/// rank_ordered when o.deterministic. Throws argument_error when o.deterministic and
/// o.all_reduce_algorithm name different orders.
inline algorithm mpi_forced_algorithm(const comm_options& o) {
    if (!o.deterministic) {
        return o.all_reduce_algorithm;
    }
    if (o.all_reduce_algorithm != algorithm::automatic &&
        o.all_reduce_algorithm != algorithm::rank_ordered) {
        throw argument_error(-1, "mpi_communicator",
                             "comm_options::deterministic (UNISON_DETERMINISTIC) sums in rank "
                             "order, which the forced all-reduce algorithm " +
                                 std::string(to_string(o.all_reduce_algorithm)) +
                                 " does not; force rank_ordered or automatic, or drop one");
    }
    return algorithm::rank_ordered;
}

/// The algorithm the MPI backend's reduce_scatter of `bytes` in all runs over
/// `ranks` ranks (`node_ranks`: the most of them on one node), `forced` being
/// mpi_forced_algorithm's: the reduce_scatter has three,
/// rank_ordered (the direct exchange), rabenseifner (its recursive halving alone)
/// and native, and takes any of them when forced (so rank_ordered when
/// deterministic); otherwise the tuning's choice.
constexpr algorithm mpi_reduce_scatter_algorithm(algorithm forced, std::size_t bytes, int ranks,
                                                 int node_ranks) noexcept {
    if (ranks <= 1) {
        return algorithm::native;
    }
    return forced == algorithm::rank_ordered || forced == algorithm::native ||
                   forced == algorithm::rabenseifner
               ? forced
               : mpi_tuning::reduce_scatter(bytes, ranks, node_ranks);
}

/// The neighbour exchange over `ranks` ranks: itself at an even count, the ring
/// (which it then runs) at an odd one.
constexpr algorithm mpi_exchange_or_ring(int ranks) noexcept {
    return ranks % 2 == 0 ? algorithm::neighbour_exchange : algorithm::ring;
}

/// The algorithm the MPI backend's all_gather of `bytes` in all runs over `ranks`
/// ranks (`node_ranks`: the most of them on one node), `forced` being
/// mpi_forced_algorithm's: recursive_doubling, two_level (node_all_gather.hpp), ring,
/// neighbour_exchange (the ring at an odd rank count) or native when forced,
/// otherwise (any other algorithm forced, the reductions') the tuning's choice.
constexpr algorithm mpi_all_gather_algorithm(algorithm forced, std::size_t bytes, int ranks,
                                             int node_ranks) noexcept {
    if (ranks <= 1) {
        return algorithm::native;
    }
    if (forced == algorithm::neighbour_exchange) {
        return mpi_exchange_or_ring(ranks);
    }
    return forced == algorithm::recursive_doubling || forced == algorithm::two_level ||
                   forced == algorithm::ring || forced == algorithm::native
               ? forced
               : mpi_tuning::all_gather(bytes, ranks, node_ranks);
}

/// The algorithm the MPI backend runs for an all-reduce of `bytes` over `ranks`
/// ranks (`node_ranks`: the most of them on one node), `forced` being
/// comm_options::all_reduce_algorithm (neighbour_exchange: the ring at an odd rank
/// count). One rank has nothing to exchange, whatever is forced: recursive
/// doubling, which then only copies.
constexpr algorithm mpi_all_reduce_algorithm(algorithm forced, std::size_t bytes, int ranks,
                                             int node_ranks) noexcept {
    if (ranks <= 1) {
        return algorithm::recursive_doubling;
    }
    if (forced == algorithm::neighbour_exchange) {
        return mpi_exchange_or_ring(ranks);
    }
    return forced == algorithm::automatic ? mpi_tuning::all_reduce(bytes, ranks, node_ranks)
                                          : forced;
}

} // namespace unison
