// ZeRO-3 training with AdamW, a sharded checkpoint, and a resume at another world
// size: the template to copy when your framework should hold only 1/N of the model
// state per rank. The model is the MLP of ddp_mlp (examples/common/nn); unison owns
// its parameters, gradients, master weights and optimizer state.
//
//   ./zero_adamw -t 4 --steps 100 --save ckpt            train on 4 thread ranks, save
//   ./zero_adamw -t 2 --steps 200 --resume ckpt          resume on 2 ranks, train on
//   mpirun -n 4 ./zero_adamw --steps 100 --save ckpt     the same under MPI
//   mpirun -n 2 ./zero_adamw --steps 200 --resume ckpt
//   torchrun --nproc_per_node=2 --no_python ./zero_adamw   over Gloo, without MPI
//
// The loop has the shape every strategy shares (DDP, ZeRO 1-3, FSDP; only the policy
// changes): forward (each layer's hooks enter and leave its unit: gather, release),
// backward (the same, and the unit's gradients are reduce-scattered on leaving), step
// (clip, update, zero the gradients for the next step).
// Each rank trains on its shard of every global batch of a synthetic data set; the
// global batch, and so the training, does not depend on the number of ranks.

#include "cli/cli.hpp"
#include "nn/nn.hpp"

#include <unison/unison.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace {

struct settings {
    int threads = 4;
    std::string backend = "auto";
    int steps = 100;
    std::size_t batch = 480; // global batch, split evenly over the ranks (1-6, 8, 10, 12...)
    double lr = 1e-3;
    int log_every = 10;
    std::string save, resume;
};

template <unison::communicator C>
int train(C& comm, const settings& s) {
    using namespace unison;
    const auto ranks = static_cast<std::size_t>(comm.size());
    const auto rank = static_cast<std::size_t>(comm.rank());
    if (s.batch % ranks != 0) {
        if (rank == 0) {
            std::fprintf(stderr, "zero_adamw: batch %zu does not split over %zu ranks\n", s.batch,
                         ranks);
        }
        return 2;
    }
    const std::size_t shard = s.batch / ranks;
    const std::size_t features = 64, classes = 10, samples = 32 * s.batch;
    const auto data = nn::make_classification<float>(samples, features, classes, 2024);
    nn::mlp<float> model({features, 256, 256, classes}, /*seed=*/7);

    // --- unison: one unit per layer, ZeRO-3, AdamW on this rank's shard ---------------
    // AdamW unless another optimizer type is given (optim::sgd, ...). Other strategies:
    // policy::zero<1>, zero<2>, shard::hybrid (with .shard_group_size), shard::none for
    // plain DDP; mixed precision with policy::mixed_precision<dtype::bf16> (then the
    // model computes in bf16).
    fsdp<C, policy::zero<3>> engine(comm, {.optimizer = {.lr = s.lr}, .max_grad_norm = 1.0});
    std::vector<unit_handle> units;
    for (std::size_t k = 0; k < model.layer_count(); ++k) {
        std::vector<unit_parameter<float>> params; // initial values, how nn sees them
        for (nn::parameter<float>* p : model.layer_parameters(k)) {
            params.emplace_back(p->name, p->own_value, [p](view<float> v, view<float> g) {
                p->bind_value(v); // nn computes in unison's memory (empty: its own again)
                p->bind_grad(g);
            });
        }
        units.push_back(engine.add_unit(params));
    }
    engine.start(); // checks that every rank built the same model with the same values
    model.before_forward = [&](std::size_t k) { engine.before_forward(units[k]); };
    model.after_forward = [&](std::size_t k) { engine.after_forward(units[k]); };
    model.before_backward = [&](std::size_t k) { engine.before_backward(units[k]); };
    model.after_backward = [&](std::size_t k) { engine.after_backward(units[k]); };
    if (!s.resume.empty()) {
        load_checkpoint(s.resume, engine); // any world size, any strategy
    }
    // ---------------------------------------------------------------------------------

    const int first_step = static_cast<int>(engine.steps());
    if (rank == 0) {
        const memory_report m = engine.memory();
        std::printf("zero_adamw: %zu ranks, %zu parameters, global batch %zu; per rank: "
                    "parameters %zu B, gradients %zu B, AdamW state %zu B\n",
                    ranks, engine.numel(), s.batch, m.parameters, m.gradients,
                    engine.optimizer_state_bytes());
        if (first_step > 0) {
            std::printf("zero_adamw: resumed from %s at step %d\n", s.resume.c_str(), first_step);
        }
    }
    std::vector<double> loss_and_right(2);
    double first_loss = -1.0, last_loss = 0.0;
    for (int step = first_step; step < s.steps; ++step) {
        const auto start = std::chrono::steady_clock::now();
        const std::size_t begin =
            (static_cast<std::size_t>(step) * s.batch) % samples + rank * shard;
        const auto batch = nn::slice(data, begin, begin + shard);

        // Phases on the timeline (UNISON_TIMELINE=path; nothing when it is unset).
        std::optional<unison::timeline::scope> phase(std::in_place, comm.rank(), "forward");
        const auto logits = model.forward(batch.x);
        const auto loss = nn::softmax_cross_entropy<float>(logits, batch.labels,
                                                           1.0f / static_cast<float>(shard));
        phase.emplace(comm.rank(), "backward");
        model.backward(loss.dlogits);
        phase.emplace(comm.rank(), "step");
        const step_result r = engine.step(); // reduce-scatters done, clipped, updated, zeroed
        phase.reset();

        loss_and_right[0] = static_cast<double>(loss.loss) / static_cast<double>(ranks);
        loss_and_right[1] = nn::accuracy(logits, batch.labels) / static_cast<double>(ranks);
        all_reduce(comm, loss_and_right);
        const double seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        if (first_loss < 0) {
            first_loss = loss_and_right[0];
        }
        last_loss = loss_and_right[0];
        if (rank == 0 && (step % s.log_every == 0 || step + 1 == s.steps)) {
            std::printf("step %4d  loss %.4f  accuracy %.3f  grad norm %.3f%s  %8.0f samples/s\n",
                        step, loss_and_right[0], loss_and_right[1], r.grad_norm,
                        r.clip_coefficient < 1.0 ? " (clipped)" : "",
                        static_cast<double>(s.batch) / seconds);
        }
    }
    if (rank == 0) {
        std::printf("zero_adamw: peak %d layers gathered at once, %zu bytes\n",
                    engine.memory().live_units_peak, engine.memory().gathered_peak);
    }
    if (!s.save.empty()) {
        save_checkpoint(s.save, engine);
        if (rank == 0) {
            std::printf("zero_adamw: saved step %llu to %s\n",
                        static_cast<unsigned long long>(engine.steps()), s.save.c_str());
        }
    }
    const bool improved = first_loss < 0 || last_loss < first_loss;
    if (rank == 0 && first_loss >= 0) {
        std::printf("zero_adamw: loss %.4f -> %.4f (%s)\n", first_loss, last_loss,
                    improved ? "went down" : "DID NOT go down");
    }
    return improved ? 0 : 1;
}

} // namespace

int main(int argc, char** argv) {
    settings s;
    constexpr int most = 1 << 30;
    cli::parser cli("zero_adamw", "ZeRO-3 training of an MLP with AdamW; saves and resumes.",
                    unison::version_string);
    cli.value("-t", "threads", s.threads, 1, 1024, "ranks as threads, outside a launcher")
        .text("--backend", "NAME", s.backend,
              "auto (MPI under mpirun or srun, Gloo under torchrun, else threads), threads, "
              "mpi or gloo")
        .value("--steps", "N", s.steps, 1, most, "optimizer steps")
        .value("--batch", "N", s.batch, std::size_t{1}, std::size_t{1} << 30,
               "global batch, split evenly over the ranks")
        .value("--lr", "X", s.lr, 1e-12, 10.0, "learning rate")
        .value("--log-every", "N", s.log_every, 1, most, "steps between printed losses")
        .text("--save", "DIR", s.save, "write a sharded checkpoint there at the end")
        .text("--resume", "DIR", s.resume, "start from the checkpoint there");
    if (const std::optional<int> exit_code = cli.parse(argc, argv)) {
        return *exit_code;
    }
    try {
        const unison::launch_info launch = unison::detect_launch();
        // auto: MPI under an MPI launcher, Gloo (where built with it) under torchrun
        // without one, threads outside any launcher.
        std::string backend = s.backend;
        if (backend == "auto") {
            backend = launch.launcher == "none"                            ? "threads"
                      : launch.launcher == "torchrun" && UNISON_HAS_GLOO() ? "gloo"
                                                                           : "mpi";
        }
        if (backend != "threads" && backend != "mpi" && backend != "gloo") {
            std::fprintf(stderr, "%s: --backend '%s' is none of auto, threads, mpi, gloo\n",
                         "zero_adamw", backend.c_str());
            return 2;
        }
#if UNISON_HAS_GLOO()
        if (backend == "gloo") { // the ranks meet at MASTER_ADDR:MASTER_PORT
            unison::gloo_communicator comm = unison::gloo_communicator::from_env();
            return train(comm, s);
        }
#endif
#if UNISON_HAS_MPI()
        if (backend == "mpi") { // started by mpirun or srun
            std::optional<unison::mpi_environment> env;
            try {
                env.emplace(argc, argv); // checks that the launcher and MPI agree on the job
            } catch (const unison::error& e) {
                std::fprintf(stderr, "zero_adamw: %s\n", e.what());
                return 2;
            }
            try {
                unison::mpi_communicator comm(MPI_COMM_WORLD);
                return train(comm, s);
            } catch (const std::exception& e) {
                // The other ranks may be waiting in a collective this rank will never
                // join: end the job, rather than wait for them in MPI_Finalize.
                unison::mpi_environment::abort_job("zero_adamw", e);
            }
        }
#endif
        if (backend != "threads") {
            std::fprintf(stderr, "zero_adamw: built without the %s backend\n", backend.c_str());
            return 2;
        }
        if (launch.size > 1) {
            std::fprintf(stderr,
                         "zero_adamw: launched as %d ranks, but the threads backend runs "
                         "in one process (-t)\n",
                         launch.size);
            return 2;
        }
        std::atomic<int> worst{0};
        unison::thread_world(s.threads).run([&](unison::thread_communicator& comm) {
            const int rc = train(comm, s);
            int seen = worst.load();
            while (rc > seen && !worst.compare_exchange_weak(seen, rc)) {
            }
        });
        return worst.load();
    } catch (const std::exception& e) {
        std::fprintf(stderr, "zero_adamw: %s\n", e.what());
        return 1;
    }
}
