#pragma once

// What both README harnesses compare with: the same model trained by one process on
// each whole global batch (AdamW, optionally clipped to a global gradient norm), and
// the relative error of a parameter against it.

#include <nn/nn.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
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

} // namespace readme_test
