#pragma once

/// \file
/// The policies a `bucketed_reducer` (and `ddp`) is assembled from: types for what
/// changes its code. Give them in any order after the communicator, at most one of
/// each kind; numbers (bucket sizes, accumulation steps, averaging) are options
/// (ddp/options.hpp).
///
///     kind               policies                                   default
///     precision          mixed_precision<Param, Reduce>             each gradient's own dtype
///     comm_hook          comm_hook<H>                               all_reduce_hook
///     gradient_memory    gradients_separate, gradients_in_buckets   gradients_separate
///     unused_parameters  unused_as_zero, unused_is_error            unused_as_zero
///
/// A type that is not one of these, or two of one kind, is a compile error naming it.

#include "unison/core/detail/policy.hpp"
#include "unison/ddp/hooks.hpp"
#include "unison/parallel/policies.hpp"

namespace unison::policy {

template <class Hook>
struct comm_hook;
struct gradients_separate;
struct unused_as_zero;

namespace kind {
/// What a bucket does once its gradients are ready (ddp/hooks.hpp).
struct comm_hook {
    using default_policy = policy::comm_hook<all_reduce_hook>;
};
/// Where gradients live: the framework's tensors, or inside the buckets.
struct gradient_memory {
    using default_policy = gradients_separate;
};
/// What a gradient never marked ready in a step means.
struct unused_parameters {
    using default_policy = unused_as_zero;
};
} // namespace kind

/// Replace the bucket's reduction with `Hook` (see ddp/hooks.hpp for the contract;
/// the reducer checks it with the `bucket_hook` concept).
template <class Hook>
struct comm_hook {
    using kind = kind::comm_hook;
    using type = Hook;
};

/// Gradients stay in the framework's tensors and are copied into buckets (the default).
struct gradients_separate {
    using kind = kind::gradient_memory;
    static constexpr bool in_buckets = false;
};

/// Gradients live inside the bucket memory (`bucketed_reducer::gradient(i)` hands out
/// the views to give the framework): nothing is copied in or out. Needs the reduce
/// dtype to be the gradients' dtype.
struct gradients_in_buckets {
    using kind = kind::gradient_memory;
    static constexpr bool in_buckets = true;
};

/// A gradient never marked ready in a step counts as zero; its bucket is still
/// reduced, so ranks that did use the parameter get the right average.
struct unused_as_zero {
    using kind = kind::unused_parameters;
    static constexpr bool error = false;
};

/// A gradient never marked ready in a step is an error naming the parameter. The
/// step's reductions are completed first (with zero for the missing gradients) so
/// no rank is left waiting, then `finish()` throws.
struct unused_is_error {
    using kind = kind::unused_parameters;
    static constexpr bool error = true;
};

} // namespace unison::policy
