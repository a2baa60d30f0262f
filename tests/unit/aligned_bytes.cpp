// aligned_bytes' alignment, and same_line_offset: the first address at or after a
// scratch position that sits within its cache line as another buffer does.

#include <unison/core/detail/aligned_bytes.hpp>

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <random>

namespace {

std::uintptr_t address(const void* p) {
    return reinterpret_cast<std::uintptr_t>(p);
}

} // namespace

TEST_CASE("aligned_bytes: 64-byte aligned storage of the size asked for") {
    for (std::size_t bytes :
         {std::size_t{1}, std::size_t{63}, std::size_t{4096}, std::size_t{100001}}) {
        unison::detail::aligned_bytes b(bytes);
        CHECK(b.size() == bytes);
        CHECK(address(b.data()) % 64 == 0);
    }
    CHECK(unison::detail::aligned_bytes(0).data() == nullptr);
}

TEST_CASE("same_line_offset: the line offset of the memory it mirrors, within one line") {
    using unison::detail::cache_line_bytes;
    using unison::detail::same_line_offset;
    unison::detail::aligned_bytes scratch(4 * cache_line_bytes);
    unison::detail::aligned_bytes other(4 * cache_line_bytes);
    std::mt19937 rng(29);
    std::uniform_int_distribution<std::size_t> pick(0, 2 * cache_line_bytes - 1);
    for (int trial = 0; trial < 1000; ++trial) {
        std::byte* at = scratch.data() + pick(rng);
        const std::byte* like = other.data() + pick(rng);
        std::byte* placed = same_line_offset(at, like);
        CAPTURE(address(at) % cache_line_bytes);
        CAPTURE(address(like) % cache_line_bytes);
        CHECK(placed >= at);
        CHECK(placed < at + cache_line_bytes);
        CHECK(address(placed) % cache_line_bytes == address(like) % cache_line_bytes);
    }
    // Already alike: unmoved.
    CHECK(same_line_offset(scratch.data() + 5, other.data() + 69) == scratch.data() + 5);
}
