#pragma once

/// \file
/// Loss normalization across ranks and micro-batches.
///
/// When ranks (or the micro-batches of one accumulation window) hold different
/// numbers of items, averaging per-micro-batch mean losses does not give the
/// gradient of the global mean loss: a micro-batch of 3 tokens weighs as much as one
/// of 300. The fix is to sum each item's loss and divide by the number of items in
/// the whole step, over every rank and micro-batch. `normalize_loss` counts them
/// with one all-reduce and returns the factor to multiply each micro-batch's
/// *summed* loss by, taking the reducer's own averaging into account:
///
///     auto norm = unison::normalize_loss(dp.reducer(), items_in_my_window);
///     for (micro-batch mb in my window) {
///         loss = norm.loss_scale * sum_of_item_losses(mb);   // not the mean
///         backward(loss);
///     }
///     (void)dp.finish(); // gradient == gradient of (sum over all items / global_items)

#include "unison/comm/collectives.hpp"
#include "unison/core/error.hpp"
#include "unison/parallel/detail/control.hpp"

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace unison {

struct loss_normalization {
    /// Items in the step over all ranks and micro-batches.
    std::int64_t global_items = 0;
    /// Multiply this rank's summed per-item losses by this (0 when there are no items).
    double loss_scale = 0.0;
};

/// Collective: all-reduces the number of items and returns the global count. On
/// host memory: over a communicator that moves device memory only (NCCL) use
/// normalize_loss, which counts through the reducer's device.
template <communicator C>
std::int64_t global_item_count(C& comm, std::int64_t local_items) {
    if (local_items < 0) {
        throw argument_error(comm.rank(), "global_item_count",
                             "negative item count " + std::to_string(local_items));
    }
    std::vector<std::int64_t> n{local_items};
    all_reduce(comm, n);
    return n[0];
}

/// Collective: the scale that makes `reducer`'s synchronized gradient equal the
/// gradient of the global mean loss, for a step in which this rank processes
/// `local_items` items in all. Call it after `join::next` when joining. The count
/// goes through the reducer's device where its communicator moves device memory
/// only (NCCL).
template <class Reducer>
loss_normalization normalize_loss(Reducer& reducer, std::int64_t local_items) {
    auto& comm = reducer.communicator();
    if (local_items < 0) {
        throw argument_error(comm.rank(), "normalize_loss",
                             "negative item count " + std::to_string(local_items));
    }
    loss_normalization result;
    result.global_items = local_items;
    detail::control_all_reduce(comm, reducer.placement(),
                               std::span<std::int64_t>(&result.global_items, 1), reduce_op::sum);
    if (result.global_items > 0) {
        result.loss_scale = reducer.averaging_divisor() / static_cast<double>(result.global_items);
    }
    return result;
}

} // namespace unison
