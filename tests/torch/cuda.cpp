// unison::torch::ddp and unison::torch::fsdp of LibTorch modules on a GPU, against
// single-process LibTorch training on the same GPU: every rank builds the model
// from its own seed and moves it to its GPU, the wrapper is constructed with a
// device setup (made in cuda_setup.cu), and after every step each parameter is
// compared with a reference trained on the whole batch; FSDP's saved full model
// is loaded into a plain CPU module. On NCCL (one rank per GPU) and on the thread
// backend with every rank on one GPU. Needs a LibTorch built with CUDA and a GPU
// (main_torch_cuda.cpp skips otherwise).

#include "cuda_setup.hpp"
#include "fsdp_cases.hpp"
#if UNISON_TORCH_GPU_NCCL
#include "../cuda/backends.hpp"
#endif

#include <torch/version.h>
#if TORCH_VERSION_MAJOR >= 2
#include <c10/core/AutogradState.h>
#endif

#include <doctest/doctest.h>

#include <cstdint>
#include <filesystem>
#include <string>

namespace {

using namespace unison;
using namespace unison::test;
namespace tm = unison::test::torch_models;
namespace tg = unison::test::torch_gpu;

c10::Device gpu(int dev) {
    return {c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(dev)};
}

tm::dataset on(const tm::dataset& host, int dev) {
    return {host.x.to(gpu(dev)), host.y.to(gpu(dev))};
}

/// DDP of model `k` on cuda:`dev` against LibTorch on the whole batch on that GPU.
template <communicator C>
void gpu_ddp_case(C& comm, int dev, tm::kind k, c10::ScalarType dtype, double tol) {
    const std::string label = "torch::ddp on cuda:" + std::to_string(dev) + ", " + tm::name(k) +
                              ", " + c10::toString(dtype);
    CAPTURE(label);
    const std::int64_t shard = torch_global_batch / comm.size();
    const tm::dataset data = on(tm::make_data(k, dtype, torch_global_batch * torch_steps, 7), dev);
    auto model = tm::make(k, dtype, 100 + static_cast<std::uint64_t>(comm.rank()));
    auto reference = tm::make(k, dtype, 100);
    model->to(gpu(dev));
    reference->to(gpu(dev));
    unison::torch::ddp<C> dp(comm, model, {.bucket_bytes = 4096},
                             tg::on_gpu<tg::ddp_engine<C>>(dev));
    tm::zero_gradients(*reference);
    auto opt = adamw(model->parameters());
    auto ref_opt = adamw(reference->parameters());

    outcome o;
    o.expect(dp.location() == device::cuda(dev), "the buckets are on " + to_string(dp.location()));
    for (int step = 0; step < torch_steps && o.first.empty(); ++step) {
        const std::int64_t base = step * torch_global_batch;
        opt.zero_grad();
        ::torch::nn::functional::cross_entropy(
            model->forward(data.x.narrow(0, base + comm.rank() * shard, shard)),
            data.y.narrow(0, base + comm.rank() * shard, shard))
            .backward();
        o.expect(dp.synchronized(), "step " + std::to_string(step) + " did not synchronize");
        opt.step();

        ref_opt.zero_grad();
        ::torch::nn::functional::cross_entropy(
            reference->forward(data.x.narrow(0, base, torch_global_batch)),
            data.y.narrow(0, base, torch_global_batch))
            .backward();
        ref_opt.step();

        expect_same_parameters(o, *model, *reference, step, tol);
    }
    UNISON_CHECK_CASE(comm, label, o);
}

/// FSDP (full sharding) of a stack of feed-forward blocks on cuda:`dev` against
/// LibTorch on the whole batch on that GPU; the saved full model, loaded into a
/// plain CPU module, gives the reference's loss.
template <class Engine, class... Policies, communicator C>
void gpu_fsdp_case(C& comm, int dev, c10::ScalarType dtype, double tol) {
    using wrapper = unison::torch::fsdp<C, Policies...>;
    static_assert(std::is_same_v<typename wrapper::engine_type, Engine>);
    const std::string label =
        "torch::fsdp on cuda:" + std::to_string(dev) + ", " + std::string(c10::toString(dtype));
    CAPTURE(label);
    const tm::dataset host = tm::make_data(tm::stack_input_width<tm::ffn>(), dtype,
                                           torch_global_batch * torch_steps, 11);
    const tm::dataset data = on(host, dev);
    auto model = tm::make_stack<tm::ffn>(tm::stacking::plain, dtype,
                                         100 + static_cast<std::uint64_t>(comm.rank()));
    auto reference = tm::make_stack<tm::ffn>(tm::stacking::plain, dtype, 100);
    model->to(gpu(dev));
    reference->to(gpu(dev));
    wrapper engine(comm, model, model->units(), torch_fsdp_options<wrapper>(comm.size()),
                   tg::on_gpu<Engine>(dev));
    tm::zero_gradients(*reference);
    auto ref_opt = adamw(reference->parameters());

    outcome o;
    torch_fsdp_train(comm, engine, *model, *reference, ref_opt, data, 0, torch_steps, tol, o);

    const std::filesystem::path path = torch_shared_path(comm, "gpu-fsdp.pt");
    engine.save_full(path.string());
    std::vector<int> sync{1};
    all_reduce(comm, sync); // hosted by the thread backend or NCCL: host memory is fine
    auto plain = tm::make_stack<tm::ffn>(tm::stacking::plain, dtype, 999);
    ::torch::load(plain, path.string());
    all_reduce(comm, sync);
    if (comm.rank() == 0) {
        std::filesystem::remove(path);
    }
    const double got = ::torch::nn::functional::cross_entropy(
                           plain->forward(host.x.narrow(0, 0, torch_global_batch)),
                           host.y.narrow(0, 0, torch_global_batch))
                           .template item<double>();
    const double want = ::torch::nn::functional::cross_entropy(
                            reference->forward(data.x.narrow(0, 0, torch_global_batch)),
                            data.y.narrow(0, 0, torch_global_batch))
                            .template item<double>();
    o.expect(std::abs(got - want) <= tol * std::abs(want) * 10, [&] {
        return "the saved model's loss on the CPU " + std::to_string(got) + ", the reference's " +
               std::to_string(want);
    });
    UNISON_CHECK_CASE(comm, label, o);
}

template <communicator C>
void gpu_cases(C& comm, int dev) {
    gpu_ddp_case(comm, dev, tm::kind::mlp, at::kDouble, 1e-10);
    gpu_ddp_case(comm, dev, tm::kind::block, at::kFloat, 1e-5);
    gpu_fsdp_case<tg::fsdp_f64_engine<C>, policy::shard::full, policy::mixed_precision<dtype::f64>>(
        comm, dev, at::kDouble, 1e-10);
    gpu_fsdp_case<tg::fsdp_f32_engine<C>, policy::shard::full>(comm, dev, at::kFloat, 1e-5);
}

/// LibTorch 1.x runs every thread's CUDA backward on one autograd thread per
/// device: ranks sharing a GPU are refused at their first hook, with an error that
/// says why, rather than waiting there for each other until the timeout.
[[maybe_unused]] void gpu_shared_thread_refused(thread_communicator& comm, int dev) {
    const std::string label = "torch::ddp, ranks sharing cuda:" + std::to_string(dev);
    const tm::dataset data = on(tm::make_data(tm::kind::mlp, at::kFloat, 8, 3), dev);
    auto model = tm::make(tm::kind::mlp, at::kFloat, 5);
    model->to(gpu(dev));
    unison::torch::ddp<thread_communicator> dp(
        comm, model, {}, tg::on_gpu<tg::ddp_engine<thread_communicator>>(dev));
    outcome o;
    try {
        ::torch::nn::functional::cross_entropy(model->forward(data.x), data.y).backward();
        o.expect(false, "backward on the shared autograd thread was not refused");
    } catch (const std::exception& e) {
        const std::string what = e.what();
        o.expect(what.find("autograd thread") != std::string::npos, "the error says why: " + what);
    }
    UNISON_CHECK_CASE(comm, label, o);
}

} // namespace

#if UNISON_TORCH_GPU_NCCL
TEST_CASE("torch gpu: ddp and fsdp on NCCL, a rank per GPU") {
    backend::nccl::run([](nccl_communicator& comm) { gpu_cases(comm, comm.rank()); });
}
#endif

TEST_CASE("torch gpu: ddp and fsdp on the thread backend, ranks sharing one GPU") {
    for (const int n : {1, 2, 4}) {
        CAPTURE(n);
        thread_world(n).run([](thread_communicator& comm) {
            tg::attach_to_gpu(comm, 0);
#if TORCH_VERSION_MAJOR >= 2
            // Backward on this rank's thread, not on autograd's shared device thread.
            c10::AutogradState::get_tls_state().set_multithreading_enabled(false);
            gpu_cases(comm, 0);
#else
            if (comm.size() == 1) {
                gpu_cases(comm, 0);
            } else {
                gpu_shared_thread_refused(comm, 0);
            }
#endif
        });
    }
}
