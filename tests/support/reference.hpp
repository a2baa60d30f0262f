#pragma once

// Deterministic pseudo-random inputs that any rank can recompute for any other
// rank, and a serial double-precision reference to check results against.

#include <unison/core.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
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

/// Input element `index` of `rank`: never all zeros, and small enough that sums and
/// products over four ranks stay exact in the integer types.
inline double input_value(dtype t, reduce_op op, std::uint64_t seed, int rank, std::size_t index) {
    const std::uint64_t h = mix(seed, rank, index);
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

inline void store(dtype t, void* p, std::size_t i, double v) {
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
    }
}

inline double load(dtype t, const void* p, std::size_t i) {
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
    }
    return 0;
}

/// A host buffer of `count` elements of `t`.
struct host_buffer {
    host_buffer(dtype t, std::size_t count) : type(t), n(count), bytes(count * size_of(t) + 1) {}
    buffer view() { return {bytes.data(), n, type}; }
    buffer block(std::size_t offset, std::size_t count) {
        return {bytes.data() + offset * size_of(type), count, type};
    }
    double operator[](std::size_t i) const { return load(type, bytes.data(), i); }
    void set(std::size_t i, double v) { store(type, bytes.data(), i, v); }

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

/// The serial reduction over `ranks` ranks of input element `index`, in double.
inline double reference(dtype t, reduce_op op, std::uint64_t seed, int ranks, std::size_t index) {
    double acc = input_value(t, op, seed, 0, index);
    for (int r = 1; r < ranks; ++r) {
        const double v = input_value(t, op, seed, r, index);
        switch (op) {
        case reduce_op::sum:
        case reduce_op::avg:
            acc += v;
            break;
        case reduce_op::prod:
            acc *= v;
            break;
        case reduce_op::min:
            acc = std::min(acc, v);
            break;
        case reduce_op::max:
            acc = std::max(acc, v);
            break;
        }
    }
    return op == reduce_op::avg ? acc / ranks : acc;
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

/// Compares element `i` of `got` with `want`; on a difference, describes it.
inline bool same(dtype t, double got, double want, int ranks, std::string* why, std::size_t i) {
    const double tol = tolerance(t, ranks);
    if (std::fabs(got - want) <= tol) {
        return true;
    }
    if (why != nullptr && why->empty()) {
        *why = "element " + std::to_string(i) + ": got " + std::to_string(got) + ", want " +
               std::to_string(want) + " (tolerance " + std::to_string(tol) + ")";
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
