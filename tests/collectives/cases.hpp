#pragma once

// Every collective, written once against the communicator concept and a memory
// space, and run on every backend by the suite of tests/suites/collectives.hpp.
// Each case computes the ranks' inputs on the host from deterministic random data,
// puts them in the space (host memory, or the communicator's GPU), runs the
// collective, reads the results back through the space and compares every element
// with a serial double-precision reference (exact integers for u32 and u64, whose
// inputs span their whole range).

#include "../support/memory_space.hpp"
#include "../support/reference.hpp"

#include <unison/comm.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace unison::test {

inline constexpr reduce_op all_ops[] = {reduce_op::sum, reduce_op::prod, reduce_op::min,
                                        reduce_op::max, reduce_op::avg};

// The element types and operations the cases run over. Under ThreadSanitizer
// (UNISON_TEST_RACES_ONLY, tests/CMakeLists.txt) one type of each width and three
// operations: types and operations change the arithmetic, not which thread touches
// which memory when, and their full product costs TSan minutes. The ASan+UBSan build
// and every other backend run all of them.
#if defined(UNISON_TEST_RACES_ONLY)
inline constexpr dtype case_dtypes[] = {dtype::f64, dtype::f32, dtype::bf16, dtype::u8};
inline constexpr reduce_op case_ops[] = {reduce_op::sum, reduce_op::max, reduce_op::avg};
/// The types reduce_cases runs over.
inline constexpr dtype reduce_dtypes[] = {dtype::f64, dtype::f32, dtype::bf16, dtype::u8};
#else
inline constexpr const auto& case_dtypes = all_dtypes;
inline constexpr const auto& case_ops = all_ops;
/// The types reduce_cases runs over.
inline constexpr dtype reduce_dtypes[] = {dtype::f64, dtype::f32, dtype::bf16, dtype::f16,
                                          dtype::i32, dtype::u8,  dtype::u32,  dtype::u64};
#endif

inline bool op_applies(dtype t, reduce_op op) {
    return op != reduce_op::avg || is_floating(t);
}

/// `count` elements of `t` holding `rank`'s inputs (see fill).
inline host_buffer filled(dtype t, std::size_t count, reduce_op op, std::uint64_t seed, int rank) {
    host_buffer b(t, count);
    fill(b, op, seed, rank);
    return b;
}

/// Records the first failure of a case; checked once per case.
struct outcome {
    std::string first;
    void expect(bool ok, const std::string& what) {
        if (!ok && first.empty()) {
            first = what;
        }
    }
    /// For checks inside element loops: the message is built only on failure.
    template <class F>
    requires std::is_invocable_r_v<std::string, F>
    void expect(bool ok, F&& what) {
        if (!ok && first.empty()) {
            first = what();
        }
    }
};

#define UNISON_CHECK_CASE(comm, name, o)                                                           \
    CHECK_MESSAGE((o).first.empty(), "rank " << (comm).rank() << " of " << (comm).size() << ": "   \
                                             << (name) << ": " << (o).first)

template <class Space, communicator C>
requires memory_space<Space, C>
void all_reduce_cases(C& comm, std::uint64_t seed = 1) {
    const int n = comm.size();
    for (dtype t : case_dtypes) {
        for (reduce_op op : case_ops) {
            if (!op_applies(t, op)) {
                continue;
            }
            for (std::size_t count : test_counts(t)) {
                if (count > 100000 && op != reduce_op::sum && op != reduce_op::avg) {
                    continue; // the large size exercises bandwidth paths, not every op
                }
                for (bool in_place : {false, true}) {
                    ++seed;
                    auto in = Space::make(comm, filled(t, count, op, seed, comm.rank()));
                    // out of place, the output starts as garbage that must be overwritten
                    auto out =
                        Space::make(comm, in_place ? host_buffer(t, count)
                                                   : filled(t, count, op, seed + 7, comm.rank()));
                    if (in_place) {
                        all_reduce(comm, in.view(), op);
                    } else {
                        all_reduce(comm, in.view(), out.view(), op);
                    }
                    const host_buffer& result = Space::read(comm, in_place ? in : out);
                    outcome o;
                    std::string why;
                    for (std::size_t i = 0; i < count && o.first.empty(); ++i) {
                        o.expect(same(t, result[i], reference(t, op, seed, n, i), n, &why, i), why);
                    }
                    if (!in_place) { // the input is untouched
                        const host_buffer& input = Space::read(comm, in);
                        for (std::size_t i = 0; i < count && o.first.empty(); ++i) {
                            o.expect(input[i] == input_value(t, op, seed, comm.rank(), i),
                                     "input modified at " + std::to_string(i));
                        }
                    }
                    UNISON_CHECK_CASE(comm, case_name("all_reduce", t, op, count, in_place), o);
                }
            }
        }
    }
}

template <class Space, communicator C>
requires memory_space<Space, C>
void reduce_scatter_cases(C& comm, std::uint64_t seed = 1000) {
    const int n = comm.size();
    const auto me = static_cast<std::size_t>(comm.rank());
    for (dtype t : case_dtypes) {
        for (reduce_op op : case_ops) {
            if (!op_applies(t, op)) {
                continue;
            }
            for (std::size_t count :
                 {std::size_t{0}, std::size_t{1}, std::size_t{13}, std::size_t{4099}}) {
                for (bool in_place : {false, true}) {
                    ++seed;
                    const std::size_t total = count * static_cast<std::size_t>(n);
                    auto in = Space::make(comm, filled(t, total, op, seed, comm.rank()));
                    auto out = Space::make(comm, host_buffer(t, count));
                    if (in_place) {
                        reduce_scatter(comm, in.view(), op);
                    } else {
                        reduce_scatter(comm, in.view(), out.view(), op);
                    }
                    const host_buffer& result = Space::read(comm, in_place ? in : out);
                    outcome o;
                    std::string why;
                    for (std::size_t i = 0; i < count && o.first.empty(); ++i) {
                        const element_value got = in_place ? result[me * count + i] : result[i];
                        o.expect(
                            same(t, got, reference(t, op, seed, n, me * count + i), n, &why, i),
                            why);
                    }
                    UNISON_CHECK_CASE(comm, case_name("reduce_scatter", t, op, count, in_place), o);
                }
            }
        }
    }
}

template <class Space, communicator C>
requires memory_space<Space, C>
void all_gather_cases(C& comm, std::uint64_t seed = 2000) {
    const int n = comm.size();
    const auto me = static_cast<std::size_t>(comm.rank());
    for (dtype t : case_dtypes) {
        for (std::size_t count : test_counts(t)) {
            for (bool in_place : {false, true}) {
                ++seed;
                const std::size_t total = count * static_cast<std::size_t>(n);
                host_buffer mine = filled(t, count, reduce_op::sum, seed, comm.rank());
                host_buffer all(t, total);
                if (in_place) {
                    for (std::size_t i = 0; i < count; ++i) {
                        all.set(me * count + i, mine[i]);
                    }
                }
                auto in = Space::make(comm, std::move(mine));
                auto out = Space::make(comm, std::move(all));
                if (in_place) {
                    all_gather(comm, out.view());
                } else {
                    all_gather(comm, in.view(), out.view());
                }
                const host_buffer& result = Space::read(comm, out);
                outcome o;
                for (int r = 0; r < n && o.first.empty(); ++r) {
                    for (std::size_t i = 0; i < count && o.first.empty(); ++i) {
                        const element_value want = input_value(t, reduce_op::sum, seed, r, i);
                        o.expect(result[static_cast<std::size_t>(r) * count + i] == want,
                                 "block " + std::to_string(r) + " element " + std::to_string(i));
                    }
                }
                UNISON_CHECK_CASE(comm, case_name("all_gather", t, reduce_op::sum, count, in_place),
                                  o);
            }
        }
    }
    // all_gatherv: rank r contributes 3r + 1 elements (uneven, never equal).
    for (dtype t : {dtype::f32, dtype::bf16, dtype::i64}) {
        ++seed;
        std::vector<std::size_t> counts(static_cast<std::size_t>(n));
        for (int r = 0; r < n; ++r) {
            counts[static_cast<std::size_t>(r)] = 3u * static_cast<std::size_t>(r) * 101u + 1u;
        }
        auto in = Space::make(comm, filled(t, counts[me], reduce_op::sum, seed, comm.rank()));
        auto out = Space::make(
            comm, host_buffer(t, std::accumulate(counts.begin(), counts.end(), std::size_t{0})));
        all_gatherv(comm, in.view(), out.view(), counts);
        const host_buffer& result = Space::read(comm, out);
        outcome o;
        std::size_t offset = 0;
        for (int r = 0; r < n; ++r) {
            for (std::size_t i = 0; i < counts[static_cast<std::size_t>(r)]; ++i) {
                o.expect(result[offset + i] == input_value(t, reduce_op::sum, seed, r, i),
                         "rank " + std::to_string(r) + "'s element " + std::to_string(i));
            }
            offset += counts[static_cast<std::size_t>(r)];
        }
        UNISON_CHECK_CASE(comm, "all_gatherv " + std::string(to_string(t)), o);
    }
}

template <class Space, communicator C>
requires memory_space<Space, C>
void broadcast_cases(C& comm, std::uint64_t seed = 3000) {
    const int n = comm.size();
    for (dtype t : case_dtypes) {
        for (std::size_t count : test_counts(t)) {
            for (int root = 0; root < n; ++root) {
                for (bool in_place : {false, true}) {
                    ++seed;
                    // every rank has different data
                    auto in =
                        Space::make(comm, filled(t, count, reduce_op::sum, seed, comm.rank()));
                    auto out = Space::make(comm, host_buffer(t, count));
                    if (in_place) {
                        broadcast(comm, in.view(), root);
                    } else {
                        broadcast(comm, in.view(), out.view(), root);
                    }
                    const host_buffer& result = Space::read(comm, in_place ? in : out);
                    outcome o;
                    for (std::size_t i = 0; i < count && o.first.empty(); ++i) {
                        o.expect(result[i] == input_value(t, reduce_op::sum, seed, root, i),
                                 "element " + std::to_string(i));
                    }
                    UNISON_CHECK_CASE(comm,
                                      case_name("broadcast", t, reduce_op::sum, count, in_place) +
                                          " root=" + std::to_string(root),
                                      o);
                }
            }
        }
    }
}

template <class Space, communicator C>
requires memory_space<Space, C>
void reduce_cases(C& comm, std::uint64_t seed = 4000) {
    const int n = comm.size();
    for (dtype t : reduce_dtypes) {
        for (reduce_op op : case_ops) {
            if (!op_applies(t, op)) {
                continue;
            }
            for (std::size_t count :
                 {std::size_t{0}, std::size_t{1}, std::size_t{1031}, std::size_t{70001}}) {
                for (int root = 0; root < n; ++root) {
                    for (bool in_place : {false, true}) {
                        ++seed;
                        auto in = Space::make(comm, filled(t, count, op, seed, comm.rank()));
                        auto out = Space::make(comm, filled(t, count, op, seed + 5, comm.rank()));
                        if (in_place) {
                            reduce(comm, in.view(), root, op);
                        } else {
                            reduce(comm, in.view(), out.view(), root, op);
                        }
                        outcome o;
                        std::string why;
                        const host_buffer& result = Space::read(comm, in_place ? in : out);
                        for (std::size_t i = 0; i < count && o.first.empty(); ++i) {
                            if (comm.rank() == root) {
                                o.expect(
                                    same(t, result[i], reference(t, op, seed, n, i), n, &why, i),
                                    why);
                            } else if (!in_place) { // non-root outputs (result) are not written
                                o.expect(result[i] == input_value(t, op, seed + 5, comm.rank(), i),
                                         "non-root output written at " + std::to_string(i));
                            }
                        }
                        UNISON_CHECK_CASE(comm,
                                          case_name("reduce", t, op, count, in_place) +
                                              " root=" + std::to_string(root),
                                          o);
                    }
                }
            }
        }
    }
}

template <class Space, communicator C>
requires memory_space<Space, C>
void all_to_all_cases(C& comm, std::uint64_t seed = 5000) {
    const int n = comm.size();
    const auto me = static_cast<std::size_t>(comm.rank());
    for (dtype t : case_dtypes) {
        for (std::size_t per_peer :
             {std::size_t{0}, std::size_t{1}, std::size_t{17}, std::size_t{20011}}) {
            ++seed;
            const std::size_t total = per_peer * static_cast<std::size_t>(n);
            auto in = Space::make(comm, filled(t, total, reduce_op::sum, seed, comm.rank()));
            auto out = Space::make(comm, host_buffer(t, total));
            all_to_all(comm, in.view(), out.view());
            const host_buffer& result = Space::read(comm, out);
            outcome o;
            for (int q = 0; q < n && o.first.empty(); ++q) {
                for (std::size_t i = 0; i < per_peer && o.first.empty(); ++i) {
                    // block q of my output is block `me` of rank q's input
                    const element_value want =
                        input_value(t, reduce_op::sum, seed, q, me * per_peer + i);
                    o.expect(result[static_cast<std::size_t>(q) * per_peer + i] == want,
                             "block " + std::to_string(q) + " element " + std::to_string(i));
                }
            }
            UNISON_CHECK_CASE(comm, case_name("all_to_all", t, reduce_op::sum, per_peer, false), o);
        }
    }
}

/// Ring exchange with send/recv, blocking and non-blocking: every rank sends to the
/// next and receives from the previous, posting the send first (a deadlock if sends
/// waited for their receiver before the receive was posted). Host memory only: the
/// thread backend's send and recv take host memory, and NCCL matches sends and
/// receives by order, not by the tags this case uses.
template <communicator C>
void send_recv_cases(C& comm, std::uint64_t seed = 6000) {
    const int n = comm.size();
    if (n < 2) {
        return;
    }
    const int next = (comm.rank() + 1) % n, prev = (comm.rank() + n - 1) % n;
    for (dtype t : {dtype::f32, dtype::f64, dtype::bf16, dtype::i8}) {
        for (std::size_t count : {std::size_t{1}, std::size_t{1031}, std::size_t{300007}}) {
            ++seed;
            host_buffer in(t, count), out(t, count), out2(t, count);
            fill(in, reduce_op::sum, seed, comm.rank());
            auto s = send_async(comm, in.view(), next, 3);
            recv(comm, out.view(), prev, 3);
            s.wait();
            // and the other way round, with both sides non-blocking and two tags
            auto r1 = recv_async(comm, out2.view(), next, 5);
            auto s1 = send_async(comm, in.view(), prev, 5);
            std::vector<typename C::request_type> reqs;
            reqs.push_back(std::move(r1));
            reqs.push_back(std::move(s1));
            wait_all(std::span(reqs));
            outcome o;
            for (std::size_t i = 0; i < count && o.first.empty(); ++i) {
                o.expect(out[i] == input_value(t, reduce_op::sum, seed, prev, i),
                         "from prev, element " + std::to_string(i));
                o.expect(out2[i] == input_value(t, reduce_op::sum, seed, next, i),
                         "from next, element " + std::to_string(i));
            }
            UNISON_CHECK_CASE(comm, case_name("send/recv", t, reduce_op::sum, count, false), o);
        }
    }
}

/// Many non-blocking collectives in flight at once complete in issue order with
/// correct results; wait_all waits for all of them.
template <class Space, communicator C>
requires memory_space<Space, C>
void async_cases(C& comm, std::uint64_t seed = 7000) {
    const int n = comm.size();
    constexpr int in_flight = 6;
    std::vector<typename Space::tensor> bufs;
    std::vector<typename C::request_type> reqs;
    const std::size_t counts[in_flight] = {5, 1031, 70001, 3, 200003, 17};
    for (int k = 0; k < in_flight; ++k) {
        bufs.push_back(
            Space::make(comm, filled(dtype::f32, counts[k], reduce_op::sum,
                                     seed + static_cast<std::uint64_t>(k), comm.rank())));
    }
    for (int k = 0; k < in_flight; ++k) {
        reqs.push_back(all_reduce_async(comm, bufs[static_cast<std::size_t>(k)].view()));
    }
    auto gathered = Space::make(comm, host_buffer(dtype::f32, 4 * static_cast<std::size_t>(n)));
    auto mine = Space::make(comm, filled(dtype::f32, 4, reduce_op::sum, seed + 99, comm.rank()));
    reqs.push_back(all_gather_async(comm, mine.view(), gathered.view()));
    while (!test_all(std::span(reqs))) {
    }
    wait_all(std::span(reqs));
    barrier(comm);
    auto b = barrier_async(comm);
    b.wait();
    outcome o;
    std::string why;
    for (int k = 0; k < in_flight; ++k) {
        const host_buffer& result = Space::read(comm, bufs[static_cast<std::size_t>(k)]);
        for (std::size_t i = 0; i < counts[k] && o.first.empty(); ++i) {
            o.expect(same(dtype::f32, result[i],
                          reference(dtype::f32, reduce_op::sum,
                                    seed + static_cast<std::uint64_t>(k), n, i),
                          n, &why, i),
                     "request " + std::to_string(k) + ": " + why);
        }
    }
    const host_buffer& all = Space::read(comm, gathered);
    for (int r = 0; r < n; ++r) {
        for (std::size_t i = 0; i < 4; ++i) {
            o.expect(all[static_cast<std::size_t>(r) * 4 + i] ==
                         input_value(dtype::f32, reduce_op::sum, seed + 99, r, i),
                     "all_gather_async block " + std::to_string(r));
        }
    }
    UNISON_CHECK_CASE(comm, "async all_reduce x6 + all_gather", o);

    // Requests may be waited in any order, different on every rank: the backend must
    // still match rank r's k-th call with every other rank's k-th call. Each rank
    // starts its waits at a different request.
    const std::size_t block = 3001;
    auto gather_in =
        Space::make(comm, filled(dtype::f32, block, reduce_op::sum, seed + 200, comm.rank()));
    auto gather_out =
        Space::make(comm, host_buffer(dtype::f32, block * static_cast<std::size_t>(n)));
    auto bcast = Space::make(comm, filled(dtype::f32, 777, reduce_op::sum, seed + 201, 0));
    if (comm.rank() != 0) {
        bcast = Space::make(comm, filled(dtype::f32, 777, reduce_op::sum, seed + 202, 1));
    }
    auto small = Space::make(comm, filled(dtype::f32, 9, reduce_op::sum, seed + 203, comm.rank()));
    auto rs_in = Space::make(comm, filled(dtype::f32, 1000 * static_cast<std::size_t>(n),
                                          reduce_op::sum, seed + 204, comm.rank()));
    auto rs_out = Space::make(comm, host_buffer(dtype::f32, 1000));
    auto large =
        Space::make(comm, filled(dtype::f32, 50000, reduce_op::sum, seed + 205, comm.rank()));
    std::vector<typename C::request_type> mixed;
    mixed.push_back(all_gather_async(comm, gather_in.view(), gather_out.view()));
    mixed.push_back(all_reduce_async(comm, small.view()));
    mixed.push_back(broadcast_async(comm, bcast.view(), 0));
    mixed.push_back(all_reduce_async(comm, large.view()));
    mixed.push_back(reduce_scatter_async(comm, rs_in.view(), rs_out.view()));
    const std::size_t k = mixed.size();
    for (std::size_t j = 0; j < k; ++j) {
        mixed[(j + static_cast<std::size_t>(comm.rank())) % k].wait();
    }
    outcome m;
    const host_buffer& g = Space::read(comm, gather_out);
    for (int r = 0; r < n && m.first.empty(); ++r) {
        for (std::size_t i = 0; i < block; ++i) {
            m.expect(g[static_cast<std::size_t>(r) * block + i] ==
                         input_value(dtype::f32, reduce_op::sum, seed + 200, r, i),
                     "all_gather block " + std::to_string(r));
        }
    }
    const host_buffer& bc = Space::read(comm, bcast);
    for (std::size_t i = 0; i < 777 && m.first.empty(); ++i) {
        m.expect(bc[i] == input_value(dtype::f32, reduce_op::sum, seed + 201, 0, i), "broadcast");
    }
    auto check_sum = [&](const host_buffer& got, std::size_t count, std::uint64_t s,
                         std::size_t offset, const char* what) {
        for (std::size_t i = 0; i < count && m.first.empty(); ++i) {
            const bool ok =
                same(dtype::f32, got[i], reference(dtype::f32, reduce_op::sum, s, n, offset + i), n,
                     &why, i);
            m.expect(ok, [&] { return std::string(what) + ": " + why; });
        }
    };
    check_sum(Space::read(comm, small), 9, seed + 203, 0, "small all_reduce");
    check_sum(Space::read(comm, large), 50000, seed + 205, 0, "large all_reduce");
    check_sum(Space::read(comm, rs_out), 1000, seed + 204,
              1000 * static_cast<std::size_t>(comm.rank()), "reduce_scatter");
    UNISON_CHECK_CASE(comm, "five collectives waited in a different order on every rank", m);
}

/// split into even and odd ranks (reversed by key) and reduce within each half.
template <class Space, communicator C>
requires memory_space<Space, C>
void split_cases(C& comm) {
    const int color = comm.rank() % 2;
    C sub = comm.split(color, -comm.rank());
    std::vector<int> members;
    for (int r = color; r < comm.size(); r += 2) {
        members.push_back(r);
    }
    const int expect_size = static_cast<int>(members.size());
    // key = -rank: the highest old rank becomes rank 0
    const int expect_rank =
        expect_size - 1 -
        static_cast<int>(std::find(members.begin(), members.end(), comm.rank()) - members.begin());
    CHECK(sub.size() == expect_size);
    CHECK(sub.rank() == expect_rank);
    host_buffer xs(dtype::i64, 2);
    xs.set(0, comm.rank() + 1);
    xs.set(1, 10 * (comm.rank() + 1));
    auto x = Space::make(sub, std::move(xs));
    all_reduce(sub, x.view());
    const host_buffer& got = Space::read(sub, x);
    double want = 0;
    for (int r : members) {
        want += r + 1;
    }
    CHECK(got[0] == want);
    CHECK(got[1] == 10 * want);
    // the parent still works after the split
    host_buffer ys(dtype::i64, 1);
    ys.set(0, 1);
    auto y = Space::make(comm, std::move(ys));
    all_reduce(comm, y.view());
    CHECK(Space::read(comm, y)[0] == comm.size());
}

/// Invalid arguments throw argument_error before any data moves and leave the
/// communicator usable (the next collective still matches across ranks). Host
/// memory only: the tensors are host vectors, and one check is that device memory
/// given to a host communicator is rejected.
template <communicator C>
void argument_error_cases(C& comm) {
    const int n = comm.size();
    std::vector<float> a(10, 1.0f), b(12, 0.0f);
    std::vector<double> d(10, 1.0);
    std::vector<std::int32_t> ints(10, 1);
    auto message = [&](auto&& fn) -> std::string {
        try {
            fn();
        } catch (const argument_error& e) {
            CHECK(e.rank() == comm.rank());
            return e.what();
        }
        return "no error";
    };
    CHECK(message([&] { all_reduce(comm, a, b); }).find("output has 12") != std::string::npos);
    CHECK(message([&] {
              all_reduce(comm, a, d);
          }).find("input is float but the output is double") != std::string::npos);
    CHECK(message([&] {
              all_reduce(comm, ints, reduce_op::avg);
          }).find("avg is defined for floating-point") != std::string::npos);
    CHECK(message([&] {
              broadcast(comm, a, n);
          }).find("root " + std::to_string(n) + " is out of range") != std::string::npos);
    CHECK(message([&] { reduce(comm, a, -1); }).find("root -1 is out of range") !=
          std::string::npos);
    CHECK(message([&] { all_gather(comm, a, b); }).find("output has 12") != std::string::npos);
    std::vector<float> odd(static_cast<std::size_t>(n) * 3 + 1, 1.0f);
    if (n > 1) {
        CHECK(message([&] { reduce_scatter(comm, odd); }).find("not a multiple of the") !=
              std::string::npos);
        CHECK(message([&] { all_to_all(comm, odd, odd); }).find("not a multiple") !=
              std::string::npos);
    }
    CHECK(message([&] { send(comm, a, comm.rank()); }).find("is this rank") != std::string::npos);
    if (n > 1) {
        CHECK(message([&] { send(comm, a, (comm.rank() + 1) % n, -4); }).find("tag -4") !=
              std::string::npos);
    }
    CHECK(message([&] {
              all_reduce(comm, std::span<const float>(a), std::span<float>(a.data() + 1, 10));
          }).find("overlap") != std::string::npos);
    CHECK(message([&] {
              all_reduce(comm, buffer{nullptr, 3, dtype::f32});
          }).find("null data pointer") != std::string::npos);
    CHECK(message([&] {
              all_reduce(comm, buffer{a.data(), 10, dtype::f32, device::cuda(0)});
          }).find("cuda:0") != std::string::npos);
    // Counts no buffer can have (from a negative or wrapped-around computation) are
    // refused before anything moves, whether the count itself or the count times
    // the ranks is too large for one object.
    const auto refused = [&](auto&& fn) {
        const std::string m = message(fn);
        return m.find("than any object can hold") != std::string::npos;
    };
    const std::size_t most = static_cast<std::size_t>(PTRDIFF_MAX) / sizeof(float);
    for (const std::size_t count :
         {SIZE_MAX, std::size_t{1} << 61, std::size_t{1} << 62, std::size_t{1} << 63,
          static_cast<std::size_t>(-1024), most + 1}) {
        CAPTURE(count);
        buffer huge{a.data(), count, dtype::f32};
        const const_buffer in_huge{a.data(), count, dtype::f32};
        buffer out_ok{b.data(), b.size(), dtype::f32};
        CHECK(refused([&] { all_reduce(comm, huge); }));
        CHECK(refused([&] { all_reduce(comm, in_huge, out_ok); }));
        CHECK(refused([&] { reduce_scatter(comm, huge); }));
        CHECK(refused([&] { all_gather(comm, huge); }));
        CHECK(refused([&] { all_gather(comm, in_huge, out_ok); }));
        CHECK(refused([&] { broadcast(comm, huge, 0); }));
        CHECK(refused([&] { reduce(comm, huge, 0); }));
        const std::vector<std::size_t> counts(static_cast<std::size_t>(n), count);
        CHECK(refused([&] { all_gatherv(comm, in_huge, out_ok, counts); }));
        if (n > 1) {
            CHECK(refused([&] { send(comm, huge, (comm.rank() + 1) % n); }));
        }
    }
    if (n > 1) { // each count fits, the count times the ranks does not
        const std::size_t half = most / 2 + 1;
        CHECK(refused([&] {
            all_gather(comm, const_buffer{a.data(), half, dtype::f32},
                       buffer{b.data(), b.size(), dtype::f32});
        }));
        CHECK(refused([&] {
            reduce_scatter(comm, const_buffer{a.data(), a.size(), dtype::f32},
                           buffer{b.data(), half, dtype::f32});
        }));
        const std::vector<std::size_t> halves(static_cast<std::size_t>(n), half);
        CHECK(refused([&] {
            all_gatherv(comm, const_buffer{a.data(), half, dtype::f32},
                        buffer{b.data(), b.size(), dtype::f32}, halves);
        }));
    }
    // still usable, and still in step across ranks
    std::vector<float> ok(5, 2.0f);
    all_reduce(comm, ok);
    CHECK(ok[4] == doctest::Approx(2.0 * n));
}

} // namespace unison::test
