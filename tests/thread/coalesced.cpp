// all_reduce_coalesced on the thread backend: several tensors reduced in place as
// one buffer, at 1 to 4 ranks, against a serial reduction in double precision on
// random data (piece sizes from 0 up, crossing the ranks' shares anywhere); pieces
// whose sizes differ across ranks with one total are a mismatch on every rank with
// nothing written; invalid pieces are refused before anything moves. And DDP's
// copying reducer, which reduces straight between the gradients through it, against
// the same reducer packing into buckets.

#include "support/reference.hpp"

#include <unison/ddp.hpp>
#include <unison/thread.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace {

using namespace unison;

/// Sizes of the pieces of round `round`: small and large, zeros among them.
std::vector<std::size_t> piece_sizes(std::uint64_t round) {
    std::vector<std::size_t> sizes;
    const std::size_t pieces = 1 + test::mix(round, 99, 0) % 9;
    for (std::size_t k = 0; k < pieces; ++k) {
        const std::uint64_t r = test::mix(round, 98, k);
        sizes.push_back(r % 5 == 0 ? 0 : r % 3 == 0 ? 1 + r % 7 : r % 5000);
    }
    return sizes;
}

/// Rank `rank`'s element `i` of piece `k` in round `round`, in [-1, 1].
double value(std::uint64_t round, int rank, std::size_t k, std::size_t i) {
    return static_cast<double>(test::mix(round * 131 + k, rank, i) % 2001) / 1000.0 - 1.0;
}

template <class T>
void reduces_like_serial(reduce_op op) {
    for (int n = 1; n <= 4; ++n) {
        for (std::uint64_t round = 0; round < 6; ++round) {
            CAPTURE(n);
            CAPTURE(round);
            const auto sizes = piece_sizes(round + 10 * static_cast<std::uint64_t>(op));
            std::vector<std::vector<double>> got(static_cast<std::size_t>(n));
            thread_world(n).run([&](thread_communicator& comm) {
                std::vector<std::vector<T>> pieces(sizes.size());
                std::vector<buffer> views;
                for (std::size_t k = 0; k < sizes.size(); ++k) {
                    for (std::size_t i = 0; i < sizes[k]; ++i) {
                        pieces[k].push_back(static_cast<T>(value(round, comm.rank(), k, i)));
                    }
                    views.push_back(as_buffer(pieces[k]));
                }
                if (round % 2 == 0) {
                    all_reduce_coalesced(comm, std::span<const buffer>(views), op);
                } else {
                    auto r = all_reduce_coalesced_async(comm, std::span<const buffer>(views), op);
                    r.wait();
                }
                auto& mine = got[static_cast<std::size_t>(comm.rank())];
                for (const auto& p : pieces) {
                    mine.insert(mine.end(), p.begin(), p.end());
                }
            });
            std::size_t at = 0;
            for (std::size_t k = 0; k < sizes.size(); ++k) {
                for (std::size_t i = 0; i < sizes[k]; ++i, ++at) {
                    double want = op == reduce_op::max ? -2.0 : 0.0;
                    for (int r = 0; r < n; ++r) {
                        // the inputs as the ranks held them, in T
                        const double v = static_cast<double>(static_cast<T>(value(round, r, k, i)));
                        want = op == reduce_op::max ? std::max(want, v) : want + v;
                    }
                    if (op == reduce_op::avg) {
                        want /= n;
                    }
                    for (int r = 0; r < n; ++r) {
                        const double g = got[static_cast<std::size_t>(r)][at];
                        if (std::abs(g - want) > 1e-6 * (1 + std::abs(want))) {
                            FAIL("rank " << r << " piece " << k << "[" << i << "] = " << g
                                         << ", expected " << want);
                        }
                    }
                }
            }
        }
    }
}

} // namespace

TEST_CASE("thread: all_reduce_coalesced equals a serial reduction, 1-4 ranks") {
    reduces_like_serial<float>(reduce_op::sum);
    reduces_like_serial<double>(reduce_op::avg);
    reduces_like_serial<float>(reduce_op::max);
}

TEST_CASE("thread: all_reduce_coalesced with other piece sizes on one rank is a mismatch, "
          "nothing written") {
    thread_world(3).run([](thread_communicator& comm) {
        // Same total (300) everywhere; rank 2 splits it differently.
        std::vector<float> a(comm.rank() == 2 ? 100 : 200, 1.0f + comm.rank());
        std::vector<float> b(comm.rank() == 2 ? 200 : 100, 2.0f + comm.rank());
        const std::vector<float> a0 = a, b0 = b;
        const std::vector<buffer> views{as_buffer(a), as_buffer(b)};
        try {
            all_reduce_coalesced(comm, std::span<const buffer>(views));
            FAIL("no error");
        } catch (const mismatch_error& e) {
            CHECK(e.field() == "counts");
            CHECK(std::string(e.what()).find("piece sizes") != std::string::npos);
        }
        CHECK(a == a0);
        CHECK(b == b0);
        // and the communicator still works
        std::vector<float> c(10, 1.0f);
        all_reduce(comm, c);
        CHECK(c[9] == 3.0f);
    });
}

TEST_CASE("thread: all_reduce_coalesced refuses overlapping pieces and mixed dtypes, then "
          "works") {
    thread_world(2).run([](thread_communicator& comm) {
        std::vector<float> a(100, 1.0f);
        std::vector<double> d(10, 1.0);
        const std::vector<buffer> overlap{buffer{a.data(), 60, dtype::f32},
                                          buffer{a.data() + 50, 50, dtype::f32}};
        CHECK_THROWS_WITH_AS(all_reduce_coalesced(comm, std::span<const buffer>(overlap)),
                             doctest::Contains("overlap"), argument_error);
        const std::vector<buffer> mixed{as_buffer(a), as_buffer(d)};
        CHECK_THROWS_WITH_AS(all_reduce_coalesced(comm, std::span<const buffer>(mixed)),
                             doctest::Contains("tensor 1 is double and tensor 0 float"),
                             argument_error);
        const std::vector<buffer> fine{buffer{a.data(), 50, dtype::f32},
                                       buffer{a.data() + 50, 50, dtype::f32}};
        all_reduce_coalesced(comm, std::span<const buffer>(fine));
        CHECK(a[0] == 2.0f);
        CHECK(a[99] == 2.0f);
    });
}

namespace {

/// The default hook under another type: the reducer then packs into buckets.
struct packing_hook : all_reduce_hook {};

/// Trains `steps` synchronizations of random gradients through a ddp reducer with
/// `Hook` on `n` ranks; returns rank 0's gradients after each.
template <class... Policies>
std::vector<std::vector<float>> synchronize(int n, bool expect_coalesced, ddp_options options) {
    const std::vector<std::size_t> sizes = {4097, 1, 300, 65536, 33, 0, 1000};
    std::vector<std::vector<float>> out;
    thread_world(n).run([&](thread_communicator& comm) {
        std::vector<std::vector<float>> grads(sizes.size());
        bucketed_reducer<thread_communicator, Policies...> reducer(comm, options);
        for (std::size_t g = 0; g < sizes.size(); ++g) {
            grads[g].assign(sizes[g], 0.0f);
            reducer.add(grads[g]);
        }
        reducer.start();
        CHECK(reducer.coalesced() == expect_coalesced);
        for (int step = 0; step < 4; ++step) {
            for (std::size_t g = 0; g < sizes.size(); ++g) {
                if (step == 2 && g == 4) {
                    continue; // unused this step: reduced as zero
                }
                for (std::size_t i = 0; i < sizes[g]; ++i) {
                    grads[g][i] = static_cast<float>(
                        value(static_cast<std::uint64_t>(step), comm.rank(), g, i));
                }
                reducer.mark_ready(g);
            }
            reducer.finish();
            if (comm.rank() == 0) {
                std::vector<float> all;
                for (const auto& g : grads) {
                    all.insert(all.end(), g.begin(), g.end());
                }
                out.push_back(all);
            }
        }
    });
    return out;
}

} // namespace

TEST_CASE("ddp: the copying reducer reduces between the gradients on threads, as packing does") {
    for (int n = 1; n <= 4; ++n) {
        for (const bool average : {true, false}) {
            for (const double predivide : {1.0, 2.0}) {
                CAPTURE(n);
                CAPTURE(average);
                CAPTURE(predivide);
                ddp_options o;
                o.bucket_bytes = 64 * 1024; // several buckets
                o.first_bucket_bytes = 8 * 1024;
                o.average = average;
                o.predivide_factor = predivide;
                const auto fused = synchronize<>(n, true, o);
                const auto packed = synchronize<policy::comm_hook<packing_hook>>(n, false, o);
                REQUIRE(fused.size() == packed.size());
                for (std::size_t s = 0; s < fused.size(); ++s) {
                    REQUIRE(fused[s].size() == packed[s].size());
                    for (std::size_t i = 0; i < fused[s].size(); ++i) {
                        const float a = fused[s][i], b = packed[s][i];
                        if (std::abs(a - b) > 1e-6f * (1 + std::abs(b))) {
                            FAIL("step " << s << " element " << i << ": " << a << " vs " << b);
                        }
                    }
                    if (n == 2 || n == 4 || n == 1) {
                        CHECK(fused[s] == packed[s]); // dividing by a power of two is exact
                    }
                }
            }
        }
    }
}

TEST_CASE("ddp: a gradient registered twice is packed, not reduced in place twice") {
    thread_world(2).run([](thread_communicator& comm) {
        std::vector<float> g(1000), other(10);
        bucketed_reducer<thread_communicator> reducer(comm);
        reducer.add(g);
        reducer.add(other);
        reducer.add(g); // the same memory again
        reducer.start();
        CHECK_FALSE(reducer.coalesced());
        for (std::size_t i = 0; i < g.size(); ++i) {
            g[i] = static_cast<float>(value(5, comm.rank(), 0, i));
        }
        for (std::size_t i = 0; i < other.size(); ++i) {
            other[i] = 1.0f + static_cast<float>(comm.rank());
        }
        for (std::size_t k = 0; k < 3; ++k) {
            reducer.mark_ready(k);
        }
        reducer.finish();
        for (std::size_t i = 0; i < g.size(); ++i) {
            const double want = 0.5 * (static_cast<double>(static_cast<float>(value(5, 0, 0, i))) +
                                       static_cast<double>(static_cast<float>(value(5, 1, 0, i))));
            REQUIRE(std::abs(g[i] - want) <= 1e-6 * (1 + std::abs(want)));
        }
        CHECK(other[0] == 1.5f);
    });
}
