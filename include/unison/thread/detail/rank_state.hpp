#pragma once

/// \file
/// What one rank of a thread communicator owns, and how it runs a call. For a
/// collective, every rank publishes its call in its group's slot for the call
/// (thread_group::entry), meets the others at the barrier, checks that all the calls
/// match, moves its own share of the data (host_collectives.hpp, or the attached
/// device_mover) and meets them again. A wait at the barrier ends when the world has
/// failed, a peer returned without calling, or the timeout passed; the latter two
/// abort the world, so that every peer stops too. Send and recv go through the
/// group's mailbox instead (p2p.hpp).

#include "unison/comm/collective.hpp"
#include "unison/comm/detail/matching.hpp"
#include "unison/comm/detail/trace.hpp"
#include "unison/comm/options.hpp"
#include "unison/core/detail/clock.hpp"
#include "unison/core/error.hpp"
#include "unison/core/tensor.hpp"
#include "unison/thread/detail/device_mover.hpp"
#include "unison/thread/detail/host_collectives.hpp"
#include "unison/thread/detail/p2p.hpp"
#include "unison/thread/detail/phase_barrier.hpp"
#include "unison/thread/detail/progress_engine.hpp"
#include "unison/thread/detail/thread_group.hpp"

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace unison::detail {

/// Everything one rank of a thread communicator owns; heap-allocated so that the
/// worker thread's reference survives moves of the communicator.
class thread_rank_state {
public:
    thread_rank_state(std::shared_ptr<thread_group> g, int r, comm_options o)
        : group(std::move(g)), rank(r), options(o), p2p(*group, r, o.timeout),
          engine([this](const collective_call& c, collective_span* s) { run(c, s); }),
          host(group->size) {}

    /// Runs `call` to completion on the calling thread; `span`, its span on the
    /// timeline, is marked when every peer has arrived.
    void run(const collective_call& call, collective_span* span = nullptr) {
        if (call.op == operation::send || call.op == operation::recv) {
            check_host(call);
            return call.op == operation::send ? p2p.send(engine, call) : p2p.recv(call);
        }
        if (call.location.is_cuda() && call.op != operation::barrier) {
            return run_device(call, span);
        }
        check_host(call);
        const std::uint64_t seq = sequence++;
        rank_entry& mine = group->entry(seq, rank);
        mine.call = call;
        mine.signature = signature_of(call);
        arrive(call.op, seq);
        if (span != nullptr) {
            span->step("peers arrived");
        }
        check_matching(call.op, seq);
        if (call.op == operation::barrier) {
            return;
        }
        check_locations(call.op, seq);
        host.move(*group, rank, call, seq);
        arrive(call.op, seq);
    }

    /// `call` on device memory, through the attached device mover (see
    /// device_mover.hpp for the protocol).
    void run_device(const collective_call& call, collective_span* span = nullptr) {
        if (!mover) {
            throw argument_error(rank, to_string(call.op),
                                 "the data is on " + to_string(call.location) +
                                     " and no device is attached to this thread communicator: "
                                     "call unison::cuda::use_device(comm, device) (from "
                                     "unison/thread/device.cuh, in a .cu file) first");
        }
        if (call.location.index != mover->device()) {
            throw argument_error(
                rank, to_string(call.op),
                "the data is on " + to_string(call.location) +
                    " and this rank is attached to cuda:" + std::to_string(mover->device()));
        }
        const std::uint64_t seq = sequence++;
        rank_entry& mine = group->entry(seq, rank);
        mine.call = call;
        mine.signature = signature_of(call);
        mine.ready_event = mover->record_ready();
        arrive(call.op, seq);
        if (span != nullptr) {
            span->step("peers arrived");
        }
        check_matching(call.op, seq);
        check_locations(call.op, seq);
        const int n = group->size;
        calls.resize(static_cast<std::size_t>(n));
        events.resize(static_cast<std::size_t>(n));
        for (int q = 0; q < n; ++q) {
            calls[static_cast<std::size_t>(q)] = &group->entry(seq, q).call;
            events[static_cast<std::size_t>(q)] = group->entry(seq, q).ready_event;
        }
        mover->move(calls.data(), events.data(), rank, n);
        mine.done_event = mover->record_done();
        arrive(call.op, seq);
        for (int q = 0; q < n; ++q) {
            events[static_cast<std::size_t>(q)] = group->entry(seq, q).done_event;
        }
        mover->wait_peers(events.data(), n);
        mover->synchronize(rank, operation_label(call.op, seq), options.timeout);
    }

    /// Splits this group; every rank of it calls split.
    std::shared_ptr<thread_group> split(int color, int key, int& new_rank) {
        if (color < 0) {
            throw argument_error(rank, "split",
                                 "color " + std::to_string(color) +
                                     " is negative; every rank needs a group");
        }
        const std::uint64_t seq = sequence++;
        rank_entry& mine = group->entry(seq, rank);
        mine.call = collective_call{};
        mine.color = color;
        mine.key = key;
        mine.split_result.reset();
        arrive(operation::barrier, seq);
        // Members of my color, ordered by (key, old rank); the first one creates the group.
        std::vector<int> members;
        for (int q = 0; q < group->size; ++q) {
            if (group->entry(seq, q).color == color) {
                members.push_back(q);
            }
        }
        std::stable_sort(members.begin(), members.end(), [&](int a, int b) {
            return group->entry(seq, a).key < group->entry(seq, b).key;
        });
        new_rank =
            static_cast<int>(std::find(members.begin(), members.end(), rank) - members.begin());
        if (new_rank == 0) {
            std::vector<int> world_members;
            for (int q : members) {
                world_members.push_back(group->world_ranks[static_cast<std::size_t>(q)]);
            }
            mine.split_result =
                std::make_shared<thread_group>(std::move(world_members), group->world);
        }
        arrive(operation::barrier, seq);
        std::shared_ptr<thread_group> result = group->entry(seq, members.front()).split_result;
        arrive(operation::barrier, seq); // nobody reuses the slot before all have read it
        return result;
    }

    std::shared_ptr<thread_group> group;
    const int rank;
    const comm_options options;
    std::uint64_t sequence = 0; ///< collectives issued so far
    p2p_endpoint p2p;           ///< sends and recvs
    /// Moves device data (unison::cuda::use_device); declared before the engine so that
    /// the engine's thread has stopped before it is destroyed.
    std::unique_ptr<device_mover> mover;
    progress_engine engine;

private:
    [[noreturn]] void fail(operation op, std::uint64_t seq, const std::string& what) const {
        throw error(rank, operation_label(op, seq), what);
    }

    void check_host(const collective_call& call) const {
        if (!call.location.is_host()) {
            throw argument_error(rank, to_string(call.op),
                                 "the thread backend's send and recv take host memory, and the "
                                 "data is on " +
                                     to_string(call.location));
        }
    }

    int world_rank(int r) const { return group->world_ranks[static_cast<std::size_t>(r)]; }

    /// A peer that left its function or a world that failed stops every wait.
    bool stop_requested(std::uint64_t phase) const {
        if (group->world->aborted.load(std::memory_order_acquire)) {
            return true;
        }
        for (int q = 0; q < group->size; ++q) {
            if (!group->barrier.has_arrived(q, phase) &&
                group->world->exited[static_cast<std::size_t>(world_rank(q))].load()) {
                return true;
            }
        }
        return false;
    }

    [[noreturn]] void throw_stopped(operation op, std::uint64_t seq, std::uint64_t phase) {
        const std::string label = operation_label(op, seq);
        if (!group->world->aborted.load(std::memory_order_acquire)) {
            for (int q = 0; q < group->size; ++q) {
                if (!group->barrier.has_arrived(q, phase) &&
                    group->world->exited[static_cast<std::size_t>(world_rank(q))].load()) {
                    const std::string what =
                        "rank " + std::to_string(q) + " returned without calling this collective";
                    // The departed rank is the cause: peers woken by the abort name it.
                    group->world->abort(world_rank(q), label + ": " + what);
                    throw peer_error(rank, label, what, q);
                }
            }
        }
        std::string cause;
        int cause_rank = -1;
        {
            std::lock_guard lock(group->world->mutex);
            cause = group->world->cause;
            cause_rank = group->world->cause_rank;
        }
        throw peer_error(rank, label,
                         "stopped because world rank " + std::to_string(cause_rank) +
                             " failed: " + cause,
                         cause_rank);
    }

    void arrive(operation op, std::uint64_t seq) {
        const std::uint64_t phase = group->barrier.next_phase();
        // Once the world has failed, arrive nowhere: a rank stopped in an earlier
        // phase left its arrival counted there, so a fresh arrival could complete
        // that phase with a rank missing and read its stale slot.
        if (group->world->aborted.load(std::memory_order_acquire)) {
            throw_stopped(op, seq, phase);
        }
        const auto deadline = clock::now() + options.timeout;
        const wait_result r =
            group->barrier.arrive_and_wait(rank, deadline, [&] { return stop_requested(phase); });
        if (r == wait_result::done) {
            return;
        }
        if (r == wait_result::stopped) {
            throw_stopped(op, seq, phase);
        }
        std::string missing;
        for (int q = 0; q < group->size; ++q) {
            if (!group->barrier.has_arrived(q, phase)) {
                missing += (missing.empty() ? "" : ", ") + std::to_string(q);
            }
        }
        const std::string label = operation_label(op, seq);
        const std::string what = "timed out after " + std::to_string(options.timeout.count()) +
                                 " ms waiting for rank(s) " +
                                 (missing.empty() ? std::string("?") : missing);
        group->world->abort(world_rank(rank),
                            "rank " + std::to_string(rank) + ": " + label + ": " + what);
        throw timeout_error(rank, label, what, seq);
    }

    /// Every rank's data must be where rank 0's is (host memory, or the same CUDA
    /// device: the device kernels read the peers' buffers directly, without peer
    /// access between GPUs): checked by every rank, before any data moves.
    void check_locations(operation op, std::uint64_t seq) {
        const device ref = group->entry(seq, 0).call.location;
        for (int q = 1; q < group->size; ++q) {
            const device d = group->entry(seq, q).call.location;
            if (d != ref) {
                throw mismatch_error(rank, operation_label(op, seq),
                                     "rank " + std::to_string(q) + " passes data on " +
                                         to_string(d) + " and rank 0 on " + to_string(ref) +
                                         "; the thread backend needs every rank's data in one "
                                         "place (host memory, or one GPU)",
                                     q, "device");
            }
        }
    }

    /// Every rank compares every published call with rank 0's, so all ranks throw
    /// the same error at the same point and no data has moved.
    void check_matching(operation op, std::uint64_t seq) {
        const call_signature& ref = group->entry(seq, 0).signature;
        for (int q = 1; q < group->size; ++q) {
            check_signature(rank, operation_label(op, seq), 0, ref, q,
                            group->entry(seq, q).signature);
        }
    }

    host_mover host; ///< moves host data
    std::vector<const collective_call*> calls;
    std::vector<void*> events;
};

} // namespace unison::detail
