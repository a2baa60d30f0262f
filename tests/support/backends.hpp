#pragma once

// The host backends' test fixtures. A fixture is a type with
//   `static void run(body)` -- calls `body(comm)` on every rank of every world the
//       backend is tested on;
//   `space` -- the memory space (memory_space.hpp) its collective cases use.
// The suites of tests/suites/ are TEST_CASE_TEMPLATEs over a fixture, and each
// backend's test file invokes them with its own; doctest appends the fixture's name
// to each test's name ("all_reduce<thread>"). The device fixtures are in
// tests/cuda/backends.hpp and backends.cuh.

#include "memory_space.hpp"

#include <unison/thread.hpp>

#if UNISON_HAS_MPI()
#include <unison/mpi.hpp>
#endif
#if UNISON_HAS_GLOO()
#include <unison/gloo.hpp>

#include <chrono>
#include <exception>
#include <memory>
#include <thread>
#include <vector>
#endif

#include <doctest/doctest.h>

#include <tuple>
#include <type_traits>

namespace unison::test {

namespace backend {

/// The thread backend: worlds of 1 to 4 ranks, one after another, on host memory.
struct thread {
    using space = host_space;

    template <class F>
    static void run(F&& body) {
        for (int ranks = 1; ranks <= 4; ++ranks) {
            CAPTURE(ranks);
            thread_world(ranks).run([&](thread_communicator& comm) { body(comm); });
        }
    }
};
static_assert(memory_space<thread::space, thread_communicator>);

#if UNISON_HAS_MPI()
/// The MPI backend: MPI_COMM_WORLD, at the size mpiexec started (CTest runs 2, 3
/// and 4 ranks), on host memory.
struct mpi {
    using space = host_space;

    template <class F>
    static void run(F&& body) {
        mpi_communicator comm(MPI_COMM_WORLD);
        body(comm);
    }
};
static_assert(memory_space<mpi::space, mpi_communicator>);
#endif

#if UNISON_HAS_GLOO()
/// Runs `body(comm)` on `ranks` Gloo communicators, one per thread of this process,
/// each over its own connection to a tcp_store served here and its own Gloo TCP
/// transport (loopback), as processes would be; rethrows the first rank's error.
template <class F>
void gloo_world(int ranks, F&& body, comm_options options = {}) {
    tcp_store_server server(0, ranks);
    std::vector<std::exception_ptr> errors(static_cast<std::size_t>(ranks));
    std::vector<std::thread> threads;
    for (int r = 0; r < ranks; ++r) {
        threads.emplace_back([&, r] {
            try {
                store_options so;
                so.port = server.port();
                so.rank = r;
                so.world_size = ranks;
                so.host_server = false;
                so.timeout = options.timeout;
                gloo_communicator comm(std::make_shared<tcp_store>(so), options);
                body(comm);
            } catch (...) {
                errors[static_cast<std::size_t>(r)] = std::current_exception();
            }
        });
    }
    for (auto& t : threads) {
        t.join();
    }
    for (auto& e : errors) {
        if (e) {
            std::rethrow_exception(e);
        }
    }
}

/// The Gloo backend: worlds of 1 to 4 ranks, one after another, each rank a thread
/// with its own store connection and TCP transport, on host memory.
struct gloo {
    using space = host_space;

    template <class F>
    static void run(F&& body) {
        comm_options o;
        o.timeout = std::chrono::seconds(60); // a failing case fails, not hangs
        for (int ranks = 1; ranks <= 4; ++ranks) {
            CAPTURE(ranks);
            gloo_world(ranks, body, o);
        }
    }
};
static_assert(memory_space<gloo::space, gloo_communicator>);
#endif

} // namespace backend

/// The fixtures a host-memory-only case is registered for: `Backend` when its
/// space is host memory, none otherwise (for TEST_CASE_TEMPLATE_APPLY).
template <class Backend>
using if_host_memory =
    std::conditional_t<Backend::space::on_host, std::tuple<Backend>, std::tuple<>>;

} // namespace unison::test

TYPE_TO_STRING_AS("thread", unison::test::backend::thread);
#if UNISON_HAS_MPI()
TYPE_TO_STRING_AS("mpi", unison::test::backend::mpi);
#endif
#if UNISON_HAS_GLOO()
TYPE_TO_STRING_AS("gloo", unison::test::backend::gloo);
#endif
