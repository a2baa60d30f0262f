// nn: a row-major dense matrix, the only tensor type of the framework.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

namespace nn {

/// rows x cols values, row-major: element (r, c) is data[r * cols + c].
template <class T>
struct matrix {
    std::size_t rows = 0, cols = 0;
    std::vector<T> data;

    T& operator()(std::size_t r, std::size_t c) { return data[r * cols + c]; }
    const T& operator()(std::size_t r, std::size_t c) const { return data[r * cols + c]; }

    std::span<T> row(std::size_t r) { return std::span<T>(data).subspan(r * cols, cols); }
    std::span<const T> row(std::size_t r) const {
        return std::span<const T>(data).subspan(r * cols, cols);
    }

    static matrix zeros(std::size_t rows, std::size_t cols) {
        return matrix{rows, cols, std::vector<T>(rows * cols, T(0))};
    }
};

} // namespace nn
