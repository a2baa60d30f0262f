#pragma once

/// \file
/// The Gloo backend: collectives over Gloo's TCP transport, for CPU jobs without
/// MPI. Its ranks meet through unison's `tcp_store` (torchrun's and Kubernetes'
/// RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT), which carries every rank's Gloo
/// address; after that Gloo connects every pair of ranks directly and carries all
/// the data. Calls run in issue order on one worker thread per communicator (as
/// PyTorch's ProcessGroupGloo runs them on its own), so every form is
/// non-blocking; send and recv are posted at once from the calling thread. Every
/// collective starts with a handshake that exchanges every rank's call signature
/// (gloo/detail/operations.hpp): a mismatch is a mismatch_error on every rank before
/// any data moves, and a rank that does not come is named. Link `unison::gloo`.

#include "unison/comm/collective.hpp"
#include "unison/comm/communicator.hpp"
#include "unison/comm/detail/trace.hpp"
#include "unison/comm/options.hpp"
#include "unison/core/error.hpp"
#include "unison/core/log.hpp"
#include "unison/core/timeline.hpp"
#include "unison/gloo/detail/operations.hpp"
#include "unison/gloo/detail/store_adapter.hpp"
#include "unison/gloo/tuning.hpp"
#include "unison/rendezvous/tcp_store.hpp"

#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <signal.h>
#include <unistd.h>

namespace unison {

/// Where this rank's Gloo transport listens for its peers.
struct gloo_transport_options {
    /// The network interface to listen on (GLOO_SOCKET_IFNAME, as PyTorch reads
    /// it); empty: by `hostname`.
    std::string interface;
    /// The address or host name to listen on; empty: 127.0.0.1 when the store is on
    /// this machine's loopback (a one-machine job), else this machine's host name.
    std::string hostname;

    /// GLOO_SOCKET_IFNAME (a comma-separated list takes its first interface).
    static gloo_transport_options from_env() {
        gloo_transport_options o;
        if (const char* i = std::getenv("GLOO_SOCKET_IFNAME"); i != nullptr && *i != '\0') {
            o.interface = i;
            o.interface = o.interface.substr(0, o.interface.find(','));
        }
        return o;
    }
};

namespace detail {

/// Gloo's TCP transport writes with writev(), which raises SIGPIPE when the peer's
/// end has closed: a rank whose peer was killed would die of it, silently, before
/// any error could name the peer (Python, and so PyTorch, ignores SIGPIPE from the
/// start; a C++ program does not). So the first Gloo communicator of a process sets
/// SIGPIPE to be ignored, as gRPC does, unless the program has its own handler;
/// writes to a closed socket then fail with EPIPE, which Gloo reports.
inline void gloo_ignore_sigpipe(int rank) {
    static const bool ignored = [rank] {
        struct sigaction current {};
        if (::sigaction(SIGPIPE, nullptr, &current) != 0 || (current.sa_flags & SA_SIGINFO) != 0 ||
            current.sa_handler != SIG_DFL) {
            return false; // the program decided already
        }
        struct sigaction ignore {};
        ignore.sa_handler = SIG_IGN;
        sigemptyset(&ignore.sa_mask);
        if (::sigaction(SIGPIPE, &ignore, nullptr) != 0) {
            return false;
        }
        log(log_level::info, rank, [] {
            return std::string("gloo_communicator: SIGPIPE is now ignored in this process, so "
                               "that a peer's closed connection is an error, not this "
                               "process's end");
        });
        return true;
    }();
    (void)ignored;
}

/// One queued call of a Gloo communicator, or one posted send or recv.
struct gloo_task {
    collective_call call;
    std::vector<std::size_t> counts; ///< all_gatherv: the call's counts, kept here
    std::uint64_t sequence = 0;
    std::string label;
    collective_span span;
    // a posted send or recv
    std::unique_ptr<::gloo::transport::UnboundBuffer> p2p;
    // completion (queued calls)
    std::mutex mutex;
    std::condition_variable cv;
    bool done = false;
    std::exception_ptr failure;
};

/// A communicator's Gloo context and the worker thread that runs its calls.
class gloo_state {
public:
    /// `store_ranks`: each rank's rank in the store (empty: the same as here).
    gloo_state(std::shared_ptr<tcp_store> store, std::shared_ptr<::gloo::transport::Device> device,
               std::string prefix, int rank, int size, comm_options options,
               std::vector<int> store_ranks = {})
        : store(std::move(store)), device(std::move(device)), prefix(std::move(prefix)), rank(rank),
          size(size), options(options), store_ranks(std::move(store_ranks)) {
        if (this->store_ranks.empty()) {
            for (int q = 0; q < size; ++q) {
                this->store_ranks.push_back(q);
            }
        }
        gloo_ignore_sigpipe(rank);
        context = std::make_shared<::gloo::rendezvous::Context>(rank, size);
        context->setTimeout(options.timeout);
        gloo_store_adapter adapter(this->store, this->prefix);
        try {
            context->connectFullMesh(adapter, this->device);
        } catch (const ::gloo::Exception& e) {
            throw error(rank, "gloo_communicator",
                        std::string("Gloo could not connect the ranks: ") + e.what());
        }
        handshake = std::make_unique<gloo_handshake_buffers>(*context);
        worker = std::thread([this] { work(); });
    }
    gloo_state(const gloo_state&) = delete;
    gloo_state& operator=(const gloo_state&) = delete;

    /// Finishes the call in progress (bounded by Gloo's timeout); calls still queued
    /// fail, as requests must be waited on before their communicator goes.
    ~gloo_state() {
        {
            std::lock_guard lock(mutex);
            stopping = true;
        }
        cv.notify_all();
        worker.join();
        handshake.reset(); // before the context its buffers belong to
    }

    void enqueue(std::shared_ptr<gloo_task> t) {
        {
            std::lock_guard lock(mutex);
            queue.push_back(std::move(t));
        }
        cv.notify_all();
    }

    std::shared_ptr<tcp_store> store;
    std::shared_ptr<::gloo::transport::Device> device;
    std::shared_ptr<::gloo::rendezvous::Context> context;
    std::unique_ptr<gloo_handshake_buffers> handshake; ///< used by the worker only
    std::string prefix;                                ///< of this communicator's store keys
    int rank = 0;
    int size = 1;
    comm_options options;
    std::vector<int> store_ranks;   ///< each rank's rank in the store
    std::uint64_t sequence = 0;     ///< collectives issued
    std::uint64_t p2p_sequence = 0; ///< sends and recvs issued
    int splits = 0;                 ///< split() calls so far (names the children's keys)

    std::mutex mutex;
    std::condition_variable cv;
    std::deque<std::shared_ptr<gloo_task>> queue;
    bool stopping = false;
    std::string poisoned; ///< why the communicator is unusable, once it is (under mutex)
    bool busy = false;    ///< a call is running, on the worker or inline (under mutex)

    /// Runs `t` on the calling thread when nothing is queued or running, so that a
    /// blocking call costs no hand-over to the worker and back; false (nothing done)
    /// otherwise, and the call must be queued behind the others.
    /// Marks the communicator unusable, saying why (the first reason stays).
    void mark_unusable(const std::string& why) { poison(why); }

    bool run_inline(gloo_task& t) {
        {
            std::lock_guard lock(mutex);
            if (!queue.empty() || busy || stopping) {
                return false;
            }
            if (!poisoned.empty()) { // a call queued before this one failed meanwhile
                std::exception_ptr e = std::make_exception_ptr(error( // see work()
                    rank, t.label, "not run: this communicator is unusable since " + poisoned));
                finish(t, std::move(e));
                return true;
            }
            busy = true;
        }
        finish(t, run(t));
        {
            std::lock_guard lock(mutex);
            busy = false;
        }
        cv.notify_all();
        return true;
    }

private:
    void work() {
        for (;;) {
            std::shared_ptr<gloo_task> t;
            std::string broken;
            {
                std::unique_lock lock(mutex);
                cv.wait(lock,
                        [&] { return (stopping && queue.empty()) || (!queue.empty() && !busy); });
                if (queue.empty()) {
                    return;
                }
                t = std::move(queue.front());
                queue.pop_front();
                busy = true;
                broken = stopping ? "it was destroyed with the call still queued" : poisoned;
            }
            // The error is made in its own statement: a temporary would share its
            // message buffer with the caller's copy and die after finish() hands it over.
            std::exception_ptr e =
                broken.empty() ? run(*t)
                               : std::make_exception_ptr(error(
                                     rank, t->label,
                                     "not run: this communicator is unusable since " + broken));
            finish(*t, std::move(e));
            {
                std::lock_guard lock(mutex);
                busy = false;
            }
            cv.notify_all();
        }
    }

    static void finish(gloo_task& t, std::exception_ptr failure) {
        t.span.end(failure ? "error" : nullptr);
        {
            std::lock_guard lock(t.mutex);
            t.failure = std::move(failure);
            t.done = true;
        }
        t.cv.notify_all();
    }

    std::exception_ptr run(gloo_task& t) {
        try {
            t.span.started();
            gloo_handshake_run(*context, *handshake, t.call, t.label, t.sequence, options.timeout);
            t.span.step("peers arrived");
            gloo_run(context, t.call, options.timeout);
            return nullptr;
        } catch (const mismatch_error&) {
            return std::current_exception(); // found before any data moved: still usable
        } catch (const peer_error& e) {      // the handshake saw a connection break
            poison(t.label + " failed");
            std::string seen = e.what(); // without its "unison: rank R: OPERATION: "
            const std::string head =
                "unison: rank " + std::to_string(rank) + ": " + e.operation() + ": ";
            if (seen.starts_with(head)) {
                seen.erase(0, head.size());
            }
            return name_departed(t, "Seen as: " + seen, e.peer());
        } catch (const error& e) {
            poison(t.label + " failed");
            return std::current_exception();
        } catch (const ::gloo::Exception& e) {
            poison(t.label + " failed");
            const std::string what = e.what();
            if (what.find("Timed out") != std::string::npos) {
                return std::make_exception_ptr(timeout_error(
                    rank, t.label,
                    "did not complete within " + std::to_string(options.timeout.count()) +
                        " ms after every rank came to it (Gloo: " + what + ")",
                    t.sequence));
            }
            return name_departed(t, "Gloo: " + what, -1);
        } catch (const std::exception& e) { // Gloo's own checks (gloo::EnforceNotMet)
            poison(t.label + " failed");
            return std::make_exception_ptr(
                error(rank, t.label, std::string("Gloo failed: ") + e.what()));
        } catch (...) {
            poison(t.label + " failed");
            return std::current_exception();
        }
    }

    /// A connection broke in `t` (`what`: how it was seen; `peer`: the rank at its
    /// other end, if known). Gloo cannot tell a peer that ended from one whose Gloo
    /// failed, nor which one ended (a rank that saw the break closes its own
    /// connections too), but the store can: a process that ends closes its
    /// connection to the store as well. So the store is asked, for up to a second,
    /// which member has left, and that rank is named.
    std::exception_ptr name_departed(const gloo_task& t, const std::string& what, int peer) {
        std::vector<int> gone;
        std::string unreachable;
        try {
            // Ranks outside this communicator may have left before: wait on until a
            // member is among those gone, or a second has passed.
            const auto deadline = std::chrono::steady_clock::now() +
                                  std::min(options.timeout, std::chrono::milliseconds(1000));
            std::size_t known = 0;
            for (;;) {
                const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                    deadline - std::chrono::steady_clock::now());
                const std::vector<int> all = store->departed(left, known);
                for (const int s : all) {
                    const auto at = std::find(store_ranks.begin(), store_ranks.end(), s);
                    if (at != store_ranks.end()) {
                        gone.push_back(static_cast<int>(at - store_ranks.begin()));
                    }
                }
                if (!gone.empty() || all.size() <= known || left.count() <= 0) {
                    break;
                }
                known = all.size();
            }
        } catch (const std::exception& e) {
            unreachable = e.what();
        }
        std::string ranks;
        for (const int q : gone) {
            ranks += (ranks.empty() ? "" : ", ") + std::to_string(q);
        }
        if (!gone.empty()) {
            return std::make_exception_ptr(peer_error(
                rank, t.label,
                std::string(gone.size() == 1 ? "rank " : "ranks ") + ranks + " of " +
                    std::to_string(size) +
                    " left during this call (its connection to the store closed as well: it "
                    "exited, crashed or was killed); the communicator is unusable. " +
                    what,
                gone.front()));
        }
        if (!unreachable.empty()) {
            // The store went with the process that hosts it: store rank 0 by default.
            const auto host = std::find(store_ranks.begin(), store_ranks.end(), 0);
            const int q =
                host != store_ranks.end() ? static_cast<int>(host - store_ranks.begin()) : peer;
            return std::make_exception_ptr(peer_error(
                rank, t.label,
                "a connection broke during this call and the store cannot be reached either (" +
                    unreachable + "), so the process that hosts the store" +
                    (q >= 0 && host != store_ranks.end() ? ", rank " + std::to_string(q) + ","
                                                         : std::string()) +
                    " has ended; the communicator is unusable. " + what,
                q));
        }
        return std::make_exception_ptr(
            peer_error(rank, t.label,
                       "a connection broke during this call while every rank is still connected "
                       "to the store (a rank's Gloo failed, or it destroyed this communicator); "
                       "the communicator is unusable. " +
                           what,
                       peer));
    }

    /// Marks the communicator unusable and ends its Gloo context: every connection
    /// closes, so that peers waiting on this rank hear at once that it has stopped
    /// (Gloo tells an operation only of a break on the connections it waits on: a
    /// rank waiting on a live peer whose own peer died would otherwise wait until
    /// the timeout, or until that live peer's process ends), and this rank's other
    /// operations in flight end with an error rather than at their timeout.
    void poison(const std::string& why) {
        bool first = false;
        {
            std::lock_guard lock(mutex);
            first = poisoned.empty();
            if (first) {
                poisoned = why;
            }
        }
        if (first && context && size > 1) {
            // Gloo's own way to end a context: a wait that times out signals every
            // pair, which wakes this rank's other waiting operations with an error
            // and closes every connection, so that the peers hear of it too.
            // (Context::closeConnections closes them without waking the waiters.)
            try {
                auto probe = context->createUnboundBuffer(nullptr, 0);
                probe->waitRecv(std::chrono::milliseconds(1));
            } catch (...) { // the expected timeout; nothing more to tell the peers
            }
        }
    }

    std::thread worker;
};

} // namespace detail

/// A pending operation of the Gloo backend (see the `request` concept).
class [[nodiscard]] gloo_request {
public:
    gloo_request() = default;
    gloo_request(gloo_request&&) noexcept = default;
    gloo_request& operator=(gloo_request&& other) noexcept {
        if (this != &other) {
            finish_quietly();
            task_ = std::move(other.task_);
            state_ = other.state_;
            rank_ = other.rank_;
            timeout_ = other.timeout_;
            send_ = other.send_;
        }
        return *this;
    }
    /// Waits for an operation still in flight (errors are dropped; call wait() to see them).
    ~gloo_request() { finish_quietly(); }

    /// Blocks until complete and rethrows its error. A queued call is bounded by the
    /// calls before it, each by the communicator's timeout; a send or recv by the
    /// timeout, then timeout_error.
    void wait() {
        if (!task_) {
            return;
        }
        auto t = std::move(task_);
        if (t->p2p) {
            wait_p2p(*t);
            return;
        }
        std::unique_lock lock(t->mutex);
        t->cv.wait(lock, [&] { return t->done; });
        if (t->failure) {
            std::rethrow_exception(t->failure);
        }
    }

    /// True once complete. Gloo cannot tell whether a send or recv is done without
    /// waiting (a wait that times out closes every connection), so test() on one
    /// waits for it (bounded by the timeout, as wait() is) and then returns true.
    bool test() {
        if (!task_) {
            return true;
        }
        if (task_->p2p) {
            wait();
            return true;
        }
        std::lock_guard lock(task_->mutex);
        return task_->done;
    }

private:
    friend class gloo_communicator;
    gloo_request(std::shared_ptr<detail::gloo_task> t, detail::gloo_state* state, int rank,
                 std::chrono::milliseconds timeout, bool send)
        : task_(std::move(t)), state_(state), rank_(rank), timeout_(timeout), send_(send) {}

    void wait_p2p(detail::gloo_task& t) {
        int peer = t.call.root;
        try {
            const bool ok =
                send_ ? t.p2p->waitSend(&peer, timeout_) : t.p2p->waitRecv(&peer, timeout_);
            t.span.end(ok ? nullptr : "aborted");
        } catch (const std::exception& e) { // gloo::IoException, or Gloo's own checks
            t.span.end("error");
            const std::string what = e.what();
            const std::string other = "rank " + std::to_string(t.call.root);
            // A failed wait leaves Gloo's connections closed: nothing more can run.
            if (state_ != nullptr) {
                state_->mark_unusable(t.label + " failed");
            }
            if (what.find("Timed out") != std::string::npos) {
                throw timeout_error(
                    rank_, t.label,
                    other + " did not " + (send_ ? "receive" : "send") + " tag " +
                        std::to_string(t.call.tag) + " of " + std::to_string(t.call.count) + " " +
                        std::string(to_string(t.call.type)) + " elements within " +
                        std::to_string(timeout_.count()) + " ms (a " + (send_ ? "recv" : "send") +
                        " of another count or dtype does not match this one)",
                    t.sequence);
            }
            throw peer_error(rank_, t.label,
                             "the connection to " + other +
                                 " broke (Gloo then closes every "
                                 "connection of the communicator): " +
                                 what,
                             t.call.root);
        }
    }

    void finish_quietly() noexcept {
        try {
            wait();
        } catch (...) {
        }
    }

    std::shared_ptr<detail::gloo_task> task_;
    detail::gloo_state* state_ = nullptr; ///< the communicator's, which outlives the request
    int rank_ = -1;
    std::chrono::milliseconds timeout_{0};
    bool send_ = false;
};

/// A communicator over Gloo's TCP transport. Models `communicator`.
class gloo_communicator {
public:
    using request_type = gloo_request;

    /// Collective over the store's ranks: connects every pair of them with Gloo,
    /// exchanging addresses through `store` (which must outlive nothing: the
    /// communicator shares it, and its splits use it too). `options.timeout` bounds
    /// every wait, the connecting included.
    explicit gloo_communicator(
        std::shared_ptr<tcp_store> store, comm_options options = comm_options::from_env(),
        gloo_transport_options transport = gloo_transport_options::from_env()) {
        if (!store) {
            throw argument_error(-1, "gloo_communicator", "no store (a null tcp_store)");
        }
        const int rank = store->rank(), size = store->size();
        gloo_check_options(options, rank, "gloo_communicator");
        // One name per communicator made on this store, agreed through it.
        const std::int64_t id = rank == 0 ? store->add("gloo/communicators", 1) : 0;
        const auto agreed = store->broadcast("gloo_communicator", std::as_bytes(std::span(&id, 1)));
        std::int64_t name = 0;
        std::memcpy(&name, agreed.data(), sizeof name);
        state_ = std::make_unique<detail::gloo_state>(store, make_device(*store, transport, rank),
                                                      "gloo/" + std::to_string(name) + "/", rank,
                                                      size, options);
        log_made("made");
    }

    /// Meets the other ranks through a tcp_store from the environment (RANK,
    /// WORLD_SIZE, MASTER_ADDR, MASTER_PORT; store_options::from_env), with its
    /// timeout from `options`.
    static gloo_communicator from_env(comm_options options = comm_options::from_env()) {
        store_options so = store_options::from_env();
        so.timeout = options.timeout;
        return gloo_communicator(std::make_shared<tcp_store>(so), options);
    }

    gloo_communicator(gloo_communicator&&) noexcept = default;
    gloo_communicator& operator=(gloo_communicator&&) noexcept = default;

    int rank() const noexcept { return state_->rank; }
    int size() const noexcept { return state_->size; }
    const comm_options& options() const noexcept { return state_->options; }
    /// The Gloo context this communicator runs on (for calling Gloo directly, outside
    /// unison's ordering and checks).
    std::shared_ptr<::gloo::Context> native_handle() const noexcept { return state_->context; }
    /// The store the ranks met through.
    const std::shared_ptr<tcp_store>& store() const noexcept { return state_->store; }

    /// Runs `call` to completion: on this thread when no call is queued (no
    /// hand-over to the worker), else behind the queued ones.
    void execute(const collective_call& call) {
        if (call.op == operation::send || call.op == operation::recv) {
            submit(call).wait();
            return;
        }
        std::shared_ptr<detail::gloo_task> t = make_task(call);
        if (!state_->run_inline(*t)) {
            state_->enqueue(t);
        }
        gloo_request(std::move(t), state_.get(), rank(), options().timeout, false).wait();
    }

    /// Starts `call`: a collective is queued for the worker thread; a send or recv is
    /// posted to Gloo at once.
    gloo_request submit(const collective_call& call) {
        detail::gloo_state& s = *state_;
        std::shared_ptr<detail::gloo_task> t = make_task(call);
        if (t->call.op == operation::send || t->call.op == operation::recv) {
            const bool send = t->call.op == operation::send;
            post(*t);
            return {std::move(t), &s, s.rank, s.options.timeout, send};
        }
        s.enqueue(t);
        return {std::move(t), &s, s.rank, s.options.timeout, false};
    }

    /// Collective: ranks with the same `color` (>= 0) form a new communicator, ordered
    /// by `key` and then by their rank here, connected afresh through the store.
    gloo_communicator split(int color, int key) {
        detail::gloo_state& s = *state_;
        if (color < 0) {
            throw argument_error(s.rank, "split",
                                 "color " + std::to_string(color) +
                                     " is negative; every rank needs a group");
        }
        const std::int64_t mine[2] = {color, key};
        std::vector<std::int64_t> all(2 * static_cast<std::size_t>(s.size));
        execute(collective_call{operation::all_gather, mine, all.data(), 2, {}, dtype::i64});
        std::vector<std::pair<std::int64_t, int>> members; // (key, rank) of my color
        for (int q = 0; q < s.size; ++q) {
            if (all[2 * static_cast<std::size_t>(q)] == color) {
                members.emplace_back(all[2 * static_cast<std::size_t>(q) + 1], q);
            }
        }
        std::sort(members.begin(), members.end());
        int sub_rank = 0;
        while (members[static_cast<std::size_t>(sub_rank)].second != s.rank) {
            ++sub_rank;
        }
        const std::string prefix = s.prefix + "split" + std::to_string(s.splits++) + "/color" +
                                   std::to_string(color) + "/";
        std::vector<int> store_ranks;
        for (const auto& m : members) {
            store_ranks.push_back(s.store_ranks[static_cast<std::size_t>(m.second)]);
        }
        gloo_communicator made(std::make_unique<detail::gloo_state>(
            s.store, s.device, prefix, sub_rank, static_cast<int>(members.size()), s.options,
            std::move(store_ranks)));
        made.log_made("split from rank " + std::to_string(s.rank) + " by color " +
                      std::to_string(color));
        return made;
    }

private:
    explicit gloo_communicator(std::unique_ptr<detail::gloo_state> s) : state_(std::move(s)) {}

    /// The task of `call`, checked, numbered and on the timeline.
    std::shared_ptr<detail::gloo_task> make_task(const collective_call& call) {
        detail::gloo_state& s = *state_;
        {
            std::lock_guard lock(s.mutex);
            if (!s.poisoned.empty()) {
                throw error(s.rank, to_string(call.op),
                            "this communicator is unusable since " + s.poisoned +
                                "; a Gloo collective cannot be cancelled, so build a new "
                                "communicator or end the job");
            }
        }
        if (!call.location.is_host()) {
            throw argument_error(s.rank, to_string(call.op),
                                 "the Gloo backend moves host memory, and the data is on " +
                                     to_string(call.location));
        }
        auto t = std::make_shared<detail::gloo_task>();
        t->call = call;
        const bool p2p = call.op == operation::send || call.op == operation::recv;
        t->sequence = p2p ? s.p2p_sequence++ : s.sequence++;
        t->label = detail::operation_label(call.op, t->sequence);
        if (call.op == operation::all_gatherv) {
            t->counts.assign(call.counts.begin(), call.counts.end());
            t->call.counts = t->counts;
        }
        if (timeline::enabled()) {
            t->span.begin(s.rank, call, s.size, static_cast<std::int64_t>(t->sequence),
                          call.op == operation::all_reduce ? "native" : "");
        }
        return t;
    }

    /// Posts a send or recv to Gloo (slot: the call's tag).
    void post(detail::gloo_task& t) {
        detail::gloo_state& s = *state_;
        const collective_call& call = t.call;
        const std::size_t bytes = call.count * size_of(call.type);
        const std::uint64_t slot = detail::gloo_p2p_slot_of(call.tag, bytes, call.type);
        const bool send = call.op == operation::send;
        try {
            t.p2p = s.context->createUnboundBuffer(send ? const_cast<void*>(call.send) : call.recv,
                                                   bytes);
            if (send) {
                t.p2p->send(call.root, slot);
            } else {
                t.p2p->recv(call.root, slot);
            }
        } catch (const std::exception& e) { // gloo::Exception, or Gloo's own checks
            t.span.end("error");
            throw peer_error(s.rank, t.label,
                             "Gloo could not post it to rank " + std::to_string(call.root) + ": " +
                                 e.what(),
                             call.root);
        }
    }

    static std::shared_ptr<::gloo::transport::Device>
    make_device(const tcp_store& store, const gloo_transport_options& t, int rank) {
        ::gloo::transport::tcp::attr attr;
        if (!t.interface.empty()) {
            attr.iface = t.interface;
        } else if (!t.hostname.empty()) {
            attr.hostname = t.hostname;
        } else if (store.host() == "127.0.0.1" || store.host() == "localhost" ||
                   store.host() == "::1") {
            attr.hostname = "127.0.0.1";
        } else {
            char name[256] = {};
            ::gethostname(name, sizeof name - 1);
            attr.hostname = name;
        }
        try {
            return ::gloo::transport::tcp::CreateDevice(attr);
        } catch (const ::gloo::Exception& e) {
            throw argument_error(rank, "gloo_communicator",
                                 "Gloo cannot listen on " +
                                     (attr.iface.empty() ? "host '" + attr.hostname + "'"
                                                         : "interface '" + attr.iface + "'") +
                                     " (set GLOO_SOCKET_IFNAME to the interface the ranks "
                                     "reach each other on): " +
                                     e.what());
        }
    }

    /// UNISON_LOG=info: what this communicator is.
    void log_made(const std::string& how) const {
        log(log_level::info, rank(), [&] {
            return "gloo_communicator " + how + ": rank " + std::to_string(rank()) + " of " +
                   std::to_string(size()) + ", timeout " +
                   std::to_string(options().timeout.count()) + " ms";
        });
    }

    std::unique_ptr<detail::gloo_state> state_;
};

static_assert(request<gloo_request>);
static_assert(communicator<gloo_communicator>);

} // namespace unison
