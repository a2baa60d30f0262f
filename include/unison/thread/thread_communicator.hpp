#pragma once

/// \file
/// The thread backend: N ranks as threads of one process. Collectives work on
/// shared memory: ranks publish their buffers, then each rank reduces (or copies)
/// its own share straight between the peers' buffers -- no central copy and no
/// allocation per call.

#include "unison/comm/algorithm.hpp"
#include "unison/comm/collective.hpp"
#include "unison/comm/communicator.hpp"
#include "unison/comm/options.hpp"
#include "unison/core/detail/clock.hpp"
#include "unison/core/error.hpp"
#include "unison/core/tensor.hpp"
#include "unison/thread/detail/device_mover.hpp"
#include "unison/thread/detail/progress_engine.hpp"
#include "unison/thread/detail/rank_state.hpp"
#include "unison/thread/detail/thread_group.hpp"

#include <atomic>
#include <chrono>
#include <cstddef>
#include <exception>
#include <memory>
#include <string>
#include <utility>

namespace unison {

class thread_communicator;

/// A pending operation of the thread backend (see the `request` concept).
class [[nodiscard]] thread_request {
public:
    thread_request() = default;
    thread_request(thread_request&& other) noexcept
        : record_(std::exchange(other.record_, nullptr)), state_(other.state_) {}
    thread_request& operator=(thread_request&& other) noexcept {
        if (this != &other) {
            finish_quietly();
            record_ = std::exchange(other.record_, nullptr);
            state_ = other.state_;
        }
        return *this;
    }
    thread_request(const thread_request&) = delete;
    thread_request& operator=(const thread_request&) = delete;
    /// Waits for an operation still in flight (errors are dropped; call wait() to see them).
    ~thread_request() { finish_quietly(); }

    /// Blocks until the operation completes, then rethrows its error, if any.
    void wait();
    /// True once the operation has completed (wait() then returns at once).
    bool test() const noexcept {
        return record_ == nullptr || record_->done.load(std::memory_order_acquire);
    }

private:
    friend class thread_communicator;
    thread_request(detail::op_record* r, detail::thread_rank_state* s) noexcept
        : record_(r), state_(s) {}
    void finish_quietly() noexcept {
        if (record_ != nullptr) {
            try {
                wait();
            } catch (...) {
            }
        }
    }

    detail::op_record* record_ = nullptr;
    detail::thread_rank_state* state_ = nullptr;
};

/// One rank of a thread world (see `thread_world`). Models `communicator`.
class thread_communicator {
public:
    using request_type = thread_request;

    /// This rank's index in [0, size()).
    int rank() const noexcept { return state_->rank; }
    /// Number of ranks.
    int size() const noexcept { return state_->group->size; }
    /// Timeout and checking behaviour.
    const comm_options& options() const noexcept { return state_->options; }
    /// The algorithm that carries an all_reduce, reduce or reduce_scatter of `bytes`:
    /// rank_ordered at every size (thread/tuning.hpp), the same query as
    /// mpi_communicator's.
    algorithm all_reduce_algorithm(std::size_t /*bytes*/) const noexcept {
        return algorithm::rank_ordered;
    }
    /// As all_reduce_algorithm: rank_ordered.
    algorithm reduce_scatter_algorithm(std::size_t /*bytes*/) const noexcept {
        return algorithm::rank_ordered;
    }

    /// Runs `call` to completion (after any earlier non-blocking calls of this rank).
    void execute(const collective_call& call) {
        state_->engine.drain();
        if (!timeline::enabled()) {
            state_->run(call);
            return;
        }
        detail::collective_span span;
        span.begin(rank(), call, size(), -1, algorithm_of(call));
        try {
            state_->run(call, &span);
        } catch (...) {
            span.end("error");
            throw;
        }
        span.end();
    }

    /// Starts `call`; it runs on this rank's progress thread, in issue order.
    thread_request submit(const collective_call& call) {
        detail::op_record* r = state_->engine.acquire(call);
        r->span.begin(rank(), call, size(), -1, algorithm_of(call));
        if (call.op == operation::send) {
            if (!call.location.is_host()) {
                state_->engine.release(r);
                throw argument_error(rank(), "send",
                                     "the thread backend's send and recv take host memory, and "
                                     "the data is on " +
                                         to_string(call.location));
            }
            state_->p2p.post_send(r);
        } else {
            state_->engine.enqueue(r);
        }
        return {r, state_.get()};
    }

    /// Collective: ranks with equal `color` (>= 0) form a new communicator, ordered
    /// by `key`, then by rank here.
    thread_communicator split(int color, int key) {
        state_->engine.drain();
        int new_rank = 0;
        auto g = state_->split(color, key, new_rank);
        thread_communicator sub(std::move(g), new_rank, state_->options);
        if (state_->mover) {
            sub.install_device(state_->mover->clone());
        }
        return sub;
    }

    /// Device memory: installs the mover that moves it (unison::cuda::use_device
    /// does). Not while operations of this rank are in flight.
    void install_device(std::unique_ptr<detail::device_mover> m) {
        state_->engine.drain();
        state_->mover = std::move(m);
    }
    /// The former name of install_device.
    [[deprecated("thread_communicator::attach_device is now install_device")]] void
    attach_device(std::unique_ptr<detail::device_mover> m) {
        install_device(std::move(m));
    }
    /// Moves host memory always, device memory once attached (device_communicator).
    static constexpr bool moves_host_memory = true;
    /// Reduces host tensors in place between the ranks' own memory
    /// (all_reduce_coalesced).
    static constexpr bool reduces_coalesced = true;
    /// The CUDA stream (a cudaStream_t) this rank's device collectives run on, or
    /// null when no device is attached.
    void* device_stream() const noexcept {
        return state_->mover ? state_->mover->stream() : nullptr;
    }
    /// The attached CUDA device, or host when none is attached.
    device device_location() const noexcept {
        return state_->mover ? device::cuda(state_->mover->device()) : device::host();
    }

    /// Used by thread_world; users get communicators from thread_world::run.
    thread_communicator(std::shared_ptr<detail::thread_group> group, int rank, comm_options o)
        : state_(std::make_unique<detail::thread_rank_state>(std::move(group), rank, o)) {
        log(log_level::info, rank, [&] {
            return "thread_communicator made: rank " + std::to_string(rank) + " of " +
                   std::to_string(size()) + ", all-reduce algorithm rank_ordered, timeout " +
                   std::to_string(o.timeout.count()) + " ms" +
                   (o.deterministic ? ", deterministic" : "");
        });
    }

private:
    /// The timeline's algorithm field: rank_ordered for the reductions, else none.
    static std::string_view algorithm_of(const collective_call& call) noexcept {
        return call.op == operation::all_reduce || call.op == operation::reduce_scatter ||
                       call.op == operation::reduce
                   ? to_string(algorithm::rank_ordered)
                   : std::string_view();
    }

    std::unique_ptr<detail::thread_rank_state> state_;
};

inline void thread_request::wait() {
    if (record_ == nullptr) {
        return;
    }
    detail::op_record* r = std::exchange(record_, nullptr);
    if (r->call.op == operation::send) {
        state_->p2p.finish_send(state_->engine, r, state_->p2p.next_label(r->call));
        return;
    }
    // The call's own waits are bounded by the timeout, so this wait is too.
    while (!state_->engine.wait(r, detail::clock::now() + std::chrono::seconds(1))) {
    }
    std::exception_ptr e = r->error;
    state_->engine.release(r);
    if (e) {
        std::rethrow_exception(e);
    }
}

static_assert(request<thread_request>);
static_assert(device_communicator<thread_communicator>);

} // namespace unison
