#pragma once

/// \file
/// The MPI backend. Every call is issued non-blocking and completed by polling
/// against the communicator's deadline, so no wait can hang: a blocking call is
/// `submit` followed by `wait`. Every collective starts with a handshake that
/// checks all ranks' call signatures before MPI may write any user buffer (an
/// out-of-place recursive doubling or two_level call's input may already be sent
/// from). An
/// all-reduce runs one of unison's own algorithms over non-blocking sends and
/// receives, chosen by size and rank count in mpi/tuning.hpp (or forced by
/// comm_options::all_reduce_algorithm): recursive doubling inside the handshake for
/// small buffers, Rabenseifner's with the check riding its first steps, a ring
/// (Open MPI 4.1's MPI_Iallreduce is markedly slower than its blocking MPI_Allreduce
/// at a megabyte and up; the ring matches the latter), or on 3 to 8 nodes of a rank
/// each the direct exchange (mpi/detail/rank_ordered.hpp); `native` runs MPI_Iallreduce,
/// and `neighbour_exchange` (forced only) the ring with a shorter all-gather half.
/// With comm_options::deterministic, all_reduce, reduce and reduce_scatter run the
/// rank-ordered schedule at every size instead; a reduce_scatter on one node runs it
/// anyway (faster than Open MPI's own there).

#include "unison/comm/collective.hpp"
#include "unison/comm/communicator.hpp"
#include "unison/comm/detail/matching.hpp"
#include "unison/comm/options.hpp"
#include "unison/core/dtype.hpp"
#include "unison/core/error.hpp"
#include "unison/core/tensor.hpp"
#include "unison/mpi/detail/mpi_check.hpp"
#include "unison/mpi/detail/operation.hpp"
#include "unison/mpi/environment.hpp"
#include "unison/mpi/tuning.hpp"

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace unison {

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
    /// Reduces several host tensors in place as one buffer (all_reduce_coalesced):
    /// the ring sends and receives straight from and into them (tensors under
    /// mpi_piece_min_bytes, and whole calls under 64 KiB, go through one staging copy).
    static constexpr bool reduces_coalesced = true;

    /// Duplicates `comm`; MPI must be initialized (see mpi_environment).
    explicit mpi_communicator(MPI_Comm comm, comm_options options = comm_options::from_env()) {
        (void)mpi_forced_algorithm(options); // refuses contradictory options before any MPI call
        MPI_Comm dup = MPI_COMM_NULL;
        UNISON_CHECK_MPI(MPI_Comm_dup(comm, &dup), -1, "mpi_communicator");
        state_ = std::make_unique<detail::mpi_rank_state>(dup, options);
        log_made("made");
    }

    int rank() const noexcept { return state_->rank; }
    int size() const noexcept { return state_->size; }
    const comm_options& options() const noexcept { return state_->options; }
    /// The duplicated MPI communicator this one runs on.
    MPI_Comm native_handle() const noexcept { return state_->comm; }
    /// Whether every rank is on one node (shares memory with every other), which
    /// the tuning (mpi/tuning.hpp) tells apart from several nodes.
    bool one_node() const noexcept { return state_->one_node; }
    /// The most ranks any one node holds (size() on one node, 1 with a rank per node),
    /// from MPI_Comm_split_type or comm_options::ranks_per_node.
    int node_ranks() const noexcept { return state_->nodes.node_ranks; }
    /// The cores on which this rank's machine runs the ranks of this communicator it
    /// holds: the union of their CPU affinities (a launcher that binds each rank to a
    /// core leaves each one core, and the machine as many as it has ranks), or the
    /// machine's hardware threads where a rank cannot read its own. Hardware threads,
    /// on a machine rather than a node: a machine is a running kernel (Linux's
    /// boot_id, else the host's name, else MPI's shared-memory group), so containers
    /// on one host share one, whatever MPI or comm_options::ranks_per_node call a node.
    int node_cores() const noexcept { return state_->node_cores; }
    /// More of this communicator's ranks on this rank's machine than node_cores(), or
    /// of any MPI communicator this process made before it (the ranks a split leaves
    /// out still run): a waiting rank then yields its core at every poll, so that the
    /// rank it waits for can run.
    bool oversubscribed() const noexcept { return state_->oversubscribed; }
    /// The algorithm an all-reduce of `bytes` runs on this communicator: the forced
    /// one (options().all_reduce_algorithm; rank_ordered when options().deterministic),
    /// else the first of options().tuning's rules that matches, else the tuning's
    /// choice.
    algorithm all_reduce_algorithm(std::size_t bytes) const noexcept {
        return mpi_all_reduce_algorithm(state_->decided(operation::all_reduce, bytes), bytes,
                                        state_->size, state_->nodes.node_ranks);
    }

    /// The algorithm a reduce_scatter of `bytes` in all (count times the ranks) runs
    /// on this communicator: rabenseifner (recursive halving), rank_ordered (the
    /// direct exchange) or native (MPI's own), forced like the all-reduce's, picked by a rule
    /// (options().tuning) or the tuning's choice.
    algorithm reduce_scatter_algorithm(std::size_t bytes) const noexcept {
        return mpi_reduce_scatter_algorithm(state_->decided(operation::reduce_scatter, bytes),
                                            bytes, state_->size, state_->nodes.node_ranks);
    }

    /// The algorithm an all_gather of `bytes` in all (count times the ranks) runs on
    /// this communicator: recursive_doubling, two_level (node-aware), ring,
    /// neighbour_exchange (forced only) or native (MPI's own), forced like the
    /// all-reduce's, picked by a rule (options().tuning) or the tuning's choice.
    algorithm all_gather_algorithm(std::size_t bytes) const noexcept {
        return mpi_all_gather_algorithm(state_->decided(operation::all_gather, bytes), bytes,
                                        state_->size, state_->nodes.node_ranks);
    }

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
        mpi_communicator made(
            std::make_unique<detail::mpi_rank_state>(sub, state_->options, state_->node));
        made.log_made("split from rank " + std::to_string(rank()) + " by color " +
                      std::to_string(color));
        return made;
    }

private:
    explicit mpi_communicator(std::unique_ptr<detail::mpi_rank_state> s) : state_(std::move(s)) {}

    /// UNISON_LOG=info: what this communicator is and how it will choose.
    void log_made(const std::string& how) const {
        log(log_level::info, rank(), [&] {
            const comm_options& o = options();
            return "mpi_communicator " + how + ": rank " + std::to_string(rank()) + " of " +
                   std::to_string(size()) + ", " + std::to_string(node_ranks()) +
                   " ranks per node" + (one_node() ? " (one node)" : "") + ", " +
                   std::to_string(node_cores()) + " cores for this machine's ranks" +
                   (oversubscribed() ? state_->yield_each_poll
                                           ? " (oversubscribed: waits yield the core)"
                                           : " (oversubscribed: the MPI yields the core)"
                                     : "") +
                   ", all-reduce algorithm " + std::string(to_string(mpi_forced_algorithm(o))) +
                   ", timeout " + std::to_string(o.timeout.count()) + " ms" +
                   (o.check_matching ? ", full call matching" : "") +
                   (o.deterministic ? ", deterministic" : "") +
                   (o.tuning.empty() ? ""
                                     : ", " + std::to_string(o.tuning.rules().size()) +
                                           " tuning rules from " + o.tuning.source());
        });
    }

    /// The algorithm an all_reduce, reduce_scatter or all_gather `call` runs.
    algorithm algorithm_for(const collective_call& call) const noexcept {
        const std::size_t block = call.count * size_of(call.type);
        const std::size_t all = block * static_cast<std::size_t>(size());
        return call.op == operation::all_reduce       ? all_reduce_algorithm(block)
               : call.op == operation::reduce_scatter ? reduce_scatter_algorithm(all)
                                                      : all_gather_algorithm(all);
    }

    /// UNISON_LOG=debug: the algorithm the call `label` runs (where there is a choice).
    void log_algorithm(const collective_call& call, std::uint64_t seq) const {
        log(log_level::debug, rank(), [&] {
            return detail::operation_label(call.op, seq) + " runs " +
                   std::string(to_string(algorithm_for(call)));
        });
    }

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
        if (!p2p && s.options.check_matching) {
            check_matching(call, seq);
        }
        if (call.op == operation::all_reduce || call.op == operation::reduce_scatter ||
            call.op == operation::all_gather) {
            log_algorithm(call, seq);
        }
        auto op = s.acquire(call, seq);
        if (timeline::enabled()) {
            const bool chosen = call.op == operation::all_reduce ||
                                call.op == operation::reduce_scatter ||
                                call.op == operation::all_gather;
            op->span().begin(s.rank, call, s.size, static_cast<std::int64_t>(seq),
                             chosen ? to_string(algorithm_for(call)) : std::string_view());
        }
        s.start(op);
        return op;
    }

    /// UNISON_DEBUG's stricter check: all-gathers every rank's call signature and
    /// compares each with rank 0's (the handshake compares neighbours in its schedule).
    void check_matching(const collective_call& call, std::uint64_t seq) {
        detail::mpi_rank_state& s = *state_;
        const detail::call_signature mine = detail::signature_of(call);
        std::vector<detail::call_signature> all(static_cast<std::size_t>(s.size));
        constexpr int words = sizeof(detail::call_signature) / sizeof(std::uint64_t);
        collective_call exchange{operation::all_gather, &mine, all.data(), words, {}, dtype::i64};
        auto op = s.acquire(exchange, seq);
        s.start(op);
        s.wait(std::move(op));
        const std::string label = detail::operation_label(call.op, seq);
        for (int q = 1; q < s.size; ++q) {
            detail::check_signature(s.rank, label, 0, all[0], q, all[static_cast<std::size_t>(q)]);
        }
    }

    std::unique_ptr<detail::mpi_rank_state> state_;
};

static_assert(request<mpi_request>);
static_assert(communicator<mpi_communicator>);

} // namespace unison
