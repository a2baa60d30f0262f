#pragma once

/// \file
/// 64-byte aligned, owning host storage: buckets, flat parameter units and shards.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>

namespace unison::detail {

/// A cache line on the CPUs unison runs on.
inline constexpr std::size_t cache_line_bytes = 64;

/// The first address at or after `at` whose offset within its cache line is that of
/// `like`: where a scratch buffer should start that receives a copy of memory at
/// `like` (in this process or, laid out alike, in a peer's). A copy whose source and
/// destination sit at different offsets in their lines can take twice as long: the
/// kernel's copy of a shared-memory MPI message (Open MPI's single-copy transfers)
/// into a 16-byte-aligned ring chunk from a 64-byte-aligned tensor did on an AMD
/// EPYC (docs/measurements.md, "Scratch that sits like the tensors"). Leave
/// cache_line_bytes of room before the end of `at`'s buffer.
inline std::byte* same_line_offset(std::byte* at, const void* like) noexcept {
    const auto a = reinterpret_cast<std::uintptr_t>(at);
    const auto l = reinterpret_cast<std::uintptr_t>(like);
    return at + ((l - a) & (cache_line_bytes - 1));
}

/// `bytes` bytes of uninitialized, 64-byte aligned host memory (null for 0 bytes).
class aligned_bytes {
public:
    aligned_bytes() = default;
    explicit aligned_bytes(std::size_t bytes)
        : data_(bytes == 0 ? nullptr
                           : static_cast<std::byte*>(::operator new (bytes, std::align_val_t{64}))),
          size_(bytes) {}
    std::byte* data() const noexcept { return data_.get(); }
    std::size_t size() const noexcept { return size_; }
    explicit operator bool() const noexcept { return data_ != nullptr; }
    void reset() noexcept {
        data_.reset();
        size_ = 0;
    }

private:
    struct release {
        void operator()(std::byte* p) const noexcept {
            ::operator delete (p, std::align_val_t{64});
        }
    };
    std::unique_ptr<std::byte, release> data_;
    std::size_t size_ = 0;
};

} // namespace unison::detail
