#pragma once

/// \file
/// The MPI backend's all-reduce for large messages (mpi/tuning.hpp says when): a
/// ring of non-blocking sends and receives, one pair per step, that the operation
/// owning it drives step by step by polling. The elements it reduces are one buffer
/// or several laid end to end (a coalesced all-reduce): a step then sends and
/// receives one message per tensor its chunk touches, straight from and into the
/// tensors, so no rank packs them. Its second half alone is the all_gather's ring:
/// each rank's block passed on around the ring, straight into every output. Either
/// half's all-gather can be the neighbour exchange instead (an even rank count):
/// each rank swaps its block with its partner (rank ^ 1), then trades, alternately
/// with the neighbour outside its pair and with its partner, the two blocks it
/// received last, so that every pair's blocks travel both ways around the ring of
/// pairs at once: n / 2 steps instead of n - 1, the same bytes, both directions of
/// every link in use.

#include "unison/comm/collective.hpp"
#include "unison/comm/detail/validate.hpp"
#include "unison/core/detail/aligned_bytes.hpp"
#include "unison/core/detail/host_reduce.hpp"
#include "unison/core/dtype.hpp"
#include "unison/core/reduce_op.hpp"
#include "unison/mpi/detail/handshake.hpp"
#include "unison/mpi/detail/mpi_check.hpp"
#include "unison/mpi/detail/schedule.hpp"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

namespace unison::detail {

/// The largest message of a ring step: a chunk above it goes as several messages
/// (segments), so that every count fits MPI's int. Chunks below it go whole: cutting
/// them finer (256 KiB) so that reducing one segment overlapped receiving the next
/// measured 4-9% slower than one message per step over shared memory, and no faster
/// over TCP (docs/measurements.md).
inline constexpr std::size_t mpi_ring_segment_bytes = mpi_message_max_bytes;

/// A coalesced all-reduce's tensors under this many bytes are copied into one staging
/// buffer that the ring reduces as one more run, rather than each sent as messages of
/// its own: below Open MPI's eager limit over shared memory (4 KiB) a message is
/// copied in and out anyway, and a thousand one-element biases would be a thousand
/// messages. (Staging up to 16 KiB or 256 KiB measured no faster for a model's
/// gradients, and staging everything, which is packing, took twice as long.)
inline constexpr std::size_t mpi_piece_min_bytes = 4 * 1024;

/// A run of the ring's elements in memory: elements [start, start + count) of the
/// all-reduce, read from `in` and written to `out` (the same for in place).
struct mpi_ring_extent {
    const std::byte* in = nullptr;
    std::byte* out = nullptr;
    std::size_t start = 0;
    std::size_t count = 0;
};

/// One all-reduce as a ring: the schedule of its steps and the requests of the
/// current one. The call and the label belong to the operation that owns the ring.
class mpi_ring_allreduce {
public:
    /// The all-reduce `call`, the `sequence`-th collective of rank `rank` of the
    /// `size` ranks of `comm`; errors name `label`. Its elements are `extents` (in
    /// order of `start`, covering [0, call.count) without gaps, the same counts on
    /// every rank; they must outlive the ring), or, when that is empty, call.send and
    /// call.recv. `exchange`: the all-gather half is the neighbour exchange, when
    /// `size` is even (an odd ring has no pairs: the ring then). `segment_bytes` (the
    /// largest message) is a parameter for the tests only.
    mpi_ring_allreduce(MPI_Comm comm, int rank, int size, const collective_call& call,
                       const call_label& label, std::uint64_t sequence,
                       std::span<const mpi_ring_extent> extents = {}, bool exchange = false,
                       std::size_t segment_bytes = mpi_ring_segment_bytes)
        : comm_(comm), rank_(rank), size_(size), call_(call), label_(label), sequence_(sequence),
          segment_(std::clamp<std::size_t>(segment_bytes / size_of(call.type), 1, INT_MAX)),
          count_(call.count), whole_{static_cast<const std::byte*>(call.send),
                                     static_cast<std::byte*>(call.recv), 0, call.count},
          extents_(extents.empty() ? std::span<const mpi_ring_extent>(&whole_, 1) : extents),
          exchange_(exchange && size % 2 == 0), from_(previous_rank()) {}

    /// The all_gather `call` (call.count elements from every rank) as the ring's
    /// second half: chunk r of the output is rank r's block, which start() copies in
    /// (unless the call is in place), and the ring (or, `exchange`, the neighbour
    /// exchange) passes every block on.
    struct all_gather_t {};
    static constexpr all_gather_t all_gather{};
    mpi_ring_allreduce(all_gather_t, MPI_Comm comm, int rank, int size, const collective_call& call,
                       const call_label& label, std::uint64_t sequence, bool exchange = false,
                       std::size_t segment_bytes = mpi_ring_segment_bytes)
        : comm_(comm), rank_(rank), size_(size), call_(call), label_(label), sequence_(sequence),
          segment_(std::clamp<std::size_t>(segment_bytes / size_of(call.type), 1, INT_MAX)),
          count_(call.count * static_cast<std::size_t>(size)),
          whole_{static_cast<const std::byte*>(call.recv), static_cast<std::byte*>(call.recv), 0,
                 count_},
          extents_(&whole_, 1), gathers_(true), exchange_(exchange && size % 2 == 0),
          from_(previous_rank()) {}
    mpi_ring_allreduce(const mpi_ring_allreduce&) = delete;
    mpi_ring_allreduce& operator=(const mpi_ring_allreduce&) = delete;

    /// Bytes of scratch the ring needs: one chunk, the largest, and the room to
    /// start it at the offset within a cache line of the memory it receives (none to
    /// gather).
    std::size_t scratch_bytes() const noexcept {
        return gathers_ ? 0 : chunk_len(0) * size_of(call_.type) + cache_line_bytes;
    }

    /// The rank this one receives from in the current step.
    int previous() const noexcept { return from_; }

    /// Posts the first step; `scratch` holds scratch_bytes() until the ring is done.
    void start(std::byte* scratch) {
        scratch_ = scratch;
        tag_ = mpi_tag(mpi_ring_tag_base, mpi_ring_tags, sequence_);
        step_ = 0;
        if (gathers_) { // my block in place, then straight to the all-gather steps
            const std::size_t es = size_of(call_.type);
            std::byte* mine = whole_.out + chunk_lo(rank_) * es;
            if (call_.send != mine && call_.count != 0) {
                std::memcpy(mine, call_.send, call_.count * es);
            }
            step_ = size_ - 1;
            if (step_ == steps()) {
                return; // one rank: nothing to pass on
            }
        }
        post_step();
    }

    /// Drives the ring: once this step's sends are done, reduces its arrived segments
    /// in order, and moves to the next step once they all are; true when the last
    /// step is done.
    ///
    /// Sends first, as Open MPI's own ring does (a blocking send, then the wait for
    /// the receive and the reduction): over shared memory the peer copies this rank's
    /// chunk straight out of its memory (Open MPI's single-copy transfers), and
    /// reducing while that copy still ran made the whole all-reduce 4-15% slower
    /// than raw MPI_Allreduce in place (docs/measurements.md). Over a network a step's
    /// send and receive are the same size and end together, so little overlap is lost.
    bool progress() {
        const int n = size_;
        const std::size_t es = size_of(call_.type);
        if (step_ == steps()) {
            return true; // one rank's all_gather: no step at all
        }
        for (;;) {
            if (!sent_) {
                int flag = 0;
                UNISON_CHECK_MPI(MPI_Testall(static_cast<int>(requests_.size()) - recv_segments_,
                                             requests_.data() + recv_segments_, &flag,
                                             MPI_STATUSES_IGNORE),
                                 rank_, label_.str());
                if (flag == 0) {
                    return false;
                }
                sent_ = true;
            }
            const bool scatter = step_ < n - 1;
            while (reduced_ < recv_segments_) {
                int flag = 0;
                UNISON_CHECK_MPI(MPI_Test(&requests_[static_cast<std::size_t>(reduced_)], &flag,
                                          MPI_STATUS_IGNORE),
                                 rank_, label_.str());
                if (flag == 0) {
                    return false;
                }
                if (scatter) { // fold the arrived partial sum into my input's chunk
                    const part& p = recv_parts_[static_cast<std::size_t>(reduced_)];
                    const void* inputs[2] = {p.in, chunk_scratch_ + p.offset * es};
                    void* outputs[1] = {p.out};
                    const bool last = step_ == n - 2;
                    host_reduce(call_.type, call_.reduction, inputs, 2, outputs, 1, p.count,
                                last && call_.reduction == reduce_op::avg ? n : 1);
                }
                ++reduced_;
            }
            if (++step_ == steps()) {
                return true;
            }
            post_step();
        }
    }

    /// Gives the ring up (after a timeout; it is never driven again): cancels the
    /// posted receives, waiting at most `budget` in all for the cancellations (a
    /// receive already matched completes only when its sender goes on, and is then
    /// left), and frees the sends, which complete or not on their own (MPI only reads
    /// their buffers). True when no receive is left in MPI's hands, so nothing writes
    /// to the caller's buffer or the scratch any more.
    bool cancel(std::chrono::steady_clock::duration budget) noexcept {
        const auto receives =
            std::min(static_cast<std::size_t>(std::max(recv_segments_, 0)), requests_.size());
        return abandon_requests(std::span(requests_).first(receives),
                                std::span(requests_).subspan(receives), budget);
    }

private:
    // Reduce-scatter then all-gather around the ring rank -> rank+1. After step s of
    // the reduce-scatter, chunk (rank - s - 2) holds the partial sum of s + 2 ranks;
    // after the last step, this rank owns the complete chunk `rank`.

    // The neighbour exchange's all-gather (an even n) takes n / 2 steps, each
    // schedule.hpp's neighbour_exchange_step: chunk q is block q.

    int steps() const noexcept { return size_ - 1 + (exchange_ ? size_ / 2 : size_ - 1); }
    int previous_rank() const noexcept { return (rank_ + size_ - 1) % size_; }

    std::size_t chunk_lo(int i) const noexcept {
        const std::size_t n = static_cast<std::size_t>(size_);
        const std::size_t base = count_ / n, rem = count_ % n;
        const auto u = static_cast<std::size_t>(i);
        return u * base + std::min(u, rem);
    }
    std::size_t chunk_len(int i) const noexcept { return chunk_lo(i + 1) - chunk_lo(i); }
    int chunk(int offset) const noexcept {
        const int n = size_;
        return ((rank_ + offset) % n + n) % n;
    }
    /// One message of a step: `count` elements `offset` into its chunk, at `in` and
    /// `out` in the caller's memory.
    struct part {
        const std::byte* in;
        std::byte* out;
        std::size_t offset;
        std::size_t count;
    };

    /// Calls f(part) for the messages of chunk `i`, in order: one per extent the
    /// chunk touches, cut into segments of at most segment_ elements. Every rank
    /// cuts a chunk alike (the extents' counts agree), so the k-th message one rank
    /// sends is the k-th its neighbour receives.
    template <class F>
    void for_each_part(int i, F&& f) const {
        for_each_part(i, 1, f);
    }
    /// The same for the `chunks` chunks from `i` on, as one run.
    template <class F>
    void for_each_part(int i, int chunks, F&& f) const {
        const std::size_t lo = chunk_lo(i), hi = chunk_lo(i + chunks);
        if (lo == hi) {
            return;
        }
        const std::size_t es = size_of(call_.type);
        // The first extent that ends past lo.
        auto e = std::upper_bound(
            extents_.begin(), extents_.end(), lo,
            [](std::size_t at, const mpi_ring_extent& x) { return at < x.start + x.count; });
        for (; e != extents_.end() && e->start < hi; ++e) {
            const std::size_t a = std::max(lo, e->start), b = std::min(hi, e->start + e->count);
            for (std::size_t at = a; at < b; at += segment_) {
                const std::size_t into = (at - e->start) * es;
                f(part{e->in + into, e->out + into, at - lo, std::min(segment_, b - at)});
            }
        }
    }

    /// Posts step `step_`: the chunks to send and the chunks to receive, as messages
    /// of for_each_part.
    void post_step() {
        const int n = size_;
        int next = (rank_ + 1) % n, prev = (rank_ + n - 1) % n;
        const MPI_Datatype t = mpi_datatype(call_.type);
        const std::size_t es = size_of(call_.type);
        const int s = step_;
        const bool scatter = s < n - 1;
        bool send_input = false;
        int chunks = 1; // a step's run of chunks: the neighbour exchange's pairs are 2
        if (scatter) {  // reduce-scatter
            send_chunk_ = chunk(-s - 1);
            recv_chunk_ = chunk(-s - 2);
            send_input = s == 0;
        } else if (exchange_) { // all-gather by the neighbour exchange
            const neighbour_step e = neighbour_exchange_step(rank_, n, s - (n - 1));
            next = prev = e.peer;
            send_chunk_ = e.send_block;
            recv_chunk_ = e.recv_block;
            chunks = e.blocks;
        } else { // all-gather
            const int g = s - (n - 1);
            send_chunk_ = chunk(-g);
            recv_chunk_ = chunk(-g - 1);
        }
        from_ = prev;
        recv_parts_.clear();
        for_each_part(recv_chunk_, chunks, [&](const part& p) { recv_parts_.push_back(p); });
        recv_segments_ = static_cast<int>(recv_parts_.size());
        if (scatter && !recv_parts_.empty()) {
            // The chunk arrives from where the previous rank keeps it: its input in
            // the first step, its output after; laid out as this rank's.
            const part& first = recv_parts_.front();
            chunk_scratch_ = same_line_offset(scratch_, s == 0 ? first.in : first.out);
        }
        requests_.assign(recv_parts_.size(), MPI_REQUEST_NULL);
        reduced_ = 0;
        sent_ = false;
        // A part is at most segment_ elements, so its count fits an int.
        for (std::size_t k = 0; k < recv_parts_.size(); ++k) {
            const part& p = recv_parts_[k];
            std::byte* into = scatter ? chunk_scratch_ + p.offset * es : p.out;
            check(MPI_Irecv(into, static_cast<int>(p.count), t, prev, tag_, comm_, &requests_[k]),
                  "MPI_Irecv (ring)");
        }
        for_each_part(send_chunk_, chunks, [&](const part& p) {
            requests_.push_back(MPI_REQUEST_NULL);
            check(MPI_Isend(send_input ? p.in : p.out, static_cast<int>(p.count), t, next, tag_,
                            comm_, &requests_.back()),
                  "MPI_Isend (ring)");
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
    std::uint64_t sequence_;
    std::size_t segment_;   ///< elements per message at most
    std::size_t count_;     ///< elements the ring carries (the output's, to gather)
    mpi_ring_extent whole_; ///< the call's one buffer, when no extents are given
    std::span<const mpi_ring_extent> extents_;
    std::byte* scratch_ = nullptr;       ///< room for one chunk and a cache line
    std::byte* chunk_scratch_ = nullptr; ///< where in scratch_ this step's chunk starts
    int step_ = 0;
    int tag_ = 0;
    int send_chunk_ = 0, recv_chunk_ = 0;
    int recv_segments_ = 0;        ///< receive requests of this step (first in requests_)
    int reduced_ = 0;              ///< receive segments of this step already folded in
    std::vector<part> recv_parts_; ///< this step's receives, in order
    bool sent_ = false;            ///< this step's sends are complete
    std::vector<MPI_Request> requests_;
    bool gathers_ = false;  ///< the all_gather's ring: the second half only
    bool exchange_ = false; ///< the all-gather half is the neighbour exchange
    int from_ = 0;          ///< the rank the current step receives from
};

} // namespace unison::detail
