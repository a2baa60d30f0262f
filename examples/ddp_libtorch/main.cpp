// Data-parallel training of a LibTorch model with unison::ddp under mpirun: the
// template to copy when you train with LibTorch's C++ API and want DDP without
// torch.distributed.
//
//   mpirun -n 2 ./ddp_libtorch              train, printing loss and throughput per step
//   mpirun -n 2 ./ddp_libtorch --check      and compare with single-process training
//
// Every rank builds the model (with a different random initialization on purpose:
// ddp.start() broadcasts rank 0's parameters), generates the same synthetic data
// set, trains on its contiguous shard of every global batch and steps its own
// optimizer on the averaged gradients, so all replicas stay equal. One line makes
// the model data-parallel (unison::torch::ddp); forward, loss, backward and the
// optimizer are LibTorch's own, and each bucket's all-reduce starts while backward
// is still computing the earlier layers.
//
// With --check, rank 0 then trains an identical single-process copy of the model
// on the whole global batches with the same optimizer and compares the per-step
// losses and the final parameters; the exit status is non-zero if they differ.

#include "cli/cli.hpp"

#include <unison/mpi.hpp>
#include <unison/torch.hpp>
#include <unison/version.hpp>

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace {

struct settings {
    int steps = 50;
    std::int64_t batch = 512; // global batch, split evenly over the ranks
    double lr = 0.0;          // default: 0.05 for SGD (momentum 0.9), 1e-3 for Adam
    bool adam = false;
    int threads = 1; // LibTorch intra-op threads per rank
    int log_every = 1;
    bool check = false;
    // --check: the largest relative error allowed; by default 2e-6 with SGD (measured:
    // below 5e-7 over 200 steps on 2 and 4 ranks) and 1e-4 with Adam, which divides by
    // the root of each gradient's squared average and so turns last-bit differences in
    // near-zero gradients into relative ones (measured: up to 2e-5).
    double tolerance = 0.0;
};

constexpr std::int64_t features = 32, hidden = 256, classes = 8, samples = 16384;

/// Linear-SiLU-Linear-SiLU-Linear classifier. SiLU rather than ReLU for --check's
/// sake: DDP sums a shard's gradients in another order than one process summing the
/// whole batch, so the two runs differ in the last bits, and with ReLU a
/// pre-activation that close to zero now and then lands on the other side of the
/// kink in one of them, after which they differ by about 1e-4. That is rounding, not
/// DDP, but it would force a tolerance loose enough to hide real errors.
torch::nn::Sequential make_model() {
    return torch::nn::Sequential(torch::nn::Linear(features, hidden), torch::nn::SiLU(),
                                 torch::nn::Linear(hidden, hidden), torch::nn::SiLU(),
                                 torch::nn::Linear(hidden, classes));
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(torch::nn::Sequential& model,
                                                        const settings& s) {
    if (s.adam) {
        return std::make_unique<torch::optim::Adam>(model->parameters(),
                                                    torch::optim::AdamOptions(s.lr));
    }
    return std::make_unique<torch::optim::SGD>(model->parameters(),
                                               torch::optim::SGDOptions(s.lr).momentum(0.9));
}

/// A synthetic classification set: Gaussian clusters around one random centre per
/// class, squashed by tanh. A fixed generator makes it the same on every rank.
struct dataset {
    torch::Tensor x, y;
};
dataset make_dataset() {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(2024);
    const torch::Tensor centres = torch::randn({classes, features}, gen, torch::kFloat);
    const torch::Tensor y = torch::randint(0, classes, {samples}, gen, torch::kLong);
    const torch::Tensor noise = torch::randn({samples, features}, gen, torch::kFloat);
    return {torch::tanh(centres.index_select(0, y) + 1.5 * noise), y};
}

/// Global batch `step`: rows [first, first + batch) of the data set.
std::int64_t batch_start(int step, std::int64_t batch) {
    return (static_cast<std::int64_t>(step) * batch) % samples;
}

/// max |a - b| / max |b|: the error relative to the tensor's scale.
double relative_error(const torch::Tensor& a, const torch::Tensor& b) {
    const double scale = b.abs().max().item<double>();
    const double error = (a - b).abs().max().item<double>();
    return scale > 0 ? error / scale : error;
}

/// Trains a single-process copy from `initial` parameters on the whole global
/// batches and returns its per-step losses; the final parameters end up in `params`.
std::vector<double> train_reference(const dataset& data, const settings& s,
                                    const std::vector<torch::Tensor>& initial,
                                    std::vector<torch::Tensor>& params) {
    torch::nn::Sequential model = make_model();
    {
        torch::NoGradGuard no_grad;
        const std::vector<torch::Tensor> p = model->parameters();
        for (std::size_t i = 0; i < p.size(); ++i) {
            p[i].copy_(initial[i]);
        }
    }
    const auto optimizer = make_optimizer(model, s);
    std::vector<double> losses;
    for (int step = 0; step < s.steps; ++step) {
        const std::int64_t first = batch_start(step, s.batch);
        optimizer->zero_grad();
        const torch::Tensor loss = torch::nn::functional::cross_entropy(
            model->forward(data.x.narrow(0, first, s.batch)), data.y.narrow(0, first, s.batch));
        loss.backward();
        optimizer->step();
        losses.push_back(loss.item<double>());
    }
    params = model->parameters();
    return losses;
}

int train(unison::mpi_communicator& comm, const settings& s) {
    const int ranks = comm.size(), rank = comm.rank();
    if (s.batch % ranks != 0 || samples % s.batch != 0) {
        if (rank == 0) {
            std::fprintf(stderr,
                         "ddp_libtorch: the global batch %lld must split evenly over %d ranks "
                         "and divide the %lld samples\n",
                         static_cast<long long>(s.batch), ranks, static_cast<long long>(samples));
        }
        return 2;
    }
    const std::int64_t shard = s.batch / ranks;
    torch::set_num_threads(s.threads);
    const dataset data = make_dataset();

    torch::manual_seed(1234 + static_cast<std::uint64_t>(rank)); // ranks start out different
    torch::nn::Sequential model = make_model();

    // --- unison: the model becomes data-parallel ----------------------------------------
    // Collective: checks that every rank built the same model, copies rank 0's
    // parameters to every rank and hooks each gradient into buckets that are
    // all-reduced while backward runs; after loss.backward() every p.grad() holds the
    // average over the ranks. The model is small (about 76k parameters, 300 KB), so
    // the buckets are made small as well, to have several all-reduces overlap backward.
    unison::torch::ddp<unison::mpi_communicator> dp(
        comm, model, {.bucket_bytes = 128 * 1024, .first_bucket_bytes = 64 * 1024});
    // ---------------------------------------------------------------------------------

    const std::vector<torch::Tensor> params = model->parameters();
    std::vector<torch::Tensor> initial;
    for (const torch::Tensor& p : params) {
        initial.push_back(p.detach().clone());
    }
    const auto optimizer = make_optimizer(model, s);
    if (rank == 0) {
        std::int64_t count = 0;
        for (const torch::Tensor& p : params) {
            count += p.numel();
        }
        std::printf("ddp_libtorch: %d ranks, %lld parameters in %zu tensors, %zu buckets, global "
                    "batch %lld (%lld per rank), %s\n",
                    ranks, static_cast<long long>(count), params.size(),
                    dp.engine().reducer().bucket_count(), static_cast<long long>(s.batch),
                    static_cast<long long>(shard), s.adam ? "Adam" : "SGD with momentum");
    }

    std::vector<double> losses;
    for (int step = 0; step < s.steps; ++step) {
        const auto start = std::chrono::steady_clock::now();
        const std::int64_t first = batch_start(step, s.batch) + rank * shard;

        optimizer->zero_grad();
        // Phases on the timeline (UNISON_TIMELINE=path; nothing when it is unset).
        std::optional<unison::timeline::scope> phase(std::in_place, rank, "forward");
        // Each rank's loss is the mean over its shard; DDP averages over the ranks, so
        // the gradient is that of the mean over the global batch.
        const torch::Tensor loss = torch::nn::functional::cross_entropy(
            model->forward(data.x.narrow(0, first, shard)), data.y.narrow(0, first, shard));
        phase.emplace(rank, "backward");
        loss.backward(); // averaged gradients in place when it returns
        phase.emplace(rank, "step");
        optimizer->step();
        phase.reset();

        // Logging: the global mean loss, all-reduced as a torch tensor.
        torch::Tensor global_loss = loss.detach().to(torch::kDouble).reshape({1});
        unison::all_reduce(comm, global_loss, unison::reduce_op::avg);
        losses.push_back(global_loss.item<double>());
        const double seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        if (rank == 0 && (step % s.log_every == 0 || step + 1 == s.steps)) {
            std::printf("step %4d  loss %.6f  %9.0f samples/s\n", step, losses.back(),
                        static_cast<double>(s.batch) / seconds);
        }
    }
    if (rank == 0) {
        std::printf("ddp_libtorch: loss %.6f -> %.6f\n", losses.front(), losses.back());
    }
    if (!s.check) {
        return 0;
    }

    // --- check: every replica equals rank 0's, and rank 0's equals single-process
    // training on the whole global batches.
    std::vector<double> replica_difference{0.0};
    for (const torch::Tensor& p : params) {
        torch::Tensor on_root = p.detach().clone();
        unison::broadcast(comm, on_root, 0);
        replica_difference[0] =
            std::max(replica_difference[0], (on_root - p.detach()).abs().max().item<double>());
    }
    unison::all_reduce(comm, replica_difference, unison::reduce_op::max);

    std::vector<std::int32_t> passed{0};
    if (rank == 0) {
        std::vector<torch::Tensor> reference_params;
        const std::vector<double> reference_losses =
            train_reference(data, s, initial, reference_params);
        double loss_error = 0.0, param_error = 0.0;
        for (std::size_t k = 0; k < losses.size(); ++k) {
            loss_error = std::max(loss_error, std::abs(losses[k] - reference_losses[k]) /
                                                  std::abs(reference_losses[k]));
        }
        for (std::size_t i = 0; i < params.size(); ++i) {
            param_error =
                std::max(param_error, relative_error(params[i].detach(), reference_params[i]));
        }
        const bool ok =
            loss_error <= s.tolerance && param_error <= s.tolerance && replica_difference[0] == 0.0;
        std::printf("check: single process loss %.6f -> %.6f\n", reference_losses.front(),
                    reference_losses.back());
        std::printf("check: max relative error: losses %.3g, parameters %.3g (tolerance %.3g); "
                    "replicas differ by %.3g\n",
                    loss_error, param_error, s.tolerance, replica_difference[0]);
        std::printf("check: %s\n", ok ? "DDP matches single-process training"
                                      : "FAILED: DDP differs from single-process training");
        passed[0] = ok ? 1 : 0;
    }
    unison::broadcast(comm, passed, 0);
    return passed[0] == 1 ? 0 : 1;
}

} // namespace

int main(int argc, char** argv) {
    settings s;
    constexpr int most = 1 << 30;
    cli::parser cli("ddp_libtorch",
                    "A LibTorch model trained under unison::torch::ddp on MPI processes.",
                    unison::version_string);
    cli.value("--steps", "N", s.steps, 1, most, "optimizer steps")
        .value("--batch", "N", s.batch, std::int64_t{1}, std::int64_t{1} << 30,
               "global batch, split evenly over the ranks")
        .value("--lr", "X", s.lr, 1e-12, 10.0, "learning rate (default 0.05, Adam 1e-3)")
        .flag("--adam", s.adam, "Adam instead of SGD with momentum")
        .value("--threads", "N", s.threads, 1, 1024, "LibTorch intra-op threads per rank")
        .value("--log-every", "N", s.log_every, 1, most, "steps between printed losses")
        .flag("--check", s.check, "compare with single-process training on the whole batch")
        .value("--tolerance", "X", s.tolerance, 1e-15, 1.0,
               "--check's largest relative error (default 2e-6, Adam 1e-4)");
    if (const std::optional<int> exit_code = cli.parse(argc, argv)) {
        return *exit_code;
    }
    if (s.lr == 0.0) {
        s.lr = s.adam ? 1e-3 : 0.05;
    }
    if (s.tolerance == 0.0) {
        s.tolerance = s.adam ? 1e-4 : 2e-6;
    }
    std::optional<unison::mpi_environment> env;
    try {
        env.emplace(argc, argv); // checks that the launcher and MPI agree on the job
    } catch (const unison::error& e) {
        std::fprintf(stderr, "ddp_libtorch: %s\n", e.what());
        return 2;
    }
    try {
        unison::mpi_communicator comm(MPI_COMM_WORLD);
        return train(comm, s);
    } catch (const std::exception& e) { // unison::error, LibTorch's c10::Error, ...
        // The other ranks may be waiting in a collective this rank will never join:
        // end the job, rather than wait for them in MPI_Finalize.
        unison::mpi_environment::abort_job("ddp_libtorch", e);
    }
}
