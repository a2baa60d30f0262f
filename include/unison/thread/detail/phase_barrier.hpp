#pragma once

/// \file
/// A reusable barrier for the ranks of one thread group, with a deadline and a
/// stop predicate. Arrivals spin briefly (ranks usually arrive within
/// microseconds of each other), then yield, then sleep on a condition variable in
/// short slices so that an abort or a departed peer is noticed within milliseconds.

#include "unison/core/detail/clock.hpp"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#endif

namespace unison::detail {

inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(_M_X64)
    _mm_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
}

enum class wait_result { done, timed_out, stopped };

class phase_barrier {
public:
    explicit phase_barrier(int ranks)
        : ranks_(ranks), arrived_(std::make_unique<std::atomic<std::uint64_t>[]>(
                             static_cast<std::size_t>(ranks))) {
        // Spinning only pays when every rank may have a core to itself.
        const unsigned cores = std::thread::hardware_concurrency();
        spin_ = cores != 0 && static_cast<unsigned>(ranks) <= cores;
        for (int r = 0; r < ranks; ++r) {
            arrived_[static_cast<std::size_t>(r)].store(0, std::memory_order_relaxed);
        }
    }

    /// The phase the next arrival completes (1 for the first).
    std::uint64_t next_phase() const noexcept {
        return generation_.load(std::memory_order_acquire) + 1;
    }

    /// True when `rank` has arrived for `phase`.
    bool has_arrived(int rank, std::uint64_t phase) const noexcept {
        return arrived_[static_cast<std::size_t>(rank)].load(std::memory_order_acquire) >= phase;
    }

    /// Arrives as `rank` and waits for every rank, until `deadline`, or until `stop()`
    /// returns true (checked every couple of milliseconds once sleeping).
    template <class Stop>
    wait_result arrive_and_wait(int rank, clock::time_point deadline, Stop&& stop) {
        const std::uint64_t g = generation_.load(std::memory_order_acquire);
        arrived_[static_cast<std::size_t>(rank)].store(g + 1, std::memory_order_release);
        if (count_.fetch_add(1, std::memory_order_acq_rel) + 1 == ranks_) {
            count_.store(0, std::memory_order_relaxed);
            generation_.store(g + 1, std::memory_order_seq_cst);
            if (sleepers_.load(std::memory_order_seq_cst) > 0) {
                std::lock_guard lock(mutex_);
                cv_.notify_all();
            }
            return wait_result::done;
        }
        // Spin for a couple of microseconds (peers on other cores usually arrive by
        // then), measured in time because PAUSE costs 10 to 150 cycles depending on
        // the CPU; then yield, so a peer sharing this core can run.
        const auto start = clock::now();
        if (spin_) {
            do {
                for (int i = 0; i < 32; ++i) {
                    if (generation_.load(std::memory_order_acquire) != g) {
                        return wait_result::done;
                    }
                    cpu_relax();
                }
            } while (clock::now() - start < std::chrono::microseconds(2));
        }
        const auto yield_until = start + std::chrono::microseconds(200);
        do {
            if (generation_.load(std::memory_order_acquire) != g) {
                return wait_result::done;
            }
            std::this_thread::yield();
        } while (clock::now() < yield_until);

        sleepers_.fetch_add(1, std::memory_order_seq_cst);
        std::unique_lock lock(mutex_);
        wait_result result = wait_result::done;
        while (generation_.load(std::memory_order_seq_cst) == g) {
            if (stop()) {
                result = wait_result::stopped;
                break;
            }
            const auto now = clock::now();
            if (now >= deadline) {
                result = wait_result::timed_out;
                break;
            }
            cv_.wait_until(lock, std::min(deadline, now + std::chrono::milliseconds(2)));
        }
        sleepers_.fetch_sub(1, std::memory_order_seq_cst);
        return result;
    }

private:
    const int ranks_;
    bool spin_ = false;
    alignas(64) std::atomic<int> count_{0};
    alignas(64) std::atomic<std::uint64_t> generation_{0};
    alignas(64) std::atomic<int> sleepers_{0};
    std::mutex mutex_;
    std::condition_variable cv_;
    std::unique_ptr<std::atomic<std::uint64_t>[]> arrived_;
};

} // namespace unison::detail
