// A rank that dies or stalls in the middle of a DDP step: the other ranks' finish()
// must end in an error naming the rank and the operation, never hang.

#include <unison/ddp.hpp>
#include <unison/thread.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using namespace std::chrono_literals;

namespace {

unison::comm_options short_timeout() {
    unison::comm_options o;
    o.timeout = 300ms;
    return o;
}

/// Three gradients in three buckets; `body` runs one step on each rank.
template <class Fn>
std::string ddp_step_and_catch(Fn body) {
    try {
        unison::thread_world(3, short_timeout()).run([&](unison::thread_communicator& comm) {
            std::vector<float> a(5000, 1.0f), b(5000, 2.0f), c(5000, 3.0f);
            unison::bucketed_reducer<unison::thread_communicator> r(
                comm, {.bucket_bytes = 4096, .first_bucket_bytes = 4096});
            r.add(a, "a");
            r.add(b, "b");
            r.add(c, "c");
            r.start();
            body(comm, r);
        });
    } catch (const std::exception& e) {
        return e.what();
    }
    return "no error";
}

} // namespace

TEST_CASE("thread ddp: a rank that throws during backward fails its peers' finish()") {
    std::atomic<int> peer_errors{0};
    const auto start = std::chrono::steady_clock::now();
    const std::string what = ddp_step_and_catch([&](auto& comm, auto& r) {
        r.mark_ready(2); // launches the first bucket's all-reduce on every rank
        if (comm.rank() == 1) {
            throw std::runtime_error("out of memory in layer 1"); // dies mid-backward
        }
        try {
            r.mark_ready(1); // may already see the failure (mark_ready polls the requests)
            r.mark_ready(0);
            (void)r.finish();
        } catch (const unison::peer_error& e) {
            ++peer_errors;
            CHECK(e.peer() == 1);
            throw;
        } catch (const std::exception& e) {
            FAIL_CHECK("rank " << comm.rank() << " saw " << std::string(e.what()));
            throw;
        }
    });
    CHECK(what == "out of memory in layer 1"); // run() rethrows the cause
    CHECK(peer_errors == 2);
    CHECK(std::chrono::steady_clock::now() - start < 5s);
}

TEST_CASE("thread ddp: a stalled rank makes its peers' finish() time out, naming it") {
    std::atomic<int> timeouts{0};
    const std::string what = ddp_step_and_catch([&](auto& comm, auto& r) {
        r.mark_ready(2);
        r.mark_ready(1);
        if (comm.rank() == 2) {
            std::this_thread::sleep_for(1500ms); // never marks gradient 0
            return;
        }
        try {
            r.mark_ready(0);
            (void)r.finish();
        } catch (const unison::timeout_error& e) {
            ++timeouts;
            CHECK(std::string(e.what()).find("all_reduce") != std::string::npos);
            CHECK(std::string(e.what()).find("rank(s) 2") != std::string::npos);
            throw;
        } catch (const unison::peer_error&) {
            throw; // the second waiting rank may learn of the first timeout instead
        }
    });
    CHECK(timeouts >= 1);
    CHECK(what.find("rank(s) 2") != std::string::npos);
}
