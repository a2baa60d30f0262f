#pragma once

/// \file
/// How nccl-tests sizes and scores one collective, shared by unison-bench and the
/// Google Benchmark suite so that both report the same numbers.
///
/// For a requested size of B bytes (nccl-tests' `setupArgs` and each test's
/// `GetCollByteCount`):
///   all_reduce, broadcast: count = B / elem; every rank sends and receives count;
///   all_gather:            count = B / elem / ranks per rank; the output holds
///                          count * ranks;
///   reduce_scatter:        count = B / elem / ranks per rank; the input holds
///                          count * ranks.
/// The "size" column is the larger of the send and receive bytes, the "count"
/// column is `count`, algbw = size / time, and busbw = algbw * bus_factor.

#include <unison/core/dtype.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace unison::bench {

/// The collectives the benchmarks time.
enum class collective_kind : std::uint8_t { all_reduce, all_gather, reduce_scatter, broadcast };

inline constexpr collective_kind all_collective_kinds[] = {
    collective_kind::all_reduce, collective_kind::all_gather, collective_kind::reduce_scatter,
    collective_kind::broadcast};

/// "all_reduce", "all_gather", ...
constexpr std::string_view to_string(collective_kind c) noexcept {
    switch (c) {
    case collective_kind::all_reduce:
        return "all_reduce";
    case collective_kind::all_gather:
        return "all_gather";
    case collective_kind::reduce_scatter:
        return "reduce_scatter";
    case collective_kind::broadcast:
        return "broadcast";
    }
    return "?";
}

/// Parses a collective name; nullopt for anything else.
constexpr std::optional<collective_kind> parse_collective(std::string_view s) noexcept {
    for (collective_kind c : all_collective_kinds) {
        if (s == to_string(c)) {
            return c;
        }
    }
    return std::nullopt;
}

/// True for the collectives that take a reduction operator.
constexpr bool reduces(collective_kind c) noexcept {
    return c == collective_kind::all_reduce || c == collective_kind::reduce_scatter;
}

/// nccl-tests' bus bandwidth factor: all_reduce 2(n-1)/n, all_gather and
/// reduce_scatter (n-1)/n, broadcast 1.
constexpr double bus_factor(collective_kind c, int ranks) noexcept {
    const double n = ranks;
    switch (c) {
    case collective_kind::all_reduce:
        return 2.0 * (n - 1.0) / n;
    case collective_kind::all_gather:
    case collective_kind::reduce_scatter:
        return (n - 1.0) / n;
    case collective_kind::broadcast:
        return 1.0;
    }
    return 1.0;
}

/// Element counts and byte sizes of one collective call on one rank.
struct collective_shape {
    std::size_t count = 0;      ///< nccl-tests' "count": elements per rank per call
    std::size_t send_bytes = 0; ///< bytes each rank sends (out of place)
    std::size_t recv_bytes = 0; ///< bytes each rank receives
    std::size_t elem_bytes = 0; ///< bytes per element

    /// nccl-tests' "size" column and the numerator of algbw.
    std::size_t size_bytes() const noexcept { return std::max(send_bytes, recv_bytes); }
};

/// The shape nccl-tests runs for a requested size of `bytes`.
constexpr collective_shape shape_for(collective_kind c, std::size_t bytes, dtype type,
                                     int ranks) noexcept {
    const std::size_t elem = size_of(type);
    const std::size_t n = static_cast<std::size_t>(ranks);
    const std::size_t total = bytes / elem;
    switch (c) {
    case collective_kind::all_reduce:
    case collective_kind::broadcast:
        return {total, total * elem, total * elem, elem};
    case collective_kind::all_gather: {
        const std::size_t per_rank = total / n;
        return {per_rank, per_rank * elem, per_rank * n * elem, elem};
    }
    case collective_kind::reduce_scatter: {
        const std::size_t per_rank = total / n;
        return {per_rank, per_rank * n * elem, per_rank * elem, elem};
    }
    }
    return {};
}

/// Algorithm bandwidth in GB/s (1e9 bytes per second), as nccl-tests computes it.
inline double algbw_gbps(const collective_shape& s, double seconds) noexcept {
    return seconds > 0 ? static_cast<double>(s.size_bytes()) / 1.0e9 / seconds : 0.0;
}

} // namespace unison::bench
