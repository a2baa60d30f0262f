#pragma once

/// \file
/// The validation step between the public collective functions and the backends:
/// checks a call's user tensors and turns them into a `collective_call`. It decides
/// nothing about how the call runs (each backend's tuning file does). Every check
/// here runs before any data moves, so a rejected call leaves the communicator
/// usable.

#include "unison/comm/collective.hpp"
#include "unison/core/error.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace unison::detail {

/// Rank and size of the calling communicator, and the operation being built.
struct call_site {
    int rank;
    int size;
    operation op;

    [[noreturn]] void fail(const std::string& what) const {
        throw argument_error(rank, to_string(op), what);
    }
};

inline std::string describe(std::size_t count, dtype t) {
    return std::to_string(count) + " " + std::string(to_string(t)) + " elements";
}

/// The most elements of `t` one object can hold: PTRDIFF_MAX bytes, the C++ limit
/// on an object's size (and so on any buffer a backend could read or write).
constexpr std::size_t max_elements(dtype t) noexcept {
    return static_cast<std::size_t>(PTRDIFF_MAX) / size_of(t);
}

/// Throws unless `count` elements of `t` can be one buffer. A count past it
/// (SIZE_MAX, 2^62 floats, (size_t)-1024) comes from a negative or wrapped-around
/// computation, and would have a backend read or write far past the data.
inline void check_size(const call_site& site, const std::string& name, std::size_t count, dtype t) {
    if (count > max_elements(t)) {
        site.fail("the " + name + " has " + describe(count, t) + ", more bytes than any object " +
                  "can hold (" + std::to_string(max_elements(t)) + " elements at most); " +
                  "was the count computed from a negative or overflowed value?");
    }
}

/// count * factor, or a failure naming `what` when it is no possible buffer size.
inline std::size_t checked_product(const call_site& site, std::size_t count, std::size_t factor,
                                   dtype t, const std::string& what) {
    if (factor != 0 && count > max_elements(t) / factor) {
        site.fail(what + " (" + describe(count, t) + " times " + std::to_string(factor) +
                  ") is more than any object can hold (" + std::to_string(max_elements(t)) +
                  " elements at most)");
    }
    return count * factor;
}

inline void check_buffer(const call_site& site, const std::string& name, const void* data,
                         std::size_t count, dtype t) {
    check_size(site, name, count, t);
    if (data == nullptr && count != 0) {
        site.fail("the " + name + " has " + std::to_string(count) +
                  " elements but a null data pointer");
    }
}

inline void check_same_kind(const call_site& site, const const_buffer& in, const buffer& out) {
    if (in.type != out.type) {
        site.fail("the input is " + std::string(to_string(in.type)) + " but the output is " +
                  std::string(to_string(out.type)));
    }
    if (in.location != out.location) {
        site.fail("the input is on " + to_string(in.location) + " but the output is on " +
                  to_string(out.location));
    }
    check_buffer(site, "input", in.data, in.count, in.type);
    check_buffer(site, "output", out.data, out.count, out.type);
}

inline void check_reduction(const call_site& site, dtype t, reduce_op op) {
    if (op == reduce_op::avg && !is_floating(t)) {
        site.fail("avg is defined for floating-point dtypes only, and the data is " +
                  std::string(to_string(t)) +
                  " (integer division would truncate silently); reduce with sum and divide");
    }
}

inline void check_rank(const call_site& site, const char* what, int r) {
    if (r < 0 || r >= site.size) {
        site.fail(std::string(what) + " " + std::to_string(r) + " is out of range for " +
                  std::to_string(site.size) + " ranks");
    }
}

/// Out-of-place calls must not overlap: an overlapping pair is either a mistake or
/// an in-place call spelled wrong, and both would read half-written data.
inline void check_disjoint(const call_site& site, const const_buffer& in, const buffer& out) {
    const auto* a = static_cast<const std::uint8_t*>(in.data);
    const auto* b = static_cast<const std::uint8_t*>(out.data);
    const std::size_t an = in.count * size_of(in.type);
    const std::size_t bn = out.count * size_of(out.type);
    if (an != 0 && bn != 0 && a < b + bn && b < a + an) {
        site.fail("the input and output overlap; use the in-place form (one buffer)");
    }
}

inline void check_count(const call_site& site, const char* name, std::size_t have, std::size_t want,
                        dtype t, const std::string& why) {
    if (have != want) {
        site.fail(std::string("the ") + name + " has " + describe(have, t) + " but needs " +
                  std::to_string(want) + " (" + why + ")");
    }
}

inline void check_divisible(const call_site& site, std::size_t count, dtype t) {
    if (count % static_cast<std::size_t>(site.size) != 0) {
        site.fail("the buffer has " + describe(count, t) + ", not a multiple of the " +
                  std::to_string(site.size) + " ranks");
    }
}

inline collective_call all_reduce_call(call_site site, const_buffer in, buffer out, reduce_op op) {
    check_same_kind(site, in, out);
    check_reduction(site, in.type, op);
    check_count(site, "output", out.count, in.count, out.type, "the input's count");
    if (in.data != out.data) {
        check_disjoint(site, in, out);
    }
    return {operation::all_reduce, in.data, out.data, in.count, {}, in.type, op, 0, 0, in.location};
}

/// Whether any two of `pieces` share memory (empty ones never do).
inline bool any_overlap(std::span<const buffer> pieces) {
    std::vector<std::pair<const std::byte*, const std::byte*>> spans;
    spans.reserve(pieces.size());
    for (const buffer& p : pieces) {
        if (p.count != 0) {
            const auto* b = static_cast<const std::byte*>(p.data);
            spans.emplace_back(b, b + p.count * size_of(p.type));
        }
    }
    std::sort(spans.begin(), spans.end());
    for (std::size_t i = 1; i < spans.size(); ++i) {
        if (spans[i].first < spans[i - 1].second) {
            return true;
        }
    }
    return false;
}

/// A coalesced all_reduce: `pieces`, in place, reduced as one buffer laid end to end.
inline collective_call all_reduce_coalesced_call(call_site site, std::span<const buffer> pieces,
                                                 reduce_op op) {
    if (pieces.empty()) {
        site.fail("all_reduce_coalesced needs at least one tensor");
    }
    std::size_t total = 0;
    for (std::size_t i = 0; i < pieces.size(); ++i) {
        const buffer& p = pieces[i];
        const std::string which = "tensor " + std::to_string(i);
        if (p.type != pieces[0].type) {
            site.fail(which + " is " + std::string(to_string(p.type)) + " and tensor 0 " +
                      std::string(to_string(pieces[0].type)) +
                      ": a coalesced all_reduce reduces one dtype");
        }
        if (!p.location.is_host()) {
            site.fail(which + " is on " + to_string(p.location) +
                      ": a coalesced all_reduce moves host memory");
        }
        check_buffer(site, which, p.data, p.count, p.type);
        if (p.count > max_elements(p.type) - total) {
            site.fail("the tensors together hold more elements than any object can hold (" +
                      std::to_string(max_elements(p.type)) + " " + std::string(to_string(p.type)) +
                      " elements at most)");
        }
        total += p.count;
    }
    check_reduction(site, pieces[0].type, op);
    // Overlapping tensors would be read after being written.
    if (any_overlap(pieces)) {
        site.fail("two of the tensors overlap in memory");
    }
    collective_call c{
        operation::all_reduce, pieces[0].data, pieces[0].data, total, {}, pieces[0].type, op, 0, 0,
        device::host()};
    c.pieces = pieces;
    return c;
}

inline collective_call reduce_scatter_call(call_site site, const_buffer in, buffer out,
                                           reduce_op op, bool in_place) {
    check_same_kind(site, in, out);
    check_reduction(site, in.type, op);
    if (!in_place) {
        check_count(site, "input", in.count,
                    checked_product(site, out.count, static_cast<std::size_t>(site.size), in.type,
                                    "the output's count times the number of ranks"),
                    in.type, "the output's count times the number of ranks");
        check_disjoint(site, in, out);
    }
    return {operation::reduce_scatter,
            in.data,
            out.data,
            out.count,
            {},
            in.type,
            op,
            0,
            0,
            in.location};
}

inline collective_call all_gather_call(call_site site, const_buffer in, buffer out, bool in_place) {
    check_same_kind(site, in, out);
    if (!in_place) {
        check_count(site, "output", out.count,
                    checked_product(site, in.count, static_cast<std::size_t>(site.size), out.type,
                                    "the input's count times the number of ranks"),
                    out.type, "the input's count times the number of ranks");
        check_disjoint(site, in, out);
    }
    return {operation::all_gather, in.data, out.data, in.count,   {}, in.type,
            reduce_op::sum,        0,       0,        in.location};
}

inline collective_call all_gatherv_call(call_site site, const_buffer in, buffer out,
                                        std::span<const std::size_t> counts) {
    check_same_kind(site, in, out);
    if (counts.size() != static_cast<std::size_t>(site.size)) {
        site.fail("counts has " + std::to_string(counts.size()) + " entries for " +
                  std::to_string(site.size) + " ranks");
    }
    check_count(site, "input", in.count, counts[static_cast<std::size_t>(site.rank)], in.type,
                "counts[" + std::to_string(site.rank) + "]");
    std::size_t total = 0;
    for (std::size_t i = 0; i < counts.size(); ++i) {
        check_size(site, "counts[" + std::to_string(i) + "] entry", counts[i], out.type);
        if (counts[i] > max_elements(out.type) - total) {
            site.fail("the sum of counts is more than any object can hold (" +
                      std::to_string(max_elements(out.type)) + " " +
                      std::string(to_string(out.type)) + " elements at most)");
        }
        total += counts[i];
    }
    check_count(site, "output", out.count, total, out.type, "the sum of counts");
    check_disjoint(site, in, out);
    return {operation::all_gatherv, in.data, out.data, in.count,   counts, in.type,
            reduce_op::sum,         0,       0,        in.location};
}

inline collective_call broadcast_call(call_site site, const_buffer in, buffer out, int root) {
    check_rank(site, "root", root);
    check_same_kind(site, in, out);
    check_count(site, "output", out.count, in.count, out.type, "the input's count");
    if (in.data != out.data) {
        check_disjoint(site, in, out);
    }
    return {operation::broadcast, in.data, out.data, in.count,   {}, in.type,
            reduce_op::sum,       root,    0,        in.location};
}

inline collective_call reduce_call(call_site site, const_buffer in, buffer out, int root,
                                   reduce_op op) {
    check_rank(site, "root", root);
    check_reduction(site, in.type, op);
    if (site.rank == root || out.data != nullptr) {
        check_same_kind(site, in, out);
        check_count(site, "output", out.count, in.count, out.type, "the input's count");
        if (in.data != out.data) {
            check_disjoint(site, in, out);
        }
    } else {
        check_buffer(site, "input", in.data, in.count, in.type);
    }
    return {operation::reduce, in.data, out.data, in.count, {}, in.type, op, root, 0, in.location};
}

inline collective_call all_to_all_call(call_site site, const_buffer in, buffer out) {
    check_same_kind(site, in, out);
    check_count(site, "output", out.count, in.count, out.type, "the input's count");
    check_divisible(site, in.count, in.type);
    check_disjoint(site, in, out);
    return {operation::all_to_all,
            in.data,
            out.data,
            in.count / static_cast<std::size_t>(site.size),
            {},
            in.type,
            reduce_op::sum,
            0,
            0,
            in.location};
}

/// Tags at or above this are reserved for the backends' own algorithms.
inline constexpr int max_user_tag = 30000;

inline collective_call point_to_point_call(call_site site, const void* send, void* recv,
                                           std::size_t count, dtype type, device location, int peer,
                                           int tag) {
    check_rank(site, "peer", peer);
    if (peer == site.rank) {
        site.fail("peer " + std::to_string(peer) + " is this rank; send to another rank");
    }
    if (tag < 0 || tag >= max_user_tag) {
        site.fail("tag " + std::to_string(tag) + " is outside [0, " + std::to_string(max_user_tag) +
                  ")");
    }
    check_buffer(site, site.op == operation::send ? "input" : "output",
                 send != nullptr ? send : recv, count, type);
    return {site.op, send, recv, count, {}, type, reduce_op::sum, peer, tag, location};
}

} // namespace unison::detail
