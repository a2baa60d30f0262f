// unison::kernels::host, the host implementations of the fused kernels
// (multi_scale_cast, scale_cast, multi_norm, optimizer_step), against independent
// references written here in double precision: rounding to f32/f16/bf16 from the
// IEEE 754 definition, sums of squares in a plain double loop, and PyTorch's SGD,
// Adam and AdamW formulas. The CUDA kernels share this element math
// (kernels/element.hpp), so these tests pin down what they compute as well.
//
// Tolerances (see check_scale_cast and optimizer_tolerance):
// - scale-and-cast without accumulation is one product and one rounding to the
//   destination: bit-exact where the product is exact in the compute type (scale 1
//   or 0.25, or an f64 destination), otherwise within 1 ulp of the destination
//   (scale 1/3 is rounded to float first, and f64 -> 16 bit rounds through float);
// - with accumulation the sum is rounded in the compute type before the store:
//   1 ulp of the destination plus 4 units of the compute type's roundoff of
//   |dst| + |src * scale| (the classic bound for a cancelling sum);
// - the optimizers compare within 1e-5 (float compute) or 1e-12 (double compute)
//   of a "magnitude" that the reference carries along with every quantity (the
//   same recurrence on absolute values), so that cancellation in momentum buffers
//   and parameters that cross zero do not make a relative test meaningless.

#include <unison/kernels/host.hpp>
#include <unison/optim.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

namespace {

namespace uk = unison::kernels;
namespace optim = unison::optim;
using unison::bf16;
using unison::dtype;
using unison::half;

constexpr double inf = std::numeric_limits<double>::infinity();
constexpr double nan = std::numeric_limits<double>::quiet_NaN();

// ------------------------------------------------------- independent reference

/// Each element type's binary format: precision in bits (with the implicit one),
/// the smallest normal exponent, the largest exponent, and its dtype.
template <class T>
struct format;
template <>
struct format<double> {
    static constexpr int digits = 53, min_exp = -1022;
    [[maybe_unused]] static constexpr int max_exp = 1023; // read only for narrower types
    static constexpr dtype type = dtype::f64;
    static constexpr const char* name = "f64";
};
template <>
struct format<float> {
    static constexpr int digits = 24, min_exp = -126, max_exp = 127;
    static constexpr dtype type = dtype::f32;
    static constexpr const char* name = "f32";
};
template <>
struct format<half> {
    static constexpr int digits = 11, min_exp = -14, max_exp = 15;
    static constexpr dtype type = dtype::f16;
    static constexpr const char* name = "f16";
};
template <>
struct format<bf16> {
    static constexpr int digits = 8, min_exp = -126, max_exp = 127;
    static constexpr dtype type = dtype::bf16;
    static constexpr const char* name = "bf16";
};

template <class T>
constexpr bool is_16bit = std::is_same_v<T, half> || std::is_same_v<T, bf16>;

/// The compute type the kernels document: double when either side is f64, else
/// float (spelled out here rather than taken from the library).
template <class D, class S>
using compute_type =
    std::conditional_t<std::is_same_v<D, double> || std::is_same_v<S, double>, double, float>;

/// The unit roundoff of the compute type A.
template <class A>
constexpr double unit_roundoff = std::is_same_v<A, double> ? 0x1p-53 : 0x1p-24;

/// The value of `v`; the 16-bit types are decoded from their bits by the format's
/// definition, not through unison's conversions.
template <class T>
double value_of(T v) {
    if constexpr (std::is_same_v<T, half>) {
        const int exponent = (v.bits >> 10) & 0x1f;
        const int fraction = v.bits & 0x3ff;
        double x = 0;
        if (exponent == 0x1f) {
            x = fraction == 0 ? inf : nan;
        } else if (exponent == 0) {
            x = std::ldexp(static_cast<double>(fraction), -24);
        } else {
            x = std::ldexp(static_cast<double>(1024 + fraction), exponent - 25);
        }
        return (v.bits & 0x8000u) != 0 ? -x : x;
    } else if constexpr (std::is_same_v<T, bf16>) {
        return static_cast<double>(std::bit_cast<float>(static_cast<std::uint32_t>(v.bits) << 16));
    } else {
        return static_cast<double>(v);
    }
}

/// `x` rounded to nearest-even in T's format (gradual underflow, overflow to
/// infinity), computed in double from the format's definition.
template <class T>
double round_to(double x) {
    if constexpr (std::is_same_v<T, double>) {
        return x;
    } else {
        if (x == 0 || !std::isfinite(x)) {
            return x;
        }
        using F = format<T>;
        const int e = std::max(std::ilogb(x), F::min_exp);
        const double quantum = std::ldexp(1.0, e - (F::digits - 1));
        const double r = std::nearbyint(x / quantum) * quantum; // x / quantum is exact
        const double largest = std::ldexp(2.0 - std::ldexp(1.0, 1 - F::digits), F::max_exp);
        return std::fabs(r) > largest ? std::copysign(inf, x) : r;
    }
}

/// The spacing of T's values at magnitude |x|.
template <class T>
double ulp(double x) {
    using F = format<T>;
    const int e = x == 0 ? F::min_exp : std::max(std::ilogb(x), F::min_exp);
    return std::ldexp(1.0, e - (F::digits - 1));
}

/// The T holding `x`, which must be representable in T (a round_to<T> result).
template <class T>
T from_value(double x) {
    if constexpr (std::is_same_v<T, half>) {
        std::uint32_t bits = std::signbit(x) ? 0x8000u : 0u;
        const double a = std::fabs(x);
        if (std::isnan(x)) {
            bits = 0x7e00u;
        } else if (std::isinf(a)) {
            bits |= 0x7c00u;
        } else if (a != 0) {
            const int e = std::ilogb(a);
            if (e < -14) {
                bits |= static_cast<std::uint32_t>(std::ldexp(a, 24));
            } else {
                bits |= static_cast<std::uint32_t>(e + 15) << 10;
                bits |= static_cast<std::uint32_t>(std::ldexp(a, 10 - e)) - 1024u;
            }
        }
        return half::from_bits(static_cast<std::uint16_t>(bits));
    } else if constexpr (std::is_same_v<T, bf16>) {
        return bf16::from_bits(
            static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(static_cast<float>(x)) >> 16));
    } else {
        return static_cast<T>(x);
    }
}

template <class T>
std::uint64_t bits_of(T v) {
    if constexpr (is_16bit<T>) {
        return v.bits;
    } else if constexpr (std::is_same_v<T, float>) {
        return std::bit_cast<std::uint32_t>(v);
    } else {
        return std::bit_cast<std::uint64_t>(v);
    }
}

// --------------------------------------------------------------- test helpers

/// Counts disagreements in a long loop and keeps the first one for the report, so
/// that millions of comparisons cost one doctest assertion.
struct mismatch_log {
    std::size_t count = 0;
    std::string first;

    void add(const std::string& what) {
        if (count++ == 0) {
            first = what;
        }
    }
};

std::string format_string(const char* fmt, auto... args) {
    char buffer[512];
    std::snprintf(buffer, sizeof buffer, fmt, args...);
    return buffer;
}

/// A random value: mostly |x| in [2^-8, 2^8], 5% in f16's subnormal range
/// [2^-22, 2^-14], 1% exact zeros; random sign.
double draw(std::mt19937_64& rng) {
    std::uniform_real_distribution<double> u(0.0, 1.0);
    const double kind = u(rng);
    if (kind < 0.01) {
        return 0.0;
    }
    const double e = kind < 0.06 ? -22.0 + 8.0 * u(rng) : -8.0 + 16.0 * u(rng);
    const double m = std::exp2(e);
    return u(rng) < 0.5 ? -m : m;
}

/// A random T (the draw rounded to T).
template <class T>
T draw_as(std::mt19937_64& rng) {
    return from_value<T>(round_to<T>(draw(rng)));
}

/// The tensor sizes of a multi-tensor call: odd sizes 1, 3, 7, 1031, 65537 and 500
/// tiny tensors of 0 to 17 elements, in random order.
std::vector<std::size_t> piece_sizes(std::mt19937_64& rng) {
    std::vector<std::size_t> sizes{1, 3, 7, 1031, 65537};
    std::uniform_int_distribution<std::size_t> tiny(0, 17);
    for (int k = 0; k < 500; ++k) {
        sizes.push_back(tiny(rng));
    }
    std::shuffle(sizes.begin(), sizes.end(), rng);
    return sizes;
}

/// Offsets of tensors of `sizes` in one buffer: the first at element 1 (never the
/// allocation's aligned start), then gaps of 0 to 3 elements. Returns the buffer's
/// size, one guard element past the last tensor.
std::size_t lay_out(const std::vector<std::size_t>& sizes, std::vector<std::size_t>& offsets,
                    std::mt19937_64& rng) {
    std::uniform_int_distribution<std::size_t> gap(0, 3);
    offsets.clear();
    std::size_t at = 1;
    for (std::size_t n : sizes) {
        offsets.push_back(at);
        at += n + gap(rng);
    }
    return at + 1;
}

// ---------------------------------------------------------------- scale-cast

/// Checks `n` elements of a scale-and-cast: got[i] against round_D(src[i] * scale
/// [+ before[i]]) computed in double (see the file comment for the tolerances).
template <class D, class S>
void check_scale_cast(const D* got, const D* before, const S* src, std::size_t n, double scale,
                      bool accumulate, mismatch_log& log) {
    using A = compute_type<D, S>;
    // One product and one rounding with an exact product (or the product the
    // reference itself forms in double): the result is determined bit for bit.
    // f64 -> 16 bit rounds through float in the library (double rounding), so
    // that pair is only within 1 ulp.
    const bool exact =
        !accumulate && (std::is_same_v<D, double> || ((scale == 1.0 || scale == 0.25) &&
                                                      !(std::is_same_v<S, double> && is_16bit<D>)));
    for (std::size_t i = 0; i < n; ++i) {
        const double s = value_of(src[i]) * scale;
        const double d0 = accumulate ? value_of(before[i]) : 0.0;
        const double expected = round_to<D>(accumulate ? d0 + s : s);
        const double actual = value_of(got[i]);
        bool ok = false;
        double tol = 0;
        if (exact) {
            ok = bits_of(got[i]) == bits_of(from_value<D>(expected));
        } else {
            tol = ulp<D>(std::max(std::fabs(expected), std::fabs(actual)));
            if (accumulate) {
                tol += 4 * unit_roundoff<A> * (std::fabs(d0) + std::fabs(s));
            }
            ok = std::fabs(actual - expected) <= tol;
        }
        if (!ok) {
            log.add(format_string("element %zu: src %.17g, dst before %.17g: got %.17g, expected "
                                  "%.17g (%s, tolerance %.3g)",
                                  i, value_of(src[i]), value_of(before[i]), actual, expected,
                                  exact ? "bit-exact" : "within", tol));
        }
    }
}

/// multi_scale_cast from S to D over 505 tensors laid out at unaligned offsets in
/// separate source and destination buffers, for every scale and accumulate flag.
template <class D, class S>
void check_multi_scale_cast(std::mt19937_64& rng) {
    const std::vector<std::size_t> sizes = piece_sizes(rng);
    std::vector<std::size_t> src_at, dst_at;
    const std::size_t src_total = lay_out(sizes, src_at, rng);
    const std::size_t dst_total = lay_out(sizes, dst_at, rng);
    std::vector<char> dst_used(dst_total, 0);
    for (std::size_t k = 0; k < sizes.size(); ++k) {
        std::fill_n(dst_used.begin() + static_cast<std::ptrdiff_t>(dst_at[k]), sizes[k], 1);
    }

    for (const double scale : {1.0, 0.25, 1 / 3.0}) {
        for (const bool accumulate : {false, true}) {
            std::vector<S> src(src_total);
            std::vector<D> dst(dst_total);
            for (S& x : src) {
                x = draw_as<S>(rng);
            }
            for (D& x : dst) {
                x = draw_as<D>(rng); // guards outside the tensors keep these values
            }
            const std::vector<D> before = dst;
            std::vector<uk::copy_piece> pieces;
            for (std::size_t k = 0; k < sizes.size(); ++k) {
                pieces.push_back({src.data() + src_at[k], dst.data() + dst_at[k], sizes[k]});
            }

            uk::host::multi_scale_cast(pieces, format<D>::type, format<S>::type, scale, accumulate);

            mismatch_log log;
            for (std::size_t k = 0; k < sizes.size(); ++k) {
                mismatch_log piece_log;
                check_scale_cast(dst.data() + dst_at[k], before.data() + dst_at[k],
                                 src.data() + src_at[k], sizes[k], scale, accumulate, piece_log);
                if (piece_log.count != 0) {
                    log.count += piece_log.count - 1;
                    log.add(format_string("tensor %zu (%zu elements), ", k, sizes[k]) +
                            piece_log.first);
                }
                if constexpr (std::is_same_v<D, S>) {
                    if (scale == 1.0 && !accumulate && sizes[k] != 0 &&
                        std::memcmp(dst.data() + dst_at[k], src.data() + src_at[k],
                                    sizes[k] * sizeof(D)) != 0) {
                        log.add(format_string("tensor %zu: not a bitwise copy", k));
                    }
                }
            }
            std::size_t guards_written = 0;
            for (std::size_t i = 0; i < dst_total; ++i) {
                if (dst_used[i] == 0 && bits_of(dst[i]) != bits_of(before[i])) {
                    ++guards_written;
                }
            }
            CHECK_MESSAGE(log.count == 0, format<D>::name << " <- " << format<S>::name << ", scale "
                                                          << scale << ", accumulate " << accumulate
                                                          << ": " << log.count
                                                          << " mismatches; first: " << log.first);
            CHECK_MESSAGE(guards_written == 0,
                          format<D>::name << " <- " << format<S>::name << ", scale " << scale
                                          << ", accumulate " << accumulate << ": " << guards_written
                                          << " elements outside the tensors written");
        }
    }
}

template <class D>
void check_multi_scale_cast_from_all(std::mt19937_64& rng) {
    check_multi_scale_cast<D, double>(rng);
    check_multi_scale_cast<D, float>(rng);
    check_multi_scale_cast<D, half>(rng);
    check_multi_scale_cast<D, bf16>(rng);
}

/// scale_cast of one tensor of `n` elements from f32 to D, scale 1 / ranks.
template <class D>
void check_average_and_cast(std::mt19937_64& rng) {
    for (const std::size_t n :
         {std::size_t{1}, std::size_t{3}, std::size_t{7}, std::size_t{1031}, std::size_t{65537}}) {
        for (const int ranks : {2, 3, 4, 8}) {
            for (const bool accumulate : {false, true}) {
                const double scale = 1.0 / ranks;
                std::vector<float> src(n + 2);
                std::vector<D> dst(n + 2);
                for (float& x : src) {
                    x = draw_as<float>(rng);
                }
                for (D& x : dst) {
                    x = draw_as<D>(rng);
                }
                const std::vector<D> before = dst;

                uk::host::scale_cast(dst.data() + 1, format<D>::type, src.data() + 1, dtype::f32, n,
                                     scale, accumulate);

                mismatch_log log;
                check_scale_cast(dst.data() + 1, before.data() + 1, src.data() + 1, n, scale,
                                 accumulate, log);
                CHECK_MESSAGE(log.count == 0,
                              format<D>::name << " <- f32, " << n << " elements, ranks " << ranks
                                              << ", accumulate " << accumulate << ": " << log.count
                                              << " mismatches; first: " << log.first);
                CHECK_MESSAGE((bits_of(dst[0]) == bits_of(before[0]) &&
                               bits_of(dst[n + 1]) == bits_of(before[n + 1])),
                              format<D>::name << " <- f32, " << n << " elements, ranks " << ranks
                                              << ": guard element written");
            }
        }
    }
}

// ---------------------------------------------------------------------- norm

/// +inf, -inf, NaN and -NaN in T.
template <class T>
std::vector<T> nonfinite_values() {
    if constexpr (std::is_same_v<T, half>) {
        return {half::from_bits(0x7c00), half::from_bits(0xfc00), half::from_bits(0x7e00),
                half::from_bits(0xfe01)};
    } else if constexpr (std::is_same_v<T, bf16>) {
        return {bf16::from_bits(0x7f80), bf16::from_bits(0xff80), bf16::from_bits(0x7fc0),
                bf16::from_bits(0xffc1)};
    } else {
        return {std::numeric_limits<T>::infinity(), -std::numeric_limits<T>::infinity(),
                std::numeric_limits<T>::quiet_NaN(), -std::numeric_limits<T>::quiet_NaN()};
    }
}

template <class T>
void check_multi_norm(std::mt19937_64& rng) {
    const std::vector<T> specials = nonfinite_values<T>();
    for (const int round : {0, 1, 2}) {
        const std::vector<std::size_t> sizes = piece_sizes(rng);
        std::vector<std::size_t> at;
        const std::size_t total = lay_out(sizes, at, rng);
        // Everything outside the tensors is NaN: a read past a tensor shows in the count.
        std::vector<T> data(total, specials[2]);
        std::vector<uk::read_piece> pieces;
        std::size_t elements = 0;
        for (std::size_t k = 0; k < sizes.size(); ++k) {
            for (std::size_t i = 0; i < sizes[k]; ++i) {
                data[at[k] + i] = draw_as<T>(rng);
            }
            pieces.push_back({data.data() + at[k], sizes[k]});
            elements += sizes[k];
        }
        // Round 0 has no non-finite element; the others about one in 400 and some
        // in the first tiny tensors.
        if (round != 0) {
            std::uniform_int_distribution<std::size_t> pick(0, specials.size() - 1);
            std::bernoulli_distribution hit(1.0 / 400);
            for (std::size_t k = 0; k < sizes.size(); ++k) {
                for (std::size_t i = 0; i < sizes[k]; ++i) {
                    if (hit(rng) || (k < 20 && i == sizes[k] / 2)) {
                        data[at[k] + i] = specials[pick(rng)];
                    }
                }
            }
        }

        double sum_sq = 0;
        double nonfinite = 0;
        for (std::size_t k = 0; k < sizes.size(); ++k) {
            for (std::size_t i = 0; i < sizes[k]; ++i) {
                const double x = value_of(data[at[k] + i]);
                if (std::isfinite(x)) {
                    sum_sq += x * x;
                } else {
                    nonfinite += 1;
                }
            }
        }
        REQUIRE(sum_sq > 0);
        if (round != 0) {
            REQUIRE(nonfinite > 20);
        }

        const uk::norm_stats s = uk::host::multi_norm(pieces, format<T>::type);
        CHECK_MESSAGE(s.nonfinite == nonfinite,
                      format<T>::name << ", " << elements << " elements: non-finite count "
                                      << s.nonfinite << ", expected " << nonfinite);
        CHECK_MESSAGE(std::fabs(s.sum_sq - sum_sq) <= 1e-12 * sum_sq,
                      format<T>::name << ", " << elements << " elements: sum of squares "
                                      << format_string("%.17g", s.sum_sq) << ", expected "
                                      << format_string("%.17g", sum_sq));
    }
}

// ---------------------------------------------------------------- optimizers

/// One parameter of the double-precision reference: the value, the state slots,
/// and for each the same recurrence on absolute values (the scale of the rounding
/// errors a float computation can make in it).
struct reference_element {
    double p = 0, p_mag = 0;
    double s[2] = {0, 0}, s_mag[2] = {0, 0};
};

/// torch.optim.SGD: g += wd * p; buf = momentum * buf + g (buf = g at the first
/// step, which is the same as starting at 0); p -= lr * buf.
void reference_step(const optim::sgd& o, std::uint64_t /*t*/, reference_element& e, double g,
                    double g_mag) {
    g += o.weight_decay * e.p;
    g_mag += o.weight_decay * e.p_mag;
    if (o.momentum != 0) {
        e.s[0] = o.momentum * e.s[0] + g;
        e.s_mag[0] = o.momentum * e.s_mag[0] + g_mag;
        g = e.s[0];
        g_mag = e.s_mag[0];
    }
    e.p -= o.lr * g;
    e.p_mag += o.lr * g_mag;
}

/// torch.optim.Adam (L2: g += wd * p) and AdamW (decoupled: p *= 1 - lr * wd):
/// m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
/// p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps).
void reference_adam(bool decoupled, double lr, double beta1, double beta2, double eps,
                    double weight_decay, std::uint64_t t, reference_element& e, double g,
                    double g_mag) {
    if (decoupled) {
        e.p *= 1 - lr * weight_decay;
        e.p_mag *= std::fabs(1 - lr * weight_decay);
    } else {
        g += weight_decay * e.p;
        g_mag += weight_decay * e.p_mag;
    }
    e.s[0] = beta1 * e.s[0] + (1 - beta1) * g;
    e.s_mag[0] = beta1 * e.s_mag[0] + (1 - beta1) * g_mag;
    e.s[1] = beta2 * e.s[1] + (1 - beta2) * g * g;
    e.s_mag[1] = beta2 * e.s_mag[1] + (1 - beta2) * g_mag * g_mag;
    const double td = static_cast<double>(t);
    const double bias1 = 1 - std::pow(beta1, td);
    const double bias2 = 1 - std::pow(beta2, td);
    const double denom = std::sqrt(e.s[1]) / std::sqrt(bias2) + eps;
    e.p -= lr / bias1 * e.s[0] / denom;
    e.p_mag += lr / bias1 * e.s_mag[0] / denom;
}

void reference_step(const optim::adam& o, std::uint64_t t, reference_element& e, double g,
                    double g_mag) {
    reference_adam(false, o.lr, o.beta1, o.beta2, o.eps, o.weight_decay, t, e, g, g_mag);
}

void reference_step(const optim::adamw& o, std::uint64_t t, reference_element& e, double g,
                    double g_mag) {
    reference_adam(true, o.lr, o.beta1, o.beta2, o.eps, o.weight_decay, t, e, g, g_mag);
}

bool uses_slot(const optim::sgd& o, std::size_t /*slot*/) {
    return o.momentum != 0; // PyTorch keeps no buffer without momentum
}
template <bool Decoupled>
bool uses_slot(const optim::detail::adam_family<Decoupled>&, std::size_t /*slot*/) {
    return true;
}

std::string describe(const optim::sgd& o) {
    return format_string("sgd(lr %g, momentum %g, weight_decay %g)", o.lr, o.momentum,
                         o.weight_decay);
}
template <bool Decoupled>
std::string describe(const optim::detail::adam_family<Decoupled>& o) {
    return format_string("%s(lr %g, betas %g %g, eps %g, weight_decay %g)",
                         Decoupled ? "adamw" : "adam", o.lr, o.beta1, o.beta2, o.eps,
                         o.weight_decay);
}

/// Relative tolerance of an optimizer step computed in A, against the magnitude the
/// reference carries: a few float roundings per step over 5 steps stay far below
/// 1e-5; double's below 1e-12.
template <class A>
constexpr double optimizer_tolerance = std::is_same_v<A, double> ? 1e-12 : 1e-5;

/// Five steps of O over a shard of `n` elements with parameter P, gradient G and
/// compute type A, with float/double master weights or stepping `param` directly.
template <class O, class P, class G, class A>
void check_optimizer(const O& opt, bool with_master, A grad_scale, std::size_t n,
                     std::mt19937_64& rng) {
    constexpr std::size_t slots = O::slots;
    const double rel = optimizer_tolerance<A>;
    const O& reference = opt; // the exact hyperparameters, as PyTorch takes them
    const std::string what =
        describe(opt) + format_string(", param %s, grad %s, compute %s%s, grad_scale %g, %zu "
                                      "elements",
                                      format<P>::name, format<G>::name, format<A>::name,
                                      with_master ? " with master weights" : "",
                                      static_cast<double>(grad_scale), n);
    INFO(what);

    // One guard element before and after every buffer; the shard starts at element 1.
    std::vector<P> param(n + 2, from_value<P>(-4096.0));
    std::vector<G> grad(n + 2, from_value<G>(-4096.0));
    std::vector<A> master(n + 2, A(-4096));
    std::vector<std::vector<A>> state(slots, std::vector<A>(n + 2, A(-4096)));
    std::vector<reference_element> ref(n);
    std::uniform_real_distribution<double> magnitude(0.1, 2.0);
    std::bernoulli_distribution negative(0.5);
    for (std::size_t i = 0; i < n; ++i) {
        const double p0 = negative(rng) ? -magnitude(rng) : magnitude(rng);
        if (with_master) {
            master[i + 1] = static_cast<A>(p0);
            param[i + 1] = from_value<P>(round_to<P>(static_cast<double>(master[i + 1])));
            ref[i].p = static_cast<double>(master[i + 1]);
        } else {
            param[i + 1] = from_value<P>(round_to<P>(p0));
            ref[i].p = value_of(param[i + 1]);
        }
        ref[i].p_mag = std::fabs(ref[i].p);
        for (std::size_t j = 0; j < slots; ++j) {
            state[j][i + 1] = A(0);
        }
    }
    const std::vector<P> param_guards{param.front(), param.back()};

    uk::shard_ref<P, G, A, slots> s;
    s.param = param.data() + 1;
    s.grad = grad.data() + 1;
    s.master = with_master ? master.data() + 1 : nullptr;
    for (std::size_t j = 0; j < slots; ++j) {
        s.state[j] = state[j].data() + 1;
    }
    s.count = n;

    std::uniform_real_distribution<double> grad_exponent(-6.0, 0.0);
    for (std::uint64_t t = 1; t <= 5; ++t) {
        for (std::size_t i = 0; i < n; ++i) {
            const double g = std::exp2(grad_exponent(rng));
            grad[i + 1] = from_value<G>(round_to<G>(negative(rng) ? -g : g));
        }
        const auto c = opt.template prepare<A>(t);

        uk::host::optimizer_step<O>(c, s, grad_scale);

        mismatch_log p_log, state_log, param_log;
        for (std::size_t i = 0; i < n; ++i) {
            reference_element& e = ref[i];
            const double g = value_of(grad[i + 1]) * static_cast<double>(grad_scale);
            reference_step(reference, t, e, g, std::fabs(g));

            const double p =
                with_master ? static_cast<double>(master[i + 1]) : value_of(param[i + 1]);
            if (!(std::fabs(p - e.p) <= rel * e.p_mag)) {
                p_log.add(format_string("element %zu: %s %.17g, expected %.17g (magnitude %.3g)", i,
                                        with_master ? "master" : "param", p, e.p, e.p_mag));
            }
            for (std::size_t j = 0; j < slots; ++j) {
                const double v = static_cast<double>(state[j][i + 1]);
                if (uses_slot(opt, j) && !(std::fabs(v - e.s[j]) <= rel * e.s_mag[j])) {
                    state_log.add(format_string("element %zu: %s %.17g, expected %.17g "
                                                "(magnitude %.3g)",
                                                i, std::string(O::slot_names[j]).c_str(), v, e.s[j],
                                                e.s_mag[j]));
                }
            }
            if (with_master) {
                // The parameter is the master weight rounded once to P.
                const P want = from_value<P>(round_to<P>(static_cast<double>(master[i + 1])));
                if (bits_of(param[i + 1]) != bits_of(want)) {
                    param_log.add(format_string("element %zu: param %.17g, master %.17g", i,
                                                value_of(param[i + 1]),
                                                static_cast<double>(master[i + 1])));
                }
            }
        }
        CHECK_MESSAGE(p_log.count == 0, "step " << t << ": " << p_log.count
                                                << " parameters off; first: " << p_log.first);
        CHECK_MESSAGE(state_log.count == 0, "step "
                                                << t << ": " << state_log.count
                                                << " state values off; first: " << state_log.first);
        CHECK_MESSAGE(param_log.count == 0,
                      "step " << t << ": " << param_log.count
                              << " parameters are not P(master); first: " << param_log.first);
        bool guards_intact = bits_of(param.front()) == bits_of(param_guards[0]) &&
                             bits_of(param.back()) == bits_of(param_guards[1]) &&
                             master.front() == A(-4096) && master.back() == A(-4096);
        for (std::size_t j = 0; j < slots; ++j) {
            guards_intact =
                guards_intact && state[j].front() == A(-4096) && state[j].back() == A(-4096);
        }
        CHECK_MESSAGE(guards_intact, "step " << t << ": an element outside the shard changed");
    }
}

/// Every shard type for optimizer `opt`, grad_scale 1 and 0.5, odd sizes.
template <class O>
void check_optimizer_all_types(const O& opt, std::mt19937_64& rng) {
    for (const std::size_t n :
         {std::size_t{1}, std::size_t{3}, std::size_t{1031}, std::size_t{65537}}) {
        for (const double grad_scale : {1.0, 0.5}) {
            const auto fs = static_cast<float>(grad_scale);
            check_optimizer<O, float, float, float>(opt, false, fs, n, rng);
            check_optimizer<O, bf16, bf16, float>(opt, true, fs, n, rng);
            check_optimizer<O, half, float, float>(opt, true, fs, n, rng);
            check_optimizer<O, double, double, double>(opt, false, grad_scale, n, rng);
            check_optimizer<O, float, bf16, double>(opt, true, grad_scale, n, rng);
        }
    }
}

} // namespace

TEST_CASE("kernels host: the test's own format reference agrees with IEEE 754") {
    // Every finite f16 and bf16 pattern decodes and re-encodes to itself and is
    // representable (round_to leaves it alone): the reference the tests below use.
    std::size_t bad = 0;
    for (std::uint32_t b = 0; b < 0x10000u; ++b) {
        const half h = half::from_bits(static_cast<std::uint16_t>(b));
        const bf16 f = bf16::from_bits(static_cast<std::uint16_t>(b));
        if (std::isfinite(value_of(h)) &&
            (round_to<half>(value_of(h)) != value_of(h) || from_value<half>(value_of(h)) != h)) {
            ++bad;
        }
        if (std::isfinite(value_of(f)) &&
            (round_to<bf16>(value_of(f)) != value_of(f) || from_value<bf16>(value_of(f)) != f)) {
            ++bad;
        }
    }
    CHECK(bad == 0);
    // Hand-checked points: ties to even, f16 subnormals, overflow to infinity.
    CHECK(round_to<half>(1.0 + 0x1p-11) == 1.0);
    CHECK(round_to<half>(1.0 + 3 * 0x1p-11) == 1.0 + 0x1p-9);
    CHECK(round_to<half>(0x1p-25) == 0.0);
    CHECK(round_to<half>(0x1.8p-25) == 0x1p-24);
    CHECK(round_to<half>(65519.0) == 65504.0);
    CHECK(round_to<half>(65520.0) == inf);
    CHECK(round_to<bf16>(1.0 + 0x1p-8) == 1.0);
    CHECK(round_to<bf16>(1.0 + 3 * 0x1p-8) == 1.0 + 0x1p-6);
    CHECK(round_to<float>(1.0 + 0x1p-24) == 1.0);
    CHECK(round_to<float>(0x1p-150) == 0.0);
    CHECK(round_to<float>(0x1.8p-150) == 0x1p-149);
    CHECK(ulp<half>(1.0) == 0x1p-10);
    CHECK(ulp<half>(0x1p-20) == 0x1p-24);
    CHECK(ulp<bf16>(3.0) == 0x1p-6);
    CHECK(ulp<float>(1.0) == 0x1p-23);
}

TEST_CASE("kernels host: multi_scale_cast between f64, f32, f16 and bf16") {
    std::mt19937_64 rng(0x6b65726e656c73u);
    SUBCASE("to f64") {
        check_multi_scale_cast_from_all<double>(rng);
    }
    SUBCASE("to f32") {
        check_multi_scale_cast_from_all<float>(rng);
    }
    SUBCASE("to f16") {
        check_multi_scale_cast_from_all<half>(rng);
    }
    SUBCASE("to bf16") {
        check_multi_scale_cast_from_all<bf16>(rng);
    }
}

TEST_CASE("kernels host: multi_scale_cast rounds 16-bit results once, to nearest even") {
    // Values chosen so that the float product is exact and lands on a tie or just
    // off it: rounding twice (or truncating) gives a different answer.
    const std::vector<float> src{1.0f + 0x1p-11f,            // f16 tie, rounds down to even
                                 1.0f + 3 * 0x1p-11f,        // f16 tie, rounds up to even
                                 1.0f + 0x1p-11f + 0x1p-20f, // above the tie: up
                                 1.0f + 0x1p-8f,             // bf16 tie: down
                                 1.0f + 3 * 0x1p-8f,         // bf16 tie: up
                                 -(1.0f + 0x1p-8f + 0x1p-20f)};
    std::vector<half> h(src.size());
    std::vector<bf16> b(src.size());
    const uk::copy_piece to_half{src.data(), h.data(), src.size()};
    const uk::copy_piece to_bf16{src.data(), b.data(), src.size()};
    uk::host::multi_scale_cast(std::span(&to_half, 1), dtype::f16, dtype::f32);
    uk::host::multi_scale_cast(std::span(&to_bf16, 1), dtype::bf16, dtype::f32);
    for (std::size_t i = 0; i < src.size(); ++i) {
        CAPTURE(i);
        CHECK(value_of(h[i]) == round_to<half>(src[i]));
        CHECK(value_of(b[i]) == round_to<bf16>(src[i]));
    }
    CHECK(value_of(h[0]) == 1.0);
    CHECK(value_of(h[1]) == 1.0 + 0x1p-9);
    CHECK(value_of(h[2]) == 1.0 + 0x1p-10);
    CHECK(value_of(b[3]) == 1.0);
    CHECK(value_of(b[4]) == 1.0 + 0x1p-6);
    CHECK(value_of(b[5]) == -(1.0 + 0x1p-7));
}

TEST_CASE("kernels host: scale_cast averages and casts f32 to bf16, f16 and f32") {
    std::mt19937_64 rng(0x61766572616765u);
    check_average_and_cast<bf16>(rng);
    check_average_and_cast<half>(rng);
    check_average_and_cast<float>(rng);

    SUBCASE("in place, f32") {
        for (const int ranks : {2, 3, 4, 8}) {
            std::vector<float> x(65537 + 1);
            for (float& v : x) {
                v = draw_as<float>(rng);
            }
            const std::vector<float> before = x;
            uk::host::scale_cast(x.data() + 1, dtype::f32, x.data() + 1, dtype::f32, x.size() - 1,
                                 1.0 / ranks);
            mismatch_log log;
            check_scale_cast(x.data() + 1, before.data() + 1, before.data() + 1, x.size() - 1,
                             1.0 / ranks, false, log);
            CHECK_MESSAGE(log.count == 0, "ranks " << ranks << ": " << log.count
                                                   << " mismatches; first: " << log.first);
            CHECK(bits_of(x[0]) == bits_of(before[0]));
        }
    }
}

TEST_CASE("kernels host: multi_norm sums squares in double and counts non-finite elements") {
    std::mt19937_64 rng(0x6e6f726du);
    check_multi_norm<float>(rng);
    check_multi_norm<bf16>(rng);
    check_multi_norm<half>(rng);
    check_multi_norm<double>(rng);

    SUBCASE("values whose squares overflow float") {
        // f32 values near its largest: their squares only fit in double.
        const std::vector<float> x{3e38f, -2e38f, 1e-30f, std::numeric_limits<float>::infinity()};
        const uk::read_piece piece{x.data(), x.size()};
        const uk::norm_stats s = uk::host::multi_norm(std::span(&piece, 1), dtype::f32);
        const double a = static_cast<double>(3e38f), b = static_cast<double>(-2e38f),
                     c = static_cast<double>(1e-30f);
        CHECK(s.sum_sq == doctest::Approx(a * a + b * b + c * c).epsilon(1e-15));
        CHECK(s.nonfinite == 1);
    }
}

TEST_CASE("kernels host: optimizer_step matches PyTorch's SGD") {
    std::mt19937_64 rng(0x736764u);
    for (const double momentum : {0.0, 0.9}) {
        for (const double weight_decay : {0.0, 1e-2}) {
            check_optimizer_all_types(
                optim::sgd{.lr = 1e-2, .momentum = momentum, .weight_decay = weight_decay}, rng);
        }
    }
}

TEST_CASE("kernels host: optimizer_step matches PyTorch's Adam") {
    std::mt19937_64 rng(0x6164616du);
    for (const double weight_decay : {0.0, 1e-2}) {
        optim::adam o;
        o.weight_decay = weight_decay;
        check_optimizer_all_types(o, rng);
    }
    // Non-default betas and an eps large enough to matter.
    optim::adam o;
    o.lr = 1e-2;
    o.beta1 = 0.8;
    o.beta2 = 0.95;
    o.eps = 1e-3;
    o.weight_decay = 1e-2;
    check_optimizer_all_types(o, rng);
}

TEST_CASE("kernels host: optimizer_step matches PyTorch's AdamW") {
    std::mt19937_64 rng(0x6164616d77u);
    optim::adamw o;
    o.weight_decay = 1e-2;
    check_optimizer_all_types(o, rng);
    o.lr = 1e-2;
    o.beta1 = 0.8;
    o.beta2 = 0.95;
    o.eps = 1e-3;
    o.weight_decay = 0.1;
    check_optimizer_all_types(o, rng);
}

TEST_CASE("kernels host: zero-length shards and pieces write nothing") {
    std::vector<float> f(8, -4096.0f);
    std::vector<bf16> b(8, from_value<bf16>(-4096.0));
    const std::vector<float> f_before = f;
    const std::vector<bf16> b_before = b;
    const auto unchanged = [&] {
        return std::memcmp(f.data(), f_before.data(), f.size() * sizeof(float)) == 0 &&
               std::memcmp(b.data(), b_before.data(), b.size() * sizeof(bf16)) == 0;
    };

    SUBCASE("multi_scale_cast and scale_cast") {
        const std::vector<uk::copy_piece> pieces{{f.data() + 1, b.data() + 1, 0},
                                                 {nullptr, nullptr, 0},
                                                 {f.data() + 3, b.data() + 3, 0}};
        for (const bool accumulate : {false, true}) {
            uk::host::multi_scale_cast(pieces, dtype::bf16, dtype::f32, 0.5, accumulate);
            uk::host::multi_scale_cast({}, dtype::bf16, dtype::f32, 0.5, accumulate);
            uk::host::scale_cast(b.data() + 1, dtype::bf16, f.data() + 1, dtype::f32, 0, 0.5,
                                 accumulate);
            uk::host::scale_cast(f.data() + 1, dtype::f32, f.data() + 2, dtype::f32, 0, 1.0,
                                 accumulate);
            uk::host::scale_cast(nullptr, dtype::f32, nullptr, dtype::f32, 0, 1.0, accumulate);
        }
        CHECK(unchanged());
    }

    SUBCASE("multi_norm") {
        const std::vector<float> nans(4, std::numeric_limits<float>::quiet_NaN());
        const std::vector<uk::read_piece> pieces{{nans.data(), 0}, {nullptr, 0}};
        const uk::norm_stats s = uk::host::multi_norm(pieces, dtype::f32);
        CHECK(s.sum_sq == 0);
        CHECK(s.nonfinite == 0);
        const uk::norm_stats none = uk::host::multi_norm({}, dtype::bf16);
        CHECK(none.sum_sq == 0);
        CHECK(none.nonfinite == 0);
    }

    SUBCASE("optimizer_step") {
        std::vector<float> master(8, -4096.0f), m(8, -4096.0f), v(8, -4096.0f);
        uk::shard_ref<bf16, float, float, 2> s;
        s.param = b.data() + 1;
        s.grad = f.data() + 1;
        s.master = master.data() + 1;
        s.state[0] = m.data() + 1;
        s.state[1] = v.data() + 1;
        s.count = 0;
        optim::adamw adamw;
        uk::host::optimizer_step<optim::adamw>(adamw.prepare<float>(1), s, 1.0f);
        optim::sgd sgd{.lr = 0.1, .momentum = 0.9, .weight_decay = 0.1};
        uk::shard_ref<float, float, float, 1> t;
        t.param = f.data() + 1;
        t.grad = f.data() + 2;
        t.state[0] = m.data() + 1;
        uk::host::optimizer_step<optim::sgd>(sgd.prepare<float>(1), t, 0.5f);
        uk::shard_ref<double, double, double, 1> null_shard; // every pointer null
        uk::host::optimizer_step<optim::sgd>(sgd.prepare<double>(1), null_shard, 1.0);
        CHECK(unchanged());
        CHECK(std::all_of(master.begin(), master.end(), [](float x) { return x == -4096.0f; }));
        CHECK(std::all_of(m.begin(), m.end(), [](float x) { return x == -4096.0f; }));
        CHECK(std::all_of(v.begin(), v.end(), [](float x) { return x == -4096.0f; }));
    }
}
