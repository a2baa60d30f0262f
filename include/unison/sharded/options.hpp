#pragma once

/// \file
/// The numbers of sharding, given at construction:
///
///     unison::fsdp<Comm> engine(comm, {.optimizer = {.lr = 3e-4}, .max_grad_norm = 1.0,
///                                      .prefetch = 2});

#include <cstdint>
#include <optional>

namespace unison {

/// The numbers of `sharded_parameters`.
struct shard_options {
    /// At most this many units gathered (or being gathered) at once; 0 means no
    /// limit. Prefetching stops at the limit; a gather past it is an error naming the
    /// units still gathered (like FSDP's limit_all_gathers and DeepSpeed's max live
    /// parameters).
    int max_live_units = 0;
    /// shard::hybrid: ranks r, r+1, ..., r+G-1 shard among themselves and the groups
    /// replicate; G must divide the number of ranks. Ignored by the other strategies.
    int shard_group_size = 0;
};

/// Checks done by every optimizer step.
struct step_options {
    /// Clip the global gradient norm to this (PyTorch's clip_grad_norm_); 0 = off.
    double max_grad_norm = 0.0;
    /// Skip the step on every rank when any gradient element is inf or nan. Costs
    /// one small all-reduce per step (shared with clipping and loss scaling).
    bool skip_nonfinite = true;
};

/// Dynamic loss scaling (for fp16 training), with PyTorch's GradScaler's rules.
struct dynamic_loss_scale {
    double initial_scale = 65536.0;
    double growth_factor = 2.0;
    double backoff_factor = 0.5;
    std::uint64_t growth_interval = 2000;
};

/// How the sharding engine sums the gradients of an accumulation window's
/// micro-batches where gradients are sharded (ZeRO-2/3, FSDP). Where the full
/// gradients are resident anyway (ZeRO-0/1) both modes accumulate them locally and
/// reduce once, on the window's last micro-batch.
enum class accumulation : std::uint8_t {
    /// Every micro-batch's backward reduce-scatters its gradients and adds them to
    /// the owned shard (DeepSpeed ZeRO-2/3's way): full gradients live only during
    /// their unit's backward, as without accumulation; one reduction per unit per
    /// micro-batch.
    in_shard,
    /// The full gradients of every unit are kept on each rank across the window and
    /// reduced once, in the last micro-batch's backward (FSDP2's "no gradient sync",
    /// `no_sync()`): one reduction per unit per step; the full gradients of the whole
    /// model stay resident during the window.
    unsharded,
};

/// The numbers of the sharding engine `fsdp` with optimizer `O`.
template <class O>
struct fsdp_options {
    /// The optimizer's hyperparameters (`{.lr = 3e-4, .weight_decay = 0.1}`); change
    /// them between steps through `fsdp::hyperparameters()`.
    O optimizer{};
    /// Clip the global gradient norm to this; 0 = off.
    double max_grad_norm = 0.0;
    /// Skip the step on every rank when any gradient element is inf or nan.
    bool skip_nonfinite = true;
    /// Dynamic loss scaling (fp16): multiply the loss by `fsdp::loss_scale()`.
    std::optional<dynamic_loss_scale> loss_scaling{};
    /// How many units ahead, in the order they ran in the first step, a unit's
    /// gather also starts gathering (forward order in forward, backward order in
    /// backward). 0 turns prefetching off.
    int prefetch = 1;
    /// As shard_options::max_live_units.
    int max_live_units = 0;
    /// As shard_options::shard_group_size (shard::hybrid).
    int shard_group_size = 0;
    /// Gradient accumulation: each optimizer step covers this many micro-batches,
    /// each with its forward and backward; call `fsdp::step()` after every
    /// micro-batch: it updates the parameters on the last of the window and only
    /// accumulates on the others (step_result::accumulated). Scale each
    /// micro-batch's loss as for one big batch (divide by the window's sample count).
    int accumulate_steps = 1;
    /// How the micro-batches' gradients are summed where gradients are sharded.
    accumulation accumulate = accumulation::in_shard;
    /// What the step leaves behind as the gradient of a parameter, as PyTorch's
    /// `zero_grad(set_to_none)`, which decides what a later step does with a
    /// parameter that got no gradient in its window (`fsdp::no_gradient`): true
    /// (PyTorch 2's default, FSDP2's) leaves none, so the optimizer skips it; false
    /// (LibTorch 1.x's in-place zeroing) leaves a zero gradient once the parameter
    /// has been updated, which the optimizer applies (weight decay and momentum move
    /// it). A parameter never updated is skipped either way.
    bool set_grads_to_none = true;
};

} // namespace unison
