#pragma once

/// \file
/// unison's log: lines on stderr at the level `UNISON_LOG` sets, each prefixed
/// with the rank that wrote it, so that the lines of a multi-process job can be
/// told apart and sorted:
///
///     unison[rank 1] info: mpi_communicator: 4 ranks, 2 per node, ...
///
/// Levels, each including the ones before it: `warn` (what is legal but may be a
/// mistake; no log point uses it yet: what is wrong is an error), `info` (what was
/// set up: communicators made, algorithms and bucket plans chosen), `debug`
/// (every collective call as it is issued). The default is
/// `off`. Off, a log point costs one relaxed atomic load and a branch: the text
/// of a line is made only when it will be written (pass a callable to `log`).

#include "unison/core/error.hpp"

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

namespace unison {

/// How much unison writes to stderr (UNISON_LOG).
enum class log_level : std::uint8_t { off, warn, info, debug };

constexpr std::string_view to_string(log_level l) noexcept {
    switch (l) {
    case log_level::off:
        return "off";
    case log_level::warn:
        return "warn";
    case log_level::info:
        return "info";
    case log_level::debug:
        return "debug";
    }
    return "?";
}

/// "off", "warn", "info" or "debug" (any case; "warning" too), or nullopt.
constexpr std::optional<log_level> parse_log_level(std::string_view s) noexcept {
    auto same = [](std::string_view a, std::string_view b) {
        if (a.size() != b.size()) {
            return false;
        }
        for (std::size_t i = 0; i < a.size(); ++i) {
            const char c =
                (a[i] >= 'A' && a[i] <= 'Z') ? static_cast<char>(a[i] - 'A' + 'a') : a[i];
            if (c != b[i]) {
                return false;
            }
        }
        return true;
    };
    for (log_level l : {log_level::off, log_level::warn, log_level::info, log_level::debug}) {
        if (same(s, to_string(l))) {
            return l;
        }
    }
    if (same(s, "warning")) {
        return log_level::warn;
    }
    return std::nullopt;
}

namespace detail {

/// The level in force, or -1 while UNISON_LOG has not been read.
inline std::atomic<int>& log_threshold() noexcept {
    static std::atomic<int> level{-1};
    return level;
}

/// UNISON_LOG's level; off when unset or empty. Throws argument_error naming the
/// variable for any other value.
inline log_level log_level_from_env() {
    const char* v = std::getenv("UNISON_LOG");
    if (v == nullptr || *v == '\0') {
        return log_level::off;
    }
    const auto l = parse_log_level(v);
    if (!l) {
        throw argument_error(-1, "UNISON_LOG",
                             std::string("'") + v +
                                 "' is not a log level: off, warn, info or debug "
                                 "(e.g. UNISON_LOG=info)");
    }
    return *l;
}

} // namespace detail

/// The level in force: set_log_level's, else UNISON_LOG's (read on first use;
/// comm_options::from_env reads it too, so that every communicator refuses a
/// malformed value when it is made).
inline log_level current_log_level() {
    int l = detail::log_threshold().load(std::memory_order_relaxed);
    if (l < 0) {
        l = static_cast<int>(detail::log_level_from_env());
        detail::log_threshold().store(l, std::memory_order_relaxed);
    }
    return static_cast<log_level>(l);
}

/// Sets the level for the whole process, over UNISON_LOG.
inline void set_log_level(log_level l) noexcept {
    detail::log_threshold().store(static_cast<int>(l), std::memory_order_relaxed);
}

/// Whether a line at level `l` is written.
inline bool log_enabled(log_level l) {
    return l != log_level::off && static_cast<int>(l) <= static_cast<int>(current_log_level());
}

/// Writes one line at level `l` for `rank` (-1: none known), whole: lines of
/// several threads never interleave within a line.
inline void log_line(log_level l, int rank, std::string_view text) {
    std::string line = rank >= 0 ? "unison[rank " + std::to_string(rank) + "] " : "unison: ";
    line += to_string(l);
    line += ": ";
    line += text;
    line += '\n';
    std::fwrite(line.data(), 1, line.size(), stderr);
    std::fflush(stderr);
}

/// Writes `make()`'s text (a callable returning a string) at level `l` for
/// `rank`, calling it only when the line is written.
template <class Make>
void log(log_level l, int rank, Make&& make) {
    if (log_enabled(l)) {
        log_line(l, rank, make());
    }
}

} // namespace unison
