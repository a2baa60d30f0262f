#pragma once

/// \file
/// Sizes written as people write them ("64K", "1.5M", "4096"), for the benchmarks'
/// command lines and the tuning rules' files (comm/tuning_rules.hpp).

#include <cmath>
#include <cstddef>
#include <optional>
#include <string_view>

namespace unison::detail {

/// Parses a size as nccl-tests' parsesize reads one: a number, fractions allowed
/// ("1.5K", "0.5M", "1e3"), then optionally K, M or G in either case (binary
/// multiples), the result rounded down to whole bytes. Also accepted: a trailing
/// "B" or "iB" ("64KB", "64KiB", "8B"). Refused: a negative, a non-finite or an
/// out-of-range value, and anything else after the number. The number is read here
/// rather than by std::from_chars, whose floating-point form some standard libraries
/// (libc++ before 20) lack, and not by strtod, whose decimal point follows the locale.
inline std::optional<std::size_t> parse_bytes(std::string_view s) {
    std::size_t at = 0;
    const auto digits = [&](double& into) {
        std::size_t n = 0;
        for (; at < s.size() && s[at] >= '0' && s[at] <= '9'; ++at, ++n) {
            into = into * 10.0 + (s[at] - '0');
        }
        return n;
    };
    double mantissa = 0; // every digit, the point ignored: exact up to 2^53
    std::size_t count = digits(mantissa);
    int exponent = 0;
    if (at < s.size() && s[at] == '.') {
        ++at;
        const std::size_t start = at;
        count += digits(mantissa);
        exponent -= static_cast<int>(at - start);
    }
    if (count == 0) {
        return std::nullopt;
    }
    while (exponent < 0 && mantissa != 0 && std::fmod(mantissa, 10.0) == 0) {
        mantissa /= 10; // "1.000" is 1000e-3: 1e0, so that no inexact power comes in
        ++exponent;
    }
    if (at < s.size() && (s[at] == 'e' || s[at] == 'E')) {
        ++at;
        const bool minus = at < s.size() && s[at] == '-';
        if (at < s.size() && (s[at] == '-' || s[at] == '+')) {
            ++at;
        }
        double e = 0;
        if (digits(e) == 0 || e > 400) {
            return std::nullopt;
        }
        exponent += minus ? -static_cast<int>(e) : static_cast<int>(e);
    }
    // Powers of ten to 1e22 are exact doubles, so that dividing by one rounds once
    // ("0.00048828125M" is 512, not 511).
    const double value = exponent >= 0     ? mantissa * std::pow(10.0, exponent)
                         : exponent >= -22 ? mantissa / std::pow(10.0, -exponent)
                                           : mantissa * std::pow(10.0, exponent);
    if (!std::isfinite(value)) {
        return std::nullopt;
    }
    std::string_view unit = s.substr(at);
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
