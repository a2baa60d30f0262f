#pragma once

/// \file
/// The calls this process abandoned when they timed out. MPI cannot cancel a
/// collective, and a peer that stopped answering will not reach MPI_Finalize
/// either, so `mpi_environment` reads this record before it finalizes
/// (environment.hpp: it ends the job instead of waiting forever).

#include <algorithm>
#include <chrono>
#include <mutex>
#include <optional>
#include <string>

namespace unison::detail {

struct abandoned_call {
    std::string label;    ///< "all_reduce #12"
    int waiting_for = -1; ///< the communicator rank it was waiting to hear from, or -1
    std::chrono::milliseconds timeout{0};
};

class abandoned_calls {
public:
    static abandoned_calls& instance() {
        static abandoned_calls a;
        return a;
    }
    void record(abandoned_call c) {
        const std::lock_guard<std::mutex> lock(mutex_);
        longest_ = std::max(longest_, c.timeout);
        if (!first_) {
            first_ = std::move(c);
        }
    }
    /// Forgets every abandoned call: a communicator spanning every process of the
    /// job was built since, so every process was alive then (the job recovered).
    void clear() {
        const std::lock_guard<std::mutex> lock(mutex_);
        first_.reset();
        longest_ = std::chrono::milliseconds(0);
    }
    /// The first call abandoned in this process, if any.
    std::optional<abandoned_call> first() const {
        const std::lock_guard<std::mutex> lock(mutex_);
        return first_;
    }
    /// The longest timeout among the abandoned calls.
    std::chrono::milliseconds longest_timeout() const {
        const std::lock_guard<std::mutex> lock(mutex_);
        return longest_;
    }

private:
    mutable std::mutex mutex_;
    std::optional<abandoned_call> first_;
    std::chrono::milliseconds longest_{0};
};

} // namespace unison::detail
