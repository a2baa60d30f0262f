#pragma once

/// \file
/// The contracts every backend models. A backend is a type, chosen at compile time;
/// code written against `communicator` runs on threads, MPI or NCCL unchanged.

#include "unison/comm/collective.hpp"
#include "unison/comm/options.hpp"

#include <concepts>
#include <exception>
#include <span>

namespace unison {

/// A pending non-blocking operation: move-only; `wait()` blocks until it completes
/// (bounded by the communicator's timeout, then `timeout_error`) and rethrows any
/// error; `test()` reports completion without blocking (on MPI it also drives
/// progress, so call it while overlapping). A request must be waited on (or
/// destroyed, which waits) before its buffers are reused or freed, and must not
/// outlive its communicator.
template <class R>
concept request = std::movable<R> && !std::copyable<R> && requires(R & r) {
    r.wait();
    { r.test() } -> std::same_as<bool>;
};

/// A group of ranks that can run collectives.
///
/// `execute(call)` runs `call` to completion; `submit(call)` starts it and returns a
/// request. Calls complete in the order they were issued on each rank. `split`
/// is itself collective: every rank calls it, ranks with the same `color` (>= 0)
/// form a new communicator, ordered by `key` and then by their rank here.
///
/// Users call the free functions of collectives.hpp (`unison::all_reduce(comm, x)`),
/// which validate their tensors and build the `collective_call`.
template <class C>
concept communicator = std::movable<C> && requires(C& c, const C& cc, const collective_call& call) {
    typename C::request_type;
    requires request<typename C::request_type>;
    { cc.rank() } -> std::same_as<int>;
    { cc.size() } -> std::same_as<int>;
    { cc.options() } -> std::convertible_to<const comm_options&>;
    c.execute(call);
    { c.submit(call) } -> std::same_as<typename C::request_type>;
    { c.split(0, 0) } -> std::same_as<C>;
};

/// A communicator that moves device memory: `device_stream()` is the stream its
/// device collectives run on (a cudaStream_t; null while it has none, as for a
/// thread_communicator not attached to a GPU) and `device_location()` the device
/// its data must be on (host while it has none). `moves_host_memory` says whether
/// it moves host memory too (the thread backend does, NCCL does not). The training
/// layer orders a device communicator's stream after the compute stream before each
/// of its collectives.
template <class C>
concept device_communicator = communicator<C> && requires(const C& c) {
    { c.device_stream() } -> std::same_as<void*>;
    { c.device_location() } -> std::same_as<device>;
    { C::moves_host_memory } -> std::convertible_to<bool>;
};

/// Whether communicator `C` moves host memory: every backend but NCCL.
template <class C>
inline constexpr bool moves_host_memory = true;
template <device_communicator C>
inline constexpr bool moves_host_memory<C> = C::moves_host_memory;

/// Whether communicator `C` reduces several host tensors in place as one buffer,
/// straight between them (all_reduce_coalesced): no staging copy in and out. A
/// backend says so with `static constexpr bool reduces_coalesced = true` (the thread
/// backend, whose ranks read each other's memory, and the MPI backend, whose ring
/// sends from and receives into the tensors); the others (NCCL) do not.
template <class C>
inline constexpr bool reduces_coalesced = false;
template <class C>
requires requires {
    C::reduces_coalesced;
}
inline constexpr bool reduces_coalesced<C> = C::reduces_coalesced;

/// Waits for every request in `requests`, in order; the first error is rethrown
/// after all the others have been waited on, so no operation is left in flight.
template <request R>
void wait_all(std::span<R> requests) {
    std::exception_ptr first;
    for (R& r : requests) {
        try {
            r.wait();
        } catch (...) {
            if (!first) {
                first = std::current_exception();
            }
        }
    }
    if (first) {
        std::rethrow_exception(first);
    }
}

/// True when every request in `requests` has completed (drives progress on each).
template <request R>
bool test_all(std::span<R> requests) {
    bool all = true;
    for (R& r : requests) {
        all = r.test() && all;
    }
    return all;
}

} // namespace unison
