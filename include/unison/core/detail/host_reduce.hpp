#pragma once

/// \file
/// Host reduction loops used by the thread and MPI backends. One function reduces
/// element range [0, count) of n inputs and writes the result to m outputs, in
/// cache-sized blocks, so the thread backend's "reduce my chunk of everyone's
/// input and write it to everyone's output" is one pass over memory.

#include "unison/core/detail/half_block.hpp"
#include "unison/core/dtype.hpp"
#include "unison/core/reduce_op.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <type_traits>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace unison::detail {

/// The type arithmetic is done in: float for the 16-bit types, the type itself otherwise.
template <class T>
struct accumulate_type {
    using type = T;
};
template <>
struct accumulate_type<half> {
    using type = float;
};
template <>
struct accumulate_type<bf16> {
    using type = float;
};
template <class T>
using accumulate_t = typename accumulate_type<T>::type;

/// Binary reduction functors on the accumulate type.
struct sum_fn {
    template <class A>
    UNISON_HOST_DEVICE constexpr A operator()(A a, A b) const noexcept {
        return static_cast<A>(a + b);
    }
};
struct prod_fn {
    template <class A>
    UNISON_HOST_DEVICE constexpr A operator()(A a, A b) const noexcept {
        return static_cast<A>(a * b);
    }
};
struct min_fn {
    template <class A>
    UNISON_HOST_DEVICE constexpr A operator()(A a, A b) const noexcept {
        return b < a ? b : a;
    }
};
struct max_fn {
    template <class A>
    UNISON_HOST_DEVICE constexpr A operator()(A a, A b) const noexcept {
        return a < b ? b : a;
    }
};

template <class T>
UNISON_HOST_DEVICE constexpr accumulate_t<T> widen(T v) noexcept {
    return static_cast<accumulate_t<T>>(v);
}
template <class T>
UNISON_HOST_DEVICE constexpr T narrow(accumulate_t<T> v) noexcept {
    return static_cast<T>(v);
}

/// Elements per block: 4 KiB of accumulators per block keeps every input's block
/// and the accumulators in L1 while the loop walks over the ranks.
inline constexpr std::size_t reduce_block_elements = 1024;

/// Copies `bytes` to `dst`; with `streaming`, through non-temporal stores that skip
/// the read-for-ownership of the destination line (a third of the traffic of a
/// large out-of-place reduction). The caller fences (store_fence) before publishing.
inline void copy_out(void* dst, const void* src, std::size_t bytes, bool streaming) noexcept {
#if defined(__SSE2__)
    if (streaming) {
        auto* d = static_cast<std::uint8_t*>(dst);
        const auto* s = static_cast<const std::uint8_t*>(src);
        const std::size_t head =
            std::min(bytes, (16 - (reinterpret_cast<std::uintptr_t>(d) & 15)) & 15);
        std::memcpy(d, s, head);
        std::size_t i = head;
        for (; i + 16 <= bytes; i += 16) {
            _mm_stream_si128(reinterpret_cast<__m128i*>(d + i),
                             _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i)));
        }
        std::memcpy(d + i, s + i, bytes - i);
        return;
    }
#endif
    (void)streaming;
    std::memcpy(dst, src, bytes);
}

/// Orders earlier non-temporal stores before later stores (a no-op without them).
inline void store_fence() noexcept {
#if defined(__SSE2__)
    _mm_sfence();
#endif
}

/// o[i] = fn(a[i], b[i]) for i < len; `o` may be `a` or `b` element for element.
/// The element loop, which compilers vectorize at -O3 but not at -O2 (GCC 12: 4-6x
/// slower there), so float and double take the vector loops below on x86-64.
template <class T, class Fn>
void combine_elements(Fn fn, const T* a, const T* b, T* o, std::size_t len) noexcept {
    for (std::size_t i = 0; i < len; ++i) {
        o[i] = fn(a[i], b[i]);
    }
}

#if defined(__SSE2__)
/// SSE2 (every x86-64 CPU) lanes of float and double, and each functor as the same
/// comparison or arithmetic per lane: bit for bit the element loop's results, NaN
/// and signed zeros included (min: b < a ? b : a is _mm_min(b, a); max likewise).
template <class T>
struct sse2_lanes;
template <>
struct sse2_lanes<float> {
    using vec = __m128;
    static constexpr std::size_t width = 4;
    static vec load(const float* p) noexcept { return _mm_loadu_ps(p); }
    static void store(float* p, vec v) noexcept { _mm_storeu_ps(p, v); }
    static vec apply(sum_fn, vec a, vec b) noexcept { return _mm_add_ps(a, b); }
    static vec apply(prod_fn, vec a, vec b) noexcept { return _mm_mul_ps(a, b); }
    static vec apply(min_fn, vec a, vec b) noexcept { return _mm_min_ps(b, a); }
    static vec apply(max_fn, vec a, vec b) noexcept { return _mm_max_ps(b, a); }
    static vec divide(vec a, float d) noexcept { return _mm_div_ps(a, _mm_set1_ps(d)); }
};
template <>
struct sse2_lanes<double> {
    using vec = __m128d;
    static constexpr std::size_t width = 2;
    static vec load(const double* p) noexcept { return _mm_loadu_pd(p); }
    static void store(double* p, vec v) noexcept { _mm_storeu_pd(p, v); }
    static vec apply(sum_fn, vec a, vec b) noexcept { return _mm_add_pd(a, b); }
    static vec apply(prod_fn, vec a, vec b) noexcept { return _mm_mul_pd(a, b); }
    static vec apply(min_fn, vec a, vec b) noexcept { return _mm_min_pd(b, a); }
    static vec apply(max_fn, vec a, vec b) noexcept { return _mm_max_pd(b, a); }
    static vec divide(vec a, double d) noexcept { return _mm_div_pd(a, _mm_set1_pd(d)); }
};

#if UNISON_HOST_X86_DISPATCH
/// The widest vectors combine_elements runs float and double on.
enum class host_vectors : unsigned char { sse2, avx2, avx512 };

/// The widest this CPU has (a header-only library cannot assume its consumer's
/// -march). Safe in static initializers, which may run before libgcc's own.
inline host_vectors host_cpu_vectors() noexcept {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") ? host_vectors::avx512
           : __builtin_cpu_supports("avx2")  ? host_vectors::avx2
                                             : host_vectors::sse2;
}

/// The widest the CPU has, narrowed by UNISON_HOST_VECTORS (sse2, avx2 or avx512)
/// where it is set: 512-bit instructions lower the clock of some CPUs (Skylake-SP,
/// Cascade Lake) for a while, and of the threads sharing the core with it. Read in
/// a static initializer, where nothing can be thrown: a value that is none of the
/// three is named on stderr and the CPU's widest is used.
inline host_vectors host_vectors_from_env() noexcept {
    const host_vectors widest = host_cpu_vectors();
    const char* v = std::getenv("UNISON_HOST_VECTORS");
    if (v == nullptr || *v == '\0') {
        return widest;
    }
    const std::string_view name(v);
    host_vectors asked = widest;
    if (name == "sse2") {
        asked = host_vectors::sse2;
    } else if (name == "avx2") {
        asked = host_vectors::avx2;
    } else if (name != "avx512") {
        std::fprintf(stderr,
                     "unison: UNISON_HOST_VECTORS='%s' is none of sse2, avx2, avx512; the "
                     "host reduction uses the widest this CPU has\n",
                     v);
    }
    return asked < widest ? asked : widest;
}

/// What combine_elements runs on: host_vectors_from_env(). The tests narrow it to
/// check every narrower loop on the same CPU.
inline host_vectors host_reduce_vectors = host_vectors_from_env();

// The target of the AVX-512 loop: Clang 18 to 21 also want "evex512" (512-bit
// registers) where the translation unit's -march names a CPU without AVX-512; the
// others do not know the name.
#if defined(__clang__) && !defined(__apple_build_version__) && __clang_major__ >= 18 &&            \
    __clang_major__ <= 21
#define UNISON_HOST_AVX512_TARGET "avx512f,evex512"
#else
#define UNISON_HOST_AVX512_TARGET "avx512f"
#endif

// AVX2 and AVX-512 lanes of float and double, each functor as sse2_lanes computes
// it: the same IEEE operation per lane, so the same bits at every width, but for
// which NaN's payload a sum or product of two NaNs keeps (Clang swaps the operands
// of SSE2's two-operand add and multiply; GCC gives the same bits there too).
// (AVX-512's min and max take their every-lane masked form: GCC 12's plain form
// warns that its unused pass-through operand is uninitialized.)
template <class T>
struct avx2_lanes;
template <class T>
struct avx512_lanes;
template <>
struct avx2_lanes<float> {
    using vec = __m256;
    static constexpr std::size_t width = 8;
    __attribute__((target("avx2"))) static vec load(const float* p) noexcept {
        return _mm256_loadu_ps(p);
    }
    __attribute__((target("avx2"))) static void store(float* p, vec v) noexcept {
        _mm256_storeu_ps(p, v);
    }
    __attribute__((target("avx2"))) static vec apply(sum_fn, vec a, vec b) noexcept {
        return _mm256_add_ps(a, b);
    }
    __attribute__((target("avx2"))) static vec apply(prod_fn, vec a, vec b) noexcept {
        return _mm256_mul_ps(a, b);
    }
    __attribute__((target("avx2"))) static vec apply(min_fn, vec a, vec b) noexcept {
        return _mm256_min_ps(b, a);
    }
    __attribute__((target("avx2"))) static vec apply(max_fn, vec a, vec b) noexcept {
        return _mm256_max_ps(b, a);
    }
};
template <>
struct avx2_lanes<double> {
    using vec = __m256d;
    static constexpr std::size_t width = 4;
    __attribute__((target("avx2"))) static vec load(const double* p) noexcept {
        return _mm256_loadu_pd(p);
    }
    __attribute__((target("avx2"))) static void store(double* p, vec v) noexcept {
        _mm256_storeu_pd(p, v);
    }
    __attribute__((target("avx2"))) static vec apply(sum_fn, vec a, vec b) noexcept {
        return _mm256_add_pd(a, b);
    }
    __attribute__((target("avx2"))) static vec apply(prod_fn, vec a, vec b) noexcept {
        return _mm256_mul_pd(a, b);
    }
    __attribute__((target("avx2"))) static vec apply(min_fn, vec a, vec b) noexcept {
        return _mm256_min_pd(b, a);
    }
    __attribute__((target("avx2"))) static vec apply(max_fn, vec a, vec b) noexcept {
        return _mm256_max_pd(b, a);
    }
};
template <>
struct avx512_lanes<float> {
    using vec = __m512;
    static constexpr std::size_t width = 16;
    __attribute__((target(UNISON_HOST_AVX512_TARGET))) static vec load(const float* p) noexcept {
        return _mm512_loadu_ps(p);
    }
    __attribute__((target(UNISON_HOST_AVX512_TARGET))) static void store(float* p, vec v) noexcept {
        _mm512_storeu_ps(p, v);
    }
    __attribute__((target(UNISON_HOST_AVX512_TARGET))) static vec apply(sum_fn, vec a,
                                                                        vec b) noexcept {
        return _mm512_add_ps(a, b);
    }
    __attribute__((target(UNISON_HOST_AVX512_TARGET))) static vec apply(prod_fn, vec a,
                                                                        vec b) noexcept {
        return _mm512_mul_ps(a, b);
    }
    __attribute__((target(UNISON_HOST_AVX512_TARGET))) static vec apply(min_fn, vec a,
                                                                        vec b) noexcept {
        return _mm512_mask_min_ps(b, 0xffff, b, a);
    }
    __attribute__((target(UNISON_HOST_AVX512_TARGET))) static vec apply(max_fn, vec a,
                                                                        vec b) noexcept {
        return _mm512_mask_max_ps(b, 0xffff, b, a);
    }
};
template <>
struct avx512_lanes<double> {
    using vec = __m512d;
    static constexpr std::size_t width = 8;
    __attribute__((target(UNISON_HOST_AVX512_TARGET))) static vec load(const double* p) noexcept {
        return _mm512_loadu_pd(p);
    }
    __attribute__((target(UNISON_HOST_AVX512_TARGET))) static void store(double* p,
                                                                         vec v) noexcept {
        _mm512_storeu_pd(p, v);
    }
    __attribute__((target(UNISON_HOST_AVX512_TARGET))) static vec apply(sum_fn, vec a,
                                                                        vec b) noexcept {
        return _mm512_add_pd(a, b);
    }
    __attribute__((target(UNISON_HOST_AVX512_TARGET))) static vec apply(prod_fn, vec a,
                                                                        vec b) noexcept {
        return _mm512_mul_pd(a, b);
    }
    __attribute__((target(UNISON_HOST_AVX512_TARGET))) static vec apply(min_fn, vec a,
                                                                        vec b) noexcept {
        return _mm512_mask_min_pd(b, 0xff, b, a);
    }
    __attribute__((target(UNISON_HOST_AVX512_TARGET))) static vec apply(max_fn, vec a,
                                                                        vec b) noexcept {
        return _mm512_mask_max_pd(b, 0xff, b, a);
    }
};

/// combine_elements on AVX2 and on AVX-512: the loop below on wider vectors. Open
/// MPI's own reductions run as wide as the CPU allows (its op/avx component); on
/// SSE2 alone the in-place ring's reduction took 1.2-1.4x as long
/// (docs/measurements.md, "The reduction loop").
template <class T, class Fn>
__attribute__((target("avx2"))) void combine_avx2(Fn fn, const T* a, const T* b, T* o,
                                                  std::size_t len) noexcept {
    using L = avx2_lanes<T>;
    constexpr std::size_t w = L::width;
    std::size_t i = 0;
    for (; i + 4 * w <= len; i += 4 * w) {
        L::store(o + i, L::apply(fn, L::load(a + i), L::load(b + i)));
        L::store(o + i + w, L::apply(fn, L::load(a + i + w), L::load(b + i + w)));
        L::store(o + i + 2 * w, L::apply(fn, L::load(a + i + 2 * w), L::load(b + i + 2 * w)));
        L::store(o + i + 3 * w, L::apply(fn, L::load(a + i + 3 * w), L::load(b + i + 3 * w)));
    }
    for (; i + w <= len; i += w) {
        L::store(o + i, L::apply(fn, L::load(a + i), L::load(b + i)));
    }
    for (; i < len; ++i) {
        o[i] = fn(a[i], b[i]);
    }
}
template <class T, class Fn>
__attribute__((target(UNISON_HOST_AVX512_TARGET))) void
combine_avx512(Fn fn, const T* a, const T* b, T* o, std::size_t len) noexcept {
    using L = avx512_lanes<T>;
    constexpr std::size_t w = L::width;
    std::size_t i = 0;
    for (; i + 4 * w <= len; i += 4 * w) {
        L::store(o + i, L::apply(fn, L::load(a + i), L::load(b + i)));
        L::store(o + i + w, L::apply(fn, L::load(a + i + w), L::load(b + i + w)));
        L::store(o + i + 2 * w, L::apply(fn, L::load(a + i + 2 * w), L::load(b + i + 2 * w)));
        L::store(o + i + 3 * w, L::apply(fn, L::load(a + i + 3 * w), L::load(b + i + 3 * w)));
    }
    for (; i + w <= len; i += w) {
        L::store(o + i, L::apply(fn, L::load(a + i), L::load(b + i)));
    }
    for (; i < len; ++i) {
        o[i] = fn(a[i], b[i]);
    }
}
#endif

/// The SSE2 loop: four vectors per iteration, each stored right after its own two
/// loads, so `o` aliasing `a` or `b` element for element reads every input before
/// writing it. Grouping the four stores after all eight loads (the first form of
/// this loop) measured 1.7x slower out of place in cache and 2.4-3.2x slower in
/// place on lines that another core had just read: the MPI ring's in-place
/// reduction, whose chunk the peer had copied out one step before
/// (docs/measurements.md, "The reduction loop").
template <class T, class Fn>
requires std::is_same_v<T, float> || std::is_same_v<T, double>
void combine_elements(Fn fn, const T* a, const T* b, T* o, std::size_t len) noexcept {
#if UNISON_HOST_X86_DISPATCH
    if (host_reduce_vectors == host_vectors::avx512) {
        combine_avx512(fn, a, b, o, len);
        return;
    }
    if (host_reduce_vectors == host_vectors::avx2) {
        combine_avx2(fn, a, b, o, len);
        return;
    }
#endif
    using L = sse2_lanes<T>;
    constexpr std::size_t w = L::width;
    std::size_t i = 0;
    for (; i + 4 * w <= len; i += 4 * w) {
        L::store(o + i, L::apply(fn, L::load(a + i), L::load(b + i)));
        L::store(o + i + w, L::apply(fn, L::load(a + i + w), L::load(b + i + w)));
        L::store(o + i + 2 * w, L::apply(fn, L::load(a + i + 2 * w), L::load(b + i + 2 * w)));
        L::store(o + i + 3 * w, L::apply(fn, L::load(a + i + 3 * w), L::load(b + i + 3 * w)));
    }
    for (; i + w <= len; i += w) {
        L::store(o + i, L::apply(fn, L::load(a + i), L::load(b + i)));
    }
    for (; i < len; ++i) {
        o[i] = fn(a[i], b[i]);
    }
}
#endif

/// o[i] /= d for i < len (average's last step), on SSE2 lanes on x86-64.
template <class T>
void divide_elements(T* o, std::size_t len, int divisor) noexcept {
    const T d = static_cast<T>(divisor);
    std::size_t i = 0;
#if defined(__SSE2__)
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
        using L = sse2_lanes<T>;
        for (; i + L::width <= len; i += L::width) {
            L::store(o + i, L::divide(L::load(o + i), d));
        }
    }
#endif
    for (; i < len; ++i) {
        o[i] = static_cast<T>(o[i] / d);
    }
}

template <class T, class Fn>
void reduce_typed(Fn fn, const void* const* inputs, int n, void* const* outputs, int m,
                  std::size_t count, int divisor, bool streaming) {
    static_assert(std::is_same_v<accumulate_t<T>, T>, "the 16-bit types go through reduce_16");
    // Every path folds in rank order, ((in0 op in1) op in2) ..., so that the same
    // values give the same bits whoever reduces them (comm_options::deterministic).
    T* out0 = static_cast<T*>(outputs[0]);
    bool aliased = false; // the first output is an input other than the first
    for (int r = 1; r < n; ++r) {
        aliased = aliased || inputs[r] == out0;
    }
    if (!streaming && !aliased) {
        // Reduce straight into the first output, block by block, and copy the block
        // to the other outputs while it is in L1. The first output may be the first
        // input element for element (in place), which is read before it is written.
        for (std::size_t base = 0; base < count; base += reduce_block_elements) {
            const std::size_t len = std::min(reduce_block_elements, count - base);
            const T* a = static_cast<const T*>(inputs[0]) + base;
            T* o = out0 + base;
            if (n >= 2) {
                combine_elements(fn, a, static_cast<const T*>(inputs[1]) + base, o, len);
            } else if (o != a) {
                std::memcpy(o, a, len * sizeof(T));
            }
            for (int r = 2; r < n; ++r) {
                combine_elements(fn, static_cast<const T*>(o),
                                 static_cast<const T*>(inputs[r]) + base, o, len);
            }
            if (divisor != 1) {
                divide_elements(o, len, divisor);
            }
            for (int k = 1; k < m; ++k) {
                T* dst = static_cast<T*>(outputs[k]) + base;
                if (dst != o) {
                    std::memcpy(dst, o, len * sizeof(T));
                }
            }
        }
        return;
    }
    // Streaming, or in place on an input other than the first (a reduce_scatter or
    // a reduce whose rank is not 0): reduce into L1, then copy or stream out.
    T acc[reduce_block_elements];
    for (std::size_t base = 0; base < count; base += reduce_block_elements) {
        const std::size_t len = std::min(reduce_block_elements, count - base);
        const T* in0 = static_cast<const T*>(inputs[0]) + base;
        int r = 1;
        if (n >= 2) { // the first two inputs in one pass
            combine_elements(fn, in0, static_cast<const T*>(inputs[1]) + base, acc, len);
            r = 2;
        } else {
            std::memcpy(acc, in0, len * sizeof(T));
        }
        for (; r < n; ++r) {
            combine_elements(fn, static_cast<const T*>(acc),
                             static_cast<const T*>(inputs[r]) + base, acc, len);
        }
        if (divisor != 1) {
            divide_elements(acc, len, divisor);
        }
        for (int o = 0; o < m; ++o) {
            copy_out(static_cast<T*>(outputs[o]) + base, acc, len * sizeof(T), streaming);
        }
    }
    if (streaming) {
        store_fence();
    }
}

/// The 16-bit types: each block reduced in one pass over the inputs (half_block.hpp),
/// into the first output or, when streaming, into L1 and streamed to the outputs.
template <class T, reduce_op Op>
void reduce_16(const void* const* inputs, int n, void* const* outputs, int m, std::size_t count,
               int divisor, bool streaming) {
    constexpr std::size_t block_elements = 2 * reduce_block_elements; // the same bytes
    T narrowed[block_elements];
    for (std::size_t base = 0; base < count; base += block_elements) {
        const std::size_t len = std::min(block_elements, count - base);
        T* const dst0 = static_cast<T*>(outputs[0]) + base;
        T* const block = streaming ? narrowed : dst0;
        reduce_block<Op>(inputs, n, base, len, divisor, block);
        for (int o = streaming ? 0 : 1; o < m; ++o) {
            T* const dst = static_cast<T*>(outputs[o]) + base;
            if (dst != block) {
                copy_out(dst, block, len * sizeof(T), streaming);
            }
        }
    }
    if (streaming) {
        store_fence();
    }
}

template <class T>
void reduce_dispatch_op(reduce_op op, const void* const* inputs, int n, void* const* outputs, int m,
                        std::size_t count, int divisor, bool streaming) {
    if constexpr (std::is_same_v<T, half> || std::is_same_v<T, bf16>) {
        switch (op) {
        case reduce_op::sum:
        case reduce_op::avg:
            return reduce_16<T, reduce_op::sum>(inputs, n, outputs, m, count, divisor, streaming);
        case reduce_op::prod:
            return reduce_16<T, reduce_op::prod>(inputs, n, outputs, m, count, divisor, streaming);
        case reduce_op::min:
            return reduce_16<T, reduce_op::min>(inputs, n, outputs, m, count, divisor, streaming);
        case reduce_op::max:
            return reduce_16<T, reduce_op::max>(inputs, n, outputs, m, count, divisor, streaming);
        }
    } else {
        switch (op) {
        case reduce_op::sum:
        case reduce_op::avg:
            return reduce_typed<T>(sum_fn{}, inputs, n, outputs, m, count, divisor, streaming);
        case reduce_op::prod:
            return reduce_typed<T>(prod_fn{}, inputs, n, outputs, m, count, divisor, streaming);
        case reduce_op::min:
            return reduce_typed<T>(min_fn{}, inputs, n, outputs, m, count, divisor, streaming);
        case reduce_op::max:
            return reduce_typed<T>(max_fn{}, inputs, n, outputs, m, count, divisor, streaming);
        }
    }
}

/// outputs[o][i] = (inputs[0][i] op ... op inputs[n-1][i]) / divisor for i < count and
/// every o < m. `avg` reduces as `sum`; the caller passes the divisor (1 for none)
/// where the reduction completes. An output may alias an input. `streaming` writes
/// the outputs with non-temporal stores (for outputs larger than the caches).
inline void host_reduce(dtype type, reduce_op op, const void* const* inputs, int n,
                        void* const* outputs, int m, std::size_t count, int divisor = 1,
                        bool streaming = false) {
    switch (type) {
    case dtype::f64:
        return reduce_dispatch_op<double>(op, inputs, n, outputs, m, count, divisor, streaming);
    case dtype::f32:
        return reduce_dispatch_op<float>(op, inputs, n, outputs, m, count, divisor, streaming);
    case dtype::f16:
        return reduce_dispatch_op<half>(op, inputs, n, outputs, m, count, divisor, streaming);
    case dtype::bf16:
        return reduce_dispatch_op<bf16>(op, inputs, n, outputs, m, count, divisor, streaming);
    case dtype::i64:
        return reduce_dispatch_op<std::int64_t>(op, inputs, n, outputs, m, count, divisor,
                                                streaming);
    case dtype::i32:
        return reduce_dispatch_op<std::int32_t>(op, inputs, n, outputs, m, count, divisor,
                                                streaming);
    case dtype::i8:
        return reduce_dispatch_op<std::int8_t>(op, inputs, n, outputs, m, count, divisor,
                                               streaming);
    case dtype::u8:
        return reduce_dispatch_op<std::uint8_t>(op, inputs, n, outputs, m, count, divisor,
                                                streaming);
    case dtype::u32:
        return reduce_dispatch_op<std::uint32_t>(op, inputs, n, outputs, m, count, divisor,
                                                 streaming);
    case dtype::u64:
        return reduce_dispatch_op<std::uint64_t>(op, inputs, n, outputs, m, count, divisor,
                                                 streaming);
    }
}

} // namespace unison::detail
