#pragma once

/// \file
/// MPI return-code checking, giving up requests after a timeout, dtype mapping and
/// the user-defined reductions for the 16-bit float types, which MPI does not know.

#include "unison/core/detail/host_reduce.hpp"
#include "unison/core/dtype.hpp"
#include "unison/core/error.hpp"
#include "unison/core/reduce_op.hpp"

#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1 // the C API is all we use; the C++ bindings warn under -Wextra
#endif
#include <mpi.h>

#include <chrono>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace unison::detail {

[[noreturn]] inline void throw_mpi_error(int code, int rank, const std::string& operation,
                                         const char* call) {
    char text[MPI_MAX_ERROR_STRING];
    int length = 0;
    if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) {
        length = 0;
    }
    const std::string_view name(call); // "MPI_Isend" or, from UNISON_CHECK_MPI, the call
    throw mpi_error(rank, operation,
                    std::string(name.substr(0, name.find('('))) +
                        " failed: " + std::string(text, static_cast<std::size_t>(length)),
                    code);
}

/// Gives requests up after a timeout (their call is never driven again): cancels
/// `receives`, waiting at most `budget` in all for the cancellations (a receive
/// already matched completes only when its sender goes on, and is then left), and
/// frees `sends`, which complete or not on their own (MPI only reads their buffers).
/// True when no receive is left in MPI's hands.
inline bool abandon_requests(std::span<MPI_Request> receives, std::span<MPI_Request> sends,
                             std::chrono::steady_clock::duration budget) noexcept {
    const auto until = std::chrono::steady_clock::now() + budget;
    for (MPI_Request& r : receives) {
        if (r != MPI_REQUEST_NULL) {
            MPI_Cancel(&r);
        }
    }
    bool released = true;
    for (MPI_Request& r : receives) {
        int flag = 0;
        while (r != MPI_REQUEST_NULL && flag == 0 && std::chrono::steady_clock::now() < until) {
            MPI_Test(&r, &flag, MPI_STATUS_IGNORE);
        }
        released = released && r == MPI_REQUEST_NULL;
    }
    for (MPI_Request& r : sends) {
        if (r != MPI_REQUEST_NULL) {
            MPI_Request_free(&r);
        }
    }
    return released;
}

/// The requests of one step of point-to-point messages posted together, its
/// receives first, with the peer of each: what a schedule that waits for a whole
/// step before the next (rank_ordered.hpp, node_all_gather.hpp) keeps.
struct mpi_step_requests {
    std::vector<MPI_Request> requests;
    std::vector<int> peers;   ///< the rank each request receives from or sends to
    std::size_t receives = 0; ///< the receives lead `requests`

    void clear() noexcept {
        requests.clear();
        peers.clear();
        receives = 0;
    }
    /// A request for a message to or from `peer` (valid until the next add).
    MPI_Request* add(int peer) {
        requests.push_back(MPI_REQUEST_NULL);
        peers.push_back(peer);
        return &requests.back();
    }
    /// Marks the requests added so far as the step's receives.
    void receives_posted() noexcept { receives = requests.size(); }
    /// True when every request is complete (none posted: true); errors name `label`.
    bool complete(int rank, const std::string& label) {
        if (requests.empty()) {
            return true;
        }
        int flag = 0;
        const int rc = MPI_Testall(static_cast<int>(requests.size()), requests.data(), &flag,
                                   MPI_STATUSES_IGNORE);
        if (rc != MPI_SUCCESS) {
            throw_mpi_error(rc, rank, label, "MPI_Testall");
        }
        return flag != 0;
    }
    /// True when none of them is in MPI's hands.
    bool idle() const noexcept {
        for (MPI_Request r : requests) {
            if (r != MPI_REQUEST_NULL) {
                return false;
            }
        }
        return true;
    }
    /// The peer of the first receive not complete; -1 when none is awaited.
    int waiting_for() const noexcept {
        for (std::size_t k = 0; k < receives && k < requests.size(); ++k) {
            if (requests[k] != MPI_REQUEST_NULL) {
                return peers[k];
            }
        }
        return -1;
    }
    /// Gives the step up (abandon_requests): true when no receive is left in MPI's
    /// hands.
    bool cancel(std::chrono::steady_clock::duration budget) noexcept {
        const std::size_t r = receives < requests.size() ? receives : requests.size();
        return abandon_requests(std::span(requests).first(r), std::span(requests).subspan(r),
                                budget);
    }
};

/// What an error raised while MPI still holds a call's buffers adds to its message:
/// the caller's input alone (`input_only`: a send of the current step reads it) or
/// every buffer of the call (its requests were posted). Sends cannot be cancelled,
/// so the caller must keep them allocated or end the job.
inline std::string mpi_held_buffers_note(bool input_only) {
    return input_only ? "; MPI may still read this call's input (its send was posted, and a "
                        "send cannot be cancelled): keep it allocated, or end the job (MPI_Abort)"
                      : "; MPI may still use this call's buffers (its requests were posted, and "
                        "a send cannot be cancelled): keep them allocated, or end the job "
                        "(MPI_Abort)";
}

} // namespace unison::detail

/// Checks an MPI call's return code; throws unison::mpi_error naming the rank, the
/// operation and the call. Communicators set MPI_ERRORS_RETURN so codes come back.
#define UNISON_CHECK_MPI(call, rank, operation)                                                    \
    do {                                                                                           \
        const int unison_mpi_rc_ = (call);                                                         \
        if (unison_mpi_rc_ != MPI_SUCCESS) {                                                       \
            ::unison::detail::throw_mpi_error(unison_mpi_rc_, (rank), (operation), #call);         \
        }                                                                                          \
    } while (0)

namespace unison::detail {

/// The MPI datatype that moves `t`; the 16-bit floats move as MPI_UINT16_T and reduce
/// through the user-defined ops below.
inline MPI_Datatype mpi_datatype(dtype t) noexcept {
    switch (t) {
    case dtype::f64:
        return MPI_DOUBLE;
    case dtype::f32:
        return MPI_FLOAT;
    case dtype::f16:
    case dtype::bf16:
        return MPI_UINT16_T;
    case dtype::i64:
        return MPI_INT64_T;
    case dtype::i32:
        return MPI_INT32_T;
    case dtype::i8:
        return MPI_INT8_T;
    case dtype::u8:
        return MPI_UINT8_T;
    case dtype::u32:
        return MPI_UINT32_T;
    case dtype::u64:
        return MPI_UINT64_T;
    }
    return MPI_BYTE;
}

/// Whether MPI's predefined op reduces `t` with `op` as unison does. Not for the
/// 16-bit floats, which MPI does not know; nor for min and max over the unsigned
/// 32- and 64-bit integers: MPICH 4.0 (Debian 12's) compares MPI_UINT32_T and
/// MPI_UINT64_T as signed, so that min(3e9, 5) is 3e9 (sum and prod wrap alike
/// either way and stay MPI's); nor for sum and prod over the 8-bit integers: Open
/// MPI 4.1's AVX op component (Debian 12's 4.1.4, on a CPU with AVX) saturates
/// them, so that MPI_SUM of 200 and 100 in MPI_UINT8_T is 255 where unison's own
/// schedules wrap to 44 (and 127 for 100 + 100 in MPI_INT8_T, not -56).
inline bool mpi_native_reduction(dtype t, reduce_op op) noexcept {
    if (t == dtype::f16 || t == dtype::bf16) {
        return false;
    }
    const bool unsigned_wide = t == dtype::u32 || t == dtype::u64;
    const bool narrow = t == dtype::i8 || t == dtype::u8;
    const bool ordering = op == reduce_op::min || op == reduce_op::max;
    return !(unsigned_wide && ordering) && !(narrow && !ordering);
}

template <dtype T, reduce_op Op>
void mpi_user_reduce(void* in, void* inout, int* len, MPI_Datatype*) {
    const void* inputs[2] = {inout, in};
    void* outputs[1] = {inout};
    host_reduce(T, Op, inputs, 2, outputs, 1, static_cast<std::size_t>(*len));
}

/// MPI_Op handles for what MPI's predefined ops do not reduce as unison does
/// (mpi_native_reduction): sum/prod/min/max over f16 and bf16, min/max over u32
/// and u64, sum/prod over i8 and u8; created with the communicator and freed with
/// it.
class mpi_user_ops {
public:
    mpi_user_ops() {
        for (MPI_Op& op : ops_) {
            op = MPI_OP_NULL;
        }
        create<dtype::f16>(0);
        create<dtype::bf16>(4);
        create<dtype::u32>(8);
        create<dtype::u64>(12);
        create<dtype::i8>(16);
        create<dtype::u8>(20);
    }
    mpi_user_ops(const mpi_user_ops&) = delete;
    mpi_user_ops& operator=(const mpi_user_ops&) = delete;
    ~mpi_user_ops() {
        int finalized = 0;
        MPI_Finalized(&finalized);
        if (!finalized) {
            for (MPI_Op& op : ops_) {
                if (op != MPI_OP_NULL) {
                    MPI_Op_free(&op);
                }
            }
        }
    }

    /// The op for `t` and `op` (avg reduces as sum; the caller divides).
    MPI_Op get(dtype t, reduce_op op) const noexcept {
        const int base = t == dtype::f16    ? 0
                         : t == dtype::bf16 ? 4
                         : t == dtype::u32  ? 8
                         : t == dtype::u64  ? 12
                         : t == dtype::i8   ? 16
                                            : 20;
        switch (op) {
        case reduce_op::sum:
        case reduce_op::avg:
            return ops_[base + 0];
        case reduce_op::prod:
            return ops_[base + 1];
        case reduce_op::min:
            return ops_[base + 2];
        case reduce_op::max:
            return ops_[base + 3];
        }
        return MPI_OP_NULL;
    }

private:
    template <dtype T>
    void create(int base) {
        MPI_Op_create(&mpi_user_reduce<T, reduce_op::sum>, 1, &ops_[base + 0]);
        MPI_Op_create(&mpi_user_reduce<T, reduce_op::prod>, 1, &ops_[base + 1]);
        MPI_Op_create(&mpi_user_reduce<T, reduce_op::min>, 1, &ops_[base + 2]);
        MPI_Op_create(&mpi_user_reduce<T, reduce_op::max>, 1, &ops_[base + 3]);
    }

    MPI_Op ops_[24];
};

/// The predefined MPI_Op for `op` (avg reduces as sum; the caller divides).
inline MPI_Op mpi_native_op(reduce_op op) noexcept {
    switch (op) {
    case reduce_op::sum:
    case reduce_op::avg:
        return MPI_SUM;
    case reduce_op::prod:
        return MPI_PROD;
    case reduce_op::min:
        return MPI_MIN;
    case reduce_op::max:
        return MPI_MAX;
    }
    return MPI_OP_NULL;
}

} // namespace unison::detail
