#pragma once

/// \file
/// 64-byte aligned, owning host storage: buckets, flat parameter units and shards.

#include <cstddef>
#include <memory>
#include <new>

namespace unison::detail {

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
