#pragma once

// all_reduce_coalesced, written once over a host backend fixture
// (tests/support/backends.hpp) and registered for a backend by
// UNISON_COALESCED_SUITE(fixture) in its test file: several tensors reduced in
// place as one buffer, against a serial reduction in double precision on random
// data (piece sizes from 0 up, crossing the ranks' shares anywhere; on MPI, calls
// small enough for the handshake, and ring calls whose large pieces go as messages
// of their own and whose small ones through the staging copy); pieces whose sizes
// differ across ranks with one total are a mismatch on every rank with nothing
// written; invalid pieces are refused before anything moves. And DDP's copying
// reducer, which reduces straight between the gradients through it, against the
// same reducer packing into buckets.

#include "../support/backends.hpp"
#include "../support/reference.hpp"

#include <unison/ddp.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace unison::test::coalesced {

/// Sizes of the pieces of round `round`: empty, tiny, a few thousand elements, and
/// (from round 4) tens of thousands, so that calls run both under and over the
/// MPI backend's 64 KiB and pieces both under and over its 4 KiB staging limit.
inline std::vector<std::size_t> piece_sizes(std::uint64_t round) {
    std::vector<std::size_t> sizes;
    const std::size_t pieces = 1 + mix(round, 99, 0) % 9;
    for (std::size_t k = 0; k < pieces; ++k) {
        const std::uint64_t r = mix(round, 98, k);
        sizes.push_back(r % 5 == 0                 ? 0
                        : r % 3 == 0               ? 1 + r % 7
                        : round >= 4 && r % 2 == 0 ? 4096 + r % 40000
                                                   : r % 5000);
    }
    return sizes;
}

/// Rank `rank`'s element `i` of piece `k` in round `round`, in [-1, 1].
inline double value(std::uint64_t round, int rank, std::size_t k, std::size_t i) {
    return static_cast<double>(mix(round * 131 + k, rank, i) % 2001) / 1000.0 - 1.0;
}

template <class T, class C>
void reduces_like_serial(C& comm, reduce_op op) {
    const int n = comm.size();
    for (std::uint64_t round = 0; round < 10; ++round) {
        CAPTURE(round);
        const auto sizes = piece_sizes(round + 10 * static_cast<std::uint64_t>(op));
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
        std::size_t wrong = 0;
        std::string first;
        for (std::size_t k = 0; k < sizes.size(); ++k) {
            for (std::size_t i = 0; i < sizes[k]; ++i) {
                double want = op == reduce_op::max ? -2.0 : 0.0;
                for (int r = 0; r < n; ++r) {
                    // the inputs as the ranks held them, in T
                    const double v = static_cast<double>(static_cast<T>(value(round, r, k, i)));
                    want = op == reduce_op::max ? std::max(want, v) : want + v;
                }
                if (op == reduce_op::avg) {
                    want /= n;
                }
                const double got = static_cast<double>(pieces[k][i]);
                if (std::abs(got - want) > 1e-6 * (1 + std::abs(want)) && wrong++ == 0) {
                    first = "piece " + std::to_string(k) + "[" + std::to_string(i) +
                            "] = " + std::to_string(got) + ", expected " + std::to_string(want);
                }
            }
        }
        CHECK_MESSAGE(wrong == 0, "rank ", comm.rank(), ": ", wrong, " wrong, the first ", first);
    }
}

/// The default hook under another type: the reducer then packs into buckets.
struct packing_hook : all_reduce_hook {};

/// Four synchronizations of random gradients through a reducer with `Policies` (one
/// gradient unused in the third); this rank's gradients after each.
template <class C, class... Policies>
std::vector<std::vector<float>> synchronize(C& comm, bool expect_coalesced, ddp_options options) {
    const std::vector<std::size_t> sizes = {4097, 1, 300, 65536, 33, 0, 1000, 20000, 9000};
    std::vector<std::vector<float>> out;
    std::vector<std::vector<float>> grads(sizes.size());
    bucketed_reducer<C, Policies...> reducer(comm, options);
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
                grads[g][i] =
                    static_cast<float>(value(static_cast<std::uint64_t>(step), comm.rank(), g, i));
            }
            reducer.mark_ready(g);
        }
        (void)reducer.finish();
        std::vector<float> all;
        for (const auto& g : grads) {
            all.insert(all.end(), g.begin(), g.end());
        }
        out.push_back(all);
    }
    return out;
}

} // namespace unison::test::coalesced

TEST_CASE_TEMPLATE_DEFINE("all_reduce_coalesced equals a serial reduction", Backend,
                          coalesced_serial) {
    using namespace unison;
    Backend::run([](auto& comm) {
        test::coalesced::reduces_like_serial<float>(comm, reduce_op::sum);
        test::coalesced::reduces_like_serial<double>(comm, reduce_op::avg);
        test::coalesced::reduces_like_serial<float>(comm, reduce_op::max);
    });
}

TEST_CASE_TEMPLATE_DEFINE("all_reduce_coalesced with other piece sizes on one rank is a "
                          "mismatch, nothing written",
                          Backend, coalesced_mismatch) {
    using namespace unison;
    Backend::run([](auto& comm) {
        const int n = comm.size();
        if (n == 1) {
            return;
        }
        for (const std::size_t scale : {std::size_t{1}, std::size_t{100}}) { // handshake, ring
            CAPTURE(scale);
            // Same total everywhere; the last rank splits it differently.
            const bool odd = comm.rank() == n - 1;
            std::vector<float> a((odd ? 100 : 200) * scale, 1.0f + comm.rank());
            std::vector<float> b((odd ? 200 : 100) * scale, 2.0f + comm.rank());
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
            CHECK(c[9] == static_cast<float>(n));
        }
    });
}

TEST_CASE_TEMPLATE_DEFINE("all_reduce_coalesced refuses overlapping pieces and mixed dtypes, "
                          "then works",
                          Backend, coalesced_refusals) {
    using namespace unison;
    Backend::run([](auto& comm) {
        const float n = static_cast<float>(comm.size());
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
        // A tensor, or the tensors together, larger than any object can be.
        const std::size_t most = static_cast<std::size_t>(PTRDIFF_MAX) / sizeof(float);
        const std::vector<buffer> huge{buffer{a.data(), SIZE_MAX, dtype::f32}};
        CHECK_THROWS_WITH_AS(all_reduce_coalesced(comm, std::span<const buffer>(huge)),
                             doctest::Contains("than any object can hold"), argument_error);
        const std::vector<buffer> halves{buffer{a.data(), most / 2 + 1, dtype::f32},
                                         buffer{d.data(), most / 2 + 1, dtype::f32}};
        CHECK_THROWS_WITH_AS(all_reduce_coalesced(comm, std::span<const buffer>(halves)),
                             doctest::Contains("than any object can hold"), argument_error);
        const std::vector<buffer> fine{buffer{a.data(), 50, dtype::f32},
                                       buffer{a.data() + 50, 50, dtype::f32}};
        all_reduce_coalesced(comm, std::span<const buffer>(fine));
        CHECK(a[0] == n);
        CHECK(a[99] == n);
    });
}

TEST_CASE_TEMPLATE_DEFINE("ddp: the copying reducer reduces between the gradients, as packing "
                          "does",
                          Backend, coalesced_ddp) {
    using namespace unison;
    using test::coalesced::packing_hook;
    Backend::run([](auto& comm) {
        using C = std::remove_reference_t<decltype(comm)>;
        const int n = comm.size();
        for (const bool average : {true, false}) {
            for (const double predivide : {1.0, 2.0}) {
                CAPTURE(average);
                CAPTURE(predivide);
                ddp_options o;
                o.bucket_bytes = 64 * 1024; // several buckets
                o.first_bucket_bytes = 8 * 1024;
                o.average = average;
                o.predivide_factor = predivide;
                const auto fused = test::coalesced::synchronize<C>(comm, true, o);
                const auto packed =
                    test::coalesced::synchronize<C, policy::comm_hook<packing_hook>>(comm, false,
                                                                                     o);
                REQUIRE(fused.size() == packed.size());
                for (std::size_t s = 0; s < fused.size(); ++s) {
                    REQUIRE(fused[s].size() == packed[s].size());
                    for (std::size_t i = 0; i < fused[s].size(); ++i) {
                        const float a = fused[s][i], b = packed[s][i];
                        if (std::abs(a - b) > 1e-6f * (1 + std::abs(b))) {
                            FAIL("step " << s << " element " << i << ": " << a << " vs " << b);
                        }
                    }
                    if (n <= 2) {
                        // Two ranks' sum is one addition, and halving is exact. With
                        // more ranks, the order of the additions may follow an element's
                        // place in the call (MPI's ring starts each chunk at another
                        // rank, and staged tensors move), so only the tolerance holds.
                        CHECK(fused[s] == packed[s]);
                    }
                }
                // and against the serial average of what the ranks' gradients were
                const std::vector<std::size_t> sizes = {4097, 1,    300,   65536, 33,
                                                        0,    1000, 20000, 9000};
                std::size_t at = 0, wrong = 0;
                for (std::size_t g = 0; g < sizes.size(); ++g) {
                    for (std::size_t i = 0; i < sizes[g]; ++i, ++at) {
                        double want = 0;
                        for (int r = 0; r < n; ++r) {
                            want += static_cast<float>(test::coalesced::value(3, r, g, i));
                        }
                        want /= average ? n : 1;
                        const double got = fused[3][at];
                        wrong += std::abs(got - want) > 1e-5 * (1 + std::abs(want)) ? 1 : 0;
                    }
                }
                CHECK(wrong == 0);
            }
        }
    });
}

TEST_CASE_TEMPLATE_DEFINE("ddp: a gradient registered twice is packed, not reduced in place twice",
                          Backend, coalesced_twice) {
    using namespace unison;
    Backend::run([](auto& comm) {
        using C = std::remove_reference_t<decltype(comm)>;
        const int n = comm.size();
        std::vector<float> g(1000), other(10);
        bucketed_reducer<C> reducer(comm);
        reducer.add(g);
        reducer.add(other);
        reducer.add(g); // the same memory again
        reducer.start();
        CHECK_FALSE(reducer.coalesced());
        for (std::size_t i = 0; i < g.size(); ++i) {
            g[i] = static_cast<float>(test::coalesced::value(5, comm.rank(), 0, i));
        }
        for (std::size_t i = 0; i < other.size(); ++i) {
            other[i] = 1.0f + static_cast<float>(comm.rank());
        }
        for (std::size_t k = 0; k < 3; ++k) {
            reducer.mark_ready(k);
        }
        (void)reducer.finish();
        for (std::size_t i = 0; i < g.size(); ++i) {
            double want = 0;
            for (int r = 0; r < n; ++r) {
                want += static_cast<float>(test::coalesced::value(5, r, 0, i));
            }
            want /= n;
            REQUIRE(std::abs(g[i] - want) <= 1e-6 * (1 + std::abs(want)));
        }
        CHECK(other[0] == static_cast<float>(n + 1) / 2.0f);
    });
}

/// Registers the coalesced all-reduce cases for host backend fixture `Backend`.
#define UNISON_COALESCED_SUITE(Backend)                                                            \
    TEST_CASE_TEMPLATE_INVOKE(coalesced_serial, Backend);                                          \
    TEST_CASE_TEMPLATE_INVOKE(coalesced_mismatch, Backend);                                        \
    TEST_CASE_TEMPLATE_INVOKE(coalesced_refusals, Backend);                                        \
    TEST_CASE_TEMPLATE_INVOKE(coalesced_ddp, Backend);                                             \
    TEST_CASE_TEMPLATE_INVOKE(coalesced_twice, Backend)
