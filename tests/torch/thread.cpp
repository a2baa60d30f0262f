// The LibTorch suite (tests/suites/torch.hpp) on the thread backend, at 1 to 4 ranks,
// and the guard against waiting on LibTorch's shared autograd device thread.

#include "../suites/torch.hpp"

#include <unison/torch/detail/device.hpp>

#include <optional>
#include <string>
#include <thread>

UNISON_TORCH_SUITE(unison::test::backend::thread);

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
    CHECK(check_elsewhere(first).empty());
    first.check(3, "torch::ddp backward"); // its own thread: always fine
    {
        backward_thread_guard second(device::cuda(5));
        backward_thread_guard other_device(device::cuda(6));
        backward_thread_guard host(std::nullopt);
        const std::string what = check_elsewhere(first);
        CAPTURE(what);
        CHECK(what.find("rank 3") != std::string::npos);
        CHECK(what.find("torch::ddp backward") != std::string::npos);
        CHECK(what.find("cuda:5") != std::string::npos);
        CHECK(what.find("2 engines") != std::string::npos);
        CHECK(what.find("set_multithreading_enabled(false)") != std::string::npos);
        first.check(3, "torch::ddp backward");
        CHECK(check_elsewhere(other_device).empty());
        CHECK(check_elsewhere(host).empty());
    }
    CHECK(check_elsewhere(first).empty()); // the second engine is gone
}
