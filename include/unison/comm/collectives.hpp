#pragma once

/// \file
/// The public collective functions. Each one is thin: it describes the user's
/// tensors as untyped buffers, validates them (detail/validate.hpp) and hands the
/// resulting `collective_call` to the backend's `execute` (blocking) or `submit`
/// (the `_async` forms, which return the backend's request type).
///
/// Blocking forms return when this rank's part is complete: its output is final
/// and its input may be reused.

#include "unison/comm/communicator.hpp"
#include "unison/comm/detail/validate.hpp"
#include "unison/core/log.hpp"

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace unison {

/// What a collective belongs to, for call matching (collective_call::tag and
/// ::step): every collective takes one as its last, optional argument. The thread
/// and MPI backends compare both on every call (NCCL with UNISON_DEBUG=1), so ranks
/// whose calls carry another tag or step are a mismatch_error on that field before
/// any data moves, instead of being paired by their order:
///
///     unison::all_reduce(comm, loss, unison::reduce_op::sum, {.step = i});
///
/// A stepped_communicator stamps the step of every call instead (and over this one).
struct call_stamp {
    int tag = 0;            ///< what the call belongs to (a layer, a bucket); 0: none
    std::uint64_t step = 0; ///< the step of the caller's loop; 0: none
};

namespace detail {
template <communicator C>
call_site site(const C& comm, operation op) {
    return {comm.rank(), comm.size(), op};
}

/// `buffer` for block `index` of `blocks` equal blocks of `whole`, for the in-place
/// forms of reduce_scatter and all_gather.
inline buffer block_of(const call_site& site, const buffer& whole) {
    check_size(site, "buffer", whole.count, whole.type);
    check_divisible(site, whole.count, whole.type);
    const std::size_t n = whole.count / static_cast<std::size_t>(site.size);
    auto* base = static_cast<std::byte*>(whole.data);
    return {base == nullptr ? nullptr
                            : base + static_cast<std::size_t>(site.rank) * n * size_of(whole.type),
            n, whole.type, whole.location};
}

/// What UNISON_LOG=debug writes for each call: the operation, its size, type and
/// reduction, its stamp, and whether it blocks.
inline std::string describe_call(const collective_call& call, int size, bool blocking) {
    std::string s = std::string(to_string(call.op)) + (blocking ? " " : " (async) ") +
                    std::to_string(call.count) + " x " + std::string(to_string(call.type));
    if (call.op == operation::all_reduce || call.op == operation::reduce_scatter ||
        call.op == operation::reduce) {
        s += ", " + std::string(to_string(call.reduction));
    }
    if (call.op == operation::broadcast || call.op == operation::reduce ||
        call.op == operation::send || call.op == operation::recv) {
        s += (call.op == operation::send || call.op == operation::recv ? ", peer " : ", root ") +
             std::to_string(call.root);
    }
    if (!call.pieces.empty()) {
        s += ", " + std::to_string(call.pieces.size()) + " tensors coalesced";
    }
    s += ", " + std::to_string(size) + " ranks, on " + to_string(call.location);
    if (call.tag != 0) {
        s += ", tag " + std::to_string(call.tag);
    }
    if (call.step != 0) {
        s += ", step " + std::to_string(call.step);
    }
    return s;
}

/// Hands calls to `comm` with `stamp`'s tag and step (the stamp parameter of every
/// collective below), each written to the log at debug level.
template <communicator C>
struct stamp_onto {
    C& comm;
    call_stamp stamp;
    stamp_onto(C& c, call_stamp s) : comm(c), stamp(s) {}
    void execute(collective_call call) {
        call = stamped(call);
        log(log_level::debug, comm.rank(), [&] { return describe_call(call, comm.size(), true); });
        comm.execute(call);
    }
    typename C::request_type submit(collective_call call) {
        call = stamped(call);
        log(log_level::debug, comm.rank(), [&] { return describe_call(call, comm.size(), false); });
        return comm.submit(call);
    }
    collective_call stamped(collective_call call) const noexcept {
        call.tag = stamp.tag;
        call.step = stamp.step;
        return call;
    }
};
} // namespace detail

// ---------------------------------------------------------------- all_reduce

/// out = in reduced with `op` over all ranks. `in` and `out` hold the same count.
template <communicator C, tensor In, writable_tensor Out>
void all_reduce(C& comm, const In& in, Out&& out, reduce_op op = reduce_op::sum,
                call_stamp stamp = {}) {
    detail::stamp_onto(comm, stamp)
        .execute(detail::all_reduce_call(detail::site(comm, operation::all_reduce),
                                         as_const_buffer(in), as_buffer(out), op));
}
/// In place: `inout` = `inout` reduced with `op` over all ranks.
template <communicator C, writable_tensor InOut>
void all_reduce(C& comm, InOut&& inout, reduce_op op = reduce_op::sum, call_stamp stamp = {}) {
    const buffer b = as_buffer(inout);
    detail::stamp_onto(comm, stamp)
        .execute(detail::all_reduce_call(detail::site(comm, operation::all_reduce), b, b, op));
}
/// Non-blocking all_reduce; buffers must stay alive and untouched until the request completes.
template <communicator C, tensor In, writable_tensor Out>
[[nodiscard]] typename C::request_type all_reduce_async(C& comm, const In& in, Out&& out,
                                                        reduce_op op = reduce_op::sum,
                                                        call_stamp stamp = {}) {
    return detail::stamp_onto(comm, stamp)
        .submit(detail::all_reduce_call(detail::site(comm, operation::all_reduce),
                                        as_const_buffer(in), as_buffer(out), op));
}
/// Non-blocking in-place all_reduce.
template <communicator C, writable_tensor InOut>
[[nodiscard]] typename C::request_type
all_reduce_async(C& comm, InOut&& inout, reduce_op op = reduce_op::sum, call_stamp stamp = {}) {
    const buffer b = as_buffer(inout);
    return detail::stamp_onto(comm, stamp)
        .submit(detail::all_reduce_call(detail::site(comm, operation::all_reduce), b, b, op));
}

/// In place: several host tensors of one dtype, each reduced with `op` over all
/// ranks, in one call that treats them as one buffer laid end to end (PyTorch's
/// allreduce_coalesced). Every rank passes tensors of the same sizes in the same
/// order (call matching compares the sizes). For communicators that reduce straight
/// between the tensors (`reduces_coalesced<C>`: the thread and MPI backends), which
/// saves the copies into and out of a staging buffer that reducing them as one would
/// cost elsewhere. `tensors` (the array, not only their memory) must outlive the call.
template <communicator C>
requires reduces_coalesced<C>
void all_reduce_coalesced(C& comm, std::span<const buffer> tensors, reduce_op op = reduce_op::sum,
                          call_stamp stamp = {}) {
    detail::stamp_onto(comm, stamp)
        .execute(detail::all_reduce_coalesced_call(detail::site(comm, operation::all_reduce),
                                                   tensors, op));
}
/// Non-blocking all_reduce_coalesced; `tensors` must outlive the request.
template <communicator C>
requires reduces_coalesced<C>
[[nodiscard]] typename C::request_type all_reduce_coalesced_async(C& comm,
                                                                  std::span<const buffer> tensors,
                                                                  reduce_op op = reduce_op::sum,
                                                                  call_stamp stamp = {}) {
    return detail::stamp_onto(comm, stamp)
        .submit(detail::all_reduce_coalesced_call(detail::site(comm, operation::all_reduce),
                                                  tensors, op));
}

// ------------------------------------------------------------ reduce_scatter

/// `in` (size * n elements) reduced over all ranks; this rank receives block
/// `rank()` of the result in `out` (n elements).
template <communicator C, tensor In, writable_tensor Out>
void reduce_scatter(C& comm, const In& in, Out&& out, reduce_op op = reduce_op::sum,
                    call_stamp stamp = {}) {
    detail::stamp_onto(comm, stamp)
        .execute(detail::reduce_scatter_call(detail::site(comm, operation::reduce_scatter),
                                             as_const_buffer(in), as_buffer(out), op, false));
}
/// In place: block `rank()` of `inout` receives the reduced block; other blocks are unspecified.
template <communicator C, writable_tensor InOut>
void reduce_scatter(C& comm, InOut&& inout, reduce_op op = reduce_op::sum, call_stamp stamp = {}) {
    const auto s = detail::site(comm, operation::reduce_scatter);
    const buffer whole = as_buffer(inout);
    detail::stamp_onto(comm, stamp)
        .execute(detail::reduce_scatter_call(s, whole, detail::block_of(s, whole), op, true));
}
/// Non-blocking reduce_scatter.
template <communicator C, tensor In, writable_tensor Out>
[[nodiscard]] typename C::request_type reduce_scatter_async(C& comm, const In& in, Out&& out,
                                                            reduce_op op = reduce_op::sum,
                                                            call_stamp stamp = {}) {
    return detail::stamp_onto(comm, stamp)
        .submit(detail::reduce_scatter_call(detail::site(comm, operation::reduce_scatter),
                                            as_const_buffer(in), as_buffer(out), op, false));
}
/// Non-blocking in-place reduce_scatter.
template <communicator C, writable_tensor InOut>
[[nodiscard]] typename C::request_type
reduce_scatter_async(C& comm, InOut&& inout, reduce_op op = reduce_op::sum, call_stamp stamp = {}) {
    const auto s = detail::site(comm, operation::reduce_scatter);
    const buffer whole = as_buffer(inout);
    return detail::stamp_onto(comm, stamp)
        .submit(detail::reduce_scatter_call(s, whole, detail::block_of(s, whole), op, true));
}

// ---------------------------------------------------------------- all_gather

/// `out` (size * n elements) = every rank's `in` (n elements), in rank order.
template <communicator C, tensor In, writable_tensor Out>
void all_gather(C& comm, const In& in, Out&& out, call_stamp stamp = {}) {
    detail::stamp_onto(comm, stamp)
        .execute(detail::all_gather_call(detail::site(comm, operation::all_gather),
                                         as_const_buffer(in), as_buffer(out), false));
}
/// In place: this rank's input is block `rank()` of `inout`.
template <communicator C, writable_tensor InOut>
void all_gather(C& comm, InOut&& inout, call_stamp stamp = {}) {
    const auto s = detail::site(comm, operation::all_gather);
    const buffer whole = as_buffer(inout);
    detail::stamp_onto(comm, stamp)
        .execute(detail::all_gather_call(s, detail::block_of(s, whole), whole, true));
}
/// Non-blocking all_gather.
template <communicator C, tensor In, writable_tensor Out>
[[nodiscard]] typename C::request_type all_gather_async(C& comm, const In& in, Out&& out,
                                                        call_stamp stamp = {}) {
    return detail::stamp_onto(comm, stamp)
        .submit(detail::all_gather_call(detail::site(comm, operation::all_gather),
                                        as_const_buffer(in), as_buffer(out), false));
}
/// Non-blocking in-place all_gather.
template <communicator C, writable_tensor InOut>
[[nodiscard]] typename C::request_type all_gather_async(C& comm, InOut&& inout,
                                                        call_stamp stamp = {}) {
    const auto s = detail::site(comm, operation::all_gather);
    const buffer whole = as_buffer(inout);
    return detail::stamp_onto(comm, stamp)
        .submit(detail::all_gather_call(s, detail::block_of(s, whole), whole, true));
}

/// All-gather with per-rank counts: rank r contributes `counts[r]` elements and
/// `out` receives them concatenated in rank order. Every rank passes the same counts.
template <communicator C, tensor In, writable_tensor Out>
void all_gatherv(C& comm, const In& in, Out&& out, std::span<const std::size_t> counts,
                 call_stamp stamp = {}) {
    detail::stamp_onto(comm, stamp)
        .execute(detail::all_gatherv_call(detail::site(comm, operation::all_gatherv),
                                          as_const_buffer(in), as_buffer(out), counts));
}
/// Non-blocking all_gatherv; `counts` must also outlive the request.
template <communicator C, tensor In, writable_tensor Out>
[[nodiscard]] typename C::request_type all_gatherv_async(C& comm, const In& in, Out&& out,
                                                         std::span<const std::size_t> counts,
                                                         call_stamp stamp = {}) {
    return detail::stamp_onto(comm, stamp)
        .submit(detail::all_gatherv_call(detail::site(comm, operation::all_gatherv),
                                         as_const_buffer(in), as_buffer(out), counts));
}

// ----------------------------------------------------------------- broadcast

/// In place: every rank's `inout` receives rank `root`'s.
template <communicator C, writable_tensor InOut>
void broadcast(C& comm, InOut&& inout, int root, call_stamp stamp = {}) {
    const buffer b = as_buffer(inout);
    detail::stamp_onto(comm, stamp)
        .execute(detail::broadcast_call(detail::site(comm, operation::broadcast), b, b, root));
}
/// `out` on every rank receives `in` of rank `root` (`in` is read on the root only).
template <communicator C, tensor In, writable_tensor Out>
void broadcast(C& comm, const In& in, Out&& out, int root, call_stamp stamp = {}) {
    detail::stamp_onto(comm, stamp)
        .execute(detail::broadcast_call(detail::site(comm, operation::broadcast),
                                        as_const_buffer(in), as_buffer(out), root));
}
/// Non-blocking in-place broadcast.
template <communicator C, writable_tensor InOut>
[[nodiscard]] typename C::request_type broadcast_async(C& comm, InOut&& inout, int root,
                                                       call_stamp stamp = {}) {
    const buffer b = as_buffer(inout);
    return detail::stamp_onto(comm, stamp)
        .submit(detail::broadcast_call(detail::site(comm, operation::broadcast), b, b, root));
}
/// Non-blocking broadcast.
template <communicator C, tensor In, writable_tensor Out>
[[nodiscard]] typename C::request_type broadcast_async(C& comm, const In& in, Out&& out, int root,
                                                       call_stamp stamp = {}) {
    return detail::stamp_onto(comm, stamp)
        .submit(detail::broadcast_call(detail::site(comm, operation::broadcast),
                                       as_const_buffer(in), as_buffer(out), root));
}

// -------------------------------------------------------------------- reduce

/// `out` on rank `root` = `in` reduced over all ranks; `out` is not written elsewhere
/// (non-root ranks may pass an empty `unison::buffer{}`).
template <communicator C, tensor In, writable_tensor Out>
void reduce(C& comm, const In& in, Out&& out, int root, reduce_op op = reduce_op::sum,
            call_stamp stamp = {}) {
    detail::stamp_onto(comm, stamp)
        .execute(detail::reduce_call(detail::site(comm, operation::reduce), as_const_buffer(in),
                                     as_buffer(out), root, op));
}
/// In place: `inout` on rank `root` receives the reduction; elsewhere it is unchanged.
template <communicator C, writable_tensor InOut>
void reduce(C& comm, InOut&& inout, int root, reduce_op op = reduce_op::sum,
            call_stamp stamp = {}) {
    const buffer b = as_buffer(inout);
    detail::stamp_onto(comm, stamp)
        .execute(detail::reduce_call(detail::site(comm, operation::reduce), b, b, root, op));
}
/// Non-blocking reduce.
template <communicator C, tensor In, writable_tensor Out>
[[nodiscard]] typename C::request_type reduce_async(C& comm, const In& in, Out&& out, int root,
                                                    reduce_op op = reduce_op::sum,
                                                    call_stamp stamp = {}) {
    return detail::stamp_onto(comm, stamp)
        .submit(detail::reduce_call(detail::site(comm, operation::reduce), as_const_buffer(in),
                                    as_buffer(out), root, op));
}
/// Non-blocking in-place reduce.
template <communicator C, writable_tensor InOut>
[[nodiscard]] typename C::request_type reduce_async(C& comm, InOut&& inout, int root,
                                                    reduce_op op = reduce_op::sum,
                                                    call_stamp stamp = {}) {
    const buffer b = as_buffer(inout);
    return detail::stamp_onto(comm, stamp)
        .submit(detail::reduce_call(detail::site(comm, operation::reduce), b, b, root, op));
}

// ---------------------------------------------------------------- all_to_all

/// Block q of `in` goes to rank q, where it lands as block `rank()` of `out`.
/// Both hold size * n elements.
template <communicator C, tensor In, writable_tensor Out>
void all_to_all(C& comm, const In& in, Out&& out, call_stamp stamp = {}) {
    detail::stamp_onto(comm, stamp)
        .execute(detail::all_to_all_call(detail::site(comm, operation::all_to_all),
                                         as_const_buffer(in), as_buffer(out)));
}
/// Non-blocking all_to_all.
template <communicator C, tensor In, writable_tensor Out>
[[nodiscard]] typename C::request_type all_to_all_async(C& comm, const In& in, Out&& out,
                                                        call_stamp stamp = {}) {
    return detail::stamp_onto(comm, stamp)
        .submit(detail::all_to_all_call(detail::site(comm, operation::all_to_all),
                                        as_const_buffer(in), as_buffer(out)));
}

// ------------------------------------------------------------- send and recv

/// Sends `in` to rank `peer`; matched by the `recv` there with this rank and `tag`.
template <communicator C, tensor In>
void send(C& comm, const In& in, int peer, int tag = 0) {
    const const_buffer b = as_const_buffer(in);
    comm.execute(detail::point_to_point_call(detail::site(comm, operation::send), b.data, nullptr,
                                             b.count, b.type, b.location, peer, tag));
}
/// Receives into `out` from rank `peer`; the sender's count and dtype must match.
template <communicator C, writable_tensor Out>
void recv(C& comm, Out&& out, int peer, int tag = 0) {
    const buffer b = as_buffer(out);
    comm.execute(detail::point_to_point_call(detail::site(comm, operation::recv), nullptr, b.data,
                                             b.count, b.type, b.location, peer, tag));
}
/// Non-blocking send.
template <communicator C, tensor In>
[[nodiscard]] typename C::request_type send_async(C& comm, const In& in, int peer, int tag = 0) {
    const const_buffer b = as_const_buffer(in);
    return comm.submit(detail::point_to_point_call(detail::site(comm, operation::send), b.data,
                                                   nullptr, b.count, b.type, b.location, peer,
                                                   tag));
}
/// Non-blocking recv.
template <communicator C, writable_tensor Out>
[[nodiscard]] typename C::request_type recv_async(C& comm, Out&& out, int peer, int tag = 0) {
    const buffer b = as_buffer(out);
    return comm.submit(detail::point_to_point_call(detail::site(comm, operation::recv), nullptr,
                                                   b.data, b.count, b.type, b.location, peer, tag));
}

// ------------------------------------------------------------------- barrier

/// Returns once every rank has entered the barrier.
template <communicator C>
void barrier(C& comm, call_stamp stamp = {}) {
    detail::stamp_onto(comm, stamp).execute(collective_call{});
}
/// Non-blocking barrier.
template <communicator C>
[[nodiscard]] typename C::request_type barrier_async(C& comm, call_stamp stamp = {}) {
    return detail::stamp_onto(comm, stamp).submit(collective_call{});
}

} // namespace unison
