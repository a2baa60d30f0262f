#pragma once

/// \file
/// What must agree across ranks for a collective to be well formed, and the
/// comparison that names the first field that does not. The thread backend compares
/// published calls directly, MPI exchanges them in every collective's handshake
/// (mpi/detail/handshake.hpp), and with `comm_options::check_matching` MPI and NCCL
/// all-gather them first.

#include "unison/comm/collective.hpp"
#include "unison/core/error.hpp"

#include <cstdint>
#include <string>

namespace unison::detail {

/// The fields of a call that every rank must agree on, in a fixed-size form.
struct call_signature {
    std::uint64_t op = 0;
    std::uint64_t type = 0;
    std::uint64_t reduction = 0;
    std::uint64_t root = 0;
    std::uint64_t count = 0;
    /// all_gatherv: FNV-1a of the counts list; coalesced all_reduce: of the pieces'
    /// counts
    std::uint64_t counts_hash = 0;
    std::uint64_t tag = 0;  ///< what a collective belongs to (collective_call::tag)
    std::uint64_t step = 0; ///< the caller's step (collective_call::step)
};

inline call_signature signature_of(const collective_call& c) {
    call_signature s;
    s.op = static_cast<std::uint64_t>(c.op);
    s.type = c.op == operation::barrier ? 0 : static_cast<std::uint64_t>(c.type);
    const bool reduces = c.op == operation::all_reduce || c.op == operation::reduce ||
                         c.op == operation::reduce_scatter;
    s.reduction = reduces ? static_cast<std::uint64_t>(c.reduction) : 0;
    const bool rooted = c.op == operation::broadcast || c.op == operation::reduce;
    s.root = rooted ? static_cast<std::uint64_t>(c.root) : 0;
    // all_gatherv ranks legitimately send different counts; their lists must agree.
    s.count = c.op == operation::all_gatherv || c.op == operation::barrier ? 0 : c.count;
    const bool p2p = c.op == operation::send || c.op == operation::recv;
    s.tag = p2p ? 0 : static_cast<std::uint64_t>(static_cast<std::uint32_t>(c.tag));
    s.step = p2p ? 0 : c.step;
    if (c.op == operation::all_gatherv) {
        std::uint64_t h = 1469598103934665603ull;
        for (std::size_t v : c.counts) {
            h = (h ^ static_cast<std::uint64_t>(v)) * 1099511628211ull;
        }
        s.counts_hash = h ^ c.counts.size();
    } else if (c.op == operation::all_reduce && !c.pieces.empty()) {
        // Two ranks whose pieces have one total but other sizes would mix elements.
        std::uint64_t h = 1469598103934665603ull;
        for (const buffer& p : c.pieces) {
            h = (h ^ static_cast<std::uint64_t>(p.count)) * 1099511628211ull;
        }
        s.counts_hash = h ^ c.pieces.size();
    }
    return s;
}

/// Throws `mismatch_error` (raised by `rank`, naming `other`) when `theirs`, the
/// signature of rank `other`, differs from `ref`, the signature of rank `ref_rank`.
inline void check_signature(int rank, const std::string& label, int ref_rank,
                            const call_signature& ref, int other, const call_signature& theirs) {
    const char* field = nullptr;
    std::string a, b;
    std::int64_t ref_value = 0, their_value = 0; // where the field is a number
    if (theirs.step != ref.step) {
        ref_value = static_cast<std::int64_t>(ref.step);
        their_value = static_cast<std::int64_t>(theirs.step);
        // First: a rank a step ahead or behind makes every other field suspect.
        field = "step";
        a = "step " + std::to_string(ref.step);
        b = "step " + std::to_string(theirs.step) +
            " (a rank skipped or repeated a call; ranks are in different steps)";
    } else if (theirs.op != ref.op) {
        field = "operation";
        a = to_string(static_cast<operation>(ref.op));
        b = to_string(static_cast<operation>(theirs.op));
    } else if (theirs.type != ref.type) {
        field = "dtype";
        a = to_string(static_cast<dtype>(ref.type));
        b = to_string(static_cast<dtype>(theirs.type));
    } else if (theirs.count != ref.count) {
        field = "count";
        a = std::to_string(ref.count);
        b = std::to_string(theirs.count);
    } else if (theirs.reduction != ref.reduction) {
        field = "op";
        a = to_string(static_cast<reduce_op>(ref.reduction));
        b = to_string(static_cast<reduce_op>(theirs.reduction));
    } else if (theirs.root != ref.root) {
        field = "root";
        a = std::to_string(ref.root);
        b = std::to_string(theirs.root);
    } else if (theirs.counts_hash != ref.counts_hash) {
        field = "counts";
        const bool pieces = static_cast<operation>(ref.op) == operation::all_reduce;
        a = pieces ? "one list of piece sizes" : "one counts list";
        b = "a different one";
    } else if (theirs.tag != ref.tag) {
        field = "tag";
        ref_value = static_cast<std::int64_t>(ref.tag);
        their_value = static_cast<std::int64_t>(theirs.tag);
        a = "tag " + std::to_string(ref.tag);
        b = "tag " + std::to_string(theirs.tag) +
            " (what the call belongs to, a unit, bucket or the caller's tag, differs across "
            "ranks)";
    }
    if (field != nullptr) {
        throw mismatch_error(rank, label,
                             std::string(field) + " differs: rank " + std::to_string(ref_rank) +
                                 " called with " + a + " but rank " + std::to_string(other) +
                                 " with " + b,
                             other, field, ref_rank, ref_value, their_value);
    }
}

} // namespace unison::detail
