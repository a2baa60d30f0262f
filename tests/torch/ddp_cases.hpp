#pragma once

// unison::torch::ddp against single-process LibTorch. Every rank builds the model
// from its own seed (construction must broadcast rank 0's parameters), trains on
// its share of every global batch with torch::optim::AdamW, and also trains, by
// itself, a reference copy from rank 0's seed on the whole batch; after every step
// each parameter is compared with the reference's.

#include "../collectives/cases.hpp"
#include "models.hpp"

#include <unison/torch.hpp>

#include <doctest/doctest.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace unison::test {

namespace tm = torch_models;

inline constexpr std::int64_t torch_global_batch = 24; // divisible by 1, 2, 3 and 4 ranks
inline constexpr int torch_steps = 20;

/// How a rank runs one step's backward(s): the plain loop, no_sync micro-batches,
/// accumulate_steps micro-batches, or gradients set to undefined between steps.
enum class torch_loop { plain, no_sync, accumulate_steps, set_to_none };

inline const char* name(torch_loop l) {
    switch (l) {
    case torch_loop::plain:
        return "plain";
    case torch_loop::no_sync:
        return "no_sync micro-batches";
    case torch_loop::accumulate_steps:
        return "accumulate_steps 2";
    case torch_loop::set_to_none:
        return "gradients set to undefined";
    }
    return "?";
}

/// AdamW with its defaults but a larger learning rate, so 20 steps move far.
inline ::torch::optim::AdamW adamw(const std::vector<at::Tensor>& params) {
    return ::torch::optim::AdamW(params, ::torch::optim::AdamWOptions(1e-2));
}

/// Every parameter of `model` within `tol` (relative) of `reference`'s after `step`.
inline void expect_same_parameters(outcome& o, ::torch::nn::Module& model,
                                   ::torch::nn::Module& reference, int step, double tol) {
    const auto params = model.named_parameters();
    const auto ref_params = reference.named_parameters();
    for (std::size_t p = 0; p < params.size(); ++p) {
        const double err =
            tm::relative_error(params[p].value().detach(), ref_params[p].value().detach());
        o.expect(err <= tol, [&] {
            return "step " + std::to_string(step) + " parameter " + params[p].key() +
                   " relative error " + std::to_string(err);
        });
    }
}

/// Every parameter of `model` has a gradient after `step` exactly where
/// `reference`'s has one: no engine makes a gradient that one process would not.
inline void expect_same_gradients_defined(outcome& o, ::torch::nn::Module& model,
                                          ::torch::nn::Module& reference, int step) {
    const auto params = model.named_parameters();
    const auto ref_params = reference.named_parameters();
    for (std::size_t p = 0; p < params.size(); ++p) {
        const bool mine = params[p].value().grad().defined();
        const bool theirs = ref_params[p].value().grad().defined();
        o.expect(mine == theirs, [&] {
            return "step " + std::to_string(step) + " parameter " + params[p].key() +
                   (mine ? " has a gradient" : " has no gradient") + ", the reference's " +
                   (theirs ? "has one" : "has none");
        });
    }
}

/// DDP of model `k` in `dtype` with `Policies`, `loop` and `options`, against the
/// single-process reference: every parameter within `tol` after every step.
template <class... Policies, communicator C>
void torch_ddp_case(C& comm, tm::kind k, c10::ScalarType dtype, torch_loop loop, double tol,
                    torch::ddp_options options = {}) {
    const std::string label = std::string(tm::name(k)) + ", " + c10::toString(dtype) + ", " +
                              name(loop) + (sizeof...(Policies) > 0 ? ", with policies" : "");
    CAPTURE(label);
    const auto n = comm.size();
    const auto rank = comm.rank();
    const std::int64_t shard = torch_global_batch / n;
    const tm::dataset data = tm::make_data(k, dtype, torch_global_batch * torch_steps, 7);
    if (loop == torch_loop::accumulate_steps) {
        options.accumulate_steps = 2;
    }

    std::shared_ptr<tm::net> model = tm::make(k, dtype, 100 + static_cast<std::uint64_t>(rank));
    std::shared_ptr<tm::net> reference = tm::make(k, dtype, 100);
    torch::ddp<C, Policies...> dp(comm, model, options);
    auto opt = adamw(model->parameters());
    auto ref_opt = adamw(reference->parameters());

    outcome o;
    o.expect(dp.parameters().size() == model->parameters().size(),
             "every parameter registered: " + std::to_string(dp.parameters().size()));
    for (int step = 0; step < torch_steps && o.first.empty(); ++step) {
        const std::int64_t base = step * torch_global_batch + rank * shard;
        if (loop == torch_loop::set_to_none) {
            for (at::Tensor& p : model->parameters()) {
                p.mutable_grad() = at::Tensor();
            }
        } else {
            opt.zero_grad();
        }
        auto backward = [&](std::int64_t first, std::int64_t count) {
            const at::Tensor loss = ::torch::nn::functional::cross_entropy(
                                        model->forward(data.x.narrow(0, base + first, count)),
                                        data.y.narrow(0, base + first, count)) *
                                    (static_cast<double>(count) / static_cast<double>(shard));
            loss.backward();
        };
        if (loop == torch_loop::no_sync || loop == torch_loop::accumulate_steps) {
            const std::int64_t half = shard / 2; // at least 3 at up to 4 ranks
            {
                std::optional<typename torch::ddp<C, Policies...>::no_sync_scope> scope;
                if (loop == torch_loop::no_sync) {
                    scope.emplace(dp.no_sync());
                }
                backward(0, half);
                o.expect(!dp.synchronized(), "step " + std::to_string(step) +
                                                 ": the first micro-batch did not synchronize");
            }
            backward(half, shard - half);
        } else {
            backward(0, shard);
        }
        o.expect(dp.synchronized(), "step " + std::to_string(step) + " did not synchronize");
        opt.step();

        if (loop == torch_loop::set_to_none) {
            for (at::Tensor& p : reference->parameters()) {
                p.mutable_grad() = at::Tensor();
            }
        } else {
            ref_opt.zero_grad();
        }
        ::torch::nn::functional::cross_entropy(
            reference->forward(data.x.narrow(0, step * torch_global_batch, torch_global_batch)),
            data.y.narrow(0, step * torch_global_batch, torch_global_batch))
            .backward();
        ref_opt.step();

        expect_same_parameters(o, *model, *reference, step, tol);
        expect_same_gradients_defined(o, *model, *reference, step);
    }
    UNISON_CHECK_CASE(comm, label, o);
}

/// The reference of one bf16 data-parallel step, in one process: `compute`'s bf16
/// parameters `copies` are loaded from the f32 `masters`, every rank's share of the
/// batch at `base` runs forward and backward, and the bf16 gradients are summed in
/// f32 over the `n` ranks, averaged and rounded to bf16, as the engines keep them
/// (returned in f32); `loss` is rank `rank`'s share's.
struct bf16_reference_step {
    std::vector<at::Tensor> grads;
    double loss = 0.0;
};
template <class Model>
bf16_reference_step bf16_reference(const Model& compute, const std::vector<at::Tensor>& copies,
                                   const std::vector<at::Tensor>& masters, const tm::dataset& data,
                                   std::int64_t base, std::int64_t shard, int n, int rank) {
    bf16_reference_step out;
    std::vector<at::Tensor> sums;
    for (int r = 0; r < n; ++r) {
        {
            ::torch::NoGradGuard no_grad;
            for (std::size_t k = 0; k < copies.size(); ++k) {
                copies[k].copy_(masters[k]);
                copies[k].mutable_grad() = at::Tensor();
            }
        }
        const at::Tensor l = ::torch::nn::functional::cross_entropy(
            compute->forward(data.x.narrow(0, base + r * shard, shard)),
            data.y.narrow(0, base + r * shard, shard));
        l.backward();
        if (r == rank) {
            out.loss = l.template item<double>();
        }
        for (std::size_t k = 0; k < copies.size(); ++k) {
            const at::Tensor g = copies[k].grad().to(at::kFloat);
            if (r == 0) {
                sums.push_back(g);
            } else {
                sums[k] = sums[k] + g;
            }
        }
    }
    for (at::Tensor& sum : sums) {
        out.grads.push_back((sum / static_cast<float>(n)).to(at::kBFloat16).to(at::kFloat));
    }
    return out;
}

/// Mixed precision through torch::ddp, as a LibTorch user runs it: a bf16 model
/// whose gradients are reduced in f32 buckets (policy::mixed_precision<bf16, f32>),
/// the user's AdamW on f32 master copies that are cast back into the model after
/// each step. Against one process that computes each rank's share in bf16, sums the
/// bf16 gradients in f32 and averages them into bf16 as the engine does.
template <communicator C>
void torch_ddp_mixed_precision_case(C& comm) {
    using engine_type = torch::ddp<C, policy::mixed_precision<dtype::bf16, dtype::f32>>;
    const std::string label = "MLP, bf16 parameters, f32 reduction and master weights";
    CAPTURE(label);
    const int n = comm.size();
    const std::int64_t shard = torch_global_batch / n;
    const tm::dataset data =
        tm::make_data(tm::kind::mlp, at::kBFloat16, torch_global_batch * torch_steps, 19);
    auto model =
        tm::make(tm::kind::mlp, at::kBFloat16, 100 + static_cast<std::uint64_t>(comm.rank()));
    engine_type dp(comm, model);
    const std::vector<at::Tensor> params = model->parameters();
    std::vector<at::Tensor> masters; // the user's: f32 copies of the broadcast values
    for (const at::Tensor& p : params) {
        masters.push_back(p.detach().to(at::kFloat));
    }
    auto opt = adamw(masters);

    auto compute = tm::make(tm::kind::mlp, at::kBFloat16, 100);
    const std::vector<at::Tensor> copies = compute->parameters();
    std::vector<at::Tensor> ref_masters;
    for (const at::Tensor& p : copies) {
        ref_masters.push_back(p.detach().to(at::kFloat));
    }
    auto ref_opt = adamw(ref_masters);

    outcome o;
    for (int step = 0; step < torch_steps && o.first.empty(); ++step) {
        const std::int64_t base = step * torch_global_batch;
        for (const at::Tensor& p : params) {
            p.mutable_grad() = at::Tensor();
        }
        const at::Tensor loss = ::torch::nn::functional::cross_entropy(
            model->forward(data.x.narrow(0, base + comm.rank() * shard, shard)),
            data.y.narrow(0, base + comm.rank() * shard, shard));
        loss.backward();
        for (std::size_t k = 0; k < params.size(); ++k) {
            o.expect(params[k].grad().defined() && params[k].grad().scalar_type() == at::kBFloat16,
                     "step " + std::to_string(step) + ": parameter " + std::to_string(k) +
                         " has no bf16 gradient");
            masters[k].mutable_grad() = params[k].grad().to(at::kFloat);
        }
        std::vector<at::Tensor> grads; // the engine's averages, to compare below
        for (const at::Tensor& m : masters) {
            grads.push_back(m.grad().clone());
        }
        opt.step();
        {
            ::torch::NoGradGuard no_grad;
            for (std::size_t k = 0; k < params.size(); ++k) {
                params[k].copy_(masters[k]);
            }
        }

        const bf16_reference_step ref =
            bf16_reference(compute, copies, ref_masters, data, base, shard, n, comm.rank());
        const double ref_loss = ref.loss;
        for (std::size_t k = 0; k < ref_masters.size(); ++k) {
            ref_masters[k].mutable_grad() = ref.grads[k];
        }
        ref_opt.step();

        const double got = loss.template item<double>();
        o.expect(std::abs(got - ref_loss) <= 3e-2 * std::abs(ref_loss), [&] {
            return "step " + std::to_string(step) + " loss " + std::to_string(got) +
                   ", the reference's " + std::to_string(ref_loss);
        });
        for (std::size_t k = 0; k < masters.size(); ++k) {
            // Sums of three or four ranks' f32 values in another order can round to
            // the other bf16 neighbour: 1e-2 of the tensor's scale (a gradient summed
            // but not averaged is off by the number of ranks).
            const double gerr = tm::relative_error(grads[k], ref_masters[k].grad());
            o.expect(gerr <= 1e-2, [&] {
                return "step " + std::to_string(step) + " gradient " + std::to_string(k) +
                       " relative error " + std::to_string(gerr);
            });
            const double err = tm::relative_error(masters[k], ref_masters[k]);
            o.expect(err <= 1e-2, [&] {
                return "step " + std::to_string(step) + " master weight " + std::to_string(k) +
                       " relative error " + std::to_string(err);
            });
        }
    }
    UNISON_CHECK_CASE(comm, label, o);
}

template <communicator C>
void torch_ddp_training_cases(C& comm) {
    using tm::kind;
    for (const kind k : {kind::mlp, kind::block}) {
        torch_ddp_case(comm, k, at::kFloat, torch_loop::plain, 1e-6);
        torch_ddp_case(comm, k, at::kDouble, torch_loop::plain, 1e-12);
    }
    // Several buckets, reduced while backward runs.
    torch_ddp_case(comm, kind::block, at::kFloat, torch_loop::plain, 1e-6,
                   {.bucket_bytes = 2048, .first_bucket_bytes = 512});
    torch_ddp_case<policy::gradients_in_buckets>(comm, kind::mlp, at::kFloat, torch_loop::plain,
                                                 1e-6, {.bucket_bytes = 1024});
    torch_ddp_case(comm, kind::mlp, at::kDouble, torch_loop::set_to_none, 1e-12);
    torch_ddp_case<policy::gradients_in_buckets>(comm, kind::mlp, at::kDouble,
                                                 torch_loop::set_to_none, 1e-12);
    // The unused head never gets a gradient, as in the reference, whether the
    // optimizer zeroes gradients in place or they are set to undefined: AdamW skips
    // it (a zero gradient would have it decay the head's weights every step).
    torch_ddp_case(comm, kind::unused_head, at::kDouble, torch_loop::plain, 1e-12);
    torch_ddp_case(comm, kind::unused_head, at::kDouble, torch_loop::set_to_none, 1e-12);
    torch_ddp_case<policy::gradients_in_buckets>(comm, kind::unused_head, at::kDouble,
                                                 torch_loop::set_to_none, 1e-12);
    torch_ddp_mixed_precision_case(comm);
}

template <communicator C>
void torch_ddp_accumulation_cases(C& comm) {
    using tm::kind;
    torch_ddp_case(comm, kind::mlp, at::kDouble, torch_loop::no_sync, 1e-12);
    torch_ddp_case(comm, kind::block, at::kFloat, torch_loop::no_sync, 1e-6);
    torch_ddp_case(comm, kind::mlp, at::kDouble, torch_loop::accumulate_steps, 1e-12);
    torch_ddp_case<policy::gradients_in_buckets>(comm, kind::mlp, at::kDouble, torch_loop::no_sync,
                                                 1e-12);
    // The unused head gets no gradient over a window of micro-batches either.
    torch_ddp_case(comm, kind::unused_head, at::kDouble, torch_loop::accumulate_steps, 1e-12);
    torch_ddp_case(comm, kind::unused_head, at::kDouble, torch_loop::no_sync, 1e-12);
}

/// Buffers: with broadcast_buffers every rank's running statistics are rank 0's
/// after every step; without, ranks that saw other data keep their own (which shows
/// that the check can tell).
template <communicator C>
void torch_ddp_buffer_case(C& comm, bool sync_buffers) {
    const std::string label = sync_buffers ? "buffers broadcast" : "buffers kept";
    const auto n = comm.size();
    const std::int64_t shard = torch_global_batch / n;
    const tm::dataset data = tm::make_data(tm::kind::batch_norm, at::kFloat, torch_global_batch, 3);
    auto model =
        tm::make(tm::kind::batch_norm, at::kFloat, 50 + static_cast<std::uint64_t>(comm.rank()));
    {
        ::torch::NoGradGuard no_grad; // every rank's statistics start out different
        for (at::Tensor& b : model->buffers()) {
            if (b.is_floating_point()) {
                b.add_(comm.rank());
            }
        }
    }
    torch::ddp<C> dp(comm, model, {.broadcast_buffers = sync_buffers});
    outcome o;
    auto buffers_equal_root = [&] {
        double difference = 0.0;
        for (at::Tensor& b : model->buffers()) {
            at::Tensor root = b.clone();
            broadcast(comm, root, 0);
            difference = std::max(
                difference,
                (root.to(at::kDouble) - b.to(at::kDouble)).abs().max().template item<double>());
        }
        std::vector<double> largest{difference}; // rank 0's own is always equal
        all_reduce(comm, largest, reduce_op::max);
        return largest[0] == 0.0;
    };
    o.expect(buffers_equal_root(), "construction broadcast the buffers");
    ::torch::nn::functional::cross_entropy(
        model->forward(data.x.narrow(0, comm.rank() * shard, shard)),
        data.y.narrow(0, comm.rank() * shard, shard))
        .backward();
    const bool equal = buffers_equal_root();
    o.expect(equal == (sync_buffers || n == 1), std::string("after a step the buffers ") +
                                                    (equal ? "are" : "are not") +
                                                    " rank 0's on every rank");
    UNISON_CHECK_CASE(comm, label, o);
}

/// Misuse: a module that differs across ranks (sizes, or only shapes with the same
/// element counts) is a mismatch_error naming the parameter, raised before anything
/// moves; with unused_is_error a parameter without gradient makes backward throw an
/// error naming it.
template <communicator C>
void torch_ddp_error_cases(C& comm) {
    const auto rank = comm.rank();
    outcome o;
    if (comm.size() > 1) {
        // Rank 1's first layer is 25 wide instead of 24.
        auto model = std::make_shared<tm::mlp>(rank == 1 ? 25 : 24);
        const at::Tensor before = model->fc2->weight.detach().clone();
        try {
            torch::ddp<C> dp(comm, model);
            o.expect(false, "a module with other sizes on rank 1 was accepted");
        } catch (const mismatch_error& e) {
            const std::string what = e.what();
            o.expect(what.find("fc1.weight") != std::string::npos &&
                         what.find("torch::ddp") != std::string::npos,
                     "the error names the first parameter that differs: " + what);
        }
        o.expect(model->fc2->weight.detach().equal(before), "nothing moved before the error");
    }
    if (comm.size() > 1) {
        // As many elements of the same dtype on every rank, so only names and shapes
        // tell: rank 1's weight is transposed, or has another name.
        for (const bool renamed : {false, true}) {
            const bool odd = rank == 1;
            const std::string name = odd && renamed ? "v" : "w";
            const std::vector<std::int64_t> shape =
                odd && !renamed ? std::vector<std::int64_t>{2, 4} : std::vector<std::int64_t>{4, 2};
            auto model = std::make_shared<::torch::nn::Module>();
            model->register_parameter(name, at::arange(1.0, 9.0, at::kFloat).reshape(shape));
            const at::Tensor before = model->parameters()[0].detach().clone();
            try {
                torch::ddp<C> dp(comm, model);
                o.expect(false, std::string("a module with a ") +
                                    (renamed ? "renamed" : "transposed") +
                                    " parameter on rank 1 was accepted");
            } catch (const mismatch_error& e) {
                const std::string what = e.what();
                const std::string mine = "'" + name + "' " + c10::str(at::IntArrayRef(shape));
                o.expect(what.find("torch::ddp") != std::string::npos &&
                             what.find(mine) != std::string::npos &&
                             what.find(odd ? "rank 0" : "rank 1") != std::string::npos,
                         "the error names the parameter, its shape here and the rank that "
                         "differs (" +
                             mine + "): " + what);
            }
            o.expect(model->parameters()[0].detach().equal(before) &&
                         !model->parameters()[0].grad().defined(),
                     "nothing moved before the error");
        }
    }
    {
        auto model = tm::make(tm::kind::unused_head, at::kFloat, 9);
        torch::ddp<C, policy::unused_is_error> dp(comm, model);
        const tm::dataset data = tm::make_data(tm::kind::unused_head, at::kFloat, 4, 1);
        try {
            ::torch::nn::functional::cross_entropy(model->forward(data.x), data.y).backward();
            o.expect(false, "backward without a gradient for spare.* did not throw");
        } catch (const std::exception& e) {
            const std::string what = e.what();
            o.expect(what.find("spare.weight") != std::string::npos,
                     "the error names the unused parameter: " + what);
        }
    }
    {
        try {
            torch::ddp<C> dp(comm, std::shared_ptr<::torch::nn::Module>{});
            o.expect(false, "a null module was accepted");
        } catch (const argument_error& e) {
            o.expect(std::string(e.what()).find("null") != std::string::npos,
                     std::string("the error says the module is null: ") + e.what());
        }
    }
    UNISON_CHECK_CASE(comm, "torch ddp misuse", o);
}

/// One engine per module: a second engine on a module (or on a submodule) that
/// one drives, torch::ddp or torch::fsdp in either order, is refused naming a
/// parameter before anything moves, and the first engine goes on as before.
template <communicator C>
void torch_second_engine_cases(C& comm) {
    using fsdp_type = torch::fsdp<C, policy::shard::full>;
    const tm::dataset data = tm::make_data(tm::kind::mlp, at::kFloat, 4, 5);
    outcome o;
    auto refused = [&](const std::string& what, const std::string& expected, auto&& construct) {
        try {
            construct();
            o.expect(false, what + " was accepted");
        } catch (const argument_error& e) {
            const std::string message = e.what();
            o.expect(message.find(expected) != std::string::npos,
                     what + ": the error says '" + expected + "': " + message);
        }
    };
    {
        auto model = std::make_shared<tm::mlp>();
        torch::ddp<C> first(comm, model);
        std::vector<at::Tensor> before;
        for (const at::Tensor& p : model->parameters()) {
            before.push_back(p.detach().clone());
        }
        refused("a second torch::ddp", "'fc1.weight' is driven by another torch::ddp",
                [&] { torch::ddp<C> second(comm, model); });
        refused("a torch::fsdp after a torch::ddp", "'fc1.weight' is driven by a torch::ddp",
                [&] { fsdp_type second(comm, model, {}, {}); });
        refused("a torch::ddp of a submodule", "'weight' is driven by another torch::ddp",
                [&] { torch::ddp<C> second(comm, model->fc2); });
        const auto params = model->parameters();
        for (std::size_t i = 0; i < params.size(); ++i) {
            o.expect(params[i].detach().equal(before[i]) && !params[i].grad().defined(),
                     "parameter #" + std::to_string(i) + " changed under a refused engine");
        }
        // The first engine still averages: every rank holds rank 0's gradients.
        const std::int64_t r = comm.rank() % 4;
        ::torch::nn::functional::cross_entropy(model->forward(data.x.narrow(0, r, 1)),
                                               data.y.narrow(0, r, 1))
            .backward();
        o.expect(first.synchronized(), "the first engine did not synchronize");
        for (const at::Tensor& p : model->parameters()) {
            at::Tensor root = p.grad().clone();
            broadcast(comm, root, 0);
            o.expect(root.equal(p.grad()), "the first engine's gradients differ across ranks");
        }
    }
    {
        auto model = std::make_shared<tm::mlp>();
        fsdp_type first(comm, model, {}, {});
        const auto state = first.full_state_dict();
        refused("a torch::ddp after a torch::fsdp", "'fc1.weight' is driven by a torch::fsdp",
                [&] { torch::ddp<C> second(comm, model); });
        refused("a second torch::fsdp", "'fc1.weight' is driven by another torch::fsdp",
                [&] { fsdp_type second(comm, model, {}, {}); });
        const auto after = first.full_state_dict();
        for (const auto& item : state) {
            const at::Tensor* now = after.find(item.key());
            o.expect(now != nullptr && now->equal(item.value()),
                     "'" + item.key() + "' changed under a refused engine");
        }
        const at::Tensor loss = ::torch::nn::functional::cross_entropy(
            first.forward([&] { return model->forward(data.x); }), data.y);
        loss.backward();
        first.step();
        o.expect(!first.full_state_dict().find("fc1.weight")->equal(*state.find("fc1.weight")),
                 "the first engine no longer trains");
    }
    UNISON_CHECK_CASE(comm, "a second engine on a module", o);
}

} // namespace unison::test
