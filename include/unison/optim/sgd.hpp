#pragma once

/// \file
/// SGD with momentum as element math on flat shards (see optimizer.hpp for the shape
/// every optimizer has).

#include "unison/core/config.hpp"
#include "unison/optim/optimizer.hpp"

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace unison::optim {

/// torch.optim.SGD (dampening 0, no Nesterov):
///   g += weight_decay * p;  buf = momentum * buf + g;  p -= lr * buf
/// The buffer starts at zero, so the first step's buffer is g, as in PyTorch.
struct sgd {
    double lr = 1e-2;
    double momentum = 0.0;
    double weight_decay = 0.0;

    static constexpr std::string_view name = "sgd";
    static constexpr std::size_t slots = 1;
    static constexpr std::array<std::string_view, slots> slot_names{"momentum"};

    template <class A>
    struct constants {
        A lr, momentum, weight_decay;
    };
    template <class A>
    constants<A> prepare(std::uint64_t /*step*/) const {
        return {static_cast<A>(lr), static_cast<A>(momentum), static_cast<A>(weight_decay)};
    }
    template <class A>
    UNISON_HOST_DEVICE static void update(const constants<A>& c, A& p, A g, A (&s)[slots]) {
        g = g + c.weight_decay * p;
        if (c.momentum != A(0)) {
            s[0] = c.momentum * s[0] + g;
            p -= c.lr * s[0];
        } else {
            p -= c.lr * g;
        }
    }
};

static_assert(optimizer<sgd>);

} // namespace unison::optim
