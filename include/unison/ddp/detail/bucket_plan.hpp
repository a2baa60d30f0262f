#pragma once

/// \file
/// Bucket assignment: which gradients share a bucket, given an order.

#include "unison/core/dtype.hpp"

#include <algorithm>
#include <cstddef>
#include <map>
#include <vector>

namespace unison::detail {

struct planned_bucket {
    dtype type = dtype::f32;
    std::vector<std::size_t> members; // gradient indices, in layout order
};

/// Walks `order` (gradient indices, first-ready first) and groups gradients of the
/// same reduce dtype into buckets. A bucket closes once it holds at least
/// `first_bytes` (the first bucket of each dtype) or `bytes` (the others). The
/// buckets come back in the order their first gradient appears in `order`, which is
/// the order they are launched in.
inline std::vector<planned_bucket> plan_buckets(const std::vector<std::size_t>& order,
                                                const std::vector<std::size_t>& counts,
                                                const std::vector<dtype>& types,
                                                std::size_t first_bytes, std::size_t bytes) {
    struct open_bucket {
        std::size_t first_position = 0;
        planned_bucket bucket;
        std::size_t filled = 0;
        bool first = true;
    };
    std::map<dtype, open_bucket> open;
    std::vector<std::pair<std::size_t, planned_bucket>> closed;
    for (std::size_t position = 0; position < order.size(); ++position) {
        const std::size_t g = order[position];
        open_bucket& b = open[types[g]];
        if (b.bucket.members.empty()) {
            b.first_position = position;
            b.bucket.type = types[g];
        }
        b.bucket.members.push_back(g);
        b.filled += counts[g] * size_of(types[g]);
        if (b.filled >= (b.first ? first_bytes : bytes)) {
            closed.emplace_back(b.first_position, std::move(b.bucket));
            b.bucket = planned_bucket{};
            b.filled = 0;
            b.first = false;
        }
    }
    for (auto& [type, b] : open) {
        if (!b.bucket.members.empty()) {
            closed.emplace_back(b.first_position, std::move(b.bucket));
        }
    }
    std::stable_sort(closed.begin(), closed.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    std::vector<planned_bucket> result;
    result.reserve(closed.size());
    for (auto& [position, b] : closed) {
        result.push_back(std::move(b));
    }
    return result;
}

} // namespace unison::detail
