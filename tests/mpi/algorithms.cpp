// Every all-reduce algorithm of the MPI backend (mpi/tuning.hpp), forced through
// comm_options, against a serial reference: counts below, at and above the rank
// count and across the first message's size, several ops and dtypes, in place and
// out of place, plain and coalesced. Then the call check on the paths that carry
// it themselves (Rabenseifner's): a count or an algorithm that differs across
// ranks is a mismatch_error on every rank with nothing written, and the
// communicator still works.

#include <unison/mpi.hpp>

#include <doctest/doctest.h>

#include <sched.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

/// Rank `rank`'s element i: multiples of 1/8 in [-125, 125], so that sums over four
/// ranks are exact in float and the reference needs no tolerance.
double value(int rank, std::size_t i, std::uint64_t seed) {
    std::uint64_t h = (static_cast<std::uint64_t>(rank) + 1) * 0x9E3779B97F4A7C15ull + i + seed;
    h ^= h >> 29;
    h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 32;
    return static_cast<double>(static_cast<int>(h % 2001) - 1000) / 8.0;
}

/// The serial result over `ranks` ranks, in double.
double reference(unison::reduce_op op, int ranks, std::size_t i, std::uint64_t seed) {
    double r = value(0, i, seed);
    for (int q = 1; q < ranks; ++q) {
        const double v = value(q, i, seed);
        r = op == unison::reduce_op::max ? std::max(r, v) : r + v;
    }
    return op == unison::reduce_op::avg ? r / ranks : r;
}

unison::mpi_communicator forced(unison::algorithm a) {
    unison::comm_options o = unison::comm_options::from_env();
    o.all_reduce_algorithm = a;
    return unison::mpi_communicator(MPI_COMM_WORLD, o);
}

/// Forced, with each block of `ranks_per_node` ranks taken as a node.
unison::mpi_communicator on_nodes(unison::algorithm a, int ranks_per_node) {
    unison::comm_options o = unison::comm_options::from_env();
    o.all_reduce_algorithm = a;
    o.ranks_per_node = ranks_per_node;
    return unison::mpi_communicator(MPI_COMM_WORLD, o);
}

constexpr unison::algorithm forced_algorithms[] = {
    unison::algorithm::automatic,    unison::algorithm::recursive_doubling,
    unison::algorithm::two_level,    unison::algorithm::rabenseifner,
    unison::algorithm::ring,         unison::algorithm::native,
    unison::algorithm::rank_ordered, unison::algorithm::neighbour_exchange};

template <class T>
void check_algorithm(unison::mpi_communicator& comm) {
    const int rank = comm.rank(), n = comm.size();
    std::uint64_t seed = 11;
    // 1000 floats pass the first message's 4000 bytes (Open MPI), 5000 its 16000 (other
    // MPIs); 70001 pass 64 KiB.
    for (std::size_t count : {std::size_t{1}, std::size_t{3}, std::size_t{7}, std::size_t{1000},
                              std::size_t{1031}, std::size_t{5000}, std::size_t{70001}}) {
        for (unison::reduce_op op :
             {unison::reduce_op::sum, unison::reduce_op::avg, unison::reduce_op::max}) {
            for (bool in_place : {false, true}) {
                ++seed;
                CAPTURE(count);
                CAPTURE(unison::to_string(op));
                CAPTURE(in_place);
                std::vector<T> in(count), out(count, T(-7777));
                for (std::size_t i = 0; i < count; ++i) {
                    in[i] = static_cast<T>(value(rank, i, seed));
                }
                const std::vector<T> original = in;
                if (in_place) {
                    unison::all_reduce(comm, in, op);
                    out = in;
                } else {
                    unison::all_reduce(comm, in, out, op);
                    CHECK(in == original);
                }
                std::size_t wrong = 0;
                for (std::size_t i = 0; i < count; ++i) {
                    const double expect = reference(op, n, i, seed);
                    const double tolerance = op == unison::reduce_op::avg ? 1e-6 * 125 : 0.0;
                    wrong += std::abs(static_cast<double>(out[i]) - expect) > tolerance ? 1 : 0;
                }
                CHECK(wrong == 0);
            }
        }
    }
}

} // namespace

TEST_CASE("mpi reduce_scatter: every algorithm gives the serial result") {
    // rank_ordered (the direct exchange), rabenseifner (recursive halving) and native
    // (MPI's own), forced; and the tuning's choice on one node and with every 2 or 3
    // ranks taken as a node (at 3 and 4 ranks a lone rank on the second node: MPI's
    // own from 70001 floats, the halving below).
    struct run {
        unison::algorithm a;
        int ranks_per_node;
    };
    for (run r : {run{unison::algorithm::automatic, 0}, run{unison::algorithm::rank_ordered, 0},
                  run{unison::algorithm::rabenseifner, 0}, run{unison::algorithm::native, 0},
                  run{unison::algorithm::automatic, 2}, run{unison::algorithm::automatic, 3}}) {
        const unison::algorithm a = r.a;
        CAPTURE(unison::to_string(a));
        CAPTURE(r.ranks_per_node);
        auto comm = r.ranks_per_node == 0 ? forced(a) : on_nodes(a, r.ranks_per_node);
        const int rank = comm.rank(), n = comm.size();
        const auto per = [&](std::size_t count) { return count * static_cast<std::size_t>(n); };
        for (std::size_t probe : {per(1000) * sizeof(float), per(70001) * sizeof(float)}) {
            CHECK(comm.reduce_scatter_algorithm(probe) ==
                  (n == 1 ? unison::algorithm::native
                   : a != unison::algorithm::automatic
                       ? a
                       : unison::mpi_tuning::reduce_scatter(probe, n, comm.node_ranks())));
        }
        if (r.ranks_per_node == n - 1 && n >= 3) {
            CHECK(comm.reduce_scatter_algorithm(per(1000) * sizeof(float)) ==
                  unison::algorithm::rabenseifner);
            CHECK(comm.reduce_scatter_algorithm(per(70001) * sizeof(float)) ==
                  unison::algorithm::native);
        }
        std::uint64_t seed = 500;
        for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{3}, std::size_t{1000},
                                  std::size_t{5000}, std::size_t{70001}}) {
            for (unison::reduce_op op :
                 {unison::reduce_op::sum, unison::reduce_op::avg, unison::reduce_op::max}) {
                for (bool in_place : {false, true}) {
                    ++seed;
                    CAPTURE(count);
                    CAPTURE(in_place);
                    std::vector<float> in(per(count));
                    for (std::size_t i = 0; i < in.size(); ++i) {
                        in[i] = static_cast<float>(value(rank, i, seed));
                    }
                    std::vector<float> out(count, -7777.0f);
                    if (in_place) {
                        unison::reduce_scatter(comm, in, op);
                        std::copy_n(in.begin() + static_cast<std::ptrdiff_t>(count * rank), count,
                                    out.begin());
                    } else {
                        unison::reduce_scatter(comm, in, out, op);
                    }
                    std::size_t wrong = 0;
                    for (std::size_t k = 0; k < count; ++k) {
                        const double expect =
                            reference(op, n, count * static_cast<std::size_t>(rank) + k, seed);
                        const double tolerance = op == unison::reduce_op::avg ? 1e-6 * 125 : 0.0;
                        wrong += std::abs(static_cast<double>(out[k]) - expect) > tolerance ? 1 : 0;
                    }
                    CHECK(wrong == 0);
                }
            }
        }
    }
}

TEST_CASE("mpi reduce_scatter: recursive halving checks the call and loses nothing") {
    // Rank n-1, or rank 0 (which folds in at 3 ranks), passes a larger block (one
    // element more, or three times as many): every rank hears of it before any
    // output is written, in place or not, whichever step of the halving meets the
    // difference.
    // Tuned on one node, 1500 floats per rank take the halving (under 16 KiB in all
    // at 2 ranks, 64 KiB at 4) where the last rank's triple takes the direct
    // exchange: the two schedules' checks meet all the same.
    for (unison::algorithm a : {unison::algorithm::rabenseifner, unison::algorithm::automatic}) {
        auto comm = forced(a);
        const int rank = comm.rank(), n = comm.size();
        if (n < 2) {
            return;
        }
        const auto ranks = static_cast<std::size_t>(n);
        for (std::size_t count : {std::size_t{10}, std::size_t{1500}, std::size_t{5000}}) {
            for (bool in_place : {false, true}) {
                for (int kind = 0; kind < 4; ++kind) {
                    const bool triple = (kind & 1) != 0;
                    const int odd = (kind & 2) != 0 ? 0 : n - 1; // 0: folds in at 3 ranks
                    CAPTURE(unison::to_string(a));
                    CAPTURE(count);
                    CAPTURE(in_place);
                    CAPTURE(triple);
                    CAPTURE(odd);
                    const std::size_t mine = rank == odd ? (triple ? 3 * count : count + 1) : count;
                    std::vector<float> in(mine * ranks), out(mine, -1.0f);
                    for (std::size_t i = 0; i < in.size(); ++i) {
                        in[i] = static_cast<float>(value(rank, i, 9));
                    }
                    const std::vector<float> original = in;
                    std::string field;
                    try {
                        if (in_place) {
                            unison::reduce_scatter(comm, in);
                        } else {
                            unison::reduce_scatter(comm, in, out);
                        }
                    } catch (const unison::mismatch_error& e) {
                        field = e.field();
                    }
                    CHECK(field == "count");
                    CHECK(in == original);
                    CHECK(out == std::vector<float>(mine, -1.0f));
                }
            }
        }
        // Still usable.
        std::vector<float> x(3000 * ranks, static_cast<float>(rank + 1)), y(3000);
        unison::reduce_scatter(comm, x, y);
        CHECK(y.front() == static_cast<float>(n * (n + 1) / 2));
        CHECK(y.back() == static_cast<float>(n * (n + 1) / 2));
    }
}

TEST_CASE("mpi all_gather: every algorithm gives every rank's block") {
    // recursive_doubling (the call check riding every message), the ring, the
    // neighbour exchange (the ring at 3 ranks), two_level (the node-aware one) and
    // native (MPI's own) after the check, forced, and the
    // tuning's choice, on one node and with every 3 ranks taken as a node (where at
    // 4 ranks, a node of 3 and one of 1, the tuning runs recursive doubling up to
    // 2000 doubles and MPI's own from 5000: a lone rank on a second node) and every
    // 2 (as with a rank per node up to 2 MiB: recursive doubling at 2000, MPI's own
    // at 5000 and 9000; at 4 ranks 70001 doubles pass 2 MiB and two_level runs);
    // the ring and two_level forced, two_level also over nodes of 1, 2 and 3 (at 3
    // ranks one node).
    struct run {
        unison::algorithm a;
        int ranks_per_node;
    };
    for (run r : {run{unison::algorithm::automatic, 0},
                  run{unison::algorithm::recursive_doubling, 0}, run{unison::algorithm::ring, 0},
                  run{unison::algorithm::neighbour_exchange, 0}, run{unison::algorithm::native, 0},
                  run{unison::algorithm::two_level, 0}, run{unison::algorithm::automatic, 2},
                  run{unison::algorithm::automatic, 3}, run{unison::algorithm::two_level, 1},
                  run{unison::algorithm::two_level, 2}, run{unison::algorithm::two_level, 3}}) {
        const unison::algorithm a = r.a;
        CAPTURE(unison::to_string(a));
        CAPTURE(r.ranks_per_node);
        auto comm = r.ranks_per_node == 0 ? forced(a) : on_nodes(a, r.ranks_per_node);
        const int rank = comm.rank(), n = comm.size();
        const auto ranks = static_cast<std::size_t>(n);
        for (std::size_t probe : {1000 * ranks * sizeof(double), 70001 * ranks * sizeof(double)}) {
            CHECK(comm.all_gather_algorithm(probe) ==
                  (n == 1 ? unison::algorithm::native
                   : a == unison::algorithm::neighbour_exchange
                       ? (n % 2 == 0 ? a : unison::algorithm::ring)
                   : a != unison::algorithm::automatic
                       ? a
                       : unison::mpi_tuning::all_gather(probe, n, comm.node_ranks())));
        }
        if (a == unison::algorithm::automatic && n == 4 &&
            (r.ranks_per_node == 2 || r.ranks_per_node == 3)) {
            // Only at 70001 doubles do the two layouts part.
            const unison::algorithm largest =
                r.ranks_per_node == 2 ? unison::algorithm::two_level : unison::algorithm::native;
            CHECK(comm.all_gather_algorithm(2000 * ranks * sizeof(double)) ==
                  unison::algorithm::recursive_doubling);
            CHECK(comm.all_gather_algorithm(5000 * ranks * sizeof(double)) ==
                  unison::algorithm::native);
            CHECK(comm.all_gather_algorithm(9000 * ranks * sizeof(double)) ==
                  unison::algorithm::native);
            CHECK(comm.all_gather_algorithm(70001 * ranks * sizeof(double)) == largest);
        }
        std::uint64_t seed = 700;
        for (std::size_t count :
             {std::size_t{0}, std::size_t{1}, std::size_t{3}, std::size_t{1000}, std::size_t{2000},
              std::size_t{5000}, std::size_t{9000}, std::size_t{70001}}) {
            for (bool in_place : {false, true}) {
                ++seed;
                CAPTURE(count);
                CAPTURE(in_place);
                std::vector<double> mine(count), out(count * ranks, -7777.0);
                for (std::size_t i = 0; i < count; ++i) {
                    mine[i] = value(rank, i, seed);
                }
                if (in_place) { // this rank's block of `out` is its input
                    std::copy(mine.begin(), mine.end(),
                              out.begin() + static_cast<std::ptrdiff_t>(
                                                count * static_cast<std::size_t>(rank)));
                    unison::all_gather(comm, out);
                } else {
                    unison::all_gather(comm, mine, out);
                }
                std::size_t wrong = 0;
                for (int q = 0; q < n; ++q) {
                    for (std::size_t i = 0; i < count; ++i) {
                        wrong += out[static_cast<std::size_t>(q) * count + i] != value(q, i, seed);
                    }
                }
                CHECK(wrong == 0);
            }
        }
    }
}

TEST_CASE("mpi all_gather: every algorithm checks the call and loses nothing") {
    // Rank n-1, or rank 0 (which folds in at 3 ranks), passes a larger block (one
    // element more, or three times as many; tuned on one node, 800 floats per rank
    // take recursive doubling and the triple MPI's own at 2-4 ranks): every rank
    // hears of it, and no output is written. The ring, the neighbour exchange and
    // two_level (over nodes of 2) check before they move data.
    for (unison::algorithm a : {unison::algorithm::recursive_doubling, unison::algorithm::automatic,
                                unison::algorithm::ring, unison::algorithm::neighbour_exchange,
                                unison::algorithm::two_level}) {
        auto comm = a == unison::algorithm::two_level ? on_nodes(a, 2) : forced(a);
        const int rank = comm.rank(), n = comm.size();
        if (n < 2) {
            return;
        }
        const auto ranks = static_cast<std::size_t>(n);
        for (std::size_t count : {std::size_t{10}, std::size_t{800}}) {
            for (int kind = 0; kind < 4; ++kind) {
                const bool triple = (kind & 1) != 0;
                const int odd = (kind & 2) != 0 ? 0 : n - 1; // 0: folds in at 3 ranks
                CAPTURE(unison::to_string(a));
                CAPTURE(count);
                CAPTURE(triple);
                CAPTURE(odd);
                const std::size_t mine = rank == odd ? (triple ? 3 * count : count + 1) : count;
                std::vector<float> in(mine, static_cast<float>(rank + 1)), out(mine * ranks, -1.0f);
                std::string field;
                try {
                    unison::all_gather(comm, in, out);
                } catch (const unison::mismatch_error& e) {
                    field = e.field();
                }
                CHECK(field == "count");
                CHECK(out == std::vector<float>(mine * ranks, -1.0f));
            }
        }
        // Still usable.
        std::vector<float> x(5, static_cast<float>(rank + 1)), y(5 * ranks);
        unison::all_gather(comm, x, y);
        CHECK(y.front() == 1.0f);
        CHECK(y.back() == static_cast<float>(n));
    }
}

TEST_CASE("mpi all-reduce: every algorithm gives the serial result") {
    for (unison::algorithm a : forced_algorithms) {
        CAPTURE(unison::to_string(a));
        auto comm = forced(a);
        check_algorithm<float>(comm);
        check_algorithm<double>(comm);
    }
}

TEST_CASE("mpi all-reduce: two_level over nodes of 1, 2 and 3 ranks gives the serial result") {
    // One machine, its ranks taken as nodes by comm_options::ranks_per_node: at 3
    // ranks in nodes of 2, one node of 2 and one of 1; at 4 in nodes of 3, the same
    // uneven pair; in nodes of 2, two leaders.
    for (int per : {1, 2, 3}) {
        for (unison::algorithm a : {unison::algorithm::automatic, unison::algorithm::two_level}) {
            CAPTURE(per);
            CAPTURE(unison::to_string(a));
            auto comm = on_nodes(a, per);
            const int n = comm.size();
            CHECK(comm.node_ranks() == std::min(per, n));
            CHECK(comm.one_node() == (per >= n));
            const bool tuned_two_level = per > 1 && per < n;
            CHECK((comm.all_reduce_algorithm(16384) == unison::algorithm::two_level) ==
                  (tuned_two_level || (a == unison::algorithm::two_level && n > 1)));
            if (a == unison::algorithm::automatic) { // the direct exchange: a rank per node
                CHECK((comm.all_reduce_algorithm(1 << 20) == unison::algorithm::rank_ordered) ==
                      (per == 1 && n >= 3 && n <= unison::mpi_tuning::direct_max_ranks));
            }
            if (a == unison::algorithm::automatic && per == 2 && n == 3) {
                // Two nodes of at most 8 ranks in all, not a power of two: two_level
                // where the ring would run by size.
                CHECK(comm.all_reduce_algorithm(1 << 20) == unison::algorithm::two_level);
            }
            check_algorithm<float>(comm); // 70001 elements: the direct exchange's sizes
            // A split keeps its parent's nodes: the even ranks, in nodes by the parent's.
            auto half = comm.split(comm.rank() % 2, comm.rank());
            check_algorithm<double>(half);
        }
    }
}

TEST_CASE("mpi all-reduce: two_level checks the call and loses nothing") {
    for (int per : {1, 2, 3}) {
        auto comm = on_nodes(unison::algorithm::two_level, per);
        const int rank = comm.rank(), n = comm.size();
        if (n < 2) {
            return;
        }
        // The last rank passes one element more, or three times as many: a leaf of a
        // node's tree, or a leader, depending on the layout.
        for (std::size_t count : {std::size_t{10}, std::size_t{5000}}) {
            for (bool triple : {false, true}) {
                CAPTURE(per);
                CAPTURE(count);
                CAPTURE(triple);
                const std::size_t mine = rank == n - 1 ? (triple ? 3 * count : count + 1) : count;
                std::vector<float> in(mine, static_cast<float>(rank + 1)), out(mine, -1.0f);
                std::string field;
                try {
                    unison::all_reduce(comm, in, out);
                } catch (const unison::mismatch_error& e) {
                    field = e.field();
                }
                CHECK(field == "count");
                CHECK(out == std::vector<float>(mine, -1.0f));
            }
        }
        std::vector<float> x(3000, static_cast<float>(rank + 1));
        unison::all_reduce(comm, x);
        CHECK(x.front() == static_cast<float>(n * (n + 1) / 2));
        CHECK(x.back() == static_cast<float>(n * (n + 1) / 2));
    }
}

TEST_CASE("mpi communicator: ranks that disagree about ranks_per_node are refused") {
    int rank = 0, n = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    if (n < 2) {
        return;
    }
    std::string message;
    try {
        (void)on_nodes(unison::algorithm::automatic, rank == 0 ? 2 : 1);
    } catch (const unison::argument_error& e) {
        message = e.what();
    }
    CHECK(message.find("ranks_per_node") != std::string::npos);
    CHECK(message.find(rank == 0 ? "on rank 1" : "on rank 0") != std::string::npos);
}

TEST_CASE("mpi collectives: every algorithm, wherever the buffers sit in their cache lines") {
    // The algorithms place their scratch at the offset within a cache line of the
    // memory it receives (same_line_offset), so each buffer offset moves the scratch:
    // inputs and outputs 0-15 floats past a 64-byte boundary, the same on every rank
    // (as two ranks' allocators place alike) and, last, different on each.
    struct placement {
        std::size_t in, out;
        bool per_rank;
    };
    const placement placements[] = {
        {0, 0, false}, {1, 0, false}, {0, 5, false}, {15, 7, false}, {3, 11, true}};
    std::uint64_t seed = 900;
    const auto placed = [](std::vector<float>& backing, std::size_t count, std::size_t offset) {
        backing.assign(count + 32, -7777.0f);
        void* p = backing.data();
        std::size_t room = backing.size() * sizeof(float);
        REQUIRE(std::align(64, sizeof(float), p, room) != nullptr);
        return std::span<float>(static_cast<float*>(p) + offset, count);
    };
    const auto check = [&](std::span<const float> got, std::size_t first, int ranks) {
        std::size_t wrong = 0;
        for (std::size_t i = 0; i < got.size(); ++i) {
            wrong += static_cast<double>(got[i]) !=
                     reference(unison::reduce_op::sum, ranks, first + i, seed);
        }
        CHECK(wrong == 0);
    };
    for (unison::algorithm a : forced_algorithms) {
        CAPTURE(unison::to_string(a));
        auto comm = forced(a);
        const int rank = comm.rank(), n = comm.size();
        const auto ranks = static_cast<std::size_t>(n);
        for (const placement& at : placements) {
            const std::size_t shift = at.per_rank ? static_cast<std::size_t>(rank) : 0;
            const std::size_t in_at = (at.in + shift) % 16, out_at = (at.out + 3 * shift) % 16;
            CAPTURE(in_at);
            CAPTURE(out_at);
            for (std::size_t count : {std::size_t{1031}, std::size_t{70001}}) {
                CAPTURE(count);
                std::vector<float> in_backing, out_backing;
                // all_reduce, out of place and in place
                ++seed;
                auto in = placed(in_backing, count, in_at);
                auto out = placed(out_backing, count, out_at);
                for (std::size_t i = 0; i < count; ++i) {
                    in[i] = static_cast<float>(value(rank, i, seed));
                }
                unison::all_reduce(comm, std::span<const float>(in), out);
                check(out, 0, n);
                unison::all_reduce(comm, in);
                check(in, 0, n);
                // reduce_scatter (the algorithms that have one), out of place
                if (a == unison::algorithm::automatic || a == unison::algorithm::rabenseifner ||
                    a == unison::algorithm::rank_ordered) {
                    ++seed;
                    auto whole = placed(in_backing, count * ranks, in_at);
                    auto block = placed(out_backing, count, out_at);
                    for (std::size_t i = 0; i < whole.size(); ++i) {
                        whole[i] = static_cast<float>(value(rank, i, seed));
                    }
                    unison::reduce_scatter(comm, std::span<const float>(whole), block);
                    check(block, count * static_cast<std::size_t>(rank), n);
                }
                // all_gather (recursive doubling gathers in scratch), out of place
                if (a == unison::algorithm::automatic ||
                    a == unison::algorithm::recursive_doubling || a == unison::algorithm::ring ||
                    a == unison::algorithm::neighbour_exchange) {
                    ++seed;
                    auto mine = placed(in_backing, count, in_at);
                    auto all = placed(out_backing, count * ranks, out_at);
                    for (std::size_t i = 0; i < count; ++i) {
                        mine[i] = static_cast<float>(value(rank, i, seed));
                    }
                    unison::all_gather(comm, std::span<const float>(mine), all);
                    std::size_t wrong = 0;
                    for (int q = 0; q < n; ++q) {
                        for (std::size_t i = 0; i < count; ++i) {
                            wrong += all[static_cast<std::size_t>(q) * count + i] !=
                                     static_cast<float>(value(q, i, seed));
                        }
                    }
                    CHECK(wrong == 0);
                }
            }
        }
    }
}

TEST_CASE("mpi all-reduce: every algorithm reduces coalesced tensors") {
    for (unison::algorithm a : forced_algorithms) {
        CAPTURE(unison::to_string(a));
        auto comm = forced(a);
        const int rank = comm.rank(), n = comm.size();
        // Tensors under and over the ring's staging limit, one empty.
        const std::vector<std::size_t> sizes = {5, 0, 3000, 17, 40000};
        std::vector<std::vector<float>> tensors;
        std::vector<unison::buffer> pieces;
        for (std::size_t t = 0; t < sizes.size(); ++t) {
            tensors.emplace_back(sizes[t]);
            for (std::size_t i = 0; i < sizes[t]; ++i) {
                tensors[t][i] = static_cast<float>(value(rank, i, 100 + t));
            }
        }
        for (auto& t : tensors) {
            pieces.push_back(unison::as_buffer(t));
        }
        unison::all_reduce_coalesced(comm, std::span<const unison::buffer>(pieces));
        std::size_t wrong = 0;
        for (std::size_t t = 0; t < sizes.size(); ++t) {
            for (std::size_t i = 0; i < sizes[t]; ++i) {
                const double expect = reference(unison::reduce_op::sum, n, i, 100 + t);
                wrong += static_cast<double>(tensors[t][i]) != expect ? 1 : 0;
            }
        }
        CHECK(wrong == 0);
    }
}

TEST_CASE("mpi all-reduce: Rabenseifner reduces 16-bit floats") {
    auto comm = forced(unison::algorithm::rabenseifner);
    const int rank = comm.rank(), n = comm.size();
    const std::size_t count = 5003;
    std::vector<unison::bf16> data(count);
    for (std::size_t i = 0; i < count; ++i) {
        data[i] = unison::bf16(static_cast<float>(static_cast<int>(i % 9) - 4 + rank));
    }
    unison::all_reduce(comm, data);
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < count; ++i) {
        double expect = 0;
        for (int q = 0; q < n; ++q) {
            expect += static_cast<int>(i % 9) - 4 + q; // small integers: exact in bf16
        }
        wrong += static_cast<double>(static_cast<float>(data[i])) != expect ? 1 : 0;
    }
    CHECK(wrong == 0);
}

TEST_CASE("mpi all-reduce: Rabenseifner checks the call as it goes and loses nothing") {
    auto comm = forced(unison::algorithm::rabenseifner);
    const int rank = comm.rank(), n = comm.size();
    if (n < 2) {
        return;
    }
    // Rank n-1 passes one element more, or three times as many (its halves, larger
    // than the ones its partners expect, must be received at their announced size):
    // every rank hears of it before any output is written, whichever step of the
    // halving meets the difference.
    for (std::size_t count : {std::size_t{10}, std::size_t{5000}, std::size_t{40000}}) {
        for (bool in_place : {false, true}) {
            for (bool triple : {false, true}) {
                CAPTURE(count);
                CAPTURE(in_place);
                CAPTURE(triple);
                const std::size_t mine = rank == n - 1 ? (triple ? 3 * count : count + 1) : count;
                std::vector<float> in(mine), out(mine, -1.0f);
                for (std::size_t i = 0; i < mine; ++i) {
                    in[i] = static_cast<float>(value(rank, i, 5));
                }
                const std::vector<float> original = in;
                std::string field;
                try {
                    if (in_place) {
                        unison::all_reduce(comm, in);
                    } else {
                        unison::all_reduce(comm, in, out);
                    }
                } catch (const unison::mismatch_error& e) {
                    field = e.field();
                }
                CHECK(field == "count");
                CHECK(in == original);
                CHECK(out == std::vector<float>(mine, -1.0f));
            }
        }
    }
    // Still usable.
    std::vector<float> x(3000, static_cast<float>(rank + 1));
    unison::all_reduce(comm, x);
    CHECK(x.front() == static_cast<float>(n * (n + 1) / 2));
    CHECK(x.back() == static_cast<float>(n * (n + 1) / 2));
}

TEST_CASE("mpi collectives: calls of the same size that differ are caught on the large paths") {
    // A large step's rest is received as soon as MPI holds one of exactly the size
    // this rank's own call implies, before its header: a call that sends as many
    // bytes but differs (the op, or int32 for float) must still be a mismatch_error
    // naming the field on every rank, with nothing written. One rank enters each
    // call late, so that its peers' first messages and rests are already queued when
    // it polls (at 3 and 4 Open MPI processes here, hundreds of rests a run took the
    // early path; at 2 a few, its first probe finding the header already in): the
    // rank whose call differs, then its neighbour. 40000 elements take every step of these schedules past the first
    // message (16000 bytes on MPIs other than Open MPI, 4000 on Open MPI); nodes of
    // 2 make 3 ranks fold one in (its last step hands the result back) instead of
    // forming a group of three.
    struct run {
        unison::algorithm a;
        int ranks_per_node; // 0: one node
    };
    for (run r :
         {run{unison::algorithm::recursive_doubling, 0},
          run{unison::algorithm::recursive_doubling, 2}, run{unison::algorithm::two_level, 2},
          run{unison::algorithm::rabenseifner, 0}, run{unison::algorithm::rabenseifner, 2}}) {
        auto comm = r.ranks_per_node == 0 ? forced(r.a) : on_nodes(r.a, r.ranks_per_node);
        const int rank = comm.rank(), n = comm.size();
        if (n < 2) {
            return;
        }
        const auto ranks = static_cast<std::size_t>(n);
        const std::size_t count = 40000;
        for (int odd : {n - 1, 0}) {
            for (int late : {odd, (odd + 1) % n}) {
                const bool differs = rank == odd;
                CAPTURE(unison::to_string(r.a));
                CAPTURE(r.ranks_per_node);
                CAPTURE(odd);
                CAPTURE(late);
                const auto expect = [&](const char* field, auto&& call) {
                    CAPTURE(field);
                    if (rank == late) {
                        std::this_thread::sleep_for(std::chrono::milliseconds(20));
                    }
                    std::string got;
                    try {
                        call();
                    } catch (const unison::mismatch_error& e) {
                        got = e.field();
                    }
                    CHECK(got == field);
                };
                std::vector<float> in(count), out(count, -1.0f);
                for (std::size_t i = 0; i < count; ++i) {
                    in[i] = static_cast<float>(value(rank, i, 3));
                }
                const std::vector<float> original = in;
                std::vector<std::int32_t> ints(count, rank + 1);
                const std::vector<std::int32_t> original_ints = ints;
                for (bool in_place : {false, true}) {
                    CAPTURE(in_place);
                    expect("op", [&] {
                        const auto op = differs ? unison::reduce_op::max : unison::reduce_op::sum;
                        if (in_place) {
                            unison::all_reduce(comm, in, op);
                        } else {
                            unison::all_reduce(comm, in, out, op);
                        }
                    });
                    expect("dtype", [&] {
                        if (differs) {
                            unison::all_reduce(comm, ints);
                        } else if (in_place) {
                            unison::all_reduce(comm, in);
                        } else {
                            unison::all_reduce(comm, in, out);
                        }
                    });
                    CHECK(in == original);
                    CHECK(ints == original_ints);
                    CHECK(out == std::vector<float>(count, -1.0f));
                }
                if (r.a == unison::algorithm::two_level) {
                    continue;
                }
                // The reduce_scatter's halving (Rabenseifner's first half) and the
                // all_gather's recursive doubling carry the same check.
                std::vector<float> whole(count * ranks), block(count, -1.0f);
                for (std::size_t i = 0; i < whole.size(); ++i) {
                    whole[i] = static_cast<float>(value(rank, i, 4));
                }
                const std::vector<float> original_whole = whole;
                if (r.a == unison::algorithm::rabenseifner) {
                    expect("op", [&] {
                        unison::reduce_scatter(comm, whole, block,
                                               differs ? unison::reduce_op::max
                                                       : unison::reduce_op::sum);
                    });
                } else {
                    std::vector<float> gathered(count * ranks, -1.0f);
                    std::vector<std::int32_t> gathered_ints(count * ranks, -1);
                    expect("dtype", [&] {
                        if (differs) {
                            unison::all_gather(comm, ints, gathered_ints);
                        } else {
                            unison::all_gather(comm, in, gathered);
                        }
                    });
                    CHECK(gathered == std::vector<float>(count * ranks, -1.0f));
                    CHECK(gathered_ints == std::vector<std::int32_t>(count * ranks, -1));
                }
                CHECK(whole == original_whole);
                CHECK(block == std::vector<float>(count, -1.0f));
            }
        }
        // Still usable at the same size, every element right, with each rank late
        // in turn (the early rests of a matching call land where they belong).
        for (int late = 0; late < n; ++late) {
            CAPTURE(unison::to_string(r.a));
            CAPTURE(r.ranks_per_node);
            CAPTURE(late);
            std::vector<float> x(count);
            for (std::size_t i = 0; i < count; ++i) {
                x[i] = static_cast<float>(value(rank, i, 6 + static_cast<std::uint64_t>(late)));
            }
            if (rank == late) {
                std::this_thread::sleep_for(std::chrono::milliseconds(20));
            }
            unison::all_reduce(comm, x);
            std::size_t wrong = 0;
            for (std::size_t i = 0; i < count; ++i) {
                const double want =
                    reference(unison::reduce_op::sum, n, i, 6 + static_cast<std::uint64_t>(late));
                wrong += static_cast<double>(x[i]) != want ? 1 : 0;
            }
            CHECK(wrong == 0);
        }
    }
}

TEST_CASE("mpi all-reduce: ranks forcing different algorithms are refused before any call") {
    int rank = 0, n = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    if (n < 2) {
        return;
    }
    // Rank 0 against the others: schedules that would meet (Rabenseifner's, which
    // carries the check at the handshake's partners) and ones that would not
    // (two_level's tree against recursive doubling's fold at 3 ranks waited for
    // each other until the timeout): every rank throws when the communicator is
    // made, naming both algorithms.
    using unison::algorithm;
    const std::pair<algorithm, algorithm> pairs[] = {
        {algorithm::recursive_doubling, algorithm::rabenseifner},
        {algorithm::ring, algorithm::rabenseifner},
        {algorithm::native, algorithm::rabenseifner},
        {algorithm::two_level, algorithm::recursive_doubling},
        {algorithm::recursive_doubling, algorithm::two_level},
        {algorithm::automatic, algorithm::ring},
        {algorithm::neighbour_exchange, algorithm::ring}};
    for (const auto& pair : pairs) { // not a structured binding: Clang 14's CAPTURE cannot take one
        const algorithm first = pair.first, others = pair.second;
        CAPTURE(unison::to_string(first));
        CAPTURE(unison::to_string(others));
        std::string message;
        try {
            (void)forced(rank == 0 ? first : others);
        } catch (const unison::argument_error& e) {
            message = e.what();
        }
        const std::string mine(unison::to_string(rank == 0 ? first : others));
        const std::string theirs(unison::to_string(rank == 0 ? others : first));
        CHECK(message.find("UNISON_ALGORITHM") != std::string::npos);
        CHECK(message.find("is " + mine + " on this rank but " + theirs + " on rank " +
                           (rank == 0 ? "1" : "0")) != std::string::npos);
    }
    // Agreeing, they work.
    auto comm = forced(algorithm::two_level);
    std::vector<float> x(100, static_cast<float>(rank + 1));
    unison::all_reduce(comm, x);
    CHECK(x.front() == static_cast<float>(n * (n + 1) / 2));
}

namespace {

/// Rank `rank`'s element i of an 8-bit type: random, odd (so that products never
/// wrap to zero) and large enough that any two ranks' sums and products leave the
/// type's range (65-125 in int8, 129-253 in uint8).
template <class T>
T narrow_value(int rank, std::size_t i) {
    const auto h = static_cast<int>(value(rank, i, 77) * 8.0 + 1000.0); // 0 .. 2000
    return std::is_signed_v<T> ? static_cast<T>(65 + 2 * (h % 31))
                               : static_cast<T>(129 + 2 * (h % 63));
}

/// The sum or product over `ranks` ranks modulo 2^8, in T's range.
template <class T>
T narrow_reference(unison::reduce_op op, int ranks, std::size_t i) {
    unsigned acc = static_cast<std::uint8_t>(narrow_value<T>(0, i));
    for (int q = 1; q < ranks; ++q) {
        const unsigned v = static_cast<std::uint8_t>(narrow_value<T>(q, i));
        acc = (op == unison::reduce_op::prod ? acc * v : acc + v) & 0xffu;
    }
    return static_cast<T>(static_cast<std::uint8_t>(acc));
}

template <class T>
void check_narrow_wraps(unison::algorithm a) {
    auto comm = forced(a);
    const int rank = comm.rank(), n = comm.size();
    const std::size_t count = 1031 * static_cast<std::size_t>(n);
    for (unison::reduce_op op : {unison::reduce_op::sum, unison::reduce_op::prod}) {
        CAPTURE(static_cast<int>(op));
        std::vector<T> in(count);
        for (std::size_t i = 0; i < count; ++i) {
            in[i] = narrow_value<T>(rank, i);
        }
        std::vector<T> all = in;
        unison::all_reduce(comm, all, op);
        std::vector<T> at_root = in;
        unison::reduce(comm, at_root, n - 1, op);
        std::vector<T> mine(count / static_cast<std::size_t>(n));
        unison::reduce_scatter(comm, in, mine, op);
        std::size_t wrong = 0;
        for (std::size_t i = 0; i < count; ++i) {
            const T want = narrow_reference<T>(op, n, i);
            wrong += all[i] != want ? 1 : 0;
            wrong += rank == n - 1 && at_root[i] != want ? 1 : 0;
        }
        for (std::size_t k = 0; k < mine.size(); ++k) {
            wrong += mine[k] != narrow_reference<T>(
                                    op, n, static_cast<std::size_t>(rank) * mine.size() + k)
                         ? 1
                         : 0;
        }
        CHECK(wrong == 0);
    }
}

} // namespace

// Open MPI 4.1's AVX op component saturates 8-bit sums and products (MPI_SUM of 200
// and 100 in MPI_UINT8_T: 255), so the MPI's own reductions of them run through
// unison's op and wrap as unison's schedules do, on every algorithm.
TEST_CASE("mpi collectives: 8-bit sums and products wrap on every algorithm") {
    for (unison::algorithm a : forced_algorithms) {
        CAPTURE(unison::to_string(a));
        check_narrow_wraps<std::uint8_t>(a);
        check_narrow_wraps<std::int8_t>(a);
    }
}

namespace {

/// A communicator whose options carry `rules` (and force `forced`).
unison::mpi_communicator with_rules(const std::string& rules,
                                    unison::algorithm forced = unison::algorithm::automatic) {
    unison::comm_options o = unison::comm_options::from_env();
    o.all_reduce_algorithm = forced;
    o.tuning = unison::tuning_rules::parse(rules, "test rules");
    return unison::mpi_communicator(MPI_COMM_WORLD, o);
}

} // namespace

TEST_CASE(
    "mpi collectives: tuning rules pick the algorithm, and the results stay the serial ones") {
    int rank = 0, n = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    if (n < 2) {
        return;
    }
    using unison::algorithm;
    using unison::operation;
    // Rules for this rank count send each range of sizes to an algorithm the
    // built-in tuning does not choose there; a rule for another rank count, first in
    // the file, must not match; 16-64 KiB is left to the built-in tuning.
    const std::string count = std::to_string(n);
    const std::string rules =
        "mpi all_reduce " + std::to_string(n + 1) + "- * 0- native\n" + "mpi all_reduce " + count +
        " * -4K ring\n" + "mpi all_reduce " + count + " * 4K-16K rabenseifner\n" +
        "mpi all_reduce * * 16K-64K automatic\n" + "mpi all_reduce * * 64K- native\n" +
        "mpi reduce_scatter * * 0- native\n" + "mpi all_gather * * 0- ring\n";
    auto comm = with_rules(rules);
    auto plain = forced(algorithm::automatic);
    CHECK(comm.all_reduce_algorithm(1000) == algorithm::ring);
    CHECK(comm.all_reduce_algorithm(4 * 1024) == algorithm::rabenseifner);
    CHECK(comm.all_reduce_algorithm(32 * 1024) == plain.all_reduce_algorithm(32 * 1024));
    CHECK(comm.all_reduce_algorithm(64 * 1024) == algorithm::native);
    CHECK(comm.reduce_scatter_algorithm(8 * 1024) == algorithm::native);
    CHECK(comm.all_gather_algorithm(8 * 1024) == algorithm::ring);
    // The calls run what the rules say and still give the serial result: the counts
    // of check_algorithm fall in every range above (4 B to 280 KB).
    check_algorithm<float>(comm);
    const auto ranks = static_cast<std::size_t>(n);
    for (std::size_t block : {std::size_t{3}, std::size_t{1031}, std::size_t{20000}}) {
        CAPTURE(block);
        std::vector<float> in(block * ranks), mine(block);
        for (std::size_t i = 0; i < in.size(); ++i) {
            in[i] = static_cast<float>(value(rank, i, 91));
        }
        unison::reduce_scatter(comm, in, mine);
        std::vector<float> gathered(block * ranks, -7777.0f);
        unison::all_gather(comm, mine, gathered);
        std::size_t wrong = 0;
        for (std::size_t i = 0; i < in.size(); ++i) {
            const double expect = reference(unison::reduce_op::sum, n, i, 91);
            wrong += static_cast<double>(gathered[i]) != expect ? 1 : 0;
        }
        CHECK(wrong == 0);
    }
    // A forced algorithm and deterministic come before every rule, for the
    // collectives that have that algorithm: forcing two_level leaves the
    // reduce_scatter (which has none) to its rule, and deterministic sums leave the
    // all_gather, which adds nothing, to its rule.
    {
        auto two_level = with_rules(rules, algorithm::two_level);
        CHECK(two_level.all_reduce_algorithm(1000) == algorithm::two_level);
        CHECK(two_level.all_gather_algorithm(8 * 1024) == algorithm::two_level);
        CHECK(two_level.reduce_scatter_algorithm(8 * 1024) == algorithm::native);
    }
    {
        unison::comm_options o = unison::comm_options::from_env();
        o.deterministic = true;
        o.tuning = unison::tuning_rules::parse(rules, "test rules");
        unison::mpi_communicator det(MPI_COMM_WORLD, o);
        CHECK(det.all_reduce_algorithm(1000) == algorithm::rank_ordered);
        CHECK(det.reduce_scatter_algorithm(8 * 1024) == algorithm::rank_ordered);
        CHECK(det.all_gather_algorithm(8 * 1024) == algorithm::ring);
    }
}

TEST_CASE("mpi communicator: ranks holding different tuning rules are refused before any call") {
    int rank = 0, n = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    if (n < 2) {
        return;
    }
    // Rank 0 holds other rules than the rest, or rules where the rest hold none: the
    // ranks could pick different schedules and wait for each other, so every rank
    // throws when the communicator is made, naming the option and a rank that differs.
    const std::string ring = "mpi all_reduce * * 64K- ring\n";
    const std::string rabenseifner = "mpi all_reduce * * 64K- rabenseifner\n";
    const std::pair<std::string, std::string> pairs[] = {
        {ring, rabenseifner}, {ring, ""}, {"", ring}};
    for (const auto& pair : pairs) { // not a structured binding: Clang 14's CAPTURE cannot take one
        const std::string& first = pair.first;
        const std::string& others = pair.second;
        CAPTURE(first);
        CAPTURE(others);
        std::string message;
        try {
            (void)with_rules(rank == 0 ? first : others);
        } catch (const unison::argument_error& e) {
            message = e.what();
        }
        CHECK(message.find("comm_options::tuning (UNISON_TUNING_FILE)") != std::string::npos);
        CHECK(message.find(rank == 0 ? "on rank 1" : "on rank 0") != std::string::npos);
        const std::string& mine = rank == 0 ? first : others;
        CHECK(message.find(std::string(mine.empty() ? "0 rules" : "1 rule") + " (digest ") !=
              std::string::npos);
    }
    // The same rules spelled differently are the same rules.
    auto comm = with_rules(rank == 0 ? ring : "# the same\nmpi all_reduce * *  65536-  ring\n");
    CHECK(comm.all_reduce_algorithm(1 << 20) == unison::algorithm::ring);
    std::vector<float> x(100, static_cast<float>(rank + 1));
    unison::all_reduce(comm, x);
    CHECK(x.front() == static_cast<float>(n * (n + 1) / 2));
}

TEST_CASE("mpi communicator: a machine's cores are the union of its ranks' affinities") {
    // Open MPI binds each of 2 ranks to a core of its own, so that each process may
    // run on one core; the machine still has two for its two ranks, and waits must
    // not yield as if it were oversubscribed. The reference: every rank's affinity
    // and its kernel's boot_id, all-gathered, the affinities OR-ed over the ranks
    // that share this rank's boot_id.
    int rank = 0, n = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    cpu_set_t own;
    CPU_ZERO(&own);
    REQUIRE(::sched_getaffinity(0, sizeof own, &own) == 0);
    std::vector<cpu_set_t> all(static_cast<std::size_t>(n));
    MPI_Allgather(&own, sizeof own, MPI_BYTE, all.data(), sizeof own, MPI_BYTE, MPI_COMM_WORLD);
    std::array<char, 64> boot{};
    if (std::FILE* f = std::fopen("/proc/sys/kernel/random/boot_id", "r")) {
        CHECK(std::fread(boot.data(), 1, boot.size() - 1, f) > 0);
        std::fclose(f);
    }
    std::vector<std::array<char, 64>> boots(static_cast<std::size_t>(n));
    MPI_Allgather(boot.data(), static_cast<int>(boot.size()), MPI_CHAR, boots.data(),
                  static_cast<int>(boot.size()), MPI_CHAR, MPI_COMM_WORLD);
    cpu_set_t machine;
    CPU_ZERO(&machine);
    int machine_ranks = 0;
    for (int r = 0; r < n; ++r) {
        if (boots[static_cast<std::size_t>(r)] == boot) {
            CPU_OR(&machine, &machine, &all[static_cast<std::size_t>(r)]);
            ++machine_ranks;
        }
    }
    const bool over = machine_ranks > CPU_COUNT(&machine);
    CAPTURE(CPU_COUNT(&own));
    CAPTURE(CPU_COUNT(&machine));
    CAPTURE(machine_ranks);
    auto comm = forced(unison::algorithm::automatic);
    CHECK(comm.node_cores() == CPU_COUNT(&machine));
    CHECK(comm.oversubscribed() == over);
    // Every rank a node of its own (ranks_per_node 1): the nodes the tuning sees,
    // but the same machine, the same cores and the same ranks on them.
    auto alone = on_nodes(unison::algorithm::automatic, 1);
    CHECK(alone.node_ranks() == 1);
    CHECK(alone.node_cores() == CPU_COUNT(&machine));
    CHECK(alone.oversubscribed() == over);
    // A split of one rank each: alone in its communicator, but the others still run
    // beside it, so it keeps the world's oversubscription (as any communicator this
    // process makes from now on does).
    auto single = comm.split(rank, 0);
    CHECK(single.size() == 1);
    CHECK(single.node_cores() == CPU_COUNT(&own));
    CHECK(single.oversubscribed() == over);

    // Whether the MPI yields by itself: Open MPI's mpi_yield_when_idle, read here
    // as an int through MPI_T (it sets it when it knows the node is
    // oversubscribed); never under another MPI.
    bool mpi_yields = false;
#if defined(OPEN_MPI)
    int provided = 0;
    REQUIRE(MPI_T_init_thread(MPI_THREAD_SINGLE, &provided) == MPI_SUCCESS);
    int index = -1;
    REQUIRE(MPI_T_cvar_get_index("mpi_yield_when_idle", &index) == MPI_SUCCESS);
    MPI_T_cvar_handle handle = MPI_T_CVAR_HANDLE_NULL;
    int count = 0;
    REQUIRE(MPI_T_cvar_handle_alloc(index, nullptr, &handle, &count) == MPI_SUCCESS);
    std::int64_t value = 0;
    REQUIRE(MPI_T_cvar_read(handle, &value) == MPI_SUCCESS);
    mpi_yields = value != 0;
    MPI_T_cvar_handle_free(&handle);
    MPI_T_finalize();
#endif
    CAPTURE(mpi_yields);
    CHECK(unison::detail::mpi_yields_when_idle() == mpi_yields);

    // The union itself, on made-up masks of 3 ranks whatever the launcher did: rank
    // 0 on CPU 0, rank 1 on CPU 1, rank 2 on CPUs 1 and 130.
    using unison::detail::cpu_words;
    std::vector<std::uint64_t> masks(3 * cpu_words{}.size(), 0);
    masks[0] = 1;
    masks[cpu_words{}.size()] = 2;
    masks[2 * cpu_words{}.size()] = 2;
    masks[2 * cpu_words{}.size() + 2] = 4;
    CHECK(unison::detail::cpus_of(masks, std::vector<int>{0, 1}) == 2);
    CHECK(unison::detail::cpus_of(masks, std::vector<int>{1}) == 1);
    CHECK(unison::detail::cpus_of(masks, std::vector<int>{1, 2}) == 2);
    CHECK(unison::detail::cpus_of(masks, std::vector<int>{0, 1, 2}) == 3);
    // A rank that could not read its own: the machine's hardware threads.
    masks[0] = 0;
    CHECK(unison::detail::cpus_of(masks, std::vector<int>{0, 1}) ==
          static_cast<int>(std::thread::hardware_concurrency()));
}
