#pragma once

/// \file
/// The names of the all-reduce algorithms a backend may run, which one option
/// (`comm_options::all_reduce_algorithm`, or `UNISON_ALGORITHM`) forces. Which
/// algorithms a backend has, and which it picks by itself, is in that backend's
/// tuning file: mpi/tuning.hpp (all of them; it picks each but neighbour_exchange,
/// which runs only when forced, by size, rank count and nodes),
/// thread/tuning.hpp (rank_ordered, fused into one pass over shared memory) and
/// nccl/tuning.hpp (native: NCCL chooses its own).

#include <array>
#include <cstddef>
#include <optional>
#include <string_view>
#include <vector>

namespace unison {

/// An all-reduce algorithm. Costs for n ranks and m bytes, with a the latency of one
/// message and b the time per byte. The MPI backend's reduce_scatter runs
/// rabenseifner's first half (recursive halving: log2(n) a + m b (n-1)/n),
/// rank_ordered's fold or native, and its all_gather recursive_doubling (log2(n) a +
/// m b (n-1)/n), two_level (each node's blocks to its lowest rank, those exchanging
/// whole nodes in ceil(log2(n/k)) steps, each sending its node the rest: 2 (a' +
/// m b') + ceil(log2(n/k)) a + m b (n-k)/n over the network), ring's second half
/// ((n-1) (a + m b / n)), neighbour_exchange's or native; forcing one of those
/// forces it there too.
enum class algorithm : unsigned char {
    automatic, ///< the backend's tuning picks one by size and rank count
    /// log2(n) exchanges of the whole buffer: log2(n) (a + m b); on the MPI backend,
    /// q = 3, 5 or 7 times a power of two ranks exchange in log2(n / q) pairs, then
    /// in groups of q (each buffer to the q - 1 others: a + (q - 1) m b), and other
    /// rank counts fold the ranks beyond a power of two in (2 (a + m b) more)
    recursive_doubling,
    /// node-aware recursive doubling: a binomial tree inside each node of k ranks
    /// into its lowest rank, recursive doubling among those n/k leaders, the tree
    /// back down: 2 log2(k) (a' + m b') + log2(n/k) (a + m b), a' and b' inside a
    /// node; one message per node crosses the network at each step instead of k.
    two_level,
    /// recursive halving then doubling: 2 log2(n) a + 2 m b (n-1)/n; folds as
    /// recursive_doubling's, or the halving within each q-th and a group of q that
    /// reduce-scatters the block the q kept and gathers it back (2 (a + (q - 1)/q
    /// (m/p) b), p = n / q)
    rabenseifner,
    ring,   ///< reduce-scatter and all-gather around a ring: 2 (n-1) (a + m b / n)
    native, ///< the underlying library's own call (MPI_Iallreduce), after the checks
    /// every rank's block sent to the rank that owns it, folded there in rank order,
    /// then all-gathered: 2 (n-1) messages posted at once, 2 (a + m b (n-1)/n) where
    /// the network carries them side by side, 2 (n-1) (a + m b / n) at worst. The
    /// all-reduce of comm_options::deterministic: the same bits whatever the size,
    /// the bucketing or the backend; the MPI tuning's for larger buffers on few ranks.
    rank_ordered,
    /// the ring's reduce-scatter, then an all-gather in which each rank swaps its
    /// block with rank ^ 1 and then trades the two blocks it received last,
    /// alternately with the neighbour outside that pair and with its partner: n / 2
    /// steps for the ring's n - 1, (3n/2 - 1) a + 2 m b (n-1)/n in all, and both
    /// directions of every link busy. As the all_gather alone, n/2 a + m b (n-1)/n.
    /// Even rank counts; an odd one runs (and reports) the ring.
    neighbour_exchange,
};

inline constexpr std::array<algorithm, 8> all_algorithms = {
    algorithm::automatic,    algorithm::recursive_doubling,
    algorithm::two_level,    algorithm::rabenseifner,
    algorithm::ring,         algorithm::native,
    algorithm::rank_ordered, algorithm::neighbour_exchange};

/// The algorithm's name, as UNISON_ALGORITHM and the benchmarks spell it.
constexpr std::string_view to_string(algorithm a) noexcept {
    switch (a) {
    case algorithm::automatic:
        return "automatic";
    case algorithm::recursive_doubling:
        return "recursive_doubling";
    case algorithm::two_level:
        return "two_level";
    case algorithm::rabenseifner:
        return "rabenseifner";
    case algorithm::ring:
        return "ring";
    case algorithm::native:
        return "native";
    case algorithm::rank_ordered:
        return "rank_ordered";
    case algorithm::neighbour_exchange:
        return "neighbour_exchange";
    }
    return "?";
}

/// The algorithm called `name` (to_string's spelling), if there is one.
constexpr std::optional<algorithm> algorithm_from_string(std::string_view name) noexcept {
    for (algorithm a : all_algorithms) {
        if (to_string(a) == name) {
            return a;
        }
    }
    return std::nullopt;
}

/// The algorithms a comma-separated list names, in order ("ring,native"; "all" stands
/// for every one, automatic included), as the benchmarks' --algorithm and -a take
/// them; nullopt when the list or an entry is empty or an entry names none.
inline std::optional<std::vector<algorithm>> algorithms_from_string(std::string_view list) {
    std::vector<algorithm> out;
    for (;;) {
        const std::size_t comma = list.find(',');
        const std::string_view name = list.substr(0, comma);
        if (name == "all") {
            out.insert(out.end(), all_algorithms.begin(), all_algorithms.end());
        } else if (const auto a = algorithm_from_string(name)) {
            out.push_back(*a);
        } else {
            return std::nullopt;
        }
        if (comma == std::string_view::npos) {
            return out;
        }
        list.remove_prefix(comma + 1);
    }
}

} // namespace unison
