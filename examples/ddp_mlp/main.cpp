// Data-parallel training of a small MLP with unison::ddp: the template to copy when
// adding DDP to your own framework. The framework here is examples/common/nn, a
// stand-in for yours; everything unison needs from it is (1) the gradient tensors,
// (2) a hook that fires when a gradient is final in backward, and (3) a place after
// backward to call finish().
//
//   ./ddp_mlp -t 4                     four ranks as threads of this process
//   mpirun -n 2 ./ddp_mlp              two MPI processes (when built with unison::mpi)
//   torchrun --nproc_per_node=2 --no_python ./ddp_mlp
//                                      two processes over Gloo (built with unison::gloo)
//
// Every rank builds the same model (ddp.start() broadcasts rank 0's parameters
// anyway), takes its shard of each global batch of a synthetic classification set,
// and steps its own optimizer on the averaged gradients, so all replicas stay equal.
// Rank 0 prints the global mean loss and the throughput of every step.

#include "cli/cli.hpp"
#include "nn/nn.hpp"

#include <unison/unison.hpp>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace {

struct settings {
    int threads = 4;
    std::string backend = "auto";
    int steps = 100;
    std::size_t batch = 512; // global batch, split evenly over the ranks
    float lr = 1e-3f;
    int log_every = 1;
};

template <unison::communicator C>
int train(C& comm, const settings& s) {
    const auto ranks = static_cast<std::size_t>(comm.size());
    const auto rank = static_cast<std::size_t>(comm.rank());
    if (s.batch % ranks != 0) {
        if (rank == 0) {
            std::fprintf(stderr, "ddp_mlp: batch %zu does not split over %zu ranks\n", s.batch,
                         ranks);
        }
        return 2;
    }
    const std::size_t shard = s.batch / ranks;

    // The same synthetic data set on every rank; rank r trains on rows
    // [step * batch + r * shard, ... + shard) of it.
    const std::size_t features = 64, classes = 10, samples = 16384;
    const auto data = nn::make_classification<float>(samples, features, classes, 2024);
    nn::mlp<float> model({features, 256, 256, classes}, /*seed=*/7);

    // --- unison: register gradients, connect the backward hook, broadcast -------------
    // Policies go after the communicator and numbers into the options, e.g.
    //   unison::ddp<C, unison::policy::mixed_precision<unison::dtype::f32, unison::dtype::bf16>>
    //       dp(comm, {.bucket_bytes = 8 << 20, .accumulate_steps = 4});
    unison::ddp<C> dp(comm);
    std::unordered_map<const nn::parameter<float>*, std::size_t> index;
    for (nn::parameter<float>* p : model.parameters()) {
        index[p] = dp.add_parameter(p->value, p->grad, p->name);
    }
    model.on_grad_ready = [&](nn::parameter<float>& p) { dp.mark_ready(index.at(&p)); };
    dp.start();
    // ---------------------------------------------------------------------------------

    nn::adamw<float> optimizer(model.parameters(), s.lr);
    std::vector<double> loss_and_right(2);
    double first_loss = 0.0, last_loss = 0.0;
    if (rank == 0) {
        std::printf("ddp_mlp: %zu ranks, %zu parameters, global batch %zu (%zu per rank)\n", ranks,
                    model.parameter_count(), s.batch, shard);
    }
    for (int step = 0; step < s.steps; ++step) {
        const auto start = std::chrono::steady_clock::now();
        const std::size_t begin =
            (static_cast<std::size_t>(step) * s.batch) % samples + rank * shard;
        const auto batch = nn::slice(data, begin, begin + shard);

        model.zero_grad();
        // Phases on the timeline (UNISON_TIMELINE=path; nothing when it is unset).
        std::optional<unison::timeline::scope> phase(std::in_place, comm.rank(), "forward");
        const auto logits = model.forward(batch.x);
        // Each rank's loss is the mean over its shard; DDP averages over ranks, so the
        // gradient is that of the mean over the global batch.
        const auto loss = nn::softmax_cross_entropy<float>(logits, batch.labels,
                                                           1.0f / static_cast<float>(shard));
        phase.emplace(comm.rank(), "backward");
        model.backward(loss.dlogits); // hooks call dp.mark_ready as gradients finish
        phase.emplace(comm.rank(), "finish and step");
        if (dp.finish()) {    // averaged gradients are in place (false only on a
            optimizer.step(); // micro-batch that accumulates: accumulate_steps)
        }
        phase.reset();

        // Logging only: the global mean loss and accuracy (one small all-reduce).
        loss_and_right[0] = static_cast<double>(loss.loss) / static_cast<double>(ranks);
        loss_and_right[1] = nn::accuracy(logits, batch.labels) / static_cast<double>(ranks);
        unison::all_reduce(comm, loss_and_right);
        const double seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        if (step == 0) {
            first_loss = loss_and_right[0];
        }
        last_loss = loss_and_right[0];
        if (rank == 0 && (step % s.log_every == 0 || step + 1 == s.steps)) {
            std::printf("step %4d  loss %.4f  accuracy %.3f  %8.0f samples/s\n", step,
                        loss_and_right[0], loss_and_right[1],
                        static_cast<double>(s.batch) / seconds);
        }
    }
    const bool improved = last_loss < 0.5 * first_loss;
    if (rank == 0) {
        std::printf("ddp_mlp: loss %.4f -> %.4f (%s)\n", first_loss, last_loss,
                    improved ? "went down" : "DID NOT go down by half");
    }
    return improved ? 0 : 1;
}

} // namespace

int main(int argc, char** argv) {
    settings s;
    constexpr int most = 1 << 30;
    cli::parser cli("ddp_mlp", "Data-parallel training of a small MLP with unison::ddp.",
                    unison::version_string);
    cli.value("-t", "threads", s.threads, 1, 1024, "ranks as threads, outside a launcher")
        .text("--backend", "NAME", s.backend,
              "auto (MPI under mpirun or srun, Gloo under torchrun, else threads), threads, "
              "mpi or gloo")
        .value("--steps", "N", s.steps, 1, most, "optimizer steps")
        .value("--batch", "N", s.batch, std::size_t{1}, std::size_t{1} << 30,
               "global batch, split evenly over the ranks")
        .value("--lr", "X", s.lr, 1e-12f, 10.0f, "learning rate")
        .value("--log-every", "N", s.log_every, 1, most, "steps between printed losses");
    if (const std::optional<int> exit_code = cli.parse(argc, argv)) {
        return *exit_code;
    }
    try { // a malformed UNISON_* or launcher variable, a timeout: said in words
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
                         "ddp_mlp", backend.c_str());
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
                std::fprintf(stderr, "ddp_mlp: %s\n", e.what());
                return 2;
            }
            try {
                unison::mpi_communicator comm(MPI_COMM_WORLD);
                return train(comm, s);
            } catch (const std::exception& e) {
                // The other ranks may be waiting in a collective this rank will never
                // join: end the job, rather than wait for them in MPI_Finalize.
                unison::mpi_environment::abort_job("ddp_mlp", e);
            }
        }
#endif
        if (backend != "threads") {
            std::fprintf(stderr, "ddp_mlp: built without the %s backend\n", backend.c_str());
            return 2;
        }
        if (launch.size > 1) {
            std::fprintf(stderr,
                         "ddp_mlp: launched as %d ranks, but the threads backend runs "
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
        std::fprintf(stderr, "ddp_mlp: %s\n", e.what());
        return 1;
    }
}
