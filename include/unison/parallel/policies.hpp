#pragma once

/// \file
/// The policy DDP and sharding share: mixed precision, one spelling for both.
///
///     unison::ddp<Comm, policy::mixed_precision<dtype::f32, dtype::bf16>>    // reduce in bf16
///     unison::fsdp<Comm, policy::mixed_precision<dtype::bf16>>               // bf16 params, f32 master

#include "unison/core/detail/policy.hpp"
#include "unison/core/dtype.hpp"

namespace unison::policy {

namespace kind {
/// The dtypes parameters compute in, gradients travel in, and the optimizer
/// updates in. Each engine has its own default: DDP reduces every gradient in its
/// own dtype; sharding keeps everything in f32.
struct precision {};
} // namespace kind

/// The master dtype `mixed_precision` defaults to: f32 for 16-bit parameters, the
/// parameter dtype otherwise.
constexpr dtype default_master(dtype param) noexcept {
    return param == dtype::f16 || param == dtype::bf16 ? dtype::f32 : param;
}

/// Parameters (and the gradients backward writes) are `Param`; gradients are
/// reduced in `Reduce`; the optimizer updates `Master` copies of what it owns
/// (sharding only, kept when `Master` differs from `Param`). DDP takes the first
/// two: its gradients must be `Param`, and buckets hold `Reduce` (bf16 or f16 halve
/// the traffic).
template <dtype Param, dtype Reduce = Param, dtype Master = default_master(Param)>
struct mixed_precision {
    static_assert(is_floating(Param) && is_floating(Reduce) && is_floating(Master),
                  "unison::policy::mixed_precision: dtypes are f64, f32, f16 or bf16");
    static_assert(Master != dtype::f16 && Master != dtype::bf16,
                  "unison::policy::mixed_precision: master weights are f32 or f64");
    using kind = kind::precision;
    static constexpr dtype param = Param;
    static constexpr dtype reduce = Reduce;
    static constexpr dtype master = Master;
};

} // namespace unison::policy
