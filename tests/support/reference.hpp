#pragma once

// Deterministic pseudo-random inputs that any rank can recompute for any other
// rank, and a serial double-precision reference to check results against (exact
// integer arithmetic for the full-range unsigned types, which no double holds); the
// fold itself is serial_reduction.hpp's, which the benchmarks' checks share.

#include "serial_reduction.hpp"

#include <unison/core.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <ostream>
#include <string>
#include <vector>

namespace unison::test {

/// splitmix64: a cheap, well-mixed hash of (seed, rank, index).
inline std::uint64_t mix(std::uint64_t seed, int rank, std::size_t index) {
    std::uint64_t z = seed * 0x9e3779b97f4a7c15ull +
                      static_cast<std::uint64_t>(rank) * 0xbf58476d1ce4e5b9ull +
                      static_cast<std::uint64_t>(index) * 0x94d049bb133111ebull + 1;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/// The dtypes whose inputs span the type's whole range and whose results are compared
/// exactly: the 32- and 64-bit unsigned types, so that sums and products wrap modulo
/// 2^bits (as NCCL's and MPI's do) and every bit of a uint64, which a double cannot
/// hold above 2^53, is checked.
inline bool full_range(dtype t) {
    return t == dtype::u32 || t == dtype::u64;
}

/// One element as the reference sees it: a double for the floating-point types and
/// for the integer types whose inputs are small enough that a double holds every sum
/// and product exactly; the exact bits for the full-range types.
class element_value {
public:
    /// Implicit, so that cases compare results with plain numbers.
    element_value(double v) : real_(v) {}
    static element_value exact(std::uint64_t bits) {
        element_value e(0.0);
        e.exact_ = true;
        e.bits_ = bits;
        return e;
    }

    bool is_exact() const { return exact_; }
    /// The value as a double (rounded for an exact value above 2^53).
    double real() const { return exact_ ? static_cast<double>(bits_) : real_; }
    /// The value as an unsigned integer; a double must be a non-negative integer.
    std::uint64_t bits() const { return exact_ ? bits_ : static_cast<std::uint64_t>(real_); }
    std::string str() const { return exact_ ? std::to_string(bits_) : std::to_string(real_); }

    /// Exact values compare bit for bit, with each other and with a double that is
    /// the same integer; doubles compare as doubles.
    friend bool operator==(const element_value& a, const element_value& b) {
        if (a.exact_ && b.exact_) {
            return a.bits_ == b.bits_;
        }
        if (!a.exact_ && !b.exact_) {
            return a.real_ == b.real_;
        }
        const element_value& e = a.exact_ ? a : b;
        const double d = a.exact_ ? b.real_ : a.real_;
        return d >= 0 && d < 0x1.0p64 && d == std::floor(d) &&
               static_cast<std::uint64_t>(d) == e.bits_;
    }
    friend std::ostream& operator<<(std::ostream& os, const element_value& v) {
        return os << v.str();
    }

private:
    double real_ = 0;
    std::uint64_t bits_ = 0;
    bool exact_ = false;
};

/// Keeps the bits of `v` that an element of the full-range type `t` has.
inline std::uint64_t wrap_to_width(dtype t, std::uint64_t v) {
    return t == dtype::u32 ? v & 0xffffffffu : v;
}

/// Rounds `v` to the nearest value representable in `t`.
inline double representable(dtype t, double v) {
    switch (t) {
    case dtype::f64:
        return v;
    case dtype::f32:
        return static_cast<float>(v);
    case dtype::f16:
        return static_cast<float>(half(static_cast<float>(v)));
    case dtype::bf16:
        return static_cast<float>(bf16(static_cast<float>(v)));
    default:
        return std::round(v);
    }
}

/// Input element `index` of `rank`: never all zeros; small enough that a double
/// holds every sum and product of the other integer types over a test world exactly
/// (within four ranks they fit the 8-bit types too; past that, reference() wraps
/// them); any value of the full-range types (odd in products, which then never wrap
/// to zero).
inline element_value input_value(dtype t, reduce_op op, std::uint64_t seed, int rank,
                                 std::size_t index) {
    const std::uint64_t h = mix(seed, rank, index);
    if (full_range(t)) {
        return element_value::exact(wrap_to_width(t, op == reduce_op::prod ? h | 1 : h));
    }
    const double u = static_cast<double>(h >> 11) * 0x1.0p-53; // [0, 1)
    if (is_floating(t)) {
        // products stay near 1 so they neither overflow nor vanish
        return representable(t, op == reduce_op::prod ? 0.5 + u : 2.0 * u - 1.0);
    }
    if (op == reduce_op::prod) {
        const int v[] = {-2, -1, 1, 2};
        return t == dtype::u8 ? static_cast<double>(1 + h % 3) : v[h % 4];
    }
    if (t == dtype::u8) {
        return static_cast<double>(h % 61);
    }
    return static_cast<double>(static_cast<int>(h % 61) - 30);
}

inline void store(dtype t, void* p, std::size_t i, const element_value& e) {
    const double v = e.real();
    switch (t) {
    case dtype::f64:
        static_cast<double*>(p)[i] = v;
        return;
    case dtype::f32:
        static_cast<float*>(p)[i] = static_cast<float>(v);
        return;
    case dtype::f16:
        static_cast<half*>(p)[i] = half(static_cast<float>(v));
        return;
    case dtype::bf16:
        static_cast<bf16*>(p)[i] = bf16(static_cast<float>(v));
        return;
    case dtype::i64:
        static_cast<std::int64_t*>(p)[i] = static_cast<std::int64_t>(v);
        return;
    case dtype::i32:
        static_cast<std::int32_t*>(p)[i] = static_cast<std::int32_t>(v);
        return;
    case dtype::i8:
        static_cast<std::int8_t*>(p)[i] = static_cast<std::int8_t>(v);
        return;
    case dtype::u8:
        static_cast<std::uint8_t*>(p)[i] = static_cast<std::uint8_t>(v);
        return;
    case dtype::u32:
        static_cast<std::uint32_t*>(p)[i] = static_cast<std::uint32_t>(e.bits());
        return;
    case dtype::u64:
        static_cast<std::uint64_t*>(p)[i] = e.bits();
        return;
    }
}

inline element_value load(dtype t, const void* p, std::size_t i) {
    switch (t) {
    case dtype::f64:
        return static_cast<const double*>(p)[i];
    case dtype::f32:
        return static_cast<const float*>(p)[i];
    case dtype::f16:
        return static_cast<float>(static_cast<const half*>(p)[i]);
    case dtype::bf16:
        return static_cast<float>(static_cast<const bf16*>(p)[i]);
    case dtype::i64:
        return static_cast<double>(static_cast<const std::int64_t*>(p)[i]);
    case dtype::i32:
        return static_cast<const std::int32_t*>(p)[i];
    case dtype::i8:
        return static_cast<const std::int8_t*>(p)[i];
    case dtype::u8:
        return static_cast<const std::uint8_t*>(p)[i];
    case dtype::u32:
        return element_value::exact(static_cast<const std::uint32_t*>(p)[i]);
    case dtype::u64:
        return element_value::exact(static_cast<const std::uint64_t*>(p)[i]);
    }
    return 0.0;
}

/// A host buffer of `count` elements of `t`.
struct host_buffer {
    host_buffer(dtype t, std::size_t count) : type(t), n(count), bytes(count * size_of(t) + 1) {}
    buffer view() { return {bytes.data(), n, type}; }
    buffer block(std::size_t offset, std::size_t count) {
        return {bytes.data() + offset * size_of(type), count, type};
    }
    element_value operator[](std::size_t i) const { return load(type, bytes.data(), i); }
    void set(std::size_t i, const element_value& v) { store(type, bytes.data(), i, v); }

    dtype type;
    std::size_t n;
    std::vector<std::byte> bytes; // +1 so data() is never null, even for 0 elements
};

/// Fills `b` with `rank`'s inputs, element i being input_value(..., first + i).
inline void fill(host_buffer& b, reduce_op op, std::uint64_t seed, int rank,
                 std::size_t first = 0) {
    for (std::size_t i = 0; i < b.n; ++i) {
        b.set(i, input_value(b.type, op, seed, rank, first + i));
    }
}

/// The serial reduction over `ranks` ranks of input element `index` of the full-range
/// type `t`, in unsigned integers: sums and products wrap modulo 2^bits.
inline element_value exact_reference(dtype t, reduce_op op, std::uint64_t seed, int ranks,
                                     std::size_t index) {
    const std::uint64_t acc = serial_reduce_integer<std::uint64_t>(
        op, ranks, [&](int r) { return input_value(t, op, seed, r, index).bits(); });
    return element_value::exact(wrap_to_width(t, acc));
}

/// The exact integer `v` as an element of the integer type `t` holds it: modulo
/// 2^bits, in the type's range. The 8-bit types' sums wrap from five ranks on (u8)
/// and six (i8), as the backends' do; the wider types' never reach it in a test
/// world (a product of 2s over 31 ranks would, for i32).
inline double wrap_integer(dtype t, double v) {
    if (size_of(t) >= 8) {
        return v;
    }
    const double m = std::ldexp(1.0, static_cast<int>(8 * size_of(t)));
    double w = std::fmod(v, m);
    if (w < 0) {
        w += m;
    }
    return t != dtype::u8 && w >= m / 2 ? w - m : w;
}

/// The serial reduction over `ranks` ranks of input element `index`, in double (in
/// exact integers for the full-range types), wrapped to the type's width for the
/// other integer types.
inline element_value reference(dtype t, reduce_op op, std::uint64_t seed, int ranks,
                               std::size_t index) {
    if (full_range(t)) {
        return exact_reference(t, op, seed, ranks, index);
    }
    const double v =
        serial_reduce(op, ranks, [&](int r) { return input_value(t, op, seed, r, index).real(); });
    return is_floating(t) ? v : wrap_integer(t, v);
}

/// Unit roundoff of `t` (0 for the exact integer types).
inline double epsilon(dtype t) {
    switch (t) {
    case dtype::f64:
        return 0x1.0p-53;
    case dtype::f32:
        return 0x1.0p-24;
    case dtype::f16:
        return 0x1.0p-11;
    case dtype::bf16:
        return 0x1.0p-8;
    default:
        return 0;
    }
}

/// Allowed |got - want| for a reduction over `ranks` ranks: each of the ranks - 1
/// combining steps and the final rounding may round once in the worst case (MPI
/// reduces 16-bit floats pairwise in their own precision); magnitudes are <= 2
/// per rank. Integers are exact.
inline double tolerance(dtype t, int ranks) {
    return epsilon(t) * 2.0 * ranks * (ranks + 1);
}

/// Compares element `i` of `got` with `want` (exact values bit for bit); on a
/// difference, describes it.
inline bool same(dtype t, const element_value& got, const element_value& want, int ranks,
                 std::string* why, std::size_t i) {
    const double tol = tolerance(t, ranks);
    const bool exact = got.is_exact() || want.is_exact();
    if (exact ? got == want : std::fabs(got.real() - want.real()) <= tol) {
        return true;
    }
    if (why != nullptr && why->empty()) {
        *why = "element " + std::to_string(i) + ": got " + got.str() + ", want " + want.str() +
               (exact ? std::string(" (exact)") : " (tolerance " + std::to_string(tol) + ")");
    }
    return false;
}

/// Sizes that catch boundary bugs: empty, one, primes, counts not divisible by any
/// world size, and a few megabytes (the thread backend's streaming stores start at
/// 1 MiB). Sanitizer builds (UNISON_TEST_SANITIZED) leave out the megabytes, which
/// cost them minutes, and lower the streaming threshold to 64 KiB instead
/// (tests/CMakeLists.txt), so the same paths still run under them.
inline std::vector<std::size_t> test_counts(dtype t) {
    std::vector<std::size_t> c = {0, 1, 7, 13, 1031, 65537};
#if !defined(UNISON_TEST_SANITIZED)
    if (t == dtype::f32 || t == dtype::bf16) {
        c.push_back((3u << 20) / size_of(t) + 5); // ~3 MB, odd count
    }
#else
    (void)t;
#endif
    return c;
}

inline std::string case_name(const char* what, dtype t, reduce_op op, std::size_t count,
                             bool in_place) {
    return std::string(what) + " " + std::string(to_string(t)) + " " + std::string(to_string(op)) +
           " count=" + std::to_string(count) + (in_place ? " in-place" : " out-of-place");
}

} // namespace unison::test
