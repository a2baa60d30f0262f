#pragma once

// What both README harnesses compare with: the same model trained by one process on
// each whole global batch (AdamW, optionally clipped to a global gradient norm), and
// the relative error of a parameter against it.

#include <unison/thread.hpp>

#include <nn/nn.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace readme_test {

inline const std::vector<std::size_t> widths = {16, 32, 5};
inline constexpr std::size_t batch = 48; // splits over 1, 2, 3 and 4 ranks
inline constexpr int steps = 12;

inline nn::dataset<float> data() {
    return nn::make_classification<float>(2048, widths.front(), widths.back(), 3);
}

/// `steps` steps of single-process AdamW (lr 1e-3) on whole global batches.
inline void train_reference(nn::mlp<float>& model, const nn::dataset<float>& d,
                            double max_grad_norm) {
    nn::adamw<float> optimizer(model.parameters(), 1e-3f);
    for (int step = 0; step < steps; ++step) {
        const std::size_t first = static_cast<std::size_t>(step) * batch % d.size();
        const auto whole = nn::slice(d, first, first + batch);
        model.zero_grad();
        const auto loss = nn::softmax_cross_entropy<float>(model.forward(whole.x), whole.labels,
                                                           1.0f / static_cast<float>(batch));
        model.backward(loss.dlogits);
        if (max_grad_norm > 0.0) { // torch.nn.utils.clip_grad_norm_
            double sq = 0.0;
            for (nn::parameter<float>* p : model.parameters()) {
                for (float g : p->grad) {
                    sq += static_cast<double>(g) * g;
                }
            }
            const double coef = max_grad_norm / (std::sqrt(sq) + 1e-6);
            for (nn::parameter<float>* p : model.parameters()) {
                for (float& g : p->grad) {
                    g = coef < 1.0 ? static_cast<float>(g * coef) : g;
                }
            }
        }
        optimizer.step();
    }
}

/// max |a - b| / max |b|.
inline double relative_error(const std::vector<float>& a, const std::vector<float>& b) {
    double diff = 0.0, scale = 0.0;
    for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) {
        diff = std::max(diff, std::abs(static_cast<double>(a[i]) - b[i]));
        scale = std::max(scale, std::abs(static_cast<double>(b[i])));
    }
    return a.size() != b.size() ? 1.0 : diff / scale;
}

/// Runs `train(comm, model, data, batch, steps)` (the README's function) at 1 to 4
/// thread ranks and checks every rank's trained parameters against the reference.
/// With `ranks_start_apart`, rank r's model starts from seed 7 + r (the loop must
/// make them equal first).
template <class Train>
void check_against_reference(Train train, double max_grad_norm, bool ranks_start_apart) {
    const auto d = data();
    nn::mlp<float> reference(widths, 7);
    train_reference(reference, d, max_grad_norm);
    for (int ranks = 1; ranks <= 4; ++ranks) {
        CAPTURE(ranks);
        unison::thread_world(ranks).run([&](unison::thread_communicator& comm) {
            const auto seed = 7 + (ranks_start_apart ? static_cast<std::uint64_t>(comm.rank()) : 0);
            nn::mlp<float> model(widths, seed);
            train(comm, model, d, batch, steps);
            const auto got = model.parameters();
            const auto want = reference.parameters();
            for (std::size_t p = 0; p < got.size(); ++p) {
                const double err = relative_error(got[p]->own_value, want[p]->own_value);
                CHECK_MESSAGE(err <= 1e-5, "rank " << comm.rank() << " " << got[p]->name
                                                   << " relative error " << err);
            }
        });
    }
}

} // namespace readme_test
