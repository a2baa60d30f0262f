#pragma once

/// \file
/// The numbers of a `bucketed_reducer` (and `ddp`), given at construction:
///
///     unison::ddp<Comm> dp(comm, {.bucket_bytes = 50 << 20, .accumulate_steps = 4});

#include "unison/core/error.hpp"

#include <cstddef>
#include <string>
#include <string_view>

namespace unison {

/// How a bucketed_reducer moves a bucket's values, chosen at start() from its
/// policies, its communicator and where the gradients are
/// (`bucketed_reducer::data_path()`; ddp/detail/paths/ has one file per path).
enum class reducer_path {
    packed,        ///< host gradients copied into bucket memory and back
    coalesced,     ///< host gradients reduced where they are, no bucket memory
    in_buckets,    ///< policy::gradients_in_buckets: the bucket is the gradient
    device_packed, ///< device gradients packed into buckets by kernels and back
};

constexpr std::string_view to_string(reducer_path p) noexcept {
    switch (p) {
    case reducer_path::packed:
        return "packed";
    case reducer_path::coalesced:
        return "coalesced";
    case reducer_path::in_buckets:
        return "in_buckets";
    case reducer_path::device_packed:
        return "device_packed";
    }
    return "?";
}

struct ddp_options {
    /// Buckets close once they hold at least this many bytes (in the reduce dtype).
    std::size_t bucket_bytes = std::size_t{25} << 20;
    /// The first bucket (the last gradients of backward) closes at this many bytes,
    /// so the first reduction starts early.
    std::size_t first_bucket_bytes = std::size_t{1} << 20;
    /// Gradients accumulate locally for this many micro-batches and are synchronized
    /// on the last: call finish() after every micro-batch's backward; it returns true
    /// on the synchronizing one.
    int accumulate_steps = 1;
    /// Divide the sum over ranks by the number of contributing ranks (PyTorch DDP);
    /// false: a plain sum, for losses already normalized globally (normalize_loss).
    bool average = true;
    /// Divide by this before the reduction and by (ranks / factor) after it: keeps
    /// sums of many ranks in range in low precision (DeepSpeed's and PyTorch's
    /// gradient_predivide_factor).
    double predivide_factor = 1.0;

    /// Throws argument_error (naming `rank` and `operation`) for a value out of range.
    void validate(int rank, const std::string& operation) const {
        auto fail = [&](const std::string& what) {
            throw argument_error(rank, operation, "ddp_options: " + what);
        };
        if (bucket_bytes == 0 || first_bucket_bytes == 0) {
            fail("bucket sizes must be positive (bucket_bytes " + std::to_string(bucket_bytes) +
                 ", first_bucket_bytes " + std::to_string(first_bucket_bytes) + ")");
        }
        if (accumulate_steps < 1) {
            fail("accumulate_steps is " + std::to_string(accumulate_steps) +
                 "; it must be at least 1");
        }
        if (!(predivide_factor > 0.0) || predivide_factor > 1e300) {
            fail("predivide_factor is " + std::to_string(predivide_factor) +
                 "; it must be positive and finite");
        }
    }
};

} // namespace unison
