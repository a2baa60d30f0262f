#pragma once

/// \file
/// `store_launch`: this process's place in the job as the store's rendezvous sees it,
/// the counterpart of mpi_launch for jobs without MPI. The rank and size are the
/// store's; the local rank comes from the launcher's variables where it sets them
/// (torchrun's LOCAL_RANK) and otherwise from the host names the ranks reported on
/// joining: this rank's place among the ranks on the same host. A Kubernetes job that
/// sets RANK and WORLD_SIZE but no LOCAL_RANK still gets one GPU per process.

#include "unison/comm/launcher.hpp"
#include "unison/rendezvous/tcp_store.hpp"

#include <string>

namespace unison {

/// This process's place in the job of `store` (no communication: the host names
/// came with the rendezvous).
inline launch_info store_launch(const tcp_store& store) {
    launch_info info = detect_launch();
    const bool same_job =
        info.launcher != "none" && info.rank == store.rank() && info.size == store.size();
    if (!same_job || !info.local_from_launcher) {
        const auto& hosts = store.hosts();
        const std::string& mine = hosts[static_cast<std::size_t>(store.rank())];
        info.local_rank = 0;
        info.local_size = 0;
        for (int r = 0; r < store.size(); ++r) {
            if (hosts[static_cast<std::size_t>(r)] == mine) {
                info.local_rank += r < store.rank() ? 1 : 0;
                ++info.local_size;
            }
        }
        info.local_from_launcher = false;
        info.launcher = same_job ? info.launcher : "store";
    }
    info.rank = store.rank();
    info.size = store.size();
    return info;
}

} // namespace unison
