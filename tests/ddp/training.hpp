#pragma once

// DDP training equals single-process training. Each rank trains the example
// framework's MLP (examples/common/nn) on its share of every global batch under
// unison::ddp; every rank also trains, by itself, a reference copy on the whole
// batch, and after every step each parameter is compared with the reference.
//
// The equivalence cases run on a memory space (tests/support/memory_space.hpp).
// The model always computes on the host; on host memory ddp works on the model's
// own parameters and gradients, and on any other space on copies of them in the
// space, which the model's values and gradients are staged through around each
// step (staged_ddp_binding), so that ddp takes the paths it takes for a framework
// that trains on that memory.

#include "../collectives/cases.hpp"
#include "../support/memory_space.hpp"

#include "nn/nn.hpp"

#include <unison/ddp.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <vector>

namespace unison::test {

inline const std::vector<std::size_t> mlp_widths = {12, 24, 16, 5};
inline constexpr std::size_t global_batch = 24; // divisible by 1, 2, 3, 4, 6 and 8 ranks
inline constexpr int training_steps = 20;

/// Stops a training reference at `ranks` ranks unless they split global_batch
/// evenly, as the references do (at 5 ranks they would drop samples and differ).
inline void require_even_batches(std::size_t ranks) {
    REQUIRE_MESSAGE(global_batch % ranks == 0, "the reference splits a batch of ", global_batch,
                    " samples evenly: run at a rank count that divides it, not ", ranks);
}

/// max |a - b| / max |b| over one parameter: relative to the tensor's scale, so
/// elements near zero do not dominate.
template <class T>
double relative_error(std::span<const T> a, std::span<const T> b) {
    double diff = 0.0, scale = 0.0;
    for (std::size_t i = 0; i < a.size(); ++i) {
        diff = std::max(diff, std::abs(static_cast<double>(a[i]) - static_cast<double>(b[i])));
        scale = std::max(scale, std::abs(static_cast<double>(b[i])));
    }
    return scale == 0.0 ? diff : diff / scale;
}

enum class optimizer_kind { sgd_momentum, adamw };

template <class T>
struct optimizer {
    std::unique_ptr<nn::sgd<T>> sgd;
    std::unique_ptr<nn::adamw<T>> adamw;
    optimizer(optimizer_kind kind, std::vector<nn::parameter<T>*> params) {
        if (kind == optimizer_kind::sgd_momentum) {
            sgd = std::make_unique<nn::sgd<T>>(std::move(params), T(0.1), T(0.9), T(1e-3));
        } else {
            adamw = std::make_unique<nn::adamw<T>>(std::move(params), T(1e-2));
        }
    }
    void step() { sgd ? sgd->step() : adamw->step(); }
};

/// Connects a model's backward hooks to a ddp's mark_ready and, with
/// gradients_in_buckets, points the model's gradients at the bucket views (again
/// after the rebuild moves them).
template <class T, class Ddp>
class ddp_binding {
public:
    ddp_binding(nn::mlp<T>& model, Ddp& dp) : model_(&model), dp_(&dp) {
        for (nn::parameter<T>* p : model.parameters()) {
            index_[p] = dp.add_parameter(p->value, p->grad, p->name);
        }
        model.on_grad_ready = [this](nn::parameter<T>& p) { dp_->mark_ready(index_.at(&p)); };
    }
    /// Call after dp.start() and after every finish().
    void refresh_views() {
        if constexpr (Ddp::reducer_type::config::gradient_memory::in_buckets) {
            if (dp_->reducer().layout_version() != version_) {
                version_ = dp_->reducer().layout_version();
                for (nn::parameter<T>* p : model_->parameters()) {
                    auto v = dp_->reducer().template gradient<T>(index_.at(p));
                    p->bind_grad(std::span<T>(v.data, v.size));
                }
            }
        }
    }

private:
    nn::mlp<T>* model_;
    Ddp* dp_;
    std::unordered_map<const nn::parameter<T>*, std::size_t> index_;
    std::uint64_t version_ = ~std::uint64_t{0};
};

/// ddp_binding on host memory, with the calls a case makes around each step (see
/// staged_ddp_binding): there the model's own memory is ddp's, so they only refresh
/// the bucket views where ddp_binding's users refresh them.
template <class T, class Ddp>
class host_ddp_binding : public ddp_binding<T, Ddp> {
public:
    using ddp_binding<T, Ddp>::ddp_binding;
    /// Call after dp.start().
    void after_start() { this->refresh_views(); }
    /// Call after the finish() that synchronized, before the optimizer step.
    void after_sync() { this->refresh_views(); }
    /// Call after the optimizer step.
    void after_step() {}
};

/// Connects a host model to a ddp whose parameters and gradients live in memory
/// space `Space` (not host memory): ddp holds a copy of every parameter and its
/// gradient in the space, and the model's host values and gradients are copied
/// to and from them where a framework training on that memory would have them:
///   - the constructor puts ddp in the space (before anything is added to it)
///     and registers the copies, initialized from the model's values and zeros;
///   - after_start() brings the values start() broadcast from the root rank back
///     into the model;
///   - each backward hook stores the model's gradient, as accumulated over the
///     micro-batches so far, where ddp reads it (the gradient's copy, or its place
///     in a bucket with gradients_in_buckets), then marks it ready; a gradient that
///     is never ready (an unused parameter) is never stored;
///   - after_sync() loads the synchronized gradients into the model, for its host
///     optimizer;
///   - after_step() stores the updated values into the copies, which then hold what
///     an optimizer on that memory would have left there.
template <class T, class Ddp, class Space>
class staged_ddp_binding {
public:
    staged_ddp_binding(nn::mlp<T>& model, Ddp& dp) : dp_(&dp) {
        auto& comm = dp.communicator();
        Space::attach(comm, dp);
        params_ = model.parameters();
        // Every tensor is made before any is registered: ddp keeps their addresses.
        values_.reserve(params_.size());
        grads_.reserve(params_.size());
        for (nn::parameter<T>* p : params_) {
            host_buffer initial(dtype_of<T>, p->size());
            std::memcpy(initial.bytes.data(), p->value.data(), p->size() * sizeof(T));
            values_.push_back(Space::make(comm, std::move(initial)));
            grads_.push_back(Space::make(comm, host_buffer(dtype_of<T>, p->size())));
        }
        for (std::size_t k = 0; k < params_.size(); ++k) {
            index_.push_back(
                dp.add_parameter(values_[k].view(), grads_[k].view(), params_[k]->name));
            slot_[params_[k]] = k;
        }
        model.on_grad_ready = [this](nn::parameter<T>& p) {
            const std::size_t k = slot_.at(&p);
            Space::store(dp_->communicator(), gradient_memory(k), p.grad.data());
            dp_->mark_ready(index_[k]);
        };
    }
    staged_ddp_binding(const staged_ddp_binding&) = delete; // the hook points at this object
    staged_ddp_binding& operator=(const staged_ddp_binding&) = delete;

    /// Call after dp.start(): the model takes the values every rank now holds.
    void after_start() {
        for (std::size_t k = 0; k < params_.size(); ++k) {
            Space::load(dp_->communicator(), values_[k].view(), params_[k]->value.data());
        }
    }
    /// Call after the finish() that synchronized, before the optimizer step.
    void after_sync() {
        for (std::size_t k = 0; k < params_.size(); ++k) {
            Space::load(dp_->communicator(), gradient_memory(k), params_[k]->grad.data());
        }
    }
    /// Call after the optimizer step.
    void after_step() {
        for (std::size_t k = 0; k < params_.size(); ++k) {
            Space::store(dp_->communicator(), values_[k].view(), params_[k]->value.data());
        }
    }

private:
    /// Where ddp reads and writes parameter k's gradient. Bucket views are fetched
    /// on every use: the rebuild after the first synchronizing step moves them.
    buffer gradient_memory(std::size_t k) {
        if constexpr (Ddp::reducer_type::config::gradient_memory::in_buckets) {
            const view<T> v = dp_->reducer().template gradient<T>(index_[k]);
            return {v.data, v.size, dtype_of<T>, v.location};
        } else {
            return grads_[k].view();
        }
    }

    Ddp* dp_;
    std::vector<nn::parameter<T>*> params_;
    std::vector<typename Space::tensor> values_, grads_;
    std::vector<std::size_t> index_; // ddp's index of parameter k
    std::unordered_map<const nn::parameter<T>*, std::size_t> slot_;
};

/// The binding a case uses on memory space `Space`: on host memory, ddp_binding's
/// behaviour exactly (ddp on nn's own spans); elsewhere, the staged one.
template <class T, class Ddp, class Space>
using space_ddp_binding =
    std::conditional_t<Space::on_host, host_ddp_binding<T, Ddp>, staged_ddp_binding<T, Ddp, Space>>;

/// DDP with `Policies` at this world size vs single-process training on the whole
/// batch, for `training_steps` steps. Accumulation policies split each rank's shard
/// into K micro-batches. `tol` bounds the relative error of every parameter after
/// every step. The parameters and gradients ddp works on are in memory space `Space`.
template <class Space, class T, class... Policies, communicator C>
void ddp_equivalence_case(C& comm, optimizer_kind kind, double tol, const std::string& name,
                          ddp_options options = {}, bool unused_head = false) {
    using ddp_type = ddp<C, Policies...>;
    const int micro = options.accumulate_steps;
    const auto n = static_cast<std::size_t>(comm.size());
    require_even_batches(n);
    const auto rank = static_cast<std::size_t>(comm.rank());
    const auto data = nn::make_classification<T>(global_batch * training_steps, mlp_widths.front(),
                                                 mlp_widths.back(), 5);

    // Every rank starts from a different initialization: start() must broadcast rank 0's.
    nn::mlp<T> model(mlp_widths, 100 + rank, unused_head);
    nn::mlp<T> reference(mlp_widths, 100, unused_head);
    ddp_type dp(comm, options);
    space_ddp_binding<T, ddp_type, Space> binding(model, dp);
    dp.start();
    binding.after_start();
    optimizer<T> opt(kind, model.parameters());
    optimizer<T> ref_opt(kind, reference.parameters());

    const std::size_t shard = global_batch / n;
    const std::size_t micro_batch = shard / micro;
    outcome o;
    for (int step = 0; step < training_steps; ++step) {
        const std::size_t base = static_cast<std::size_t>(step) * global_batch;
        model.zero_grad();
        for (int m = 0; m < micro; ++m) {
            const std::size_t begin =
                base + rank * shard + static_cast<std::size_t>(m) * micro_batch;
            const std::size_t end =
                m + 1 == micro ? base + (rank + 1) * shard : begin + micro_batch;
            const auto batch = nn::slice(data, begin, end);
            const auto loss = nn::softmax_cross_entropy<T>(model.forward(batch.x), batch.labels,
                                                           T(1) / static_cast<T>(shard));
            model.backward(loss.dlogits);
            const bool synced = dp.finish();
            o.expect(synced == (m + 1 == micro), "finish() of micro-batch " + std::to_string(m) +
                                                     " returned " + (synced ? "true" : "false"));
        }
        binding.after_sync();
        opt.step();
        binding.after_step();

        reference.zero_grad();
        const auto whole = nn::slice(data, base, base + global_batch);
        const auto ref_loss = nn::softmax_cross_entropy<T>(reference.forward(whole.x), whole.labels,
                                                           T(1) / static_cast<T>(global_batch));
        reference.backward(ref_loss.dlogits);
        ref_opt.step();

        const auto params = model.parameters();
        const auto ref_params = reference.parameters();
        for (std::size_t p = 0; p < params.size(); ++p) {
            const double err = relative_error<T>(params[p]->value, ref_params[p]->value);
            o.expect(err <= tol, "step " + std::to_string(step) + " parameter " + params[p]->name +
                                     " relative error " + std::to_string(err));
        }
    }
    UNISON_CHECK_CASE(comm, name, o);
}

template <class Space, communicator C>
void ddp_training_cases(C& comm) {
    using namespace unison::policy;
    ddp_equivalence_case<Space, float>(comm, optimizer_kind::sgd_momentum, 1e-6,
                                       "f32 SGD momentum");
    ddp_equivalence_case<Space, float>(comm, optimizer_kind::adamw, 1e-6, "f32 AdamW");
    ddp_equivalence_case<Space, double>(comm, optimizer_kind::sgd_momentum, 1e-13,
                                        "f64 SGD momentum");
    ddp_equivalence_case<Space, double>(comm, optimizer_kind::adamw, 1e-13, "f64 AdamW");
    ddp_equivalence_case<Space, float, gradients_in_buckets>(
        comm, optimizer_kind::adamw, 1e-6, "f32 AdamW, gradients in buckets, small buckets",
        {.bucket_bytes = 4096, .first_bucket_bytes = 1024});
    ddp_equivalence_case<Space, double>(comm, optimizer_kind::sgd_momentum, 1e-13,
                                        "f64 SGD, accumulate_steps 2", {.accumulate_steps = 2});
    ddp_equivalence_case<Space, float, gradients_in_buckets>(
        comm, optimizer_kind::adamw, 1e-6, "f32 AdamW, accumulate_steps 2 in buckets",
        {.accumulate_steps = 2});
    ddp_equivalence_case<Space, double, unused_as_zero>(comm, optimizer_kind::sgd_momentum, 1e-13,
                                                        "f64 SGD with an unused head", {}, true);
    // bf16 reduction rounds every gradient to 8 significant bits (the per-element
    // bound is checked in reducer_policy_cases); over 20 steps of momentum SGD the
    // parameters drift by up to ~2% of their scale.
    ddp_equivalence_case<Space, float, mixed_precision<dtype::f32, dtype::bf16>>(
        comm, optimizer_kind::sgd_momentum, 5e-2, "f32 SGD, reduce in bf16");
}

/// Loss normalization: ranks and micro-batches hold deliberately uneven numbers of
/// samples; with normalize_loss the synchronized gradient (and so every parameter
/// after every step) equals single-process training on the global mean loss. The
/// naive per-micro-batch mean is checked to be measurably different, so the case
/// can tell the two apart. ddp works on memory space `Space`.
template <class Space, class T, communicator C>
void loss_normalization_case(C& comm, double tol, const std::string& name, bool average) {
    using ddp_type = ddp<C>;
    const int n = comm.size();
    const int rank = comm.rank();
    // Rank r holds 1 + 3r samples in its first micro-batch and 2 + 5r in its second;
    // the counts also change with the step.
    auto counts = [](int step, int r) {
        return std::pair<std::size_t, std::size_t>(static_cast<std::size_t>(1 + 3 * r + step % 2),
                                                   static_cast<std::size_t>(2 + 5 * r));
    };
    std::size_t per_step = 0;
    for (int r = 0; r < n; ++r) {
        per_step += counts(0, r).first + counts(0, r).second + 1;
    }
    const auto data = nn::make_classification<T>(per_step * training_steps, mlp_widths.front(),
                                                 mlp_widths.back(), 9);

    nn::mlp<T> model(mlp_widths, 200, false);
    nn::mlp<T> naive(mlp_widths, 200, false);
    nn::mlp<T> reference(mlp_widths, 200, false);
    ddp_type dp(comm, {.accumulate_steps = 2, .average = average});
    ddp_type naive_dp(comm);
    space_ddp_binding<T, ddp_type, Space> binding(model, dp);
    space_ddp_binding<T, ddp_type, Space> naive_binding(naive, naive_dp);
    dp.start();
    naive_dp.start();
    binding.after_start();
    naive_binding.after_start();
    nn::sgd<T> opt(model.parameters(), T(0.2));
    nn::sgd<T> naive_opt(naive.parameters(), T(0.2));
    nn::sgd<T> ref_opt(reference.parameters(), T(0.2));

    outcome o;
    double naive_gap = 0.0;
    std::size_t offset = 0;
    for (int step = 0; step < training_steps; ++step) {
        // Where each rank's samples start in this step's slice of the data.
        std::size_t start = offset, mine = 0, total = 0;
        for (int r = 0; r < n; ++r) {
            const auto [a, b] = counts(step, r);
            if (r == rank) {
                mine = start;
            }
            start += a + b;
            total += a + b;
        }
        const auto [first, second] = counts(step, rank);
        const auto norm = normalize_loss(dp.reducer(), static_cast<std::int64_t>(first + second));
        o.expect(norm.global_items == static_cast<std::int64_t>(total),
                 "normalize_loss counted " + std::to_string(norm.global_items) +
                     " items, expected " + std::to_string(total));
        model.zero_grad();
        naive.zero_grad();
        std::size_t begin = mine;
        for (std::size_t size : {first, second}) {
            const auto batch = nn::slice(data, begin, begin + size);
            const auto loss = nn::softmax_cross_entropy<T>(model.forward(batch.x), batch.labels,
                                                           static_cast<T>(norm.loss_scale));
            model.backward(loss.dlogits);
            (void)dp.finish(); // no_sync() or accumulate_steps decide; tested elsewhere
            // The classic bug: each micro-batch's mean, averaged over micro-steps and ranks.
            const auto naive_loss = nn::softmax_cross_entropy<T>(
                naive.forward(batch.x), batch.labels, T(1) / static_cast<T>(2 * size));
            naive.backward(naive_loss.dlogits);
            (void)naive_dp.finish();
            begin += size;
        }
        binding.after_sync();
        naive_binding.after_sync();
        opt.step();
        naive_opt.step();
        binding.after_step();
        naive_binding.after_step();

        reference.zero_grad();
        const auto whole = nn::slice(data, offset, offset + total);
        const auto ref_loss = nn::softmax_cross_entropy<T>(reference.forward(whole.x), whole.labels,
                                                           T(1) / static_cast<T>(total));
        reference.backward(ref_loss.dlogits);
        ref_opt.step();
        offset += total;

        const auto params = model.parameters();
        const auto naive_params = naive.parameters();
        const auto ref_params = reference.parameters();
        for (std::size_t p = 0; p < params.size(); ++p) {
            const double err = relative_error<T>(params[p]->value, ref_params[p]->value);
            o.expect(err <= tol, "step " + std::to_string(step) + " parameter " + params[p]->name +
                                     " relative error " + std::to_string(err));
            naive_gap = std::max(naive_gap,
                                 relative_error<T>(naive_params[p]->value, ref_params[p]->value));
        }
    }
    // With one rank the naive mean differs too (uneven micro-batches), so always.
    o.expect(naive_gap > 1e-3, "the naive per-micro-batch mean came within " +
                                   std::to_string(naive_gap) +
                                   " of the global mean; the case cannot tell them apart");
    UNISON_CHECK_CASE(comm, name, o);
}

template <class Space, communicator C>
void loss_normalization_cases(C& comm) {
    loss_normalization_case<Space, double>(comm, 1e-13, "normalize_loss f64, average", true);
    loss_normalization_case<Space, float>(comm, 1e-6, "normalize_loss f32, average", true);
    loss_normalization_case<Space, double>(comm, 1e-13, "normalize_loss f64, sum", false);
}

} // namespace unison::test
