// The MPI backend's ring all-reduce (mpi/detail/ring_allreduce.hpp), driven
// directly with small message limits so that its multi-segment steps run: through
// the communicator every chunk below a GiB goes as one message per step, and only
// these cases cut chunks into segments. Also over several tensors laid end to end
// (a coalesced all-reduce's runs), cut at their edges and at the message limits.
// The node-aware all_gather (mpi/detail/node_all_gather.hpp), which cuts its runs
// of blocks the same way, likewise.

#include <unison/mpi.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace {

/// Rank `rank`'s element i: multiples of 1/8 in [-125, 125], so that sums of four
/// of them are exact in float and the reference needs no tolerance.
float value(int rank, std::size_t i, std::uint64_t seed) {
    std::uint64_t h = (static_cast<std::uint64_t>(rank) + 1) * 0x9E3779B97F4A7C15ull + i + seed;
    h ^= h >> 29;
    h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 32;
    return static_cast<float>(static_cast<int>(h % 2001) - 1000) / 8.0f;
}

/// Cancels a call that ran past its time. Where MPI keeps a receive it could not
/// cancel, it may still write into the test's buffers, which the failing test would
/// free on its way out: the process stops here instead, saying why.
template <class Call>
void give_up(Call& call, const char* what) {
    if (!call.cancel(std::chrono::milliseconds(100))) {
        unison::mpi_environment::abort_job(std::string(what) +
                                           " timed out and MPI kept one of its receives: aborting");
    }
}

/// Runs one ring to completion (at most 20 s); false when it did not finish.
bool drive(unison::detail::mpi_ring_allreduce& ring, std::vector<std::byte>& scratch) {
    scratch.assign(ring.scratch_bytes(), std::byte{0});
    ring.start(scratch.data());
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!ring.progress()) {
        if (std::chrono::steady_clock::now() > until) {
            give_up(ring, "the ring");
            return false;
        }
    }
    return true;
}

/// A duplicate of MPI_COMM_WORLD for one test case, so that its rings' tags never
/// meet another case's messages; freed at the case's end.
struct world {
    MPI_Comm comm = MPI_COMM_NULL;
    int rank = 0, size = 1;
    world() {
        REQUIRE(MPI_Comm_dup(MPI_COMM_WORLD, &comm) == MPI_SUCCESS);
        MPI_Comm_rank(comm, &rank);
        MPI_Comm_size(comm, &size);
    }
    world(const world&) = delete;
    world& operator=(const world&) = delete;
    ~world() { MPI_Comm_free(&comm); }
};

} // namespace

TEST_CASE("mpi ring: segmented steps give the serial result, in place and out of place") {
    const world w;
    MPI_Comm comm = w.comm;
    const int rank = w.rank, n = w.size;
    std::uint64_t sequence = 0;
    std::vector<std::byte> scratch;
    // Counts below, at and above the rank count and segment multiples; limits from
    // one element per message to chunks that need no cut.
    for (std::size_t count :
         {std::size_t{1}, std::size_t{3}, std::size_t{1031}, std::size_t{70001}}) {
        for (std::size_t segment_bytes : {std::size_t{4}, std::size_t{100}, std::size_t{4096},
                                          unison::detail::mpi_ring_segment_bytes}) {
            if (segment_bytes == 4 && count > 1031) {
                continue; // one message per element: slow, and 1031 covers it
            }
            for (unison::reduce_op op :
                 {unison::reduce_op::sum, unison::reduce_op::avg, unison::reduce_op::max}) {
                for (int form = 0; form < 4; ++form) {
                    const bool in_place = (form & 1) != 0, exchange = (form & 2) != 0;
                    CAPTURE(count);
                    CAPTURE(exchange);
                    CAPTURE(segment_bytes);
                    CAPTURE(unison::to_string(op));
                    CAPTURE(in_place);
                    const std::uint64_t seed = sequence * 7919;
                    std::vector<float> in(count), out(count, -1.0f);
                    for (std::size_t i = 0; i < count; ++i) {
                        in[i] = value(rank, i, seed);
                    }
                    const std::vector<float> original = in;
                    float* result = in_place ? in.data() : out.data();
                    unison::collective_call call{unison::operation::all_reduce, in.data(), result,
                                                 count};
                    call.type = unison::dtype::f32;
                    call.reduction = op;
                    const unison::detail::call_label label{unison::operation::all_reduce, sequence};
                    unison::detail::mpi_ring_allreduce ring(comm, rank, n, call, label, sequence,
                                                            {}, exchange, segment_bytes);
                    ++sequence;
                    REQUIRE(drive(ring, scratch));

                    std::size_t wrong = 0, first_wrong = count;
                    for (std::size_t i = 0; i < count; ++i) {
                        double want = value(0, i, seed);
                        for (int r = 1; r < n; ++r) {
                            const double v = value(r, i, seed);
                            want = op == unison::reduce_op::max ? (v > want ? v : want) : want + v;
                        }
                        if (op == unison::reduce_op::avg) {
                            want /= n;
                        }
                        // avg divides a float sum once, as the ring does: exact up
                        // to that one rounding
                        const double got = result[i];
                        const double tolerance = op == unison::reduce_op::avg
                                                     ? 1e-6 * (1.0 + (want < 0 ? -want : want))
                                                     : 0.0;
                        if (got - want > tolerance || want - got > tolerance) {
                            ++wrong;
                            first_wrong = first_wrong < i ? first_wrong : i;
                        }
                    }
                    CHECK_MESSAGE(wrong == 0, wrong, " wrong, the first at ", first_wrong);
                    if (!in_place) {
                        CHECK(in == original); // the input is read, never written
                    }
                }
            }
        }
    }
}

TEST_CASE("mpi ring: runs of several tensors give the serial result, message limits and all") {
    const world w;
    MPI_Comm comm = w.comm;
    const int rank = w.rank, n = w.size;
    std::uint64_t sequence = 0;
    std::vector<std::byte> scratch;
    // Tensor sizes that put chunk boundaries inside tensors, at their edges, and
    // leave whole tensors inside one chunk; empty tensors are never extents.
    const std::vector<std::vector<std::size_t>> layouts = {
        {1}, {5, 1, 7}, {1000, 3, 2048, 17}, {30000, 1, 1, 12345, 999}, {8, 8, 8, 8, 8, 8, 8, 8}};
    for (const auto& sizes : layouts) {
        for (std::size_t segment_bytes :
             {std::size_t{4}, std::size_t{100}, unison::detail::mpi_ring_segment_bytes}) {
            std::size_t count = 0;
            for (std::size_t s : sizes) {
                count += s;
            }
            if (segment_bytes == 4 && count > 5000) {
                continue; // one message per element: slow
            }
            for (int form = 0; form < 2; ++form) {
                const unison::reduce_op op =
                    form == 0 ? unison::reduce_op::sum : unison::reduce_op::avg;
                const bool exchange = form == 1;
                CAPTURE(count);
                CAPTURE(exchange);
                CAPTURE(sizes.size());
                CAPTURE(segment_bytes);
                CAPTURE(unison::to_string(op));
                const std::uint64_t seed = sequence * 7919 + 17;
                std::vector<std::vector<float>> tensors;
                std::vector<unison::detail::mpi_ring_extent> extents;
                std::size_t start = 0;
                tensors.reserve(sizes.size());
                for (std::size_t s : sizes) {
                    tensors.emplace_back(s);
                    for (std::size_t i = 0; i < s; ++i) {
                        tensors.back()[i] = value(rank, start + i, seed);
                    }
                    auto* p = reinterpret_cast<std::byte*>(tensors.back().data());
                    extents.push_back({p, p, start, s});
                    start += s;
                }
                unison::collective_call call{unison::operation::all_reduce, tensors[0].data(),
                                             tensors[0].data(), count};
                call.type = unison::dtype::f32;
                call.reduction = op;
                const unison::detail::call_label label{unison::operation::all_reduce, sequence};
                unison::detail::mpi_ring_allreduce ring(
                    comm, rank, n, call, label, sequence,
                    std::span<const unison::detail::mpi_ring_extent>(extents), exchange,
                    segment_bytes);
                ++sequence;
                REQUIRE(drive(ring, scratch));

                std::size_t wrong = 0, first_wrong = count, at = 0;
                for (const auto& t : tensors) {
                    for (float got : t) {
                        double want = 0;
                        for (int r = 0; r < n; ++r) {
                            want += value(r, at, seed);
                        }
                        if (op == unison::reduce_op::avg) {
                            want /= n;
                        }
                        const double tolerance = op == unison::reduce_op::avg
                                                     ? 1e-6 * (1.0 + (want < 0 ? -want : want))
                                                     : 0.0;
                        if (got - want > tolerance || want - got > tolerance) {
                            ++wrong;
                            first_wrong = first_wrong < at ? first_wrong : at;
                        }
                        ++at;
                    }
                }
                CHECK_MESSAGE(wrong == 0, wrong, " wrong, the first at ", first_wrong);
            }
        }
    }
}

TEST_CASE("mpi ring all_gather: the ring and the neighbour exchange give every block, cut or "
          "whole") {
    // Driven directly with small message limits, so that the ring's blocks and the
    // neighbour exchange's pairs of blocks go as several messages, cut inside a block
    // and (a pair) across the edge between its two. At an odd rank count the
    // neighbour exchange is the ring; at 2 ranks its one step is the ring's.
    const world w;
    MPI_Comm comm = w.comm;
    const int rank = w.rank, n = w.size;
    std::uint64_t sequence = 0;
    for (std::size_t count : {std::size_t{1}, std::size_t{3}, std::size_t{1031}}) {
        for (std::size_t segment_bytes : {std::size_t{4}, std::size_t{12}, std::size_t{1000},
                                          unison::detail::mpi_ring_segment_bytes}) {
            for (int form = 0; form < 4; ++form) {
                const bool in_place = (form & 1) != 0, exchange = (form & 2) != 0;
                CAPTURE(count);
                CAPTURE(segment_bytes);
                CAPTURE(in_place);
                CAPTURE(exchange);
                const std::uint64_t seed = sequence * 7919 + 5;
                const auto ranks = static_cast<std::size_t>(n);
                std::vector<float> mine(count), all(count * ranks, -1.0f);
                for (std::size_t i = 0; i < count; ++i) {
                    mine[i] = value(rank, i, seed);
                }
                float* in = mine.data();
                if (in_place) {
                    in = all.data() + static_cast<std::size_t>(rank) * count;
                    std::copy(mine.begin(), mine.end(), in);
                }
                unison::collective_call call{unison::operation::all_gather, in, all.data(), count};
                call.type = unison::dtype::f32;
                const unison::detail::call_label label{unison::operation::all_gather, sequence};
                unison::detail::mpi_ring_allreduce ring(
                    unison::detail::mpi_ring_allreduce::all_gather, comm, rank, n, call, label,
                    sequence, exchange, segment_bytes);
                ++sequence;
                std::vector<std::byte> scratch;
                REQUIRE(drive(ring, scratch));
                std::size_t wrong = 0, first_wrong = all.size();
                for (std::size_t k = 0; k < all.size(); ++k) {
                    if (all[k] != value(static_cast<int>(k / count), k % count, seed)) {
                        ++wrong;
                        first_wrong = std::min(first_wrong, k);
                    }
                }
                CHECK_MESSAGE(wrong == 0, wrong, " wrong, the first at ", first_wrong);
            }
        }
    }
}

TEST_CASE("mpi node all_gather: segmented runs over any node layout give every block") {
    // Driven directly, past the call check, with small message limits so that runs
    // of blocks are cut into several messages, over layouts that the communicator's
    // options cannot make (ranks of a node not consecutive): blocks of 2, round
    // robin over 2 nodes, every rank its own node, one node.
    const world w;
    const int rank = w.rank, n = w.size;
    std::uint64_t sequence = 0;
    for (int layout = 0; layout < 4; ++layout) {
        std::vector<int> node_of(static_cast<std::size_t>(n));
        for (int r = 0; r < n; ++r) {
            node_of[static_cast<std::size_t>(r)] = layout == 0   ? r / 2
                                                   : layout == 1 ? r % 2
                                                   : layout == 2 ? r
                                                                 : 0;
        }
        const auto plan = unison::detail::plan_node_all_gather(
            rank, unison::detail::node_layout::of(node_of, rank));
        for (std::size_t count : {std::size_t{1}, std::size_t{3}, std::size_t{1031}}) {
            for (std::size_t segment_bytes :
                 {std::size_t{4}, std::size_t{100}, unison::detail::mpi_message_max_bytes}) {
                for (bool in_place : {false, true}) {
                    CAPTURE(layout);
                    CAPTURE(count);
                    CAPTURE(segment_bytes);
                    CAPTURE(in_place);
                    const std::uint64_t seed = sequence * 7919 + 5;
                    std::vector<float> mine(count), out(count * static_cast<std::size_t>(n), -1.0f);
                    for (std::size_t i = 0; i < count; ++i) {
                        mine[i] = value(rank, i, seed);
                    }
                    float* own = out.data() + count * static_cast<std::size_t>(rank);
                    if (in_place) {
                        std::copy(mine.begin(), mine.end(), own);
                    }
                    unison::collective_call call{unison::operation::all_gather,
                                                 in_place ? own : mine.data(), out.data(), count};
                    call.type = unison::dtype::f32;
                    const unison::detail::call_label label{unison::operation::all_gather, sequence};
                    unison::detail::mpi_node_all_gather gather(w.comm, rank, call, label, sequence,
                                                               plan, segment_bytes);
                    ++sequence;
                    gather.start();
                    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
                    bool done = false;
                    while (!(done = gather.progress()) &&
                           std::chrono::steady_clock::now() < until) {
                    }
                    if (!done) {
                        give_up(gather, "the node all_gather");
                    }
                    REQUIRE(done);
                    std::size_t wrong = 0;
                    for (int q = 0; q < n; ++q) {
                        for (std::size_t i = 0; i < count; ++i) {
                            wrong +=
                                out[static_cast<std::size_t>(q) * count + i] != value(q, i, seed);
                        }
                    }
                    CHECK(wrong == 0);
                }
            }
        }
    }
}
