#pragma once

#include <chrono>
#include <cstdlib>
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

    /// Defaults, overridden by the environment: UNISON_TIMEOUT (seconds, may be
    /// fractional) and UNISON_DEBUG=1 (turns on check_matching).
    static comm_options from_env() {
        comm_options o;
        if (const char* t = std::getenv("UNISON_TIMEOUT"); t != nullptr && *t != '\0') {
            char* end = nullptr;
            const double seconds = std::strtod(t, &end);
            if (end != t && seconds > 0) {
                o.timeout = std::chrono::milliseconds(static_cast<long long>(seconds * 1000.0));
            }
        }
        if (const char* d = std::getenv("UNISON_DEBUG"); d != nullptr) {
            const std::string_view v(d);
            o.check_matching = !(v.empty() || v == "0" || v == "false" || v == "off");
        }
        return o;
    }
};

} // namespace unison
