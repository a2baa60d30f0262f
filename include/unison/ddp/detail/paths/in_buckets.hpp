#pragma once

/// \file
/// The in-buckets path (policy::gradients_in_buckets): bucket memory is the
/// gradient, on the host or on a device, so nothing is copied in or out. At
/// start() the gradients' values move into the buckets; when the buckets are laid
/// out again they move along. At launch the zero contributions are written into
/// their slots and the pre-division (where there is one) applied in one pass over
/// the bucket; the default hook on the host then reduces with avg where the
/// division is by the number of ranks alone, and any other reduction is followed
/// by one pass of the division where there is one. A gradient's values are thus
/// changed at its bucket's launch, not at its mark_ready.
/// See paths/path.hpp.

#include "unison/comm/collectives.hpp"
#include "unison/ddp/detail/paths/path.hpp"

#include <cstddef>
#include <span>
#include <type_traits>
#include <vector>

namespace unison::detail {

class in_buckets_path {
public:
    static constexpr reducer_path kind = reducer_path::in_buckets;

    /// The first layout takes the gradients' values (the caller may then free or
    /// reuse its own); a later one carries them over from the layout `before`.
    void lay_out(const path_state& now, std::span<const reducer_entry> before) {
        std::vector<flat_buffer> fresh = bucket_storage(now);
        std::vector<bool> averaged(now.buckets.size(), false);
        for (std::size_t g = 0; g < now.entries.size(); ++g) {
            const reducer_entry& e = now.entries[g];
            void* to = slot(fresh[e.bucket].data(), e);
            if (before.empty()) {
                now.place.scale_cast(to, e.bucket_type, e.grad.data, e.grad.type, e.grad.count);
            } else {
                const reducer_entry& from = before[g];
                now.place.scale_cast(to, e.bucket_type, slot(memory(from.bucket), from),
                                     from.bucket_type, e.grad.count);
            }
        }
        now.place.synchronize(); // before the old buckets (or the caller's gradients) go
        storage_ = std::move(fresh);
        averaged_ = std::move(averaged);
    }
    std::byte* memory(std::size_t k) const noexcept { return storage_[k].data(); }

    /// Nothing to move: zeros and the pre-division are written at launch.
    void ready(const path_state&, const reducer_entry&, const step_scales&) {}

    template <class Comm, class Hook>
    typename Comm::request_type launch(const path_state& s, std::size_t k, Comm& comm, Hook& hook,
                                       const step_scales& scales) {
        const reducer_bucket& b = s.buckets[k];
        std::byte* data = memory(k);
        if (b.any_zero) {
            write_zero_members(s, k, data);
        }
        if (scales.pre != 1.0) {
            s.place.scale_cast(data, b.type, data, b.type, b.count, scales.pre);
        }
        s.place.order_before(comm, "bucketed_reducer");
        averaged_[k] = false;
        if constexpr (std::is_same_v<Hook, all_reduce_hook>) {
            if (!s.place.on_device()) {
                // The default hook's sum with the division fused in: no pass after.
                averaged_[k] = scales.divides_by_size;
                return all_reduce_async(comm, buffer{data, b.count, b.type, s.location},
                                        averaged_[k] ? reduce_op::avg : reduce_op::sum);
            }
        }
        return hook.launch(comm, bucket_view(s, k, data));
    }

    void finish(const path_state& s, std::size_t k, const step_scales& scales) {
        if (averaged_[k] || scales.post == 1.0) {
            return;
        }
        const reducer_bucket& b = s.buckets[k];
        s.place.scale_cast(memory(k), b.type, memory(k), b.type, b.count, scales.post);
    }

    /// The bucket is the gradient; the rebound memory is not read.
    void rebound(const path_state&, const reducer_entry&) {}

private:
    std::vector<flat_buffer> storage_;
    std::vector<bool> averaged_; ///< per bucket: reduced with avg this step
};

} // namespace unison::detail
