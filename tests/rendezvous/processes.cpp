// The TCP store between real processes, started as torchrun or Kubernetes start them:
// each with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT in its environment and
// nothing else shared. Rank 0 hosts the store on MASTER_PORT; the ranks gather their
// process ids; and when one rank never starts, every rank that did fails within its
// timeout with an error naming the missing rank.

#include "support/processes.hpp"
#include "support/environment.hpp"

#include <unison/rendezvous.hpp>

#include <doctest/doctest.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

namespace {

using clock_type = std::chrono::steady_clock;

using unison::test::unused_port;

using outcome = unison::test::process_outcome;

/// In a child: meet as `rank` of `size`, gather process ids, check them, and write
/// "ok" or the error to `out`; exits 0, or 3 on a unison error (4 on a peer_error,
/// whose report ends with how long the last barrier took). Rank `killed` kills
/// itself (SIGKILL) before that barrier.
[[noreturn]] void run_rank(int rank, int size, std::uint16_t port, const char* timeout, int out,
                           int killed) {
    unison::test::set_torchrun_env(rank, size, port, timeout);
    std::string report;
    int code = 0;
    try {
        unison::tcp_store store = unison::tcp_store::from_env();
        const pid_t me = ::getpid();
        const auto pids = store.all_gather("pids", std::as_bytes(std::span(&me, 1)));
        report = "ok";
        for (int r = 0; r < size; ++r) {
            pid_t p = 0;
            std::memcpy(&p, pids[static_cast<std::size_t>(r)].data(), sizeof p);
            if (pids[static_cast<std::size_t>(r)].size() != sizeof p || (r == rank) != (p == me)) {
                report = "wrong pid from rank " + std::to_string(r);
            }
        }
        const unison::launch_info info = unison::store_launch(store);
        if (info.local_rank != rank || info.local_size != size) {
            report = "local rank " + std::to_string(info.local_rank) + " of " +
                     std::to_string(info.local_size);
        }
        if (rank == killed) {
            ::raise(SIGKILL);
        }
        const auto start = clock_type::now();
        try {
            store.barrier("done");
        } catch (const unison::peer_error& e) {
            const auto ms =
                std::chrono::duration_cast<std::chrono::milliseconds>(clock_type::now() - start)
                    .count();
            report = std::string(e.what()) + " [after " + std::to_string(ms) + " ms]";
            code = 4;
        }
    } catch (const unison::error& e) {
        report = e.what();
        code = 3;
    }
    (void)!::write(out, report.data(), report.size());
    ::_exit(code);
}

/// Starts the ranks in `ranks` of a job of `size` on `port` and waits (at most
/// 60 s) for each to end.
std::vector<outcome> start_job(const std::vector<int>& ranks, int size, std::uint16_t port,
                               const char* timeout, int killed) {
    return unison::test::run_processes(
        ranks, [&](int rank, int fd) { run_rank(rank, size, port, timeout, fd, killed); });
}

/// start_job, again on another port if rank 0 found its port taken in the moment
/// between unused_port() and its bind.
std::vector<outcome> start_job_retrying(const std::vector<int>& ranks, int size,
                                        const char* timeout, int killed = -1) {
    for (int attempt = 0;; ++attempt) {
        auto out = start_job(ranks, size, unused_port(), timeout, killed);
        if (attempt == 2 || out[0].report.find("cannot host the store") == std::string::npos) {
            return out;
        }
    }
}

} // namespace

TEST_CASE("tcp_store: processes started with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT "
          "meet") {
    for (const int size : {1, 2, 4}) {
        CAPTURE(size);
        std::vector<int> ranks;
        for (int r = 0; r < size; ++r) {
            ranks.push_back(r);
        }
        const auto out = start_job_retrying(ranks, size, "20");
        for (int r = 0; r < size; ++r) {
            CAPTURE(r);
            CHECK(out[static_cast<std::size_t>(r)].report == "ok");
            CHECK(out[static_cast<std::size_t>(r)].exit_code == 0);
        }
    }
}

TEST_CASE("tcp_store: when one process never starts, the others name it within their timeout") {
    const auto start = clock_type::now();
    // Rank 2 of 3 is never started; rank 0 hosts, rank 1 joins.
    const auto out = start_job_retrying({0, 1}, 3, "1");
    const auto took = clock_type::now() - start;
    for (std::size_t i = 0; i < out.size(); ++i) {
        CAPTURE(i);
        CAPTURE(out[i].report);
        CHECK(out[i].exit_code == 3);
        CHECK(out[i].report.find("rank 2 of 3") != std::string::npos);
        CHECK(out[i].report.find("never connected") != std::string::npos);
    }
    CHECK(took < std::chrono::seconds(20));
}

TEST_CASE("tcp_store: a process killed before a collective is named by the others at once") {
    // Rank 2 of 3 dies by SIGKILL before the last barrier; the kernel closes its
    // connection, the store sees it, and the others' barrier ends with a peer_error
    // naming rank 2 within a second, not at the 20 s timeout.
    const auto out = start_job_retrying({0, 1, 2}, 3, "20", 2);
    CHECK(out[2].exit_code == -1); // killed: no exit status
    for (std::size_t i = 0; i < 2; ++i) {
        CAPTURE(i);
        CAPTURE(out[i].report);
        CHECK(out[i].exit_code == 4);
        CHECK(out[i].report.find("barrier 'done'") != std::string::npos);
        CHECK(out[i].report.find("rank 2 of 3 left before making this call") != std::string::npos);
        const std::size_t at = out[i].report.find("[after ");
        REQUIRE(at != std::string::npos);
        CHECK(std::stol(out[i].report.substr(at + 7)) < 1000);
    }
}
