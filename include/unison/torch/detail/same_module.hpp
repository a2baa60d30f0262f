#pragma once

/// \file
/// The check both wrappers run before any of a module's values move: every rank
/// built the same module, parameter by parameter and buffer by buffer, by name,
/// shape, dtype and whether it trains. The engines' own checks compare element
/// counts and dtypes only: a transposed weight or a renamed layer passes them.

#include "unison/comm/communicator.hpp"
#include "unison/core/detail/hash.hpp"
#include "unison/parallel/detail/control.hpp"

#include <c10/util/Exception.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <string>
#include <vector>

namespace unison::torch::detail {

/// Collective: throws the same mismatch_error on every rank, from `operation`
/// ("torch::ddp") and naming the first parameter or buffer that differs, unless
/// every rank's `m` has the same parameters and buffers in the same order. One
/// small all-gather when they agree (through `place`'s device for a communicator
/// that moves device memory only).
template <communicator C>
void verify_same_module(C& comm, const unison::detail::placement& place,
                        const ::torch::nn::Module& m, const char* operation) {
    std::vector<std::uint64_t> hashes;
    std::vector<std::string> labels;
    const auto add = [&](const std::string& kind, const std::string& name, const at::Tensor& t) {
        std::uint64_t h = unison::detail::fnv1a64(kind.data(), kind.size());
        h = unison::detail::fnv1a64(name.data(), name.size(), h);
        const std::int64_t type = static_cast<std::int64_t>(t.scalar_type());
        h = unison::detail::fnv1a64(&type, sizeof type, h);
        for (const std::int64_t d : t.sizes()) {
            h = unison::detail::fnv1a64(&d, sizeof d, h);
        }
        hashes.push_back(h);
        labels.push_back(kind + " '" + name + "' " + c10::str(t.sizes()) + " " +
                         c10::toString(t.scalar_type()));
    };
    for (const auto& item : m.named_parameters(/*recurse=*/true)) {
        add(item.value().requires_grad() ? "parameter" : "frozen parameter", item.key(),
            item.value());
    }
    for (const auto& item : m.named_buffers(/*recurse=*/true)) {
        if (item.value().defined()) {
            add("buffer", item.key(), item.value());
        }
    }
    unison::detail::verify_same_entries(
        comm, place, hashes, [&](std::size_t k) { return labels[k]; },
        {operation, "built", "parameters and buffers", "of different names, shapes or dtypes",
         "every rank must build the same module (names, shapes, dtypes and requires_grad)"});
}

} // namespace unison::torch::detail
