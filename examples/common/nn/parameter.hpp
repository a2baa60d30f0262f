// nn: a trainable parameter -- values plus a gradient that can live elsewhere.
#pragma once

#include <algorithm>
#include <cstddef>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace nn {

/// A named, flat parameter. `grad` is where backward accumulates this parameter's
/// gradient: normally a view of `own_grad`, but bind_grad() can point it at any
/// storage of the right size (a communication library's bucket, say), so backward
/// writes there directly and nothing is copied.
///
/// Not copyable or movable: `grad` may view `own_grad`, and models hand out
/// parameter pointers, so a parameter stays where it was constructed.
template <class T>
struct parameter {
    std::string name;
    std::vector<T> value;
    std::vector<T> own_grad;
    std::span<T> grad; ///< views own_grad, or the storage given to bind_grad()

    parameter(std::string name_, std::size_t size)
        : name(std::move(name_)), value(size, T(0)), own_grad(size, T(0)), grad(own_grad) {}

    parameter(const parameter&) = delete;
    parameter& operator=(const parameter&) = delete;

    std::size_t size() const { return value.size(); }

    /// Makes `grad` view `storage` (whose contents are kept as they are: nothing is
    /// copied either way). The storage must outlive the binding.
    void bind_grad(std::span<T> storage) {
        if (storage.size() != value.size()) {
            throw std::invalid_argument("nn::parameter '" + name + "': bind_grad storage has " +
                                        std::to_string(storage.size()) + " elements, expected " +
                                        std::to_string(value.size()));
        }
        grad = storage;
    }

    /// Makes `grad` view `own_grad` again (whose contents are what they were before
    /// binding).
    void unbind_grad() { grad = std::span<T>(own_grad); }

    bool grad_is_bound() const { return grad.data() != own_grad.data(); }

    void zero_grad() { std::fill(grad.begin(), grad.end(), T(0)); }
};

} // namespace nn
