#pragma once

/// \file
/// The hashes behind checks across ranks and checkpoint checksums: 64-bit FNV-1a,
/// one byte at a time (small keys: layouts, call fingerprints; and the checksums of
/// checkpoint format version 1), and XXH3-64 from xxHash (bulk data: parameter
/// values compared across ranks, the checksums of format version 2), which runs at
/// memory speed.
///
/// xxHash is used header-only (XXH_INLINE_ALL: every function static inline, under
/// names of its own, so a program may also use xxHash itself). Debian and Ubuntu:
/// `apt-get install libxxhash-dev`; elsewhere, xxhash.h from
/// https://github.com/Cyan4973/xxHash on the include path.

#include <cstddef>
#include <cstdint>

#if !__has_include(<xxhash.h>)
#error                                                                                             \
    "unison needs xxhash.h (xxHash 0.8 or later): apt-get install libxxhash-dev, or put xxHash's single header on the include path"
#endif
#ifndef XXH_INLINE_ALL
#define XXH_INLINE_ALL
#define UNISON_DEFINED_XXH_INLINE_ALL
#endif
#include <xxhash.h>
#ifdef UNISON_DEFINED_XXH_INLINE_ALL
#undef XXH_INLINE_ALL
#undef UNISON_DEFINED_XXH_INLINE_ALL
#endif

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

/// XXH3-64 (seed 0) of `size` bytes at `data`: the same value xxHash's
/// XXH3_64bits and `xxhsum -H3` give.
inline std::uint64_t xxh3_64(const void* data, std::size_t size) noexcept {
    static_assert(XXH_VERSION_NUMBER >= 800, "unison needs xxHash 0.8 or later (XXH3 is stable "
                                             "from 0.8.0)");
    return XXH3_64bits(data, size);
}

/// XXH3-64 of `size` bytes at `data` seeded with `seed` (to hash data given in
/// pieces: pass the previous result).
inline std::uint64_t xxh3_64(const void* data, std::size_t size, std::uint64_t seed) noexcept {
    return XXH3_64bits_withSeed(data, size, seed);
}

} // namespace unison::detail
