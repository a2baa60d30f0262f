#pragma once

// Sharded training equals DDP and single-process training. Each rank trains the
// example framework's MLP (examples/common/nn) with its parameters and gradients
// held by a sharded_parameters (one unit per linear layer) and updated by a
// partitioned_optimizer; next to it the same rank trains the model under
// unison::ddp and, by itself, a single-process reference on the whole batch. After
// every step the full parameters are compared with both.
//
// The cases run over a memory space (tests/support/memory_space.hpp). The MLP
// computes on the host; on a device space the engine keeps the parameters,
// gradients and optimizer state on the GPU, and sharded_binding copies each unit's
// values and gradients between the engine and the model around the layer hooks.
// DDP, in the same space, holds copies of its model's parameters and gradients
// there (staged_ddp_binding).

#include "../ddp/training.hpp"
#include "accounting.hpp"

#include <unison/sharded.hpp>

#include <cmath>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace unison::test {

/// Connects an nn::mlp to an fsdp engine in memory space `Space`: one unit per linear
/// layer, the model's layer hooks entering and leaving the units. This is all the
/// glue a framework with pre/post hooks needs.
///
/// On host memory each parameter's value and gradient are bound to the engine's
/// memory, so forward reads and backward accumulates there directly. The model
/// computes on the host only, so on device memory it keeps its own storage instead:
/// the binder records the engine's views, a unit's forward and backward start by
/// loading its values into the model (a sharded strategy gathers them again for
/// backward), its backward also loads the gradient accumulated so far (the model's
/// backward adds to it), and its end stores the gradient back before the engine
/// reduces it.
template <class T, class Engine, class Space = host_space>
class sharded_binding {
public:
    sharded_binding(nn::mlp<T>& model, Engine& engine) : model_(&model), engine_(&engine) {
        // Into the space before the first unit: units are allocated as they are added.
        Space::attach(engine.communicator(), engine);
        for (std::size_t k = 0; k < model.layer_count(); ++k) {
            const std::vector<nn::parameter<T>*> layer = model.layer_parameters(k);
            views_.emplace_back(layer.size());
            std::vector<typename Engine::parameter> params;
            for (std::size_t j = 0; j < layer.size(); ++j) {
                nn::parameter<T>* p = layer[j];
                if constexpr (Space::on_host) {
                    params.emplace_back(p->name, p->own_value, [p](view<T> v, view<T> g) {
                        p->bind_value(v); // empty views: nn's own memory again
                        p->bind_grad(g);
                    });
                } else {
                    params.emplace_back(p->name, p->own_value, [this, k, j](view<T> v, view<T> g) {
                        views_[k][j] = {v, g}; // empty views: released
                    });
                }
            }
            units_.push_back(engine.add_unit(params));
        }
        model.before_forward = [this](std::size_t k) {
            engine_->before_forward(units_[k]);
            if constexpr (!Space::on_host) {
                load_values(k);
            }
        };
        model.after_forward = [this](std::size_t k) { engine_->after_forward(units_[k]); };
        model.before_backward = [this](std::size_t k) {
            engine_->before_backward(units_[k]);
            if constexpr (!Space::on_host) {
                load_values(k); // backward reads the weights, gathered again where sharded
                load_gradients(k);
            }
        };
        model.after_backward = [this](std::size_t k) {
            if (poison_ && k == 0) {
                model_->layer_parameters(0)[0]->grad[0] = std::numeric_limits<T>::quiet_NaN();
                poison_ = false;
            }
            if constexpr (!Space::on_host) {
                store_gradients(k); // before after_backward starts reducing them
            }
            engine_->after_backward(units_[k]);
        };
    }

    // The binders and hooks hold `this`.
    sharded_binding(const sharded_binding&) = delete;
    sharded_binding& operator=(const sharded_binding&) = delete;

    /// The next backward writes a NaN into this rank's first gradient element.
    void poison_next_backward() { poison_ = true; }

    const std::vector<unit_handle>& units() const { return units_; }

    /// Every parameter's full values, in model.parameters() order. Collective when
    /// parameters are sharded (each unit's forward scope gathers it).
    std::vector<std::vector<T>> snapshot() {
        std::vector<std::vector<T>> out;
        for (const unit_handle& u : units_) {
            auto scope = engine_->forward(u);
            for (std::size_t j = 0; j < u.size(); ++j) {
                const auto v = engine_->value(u[j]);
                out.emplace_back(v.size);
                Space::load(engine_->communicator(),
                            const_buffer(v.data, v.size, dtype_of<T>, v.location),
                            out.back().data());
            }
        }
        engine_->release_all(); // shard::grad_op keeps forward's units gathered
        return out;
    }

private:
    /// What the engine last bound to one parameter (device spaces only).
    struct bound_views {
        view<T> value, grad;
    };

    /// The engine's memory bound to unit k's parameter j: its gradient when
    /// `gradient`, else its values. The unit must be entered (the gradient: in
    /// backward).
    buffer engine_memory(std::size_t k, std::size_t j, bool gradient) const {
        const view<T>& v = gradient ? views_[k][j].grad : views_[k][j].value;
        const nn::parameter<T>& p = *model_->layer_parameters(k)[j];
        if (v.data == nullptr || v.size != p.size()) {
            throw std::logic_error("sharded_binding: the engine has not bound the " +
                                   std::string(gradient ? "gradient" : "values") + " of '" +
                                   p.name + "'");
        }
        return {v.data, v.size, dtype_of<T>, v.location};
    }
    void load_values(std::size_t k) {
        const std::vector<nn::parameter<T>*> layer = model_->layer_parameters(k);
        for (std::size_t j = 0; j < layer.size(); ++j) {
            Space::load(engine_->communicator(), engine_memory(k, j, false),
                        layer[j]->value.data());
        }
    }
    void load_gradients(std::size_t k) {
        const std::vector<nn::parameter<T>*> layer = model_->layer_parameters(k);
        for (std::size_t j = 0; j < layer.size(); ++j) {
            Space::load(engine_->communicator(), engine_memory(k, j, true), layer[j]->grad.data());
        }
    }
    void store_gradients(std::size_t k) {
        const std::vector<nn::parameter<T>*> layer = model_->layer_parameters(k);
        for (std::size_t j = 0; j < layer.size(); ++j) {
            Space::store(engine_->communicator(), engine_memory(k, j, true), layer[j]->grad.data());
        }
    }

    nn::mlp<T>* model_;
    Engine* engine_;
    std::vector<unit_handle> units_;
    std::vector<std::vector<bound_views>> views_; // by unit, then parameter
    bool poison_ = false;
};

inline optim::sgd sgd_hyper() {
    return {0.1, 0.9, 1e-3};
}
inline optim::adamw adamw_hyper() {
    return {1e-2, 0.9, 0.999, 1e-8, 1e-2};
}

struct sharded_case_options {
    double max_grad_norm = 0.0;
    int poison_step = -1;         ///< a step in which one rank's gradient holds a NaN
    bool no_decay_biases = false; ///< AdamW: biases in a group without weight decay
    int prefetch = 1;
    int max_live_units = 0;
};

/// The references' optimizer: nn's, with the biases in a second AdamW without
/// weight decay when asked (PyTorch's two parameter groups).
template <class T>
struct reference_optimizer {
    std::optional<optimizer<T>> all;
    std::unique_ptr<nn::adamw<T>> weights, biases;
    reference_optimizer(optimizer_kind kind, const std::vector<nn::parameter<T>*>& params,
                        bool no_decay_biases) {
        if (!no_decay_biases) {
            all.emplace(kind, params);
            return;
        }
        std::vector<nn::parameter<T>*> w, b;
        for (nn::parameter<T>* p : params) {
            (p->name.ends_with(".bias") ? b : w).push_back(p);
        }
        weights = std::make_unique<nn::adamw<T>>(w, T(1e-2));
        biases = std::make_unique<nn::adamw<T>>(b, T(1e-2), T(0.9), T(0.999), T(1e-8), T(0));
    }
    void step() {
        if (all) {
            all->step();
        } else {
            weights->step();
            biases->step();
        }
    }
};

/// Sharded training with `Policies` (the engine's strategy and precision; the
/// optimizer `O`), its engine in memory space `Space`, vs DDP vs single-process
/// training, for `training_steps` steps; `tol` bounds every parameter's relative
/// error after every step. With a poisoned step, every rank must skip it bit for bit
/// (and the references skip it too); with clipping, the references clip to the
/// global norm. DDP works on the same memory space.
template <class Space, class T, class O, class... Policies, communicator C>
void sharded_equivalence_run(C& comm, optimizer_kind kind, double tol, const std::string& name,
                             sharded_case_options opts) {
    using engine_type = fsdp<C, O, Policies...>;
    const auto n = static_cast<std::size_t>(comm.size());
    require_even_batches(n);
    const auto rank = static_cast<std::size_t>(comm.rank());
    const auto data = nn::make_classification<T>(global_batch * training_steps, mlp_widths.front(),
                                                 mlp_widths.back(), 5);

    nn::mlp<T> model(mlp_widths, 100);
    nn::mlp<T> ddp_model(mlp_widths, 100 + rank); // ddp start() broadcasts rank 0's
    nn::mlp<T> reference(mlp_widths, 100);

    O hyper;
    if constexpr (std::is_same_v<O, optim::sgd>) {
        hyper = sgd_hyper();
    } else {
        hyper = adamw_hyper();
    }
    engine_type engine(comm, {.optimizer = hyper,
                              .max_grad_norm = opts.max_grad_norm,
                              .prefetch = opts.prefetch,
                              .max_live_units = opts.max_live_units,
                              .shard_group_size = hybrid_group(comm.size())});
    sharded_binding<T, engine_type, Space> binding(model, engine); // puts the engine in Space
    if constexpr (std::is_same_v<O, optim::adamw>) {
        for (const unit_handle& u : binding.units()) {
            for (std::size_t j = 0; j < u.size() && opts.no_decay_biases; ++j) {
                engine.set_weight_decay(u[j], !engine.name(u[j]).ends_with(".bias"));
            }
        }
    }
    engine.start();

    using ddp_type = ddp<C>;
    ddp_type dp(comm);
    space_ddp_binding<T, ddp_type, Space> ddp_bind(ddp_model, dp);
    dp.start();
    ddp_bind.after_start();
    reference_optimizer<T> ddp_opt(kind, ddp_model.parameters(), opts.no_decay_biases);
    reference_optimizer<T> ref_opt(kind, reference.parameters(), opts.no_decay_biases);

    // Clip like torch.nn.utils.clip_grad_norm_, on the full gradients.
    auto clip = [&](nn::mlp<T>& m) {
        if (opts.max_grad_norm <= 0.0) {
            return 0.0;
        }
        double sq = 0.0;
        for (nn::parameter<T>* p : m.parameters()) {
            for (T g : p->grad) {
                sq += static_cast<double>(g) * static_cast<double>(g);
            }
        }
        const double norm = std::sqrt(sq);
        const double coef = opts.max_grad_norm / (norm + 1e-6);
        if (coef < 1.0) {
            for (nn::parameter<T>* p : m.parameters()) {
                for (T& g : p->grad) {
                    g = static_cast<T>(static_cast<double>(g) * coef);
                }
            }
        }
        return norm;
    };

    const std::size_t shard = global_batch / n;
    outcome o;
    for (int step = 0; step < training_steps; ++step) {
        const std::size_t base = static_cast<std::size_t>(step) * global_batch;
        const auto mine = nn::slice(data, base + rank * shard, base + (rank + 1) * shard);
        const bool poisoned = step == opts.poison_step;

        if (poisoned && rank == static_cast<std::size_t>(step) % n) {
            binding.poison_next_backward();
        }
        const auto loss = nn::softmax_cross_entropy<T>(model.forward(mine.x), mine.labels,
                                                       T(1) / static_cast<T>(shard));
        model.backward(loss.dlogits);
        std::vector<std::vector<T>> before;
        if (poisoned) {
            before = binding.snapshot();
        }
        const step_result r = engine.step(); // and the gradients are zero again
        const std::uint64_t steps = engine.steps();
        if (poisoned) {
            o.expect(r.skipped,
                     "step " + std::to_string(step) + ": a NaN gradient was not skipped");
            o.expect(binding.snapshot() == before,
                     "step " + std::to_string(step) + ": a skipped step changed the parameters");
        } else {
            o.expect(!r.skipped, "step " + std::to_string(step) + " skipped without a NaN");
        }

        // DDP and the single-process reference (both skip the poisoned step).
        ddp_model.zero_grad();
        const auto ddp_loss = nn::softmax_cross_entropy<T>(ddp_model.forward(mine.x), mine.labels,
                                                           T(1) / static_cast<T>(shard));
        ddp_model.backward(ddp_loss.dlogits);
        (void)dp.finish();
        ddp_bind.after_sync();
        reference.zero_grad();
        const auto whole = nn::slice(data, base, base + global_batch);
        const auto ref_loss = nn::softmax_cross_entropy<T>(reference.forward(whole.x), whole.labels,
                                                           T(1) / static_cast<T>(global_batch));
        reference.backward(ref_loss.dlogits);
        if (!poisoned) {
            clip(ddp_model);
            const double norm = clip(reference);
            if (opts.max_grad_norm > 0.0) {
                o.expect(std::abs(r.grad_norm - norm) <= 1e-5 * norm,
                         "step " + std::to_string(step) + ": global gradient norm " +
                             std::to_string(r.grad_norm) + ", reference " + std::to_string(norm));
            }
            ddp_opt.step();
            ddp_bind.after_step();
            ref_opt.step();
        }
        const std::uint64_t expected_steps =
            static_cast<std::uint64_t>(step + 1) -
            (opts.poison_step >= 0 && step >= opts.poison_step ? 1 : 0);
        o.expect(steps == expected_steps, "step counter " + std::to_string(steps) + ", expected " +
                                              std::to_string(expected_steps));

        const auto got = binding.snapshot();
        const auto ddp_params = ddp_model.parameters();
        const auto ref_params = reference.parameters();
        for (std::size_t p = 0; p < got.size(); ++p) {
            const double err = relative_error<T>(got[p], ref_params[p]->value);
            o.expect(err <= tol, [&] {
                return "step " + std::to_string(step) + " parameter " + ref_params[p]->name +
                       " relative error " + std::to_string(err) + " against single-process";
            });
            const double ddp_err = relative_error<T>(got[p], ddp_params[p]->value);
            o.expect(ddp_err <= tol, [&] {
                return "step " + std::to_string(step) + " parameter " + ref_params[p]->name +
                       " relative error " + std::to_string(ddp_err) + " against DDP";
            });
        }
    }
    const memory_report m = engine.memory();
    if constexpr (engine_type::strategy::params_sharded) {
        const int limit = opts.max_live_units;
        o.expect(limit == 0 || m.live_units_peak <= limit,
                 "peak of " + std::to_string(m.live_units_peak) + " live units over the limit " +
                     std::to_string(limit));
        o.expect(m.gathered_now == 0, "gathered memory left after the steps: " +
                                          std::to_string(m.gathered_now) + " bytes");
    }
    UNISON_CHECK_CASE(comm, name, o);
}

template <class Space, class T, class... Policies, communicator C>
void sharded_equivalence_case(C& comm, optimizer_kind kind, double tol, const std::string& name,
                              sharded_case_options opts = {}) {
    if (kind == optimizer_kind::sgd_momentum) {
        sharded_equivalence_run<Space, T, optim::sgd, Policies...>(comm, kind, tol, name, opts);
    } else {
        sharded_equivalence_run<Space, T, optim::adamw, Policies...>(comm, kind, tol, name, opts);
    }
}

template <class Space = host_space, communicator C>
void sharded_training_cases(C& comm) {
    using namespace unison::policy;
    constexpr auto sgd = optimizer_kind::sgd_momentum;
    constexpr auto adamw = optimizer_kind::adamw;
    sharded_equivalence_case<Space, float, zero<0>>(comm, sgd, 1e-6, "zero<0> SGD");
    sharded_equivalence_case<Space, float, zero<1>>(comm, adamw, 1e-6, "zero<1> AdamW");
    sharded_equivalence_case<Space, float, zero<1>>(comm, sgd, 1e-6, "zero<1> SGD");
    sharded_equivalence_case<Space, float, zero<2>>(comm, adamw, 1e-6, "zero<2> AdamW");
    sharded_equivalence_case<Space, float, zero<2>>(comm, sgd, 1e-6, "zero<2> SGD");
    sharded_equivalence_case<Space, float, zero<3>>(comm, adamw, 1e-6, "zero<3> AdamW");
    sharded_equivalence_case<Space, float, zero<3>>(comm, sgd, 1e-6, "zero<3> SGD");
    sharded_equivalence_case<Space, float, shard::full>(comm, adamw, 1e-6, "shard::full AdamW");
    sharded_equivalence_case<Space, float, shard::grad_op>(comm, adamw, 1e-6,
                                                           "shard::grad_op AdamW");
    sharded_equivalence_case<Space, float, shard::none>(comm, adamw, 1e-6, "shard::none AdamW");
    sharded_equivalence_case<Space, float, shard::hybrid>(comm, adamw, 1e-6, "shard::hybrid AdamW");
    sharded_equivalence_case<Space, float, shard::hybrid>(comm, sgd, 1e-6, "shard::hybrid SGD");
    sharded_equivalence_case<Space, float, shard::full>(comm, adamw, 1e-6,
                                                        "shard::full prefetch 2, max_live_units 2",
                                                        {.prefetch = 2, .max_live_units = 2});
    sharded_equivalence_case<Space, float, shard::grad_op>(
        comm, sgd, 1e-6, "shard::grad_op, no prefetch", {.prefetch = 0});
    sharded_equivalence_case<Space, double, zero<3>, mixed_precision<dtype::f64>>(
        comm, adamw, 1e-13, "zero<3> f64 AdamW");
    // f64 master weights for f32 parameters: the optimizer runs in double and rounds
    // into the f32 parameters, so it drifts from the all-f32 references by rounding.
    sharded_equivalence_case<Space, float, zero<2>,
                             mixed_precision<dtype::f32, dtype::f32, dtype::f64>>(
        comm, adamw, 1e-5, "zero<2> f64 master weights");
    sharded_equivalence_case<Space, float, zero<3>>(comm, sgd, 1e-6, "zero<3> clipped to norm 0.5",
                                                    {0.5, -1});
    sharded_equivalence_case<Space, float, zero<1>>(comm, adamw, 1e-6,
                                                    "zero<1> clipped to norm 0.5", {0.5, -1});
    sharded_equivalence_case<Space, float, zero<3>>(comm, adamw, 1e-6,
                                                    "zero<3> NaN at step 7 skipped", {0.0, 7});
    sharded_equivalence_case<Space, float, zero<2>>(comm, sgd, 1e-6,
                                                    "zero<2> NaN at step 3 skipped", {0.0, 3});
    sharded_equivalence_case<Space, float, zero<0>>(comm, adamw, 1e-6,
                                                    "zero<0> NaN at step 5 skipped", {0.0, 5});
    sharded_equivalence_case<Space, float, zero<3>>(
        comm, adamw, 1e-6, "zero<3> AdamW, biases not decayed", {0.0, -1, true});
    sharded_equivalence_case<Space, float, zero<1>>(
        comm, adamw, 1e-6, "zero<1> AdamW, biases not decayed", {0.0, -1, true});
}

} // namespace unison::test
