#pragma once

// What sharding costs and saves, and the gradient checks, on synthetic units:
//   - per-rank model-state memory follows the ZeRO paper's formulas for
//     mixed-precision Adam, and per-step traffic (counted by counting_communicator)
//     is 2 Psi (N-1)/N elements for DDP and stages 1-2 and 3 Psi (N-1)/N for stage 3;
//   - bf16 parameters with f32 master weights: the master follows a double AdamW
//     reference and the parameters are exactly the rounded master;
//   - dynamic loss scaling: the scale follows the growth/backoff rules, a step with an
//     inf on one rank is skipped on all of them bit for bit (parameters, master
//     weights, optimizer state, counter), and the scaled run equals an unscaled run
//     that never took the bad step, bit for bit.
// The cases run over a memory space (tests/support/memory_space.hpp): on a device
// fixture the parameters, gradients, master weights and optimizer state are on the
// GPU, the gradients are stored there and the partitions loaded back.

#include "../collectives/cases.hpp"
#include "../support/memory_space.hpp"

#include <unison/comm/counting_communicator.hpp>
#include <unison/sharded.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace unison::test {

/// Units of the synthetic model: sizes divisible by 12, so no padding at 1-4 ranks
/// and the formulas hold exactly.
inline const std::vector<std::vector<parameter_spec>> accounting_units = {
    {{"embed", 1200}, {"embed.bias", 240}},
    {{"block.w", 3600}},
    {{"head.w", 120}, {"head.b", 12}, {"head.c", 108}},
};

/// A deterministic value in +-[0.01, 1) for (seed, rank, index): every rank can
/// compute every other rank's gradients for the reference.
inline double synthetic(std::uint64_t seed, int rank, std::size_t i) {
    std::uint64_t z = seed * 0x9e3779b97f4a7c15ull +
                      static_cast<std::uint64_t>(rank) * 0xbf58476d1ce4e5b9ull +
                      i * 0x94d049bb133111ebull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    const double u = static_cast<double>(z >> 11) * 0x1.0p-53; // [0, 1)
    const double mag = 0.01 + 0.99 * std::abs(2.0 * u - 1.0);
    return u < 0.5 ? -mag : mag;
}

/// The shard group size a hybrid case uses at this world size: two groups where the
/// ranks split evenly, one group otherwise.
inline int hybrid_group(int ranks) {
    return ranks % 2 == 0 && ranks > 1 ? ranks / 2 : ranks;
}

template <class SP>
void add_accounting_units(SP& sp) {
    for (const auto& unit : accounting_units) {
        const std::size_t u = sp.add_unit(std::span<const parameter_spec>(unit));
        const auto [first, last] = sp.parameters_of(u);
        for (std::size_t id = first; id < last; ++id) {
            std::vector<float> v(sp.numel(id));
            for (std::size_t i = 0; i < v.size(); ++i) {
                v[i] = static_cast<float>(synthetic(7, 0, id * 10000 + i) * 0.5);
            }
            sp.set_parameter(id, v);
        }
    }
}

/// One training step on synthetic gradients: forward gathers, backward gathers,
/// writes `scale` times this rank's gradients (with an inf where `poison`) into the
/// gradients in `Space`, reduces. `quantize` rounds the gradients to multiples of
/// 2^-7, so that no sum of a few ranks' gradients, nor its average, is small enough
/// to be subnormal in fp16 (where scaling by a power of two would stop being exact).
template <class G, class Space = host_space, class SP>
void synthetic_backward(SP& sp, std::uint64_t seed, double scale, bool poison = false,
                        bool quantize = false) {
    for (std::size_t u = 0; u < sp.unit_count(); ++u) {
        sp.gather(u, pass::forward);
        const auto [first, last] = sp.parameters_of(u);
        for (std::size_t id = first; id < last; ++id) {
            (void)sp.template parameter<G>(id); // what forward would read
        }
        sp.release(u, pass::forward);
    }
    const int rank = sp.communicator().rank();
    for (std::size_t u = sp.unit_count(); u-- > 0;) {
        sp.gather(u, pass::backward);
        const auto [first, last] = sp.parameters_of(u);
        for (std::size_t id = first; id < last; ++id) {
            const view<G> g = sp.template gradient<G>(id);
            std::vector<G> values(g.size);
            for (std::size_t i = 0; i < g.size; ++i) {
                double x = synthetic(seed, rank, id * 10000 + i);
                if (quantize) {
                    x = std::round(x * 128.0) / 128.0;
                }
                values[i] = static_cast<G>(static_cast<float>(x * scale));
            }
            if (poison && id == first) {
                values[g.size / 2] = static_cast<G>(std::numeric_limits<float>::infinity());
            }
            Space::store(sp.communicator(), buffer{g.data, g.size, dtype_of<G>, g.location},
                         values.data());
        }
        sp.reduce_gradients(u);
        sp.release(u, pass::backward);
    }
}

/// `count` elements of `type` at `data` in `sp`'s memory, as bytes on the host.
template <class Space, class SP>
std::vector<unsigned char> loaded(SP& sp, const void* data, std::size_t count, dtype type) {
    std::vector<unsigned char> out(count * size_of(type));
    Space::load(sp.communicator(), const_buffer(data, count, type, sp.location()), out.data());
    return out;
}

/// Memory and traffic of `Sharding` with bf16 parameters, f32 master weights and AdamW.
template <class Sharding, class Space, communicator C>
void accounting_case(C& comm, const std::string& name) {
    using namespace unison::policy;
    counting_communicator<C> counted(comm);
    using sp_type = sharded_parameters<counting_communicator<C>, Sharding,
                                       mixed_precision<dtype::bf16, dtype::bf16, dtype::f32>>;
    sp_type sp(counted, {.shard_group_size = comm.size()});
    Space::attach(comm, sp);
    add_accounting_units(sp);
    sp.start();
    partitioned_optimizer<sp_type, optim::adamw> opt(sp, optim::adamw{});
    Space::attach(comm, opt);

    const double psi = static_cast<double>(sp.numel());
    const double n = comm.size();
    const memory_report m = sp.memory();
    const double got =
        static_cast<double>(m.parameters + m.gradients + m.master + opt.state_bytes());
    const int stage = sp_type::stage;
    const double expected = stage == 0   ? 16 * psi
                            : stage == 1 ? 4 * psi + 12 * psi / n
                            : stage == 2 ? 2 * psi + 14 * psi / n
                                         : 16 * psi / n;
    outcome o;
    o.expect(got == expected, "model-state memory " + std::to_string(got) + " bytes, formula " +
                                  std::to_string(expected) + " (Psi = " + std::to_string(psi) +
                                  ", N = " + std::to_string(comm.size()) + ")");

    synthetic_backward<bf16, Space>(sp, 1, 1.0);
    opt.step();
    sp.zero_grad();
    counted.reset();
    synthetic_backward<bf16, Space>(sp, 2, 1.0);
    opt.step();
    const double moved = counted.of(operation::all_gather).ring_elements +
                         counted.of(operation::reduce_scatter).ring_elements +
                         counted.of(operation::all_reduce).ring_elements;
    const double traffic = (stage == 3 ? 3.0 : 2.0) * psi * (n - 1) / n;
    // The step's checks (inf/nan, norm, the ranks' collective fingerprints) are one
    // all-reduce of detail::step_statistics::size doubles, on top of the model's.
    const double checks = 2.0 * static_cast<double>(detail::step_statistics::size) * (n - 1) / n;
    o.expect(std::abs(moved - traffic - checks) <= 1e-9 * psi,
             "per-step traffic " + std::to_string(moved) + " elements per rank, formula " +
                 std::to_string(traffic) + " + " + std::to_string(checks) + " for the checks");
    o.expect(counted.total().calls == counted.of(operation::all_gather).calls +
                                          counted.of(operation::reduce_scatter).calls +
                                          counted.of(operation::all_reduce).calls,
             "a step used other collectives than all_gather, reduce_scatter and all_reduce");
    UNISON_CHECK_CASE(comm, name, o);
}

/// bf16 parameters, f32 reduction and master weights, AdamW: after 3 steps the master
/// partition equals a double AdamW on the rounded averaged gradients (1e-5 relative)
/// and the bf16 parameters are the rounded master exactly; the full parameters
/// (published, or gathered) are the reference in bf16 on every rank. With
/// shard::hybrid the ranks split into two shard groups where they can
/// (hybrid_group). With `max_grad_norm` the gradients are clipped to that global
/// norm first (the synthetic gradients' norm is about 40).
template <class Sharding, class Space, communicator C>
void mixed_precision_case(C& comm, const std::string& name, double max_grad_norm = 0.0) {
    using namespace unison::policy;
    using sp_type =
        sharded_parameters<C, Sharding, mixed_precision<dtype::bf16, dtype::f32, dtype::f32>>;
    sp_type sp(comm, {.shard_group_size =
                          sp_type::strategy::hybrid ? hybrid_group(comm.size()) : comm.size()});
    Space::attach(comm, sp);
    add_accounting_units(sp);
    sp.start();
    // With clipping a large eps: Adam's update is otherwise nearly the same for any
    // common scale of the gradients, and a step that skipped the clipping would pass.
    const optim::adamw hyper{1e-2, 0.9, 0.999, max_grad_norm > 0.0 ? 0.05 : 1e-8, 1e-2};
    partitioned_optimizer<sp_type, optim::adamw> opt(sp, hyper, {.max_grad_norm = max_grad_norm});
    Space::attach(comm, opt);
    const int n = comm.size();

    // The reference: full master, m, v in double for every parameter.
    std::vector<std::vector<double>> master, m, v;
    for (std::size_t id = 0; id < sp.parameter_count(); ++id) {
        std::vector<double> p(sp.numel(id));
        for (std::size_t i = 0; i < p.size(); ++i) {
            p[i] = static_cast<double>(static_cast<float>(synthetic(7, 0, id * 10000 + i) * 0.5));
        }
        master.push_back(p);
        m.emplace_back(p.size(), 0.0);
        v.emplace_back(p.size(), 0.0);
    }
    outcome o;
    for (int step = 1; step <= 3; ++step) {
        synthetic_backward<bf16, Space>(sp, 10 + step, 1.0);
        opt.step();
        sp.zero_grad(); // gradients accumulate until zeroed
        // The gradient as the library sees it: bf16 per rank, summed in f32, averaged,
        // rounded to bf16 for storage; then clipped by the global norm.
        std::vector<std::vector<double>> grad(sp.parameter_count());
        double squares = 0.0;
        for (std::size_t id = 0; id < sp.parameter_count(); ++id) {
            for (std::size_t i = 0; i < master[id].size(); ++i) {
                float sum = 0.0f;
                for (int r = 0; r < n; ++r) {
                    sum += static_cast<float>(
                        bf16(static_cast<float>(synthetic(10 + step, r, id * 10000 + i))));
                }
                grad[id].push_back(static_cast<float>(bf16(sum * static_cast<float>(1.0 / n))));
                squares += grad[id].back() * grad[id].back();
            }
        }
        const double clip =
            max_grad_norm > 0.0 ? std::min(1.0, max_grad_norm / (std::sqrt(squares) + 1e-6)) : 1.0;
        for (std::size_t id = 0; id < sp.parameter_count(); ++id) {
            for (std::size_t i = 0; i < master[id].size(); ++i) {
                const double g = grad[id][i] * clip;
                double& p = master[id][i];
                p *= 1 - hyper.lr * hyper.weight_decay;
                m[id][i] = hyper.beta1 * m[id][i] + (1 - hyper.beta1) * g;
                v[id][i] = hyper.beta2 * v[id][i] + (1 - hyper.beta2) * g * g;
                const double mhat = m[id][i] / (1 - std::pow(hyper.beta1, step));
                const double vhat = v[id][i] / (1 - std::pow(hyper.beta2, step));
                p -= hyper.lr * mhat / (std::sqrt(vhat) + hyper.eps);
            }
        }
    }
    for (std::size_t k = 0; k < sp.unit_count(); ++k) {
        auto part = sp.partition_of(k);
        const auto master_bytes =
            loaded<Space>(sp, part.master, part.range.size(), sp_type::master_dtype);
        const auto param_bytes =
            loaded<Space>(sp, part.param, part.range.size(), sp_type::param_dtype);
        const auto* mp = reinterpret_cast<const float*>(master_bytes.data());
        const auto* pp = reinterpret_cast<const bf16*>(param_bytes.data());
        const auto [first, last] = sp.parameters_of(k);
        for (std::size_t id = first; id < last; ++id) {
            const std::size_t off = sp.offset_of(id);
            for (std::size_t i = 0; i < sp.numel(id); ++i) {
                const std::size_t e = off + i;
                if (e < part.range.begin || e >= part.range.end) {
                    continue;
                }
                const float got = mp[e - part.range.begin];
                const double want = master[id][i];
                o.expect(std::abs(got - want) <= 1e-5 * std::max(1.0, std::abs(want)), [&] {
                    return sp.name(id) + "[" + std::to_string(i) + "] master " +
                           std::to_string(got) + ", double reference " + std::to_string(want);
                });
                const bf16 rounded(got);
                o.expect(std::memcmp(&rounded, &pp[e - part.range.begin], sizeof(bf16)) == 0, [&] {
                    return sp.name(id) + "[" + std::to_string(i) +
                           "] bf16 parameter is not the rounded master";
                });
            }
        }
    }
    // The full parameters every rank computes with (published after the step, or
    // gathered from the shards): every element, whoever owns it, is the reference
    // rounded to bf16 (a master within 1e-5 of it may round to the neighbour).
    for (std::size_t k = 0; k < sp.unit_count(); ++k) {
        sp.gather(k, pass::backward);
        const auto [first, last] = sp.parameters_of(k);
        for (std::size_t id = first; id < last; ++id) {
            const view<bf16> p = sp.template parameter<bf16>(id);
            const auto bytes = loaded<Space>(sp, p.data, p.size, dtype::bf16);
            const auto* full = reinterpret_cast<const bf16*>(bytes.data());
            for (std::size_t i = 0; i < p.size; ++i) {
                const double got = static_cast<float>(full[i]);
                const double want = master[id][i];
                o.expect(std::abs(got - want) <= 0x1.0p-8 * std::abs(want) + 1e-5, [&] {
                    return sp.name(id) + "[" + std::to_string(i) + "] full parameter " +
                           std::to_string(got) + ", double reference " + std::to_string(want);
                });
            }
        }
        sp.release(k, pass::backward);
    }
    UNISON_CHECK_CASE(comm, name, o);
}

/// Everything a step may change on this rank, as bytes (loaded from `Space`).
template <class Space = host_space, class Opt>
std::vector<unsigned char> optimizer_bytes(Opt& opt) {
    auto& sp = opt.parameters();
    using sp_type = std::remove_reference_t<decltype(sp)>;
    std::vector<unsigned char> out;
    auto append = [&](const void* p, std::size_t count, dtype type) {
        const auto b = loaded<Space>(sp, p, count, type);
        out.insert(out.end(), b.begin(), b.end());
    };
    for (std::size_t k = 0; k < sp.unit_count(); ++k) {
        auto part = sp.partition_of(k);
        const std::size_t count = part.range.size();
        append(part.param, count, sp_type::param_dtype);
        if (part.master != nullptr) {
            append(part.master, count, sp_type::master_dtype);
        }
        for (std::size_t s = 0; s < Opt::optimizer_type::slots; ++s) {
            append(opt.state(k, s), count, Opt::state_dtype);
        }
    }
    const std::uint64_t steps = opt.steps();
    const auto* b = reinterpret_cast<const unsigned char*>(&steps);
    out.insert(out.end(), b, b + sizeof steps);
    return out;
}

/// fp16 parameters with dynamic loss scaling; step 2 has an inf on one rank.
template <class Sharding, class Space, communicator C>
void loss_scaling_case(C& comm, const std::string& name) {
    using namespace unison::policy;
    using sp_type =
        sharded_parameters<C, Sharding, mixed_precision<dtype::f16, dtype::f16, dtype::f32>>;
    sp_type scaled_sp(comm, {.shard_group_size = comm.size()}),
        plain_sp(comm, {.shard_group_size = comm.size()});
    Space::attach(comm, scaled_sp);
    Space::attach(comm, plain_sp);
    add_accounting_units(scaled_sp);
    add_accounting_units(plain_sp);
    scaled_sp.start();
    plain_sp.start();
    const optim::adam hyper{1e-3, 0.9, 0.999, 1e-8, 1e-4};
    dynamic_loss_scale dls;
    dls.initial_scale = 1024;
    dls.growth_interval = 2;
    partitioned_optimizer<sp_type, optim::adam> scaled(scaled_sp, hyper, {}, dls);
    partitioned_optimizer<sp_type, optim::adam> plain(plain_sp, hyper);
    Space::attach(comm, scaled);
    Space::attach(comm, plain);

    const double scales[] = {1024, 1024, 2048, 1024, 1024, 2048};
    const int bad_step = 2;
    outcome o;
    for (int step = 0; step < 6; ++step) {
        const double s = scaled.loss_scale();
        o.expect(s == scales[step], "step " + std::to_string(step) + ": loss scale " +
                                        std::to_string(s) + ", expected " +
                                        std::to_string(scales[step]));
        const bool poison = step == bad_step && comm.rank() == (step % comm.size());
        synthetic_backward<half, Space>(scaled_sp, 20 + static_cast<std::uint64_t>(step), s, poison,
                                        true);
        const auto before = optimizer_bytes<Space>(scaled);
        const step_result r = scaled.step();
        scaled_sp.zero_grad();
        if (step == bad_step) {
            o.expect(r.skipped, "the step with an inf was not skipped");
            o.expect(optimizer_bytes<Space>(scaled) == before,
                     "the skipped step changed parameters, master weights, state or the counter");
        } else {
            o.expect(!r.skipped, "step " + std::to_string(step) + " skipped without an inf");
            synthetic_backward<half, Space>(plain_sp, 20 + static_cast<std::uint64_t>(step), 1.0,
                                            false, true);
            plain.step();
            plain_sp.zero_grad();
        }
    }
    o.expect(scaled.steps() == 5,
             "step counter " + std::to_string(scaled.steps()) + ", expected 5");
    o.expect(optimizer_bytes<Space>(scaled) == optimizer_bytes<Space>(plain),
             "the loss-scaled run differs from the unscaled run that skipped the bad step");
    UNISON_CHECK_CASE(comm, name, o);
}

template <class Space, communicator C>
void sharded_accounting_cases(C& comm) {
    using namespace unison::policy;
    accounting_case<zero<0>, Space>(comm, "memory and traffic, zero<0> (DDP)");
    accounting_case<zero<1>, Space>(comm, "memory and traffic, zero<1>");
    accounting_case<zero<2>, Space>(comm, "memory and traffic, zero<2>");
    accounting_case<zero<3>, Space>(comm, "memory and traffic, zero<3>");
    mixed_precision_case<zero<0>, Space>(comm, "bf16 parameters, f32 master, zero<0>");
    mixed_precision_case<zero<1>, Space>(comm, "bf16 parameters, f32 master, zero<1>");
    mixed_precision_case<zero<2>, Space>(comm, "bf16 parameters, f32 master, zero<2>");
    mixed_precision_case<zero<3>, Space>(comm, "bf16 parameters, f32 master, zero<3>");
    mixed_precision_case<shard::grad_op, Space>(comm, "bf16 parameters, f32 master, grad_op");
    mixed_precision_case<shard::hybrid, Space>(comm, "bf16 parameters, f32 master, hybrid");
    mixed_precision_case<zero<3>, Space>(comm, "bf16 parameters, f32 master, zero<3>, clipped",
                                         5.0);
    mixed_precision_case<shard::hybrid, Space>(comm, "bf16 parameters, f32 master, hybrid, clipped",
                                               5.0);
    loss_scaling_case<zero<2>, Space>(comm, "fp16 dynamic loss scaling, zero<2>");
    loss_scaling_case<zero<3>, Space>(comm, "fp16 dynamic loss scaling, zero<3>");
}

} // namespace unison::test
