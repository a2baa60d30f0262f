#pragma once

/// \file
/// Host-side 16-bit floating-point storage types. Conversions from float round to
/// nearest-even and produce the same bit patterns as CUDA's `__float2half_rn` and
/// `__float2bfloat16_rn` (including the canonical NaN 0x7fff), so a value packed
/// on the host and one packed by a CUDA kernel compare equal bit for bit.

#include "unison/core/config.hpp"

#include <bit>
#include <cstdint>

namespace unison {

namespace detail {

/// std::bit_cast between float and its bits, callable from device code as well.
UNISON_HOST_DEVICE constexpr std::uint32_t float_bits(float f) noexcept {
#if defined(__CUDA_ARCH__)
    return __float_as_uint(f);
#else
    return std::bit_cast<std::uint32_t>(f);
#endif
}
UNISON_HOST_DEVICE constexpr float bits_float(std::uint32_t u) noexcept {
#if defined(__CUDA_ARCH__)
    return __uint_as_float(u);
#else
    return std::bit_cast<float>(u);
#endif
}

/// Round-to-nearest-even step shared by both conversions: `result` is the
/// truncated value and `remainder` the discarded bits left-aligned in 32 bits.
UNISON_HOST_DEVICE constexpr std::uint16_t round_nearest_even(std::uint32_t result,
                                                              std::uint32_t remainder) noexcept {
    if (remainder > 0x80000000u || (remainder == 0x80000000u && (result & 1u) != 0u)) {
        ++result;
    }
    return static_cast<std::uint16_t>(result);
}

UNISON_HOST_DEVICE constexpr std::uint16_t float_to_half_bits(float f) noexcept {
    const std::uint32_t x = float_bits(f);
    const std::uint32_t u = x & 0x7fffffffu;
    const std::uint32_t sign = (x >> 16) & 0x8000u;
    if (u >= 0x7f800000u) { // inf or NaN: NaN becomes the canonical 0x7fff
        return static_cast<std::uint16_t>(u == 0x7f800000u ? (sign | 0x7c00u) : 0x7fffu);
    }
    if (u > 0x477fefffu) { // rounds to infinity
        return round_nearest_even(sign | 0x7bffu, 0x80000000u);
    }
    if (u >= 0x38800000u) { // normal half
        return round_nearest_even(sign | ((u - 0x38000000u) >> 13), u << 19);
    }
    if (u < 0x33000001u) { // rounds to zero
        return round_nearest_even(sign, u);
    }
    // subnormal half
    const std::uint32_t shift = 0x7eu - (u >> 23);
    const std::uint32_t mantissa = (u & 0x7fffffu) | 0x800000u;
    return round_nearest_even((sign | (mantissa >> shift)) & 0xffffu, mantissa << (32u - shift));
}

UNISON_HOST_DEVICE constexpr float half_bits_to_float(std::uint16_t h) noexcept {
    std::uint32_t sign = (static_cast<std::uint32_t>(h) >> 15) & 1u;
    std::uint32_t exponent = (static_cast<std::uint32_t>(h) >> 10) & 0x1fu;
    std::uint32_t mantissa = (static_cast<std::uint32_t>(h) & 0x3ffu) << 13;
    if (exponent == 0x1fu) { // inf or NaN; NaN loses its sign and payload, as in CUDA
        sign = mantissa != 0u ? 0u : sign;
        mantissa = mantissa != 0u ? 0x7fffffu : 0u;
        exponent = 0xffu;
    } else if (exponent == 0u) {
        if (mantissa != 0u) { // normalize a subnormal
            exponent = 0x71u;
            std::uint32_t msb = 0;
            do {
                msb = mantissa & 0x400000u;
                mantissa <<= 1;
                --exponent;
            } while (msb == 0u);
            mantissa &= 0x7fffffu;
        }
    } else {
        exponent += 0x70u;
    }
    return bits_float((sign << 31) | (exponent << 23) | mantissa);
}

UNISON_HOST_DEVICE constexpr std::uint16_t float_to_bf16_bits(float f) noexcept {
    const std::uint32_t x = float_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) {
        return 0x7fffu;
    }
    return round_nearest_even(x >> 16, x << 16);
}

UNISON_HOST_DEVICE constexpr float bf16_bits_to_float(std::uint16_t b) noexcept {
    return bits_float(static_cast<std::uint32_t>(b) << 16);
}

} // namespace detail

/// IEEE 754 binary16 storage type; arithmetic is done by converting to float.
struct half {
    std::uint16_t bits = 0;

    constexpr half() noexcept = default;
    /// Rounds `f` to nearest-even, as `__float2half_rn` does.
    UNISON_HOST_DEVICE constexpr explicit half(float f) noexcept
        : bits(detail::float_to_half_bits(f)) {}
    UNISON_HOST_DEVICE constexpr explicit operator float() const noexcept {
        return detail::half_bits_to_float(bits);
    }
    /// The value whose bit pattern is `b`.
    UNISON_HOST_DEVICE static constexpr half from_bits(std::uint16_t b) noexcept {
        half h;
        h.bits = b;
        return h;
    }
    /// Bitwise equality (so NaN == NaN and +0 != -0); compare floats for numeric equality.
    friend constexpr bool operator==(half, half) noexcept = default;
};

/// bfloat16 storage type (8-bit exponent, 7-bit mantissa); arithmetic is done in float.
struct bf16 {
    std::uint16_t bits = 0;

    constexpr bf16() noexcept = default;
    /// Rounds `f` to nearest-even, as `__float2bfloat16_rn` does.
    UNISON_HOST_DEVICE constexpr explicit bf16(float f) noexcept
        : bits(detail::float_to_bf16_bits(f)) {}
    UNISON_HOST_DEVICE constexpr explicit operator float() const noexcept {
        return detail::bf16_bits_to_float(bits);
    }
    /// The value whose bit pattern is `b`.
    UNISON_HOST_DEVICE static constexpr bf16 from_bits(std::uint16_t b) noexcept {
        bf16 v;
        v.bits = b;
        return v;
    }
    /// Bitwise equality (so NaN == NaN and +0 != -0); compare floats for numeric equality.
    friend constexpr bool operator==(bf16, bf16) noexcept = default;
};

static_assert(sizeof(half) == 2 && sizeof(bf16) == 2);

} // namespace unison
