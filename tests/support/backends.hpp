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
