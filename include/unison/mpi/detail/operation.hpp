#pragma once

/// \file
/// One call of the MPI backend in flight: `mpi_operation` posts it as non-blocking
/// MPI calls (or as a ring, ring_allreduce.hpp) and drives it to completion by
/// polling; `mpi_rank_state`, which every request of a communicator points at,
/// bounds each wait by the communicator's timeout and keeps the calls that timed out.

#include "unison/comm/collective.hpp"
#include "unison/comm/detail/validate.hpp"
#include "unison/comm/options.hpp"
#include "unison/core/detail/clock.hpp"
#include "unison/core/detail/host_reduce.hpp"
#include "unison/core/dtype.hpp"
#include "unison/core/error.hpp"
#include "unison/core/reduce_op.hpp"
#include "unison/mpi/detail/mpi_check.hpp"
#include "unison/mpi/detail/ring_allreduce.hpp"

#include <mpi.h>

#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace unison::detail {

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
                ring_.emplace(comm, state_.rank, n, call_, label_, sequence_);
                scratch_ = state_.take_scratch(ring_->scratch_bytes());
                ring_->start(scratch_.data());
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
        if (ring_) {
            if (!ring_->progress()) {
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

    mpi_rank_state& state_;
    collective_call call_;
    std::string label_;
    std::uint64_t sequence_;
    MPI_Request requests_[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    int active_ = 0;
    bool done_ = false;
    bool divide_ = false;
    bool copy_back_ = false;
    std::optional<mpi_ring_allreduce> ring_; ///< large all-reduces only
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

} // namespace unison::detail
