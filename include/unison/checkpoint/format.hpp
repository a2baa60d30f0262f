#pragma once

/// \file
/// The metadata file of a sharded checkpoint. A checkpoint directory holds one data
/// file per rank, each a concatenation of raw element ranges of named tensors, and
/// one metadata file saying where every element is; this header writes that file
/// (`serialize`), reads it (`parse`) and checks it (`validate`).
///
/// The metadata is text, one item per line, every line ending in '\n', fields
/// separated by exactly one space, lines in exactly this order:
///
///     unison-checkpoint 1                     magic and format version
///     world_size <u32>                        ranks that wrote the checkpoint, >= 1
///     layout <word>                           e.g. zero3, fsdp_hybrid (informational)
///     optimizer <word>                        e.g. adamw, sgd, none
///     step <u64>                              optimizer steps taken
///     loss_scale <double>                     > 0 and finite
///     good_steps <u64>                        loss scaler's steps since the last overflow
///     kinds <K>                               then K lines, unique words:
///     kind <word>                               param, exp_avg, exp_avg_sq, momentum, ...
///     tensors <T>                             then T lines, unique non-empty names:
///     tensor <numel> <length> <name>
///     files <F>                               then F lines, unique names:
///     file <bytes> <hex> <length> <name>        <hex>: fnv1a64 of the file's bytes
///     ranges <R>                              then R lines, in any order:
///     range <file> <tensor> <kind> <offset> <count> <dtype> <file_offset>
///     checksum <hex>                          fnv1a64 of every byte before this line
///
/// where
///   - <u32>, <u64>, K, T, F, R, <numel>, <length>, <bytes>, <offset>, <count> and
///     <file_offset> are decimal digits: no sign, no leading zeros, within the type
///     (u64 unless the line says u32; <file>, <tensor> and <kind> are u32);
///   - <double> is written as printf's "%.17g" writes it (so it reads back exactly)
///     and read by std::from_chars;
///   - <hex> is exactly 16 lowercase hexadecimal digits;
///   - <word> is one or more ASCII letters, digits and '_';
///   - <name> is the rest of the line: exactly <length> bytes, any bytes but '\n'.
///     A file name is relative to the checkpoint directory: not ".", not "..", no
///     '/' and no NUL;
///   - <dtype> is `unison::to_string` of a floating dtype: double, float, half or
///     bfloat16.
///
/// A range line says that elements [<offset>, <offset> + <count>) of kind <kind>
/// (an index into the kind lines, 0-based) of tensor <tensor> (an index into the
/// tensor lines) are stored in file <file> (an index into the file lines) at bytes
/// [<file_offset>, <file_offset> + <count> * size_of(<dtype>)), as <dtype>.
///
/// `validate` adds the rules the grammar cannot say: every range is non-empty, its
/// indices are in range, it ends within its tensor and within its file (without
/// overflowing); ranges of one file do not share bytes; and the ranges of each
/// (tensor, kind) pair tile the tensor exactly, [0, numel) with no overlap and no
/// gap, except that a tensor with numel 0 has no ranges. It runs in O(R log R) plus
/// the sorting of the names.

#include "unison/checkpoint/error.hpp"
#include "unison/core/detail/hash.hpp"
#include "unison/core/dtype.hpp"

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace unison::checkpoint {

/// The metadata format version this build writes and reads.
inline constexpr std::uint32_t format_version = 1;

/// One model parameter (or buffer): its name and its full, unpadded number of elements.
struct tensor_entry {
    std::string name;
    std::uint64_t numel = 0;

    bool operator==(const tensor_entry&) const = default;
};

/// One data file of the checkpoint: its name relative to the checkpoint directory
/// (not empty, not "." or "..", no '/'), its size and the fnv1a64 of its bytes.
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

/// Reads exactly 16 lowercase hexadecimal digits.
inline std::optional<std::uint64_t> checkpoint_parse_hex(std::string_view s) noexcept {
    if (s.size() != 16) {
        return std::nullopt;
    }
    std::uint64_t v = 0;
    for (char c : s) {
        if (c >= '0' && c <= '9') {
            v = v << 4 | static_cast<std::uint64_t>(c - '0');
        } else if (c >= 'a' && c <= 'f') {
            v = v << 4 | static_cast<std::uint64_t>(c - 'a' + 10);
        } else {
            return std::nullopt;
        }
    }
    return v;
}

/// Reads a decimal number of type `T`: digits only (no sign, no spaces), no leading
/// zeros, and no more than `T` holds.
template <class T>
std::optional<T> checkpoint_parse_unsigned(std::string_view s) noexcept {
    if (s.empty() || (s.size() > 1 && s[0] == '0')) {
        return std::nullopt;
    }
    for (char c : s) {
        if (c < '0' || c > '9') {
            return std::nullopt;
        }
    }
    T v = 0;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec != std::errc{} || end != s.data() + s.size()) {
        return std::nullopt;
    }
    return v;
}

/// Reads a double the way std::from_chars does, the whole of `s` and nothing else.
inline std::optional<double> checkpoint_parse_double(std::string_view s) noexcept {
    double v = 0;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (s.empty() || ec != std::errc{} || end != s.data() + s.size()) {
        return std::nullopt;
    }
    return v;
}

/// `v` as printf("%.17g") writes it in the C locale, whatever the current locale.
inline std::string checkpoint_format_double(double v) {
    std::array<char, 64> buffer{};
    const auto [end, ec] = std::to_chars(buffer.data(), buffer.data() + buffer.size(), v,
                                         std::chars_format::general, 17);
    (void)ec; // 64 characters hold any double at 17 digits
    return std::string(buffer.data(), end);
}

/// One or more ASCII letters, digits and '_'.
inline bool checkpoint_is_word(std::string_view s) noexcept {
    return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
               c == '_';
    });
}

/// A name that stays inside the checkpoint directory: a single path component.
inline bool checkpoint_is_file_name(std::string_view s) noexcept {
    return !s.empty() && s != "." && s != ".." &&
           s.find_first_of(std::string_view("/\n\0", 3)) == std::string_view::npos;
}

/// The floating dtypes' names, for error messages.
inline constexpr std::string_view checkpoint_dtype_names = "double, float, half or bfloat16";

/// Splits `line` at single spaces into exactly out.size() non-empty fields. With
/// `rest`, the last field is the rest of the line, spaces and all, and may be empty
/// (a name). False when the line does not have that shape.
inline bool checkpoint_split(std::string_view line, std::span<std::string_view> out,
                             bool rest) noexcept {
    for (std::size_t i = 0; i < out.size(); ++i) {
        const bool last = i + 1 == out.size();
        if (last && rest) {
            out[i] = line;
            return true;
        }
        const std::size_t space = line.find(' ');
        if (last) {
            if (line.empty() || space != std::string_view::npos) {
                return false;
            }
            out[i] = line;
            return true;
        }
        if (space == 0 || space == std::string_view::npos) {
            return false;
        }
        out[i] = line.substr(0, space);
        line.remove_prefix(space + 1);
    }
    return true;
}

/// Throws checkpoint_error(file, problem).
[[noreturn]] inline void checkpoint_fail(const std::string& file, const std::string& problem) {
    throw checkpoint_error(file, problem);
}

/// Hands out the lines of the metadata's body one at a time and names the current
/// line's number in errors.
class checkpoint_line_reader {
public:
    checkpoint_line_reader(std::string_view text, const std::string& file)
        : text_(text), file_(file) {}

    bool at_end() const noexcept { return pos_ == text_.size(); }
    std::size_t bytes_left() const noexcept { return text_.size() - pos_; }

    /// The next line without its '\n'; at the end of the text, an error that says
    /// `expected` (and `context`, if any) was expected.
    std::string_view next(std::string_view expected, std::string_view context = {}) {
        ++line_;
        if (at_end()) {
            fail("expected '" + std::string(expected) + "', found the end of the metadata" +
                 std::string(context));
        }
        std::size_t end = text_.find('\n', pos_);
        if (end == std::string_view::npos) {
            end = text_.size();
        }
        const std::string_view line = text_.substr(pos_, end - pos_);
        pos_ = std::min(end + 1, text_.size());
        return line;
    }

    /// Throws checkpoint_error "line N: PROBLEM" for the line last returned.
    [[noreturn]] void fail(const std::string& problem) const {
        checkpoint_fail(file_, "line " + std::to_string(line_) + ": " + problem);
    }

private:
    std::string_view text_;
    const std::string& file_;
    std::size_t pos_ = 0;
    std::size_t line_ = 0;
};

} // namespace unison::detail

namespace unison::checkpoint {

/// The metadata file's text for `m`, deterministic (equal metadata, equal bytes). `m`
/// should pass `validate`; `parse` rejects the text of one that does not.
inline std::string serialize(const metadata& m) {
    std::string s;
    const auto line = [&s](const auto&... parts) {
        ((s += parts), ...);
        s += '\n';
    };
    const auto num = [](std::uint64_t v) { return std::to_string(v); };
    line(detail::checkpoint_magic, " ", num(m.version));
    line("world_size ", num(m.world_size));
    line("layout ", m.layout);
    line("optimizer ", m.optimizer);
    line("step ", num(m.step));
    line("loss_scale ", detail::checkpoint_format_double(m.loss_scale));
    line("good_steps ", num(m.good_steps));
    line("kinds ", num(m.kinds.size()));
    for (const std::string& kind : m.kinds) {
        line("kind ", kind);
    }
    line("tensors ", num(m.tensors.size()));
    for (const tensor_entry& t : m.tensors) {
        line("tensor ", num(t.numel), " ", num(t.name.size()), " ", t.name);
    }
    line("files ", num(m.files.size()));
    for (const file_entry& f : m.files) {
        line("file ", num(f.bytes), " ", detail::checkpoint_hex(f.checksum), " ",
             num(f.name.size()), " ", f.name);
    }
    line("ranges ", num(m.ranges.size()));
    for (const range_entry& r : m.ranges) {
        line("range ", num(r.file), " ", num(r.tensor), " ", num(r.kind), " ", num(r.offset), " ",
             num(r.count), " ", to_string(r.type), " ", num(r.file_offset));
    }
    line("checksum ", detail::checkpoint_hex(fnv1a64(s.data(), s.size())));
    return s;
}

/// Checks the rules of the file header's comment that are not grammar: versions,
/// words, unique names, indices, bounds, and that the ranges tile every (tensor, kind)
/// pair exactly. Throws checkpoint_error(file, problem) at the first violation.
inline void validate(const metadata& m, const std::string& file) {
    using detail::checkpoint_quote;
    const auto fail = [&file](const std::string& problem) {
        detail::checkpoint_fail(file, problem);
    };
    const auto str = [](std::uint64_t v) { return std::to_string(v); };

    if (m.version != format_version) {
        fail("unsupported version " + str(m.version) + " (this build reads version " +
             str(format_version) + ")");
    }
    if (m.world_size == 0) {
        fail("world_size is 0 (at least one rank writes a checkpoint)");
    }
    if (!detail::checkpoint_is_word(m.layout)) {
        fail("layout " + checkpoint_quote(m.layout) +
             " is not a word (one or more ASCII letters, digits and '_')");
    }
    if (!detail::checkpoint_is_word(m.optimizer)) {
        fail("optimizer " + checkpoint_quote(m.optimizer) +
             " is not a word (one or more ASCII letters, digits and '_')");
    }
    if (!(std::isfinite(m.loss_scale) && m.loss_scale > 0)) {
        fail("loss_scale " + detail::checkpoint_format_double(m.loss_scale) +
             " is not positive and finite");
    }

    // Names: each list sorted by name (then index), so equal names are neighbours.
    const auto check_unique = [&](std::size_t size, const auto& name_of, std::string_view what) {
        std::vector<std::size_t> order(size);
        std::iota(order.begin(), order.end(), std::size_t{0});
        std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
            const std::string_view na = name_of(a), nb = name_of(b);
            return na != nb ? na < nb : a < b;
        });
        for (std::size_t i = 1; i < order.size(); ++i) {
            if (name_of(order[i - 1]) == name_of(order[i])) {
                fail("duplicate " + std::string(what) + " name " +
                     checkpoint_quote(name_of(order[i])) + " (" + std::string(what) + "s " +
                     str(order[i - 1]) + " and " + str(order[i]) + ")");
            }
        }
    };

    if (m.kinds.empty()) {
        fail("no kinds: a checkpoint stores at least one kind of state (such as param)");
    }
    for (std::size_t i = 0; i < m.kinds.size(); ++i) {
        if (!detail::checkpoint_is_word(m.kinds[i])) {
            fail("kind " + str(i) + " " + checkpoint_quote(m.kinds[i]) +
                 " is not a word (one or more ASCII letters, digits and '_')");
        }
    }
    check_unique(
        m.kinds.size(), [&](std::size_t i) -> std::string_view { return m.kinds[i]; }, "kind");

    for (std::size_t i = 0; i < m.tensors.size(); ++i) {
        const std::string& name = m.tensors[i].name;
        if (name.empty()) {
            fail("tensor " + str(i) + " has an empty name");
        }
        if (name.find('\n') != std::string::npos) {
            fail("tensor " + str(i) + " name " + checkpoint_quote(name) + " contains a newline");
        }
    }
    check_unique(
        m.tensors.size(), [&](std::size_t i) -> std::string_view { return m.tensors[i].name; },
        "tensor");

    for (std::size_t i = 0; i < m.files.size(); ++i) {
        if (!detail::checkpoint_is_file_name(m.files[i].name)) {
            fail("file " + str(i) + " name " + checkpoint_quote(m.files[i].name) +
                 " is not a file name inside the checkpoint directory (empty, \".\", \"..\", "
                 "or holds '/', NUL or a newline)");
        }
    }
    check_unique(
        m.files.size(), [&](std::size_t i) -> std::string_view { return m.files[i].name; }, "file");

    // Each range on its own: indices, dtype, and bounds within tensor and file.
    constexpr std::uint64_t max = std::numeric_limits<std::uint64_t>::max();
    const auto describe = [&](std::size_t i) {
        const range_entry& r = m.ranges[i];
        return "range " + str(i) + " of tensor " + checkpoint_quote(m.tensors[r.tensor].name) +
               " kind " + checkpoint_quote(m.kinds[r.kind]);
    };
    for (std::size_t i = 0; i < m.ranges.size(); ++i) {
        const range_entry& r = m.ranges[i];
        if (r.file >= m.files.size()) {
            fail("range " + str(i) + " names file " + str(r.file) + " of " + str(m.files.size()));
        }
        if (r.tensor >= m.tensors.size()) {
            fail("range " + str(i) + " names tensor " + str(r.tensor) + " of " +
                 str(m.tensors.size()));
        }
        if (r.kind >= m.kinds.size()) {
            fail("range " + str(i) + " names kind " + str(r.kind) + " of " + str(m.kinds.size()));
        }
        if (!is_floating(r.type)) {
            fail(describe(i) + " has dtype " + std::string(to_string(r.type)) +
                 "; ranges hold floating dtypes only (" +
                 std::string(detail::checkpoint_dtype_names) + ")");
        }
        if (r.count == 0) {
            fail(describe(i) + " is empty (count 0)");
        }
        const std::uint64_t numel = m.tensors[r.tensor].numel;
        if (r.offset > max - r.count) {
            fail(describe(i) + ": offset " + str(r.offset) + " + count " + str(r.count) +
                 " overflows");
        }
        if (r.offset + r.count > numel) {
            fail(describe(i) + " ends at element " + str(r.offset + r.count) +
                 ", past the tensor's " + str(numel) + " elements");
        }
        const std::uint64_t size = size_of(r.type);
        if (r.count > max / size) {
            fail(describe(i) + ": count " + str(r.count) + " * " + str(size) + " bytes overflows");
        }
        const std::uint64_t bytes = r.count * size;
        const file_entry& f = m.files[r.file];
        if (r.file_offset > max - bytes) {
            fail(describe(i) + ": file_offset " + str(r.file_offset) + " + " + str(bytes) +
                 " bytes overflows");
        }
        if (r.file_offset + bytes > f.bytes) {
            fail(describe(i) + " needs bytes [" + str(r.file_offset) + ", " +
                 str(r.file_offset + bytes) + ") of file " + checkpoint_quote(f.name) +
                 ", which has " + str(f.bytes) + " bytes");
        }
    }

    std::vector<std::size_t> order(m.ranges.size());
    std::iota(order.begin(), order.end(), std::size_t{0});

    // Coverage: sorted by (tensor, kind, offset), the ranges of each pair must run
    // from 0 to numel, each starting where the previous one ended. Every pair of a
    // tensor with numel > 0 either consumes a range or fails, so this is O(R + T + K).
    std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
        const range_entry& ra = m.ranges[a];
        const range_entry& rb = m.ranges[b];
        if (ra.tensor != rb.tensor) {
            return ra.tensor < rb.tensor;
        }
        if (ra.kind != rb.kind) {
            return ra.kind < rb.kind;
        }
        return ra.offset != rb.offset ? ra.offset < rb.offset : a < b;
    });
    const auto gap = [&](std::size_t tensor, std::size_t kind, std::uint64_t from,
                         std::uint64_t to) {
        fail("tensor " + checkpoint_quote(m.tensors[tensor].name) + " kind " +
             checkpoint_quote(m.kinds[kind]) + " elements [" + str(from) + ", " + str(to) +
             ") are covered by no range");
    };
    std::size_t k = 0;
    for (std::size_t t = 0; t < m.tensors.size(); ++t) {
        if (m.tensors[t].numel == 0) {
            continue; // its ranges, if any, were rejected above as ending past numel
        }
        for (std::size_t kind = 0; kind < m.kinds.size(); ++kind) {
            std::uint64_t covered = 0;
            std::size_t previous = 0;
            for (; k < order.size() && m.ranges[order[k]].tensor == t &&
                   m.ranges[order[k]].kind == kind;
                 ++k) {
                const range_entry& r = m.ranges[order[k]];
                if (r.offset < covered) {
                    fail(describe(order[k]) + " overlaps range " + str(previous) + " (elements [" +
                         str(r.offset) + ", " + str(covered) + "))");
                }
                if (r.offset > covered) {
                    gap(t, kind, covered, r.offset);
                }
                covered = r.offset + r.count;
                previous = order[k];
            }
            if (covered < m.tensors[t].numel) {
                gap(t, kind, covered, m.tensors[t].numel);
            }
        }
    }

    // Ranges of one file must not share bytes: sorted by (file, file_offset), each
    // range starts at or after the furthest end seen so far in its file.
    const auto byte_end = [&](std::size_t i) {
        return m.ranges[i].file_offset + m.ranges[i].count * size_of(m.ranges[i].type);
    };
    std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
        const range_entry& ra = m.ranges[a];
        const range_entry& rb = m.ranges[b];
        if (ra.file != rb.file) {
            return ra.file < rb.file;
        }
        return ra.file_offset != rb.file_offset ? ra.file_offset < rb.file_offset : a < b;
    });
    for (std::size_t j = 1, furthest = order.empty() ? 0 : order[0]; j < order.size(); ++j) {
        const std::size_t i = order[j];
        if (m.ranges[i].file != m.ranges[furthest].file) {
            furthest = i;
            continue;
        }
        if (m.ranges[i].file_offset < byte_end(furthest)) {
            fail(describe(i) + " shares bytes of file " +
                 checkpoint_quote(m.files[m.ranges[i].file].name) + " with " + describe(furthest) +
                 " (it starts at byte " + str(m.ranges[i].file_offset) + ", the other ends at " +
                 str(byte_end(furthest)) + ")");
        }
        if (byte_end(i) > byte_end(furthest)) {
            furthest = i;
        }
    }
}

/// Reads a metadata file's text (`file` names it in errors). Throws checkpoint_error
/// naming the line and what was expected for text that breaks the grammar of this
/// header's comment, or the rule that was broken for metadata `validate` rejects.
inline metadata parse(std::string_view text, const std::string& file) {
    using detail::checkpoint_quote;
    const auto fail = [&file](const std::string& problem) {
        detail::checkpoint_fail(file, problem);
    };
    const std::string header =
        std::string(detail::checkpoint_magic) + " " + std::to_string(format_version);

    // The first line says what this is; a later version may change everything after it.
    const std::string_view first = text.substr(0, text.find('\n'));
    if (first != header) {
        const std::string_view prefix = detail::checkpoint_magic;
        if (first.size() > prefix.size() && first.substr(0, prefix.size()) == prefix &&
            first[prefix.size()] == ' ') {
            if (const auto version = detail::checkpoint_parse_unsigned<std::uint64_t>(
                    first.substr(prefix.size() + 1))) {
                fail("unsupported version " + std::to_string(*version) +
                     " (this build reads version " + std::to_string(format_version) + ")");
            }
        }
        fail("line 1: expected '" + header + "', found " + checkpoint_quote(first) +
             " (not a unison checkpoint metadata file)");
    }

    // The last line holds the checksum of everything before it.
    if (text.back() != '\n') {
        fail("the last line does not end with a newline (truncated?)");
    }
    const std::size_t previous_newline = text.find_last_of('\n', text.size() - 2);
    const std::size_t body_size =
        previous_newline == std::string_view::npos ? 0 : previous_newline + 1;
    const std::string_view body = text.substr(0, body_size);
    const std::string_view last = text.substr(body_size, text.size() - 1 - body_size);
    constexpr std::string_view checksum_key = "checksum ";
    const std::optional<std::uint64_t> stored =
        last.substr(0, checksum_key.size()) == checksum_key
            ? detail::checkpoint_parse_hex(last.substr(checksum_key.size()))
            : std::nullopt;
    if (!stored) {
        const auto lines = std::count(body.begin(), body.end(), '\n') + 1;
        fail("line " + std::to_string(lines) +
             ": expected 'checksum <16 hex digits>' as the last line, found " +
             checkpoint_quote(last) + " (truncated?)");
    }
    if (const std::uint64_t computed = checkpoint::fnv1a64(body.data(), body.size());
        computed != *stored) {
        fail("checksum mismatch: metadata was modified or truncated (its bytes hash to " +
             detail::checkpoint_hex(computed) + ", its last line says " +
             detail::checkpoint_hex(*stored) + ")");
    }

    // The body, line by line.
    detail::checkpoint_line_reader reader(body, file);
    const auto key_of = [](std::string_view pattern) {
        return pattern.substr(0, pattern.find(' '));
    };
    // Whether `line` splits into out.size() fields, the first of them `pattern`'s key.
    const auto fields = [&](std::string_view line, std::string_view pattern,
                            std::span<std::string_view> out, bool rest) {
        return detail::checkpoint_split(line, out, rest) && out[0] == key_of(pattern);
    };
    const auto expected = [&](std::string_view pattern, std::string_view line) {
        return "expected '" + std::string(pattern) + "', found " + checkpoint_quote(line);
    };
    const auto number = [&]<class T>(std::string_view token, std::string_view what, T) -> T {
        if (const auto v = detail::checkpoint_parse_unsigned<T>(token)) {
            return *v;
        }
        reader.fail(std::string(what) + " " + checkpoint_quote(token) +
                    " is not a decimal number in [0, " +
                    std::to_string(std::numeric_limits<T>::max()) +
                    "] (digits only: no sign, no leading zeros)");
    };
    const auto u64 = [&](std::string_view token, std::string_view what) {
        return number(token, what, std::uint64_t{});
    };
    const auto u32 = [&](std::string_view token, std::string_view what) {
        return number(token, what, std::uint32_t{});
    };
    // A `key value` line; returns the value.
    const auto value = [&](std::string_view pattern) {
        std::array<std::string_view, 2> f;
        const std::string_view line = reader.next(pattern);
        if (!fields(line, pattern, f, false)) {
            reader.fail(expected(pattern, line));
        }
        return f[1];
    };
    // The count line of a list, and the list's lines; never reserves more entries
    // than the remaining text could hold, whatever the count says.
    const auto count = [&](std::string_view pattern) {
        return u64(value(pattern), key_of(pattern));
    };
    const auto capacity = [&](std::uint64_t n) {
        return static_cast<std::size_t>(std::min<std::uint64_t>(n, reader.bytes_left() / 8));
    };
    const auto entry = [&](std::string_view pattern, std::span<std::string_view> out, bool rest,
                           std::uint64_t n, std::uint64_t i) {
        // Built only for an error: R can be large.
        const auto context = [&] {
            return " (the count line says " + std::to_string(n) + " " +
                   std::string(key_of(pattern)) + " lines; this is number " +
                   std::to_string(i + 1) + ")";
        };
        if (reader.at_end()) {
            reader.next(pattern, context());
        }
        const std::string_view line = reader.next(pattern);
        if (!fields(line, pattern, out, rest)) {
            reader.fail(expected(pattern, line) + context());
        }
    };
    // <length> <name>: the name is exactly <length> bytes.
    const auto name = [&](std::string_view length, std::string_view rest) {
        const std::uint64_t n = u64(length, "name length");
        if (rest.size() != n) {
            reader.fail("the name is " + std::to_string(rest.size()) +
                        " bytes but its length field says " + std::to_string(n));
        }
        return std::string(rest);
    };

    metadata m;
    m.version = format_version;
    reader.next(header); // checked above
    m.world_size = u32(value("world_size <ranks>"), "world_size");
    m.layout = value("layout <word>");
    m.optimizer = value("optimizer <word>");
    m.step = u64(value("step <count>"), "step");
    {
        const std::string_view token = value("loss_scale <number>");
        const auto scale = detail::checkpoint_parse_double(token);
        if (!scale) {
            reader.fail("loss_scale " + checkpoint_quote(token) + " is not a number");
        }
        m.loss_scale = *scale;
    }
    m.good_steps = u64(value("good_steps <count>"), "good_steps");

    const std::uint64_t kinds = count("kinds <count>");
    m.kinds.reserve(capacity(kinds));
    for (std::uint64_t i = 0; i < kinds; ++i) {
        std::array<std::string_view, 2> f;
        entry("kind <word>", f, false, kinds, i);
        m.kinds.emplace_back(f[1]);
    }

    const std::uint64_t tensors = count("tensors <count>");
    m.tensors.reserve(capacity(tensors));
    for (std::uint64_t i = 0; i < tensors; ++i) {
        std::array<std::string_view, 4> f;
        entry("tensor <numel> <name-length> <name>", f, true, tensors, i);
        tensor_entry& t = m.tensors.emplace_back();
        t.numel = u64(f[1], "numel");
        t.name = name(f[2], f[3]);
    }

    const std::uint64_t files = count("files <count>");
    m.files.reserve(capacity(files));
    for (std::uint64_t i = 0; i < files; ++i) {
        std::array<std::string_view, 5> f;
        entry("file <bytes> <checksum> <name-length> <name>", f, true, files, i);
        file_entry& e = m.files.emplace_back();
        e.bytes = u64(f[1], "bytes");
        const auto checksum = detail::checkpoint_parse_hex(f[2]);
        if (!checksum) {
            reader.fail("checksum " + checkpoint_quote(f[2]) +
                        " is not 16 lowercase hexadecimal digits");
        }
        e.checksum = *checksum;
        e.name = name(f[3], f[4]);
    }

    const std::uint64_t ranges = count("ranges <count>");
    m.ranges.reserve(capacity(ranges));
    for (std::uint64_t i = 0; i < ranges; ++i) {
        std::array<std::string_view, 8> f;
        entry("range <file> <tensor> <kind> <offset> <count> <dtype> <file_offset>", f, false,
              ranges, i);
        range_entry& r = m.ranges.emplace_back();
        r.file = u32(f[1], "file");
        r.tensor = u32(f[2], "tensor");
        r.kind = u32(f[3], "kind");
        r.offset = u64(f[4], "offset");
        r.count = u64(f[5], "count");
        const auto type = parse_dtype(f[6]);
        if (!type || to_string(*type) != f[6]) {
            reader.fail("dtype " + checkpoint_quote(f[6]) + " is not one of " +
                        std::string(detail::checkpoint_dtype_names));
        }
        r.type = *type;
        r.file_offset = u64(f[7], "file_offset");
    }

    if (!reader.at_end()) {
        const std::string_view extra = reader.next("checksum <16 hex digits>");
        reader.fail("expected 'checksum <16 hex digits>' after the last range, found " +
                    checkpoint_quote(extra));
    }

    validate(m, file);
    return m;
}

} // namespace unison::checkpoint
