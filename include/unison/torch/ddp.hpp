#pragma once

/// \file
/// `unison::torch::ddp`: data parallelism for a `torch::nn::Module`, the
/// DistributedDataParallel that LibTorch's C++ frontend lacks. The user's forward,
/// loss and backward stay plain LibTorch code:
///
///     unison::torch::ddp<unison::mpi_communicator> dp(comm, model, {.bucket_bytes = 25 << 20});
///     torch::optim::AdamW optimizer(model->parameters(), 1e-3);
///     for (auto& batch : my_shard_of_the_data) {
///         optimizer.zero_grad();
///         auto loss = torch::nn::functional::cross_entropy(model->forward(batch.x), batch.y);
///         loss.backward();    // buckets are all-reduced while backward runs
///         optimizer.step();   // on gradients averaged over the ranks
///     }
///
/// Construction is collective: every rank first hears whether any rank's own
/// checks failed (the module claimed by another engine, the root, a tensor on
/// another device), then it checks that every rank built the same module (names,
/// shapes and dtypes: the first parameter that differs is named in a mismatch_error
/// before any data moves; torch/detail/prologue.hpp, shared with torch::fsdp),
/// registers the module's parameters (those with `requires_grad`; frozen ones are
/// only broadcast) and its buffers, and broadcasts rank `root`'s parameters and
/// buffers. A failure before that broadcast leaves the module as it was; one after
/// it leaves rank `root`'s values, each parameter the gradient it had, and no hook.
/// It hooks each parameter's gradient accumulator, so a gradient's
/// bucket is packed and reduced as soon as autograd has accumulated it into
/// `p.grad()`, and it queues a callback that ends the step when backward finishes:
/// after `loss.backward()` returns, every `p.grad()` holds the average over the
/// ranks (with `accumulate_steps`, on the window's last micro-batch; see
/// `synchronized()`), and by default rank `root`'s buffers have been copied to
/// every rank (PyTorch's `broadcast_buffers`).
///
/// Gradients follow PyTorch's rules, as in one process: construction creates
/// none; a parameter gets one when backward reaches it on any rank (a rank that
/// did not use it contributes zero, policy::unused_as_zero, the default), and a
/// parameter that no rank used and whose gradient no rank held keeps an undefined
/// gradient, so the optimizer skips it (one small all-reduce per step finds those;
/// PyTorch DDP with find_unused_parameters does the same). With
/// policy::unused_is_error a parameter without a gradient is an error naming it
/// that `backward()` throws. Zeroing in place (`optimizer.zero_grad()` in LibTorch
/// 1.x) keeps the gradients' storage; setting them to undefined (LibTorch 2's
/// default) works too, at the cost of a pointer update per gradient. With
/// policy::gradients_in_buckets, a defined `p.grad()` is a view into the bucket
/// memory (PyTorch's gradient_as_bucket_view): nothing is copied after the first
/// step.
///
/// One engine per module: a parameter that another `torch::ddp` or `torch::fsdp`
/// drives is an argument_error naming it, before anything moves. Every rank must
/// build the same module: a parameter or buffer whose name, shape, dtype or
/// requires_grad differs on some rank is a mismatch_error naming it, on every rank,
/// before anything moves.
///
/// Accumulation: inside a `no_sync()` scope backward only accumulates locally; the
/// next backward outside one reduces the sum (PyTorch's `no_sync`). Or set
/// `accumulate_steps`: every backward counts as a micro-batch.
///
/// Policies and numbers are those of `unison::ddp` (ddp/policies.hpp,
/// ddp/options.hpp). Not thread-safe: one object per rank, its backward on one
/// thread at a time.
///
/// Devices: a CPU module on any host communicator, or a module on one GPU with a
/// `device_setup` for the engine as the constructor's last argument, made by
/// `unison::cuda::on_device<engine_type>(dev, stream)` in a .cu file
/// (parallel/device_setup.hpp says why it is made there): buckets then live on that
/// GPU, packing and averaging run as kernels on `stream` (the stream LibTorch
/// computes on: `at::cuda::getCurrentCUDAStream(dev).stream()`, or null for the
/// default stream), and the reductions run on the communicator's stream after it
/// (NCCL, or the thread backend attached to the GPU). Every parameter and buffer
/// must be on the setup's device; anything else is an error that names the tensor
/// before anything moves. Ranks of the thread backend sharing one GPU must run
/// backward on their own threads (LibTorch >= 2.0 with autograd multithreading
/// off on each rank's thread): LibTorch's per-device autograd thread is shared.

#include "unison/comm/communicator.hpp"
#include "unison/core/error.hpp"
#include "unison/core/torch.hpp"
#include "unison/ddp/ddp.hpp"
#include "unison/parallel/detail/control.hpp"
#include "unison/parallel/device_setup.hpp"
#include "unison/torch/detail/claims.hpp"
#include "unison/torch/detail/device.hpp"
#include "unison/torch/detail/prologue.hpp"

#include <ATen/ops/from_blob.h>

#include <torch/csrc/autograd/engine.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace unison::torch {

/// The numbers of a module's DDP: those of `unison::ddp_options` (same meaning and
/// defaults) and what belongs to the module.
struct ddp_options {
    std::size_t bucket_bytes = unison::ddp_options{}.bucket_bytes;
    std::size_t first_bucket_bytes = unison::ddp_options{}.first_bucket_bytes;
    int accumulate_steps = unison::ddp_options{}.accumulate_steps;
    bool average = unison::ddp_options{}.average;
    double predivide_factor = unison::ddp_options{}.predivide_factor;
    /// Copy rank `root`'s buffers (running statistics) to every rank after each
    /// synchronizing backward, so the next forward runs with the same ones everywhere.
    bool broadcast_buffers = true;
    /// The rank whose parameters and buffers every rank starts from.
    int root = 0;

    unison::ddp_options engine() const {
        return {bucket_bytes, first_bucket_bytes, accumulate_steps, average, predivide_factor};
    }
};

/// DDP of one `torch::nn::Module` over communicator `C`, assembled from `Policies`
/// (those of `unison::ddp`). Keeps the module alive; neither copyable nor movable
/// (autograd hooks point at it).
template <communicator C, class... Policies>
class ddp {
public:
    using engine_type = unison::ddp<C, Policies...>;

    /// A scope inside which backward only accumulates gradients locally.
    class no_sync_scope {
    public:
        no_sync_scope(no_sync_scope&& o) noexcept : owner_(std::exchange(o.owner_, nullptr)) {}
        no_sync_scope& operator=(no_sync_scope&&) = delete;
        no_sync_scope(const no_sync_scope&) = delete;
        no_sync_scope& operator=(const no_sync_scope&) = delete;
        ~no_sync_scope() {
            if (owner_ != nullptr) {
                --owner_->no_sync_depth_;
            }
        }

    private:
        friend class ddp;
        explicit no_sync_scope(ddp* owner) : owner_(owner) { ++owner_->no_sync_depth_; }
        ddp* owner_;
    };

    /// Collective (see the file comment). `comm` must outlive this object.
    ddp(C& comm, std::shared_ptr<::torch::nn::Module> module, ddp_options options = {})
        : ddp(placed_tag{}, comm, std::move(module), options, std::nullopt) {}
    /// The same for a module on the GPU of `device` (see the file comment).
    ddp(C& comm, std::shared_ptr<::torch::nn::Module> module, ddp_options options,
        device_setup<engine_type> device)
        : ddp(placed_tag{}, comm, std::move(module), options, std::move(device)) {}
    /// The same for a module holder (`torch::nn::Linear`, a TORCH_MODULE type).
    template <class M>
    ddp(C& comm, const ::torch::nn::ModuleHolder<M>& module, ddp_options options = {})
        : ddp(comm, std::static_pointer_cast<::torch::nn::Module>(module.ptr()), options) {}
    template <class M>
    ddp(C& comm, const ::torch::nn::ModuleHolder<M>& module, ddp_options options,
        device_setup<engine_type> device)
        : ddp(comm, std::static_pointer_cast<::torch::nn::Module>(module.ptr()), options,
              std::move(device)) {}

    ddp(const ddp&) = delete;
    ddp& operator=(const ddp&) = delete;

    /// Removes the hooks; with gradients_in_buckets, gives each parameter its own
    /// copy of its gradient (the bucket memory goes away with this object).
    ~ddp() { release(); }

    /// Backward inside the returned scope only accumulates into `p.grad()`; the next
    /// backward outside reduces what was accumulated. Scopes nest.
    [[nodiscard]] no_sync_scope no_sync() { return no_sync_scope(this); }

    /// Whether the last backward synchronized the gradients (false inside no_sync()
    /// and on micro-batches that only accumulate): step the optimizer after true.
    bool synchronized() const noexcept { return synchronized_; }

    /// Collective: copies rank `root`'s buffers to every rank now.
    void broadcast_buffers() { engine_.broadcast_buffers(options_.root); }

    /// Where the engine keeps the buckets: host, or the device setup's GPU.
    device location() const noexcept { return placed_ ? *placed_ : device::host(); }

    /// The registered (trainable) parameters, in registration order, and their names.
    const std::vector<at::Tensor>& parameters() const noexcept { return params_; }
    const std::vector<std::string>& parameter_names() const noexcept { return names_; }

    ::torch::nn::Module& module() noexcept { return *module_; }
    engine_type& engine() noexcept { return engine_; }
    C& communicator() noexcept { return engine_.communicator(); }

private:
    struct placed_tag {};

    ddp(placed_tag, C& comm, std::shared_ptr<::torch::nn::Module> module, ddp_options options,
        std::optional<device_setup<engine_type>> device)
        : module_(std::move(module)), options_(options), claim_(module_, "torch::ddp"),
          placed_(device ? std::optional<unison::device>(device->location()) : std::nullopt),
          guard_(placed_), engine_(comm, options_.engine()) {
        const auto checks = [&] {
            check(comm);
            if (device) {
                (*device)(engine_); // before start(): the buckets are made there
            }
        };
        detail::agree_to_start(comm, detail::local_checks(checks), "torch::ddp");
        const unison::detail::placement& place = engine_.reducer().placement();
        detail::verify_module(comm, place, *module_, placed_, "torch::ddp");
        register_module();
        detail::construction_stage("registered");
        engine_.start(options_.root); // the layout check, then rank root's values everywhere
        detail::construction_stage("started");
        // A failure from here removes the hooks and gives each parameter back the
        // gradient it had (not a view of a bucket that goes away with this object).
        try {
            install_hooks();
            detail::construction_stage("hooked");
            if constexpr (in_buckets) {
                point_gradients_at_buckets();
            }
            detail::construction_stage("pointed");
        } catch (...) {
            hooks_.remove_all();
            for (std::size_t i = 0; i < params_.size(); ++i) {
                params_[i].mutable_grad() = own_grads_[i]; // the gradient it had, if any
            }
            throw;
        }
        own_grads_.clear(); // the reducer holds the gradients from here
    }

    static constexpr bool in_buckets =
        engine_type::reducer_type::config::gradient_memory::in_buckets;
    static constexpr bool unused_is_error = engine_type::reducer_type::config::unused::error;

    /// This rank's own checks, before anything moves (torch/detail/prologue.hpp):
    /// the module, the root, the claim, every tensor where the engine keeps its
    /// state, and that state where the communicator moves data.
    void check(C& comm) {
        if (!module_) {
            fail("the module is null");
        }
        if (options_.root < 0 || options_.root >= comm.size()) {
            fail("root is " + std::to_string(options_.root) + " in a world of " +
                 std::to_string(comm.size()) + " ranks");
        }
        claim_.check(comm.rank());
        if (std::string why = detail::misplaced(*module_, placed_); !why.empty()) {
            fail(why);
        }
        detail::check_placement(comm, placed_, "torch::ddp");
    }

    [[noreturn]] void fail(const std::string& detail) {
        throw argument_error(engine_.communicator().rank(), "torch::ddp", detail);
    }

    void register_module() {
        for (const auto& item : module_->named_parameters(/*recurse=*/true)) {
            at::Tensor p = item.value();
            if (!p.requires_grad()) {
                engine_.add_frozen_parameter(p, item.key());
                continue;
            }
            // The reducer gets memory of its own for a parameter without a gradient:
            // p.grad stays undefined until autograd (or a reduction) makes one, as
            // in one process.
            at::Tensor grad = p.grad().defined() ? p.grad() : at::zeros_like(p);
            engine_.add_parameter(p, grad, item.key());
            params_.push_back(p);
            grads_.push_back(grad);
            own_grads_.push_back(p.grad());
            names_.push_back(item.key());
        }
        for (const auto& item : module_->named_buffers(/*recurse=*/true)) {
            at::Tensor b = item.value();
            if (b.defined()) {
                engine_.add_buffer(b, item.key());
            }
        }
        marked_.assign(params_.size(), 0);
        present_.assign(params_.size(), 0);
        filled_.assign(params_.size(), 0);
    }

    /// Gradient i is final once autograd has accumulated it into p.grad: a post hook
    /// on p's AccumulateGrad node.
    void install_hooks() {
        for (std::size_t i = 0; i < params_.size(); ++i) {
            if (!hooks_.hold(params_[i])) {
                fail("parameter '" + names_[i] + "' has no gradient accumulator");
            }
            hooks_.install(i, [this, i] { gradient_ready(i); });
        }
    }

    /// Removes the hooks; with gradients_in_buckets, a gradient that is a view of
    /// its bucket gets memory of its own, with its values.
    void release() noexcept {
        hooks_.remove_all();
        if constexpr (in_buckets) {
            for (std::size_t i = 0; i < params_.size(); ++i) {
                try {
                    if (params_[i].grad().defined() && grads_[i].defined() &&
                        params_[i].grad().data_ptr() == grads_[i].data_ptr()) {
                        params_[i].mutable_grad() = grads_[i].clone();
                    }
                } catch (...) { // out of memory: nothing to report to, the engine is going away
                    params_[i].mutable_grad() = at::Tensor();
                }
            }
        }
    }

    void gradient_ready(std::size_t i) {
        guard_.check(engine_.communicator().rank(), "torch::ddp backward");
        if (no_sync_depth_ > 0) {
            synchronized_ = false;
            return; // accumulated locally; reduced by the next synchronizing backward
        }
        if (!in_backward_) {
            in_backward_ = true;
            ::torch::autograd::Engine::get_default_engine().queue_callback(
                [this] { end_backward(); });
        }
        follow_gradient(i);
        marked_[i] = 1;
        engine_.mark_ready(i);
    }

    /// Makes the reducer read and write p.grad where it lives now.
    void follow_gradient(std::size_t i) {
        at::Tensor& grad = params_[i].mutable_grad();
        if (!grad.defined()) {
            // Undefined (zero_grad(set_to_none)) and not produced this step: zero.
            grads_[i].zero_();
            grad = grads_[i];
            return;
        }
        if (grad.data_ptr() == grads_[i].data_ptr()) {
            return;
        }
        // Autograd made a new tensor. With gradients in buckets it goes back into the
        // bucket; on a GPU into the gradient the reducer holds (a rebind would
        // rebuild the bucket's device pack plans, a synchronous upload); on the host
        // the reducer follows it (a pointer update).
        if (in_buckets || placed_) {
            grads_[i].copy_(grad);
            grad = grads_[i];
        } else {
            engine_.reducer().rebind(i, grad);
            grads_[i] = grad;
        }
    }

    /// Autograd's final callback: the step's reductions end here.
    void end_backward() {
        in_backward_ = false;
        for (std::size_t i = 0; i < params_.size(); ++i) {
            // Over the whole accumulation window: reached by backward, or holding a
            // gradient that is not the zero this wrapper filled in.
            const bool held = params_[i].grad().defined() && filled_[i] == 0;
            present_[i] = present_[i] != 0 || marked_[i] != 0 || held ? 1 : 0;
            if (marked_[i] == 0) {
                const bool undefined = !params_[i].grad().defined();
                follow_gradient(i); // unused this step: the average still lands in p.grad
                filled_[i] = filled_[i] != 0 || undefined ? 1 : 0;
            } else {
                filled_[i] = 0;
            }
            marked_[i] = 0;
        }
        synchronized_ = engine_.finish();
        if constexpr (in_buckets) {
            if (engine_.reducer().layout_version() != layout_version_) {
                point_gradients_at_buckets();
            }
        }
        if constexpr (!unused_is_error) {
            if (synchronized_) {
                drop_unused_gradients(); // after any re-pointing, which defines them all
            }
        }
        if (synchronized_) { // a new window: what is left in p.grad is a real gradient
            std::fill(present_.begin(), present_.end(), 0);
            std::fill(filled_.begin(), filled_.end(), 0);
        }
        if (synchronized_ && options_.broadcast_buffers) {
            engine_.broadcast_buffers(options_.root);
        }
    }

    /// A parameter that no rank used in this backward and whose gradient no rank
    /// held (set to undefined by zero_grad, LibTorch 2's default) keeps an undefined
    /// gradient, so the optimizer skips it as it would in one process (PyTorch DDP
    /// with find_unused_parameters does the same). One small all-reduce per
    /// synchronizing backward decides it alike on every rank.
    void drop_unused_gradients() {
        unison::detail::control_all_reduce(engine_.communicator(), engine_.reducer().placement(),
                                           std::span<std::int64_t>(present_), reduce_op::max);
        for (std::size_t i = 0; i < params_.size(); ++i) {
            if (present_[i] == 0) {
                params_[i].mutable_grad() = at::Tensor();
            }
        }
    }

    /// gradients_in_buckets: a defined p.grad becomes a view of its bucket slot
    /// (again after the rebuild moves the buckets; the reducer carries the values
    /// over). An undefined one stays so until backward gives it a value.
    void point_gradients_at_buckets() {
        for (std::size_t i = 0; i < params_.size(); ++i) {
            grads_[i] = at::for_blob(bucket_slot(i), params_[i].sizes())
                            .options(params_[i].options())
                            .target_device(params_[i].device())
                            .make_tensor();
            if (params_[i].grad().defined()) {
                params_[i].mutable_grad() = grads_[i];
            }
        }
        layout_version_ = engine_.reducer().layout_version();
    }

    void* bucket_slot(std::size_t i) {
        auto& reducer = engine_.reducer();
        switch (*dtype_from_torch(params_[i].scalar_type())) {
        case dtype::f64:
            return reducer.template gradient<double>(i).data;
        case dtype::f32:
            return reducer.template gradient<float>(i).data;
        case dtype::f16:
            return reducer.template gradient<half>(i).data;
        case dtype::bf16:
            return reducer.template gradient<bf16>(i).data;
        default:
            fail("parameter '" + names_[i] + "' is not floating point");
        }
    }

    std::shared_ptr<::torch::nn::Module> module_;
    ddp_options options_;
    detail::module_claim claim_;           ///< no other engine drives these parameters
    std::optional<unison::device> placed_; ///< the device setup's GPU; host when none
    detail::backward_thread_guard guard_;
    engine_type engine_;
    std::vector<at::Tensor> params_;
    std::vector<at::Tensor> grads_;     ///< where the reducer reads and writes gradient i
    std::vector<at::Tensor> own_grads_; ///< each p.grad before construction, until it ends
    std::vector<std::string> names_;
    detail::gradient_hooks hooks_; ///< node i: parameter i's AccumulateGrad
    std::vector<std::uint8_t> marked_;
    /// Used, or holding a gradient, in this accumulation window (since the last
    /// synchronizing backward).
    std::vector<std::int64_t> present_;
    /// p.grad is the zero this wrapper filled in for a parameter that backward did
    /// not reach in this window (not a gradient one process would have).
    std::vector<std::uint8_t> filled_;
    std::uint64_t layout_version_ = ~std::uint64_t{0};
    int no_sync_depth_ = 0;
    bool in_backward_ = false;
    bool synchronized_ = false;
};

} // namespace unison::torch
