// Mismatch detection and timeouts on the MPI backend. Open MPI 4.1 returns success
// with wrong data for a count, dtype or op mismatch in MPI_Allreduce, and hangs on a
// skipped collective; with check_matching both become errors here.

#include <unison/mpi.hpp>

#include <doctest/doctest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

using namespace std::chrono_literals;

namespace {

unison::mpi_communicator checked_world(std::chrono::milliseconds timeout = 10s) {
    unison::comm_options o;
    o.timeout = timeout;
    o.check_matching = true;
    return unison::mpi_communicator(MPI_COMM_WORLD, o);
}

} // namespace

TEST_CASE("mpi: check_matching reports count, dtype, op and root mismatches before data moves") {
    auto comm = checked_world();
    const int last = comm.size() - 1;
    const bool odd_one = comm.rank() == last;
    auto expect = [&](const char* field, auto&& call) {
        CAPTURE(field);
        bool caught = false;
        try {
            call();
        } catch (const unison::mismatch_error& e) {
            caught = true;
            CHECK(e.field() == field);
            CHECK(e.other_rank() == last);
            CHECK(e.rank() == comm.rank());
            CHECK(std::string(e.what()).find("rank " + std::to_string(last)) != std::string::npos);
        }
        CHECK(caught);
    };
    std::vector<float> x(odd_one ? 50 : 100, 1.0f), keep = x;
    expect("count", [&] { unison::all_reduce(comm, x); });
    CHECK(x == keep); // nothing moved
    std::vector<float> f(100, 1.0f);
    std::vector<double> d(100, 1.0);
    expect("dtype", [&] {
        if (odd_one) {
            unison::all_reduce(comm, d);
        } else {
            unison::all_reduce(comm, f);
        }
    });
    expect("op", [&] {
        unison::all_reduce(comm, f, odd_one ? unison::reduce_op::min : unison::reduce_op::sum);
    });
    expect("root", [&] { unison::broadcast(comm, f, odd_one ? 1 : 0); });
    std::vector<float> g(100 * static_cast<std::size_t>(comm.size()));
    expect("operation", [&] {
        if (odd_one) {
            unison::all_gather(comm, f, g);
        } else {
            unison::all_reduce(comm, f);
        }
    });
    // still usable and in step
    std::vector<float> y(3, 1.0f);
    unison::all_reduce(comm, y);
    CHECK(y[0] == float(comm.size()));
}

TEST_CASE("mpi: a slow rank makes the others time out with the operation and sequence") {
    std::vector<float> x(1000, 1.0f); // outlives comm: an abandoned call may still write it
    unison::comm_options o;
    o.timeout = 300ms;
    unison::mpi_communicator comm(MPI_COMM_WORLD, o);
    unison::all_reduce(comm, x); // #0
    if (comm.rank() == 0) {
        // The slow rank: joins #1 long after the others gave up, so that their
        // abandoned calls still complete and the job ends cleanly.
        std::this_thread::sleep_for(1500ms);
        unison::all_reduce(comm, x);
        MPI_Barrier(MPI_COMM_WORLD);
    } else {
        const auto start = std::chrono::steady_clock::now();
        bool timed_out = false;
        try {
            unison::all_reduce(comm, x);
        } catch (const unison::timeout_error& e) {
            timed_out = true;
            CHECK(e.sequence() == 1);
            CHECK(e.rank() == comm.rank());
            CHECK(std::string(e.what()).find("all_reduce #1") != std::string::npos);
        }
        CHECK(timed_out);
        CHECK(std::chrono::steady_clock::now() - start < 1200ms);
        // after a timeout the communicator refuses further work
        CHECK_THROWS_WITH_AS(unison::all_reduce(comm, x), doctest::Contains("unusable"),
                             unison::error);
        // MPI_Barrier progresses the abandoned all_reduce, which completes once the
        // slow rank joins it; then everything is quiet before comm is destroyed.
        MPI_Barrier(MPI_COMM_WORLD);
    }
}
