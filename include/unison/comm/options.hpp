#pragma once

#include "unison/comm/algorithm.hpp"
#include "unison/comm/tuning_rules.hpp"
#include "unison/core/error.hpp"
#include "unison/core/log.hpp"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <string>
#include <string_view>

namespace unison {

/// Behaviour shared by every backend.
struct comm_options {
    /// Bound on every blocking wait; past it the wait throws `timeout_error`.
    std::chrono::milliseconds timeout{std::chrono::minutes(5)};
    /// Before each collective, all-gather every rank's call signature (operation,
    /// count, dtype, op, root, tag, step) and throw `mismatch_error` before any data
    /// moves. NCCL checks only with this on; the thread and MPI backends always
    /// check (free on threads, folded into MPI's handshake), and MPI adds this
    /// all-gather, compared with rank 0's, on top. Costs one small extra
    /// collective.
    bool check_matching = false;
    /// The MPI backend's all-reduce algorithm: `automatic` lets its tuning choose by
    /// size and rank count (mpi/tuning.hpp); any other forces that one on every call
    /// (`native`, `rabenseifner` and `rank_ordered` force the reduce_scatter's too,
    /// `native`, `recursive_doubling`, `two_level`, `ring` and `neighbour_exchange`
    /// the all_gather's).
    /// Every rank must pass the same: the MPI communicator's constructor compares
    /// them (an `argument_error` on every rank naming one that differs), and each
    /// call's header carries it too. The thread and NCCL backends have one schedule
    /// each and take only its name: the thread backend rank_ordered (or automatic;
    /// thread/tuning.hpp), NCCL native (or automatic; NCCL chooses its own algorithm,
    /// NCCL_ALGO steers it: nccl/tuning.hpp). Any other is an `argument_error` when
    /// the world or communicator is made, not ignored.
    algorithm all_reduce_algorithm = algorithm::automatic;
    /// Deterministic reductions: every all_reduce, reduce and reduce_scatter folds
    /// each element over the ranks in rank order, ((x0 op x1) op x2) ..., in the
    /// accumulate type (float for f16/bf16), and rounds once, so that the same
    /// inputs give the same bits whatever the call's size, the bucketing of a
    /// model's gradients, the rank count's algorithm or the backend (threads, on
    /// host or device memory, and MPI). The thread backend always reduces so; MPI
    /// then runs its rank_ordered schedule (mpi/detail/rank_ordered.hpp; its cost is
    /// in docs/performance.md) and refuses a forced all_reduce_algorithm other than
    /// rank_ordered; NCCL, whose order is its own, refuses this option. Every rank
    /// must pass the same (the MPI communicator's constructor compares it).
    bool deterministic = false;
    /// Which ranks share a node, for the MPI backend's tuning and its two-level
    /// all-reduce: 0 asks MPI (MPI_Comm_split_type with MPI_COMM_TYPE_SHARED); k > 0
    /// makes each block of k consecutive ranks a node (ranks 0 .. k-1, k .. 2k-1,
    /// ...), as launchers place them by default: for jobs where MPI sees one node
    /// per process (a container each) or one node for all, and for trying the
    /// several-node algorithms on one machine. A split keeps its parent's nodes.
    /// Every rank must pass the same (checked when the communicator is made).
    int ranks_per_node = 0;
    /// Rules that pick the MPI backend's algorithm by collective, ranks, ranks per
    /// node and size ahead of its built-in tuning, for a cluster whose best
    /// algorithms differ from it (comm/tuning_rules.hpp has the format;
    /// scripts/tuning-rules.py writes them from unison-bench's measurements). A
    /// forced all_reduce_algorithm and deterministic come first where the collective
    /// has that algorithm; the other backends have no per-call choice and do not
    /// apply them. Every rank must pass the same (the MPI communicator's
    /// constructor compares them).
    tuning_rules tuning;

    /// Defaults, overridden by the environment: UNISON_TIMEOUT (seconds, may be
    /// fractional: a number in (0, 1e9]), UNISON_DEBUG=1 (turns on check_matching),
    /// UNISON_ALGORITHM (an algorithm's name, see algorithm.hpp), UNISON_DETERMINISTIC=1
    /// (turns on deterministic), UNISON_RANKS_PER_NODE (a positive integer) and
    /// UNISON_TUNING_FILE (a file of tuning rules, read here). The
    /// switches take 1, on, true, yes or 0, off, false, no in any case (or nothing:
    /// off). A value that is none of these is an argument_error naming the variable
    /// and the value, never a silent default.
    static comm_options from_env() {
        (void)current_log_level(); // a malformed UNISON_LOG is refused here, early
        comm_options o;
        if (const char* t = std::getenv("UNISON_TIMEOUT"); t != nullptr && *t != '\0') {
            char* end = nullptr;
            const double seconds = std::strtod(t, &end);
            if (end == t || *end != '\0' || !(seconds > 0) || !(seconds <= 1e9)) {
                throw argument_error(-1, "UNISON_TIMEOUT",
                                     "'" + std::string(t) +
                                         "' is not a number of seconds in (0, 1e9] "
                                         "(e.g. UNISON_TIMEOUT=30 or 2.5)");
            }
            o.timeout =
                std::chrono::milliseconds(std::max(1LL, static_cast<long long>(seconds * 1000.0)));
        }
        if (const char* d = std::getenv("UNISON_DEBUG"); d != nullptr) {
            o.check_matching = on("UNISON_DEBUG", d);
        }
        if (const char* d = std::getenv("UNISON_DETERMINISTIC"); d != nullptr) {
            o.deterministic = on("UNISON_DETERMINISTIC", d);
        }
        if (const char* k = std::getenv("UNISON_RANKS_PER_NODE"); k != nullptr && *k != '\0') {
            char* end = nullptr;
            const long v = std::strtol(k, &end, 10);
            if (end == k || *end != '\0' || v <= 0 || v > 1L << 30) {
                throw argument_error(-1, "UNISON_RANKS_PER_NODE",
                                     "'" + std::string(k) +
                                         "' is not a positive number of ranks per node");
            }
            o.ranks_per_node = static_cast<int>(v);
        }
        if (const char* f = std::getenv("UNISON_TUNING_FILE"); f != nullptr && *f != '\0') {
            try {
                o.tuning = tuning_rules::load(f);
            } catch (const argument_error& e) {
                throw argument_error(e, " (from UNISON_TUNING_FILE)");
            }
        }
        if (const char* a = std::getenv("UNISON_ALGORITHM"); a != nullptr && *a != '\0') {
            const auto named = algorithm_from_string(a);
            if (!named) {
                std::string detail = "'";
                detail.append(a).append("' names no algorithm; one of");
                for (algorithm k : all_algorithms) {
                    detail.append(k == all_algorithms.front() ? " " : ", ").append(to_string(k));
                }
                throw argument_error(-1, "UNISON_ALGORITHM", detail);
            }
            o.all_reduce_algorithm = *named;
        }
        return o;
    }

private:
    /// A switch variable's value, in any case: 1, on, true, yes; 0, off, false, no
    /// or empty.
    static bool on(const char* variable, std::string_view v) {
        auto is = [&](std::string_view word) {
            return std::equal(v.begin(), v.end(), word.begin(), word.end(), [](char a, char b) {
                return std::tolower(static_cast<unsigned char>(a)) == b;
            });
        };
        for (std::string_view yes : {"1", "on", "true", "yes"}) {
            if (is(yes)) {
                return true;
            }
        }
        for (std::string_view no : {"", "0", "off", "false", "no"}) {
            if (is(no)) {
                return false;
            }
        }
        throw argument_error(-1, variable,
                             "'" + std::string(v) +
                                 "' is not a switch: 1, on, true or yes; 0, off, false or no");
    }
};

} // namespace unison
