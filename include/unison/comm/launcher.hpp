#pragma once

/// \file
/// Where this process sits in a job, read from the launcher's environment:
/// torchrun (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE), Open MPI
/// (OMPI_COMM_WORLD_RANK, ..._LOCAL_RANK, ..._SIZE, ..._LOCAL_SIZE), Slurm
/// (SLURM_PROCID, SLURM_LOCALID, SLURM_NTASKS, SLURM_NODEID, SLURM_TASKS_PER_NODE),
/// MVAPICH2 (MV2_COMM_WORLD_RANK, ..._SIZE, ..._LOCAL_RANK, ..._LOCAL_SIZE) and the
/// PMI launchers of MPICH, Intel MPI and Cray PALS (PMI_RANK, PMI_SIZE; the local
/// rank from MPI_LOCALRANKID and MPI_LOCALNRANKS, or PALS_LOCAL_RANKID, when set).
/// torchrun is checked first, then the MPI launchers, then Slurm, because torchrun
/// and mpirun are often started inside a Slurm allocation and then their own
/// variables are the truth; the generic PMI variables come last.
///
/// Where no variable gives the local rank, `local_from_launcher` is false; under MPI,
/// `unison::mpi_launch()` (mpi/launch.hpp) then derives it from the MPI library.

#include "unison/core/error.hpp"

#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

namespace unison {

/// This process's place in the job.
struct launch_info {
    int rank = 0;       ///< global rank
    int size = 1;       ///< number of ranks in the job
    int local_rank = 0; ///< rank on this node: picks the GPU
    int local_size = 1; ///< ranks on this node
    /// "torchrun", "openmpi", "slurm", "mvapich", "pmi" (MPICH, Intel MPI, Cray
    /// PALS), "mpi" (from the MPI library itself, mpi_launch), "store" (from the
    /// store's rendezvous, store_launch) or "none"
    std::string_view launcher = "none";
    /// Whether local_rank and local_size came from the launcher (else they are 0 and
    /// 1, unknown).
    bool local_from_launcher = true;
};

namespace detail {

/// Parses a non-negative decimal integer; nullopt if `s` is anything else.
inline std::optional<int> parse_count(std::string_view s) {
    if (s.empty() || s.size() > 9) {
        return std::nullopt;
    }
    int v = 0;
    for (char c : s) {
        if (c < '0' || c > '9') {
            return std::nullopt;
        }
        v = v * 10 + (c - '0');
    }
    return v;
}

/// Expands Slurm's SLURM_TASKS_PER_NODE ("2(x3),1") and returns node `node`'s entry.
inline std::optional<int> slurm_tasks_on_node(std::string_view spec, int node) {
    int index = 0;
    while (!spec.empty()) {
        const std::size_t comma = spec.find(',');
        std::string_view item = spec.substr(0, comma);
        spec = comma == std::string_view::npos ? std::string_view{} : spec.substr(comma + 1);
        int repeat = 1;
        if (const std::size_t paren = item.find("(x"); paren != std::string_view::npos) {
            if (item.back() != ')') {
                return std::nullopt;
            }
            const auto r = parse_count(item.substr(paren + 2, item.size() - paren - 3));
            if (!r) {
                return std::nullopt;
            }
            repeat = *r;
            item = item.substr(0, paren);
        }
        const auto tasks = parse_count(item);
        if (!tasks) {
            return std::nullopt;
        }
        if (node < index + repeat) {
            return tasks;
        }
        index += repeat;
    }
    return std::nullopt;
}

} // namespace detail

/// Reads the launch environment through `get` (a `const char*(const char*)`, such as
/// std::getenv). Throws `argument_error` naming the variable when one is set but
/// malformed or inconsistent; returns a one-rank job when no launcher is found.
template <class Getenv>
launch_info detect_launch(Getenv&& get) {
    auto read = [&](const char* name) -> std::optional<int> {
        const char* v = get(name);
        if (v == nullptr) {
            return std::nullopt;
        }
        const auto n = detail::parse_count(v);
        if (!n) {
            throw argument_error(-1, "detect_launch",
                                 std::string(name) + "='" + v + "' is not a non-negative integer");
        }
        return n;
    };
    auto require = [&](const char* name, std::string_view launcher) -> int {
        const auto v = read(name);
        if (!v) {
            throw argument_error(-1, "detect_launch",
                                 std::string(launcher) + " is set up but " + name + " is missing");
        }
        return *v;
    };

    launch_info info;
    // The variables each field came from, so that errors can name them.
    const char* rank_var = nullptr;
    const char* size_var = nullptr;
    const char* local_rank_var = nullptr;
    const char* local_size_var = nullptr;
    // One launcher's variables: rank and size required; the local rank required
    // (or 0 when absent, for torchrun), or unknown when the launcher has none; the
    // local size defaulting to the size.
    auto take = [&](std::string_view launcher, const char* rank_name, const char* size_name,
                    const char* local_rank_name, const char* local_size_name,
                    bool local_rank_required) {
        info.launcher = launcher;
        rank_var = rank_name;
        size_var = size_name;
        info.rank = require(rank_name, launcher);
        info.size = require(size_name, launcher);
        if (local_rank_name == nullptr) {
            local_rank_var = "the local rank";
            local_size_var = "the local size";
            info.local_from_launcher = false;
            return;
        }
        local_rank_var = local_rank_name;
        local_size_var = local_size_name != nullptr ? local_size_name : size_name;
        if (local_rank_required) {
            info.local_rank = require(local_rank_name, launcher);
        } else if (const auto v = read(local_rank_name)) {
            info.local_rank = *v;
        } else {
            // RANK and WORLD_SIZE alone (a Kubernetes job): the local rank is unknown.
            local_rank_var = "the local rank";
            local_size_var = "the local size";
            info.local_from_launcher = false;
            return;
        }
        info.local_size =
            local_size_name != nullptr ? read(local_size_name).value_or(info.size) : info.size;
    };
    if (get("RANK") != nullptr && get("WORLD_SIZE") != nullptr) {
        take("torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", false);
    } else if (get("OMPI_COMM_WORLD_RANK") != nullptr) {
        take("openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
             "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", true);
    } else if (get("SLURM_PROCID") != nullptr) {
        take("slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", nullptr, true);
        local_size_var = "SLURM_TASKS_PER_NODE";
        if (const char* spec = get("SLURM_TASKS_PER_NODE"); spec != nullptr) {
            const int node = read("SLURM_NODEID").value_or(0);
            const auto n = detail::slurm_tasks_on_node(spec, node);
            if (!n) {
                throw argument_error(-1, "detect_launch",
                                     std::string("SLURM_TASKS_PER_NODE='") + spec +
                                         "' has no entry for node " + std::to_string(node));
            }
            info.local_size = *n;
        }
    } else if (get("MV2_COMM_WORLD_RANK") != nullptr) {
        take("mvapich", "MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE", "MV2_COMM_WORLD_LOCAL_RANK",
             "MV2_COMM_WORLD_LOCAL_SIZE", true);
    } else if (get("PMI_RANK") != nullptr) {
        if (get("MPI_LOCALRANKID") != nullptr) { // MPICH's Hydra, Intel MPI
            take("pmi", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", true);
        } else if (get("PALS_LOCAL_RANKID") != nullptr) { // Cray PALS
            take("pmi", "PMI_RANK", "PMI_SIZE", "PALS_LOCAL_RANKID", nullptr, true);
        } else {
            take("pmi", "PMI_RANK", "PMI_SIZE", nullptr, nullptr, false);
        }
    } else {
        return info;
    }
    const std::string where = std::string(info.launcher) + ": ";
    if (info.size < 1 || info.rank >= info.size) {
        throw argument_error(-1, "detect_launch",
                             where + rank_var + "=" + std::to_string(info.rank) +
                                 " is out of range for " + size_var + "=" +
                                 std::to_string(info.size));
    }
    if (info.local_size < 1 || info.local_rank >= info.local_size || info.local_size > info.size) {
        throw argument_error(-1, "detect_launch",
                             where + local_rank_var + "=" + std::to_string(info.local_rank) +
                                 " and " + local_size_var + " (" + std::to_string(info.local_size) +
                                 " ranks on this node) are inconsistent with " + size_var + "=" +
                                 std::to_string(info.size));
    }
    return info;
}

namespace detail {

/// Throws argument_error (naming `operation`) when the launcher (`info`) and MPI
/// (`mpi_rank` of `mpi_size` in MPI_COMM_WORLD) disagree about the job: under
/// torchrun without an MPI launcher every process is a one-process MPI world.
inline void check_launch_matches(const launch_info& info, int mpi_rank, int mpi_size,
                                 const char* operation) {
    if (info.launcher == "none" || (info.size == mpi_size && info.rank == mpi_rank)) {
        return;
    }
    const std::string launcher(info.launcher);
    std::string detail = launcher + " started this process as rank " + std::to_string(info.rank) +
                         " of " + std::to_string(info.size) + ", but MPI_COMM_WORLD has " +
                         std::to_string(mpi_size) + (mpi_size == 1 ? " process" : " processes") +
                         " (this is rank " + std::to_string(mpi_rank) + ")";
    if (mpi_size == 1 && info.size > 1) {
        detail += ": each process started its own one-process MPI world, so each would "
                  "train alone. Start the job with an MPI launcher (mpirun -n " +
                  std::to_string(info.size) + " ...), or without MPI";
    } else {
        detail += ": the environment holds another launcher's variables (" + launcher +
                  "'s, left from an outer job?); unset them or start the job with one launcher";
    }
    throw argument_error(mpi_rank, operation, detail);
}

} // namespace detail

/// Reads the launch environment of this process.
inline launch_info detect_launch() {
    return detect_launch([](const char* name) -> const char* { return std::getenv(name); });
}

/// The CUDA device this process should use: its local rank, never its global rank,
/// so that rank 9 of a job with 8 GPUs per node uses GPU 1 of its node.
inline int local_device(const launch_info& info, int device_count) {
    if (device_count < 1) {
        throw argument_error(info.rank, "local_device", "no CUDA device is visible");
    }
    if (info.local_rank >= device_count) {
        throw argument_error(info.rank, "local_device",
                             "local rank " + std::to_string(info.local_rank) + " needs GPU " +
                                 std::to_string(info.local_rank) + " but only " +
                                 std::to_string(device_count) +
                                 " are visible (NCCL cannot share a GPU between ranks)");
    }
    return info.local_rank;
}

} // namespace unison
