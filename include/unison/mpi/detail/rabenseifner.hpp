#pragma once

/// \file
/// The MPI backend's all-reduce for medium messages on many ranks: Rabenseifner's
/// algorithm, a reduce-scatter by recursive halving then an all-gather by recursive
/// doubling, 2 log2(p) messages and twice the data instead of the ring's 2 (n - 1)
/// messages. Ranks beyond the largest power of two p fold in first, as in the
/// handshake (handshake.hpp): each even one of the first 2 (n - p) ranks hands its
/// whole buffer to the odd one after it and gets the result back at the end. Three,
/// five or seven times a power of two ranks fold nothing (a group of q, q = 3, 5,
/// 7; schedule.hpp's doubling_shape_of): the halving runs within each q-th of the
/// ranks (p = n / q of them, participants i + p t of place t), so that the q ranks
/// i, i + p, ..., i + (q - 1) p end holding the same block, each summed over its
/// own place; they reduce-scatter it, member t getting share t of each member's
/// block and summing the q shares in the group's order (one step of q - 1 messages
/// of a (p q)-th of the buffer where the fold costs two of the whole), then gather
/// the shares among themselves, and the doubling runs within the places again. The
/// reduce_scatter below does the same (share t is the block of the group's t-th
/// rank, so no gathering follows), and the all_gather doubles within its place,
/// then sends its place's run to each of the others.
///
/// The call check rides along instead of running first: every message of the fold
/// and of the reduce-scatter starts with the call header (handshake.hpp's
/// two-message convention: the header and the first bytes of data, then the rest),
/// and the reduce-scatter's partners are the handshake's, in its order (the fold,
/// distance 1, 2, 4, ... within a place when there are places, the group),
/// so that ranks whose calls take different algorithms still meet and see the
/// difference. A rank that finds a difference sends the fault instead of data from
/// then on; by the end of the reduce-scatter every rank has heard of it or none
/// has (at the first step where some partners differ, every rank of the subcube
/// that differs sees it, and later steps carry it across the remaining
/// dimensions). Until then the received halves go into scratch and the caller's
/// output is not touched, so a mismatch loses nothing; the all-gather, which writes
/// the output, runs only when the calls agree, and needs no headers.
///
/// The same halving is the MPI backend's reduce_scatter over many ranks (recursive
/// halving, log2(p) messages, each rank's input crossing the network about once),
/// the call check riding it the same way. A rank ends the halving holding the
/// block whose number is its own with the bits reversed, so a reduce_scatter first
/// copies its input into scratch with the ranks' blocks in that order ("slots"):
/// slot s holds the blocks of the rank (of the halving's p) whose number is s
/// reversed, and every rank ends with its own block. A rank that folded in gets its
/// block back from its neighbour at the end; no all-gather follows.
///
/// And the all-gather's second half, recursive doubling, is the MPI backend's
/// all_gather for small buffers (`recursive_doubling`): the call check rides every
/// message, the partners at distance 1, 2, 4, ... as in the handshake, so that a
/// rank holds its neighbours' blocks in one contiguous run after each step. The
/// blocks gather in scratch and reach the output only once every step is done, so
/// a mismatch loses nothing. A rank that folds in sends its block first and gets
/// the whole result back at the end.

#include "unison/comm/algorithm.hpp"
#include "unison/comm/collective.hpp"
#include "unison/core/detail/aligned_bytes.hpp"
#include "unison/core/detail/host_reduce.hpp"
#include "unison/core/dtype.hpp"
#include "unison/core/error.hpp"
#include "unison/core/reduce_op.hpp"
#include "unison/mpi/detail/handshake.hpp"
#include "unison/mpi/detail/mpi_check.hpp"

#include <mpi.h>

#include <algorithm>
#include <array>
#include <bit>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace unison::detail {

/// One all-reduce by Rabenseifner's algorithm, reduce_scatter by its halving or
/// all_gather by recursive doubling, with the call check riding its steps. The operation that owns it keeps the call, the label and the buffers alive.
class mpi_rabenseifner {
public:
    /// Plans the all-reduce `call` (`count` elements in `send` and `recv`, which may
    /// alias), the reduce_scatter (`count` times `size` elements in `send`, `count`
    /// in `recv`, which may be its own block of `send`) or the all_gather (`count` in
    /// `send`, which may be its own block of `recv`), the `sequence`-th collective of
    /// `rank` of the `size` ranks of `comm`; `algo` is the algorithm its headers
    /// announce (rabenseifner; recursive_doubling for the all_gather); `node_ranks`
    /// the most ranks a node holds (the handshake's groups depend on it).
    /// Headers travel on the handshake's tag, the rest of a checked message on the
    /// tag mpi_rest_tag gives `algo` (the ring's for rabenseifner, the handshake's
    /// for recursive_doubling), the all-reduce's all-gather on a tag of its own.
    mpi_rabenseifner(MPI_Comm comm, int rank, int size, const collective_call& call,
                     std::uint64_t sequence, const call_label& label,
                     algorithm algo = algorithm::rabenseifner, int node_ranks = 1)
        : comm_(comm), rank_(rank), size_(size),
          check_tag_(mpi_tag(mpi_handshake_tag_base, mpi_handshake_tags, sequence)),
          rest_tag_(mpi_rest_tag(static_cast<std::uint32_t>(algo), sequence)),
          gather_tag_(mpi_tag(mpi_gather_tag_base, mpi_gather_tags, sequence)), call_(call),
          label_(label), es_(size_of(call.type)) {
        mine_ = mpi_call_header{signature_of(call), sequence, 0, static_cast<std::uint32_t>(algo),
                                call.count * es_};
        const doubling_shape shape = doubling_shape_of(size, node_ranks);
        unit_ = shape.group;
        p_ = shape.participants / unit_;
        const int rem = size - shape.participants;
        scatter_ = call.op == operation::reduce_scatter;
        gather_ = call.op == operation::all_gather;
        total_ = scatter_ || gather_ ? call.count * static_cast<std::size_t>(size) : call.count;
        if (scatter_) {
            lay_out_slots();
        }
        if (gather_) { // the result, assembled (not on a rank that hands its block over)
            partial_elems_ = rank < 2 * rem && rank % 2 == 0 ? 0 : total_;
            return;
        }
        // A reduce_scatter's partial sums start as the whole input, in slot order.
        if (unit_ > 1 && p_ == 1) { // q ranks: the group alone, on whole buffers
            partial_elems_ = total_;
        } else if (rank < 2 * rem) { // folds in: the odd one reduces a whole buffer, the even none
            incoming_elems_ = rank % 2 == 1 ? total_ : 0;
            partial_elems_ = scatter_ ? total_ : incoming_elems_;
        } else if (p_ > 1) { // the first half it keeps
            const std::size_t mid = lo(p_ / 2);
            const bool lower = (((rank - rem) % p_) & 1) == 0;
            incoming_elems_ = lower ? mid : total_ - mid;
            partial_elems_ = scatter_ ? total_ : incoming_elems_;
            partial_base_ = scatter_ || lower ? 0 : mid;
        }
        if (unit_ > 1) { // the group receives a share of its block from each of q - 1
            const auto q = static_cast<std::size_t>(unit_);
            const std::size_t block = lo(1) - lo(0); // the largest
            const std::size_t share = scatter_ ? call_.count : (block + q - 1) / q;
            incoming_elems_ = std::max(incoming_elems_, (q - 1) * share);
        }
    }
    mpi_rabenseifner(const mpi_rabenseifner&) = delete;
    mpi_rabenseifner& operator=(const mpi_rabenseifner&) = delete;

    /// Bytes of scratch it needs: the partial sums (an all-reduce's whole buffer on a
    /// rank that folds in, half of it otherwise; a reduce_scatter's whole input; an
    /// all_gather's whole output) and the largest half it receives, each with the
    /// room to start at the offset within a cache line of the memory it mirrors.
    std::size_t scratch_bytes() const noexcept {
        return (partial_elems_ + incoming_elems_) * es_ + (unit_ + 1) * cache_line_bytes;
    }

    /// Posts the first step. `scratch` holds scratch_bytes() and `send_stage` and
    /// `recv_stage` (grown here) the first messages, until the call is done.
    void start(std::byte* scratch, std::vector<std::byte>& send_stage,
               std::vector<std::byte>& recv_stage) {
        // The partial sums sit within their cache lines as the buffer they stand for
        // does, and so, step by step, does each half that arrives (incoming_for):
        // copies between memory at different offsets in its lines can cost twice
        // as much (same_line_offset).
        partial_ = same_line_offset(scratch, gather_ ? call_.recv
                                                     : static_cast<const std::byte*>(call_.send) +
                                                           partial_base_ * es_);
        incoming_ = partial_ + partial_elems_ * es_;
        if (scatter_) { // the input, in slot order
            const auto* in = static_cast<const std::byte*>(call_.send);
            const std::size_t block = call_.count * es_;
            for (int s = 0; s < p_; ++s) {
                const auto at = static_cast<std::size_t>(s);
                for (int k = 0; k < slot_ranks_[at] && block != 0; ++k) {
                    const auto r = static_cast<std::size_t>(slot_rank_[at] + k * slot_stride_);
                    std::memcpy(scratch_partial(lo(s)) + static_cast<std::size_t>(k) * block,
                                in + r * block, block);
                }
            }
        }
        if (gather_ && partial_elems_ != 0 && call_.count != 0) { // its own block, in place
            std::memcpy(scratch_partial(static_cast<std::size_t>(rank_) * call_.count), call_.send,
                        call_.count * es_);
        }
        if (gather_) {
            plan_gather();
        } else {
            plan();
        }
        // A first message to and from each peer of a step: q - 1 in a group of q.
        const std::size_t firsts =
            static_cast<std::size_t>(std::max(1, unit_ - 1)) * mpi_whole_message_max_bytes;
        if (send_stage.size() < firsts) {
            send_stage.resize(firsts);
        }
        if (recv_stage.size() < firsts) {
            recv_stage.resize(firsts);
        }
        send_stage_ = send_stage.data();
        recv_stage_ = &recv_stage;
        current_ = 0;
        faulted_ = false;
        post();
    }

    /// Drives the schedule; true once the result is in the caller's output. Throws
    /// mismatch_error (on every rank) when the calls differ.
    bool progress() {
        while (current_ < steps_.size()) {
            const step& s = steps_[current_];
            if (s.checked && !first_arrived_) {
                receive_rests_early(s);
            }
            if (s.checked && s.count > 1 && !first_arrived_) {
                // A group: one call tests every peer's first message.
                std::array<int, max_step_peers> which{};
                std::array<MPI_Status, max_step_peers> status;
                int done = 0;
                UNISON_CHECK_MPI(
                    MPI_Testsome(s.count, recvs_.data(), &done, which.data(), status.data()), rank_,
                    label_.str());
                for (int k = 0; k < done && done != MPI_UNDEFINED; ++k) {
                    ++firsts_arrived_;
                    receive_first(s, which[static_cast<std::size_t>(k)],
                                  status[static_cast<std::size_t>(k)]);
                }
                if (firsts_arrived_ < s.count) {
                    return false;
                }
                first_arrived_ = true;
            }
            if (s.checked && s.recv_bytes != no_recv && !first_arrived_) {
                // The rest of the peer's message is received once its header says
                // where it goes (unless receive_rests_early took it already), before
                // this rank's own sends are waited for. When
                // this rank sent one message, one call tests it with the peer's
                // first (one poll a step, where the peer's message fits in one too);
                // with a rest of its own in flight, which completes only once the
                // peer has read this rank's header, the peer's first alone.
                int flag = 0;
                MPI_Status status[2];
                if (sends_.size() <= 1) {
                    MPI_Request both[2] = {recvs_[0],
                                           sends_.empty() ? MPI_REQUEST_NULL : sends_[0]};
                    const int rc = MPI_Testall(2, both, &flag, status);
                    recvs_[0] = both[0];
                    if (!sends_.empty()) {
                        sends_[0] = both[1];
                    }
                    UNISON_CHECK_MPI(rc, rank_, label_.str());
                } else {
                    UNISON_CHECK_MPI(MPI_Test(&recvs_[0], &flag, &status[0]), rank_, label_.str());
                }
                if (flag == 0) {
                    return false;
                }
                first_arrived_ = true;
                receive_first(s, 0, status[0]);
            }
            if (!test_all(recvs_) || !test_all(sends_)) {
                return false;
            }
            finish_step(s);
            ++current_;
            if (current_ < steps_.size()) {
                post();
            }
        }
        if (faulted_) {
            throw_fault(rank_, label_.str(), fault_);
        }
        if ((scatter_ || gather_ || copy_at_end_) && own_block_.bytes != 0) {
            std::memcpy(own_block_.out, own_block_.from, own_block_.bytes);
        }
        return true;
    }

    /// True when nothing of it is in MPI's hands.
    bool idle() const noexcept {
        for (const auto* v : {&recvs_, &sends_}) {
            for (const MPI_Request& r : *v) {
                if (r != MPI_REQUEST_NULL) {
                    return false;
                }
            }
        }
        return true;
    }

    /// The rank whose message this rank is waiting for, or -1.
    int waiting_for() const noexcept {
        if (current_ >= steps_.size()) {
            return -1;
        }
        // The first peer (a group's, in its order) whose message has not all come.
        for (std::size_t i = 0; i < recvs_.size(); ++i) {
            if (recvs_[i] != MPI_REQUEST_NULL) {
                return recv_peers_[i];
            }
        }
        const step& s = steps_[current_];
        return s.recv_bytes != no_recv ? s.peer : -1;
    }

    /// Gives the call up (after a timeout; it is never driven again): cancels the
    /// posted receives, waiting at most `budget` in all, and frees the sends (MPI
    /// only reads their buffers). True when no receive into the caller's output is
    /// left in MPI's hands (receives into scratch and staging may be: the owner keeps
    /// those alive).
    bool cancel(std::chrono::steady_clock::duration budget) noexcept {
        const bool released = abandon_requests(recvs_, sends_, budget);
        const bool into_output = current_ < steps_.size() && steps_[current_].writes_output;
        current_ = steps_.size();
        return released || !into_output;
    }

private:
    static constexpr std::size_t no_recv = static_cast<std::size_t>(-1);

    /// One exchange with `peer`. Sizes are in elements; a size of 0 sends or receives
    /// nothing but, on a checked step, the header.
    struct step {
        int peer = -1; ///< a group's first other member
        /// A group of q (q times a power of two ranks): its q - 1 other members, in
        /// the group's order without this rank (which is at `place`); member k
        /// (peers[k]) gets send_counts[k] elements from send_data[k], and its
        /// recv_sizes[k] bytes arrive at recvs[k] (peer, send, send_elems, recv and
        /// recv_bytes: member 0's). The q partial results fold in the group's order.
        int count = 1;
        std::array<int, max_step_peers> peers{};
        std::array<const std::byte*, max_step_peers> send_data{};
        std::array<std::size_t, max_step_peers> send_counts{};
        std::array<std::byte*, max_step_peers> recvs{};
        std::array<std::size_t, max_step_peers> recv_sizes{};
        int place = 0;
        bool checked = false;       ///< the call header travels first (fold, reduce-scatter)
        bool writes_output = false; ///< receives into the caller's output
        bool copy_block = false;    ///< first all-gather step: the own block to the output
        bool sends = false;         ///< sends at all (a checked step: at least the header)
        const std::byte* send = nullptr;
        std::size_t send_elems = 0;
        std::byte* recv = nullptr;
        std::size_t recv_bytes = no_recv; ///< bytes received, or no_recv
        /// After the step: reduce_out = reduce_in (+) the received data.
        const std::byte* reduce_in = nullptr;
        std::byte* reduce_out = nullptr;
        std::size_t reduce_elems = 0;
        bool last_reduce = false; ///< divides, for avg

        int peer_at(int k) const noexcept {
            return count == 1 ? peer : peers[static_cast<std::size_t>(k)];
        }
        std::byte* recv_at(int k) const noexcept {
            return count == 1 ? recv : recvs[static_cast<std::size_t>(k)];
        }
        std::size_t recv_bytes_at(int k) const noexcept {
            return count == 1 ? recv_bytes : recv_sizes[static_cast<std::size_t>(k)];
        }
        const std::byte* send_at(int k) const noexcept {
            return count == 1 ? send : send_data[static_cast<std::size_t>(k)];
        }
        std::size_t send_elems_at(int k) const noexcept {
            return count == 1 ? send_elems : send_counts[static_cast<std::size_t>(k)];
        }
        /// Member 0's entries copied to the single-peer fields.
        void first_member() noexcept {
            peer = peers[0];
            send = send_data[0];
            send_elems = send_counts[0];
            recv = recvs[0];
            recv_bytes = recv_sizes[0];
        }
    };

    // Blocks: the p ranks of the halving each end owning one block of the buffer,
    // block i being elements [lo(i), lo(i + 1)) (of the scratch copy in slot order,
    // for a reduce_scatter).
    std::size_t lo(int i) const noexcept {
        if (scatter_) {
            return slot_lo_[static_cast<std::size_t>(i)];
        }
        const auto n = static_cast<std::size_t>(p_);
        const std::size_t base = call_.count / n, rem = call_.count % n;
        const auto u = static_cast<std::size_t>(i);
        return u * base + std::min(u, rem);
    }

    /// A checked step that sends `elems` elements from `from` to `peer`, receiving
    /// nothing.
    static step give_to(int peer, const std::byte* from, std::size_t elems) noexcept {
        step s;
        s.peer = peer;
        s.checked = true;
        s.sends = true;
        s.send = from;
        s.send_elems = elems;
        return s;
    }
    /// A checked step that receives `bytes` from `peer` into `into`, sending nothing.
    static step take_from(int peer, std::byte* into, std::size_t bytes,
                          bool writes_output) noexcept {
        step s;
        s.peer = peer;
        s.checked = true;
        s.writes_output = writes_output;
        s.recv = into;
        s.recv_bytes = bytes;
        return s;
    }

    /// A reduce_scatter's slots: slot s holds the blocks of the halving's rank v, s
    /// with its log2(p) bits reversed (the blocks of ranks 2v and 2v + 1 when v folds
    /// in, of rank v + (n - p) otherwise; of ranks v, v + p, ..., v + (q - 1) p, in
    /// that order, when a group of q ends the halving), so that each rank ends with its
    /// own.
    void lay_out_slots() {
        const int rem = size_ - unit_ * p_;
        const int bits = std::countr_zero(static_cast<unsigned>(p_));
        slot_lo_.assign(static_cast<std::size_t>(p_) + 1, 0);
        slot_rank_.assign(static_cast<std::size_t>(p_), 0);
        slot_ranks_.assign(static_cast<std::size_t>(p_), 1);
        slot_stride_ = unit_ > 1 ? p_ : 1;
        for (int s = 0; s < p_; ++s) {
            int v = 0;
            for (int bit = 0; bit < bits; ++bit) {
                v |= ((s >> bit) & 1) << (bits - 1 - bit);
            }
            const auto at = static_cast<std::size_t>(s);
            slot_rank_[at] = v < rem ? 2 * v : v + rem;
            slot_ranks_[at] = unit_ > 1 ? unit_ : v < rem ? 2 : 1;
            slot_lo_[at + 1] =
                slot_lo_[at] + static_cast<std::size_t>(slot_ranks_[at]) * call_.count;
        }
    }

    /// A step of participant `me`'s group: member k, of place t (i + p t for every
    /// place t but its own, in order; `real` maps participants to ranks), is peer k,
    /// and member(s, k, t) sets what goes to it and comes from it.
    template <class Real, class Member>
    step group_step(int me, Real real, Member member) const {
        const int place = me / p_, i = me % p_;
        step s;
        s.place = place;
        s.count = 0;
        for (int t = 0; t < unit_; ++t) {
            if (t != place) {
                const auto k = static_cast<std::size_t>(s.count++);
                s.peers[k] = real(i + p_ * t);
                member(s, k, t);
            }
        }
        s.first_member();
        s.sends = true;
        return s;
    }

    /// The all_gather: recursive doubling, each step a checked exchange of the run
    /// of blocks each side holds.
    void plan_gather() {
        const int rem = size_ - unit_ * p_;
        const std::size_t block = call_.count;
        auto* out = static_cast<std::byte*>(call_.recv);
        own_block_ = {};
        steps_.clear();
        if (rank_ < 2 * rem && rank_ % 2 == 0) { // folds in: hands over, gets the result
            steps_.push_back(give_to(rank_ + 1, static_cast<const std::byte*>(call_.send), block));
            steps_.push_back(take_from(rank_ + 1, out, total_ * es_, true));
            return;
        }
        const bool folds = rank_ < 2 * rem;
        const int me = folds ? rank_ / 2 : rank_ - rem;
        const auto real = [rem](int r) { return r < rem ? r * 2 + 1 : r + rem; };
        // The first element of halving rank v's blocks (the first of ranks 2v, 2v + 1
        // when it folded in); v = p: the end.
        const auto first = [&](int v) {
            return static_cast<std::size_t>(v < rem ? 2 * v : v + rem) * block;
        };
        if (folds) {
            steps_.push_back(take_from(rank_ - 1, scratch_partial(first(me)), block * es_, false));
        }
        // Within this rank's place (all of them without a group), participants
        // base + i: runs of its blocks double; then the group swaps places' runs.
        const int i = me % p_, base = me - i;
        for (int mask = 1; mask < p_; mask <<= 1) {
            const int mine = base + (i & ~(mask - 1)), theirs = base + ((i ^ mask) & ~(mask - 1));
            step s;
            s.peer = real(base + (i ^ mask));
            s.checked = true;
            s.sends = true;
            s.send = scratch_partial(first(mine));
            s.send_elems = first(mine + mask) - first(mine);
            s.recv = scratch_partial(first(theirs));
            s.recv_bytes = (first(theirs + mask) - first(theirs)) * es_;
            steps_.push_back(s);
        }
        if (unit_ > 1) { // each place's run to the group's other places
            step s = group_step(me, real, [&](step& g, std::size_t k, int t) {
                g.send_data[k] = scratch_partial(first(base));
                g.send_counts[k] = first(base + p_) - first(base);
                g.recvs[k] = scratch_partial(first(p_ * t));
                g.recv_sizes[k] = (first(p_ * t + p_) - first(p_ * t)) * es_;
            });
            s.checked = true;
            steps_.push_back(s);
        }
        own_block_ = {partial_, out, total_ * es_};
        if (folds) {
            steps_.push_back(give_to(rank_ - 1, partial_, total_));
        }
    }

    void plan() {
        const int rem = size_ - unit_ * p_;
        const std::size_t count = total_;
        // A reduce_scatter reads its input from the slot-ordered copy.
        const auto* in = scatter_ ? partial_ : static_cast<const std::byte*>(call_.send);
        auto* out = static_cast<std::byte*>(call_.recv);
        own_block_ = {};
        steps_.clear();
        if (rank_ < 2 * rem && rank_ % 2 == 0) { // folds in: hands over, gets the result
            steps_.push_back(give_to(rank_ + 1, in, count));
            // the whole result, or its own block
            steps_.push_back(take_from(rank_ + 1, out, call_.count * es_, true));
            return;
        }
        const bool folds = rank_ < 2 * rem; // odd: reduces a neighbour's buffer into its own
        const int me = folds ? rank_ / 2 : rank_ - rem;
        const auto real = [rem](int r) { return r < rem ? r * 2 + 1 : r + rem; };
        // Scratch: partial sums in the buffer's own coordinates (the whole buffer when
        // folding in, else from the first kept half on), then the incoming half.
        const std::byte* source = in;
        const std::size_t partial_base = partial_base_; ///< element that partial_ stands for
        if (folds) {
            step take = take_from(rank_ - 1, incoming_for(in), count * es_, false);
            take.reduce_in = in;
            take.reduce_out = scratch_partial(0);
            take.reduce_elems = count;
            steps_.push_back(take);
            source = scratch_partial(0);
        }
        // Within this rank's place (all of them without a group), participants
        // base + i: the halving; then the group sums the places' partial sums of the
        // block they all kept.
        const int i = me % p_, base = me - i;
        // Reduce-scatter by recursive halving: the range of blocks [b, b + width)
        // halves at each step; the lower rank of a pair keeps the lower half.
        struct halving {
            int peer;
            int kept_b, kept_w, sent_b;
        };
        std::vector<halving> halvings;
        int b = 0, width = p_;
        for (int mask = 1; mask < p_; mask <<= 1) {
            const int half = width / 2;
            const bool lower = (i & mask) == 0;
            const int kept = lower ? b : b + half, sent = lower ? b + half : b;
            halvings.push_back({real(base + (i ^ mask)), kept, half, sent});
            b = kept;
            width = half;
        }
        for (std::size_t k = 0; k < halvings.size(); ++k) {
            const halving& h = halvings[k];
            const std::size_t kept_lo = lo(h.kept_b), kept_hi = lo(h.kept_b + h.kept_w);
            const std::size_t sent_lo = lo(h.sent_b), sent_hi = lo(h.sent_b + h.kept_w);
            const bool from_input = source == in;
            step s;
            s.peer = h.peer;
            s.checked = true;
            s.sends = true;
            s.send = from_input ? in + sent_lo * es_ : scratch_partial(sent_lo - partial_base);
            s.send_elems = sent_hi - sent_lo;
            s.recv = incoming_for(in + kept_lo * es_); // the peer's half, laid out as ours
            s.recv_bytes = (kept_hi - kept_lo) * es_;
            s.reduce_in = from_input ? in + kept_lo * es_ : scratch_partial(kept_lo - partial_base);
            s.reduce_out = scratch_partial(kept_lo - partial_base);
            s.reduce_elems = kept_hi - kept_lo;
            s.last_reduce = k + 1 == halvings.size() && unit_ == 1;
            steps_.push_back(s);
            source = nullptr; // from now on the partial sums
        }
        // The group: its q members hold the same block b, each summed over its own
        // place; they reduce-scatter it among themselves, member t summing share t
        // (a reduce_scatter's share t is the block of the slot's t-th rank), so each
        // link carries (q - 1) / q of the block where sending all of it to every
        // other member would carry q - 1 blocks.
        const int place = me / p_;
        const std::size_t blo = lo(b), elems = lo(b + 1) - blo;
        const auto share = [&](int t) { // the first element of share t, from blo
            const auto u = static_cast<std::size_t>(t), q = static_cast<std::size_t>(unit_);
            return scatter_ ? u * call_.count : u * (elems / q) + std::min(u, elems % q);
        };
        const std::size_t mine_lo = blo + share(place), mine = share(place + 1) - share(place);
        if (unit_ > 1) {
            const std::byte* sums =
                source == in ? in + blo * es_ : scratch_partial(blo - partial_base);
            const std::byte* like = in + mine_lo * es_;
            step s = group_step(me, real, [&](step& g, std::size_t k, int t) {
                g.send_data[k] = sums + share(t) * es_;
                g.send_counts[k] = share(t + 1) - share(t);
                // Member k's share of this rank's at its own cache-line offset, a line
                // past member k - 1's.
                g.recvs[k] =
                    same_line_offset(incoming_ + k * (mine * es_ + cache_line_bytes), like);
                g.recv_sizes[k] = mine * es_;
            });
            s.checked = true;
            s.reduce_in = sums + share(place) * es_;
            s.reduce_out = scratch_partial(mine_lo - partial_base);
            s.reduce_elems = mine;
            s.last_reduce = true;
            steps_.push_back(s);
        }
        if (scatter_) { // done: the own block out, a folded neighbour's back to it
            const auto in_slot = [&](int r) { // r's block within slot b
                const int first = slot_rank_[static_cast<std::size_t>(b)];
                return lo(b) + static_cast<std::size_t>((r - first) / slot_stride_) * call_.count;
            };
            own_block_ = {scratch_partial(in_slot(rank_)), out, call_.count * es_};
            if (folds) {
                steps_.push_back(
                    give_to(rank_ - 1, scratch_partial(in_slot(rank_ - 1)), call_.count));
            }
            return;
        }
        // All-gather by recursive doubling, the halving in reverse: send what this
        // rank holds, receive what the partner of that step kept.
        // With the halving's partners at distance 1, 2, 4, ... the block a rank ends
        // with is its number with the bits reversed: b, where the halving left it.
        // In a group, first the members' shares of b to every member (the block's
        // all-gather, straight into the output; the own share copied there first).
        const std::size_t own_lo = unit_ > 1 ? mine_lo : lo(b);
        const std::size_t own_hi = unit_ > 1 ? mine_lo + mine : lo(b + 1);
        own_block_ = {scratch_partial(own_lo - partial_base), out + own_lo * es_,
                      (own_hi - own_lo) * es_};
        copy_at_end_ = halvings.empty() && unit_ == 1; // one rank: no all-gather to copy it
        if (unit_ > 1) {
            step s = group_step(me, real, [&](step& g, std::size_t k, int t) {
                g.send_data[k] = own_block_.from;
                g.send_counts[k] = mine;
                g.recvs[k] = out + (blo + share(t)) * es_;
                g.recv_sizes[k] = (share(t + 1) - share(t)) * es_;
            });
            s.writes_output = true;
            s.copy_block = true;
            steps_.push_back(s);
        }
        for (std::size_t k = halvings.size(); k-- > 0;) {
            const halving& h = halvings[k];
            const std::size_t kept_lo = lo(h.kept_b), kept_hi = lo(h.kept_b + h.kept_w);
            const std::size_t sent_lo = lo(h.sent_b), sent_hi = lo(h.sent_b + h.kept_w);
            step s;
            s.peer = h.peer;
            s.writes_output = true;
            s.copy_block = k + 1 == halvings.size() && unit_ == 1;
            s.sends = true;
            s.send = out + kept_lo * es_;
            s.send_elems = kept_hi - kept_lo;
            s.recv = out + sent_lo * es_;
            s.recv_bytes = (sent_hi - sent_lo) * es_;
            steps_.push_back(s);
        }
        if (folds) { // hands the result back, with the header that says it is one
            steps_.push_back(give_to(rank_ - 1, out, count));
        }
    }

    std::byte* scratch_partial(std::size_t elem) const noexcept { return partial_ + elem * es_; }
    /// Where in the incoming scratch a half arrives that the peer keeps where this
    /// rank keeps `like`: at its offset within a cache line.
    std::byte* incoming_for(const std::byte* like) const noexcept {
        return same_line_offset(incoming_, like);
    }

    /// Whether every request is complete (no MPI call when none is left).
    bool test_all(std::vector<MPI_Request>& requests) const {
        if (std::all_of(requests.begin(), requests.end(),
                        [](MPI_Request r) { return r == MPI_REQUEST_NULL; })) {
            return true;
        }
        int flag = 0;
        UNISON_CHECK_MPI(MPI_Testall(static_cast<int>(requests.size()), requests.data(), &flag,
                                     MPI_STATUSES_IGNORE),
                         rank_, label_.str());
        return flag != 0;
    }

    void check(int rc, const char* what) const {
        if (rc != MPI_SUCCESS) {
            throw_mpi_error(rc, rank_, label_.str(), what);
        }
    }

    void isend(const std::byte* data, std::size_t bytes, int peer, int tag) {
        sends_.push_back(MPI_REQUEST_NULL);
        check(MPI_Isend(data, static_cast<int>(bytes), MPI_BYTE, peer, tag, comm_, &sends_.back()),
              "MPI_Isend (rabenseifner)");
    }
    void irecv(std::byte* data, std::size_t bytes, int peer, int tag) {
        recvs_.push_back(MPI_REQUEST_NULL);
        recv_peers_.push_back(peer);
        check(MPI_Irecv(data, static_cast<int>(bytes), MPI_BYTE, peer, tag, comm_, &recvs_.back()),
              "MPI_Irecv (rabenseifner)");
    }

    /// Posts the current step.
    void post() {
        const step& s = steps_[current_];
        recvs_.clear();
        recv_peers_.clear();
        sends_.clear();
        first_arrived_ = false;
        if (!s.checked) { // all-gather: only when every call agreed (so never faulted here)
            if (faulted_) {
                return;
            }
            if (s.copy_block && own_block_.bytes != 0) {
                std::memcpy(own_block_.out, own_block_.from, own_block_.bytes);
            }
            for (int k = 0; k < s.count; ++k) {
                for_each_segment(s.recv_bytes_at(k), [&](std::size_t at, std::size_t len) {
                    irecv(s.recv_at(k) + at, len, s.peer_at(k), gather_tag_);
                });
            }
            for (int k = 0; k < s.count; ++k) {
                for_each_segment(s.send_elems_at(k) * es_, [&](std::size_t at, std::size_t len) {
                    isend(s.send_at(k) + at, len, s.peer_at(k), gather_tag_);
                });
            }
            return;
        }
        firsts_arrived_ = 0;
        early_.fill(false);
        if (s.recv_bytes != no_recv) {
            irecv(recv_stage_->data(), mpi_whole_message_max_bytes, s.peer, check_tag_);
        }
        for (int k = 1; k < s.count; ++k) {
            irecv(recv_stage_->data() + static_cast<std::size_t>(k) * mpi_whole_message_max_bytes,
                  mpi_whole_message_max_bytes, s.peer_at(k), check_tag_);
        }
        // Each peer's first message staged on its own (a group's members may each get
        // other data): the header, then the fault or the data's first bytes.
        for (int k = 0; s.sends && k < s.count; ++k) {
            std::byte* stage =
                send_stage_ + static_cast<std::size_t>(k) * mpi_whole_message_max_bytes;
            const std::size_t data = faulted_ ? 0 : s.send_elems_at(k) * es_;
            mine_.following = data;
            mine_.faulted = faulted_ ? 1 : 0;
            std::memcpy(stage, &mine_, mpi_header_bytes);
            std::size_t inline_bytes = 0;
            if (faulted_) {
                std::memcpy(stage + mpi_header_bytes, &fault_, sizeof(mpi_call_fault));
                inline_bytes = sizeof(mpi_call_fault);
            } else {
                inline_bytes = mpi_first_part(mpi_header_bytes + data) - mpi_header_bytes;
                if (inline_bytes != 0) {
                    std::memcpy(stage + mpi_header_bytes, s.send_at(k), inline_bytes);
                }
            }
            const int peer = s.peer_at(k);
            isend(stage, mpi_header_bytes + inline_bytes, peer, check_tag_);
            if (!faulted_) {
                const std::byte* rest = s.send_at(k) + inline_bytes;
                for_each_segment(data - inline_bytes, [&](std::size_t at, std::size_t len) {
                    isend(rest + at, len, peer, rest_tag_);
                });
            }
        }
    }

    /// Bytes of the rest of peer `k`'s checked message when its call is this rank's
    /// and the rest is received early (receive_rests_early), or 0: never into the
    /// caller's output.
    std::size_t early_rest_bytes(const step& s, int k) const noexcept {
        return s.writes_output || s.recv_bytes_at(k) == no_recv
                   ? 0
                   : mpi_early_rest_bytes(s.recv_bytes_at(k));
    }

    /// Receives the rest of each peer's checked message before its first has
    /// arrived, as soon as MPI holds one of exactly the size this rank's call
    /// implies, on this call's rest tag: a large rest goes as a rendezvous, which
    /// starts only once its receive is posted, so waiting for the header would add
    /// the header's latency to every large step. The size comes from the message
    /// itself (nothing is truncated), the data lands in scratch where it would have
    /// gone, and receive_first checks that the header announces exactly it.
    void receive_rests_early(const step& s) {
        for (int k = 0; k < s.count; ++k) {
            const auto at = static_cast<std::size_t>(k);
            const std::size_t rest = early_rest_bytes(s, k);
            if (rest == 0 || early_[at] || recvs_[at] == MPI_REQUEST_NULL) {
                continue;
            }
            int flag = 0;
            MPI_Status status;
            check(MPI_Iprobe(s.peer_at(k), rest_tag_, comm_, &flag, &status),
                  "MPI_Iprobe (rabenseifner)");
            int got = 0;
            if (flag == 0 || MPI_Get_count(&status, MPI_BYTE, &got) != MPI_SUCCESS ||
                static_cast<std::size_t>(got) != rest) {
                continue;
            }
            irecv(s.recv_at(k) + (mpi_first_message_bytes - mpi_header_bytes), rest, s.peer_at(k),
                  rest_tag_);
            early_[at] = true;
        }
    }

    /// Peer `k`'s first message is here (k > 0: a group's later members):
    /// check its header, then receive the rest of its data where it goes (into a
    /// drain when its call differs: every message of this call is received, so none
    /// is left for a later call to match). In a group the fault is decided once every
    /// member's has come (finish_step), alike on all of them.
    void receive_first(const step& s, int k, const MPI_Status& status) {
        const int peer = s.peer_at(k);
        int got = 0;
        MPI_Get_count(&status, MPI_BYTE, &got);
        const auto n = static_cast<std::size_t>(got);
        const std::byte* first =
            recv_stage_->data() + static_cast<std::size_t>(k) * mpi_whole_message_max_bytes;
        if (n < mpi_header_bytes) {
            throw mismatch_error(rank_, label_.str(),
                                 "rank " + std::to_string(peer) + " sent a " + std::to_string(n) +
                                     "-byte message where a call header was due: it is not "
                                     "running this collective",
                                 peer, "operation");
        }
        mpi_call_header& theirs = theirs_[static_cast<std::size_t>(k)];
        std::memcpy(&theirs, first, mpi_header_bytes);
        const std::size_t announced = theirs.faulted != 0
                                          ? sizeof(mpi_call_fault)
                                          : static_cast<std::size_t>(theirs.following);
        const std::size_t sent = mpi_header_bytes + announced;
        if (n > sent) { // never from a rank running this code: nothing past what it says
            throw mismatch_error(rank_, label_.str(),
                                 "rank " + std::to_string(peer) + " sent a " + std::to_string(n) +
                                     "-byte message whose header announced " +
                                     std::to_string(sent) +
                                     " bytes: it is not running this collective",
                                 peer, "operation");
        }
        const std::size_t rest = sent > n && n == mpi_first_part(sent) ? sent - n : 0;
        // The tag the peer's algorithm sends its rest on.
        const int their_rest_tag =
            theirs.faulted != 0 ? check_tag_ : mpi_rest_tag(theirs.algorithm, theirs.sequence);
        const bool early = early_[static_cast<std::size_t>(k)];
        if (early && (rest != early_rest_bytes(s, k) || their_rest_tag != rest_tag_)) {
            throw mismatch_error(rank_, label_.str(),
                                 "rank " + std::to_string(peer) + " sent a " +
                                     std::to_string(early_rest_bytes(s, k)) +
                                     "-byte message that its call header did not announce: it "
                                     "is not running this collective",
                                 peer, "operation");
        }
        const bool group = s.count > 1;
        bool takes_data = false;
        if (theirs.faulted != 0) {
            if (n >= mpi_header_bytes + sizeof(mpi_call_fault)) {
                std::memcpy(&carried_[static_cast<std::size_t>(k)], first + mpi_header_bytes,
                            sizeof(mpi_call_fault));
                if (!group && replaces(faulted_, fault_, carried_[0])) {
                    fault_ = carried_[0];
                    faulted_ = true;
                }
            } else if (group) {
                throw mismatch_error(rank_, label_.str(),
                                     "rank " + std::to_string(peer) +
                                         " sent a fault too short to read: it is not running "
                                         "this collective",
                                     peer, "operation");
            }
        } else if (group && same_call(without_following(mine_), without_following(theirs)) &&
                   theirs.following != s.recv_bytes_at(k)) {
            // A member sends each other member its share: the same call sends this
            // rank exactly its share's bytes (decide_group compares the calls alone).
            throw mismatch_error(
                rank_, label_.str(),
                "rank " + std::to_string(peer) + " sent " + std::to_string(theirs.following) +
                    " bytes of its group's block where " + std::to_string(s.recv_bytes_at(k)) +
                    " were due: it is not running this collective",
                peer, "operation");
        } else if (!agrees(theirs, s.recv_bytes_at(k))) {
            if (!group && !faulted_) {
                fault_ = fault_between(rank_, mine_, peer, theirs);
                faulted_ = true;
            }
        } else {
            takes_data = !faulted_;
        }
        received_[static_cast<std::size_t>(k)] = takes_data;
        if (takes_data) {
            std::byte* into = s.recv_at(k);
            const std::size_t inline_bytes = n - mpi_header_bytes;
            if (inline_bytes != 0) {
                std::memcpy(into, first + mpi_header_bytes, inline_bytes);
            }
            if (!early) {
                for_each_segment(rest, [&](std::size_t at, std::size_t len) {
                    irecv(into + inline_bytes + at, len, peer, rest_tag_);
                });
            }
            return;
        }
        // The peer's messages go nowhere: the rest of them, if any, into a drain of
        // exactly the announced size, on the tag the peer's algorithm sends it on
        // (received early, it went to scratch, unread).
        if (rest != 0 && !early) {
            std::vector<std::byte>& drain = drains_[static_cast<std::size_t>(k)];
            drain.resize(rest);
            for_each_segment(rest, [&](std::size_t at, std::size_t len) {
                irecv(drain.data() + at, len, peer, their_rest_tag);
            });
        }
    }

    /// Whether a peer's header `theirs`, sending `bytes` of data, is this rank's call.
    bool agrees(const mpi_call_header& theirs, std::size_t bytes) const noexcept {
        return same_call(without_following(mine_), without_following(theirs)) &&
               theirs.following == bytes;
    }

    static mpi_call_header without_following(mpi_call_header h) noexcept {
        h.following = 0;
        return h;
    }

    /// A group's headers are all here: the fault every member keeps is the lowest
    /// pair of ranks among those carried in and those of the members whose calls
    /// differ (every member sees the same headers, but for the data bytes that
    /// follow, its own share's: receive_first checks those).
    void decide_group(const step& s) {
        fault_choice choice{faulted_, fault_};
        std::array<const mpi_call_header*, max_group> calls{};
        std::array<int, max_group> ranks{};
        std::size_t members = 0;
        if (!faulted_) {
            calls[members] = &mine_;
            ranks[members++] = rank_;
        }
        for (int k = 0; k < s.count; ++k) {
            const auto at = static_cast<std::size_t>(k);
            if (theirs_[at].faulted != 0) {
                choice.keep(carried_[at]);
            } else {
                calls[members] = &theirs_[at];
                ranks[members++] = s.peer_at(k);
            }
        }
        for (std::size_t a = 0; a < members; ++a) {
            for (std::size_t b = a + 1; b < members; ++b) {
                if (!same_call(without_following(*calls[a]), without_following(*calls[b]))) {
                    choice.keep(fault_between(ranks[a], *calls[a], ranks[b], *calls[b]));
                }
            }
        }
        if (choice.found) {
            fault_ = choice.fault;
            faulted_ = true;
        }
    }

    /// The step's sends and receives are done: reduce what arrived.
    void finish_step(const step& s) {
        if (s.checked && s.count > 1) {
            decide_group(s);
        }
        if (faulted_ || !s.checked || s.reduce_out == nullptr ||
            !std::all_of(received_.begin(), received_.begin() + s.count,
                         [](bool r) { return r; })) {
            return;
        }
        // The partial results in the group's order (a pair's two commute).
        std::array<const void*, max_group> inputs{};
        for (int k = 0, o = 0; k <= s.count; ++k) {
            inputs[static_cast<std::size_t>(k)] =
                k == s.place ? static_cast<const void*>(s.reduce_in) : s.recv_at(o++);
        }
        void* outputs[1] = {s.reduce_out};
        host_reduce(call_.type, call_.reduction, inputs.data(), s.count + 1, outputs, 1,
                    s.reduce_elems, s.last_reduce && call_.reduction == reduce_op::avg ? size_ : 1);
    }

    MPI_Comm comm_;
    int rank_, size_, check_tag_, rest_tag_, gather_tag_;
    const collective_call& call_;
    const call_label& label_;
    std::size_t es_;
    int p_ = 1;             ///< ranks of the halving (a power of two), in units of ...
    int unit_ = 1;          ///< ... one rank, or a group of q (q times a power of two ranks)
    bool scatter_ = false;  ///< a reduce_scatter
    bool gather_ = false;   ///< an all_gather (neither: an all-reduce)
    std::size_t total_ = 0; ///< elements of the input
    std::vector<std::size_t> slot_lo_; ///< a reduce_scatter's slots
    /// Slot s holds the blocks of slot_ranks_[s] ranks, from slot_rank_[s] on, every
    /// slot_stride_-th.
    std::vector<int> slot_rank_, slot_ranks_;
    int slot_stride_ = 1;
    mpi_call_header mine_;
    std::vector<step> steps_;
    std::size_t current_ = 0;
    std::size_t partial_elems_ = 0, incoming_elems_ = 0;
    /// The element partial_ stands for: an all-reduce's first kept half on a rank that
    /// does not fold in (the halving's first step keeps it), else 0.
    std::size_t partial_base_ = 0;
    std::byte* partial_ = nullptr;
    std::byte* incoming_ = nullptr; ///< the incoming half's room (incoming_for places it)
    struct {
        const std::byte* from = nullptr; ///< in scratch
        std::byte* out = nullptr;
        std::size_t bytes = 0;
    } own_block_;
    std::byte* send_stage_ = nullptr;
    std::vector<std::byte>* recv_stage_ = nullptr;
    std::array<std::vector<std::byte>, max_step_peers> drains_;
    bool first_arrived_ = false;
    int firsts_arrived_ = 0;                      ///< a group's first messages so far
    std::array<bool, max_step_peers> received_{}; ///< the data of each peer is this call's
    std::array<bool, max_step_peers> early_{};    ///< whose rest was received early
    std::array<mpi_call_header, max_step_peers> theirs_{};
    std::array<mpi_call_fault, max_step_peers> carried_{}; ///< faults the peers' headers announced
    bool copy_at_end_ =
        false; ///< an all-reduce with no all-gather step copies its block at the end
    bool faulted_ = false;
    mpi_call_fault fault_;
    std::vector<MPI_Request> recvs_, sends_;
    std::vector<int> recv_peers_; ///< whose message each of recvs_ receives
};

} // namespace unison::detail
