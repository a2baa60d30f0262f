#pragma once

#include "unison/thread/thread_communicator.hpp"
#include "unison/thread/tuning.hpp"

#include <exception>
#include <memory>
#include <numeric>
#include <thread>
#include <vector>

namespace unison {

/// N ranks as threads of this process:
///
///     unison::thread_world(4).run([](unison::thread_communicator& comm) { ... });
///
/// `run` calls the function once per rank, each on its own thread with its own
/// communicator, and returns when all have returned. If a rank throws, its peers'
/// pending and later calls fail with `peer_error` instead of waiting, and `run`
/// rethrows the first rank's exception (the cause, not its consequences). A rank
/// that returns while its peers still wait for it in a collective fails them the
/// same way.
class thread_world {
public:
    /// A world of `ranks` ranks (>= 1). An `options.all_reduce_algorithm` other than
    /// automatic or rank_ordered, the one schedule this backend has, is an
    /// argument_error (thread/tuning.hpp).
    explicit thread_world(int ranks, comm_options options = comm_options::from_env())
        : ranks_(ranks), options_(options) {
        if (ranks < 1) {
            throw argument_error(-1, "thread_world",
                                 "needs at least one rank, got " + std::to_string(ranks));
        }
        thread_all_reduce_algorithm(options.all_reduce_algorithm);
    }

    /// Number of ranks.
    int size() const noexcept { return ranks_; }

    /// Runs `fn(comm)` on every rank and waits for all of them.
    template <class Fn>
    void run(Fn&& fn) {
        auto status = std::make_shared<detail::world_status>(ranks_);
        std::vector<int> members(static_cast<std::size_t>(ranks_));
        std::iota(members.begin(), members.end(), 0);
        auto group = std::make_shared<detail::thread_group>(std::move(members), status);
        std::vector<std::exception_ptr> errors(static_cast<std::size_t>(ranks_));
        std::vector<std::thread> threads;
        threads.reserve(static_cast<std::size_t>(ranks_));
        for (int r = 0; r < ranks_; ++r) {
            threads.emplace_back([&, r] {
                try {
                    thread_communicator comm(group, r, options_);
                    fn(comm);
                } catch (const std::exception& e) {
                    errors[static_cast<std::size_t>(r)] = std::current_exception();
                    status->abort(r, e.what());
                } catch (...) {
                    errors[static_cast<std::size_t>(r)] = std::current_exception();
                    status->abort(r, "unknown exception");
                }
                status->exited[static_cast<std::size_t>(r)].store(true);
            });
        }
        for (auto& t : threads) {
            t.join();
        }
        if (status->aborted.load()) {
            const auto cause = static_cast<std::size_t>(status->cause_rank);
            if (cause < errors.size() && errors[cause]) {
                std::rethrow_exception(errors[cause]);
            }
            for (auto& e : errors) {
                if (e) {
                    std::rethrow_exception(e);
                }
            }
        }
    }

private:
    int ranks_;
    comm_options options_;
};

} // namespace unison
