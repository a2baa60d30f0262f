// nn: a synthetic, deterministic classification data set.
#pragma once

#include "matrix.hpp"
#include "random.hpp"

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace nn {

/// x [n x features] with one integer label in [0, classes) per row.
template <class T>
struct dataset {
    matrix<T> x;
    std::vector<int> labels;

    std::size_t size() const { return labels.size(); }
};

/// n_samples points around n_classes centres: each centre coordinate is
/// uniform(-1, 1) and each sample is its centre plus standard normal noise per
/// feature. Sample i has label i % n_classes (exactly balanced, and so is any
/// contiguous slice of n_classes rows). The same arguments give the same data set.
template <class T>
dataset<T> make_classification(std::size_t n_samples, std::size_t n_features, std::size_t n_classes,
                               std::uint64_t seed) {
    if (n_features == 0 || n_classes == 0) {
        throw std::invalid_argument("nn::make_classification: zero features or classes");
    }
    splitmix64 centre_gen(derive_seed(seed, 0));
    std::vector<double> centres(n_classes * n_features);
    for (double& c : centres)
        c = centre_gen.uniform(-1.0, 1.0);

    splitmix64 noise_gen(derive_seed(seed, 1));
    dataset<T> d{matrix<T>::zeros(n_samples, n_features), std::vector<int>(n_samples)};
    for (std::size_t i = 0; i < n_samples; ++i) {
        const std::size_t label = i % n_classes;
        d.labels[i] = static_cast<int>(label);
        for (std::size_t f = 0; f < n_features; ++f) {
            d.x(i, f) = static_cast<T>(centres[label * n_features + f] + noise_gen.normal());
        }
    }
    return d;
}

/// Rows [begin, end) of d, copied.
template <class T>
dataset<T> slice(const dataset<T>& d, std::size_t begin, std::size_t end) {
    if (begin > end || end > d.size()) {
        throw std::out_of_range("nn::slice: rows [" + std::to_string(begin) + ", " +
                                std::to_string(end) + ") of " + std::to_string(d.size()));
    }
    const std::size_t cols = d.x.cols;
    dataset<T> out{matrix<T>{end - begin, cols, {}}, {}};
    out.x.data.assign(d.x.data.begin() + static_cast<std::ptrdiff_t>(begin * cols),
                      d.x.data.begin() + static_cast<std::ptrdiff_t>(end * cols));
    out.labels.assign(d.labels.begin() + static_cast<std::ptrdiff_t>(begin),
                      d.labels.begin() + static_cast<std::ptrdiff_t>(end));
    return out;
}

} // namespace nn
