#pragma once

/// \file
/// The NCCL backend's tuning, such as it is: NCCL picks the algorithm of every call
/// itself (ring, tree, CollNet, NVLS or PAT, and a protocol for each), by operation,
/// size, rank count and topology, from its own cost model or a tuner plugin. It
/// offers no per-communicator way to force one (NCCL 2.28's ncclConfig_t has none);
/// only the process-wide NCCL_ALGO and NCCL_PROTO, read when a communicator is made,
/// steer it. So the NCCL backend always runs `algorithm::native`, NCCL's own call,
/// and this file decides which comm_options it can honour: a forced algorithm other
/// than automatic or native, or comm_options::deterministic (NCCL's order of
/// summation is its own), is an argument_error before any NCCL communicator is made,
/// rather than silently ignored. Needs neither NCCL nor CUDA, so that the rules are
/// tested everywhere.

#include "unison/comm/algorithm.hpp"
#include "unison/comm/options.hpp"
#include "unison/core/error.hpp"

#include <string>

namespace unison {

/// The all-reduce algorithm the NCCL backend runs when `forced` is asked for
/// (comm_options::all_reduce_algorithm): native, for `automatic` and `native`. Any
/// other is an argument_error on `rank` from `operation`, naming it and NCCL_ALGO.
inline algorithm nccl_all_reduce_algorithm(algorithm forced, int rank, const char* operation) {
    if (forced != algorithm::automatic && forced != algorithm::native) {
        throw argument_error(rank, operation,
                             "comm_options::all_reduce_algorithm (UNISON_ALGORITHM) forces " +
                                 std::string(to_string(forced)) +
                                 ", which the NCCL backend cannot: NCCL chooses its own "
                                 "algorithm for every call (native); steer it with NCCL_ALGO "
                                 "(for example NCCL_ALGO=Ring), and force automatic or native");
    }
    return algorithm::native;
}

/// Refuses, with an argument_error on `rank` from `operation`, the comm_options the
/// NCCL backend cannot honour: comm_options::deterministic, and a forced all-reduce
/// algorithm (nccl_all_reduce_algorithm).
inline void nccl_check_options(const comm_options& options, int rank, const char* operation) {
    if (options.deterministic) {
        throw argument_error(rank, operation,
                             "comm_options::deterministic (UNISON_DETERMINISTIC) asks for "
                             "rank-order sums, which NCCL does not give; use the thread "
                             "backend on one GPU or MPI, or turn it off");
    }
    nccl_all_reduce_algorithm(options.all_reduce_algorithm, rank, operation);
}

} // namespace unison
