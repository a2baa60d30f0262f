#pragma once

/// \file
/// unison-bench's output: nccl-tests' text table, or one flat record per size in
/// JSON or CSV. Rows are written as soon as they are measured (stdout is flushed
/// after each), so a long run shows progress and a crash keeps what was measured.
///
/// Every record carries the run's metadata (table, backend, collective, ranks,
/// dtype, op, root) and the same columns in every format:
///   size, count, then for oop_ (out of place) and ip_ (in place):
///   time_us, algbw, busbw (GB/s), wrong (elements) and ratio (baselines only:
///   unison's time over the baseline's). `table` is "unison" for the main rows and
///   the baseline's name ("raw-mpi", "local-add") for the others.

#include "bench_config.hpp"
#include "collective_shape.hpp"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace unison::bench {

/// One side (out of place or in place) of one row.
struct side_result {
    double seconds = 0;                 ///< mean per call, over the ranks as -a says
    double algbw = 0;                   ///< GB/s
    std::optional<double> busbw;        ///< GB/s; none where it means nothing (local-add)
    std::optional<std::uint64_t> wrong; ///< none when not checked
    std::optional<double> ratio;        ///< unison's time / this time (baselines)
};

/// One size: what nccl-tests prints on one line.
struct size_result {
    collective_shape shape;
    side_result out_of_place;
    side_result in_place;
};

/// What the header and every record say about the run.
struct run_info {
    const bench_config* config = nullptr;
    int ranks = 0;
    int root = -1;       ///< -1 unless the collective has a root (nccl-tests prints -1)
    std::string op_name; ///< "none" for collectives without a reduction (nccl-tests)
    std::vector<std::string> rank_lines; ///< "Rank 0 Pid ... on host device ..." per rank
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

/// nccl-tests' time column: fewer decimals as the time grows.
inline std::string time_text(double seconds) {
    const double us = seconds * 1e6;
    return format(us >= 10000.0 ? "%7.0f" : us >= 100.0 ? "%7.1f" : "%7.2f", us);
}

/// A ratio in six columns: fewer decimals as it grows.
inline std::string ratio_text(double r) {
    return format(r >= 1000.0 ? "%6.0f" : r >= 100.0 ? "%6.1f" : "%6.2f", r);
}

inline std::string dtype_name(const run_info& info) {
    return std::string(to_string(info.config->type));
}

/// A JSON number, or null for a value that is not finite.
inline std::string json_number(double v, const char* fmt = "%.6g") {
    return std::isfinite(v) ? format(fmt, v) : std::string("null");
}

} // namespace detail

/// nccl-tests' text output.
class text_reporter final : public reporter {
public:
    void begin(const run_info& info) override {
        info_ = info;
        const bench_config& c = *info.config;
        std::printf("# unison-bench: %s, backend %s, %d ranks, dtype %s, op %s, root %d\n",
                    std::string(to_string(c.collective)).c_str(),
                    std::string(to_string(c.backend)).c_str(), info.ranks,
                    detail::dtype_name(info).c_str(), info.op_name.c_str(), info.root);
        const bool by_bytes = c.step_bytes > 0 && !c.step_factor_given;
        std::printf("# nRanks %d minBytes %zu maxBytes %zu step: %zu(%s) warmup iters: %d "
                    "iters: %d validation: %d\n",
                    info.ranks, c.min_bytes, c.max_bytes, by_bytes ? c.step_bytes : c.step_factor,
                    by_bytes ? "bytes" : "factor", c.warmup_iters, c.iters, c.check ? 1 : 0);
        std::printf("#\n# Using devices\n");
        for (const std::string& line : info.rank_lines) {
            std::printf("#  %s\n", line.c_str());
        }
        std::printf("#\n");
        print_header(false);
        std::fflush(stdout);
    }

    void row(const size_result& r) override { print_row(r, false); }

    void end_main(std::uint64_t wrong, double avg_busbw) override {
        std::printf("# Out of bounds values : %llu %s\n", static_cast<unsigned long long>(wrong),
                    wrong == 0 ? "OK" : "FAILED");
        const bench_config& c = *info_.config;
        std::printf("# Avg bus bandwidth    : %g %s\n#\n", avg_busbw,
                    c.min_busbw < 0                 ? ""
                    : below_threshold(c, avg_busbw) ? "FAILED"
                                                    : "OK");
        std::fflush(stdout);
    }

    void begin_baseline(std::string_view name, std::string_view description) override {
        std::printf("#\n# Baseline %.*s: %.*s\n", static_cast<int>(name.size()), name.data(),
                    static_cast<int>(description.size()), description.data());
        std::printf("# ratio = unison's time / the baseline's time (above 1: unison is slower)\n"
                    "# (its rows start with '#', so that parsers of nccl-tests' logs read the "
                    "main table alone)\n");
        print_header(true);
        std::fflush(stdout);
    }

    void baseline_row(const size_result& r) override { print_row(r, true); }

    void skip_baseline(std::string_view name, std::string_view why) override {
        std::printf("#\n# Baseline %.*s: skipped: %.*s\n", static_cast<int>(name.size()),
                    name.data(), static_cast<int>(why.size()), why.data());
        std::fflush(stdout);
    }

    void finish() override {
        std::printf("#\n");
        std::fflush(stdout);
    }

private:
    static constexpr int prefix_width = 52; // "%12s  %12s  %8s  %6s  %6s" with the '#'

    /// The two-label line above the columns: each label ends 8 columns before the
    /// end of its half, as in nccl-tests.
    static void print_side_labels(int side_width) {
        std::string line(static_cast<std::size_t>(prefix_width + 2 * side_width), ' ');
        line[0] = '#';
        auto place = [&](std::string_view label, int side) {
            const int end = prefix_width + (side + 1) * side_width - 8;
            line.replace(static_cast<std::size_t>(end - static_cast<int>(label.size())),
                         label.size(), label);
        };
        place("out-of-place", 0);
        place("in-place", 1);
        while (!line.empty() && line.back() == ' ') {
            line.pop_back();
        }
        std::printf("%s\n", line.c_str());
    }

    static void print_header(bool baseline) {
        const int side_width = baseline ? 39 : 31;
        print_side_labels(side_width);
        std::printf("#%11s  %12s  %8s  %6s  %6s", "size", "count", "type", "redop", "root");
        for (int side = 0; side < 2; ++side) {
            std::printf("  %7s  %6s  %6s %6s", "time", "algbw", "busbw", "#wrong");
            if (baseline) {
                std::printf("  %6s", "ratio");
            }
        }
        std::printf("\n");
        char units[256];
        int used = std::snprintf(units, sizeof units, "#%11s  %12s  %8s  %6s  %6s", "(B)",
                                 "(elements)", "", "", "");
        for (int side = 0; side < 2; ++side) {
            used += std::snprintf(units + used, sizeof units - static_cast<std::size_t>(used),
                                  "  %7s  %6s  %6s %6s", "(us)", "(GB/s)", "(GB/s)", "");
            if (baseline) {
                used += std::snprintf(units + used, sizeof units - static_cast<std::size_t>(used),
                                      "  %6s", "(x)");
            }
        }
        std::string line(units);
        while (!line.empty() && line.back() == ' ') {
            line.pop_back();
        }
        std::printf("%s\n", line.c_str());
    }

    /// A row; a baseline's is a comment line ('#' in place of the size's first
    /// column), which nccl-tests' log parsers skip.
    void print_row(const size_result& r, bool baseline) {
        std::printf(baseline ? "#%11zu  %12zu  %8s  %6s  %6d" : "%12zu  %12zu  %8s  %6s  %6d",
                    r.shape.size_bytes(), r.shape.count, detail::dtype_name(info_).c_str(),
                    info_.op_name.c_str(), info_.root);
        for (const side_result* s : {&r.out_of_place, &r.in_place}) {
            const std::string busbw = s->busbw ? detail::format("%6.2f", *s->busbw) : "N/A";
            const std::string wrong = s->wrong ? std::to_string(*s->wrong) : std::string("N/A");
            std::printf("  %7s  %6.2f  %6s  %5s", detail::time_text(s->seconds).c_str(), s->algbw,
                        busbw.c_str(), wrong.c_str());
            if (baseline) {
                std::printf("  %6s", s->ratio ? detail::ratio_text(*s->ratio).c_str() : "N/A");
            }
        }
        std::printf("\n");
        std::fflush(stdout);
    }

    run_info info_;
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
            {"dtype", text(to_string(c.type)), true},
            {"op", info_.op_name, true},
            {"root", std::to_string(info_.root), false},
            {"size", std::to_string(r.shape.size_bytes()), false},
            {"count", std::to_string(r.shape.count), false},
        };
        static constexpr std::string_view keys[2][5] = {
            {"oop_time_us", "oop_algbw", "oop_busbw", "oop_wrong", "oop_ratio"},
            {"ip_time_us", "ip_algbw", "ip_busbw", "ip_wrong", "ip_ratio"}};
        int side = 0;
        for (const side_result* s : {&r.out_of_place, &r.in_place}) {
            f.push_back({keys[side][0], detail::format("%.3f", s->seconds * 1e6), false});
            f.push_back({keys[side][1], number(s->algbw), false});
            f.push_back({keys[side][2], s->busbw ? number(*s->busbw) : std::nullopt, false});
            f.push_back(
                {keys[side][3],
                 s->wrong ? std::optional<std::string>(std::to_string(*s->wrong)) : std::nullopt,
                 false});
            f.push_back({keys[side][4], s->ratio ? number(*s->ratio) : std::nullopt, false});
            ++side;
        }
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

/// Escapes `s` for a JSON string literal.
inline std::string json_quote(std::string_view s) {
    std::string out = "\"";
    for (char ch : s) {
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
                std::snprintf(buf, sizeof buf, "\\u%04x", ch);
                out += buf;
            } else {
                out += ch;
            }
        }
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
                    json_quote(to_string(c.type)).c_str(), json_quote(info_.op_name).c_str(),
                    info_.root);
        std::printf("  \"min_bytes\": %zu,\n  \"max_bytes\": %zu,\n  \"step_factor\": %zu,\n",
                    c.min_bytes, c.max_bytes, c.step_factor);
        std::printf("  \"iters\": %d,\n  \"warmup_iters\": %d,\n  \"check\": %s,\n", c.iters,
                    c.warmup_iters, c.check ? "true" : "false");
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

} // namespace unison::bench
