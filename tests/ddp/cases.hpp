#pragma once

// The bucketed reducer, written once against the communicator concept and a memory
// space (tests/support/memory_space.hpp), and run on every backend by the DDP suite
// (tests/suites/ddp.hpp). Gradients hold deterministic random values per (step,
// rank, gradient, element), computed on the host and stored in the space; after
// finish() every element is loaded back and compared with the mean (or sum) over
// ranks computed here in double precision.

#include "../collectives/cases.hpp"

#include <unison/ddp.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

namespace unison::test {

/// A value in [-1, 1) for element `i` of gradient `g` on `rank` in `step`.
inline double grad_value(std::uint64_t seed, int step, int rank, std::size_t g, std::size_t i) {
    const std::uint64_t h =
        mix(seed * 1000003u + static_cast<std::uint64_t>(step) * 7919u + g, rank, i);
    return static_cast<double>(h >> 11) * 0x1.0p-52 - 1.0;
}

/// Sizes that give many buckets with 4 KiB / 64 KiB bucket limits, odd sizes included.
inline const std::vector<std::size_t> reducer_sizes = {1, 7,    1000,  300001, 5,    65536,
                                                       3, 4096, 77777, 2,      1024, 13};

/// A rank-dependent permutation of 0..n-1 (the order gradients become ready in).
inline std::vector<std::size_t> shuffled(std::size_t n, std::uint64_t seed) {
    std::vector<std::size_t> order(n);
    for (std::size_t k = 0; k < n; ++k) {
        order[k] = k;
    }
    for (std::size_t k = n; k > 1; --k) {
        std::swap(order[k - 1], order[mix(seed, 0, k) % k]);
    }
    return order;
}

/// Gradients of dtype T in memory space `Space`, registered with a reducer as its
/// gradients `first`, `first + 1`, ...; `values[g]` is gradient g's host copy,
/// which the case writes before `put` and reads after `get`.
template <class Space, class T, communicator C>
class space_gradients {
public:
    space_gradients(C& comm, const std::vector<std::size_t>& sizes, std::size_t first = 0)
        : comm_(&comm), first_(first) {
        for (std::size_t s : sizes) {
            tensors_.push_back(Space::make(comm, host_buffer(dtype_of<T>, s)));
            values.emplace_back(s, T(0));
        }
    }
    std::size_t size() const noexcept { return values.size(); }
    /// Gradient g's own memory, to add to (or rebind in) a reducer.
    buffer tensor(std::size_t g) { return tensors_[g].view(); }
    /// Where `reducer` reads and writes gradient g: its own memory, or its place in
    /// a bucket where the reducer holds the gradients (policy::gradients_in_buckets).
    template <class Reducer>
    buffer memory(Reducer& reducer, std::size_t g) {
        if constexpr (Reducer::config::gradient_memory::in_buckets) {
            const view<T> v = reducer.template gradient<T>(first_ + g);
            return {v.data, v.size, dtype_of<T>, v.location};
        } else {
            (void)reducer;
            return tensor(g);
        }
    }
    /// values[g] into gradient g.
    template <class Reducer>
    void put(Reducer& reducer, std::size_t g) {
        Space::store(*comm_, memory(reducer, g), values[g].data());
    }
    /// Gradient g into values[g].
    template <class Reducer>
    void get(Reducer& reducer, std::size_t g) {
        load(memory(reducer, g), values[g]);
    }
    /// Gradient g's own memory (whatever the reducer holds) into `out`.
    void get_own(std::size_t g, std::vector<T>& out) {
        out.resize(values[g].size());
        load(tensor(g), out);
    }

    std::vector<std::vector<T>> values;

private:
    void load(buffer b, std::vector<T>& out) {
        Space::load(*comm_, const_buffer(b.data, b.count, b.type, b.location), out.data());
    }

    C* comm_;
    std::size_t first_;
    std::vector<typename Space::tensor> tensors_;
};

/// One 64-bit value from every rank, through the space (a communicator on device
/// memory may move nothing else).
template <class Space, communicator C>
std::vector<std::int64_t> gathered_from_ranks(C& comm, std::int64_t mine) {
    host_buffer in(dtype::i64, 1);
    std::memcpy(in.bytes.data(), &mine, sizeof mine);
    auto src = Space::make(comm, std::move(in));
    auto dst = Space::make(comm, host_buffer(dtype::i64, static_cast<std::size_t>(comm.size())));
    all_gather(comm, src.view(), dst.view());
    const host_buffer& all = Space::read(comm, std::as_const(dst));
    std::vector<std::int64_t> out(static_cast<std::size_t>(comm.size()));
    std::memcpy(out.data(), all.bytes.data(), out.size() * sizeof(std::int64_t));
    return out;
}

/// The default hook under another type: the reducer then copies the gradients into
/// buckets instead of reducing between them.
struct copying_hook : all_reduce_hook {};

/// How the expected value of one element is formed from the ranks' values.
enum class expect_kind { average, sum };

/// Runs `steps` synchronizations of a `Reducer` over `reducer_sizes` (plus an f64
/// gradient when `mixed`) and checks every element against the double reference
/// within `tol` (absolute; values are in [-1, 1)). Also checks that the rebuilt
/// layout is the same on every rank and follows rank 0's ready order.
template <class Reducer, class T, class Space, communicator C>
void reducer_average_case(C& comm, double tol, expect_kind kind, bool mixed,
                          const std::string& name, ddp_options options = {},
                          std::uint64_t seed = 11) {
    const int n = comm.size();
    const int rank = comm.rank();
    space_gradients<Space, T, C> grads(comm, reducer_sizes);
    space_gradients<Space, double, C> extra(
        comm, mixed ? std::vector<std::size_t>{999} : std::vector<std::size_t>{}, grads.size());
    const std::size_t count = grads.size() + extra.size();

    options.first_bucket_bytes = 4096;
    options.bucket_bytes = 65536;
    Reducer reducer(comm, options);
    Space::attach(comm, reducer);
    for (std::size_t g = 0; g < grads.size(); ++g) {
        reducer.add(grads.tensor(g), "g" + std::to_string(g));
    }
    if (mixed) {
        reducer.add(extra.tensor(0), "extra");
    }
    reducer.start();

    // Gradient g (of all `count`): its values written for `step`, then stored.
    auto write = [&](std::size_t g, int step) {
        if (g < grads.size()) {
            for (std::size_t i = 0; i < grads.values[g].size(); ++i) {
                grads.values[g][i] = static_cast<T>(grad_value(seed, step, rank, g, i));
            }
            grads.put(reducer, g);
        } else {
            for (std::size_t i = 0; i < extra.values[0].size(); ++i) {
                extra.values[0][i] = grad_value(seed, step, rank, g, i);
            }
            extra.put(reducer, 0);
        }
    };
    auto read_all = [&] {
        for (std::size_t g = 0; g < grads.size(); ++g) {
            grads.get(reducer, g);
        }
        for (std::size_t g = 0; g < extra.size(); ++g) {
            extra.get(reducer, g);
        }
    };
    auto value = [&](std::size_t g, std::size_t i) -> double {
        return g < grads.size() ? static_cast<double>(grads.values[g][i])
                                : extra.values[g - grads.size()][i];
    };
    auto size_of_grad = [&](std::size_t g) {
        return g < grads.size() ? grads.values[g].size() : extra.values[g - grads.size()].size();
    };

    outcome o;
    for (int step = 0; step < 3; ++step) {
        const auto order =
            step == 0 ? shuffled(count, seed + static_cast<std::uint64_t>(rank)) : [&] {
                std::vector<std::size_t> r(count);
                for (std::size_t k = 0; k < count; ++k) {
                    r[k] = count - 1 - k;
                }
                return r;
            }();
        for (std::size_t g : order) {
            write(g, step);
            reducer.mark_ready(g);
        }
        o.expect(reducer.finish(), "finish() did not synchronize");
        read_all();
        for (std::size_t g = 0; g < count; ++g) {
            for (std::size_t i = 0; i < size_of_grad(g); ++i) {
                double expected = 0.0;
                for (int r = 0; r < n; ++r) {
                    expected += grad_value(seed, step, r, g, i);
                }
                if (kind == expect_kind::average) {
                    expected /= n;
                }
                const double got = value(g, i);
                o.expect(std::abs(got - expected) <= tol, [&] {
                    return "step " + std::to_string(step) + " gradient " + std::to_string(g) + "[" +
                           std::to_string(i) + "] = " + std::to_string(got) + ", expected " +
                           std::to_string(expected);
                });
            }
        }
        if (step == 0) {
            // The rebuilt layout follows rank 0's ready order, per dtype, on every rank.
            o.expect(reducer.rebuilt(), name + ": buckets not rebuilt after the first step");
            const auto rank0 = shuffled(count, seed);
            const auto layout = reducer.bucket_layout();
            std::vector<std::size_t> flat_f, flat_d;
            for (const auto& b : layout) {
                for (std::size_t g : b) {
                    (g < grads.size() ? flat_f : flat_d).push_back(g);
                }
            }
            std::vector<std::size_t> want_f, want_d;
            for (std::size_t g : rank0) {
                (g < grads.size() ? want_f : want_d).push_back(g);
            }
            o.expect(flat_f == want_f && flat_d == want_d,
                     name + ": rebuilt layout does not follow rank 0's ready order");
            std::uint64_t h = 0;
            for (const auto& b : layout) {
                for (std::size_t g : b) {
                    h = h * 1000003u + g + 1;
                }
                h = h * 31u + 7u;
            }
            const auto all = gathered_from_ranks<Space>(comm, static_cast<std::int64_t>(h));
            o.expect(
                std::all_of(all.begin(), all.end(), [&](std::int64_t x) { return x == all[0]; }),
                name + ": ranks rebuilt different bucket layouts");
        }
    }
    UNISON_CHECK_CASE(comm, name, o);
}

/// Every averaging, dtype, memory and hook policy.
template <class Space, communicator C>
void reducer_policy_cases(C& comm) {
    using namespace unison::policy;
    const double n = comm.size();
    reducer_average_case<bucketed_reducer<C>, float, Space>(comm, 4e-7 * n, expect_kind::average,
                                                            true, "default (f32 + f64)");
    reducer_average_case<bucketed_reducer<C>, double, Space>(comm, 1e-15 * n, expect_kind::average,
                                                             false, "f64");
    reducer_average_case<bucketed_reducer<C>, float, Space>(
        comm, 4e-7 * n, expect_kind::average, true, "predivide 2", {.predivide_factor = 2.0});
    reducer_average_case<bucketed_reducer<C>, float, Space>(comm, 4e-7 * n * n, expect_kind::sum,
                                                            true, "sum", {.average = false});
    reducer_average_case<bucketed_reducer<C, gradients_in_buckets>, float, Space>(
        comm, 4e-7 * n, expect_kind::average, true, "gradients_in_buckets");
    reducer_average_case<bucketed_reducer<C, gradients_in_buckets>, double, Space>(
        comm, 1e-15 * n, expect_kind::average, false, "gradients_in_buckets + predivide 4",
        {.predivide_factor = 4.0});
    reducer_average_case<bucketed_reducer<C, gradients_in_buckets>, float, Space>(
        comm, 4e-7 * n * n, expect_kind::sum, false, "gradients_in_buckets + sum",
        {.average = false});
    // bf16 keeps 8 significant bits: each input and each partial sum rounds by 2^-9
    // relative, partial sums reach n in magnitude.
    reducer_average_case<bucketed_reducer<C, mixed_precision<dtype::f32, dtype::bf16>>, float,
                         Space>(comm, n * n * 0x1.0p-9 + 0x1.0p-9, expect_kind::average, false,
                                "reduce in bf16");
    reducer_average_case<bucketed_reducer<C, mixed_precision<dtype::f32, dtype::f16>>, float,
                         Space>(comm, n * n * 0x1.0p-12 + 0x1.0p-11, expect_kind::average, false,
                                "reduce in f16");
    if constexpr (Space::on_host) { // compress_hook packs host buckets only (ddp/hooks.hpp)
        reducer_average_case<bucketed_reducer<C, comm_hook<compress_hook<dtype::bf16>>>, float,
                             Space>(comm, n * n * 0x1.0p-9 + 0x1.0p-9, expect_kind::average, false,
                                    "compress_hook<bf16>");
        // A hook of its own over gradients in buckets: the reducer cannot fuse the
        // division into the reduction, so it divides after the hook completes.
        reducer_average_case<
            bucketed_reducer<C, gradients_in_buckets, comm_hook<compress_hook<dtype::bf16>>>, float,
            Space>(comm, n * n * 0x1.0p-9 + 0x1.0p-9, expect_kind::average, false,
                   "gradients_in_buckets + compress_hook<bf16> + predivide 2",
                   {.predivide_factor = 2.0});
    }
}

/// Counts the buckets it launches, then reduces like the default hook.
struct counting_hook {
    int* launches = nullptr;
    int* completions = nullptr;
    template <communicator C>
    typename C::request_type launch(C& comm, const bucket_ref& b) {
        ++*launches;
        return all_reduce_hook{}.launch(comm, b);
    }
    void complete(const bucket_ref&) { ++*completions; }
};

/// accumulate_steps = 3: two micro-steps without communication, then one sync of
/// the accumulated gradients.
template <class Space, communicator C>
void reducer_accumulation_case(C& comm, std::uint64_t seed = 21) {
    using namespace unison::policy;
    const int n = comm.size();
    int launches = 0, completions = 0;
    space_gradients<Space, float, C> grads(comm, reducer_sizes);
    bucketed_reducer<C, comm_hook<counting_hook>> reducer(
        comm, {.bucket_bytes = 65536, .first_bucket_bytes = 4096, .accumulate_steps = 3},
        counting_hook{&launches, &completions});
    Space::attach(comm, reducer);
    for (std::size_t g = 0; g < grads.size(); ++g) {
        reducer.add(grads.tensor(g));
    }
    reducer.start();
    outcome o;
    for (int window = 0; window < 2; ++window) {
        for (std::size_t g = 0; g < grads.size(); ++g) { // zero_grad
            std::fill(grads.values[g].begin(), grads.values[g].end(), 0.0f);
            grads.put(reducer, g);
        }
        const int before = launches;
        for (int micro = 0; micro < 3; ++micro) {
            for (std::size_t g = grads.size(); g-- > 0;) {
                // Backward adds to what the gradient holds: a reducer that touched it
                // on an accumulating micro-step would show in the result.
                grads.get(reducer, g);
                for (std::size_t i = 0; i < grads.values[g].size(); ++i) {
                    grads.values[g][i] +=
                        static_cast<float>(grad_value(seed, window * 3 + micro, comm.rank(), g, i));
                }
                grads.put(reducer, g);
                reducer.mark_ready(g);
            }
            const bool synced = reducer.finish();
            o.expect(synced == (micro == 2), "finish() synchronized on the wrong micro-step");
            if (micro < 2) {
                o.expect(launches == before, "a bucket was reduced on an accumulating micro-step");
            }
        }
        o.expect(launches - before == static_cast<int>(reducer.bucket_count()) &&
                     completions == launches,
                 "the hook did not launch and complete every bucket once per window");
        for (std::size_t g = 0; g < grads.size(); ++g) {
            grads.get(reducer, g);
            for (std::size_t i = 0; i < grads.values[g].size(); ++i) {
                double expected = 0.0;
                for (int r = 0; r < n; ++r) {
                    double mine = 0.0;
                    for (int micro = 0; micro < 3; ++micro) {
                        mine += static_cast<float>(grad_value(seed, window * 3 + micro, r, g, i));
                    }
                    expected += mine;
                }
                expected /= n;
                o.expect(std::abs(grads.values[g][i] - expected) <= 3e-6 * n, [&] {
                    return "window " + std::to_string(window) + " gradient " + std::to_string(g) +
                           "[" + std::to_string(i) + "] = " + std::to_string(grads.values[g][i]) +
                           ", expected " + std::to_string(expected);
                });
            }
        }
    }
    UNISON_CHECK_CASE(comm, "accumulate_steps 3", o);
}

/// Unused parameters: gradient 2 is not marked on rank 0, gradient 3 on no rank.
template <class Space, communicator C>
void reducer_unused_cases(C& comm, std::uint64_t seed = 31) {
    using namespace unison::policy;
    const int n = comm.size();
    const int rank = comm.rank();
    outcome o;
    using gradients = space_gradients<Space, float, C>;
    auto run = [&](auto& reducer, gradients& grads, int step, bool skip2, bool skip3) {
        for (std::size_t g = grads.size(); g-- > 0;) {
            for (std::size_t i = 0; i < grads.values[g].size(); ++i) {
                grads.values[g][i] = static_cast<float>(grad_value(seed, step, rank, g, i));
            }
            grads.put(reducer, g);
            if ((g == 2 && skip2 && rank == 0) || (g == 3 && skip3)) {
                continue; // never marked: its stale values must not leak into the result
            }
            reducer.mark_ready(g);
        }
    };
    auto expect = [&](auto& reducer, gradients& grads, int step, bool skip2, bool skip3,
                      const std::string& what) {
        for (std::size_t g = 0; g < grads.size(); ++g) {
            grads.get(reducer, g);
            for (std::size_t i = 0; i < grads.values[g].size(); ++i) {
                double expected = 0.0;
                for (int r = 0; r < n; ++r) {
                    const bool used = !((g == 2 && skip2 && r == 0) || (g == 3 && skip3));
                    expected += used ? grad_value(seed, step, r, g, i) : 0.0;
                }
                expected /= n;
                const float got = grads.values[g][i];
                o.expect(std::abs(got - expected) <= 4e-7 * n, [&] {
                    return what + ": gradient " + std::to_string(g) + "[" + std::to_string(i) +
                           "] = " + std::to_string(got) + ", expected " + std::to_string(expected);
                });
            }
        }
    };
    {
        // Declared before the reducers, which keep pointers to them.
        gradients grads_a(comm, reducer_sizes), grads_b(comm, reducer_sizes),
            grads_c(comm, reducer_sizes);
        auto three_steps = [&](auto& reducer, gradients& grads, const std::string& what) {
            Space::attach(comm, reducer);
            for (std::size_t g = 0; g < grads.size(); ++g) {
                reducer.add(grads.tensor(g));
            }
            reducer.start();
            for (int step = 0; step < 3; ++step) {
                run(reducer, grads, step, true, true);
                (void)reducer.finish();
                expect(reducer, grads, step, true, true, what + " step " + std::to_string(step));
            }
        };
        const ddp_options small{.bucket_bytes = 65536, .first_bucket_bytes = 4096};
        bucketed_reducer<C, unused_as_zero> in_place(comm, small);
        three_steps(in_place, grads_a, "unused_as_zero");
        // Each path writes the zeros of an unused gradient its own way: into the
        // bucket copy, into the gradient itself, or into the bucket that holds it.
        bucketed_reducer<C, unused_as_zero, comm_hook<copying_hook>> packed(comm, small);
        three_steps(packed, grads_b, "unused_as_zero, packed");
        bucketed_reducer<C, unused_as_zero, gradients_in_buckets> held(comm, small);
        three_steps(held, grads_c, "unused_as_zero, gradients_in_buckets");
    }
    {
        gradients grads(comm, reducer_sizes);
        bucketed_reducer<C, unused_is_error> reducer(comm);
        Space::attach(comm, reducer);
        for (std::size_t g = 0; g < grads.size(); ++g) {
            reducer.add(grads.tensor(g), "layer" + std::to_string(g) + ".weight");
        }
        reducer.start();
        run(reducer, grads, 0, true, false);
        bool threw = false;
        try {
            (void)reducer.finish();
        } catch (const argument_error& e) {
            threw = true;
            o.expect(std::string(e.what()).find("'layer2.weight'") != std::string::npos,
                     std::string("the error does not name the parameter: ") + e.what());
        }
        o.expect(threw == (rank == 0), "unused_is_error threw on the wrong ranks");
        expect(reducer, grads, 0, true, false,
               "unused_is_error (reductions completed before the error)");
        run(reducer, grads, 1, false, false); // the next full step works on every rank
        (void)reducer.finish();
        expect(reducer, grads, 1, false, false, "unused_is_error, step after the error");
    }
    UNISON_CHECK_CASE(comm, "unused parameters", o);
}

/// A gradient rebound after start() (a framework that reallocates its gradients) is
/// read and written in its new memory from then on, and its old memory is left
/// alone, on each path that reduces the gradients' own memory or copies from it.
template <class Space, communicator C>
void reducer_rebind_case(C& comm, std::uint64_t seed = 51) {
    using namespace unison::policy;
    const int n = comm.size();
    const int rank = comm.rank();
    outcome o;
    using gradients = space_gradients<Space, float, C>;
    auto check = [&](auto& reducer, gradients& first, gradients& second, const std::string& what) {
        Space::attach(comm, reducer);
        for (std::size_t g = 0; g < first.size(); ++g) {
            reducer.add(first.tensor(g));
        }
        reducer.start();
        std::vector<std::vector<float>> kept; // `first` after step 0
        for (int step = 0; step < 3; ++step) {
            if (step == 1) { // after the rebuild; every other gradient moves
                kept = first.values;
                for (std::size_t g = 1; g < first.size(); g += 2) {
                    reducer.rebind(g, second.tensor(g));
                }
            }
            auto grads = [&](std::size_t g) -> gradients& {
                return step > 0 && g % 2 == 1 ? second : first;
            };
            for (std::size_t g = first.size(); g-- > 0;) {
                for (std::size_t i = 0; i < grads(g).values[g].size(); ++i) {
                    grads(g).values[g][i] = static_cast<float>(grad_value(seed, step, rank, g, i));
                }
                grads(g).put(reducer, g);
                reducer.mark_ready(g);
            }
            (void)reducer.finish();
            std::vector<float> old;
            for (std::size_t g = 0; g < first.size(); ++g) {
                grads(g).get(reducer, g);
                const bool moved = step > 0 && g % 2 == 1;
                if (moved) {
                    first.get_own(g, old);
                }
                for (std::size_t i = 0; i < first.values[g].size(); ++i) {
                    double expected = 0.0;
                    for (int r = 0; r < n; ++r) {
                        expected += grad_value(seed, step, r, g, i);
                    }
                    expected /= n;
                    const float got = grads(g).values[g][i];
                    o.expect(std::abs(got - expected) <= 4e-7 * n, [&] {
                        return what + " step " + std::to_string(step) + ": gradient " +
                               std::to_string(g) + "[" + std::to_string(i) +
                               "] = " + std::to_string(got) + ", expected " +
                               std::to_string(expected);
                    });
                    if (moved) {
                        o.expect(old[i] == kept[g][i], [&] {
                            return what + " step " + std::to_string(step) + ": gradient " +
                                   std::to_string(g) + "'s old memory was written after rebind";
                        });
                    }
                }
            }
        }
    };
    const ddp_options small{.bucket_bytes = 65536, .first_bucket_bytes = 4096};
    // Declared before the reducers, which keep pointers to them.
    gradients first_a(comm, reducer_sizes), second_a(comm, reducer_sizes);
    gradients first_b(comm, reducer_sizes), second_b(comm, reducer_sizes);
    bucketed_reducer<C> in_place(comm, small);
    check(in_place, first_a, second_a, "rebind, reduced in place");
    bucketed_reducer<C, comm_hook<copying_hook>> packed(comm, small);
    check(packed, first_b, second_b, "rebind, packed");
    UNISON_CHECK_CASE(comm, "rebind", o);
}

/// join: rank r has data for 2 + r steps; every rank keeps stepping until the last
/// one is done, and the average is over the ranks that had data.
template <class Space, communicator C>
void reducer_join_case(C& comm, std::uint64_t seed = 41) {
    const int n = comm.size();
    const int rank = comm.rank();
    space_gradients<Space, float, C> grads(comm, reducer_sizes);
    bucketed_reducer<C> reducer(comm, {.bucket_bytes = 65536, .first_bucket_bytes = 4096});
    Space::attach(comm, reducer);
    for (std::size_t g = 0; g < grads.size(); ++g) {
        reducer.add(grads.tensor(g));
    }
    reducer.start();
    join j(reducer);
    outcome o;
    int step = 0;
    while (j.next(step < 2 + rank)) {
        if (j.has_data()) {
            for (std::size_t g = grads.size(); g-- > 0;) {
                for (std::size_t i = 0; i < grads.values[g].size(); ++i) {
                    grads.values[g][i] = static_cast<float>(grad_value(seed, step, rank, g, i));
                }
                grads.put(reducer, g);
                reducer.mark_ready(g);
            }
        }
        (void)reducer.finish();
        const int active = std::min(n, std::max(0, n - (step - 1)));
        o.expect(j.active_ranks() == active,
                 "step " + std::to_string(step) + ": " + std::to_string(j.active_ranks()) +
                     " active ranks, expected " + std::to_string(active));
        for (std::size_t g = 0; g < grads.size(); ++g) {
            grads.get(reducer, g);
            for (std::size_t i = 0; i < grads.values[g].size(); i += 7) {
                double expected = 0.0;
                for (int r = 0; r < n; ++r) {
                    expected += step < 2 + r ? grad_value(seed, step, r, g, i) : 0.0;
                }
                expected /= active;
                o.expect(std::abs(grads.values[g][i] - expected) <= 4e-7 * n, [&] {
                    return "join step " + std::to_string(step) + " gradient " + std::to_string(g) +
                           " = " + std::to_string(grads.values[g][i]) + ", expected " +
                           std::to_string(expected);
                });
            }
        }
        ++step;
    }
    o.expect(step == 1 + n,
             "join ran " + std::to_string(step) + " steps, expected " + std::to_string(1 + n));
    UNISON_CHECK_CASE(comm, "join", o);
}

/// `values` as a tensor in memory space `Space`.
template <class Space, communicator C, class T>
typename Space::tensor space_tensor(C& comm, const std::vector<T>& values) {
    host_buffer h(dtype_of<T>, values.size());
    std::memcpy(h.bytes.data(), values.data(), values.size() * sizeof(T));
    return Space::make(comm, std::move(h));
}

/// The elements of `t`, a tensor of T in memory space `Space`, on the host.
template <class T, class Space, communicator C>
std::vector<T> space_values(C& comm, const typename Space::tensor& t) {
    const host_buffer& h = Space::read(comm, t);
    std::vector<T> out(h.n);
    std::memcpy(out.data(), h.bytes.data(), out.size() * sizeof(T));
    return out;
}

/// A sum over the ranks, in `Space`, after a check that threw: the communicator is
/// still usable.
template <class Space, communicator C>
void check_still_usable(C& comm) {
    auto x = space_tensor<Space>(comm, std::vector<float>(3, 1.0f));
    all_reduce(comm, x.view());
    CHECK(space_values<float, Space>(comm, x)[0] == static_cast<float>(comm.size()));
}

/// Misuse is an argument_error naming what was wrong; a registration that differs
/// across ranks is a mismatch_error on every rank. The gradients (and ddp's
/// parameters) are tensors in `Space`, with the reducers put there; the errors are
/// the same wherever they live.
template <class Space, communicator C>
void reducer_error_cases(C& comm) {
    using namespace unison::policy;
    // Declared before the reducers, which keep pointers to them.
    auto a = space_tensor<Space>(comm, std::vector<float>(10, 1.0f));
    auto b = space_tensor<Space>(comm, std::vector<float>(20, 1.0f));
    {
        bucketed_reducer<C> r(comm);
        Space::attach(comm, r);
        r.add(a.view(), "a");
        CHECK_THROWS_WITH_AS(r.mark_ready(0), doctest::Contains("start()"), argument_error);
        r.start();
        CHECK_THROWS_WITH_AS(r.mark_ready(5), doctest::Contains("out of range"), argument_error);
        r.mark_ready(0);
        CHECK_THROWS_WITH_AS(r.mark_ready(0), doctest::Contains("'a' marked ready twice"),
                             argument_error);
        (void)r.finish();
        CHECK_THROWS_WITH_AS(r.rebind(0, b.view()), doctest::Contains("'a' rebound to 20"),
                             argument_error);
    }
    {
        // Accumulating over 2 micro-batches but calling finish() once per window (the
        // trap: every rank would step on its own gradients): the second backward's
        // mark_ready names the mistake before any step is taken.
        bucketed_reducer<C> r(comm, {.accumulate_steps = 2});
        Space::attach(comm, r);
        r.add(a.view(), "a");
        r.start();
        r.mark_ready(0);                      // micro-batch 1
        CHECK_THROWS_WITH_AS(r.mark_ready(0), // micro-batch 2, without finish() in between
                             doctest::Contains("'a' marked ready twice without finish() in "
                                               "between: call finish() after every backward "
                                               "(with accumulate_steps = 2, every micro-batch's"),
                             argument_error);
        CHECK_FALSE(r.finish()); // used right, the window then synchronizes on its 2nd finish
        r.mark_ready(0);
        CHECK(r.finish());
    }
    {
        bucketed_reducer<C, mixed_precision<dtype::f64, dtype::f32>> r(comm);
        Space::attach(comm, r);
        CHECK_THROWS_WITH_AS(r.add(a.view(), "w"),
                             doctest::Contains("'w' is float but mixed_precision says parameters "
                                               "and gradients are double"),
                             argument_error);
    }
    CHECK_THROWS_WITH_AS((bucketed_reducer<C>(comm, {.accumulate_steps = 0})),
                         doctest::Contains("accumulate_steps is 0"), argument_error);
    {
        auto ints = space_tensor<Space>(comm, std::vector<int>(4, 1));
        bucketed_reducer<C> r(comm);
        Space::attach(comm, r);
        CHECK_THROWS_WITH_AS(r.add(ints.view(), "counts"),
                             doctest::Contains("'counts' has dtype int32"), argument_error);
    }
    if (comm.size() > 1) {
        bucketed_reducer<C> r(comm);
        Space::attach(comm, r);
        r.add(a.view(), "a");
        if (comm.rank() == 1) {
            r.add(b.view(), "b"); // rank 1's model has one more parameter
        }
        CHECK_THROWS_AS(r.start(), mismatch_error);
        // The check was one completed collective: the communicator is still usable.
        check_still_usable<Space>(comm);
    }
    if (comm.size() > 1) {
        // Another accumulate_steps on one rank would pair its reductions with the
        // others' accumulating passes: start() compares the options.
        const int odd = comm.size() - 1;
        bucketed_reducer<C> r(comm, {.accumulate_steps = comm.rank() == odd ? 2 : 1});
        Space::attach(comm, r);
        r.add(a.view(), "a");
        try {
            r.start();
            FAIL("start() accepted different accumulate_steps");
        } catch (const mismatch_error& e) {
            CHECK(e.field() == "accumulate_steps");
            CHECK(e.other_rank() == (comm.rank() == odd ? 0 : odd));
            CHECK(std::string(e.what()).find("has accumulate_steps = ") != std::string::npos);
        }
        check_still_usable<Space>(comm);
    }
    if (comm.size() > 1) {
        // ddp::start compares the parameters' sizes before its broadcast, which would
        // otherwise truncate (MPI kills the job) or read past a buffer, and names the
        // first one that differs.
        const std::size_t n = comm.rank() == 1 ? 12 : 10;
        auto b = space_tensor<Space>(comm, std::vector<float>(4, 1.0f));
        auto gb = space_tensor<Space>(comm, std::vector<float>(4, 0.0f));
        auto w = space_tensor<Space>(comm, std::vector<float>(n, 1.0f));
        auto gw = space_tensor<Space>(comm, std::vector<float>(n, 0.0f));
        ddp<C> dp(comm);
        Space::attach(comm, dp);
        dp.add_parameter(b.view(), gb.view(), "b");
        dp.add_parameter(w.view(), gw.view(), "w");
        const std::string expected = "entry #1, on this rank parameter 'w' (" + std::to_string(n) +
                                     " float), is different on rank " +
                                     std::to_string(comm.rank() == 1 ? 0 : 1);
        CHECK_THROWS_WITH_AS(dp.start(), doctest::Contains(expected.c_str()), mismatch_error);
        check_still_usable<Space>(comm);
        CHECK(space_values<float, Space>(comm, w)[0] == 1.0f); // nothing was broadcast
    }
}

} // namespace unison::test
