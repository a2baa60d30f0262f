#pragma once

/// \file
/// The policies a `bucketed_reducer` (and `ddp`) is assembled from. Each is a small
/// empty type; give them in any order, at most one per category:
///
/// | category        | policies                                           | default |
/// |-----------------|----------------------------------------------------|------------------------|
/// | bucket size     | `bucket_size<Bytes>`                               | 25 MiB | | first bucket
/// | `first_bucket_size<Bytes>`                         | 1 MiB                  | | averaging |
/// `divide_after`, `predivide<F>`, `sum_only`         | `divide_after`         | | reduce dtype |
/// `reduce_dtype<D>`, `reduce_in_gradient_dtype`      | the gradients' dtype   | | unused params |
/// `unused_as_zero`, `unused_is_error`                | `unused_as_zero`       | | accumulation |
/// `accumulate_steps<K>`                              | 1 (sync every step)    | | comm hook |
/// `comm_hook<H>`                                     | `all_reduce_hook`      | | gradient memory
/// | `gradients_in_buckets`, `gradients_separate`       | `gradients_separate`   |
///
/// Two policies of one category (`divide_after` with `sum_only`, two bucket sizes)
/// and types that are not DDP policies are compile errors that say so.

#include "unison/core/detail/policy.hpp"
#include "unison/core/dtype.hpp"

#include <cstddef>

namespace unison::policy {

/// Categories, one per row of the table above.
namespace category {
struct bucket_size {};
struct first_bucket_size {};
struct averaging {};
struct reduce_dtype {};
struct unused_parameters {};
struct accumulation {};
struct comm_hook {};
struct gradient_memory {};
} // namespace category

inline constexpr std::size_t MiB = std::size_t{1} << 20;

/// Buckets close once they hold at least `Bytes` (in the reduce dtype).
template <std::size_t Bytes>
struct bucket_size {
    static_assert(Bytes > 0, "unison::policy::bucket_size: the bucket size must be positive");
    using category = category::bucket_size;
    static constexpr std::size_t bytes = Bytes;
};

/// The first bucket (the last gradients of backward) closes at `Bytes`, so the
/// first all-reduce starts early.
template <std::size_t Bytes>
struct first_bucket_size {
    static_assert(Bytes > 0,
                  "unison::policy::first_bucket_size: the first bucket size must be positive");
    using category = category::first_bucket_size;
    static constexpr std::size_t bytes = Bytes;
};

/// Sum over ranks, then divide by the number of ranks (as PyTorch DDP does).
struct divide_after {
    using category = category::averaging;
    static constexpr double factor = 1.0;
    static constexpr bool average = true;
};

/// Divide by `Factor` before the reduction and by (ranks / Factor) after it: keeps
/// sums of many ranks in range in low precision (DeepSpeed's and PyTorch's
/// gradient_predivide_factor).
template <double Factor>
struct predivide {
    static_assert(Factor > 0.0, "unison::policy::predivide: the factor must be positive");
    using category = category::averaging;
    static constexpr double factor = Factor;
    static constexpr bool average = true;
};

/// Plain sum over ranks, no division (for losses already normalized globally,
/// see `normalize_loss`).
struct sum_only {
    using category = category::averaging;
    static constexpr double factor = 1.0;
    static constexpr bool average = false;
};

/// Reduce in `D` (bf16 or f16 to halve the traffic; f32 or f64 also allowed): gradients
/// are cast into the bucket and the result cast back into the gradients.
template <dtype D>
struct reduce_dtype {
    static_assert(is_floating(D), "unison::policy::reduce_dtype: gradients reduce in a "
                                  "floating-point dtype (f64, f32, f16 or bf16)");
    using category = category::reduce_dtype;
    static constexpr bool own_dtype = false;
    static constexpr dtype type = D;
};

/// Reduce in the gradients' own dtype (the default).
struct reduce_in_gradient_dtype {
    using category = category::reduce_dtype;
    static constexpr bool own_dtype = true;
    static constexpr dtype type = dtype::f32; // unused
};

/// A gradient never marked ready in a step counts as zero; its bucket is still
/// reduced, so ranks that did use the parameter get the right average.
struct unused_as_zero {
    using category = category::unused_parameters;
    static constexpr bool error = false;
};

/// A gradient never marked ready in a step is an error naming the parameter. The
/// step's reductions are completed first (with zero for the missing gradients) so
/// no rank is left waiting, then `finish()` throws.
struct unused_is_error {
    using category = category::unused_parameters;
    static constexpr bool error = true;
};

/// Accumulate gradients locally for `K` micro-steps and synchronize on the K-th.
template <int K>
struct accumulate_steps {
    static_assert(K >= 1, "unison::policy::accumulate_steps: K must be at least 1");
    using category = category::accumulation;
    static constexpr int steps = K;
};

/// Replace the bucket's reduction with `Hook` (see `all_reduce_hook` for the contract).
template <class Hook>
struct comm_hook {
    using category = category::comm_hook;
    using type = Hook;
};

/// Gradients live inside the bucket memory (`bucketed_reducer::gradient(i)` hands out
/// the views to give the framework): nothing is copied in or out. Needs the reduce
/// dtype to be the gradients' dtype.
struct gradients_in_buckets {
    using category = category::gradient_memory;
    static constexpr bool in_buckets = true;
};

/// Gradients stay in the framework's tensors and are copied into buckets (the default).
struct gradients_separate {
    using category = category::gradient_memory;
    static constexpr bool in_buckets = false;
};

} // namespace unison::policy
