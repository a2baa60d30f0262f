#pragma once

/// \file
/// Communication hooks: what a bucket does once all its gradients are ready.
///
/// A hook is a type with
///
///     template <communicator C>
///     typename C::request_type launch(C& comm, const bucket_ref& bucket);
///
/// and, optionally, `void complete(const bucket_ref& bucket)`, called after the
/// request has been waited on. On entry to `launch`, `bucket.data` holds this rank's
/// gradients (already pre-divided, in the reduce dtype); when `complete` returns it
/// must hold their sum over all ranks. Everything else (casting back into the
/// gradients, the division) the reducer does. The hook is a member of the reducer
/// (`reducer.hook()`), so it can keep state between buckets and steps. Hooks run on
/// the thread that calls `mark_ready` / `finish`.

#include "unison/comm/collectives.hpp"
#include "unison/core/detail/convert.hpp"
#include "unison/core/error.hpp"
#include "unison/core/tensor.hpp"

#include <concepts>
#include <cstddef>
#include <span>
#include <string>
#include <vector>

namespace unison {

/// What a communication hook sees of one bucket.
struct bucket_ref {
    /// The bucket's position in launch order (0 is launched first).
    std::size_t index = 0;
    /// The flat bucket in the reduce dtype.
    buffer data;
    /// The gradients it holds, as registration indices, in the order they are laid out.
    std::span<const std::size_t> gradients;
};

/// The default: one non-blocking in-place all-reduce (sum) of the bucket.
struct all_reduce_hook {
    template <communicator C>
    typename C::request_type launch(C& comm, const bucket_ref& bucket) {
        buffer data = bucket.data;
        return all_reduce_async(comm, data);
    }
};

/// Compression: the bucket is cast to `Wire` (f16 or bf16) into a staging buffer,
/// reduced there, and cast back on completion; the gradients and the bucket keep
/// their own dtype. Like PyTorch's fp16_compress_hook. Host gradients only.
template <dtype Wire>
class compress_hook {
public:
    static_assert(Wire == dtype::f16 || Wire == dtype::bf16,
                  "unison::compress_hook: compress to f16 or bf16");

    template <communicator C>
    typename C::request_type launch(C& comm, const bucket_ref& bucket) {
        if (!bucket.data.location.is_host()) {
            throw argument_error(comm.rank(), "compress_hook",
                                 "the bucket is on " + to_string(bucket.data.location) +
                                     " and this hook casts on the host; for device gradients "
                                     "reduce in 16 bits with policy::reduce_dtype instead");
        }
        if (staging_.size() <= bucket.index) {
            staging_.resize(bucket.index + 1);
        }
        std::vector<std::uint16_t>& wire = staging_[bucket.index];
        wire.resize(bucket.data.count);
        detail::convert_scale(wire.data(), Wire, bucket.data.data, bucket.data.type,
                              bucket.data.count);
        return all_reduce_async(comm, buffer{wire.data(), wire.size(), Wire});
    }

    void complete(const bucket_ref& bucket) {
        detail::convert_scale(bucket.data.data, bucket.data.type, staging_[bucket.index].data(),
                              Wire, bucket.data.count);
    }

private:
    std::vector<std::vector<std::uint16_t>> staging_;
};

/// What a communication hook `H` must do on communicator `C`: launch a bucket's
/// reduction and return its request (see the file comment); `complete` is optional.
template <class H, class C>
concept bucket_hook = communicator<C> && std::move_constructible<H> &&
    requires(H& h, C& comm, const bucket_ref& b) {
    { h.launch(comm, b) } -> std::same_as<typename C::request_type>;
};

namespace detail {
template <class H>
concept completing_hook = requires(H& h, const bucket_ref& b) {
    h.complete(b);
};
} // namespace detail

} // namespace unison
