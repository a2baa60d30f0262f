#pragma once

/// \file
/// The thread backend: N ranks as threads of one process. Collectives work on
/// shared memory: ranks publish their buffers, then each rank reduces (or copies)
/// its own share straight between the peers' buffers -- no central copy and no
/// allocation per call.

#include "unison/comm/communicator.hpp"
#include "unison/comm/detail/matching.hpp"
#include "unison/comm/detail/validate.hpp"
#include "unison/core/detail/host_reduce.hpp"
#include "unison/core/error.hpp"
#include "unison/thread/detail/device_mover.hpp"
#include "unison/thread/detail/progress_engine.hpp"
#include "unison/thread/detail/thread_group.hpp"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

namespace unison {

class thread_communicator;
namespace detail {
class thread_rank_state;
}

/// A pending operation of the thread backend (see the `request` concept).
class [[nodiscard]] thread_request {
public:
    thread_request() = default;
    thread_request(thread_request&& other) noexcept
        : record_(std::exchange(other.record_, nullptr)), state_(other.state_) {}
    thread_request& operator=(thread_request&& other) noexcept {
        if (this != &other) {
            finish_quietly();
            record_ = std::exchange(other.record_, nullptr);
            state_ = other.state_;
        }
        return *this;
    }
    thread_request(const thread_request&) = delete;
    thread_request& operator=(const thread_request&) = delete;
    /// Waits for an operation still in flight (errors are dropped; call wait() to see them).
    ~thread_request() { finish_quietly(); }

    /// Blocks until the operation completes, then rethrows its error, if any.
    void wait();
    /// True once the operation has completed (wait() then returns at once).
    bool test() const noexcept {
        return record_ == nullptr || record_->done.load(std::memory_order_acquire);
    }

private:
    friend class thread_communicator;
    thread_request(detail::op_record* r, detail::thread_rank_state* s) noexcept
        : record_(r), state_(s) {}
    void finish_quietly() noexcept {
        if (record_ != nullptr) {
            try {
                wait();
            } catch (...) {
            }
        }
    }

    detail::op_record* record_ = nullptr;
    detail::thread_rank_state* state_ = nullptr;
};

namespace detail {

/// Everything one rank of a thread communicator owns; heap-allocated so that the
/// worker thread's reference survives moves of the communicator.
class thread_rank_state {
public:
    thread_rank_state(std::shared_ptr<thread_group> g, int r, comm_options o)
        : group(std::move(g)), rank(r), options(o),
          engine([this](const collective_call& c) { run(c); }),
          inputs(static_cast<std::size_t>(group->size)),
          outputs(static_cast<std::size_t>(group->size)) {}

    /// Runs `call` to completion on the calling thread.
    void run(const collective_call& call) {
        if (call.op == operation::send || call.op == operation::recv) {
            return call.op == operation::send ? run_send(call) : run_recv(call);
        }
        if (call.location.is_cuda() && call.op != operation::barrier) {
            return run_device(call);
        }
        check_host(call);
        const std::uint64_t seq = sequence++;
        rank_entry& mine = group->entry(seq, rank);
        mine.call = call;
        arrive(call.op, seq);
        check_matching(call.op, seq);
        if (call.op == operation::barrier) {
            return;
        }
        check_locations(call.op, seq);
        move_data(call, seq);
        arrive(call.op, seq);
    }

    /// `call` on device memory, through the attached device mover (see
    /// device_mover.hpp for the protocol).
    void run_device(const collective_call& call) {
        if (!mover) {
            throw argument_error(rank, to_string(call.op),
                                 "the data is on " + to_string(call.location) +
                                     " and no device is attached to this thread communicator: "
                                     "call unison::cuda::attach(comm, device) (from "
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
        mine.ready_event = mover->record_ready();
        arrive(call.op, seq);
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
    std::uint64_t sequence = 0;                 ///< collectives issued so far
    std::atomic<std::uint64_t> p2p_sequence{0}; ///< sends and recvs issued so far
    /// Moves device data (unison::cuda::attach); declared before the engine so that
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
        const call_signature ref = signature_of(group->entry(seq, 0).call);
        for (int q = 1; q < group->size; ++q) {
            check_signature(rank, operation_label(op, seq), 0, ref, q,
                            signature_of(group->entry(seq, q).call));
        }
    }

    /// Out-of-place outputs at least this large are written with non-temporal stores:
    /// they exceed the caches, and skipping the destination's read-for-ownership saves
    /// a third of the memory traffic. In place, the lines were just read and are in
    /// cache, so plain stores win (both measured in docs/performance.md).
#ifndef UNISON_THREAD_STREAMING_MIN_BYTES
    static constexpr std::size_t streaming_min_bytes = std::size_t{1} << 20;
#else
    static constexpr std::size_t streaming_min_bytes = UNISON_THREAD_STREAMING_MIN_BYTES;
#endif

    /// Element range [lo, hi) of `count` that `r` reduces: equal shares rounded to
    /// 256 bytes so that no two ranks write the same cache line.
    static void share(std::size_t count, std::size_t elem, int ranks, int r, std::size_t& lo,
                      std::size_t& hi) {
        const std::size_t per_line = std::max<std::size_t>(1, 256 / elem);
        std::size_t per_rank =
            (count + static_cast<std::size_t>(ranks) - 1) / static_cast<std::size_t>(ranks);
        per_rank = (per_rank + per_line - 1) / per_line * per_line;
        lo = std::min(count, per_rank * static_cast<std::size_t>(r));
        hi = std::min(count, lo + per_rank);
    }

    static const std::byte* at(const void* p, std::size_t elements, std::size_t elem) {
        return static_cast<const std::byte*>(p) + elements * elem;
    }
    static std::byte* at(void* p, std::size_t elements, std::size_t elem) {
        return static_cast<std::byte*>(p) + elements * elem;
    }
    static void copy(void* dst, const void* src, std::size_t bytes) {
        if (dst != src && bytes != 0) {
            std::memcpy(dst, src, bytes);
        }
    }

    void move_data(const collective_call& call, std::uint64_t seq) {
        const int n = group->size;
        const std::size_t es = size_of(call.type);
        auto peer = [&](int q) -> const collective_call& { return group->entry(seq, q).call; };
        const int divisor = call.reduction == reduce_op::avg ? n : 1;
        switch (call.op) {
        case operation::all_reduce:
        case operation::reduce: {
            // Reduce my share of everyone's input and write it to every output (all_reduce)
            // or to the root's (reduce).
            std::size_t lo = 0, hi = 0;
            share(call.count, es, n, rank, lo, hi);
            if (lo == hi) {
                return;
            }
            int outs = 0;
            for (int q = 0; q < n; ++q) {
                inputs[static_cast<std::size_t>(q)] = at(peer(q).send, lo, es);
                if (call.op == operation::all_reduce || q == call.root) {
                    outputs[static_cast<std::size_t>(outs++)] = at(peer(q).recv, lo, es);
                }
            }
            host_reduce(call.type, call.reduction, inputs.data(), n, outputs.data(), outs, hi - lo,
                        divisor, call.send != call.recv && call.count * es >= streaming_min_bytes);
            return;
        }
        case operation::reduce_scatter: {
            for (int q = 0; q < n; ++q) {
                inputs[static_cast<std::size_t>(q)] =
                    at(peer(q).send, call.count * static_cast<std::size_t>(rank), es);
            }
            outputs[0] = call.recv;
            host_reduce(call.type, call.reduction, inputs.data(), n, outputs.data(), 1, call.count,
                        divisor);
            return;
        }
        case operation::all_gather:
            for (int q = 0; q < n; ++q) {
                copy(at(call.recv, call.count * static_cast<std::size_t>(q), es), peer(q).send,
                     call.count * es);
            }
            return;
        case operation::all_gatherv: {
            std::size_t offset = 0;
            for (int q = 0; q < n; ++q) {
                const std::size_t c = call.counts[static_cast<std::size_t>(q)];
                copy(at(call.recv, offset, es), peer(q).send, c * es);
                offset += c;
            }
            return;
        }
        case operation::broadcast:
            copy(call.recv, peer(call.root).send, call.count * es);
            return;
        case operation::all_to_all:
            for (int q = 0; q < n; ++q) {
                copy(at(call.recv, call.count * static_cast<std::size_t>(q), es),
                     at(peer(q).send, call.count * static_cast<std::size_t>(rank), es),
                     call.count * es);
            }
            return;
        default:
            return;
        }
    }

    // ------------------------------------------------------------ send / recv

public:
    std::string p2p_label(const collective_call& call) {
        return operation_label(call.op, p2p_sequence++) + " (peer " + std::to_string(call.root) +
               ", tag " + std::to_string(call.tag) + ")";
    }

private:
    bool peer_gone(int peer) const {
        return group->world->aborted.load(std::memory_order_acquire) ||
               group->world->exited[static_cast<std::size_t>(world_rank(peer))].load();
    }

    void run_send(const collective_call& call) {
        check_host(call);
        op_record* r = engine.acquire(call);
        post_send(r);
        finish_send(r, p2p_label(call));
    }

public:
    /// Posts a send at issue time (not on the worker), so that a rank can post a send
    /// and then a recv without deadlocking against a peer doing the same.
    void post_send(op_record* r) {
        {
            std::lock_guard lock(group->p2p_mutex);
            group->posted.push_back(
                {rank, r->call.root, r->call.tag, r->call.send, r->call.count, r->call.type, r});
        }
        group->p2p_cv.notify_all();
    }

    /// Waits until the receiver has taken the send; withdraws it on timeout.
    void finish_send(op_record* r, const std::string& label) {
        const auto deadline = clock::now() + options.timeout;
        const int peer = r->call.root;
        while (!engine.wait(r, std::min(deadline, clock::now() + std::chrono::milliseconds(2)))) {
            const bool late = clock::now() >= deadline;
            if (late || peer_gone(peer)) {
                std::unique_lock lock(group->p2p_mutex);
                auto it = std::find_if(group->posted.begin(), group->posted.end(),
                                       [r](const posted_send& p) { return p.record == r; });
                if (it != group->posted.end()) { // not taken: withdraw it
                    group->posted.erase(it);
                    lock.unlock();
                    engine.release(r);
                    if (late) {
                        throw timeout_error(rank, label,
                                            "not received within " +
                                                std::to_string(options.timeout.count()) + " ms",
                                            p2p_sequence - 1);
                    }
                    throw peer_error(rank, label, "the receiving rank failed or returned", peer);
                }
                // The receiver is copying right now; it completes the record shortly.
            }
        }
        std::exception_ptr e = r->error;
        engine.release(r);
        if (e) {
            std::rethrow_exception(e);
        }
    }

private:
    void run_recv(const collective_call& call) {
        check_host(call);
        const std::string label = p2p_label(call);
        const auto deadline = clock::now() + options.timeout;
        std::unique_lock lock(group->p2p_mutex);
        for (;;) {
            auto it =
                std::find_if(group->posted.begin(), group->posted.end(), [&](const posted_send& p) {
                    return p.destination == rank && p.source == call.root && p.tag == call.tag;
                });
            if (it != group->posted.end()) {
                const posted_send p = *it;
                group->posted.erase(it);
                lock.unlock();
                if (p.count != call.count || p.type != call.type) {
                    const std::string what = "rank " + std::to_string(rank) + " receives " +
                                             describe(call.count, call.type) + " but rank " +
                                             std::to_string(p.source) + " sent " +
                                             describe(p.count, p.type);
                    const char* field = p.type != call.type ? "dtype" : "count";
                    p.record->engine->complete(
                        p.record,
                        std::make_exception_ptr(mismatch_error(
                            p.source, "send to rank " + std::to_string(rank), what, rank, field)));
                    throw mismatch_error(rank, label, what, p.source, field);
                }
                copy(call.recv, p.data, p.count * size_of(p.type));
                p.record->engine->complete(p.record, nullptr);
                return;
            }
            if (peer_gone(call.root)) {
                throw peer_error(rank, label, "the sending rank failed or returned", call.root);
            }
            const auto now = clock::now();
            if (now >= deadline) {
                throw timeout_error(rank, label,
                                    "nothing sent within " +
                                        std::to_string(options.timeout.count()) + " ms",
                                    p2p_sequence - 1);
            }
            group->p2p_cv.wait_until(lock, std::min(deadline, now + std::chrono::milliseconds(2)));
        }
    }

    std::vector<const void*> inputs;
    std::vector<void*> outputs;
    std::vector<const collective_call*> calls;
    std::vector<void*> events;
};

} // namespace detail

/// One rank of a thread world (see `thread_world`). Models `communicator`.
class thread_communicator {
public:
    using request_type = thread_request;

    /// This rank's index in [0, size()).
    int rank() const noexcept { return state_->rank; }
    /// Number of ranks.
    int size() const noexcept { return state_->group->size; }
    /// Timeout and checking behaviour.
    const comm_options& options() const noexcept { return state_->options; }

    /// Runs `call` to completion (after any earlier non-blocking calls of this rank).
    void execute(const collective_call& call) {
        state_->engine.drain();
        state_->run(call);
    }

    /// Starts `call`; it runs on this rank's progress thread, in issue order.
    thread_request submit(const collective_call& call) {
        detail::op_record* r = state_->engine.acquire(call);
        if (call.op == operation::send) {
            if (!call.location.is_host()) {
                state_->engine.release(r);
                throw argument_error(rank(), "send",
                                     "the thread backend's send and recv take host memory, and "
                                     "the data is on " +
                                         to_string(call.location));
            }
            state_->post_send(r);
        } else {
            state_->engine.enqueue(r);
        }
        return {r, state_.get()};
    }

    /// Collective: ranks with equal `color` (>= 0) form a new communicator, ordered
    /// by `key`, then by rank here.
    thread_communicator split(int color, int key) {
        state_->engine.drain();
        int new_rank = 0;
        auto g = state_->split(color, key, new_rank);
        thread_communicator sub(std::move(g), new_rank, state_->options);
        if (state_->mover) {
            sub.attach_device(state_->mover->clone());
        }
        return sub;
    }

    /// Device memory: installs the mover that moves it (unison::cuda::attach does).
    /// Not while operations of this rank are in flight.
    void attach_device(std::unique_ptr<detail::device_mover> m) {
        state_->engine.drain();
        state_->mover = std::move(m);
    }
    /// Moves host memory always, device memory once attached (device_communicator).
    static constexpr bool moves_host_memory = true;
    /// The CUDA stream (a cudaStream_t) this rank's device collectives run on, or
    /// null when no device is attached.
    void* device_stream() const noexcept {
        return state_->mover ? state_->mover->stream() : nullptr;
    }
    /// The attached CUDA device, or host when none is attached.
    device device_location() const noexcept {
        return state_->mover ? device::cuda(state_->mover->device()) : device::host();
    }

    /// Used by thread_world; users get communicators from thread_world::run.
    thread_communicator(std::shared_ptr<detail::thread_group> group, int rank, comm_options o)
        : state_(std::make_unique<detail::thread_rank_state>(std::move(group), rank, o)) {}

private:
    std::unique_ptr<detail::thread_rank_state> state_;
};

inline void thread_request::wait() {
    if (record_ == nullptr) {
        return;
    }
    detail::op_record* r = std::exchange(record_, nullptr);
    if (r->call.op == operation::send) {
        state_->finish_send(r, state_->p2p_label(r->call));
        return;
    }
    // The call's own waits are bounded by the timeout, so this wait is too.
    while (!state_->engine.wait(r, detail::clock::now() + std::chrono::seconds(1))) {
    }
    std::exception_ptr e = r->error;
    state_->engine.release(r);
    if (e) {
        std::rethrow_exception(e);
    }
}

static_assert(request<thread_request>);
static_assert(device_communicator<thread_communicator>);

} // namespace unison
