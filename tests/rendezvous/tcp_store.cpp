// The TCP store (unison/rendezvous): ranks as threads of this process, each with its
// own real connection over the loopback address. Keys, counters and the store
// collectives against what each rank sent; the failures a rendezvous meets (a rank
// that never comes, one that leaves, two processes with one RANK, another WORLD_SIZE,
// no store at the address, a port someone else holds, a listener that is not a
// store, a stray client) each with a bounded error that names what was wrong; and
// store_options::from_env on fake environments (torchrun, Kubernetes).

#include "support/environment.hpp"

#include <unison/rendezvous.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <exception>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

namespace {

using namespace std::chrono_literals;
using unison::store_options;
using unison::tcp_store;
using unison::tcp_store_server;
using clock_type = std::chrono::steady_clock;

bool contains(const std::string& s, const std::string& part) {
    return s.find(part) != std::string::npos;
}

/// Options for `rank` of `size` at a server of this process.
store_options at(const tcp_store_server& server, int rank, int size,
                 std::chrono::milliseconds timeout = 10s) {
    store_options o;
    o.host = "127.0.0.1";
    o.port = server.port();
    o.rank = rank;
    o.world_size = size;
    o.host_server = false;
    o.timeout = timeout;
    return o;
}

/// Runs `body(rank)` on `size` threads; returns each rank's exception (or null).
std::vector<std::exception_ptr> run_ranks(int size, const std::function<void(int)>& body) {
    std::vector<std::exception_ptr> errors(static_cast<std::size_t>(size));
    std::vector<std::thread> threads;
    for (int r = 0; r < size; ++r) {
        threads.emplace_back([&, r] {
            try {
                body(r);
            } catch (...) {
                errors[static_cast<std::size_t>(r)] = std::current_exception();
            }
        });
    }
    for (auto& t : threads) {
        t.join();
    }
    return errors;
}

void require_no_errors(const std::vector<std::exception_ptr>& errors) {
    for (std::size_t r = 0; r < errors.size(); ++r) {
        if (errors[r]) {
            try {
                std::rethrow_exception(errors[r]);
            } catch (const std::exception& e) {
                FAIL("rank " << r << ": " << std::string(e.what()));
            }
        }
    }
}

/// what() of the exception of type E that `e` holds; fails the test otherwise.
template <class E>
std::string error_of(const std::exception_ptr& e) {
    REQUIRE(e);
    try {
        std::rethrow_exception(e);
    } catch (const E& x) {
        return x.what();
    } catch (const std::exception& x) {
        FAIL("another exception: " << std::string(x.what()));
    }
    return "";
}

std::vector<std::byte> random_bytes(std::mt19937& rng, std::size_t n) {
    std::vector<std::byte> v(n);
    for (auto& b : v) {
        b = static_cast<std::byte>(rng() & 0xff);
    }
    return v;
}

/// A socket listening on a free loopback port, never accepting.
struct silent_listener {
    int fd = -1;
    std::uint16_t port = 0;
    silent_listener() {
        fd = ::socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_ANY);
        REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
        REQUIRE(::listen(fd, 8) == 0);
        socklen_t n = sizeof a;
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &n);
        port = ntohs(a.sin_port);
    }
    ~silent_listener() { ::close(fd); }
};

/// A plain TCP connection to `port` on the loopback address, whose receives give up
/// after 5 s (so that a regression fails a test instead of hanging it).
int raw_client(std::uint16_t port) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(port);
    REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    const timeval limit{5, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
    return fd;
}

std::span<const std::byte> bytes_of(const std::string& s) {
    return std::as_bytes(std::span(s.data(), s.size()));
}

} // namespace

TEST_CASE("tcp_store: set, get, check, add and erase between ranks") {
    tcp_store_server server(0, 3);
    require_no_errors(run_ranks(3, [&](int rank) {
        tcp_store store(at(server, rank, 3));
        CHECK(store.rank() == rank);
        CHECK(store.size() == 3);
        CHECK(store.hosts().size() == 3);
        // Every rank sets its own key and reads the others', which may come later.
        const std::string mine = "value of rank " + std::to_string(rank) + std::string(rank, '!');
        store.set("k" + std::to_string(rank), mine);
        for (int other = 0; other < 3; ++other) {
            const auto v = store.get("k" + std::to_string(other));
            const std::string want =
                "value of rank " + std::to_string(other) + std::string(other, '!');
            CHECK(std::string(reinterpret_cast<const char*>(v.data()), v.size()) == want);
        }
        // A counter: each rank adds rank + 1, 10 times; the last value seen is the sum.
        std::int64_t last = 0;
        for (int i = 0; i < 10; ++i) {
            last = store.add("counter", rank + 1);
        }
        store.barrier("after adds");
        CHECK(store.add("counter", 0) == 10 * (1 + 2 + 3));
        CHECK(last <= 60);
        store.barrier("before erase");
        if (rank == 0) {
            CHECK(store.check("k1"));
            store.erase("k1");
            CHECK_FALSE(store.check("k1"));
            CHECK_FALSE(store.check("never set"));
        }
        store.barrier("after erase");
        CHECK_FALSE(store.check("k1"));
    }));
}

TEST_CASE("tcp_store: all_gather, broadcast and barrier give every rank what each sent") {
    for (int size = 1; size <= 4; ++size) {
        CAPTURE(size);
        tcp_store_server server(0, size);
        // What rank r sends in round i, known to every rank (the reference).
        auto sent = [](int r, int i) {
            std::mt19937 rng(static_cast<unsigned>(1000 * r + i + 7));
            return random_bytes(rng, std::uniform_int_distribution<std::size_t>(0, 3000)(rng));
        };
        require_no_errors(run_ranks(size, [&](int rank) {
            tcp_store store(at(server, rank, size));
            for (int i = 0; i < 12; ++i) {
                CAPTURE(i);
                switch (i % 3) {
                case 0: {
                    const auto got = store.all_gather("round", sent(rank, i));
                    REQUIRE(got.size() == static_cast<std::size_t>(size));
                    for (int r = 0; r < size; ++r) {
                        CHECK(got[static_cast<std::size_t>(r)] == sent(r, i));
                    }
                    break;
                }
                case 1: {
                    const int root = i % size;
                    const auto got = store.broadcast("round", sent(rank, i), root);
                    CHECK(got == sent(root, i));
                    break;
                }
                default:
                    store.barrier();
                }
            }
        }));
    }
}

TEST_CASE("tcp_store: a get waits for a later set, and one that times out names its key") {
    tcp_store_server server(0, 2);
    require_no_errors(run_ranks(2, [&](int rank) {
        tcp_store store(at(server, rank, 2, 700ms));
        if (rank == 1) {
            std::this_thread::sleep_for(200ms);
            store.set("late", "here");
        } else {
            CHECK(store.get("late").size() == 4);
            const auto start = clock_type::now();
            try {
                (void)store.get("nobody sets this");
                FAIL("the get returned");
            } catch (const unison::timeout_error& e) {
                CHECK(contains(e.what(), "nobody sets this"));
                CHECK(e.rank() == 0);
            }
            CHECK(clock_type::now() - start < 5s);
        }
    }));
}

TEST_CASE("tcp_store: a rank that never comes is named, within the timeout, on every rank") {
    tcp_store_server server(0, 4);
    const auto start = clock_type::now();
    const auto errors = run_ranks(4, [&](int rank) {
        if (rank == 2) {
            return; // never comes
        }
        tcp_store store(at(server, rank, 4, 600ms));
    });
    const auto took = clock_type::now() - start;
    for (const int rank : {0, 1, 3}) {
        CAPTURE(rank);
        const std::string what = error_of<unison::timeout_error>(errors[rank]);
        CHECK(contains(what, "rank 2 of 4"));
        CHECK(contains(what, "never connected"));
        CHECK(contains(what, "did not join"));
    }
    CHECK_FALSE(errors[2]);
    CHECK(took >= 550ms);
    CHECK(took < 5s);
}

TEST_CASE("tcp_store: a rank that leaves is named in the next collective, at once") {
    tcp_store_server server(0, 3);
    std::chrono::steady_clock::duration took[3]{};
    const auto errors = run_ranks(3, [&](int rank) {
        tcp_store store(at(server, rank, 3, 20s));
        store.barrier("all here");
        if (rank == 1) {
            return; // closes its store and goes
        }
        const auto start = std::chrono::steady_clock::now();
        struct timed {
            std::chrono::steady_clock::time_point start;
            std::chrono::steady_clock::duration& took;
            ~timed() { took = std::chrono::steady_clock::now() - start; }
        } timer{start, took[rank]};
        store.barrier("rank 1 is gone");
    });
    CHECK_FALSE(errors[1]);
    for (const int rank : {0, 2}) {
        const std::string what = error_of<unison::peer_error>(errors[rank]);
        CAPTURE(what);
        CHECK(contains(what, "rank 1 of 3"));
        CHECK(contains(what, "left"));
        CHECK(contains(what, "rank 1 is gone"));
        // Not the 20 s timeout: the store saw the connection close.
        CHECK(took[rank] < 1s);
    }
}

TEST_CASE("tcp_store: departed() names the ranks whose connection closed, waiting for one") {
    tcp_store_server server(0, 3);
    std::vector<int> before, after;
    std::chrono::steady_clock::duration waited{}, heard{};
    std::atomic<bool> answered{false};
    const auto errors = run_ranks(3, [&](int rank) {
        tcp_store store(at(server, rank, 3, 20s));
        store.barrier("all here");
        if (rank == 0) {
            auto start = std::chrono::steady_clock::now();
            before = store.departed(300ms); // nobody has left: waits the 300 ms
            waited = std::chrono::steady_clock::now() - start;
            store.barrier("asked");
            start = std::chrono::steady_clock::now();
            after = store.departed(20s); // answered as rank 2 leaves, not at 20 s
            heard = std::chrono::steady_clock::now() - start;
            answered = true;
            answered.notify_all();
        } else {
            store.barrier("asked");
            if (rank == 2) {
                return; // closes its store and goes
            }
            answered.wait(false); // rank 1 stays until rank 0 has its answer
        }
    });
    for (const auto& e : errors) {
        CHECK_FALSE(e);
    }
    CHECK(before.empty());
    CHECK(waited >= 250ms);
    CHECK(after == std::vector<int>{2});
    CHECK(heard < 5s);
}

TEST_CASE("tcp_store: collectives called in another order are a mismatch on both ranks") {
    tcp_store_server server(0, 2);
    const auto errors = run_ranks(2, [&](int rank) {
        tcp_store store(at(server, rank, 2, 5s));
        if (rank == 0) {
            store.barrier("checkpoint saved");
        } else {
            (void)store.all_gather("losses", bytes_of("1.5"));
        }
    });
    CHECK(contains(error_of<unison::mismatch_error>(errors[0]), "rank 1 called all_gather"));
    CHECK(contains(error_of<unison::mismatch_error>(errors[1]), "rank 0 called barrier"));
}

TEST_CASE("tcp_store: the store refuses a second process with one RANK, and another "
          "WORLD_SIZE, with the reason") {
    tcp_store_server server(0, 2);
    std::exception_ptr first_error;
    std::thread rank0([&] {
        try {
            tcp_store store(at(server, 0, 2, 10s)); // waits for rank 1
            store.barrier();
        } catch (...) {
            first_error = std::current_exception();
        }
    });
    REQUIRE(server.wait_until_connected(1, clock_type::now() + 10s));
    try {
        tcp_store twice(at(server, 0, 2, 5s)); // rank 0 again
        FAIL("a second rank 0 joined");
    } catch (const unison::argument_error& e) {
        CHECK(contains(e.what(), "rank 0 is already connected"));
        CHECK(contains(e.what(), "same RANK"));
    }
    try {
        tcp_store other(at(server, 1, 3, 5s)); // another world size
        FAIL("a rank of a 3-rank job joined a 2-rank store");
    } catch (const unison::argument_error& e) {
        CHECK(contains(e.what(), "started for 3 ranks and the store for 2"));
    }
    {
        tcp_store store(at(server, 1, 2, 10s)); // the real rank 1: the job goes on
        store.barrier();
    }
    rank0.join();
    CHECK_FALSE(first_error);
    CHECK_THROWS_AS(tcp_store(at(server, 2, 2)), unison::argument_error); // out of range
}

TEST_CASE("tcp_store: the ranks that waited say that a rank came and was refused, not that it "
          "never connected") {
    tcp_store_server server(0, 2);
    std::string waited;
    std::thread rank0([&] {
        try {
            tcp_store store(at(server, 0, 2, 1500ms)); // waits for rank 1, which never joins
            store.barrier();
        } catch (const unison::timeout_error& e) {
            waited = e.what();
        }
    });
    REQUIRE(server.wait_until_connected(1, clock_type::now() + 10s));
    try {
        tcp_store other(at(server, 1, 3, 5s)); // rank 1, started for 3 ranks
        FAIL("a rank of a 3-rank job joined a 2-rank store");
    } catch (const unison::argument_error& e) {
        CHECK(contains(e.what(), "started for 3 ranks and the store for 2"));
    }
    rank0.join();
    CAPTURE(waited);
    CHECK(contains(waited, "rank 1 of 2"));
    CHECK(contains(waited, "was refused by the store"));
    CHECK_FALSE(contains(waited, "never connected"));
}

namespace {

/// what() of the timeout_error that rank 1 of 2 gets joining at `port` (with a
/// 400 ms timeout), checked to come within a bound.
std::string join_error(std::uint16_t port) {
    store_options o;
    o.port = port;
    o.rank = 1;
    o.world_size = 2;
    o.timeout = 400ms;
    const auto start = clock_type::now();
    std::string what;
    try {
        tcp_store store(o);
        FAIL("joined at port " << port);
    } catch (const unison::timeout_error& e) {
        what = e.what();
    }
    CHECK(clock_type::now() - start < 4s);
    return what;
}

} // namespace

TEST_CASE("tcp_store: no store at the address is a bounded error naming the address") {
    const std::uint16_t port = unison::test::unused_port();
    const std::string what = join_error(port);
    CHECK(contains(what, "127.0.0.1:" + std::to_string(port)));
    CHECK(contains(what, "rank 0, which runs it, has not started"));
}

TEST_CASE("tcp_store: a port that another program holds cannot be hosted, and says so") {
    silent_listener other;
    store_options o;
    o.port = other.port;
    o.timeout = 2s;
    try {
        tcp_store store(o);
        FAIL("hosted on a port in use");
    } catch (const unison::error& e) {
        CHECK(contains(e.what(), "cannot host the store on port " + std::to_string(other.port)));
        CHECK(contains(e.what(), "in use"));
    }
}

TEST_CASE("tcp_store: a listener that is not a store is a bounded error that says so") {
    silent_listener other; // never answers, as another protocol's server might not
    const std::string what = join_error(other.port);
    CHECK(contains(what, "no answer to this rank's greeting"));
    CHECK(contains(what, "another program"));
}

TEST_CASE("tcp_store: a stray client speaking another protocol does not disturb the store") {
    tcp_store_server server(0, 2);
    {
        const int fd = raw_client(server.port());
        const std::string http = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
        REQUIRE(::send(fd, http.data(), http.size(), 0) == static_cast<ssize_t>(http.size()));
        char c = 0;
        CHECK(::recv(fd, &c, 1, 0) == 0); // the store hangs up on it
        ::close(fd);
    }
    require_no_errors(run_ranks(2, [&](int rank) {
        tcp_store store(at(server, rank, 2));
        const auto got = store.all_gather("after the stray", bytes_of(std::to_string(rank)));
        CHECK(got[1].size() == 1);
    }));
}

TEST_CASE("tcp_store: a connection that never says who it is is closed after the idle limit") {
    tcp_store_server server(0, 2, 300ms);
    const int fd = raw_client(server.port());
    const auto start = clock_type::now();
    char c = 0;
    CHECK(::recv(fd, &c, 1, 0) == 0); // closed by the store, not by our 5 s limit
    CHECK(clock_type::now() - start < 3s);
    ::close(fd);
}

TEST_CASE("tcp_store: broadcasts from different roots are a mismatch on both ranks") {
    tcp_store_server server(0, 2);
    const auto errors = run_ranks(2, [&](int rank) {
        tcp_store store(at(server, rank, 2, 5s));
        (void)store.broadcast("weights", bytes_of("mine"), /*root=*/rank);
    });
    for (const int rank : {0, 1}) {
        const std::string what = error_of<unison::mismatch_error>(errors[rank]);
        CHECK(contains(what, "from rank " + std::to_string(1 - rank)));
    }
}

TEST_CASE("tcp_store: one rank hosts its own store, on a port it picks") {
    store_options o;
    o.port = 0;
    o.timeout = 2s;
    tcp_store store(o);
    CHECK(store.port() != 0);
    const auto got = store.all_gather("alone", bytes_of("x"));
    REQUIRE(got.size() == 1);
    CHECK(got[0].size() == 1);
    CHECK_THROWS_AS(store.set("unison/joined/0", "mine"), unison::argument_error);
    CHECK_THROWS_AS(store.set("", "empty key"), unison::argument_error);
    const unison::launch_info info = unison::store_launch(store);
    CHECK(info.rank == 0);
    CHECK(info.local_rank == 0);
    CHECK(info.local_size == 1);
}

TEST_CASE("tcp_store: the local rank is this rank's place among the ranks on its host") {
    tcp_store_server server(0, 3);
    require_no_errors(run_ranks(3, [&](int rank) {
        tcp_store store(at(server, rank, 3));
        const unison::launch_info info = unison::store_launch(store);
        CHECK(info.rank == rank);
        CHECK(info.size == 3);
        CHECK(info.local_rank == rank); // every rank is on this host
        CHECK(info.local_size == 3);
        CHECK_FALSE(info.local_from_launcher);
    }));
}

namespace {

using unison::test::fake_env;

std::string from_env_error(const fake_env& env) {
    try {
        (void)store_options::from_env(env);
    } catch (const unison::argument_error& e) {
        return e.what();
    }
    return "";
}

} // namespace

TEST_CASE("store_options::from_env: torchrun, Kubernetes and what is missing") {
    const fake_env kubernetes{{"RANK", "3"},
                              {"WORLD_SIZE", "8"},
                              {"MASTER_ADDR", "job-master-0"},
                              {"MASTER_PORT", "23456"}};
    SUBCASE("Kubernetes: RANK, WORLD_SIZE and MASTER_PORT as they are") {
        const store_options o = store_options::from_env(kubernetes);
        CHECK(o.rank == 3);
        CHECK(o.world_size == 8);
        CHECK(o.host == "job-master-0");
        CHECK(o.port == 23456);
        CHECK(o.port_source == "MASTER_PORT");
    }
    SUBCASE("torchrun's own store holds MASTER_PORT: the port after it") {
        fake_env env = kubernetes;
        env.vars["TORCHELASTIC_USE_AGENT_STORE"] = "True";
        const store_options o = store_options::from_env(env);
        CHECK(o.port == 23457);
        CHECK(contains(o.port_source, "torchrun"));
        env.vars["MASTER_PORT"] = "65535";
        CHECK(contains(from_env_error(env), "UNISON_STORE_PORT"));
    }
    SUBCASE("torchrun --standalone: no agent store, MASTER_PORT is free") {
        fake_env env = kubernetes;
        env.vars["TORCHELASTIC_USE_AGENT_STORE"] = "False";
        CHECK(store_options::from_env(env).port == 23456);
    }
    SUBCASE("UNISON_STORE_PORT wins") {
        fake_env env = kubernetes;
        env.vars["TORCHELASTIC_USE_AGENT_STORE"] = "True";
        env.vars["UNISON_STORE_PORT"] = "40000";
        CHECK(store_options::from_env(env).port == 40000);
    }
    SUBCASE("missing or malformed variables are named") {
        fake_env env = kubernetes;
        env.vars.erase("MASTER_ADDR");
        CHECK(contains(from_env_error(env), "MASTER_ADDR is not set"));
        env = kubernetes;
        env.vars.erase("MASTER_PORT");
        CHECK(contains(from_env_error(env), "MASTER_PORT is not set"));
        env = kubernetes;
        env.vars["MASTER_PORT"] = "99999";
        CHECK(contains(from_env_error(env), "MASTER_PORT='99999' is not a port"));
        env = kubernetes;
        env.vars["UNISON_STORE_PORT"] = "http";
        CHECK(contains(from_env_error(env), "UNISON_STORE_PORT='http'"));
        CHECK(contains(from_env_error(fake_env{{"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}}),
                       "RANK and WORLD_SIZE are not set"));
    }
}
