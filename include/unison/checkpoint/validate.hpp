#pragma once

/// \file
/// `validate`: the rules of a checkpoint's metadata that its grammar cannot say (see
/// format.hpp): words, unique names, indices and bounds, and ranges that tile every
/// (tensor, kind) pair exactly and share no file bytes.

#include "unison/checkpoint/metadata.hpp"
#include "unison/core/dtype.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numeric>
#include <string>
#include <string_view>
#include <vector>

namespace unison::detail {

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

} // namespace unison::detail

namespace unison::checkpoint {

/// Checks the rules of format.hpp's comment that are not grammar: versions,
/// words, unique names, indices, bounds, and that the ranges tile every (tensor, kind)
/// pair exactly. Throws checkpoint_error(file, problem) at the first violation.
inline void validate(const metadata& m, const std::string& file) {
    using detail::checkpoint_quote;
    const auto fail = [&file](const std::string& problem) {
        detail::checkpoint_fail(file, problem);
    };
    const auto str = [](std::uint64_t v) { return std::to_string(v); };

    if (m.version < oldest_format_version || m.version > format_version) {
        fail("unsupported version " + str(m.version) + " (this build reads versions " +
             str(oldest_format_version) + " to " + str(format_version) + ")");
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
    if (m.version < 3 && !m.tensor_steps.empty()) {
        fail("tensor_step lines in format version " + str(m.version) + " (they came in 3)");
    }
    for (std::size_t i = 0; i < m.tensor_steps.size(); ++i) {
        const tensor_step_entry& t = m.tensor_steps[i];
        if (t.tensor >= m.tensors.size()) {
            fail("tensor_step " + str(i) + " names tensor " + str(t.tensor) + " of " +
                 str(m.tensors.size()));
        }
        if (i > 0 && t.tensor <= m.tensor_steps[i - 1].tensor) {
            fail("tensor_step " + str(i) + " names tensor " + str(t.tensor) + " after tensor " +
                 str(m.tensor_steps[i - 1].tensor) + " (increasing tensor indices expected)");
        }
        if (t.steps >= m.step) {
            fail("tensor_step " + str(i) + ": tensor " +
                 checkpoint_quote(m.tensors[t.tensor].name) + " took " + str(t.steps) +
                 " steps, not fewer than the checkpoint's " + str(m.step));
        }
    }

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

} // namespace unison::checkpoint
