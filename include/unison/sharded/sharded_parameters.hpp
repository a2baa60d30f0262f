#pragma once

/// \file
/// `sharded_parameters`: the memory of a model's parameters and gradients, grouped
/// into units and sharded over ranks (FSDP's FlatParameter, DeepSpeed ZeRO's
/// partitions). One class covers ZeRO stages 0-3 and every FSDP strategy; the
/// strategy (sharded/detail/strategy.hpp) decides what stays resident.
///
/// This is the part the sharding engine `fsdp` (sharded/fsdp.hpp) is built on, for
/// frameworks that drive the units themselves. A unit is what is gathered together,
/// usually one layer or block. Its parameters are laid out back to back in one flat
/// buffer, padded to a multiple of the shard group's size S; rank r's shard is
/// elements [r * padded / S, (r + 1) * padded / S).
///
/// Per step, for each unit in the framework's order:
///
///     forward:   gather(u)                -> parameter<T>(id) views, valid until release
///                release(u)               (sharded parameters: frees the gathered copy)
///     backward:  gather(u, pass::backward)
///                write into gradient<T>(id)
///                reduce_gradients(u)      (non-blocking)
///                release(u, pass::backward)
///     then:      partitioned_optimizer::step() (which calls wait_gradients()), zero_grad()
///
/// Gradient accumulation: gradients sum until zero_grad(). Where the full gradients
/// are resident (ZeRO-0/1) a micro-batch's backward writes into them and the unit is
/// reduced once, on the last micro-batch. Where they are sharded (ZeRO-2/3, FSDP)
/// either the full gradient is kept across micro-batches and reduced once (more
/// memory), or each micro-batch's backward ends in reduce_gradients and
/// wait_gradients, and each reduction is added to the gradient shard (less memory,
/// a reduction per micro-batch); fsdp_options::accumulate chooses for the engine.
///
/// When the parameters are not sharded they stay resident, so gather and release do
/// nothing and the loop is the same for DDP, ZeRO and FSDP. `gather` is
/// non-blocking; `prefetch(u)` starts gathering another unit ahead of its use;
/// `parameter()` waits for the unit's gather.
///
/// Not thread-safe; the calls that communicate (start, gather, prefetch,
/// reduce_gradients, wait_gradients, publish_parameters) are collective over the shard
/// group and must be made in the same order on every rank. Each carries its unit as
/// the call's tag, so where calls are matched (the thread and MPI backends always,
/// NCCL with UNISON_DEBUG=1) ranks working on different units are an error, and the
/// count of iterations (wait_gradients calls that completed reductions) as the
/// call's step, so a rank that ran ahead into the next iteration is one too. To
/// catch a rank that skipped a whole iteration, pass a stepped_communicator with
/// the loop's index set (comm/stepped_communicator.hpp).

#include "unison/comm/collectives.hpp"
#include "unison/comm/communicator.hpp"
#include "unison/comm/stepped_communicator.hpp"
#include "unison/core/detail/aligned_bytes.hpp"
#include "unison/core/detail/convert.hpp"
#include "unison/core/detail/hash.hpp"
#include "unison/core/error.hpp"
#include "unison/core/tensor.hpp"
#include "unison/core/timeline.hpp"
#include "unison/parallel/detail/control.hpp"
#include "unison/parallel/detail/placement.hpp"
#include "unison/sharded/detail/config.hpp"
#include "unison/sharded/detail/strategy.hpp"
#include "unison/sharded/options.hpp"
#include "unison/sharded/policies.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <initializer_list>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace unison {

/// Which pass a `gather` or `release` belongs to: whether `release` reshards (a
/// strategy may keep forward's gathered parameters for backward).
enum class pass : std::uint8_t { forward, backward };

/// One parameter of a unit: its name (unique in the model) and element count.
struct parameter_spec {
    std::string name;
    std::size_t numel = 0;
};

/// Bytes this rank holds for the model state, by kind. `parameters`, `gradients`
/// and `master` are resident for the whole run; `gathered_*` are the transient full
/// copies of sharded parameters and gradients (parameters gathered for compute and
/// full gradients awaiting their reduce-scatter).
struct memory_report {
    std::size_t parameters = 0;
    std::size_t gradients = 0;
    std::size_t master = 0;
    std::size_t gathered_now = 0;
    std::size_t gathered_peak = 0;
    int live_units_peak = 0;
};

/// A half-open range of a unit's flat elements.
struct element_range {
    std::size_t begin = 0;
    std::size_t end = 0;
    std::size_t size() const noexcept { return end - begin; }
};

/// Sharded parameter and gradient memory over communicator `C`, assembled from
/// `Policies` (a strategy from unison::policy::shard or policy::zero<N>, and
/// policy::mixed_precision) and `shard_options`.
template <communicator C, class... Policies>
class sharded_parameters {
public:
    using config = detail::sharded_config<Policies...>;
    using strategy = typename config::strategy;
    using communicator_type = C;
    /// shard_comm() with the iteration count stamped on each call.
    using step_communicator_type = stepped_communicator<C>;
    using request_type = typename C::request_type;
    /// Where the parameters and gradients live, and which ranks share the shards
    /// (sharded/detail/residency.hpp, groups.hpp).
    using parameters_type = typename strategy::template parameters<request_type>;
    using gradients_type = typename strategy::gradients;
    using groups_type = typename strategy::template groups<C>;
    /// The ZeRO stage of the strategy (0-3).
    static constexpr int stage = strategy::stage;
    static constexpr dtype param_dtype = config::dtypes.param;
    static constexpr dtype reduce_dtype = config::dtypes.reduce;
    static constexpr dtype master_dtype = config::dtypes.master;
    static constexpr bool has_master = config::dtypes.has_master;

    /// Keeps a reference to `comm`, which must outlive this object. With
    /// shard::hybrid, `options.shard_group_size` ranks r, r+1, ... shard among
    /// themselves and the groups replicate; splitting the communicator is collective.
    /// `owner` is what errors call this object: "fsdp" when the engine owns it, so
    /// that its user reads the engine's name and calls, not the parts'.
    explicit sharded_parameters(C& comm, shard_options options = {},
                                std::string owner = "sharded_parameters")
        : comm_(&comm), options_(checked(comm, options, owner)), owner_(std::move(owner)),
          groups_(comm, options_, owner_) {}

    sharded_parameters(const sharded_parameters&) = delete;
    sharded_parameters& operator=(const sharded_parameters&) = delete;
    /// Waits for what is still in flight (the request destructors wait).
    ~sharded_parameters() {
        const int rank = comm_->rank();
        for (std::size_t k = 0; k < units_.size(); ++k) { // spans still open on the timeline
            try {
                residency_.close_span(k, rank);
                units_[k].reduce_span.end(rank, "reduce", k, "destroyed");
            } catch (...) {
            }
        }
    }

    /// For `unison::cuda::use_device` (parallel/device.cuh): every buffer (parameters,
    /// gradients, master weights, gathered units) on the installer's device, casts
    /// and fills on its compute stream. Before add_unit.
    template <class Installer>
    void install_device(Installer& installer) {
        if (!units_.empty()) {
            fail("use_device", "call it before add_unit (units are allocated as they are added)");
        }
        place_ = detail::placement{installer.ops()};
    }
    /// Where the parameters, gradients and master weights live.
    device location() const noexcept { return place_.where(); }
    /// That, with the device work behind it.
    const detail::placement& placement() const noexcept { return place_; }

    // ----------------------------------------------------------- registration

    /// Adds a unit made of `params` (in that order) and returns its index. Every
    /// rank adds the same units; before start().
    std::size_t add_unit(std::span<const parameter_spec> params) {
        if (started_) {
            fail("add_unit", "unit added after start()");
        }
        unit u;
        u.first = entries_.size();
        for (const parameter_spec& p : params) {
            if (p.name.empty()) {
                fail("add_unit", "parameter #" + std::to_string(entries_.size()) +
                                     " has an empty name (names identify it in checkpoints)");
            }
            for (const entry& e : entries_) {
                if (e.name == p.name) {
                    fail("add_unit", "parameter name '" + p.name + "' used twice");
                }
            }
            entries_.push_back(entry{p.name, p.numel, units_.size(), u.mem.numel, 0, false});
            u.mem.numel += p.numel;
        }
        u.last = entries_.size();
        const auto s = static_cast<std::size_t>(shard_size());
        u.mem.padded = (u.mem.numel + s - 1) / s * s;
        u.mem.shard = u.mem.padded / s;
        strategy::allocate(context(u, units_.size()));
        residency_.add_unit(); // unit k and its residency slot k exist together, or neither
        try {
            units_.push_back(std::move(u));
        } catch (...) {
            residency_.remove_last_unit();
            throw;
        }
        return units_.size() - 1;
    }
    std::size_t add_unit(std::initializer_list<parameter_spec> params) {
        return add_unit(std::span<const parameter_spec>(params.begin(), params.size()));
    }

    /// Sets parameter `id` from `values` (its full, unsharded values, any floating
    /// dtype, host memory): this rank keeps its part. Every rank passes the same
    /// values (same seed); start() checks. Unset parameters start at zero.
    template <tensor T>
    void set_parameter(std::size_t id, const T& values) {
        entry& e = at(id, "set_parameter");
        const const_buffer b = as_const_buffer(values);
        if (b.count != e.numel || !is_floating(b.type) || !b.location.is_host()) {
            fail("set_parameter",
                 "parameter '" + e.name + "' has " + std::to_string(e.numel) + " elements; got " +
                     std::to_string(b.count) + " " + std::string(to_string(b.type)) + " on " +
                     to_string(b.location) + " (host floating-point values expected)");
        }
        if (started_) {
            fail("set_parameter", "parameter '" + e.name + "' set after start()");
        }
        unit& u = units_[e.unit];
        const element_range whole{e.offset, e.offset + e.numel};
        const auto* src = static_cast<const std::byte*>(b.data);
        copy_overlap(whole, held_range(e.unit), src, b.type, parameters_type::held(u.mem),
                     param_dtype);
        if constexpr (has_master) {
            copy_overlap(whole, update_range(e.unit), src, b.type, u.mem.master.data(),
                         master_dtype);
        }
        // XXH3 (memory speed): the values of a whole model pass through here.
        e.init_hash =
            detail::xxh3_64(b.data, b.count * size_of(b.type), static_cast<std::uint64_t>(b.type));
        e.initialized = true;
    }

    /// Freezes the layout and checks, across the shard group and the replicas, that
    /// every rank added the same units and passed the same initial values. Collective.
    void start() {
        if (started_) {
            fail("start", "start() called twice");
        }
        verify_layout();
        started_ = true;
        log(log_level::info, comm_->rank(), [&] {
            std::size_t entries = 0;
            for (const unit& u : units_) {
                entries += u.last - u.first;
            }
            return owner_ + " started: layout " + std::string(strategy::layout_name) + ", " +
                   std::to_string(units_.size()) + " units of " + std::to_string(entries) +
                   " parameters, shard group of " + std::to_string(shard_size()) +
                   " ranks (shard rank " + std::to_string(shard_rank()) + "), " +
                   (options_.max_live_units > 0
                        ? "at most " + std::to_string(options_.max_live_units) +
                              " units gathered at once"
                        : std::string("no limit on units gathered at once"));
        });
    }

    // ------------------------------------------------------------ forward/backward

    /// Starts gathering `unit`'s full parameters when they are sharded (no-op
    /// otherwise). Non-blocking; parameter() waits. An error names the live units
    /// when it would exceed max_live_units.
    void gather(std::size_t unit_index, pass p = pass::forward) {
        (void)p;
        require_started("gather");
        unit_at(unit_index, "gather");
        progress(reductions_in_flight);
        if (!residency_.gathered(unit_index)) {
            if (at_live_limit()) {
                fail("gather", "unit " + std::to_string(unit_index) + " would be unit " +
                                   std::to_string(transient_.live + 1) +
                                   " gathered at once (limit " +
                                   std::to_string(options_.max_live_units) +
                                   "); release one of units " + residency_.live_units() + " first");
            }
            launch_gather(unit_index);
        }
    }

    /// Starts gathering `unit` ahead of its use if its parameters are sharded and not
    /// gathered yet and the live-unit limit allows; returns whether it started one.
    /// Collective like gather: every rank prefetches the same units in the same order.
    bool prefetch(std::size_t unit_index) {
        require_started("prefetch");
        unit_at(unit_index, "prefetch");
        if (!residency_.gathered(unit_index) && !at_live_limit()) {
            launch_gather(unit_index);
            return true;
        }
        return false;
    }

    /// Frees `unit`'s gathered parameters when they are sharded (after forward only
    /// when the strategy reshards after forward). Views from parameter() become
    /// invalid.
    void release(std::size_t unit_index, pass p = pass::forward) {
        require_started("release");
        unit& u = unit_at(unit_index, "release");
        residency_.release(unit_index, p == pass::forward, u.mem, transient_, comm_->rank());
    }

    /// Whether `unit`'s full parameters are available (or being gathered).
    bool gathered(std::size_t unit_index) const {
        unit_at(unit_index, "gathered");
        return residency_.gathered(unit_index);
    }

    /// The full values of parameter `id` (element type `T` = the parameter dtype).
    /// When parameters are sharded its unit must be gathered; waits for the gather.
    template <element T>
    view<T> parameter(std::size_t id) {
        entry& e = at(id, "parameter");
        check_type<T>(param_dtype, "parameter", e);
        unit& u = units_[e.unit];
        if (!residency_.gathered(e.unit)) {
            fail("parameter", "parameter '" + e.name + "' of unit " + std::to_string(e.unit) +
                                  " is not gathered: call gather(" + std::to_string(e.unit) +
                                  ") first");
        }
        residency_.wait(e.unit, comm_->rank());
        return {reinterpret_cast<T*>(u.mem.full_param.data()) + e.offset, e.numel, place_.where()};
    }

    /// Where backward accumulates parameter `id`'s full gradient (dtype = parameter
    /// dtype). Kept for the run when gradients are not sharded; otherwise allocated
    /// (zeroed) on the first call in a step and freed once reduce_gradients has
    /// consumed it.
    template <element T>
    view<T> gradient(std::size_t id) {
        require_started("gradient");
        entry& e = at(id, "gradient");
        check_type<T>(param_dtype, "gradient", e);
        unit& u = units_[e.unit];
        if (u.reduced) {
            fail("gradient", "gradient of '" + e.name + "' requested after unit " +
                                 std::to_string(e.unit) + " was reduced in this step");
        }
        if (!u.mem.full_grad) {
            gradient_storage(u);
        }
        u.grad_touched = true;
        return {reinterpret_cast<T*>(u.mem.full_grad.data()) + e.offset, e.numel, place_.where()};
    }

    /// Sums `unit`'s full gradients over the ranks and leaves their average in this
    /// rank's gradient partition (all of it, or the owned shard). Non-blocking:
    /// wait_gradients() completes it. Reductions that have finished are completed
    /// here (and in gather), freeing their full gradients when gradients are
    /// sharded; at most `reductions_in_flight` stay pending, so backward never holds
    /// more than that many full gradients besides the one it is writing. Where
    /// gradients are sharded, a unit reduced again before zero_grad() (the next
    /// micro-batch) has the new average added to its shard; where they are not, that
    /// is an error (accumulate into the full gradients and reduce once).
    void reduce_gradients(std::size_t unit_index) {
        require_started("reduce_gradients");
        unit& u = unit_at(unit_index, "reduce_gradients");
        if (u.reduced) {
            fail("reduce_gradients",
                 "unit " + std::to_string(unit_index) + " reduced twice in one step");
        }
        if (u.holds_sum && !gradients_type::adds_repeated_reductions) {
            fail("reduce_gradients",
                 "unit " + std::to_string(unit_index) +
                     " reduced again before zero_grad(): its full gradients already hold "
                     "the average over ranks. With full gradients resident (" +
                     std::string(strategy::layout_name) +
                     ") accumulate micro-batches into them and reduce once, on the last");
        }
        u.reduced = true;
        if (!u.mem.full_grad) {
            gradient_storage(u); // a unit that got no gradient on this rank contributes zero
        }
        void* whole = u.mem.full_grad.data();
        if constexpr (reduce_dtype != param_dtype) {
            u.mem.wire = detail::flat_buffer(u.mem.padded * size_of(reduce_dtype), place_);
            place_.scale_cast(u.mem.wire.data(), reduce_dtype, u.mem.full_grad.data(), param_dtype,
                              u.mem.padded);
            whole = u.mem.wire.data();
        }
        place_.order_before(shard_comm(), "sharded_parameters reduce_gradients");
        u.reduce = strategy::reduce(groups_.shard_steps(), context(u, unit_index), whole);
        u.reduce_span.begin(comm_->rank(), "reduce", unit_index, u.mem.padded,
                            strategy::layout_name);
        record(1, unit_index);
        pending_.push_back(unit_index);
        progress(reductions_in_flight);
    }

    /// Completes every reduction of this step in the order they were started; the
    /// gradient partitions then hold the average over all ranks.
    void wait_gradients() {
        require_started("wait_gradients");
        const bool any_reduced =
            std::any_of(units_.begin(), units_.end(), [](const unit& u) { return u.reduced; });
        struct next_iteration { // also when this throws: every rank counts it
            sharded_parameters& self;
            bool counts;
            ~next_iteration() {
                if (counts) {
                    self.groups_.set_step(self.groups_.shard_steps().step() + 1);
                }
            }
        } counted{*this, any_reduced};
        std::exception_ptr failure;
        for (std::size_t k = 0; k < units_.size(); ++k) {
            if (units_[k].grad_touched && !units_[k].reduced) {
                failure = std::make_exception_ptr(argument_error(
                    comm_->rank(), "sharded_parameters wait_gradients",
                    "unit " + std::to_string(k) + " got gradients but reduce_gradients(" +
                        std::to_string(k) + ") was not called in this step"));
                break;
            }
        }
        while (!pending_.empty()) {
            try {
                complete_front(!failure);
            } catch (...) {
                if (!failure) {
                    failure = std::current_exception();
                }
            }
        }
        for (unit& u : units_) {
            u.reduced = false;
        }
        if (failure) {
            std::rethrow_exception(failure);
        }
    }

    /// Zeroes the gradients (the resident ones and any transient full gradient).
    void zero_grad() {
        require_started("zero_grad");
        if (!pending_.empty()) {
            fail("zero_grad", "reductions are in flight: call wait_gradients() first");
        }
        for (std::size_t k = 0; k < units_.size(); ++k) {
            unit& u = units_[k];
            gradients_type::zero(context(u, k), transient_);
            u.grad_touched = false;
            u.reduced = false;
            u.holds_sum = false;
        }
    }

    /// When the strategy publishes (ZeRO-1 and -2): after the optimizer updated this
    /// rank's parameter partitions, all-gathers them so every rank holds the new full
    /// parameters. No-op otherwise. Collective.
    void publish_parameters() {
        require_started("publish_parameters");
        residency_.publish(
            groups_.shard_steps(), place_, units_.size(),
            [&](std::size_t k) { return context(units_[k], k); },
            [&](std::size_t k) { record(2, k); });
    }

    // ---------------------------------------------------------------- queries

    std::size_t unit_count() const noexcept { return units_.size(); }
    std::size_t parameter_count() const noexcept { return entries_.size(); }
    /// Psi: the number of parameter elements, unpadded.
    std::size_t numel() const noexcept {
        std::size_t n = 0;
        for (const unit& u : units_) {
            n += u.mem.numel;
        }
        return n;
    }
    const std::string& name(std::size_t id) const { return at(id, "name").name; }
    std::size_t numel(std::size_t id) const { return at(id, "numel").numel; }
    std::size_t unit_of(std::size_t id) const { return at(id, "unit_of").unit; }
    /// Offset of parameter `id` in its unit's flat buffer.
    std::size_t offset_of(std::size_t id) const { return at(id, "offset_of").offset; }
    /// Parameters [first, last) of a unit.
    std::pair<std::size_t, std::size_t> parameters_of(std::size_t unit_index) const {
        const unit& u = unit_at(unit_index, "parameters_of");
        return {u.first, u.last};
    }
    /// A unit's flat size, padded to a multiple of the shard group size.
    std::size_t padded_numel(std::size_t unit_index) const {
        return unit_at(unit_index, "padded_numel").mem.padded;
    }
    /// Index of the parameter called `name`, or parameter_count() if none is.
    std::size_t find(std::string_view name) const {
        for (std::size_t i = 0; i < entries_.size(); ++i) {
            if (entries_[i].name == name) {
                return i;
            }
        }
        return entries_.size();
    }

    /// The ranks that share the shards (all of them unless hybrid) and this rank's
    /// place among them.
    C& shard_comm() noexcept { return groups_.shard(); }
    /// shard_comm() with this object's iteration count stamped on each call as its
    /// step: what its own collectives and the optimizer's go through.
    step_communicator_type& step_communicator() noexcept { return groups_.shard_steps(); }
    /// Iterations so far: wait_gradients() calls that completed reductions.
    std::uint64_t iterations() const noexcept { return groups_.shard_steps().step(); }
    int shard_size() const noexcept { return groups_.shard().size(); }
    int shard_rank() const noexcept { return groups_.shard().rank(); }
    /// Which replica of the shards this rank belongs to (0 unless hybrid).
    int replica_index() const noexcept { return comm_->rank() / shard_size(); }
    C& communicator() noexcept { return *comm_; }
    const shard_options& options() const noexcept { return options_; }

    /// This rank's shard of a unit: disjoint across the shard group and covering the
    /// unit (gradient norms and checkpoints count each element once through it).
    element_range owned_range(std::size_t unit_index) const {
        return owned_range(unit_index, shard_rank());
    }
    /// The shard of a unit that rank `r` of the shard group owns (the layout is the
    /// same on every rank, so any rank can tell what another holds).
    element_range owned_range(std::size_t unit_index, int r) const {
        const unit& u = unit_at(unit_index, "owned_range");
        const auto at = static_cast<std::size_t>(r);
        return {at * u.mem.shard, (at + 1) * u.mem.shard};
    }
    /// The elements the optimizer updates on this rank: the owned shard when the
    /// optimizer state is sharded, the whole unit otherwise.
    element_range update_range(std::size_t unit_index) const {
        const unit& u = unit_at(unit_index, "update_range");
        return strategy::state_sharded ? owned_range(unit_index) : element_range{0, u.mem.padded};
    }
    /// The parameters resident on this rank: the owned shard when parameters are
    /// sharded, the whole unit otherwise.
    element_range held_range(std::size_t unit_index) const {
        const unit& u = unit_at(unit_index, "held_range");
        return parameters_type::held_range(u.mem, owned_range(unit_index));
    }

    /// Storage behind update_range(unit), for the optimizer and checkpoints:
    /// the parameters (param dtype), the master copy (null without one) and the
    /// averaged gradients (param dtype).
    struct partition {
        element_range range;
        void* param = nullptr;
        void* master = nullptr;
        void* grad = nullptr;
    };
    partition partition_of(std::size_t unit_index) {
        unit& u = unit_at(unit_index, "partition_of");
        const element_range r = update_range(unit_index);
        const std::size_t at_param = r.begin - held_range(unit_index).begin;
        return {r, parameters_type::held(u.mem) + at_param * size_of(param_dtype),
                has_master ? u.mem.master.data() : nullptr,
                gradients_type::partition(u.mem, r.begin, param_dtype)};
    }

    memory_report memory() const {
        memory_report m;
        for (const unit& u : units_) {
            m.parameters += parameters_type::held_count(u.mem) * size_of(param_dtype);
            m.gradients += gradients_type::held_count(u.mem) * size_of(param_dtype);
            if constexpr (has_master) {
                m.master +=
                    (strategy::state_sharded ? u.mem.shard : u.mem.padded) * size_of(master_dtype);
            }
        }
        m.gathered_now = transient_.now;
        m.gathered_peak = transient_.peak;
        m.live_units_peak = transient_.live_peak;
        return m;
    }
    /// How many reductions may be pending before reduce_gradients waits for the
    /// oldest (each holds a full gradient when gradients are sharded).
    static constexpr std::size_t reductions_in_flight = 2;

    /// A hash of the unit collectives this rank issued since the last reset (their
    /// kind and unit, in order): equal on every rank exactly when the ranks worked
    /// on the same units in the same order. `fsdp` compares it once per step.
    std::uint64_t issued_fingerprint() const noexcept { return issued_; }
    void reset_fingerprint() noexcept { issued_ = detail::fnv1a64_offset; }

    /// Throws `argument_error` naming this rank and `operation`.
    [[noreturn]] void fail(const std::string& operation, const std::string& detail) const {
        throw argument_error(comm_->rank(), owner_ + " " + operation, detail);
    }

private:
    struct entry {
        std::string name;
        std::size_t numel;
        std::size_t unit;
        std::size_t offset; // in the unit's flat buffer
        std::uint64_t init_hash;
        bool initialized;
    };

    struct unit {
        std::size_t first = 0, last = 0; // entries
        detail::unit_memory mem;
        std::optional<request_type> reduce;
        bool grad_touched = false;
        bool reduced = false;          // reduce_gradients was called in this step
        bool holds_sum = false;        // the partition holds a completed reduction since zero_grad
        detail::unit_span reduce_span; // open on the timeline while reducing
    };

    static shard_options checked(C& comm, shard_options options, const std::string& owner) {
        if (options.max_live_units < 0) {
            throw argument_error(comm.rank(), owner + " construction",
                                 "max_live_units is " + std::to_string(options.max_live_units) +
                                     "; it is 0 (no limit) or positive");
        }
        return options;
    }

    static int tag_of(std::size_t unit_index) noexcept {
        return static_cast<int>(unit_index % 0x7ffffffe) + 1;
    }
    detail::unit_context context(unit& u, std::size_t unit_index) {
        return {u.mem, config::dtypes, place_, shard_rank(), tag_of(unit_index), u.holds_sum};
    }

    /// Mixes one issued collective (kind, unit) into the fingerprint.
    void record(std::uint64_t kind, std::size_t unit_index) noexcept {
        const std::uint64_t v[2] = {kind, static_cast<std::uint64_t>(unit_index)};
        issued_ = detail::fnv1a64(v, sizeof v, issued_);
    }

    bool at_live_limit() const noexcept {
        return options_.max_live_units > 0 && transient_.live >= options_.max_live_units;
    }

    /// Completes the oldest pending reduction (waiting for it); with `write` false
    /// (after an earlier failure) only releases its buffers.
    void complete_front(bool write) {
        const std::size_t k = pending_.front();
        unit& u = units_[k];
        pending_.pop_front();
        struct cleanup {
            sharded_parameters* self;
            unit& u;
            ~cleanup() {
                u.reduce.reset();
                u.mem.wire.reset();
                u.mem.wire_shard.reset();
                u.grad_touched = false;
                gradients_type::reduced(u.mem, self->transient_);
            }
        } done{this, u};
        try {
            u.reduce->wait();
        } catch (...) {
            u.reduce_span.end(comm_->rank(), "reduce", k, "error");
            throw;
        }
        u.reduce_span.end(comm_->rank(), "reduce", k, write ? nullptr : "not written");
        if (write) {
            strategy::complete(groups_.replica_steps(), context(u, k),
                               1.0 / static_cast<double>(comm_->size()));
            u.holds_sum = true;
        }
    }

    /// Completes the reductions that have finished, in order, and waits for the
    /// oldest ones until at most `keep` are pending. With hybrid sharding completing
    /// one is itself a collective (the all-reduce across the replicas), so only the
    /// program's order may decide when: a reduction that test() finds done early on
    /// one rank and not on another would put that rank in the replica group's
    /// all-reduce while its replica waits in its own shard group's next gather, and
    /// across two groups the ranks would wait on each other in a cycle.
    void progress(std::size_t keep) {
        while (!pending_.empty() &&
               (pending_.size() > keep || (!groups_type::completion_is_collective &&
                                           units_[pending_.front()].reduce->test()))) {
            complete_front(true);
        }
    }

    /// Copies the part of `values` (covering unit elements `whole`) that falls in
    /// `held` into `dst` (which starts at held.begin), converting to `dst_type`.
    /// (`values` are host memory; on a device the cast runs on the host into a
    /// staging copy that is then uploaded.)
    void copy_overlap(element_range whole, element_range held, const std::byte* values, dtype type,
                      std::byte* dst, dtype dst_type) const {
        const std::size_t b = std::max(whole.begin, held.begin);
        const std::size_t e = std::min(whole.end, held.end);
        if (b >= e) {
            return;
        }
        std::byte* to = dst + (b - held.begin) * size_of(dst_type);
        const std::byte* from = values + (b - whole.begin) * size_of(type);
        if (!place_.on_device()) {
            detail::convert_scale(to, dst_type, from, type, e - b);
            return;
        }
        detail::aligned_bytes staging((e - b) * size_of(dst_type));
        detail::convert_scale(staging.data(), dst_type, from, type, e - b);
        place_.copy_from_host(to, staging.data(), staging.size());
    }

    void launch_gather(std::size_t unit_index) {
        residency_.launch(unit_index, context(units_[unit_index], unit_index),
                          groups_.shard_steps(), transient_, comm_->rank(), strategy::layout_name);
        record(0, unit_index);
    }

    void gradient_storage(unit& u) {
        u.mem.full_grad = detail::flat_buffer(u.mem.padded * size_of(param_dtype), place_);
        place_.zero(u.mem.full_grad.data(), param_dtype, u.mem.padded);
        transient_.add(u.mem.full_grad.size());
    }

    template <element T>
    void check_type(dtype expected, const char* what, const entry& e) const {
        if (dtype_of<T> != expected) {
            fail(what, "parameter '" + e.name + "' is " + std::string(to_string(expected)) +
                           ", requested as " + std::string(to_string(dtype_of<T>)));
        }
    }

    void require_started(const char* what) const {
        if (!started_) {
            fail(what, "call start() first");
        }
    }
    entry& at(std::size_t id, const char* what) {
        if (id >= entries_.size()) {
            fail(what, "no parameter " + std::to_string(id) + " (there are " +
                           std::to_string(entries_.size()) + ")");
        }
        return entries_[id];
    }
    const entry& at(std::size_t id, const char* what) const {
        return const_cast<sharded_parameters*>(this)->at(id, what);
    }
    unit& unit_at(std::size_t k, const char* what) {
        if (k >= units_.size()) {
            fail(what, "no unit " + std::to_string(k) + " (there are " +
                           std::to_string(units_.size()) + ")");
        }
        return units_[k];
    }
    const unit& unit_at(std::size_t k, const char* what) const {
        return const_cast<sharded_parameters*>(this)->unit_at(k, what);
    }

    /// Every rank: the same units (names and sizes) and the same initial values.
    void verify_layout() {
        // One hash per parameter: its name, size and unit. Counts first (a rank with
        // another parameter count would otherwise call the next all_gather with
        // another count), then the first parameter that differs, by name.
        std::vector<std::uint64_t> hashes;
        hashes.reserve(entries_.size());
        for (const entry& e : entries_) {
            std::uint64_t h = detail::fnv1a64(e.name.data(), e.name.size());
            const std::uint64_t n[2] = {e.numel, e.unit};
            hashes.push_back(detail::fnv1a64(n, sizeof n, h));
        }
        const std::string operation = owner_ + " start";
        const std::string rule = owner_ == "fsdp"
                                     ? "every rank must add the same units (add_unit) with the "
                                       "same parameters in the same order"
                                     : "every rank must add the same units in the same order";
        detail::verify_same_entries(
            *comm_, place_, std::span<const std::uint64_t>(hashes),
            [&](std::size_t k) {
                const entry& e = entries_[k];
                return "parameter '" + e.name + "' (" + std::to_string(e.numel) +
                       " elements, unit " + std::to_string(e.unit) + ")";
            },
            {operation.c_str(), "added", "parameters", "with other names or sizes", rule.c_str()});
        const std::size_t n = entries_.size();
        if (n == 0) {
            return;
        }
        // (as int64: the collectives carry signed 64-bit integers)
        std::vector<std::int64_t> mine(n);
        for (std::size_t i = 0; i < n; ++i) {
            mine[i] =
                static_cast<std::int64_t>(entries_[i].initialized ? entries_[i].init_hash : 0);
        }
        std::vector<std::int64_t> all(n * static_cast<std::size_t>(comm_->size()));
        detail::control_all_gather(*comm_, place_, std::span<const std::int64_t>(mine),
                                   std::span<std::int64_t>(all));
        for (int r = 0; r < comm_->size(); ++r) {
            for (std::size_t i = 0; i < n; ++i) {
                if (all[static_cast<std::size_t>(r) * n + i] != mine[i]) {
                    throw mismatch_error(comm_->rank(), owner_ + " start",
                                         "parameter '" + entries_[i].name +
                                             "' was set to other initial values on rank " +
                                             std::to_string(r) +
                                             ": every rank must pass the same values to " +
                                             (owner_ == "fsdp" ? "add_unit" : "set_parameter") +
                                             " (initialize with the same seed)",
                                         r, "values");
                }
            }
        }
    }

    C* comm_;
    shard_options options_;
    std::string owner_; ///< what errors call this object
    /// The shard group and any replica group, stamped with the iteration count.
    groups_type groups_;
    detail::placement place_;
    std::vector<entry> entries_;
    std::vector<unit> units_;
    /// Where each unit's full parameters are. After units_: a gather still in flight
    /// is waited for (its request destroyed) while the buffer it writes is alive.
    parameters_type residency_;
    std::deque<std::size_t> pending_; // units whose reduction is in flight, oldest first
    detail::transient_memory transient_;
    std::uint64_t issued_ = detail::fnv1a64_offset;
    bool started_ = false;
};

} // namespace unison
