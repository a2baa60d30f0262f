#pragma once

/// \file
/// The training layer's small bookkeeping collectives (layout checks, a broadcast
/// bucket order) and the layout check that DDP and sharding both run before any of
/// their data moves. A communicator that moves device memory only (NCCL) gets them
/// staged through the training state's device.

#include "unison/comm/collectives.hpp"
#include "unison/comm/communicator.hpp"
#include "unison/core/detail/hash.hpp"
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

/// Collective: `v` reduced with `op` over the ranks, in place.
template <communicator C>
void control_all_reduce(C& comm, const placement& place, std::span<std::int64_t> v, reduce_op op) {
    if constexpr (moves_host_memory<C>) {
        (void)place;
        all_reduce(comm, v, op);
    } else {
        require_control_path(comm, place, "bookkeeping all_reduce");
        flat_buffer d(v.size_bytes(), place);
        place.copy_from_host(d.data(), v.data(), v.size_bytes());
        all_reduce(comm, buffer{d.data(), v.size(), dtype::i64, place.where()}, op);
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

/// Collective, and run before any data moves: like verify_same_layout for a list of
/// entries given by one hash each, but when every rank has as many entries and some
/// differ, a second all-gather finds the first entry that differs and the error
/// names it (`describe(k)` says what entry k is on this rank). One small all-gather
/// when the layouts agree.
template <communicator C, class Describe>
void verify_same_entries(C& comm, const placement& place, std::span<const std::uint64_t> hashes,
                         Describe&& describe, const layout_words& words) {
    std::uint64_t whole = fnv1a64_offset;
    for (const std::uint64_t h : hashes) {
        whole = fnv1a64(&h, sizeof h, whole);
    }
    const auto count = static_cast<std::int64_t>(hashes.size());
    const std::vector<std::int64_t> mine{count, static_cast<std::int64_t>(whole)};
    std::vector<std::int64_t> all(2 * static_cast<std::size_t>(comm.size()));
    control_all_gather(comm, place, std::span<const std::int64_t>(mine),
                       std::span<std::int64_t>(all));
    // Every rank sees the same table, so every rank takes the same branch below.
    bool same = true, same_counts = true;
    for (int r = 0; r < comm.size(); ++r) {
        same_counts = same_counts && all[2 * static_cast<std::size_t>(r)] == count;
        same = same && all[2 * static_cast<std::size_t>(r) + 1] == mine[1];
    }
    if (same && same_counts) {
        return;
    }
    if (!same_counts) {
        verify_same_layout(comm, place, count, whole, words); // throws, naming the count
    }
    std::vector<std::int64_t> each(hashes.begin(), hashes.end());
    std::vector<std::int64_t> table(each.size() * static_cast<std::size_t>(comm.size()));
    control_all_gather(comm, place, std::span<const std::int64_t>(each),
                       std::span<std::int64_t>(table));
    for (std::size_t k = 0; k < each.size(); ++k) {
        for (int r = 0; r < comm.size(); ++r) {
            if (table[static_cast<std::size_t>(r) * each.size() + k] != each[k]) {
                throw mismatch_error(comm.rank(), words.operation,
                                     "entry #" + std::to_string(k) + ", on this rank " +
                                         describe(k) + ", is different on rank " +
                                         std::to_string(r) + ": " + words.rule,
                                     r, words.noun);
            }
        }
    }
}

} // namespace unison::detail
