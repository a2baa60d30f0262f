#pragma once

/// \file
/// The MPI backend's deterministic reductions (comm_options::deterministic, or the
/// all-reduce algorithm `rank_ordered`, which mpi/tuning.hpp also picks for larger
/// buffers on 3 to 8 nodes of a rank each, for its two steps): every element is reduced by the one rank
/// that owns its block, from every rank's own input, folded in rank order
/// ((x0 op x1) op x2 ...) in the accumulate type and rounded once (host_reduce, the
/// thread backend's arithmetic). Which rank owns a block, how large the call is,
/// how a model's gradients were cut into buckets or which backend carried them
/// then change nothing: each element is the same fold of the same values.
///
/// Two phases of point-to-point messages, after the call check (the handshake):
/// each rank sends block q of its input to rank q and receives its own block from
/// every other rank (a reduce-scatter by direct exchange), folds the n blocks, and
/// then, for an all-reduce, sends its reduced block to every other rank (an
/// all-gather; for a reduce, to the root only). 2 (n - 1) messages of m / n bytes
/// from every rank, the ring's bytes, posted all at once rather than in 2 (n - 1)
/// steps; the price is scratch for the n - 1 arriving blocks (about the call's size)
/// and a fold that reads n blocks (docs/performance.md measures it). A small
/// all-reduce or reduce (mpi/tuning.hpp, rank_ordered_direct) takes one phase
/// instead: every rank sends its whole input to every rank (to the root), which
/// folds all n; (n - 1) m bytes from each rank, one exchange fewer.

#include "unison/comm/collective.hpp"
#include "unison/core/detail/aligned_bytes.hpp"
#include "unison/core/detail/host_reduce.hpp"
#include "unison/core/dtype.hpp"
#include "unison/core/reduce_op.hpp"
#include "unison/mpi/detail/handshake.hpp"
#include "unison/mpi/detail/mpi_check.hpp"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace unison::detail {

/// One all_reduce, reduce_scatter or reduce in rank order. The operation that owns
/// it keeps the call, the label and the buffers alive.
class mpi_rank_ordered {
public:
    /// Plans `call` (an all_reduce or reduce of call.count elements, or a
    /// reduce_scatter of call.count per rank), the `sequence`-th collective of `rank`
    /// of the `size` ranks of `comm`; errors name `label`. The blocks travel on the
    /// ring's tag (phase one) and the all-gather's (phase two), which no other
    /// algorithm of the same call uses.
    /// `direct`: in one phase, every rank's whole input to every rank that folds
    /// (an all_reduce or reduce only).
    mpi_rank_ordered(MPI_Comm comm, int rank, int size, const collective_call& call,
                     std::uint64_t sequence, const call_label& label, bool direct)
        : comm_(comm), rank_(rank), size_(size), call_(call), label_(label),
          es_(size_of(call.type)), direct_(direct && call.op != operation::reduce_scatter),
          scatter_tag_(mpi_tag(mpi_ring_tag_base, mpi_ring_tags, sequence)),
          gather_tag_(mpi_tag(mpi_gather_tag_base, mpi_gather_tags, sequence)) {}
    mpi_rank_ordered(const mpi_rank_ordered&) = delete;
    mpi_rank_ordered& operator=(const mpi_rank_ordered&) = delete;

    /// Bytes of scratch: the n - 1 blocks that arrive, and, for a reduce on a rank
    /// other than the root, the reduced block it sends, each in whole cache lines,
    /// and a line's room to start them at the line offset of this rank's own block.
    std::size_t scratch_bytes() const noexcept {
        if (!folds()) {
            return 0;
        }
        const bool spare = call_.op == operation::reduce && rank_ != call_.root;
        return slot_stride() * static_cast<std::size_t>(size_ - 1 + (spare ? 1 : 0)) +
               cache_line_bytes;
    }

    /// Posts phase one; `scratch` holds scratch_bytes() until the call is done.
    void start(std::byte* scratch) {
        // Each block arrives from where its sender keeps it, laid out as this rank's
        // own block: the slots sit within their cache lines alike (same_line_offset).
        scratch_ = folds() ? same_line_offset(scratch, input() + own_lo() * es_) : nullptr;
        folded_ = false;
        step_.clear();
        if (folds()) { // receives before sends
            for (int q = 0; q < size_; ++q) {
                if (q != rank_) {
                    post_recv(slot(q), own_len(), q, scatter_tag_);
                }
            }
        }
        step_.receives_posted();
        for (int q = 0; q < size_; ++q) {
            if (q == rank_) {
                continue;
            }
            if (!direct_) {
                post_send(input() + block_lo(q) * es_, block_len(q), q, scatter_tag_);
            } else if (call_.op == operation::all_reduce || q == call_.root) {
                post_send(input(), call_.count, q, scatter_tag_);
            }
        }
    }

    /// Drives the call; true when it is complete (results final).
    bool progress() {
        if (!complete()) {
            return false;
        }
        if (folded_) {
            return true;
        }
        if (folds()) {
            fold();
        }
        folded_ = true;
        step_.clear();
        if (direct_ || call_.op == operation::reduce_scatter) {
            return true; // one phase: the fold was the last step
        }
        // Phase two: the reduced blocks to every rank (all_reduce) or to the root.
        const bool receives = call_.op == operation::all_reduce || rank_ == call_.root;
        for (int q = 0; q < size_ && receives; ++q) {
            if (q != rank_) {
                post_recv(output() + block_lo(q) * es_, block_len(q), q, gather_tag_);
            }
        }
        step_.receives_posted();
        for (int q = 0; q < size_; ++q) {
            if (q != rank_ && (call_.op == operation::all_reduce || q == call_.root)) {
                post_send(reduced(), block_len(rank_), q, gather_tag_);
            }
        }
        return complete();
    }

    /// True when none of its requests is in MPI's hands.
    bool idle() const noexcept { return step_.idle(); }

    /// The first rank whose block has not arrived yet; -1 when none is awaited.
    int waiting_for() const noexcept { return step_.waiting_for(); }

    /// Gives the call up (after a timeout; never driven again): cancels the posted
    /// receives, waiting at most `budget` for the cancellations, and frees the sends
    /// (MPI only reads their buffers). True when no receive is left in MPI's hands.
    bool cancel(std::chrono::steady_clock::duration budget) noexcept {
        return step_.cancel(budget);
    }

private:
    /// Block q of an all-reduce or reduce: equal shares, the first count % n one
    /// element longer; of a reduce_scatter: rank q's count elements.
    std::size_t block_lo(int q) const noexcept {
        const auto u = static_cast<std::size_t>(q);
        if (call_.op == operation::reduce_scatter) {
            return u * call_.count;
        }
        const auto n = static_cast<std::size_t>(size_);
        const std::size_t base = call_.count / n, rem = call_.count % n;
        return u * base + std::min(u, rem);
    }
    std::size_t block_len(int q) const noexcept {
        return call_.op == operation::reduce_scatter ? call_.count : block_lo(q + 1) - block_lo(q);
    }
    /// The elements this rank folds: its block, or in one phase the whole call.
    std::size_t own_lo() const noexcept { return direct_ ? 0 : block_lo(rank_); }
    std::size_t own_len() const noexcept { return direct_ ? call_.count : block_len(rank_); }
    /// Bytes from one slot of scratch to the next: a block, in whole cache lines.
    std::size_t slot_stride() const noexcept {
        return (own_len() * es_ + cache_line_bytes - 1) / cache_line_bytes * cache_line_bytes;
    }
    /// Whether this rank folds anything (in one phase, a reduce folds on its root only).
    bool folds() const noexcept {
        return !(direct_ && call_.op == operation::reduce && rank_ != call_.root);
    }

    const std::byte* input() const noexcept { return static_cast<const std::byte*>(call_.send); }
    std::byte* output() const noexcept { return static_cast<std::byte*>(call_.recv); }
    /// Where block q of the input arrives (q != rank_).
    std::byte* slot(int q) const noexcept {
        const int k = q < rank_ ? q : q - 1;
        return scratch_ + static_cast<std::size_t>(k) * slot_stride();
    }
    /// Where this rank's reduced block goes: its place in the output, or scratch on
    /// a rank that is not a reduce's root.
    std::byte* reduced() const noexcept {
        if (call_.op == operation::reduce_scatter) {
            return output();
        }
        if (call_.op == operation::reduce && rank_ != call_.root) {
            return scratch_ + static_cast<std::size_t>(size_ - 1) * slot_stride();
        }
        return output() + own_lo() * es_;
    }

    /// Folds the n copies of this rank's block in rank order. The output may be this
    /// rank's own input block (in place); host_reduce reads it before writing it.
    void fold() {
        const std::size_t len = own_len();
        if (len == 0) {
            return;
        }
        inputs_.resize(static_cast<std::size_t>(size_));
        for (int q = 0; q < size_; ++q) {
            inputs_[static_cast<std::size_t>(q)] =
                q == rank_ ? static_cast<const void*>(input() + own_lo() * es_) : slot(q);
        }
        void* out[1] = {reduced()};
        host_reduce(call_.type, call_.reduction, inputs_.data(), size_, out, 1, len,
                    call_.reduction == reduce_op::avg ? size_ : 1);
    }

    bool complete() { return step_.complete(rank_, label_.str()); }

    /// One block's messages (at most mpi_message_max_bytes each, so every count fits
    /// an int); both sides cut a block alike.
    void post_recv(std::byte* into, std::size_t count, int source, int tag) {
        for_each_segment(count * es_, [&](std::size_t at, std::size_t bytes) {
            MPI_Request* r = step_.add(source);
            check(MPI_Irecv(into + at, static_cast<int>(bytes / es_), mpi_datatype(call_.type),
                            source, tag, comm_, r),
                  "MPI_Irecv (rank-ordered)");
        });
    }
    void post_send(const std::byte* from, std::size_t count, int dest, int tag) {
        for_each_segment(count * es_, [&](std::size_t at, std::size_t bytes) {
            MPI_Request* r = step_.add(dest);
            check(MPI_Isend(from + at, static_cast<int>(bytes / es_), mpi_datatype(call_.type),
                            dest, tag, comm_, r),
                  "MPI_Isend (rank-ordered)");
        });
    }

    void check(int rc, const char* what) const {
        if (rc != MPI_SUCCESS) {
            throw_mpi_error(rc, rank_, label_.str(), what);
        }
    }

    MPI_Comm comm_;
    int rank_;
    int size_;
    const collective_call& call_;
    const call_label& label_;
    std::size_t es_;
    bool direct_; ///< one phase: whole inputs to every rank that folds
    int scatter_tag_;
    int gather_tag_;
    std::byte* scratch_ = nullptr;
    bool folded_ = false;    ///< phase one folded (and phase two posted, if any)
    mpi_step_requests step_; ///< the phase's requests, receives first
    std::vector<const void*> inputs_;
};

} // namespace unison::detail
