#pragma once

// What the GPU tests share: random host data, device copies of it, and bitwise
// comparison of device results with the host implementations.

#include <unison/core.hpp>
#include <unison/cuda/device_buffer.hpp>

#include <doctest/doctest.h>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace unison::test {

/// `n` values of T uniformly in [-scale, scale), never all zero.
template <class T>
std::vector<T> random_values(std::size_t n, std::uint64_t seed, double scale = 1.0) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<double> u(-scale, scale);
    std::vector<T> v(n);
    for (T& x : v) {
        double d = u(rng);
        if (d == 0.0) {
            d = scale / 3;
        }
        if constexpr (std::is_same_v<T, half> || std::is_same_v<T, bf16>) {
            x = T(static_cast<float>(d));
        } else {
            x = static_cast<T>(d);
        }
    }
    return v;
}

/// Untyped device bytes filled from a host vector.
template <class T>
cuda::device_buffer<T> to_device(const std::vector<T>& h) {
    return cuda::device_buffer<T>(std::span<const T>(h), 0);
}

/// The index of the first element whose bits differ, or -1.
template <class T>
long first_difference(const std::vector<T>& a, const std::vector<T>& b) {
    if (a.size() != b.size()) {
        return 0;
    }
    for (std::size_t i = 0; i < a.size(); ++i) {
        if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0) {
            return static_cast<long>(i);
        }
    }
    return -1;
}

inline void sync() {
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
}

} // namespace unison::test
