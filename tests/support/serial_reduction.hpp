#pragma once

// The one reference reduction of the tests (support/reference.hpp) and of the
// benchmarks' result checks (bench/common/data_pattern.hpp): rank 0's value, then
// each next rank's folded in, in rank order, with plain double or 64-bit integer
// arithmetic. It shares no code with unison's reductions, so that it can check
// them.

#include <unison/core/reduce_op.hpp>

#include <algorithm>
#include <type_traits>

namespace unison::test {

/// `op` over value(0), ..., value(ranks - 1) in double; avg divides the sum by `ranks`.
template <class Value>
double serial_reduce(reduce_op op, int ranks, Value&& value) {
    double acc = value(0);
    for (int r = 1; r < ranks; ++r) {
        const double v = value(r);
        switch (op) {
        case reduce_op::sum:
        case reduce_op::avg:
            acc += v;
            break;
        case reduce_op::prod:
            acc *= v;
            break;
        case reduce_op::min:
            acc = std::min(acc, v);
            break;
        case reduce_op::max:
            acc = std::max(acc, v);
            break;
        }
    }
    return op == reduce_op::avg ? acc / ranks : acc;
}

/// `op` over the integers value(0), ..., value(ranks - 1) of type `I` (a 64-bit
/// integer type): sums and products wrap modulo 2^64, as two's complement does
/// (truncating the result to a narrower dtype then wraps as that dtype would); min
/// and max compare as `I`. avg sums: integer dtypes refuse it before any reduction.
template <class I, class Value>
I serial_reduce_integer(reduce_op op, int ranks, Value&& value) {
    static_assert(std::is_integral_v<I> && sizeof(I) == 8);
    using U = std::make_unsigned_t<I>;
    I acc = value(0);
    for (int r = 1; r < ranks; ++r) {
        const I v = value(r);
        switch (op) {
        case reduce_op::sum:
        case reduce_op::avg:
            acc = static_cast<I>(static_cast<U>(acc) + static_cast<U>(v));
            break;
        case reduce_op::prod:
            acc = static_cast<I>(static_cast<U>(acc) * static_cast<U>(v));
            break;
        case reduce_op::min:
            acc = std::min(acc, v);
            break;
        case reduce_op::max:
            acc = std::max(acc, v);
            break;
        }
    }
    return acc;
}

} // namespace unison::test
