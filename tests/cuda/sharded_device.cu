// ZeRO and FSDP on device memory: the thread backend with N ranks sharing one GPU
// (unison::cuda::use_device), sharded_parameters placed there (unison::cuda::use_device)
// and the partitioned optimizer's fused kernels, against the same training on the host
// (whose equivalence with DDP and single-process training tests/sharded/ checks).
// Gradients are deterministic random values per (step, rank, element); parameters
// are compared after every step.

#include "../support/reference.hpp"
#include "support.cuh"

#include <unison/parallel/device.cuh>
#include <unison/sharded.hpp>
#include <unison/thread.hpp>
#include <unison/thread/device.cuh>

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

namespace {

using namespace unison;

const std::vector<std::vector<std::size_t>> unit_sizes = {{1000, 7}, {65537, 3, 129}, {4096}};

/// Parameters after each of `steps` steps on every rank (as doubles, concatenated).
template <class... Policies>
std::vector<std::vector<std::vector<double>>> train(int ranks, bool on_device, int steps,
                                                    int hybrid_group = 0) {
    using SP = sharded_parameters<thread_communicator, Policies...>;
    using P = std::conditional_t<SP::param_dtype == dtype::bf16, bf16, float>;
    std::vector<std::vector<std::vector<double>>> out(static_cast<std::size_t>(ranks));
    thread_world(ranks).run([&](thread_communicator& comm) {
        cuda::stream compute;
        if (on_device) {
            cuda::use_device(comm, 0);
        }
        SP sp(comm, {.shard_group_size = hybrid_group});
        if (on_device) {
            cuda::use_device(sp, 0, compute);
        }
        std::size_t id = 0;
        for (std::size_t u = 0; u < unit_sizes.size(); ++u) {
            std::vector<parameter_spec> specs;
            for (std::size_t n : unit_sizes[u]) {
                specs.push_back({"p" + std::to_string(id++), n});
            }
            sp.add_unit(specs);
        }
        for (std::size_t i = 0; i < sp.parameter_count(); ++i) {
            sp.set_parameter(i, test::random_values<float>(sp.numel(i), 77 + i));
        }
        sp.start();
        optim::adamw opt;
        opt.lr = 1e-2;
        step_options options;
        options.max_grad_norm = 5.0; // clipping engages: the random gradients' norm is larger
        partitioned_optimizer<SP, optim::adamw> optimizer(sp, opt, options);
        if (on_device) {
            cuda::use_device(optimizer, 0, compute);
        }
        auto& mine = out[static_cast<std::size_t>(comm.rank())];
        for (int step = 0; step < steps; ++step) {
            // "backward", last unit first: the gradient of every parameter, then reduce.
            for (std::size_t u = unit_sizes.size(); u-- > 0;) {
                sp.gather(u, pass::backward);
                const auto [first, last] = sp.parameters_of(u);
                for (std::size_t i = first; i < last; ++i) {
                    const view<P> g = sp.template gradient<P>(i);
                    std::vector<P> values(g.size);
                    for (std::size_t k = 0; k < g.size; ++k) {
                        const double v =
                            static_cast<double>(test::mix(step * 131 + i, comm.rank(), k) >> 11) *
                                0x1.0p-52 -
                            1.0;
                        values[k] = detail::store_as<P>(v);
                    }
                    if (on_device) {
                        UNISON_CHECK_CUDA(cudaMemcpyAsync(g.data, values.data(), g.size * sizeof(P),
                                                          cudaMemcpyHostToDevice, compute),
                                          comm.rank(), "test");
                        compute.synchronize(); // `values` goes out of scope
                    } else {
                        std::memcpy(g.data, values.data(), g.size * sizeof(P));
                    }
                }
                sp.release(u, pass::backward);
                sp.reduce_gradients(u);
            }
            optimizer.step();
            sp.zero_grad();
            // Read the full parameters back (gathering them at stage 3).
            std::vector<double> now;
            for (std::size_t u = 0; u < unit_sizes.size(); ++u) {
                sp.gather(u);
                const auto [first, last] = sp.parameters_of(u);
                for (std::size_t i = first; i < last; ++i) {
                    const view<P> p = sp.template parameter<P>(i);
                    std::vector<P> h(p.size);
                    if (on_device) {
                        compute.synchronize();
                        UNISON_CHECK_CUDA(cudaMemcpy(h.data(), p.data, p.size * sizeof(P),
                                                     cudaMemcpyDeviceToHost),
                                          comm.rank(), "test");
                    } else {
                        std::memcpy(h.data(), p.data, p.size * sizeof(P));
                    }
                    for (const P& x : h) {
                        now.push_back(detail::load_as<double>(x));
                    }
                }
                sp.release(u, pass::backward); // also where forward keeps them (grad_op)
            }
            mine.push_back(std::move(now));
        }
    });
    return out;
}

template <class... Policies>
void check_equal(const char* name, int ranks, double tol, int hybrid_group = 0) {
    CAPTURE(name);
    CAPTURE(ranks);
    const auto host = train<Policies...>(ranks, false, 3, hybrid_group);
    const auto dev = train<Policies...>(ranks, true, 3, hybrid_group);
    for (int r = 0; r < ranks; ++r) {
        for (std::size_t step = 0; step < host[0].size(); ++step) {
            const auto& h = host[static_cast<std::size_t>(r)][step];
            const auto& d = dev[static_cast<std::size_t>(r)][step];
            REQUIRE(h.size() == d.size());
            long bad = -1;
            for (std::size_t i = 0; i < h.size() && bad < 0; ++i) {
                if (!(std::fabs(h[i] - d[i]) <= tol * std::max(1.0, std::fabs(h[i])))) {
                    bad = static_cast<long>(i);
                }
            }
            CHECK_MESSAGE(bad < 0, "rank " << r << " step " << step << ": element " << bad
                                           << " host " << (bad < 0 ? 0 : h[bad]) << " device "
                                           << (bad < 0 ? 0 : d[bad]));
        }
    }
}

} // namespace

TEST_CASE("ZeRO and FSDP on device (thread backend, one GPU) equal the host") {
    for (int ranks : {2, 3, 4}) {
        check_equal<policy::zero<0>>("zero<0>", ranks, 1e-5);
        check_equal<policy::zero<1>>("zero<1>", ranks, 1e-5);
        check_equal<policy::zero<2>>("zero<2>", ranks, 1e-5);
        check_equal<policy::zero<3>>("zero<3>", ranks, 1e-5);
        check_equal<policy::shard::grad_op>("shard::grad_op", ranks, 1e-5);
        // bf16 parameters with f32 master weights: a last-place difference in the
        // master may round the bf16 copy the other way, one bf16 ulp.
        check_equal<policy::zero<3>, policy::mixed_precision<dtype::bf16, dtype::f32>>(
            "zero<3> bf16 + f32 master", ranks, 0x1.0p-7);
    }
    check_equal<policy::shard::hybrid>("shard::hybrid", 4, 1e-5, 2);
    check_equal<policy::zero<3>>("zero<3>", 8, 1e-5);
    check_equal<policy::shard::hybrid>("shard::hybrid", 8, 1e-5, 4);
}
