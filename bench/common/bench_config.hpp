#pragma once

/// \file
/// unison-bench's command line: every option of nccl-tests 2.19 with its defaults
/// and its choice of collective by program name, plus the backend, the output
/// format and the baselines. nccl-tests' options that only steer NCCL or CUDA
/// (-g, -G, -z, -R, ...) are accepted with the values that mean "one" or "off" and
/// named in the header; other values are refused with the reason.

#include "collective_shape.hpp"

#include <unison/comm/algorithm.hpp>
#include <unison/core/detail/parse_bytes.hpp>
#include <unison/core/dtype.hpp>
#include <unison/core/reduce_op.hpp>

#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace unison::bench {

/// Which communicator the collectives run on.
enum class backend_kind : std::uint8_t { thread, mpi, nccl, gloo };

constexpr std::string_view to_string(backend_kind b) noexcept {
    switch (b) {
    case backend_kind::thread:
        return "thread";
    case backend_kind::mpi:
        return "mpi";
    case backend_kind::nccl:
        return "nccl";
    case backend_kind::gloo:
        return "gloo";
    }
    return "?";
}

/// How results are written to stdout.
enum class output_format : std::uint8_t { text, json, csv };

/// Everything one run of unison-bench is asked to do.
struct bench_config {
    // Defaults are nccl-tests 2.19's (src/common.cu).
    std::size_t min_bytes = std::size_t{32} << 20; ///< -b
    std::size_t max_bytes = std::size_t{32} << 20; ///< -e
    /// -f: sizes are multiplied by this when it is above 1; at 1 (the default) they
    /// grow by -i bytes, as in nccl-tests.
    std::size_t step_factor = 1;
    std::size_t step_bytes = std::size_t{1} << 20; ///< -i
    /// -T: seconds every wait may take (UNISON_TIMEOUT); 0: the environment's.
    int timeout_seconds = 0;
    int iters = 20;          ///< -n
    int warmup_iters = 1;    ///< -w: calls at every power-of-two multiple of -b up to -e
    bool check = true;       ///< -c
    int cycles = 1;          ///< -N: the table is timed this many times over
    int unalign = 0;         ///< -u: elements by which both buffers are misaligned
    bool per_iter = false;   ///< -I: every iteration timed alone, with i_* columns
    int per_iter_skip = 0;   ///< -K: leading iterations left out of the i_* columns
    bool timestamps = false; ///< -S: a timestamp at the end of every row
    /// -d: the data types timed, one table section each ("all": nccl-tests' list,
    /// those unison has); `type` is the one being timed.
    std::vector<dtype> types{dtype::f32};
    dtype type = dtype::f32;
    /// -o: the reductions timed ("all": sum, prod, max, min, avg); `op` is the one
    /// being timed.
    std::vector<reduce_op> ops{reduce_op::sum};
    reduce_op op = reduce_op::sum;
    collective_kind collective = collective_kind::all_reduce; ///< --collective
    bool collective_given = false;
    backend_kind backend = backend_kind::thread; ///< -B
    bool backend_given = false;
    /// -C 1: the time column is the CPU time taken to issue the -n calls (nccl-tests'
    /// report_cputime); algbw and busbw still come from the time to complete them.
    bool report_cputime = false;
    /// -J: nccl-tests' JSON file, written besides what goes to stdout; "" for none.
    std::string json_path;
    /// -a: the time reported per size, over the ranks: 0 rank 0's, 1 the mean
    /// (nccl-tests' default), 2 the least, 3 the most.
    int average = 1;
    /// --min-busbw, or 0.9 x NCCL_TESTS_MIN_BW as nccl-tests reads it: the run fails
    /// (exit status 1) when the main table's average bus bandwidth is below it. < 0:
    /// no threshold.
    double min_busbw = -1;
    int thread_ranks = 2; ///< -t (times -g): the thread backend's ranks
    bool thread_ranks_given = false;
    /// -g: nccl-tests' GPUs per thread. On the thread backend, -t x -g ranks (each
    /// a "device" of the one process, as in nccl-tests); elsewhere only 1, one
    /// device per rank.
    int devices_per_thread = 1;
    bool devices_given = false;
    int root = 0; ///< -r
    output_format format = output_format::text;
    bool baseline = false;
    /// --rounds: each size is timed this many times and its row holds the medians;
    /// with the raw-MPI baseline each round times unison and raw MPI back to back.
    int rounds = 1;
    /// --algorithm: the MPI backend's all-reduce algorithms to force, a run each;
    /// empty: the environment's (UNISON_ALGORITHM, else the tuning's).
    std::vector<algorithm> algorithms;
    bool help = false;
    bool version = false; // --version: print it and exit
    /// argv[0]'s last component: "unison-bench", or an nccl-tests binary's name such
    /// as "all_reduce_perf", which selects the collective.
    std::string program_name = "unison-bench";
    /// The command line as given, for the JSON file's "args".
    std::vector<std::string> command_line;
    /// nccl-tests' options given with the value that has no effect here ("-g 1"),
    /// each with why; the header names them.
    std::vector<std::string> neutral;

    /// Whether sizes grow by -i bytes rather than by the factor -f.
    bool steps_by_bytes() const noexcept { return step_factor <= 1; }
};

/// An nccl-tests option that steers only NCCL or CUDA: the value that leaves it
/// without effect ("one" or "off"), accepted and named in the header, and why any
/// other is refused.
struct nccl_tests_only_option {
    char letter;
    std::string_view long_name;
    std::string_view neutral; ///< the accepted value; "" when none is
    std::string_view why;
};

inline constexpr nccl_tests_only_option nccl_tests_only_options[] = {
    {'m', "agg_iters", "1", "calls are not aggregated into one group launch"},
    {'z', "blocking", "0",
     "calls are issued back to back as nccl-tests' -z 0 does; its blocking modes are not "
     "offered"},
    {'y', "stream_null", "0", "the NCCL backend uses its own stream"},
    {'G', "cudagraph", "0", "CUDA graphs are not captured"},
    {'R', "local_register", "0", "buffers are not registered with NCCL"},
    {'p', "parallel_init", "0", "communicators are created one at a time"},
    {'x', "cta_policy", "", "NCCL's CTA policy is not exposed"},
    {'D', "device_implementation", "0", "NCCL's device-side implementations are not exposed"},
    {'V', "device_cta_count", "16", "NCCL's device-side implementations are not exposed"},
    {'M', "memory", "0", "no device memory report"},
};

/// The entry for nccl-tests' option `letter`, or null.
constexpr const nccl_tests_only_option* find_nccl_tests_only(char letter) noexcept {
    for (const auto& o : nccl_tests_only_options) {
        if (o.letter == letter) {
            return &o;
        }
    }
    return nullptr;
}

/// nccl-tests' data type names, in its order for -d all; those unison has are timed.
inline constexpr std::string_view nccl_tests_type_names[] = {
    "int8", "uint8", "int32", "uint32", "int64", "uint64", "half", "float", "double", "bfloat16"};

/// nccl-tests' reductions, in its order for -o all.
inline constexpr reduce_op nccl_tests_ops[] = {reduce_op::sum, reduce_op::prod, reduce_op::max,
                                               reduce_op::min, reduce_op::avg};

/// Whether `avg_busbw` (GB/s) fails the run's threshold (--min-busbw).
inline bool below_threshold(const bench_config& cfg, double avg_busbw) {
    return cfg.min_busbw >= 0 && avg_busbw < cfg.min_busbw;
}

/// A command line unison-bench cannot run; main prints it and exits with 2.
class usage_error : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

/// The nccl-tests binary that times `c`: "all_reduce_perf", ...
inline std::string nccl_tests_program(collective_kind c) {
    return std::string(to_string(c)) + "_perf";
}

/// The collective a program name selects, as nccl-tests builds one binary per
/// collective: "all_gather_perf" selects all_gather; a name that does not end in
/// "_perf" (unison-bench's own) selects none. Throws usage_error for nccl-tests'
/// other binaries (reduce_perf, alltoall_perf, sendrecv_perf, ...), whose
/// collectives unison-bench does not time.
inline std::optional<collective_kind> collective_of_program(std::string_view name) {
    constexpr std::string_view suffix = "_perf";
    if (!name.ends_with(suffix)) {
        return std::nullopt;
    }
    if (const auto c = parse_collective(name.substr(0, name.size() - suffix.size()))) {
        return c;
    }
    std::string served;
    for (collective_kind c : all_collective_kinds) {
        served += (served.empty() ? "" : ", ") + nccl_tests_program(c);
    }
    throw usage_error("started as '" + std::string(name) +
                      "', which names no collective unison-bench times (" + served +
                      " do; or start it as unison-bench with --collective)");
}

/// The -h text.
inline std::string usage_text(std::string_view program) {
    std::string s = "usage: ";
    s += program;
    s += R"( [options]

Times unison's collectives the way NVIDIA's nccl-tests time NCCL, and prints the
same table (size, count, type, redop, root, then time, algbw, busbw and #wrong
out of place and in place).

Defaults are nccl-tests 2.19's, so that its command lines give the same rows.

  -b, --minbytes <size>      smallest size in bytes, with an optional K, M or G
                             (x1024) and fractions as nccl-tests reads them
                             ("1.5K" is 1536) [32M]
  -e, --maxbytes <size>      largest size [32M]
  -f, --stepfactor <n>       multiply the size by n at each step; 1: add -i bytes
                             instead [1]
  -i, --stepbytes <size>     bytes added at each step when -f is 1 [1M]
  -n, --iters <n>            timed iterations per size [20]
  -w, --warmup_iters <n>     untimed calls at -b, 2 x -b, 4 x -b, ... up to -e,
                             before the table [1]
  -c, --check <n>            n > 0: check one extra call per size against a serial
                             double-precision reference, counted in #wrong; 0: no
                             check (nccl-tests' check count; one check is enough
                             here, the reference being exact) [1]
  -d, --datatype <type>      int8, uint8, int32, uint32, int64, uint64, half,
                             float, double, bfloat16, or all (each in turn, in
                             that order) [float]
  -o, --op <op>              sum, prod, max, min, avg (floating types only), or
                             all (each in turn; avg skipped on integer types) [sum]
  -N, --run_cycles <n>       time the whole table n times over [1]
  -u, --unalign <n>          start both buffers n elements past their alignment [0]
  -I, --per_iter_timing <0/1>
                             1: time every iteration alone and add i_min, i_max,
                             i_p99 and i_cv% (the slowest rank's per iteration) to
                             each side, with every iteration's time in the -J file [0]
  -K, --per_iter_skip <n>    leave the first n iterations out of the i_* columns [0]
  -S, --report_timestamps <0/1>
                             1: end every row with the time it was measured [0]
      --collective <name>    all_reduce, all_gather, reduce_scatter, broadcast
                             [all_reduce, or the one the program name says]
  -B, --backend <name>       thread, mpi, nccl, gloo [thread; mpi when started by an
                             MPI launcher with more than one process, gloo by
                             torchrun (where built with it)]
  -a, --average <0-3>        time over the ranks: 0 rank 0's, 1 the mean, 2 the
                             least, 3 the most (nccl-tests' -a) [1]
  -C, --report_cputime <0/1> 1: the time column is rank 0's CPU time to issue the
                             calls, before waiting for them (nccl-tests' -C; the
                             same as the full time on the thread and MPI backends,
                             whose calls block); algbw and busbw do not change [0]
  -J, --output_file <file>   also write nccl-tests' JSON file, in nccl-tests 2.19's
                             layout (file version 3), baselines under a key of
                             their own. The name must end in .json; an existing
                             file is kept and the next free <file>.0, <file>.1,
                             ... written instead, as nccl-tests does. Like
                             nccl-tests' file it records the command line and the
                             whole environment
  -T, --timeout <seconds>    bound every wait (UNISON_TIMEOUT) [the environment's]
      --min-busbw <GB/s>     fail (exit status 1) when the average bus bandwidth
                             is below this; nccl-tests' NCCL_TESTS_MIN_BW is read
                             too (failing below 0.9 of it, as nccl-tests does)
  -t, --nthreads <n>         ranks of the thread backend [2]; under an MPI launcher
                             only 1 (one rank per process)
  -g, --ngpus <n>            nccl-tests' GPUs per thread: on the thread backend
                             -t x -g ranks in all (-t counting 1 when only -g is
                             given, as in nccl-tests); elsewhere only 1, one
                             device per rank [1]
  -r, --root <rank>          root of broadcast [0]
      --format <fmt>         text, json or csv [text]
      --baseline             also time references: local-add (a single-threaded
                             c[i] = a[i] + b[i] over the same bytes on rank 0) and,
                             with -B mpi, raw-mpi (the same collective in plain MPI,
                             timed size by size right after unison's calls, so that
                             both meet the same state of a noisy machine)
      --rounds <n>           time every size n times and report the median time
                             (with raw-mpi, the median of the n ratios; each round
                             alternates which of the two goes first) [1]
      --algorithm <names>    -B mpi: force the all-reduce algorithm (automatic,
                             recursive_doubling, two_level, rabenseifner, ring,
                             native, rank_ordered, neighbour_exchange), or sweep
                             a comma list or all:
                             a run each, one after another (native and rank_ordered
                             force the reduce_scatter's too). The text header and
                             the records' algorithm field say which ran at each
                             size, their requested field which the run asked for;
                             scripts/tuning-rules.py turns a sweep into tuning
                             rules (UNISON_TUNING_FILE) [UNISON_ALGORITHM, else
                             automatic]
  -h, --help                 this text
  --version                  the program's and unison's version

Started under an nccl-tests binary's name (a link named all_reduce_perf,
all_gather_perf, reduce_scatter_perf or broadcast_perf; the build makes them
next to unison-bench), it times that collective, as nccl-tests' binaries do.

Sizes, bandwidths and the #wrong column follow nccl-tests: size is the larger of
the per-rank send and receive bytes, algbw = size / time, busbw = algbw times
2(n-1)/n for all_reduce, (n-1)/n for all_gather and reduce_scatter, 1 for
broadcast. time is the mean over -n back-to-back calls, averaged over the ranks
as -a says. The exit status is 0, 1 when a result was wrong or the bandwidth below
the threshold, 2 for a bad command line.

nccl-tests options that steer only NCCL or CUDA are accepted with the value that
leaves them without effect, and the header names them; any other value is refused
with the reason: -m 1 (aggregated launches), -z 0
(blocking modes), -y 0 (the null stream), -G 0 (CUDA graphs), -R 0 (buffer
registration), -p 0 (parallel init), -D 0 and -V 16 (NCCL's device
implementations), -M 0 (memory report); -x (CTA policy) is refused.

Baseline tables (--baseline) come after nccl-tests' closing line "# Collective test
concluded", their rows and headers as '#' lines, so that parsers of nccl-tests'
logs read the main table alone.

--format json writes unison-bench's own flat records (one per size and table) to
stdout instead of the text; -J writes nccl-tests' nested document to a file and
leaves stdout as it is.
)";
    return s;
}

namespace detail {

/// Sizes as nccl-tests reads them (core/detail/parse_bytes.hpp).
using unison::detail::parse_bytes;

inline std::optional<long long> parse_integer(std::string_view s) {
    if (s.empty() || s.size() > 18) {
        return std::nullopt;
    }
    bool negative = false;
    if (s.front() == '-') {
        negative = true;
        s.remove_prefix(1);
        if (s.empty()) {
            return std::nullopt;
        }
    }
    long long v = 0;
    for (char c : s) {
        if (c < '0' || c > '9') {
            return std::nullopt;
        }
        v = v * 10 + (c - '0');
    }
    return negative ? -v : v;
}

/// Parses a plain decimal number ("12", "0.5", "1e3"): all of `s`, finite.
inline std::optional<double> parse_decimal(std::string_view s) {
    double v = 0;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (s.empty() || ec != std::errc() || end != s.data() + s.size() || !std::isfinite(v)) {
        return std::nullopt;
    }
    return v;
}

/// Whether `path` names a JSON file as nccl-tests tells one: its extension (after
/// the last '.' of the last path component) is "json" in any case.
inline bool is_json_file_name(std::string_view path) {
    const auto dot = path.find_last_of('.');
    const auto slash = path.find_last_of('/');
    if (dot == std::string_view::npos || (slash != std::string_view::npos && slash > dot)) {
        return false;
    }
    const std::string_view ext = path.substr(dot + 1);
    constexpr std::string_view json = "json";
    if (ext.size() != json.size()) {
        return false;
    }
    for (std::size_t i = 0; i < ext.size(); ++i) {
        if ((ext[i] | 0x20) != json[i]) {
            return false;
        }
    }
    return true;
}

inline std::optional<reduce_op> parse_reduce_op(std::string_view s) {
    for (reduce_op op :
         {reduce_op::sum, reduce_op::prod, reduce_op::min, reduce_op::max, reduce_op::avg}) {
        if (s == to_string(op)) {
            return op;
        }
    }
    return std::nullopt;
}

} // namespace detail

/// The (type, op) pairs a run times, one table section each, in nccl-tests' order:
/// every -d type and, for a collective that reduces, every -o reduction but avg on
/// integer types (unison refuses it there); collectives that do not reduce time one
/// section per type.
inline std::vector<std::pair<dtype, reduce_op>> timed_kinds(const bench_config& cfg) {
    std::vector<std::pair<dtype, reduce_op>> kinds;
    for (dtype t : cfg.types) {
        if (!reduces(cfg.collective)) {
            kinds.emplace_back(t, reduce_op::sum);
            continue;
        }
        for (reduce_op op : cfg.ops) {
            if (op != reduce_op::avg || is_floating(t)) {
                kinds.emplace_back(t, op);
            }
        }
    }
    return kinds;
}

/// Parses the command line; throws usage_error naming the offending option.
inline bench_config parse_command_line(int argc, const char* const* argv) {
    struct option_spec {
        char short_name;
        std::string_view long_name;
        bool takes_value;
    };
    static constexpr option_spec specs[] = {
        {'b', "minbytes", true},
        {'e', "maxbytes", true},
        {'f', "stepfactor", true},
        {'n', "iters", true},
        {'w', "warmup_iters", true},
        {'c', "check", true},
        {'d', "datatype", true},
        {'o', "op", true},
        {'\0', "collective", true},
        {'B', "backend", true},
        {'t', "nthreads", true},
        {'r', "root", true},
        {'\0', "format", true},
        {'\0', "baseline", false},
        {'h', "help", false},
        {'a', "average", true},
        {'\0', "min-busbw", true},
        {'i', "stepbytes", true},
        {'T', "timeout", true},
        {'C', "report_cputime", true},
        {'J', "output_file", true},
        {'\0', "rounds", true},
        {'\0', "algorithm", true},
        {'\0', "version", false},
        {'N', "run_cycles", true},
        {'u', "unalign", true},
        {'I', "per_iter_timing", true},
        {'K', "per_iter_skip", true},
        {'S', "report_timestamps", true},
        {'g', "ngpus", true},
    };

    bench_config cfg;
    if (argc > 0 && argv[0] != nullptr) {
        const std::string_view path = argv[0];
        const auto slash = path.find_last_of('/');
        cfg.program_name =
            std::string(slash == std::string_view::npos ? path : path.substr(slash + 1));
    }
    for (int i = 0; i < argc; ++i) {
        cfg.command_line.emplace_back(argv[i] != nullptr ? argv[i] : "");
    }
    for (int i = 1; i < argc; ++i) {
        const std::string_view arg = argv[i];
        const option_spec* spec = nullptr;
        const nccl_tests_only_option* only = nullptr;
        std::optional<std::string_view> inline_value;
        if (arg.starts_with("--")) {
            std::string_view name = arg.substr(2);
            if (const auto eq = name.find('='); eq != std::string_view::npos) {
                inline_value = name.substr(eq + 1);
                name = name.substr(0, eq);
            }
            for (const auto& s : specs) {
                if (s.long_name == name) {
                    spec = &s;
                }
            }
            for (const auto& o : nccl_tests_only_options) {
                if (o.long_name == name) {
                    only = &o;
                }
            }
        } else if (arg.size() >= 2 && arg[0] == '-') {
            only = find_nccl_tests_only(arg[1]);
            if (only != nullptr && arg.size() > 2) {
                inline_value = arg.substr(2);
            }
            for (const auto& s : specs) {
                if (s.short_name != '\0' && s.short_name == arg[1]) {
                    spec = &s;
                }
            }
            if (spec != nullptr && arg.size() > 2) {
                inline_value = arg.substr(2); // -b8
            }
        } else {
            throw usage_error("unexpected argument '" + std::string(arg) + "'");
        }
        if (only != nullptr) { // nccl-tests' option for NCCL or CUDA: its neutral value
            const std::string shown = "-" + std::string(1, only->letter);
            std::string_view value;
            if (inline_value) {
                value = *inline_value;
            } else if (i + 1 < argc) {
                value = argv[++i];
            } else {
                throw usage_error("option " + shown + " needs a value");
            }
            const auto v = detail::parse_integer(value);
            const auto neutral = detail::parse_integer(only->neutral);
            // -V counts CTAs of the device implementations, which -D 0 leaves unused:
            // any count nccl-tests accepts (1..128) changes nothing.
            const bool accepted =
                v && (only->letter == 'V' ? *v >= 1 && *v <= 128 : neutral && *v == *neutral);
            if (!accepted) {
                throw usage_error(
                    "nccl-tests' option " + shown + " " + std::string(value) +
                    " has no meaning here: " + std::string(only->why) +
                    (only->neutral.empty()
                         ? std::string()
                         : " (" + shown + " " + std::string(only->neutral) + " is accepted)"));
            }
            cfg.neutral.push_back(shown + " " + std::to_string(*v));
            continue;
        }
        if (spec == nullptr) {
            throw usage_error("unknown option '" + std::string(arg) + "'");
        }
        const std::string shown = spec->short_name != '\0' ? "-" + std::string(1, spec->short_name)
                                                           : "--" + std::string(spec->long_name);
        std::string_view value;
        if (spec->takes_value) {
            if (inline_value) {
                value = *inline_value;
            } else if (i + 1 < argc) {
                value = argv[++i];
            } else {
                throw usage_error("option " + shown + " needs a value");
            }
        } else if (inline_value) {
            throw usage_error("option " + shown + " takes no value");
        }
        auto bad = [&](std::string_view what) -> usage_error {
            return usage_error("option " + shown + ": '" + std::string(value) + "' is not " +
                               std::string(what));
        };
        auto integer_in = [&](long long lo, long long hi, std::string_view what) {
            const auto v = detail::parse_integer(value);
            if (!v || *v < lo || *v > hi) {
                throw bad(what);
            }
            return *v;
        };

        switch (spec->short_name) {
        case 'b':
        case 'e': {
            const auto v = detail::parse_bytes(value);
            if (!v) {
                throw bad("a size (a number with an optional K, M or G suffix)");
            }
            (spec->short_name == 'b' ? cfg.min_bytes : cfg.max_bytes) = *v;
            break;
        }
        case 'f':
            cfg.step_factor = static_cast<std::size_t>(
                integer_in(1, 1 << 20, "a step factor >= 1 (1: steps of -i bytes)"));
            break;
        case 'i': {
            const auto v = detail::parse_bytes(value);
            if (!v || *v == 0) {
                throw bad("a step in bytes (> 0, with an optional K, M or G suffix)");
            }
            cfg.step_bytes = *v;
            break;
        }
        case 'T':
            cfg.timeout_seconds =
                static_cast<int>(integer_in(1, 1 << 20, "a timeout in seconds >= 1"));
            break;
        case 'n':
            cfg.iters = static_cast<int>(integer_in(1, 1 << 30, "an iteration count >= 1"));
            break;
        case 'w':
            cfg.warmup_iters =
                static_cast<int>(integer_in(0, 1 << 30, "a warm-up iteration count >= 0"));
            break;
        case 'c':
            cfg.check = integer_in(0, 1 << 30, "a check count >= 0") > 0;
            break;
        case 'd': {
            if (value == "all") {
                cfg.types.clear();
                for (std::string_view name : nccl_tests_type_names) {
                    if (const auto t = parse_dtype(name)) {
                        cfg.types.push_back(*t);
                    }
                }
                break;
            }
            if (value == "f8e4m3" || value == "f8e5m2") {
                throw usage_error("option -d: unison has no 8-bit float type ('" +
                                  std::string(value) + "')");
            }
            const auto t = parse_dtype(value);
            std::string known;
            for (std::string_view name : nccl_tests_type_names) {
                if (parse_dtype(name)) {
                    known += (known.empty() ? "" : ", ") + std::string(name);
                }
            }
            if (!t) {
                throw bad("a data type (" + known + ", or all)");
            }
            cfg.types = {*t};
            break;
        }
        case 'o': {
            if (value == "all") {
                cfg.ops.assign(std::begin(nccl_tests_ops), std::end(nccl_tests_ops));
                break;
            }
            if (value == "mulsum") {
                throw usage_error("option -o: unison has no pre-multiplied sum (nccl-tests' "
                                  "mulsum); use -o avg, or sum and scale");
            }
            const auto op = detail::parse_reduce_op(value);
            if (!op) {
                throw bad("a reduction (sum, prod, max, min, avg, or all)");
            }
            cfg.ops = {*op};
            break;
        }
        case 'N':
            cfg.cycles = static_cast<int>(integer_in(
                1, 1 << 20, "a cycle count >= 1 (nccl-tests' 0, forever, is not offered)"));
            break;
        case 'u':
            cfg.unalign = static_cast<int>(integer_in(0, 1 << 20, "an element count >= 0"));
            break;
        case 'I':
            cfg.per_iter = integer_in(0, 1, "0 or 1") == 1;
            break;
        case 'K':
            cfg.per_iter_skip = static_cast<int>(integer_in(0, 1 << 30, "a count >= 0"));
            break;
        case 'S':
            cfg.timestamps = integer_in(0, 1, "0 or 1") == 1;
            break;
        case 'C': {
            const auto v = detail::parse_integer(value);
            if (!v || *v < 0 || *v > 1) {
                if (parse_collective(value)) { // the collective's option before nccl-tests' -C
                    throw usage_error("option -C: '" + std::string(value) +
                                      "' is not 0 or 1: -C is nccl-tests' report_cputime; "
                                      "the collective is --collective " +
                                      std::string(value) + " (or the program name " +
                                      std::string(value) + "_perf)");
                }
                throw bad("0 or 1 (nccl-tests' report_cputime)");
            }
            cfg.report_cputime = *v == 1;
            break;
        }
        case 'J':
            if (!detail::is_json_file_name(value)) {
                throw bad("a file name ending in .json (nccl-tests writes its JSON file only "
                          "to such a name)");
            }
            cfg.json_path = std::string(value);
            break;
        case 'a':
            cfg.average = static_cast<int>(integer_in(0, 3, "0, 1, 2 or 3"));
            break;
        case 'B':
            cfg.backend_given = true;
            if (value == "thread") {
                cfg.backend = backend_kind::thread;
            } else if (value == "mpi") {
                cfg.backend = backend_kind::mpi;
            } else if (value == "nccl") {
                cfg.backend = backend_kind::nccl;
            } else if (value == "gloo") {
                cfg.backend = backend_kind::gloo;
            } else {
                throw bad("a backend (thread, mpi, nccl, gloo)");
            }
            break;
        case 't':
            cfg.thread_ranks = static_cast<int>(integer_in(1, 4096, "a rank count in [1, 4096]"));
            cfg.thread_ranks_given = true;
            break;
        case 'g':
            cfg.devices_per_thread =
                static_cast<int>(integer_in(1, 4096, "a device count in [1, 4096]"));
            cfg.devices_given = true;
            break;
        case 'r':
            cfg.root = static_cast<int>(integer_in(0, 1 << 30, "a rank >= 0"));
            break;
        case 'h':
            cfg.help = true;
            break;
        default:
            if (spec->long_name == "version") {
                cfg.version = true;
                break;
            }
            if (spec->long_name == "format") {
                if (value == "text") {
                    cfg.format = output_format::text;
                } else if (value == "json") {
                    cfg.format = output_format::json;
                } else if (value == "csv") {
                    cfg.format = output_format::csv;
                } else {
                    throw bad("an output format (text, json, csv)");
                }
            } else if (spec->long_name == "collective") {
                const auto c = parse_collective(value);
                if (!c) {
                    throw bad("a collective (all_reduce, all_gather, reduce_scatter, broadcast)");
                }
                cfg.collective = *c;
                cfg.collective_given = true;
            } else if (spec->long_name == "baseline") {
                cfg.baseline = true;
            } else if (spec->long_name == "algorithm") {
                const auto named = algorithms_from_string(value);
                if (!named) {
                    throw bad("a list of all-reduce algorithms (automatic, "
                              "recursive_doubling, two_level, rabenseifner, ring, native, "
                              "rank_ordered, neighbour_exchange) or all");
                }
                cfg.algorithms = *named;
            } else if (spec->long_name == "rounds") {
                cfg.rounds = static_cast<int>(integer_in(1, 1000, "a round count in [1, 1000]"));
            } else if (spec->long_name == "min-busbw") {
                const auto v = detail::parse_decimal(value);
                if (!v || *v < 0) {
                    throw bad("a bandwidth in GB/s (a number >= 0)");
                }
                cfg.min_busbw = *v;
            }
            break;
        }
    }
    if (cfg.help || cfg.version) {
        return cfg;
    }
    if (const auto named = collective_of_program(cfg.program_name)) {
        if (cfg.collective_given && cfg.collective != *named) {
            throw usage_error("--collective " + std::string(to_string(cfg.collective)) +
                              " contradicts the program name " + cfg.program_name +
                              ", which times " + std::string(to_string(*named)));
        }
        cfg.collective = *named;
    }
    if (const char* env = std::getenv("NCCL_TESTS_MIN_BW"); env != nullptr && cfg.min_busbw < 0) {
        const auto v = detail::parse_decimal(env);
        if (!v || *v < 0) {
            throw usage_error(std::string("NCCL_TESTS_MIN_BW='") + env +
                              "' is not a bandwidth in GB/s");
        }
        cfg.min_busbw = 0.9 * *v; // nccl-tests fails below 90% of it
    }

    if (cfg.min_bytes == 0) {
        throw usage_error("-b 0: the smallest size must be at least 1 byte");
    }
    if (cfg.min_bytes > cfg.max_bytes) {
        throw usage_error("-b " + std::to_string(cfg.min_bytes) + " is larger than -e " +
                          std::to_string(cfg.max_bytes));
    }
    cfg.type = cfg.types.front();
    cfg.op = cfg.ops.front();
    if (cfg.types.size() == 1 && cfg.ops.size() == 1 && cfg.op == reduce_op::avg &&
        !is_floating(cfg.type) && reduces(cfg.collective)) {
        throw usage_error("-o avg needs a floating-point type (unison rejects avg on " +
                          std::string(to_string(cfg.type)) + ": integer division truncates)");
    }
    for (dtype t : cfg.types) {
        if (cfg.max_bytes < size_of(t)) {
            throw usage_error("-e " + std::to_string(cfg.max_bytes) + " is smaller than one " +
                              std::string(to_string(t)) + " element");
        }
    }
    if (cfg.steps_by_bytes() && cfg.step_bytes == 0) {
        throw usage_error("-i 0 with -f 1: the size would never grow");
    }
    if (cfg.per_iter_skip > 0 && !cfg.per_iter) {
        throw usage_error("-K " + std::to_string(cfg.per_iter_skip) +
                          " leaves iterations out of the per-iteration columns, which need "
                          "-I 1");
    }
    if (cfg.per_iter_skip >= cfg.iters) {
        throw usage_error("-K " + std::to_string(cfg.per_iter_skip) + " would leave none of the " +
                          std::to_string(cfg.iters) + " iterations (-n) in the i_* columns");
    }
    if (cfg.devices_given && cfg.backend != backend_kind::thread) {
        if (cfg.devices_per_thread != 1) {
            throw usage_error("-g " + std::to_string(cfg.devices_per_thread) + " with -B " +
                              std::string(to_string(cfg.backend)) +
                              ": one device per rank (start one process per GPU; -g 1 is "
                              "accepted)");
        }
        cfg.neutral.push_back("-g 1");
    } else if (cfg.devices_given) {
        // nccl-tests' -g N in one process: N ranks per thread, here N thread ranks.
        cfg.thread_ranks = (cfg.thread_ranks_given ? cfg.thread_ranks : 1) * cfg.devices_per_thread;
        if (cfg.thread_ranks > 4096) {
            throw usage_error("-t x -g is " + std::to_string(cfg.thread_ranks) +
                              " ranks, more than 4096");
        }
    }
    if (cfg.thread_ranks_given && cfg.backend != backend_kind::thread) {
        if (cfg.thread_ranks != 1) {
            throw usage_error("-t sets the thread backend's ranks; with -B " +
                              std::string(to_string(cfg.backend)) +
                              " the ranks are the processes mpiexec starts (-t 1 is accepted)");
        }
        cfg.neutral.push_back("-t 1");
    }
    if (cfg.algorithms.size() > 1 &&
        (cfg.format == output_format::json || !cfg.json_path.empty())) {
        throw usage_error("--algorithm with several algorithms makes a run each, and a JSON "
                          "document holds one run: use --format text or csv, or one algorithm");
    }
    if (cfg.backend == backend_kind::thread && cfg.root >= cfg.thread_ranks) {
        throw usage_error("-r " + std::to_string(cfg.root) + " is not a rank of " +
                          std::to_string(cfg.thread_ranks) + " (-t)");
    }
    return cfg;
}

} // namespace unison::bench
