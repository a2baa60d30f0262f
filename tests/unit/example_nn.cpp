// The examples' stand-in framework (examples/common/nn), checked in double
// precision: gradients against finite differences, hook order, accumulation,
// gradients bound to external storage, and the optimizers against their formulas.

#include "nn/nn.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

struct batch {
    nn::matrix<double> x;
    std::vector<int> labels;
};

batch random_batch(std::size_t rows, std::size_t features, std::size_t classes,
                   std::uint64_t seed) {
    nn::splitmix64 g(seed);
    batch b{nn::matrix<double>::zeros(rows, features), std::vector<int>(rows)};
    for (double& v : b.x.data)
        v = g.normal();
    for (std::size_t r = 0; r < rows; ++r) {
        b.labels[r] = static_cast<int>(g.next() % classes);
    }
    return b;
}

double loss_of(nn::mlp<double>& model, const batch& b) {
    const auto logits = model.forward(b.x);
    return nn::softmax_cross_entropy<double>(logits, b.labels, 1.0 / double(b.x.rows)).loss;
}

void forward_backward(nn::mlp<double>& model, const batch& b) {
    const auto logits = model.forward(b.x);
    const auto l = nn::softmax_cross_entropy<double>(logits, b.labels, 1.0 / double(b.x.rows));
    model.backward(l.dlogits);
}

std::vector<std::vector<double>> grads_of(nn::mlp<double>& model) {
    std::vector<std::vector<double>> out;
    for (auto* p : model.parameters())
        out.emplace_back(p->grad.begin(), p->grad.end());
    return out;
}

} // namespace

TEST_CASE("nn: mlp gradients match central finite differences") {
    nn::mlp<double> model({5, 7, 6, 3}, 11, /*with_unused_head=*/true);
    const batch b = random_batch(4, 5, 3, 99);
    forward_backward(model, b);

    // h = 1e-5: truncation error ~h^2 and rounding error ~1e-16/h are both far below
    // the bound (with h = 1e-6 rounding alone reaches 2e-7 on small gradients)
    const double h = 1e-5;
    double worst = 0;
    std::size_t checked = 0;
    for (auto* p : model.parameters()) {
        for (std::size_t j = 0; j < p->size(); ++j) {
            const double saved = p->value[j];
            p->value[j] = saved + h;
            const double up = loss_of(model, b);
            p->value[j] = saved - h;
            const double down = loss_of(model, b);
            p->value[j] = saved;
            const double numeric = (up - down) / (2 * h);
            const double analytic = p->grad[j];
            // relative, but not below an absolute floor for (near-)zero gradients
            const double err = std::abs(analytic - numeric) /
                               std::max({std::abs(analytic), std::abs(numeric), 1e-3});
            worst = std::max(worst, err);
            INFO(p->name << "[" << j << "]: analytic " << analytic << ", numeric " << numeric);
            CHECK(err < 1e-6);
            ++checked;
        }
    }
    CHECK(checked == model.parameter_count());
    MESSAGE("worst relative error " << worst << " over " << checked << " entries");

    // the unused head never receives a gradient
    for (auto* p : model.parameters()) {
        if (p->name.starts_with("unused_head")) {
            CHECK(std::all_of(p->grad.begin(), p->grad.end(), [](double g) { return g == 0; }));
        }
    }
}

TEST_CASE("nn: parameters are named in registration order") {
    nn::mlp<double> model({4, 8, 2}, 1, true);
    std::vector<std::string> names;
    for (auto* p : model.parameters())
        names.push_back(p->name);
    CHECK(names == std::vector<std::string>{"layers.0.weight", "layers.0.bias", "layers.1.weight",
                                            "layers.1.bias", "unused_head.weight",
                                            "unused_head.bias"});
    CHECK(model.parameter_count() == 4 * 8 + 8 + 8 * 2 + 2 + 2 * 2 + 2);
}

TEST_CASE("nn: grad hooks fire once per used parameter, in reverse order, after accumulation") {
    nn::mlp<double> model({5, 7, 6, 3}, 3, /*with_unused_head=*/true);
    const batch b = random_batch(6, 5, 3, 4);

    std::vector<std::string> order;
    std::vector<std::vector<double>> seen;
    model.on_grad_ready = [&](nn::parameter<double>& p) {
        order.push_back(p.name);
        seen.emplace_back(p.grad.begin(), p.grad.end());
    };
    forward_backward(model, b);

    std::vector<std::string> expected;
    auto params = model.parameters();
    for (auto it = params.rbegin(); it != params.rend(); ++it) {
        if (!(*it)->name.starts_with("unused_head"))
            expected.push_back((*it)->name);
    }
    CHECK(expected.front() == "layers.2.bias");
    CHECK(order == expected);

    // at hook time each gradient is already final for this pass
    const auto final_grads = grads_of(model);
    for (std::size_t k = 0; k < order.size(); ++k) {
        const std::size_t idx = params.size() - 3 - k; // skip the unused head's two
        CHECK(params[idx]->name == order[k]);
        CHECK(seen[k] == final_grads[idx]);
    }

    // a second pass fires them all again, once each
    order.clear();
    forward_backward(model, b);
    CHECK(order == expected);
}

TEST_CASE("nn: gradients accumulate across backward passes until zero_grad") {
    nn::mlp<double> model({5, 7, 3}, 8);
    const batch b = random_batch(5, 5, 3, 6);

    forward_backward(model, b);
    const auto once = grads_of(model);
    forward_backward(model, b);
    const auto twice = grads_of(model);
    for (std::size_t k = 0; k < once.size(); ++k) {
        for (std::size_t j = 0; j < once[k].size(); ++j)
            CHECK(twice[k][j] == 2 * once[k][j]);
    }

    model.zero_grad();
    for (const auto& g : grads_of(model)) {
        CHECK(std::all_of(g.begin(), g.end(), [](double v) { return v == 0; }));
    }
    forward_backward(model, b);
    CHECK(grads_of(model) == once);
}

TEST_CASE("nn: bind_grad makes backward write into external storage") {
    nn::mlp<double> reference({5, 7, 3}, 21);
    nn::mlp<double> model({5, 7, 3}, 21);
    const batch b = random_batch(4, 5, 3, 2);
    forward_backward(reference, b);
    const auto want = grads_of(reference);

    // one flat buffer holding every gradient, as a communication library might own
    auto params = model.parameters();
    std::vector<double> flat(model.parameter_count(), 0.0);
    std::size_t offset = 0;
    for (auto* p : params) {
        p->bind_grad(std::span<double>(flat).subspan(offset, p->size()));
        CHECK(p->grad_is_bound());
        CHECK(p->grad.data() == flat.data() + offset);
        offset += p->size();
    }
    forward_backward(model, b);

    offset = 0;
    for (std::size_t k = 0; k < params.size(); ++k) {
        for (std::size_t j = 0; j < params[k]->size(); ++j)
            CHECK(flat[offset + j] == want[k][j]);
        // own storage untouched
        CHECK(std::all_of(params[k]->own_grad.begin(), params[k]->own_grad.end(),
                          [](double v) { return v == 0; }));
        offset += params[k]->size();
    }

    model.zero_grad(); // clears the bound storage
    CHECK(std::all_of(flat.begin(), flat.end(), [](double v) { return v == 0; }));

    for (auto* p : params) {
        p->unbind_grad();
        CHECK(!p->grad_is_bound());
        CHECK(p->grad.data() == p->own_grad.data());
    }
    forward_backward(model, b);
    CHECK(grads_of(model) == want);
    CHECK(std::all_of(flat.begin(), flat.end(), [](double v) { return v == 0; }));

    std::vector<double> wrong(3);
    try {
        params[0]->bind_grad(wrong);
        FAIL("bind_grad accepted storage of the wrong size");
    } catch (const std::invalid_argument& e) {
        CHECK(std::string(e.what()).find("layers.0.weight") != std::string::npos);
    }
    CHECK(!params[0]->grad_is_bound());
}

TEST_CASE("nn: sgd with momentum and weight decay follows the formula") {
    const double lr = 0.1, momentum = 0.9, wd = 0.01;
    nn::parameter<double> p("p", 3);
    p.own_value = {0.5, -1.25, 2.0};
    std::vector<double> value = p.own_value, buf(3, 0.0);

    nn::sgd<double> opt({&p}, lr, momentum, wd);
    const std::vector<std::vector<double>> grads = {{0.3, -0.7, 1.1}, {-0.2, 0.4, 0.05}};
    for (const auto& g : grads) {
        std::copy(g.begin(), g.end(), p.grad.begin());
        opt.step();
        for (std::size_t j = 0; j < 3; ++j) {
            const double d = g[j] + wd * value[j];
            buf[j] = momentum * buf[j] + d;
            value[j] = value[j] - lr * buf[j];
            CHECK(p.value[j] == doctest::Approx(value[j]).epsilon(1e-14));
        }
    }
    // the gradient itself is left alone
    CHECK(std::equal(p.grad.begin(), p.grad.end(), grads.back().begin()));

    // plain SGD
    nn::parameter<double> q("q", 1);
    q.own_value = {1.0};
    q.grad[0] = 2.0;
    nn::sgd<double> plain({&q}, 0.25);
    plain.step();
    CHECK(q.value[0] == 0.5);
}

TEST_CASE("nn: adamw follows the formula over two steps") {
    const double lr = 0.01, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.1;
    nn::parameter<double> p("p", 4);
    p.own_value = {0.5, -1.25, 2.0, 0.0};
    std::vector<double> value = p.own_value, m(4, 0.0), v(4, 0.0);

    nn::adamw<double> opt({&p}, lr, b1, b2, eps, wd);
    const std::vector<std::vector<double>> grads = {{0.3, -0.7, 1.1, 0.0}, {-0.2, 0.4, 0.05, 1e-3}};
    int t = 0;
    for (const auto& g : grads) {
        ++t;
        std::copy(g.begin(), g.end(), p.grad.begin());
        opt.step();
        for (std::size_t j = 0; j < 4; ++j) {
            value[j] *= 1 - lr * wd;
            m[j] = b1 * m[j] + (1 - b1) * g[j];
            v[j] = b2 * v[j] + (1 - b2) * g[j] * g[j];
            const double mhat = m[j] / (1 - std::pow(b1, t));
            const double vhat = v[j] / (1 - std::pow(b2, t));
            value[j] -= lr * mhat / (std::sqrt(vhat) + eps);
            CHECK(p.value[j] == doctest::Approx(value[j]).epsilon(1e-12));
        }
    }
    CHECK(opt.steps() == 2);
}

TEST_CASE("nn: softmax cross-entropy is stable and scaled") {
    nn::matrix<double> logits{2, 3, {1000.0, 1000.0, 1000.0, -5.0, 0.0, 5.0}};
    const std::vector<int> labels = {1, 2};
    const auto sum = nn::softmax_cross_entropy<double>(logits, labels, 1.0);
    const auto mean = nn::softmax_cross_entropy<double>(logits, labels, 0.5);
    const double want = std::log(3.0) + std::log(std::exp(-10.0) + std::exp(-5.0) + 1.0);
    CHECK(sum.loss == doctest::Approx(want).epsilon(1e-14));
    CHECK(mean.loss == doctest::Approx(want / 2).epsilon(1e-14));
    CHECK(sum.dlogits(0, 0) == doctest::Approx(1.0 / 3));
    CHECK(sum.dlogits(0, 1) == doctest::Approx(1.0 / 3 - 1));
    CHECK(mean.dlogits(1, 2) ==
          doctest::Approx(0.5 * (1 / (std::exp(-10.0) + std::exp(-5.0) + 1) - 1)));
    const std::vector<int> bad = {0, 3};
    CHECK_THROWS_AS(nn::softmax_cross_entropy<double>(logits, bad, 1.0), std::invalid_argument);
}

TEST_CASE("nn: data and initialisation are deterministic") {
    const auto a = nn::make_classification<double>(50, 6, 4, 7);
    const auto b = nn::make_classification<double>(50, 6, 4, 7);
    const auto c = nn::make_classification<double>(50, 6, 4, 8);
    CHECK(a.x.data == b.x.data);
    CHECK(a.labels == b.labels);
    CHECK(a.x.data != c.x.data);
    for (std::size_t i = 0; i < a.size(); ++i)
        CHECK(a.labels[i] == int(i % 4));

    const auto s = nn::slice(a, 10, 25);
    CHECK(s.size() == 15);
    CHECK(s.x.rows == 15);
    CHECK(s.x.cols == 6);
    CHECK(s.x(0, 0) == a.x(10, 0));
    CHECK(s.x(14, 5) == a.x(24, 5));
    CHECK(s.labels.front() == a.labels[10]);
    CHECK_THROWS_AS(nn::slice(a, 40, 51), std::out_of_range);

    nn::mlp<double> m1({6, 5, 4}, 42), m2({6, 5, 4}, 42), m3({6, 5, 4}, 43);
    CHECK(m1.parameters()[0]->own_value == m2.parameters()[0]->own_value);
    CHECK(m1.parameters()[0]->own_value != m3.parameters()[0]->own_value);
    CHECK(m1.parameters()[0]->own_value != m1.parameters()[2]->own_value);
    const double bound = 1 / std::sqrt(6.0);
    for (double w : m1.parameters()[0]->value)
        CHECK((w >= -bound && w < bound));

    // float instantiation agrees with double to float precision
    nn::mlp<float> mf({6, 5, 4}, 42);
    for (std::size_t j = 0; j < mf.parameters()[0]->size(); ++j) {
        CHECK(double(mf.parameters()[0]->value[j]) ==
              doctest::Approx(m1.parameters()[0]->value[j]).epsilon(1e-6));
    }
}
