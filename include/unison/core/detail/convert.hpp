#pragma once

/// \file
/// Host element loops shared by the training parts: copy with a scale and a dtype
/// cast (packing gradients into a bucket and unpacking them), scaling in place and
/// zero fill. The arithmetic is done in the wider of the two types' accumulation
/// types (float for f16/bf16/f32, double when either side is f64), with one
/// rounding at the store, which is what a CUDA kernel doing the same work gives.

#include "unison/core/config.hpp"
#include "unison/core/detail/half_block.hpp"
#include "unison/core/dtype.hpp"
#include "unison/core/half.hpp"

#include <cstddef>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace unison::detail {

template <class F>
decltype(auto) visit_floating(dtype t, F&& f) {
    switch (t) {
    case dtype::f64:
        return f(double{});
    case dtype::f32:
        return f(float{});
    case dtype::f16:
        return f(half{});
    case dtype::bf16:
        return f(bf16{});
    default:
        throw std::invalid_argument("unison: dtype " + std::string(to_string(t)) +
                                    " is not a floating-point type");
    }
}

template <class D, class S>
using convert_compute_t =
    std::conditional_t<std::is_same_v<D, double> || std::is_same_v<S, double>, double, float>;

/// Widens `v` to the compute type `A` (16-bit types go through float).
template <class A, class S>
UNISON_HOST_DEVICE constexpr A load_as(S v) noexcept {
    if constexpr (std::is_same_v<S, half> || std::is_same_v<S, bf16>) {
        return static_cast<A>(static_cast<float>(v));
    } else {
        return static_cast<A>(v);
    }
}
/// Rounds `v` to `D` once (from double to a 16-bit type through float, which is exact
/// for values that came from float arithmetic and otherwise double-rounds by at
/// most one unit; the reducer only narrows double to 16 bits when asked to).
template <class D, class A>
UNISON_HOST_DEVICE constexpr D store_as(A v) noexcept {
    if constexpr (std::is_same_v<D, half> || std::is_same_v<D, bf16>) {
        return static_cast<D>(static_cast<float>(v));
    } else {
        return static_cast<D>(v);
    }
}

/// One element of a scale-and-cast copy: dst = D(A(src) * scale), or with
/// `accumulate` dst = D(A(dst) + A(src) * scale). The element math that the host
/// loops below and the CUDA kernels (kernels/element.hpp) share.
template <class D, class S, class A = convert_compute_t<D, S>>
UNISON_HOST_DEVICE constexpr void scale_cast_element(D& dst, S src, A scale,
                                                     bool accumulate) noexcept {
    const A v = load_as<A>(src) * scale;
    dst = store_as<D>(accumulate ? load_as<A>(dst) + v : v);
}

/// dst[i] = D(A(src[i]) * scale), or with `accumulate` dst[i] = D(A(dst[i]) + A(src[i]) * scale).
template <class D, class S>
void convert_scale_typed(D* dst, const S* src, std::size_t n, double scale, bool accumulate) {
    using A = convert_compute_t<D, S>;
    const A s = static_cast<A>(scale);
    if constexpr (std::is_same_v<D, S>) {
        if (!accumulate && s == A{1}) {
            // x * 1 is exact and the cast is the identity: a copy gives the same bits.
            if (static_cast<const void*>(dst) != static_cast<const void*>(src) && n != 0) {
                std::memcpy(dst, src, n * sizeof(D));
            }
            return;
        }
    }
    constexpr bool d16 = std::is_same_v<D, half> || std::is_same_v<D, bf16>;
    constexpr bool s16 = std::is_same_v<S, half> || std::is_same_v<S, bf16>;
    // Narrowing to 16 bits, and widening half, go in blocks through half_block.hpp's
    // conversions and a float loop the compiler vectorizes (the same bits as
    // scale_cast_element, element for element). bf16 to float is a shift, which the
    // compiler vectorizes in the element loop below by itself.
    if constexpr (std::is_same_v<A, float> && (d16 || std::is_same_v<S, half>)) {
        constexpr std::size_t block = 1024;
        float from[block], to[block];
        for (std::size_t base = 0; base < n; base += block) {
            const std::size_t len = n - base < block ? n - base : block;
            const float* x = nullptr;
            if constexpr (s16) {
                widen_block(src + base, from, len);
                x = from;
            } else {
                x = src + base;
            }
            float* y = nullptr;
            if constexpr (d16) {
                y = to;
            } else {
                y = dst + base;
            }
            if (accumulate) {
                const float* old = nullptr;
                if constexpr (d16) {
                    widen_block(dst + base, to, len);
                    old = to;
                } else {
                    old = dst + base;
                }
                for (std::size_t i = 0; i < len; ++i) {
                    y[i] = old[i] + x[i] * s;
                }
            } else {
                for (std::size_t i = 0; i < len; ++i) {
                    y[i] = x[i] * s;
                }
            }
            if constexpr (d16) {
                narrow_block(to, dst + base, len);
            }
        }
    } else { // else, not a return: nvcc warns of the loop after it as unreachable
        for (std::size_t i = 0; i < n; ++i) {
            scale_cast_element<D, S, A>(dst[i], src[i], s, accumulate);
        }
    }
}

/// Copies `n` elements from `src` (dtype `src_type`) to `dst` (dtype `dst_type`),
/// multiplying by `scale`; with `accumulate`, adds to what `dst` holds. Both types
/// must be floating point. `dst == src` is allowed when the types are equal.
inline void convert_scale(void* dst, dtype dst_type, const void* src, dtype src_type, std::size_t n,
                          double scale = 1.0, bool accumulate = false) {
    visit_floating(dst_type, [&](auto d) {
        using D = decltype(d);
        visit_floating(src_type, [&](auto s) {
            using S = decltype(s);
            convert_scale_typed(static_cast<D*>(dst), static_cast<const S*>(src), n, scale,
                                accumulate);
        });
    });
}

/// Sets `n` elements of dtype `type` at `dst` to zero (all-zero bits is +0 in every dtype).
inline void fill_zero(void* dst, dtype type, std::size_t n) noexcept {
    if (n != 0) {
        std::memset(dst, 0, n * size_of(type));
    }
}

} // namespace unison::detail
