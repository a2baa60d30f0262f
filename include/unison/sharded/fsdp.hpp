#pragma once

/// \file
/// `fsdp`: the sharding engine, the counterpart of `unison::ddp` for FSDP and ZeRO.
/// It owns the parameters, gradients and optimizer state, sharded as the strategy
/// says; the framework tells it where each unit's forward and backward run, and
/// `step()` does the rest.
///
///     unison::fsdp<Comm, policy::shard::full, policy::mixed_precision<dtype::bf16>> engine(
///         comm, {.optimizer = {.lr = 3e-4}, .max_grad_norm = 1.0});
///     for (auto& layer : model.layers()) {               // a unit: what is gathered together
///         layer.unit = engine.add_unit({{layer.w.name, layer.w.init, bind(layer.w)},
///                                       {layer.b.name, layer.b.init, bind(layer.b)}});
///     }
///     engine.start();                                    // every rank: same units, same values
///     for (auto& batch : data) {
///         // forward:  per unit, { auto s = engine.forward(layer.unit);  compute }
///         // backward: per unit, { auto s = engine.backward(layer.unit); compute gradients }
///         engine.step();                                 // clip, skip on inf/nan, update, zero
///     }
///
/// Forward and backward of a unit are either RAII scopes (`forward(u)`,
/// `backward(u)`) or four hooks for frameworks with pre/post callbacks
/// (`before_forward(u)` ... `after_backward(u)`). Entering a unit gathers its
/// parameters (when they are sharded) and calls each parameter's binder with views
/// of the gathered values (and, in backward, of the gradient to accumulate into);
/// leaving it releases them, and leaving backward starts the gradients' reduction.
/// A unit used k times in one forward gets k backward scopes; its reduction starts
/// after the k-th. Units that took no part in a step's backward are reduced as zero
/// in step(), so every rank issues the same collectives.
///
/// Prefetching follows the order units ran in the first step: entering a unit also
/// starts gathering the next `prefetch` units of that order (registration order in
/// the first step), within `max_live_units`.
///
/// Gradient accumulation, each micro-batch with its own forward and backward, one
/// optimizer step per window, in two ways:
///   - `accumulate_steps = K` in the options: call step() after every micro-batch;
///     the K-th updates, the others only end their micro-batch (DeepSpeed's
///     gradient_accumulation_steps). `accumulate` chooses whether each micro-batch
///     reduce-scatters into the gradient shards (accumulation::in_shard, least
///     memory) or the full gradients are kept and reduced once on the K-th
///     (accumulation::unsharded, least communication);
///   - or run the micro-batches but the last inside a `no_sync()` scope, then the
///     last outside it, then step() (PyTorch's no_sync): the full gradients are
///     kept and reduced once, in the last micro-batch's backward.
/// Where gradients are not sharded (ZeRO-0/1) both keep the full gradients and
/// reduce once. Scale each micro-batch's loss as for the window's whole batch.
///
/// `step()` completes the reductions, then in one small all-reduce checks for
/// inf/nan (skipping the step on every rank), computes the global norm (clipping to
/// `max_grad_norm`) and checks that every rank gathered and reduced the same units
/// in the same order (otherwise every rank throws mismatch_error, the step not
/// taken); it updates this rank's partition, publishes parameters where the
/// strategy needs it, and zeroes the gradients for the next step. Parameters named
/// by `no_gradient(p)` (no rank gave them a gradient in the window) are left as
/// they are, with their optimizer state and their own step count, as PyTorch's
/// optimizers skip a parameter whose gradient is None (see
/// fsdp_options::set_grads_to_none); checkpoints keep each parameter's step count.
///
/// Not thread-safe; every rank runs the same units in the same order.

#include "unison/comm/communicator.hpp"
#include "unison/core/dtype.hpp"
#include "unison/core/error.hpp"
#include "unison/core/tensor.hpp"
#include "unison/parallel/detail/control.hpp"
#include "unison/sharded/detail/config.hpp"
#include "unison/sharded/options.hpp"
#include "unison/sharded/partitioned_optimizer.hpp"
#include "unison/sharded/sharded_parameters.hpp"

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <initializer_list>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace unison {

/// One parameter of an engine: `id()` is its place in registration order (the
/// order of add_unit calls and of the parameters within each).
class parameter_handle {
public:
    parameter_handle() = default;
    std::size_t id() const noexcept { return id_; }
    bool operator==(const parameter_handle&) const = default;

private:
    template <communicator, class...>
    friend class fsdp;
    friend class unit_handle;
    parameter_handle(const void* owner, std::size_t id) : owner_(owner), id_(id) {}
    const void* owner_ = nullptr;
    std::size_t id_ = 0;
};

/// One unit of an engine and its parameters, in the order they were given.
class unit_handle {
public:
    unit_handle() = default;
    /// The unit's place in registration order.
    std::size_t index() const noexcept { return index_; }
    /// How many parameters it has.
    std::size_t size() const noexcept { return count_; }
    /// Its `j`-th parameter (std::out_of_range past the end).
    parameter_handle operator[](std::size_t j) const {
        if (j >= count_) {
            throw std::out_of_range("unison::unit_handle: unit " + std::to_string(index_) +
                                    " has " + std::to_string(count_) + " parameters, asked for #" +
                                    std::to_string(j));
        }
        return {owner_, first_ + j};
    }
    bool operator==(const unit_handle&) const = default;

private:
    template <communicator, class...>
    friend class fsdp;
    unit_handle(const void* owner, std::size_t index, std::size_t first, std::size_t count)
        : owner_(owner), index_(index), first_(first), count_(count) {}
    const void* owner_ = nullptr;
    std::size_t index_ = 0, first_ = 0, count_ = 0;
};

/// One parameter of a unit, as `fsdp::add_unit` takes it, for parameters of element
/// type `T`: its name (unique; checkpoints use it), its initial values (any
/// floating-point host tensor, the same on every rank; it must live until add_unit
/// returns, so temporaries are refused) or just its size (it starts at zero), and
/// its binder (may be empty).
template <element T>
struct unit_parameter {
    /// Called when the parameter's memory changes: with its values and, inside
    /// backward, the gradient to accumulate into (empty views otherwise); with two
    /// empty views when the gathered memory is freed. A framework points its tensor
    /// at them.
    using binder = std::function<void(view<T> value, view<T> gradient)>;

    std::string name;
    const_buffer initial{};
    std::size_t numel = 0;
    binder bind;

    template <tensor V>
    unit_parameter(std::string n, const V& values, binder b = {})
        : name(std::move(n)), initial(as_const_buffer(values)), numel(initial.count),
          bind(std::move(b)) {}
    /// A temporary's values would be gone before add_unit reads them.
    template <class V>
    requires(tensor<std::remove_cvref_t<V>> && !std::is_lvalue_reference_v<V>)
        unit_parameter(std::string, V&&, binder = {})
    = delete;
    unit_parameter(std::string n, std::size_t size, binder b = {})
        : name(std::move(n)), numel(size), bind(std::move(b)) {}
};

/// The sharding engine over communicator `C`, assembled from `Policies`: a strategy
/// (policy::shard::full by default, or policy::zero<N>), a precision
/// (policy::mixed_precision) and an optimizer type (optim::adamw by default), in any
/// order; the numbers come in `fsdp_options`.
template <communicator C, class... Policies>
class fsdp {
public:
    using config = detail::fsdp_config<Policies...>;
    using optimizer_type = typename config::optimizer;
    using params_type =
        sharded_parameters<C, typename config::sharding, typename config::precision>;
    using optimizer_state_type = partitioned_optimizer<params_type, optimizer_type>;
    using options_type = fsdp_options<optimizer_type>;
    using strategy = typename params_type::strategy;
    /// The element type parameters and gradients are kept (and computed) in.
    using value_type = element_t<params_type::param_dtype>;
    /// Called when a parameter's memory changes (see unit_parameter).
    using binder = typename unit_parameter<value_type>::binder;
    /// One parameter of a unit, as add_unit takes it.
    using parameter = unit_parameter<value_type>;

private:
    /// Where a unit is: outside any scope, or inside its forward, its backward, or a
    /// recomputation of its forward inside backward.
    enum class phase : std::uint8_t { none, forward, backward, recompute };

public:
    /// A unit's forward, backward or recomputation, from construction to destruction
    /// (see forward(), backward() and recompute()). Move-only.
    class unit_scope {
    public:
        unit_scope(unit_scope&& o) noexcept
            : engine_(std::exchange(o.engine_, nullptr)), unit_(o.unit_), kind_(o.kind_),
              exceptions_(o.exceptions_) {}
        unit_scope& operator=(unit_scope&&) = delete;
        unit_scope(const unit_scope&) = delete;
        unit_scope& operator=(const unit_scope&) = delete;
        /// Leaves the unit; during stack unwinding only its memory is released (no
        /// collective is started, so a failing rank cannot block the others).
        ~unit_scope() noexcept(false) {
            if (engine_ == nullptr) {
                return;
            }
            if (std::uncaught_exceptions() > exceptions_) {
                engine_->abandon(unit_);
            } else if (kind_ == phase::backward) {
                engine_->after_backward(unit_);
            } else if (kind_ == phase::recompute) {
                engine_->after_recompute(unit_);
            } else {
                engine_->after_forward(unit_);
            }
        }

    private:
        friend class fsdp;
        unit_scope(fsdp* e, unit_handle u, phase kind)
            : engine_(e), unit_(u), kind_(kind), exceptions_(std::uncaught_exceptions()) {}
        fsdp* engine_;
        unit_handle unit_;
        phase kind_;
        int exceptions_;
    };

    /// While it lives, backward passes keep the full gradients on this rank and add
    /// to them instead of reducing (see no_sync()). Move-only.
    class no_sync_scope {
    public:
        no_sync_scope(no_sync_scope&& o) noexcept : engine_(std::exchange(o.engine_, nullptr)) {}
        no_sync_scope& operator=(no_sync_scope&&) = delete;
        no_sync_scope(const no_sync_scope&) = delete;
        no_sync_scope& operator=(const no_sync_scope&) = delete;
        ~no_sync_scope() {
            if (engine_ != nullptr) {
                --engine_->no_sync_depth_;
            }
        }

    private:
        friend class fsdp;
        explicit no_sync_scope(fsdp* e) : engine_(e) { ++engine_->no_sync_depth_; }
        fsdp* engine_;
    };

    /// Keeps a reference to `comm`, which must outlive the engine. Splitting the
    /// communicator for shard::hybrid is collective.
    explicit fsdp(C& comm, options_type options = {})
        : comm_(&comm), options_(std::move(options)),
          params_(comm, shard_options{options_.max_live_units, options_.shard_group_size}, "fsdp") {
        if (options_.prefetch < 0) {
            fail("fsdp", "prefetch is " + std::to_string(options_.prefetch) +
                             "; it is 0 (off) or a number of units");
        }
        if (options_.accumulate_steps < 1) {
            fail("fsdp", "accumulate_steps is " + std::to_string(options_.accumulate_steps) +
                             "; it is 1 (no accumulation) or more micro-batches per step");
        }
        if (options_.accumulate != accumulation::in_shard &&
            options_.accumulate != accumulation::unsharded) {
            fail("fsdp", "accumulate is " + std::to_string(static_cast<int>(options_.accumulate)) +
                             "; it is accumulation::in_shard or accumulation::unsharded");
        }
    }

    fsdp(const fsdp&) = delete;
    fsdp& operator=(const fsdp&) = delete;

    /// For `unison::cuda::use_device` (parallel/device.cuh): every buffer on the
    /// installer's device, the kernels on its compute stream. Before add_unit.
    template <class Installer>
    void install_device(Installer& installer) {
        params_.install_device(installer);
        device_step_ =
            installer.template optimizer_step<optimizer_type,
                                              typename optimizer_state_type::compute_type>();
    }

    // ----------------------------------------------------------- registration

    /// Adds a unit (what is gathered together: a layer, a block) made of `params`,
    /// in that order, keeping this rank's part of their initial values. Every rank
    /// adds the same units in the same order; before start().
    unit_handle add_unit(std::span<const parameter> params) {
        if (started_) {
            fail("add_unit", "unit added after start()");
        }
        std::vector<parameter_spec> specs;
        specs.reserve(params.size());
        for (const parameter& p : params) {
            const bool given = p.initial.data != nullptr || p.initial.count != 0;
            if (given && (!is_floating(p.initial.type) || !p.initial.location.is_host())) {
                // Checked before anything is added, so a refused unit leaves no trace.
                fail("add_unit", "the initial values of '" + p.name + "' are " +
                                     std::string(to_string(p.initial.type)) + " on " +
                                     to_string(p.initial.location) +
                                     "; floating-point host values expected");
            }
            specs.push_back({p.name, p.numel});
        }
        const std::size_t k = params_.add_unit(std::span<const parameter_spec>(specs));
        const std::size_t first = params_.parameters_of(k).first;
        for (std::size_t j = 0; j < params.size(); ++j) {
            if (params[j].initial.data != nullptr || params[j].initial.count != 0) {
                params_.set_parameter(first + j, params[j].initial);
            }
            binders_.push_back(params[j].bind);
        }
        units_.push_back(unit_state{});
        return unit_handle(this, k, first, params.size());
    }
    unit_handle add_unit(std::initializer_list<parameter> params) {
        return add_unit(std::span<const parameter>(params.begin(), params.size()));
    }

    /// Whether parameter `p` gets weight decay (default: every parameter does; the
    /// usual recipe excludes biases, norms and embeddings).
    void set_weight_decay(parameter_handle p, bool decay) {
        static_assert(optimizer_state_type::has_weight_decay, "this optimizer has no weight_decay");
        check(p, "set_weight_decay");
        if (optimizer_) {
            optimizer_->set_weight_decay(p.id(), decay);
            return;
        }
        decay_.resize(params_.parameter_count(), 1);
        decay_[p.id()] = decay ? 1 : 0;
    }

    /// Parameter `p` got no gradient in this window on any rank: the window's update
    /// leaves it, its optimizer state and its step count as they are, as PyTorch's
    /// optimizers skip a parameter whose gradient is None (with set_grads_to_none
    /// false, only while no step has updated it yet; see fsdp_options). Its gradient
    /// is still reduced (as zero). Every rank must name the same parameters, before
    /// the step() that ends the window. unison::torch::fsdp calls it for the
    /// parameters that no rank's backward reached.
    void no_gradient(parameter_handle p) {
        check(p, "no_gradient");
        no_gradient_.resize(params_.parameter_count(), 0);
        no_gradient_[p.id()] = 1;
    }

    /// Checks that every rank added the same units with the same initial values and
    /// passed the same options that decide its collectives and its arithmetic, and
    /// allocates the optimizer state. Collective.
    void start() {
        if (started_) {
            fail("start", "start() called twice");
        }
        params_.start();
        verify_same_options();
        optimizer_.emplace(params_, options_.optimizer,
                           step_options{options_.max_grad_norm, options_.skip_nonfinite},
                           options_.loss_scaling);
        if (device_step_) {
            stored_step installer{std::move(device_step_)};
            optimizer_->install_device(installer);
        }
        if constexpr (optimizer_state_type::has_weight_decay) {
            for (std::size_t id = 0; id < decay_.size(); ++id) {
                if (decay_[id] == 0) {
                    optimizer_->set_weight_decay(id, false);
                }
            }
        }
        started_ = true;
        for (std::size_t k = 0; k < units_.size(); ++k) {
            if (params_.gathered(k)) { // resident: bound once, for forward and evaluation alike
                bind(k, false);
            }
        }
    }

    // ------------------------------------------------------------ forward/backward

    /// Enters unit `u`'s forward: gathers its parameters (prefetching the next units)
    /// and binds them. The scope's end leaves it (after_forward).
    [[nodiscard]] unit_scope forward(const unit_handle& u) {
        before_forward(u);
        return unit_scope(this, u, phase::forward);
    }
    /// Enters unit `u`'s backward: gathers its parameters, binds them and the
    /// gradients to accumulate into. The scope's end leaves it (after_backward:
    /// starts the gradients' reduction).
    [[nodiscard]] unit_scope backward(const unit_handle& u) {
        before_backward(u);
        return unit_scope(this, u, phase::backward);
    }

    /// Re-enters unit `u`'s forward inside its backward, for activation recomputation
    /// (a block whose activations were dropped in forward runs its forward again
    /// when backward reaches it): gathers its parameters where they were released
    /// (nothing is prefetched) and binds their values. It is not a forward use (the
    /// reduction still starts after one backward per use), and the scope's end keeps
    /// the unit gathered for the backward that follows it (which releases it; step()
    /// releases a unit left gathered). Every rank recomputes the same units in the
    /// same order.
    [[nodiscard]] unit_scope recompute(const unit_handle& u) {
        before_recompute(u);
        return unit_scope(this, u, phase::recompute);
    }
    /// The hook form of recompute(u)'s entry.
    void before_recompute(const unit_handle& u) {
        naming_units([&] {
            const std::size_t k = enter(u, "before_recompute", phase::recompute);
            entering guard{units_[k]};
            params_.gather(k, pass::backward);
            bind(k, false);
            ++recomputations_;
            guard.done = true;
        });
    }
    /// The hook form of recompute(u)'s exit: the unit stays gathered.
    void after_recompute(const unit_handle& u) { leave(u, "after_recompute", phase::recompute); }

    /// The hook form of forward(u)'s entry.
    void before_forward(const unit_handle& u) {
        naming_units([&] {
            const std::size_t k = enter(u, "before_forward", phase::forward);
            entering guard{units_[k]};
            params_.gather(k, pass::forward);
            prefetch_after(k, phase::forward);
            bind(k, false);
            ++units_[k].uses;
            guard.done = true;
        });
    }
    /// The hook form of forward(u)'s exit: releases the gathered parameters when the
    /// strategy reshards after forward.
    void after_forward(const unit_handle& u) {
        naming_units([&] {
            const std::size_t k = leave(u, "after_forward", phase::forward);
            release(k, pass::forward);
        });
    }
    /// The hook form of backward(u)'s entry.
    void before_backward(const unit_handle& u) {
        naming_units([&] {
            const std::size_t k = enter(u, "before_backward", phase::backward);
            entering guard{units_[k]};
            params_.gather(k, pass::backward);
            prefetch_after(k, phase::backward);
            bind(k, true);
            guard.done = true;
        });
    }
    /// The hook form of backward(u)'s exit: starts the reduction of the unit's
    /// gradients once every forward use of it has had its backward, and releases
    /// the gathered parameters.
    void after_backward(const unit_handle& u) {
        naming_units([&] {
            const std::size_t k = leave(u, "after_backward", phase::backward);
            end_backward(k, units_[k].backwards + 1);
        });
    }
    /// after_backward for a framework whose one backward covers every forward use of
    /// the unit (autograd sums a parameter's gradient over all its uses before the
    /// parameter's hook runs): leaves the unit's backward and starts the reduction
    /// however many forward uses there were.
    void complete_backward(const unit_handle& u) {
        naming_units([&] {
            const std::size_t k = leave(u, "complete_backward", phase::backward);
            end_backward(k, std::max(units_[k].backwards + 1, units_[k].uses));
        });
    }

    /// Backward passes inside the returned scope accumulate the full gradients on
    /// this rank and reduce nothing (PyTorch's `no_sync`): run every micro-batch of
    /// a window but the last inside it, the last outside it, then step(). Where
    /// gradients are sharded, the full gradients of every unit that ran backward
    /// stay resident until the last micro-batch reduces them. step() inside the
    /// scope is an error. Scopes nest.
    [[nodiscard]] no_sync_scope no_sync() {
        require_started("no_sync");
        return no_sync_scope(this);
    }

    /// Whether the backward of the current micro-batch reduces the gradients: false
    /// inside no_sync(), and on the micro-batches of an accumulate_steps window but
    /// the last where the full gradients are kept (accumulation::unsharded, or
    /// gradients not sharded).
    bool reduces_in_backward() const noexcept {
        if (no_sync_depth_ > 0) {
            return false;
        }
        if (last_micro_batch()) {
            return true;
        }
        return strategy::grads_sharded && options_.accumulate == accumulation::in_shard;
    }
    /// Whether the next step() takes the optimizer step (the last micro-batch of the
    /// accumulate_steps window, or every call without accumulation).
    bool last_micro_batch() const noexcept { return micro_ + 1 >= options_.accumulate_steps; }
    /// Unit forwards recomputed inside backward so far (recompute()).
    std::uint64_t recomputations() const noexcept { return recomputations_; }
    /// Micro-batches ended by step() in the current accumulate_steps window.
    int micro_batch() const noexcept { return micro_; }
    /// Whether a no_sync() scope is live (step() refuses then).
    bool in_no_sync() const noexcept { return no_sync_depth_ > 0; }
    /// Whether gradients of an unfinished accumulation window are held (after a
    /// step() that only accumulated, or inside no_sync()): checkpoints refuse then,
    /// as they do not carry gradients.
    bool accumulating() const noexcept { return micro_ > 0 || no_sync_depth_ > 0; }

    /// Frees every gathered unit outside a scope: after evaluation forwards with a
    /// strategy that keeps forward's parameters for backward (shard::grad_op), which
    /// would otherwise stay gathered until the next backward or step(). No-op when
    /// parameters are not sharded.
    void release_all() {
        naming_units([&] {
            require_started("release_all");
            for (std::size_t k = 0; k < units_.size(); ++k) {
                if (units_[k].active == phase::none) {
                    release(k, pass::backward);
                }
            }
        });
    }

    /// Copies parameter `p`'s full values into `out` (any writable floating-point host
    /// tensor of its size, converted to its dtype): to save, evaluate or hand the
    /// trained weights back to the framework. Collective when parameters are sharded
    /// and its unit is not gathered (every rank copies the same parameters in the
    /// same order).
    template <writable_tensor T>
    void copy_full(parameter_handle p, T&& out) {
        require_started("copy_full");
        check(p, "copy_full");
        const buffer b = as_buffer(out);
        const std::size_t n = params_.numel(p.id());
        if (b.count != n || !is_floating(b.type) || !b.location.is_host()) {
            fail("copy_full", "parameter '" + params_.name(p.id()) + "' has " + std::to_string(n) +
                                  " elements; the destination holds " + std::to_string(b.count) +
                                  " " + std::string(to_string(b.type)) + " on " +
                                  to_string(b.location) + " (host floating point expected)");
        }
        const std::size_t k = params_.unit_of(p.id());
        const bool gathered = params_.gathered(k);
        if (!gathered) {
            params_.gather(k, pass::backward);
        }
        const view<value_type> v = params_.template parameter<value_type>(p.id());
        if (params_.placement().on_device()) {
            std::vector<value_type> staging(n);
            params_.placement().copy_to_host(staging.data(), v.data, n * sizeof(value_type));
            detail::convert_scale(b.data, b.type, staging.data(), params_type::param_dtype, n);
        } else {
            detail::convert_scale(b.data, b.type, v.data, params_type::param_dtype, n);
        }
        if (!gathered) {
            release(k, pass::backward);
        }
    }

    /// Parameter `p`'s values: inside its unit's scope, or any time when parameters
    /// are not sharded.
    view<value_type> value(parameter_handle p) {
        check(p, "value");
        const std::size_t k = params_.unit_of(p.id());
        if (!params_.gathered(k)) {
            fail("value", "parameter '" + params_.name(p.id()) +
                              "' read outside its unit's "
                              "forward or backward (unit " +
                              std::to_string(k) + " is not gathered)");
        }
        return params_.template parameter<value_type>(p.id());
    }
    /// Parameter `p`'s gradient to accumulate into, inside its unit's backward.
    view<value_type> gradient(parameter_handle p) {
        check(p, "gradient");
        const std::size_t k = params_.unit_of(p.id());
        if (units_[k].active != phase::backward) {
            fail("gradient", "gradient of '" + params_.name(p.id()) +
                                 "' asked for outside its "
                                 "unit's backward (unit " +
                                 std::to_string(k) + ")");
        }
        return params_.template gradient<value_type>(p.id());
    }

    // ------------------------------------------------------------------ step

    /// Ends the iteration (see the file comment): reductions completed and checked,
    /// the optimizer step taken (or skipped on inf/nan, on every rank), the
    /// gradients zeroed for the next iteration. Collective. With accumulate_steps,
    /// a call that is not the window's last ends its micro-batch only (completing
    /// its reductions where each micro-batch reduces) and returns a result with
    /// `accumulated` set.
    step_result step() {
        return naming_units([&] {
            require_started("step");
            if (no_sync_depth_ > 0) {
                fail("step", "called inside no_sync(): the gradients of this window are not "
                             "reduced yet. Run the window's last micro-batch outside the no_sync "
                             "scope (its backward reduces them), then call step()");
            }
            for (std::size_t k = 0; k < units_.size(); ++k) {
                if (units_[k].active != phase::none) {
                    fail("step",
                         describe_unit(k) + " is still inside its " + phase_name(units_[k].active) +
                             " (after_forward/after_backward, or the scope's end, missing)");
                }
            }
            const bool last = last_micro_batch();
            struct next_iteration { // also when the step throws: the next one starts clean
                fsdp& e;
                bool last;
                bool done = false;
                ~next_iteration() {
                    if (!done) { // a failed step: no stale gradient carries over
                        try {
                            e.params_.zero_grad();
                        } catch (...) { // the step's own error is the one to report
                        }
                    }
                    for (unit_state& s : e.units_) {
                        s.uses = 0;
                        s.backwards = 0;
                        s.reduced = false;
                    }
                    e.micro_ = last || !done ? 0 : e.micro_ + 1;
                    if (last || !done) {
                        e.no_gradient_.clear();
                    }
                    e.observed_ = true;
                    e.cursor_[0] = e.cursor_[1] = 0;
                }
            } ended{*this, last};
            // Units that took no part in backward contribute zero, in unit order.
            if (reduces_in_backward()) {
                for (std::size_t k = 0; k < units_.size(); ++k) {
                    if (!units_[k].reduced) {
                        params_.reduce_gradients(k);
                    }
                }
            }
            release_all(); // prefetched but never used, or kept from forward
            if (!last) {
                if (reduces_in_backward()) {
                    params_.wait_gradients(); // added to the shards; full gradients freed
                }
                ended.done = true;
                return step_result{.accumulated = true, .loss_scale = loss_scale()};
            }
            for (std::size_t id = 0; id < no_gradient_.size(); ++id) {
                if (no_gradient_[id] != 0 &&
                    (options_.set_grads_to_none || optimizer_->steps_of(id) == 0)) {
                    optimizer_->skip_next_update(id);
                }
            }
            const step_result r = optimizer_->step();
            params_.zero_grad();
            ended.done = true;
            return r;
        });
    }

    // ---------------------------------------------------------------- queries

    /// The optimizer's hyperparameters; change them between steps (schedules).
    optimizer_type& hyperparameters() noexcept {
        return optimizer_ ? optimizer_->hyperparameters() : options_.optimizer;
    }
    /// Multiply the loss by this before backward (1 without loss scaling).
    double loss_scale() const noexcept { return optimizer_ ? optimizer_->loss_scale() : 1.0; }
    /// Steps taken (skipped steps do not count).
    std::uint64_t steps() const noexcept { return optimizer_ ? optimizer_->steps() : 0; }
    /// Steps that updated parameter `p`: steps() less those it sat out without a
    /// gradient (no_gradient).
    std::uint64_t steps_of(parameter_handle p) const {
        check(p, "steps_of");
        return optimizer_ ? optimizer_->steps_of(p.id()) : 0;
    }
    /// Resident and transient bytes of parameters, gradients and master weights.
    memory_report memory() const { return params_.memory(); }
    /// Bytes of optimizer state on this rank.
    std::size_t optimizer_state_bytes() const noexcept {
        return optimizer_ ? optimizer_->state_bytes() : 0;
    }
    /// Psi: the number of parameter elements.
    std::size_t numel() const noexcept { return params_.numel(); }
    std::size_t unit_count() const noexcept { return units_.size(); }
    const std::string& name(parameter_handle p) const { return params_.name(p.id()); }
    /// The units in the order their forward ran in the first step (empty before).
    const std::vector<std::size_t>& forward_order() const noexcept { return order_[0]; }
    const options_type& options() const noexcept { return options_; }
    C& communicator() noexcept { return *comm_; }

    /// The parts, for checkpoints and inspection.
    params_type& parameters() noexcept { return params_; }
    optimizer_state_type& optimizer() {
        require_started("optimizer");
        return *optimizer_;
    }

private:
    struct unit_state {
        phase active = phase::none;
        int uses = 0;      ///< forward entries in this step
        int backwards = 0; ///< backward exits in this step
        bool reduced = false;
    };

    /// Leaves a unit that failed to enter (its gather threw) outside again.
    struct entering {
        unit_state& s;
        bool done = false;
        ~entering() {
            if (!done) {
                s.active = phase::none;
            }
        }
    };

    /// Hands a step kernel created by use_device before start() to the optimizer.
    struct stored_step {
        std::unique_ptr<detail::device_optimizer_step<optimizer_type,
                                                      typename optimizer_state_type::compute_type>>
            step;
        template <class O, class A>
        auto optimizer_step() {
            return std::move(step);
        }
    };

    [[noreturn]] void fail(const std::string& operation, const std::string& what) const {
        throw argument_error(comm_->rank(), "fsdp " + operation, what);
    }
    void require_started(const char* what) const {
        if (!started_) {
            fail(what, "call start() after adding the units");
        }
    }
    std::size_t check(const unit_handle& u, const char* what) const {
        if (u.owner_ != this || u.index_ >= units_.size()) {
            fail(what,
                 "unit handle " + std::to_string(u.index_) + " does not belong to this engine");
        }
        return u.index_;
    }
    void check(const parameter_handle& p, const char* what) const {
        if (p.owner_ != this || p.id_ >= params_.parameter_count()) {
            fail(what,
                 "parameter handle " + std::to_string(p.id_) + " does not belong to this engine");
        }
    }

    static const char* phase_name(phase p) noexcept {
        switch (p) {
        case phase::forward:
            return "forward";
        case phase::backward:
            return "backward";
        case phase::recompute:
            return "recomputed forward";
        case phase::none:
            break;
        }
        return "no scope";
    }

    std::size_t enter(const unit_handle& u, const char* what, phase p) {
        require_started(what);
        const std::size_t k = check(u, what);
        unit_state& s = units_[k];
        if (s.active != phase::none) {
            fail(what,
                 describe_unit(k) + " entered again before leaving its " + phase_name(s.active));
        }
        if (p == phase::backward && s.reduced) {
            fail(what, describe_unit(k) +
                           " entered backward after its gradients "
                           "were reduced in this step (" +
                           std::to_string(s.uses) + " forward use(s), " +
                           std::to_string(s.backwards) +
                           " backward(s)); call step() between iterations. To accumulate "
                           "micro-batches, set fsdp_options::accumulate_steps and call step() "
                           "after each, or run all but the last inside no_sync()");
        }
        s.active = p;
        if (!observed_ && p == phase::forward && !order_[1].empty()) {
            observed_ = true; // a forward after a backward: the first step's pass is over
        }
        if (!observed_ && p != phase::recompute) {
            order_[p == phase::forward ? 0 : 1].push_back(k);
        }
        return k;
    }
    std::size_t leave(const unit_handle& u, const char* what, phase p) {
        require_started(what);
        const std::size_t k = check(u, what);
        unit_state& s = units_[k];
        if (s.active != p) {
            fail(what, describe_unit(k) + " is not inside its " + phase_name(p));
        }
        s.active = phase::none;
        return k;
    }
    /// Records `backwards` backward exits of unit k; the reduction starts once they
    /// cover its forward uses (unless this micro-batch only accumulates).
    void end_backward(std::size_t k, int backwards) {
        unit_state& s = units_[k];
        s.backwards = backwards;
        if (s.backwards >= s.uses && !s.reduced && reduces_in_backward()) {
            s.reduced = true;
            params_.reduce_gradients(k);
        }
        release(k, pass::backward);
    }

    /// The options that decide which collectives a step issues (accumulation,
    /// prefetching and its limit) or what every rank computes (clipping, skipping)
    /// must agree: a rank with another accumulate_steps would pair its reductions
    /// with the others' accumulating micro-batches. mismatch_error naming the field
    /// and the first rank that differs, on every rank.
    void verify_same_options() {
        static constexpr const char* fields[] = {
            "accumulate_steps", "accumulate",     "prefetch",         "max_live_units",
            "max_grad_norm",    "skip_nonfinite", "set_grads_to_none"};
        const std::vector<std::int64_t> mine{options_.accumulate_steps,
                                             static_cast<std::int64_t>(options_.accumulate),
                                             options_.prefetch,
                                             options_.max_live_units,
                                             std::bit_cast<std::int64_t>(options_.max_grad_norm),
                                             options_.skip_nonfinite ? 1 : 0,
                                             options_.set_grads_to_none ? 1 : 0};
        auto show = [](std::size_t f, std::int64_t v) {
            if (f == 1) {
                return std::string(v == 0 ? "accumulation::in_shard" : "accumulation::unsharded");
            }
            if (f == 4) {
                return std::to_string(std::bit_cast<double>(v));
            }
            if (f >= 5) {
                return std::string(v != 0 ? "true" : "false");
            }
            return std::to_string(v);
        };
        std::vector<std::int64_t> all(mine.size() * static_cast<std::size_t>(comm_->size()));
        detail::control_all_gather(*comm_, params_.placement(), std::span<const std::int64_t>(mine),
                                   std::span<std::int64_t>(all));
        for (int r = 0; r < comm_->size(); ++r) {
            const std::int64_t* theirs = all.data() + mine.size() * static_cast<std::size_t>(r);
            for (std::size_t f = 0; f < mine.size(); ++f) {
                if (theirs[f] != mine[f]) {
                    throw mismatch_error(comm_->rank(), "fsdp start",
                                         std::string("rank ") + std::to_string(r) + " has " +
                                             fields[f] + " = " + show(f, theirs[f]) +
                                             ", this rank " + show(f, mine[f]) +
                                             ": every rank must pass the same fsdp_options",
                                         r, fields[f]);
                }
            }
        }
    }

    /// Runs `f`. Where calls are matched, ranks that work on different units fail
    /// in a collective whose tag (the unit, plus one) differs; that error is thrown
    /// again naming the units by their parameters, as the user named them.
    template <class F>
    decltype(auto) naming_units(F&& f) {
        try {
            return std::forward<F>(f)();
        } catch (const mismatch_error& e) {
            const auto count = static_cast<std::int64_t>(units_.size());
            const std::int64_t a = e.reference_value(), b = e.other_value();
            if (e.field() != "tag" || e.reference_rank() < 0 || a < 1 || a > count || b < 1 ||
                b > count) {
                throw;
            }
            throw mismatch_error(
                e.rank(), e.operation(),
                "ranks work on different units: rank " + std::to_string(e.reference_rank()) +
                    " is in " + describe_unit(static_cast<std::size_t>(a - 1)) + " where rank " +
                    std::to_string(e.other_rank()) + " is in " +
                    describe_unit(static_cast<std::size_t>(b - 1)) + " (collective tags " +
                    std::to_string(a) + " and " + std::to_string(b) +
                    "): every rank must run the same units in the same order",
                e.other_rank(), e.field(), e.reference_rank(), a, b);
        }
    }
    /// "unit 1 ('fc2.weight', 'fc2.bias')": a unit by its parameters' names.
    std::string describe_unit(std::size_t k) const {
        const auto [first, last] = params_.parameters_of(k);
        std::string out = "unit " + std::to_string(k) + " (";
        for (std::size_t id = first; id < last && id < first + 3; ++id) {
            out += (id == first ? "'" : ", '") + params_.name(id) + "'";
        }
        return out + (last - first > 3 ? ", ...)" : ")");
    }

    /// Leaves a scope during stack unwinding: memory only, no collective.
    void abandon(const unit_handle& u) noexcept {
        try {
            const std::size_t k = u.index_;
            units_[k].active = phase::none;
            release(k, pass::backward);
        } catch (...) { // already unwinding: the first error is the one to report
        }
    }

    /// Starts gathering the units after `k` in this pass's order: the order observed
    /// in the first step, or registration order (reversed in backward) before it.
    /// (prefetch() does nothing where parameters are resident.)
    void prefetch_after(std::size_t k, phase p) {
        const auto depth = static_cast<std::size_t>(options_.prefetch);
        if (depth == 0) {
            return;
        }
        const bool fwd = p == phase::forward;
        if (!observed_) {
            for (std::size_t d = 1; d <= depth; ++d) {
                if (fwd ? k + d >= units_.size() : k < d) {
                    break;
                }
                params_.prefetch(fwd ? k + d : k - d);
            }
            return;
        }
        const std::vector<std::size_t>& seq = order_[fwd ? 0 : 1];
        std::size_t& at = cursor_[fwd ? 0 : 1];
        if (at >= seq.size() || seq[at] != k) {
            // Off the observed order: a new pass starting over, or no prediction.
            at = !seq.empty() && seq[0] == k ? 0 : std::numeric_limits<std::size_t>::max();
        }
        if (at == std::numeric_limits<std::size_t>::max()) {
            return;
        }
        for (std::size_t d = 1; d <= depth && at + d < seq.size(); ++d) {
            params_.prefetch(seq[at + d]);
        }
        ++at;
    }

    /// Calls unit k's binders with its parameters (and gradients in backward).
    void bind(std::size_t k, bool with_gradients) {
        const auto [first, last] = params_.parameters_of(k);
        for (std::size_t id = first; id < last; ++id) {
            if (!binders_[id]) {
                continue;
            }
            const view<value_type> v = params_.template parameter<value_type>(id);
            const view<value_type> g = with_gradients ? params_.template gradient<value_type>(id)
                                                      : view<value_type>{nullptr, 0, v.location};
            binders_[id](v, g);
        }
    }

    /// Releases unit k (see sharded_parameters::release) and unbinds what was freed.
    void release(std::size_t k, pass p) {
        const bool was = params_.gathered(k);
        params_.release(k, p);
        if (was && !params_.gathered(k)) {
            const auto [first, last] = params_.parameters_of(k);
            for (std::size_t id = first; id < last; ++id) {
                if (binders_[id]) {
                    binders_[id](view<value_type>{}, view<value_type>{});
                }
            }
        }
    }

    C* comm_;
    options_type options_;
    params_type params_;
    std::optional<optimizer_state_type> optimizer_;
    std::unique_ptr<
        detail::device_optimizer_step<optimizer_type, typename optimizer_state_type::compute_type>>
        device_step_;
    std::vector<binder> binders_;            // by parameter id
    std::vector<unit_state> units_;          // by unit index
    std::vector<unsigned char> decay_;       // by parameter id, until start()
    std::vector<unsigned char> no_gradient_; // by parameter id, in this window
    std::vector<std::size_t> order_[2];      // forward, backward order of the first step
    std::size_t cursor_[2] = {0, 0};
    std::uint64_t recomputations_ = 0;
    int micro_ = 0;         // micro-batches ended in this accumulate_steps window
    int no_sync_depth_ = 0; // live no_sync scopes
    bool observed_ = false;
    bool started_ = false;
};

} // namespace unison
