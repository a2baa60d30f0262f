#pragma once

/// \file
/// `sharded_parameters`: the memory of a model's parameters and gradients, grouped
/// into units and sharded over ranks (FSDP's FlatParameter, DeepSpeed ZeRO's
/// partitions). One class covers ZeRO stages 0-3 and every FSDP strategy; the
/// sharding policy decides what stays resident (see policies.hpp).
///
/// A unit is what is gathered together, usually one layer or block. Its parameters
/// are laid out back to back in one flat buffer, padded to a multiple of the shard
/// group's size S; rank r's shard is elements [r * padded / S, (r + 1) * padded / S).
///
/// Per step, for each unit in the framework's order:
///
///     forward:   gather(u)                -> parameter<T>(id) views, valid until release
///                release(u)               (stage 3 frees the gathered copy)
///     backward:  gather(u, pass::backward)
///                write into gradient<T>(id)
///                reduce_gradients(u)      (non-blocking)
///                release(u, pass::backward)
///     then:      partitioned_optimizer::step() (which calls wait_gradients())
///
/// Below stage 3 the parameters stay resident, so gather and release do nothing and
/// the loop is the same for DDP, ZeRO and FSDP. `gather` is non-blocking and also
/// starts gathering the next `prefetch` units (forward order in forward, reverse in
/// backward); `parameter()` waits for the unit's gather.
///
/// Not thread-safe; the calls that communicate (start, gather, reduce_gradients,
/// wait_gradients, publish_parameters) are collective over the shard group and must
/// be made in the same order on every rank.

#include "unison/comm/collectives.hpp"
#include "unison/comm/communicator.hpp"
#include "unison/comm/detail/placement.hpp"
#include "unison/core/detail/aligned_bytes.hpp"
#include "unison/core/detail/convert.hpp"
#include "unison/core/detail/hash.hpp"
#include "unison/core/error.hpp"
#include "unison/core/tensor.hpp"
#include "unison/sharded/policies.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <initializer_list>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace unison {

/// Which pass a `gather` or `release` belongs to: it sets the prefetch direction and
/// whether `release` reshards (`reshard_after_forward`).
enum class pass : std::uint8_t { forward, backward };

/// One parameter of a unit: its name (unique in the model) and element count.
struct parameter_spec {
    std::string name;
    std::size_t numel = 0;
};

/// Bytes this rank holds for the model state, by kind. `parameters`, `gradients`
/// and `master` are resident for the whole run; `gathered_*` are the transient full
/// copies of stage 3 (parameters gathered for compute and full gradients awaiting
/// their reduce-scatter).
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

inline namespace UNISON_TU_ABI {

/// Sharded parameter and gradient memory over communicator `C`, assembled from
/// `Policies` (unison::policy: zero<N> / fsdp<...>, mixed_precision, ...).
template <communicator C, class... Policies>
class sharded_parameters {
public:
    using config = detail::sharded_config<Policies...>;
    using communicator_type = C;
    using request_type = typename C::request_type;
    static constexpr int stage = config::stage;
    static constexpr dtype param_dtype = config::param_dtype;
    static constexpr dtype reduce_dtype = config::reduce_dtype;
    static constexpr dtype master_dtype = config::master_dtype;
    static constexpr bool has_master = config::has_master;

    /// Keeps a reference to `comm`, which must outlive this object. With
    /// `fsdp<shard::hybrid>`, `shard_group_size` (a divisor of comm.size()) ranks
    /// r, r+1, ... shard among themselves and the groups replicate; it is ignored
    /// otherwise. Splitting the communicator is collective.
    explicit sharded_parameters(C& comm, int shard_group_size = 0) : comm_(&comm) {
        if constexpr (config::hybrid) {
            const int n = comm.size();
            if (shard_group_size < 1 || n % shard_group_size != 0) {
                fail("sharded_parameters", "fsdp<shard::hybrid> needs a shard group size that "
                                           "divides the " +
                                               std::to_string(n) + " ranks; got " +
                                               std::to_string(shard_group_size));
            }
            shard_own_.emplace(comm.split(comm.rank() / shard_group_size, comm.rank()));
            replica_own_.emplace(comm.split(comm.rank() % shard_group_size, comm.rank()));
        }
    }

#if UNISON_HAS_CUDA()
    /// Keeps every buffer (parameters, gradients, master weights, gathered units) on
    /// CUDA device `dev`, with casts and fills on `compute` (the stream the framework
    /// computes on; the legacy default stream when null) and the collectives on the
    /// communicator's stream, ordered after `compute` by events. Before add_unit; the
    /// translation unit is compiled by nvcc (the casts are kernels). Works with the
    /// NCCL backend and with the thread backend on one GPU (unison::cuda::attach).
    void use_device(int dev, cudaStream_t compute = nullptr) {
        if (!units_.empty()) {
            fail("use_device", "call it before add_unit (units are allocated as they are added)");
        }
        detail::placement::require_device_code(comm_->rank(), "sharded_parameters use_device",
                                               device::cuda(dev));
        place_ = {device::cuda(dev), compute};
    }
#endif
    /// Where the parameters, gradients and master weights live.
    device location() const noexcept {
        return place_.where;
    }
    /// That, with the compute stream device work is ordered on.
    detail::placement placement_of() const noexcept {
        return place_;
    }

    sharded_parameters(const sharded_parameters&) = delete;
    sharded_parameters& operator=(const sharded_parameters&) = delete;
    /// Waits for what is still in flight (the request destructors wait).
    ~sharded_parameters() = default;

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
            entries_.push_back(entry{p.name, p.numel, units_.size(), u.numel, 0, false});
            u.numel += p.numel;
        }
        u.last = entries_.size();
        const auto s = static_cast<std::size_t>(shard_size());
        u.padded = (u.numel + s - 1) / s * s;
        u.shard = u.padded / s;
        allocate(u);
        units_.push_back(std::move(u));
        return units_.size() - 1;
    }
    std::size_t add_unit(std::initializer_list<parameter_spec> params) {
        return add_unit(std::span<const parameter_spec>(params.begin(), params.size()));
    }

    /// Sets parameter `id` from `values` (its full, unsharded values, any floating
    /// dtype): this rank keeps its part. Every rank passes the same values (same
    /// seed); start() checks. Unset parameters start at zero.
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
        unit& u = units_[e.unit];
        const element_range whole{e.offset, e.offset + e.numel};
        const auto* src = static_cast<const std::byte*>(b.data);
        // The resident parameters: all of them below stage 3, the owned shard at 3.
        const element_range held = stage < 3 ? element_range{0, u.padded} : owned_range(e.unit);
        copy_overlap(whole, held, src, b.type, param_base(u), param_dtype);
        if constexpr (has_master) {
            copy_overlap(whole, update_range(e.unit), src, b.type, u.master.data(), master_dtype);
        }
        std::uint64_t h = detail::fnv1a64(&b.type, sizeof b.type);
        e.init_hash = detail::fnv1a64(b.data, b.count * size_of(b.type), h);
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
    }

    // ------------------------------------------------------------ forward/backward

    /// Starts gathering `unit`'s full parameters (stage 3; no-op below) and prefetches
    /// the next units in `p`'s direction. Non-blocking; parameter() waits.
    void gather(std::size_t unit_index, pass p = pass::forward) {
        require_started("gather");
        unit& u = unit_at(unit_index, "gather");
        progress(reductions_in_flight);
        if constexpr (stage == 3) {
            if (u.state == unit_state::sharded) {
                if (config::live_limit > 0 && live_ >= config::live_limit) {
                    std::string alive;
                    for (std::size_t k = 0; k < units_.size(); ++k) {
                        if (units_[k].state != unit_state::sharded) {
                            alive += (alive.empty() ? "" : ", ") + std::to_string(k);
                        }
                    }
                    fail("gather", "unit " + std::to_string(unit_index) + " would be unit " +
                                       std::to_string(live_ + 1) + " gathered at once (limit " +
                                       std::to_string(config::live_limit) +
                                       "); release one of units " + alive + " first");
                }
                launch_gather(u);
            }
            for (int d = 1; d <= config::prefetch_depth; ++d) {
                const auto step = static_cast<std::size_t>(d);
                const bool forward = p == pass::forward;
                if (forward ? unit_index + step >= units_.size() : unit_index < step) {
                    break;
                }
                unit& next = units_[forward ? unit_index + step : unit_index - step];
                if (next.state == unit_state::sharded &&
                    (config::live_limit == 0 || live_ < config::live_limit)) {
                    launch_gather(next);
                    ++prefetched_;
                }
            }
        }
    }

    /// Frees `unit`'s gathered parameters (stage 3, unless this is the forward pass
    /// and reshard_after_forward is off). Views from parameter() become invalid.
    void release(std::size_t unit_index, pass p = pass::forward) {
        require_started("release");
        unit& u = unit_at(unit_index, "release");
        if constexpr (stage == 3) {
            if (p == pass::forward && !config::reshard_after_forward) {
                return;
            }
            if (u.state == unit_state::sharded) {
                return;
            }
            if (u.gather) {
                u.gather->wait();
                u.gather.reset();
            }
            gathered_now_ -= u.full_param.size();
            u.full_param.reset();
            u.state = unit_state::sharded;
            --live_;
        }
    }

    /// The full values of parameter `id` (element type `T` = the parameter dtype).
    /// At stage 3 its unit must be gathered; waits for the gather to complete.
    template <element T>
    view<T> parameter(std::size_t id) {
        entry& e = at(id, "parameter");
        check_type<T>(param_dtype, "parameter", e);
        unit& u = units_[e.unit];
        if constexpr (stage == 3) {
            if (u.state == unit_state::sharded) {
                fail("parameter", "parameter '" + e.name + "' of unit " + std::to_string(e.unit) +
                                      " is not gathered: call gather(" + std::to_string(e.unit) +
                                      ") first");
            }
            if (u.gather) {
                u.gather->wait();
                u.gather.reset();
                u.state = unit_state::gathered;
            }
        }
        return {reinterpret_cast<T*>(u.full_param.data()) + e.offset, e.numel, place_.where};
    }

    /// Where backward accumulates parameter `id`'s full gradient (dtype = parameter
    /// dtype). Stages 0-1 keep it for the run; stages 2-3 allocate it (zeroed) on the
    /// first call in a step and free it once reduce_gradients has consumed it.
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
        if (!u.full_grad) {
            gradient_storage(u);
        }
        u.grad_touched = true;
        return {reinterpret_cast<T*>(u.full_grad.data()) + e.offset, e.numel, place_.where};
    }

    /// Sums `unit`'s full gradients over the ranks and leaves their average in this
    /// rank's gradient partition (stage 0: all of it, all-reduce; stages 1-3: the
    /// owned shard, reduce-scatter). Non-blocking: wait_gradients() completes it.
    /// Reductions that have finished are completed here (and in gather), freeing their
    /// full gradients at stages 2-3; at most `reductions_in_flight` stay pending, so
    /// backward never holds more than that many full gradients besides the one it is
    /// writing.
    void reduce_gradients(std::size_t unit_index) {
        require_started("reduce_gradients");
        unit& u = unit_at(unit_index, "reduce_gradients");
        if (u.reduced) {
            fail("reduce_gradients",
                 "unit " + std::to_string(unit_index) + " reduced twice in one step");
        }
        u.reduced = true;
        if (!u.full_grad) {
            gradient_storage(u); // a unit that got no gradient on this rank contributes zero
        }
        void* src = u.full_grad.data();
        if constexpr (reduce_dtype != param_dtype) {
            u.wire = detail::flat_bytes(u.padded * size_of(reduce_dtype), place_.where);
            detail::place_scale_cast(place_, u.wire.data(), reduce_dtype, u.full_grad.data(),
                                     param_dtype, u.padded);
            src = u.wire.data();
        }
        buffer whole{src, u.padded, reduce_dtype, place_.where};
        fence_.order(place_, shard_comm(), "sharded_parameters reduce_gradients");
        if constexpr (stage == 0) {
            u.reduce = all_reduce_async(shard_comm(), whole);
        } else if constexpr (stage == 1) {
            u.reduce = reduce_scatter_async(shard_comm(), whole);
        } else {
            void* out = u.shard_grad.data();
            if constexpr (reduce_dtype != param_dtype) {
                u.wire_shard = detail::flat_bytes(u.shard * size_of(reduce_dtype), place_.where);
                out = u.wire_shard.data();
            }
            u.reduce = reduce_scatter_async(shard_comm(), const_buffer(whole),
                                            buffer{out, u.shard, reduce_dtype, place_.where});
        }
        pending_.push_back(unit_index);
        progress(reductions_in_flight);
    }

    /// Completes every reduction of this step in the order they were started; the
    /// gradient partitions then hold the average over all ranks.
    void wait_gradients() {
        require_started("wait_gradients");
        std::exception_ptr failure;
        for (std::size_t k = 0; k < units_.size(); ++k) {
            if (units_[k].grad_touched && !units_[k].reduced) {
                failure = std::make_exception_ptr(argument_error(
                    comm_->rank(), "wait_gradients",
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
        for (unit& u : units_) {
            if constexpr (stage <= 1) {
                detail::place_zero(place_, u.full_grad.data(), param_dtype, u.padded);
            } else {
                detail::place_zero(place_, u.shard_grad.data(), param_dtype, u.shard);
                drop_full_grad(u);
            }
            u.grad_touched = false;
            u.reduced = false;
        }
    }

    /// Stages 1-2: after the optimizer updated this rank's parameter partitions,
    /// all-gathers them so every rank holds the new full parameters. No-op at
    /// stages 0 and 3. Collective.
    void publish_parameters() {
        require_started("publish_parameters");
        if constexpr (stage == 1 || stage == 2) {
            std::vector<request_type> requests;
            requests.reserve(units_.size());
            fence_.order(place_, shard_comm(), "sharded_parameters publish_parameters");
            for (unit& u : units_) {
                requests.push_back(
                    all_gather_async(shard_comm(), buffer{u.full_param.data(), u.padded,
                                                          param_dtype, place_.where}));
            }
            wait_all(std::span<request_type>(requests));
        }
    }

    // ---------------------------------------------------------------- queries

    std::size_t unit_count() const noexcept {
        return units_.size();
    }
    std::size_t parameter_count() const noexcept {
        return entries_.size();
    }
    /// Psi: the number of parameter elements, unpadded.
    std::size_t numel() const noexcept {
        std::size_t n = 0;
        for (const unit& u : units_) {
            n += u.numel;
        }
        return n;
    }
    const std::string& name(std::size_t id) const {
        return at(id, "name").name;
    }
    std::size_t numel(std::size_t id) const {
        return at(id, "numel").numel;
    }
    std::size_t unit_of(std::size_t id) const {
        return at(id, "unit_of").unit;
    }
    /// Offset of parameter `id` in its unit's flat buffer.
    std::size_t offset_of(std::size_t id) const {
        return at(id, "offset_of").offset;
    }
    /// Parameters [first, last) of a unit, and its padded flat size.
    std::pair<std::size_t, std::size_t> parameters_of(std::size_t unit_index) const {
        const unit& u = unit_at(unit_index, "parameters_of");
        return {u.first, u.last};
    }
    std::size_t padded_numel(std::size_t unit_index) const {
        return unit_at(unit_index, "padded_numel").padded;
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
    C& shard_comm() noexcept {
        if constexpr (config::hybrid) {
            return *shard_own_;
        } else {
            return *comm_;
        }
    }
    int shard_size() const noexcept {
        if constexpr (config::hybrid) {
            return shard_own_->size();
        } else {
            return comm_->size();
        }
    }
    int shard_rank() const noexcept {
        if constexpr (config::hybrid) {
            return shard_own_->rank();
        } else {
            return comm_->rank();
        }
    }
    /// Which replica of the shards this rank belongs to (0 unless hybrid).
    int replica_index() const noexcept {
        return comm_->rank() / shard_size();
    }
    C& communicator() noexcept {
        return *comm_;
    }

    /// This rank's shard of a unit: disjoint across the shard group and covering the
    /// unit (gradient norms and checkpoints count each element once through it).
    element_range owned_range(std::size_t unit_index) const {
        const unit& u = unit_at(unit_index, "owned_range");
        const auto r = static_cast<std::size_t>(shard_rank());
        return {r * u.shard, (r + 1) * u.shard};
    }
    /// The elements the optimizer updates on this rank: the whole unit at stage 0,
    /// the owned shard otherwise.
    element_range update_range(std::size_t unit_index) const {
        const unit& u = unit_at(unit_index, "update_range");
        return stage == 0 ? element_range{0, u.padded} : owned_range(unit_index);
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
        const std::size_t at_param = stage == 3 ? 0 : r.begin;
        const std::size_t at_grad = stage >= 2 ? 0 : r.begin;
        return {r, param_base(u) + at_param * size_of(param_dtype),
                has_master ? u.master.data() : nullptr,
                (stage >= 2 ? u.shard_grad.data() : u.full_grad.data()) +
                    at_grad * size_of(param_dtype)};
    }

    memory_report memory() const {
        memory_report m;
        for (const unit& u : units_) {
            m.parameters += (stage == 3 ? u.shard : u.padded) * size_of(param_dtype);
            m.gradients += (stage >= 2 ? u.shard : u.padded) * size_of(param_dtype);
            if constexpr (has_master) {
                m.master += (stage == 0 ? u.padded : u.shard) * size_of(master_dtype);
            }
        }
        m.gathered_now = gathered_now_;
        m.gathered_peak = gathered_peak_;
        m.live_units_peak = live_peak_;
        return m;
    }
    /// How many reductions may be pending before reduce_gradients waits for the
    /// oldest (each holds a full gradient at stages 2-3).
    static constexpr std::size_t reductions_in_flight = 2;

    /// Units gathered ahead of their gather() call so far.
    std::size_t prefetched() const noexcept {
        return prefetched_;
    }

    /// Throws `argument_error` naming this rank and `operation`.
    [[noreturn]] void fail(const std::string& operation, const std::string& detail) const {
        throw argument_error(comm_->rank(), "sharded_parameters " + operation, detail);
    }

private:
    enum class unit_state : std::uint8_t { sharded, gathering, gathered };

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
        std::size_t numel = 0, padded = 0, shard = 0;
        detail::flat_bytes full_param, shard_param, master, full_grad, shard_grad;
        detail::flat_bytes wire, wire_shard; // reduce-dtype copies while reducing
        std::optional<request_type> gather, reduce;
        unit_state state = unit_state::sharded;
        bool grad_touched = false;
        bool reduced = false; // reduce_gradients was called in this step
    };

    /// Completes the oldest pending reduction (waiting for it); with `write` false
    /// (after an earlier failure) only releases its buffers.
    void complete_front(bool write) {
        unit& u = units_[pending_.front()];
        pending_.pop_front();
        struct cleanup {
            sharded_parameters* self;
            unit& u;
            ~cleanup() {
                u.reduce.reset();
                u.wire.reset();
                u.wire_shard.reset();
                u.grad_touched = false;
                if constexpr (stage >= 2) {
                    self->drop_full_grad(u);
                }
            }
        } done{this, u};
        u.reduce->wait();
        if (write) {
            complete_reduction(u, 1.0 / static_cast<double>(comm_->size()));
        }
    }

    /// Completes the reductions that have finished, in order, and waits for the
    /// oldest ones until at most `keep` are pending.
    void progress(std::size_t keep) {
        while (!pending_.empty() &&
               (pending_.size() > keep || units_[pending_.front()].reduce->test())) {
            complete_front(true);
        }
    }

    void allocate(unit& u) {
        const std::size_t p = size_of(param_dtype);
        if constexpr (stage == 3) {
            u.shard_param = zeroed(u.shard * p);
        } else {
            u.full_param = zeroed(u.padded * p);
            u.state = unit_state::gathered;
        }
        if constexpr (has_master) {
            u.master = zeroed((stage == 0 ? u.padded : u.shard) * size_of(master_dtype));
        }
        if constexpr (stage <= 1) {
            u.full_grad = zeroed(u.padded * p);
        } else {
            u.shard_grad = zeroed(u.shard * p);
        }
    }

    detail::flat_bytes zeroed(std::size_t bytes) const {
        detail::flat_bytes b(bytes, place_.where);
        detail::place_zero(place_, b.data(), dtype::u8, bytes);
        return b;
    }

    std::byte* param_base(unit& u) const noexcept {
        return stage == 3 ? u.shard_param.data() : u.full_param.data();
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
        detail::place_from_host(place_, to, staging.data(), staging.size());
    }

    void launch_gather(unit& u) {
        u.full_param = detail::flat_bytes(u.padded * size_of(param_dtype), place_.where);
        fence_.order(place_, shard_comm(), "sharded_parameters gather");
        u.gather = all_gather_async(
            shard_comm(), const_buffer(u.shard_param.data(), u.shard, param_dtype, place_.where),
            buffer{u.full_param.data(), u.padded, param_dtype, place_.where});
        u.state = unit_state::gathering;
        gathered_now_ += u.full_param.size();
        ++live_;
        track_peak();
    }

    void track_peak() {
        gathered_peak_ = std::max(gathered_peak_, gathered_now_);
        live_peak_ = std::max(live_peak_, live_);
    }

    void gradient_storage(unit& u) {
        u.full_grad = detail::flat_bytes(u.padded * size_of(param_dtype), place_.where);
        detail::place_zero(place_, u.full_grad.data(), param_dtype, u.padded);
        gathered_now_ += u.full_grad.size();
        track_peak();
    }

    void drop_full_grad(unit& u) {
        if (u.full_grad) {
            gathered_now_ -= u.full_grad.size();
            u.full_grad.reset();
        }
    }

    /// After the unit's collective: the replica all-reduce (hybrid), then the average
    /// written, in the parameter dtype, where partition_of() points.
    void complete_reduction(unit& u, double scale) {
        if constexpr (stage == 0) {
            detail::place_scale_cast(place_, u.full_grad.data(), param_dtype,
                                     reduce_dtype != param_dtype ? u.wire.data()
                                                                 : u.full_grad.data(),
                                     reduce_dtype, u.padded, scale);
        } else if constexpr (stage == 1) {
            const std::size_t at = static_cast<std::size_t>(shard_rank()) * u.shard;
            const std::byte* src =
                (reduce_dtype != param_dtype ? u.wire.data() : u.full_grad.data()) +
                at * size_of(reduce_dtype);
            detail::place_scale_cast(place_, u.full_grad.data() + at * size_of(param_dtype),
                                     param_dtype, src, reduce_dtype, u.shard, scale);
        } else {
            std::byte* got =
                reduce_dtype != param_dtype ? u.wire_shard.data() : u.shard_grad.data();
            if constexpr (config::hybrid) {
                all_reduce(*replica_own_, buffer{got, u.shard, reduce_dtype, place_.where});
            }
            detail::place_scale_cast(place_, u.shard_grad.data(), param_dtype, got, reduce_dtype,
                                     u.shard, scale);
        }
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
        std::uint64_t layout = detail::fnv1a64_offset;
        for (const unit& u : units_) {
            const std::uint64_t n[2] = {u.last - u.first, u.numel};
            layout = detail::fnv1a64(n, sizeof n, layout);
        }
        for (const entry& e : entries_) {
            layout = detail::fnv1a64(e.name.data(), e.name.size(), layout);
            layout = detail::fnv1a64(&e.numel, sizeof e.numel, layout);
        }
        const std::size_t n = entries_.size();
        // (as int64: the collectives carry signed 64-bit integers)
        std::vector<std::int64_t> mine(2 + n);
        mine[0] = static_cast<std::int64_t>(n);
        mine[1] = static_cast<std::int64_t>(layout);
        for (std::size_t i = 0; i < n; ++i) {
            mine[2 + i] =
                static_cast<std::int64_t>(entries_[i].initialized ? entries_[i].init_hash : 0);
        }
        // Sizes first (a rank with a different parameter count would otherwise
        // call the second all_gather with another count).
        std::vector<std::int64_t> heads(2 * static_cast<std::size_t>(comm_->size()));
        detail::control_all_gather(*comm_, std::span<const std::int64_t>(mine.data(), 2),
                                   std::span<std::int64_t>(heads));
        for (int r = 0; r < comm_->size(); ++r) {
            const auto i = 2 * static_cast<std::size_t>(r);
            if (heads[i] != mine[0] || heads[i + 1] != mine[1]) {
                throw mismatch_error(comm_->rank(), "sharded_parameters start",
                                     "rank " + std::to_string(r) + " added " +
                                         std::to_string(heads[i]) + " parameters" +
                                         (heads[i] == mine[0] ? " with other names or sizes" : "") +
                                         ", this rank " + std::to_string(mine[0]) +
                                         ": every rank must add the same units in the same order",
                                     r, "parameters");
            }
        }
        std::vector<std::int64_t> all((2 + n) * static_cast<std::size_t>(comm_->size()));
        detail::control_all_gather(*comm_, std::span<const std::int64_t>(mine),
                                   std::span<std::int64_t>(all));
        for (int r = 0; r < comm_->size(); ++r) {
            for (std::size_t i = 0; i < n; ++i) {
                if (all[static_cast<std::size_t>(r) * (2 + n) + 2 + i] != mine[2 + i]) {
                    throw mismatch_error(comm_->rank(), "sharded_parameters start",
                                         "parameter '" + entries_[i].name +
                                             "' was set to other initial values on rank " +
                                             std::to_string(r) +
                                             ": every rank must pass the same values to "
                                             "set_parameter (initialize with the same seed)",
                                         r, "values");
                }
            }
        }
    }

    C* comm_;
    detail::placement place_;
    detail::stream_fence fence_;
    std::optional<C> shard_own_, replica_own_;
    std::vector<entry> entries_;
    std::vector<unit> units_;
    std::deque<std::size_t> pending_; // units whose reduction is in flight, oldest first
    std::size_t gathered_now_ = 0, gathered_peak_ = 0, prefetched_ = 0;
    int live_ = 0, live_peak_ = 0;
    bool started_ = false;
};

} // namespace UNISON_TU_ABI

} // namespace unison
