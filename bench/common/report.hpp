#pragma once

/// \file
/// unison-bench's output: nccl-tests' text table, or one flat record per size in
/// JSON or CSV, on stdout; and with -J, nccl-tests' JSON file besides. Rows are
/// written as soon as they are measured (stdout is flushed after each), so a long
/// run shows progress and a crash keeps what was measured.
///
/// The text output is nccl-tests 2.19's, line for line: its header lines (version,
/// program, parameters, "# Using devices" and one line per rank), its table (with
/// -I's per-iteration and -S's timestamp columns) and its closing lines;
/// unison-bench adds "# unison-bench:" lines to the header and, after nccl-tests'
/// closing line, the baseline tables, all as '#' lines whose headers no parser of
/// nccl-tests' logs takes for the main table's.
///
/// Every flat record (--format json or csv) carries the run's metadata (table,
/// backend, collective, ranks, dtype, op, root) and the same columns in every format:
///   size, count, then for oop_ (out of place) and ip_ (in place):
///   time_us (the CPU time with -C 1), algbw, busbw (GB/s), wrong (elements) and
///   ratio (baselines only: unison's time over the baseline's). `table` is "unison"
///   for the main rows and the baseline's name ("raw-mpi", "local-add") for the others.
///   Last, `algorithm`: the algorithm that ran at that size (main rows, where there is
///   a choice), and `requested`: the one the run asked for (the MPI backend's
///   main rows: automatic or the forced one, "+rules" added while tuning rules are
///   loaded), so that a sweep's automatic rows can be told from its forced ones
///   (scripts/tuning-rules.py reads both).

#include "bench_config.hpp"
#include "collective_shape.hpp"

#include <unison/version.hpp>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <unistd.h>

namespace unison::bench {

/// -I: one side's iterations timed one by one, and nccl-tests' summary of them
/// (its computeIterStats): all over the iterations after the first `skipped`.
struct per_iteration {
    /// Each iteration's time in us: the slowest rank's (nccl-tests: the max over
    /// its process rows).
    std::vector<double> times_us;
    /// Under MPI, each process's own times (nccl-tests' per_process_max_times_us);
    /// empty with one process.
    std::vector<std::vector<double>> per_process_us;
    int skipped = 0;
    double min_us = 0, max_us = 0, avg_us = 0, p50_us = 0, p95_us = 0, p99_us = 0;
    double stdev_us = 0; ///< population standard deviation
    double cv_pct = 0;   ///< stdev over mean, in percent
};

/// Fills the summary of `p` from its times, as nccl-tests does: sorted, p50 the
/// upper median, p95 and p99 by the nearest rank.
inline void summarize(per_iteration& p) {
    std::vector<double> t(p.times_us.begin() +
                              std::min<std::ptrdiff_t>(p.skipped, std::ssize(p.times_us)),
                          p.times_us.end());
    if (t.empty()) {
        return;
    }
    std::sort(t.begin(), t.end());
    const auto n = static_cast<std::ptrdiff_t>(t.size());
    auto nearest = [&](std::ptrdiff_t pct) { return std::min(n - 1, (n * pct + 99) / 100 - 1); };
    p.min_us = t.front();
    p.max_us = t.back();
    p.p50_us = t[static_cast<std::size_t>(n / 2)];
    p.p95_us = t[static_cast<std::size_t>(nearest(95))];
    p.p99_us = t[static_cast<std::size_t>(nearest(99))];
    double sum = 0;
    for (double v : t) {
        sum += v;
    }
    p.avg_us = sum / static_cast<double>(n);
    double var = 0;
    for (double v : t) {
        var += (v - p.avg_us) * (v - p.avg_us);
    }
    p.stdev_us = std::sqrt(var / static_cast<double>(n));
    p.cv_pct = p.avg_us > 0 ? p.stdev_us / p.avg_us * 100.0 : 0.0;
}

/// One side (out of place or in place) of one row.
struct side_result {
    double seconds = 0;                    ///< mean per call, over the ranks as -a says
    double cpu_seconds = 0;                ///< rank 0's time to issue a call (-C 1 shows it)
    double algbw = 0;                      ///< GB/s
    std::optional<double> busbw;           ///< GB/s; none where it means nothing (local-add)
    std::optional<std::uint64_t> wrong;    ///< none when not checked
    std::optional<double> ratio;           ///< unison's time / this time (baselines)
    std::optional<per_iteration> per_iter; ///< -I
};

/// One size: what nccl-tests prints on one line.
struct size_result {
    collective_shape shape;
    side_result out_of_place;
    side_result in_place;
    dtype type = dtype::f32;
    std::string op_name; ///< "none" for collectives without a reduction
};

/// One rank's line under "# Using devices".
struct rank_device {
    int rank = 0;
    int pid = 0;
    std::string host;          ///< up to its first '.', as nccl-tests prints it
    std::optional<int> device; ///< the CUDA device; none on the host backends
    std::string bus_id;        ///< PCI "domain:bus:device" of the GPU; "" on the host
    std::string info;          ///< the GPU's name, or "thread 0", "MPI process"
};

/// What the header and every record say about the run.
struct run_info {
    const bench_config* config = nullptr;
    int ranks = 0;
    int root = -1;       ///< -1 unless the collective has a root (nccl-tests prints -1)
    std::string op_name; ///< "none" for collectives without a reduction (nccl-tests)
    /// nccl-tests' nThread: ranks per process (the thread backend's -t; 1 for MPI and
    /// NCCL, one process per rank).
    int threads_per_process = 1;
    /// nccl-tests' nGpus: devices per rank, 1 on the NCCL backend, 0 on the host
    /// backends, which use none.
    int devices_per_rank = 0;
    int nccl_headers = 0;             ///< NCCL_VERSION_CODE of the build; 0 without NCCL
    int nccl_library = 0;             ///< ncclGetVersion(); 0 without NCCL
    std::string json_path;            ///< the file -J writes to, or ""
    std::vector<rank_device> devices; ///< one per rank, in rank order
    /// The MPI backend's all-reduce algorithm, forced or automatic; "" elsewhere.
    std::string algorithm;
    /// Where the MPI backend's tuning rules came from (UNISON_TUNING_FILE); "" for none.
    std::string tuning_rules;
    /// The algorithm that carries the collective at a size (the records' algorithm
    /// field); empty, or returning "", where there is no choice.
    std::function<std::string(std::size_t)> algorithm_at;
};

/// Receives results on rank 0 and writes them.
class reporter {
public:
    virtual ~reporter() = default;
    /// Before the first row.
    virtual void begin(const run_info& info) = 0;
    /// One row of the main table.
    virtual void row(const size_result& r) = 0;
    /// After the main table: the total of #wrong and the mean busbw.
    virtual void end_main(std::uint64_t wrong, double avg_busbw) = 0;
    /// Opens a baseline table; `description` says what was timed.
    virtual void begin_baseline(std::string_view name, std::string_view description) = 0;
    virtual void baseline_row(const size_result& r) = 0;
    /// A baseline that could not run, and why.
    virtual void skip_baseline(std::string_view name, std::string_view why) = 0;
    /// After everything.
    virtual void finish() = 0;
};

namespace detail {

inline std::string format(const char* fmt, double v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, fmt, v);
    return buf;
}

/// nccl-tests' getFloatStr: `value` in `width` columns, with fewer decimals as it
/// grows (two below 10^(width-3), ...) and in exponent form past the width.
inline std::string nccl_float(double value, int width) {
    int power = 0; // decimal digits of the integer part
    for (double v = 1; value >= v && power < 400; v *= 10) {
        ++power;
    }
    const char* fmt = power < width - 2   ? "%*.2f"
                      : power < width - 1 ? "%*.1f"
                      : power < width + 1 ? "%*.0f"
                      : width >= 7        ? "%*.1e"
                                          : "%*.0e";
    char buf[64];
    std::snprintf(buf, sizeof buf, fmt, width, value);
    return buf;
}

/// A ratio in six columns: fewer decimals as it grows.
inline std::string ratio_text(double r) {
    return format(r >= 1000.0 ? "%6.0f" : r >= 100.0 ? "%6.1f" : "%6.2f", r);
}

/// The data types of the run, as the header names them ("float", "int8,uint8,...").
inline std::string dtype_names(const bench_config& c) {
    std::string names;
    for (dtype t : c.types) {
        names += (names.empty() ? "" : ",") + std::string(to_string(t));
    }
    return names;
}

/// A JSON number, or null for a value that is not finite.
inline std::string json_number(double v, const char* fmt = "%.6g") {
    return std::isfinite(v) ? format(fmt, v) : std::string("null");
}

/// The time a side shows: the CPU time to issue the calls with -C 1, else the time
/// to complete them.
inline double shown_seconds(const bench_config& c, const side_result& s) {
    return c.report_cputime ? s.cpu_seconds : s.seconds;
}

/// "YYYY-MM-DD HH:MM:SS" in local time, nccl-tests' timestamps.
inline std::string local_time_now() {
    const std::time_t now = std::time(nullptr);
    std::tm parts{};
    char buf[64] = {};
    if (localtime_r(&now, &parts) != nullptr) {
        std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &parts);
    }
    return buf;
}

} // namespace detail

/// A rank's line under "# Using devices" as nccl-tests prints it: rank, group (always
/// 0: no NCCL_TESTS_SPLIT here), pid, host, then the device, its PCI address and its
/// name ("device  0 [0000:07:00] NVIDIA H100"); a host rank shows "device  - [host]"
/// and what it is ("thread 0", "MPI process").
inline std::string device_line(const rank_device& d) {
    char device[16] = " -";
    if (d.device) {
        std::snprintf(device, sizeof device, "%2d", *d.device);
    }
    char line[640];
    std::snprintf(line, sizeof line, "#  Rank %2d Group %2d Pid %6d on %10s device %s [%s] %s",
                  d.rank, 0, d.pid, d.host.c_str(), device,
                  d.bus_id.empty() ? "host" : d.bus_id.c_str(), d.info.c_str());
    return line;
}

/// nccl-tests' text output.
class text_reporter final : public reporter {
public:
    void begin(const run_info& info) override {
        info_ = info;
        const bench_config& c = *info.config;
        if (!info.json_path.empty()) {
            std::printf("# Writing JSON output to %s\n", info.json_path.c_str());
        }
        std::printf("# nccl-tests version unison-%s nccl-headers=%d nccl-library=%d\n",
                    version_string, info.nccl_headers, info.nccl_library);
        std::printf("# Collective test starting: %s\n", c.program_name.c_str());
        const bool by_bytes = c.steps_by_bytes();
        std::printf("# nThread %d nGpus %d minBytes %zu maxBytes %zu step: %zu(%s) warmup iters: "
                    "%d iters: %d agg iters: 1 validation: %d graph: 0 unalign: %d\n",
                    info.threads_per_process, info.devices_per_rank, c.min_bytes, c.max_bytes,
                    by_bytes ? c.step_bytes : c.step_factor, by_bytes ? "bytes" : "factor",
                    c.warmup_iters, c.iters, c.check ? 1 : 0, c.unalign);
        if (c.per_iter) {
            std::printf("# Per-Iteration Report: %s timing; i_* uses max over %s",
                        c.backend == backend_kind::nccl ? "CUDA event" : "host clock",
                        info.threads_per_process > 1 ? "ranks" : "process rows");
            if (c.per_iter_skip > 0) {
                std::printf("; summary skips first %d iterations", c.per_iter_skip);
            }
            std::printf(" \n");
        }
        std::printf(
            "# unison-bench: %s, backend %s, %d ranks, dtype %s, op %s, root %d%s%s%s\n",
            std::string(to_string(c.collective)).c_str(), std::string(to_string(c.backend)).c_str(),
            info.ranks, detail::dtype_names(c).c_str(), info.op_name.c_str(), info.root,
            c.rounds > 1 ? (", " + std::to_string(c.rounds) + " rounds (rows: the medians)").c_str()
                         : "",
            info.algorithm.empty() ? "" : (", all-reduce algorithm " + info.algorithm).c_str(),
            info.tuning_rules.empty() ? "" : (", tuning rules from " + info.tuning_rules).c_str());
        if (!c.neutral.empty()) {
            std::string given;
            for (const std::string& n : c.neutral) {
                given += (given.empty() ? "" : ", ") + n;
            }
            std::printf("# unison-bench: accepted without effect (nccl-tests options for NCCL "
                        "or CUDA, at their neutral values): %s\n",
                        given.c_str());
        }
        std::printf("#\n# Using devices\n");
        for (const rank_device& d : info.devices) {
            std::printf("%s\n", device_line(d).c_str());
        }
        std::printf("#\n");
        print_header(false);
        std::fflush(stdout);
    }

    void row(const size_result& r) override { print_row(r, false); }

    void end_main(std::uint64_t wrong, double avg_busbw) override {
        std::printf("# %-20s : %llu %s\n", "Out of bounds values",
                    static_cast<unsigned long long>(wrong), wrong == 0 ? "OK" : "FAILED");
        const bench_config& c = *info_.config;
        std::printf("# %-20s : %g %s\n#\n", "Avg bus bandwidth", avg_busbw,
                    c.min_busbw < 0                 ? ""
                    : below_threshold(c, avg_busbw) ? "FAILED"
                                                    : "OK");
        std::printf("# Collective test concluded: %s\n#\n", c.program_name.c_str());
        std::fflush(stdout);
    }

    void begin_baseline(std::string_view name, std::string_view description) override {
        close_baseline();
        std::printf("# Baseline %.*s: %.*s\n", static_cast<int>(name.size()), name.data(),
                    static_cast<int>(description.size()), description.data());
        std::printf("# ratio = unison's time / the baseline's time (above 1: unison is slower)\n"
                    "# (after nccl-tests' closing line, its rows start with '#' and its header "
                    "names no nccl-tests column group, so that parsers of nccl-tests' logs read "
                    "the main table alone)\n");
        print_header(true);
        baseline_open_ = true;
        std::fflush(stdout);
    }

    void baseline_row(const size_result& r) override { print_row(r, true); }

    void skip_baseline(std::string_view name, std::string_view why) override {
        close_baseline();
        std::printf("# Baseline %.*s: skipped: %.*s\n#\n", static_cast<int>(name.size()),
                    name.data(), static_cast<int>(why.size()), why.data());
        std::fflush(stdout);
    }

    void finish() override {
        close_baseline();
        std::printf("\n"); // nccl-tests' last line: its error report, empty without one
        std::fflush(stdout);
    }

private:
    /// The columns before the sides: "# %10s  %12s  %8s  %6s  %6s", 50 wide.
    static constexpr int prefix_width = 50;

    void close_baseline() {
        if (baseline_open_) {
            std::printf("#\n");
            baseline_open_ = false;
        }
    }

    /// nccl-tests' three header lines (labels, names, units), each ending in the
    /// timestamp column's label (-S) or the space nccl-tests leaves for it. -I adds
    /// i_min, i_max, i_p99 and i_cv% to each side. A baseline's sides have one more
    /// column, the ratio, and its labels are not nccl-tests' ("out-of-place"), which
    /// parsers look for.
    void print_header(bool baseline) const {
        const bench_config& c = *info_.config;
        const char* time = c.report_cputime ? "cputime" : "time";
        const bool per_iter = c.per_iter && !baseline;
        const int stamp_width = c.timestamps && !baseline ? 19 : 0;
        if (!baseline && !per_iter) {
            std::printf("# %10s  %12s  %8s  %6s  %6s           out-of-place                     "
                        "  in-place          \n",
                        "", "", "", "", "");
        } else if (per_iter) {
            std::printf("# %10s  %12s  %8s  %6s  %6s              out-of-place (+ per-iteration) "
                        "                               in-place (+ per-iteration)\n",
                        "", "", "", "", "");
        } else {
            constexpr int side_width = 41; // "  %7s  %6s  %6s  %6s  %6s"
            std::string line(prefix_width + 2 * side_width, ' ');
            line[0] = '#';
            auto place = [&](std::string_view label, int side) {
                const auto end =
                    static_cast<std::size_t>(prefix_width + (side + 1) * side_width - 6);
                line.replace(end - label.size(), label.size(), label);
            };
            place("baseline, out of place", 0);
            place("baseline, in place", 1);
            while (line.back() == ' ') {
                line.pop_back();
            }
            std::printf("%s\n", line.c_str());
        }
        const char* names[2][5] = {{"size", "count", "type", "redop", "root"},
                                   {"(B)", "(elements)", "", "", ""}};
        const char* sides[2][5] = {{time, "algbw", "busbw", "#wrong", "ratio"},
                                   {"(us)", "(GB/s)", "(GB/s)", "", "(x)"}};
        const char* iters[2][4] = {{"i_min", "i_max", "i_p99", "i_cv%"},
                                   {"(us)", "(us)", "(us)", "(%)"}};
        const char* stamp[2] = {c.timestamps ? "timestamp" : "",
                                c.timestamps ? "%Y-%m-%d %H:%M:%S" : ""};
        for (int l = 0; l < 2; ++l) {
            std::printf("# %10s  %12s  %8s  %6s  %6s", names[l][0], names[l][1], names[l][2],
                        names[l][3], names[l][4]);
            for (int side = 0; side < 2; ++side) {
                std::printf("  %7s  %6s  %6s  %6s", sides[l][0], sides[l][1], sides[l][2],
                            sides[l][3]);
                if (per_iter) {
                    std::printf("  %7s  %7s  %7s  %7s", iters[l][0], iters[l][1], iters[l][2],
                                iters[l][3]);
                }
                if (baseline) {
                    std::printf("  %6s", sides[l][4]);
                }
            }
            std::printf(" %*s\n", stamp_width, stamp_width > 0 ? stamp[l] : "");
        }
    }

    /// A row as nccl-tests prints it; a baseline's is a comment line ('#' in place of
    /// the size's first column), which nccl-tests' log parsers skip.
    void print_row(const size_result& r, bool baseline) {
        const bench_config& c = *info_.config;
        std::printf(baseline ? "#%11zu  %12zu  %8s  %6s  %6d" : "%12zu  %12zu  %8s  %6s  %6d",
                    r.shape.size_bytes(), r.shape.count, std::string(to_string(r.type)).c_str(),
                    r.op_name.c_str(), info_.root);
        for (const side_result* s : {&r.out_of_place, &r.in_place}) {
            const std::string time = detail::nccl_float(detail::shown_seconds(c, *s) * 1e6, 7);
            const std::string algbw = detail::nccl_float(s->algbw, 6);
            const std::string busbw = s->busbw ? detail::nccl_float(*s->busbw, 6) : "N/A";
            if (s->wrong) {
                std::printf("  %7s  %6s  %6s  %6g", time.c_str(), algbw.c_str(), busbw.c_str(),
                            static_cast<double>(*s->wrong));
            } else {
                std::printf("  %7s  %6s  %6s    N/A", time.c_str(), algbw.c_str(), busbw.c_str());
            }
            if (!baseline && s->per_iter) {
                const per_iteration& p = *s->per_iter;
                std::printf("  %7s  %7s  %7s  %7s", detail::nccl_float(p.min_us, 7).c_str(),
                            detail::nccl_float(p.max_us, 7).c_str(),
                            detail::nccl_float(p.p99_us, 7).c_str(),
                            detail::nccl_float(p.cv_pct, 7).c_str());
            }
            if (baseline) {
                std::printf("  %6s", s->ratio ? detail::ratio_text(*s->ratio).c_str() : "N/A");
            }
        }
        if (c.timestamps && !baseline) {
            std::printf("%21s", detail::local_time_now().c_str());
        }
        std::printf("\n");
        std::fflush(stdout);
    }

    run_info info_;
    bool baseline_open_ = false;
};

/// Flat records, shared by the JSON and CSV writers.
class record_reporter : public reporter {
public:
    void begin(const run_info& info) override {
        info_ = info;
        table_ = "unison";
        begin_document();
    }
    void row(const size_result& r) override { record(r); }
    void end_main(std::uint64_t wrong, double avg_busbw) override {
        wrong_ = wrong;
        avg_busbw_ = avg_busbw;
    }
    void begin_baseline(std::string_view name, std::string_view description) override {
        table_ = std::string(name);
        notes_.push_back({std::string(name), std::string(description), false});
    }
    void baseline_row(const size_result& r) override { record(r); }
    void skip_baseline(std::string_view name, std::string_view why) override {
        notes_.push_back({std::string(name), std::string(why), true});
    }

protected:
    struct note {
        std::string name;
        std::string text;
        bool skipped;
    };

    /// One field: its key and its value as the format writes it (nullopt: null).
    struct field {
        std::string_view key;
        std::optional<std::string> value;
        bool quoted;
    };

    virtual void begin_document() = 0;
    virtual void write_record(const std::vector<field>& fields) = 0;

    std::vector<field> fields_of(const size_result& r) const {
        const bench_config& c = *info_.config;
        auto text = [](std::string_view v) { return std::optional<std::string>(std::string(v)); };
        auto number = [](double v) {
            return std::isfinite(v) ? std::optional<std::string>(detail::format("%.6g", v))
                                    : std::nullopt;
        };
        std::vector<field> f = {
            {"table", text(table_), true},
            {"backend", text(to_string(c.backend)), true},
            {"collective", text(to_string(c.collective)), true},
            {"ranks", std::to_string(info_.ranks), false},
            {"dtype", text(to_string(r.type)), true},
            {"op", r.op_name, true},
            {"root", std::to_string(info_.root), false},
            {"size", std::to_string(r.shape.size_bytes()), false},
            {"count", std::to_string(r.shape.count), false},
        };
        static constexpr std::string_view keys[2][5] = {
            {"oop_time_us", "oop_algbw", "oop_busbw", "oop_wrong", "oop_ratio"},
            {"ip_time_us", "ip_algbw", "ip_busbw", "ip_wrong", "ip_ratio"}};
        int side = 0;
        for (const side_result* s : {&r.out_of_place, &r.in_place}) {
            f.push_back(
                {keys[side][0], detail::format("%.3f", detail::shown_seconds(c, *s) * 1e6), false});
            f.push_back({keys[side][1], number(s->algbw), false});
            f.push_back({keys[side][2], s->busbw ? number(*s->busbw) : std::nullopt, false});
            f.push_back(
                {keys[side][3],
                 s->wrong ? std::optional<std::string>(std::to_string(*s->wrong)) : std::nullopt,
                 false});
            f.push_back({keys[side][4], s->ratio ? number(*s->ratio) : std::nullopt, false});
            if (c.per_iter) { // -I: the text table's i_* columns
                static constexpr std::string_view iter_keys[2][4] = {
                    {"oop_i_min_us", "oop_i_max_us", "oop_i_p99_us", "oop_i_cv_pct"},
                    {"ip_i_min_us", "ip_i_max_us", "ip_i_p99_us", "ip_i_cv_pct"}};
                const per_iteration* p = s->per_iter ? &*s->per_iter : nullptr;
                const double values[4] = {p ? p->min_us : NAN, p ? p->max_us : NAN,
                                          p ? p->p99_us : NAN, p ? p->cv_pct : NAN};
                for (int k = 0; k < 4; ++k) {
                    f.push_back({iter_keys[side][k], number(values[k]), false});
                }
            }
            ++side;
        }
        const std::string ran = info_.algorithm_at && table_ == "unison"
                                    ? info_.algorithm_at(r.shape.size_bytes())
                                    : "";
        f.push_back({"algorithm", ran.empty() ? std::nullopt : text(ran), true});
        // What the run asked for (automatic: the tuning, and any tuning rules), so
        // that a sweep's automatic rows can be told from the forced ones.
        f.push_back({"requested",
                     table_ == "unison" && !info_.algorithm.empty()
                         ? text(info_.algorithm + (info_.tuning_rules.empty() ? "" : "+rules"))
                         : std::nullopt,
                     true});
        return f;
    }

    run_info info_;
    std::string table_;
    std::uint64_t wrong_ = 0;
    double avg_busbw_ = 0;
    std::vector<note> notes_;

private:
    void record(const size_result& r) {
        write_record(fields_of(r));
        std::fflush(stdout);
    }
};

namespace detail {

/// Length of the UTF-8 sequence at the start of `s`, or 0 when it is not one
/// (a stray continuation byte, an overlong form, a surrogate, a cut-off end).
inline std::size_t utf8_length(std::string_view s) {
    const auto byte = [&](std::size_t i) { return static_cast<unsigned char>(s[i]); };
    const unsigned char lead = byte(0);
    std::size_t n = 0;
    unsigned char lo = 0x80;
    unsigned char hi = 0xBF;
    if (lead >= 0xC2 && lead <= 0xDF) {
        n = 2;
    } else if (lead >= 0xE0 && lead <= 0xEF) {
        n = 3;
        lo = lead == 0xE0 ? 0xA0 : 0x80;
        hi = lead == 0xED ? 0x9F : 0xBF;
    } else if (lead >= 0xF0 && lead <= 0xF4) {
        n = 4;
        lo = lead == 0xF0 ? 0x90 : 0x80;
        hi = lead == 0xF4 ? 0x8F : 0xBF;
    } else {
        return 0;
    }
    if (s.size() < n || byte(1) < lo || byte(1) > hi) {
        return 0;
    }
    for (std::size_t i = 2; i < n; ++i) {
        if (byte(i) < 0x80 || byte(i) > 0xBF) {
            return 0;
        }
    }
    return n;
}

} // namespace detail

/// Escapes `s` for a JSON string literal. Bytes that are not UTF-8 become U+FFFD,
/// so that the document stays valid whatever a command line or an environment holds.
inline std::string json_quote(std::string_view s) {
    std::string out = "\"";
    for (std::size_t i = 0; i < s.size();) {
        const char ch = s[i];
        if (static_cast<unsigned char>(ch) >= 0x80) {
            const std::size_t n = detail::utf8_length(s.substr(i));
            if (n == 0) {
                out += "\\ufffd";
                ++i;
            } else {
                out.append(s.substr(i, n));
                i += n;
            }
            continue;
        }
        switch (ch) {
        case '"':
            out += "\\\"";
            break;
        case '\\':
            out += "\\\\";
            break;
        case '\n':
            out += "\\n";
            break;
        case '\t':
            out += "\\t";
            break;
        default:
            if (static_cast<unsigned char>(ch) < 0x20) {
                char buf[8];
                std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(ch));
                out += buf;
            } else {
                out += ch;
            }
        }
        ++i;
    }
    return out + "\"";
}

/// One JSON document: the run's parameters, "results" (one flat record per size
/// and table), "baselines" (what each baseline timed, or why it was skipped) and
/// "summary" (nccl-tests' closing lines).
class json_reporter final : public record_reporter {
public:
    void finish() override {
        std::printf("\n  ],\n  \"baselines\": [");
        bool first = true;
        for (const note& n : notes_) {
            std::printf("%s\n    {\"name\": %s, \"%s\": %s}", first ? "" : ",",
                        json_quote(n.name).c_str(), n.skipped ? "skipped" : "description",
                        json_quote(n.text).c_str());
            first = false;
        }
        const bench_config& c = *info_.config;
        const std::string threshold =
            c.min_busbw < 0
                ? std::string()
                : ", \"min_busbw\": " + detail::json_number(c.min_busbw) +
                      ", \"busbw_ok\": " + (below_threshold(c, avg_busbw_) ? "false" : "true");
        std::printf("%s],\n  \"summary\": {\"out_of_bounds\": %llu, \"avg_busbw\": %s%s}\n}\n",
                    first ? "" : "\n  ", static_cast<unsigned long long>(wrong_),
                    detail::json_number(avg_busbw_).c_str(), threshold.c_str());
        std::fflush(stdout);
    }

private:
    void begin_document() override {
        const bench_config& c = *info_.config;
        std::printf("{\n  \"benchmark\": \"unison-bench\",\n");
        std::printf("  \"backend\": %s,\n  \"collective\": %s,\n  \"ranks\": %d,\n",
                    json_quote(to_string(c.backend)).c_str(),
                    json_quote(to_string(c.collective)).c_str(), info_.ranks);
        std::printf("  \"dtype\": %s,\n  \"op\": %s,\n  \"root\": %d,\n",
                    json_quote(detail::dtype_names(c)).c_str(), json_quote(info_.op_name).c_str(),
                    info_.root);
        std::printf("  \"min_bytes\": %zu,\n  \"max_bytes\": %zu,\n  \"step_factor\": %zu,\n",
                    c.min_bytes, c.max_bytes, c.step_factor);
        std::printf("  \"iters\": %d,\n  \"warmup_iters\": %d,\n  \"rounds\": %d,\n"
                    "  \"check\": %s,\n",
                    c.iters, c.warmup_iters, c.rounds, c.check ? "true" : "false");
        std::printf("  \"results\": [");
        std::fflush(stdout);
    }

    void write_record(const std::vector<field>& fields) override {
        std::printf("%s\n    {", first_ ? "" : ",");
        first_ = false;
        bool first_field = true;
        for (const field& f : fields) {
            std::printf("%s\"%.*s\": %s", first_field ? "" : ", ", static_cast<int>(f.key.size()),
                        f.key.data(),
                        !f.value   ? "null"
                        : f.quoted ? json_quote(*f.value).c_str()
                                   : f.value->c_str());
            first_field = false;
        }
        std::printf("}");
    }

    bool first_ = true;
};

/// CSV: a header line, then one line per size and table; empty cells are nulls.
/// Baselines that could not run are reported on stderr.
class csv_reporter final : public record_reporter {
public:
    void finish() override {
        for (const note& n : notes_) {
            if (n.skipped) {
                std::fprintf(stderr, "unison-bench: baseline %s skipped: %s\n", n.name.c_str(),
                             n.text.c_str());
            }
        }
        std::fflush(stdout);
    }

private:
    void begin_document() override {}

    void write_record(const std::vector<field>& fields) override {
        if (!header_written_) {
            bool first = true;
            for (const field& f : fields) {
                std::printf("%s%.*s", first ? "" : ",", static_cast<int>(f.key.size()),
                            f.key.data());
                first = false;
            }
            std::printf("\n");
            header_written_ = true;
        }
        bool first = true;
        for (const field& f : fields) {
            std::printf("%s%s", first ? "" : ",", f.value ? f.value->c_str() : "");
            first = false;
        }
        std::printf("\n");
    }

    bool header_written_ = false;
};

/// nccl-tests' JSON file (-J), in the layout nccl-tests 2.19 writes (its
/// src/util.cu, file "version" 3), one object:
///   version, start_time, args (the command line), env (the environment),
///   nccl_version, config {nthreads, ngpus, minimum_bytes, maximum_bytes,
///   step_factor or step_bytes, warmup_iters, iterations, aggregated_iterations,
///   validation, graph, blocking_collectives, per_iter_timing, per_iter_skip,
///   parallel_init, devices [{rank, group, pid, hostname, device, device_hex,
///   device_info}]}, results [{size, count, type, redop, root, out_of_place {time,
///   alg_bw, bus_bw, nwrong}, out_of_place_per_iter (-I), in_place {...},
///   in_place_per_iter (-I), actual_iterations, experiment_name}], out_of_bounds
///   {count, okay}, average_bus_bandwidth {bandwidth, okay}, errors, end_time.
/// A per_iter object holds skipped_iterations, min_us, max_us, avg_us, p50_us,
/// p95_us, p99_us, stdev_us, cv_pct, times_us (every iteration, the slowest rank's)
/// and, with several processes, per_process_max_times_us (each process's list), as
/// nccl-tests' tools/analyze_perf_json.py reads them.
/// Types are nccl-tests' own: flags and "okay" are the strings "true" and "false"
/// ("unchecked" for a bandwidth without threshold), root is the text column
/// ("    -1"), nwrong a number; times are in us ("cpu_time" instead of "time" with
/// -C 1), bandwidths in GB/s. Where a field means nothing here: nccl_version is
/// null without NCCL, a host rank's device and device_hex are null, and a number
/// that is not finite is null (nccl-tests writes "nan"). Two more keys are
/// unison-bench's, and a reader of nccl-tests' layout skips them: "unison" (version,
/// program, backend, collective, ranks, dtype, op, average, report_cputime) and
/// "unison_baselines" (per baseline: name, description and results as above with a
/// "ratio" on each side, or name and "skipped": why).
class nccl_tests_json_reporter final : public reporter {
public:
    /// Creates the file as nccl-tests does, never over an existing one: `path`, else
    /// the first of `path`.0, `path`.1, ... that does not exist. Throws
    /// std::runtime_error when it cannot.
    explicit nccl_tests_json_reporter(const std::string& path) {
        std::string attempt = path;
        for (int n = 0;; ++n) {
            file_ = std::fopen(attempt.c_str(), "wx");
            if (file_ != nullptr) {
                break;
            }
            if (errno != EEXIST) {
                throw std::runtime_error("-J: cannot create '" + attempt +
                                         "': " + std::strerror(errno));
            }
            attempt = path + "." + std::to_string(n);
        }
        path_ = attempt;
    }
    nccl_tests_json_reporter(const nccl_tests_json_reporter&) = delete;
    nccl_tests_json_reporter& operator=(const nccl_tests_json_reporter&) = delete;
    ~nccl_tests_json_reporter() override {
        if (file_ != nullptr) {
            std::fclose(file_);
        }
    }

    /// The file written to (`path` or the name that replaced it).
    const std::string& path() const noexcept { return path_; }

    void begin(const run_info& info) override {
        info_ = info;
        const bench_config& c = *info.config;
        put("{\"version\":3,\"start_time\":" + json_quote(detail::local_time_now()));
        put(",\n\"args\":[");
        write_list(c.command_line);
        put("],\n\"env\":[");
        std::vector<std::string> env;
        for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
            env.emplace_back(*e);
        }
        write_list(env);
        put("],\n\"nccl_version\":" +
            (info.nccl_library != 0 ? std::to_string(info.nccl_library) : "null"));
        put(",\n\"unison\":{\"version\":" + json_quote(version_string) + ",\"program\":" +
            json_quote(c.program_name) + ",\"backend\":" + json_quote(to_string(c.backend)) +
            ",\"collective\":" + json_quote(to_string(c.collective)) + ",\"ranks\":" +
            std::to_string(info.ranks) + ",\"dtype\":" + json_quote(detail::dtype_names(c)) +
            ",\"op\":" + json_quote(info.op_name) + ",\"average\":" + std::to_string(c.average) +
            ",\"report_cputime\":" + (c.report_cputime ? "1" : "0") +
            ",\"rounds\":" + std::to_string(c.rounds) + "}");

        const bool by_bytes = c.steps_by_bytes();
        put(",\n\"config\":{\"nthreads\":" + std::to_string(info.threads_per_process) +
            ",\"ngpus\":" + std::to_string(info.devices_per_rank) + ",\"minimum_bytes\":" +
            std::to_string(c.min_bytes) + ",\"maximum_bytes\":" + std::to_string(c.max_bytes) +
            (by_bytes ? ",\"step_bytes\":" + std::to_string(c.step_bytes)
                      : ",\"step_factor\":" + std::to_string(c.step_factor)) +
            ",\"warmup_iters\":" + std::to_string(c.warmup_iters) +
            ",\"iterations\":" + std::to_string(c.iters) +
            ",\"aggregated_iterations\":1,\"validation\":" + (c.check ? "1" : "0") +
            ",\"graph\":0,\"blocking_collectives\":\"false\",\"per_iter_timing\":" +
            (c.per_iter ? "\"true\"" : "\"false\"") + ",\"per_iter_skip\":" +
            std::to_string(c.per_iter_skip) + ",\"parallel_init\":\"false\",\"devices\":[");
        bool first = true;
        for (const rank_device& d : info.devices) {
            put(std::string(first ? "" : ",") + "\n{\"rank\":" + std::to_string(d.rank) +
                ",\"group\":0,\"pid\":" + std::to_string(d.pid) +
                ",\"hostname\":" + json_quote(d.host) +
                ",\"device\":" + (d.device ? std::to_string(*d.device) : "null") +
                ",\"device_hex\":" + (d.bus_id.empty() ? "null" : json_quote(d.bus_id)) +
                ",\"device_info\":" + json_quote(d.info) + "}");
            first = false;
        }
        put("]},\n\"results\":[");
        first_row_ = true;
        flush();
    }

    void row(const size_result& r) override { write_row(r, false); }

    void end_main(std::uint64_t wrong, double avg_busbw) override {
        const bench_config& c = *info_.config;
        put("],\n\"out_of_bounds\":{\"count\":" + std::to_string(wrong) +
            ",\"okay\":" + (wrong == 0 ? "\"true\"" : "\"false\"") + "}");
        put(",\n\"average_bus_bandwidth\":{\"bandwidth\":" + number(avg_busbw) + ",\"okay\":" +
            (c.min_busbw < 0                 ? "\"unchecked\""
             : below_threshold(c, avg_busbw) ? "\"false\""
                                             : "\"true\"") +
            "}");
        flush();
    }

    void begin_baseline(std::string_view name, std::string_view description) override {
        next_baseline();
        put("{\"name\":" + json_quote(name) + ",\"description\":" + json_quote(description) +
            ",\"results\":[");
        baseline_open_ = true;
        first_row_ = true;
        flush();
    }

    void baseline_row(const size_result& r) override { write_row(r, true); }

    void skip_baseline(std::string_view name, std::string_view why) override {
        next_baseline();
        put("{\"name\":" + json_quote(name) + ",\"skipped\":" + json_quote(why) + "}");
        flush();
    }

    void finish() override {
        close_baseline();
        put(baselines_ == 0 ? ",\n\"unison_baselines\":[]" : "]");
        put(",\n\"errors\":[],\n\"end_time\":" + json_quote(detail::local_time_now()) + "}\n");
        const bool written = std::fflush(file_) == 0 && !std::ferror(file_);
        const int closed = std::fclose(file_);
        file_ = nullptr;
        if (!written || closed != 0) {
            throw std::runtime_error("-J: writing '" + path_ + "' failed");
        }
    }

private:
    void put(const std::string& text) { std::fputs(text.c_str(), file_); }
    void flush() { std::fflush(file_); }

    /// A number as nccl-tests writes its doubles ("%lf"), or null.
    static std::string number(double v) { return detail::json_number(v, "%f"); }

    void write_list(const std::vector<std::string>& items) {
        bool first = true;
        for (const std::string& item : items) {
            if (!first) {
                put(",");
            }
            put(json_quote(item));
            first = false;
        }
    }

    void write_numbers(const std::vector<double>& values) {
        put("[");
        bool first = true;
        for (double v : values) {
            // Two puts, not `(first ? "" : ",") + number(v)`: GCC 12 warns of an
            // overlapping memcpy in that string's insert (-Wrestrict, a false alarm).
            if (!first) {
                put(",");
            }
            put(number(v));
            first = false;
        }
        put("]");
    }

    void write_per_iteration(const char* key, const per_iteration& p) {
        put(std::string(",\"") + key + "\":{\"skipped_iterations\":" + std::to_string(p.skipped) +
            ",\"min_us\":" + number(p.min_us) + ",\"max_us\":" + number(p.max_us) +
            ",\"avg_us\":" + number(p.avg_us) + ",\"p50_us\":" + number(p.p50_us) +
            ",\"p95_us\":" + number(p.p95_us) + ",\"p99_us\":" + number(p.p99_us) +
            ",\"stdev_us\":" + number(p.stdev_us) + ",\"cv_pct\":" + number(p.cv_pct) +
            ",\"times_us\":");
        write_numbers(p.times_us);
        if (p.per_process_us.size() > 1) {
            put(",\"per_process_max_times_us\":[");
            bool first = true;
            for (const std::vector<double>& row : p.per_process_us) {
                put(first ? "" : ",");
                write_numbers(row);
                first = false;
            }
            put("]");
        }
        put("}");
    }

    /// Closes the results of the baseline being written, if any.
    void close_baseline() {
        if (baseline_open_) {
            put("]}");
            baseline_open_ = false;
        }
    }

    /// Closes the baseline being written, if any, and opens the next one's place
    /// in "unison_baselines" (the key itself before the first).
    void next_baseline() {
        close_baseline();
        put(baselines_ == 0 ? ",\n\"unison_baselines\":[\n" : ",\n");
        ++baselines_;
    }

    void write_row(const size_result& r, bool baseline) {
        const bench_config& c = *info_.config;
        char head[256];
        std::snprintf(head, sizeof head,
                      "%s\n{\"size\":%zu,\"count\":%zu,\"type\":%s,\"redop\":%s,\"root\":\"%6d\"",
                      first_row_ ? "" : ",", r.shape.size_bytes(), r.shape.count,
                      json_quote(to_string(r.type)).c_str(), json_quote(r.op_name).c_str(),
                      info_.root);
        put(head);
        first_row_ = false;
        const char* side_keys[] = {"out_of_place", "in_place"};
        int side = 0;
        for (const side_result* s : {&r.out_of_place, &r.in_place}) {
            put(std::string(",\"") + side_keys[side++] + "\":{\"" +
                (c.report_cputime ? "cpu_time" : "time") + "\":" +
                number(detail::shown_seconds(c, *s) * 1e6) + ",\"alg_bw\":" + number(s->algbw) +
                ",\"bus_bw\":" + (s->busbw ? number(*s->busbw) : "null") +
                ",\"nwrong\":" + (s->wrong ? number(static_cast<double>(*s->wrong)) : "null") +
                (baseline ? ",\"ratio\":" + (s->ratio ? number(*s->ratio) : "null") : "") + "}");
            if (!baseline && s->per_iter) {
                write_per_iteration(side == 1 ? "out_of_place_per_iter" : "in_place_per_iter",
                                    *s->per_iter);
            }
        }
        put(",\"actual_iterations\":" + std::to_string(c.iters) + ",\"experiment_name\":\"\"}");
        flush();
    }

    std::FILE* file_ = nullptr;
    std::string path_;
    run_info info_;
    bool first_row_ = true;
    bool baseline_open_ = false;
    int baselines_ = 0;
};

/// Sends everything to two reporters: stdout's and the -J file's.
class tee_reporter final : public reporter {
public:
    tee_reporter(std::unique_ptr<reporter> first, std::unique_ptr<reporter> second)
        : first_(std::move(first)), second_(std::move(second)) {}

    void begin(const run_info& info) override {
        first_->begin(info);
        second_->begin(info);
    }
    void row(const size_result& r) override {
        first_->row(r);
        second_->row(r);
    }
    void end_main(std::uint64_t wrong, double avg_busbw) override {
        first_->end_main(wrong, avg_busbw);
        second_->end_main(wrong, avg_busbw);
    }
    void begin_baseline(std::string_view name, std::string_view description) override {
        first_->begin_baseline(name, description);
        second_->begin_baseline(name, description);
    }
    void baseline_row(const size_result& r) override {
        first_->baseline_row(r);
        second_->baseline_row(r);
    }
    void skip_baseline(std::string_view name, std::string_view why) override {
        first_->skip_baseline(name, why);
        second_->skip_baseline(name, why);
    }
    void finish() override {
        first_->finish();
        second_->finish();
    }

private:
    std::unique_ptr<reporter> first_;
    std::unique_ptr<reporter> second_;
};

/// The reporter for `format`.
inline std::unique_ptr<reporter> make_reporter(output_format format) {
    switch (format) {
    case output_format::json:
        return std::make_unique<json_reporter>();
    case output_format::csv:
        return std::make_unique<csv_reporter>();
    case output_format::text:
        break;
    }
    return std::make_unique<text_reporter>();
}

/// Rank 0's reporter: stdout's as --format says, and with -J the JSON file too,
/// created here (`info.json_path` gets its name). Throws std::runtime_error when
/// the file cannot be created.
inline std::unique_ptr<reporter> make_reporter(const bench_config& cfg, run_info& info) {
    std::unique_ptr<reporter> out = make_reporter(cfg.format);
    if (cfg.json_path.empty()) {
        return out;
    }
    auto file = std::make_unique<nccl_tests_json_reporter>(cfg.json_path);
    info.json_path = file->path();
    return std::make_unique<tee_reporter>(std::move(out), std::move(file));
}

} // namespace unison::bench
