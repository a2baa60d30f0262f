#pragma once

/// \file
/// The description of one communication call, as the dispatch layer hands it to a
/// backend. Public functions in collectives.hpp build it from user tensors and
/// validate it; a backend only executes it.

#include "unison/core/dtype.hpp"
#include "unison/core/reduce_op.hpp"
#include "unison/core/tensor.hpp"

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace unison {

/// The communication operations a backend executes.
enum class operation : std::uint8_t {
    all_reduce,
    reduce_scatter,
    all_gather,
    all_gatherv,
    broadcast,
    reduce,
    all_to_all,
    send,
    recv,
    barrier,
};

/// The operation's name as it appears in errors ("all_reduce", ...).
constexpr std::string_view to_string(operation op) noexcept {
    switch (op) {
    case operation::all_reduce:
        return "all_reduce";
    case operation::reduce_scatter:
        return "reduce_scatter";
    case operation::all_gather:
        return "all_gather";
    case operation::all_gatherv:
        return "all_gatherv";
    case operation::broadcast:
        return "broadcast";
    case operation::reduce:
        return "reduce";
    case operation::all_to_all:
        return "all_to_all";
    case operation::send:
        return "send";
    case operation::recv:
        return "recv";
    case operation::barrier:
        return "barrier";
    }
    return "?";
}

/// One call, fully described and already validated. Counts are in elements and
/// follow NCCL's conventions:
///   all_reduce, broadcast, reduce: `count` elements in `send` and `recv`;
///   reduce_scatter: `recv` holds `count`, `send` holds `count * size`;
///   all_gather: `send` holds `count`, `recv` holds `count * size`;
///   all_gatherv: rank r sends `counts[r]`; `recv` holds their sum, rank r's block
///                first at offset counts[0] + ... + counts[r-1]; `count` = counts[rank];
///   all_to_all: `count` elements to each peer; `send` and `recv` hold `count * size`;
///   send / recv: `count` elements to / from rank `root`, matched by `tag`;
///   barrier: no data.
///   all_reduce, coalesced (all_reduce_coalesced): `pieces` non-empty, reduced in
///                place as one buffer laid end to end; `count` is their total and
///                `send` = `recv` = the first piece's data.
/// In-place calls pass aliasing pointers: all_reduce, broadcast and reduce with
/// `send == recv`; reduce_scatter with `recv == send + rank * count`; all_gather
/// with `send == recv + rank * count`. On non-root ranks of `reduce`, `recv` may be
/// null; on non-root ranks of `broadcast`, `send` is ignored.
struct collective_call {
    operation op = operation::barrier;
    const void* send = nullptr;
    void* recv = nullptr;
    std::size_t count = 0;
    std::span<const std::size_t> counts{};
    dtype type = dtype::u8;
    reduce_op reduction = reduce_op::sum;
    int root = 0; ///< root of broadcast/reduce, peer of send/recv
    /// send/recv: the tag that matches them. Collectives: what the call belongs to
    /// (the training layer passes the unit or bucket), which every rank must pass
    /// alike; call matching compares it, so ranks reducing different units of the
    /// same size are an error rather than mixed data. 0 when unused.
    int tag = 0;
    device location = device::host();
    /// Collectives: the step of the caller's loop the call belongs to (set by
    /// stepped_communicator), which every rank must pass alike; call matching
    /// compares it, so a rank that skipped a call is caught at its next one. 0 when
    /// unused; send/recv ignore it.
    std::uint64_t step = 0;
    /// Coalesced all_reduce: the tensors, all of `type` and in host memory; must
    /// outlive the call as its data does. Empty for every other call.
    std::span<const buffer> pieces{};
};

namespace detail {
/// "all_reduce #12", the operation label used in every error.
inline std::string operation_label(operation op, std::uint64_t sequence) {
    return std::string(to_string(op)) + " #" + std::to_string(sequence);
}
} // namespace detail

} // namespace unison
