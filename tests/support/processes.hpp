#pragma once

// Test helpers for jobs of real processes, started as torchrun starts them: each
// child gets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT (and nothing else from
// a launcher), writes what it saw to a pipe and exits; the parent collects every
// child's report and exit status, killing any that outlives a deadline.

#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

namespace unison::test {

/// What one process wrote, and how it ended (-1: by a signal, or killed at the
/// deadline).
struct process_outcome {
    std::string report;
    int exit_code = -1;
};

/// In a child: the environment torchrun gives rank `rank` of `size`, with the store
/// on 127.0.0.1:`port` and UNISON_TIMEOUT `timeout` (seconds); the variables of
/// other launchers, which would be read first, removed.
inline void set_torchrun_env(int rank, int size, std::uint16_t port, const char* timeout) {
    for (const char* v :
         {"TORCHELASTIC_USE_AGENT_STORE", "UNISON_STORE_PORT", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
          "OMPI_COMM_WORLD_RANK", "SLURM_PROCID", "PMI_RANK", "MV2_COMM_WORLD_RANK"}) {
        ::unsetenv(v);
    }
    ::setenv("RANK", std::to_string(rank).c_str(), 1);
    ::setenv("WORLD_SIZE", std::to_string(size).c_str(), 1);
    ::setenv("MASTER_ADDR", "127.0.0.1", 1);
    ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
    ::setenv("UNISON_TIMEOUT", timeout, 1);
}

/// Forks one process per entry of `ranks`; each runs `child(rank, fd)`, which writes
/// its report to `fd` and must end with _exit. Waits (at most `deadline`) for each,
/// and returns their outcomes in the order of `ranks`.
inline std::vector<process_outcome>
run_processes(const std::vector<int>& ranks, const std::function<void(int rank, int fd)>& child,
              std::chrono::seconds deadline = std::chrono::seconds(60)) {
    std::vector<pid_t> children;
    std::vector<int> pipes;
    for (const int rank : ranks) {
        int p[2];
        REQUIRE(::pipe(p) == 0);
        const pid_t pid = ::fork();
        REQUIRE(pid >= 0);
        if (pid == 0) {
            ::close(p[0]);
            child(rank, p[1]);
            ::_exit(111); // the child returned instead of exiting
        }
        ::close(p[1]);
        children.push_back(pid);
        pipes.push_back(p[0]);
    }
    std::vector<process_outcome> out(children.size());
    const auto end = std::chrono::steady_clock::now() + deadline;
    for (std::size_t i = 0; i < children.size(); ++i) {
        int status = 0;
        while (::waitpid(children[i], &status, WNOHANG) == 0) {
            if (std::chrono::steady_clock::now() > end) {
                ::kill(children[i], SIGKILL);
                ::waitpid(children[i], &status, 0);
                break;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        out[i].exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        char buf[4096];
        ssize_t n = 0;
        while ((n = ::read(pipes[i], buf, sizeof buf)) > 0) {
            out[i].report.append(buf, static_cast<std::size_t>(n));
        }
        ::close(pipes[i]);
    }
    return out;
}

} // namespace unison::test
