#pragma once

#include <unison/comm/launcher.hpp>

#include <exception>

namespace unison::bench {

/// Rank of this process in the job it was launched in (0 outside a launcher), so
/// that only one process prints usage and command-line errors.
inline int launch_rank() {
    try {
        return detect_launch().rank;
    } catch (const std::exception&) {
        return 0;
    }
}

} // namespace unison::bench
