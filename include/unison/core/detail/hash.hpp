#pragma once

/// \file
/// 64-bit FNV-1a: the hash behind layout and initial-value checks across ranks and
/// behind checkpoint checksums.

#include <cstddef>
#include <cstdint>

namespace unison::detail {

inline constexpr std::uint64_t fnv1a64_offset = 0xcbf29ce484222325ull;

/// The FNV-1a hash of `size` bytes at `data`, continuing from `h` (pass the previous
/// result to hash data given in pieces).
inline std::uint64_t fnv1a64(const void* data, std::size_t size,
                             std::uint64_t h = fnv1a64_offset) noexcept {
    const auto* p = static_cast<const unsigned char*>(data);
    for (std::size_t i = 0; i < size; ++i) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

} // namespace unison::detail
