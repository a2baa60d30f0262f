#pragma once

/// \file
/// `parse`: reads a checkpoint's metadata file. It checks the first line and the
/// checksum, then every other line against the grammar (see format.hpp), then hands
/// the result to `validate`.

#include "unison/checkpoint/metadata.hpp"
#include "unison/checkpoint/validate.hpp"
#include "unison/core/dtype.hpp"

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <locale>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>

namespace unison::detail {

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

/// checkpoint_parse_double without std::from_chars for double, which libc++ (to 19
/// at least) lacks: the same grammar checked by hand (an optional '-', then digits
/// with at most one '.' and at least one digit, then an optional exponent; or inf,
/// infinity or nan in any case, though not nan(...)), the number read by a stream
/// in the classic locale, which rounds correctly as from_chars does, and the same
/// ranges: a value that rounds to zero from digits that are not all zeros, or past
/// the largest double, is out of range (no number); subnormals are numbers. The
/// streams differ there (libc++'s fails on any ERANGE and keeps the value;
/// libstdc++'s fails on overflow only, holding the largest double), so the value
/// decides, not the stream's state.
inline std::optional<double> checkpoint_parse_double_portable(std::string_view s) noexcept {
    std::string_view body = s;
    const bool negative = !body.empty() && body.front() == '-';
    if (negative) {
        body.remove_prefix(1);
    }
    const auto lower = [](char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c + 32) : c; };
    const auto named = [&](std::string_view word) {
        return body.size() == word.size() &&
               std::equal(body.begin(), body.end(), word.begin(),
                          [&](char a, char b) { return lower(a) == b; });
    };
    if (named("inf") || named("infinity")) {
        const double inf = std::numeric_limits<double>::infinity();
        return negative ? -inf : inf;
    }
    if (named("nan")) {
        const double nan = std::numeric_limits<double>::quiet_NaN();
        return negative ? -nan : nan;
    }
    std::size_t i = 0, digits = 0;
    bool nonzero = false;
    const auto run = [&](bool mantissa) {
        std::size_t n = 0;
        while (i < body.size() && body[i] >= '0' && body[i] <= '9') {
            nonzero = nonzero || (mantissa && body[i] != '0');
            ++i;
            ++n;
        }
        return n;
    };
    digits += run(true);
    if (i < body.size() && body[i] == '.') {
        ++i;
        digits += run(true);
    }
    if (digits == 0) {
        return std::nullopt;
    }
    if (i < body.size() && (body[i] == 'e' || body[i] == 'E')) {
        ++i;
        if (i < body.size() && (body[i] == '+' || body[i] == '-')) {
            ++i;
        }
        if (run(false) == 0) {
            return std::nullopt;
        }
    }
    if (i != body.size()) {
        return std::nullopt;
    }
    if (!nonzero) {
        return negative ? -0.0 : 0.0;
    }
    try {
        std::istringstream in{std::string(s)};
        in.imbue(std::locale::classic());
        double v = 0;
        in >> v;
        if (v == 0 || !std::isfinite(v)) { // rounded to zero; past the largest (libc++)
            return std::nullopt;
        }
        if (in.fail() && std::fpclassify(v) != FP_SUBNORMAL) { // past the largest (libstdc++)
            return std::nullopt;
        }
        return v;
    } catch (...) { // std::bad_alloc
        return std::nullopt;
    }
}

/// Reads a double the way std::from_chars does, the whole of `s` and nothing else
/// (checkpoint_parse_double_portable where the library has no such from_chars).
inline std::optional<double> checkpoint_parse_double(std::string_view s) noexcept {
#if defined(__cpp_lib_to_chars) && __cpp_lib_to_chars >= 201611L
    double v = 0;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (s.empty() || ec != std::errc{} || end != s.data() + s.size()) {
        return std::nullopt;
    }
    return v;
#else
    return checkpoint_parse_double_portable(s);
#endif
}

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

/// Reads a metadata file's text (`file` names it in errors). Throws checkpoint_error
/// naming the line and what was expected for text that breaks the grammar of
/// format.hpp's comment, or the rule that was broken for metadata `validate` rejects.
inline metadata parse(std::string_view text, const std::string& file) {
    using detail::checkpoint_quote;
    const auto fail = [&file](const std::string& problem) {
        detail::checkpoint_fail(file, problem);
    };
    // The first line says what this is; a later version may change everything after it.
    const std::string_view first = text.substr(0, text.find('\n'));
    std::uint32_t version = 0;
    {
        const std::string_view prefix = detail::checkpoint_magic;
        if (first.size() > prefix.size() && first.substr(0, prefix.size()) == prefix &&
            first[prefix.size()] == ' ') {
            if (const auto v = detail::checkpoint_parse_unsigned<std::uint64_t>(
                    first.substr(prefix.size() + 1))) {
                if (*v < oldest_format_version || *v > format_version) {
                    fail("unsupported version " + std::to_string(*v) +
                         " (this build reads versions " + std::to_string(oldest_format_version) +
                         " to " + std::to_string(format_version) + ")");
                }
                version = static_cast<std::uint32_t>(*v);
            }
        }
        if (version == 0) {
            fail("line 1: expected '" + std::string(prefix) + " " + std::to_string(format_version) +
                 "', found " + checkpoint_quote(first) +
                 " (not a unison checkpoint metadata file)");
        }
    }
    const std::string header =
        std::string(detail::checkpoint_magic) + " " + std::to_string(version);

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
    if (const std::uint64_t computed = checkpoint::checksum(version, body.data(), body.size());
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
    m.version = version;
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
    if (version >= 3) {
        const std::uint64_t steps = count("tensor_steps <count>");
        m.tensor_steps.reserve(capacity(steps));
        for (std::uint64_t i = 0; i < steps; ++i) {
            std::array<std::string_view, 3> f;
            entry("tensor_step <tensor> <steps>", f, false, steps, i);
            m.tensor_steps.push_back({u32(f[1], "tensor"), u64(f[2], "steps")});
        }
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
