#pragma once

/// \file
/// What the bucketed reducer's data paths share, and what a path is.
///
/// `bucketed_reducer` (ddp/bucketed_reducer.hpp) schedules: it registers the
/// gradients, lays them out into buckets, counts each bucket's gradients as they
/// become ready, launches complete buckets in bucket order, polls, waits and traces.
/// A data path moves the values: where a bucket's values are while it is reduced,
/// how they get there, and how the result gets back. The reducer picks one path at
/// start() and keeps it:
///
/// | path            | file              | a bucket's values during the reduction     |
/// |-----------------|-------------------|--------------------------------------------|
/// | packed          | packed.hpp        | a copy in bucket memory, cast and scaled    |
/// |                 |                   | into it gradient by gradient                |
/// | coalesced       | coalesced.hpp     | the gradients themselves, reduced in place  |
/// |                 |                   | as one buffer; no bucket memory             |
/// | in_buckets      | in_buckets.hpp    | bucket memory, which is the gradient        |
/// |                 |                   | (policy::gradients_in_buckets)              |
/// | device_packed   | device_packed.hpp | a copy in device memory, packed and         |
/// |                 |                   | unpacked by multi-tensor kernels            |
///
/// A path is a movable class with
///
///     static constexpr reducer_path kind;
///     // The buckets are laid out (again) as `now` says: take memory for them.
///     // `before` is the current layout's entries, empty the first time. Either
///     // done, or throws having changed nothing.
///     void lay_out(const path_state& now, std::span<const reducer_entry> before);
///     std::byte* memory(std::size_t bucket) const;      // null: no bucket memory
///     // Entry `e` became ready (e.zero: it contributes zero).
///     void ready(const path_state&, const reducer_entry& e, const step_scales&);
///     // Bucket `k` is complete: start its reduction.
///     template <class Comm, class Hook>
///     typename Comm::request_type launch(const path_state&, std::size_t k, Comm&, Hook&,
///                                        const step_scales&);
///     // Bucket `k`'s reduction completed: leave the result where the gradients are.
///     void finish(const path_state&, std::size_t k, const step_scales&);
///     // Entry `e` was pointed at new memory (bucketed_reducer::rebind).
///     void rebound(const path_state&, const reducer_entry& e);
///
/// Element work goes through the placement (parallel/detail/placement.hpp): the same
/// call runs the host loop or enqueues the device kernel.

#include "unison/core/dtype.hpp"
#include "unison/core/tensor.hpp"
#include "unison/ddp/hooks.hpp"
#include "unison/ddp/options.hpp"
#include "unison/parallel/detail/placement.hpp"

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace unison::detail {

/// One registered gradient.
struct reducer_entry {
    buffer grad;
    std::string name;
    dtype bucket_type = dtype::f32; ///< the dtype it is reduced in
    std::size_t bucket = 0;
    std::size_t offset = 0; ///< elements into the bucket
    bool ready = false;     ///< marked in this step (or micro-batch)
    bool zero = false;      ///< contributes zero in this step
};

/// One bucket: its layout, and the reducer's bookkeeping for the current step.
struct reducer_bucket {
    dtype type = dtype::f32;
    std::vector<std::size_t> members; ///< registration indices, in layout order
    std::size_t count = 0;            ///< elements
    std::size_t pending = 0;          ///< members not yet ready in this step
    bool any_zero = false;            ///< a member contributes zero in this step
    std::uint64_t trace_id = 0;       ///< its reduction's span on the timeline, while open
};

/// What a path's steps work on.
struct path_state {
    std::span<const reducer_entry> entries;
    std::span<const reducer_bucket> buckets;
    const placement& place;
    device location; ///< where the gradients are
};

/// This step's factors: `pre` before the reduction, `post` after it. Where
/// `divides_by_size`, the division after the sum is by the number of ranks alone
/// (`pre` is 1), so a path may reduce with avg and skip `post`.
struct step_scales {
    double pre = 1.0;
    double post = 1.0;
    bool divides_by_size = false;
};

/// Where entry `e` is in bucket memory `bucket`.
inline std::byte* slot(std::byte* bucket, const reducer_entry& e) noexcept {
    return bucket + e.offset * size_of(e.bucket_type);
}

/// Writes zero where the members of bucket `k` that contribute nothing in this
/// step sit in its memory `bucket`.
inline void write_zero_members(const path_state& s, std::size_t k, std::byte* bucket) {
    for (std::size_t g : s.buckets[k].members) {
        const reducer_entry& e = s.entries[g];
        if (e.zero) {
            s.place.zero(slot(bucket, e), e.bucket_type, e.grad.count);
        }
    }
}

/// What a hook sees of bucket `k`, whose values are at `memory`.
inline bucket_ref bucket_view(const path_state& s, std::size_t k, std::byte* memory) {
    const reducer_bucket& b = s.buckets[k];
    return bucket_ref{k, buffer{memory, b.count, b.type, s.location}, b.members};
}

/// Uninitialized memory for every bucket of `s`, where `s.place` says.
inline std::vector<flat_buffer> bucket_storage(const path_state& s) {
    std::vector<flat_buffer> storage;
    storage.reserve(s.buckets.size());
    for (const reducer_bucket& b : s.buckets) {
        storage.emplace_back(b.count * size_of(b.type), s.place);
    }
    return storage;
}

} // namespace unison::detail
