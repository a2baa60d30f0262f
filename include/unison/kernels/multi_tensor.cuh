#pragma once

/// \file
/// Multi-tensor scale-and-cast copies in one launch: packing many gradient tensors
/// into a bucket (scaled, cast to the bucket's dtype), unpacking them back (cast
/// back, scaled, optionally accumulated into what the gradients hold), and the
/// single-tensor average-and-cast that follows a reduction.
///
/// A `multi_tensor_plan` splits the pieces into chunks of `chunk_elements` and
/// keeps the piece and chunk tables in device memory, so a layout used every step
/// (a DDP bucket) is uploaded once and each launch reads it there; one block per
/// chunk, 16-byte accesses where both sides are aligned for them, element by
/// element otherwise (unaligned tensors, odd sizes and the tails).
///
/// The element math is `scale_cast_element` (kernels/element.hpp), which the host
/// versions in kernels/host.hpp run too.

#include "unison/core/detail/convert.hpp"
#include "unison/core/dtype.hpp"
#include "unison/kernels/detail/launch.cuh"
#include "unison/kernels/element.hpp"
#include "unison/kernels/host.hpp"

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace unison::kernels {

namespace detail {

/// Elements one block copies: 32 per thread, enough work to hide a block's start.
inline constexpr std::size_t chunk_elements = 8192;

/// A block's work: elements [begin, begin + chunk_elements) of piece `piece`.
struct chunk {
    std::uint64_t piece;
    std::uint64_t begin;
};

/// Scale-and-cast of elements [0, n) by threads `tid`, `tid + stride`, ...: one
/// vector access of V elements per step where `src` and `dst` are both aligned
/// for it, element by element for the rest.
template <class D, class S, class A>
__device__ inline void scale_cast_range(D* dst, const S* src, std::size_t n, A scale,
                                        bool accumulate, std::size_t tid, std::size_t stride) {
    constexpr int V = vec_width < S >> vec_width<D> ? vec_width<S> : vec_width<D>;
    std::size_t done = 0;
    if (vec_aligned<S, V>(src) && vec_aligned<D, V>(dst)) {
        const std::size_t nv = n / V;
        const auto* sv = reinterpret_cast<const vec<S, V>*>(src);
        auto* dv = reinterpret_cast<vec<D, V>*>(dst);
        for (std::size_t k = tid; k < nv; k += stride) {
            const vec<S, V> a = sv[k];
            vec<D, V> b;
            if (accumulate) {
                b = dv[k];
            }
#pragma unroll
            for (int j = 0; j < V; ++j) {
                unison::detail::scale_cast_element<D, S, A>(b.v[j], a.v[j], scale, accumulate);
            }
            dv[k] = b;
        }
        done = nv * V;
    }
    for (std::size_t i = done + tid; i < n; i += stride) {
        unison::detail::scale_cast_element<D, S, A>(dst[i], src[i], scale, accumulate);
    }
}

template <class D, class S>
__global__ void __launch_bounds__(block_threads)
    multi_scale_cast_kernel(const copy_piece* pieces, const chunk* chunks, compute_t<D, S> scale,
                            bool accumulate) {
    const chunk c = chunks[blockIdx.x];
    const copy_piece p = pieces[c.piece];
    const std::size_t left = p.count - c.begin;
    const std::size_t n = left < chunk_elements ? left : chunk_elements;
    scale_cast_range<D, S, compute_t<D, S>>(static_cast<D*>(p.dst) + c.begin,
                                            static_cast<const S*>(p.src) + c.begin, n, scale,
                                            accumulate, threadIdx.x, blockDim.x);
}

template <class D, class S>
__global__ void __launch_bounds__(block_threads)
    scale_cast_kernel(D* dst, const S* src, std::size_t n, compute_t<D, S> scale, bool accumulate) {
    scale_cast_range<D, S, compute_t<D, S>>(dst, src, n, scale, accumulate,
                                            static_cast<std::size_t>(blockIdx.x) * blockDim.x +
                                                threadIdx.x,
                                            static_cast<std::size_t>(gridDim.x) * blockDim.x);
}

/// Calls `f(D{}, S{})` for the floating-point dtypes `dst` and `src`.
template <class F>
void visit_pair(dtype dst, dtype src, F&& f) {
    unison::detail::visit_floating(
        dst, [&](auto d) { unison::detail::visit_floating(src, [&](auto s) { f(d, s); }); });
}

/// Frees device memory allocated with cudaMallocAsync, ordered on its stream.
struct stream_free {
    cudaStream_t stream;
    void operator()(void* p) const noexcept { cudaFreeAsync(p, stream); }
};

} // namespace detail

/// The device tables of a multi-tensor operation: the pieces and their chunks.
/// Build it once for a layout used every step; it holds pointers, not data, so the
/// tensors must outlive it. Move-only.
class multi_tensor_plan {
public:
    multi_tensor_plan() = default;
    multi_tensor_plan(multi_tensor_plan&& o) noexcept
        : storage_(std::move(o.storage_)), host_(std::move(o.host_)),
          piece_count_(std::exchange(o.piece_count_, 0)),
          chunk_count_(std::exchange(o.chunk_count_, 0)),
          element_count_(std::exchange(o.element_count_, 0)) {}
    multi_tensor_plan& operator=(multi_tensor_plan&& o) noexcept {
        if (this != &o) {
            storage_ = std::move(o.storage_);
            host_ = std::move(o.host_);
            piece_count_ = std::exchange(o.piece_count_, 0);
            chunk_count_ = std::exchange(o.chunk_count_, 0);
            element_count_ = std::exchange(o.element_count_, 0);
        }
        return *this;
    }
    multi_tensor_plan(const multi_tensor_plan&) = delete;
    multi_tensor_plan& operator=(const multi_tensor_plan&) = delete;

    /// Tables for `pieces` (copies, or reads with `dst` null), uploaded to the
    /// current device; returns once they are there.
    explicit multi_tensor_plan(std::span<const copy_piece> pieces) {
        build(pieces);
        if (chunk_count_ == 0) {
            return;
        }
        void* p = nullptr;
        UNISON_CHECK_CUDA(cudaMalloc(&p, host_.size()), -1, "multi_tensor_plan");
        storage_.reset(p);
        // Complete before returning: a plain cudaMemcpy from pageable memory may return
        // before its DMA lands, and launches on non-blocking streams would not wait.
        UNISON_CHECK_CUDA(
            cudaMemcpyAsync(p, host_.data(), host_.size(), cudaMemcpyHostToDevice, nullptr), -1,
            "multi_tensor_plan");
        UNISON_CHECK_CUDA(cudaStreamSynchronize(nullptr), -1, "multi_tensor_plan");
        host_.clear();
        host_.shrink_to_fit();
    }
    /// Tables for tensors that are only read (the multi-tensor norm).
    explicit multi_tensor_plan(std::span<const read_piece> pieces)
        : multi_tensor_plan(as_copies(pieces)) {}

    std::size_t piece_count() const noexcept { return piece_count_; }
    /// Blocks a launch over this plan uses (one per chunk).
    std::size_t chunk_count() const noexcept { return chunk_count_; }
    std::size_t element_count() const noexcept { return element_count_; }
    const copy_piece* device_pieces() const noexcept {
        return static_cast<const copy_piece*>(storage_.get());
    }
    const detail::chunk* device_chunks() const noexcept {
        return reinterpret_cast<const detail::chunk*>(
            static_cast<const std::byte*>(storage_.get()) + piece_count_ * sizeof(copy_piece));
    }

    /// Builds the tables into host memory only (for one-shot launches, which upload
    /// them stream-ordered). `bytes()` is their size.
    static multi_tensor_plan host_only(std::span<const copy_piece> pieces) {
        multi_tensor_plan p;
        p.build(pieces);
        return p;
    }
    const std::vector<std::byte>& host_tables() const noexcept { return host_; }

private:
    struct cuda_free {
        void operator()(void* p) const noexcept { cudaFree(p); }
    };

    static std::vector<copy_piece> as_copies(std::span<const read_piece> pieces) {
        std::vector<copy_piece> c;
        c.reserve(pieces.size());
        for (const read_piece& r : pieces) {
            c.push_back({r.data, nullptr, r.count});
        }
        return c;
    }

    void build(std::span<const copy_piece> pieces) {
        std::vector<detail::chunk> chunks;
        for (std::size_t k = 0; k < pieces.size(); ++k) {
            for (std::size_t b = 0; b < pieces[k].count; b += detail::chunk_elements) {
                chunks.push_back({k, b});
            }
            element_count_ += pieces[k].count;
        }
        piece_count_ = pieces.size();
        chunk_count_ = chunks.size();
        host_.resize(pieces.size() * sizeof(copy_piece) + chunks.size() * sizeof(detail::chunk));
        if (!pieces.empty()) {
            std::memcpy(host_.data(), pieces.data(), pieces.size() * sizeof(copy_piece));
        }
        if (!chunks.empty()) {
            std::memcpy(host_.data() + pieces.size() * sizeof(copy_piece), chunks.data(),
                        chunks.size() * sizeof(detail::chunk));
        }
    }

    std::unique_ptr<void, cuda_free> storage_;
    std::vector<std::byte> host_;
    std::size_t piece_count_ = 0;
    std::size_t chunk_count_ = 0;
    std::size_t element_count_ = 0;
};

namespace detail {

template <class D, class S>
void launch_multi_scale_cast(const copy_piece* pieces, const chunk* chunks, std::size_t n_chunks,
                             double scale, bool accumulate, cudaStream_t stream) {
    // gridDim.x may be up to 2^31 - 1 blocks: 17 trillion elements per launch.
    if (n_chunks > 0x7fffffffu) {
        throw std::length_error("unison::kernels::multi_scale_cast: more than 2^31 - 1 chunks");
    }
    multi_scale_cast_kernel<D, S><<<static_cast<unsigned>(n_chunks), block_threads, 0, stream>>>(
        pieces, chunks, static_cast<compute_t<D, S>>(scale), accumulate);
    check_launch("multi_scale_cast");
}

} // namespace detail

/// For every piece of `plan`: dst = D(A(src) * scale), or with `accumulate`
/// dst = D(A(dst) + A(src) * scale); one launch on `stream`.
inline void multi_scale_cast(const multi_tensor_plan& plan, dtype dst_type, dtype src_type,
                             double scale, bool accumulate, cudaStream_t stream) {
    if (plan.chunk_count() == 0) {
        return;
    }
    detail::visit_pair(dst_type, src_type, [&](auto d, auto s) {
        detail::launch_multi_scale_cast<decltype(d), decltype(s)>(
            plan.device_pieces(), plan.device_chunks(), plan.chunk_count(), scale, accumulate,
            stream);
    });
}

/// One-shot form: the tables are uploaded and freed in stream order around the
/// one launch (cudaMallocAsync / cudaFreeAsync), so `pieces` may change freely
/// from call to call.
inline void multi_scale_cast(std::span<const copy_piece> pieces, dtype dst_type, dtype src_type,
                             double scale, bool accumulate, cudaStream_t stream) {
    const multi_tensor_plan plan = multi_tensor_plan::host_only(pieces);
    if (plan.chunk_count() == 0) {
        return;
    }
    const std::vector<std::byte>& tables = plan.host_tables();
    void* p = nullptr;
    UNISON_CHECK_CUDA(cudaMallocAsync(&p, tables.size(), stream), -1, "multi_scale_cast");
    std::unique_ptr<void, detail::stream_free> owned(p, detail::stream_free{stream});
    // From pageable memory: returns once `tables` has been staged, so it may go.
    UNISON_CHECK_CUDA(
        cudaMemcpyAsync(p, tables.data(), tables.size(), cudaMemcpyHostToDevice, stream), -1,
        "multi_scale_cast");
    const auto* dev_pieces = static_cast<const copy_piece*>(p);
    const auto* dev_chunks = reinterpret_cast<const detail::chunk*>(
        static_cast<const std::byte*>(p) + plan.piece_count() * sizeof(copy_piece));
    detail::visit_pair(dst_type, src_type, [&](auto d, auto s) {
        detail::launch_multi_scale_cast<decltype(d), decltype(s)>(
            dev_pieces, dev_chunks, plan.chunk_count(), scale, accumulate, stream);
    });
}

/// Packs `grads` (dtype `grad_type`) back to back into `bucket` (dtype
/// `bucket_type`), each multiplied by `scale`: one launch.
inline void pack(std::span<const read_piece> grads, dtype grad_type, void* bucket,
                 dtype bucket_type, double scale, cudaStream_t stream) {
    std::vector<copy_piece> pieces;
    pieces.reserve(grads.size());
    std::size_t offset = 0;
    for (const read_piece& g : grads) {
        pieces.push_back(
            {g.data, static_cast<std::byte*>(bucket) + offset * size_of(bucket_type), g.count});
        offset += g.count;
    }
    multi_scale_cast(pieces, bucket_type, grad_type, scale, false, stream);
}

/// The reverse of `pack`: slices of `bucket` cast back into `grads`, multiplied by
/// `scale`, added to what the gradients hold with `accumulate`: one launch.
inline void unpack(const void* bucket, dtype bucket_type, std::span<const copy_piece> grads,
                   dtype grad_type, double scale, bool accumulate, cudaStream_t stream) {
    std::vector<copy_piece> pieces;
    pieces.reserve(grads.size());
    std::size_t offset = 0;
    for (const copy_piece& g : grads) {
        pieces.push_back({static_cast<const std::byte*>(bucket) + offset * size_of(bucket_type),
                          g.dst, g.count});
        offset += g.count;
    }
    multi_scale_cast(pieces, grad_type, bucket_type, scale, accumulate, stream);
}

/// One tensor: dst = D(A(src) * scale), or accumulated into dst; grid-stride.
inline void scale_cast(void* dst, dtype dst_type, const void* src, dtype src_type, std::size_t n,
                       double scale, bool accumulate, cudaStream_t stream) {
    if (n == 0) {
        return;
    }
    detail::visit_pair(dst_type, src_type, [&](auto d, auto s) {
        using D = decltype(d);
        using S = decltype(s);
        constexpr int V = detail::vec_width < S >> detail::vec_width<D> ? detail::vec_width<S>
                                                                        : detail::vec_width<D>;
        detail::scale_cast_kernel<D, S>
            <<<detail::grid_blocks(n, V), detail::block_threads, 0, stream>>>(
                static_cast<D*>(dst), static_cast<const S*>(src), n,
                static_cast<compute_t<D, S>>(scale), accumulate);
        detail::check_launch("scale_cast");
    });
}

/// Fused average-and-cast after a sum-reduction over `ranks` ranks:
/// dst = D(A(reduced) / ranks), e.g. an f32 reduction buffer into bf16 gradients.
inline void average_cast(void* dst, dtype dst_type, const void* reduced, dtype reduced_type,
                         std::size_t n, int ranks, cudaStream_t stream) {
    scale_cast(dst, dst_type, reduced, reduced_type, n, 1.0 / static_cast<double>(ranks), false,
               stream);
}

} // namespace unison::kernels
