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

/// A named, flat parameter. `value` and `grad` are views: normally of `own_value` and
/// `own_grad`, but bind_value() / bind_grad() can point them at any storage of the
/// right size (a communication library's bucket or gathered shard, say), so forward
/// reads and backward writes there directly and nothing is copied.
///
/// Not copyable or movable: the views may point into the parameter itself, and
/// models hand out parameter pointers, so a parameter stays where it was constructed.
template <class T>
struct parameter {
    std::string name;
    std::vector<T> own_value;
    std::vector<T> own_grad;
    std::span<T> value; ///< views own_value, or the storage given to bind_value()
    std::span<T> grad;  ///< views own_grad, or the storage given to bind_grad()

    parameter(std::string name_, std::size_t size)
        : name(std::move(name_)), own_value(size, T(0)), own_grad(size, T(0)), value(own_value),
          grad(own_grad) {}

    parameter(const parameter&) = delete;
    parameter& operator=(const parameter&) = delete;

    std::size_t size() const { return own_value.size(); }

    /// Makes `value` view `storage` (nothing is copied; empty storage: `own_value`
    /// again). The storage must outlive the binding.
    void bind_value(std::span<T> storage) {
        if (storage.empty()) {
            unbind_value();
            return;
        }
        check_size(storage, "bind_value");
        value = storage;
    }
    /// Makes `value` view `own_value` again.
    void unbind_value() { value = std::span<T>(own_value); }

    /// Makes `grad` view `storage` (whose contents are kept as they are: nothing is
    /// copied either way; empty storage: `own_grad` again). The storage must outlive
    /// the binding.
    void bind_grad(std::span<T> storage) {
        if (storage.empty()) {
            unbind_grad();
            return;
        }
        check_size(storage, "bind_grad");
        grad = storage;
    }

    /// Makes `grad` view `own_grad` again (whose contents are what they were before
    /// binding).
    void unbind_grad() { grad = std::span<T>(own_grad); }

    bool grad_is_bound() const { return grad.data() != own_grad.data(); }

    void zero_grad() { std::fill(grad.begin(), grad.end(), T(0)); }

private:
    void check_size(std::span<T> storage, const char* what) const {
        if (storage.size() != own_value.size()) {
            throw std::invalid_argument("nn::parameter '" + name + "': " + what + " storage has " +
                                        std::to_string(storage.size()) + " elements, expected " +
                                        std::to_string(own_value.size()));
        }
    }
};

} // namespace nn
