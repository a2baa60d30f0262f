#pragma once

/// \file
/// State shared by the ranks of one thread communicator: the world's failure
/// status, the slots through which ranks publish their calls, the barrier, and the
/// mailbox for send/recv.

#include "unison/comm/collective.hpp"
#include "unison/comm/detail/matching.hpp"
#include "unison/thread/detail/phase_barrier.hpp"

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace unison::detail {

/// Failure status of one `thread_world::run`, shared by the world and every
/// communicator split from it.
struct world_status {
    explicit world_status(int ranks)
        : exited(std::make_unique<std::atomic<bool>[]>(static_cast<std::size_t>(ranks))) {
        for (int r = 0; r < ranks; ++r) {
            exited[static_cast<std::size_t>(r)].store(false);
        }
    }

    /// Records the first failure; later ones are consequences and are ignored.
    void abort(int world_rank, const std::string& what) {
        std::lock_guard lock(mutex);
        if (!aborted.load()) {
            cause_rank = world_rank;
            cause = what;
            aborted.store(true, std::memory_order_release);
        }
    }

    std::atomic<bool> aborted{false};
    std::mutex mutex;
    int cause_rank = -1;
    std::string cause;
    /// exited[r]: world rank r returned from its function.
    std::unique_ptr<std::atomic<bool>[]> exited;
};

struct thread_group;

/// What one rank published for one collective.
struct alignas(64) rank_entry {
    collective_call call;
    /// The call's signature, computed by the rank that published it: the others
    /// compare it without reading the publisher's arrays (all_gatherv's counts, a
    /// coalesced call's pieces), which a rank that has thrown on a mismatch may have
    /// freed by the time a slower peer checks.
    call_signature signature;
    int color = 0;               ///< split only
    int key = 0;                 ///< split only
    void* ready_event = nullptr; ///< device data: cudaEvent_t after this rank's inputs
    void* done_event = nullptr;  ///< device data: cudaEvent_t after this rank's share
    std::shared_ptr<thread_group> split_result;
};

/// A send posted by its sender and waiting for the matching recv.
struct posted_send {
    int source;
    int destination;
    int tag;
    const void* data;
    std::size_t count;
    dtype type;
    struct op_record* record; ///< completed by the receiver
};

struct thread_group {
    /// Slots in flight: a rank can be at most one collective ahead of the slowest
    /// (each collective ends in a barrier), so two would do; four leaves margin.
    static constexpr std::uint64_t slot_count = 4;

    thread_group(std::vector<int> members, std::shared_ptr<world_status> status)
        : size(static_cast<int>(members.size())), world_ranks(std::move(members)),
          world(std::move(status)), barrier(size),
          entries(static_cast<std::size_t>(size) * slot_count) {
        posted.reserve(64);
    }

    rank_entry& entry(std::uint64_t sequence, int rank) {
        return entries[(sequence % slot_count) * static_cast<std::size_t>(size) +
                       static_cast<std::size_t>(rank)];
    }

    const int size;
    const std::vector<int> world_ranks; ///< world rank of each rank of this group
    const std::shared_ptr<world_status> world;
    phase_barrier barrier;
    std::vector<rank_entry> entries;

    std::mutex p2p_mutex;
    std::condition_variable p2p_cv;
    std::vector<posted_send> posted;
};

} // namespace unison::detail
