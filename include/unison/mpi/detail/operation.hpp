#pragma once

/// \file
/// One call of the MPI backend in flight: `mpi_operation` first runs the call's
/// handshake (handshake.hpp: every rank's signature checked, all-reduces by recursive
/// doubling done along the way), then posts the rest as non-blocking MPI calls (or
/// as a ring, ring_allreduce.hpp) and drives it to completion by polling. An
/// all-reduce, reduce_scatter or all_gather runs the algorithm that mpi/tuning.hpp
/// picks; Rabenseifner's schedules (rabenseifner.hpp: the all-reduce, its halving as
/// a reduce_scatter, recursive doubling as an all_gather) carry the check in their
/// own messages. `mpi_rank_state`,
/// which every request of a communicator points at, bounds each wait by the
/// communicator's timeout, keeps the calls that timed out, and recycles operations
/// so that a handshake allocates nothing once the communicator has warmed up (the
/// ring, Rabenseifner's algorithm and the rank-ordered schedule build small request
/// and step lists per call).

#include "unison/comm/collective.hpp"
#include "unison/comm/detail/trace.hpp"
#include "unison/comm/detail/validate.hpp"
#include "unison/comm/options.hpp"
#include "unison/core/detail/clock.hpp"
#include "unison/core/detail/hash.hpp"
#include "unison/core/detail/host_reduce.hpp"
#include "unison/core/dtype.hpp"
#include "unison/core/error.hpp"
#include "unison/core/reduce_op.hpp"
#include "unison/mpi/detail/abandoned.hpp"
#include "unison/mpi/detail/handshake.hpp"
#include "unison/mpi/detail/mpi_check.hpp"
#include "unison/mpi/detail/node_all_gather.hpp"
#include "unison/mpi/detail/peer_channel.hpp"
#include "unison/mpi/detail/rabenseifner.hpp"
#include "unison/mpi/detail/rank_ordered.hpp"
#include "unison/mpi/detail/ring_allreduce.hpp"
#include "unison/mpi/tuning.hpp"

#include <mpi.h>

#ifdef __linux__
#include <sched.h>
#endif
#if defined(__unix__) || defined(__APPLE__)
#include <unistd.h>
#endif

#include <array>
#include <atomic>
#include <bit>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <exception>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

namespace unison::detail {

class mpi_operation;

/// A set of CPUs, one bit each, CPUs 0 to 1023 (cpu_set_t's reach).
using cpu_words = std::array<std::uint64_t, 16>;

/// The CPUs this process may run on (its affinity, which launchers' binding,
/// containers and taskset narrow), or none when it cannot be read.
inline cpu_words cpu_affinity() noexcept {
    cpu_words words{};
#ifdef __linux__
    cpu_set_t set;
    CPU_ZERO(&set);
    if (::sched_getaffinity(0, sizeof set, &set) == 0) {
        for (int cpu = 0; cpu < static_cast<int>(words.size()) * 64 && cpu < CPU_SETSIZE; ++cpu) {
            if (CPU_ISSET(cpu, &set)) {
                words[static_cast<std::size_t>(cpu / 64)] |= std::uint64_t{1} << (cpu % 64);
            }
        }
    }
#endif
    return words;
}

/// A name for the kernel this process runs on, the same for every process it runs
/// (containers on one host included) and different on another machine or virtual
/// machine, so that CPU numbers mean the same CPUs among processes that share it: a
/// hash of Linux's boot_id, else of the host's name; 0 when neither can be read
/// (find_nodes then takes MPI's shared-memory group).
inline std::uint64_t machine_key() noexcept {
#ifdef __linux__
    if (std::FILE* f = std::fopen("/proc/sys/kernel/random/boot_id", "r")) {
        char id[64] = {};
        const std::size_t got = std::fread(id, 1, sizeof id - 1, f);
        std::fclose(f);
        if (got > 0) {
            return fnv1a64(id, got);
        }
    }
#endif
#if defined(__unix__) || defined(__APPLE__)
    char host[256] = {};
    if (::gethostname(host, sizeof host - 1) == 0 && host[0] != '\0') {
        return fnv1a64(host, std::strlen(host));
    }
#endif
    return 0;
}

/// Whether the MPI yields the core by itself when a poll finds nothing to do: Open
/// MPI does where it knows the node is oversubscribed (its mpi_yield_when_idle,
/// read through MPI_T); MPICH's progress loop never does, and neither does an MPI
/// this cannot ask. Read once per process, with MPI initialized.
inline bool mpi_yields_when_idle() noexcept {
    static const bool yields = [] {
#if defined(OPEN_MPI)
        int provided = 0;
        if (MPI_T_init_thread(MPI_THREAD_SINGLE, &provided) != MPI_SUCCESS) {
            return false;
        }
        bool on = false;
        int index = -1;
        MPI_T_cvar_handle handle = MPI_T_CVAR_HANDLE_NULL;
        int count = 0;
        if (MPI_T_cvar_get_index("mpi_yield_when_idle", &index) == MPI_SUCCESS &&
            MPI_T_cvar_handle_alloc(index, nullptr, &handle, &count) == MPI_SUCCESS) {
            // A bool or an int, whichever the MPI registered: any byte set is true.
            alignas(8) unsigned char value[16] = {};
            if (count == 1 && MPI_T_cvar_read(handle, value) == MPI_SUCCESS) {
                for (unsigned char byte : value) {
                    on = on || byte != 0;
                }
            }
            MPI_T_cvar_handle_free(&handle);
        }
        MPI_T_finalize();
        return on;
#else
        return false;
#endif
    }();
    return yields;
}

/// Whether an MPI communicator this process made found more ranks on its machine
/// than cores for them; once set, every communicator made after it yields in its
/// waits too.
inline std::atomic<bool>& machine_oversubscribed() noexcept {
    static std::atomic<bool> seen{false};
    return seen;
}

/// The CPUs (hardware threads) in the union of `members`' affinities, `masks`
/// holding every rank's cpu_words in rank order; the machine's hardware threads
/// when one of them could not read its own (0 when that is unknown too).
inline int cpus_of(std::span<const std::uint64_t> masks, std::span<const int> members) {
    const std::size_t n = cpu_words{}.size();
    cpu_words all{};
    for (int r : members) {
        std::uint64_t any = 0;
        for (std::size_t w = 0; w < n; ++w) {
            const std::uint64_t bits = masks[static_cast<std::size_t>(r) * n + w];
            all[w] |= bits;
            any |= bits;
        }
        if (any == 0) {
            return static_cast<int>(std::thread::hardware_concurrency());
        }
    }
    int cpus = 0;
    for (std::uint64_t word : all) {
        cpus += std::popcount(word);
    }
    return cpus;
}

/// Everything one MPI communicator owns; requests point at it.
class mpi_rank_state {
public:
    /// Collective over `comm` (the side channel duplicates it). `parent_node`, when
    /// not negative, names this rank's node (a split keeps its parent's nodes).
    mpi_rank_state(MPI_Comm comm, comm_options o, int parent_node = -1)
        : comm(comm), options(o), forced(mpi_forced_algorithm(o)), peers_(comm) {
        MPI_Comm_rank(comm, &rank);
        MPI_Comm_size(comm, &size);
        MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
        try {
            find_nodes(parent_node);
        } catch (...) { // options that differ across ranks: nothing to keep
            peers_.close(/*leak=*/false);
            MPI_Comm_free(&this->comm);
            throw;
        }
    }
    mpi_rank_state(const mpi_rank_state&) = delete;
    mpi_rank_state& operator=(const mpi_rank_state&) = delete;
    ~mpi_rank_state();

    /// A scratch buffer of at least `bytes`, reused across calls: the smallest free
    /// one that is large enough, else the largest, grown. (Calls in flight at once
    /// take buffers of different sizes, a ring's chunk and a coalesced call's staging
    /// copy; handing the small one to the ring would allocate and clear megabytes.)
    std::vector<std::byte> take_scratch(std::size_t bytes) {
        std::vector<std::byte> s;
        if (!scratch_.empty()) {
            auto pick = scratch_.begin();
            for (auto it = scratch_.begin(); it != scratch_.end(); ++it) {
                const bool fits = it->size() >= bytes, picked_fits = pick->size() >= bytes;
                if (fits ? !picked_fits || it->size() < pick->size()
                         : !picked_fits && it->size() > pick->size()) {
                    pick = it;
                }
            }
            s = std::move(*pick);
            scratch_.erase(pick);
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

    /// An operation set up for `call`, the `sequence`-th call of its kind (recycled
    /// when one is free).
    std::unique_ptr<mpi_operation> acquire(const collective_call& call, std::uint64_t sequence);
    /// Takes back a finished operation for reuse.
    void recycle(std::unique_ptr<mpi_operation> op) noexcept;

    /// Registers a started call with the progress engine: progress() drives every
    /// registered call, in issue order, whichever request is being waited. Only
    /// then may ranks wait their requests in different orders: a handshake or ring
    /// step of one call can need a peer that is waiting for another.
    void activate(mpi_operation* op) { in_flight_.push_back(op); }
    /// One pass over every call in flight (errors are kept in each call).
    void progress() noexcept;
    /// Forgets `op` (finished, recycled or destroyed).
    void deactivate(mpi_operation* op) noexcept {
        erase_from(in_flight_, op);
        erase_from(to_post_, op);
    }

    /// Queues `op`, whose call posts an MPI collective once its handshake is done.
    /// MPI matches collectives by the order they are posted in, so they are posted in
    /// the order they were issued, whatever order their handshakes finish in.
    void queue_post(mpi_operation* op) { to_post_.push_back(op); }
    /// True when `op` is the earliest call still to post its MPI collective.
    bool may_post(const mpi_operation* op) const noexcept {
        return !to_post_.empty() && to_post_.front() == op;
    }
    void posted(mpi_operation* op) noexcept { erase_from(to_post_, op); }
    /// True when the earliest call still to post has failed, after an error that
    /// made the communicator unusable (it stays first, mpi_operation::fail): no
    /// call behind it will ever post.
    bool post_blocked() const noexcept;

    /// Polls `op` to completion or throws timeout_error at the deadline (after which
    /// the communicator is unusable: MPI cannot cancel a collective).
    void wait(std::unique_ptr<mpi_operation> op);
    /// Starts `op`'s call; if that throws, the call ends as a failed wait would
    /// (failed, retire_failed) and the error propagates.
    void start(std::unique_ptr<mpi_operation>& op);

    /// Records that the call `label` failed with `e`: an argument or mismatch error
    /// leaves the communicator usable (every rank's call throws, and nothing of it
    /// goes on); any other error (an MPI call that failed) leaves this rank's peers
    /// in the middle of the call, so the communicator refuses further work, as after
    /// a timeout.
    void failed(const call_label& label, const std::exception_ptr& e) noexcept;
    /// Takes back `op`, whose call failed: for reuse when MPI holds none of its
    /// requests and the communicator is still usable; otherwise it is kept with the
    /// abandoned calls, never freed while MPI may still write into its staging,
    /// scratch or the caller's buffers. Once the communicator is unusable, it stays
    /// first in the post queue and what MPI allows is cancelled (abandon), as after
    /// a timeout.
    void retire_failed(std::unique_ptr<mpi_operation> op) noexcept;
    /// In a handler of the error `op`'s call threw: retires `op` and rethrows; an
    /// mpi_error while MPI may still use the caller's buffers (requests of the call
    /// past its handshake, or a handshake's send from the input, still posted) then
    /// says so (a posted send cannot be cancelled).
    [[noreturn]] void rethrow_failed(std::unique_ptr<mpi_operation> op);

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
    int node = 0;          ///< this rank's node's name (find_nodes)
    node_layout nodes;     ///< which ranks share a node (memory), the same on every rank
    bool one_node = false; ///< every rank on one node
    /// The CPUs (hardware threads) on which this rank's machine (its kernel:
    /// machine_key) runs the ranks of this communicator it holds: the union of
    /// their affinities (find_nodes, cpus_of), or, where a rank cannot read its
    /// own, the machine's hardware threads. The machine, not `nodes`: ranks_per_node
    /// may split one machine into several nodes, or MPI see one container as a node.
    int node_cores = 0;
    /// More of this communicator's ranks on this rank's machine than node_cores, or
    /// of any communicator this process made before (machine_oversubscribed): a
    /// waiting rank yields at every poll, so that the peer it waits for can run (an
    /// MPI's own progress loop does not always yield: MPICH's does not).
    bool oversubscribed = false;
    /// Oversubscribed, and the MPI does not yield by itself (mpi_yields_when_idle):
    /// a waiting rank yields at every poll. Where the MPI yields, doing it again
    /// made an 8-byte all-reduce of 4 processes on 2 cores 1.8x slower.
    bool yield_each_poll = false;
    comm_options options;
    algorithm forced; ///< the all-reduce algorithm options force (mpi_forced_algorithm)

    /// What decides a call `op` of `bytes` (the whole buffer, the count times the
    /// ranks for a reduce_scatter or an all_gather): the forced algorithm where `op`
    /// has it (rank_ordered when deterministic), else the first of options.tuning's
    /// rules that matches, else `forced`, which mpi_all_reduce_algorithm and its kin
    /// (which take this as their `forced`) then ignore for the built-in tuning where
    /// `op` has no such algorithm. So forcing the ring leaves a reduce_scatter to the
    /// rules, and deterministic sums leave the all_gather, which adds nothing, to them.
    algorithm decided(operation op, std::size_t bytes) const noexcept {
        if ((forced != algorithm::automatic && tuning_rule_allows(op, forced)) ||
            options.tuning.empty()) {
            return forced;
        }
        return options.tuning.find(op, bytes, size, nodes.node_ranks).value_or(forced);
    }
    mpi_user_ops user_ops;
    std::uint64_t sequence = 0;
    std::uint64_t p2p_sequence = 0;
    std::string poisoned;
    std::vector<std::unique_ptr<mpi_operation>> abandoned;

    /// This rank's schedule of the node-aware all_gather (made on first use).
    std::span<const gather_step> node_gather_plan() {
        if (!node_gather_plan_made_) {
            node_gather_plan_ =
                plan_node_all_gather(rank, nodes, mpi_tuning::node_all_gather_flat_max_ranks);
            node_gather_plan_made_ = true;
        }
        return node_gather_plan_;
    }

private:
    std::vector<gather_step> node_gather_plan_;
    bool node_gather_plan_made_ = false;
    std::vector<std::vector<std::byte>> scratch_;
    std::vector<std::unique_ptr<mpi_operation>> free_;
    std::deque<mpi_operation*> to_post_;
    std::vector<mpi_operation*> in_flight_; ///< calls in flight, in issue order
    mpi_peer_channel peers_;
    const mpi_operation* waiting_ = nullptr; ///< the call wait() is blocked on
    std::uint64_t polls_ = 0;

    /// Where this rank is, for a peer that asks.
    mpi_peer_report report() const noexcept;

    /// Sets `node`, `nodes` and `one_node`: the tuning tells one node from several,
    /// and the two-level all-reduce follows the nodes. A node is what
    /// MPI_Comm_split_type (MPI_COMM_TYPE_SHARED) groups, named by its lowest rank,
    /// or, with options.ranks_per_node = k, each block of k consecutive ranks, or
    /// the parent's node (`given`) for a split. The names are all-gathered, so every
    /// rank sees the same layout, and with them the options every rank must share
    /// (ranks_per_node, all_reduce_algorithm, deterministic, tuning): ranks whose schedules
    /// would differ could wait for each other until the timeout, so options that
    /// differ are an argument_error on every rank, naming a rank that differs, before
    /// any call. With them, each rank's machine (machine_key) and CPU affinity, for
    /// node_cores and oversubscribed.
    void find_nodes(int given) {
        node = rank; // collective calls alike on every rank, whatever its options
        MPI_Comm local = MPI_COMM_NULL;
        if (MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &local) ==
                MPI_SUCCESS &&
            local != MPI_COMM_NULL) {
            MPI_Allreduce(&rank, &node, 1, MPI_INT, MPI_MIN, local);
            MPI_Comm_free(&local);
        }
        // Where no kernel's name can be read, MPI's shared-memory group stands in
        // (a small number, unlike a hash).
        std::uint64_t machine = machine_key();
        if (machine == 0) {
            machine = static_cast<std::uint64_t>(node) + 1;
        }
        if (given >= 0) {
            node = given;
        } else if (options.ranks_per_node > 0) {
            node = rank / options.ranks_per_node;
        }
        const std::string rules = options.tuning.canonical();
        const std::uint64_t digest = fnv1a64(rules.data(), rules.size());
        constexpr std::size_t fields = 8;
        const int mine[fields] = {
            node,
            options.ranks_per_node,
            options.deterministic ? 1 : 0,
            static_cast<int>(forced),
            static_cast<int>(options.tuning.rules().size()),
            static_cast<int>(static_cast<std::uint32_t>(digest ^ (digest >> 32))),
            static_cast<int>(static_cast<std::uint32_t>(machine)),
            static_cast<int>(static_cast<std::uint32_t>(machine >> 32))};
        std::vector<int> all(fields * static_cast<std::size_t>(size));
        UNISON_CHECK_MPI(MPI_Allgather(mine, fields, MPI_INT, all.data(), fields, MPI_INT, comm),
                         rank, "mpi_communicator");
        // Each rank's CPU affinity: a launcher that binds every rank to a core of its
        // own (Open MPI at 2 ranks, Slurm's --cpu-bind) leaves each a single core, and
        // only the union over a machine says how many its ranks share.
        const cpu_words own = cpu_affinity();
        std::vector<std::uint64_t> masks(own.size() * static_cast<std::size_t>(size));
        UNISON_CHECK_MPI(MPI_Allgather(own.data(), static_cast<int>(own.size()), MPI_UINT64_T,
                                       masks.data(), static_cast<int>(own.size()), MPI_UINT64_T,
                                       comm),
                         rank, "mpi_communicator");
        std::vector<int> node_of(static_cast<std::size_t>(size));
        std::vector<int> same_machine;
        for (int r = 0; r < size; ++r) {
            const int* theirs = all.data() + fields * static_cast<std::size_t>(r);
            const auto differs = [&](const std::string& option, const std::string& here,
                                     const std::string& there) {
                throw argument_error(rank, "mpi_communicator",
                                     option + " is " + here + " on this rank but " + there +
                                         " on rank " + std::to_string(r) +
                                         "; every rank must pass the same");
            };
            const auto on = [](int v) { return std::string(v != 0 ? "on" : "off"); };
            const auto name = [](int a) {
                return std::string(to_string(static_cast<algorithm>(a)));
            };
            if (theirs[1] != mine[1]) {
                differs("comm_options::ranks_per_node (UNISON_RANKS_PER_NODE)",
                        std::to_string(mine[1]), std::to_string(theirs[1]));
            }
            if (theirs[2] != mine[2]) {
                differs("comm_options::deterministic (UNISON_DETERMINISTIC)", on(mine[2]),
                        on(theirs[2]));
            }
            if (theirs[3] != mine[3]) {
                differs("comm_options::all_reduce_algorithm (UNISON_ALGORITHM)", name(mine[3]),
                        name(theirs[3]));
            }
            if (theirs[4] != mine[4] || theirs[5] != mine[5]) {
                const auto rules_of = [](const int* v) {
                    return std::to_string(v[4]) + (v[4] == 1 ? " rule" : " rules") + " (digest " +
                           std::to_string(static_cast<std::uint32_t>(v[5])) + ")";
                };
                differs("comm_options::tuning (UNISON_TUNING_FILE)",
                        rules_of(mine) + (options.tuning.empty()
                                              ? std::string()
                                              : " from " + options.tuning.source()),
                        rules_of(theirs));
            }
            node_of[static_cast<std::size_t>(r)] = theirs[0];
            if (theirs[6] == mine[6] && theirs[7] == mine[7]) {
                same_machine.push_back(r);
            }
        }
        nodes = node_layout::of(node_of, rank);
        one_node = nodes.one_node(size);
        node_cores = cpus_of(masks, same_machine);
        oversubscribed = node_cores > 0 && static_cast<int>(same_machine.size()) > node_cores;
        // Kept for the process: the ranks a smaller communicator leaves out (a split,
        // or one made from an MPI communicator of a few ranks) still run.
        if (oversubscribed) {
            machine_oversubscribed().store(true, std::memory_order_relaxed);
        }
        oversubscribed = machine_oversubscribed().load(std::memory_order_relaxed);
        yield_each_poll = oversubscribed && !mpi_yields_when_idle();
        int world = 0;
        MPI_Comm_size(MPI_COMM_WORLD, &world);
        if (size == world) {
            // Every process of the job took part in this construction: calls abandoned
            // before it no longer say that a peer is gone (mpi_environment reads it).
            abandoned_calls::instance().clear();
        }
    }

    template <class Seq>
    static void erase_from(Seq& seq, mpi_operation* op) noexcept {
        for (auto it = seq.begin(); it != seq.end(); ++it) {
            if (*it == op) {
                seq.erase(it);
                return;
            }
        }
    }
};

/// One issued call: its handshake, then posted MPI requests or the ring schedule.
class mpi_operation {
public:
    explicit mpi_operation(mpi_rank_state& s) : state_(s) {}
    mpi_operation(const mpi_operation&) = delete;
    mpi_operation& operator=(const mpi_operation&) = delete;
    ~mpi_operation() {
        span_.end("destroyed");
        state_.deactivate(this);
        state_.give_scratch(std::move(scratch_));
        state_.give_scratch(std::move(stage_));
    }

    /// Sets the operation up for `c`, the `seq`-th call of its kind.
    void reset(const collective_call& c, std::uint64_t seq) {
        state_.deactivate(this);
        call_ = c;
        label_ = call_label{c.op, seq, c.root, c.tag};
        sequence_ = seq;
        requests_[0] = requests_[1] = MPI_REQUEST_NULL;
        active_ = 0;
        done_ = divide_ = copy_back_ = ordered_ = false;
        error_ = nullptr;
        phase_ = phase::posted;
        ring_.reset();
        node_gather_.reset();
        rab_.reset();
        ordered_fold_.reset();
        state_.give_scratch(std::move(scratch_));
        scratch_ = {};
        state_.give_scratch(std::move(stage_));
        stage_ = {};
        extents_.clear();
    }

    std::string label() const { return label_.str(); }
    const call_label& call() const noexcept { return label_; }
    std::uint64_t sequence() const noexcept { return sequence_; }

    /// The rank this call is waiting to hear from, when it knows; -1 otherwise.
    int waiting_for() const noexcept {
        if (phase_ == phase::handshake) {
            return handshake_.waiting_for();
        }
        if (rab_) {
            return rab_->waiting_for();
        }
        if (ordered_fold_) {
            return ordered_fold_->waiting_for();
        }
        if (node_gather_) {
            return node_gather_->waiting_for();
        }
        if (call_.op == operation::send || call_.op == operation::recv) {
            return call_.root;
        }
        return ring_ ? ring_->previous() : -1;
    }
    /// True when none of its requests is in MPI's hands.
    bool idle() const noexcept {
        return handshake_.idle() && active_ == 0 && !ring_ && (!rab_ || rab_->idle()) &&
               (!ordered_fold_ || ordered_fold_->idle()) && (!node_gather_ || node_gather_->idle());
    }
    /// True while the handshake runs: MPI holds its staging buffers and at most
    /// reads the caller's input (handshake_.reads_input()), never writes the
    /// caller's buffers.
    bool in_handshake() const noexcept { return phase_ == phase::handshake; }
    /// True when MPI may still read or write one of the caller's buffers.
    bool holds_caller_buffers() const noexcept {
        return !idle() && (!in_handshake() || handshake_.reads_input());
    }
    /// Gives the call up after a timeout: it is never driven again, so unison never
    /// touches its buffers again, and what MPI allows is cancelled: the ring's
    /// receives and a recv's (sends are left to complete on their own; MPI only reads
    /// their buffers). True when MPI holds nothing it could write into the caller's
    /// buffers: always for a call in its handshake (MPI writes only its staging
    /// buffers; the communicator's destructor cancels it), never for a posted MPI
    /// collective still running (MPI cannot cancel one).
    bool abandon() noexcept {
        done_ = true;
        span_.end("abandoned");
        if (phase_ == phase::handshake) {
            return true;
        }
        const auto budget = std::chrono::milliseconds(100);
        if (ring_) {
            return ring_->cancel(budget);
        }
        if (rab_) {
            return rab_->cancel(budget);
        }
        if (ordered_fold_) {
            return ordered_fold_->cancel(budget);
        }
        if (node_gather_) {
            return node_gather_->cancel(budget);
        }
        if (active_ == 0) {
            return true;
        }
        int flag = 0;
        MPI_Testall(active_, requests_, &flag, MPI_STATUSES_IGNORE);
        if (flag != 0) {
            return true;
        }
        if (call_.op == operation::send) {
            MPI_Request_free(&requests_[0]);
            return true;
        }
        if (call_.op == operation::recv) {
            MPI_Cancel(&requests_[0]);
            const auto until = clock::now() + budget;
            while (flag == 0 && clock::now() < until) {
                MPI_Test(&requests_[0], &flag, MPI_STATUS_IGNORE);
            }
            return flag != 0;
        }
        return false;
    }

    /// Gives up a call abandoned in its handshake.
    void cancel_handshake() noexcept {
        handshake_.cancel();
        done_ = true;
        span_.end("cancelled");
    }

    /// Starts the call: a collective with its handshake (which completes small
    /// all-reduces by itself), a send or receive directly.
    void start() {
        const collective_call& c = call_;
        state_.activate(this);
        if (c.op == operation::send || c.op == operation::recv) {
            post_call();
            return;
        }
        const bool reduces = c.op == operation::all_reduce;
        if (reduces) {
            const std::size_t bytes = c.count * size_of(c.type);
            algorithm_ = mpi_all_reduce_algorithm(state_.decided(c.op, bytes), bytes, state_.size,
                                                  state_.nodes.node_ranks);
        } else if (c.op == operation::reduce_scatter) { // announced in the header too
            const std::size_t bytes =
                c.count * size_of(c.type) * static_cast<std::size_t>(state_.size);
            algorithm_ = mpi_reduce_scatter_algorithm(state_.decided(c.op, bytes), bytes,
                                                      state_.size, state_.nodes.node_ranks);
        } else if (c.op == operation::all_gather) {
            const std::size_t bytes =
                c.count * size_of(c.type) * static_cast<std::size_t>(state_.size);
            algorithm_ = mpi_all_gather_algorithm(state_.decided(c.op, bytes), bytes, state_.size,
                                                  state_.nodes.node_ranks);
        } else if (c.op == operation::reduce && state_.options.deterministic && state_.size > 1) {
            algorithm_ = algorithm::rank_ordered;
        } else {
            algorithm_ = algorithm::automatic;
        }
        fused_ = reduces && (algorithm_ == algorithm::recursive_doubling ||
                             algorithm_ == algorithm::two_level);
        if (!c.pieces.empty()) {
            stage_pieces(algorithm_ != algorithm::ring &&
                         algorithm_ != algorithm::neighbour_exchange);
        }
        const int handshake_tag = mpi_tag(mpi_handshake_tag_base, mpi_handshake_tags, sequence_);
        // Every collective but the barrier (which the handshake is) and the calls that
        // run our own algorithms (matched by tag) posts an MPI collective, in issue order.
        ordered_ = c.op != operation::barrier &&
                   (algorithm_ == algorithm::automatic || algorithm_ == algorithm::native);
        const bool gathers = c.op == operation::all_gather &&
                             algorithm_ == algorithm::recursive_doubling && state_.size > 1;
        if (algorithm_ == algorithm::rabenseifner || gathers) { // checks as it goes
            rab_.emplace(state_.comm, state_.rank, state_.size, call_, sequence_, label_,
                         algorithm_, state_.nodes.node_ranks);
            scratch_ = state_.take_scratch(rab_->scratch_bytes());
            rab_->start(scratch_.data(), send_stage_, recv_stage_);
            return;
        }
        phase_ = phase::handshake;
        handshake_.start(state_.comm, state_.rank, state_.size, handshake_tag, c, sequence_,
                         algorithm_, fused_, state_.nodes, send_stage_, recv_stage_, &label_);
        if (ordered_) {
            state_.queue_post(this);
        }
    }

private:
    /// A coalesced all-reduce: copies into stage_ the pieces that go through it (all
    /// of them unless the ring carries the call: the other algorithms reduce one
    /// buffer; those under mpi_piece_min_bytes for the ring) and lays out the ring's
    /// extents: the other pieces in place, in order, then the stage. finish() copies
    /// the stage back.
    void stage_pieces(bool all) {
        collective_call& c = call_;
        const std::size_t es = size_of(c.type);
        stage_all_ = all;
        std::size_t bytes = 0;
        for (const buffer& p : c.pieces) {
            bytes += staged(p) ? p.count * es : 0;
        }
        if (bytes != 0) {
            stage_ = state_.take_scratch(bytes);
        }
        std::size_t at = 0, start = 0;
        for (const buffer& p : c.pieces) {
            if (p.count == 0) {
                continue;
            }
            if (staged(p)) {
                std::memcpy(stage_.data() + at, p.data, p.count * es);
                at += p.count * es;
            } else {
                auto* data = static_cast<std::byte*>(p.data);
                extents_.push_back(mpi_ring_extent{data, data, start, p.count});
                start += p.count;
            }
        }
        if (all) { // one buffer, in place
            c.send = c.recv = stage_.data();
        } else if (bytes != 0) {
            extents_.push_back(mpi_ring_extent{stage_.data(), stage_.data(), start, bytes / es});
        }
    }

    /// Whether piece `p` of a coalesced call goes through stage_.
    bool staged(const buffer& p) const noexcept {
        return stage_all_ || p.count * size_of(p.type) < mpi_piece_min_bytes;
    }

    /// Copies the staged pieces back (stage_pieces' order).
    void unstage_pieces() noexcept {
        const std::size_t es = size_of(call_.type);
        std::size_t at = 0;
        for (const buffer& p : call_.pieces) {
            if (p.count != 0 && staged(p)) {
                std::memcpy(p.data, stage_.data() + at, p.count * es);
                at += p.count * es;
            }
        }
    }

    /// Posts the call itself (after the handshake, for a collective).
    void post_call() {
        phase_ = phase::posted;
        span_.step("peers arrived"); // the handshake found every peer: data moves now
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
            if (algorithm_ == algorithm::ring || algorithm_ == algorithm::neighbour_exchange) {
                ring_.emplace(comm, state_.rank, n, call_, label_, sequence_,
                              std::span<const mpi_ring_extent>(extents_),
                              algorithm_ == algorithm::neighbour_exchange);
                scratch_ = state_.take_scratch(ring_->scratch_bytes());
                ring_->start(scratch_.data());
            } else if (algorithm_ == algorithm::rank_ordered) {
                start_ordered_fold();
            } else {
                post(MPI_Iallreduce(c.send == c.recv ? MPI_IN_PLACE : c.send, c.recv,
                                    int_count(c.count), t, reduction(), comm, next_request()),
                     "MPI_Iallreduce");
                divide_ = c.reduction == reduce_op::avg;
            }
            return;
        case operation::reduce_scatter: {
            if (algorithm_ == algorithm::rank_ordered) {
                start_ordered_fold();
                return;
            }
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
            if (algorithm_ == algorithm::ring || algorithm_ == algorithm::neighbour_exchange) {
                ring_.emplace(mpi_ring_allreduce::all_gather, comm, state_.rank, n, call_, label_,
                              sequence_, algorithm_ == algorithm::neighbour_exchange);
                ring_->start(nullptr);
                return;
            }
            if (algorithm_ == algorithm::two_level) {
                node_gather_.emplace(comm, state_.rank, call_, label_, sequence_,
                                     state_.node_gather_plan());
                node_gather_->start();
                return;
            }
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
                offset += c.counts[static_cast<std::size_t>(q)];
            }
            check_int(offset); // every displacement fits (the counts agree on every rank)
            offset = 0;
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
            if (algorithm_ == algorithm::rank_ordered) {
                start_ordered_fold();
                return;
            }
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
        case operation::barrier: // the handshake was one
            return;
        }
    }

    /// Posts the first phase of a rank-ordered (deterministic) reduction.
    void start_ordered_fold() {
        ordered_fold_.emplace(
            state_.comm, state_.rank, state_.size, call_, sequence_, label_,
            mpi_tuning::rank_ordered_direct(call_.count * size_of(call_.type), state_.size));
        scratch_ = state_.take_scratch(ordered_fold_->scratch_bytes());
        ordered_fold_->start(scratch_.data());
    }

public:
    /// Drives every call in flight forward; true once this one is complete (results
    /// final). Throws this call's error.
    bool progress() {
        if (!done_) {
            state_.progress();
        }
        if (error_) {
            std::rethrow_exception(error_);
        }
        return done_;
    }
    bool done() const noexcept { return done_; }
    /// The call on the timeline (begun by the communicator, ended here).
    collective_span& span() noexcept { return span_; }

    /// One step of this call, as part of the engine's pass; an error ends the call
    /// and is kept for its own wait.
    void advance() noexcept {
        if (done_) {
            return;
        }
        try {
            step();
        } catch (...) {
            fail(std::current_exception());
        }
    }
    /// Ends the call with `e`, kept for its own wait (see mpi_rank_state::failed).
    void fail(std::exception_ptr e) noexcept {
        done_ = true;
        error_ = e;
        span_.end("error");
        state_.failed(label_, error_);
        if (state_.poisoned.empty()) {
            // Every rank's call failed alike: later collectives may post. After an
            // error that left the peers in this call (in its handshake, or posting
            // its MPI collective), it stays first in the post queue, as a timed-out
            // call does: were a later call to post its MPI collective, a peer could
            // match it with this one's.
            state_.posted(this); // never will
        }
    }

private:
    void step() {
        if (rab_) {
            if (rab_->progress()) {
                finish();
            }
            return;
        }
        if (phase_ == phase::handshake) {
            if (!handshake_.progress()) {
                return;
            }
            if (fused_) {
                finish();
                return;
            }
            if (ordered_ && !state_.may_post(this)) {
                if (state_.post_blocked()) {
                    // An earlier call failed and stays first: this one never posts.
                    throw error(state_.rank, label(),
                                "this communicator became unusable while the call waited to "
                                "post its MPI collective, since " +
                                    state_.poisoned);
                }
                return; // an earlier call posts first
            }
            post_call();
            if (ordered_) {
                state_.posted(this); // only now: see fail()
            }
        }
        if (ring_) {
            if (!ring_->progress()) {
                return;
            }
        } else if (ordered_fold_) {
            if (!ordered_fold_->progress()) {
                return;
            }
        } else if (node_gather_) {
            if (!node_gather_->progress()) {
                return;
            }
        } else if (call_.op == operation::recv) {
            int flag = 0;
            MPI_Status status;
            const int rc = MPI_Test(&requests_[0], &flag, &status);
            if (rc != MPI_SUCCESS) {
                received_in_error(rc);
            }
            if (flag == 0) {
                return;
            }
            active_ = 0;
            check_received(status);
        } else {
            int flag = 0;
            UNISON_CHECK_MPI(MPI_Testall(active_, requests_, &flag, MPI_STATUSES_IGNORE),
                             state_.rank, label());
            if (flag == 0) {
                return;
            }
            active_ = 0;
        }
        finish();
    }

    /// A recv that MPI completed with error `rc`: a message longer than the buffer
    /// (cut short to fit) is a mismatch of counts, and the communicator stays
    /// usable; anything else is an mpi_error. (MPICH 4.0 ends the job on a cut-short
    /// receive instead, whatever the communicator's error handler.) The receive is
    /// posted before the message arrives, as MPI's own is, so that MPI can complete
    /// the sender's transfer while this rank is in another call or communicator.
    [[noreturn]] void received_in_error(int rc) {
        if (requests_[0] != MPI_REQUEST_NULL) {
            MPI_Request_free(&requests_[0]); // completed: MPI is done with it
        }
        active_ = 0;
        int kind = MPI_ERR_OTHER;
        MPI_Error_class(rc, &kind);
        if (kind == MPI_ERR_TRUNCATE) {
            throw mismatch_error(state_.rank, label(),
                                 "expected " + describe(call_.count, call_.type) + " from rank " +
                                     std::to_string(call_.root) +
                                     " but a longer message arrived (MPI_ERR_TRUNCATE: the "
                                     "buffer holds its first part)",
                                 call_.root, "count");
        }
        throw_mpi_error(rc, state_.rank, label(), "MPI_Test");
    }

    /// A completed recv: a shorter message than the buffer is a mismatch of counts.
    void check_received(const MPI_Status& status) const {
        int got = 0;
        MPI_Get_count(&status, mpi_datatype(call_.type), &got);
        if (static_cast<std::size_t>(got) != call_.count) {
            throw mismatch_error(state_.rank, label(),
                                 "expected " + describe(call_.count, call_.type) + " from rank " +
                                     std::to_string(call_.root) + " but " +
                                     (got == MPI_UNDEFINED ? std::string("a part of an element")
                                                           : std::to_string(got)) +
                                     " arrived (written to the buffer's start)",
                                 call_.root, "count");
        }
    }

    void check_int(std::size_t count) const {
        if (count > static_cast<std::size_t>(INT_MAX)) {
            throw argument_error(state_.rank, label(),
                                 std::to_string(count) +
                                     " elements exceed MPI's int count limit; split the call");
        }
    }
    static int int_count(std::size_t n) noexcept { return static_cast<int>(n); }

    MPI_Op reduction() const noexcept {
        return mpi_native_reduction(call_.type, call_.reduction)
                   ? mpi_native_op(call_.reduction)
                   : state_.user_ops.get(call_.type, call_.reduction);
    }

    MPI_Request* next_request() noexcept { return &requests_[active_]; }
    void post(int rc, const char* what) {
        if (rc != MPI_SUCCESS) {
            throw_mpi_error(rc, state_.rank, label(), what);
        }
        ++active_;
    }

    void finish() {
        done_ = true;
        span_.end();
        const std::size_t es = size_of(call_.type);
        if (copy_back_ && call_.count != 0) {
            std::memcpy(call_.recv, scratch_.data(), call_.count * es);
        }
        if (divide_) {
            void* out = call_.recv;
            host_reduce(call_.type, reduce_op::sum, const_cast<const void* const*>(&out), 1, &out,
                        1, call_.count, state_.size);
        }
        if (!stage_.empty()) {
            unstage_pieces();
        }
    }

    enum class phase { handshake, posted };

    mpi_rank_state& state_;
    collective_call call_;
    call_label label_;
    std::uint64_t sequence_ = 0;
    phase phase_ = phase::posted;
    mpi_handshake handshake_;
    algorithm algorithm_ = algorithm::automatic; ///< the call's (tuning.hpp)
    bool fused_ = false;       ///< an all-reduce by recursive doubling, done inside the handshake
    bool ordered_ = false;     ///< posts an MPI collective, in issue order
    std::exception_ptr error_; ///< kept when another call's wait drove this one
    std::vector<std::byte> send_stage_, recv_stage_; ///< first messages (grown to fit)
    MPI_Request requests_[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    int active_ = 0;
    bool done_ = false;
    collective_span span_;
    bool divide_ = false;
    bool copy_back_ = false;
    std::optional<mpi_ring_allreduce> ring_;         ///< all-reduces and all_gathers by the ring
    std::optional<mpi_rabenseifner> rab_;            ///< rabenseifner.hpp's schedules only
    std::optional<mpi_rank_ordered> ordered_fold_;   ///< deterministic reductions only
    std::optional<mpi_node_all_gather> node_gather_; ///< all_gathers by two_level
    std::vector<std::byte> scratch_;
    std::vector<std::byte> stage_;         ///< coalesced: the pieces copied, see stage_pieces
    bool stage_all_ = false;               ///< coalesced: every piece staged (a small call)
    std::vector<mpi_ring_extent> extents_; ///< coalesced: the ring's elements
    std::vector<int> counts_, displs_;
};

inline std::unique_ptr<mpi_operation> mpi_rank_state::acquire(const collective_call& call,
                                                              std::uint64_t sequence) {
    std::unique_ptr<mpi_operation> op;
    if (free_.empty()) {
        op = std::make_unique<mpi_operation>(*this);
    } else {
        op = std::move(free_.back());
        free_.pop_back();
    }
    op->reset(call, sequence);
    return op;
}

inline mpi_peer_report mpi_rank_state::report() const noexcept {
    mpi_peer_report r;
    r.issued = static_cast<std::int64_t>(sequence);
    const mpi_operation* op = waiting_ ? waiting_ : in_flight_.empty() ? nullptr : in_flight_[0];
    if (op != nullptr) {
        r.in_call = 1;
        r.op = static_cast<std::int64_t>(op->call().op);
        r.sequence = static_cast<std::int64_t>(op->call().sequence);
        r.peer = op->call().peer;
        r.tag = op->call().tag;
        r.waiting_for = op->waiting_for();
    }
    return r;
}

inline void mpi_rank_state::progress() noexcept {
    if ((++polls_ & 63) == 0) {
        peers_.answer(report()); // a peer that timed out may be asking where we are
    }
    // By index: a pass only finishes calls, it never starts or destroys one.
    for (std::size_t i = 0; i < in_flight_.size(); ++i) {
        in_flight_[i]->advance();
    }
    std::erase_if(in_flight_, [](const mpi_operation* op) { return op->done(); });
}

inline void mpi_rank_state::recycle(std::unique_ptr<mpi_operation> op) noexcept {
    if (free_.size() < 16) {
        free_.push_back(std::move(op));
    }
}

inline bool mpi_rank_state::post_blocked() const noexcept {
    return !to_post_.empty() && to_post_.front()->done();
}

inline void mpi_rank_state::start(std::unique_ptr<mpi_operation>& op) {
    try {
        op->start();
    } catch (...) {
        op->fail(std::current_exception());
        rethrow_failed(std::move(op));
    }
}

inline void mpi_rank_state::rethrow_failed(std::unique_ptr<mpi_operation> op) {
    const bool held = op->holds_caller_buffers();
    retire_failed(std::move(op));
    try {
        throw;
    } catch (const mpi_error& e) {
        if (!held) {
            throw;
        }
        throw mpi_error(e, mpi_held_buffers_note(false));
    }
}

inline void mpi_rank_state::failed(const call_label& label, const std::exception_ptr& e) noexcept {
    if (!poisoned.empty()) {
        return; // the first reason stands
    }
    try {
        std::rethrow_exception(e);
    } catch (const argument_error&) {
    } catch (const mismatch_error&) {
    } catch (const std::exception& x) {
        try {
            // A unison error's message after its "unison: rank R: OPERATION: ".
            const std::string_view what = x.what();
            const std::string lead = label.str() + ": ";
            const std::size_t at = what.find(lead);
            poisoned =
                label.str() + " failed (" +
                std::string(at == std::string_view::npos ? what : what.substr(at + lead.size())) +
                ")";
        } catch (...) {
            poisoned = "a call failed";
        }
    } catch (...) {
        poisoned = "a call failed";
    }
}

inline void mpi_rank_state::retire_failed(std::unique_ptr<mpi_operation> op) noexcept {
    erase_from(in_flight_, op.get());
    if (poisoned.empty()) {
        if (op->idle()) {
            deactivate(op.get());
            recycle(std::move(op)); // nothing of it is in flight
            return;
        }
        // A foreign message broke its handshake mid-step.
    } else {
        // Kept in the post queue (mpi_operation::fail); past its handshake, its
        // receives are cancelled where MPI allows.
        (void)op->abandon();
    }
    try {
        abandoned.push_back(std::move(op));
    } catch (...) {
        (void)op.release(); // out of memory: leaked, as the abandoned are in the end
    }
}

inline void mpi_rank_state::wait(std::unique_ptr<mpi_operation> op) {
    struct waiting_on {
        const mpi_operation*& slot;
        ~waiting_on() { slot = nullptr; }
    } guard{waiting_ = op.get()};
    const auto start = clock::now();
    const auto deadline = start + options.timeout;
    for (std::size_t polls = 1;; ++polls) {
        bool done = false;
        try {
            done = op->progress();
        } catch (...) {
            rethrow_failed(std::move(op));
        }
        if (done) {
            recycle(std::move(op));
            return;
        }
        if (yield_each_poll) {
            std::this_thread::yield();
        }
        if ((polls & 63) == 0) {
            const auto now = clock::now();
            if (now >= deadline) {
                const std::string label = op->label();
                const std::uint64_t seq = op->sequence();
                const mpi_peer_report mine = report();
                if (poisoned.empty()) {
                    poisoned = label + " timed out";
                }
                abandoned_calls::instance().record(
                    {label, static_cast<int>(mine.waiting_for), options.timeout});
                // Never driven again: in its handshake, the engine must not go on to
                // hand MPI the user's buffers to write (it stays first in the post queue, so
                // no later collective posts past it either); past it, unison must not
                // write them once the caller has its error.
                erase_from(in_flight_, op.get());
                const bool released = op->abandon();
                abandoned.push_back(std::move(op)); // leaked with the communicator
                // Ask the others where they are, within half a second.
                const auto budget = std::chrono::milliseconds(500);
                const auto answers = peers_.ask(mine, budget);
                throw timeout_error(
                    rank, label,
                    "not complete after " + std::to_string(options.timeout.count()) + " ms" +
                        (mine.waiting_for >= 0
                             ? ", waiting to hear from rank " + std::to_string(mine.waiting_for)
                             : std::string()) +
                        "; " + describe_peers(answers, rank, mine, budget) +
                        (released ? std::string()
                                  : "; MPI still holds this call's buffers (a posted MPI "
                                    "collective cannot be cancelled, or a transfer was under "
                                    "way) and may write them if the peer goes on: keep them "
                                    "allocated, or end the job (MPI_Abort)"),
                    seq);
            }
            if (now - start > std::chrono::milliseconds(1)) {
                std::this_thread::yield(); // let an oversubscribed peer run
            }
        }
    }
}

inline mpi_rank_state::~mpi_rank_state() {
    free_.clear(); // while the queue they would leave still exists
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) {
        for (auto& op : abandoned) {
            (void)op.release(); // MPI is gone; their destructors would touch freed members
        }
        return;
    }
    peers_.close(/*leak=*/!poisoned.empty() || !abandoned.empty());
    // A call abandoned in its handshake receives only into its own staging: cancel it
    // now. Past its handshake, abandon() cancelled what MPI allows when the call
    // timed out. Either way nothing waits for a peer here (it would cost the caller a
    // second timeout), and an abandoned call is leaked along with its buffers and the
    // communicator: a late peer may still send to it, and freeing the communicator
    // would let MPI give its context to a new one, which would then receive those
    // messages.
    for (auto& op : abandoned) {
        if (op->in_handshake()) {
            op->cancel_handshake();
        }
        (void)op.release();
    }
    if (abandoned.empty()) {
        MPI_Comm_free(&comm);
    }
}

} // namespace unison::detail
