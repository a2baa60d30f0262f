// Times what the engines themselves cost on the MPI backend, apart from moving
// gradients: ddp's and fsdp's (ZeRO-3's) start() -- the layout checks and the
// broadcast of rank 0's parameters -- and a training step of a model so small that
// its data costs next to nothing, so that a step is its calls' latencies: the
// bucket all-reduces of ddp, fsdp's all-gathers and reduce-scatters per unit and
// its per-step statistics all-reduce, and the call check inside every one of them.
// The program bench/simulation/simulate.sh builds with SimGrid's smpicxx and runs
// under smpirun (`-d engine_sim`); it builds and runs under a real MPI too.
//
//   engine_sim [-u units] [-e elements] [-s steps] [-w warmup] [--engine ddp,fsdp]
//
// A model of `units` units (default 4), each a weight of `elements` floats
// (default 1024) and a bias of 16. Each rank's gradients are small integers that
// differ by rank and step, so the averages are exact.
//
// Output, one CSV row per engine and phase (rank 0):
//   ranks,engine,phase,us,calls,correct
// `us` is the slowest rank's time (start: the one call; step: the mean over
// `steps` after `warmup` untimed ones), `calls` the collectives the engine issued
// per rank in that phase (counted by a counting_communicator), and `correct` says
// whether ddp's parameters after start() are rank 0's and its averaged gradients
// equal a serial double-precision average of every rank's, whether fsdp's
// parameters gathered after start() are their initial values, and whether every
// rank's fsdp parameters, gathered after the steps, are the same to the bit and
// moved (a check of consistency, not against a reference optimizer).

#include <unison/comm/collectives.hpp>
#include <unison/comm/counting_communicator.hpp>
#include <unison/ddp.hpp>
#include <unison/mpi/mpi_communicator.hpp>
#include <unison/sharded.hpp>

#include <mpi.h>

#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace {

struct options {
    int units = 4;
    std::size_t elements = 1024;
    int steps = 10;
    int warmup = 2;
    bool ddp = true;
    bool fsdp = true;
};

options parse(int argc, char** argv) {
    options o;
    for (int i = 1; i < argc; ++i) {
        const std::string_view a = argv[i];
        const auto value = [&]() -> const char* {
            if (i + 1 >= argc) {
                throw std::invalid_argument(std::string(a) + " needs a value");
            }
            return argv[++i];
        };
        if (a == "-u") {
            o.units = std::atoi(value());
        } else if (a == "-e") {
            o.elements = static_cast<std::size_t>(std::strtoull(value(), nullptr, 10));
        } else if (a == "-s") {
            o.steps = std::atoi(value());
        } else if (a == "-w") {
            o.warmup = std::atoi(value());
        } else if (a == "--engine") {
            const std::string_view e = value();
            o.ddp = e.find("ddp") != std::string_view::npos;
            o.fsdp = e.find("fsdp") != std::string_view::npos;
            if (!o.ddp && !o.fsdp) {
                throw std::invalid_argument("--engine takes ddp, fsdp or ddp,fsdp");
            }
        } else {
            throw std::invalid_argument("unknown option '" + std::string(a) + "'");
        }
    }
    if (o.units < 1 || o.elements < 1 || o.steps < 1 || o.warmup < 0) {
        throw std::invalid_argument("need -u >= 1, -e >= 1, -s >= 1, -w >= 0");
    }
    return o;
}

constexpr std::size_t bias_elements = 16;

/// Rank r's gradient element i of tensor t at step s: a small integer.
float gradient(int rank, int step, std::size_t t, std::size_t i) {
    return static_cast<float>(
        static_cast<int>((i * 5 + t * 11 + static_cast<std::size_t>(rank) * 7 +
                          static_cast<std::size_t>(step) * 3) %
                         13) -
        6);
}

/// The slowest rank's value of `mine`, on rank 0.
double slowest(double mine) {
    double worst = 0;
    MPI_Reduce(&mine, &worst, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    return worst;
}

/// Whether `ok` holds on every rank (on rank 0).
bool everywhere(bool ok) {
    int mine = ok ? 1 : 0, all = 0;
    MPI_Reduce(&mine, &all, 1, MPI_INT, MPI_MIN, 0, MPI_COMM_WORLD);
    return all == 1;
}

using counted = unison::counting_communicator<unison::mpi_communicator>;

/// Times `f` on every rank after a barrier; the slowest rank's seconds (rank 0).
template <class F>
double timed(F&& f) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    f();
    return slowest(MPI_Wtime() - t0);
}

/// Runs `step(s)` for o.warmup untimed steps, then o.steps timed ones; the slowest
/// rank's seconds per step (rank 0) and this rank's collectives per step.
template <class Step>
std::pair<double, double> time_steps(counted& comm, const options& o, Step&& step) {
    for (int s = 0; s < o.warmup; ++s) {
        step(s);
    }
    comm.reset();
    const double seconds = timed([&] {
        for (int s = 0; s < o.steps; ++s) {
            step(o.warmup + s);
        }
    });
    return {seconds / o.steps, static_cast<double>(comm.total().calls) / o.steps};
}

void report(int rank, int ranks, const char* engine, const char* phase, double seconds,
            double calls, const char* correct) {
    if (rank == 0) {
        std::printf("%d,%s,%s,%.3f,%.1f,%s\n", ranks, engine, phase, seconds * 1e6, calls, correct);
        std::fflush(stdout);
    }
}

void run_ddp(unison::mpi_communicator& mpi, const options& o) {
    const int rank = mpi.rank(), ranks = mpi.size();
    counted comm(mpi);
    const auto tensors = static_cast<std::size_t>(2 * o.units);
    std::vector<std::vector<float>> values(tensors), grads(tensors);
    for (std::size_t t = 0; t < tensors; ++t) {
        const std::size_t n = t % 2 == 0 ? o.elements : bias_elements;
        values[t].assign(n, static_cast<float>(rank + 1)); // start() makes them rank 0's
        grads[t].assign(n, 0.0f);
    }
    unison::ddp<counted> dp(comm);
    for (std::size_t t = 0; t < tensors; ++t) {
        dp.add_parameter(values[t], grads[t], "p" + std::to_string(t));
    }
    const double start = timed([&] { dp.start(); });
    const double start_calls = static_cast<double>(comm.total().calls);
    bool ok = true;
    for (std::size_t t = 0; t < tensors; ++t) {
        for (float v : values[t]) {
            ok = ok && v == 1.0f;
        }
    }
    report(rank, ranks, "ddp", "start", start, start_calls, everywhere(ok) ? "ok" : "wrong");

    const auto step = [&](int s) {
        for (std::size_t t = 0; t < tensors; ++t) {
            for (std::size_t i = 0; i < grads[t].size(); ++i) {
                grads[t][i] = gradient(rank, s, t, i);
            }
        }
        for (std::size_t t = tensors; t-- > 0;) { // backward: the last layer first
            dp.mark_ready(t);
        }
        if (!dp.finish()) {
            throw std::runtime_error("ddp finish() did not complete a step");
        }
    };
    const auto [seconds, calls] = time_steps(comm, o, step);
    const int last = o.warmup + o.steps - 1;
    for (std::size_t t = 0; t < tensors; ++t) {
        for (std::size_t i = 0; i < grads[t].size(); ++i) {
            double sum = 0;
            for (int r = 0; r < ranks; ++r) {
                sum += gradient(r, last, t, i);
            }
            const double mean = sum / ranks;
            ok = ok &&
                 std::abs(static_cast<double>(grads[t][i]) - mean) <= 1e-6 * (1 + std::abs(mean));
        }
    }
    report(rank, ranks, "ddp", "step", seconds, calls, everywhere(ok) ? "ok" : "wrong");
}

void run_fsdp(unison::mpi_communicator& mpi, const options& o) {
    const int rank = mpi.rank(), ranks = mpi.size();
    counted comm(mpi);
    using engine_type = unison::fsdp<counted, unison::policy::zero<3>>;
    engine_type engine(comm, {.optimizer = {.lr = 1e-3}, .max_grad_norm = 1.0});
    const auto tensors = static_cast<std::size_t>(2 * o.units);
    std::vector<std::vector<float>> initial(tensors);
    // Where each tensor's gathered values and gradient are while its unit is live.
    std::vector<unison::view<float>> value(tensors), grad(tensors);
    std::vector<unison::unit_handle> units;
    for (int u = 0; u < o.units; ++u) {
        std::vector<unison::unit_parameter<float>> params;
        for (std::size_t t = 2 * static_cast<std::size_t>(u);
             t < 2 * static_cast<std::size_t>(u) + 2; ++t) {
            const std::size_t n = t % 2 == 0 ? o.elements : bias_elements;
            initial[t].resize(n);
            for (std::size_t i = 0; i < n; ++i) {
                initial[t][i] = 0.01f * static_cast<float>(static_cast<int>((i + t) % 7) - 3);
            }
            params.emplace_back("p" + std::to_string(t), initial[t],
                                [&value, &grad, t](unison::view<float> v, unison::view<float> g) {
                                    value[t] = v;
                                    grad[t] = g;
                                });
        }
        units.push_back(engine.add_unit(params));
    }
    const double start = timed([&] { engine.start(); });
    const double start_calls = static_cast<double>(comm.total().calls);
    // Every unit, gathered from the shards start() made, holds its initial values
    // to the bit.
    bool started = true;
    for (std::size_t u = 0; u < units.size(); ++u) {
        engine.before_forward(units[u]);
        for (std::size_t t = 2 * u; t < 2 * u + 2; ++t) {
            started = started && value[t].size == initial[t].size() &&
                      std::memcmp(value[t].data, initial[t].data(),
                                  initial[t].size() * sizeof(float)) == 0;
        }
        engine.after_forward(units[u]);
    }
    report(rank, ranks, "fsdp", "start", start, start_calls, everywhere(started) ? "ok" : "wrong");

    const auto step = [&](int s) {
        for (const auto& u : units) {
            engine.before_forward(u);
            engine.after_forward(u);
        }
        for (std::size_t u = units.size(); u-- > 0;) {
            engine.before_backward(units[u]);
            for (std::size_t t = 2 * u; t < 2 * u + 2; ++t) {
                for (std::size_t i = 0; i < grad[t].size; ++i) {
                    grad[t].data[i] += gradient(rank, s, t, i);
                }
            }
            engine.after_backward(units[u]);
        }
        (void)engine.step();
    };
    const auto [seconds, calls] = time_steps(comm, o, step);
    // Every rank's parameters, gathered, must be the same to the bit.
    bool ok = true;
    for (std::size_t u = 0; u < units.size(); ++u) {
        engine.before_forward(units[u]);
        for (std::size_t t = 2 * u; t < 2 * u + 2; ++t) {
            std::vector<float> mine(value[t].data, value[t].data + value[t].size);
            std::vector<float> first(mine);
            MPI_Bcast(first.data(), static_cast<int>(first.size()), MPI_FLOAT, 0, MPI_COMM_WORLD);
            ok = ok && std::memcmp(first.data(), mine.data(), mine.size() * sizeof(float)) == 0;
            // ... and moved from where they started.
            ok =
                ok && std::memcmp(mine.data(), initial[t].data(), mine.size() * sizeof(float)) != 0;
        }
        engine.after_forward(units[u]);
    }
    report(rank, ranks, "fsdp", "step", seconds, calls, everywhere(ok) ? "ok" : "wrong");
}

} // namespace

int main(int argc, char** argv) {
    MPI_Init(&argc, &argv);
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    int rc = 0;
    try {
        const options o = parse(argc, argv);
        if (rank == 0) {
            std::printf("ranks,engine,phase,us,calls,correct\n");
        }
        unison::mpi_communicator mpi(MPI_COMM_WORLD, unison::comm_options::from_env());
        if (o.ddp) {
            run_ddp(mpi, o);
        }
        if (o.fsdp) {
            run_fsdp(mpi, o);
        }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "engine_sim: rank %d: %s\n", rank, e.what());
        rc = 1;
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    MPI_Finalize();
    return rc;
}
