// The LibTorch suite (tests/suites/torch.hpp) on the thread backend, at 1 to 4 ranks,
// and the guard against waiting on LibTorch's shared autograd device thread.

#include "../suites/torch.hpp"

#include <unison/torch/detail/device.hpp>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

UNISON_TORCH_SUITE(unison::test::backend::thread);

// LibTorch's c10 defines a glog-style CHECK (it aborts on failure and counts
// nothing) after doctest's, so this file spells doctest's out: DOCTEST_CHECK.

namespace {

/// What `guard.check` says when called from another thread ("" when it passes).
std::string check_elsewhere(const unison::torch::detail::backward_thread_guard& guard) {
    std::string what;
    std::thread([&] {
        try {
            guard.check(3, "torch::ddp backward");
        } catch (const unison::argument_error& e) {
            what = e.what();
        }
    }).join();
    return what;
}

} // namespace

TEST_CASE("torch: a backward on the shared autograd device thread is refused") {
    using unison::device;
    using unison::torch::detail::backward_thread_guard;
    backward_thread_guard first(device::cuda(5));
    // Alone on its device: any thread may run its backward (one process per GPU).
    DOCTEST_CHECK(check_elsewhere(first).empty());
    first.check(3, "torch::ddp backward"); // its own thread: always fine
    {
        backward_thread_guard second(device::cuda(5));
        backward_thread_guard other_device(device::cuda(6));
        backward_thread_guard host(std::nullopt);
        const std::string what = check_elsewhere(first);
        CAPTURE(what);
        DOCTEST_CHECK(what.find("rank 3") != std::string::npos);
        DOCTEST_CHECK(what.find("torch::ddp backward") != std::string::npos);
        DOCTEST_CHECK(what.find("cuda:5") != std::string::npos);
        DOCTEST_CHECK(what.find("2 engines") != std::string::npos);
        DOCTEST_CHECK(what.find("set_multithreading_enabled(false)") != std::string::npos);
        first.check(3, "torch::ddp backward");
        DOCTEST_CHECK(check_elsewhere(other_device).empty());
        DOCTEST_CHECK(check_elsewhere(host).empty());
    }
    DOCTEST_CHECK(check_elsewhere(first).empty()); // the second engine is gone
}

TEST_CASE("torch: one module shared by the thread backend's ranks is refused on every rank") {
    // The first rank to construct claims the module; every other rank's claim fails.
    // Every rank hears of it in the first collective and throws at once, instead
    // of one rank going on alone into the module check until its timeout.
    UNISON_TORCH_ONE_THREAD();
    auto model = std::make_shared<unison::test::torch_models::mlp>();
    for (const bool fsdp : {false, true}) {
        CAPTURE(fsdp);
        std::vector<std::string> errors(3);
        const auto start = std::chrono::steady_clock::now();
        unison::thread_world(3).run([&](unison::thread_communicator& comm) {
            try {
                if (fsdp) {
                    unison::torch::fsdp<unison::thread_communicator, unison::policy::shard::full>
                        engine(comm, model, {}, {});
                } else {
                    unison::torch::ddp<unison::thread_communicator> dp(comm, model);
                }
            } catch (const unison::argument_error& e) {
                errors[static_cast<std::size_t>(comm.rank())] = e.what();
            }
        });
        DOCTEST_CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
        int driven = 0, told = 0;
        for (const std::string& e : errors) {
            CAPTURE(e);
            driven += e.find("is driven by another") != std::string::npos ? 1 : 0;
            told += e.find("cannot take its module") != std::string::npos ? 1 : 0;
        }
        DOCTEST_CHECK(driven == 2);
        DOCTEST_CHECK(told == 1);
    }
}
