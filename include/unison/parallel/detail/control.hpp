#pragma once

/// \file
/// The training layer's small bookkeeping collectives (layout checks, a broadcast
/// bucket order) and the layout check that DDP and sharding both run before any of
/// their data moves. A communicator that moves device memory only (NCCL) gets them
/// staged through the training state's device.

#include "unison/comm/collectives.hpp"
#include "unison/comm/communicator.hpp"
#include "unison/core/error.hpp"
#include "unison/parallel/detail/placement.hpp"

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace unison::detail {

/// Throws unless `C` can move host memory or `place` has a device to stage through.
template <class C>
void require_control_path(C& comm, const placement& place, const std::string& operation) {
    if (!moves_host_memory<C> && !place.on_device()) {
        throw argument_error(comm.rank(), operation,
                             "this communicator moves device memory only and the training state "
                             "is in host memory: put it on the communicator's device first "
                             "(unison::cuda::use_device)");
    }
}

/// Collective: every rank's `mine` into `all` (rank r's at r * mine.size()).
template <communicator C>
void control_all_gather(C& comm, const placement& place, std::span<const std::int64_t> mine,
                        std::span<std::int64_t> all) {
    if constexpr (moves_host_memory<C>) {
        (void)place;
        all_gather(comm, mine, all);
    } else {
        require_control_path(comm, place, "bookkeeping all_gather");
        flat_buffer in(mine.size_bytes(), place), out(all.size_bytes(), place);
        place.copy_from_host(in.data(), mine.data(), mine.size_bytes());
        all_gather(comm, const_buffer(in.data(), mine.size(), dtype::i64, place.where()),
                   buffer{out.data(), all.size(), dtype::i64, place.where()});
        place.copy_to_host(all.data(), out.data(), all.size_bytes());
    }
}

/// Collective: rank `root`'s `v` into every rank's.
template <communicator C>
void control_broadcast(C& comm, const placement& place, std::span<std::int64_t> v, int root) {
    if constexpr (moves_host_memory<C>) {
        (void)place;
        broadcast(comm, v, root);
    } else {
        require_control_path(comm, place, "bookkeeping broadcast");
        flat_buffer d(v.size_bytes(), place);
        place.copy_from_host(d.data(), v.data(), v.size_bytes());
        broadcast(comm, buffer{d.data(), v.size(), dtype::i64, place.where()}, root);
        place.copy_to_host(v.data(), d.data(), v.size_bytes());
    }
}

/// How a layout check names what it compares, for its error message.
struct layout_words {
    const char* operation; ///< "ddp start"
    const char* verb;      ///< "registered"
    const char* noun;      ///< "gradients"
    const char* differ;    ///< "of different sizes or dtypes"
    const char* rule;      ///< "every rank must register the same gradients in the same order"
};

/// Collective, and run before any data of the layout moves: compares this rank's
/// (`count`, `hash`) with every rank's and throws the same kind of mismatch_error on
/// every rank, naming the first rank that differs from this one. (A size mismatch
/// found only by the data's own collective would be a truncation error or a hang.)
template <communicator C>
void verify_same_layout(C& comm, const placement& place, std::int64_t count, std::uint64_t hash,
                        const layout_words& words) {
    const std::vector<std::int64_t> mine{count, static_cast<std::int64_t>(hash)};
    std::vector<std::int64_t> all(2 * static_cast<std::size_t>(comm.size()));
    control_all_gather(comm, place, std::span<const std::int64_t>(mine),
                       std::span<std::int64_t>(all));
    for (int r = 0; r < comm.size(); ++r) {
        const std::int64_t n = all[2 * static_cast<std::size_t>(r)];
        const std::int64_t h = all[2 * static_cast<std::size_t>(r) + 1];
        if (n != mine[0] || h != mine[1]) {
            throw mismatch_error(comm.rank(), words.operation,
                                 "rank " + std::to_string(r) + " " + words.verb + " " +
                                     std::to_string(n) + " " + words.noun +
                                     (n == mine[0] ? std::string(" ") + words.differ : "") +
                                     ", this rank " + std::to_string(mine[0]) + ": " + words.rule,
                                 r, words.noun);
        }
    }
}

} // namespace unison::detail
