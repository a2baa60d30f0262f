#pragma once

/// \file
/// The coalesced path: a bucket is reduced straight between its gradients, as one
/// buffer made of pieces (all_reduce_coalesced), so neither a copy into a bucket nor
/// one back costs a pass over memory, and buckets need no memory. The division, where
/// it is by the number of ranks alone, is fused into the reduction (avg).
///
/// It applies to the default hook over a communicator that reduces pieces in place
/// (the thread and MPI backends), with host gradients each already in its reduce
/// dtype and no two sharing memory (one tensor registered twice would be reduced
/// twice). A custom hook sees a bucket, so it gets the packed path. See
/// paths/path.hpp.

#include "unison/comm/collectives.hpp"
#include "unison/comm/detail/validate.hpp"
#include "unison/ddp/detail/paths/path.hpp"

#include <algorithm>
#include <cstddef>
#include <span>
#include <vector>

namespace unison::detail {

class coalesced_path {
public:
    static constexpr reducer_path kind = reducer_path::coalesced;

    /// Whether gradients `entries`, placed by `place`, can be reduced where they are.
    static bool applies(std::span<const reducer_entry> entries, const placement& place) {
        if (place.on_device()) {
            return false;
        }
        std::vector<buffer> grads;
        for (const reducer_entry& e : entries) {
            if (!e.grad.location.is_host() || e.grad.type != e.bucket_type) {
                return false;
            }
            grads.push_back(e.grad);
        }
        return !any_overlap(grads);
    }

    void lay_out(const path_state& now, std::span<const reducer_entry> /*before*/) {
        std::vector<std::vector<buffer>> pieces(now.buckets.size());
        for (std::size_t k = 0; k < now.buckets.size(); ++k) {
            for (std::size_t g : now.buckets[k].members) {
                pieces[k].push_back(now.entries[g].grad);
            }
        }
        std::vector<bool> averaged(now.buckets.size(), false);
        pieces_ = std::move(pieces);
        averaged_ = std::move(averaged);
    }
    std::byte* memory(std::size_t) const noexcept { return nullptr; }

    /// The gradient is reduced where it is, and the result overwrites it in any case.
    void ready(const path_state& s, const reducer_entry& e, const step_scales& scales) {
        if (e.zero) {
            s.place.zero(e.grad.data, e.grad.type, e.grad.count);
        } else if (scales.pre != 1.0) {
            s.place.scale_cast(e.grad.data, e.grad.type, e.grad.data, e.grad.type, e.grad.count,
                               scales.pre);
        }
    }

    /// `Hook` is the default all_reduce_hook (see the file comment): its sum, over
    /// the pieces.
    template <class Comm, class Hook>
    typename Comm::request_type launch(const path_state&, std::size_t k, Comm& comm, Hook&,
                                       const step_scales& scales) {
        averaged_[k] = scales.divides_by_size;
        return all_reduce_coalesced_async(comm, std::span<const buffer>(pieces_[k]),
                                          averaged_[k] ? reduce_op::avg : reduce_op::sum);
    }

    void finish(const path_state& s, std::size_t k, const step_scales& scales) {
        if (averaged_[k] || scales.post == 1.0) {
            return;
        }
        for (const buffer& g : pieces_[k]) {
            s.place.scale_cast(g.data, g.type, g.data, g.type, g.count, scales.post);
        }
    }

    void rebound(const path_state& s, const reducer_entry& e) {
        const std::vector<std::size_t>& members = s.buckets[e.bucket].members;
        for (std::size_t p = 0; p < members.size(); ++p) {
            if (&s.entries[members[p]] == &e) {
                pieces_[e.bucket][p] = e.grad;
            }
        }
    }

private:
    std::vector<std::vector<buffer>> pieces_; ///< per bucket: its gradients, in layout order
    std::vector<bool> averaged_;              ///< per bucket: reduced with avg this step
};

} // namespace unison::detail
