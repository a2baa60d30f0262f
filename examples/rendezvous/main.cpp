// A job without MPI: the ranks that torchrun or a Kubernetes job starts meet at
// MASTER_ADDR through unison's TCP store, learn where each of them runs, and (built
// with NCCL, on machines with GPUs) bootstrap NCCL through the store and all-reduce
// on their GPUs.
//
//   torchrun --nproc_per_node=4 --no_python ./rendezvous
//   RANK=0 WORLD_SIZE=2 MASTER_ADDR=node0 MASTER_PORT=29500 ./rendezvous   # and so on
//
// Rank 0 prints one line per rank (host, process, local rank, GPUs it sees) and,
// with NCCL, the all-reduce's result checked against the sum computed here. A rank
// that never comes is named by every rank that did, within UNISON_TIMEOUT seconds.

#include "cli/cli.hpp"

#include <unison/unison.hpp>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <unistd.h>

#if UNISON_HAS_NCCL()
#include <unison/cuda/device_buffer.hpp>

#include <cuda_runtime_api.h>
#endif

namespace {

/// What each rank tells the others about itself.
struct placement {
    std::int64_t pid = 0;
    std::int32_t local_rank = 0;
    std::int32_t local_size = 0;
    std::int32_t gpus = 0;
};

int gpus_visible() {
#if UNISON_HAS_NCCL()
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
#else
    return 0;
#endif
}

#if UNISON_HAS_NCCL()
/// Every rank all-reduces rank + 1 over 1 Mi floats on its GPU; rank 0 checks the
/// sum against n (n + 1) / 2 on every element.
int nccl_all_reduce(unison::tcp_store& store) {
    unison::nccl_communicator comm = unison::nccl_communicator::from_store(store);
    const std::size_t count = std::size_t{1} << 20;
    const std::vector<float> mine(count, static_cast<float>(store.rank() + 1));
    unison::cuda::device_buffer<float> data(std::span<const float>(mine), comm.device());
    unison::all_reduce(comm, data, unison::reduce_op::sum);
    std::vector<float> sum(count);
    data.copy_to(std::span<float>(sum));
    const double want = 0.5 * store.size() * (store.size() + 1);
    std::size_t wrong = 0;
    for (const float v : sum) {
        wrong += v != static_cast<float>(want);
    }
    if (store.rank() == 0) {
        std::printf("rendezvous: NCCL all_reduce of %zu floats over %d GPUs: %zu wrong\n", count,
                    store.size(), wrong);
    }
    return wrong == 0 ? 0 : 1;
}
#endif

int run() {
    unison::tcp_store store = unison::tcp_store::from_env();
    const unison::launch_info launch = unison::store_launch(store);
    placement me;
    me.pid = static_cast<std::int64_t>(::getpid());
    me.local_rank = launch.local_rank;
    me.local_size = launch.local_size;
    me.gpus = gpus_visible();
    const auto all = store.all_gather("placement", std::as_bytes(std::span(&me, 1)));

    std::vector<placement> ranks(all.size());
    bool every_rank_has_a_gpu = true;
    for (std::size_t r = 0; r < all.size(); ++r) {
        std::memcpy(&ranks[r], all[r].data(), sizeof(placement));
        every_rank_has_a_gpu = every_rank_has_a_gpu && ranks[r].local_rank < ranks[r].gpus;
    }
    if (store.rank() == 0) {
        std::printf("rendezvous: %d ranks joined at %s:%u, the port from %s\n", store.size(),
                    store.host().c_str(), static_cast<unsigned>(store.port()),
                    store.options().port_source.c_str());
        for (std::size_t r = 0; r < ranks.size(); ++r) {
            std::printf("  rank %zu: host %s, pid %lld, local rank %d of %d, %d GPUs visible\n", r,
                        store.hosts()[r].c_str(), static_cast<long long>(ranks[r].pid),
                        ranks[r].local_rank, ranks[r].local_size, ranks[r].gpus);
        }
    }
    int status = 0;
    // Every rank decides the same way from the same data: NCCL is collective.
#if UNISON_HAS_NCCL()
    if (every_rank_has_a_gpu) {
        status = nccl_all_reduce(store);
    } else if (store.rank() == 0) {
        std::printf("rendezvous: NCCL skipped: not every rank has a GPU of its own\n");
    }
#else
    (void)every_rank_has_a_gpu;
    if (store.rank() == 0) {
        std::printf("rendezvous: NCCL skipped: built without unison::nccl\n");
    }
#endif
    store.barrier("done");
    return status;
}

} // namespace

int main(int argc, char** argv) {
    cli::parser cli("rendezvous",
                    "Meets the other ranks through unison's TCP store (and, with NCCL, "
                    "all-reduces on their GPUs). No options: the launcher's environment "
                    "(RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) says it all.",
                    unison::version_string);
    if (const std::optional<int> exit_code = cli.parse(argc, argv)) {
        return *exit_code;
    }
    try {
        return run();
    } catch (const unison::error& e) {
        std::fprintf(stderr, "rendezvous: %s\n", e.what());
        return 1;
    }
}
