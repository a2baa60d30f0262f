#pragma once

#include "unison/core/half.hpp"

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <type_traits>

namespace unison {

/// Element type of a buffer moved by a collective. New dtypes are appended, so
/// that a dtype's numeric value never changes. Integer sums and products wrap
/// modulo 2^bits in the unsigned types, as NCCL's and MPI's do.
enum class dtype : std::uint8_t { f64, f32, f16, bf16, i64, i32, i8, u8, u32, u64 };

/// Every dtype, in declaration order (for tests and the benchmark's option parser).
inline constexpr dtype all_dtypes[] = {dtype::f64, dtype::f32, dtype::f16, dtype::bf16, dtype::i64,
                                       dtype::i32, dtype::i8,  dtype::u8,  dtype::u32,  dtype::u64};

/// Size in bytes of one element of `t`.
constexpr std::size_t size_of(dtype t) noexcept {
    switch (t) {
    case dtype::f64:
    case dtype::i64:
    case dtype::u64:
        return 8;
    case dtype::f32:
    case dtype::i32:
    case dtype::u32:
        return 4;
    case dtype::f16:
    case dtype::bf16:
        return 2;
    case dtype::i8:
    case dtype::u8:
        return 1;
    }
    return 0;
}

/// True for the floating-point dtypes.
constexpr bool is_floating(dtype t) noexcept {
    return t == dtype::f64 || t == dtype::f32 || t == dtype::f16 || t == dtype::bf16;
}

/// The name nccl-tests prints for `t` ("float", "bfloat16", "int32", ...).
constexpr std::string_view to_string(dtype t) noexcept {
    switch (t) {
    case dtype::f64:
        return "double";
    case dtype::f32:
        return "float";
    case dtype::f16:
        return "half";
    case dtype::bf16:
        return "bfloat16";
    case dtype::i64:
        return "int64";
    case dtype::i32:
        return "int32";
    case dtype::i8:
        return "int8";
    case dtype::u8:
        return "uint8";
    case dtype::u32:
        return "uint32";
    case dtype::u64:
        return "uint64";
    }
    return "?";
}

/// Parses a dtype from its nccl-tests name or its short name (f32, bf16, i64, u32, ...).
constexpr std::optional<dtype> parse_dtype(std::string_view s) noexcept {
    for (dtype t : all_dtypes) {
        if (s == to_string(t)) {
            return t;
        }
    }
    constexpr std::string_view short_names[] = {"f64", "f32", "f16", "bf16", "i64",
                                                "i32", "i8",  "u8",  "u32",  "u64"};
    static_assert(std::size(short_names) == std::size(all_dtypes));
    for (std::size_t i = 0; i < std::size(short_names); ++i) {
        if (s == short_names[i]) {
            return all_dtypes[i];
        }
    }
    return std::nullopt;
}

namespace detail {
template <class T>
inline constexpr bool dependent_false = false;

template <class T>
struct dtype_of_impl {};
// clang-format off
template <> struct dtype_of_impl<double> { static constexpr dtype value = dtype::f64; };
template <> struct dtype_of_impl<float> { static constexpr dtype value = dtype::f32; };
template <> struct dtype_of_impl<half> { static constexpr dtype value = dtype::f16; };
template <> struct dtype_of_impl<bf16> { static constexpr dtype value = dtype::bf16; };
template <> struct dtype_of_impl<std::int64_t> { static constexpr dtype value = dtype::i64; };
template <> struct dtype_of_impl<std::int32_t> { static constexpr dtype value = dtype::i32; };
template <> struct dtype_of_impl<std::int8_t> { static constexpr dtype value = dtype::i8; };
template <> struct dtype_of_impl<std::uint8_t> { static constexpr dtype value = dtype::u8; };
template <> struct dtype_of_impl<std::uint32_t> { static constexpr dtype value = dtype::u32; };
template <> struct dtype_of_impl<std::uint64_t> { static constexpr dtype value = dtype::u64; };
// clang-format on
} // namespace detail

/// True when `T` is an element type unison can move and reduce.
template <class T>
concept element = requires {
    detail::dtype_of_impl<std::remove_cv_t<T>>::value;
};

namespace detail {
template <class T>
constexpr dtype checked_dtype_of() noexcept {
    static_assert(element<T>,
                  "unison: no dtype for this element type; the supported element types are "
                  "double, float, unison::half, unison::bf16, int64_t, int32_t, int8_t, uint8_t, "
                  "uint32_t, uint64_t");
    if constexpr (element<T>) {
        return dtype_of_impl<std::remove_cv_t<T>>::value;
    } else {
        return dtype::u8;
    }
}
} // namespace detail

/// The dtype of element type `T` (a compile error names unsupported types).
template <class T>
inline constexpr dtype dtype_of = detail::checked_dtype_of<T>();

namespace detail {
template <dtype D>
struct element_of_impl {
    static_assert(D != D, "unison::element_t: no element type for this dtype");
};
// clang-format off
template <> struct element_of_impl<dtype::f64> { using type = double; };
template <> struct element_of_impl<dtype::f32> { using type = float; };
template <> struct element_of_impl<dtype::f16> { using type = half; };
template <> struct element_of_impl<dtype::bf16> { using type = bf16; };
template <> struct element_of_impl<dtype::i64> { using type = std::int64_t; };
template <> struct element_of_impl<dtype::i32> { using type = std::int32_t; };
template <> struct element_of_impl<dtype::i8> { using type = std::int8_t; };
template <> struct element_of_impl<dtype::u8> { using type = std::uint8_t; };
template <> struct element_of_impl<dtype::u32> { using type = std::uint32_t; };
template <> struct element_of_impl<dtype::u64> { using type = std::uint64_t; };
// clang-format on
} // namespace detail

/// The element type of dtype `D` (the inverse of dtype_of).
template <dtype D>
using element_t = typename detail::element_of_impl<D>::type;

} // namespace unison
