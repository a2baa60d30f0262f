#pragma once

/// \file
/// Host implementations of unison's fused kernels, with the same arguments as the
/// CUDA versions (kernels/multi_tensor.cuh, norm.cuh, optimizer.cuh) and the same
/// element math (kernels/element.hpp). The host training paths run these; the GPU
/// tests compare every kernel with them.

#include "unison/core/detail/convert.hpp"
#include "unison/core/dtype.hpp"
#include "unison/kernels/element.hpp"

#include <cstddef>
#include <span>

namespace unison::kernels {

/// One tensor of a multi-tensor copy: `count` elements from `src` to `dst` (dtypes
/// given per call). Packing gradients into a bucket is a list of these with `dst`
/// inside the bucket; unpacking is the same list with the roles swapped.
struct copy_piece {
    const void* src = nullptr;
    void* dst = nullptr;
    std::size_t count = 0;
};

/// One tensor a multi-tensor reduction reads.
struct read_piece {
    const void* data = nullptr;
    std::size_t count = 0;
};

namespace host {

/// For every piece: dst[i] = D(A(src[i]) * scale), or with `accumulate`
/// dst[i] = D(A(dst[i]) + A(src[i]) * scale). Floating-point dtypes only.
inline void multi_scale_cast(std::span<const copy_piece> pieces, dtype dst_type, dtype src_type,
                             double scale = 1.0, bool accumulate = false) {
    for (const copy_piece& p : pieces) {
        unison::detail::convert_scale(p.dst, dst_type, p.src, src_type, p.count, scale, accumulate);
    }
}

/// One tensor: dst = D(A(src) * scale) (average-and-cast after a reduce is
/// scale = 1 / ranks), or accumulated into dst.
inline void scale_cast(void* dst, dtype dst_type, const void* src, dtype src_type, std::size_t n,
                       double scale = 1.0, bool accumulate = false) {
    unison::detail::convert_scale(dst, dst_type, src, src_type, n, scale, accumulate);
}

/// Sum of squares (in double) and non-finite count over every element of `pieces`.
inline norm_stats multi_norm(std::span<const read_piece> pieces, dtype type) {
    norm_stats s;
    unison::detail::visit_floating(type, [&](auto tag) {
        using T = decltype(tag);
        for (const read_piece& p : pieces) {
            const T* x = static_cast<const T*>(p.data);
            for (std::size_t i = 0; i < p.count; ++i) {
                norm_accumulate(s, x[i]);
            }
        }
    });
    return s;
}

/// One optimizer step over the flat shard `s` (see `optimizer_element`).
template <class O, class A, class P, class G, std::size_t Slots>
void optimizer_step(const typename O::template constants<A>& c, const shard_ref<P, G, A, Slots>& s,
                    A grad_scale) {
    static_assert(Slots == O::slots, "unison::kernels::optimizer_step: the shard's state "
                                     "slots must be the optimizer's");
    for (std::size_t i = 0; i < s.count; ++i) {
        optimizer_element<O>(c, s, grad_scale, i);
    }
}

} // namespace host

} // namespace unison::kernels
