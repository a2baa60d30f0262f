// Averages a model's gradients across data-parallel ranks -- the step at the heart
// of DDP -- with the same code on threads and under mpirun/srun/torchrun.
//
//   ./average_gradients -t 4        four ranks as threads of this process
//   mpirun -n 2 ./average_gradients two MPI processes (when built with unison::mpi)
//
// Each rank computes "gradients" from its own shard of a synthetic batch, starts a
// non-blocking all-reduce per layer as soon as that layer's gradient is ready (the
// way backward produces them, last layer first), and checks the averaged result
// against the gradient of the whole batch computed serially in double precision.

#include "cli/cli.hpp"

#include <unison/unison.hpp>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace {

constexpr int samples = 4096;
const std::vector<std::size_t> layer_sizes = {1 << 20, 1 << 18, 4096, 1 << 16, 10};

/// d(loss)/d(param) contributed by one sample: a deterministic stand-in for backward.
double sample_gradient(int sample, std::size_t layer, std::size_t i) {
    return std::sin(0.001 * static_cast<double>(sample + 1) * static_cast<double>(i + layer + 1));
}

template <unison::communicator C>
int train_step(C& comm) {
    const int rank = comm.rank(), ranks = comm.size();
    const int first = samples * rank / ranks, last = samples * (rank + 1) / ranks;
    std::vector<std::vector<float>> grads(layer_sizes.size());
    std::vector<typename C::request_type> pending;

    const auto start = std::chrono::steady_clock::now();
    // "backward": the last layer's gradient is ready first
    for (std::size_t layer = layer_sizes.size(); layer-- > 0;) {
        auto& g = grads[layer];
        g.assign(layer_sizes[layer], 0.0f);
        // every 64th sample stands in for the batch: this rank's are those in its shard
        for (int s = (first + 63) / 64 * 64; s < last; s += 64) {
            for (std::size_t i = 0; i < g.size(); ++i) {
                g[i] += static_cast<float>(sample_gradient(s, layer, i) / (samples / 64));
            }
        }
        // every rank holds its share of the batch mean: their sum is the mean
        pending.push_back(unison::all_reduce_async(comm, g, unison::reduce_op::sum));
    }
    unison::wait_all(std::span(pending));
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

    // check against the whole batch, serially, in double
    std::size_t wrong = 0, total = 0;
    for (std::size_t layer = 0; layer < layer_sizes.size(); ++layer) {
        for (std::size_t i = 0; i < grads[layer].size(); i += 97) {
            double want = 0;
            for (int s = 0; s < samples; s += 64) {
                want += sample_gradient(s, layer, i) / (samples / 64);
            }
            wrong += std::fabs(grads[layer][i] - want) > 1e-4 * (1 + std::fabs(want));
            ++total;
        }
    }
    if (rank == 0) {
        std::size_t params = 0;
        for (auto n : layer_sizes) {
            params += n;
        }
        std::printf("average_gradients: %d ranks, %zu parameters in %zu layers, step %.2f ms, "
                    "%zu/%zu checked values wrong\n",
                    ranks, params, layer_sizes.size(), seconds * 1e3, wrong, total);
    }
    return wrong == 0 ? 0 : 1;
}

} // namespace

int main(int argc, char** argv) {
    int threads = 2;
    cli::parser cli("average_gradients",
                    "Averages a model's gradients across data-parallel ranks and checks them.",
                    unison::version_string);
    cli.value("-t", "threads", threads, 1, 1024, "ranks as threads, outside an MPI launcher");
    if (const std::optional<int> exit_code = cli.parse(argc, argv)) {
        return *exit_code;
    }
    try { // a malformed UNISON_* or launcher variable, a timeout: said in words
        const unison::launch_info launch = unison::detect_launch();
#if UNISON_HAS_MPI()
        if (launch.launcher != "none") { // started by mpirun, srun or torchrun
            std::optional<unison::mpi_environment> env;
            try {
                env.emplace(argc, argv); // checks that the launcher and MPI agree on the job
            } catch (const unison::error& e) {
                std::fprintf(stderr, "average_gradients: %s\n", e.what());
                return 2;
            }
            try {
                unison::mpi_communicator comm(MPI_COMM_WORLD);
                return train_step(comm);
            } catch (const std::exception& e) {
                // The other ranks may be waiting in a collective this rank will never
                // join: end the job, rather than wait for them in MPI_Finalize.
                unison::mpi_environment::abort_job("average_gradients", e);
            }
        }
#endif
        if (launch.size > 1) {
            std::fprintf(stderr, "average_gradients: launched as %d ranks but built without MPI\n",
                         launch.size);
            return 2;
        }
        std::atomic<int> failures{0};
        unison::thread_world(threads).run(
            [&](unison::thread_communicator& comm) { failures += train_step(comm); });
        return failures == 0 ? 0 : 1;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "average_gradients: %s\n", e.what());
        return 1;
    }
}
