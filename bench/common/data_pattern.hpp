#pragma once

/// \file
/// The data unison-bench checks results with. Every input element is a
/// pseudo-random function of (seed, rank, index), chosen so that every reduction
/// over any number of ranks is exact in every dtype:
///   sum, min, max, avg: floats k/4 and signed integers k for k in [-8, 8],
///                       uint8 k + 8;
///   prod:               floats in {1, 2, 0.5, -1}, integers in {1, 2, -1} or
///                       {1, 2, 3} for uint8 (integer products wrap, and so does
///                       the reference).
/// The reference is the tests' plain serial loop (tests/support/serial_reduction.hpp)
/// in double precision (integers: 64-bit, wrapped to the dtype), independent of
/// unison's reduction code.

#include "../../tests/support/serial_reduction.hpp"
#include "collective_shape.hpp"

#include <unison/core/dtype.hpp>
#include <unison/core/half.hpp>
#include <unison/core/reduce_op.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace unison::bench {

/// Calls `f(std::type_identity<T>{})` with the element type of `t`.
template <class F>
decltype(auto) visit_dtype(dtype t, F&& f) {
    switch (t) {
    case dtype::f64:
        return f(std::type_identity<double>{});
    case dtype::f32:
        return f(std::type_identity<float>{});
    case dtype::f16:
        return f(std::type_identity<half>{});
    case dtype::bf16:
        return f(std::type_identity<bf16>{});
    case dtype::i64:
        return f(std::type_identity<std::int64_t>{});
    case dtype::i32:
        return f(std::type_identity<std::int32_t>{});
    case dtype::i8:
        return f(std::type_identity<std::int8_t>{});
    case dtype::u64:
        return f(std::type_identity<std::uint64_t>{});
    case dtype::u32:
        return f(std::type_identity<std::uint32_t>{});
    case dtype::u8:
        break;
    }
    return f(std::type_identity<std::uint8_t>{});
}

template <class T>
inline constexpr bool is_16bit_float_v = std::is_same_v<T, half> || std::is_same_v<T, bf16>;

template <class T>
T from_double(double v) noexcept {
    if constexpr (is_16bit_float_v<T>) {
        return T(static_cast<float>(v));
    } else {
        return static_cast<T>(v);
    }
}

template <class T>
double to_double(T v) noexcept {
    if constexpr (is_16bit_float_v<T>) {
        return static_cast<double>(static_cast<float>(v));
    } else {
        return static_cast<double>(v);
    }
}

/// Largest accepted |got - want| / max(1, |want|) for floating types (nccl-tests'
/// DeltaMaxValue); integers must match exactly.
constexpr double tolerance(dtype t) noexcept {
    switch (t) {
    case dtype::f16:
    case dtype::bf16:
        return 1e-2;
    case dtype::f32:
        return 1e-5;
    case dtype::f64:
        return 1e-12;
    default:
        return 0.0;
    }
}

/// Which input values a run uses: `seed` changes between checks so that a stale
/// result never passes, `op` picks the value set (prod gets powers of two).
struct data_pattern {
    std::uint64_t seed = 0;
    reduce_op op = reduce_op::sum;

    /// An integer in [-8, 8] for element `index` of rank `rank`.
    int step(int rank, std::size_t index) const noexcept {
        std::uint64_t x = static_cast<std::uint64_t>(index) +
                          (static_cast<std::uint64_t>(rank) << 44) + seed * 0x9e3779b97f4a7c15ull;
        x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull; // splitmix64's finalizer
        x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
        x ^= x >> 31;
        return static_cast<int>((x >> 32) % 17u) - 8;
    }

    /// The input value of element `index` of rank `rank`, exactly representable in T.
    template <class T>
    double value(int rank, std::size_t index) const noexcept {
        const int k = step(rank, index);
        if (op == reduce_op::prod) {
            const unsigned pick = static_cast<unsigned>(k + 8) & 3u;
            if constexpr (std::is_floating_point_v<T> || is_16bit_float_v<T>) {
                constexpr double values[] = {1.0, 2.0, 0.5, -1.0};
                return values[pick];
            } else if constexpr (std::is_signed_v<T>) {
                constexpr double values[] = {1.0, 2.0, -1.0, 1.0};
                return values[pick];
            } else {
                constexpr double values[] = {1.0, 2.0, 3.0, 1.0};
                return values[pick];
            }
        }
        if constexpr (std::is_floating_point_v<T> || is_16bit_float_v<T>) {
            return 0.25 * k;
        } else if constexpr (std::is_signed_v<T>) {
            return k;
        } else {
            return k + 8;
        }
    }
};

/// Writes rank `rank`'s input elements [first, first + count) to `dst`.
inline void fill_input(dtype t, const data_pattern& p, int rank, void* dst, std::size_t first,
                       std::size_t count) {
    visit_dtype(t, [&]<class T>(std::type_identity<T>) {
        T* out = static_cast<T*>(dst);
        for (std::size_t j = 0; j < count; ++j) {
            out[j] = from_double<T>(p.value<T>(rank, first + j));
        }
    });
}

/// Fills `bytes` with values no check accepts by accident: NaN for the floating
/// types (all-ones bytes), 0xA5 bytes for the integers (-91 as int8, far outside
/// the reachable values of the wider types).
inline void fill_sentinel(dtype t, void* dst, std::size_t bytes) {
    std::memset(dst, is_floating(t) ? 0xFF : 0xA5, bytes);
}

namespace detail {

template <class T>
bool matches(T got, double want, double tol) noexcept {
    const double g = to_double(got);
    return std::abs(g - want) <= tol * std::max(1.0, std::abs(want)); // false for NaN
}

/// The serial reference of a reduction over `ranks` inputs at `index`: the tests'
/// (tests/support/serial_reduction.hpp), in 64-bit integers wrapped to T.
template <class T>
T reduce_reference_integer(const data_pattern& p, reduce_op op, int ranks, std::size_t index) {
    return static_cast<T>(test::serial_reduce_integer<std::int64_t>(
        op, ranks, [&](int q) { return static_cast<std::int64_t>(p.value<T>(q, index)); }));
}

template <class T>
double reduce_reference_floating(const data_pattern& p, reduce_op op, int ranks,
                                 std::size_t index) {
    return test::serial_reduce(op, ranks,
                               [&](int q) { return static_cast<double>(p.value<T>(q, index)); });
}

} // namespace detail

/// Number of elements of `got[0, count)` that differ from the reduction with `op`
/// over every rank's input element `first + j`.
inline std::uint64_t count_wrong_reduced(dtype t, const data_pattern& p, reduce_op op, int ranks,
                                         const void* got, std::size_t first, std::size_t count) {
    return visit_dtype(t, [&]<class T>(std::type_identity<T>) {
        const T* g = static_cast<const T*>(got);
        const double tol = tolerance(t);
        std::uint64_t wrong = 0;
        for (std::size_t j = 0; j < count; ++j) {
            if constexpr (std::is_integral_v<T>) {
                wrong += g[j] != detail::reduce_reference_integer<T>(p, op, ranks, first + j);
            } else {
                wrong += !detail::matches(
                    g[j], detail::reduce_reference_floating<T>(p, op, ranks, first + j), tol);
            }
        }
        return wrong;
    });
}

/// Number of elements of `got[0, count)` that differ from rank `source`'s input
/// element `first + j` (all_gather, broadcast: a copy must be exact).
inline std::uint64_t count_wrong_copied(dtype t, const data_pattern& p, int source, const void* got,
                                        std::size_t first, std::size_t count) {
    return visit_dtype(t, [&]<class T>(std::type_identity<T>) {
        const T* g = static_cast<const T*>(got);
        std::uint64_t wrong = 0;
        for (std::size_t j = 0; j < count; ++j) {
            const T want = from_double<T>(p.value<T>(source, first + j));
            wrong += std::memcmp(&g[j], &want, sizeof(T)) != 0;
        }
        return wrong;
    });
}

/// Where one rank's buffers are and which rank it is, for preparing and checking
/// one call (buffers at their unshifted start).
struct check_site {
    collective_kind collective;
    collective_shape shape;
    dtype type;
    reduce_op op;
    int rank;
    int ranks;
    int root;
};

/// Writes this rank's inputs for one call and fills what the call must overwrite
/// with the sentinel. In place, the input lives where nccl-tests puts it: the whole
/// buffer (all_reduce, broadcast, reduce_scatter) or block `rank` (all_gather).
inline void prepare_inputs(const check_site& c, const data_pattern& p, bool in_place,
                           std::byte* send, std::byte* recv) {
    const collective_shape& s = c.shape;
    const std::size_t in_count = s.send_bytes / s.elem_bytes;
    if (!in_place) {
        fill_input(c.type, p, c.rank, send, 0, in_count);
        fill_sentinel(c.type, recv, s.recv_bytes);
        return;
    }
    if (c.collective == collective_kind::all_gather) {
        fill_sentinel(c.type, recv, s.recv_bytes);
        fill_input(c.type, p, c.rank, recv + static_cast<std::size_t>(c.rank) * s.send_bytes, 0,
                   in_count);
    } else {
        fill_input(c.type, p, c.rank, recv, 0, in_count);
    }
}

/// Where the result of one call lands in `recv`: block `rank` for in-place
/// reduce_scatter (unison's and NCCL's convention), the start otherwise.
inline const std::byte* result_of(const check_site& c, bool in_place, const std::byte* recv) {
    if (in_place && c.collective == collective_kind::reduce_scatter) {
        return recv + static_cast<std::size_t>(c.rank) * c.shape.recv_bytes;
    }
    return recv;
}

/// Number of wrong elements in this rank's result of one call.
inline std::uint64_t count_wrong(const check_site& c, const data_pattern& p,
                                 const std::byte* result) {
    const collective_shape& s = c.shape;
    switch (c.collective) {
    case collective_kind::all_reduce:
        return count_wrong_reduced(c.type, p, c.op, c.ranks, result, 0, s.count);
    case collective_kind::reduce_scatter:
        return count_wrong_reduced(c.type, p, c.op, c.ranks, result,
                                   static_cast<std::size_t>(c.rank) * s.count, s.count);
    case collective_kind::all_gather: {
        std::uint64_t wrong = 0;
        for (int q = 0; q < c.ranks; ++q) {
            wrong += count_wrong_copied(
                c.type, p, q, result + static_cast<std::size_t>(q) * s.send_bytes, 0, s.count);
        }
        return wrong;
    }
    case collective_kind::broadcast:
        return count_wrong_copied(c.type, p, c.root, result, 0, s.count);
    }
    return 0;
}

} // namespace unison::bench
