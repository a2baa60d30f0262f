#pragma once

/// \file
/// `partitioned_optimizer`: an optimizer whose state exists only for this rank's
/// partition of a `sharded_parameters` (ZeRO's optimizer-state partitioning), with
/// the gradient checks a large run needs:
///   - global gradient-norm clipping: the norm of the whole model, from every
///     rank's shard, in one all-reduce of two numbers (sum of squares and the count
///     of non-finite elements);
///   - an inf/nan in any rank's gradients makes every rank skip the step, leaving
///     parameters, master weights, optimizer state and the step counter unchanged
///     bit for bit;
///   - dynamic loss scaling for fp16: multiply the loss by loss_scale(); the step
///     unscales, halves the scale on overflow and doubles it after
///     `growth_interval` clean steps (PyTorch's GradScaler rules).
///
/// The stage and communicator are those of the sharded_parameters it is built on:
/// stage 0 updates everything on every rank; stages 1-3 update the owned shard,
/// and stages 1-2 then all-gather the new parameters.

#include "unison/comm/collectives.hpp"
#include "unison/comm/detail/placement.hpp"
#include "unison/core/detail/aligned_bytes.hpp"
#include "unison/core/detail/convert.hpp"
#include "unison/core/error.hpp"
#include "unison/kernels/host.hpp"
#include "unison/sharded/optimizers.hpp"
#include "unison/sharded/sharded_parameters.hpp"

#if defined(__CUDACC__)
#include "unison/kernels/norm.cuh"
#include "unison/kernels/optimizer.cuh"
#endif

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace unison {

/// Checks done by every step.
struct step_options {
    /// Clip the global gradient norm to this (PyTorch's clip_grad_norm_); 0 = off.
    double max_grad_norm = 0.0;
    /// Skip the step on every rank when any gradient element is inf or nan. Costs
    /// one 2-element all-reduce per step (shared with clipping and loss scaling).
    bool skip_nonfinite = true;
};

/// Dynamic loss scaling (for fp16 training).
struct dynamic_loss_scale {
    double initial_scale = 65536.0;
    double growth_factor = 2.0;
    double backoff_factor = 0.5;
    std::uint64_t growth_interval = 2000;
};

/// What one step did.
struct step_result {
    bool skipped = false;          ///< a non-finite gradient was found; nothing changed
    double grad_norm = 0.0;        ///< global L2 norm of the unscaled gradients (inf if skipped)
    double clip_coefficient = 1.0; ///< factor applied to the gradients (<= 1)
    double loss_scale = 1.0;       ///< the scale the gradients carried in this step
};

inline namespace UNISON_TU_ABI {

/// Optimizer `O` (unison::optim::sgd / adam / adamw or a user's own with the same
/// shape) over the partitions of `Params` (a sharded_parameters).
template <class Params, optim::optimizer O>
class partitioned_optimizer {
public:
    using params_type = Params;
    using optimizer_type = O;
    static constexpr dtype state_dtype = Params::master_dtype;
    using compute_type = std::conditional_t<state_dtype == dtype::f64, double, float>;
    static constexpr bool has_weight_decay = requires(O o) { o.weight_decay = 0.0; };

    /// Allocates the state for this rank's partitions (zero, as PyTorch starts it).
    /// Keeps a reference to `params`, which must outlive the optimizer.
    partitioned_optimizer(Params& params, O hyper, step_options options = {},
                          std::optional<dynamic_loss_scale> scaling = std::nullopt)
        : params_(&params), hyper_(std::move(hyper)), options_(options), scaling_(scaling),
          scale_(scaling ? scaling->initial_scale : 1.0) {
        if (scaling && !(scaling->initial_scale > 0.0 && std::isfinite(scaling->initial_scale))) {
            params.fail("partitioned_optimizer", "the initial loss scale must be positive");
        }
        for (std::size_t k = 0; k < params.unit_count(); ++k) {
            const std::size_t n = params.update_range(k).size();
            for (std::size_t s = 0; s < O::slots; ++s) {
                detail::flat_bytes b(n * size_of(state_dtype), params.location());
                detail::place_zero(place(), b.data(), dtype::u8, b.size());
                state_.push_back(std::move(b));
            }
        }
    }

    /// The hyperparameters; change them between steps (learning-rate schedules).
    O& hyperparameters() noexcept { return hyper_; }
    const O& hyperparameters() const noexcept { return hyper_; }
    step_options& options() noexcept { return options_; }

    /// Multiply the loss by this before backward (1 without loss scaling).
    double loss_scale() const noexcept { return scale_; }
    /// Clean steps since the last overflow (the loss scaler's growth tracker).
    std::uint64_t good_steps() const noexcept { return good_steps_; }
    /// Steps taken (skipped steps do not count), PyTorch's `step` state.
    std::uint64_t steps() const noexcept { return step_; }

    /// Completes the gradient reductions, checks and clips, and updates this rank's
    /// partition; then (stages 1-2) all-gathers the new parameters. Collective.
    step_result step() {
        params_->wait_gradients();
        step_result result;
        result.loss_scale = scale_;

        const bool need_stats = options_.skip_nonfinite || options_.max_grad_norm > 0.0;
        double sum_sq = 0.0, nonfinite = 0.0;
        if (need_stats) {
            std::vector<double> stats{0.0, 0.0};
            if (place().on_device()) {
                device_gradient_stats(stats);
            } else {
                for (std::size_t k = 0; k < params_->unit_count(); ++k) {
                    gradient_stats(k, stats[0], stats[1]);
                }
                all_reduce(params_->shard_comm(), stats);
            }
            sum_sq = stats[0];
            nonfinite = stats[1];
        }
        if (nonfinite > 0.0 && options_.skip_nonfinite) {
            result.skipped = true;
            result.grad_norm = std::numeric_limits<double>::infinity();
            if (scaling_) {
                scale_ *= scaling_->backoff_factor;
                good_steps_ = 0;
            }
            return result;
        }
        result.grad_norm = std::sqrt(sum_sq) / scale_;
        if (options_.max_grad_norm > 0.0) {
            const double clip = options_.max_grad_norm / (result.grad_norm + 1e-6);
            if (clip < 1.0) {
                result.clip_coefficient = clip;
            }
        }
        const double grad_scale = result.clip_coefficient / scale_;

        ++step_;
        const auto constants = hyper_.template prepare<compute_type>(step_);
        auto constants_no_decay = constants;
        if constexpr (has_weight_decay) {
            O plain = hyper_;
            plain.weight_decay = 0.0;
            constants_no_decay = plain.template prepare<compute_type>(step_);
        }
        for (std::size_t k = 0; k < params_->unit_count(); ++k) {
            update_unit(k, constants, constants_no_decay, static_cast<compute_type>(grad_scale));
        }
        params_->publish_parameters();

        if (scaling_ && ++good_steps_ >= scaling_->growth_interval) {
            scale_ *= scaling_->growth_factor;
            good_steps_ = 0;
        }
        return result;
    }

    /// Whether parameter `id` gets weight decay (default: every parameter does).
    /// Transformer recipes usually exclude biases, norms and embeddings, as PyTorch
    /// users do with a second parameter group with weight_decay 0.
    void set_weight_decay(std::size_t id, bool decay) {
        static_assert(has_weight_decay, "this optimizer has no weight_decay");
        if (id >= params_->parameter_count()) {
            params_->fail("partitioned_optimizer set_weight_decay",
                          "no parameter " + std::to_string(id));
        }
        no_decay_.resize(params_->parameter_count(), false);
        no_decay_[id] = !decay;
    }

    /// The state slot `slot` (O::slot_names[slot]) of unit `k`'s update_range, in
    /// state_dtype (the master dtype). For checkpoints and inspection.
    std::byte* state(std::size_t k, std::size_t slot) noexcept {
        return state_[k * O::slots + slot].data();
    }

    /// Bytes of optimizer state on this rank.
    std::size_t state_bytes() const noexcept {
        std::size_t n = 0;
        for (const auto& b : state_) {
            n += b.size();
        }
        return n;
    }

    /// Restores the counters a checkpoint recorded.
    void restore_counters(std::uint64_t steps, double loss_scale, std::uint64_t good_steps) {
        step_ = steps;
        if (scaling_) {
            scale_ = loss_scale;
            good_steps_ = good_steps;
        }
    }

    Params& parameters() noexcept { return *params_; }

private:
    detail::placement place() const noexcept { return params_->placement_of(); }

    /// Device state: one multi-tensor norm over every owned shard into a device
    /// norm_stats, its all-reduce on the device, and the two doubles to the host.
    void device_gradient_stats(std::vector<double>& stats) {
#if defined(__CUDACC__)
        const detail::placement p = place();
        if (!norm_plan_) {
            // The owned gradient shards never move (allocated once by
            // sharded_parameters), so their table is uploaded once, not every step.
            cuda::device_guard guard(p.where.index);
            std::vector<kernels::read_piece> pieces;
            for (std::size_t k = 0; k < params_->unit_count(); ++k) {
                auto part = params_->partition_of(k);
                const element_range owned = params_->owned_range(k);
                pieces.push_back(
                    {static_cast<const std::byte*>(part.grad) +
                         (owned.begin - part.range.begin) * size_of(Params::param_dtype),
                     owned.size()});
            }
            norm_plan_.emplace(std::span<const kernels::read_piece>(pieces));
        }
        if (!stats_) {
            stats_ = detail::flat_bytes(sizeof(kernels::norm_stats), p.where);
        }
        auto* dev = reinterpret_cast<kernels::norm_stats*>(stats_.data());
        kernels::multi_norm(*norm_plan_, Params::param_dtype, dev,
                            static_cast<cudaStream_t>(p.stream));
        fence_.order(p, params_->shard_comm(), "partitioned_optimizer step");
        all_reduce(params_->shard_comm(), buffer{dev, 2, dtype::f64, p.where});
        detail::place_to_host(p, stats.data(), dev, 2 * sizeof(double));
#else
        (void)stats;
        detail::placement::require_device_code(params_->communicator().rank(),
                                               "partitioned_optimizer step", place().where);
#endif
    }

    /// Sum of squares and non-finite count over this rank's owned shard of unit `k`
    /// (each element counted on exactly one rank of the shard group).
    void gradient_stats(std::size_t k, double& sum_sq, double& nonfinite) {
        auto part = params_->partition_of(k);
        const element_range owned = params_->owned_range(k);
        const std::size_t skip = owned.begin - part.range.begin;
        const kernels::read_piece piece{static_cast<const std::byte*>(part.grad) +
                                            skip * size_of(Params::param_dtype),
                                        owned.size()};
        const kernels::norm_stats stats =
            kernels::host::multi_norm(std::span(&piece, 1), Params::param_dtype);
        sum_sq += stats.sum_sq;
        nonfinite += stats.nonfinite;
    }

    template <class Constants>
    void update_unit(std::size_t k, const Constants& c, const Constants& c_no_decay,
                     compute_type grad_scale) {
        auto part = params_->partition_of(k);
        // Pieces of the partition with one set of constants: parameters without
        // weight decay use c_no_decay; everything else (padding included) c.
        std::size_t at = part.range.begin;
        const auto [first, last] = params_->parameters_of(k);
        for (std::size_t id = first; id < last && !no_decay_.empty(); ++id) {
            if (!no_decay_[id]) {
                continue;
            }
            const std::size_t b = std::max(params_->offset_of(id), part.range.begin);
            const std::size_t e =
                std::min(params_->offset_of(id) + params_->numel(id), part.range.end);
            if (b >= e) {
                continue;
            }
            update_elements(k, part, at, b, c, grad_scale);
            update_elements(k, part, b, e, c_no_decay, grad_scale);
            at = e;
        }
        update_elements(k, part, at, part.range.end, c, grad_scale);
    }

    /// The update of unit elements [b, e) (within part.range).
    template <class Partition, class Constants>
    void update_elements(std::size_t k, const Partition& part, std::size_t b, std::size_t e,
                         const Constants& c, compute_type grad_scale) {
        using A = compute_type;
        if (b >= e) {
            return;
        }
        const std::size_t off = b - part.range.begin, n = e - b;
        detail::visit_floating(Params::param_dtype, [&](auto tag) {
            using P = decltype(tag);
            kernels::shard_ref<P, P, A, O::slots> shard;
            shard.param = static_cast<P*>(part.param) + off;
            shard.grad = static_cast<const P*>(part.grad) + off;
            shard.master = part.master != nullptr ? static_cast<A*>(part.master) + off : nullptr;
            for (std::size_t s = 0; s < O::slots; ++s) {
                shard.state[s] = reinterpret_cast<A*>(state(k, s)) + off;
            }
            shard.count = n;
            if (place().on_device()) {
#if defined(__CUDACC__)
                kernels::optimizer_step<O>(c, shard, grad_scale, nullptr,
                                           static_cast<cudaStream_t>(place().stream));
#else
                detail::placement::require_device_code(params_->communicator().rank(),
                                                       "partitioned_optimizer step", place().where);
#endif
            } else {
                kernels::host::optimizer_step<O>(c, shard, grad_scale);
            }
        });
    }

    Params* params_;
    O hyper_;
    step_options options_;
    std::optional<dynamic_loss_scale> scaling_;
    double scale_;
    std::uint64_t good_steps_ = 0;
    std::uint64_t step_ = 0;
    std::vector<detail::flat_bytes> state_;
    detail::flat_bytes stats_; // device state: the norm_stats of a step
#if defined(__CUDACC__)
    std::optional<kernels::multi_tensor_plan> norm_plan_; // device state: the owned shards
#endif
    detail::stream_fence fence_;
    std::vector<bool> no_decay_; // by parameter id; empty while every parameter decays
};

} // namespace UNISON_TU_ABI

} // namespace unison
