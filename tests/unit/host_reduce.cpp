// The host reduction (core/detail/host_reduce.hpp) against an element-by-element
// reference written here. The 16-bit types (half_block.hpp's AVX2/F16C loops where
// the CPU has them): widen every input with the element conversion, combine in float
// in rank order, divide, round once. float and double (AVX-512, AVX2 or SSE2 loops
// on x86-64, the widest the CPU has; each tested here): combine in the type itself,
// in rank order too, whichever input is the output (what
// comm_options::deterministic relies on). Bit for bit (any NaN for any NaN in float
// and double, whose payloads MPI and CUDA do not pin either), on random data with
// NaN, infinities, signed zeros and subnormals planted, for every operation, 1-5
// inputs, 1-3 outputs, in and out of place, streaming or not, and block and
// vector-tail lengths. uint32 and uint64: the same on values of the whole range
// (sums and products wrap), and a few cases written out (wrapping, unsigned order,
// values a double cannot hold).

#include "unison/core/detail/host_reduce.hpp"

#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

using unison::reduce_op;

template <class T>
constexpr bool is_16_bit = std::is_same_v<T, unison::half> || std::is_same_v<T, unison::bf16>;

/// The type host_reduce combines T in.
template <class T>
using acc_t = std::conditional_t<is_16_bit<T>, float, T>;

/// A NaN whose payload is not the canonical one, and the smallest positive subnormal.
template <class T>
T odd_nan() {
    if constexpr (std::is_same_v<T, float>) {
        return std::bit_cast<float>(0x7fc12345u);
    } else if constexpr (std::is_same_v<T, double>) {
        return std::bit_cast<double>(0x7ff8000000012345ull);
    } else {
        return T::from_bits(std::is_same_v<T, unison::half> ? 0x7c01u : 0x7f81u);
    }
}
template <class T>
T subnormal() {
    if constexpr (is_16_bit<T>) {
        return T::from_bits(0x0003u);
    } else {
        return std::numeric_limits<T>::denorm_min();
    }
}

/// The bits of x, for the report and the comparison.
template <class T>
std::uint64_t bits_of(T x) {
    if constexpr (std::is_integral_v<T>) {
        return static_cast<std::uint64_t>(x);
    } else if constexpr (is_16_bit<T>) {
        return x.bits;
    } else if constexpr (std::is_same_v<T, float>) {
        return std::bit_cast<std::uint32_t>(x);
    } else {
        return std::bit_cast<std::uint64_t>(x);
    }
}

/// Same bits; in float and double any NaN matches any NaN.
template <class T>
bool same_value(T got, T want) {
    if constexpr (std::is_floating_point_v<T>) {
        if (std::isnan(got) && std::isnan(want)) {
            return true;
        }
    }
    return bits_of(got) == bits_of(want);
}

/// Any values of an unsigned type, so that sums and products wrap.
template <class T>
requires std::is_unsigned_v<T> std::vector<T> random_values(std::size_t count,
                                                            std::mt19937_64& gen) {
    std::vector<T> v(count);
    for (T& x : v) {
        x = static_cast<T>(gen());
    }
    return v;
}

/// Values in [-4, 4) with NaN, infinities, signed zeros and subnormals planted.
template <class T>
std::vector<T> random_values(std::size_t count, std::mt19937_64& gen) {
    std::uniform_real_distribution<float> value(-4.0f, 4.0f);
    std::uniform_int_distribution<int> special(0, 63);
    const float inf = std::numeric_limits<float>::infinity();
    std::vector<T> v(count);
    for (T& x : v) {
        switch (special(gen)) {
        case 0:
            x = T(std::numeric_limits<float>::quiet_NaN());
            break;
        case 1:
            x = odd_nan<T>();
            break;
        case 2:
            x = T(inf);
            break;
        case 3:
            x = T(-inf);
            break;
        case 4:
            x = T(-0.0f);
            break;
        case 5:
            x = subnormal<T>();
            break;
        default:
            x = T(value(gen));
        }
    }
    return v;
}

template <class A>
A combine(reduce_op op, A acc, A x) {
    switch (op) {
    case reduce_op::prod:
        return static_cast<A>(acc * x);
    case reduce_op::min:
        return x < acc ? x : acc;
    case reduce_op::max:
        return acc < x ? x : acc;
    default:
        return static_cast<A>(acc + x);
    }
}

template <class T>
void check_reductions(const char* type) {
    std::mt19937_64 gen(2024);
    const std::size_t counts[] = {1, 7, 8, 15, 16, 17, 31, 1023, 1024, 2047, 2048, 2049, 5000};
    const reduce_op ops[] = {reduce_op::sum, reduce_op::prod, reduce_op::min, reduce_op::max,
                             reduce_op::avg};
    std::size_t cases = 0, wrong = 0;
    std::string first;
    for (const std::size_t count : counts) {
        for (const reduce_op op : ops) {
            if (op == reduce_op::avg && std::is_integral_v<T>) {
                continue; // refused for integer dtypes before any reduction
            }
            for (int n = 1; n <= 5; ++n) {
                for (int m = 1; m <= 3; ++m) {
                    for (const bool streaming : {false, true}) {
                        for (const bool in_place : {false, true}) {
                            std::vector<std::vector<T>> in;
                            for (int r = 0; r < n; ++r) {
                                in.push_back(random_values<T>(count, gen));
                            }
                            const int divisor = op == reduce_op::avg ? n : 1;
                            // Rank order, whichever input is the output.
                            using A = acc_t<T>;
                            std::vector<T> want(count);
                            for (std::size_t i = 0; i < count; ++i) {
                                A acc = static_cast<A>(in[0][i]);
                                for (int k = 1; k < n; ++k) {
                                    acc = combine(op, acc, static_cast<A>(in[k][i]));
                                }
                                if (divisor != 1) {
                                    acc = acc / static_cast<A>(divisor);
                                }
                                want[i] = T(acc);
                            }
                            std::vector<std::vector<T>> out(static_cast<std::size_t>(m),
                                                            std::vector<T>(count, T(7.0f)));
                            std::vector<const void*> inputs;
                            for (const auto& v : in) {
                                inputs.push_back(v.data());
                            }
                            std::vector<void*> outputs;
                            for (auto& v : out) {
                                outputs.push_back(v.data());
                            }
                            if (in_place) { // output 0 is the last input's memory
                                outputs[0] = in.back().data();
                            }
                            if (in_place && m >= 2 && n >= 3) { // and output 1 the first's
                                outputs[1] = in.front().data();
                            }
                            unison::detail::host_reduce(unison::dtype_of<T>, op, inputs.data(), n,
                                                        outputs.data(), m, count, divisor,
                                                        streaming);
                            ++cases;
                            for (int o = 0; o < m; ++o) {
                                const T* got = static_cast<const T*>(outputs[o]);
                                for (std::size_t i = 0; i < count; ++i) {
                                    if (!same_value(got[i], want[i]) && wrong++ == 0) {
                                        char s[200];
                                        std::snprintf(
                                            s, sizeof s,
                                            "%s op %d, %zu elements, %d inputs, output %d of %d, "
                                            "streaming %d, in place %d: element %zu is 0x%llx, "
                                            "want 0x%llx",
                                            type, static_cast<int>(op), count, n, o, m, streaming,
                                            in_place, i,
                                            static_cast<unsigned long long>(bits_of(got[i])),
                                            static_cast<unsigned long long>(bits_of(want[i])));
                                        first = s;
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    INFO(cases, " reductions; first wrong element: ", first);
    CHECK(wrong == 0);
}

} // namespace

TEST_CASE("host_reduce: half equals the element-by-element float reduction bit for bit") {
    check_reductions<unison::half>("half");
}

TEST_CASE("host_reduce: bf16 equals the element-by-element float reduction bit for bit") {
    check_reductions<unison::bf16>("bf16");
}

TEST_CASE("host_reduce: float equals the element-by-element reduction bit for bit") {
    check_reductions<float>("float");
}

TEST_CASE("host_reduce: double equals the element-by-element reduction bit for bit") {
    check_reductions<double>("double");
}

#if UNISON_HOST_X86_DISPATCH
// The cases above ran the widest loops this CPU has (AVX-512 or AVX2); these run
// each narrower one, which other x86-64 CPUs take.
TEST_CASE("host_reduce: float and double on every narrower vector loop equal the "
          "element-by-element reduction bit for bit") {
    using unison::detail::host_vectors;
    struct restore {
        host_vectors was = unison::detail::host_reduce_vectors;
        ~restore() { unison::detail::host_reduce_vectors = was; }
    } guard;
    const host_vectors widest = unison::detail::host_cpu_vectors();
    const std::string name = widest == host_vectors::avx512 ? "AVX-512"
                             : widest == host_vectors::avx2 ? "AVX2"
                                                            : "SSE2";
    MESSAGE("the widest vectors this CPU has: ", name);
    for (const auto& [level, label] :
         {std::pair{host_vectors::sse2, "SSE2"}, std::pair{host_vectors::avx2, "AVX2"}}) {
        if (level < widest) {
            unison::detail::host_reduce_vectors = level;
            check_reductions<float>((std::string("float, ") + label).c_str());
            check_reductions<double>((std::string("double, ") + label).c_str());
        }
    }
}
#endif

TEST_CASE("host_reduce: uint32 and uint64 equal the element-by-element reduction") {
    check_reductions<std::uint32_t>("uint32");
    check_reductions<std::uint64_t>("uint64");
}

TEST_CASE("host_reduce: unsigned sums and products wrap, and min and max compare unsigned") {
    const auto reduce2 = [](auto a, auto b, reduce_op op) {
        using T = decltype(a);
        const T in[2] = {a, b};
        T out = 0;
        const void* inputs[2] = {&in[0], &in[1]};
        void* outputs[1] = {&out};
        unison::detail::host_reduce(unison::dtype_of<T>, op, inputs, 2, outputs, 1, 1);
        return out;
    };
    const std::uint32_t top32 = 0xffffffffu, high32 = 0x80000000u;
    CHECK(reduce2(top32, std::uint32_t{2}, reduce_op::sum) == 1u);
    CHECK(reduce2(high32, std::uint32_t{2}, reduce_op::prod) == 0u);
    CHECK(reduce2(0x10001u, 0x10001u, reduce_op::prod) == 0x20001u);
    CHECK(reduce2(high32, std::uint32_t{1}, reduce_op::min) == 1u);
    CHECK(reduce2(std::uint32_t{1}, high32, reduce_op::max) == high32);

    const std::uint64_t top64 = ~std::uint64_t{0}, high64 = std::uint64_t{1} << 63;
    CHECK(reduce2(top64, std::uint64_t{2}, reduce_op::sum) == 1u);
    CHECK(reduce2(high64, std::uint64_t{2}, reduce_op::prod) == 0u);
    CHECK(reduce2(top64, top64, reduce_op::prod) == 1u); // (-1)^2 modulo 2^64
    CHECK(reduce2(high64, std::uint64_t{1}, reduce_op::min) == 1u);
    CHECK(reduce2(std::uint64_t{1}, high64, reduce_op::max) == high64);
    // above 2^53: a double could not tell these apart
    CHECK(reduce2(top64 - 2, std::uint64_t{1}, reduce_op::sum) == top64 - 1);
}
