#pragma once

/// \file
/// The MPI backend. Every call is issued non-blocking and completed by polling
/// against the communicator's deadline, so no wait can hang: a blocking call is
/// `submit` followed by `wait`. Large all-reduces run as a ring of non-blocking
/// sends and receives (Open MPI 4.1's MPI_Iallreduce is markedly slower than its
/// blocking MPI_Allreduce at a megabyte and up; the ring matches the latter).

#include "unison/comm/communicator.hpp"
#include "unison/comm/detail/matching.hpp"
#include "unison/comm/detail/validate.hpp"
#include "unison/core/detail/clock.hpp"
#include "unison/core/detail/host_reduce.hpp"
#include "unison/mpi/detail/mpi_check.hpp"

#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace unison {

namespace detail {

/// All-reduces of at least this many bytes use the ring (measured crossover on
/// Open MPI 4.1 over shared memory; see docs/performance.md).
inline constexpr std::size_t mpi_ring_min_bytes = 64 * 1024;
/// Tags at or above max_user_tag are reserved; the ring uses one per collective.
inline constexpr int mpi_ring_tag_base = max_user_tag + 1;
inline constexpr int mpi_ring_tags = 2048;
/// Ring messages are cut into segments of this size so that reducing one overlaps
/// receiving the next.
inline constexpr std::size_t mpi_ring_segment_bytes = 256 * 1024;

class mpi_operation;

/// Everything one MPI communicator owns; requests point at it.
class mpi_rank_state {
public:
    mpi_rank_state(MPI_Comm comm, comm_options o) : comm(comm), options(o) {
        MPI_Comm_rank(comm, &rank);
        MPI_Comm_size(comm, &size);
        MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    }
    mpi_rank_state(const mpi_rank_state&) = delete;
    mpi_rank_state& operator=(const mpi_rank_state&) = delete;
    ~mpi_rank_state();

    /// A scratch buffer of at least `bytes`, reused across calls.
    std::vector<std::byte> take_scratch(std::size_t bytes) {
        std::vector<std::byte> s;
        if (!scratch_.empty()) {
            s = std::move(scratch_.back());
            scratch_.pop_back();
        }
        if (s.size() < bytes) {
            s.resize(bytes);
        }
        return s;
    }
    void give_scratch(std::vector<std::byte>&& s) {
        if (!s.empty()) {
            scratch_.push_back(std::move(s));
        }
    }

    /// Polls `op` to completion or throws timeout_error at the deadline (after which
    /// the communicator is unusable: MPI cannot cancel a collective).
    void wait(std::unique_ptr<mpi_operation> op);

    void check_usable(operation op) const {
        if (!poisoned.empty()) {
            throw error(rank, to_string(op),
                        "this communicator is unusable since " + poisoned +
                            "; MPI cannot cancel a collective, so end the job (MPI_Abort) "
                            "or build a new communicator");
        }
    }

    MPI_Comm comm;
    int rank = 0;
    int size = 1;
    comm_options options;
    mpi_half_ops half_ops;
    std::uint64_t sequence = 0;
    std::uint64_t p2p_sequence = 0;
    std::string poisoned;
    std::vector<std::unique_ptr<mpi_operation>> abandoned;

private:
    std::vector<std::vector<std::byte>> scratch_;
};

/// One issued call: posted MPI requests, plus the ring schedule for large all-reduces.
class mpi_operation {
public:
    mpi_operation(mpi_rank_state& s, const collective_call& c, std::string label, std::uint64_t seq)
        : state_(s), call_(c), label_(std::move(label)), sequence_(seq) {}
    mpi_operation(const mpi_operation&) = delete;
    mpi_operation& operator=(const mpi_operation&) = delete;
    ~mpi_operation() { state_.give_scratch(std::move(scratch_)); }

    const std::string& label() const noexcept { return label_; }
    std::uint64_t sequence() const noexcept { return sequence_; }

    /// Posts the call.
    void start() {
        const collective_call& c = call_;
        const MPI_Datatype t = mpi_datatype(c.type);
        const int n = state_.size;
        const std::size_t es = size_of(c.type);
        check_int(c.op == operation::all_gather || c.op == operation::all_to_all
                      ? c.count * static_cast<std::size_t>(n)
                      : c.count);
        MPI_Comm comm = state_.comm;
        switch (c.op) {
        case operation::all_reduce:
            if (c.count * es >= mpi_ring_min_bytes && n > 1) {
                start_ring();
            } else {
                post(MPI_Iallreduce(c.send == c.recv ? MPI_IN_PLACE : c.send, c.recv,
                                    int_count(c.count), t, reduction(), comm, next_request()),
                     "MPI_Iallreduce");
                divide_ = c.reduction == reduce_op::avg;
            }
            return;
        case operation::reduce_scatter: {
            const void* in = c.send;
            void* out = c.recv;
            if (static_cast<const std::byte*>(c.recv) ==
                static_cast<const std::byte*>(c.send) +
                    static_cast<std::size_t>(state_.rank) * c.count * es) {
                // In place (our block of the input is the output): MPI's in-place
                // convention differs, so reduce into scratch and copy at completion.
                scratch_ = state_.take_scratch(c.count * es);
                out = scratch_.data();
                copy_back_ = true;
            }
            post(MPI_Ireduce_scatter_block(in, out, int_count(c.count), t, reduction(), comm,
                                           next_request()),
                 "MPI_Ireduce_scatter_block");
            divide_ = c.reduction == reduce_op::avg;
            return;
        }
        case operation::all_gather: {
            const bool in_place = static_cast<const std::byte*>(c.send) ==
                                  static_cast<const std::byte*>(c.recv) +
                                      static_cast<std::size_t>(state_.rank) * c.count * es;
            post(MPI_Iallgather(in_place ? MPI_IN_PLACE : c.send, int_count(c.count), t, c.recv,
                                int_count(c.count), t, comm, next_request()),
                 "MPI_Iallgather");
            return;
        }
        case operation::all_gatherv: {
            counts_.resize(static_cast<std::size_t>(n));
            displs_.resize(static_cast<std::size_t>(n));
            std::size_t offset = 0;
            for (int q = 0; q < n; ++q) {
                counts_[static_cast<std::size_t>(q)] =
                    int_count(c.counts[static_cast<std::size_t>(q)]);
                displs_[static_cast<std::size_t>(q)] = int_count(offset);
                offset += c.counts[static_cast<std::size_t>(q)];
            }
            post(MPI_Iallgatherv(c.send, int_count(c.count), t, c.recv, counts_.data(),
                                 displs_.data(), t, comm, next_request()),
                 "MPI_Iallgatherv");
            return;
        }
        case operation::broadcast:
            if (state_.rank == c.root && c.send != c.recv && c.count != 0) {
                std::memcpy(c.recv, c.send, c.count * es);
            }
            post(MPI_Ibcast(c.recv, int_count(c.count), t, c.root, comm, next_request()),
                 "MPI_Ibcast");
            return;
        case operation::reduce: {
            const bool root = state_.rank == c.root;
            const void* in = root && c.send == c.recv ? MPI_IN_PLACE : c.send;
            post(MPI_Ireduce(in, c.recv, int_count(c.count), t, reduction(), c.root, comm,
                             next_request()),
                 "MPI_Ireduce");
            divide_ = root && c.reduction == reduce_op::avg;
            return;
        }
        case operation::all_to_all:
            post(MPI_Ialltoall(c.send, int_count(c.count), t, c.recv, int_count(c.count), t, comm,
                               next_request()),
                 "MPI_Ialltoall");
            return;
        case operation::send:
            post(MPI_Isend(c.send, int_count(c.count), t, c.root, c.tag, comm, next_request()),
                 "MPI_Isend");
            return;
        case operation::recv:
            post(MPI_Irecv(c.recv, int_count(c.count), t, c.root, c.tag, comm, next_request()),
                 "MPI_Irecv");
            return;
        case operation::barrier:
            post(MPI_Ibarrier(comm, next_request()), "MPI_Ibarrier");
            return;
        }
    }

    /// Drives the call forward; true once it is complete (results final).
    bool progress() {
        if (done_) {
            return true;
        }
        if (ring_step_ >= 0) {
            if (!ring_progress()) {
                return false;
            }
        } else {
            int flag = 0;
            MPI_Status statuses[2];
            UNISON_CHECK_MPI(MPI_Testall(active_, requests_, &flag, statuses), state_.rank, label_);
            if (flag == 0) {
                return false;
            }
            active_ = 0;
            if (call_.op == operation::recv) {
                check_received(statuses[0]);
            }
        }
        finish();
        return true;
    }

private:
    void check_int(std::size_t count) const {
        if (count > static_cast<std::size_t>(INT_MAX)) {
            throw argument_error(state_.rank, label_,
                                 std::to_string(count) +
                                     " elements exceed MPI's int count limit; split the call");
        }
    }
    static int int_count(std::size_t n) noexcept { return static_cast<int>(n); }

    MPI_Op reduction() const noexcept {
        return mpi_native_reduction(call_.type) ? mpi_native_op(call_.reduction)
                                                : state_.half_ops.get(call_.type, call_.reduction);
    }

    MPI_Request* next_request() noexcept { return &requests_[active_]; }
    void post(int rc, const char* what) {
        if (rc != MPI_SUCCESS) {
            throw_mpi_error(rc, state_.rank, label_, what);
        }
        ++active_;
    }

    void check_received(const MPI_Status& status) const {
        int got = 0;
        MPI_Get_count(&status, mpi_datatype(call_.type), &got);
        if (static_cast<std::size_t>(got) != call_.count) {
            throw mismatch_error(state_.rank, label_,
                                 "expected " + describe(call_.count, call_.type) + " from rank " +
                                     std::to_string(call_.root) + " but " + std::to_string(got) +
                                     " arrived",
                                 call_.root, "count");
        }
    }

    void finish() {
        done_ = true;
        const std::size_t es = size_of(call_.type);
        if (copy_back_ && call_.count != 0) {
            std::memcpy(call_.recv, scratch_.data(), call_.count * es);
        }
        if (divide_) {
            void* out = call_.recv;
            host_reduce(call_.type, reduce_op::sum, const_cast<const void* const*>(&out), 1, &out,
                        1, call_.count, state_.size);
        }
    }

    // ---------------------------------------------------------------- ring
    // Reduce-scatter then all-gather around the ring rank -> rank+1. After step s of
    // the reduce-scatter, chunk (rank - s - 2) holds the partial sum of s + 2 ranks;
    // after the last step, this rank owns the complete chunk `rank`.

    int ring_steps() const noexcept { return 2 * (state_.size - 1); }

    std::size_t chunk_lo(int i) const noexcept {
        const std::size_t n = static_cast<std::size_t>(state_.size);
        const std::size_t base = call_.count / n, rem = call_.count % n;
        const auto u = static_cast<std::size_t>(i);
        return u * base + std::min(u, rem);
    }
    std::size_t chunk_len(int i) const noexcept { return chunk_lo(i + 1) - chunk_lo(i); }
    int chunk(int offset) const noexcept {
        const int n = state_.size;
        return ((state_.rank + offset) % n + n) % n;
    }
    std::byte* out_at(int i) const noexcept {
        return static_cast<std::byte*>(call_.recv) + chunk_lo(i) * size_of(call_.type);
    }
    const std::byte* in_at(int i) const noexcept {
        return static_cast<const std::byte*>(call_.send) + chunk_lo(i) * size_of(call_.type);
    }

    void start_ring() {
        const std::size_t es = size_of(call_.type);
        scratch_ = state_.take_scratch(chunk_len(0) * es);
        tag_ = mpi_ring_tag_base + static_cast<int>(sequence_ % mpi_ring_tags);
        ring_step_ = 0;
        post_ring_step();
    }

    /// Posts step `ring_step_`: the chunk to send and the chunk to receive, each cut
    /// into segments, so that a reduce-scatter step reduces the segments that have
    /// arrived while the later ones are still in flight.
    void post_ring_step() {
        const int n = state_.size;
        const int next = (state_.rank + 1) % n, prev = (state_.rank + n - 1) % n;
        const MPI_Datatype t = mpi_datatype(call_.type);
        const std::size_t es = size_of(call_.type);
        const int s = ring_step_;
        const std::byte* send_from = nullptr;
        std::byte* recv_into = nullptr;
        if (s < n - 1) { // reduce-scatter
            send_chunk_ = chunk(-s - 1);
            recv_chunk_ = chunk(-s - 2);
            send_from = s == 0 ? in_at(send_chunk_) : out_at(send_chunk_);
            recv_into = scratch_.data();
        } else { // all-gather
            const int g = s - (n - 1);
            send_chunk_ = chunk(-g);
            recv_chunk_ = chunk(-g - 1);
            send_from = out_at(send_chunk_);
            recv_into = out_at(recv_chunk_);
        }
        const std::size_t segment = std::max<std::size_t>(1, mpi_ring_segment_bytes / es);
        const std::size_t recv_len = chunk_len(recv_chunk_), send_len = chunk_len(send_chunk_);
        recv_segments_ = static_cast<int>((recv_len + segment - 1) / segment);
        const int send_segments = static_cast<int>((send_len + segment - 1) / segment);
        ring_requests_.assign(static_cast<std::size_t>(recv_segments_ + send_segments),
                              MPI_REQUEST_NULL);
        reduced_ = 0;
        for (int k = 0; k < recv_segments_; ++k) {
            const std::size_t lo = static_cast<std::size_t>(k) * segment;
            check(MPI_Irecv(recv_into + lo * es, int_count(std::min(segment, recv_len - lo)), t,
                            prev, tag_, state_.comm, &ring_requests_[static_cast<std::size_t>(k)]),
                  "MPI_Irecv (ring)");
        }
        for (int k = 0; k < send_segments; ++k) {
            const std::size_t lo = static_cast<std::size_t>(k) * segment;
            check(MPI_Isend(send_from + lo * es, int_count(std::min(segment, send_len - lo)), t,
                            next, tag_, state_.comm,
                            &ring_requests_[static_cast<std::size_t>(recv_segments_ + k)]),
                  "MPI_Isend (ring)");
        }
    }

    /// Drives the ring: reduces arrived segments in order, moves to the next step once
    /// this one's sends and receives are done; true when the last step is.
    bool ring_progress() {
        const int n = state_.size;
        const std::size_t es = size_of(call_.type);
        const std::size_t segment = std::max<std::size_t>(1, mpi_ring_segment_bytes / es);
        for (;;) {
            const bool scatter = ring_step_ < n - 1;
            while (reduced_ < recv_segments_) {
                int flag = 0;
                UNISON_CHECK_MPI(MPI_Test(&ring_requests_[static_cast<std::size_t>(reduced_)],
                                          &flag, MPI_STATUS_IGNORE),
                                 state_.rank, label_);
                if (flag == 0) {
                    return false;
                }
                if (scatter) { // fold the arrived partial sum into my input's chunk
                    const std::size_t lo = static_cast<std::size_t>(reduced_) * segment;
                    const std::size_t len = std::min(segment, chunk_len(recv_chunk_) - lo);
                    const void* inputs[2] = {in_at(recv_chunk_) + lo * es,
                                             scratch_.data() + lo * es};
                    void* outputs[1] = {out_at(recv_chunk_) + lo * es};
                    const bool last = ring_step_ == n - 2;
                    host_reduce(call_.type, call_.reduction, inputs, 2, outputs, 1, len,
                                last && call_.reduction == reduce_op::avg ? n : 1);
                }
                ++reduced_;
            }
            int flag = 0;
            UNISON_CHECK_MPI(MPI_Testall(static_cast<int>(ring_requests_.size()) - recv_segments_,
                                         ring_requests_.data() + recv_segments_, &flag,
                                         MPI_STATUSES_IGNORE),
                             state_.rank, label_);
            if (flag == 0) {
                return false;
            }
            if (++ring_step_ == ring_steps()) {
                return true;
            }
            post_ring_step();
        }
    }

    void check(int rc, const char* what) const {
        if (rc != MPI_SUCCESS) {
            throw_mpi_error(rc, state_.rank, label_, what);
        }
    }

    mpi_rank_state& state_;
    collective_call call_;
    std::string label_;
    std::uint64_t sequence_;
    MPI_Request requests_[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    int active_ = 0;
    bool done_ = false;
    bool divide_ = false;
    bool copy_back_ = false;
    int ring_step_ = -1;
    int tag_ = 0;
    int send_chunk_ = 0, recv_chunk_ = 0;
    int recv_segments_ = 0; ///< receive requests of this step (first in ring_requests_)
    int reduced_ = 0;       ///< receive segments of this step already folded in
    std::vector<MPI_Request> ring_requests_;
    std::vector<std::byte> scratch_;
    std::vector<int> counts_, displs_;
};

inline void mpi_rank_state::wait(std::unique_ptr<mpi_operation> op) {
    const auto start = clock::now();
    const auto deadline = start + options.timeout;
    for (std::size_t polls = 1;; ++polls) {
        if (op->progress()) {
            return;
        }
        if ((polls & 63) == 0) {
            const auto now = clock::now();
            if (now >= deadline) {
                const std::string label = op->label();
                const std::uint64_t seq = op->sequence();
                poisoned = label + " timed out";
                abandoned.push_back(std::move(op)); // MPI may still write its buffers
                throw timeout_error(rank, label,
                                    "not complete after " +
                                        std::to_string(options.timeout.count()) +
                                        " ms: a peer is slow, dead, or skipped this call",
                                    seq);
            }
            if (now - start > std::chrono::milliseconds(1)) {
                std::this_thread::yield(); // let an oversubscribed peer run
            }
        }
    }
}

inline mpi_rank_state::~mpi_rank_state() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) {
        return;
    }
    // Give abandoned calls one more timeout to finish (a slow peer may still join);
    // a call still pending then is leaked along with the communicator.
    const auto deadline = clock::now() + options.timeout;
    bool all_done = true;
    for (auto& op : abandoned) {
        try {
            while (!op->progress() && clock::now() < deadline) {
                std::this_thread::yield();
            }
            all_done = all_done && op->progress();
        } catch (...) {
            all_done = false;
        }
    }
    if (all_done) {
        abandoned.clear();
        MPI_Comm_free(&comm);
    } else {
        for (auto& op : abandoned) {
            (void)op.release();
        }
    }
}

} // namespace detail

/// A pending operation of the MPI backend (see the `request` concept). Progress
/// happens inside test() and wait(), as with MPI itself.
class [[nodiscard]] mpi_request {
public:
    mpi_request() = default;
    mpi_request(mpi_request&&) noexcept = default;
    mpi_request& operator=(mpi_request&& other) noexcept {
        if (this != &other) {
            finish_quietly();
            state_ = other.state_;
            op_ = std::move(other.op_);
        }
        return *this;
    }
    /// Waits for an operation still in flight (errors are dropped; call wait() to see them).
    ~mpi_request() { finish_quietly(); }

    /// Blocks until complete (bounded by the communicator's timeout); rethrows errors.
    void wait() {
        if (op_) {
            state_->wait(std::move(op_));
        }
    }
    /// Drives progress; true once complete.
    bool test() { return !op_ || op_->progress(); }

private:
    friend class mpi_communicator;
    mpi_request(detail::mpi_rank_state* s, std::unique_ptr<detail::mpi_operation> op) noexcept
        : state_(s), op_(std::move(op)) {}
    void finish_quietly() noexcept {
        try {
            wait();
        } catch (...) {
        }
    }

    detail::mpi_rank_state* state_ = nullptr;
    std::unique_ptr<detail::mpi_operation> op_;
};

/// A communicator over an MPI communicator (which it duplicates, so its traffic
/// never matches the application's). Models `communicator`.
class mpi_communicator {
public:
    using request_type = mpi_request;

    /// Duplicates `comm`; MPI must be initialized (see mpi_environment).
    explicit mpi_communicator(MPI_Comm comm, comm_options options = comm_options::from_env()) {
        MPI_Comm dup = MPI_COMM_NULL;
        UNISON_CHECK_MPI(MPI_Comm_dup(comm, &dup), -1, "mpi_communicator");
        state_ = std::make_unique<detail::mpi_rank_state>(dup, options);
    }

    int rank() const noexcept { return state_->rank; }
    int size() const noexcept { return state_->size; }
    const comm_options& options() const noexcept { return state_->options; }
    /// The duplicated MPI communicator this one runs on.
    MPI_Comm native_handle() const noexcept { return state_->comm; }

    /// Runs `call` to completion.
    void execute(const collective_call& call) { state_->wait(start(call)); }

    /// Starts `call`; progress happens in the request's test() and wait().
    mpi_request submit(const collective_call& call) { return {state_.get(), start(call)}; }

    /// Collective: MPI_Comm_split by `color` (>= 0) and `key`.
    mpi_communicator split(int color, int key) {
        if (color < 0) {
            throw argument_error(rank(), "split",
                                 "color " + std::to_string(color) +
                                     " is negative; every rank needs a group");
        }
        MPI_Comm sub = MPI_COMM_NULL;
        UNISON_CHECK_MPI(MPI_Comm_split(state_->comm, color, key, &sub), rank(), "split");
        return mpi_communicator(std::make_unique<detail::mpi_rank_state>(sub, state_->options));
    }

private:
    explicit mpi_communicator(std::unique_ptr<detail::mpi_rank_state> s) : state_(std::move(s)) {}

    std::unique_ptr<detail::mpi_operation> start(const collective_call& call) {
        detail::mpi_rank_state& s = *state_;
        s.check_usable(call.op);
        if (!call.location.is_host()) {
            throw argument_error(s.rank, to_string(call.op),
                                 "the MPI backend moves host memory, and the data is on " +
                                     to_string(call.location));
        }
        const bool p2p = call.op == operation::send || call.op == operation::recv;
        const std::uint64_t seq = p2p ? s.p2p_sequence++ : s.sequence++;
        std::string label = detail::operation_label(call.op, seq);
        if (p2p) {
            label +=
                " (peer " + std::to_string(call.root) + ", tag " + std::to_string(call.tag) + ")";
        } else if (s.options.check_matching) {
            check_matching(call, label, seq);
        }
        auto op = std::make_unique<detail::mpi_operation>(s, call, std::move(label), seq);
        op->start();
        return op;
    }

    /// All-gathers every rank's call signature and compares them with rank 0's.
    void check_matching(const collective_call& call, const std::string& label, std::uint64_t seq) {
        detail::mpi_rank_state& s = *state_;
        const detail::call_signature mine = detail::signature_of(call);
        std::vector<detail::call_signature> all(static_cast<std::size_t>(s.size));
        constexpr int words = sizeof(detail::call_signature) / sizeof(std::uint64_t);
        collective_call exchange{operation::all_gather, &mine, all.data(), words, {}, dtype::i64};
        auto op =
            std::make_unique<detail::mpi_operation>(s, exchange, label + " (matching check)", seq);
        op->start();
        s.wait(std::move(op));
        for (int q = 1; q < s.size; ++q) {
            detail::check_signature(s.rank, label, 0, all[0], q, all[static_cast<std::size_t>(q)]);
        }
    }

    std::unique_ptr<detail::mpi_rank_state> state_;
};

static_assert(request<mpi_request>);
static_assert(communicator<mpi_communicator>);

/// Initializes MPI (MPI_THREAD_FUNNELED) unless it already is, and finalizes it on
/// destruction if this object initialized it.
class mpi_environment {
public:
    mpi_environment(int& argc, char**& argv) {
        int initialized = 0;
        MPI_Initialized(&initialized);
        if (!initialized) {
            int provided = 0;
            UNISON_CHECK_MPI(MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided), -1,
                             "mpi_environment");
            owner_ = true;
        }
    }
    mpi_environment(const mpi_environment&) = delete;
    mpi_environment& operator=(const mpi_environment&) = delete;
    ~mpi_environment() {
        int finalized = 0;
        MPI_Finalized(&finalized);
        if (owner_ && !finalized) {
            MPI_Finalize();
        }
    }

private:
    bool owner_ = false;
};

} // namespace unison
