// unison::half and unison::bf16: conversions against hand-derived IEEE 754 bit
// patterns, an independent nearest-even reference, exhaustive round trips and,
// where the CUDA headers are available, CUDA's own host conversion functions.

#include "unison/core/half.hpp"
#include "unison/core/detail/half_block.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#if UNISON_TEST_CUDA_HALF
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

namespace {

std::uint32_t bits_of(float f) {
    return std::bit_cast<std::uint32_t>(f);
}
float float_of(std::uint32_t u) {
    return std::bit_cast<float>(u);
}

std::string hex(std::uint32_t v, int digits) {
    char s[16];
    std::snprintf(s, sizeof s, "0x%0*x", digits, static_cast<unsigned>(v));
    return s;
}

/// Counts disagreements in a long loop and keeps the first one for the report, so
/// that millions of comparisons cost one doctest assertion.
struct mismatch_log {
    std::size_t count = 0;
    std::string first;

    void add(const std::string& what) {
        if (count++ == 0) {
            first = what;
        }
    }
};

// ------------------------------------------------------- independent reference

constexpr std::uint32_t canonical_float_nan = 0x7fffffffu;
constexpr std::uint16_t canonical_nan16 = 0x7fffu;

bool is_half_nan(std::uint16_t h) {
    return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0u;
}
bool is_bf16_nan(std::uint16_t b) {
    return (b & 0x7f80u) == 0x7f80u && (b & 0x7fu) != 0u;
}

/// The value of binary16 pattern `h` straight from the definition (sign, 5-bit
/// exponent with bias 15, 10-bit fraction), computed in double.
double half_value(std::uint16_t h) {
    const int sign = h >> 15;
    const int exponent = (h >> 10) & 0x1f;
    const int fraction = h & 0x3ff;
    double v = 0;
    if (exponent == 0x1f) {
        v = fraction == 0 ? std::numeric_limits<double>::infinity()
                          : std::numeric_limits<double>::quiet_NaN();
    } else if (exponent == 0) {
        v = std::ldexp(static_cast<double>(fraction), -24);
    } else {
        v = std::ldexp(static_cast<double>(1024 + fraction), exponent - 25);
    }
    return sign != 0 ? -v : v;
}

/// Positive finite binary16 values by pattern: entry i is the value of pattern i
/// for i < 0x7c00, and entry 0x7c00 is 65536, where the exponent range would
/// continue: a value at or past the midpoint 65520 rounds to infinity.
const std::vector<double>& half_magnitudes() {
    static const std::vector<double> table = [] {
        std::vector<double> t(0x7c01);
        for (std::uint32_t i = 0; i < 0x7c00u; ++i) {
            t[i] = half_value(static_cast<std::uint16_t>(i));
        }
        t[0x7c00] = 65536.0;
        return t;
    }();
    return table;
}

/// Picks `lo_bits` or `lo_bits + 1` for a magnitude `a` in [lo, hi]: the nearer
/// one, and on a tie the one with an even pattern.
std::uint32_t nearest_even(double a, double lo, double hi, std::uint32_t lo_bits) {
    const double below = a - lo;
    const double above = hi - a;
    if (below < above) {
        return lo_bits;
    }
    if (above < below) {
        return lo_bits + 1;
    }
    return (lo_bits & 1u) == 0u ? lo_bits : lo_bits + 1;
}

/// float -> binary16 by searching the table of all binary16 values.
std::uint16_t reference_half_bits(float f) {
    if (std::isnan(f)) {
        return canonical_nan16;
    }
    const std::uint32_t sign = std::signbit(f) ? 0x8000u : 0u;
    const double a = std::fabs(static_cast<double>(f));
    const auto& table = half_magnitudes();
    if (a >= table.back()) {
        return static_cast<std::uint16_t>(sign | 0x7c00u);
    }
    // Last entry <= a; a < 65536, so there is always an entry after it.
    const auto it = std::upper_bound(table.begin(), table.end(), a) - 1;
    const auto lo = static_cast<std::uint32_t>(it - table.begin());
    const std::uint32_t magnitude = a == *it ? lo : nearest_even(a, *it, *(it + 1), lo);
    return static_cast<std::uint16_t>(sign | magnitude);
}

/// float -> bfloat16: the two bfloat16 values around `f` are its upper 16 bits and
/// the next pattern; choose between them by comparing distances in double.
std::uint16_t reference_bf16_bits(float f) {
    if (std::isnan(f)) {
        return canonical_nan16;
    }
    const std::uint32_t sign = std::signbit(f) ? 0x8000u : 0u;
    const std::uint32_t truncated = (bits_of(f) & 0x7fffffffu) >> 16;
    if (truncated >= 0x7f80u) { // infinity
        return static_cast<std::uint16_t>(sign | truncated);
    }
    const double a = std::fabs(static_cast<double>(f));
    const double lo = static_cast<double>(float_of(truncated << 16));
    // Past the largest finite bfloat16 the next value would be 2^128 (infinity).
    const double hi = truncated + 1 == 0x7f80u
                          ? std::ldexp(1.0, 128)
                          : static_cast<double>(float_of((truncated + 1) << 16));
    const std::uint32_t magnitude = a == lo ? truncated : nearest_even(a, lo, hi, truncated);
    return static_cast<std::uint16_t>(sign | magnitude);
}

/// Floats at and around every rounding boundary of binary16: each value, each
/// midpoint between neighbours and the floats next to each midpoint, both signs,
/// plus the special values.
std::vector<float> half_boundary_floats() {
    std::vector<float> out;
    const auto& table = half_magnitudes();
    for (std::size_t i = 0; i + 1 < table.size(); ++i) {
        const auto value = static_cast<float>(table[i]);
        const auto mid = static_cast<float>((table[i] + table[i + 1]) / 2); // exact in float
        for (float f : {value, mid, std::nextafter(mid, 0.0f),
                        std::nextafter(mid, std::numeric_limits<float>::infinity())}) {
            out.push_back(f);
            out.push_back(-f);
        }
    }
    for (std::uint32_t u : {0x00000000u, 0x80000000u, 0x00000001u, 0x00800000u, 0x7f7fffffu,
                            0x7f800000u, 0xff800000u, 0x7f800001u, 0xff800001u, 0x7fc00000u,
                            0xffc00000u, 0x7fffffffu, 0xffffffffu, 0x47800000u, 0x4f000000u}) {
        out.push_back(float_of(u));
    }
    return out;
}

/// Floats at and around every rounding boundary of bfloat16: every upper half
/// combined with lower halves at and next to zero, the midpoint and all ones.
/// This includes every infinity, NaN, zero and subnormal class.
std::vector<float> bf16_boundary_floats() {
    std::vector<float> out;
    for (std::uint32_t upper = 0; upper <= 0xffffu; ++upper) {
        for (std::uint32_t lower : {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu}) {
            out.push_back(float_of(upper << 16 | lower));
        }
    }
    return out;
}

/// Random float bit patterns (mostly far outside binary16's range) and random
/// floats whose exponent lies in or near binary16's range.
std::vector<float> random_floats(std::size_t patterns, std::size_t in_range) {
    std::mt19937_64 rng(20240611);
    std::vector<float> out;
    out.reserve(patterns + in_range);
    for (std::size_t i = 0; i < patterns; i += 2) {
        const std::uint64_t r = rng();
        out.push_back(float_of(static_cast<std::uint32_t>(r)));
        out.push_back(float_of(static_cast<std::uint32_t>(r >> 32)));
    }
    std::uniform_int_distribution<int> exponent(-27, 17);
    std::uniform_real_distribution<float> significand(1.0f, 2.0f);
    for (std::size_t i = 0; i < in_range; ++i) {
        const float v = std::ldexp(significand(rng), exponent(rng));
        out.push_back((rng() & 1u) != 0u ? -v : v);
    }
    return out;
}

// Conversions are constexpr and usable in constant expressions.
static_assert(unison::half(1.0f).bits == 0x3c00u);
static_assert(unison::bf16(1.0f).bits == 0x3f80u);
static_assert(static_cast<float>(unison::half::from_bits(0x3c00u)) == 1.0f);
static_assert(static_cast<float>(unison::bf16::from_bits(0xc000u)) == -2.0f);
static_assert(sizeof(unison::half) == 2 && sizeof(unison::bf16) == 2);

} // namespace

// ----------------------------------------------------------------- binary16

TEST_CASE("half: float to half gives the IEEE 754 binary16 bit patterns") {
    struct example {
        std::uint32_t in; // float bits
        std::uint16_t out;
        const char* what;
    };
    const example examples[] = {
        {0x00000000u, 0x0000u, "+0"},
        {0x80000000u, 0x8000u, "-0 keeps its sign"},
        {0x3f800000u, 0x3c00u, "1"},
        {0xbf800000u, 0xbc00u, "-1"},
        {0xc0200000u, 0xc100u, "-2.5"},
        {0x3dcccccdu, 0x2e66u, "0.1f"},
        {0x40490fdbu, 0x4248u, "pi"},
        {0x477fe000u, 0x7bffu, "65504, the largest half"},
        {0x477fefffu, 0x7bffu, "the float below 65520 rounds down"},
        {0x477ff000u, 0x7c00u, "65520 is a tie and rounds to even: infinity"},
        {0xc77ff000u, 0xfc00u, "-65520 rounds to -infinity"},
        {0x47800000u, 0x7c00u, "65536 overflows"},
        {0x7f7fffffu, 0x7c00u, "FLT_MAX overflows"},
        {0x7f800000u, 0x7c00u, "+infinity"},
        {0xff800000u, 0xfc00u, "-infinity"},
        {0x38800000u, 0x0400u, "2^-14, the smallest normal half"},
        {0x387fc000u, 0x03ffu, "1023 * 2^-24, the largest subnormal"},
        {0x387fe000u, 0x0400u, "2^-14 - 2^-25 is a tie: to the even normal"},
        {0x33800000u, 0x0001u, "2^-24, the smallest subnormal"},
        {0xb3800000u, 0x8001u, "-2^-24"},
        {0x33000000u, 0x0000u, "2^-25 is a tie between 0 and 2^-24: to even 0"},
        {0xb3000000u, 0x8000u, "-2^-25 rounds to -0"},
        {0x33000001u, 0x0001u, "just above 2^-25 rounds up"},
        {0x33400000u, 0x0001u, "3 * 2^-26 rounds up"},
        {0x33c00000u, 0x0002u, "3 * 2^-25 is a tie between 1 and 2 times 2^-24: to even 2"},
        {0x34200000u, 0x0002u, "5 * 2^-25 is a tie between 2 and 3 times 2^-24: to even 2"},
        {0x00000001u, 0x0000u, "the smallest float subnormal underflows"},
        {0x3f801000u, 0x3c00u, "1 + 2^-11 is a tie: to even 1"},
        {0x3f803000u, 0x3c02u, "1 + 3 * 2^-11 is a tie: to even 1 + 2^-9"},
        {0x3f801001u, 0x3c01u, "just above 1 + 2^-11 rounds up"},
        {0x3f800fffu, 0x3c00u, "just below 1 + 2^-11 rounds down"},
        {0x7fc00000u, 0x7fffu, "quiet NaN becomes the canonical 0x7fff"},
        {0xffc00000u, 0x7fffu, "negative NaN loses its sign"},
        {0x7f800001u, 0x7fffu, "signalling NaN"},
        {0x7fffffffu, 0x7fffu, "NaN with every payload bit"},
    };
    for (const example& e : examples) {
        INFO(std::string(e.what), ": ", hex(e.in, 8));
        CHECK(hex(unison::half(float_of(e.in)).bits, 4) == hex(e.out, 4));
    }
}

TEST_CASE("half: half to float gives the exact values") {
    struct example {
        std::uint16_t in;
        std::uint32_t out; // float bits
        const char* what;
    };
    const example examples[] = {
        {0x0000u, 0x00000000u, "+0"},
        {0x8000u, 0x80000000u, "-0"},
        {0x3c00u, 0x3f800000u, "1"},
        {0xc100u, 0xc0200000u, "-2.5"},
        {0x7bffu, 0x477fe000u, "65504"},
        {0x0400u, 0x38800000u, "2^-14"},
        {0x03ffu, 0x387fc000u, "1023 * 2^-24"},
        {0x0001u, 0x33800000u, "2^-24"},
        {0x8001u, 0xb3800000u, "-2^-24"},
        {0x0200u, 0x38000000u, "2^-15"},
        {0x7c00u, 0x7f800000u, "+infinity"},
        {0xfc00u, 0xff800000u, "-infinity"},
        {0x7e00u, canonical_float_nan, "quiet NaN becomes 0x7fffffff, as in CUDA"},
        {0x7c01u, canonical_float_nan, "signalling NaN"},
        {0xfe01u, canonical_float_nan, "negative NaN loses its sign"},
    };
    for (const example& e : examples) {
        INFO(std::string(e.what), ": ", hex(e.in, 4));
        CHECK(hex(bits_of(static_cast<float>(unison::half::from_bits(e.in))), 8) == hex(e.out, 8));
    }
}

TEST_CASE("half: every bit pattern converts exactly to float and back") {
    mismatch_log to_float, round_trip;
    for (std::uint32_t i = 0; i <= 0xffffu; ++i) {
        const auto h = static_cast<std::uint16_t>(i);
        const float f = static_cast<float>(unison::half::from_bits(h));
        const bool nan = is_half_nan(h);
        const std::uint32_t want =
            nan ? canonical_float_nan : bits_of(static_cast<float>(half_value(h)));
        if (bits_of(f) != want) {
            to_float.add(hex(h, 4) + " -> " + hex(bits_of(f), 8) + ", want " + hex(want, 8));
        }
        const std::uint16_t back = unison::half(f).bits;
        if (back != (nan ? canonical_nan16 : h)) {
            round_trip.add(hex(h, 4) + " -> float -> " + hex(back, 4));
        }
    }
    INFO("first: ", to_float.first);
    CHECK(to_float.count == 0);
    INFO("first: ", round_trip.first);
    CHECK(round_trip.count == 0);
}

TEST_CASE("half: float to half agrees with a nearest-even reference") {
    std::vector<float> inputs = half_boundary_floats();
    const std::vector<float> random = random_floats(std::size_t{1} << 20, std::size_t{1} << 20);
    inputs.insert(inputs.end(), random.begin(), random.end());
    mismatch_log log;
    for (float f : inputs) {
        const std::uint16_t got = unison::half(f).bits;
        const std::uint16_t want = reference_half_bits(f);
        if (got != want) {
            log.add(hex(bits_of(f), 8) + " -> " + hex(got, 4) + ", want " + hex(want, 4));
        }
    }
    INFO(inputs.size(), " inputs; first mismatch: ", log.first);
    CHECK(log.count == 0);
}

// ----------------------------------------------------------------- bfloat16

TEST_CASE("bf16: float to bf16 rounds to nearest even") {
    struct example {
        std::uint32_t in; // float bits
        std::uint16_t out;
        const char* what;
    };
    const example examples[] = {
        {0x00000000u, 0x0000u, "+0"},
        {0x80000000u, 0x8000u, "-0 keeps its sign"},
        {0x3f800000u, 0x3f80u, "1"},
        {0xc0200000u, 0xc020u, "-2.5"},
        {0x3dcccccdu, 0x3dcdu, "0.1f rounds up"},
        {0x40490fdbu, 0x4049u, "pi rounds down"},
        {0x3f808000u, 0x3f80u, "tie with an even upper half stays"},
        {0x3f818000u, 0x3f82u, "tie with an odd upper half rounds up"},
        {0x3f808001u, 0x3f81u, "just above a tie rounds up"},
        {0x3f807fffu, 0x3f80u, "just below a tie rounds down"},
        {0xbf818000u, 0xbf82u, "negative tie rounds away from the odd pattern"},
        {0x3fffffffu, 0x4000u, "rounding carries into the exponent"},
        {0x7f7f7fffu, 0x7f7fu, "below the midpoint past the largest bf16"},
        {0x7f7f8000u, 0x7f80u, "a tie past the largest bf16 rounds to infinity"},
        {0x7f7fffffu, 0x7f80u, "FLT_MAX rounds to infinity"},
        {0xff7fffffu, 0xff80u, "-FLT_MAX rounds to -infinity"},
        {0x7f800000u, 0x7f80u, "+infinity"},
        {0xff800000u, 0xff80u, "-infinity"},
        {0x00010000u, 0x0001u, "a subnormal bf16"},
        {0x00008000u, 0x0000u, "a subnormal tie rounds to even 0"},
        {0x00018000u, 0x0002u, "a subnormal tie rounds to even 2"},
        {0x007fffffu, 0x0080u, "the largest float subnormal rounds to the smallest normal"},
        {0x7fc00000u, 0x7fffu, "quiet NaN becomes the canonical 0x7fff"},
        {0xffc00000u, 0x7fffu, "negative NaN loses its sign"},
        {0x7f800001u, 0x7fffu, "a signalling NaN does not truncate to infinity"},
        {0x7f80ffffu, 0x7fffu, "a NaN does not round up into another class"},
        {0xffffffffu, 0x7fffu, "NaN with every bit set"},
    };
    for (const example& e : examples) {
        INFO(std::string(e.what), ": ", hex(e.in, 8));
        CHECK(hex(unison::bf16(float_of(e.in)).bits, 4) == hex(e.out, 4));
    }
}

TEST_CASE("bf16: every bit pattern converts exactly to float and back") {
    mismatch_log to_float, round_trip;
    for (std::uint32_t i = 0; i <= 0xffffu; ++i) {
        const auto b = static_cast<std::uint16_t>(i);
        const float f = static_cast<float>(unison::bf16::from_bits(b));
        // bf16 is the upper half of a float, NaN payloads included.
        if (bits_of(f) != i << 16) {
            to_float.add(hex(b, 4) + " -> " + hex(bits_of(f), 8));
        }
        const std::uint16_t back = unison::bf16(f).bits;
        if (back != (is_bf16_nan(b) ? canonical_nan16 : b)) {
            round_trip.add(hex(b, 4) + " -> float -> " + hex(back, 4));
        }
    }
    INFO("first: ", to_float.first);
    CHECK(to_float.count == 0);
    INFO("first: ", round_trip.first);
    CHECK(round_trip.count == 0);
}

TEST_CASE("bf16: float to bf16 agrees with a nearest-even reference") {
    std::vector<float> inputs = bf16_boundary_floats();
    const std::vector<float> random = random_floats(std::size_t{1} << 20, std::size_t{1} << 18);
    inputs.insert(inputs.end(), random.begin(), random.end());
    mismatch_log log;
    for (float f : inputs) {
        const std::uint16_t got = unison::bf16(f).bits;
        const std::uint16_t want = reference_bf16_bits(f);
        if (got != want) {
            log.add(hex(bits_of(f), 8) + " -> " + hex(got, 4) + ", want " + hex(want, 4));
        }
    }
    INFO(inputs.size(), " inputs; first mismatch: ", log.first);
    CHECK(log.count == 0);
}

TEST_CASE("half and bf16: equality compares bit patterns") {
    CHECK(unison::half(1.0f) == unison::half::from_bits(0x3c00u));
    CHECK(unison::half(0.0f) != unison::half(-0.0f));
    CHECK(unison::half::from_bits(0x7e00u) ==
          unison::half::from_bits(0x7e00u)); // NaN equals itself
    CHECK(unison::half::from_bits(0x7e00u) != unison::half::from_bits(0x7e01u));
    CHECK(unison::bf16(1.0f) == unison::bf16::from_bits(0x3f80u));
    CHECK(unison::bf16(0.0f) != unison::bf16(-0.0f));
    CHECK(unison::bf16(std::numeric_limits<float>::quiet_NaN()) ==
          unison::bf16::from_bits(0x7fffu));
    CHECK(unison::half() == unison::half::from_bits(0u));
    CHECK(unison::bf16() == unison::bf16::from_bits(0u));
}

// ------------------------------------------------------- block conversions

namespace {

/// Every float whose low `low_bits` bits are one of the rounding cases (zero, one,
/// just below, at and just above the halfway point, all ones): each boundary of
/// every representable 16-bit value, over all signs and exponents.
std::vector<float> rounding_sweep(int low_bits) {
    const std::uint32_t half_way = 1u << (low_bits - 1), all = (1u << low_bits) - 1;
    const std::uint32_t lows[] = {0, 1, half_way - 1, half_way, half_way + 1, all};
    std::vector<float> v;
    v.reserve((std::size_t{1} << (32 - low_bits)) * std::size(lows));
    for (std::uint64_t high = 0; high < (std::uint64_t{1} << (32 - low_bits)); ++high) {
        for (const std::uint32_t low : lows) {
            v.push_back(float_of(static_cast<std::uint32_t>(high << low_bits) | low));
        }
    }
    return v;
}

/// Converts `in` with widen_block / narrow_block in pieces of 1 to 37 elements from
/// every offset (the vector loop and its scalar tail) and compares each result
/// with the element conversion.
template <class T>
void check_blocks(const std::vector<float>& floats, mismatch_log& widen, mismatch_log& narrow) {
    std::vector<T> all(0x10000);
    for (std::uint32_t i = 0; i <= 0xffffu; ++i) {
        all[i] = T::from_bits(static_cast<std::uint16_t>(i));
    }
    std::vector<float> wide(all.size());
    std::vector<T> small(floats.size());
    for (std::size_t at = 0, piece = 1; at < all.size(); at += piece, piece = piece % 37 + 1) {
        unison::detail::widen_block(all.data() + at, wide.data() + at,
                                    std::min(piece, all.size() - at));
    }
    for (std::size_t i = 0; i < all.size(); ++i) {
        const std::uint32_t want = bits_of(static_cast<float>(all[i]));
        if (bits_of(wide[i]) != want) {
            widen.add(hex(all[i].bits, 4) + " -> " + hex(bits_of(wide[i]), 8) + ", element " +
                      hex(want, 8));
        }
    }
    for (std::size_t at = 0, piece = 1; at < floats.size(); at += piece, piece = piece % 37 + 1) {
        unison::detail::narrow_block(floats.data() + at, small.data() + at,
                                     std::min(piece, floats.size() - at));
    }
    for (std::size_t i = 0; i < floats.size(); ++i) {
        const std::uint16_t want = T(floats[i]).bits;
        if (small[i].bits != want) {
            narrow.add(hex(bits_of(floats[i]), 8) + " -> " + hex(small[i].bits, 4) + ", element " +
                       hex(want, 4));
        }
    }
}

std::string block_path() {
#if UNISON_HOST_X86_DISPATCH
    return unison::detail::host_has_f16c() ? "AVX2 + F16C" : "element loop (no AVX2/F16C)";
#else
    return "element loop (vector paths not compiled)";
#endif
}

} // namespace

TEST_CASE("half: block conversions equal the element conversions bit for bit") {
    std::vector<float> floats = rounding_sweep(13); // half keeps 10 of 23 fraction bits
    const std::vector<float> extra = half_boundary_floats();
    const std::vector<float> random = random_floats(std::size_t{1} << 20, std::size_t{1} << 20);
    floats.insert(floats.end(), extra.begin(), extra.end());
    floats.insert(floats.end(), random.begin(), random.end());
    mismatch_log widen, narrow;
    check_blocks<unison::half>(floats, widen, narrow);
    MESSAGE("block conversions through: ", block_path());
    INFO("65536 patterns to float; first mismatch: ", widen.first);
    CHECK(widen.count == 0);
    INFO(floats.size(), " floats to half; first mismatch: ", narrow.first);
    CHECK(narrow.count == 0);
}

TEST_CASE("bf16: block conversions equal the element conversions bit for bit") {
    std::vector<float> floats = rounding_sweep(16);
    const std::vector<float> extra = bf16_boundary_floats();
    const std::vector<float> random = random_floats(std::size_t{1} << 20, std::size_t{1} << 20);
    floats.insert(floats.end(), extra.begin(), extra.end());
    floats.insert(floats.end(), random.begin(), random.end());
    mismatch_log widen, narrow;
    check_blocks<unison::bf16>(floats, widen, narrow);
    INFO("65536 patterns to float; first mismatch: ", widen.first);
    CHECK(widen.count == 0);
    INFO(floats.size(), " floats to bf16; first mismatch: ", narrow.first);
    CHECK(narrow.count == 0);
}

// --------------------------------------------------------- CUDA bit equality

#if UNISON_TEST_CUDA_HALF

namespace {

std::uint16_t cuda_half_bits(float f) {
    return static_cast<__half_raw>(__float2half_rn(f)).x;
}
float cuda_half_to_float(std::uint16_t h) {
    __half_raw raw;
    raw.x = h;
    return __half2float(__half(raw));
}
std::uint16_t cuda_bf16_bits(float f) {
    return static_cast<__nv_bfloat16_raw>(__float2bfloat16_rn(f)).x;
}
float cuda_bf16_to_float(std::uint16_t b) {
    __nv_bfloat16_raw raw;
    raw.x = b;
    return __bfloat162float(__nv_bfloat16(raw));
}

/// All boundary cases of both formats and 16 Mi random float bit patterns.
const std::vector<float>& cuda_inputs() {
    static const std::vector<float> inputs = [] {
        std::vector<float> v = half_boundary_floats();
        const std::vector<float> b = bf16_boundary_floats();
        const std::vector<float> r = random_floats(std::size_t{1} << 24, std::size_t{1} << 20);
        v.insert(v.end(), b.begin(), b.end());
        v.insert(v.end(), r.begin(), r.end());
        return v;
    }();
    return inputs;
}

} // namespace

TEST_CASE("half: conversions match CUDA's __half2float and __float2half_rn bit for bit") {
    mismatch_log to_float, from_float;
    for (std::uint32_t i = 0; i <= 0xffffu; ++i) {
        const auto h = static_cast<std::uint16_t>(i);
        const std::uint32_t got = bits_of(static_cast<float>(unison::half::from_bits(h)));
        const std::uint32_t want = bits_of(cuda_half_to_float(h));
        if (got != want) {
            to_float.add(hex(h, 4) + " -> " + hex(got, 8) + ", CUDA " + hex(want, 8));
        }
    }
    const std::vector<float>& inputs = cuda_inputs();
    for (float f : inputs) {
        const std::uint16_t got = unison::half(f).bits;
        const std::uint16_t want = cuda_half_bits(f);
        if (got != want) {
            from_float.add(hex(bits_of(f), 8) + " -> " + hex(got, 4) + ", CUDA " + hex(want, 4));
        }
    }
    INFO("65536 patterns to float; first mismatch: ", to_float.first);
    CHECK(to_float.count == 0);
    INFO(inputs.size(), " floats to half; first mismatch: ", from_float.first);
    CHECK(from_float.count == 0);
}

TEST_CASE("bf16: conversions match CUDA's __bfloat162float and __float2bfloat16_rn bit for bit") {
    mismatch_log to_float, from_float;
    for (std::uint32_t i = 0; i <= 0xffffu; ++i) {
        const auto b = static_cast<std::uint16_t>(i);
        const std::uint32_t got = bits_of(static_cast<float>(unison::bf16::from_bits(b)));
        const std::uint32_t want = bits_of(cuda_bf16_to_float(b));
        if (got != want) {
            to_float.add(hex(b, 4) + " -> " + hex(got, 8) + ", CUDA " + hex(want, 8));
        }
    }
    const std::vector<float>& inputs = cuda_inputs();
    for (float f : inputs) {
        const std::uint16_t got = unison::bf16(f).bits;
        const std::uint16_t want = cuda_bf16_bits(f);
        if (got != want) {
            from_float.add(hex(bits_of(f), 8) + " -> " + hex(got, 4) + ", CUDA " + hex(want, 4));
        }
    }
    INFO("65536 patterns to float; first mismatch: ", to_float.first);
    CHECK(to_float.count == 0);
    INFO(inputs.size(), " floats to bf16; first mismatch: ", from_float.first);
    CHECK(from_float.count == 0);
}

#else

TEST_CASE("half and bf16: CUDA comparison") {
    MESSAGE("CUDA headers not found: bit equality with __float2half_rn and "
            "__float2bfloat16_rn not tested");
}

#endif
