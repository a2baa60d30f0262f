// The Gloo backend between real processes, started as torchrun starts them (RANK,
// WORLD_SIZE, MASTER_ADDR, MASTER_PORT and nothing else shared), one of them killed
// with SIGKILL in the middle of a stream of 16 MiB all-reduces: every survivor must
// get a peer_error naming the killed rank within a second of its death, not at the
// 20 s timeout, and exit. The rank that hosts the store is killed too: then the
// store goes with it, and the survivors name it all the same.

#include "../support/processes.hpp"
#include "../support/environment.hpp"

#include <unison/gloo.hpp>

#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include <signal.h>
#include <unistd.h>

namespace {

using clock_type = std::chrono::steady_clock;

std::int64_t now_ms() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               clock_type::now().time_since_epoch())
        .count();
}

/// In a child: joins the job as `rank` of `size`, checks one all-reduce, then
/// all-reduces 16 MiB over and over. Rank `killed` kills itself 40 ms into that
/// stream, writing "killed at <ms>" first (steady clock, shared by the processes of
/// one machine). A survivor writes "peer <p> at <ms>: <what>" and exits 4 on a
/// peer_error, 3 on another unison error, 5 if the stream ends without one.
[[noreturn]] void run_rank(int rank, int size, std::uint16_t port, int out, int killed) {
    unison::test::set_torchrun_env(rank, size, port, "20");
    std::string report;
    int code = 5;
    try {
        unison::gloo_communicator comm = unison::gloo_communicator::from_env();
        std::vector<float> x(std::size_t{1} << 22, static_cast<float>(rank + 1));
        unison::all_reduce(comm, std::span(x));
        const float want = static_cast<float>(size * (size + 1) / 2);
        if (x.front() != want || x.back() != want) {
            report = "wrong sum " + std::to_string(x.front());
            (void)!::write(out, report.data(), report.size());
            ::_exit(6);
        }
        if (rank == killed) {
            std::thread([out] {
                std::this_thread::sleep_for(std::chrono::milliseconds(40));
                const std::string said = "killed at " + std::to_string(now_ms());
                (void)!::write(out, said.data(), said.size());
                ::raise(SIGKILL);
            }).detach();
        }
        try { // the time is read here, before the communicator's destructor runs
            for (int i = 0; i < 2000; ++i) {
                unison::all_reduce(comm, std::span(x), unison::reduce_op::avg);
            }
            report = "no error";
        } catch (const unison::peer_error& e) {
            report = "peer " + std::to_string(e.peer()) + " at " + std::to_string(now_ms()) + ": " +
                     e.what();
            code = 4;
        }
    } catch (const unison::error& e) {
        report = e.what();
        code = 3;
    }
    (void)!::write(out, report.data(), report.size());
    ::_exit(code);
}

/// Starts the `size` ranks of a job on `port` and waits (at most 60 s) for each to end.
std::vector<unison::test::process_outcome> start_job(int size, std::uint16_t port, int killed) {
    std::vector<int> ranks;
    for (int r = 0; r < size; ++r) {
        ranks.push_back(r);
    }
    return unison::test::run_processes(
        ranks, [&](int rank, int fd) { run_rank(rank, size, port, fd, killed); });
}

/// The number after `word` in `s` (-1 when absent).
std::int64_t number_after(const std::string& s, const std::string& word) {
    const std::size_t at = s.find(word);
    return at == std::string::npos ? -1 : std::stoll(s.substr(at + word.size()));
}

} // namespace

TEST_CASE("gloo: a process killed mid-collective is named by every survivor within a second") {
    for (const int killed : {2, 0}) { // rank 0 hosts the store: it goes too
        CAPTURE(killed);
        const int size = 3;
        std::vector<unison::test::process_outcome> out;
        for (int attempt = 0; attempt < 3; ++attempt) { // the port may be taken meanwhile
            out = start_job(size, unison::test::unused_port(), killed);
            if (out[0].report.find("cannot host the store") == std::string::npos) {
                break;
            }
        }
        const std::string& dead = out[static_cast<std::size_t>(killed)].report;
        CAPTURE(dead);
        REQUIRE(out[static_cast<std::size_t>(killed)].exit_code == -1);
        const std::int64_t died = number_after(dead, "killed at ");
        REQUIRE(died > 0);
        for (int r = 0; r < size; ++r) {
            if (r == killed) {
                continue;
            }
            const unison::test::process_outcome& o = out[static_cast<std::size_t>(r)];
            CAPTURE(r);
            CAPTURE(o.report);
            CHECK(o.exit_code == 4);
            CHECK(number_after(o.report, "peer ") == killed);
            CHECK(o.report.find("rank " + std::to_string(killed)) != std::string::npos);
            const std::int64_t named = number_after(o.report, " at ");
            CHECK(named - died < 1000);
        }
    }
}
