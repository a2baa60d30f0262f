#pragma once

/// \file
/// `partitioned_optimizer`: an optimizer whose state exists only for this rank's
/// partition of a `sharded_parameters` (ZeRO's optimizer-state partitioning), with
/// the checks a large run needs, all from one small all-reduce per step:
///   - global gradient-norm clipping: the norm of the whole model, from every
///     rank's shard (sum of squares and the count of non-finite elements);
///   - an inf/nan in any rank's gradients makes every rank skip the step, leaving
///     parameters, master weights, optimizer state and the step counter unchanged
///     bit for bit;
///   - dynamic loss scaling for fp16: multiply the loss by loss_scale(); the step
///     unscales, halves the scale on overflow and doubles it after
///     `growth_interval` clean steps (PyTorch's GradScaler rules);
///   - the ranks issued the same unit collectives since the last step (the
///     parameters' fingerprint): otherwise every rank throws mismatch_error naming
///     a rank that differs, before anything is written;
///   - a parameter that had no gradient (`skip_next_update`, the same on every
///     rank) is left as it is, with its state and its own step count, as PyTorch's
///     optimizers skip a parameter whose gradient is None; each parameter's bias
///     corrections count its own steps.
///
/// The strategy and communicator are those of the sharded_parameters it is built
/// on: the whole unit is updated when the optimizer state is replicated, the owned
/// shard otherwise, and strategies that publish then all-gather the new parameters.
/// The fsdp engine (sharded/fsdp.hpp) owns one of these.

#include "unison/comm/collectives.hpp"
#include "unison/core/detail/convert.hpp"
#include "unison/core/error.hpp"
#include "unison/core/timeline.hpp"
#include "unison/kernels/host.hpp"
#include "unison/optim/optimizer.hpp"
#include "unison/parallel/detail/control.hpp"
#include "unison/parallel/detail/device_ops.hpp"
#include "unison/parallel/detail/placement.hpp"
#include "unison/sharded/options.hpp"
#include "unison/sharded/sharded_parameters.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace unison {

/// What one step did.
struct step_result {
    /// The call ended a micro-batch that only accumulates (fsdp_options::
    /// accumulate_steps): no step was taken, the other fields are not set.
    bool accumulated = false;
    bool skipped = false;          ///< a non-finite gradient was found; nothing changed
    double grad_norm = 0.0;        ///< global L2 norm of the unscaled gradients (inf if skipped)
    double clip_coefficient = 1.0; ///< factor applied to the gradients (<= 1)
    double loss_scale = 1.0;       ///< the scale the gradients carried in this step
};

namespace detail {

/// The per-step statistics all-reduced in one call: the gradients' sum of squares
/// and non-finite count, then a 48-bit fingerprint of the collectives each rank
/// issued, as three 16-bit chunks with their squares (summed over N ranks, they are
/// exact in double for N < 2^20; all ranks agree exactly when N * sum(c^2) ==
/// sum(c)^2 for every chunk).
struct step_statistics {
    static constexpr std::size_t chunks = 3;
    static constexpr std::size_t size = 2 + 2 * chunks;
    std::array<double, size> values{};

    void set_fingerprint(std::uint64_t f) noexcept {
        for (std::size_t k = 0; k < chunks; ++k) {
            const auto c = static_cast<double>((f >> (16 * k)) & 0xffffu);
            values[2 + 2 * k] = c;
            values[3 + 2 * k] = c * c;
        }
    }
    /// After the all-reduce over `ranks` ranks: whether every rank's fingerprint was equal.
    bool fingerprints_agree(int ranks) const noexcept {
        for (std::size_t k = 0; k < chunks; ++k) {
            const auto sum = static_cast<std::uint64_t>(values[2 + 2 * k]);
            const auto squares = static_cast<std::uint64_t>(values[3 + 2 * k]);
            const auto n = static_cast<std::uint64_t>(ranks);
            if (sum % n != 0 || squares != n * (sum / n) * (sum / n)) {
                return false;
            }
        }
        return true;
    }
};

} // namespace detail

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

    /// Allocates the state for this rank's partitions (zero, as PyTorch starts it),
    /// where the parameters live. Keeps a reference to `params`, which must outlive
    /// the optimizer. With device parameters, install the fused step with
    /// `unison::cuda::use_device(optimizer, dev, stream)` before the first step.
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
                detail::flat_buffer b(n * size_of(state_dtype), place());
                place().zero(b.data(), dtype::u8, b.size());
                state_.push_back(std::move(b));
            }
        }
    }

    /// For `unison::cuda::use_device` (parallel/device.cuh): the fused step kernel of
    /// `O`, for parameters that live on a device.
    template <class Installer>
    void install_device(Installer& installer) {
        device_step_ = installer.template optimizer_step<O, compute_type>();
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
    /// Steps that updated parameter `id`: steps() less those it sat out without a
    /// gradient (its own `step` in PyTorch's per-parameter state).
    std::uint64_t steps_of(std::size_t id) const noexcept {
        return param_steps_.empty() ? step_ : param_steps_[id];
    }

    /// The next step leaves parameter `id`, its optimizer state and its step count
    /// as they are: it had no gradient (PyTorch skips a parameter whose gradient is
    /// None). Every rank must skip the same parameters. A step skipped as a whole
    /// (inf/nan) forgets these.
    void skip_next_update(std::size_t id) {
        if (id >= params_->parameter_count()) {
            params_->fail("partitioned_optimizer skip_next_update",
                          "no parameter " + std::to_string(id));
        }
        skip_.resize(params_->parameter_count(), 0);
        skip_[id] = 1;
    }

    /// Completes the gradient reductions, checks and clips, and updates this rank's
    /// partition; then (strategies that publish) all-gathers the new parameters.
    /// Collective.
    step_result step() {
        const timeline::scope trace(params_->communicator().rank(), "optimizer step");
        params_->wait_gradients();
        if (place().on_device() && !device_step_) {
            params_->fail(
                "partitioned_optimizer step",
                "the parameters are on " + to_string(place().where()) +
                    ": install the fused step with unison::cuda::use_device(optimizer, " +
                    std::to_string(place().where().index) +
                    ", stream) from a CUDA translation unit (unison/parallel/device.cuh)");
        }
        step_result result;
        result.loss_scale = scale_;
        struct forget_skips { // whatever happens to this step
            std::vector<std::uint8_t>& skip;
            ~forget_skips() { skip.clear(); }
        } forget{skip_};

        detail::step_statistics stats;
        last_fingerprint_ = params_->issued_fingerprint();
        stats.set_fingerprint(last_fingerprint_);
        params_->reset_fingerprint();
        if (place().on_device()) {
            device_statistics(stats);
        } else {
            for (std::size_t k = 0; k < params_->unit_count(); ++k) {
                gradient_stats(k, stats.values[0], stats.values[1]);
            }
            all_reduce(params_->step_communicator(), std::span<double>(stats.values));
        }
        if (!stats.fingerprints_agree(params_->shard_size())) {
            name_diverged_rank();
        }
        const double sum_sq = stats.values[0];
        const double nonfinite = stats.values[1];
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

        if (!skip_.empty() && param_steps_.empty()) {
            param_steps_.assign(params_->parameter_count(), step_);
        }
        ++step_;
        for (std::size_t id = 0; id < param_steps_.size(); ++id) {
            param_steps_[id] += skip_.empty() || skip_[id] == 0 ? 1 : 0;
        }
        for (std::size_t k = 0; k < params_->unit_count(); ++k) {
            update_unit(k, static_cast<compute_type>(grad_scale));
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

    /// Restores the counters a checkpoint recorded: `fewer` lists the parameters
    /// (id, steps) that took fewer steps than `steps`.
    void restore_counters(std::uint64_t steps, double loss_scale, std::uint64_t good_steps,
                          std::span<const std::pair<std::size_t, std::uint64_t>> fewer = {}) {
        step_ = steps;
        param_steps_.clear();
        if (!fewer.empty()) {
            param_steps_.assign(params_->parameter_count(), steps);
            for (const auto& [id, n] : fewer) {
                param_steps_.at(id) = n;
            }
        }
        if (scaling_) {
            scale_ = loss_scale;
            good_steps_ = good_steps;
        }
    }

    Params& parameters() noexcept { return *params_; }

private:
    const detail::placement& place() const noexcept { return params_->placement(); }

    /// After the fingerprints disagreed (on every rank alike): all-gathers them and
    /// throws, naming a rank whose collectives differ from this one's.
    [[noreturn]] void name_diverged_rank() {
        auto& comm = params_->step_communicator();
        const std::vector<std::int64_t> mine{static_cast<std::int64_t>(last_fingerprint_)};
        std::vector<std::int64_t> all(static_cast<std::size_t>(comm.size()));
        detail::control_all_gather(comm, place(), std::span<const std::int64_t>(mine),
                                   std::span<std::int64_t>(all));
        int other = -1;
        for (int r = 0; r < comm.size() && other < 0; ++r) {
            if (all[static_cast<std::size_t>(r)] != mine[0]) {
                other = r;
            }
        }
        throw mismatch_error(comm.rank(), "partitioned_optimizer step",
                             "rank " + std::to_string(other) +
                                 " gathered or reduced other units than this rank since the "
                                 "last step (other units, or in another order), so the ranks "
                                 "mixed the data of different units; the step was not taken. "
                                 "Every rank must run the same units in the same order",
                             other, "units");
    }

    /// Device state: one multi-tensor norm over every owned shard into a device
    /// buffer, the fingerprint next to it, their all-reduce on the device, and the
    /// values to the host.
    void device_statistics(detail::step_statistics& stats) {
        const detail::placement& p = place();
        if (!norm_plan_) {
            // The owned gradient shards never move (allocated once by
            // sharded_parameters), so their table is uploaded once, not every step.
            std::vector<kernels::read_piece> pieces;
            for (std::size_t k = 0; k < params_->unit_count(); ++k) {
                auto part = params_->partition_of(k);
                const element_range owned = params_->owned_range(k);
                pieces.push_back(
                    {static_cast<const std::byte*>(part.grad) +
                         (owned.begin - part.range.begin) * size_of(Params::param_dtype),
                     owned.size()});
            }
            norm_plan_ = p.ops->plan(std::span<const kernels::read_piece>(pieces));
            stats_ = detail::flat_buffer(sizeof stats.values, p);
        }
        p.ops->multi_norm(*norm_plan_, Params::param_dtype, stats_.data());
        p.copy_from_host(stats_.data() + 2 * sizeof(double), stats.values.data() + 2,
                         sizeof stats.values - 2 * sizeof(double));
        p.order_before(params_->shard_comm(), "partitioned_optimizer step");
        all_reduce(params_->step_communicator(),
                   buffer{stats_.data(), stats.values.size(), dtype::f64, p.where()});
        p.copy_to_host(stats.values.data(), stats_.data(), sizeof stats.values);
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
        const kernels::norm_stats s =
            kernels::host::multi_norm(std::span(&piece, 1), Params::param_dtype);
        sum_sq += s.sum_sq;
        nonfinite += s.nonfinite;
    }

    /// The optimizer's constants for a parameter at its step `steps`, with or
    /// without weight decay.
    auto constants(std::uint64_t steps, [[maybe_unused]] bool decay) const {
        if constexpr (has_weight_decay) {
            if (!decay) {
                O plain = hyper_;
                plain.weight_decay = 0.0;
                return plain.template prepare<compute_type>(steps);
            }
        }
        return hyper_.template prepare<compute_type>(steps);
    }

    /// Updates this rank's partition of unit `k`. While every parameter has taken
    /// every step, the partition runs as one piece, or as pieces split where weight
    /// decay changes; otherwise each parameter runs with its own step's constants,
    /// and those without a gradient this step not at all (padding never needs an
    /// update: its gradient and value stay zero).
    void update_unit(std::size_t k, compute_type grad_scale) {
        auto part = params_->partition_of(k);
        const auto [first, last] = params_->parameters_of(k);
        const auto overlap = [&](std::size_t id) {
            return std::pair{std::max(params_->offset_of(id), part.range.begin),
                             std::min(params_->offset_of(id) + params_->numel(id), part.range.end)};
        };
        if (!param_steps_.empty()) {
            for (std::size_t id = first; id < last; ++id) {
                const auto [b, e] = overlap(id);
                if (b < e && (skip_.empty() || skip_[id] == 0)) {
                    const bool decay = no_decay_.empty() || !no_decay_[id];
                    update_elements(k, part, b, e, constants(param_steps_[id], decay), grad_scale);
                }
            }
            return;
        }
        // Pieces of the partition with one set of constants: parameters without
        // weight decay use their own; everything else (padding included) c.
        const auto c = constants(step_, true);
        std::size_t at = part.range.begin;
        for (std::size_t id = first; id < last && !no_decay_.empty(); ++id) {
            if (!no_decay_[id]) {
                continue;
            }
            const auto [b, e] = overlap(id);
            if (b >= e) {
                continue;
            }
            update_elements(k, part, at, b, c, grad_scale);
            update_elements(k, part, b, e, constants(step_, false), grad_scale);
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
        std::array<A*, O::slots> state_at{};
        for (std::size_t s = 0; s < O::slots; ++s) {
            state_at[s] = reinterpret_cast<A*>(state(k, s)) + off;
        }
        A* master = part.master != nullptr ? static_cast<A*>(part.master) + off : nullptr;
        const std::size_t p = size_of(Params::param_dtype);
        void* param = static_cast<std::byte*>(part.param) + off * p;
        const void* grad = static_cast<const std::byte*>(part.grad) + off * p;
        if (place().on_device()) {
            device_step_->step(c, Params::param_dtype, param, grad, master, state_at.data(), n,
                               grad_scale);
            return;
        }
        detail::visit_floating(Params::param_dtype, [&](auto tag) {
            using P = decltype(tag);
            kernels::shard_ref<P, P, A, O::slots> shard;
            shard.param = static_cast<P*>(param);
            shard.grad = static_cast<const P*>(grad);
            shard.master = master;
            for (std::size_t s = 0; s < O::slots; ++s) {
                shard.state[s] = state_at[s];
            }
            shard.count = n;
            kernels::host::optimizer_step<O>(c, shard, grad_scale);
        });
    }

    Params* params_;
    O hyper_;
    step_options options_;
    std::optional<dynamic_loss_scale> scaling_;
    double scale_;
    std::uint64_t good_steps_ = 0;
    std::uint64_t step_ = 0;
    std::uint64_t last_fingerprint_ = 0; // of the collectives before the last step
    std::vector<detail::flat_buffer> state_;
    std::unique_ptr<detail::device_optimizer_step<O, compute_type>> device_step_;
    std::unique_ptr<detail::device_plan> norm_plan_; // device state: the owned shards
    detail::flat_buffer stats_;                      // device state: the step's statistics
    std::vector<bool> no_decay_; // by parameter id; empty while every parameter decays
    /// By parameter id: steps each took; empty while every parameter took every step.
    std::vector<std::uint64_t> param_steps_;
    std::vector<std::uint8_t> skip_; // by parameter id, for the next step; empty: none
};

} // namespace unison
