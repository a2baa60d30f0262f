// nn: a deterministic random number generator (splitmix64).
//
// Every value is derived from integer arithmetic only, so weights initialised with
// uniform() are bit-identical on every platform and standard library. normal()
// goes through std::log/std::cos/std::sqrt (Box-Muller) and is identical wherever
// the C library's log and cos agree (all mainstream ones for these inputs).
#pragma once

#include <cmath>
#include <cstdint>

namespace nn {

/// splitmix64 (Steele, Lea, Flood 2014): a tiny, fast, well-mixed 64-bit generator.
class splitmix64 {
public:
    explicit splitmix64(std::uint64_t seed) : state_(seed) {}

    std::uint64_t next() {
        std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
        return z ^ (z >> 31);
    }

    /// Uniform in [0, 1), with 53 random bits.
    double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

    /// Uniform in [lo, hi).
    double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }

    /// Standard normal (Box-Muller; one value per call, the second is discarded).
    double normal() {
        const double u1 = 1.0 - uniform(); // (0, 1]: log stays finite
        const double u2 = uniform();
        return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
    }

private:
    std::uint64_t state_;
};

/// An independent seed for sub-stream `stream` of `seed` (one per layer, ...).
inline std::uint64_t derive_seed(std::uint64_t seed, std::uint64_t stream) {
    splitmix64 g(seed ^ (0xd1b54a32d192ed03ULL * (stream + 1)));
    return g.next();
}

} // namespace nn
