// A checkpoint save killed at a random moment (SIGKILL: no destructor, no flush)
// never loads as wrong data. A child process trains two states, A and B, on two
// thread ranks and saves them alternately into one directory, over and over; the
// parent kills it after a random delay and reads the directory back: every read
// must give exactly A or exactly B (both known from saves that completed), or fail
// with a checkpoint_error, never a mix of the two.

#include "../sharded/checkpoint.hpp"

#include <unison/thread.hpp>

#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

namespace {

namespace fs = std::filesystem;
using namespace unison;
using namespace unison::policy;
using sp_type = sharded_parameters<thread_communicator, zero<3>, mixed_precision<dtype::f32>>;
using opt_type = partitioned_optimizer<sp_type, optim::adamw>;

/// Two ranks train state A (`steps_a` steps) and state B (more), then call
/// `body(sp_a, opt_a, sp_b, opt_b)` on each rank.
template <class F>
void with_two_states(F&& body) {
    thread_world(2).run([&](thread_communicator& comm) {
        sp_type a(comm), b(comm);
        for (sp_type* sp : {&a, &b}) {
            test::add_accounting_units(*sp);
            sp->start();
        }
        opt_type opt_a(a, optim::adamw{}), opt_b(b, optim::adamw{});
        for (int s = 0; s < 5; ++s) {
            if (s < 2) {
                test::synthetic_backward<float>(a, 40 + static_cast<std::uint64_t>(s), 1.0);
                opt_a.step();
            }
            test::synthetic_backward<float>(b, 90 + static_cast<std::uint64_t>(s), 1.0);
            opt_b.step();
        }
        body(a, opt_a, b, opt_b);
    });
}

} // namespace

TEST_CASE("thread: a checkpoint save killed at a random moment loads one whole state or fails") {
    const fs::path root = fs::temp_directory_path() / ("unison-kill-" + std::to_string(::getpid()));
    fs::remove_all(root);
    with_two_states([&](sp_type& a, opt_type& opt_a, sp_type& b, opt_type& opt_b) {
        save_checkpoint(root / "a", a, opt_a);
        save_checkpoint(root / "b", b, opt_b);
    });
    const auto want_a = test::checkpoint_contents(root / "a");
    const auto want_b = test::checkpoint_contents(root / "b");
    REQUIRE(want_a != want_b);

    std::mt19937 rng(12345);
    int whole_a = 0, whole_b = 0, refused = 0, mixed = 0;
    for (int trial = 0; trial < 24; ++trial) {
        CAPTURE(trial);
        const fs::path dir = root / ("t" + std::to_string(trial));
        int ready[2];
        REQUIRE(::pipe(ready) == 0);
        const pid_t child = ::fork();
        REQUIRE(child >= 0);
        if (child == 0) {
            ::close(ready[0]);
            with_two_states([&](sp_type& sa, opt_type& oa, sp_type& sb, opt_type& ob) {
                if (sa.communicator().rank() == 0) {
                    const char go = 1;
                    (void)!::write(ready[1], &go, 1);
                }
                for (;;) { // until killed
                    save_checkpoint(dir, sa, oa);
                    save_checkpoint(dir, sb, ob);
                }
            });
            ::_exit(0);
        }
        ::close(ready[1]);
        char go = 0;
        REQUIRE(::read(ready[0], &go, 1) == 1);
        ::close(ready[0]);
        // a delay that lands anywhere in a save, or between two
        std::this_thread::sleep_for(
            std::chrono::microseconds(std::uniform_int_distribution<int>(0, 30000)(rng)));
        ::kill(child, SIGKILL);
        int status = 0;
        ::waitpid(child, &status, 0);
        CHECK(WIFSIGNALED(status));
        try {
            const auto got = test::checkpoint_contents(dir);
            if (got == want_a) {
                ++whole_a;
            } else if (got == want_b) {
                ++whole_b;
            } else {
                ++mixed;
            }
        } catch (const checkpoint_error&) {
            ++refused; // no metadata yet, or files that no longer match it
        }
    }
    MESSAGE("24 killed saves: " << whole_a << " loaded A, " << whole_b << " loaded B, " << refused
                                << " refused");
    CHECK(mixed == 0);
    CHECK(whole_a + whole_b > 0); // the kills did land after whole saves too
    fs::remove_all(root);
}
