// unison::dtype: sizes, names, parsing, the element-type mapping and is_floating.

#include "unison/core/dtype.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <set>
#include <string>
#include <string_view>
#include <type_traits>

namespace {

using unison::dtype;

// The mapping is usable in constant expressions.
static_assert(unison::dtype_of<float> == dtype::f32);
static_assert(unison::size_of(dtype::bf16) == 2);
static_assert(unison::parse_dtype("bfloat16") == dtype::bf16);
static_assert(unison::is_floating(dtype::f16) && !unison::is_floating(dtype::u8));

// Appended dtypes keep every earlier dtype's numeric value (it is hashed into
// signatures and may be stored by users).
static_assert(static_cast<int>(dtype::f64) == 0 && static_cast<int>(dtype::f32) == 1 &&
              static_cast<int>(dtype::f16) == 2 && static_cast<int>(dtype::bf16) == 3 &&
              static_cast<int>(dtype::i64) == 4 && static_cast<int>(dtype::i32) == 5 &&
              static_cast<int>(dtype::i8) == 6 && static_cast<int>(dtype::u8) == 7 &&
              static_cast<int>(dtype::u32) == 8 && static_cast<int>(dtype::u64) == 9);
static_assert(std::is_same_v<unison::element_t<dtype::u32>, std::uint32_t> &&
              std::is_same_v<unison::element_t<dtype::u64>, std::uint64_t>);

// Which C++ types are elements.
static_assert(unison::element<double> && unison::element<float> && unison::element<unison::half> &&
              unison::element<unison::bf16> && unison::element<std::int64_t> &&
              unison::element<std::int32_t> && unison::element<std::int8_t> &&
              unison::element<std::uint8_t> && unison::element<std::uint32_t> &&
              unison::element<std::uint64_t>);
static_assert(unison::element<const float> && unison::element<volatile std::int32_t>);
static_assert(!unison::element<bool> && !unison::element<std::uint16_t> &&
              !unison::element<std::int16_t> && !unison::element<long double> &&
              !unison::element<float*> && !unison::element<std::string>);

/// Checks everything dtype_of and size_of say about element type `T`.
template <class T>
void check_element(dtype expected) {
    INFO("expected ", std::string(unison::to_string(expected)));
    CHECK(unison::dtype_of<T> == expected);
    CHECK(unison::dtype_of<const T> == expected);
    CHECK(unison::size_of(unison::dtype_of<T>) == sizeof(T));
}

} // namespace

TEST_CASE("dtype: dtype_of maps each element type to its dtype, and size_of to its size") {
    check_element<double>(dtype::f64);
    check_element<float>(dtype::f32);
    check_element<unison::half>(dtype::f16);
    check_element<unison::bf16>(dtype::bf16);
    check_element<std::int64_t>(dtype::i64);
    check_element<std::int32_t>(dtype::i32);
    check_element<std::int8_t>(dtype::i8);
    check_element<std::uint8_t>(dtype::u8);
    check_element<std::uint32_t>(dtype::u32);
    check_element<std::uint64_t>(dtype::u64);
}

TEST_CASE("dtype: size_of") {
    CHECK(unison::size_of(dtype::f64) == 8);
    CHECK(unison::size_of(dtype::f32) == 4);
    CHECK(unison::size_of(dtype::f16) == 2);
    CHECK(unison::size_of(dtype::bf16) == 2);
    CHECK(unison::size_of(dtype::i64) == 8);
    CHECK(unison::size_of(dtype::i32) == 4);
    CHECK(unison::size_of(dtype::i8) == 1);
    CHECK(unison::size_of(dtype::u8) == 1);
    CHECK(unison::size_of(dtype::u32) == 4);
    CHECK(unison::size_of(dtype::u64) == 8);
}

TEST_CASE("dtype: all_dtypes lists every dtype once") {
    const std::set<dtype> unique(std::begin(unison::all_dtypes), std::end(unison::all_dtypes));
    CHECK(std::size(unison::all_dtypes) == 10);
    CHECK(unique.size() == 10);
}

TEST_CASE("dtype: to_string gives the nccl-tests names") {
    CHECK(unison::to_string(dtype::f64) == "double");
    CHECK(unison::to_string(dtype::f32) == "float");
    CHECK(unison::to_string(dtype::f16) == "half");
    CHECK(unison::to_string(dtype::bf16) == "bfloat16");
    CHECK(unison::to_string(dtype::i64) == "int64");
    CHECK(unison::to_string(dtype::i32) == "int32");
    CHECK(unison::to_string(dtype::i8) == "int8");
    CHECK(unison::to_string(dtype::u8) == "uint8");
    CHECK(unison::to_string(dtype::u32) == "uint32");
    CHECK(unison::to_string(dtype::u64) == "uint64");
}

TEST_CASE("dtype: parse_dtype reads back every name and short name") {
    std::set<std::string_view> names;
    for (dtype t : unison::all_dtypes) {
        INFO(std::string(unison::to_string(t)));
        CHECK(unison::parse_dtype(unison::to_string(t)) == t);
        names.insert(unison::to_string(t));
    }
    CHECK(names.size() == 10); // names are distinct

    CHECK(unison::parse_dtype("f64") == dtype::f64);
    CHECK(unison::parse_dtype("f32") == dtype::f32);
    CHECK(unison::parse_dtype("f16") == dtype::f16);
    CHECK(unison::parse_dtype("bf16") == dtype::bf16);
    CHECK(unison::parse_dtype("i64") == dtype::i64);
    CHECK(unison::parse_dtype("i32") == dtype::i32);
    CHECK(unison::parse_dtype("i8") == dtype::i8);
    CHECK(unison::parse_dtype("u8") == dtype::u8);
    CHECK(unison::parse_dtype("u32") == dtype::u32);
    CHECK(unison::parse_dtype("u64") == dtype::u64);
}

TEST_CASE("dtype: parse_dtype rejects unknown names") {
    for (std::string_view s : {"", "fp32", "float32", "int", "uint16", "u16", "uint", "uint128",
                               "f", "bfloat", "double "}) {
        INFO("'", std::string(s), "'");
        CHECK_FALSE(unison::parse_dtype(s).has_value());
    }
}

TEST_CASE("dtype: is_floating") {
    CHECK(unison::is_floating(dtype::f64));
    CHECK(unison::is_floating(dtype::f32));
    CHECK(unison::is_floating(dtype::f16));
    CHECK(unison::is_floating(dtype::bf16));
    CHECK_FALSE(unison::is_floating(dtype::i64));
    CHECK_FALSE(unison::is_floating(dtype::i32));
    CHECK_FALSE(unison::is_floating(dtype::i8));
    CHECK_FALSE(unison::is_floating(dtype::u8));
    CHECK_FALSE(unison::is_floating(dtype::u32));
    CHECK_FALSE(unison::is_floating(dtype::u64));
}
