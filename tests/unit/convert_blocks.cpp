// convert_scale (core/detail/convert.hpp), which packs and unpacks DDP buckets and
// casts the sharding engine's flat buffers, runs the 16-bit pairs in blocks through
// half_block.hpp's vector conversions. Here every pair with a 16-bit side, with and
// without accumulation, at several scales, lengths around the block and vector
// sizes and in place, is compared bit for bit with scale_cast_element applied
// element by element (the element math the CUDA kernels share), on random data
// with NaN, infinities, signed zeros and subnormals planted. (A float result that
// is NaN may carry either operand's payload; see `same`.)

#include "unison/core/detail/convert.hpp"

#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

namespace {

template <class T>
std::uint32_t bits(T v) {
    if constexpr (std::is_same_v<T, float>) {
        return std::bit_cast<std::uint32_t>(v);
    } else {
        return v.bits;
    }
}

/// Equal bits, except that two float NaNs are equal whatever their payloads: which
/// operand's payload a float addition of two NaNs keeps is the compiler's choice
/// (it may swap the operands), so it differs between builds. A 16-bit destination
/// has one NaN (0x7fff), so there the bits must agree exactly.
template <class T>
bool same(T a, T b) {
    if constexpr (std::is_same_v<T, float>) {
        if (std::isnan(a) && std::isnan(b)) {
            return true;
        }
    }
    return bits(a) == bits(b);
}

template <class T>
std::vector<T> random_values(std::size_t count, std::mt19937_64& gen) {
    std::uniform_real_distribution<float> value(-4.0f, 4.0f);
    std::uniform_int_distribution<int> special(0, 63);
    std::vector<T> v(count);
    for (T& x : v) {
        const int k = special(gen);
        const float f = k == 0   ? std::numeric_limits<float>::quiet_NaN()
                        : k == 1 ? std::numeric_limits<float>::infinity()
                        : k == 2 ? -std::numeric_limits<float>::infinity()
                        : k == 3 ? -0.0f
                        : k == 4 ? 1e-7f    // a half subnormal
                        : k == 5 ? 70000.0f // beyond half's range
                                 : value(gen);
        x = T(f);
    }
    return v;
}

template <class D, class S>
void check_pair(const char* name, std::size_t& cases, std::size_t& wrong, std::string& first) {
    std::mt19937_64 gen(7);
    const std::size_t lengths[] = {1, 7, 8, 9, 15, 16, 17, 1023, 1024, 1025, 3000};
    for (const std::size_t n : lengths) {
        for (const double scale : {1.0, 0.5, 1.0 / 3.0, 3.0}) {
            for (const bool accumulate : {false, true}) {
                for (const bool in_place : {false, true}) {
                    if (in_place && !std::is_same_v<D, S>) {
                        continue;
                    }
                    const std::vector<S> src = random_values<S>(n, gen);
                    std::vector<D> dst = random_values<D>(n, gen);
                    std::vector<D> want = dst;
                    const float s = static_cast<float>(scale);
                    for (std::size_t i = 0; i < n; ++i) {
                        S x = src[i];
                        if constexpr (std::is_same_v<D, S>) {
                            if (in_place) {
                                x = want[i];
                            }
                        }
                        unison::detail::scale_cast_element<D, S, float>(want[i], x, s, accumulate);
                    }
                    const void* from = src.data();
                    if constexpr (std::is_same_v<D, S>) {
                        if (in_place) {
                            from = dst.data();
                        }
                    }
                    unison::detail::convert_scale(dst.data(), unison::dtype_of<D>, from,
                                                  unison::dtype_of<S>, n, scale, accumulate);
                    ++cases;
                    for (std::size_t i = 0; i < n; ++i) {
                        if (!same(dst[i], want[i]) && wrong++ == 0) {
                            char text[200];
                            std::snprintf(text, sizeof text,
                                          "%s, %zu elements, scale %g, accumulate %d, in place "
                                          "%d: element %zu is 0x%x, want 0x%x",
                                          name, n, scale, accumulate, in_place, i,
                                          static_cast<unsigned>(bits(dst[i])),
                                          static_cast<unsigned>(bits(want[i])));
                            first = text;
                        }
                    }
                }
            }
        }
    }
}

} // namespace

TEST_CASE("convert_scale: 16-bit pairs equal scale_cast_element bit for bit") {
    using unison::bf16;
    using unison::half;
    std::size_t cases = 0, wrong = 0;
    std::string first;
    check_pair<half, float>("float -> half", cases, wrong, first);
    check_pair<bf16, float>("float -> bf16", cases, wrong, first);
    check_pair<float, half>("half -> float", cases, wrong, first);
    check_pair<float, bf16>("bf16 -> float", cases, wrong, first);
    check_pair<half, half>("half -> half", cases, wrong, first);
    check_pair<bf16, bf16>("bf16 -> bf16", cases, wrong, first);
    check_pair<half, bf16>("bf16 -> half", cases, wrong, first);
    check_pair<bf16, half>("half -> bf16", cases, wrong, first);
    INFO(cases, " conversions; first wrong element: ", first);
    CHECK(wrong == 0);
}
