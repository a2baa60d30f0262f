#pragma once

/// \file
/// `unison::torch::fsdp`: fully sharded data parallelism (and ZeRO) for a
/// `torch::nn::Module`, on the sharding engine `unison::fsdp`. The user names the
/// units (submodules gathered together, e.g. each transformer block; what is left
/// over is the root unit) and runs each unit's forward through `unit_forward`;
/// forward and backward are otherwise plain LibTorch code under autograd:
///
///     // in the model's forward (a no-op wrapper when no engine runs the block):
///     for (auto& block : blocks) {
///         h = unison::torch::unit_forward(*block, [&] { return block->forward(h); });
///     }
///     // training:
///     unison::torch::fsdp<Comm, unison::policy::shard::full> engine(
///         comm, model, unison::torch::modules(model->blocks), {.optimizer = {.lr = 1e-3}});
///     for (auto& batch : my_shard_of_the_data) {
///         auto loss = cross_entropy(engine.forward([&] { return model->forward(x); }), y);
///         loss.backward();  // each unit regathered, its gradients reduce-scattered
///         engine.step();    // clip, AdamW on this rank's shard, zero the gradients
///     }
///     engine.save_full("model.pt"); // torch::load(plain_model, "model.pt") reads it
///     unison::save_checkpoint("ckpt", engine); // sharded: resume at any world size
///
/// Construction is collective: every rank first hears whether any rank's own
/// checks failed (the module claimed by another engine, a unit that is not a
/// submodule, tied weights, a tensor on another device), then it checks that every
/// rank built the same module (the first parameter that differs is named in a
/// mismatch_error), hands rank 0's parameters to the engine, and finally copies
/// rank 0's frozen parameters and buffers into every rank's module (parts of
/// construction: torch/detail/prologue.hpp, shared with torch::ddp). From then on
/// each parameter's storage is the engine's memory (torch/detail/storage.hpp),
/// pointed at the gathered values inside the unit's forward and backward
/// and released outside them (with strategies that shard parameters): it keeps its
/// shape, holds no memory, and any computation on it (or on a view of it) throws
/// an argument_error naming the parameter, its unit and the operator
/// (torch/detail/released.hpp). Its data pointer is null there: nothing may read
/// it. `full_state_dict()` and `save_full()` give the full values. A construction
/// that fails leaves the module as it was: every parameter its own tensor, values
/// and gradient (rank 0's values reach the engine through memory of its own), no
/// hook, no unit registered, no claim (frozen parameters and buffers that a
/// broadcast cannot move are refused up front); only a communication failure in
/// the last step may leave some frozen parameters and buffers holding rank 0's
/// values.
///
/// Forward: entering a unit gathers its parameters (prefetching the next units)
/// and points the module's parameters at them; leaving it releases them (when the
/// strategy reshards after forward) and hooks the unit's outputs. Backward: the
/// first gradient that reaches one of the unit's outputs regathers the unit and
/// points each `p.grad()` at the gradient memory that autograd accumulates into;
/// once every parameter of the unit has its gradient (a post hook on each
/// AccumulateGrad node), the unit's gradients are reduce-scattered and its
/// parameters released. A unit run k times in one forward is regathered once in
/// backward: autograd sums each parameter's gradient over the k uses before its
/// hook runs. Parameters of a unit that get no gradient in a backward are reduced
/// as zero when backward ends (autograd's final callback); units whose forward did
/// not reach the loss, in step(). A parameter that no rank's backward reached in a
/// step's window has no gradient, as in one process: the step leaves it, its
/// optimizer state and its step count as they are (one small all-reduce per step
/// decides it; `set_grads_to_none = false` in the options gives LibTorch 1.x's
/// in-place zero_grad instead: once updated, such a parameter is updated with a
/// zero gradient).
///
/// Gradient accumulation (several micro-batches, each with its forward and
/// backward, one optimizer step): either set `accumulate_steps` (and `accumulate`)
/// in the options and call step() after every micro-batch's backward (it updates on
/// the window's last; step_result::accumulated on the others), or run every
/// micro-batch but the last inside `no_sync()` and step() after the last, as with
/// PyTorch's FSDP. See unison::fsdp for what each mode holds and sends. Scale each
/// micro-batch's loss by its share of the window's batch.
///
/// Activation recomputation: wrap a block's call in `unison::torch::recompute`
/// (torch/recompute.hpp); its re-run in backward regathers the unit and is not
/// counted as another use of it.
///
/// One engine per module: a parameter that another `torch::fsdp` or `torch::ddp`
/// drives is an argument_error naming it, before anything moves.
///
/// A parameter must be used only inside its unit's forward (a parameter shared
/// with another unit belongs in their common parent). Parameters without
/// `requires_grad` stay the module's own (broadcast at construction, never
/// sharded). Parameters of the engine's parameter dtype; one object per rank.
///
/// Devices: a CPU module on any host communicator, or a module on one GPU with a
/// `device_setup` for the engine as the constructor's last argument, made by
/// `unison::cuda::on_device<engine_type>(dev, stream)` in a .cu file
/// (parallel/device_setup.hpp says why): every flat buffer, gathered unit and
/// optimizer state then lives on that GPU, the parameters' storages point into it,
/// casts and the optimizer step run as kernels on `stream` (the stream LibTorch
/// computes on, null for the default one), and the collectives on the
/// communicator's stream after it. Every parameter and buffer must be on that
/// device (otherwise an error names the tensor before anything moves). The full
/// values (full_state_dict, save_full) are host tensors either way. Ranks of the
/// thread backend sharing one GPU must run backward on their own threads (see
/// torch/ddp.hpp).

#include "unison/comm/communicator.hpp"
#include "unison/core/error.hpp"
#include "unison/core/torch.hpp"
#include "unison/parallel/detail/control.hpp"
#include "unison/parallel/device_setup.hpp"
#include "unison/sharded/checkpoint.hpp"
#include "unison/sharded/fsdp.hpp"
#include "unison/torch/detail/archive.hpp"
#include "unison/torch/detail/claims.hpp"
#include "unison/torch/detail/device.hpp"
#include "unison/torch/detail/prologue.hpp"
#include "unison/torch/detail/released.hpp"
#include "unison/torch/detail/storage.hpp"
#include "unison/torch/detail/unit_registry.hpp"
#include "unison/torch/units.hpp"

#include <c10/core/Storage.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/ordered_dict.h>
#include <torch/serialize.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace unison::torch {

/// FSDP / ZeRO of one `torch::nn::Module` over communicator `C`, assembled from the
/// policies of `unison::fsdp` (strategy, precision, optimizer type). Keeps the
/// module alive; neither copyable nor movable (autograd hooks point at it).
template <communicator C, class... Policies>
class fsdp final : private detail::unit_runner {
public:
    using engine_type = unison::fsdp<C, Policies...>;
    using options_type = typename engine_type::options_type;
    using value_type = typename engine_type::value_type;

    /// Collective (see the file comment). `units` are submodules of `model`, each
    /// gathered as a whole (a unit inside another takes its own parameters); the
    /// parameters in none of them form the root unit, run by forward().
    fsdp(C& comm, std::shared_ptr<::torch::nn::Module> model,
         std::vector<std::shared_ptr<::torch::nn::Module>> units, options_type options = {})
        : fsdp(placed_tag{}, comm, std::move(model), std::move(units), std::move(options),
               std::nullopt) {}
    /// The same for a model on the GPU of `device` (see the file comment).
    fsdp(C& comm, std::shared_ptr<::torch::nn::Module> model,
         std::vector<std::shared_ptr<::torch::nn::Module>> units, options_type options,
         device_setup<engine_type> device)
        : fsdp(placed_tag{}, comm, std::move(model), std::move(units), std::move(options),
               std::move(device)) {}
    template <class M>
    fsdp(C& comm, const ::torch::nn::ModuleHolder<M>& model,
         std::vector<std::shared_ptr<::torch::nn::Module>> units, options_type options = {})
        : fsdp(comm, std::static_pointer_cast<::torch::nn::Module>(model.ptr()), std::move(units),
               std::move(options)) {}
    template <class M>
    fsdp(C& comm, const ::torch::nn::ModuleHolder<M>& model,
         std::vector<std::shared_ptr<::torch::nn::Module>> units, options_type options,
         device_setup<engine_type> device)
        : fsdp(comm, std::static_pointer_cast<::torch::nn::Module>(model.ptr()), std::move(units),
               std::move(options), std::move(device)) {}

    fsdp(const fsdp&) = delete;
    fsdp& operator=(const fsdp&) = delete;

    /// Removes the hooks and the units. The parameters keep the values they hold:
    /// with a strategy that shards them that is none (their shape becomes [0]), so
    /// take the trained values first (full_state_dict, save_full).
    ~fsdp() { detach(/*restore_original=*/false); }

    /// Runs the model's forward `f` inside the root unit (gathering the parameters
    /// no other unit owns); the units' forwards inside it go through unit_forward.
    template <class F>
    auto forward(F&& f) {
        return unit_forward(*model_, std::forward<F>(f));
    }

    /// Ends the iteration: unison::fsdp::step (reductions completed, clipping, the
    /// optimizer on this rank's shard, the gradients zeroed). Collective. With
    /// accumulate_steps, call it after every micro-batch: only the window's last
    /// updates.
    step_result step() {
        if (engine_.in_no_sync()) {
            return engine_.step(); // refused, saying what to do
        }
        if (engine_.last_micro_batch()) {
            mark_parameters_without_gradient();
        }
        step_result r;
        try {
            r = engine_.step();
        } catch (...) {
            present_.clear(); // the engine ended the window
            throw;
        }
        if (!r.accumulated) {
            present_.clear();
        }
        return r;
    }

    /// Backward passes inside the returned scope add to each parameter's full
    /// gradient on this rank and reduce nothing (PyTorch FSDP's no_sync): run every
    /// micro-batch of a window but the last inside it, then the last outside it,
    /// then step(). The full gradients of the units that ran backward stay resident
    /// until the last micro-batch reduces them.
    [[nodiscard]] typename engine_type::no_sync_scope no_sync() { return engine_.no_sync(); }

    /// Collective: every parameter's full values (and the buffers), keyed as the
    /// module's named_parameters() / named_buffers(), in host memory of its own.
    ::torch::OrderedDict<std::string, at::Tensor> full_state_dict() {
        ::torch::OrderedDict<std::string, at::Tensor> out;
        for (const auto& item : model_->named_parameters(/*recurse=*/true)) {
            out.insert(item.key(), full_value(item.value()));
        }
        for (const auto& item : model_->named_buffers(/*recurse=*/true)) {
            out.insert(item.key(), host_copy(item.value()));
        }
        return out;
    }

    /// Collective: rank `root` writes the full model in LibTorch's format
    /// (`torch::save(module, path)`'s: Module::save's archive, host tensors), so a
    /// plain module of the same class reads it with `torch::load(module, path)`. A
    /// module class that overrides save() is written as Module::save would write it.
    void save_full(const std::string& path, int root = 0) {
        std::unordered_map<std::string, at::Tensor> full;
        for (const auto& item : model_->named_parameters(/*recurse=*/true)) {
            full.emplace(item.key(), full_value(item.value()));
        }
        if (engine_.communicator().rank() != root) {
            return;
        }
        ::torch::serialize::OutputArchive archive(
            std::make_shared<::torch::jit::CompilationUnit>());
        detail::write_module(archive, *model_, "", full);
        archive.save_to(path);
    }

    ::torch::nn::Module& module() noexcept { return *model_; }
    engine_type& engine() noexcept { return engine_; }
    C& communicator() noexcept { return engine_.communicator(); }
    /// The units in registration order: the root (when it has parameters) first.
    std::size_t unit_count() const noexcept { return units_.size(); }

private:
    struct placed_tag {};

    fsdp(placed_tag, C& comm, std::shared_ptr<::torch::nn::Module> model,
         std::vector<std::shared_ptr<::torch::nn::Module>> units, options_type options,
         std::optional<device_setup<engine_type>> device)
        : model_(std::move(model)), claim_(model_, "torch::fsdp"),
          placed_(device ? std::optional<unison::device>(device->location()) : std::nullopt),
          guard_(placed_), engine_(comm, std::move(options)) {
        const auto checks = [&] {
            if (!model_) {
                fail("the module is null");
            }
            claim_.check(comm.rank());
            collect(units);
            detail::check_placement(comm, placed_, "torch::fsdp");
            if (device) {
                (*device)(engine_); // before the first unit: its buffers are made there
            }
        };
        detail::agree_to_start(comm, detail::local_checks(checks), "torch::fsdp");
        const unison::detail::placement& place = engine_.parameters().placement();
        detail::verify_module(comm, place, *model_, placed_, "torch::fsdp");
        // From here the parameters follow the engine's memory. A failure puts every
        // one back on its own tensor, with its own values and gradient (nothing
        // writes them: rank 0's values reach the engine through memory of its
        // own), and removes what was hooked or registered.
        try {
            register_units();
            detail::construction_stage("registered");
            engine_.start();
            detail::construction_stage("started");
            attach();
            detail::construction_stage("attached");
            // Last, once nothing local can fail: rank 0's frozen parameters and
            // buffers, which stay the module's own, into every rank's module.
            broadcast_module_state();
        } catch (...) {
            detach(/*restore_original=*/true);
            throw;
        }
        for (slot& s : slots_) { // the engine holds the values now
            s.original = at::Tensor();
            s.original_grad = at::Tensor();
        }
    }

    /// A trainable parameter handed to the engine.
    struct slot {
        at::Tensor param; ///< the module's parameter (the tensor the module holds)
        std::string name; ///< its name in the module
        std::vector<std::int64_t> shape;
        std::size_t unit;         ///< index into units_
        c10::Storage value;       ///< the parameter's storage: the engine's memory when bound
        c10::Storage grad;        ///< its gradient's storage, bound inside backward
        at::Tensor original;      ///< its own tensor until construction succeeds
        at::Tensor original_grad; ///< and its gradient (undefined when it had none)
        parameter_handle handle;
    };
    struct unit_info {
        const ::torch::nn::Module* module = nullptr;
        std::string name;
        std::vector<std::size_t> slots;
        unit_handle handle;
        std::size_t ready = 0; ///< gradients accumulated in this backward
        bool in_backward = false;
        bool registered = false; ///< in unit_registry under this engine
    };

    [[noreturn]] void fail(const std::string& detail) {
        throw argument_error(engine_.communicator().rank(), "torch::fsdp", detail);
    }

    /// Refuses `t` (a frozen parameter or a buffer, which construction copies from
    /// rank 0 last) unless a broadcast can move it as it is: found here, every rank
    /// refuses before anything moves, instead of failing halfway through the copies.
    void refuse_unmovable(const std::string& what, const at::Tensor& t) {
        if (!t.is_contiguous() || !dtype_from_torch(t.scalar_type())) {
            fail(what + " is " + std::string(c10::toString(t.scalar_type())) +
                 (t.is_contiguous() ? "" : ", not contiguous") +
                 ": construction copies rank 0's to every rank, and unison moves contiguous "
                 "tensors of its dtypes only (convert it, or keep it out of the module)");
        }
    }

    /// Assigns every trainable parameter to the innermost unit that holds it.
    void collect(const std::vector<std::shared_ptr<::torch::nn::Module>>& units) {
        if (std::string why = detail::misplaced(*model_, placed_); !why.empty()) {
            fail(why); // before anything is touched
        }
        std::unordered_map<const c10::TensorImpl*, std::string> names;
        for (const auto& item : model_->named_parameters(/*recurse=*/true)) {
            if (!names.emplace(item.value().unsafeGetTensorImpl(), item.key()).second) {
                fail("parameter '" + item.key() + "' is the same tensor as '" +
                     names.at(item.value().unsafeGetTensorImpl()) +
                     "' (tied weights): give them one owner");
            }
        }
        // Innermost first: a unit nested in another takes its own parameters.
        std::vector<std::size_t> order(units.size());
        for (std::size_t i = 0; i < order.size(); ++i) {
            order[i] = i;
            if (!units[i]) {
                fail("unit #" + std::to_string(i) + " is a null module");
            }
        }
        std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
            return units[a]->parameters().size() < units[b]->parameters().size();
        });
        // A module already driven by another engine is refused before anything moves.
        const auto refuse_taken = [&](const ::torch::nn::Module* m, const std::string& what) {
            if (detail::unit_registry::instance().find(m).runner != nullptr) {
                fail(what + " is a unit of another engine already: destroy that engine first");
            }
        };
        refuse_taken(model_.get(), "the model (" + model_->name() + ")");
        for (std::size_t i = 0; i < units.size(); ++i) {
            refuse_taken(units[i].get(),
                         "unit #" + std::to_string(i) + " (" + units[i]->name() + ")");
        }
        std::unordered_map<const c10::TensorImpl*, std::size_t> owner; // -> units_ index
        units_.resize(units.size() + 1);                               // [0]: the root
        units_[0].module = model_.get();
        units_[0].name = "root";
        for (const std::size_t i : order) {
            unit_info& u = units_[i + 1];
            u.module = units[i].get();
            for (const at::Tensor& p : units[i]->parameters()) {
                const auto it = names.find(p.unsafeGetTensorImpl());
                if (it == names.end()) {
                    fail("unit #" + std::to_string(i) + " (" + units[i]->name() +
                         ") is not a submodule of the model");
                }
                owner.emplace(p.unsafeGetTensorImpl(), i + 1);
            }
            if (units[i].get() == model_.get()) {
                fail("unit #" + std::to_string(i) + " is the model itself: it is the root unit");
            }
        }
        for (const auto& item : model_->named_parameters(/*recurse=*/true)) {
            const at::Tensor& p = item.value();
            if (!p.requires_grad()) {
                refuse_unmovable("frozen parameter '" + item.key() + "'", p);
                frozen_.push_back(p);
                continue;
            }
            if (!p.is_contiguous() || p.scalar_type() != torch_dtype(dtype_of<value_type>)) {
                fail("parameter '" + item.key() + "' is " +
                     std::string(c10::toString(p.scalar_type())) +
                     (p.is_contiguous() ? "" : ", not contiguous") +
                     "; this engine takes contiguous " +
                     std::string(c10::toString(torch_dtype(dtype_of<value_type>))) +
                     " parameters (convert the module first)");
            }
            const auto it = owner.find(p.unsafeGetTensorImpl());
            const std::size_t u = it == owner.end() ? 0 : it->second;
            units_[u].slots.push_back(slots_.size());
            slot_of_.emplace(p.unsafeGetTensorImpl(), slots_.size());
            slots_.push_back(slot{p,
                                  item.key(),
                                  p.sizes().vec(),
                                  u,
                                  detail::unowned_storage(p.device()),
                                  detail::unowned_storage(p.device()),
                                  p.detach(),
                                  p.grad(),
                                  {}});
        }
        for (const auto& item : model_->named_buffers(/*recurse=*/true)) {
            if (item.value().defined()) {
                refuse_unmovable("buffer '" + item.key() + "'", item.value());
            }
        }
        for (std::size_t u = 1; u < units_.size(); ++u) {
            units_[u].name = "unit #" + std::to_string(u - 1);
            if (units_[u].slots.empty()) {
                fail(units_[u].name + " (" + units[u - 1]->name() +
                     ") has no trainable parameters of its own");
            }
        }
    }

    /// Collective, the last step of construction: rank 0's frozen parameters and
    /// buffers, which stay the module's own, into every rank's module (PyTorch
    /// FSDP's sync_module_states; the trainable parameters reached the engine in
    /// register_units).
    void broadcast_module_state() {
        C& comm = engine_.communicator();
        ::torch::NoGradGuard no_grad;
        for (const at::Tensor& p : frozen_) {
            at::Tensor d = p.detach();
            broadcast(comm, d, 0);
        }
        for (const auto& item : model_->named_buffers(/*recurse=*/true)) {
            if (item.value().defined()) {
                at::Tensor d = item.value().detach();
                broadcast(comm, d, 0);
            }
        }
    }

    /// Collective: hands each unit to the engine with rank 0's values, then points
    /// the parameters at the engine's memory. The other ranks receive rank 0's
    /// values in memory of their own, one unit at a time, so that no parameter's
    /// own values change (a failed construction gives them back as they were);
    /// on a GPU they reach the engine through a host copy, as add_unit takes them.
    void register_units() {
        C& comm = engine_.communicator();
        const ::torch::NoGradGuard no_grad;
        for (std::size_t u = 0; u < units_.size(); ++u) {
            if (units_[u].slots.empty()) {
                continue; // a root without parameters of its own: forward() just runs
            }
            std::vector<at::Tensor> initial;
            initial.reserve(units_[u].slots.size());
            for (const std::size_t i : units_[u].slots) {
                const at::Tensor& p = slots_[i].param;
                at::Tensor v = comm.rank() == 0 ? p.detach() : at::empty_like(p);
                broadcast(comm, v, 0);
                initial.push_back(v.is_cpu() ? v : v.to(at::kCPU));
            }
            std::vector<typename engine_type::parameter> params;
            params.reserve(units_[u].slots.size());
            for (std::size_t j = 0; j < units_[u].slots.size(); ++j) {
                const std::size_t i = units_[u].slots[j];
                params.emplace_back(
                    slots_[i].name, initial[j],
                    [this, i](view<value_type> v, view<value_type> g) { bind(slots_[i], v, g); });
            }
            units_[u].handle = engine_.add_unit(params);
            for (std::size_t j = 0; j < units_[u].slots.size(); ++j) {
                slots_[units_[u].slots[j]].handle = units_[u].handle[j];
            }
        }
        // The engine has the values now; the parameters follow its memory (start()
        // binds those that stay resident). Each parameter's AccumulateGrad node is
        // made first: it records the parameter's shape, which must be the real one.
        for (slot& s : slots_) {
            if (!hooks_.hold(s.param)) {
                fail("parameter '" + s.name + "' has no gradient accumulator");
            }
            const unit_info& u = units_[s.unit];
            detail::released_parameters::instance().add(
                s.value.unsafeGetStorageImpl(),
                {engine_.communicator().rank(), "parameter '" + s.name + "' of " +
                                                    (s.unit == 0 ? "the root unit" : u.name) +
                                                    " (" + u.module->name() + ")"});
            show(s);
        }
    }

    /// The engine's binder: points parameter s at values `v` and, inside backward,
    /// its gradient at `g` (empty views: released).
    void bind(slot& s, view<value_type> v, view<value_type> g) {
        if (detached_) {
            return;
        }
        detail::point(s.value, v.data, v.size * sizeof(value_type));
        detail::point(s.grad, g.data, g.size * sizeof(value_type));
        show(s);
    }

    /// Makes parameter s show what its storages hold: its values in the engine's
    /// memory, or, released, no memory and the dispatch key whose kernel refuses any
    /// use naming it (not a read of freed memory, nor a computation on an empty
    /// tensor; shape [0] where that kernel is not unison's); its gradient the engine's gradient
    /// memory inside backward, undefined outside (so that a gradient produced outside
    /// the unit's backward cannot land in the engine's memory unnoticed).
    void show(slot& s) {
        if (s.value.data() != nullptr) {
            detail::show_as(s.param, detail::tensor_on(s.value, s.shape, s.param.dtype()));
        } else if (detail::released_parameters::instance().enabled()) {
            detail::show_as(s.param, detail::tensor_on(s.value, s.shape, s.param.dtype(), true));
        } else {
            detail::show_as(s.param, at::empty({0}, s.param.options().requires_grad(false)));
        }
        if (s.grad.data() != nullptr) {
            s.param.mutable_grad() = detail::tensor_on(s.grad, s.shape, s.param.dtype());
        } else {
            s.param.mutable_grad() = at::Tensor();
        }
    }

    void attach() {
        for (std::size_t u = 0; u < units_.size(); ++u) {
            if (units_[u].slots.empty()) {
                continue;
            }
            if (!detail::unit_registry::instance().add(units_[u].module,
                                                       detail::unit_entry{this, u})) {
                fail(units_[u].name + " is a unit of another engine already");
            }
            units_[u].registered = true;
        }
        for (std::size_t i = 0; i < slots_.size(); ++i) {
            hooks_.install(i, [this, i] { gradient_ready(i); });
        }
    }

    /// Removes the hooks and the units. The parameters keep what they hold while
    /// resident; with `restore_original` (construction failed) each gets back its
    /// own tensor and gradient from before construction.
    void detach(bool restore_original) noexcept {
        detached_ = true;
        for (unit_info& u : units_) {
            if (u.registered) {
                detail::unit_registry::instance().remove(u.module);
                u.registered = false;
            }
        }
        hooks_.remove_all();
        for (slot& s : slots_) {
            try {
                detail::released_parameters::instance().remove(s.value.unsafeGetStorageImpl());
                if (restore_original && s.original.defined()) {
                    detail::show_as(s.param, s.original);
                    s.param.mutable_grad() = s.original_grad;
                    continue;
                }
                if (s.value.data() != nullptr) { // resident: the module keeps its values
                    detail::show_as(s.param, s.param.detach().clone());
                } else { // released: empty, and no longer refused
                    detail::show_as(s.param,
                                    at::empty({0}, s.param.options().requires_grad(false)));
                }
                s.param.mutable_grad() = at::Tensor();
            } catch (...) { // nothing to report to: the engine is going away
            }
        }
    }

    // ------------------------------------------------------------ unit_runner

    void enter_forward(std::size_t u, bool recompute) override {
        if (recompute) {
            engine_.before_recompute(units_[u].handle);
        } else {
            engine_.before_forward(units_[u].handle);
        }
    }
    void leave_forward(std::size_t u, bool recompute) override {
        if (recompute) {
            engine_.after_recompute(units_[u].handle);
        } else {
            engine_.after_forward(units_[u].handle);
        }
    }
    void abandon_forward(std::size_t u, bool recompute) noexcept override {
        try {
            leave_forward(u, recompute);
        } catch (...) { // already failing: the first error is the one to report
        }
    }
    void hook_output(std::size_t u, const at::Tensor& output) override {
        output.register_hook([this, u](const at::Tensor& grad) {
            enter_backward(u);
            return grad;
        });
    }

    // -------------------------------------------------------------- backward

    /// The first gradient reaching one of unit u's outputs: gather it for backward.
    void enter_backward(std::size_t u) {
        guard_.check(engine_.communicator().rank(), "torch::fsdp backward");
        unit_info& info = units_[u];
        if (info.in_backward) {
            return;
        }
        if (!callback_queued_) {
            callback_queued_ = true;
            ::torch::autograd::Engine::get_default_engine().queue_callback(
                [this] { end_backward(); });
        }
        engine_.before_backward(info.handle);
        info.in_backward = true;
        info.ready = 0;
    }

    /// Autograd has accumulated parameter i's gradient for this backward.
    void gradient_ready(std::size_t i) {
        guard_.check(engine_.communicator().rank(), "torch::fsdp backward");
        unit_info& info = units_[slots_[i].unit];
        if (!info.in_backward) {
            fail("parameter '" + slots_[i].name + "' got its gradient outside the backward of " +
                 info.name +
                 ": a parameter must be used only inside its unit's forward (through "
                 "unit_forward)");
        }
        present_.resize(slots_.size(), 0);
        present_[i] = 1;
        if (++info.ready == info.slots.size()) {
            complete(slots_[i].unit);
        }
    }

    /// Parameters that no rank's backward reached in this window have no gradient
    /// in one process either: the engine's update leaves them as they are (one
    /// small all-reduce decides it alike on every rank).
    void mark_parameters_without_gradient() {
        present_.resize(slots_.size(), 0);
        unison::detail::control_all_reduce(engine_.communicator(), engine_.parameters().placement(),
                                           std::span<std::int64_t>(present_), reduce_op::max);
        for (std::size_t i = 0; i < slots_.size(); ++i) {
            if (present_[i] == 0) {
                engine_.no_gradient(slots_[i].handle);
            }
        }
    }

    /// Every gradient of unit u is in: reduce-scatter them and release the unit.
    void complete(std::size_t u) {
        unit_info& info = units_[u];
        info.in_backward = false;
        engine_.complete_backward(info.handle);
        for (const std::size_t i : info.slots) { // the engine owns the gradients from here
            detail::point(slots_[i].grad, nullptr, 0);
            show(slots_[i]);
        }
    }

    /// Autograd's final callback: units with parameters that got no gradient.
    void end_backward() {
        callback_queued_ = false;
        for (std::size_t u = 0; u < units_.size(); ++u) {
            if (units_[u].in_backward) {
                complete(u);
            }
        }
    }

    /// `t`'s values in host memory of their own.
    static at::Tensor host_copy(const at::Tensor& t) {
        return t.detach().to(at::kCPU, /*non_blocking=*/false, /*copy=*/true);
    }

    /// Parameter `p`'s full values in a host tensor of its own (collective for sharded
    /// parameters of a unit that is not gathered).
    at::Tensor full_value(const at::Tensor& p) {
        const auto it = slot_of_.find(p.unsafeGetTensorImpl());
        if (it == slot_of_.end()) {
            return host_copy(p); // frozen: the module's own
        }
        const slot& s = slots_[it->second];
        at::Tensor out =
            at::empty(s.shape, s.param.options().device(at::kCPU).requires_grad(false));
        engine_.copy_full(s.handle, out);
        return out;
    }

    // The engine is declared after the slots: it is destroyed first, and its
    // destructor may still call the binders, which point the slots' storages.
    std::shared_ptr<::torch::nn::Module> model_;
    detail::module_claim claim_; ///< no other engine drives these parameters
    std::vector<slot> slots_;
    detail::gradient_hooks hooks_; ///< slot i's AccumulateGrad node is hooks_'s node i
    /// Slot of each trainable parameter (show_as keeps a tensor's TensorImpl).
    std::unordered_map<const c10::TensorImpl*, std::size_t> slot_of_;
    std::vector<unit_info> units_;
    std::vector<at::Tensor> frozen_;
    std::optional<unison::device> placed_; ///< the device setup's GPU; host when none
    detail::backward_thread_guard guard_;
    engine_type engine_;
    /// By slot: whether its gradient was accumulated in this window on this rank.
    std::vector<std::int64_t> present_;
    bool callback_queued_ = false;
    bool detached_ = false; ///< destroying: the module no longer follows the engine
};

} // namespace unison::torch

namespace unison {

/// Collective: the engine's sharded checkpoint (parameters, optimizer state, step;
/// see sharded/checkpoint.hpp), readable at any world size and strategy.
template <communicator C, class... Policies>
void save_checkpoint(const std::filesystem::path& dir, torch::fsdp<C, Policies...>& engine) {
    save_checkpoint(dir, engine.engine());
}

/// Collective: restores a checkpoint written by save_checkpoint into the engine
/// (the module must be the one it was saved from, at any world size).
template <communicator C, class... Policies>
void load_checkpoint(const std::filesystem::path& dir, torch::fsdp<C, Policies...>& engine) {
    load_checkpoint(dir, engine.engine());
}

} // namespace unison
