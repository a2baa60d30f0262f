#pragma once

/// \file
/// The thread backend's data movement on host memory. Once every rank has published
/// its call (thread_group::entry) and the calls match, each rank reduces (or copies)
/// its own share of the collective straight between the peers' buffers -- no central
/// copy and no allocation per call.

#include "unison/comm/collective.hpp"
#include "unison/core/detail/host_reduce.hpp"
#include "unison/core/dtype.hpp"
#include "unison/core/reduce_op.hpp"
#include "unison/thread/detail/thread_group.hpp"
#include "unison/thread/tuning.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

namespace unison::detail {

/// Copies `bytes` from `src` to `dst`; nothing when they are the same place or empty.
inline void copy_bytes(void* dst, const void* src, std::size_t bytes) {
    if (dst != src && bytes != 0) {
        std::memcpy(dst, src, bytes);
    }
}

/// Moves one rank's share of each host collective; holds the pointer tables it
/// passes to host_reduce, sized once, so that a collective allocates nothing.
class host_mover {
public:
    explicit host_mover(int ranks)
        : inputs_(static_cast<std::size_t>(ranks)), outputs_(static_cast<std::size_t>(ranks)) {}

    /// Rank `rank`'s share of `call`, the collective that every rank of `group` has
    /// published in slot `seq` (and that was checked to match across the ranks).
    void move(thread_group& group, int rank, const collective_call& call, std::uint64_t seq) {
        const int n = group.size;
        const std::size_t es = size_of(call.type);
        auto peer = [&](int q) -> const collective_call& { return group.entry(seq, q).call; };
        const int divisor = call.reduction == reduce_op::avg ? n : 1;
        switch (call.op) {
        case operation::all_reduce:
            if (!call.pieces.empty()) {
                return move_coalesced(group, rank, call, seq);
            }
            [[fallthrough]];
        case operation::reduce: {
            // Reduce my share of everyone's input and write it to every output (all_reduce)
            // or to the root's (reduce).
            const auto [lo, hi] = thread_tuning::share_of(call.count, es, n, rank);
            if (lo == hi) {
                return;
            }
            int outs = 0;
            for (int q = 0; q < n; ++q) {
                inputs_[static_cast<std::size_t>(q)] = at(peer(q).send, lo, es);
                if (call.op == operation::all_reduce || q == call.root) {
                    outputs_[static_cast<std::size_t>(outs++)] = at(peer(q).recv, lo, es);
                }
            }
            host_reduce(call.type, call.reduction, inputs_.data(), n, outputs_.data(), outs,
                        hi - lo, divisor,
                        call.send != call.recv &&
                            call.count * es >= thread_tuning::streaming_min_bytes);
            return;
        }
        case operation::reduce_scatter: {
            for (int q = 0; q < n; ++q) {
                inputs_[static_cast<std::size_t>(q)] =
                    at(peer(q).send, call.count * static_cast<std::size_t>(rank), es);
            }
            outputs_[0] = call.recv;
            host_reduce(call.type, call.reduction, inputs_.data(), n, outputs_.data(), 1,
                        call.count, divisor);
            return;
        }
        case operation::all_gather:
            for (int q = 0; q < n; ++q) {
                copy_bytes(at(call.recv, call.count * static_cast<std::size_t>(q), es),
                           peer(q).send, call.count * es);
            }
            return;
        case operation::all_gatherv: {
            std::size_t offset = 0;
            for (int q = 0; q < n; ++q) {
                const std::size_t c = call.counts[static_cast<std::size_t>(q)];
                copy_bytes(at(call.recv, offset, es), peer(q).send, c * es);
                offset += c;
            }
            return;
        }
        case operation::broadcast:
            copy_bytes(call.recv, peer(call.root).send, call.count * es);
            return;
        case operation::all_to_all:
            for (int q = 0; q < n; ++q) {
                copy_bytes(at(call.recv, call.count * static_cast<std::size_t>(q), es),
                           at(peer(q).send, call.count * static_cast<std::size_t>(rank), es),
                           call.count * es);
            }
            return;
        default:
            return;
        }
    }

private:
    /// A coalesced all_reduce: my share of the pieces laid end to end, reduced in
    /// place between every rank's own pieces (the same sizes on every rank, which
    /// call matching checked), piece by piece where the share crosses them.
    void move_coalesced(thread_group& group, int rank, const collective_call& call,
                        std::uint64_t seq) {
        const int n = group.size;
        const std::size_t es = size_of(call.type);
        const int divisor = call.reduction == reduce_op::avg ? n : 1;
        const auto [lo, hi] = thread_tuning::share_of(call.count, es, n, rank);
        std::size_t start = 0; // of piece k, in elements of the whole
        for (std::size_t k = 0; k < call.pieces.size() && start < hi; ++k) {
            const std::size_t count = call.pieces[k].count;
            const std::size_t a = std::max(lo, start), b = std::min(hi, start + count);
            if (a < b) {
                for (int q = 0; q < n; ++q) {
                    void* p = at(group.entry(seq, q).call.pieces[k].data, a - start, es);
                    inputs_[static_cast<std::size_t>(q)] = p;
                    outputs_[static_cast<std::size_t>(q)] = p;
                }
                host_reduce(call.type, call.reduction, inputs_.data(), n, outputs_.data(), n, b - a,
                            divisor, false);
            }
            start += count;
        }
    }

    static const std::byte* at(const void* p, std::size_t elements, std::size_t elem) {
        return static_cast<const std::byte*>(p) + elements * elem;
    }
    static std::byte* at(void* p, std::size_t elements, std::size_t elem) {
        return static_cast<std::byte*>(p) + elements * elem;
    }

    std::vector<const void*> inputs_;
    std::vector<void*> outputs_;
};

} // namespace unison::detail
