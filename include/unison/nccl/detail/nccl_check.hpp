#pragma once

/// \file
/// NCCL return-code checking and dtype/op mapping.

#include "unison/core/dtype.hpp"
#include "unison/core/error.hpp"
#include "unison/core/reduce_op.hpp"

#include <nccl.h>

#include <string>

namespace unison::detail {

[[noreturn]] inline void throw_nccl_error(ncclResult_t code, int rank, const std::string& operation,
                                          const char* call) {
    throw nccl_error(rank, operation, std::string(call) + " failed: " + ncclGetErrorString(code),
                     static_cast<int>(code));
}

inline ncclDataType_t nccl_datatype(dtype t) noexcept {
    switch (t) {
    case dtype::f64:
        return ncclFloat64;
    case dtype::f32:
        return ncclFloat32;
    case dtype::f16:
        return ncclFloat16;
    case dtype::bf16:
        return ncclBfloat16;
    case dtype::i64:
        return ncclInt64;
    case dtype::i32:
        return ncclInt32;
    case dtype::i8:
        return ncclInt8;
    case dtype::u8:
        return ncclUint8;
    case dtype::u32:
        return ncclUint32;
    case dtype::u64:
        return ncclUint64;
    }
    return ncclUint8;
}

inline ncclRedOp_t nccl_op(reduce_op op) noexcept {
    switch (op) {
    case reduce_op::sum:
        return ncclSum;
    case reduce_op::prod:
        return ncclProd;
    case reduce_op::min:
        return ncclMin;
    case reduce_op::max:
        return ncclMax;
    case reduce_op::avg:
        return ncclAvg;
    }
    return ncclSum;
}

/// The NCCL operation for `op` on a communicator of `ranks` ranks. Over one rank an
/// average is the input itself, so it goes to NCCL as a sum, which NCCL carries out
/// as a copy: NCCL's own one-rank average (2.27 to 2.29.6, NVIDIA/nccl#1950) leaves
/// the last `count % blocks` elements of an out-of-place result unwritten.
inline ncclRedOp_t nccl_op(reduce_op op, int ranks) noexcept {
    return op == reduce_op::avg && ranks == 1 ? ncclSum : nccl_op(op);
}

} // namespace unison::detail

/// Checks an NCCL call; throws unison::nccl_error naming the rank, operation and call.
#define UNISON_CHECK_NCCL(call, rank, operation)                                                   \
    do {                                                                                           \
        const ncclResult_t unison_nccl_rc_ = (call);                                               \
        if (unison_nccl_rc_ != ncclSuccess) {                                                      \
            ::unison::detail::throw_nccl_error(unison_nccl_rc_, (rank), (operation), #call);       \
        }                                                                                          \
    } while (0)
