#pragma once

/// \file
/// What a sharded checkpoint's metadata file says, as types (`metadata` and its
/// entries), and the text forms of its fields that serialize, parse and validate
/// share. format.hpp gives the file's grammar.

#include "unison/checkpoint/error.hpp"
#include "unison/core/detail/hash.hpp"
#include "unison/core/dtype.hpp"

#include <array>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace unison::checkpoint {

/// The metadata format version this build writes. Version 3 adds the tensors whose
/// optimizer steps differ from the checkpoint's (`tensor_step` lines); version 2
/// checksums with XXH3-64 (memory speed); version 1 with FNV-1a (one byte at a
/// time, 0.3 GB/s). All three are read.
inline constexpr std::uint32_t format_version = 3;
/// The oldest version this build reads.
inline constexpr std::uint32_t oldest_format_version = 1;

/// The checksum of `size` bytes at `data` in format version `version` (of a data
/// file, and of the metadata text before its last line).
inline std::uint64_t checksum(std::uint32_t version, const void* data, std::size_t size) noexcept {
    return version == 1 ? detail::fnv1a64(data, size) : detail::xxh3_64(data, size);
}

/// One model parameter (or buffer): its name and its full, unpadded number of elements.
struct tensor_entry {
    std::string name;
    std::uint64_t numel = 0;

    bool operator==(const tensor_entry&) const = default;
};

/// A tensor whose optimizer took fewer steps than the checkpoint's `step`: steps
/// in which no rank gave it a gradient left it (and its state) as it was, as
/// PyTorch's optimizers skip a parameter whose gradient is None. Its bias
/// corrections (Adam) count its own steps. `tensor` indexes metadata::tensors.
struct tensor_step_entry {
    std::uint32_t tensor = 0;
    std::uint64_t steps = 0;

    bool operator==(const tensor_step_entry&) const = default;
};

/// One data file of the checkpoint: its name relative to the checkpoint directory
/// (not empty, not "." or "..", no '/'), its size and the checksum of its bytes.
struct file_entry {
    std::string name;
    std::uint64_t bytes = 0;
    std::uint64_t checksum = 0;

    bool operator==(const file_entry&) const = default;
};

/// Elements [offset, offset + count) of kind `kind` of tensor `tensor`, stored in
/// file `file` from byte `file_offset` on as `count` elements of the floating dtype
/// `type`. `file`, `tensor` and `kind` index metadata::files, ::tensors and ::kinds.
struct range_entry {
    std::uint32_t file = 0;
    std::uint32_t tensor = 0;
    std::uint32_t kind = 0;
    std::uint64_t offset = 0;
    std::uint64_t count = 0;
    dtype type = dtype::f32;
    std::uint64_t file_offset = 0;

    bool operator==(const range_entry&) const = default;
};

/// Everything a checkpoint's metadata file says.
struct metadata {
    std::uint32_t version = format_version;
    /// Ranks that wrote the checkpoint (>= 1).
    std::uint32_t world_size = 0;
    /// How the state was sharded, e.g. "zero3", "fsdp_hybrid" (informational; a word of
    /// ASCII letters, digits and '_').
    std::string layout;
    /// The optimizer whose state is stored, e.g. "adamw", "sgd", "none" (a word).
    std::string optimizer;
    /// Optimizer steps taken.
    std::uint64_t step = 0;
    /// The loss scaler's scale (> 0 and finite).
    double loss_scale = 1.0;
    /// The loss scaler's steps since the last overflow.
    std::uint64_t good_steps = 0;
    /// The kinds of state stored per tensor, e.g. "param", "exp_avg", "exp_avg_sq",
    /// "momentum" (unique words, at least one).
    std::vector<std::string> kinds;
    /// The tensors (unique, non-empty names without '\n').
    std::vector<tensor_entry> tensors;
    /// The tensors whose steps differ from `step` (fewer), by increasing index
    /// (version 3; none in older versions: every tensor took every step).
    std::vector<tensor_step_entry> tensor_steps;
    /// The data files (unique names).
    std::vector<file_entry> files;
    /// Where each element of each (tensor, kind) pair is stored.
    std::vector<range_entry> ranges;

    bool operator==(const metadata&) const = default;
};

/// The 64-bit FNV-1a hash of `size` bytes at `data`, continuing from `h` (pass the
/// previous result to hash data given in pieces).
using detail::fnv1a64;

/// The 64-bit FNV-1a hash of `bytes`, continuing from `h`.
inline std::uint64_t fnv1a64(std::span<const std::byte> bytes,
                             std::uint64_t h = detail::fnv1a64_offset) noexcept {
    return fnv1a64(bytes.data(), bytes.size(), h);
}

} // namespace unison::checkpoint

namespace unison::detail {

inline constexpr std::string_view checkpoint_magic = "unison-checkpoint";

/// `s` in quotes for an error message: control bytes, quotes and backslashes as \xHH,
/// and cut after 80 bytes (names are arbitrary bytes of any length).
inline std::string checkpoint_quote(std::string_view s) {
    constexpr std::size_t limit = 80;
    constexpr char digits[] = "0123456789abcdef";
    std::string out = "'";
    for (std::size_t i = 0; i < s.size() && i < limit; ++i) {
        const auto c = static_cast<unsigned char>(s[i]);
        if (c < 0x20 || c == 0x7f || c == '\'' || c == '\\') {
            out += "\\x";
            out += digits[c >> 4];
            out += digits[c & 15];
        } else {
            out += static_cast<char>(c);
        }
    }
    if (s.size() > limit) {
        out += "...";
    }
    out += '\'';
    return out;
}

/// `v` as exactly 16 lowercase hexadecimal digits.
inline std::string checkpoint_hex(std::uint64_t v) {
    constexpr char digits[] = "0123456789abcdef";
    std::string s(16, '0');
    for (std::size_t i = 16; i-- > 0; v >>= 4) {
        s[i] = digits[v & 15];
    }
    return s;
}

/// `v` as printf("%.17g") writes it in the C locale, whatever the current locale.
inline std::string checkpoint_format_double(double v) {
    std::array<char, 64> buffer{};
    const auto [end, ec] = std::to_chars(buffer.data(), buffer.data() + buffer.size(), v,
                                         std::chars_format::general, 17);
    (void)ec; // 64 characters hold any double at 17 digits
    return std::string(buffer.data(), end);
}

/// The floating dtypes' names, for error messages.
inline constexpr std::string_view checkpoint_dtype_names = "double, float, half or bfloat16";

/// Throws checkpoint_error(file, problem).
[[noreturn]] inline void checkpoint_fail(const std::string& file, const std::string& problem) {
    throw checkpoint_error(file, problem);
}

} // namespace unison::detail
