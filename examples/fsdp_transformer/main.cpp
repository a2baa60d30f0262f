// A character-level decoder-only transformer trained under mpirun with FSDP full
// sharding (ZeRO-3): unison holds the parameters, gradients and AdamW state, each
// rank 1/N of them, and LibTorch only computes.
//
//   mpirun -n 2 ./fsdp_transformer                        about 10 M parameters
//   mpirun -n 2 ./fsdp_transformer --steps 30 --layers 1 --d-model 64 --heads 4
//
// The model: token and learned position embeddings, pre-LayerNorm blocks (causal
// multi-head self-attention, GELU MLP), a final LayerNorm and an output head. It
// learns to predict the next character of an English-like text that every rank
// generates from the same small probabilistic grammar (agreement, a/an, questions,
// clauses: structure to learn).
//
// The units gathered together are the embeddings, each block, and the final norm
// with the head. Forward runs unit by unit on the gathered parameters without
// autograd and keeps only each unit's input; stage 3 frees the gathered copy right
// after. Backward walks the units in reverse, gathers each again, recomputes its
// forward from the saved input with autograd on, back-propagates the gradient that
// arrived from the unit above, and hands the parameter gradients to unison, which
// starts their reduce-scatter (non-blocking) and frees the gathered copy again.
// partitioned_optimizer then completes the reductions, clips to the global gradient
// norm and updates each rank's shard with AdamW.

#include <unison/core/torch.hpp>
#include <unison/mpi.hpp>
#include <unison/sharded.hpp>

#include <torch/torch.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <limits>
#include <numbers>
#include <random>
#include <string>
#include <string_view>
#include <vector>

namespace {

struct settings {
    int steps = 300;
    int layers = 6;
    std::int64_t d_model = 384;
    std::int64_t heads = 6;
    std::int64_t context = 64; // characters per training sequence
    std::int64_t batch = 32;   // global sequences per step, split evenly over the ranks
    double lr = 1e-3;          // peak learning rate
    int warmup = -1;           // steps of linear warmup; default: steps / 10, at most 30
    int log_every = 10;
    int threads = 1;  // LibTorch intra-op threads per rank
    int sample = 200; // characters generated at the end
};

using engine_type = unison::fsdp<unison::mpi_communicator, unison::policy::shard::full>;

// ------------------------------------------------------------------------- the text

/// English-like sentences from a small probabilistic grammar: subject-verb
/// agreement, "a"/"an", questions with "does"/"do", joined clauses, paragraphs.
/// std::mt19937_64's output is fixed by the standard (the distributions are not,
/// so none is used): every rank generates the same text.
class grammar {
public:
    explicit grammar(std::uint64_t seed) : rng_(seed) {}

    std::string text(std::size_t chars) {
        std::string out;
        while (out.size() < chars) {
            const int sentences = 4 + static_cast<int>(below(4));
            for (int i = 0; i < sentences; ++i) {
                out += (i == 0 ? "" : " ") + sentence();
            }
            out += '\n';
        }
        return out;
    }

private:
    struct word {
        std::string_view one, many; // singular and plural; for verbs 3rd person and base
    };

    static constexpr word animate[] = {
        {"cat", "cats"},         {"dog", "dogs"},       {"bird", "birds"},   {"farmer", "farmers"},
        {"teacher", "teachers"}, {"child", "children"}, {"horse", "horses"}, {"mouse", "mice"},
        {"owl", "owls"},         {"king", "kings"},     {"fox", "foxes"},    {"girl", "girls"}};
    static constexpr word thing[] = {
        {"house", "houses"}, {"river", "rivers"}, {"garden", "gardens"}, {"apple", "apples"},
        {"box", "boxes"},    {"song", "songs"},   {"letter", "letters"}, {"tree", "trees"}};
    static constexpr std::string_view names[] = {"anna", "tom", "maria", "paul", "ella", "omar"};
    static constexpr std::string_view adjectives[] = {"small",  "old",    "happy", "quiet",
                                                      "green",  "angry",  "brave", "empty",
                                                      "clever", "orange", "tired", "little"};
    static constexpr word transitive[] = {
        {"sees", "see"},      {"likes", "like"},    {"finds", "find"}, {"follows", "follow"},
        {"watches", "watch"}, {"carries", "carry"}, {"helps", "help"}, {"chases", "chase"}};
    static constexpr word intransitive[] = {{"sleeps", "sleep"},
                                            {"runs", "run"},
                                            {"sings", "sing"},
                                            {"waits", "wait"},
                                            {"laughs", "laugh"}};
    static constexpr std::string_view prepositions[] = {"near", "under", "behind", "beside",
                                                        "across"};
    static constexpr std::string_view adverbs[] = {"slowly", "quietly", "every day", "at night",
                                                   "again"};
    static constexpr std::string_view joins[] = {", and ", ", but ", " because ", " while "};

    std::uint64_t below(std::uint64_t n) { return rng_() % n; }
    bool chance(int percent) { return below(100) < static_cast<std::uint64_t>(percent); }
    template <class T, std::size_t N>
    const T& pick(const T (&list)[N]) {
        return list[below(N)];
    }

    /// A determiner, an optional adjective and a noun; or a name (singular only).
    std::string noun_phrase(bool living, bool plural) {
        if (living && !plural && chance(20)) {
            return std::string(pick(names));
        }
        const word& w = living ? pick(animate) : pick(thing);
        const std::string noun(plural ? w.many : w.one);
        const std::string rest = chance(40) ? std::string(pick(adjectives)) + " " + noun : noun;
        if (plural) {
            static constexpr std::string_view dets[] = {"the", "some", "two", "many", "my"};
            return std::string(pick(dets)) + " " + rest;
        }
        static constexpr std::string_view dets[] = {"the", "a", "every", "my", "this"};
        std::string det(pick(dets));
        if (det == "a" && std::string_view("aeiou").find(rest[0]) != std::string_view::npos) {
            det = "an";
        }
        return det + " " + rest;
    }

    std::string object() { return noun_phrase(chance(60), chance(30)); }

    std::string clause() {
        const bool plural = chance(35);
        std::string s = noun_phrase(true, plural) + " ";
        if (chance(60)) {
            const word& v = pick(transitive);
            s += std::string(plural ? v.many : v.one) + " " + object();
        } else {
            const word& v = pick(intransitive);
            s += std::string(plural ? v.many : v.one);
        }
        if (chance(30)) {
            s += " " + std::string(pick(prepositions)) + " " + object();
        }
        if (chance(20)) {
            s += " " + std::string(pick(adverbs));
        }
        return s;
    }

    std::string sentence() {
        std::string s;
        char end = '.';
        if (chance(15)) {
            const bool plural = chance(35);
            s = std::string(plural ? "do " : "does ") + noun_phrase(true, plural) + " " +
                std::string(pick(transitive).many) + " " + object();
            end = '?';
        } else if (chance(25)) {
            s = clause() + std::string(pick(joins)) + clause();
        } else {
            s = clause();
        }
        s[0] = static_cast<char>(s[0] - 'a' + 'A');
        return s + end;
    }

    std::mt19937_64 rng_;
};

/// The text as token ids over its sorted set of characters.
struct corpus {
    std::string vocabulary; // character of each token id
    std::vector<std::int64_t> tokens;

    explicit corpus(const std::string& text) {
        bool seen[256] = {};
        for (const char c : text) {
            seen[static_cast<unsigned char>(c)] = true;
        }
        std::int64_t id[256] = {};
        for (int c = 0; c < 256; ++c) {
            if (seen[c]) {
                id[c] = static_cast<std::int64_t>(vocabulary.size());
                vocabulary += static_cast<char>(c);
            }
        }
        tokens.reserve(text.size());
        for (const char c : text) {
            tokens.push_back(id[static_cast<unsigned char>(c)]);
        }
    }
    std::int64_t vocab() const { return static_cast<std::int64_t>(vocabulary.size()); }
};

// ------------------------------------------------------------------------ the model

struct model_shape {
    std::int64_t vocab, d_model, heads, context;
    int layers;
};

/// One parameter tensor: its name, shape and initial values (GPT-2's: normal with
/// std 0.02, residual projections scaled by 1/sqrt(2 layers), LayerNorm 1 and 0).
struct tensor_spec {
    enum class init : std::uint8_t { normal, zeros, ones };
    std::string name;
    std::vector<std::int64_t> shape;
    init how = init::zeros;
    double std = 0.0;

    std::size_t numel() const {
        std::int64_t n = 1;
        for (const std::int64_t d : shape) {
            n *= d;
        }
        return static_cast<std::size_t>(n);
    }
    torch::Tensor initial() const {
        switch (how) {
        case init::normal:
            return torch::randn(shape) * std;
        case init::ones:
            return torch::ones(shape);
        case init::zeros:
            break;
        }
        return torch::zeros(shape);
    }
};

/// A unit: the parameters gathered together, and which computation uses them.
struct unit_spec {
    enum class kind : std::uint8_t { embedding, block, head };
    kind what;
    std::vector<tensor_spec> tensors;
};

// Positions of a block's tensors in its unit.
enum block_tensor : std::size_t {
    ln1_w,
    ln1_b,
    qkv_w,
    qkv_b,
    attn_proj_w,
    attn_proj_b,
    ln2_w,
    ln2_b,
    fc_w,
    fc_b,
    mlp_proj_w,
    mlp_proj_b
};

std::vector<unit_spec> describe_model(const model_shape& m) {
    using init = tensor_spec::init;
    const std::int64_t d = m.d_model;
    const double residual_std = 0.02 / std::sqrt(2.0 * m.layers);
    std::vector<unit_spec> units;
    units.push_back({unit_spec::kind::embedding,
                     {{"embed.tokens", {m.vocab, d}, init::normal, 0.02},
                      {"embed.positions", {m.context, d}, init::normal, 0.02}}});
    for (int l = 0; l < m.layers; ++l) {
        const std::string p = "block" + std::to_string(l) + ".";
        units.push_back({unit_spec::kind::block,
                         {{p + "ln1.weight", {d}, init::ones},
                          {p + "ln1.bias", {d}, init::zeros},
                          {p + "attn.qkv.weight", {3 * d, d}, init::normal, 0.02},
                          {p + "attn.qkv.bias", {3 * d}, init::zeros},
                          {p + "attn.proj.weight", {d, d}, init::normal, residual_std},
                          {p + "attn.proj.bias", {d}, init::zeros},
                          {p + "ln2.weight", {d}, init::ones},
                          {p + "ln2.bias", {d}, init::zeros},
                          {p + "mlp.fc.weight", {4 * d, d}, init::normal, 0.02},
                          {p + "mlp.fc.bias", {4 * d}, init::zeros},
                          {p + "mlp.proj.weight", {d, 4 * d}, init::normal, residual_std},
                          {p + "mlp.proj.bias", {d}, init::zeros}}});
    }
    units.push_back({unit_spec::kind::head,
                     {{"head.norm.weight", {d}, init::ones},
                      {"head.norm.bias", {d}, init::zeros},
                      {"head.weight", {m.vocab, d}, init::normal, 0.02},
                      {"head.bias", {m.vocab}, init::zeros}}});
    return units;
}

/// Causal multi-head self-attention of x [B, T, D].
torch::Tensor attention(const torch::Tensor& x, const std::vector<torch::Tensor>& w,
                        std::int64_t heads) {
    const std::int64_t b = x.size(0), t = x.size(1), d = x.size(2), hd = d / heads;
    const torch::Tensor qkv = torch::linear(x, w[qkv_w], w[qkv_b])
                                  .view({b, t, 3, heads, hd})
                                  .permute({2, 0, 3, 1, 4}); // [3, B, H, T, hd]
    const torch::Tensor future = torch::ones({t, t}, torch::kBool).triu(1);
    torch::Tensor scores =
        torch::matmul(qkv[0], qkv[1].transpose(-2, -1)) / std::sqrt(static_cast<double>(hd));
    scores = scores.masked_fill(future, -std::numeric_limits<float>::infinity());
    const torch::Tensor y =
        torch::matmul(torch::softmax(scores, -1), qkv[2]).transpose(1, 2).reshape({b, t, d});
    return torch::linear(y, w[attn_proj_w], w[attn_proj_b]);
}

/// The computation of one unit: token ids [B, T] -> activations [B, T, D] for the
/// embeddings, activations -> activations for a block, activations -> logits
/// [B, T, V] for the head.
torch::Tensor unit_forward(const unit_spec& unit, const std::vector<torch::Tensor>& w,
                           const torch::Tensor& x, const model_shape& m) {
    const std::vector<std::int64_t> features{m.d_model};
    switch (unit.what) {
    case unit_spec::kind::embedding:
        return torch::embedding(w[0], x) + w[1].narrow(0, 0, x.size(1));
    case unit_spec::kind::block: {
        const torch::Tensor h =
            x + attention(torch::layer_norm(x, features, w[ln1_w], w[ln1_b]), w, m.heads);
        const torch::Tensor a = torch::gelu(
            torch::linear(torch::layer_norm(h, features, w[ln2_w], w[ln2_b]), w[fc_w], w[fc_b]));
        return h + torch::linear(a, w[mlp_proj_w], w[mlp_proj_b]);
    }
    case unit_spec::kind::head:
        return torch::linear(torch::layer_norm(x, features, w[0], w[1]), w[2], w[3]);
    }
    return {};
}

torch::Tensor loss_of(const torch::Tensor& logits, const torch::Tensor& targets) {
    return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}),
                                                targets.reshape({-1}));
}

/// A unit's parameters as tensors over unison's gathered memory (no copy), valid
/// while the unit's scope lasts. With `trainable` they require grad, so backward
/// computes their gradients.
std::vector<torch::Tensor> bind(engine_type& engine, const unit_spec& unit,
                                const unison::unit_handle& u, bool trainable) {
    std::vector<torch::Tensor> w;
    for (std::size_t j = 0; j < unit.tensors.size(); ++j) {
        const unison::view<float> v = engine.value(u[j]);
        w.push_back(torch::from_blob(v.data, unit.tensors[j].shape, torch::kFloat));
        if (trainable) {
            w.back().requires_grad_(true);
        }
    }
    return w;
}

// ---------------------------------------------------------------------- one step

/// Forward and backward of one batch with FSDP and recomputation; returns this
/// rank's mean loss. The gradient reductions are in flight when it returns.
double forward_backward(engine_type& engine, const std::vector<unit_spec>& units,
                        const std::vector<unison::unit_handle>& handles, const model_shape& m,
                        const torch::Tensor& input, const torch::Tensor& targets) {
    const std::size_t n = units.size();
    std::vector<torch::Tensor> saved(n); // each unit's input, the only activations kept
    double loss = 0.0;
    {
        torch::NoGradGuard no_grad;
        torch::Tensor x = input;
        for (std::size_t k = 0; k < n; ++k) {
            saved[k] = x;
            auto scope = engine.forward(handles[k]); // gathers (and prefetches the next unit)
            x = unit_forward(units[k], bind(engine, units[k], handles[k], false), x, m);
        } // each scope's end frees the gathered copy
        loss = loss_of(x, targets).item<double>();
    }
    torch::Tensor grad_output; // d loss / d (output of unit k)
    for (std::size_t k = n; k-- > 0;) {
        auto scope = engine.backward(handles[k]); // gathers again (and prefetches)
        const std::vector<torch::Tensor> w = bind(engine, units[k], handles[k], true);
        const torch::Tensor x = k == 0 ? saved[k] : saved[k].detach().requires_grad_(true);
        const torch::Tensor y = unit_forward(units[k], w, x, m); // recomputed, with autograd
        if (k + 1 == n) {
            torch::autograd::backward({loss_of(y, targets)});
        } else {
            torch::autograd::backward({y}, {grad_output});
        }
        for (std::size_t j = 0; j < w.size(); ++j) {
            const unison::view<float> g = engine.gradient(handles[k][j]);
            torch::from_blob(g.data, units[k].tensors[j].shape, torch::kFloat).add_(w[j].grad());
        }
        if (k > 0) {
            grad_output = x.grad();
        }
        saved[k] = torch::Tensor();
    } // each scope's end starts the unit's reduce-scatter; engine.step() completes them
    return loss;
}

/// Samples `count` characters after `prompt` (temperature 0.8). Gathers every unit
/// (collective), so every rank calls it; rank 0 computes and returns the text.
std::string generate(engine_type& engine, const std::vector<unit_spec>& units,
                     const std::vector<unison::unit_handle>& handles, const model_shape& m,
                     const corpus& text, const std::string& prompt, int count) {
    std::vector<engine_type::unit_scope> scopes;
    scopes.reserve(units.size());
    std::vector<std::vector<torch::Tensor>> w;
    for (std::size_t k = 0; k < units.size(); ++k) {
        scopes.push_back(engine.forward(handles[k]));
        w.push_back(bind(engine, units[k], handles[k], false));
    }
    std::string out = prompt;
    if (engine.communicator().rank() == 0) {
        torch::NoGradGuard no_grad;
        torch::manual_seed(7);
        std::vector<std::int64_t> ids;
        for (const char c : prompt) {
            ids.push_back(static_cast<std::int64_t>(text.vocabulary.find(c)));
        }
        for (int i = 0; i < count; ++i) {
            const auto t = std::min<std::int64_t>(static_cast<std::int64_t>(ids.size()), m.context);
            torch::Tensor x =
                torch::tensor(std::vector<std::int64_t>(ids.end() - t, ids.end())).reshape({1, t});
            for (std::size_t k = 0; k < units.size(); ++k) {
                x = unit_forward(units[k], w[k], x, m);
            }
            const torch::Tensor probs = torch::softmax(x[0][t - 1] / 0.8, -1);
            ids.push_back(torch::multinomial(probs, 1).item<std::int64_t>());
            out += text.vocabulary[static_cast<std::size_t>(ids.back())];
        }
    }
    return out; // the scopes end here: every unit is released
}

double mib(std::size_t bytes) {
    return static_cast<double>(bytes) / (1024.0 * 1024.0);
}

/// Linear warmup to the peak, then cosine decay to a tenth of it.
double learning_rate(const settings& s, int warmup, int step) {
    if (step < warmup) {
        return s.lr * (step + 1) / warmup;
    }
    const double progress = static_cast<double>(step - warmup) / std::max(1, s.steps - warmup - 1);
    return s.lr * (0.1 + 0.45 * (1.0 + std::cos(std::numbers::pi * progress)));
}

int train(unison::mpi_communicator& comm, const settings& s) {
    const int ranks = comm.size(), rank = comm.rank();
    if (s.batch % ranks != 0) {
        if (rank == 0) {
            std::fprintf(stderr,
                         "fsdp_transformer: the global batch %lld must split evenly over "
                         "%d ranks\n",
                         static_cast<long long>(s.batch), ranks);
        }
        return 2;
    }
    torch::set_num_threads(s.threads);
    const corpus text(grammar(2024).text(400000)); // the same on every rank
    const model_shape m{text.vocab(), s.d_model, s.heads, s.context, s.layers};
    const std::vector<unit_spec> units = describe_model(m);

    // --- unison: units, initial values (same seed on every rank), start ----------------
    engine_type engine(comm, {.optimizer = {.lr = s.lr, .beta2 = 0.99}, // decay 1e-2
                              .max_grad_norm = 1.0});
    torch::manual_seed(1234);
    std::vector<unison::unit_handle> handles;
    for (const unit_spec& unit : units) {
        std::vector<torch::Tensor> initial; // alive until add_unit has kept this rank's shard
        std::vector<engine_type::parameter> params;
        for (const tensor_spec& t : unit.tensors) {
            initial.push_back(t.initial());
            params.emplace_back(t.name, initial.back());
        }
        handles.push_back(engine.add_unit(params));
    }
    engine.start(); // checks that every rank added the same units and values
    // ---------------------------------------------------------------------------------

    const std::int64_t local = s.batch / ranks;
    const int warmup = s.warmup >= 0 ? s.warmup : std::clamp(s.steps / 10, 1, 30);
    const std::size_t psi = engine.numel();
    const double ln_vocab = std::log(static_cast<double>(m.vocab));
    if (rank == 0) {
        const unison::memory_report mem = engine.memory();
        std::printf("fsdp_transformer: %zu parameters in %zu tensors, %zu units (embeddings, %d "
                    "block%s, head); d_model %lld, %lld heads, context %lld\n",
                    psi, engine.parameters().parameter_count(), engine.unit_count(), s.layers,
                    s.layers == 1 ? "" : "s", static_cast<long long>(s.d_model),
                    static_cast<long long>(s.heads), static_cast<long long>(s.context));
        std::printf("text: %zu characters, vocabulary %lld (ln %lld = %.3f); global batch %lld "
                    "sequences (%lld per rank), %d ranks, %d thread(s) each\n",
                    text.tokens.size(), static_cast<long long>(m.vocab),
                    static_cast<long long>(m.vocab), ln_vocab, static_cast<long long>(s.batch),
                    static_cast<long long>(local), ranks, s.threads);
        std::printf("memory per rank: parameters %.2f MiB, gradients %.2f MiB, AdamW state %.2f "
                    "MiB (unsharded: %.2f, %.2f, %.2f MiB)\n",
                    mib(mem.parameters), mib(mem.gradients), mib(engine.optimizer_state_bytes()),
                    mib(psi * 4), mib(psi * 4), mib(psi * 8));
    }

    // Every rank draws the whole global batch's offsets from the same generator and
    // takes its slice.
    std::mt19937_64 offsets(99);
    const auto span =
        static_cast<std::uint64_t>(static_cast<std::int64_t>(text.tokens.size()) - s.context - 1);
    std::vector<double> losses;
    double first_step_seconds = 0.0, seconds_total = 0.0;
    for (int step = 0; step < s.steps; ++step) {
        const auto start = std::chrono::steady_clock::now();
        torch::Tensor window = torch::empty({local, s.context + 1}, torch::kLong);
        for (std::int64_t i = 0; i < s.batch; ++i) {
            const std::uint64_t at = offsets() % span;
            if (i / local == rank) {
                std::copy_n(text.tokens.begin() + static_cast<std::ptrdiff_t>(at), s.context + 1,
                            window[i % local].data_ptr<std::int64_t>());
            }
        }
        engine.hyperparameters().lr = learning_rate(s, warmup, step);

        const double loss =
            forward_backward(engine, units, handles, m, window.narrow(1, 0, s.context),
                             window.narrow(1, 1, s.context));
        const unison::step_result r = engine.step(); // clip to norm 1, AdamW, zero gradients

        std::vector<double> global_loss{loss};
        unison::all_reduce(comm, global_loss, unison::reduce_op::avg);
        losses.push_back(global_loss[0]);
        const double seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        (step == 0 ? first_step_seconds : seconds_total) += seconds;
        if (rank == 0 && (step % s.log_every == 0 || step + 1 == s.steps)) {
            std::printf("step %4d  loss %.4f  grad norm %7.4f%s  lr %.2e  %7.0f tokens/s  "
                        "%.2f s/step\n",
                        step, losses.back(), r.grad_norm, r.skipped ? " (skipped)" : "",
                        engine.hyperparameters().lr,
                        static_cast<double>(s.batch * s.context) / seconds, seconds);
            std::fflush(stdout); // mpirun forwards what is flushed
        }
        if (rank == 0 && step == 0) {
            const unison::memory_report mem = engine.memory();
            std::printf("transient full copies, peak: %.2f MiB (gathered parameters, %d units at "
                        "most, and full gradients awaiting their reduce-scatter)\n",
                        mib(mem.gathered_peak), mem.live_units_peak);
        }
    }

    // Averages over the first and the last (up to) 10 steps.
    const std::size_t ends = std::clamp<std::size_t>(losses.size() / 2, 1, 10);
    double first = 0.0, last = 0.0;
    for (std::size_t i = 0; i < ends; ++i) {
        first += losses[i] / static_cast<double>(ends);
        last += losses[losses.size() - 1 - i] / static_cast<double>(ends);
    }
    const std::string sample = generate(engine, units, handles, m, text, "The ", s.sample);
    const bool fell = last < first;
    const bool sane = std::abs(losses.front() - ln_vocab) < 0.5;
    if (rank == 0) {
        std::printf("loss: first %zu steps %.4f, last %zu steps %.4f; initial %.4f vs ln(vocab) "
                    "%.4f\n",
                    ends, first, ends, last, losses.front(), ln_vocab);
        if (s.steps > 1) {
            std::printf("time: %.2f s/step after the first (%.2f s)\n",
                        seconds_total / (s.steps - 1), first_step_seconds);
        }
        std::printf("sample:\n%s\n", sample.c_str());
        if (!fell) {
            std::printf("FAILED: the loss did not fall\n");
        }
        if (!sane) {
            std::printf("FAILED: the initial loss is not close to ln(vocabulary)\n");
        }
    }
    return fell && sane ? 0 : 1;
}

int usage() {
    std::fprintf(stderr,
                 "usage: fsdp_transformer [--steps N] [--layers N] [--d-model N] [--heads N] "
                 "[--context N] [--batch N] [--lr X] [--warmup N] [--log-every N] [--threads N] "
                 "[--sample N]\n");
    return 2;
}

/// `text` as a whole number in [low, high], or false.
template <class T>
bool parse(std::string_view text, T& out, T low, T high) {
    T value{};
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (ec != std::errc() || end != text.data() + text.size() || value < low || value > high) {
        return false;
    }
    out = value;
    return true;
}

bool parse_settings(int argc, char** argv, settings& s) {
    constexpr int most = std::numeric_limits<int>::max();
    constexpr std::int64_t large = std::int64_t{1} << 20;
    for (int i = 1; i < argc; ++i) {
        const std::string_view flag = argv[i];
        if (i + 1 >= argc) {
            return false;
        }
        const std::string_view value = argv[++i];
        bool ok = false;
        if (flag == "--steps") {
            ok = parse(value, s.steps, 1, most);
        } else if (flag == "--layers") {
            ok = parse(value, s.layers, 1, 1000);
        } else if (flag == "--d-model") {
            ok = parse(value, s.d_model, std::int64_t{1}, large);
        } else if (flag == "--heads") {
            ok = parse(value, s.heads, std::int64_t{1}, large);
        } else if (flag == "--context") {
            ok = parse(value, s.context, std::int64_t{1}, std::int64_t{4096});
        } else if (flag == "--batch") {
            ok = parse(value, s.batch, std::int64_t{1}, large);
        } else if (flag == "--warmup") {
            ok = parse(value, s.warmup, 0, most);
        } else if (flag == "--log-every") {
            ok = parse(value, s.log_every, 1, most);
        } else if (flag == "--threads") {
            ok = parse(value, s.threads, 1, 1024);
        } else if (flag == "--sample") {
            ok = parse(value, s.sample, 0, 100000);
        } else if (flag == "--lr") {
            char* end = nullptr;
            const std::string copy(value);
            s.lr = std::strtod(copy.c_str(), &end);
            ok = end == copy.c_str() + copy.size() && std::isfinite(s.lr) && s.lr > 0.0;
        }
        if (!ok) {
            return false;
        }
    }
    if (s.d_model % s.heads != 0) {
        std::fprintf(stderr, "fsdp_transformer: --d-model %lld is not a multiple of --heads %lld\n",
                     static_cast<long long>(s.d_model), static_cast<long long>(s.heads));
        return false;
    }
    return true;
}

} // namespace

int main(int argc, char** argv) {
    settings s;
    if (!parse_settings(argc, argv, s)) {
        return usage();
    }
    unison::mpi_environment env(argc, argv);
    try {
        unison::mpi_communicator comm(MPI_COMM_WORLD);
        return train(comm, s);
    } catch (const unison::error& e) {
        std::fprintf(stderr, "fsdp_transformer: %s\n", e.what());
    } catch (const std::exception& e) { // LibTorch's c10::Error, std::bad_alloc, ...
        std::fprintf(stderr, "fsdp_transformer: %s\n", e.what());
    }
    // The other ranks may be waiting in a collective this rank will never join.
    MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
}
