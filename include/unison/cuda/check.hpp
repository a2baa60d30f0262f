#pragma once

/// \file
/// CUDA runtime return-code checking. Link `unison::cuda`.

#include "unison/core/error.hpp"

#include <cuda_runtime_api.h>

#include <string>

namespace unison::detail {

[[noreturn]] inline void throw_cuda_error(cudaError_t code, int rank, const std::string& operation,
                                          const char* call) {
    throw cuda_error(rank, operation,
                     std::string(call) + " failed: " + cudaGetErrorName(code) + ": " +
                         cudaGetErrorString(code),
                     static_cast<int>(code));
}

} // namespace unison::detail

/// Checks a CUDA runtime call; throws unison::cuda_error naming the rank, operation and call.
#define UNISON_CHECK_CUDA(call, rank, operation)                                                   \
    do {                                                                                           \
        const cudaError_t unison_cuda_rc_ = (call);                                                \
        if (unison_cuda_rc_ != cudaSuccess) {                                                      \
            ::unison::detail::throw_cuda_error(unison_cuda_rc_, (rank), (operation), #call);       \
        }                                                                                          \
    } while (0)
