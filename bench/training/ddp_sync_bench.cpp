/// \file
/// unison-ddp-bench: the wall time of one data-parallel gradient synchronization.
///
///     unison-ddp-bench                                  # thread backend, 2 ranks
///     mpiexec -n 2 unison-ddp-bench -B mpi              # MPI backend, a process per rank
///     torchrun --nproc_per_node=2 --no_python unison-ddp-bench -B gloo   # Gloo, no MPI
///     unison-ddp-bench -m bucketed,per-tensor -n 50     # some modes only
///
/// The gradients are the parameters of bench/training/model_shapes.json (built in;
/// --shapes reads another list): 200 float tensors of 1 K to 4 M elements, 25.9 M in all.
/// One synchronization is every gradient marked ready in reverse registration order
/// (backward's order, with no compute in between) until every gradient holds the
/// average over the ranks. Each rank times it from a barrier to its last result;
/// the iteration's time is the slowest rank's, and the table gives the median and
/// the minimum over -n iterations after -w untimed ones. Before every iteration
/// each rank rewrites its gradients (untimed), as backward would, with values that
/// depend on the rank, the tensor and the element; the first and one extra final
/// synchronization of each mode are checked element by element against the mean
/// of those values (#wrong).
///
/// Modes:
///   bucketed        bucketed_reducer with its default options (25 MiB buckets, the
///                   first 1 MiB): gradients copied into buckets and back
///                   where the backend cannot reduce between them (on threads it
///                   does: nothing is copied, see bucketed_reducer::coalesced)
///   bucketed-packing the same, made to pack on every backend (a hook other than the
///                   default): what the copies cost
///   bucketed-view   the same with policy::gradients_in_buckets (gradients live in
///                   the buckets, nothing is copied)
///   per-tensor      one all_reduce_async (avg) per gradient in backward order, then
///                   wait_all
///   flat            one all_reduce_async (avg) of all gradients at once (they are
///                   contiguous here): one call, no copies, no overlap -- what the
///                   bytes alone cost
/// (avg: the backend's average, the division fused into the reduction on threads,
/// a sum and a division pass under MPI, as in the bucketed modes.)
///   sweep           bucketed with bucket sizes from -s (first bucket 1 MiB, or the
///                   bucket size when that is smaller)
///   raw-per-tensor  (MPI) blocking MPI_Allreduce in place per gradient, backward
///                   order, then the division: plain MPI's per-call cost
///   raw-flat        (MPI) one blocking MPI_Allreduce in place of all gradients,
///                   then the division

#include "launch_rank.hpp"
#include "model_shapes.hpp"
#include "model_shapes_json.hpp" // generated from model_shapes.json (bench/CMakeLists.txt)

#include <unison/comm.hpp>
#include <unison/core.hpp>
#include <unison/ddp.hpp>
#include <unison/thread.hpp>
#include <unison/version.hpp>

#if UNISON_HAS_MPI()
#include <unison/mpi.hpp>

#include "mpi_job.hpp"

#include <mpi.h>
#endif
#if UNISON_HAS_GLOO()
#include <unison/gloo.hpp>
#endif

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace unison::bench {
namespace {

using bench_clock = std::chrono::steady_clock;
constexpr std::size_t mib = std::size_t{1} << 20;

// ------------------------------------------------------------------ command line

enum class mode_kind : std::uint8_t {
    bucketed,
    bucketed_packing,
    bucketed_view,
    per_tensor,
    flat,
    sweep,
    raw_per_tensor,
    raw_flat
};

constexpr mode_kind all_modes[] = {mode_kind::bucketed,       mode_kind::bucketed_packing,
                                   mode_kind::bucketed_view,  mode_kind::per_tensor,
                                   mode_kind::flat,           mode_kind::sweep,
                                   mode_kind::raw_per_tensor, mode_kind::raw_flat};

constexpr std::string_view to_string(mode_kind m) noexcept {
    switch (m) {
    case mode_kind::bucketed:
        return "bucketed";
    case mode_kind::bucketed_packing:
        return "bucketed-packing";
    case mode_kind::bucketed_view:
        return "bucketed-view";
    case mode_kind::per_tensor:
        return "per-tensor";
    case mode_kind::flat:
        return "flat";
    case mode_kind::sweep:
        return "sweep";
    case mode_kind::raw_per_tensor:
        return "raw-per-tensor";
    case mode_kind::raw_flat:
        return "raw-flat";
    }
    return "?";
}

constexpr bool needs_mpi(mode_kind m) noexcept {
    return m == mode_kind::raw_per_tensor || m == mode_kind::raw_flat;
}

struct ddp_bench_config {
    bool mpi = false;     ///< -B mpi
    bool gloo = false;    ///< -B gloo
    int thread_ranks = 2; ///< -t
    bool thread_ranks_given = false;
    int iters = 20;                    ///< -n
    int warmup_iters = 5;              ///< -w
    std::vector<mode_kind> modes;      ///< -m; empty: every mode the backend has
    std::vector<std::size_t> sweep = { ///< -s, bytes
        1 * mib, 2 * mib, 4 * mib, 8 * mib, 16 * mib, 25 * mib, 32 * mib, 64 * mib};
    std::string shapes_path; ///< --shapes; empty: the built-in list
    bool print_shapes = false;
    bool json = false;
    bool help = false;
    bool version = false; // --version: print it and exit
};

class usage_error : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

std::string usage_text() {
    return R"(usage: unison-ddp-bench [options]

Times one data-parallel gradient synchronization of a model's gradients (200
float tensors, 1 K to 4 M elements, 25.9 M in all:
bench/training/model_shapes.json): every gradient marked ready in backward order
until every gradient holds the average over the ranks. Time: from a barrier to
the last result, slowest rank; median and minimum over -n iterations. GB/s = gradient bytes / median time.

  -B, --backend <name>       thread, mpi (run under mpiexec) or gloo (run under
                             torchrun, or with RANK, WORLD_SIZE, MASTER_ADDR and
                             MASTER_PORT set) [thread]
  -t, --nthreads <n>         ranks of the thread backend [2]
  -n, --iters <n>            timed synchronizations per mode [20]
  -w, --warmup_iters <n>     untimed synchronizations before them; the bucketed
                             modes rebuild their buckets after the first [5]
  -m, --modes <list>         comma-separated, run in this order: bucketed,
                             bucketed-packing, bucketed-view, per-tensor, flat,
                             sweep, and with -B mpi raw-per-tensor, raw-flat
                             [all of them]
  -s, --sweep <list>         bucket sizes of the sweep, MiB [1,2,4,8,16,25,32,64]
      --shapes <file>        the parameter list, in model_shapes.json's format
                             [the model_shapes.json built in]
      --print-shapes         print the parameter list and exit
      --format <fmt>         text or json [text]
  -h, --help                 this text
      --version              the program's and unison's version

The exit status is 0, 1 when a result was wrong, 2 for a bad command line.
)";
}

int parse_count(std::string_view value, const std::string& option, int lo) {
    if (value.empty() || value.size() > 9 ||
        value.find_first_not_of("0123456789") != std::string_view::npos) {
        throw usage_error("option " + option + ": '" + std::string(value) +
                          "' is not a whole number");
    }
    const int v = std::atoi(std::string(value).c_str());
    if (v < lo) {
        throw usage_error("option " + option + ": " + std::to_string(v) + " is below " +
                          std::to_string(lo));
    }
    return v;
}

std::vector<std::string_view> split_list(std::string_view s) {
    std::vector<std::string_view> items;
    while (!s.empty()) {
        const std::size_t comma = s.find(',');
        items.push_back(s.substr(0, comma));
        s = comma == std::string_view::npos ? std::string_view{} : s.substr(comma + 1);
    }
    return items;
}

ddp_bench_config parse_command_line(int argc, const char* const* argv) {
    ddp_bench_config cfg;
    for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        auto value = [&]() -> std::string_view {
            if (i + 1 >= argc) {
                throw usage_error("option " + arg + " needs a value");
            }
            return argv[++i];
        };
        if (arg == "-h" || arg == "--help") {
            cfg.help = true;
        } else if (arg == "--version") {
            cfg.version = true;
        } else if (arg == "-B" || arg == "--backend") {
            const std::string_view v = value();
            if (v != "thread" && v != "mpi" && v != "gloo") {
                throw usage_error("option " + arg + ": '" + std::string(v) +
                                  "' is not a backend (thread, mpi, gloo)");
            }
            cfg.mpi = v == "mpi";
            cfg.gloo = v == "gloo";
        } else if (arg == "-t" || arg == "--nthreads") {
            cfg.thread_ranks = parse_count(value(), arg, 1);
            cfg.thread_ranks_given = true;
        } else if (arg == "-n" || arg == "--iters") {
            cfg.iters = parse_count(value(), arg, 1);
        } else if (arg == "-w" || arg == "--warmup_iters") {
            cfg.warmup_iters = parse_count(value(), arg, 0);
        } else if (arg == "-m" || arg == "--modes") {
            for (std::string_view item : split_list(value())) {
                const auto* m = std::find_if(std::begin(all_modes), std::end(all_modes),
                                             [&](mode_kind k) { return to_string(k) == item; });
                if (m == std::end(all_modes)) {
                    throw usage_error("option " + arg + ": '" + std::string(item) +
                                      "' is not a mode (bucketed, bucketed-packing, "
                                      "bucketed-view, per-tensor, flat, sweep, raw-per-tensor, "
                                      "raw-flat)");
                }
                cfg.modes.push_back(*m);
            }
        } else if (arg == "-s" || arg == "--sweep") {
            cfg.sweep.clear();
            for (std::string_view item : split_list(value())) {
                char* end = nullptr;
                const std::string text(item);
                const double v = std::strtod(text.c_str(), &end);
                if (text.empty() || *end != '\0' || !(v > 0) || v > 1e6) {
                    throw usage_error("option " + arg + ": '" + text +
                                      "' is not a bucket size in MiB");
                }
                cfg.sweep.push_back(std::max<std::size_t>(
                    1, static_cast<std::size_t>(std::llround(v * static_cast<double>(mib)))));
            }
        } else if (arg == "--shapes") {
            cfg.shapes_path = std::string(value());
        } else if (arg == "--print-shapes") {
            cfg.print_shapes = true;
        } else if (arg == "--format") {
            const std::string_view v = value();
            if (v != "text" && v != "json") {
                throw usage_error("option --format: '" + std::string(v) +
                                  "' is not an output format (text, json)");
            }
            cfg.json = v == "json";
        } else {
            throw usage_error("unknown option '" + arg + "'");
        }
    }
    if (cfg.thread_ranks_given && (cfg.mpi || cfg.gloo)) {
        throw usage_error(std::string("-t sets the thread backend's ranks; with ") +
                          (cfg.mpi ? "-B mpi the ranks are the processes mpiexec starts"
                                   : "-B gloo the ranks are the processes torchrun starts"));
    }
    if (cfg.modes.empty()) {
        for (mode_kind m : all_modes) {
            if (cfg.mpi || !needs_mpi(m)) {
                cfg.modes.push_back(m);
            }
        }
    }
    for (mode_kind m : cfg.modes) {
        if (needs_mpi(m) && !cfg.mpi) {
            throw usage_error("mode " + std::string(to_string(m)) + " needs -B mpi");
        }
    }
    return cfg;
}

// ------------------------------------------------------------------- gradients

/// A rank's gradients in one 64-byte aligned allocation, each starting on a cache
/// line, in registration order (as a framework's allocator might place them).
class gradient_store {
public:
    explicit gradient_store(const model_shapes& m) {
        std::size_t at = 0;
        for (const model_tensor& t : m.tensors) {
            offsets_.push_back(at);
            counts_.push_back(t.elements());
            at += (t.elements() + 15) / 16 * 16;
        }
        total_ = at;
        data_.reset(
            static_cast<float*>(::operator new (total_ * sizeof(float), std::align_val_t{64})));
        std::fill_n(data_.get(), total_, 0.0f);
    }

    std::size_t size() const noexcept { return offsets_.size(); }
    std::span<float> operator[](std::size_t i) noexcept {
        return {data_.get() + offsets_[i], counts_[i]};
    }
    /// Every gradient, with the padding between them (zero on every rank).
    std::span<float> all() noexcept { return {data_.get(), total_}; }

private:
    struct release {
        void operator()(float* p) const noexcept { ::operator delete (p, std::align_val_t{64}); }
    };
    std::vector<std::size_t> offsets_;
    std::vector<std::size_t> counts_;
    std::size_t total_ = 0;
    std::unique_ptr<float, release> data_;
};

/// Element `i` of gradient `t` on `rank`: k / 256 + rank with k in [1, 1024], so
/// every value is exact in float and so is the sum over a few ranks.
inline float fill_value(int rank, std::uint32_t t, std::uint32_t i) noexcept {
    std::uint32_t h = (i + 0x9e3779b9u * (t + 1u)) * 2654435761u;
    h ^= static_cast<std::uint32_t>(rank) * 0x85ebca6bu;
    h ^= h >> 13;
    return static_cast<float>((h & 1023u) + 1u) * (1.0f / 256.0f) + static_cast<float>(rank);
}

void fill(std::span<float> g, int rank, std::size_t t) {
    const auto tt = static_cast<std::uint32_t>(t);
    for (std::size_t i = 0; i < g.size(); ++i) {
        g[i] = fill_value(rank, tt, static_cast<std::uint32_t>(i));
    }
}

/// Elements of `g` that differ from the mean of every rank's fill values.
std::uint64_t count_wrong(std::span<const float> g, int ranks, std::size_t t) {
    const auto tt = static_cast<std::uint32_t>(t);
    std::uint64_t wrong = 0;
    for (std::size_t i = 0; i < g.size(); ++i) {
        double sum = 0;
        for (int r = 0; r < ranks; ++r) {
            sum += fill_value(r, tt, static_cast<std::uint32_t>(i));
        }
        const double expected = sum / ranks;
        if (!(std::fabs(static_cast<double>(g[i]) - expected) <= 1e-6 * expected)) {
            ++wrong;
        }
    }
    return wrong;
}

void scale(std::span<float> g, float s) noexcept {
    for (float& x : g) {
        x *= s;
    }
}

// ----------------------------------------------------------------------- modes
// Each mode offers grad(i) (where gradient i lives now), sync() (the timed
// synchronization), calls() (all-reduces per synchronization) and bucket_bytes()
// (the bucket sizes, in launch order; empty where there are no buckets).

/// The default hook under another type, which makes the reducer pack into its
/// buckets where it would otherwise reduce between the gradients.
struct packing_hook : all_reduce_hook {};

template <communicator Comm, class... Policies>
class bucketed_mode {
public:
    using reducer_type = bucketed_reducer<Comm, Policies...>;
    static constexpr bool in_buckets = reducer_type::config::gradient_memory::in_buckets;

    /// `sizes`: {first bucket, bucket} bytes, or ddp_options' defaults when absent.
    bucketed_mode(Comm& comm, gradient_store& grads, const model_shapes& m,
                  std::optional<std::pair<std::size_t, std::size_t>> sizes)
        : reducer_(comm, options(sizes)), grads_(grads),
          first_bucket_(reducer_.options().first_bucket_bytes),
          bucket_(reducer_.options().bucket_bytes) {
        for (std::size_t i = 0; i < grads.size(); ++i) {
            reducer_.add(grads[i], m.tensors[i].name);
        }
        reducer_.start();
    }

    std::span<float> grad(std::size_t i) {
        if constexpr (in_buckets) {
            const view<float> v = reducer_.template gradient<float>(i);
            return {v.data, v.size};
        } else {
            return grads_[i];
        }
    }

    void sync() {
        for (std::size_t i = grads_.size(); i-- > 0;) {
            reducer_.mark_ready(i);
        }
        (void)reducer_.finish();
    }

    std::size_t calls() const { return reducer_.bucket_count(); }
    static ddp_options options(std::optional<std::pair<std::size_t, std::size_t>> sizes) {
        ddp_options o;
        if (sizes) {
            o.first_bucket_bytes = sizes->first;
            o.bucket_bytes = sizes->second;
        }
        return o;
    }

    std::size_t first_bucket() const noexcept { return first_bucket_; }
    std::size_t bucket() const noexcept { return bucket_; }

    std::vector<std::size_t> bucket_bytes() const {
        std::vector<std::size_t> bytes;
        for (const std::vector<std::size_t>& members : reducer_.bucket_layout()) {
            std::size_t b = 0;
            for (std::size_t g : members) {
                b += grads_[g].size() * sizeof(float);
            }
            bytes.push_back(b);
        }
        return bytes;
    }

private:
    reducer_type reducer_;
    gradient_store& grads_;
    std::size_t first_bucket_;
    std::size_t bucket_;
};

template <communicator Comm>
class per_tensor_mode {
public:
    per_tensor_mode(Comm& comm, gradient_store& grads) : comm_(comm), grads_(grads) {
        requests_.reserve(grads.size());
    }

    std::span<float> grad(std::size_t i) { return grads_[i]; }

    void sync() {
        requests_.clear();
        for (std::size_t i = grads_.size(); i-- > 0;) {
            requests_.push_back(all_reduce_async(comm_, grads_[i], reduce_op::avg));
        }
        wait_all(std::span<typename Comm::request_type>(requests_));
    }

    std::size_t calls() const { return grads_.size(); }
    std::vector<std::size_t> bucket_bytes() const { return {}; }

private:
    Comm& comm_;
    gradient_store& grads_;
    std::vector<typename Comm::request_type> requests_;
};

template <communicator Comm>
class flat_mode {
public:
    flat_mode(Comm& comm, gradient_store& grads) : comm_(comm), grads_(grads) {}

    std::span<float> grad(std::size_t i) { return grads_[i]; }

    void sync() { all_reduce_async(comm_, grads_.all(), reduce_op::avg).wait(); }

    std::size_t calls() const { return 1; }
    std::vector<std::size_t> bucket_bytes() const { return {}; }

private:
    Comm& comm_;
    gradient_store& grads_;
};

#if UNISON_HAS_MPI()
/// Plain MPI: a blocking in-place MPI_Allreduce per gradient (`flat`: one of all).
class raw_mpi_mode {
public:
    raw_mpi_mode(gradient_store& grads, bool flat) : grads_(grads), flat_(flat) {
        MPI_Comm_size(MPI_COMM_WORLD, &size_);
    }

    std::span<float> grad(std::size_t i) { return grads_[i]; }

    void sync() {
        if (flat_) {
            reduce(grads_.all());
        } else {
            for (std::size_t i = grads_.size(); i-- > 0;) {
                reduce(grads_[i]);
            }
        }
        const float inverse = 1.0f / static_cast<float>(size_);
        for (std::size_t i = grads_.size(); i-- > 0;) {
            scale(grads_[i], inverse);
        }
    }

    std::size_t calls() const { return flat_ ? 1 : grads_.size(); }
    std::vector<std::size_t> bucket_bytes() const { return {}; }

private:
    static void reduce(std::span<float> g) {
        check_mpi(MPI_Allreduce(MPI_IN_PLACE, g.data(), static_cast<int>(g.size()), MPI_FLOAT,
                                MPI_SUM, MPI_COMM_WORLD),
                  "MPI_Allreduce");
    }

    gradient_store& grads_;
    bool flat_;
    int size_ = 1;
};
#endif

// --------------------------------------------------------------------- results

struct mode_result {
    std::string mode;
    std::size_t bucket = 0; ///< bytes; 0 where there are no buckets
    std::size_t first_bucket = 0;
    std::size_t calls = 0;
    std::vector<std::size_t> buckets; ///< bucket sizes in launch order, bytes
    double median = 0;                ///< seconds
    double min = 0;
    std::uint64_t wrong = 0;
};

double median_of(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const std::size_t n = v.size();
    return n == 0 ? 0.0 : n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/// Runs `mode`: -w untimed synchronizations, -n timed ones, one more; the first
/// and the last are checked.
template <communicator Comm, class Mode>
mode_result run_mode(Comm& comm, const ddp_bench_config& cfg, Mode& mode, std::size_t tensors) {
    const int rank = comm.rank();
    const int total = cfg.warmup_iters + cfg.iters + 1;
    std::vector<double> seconds;
    std::vector<std::int64_t> wrong{0};
    for (int it = 0; it < total; ++it) {
        for (std::size_t i = tensors; i-- > 0;) { // what backward would have written
            fill(mode.grad(i), rank, i);
        }
        barrier(comm);
        const auto start = bench_clock::now();
        mode.sync();
        const std::chrono::duration<double> elapsed = bench_clock::now() - start;
        if (it >= cfg.warmup_iters && it < cfg.warmup_iters + cfg.iters) {
            seconds.push_back(elapsed.count());
        }
        if (it == 0 || it == total - 1) {
            for (std::size_t i = 0; i < tensors; ++i) {
                wrong[0] += static_cast<std::int64_t>(count_wrong(mode.grad(i), comm.size(), i));
            }
        }
    }
    all_reduce(comm, seconds, reduce_op::max); // each iteration's slowest rank
    all_reduce(comm, wrong, reduce_op::sum);
    mode_result r;
    r.calls = mode.calls();
    r.buckets = mode.bucket_bytes();
    r.median = median_of(seconds);
    r.min = *std::min_element(seconds.begin(), seconds.end());
    r.wrong = static_cast<std::uint64_t>(wrong[0]);
    return r;
}

/// Writes the results on rank 0, a row as soon as it is measured.
class printer {
public:
    printer(const ddp_bench_config& cfg, const model_shapes& m, std::string backend, int ranks)
        : cfg_(cfg), m_(m), backend_(std::move(backend)), ranks_(ranks) {}

    void begin() {
        std::size_t smallest = SIZE_MAX, largest = 0;
        for (const model_tensor& t : m_.tensors) {
            smallest = std::min(smallest, t.elements());
            largest = std::max(largest, t.elements());
        }
        const std::size_t bytes = m_.elements() * sizeof(float);
        if (cfg_.json) {
            std::printf("{\n  \"benchmark\": \"unison-ddp-bench\",\n  \"backend\": \"%s\",\n"
                        "  \"ranks\": %d,\n  \"shapes\": %s,\n  \"tensors\": %zu,\n"
                        "  \"elements\": %zu,\n  \"bytes\": %zu,\n  \"iters\": %d,\n"
                        "  \"warmup_iters\": %d,\n  \"results\": [",
                        backend_.c_str(), ranks_, json_quote(m_.source).c_str(), m_.tensors.size(),
                        m_.elements(), bytes, cfg_.iters, cfg_.warmup_iters);
        } else {
            std::printf("# unison-ddp-bench: one gradient synchronization, backend %s, %d ranks\n",
                        backend_.c_str(), ranks_);
            std::printf("# gradients: %s: %zu float tensors of %zu to %zu elements, %zu in all "
                        "(%.1f MB)\n",
                        m_.source.c_str(), m_.tensors.size(), smallest, largest, m_.elements(),
                        static_cast<double>(bytes) / 1e6);
            std::printf("# time: barrier to the last averaged gradient, slowest rank; median and "
                        "min of %d iterations after %d warm-up\n",
                        cfg_.iters, cfg_.warmup_iters);
            std::printf("# GB/s: gradient bytes / median time; x bucketed: median / bucketed's "
                        "median\n#\n");
            std::printf("# %-17s %7s %6s %6s %9s %9s %7s %10s %7s\n", "mode", "bucket", "first",
                        "calls", "median", "min", "GB/s", "x bucketed", "#wrong");
            std::printf("# %-17s %7s %6s %6s %9s %9s\n", "", "(MiB)", "(MiB)", "", "(ms)", "(ms)");
        }
        std::fflush(stdout);
    }

    void row(const mode_result& r) {
        if (r.mode == "bucketed" && !reference_) {
            reference_ = r.median;
        }
        const double bytes = static_cast<double>(m_.elements() * sizeof(float));
        const double gbps = r.median > 0 ? bytes / r.median / 1e9 : 0.0;
        const std::optional<double> ratio = reference_ && *reference_ > 0
                                                ? std::optional<double>(r.median / *reference_)
                                                : std::nullopt;
        auto mib_text = [](std::size_t b) {
            char s[32];
            if (b == 0) {
                std::snprintf(s, sizeof s, "-");
            } else {
                std::snprintf(s, sizeof s, b % mib == 0 ? "%.0f" : "%.2f",
                              static_cast<double>(b) / static_cast<double>(mib));
            }
            return std::string(s);
        };
        if (cfg_.json) {
            std::printf("%s\n    {\"mode\": \"%s\", \"bucket_bytes\": %zu, "
                        "\"first_bucket_bytes\": %zu, \"calls\": %zu, \"median_ms\": %.4f, "
                        "\"min_ms\": %.4f, \"gbps\": %.4f, \"x_bucketed\": %s, \"wrong\": %llu, "
                        "\"bucket_sizes\": [",
                        first_row_ ? "" : ",", r.mode.c_str(), r.bucket, r.first_bucket, r.calls,
                        r.median * 1e3, r.min * 1e3, gbps,
                        ratio ? std::to_string(*ratio).c_str() : "null",
                        static_cast<unsigned long long>(r.wrong));
            for (std::size_t k = 0; k < r.buckets.size(); ++k) {
                std::printf("%s%zu", k == 0 ? "" : ", ", r.buckets[k]);
            }
            std::printf("]}");
        } else {
            std::printf("  %-17s %7s %6s %6zu %9.2f %9.2f %7.2f %10s %7llu\n", r.mode.c_str(),
                        mib_text(r.bucket).c_str(), mib_text(r.first_bucket).c_str(), r.calls,
                        r.median * 1e3, r.min * 1e3, gbps,
                        ratio ? detail_ratio(*ratio).c_str() : "-",
                        static_cast<unsigned long long>(r.wrong));
        }
        first_row_ = false;
        total_wrong_ += r.wrong;
        if (!r.buckets.empty() && r.mode != "sweep") {
            std::string sizes;
            for (std::size_t b : r.buckets) {
                sizes += (sizes.empty() ? "" : " ") + mib_text_fine(b);
            }
            layouts_.push_back(r.mode + ": " + sizes);
        }
        std::fflush(stdout);
    }

    void finish() {
        if (cfg_.json) {
            std::printf("\n  ],\n  \"summary\": {\"wrong\": %llu}\n}\n",
                        static_cast<unsigned long long>(total_wrong_));
        } else {
            std::printf("#\n# Bucket sizes after the rebuild, launch order (MiB):\n");
            for (const std::string& l : layouts_) {
                std::printf("#   %s\n", l.c_str());
            }
            std::printf("# Wrong values: %llu %s\n", static_cast<unsigned long long>(total_wrong_),
                        total_wrong_ == 0 ? "OK" : "FAILED");
        }
        std::fflush(stdout);
    }

private:
    static std::string json_quote(std::string_view s) {
        std::string q = "\"";
        for (char c : s) {
            if (c == '"' || c == '\\') {
                q += '\\';
            }
            q += static_cast<unsigned char>(c) < 0x20 ? ' ' : c;
        }
        return q + "\"";
    }
    static std::string detail_ratio(double r) {
        char s[32];
        std::snprintf(s, sizeof s, "%.2f", r);
        return s;
    }
    static std::string mib_text_fine(std::size_t b) {
        char s[32];
        std::snprintf(s, sizeof s, "%.2f", static_cast<double>(b) / static_cast<double>(mib));
        return s;
    }

    const ddp_bench_config& cfg_;
    const model_shapes& m_;
    std::string backend_;
    int ranks_;
    std::optional<double> reference_;
    bool first_row_ = true;
    std::uint64_t total_wrong_ = 0;
    std::vector<std::string> layouts_;
};

/// Every mode of -m on one rank; `out` is non-null on rank 0. Returns the total of
/// wrong values (known on every rank).
template <communicator Comm>
std::uint64_t run_rank(Comm& comm, const ddp_bench_config& cfg, const model_shapes& m,
                       printer* out) {
    gradient_store grads(m); // allocated and first touched by its rank
    std::uint64_t wrong = 0;
    auto report = [&](mode_result r, std::string mode, std::size_t bucket, std::size_t first) {
        r.mode = std::move(mode);
        r.bucket = bucket;
        r.first_bucket = first;
        wrong += r.wrong;
        if (out != nullptr) {
            out->row(r);
        }
    };
    for (mode_kind k : cfg.modes) {
        const std::string name(to_string(k));
        switch (k) {
        case mode_kind::bucketed: {
            bucketed_mode<Comm> mode(comm, grads, m, std::nullopt);
            report(run_mode(comm, cfg, mode, grads.size()), name, mode.bucket(),
                   mode.first_bucket());
            break;
        }
        case mode_kind::bucketed_packing: {
            bucketed_mode<Comm, policy::comm_hook<packing_hook>> mode(comm, grads, m, std::nullopt);
            report(run_mode(comm, cfg, mode, grads.size()), name, mode.bucket(),
                   mode.first_bucket());
            break;
        }
        case mode_kind::bucketed_view: {
            bucketed_mode<Comm, policy::gradients_in_buckets> mode(comm, grads, m, std::nullopt);
            report(run_mode(comm, cfg, mode, grads.size()), name, mode.bucket(),
                   mode.first_bucket());
            break;
        }
        case mode_kind::per_tensor: {
            per_tensor_mode<Comm> mode(comm, grads);
            report(run_mode(comm, cfg, mode, grads.size()), name, 0, 0);
            break;
        }
        case mode_kind::flat: {
            flat_mode<Comm> mode(comm, grads);
            report(run_mode(comm, cfg, mode, grads.size()), name, 0, 0);
            break;
        }
        case mode_kind::sweep:
            for (std::size_t bytes : cfg.sweep) {
                const std::size_t first = std::min(mib, bytes);
                bucketed_mode<Comm> mode(comm, grads, m, std::pair{first, bytes});
                report(run_mode(comm, cfg, mode, grads.size()), name, mode.bucket(),
                       mode.first_bucket());
            }
            break;
        case mode_kind::raw_per_tensor:
        case mode_kind::raw_flat: {
#if UNISON_HAS_MPI()
            raw_mpi_mode mode(grads, k == mode_kind::raw_flat);
            report(run_mode(comm, cfg, mode, grads.size()), name, 0, 0);
#endif
            break;
        }
        }
    }
    if (out != nullptr) {
        out->finish();
    }
    return wrong;
}

int run_threads(const ddp_bench_config& cfg, const model_shapes& m) {
    printer out(cfg, m, "thread", cfg.thread_ranks);
    out.begin();
    std::uint64_t wrong = 0;
    thread_world(cfg.thread_ranks).run([&](thread_communicator& comm) {
        const std::uint64_t w = run_rank(comm, cfg, m, comm.rank() == 0 ? &out : nullptr);
        if (comm.rank() == 0) {
            wrong = w;
        }
    });
    return wrong == 0 ? 0 : 1;
}

#if UNISON_HAS_MPI()
int run_mpi(int& argc, char**& argv, const ddp_bench_config& cfg, const model_shapes& m) {
    return run_mpi_job("unison-ddp-bench", argc, argv, [&] {
        mpi_communicator comm(MPI_COMM_WORLD);
        std::unique_ptr<printer> out;
        if (comm.rank() == 0) {
            out = std::make_unique<printer>(cfg, m, "mpi", comm.size());
            out->begin();
        }
        return run_rank(comm, cfg, m, out.get()) == 0 ? 0 : 1;
    });
}
#endif

#if UNISON_HAS_GLOO()
int run_gloo(const ddp_bench_config& cfg, const model_shapes& m) {
    gloo_communicator comm = gloo_communicator::from_env();
    std::unique_ptr<printer> out;
    if (comm.rank() == 0) {
        out = std::make_unique<printer>(cfg, m, "gloo", comm.size());
        out->begin();
    }
    return run_rank(comm, cfg, m, out.get()) == 0 ? 0 : 1;
}
#endif

void print_shapes(const model_shapes& m) {
    std::printf("# %s: %zu tensors, %zu elements (%zu bytes as float)\n", m.source.c_str(),
                m.tensors.size(), m.elements(), m.elements() * sizeof(float));
    std::printf("# %5s  %-28s %-12s %10s\n", "index", "name", "shape", "elements");
    for (std::size_t i = 0; i < m.tensors.size(); ++i) {
        const model_tensor& t = m.tensors[i];
        std::string shape;
        for (std::size_t d : t.shape) {
            shape += (shape.empty() ? "" : "x") + std::to_string(d);
        }
        std::printf("  %5zu  %-28s %-12s %10zu\n", i, t.name.c_str(), shape.c_str(), t.elements());
    }
}

} // namespace
} // namespace unison::bench

int main(int argc, char** argv) {
    using namespace unison::bench;
    ddp_bench_config cfg;
    model_shapes m;
    try {
        cfg = parse_command_line(argc, argv);
        if (cfg.help) {
            if (launch_rank() == 0) {
                std::fputs(usage_text().c_str(), stdout);
            }
            return 0;
        }
        if (cfg.version) {
            if (launch_rank() == 0) {
                std::printf("unison-ddp-bench (unison %s)\n", unison::version_string);
            }
            return 0;
        }
        m = cfg.shapes_path.empty()
                ? parse_model_shapes(model_shapes_json,
                                     "bench/training/model_shapes.json (built in)")
                : load_model_shapes(cfg.shapes_path);
    } catch (const std::exception& e) {
        if (launch_rank() == 0) {
            std::fprintf(stderr,
                         "unison-ddp-bench: error: %s\n(unison-ddp-bench -h lists the options)\n",
                         e.what());
        }
        return 2;
    }
    if (cfg.print_shapes) {
        if (launch_rank() == 0) {
            print_shapes(m);
        }
        return 0;
    }
    try {
        if (cfg.mpi) {
#if UNISON_HAS_MPI()
            return run_mpi(argc, argv, cfg, m);
#else
            if (launch_rank() == 0) {
                std::fprintf(stderr, "unison-ddp-bench: error: this build has no MPI backend "
                                     "(configure with MPI found, so that unison::mpi exists)\n");
            }
            return 2;
#endif
        }
        if (cfg.gloo) {
#if UNISON_HAS_GLOO()
            return run_gloo(cfg, m);
#else
            if (launch_rank() == 0) {
                std::fprintf(stderr, "unison-ddp-bench: error: this build has no Gloo backend "
                                     "(configure with Gloo found, so that unison::gloo exists)\n");
            }
            return 2;
#endif
        }
        return run_threads(cfg, m);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "unison-ddp-bench: %s\n", e.what());
        return 1;
    }
}
