#pragma once

/// \file
/// Whole blocks of the 16-bit types on the host: conversions to and from float and
/// the fused reduction of several inputs, bit for bit as half.hpp's element
/// conversions and host_reduce's element loop (and so as CUDA's). They run on AVX2
/// and F16C where the CPU has them, chosen at run time (a header-only library
/// cannot assume its consumer's `-march`), and element by element elsewhere. A
/// 16-bit all-reduce through them runs at float's bytes per second or close to it
/// (docs/performance.md).

#include "unison/core/half.hpp"
#include "unison/core/reduce_op.hpp"

#include <cstddef>
#include <cstdint>
#include <type_traits>

// The vector paths (here, and host_reduce.hpp's AVX2 and AVX-512 loops for float
// and double) need GCC or Clang on x86-64, not clang-cl (function-level target
// attributes and __builtin_cpu_supports; nvcc's host pass takes them as well).
// A target attribute adds to the translation unit's own -m flags, so build every
// translation unit of a program with the same -m flags (or none): a copy of these
// inline functions compiled under -march=native may be the one the linker keeps.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(_MSC_VER)
#define UNISON_HOST_X86_DISPATCH 1
#include <immintrin.h>
#else
#define UNISON_HOST_X86_DISPATCH 0
#endif

namespace unison::detail {

/// acc op x for one element, as host_reduce's functors compute it.
template <reduce_op Op>
constexpr float combine1(float acc, float x) noexcept {
    if constexpr (Op == reduce_op::prod) {
        return acc * x;
    } else if constexpr (Op == reduce_op::min) {
        return x < acc ? x : acc;
    } else if constexpr (Op == reduce_op::max) {
        return acc < x ? x : acc;
    } else {
        return acc + x;
    }
}

/// Element `at` of input r (an array of T).
template <class T>
const T* input_at(const void* const* in, int r, std::size_t at) noexcept {
    return static_cast<const T*>(in[r]) + at;
}

/// out[i] for i in [first, last), element by element: the portable path, and the
/// vector path's tail.
template <reduce_op Op, class T>
void reduce_elements(const void* const* in, int n, std::size_t base, std::size_t first,
                     std::size_t last, int divisor, T* out) noexcept {
    for (std::size_t i = first; i < last; ++i) {
        float acc = static_cast<float>(*input_at<T>(in, 0, base + i));
        for (int r = 1; r < n; ++r) {
            acc = combine1<Op>(acc, static_cast<float>(*input_at<T>(in, r, base + i)));
        }
        if (divisor != 1) {
            acc = acc / static_cast<float>(divisor);
        }
        out[i] = T(acc);
    }
}

#if UNISON_HOST_X86_DISPATCH

/// Whether this CPU runs the AVX2 + F16C paths (asked once). F16C is read from
/// CPUID leaf 1 (ECX bit 29) by the instruction itself: Clang 14's
/// __builtin_cpu_supports does not know the name "f16c" and refuses to compile it,
/// and <cpuid.h> would define a __cpuid macro in every program that includes
/// unison. F16C's instructions use the YMM state that "avx2" already says the OS
/// saves.
inline bool host_has_f16c() noexcept {
    static const bool yes = [] {
        __builtin_cpu_init();
        unsigned r[4] = {1, 0, 0, 0}; // eax (the leaf), ebx, ecx (the subleaf), edx
        __asm__("cpuid" : "+a"(r[0]), "=b"(r[1]), "+c"(r[2]), "=d"(r[3]));
        return __builtin_cpu_supports("avx2") && (r[2] & (1u << 29)) != 0;
    }();
    return yes;
}

// Eight lanes at a time. Loads leave NaN payloads as they are; stores round to
// nearest even whatever MXCSR says and write every NaN as 0x7fff, as CUDA does.

__attribute__((target("avx2,f16c"))) inline __m256 load8(const half* in) noexcept {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in)));
}
__attribute__((target("avx2"))) inline __m256 load8(const bf16* in) noexcept {
    return _mm256_castsi256_ps(_mm256_slli_epi32(
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in))), 16));
}

__attribute__((target("avx2,f16c"))) inline void store8(__m256 v, half* out) noexcept {
    const __m128i h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT);
    const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    const __m128i nan16 =
        _mm_packs_epi32(_mm256_castsi256_si128(nan), _mm256_extracti128_si256(nan, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out),
                     _mm_blendv_epi8(h, _mm_set1_epi16(0x7fff), nan16));
}
/// bf16 rounded to nearest even in the low 16 bits of each lane; NaN is 0x7fff.
/// (bits + 0x7fff + bit 16, shifted down 16, carries into the exponent, and to
/// infinity, as rounding should.)
__attribute__((target("avx2"))) inline __m256i round_bf16(__m256 v) noexcept {
    const __m256i x = _mm256_castps_si256(v);
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
    const __m256i r = _mm256_srli_epi32(
        _mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7fff)), odd), 16);
    return _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7fff),
                              _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
}
__attribute__((target("avx2"))) inline void store8(__m256 v, bf16* out) noexcept {
    // 32-bit lanes to 16: packus works within 128-bit halves; put them in order.
    const __m256i r = round_bf16(v);
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm256_castsi256_si128(packed));
}

/// acc op x, lane by lane, as combine1: `x < acc ? x : acc` is minps(x, acc) and
/// `acc < x ? x : acc` is maxps(x, acc), NaNs and signed zeros included.
template <reduce_op Op>
__attribute__((target("avx2"))) inline __m256 combine8(__m256 acc, __m256 x) noexcept {
    if constexpr (Op == reduce_op::prod) {
        return _mm256_mul_ps(acc, x);
    } else if constexpr (Op == reduce_op::min) {
        return _mm256_min_ps(x, acc);
    } else if constexpr (Op == reduce_op::max) {
        return _mm256_max_ps(x, acc);
    } else {
        return _mm256_add_ps(acc, x);
    }
}

template <class T>
__attribute__((target("avx2,f16c"))) void widen_f16c(const T* in, float* out,
                                                     std::size_t n) noexcept {
    const std::size_t vector_end = n - n % 8;
    for (std::size_t i = 0; i < vector_end; i += 8) {
        __m256 v = load8(in + i);
        if constexpr (std::is_same_v<T, half>) { // CUDA makes every NaN 0x7fffffff
            v = _mm256_blendv_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)),
                                 _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        }
        _mm256_storeu_ps(out + i, v);
    }
    for (std::size_t i = vector_end; i < n; ++i) {
        out[i] = static_cast<float>(in[i]);
    }
}

template <class T>
__attribute__((target("avx2,f16c"))) void narrow_f16c(const float* in, T* out,
                                                      std::size_t n) noexcept {
    const std::size_t vector_end = n - n % 8;
    for (std::size_t i = 0; i < vector_end; i += 8) {
        store8(_mm256_loadu_ps(in + i), out + i);
    }
    for (std::size_t i = vector_end; i < n; ++i) {
        out[i] = T(in[i]);
    }
}

/// bf16, sixteen lanes at a time: unpacking a 32-byte load against zero gives
/// elements 0-3 and 8-11 in one register and 4-7 and 12-15 in the other (each bf16
/// in the high half of a float), and packing the rounded results puts them back in
/// order, with no cross-lane shuffle either way.
template <reduce_op Op>
__attribute__((target("avx2"))) void reduce_bf16_16(const void* const* in, int n, std::size_t at,
                                                    int divisor, bf16* out) noexcept {
    const __m256i zero = _mm256_setzero_si256();
    __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(input_at<bf16>(in, 0, at)));
    __m256 lo = _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, v));
    __m256 hi = _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, v));
    for (int r = 1; r < n; ++r) {
        v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(input_at<bf16>(in, r, at)));
        lo = combine8<Op>(lo, _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, v)));
        hi = combine8<Op>(hi, _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, v)));
    }
    if (divisor != 1) {
        const __m256 d = _mm256_set1_ps(static_cast<float>(divisor));
        lo = _mm256_div_ps(lo, d);
        hi = _mm256_div_ps(hi, d);
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out),
                        _mm256_packus_epi32(round_bf16(lo), round_bf16(hi)));
}

template <reduce_op Op, class T>
__attribute__((target("avx2,f16c"))) void reduce_f16c(const void* const* in, int n,
                                                      std::size_t base, std::size_t len,
                                                      int divisor, T* out) noexcept {
    std::size_t start = 0;
    if constexpr (std::is_same_v<T, bf16>) {
        start = len - len % 16;
        for (std::size_t i = 0; i < start; i += 16) {
            reduce_bf16_16<Op>(in, n, base + i, divisor, out + i);
        }
    }
    const __m256 d = _mm256_set1_ps(static_cast<float>(divisor));
    const std::size_t vector_end = len - len % 8;
    for (std::size_t i = start; i < vector_end; i += 8) {
        __m256 acc = load8(input_at<T>(in, 0, base + i));
        for (int r = 1; r < n; ++r) {
            acc = combine8<Op>(acc, load8(input_at<T>(in, r, base + i)));
        }
        if (divisor != 1) {
            acc = _mm256_div_ps(acc, d);
        }
        store8(acc, out + i);
    }
    reduce_elements<Op>(in, n, base, vector_end, len, divisor, out);
}

#endif // UNISON_HOST_X86_DISPATCH

/// out[i] = float(in[i]) for i < n (T: half or bf16).
template <class T>
void widen_block(const T* in, float* out, std::size_t n) noexcept {
#if UNISON_HOST_X86_DISPATCH
    if (host_has_f16c()) {
        return widen_f16c(in, out, n);
    }
#endif
    for (std::size_t i = 0; i < n; ++i) {
        out[i] = static_cast<float>(in[i]);
    }
}

/// out[i] = T(in[i]), rounded to nearest even, for i < n (T: half or bf16).
template <class T>
void narrow_block(const float* in, T* out, std::size_t n) noexcept {
#if UNISON_HOST_X86_DISPATCH
    if (host_has_f16c()) {
        return narrow_f16c(in, out, n);
    }
#endif
    for (std::size_t i = 0; i < n; ++i) {
        out[i] = T(in[i]);
    }
}

/// out[i] = T((in[0][base + i] op ... op in[n-1][base + i]) / divisor) for i < len,
/// in one pass over the inputs (arrays of T), in float (avg reduces as sum; the
/// caller passes the divisor). `out` may alias an input element for element.
template <reduce_op Op, class T>
void reduce_block(const void* const* in, int n, std::size_t base, std::size_t len, int divisor,
                  T* out) noexcept {
#if UNISON_HOST_X86_DISPATCH
    if (host_has_f16c()) {
        return reduce_f16c<Op>(in, n, base, len, divisor, out);
    }
#endif
    reduce_elements<Op>(in, n, base, 0, len, divisor, out);
}

} // namespace unison::detail
