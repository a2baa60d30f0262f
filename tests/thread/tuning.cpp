// The thread backend's tuning (thread/tuning.hpp): its one schedule, rank_ordered,
// is what it reports and the only algorithm it takes when forced; the shares it cuts
// a reduction into cover the buffer once, on share_align_bytes boundaries; and every
// reduction is the rank-order fold, bit for bit, at sizes on both sides of the
// shares' blocks and of the streaming threshold (64 KiB in the tests' build), in
// place and not. The NCCL backend's rules (nccl/tuning.hpp) need no GPU and are
// pinned here too.

#include "../support/reference.hpp"

#include <unison/nccl/tuning.hpp>
#include <unison/thread.hpp>
#include <unison/thread/tuning.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

using unison::algorithm;
using unison::reduce_op;

/// Rank `rank`'s element i: a random mantissa times 2^e, e in [-12, 12], so that
/// summing in another order gives other bits.
float value(int rank, std::size_t i, std::uint64_t seed) {
    const std::uint64_t h = unison::test::mix(seed, rank, i);
    const double u = static_cast<double>(h >> 11) * 0x1.0p-53;
    return static_cast<float>(std::ldexp(2.0 * u - 1.0, static_cast<int>(h % 25) - 12));
}

/// Element i folded over the ranks in float, in rank order (or reversed).
float fold(reduce_op op, int ranks, std::size_t i, std::uint64_t seed, bool reversed = false) {
    const auto at = [&](int k) { return reversed ? ranks - 1 - k : k; };
    float acc = value(at(0), i, seed);
    for (int k = 1; k < ranks; ++k) {
        const float x = value(at(k), i, seed);
        acc = op == reduce_op::max ? (acc < x ? x : acc) : acc + x;
    }
    return op == reduce_op::avg ? acc / static_cast<float>(ranks) : acc;
}

std::uint32_t bits(float v) {
    std::uint32_t b = 0;
    std::memcpy(&b, &v, sizeof v);
    return b;
}

/// Elements of `got` (elements first, first + 1, ...) whose bits differ from fold().
std::size_t differing(const std::vector<float>& got, reduce_op op, int ranks, std::uint64_t seed,
                      std::size_t first = 0) {
    std::size_t wrong = 0;
    for (std::size_t k = 0; k < got.size(); ++k) {
        wrong += bits(got[k]) != bits(fold(op, ranks, first + k, seed)) ? 1 : 0;
    }
    return wrong;
}

std::string thrown_by(const auto& make) {
    try {
        make();
    } catch (const unison::argument_error& e) {
        return e.what();
    }
    return {};
}

} // namespace

TEST_CASE("thread tuning: rank_ordered is its one algorithm; forcing another is refused") {
    for (algorithm a : unison::all_algorithms) {
        CAPTURE(unison::to_string(a));
        unison::comm_options o;
        o.all_reduce_algorithm = a;
        if (a == algorithm::automatic || a == algorithm::rank_ordered) {
            CHECK(unison::thread_all_reduce_algorithm(a) == algorithm::rank_ordered);
            std::vector<algorithm> seen(2, algorithm::automatic);
            unison::thread_world(2, o).run([&](unison::thread_communicator& comm) {
                seen[static_cast<std::size_t>(comm.rank())] = comm.all_reduce_algorithm(1 << 20);
                CHECK(comm.reduce_scatter_algorithm(64) == algorithm::rank_ordered);
                std::vector<float> x{1.0f + static_cast<float>(comm.rank())};
                unison::all_reduce(comm, x);
                CHECK(x[0] == 3.0f);
            });
            CHECK(seen == std::vector<algorithm>(2, algorithm::rank_ordered));
        } else {
            const std::string message = thrown_by([&] { unison::thread_world(2, o); });
            CHECK(message.find(std::string(unison::to_string(a))) != std::string::npos);
            CHECK(message.find("thread backend") != std::string::npos);
            CHECK(message.find("rank_ordered") != std::string::npos);
        }
    }
    // The environment's choice is refused the same way, by the default options.
    ::setenv("UNISON_ALGORITHM", "two_level", 1);
    const std::string message = thrown_by([] { unison::thread_world(2); });
    ::unsetenv("UNISON_ALGORITHM");
    CHECK(message.find("UNISON_ALGORITHM") != std::string::npos);
    CHECK(message.find("two_level") != std::string::npos);
}

TEST_CASE("thread tuning: the shares cover a reduction once, on aligned boundaries") {
    namespace tuning = unison::thread_tuning;
    std::uint64_t seed = 7;
    for (std::size_t elem : {std::size_t{1}, std::size_t{2}, std::size_t{4}, std::size_t{8}}) {
        const std::size_t block = tuning::share_align_bytes / elem;
        for (int ranks = 1; ranks <= 9; ++ranks) {
            std::vector<std::size_t> counts{0, 1, block - 1, block, block + 1};
            for (int k = 0; k < 20; ++k) {
                counts.push_back(unison::test::mix(++seed, ranks, elem) % 100000);
            }
            for (std::size_t count : counts) {
                CAPTURE(elem);
                CAPTURE(ranks);
                CAPTURE(count);
                std::size_t next = 0;
                for (int r = 0; r < ranks; ++r) {
                    const tuning::share s = tuning::share_of(count, elem, ranks, r);
                    REQUIRE(s.lo == next);
                    REQUIRE(s.lo <= s.hi);
                    if (s.lo < count) {
                        CHECK(s.lo % block == 0);
                    }
                    if (count * elem <= tuning::share_align_bytes && r > 0) {
                        CHECK(s.lo == s.hi); // rank 0 alone
                    }
                    next = s.hi;
                }
                CHECK(next == count);
            }
        }
    }
}

TEST_CASE("thread tuning: every size reduces in rank order, bit for bit") {
    constexpr int ranks = 3;
    const std::size_t block = unison::thread_tuning::share_align_bytes / sizeof(float);
    const std::size_t stream = unison::thread_tuning::streaming_min_bytes / sizeof(float);
    const std::vector<std::size_t> counts{1,         block - 1,  block,     block + 1,
                                          3 * block, stream - 1, stream + 5};
    // A fold in another order gives other bits somewhere, so the comparison can fail.
    {
        std::size_t other = 0;
        for (std::size_t i = 0; i < 1000; ++i) {
            other += bits(fold(reduce_op::sum, ranks, i, 1)) !=
                             bits(fold(reduce_op::sum, ranks, i, 1, true))
                         ? 1
                         : 0;
        }
        REQUIRE(other > 0);
    }
    unison::thread_world(ranks).run([&](unison::thread_communicator& comm) {
        const int rank = comm.rank();
        std::uint64_t seed = 10;
        for (std::size_t count : counts) {
            for (reduce_op op : {reduce_op::sum, reduce_op::avg, reduce_op::max}) {
                ++seed;
                CAPTURE(count);
                CAPTURE(unison::to_string(op));
                std::vector<float> mine(count);
                for (std::size_t i = 0; i < count; ++i) {
                    mine[i] = value(rank, i, seed);
                }
                std::vector<float> out(count, -1.0f);
                unison::all_reduce(comm, mine, out, op);
                CHECK(differing(out, op, ranks, seed) == 0);
                std::vector<float> inout = mine;
                unison::all_reduce(comm, inout, op);
                CHECK(differing(inout, op, ranks, seed) == 0);
                // reduce_scatter: rank r's block is elements [r count, (r + 1) count).
                std::vector<float> whole(count * ranks);
                for (std::size_t i = 0; i < whole.size(); ++i) {
                    whole[i] = value(rank, i, seed);
                }
                std::vector<float> block_out(count, -1.0f);
                unison::reduce_scatter(comm, whole, block_out, op);
                CHECK(differing(block_out, op, ranks, seed,
                                count * static_cast<std::size_t>(rank)) == 0);
            }
        }
    });
}

TEST_CASE("nccl tuning: NCCL's own algorithm only, and no deterministic sums") {
    for (algorithm a : unison::all_algorithms) {
        CAPTURE(unison::to_string(a));
        unison::comm_options o;
        o.all_reduce_algorithm = a;
        if (a == algorithm::automatic || a == algorithm::native) {
            CHECK(unison::nccl_all_reduce_algorithm(a, 0, "test") == algorithm::native);
            CHECK_NOTHROW(unison::nccl_check_options(o, 0, "test"));
        } else {
            const std::string message =
                thrown_by([&] { unison::nccl_check_options(o, 3, "nccl_communicator"); });
            CHECK(message.find(std::string(unison::to_string(a))) != std::string::npos);
            CHECK(message.find("NCCL_ALGO") != std::string::npos);
            CHECK(message.find("rank 3") != std::string::npos);
        }
    }
    unison::comm_options o;
    o.deterministic = true;
    const std::string message = thrown_by([&] { unison::nccl_check_options(o, -1, "from_mpi"); });
    CHECK(message.find("deterministic") != std::string::npos);
}
