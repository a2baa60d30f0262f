#pragma once

/// \file
/// Send and recv on the thread backend. A send is posted to its group's mailbox
/// (thread_group::posted) when it is issued; the receiver matches it by source,
/// destination and tag, checks its count and dtype, copies the data and completes
/// the sender's record. Either side gives up at the timeout or when its peer fails
/// or returns.

#include "unison/comm/collective.hpp"
#include "unison/comm/detail/validate.hpp"
#include "unison/core/detail/clock.hpp"
#include "unison/core/dtype.hpp"
#include "unison/core/error.hpp"
#include "unison/thread/detail/host_collectives.hpp"
#include "unison/thread/detail/progress_engine.hpp"
#include "unison/thread/detail/thread_group.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <mutex>
#include <string>

namespace unison::detail {

/// One rank's end of its group's send/recv mailbox.
class p2p_endpoint {
public:
    p2p_endpoint(thread_group& group, int rank, std::chrono::milliseconds timeout)
        : group_(group), rank_(rank), timeout_(timeout) {}

    /// The label of the next send or recv, `call`, in errors (they are numbered in
    /// issue order).
    std::string next_label(const collective_call& call) {
        return operation_label(call.op, sequence_++) + " (peer " + std::to_string(call.root) +
               ", tag " + std::to_string(call.tag) + ")";
    }

    /// Runs the send `call` to completion on the calling thread.
    void send(progress_engine& engine, const collective_call& call) {
        op_record* r = engine.acquire(call);
        post_send(r);
        finish_send(engine, r, next_label(call));
    }

    /// Posts a send at issue time (not on the worker), so that a rank can post a send
    /// and then a recv without deadlocking against a peer doing the same.
    void post_send(op_record* r) {
        {
            std::lock_guard lock(group_.p2p_mutex);
            group_.posted.push_back(
                {rank_, r->call.root, r->call.tag, r->call.send, r->call.count, r->call.type, r});
        }
        group_.p2p_cv.notify_all();
    }

    /// Waits until the receiver has taken the send; withdraws it on timeout.
    void finish_send(progress_engine& engine, op_record* r, const std::string& label) {
        const auto deadline = clock::now() + timeout_;
        const int peer = r->call.root;
        while (!engine.wait(r, std::min(deadline, clock::now() + std::chrono::milliseconds(2)))) {
            const bool late = clock::now() >= deadline;
            if (late || peer_gone(peer)) {
                std::unique_lock lock(group_.p2p_mutex);
                auto it = std::find_if(group_.posted.begin(), group_.posted.end(),
                                       [r](const posted_send& p) { return p.record == r; });
                if (it != group_.posted.end()) { // not taken: withdraw it
                    group_.posted.erase(it);
                    lock.unlock();
                    engine.release(r);
                    if (late) {
                        throw timeout_error(rank_, label,
                                            "not received within " +
                                                std::to_string(timeout_.count()) + " ms",
                                            sequence_ - 1);
                    }
                    throw peer_error(rank_, label, "the receiving rank failed or returned", peer);
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

    /// Runs the recv `call` to completion on the calling thread: takes the matching
    /// send from the mailbox, or waits for it.
    void recv(const collective_call& call) {
        const std::string label = next_label(call);
        const auto deadline = clock::now() + timeout_;
        std::unique_lock lock(group_.p2p_mutex);
        for (;;) {
            auto it =
                std::find_if(group_.posted.begin(), group_.posted.end(), [&](const posted_send& p) {
                    return p.destination == rank_ && p.source == call.root && p.tag == call.tag;
                });
            if (it != group_.posted.end()) {
                const posted_send p = *it;
                group_.posted.erase(it);
                lock.unlock();
                if (p.count != call.count || p.type != call.type) {
                    const std::string what = "rank " + std::to_string(rank_) + " receives " +
                                             describe(call.count, call.type) + " but rank " +
                                             std::to_string(p.source) + " sent " +
                                             describe(p.count, p.type);
                    const char* field = p.type != call.type ? "dtype" : "count";
                    // Made in its own statement: the temporary error shares its message
                    // buffer with the copy the sender rethrows, so it must be gone before
                    // complete() hands that copy over.
                    std::exception_ptr to_sender = std::make_exception_ptr(mismatch_error(
                        p.source, "send to rank " + std::to_string(rank_), what, rank_, field));
                    p.record->engine->complete(p.record, std::move(to_sender));
                    throw mismatch_error(rank_, label, what, p.source, field);
                }
                copy_bytes(call.recv, p.data, p.count * size_of(p.type));
                p.record->engine->complete(p.record, nullptr);
                return;
            }
            if (peer_gone(call.root)) {
                throw peer_error(rank_, label, "the sending rank failed or returned", call.root);
            }
            const auto now = clock::now();
            if (now >= deadline) {
                throw timeout_error(
                    rank_, label, "nothing sent within " + std::to_string(timeout_.count()) + " ms",
                    sequence_ - 1);
            }
            group_.p2p_cv.wait_until(lock, std::min(deadline, now + std::chrono::milliseconds(2)));
        }
    }

private:
    /// The world failed, or `peer` returned from its function.
    bool peer_gone(int peer) const {
        if (group_.world->aborted.load(std::memory_order_acquire)) {
            return true;
        }
        const int world_rank = group_.world_ranks[static_cast<std::size_t>(peer)];
        return group_.world->exited[static_cast<std::size_t>(world_rank)].load();
    }

    thread_group& group_;
    const int rank_;
    const std::chrono::milliseconds timeout_;
    std::atomic<std::uint64_t> sequence_{0}; ///< sends and recvs issued so far
};

} // namespace unison::detail
