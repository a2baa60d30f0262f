#pragma once

// A rank that skips a whole training step, under ddp and the fsdp engine. The
// engines stamp their own counts on their collectives, but a count kept by the
// engine skips along with the rank; the loop's index, set on a
// stepped_communicator the engine is given, replaces the engines' count on every
// call they make. So the first collective of the skipped step must fail on every
// rank with a mismatch_error on "step", where unstamped the skipping rank's step
// would pair with the others' previous one and mix gradients of different batches.
// The engines live in the fixture's memory space (memory_space.hpp): the gradients
// are stored to and loaded from it.

#include "memory_space.hpp"

#include <unison/ddp.hpp>
#include <unison/sharded.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace unison::test {

namespace skip_detail {
inline constexpr std::uint64_t skipped_step = 3;

// A value in [-1, 1] for (seed, rank, index), so every rank can compute the others'.
inline double value(std::uint64_t seed, int rank, std::size_t i) {
    return static_cast<double>(mix(seed, rank, i) % 2001) / 1000.0 - 1.0;
}

// Checks what a rank saw: the others fail at the skipped step, the skipper at the
// one after, and the error names both steps.
inline void check_failed_at(int rank, int skipper, std::uint64_t failed_at, const std::string& what,
                            const std::string& field) {
    CAPTURE(what);
    CHECK(field == "step");
    CHECK(failed_at == (rank == skipper ? skipped_step + 1 : skipped_step));
    CHECK(what.find("step " + std::to_string(skipped_step)) != std::string::npos);
    CHECK(what.find("step " + std::to_string(skipped_step + 1)) != std::string::npos);
}

// Whether `comm` compares every collective's signature, its step included, across
// ranks before any data moves. The thread, MPI and Gloo backends always do; NCCL
// (the one backend that moves device memory only) does only with
// comm_options::check_matching (UNISON_DEBUG=1). Without the check the skipping
// rank's calls pair with the others' of the previous step, and the others' last
// step waits for a partner until the timeout: there is nothing to catch.
// A decorator (stepped, counting, device_memory_only) compares what the
// communicator it wraps compares.
template <communicator C>
bool compares_steps(C& comm) {
    if constexpr (requires { comm.inner(); }) {
        return compares_steps(comm.inner());
    } else {
        return moves_host_memory<C> || comm.options().check_matching;
    }
}

// Says, once per world, why the case did not run.
template <communicator C>
void note_unchecked(const C& comm) {
    if (comm.rank() == 0) {
        MESSAGE("skipped-step case not run: this communicator compares calls across ranks "
                "only with check_matching (UNISON_DEBUG=1)");
    }
}

// `n` copies of `x` as a tensor of floats in `Space`.
template <class Space, communicator C>
typename Space::tensor filled_tensor(C& comm, std::size_t n, float x) {
    const std::vector<float> values(n, x);
    host_buffer h(dtype::f32, n);
    std::memcpy(h.bytes.data(), values.data(), n * sizeof(float));
    return Space::make(comm, std::move(h));
}
} // namespace skip_detail

template <class Space, communicator C>
void ddp_skipped_step_is_caught(C& comm) {
    if (comm.size() < 2) {
        return;
    }
    if (!skip_detail::compares_steps(comm)) {
        skip_detail::note_unchecked(comm);
        return;
    }
    const int skipper = comm.size() - 1;
    const std::vector<std::size_t> sizes = {300, 17, 1000};
    auto grad = [](int rank, std::uint64_t step, std::size_t g, std::size_t i) {
        return skip_detail::value(77 + step, rank, g * 4096 + i);
    };
    // The parameters and gradients in the space, made before ddp, which keeps
    // their addresses; `values` is the gradients' host copy, stored and loaded.
    std::vector<typename Space::tensor> params, grads;
    std::vector<std::vector<float>> values(sizes.size());
    for (std::size_t g = 0; g < sizes.size(); ++g) {
        params.push_back(skip_detail::filled_tensor<Space>(comm, sizes[g], 0.5f));
        grads.push_back(skip_detail::filled_tensor<Space>(comm, sizes[g], 0.0f));
        values[g].resize(sizes[g]);
    }
    stepped_communicator<C> steps(comm);
    ddp<stepped_communicator<C>> dp(steps); // one bucket: one all_reduce per step
    Space::attach(comm, dp);
    for (std::size_t g = 0; g < sizes.size(); ++g) {
        dp.add_parameter(params[g].view(), grads[g].view(), "w" + std::to_string(g));
    }
    dp.start();
    auto load_grads = [&] {
        for (std::size_t g = 0; g < sizes.size(); ++g) {
            Space::load(comm, grads[g].view(), values[g].data());
        }
    };
    std::uint64_t failed_at = ~std::uint64_t{0};
    std::string what, field;
    double worst = 0; // |averaged - reference| in the steps before the skip
    for (std::uint64_t i = 0; i < 8; ++i) {
        if (comm.rank() == skipper && i == skip_detail::skipped_step) {
            continue; // e.g. a batch this rank's loader dropped
        }
        steps.set_step(i);
        for (std::size_t g = 0; g < sizes.size(); ++g) {
            for (std::size_t j = 0; j < sizes[g]; ++j) {
                values[g][j] = static_cast<float>(grad(comm.rank(), i, g, j));
            }
            Space::store(comm, grads[g].view(), values[g].data());
        }
        const std::vector<std::vector<float>> before = values;
        try {
            for (std::size_t g = sizes.size(); g-- > 0;) {
                dp.mark_ready(g);
            }
            (void)dp.finish();
        } catch (const mismatch_error& e) {
            failed_at = i;
            what = e.what();
            field = e.field();
            load_grads();
            CHECK(values == before); // nothing written back
            break;
        }
        load_grads();
        for (std::size_t g = 0; g < sizes.size(); ++g) {
            for (std::size_t j = 0; j < sizes[g]; ++j) {
                double mean = 0;
                for (int r = 0; r < comm.size(); ++r) {
                    mean += grad(r, i, g, j);
                }
                mean /= comm.size();
                worst = std::max(worst, std::abs(values[g][j] - mean));
            }
        }
    }
    CHECK(worst < 2e-6); // floats of magnitude <= 1
    skip_detail::check_failed_at(comm.rank(), skipper, failed_at, what, field);
}

// Strategy shard::hybrid splits the communicator: the split-off ones share the
// stepped_communicator's step.
template <class Strategy, class Space, communicator C>
void fsdp_skipped_step_is_caught(C& comm) {
    if (comm.size() < 2) {
        return;
    }
    if (!skip_detail::compares_steps(comm)) {
        skip_detail::note_unchecked(comm);
        return;
    }
    const int skipper = comm.size() - 1;
    using engine_type = fsdp<stepped_communicator<C>, Strategy, optim::sgd>;
    // hybrid: shard groups of one rank, so the replica all-reduce spans every rank
    // (with larger groups, the ranks that share no communicator with the skipper
    // fail later, on their next call that involves a rank that failed)
    const int group = 1;
    const std::vector<std::size_t> sizes = {13, 40};
    std::vector<std::vector<float>> init(sizes.size());
    for (std::size_t k = 0; k < sizes.size(); ++k) {
        init[k].resize(sizes[k]);
        for (std::size_t j = 0; j < sizes[k]; ++j) {
            init[k][j] = static_cast<float>(skip_detail::value(9, 0, k * 100 + j));
        }
    }
    stepped_communicator<C> steps(comm);
    engine_type engine(steps,
                       {.optimizer = {.lr = 0.25}, .prefetch = 0, .shard_group_size = group});
    Space::attach(comm, engine);
    std::vector<unit_handle> u;
    for (std::size_t k = 0; k < sizes.size(); ++k) {
        u.push_back(engine.add_unit({{"p" + std::to_string(k), init[k]}}));
    }
    engine.start();
    std::uint64_t failed_at = ~std::uint64_t{0};
    std::string what, field;
    for (std::uint64_t i = 0; i < 8; ++i) {
        if (comm.rank() == skipper && i == skip_detail::skipped_step) {
            continue;
        }
        steps.set_step(i);
        try {
            for (std::size_t k = 0; k < sizes.size(); ++k) {
                auto s = engine.forward(u[k]);
            }
            for (std::size_t k = sizes.size(); k-- > 0;) {
                auto s = engine.backward(u[k]);
                add_to_view<Space>(comm, engine.gradient(u[k][0]), [&](std::size_t j) {
                    return skip_detail::value(31 + i, comm.rank(), j);
                });
            }
            engine.step();
        } catch (const mismatch_error& e) {
            failed_at = i;
            what = e.what();
            field = e.field();
            break;
        }
    }
    skip_detail::check_failed_at(comm.rank(), skipper, failed_at, what, field);
}

} // namespace unison::test
