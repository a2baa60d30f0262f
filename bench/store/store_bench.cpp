/// \file
/// unison-store-bench: the TCP store (rendezvous/tcp_store.hpp) serving many ranks
/// on loopback, as a large torchrun or Kubernetes job's bootstrap would: N ranks,
/// threads of this process each with its own connection, join the store rank 0
/// hosts, then run a store all_gather of 64 bytes per rank and a barrier. Each
/// rank checks every value it gathered (rank r's is 64 bytes derived from r), so a
/// lost or mixed-up rank fails the run. Prints one line per N: the time from the
/// first rank's start to the last rank's joining, the all_gather's and the
/// barrier's time (the slowest rank's), and the number of ranks that completed.
///
///     unison-store-bench                     # 64, 256 and 1024 ranks
///     unison-store-bench -r 1024 -p 29600    # 1024 ranks on port 29600
///
/// Every wait is bounded by -T seconds (default 120); a rank that fails prints why
/// and the run exits 1.

#include <unison/rendezvous.hpp>
#include <unison/version.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace {

using clock_type = std::chrono::steady_clock;

struct config {
    std::vector<int> ranks{64, 256, 1024};
    std::uint16_t port = 0; ///< 0: a free port, passed on to the other ranks by hand
    double timeout_seconds = 120;
};

[[noreturn]] void usage(int status, const std::string& why = {}) {
    if (!why.empty()) {
        std::fprintf(stderr, "unison-store-bench: %s\n", why.c_str());
    }
    std::fprintf(status == 0 ? stdout : stderr,
                 "usage: unison-store-bench [-r N[,N...]] [-p port] [-T seconds] [--version]\n"
                 "  -r  rank counts [64,256,1024]\n"
                 "  -p  the store's port [a free one]\n"
                 "  -T  bound on every wait, seconds [120]\n"
                 "  --version  the program's and unison's version\n");
    std::exit(status);
}

config parse(int argc, char** argv) {
    config c;
    for (int i = 1; i < argc; ++i) {
        const std::string_view a = argv[i];
        if (a == "-h" || a == "--help") {
            usage(0);
        }
        if (a == "--version") {
            std::printf("unison-store-bench (unison %s)\n", unison::version_string);
            std::exit(0);
        }
        if (a != "-r" && a != "-p" && a != "-T") {
            usage(2, "unknown option '" + std::string(a) + "'");
        }
        if (i + 1 >= argc) {
            usage(2, "option '" + std::string(a) + "' needs a value");
        }
        const std::string v = argv[++i];
        try {
            if (a == "-r") {
                c.ranks.clear();
                for (std::size_t at = 0; at <= v.size();) {
                    const std::size_t comma = std::min(v.find(',', at), v.size());
                    const int n = std::stoi(v.substr(at, comma - at));
                    if (n < 1) {
                        usage(2, "-r: rank counts are at least 1, got " + std::to_string(n));
                    }
                    c.ranks.push_back(n);
                    at = comma + 1;
                }
            } else if (a == "-p") {
                const int p = std::stoi(v);
                if (p < 0 || p > 65535) {
                    usage(2, "-p: no port " + v);
                }
                c.port = static_cast<std::uint16_t>(p);
            } else if (a == "-T") {
                c.timeout_seconds = std::stod(v);
                if (!(c.timeout_seconds > 0)) {
                    usage(2, "-T: needs a positive number of seconds, got " + v);
                }
            } else {
                usage(2, "unknown option '" + std::string(a) + "'");
            }
        } catch (const std::logic_error&) {
            usage(2, "option '" + std::string(a) + "': '" + v + "' is not a number");
        }
    }
    return c;
}

/// Rank r's 64-byte value.
std::vector<std::byte> value_of(int r) {
    std::vector<std::byte> v(64);
    for (std::size_t i = 0; i < v.size(); ++i) {
        v[i] = static_cast<std::byte>((static_cast<unsigned>(r) * 131u + i * 7u) & 0xffu);
    }
    return v;
}

double seconds_between(clock_type::time_point a, clock_type::time_point b) {
    return std::chrono::duration<double>(b - a).count();
}

/// One world of `n` ranks; false when any rank failed (it said why on stderr).
bool run(int n, const config& c) {
    const auto timeout =
        std::chrono::milliseconds(static_cast<long long>(c.timeout_seconds * 1000.0));
    const auto start = clock_type::now();
    // The store's server runs on its own, as tcp_store_server does for a job whose
    // rank 0 does not host it, so that a free port can be handed to every rank.
    unison::tcp_store_server server(c.port, n, timeout);
    const std::uint16_t port = server.port();
    std::atomic<int> completed{0};
    std::mutex report;
    const auto slots = static_cast<std::size_t>(n);
    std::vector<clock_type::time_point> joined(slots), gathered(slots), passed(slots);
    auto rank_main = [&](int r) {
        try {
            unison::store_options o;
            o.rank = r;
            o.world_size = n;
            o.timeout = timeout;
            o.port = port;
            o.host_server = false;
            o.port_source = "unison-store-bench";
            unison::tcp_store store(o);
            const auto ur = static_cast<std::size_t>(r);
            joined[ur] = clock_type::now();
            const auto all = store.all_gather("values", value_of(r));
            gathered[ur] = clock_type::now();
            bool right = all.size() == slots;
            for (int q = 0; right && q < n; ++q) {
                right = all[static_cast<std::size_t>(q)] == value_of(q);
            }
            if (!right) {
                std::lock_guard lock(report);
                std::fprintf(stderr, "rank %d: the gathered values are wrong\n", r);
                return;
            }
            store.barrier("done");
            passed[ur] = clock_type::now();
            completed.fetch_add(1);
        } catch (const std::exception& e) {
            std::lock_guard lock(report);
            std::fprintf(stderr, "rank %d: %s\n", r, e.what());
        }
    };
    std::vector<std::thread> threads;
    threads.reserve(slots);
    for (int r = 0; r < n; ++r) {
        threads.emplace_back(rank_main, r);
    }
    for (auto& t : threads) {
        t.join();
    }
    const int done = completed.load();
    if (done == n) {
        // Each phase ends when its slowest rank leaves it, and starts when the
        // previous one ended for the slowest (the store's collectives wait for all).
        const auto last = [](const std::vector<clock_type::time_point>& v) {
            return *std::max_element(v.begin(), v.end());
        };
        std::printf("%6d ranks: join %8.3f s, all_gather (64 B each) %8.3f s, barrier %8.3f "
                    "s, %d of %d ranks completed\n",
                    n, seconds_between(start, last(joined)),
                    seconds_between(last(joined), last(gathered)),
                    seconds_between(last(gathered), last(passed)), done, n);
    } else {
        std::printf("%6d ranks: %d of %d ranks completed\n", n, done, n);
    }
    std::fflush(stdout);
    return done == n;
}

} // namespace

int main(int argc, char** argv) {
    const config c = parse(argc, argv);
    bool ok = true;
    for (int n : c.ranks) {
        ok = run(n, c) && ok;
    }
    return ok ? 0 : 1;
}
