#pragma once

/// \file
/// Tuning rules: a table that picks the MPI backend's algorithm by collective, rank
/// count, ranks per node and size, ahead of the built-in tuning (mpi/tuning.hpp).
/// The built-in thresholds were measured on a few machines and in simulation; the
/// memory and network of another cluster can move them. Measure there
/// (`unison-bench --algorithm all --format csv`), turn the table into rules
/// (`scripts/tuning-rules.py`), and point UNISON_TUNING_FILE, or
/// comm_options::tuning, at them: no rebuild. Open MPI's dynamic rules file
/// (coll_tuned_dynamic_rules_filename) and MPICH's JSON tuning files serve the same
/// end.
///
/// One rule a line, fields split at spaces or tabs, `#` to the end of a line a
/// comment:
///
///     # backend  collective  ranks  node_ranks  bytes    algorithm
///     mpi        all_reduce  4      4           16K-64K  rabenseifner
///     mpi        all_reduce  2-3    *           64K-     ring
///     mpi        all_gather  *      1           -32K     recursive_doubling
///
/// - backend: `mpi`, the one backend that chooses per call (the thread backend has
///   one schedule, Gloo runs its own ring, NCCL chooses its own);
/// - collective: all_reduce, reduce_scatter or all_gather;
/// - ranks and node_ranks: the communicator's size and the most ranks one node holds
///   (mpi_communicator::node_ranks(): the size on one node, 1 with a rank per
///   node): `N`, `A-B` (both included), `A-` or `*`;
/// - bytes: the call's size, for a reduce_scatter or an all_gather the whole output
///   or input (the count times the ranks, as the built-in tuning reads it): `S`
///   (exactly that many bytes, no other), `A-B` (from A up to but not including
///   B), `A-` or `-B`, each size a number with K, M or G if wanted (4096, 64K, 1.5M);
/// - algorithm: one that the collective has (all_reduce: any of algorithm.hpp's;
///   reduce_scatter: rabenseifner, rank_ordered or native; all_gather:
///   recursive_doubling, two_level, ring, neighbour_exchange or native), or
///   automatic: the built-in tuning's choice (to leave a hole in a wider rule).
///
/// The first rule that matches a call decides; a call that none matches gets the
/// built-in tuning. comm_options::deterministic and a forced
/// comm_options::all_reduce_algorithm come before every rule, for the collectives
/// that have that algorithm (a forced ring leaves the reduce_scatter to the rules).
/// comm_options::from_env() reads UNISON_TUNING_FILE whatever the backend, so a
/// malformed file is refused wherever options are read (as a malformed
/// UNISON_ALGORITHM is); only the MPI backend applies the rules. Every rank must hold
/// the same rules: the MPI communicator's constructor compares them (an
/// argument_error on every rank that names one that differs), as it compares the
/// other options that shape a call.

#include "unison/comm/algorithm.hpp"
#include "unison/comm/collective.hpp"
#include "unison/core/detail/parse_bytes.hpp"
#include "unison/core/error.hpp"

#include <cerrno>
#include <charconv>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

namespace unison {

/// One rule: calls of `collective` on `min_ranks`..`max_ranks` ranks, whose nodes
/// hold `min_node_ranks`..`max_node_ranks` ranks at most (both ranges inclusive),
/// of `min_bytes` up to but not including `end_bytes` bytes, run `choice`.
struct tuning_rule {
    operation collective = operation::all_reduce;
    int min_ranks = 1;
    int max_ranks = std::numeric_limits<int>::max();
    int min_node_ranks = 1;
    int max_node_ranks = std::numeric_limits<int>::max();
    std::size_t min_bytes = 0;
    std::size_t end_bytes = std::numeric_limits<std::size_t>::max();
    algorithm choice = algorithm::automatic;
    /// The line it was read from (1-based), for messages.
    std::size_t line = 0;

    bool matches(operation op, std::size_t bytes, int ranks, int node_ranks) const noexcept {
        return op == collective && ranks >= min_ranks && ranks <= max_ranks &&
               node_ranks >= min_node_ranks && node_ranks <= max_node_ranks && bytes >= min_bytes &&
               bytes < end_bytes;
    }
};

/// The algorithms each collective has on the MPI backend, which a rule may name.
constexpr bool tuning_rule_allows(operation op, algorithm a) noexcept {
    switch (op) {
    case operation::all_reduce:
        return true;
    case operation::reduce_scatter:
        return a == algorithm::automatic || a == algorithm::rabenseifner ||
               a == algorithm::rank_ordered || a == algorithm::native;
    case operation::all_gather:
        return a == algorithm::automatic || a == algorithm::recursive_doubling ||
               a == algorithm::two_level || a == algorithm::ring ||
               a == algorithm::neighbour_exchange || a == algorithm::native;
    default:
        return false;
    }
}

/// A table of tuning rules, empty by default (the built-in tuning alone).
class tuning_rules {
public:
    tuning_rules() = default;

    /// The rules in `text`; `source` (a file's name) starts every error message. A
    /// line that is not a rule is an argument_error naming the source, the line and
    /// the field, never skipped.
    static tuning_rules parse(std::string_view text, std::string source = "tuning rules") {
        tuning_rules t;
        t.source_ = std::move(source);
        if (text.substr(0, 3) == "\xEF\xBB\xBF") { // a UTF-8 byte-order mark
            text.remove_prefix(3);
        }
        std::size_t number = 0;
        while (!text.empty()) {
            const std::size_t eol = text.find('\n');
            std::string_view line = text.substr(0, eol);
            text.remove_prefix(eol == std::string_view::npos ? text.size() : eol + 1);
            ++number;
            if (const std::size_t hash = line.find('#'); hash != std::string_view::npos) {
                line = line.substr(0, hash);
            }
            std::vector<std::string_view> fields;
            for (std::size_t i = 0; i < line.size();) {
                if (line[i] == ' ' || line[i] == '\t' || line[i] == '\r') {
                    ++i;
                    continue;
                }
                std::size_t j = i;
                while (j < line.size() && line[j] != ' ' && line[j] != '\t' && line[j] != '\r') {
                    ++j;
                }
                fields.push_back(line.substr(i, j - i));
                i = j;
            }
            if (fields.empty()) {
                continue;
            }
            t.rules_.push_back(t.rule_of(fields, number));
        }
        return t;
    }

    /// The rules in the file at `path`; a file that cannot be read is an
    /// argument_error naming it and why.
    static tuning_rules load(const std::string& path) {
        std::error_code ec;
        if (std::filesystem::is_directory(path, ec)) {
            throw argument_error(-1, "tuning rules", "cannot read '" + path + "': a directory");
        }
        errno = 0;
        std::ifstream in(path, std::ios::binary);
        if (!in) {
            const int e = errno;
            throw argument_error(-1, "tuning rules",
                                 "cannot read '" + path + "'" +
                                     (e != 0 ? std::string(": ") + std::strerror(e) : ""));
        }
        std::ostringstream text;
        text << in.rdbuf();
        return parse(text.str(), path);
    }

    bool empty() const noexcept { return rules_.empty(); }
    std::span<const tuning_rule> rules() const noexcept { return rules_; }
    /// Where the rules came from (a file's name), for messages.
    const std::string& source() const noexcept { return source_; }

    /// The algorithm the first rule that matches names (automatic for one that
    /// names automatic), or nothing when none matches.
    std::optional<algorithm> find(operation op, std::size_t bytes, int ranks,
                                  int node_ranks) const noexcept {
        for (const tuning_rule& r : rules_) {
            if (r.matches(op, bytes, ranks, node_ranks)) {
                return r.choice;
            }
        }
        return std::nullopt;
    }

    /// The rules, one a line in a fixed form (every field, numbers in bytes and
    /// ranks, no comments): equal for equal rules however the files spelled them,
    /// so that ranks can compare a hash of it.
    std::string canonical() const {
        std::string s;
        for (const tuning_rule& r : rules_) {
            s.append(to_string(r.collective))
                .append(" ")
                .append(std::to_string(r.min_ranks))
                .append("-")
                .append(std::to_string(r.max_ranks))
                .append(" ")
                .append(std::to_string(r.min_node_ranks))
                .append("-")
                .append(std::to_string(r.max_node_ranks))
                .append(" ")
                .append(std::to_string(r.min_bytes))
                .append("-")
                .append(std::to_string(r.end_bytes))
                .append(" ")
                .append(to_string(r.choice))
                .append("\n");
        }
        return s;
    }

private:
    [[noreturn]] void fail(std::size_t line, const std::string& what) const {
        throw argument_error(-1, "tuning rules",
                             source_ + ":" + std::to_string(line) + ": " + what);
    }

    static std::optional<int> count_of(std::string_view s) {
        int v = 0;
        const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
        if (s.empty() || ec != std::errc() || end != s.data() + s.size() || v < 1) {
            return std::nullopt;
        }
        return v;
    }

    /// `N`, `A-B`, `A-` or `*`, for ranks and node_ranks.
    void counts(std::string_view s, std::string_view field, std::size_t line, int& lo,
                int& hi) const {
        const auto bad = [&] {
            fail(line, std::string(field) + " '" + std::string(s) +
                           "' is not a rank count: N, A-B, A- or * (counts from 1)");
        };
        if (s == "*") {
            return;
        }
        const std::size_t dash = s.find('-');
        const auto a = count_of(s.substr(0, dash));
        if (!a) {
            bad();
        }
        lo = *a;
        hi = *a;
        if (dash != std::string_view::npos) {
            const std::string_view rest = s.substr(dash + 1);
            if (rest.empty()) {
                hi = std::numeric_limits<int>::max();
            } else if (const auto b = count_of(rest)) {
                hi = *b;
            } else {
                bad();
            }
        }
        if (hi < lo) {
            fail(line, std::string(field) + " '" + std::string(s) +
                           "' is empty: " + std::to_string(lo) + " is above " + std::to_string(hi));
        }
    }

    /// `S`, `A-B`, `A-` or `-B`, for bytes.
    void sizes(std::string_view s, std::size_t line, std::size_t& lo, std::size_t& end) const {
        const auto bad = [&] {
            fail(line, "bytes '" + std::string(s) +
                           "' is not a size or a range of sizes: S, A-B (from A to below B), "
                           "A- or -B, sizes such as 4096, 64K or 1.5M");
        };
        const std::size_t dash = s.find('-');
        if (dash == std::string_view::npos) {
            const auto v = detail::parse_bytes(s);
            if (!v || *v == std::numeric_limits<std::size_t>::max()) {
                bad();
            }
            lo = *v;
            end = *v + 1;
            return;
        }
        const std::string_view a = s.substr(0, dash), b = s.substr(dash + 1);
        if (a.empty() && b.empty()) {
            bad();
        }
        if (!a.empty()) {
            const auto v = detail::parse_bytes(a);
            if (!v) {
                bad();
            }
            lo = *v;
        }
        if (!b.empty()) {
            const auto v = detail::parse_bytes(b);
            if (!v) {
                bad();
            }
            end = *v;
        }
        if (end <= lo) {
            fail(line, "bytes '" + std::string(s) + "' is empty: it ends (" + std::to_string(end) +
                           ") where it starts (" + std::to_string(lo) + ") or before");
        }
    }

    tuning_rule rule_of(const std::vector<std::string_view>& f, std::size_t line) const {
        if (f.size() != 6) {
            fail(line, "a rule has 6 fields (backend collective ranks node_ranks bytes "
                       "algorithm), this line " +
                           std::to_string(f.size()));
        }
        if (f[0] != "mpi") {
            fail(line, "backend '" + std::string(f[0]) +
                           "': only mpi chooses an algorithm per call (the thread backend "
                           "has one schedule, Gloo runs its own ring, NCCL chooses its own)");
        }
        tuning_rule r;
        r.line = line;
        if (f[1] == "all_reduce") {
            r.collective = operation::all_reduce;
        } else if (f[1] == "reduce_scatter") {
            r.collective = operation::reduce_scatter;
        } else if (f[1] == "all_gather") {
            r.collective = operation::all_gather;
        } else {
            fail(line, "collective '" + std::string(f[1]) +
                           "' is not all_reduce, reduce_scatter or all_gather");
        }
        counts(f[2], "ranks", line, r.min_ranks, r.max_ranks);
        counts(f[3], "node_ranks", line, r.min_node_ranks, r.max_node_ranks);
        sizes(f[4], line, r.min_bytes, r.end_bytes);
        const auto a = algorithm_from_string(f[5]);
        if (!a || !tuning_rule_allows(r.collective, *a)) {
            std::string allowed;
            for (algorithm k : all_algorithms) {
                if (tuning_rule_allows(r.collective, k)) {
                    allowed.append(allowed.empty() ? "" : ", ").append(to_string(k));
                }
            }
            fail(line, "algorithm '" + std::string(f[5]) + "' is not one the " + std::string(f[1]) +
                           " has: " + allowed);
        }
        r.choice = *a;
        return r;
    }

    std::vector<tuning_rule> rules_;
    std::string source_ = "tuning rules";
};

} // namespace unison
