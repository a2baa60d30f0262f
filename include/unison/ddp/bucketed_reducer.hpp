#pragma once

/// \file
/// `bucketed_reducer`: gradient synchronization for data parallelism, overlapped
/// with backward.
///
/// The framework registers its gradient tensors once (`add`), calls `start()`, and
/// then, every step, calls `mark_ready(i)` from the backward hook of gradient `i`
/// and `finish()` after backward. Gradients are grouped into buckets (default
/// 25 MiB, the first 1 MiB); a bucket's all-reduce is launched, non-blocking, as
/// soon as all its gradients are ready, so communication overlaps the rest of
/// backward. Buckets launch strictly in bucket order on every rank, whatever order
/// the gradients become ready in, so the collectives match across ranks. `finish()`
/// completes the reductions and leaves the averaged gradients in place.
///
/// The first layout follows the reverse of registration (backward visits the last
/// layers first). After the first synchronizing step the buckets are rebuilt once
/// from the order gradients actually became ready on rank 0, broadcast so every
/// rank builds the same buckets.
///
/// Gradients on a CUDA device (all on one device; `unison::cuda::use_device(reducer,
/// dev, compute)` from a CUDA translation unit installs the kernels, see
/// parallel/device.cuh) are packed by one multi-tensor kernel per bucket on the
/// compute stream once the bucket is complete; the reduction runs on the
/// communicator's stream (NCCL's, or the thread backend's device stream), ordered
/// after the pack by an event; `finish()` waits for each reduction (bounded by the
/// communicator's timeout) and unpacks with one kernel per bucket on the compute
/// stream. Work enqueued on the compute stream after `finish()` sees the averaged
/// gradients. A device gradient is read when its bucket is packed (at the
/// mark_ready that completes the bucket, or in finish()), not at its own
/// mark_ready: leave it unchanged until finish() returns. The same holds for
/// gradients in buckets (policy::gradients_in_buckets), on the host too: their
/// zero contributions and pre-division are written when the bucket launches.
///
/// How a bucket's values move (copied in and out, reduced in place between the
/// gradients, held in the bucket, packed by kernels) is the data path, one type
/// each in ddp/detail/paths/, chosen at start() (`data_path()`).
///
/// Every collective the reducer makes carries its count of backward passes (finish()
/// calls) as the call's step (collective_call::step), so where calls are matched a
/// rank whose passes ran ahead of the others' is a mismatch_error on its next
/// reduction. A whole step skipped on one rank leaves no trace in that count; give
/// the reducer a stepped_communicator and set the loop's index on it to catch that
/// too (see comm/stepped_communicator.hpp).
///
/// Not thread-safe: call `mark_ready` and `finish` from one thread at a time.

#include "unison/comm/collectives.hpp"
#include "unison/comm/communicator.hpp"
#include "unison/comm/stepped_communicator.hpp"
#include "unison/core/detail/convert.hpp"
#include "unison/core/detail/hash.hpp"
#include "unison/core/error.hpp"
#include "unison/core/tensor.hpp"
#include "unison/core/timeline.hpp"
#include "unison/ddp/detail/bucket_plan.hpp"
#include "unison/ddp/detail/config.hpp"
#include "unison/ddp/detail/paths/coalesced.hpp"
#include "unison/ddp/detail/paths/device_packed.hpp"
#include "unison/ddp/detail/paths/in_buckets.hpp"
#include "unison/ddp/detail/paths/packed.hpp"
#include "unison/ddp/detail/paths/path.hpp"
#include "unison/ddp/hooks.hpp"
#include "unison/ddp/options.hpp"
#include "unison/ddp/policies.hpp"
#include "unison/parallel/detail/control.hpp"
#include "unison/parallel/detail/placement.hpp"

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

namespace unison {

/// Buckets gradients and all-reduces them while backward runs. `C` is any
/// communicator; `Policies` come from unison::policy (see ddp/policies.hpp), the
/// numbers from `ddp_options`.
template <communicator C, class... Policies>
class bucketed_reducer {
public:
    using config = detail::ddp_config<Policies...>;
    using hook_type = typename config::hook;
    using request_type = typename C::request_type;
    /// What the reducer's collectives go through: `C` with the pass count stamped.
    using step_communicator_type = stepped_communicator<C>;
    static_assert(bucket_hook<hook_type, step_communicator_type>,
                  "unison DDP: the comm_hook's type needs `request_type launch(C&, const "
                  "bucket_ref&)` for any communicator C, returning C's request (see "
                  "ddp/hooks.hpp)");

    /// The reducer keeps a reference to `comm`, which must outlive it.
    explicit bucketed_reducer(C& comm, ddp_options options = {}, hook_type hook = {})
        : comm_(&comm), stamped_(comm), options_(options), hook_(std::move(hook)) {
        options_.validate(comm.rank(), "bucketed_reducer");
    }

    bucketed_reducer(const bucketed_reducer&) = delete;
    bucketed_reducer& operator=(const bucketed_reducer&) = delete;
    /// Waits for any reduction still in flight (the request destructors wait).
    ~bucketed_reducer() = default;

    // ----------------------------------------------------------- registration

    /// Registers a gradient (floating point; host memory, or one CUDA device for all
    /// gradients) and returns its index, the `i` of `mark_ready(i)`. Every rank
    /// registers the same gradients in the same order (`start()` checks). With
    /// `gradients_in_buckets`, `grad`'s values are copied into the bucket at `start()` and from
    /// then on `gradient(i)` is the gradient; otherwise `grad` must stay valid (see `rebind`).
    template <writable_tensor G>
    std::size_t add(G&& grad, std::string name = {}) {
        const buffer b = as_buffer(grad);
        const std::size_t index = entries_.size();
        if (name.empty()) {
            name = "#" + std::to_string(index);
        }
        if (started_) {
            fail("add", "gradient '" + name + "' registered after start()");
        }
        if (!is_floating(b.type)) {
            fail("add", "gradient '" + name + "' has dtype " + std::string(to_string(b.type)) +
                            "; gradients are floating point (f64, f32, f16, bf16)");
        }
        if constexpr (!config::own_dtype) {
            if (b.type != config::precision::param) {
                fail("add", "gradient '" + name + "' is " + std::string(to_string(b.type)) +
                                " but mixed_precision says parameters and gradients are " +
                                std::string(to_string(config::precision::param)));
            }
        }
        if (!entries_.empty() && b.location != entries_.front().grad.location) {
            fail("add", "gradient '" + name + "' is on " + to_string(b.location) + " and '" +
                            entries_.front().name + "' on " +
                            to_string(entries_.front().grad.location) +
                            ": one reducer's gradients live on one device");
        }
        if (b.count != 0 && b.data == nullptr) {
            fail("add", "gradient '" + name + "' has " + std::to_string(b.count) +
                            " elements but no storage");
        }
        const dtype bucket_type = bucket_dtype(b.type);
        entries_.push_back(entry{b, std::move(name), bucket_type});
        return index;
    }

    /// Points gradient `i` at new storage of the same size and dtype (a framework
    /// that reallocates its gradients). Not during a step in which `i` is ready.
    template <writable_tensor G>
    void rebind(std::size_t i, G&& grad) {
        entry& e = at(i, "rebind");
        const buffer b = as_buffer(grad);
        if (b.count != e.grad.count || b.type != e.grad.type || b.location != e.grad.location) {
            fail("rebind", "gradient '" + e.name + "' rebound to " + std::to_string(b.count) + " " +
                               std::string(to_string(b.type)) + " elements on " +
                               to_string(b.location) + "; it has " + std::to_string(e.grad.count) +
                               " " + std::string(to_string(e.grad.type)) + " on " +
                               to_string(e.grad.location));
        }
        if (e.ready) {
            fail("rebind", "gradient '" + e.name + "' rebound while its reduction is in flight");
        }
        const buffer before = e.grad;
        e.grad = b;
        if (started_) {
            try {
                on_path([&](auto& p) { p.rebound(state(), e); });
            } catch (...) { // the device path's new copy tables: as it was
                e.grad = before;
                throw;
            }
        }
    }

    /// Freezes the registration, checks that every rank registered the same
    /// gradients (count and dtype, in order) and builds the first buckets.
    /// Collective: every rank calls it.
    void start() {
        if (started_) {
            fail("start", "start() called twice");
        }
        check_placement();
        verify_layout();
        path_ = choose_path();
        std::vector<std::size_t> order(entries_.size());
        for (std::size_t k = 0; k < order.size(); ++k) {
            order[k] = order.size() - 1 - k;
        }
        build(order);
        started_ = true;
    }

    /// For `unison::cuda::use_device` (parallel/device.cuh): device gradients are
    /// packed, cast and unpacked by kernels on the installer's compute stream.
    /// Before start().
    template <class Installer>
    void install_device(Installer& installer) {
        if (started_) {
            fail("use_device", "the reducer is started already; place it before start()");
        }
        place_ = detail::placement{installer.ops()};
    }

    // ----------------------------------------------------------------- a step

    /// Gradient `i` is final for this backward pass. Hands it to the data path
    /// (which copies it into its bucket where buckets hold copies of host
    /// gradients) and, once its bucket (and every bucket before it) is complete,
    /// launches the bucket's reduction. On a micro-batch that only accumulates,
    /// only records it.
    void mark_ready(std::size_t i) {
        require_started("mark_ready");
        entry& e = at(i, "mark_ready");
        if (e.ready) {
            fail("mark_ready",
                 "gradient '" + e.name +
                     "' marked ready twice without finish() in between: "
                     "call finish() after every backward" +
                     (options_.accumulate_steps > 1
                          ? " (with accumulate_steps = " +
                                std::to_string(options_.accumulate_steps) +
                                ", every micro-batch's; the last one of each window synchronizes)"
                          : std::string()));
        }
        if (!sync_step()) {
            e.ready = true;
            return;
        }
        make_ready(i, /*zero=*/false);
        launch_ready_buckets();
        poll();
    }

    /// This rank contributes zero for every gradient not yet marked ready in this
    /// step (a rank without data in a `join`ed loop). Launches what becomes ready.
    void contribute_zero() {
        require_started("contribute_zero");
        if (!sync_step()) {
            return;
        }
        for (std::size_t i = 0; i < entries_.size(); ++i) {
            if (!entries_[i].ready) {
                make_ready(i, /*zero=*/true);
            }
        }
        launch_ready_buckets();
    }

    /// Ends a backward pass; call it after every one. On a synchronizing step (every
    /// step, or the last micro-batch of each accumulate_steps window): gradients never
    /// marked ready count as zero (with `unused_is_error`, an error naming them after
    /// the reductions completed), every bucket is waited for and the averaged
    /// gradients are written back; returns true. On a micro-batch that only
    /// accumulates returns false at once: step the optimizer only after true
    /// (ignoring it would step on this rank's unsynchronized gradients).
    [[nodiscard]] bool finish() {
        require_started("finish");
        struct count_pass { // also when the pass throws: every rank counts it
            step_communicator_type& c;
            ~count_pass() { c.set_step(c.step() + 1); }
        } counted{stamped_};
        if (!sync_step()) {
            for (entry& e : entries_) {
                e.ready = false;
            }
            ++micro_step_;
            return false;
        }
        std::vector<std::size_t> unused;
        for (std::size_t i = 0; i < entries_.size(); ++i) {
            if (!entries_[i].ready) {
                unused.push_back(i);
                make_ready(i, /*zero=*/true);
            }
        }
        std::exception_ptr failure;
        try {
            launch_ready_buckets();
        } catch (...) {
            failure = std::current_exception();
        }
        const detail::step_scales scales = this_step();
        for (std::size_t k = 0; k < buckets_.size(); ++k) {
            if (!requests_[k]) {
                continue;
            }
            try {
                requests_[k]->wait();
                if (!failure) {
                    if constexpr (detail::completing_hook<hook_type>) {
                        hook_.complete(ref(k));
                    }
                    on_path([&](auto& p) { p.finish(state(), k, scales); });
                }
                trace_bucket(k, 'e', failure ? "not unpacked" : nullptr);
            } catch (...) {
                trace_bucket(k, 'e', "error");
                if (!failure) {
                    failure = std::current_exception();
                }
            }
        }
        reset_step();
        if (failure) {
            std::rethrow_exception(failure);
        }
        if (!rebuilt_) {
            rebuild();
        }
        if (config::unused::error && !unused.empty()) {
            std::string names;
            for (std::size_t i : unused) {
                names += (names.empty() ? "'" : ", '") + entries_[i].name + "'";
            }
            fail("finish", "no gradient for " + names +
                               " in this step (reduced as zero); with unused_is_error every "
                               "registered parameter must take part in every step");
        }
        return true;
    }

    /// Divide by the number of ranks that contributed data in the next synchronizing
    /// step instead of by size() (`join` sets it; it resets after the step).
    void set_contributing_ranks(int n) {
        if (n < 1 || n > comm_->size()) {
            fail("set_contributing_ranks",
                 std::to_string(n) + " contributing ranks out of " + std::to_string(comm_->size()));
        }
        contributing_ = n;
    }

    // ---------------------------------------------------------------- queries

    /// Whether the current micro-batch synchronizes (the last of each window).
    bool sync_step() const noexcept { return micro_step_ + 1 >= options_.accumulate_steps; }
    /// What the reduced sum is divided by in the next synchronizing step: the
    /// contributing ranks when averaging, 1 for a plain sum.
    double averaging_divisor() const noexcept {
        if (!options_.average) {
            return 1.0;
        }
        return static_cast<double>(contributing_ > 0 ? contributing_ : comm_->size());
    }

    /// With `gradients_in_buckets`: gradient `i`, inside its bucket. Views change when
    /// the buckets are rebuilt after the first synchronizing step (`layout_version()`
    /// changes; the values are carried over), so fetch them again then.
    template <element T>
    view<T> gradient(std::size_t i) {
        static_assert(config::gradient_memory::in_buckets,
                      "bucketed_reducer::gradient: gradients live in buckets only with "
                      "policy::gradients_in_buckets");
        require_started("gradient");
        entry& e = at(i, "gradient");
        if (dtype_of<T> != e.bucket_type) {
            fail("gradient", "gradient '" + e.name + "' is " +
                                 std::string(to_string(e.bucket_type)) + ", asked for " +
                                 std::string(to_string(dtype_of<T>)));
        }
        return view<T>{reinterpret_cast<T*>(slot(e)), e.grad.count, e.grad.location};
    }
    /// Bumped whenever bucket memory moves (at the rebuild).
    std::uint64_t layout_version() const noexcept { return layout_version_; }
    /// Whether the buckets were rebuilt from the observed ready order yet.
    bool rebuilt() const noexcept { return rebuilt_; }

    /// Registration indices per bucket, in launch order.
    std::vector<std::vector<std::size_t>> bucket_layout() const {
        std::vector<std::vector<std::size_t>> layout;
        for (const detail::reducer_bucket& b : buckets_) {
            layout.push_back(b.members);
        }
        return layout;
    }
    std::size_t bucket_count() const noexcept { return buckets_.size(); }
    std::size_t gradient_count() const noexcept { return entries_.size(); }
    /// Gradient `i`'s name.
    const std::string& name(std::size_t i) const { return entries_.at(i).name; }

    const ddp_options& options() const noexcept { return options_; }
    hook_type& hook() noexcept { return hook_; }
    C& communicator() noexcept { return *comm_; }
    /// `communicator()` with this reducer's pass count stamped on each call: what
    /// the hooks get, and what collectives belonging to the current step (join's,
    /// ddp::broadcast_buffers) go through.
    step_communicator_type& step_communicator() noexcept { return stamped_; }
    /// Backward passes finished (finish() calls, accumulating ones included).
    std::uint64_t passes() const noexcept { return stamped_.step(); }

    /// How buckets move their values (ddp/detail/paths/); chosen by start(), and
    /// meaningless before it.
    reducer_path data_path() const noexcept {
        return std::visit([](const auto& p) { return p.kind; }, path_);
    }
    /// Whether the buckets reduce straight between the gradients, with no bucket
    /// memory and no copies in or out (ddp/detail/paths/coalesced.hpp); known after
    /// start().
    bool coalesced() const noexcept { return started_ && data_path() == reducer_path::coalesced; }

    /// Where the gradients live (host, or the CUDA device of all of them).
    device location() const noexcept {
        return entries_.empty() ? device::host() : entries_.front().grad.location;
    }
    /// Where the buckets live and device work runs (host unless use_device).
    const detail::placement& placement() const noexcept { return place_; }

private:
    /// Whether the coalesced path can be chosen (ddp/detail/paths/coalesced.hpp):
    /// copied gradients with the default hook, over a communicator that reduces
    /// pieces in place as one buffer (the thread and MPI backends).
    static constexpr bool coalescing = !config::gradient_memory::in_buckets &&
                                       std::is_same_v<hook_type, all_reduce_hook> &&
                                       reduces_coalesced<step_communicator_type>;
    /// The paths this reducer's policies and communicator allow; start() picks one.
    using path_type = std::conditional_t<
        config::gradient_memory::in_buckets, std::variant<detail::in_buckets_path>,
        std::conditional_t<
            coalescing,
            std::variant<detail::packed_path, detail::coalesced_path, detail::device_packed_path>,
            std::variant<detail::packed_path, detail::device_packed_path>>>;
    using entry = detail::reducer_entry;
    using bucket = detail::reducer_bucket;

    path_type choose_path() const {
        if constexpr (config::gradient_memory::in_buckets) {
            return detail::in_buckets_path{};
        } else {
            if (place_.on_device()) {
                return detail::device_packed_path{};
            }
            if constexpr (coalescing) {
                if (detail::coalesced_path::applies(entries_, place_)) {
                    return detail::coalesced_path{};
                }
            }
            return detail::packed_path{};
        }
    }
    template <class F>
    decltype(auto) on_path(F&& f) {
        return std::visit(std::forward<F>(f), path_);
    }
    detail::path_state state() const noexcept {
        return detail::path_state{entries_, buckets_, place_, location()};
    }
    detail::step_scales this_step() const noexcept {
        return detail::step_scales{pre_scale(), post_scale(), divides_by_size()};
    }

    /// The timeline (core/timeline.hpp): bucket `k` became ready, was launched, or
    /// was reduced and unpacked (`outcome`: how it ended otherwise).
    void trace_bucket(std::size_t k, char what, const char* outcome = nullptr) {
        if (!timeline::enabled()) {
            return;
        }
        bucket& b = buckets_[k];
        const int rank = comm_->rank();
        const std::string name = "bucket " + std::to_string(k);
        if (what == 'r') {
            timeline::instant(rank, timeline::lane::ddp, "ddp", name + " ready");
        } else if (what == 'b') {
            b.trace_id = timeline::next_id(rank);
            timeline::begin(rank, timeline::lane::ddp, "ddp", name, b.trace_id,
                            "\"bucket\":" + std::to_string(k) +
                                ",\"bytes\":" + std::to_string(b.count * size_of(b.type)) +
                                ",\"gradients\":" + std::to_string(b.members.size()) +
                                ",\"dtype\":\"" + std::string(to_string(b.type)) + "\"");
        } else if (b.trace_id != 0) {
            timeline::end(rank, timeline::lane::ddp, "ddp", name, b.trace_id,
                          outcome != nullptr ? "\"outcome\":\"" + std::string(outcome) + "\""
                                             : std::string());
            b.trace_id = 0;
        }
    }

    static dtype bucket_dtype(dtype grad_type) noexcept {
        if constexpr (config::own_dtype) {
            return grad_type;
        } else {
            return config::precision::reduce;
        }
    }

    [[noreturn]] void fail(const char* what, const std::string& detail) const {
        throw argument_error(comm_->rank(), std::string("bucketed_reducer ") + what, detail);
    }
    void require_started(const char* what) const {
        if (!started_) {
            fail(what, "call start() after registering the gradients");
        }
    }
    entry& at(std::size_t i, const char* what) {
        if (i >= entries_.size()) {
            fail(what, "gradient index " + std::to_string(i) + " out of range (" +
                           std::to_string(entries_.size()) + " registered)");
        }
        return entries_[i];
    }
    std::byte* memory(std::size_t k) const {
        return std::visit([k](const auto& p) { return p.memory(k); }, path_);
    }
    std::byte* slot(const entry& e) const { return detail::slot(memory(e.bucket), e); }
    bucket_ref ref(std::size_t k) const { return detail::bucket_view(state(), k, memory(k)); }

    /// Device gradients need the device kernels, on their own device; host ones none.
    void check_placement() const {
        const device at = location();
        if (at.is_cuda() && !place_.on_device()) {
            fail("start",
                 "the gradients are on " + to_string(at) +
                     ": install the device kernels first with "
                     "unison::cuda::use_device(reducer, " +
                     std::to_string(at.index) +
                     ", stream) from a CUDA translation unit (unison/parallel/device.cuh)");
        }
        if (place_.on_device() && at != place_.where()) {
            fail("start", "use_device placed the reducer on " + to_string(place_.where()) +
                              " but the gradients are on " + to_string(at));
        }
    }

    double pre_scale() const noexcept { return 1.0 / options_.predivide_factor; }
    double post_scale() const noexcept { return options_.predivide_factor / averaging_divisor(); }

    void make_ready(std::size_t i, bool zero) {
        entry& e = entries_[i];
        e.ready = true;
        e.zero = zero;
        if (!rebuilt_) {
            ready_order_.push_back(i);
        }
        bucket& b = buckets_[e.bucket];
        b.any_zero = b.any_zero || zero;
        on_path([&](auto& p) { p.ready(state(), e, this_step()); });
        if (--b.pending == 0) {
            trace_bucket(e.bucket, 'r');
        }
    }

    void launch_ready_buckets() {
        while (next_launch_ < buckets_.size() && buckets_[next_launch_].pending == 0) {
            const std::size_t k = next_launch_++;
            trace_bucket(k, 'b');
            requests_[k] = on_path(
                [&](auto& p) { return p.launch(state(), k, stamped_, hook_, this_step()); });
        }
    }

    /// Whether this step's division after the sum is by the number of ranks alone,
    /// which a reduction with avg does in the same pass.
    bool divides_by_size() const noexcept {
        return options_.average && options_.predivide_factor == 1.0 &&
               averaging_divisor() == static_cast<double>(comm_->size());
    }

    /// Drives progress of the oldest reductions in flight (MPI progresses inside
    /// test()). A bucket whose launch threw has no request and is passed over.
    void poll() {
        while (next_poll_ < next_launch_ &&
               (!requests_[next_poll_] || requests_[next_poll_]->test())) {
            ++next_poll_;
        }
    }

    void reset_step() {
        for (entry& e : entries_) {
            e.ready = false;
            e.zero = false;
        }
        for (std::size_t k = 0; k < buckets_.size(); ++k) {
            trace_bucket(k, 'e', "dropped"); // only a span still open: none after finish
        }
        for (std::optional<request_type>& r : requests_) {
            r.reset();
        }
        for (bucket& b : buckets_) {
            b.pending = b.members.size();
            b.any_zero = false;
        }
        next_launch_ = 0;
        next_poll_ = 0;
        micro_step_ = 0;
        contributing_ = 0;
    }

    /// Lays the buckets out in `order` (no reduction in flight); the path takes
    /// memory for them, and where it holds the gradients, carries their values over.
    void build(const std::vector<std::size_t>& order) {
        std::vector<std::size_t> counts;
        std::vector<dtype> types;
        for (const entry& e : entries_) {
            counts.push_back(e.grad.count);
            types.push_back(e.bucket_type);
        }
        std::vector<detail::planned_bucket> plan = detail::plan_buckets(
            order, counts, types, options_.first_bucket_bytes, options_.bucket_bytes);
        std::vector<bucket> fresh(plan.size());
        std::vector<entry> placed = entries_;
        for (std::size_t k = 0; k < plan.size(); ++k) {
            bucket& b = fresh[k];
            b.type = plan[k].type;
            b.members = std::move(plan[k].members);
            for (std::size_t g : b.members) {
                placed[g].bucket = k;
                placed[g].offset = b.count;
                b.count += entries_[g].grad.count;
            }
            b.pending = b.members.size();
        }
        // The path lays out the new buckets (reading the old ones where it carries
        // values) or throws having changed nothing; then the reducer switches by
        // moves alone.
        std::vector<std::optional<request_type>> requests(fresh.size());
        const bool again = started_; // start() lays out first, the rebuild again
        const detail::path_state next{placed, fresh, place_, location()};
        on_path([&](auto& p) {
            p.lay_out(next, again ? std::span<const entry>(entries_) : std::span<const entry>());
        });
        buckets_ = std::move(fresh);
        entries_ = std::move(placed);
        requests_ = std::move(requests);
        ++layout_version_;
        log(log_level::info, comm_->rank(), [&] { return describe_layout(again); });
    }

    /// UNISON_LOG=info: the bucket plan just laid out.
    std::string describe_layout(bool rebuilt) const {
        std::string s = std::string("bucketed_reducer: ") + (rebuilt ? "rebuilt " : "") +
                        std::to_string(buckets_.size()) + " buckets for " +
                        std::to_string(entries_.size()) + " gradients on the " +
                        std::string(to_string(data_path())) + " path (first bucket " +
                        std::to_string(options_.first_bucket_bytes) + " B, then " +
                        std::to_string(options_.bucket_bytes) + " B):";
        for (std::size_t k = 0; k < buckets_.size(); ++k) {
            const bucket& b = buckets_[k];
            s += (k == 0 ? " " : ", ") + std::to_string(b.members.size()) + " x " +
                 std::string(to_string(b.type)) + " = " +
                 std::to_string(b.count * size_of(b.type)) + " B";
        }
        return s;
    }

    /// Rebuilds the buckets from rank 0's observed ready order, once.
    void rebuild() {
        std::vector<std::int64_t> order(ready_order_.begin(), ready_order_.end());
        detail::control_broadcast(stamped_, place_, std::span<std::int64_t>(order), 0);
        std::vector<std::size_t> chosen;
        std::vector<bool> seen(entries_.size(), false);
        for (std::int64_t g : order) {
            if (g < 0 || static_cast<std::size_t>(g) >= entries_.size() ||
                seen[static_cast<std::size_t>(g)]) {
                fail("rebuild", "rank 0's ready order is not a permutation of the gradients");
            }
            seen[static_cast<std::size_t>(g)] = true;
            chosen.push_back(static_cast<std::size_t>(g));
        }
        build(chosen);
        ready_order_.clear();
        ready_order_.shrink_to_fit();
        rebuilt_ = true;
    }

    /// Every rank must register the same gradients: compare a count and a hash of
    /// the (count, dtype) list across ranks.
    void verify_layout() {
        std::uint64_t hash = detail::fnv1a64_offset;
        auto mix = [&](std::uint64_t v) { hash = detail::fnv1a64(&v, sizeof v, hash); };
        for (const entry& e : entries_) {
            mix(e.grad.count);
            mix(static_cast<std::uint64_t>(e.grad.type));
            mix(static_cast<std::uint64_t>(e.bucket_type));
        }
        detail::verify_same_layout(
            *comm_, place_, static_cast<std::int64_t>(entries_.size()), hash,
            {"bucketed_reducer start", "registered", "gradients", "of different sizes or dtypes",
             "every rank must register the same gradients in the same order"});
        // The options that decide in which passes ranks reduce, and by what they
        // divide, must agree too: with another accumulate_steps a rank would pair its
        // reductions with the others' accumulating passes.
        const auto describe = [](std::int64_t steps, bool average, double predivide) {
            return "accumulate_steps = " + std::to_string(steps) +
                   ", average = " + (average ? "true" : "false") +
                   ", predivide_factor = " + std::to_string(predivide);
        };
        const std::vector<std::int64_t> mine{
            options_.accumulate_steps, options_.average ? 1 : 0,
            std::bit_cast<std::int64_t>(options_.predivide_factor)};
        std::vector<std::int64_t> all(mine.size() * static_cast<std::size_t>(comm_->size()));
        detail::control_all_gather(*comm_, place_, std::span<const std::int64_t>(mine),
                                   std::span<std::int64_t>(all));
        static constexpr const char* fields[] = {"accumulate_steps", "average", "predivide_factor"};
        for (int r = 0; r < comm_->size(); ++r) {
            const std::int64_t* theirs = all.data() + mine.size() * static_cast<std::size_t>(r);
            for (std::size_t f = 0; f < mine.size(); ++f) {
                if (theirs[f] == mine[f]) {
                    continue;
                }
                throw mismatch_error(
                    comm_->rank(), "bucketed_reducer start",
                    "rank " + std::to_string(r) + " has " +
                        describe(theirs[0], theirs[1] != 0, std::bit_cast<double>(theirs[2])) +
                        "; this rank " +
                        describe(mine[0], options_.average, options_.predivide_factor) +
                        ": every rank must pass the same ddp_options",
                    r, fields[f]);
            }
        }
    }

    C* comm_;
    step_communicator_type stamped_; ///< *comm_, stamped with the pass count
    ddp_options options_;
    hook_type hook_;
    detail::placement place_;
    std::vector<entry> entries_;
    std::vector<bucket> buckets_;
    path_type path_; ///< the buckets' memory: declared before the requests that use it
    std::vector<std::optional<request_type>> requests_; ///< per bucket, while in flight
    std::vector<std::size_t> ready_order_;
    std::size_t next_launch_ = 0;
    std::size_t next_poll_ = 0;
    int micro_step_ = 0;
    int contributing_ = 0;
    std::uint64_t layout_version_ = 0;
    bool started_ = false;
    bool rebuilt_ = false;
};

} // namespace unison
