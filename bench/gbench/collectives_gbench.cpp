/// \file
/// Google Benchmark suite of unison's collectives, with nccl-tests' counters.
///
///     unison-gbench                                    # thread backend, 2 and 4 ranks
///     unison-gbench --benchmark_filter=all_reduce      # the usual gbench flags
///     mpiexec -n 2 unison-gbench                       # MPI backend (when built with it)
///
/// The work runs on several threads (or processes), so timing is manual: every rank
/// times its own calls between a barrier and its last return, and the iteration
/// time is the slowest rank's. The ranks of one benchmark are started once and
/// kept waiting between batches, so starting threads is never timed. Each batch
/// runs many small calls back to back (as nccl-tests' -n does), so that the
/// hand-off between the benchmark thread and the ranks stays out of the numbers.
///
/// Counters, as nccl-tests names them: `size` (nccl-tests' size column, bytes),
/// `algbw` = size / time and `busbw` = algbw * (2(n-1)/n for all_reduce, (n-1)/n
/// for all_gather and reduce_scatter, 1 for broadcast), both in GB/s (1e9 B/s).

#include "collective_call.hpp"
#include "collective_shape.hpp"
#include "data_pattern.hpp"
#include "gbench_main.hpp"

#include <unison/comm.hpp>
#include <unison/core.hpp>
#include <unison/thread.hpp>

#if UNISON_HAS_MPI()
#include <unison/mpi.hpp>

#include <mpi.h>
#endif

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace unison::bench {
namespace {

using bench_clock = std::chrono::steady_clock;

/// Sizes in bytes: 8 B to 16 MiB in x8 steps, then 64 MiB.
const std::vector<std::int64_t> bench_bytes = {8,         64,      512,      4 << 10, 32 << 10,
                                               256 << 10, 2 << 20, 16 << 20, 64 << 20};

/// Calls per batch: enough that a batch of small calls takes about a millisecond
/// or more, one call for the largest sizes.
int calls_per_batch(std::size_t bytes) {
    return static_cast<int>(
        std::clamp<std::size_t>((std::size_t{2} << 20) / std::max<std::size_t>(bytes, 1), 1, 1024));
}

/// The ranks of one thread-backend benchmark: a thread_world whose ranks wait for
/// batches from the benchmark thread.
class thread_rank_team {
public:
    thread_rank_team(int ranks, collective_kind collective, std::size_t bytes)
        : ranks_(ranks), collective_(collective),
          shape_(shape_for(collective, bytes, dtype::f32, ranks)),
          seconds_(static_cast<std::size_t>(ranks)), host_([this] { host_main(); }) {}

    thread_rank_team(const thread_rank_team&) = delete;
    thread_rank_team& operator=(const thread_rank_team&) = delete;

    ~thread_rank_team() {
        {
            std::lock_guard lock(mutex_);
            stop_ = true;
        }
        wake_.notify_all();
        host_.join();
    }

    const collective_shape& shape() const noexcept { return shape_; }

    /// Runs `calls` back-to-back calls on every rank; returns the slowest rank's
    /// seconds from the common barrier to its last return.
    double run(int calls) {
        {
            std::lock_guard lock(mutex_);
            throw_if_failed();
            calls_ = calls;
            finished_ = 0;
            ++generation_;
        }
        wake_.notify_all();
        std::unique_lock lock(mutex_);
        done_.wait(lock, [&] { return finished_ == ranks_ || !failure_.empty(); });
        throw_if_failed();
        return *std::max_element(seconds_.begin(), seconds_.end());
    }

private:
    void throw_if_failed() const {
        if (!failure_.empty()) {
            throw std::runtime_error(failure_);
        }
    }

    void fail(const std::string& what) {
        {
            std::lock_guard lock(mutex_);
            if (failure_.empty()) {
                failure_ = what.empty() ? std::string("a rank failed") : what;
            }
            stop_ = true;
        }
        wake_.notify_all();
        done_.notify_all();
    }

    void host_main() {
        try {
            thread_world(ranks_).run([this](thread_communicator& comm) { rank_main(comm); });
        } catch (const std::exception& e) {
            fail(e.what());
        }
    }

    void rank_main(thread_communicator& comm) {
        try {
            host_memory send(shape_.send_bytes);
            host_memory recv(shape_.recv_bytes);
            fill_input(dtype::f32, data_pattern{}, comm.rank(), send.data(), 0,
                       shape_.send_bytes / shape_.elem_bytes);
            const unison_call<thread_communicator> call{comm, collective_, dtype::f32,
                                                        reduce_op::sum, 0};
            std::uint64_t seen = 0;
            for (;;) {
                int calls = 0;
                {
                    std::unique_lock lock(mutex_);
                    wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
                    if (stop_) {
                        return;
                    }
                    seen = generation_;
                    calls = calls_;
                }
                unison::barrier(comm);
                const auto start = bench_clock::now();
                for (int i = 0; i < calls; ++i) {
                    call(send.data(), recv.data(), shape_, false);
                }
                const std::chrono::duration<double> elapsed = bench_clock::now() - start;
                {
                    std::lock_guard lock(mutex_);
                    seconds_[static_cast<std::size_t>(comm.rank())] = elapsed.count();
                    if (++finished_ == ranks_) {
                        done_.notify_all();
                    }
                }
            }
        } catch (const std::exception& e) {
            fail(e.what()); // wakes the peers waiting for a batch, so run() can return
            throw;
        }
    }

    const int ranks_;
    const collective_kind collective_;
    const collective_shape shape_;

    std::mutex mutex_;
    std::condition_variable wake_; ///< ranks wait here for the next batch
    std::condition_variable done_; ///< the benchmark thread waits here for a batch
    std::uint64_t generation_ = 0;
    int calls_ = 0;
    int finished_ = 0;
    bool stop_ = false;
    std::string failure_;
    std::vector<double> seconds_;
    std::thread host_; // last: starts after everything above exists
};

/// Sets nccl-tests' counters from the mean seconds per call.
void set_counters(benchmark::State& state, collective_kind collective,
                  const collective_shape& shape, int ranks, double seconds_per_call) {
    const double algbw = algbw_gbps(shape, seconds_per_call);
    state.counters["size"] = static_cast<double>(shape.size_bytes());
    state.counters["algbw"] = algbw;
    state.counters["busbw"] = algbw * bus_factor(collective, ranks);
}

/// Thread backend: args are {ranks, bytes}.
void thread_collective(benchmark::State& state, collective_kind collective) {
    const int ranks = static_cast<int>(state.range(0));
    const auto bytes = static_cast<std::size_t>(state.range(1));
    try {
        thread_rank_team team(ranks, collective, bytes);
        const int batch = calls_per_batch(team.shape().size_bytes());
        team.run(batch); // warm-up, untimed
        double seconds = 0;
        std::int64_t calls = 0;
        while (state.KeepRunningBatch(batch)) {
            const double s = team.run(batch);
            state.SetIterationTime(s);
            seconds += s;
            calls += batch;
        }
        if (calls > 0) {
            set_counters(state, collective, team.shape(), ranks,
                         seconds / static_cast<double>(calls));
        }
    } catch (const std::exception& e) {
        state.SkipWithError(e.what());
    }
}

void register_thread_benchmarks() {
    for (collective_kind c : all_collective_kinds) {
        const std::string name = "thread/" + std::string(to_string(c));
        benchmark::RegisterBenchmark(name.c_str(), thread_collective, c)
            ->ArgsProduct({{2, 4}, bench_bytes})
            ->ArgNames({"ranks", "bytes"})
            ->UseManualTime()
            ->Unit(benchmark::kMicrosecond);
    }
}

#if UNISON_HAS_MPI()

/// Runs `call` `batch` times untimed, then in batches of `batch` while `state` asks
/// for more, each batch timed from a barrier to this rank's last return and set as
/// the slowest rank's time, so that every rank sees the same times and Google
/// Benchmark makes the same iteration-count decisions everywhere. Returns the mean
/// seconds per call, 0 when no batch ran.
template <class Call>
double time_mpi_batches(benchmark::State& state, int batch, const Call& call) {
    for (int i = 0; i < batch; ++i) { // warm-up, untimed
        call();
    }
    double seconds = 0;
    std::int64_t calls = 0;
    while (state.KeepRunningBatch(batch)) {
        MPI_Barrier(MPI_COMM_WORLD);
        const auto start = bench_clock::now();
        for (int i = 0; i < batch; ++i) {
            call();
        }
        double s = std::chrono::duration<double>(bench_clock::now() - start).count();
        MPI_Allreduce(MPI_IN_PLACE, &s, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        state.SetIterationTime(s);
        seconds += s;
        calls += batch;
    }
    return calls > 0 ? seconds / static_cast<double>(calls) : 0.0;
}

/// MPI backend: every process runs the same benchmarks (time_mpi_batches). Args are
/// {bytes}.
void mpi_collective(benchmark::State& state, collective_kind collective, mpi_communicator* comm) {
    const auto bytes = static_cast<std::size_t>(state.range(0));
    const int ranks = comm->size();
    const collective_shape shape = shape_for(collective, bytes, dtype::f32, ranks);
    host_memory send(shape.send_bytes);
    host_memory recv(shape.recv_bytes);
    fill_input(dtype::f32, data_pattern{}, comm->rank(), send.data(), 0,
               shape.send_bytes / shape.elem_bytes);
    const unison_call<mpi_communicator> call{*comm, collective, dtype::f32, reduce_op::sum, 0};
    const double each = time_mpi_batches(state, calls_per_batch(shape.size_bytes()),
                                         [&] { call(send.data(), recv.data(), shape, false); });
    if (each > 0) {
        set_counters(state, collective, shape, ranks, each);
    }
}

/// An out-of-place all-reduce of floats whose input is written before every call,
/// as a backward pass writes the gradients it then reduces: `raw` times
/// MPI_Allreduce, otherwise unison's, each with the same write, so that their ratio
/// compares the calls on an input as fresh in this rank's cache as a gradient is
/// (mpi_collective, above, leaves the input untouched between calls, which a
/// peer's read of it over shared memory may find cheaper). Args are {bytes}.
void mpi_written_all_reduce(benchmark::State& state, mpi_communicator* comm, bool raw) {
    const auto count = static_cast<std::size_t>(state.range(0)) / sizeof(float);
    const int ranks = comm->size();
    std::vector<float> in(count), out(count);
    int step = 0;
    const auto call = [&] {
        std::fill(in.begin(), in.end(), static_cast<float>((step++ + comm->rank()) & 7));
        if (raw) {
            MPI_Allreduce(in.data(), out.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM,
                          MPI_COMM_WORLD);
        } else {
            unison::all_reduce(*comm, in, out);
        }
    };
    const double each = time_mpi_batches(state, calls_per_batch(count * sizeof(float)), call);
    if (each > 0) {
        const collective_shape shape =
            shape_for(collective_kind::all_reduce, count * sizeof(float), dtype::f32, ranks);
        set_counters(state, collective_kind::all_reduce, shape, ranks, each);
    }
    // The last call's sum, checked on every rank: (step + rank) & 7 over the ranks.
    double want = 0;
    for (int r = 0; r < ranks; ++r) {
        want += static_cast<double>((step - 1 + r) & 7);
    }
    if (count > 0 &&
        (out.front() != static_cast<float>(want) || out.back() != static_cast<float>(want))) {
        state.SkipWithError("wrong sum");
    }
}

void register_mpi_benchmarks(mpi_communicator& comm) {
    const std::string ranks = "/ranks:" + std::to_string(comm.size());
    for (bool raw : {false, true}) {
        const std::string name =
            std::string(raw ? "mpi/raw_mpi_all_reduce_written" : "mpi/all_reduce_written") + ranks;
        auto* b = benchmark::RegisterBenchmark(name.c_str(), mpi_written_all_reduce, &comm, raw);
        for (std::int64_t bytes : {8 << 10, 32 << 10, 256 << 10, 1 << 20}) {
            b->Arg(bytes);
        }
        b->ArgName("bytes")->UseManualTime()->Unit(benchmark::kMicrosecond);
    }
    for (collective_kind c : all_collective_kinds) {
        const std::string name =
            "mpi/" + std::string(to_string(c)) + "/ranks:" + std::to_string(comm.size());
        auto* b = benchmark::RegisterBenchmark(name.c_str(), mpi_collective, c, &comm);
        for (std::int64_t bytes : bench_bytes) {
            b->Arg(bytes);
        }
        b->ArgName("bytes")->UseManualTime()->Unit(benchmark::kMicrosecond);
    }
}

/// Writes nothing: the display of every rank but 0.
class silent_reporter final : public benchmark::BenchmarkReporter {
public:
    bool ReportContext(const Context&) override { return true; }
    void ReportRuns(const std::vector<Run>&) override {}
};

#endif // UNISON_HAS_MPI()

/// Google Benchmark's own arguments, with this suite's default minimum time
/// (0.2 s per benchmark, so the default run stays near a minute) unless the
/// command line sets one; `keep_output` false drops --benchmark_out, so that
/// only one MPI rank writes the file.
std::vector<char*> benchmark_arguments(int argc, char** argv, bool keep_output) {
    static char default_min_time[] = "--benchmark_min_time=0.2";
    std::vector<char*> args;
    bool has_min_time = false;
    for (int i = 0; i < argc; ++i) {
        const std::string_view a = argv[i];
        has_min_time = has_min_time || a.starts_with("--benchmark_min_time");
        if (!keep_output && a.starts_with("--benchmark_out")) {
            continue;
        }
        args.push_back(argv[i]);
    }
    if (!has_min_time) {
        args.insert(args.begin() + 1, default_min_time);
    }
    args.push_back(nullptr);
    return args;
}

void add_context(std::string_view backend, int ranks) {
    benchmark::AddCustomContext("unison_version", unison::version_string);
    benchmark::AddCustomContext("unison_backend", std::string(backend));
    if (ranks > 0) {
        benchmark::AddCustomContext("unison_ranks", std::to_string(ranks));
    }
    benchmark::AddCustomContext("unison_dtype", "float");
    benchmark::AddCustomContext("unison_counters",
                                "size: bytes (nccl-tests' size); algbw, busbw: GB/s as "
                                "nccl-tests computes them");
}

/// Runs the registered benchmarks with this process's share of the arguments.
int run_benchmarks(int argc, char** argv, bool keep_output, benchmark::BenchmarkReporter* display) {
    std::vector<char*> args = benchmark_arguments(argc, argv, keep_output);
    int n = static_cast<int>(args.size()) - 1;
    benchmark::Initialize(&n, args.data());
    if (benchmark::ReportUnrecognizedArguments(n, args.data())) {
        return 2;
    }
    benchmark::RunSpecifiedBenchmarks(display);
    benchmark::Shutdown();
    return 0;
}

} // namespace
} // namespace unison::bench

int main(int argc, char** argv) {
    using namespace unison::bench;
    if (version_asked(argc, argv, "unison-gbench")) {
        return 0;
    }
#if UNISON_HAS_MPI()
    // Under mpiexec with two or more processes, the MPI backend is benchmarked
    // (the thread backend's ranks would compete with every process for the cores);
    // otherwise the thread backend.
    unison::mpi_environment env(argc, argv);
    int world = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    if (world > 1) {
        unison::mpi_communicator comm(MPI_COMM_WORLD);
        add_context("mpi", comm.size());
        register_mpi_benchmarks(comm);
        silent_reporter silent;
        const bool root = comm.rank() == 0;
        return run_benchmarks(argc, argv, root, root ? nullptr : &silent);
    }
#endif
    add_context("thread", 0);
    register_thread_benchmarks();
    return run_benchmarks(argc, argv, true, nullptr);
}
