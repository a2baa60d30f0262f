/// \file
/// unison-zero-bench: per-rank model-state memory, per-step traffic and step time of
/// every sharding, for the model of bench/training/model_shapes.json (200 tensors, 25.9 M
/// parameters) trained with bf16 parameters, f32 master weights and AdamW -- the
/// setting of the ZeRO paper's formulas -- on the thread backend.
///
///     unison-zero-bench                 # 1, 2 and 4 ranks
///     unison-zero-bench -r 2,4 -n 5     # ranks 2 and 4, 5 timed steps each
///     unison-zero-bench -r 4 -a 4       # and gradient accumulation over 4 micro-batches
///
/// Consecutive tensors are grouped into units of at least 2 M parameters (about a
/// transformer block each), each a unit of the fsdp engine. One step is what a
/// training step does to the state: every unit's forward scope (gather, prefetch,
/// release), every unit's backward scope in reverse (gather, write its bf16
/// gradients, reduce-scatter or all-reduce them, release), then engine.step() (its
/// checks, the AdamW update, zeroing). Memory is what the engine's memory() and
/// optimizer_state_bytes() report on rank 0; traffic is counting_communicator's ring
/// elements per rank in one step, the step's small all-reduce of checks (8 doubles)
/// included; the time is the median over -n steps of the slowest rank, after one
/// untimed step. Memory and traffic are printed over Psi, next to the formulas.
///
/// With `-a K`, a second table: the strategies that shard gradients with K
/// micro-batches per optimizer step (accumulate_steps = K; each micro-batch one
/// forward and backward of every unit, then step()), in each accumulation mode:
/// the peak of transient memory (gathered parameters and full gradients), the
/// traffic of one window over Psi and the window's time.

#include "model_shapes.hpp"
#include "model_shapes_json.hpp" // generated from model_shapes.json (bench/CMakeLists.txt)

#include <unison/comm/counting_communicator.hpp>
#include <unison/sharded.hpp>
#include <unison/thread.hpp>
#include <unison/version.hpp>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace {

using namespace unison;
using clock_type = std::chrono::steady_clock;

struct row {
    std::string sharding;
    std::string mode;
    int ranks = 0;
    double memory_per_psi = 0, memory_formula = 0;
    double traffic_per_psi = 0, traffic_formula = 0;
    double step_ms = 0;
    double gathered_peak_mb = 0;
};

template <class Sharding>
row measure(const bench::model_shapes& model, int ranks, int iterations, const char* label,
            double memory_formula, double traffic_factor, int micro = 1,
            accumulation mode = accumulation::in_shard) {
    row out;
    out.sharding = label;
    out.mode = mode == accumulation::in_shard ? "in_shard" : "unsharded";
    out.ranks = ranks;
    std::mutex m;
    std::vector<double> slowest(static_cast<std::size_t>(iterations), 0.0);
    thread_world(ranks).run([&](thread_communicator& comm) {
        counting_communicator<thread_communicator> counted(comm);
        using engine_type = fsdp<counting_communicator<thread_communicator>, Sharding,
                                 policy::mixed_precision<dtype::bf16, dtype::bf16, dtype::f32>>;
        const int group = engine_type::strategy::hybrid ? std::max(1, ranks / 2) : ranks;
        engine_type engine(
            counted, {.shard_group_size = group, .accumulate_steps = micro, .accumulate = mode});
        std::vector<typename engine_type::parameter> unit;
        std::vector<unit_handle> units;
        std::size_t in_unit = 0;
        for (const bench::model_tensor& t : model.tensors) {
            unit.emplace_back(t.name, t.elements());
            in_unit += t.elements();
            if (in_unit >= (std::size_t{2} << 20)) {
                units.push_back(engine.add_unit(unit));
                unit.clear();
                in_unit = 0;
            }
        }
        if (!unit.empty()) {
            units.push_back(engine.add_unit(unit));
        }
        engine.start();
        const bf16 value(0.001f * static_cast<float>(comm.rank() + 1));

        auto step = [&] { // one optimizer step: `micro` micro-batches
            for (int m = 0; m < micro; ++m) {
                for (const unit_handle& u : units) {
                    auto scope = engine.forward(u);
                    (void)engine.value(u[0]);
                }
                for (auto u = units.rbegin(); u != units.rend(); ++u) {
                    auto scope = engine.backward(*u);
                    for (std::size_t j = 0; j < u->size(); ++j) {
                        auto g = engine.gradient((*u)[j]);
                        for (std::size_t i = 0; i < g.size; ++i) {
                            g.data[i] =
                                bf16(static_cast<float>(g.data[i]) + static_cast<float>(value));
                        }
                    }
                }
                engine.step();
            }
        };
        step(); // untimed; also settles the allocator
        counted.reset();
        for (int i = 0; i < iterations; ++i) {
            barrier(comm);
            const auto t0 = clock_type::now();
            step();
            const double ms =
                std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
            std::lock_guard lock(m);
            slowest[static_cast<std::size_t>(i)] =
                std::max(slowest[static_cast<std::size_t>(i)], ms);
        }
        if (comm.rank() == 0) {
            const double psi = static_cast<double>(engine.numel());
            const memory_report r = engine.memory();
            out.memory_per_psi = static_cast<double>(r.parameters + r.gradients + r.master +
                                                     engine.optimizer_state_bytes()) /
                                 psi;
            out.memory_formula = memory_formula;
            const double moved = counted.of(operation::all_gather).ring_elements +
                                 counted.of(operation::reduce_scatter).ring_elements +
                                 counted.of(operation::all_reduce).ring_elements;
            out.traffic_per_psi = moved / iterations / psi;
            out.traffic_formula = traffic_factor * (ranks - 1.0) / ranks;
            out.gathered_peak_mb = static_cast<double>(r.gathered_peak) / 1e6;
        }
    });
    std::sort(slowest.begin(), slowest.end());
    out.step_ms = slowest[slowest.size() / 2];
    return out;
}

/// The usage, on stdout for -h (exit 0), else on stderr after `why` (exit 2).
int usage(const std::string& why = {}) {
    if (!why.empty()) {
        std::fprintf(stderr, "unison-zero-bench: %s\n", why.c_str());
    }
    std::fprintf(why.empty() ? stdout : stderr,
                 "usage: unison-zero-bench [-r ranks,ranks,...] [-n timed steps] "
                 "[-a micro-batches per step] [--version]\n");
    return why.empty() ? 0 : 2;
}

/// `text` as a whole number in [1, high] (all of it), or 0 after saying what is
/// wrong, naming `option`.
int positive(std::string_view option, std::string_view text, int high) {
    int v = 0;
    const char* last = text.data() + text.size();
    const auto [end, ec] = std::from_chars(text.data(), last, v);
    if (ec != std::errc() || end != last || v < 1 || v > high) {
        std::fprintf(stderr, "unison-zero-bench: %.*s: '%.*s' is not a whole number in [1, %d]\n",
                     static_cast<int>(option.size()), option.data(), static_cast<int>(text.size()),
                     text.data(), high);
        return 0;
    }
    return v;
}

} // namespace

int main(int argc, char** argv) {
    std::vector<int> ranks_list{1, 2, 4};
    int iterations = 3;
    int micro = 0;
    for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        if (arg == "-h" || arg == "--help") {
            return usage();
        }
        if (arg == "--version") {
            std::printf("unison-zero-bench (unison %s)\n", unison::version_string);
            return 0;
        }
        if (arg != "-r" && arg != "-a" && arg != "-n") {
            return usage("unknown option '" + arg + "'");
        }
        if (i + 1 >= argc) {
            return usage("option " + arg + " needs a value");
        }
        const std::string value = argv[++i];
        if (arg == "-r") {
            ranks_list.clear();
            std::size_t at = 0;
            while (at <= value.size()) {
                const std::size_t comma = std::min(value.find(',', at), value.size());
                const int r = positive(arg, std::string_view(value).substr(at, comma - at), 1024);
                if (r < 1) {
                    return 2;
                }
                ranks_list.push_back(r);
                at = comma + 1;
            }
        } else if (arg == "-a") {
            micro = positive(arg, value, 1024);
            if (micro < 1) {
                return 2;
            }
        } else if (arg == "-n") {
            iterations = positive(arg, value, 1 << 20);
            if (iterations < 1) {
                return 2;
            }
        }
    }
    try {
        const bench::model_shapes model = bench::parse_model_shapes(
            bench::model_shapes_json, "bench/training/model_shapes.json (built in)");
        const double psi = static_cast<double>(model.elements());
        std::printf("unison-zero-bench: %zu tensors, Psi = %.0f parameters; bf16 parameters and "
                    "gradients, f32 master weights, AdamW; thread backend\n\n",
                    model.tensors.size(), psi);
        std::printf("| sharding | ranks | state bytes / Psi | formula | traffic / Psi | formula | "
                    "peak gathered MB | step ms |\n");
        std::printf("|---|---:|---:|---:|---:|---:|---:|---:|\n");
        for (int n : ranks_list) {
            const double N = n;
            std::vector<row> rows;
            rows.push_back(measure<policy::zero<0>>(model, n, iterations, "zero<0> (DDP)", 16, 2));
            rows.push_back(
                measure<policy::zero<1>>(model, n, iterations, "zero<1>", 4 + 12 / N, 2));
            rows.push_back(
                measure<policy::zero<2>>(model, n, iterations, "zero<2>", 2 + 14 / N, 2));
            rows.push_back(
                measure<policy::zero<3>>(model, n, iterations, "zero<3> = shard::full", 16 / N, 3));
            rows.push_back(
                measure<policy::shard::grad_op>(model, n, iterations, "shard::grad_op", 16 / N, 2));
            if (n >= 4 && n % 2 == 0) {
                // Groups of N/2: sharded over N/2, the shard all-reduced across the 2 groups.
                const double g = N / 2;
                rows.push_back(measure<policy::shard::hybrid>(
                    model, n, iterations, "shard::hybrid, 2 groups", 16 / g, 0));
                rows.back().traffic_formula = 3.0 * (g - 1) / g + 2.0 * (2 - 1) / 2 / g;
            }
            for (const row& r : rows) {
                std::printf("| %s | %d | %.3f | %.3f | %.3f | %.3f | %.1f | %.1f |\n",
                            r.sharding.c_str(), r.ranks, r.memory_per_psi, r.memory_formula,
                            r.traffic_per_psi, r.traffic_formula, r.gathered_peak_mb, r.step_ms);
            }
        }
        if (micro > 0) {
            std::printf("\nGradient accumulation, %d micro-batches per step: transient memory "
                        "(gathered parameters and full gradients) and traffic of one step\n\n",
                        micro);
            std::printf("| sharding | accumulate | ranks | peak gathered MB | traffic / Psi | "
                        "step ms |\n");
            std::printf("|---|---|---:|---:|---:|---:|\n");
            for (int n : ranks_list) {
                std::vector<row> rows;
                for (const accumulation mode : {accumulation::in_shard, accumulation::unsharded}) {
                    rows.push_back(measure<policy::zero<2>>(model, n, iterations, "zero<2>", 0, 0,
                                                            micro, mode));
                    rows.push_back(measure<policy::zero<3>>(
                        model, n, iterations, "zero<3> = shard::full", 0, 0, micro, mode));
                }
                for (const row& r : rows) {
                    std::printf("| %s | %s | %d | %.1f | %.3f | %.1f |\n", r.sharding.c_str(),
                                r.mode.c_str(), r.ranks, r.gathered_peak_mb, r.traffic_per_psi,
                                r.step_ms);
                }
            }
        }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "unison-zero-bench: %s\n", e.what());
        return 1;
    }
    return 0;
}
