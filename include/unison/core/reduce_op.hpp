#pragma once

#include <cstdint>
#include <string_view>

namespace unison {

/// Element-wise reduction applied by all_reduce, reduce and reduce_scatter.
/// `avg` is the sum divided by the number of ranks, computed in the element type's
/// accumulation precision (float for f16/bf16) and rounded once.
enum class reduce_op : std::uint8_t { sum, prod, min, max, avg };

/// The lower-case name of `op`, as printed by the benchmark and in errors.
constexpr std::string_view to_string(reduce_op op) noexcept {
    switch (op) {
    case reduce_op::sum:
        return "sum";
    case reduce_op::prod:
        return "prod";
    case reduce_op::min:
        return "min";
    case reduce_op::max:
        return "max";
    case reduce_op::avg:
        return "avg";
    }
    return "?";
}

} // namespace unison
