#pragma once

/// \file
/// How the Gloo backend runs one validated call on a Gloo context, on the
/// communicator's worker thread: the handshake that compares every rank's call
/// signature (and names a rank that does not come), then Gloo's own collective.
/// Gloo's collectives are typed only by their element size, so each dtype travels
/// as bytes of its size and is reduced by unison's host loops (core/detail/
/// host_reduce.hpp), which Gloo calls on every segment it combines.

#include "unison/comm/collective.hpp"
#include "unison/comm/detail/matching.hpp"
#include "unison/core/detail/host_reduce.hpp"
#include "unison/core/dtype.hpp"
#include "unison/core/error.hpp"

#include <gloo/allgather.h>
#include <gloo/allgatherv.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/context.h>
#include <gloo/reduce.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

namespace unison::detail {

/// Slot prefixes of unison's own messages on a Gloo context, above Gloo's (0x01 to
/// 0x08 in gloo/types.h), so they never match a Gloo collective's.
inline constexpr std::uint8_t gloo_handshake_slot = 0x70;
inline constexpr std::uint8_t gloo_reduce_scatter_slot = 0x71;
inline constexpr std::uint8_t gloo_p2p_slot = 0x72;

/// The Gloo slot of a send or recv: unison's p2p prefix in the top byte (bits
/// 56-63, as Gloo's Slot::build puts it), the tag in bits 24-55, and a 16-bit
/// fingerprint of the message's byte count and dtype in bits 8-23, which Gloo's own
/// slots leave at zero. A send and a recv meet only when their sizes agree: Gloo
/// checks a message's length against the posted receive on its own event-loop
/// thread, where a longer message ends the process (an uncaught check), and a
/// shorter one completes the receive with its tail unwritten. So a send and a recv
/// that disagree never match, and each ends in a timeout_error instead (about
/// 1 in 65,536 such pairs would still share a fingerprint).
inline std::uint64_t gloo_p2p_slot_of(int tag, std::size_t bytes, dtype type) noexcept {
    std::uint64_t h = 1469598103934665603ull; // FNV-1a over the byte count and dtype
    for (int i = 0; i < 8; ++i) {
        h = (h ^ ((bytes >> (8 * i)) & 0xffu)) * 1099511628211ull;
    }
    h = (h ^ static_cast<std::uint64_t>(type)) * 1099511628211ull;
    const std::uint64_t fingerprint = (h ^ (h >> 16) ^ (h >> 32) ^ (h >> 48)) & 0xffffu;
    return (static_cast<std::uint64_t>(gloo_p2p_slot) << 56) |
           (static_cast<std::uint64_t>(static_cast<std::uint32_t>(tag)) << 24) | (fingerprint << 8);
}

/// An element of `N` bytes: what Gloo's typed setters need to cut a buffer into
/// whole elements.
template <std::size_t N>
struct gloo_element {
    unsigned char bytes[N];
};
static_assert(sizeof(gloo_element<2>) == 2 && sizeof(gloo_element<8>) == 8);

/// Calls `f(gloo_element<size_of(type)>{})`.
template <class F>
decltype(auto) with_gloo_element(dtype type, F&& f) {
    switch (size_of(type)) {
    case 1:
        return f(gloo_element<1>{});
    case 2:
        return f(gloo_element<2>{});
    case 4:
        return f(gloo_element<4>{});
    default:
        return f(gloo_element<8>{});
    }
}

/// Gloo's reduction callback for `type` and `op`: out[i] = a[i] op b[i] (avg sums;
/// the division comes once, at the end).
inline std::function<void(void*, const void*, const void*, std::size_t)>
gloo_reduction(dtype type, reduce_op op) {
    const reduce_op folded = op == reduce_op::avg ? reduce_op::sum : op;
    return [type, folded](void* out, const void* a, const void* b, std::size_t n) {
        const void* in[2] = {a, b};
        void* o[1] = {out};
        host_reduce(type, folded, in, 2, o, 1, n);
    };
}

/// x[i] /= divisor for i < count: avg's last step.
inline void gloo_divide(dtype type, void* x, std::size_t count, int divisor) {
    const void* in[1] = {x};
    void* o[1] = {x};
    host_reduce(type, reduce_op::sum, in, 1, o, 1, count, divisor);
}

/// The handshake's buffers, made once per communicator and kept until it goes. Two
/// sets take turns: the receives of a call's handshake are posted when the previous
/// one ends (and when the communicator is made), so that a peer's signature is
/// written straight into them without Gloo's ready-to-receive exchange (half a round
/// trip instead of one and a half). A handshake that fails leaves receives posted,
/// which must never land in freed memory.
struct gloo_handshake_buffers {
    explicit gloo_handshake_buffers(::gloo::Context& ctx) : ctx_(ctx) {
        for (int k = 0; k < 2; ++k) {
            all[k].resize(static_cast<std::size_t>(ctx.size));
            in[k] = ctx.createUnboundBuffer(all[k].data(), all[k].size() * sizeof(call_signature));
        }
        out = ctx.createUnboundBuffer(&mine, sizeof(call_signature));
        post(0);
    }

    /// Posts set `k`'s receives, one from every other rank. A connection found
    /// broken is remembered (broken, broken_peer) for the next handshake to report.
    void post(int k) {
        const auto slot = ::gloo::Slot::build(gloo_handshake_slot, 0);
        for (int q = 0; q < ctx_.size; ++q) {
            if (q != ctx_.rank) {
                // Overwritten when rank q's signature lands: how arrivals are told apart
                // (Gloo's waitRecv reports the last sender, not the one it consumes).
                all[k][static_cast<std::size_t>(q)].op = not_arrived;
                try {
                    in[k]->recv(q, slot, static_cast<std::size_t>(q) * sizeof(call_signature),
                                sizeof(call_signature));
                } catch (const ::gloo::IoException& e) {
                    if (broken.empty()) {
                        broken = e.what();
                        broken_peer = q;
                    }
                }
            }
        }
    }

    /// An operation code no call has: the entry of a rank whose signature has not come.
    static constexpr std::uint64_t not_arrived = ~std::uint64_t{0};

    ::gloo::Context& ctx_;
    std::vector<call_signature> all[2]; ///< every rank's signature, by rank
    std::unique_ptr<::gloo::transport::UnboundBuffer> in[2];
    call_signature mine; ///< what is sent
    std::unique_ptr<::gloo::transport::UnboundBuffer> out;
    int current = 0; ///< the set whose receives are posted for the next handshake
    /// A connection that broke after a handshake every rank completed (a peer that
    /// left once its last call was done, as ranks do after a mismatch_error): not
    /// that call's failure, but the next one's, said at once rather than after the
    /// timeout.
    std::string broken;
    int broken_peer = -1;
};

/// Sends this rank's signature of `call` to every other rank and receives theirs,
/// waiting at most `timeout` for all of them; a rank that does not come is named in
/// a timeout_error, one whose connection broke in a peer_error. Then compares every
/// rank's with rank 0's, as every rank does alike, so that each throws the same
/// mismatch_error before any data moves. Once every rank's signature is here, every
/// rank has come to the call: the handshake is a barrier too.
inline void gloo_handshake_run(::gloo::Context& ctx, gloo_handshake_buffers& b,
                               const collective_call& call, const std::string& label,
                               std::uint64_t sequence, std::chrono::milliseconds timeout) {
    const int n = ctx.size, me = ctx.rank;
    if (n == 1) {
        return;
    }
    if (!b.broken.empty()) {
        const std::string whom = b.broken_peer >= 0
                                     ? "the connection to rank " + std::to_string(b.broken_peer)
                                     : std::string("a connection to another rank");
        throw peer_error(me, label,
                         whom + " broke after the previous call (it left or failed): " + b.broken,
                         b.broken_peer);
    }
    const auto slot = ::gloo::Slot::build(gloo_handshake_slot, 0);
    const int k = b.current;
    std::vector<call_signature>& all = b.all[k];
    b.mine = signature_of(call);
    all[static_cast<std::size_t>(me)] = b.mine;
    auto missing = [&] {
        std::string s;
        int first = -1, count = 0;
        for (int q = 0; q < n; ++q) {
            if (q != me &&
                all[static_cast<std::size_t>(q)].op == gloo_handshake_buffers::not_arrived) {
                s += (s.empty() ? "" : ", ") + std::to_string(q);
                first = first < 0 ? q : first;
                ++count;
            }
        }
        return std::tuple(std::string(count > 1 ? "ranks " : "rank ") + s, first);
    };
    int posting = -1;
    try {
        for (int q = 0; q < n; ++q) {
            if (q != me) {
                posting = q;
                b.out->send(q, slot);
            }
        }
        posting = -1;
        const auto deadline = std::chrono::steady_clock::now() + timeout;
        for (int got = 0; got < n - 1; ++got) {
            const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                deadline - std::chrono::steady_clock::now());
            b.in[k]->waitRecv(std::max(left, std::chrono::milliseconds(1)));
        }
    } catch (const ::gloo::IoException& e) {
        const std::string what = e.what();
        if (posting >= 0) {
            throw peer_error(me, label,
                             "the connection to rank " + std::to_string(posting) +
                                 " is broken (it left or failed): " + what,
                             posting);
        }
        auto [ranks, first] = missing();
        if (what.find("Timed out") != std::string::npos) {
            throw timeout_error(me, label,
                                ranks + " did not come to this call within " +
                                    std::to_string(timeout.count()) +
                                    " ms (a rank is slow, stuck, or calls another operation)",
                                sequence);
        }
        throw peer_error(me, label,
                         "the connection to " + ranks +
                             " broke before it came to this call (it left or failed): " + what,
                         first);
    }
    // Every rank has come: this call goes on whatever happens to a connection now (a
    // peer done with it may leave at once), and a break shows at the next call.
    try {
        for (int q = 0; q < n - 1; ++q) {
            b.out->waitSend(timeout);
        }
    } catch (const ::gloo::IoException& e) {
        b.broken = e.what();
        b.broken_peer = -1;
    }
    b.current = 1 - k;
    if (b.broken.empty()) {
        b.post(b.current); // the next handshake's receives, before this one's check
    }
    for (int q = 1; q < n; ++q) {
        check_signature(me, label, 0, all[0], q, all[static_cast<std::size_t>(q)]);
    }
}

/// Reduce-scatter as a ring over Gloo's transport (Gloo has no functional one): in
/// step s each rank sends the partial sum of block (rank - s - 1) to the next rank
/// and folds the one of block (rank - s - 2) it receives from the previous into it,
/// so after n - 1 steps block `rank` is complete: (n - 1) (a + m b / n), with two
/// blocks of scratch, never touching `send`.
inline void gloo_reduce_scatter(::gloo::Context& ctx, const collective_call& c,
                                std::chrono::milliseconds timeout) {
    const int n = ctx.size, me = ctx.rank;
    const std::size_t block = c.count * size_of(c.type);
    const auto* send = static_cast<const unsigned char*>(c.send);
    auto at = [&](int b) { return send + static_cast<std::size_t>((b % n + n) % n) * block; };
    if (n == 1) {
        if (c.recv != c.send) {
            std::memmove(c.recv, c.send, block);
        }
        return;
    }
    std::vector<unsigned char> scratch(2 * block);
    const int next = (me + 1) % n, prev = (me + n - 1) % n;
    const auto slot = ::gloo::Slot::build(gloo_reduce_scatter_slot, 0);
    auto reduce = gloo_reduction(c.type, c.reduction);
    // The first block sent is the caller's own, unchanged: a buffer over it.
    auto first = ctx.createUnboundBuffer(const_cast<unsigned char*>(at(me - 1)), block);
    auto tmp = ctx.createUnboundBuffer(scratch.data(), scratch.size());
    for (int s = 0; s < n - 1; ++s) {
        const std::size_t in_off = static_cast<std::size_t>(s % 2) * block;
        tmp->recv(prev, slot, in_off, block);
        if (s == 0) {
            first->send(next, slot);
            first->waitSend(timeout);
        } else {
            tmp->send(next, slot, static_cast<std::size_t>((s - 1) % 2) * block, block);
            tmp->waitSend(timeout);
        }
        tmp->waitRecv(timeout);
        unsigned char* received = scratch.data() + in_off;
        void* out = s == n - 2 ? c.recv : static_cast<void*>(received);
        reduce(out, received, at(me - s - 2), c.count);
    }
}

/// Runs the data movement of `c` (the handshake done) with Gloo's collectives.
inline void gloo_run(const std::shared_ptr<::gloo::Context>& ctx, const collective_call& c,
                     std::chrono::milliseconds timeout) {
    const int n = ctx->size, me = ctx->rank;
    const std::size_t esize = size_of(c.type);
    const std::size_t bytes = c.count * esize;
    switch (c.op) {
    case operation::all_reduce:
        if (c.recv != c.send && bytes > 0) {
            std::memmove(c.recv, c.send, bytes);
        }
        if (n > 1 && bytes > 0) {
            with_gloo_element(c.type, [&](auto e) {
                using E = decltype(e);
                ::gloo::AllreduceOptions o(ctx);
                o.setOutput(static_cast<E*>(c.recv), c.count);
                o.setReduceFunction(gloo_reduction(c.type, c.reduction));
                o.setTimeout(timeout);
                ::gloo::allreduce(o);
            });
        }
        if (c.reduction == reduce_op::avg && bytes > 0) {
            gloo_divide(c.type, c.recv, c.count, n);
        }
        return;
    case operation::reduce_scatter:
        if (bytes > 0) {
            gloo_reduce_scatter(*ctx, c, timeout);
            if (c.reduction == reduce_op::avg) {
                gloo_divide(c.type, c.recv, c.count, n);
            }
        }
        return;
    case operation::all_gather:
    case operation::all_gatherv: {
        const bool v = c.op == operation::all_gatherv;
        std::vector<std::size_t> counts(static_cast<std::size_t>(n), c.count);
        if (v) {
            counts.assign(c.counts.begin(), c.counts.end());
        }
        std::size_t offset = 0, total = 0;
        for (int q = 0; q < n; ++q) {
            offset += q < me ? counts[static_cast<std::size_t>(q)] : 0;
            total += counts[static_cast<std::size_t>(q)];
        }
        auto* mine = static_cast<unsigned char*>(c.recv) + offset * esize;
        if (mine != c.send && bytes > 0) {
            std::memmove(mine, c.send, bytes);
        }
        if (n == 1 || total == 0) {
            return;
        }
        // Without an input Gloo gathers in place: this rank's block is already there.
        with_gloo_element(c.type, [&](auto e) {
            using E = decltype(e);
            if (v) {
                ::gloo::AllgathervOptions o(ctx);
                o.setOutput(static_cast<E*>(c.recv), counts);
                o.setTimeout(timeout);
                ::gloo::allgatherv(o);
            } else {
                ::gloo::AllgatherOptions o(ctx);
                o.setOutput(static_cast<E*>(c.recv), total);
                o.setTimeout(timeout);
                ::gloo::allgather(o);
            }
        });
        return;
    }
    case operation::broadcast:
        if (me == c.root && c.recv != c.send && bytes > 0) {
            std::memmove(c.recv, c.send, bytes);
        }
        if (n > 1 && bytes > 0) {
            with_gloo_element(c.type, [&](auto e) {
                using E = decltype(e);
                ::gloo::BroadcastOptions o(ctx);
                o.setOutput(static_cast<E*>(c.recv), c.count);
                o.setRoot(c.root);
                o.setTimeout(timeout);
                ::gloo::broadcast(o);
            });
        }
        return;
    case operation::reduce: {
        // Gloo uses every rank's output as scratch: off the root, one of our own, so
        // the caller's buffers are left as they were.
        std::vector<unsigned char> scratch;
        void* out = c.recv;
        if (me != c.root) {
            scratch.resize(bytes);
            out = scratch.data();
        }
        if (out != c.send && bytes > 0) {
            std::memmove(out, c.send, bytes);
        }
        if (n > 1 && bytes > 0) {
            with_gloo_element(c.type, [&](auto e) {
                using E = decltype(e);
                ::gloo::ReduceOptions o(ctx);
                o.setOutput(static_cast<E*>(out), c.count);
                o.setRoot(c.root);
                o.setReduceFunction(gloo_reduction(c.type, c.reduction));
                o.setTimeout(timeout);
                ::gloo::reduce(o);
            });
        }
        if (me == c.root && c.reduction == reduce_op::avg && bytes > 0) {
            gloo_divide(c.type, c.recv, c.count, n);
        }
        return;
    }
    case operation::all_to_all: {
        const std::size_t all = bytes * static_cast<std::size_t>(n);
        if (all == 0) {
            return;
        }
        std::vector<unsigned char> copy;
        const void* in = c.send;
        if (c.send == c.recv) {
            copy.assign(static_cast<const unsigned char*>(c.send),
                        static_cast<const unsigned char*>(c.send) + all);
            in = copy.data();
        }
        if (n == 1) {
            std::memmove(c.recv, in, all);
            return;
        }
        with_gloo_element(c.type, [&](auto e) {
            using E = decltype(e);
            ::gloo::AlltoallOptions o(ctx);
            o.setInput(static_cast<E*>(const_cast<void*>(in)),
                       c.count * static_cast<std::size_t>(n));
            o.setOutput(static_cast<E*>(c.recv), c.count * static_cast<std::size_t>(n));
            o.setTimeout(timeout);
            ::gloo::alltoall(o);
        });
        return;
    }
    case operation::barrier:
        // The handshake, which every rank had to reach, was the barrier.
        return;
    case operation::send:
    case operation::recv:
        break; // not queued: the communicator posts them at once
    }
    throw error(me, to_string(c.op), "not a queued operation of the Gloo backend");
}

} // namespace unison::detail
