#pragma once

/// \file
/// The packed path: host gradients copied into bucket memory. Each gradient is cast
/// to the reduce dtype and pre-scaled into its slot as it becomes ready (while its
/// values are still in cache), the hook reduces the bucket, and each gradient gets
/// its slot back, cast and post-scaled. Any hook, any dtypes, gradients that share
/// memory. See paths/path.hpp.

#include "unison/ddp/detail/paths/path.hpp"

#include <cstddef>
#include <span>
#include <vector>

namespace unison::detail {

class packed_path {
public:
    static constexpr reducer_path kind = reducer_path::packed;

    void lay_out(const path_state& now, std::span<const reducer_entry> /*before*/) {
        storage_ = bucket_storage(now); // the values stay in the gradients
    }
    std::byte* memory(std::size_t k) const noexcept { return storage_[k].data(); }

    void ready(const path_state& s, const reducer_entry& e, const step_scales& scales) {
        void* to = slot(memory(e.bucket), e);
        if (e.zero) {
            s.place.zero(to, e.bucket_type, e.grad.count);
        } else {
            s.place.scale_cast(to, e.bucket_type, e.grad.data, e.grad.type, e.grad.count,
                               scales.pre);
        }
    }

    template <class Comm, class Hook>
    typename Comm::request_type launch(const path_state& s, std::size_t k, Comm& comm, Hook& hook,
                                       const step_scales& /*scales*/) {
        return hook.launch(comm, bucket_view(s, k, memory(k)));
    }

    void finish(const path_state& s, std::size_t k, const step_scales& scales) {
        for (std::size_t g : s.buckets[k].members) {
            const reducer_entry& e = s.entries[g];
            s.place.scale_cast(e.grad.data, e.grad.type, slot(memory(k), e), e.bucket_type,
                               e.grad.count, scales.post);
        }
    }

    void rebound(const path_state&, const reducer_entry&) {} // read at each step anyway

private:
    std::vector<flat_buffer> storage_;
};

} // namespace unison::detail
