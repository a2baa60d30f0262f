// The LibTorch adapter (unison/core/torch.hpp): traits of torch::Tensor for every
// dtype, the tensors it must reject (non-contiguous, unsupported dtype, undefined,
// sparse) and their messages, all_reduce of torch tensors over 3 thread ranks
// against a double reference on random data, and a bucketed_reducer fed from
// autograd hooks against the whole-batch gradient. CMake compiles this file only
// when LibTorch was found.

#include "unison/core/torch.hpp"
#include "unison/ddp.hpp"
#include "unison/thread.hpp"
#include "unison/torch/recompute.hpp"

#include <doctest/doctest.h>

#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/torch.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace {

using unison::dtype;

static_assert(unison::writable_tensor<torch::Tensor&> && unison::writable_tensor<torch::Tensor>);
static_assert(unison::tensor<const torch::Tensor&> &&
              !unison::writable_tensor<const torch::Tensor&>);

struct dtype_pair {
    c10::ScalarType torch;
    dtype unison;
};
constexpr dtype_pair dtype_pairs[] = {
    {torch::kDouble, dtype::f64},
    {torch::kFloat, dtype::f32},
    {torch::kHalf, dtype::f16},
    {torch::kBFloat16, dtype::bf16},
    {torch::kLong, dtype::i64},
    {torch::kInt, dtype::i32},
    {torch::kChar, dtype::i8},
    {torch::kByte, dtype::u8},
#if UNISON_TORCH_HAS_UINT32_64()
    {c10::ScalarType::UInt32, dtype::u32},
    {c10::ScalarType::UInt64, dtype::u64},
#endif
};

constexpr int ranks = 3;

/// Rank `rank`'s input: random values representable in `type`, from a seed per rank.
torch::Tensor random_input(c10::ScalarType type, int rank, std::int64_t rows, std::int64_t cols) {
    auto gen = at::detail::createCPUGenerator(1000 + static_cast<std::uint64_t>(rank));
    if (c10::isFloatingType(type)) {
        return torch::randn({rows, cols}, gen, torch::kFloat64).mul_(3.0).to(type);
    }
    return torch::randint(-1000, 1000, {rows, cols}, gen, torch::kInt64).to(type);
}

/// How many elements of `got` differ from `want` by more than `tolerance` times
/// `magnitude` (elementwise; all three compared in double).
std::int64_t count_wrong(const torch::Tensor& got, const torch::Tensor& want,
                         const torch::Tensor& magnitude, double tolerance) {
    const torch::Tensor error = (got.to(torch::kFloat64) - want).abs();
    INFO("largest error ", error.max().item<double>());
    return (error > magnitude * tolerance).sum().item<std::int64_t>();
}

/// Unit roundoff of the floating-point dtypes (0 for the exact integers).
double roundoff(c10::ScalarType type) {
    switch (type) {
    case torch::kDouble:
        return 0x1.0p-53;
    case torch::kFloat:
        return 0x1.0p-24;
    case torch::kHalf:
        return 0x1.0p-11;
    case torch::kBFloat16:
        return 0x1.0p-8;
    default:
        return 0.0;
    }
}

} // namespace

TEST_CASE("torch: traits of tensors of every dtype") {
    for (const dtype_pair& p : dtype_pairs) {
        CAPTURE(c10::toString(p.torch));
        // empty: the traits read no values, and early LibTorch 2.x could not fill UInt32 or UInt64
        torch::Tensor t = torch::empty({3, 5}, torch::TensorOptions().dtype(p.torch));
        CHECK(unison::tensor_data(t) == t.data_ptr());
        CHECK(unison::tensor_size(t) == 15);
        CHECK(unison::tensor_dtype(t) == p.unison);
        CHECK(unison::tensor_device(t) == unison::device::host());
        CHECK(unison::size_of(p.unison) == static_cast<std::size_t>(t.element_size()));
        const torch::Tensor& read_only = t;
        CHECK(unison::tensor_data(read_only) == t.data_ptr());
        const unison::buffer b = unison::as_buffer(t);
        CHECK(b.data == t.data_ptr());
        CHECK(b.count == 15);
        CHECK(b.type == p.unison);

        CHECK((unison::torch_dtype(p.unison) == p.torch));
        CHECK((unison::dtype_from_torch(p.torch) == p.unison));
    }
    for (dtype d : unison::all_dtypes) {
        CAPTURE(std::string(unison::to_string(d)));
#if !UNISON_TORCH_HAS_UINT32_64()
        if (d == dtype::u32 || d == dtype::u64) { // no such LibTorch scalar type before 2.3
            CHECK((unison::torch_dtype(d) == c10::ScalarType::Undefined));
            continue;
        }
#endif
        CHECK((unison::dtype_from_torch(unison::torch_dtype(d)) == d));
    }
    CHECK(!unison::dtype_from_torch(torch::kBool).has_value());
    CHECK(!unison::dtype_from_torch(torch::kComplexFloat).has_value());
    CHECK((unison::torch_device(unison::device::host()) == c10::Device(c10::kCPU)));
    CHECK((unison::torch_device(unison::device::cuda(1)) == c10::Device(c10::kCUDA, 1)));

    // A scalar is one element, an empty tensor none.
    torch::Tensor scalar = torch::tensor(2.5);
    CHECK(unison::tensor_size(scalar) == 1);
    CHECK(unison::tensor_dtype(scalar) == dtype::f32);
    torch::Tensor empty = torch::empty({0, 4});
    CHECK(unison::tensor_size(empty) == 0);
    CHECK_NOTHROW((void)unison::as_buffer(empty));

    // A contiguous view into a larger tensor starts at its own first element.
    torch::Tensor whole = torch::arange(20, torch::kFloat).reshape({4, 5});
    torch::Tensor rows = whole.narrow(0, 1, 2);
    CHECK(unison::tensor_data(rows) == static_cast<void*>(whole.data_ptr<float>() + 5));
    CHECK(unison::tensor_size(rows) == 10);
    torch::Tensor row = whole[3];
    CHECK(unison::tensor_data(row) == static_cast<void*>(whole.data_ptr<float>() + 15));
}

TEST_CASE("torch: tensors unison cannot move are rejected, naming the problem") {
    using doctest::Contains;
    const torch::Tensor m = torch::zeros({3, 4});
    CHECK_THROWS_WITH_AS((void)unison::as_buffer(m.t()),
                         Contains("tensor_traits<torch::Tensor>: non-contiguous tensor (sizes "
                                  "[4, 3], strides [1, 4])"),
                         unison::argument_error);
    CHECK_THROWS_WITH_AS((void)unison::as_const_buffer(torch::zeros({10}).slice(0, 0, 10, 2)),
                         Contains("non-contiguous"), unison::argument_error);
    CHECK_THROWS_WITH_AS((void)unison::as_const_buffer(torch::zeros({1}).expand({5})),
                         Contains("non-contiguous"), unison::argument_error);
    CHECK_THROWS_WITH_AS((void)unison::as_buffer(torch::zeros({2, 3, 4, 5}).permute({0, 2, 3, 1})),
                         Contains("call .contiguous()"), unison::argument_error);

    CHECK_THROWS_WITH_AS((void)unison::as_buffer(torch::zeros({4}, torch::kBool)),
                         Contains("unsupported dtype Bool"), unison::argument_error);
    CHECK_THROWS_WITH_AS((void)unison::as_buffer(torch::zeros({4}, torch::kShort)),
                         Contains("unsupported dtype Short"), unison::argument_error);
    CHECK_THROWS_WITH_AS((void)unison::as_buffer(torch::zeros({4}, torch::kComplexFloat)),
                         Contains("unsupported dtype ComplexFloat"), unison::argument_error);
    CHECK_THROWS_WITH_AS((void)unison::tensor_dtype(torch::zeros({4}, torch::kBool)),
                         Contains("unsupported dtype Bool"), unison::argument_error);

    CHECK_THROWS_WITH_AS((void)unison::as_buffer(torch::Tensor{}), Contains("undefined tensor"),
                         unison::argument_error);
    CHECK(unison::tensor_size(torch::Tensor{}) == 0);
    CHECK_THROWS_WITH_AS((void)unison::as_buffer(torch::ones({4}).to_sparse()), Contains("layout"),
                         unison::argument_error);
    CHECK_THROWS_WITH_AS((void)unison::as_buffer(torch::_neg_view(torch::ones({4}))),
                         Contains("resolve_neg"), unison::argument_error);

    // Through a collective: every rank's call is rejected before any data moved.
    torch::Tensor in = torch::ones({3, 4});
    CHECK_THROWS_WITH_AS(unison::thread_world(ranks).run([&](unison::thread_communicator& comm) {
        torch::Tensor mine = in.clone().t();
        unison::all_reduce(comm, mine);
    }),
                         Contains("non-contiguous"), unison::argument_error);
    CHECK(in.eq(1).all().item<bool>());
}

TEST_CASE("torch: all_reduce of tensors over 3 thread ranks against a double reference") {
    const std::int64_t rows = 37, cols = 29;
    const c10::ScalarType types[] = {torch::kDouble,   torch::kFloat, torch::kHalf,
                                     torch::kBFloat16, torch::kLong,  torch::kInt};
    for (c10::ScalarType type : types) {
        CAPTURE(c10::toString(type));
        const bool floating = c10::isFloatingType(type);
        torch::Tensor sum = torch::zeros({rows, cols}, torch::kFloat64);
        torch::Tensor magnitude = torch::zeros({rows, cols}, torch::kFloat64);
        torch::Tensor max = torch::full({rows, cols}, -INFINITY, torch::kFloat64);
        for (int r = 0; r < ranks; ++r) {
            const torch::Tensor in = random_input(type, r, rows, cols).to(torch::kFloat64);
            sum += in;
            magnitude += in.abs();
            max = torch::maximum(max, in);
        }
        std::vector<torch::Tensor> summed(ranks), averaged(ranks), in_place(ranks), maxed(ranks);
        unison::thread_world(ranks).run([&](unison::thread_communicator& comm) {
            const auto r = static_cast<std::size_t>(comm.rank());
            const torch::Tensor in = random_input(type, comm.rank(), rows, cols);
            summed[r] = torch::empty_like(in);
            unison::all_reduce(comm, in, summed[r]);
            in_place[r] = in.clone();
            unison::all_reduce(comm, in_place[r]);
            maxed[r] = torch::empty_like(in);
            unison::all_reduce(comm, in, maxed[r], unison::reduce_op::max);
            if (floating) {
                averaged[r] = in.clone();
                unison::all_reduce(comm, averaged[r], unison::reduce_op::avg);
            }
        });
        // Each of the ranks - 1 additions and the final rounding (the division of avg)
        // may round once, relative to the sum of the magnitudes.
        const double tolerance = roundoff(type) * (ranks + 1);
        for (std::size_t r = 0; r < static_cast<std::size_t>(ranks); ++r) {
            INFO("rank ", r);
            REQUIRE((summed[r].scalar_type() == type));
            CHECK(count_wrong(summed[r], sum, magnitude, tolerance) == 0);
            CHECK(count_wrong(in_place[r], sum, magnitude, tolerance) == 0);
            CHECK(count_wrong(maxed[r], max, magnitude, 0.0) == 0);
            if (floating) {
                CHECK(count_wrong(averaged[r], sum / ranks, magnitude / ranks, tolerance) == 0);
            }
        }
    }
}

namespace {

/// A two-layer classifier as plain leaf tensors: logits = relu(x W1^T + b1) W2^T + b2.
struct tiny_model {
    std::vector<torch::Tensor> params; // W1, b1, W2, b2

    tiny_model(std::int64_t in, std::int64_t hidden, std::int64_t out, c10::ScalarType type) {
        auto gen = at::detail::createCPUGenerator(7);
        const std::vector<std::int64_t> shapes[] = {{hidden, in}, {hidden}, {out, hidden}, {out}};
        for (const auto& shape : shapes) {
            params.push_back(
                (torch::randn(shape, gen, torch::kFloat64) * 0.5).to(type).requires_grad_());
        }
    }
    torch::Tensor loss(const torch::Tensor& x, const torch::Tensor& labels) const {
        const torch::Tensor h = torch::relu(torch::addmm(params[1], x, params[0].t()));
        return torch::cross_entropy_loss(torch::addmm(params[3], h, params[2].t()), labels);
    }
};

} // namespace

TEST_CASE("torch: bucketed_reducer over 3 thread ranks, marked ready from autograd hooks") {
    const std::int64_t features = 8, hidden = 16, classes = 4, shard = 8, steps = 3;
    const std::int64_t batch = shard * ranks;
    auto gen = at::detail::createCPUGenerator(99);
    const torch::Tensor x = torch::randn({steps * batch, features}, gen, torch::kFloat64);
    const torch::Tensor labels = torch::randint(0, classes, {steps * batch}, gen, torch::kInt64);

    // The whole-batch gradient of every step, in double, at the initial parameters.
    std::vector<std::vector<torch::Tensor>> want(steps);
    {
        const tiny_model reference(features, hidden, classes, torch::kFloat64);
        for (std::int64_t s = 0; s < steps; ++s) {
            reference.loss(x.narrow(0, s * batch, batch), labels.narrow(0, s * batch, batch))
                .backward();
            for (const torch::Tensor& p : reference.params) {
                want[static_cast<std::size_t>(s)].push_back(p.grad().clone());
                p.grad().zero_();
            }
        }
    }

    std::vector<std::vector<std::vector<torch::Tensor>>> got(ranks);
    std::vector<int> pointers_kept(ranks, 0);
    unison::thread_world(ranks).run([&](unison::thread_communicator& comm) {
        const std::int64_t rank = comm.rank();
        const tiny_model model(features, hidden, classes, torch::kFloat);
        // Small buckets, so the four gradients spread over several of them.
        unison::bucketed_reducer<unison::thread_communicator, unison::policy::unused_is_error>
            reducer(comm, {.bucket_bytes = 256, .first_bucket_bytes = 64});
        std::vector<std::shared_ptr<torch::autograd::Node>> accumulators;
        std::vector<void*> storage;
        for (const torch::Tensor& p : model.params) {
            torch::Tensor param = p;
            param.mutable_grad() = torch::zeros_like(param);
            const std::size_t i = reducer.add(param.mutable_grad());
            storage.push_back(param.grad().data_ptr());
            // Fires after autograd accumulated into p.grad (a tensor hook would fire before).
            accumulators.push_back(torch::autograd::impl::grad_accumulator(param));
            accumulators.back()->add_post_hook(
                std::make_unique<torch::autograd::utils::LambdaPostHook>(
                    [&reducer, i](const torch::autograd::variable_list& outputs,
                                  const torch::autograd::variable_list&) {
                        reducer.mark_ready(i);
                        return outputs;
                    }));
        }
        reducer.start();
        const auto r = static_cast<std::size_t>(rank);
        for (std::int64_t s = 0; s < steps; ++s) {
            if (s == 2) { // a framework that swaps a gradient tensor: rebind it
                torch::Tensor param = model.params[2];
                param.mutable_grad() = torch::zeros_like(param);
                storage[2] = param.grad().data_ptr();
                reducer.rebind(2, param.mutable_grad());
            }
            for (const torch::Tensor& p : model.params) {
                p.mutable_grad().zero_(); // in place: the registered storage stays
            }
            const std::int64_t begin = s * batch + rank * shard;
            model.loss(x.narrow(0, begin, shard).to(torch::kFloat), labels.narrow(0, begin, shard))
                .backward();
            (void)reducer.finish();
            got[r].emplace_back();
            bool kept = true;
            for (std::size_t i = 0; i < model.params.size(); ++i) {
                got[r].back().push_back(model.params[i].grad().clone());
                kept = kept && model.params[i].grad().data_ptr() == storage[i];
            }
            pointers_kept[r] += kept ? 1 : 0;
        }
    });

    for (std::size_t r = 0; r < static_cast<std::size_t>(ranks); ++r) {
        INFO("rank ", r);
        CHECK(pointers_kept[r] == steps);
        for (std::size_t s = 0; s < static_cast<std::size_t>(steps); ++s) {
            INFO("step ", s);
            for (std::size_t i = 0; i < want[s].size(); ++i) {
                INFO("parameter ", i);
                const torch::Tensor& w = want[s][i];
                const double error =
                    (got[r][s][i].to(torch::kFloat64) - w).abs().max().item<double>();
                const double scale = w.abs().max().item<double>();
                CHECK(error <= 1e-5 * scale);
            }
        }
    }
}

TEST_CASE("torch: recompute() gives the gradients of the block it recomputes, dropout included") {
    // A block with dropout, run plainly and under recompute() from one seed: the
    // re-run in backward must replay the same dropout mask, so every gradient (the
    // block's parameters and its input) is equal bit for bit, and the output's value
    // too. The random stream after backward continues where forward left it.
    auto make = [] {
        torch::manual_seed(3);
        return torch::nn::Linear(8, 8);
    };
    auto run = [](torch::nn::Linear& lin, bool recomputed) {
        torch::manual_seed(11);
        const at::Tensor x = torch::randn({5, 8}, torch::kDouble).requires_grad_(true);
        lin->to(torch::kDouble);
        auto block = [&](const at::Tensor& in) {
            return torch::dropout(torch::tanh(lin->forward(in)), 0.5, /*train=*/true) + in;
        };
        const at::Tensor y = recomputed ? unison::torch::recompute(block, x) : block(x);
        const at::Tensor after_forward = torch::rand({3}, torch::kDouble);
        y.pow(2).sum().backward();
        return std::vector<at::Tensor>{y.detach(),         x.grad(),
                                       lin->weight.grad(), lin->bias.grad(),
                                       after_forward,      torch::rand({3}, torch::kDouble)};
    };
    auto a = make();
    auto b = make();
    const auto plain = run(a, false);
    const auto recomputed = run(b, true);
    const char* what[] = {"output",
                          "input gradient",
                          "weight gradient",
                          "bias gradient",
                          "random draws after forward",
                          "random draws after backward"};
    for (std::size_t i = 0; i < plain.size(); ++i) {
        CAPTURE(what[i]);
        REQUIRE(recomputed[i].defined());
        CHECK(torch::equal(plain[i], recomputed[i]));
    }
    CHECK(plain[2].abs().sum().item<double>() > 0.0); // the block did get gradients

    // A second backward through the same recompute() is refused by name.
    auto c = make();
    c->to(torch::kDouble);
    const at::Tensor x = torch::randn({2, 8}, torch::kDouble).requires_grad_(true);
    const at::Tensor y = unison::torch::recompute(
        [&](const at::Tensor& in) { return torch::tanh(c->forward(in)); }, x);
    const at::Tensor loss = y.sum();
    loss.backward({}, /*retain_graph=*/true);
    CHECK_THROWS_WITH(loss.backward(), doctest::Contains("a second time"));
}
