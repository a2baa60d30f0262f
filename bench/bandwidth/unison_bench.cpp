/// \file
/// unison-bench: nccl-tests' all_reduce_perf (and friends) for unison's backends.
///
///     unison-bench -b 8 -e 64M -f 4 -t 4                         # thread backend
///     mpiexec -n 4 unison-bench -B mpi -b 8 -e 64M --baseline    # MPI, with raw MPI
///     mpiexec -n 8 unison-bench -B nccl -b 8 -e 8G               # NCCL, a GPU per process
///     mpiexec -n 4 all_gather_perf -b 8 -e 64M -J ag.json        # a link: all_gather
///
/// Timing follows nccl-tests 2.19's BenchTime: warm-up calls at every power-of-two
/// multiple of -b, then per size one untimed call, a barrier, and -n calls back to
/// back between two reads of the host clock; the reported time is the mean per
/// call, averaged over the ranks (or rank 0's, the least or the most: -a, as
/// nccl-tests). The clock is also read once the calls are issued, before waiting for
/// them: -C 1 reports that CPU time, as nccl-tests does; on the thread and MPI
/// backends, whose calls block, it is the whole time. With -I 1 each call's start
/// is marked too (the host clock; CUDA events on the NCCL backend, as nccl-tests),
/// and every iteration's time, the slowest rank's, is summarized in i_* columns.
/// Consecutive timed calls move through the buffers (nccl-tests' per-iteration
/// offset) so that small sizes are not timed on the same cache lines over and over;
/// -u starts both buffers that many elements past their alignment. With -c 1 one
/// more call per size runs on fresh data outside the timed loop and every rank
/// counts its wrong elements against a serial reference. -d all and -o all time
/// each type and reduction in turn, in nccl-tests' order.

#include "bench_config.hpp"
#include "collective_call.hpp"
#include "collective_shape.hpp"
#include "data_pattern.hpp"
#include "launch_rank.hpp"
#include "report.hpp"

#include <unison/comm.hpp>
#include <unison/core.hpp>
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

#if UNISON_HAS_NCCL()
#include <unison/nccl.hpp>

#include <cuda_runtime_api.h>
#endif

#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <climits>
#include <concepts>
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
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace unison::bench {
namespace {

using bench_clock = std::chrono::steady_clock;

/// What the driver needs besides the collective: a barrier, completion of
/// outstanding work, and the max and sum of one value over the ranks.
/// With -I, it also marks the start of every timed call and the end of the last
/// (mark_iteration) and, once they are done, gives each one's time
/// (iteration_seconds); and it reduces whole lists element by element.
template <class C>
concept rank_control = requires(C& c, double d, std::uint64_t u, std::vector<double>& v, int n) {
    c.barrier();
    c.finish();
    { c.max(d) } -> std::same_as<double>;
    { c.sum(d) } -> std::same_as<double>;
    { c.sum(u) } -> std::same_as<std::uint64_t>;
    c.max_each(v);
    c.sum_each(v);
    c.begin_iterations(n);
    c.mark_iteration();
    { c.iteration_seconds() } -> std::same_as<std::vector<double>>;
};

/// -I on a backend whose calls block: each call's time from host clock reads at
/// the start of every call and once after the last.
class host_iteration_clock {
public:
    void begin_iterations(int n) {
        marks_.clear();
        marks_.reserve(static_cast<std::size_t>(n) + 1);
    }
    void mark_iteration() { marks_.push_back(bench_clock::now()); }
    std::vector<double> iteration_seconds() {
        std::vector<double> t;
        for (std::size_t i = 1; i < marks_.size(); ++i) {
            t.push_back(std::chrono::duration<double>(marks_[i] - marks_[i - 1]).count());
        }
        return t;
    }

private:
    std::vector<bench_clock::time_point> marks_;
};

/// The control plane of a host communicator, through unison itself.
template <communicator Comm>
struct unison_control : host_iteration_clock {
    explicit unison_control(Comm& c) : comm(c) {}

    Comm& comm;

    void barrier() { unison::barrier(comm); }
    void finish() {} // blocking calls: nothing outstanding
    double max(double v) {
        std::array<double, 1> a{v};
        unison::all_reduce(comm, a, reduce_op::max);
        return a[0];
    }
    double sum(double v) {
        std::array<double, 1> a{v};
        unison::all_reduce(comm, a, reduce_op::sum);
        return a[0];
    }
    std::uint64_t sum(std::uint64_t v) {
        std::array<std::int64_t, 1> a{static_cast<std::int64_t>(v)};
        unison::all_reduce(comm, a, reduce_op::sum);
        return static_cast<std::uint64_t>(a[0]);
    }
    void max_each(std::vector<double>& v) { unison::all_reduce(comm, v, reduce_op::max); }
    void sum_each(std::vector<double>& v) { unison::all_reduce(comm, v, reduce_op::sum); }
};

/// c[i] = a[i] + b[i] in the benchmark's dtype (16-bit floats through float, as
/// unison reduces them): the single-threaded memory-speed reference.
template <class T>
[[gnu::noinline]] void add_arrays(const T* a, const T* b, T* c, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) {
        if constexpr (is_16bit_float_v<T>) {
            c[i] = T(static_cast<float>(a[i]) + static_cast<float>(b[i]));
        } else {
            c[i] = static_cast<T>(a[i] + b[i]);
        }
    }
}

/// The requested sizes, as nccl-tests steps: min, min * f, ... up to max when -f is
/// above 1, else min, min + i, ...; the whole list -N times over.
std::vector<std::size_t> bench_sizes(const bench_config& cfg) {
    std::vector<std::size_t> sizes;
    if (cfg.steps_by_bytes()) {
        for (std::size_t b = cfg.min_bytes; b <= cfg.max_bytes; b += cfg.step_bytes) {
            sizes.push_back(b);
            if (b > cfg.max_bytes - cfg.step_bytes) {
                break;
            }
        }
    } else {
        for (std::size_t b = cfg.min_bytes; b <= cfg.max_bytes; b *= cfg.step_factor) {
            sizes.push_back(b);
            if (b > cfg.max_bytes / cfg.step_factor) {
                break;
            }
        }
    }
    const std::vector<std::size_t> cycle = sizes;
    for (int k = 1; k < cfg.cycles; ++k) {
        sizes.insert(sizes.end(), cycle.begin(), cycle.end());
    }
    return sizes;
}

/// nccl-tests 2.19's warm-up sizes: min, 2 min, 4 min, ... up to max.
std::vector<std::size_t> warm_up_sizes(const bench_config& cfg) {
    std::vector<std::size_t> sizes;
    for (std::size_t b = cfg.min_bytes; b <= cfg.max_bytes; b *= 2) {
        sizes.push_back(b);
        if (b > cfg.max_bytes / 2) {
            break;
        }
    }
    return sizes;
}

/// The bytes -u moves both buffers by: `unalign` elements of the largest type timed
/// (nccl-tests pads its buffers by 8 bytes per element of -u for any type).
std::size_t unalign_padding(const bench_config& cfg) {
    return static_cast<std::size_t>(cfg.unalign) * 8;
}

/// Byte offset of timed call `iter`: nccl-tests moves each call to the next
/// `size`-sized slot of the max-size buffer, wrapping around.
std::size_t shift_for(std::size_t iter, std::size_t size, std::size_t capacity) {
    const std::size_t steps = size == 0 ? 1 : std::max<std::size_t>(1, capacity / size);
    return size * (iter % steps);
}

/// A rank's benchmark buffers in host memory (thread and MPI backends), each the
/// size of the largest call (plus -u's padding), allocated once and reused for
/// every size.
class host_buffers {
public:
    explicit host_buffers(std::size_t bytes) : send_(bytes), recv_(bytes) {}

    /// -u: both buffers start this many bytes past their allocation.
    void set_offset(std::size_t bytes) noexcept { offset_ = bytes; }
    std::byte* send() noexcept { return send_.data() + offset_; }
    std::byte* recv() noexcept { return recv_.data() + offset_; }

    /// Writes the inputs of one checked call (see prepare_inputs).
    void prepare(const check_site& c, const data_pattern& p, bool in_place) {
        prepare_inputs(c, p, in_place, send(), recv());
    }

    /// Wrong elements of this rank's result; `result_at_start` as in rank_driver.
    std::uint64_t wrong(const check_site& c, const data_pattern& p, bool in_place,
                        bool result_at_start) {
        return count_wrong(c, p, result_at_start ? recv() : result_of(c, in_place, recv()));
    }

private:
    host_memory send_;
    host_memory recv_;
    std::size_t offset_ = 0;
};

/// The round of median time of one side (the upper median for an even count), with
/// #wrong summed over all rounds.
side_result median_side(const std::vector<size_result>& rounds, side_result size_result::*side) {
    std::vector<const side_result*> by_time;
    std::optional<std::uint64_t> wrong;
    for (const size_result& r : rounds) {
        by_time.push_back(&(r.*side));
        if ((r.*side).wrong) {
            wrong = wrong.value_or(0) + *(r.*side).wrong;
        }
    }
    std::sort(by_time.begin(), by_time.end(),
              [](const side_result* a, const side_result* b) { return a->seconds < b->seconds; });
    side_result m = *by_time[by_time.size() / 2];
    m.wrong = wrong;
    return m;
}

/// The median over the rounds of unison's time over the baseline's in the same round.
std::optional<double> median_ratio(const std::vector<size_result>& unison,
                                   const std::vector<size_result>& baseline,
                                   side_result size_result::*side) {
    std::vector<double> ratios;
    for (std::size_t k = 0; k < unison.size() && k < baseline.size(); ++k) {
        if ((baseline[k].*side).seconds > 0) {
            ratios.push_back((unison[k].*side).seconds / (baseline[k].*side).seconds);
        }
    }
    if (ratios.empty()) {
        return std::nullopt;
    }
    std::sort(ratios.begin(), ratios.end());
    return ratios[ratios.size() / 2];
}

/// No raw-MPI baseline (the thread and NCCL backends): never called.
struct no_partner {
    void operator()(const std::byte*, std::byte*, const collective_shape&, bool) const {}
};

/// The raw-MPI baseline of a run: the call timed next to unison's, or why there is none.
template <class Partner>
struct raw_baseline {
    std::optional<Partner> call;
    std::string what;    ///< the baseline's description, when there is a call
    std::string why_not; ///< why there is none, when there is no call
    /// Its in-place reduce_scatter leaves the result at the start (MPI's convention).
    bool result_at_start = false;
};

/// One rank's side of a benchmark run. `Memory` holds the rank's buffers
/// (host_buffers, or device_buffers for NCCL).
template <rank_control Control, class Memory>
class rank_driver {
public:
    rank_driver(const bench_config& cfg, Control& ctl, Memory& mem, int rank, int ranks)
        : cfg_(cfg), ctl_(ctl), mem_(mem), rank_(rank), ranks_(ranks),
          pattern_op_(reduces(cfg.collective) ? cfg.op : reduce_op::sum) {}

    /// nccl-tests 2.19's warm-up: -w out-of-place calls at every power-of-two
    /// multiple of the smallest size up to the largest.
    template <class Call>
    void warm_up(Call& call) {
        ctl_.barrier();
        for (std::size_t bytes : warm_up_sizes(cfg_)) {
            const collective_shape s = shape(bytes);
            for (int i = 0; i < cfg_.warmup_iters; ++i) {
                const std::size_t off =
                    shift_for(static_cast<std::size_t>(i), s.size_bytes(), cfg_.max_bytes);
                call(mem_.send() + off, mem_.recv() + off, s, false);
            }
            ctl_.finish();
        }
        ctl_.barrier();
    }

    /// Times every size cfg.rounds times; `call`'s rows go to `out` (on the rank that
    /// has one) as they are made. With a `partner` (the raw-MPI baseline), each round
    /// also times the partner at the same size, right after `call` in even rounds and
    /// right before it in odd ones, so that both meet the same state of the machine;
    /// the partner's rows are returned for its baseline table, each side's ratio the
    /// median of the rounds' ratios. A row is the round of median time (#wrong summed
    /// over the rounds). `partner_result_at_start`: its in-place reduce_scatter result
    /// is at offset 0 (MPI's convention) rather than at block `rank` (unison's).
    template <class Call, class Partner>
    std::pair<std::vector<size_result>, std::vector<size_result>>
    run_tables(Call& call, Partner* partner, reporter* out, bool partner_result_at_start) {
        std::vector<size_result> rows, partner_rows;
        for (std::size_t bytes : bench_sizes(cfg_)) {
            const collective_shape s = shape(bytes);
            std::vector<size_result> mine, theirs;
            auto time_call = [&] {
                mine.push_back({s, time_side(call, s, false, false, true),
                                time_side(call, s, true, false, true), cfg_.type, op_name()});
            };
            auto time_partner = [&] {
                theirs.push_back({s, time_side(*partner, s, false, partner_result_at_start, false),
                                  time_side(*partner, s, true, partner_result_at_start, false),
                                  cfg_.type, op_name()});
            };
            for (int round = 0; round < cfg_.rounds; ++round) {
                if (partner != nullptr && round % 2 == 1) {
                    time_partner();
                    time_call();
                } else {
                    time_call();
                    if (partner != nullptr) {
                        time_partner();
                    }
                }
            }
            const size_result r{s, median_side(mine, &size_result::out_of_place),
                                median_side(mine, &size_result::in_place), cfg_.type, op_name()};
            if (out != nullptr) {
                out->row(r);
            }
            rows.push_back(r);
            if (partner != nullptr) {
                size_result p{s, median_side(theirs, &size_result::out_of_place),
                              median_side(theirs, &size_result::in_place), cfg_.type, op_name()};
                p.out_of_place.ratio = median_ratio(mine, theirs, &size_result::out_of_place);
                p.in_place.ratio = median_ratio(mine, theirs, &size_result::in_place);
                partner_rows.push_back(p);
            }
        }
        return {rows, partner_rows};
    }

    /// The local-add baseline: rank 0 times c = a + b and a += b over each size's
    /// bytes while the other ranks wait; its rows (rank 0's) are returned.
    std::vector<size_result> run_local_add(const std::vector<size_result>& reference) {
        std::vector<size_result> rows;
        if (rank_ == 0) {
            host_memory a(cfg_.max_bytes), b(cfg_.max_bytes), c(cfg_.max_bytes);
            const std::size_t whole = cfg_.max_bytes / size_of(cfg_.type);
            fill_input(cfg_.type, data_pattern{0, reduce_op::sum}, 0, a.data(), 0, whole);
            fill_input(cfg_.type, data_pattern{0, reduce_op::sum}, 1, b.data(), 0, whole);
            std::size_t index = 0;
            for (std::size_t bytes : bench_sizes(cfg_)) {
                const collective_shape s = shape(bytes);
                size_result r{s, time_add(a, b, c, s.size_bytes(), false),
                              time_add(a, b, c, s.size_bytes(), true), cfg_.type, op_name()};
                if (index < reference.size()) {
                    set_ratios(r, reference[index++]);
                }
                rows.push_back(std::move(r));
            }
        }
        ctl_.barrier();
        return rows;
    }

private:
    std::string op_name() const {
        return reduces(cfg_.collective) ? std::string(to_string(cfg_.op)) : "none";
    }

    collective_shape shape(std::size_t bytes) const {
        return shape_for(cfg_.collective, bytes, cfg_.type, ranks_);
    }

    check_site site(const collective_shape& s) const {
        return {cfg_.collective, s, cfg_.type, cfg_.op, rank_, ranks_, cfg_.root};
    }

    static void set_ratios(size_result& r, const size_result& unison_row) {
        auto ratio = [](const side_result& u, side_result& b) {
            if (b.seconds > 0) {
                b.ratio = u.seconds / b.seconds;
            }
        };
        ratio(unison_row.out_of_place, r.out_of_place);
        ratio(unison_row.in_place, r.in_place);
    }

    /// One rank's time as -a says: rank 0's, the mean (default), the least or the most
    /// over the ranks (nccl-tests' -a 0..3). Collective.
    double over_ranks(double seconds) {
        switch (cfg_.average) {
        case 0:
            return ctl_.sum(rank_ == 0 ? seconds : 0.0);
        case 2:
            return -ctl_.max(-seconds);
        case 3:
            return ctl_.max(seconds);
        default:
            return ctl_.sum(seconds) / ranks_;
        }
    }

    /// nccl-tests' BenchTime for one size and one side; `main_table`: unison's
    /// calls, which -I times one by one (a baseline's are timed as a whole).
    template <class Call>
    side_result time_side(Call& call, const collective_shape& s, bool in_place,
                          bool result_at_start, bool main_table) {
        std::byte* send = mem_.send();
        std::byte* recv = mem_.recv();
        if (cfg_.check) { // time on the data that is checked, as nccl-tests does
            mem_.prepare(site(s), data_pattern{0, pattern_op_}, in_place);
        }
        call(send, recv, s, in_place);
        ctl_.finish();
        ctl_.barrier();

        const bool per_iter = cfg_.per_iter && main_table;
        if (per_iter) {
            ctl_.begin_iterations(cfg_.iters);
        }
        const auto start = bench_clock::now();
        for (int i = 0; i < cfg_.iters; ++i) {
            const std::size_t off =
                shift_for(static_cast<std::size_t>(i), s.size_bytes(), cfg_.max_bytes);
            if (per_iter) {
                ctl_.mark_iteration();
            }
            call(send + off, recv + off, s, in_place);
        }
        if (per_iter) {
            ctl_.mark_iteration(); // the end of the last call
        }
        const std::chrono::duration<double> issued = bench_clock::now() - start;
        ctl_.finish();
        const std::chrono::duration<double> elapsed = bench_clock::now() - start;
        std::optional<per_iteration> iterations;
        if (per_iter) {
            iterations = gather_iterations(ctl_.iteration_seconds());
        }
        const double seconds = over_ranks(elapsed.count() / cfg_.iters);

        side_result r;
        r.seconds = seconds;
        r.per_iter = std::move(iterations);
        r.cpu_seconds = issued.count() / cfg_.iters; // this rank's; rank 0 reports it
        r.algbw = algbw_gbps(s, seconds);
        r.busbw = r.algbw * bus_factor(cfg_.collective, ranks_);
        if (cfg_.check) {
            const data_pattern p{++seed_, pattern_op_};
            mem_.prepare(site(s), p, in_place);
            call(send, recv, s, in_place);
            ctl_.finish();
            r.wrong = ctl_.sum(mem_.wrong(site(s), p, in_place, result_at_start));
        }
        return r;
    }

    /// -I: this rank's iteration times (seconds) made into the run's: per iteration
    /// the slowest rank's, and under MPI every process's list (nccl-tests' process
    /// rows). Collective.
    per_iteration gather_iterations(std::vector<double> mine) {
        mine.resize(static_cast<std::size_t>(cfg_.iters), 0.0);
        for (double& t : mine) {
            t *= 1e6;
        }
        per_iteration p;
        p.skipped = cfg_.per_iter_skip;
        p.times_us = mine;
        ctl_.max_each(p.times_us);
        if (cfg_.backend != backend_kind::thread && ranks_ > 1) {
            const std::size_t n = mine.size();
            std::vector<double> all(n * static_cast<std::size_t>(ranks_), 0.0);
            std::copy(mine.begin(), mine.end(),
                      all.begin() + static_cast<std::ptrdiff_t>(n) * rank_);
            ctl_.sum_each(all);
            for (int r = 0; r < ranks_; ++r) {
                const auto from = all.begin() + static_cast<std::ptrdiff_t>(n) * r;
                p.per_process_us.emplace_back(from, from + static_cast<std::ptrdiff_t>(n));
            }
        }
        summarize(p);
        return p;
    }

    side_result time_add(host_memory& a, host_memory& b, host_memory& c, std::size_t bytes,
                         bool in_place) const {
        const std::size_t n = bytes / size_of(cfg_.type);
        return visit_dtype(cfg_.type, [&]<class T>(std::type_identity<T>) {
            auto one = [&](std::size_t off) {
                const T* pa = reinterpret_cast<const T*>(a.data() + off);
                const T* pb = reinterpret_cast<const T*>(b.data() + off);
                T* pc = reinterpret_cast<T*>((in_place ? a : c).data() + off);
                add_arrays(pa, pb, pc, n);
            };
            one(0);
            const auto start = bench_clock::now();
            for (int i = 0; i < cfg_.iters; ++i) {
                one(shift_for(static_cast<std::size_t>(i), bytes, cfg_.max_bytes));
            }
            const std::chrono::duration<double> elapsed = bench_clock::now() - start;
            side_result r;
            r.seconds = elapsed.count() / cfg_.iters;
            r.cpu_seconds = r.seconds;
            r.algbw = r.seconds > 0 ? static_cast<double>(bytes) / 1e9 / r.seconds : 0.0;
            return r;
        });
    }

    const bench_config& cfg_;
    Control& ctl_;
    Memory& mem_;
    int rank_;
    int ranks_;
    reduce_op pattern_op_;
    std::uint64_t seed_ = 0;
};

/// Totals of a main table, as nccl-tests' closing lines print them.
struct table_summary {
    std::uint64_t wrong = 0;
    double avg_busbw = 0;
};

table_summary summarize(const std::vector<size_result>& rows) {
    table_summary t;
    double sum = 0;
    int n = 0;
    for (const size_result& r : rows) {
        for (const side_result* s : {&r.out_of_place, &r.in_place}) {
            t.wrong += s->wrong.value_or(0);
            sum += s->busbw.value_or(0);
            ++n;
        }
    }
    t.avg_busbw = n > 0 ? sum / n : 0;
    return t;
}

/// The header's facts: `threads` ranks per process and `devices` per rank (nccl-tests'
/// nThread and nGpus), `ranks` in all, and each rank's device line.
run_info make_run_info(const bench_config& cfg, int ranks, int threads, int devices,
                       std::vector<rank_device> lines) {
    run_info info;
    info.config = &cfg;
    info.ranks = ranks;
    info.root = cfg.collective == collective_kind::broadcast ? cfg.root : -1;
    info.op_name = reduces(cfg.collective) ? std::string() : "none";
    for (reduce_op op : reduces(cfg.collective) ? cfg.ops : std::vector<reduce_op>{}) {
        info.op_name += (info.op_name.empty() ? "" : ",") + std::string(to_string(op));
    }
    info.threads_per_process = threads;
    info.devices_per_rank = devices;
#if UNISON_HAS_NCCL()
    info.nccl_headers = NCCL_VERSION_CODE;
    if (ncclGetVersion(&info.nccl_library) != ncclSuccess) {
        info.nccl_library = 0;
    }
#endif
    info.devices = std::move(lines);
    return info;
}

/// The host's name up to its first '.', as nccl-tests prints it.
std::string host_name() {
    char name[256] = {};
    if (gethostname(name, sizeof name - 1) != 0) {
        return "unknown";
    }
    const std::string full = name;
    return full.substr(0, full.find('.'));
}

/// A rank's device line on this host: `what` it is, no device yet.
rank_device host_rank(int rank, std::string what) {
    return {rank, static_cast<int>(getpid()), host_name(), std::nullopt, {}, std::move(what)};
}

constexpr std::string_view local_add_description =
    "single-threaded c[i] = a[i] + b[i] (out of place) and a[i] += b[i] (in place) over "
    "`size` bytes of the same dtype on rank 0, timed the same way: the host's memory speed";

/// The whole run on one rank: for each type and reduction timed (-d, -o), the
/// warm-up and the main table's rows (timed alongside the raw-MPI baseline where
/// there is one, and followed by the local-add baseline's); then the closing lines
/// and the baselines' tables. `make_call(k)` and `make_raw(k)` give unison's call
/// and the raw-MPI baseline (raw_baseline) for the configuration `k` of one type and
/// reduction. `out` is non-null on rank 0 only. A non-empty `no_local_add` says why
/// the local-add baseline does not apply. Returns the total of #wrong, plus one when
/// the average bus bandwidth is below --min-busbw (or NCCL_TESTS_MIN_BW): the run
/// failed when it is not 0. Known on every rank.
template <rank_control Control, class Memory, class MakeCall, class MakeRaw>
std::uint64_t run_rank(const bench_config& cfg, Control& ctl, Memory& mem, MakeCall make_call,
                       MakeRaw make_raw, int rank, int ranks, reporter* out,
                       std::string_view no_local_add = {}) {
    std::vector<size_result> rows, raw_rows, local_rows;
    std::string raw_what, raw_why_not;
    for (const auto& [type, op] : timed_kinds(cfg)) {
        bench_config k = cfg;
        k.type = type;
        k.op = op;
        mem.set_offset(static_cast<std::size_t>(cfg.unalign) * size_of(type));
        auto call = make_call(k);
        auto raw = make_raw(k);
        auto* partner = cfg.baseline && raw.call ? &*raw.call : nullptr;
        const std::string kind = std::string(to_string(type)) +
                                 (reduces(cfg.collective) ? " " + std::string(to_string(op)) : "");
        if (partner != nullptr) {
            raw_what = raw.what;
        } else if (!raw.why_not.empty()) {
            raw_why_not += (raw_why_not.empty() ? "" : "; ") +
                           (timed_kinds(cfg).size() > 1 ? kind + ": " : "") + raw.why_not;
        }
        rank_driver<Control, Memory> driver(k, ctl, mem, rank, ranks);
        driver.warm_up(call);
        if (partner != nullptr) {
            driver.warm_up(*partner);
        }
        auto [mine, theirs] = driver.run_tables(call, partner, out, raw.result_at_start);
        if (cfg.baseline && no_local_add.empty()) {
            const std::vector<size_result> added = driver.run_local_add(mine);
            local_rows.insert(local_rows.end(), added.begin(), added.end());
        }
        rows.insert(rows.end(), mine.begin(), mine.end());
        raw_rows.insert(raw_rows.end(), theirs.begin(), theirs.end());
    }
    mem.set_offset(0);
    const table_summary total = summarize(rows);
    if (out != nullptr) {
        out->end_main(total.wrong, total.avg_busbw);
        if (cfg.baseline) {
            if (!raw_rows.empty()) {
                out->begin_baseline("raw-mpi", raw_why_not.empty()
                                                   ? raw_what
                                                   : raw_what + " (none for " + raw_why_not + ")");
                for (const size_result& r : raw_rows) {
                    out->baseline_row(r);
                }
            } else {
                out->skip_baseline("raw-mpi", raw_why_not);
            }
            if (!no_local_add.empty()) {
                out->skip_baseline("local-add", no_local_add);
            } else {
                out->begin_baseline("local-add", local_add_description);
                for (const size_result& r : local_rows) {
                    out->baseline_row(r);
                }
            }
        }
        out->finish();
    }
    return total.wrong + (below_threshold(cfg, total.avg_busbw) ? 1 : 0);
}

/// For backends other than MPI: the raw-MPI baseline does not apply.
constexpr auto no_raw_mpi = [](const bench_config&) {
    return raw_baseline<no_partner>{std::nullopt, {}, "needs -B mpi", false};
};

// ------------------------------------------------------------------ thread backend

int run_thread_backend(const bench_config& cfg) {
    std::vector<rank_device> lines;
    for (int r = 0; r < cfg.thread_ranks; ++r) {
        lines.push_back(host_rank(r, "thread " + std::to_string(r)));
    }
    run_info info = make_run_info(cfg, cfg.thread_ranks, cfg.thread_ranks, 0, std::move(lines));
    if (cfg.collective == collective_kind::all_reduce ||
        cfg.collective == collective_kind::reduce_scatter) {
        // One schedule at every size (thread/tuning.hpp); named as the MPI rows name theirs.
        info.algorithm_at = [](std::size_t) {
            return std::string(to_string(thread_all_reduce_algorithm(algorithm::automatic)));
        };
    }
    const std::unique_ptr<reporter> out = make_reporter(cfg, info);
    std::uint64_t wrong = 0;
    thread_world(cfg.thread_ranks).run([&](thread_communicator& comm) {
        unison_control<thread_communicator> ctl{comm};
        auto make_call = [&](const bench_config& k) {
            return unison_call<thread_communicator>{comm, k.collective, k.type, k.op, k.root};
        };
        // allocated and first touched by its rank
        host_buffers mem(cfg.max_bytes + unalign_padding(cfg));
        reporter* mine = comm.rank() == 0 ? out.get() : nullptr;
        if (mine != nullptr) {
            mine->begin(info);
        }
        const std::uint64_t w =
            run_rank(cfg, ctl, mem, make_call, no_raw_mpi, comm.rank(), comm.size(), mine);
        if (comm.rank() == 0) {
            wrong = w;
        }
    });
    return wrong == 0 ? 0 : 1;
}

/// False (after rank 0 says why) when -r names no rank of the launched processes;
/// only known once MPI or Gloo has started, unlike the thread backend's -t check.
bool root_in_range(const bench_config& cfg, int rank, int ranks) {
    if (cfg.root < ranks) {
        return true;
    }
    if (rank == 0) {
        std::fprintf(stderr, "unison-bench: error: -r %d is not a rank of %d processes\n", cfg.root,
                     ranks);
    }
    return false;
}

// -------------------------------------------------------------------- Gloo backend

#if UNISON_HAS_GLOO()
/// The Gloo backend under torchrun (or RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set
/// by hand): every rank a process, timed and controlled over the communicator itself.
int run_gloo_ranks(const bench_config& cfg) {
    gloo_communicator comm = gloo_communicator::from_env();
    const int rank = comm.rank();
    const int ranks = comm.size();
    if (!root_in_range(cfg, rank, ranks)) {
        return 2;
    }
    // Every rank's line: host names from the store, process ids gathered.
    const std::int64_t pid = getpid();
    std::vector<std::int64_t> pids(static_cast<std::size_t>(ranks));
    unison::all_gather(comm, std::span(&pid, 1), std::span(pids));
    std::vector<rank_device> lines;
    for (int r = 0; r < ranks; ++r) {
        const std::string& host = comm.store()->hosts()[static_cast<std::size_t>(r)];
        lines.push_back({r,
                         static_cast<int>(pids[static_cast<std::size_t>(r)]),
                         host.substr(0, host.find('.')),
                         std::nullopt,
                         {},
                         "Gloo process"});
    }
    run_info info = make_run_info(cfg, ranks, 1, 0, std::move(lines));
    if (cfg.collective == collective_kind::all_reduce) {
        info.algorithm_at = [](std::size_t) {
            return std::string(to_string(gloo_all_reduce_algorithm(algorithm::automatic, 0, "")));
        };
    }
    const std::unique_ptr<reporter> out = rank == 0 ? make_reporter(cfg, info) : nullptr;
    if (out) {
        out->begin(info);
    }
    unison_control<gloo_communicator> ctl{comm};
    auto make_call = [&](const bench_config& k) {
        return unison_call<gloo_communicator>{comm, k.collective, k.type, k.op, k.root};
    };
    host_buffers mem(cfg.max_bytes + unalign_padding(cfg));
    const std::uint64_t wrong =
        run_rank(cfg, ctl, mem, make_call, no_raw_mpi, rank, ranks, out.get());
    return wrong == 0 ? 0 : 1;
}
#endif

// --------------------------------------------------------------------- MPI backend

#if UNISON_HAS_MPI()

/// The control plane of the MPI runs: plain MPI, as nccl-tests does it.
struct mpi_control {
    MPI_Comm comm;

    void barrier() { check_mpi(MPI_Barrier(comm), "MPI_Barrier"); }
    void finish() {}
    double max(double v) {
        check_mpi(MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_DOUBLE, MPI_MAX, comm), "MPI_Allreduce");
        return v;
    }
    double sum(double v) {
        check_mpi(MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_DOUBLE, MPI_SUM, comm), "MPI_Allreduce");
        return v;
    }
    std::uint64_t sum(std::uint64_t v) {
        check_mpi(MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_UINT64_T, MPI_SUM, comm), "MPI_Allreduce");
        return v;
    }
    void max_each(std::vector<double>& v) { each(v, MPI_MAX); }
    void sum_each(std::vector<double>& v) { each(v, MPI_SUM); }

private:
    void each(std::vector<double>& v, MPI_Op op) {
        check_mpi(
            MPI_Allreduce(MPI_IN_PLACE, v.data(), static_cast<int>(v.size()), MPI_DOUBLE, op, comm),
            "MPI_Allreduce");
    }
};

/// mpi_control with -I's host clock (the MPI backend's calls block).
struct mpi_host_control : mpi_control, host_iteration_clock {
    explicit mpi_host_control(MPI_Comm c) : mpi_control{c} {}
};

/// Every rank's device line, gathered on rank 0 (empty elsewhere). Each travels as
/// its fields separated by tabs, which none of them holds.
std::vector<rank_device> gather_rank_devices(int rank, int ranks, const rank_device& mine) {
    constexpr int record_bytes = 512;
    std::string text = std::to_string(mine.rank) + '\t' + std::to_string(mine.pid) + '\t' +
                       mine.host + '\t' + (mine.device ? std::to_string(*mine.device) : "") + '\t' +
                       mine.bus_id + '\t' + mine.info;
    std::replace(text.begin(), text.end(), '\n', ' ');
    std::vector<char> own(record_bytes, '\0');
    std::copy_n(text.begin(), std::min<std::size_t>(text.size(), record_bytes - 1), own.begin());
    std::vector<char> all(rank == 0 ? static_cast<std::size_t>(ranks) * record_bytes : 0);
    check_mpi(MPI_Gather(own.data(), record_bytes, MPI_CHAR, all.data(), record_bytes, MPI_CHAR, 0,
                         MPI_COMM_WORLD),
              "MPI_Gather");
    std::vector<rank_device> devices;
    for (int r = 0; rank == 0 && r < ranks; ++r) {
        const std::string record(all.data() + static_cast<std::size_t>(r) * record_bytes);
        std::vector<std::string> fields;
        std::size_t from = 0;
        for (std::size_t tab; (tab = record.find('\t', from)) != std::string::npos;
             from = tab + 1) {
            fields.push_back(record.substr(from, tab - from));
        }
        fields.push_back(record.substr(from));
        fields.resize(6);
        rank_device d;
        d.rank = std::atoi(fields[0].c_str());
        d.pid = std::atoi(fields[1].c_str());
        d.host = fields[2];
        if (!fields[3].empty()) {
            d.device = std::atoi(fields[3].c_str());
        }
        d.bus_id = fields[4];
        d.info = fields[5];
        devices.push_back(std::move(d));
    }
    return devices;
}

/// True when no launcher started this process (no mpiexec, srun or torchrun
/// variables): MPI would make a world of one.
bool outside_a_launcher() {
    try {
        return detect_launch().launcher == "none";
    } catch (const std::exception&) { // malformed variables: mpi_environment names them
        return false;
    }
}

/// The MPI datatype of `t` for the raw-MPI baseline, or null where MPI has none
/// (16-bit floats can only be moved, as 16-bit integers, not reduced).
MPI_Datatype raw_mpi_type(dtype t, bool reducing) {
    switch (t) {
    case dtype::f64:
        return MPI_DOUBLE;
    case dtype::f32:
        return MPI_FLOAT;
    case dtype::i64:
        return MPI_INT64_T;
    case dtype::i32:
        return MPI_INT32_T;
    case dtype::i8:
        return MPI_INT8_T;
    case dtype::u8:
        return MPI_UINT8_T;
    case dtype::u32:
        return MPI_UINT32_T;
    case dtype::u64:
        return MPI_UINT64_T;
    case dtype::f16:
    case dtype::bf16:
        return reducing ? MPI_DATATYPE_NULL : MPI_UINT16_T;
    }
    return MPI_DATATYPE_NULL;
}

MPI_Op raw_mpi_op(reduce_op op) {
    switch (op) {
    case reduce_op::sum:
        return MPI_SUM;
    case reduce_op::prod:
        return MPI_PROD;
    case reduce_op::min:
        return MPI_MIN;
    case reduce_op::max:
        return MPI_MAX;
    case reduce_op::avg:
        break; // MPI has no average
    }
    return MPI_OP_NULL;
}

/// The raw-MPI baseline: the same collective in a few lines of plain MPI.
struct raw_mpi_call {
    MPI_Comm comm;
    collective_kind collective;
    MPI_Datatype type;
    MPI_Op op;
    int root;
    int rank;

    void operator()(const std::byte* send, std::byte* recv, const collective_shape& s,
                    bool in_place) const {
        if (s.count > static_cast<std::size_t>(INT_MAX)) {
            throw std::runtime_error("raw-mpi: more than INT_MAX elements per call");
        }
        const int n = static_cast<int>(s.count);
        const void* in = in_place ? MPI_IN_PLACE : static_cast<const void*>(send);
        switch (collective) {
        case collective_kind::all_reduce:
            check_mpi(MPI_Allreduce(in, recv, n, type, op, comm), "MPI_Allreduce");
            return;
        case collective_kind::all_gather:
            check_mpi(MPI_Allgather(in, n, type, recv, n, type, comm), "MPI_Allgather");
            return;
        case collective_kind::reduce_scatter:
            // In place, MPI leaves the result at the start of recv.
            check_mpi(MPI_Reduce_scatter_block(in, recv, n, type, op, comm),
                      "MPI_Reduce_scatter_block");
            return;
        case collective_kind::broadcast:
            if (!in_place && rank == root) {
                std::memcpy(recv, send, s.send_bytes); // MPI_Bcast has no separate input
            }
            check_mpi(MPI_Bcast(recv, n, type, root, comm), "MPI_Bcast");
            return;
        }
    }
};

std::string_view raw_mpi_name(collective_kind c) {
    switch (c) {
    case collective_kind::all_reduce:
        return "MPI_Allreduce";
    case collective_kind::all_gather:
        return "MPI_Allgather";
    case collective_kind::reduce_scatter:
        return "MPI_Reduce_scatter_block";
    case collective_kind::broadcast:
        return "MPI_Bcast";
    }
    return "?";
}

int run_mpi_once(const bench_config& cfg, mpi_communicator& comm, const run_info& info,
                 reporter* mine_out);

/// The MPI backend: one run, or one per --algorithm, one after another.
int run_mpi_ranks(const bench_config& cfg) {
    const comm_options base = comm_options::from_env();
    std::vector<algorithm> runs = cfg.algorithms;
    if (runs.empty()) {
        runs.push_back(base.all_reduce_algorithm);
    }
    std::unique_ptr<reporter> out;
    int status = 0;
    for (const algorithm a : runs) {
        comm_options o = base;
        o.all_reduce_algorithm = a;
        mpi_communicator comm(MPI_COMM_WORLD, o);
        const int rank = comm.rank();
        const int ranks = comm.size();
        if (!root_in_range(cfg, rank, ranks)) {
            return 2;
        }
        std::vector<rank_device> lines =
            gather_rank_devices(rank, ranks, host_rank(rank, "MPI process"));
        run_info info = make_run_info(cfg, ranks, 1, 0, std::move(lines));
        info.algorithm = std::string(to_string(mpi_forced_algorithm(o)));
        if (!o.tuning.empty()) {
            info.tuning_rules = o.tuning.source();
        }
        if (cfg.collective == collective_kind::all_reduce) {
            info.algorithm_at = [&comm](std::size_t bytes) {
                return std::string(to_string(comm.all_reduce_algorithm(bytes)));
            };
        } else if (cfg.collective == collective_kind::reduce_scatter) {
            info.algorithm_at = [&comm](std::size_t bytes) {
                return std::string(to_string(comm.reduce_scatter_algorithm(bytes)));
            };
        } else if (cfg.collective == collective_kind::all_gather) {
            info.algorithm_at = [&comm](std::size_t bytes) {
                return std::string(to_string(comm.all_gather_algorithm(bytes)));
            };
        }
        if (rank == 0 && !out) { // one reporter: CSV writes its header once
            out = make_reporter(cfg, info);
        }
        status = std::max(status, run_mpi_once(cfg, comm, info, out.get()));
    }
    return status;
}

/// One run of the MPI backend on `comm`; `out` is non-null on rank 0 only.
int run_mpi_once(const bench_config& cfg, mpi_communicator& comm, const run_info& info,
                 reporter* mine_out) {
    const int rank = comm.rank();
    const int ranks = comm.size();
    if (mine_out != nullptr) {
        mine_out->begin(info);
    }

    mpi_host_control ctl{MPI_COMM_WORLD};
    auto make_call = [&](const bench_config& k) {
        return unison_call<mpi_communicator>{comm, k.collective, k.type, k.op, k.root};
    };
    host_buffers mem(cfg.max_bytes + unalign_padding(cfg));
    auto make_raw = [&](const bench_config& k) {
        const bool reducing = reduces(k.collective);
        const MPI_Datatype type = raw_mpi_type(k.type, reducing);
        const MPI_Op op = reducing ? raw_mpi_op(k.op) : MPI_OP_NULL;
        raw_baseline<raw_mpi_call> raw;
        if (type == MPI_DATATYPE_NULL || (reducing && op == MPI_OP_NULL)) {
            raw.why_not = type == MPI_DATATYPE_NULL ? "MPI has no reduction for half or bfloat16"
                                                    : "MPI has no avg reduction";
        } else {
            raw.call = raw_mpi_call{MPI_COMM_WORLD, k.collective, type, op, k.root, rank};
            raw.what = std::string(raw_mpi_name(k.collective)) +
                       " (MPI_IN_PLACE in place) on the same buffers, sizes and dtype, timed and "
                       "checked the same way, size by size alternating with unison's calls";
            raw.result_at_start = k.collective == collective_kind::reduce_scatter;
        }
        return raw;
    };
    const std::uint64_t wrong = run_rank(cfg, ctl, mem, make_call, make_raw, rank, ranks, mine_out);
    return wrong == 0 ? 0 : 1;
}

#endif // UNISON_HAS_MPI()

// -------------------------------------------------------------------- NCCL backend

#if UNISON_HAS_NCCL() && UNISON_HAS_MPI()

/// Empty where this process sees a GPU; otherwise why not, in the CUDA runtime's
/// words (CUDA_VISIBLE_DEVICES= hides every GPU, the way a CPU node has none).
std::string no_gpu() {
    int devices = 0;
    const cudaError_t rc = cudaGetDeviceCount(&devices);
    if (rc != cudaSuccess) {
        return std::string(cudaGetErrorName(rc)) + ": " + cudaGetErrorString(rc);
    }
    return devices > 0 ? std::string() : "cudaGetDeviceCount found 0 devices";
}

/// A rank's buffers in device memory, with host staging to prepare inputs and
/// check results (copies on the communicator's stream, outside the timed loop).
class device_buffers {
public:
    device_buffers(std::size_t bytes, int rank, cudaStream_t stream)
        : stage_send_(bytes), stage_recv_(bytes), rank_(rank), stream_(stream) {
        UNISON_CHECK_CUDA(cudaMalloc(&send_, bytes), rank_, "unison-bench");
        UNISON_CHECK_CUDA(cudaMalloc(&recv_, bytes), rank_, "unison-bench");
        UNISON_CHECK_CUDA(cudaMemset(send_, 0, bytes), rank_, "unison-bench");
        UNISON_CHECK_CUDA(cudaMemset(recv_, 0, bytes), rank_, "unison-bench");
        UNISON_CHECK_CUDA(cudaDeviceSynchronize(), rank_, "unison-bench");
    }
    device_buffers(const device_buffers&) = delete;
    device_buffers& operator=(const device_buffers&) = delete;
    ~device_buffers() {
        cudaFree(send_);
        cudaFree(recv_);
    }

    /// -u: both buffers start this many bytes past their allocation.
    void set_offset(std::size_t bytes) noexcept { offset_ = bytes; }
    std::byte* send() noexcept { return static_cast<std::byte*>(send_) + offset_; }
    std::byte* recv() noexcept { return static_cast<std::byte*>(recv_) + offset_; }

    void prepare(const check_site& c, const data_pattern& p, bool in_place) {
        prepare_inputs(c, p, in_place, stage_send_.data(), stage_recv_.data());
        if (!in_place) {
            copy(send(), stage_send_.data(), c.shape.send_bytes, cudaMemcpyHostToDevice);
        }
        copy(recv(), stage_recv_.data(), c.shape.size_bytes(), cudaMemcpyHostToDevice);
        sync();
    }

    std::uint64_t wrong(const check_site& c, const data_pattern& p, bool in_place,
                        bool result_at_start) {
        copy(stage_recv_.data(), recv(), c.shape.size_bytes(), cudaMemcpyDeviceToHost);
        sync();
        const std::byte* r = stage_recv_.data();
        return count_wrong(c, p, result_at_start ? r : result_of(c, in_place, r));
    }

private:
    void copy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind) {
        UNISON_CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, kind, stream_), rank_, "unison-bench");
    }
    void sync() { UNISON_CHECK_CUDA(cudaStreamSynchronize(stream_), rank_, "unison-bench"); }

    host_memory stage_send_;
    host_memory stage_recv_;
    int rank_;
    cudaStream_t stream_;
    void* send_ = nullptr;
    void* recv_ = nullptr;
    std::size_t offset_ = 0;
};

/// The control plane of the NCCL runs: MPI on the host; finishing waits for the
/// calls enqueued since the last finish (nccl-tests' completeColl). -I marks each
/// call's start with a CUDA event on the communicator's stream, as nccl-tests does.
class nccl_control {
public:
    nccl_control(MPI_Comm c, std::vector<nccl_request>& pending, cudaStream_t stream, int rank)
        : host_{c}, pending_(pending), stream_(stream), rank_(rank) {}
    nccl_control(const nccl_control&) = delete;
    nccl_control& operator=(const nccl_control&) = delete;
    ~nccl_control() {
        for (cudaEvent_t e : events_) {
            cudaEventDestroy(e);
        }
    }

    void barrier() { host_.barrier(); }
    void finish() {
        std::vector<nccl_request> issued = std::move(pending_);
        pending_.clear();
        wait_all(std::span<nccl_request>(issued));
    }
    double max(double v) { return host_.max(v); }
    double sum(double v) { return host_.sum(v); }
    std::uint64_t sum(std::uint64_t v) { return host_.sum(v); }
    void max_each(std::vector<double>& v) { host_.max_each(v); }
    void sum_each(std::vector<double>& v) { host_.sum_each(v); }

    void begin_iterations(int n) {
        while (events_.size() < static_cast<std::size_t>(n) + 1) {
            cudaEvent_t e = nullptr;
            UNISON_CHECK_CUDA(cudaEventCreate(&e), rank_, "unison-bench");
            events_.push_back(e);
        }
        marked_ = 0;
    }
    void mark_iteration() {
        UNISON_CHECK_CUDA(cudaEventRecord(events_[marked_++], stream_), rank_, "unison-bench");
    }
    /// After finish(): each call's time, from its start event to the next one's (the
    /// last to the event recorded behind it, as nccl-tests does).
    std::vector<double> iteration_seconds() {
        UNISON_CHECK_CUDA(cudaEventSynchronize(events_[marked_ - 1]), rank_, "unison-bench");
        std::vector<double> t;
        for (std::size_t i = 1; i < marked_; ++i) {
            float ms = 0;
            UNISON_CHECK_CUDA(cudaEventElapsedTime(&ms, events_[i - 1], events_[i]), rank_,
                              "unison-bench");
            t.push_back(static_cast<double>(ms) * 1e-3);
        }
        return t;
    }

private:
    mpi_control host_;
    std::vector<nccl_request>& pending_;
    cudaStream_t stream_;
    int rank_;
    std::vector<cudaEvent_t> events_;
    std::size_t marked_ = 0;
};

int run_nccl_ranks(const bench_config& cfg) {
    nccl_communicator comm = nccl_communicator::from_mpi(MPI_COMM_WORLD);
    const int rank = comm.rank();
    const int ranks = comm.size();
    if (!root_in_range(cfg, rank, ranks)) {
        return 2;
    }
    cudaDeviceProp prop{};
    UNISON_CHECK_CUDA(cudaGetDeviceProperties(&prop, comm.device()), rank, "unison-bench");
    char bus_id[32];
    std::snprintf(bus_id, sizeof bus_id, "%04x:%02x:%02x", prop.pciDomainID, prop.pciBusID,
                  prop.pciDeviceID);
    rank_device mine = host_rank(rank, prop.name);
    mine.device = comm.device();
    mine.bus_id = bus_id;
    std::vector<rank_device> lines = gather_rank_devices(rank, ranks, mine);

    run_info info = make_run_info(cfg, ranks, 1, 1, std::move(lines));
    const std::unique_ptr<reporter> out = rank == 0 ? make_reporter(cfg, info) : nullptr;
    reporter* mine_out = out.get();
    if (mine_out != nullptr) {
        mine_out->begin(info);
    }
    std::vector<nccl_request> pending;
    nccl_control ctl(MPI_COMM_WORLD, pending, comm.stream(), rank);
    auto make_call = [&](const bench_config& k) {
        return unison_call<nccl_communicator>{
            comm, k.collective, k.type, k.op, k.root, device::cuda(comm.device()), &pending};
    };
    device_buffers mem(cfg.max_bytes + unalign_padding(cfg), rank, comm.stream());
    const std::uint64_t wrong =
        run_rank(cfg, ctl, mem, make_call, no_raw_mpi, rank, ranks, mine_out,
                 "the NCCL backend moves device memory, and a host loop is no reference for it");
    return wrong == 0 ? 0 : 1;
}

#endif // UNISON_HAS_NCCL() && UNISON_HAS_MPI()

} // namespace
} // namespace unison::bench

int main(int argc, char** argv) {
    using namespace unison::bench;
    bench_config cfg;
    try {
        cfg = parse_command_line(argc, argv);
    } catch (const usage_error& e) {
        if (launch_rank() == 0) {
            std::fprintf(stderr, "unison-bench: error: %s\n(unison-bench -h lists the options)\n",
                         e.what());
        }
        return 2;
    }
    if (cfg.help) {
        if (launch_rank() == 0) {
            std::fputs(usage_text(cfg.program_name).c_str(), stdout);
        }
        return 0;
    }
    if (cfg.version) {
        if (launch_rank() == 0) {
            std::printf("%s (unison %s)\n", cfg.program_name.c_str(), unison::version_string);
        }
        return 0;
    }
    if (cfg.timeout_seconds > 0) { // -T: read by every communicator's comm_options
        ::setenv("UNISON_TIMEOUT", std::to_string(cfg.timeout_seconds).c_str(), 1);
    }
    // Started by an MPI launcher (mpirun, srun, MPICH's mpiexec) with more than one
    // process and no -B or -t: join the MPI world, as nccl-tests' binaries do,
    // instead of running one thread benchmark per process.
    // nccl-tests' -t 1 and -g 1 (one thread, one GPU per process) do not keep it from
    // joining.
    if (!cfg.backend_given && (!cfg.thread_ranks_given || cfg.thread_ranks == 1) &&
        cfg.devices_per_thread == 1) {
        try {
            const unison::launch_info launch = unison::detect_launch();
            if (UNISON_HAS_GLOO() && launch.size > 1 && launch.launcher == "torchrun") {
                cfg.backend = backend_kind::gloo; // CPU processes without MPI
            } else if (launch.size > 1 && launch.launcher != "none" &&
                       launch.launcher != "torchrun") {
                cfg.backend = backend_kind::mpi;
                if (cfg.devices_given) {
                    cfg.neutral.push_back("-g 1");
                }
                if (cfg.thread_ranks_given) {
                    cfg.neutral.push_back("-t 1");
                }
            }
        } catch (const std::exception&) { // malformed variables: the backend reports them
        }
    } else if (!cfg.backend_given && cfg.devices_per_thread > 1) {
        try {
            const unison::launch_info launch = unison::detect_launch();
            if (launch.size > 1 && launch.launcher != "none") {
                if (launch_rank() == 0) {
                    std::fprintf(stderr,
                                 "unison-bench: error: -g %d under a launcher of %d processes: "
                                 "unison runs one rank per process, one device each (use -g 1, "
                                 "or -g %d without the launcher for %d thread ranks)\n",
                                 cfg.devices_per_thread, launch.size, cfg.devices_per_thread,
                                 cfg.thread_ranks);
                }
                return 2;
            }
        } catch (const std::exception&) {
        }
    }

    if (!cfg.algorithms.empty() && cfg.backend != backend_kind::mpi) {
        if (launch_rank() == 0) {
            std::fprintf(stderr,
                         "unison-bench: error: --algorithm needs -B mpi: the %s backend has one "
                         "algorithm\n",
                         std::string(to_string(cfg.backend)).c_str());
        }
        return 2;
    }
    try {
        switch (cfg.backend) {
        case backend_kind::thread:
            return run_thread_backend(cfg);
        case backend_kind::mpi:
#if UNISON_HAS_MPI()
            if (outside_a_launcher()) {
                std::fprintf(stderr,
                             "unison-bench: error: -B mpi outside an MPI launcher would time one "
                             "rank alone (bus bandwidth 0); start it as mpiexec -n N "
                             "unison-bench -B mpi ..., or time threads with -B thread -t N\n");
                return 2;
            }
            return run_mpi_job("unison-bench", argc, argv, [&] { return run_mpi_ranks(cfg); });
#else
            if (launch_rank() == 0) {
                std::fprintf(stderr, "unison-bench: error: this build has no MPI backend "
                                     "(configure with MPI found, so that unison::mpi exists)\n");
            }
            return 2;
#endif
        case backend_kind::gloo:
#if UNISON_HAS_GLOO()
            return run_gloo_ranks(cfg);
#else
            if (launch_rank() == 0) {
                std::fprintf(stderr, "unison-bench: error: this build has no Gloo backend "
                                     "(configure with Gloo found, so that unison::gloo exists)\n");
            }
            return 2;
#endif
        case backend_kind::nccl:
#if UNISON_HAS_NCCL() && UNISON_HAS_MPI()
            if (const std::string why = no_gpu(); !why.empty()) {
                std::fprintf(stderr,
                             "unison-bench: error: -B nccl needs a GPU per rank, and rank %d "
                             "sees none (%s); on CPUs use -B mpi or -B thread\n",
                             launch_rank(), why.c_str());
                return 2;
            }
            return run_mpi_job("unison-bench", argc, argv, [&] { return run_nccl_ranks(cfg); });
#else
            if (launch_rank() == 0) {
                std::fprintf(stderr, "unison-bench: error: this build has no NCCL backend%s\n",
                             UNISON_HAS_NCCL() ? " (NCCL needs unison::mpi to bootstrap)" : "");
            }
            return 2;
#endif
        }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "unison-bench: %s\n", e.what());
        return 1;
    }
    return 0;
}
