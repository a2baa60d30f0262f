#pragma once

/// \file
/// Runs one rank's non-blocking calls, in issue order, on a worker thread, so that
/// the collective proceeds while the caller computes (the overlap DDP relies on).
/// Records are pooled: a steady stream of requests allocates nothing.

#include "unison/comm/collective.hpp"
#include "unison/comm/detail/trace.hpp"
#include "unison/thread/detail/phase_barrier.hpp"

#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace unison::detail {

class progress_engine;

/// One issued operation and its completion.
struct op_record {
    collective_call call;
    std::atomic<bool> done{false};
    std::exception_ptr error;
    progress_engine* engine = nullptr;
    collective_span span; ///< the call on the timeline
};

class progress_engine {
public:
    /// Runs a call, marking its span on the timeline as it goes.
    using executor = std::function<void(const collective_call&, collective_span*)>;

    explicit progress_engine(executor run) : run_(std::move(run)) {}
    progress_engine(const progress_engine&) = delete;
    progress_engine& operator=(const progress_engine&) = delete;

    ~progress_engine() {
        {
            std::lock_guard lock(mutex_);
            stopping_ = true;
        }
        work_cv_.notify_all();
        if (worker_.joinable()) {
            worker_.join();
        }
    }

    /// A fresh record from the pool.
    op_record* acquire(const collective_call& call) {
        std::lock_guard lock(mutex_);
        op_record* r = nullptr;
        if (free_.empty()) {
            pool_.push_back(std::make_unique<op_record>());
            r = pool_.back().get();
        } else {
            r = free_.back();
            free_.pop_back();
        }
        r->call = call;
        r->done.store(false, std::memory_order_relaxed);
        r->error = nullptr;
        r->engine = this;
        return r;
    }

    void release(op_record* r) {
        r->span.end("released");
        std::lock_guard lock(mutex_);
        free_.push_back(r);
    }

    /// Queues `r` for the worker, starting the worker on first use.
    void enqueue(op_record* r) {
        {
            std::lock_guard lock(mutex_);
            if (!worker_.joinable()) {
                worker_ = std::thread([this] { work(); });
            }
            queue_.push_back(r);
            pending_.fetch_add(1, std::memory_order_acq_rel);
        }
        work_cv_.notify_one();
    }

    /// Marks `r` complete (from the worker, or from the peer that received a send).
    /// Notifies under the lock: a waiter that sees `done` may destroy this engine as
    /// soon as it returns, and wait() takes the lock before returning, so the
    /// notification is over by then.
    void complete(op_record* r, std::exception_ptr error) {
        r->span.end(error ? "error" : nullptr);
        r->error = std::move(error);
        std::lock_guard lock(mutex_);
        r->done.store(true, std::memory_order_release);
        done_cv_.notify_all();
    }

    /// Waits until `r` completes or `deadline` passes; true if it completed.
    bool wait(op_record* r, clock::time_point deadline) {
        for (int i = 0; i < 2000; ++i) {
            if (r->done.load(std::memory_order_acquire)) {
                std::lock_guard lock(mutex_); // the completer has finished notifying
                return true;
            }
            cpu_relax();
        }
        std::unique_lock lock(mutex_);
        return done_cv_.wait_until(lock, deadline,
                                   [r] { return r->done.load(std::memory_order_acquire); });
    }

    /// Waits until every queued call has run, so a blocking call keeps issue order.
    void drain() {
        if (pending_.load(std::memory_order_acquire) == 0) {
            return;
        }
        std::unique_lock lock(mutex_);
        done_cv_.wait(lock, [this] { return pending_.load(std::memory_order_acquire) == 0; });
    }

private:
    void work() {
        for (;;) {
            op_record* r = nullptr;
            {
                std::unique_lock lock(mutex_);
                work_cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
                if (queue_.empty()) {
                    return;
                }
                r = queue_.front();
                queue_.pop_front();
            }
            std::exception_ptr error;
            try {
                r->span.started();
                run_(r->call, &r->span);
            } catch (...) {
                error = std::current_exception();
            }
            r->span.end(error ? "error" : nullptr);
            r->error = std::move(error);
            std::lock_guard lock(mutex_);
            r->done.store(true, std::memory_order_release);
            pending_.fetch_sub(1, std::memory_order_acq_rel);
            done_cv_.notify_all();
        }
    }

    executor run_;
    std::mutex mutex_;
    std::condition_variable work_cv_;
    std::condition_variable done_cv_;
    std::deque<op_record*> queue_;
    std::vector<std::unique_ptr<op_record>> pool_;
    std::vector<op_record*> free_;
    std::atomic<int> pending_{0};
    bool stopping_ = false;
    std::thread worker_;
};

} // namespace unison::detail
