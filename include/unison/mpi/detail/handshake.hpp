#pragma once

/// \file
/// The first exchange of every collective of the MPI backend: each rank's call
/// signature travels to every other rank by recursive doubling of point-to-point
/// messages (schedule.hpp: for 3, 5 or 7 times a power of two ranks, doubling
/// within each third, fifth or seventh of the ranks, then groups of that many, whose
/// members each send to all the others), so that a call that differs across ranks (count, dtype, op, root,
/// operation, tag, sequence) is a `mismatch_error` on every rank before MPI may
/// write any user buffer. Small all-reduces ride along: their data follows the
/// header in the same messages and is reduced at each step, so for them the check
/// costs nothing and the call is one exchange per doubling step (out of place, a
/// message cut in two sends its rest straight from the caller's input, which MPI
/// only reads).
///
/// A rank that finds a difference keeps to the schedule but sends the fault (both
/// signatures and ranks) instead of data, so every rank hears of it within the
/// same exchange and throws a mismatch_error. When one rank is the odd one out,
/// every rank names the same pair (in a group, each member sees every member's
/// header and keeps the lowest pair that differs); when several pairs differ from the start (half
/// the ranks with one count, half with another), groups of ranks may name
/// different pairs. Messages are received into staging
/// buffers large enough for any well-formed message, so a peer that sends more
/// than expected can never write past a buffer.
///
/// The header also names the algorithm that carries the call (comm_options::
/// all_reduce_algorithm, or the tuning's choice), so ranks that would run
/// different schedules fail alike where their schedules meet (the communicator's
/// constructor already refuses options that differ, so this is a second line). The
/// Rabenseifner all-reduce (rabenseifner.hpp) carries the same headers in its first
/// steps instead of running this schedule first; its messages follow the same
/// two-message convention, so either side drains what the other sent.

#include "unison/comm/algorithm.hpp"
#include "unison/comm/collective.hpp"
#include "unison/comm/detail/matching.hpp"
#include "unison/comm/detail/validate.hpp"
#include "unison/core/detail/host_reduce.hpp"
#include "unison/core/dtype.hpp"
#include "unison/core/error.hpp"
#include "unison/core/reduce_op.hpp"
#include "unison/mpi/detail/mpi_check.hpp"
#include "unison/mpi/detail/schedule.hpp"

#include <mpi.h>

#include <algorithm>
#include <array>
#include <bit>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

namespace unison::detail {

/// Tags above max_user_tag are reserved, in ranges that each call takes one tag of
/// by its sequence number, so that calls in flight at once never match each other's
/// messages: the ring's messages (and the rest of Rabenseifner's checked messages,
/// beyond the first), the handshake's (and every call header), and Rabenseifner's
/// all-gather. Every tag stays below 32767, the least MPI_TAG_UB MPI allows.
inline constexpr int mpi_ring_tag_base = max_user_tag + 1;
inline constexpr int mpi_ring_tags = 1024;
inline constexpr int mpi_handshake_tag_base = mpi_ring_tag_base + mpi_ring_tags;
inline constexpr int mpi_handshake_tags = 1024;
inline constexpr int mpi_gather_tag_base = mpi_handshake_tag_base + mpi_handshake_tags;
inline constexpr int mpi_gather_tags = 512;
static_assert(mpi_gather_tag_base + mpi_gather_tags <= 32767, "tags fit the least MPI_TAG_UB");

/// The tag of range [base, base + tags) that the `sequence`-th call uses.
constexpr int mpi_tag(int base, int tags, std::uint64_t sequence) noexcept {
    return base + static_cast<int>(sequence % static_cast<std::uint64_t>(tags));
}

/// What names a call in errors, built only when an error needs it.
struct call_label {
    operation op = operation::barrier;
    std::uint64_t sequence = 0;
    int peer = -1; ///< send/recv only
    int tag = 0;   ///< send/recv only

    /// "all_reduce #12", or "send #3 (peer 1, tag 7)".
    std::string str() const {
        std::string s = operation_label(op, sequence);
        if (op == operation::send || op == operation::recv) {
            s += " (peer " + std::to_string(peer) + ", tag " + std::to_string(tag) + ")";
        }
        return s;
    }
};

/// The header at the front of every handshake message.
struct mpi_call_header {
    call_signature signature;
    std::uint64_t sequence = 0;
    std::uint32_t faulted = 0;   ///< 1: an mpi_call_fault follows instead of data
    std::uint32_t algorithm = 0; ///< the unison::algorithm that carries the call
    std::uint64_t following = 0; ///< bytes of data this step sends after the header
};

/// Two ranks whose calls differ, as the rank that found it saw them.
struct mpi_call_fault {
    std::uint64_t ref_rank = 0;
    call_signature ref;
    std::uint64_t ref_sequence = 0;
    std::uint64_t other_rank = 0;
    call_signature other;
    std::uint64_t other_sequence = 0;
    std::uint64_t ref_algorithm = 0;
    std::uint64_t other_algorithm = 0;
};

inline constexpr std::size_t mpi_header_bytes = sizeof(mpi_call_header);
/// A step's message (header and data) of up to this many bytes travels whole;
/// a larger one is cut: a first message of mpi_first_message_bytes carries the
/// header, and the rest follows in a second. Transports send a message up to some
/// size at once and a larger one only after a round trip: Open MPI over shared
/// memory sends 4 KiB including its own headers, so there the header must not push
/// a 4 KiB all-reduce past it (measured: 3x slower at 4 KiB; docs/measurements.md),
/// and a 4 KiB call takes two messages. Other MPIs send more at once (MPICH's
/// shared-memory cells hold 64 KiB; SimGrid's SMPI as the simulation sets it, 64
/// KiB), and there a step of up to 16000 bytes is one message (in simulation, 4
/// KiB on one node took 1.6x MPI's time in two). Larger steps are cut at 4000
/// bytes everywhere: a small first message arrives before the large rest, whose
/// size the header announces, or the rest itself when it is received before the
/// header (mpi_rest_tag) (cutting at 16000 instead cost 1.06-1.1x in simulation
/// from 256 KiB, a mid-sized message paying more latency there).
#ifdef OMPI_MAJOR_VERSION
inline constexpr std::size_t mpi_whole_message_max_bytes = 4000;
#else
inline constexpr std::size_t mpi_whole_message_max_bytes = 16000;
#endif
/// The first message of a step that is cut.
inline constexpr std::size_t mpi_first_message_bytes = 4000;
static_assert(mpi_first_message_bytes <= mpi_whole_message_max_bytes);

/// Bytes of the first message of a step of `whole` bytes (header included).
constexpr std::size_t mpi_first_part(std::size_t whole) noexcept {
    return whole <= mpi_whole_message_max_bytes ? whole : mpi_first_message_bytes;
}
/// The largest single message: data beyond the first message travels as messages
/// of at most this many bytes, so that every count fits MPI's int.
inline constexpr std::size_t mpi_message_max_bytes = std::size_t{1} << 30;

/// Calls f(offset, length) for each message that carries `bytes` (at most
/// mpi_message_max_bytes each; none for 0 bytes). Both sides of a step cut alike.
template <class F>
void for_each_segment(std::size_t bytes, F&& f) {
    for (std::size_t at = 0; at < bytes; at += mpi_message_max_bytes) {
        f(at, std::min(mpi_message_max_bytes, bytes - at));
    }
}

/// The tag on which a step's message continues beyond its first message, for a
/// sender whose header says `algo` and `sequence`: Rabenseifner's on the ring's tag
/// (which a Rabenseifner call does not otherwise use), the handshake's on the
/// header's own. A receiver posts the receive of a rest only once its exact size
/// is known: announced by the header, or, for a rest larger than any first message,
/// read off the message itself with MPI_Iprobe while the header is still on its way
/// (receive_rests_early). A receive smaller than its message is an error that Open
/// MPI 4.1 has been seen to answer by writing past the receive's buffer.
constexpr int mpi_rest_tag(std::uint32_t algo, std::uint64_t sequence) noexcept {
    return algo == static_cast<std::uint32_t>(algorithm::rabenseifner)
               ? mpi_tag(mpi_ring_tag_base, mpi_ring_tags, sequence)
               : mpi_tag(mpi_handshake_tag_base, mpi_handshake_tags, sequence);
}

/// The rest of a step's message of `data` bytes (after the header) that a receiver
/// may take before the header has announced it (receive_rests_early), or 0: only a
/// rest larger than any first message, so that no first message can be taken for
/// one, and smaller than the pieces a larger rest is sent in (for_each_segment), so
/// that a message of that size is the whole rest.
constexpr std::size_t mpi_early_rest_bytes(std::size_t data) noexcept {
    const std::size_t whole = mpi_header_bytes + data;
    const std::size_t rest = whole - mpi_first_part(whole);
    return rest > mpi_whole_message_max_bytes && rest < mpi_message_max_bytes ? rest : 0;
}
static_assert(mpi_early_rest_bytes(0) == 0);
static_assert(mpi_early_rest_bytes(mpi_first_message_bytes + mpi_whole_message_max_bytes -
                                   mpi_header_bytes) == 0);
static_assert(mpi_early_rest_bytes(mpi_first_message_bytes + mpi_whole_message_max_bytes + 1 -
                                   mpi_header_bytes) == mpi_whole_message_max_bytes + 1);
static_assert(mpi_early_rest_bytes(mpi_first_message_bytes + mpi_message_max_bytes -
                                   mpi_header_bytes) == 0);

/// Bytes of a staging buffer for a step whose data is `bytes`: the most a
/// well-formed peer sends in that step.
constexpr std::size_t mpi_staging_bytes(std::size_t bytes) noexcept {
    return mpi_header_bytes + std::max(sizeof(mpi_call_fault), bytes);
}

static_assert(mpi_header_bytes + sizeof(mpi_call_fault) <= mpi_first_message_bytes,
              "a fault fits in the first message");
static_assert(sizeof(mpi_call_header) % 8 == 0, "data after the header stays 8-byte aligned");

inline bool same_call(const mpi_call_header& a, const mpi_call_header& b) noexcept {
    return std::memcmp(&a.signature, &b.signature, sizeof(call_signature)) == 0 &&
           a.sequence == b.sequence && a.algorithm == b.algorithm;
}

/// The fault between this rank's call `mine` and `theirs`, the call of `peer`.
inline mpi_call_fault fault_between(int rank, const mpi_call_header& mine, int peer,
                                    const mpi_call_header& theirs) noexcept {
    const bool me_first = rank < peer;
    const mpi_call_header& ref = me_first ? mine : theirs;
    const mpi_call_header& other = me_first ? theirs : mine;
    mpi_call_fault f;
    f.ref_rank = static_cast<std::uint64_t>(me_first ? rank : peer);
    f.other_rank = static_cast<std::uint64_t>(me_first ? peer : rank);
    f.ref = ref.signature;
    f.ref_sequence = ref.sequence;
    f.ref_algorithm = ref.algorithm;
    f.other = other.signature;
    f.other_sequence = other.sequence;
    f.other_algorithm = other.algorithm;
    return f;
}

/// Whether a fault `heard` from a peer replaces `kept` (none when !faulted): the
/// lower pair of ranks wins, so that faults meeting in a step converge.
inline bool replaces(bool faulted, const mpi_call_fault& kept,
                     const mpi_call_fault& heard) noexcept {
    return !faulted ||
           std::pair(heard.ref_rank, heard.other_rank) < std::pair(kept.ref_rank, kept.other_rank);
}

/// The fault every rank of a step keeps: the lowest pair of ranks (replaces) of
/// the faults carried in and of the pairs found to differ, so that ranks that see
/// the same headers keep the same one.
struct fault_choice {
    bool found = false;
    mpi_call_fault fault{};

    void keep(const mpi_call_fault& f) noexcept {
        if (replaces(found, fault, f)) {
            fault = f;
            found = true;
        }
    }
};

/// Throws the mismatch_error that `f` describes.
[[noreturn]] inline void throw_fault(int rank, const std::string& label, const mpi_call_fault& f) {
    const int ref = static_cast<int>(f.ref_rank), other = static_cast<int>(f.other_rank);
    check_signature(rank, label, ref, f.ref, other, f.other);
    if (f.ref_sequence == f.other_sequence && f.ref_algorithm != f.other_algorithm) {
        const auto name = [](std::uint64_t a) {
            return std::string(to_string(static_cast<algorithm>(a)));
        };
        throw mismatch_error(rank, label,
                             "algorithm differs: rank " + std::to_string(ref) + " runs " +
                                 name(f.ref_algorithm) + " but rank " + std::to_string(other) +
                                 " runs " + name(f.other_algorithm) +
                                 " (comm_options::all_reduce_algorithm or UNISON_ALGORITHM, "
                                 "comm_options::deterministic or UNISON_DETERMINISTIC, and "
                                 "comm_options::tuning or UNISON_TUNING_FILE, must be the same "
                                 "on every rank)",
                             other, "algorithm");
    }
    throw mismatch_error(rank, label,
                         "sequence differs: rank " + std::to_string(ref) + " is at collective #" +
                             std::to_string(f.ref_sequence) + " but rank " + std::to_string(other) +
                             " at #" + std::to_string(f.other_sequence) +
                             " (a rank skipped a call or one failed on some ranks only)",
                         other, "sequence");
}

/// One handshake: its schedule (schedule.hpp: recursive doubling over `size` ranks,
/// or the node-aware two-level one for an all-reduce that algorithm::two_level
/// carries), the requests of the current step, and, for a fused all-reduce, the
/// partial result.
class mpi_handshake {
public:
    /// Starts the handshake of `call` (the `sequence`-th collective, carried by
    /// `algo`) on `comm`, with messages tagged `tag`. With `fused`, `call` is an
    /// all-reduce whose data rides along (recursive doubling or two_level, over
    /// `nodes`) and whose result is final once progress() returns true.
    /// `send_stage` and `recv_stage` are grown to fit and must stay alive, unmoved,
    /// until then, as must `call.send`, which MPI may read (reads_input()).
    void start(MPI_Comm comm, int rank, int size, int tag, const collective_call& call,
               std::uint64_t sequence, algorithm algo, bool fused, const node_layout& nodes,
               std::vector<std::byte>& send_stage, std::vector<std::byte>& recv_stage,
               const call_label* label) {
        comm_ = comm;
        rank_ = rank;
        size_ = size;
        tag_ = tag;
        call_ = &call;
        fused_ = fused;
        if (fused && algo == algorithm::two_level) {
            plan_two_level(rank, nodes, plan_);
        } else {
            plan_recursive_doubling(rank, size, plan_, nodes.node_ranks);
        }
        steps_ = plan_.size();
        last_reduce_ = plan_.last_reduce();
        // One staging slot per peer of the widest step, each large enough for any
        // well-formed message and 64-byte aligned (the data follows 8-byte headers).
        int slots = 1;
        for (int i = 0; i < steps_; ++i) {
            slots = std::max(slots, plan_[i].count);
        }
        const std::size_t staging =
            std::max(mpi_staging_bytes(fused ? bytes() : 0), mpi_whole_message_max_bytes);
        slot_bytes_ = (staging + 63) / 64 * 64;
        if (send_stage.size() < staging) {
            send_stage.resize(staging);
        }
        if (recv_stage.size() < slot_bytes_ * static_cast<std::size_t>(slots)) {
            recv_stage.resize(slot_bytes_ * static_cast<std::size_t>(slots));
        }
        send_ = send_stage.data();
        recv_ = recv_stage.data();
        label_ = label;
        faulted_ = false;
        result_written_ = false;
        mine_ = mpi_call_header{signature_of(call), sequence, 0, static_cast<std::uint32_t>(algo),
                                fused ? bytes() : 0};
        std::memcpy(send_, &mine_, mpi_header_bytes);
        // A message that is cut sends its rest straight from the caller's input
        // until a reduction first writes the partial result, so only the first
        // message's share of the input is staged (copying all of it cost a 1 MiB
        // call at 2 real processes up to a tenth of its time; docs/measurements.md).
        partial_is_input_ = fused_ && call.send != call.recv &&
                            mpi_header_bytes + bytes() > mpi_whole_message_max_bytes;
        input_posted_ = false;
        if (fused_ && bytes() != 0) {
            std::memcpy(send_ + mpi_header_bytes, call.send,
                        partial_is_input_ ? mpi_first_message_bytes - mpi_header_bytes : bytes());
        }
        current_ = 0;
        if (current_ < steps_) {
            post();
        }
    }

    /// Drives the schedule; true once every step is done. Throws mismatch_error (on
    /// every rank) when the calls differ.
    bool progress() {
        while (current_ < steps_) {
            const exchange_step& s = plan_[current_];
            if (s.recv && arrived_ < s.count && !poll_first_messages(s)) {
                return false;
            }
            if (!test_all(rests_) || !test_all(sends_)) {
                return false;
            }
            input_posted_ = false; // this step's sends are done
            if (s.recv) {
                receive(s);
            }
            ++current_;
            if (current_ < steps_) {
                post();
            }
        }
        if (faulted_) {
            throw_fault(rank_, label_->str(), fault_);
        }
        if (fused_ && !result_written_ && call_->recv != call_->send && bytes() != 0) {
            std::memcpy(call_->recv, call_->send, bytes()); // one rank
        }
        return true;
    }

    /// What an error raised in the middle of a step adds while a send of it reads the
    /// caller's input (an error at the end of a step comes after its sends).
    std::string input_note() const {
        return input_posted_ ? mpi_held_buffers_note(true) : std::string();
    }

    /// True while a send of the current step may still read the caller's input (a
    /// fused all-reduce whose message is cut sends its rest from there); every other
    /// buffer MPI holds of a handshake is its own staging.
    bool reads_input() const noexcept { return input_posted_; }

    /// True when nothing of this handshake is in MPI's hands.
    bool idle() const noexcept {
        const auto none = [](const auto& requests) {
            return std::all_of(requests.begin(), requests.end(),
                               [](MPI_Request r) { return r == MPI_REQUEST_NULL; });
        };
        return none(firsts_) && none(rests_) && none(sends_);
    }

    /// The rank whose message this rank is waiting for, or -1.
    int waiting_for() const noexcept {
        if (current_ >= steps_) {
            return -1;
        }
        const exchange_step& s = plan_[current_];
        if (!s.recv) {
            return -1;
        }
        for (int i = 0; i < s.count; ++i) {
            if (firsts_[static_cast<std::size_t>(i)] != MPI_REQUEST_NULL) {
                return s.peer(i);
            }
        }
        for (std::size_t i = 0; i < rests_.size(); ++i) {
            if (rests_[i] != MPI_REQUEST_NULL) {
                return s.peer(rest_peers_[i]);
            }
        }
        return s.peer();
    }

    /// Cancels what is still posted (after a timeout, when the call is abandoned).
    /// MPI writes only the staging buffers, never the user's; a send it cannot
    /// cancel may still read the caller's input (reads_input()).
    void cancel() noexcept {
        for (MPI_Request& r : firsts_) {
            cancel_receive(r);
        }
        for (MPI_Request& r : rests_) {
            cancel_receive(r);
        }
        for (MPI_Request& r : sends_) {
            if (r != MPI_REQUEST_NULL) {
                MPI_Request_free(&r); // completes (or not) on its own
            }
        }
        current_ = steps_;
    }

private:
    std::size_t bytes() const noexcept { return call_->count * size_of(call_->type); }

    /// The staging slot of the current step's peer `i`.
    std::byte* slot(int i) const noexcept {
        return recv_ + slot_bytes_ * static_cast<std::size_t>(i);
    }

    static void cancel_receive(MPI_Request& r) noexcept {
        if (r == MPI_REQUEST_NULL) {
            return;
        }
        // A receive already matched cannot be cancelled and completes only when its
        // sender makes progress: give it a moment, then leave it (the caller keeps
        // the staging buffers alive).
        MPI_Cancel(&r);
        int flag = 0;
        const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
        while (flag == 0 && std::chrono::steady_clock::now() < until) {
            MPI_Test(&r, &flag, MPI_STATUS_IGNORE);
        }
    }

    /// Posts the current step: the receive of each peer's first message, and this
    /// rank's message to each peer, in two parts when its data does not fit in the
    /// first (the same buffer for every peer).
    void post() {
        const exchange_step& s = plan_[current_];
        firsts_.fill(MPI_REQUEST_NULL);
        rests_.clear();
        rest_peers_.clear();
        sends_.clear();
        early_.fill(false);
        arrived_ = 0;
        if (s.recv) {
            for (int i = 0; i < s.count; ++i) {
                UNISON_CHECK_MPI(MPI_Irecv(slot(i), static_cast<int>(mpi_whole_message_max_bytes),
                                           MPI_BYTE, s.peer(i), tag_, comm_,
                                           &firsts_[static_cast<std::size_t>(i)]),
                                 rank_, label_->str());
            }
        }
        if (s.send) {
            const std::size_t whole =
                mpi_header_bytes + (faulted_ ? sizeof(mpi_call_fault) : mine_.following);
            const std::size_t first = mpi_first_part(whole);
            // The rest: the partial result's bytes after the first message's share,
            // from the input while it is the partial result.
            const std::byte* rest =
                partial_is_input_ && !faulted_
                    ? static_cast<const std::byte*>(call_->send) + (first - mpi_header_bytes)
                    : send_ + first;
            for (int i = 0; i < s.count; ++i) {
                sends_.push_back(MPI_REQUEST_NULL);
                UNISON_CHECK_MPI(MPI_Isend(send_, static_cast<int>(first), MPI_BYTE, s.peer(i),
                                           tag_, comm_, &sends_.back()),
                                 rank_, label_->str());
                for_each_segment(whole - first, [&](std::size_t at, std::size_t len) {
                    sends_.push_back(MPI_REQUEST_NULL);
                    UNISON_CHECK_MPI(MPI_Isend(rest + at, static_cast<int>(len), MPI_BYTE,
                                               s.peer(i), tag_, comm_, &sends_.back()),
                                     rank_, label_->str());
                    input_posted_ = input_posted_ || rest != send_ + first;
                });
            }
        }
    }

    /// Receives rests that are already here (receive_rests_early), tests the peers'
    /// first messages (one MPI call), and posts the receive of a second message
    /// wherever a header announces one not yet received, before waiting for this
    /// rank's own sends: a large send may complete only once the peer has posted its
    /// receive. With one peer and this rank's message in one piece (small calls),
    /// the same call tests the send too: polls are what small steps cost. True once
    /// every first message is here.
    bool poll_first_messages(const exchange_step& s) {
        receive_rests_early(s);
        if (s.count == 1) {
            std::array<MPI_Request, 2> both = {firsts_[0], MPI_REQUEST_NULL};
            const int tested = sends_.size() == 1 ? 2 : 1;
            if (tested == 2) {
                both[1] = sends_[0];
            }
            std::array<MPI_Status, 2> status;
            int flag = 0;
            UNISON_CHECK_MPI(MPI_Testall(tested, both.data(), &flag, status.data()), rank_,
                             label_->str());
            firsts_[0] = both[0];
            if (tested == 2) {
                sends_[0] = both[1];
            }
            if (flag == 0) {
                return false;
            }
            arrived_ = 1;
            receive_first(s, 0, status[0]);
            return true;
        }
        std::array<int, max_step_peers> which{};
        std::array<MPI_Status, max_step_peers> status;
        int done = 0;
        UNISON_CHECK_MPI(MPI_Testsome(s.count, firsts_.data(), &done, which.data(), status.data()),
                         rank_, label_->str());
        for (int k = 0; k < done && done != MPI_UNDEFINED; ++k) {
            ++arrived_;
            receive_first(s, which[static_cast<std::size_t>(k)],
                          status[static_cast<std::size_t>(k)]);
        }
        return arrived_ == s.count;
    }

    /// Bytes of the rest of a step's message from a peer whose call is this rank's,
    /// when they are received early (receive_rests_early), or 0.
    std::size_t early_rest_bytes() const noexcept {
        return mpi_early_rest_bytes(fused_ ? bytes() : 0);
    }

    /// Receives the rest of a peer's message before its first has arrived, as soon
    /// as MPI holds one of exactly the size this rank's own call implies: a large
    /// rest is sent as a rendezvous, which starts only once its receive is posted,
    /// so waiting for the header to post it adds the header's latency to every
    /// large step (in simulation, 1.11-1.14x MPI's time at 2 ranks from 128 KiB).
    /// The size comes from the message itself, so nothing is truncated; it lands in
    /// the peer's staging slot, never in the caller's buffers, and receive_first
    /// checks that the header announces exactly it.
    void receive_rests_early(const exchange_step& s) {
        const std::size_t rest = early_rest_bytes();
        if (rest == 0) {
            return;
        }
        for (int i = 0; i < s.count; ++i) {
            const auto at_peer = static_cast<std::size_t>(i);
            if (firsts_[at_peer] == MPI_REQUEST_NULL || early_[at_peer]) {
                continue;
            }
            int flag = 0;
            MPI_Status status;
            UNISON_CHECK_MPI(MPI_Iprobe(s.peer(i), tag_, comm_, &flag, &status), rank_,
                             label_->str());
            int got = 0;
            if (flag == 0 || MPI_Get_count(&status, MPI_BYTE, &got) != MPI_SUCCESS ||
                static_cast<std::size_t>(got) != rest) {
                continue;
            }
            rests_.push_back(MPI_REQUEST_NULL);
            rest_peers_.push_back(i);
            UNISON_CHECK_MPI(MPI_Irecv(slot(i) + mpi_first_message_bytes, got, MPI_BYTE, s.peer(i),
                                       tag_, comm_, &rests_.back()),
                             rank_, label_->str());
            early_[at_peer] = true;
        }
    }

    /// True once `requests` are complete; no MPI call when they are already.
    bool test_all(std::vector<MPI_Request>& requests) const {
        if (std::all_of(requests.begin(), requests.end(),
                        [](MPI_Request r) { return r == MPI_REQUEST_NULL; })) {
            return true;
        }
        int flag = 0;
        UNISON_CHECK_MPI(MPI_Testall(static_cast<int>(requests.size()), requests.data(), &flag,
                                     MPI_STATUSES_IGNORE),
                         rank_, label_->str());
        return flag != 0;
    }

    /// Peer `i`'s first message: its header says whether a second one follows, and
    /// that one is received whatever else the header says, so that no message of
    /// this call is left behind for a later call to match: into the peer's slot
    /// after the first, or, when it announces more than the slot holds (only a peer
    /// whose call differs does), into a buffer of its own whose data is never read.
    void receive_first(const exchange_step& s, int i, const MPI_Status& status) {
        const auto at_peer = static_cast<std::size_t>(i);
        const int peer = s.peer(i);
        int got = 0;
        MPI_Get_count(&status, MPI_BYTE, &got);
        const auto n = static_cast<std::size_t>(got);
        if (n < mpi_header_bytes) {
            throw mismatch_error(rank_, label_->str(),
                                 "rank " + std::to_string(peer) + " sent a " + std::to_string(n) +
                                     "-byte message where a call header was due: it is not "
                                     "running this collective" +
                                     input_note(),
                                 peer, "operation");
        }
        mpi_call_header& theirs = theirs_[at_peer];
        std::memcpy(&theirs, slot(i), mpi_header_bytes);
        first_bytes_[at_peer] = n;
        const std::size_t sent =
            mpi_header_bytes + (theirs.faulted != 0 ? sizeof(mpi_call_fault)
                                                    : static_cast<std::size_t>(theirs.following));
        const bool cut = sent > n && n == mpi_first_part(sent); // as this side cuts: a rest follows
        if (early_[at_peer]) {
            // Its rest is already being received: the header must announce exactly it.
            const int rest_tag =
                theirs.faulted != 0 ? tag_ : mpi_rest_tag(theirs.algorithm, theirs.sequence);
            if (!cut || sent - n != early_rest_bytes() || rest_tag != tag_) {
                throw mismatch_error(rank_, label_->str(),
                                     "rank " + std::to_string(peer) + " sent a " +
                                         std::to_string(early_rest_bytes()) +
                                         "-byte message that its call header did not announce: "
                                         "it is not running this collective" +
                                         input_note(),
                                     peer, "operation");
            }
            return;
        }
        if (cut) {
            std::byte* into = slot(i) + n;
            if (sent > slot_bytes_) {
                std::vector<std::byte>& drain = drains_[at_peer];
                if (drain.size() < sent - n) {
                    drain.resize(sent - n);
                }
                into = drain.data();
            }
            const int rest_tag =
                theirs.faulted != 0 ? tag_ : mpi_rest_tag(theirs.algorithm, theirs.sequence);
            for_each_segment(sent - n, [&](std::size_t at, std::size_t len) {
                rests_.push_back(MPI_REQUEST_NULL);
                rest_peers_.push_back(i);
                UNISON_CHECK_MPI(MPI_Irecv(into + at, static_cast<int>(len), MPI_BYTE, peer,
                                           rest_tag, comm_, &rests_.back()),
                                 rank_, label_->str());
            });
        }
    }

    /// Every peer's whole message is here: compare the calls, then reduce their
    /// data. Every member of a step's group sees the same headers and faults, so
    /// each keeps the same fault: the lowest pair of ranks of those the members
    /// carry in and of the members whose calls differ.
    void receive(const exchange_step& s) {
        fault_choice choice{faulted_, fault_};
        std::array<const mpi_call_header*, max_step_peers + 1> calls{};
        std::array<int, max_step_peers + 1> ranks{};
        int members = 0;
        if (!faulted_) {
            calls[0] = &mine_;
            ranks[0] = rank_;
            members = 1;
        }
        for (int i = 0; i < s.count; ++i) {
            const auto at_peer = static_cast<std::size_t>(i);
            const mpi_call_header& theirs = theirs_[at_peer];
            if (theirs.faulted == 0) {
                calls[static_cast<std::size_t>(members)] = &theirs;
                ranks[static_cast<std::size_t>(members++)] = s.peer(i);
            } else if (first_bytes_[at_peer] >= mpi_header_bytes + sizeof(mpi_call_fault)) {
                mpi_call_fault f;
                std::memcpy(&f, slot(i) + mpi_header_bytes, sizeof(mpi_call_fault));
                choice.keep(f);
            } else {
                throw mismatch_error(rank_, label_->str(),
                                     "rank " + std::to_string(s.peer(i)) +
                                         " sent a fault too short to read: it is not running "
                                         "this collective",
                                     s.peer(i), "operation");
            }
        }
        for (int a = 0; a < members; ++a) {
            for (int b = a + 1; b < members; ++b) {
                const auto x = static_cast<std::size_t>(a), y = static_cast<std::size_t>(b);
                if (!same_call(*calls[x], *calls[y])) {
                    choice.keep(fault_between(ranks[x], *calls[x], ranks[y], *calls[y]));
                }
            }
        }
        if (choice.found) {
            fault_ = choice.fault;
            set_faulted(); // already failing, or now: keep to the schedule so every rank hears
            return;
        }
        if (!fused_ || bytes() == 0) {
            return;
        }
        const collective_call& c = *call_;
        std::byte* partial = send_ + mpi_header_bytes;
        if (s.final) {
            const std::byte* arrived = slot(0) + mpi_header_bytes;
            if (current_ + 1 < steps_) {
                std::memcpy(partial, arrived, bytes()); // passed on down the tree
                partial_is_input_ = false;
            }
            std::memcpy(c.recv, arrived, bytes());
            result_written_ = true;
            return;
        }
        const bool last = current_ == last_reduce_;
        const bool passes_on = last && current_ + 1 < steps_;
        void* out = last && !passes_on ? c.recv : partial;
        // The group's partial results in the group's order (a pair's two in either:
        // they commute), so that every member computes the same bits.
        std::array<const void*, max_step_peers + 1> inputs{};
        const void* mine = partial_is_input_ ? c.send : static_cast<const void*>(partial);
        for (int k = 0, i = 0; k <= s.count; ++k) {
            inputs[static_cast<std::size_t>(k)] =
                k == s.place ? mine : slot(i++) + mpi_header_bytes;
        }
        void* outputs[1] = {out};
        host_reduce(c.type, c.reduction, inputs.data(), s.count + 1, outputs, 1, c.count,
                    last && c.reduction == reduce_op::avg ? size_ : 1);
        partial_is_input_ = partial_is_input_ && out != partial;
        if (last) {
            if (passes_on) {
                std::memcpy(c.recv, partial, bytes());
            }
            result_written_ = true;
        }
    }

    void set_faulted() {
        faulted_ = true;
        mine_.faulted = 1;
        mine_.following = 0;
        std::memcpy(send_, &mine_, mpi_header_bytes);
        std::memcpy(send_ + mpi_header_bytes, &fault_, sizeof(mpi_call_fault));
    }

    MPI_Comm comm_ = MPI_COMM_NULL;
    int rank_ = 0, size_ = 1, tag_ = 0;
    const collective_call* call_ = nullptr;
    bool fused_ = false;
    /// The partial result is still the caller's input (call_->send), which the rests
    /// are sent from: send_ holds only the first message's share of it.
    bool partial_is_input_ = false;
    /// A send of this step reads the caller's input.
    bool input_posted_ = false;
    std::byte* send_ = nullptr;
    std::byte* recv_ = nullptr; ///< one slot of slot_bytes_ per peer of a step
    std::size_t slot_bytes_ = 0;
    const call_label* label_ = nullptr;
    mpi_call_header mine_;
    std::array<mpi_call_header, max_step_peers> theirs_{};  ///< the current step's peers' headers
    std::array<std::size_t, max_step_peers> first_bytes_{}; ///< bytes of their first messages
    int arrived_ = 0;                                       ///< first messages received
    bool faulted_ = false;
    bool result_written_ = false;
    mpi_call_fault fault_;
    exchange_plan plan_;
    int steps_ = 0, current_ = 0, last_reduce_ = -1;
    /// Receives of each peer's first message, of the rests (and whose: the peer's
    /// index in the step), and sends of this rank's message.
    std::array<MPI_Request, max_step_peers> firsts_ = [] {
        std::array<MPI_Request, max_step_peers> none{};
        none.fill(MPI_REQUEST_NULL);
        return none;
    }();
    std::vector<MPI_Request> rests_, sends_;
    std::vector<int> rest_peers_;
    std::array<bool, max_step_peers> early_{}; ///< whose rest was received early
    /// Rests larger than a slot (from peers whose calls differ), drained unread.
    std::array<std::vector<std::byte>, max_step_peers> drains_;
};

} // namespace unison::detail
