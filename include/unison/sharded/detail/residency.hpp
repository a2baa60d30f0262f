#pragma once

/// \file
/// Where a unit's parameters and gradients live between their uses, one type per
/// way, each owning its per-unit state and its steps. A strategy
/// (sharded/detail/strategy.hpp) names one of each; `sharded_parameters` holds
/// them and keeps the scheduling (the live-unit limit, the pending reductions, the
/// collective fingerprint, the trace of reductions).
///
/// Parameters:
/// - `replicated_parameters` (ZeRO-0): the full parameters resident; every rank
///   updates all of them, so nothing moves after the step.
/// - `published_parameters` (ZeRO-1, -2): the full parameters resident; each rank
///   updates its shard and `publish` all-gathers them in place after the step.
/// - `gathered_parameters<Reshard>` (ZeRO-3, FSDP): only the shard resident; a
///   unit's full parameters are all-gathered into a fresh buffer by `launch`,
///   waited for by `wait` and freed by `release` (after forward only with
///   `Reshard`).
///
/// The parameter types are templates over the communicator's request type (the
/// gathered one keeps each unit's gather in flight).
///
/// Gradients:
/// - `full_gradients` (ZeRO-0, -1): the full gradients resident; a unit is reduced
///   once per accumulation window.
/// - `sharded_gradients` (ZeRO-2, -3, FSDP): only the shard resident; the full
///   gradient exists from its first write in backward until its reduction
///   completes, and a unit reduced again in the window adds to its shard.

#include "unison/comm/collectives.hpp"
#include "unison/comm/communicator.hpp"
#include "unison/core/dtype.hpp"
#include "unison/core/timeline.hpp"
#include "unison/parallel/detail/placement.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace unison::detail {

/// The flat memory of one unit. Which buffers exist depends on the strategy.
struct unit_memory {
    std::size_t numel = 0;  ///< the parameters' elements
    std::size_t padded = 0; ///< numel rounded up to a multiple of the shard group size
    std::size_t shard = 0;  ///< padded / shard group size
    flat_buffer full_param, shard_param, master, full_grad, shard_grad;
    flat_buffer wire, wire_shard; ///< reduce-dtype copies while reducing
};

/// The dtypes a unit is kept in (from the precision policy).
struct unit_dtypes {
    dtype param = dtype::f32;
    dtype reduce = dtype::f32;
    dtype master = dtype::f32;
    bool has_master = false; ///< a master copy exists (master differs from param)
};

/// What a strategy's operations work on: one unit, its dtypes and placement, and
/// this rank's place in the shard group.
struct unit_context {
    unit_memory& u;
    const unit_dtypes& types;
    const placement& place;
    int shard_rank = 0;
    int tag = 0; ///< the unit's collective tag
    /// The gradient partition holds earlier micro-batches' reduced gradients: the
    /// new reduction is added to them (only where gradients are sharded; see
    /// sharded_parameters::reduce_gradients).
    bool accumulate = false;
};

/// Submits `call` with `tag` (the unit, plus one): call matching compares it across
/// ranks (collective_call::tag).
template <class C>
typename C::request_type submit_tagged(C& comm, collective_call call, int tag) {
    call.tag = tag;
    log(log_level::debug, comm.rank(),
        [&] { return unison::detail::describe_call(call, comm.size(), false); });
    return comm.submit(call);
}

inline flat_buffer zeroed_buffer(std::size_t bytes, const placement& p) {
    flat_buffer b(bytes, p);
    p.zero(b.data(), dtype::u8, bytes);
    return b;
}

/// The transient full copies (gathered parameters, full gradients awaiting their
/// reduction) this rank holds now and at most, and the units gathered at once.
struct transient_memory {
    std::size_t now = 0, peak = 0;
    int live = 0, live_peak = 0;

    void add(std::size_t bytes) noexcept {
        now += bytes;
        peak = std::max(peak, now);
    }
    void remove(std::size_t bytes) noexcept { now -= bytes; }
    void add_live() noexcept {
        ++live;
        live_peak = std::max(live_peak, live);
    }
    void remove_live() noexcept { --live; }
};

/// One unit's span on the timeline's fsdp lane (core/timeline.hpp): `what` is
/// "gather" or "reduce"; `id` is 0 while none is open.
struct unit_span {
    std::uint64_t id = 0;

    void begin(int rank, const char* what, std::size_t k, std::size_t elements,
               std::string_view layout) {
        if (!timeline::enabled()) {
            return;
        }
        id = timeline::next_id(rank);
        timeline::begin(rank, timeline::lane::fsdp, "fsdp", name(what, k), id,
                        "\"unit\":" + std::to_string(k) +
                            ",\"elements\":" + std::to_string(elements) + ",\"layout\":\"" +
                            std::string(layout) + "\"");
    }
    /// `outcome`: why it ended without completing ("error", "destroyed"), or null.
    void end(int rank, const char* what, std::size_t k, const char* outcome = nullptr) {
        if (!timeline::enabled() || id == 0) {
            return;
        }
        timeline::end(rank, timeline::lane::fsdp, "fsdp", name(what, k), id,
                      outcome != nullptr ? "\"outcome\":\"" + std::string(outcome) + "\""
                                         : std::string());
        id = 0;
    }

private:
    static std::string name(const char* what, std::size_t k) {
        return std::string(what) + " unit " + std::to_string(k);
    }
};

// ---------------------------------------------------------------- parameters

/// The memory of resident full parameters.
struct resident_parameter_memory {
    static constexpr bool sharded = false;
    /// Elements resident per unit (of its padded size).
    static std::size_t held_count(const unit_memory& u) noexcept { return u.padded; }
    /// The resident elements (of an element range type): the whole unit.
    template <class Range>
    static Range held_range(const unit_memory& u, Range) noexcept {
        return Range{0, u.padded};
    }
    static std::byte* held(unit_memory& u) noexcept { return u.full_param.data(); }
    static void allocate(const unit_context& c) {
        c.u.full_param = zeroed_buffer(c.u.padded * size_of(c.types.param), c.place);
    }
};

/// The memory of a resident parameter shard.
struct sharded_parameter_memory {
    static constexpr bool sharded = true;
    static std::size_t held_count(const unit_memory& u) noexcept { return u.shard; }
    /// The resident elements: this rank's shard, `owned`.
    template <class Range>
    static Range held_range(const unit_memory&, Range owned) noexcept {
        return owned;
    }
    static std::byte* held(unit_memory& u) noexcept { return u.shard_param.data(); }
    static void allocate(const unit_context& c) {
        c.u.shard_param = zeroed_buffer(c.u.shard * size_of(c.types.param), c.place);
    }
};

/// What the two resident parameter types share: the full parameters are always
/// there, so gathering, waiting and releasing do nothing.
template <class Request>
struct resident_parameters : resident_parameter_memory {
    void add_unit() {}
    void remove_last_unit() noexcept {}
    bool gathered(std::size_t) const noexcept { return true; }
    template <class Comm>
    void launch(std::size_t, const unit_context&, Comm&, transient_memory&, int, std::string_view) {
    }
    void wait(std::size_t, int) {}
    /// Returns whether it freed the unit's full parameters: never.
    bool release(std::size_t, bool, unit_memory&, transient_memory&, int) { return false; }
    /// The units whose gathered parameters are alive ("0, 3"): none.
    std::string live_units() const { return {}; }
    void close_span(std::size_t, int) noexcept {}
};

/// ZeRO-0: every rank updates the whole unit; nothing to publish.
template <class Request>
struct replicated_parameters : resident_parameters<Request> {
    template <class Comm, class Context, class Record>
    void publish(Comm&, const placement&, std::size_t, Context, Record) {}
};

/// ZeRO-1 and -2: each rank updates its shard of the resident full parameters;
/// `publish` all-gathers the shards in place so every rank holds them all.
template <class Request>
struct published_parameters : resident_parameters<Request> {
    /// `context(k)`: unit k's unit_context; `record(k)` is called for each unit's
    /// all-gather once submitted. Waits for all of them.
    template <class Comm, class Context, class Record>
    void publish(Comm& comm, const placement& place, std::size_t units, Context context,
                 Record record) {
        std::vector<Request> requests;
        requests.reserve(units);
        place.order_before(comm.inner(), "sharded_parameters publish_parameters");
        for (std::size_t k = 0; k < units; ++k) {
            const unit_context c = context(k);
            const auto s = site(comm.inner(), operation::all_gather);
            const buffer whole{c.u.full_param.data(), c.u.padded, c.types.param, c.place.where()};
            requests.push_back(
                submit_tagged(comm, all_gather_call(s, block_of(s, whole), whole, true), c.tag));
            record(k);
        }
        wait_all(std::span<Request>(requests));
    }
};

/// ZeRO-3 and FSDP: the shard resident, the full parameters gathered around their
/// use. `Reshard`: a forward release frees them (else only a backward one).
template <class Request, bool Reshard>
class gathered_parameters : public sharded_parameter_memory {
public:
    void add_unit() { units_.emplace_back(); }
    /// Undoes add_unit (the unit it was for could not be added).
    void remove_last_unit() noexcept { units_.pop_back(); }

    /// Whether unit k's full parameters are available or being gathered.
    bool gathered(std::size_t k) const noexcept { return units_[k].state != phase::sharded; }

    /// Starts the all-gather of unit k's shard into a fresh full buffer (the caller
    /// has checked that it is not gathered and the live-unit limit). `rank`: this
    /// rank in the whole job, whose timeline the span goes on (`comm` may be a
    /// hybrid shard group, with ranks of its own).
    template <class Comm>
    void launch(std::size_t k, const unit_context& c, Comm& comm, transient_memory& memory,
                int rank, std::string_view layout) {
        slot& s = units_[k];
        c.u.full_param = flat_buffer(c.u.padded * size_of(c.types.param), c.place);
        c.place.order_before(comm.inner(), "sharded_parameters gather");
        s.gather = submit_tagged(
            comm,
            all_gather_call(
                site(comm.inner(), operation::all_gather),
                const_buffer(c.u.shard_param.data(), c.u.shard, c.types.param, c.place.where()),
                buffer{c.u.full_param.data(), c.u.padded, c.types.param, c.place.where()}, false),
            c.tag);
        s.span.begin(rank, "gather", k, c.u.padded, layout);
        s.state = phase::gathering;
        memory.add(c.u.full_param.size());
        memory.add_live();
    }

    /// Waits for unit k's gather if one is in flight.
    void wait(std::size_t k, int rank) {
        slot& s = units_[k];
        if (s.gather) {
            s.gather->wait();
            s.gather.reset();
            s.state = phase::gathered;
            s.span.end(rank, "gather", k);
        }
    }

    /// Frees unit k's full parameters if they are gathered, unless this is the
    /// release after `forward` and the strategy keeps them for backward; returns
    /// whether it freed them.
    bool release(std::size_t k, bool forward, unit_memory& u, transient_memory& memory, int rank) {
        if (forward && !Reshard) {
            return false;
        }
        slot& s = units_[k];
        if (s.state == phase::sharded) {
            return false;
        }
        if (s.gather) {
            s.gather->wait();
            s.gather.reset();
            s.span.end(rank, "gather", k);
        }
        memory.remove(u.full_param.size());
        u.full_param.reset();
        s.state = phase::sharded;
        memory.remove_live();
        if (timeline::enabled()) {
            timeline::instant(rank, timeline::lane::fsdp, "fsdp",
                              "release unit " + std::to_string(k));
        }
        return true;
    }

    std::string live_units() const {
        std::string alive;
        for (std::size_t k = 0; k < units_.size(); ++k) {
            if (units_[k].state != phase::sharded) {
                alive += (alive.empty() ? "" : ", ") + std::to_string(k);
            }
        }
        return alive;
    }

    /// Ends unit k's gather span if one is open (the engine is going away).
    void close_span(std::size_t k, int rank) noexcept {
        try {
            units_[k].span.end(rank, "gather", k, "destroyed");
        } catch (...) {
        }
    }

    template <class Comm, class Context, class Record>
    void publish(Comm&, const placement&, std::size_t, Context, Record) {}

private:
    enum class phase : std::uint8_t { sharded, gathering, gathered };
    struct slot {
        phase state = phase::sharded;
        std::optional<Request> gather;
        unit_span span;
    };
    std::vector<slot> units_;
};

// ----------------------------------------------------------------- gradients

/// ZeRO-0 and -1: the full gradients resident for the whole run.
struct full_gradients {
    static constexpr bool sharded = false;
    /// A unit may be reduced once per accumulation window: a second reduction
    /// would add an average to the next local sum.
    static constexpr bool adds_repeated_reductions = false;
    static std::size_t held_count(const unit_memory& u) noexcept { return u.padded; }
    static void allocate(const unit_context& c) {
        c.u.full_grad = zeroed_buffer(c.u.padded * size_of(c.types.param), c.place);
    }
    /// Where the averaged gradients of the elements from `update_begin` are.
    static std::byte* partition(unit_memory& u, std::size_t update_begin, dtype param) noexcept {
        return u.full_grad.data() + update_begin * size_of(param);
    }
    static void zero(const unit_context& c, transient_memory&) {
        c.place.zero(c.u.full_grad.data(), c.types.param, c.u.padded);
    }
    /// After a unit's reduction completed (or failed): the full gradient stays.
    static void reduced(unit_memory&, transient_memory&) noexcept {}
};

/// ZeRO-2, -3 and FSDP: the gradient shard resident; the full gradient transient.
struct sharded_gradients {
    static constexpr bool sharded = true;
    static constexpr bool adds_repeated_reductions = true;
    static std::size_t held_count(const unit_memory& u) noexcept { return u.shard; }
    static void allocate(const unit_context& c) {
        c.u.shard_grad = zeroed_buffer(c.u.shard * size_of(c.types.param), c.place);
    }
    static std::byte* partition(unit_memory& u, std::size_t, dtype) noexcept {
        return u.shard_grad.data();
    }
    static void zero(const unit_context& c, transient_memory& memory) {
        c.place.zero(c.u.shard_grad.data(), c.types.param, c.u.shard);
        reduced(c.u, memory);
    }
    /// Frees the full gradient once its reduction has consumed it.
    static void reduced(unit_memory& u, transient_memory& memory) noexcept {
        if (u.full_grad) {
            memory.remove(u.full_grad.size());
            u.full_grad.reset();
        }
    }
};

} // namespace unison::detail
