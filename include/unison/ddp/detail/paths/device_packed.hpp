#pragma once

/// \file
/// The device-packed path: device gradients copied into bucket memory on the same
/// device. Once a bucket is complete, one multi-tensor kernel per gradient dtype
/// among its members packs (casts and pre-scales) them into it on the compute
/// stream, and the communicator's stream is ordered after that; after the
/// reduction one kernel per dtype unpacks it (casting and post-scaling). In a step
/// where some member contributes zero, the others are packed one kernel each and
/// the zeros written after. A gradient
/// is read when its bucket is packed, not when it is marked ready. The kernels'
/// copy tables are built once per layout (and again for a bucket whose gradient is
/// rebound). See paths/path.hpp.

#include "unison/ddp/detail/paths/path.hpp"
#include "unison/kernels/host.hpp"
#include "unison/parallel/detail/device_ops.hpp"

#include <algorithm>
#include <cstddef>
#include <memory>
#include <span>
#include <vector>

namespace unison::detail {

class device_packed_path {
public:
    static constexpr reducer_path kind = reducer_path::device_packed;

    void lay_out(const path_state& now, std::span<const reducer_entry> /*before*/) {
        std::vector<flat_buffer> storage = bucket_storage(now); // values stay in the gradients
        std::vector<std::vector<dtype_plans>> plans;
        for (std::size_t k = 0; k < now.buckets.size(); ++k) {
            plans.push_back(make_plans(now, k, storage[k].data()));
        }
        storage_ = std::move(storage);
        plans_ = std::move(plans);
    }
    std::byte* memory(std::size_t k) const noexcept { return storage_[k].data(); }

    /// Packed with its bucket at launch, in one kernel.
    void ready(const path_state&, const reducer_entry&, const step_scales&) {}

    template <class Comm, class Hook>
    typename Comm::request_type launch(const path_state& s, std::size_t k, Comm& comm, Hook& hook,
                                       const step_scales& scales) {
        const reducer_bucket& b = s.buckets[k];
        std::byte* data = memory(k);
        device_ops& ops = *s.place.ops;
        if (!b.any_zero) {
            for (const dtype_plans& p : plans_[k]) {
                ops.multi_scale_cast(*p.pack, b.type, p.grad_type, scales.pre);
            }
        } else { // the tables cover every member; pack the others one by one
            for (std::size_t g : b.members) {
                const reducer_entry& e = s.entries[g];
                if (!e.zero) {
                    ops.scale_cast(slot(data, e), e.bucket_type, e.grad.data, e.grad.type,
                                   e.grad.count, scales.pre, false);
                }
            }
            write_zero_members(s, k, data);
        }
        s.place.order_before(comm, "bucketed_reducer");
        return hook.launch(comm, bucket_view(s, k, data));
    }

    void finish(const path_state& s, std::size_t k, const step_scales& scales) {
        for (const dtype_plans& p : plans_[k]) {
            s.place.ops->multi_scale_cast(*p.unpack, p.grad_type, s.buckets[k].type, scales.post);
        }
    }

    void rebound(const path_state& s, const reducer_entry& e) {
        plans_[e.bucket] = make_plans(s, e.bucket, memory(e.bucket));
    }

private:
    /// Pack (gradients -> bucket) and unpack (bucket -> gradients) tables for the
    /// members of one gradient dtype.
    struct dtype_plans {
        dtype grad_type;
        std::unique_ptr<device_plan> pack, unpack;
    };

    /// The tables of bucket `k`, whose memory is `data`.
    static std::vector<dtype_plans> make_plans(const path_state& s, std::size_t k,
                                               std::byte* data) {
        const reducer_bucket& b = s.buckets[k];
        std::vector<dtype_plans> plans;
        std::vector<dtype> types;
        for (std::size_t g : b.members) {
            if (std::find(types.begin(), types.end(), s.entries[g].grad.type) == types.end()) {
                types.push_back(s.entries[g].grad.type);
            }
        }
        for (dtype t : types) {
            std::vector<kernels::copy_piece> pack, unpack;
            for (std::size_t g : b.members) {
                const reducer_entry& e = s.entries[g];
                if (e.grad.type == t) {
                    void* at = slot(data, e);
                    pack.push_back({e.grad.data, at, e.grad.count});
                    unpack.push_back({at, e.grad.data, e.grad.count});
                }
            }
            plans.push_back({t, s.place.ops->plan(std::span<const kernels::copy_piece>(pack)),
                             s.place.ops->plan(std::span<const kernels::copy_piece>(unpack))});
        }
        return plans;
    }

    std::vector<flat_buffer> storage_;
    std::vector<std::vector<dtype_plans>> plans_; ///< per bucket
};

} // namespace unison::detail
