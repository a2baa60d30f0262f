#pragma once

/// \file
/// Sizes written as people write them ("64K", "1.5M", "4096"), for the benchmarks'
/// command lines and the tuning rules' files (comm/tuning_rules.hpp).

#include <charconv>
#include <cmath>
#include <cstddef>
#include <optional>
#include <string_view>

namespace unison::detail {

/// Parses a size as nccl-tests' parsesize reads one: a number, fractions allowed
/// ("1.5K", "0.5M", "1e3"), then optionally K, M or G in either case (binary
/// multiples), the result rounded down to whole bytes. Also accepted: a trailing
/// "B" or "iB" ("64KB", "64KiB", "8B"). Refused: a negative, a non-finite or an
/// out-of-range value, and anything else after the number.
inline std::optional<std::size_t> parse_bytes(std::string_view s) {
    double value = 0;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
    if (s.empty() || ec != std::errc() || !std::isfinite(value) || value < 0) {
        return std::nullopt;
    }
    std::string_view unit = s.substr(static_cast<std::size_t>(end - s.data()));
    while (!unit.empty() && unit.front() == ' ') {
        unit.remove_prefix(1);
    }
    double scale = 1;
    if (!unit.empty()) {
        switch (unit.front()) {
        case 'K':
        case 'k':
            scale = 1024.0;
            break;
        case 'M':
        case 'm':
            scale = 1024.0 * 1024.0;
            break;
        case 'G':
        case 'g':
            scale = 1024.0 * 1024.0 * 1024.0;
            break;
        default:
            break;
        }
        if (scale > 1) {
            unit.remove_prefix(1);
        }
    }
    if (!(unit.empty() || unit == "B" || (scale > 1 && unit == "iB"))) {
        return std::nullopt;
    }
    const double bytes = std::floor(value * scale);
    if (bytes >= 9.2e18) { // past what a size_t (and nccl-tests' cast) holds exactly
        return std::nullopt;
    }
    return static_cast<std::size_t>(bytes);
}

} // namespace unison::detail
