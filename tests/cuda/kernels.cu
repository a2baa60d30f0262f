// Every kernel against its host implementation (kernels/host.hpp), which shares
// its element math and is itself checked against double-precision references in
// tests/unit/kernels_host.cpp. Random data, odd sizes, unaligned starts and many
// tiny tensors.
//
// Where a result is one multiply and one rounding (scale-and-cast without
// accumulation) device and host agree bit for bit. Where the math has a multiply
// followed by an add, nvcc contracts them into one fused multiply-add by default
// and the host compiler does not, so the results may differ in the last place:
// those compare within a few units of the destination's roundoff.

#include "support.cuh"

#include <unison/kernels.cuh>
#include <unison/kernels/host.hpp>
#include <unison/optim.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

namespace {

using namespace unison;
using test::first_difference;
using test::random_values;

/// Units of roundoff of T: what "a few ulps" is measured in.
template <class T>
double roundoff() {
    if constexpr (std::is_same_v<T, double>) {
        return 0x1.0p-53;
    } else if constexpr (std::is_same_v<T, float>) {
        return 0x1.0p-24;
    } else if constexpr (std::is_same_v<T, half>) {
        return 0x1.0p-11;
    } else {
        return 0x1.0p-8;
    }
}

template <class T>
double as_double(T v) {
    return detail::load_as<double>(v);
}

/// First index where |a - b| > ulps * roundoff * max(|a|, |b|, floor), or -1. The
/// floor is the size of the operands: when a fused multiply-add nearly cancels,
/// the difference from the unfused host result is relative to the operands (up to
/// `floor`), not to the small result.
template <class T>
long first_far(const std::vector<T>& a, const std::vector<T>& b, double ulps, double floor) {
    for (std::size_t i = 0; i < a.size(); ++i) {
        const double x = as_double(a[i]), y = as_double(b[i]);
        const double mag = std::max({std::fabs(x), std::fabs(y), floor});
        if (!(std::fabs(x - y) <= ulps * 2 * roundoff<T>() * mag)) {
            return static_cast<long>(i);
        }
    }
    return -1;
}

/// A layout of `sizes` tensors inside one source and one destination buffer, each
/// starting `skew` elements after the previous one ends (unaligned starts).
struct layout {
    std::vector<std::size_t> sizes, src_at, dst_at;
    std::size_t src_total = 0, dst_total = 0;
    layout(std::vector<std::size_t> s, std::size_t skew) : sizes(std::move(s)) {
        for (std::size_t n : sizes) {
            src_at.push_back(src_total);
            dst_at.push_back(dst_total);
            src_total += n + skew;
            dst_total += n + (skew == 0 ? 0 : skew + 2);
        }
    }
};

std::vector<std::vector<std::size_t>> size_lists() {
    std::vector<std::size_t> tiny;
    for (std::size_t i = 0; i < 600; ++i) {
        tiny.push_back(i % 19); // zeros included
    }
    return {{1}, {7, 1031, 65537}, {(1u << 20) + 3, 5, 8192, 8193}, tiny};
}

template <class D, class S>
void check_multi_scale_cast(double scale, bool accumulate, bool one_shot) {
    const std::string name = std::string(to_string(dtype_of<D>)) + " <- " +
                             std::string(to_string(dtype_of<S>)) + " scale " +
                             std::to_string(scale) + (accumulate ? " accumulate" : "") +
                             (one_shot ? " one-shot" : " plan");
    for (std::size_t skew : {std::size_t{0}, std::size_t{1}}) {
        for (const auto& sizes : size_lists()) {
            const layout l(sizes, skew);
            const std::vector<S> src = random_values<S>(l.src_total, 11 + skew);
            const std::vector<D> dst0 = random_values<D>(l.dst_total, 12 + skew);
            auto d_src = test::to_device(src);
            auto d_dst = test::to_device(dst0);
            std::vector<D> host_dst = dst0;
            std::vector<kernels::copy_piece> hp, dp;
            for (std::size_t k = 0; k < sizes.size(); ++k) {
                hp.push_back({src.data() + l.src_at[k], host_dst.data() + l.dst_at[k], sizes[k]});
                dp.push_back({d_src.data() + l.src_at[k], d_dst.data() + l.dst_at[k], sizes[k]});
            }
            kernels::host::multi_scale_cast(hp, dtype_of<D>, dtype_of<S>, scale, accumulate);
            if (one_shot) {
                kernels::multi_scale_cast(dp, dtype_of<D>, dtype_of<S>, scale, accumulate, nullptr);
            } else {
                const kernels::multi_tensor_plan plan(dp);
                kernels::multi_scale_cast(plan, dtype_of<D>, dtype_of<S>, scale, accumulate,
                                          nullptr);
                test::sync();
            }
            test::sync();
            const std::vector<D> got = d_dst.to_host();
            const long bad =
                accumulate ? first_far(got, host_dst, 1.0, 2.0) : first_difference(got, host_dst);
            CHECK_MESSAGE(bad < 0, name << " skew " << skew << " tensors " << sizes.size()
                                        << ": first difference at element " << bad);
        }
    }
}

} // namespace

TEST_CASE("kernels: multi_scale_cast equals the host loop for every dtype pair") {
    // Accumulation compares within an ulp relative to the operands (|dst| <= 1,
    // |src * scale| <= 1): nvcc fuses the multiply-add, the host does not.
    for (bool one_shot : {false, true}) {
        for (double scale : {1.0, 0.125, 1.0 / 3.0}) {
            for (bool acc : {false, true}) {
                check_multi_scale_cast<bf16, float>(scale, acc, one_shot);
                check_multi_scale_cast<half, float>(scale, acc, one_shot);
                check_multi_scale_cast<float, float>(scale, acc, one_shot);
                check_multi_scale_cast<float, bf16>(scale, acc, one_shot);
                check_multi_scale_cast<float, half>(scale, acc, one_shot);
                check_multi_scale_cast<float, double>(scale, acc, one_shot);
                check_multi_scale_cast<double, float>(scale, acc, one_shot);
                check_multi_scale_cast<bf16, bf16>(scale, acc, one_shot);
                check_multi_scale_cast<bf16, half>(scale, acc, one_shot);
                check_multi_scale_cast<bf16, double>(scale, acc, one_shot);
                check_multi_scale_cast<half, half>(scale, acc, one_shot);
                check_multi_scale_cast<half, bf16>(scale, acc, one_shot);
                check_multi_scale_cast<half, double>(scale, acc, one_shot);
                check_multi_scale_cast<double, double>(scale, acc, one_shot);
                check_multi_scale_cast<double, bf16>(scale, acc, one_shot);
                check_multi_scale_cast<double, half>(scale, acc, one_shot);
            }
        }
    }
}

TEST_CASE("kernels: pack then unpack round-trips through a bf16 bucket as the host does") {
    const std::vector<std::size_t> sizes{3, 4096, 1, 70000, 17, 0, 129};
    std::vector<std::vector<float>> grads;
    std::vector<cuda::device_buffer<float>> d_grads;
    std::size_t total = 0;
    for (std::size_t k = 0; k < sizes.size(); ++k) {
        grads.push_back(random_values<float>(sizes[k], 100 + k, 4.0));
        d_grads.push_back(test::to_device(grads.back()));
        total += sizes[k];
    }
    std::vector<kernels::read_piece> dr, hr;
    std::vector<kernels::copy_piece> du, hu;
    std::vector<bf16> host_bucket(total);
    std::vector<std::vector<float>> host_out(sizes.size());
    std::vector<cuda::device_buffer<float>> d_out;
    for (std::size_t k = 0; k < sizes.size(); ++k) {
        host_out[k] = random_values<float>(sizes[k], 200 + k);
        d_out.push_back(test::to_device(host_out[k]));
        dr.push_back({d_grads[k].data(), sizes[k]});
        hr.push_back({grads[k].data(), sizes[k]});
        du.push_back({nullptr, d_out[k].data(), sizes[k]});
        hu.push_back({nullptr, host_out[k].data(), sizes[k]});
    }
    cuda::device_buffer<bf16> d_bucket(total, 0);
    kernels::pack(dr, dtype::f32, d_bucket.data(), dtype::bf16, 0.25, nullptr);
    kernels::unpack(d_bucket.data(), dtype::bf16, du, dtype::f32, 2.0, true, nullptr);
    test::sync();
    // The host: the same two steps with the host loops.
    std::size_t at = 0;
    for (std::size_t k = 0; k < sizes.size(); ++k) {
        kernels::host::scale_cast(host_bucket.data() + at, dtype::bf16, grads[k].data(), dtype::f32,
                                  sizes[k], 0.25);
        at += sizes[k];
    }
    CHECK(first_difference(d_bucket.to_host(), host_bucket) < 0);
    at = 0;
    for (std::size_t k = 0; k < sizes.size(); ++k) {
        kernels::host::scale_cast(host_out[k].data(), dtype::f32, host_bucket.data() + at,
                                  dtype::bf16, sizes[k], 2.0, true);
        at += sizes[k];
        // Operands: |out| <= 1 and |2 * bucket| <= 2.
        CHECK_MESSAGE(first_far(d_out[k].to_host(), host_out[k], 1.0, 3.0) < 0, "tensor " << k);
    }
}

TEST_CASE("kernels: average_cast after a reduction equals the host scale-and-cast") {
    for (int ranks : {2, 3, 8}) {
        for (std::size_t n : {std::size_t{1}, std::size_t{1031}, std::size_t{(1u << 22) + 1}}) {
            const std::vector<float> reduced = random_values<float>(n, 7 + n, 8.0);
            auto d_reduced = test::to_device(reduced);
            cuda::device_buffer<bf16> d_out(n, 0);
            std::vector<bf16> host_out(n);
            kernels::average_cast(d_out.data(), dtype::bf16, d_reduced.data(), dtype::f32, n, ranks,
                                  nullptr);
            kernels::host::scale_cast(host_out.data(), dtype::bf16, reduced.data(), dtype::f32, n,
                                      1.0 / ranks);
            test::sync();
            CHECK_MESSAGE(first_difference(d_out.to_host(), host_out) < 0,
                          "ranks " << ranks << " n " << n);
        }
    }
}

namespace {

template <class T>
void check_norm() {
    for (const auto& sizes : size_lists()) {
        const layout l(sizes, 1);
        std::vector<T> x = random_values<T>(l.src_total, 31, 3.0);
        std::mt19937_64 rng(5);
        const double specials[] = {std::numeric_limits<double>::infinity(),
                                   -std::numeric_limits<double>::infinity(),
                                   std::numeric_limits<double>::quiet_NaN()};
        const bool poison = sizes.size() == 3;
        if (poison) {
            for (int k = 0; k < 3; ++k) {
                x[rng() % x.size()] = detail::store_as<T>(specials[k]);
            }
        }
        auto d_x = test::to_device(x);
        std::vector<kernels::read_piece> hp, dp;
        for (std::size_t k = 0; k < sizes.size(); ++k) {
            hp.push_back({x.data() + l.src_at[k], sizes[k]});
            dp.push_back({d_x.data() + l.src_at[k], sizes[k]});
        }
        const kernels::norm_stats want = kernels::host::multi_norm(hp, dtype_of<T>);
        cuda::device_buffer<double> out(2, 0);
        auto* stats = reinterpret_cast<kernels::norm_stats*>(out.data());
        const kernels::multi_tensor_plan plan(dp);
        kernels::multi_norm(plan, dtype_of<T>, stats, nullptr);
        test::sync();
        const std::vector<double> first = out.to_host();
        kernels::multi_norm(plan, dtype_of<T>, stats, nullptr);
        test::sync();
        const std::vector<double> second = out.to_host();
        const std::string name =
            std::string(to_string(dtype_of<T>)) + " tensors " + std::to_string(sizes.size());
        CHECK_MESSAGE(first[1] == want.nonfinite, name);
        CHECK_MESSAGE(std::fabs(first[0] - want.sum_sq) <= 1e-12 * want.sum_sq,
                      name << ": " << first[0] << " vs " << want.sum_sq);
        CHECK_MESSAGE(first_difference(first, second) < 0, name << ": not deterministic");
        // accumulate adds to what is there
        kernels::multi_norm(dp, dtype_of<T>, stats, nullptr, /*accumulate=*/true);
        test::sync();
        const std::vector<double> twice = out.to_host();
        CHECK_MESSAGE(std::fabs(twice[0] - 2 * want.sum_sq) <= 1e-12 * want.sum_sq, name);
        CHECK(twice[1] == 2 * want.nonfinite);
    }
}

} // namespace

TEST_CASE("kernels: multi_norm's sum of squares and inf/nan count equal the host's") {
    check_norm<float>();
    check_norm<bf16>();
    check_norm<half>();
    check_norm<double>();
}

namespace {

/// Three steps of O on a shard of `n` elements with P params, optional master,
/// fresh gradients each step, on device and host; compared after every step.
template <class O, class P, class A>
void check_optimizer(const O& opt, std::size_t n, bool master, std::size_t skew) {
    const std::string name = std::string(O::name) + " " + std::string(to_string(dtype_of<P>)) +
                             (master ? " + master" : "") + " n " + std::to_string(n) + " skew " +
                             std::to_string(skew);
    std::vector<A> m_host = random_values<A>(n + skew, 1);
    std::vector<P> p_host(n + skew);
    for (std::size_t i = 0; i < p_host.size(); ++i) {
        p_host[i] = detail::store_as<P>(m_host[i]);
    }
    std::vector<std::vector<A>> state(O::slots);
    for (std::size_t s = 0; s < O::slots; ++s) {
        state[s] = random_values<A>(n + skew, 50 + s, 0.1);
        if (s == 1) { // Adam's second moment is non-negative
            for (A& v : state[s]) {
                v = v * v;
            }
        }
    }
    auto d_p = test::to_device(p_host);
    auto d_m = test::to_device(m_host);
    std::vector<cuda::device_buffer<A>> d_state;
    for (const auto& s : state) {
        d_state.push_back(test::to_device(s));
    }
    for (std::uint64_t step = 1; step <= 3; ++step) {
        const std::vector<P> g = random_values<P>(n + skew, 1000 + step, 2.0);
        auto d_g = test::to_device(g);
        kernels::shard_ref<P, P, A, O::slots> hs, ds;
        hs.param = p_host.data() + skew;
        hs.grad = g.data() + skew;
        hs.master = master ? m_host.data() + skew : nullptr;
        ds.param = d_p.data() + skew;
        ds.grad = d_g.data() + skew;
        ds.master = master ? d_m.data() + skew : nullptr;
        for (std::size_t s = 0; s < O::slots; ++s) {
            hs.state[s] = state[s].data() + skew;
            ds.state[s] = d_state[s].data() + skew;
        }
        hs.count = ds.count = n;
        const auto c = opt.template prepare<A>(step);
        kernels::host::optimizer_step<O>(c, hs, A(0.5));
        kernels::optimizer_step<O>(c, ds, A(0.5), nullptr, nullptr);
        test::sync();
        const std::vector<P> p_dev = d_p.to_host();
        // Parameters and gradients are O(1), the state O(0.1): relative to those
        // operands, a fused multiply-add differs from the host by an ulp or two per
        // operation. A 16-bit parameter may round the other way: one of its ulps.
        const double p_ulps = sizeof(P) == 2 ? 1.0 : 8.0;
        CHECK_MESSAGE(first_far(p_dev, p_host, p_ulps, 1.0) < 0,
                      name << " step " << step << " params");
        for (std::size_t s = 0; s < O::slots; ++s) {
            CHECK_MESSAGE(first_far(d_state[s].to_host(), state[s], 16.0, 1.0) < 0,
                          name << " step " << step << " " << O::slot_names[s]);
        }
        if (master) {
            const std::vector<A> m_dev = d_m.to_host();
            CHECK_MESSAGE(first_far(m_dev, m_host, 8.0, 1.0) < 0,
                          name << " step " << step << " master");
            // The parameter copy-out is the master rounded to P, on the device itself.
            bool copy_out = true;
            for (std::size_t i = skew; i < n + skew && copy_out; ++i) {
                const P want = detail::store_as<P>(m_dev[i]);
                copy_out = std::memcmp(&want, &p_dev[i], sizeof(P)) == 0;
            }
            CHECK_MESSAGE(copy_out, name << " step " << step << ": param != P(master)");
        }
    }
}

} // namespace

TEST_CASE("kernels: fused optimizer steps equal the host steps") {
    optim::sgd sgd;
    sgd.lr = 0.05;
    sgd.momentum = 0.9;
    sgd.weight_decay = 1e-2;
    optim::adam adam;
    adam.lr = 1e-2;
    adam.weight_decay = 1e-2;
    optim::adamw adamw;
    adamw.lr = 1e-2;
    for (std::size_t n : {std::size_t{1}, std::size_t{1031}, std::size_t{(1u << 21) + 3}}) {
        for (std::size_t skew : {std::size_t{0}, std::size_t{1}}) {
            check_optimizer<optim::sgd, float, float>(sgd, n, false, skew);
            check_optimizer<optim::adam, float, float>(adam, n, false, skew);
            check_optimizer<optim::adamw, float, float>(adamw, n, false, skew);
            check_optimizer<optim::adamw, bf16, float>(adamw, n, true, skew);
            check_optimizer<optim::adamw, half, float>(adamw, n, true, skew);
            check_optimizer<optim::adamw, double, double>(adamw, n, false, skew);
        }
    }
}

TEST_CASE("kernels: an optimizer step is skipped on the device when the norm saw inf/nan") {
    const std::size_t n = 4099;
    std::vector<float> p = random_values<float>(n, 3), g = random_values<float>(n, 4);
    std::vector<float> m = random_values<float>(n, 5, 0.1), v = random_values<float>(n, 6, 0.1);
    for (float& x : v) {
        x = x * x;
    }
    g[n / 2] = std::numeric_limits<float>::quiet_NaN();
    auto dp = test::to_device(p), dg = test::to_device(g), dm = test::to_device(m),
         dv = test::to_device(v);
    cuda::device_buffer<double> stats(2, 0);
    auto* s = reinterpret_cast<kernels::norm_stats*>(stats.data());
    const kernels::read_piece piece{dg.data(), n};
    kernels::multi_norm(std::span(&piece, 1), dtype::f32, s, nullptr);
    kernels::shard_ref<float, float, float, 2> ref;
    ref.param = dp.data();
    ref.grad = dg.data();
    ref.state[0] = dm.data();
    ref.state[1] = dv.data();
    ref.count = n;
    optim::adamw opt;
    kernels::optimizer_step<optim::adamw>(opt.prepare<float>(1), ref, 1.0f, s, nullptr);
    test::sync();
    CHECK(stats.to_host()[1] == 1.0);
    CHECK(first_difference(dp.to_host(), p) < 0);
    CHECK(first_difference(dm.to_host(), m) < 0);
    CHECK(first_difference(dv.to_host(), v) < 0);
    // Without the flag the same call writes (the check above can fail).
    g[n / 2] = 0.5f;
    dg.copy_from(g);
    kernels::multi_norm(std::span(&piece, 1), dtype::f32, s, nullptr);
    kernels::optimizer_step<optim::adamw>(opt.prepare<float>(1), ref, 1.0f, s, nullptr);
    test::sync();
    CHECK(stats.to_host()[1] == 0.0);
    CHECK(first_difference(dp.to_host(), p) >= 0);
}
