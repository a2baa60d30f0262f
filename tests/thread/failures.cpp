// Timeouts, failing and departing ranks, and mismatched collectives on the thread
// backend: each must end in an error that names the rank and the operation, and
// no rank may stay blocked.

#include "../support/skipped_call.hpp"

#include <unison/thread.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <vector>

using namespace std::chrono_literals;

namespace {

unison::comm_options short_timeout(std::chrono::milliseconds t = 300ms) {
    unison::comm_options o;
    o.timeout = t;
    return o;
}

/// Runs `fn` on a world and returns what run() threw.
template <class Fn>
std::string run_and_catch(int ranks, unison::comm_options o, Fn fn) {
    try {
        unison::thread_world(ranks, o).run(fn);
    } catch (const std::exception& e) {
        return e.what();
    }
    return "no error";
}

} // namespace

TEST_CASE("thread: a rank that skips a collective makes its peers time out, naming it") {
    std::atomic<int> timeouts{0}, peers{0};
    const auto start = std::chrono::steady_clock::now();
    const std::string what =
        run_and_catch(3, short_timeout(), [&](unison::thread_communicator& comm) {
            std::vector<float> x(100, 1.0f);
            unison::all_reduce(comm, x); // #0: everyone
            if (comm.rank() == 2) {
                // rank 2 is slow: it never joins #1 before the others give up
                std::this_thread::sleep_for(1500ms);
                return;
            }
            try {
                unison::all_reduce(comm, x); // #1
            } catch (const unison::timeout_error& e) {
                ++timeouts;
                CHECK(e.sequence() == 1);
                CHECK(std::string(e.what()).find("all_reduce #1") != std::string::npos);
                CHECK(std::string(e.what()).find("waiting for rank(s) 2") != std::string::npos);
                throw;
            } catch (const unison::peer_error&) {
                ++peers; // the other waiting rank learns of the first timeout
                throw;
            }
        });
    const auto elapsed = std::chrono::steady_clock::now() - start;
    CHECK(timeouts + peers == 2);
    CHECK(timeouts >= 1);
    CHECK(what.find("timed out") != std::string::npos);
    CHECK(elapsed < 5s); // bounded by the timeout, not by the slow rank
}

TEST_CASE("thread: a rank that throws wakes its blocked peers with peer_error") {
    std::atomic<int> woken{0};
    const auto start = std::chrono::steady_clock::now();
    const std::string what =
        run_and_catch(4, short_timeout(30s), [&](unison::thread_communicator& comm) {
            std::vector<double> x(1000, 1.0);
            unison::all_reduce(comm, x);
            if (comm.rank() == 1) {
                throw std::runtime_error("rank 1 ran out of memory");
            }
            try {
                unison::all_reduce(comm, x);
            } catch (const unison::peer_error& e) {
                ++woken;
                CHECK(e.peer() == 1);
                CHECK(std::string(e.what()).find("ran out of memory") != std::string::npos);
                throw;
            }
        });
    CHECK(woken == 3);
    CHECK(what == "rank 1 ran out of memory");             // run() rethrows the cause
    CHECK(std::chrono::steady_clock::now() - start < 10s); // far below the 30 s timeout
}

TEST_CASE("thread: a rank that returns early fails the peers waiting for it") {
    std::atomic<int> woken{0};
    const std::string what =
        run_and_catch(3, short_timeout(30s), [&](unison::thread_communicator& comm) {
            std::vector<float> x(10, 1.0f);
            if (comm.rank() == 0) {
                return; // never calls the collective
            }
            try {
                unison::all_reduce(comm, x);
            } catch (const unison::peer_error& e) {
                ++woken;
                CHECK(e.peer() == 0);
                CHECK(std::string(e.what()).find("returned without calling") != std::string::npos);
                throw;
            }
        });
    CHECK(woken == 2);
    CHECK(what.find("rank 0 returned without calling") != std::string::npos);
}

TEST_CASE("thread: mismatched collectives throw mismatch_error naming both ranks and the field") {
    struct expectation {
        const char* field;
        std::function<void(unison::thread_communicator&)> call;
    };
    const std::vector<expectation> cases = {
        {"count",
         [](auto& comm) {
             std::vector<float> x(comm.rank() == 2 ? 50 : 100, 1.0f);
             unison::all_reduce(comm, x);
         }},
        {"dtype",
         [](auto& comm) {
             if (comm.rank() == 2) {
                 std::vector<double> x(100, 1.0);
                 unison::all_reduce(comm, x);
             } else {
                 std::vector<float> x(100, 1.0f);
                 unison::all_reduce(comm, x);
             }
         }},
        {"op",
         [](auto& comm) {
             std::vector<float> x(100, 1.0f);
             unison::all_reduce(comm, x,
                                comm.rank() == 2 ? unison::reduce_op::max : unison::reduce_op::sum);
         }},
        {"root",
         [](auto& comm) {
             std::vector<float> x(100, 1.0f);
             unison::broadcast(comm, x, comm.rank() == 2 ? 1 : 0);
         }},
        {"operation",
         [](auto& comm) {
             std::vector<float> x(99, 1.0f), y(297);
             if (comm.rank() == 2) {
                 unison::all_gather(comm, x, y); // skipped the all_reduce
             } else {
                 unison::all_reduce(comm, x);
             }
         }},
    };
    for (const auto& c : cases) {
        CAPTURE(c.field);
        std::atomic<int> caught{0};
        std::vector<float> before(64), after(64);
        unison::thread_world(3, short_timeout(5s)).run([&](unison::thread_communicator& comm) {
            try {
                c.call(comm);
            } catch (const unison::mismatch_error& e) {
                ++caught;
                CHECK(e.field() == c.field);
                CHECK(e.other_rank() == 2);
                CHECK(std::string(e.what()).find("rank 0") != std::string::npos);
                CHECK(std::string(e.what()).find("rank 2") != std::string::npos);
            }
            // the communicator is still in step and usable afterwards
            std::vector<float> y(7, float(comm.rank()));
            unison::all_reduce(comm, y);
            CHECK(y[6] == 3.0f);
        });
        CHECK(caught == 3);
    }
}

TEST_CASE("thread: mismatched send and recv sizes are reported on both sides") {
    std::atomic<int> caught{0};
    unison::thread_world(2, short_timeout(5s)).run([&](unison::thread_communicator& comm) {
        std::vector<float> x(comm.rank() == 0 ? 8 : 6, 1.0f);
        try {
            if (comm.rank() == 0) {
                unison::send(comm, x, 1);
            } else {
                unison::recv(comm, x, 0);
            }
        } catch (const unison::mismatch_error& e) {
            ++caught;
            CHECK(std::string(e.what()).find("8 float elements") != std::string::npos);
        }
    });
    CHECK(caught == 2);
}

TEST_CASE("thread: a recv with no sender times out") {
    const std::string what =
        run_and_catch(2, short_timeout(200ms), [](unison::thread_communicator& comm) {
            std::vector<float> x(4);
            if (comm.rank() == 1) {
                unison::recv(comm, x, 0, 7);
            } else {
                std::this_thread::sleep_for(600ms); // alive, but never sends
            }
        });
    CHECK(what.find("recv #0 (peer 0, tag 7)") != std::string::npos);
    CHECK(what.find("nothing sent within") != std::string::npos);
}

TEST_CASE("thread: a rank that skips a call in a stepped loop is caught at its next call") {
    for (int ranks : {2, 3, 4}) {
        CAPTURE(ranks);
        unison::thread_world(ranks, short_timeout(10s)).run([](unison::thread_communicator& comm) {
            unison::test::skipped_call_is_caught_at_once(comm);
            unison::test::skipped_call_is_caught_at_once(comm,
                                                         unison::test::stamped_by::call_stamp);
            unison::test::tag_mismatch_is_caught(comm);
        });
    }
}
