// A character-level decoder-only transformer trained under mpirun with FSDP full
// sharding (ZeRO-3): unison holds the parameters, gradients and AdamW state, each
// rank 1/N of them; the model is an ordinary torch::nn module and its forward and
// backward are LibTorch's own, under autograd.
//
//   mpirun -n 2 ./fsdp_transformer                        about 10 M parameters
//   mpirun -n 2 ./fsdp_transformer --steps 30 --layers 1 --d-model 64 --heads 4
//   mpirun -n 2 ./fsdp_transformer --micro-batches 4 --recompute   less memory per step
//
// The model: token and learned position embeddings, pre-LayerNorm blocks (causal
// multi-head self-attention, GELU MLP), a final LayerNorm and an output head. It
// learns to predict the next character of an English-like text that every rank
// generates from the same small probabilistic grammar (agreement, a/an, questions,
// clauses: structure to learn).
//
// Each block is a unit (gathered as a whole); the embeddings, the final norm and the
// head form the root unit. unison::torch::fsdp gathers a block's parameters just
// before its forward and frees them after, gathers them again when backward reaches
// the block, and reduce-scatters the block's gradients as soon as autograd has
// produced them; step() completes the reductions, clips to the global gradient norm
// and updates each rank's shard with AdamW.
//
// Two ways to fit a larger batch in less memory, each one option away:
// --micro-batches N splits each rank's share of the batch into N micro-batches, each
// with its forward and backward, and steps once (the engine's accumulate_steps: each
// micro-batch's gradients reduce-scattered into the shards); --recompute keeps no
// activations inside the blocks and recomputes each block's forward when backward
// reaches it (unison::torch::recompute). The peak resident memory of the process is
// printed at the end.

#include "cli/cli.hpp"

#include <unison/mpi.hpp>
#include <unison/torch.hpp>
#include <unison/version.hpp>

#include <torch/torch.h>

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <limits>
#include <numbers>
#include <optional>
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
    int threads = 1;        // LibTorch intra-op threads per rank
    int sample = 200;       // characters generated at the end
    int micro_batches = 1;  // forward + backward passes per optimizer step
    bool recompute = false; // recompute each block's activations in backward
};

using engine_type = unison::torch::fsdp<unison::mpi_communicator, unison::policy::shard::full>;

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

/// Initial values as GPT-2's: normal with std 0.02 (the residual projections'
/// scaled by 1/sqrt(2 layers)), biases zero, LayerNorm weights one.
void init_normal(const torch::Tensor& w, double std) {
    torch::NoGradGuard no_grad;
    w.normal_(0.0, std);
}

/// A pre-LayerNorm transformer block: causal multi-head self-attention and a GELU
/// MLP, each with a residual connection, on [B, T, D].
struct BlockImpl : torch::nn::Module {
    BlockImpl(const model_shape& m) : heads(m.heads) {
        const std::int64_t d = m.d_model;
        const double residual_std = 0.02 / std::sqrt(2.0 * m.layers);
        ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
        qkv = register_module("qkv", torch::nn::Linear(d, 3 * d));
        proj = register_module("proj", torch::nn::Linear(d, d));
        ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
        fc = register_module("fc", torch::nn::Linear(d, 4 * d));
        mlp_proj = register_module("mlp_proj", torch::nn::Linear(4 * d, d));
        for (auto* linear : {&qkv, &proj, &fc, &mlp_proj}) {
            const bool residual = linear == &proj || linear == &mlp_proj;
            init_normal((*linear)->weight, residual ? residual_std : 0.02);
            torch::NoGradGuard no_grad;
            (*linear)->bias.zero_();
        }
    }
    torch::Tensor forward(const torch::Tensor& x) {
        const std::int64_t b = x.size(0), t = x.size(1), d = x.size(2), hd = d / heads;
        const torch::Tensor q_k_v =
            qkv(ln1(x)).view({b, t, 3, heads, hd}).permute({2, 0, 3, 1, 4}); // [3, B, H, T, hd]
        const torch::Tensor future = torch::ones({t, t}, torch::kBool).triu(1);
        const torch::Tensor scores =
            (torch::matmul(q_k_v[0], q_k_v[1].transpose(-2, -1)) /
             std::sqrt(static_cast<double>(hd)))
                .masked_fill(future, -std::numeric_limits<float>::infinity());
        const torch::Tensor y =
            torch::matmul(torch::softmax(scores, -1), q_k_v[2]).transpose(1, 2).reshape({b, t, d});
        const torch::Tensor h = x + proj(y);
        return h + mlp_proj(torch::gelu(fc(ln2(h))));
    }
    std::int64_t heads;
    torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
    torch::nn::Linear qkv{nullptr}, proj{nullptr}, fc{nullptr}, mlp_proj{nullptr};
};
TORCH_MODULE(Block);

/// Token ids [B, T] -> logits [B, T, vocab].
struct TransformerImpl : torch::nn::Module {
    explicit TransformerImpl(const model_shape& m) {
        tokens = register_module("tokens", torch::nn::Embedding(m.vocab, m.d_model));
        positions = register_parameter("positions", torch::empty({m.context, m.d_model}));
        for (int l = 0; l < m.layers; ++l) {
            blocks.push_back(register_module("block" + std::to_string(l), Block(m)));
        }
        norm =
            register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({m.d_model})));
        head = register_module("head", torch::nn::Linear(m.d_model, m.vocab));
        init_normal(tokens->weight, 0.02);
        init_normal(positions, 0.02);
        init_normal(head->weight, 0.02);
        torch::NoGradGuard no_grad;
        head->bias.zero_();
    }
    torch::Tensor forward(const torch::Tensor& ids) {
        torch::Tensor x = tokens(ids) + positions.narrow(0, 0, ids.size(1));
        for (Block& block : blocks) {
            // The one unison line in the model: run the block as its FSDP unit (a plain
            // call when no engine runs it), its activations recomputed in backward
            // when asked.
            auto run = [&block](const torch::Tensor& in) {
                return unison::torch::unit_forward(*block, [&] { return block->forward(in); });
            };
            x = recompute ? unison::torch::recompute(run, x) : run(x);
        }
        return head(norm(x));
    }
    bool recompute = false;
    torch::nn::Embedding tokens{nullptr};
    torch::Tensor positions;
    std::vector<Block> blocks;
    torch::nn::LayerNorm norm{nullptr};
    torch::nn::Linear head{nullptr};
};
TORCH_MODULE(Transformer);

torch::Tensor loss_of(const torch::Tensor& logits, const torch::Tensor& targets) {
    return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}),
                                                targets.reshape({-1}));
}

/// Samples `count` characters after `prompt` (temperature 0.8). Every rank runs it
/// (each forward gathers the units: collective) and gets the same text.
std::string generate(engine_type& engine, Transformer& model, const model_shape& m,
                     const corpus& text, const std::string& prompt, int count) {
    torch::NoGradGuard no_grad;
    auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
    std::vector<std::int64_t> ids;
    for (const char c : prompt) {
        ids.push_back(static_cast<std::int64_t>(text.vocabulary.find(c)));
    }
    std::string out = prompt;
    for (int i = 0; i < count; ++i) {
        const auto t = std::min<std::int64_t>(static_cast<std::int64_t>(ids.size()), m.context);
        const torch::Tensor x =
            torch::tensor(std::vector<std::int64_t>(ids.end() - t, ids.end())).reshape({1, t});
        const torch::Tensor logits = engine.forward([&] { return model->forward(x); });
        const torch::Tensor probs = torch::softmax(logits[0][t - 1] / 0.8, -1);
        ids.push_back(torch::multinomial(probs, 1, false, gen).item<std::int64_t>());
        out += text.vocabulary[static_cast<std::size_t>(ids.back())];
    }
    return out;
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
    if (s.batch / ranks < s.micro_batches) {
        if (rank == 0) {
            std::fprintf(stderr,
                         "fsdp_transformer: %lld sequences per rank cannot make %d micro-batches\n",
                         static_cast<long long>(s.batch / ranks), s.micro_batches);
        }
        return 2;
    }
    torch::set_num_threads(s.threads);
    const corpus text(grammar(2024).text(400000)); // the same on every rank
    const model_shape m{text.vocab(), s.d_model, s.heads, s.context, s.layers};
    torch::manual_seed(1234);
    Transformer model(m);

    // --- unison: the model sharded, a unit per block ------------------------------------
    // Collective: checks that every rank built the same model, starts every rank from
    // rank 0's values and shards them; AdamW with decay 1e-2, clipping to norm 1.
    engine_type engine(comm, model, unison::torch::modules(model->blocks),
                       {.optimizer = {.lr = s.lr, .beta2 = 0.99},
                        .max_grad_norm = 1.0,
                        .accumulate_steps = s.micro_batches});
    model->recompute = s.recompute;
    // ---------------------------------------------------------------------------------

    const std::int64_t local = s.batch / ranks;
    const int warmup = s.warmup >= 0 ? s.warmup : std::clamp(s.steps / 10, 1, 30);
    const std::size_t psi = engine.engine().numel();
    const double ln_vocab = std::log(static_cast<double>(m.vocab));
    if (rank == 0) {
        const unison::memory_report mem = engine.engine().memory();
        std::printf("fsdp_transformer: %zu parameters in %zu tensors, %zu units (%d block%s, and "
                    "the root: embeddings, norm, head); d_model %lld, %lld heads, context %lld\n",
                    psi, engine.engine().parameters().parameter_count(), engine.unit_count(),
                    s.layers, s.layers == 1 ? "" : "s", static_cast<long long>(s.d_model),
                    static_cast<long long>(s.heads), static_cast<long long>(s.context));
        std::printf("text: %zu characters, vocabulary %lld (ln %lld = %.3f); global batch %lld "
                    "sequences (%lld per rank), %d ranks, %d thread(s) each\n",
                    text.tokens.size(), static_cast<long long>(m.vocab),
                    static_cast<long long>(m.vocab), ln_vocab, static_cast<long long>(s.batch),
                    static_cast<long long>(local), ranks, s.threads);
        std::printf("memory per rank: parameters %.2f MiB, gradients %.2f MiB, AdamW state %.2f "
                    "MiB (unsharded: %.2f, %.2f, %.2f MiB)\n",
                    mib(mem.parameters), mib(mem.gradients),
                    mib(engine.engine().optimizer_state_bytes()), mib(psi * 4), mib(psi * 4),
                    mib(psi * 8));
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
        engine.engine().hyperparameters().lr = learning_rate(s, warmup, step);

        // Micro-batch k: rows [k local / N, (k + 1) local / N) of this rank's share, its
        // loss weighted by its share of the rows; the engine steps after the last.
        double rank_loss = 0.0;
        unison::step_result r;
        for (int k = 0; k < s.micro_batches; ++k) {
            const std::int64_t first = local * k / s.micro_batches;
            const std::int64_t rows = local * (k + 1) / s.micro_batches - first;
            const torch::Tensor part = window.narrow(0, first, rows);
            const torch::Tensor input = part.narrow(1, 0, s.context);
            // Phases on the timeline (UNISON_TIMELINE=path; nothing when it is unset).
            std::optional<unison::timeline::scope> phase(std::in_place, rank, "forward");
            const torch::Tensor loss =
                loss_of(engine.forward([&] { return model->forward(input); }),
                        part.narrow(1, 1, s.context)) *
                (static_cast<double>(rows) / static_cast<double>(local));
            phase.emplace(rank, "backward");
            loss.backward(); // each block's reduce-scatter starts
            phase.emplace(rank, "step");
            r = engine.step(); // on the last micro-batch: clip to norm 1, AdamW, zero
            phase.reset();
            rank_loss += loss.item<double>();
        }

        std::vector<double> global_loss{rank_loss};
        unison::all_reduce(comm, global_loss, unison::reduce_op::avg);
        losses.push_back(global_loss[0]);
        const double seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        (step == 0 ? first_step_seconds : seconds_total) += seconds;
        if (rank == 0 && (step % s.log_every == 0 || step + 1 == s.steps)) {
            std::printf("step %4d  loss %.4f  grad norm %7.4f%s  lr %.2e  %7.0f tokens/s  "
                        "%.2f s/step\n",
                        step, losses.back(), r.grad_norm, r.skipped ? " (skipped)" : "",
                        engine.engine().hyperparameters().lr,
                        static_cast<double>(s.batch * s.context) / seconds, seconds);
            std::fflush(stdout); // mpirun forwards what is flushed
        }
        if (rank == 0 && step == 0) {
            const unison::memory_report mem = engine.engine().memory();
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
    const std::string sample = generate(engine, model, m, text, "The ", s.sample);
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
        rusage usage{};
        getrusage(RUSAGE_SELF, &usage);
        std::printf("peak resident memory of rank 0: %.1f MiB (%d micro-batch%s per step, "
                    "activations %s)\n",
                    static_cast<double>(usage.ru_maxrss) / 1024.0, s.micro_batches,
                    s.micro_batches == 1 ? "" : "es", s.recompute ? "recomputed" : "kept");
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

/// Reads the command line into `s`; an exit code where the program should stop
/// (after --help or --version, or an error it printed).
std::optional<int> parse_settings(int argc, char** argv, settings& s) {
    constexpr int most = std::numeric_limits<int>::max();
    constexpr std::int64_t large = std::int64_t{1} << 20;
    cli::parser cli("fsdp_transformer",
                    "A character-level transformer trained under unison::torch::fsdp (ZeRO-3) "
                    "on MPI processes.",
                    unison::version_string);
    cli.value("--steps", "N", s.steps, 1, most, "optimizer steps")
        .value("--layers", "N", s.layers, 1, 1000, "transformer blocks")
        .value("--d-model", "N", s.d_model, std::int64_t{1}, large, "model width")
        .value("--heads", "N", s.heads, std::int64_t{1}, large, "attention heads")
        .value("--context", "N", s.context, std::int64_t{1}, std::int64_t{4096},
               "characters per training sequence")
        .value("--batch", "N", s.batch, std::int64_t{1}, large,
               "global sequences per step, split evenly over the ranks")
        .value("--lr", "X", s.lr, 1e-12, 10.0, "peak learning rate")
        .value("--warmup", "N", s.warmup, 0, most,
               "steps of linear warmup (default: steps / 10, at most 30)")
        .value("--log-every", "N", s.log_every, 1, most, "steps between printed losses")
        .value("--threads", "N", s.threads, 1, 1024, "LibTorch intra-op threads per rank")
        .value("--sample", "N", s.sample, 0, 100000, "characters generated at the end")
        .value("--micro-batches", "N", s.micro_batches, 1, 1 << 16,
               "forward and backward passes per optimizer step")
        .flag("--recompute", s.recompute, "recompute each block's activations in backward");
    if (const std::optional<int> exit_code = cli.parse(argc, argv)) {
        return exit_code;
    }
    if (s.d_model % s.heads != 0) {
        std::fprintf(stderr, "fsdp_transformer: --d-model %lld is not a multiple of --heads %lld\n",
                     static_cast<long long>(s.d_model), static_cast<long long>(s.heads));
        return 2;
    }
    return std::nullopt;
}

} // namespace

int main(int argc, char** argv) {
    settings s;
    if (const std::optional<int> exit_code = parse_settings(argc, argv, s)) {
        return *exit_code;
    }
    std::optional<unison::mpi_environment> env;
    try {
        env.emplace(argc, argv); // checks that the launcher and MPI agree on the job
    } catch (const unison::error& e) {
        std::fprintf(stderr, "fsdp_transformer: %s\n", e.what());
        return 2;
    }
    try {
        unison::mpi_communicator comm(MPI_COMM_WORLD);
        return train(comm, s);
    } catch (const std::exception& e) { // unison::error, LibTorch's c10::Error, ...
        // The other ranks may be waiting in a collective this rank will never join.
        unison::mpi_environment::abort_job("fsdp_transformer", e);
    }
}
