// The on-disk layer of sharded checkpoints (unison/checkpoint.hpp): the metadata
// text round-trips random metadata exactly, every malformed or inconsistent input
// is rejected with a checkpoint_error that names the problem, durable writes read
// back verified, and parse survives random mutations of a valid file.

#include "unison/checkpoint.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fcntl.h>
#include <filesystem>
#include <future>
#include <initializer_list>
#include <limits>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <sys/stat.h>
#include <thread>
#include <type_traits>
#include <unistd.h>
#include <utility>
#include <vector>

namespace {

namespace ck = unison::checkpoint;

static_assert(std::is_base_of_v<unison::error, unison::checkpoint_error>);

constexpr std::uint64_t u64_max = std::numeric_limits<std::uint64_t>::max();

std::string hex16(std::uint64_t v) {
    char buffer[17];
    std::snprintf(buffer, sizeof buffer, "%016llx", static_cast<unsigned long long>(v));
    return buffer;
}

/// The checksum of the version this build writes.
std::uint64_t hash(std::string_view s) {
    return ck::checksum(ck::format_version, s.data(), s.size());
}

/// `body` followed by its checksum line.
std::string seal(const std::string& body) {
    return body + "checksum " + hex16(hash(body)) + "\n";
}

/// `text` without its last line.
std::string body_of(const std::string& text) {
    const std::size_t end = text.find_last_of('\n', text.size() - 2);
    return text.substr(0, end == std::string::npos ? 0 : end + 1);
}

/// The lines of `text`'s body, without their '\n'.
std::vector<std::string> body_lines(const std::string& text) {
    std::vector<std::string> lines;
    const std::string body = body_of(text);
    for (std::size_t pos = 0; pos < body.size();) {
        const std::size_t end = body.find('\n', pos);
        lines.push_back(body.substr(pos, end - pos));
        pos = end + 1;
    }
    return lines;
}

/// `lines`, each followed by '\n', then the checksum line.
std::string sealed(const std::vector<std::string>& lines) {
    std::string body;
    for (const std::string& line : lines) {
        body += line;
        body += '\n';
    }
    return seal(body);
}

/// parse's what() for `text`, or "(accepted)".
std::string rejection(std::string_view text) {
    try {
        (void)ck::parse(text, "ckpt/metadata");
    } catch (const unison::checkpoint_error& e) {
        CHECK(e.file() == "ckpt/metadata");
        return e.what();
    }
    return "(accepted)";
}

/// validate's what() for `m`, or "(accepted)".
std::string invalidity(const ck::metadata& m) {
    try {
        ck::validate(m, "ckpt/metadata");
    } catch (const unison::checkpoint_error& e) {
        return e.what();
    }
    return "(accepted)";
}

bool says(const std::string& what, std::initializer_list<std::string_view> words) {
    if (what.rfind("unison: checkpoint: ckpt/metadata: ", 0) != 0) {
        return false;
    }
    return std::all_of(words.begin(), words.end(),
                       [&](std::string_view w) { return what.find(w) != std::string::npos; });
}

// Checks that parse rejects TEXT (validate rejects a metadata M) with a message
// holding every one of the given words.
#define CHECK_REJECTED(text, ...)                                                                  \
    do {                                                                                           \
        const std::string what_ = rejection(text);                                                 \
        INFO("what(): ", what_);                                                                   \
        CHECK(says(what_, {__VA_ARGS__}));                                                         \
    } while (false)
#define CHECK_INVALID(m, ...)                                                                      \
    do {                                                                                           \
        const std::string what_ = invalidity(m);                                                   \
        INFO("what(): ", what_);                                                                   \
        CHECK(says(what_, {__VA_ARGS__}));                                                         \
        CHECK(says(rejection(ck::serialize(m)), {__VA_ARGS__}));                                   \
    } while (false)

/// A small checkpoint of two ranks, two kinds and three tensors (one empty), in
/// format version 2 (the line numbers below hold there; version 3 adds the
/// tensor_steps lines after the tensors). Its text's lines: 1 magic, 2 world_size,
/// 3 layout, 4 optimizer, 5 step, 6 loss_scale, 7 good_steps, 8 kinds, 9-10 kind,
/// 11 tensors, 12-14 tensor, 15 files, 16-17 file, 18 ranges, 19-24 range, 25
/// checksum.
ck::metadata small() {
    ck::metadata m;
    m.version = 2;
    m.world_size = 2;
    m.layout = "zero3";
    m.optimizer = "adamw";
    m.step = 10;
    m.loss_scale = 65536;
    m.good_steps = 3;
    m.kinds = {"param", "exp_avg"};
    m.tensors = {{"layers.0.weight", 64}, {"bias", 8}, {"empty", 0}};
    m.files = {{"rank-0.bin", 272, 0x0123456789abcdefull}, {"rank-1.bin", 288, 42}};
    using unison::dtype;
    m.ranges = {
        {0, 0, 0, 0, 32, dtype::f32, 0},   {1, 0, 0, 32, 32, dtype::f32, 0},
        {0, 0, 1, 0, 32, dtype::f32, 128}, {1, 0, 1, 32, 32, dtype::f32, 128},
        {0, 1, 0, 0, 8, dtype::bf16, 256}, {1, 1, 1, 0, 8, dtype::f32, 256},
    };
    return m;
}

/// A random byte string of 1..24 bytes: ASCII, spaces, UTF-8, control bytes, no '\n'.
std::string random_name(std::mt19937_64& rng) {
    static const std::vector<std::string> pieces = {"a",
                                                    "Z",
                                                    "0",
                                                    "9",
                                                    ".",
                                                    "_",
                                                    " ",
                                                    "  ",
                                                    "layers",
                                                    "weight",
                                                    "\xc3\xa9",
                                                    "\xe5\xb1\xa4",
                                                    "\xf0\x9f\x98\x80",
                                                    "\t",
                                                    "\r",
                                                    "\x01",
                                                    "\x7f",
                                                    "\xff",
                                                    "'",
                                                    "\\",
                                                    "/",
                                                    "range 0 0"};
    std::string name;
    const std::size_t n = 1 + rng() % 6;
    for (std::size_t i = 0; i < n; ++i) {
        name += pieces[rng() % pieces.size()];
    }
    return name;
}

/// Random valid metadata: random names, and ranges that tile every (tensor, kind)
/// pair in random pieces spread over the files in random dtypes, listed shuffled.
ck::metadata random_metadata(std::mt19937_64& rng, std::size_t max_tensors) {
    ck::metadata m;
    m.world_size = static_cast<std::uint32_t>(1 + rng() % 8);
    m.layout = rng() % 2 ? "zero3" : "fsdp_hybrid";
    m.optimizer = rng() % 2 ? "adamw" : "sgd";
    m.step = rng() % 3 == 0 ? rng() : rng() % 1000;
    const double scales[] = {1.0, 65536.0, 0.1, 1e-300, 1.7976931348623157e308, 3.0 / 7.0};
    m.loss_scale = rng() % 2 ? scales[rng() % 6] : std::ldexp(1.0 + double(rng() % 1000), -7);
    m.good_steps = rng() % 2000;
    m.version = rng() % 4 == 0 ? 2 : ck::format_version;
    const char* kinds[] = {"param", "exp_avg", "exp_avg_sq", "momentum", "master_f32"};
    const std::size_t n_kinds = 1 + rng() % 4;
    m.kinds.assign(kinds, kinds + n_kinds);

    const std::size_t n_files = 1 + rng() % 4;
    for (std::size_t f = 0; f < n_files; ++f) {
        m.files.push_back(
            {"rank-" + std::to_string(f) + (rng() % 2 ? ".bin" : " (copy).bin"), 0, rng()});
    }
    const std::size_t n_tensors = rng() % (max_tensors + 1);
    std::vector<std::uint64_t> cursor(n_files, 0);
    for (std::size_t t = 0; t < n_tensors; ++t) {
        const std::uint64_t numel = rng() % 5 == 0 ? 0 : 1 + rng() % 300;
        m.tensors.push_back({random_name(rng) + "#" + std::to_string(t), numel});
        for (std::size_t k = 0; k < n_kinds && numel > 0; ++k) {
            std::vector<std::uint64_t> cuts = {0, numel};
            for (std::size_t c = rng() % 4; c > 0; --c) {
                cuts.push_back(rng() % numel);
            }
            std::sort(cuts.begin(), cuts.end());
            cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
            for (std::size_t c = 0; c + 1 < cuts.size(); ++c) {
                const auto file = static_cast<std::uint32_t>(rng() % n_files);
                const unison::dtype type = unison::all_dtypes[rng() % 4];
                cursor[file] += rng() % 3 == 0 ? rng() % 8 : 0; // bytes no range uses
                m.ranges.push_back({file, static_cast<std::uint32_t>(t),
                                    static_cast<std::uint32_t>(k), cuts[c], cuts[c + 1] - cuts[c],
                                    type, cursor[file]});
                cursor[file] += (cuts[c + 1] - cuts[c]) * unison::size_of(type);
            }
        }
    }
    for (std::size_t f = 0; f < n_files; ++f) {
        m.files[f].bytes = cursor[f] + rng() % 16;
    }
    for (std::size_t t = 0; t < n_tensors && m.version >= 3 && m.step > 0; ++t) {
        if (rng() % 3 == 0) {
            m.tensor_steps.push_back({static_cast<std::uint32_t>(t), rng() % m.step});
        }
    }
    std::shuffle(m.ranges.begin(), m.ranges.end(), rng);
    return m;
}

void check_equal(const ck::metadata& a, const ck::metadata& b) {
    CHECK(a.version == b.version);
    CHECK(a.world_size == b.world_size);
    CHECK(a.layout == b.layout);
    CHECK(a.optimizer == b.optimizer);
    CHECK(a.step == b.step);
    CHECK(a.loss_scale == b.loss_scale);
    CHECK(a.good_steps == b.good_steps);
    CHECK(a.kinds == b.kinds);
    CHECK(a.tensor_steps == b.tensor_steps);
    REQUIRE(a.tensors.size() == b.tensors.size());
    for (std::size_t i = 0; i < a.tensors.size(); ++i) {
        CHECK(a.tensors[i].name == b.tensors[i].name);
        CHECK(a.tensors[i].numel == b.tensors[i].numel);
    }
    REQUIRE(a.files.size() == b.files.size());
    for (std::size_t i = 0; i < a.files.size(); ++i) {
        CHECK(a.files[i].name == b.files[i].name);
        CHECK(a.files[i].bytes == b.files[i].bytes);
        CHECK(a.files[i].checksum == b.files[i].checksum);
    }
    REQUIRE(a.ranges.size() == b.ranges.size());
    for (std::size_t i = 0; i < a.ranges.size(); ++i) {
        const ck::range_entry& x = a.ranges[i];
        const ck::range_entry& y = b.ranges[i];
        CHECK(x.file == y.file);
        CHECK(x.tensor == y.tensor);
        CHECK(x.kind == y.kind);
        CHECK(x.offset == y.offset);
        CHECK(x.count == y.count);
        CHECK(x.type == y.type);
        CHECK(x.file_offset == y.file_offset);
    }
    CHECK(a == b);
}

/// A directory under the system's temporary directory, removed with its content.
struct temporary_directory {
    std::filesystem::path path;
    temporary_directory() {
        std::random_device random;
        path = std::filesystem::temp_directory_path() /
               ("unison-checkpoint-test-" + std::to_string(::getpid()) + "-" +
                std::to_string(random()));
        std::filesystem::create_directories(path);
    }
    temporary_directory(const temporary_directory&) = delete;
    temporary_directory& operator=(const temporary_directory&) = delete;
    ~temporary_directory() {
        std::error_code ignored;
        std::filesystem::remove_all(path, ignored);
    }
};

/// A doctest matcher for messages holding `s`.
doctest::Contains contains(const std::string& s) {
    return doctest::Contains(s.c_str());
}

std::span<const std::byte> bytes_of(const std::string& s) {
    return std::as_bytes(std::span(s));
}

} // namespace

TEST_CASE("checkpoint error: what() reads 'unison: checkpoint: FILE: PROBLEM'") {
    const unison::checkpoint_error e("ckpt/rank-3.bin", "checksum mismatch (corrupted)");
    CHECK(std::string(e.what()) ==
          "unison: checkpoint: ckpt/rank-3.bin: checksum mismatch (corrupted)");
    CHECK(e.file() == "ckpt/rank-3.bin");
    CHECK(e.problem() == "checksum mismatch (corrupted)");
    CHECK(e.rank() == -1);
    CHECK(e.operation() == "checkpoint");
}

TEST_CASE("checkpoint format: fnv1a64 matches the reference values") {
    const auto fnv = [](std::string_view v) { return ck::fnv1a64(v.data(), v.size()); };
    CHECK(fnv("") == 0xcbf29ce484222325ull);
    CHECK(fnv("a") == 0xaf63dc4c8601ec8cull);
    CHECK(fnv("foobar") == 0x85944171f73967e8ull);
    CHECK(ck::checksum(1, "foobar", 6) == fnv("foobar")); // format version 1's checksum
    // In pieces, continuing from the previous result.
    CHECK(ck::fnv1a64("bar", 3, fnv("foo")) == fnv("foobar"));
    const std::string s = "foobar";
    CHECK(ck::fnv1a64(bytes_of(s)) == fnv("foobar"));
}

TEST_CASE("checkpoint format: version 2's checksum is XXH3-64, as xxHash's own tools give it") {
    // Reference values from the python-xxhash package (its own copy of xxHash).
    CHECK(hash("") == 0x2d06800538d394c2ull);
    CHECK(hash("a") == 0xe6c632b61e964e1full);
    CHECK(hash("foobar") == 0xd78fda63144c5c84ull);
    std::string cycle;
    for (int k = 0; k < 5; ++k) {
        for (int b = 0; b < 256; ++b) {
            cycle += static_cast<char>(b);
        }
    }
    CHECK(hash(cycle) == 0x4844b009e164352eull); // 1280 bytes: XXH3's long-input path
    CHECK(unison::detail::xxh3_64("foobar", 6, 7) == 0xe49fd0d4b811b2afull);
}

TEST_CASE("checkpoint format: version 1 (FNV-1a checksums) still parses") {
    std::string v2 = ck::serialize(small());
    std::string body = "unison-checkpoint 1\n" + body_of(v2).substr(body_of(v2).find('\n') + 1);
    const std::string v1 = body + "checksum " + hex16(ck::fnv1a64(body.data(), body.size())) + "\n";
    ck::metadata m = ck::parse(v1, "metadata");
    CHECK(m.version == 1);
    m.version = 2;
    check_equal(m, small());
    // ... and its checksum is FNV-1a's: XXH3's is refused
    CHECK_THROWS_WITH_AS(ck::parse(body + "checksum " + hex16(hash(body)) + "\n", "metadata"),
                         doctest::Contains("checksum mismatch"), unison::checkpoint_error);
}

TEST_CASE("checkpoint format: serialize writes the documented text") {
    const std::string body = "unison-checkpoint 2\n"
                             "world_size 2\n"
                             "layout zero3\n"
                             "optimizer adamw\n"
                             "step 10\n"
                             "loss_scale 65536\n"
                             "good_steps 3\n"
                             "kinds 2\n"
                             "kind param\n"
                             "kind exp_avg\n"
                             "tensors 3\n"
                             "tensor 64 15 layers.0.weight\n"
                             "tensor 8 4 bias\n"
                             "tensor 0 5 empty\n"
                             "files 2\n"
                             "file 272 0123456789abcdef 10 rank-0.bin\n"
                             "file 288 000000000000002a 10 rank-1.bin\n"
                             "ranges 6\n"
                             "range 0 0 0 0 32 float 0\n"
                             "range 1 0 0 32 32 float 0\n"
                             "range 0 0 1 0 32 float 128\n"
                             "range 1 0 1 32 32 float 128\n"
                             "range 0 1 0 0 8 bfloat16 256\n"
                             "range 1 1 1 0 8 float 256\n";
    CHECK(ck::serialize(small()) == seal(body));
    check_equal(ck::parse(seal(body), "metadata"), small());

    ck::metadata m = small();
    m.loss_scale = 0.1; // %.17g: every digit needed to read back the same double
    CHECK(ck::serialize(m).find("\nloss_scale 0.10000000000000001\n") != std::string::npos);
}

TEST_CASE("checkpoint format: version 3 lists the tensors that took fewer steps") {
    ck::metadata m = small();
    m.version = 3;
    m.tensor_steps = {{0, 7}, {1, 0}};
    const std::string text = ck::serialize(m);
    // Version 2's text but for the header and the lines after the tensors.
    std::vector<std::string> expected = body_lines(ck::serialize(small()));
    expected[0] = "unison-checkpoint 3";
    expected.insert(expected.begin() + 14,
                    {"tensor_steps 2", "tensor_step 0 7", "tensor_step 1 0"});
    CHECK(text == sealed(expected));
    check_equal(ck::parse(text, "metadata"), m);
    m.tensor_steps.clear(); // none: a count of 0
    CHECK(ck::serialize(m).find("\ntensor_steps 0\nfiles 2\n") != std::string::npos);
    check_equal(ck::parse(ck::serialize(m), "metadata"), m);

    m.tensor_steps = {{3, 1}};
    CHECK_INVALID(m, "tensor_step 0 names tensor 3 of 3");
    m.tensor_steps = {{1, 2}, {1, 3}};
    CHECK_INVALID(m, "tensor_step 1 names tensor 1 after tensor 1", "increasing");
    m.tensor_steps = {{1, 2}, {0, 3}};
    CHECK_INVALID(m, "tensor_step 1 names tensor 0 after tensor 1");
    m.tensor_steps = {{1, 10}};
    CHECK_INVALID(m, "tensor_step 0: tensor 'bias' took 10 steps, not fewer than the "
                     "checkpoint's 10");
    m.version = 2; // version 2 has no such lines
    m.tensor_steps = {{1, 2}};
    CHECK(says(invalidity(m), {"tensor_step lines in format version 2"}));

    m = small();
    m.version = 3;
    m.tensor_steps = {{0, 7}};
    std::vector<std::string> lines = body_lines(ck::serialize(m));
    CHECK(lines[14] == "tensor_steps 1");
    lines[15] = "tensor_step 0";
    CHECK_REJECTED(sealed(lines), "line 16: expected 'tensor_step <tensor> <steps>'");
    lines[15] = "tensor_step 0 -7";
    CHECK_REJECTED(sealed(lines), "line 16: steps '-7' is not a decimal number");
    lines[14] = "tensor_steps 2";
    lines[15] = "tensor_step 0 7";
    CHECK_REJECTED(sealed(lines), "line 17: expected 'tensor_step <tensor> <steps>'", "'files 2'");
    lines.erase(lines.begin() + 14, lines.begin() + 16); // version 3 without the section
    CHECK_REJECTED(sealed(lines), "line 15: expected 'tensor_steps <count>'", "'files 2'");
}

TEST_CASE("checkpoint format: random metadata round-trips exactly") {
    std::mt19937_64 rng(20240611);
    for (int i = 0; i < 200; ++i) {
        CAPTURE(i);
        const ck::metadata m = random_metadata(rng, 12);
        REQUIRE(invalidity(m) == "(accepted)");
        const std::string text = ck::serialize(m);
        const ck::metadata back = ck::parse(text, "metadata");
        check_equal(back, m);
        CHECK(ck::serialize(back) == text);
    }
}

TEST_CASE("checkpoint format: accepted layouts") {
    SUBCASE("ranges in any order") {
        ck::metadata m = small();
        std::reverse(m.ranges.begin(), m.ranges.end());
        check_equal(ck::parse(ck::serialize(m), "metadata"), m);
    }
    SUBCASE("a tensor with numel 0 and no tensors, files or ranges at all") {
        ck::metadata m = small();
        m.ranges.clear();
        m.tensors = {{"empty", 0}};
        check_equal(ck::parse(ck::serialize(m), "metadata"), m);
        m.tensors.clear();
        m.files.clear();
        check_equal(ck::parse(ck::serialize(m), "metadata"), m);
    }
    SUBCASE("file bytes that no range uses, between and after the ranges") {
        ck::metadata m = small();
        m.files[0].bytes += 100;
        m.ranges[4].file_offset += 7;
        check_equal(ck::parse(ck::serialize(m), "metadata"), m);
    }
    SUBCASE("loss_scale spelled otherwise than %.17g") {
        std::vector<std::string> lines = body_lines(ck::serialize(small()));
        lines[5] = "loss_scale 6.5536e4";
        CHECK(ck::parse(sealed(lines), "metadata").loss_scale == 65536.0);
    }
}

TEST_CASE("checkpoint format: 100000 ranges validate in O(R log R)") {
    // Quadratic validation would take minutes here.
    ck::metadata m = small();
    constexpr std::uint64_t n = 100000;
    m.kinds = {"param"};
    m.tensors = {{"big", 2 * n}};
    m.files = {{"rank-0.bin", 8 * n, 0}};
    m.ranges.clear();
    for (std::uint64_t i = 0; i < n; ++i) {
        m.ranges.push_back({0, 0, 0, 2 * i, 2, unison::dtype::f32, 8 * i});
    }
    std::shuffle(m.ranges.begin(), m.ranges.end(), std::mt19937_64(7));
    CHECK(invalidity(m) == "(accepted)");
    CHECK(ck::parse(ck::serialize(m), "metadata").ranges.size() == n);
}

TEST_CASE("checkpoint format: rejects what is not a whole metadata file") {
    const std::string good = ck::serialize(small());
    CHECK_REJECTED("", "line 1: expected 'unison-checkpoint 3'", "not a unison checkpoint");
    CHECK_REJECTED("hello\n", "line 1: expected 'unison-checkpoint 3'", "'hello'");
    CHECK_REJECTED("unison-checkpoint 4\n" + good.substr(good.find('\n') + 1),
                   "unsupported version 4", "reads versions 1 to 3");
    CHECK_REJECTED("unison-checkpoint 0\n" + good.substr(good.find('\n') + 1),
                   "unsupported version 0", "reads versions 1 to 3");
    CHECK_REJECTED("unison-checkpoint 02\n" + good.substr(good.find('\n') + 1),
                   "line 1: expected 'unison-checkpoint 3'");
    CHECK_REJECTED(good.substr(0, good.size() - 1), "newline", "truncated?");
    // Truncated after a whole line: the last line is not the checksum.
    const std::string half = good.substr(0, good.find("files"));
    CHECK_REJECTED(half, "line 14: expected 'checksum <16 hex digits>' as the last line",
                   "truncated?");
    CHECK_REJECTED("unison-checkpoint 2\n", "line 1: expected 'checksum <16 hex digits>'");
    // Anything after the checksum line.
    CHECK_REJECTED(good + "step 11\n", "line 26: expected 'checksum <16 hex digits>'");
    CHECK_REJECTED(good + "\n", "line 26: expected 'checksum <16 hex digits>'");
    // A checksum line that is not 16 lowercase hex digits.
    const std::string body = body_of(good);
    CHECK_REJECTED(body + "checksum " + hex16(hash(body)).substr(1) + "\n",
                   "line 25: expected 'checksum <16 hex digits>'");
    std::string upper = hex16(hash(body));
    std::transform(upper.begin(), upper.end(), upper.begin(),
                   [](char c) { return static_cast<char>(std::toupper(c)); });
    if (upper != hex16(hash(body))) {
        CHECK_REJECTED(body + "checksum " + upper + "\n", "expected 'checksum <16 hex digits>'");
    }
}

TEST_CASE("checkpoint format: rejects modified metadata by its checksum") {
    std::string text = ck::serialize(small());
    text[text.find("step 10") + 6] = '9';
    CHECK_REJECTED(text, "checksum mismatch: metadata was modified or truncated");
    std::vector<std::string> lines = body_lines(ck::serialize(small()));
    lines.erase(lines.begin() + 20); // a range, and the checksum line kept as it was
    const std::string stale = ck::serialize(small());
    CHECK_REJECTED(body_of(sealed(lines)) + stale.substr(stale.rfind("checksum")),
                   "checksum mismatch");
}

TEST_CASE("checkpoint format: rejects missing, extra and garbled lines by line number") {
    const std::vector<std::string> good = body_lines(ck::serialize(small()));
    const auto with = [&](std::size_t index, const std::string& line) {
        std::vector<std::string> lines = good;
        lines[index] = line;
        return sealed(lines);
    };
    const auto without = [&](std::size_t index) {
        std::vector<std::string> lines = good;
        lines.erase(lines.begin() + static_cast<std::ptrdiff_t>(index));
        return sealed(lines);
    };
    const auto inserted = [&](std::size_t index, const std::string& line) {
        std::vector<std::string> lines = good;
        lines.insert(lines.begin() + static_cast<std::ptrdiff_t>(index), line);
        return sealed(lines);
    };

    CHECK_REJECTED(without(4), "line 5: expected 'step <count>'", "'loss_scale 65536'");
    CHECK_REJECTED(with(14, "file 2"), "line 15: expected 'files <count>'", "'file 2'");
    CHECK_REJECTED(with(1, "world_size four"), "line 2: world_size 'four' is not a decimal number");
    CHECK_REJECTED(with(1, "worldsize 2"), "line 2: expected 'world_size <ranks>'");
    CHECK_REJECTED(with(2, "layout"), "line 3: expected 'layout <word>'");
    CHECK_REJECTED(with(2, "layout zero 3"), "line 3: expected 'layout <word>'");
    CHECK_REJECTED(with(4, "step  10"), "line 5: expected 'step <count>'");
    CHECK_REJECTED(with(4, "step 10 "), "line 5: expected 'step <count>'");
    CHECK_REJECTED(with(4, " step 10"), "line 5: expected 'step <count>'");
    CHECK_REJECTED(with(4, "step 10\r"), "line 5: step '10\\x0d' is not a decimal number");
    CHECK_REJECTED(with(4, "step "), "line 5: expected 'step <count>'");
    // Entries beyond or short of their count.
    CHECK_REJECTED(inserted(10, "kind momentum"), "line 11: expected 'tensors <count>'",
                   "'kind momentum'");
    CHECK_REJECTED(with(7, "kinds 3"), "line 11: expected 'kind <word>'", "'tensors 3'",
                   "says 3 kind lines; this is number 3");
    CHECK_REJECTED(with(7, "kinds 1"), "line 10: expected 'tensors <count>'", "'kind exp_avg'");
    CHECK_REJECTED(with(17, "ranges 7"), "line 25: expected 'range <file> <tensor> <kind>",
                   "found the end of the metadata", "says 7 range lines; this is number 7");
    CHECK_REJECTED(with(17, "ranges 5"), "line 24: expected 'checksum <16 hex digits>' after the "
                                         "last range");
    CHECK_REJECTED(inserted(24, "range 0 2 0 0 1 float 0"), "after the last range");
    CHECK_REJECTED(inserted(18, good[18]), "after the last range");
    CHECK_REJECTED(with(11, "tensor 64 15"), "line 12: expected 'tensor <numel> <name-length>");
    CHECK_REJECTED(with(18, "range 0 0 0 0 32 float"), "line 19: expected 'range <file>");
    CHECK_REJECTED(with(18, "range 0 0 0 0 32 float 0 0"), "line 19: expected 'range <file>");
    // Swapped sections.
    std::vector<std::string> swapped = good;
    std::swap(swapped[2], swapped[3]);
    CHECK_REJECTED(sealed(swapped), "line 3: expected 'layout <word>'", "'optimizer adamw'");
}

TEST_CASE("checkpoint format: rejects huge counts without allocating for them") {
    const std::vector<std::string> good = body_lines(ck::serialize(small()));
    const auto with = [&](std::size_t index, const std::string& line) {
        std::vector<std::string> lines = good;
        lines[index] = line;
        return sealed(lines);
    };
    CHECK_REJECTED(with(7, "kinds 18446744073709551615"), "line 11: expected 'kind <word>'");
    CHECK_REJECTED(with(10, "tensors 18446744073709551615"), "line 15: expected 'tensor <numel>");
    CHECK_REJECTED(with(14, "files 18446744073709551615"), "line 18: expected 'file <bytes>");
    CHECK_REJECTED(with(17, "ranges 18446744073709551615"), "line 25: expected 'range <file>",
                   "found the end of the metadata");
    CHECK_REJECTED(with(17, "ranges 18446744073709551616"), "line 18: ranges",
                   "is not a decimal number");
}

TEST_CASE("checkpoint format: rejects numbers that are not plain unsigned decimals") {
    const std::vector<std::string> good = body_lines(ck::serialize(small()));
    const auto step = [&](const std::string& value) {
        std::vector<std::string> lines = good;
        lines[4] = "step " + value;
        return sealed(lines);
    };
    for (const char* bad : {"-1", "+5", "18446744073709551616", "99999999999999999999", "5x",
                            "0x10", "05", "1e3", "1.0", "\xef\xbc\x95"}) {
        CAPTURE(bad);
        CHECK_REJECTED(step(bad), "line 5: step '",
                       "is not a decimal number in [0, "
                       "18446744073709551615]");
    }
    CHECK(ck::parse(step("18446744073709551615"), "m").step == u64_max);
    CHECK(ck::parse(step("0"), "m").step == 0);

    std::vector<std::string> lines = good;
    lines[1] = "world_size 4294967296";
    CHECK_REJECTED(sealed(lines), "line 2: world_size '4294967296'", "[0, 4294967295]");
    lines = good;
    lines[18] = "range 0 0 0 -0 32 float 0";
    CHECK_REJECTED(sealed(lines), "line 19: offset '-0'");
    lines = good;
    lines[18] = "range 0 4294967296 0 0 32 float 0";
    CHECK_REJECTED(sealed(lines), "line 19: tensor '4294967296'");
    lines = good;
    lines[11] = "tensor 64 +15 layers.0.weight";
    CHECK_REJECTED(sealed(lines), "line 12: name length '+15'");
    lines = good;
    lines[15] = "file 272 0123456789ABCDEF 10 rank-0.bin";
    CHECK_REJECTED(sealed(lines), "line 16: checksum '0123456789ABCDEF'",
                   "16 lowercase hexadecimal digits");
    lines = good;
    lines[15] = "file 272 123456789abcdef 10 rank-0.bin";
    CHECK_REJECTED(sealed(lines), "line 16: checksum '123456789abcdef'");
}

TEST_CASE("checkpoint format: rejects a bad loss_scale") {
    std::vector<std::string> lines = body_lines(ck::serialize(small()));
    for (const char* bad : {"abc", "", "1e999", "0x1p4", "1,5", "+1"}) {
        CAPTURE(bad);
        lines[5] = std::string("loss_scale ") + bad;
        const std::string what = rejection(sealed(lines));
        INFO(what);
        CHECK(what.find("line 6: ") != std::string::npos);
    }
    for (const char* bad : {"0", "-1", "nan", "inf", "-inf", "-0"}) {
        CAPTURE(bad);
        lines[5] = std::string("loss_scale ") + bad;
        CHECK_REJECTED(sealed(lines), "loss_scale", "is not positive and finite");
    }
    ck::metadata m = small();
    m.loss_scale = std::numeric_limits<double>::infinity();
    CHECK_INVALID(m, "loss_scale inf is not positive and finite");
}

TEST_CASE("checkpoint format: rejects unknown and non-floating dtypes") {
    std::vector<std::string> lines = body_lines(ck::serialize(small()));
    for (const char* bad : {"float128", "f32", "Float", "", "fp8"}) {
        CAPTURE(bad);
        lines[18] = std::string("range 0 0 0 0 32 ") + bad + " 0";
        const std::string what = rejection(sealed(lines));
        INFO(what);
        CHECK(what.find("line 19: ") != std::string::npos);
        if (*bad != '\0') {
            CHECK(what.find("is not one of double, float, half or bfloat16") != std::string::npos);
        }
    }
    // Integer dtypes parse and are refused, uint32 and uint64 (newer than the format) too.
    for (const std::string name : {"int32", "uint32", "uint64"}) {
        CAPTURE(name);
        lines[18] = "range 0 0 0 0 32 " + name + " 0";
        CHECK_REJECTED(sealed(lines), "range 0 of tensor 'layers.0.weight' kind 'param'",
                       "dtype " + name, "floating dtypes only");
    }
    ck::metadata m = small();
    m.ranges[4].type = unison::dtype::u8;
    CHECK_INVALID(m, "range 4 of tensor 'bias' kind 'param' has dtype uint8");
    m.ranges[4].type = unison::dtype::u64;
    CHECK_INVALID(m, "range 4 of tensor 'bias' kind 'param' has dtype uint64");
    m.ranges[4].type = static_cast<unison::dtype>(200); // not a dtype at all
    CHECK(says(invalidity(m), {"range 4", "floating dtypes only"}));
    // Every floating dtype is accepted, by the name to_string gives it.
    for (unison::dtype t : {unison::dtype::f64, unison::dtype::f16, unison::dtype::bf16}) {
        m = small();
        m.files[1].bytes = 1000;
        m.ranges[5].type = t;
        check_equal(ck::parse(ck::serialize(m), "metadata"), m);
    }
}

TEST_CASE("checkpoint format: rejects indices out of range") {
    ck::metadata m = small();
    m.ranges[3].file = 2;
    CHECK_INVALID(m, "range 3 names file 2 of 2");
    m = small();
    m.ranges[3].tensor = 3;
    CHECK_INVALID(m, "range 3 names tensor 3 of 3");
    m = small();
    m.ranges[3].kind = 4294967295u;
    CHECK_INVALID(m, "range 3 names kind 4294967295 of 2");
}

TEST_CASE("checkpoint format: rejects duplicate and malformed names") {
    ck::metadata m = small();
    m.tensors[2].name = "layers.0.weight";
    CHECK_INVALID(m, "duplicate tensor name 'layers.0.weight' (tensors 0 and 2)");
    m = small();
    m.files[1].name = "rank-0.bin";
    CHECK_INVALID(m, "duplicate file name 'rank-0.bin' (files 0 and 1)");
    m = small();
    m.kinds.push_back("param");
    CHECK(says(invalidity(m), {"duplicate kind name 'param' (kinds 0 and 2)"}));
    m = small();
    m.tensors[1].name.clear();
    CHECK_INVALID(m, "tensor 1 has an empty name");
    m = small();
    m.tensors[1].name = "a\nb";
    CHECK(says(invalidity(m), {"tensor 1 name 'a\\x0ab' contains a newline"}));
    for (const char* bad : {"", ".", "..", "../rank-1.bin", "sub/rank-1.bin", "/etc/passwd"}) {
        CAPTURE(bad);
        m = small();
        m.files[1].name = bad;
        CHECK_INVALID(m, "file 1 name", "is not a file name inside the checkpoint directory");
    }
    m = small();
    m.files[1].name = std::string("a\0b", 3);
    CHECK_INVALID(m, "file 1 name 'a\\x00b'");
    m = small();
    m.layout = "zero 3";
    CHECK(says(invalidity(m), {"layout 'zero 3' is not a word"}));
    m.layout = "";
    CHECK(says(invalidity(m), {"layout '' is not a word"}));
    m = small();
    m.optimizer = "adam-w";
    CHECK_INVALID(m, "optimizer 'adam-w' is not a word");
    m = small();
    m.kinds[1] = "exp.avg";
    CHECK_INVALID(m, "kind 1 'exp.avg' is not a word");
    m = small();
    m.kinds.clear();
    m.ranges.clear();
    CHECK_INVALID(m, "no kinds");
    m = small();
    m.world_size = 0;
    CHECK_INVALID(m, "world_size is 0");
    m = small();
    m.version = 4;
    CHECK(says(invalidity(m), {"unsupported version 4"}));
    m.version = 0;
    CHECK(says(invalidity(m), {"unsupported version 0"}));

    // A name's length field must match the name.
    std::vector<std::string> lines = body_lines(ck::serialize(small()));
    lines[11] = "tensor 64 14 layers.0.weight";
    CHECK_REJECTED(sealed(lines), "line 12: the name is 15 bytes but its length field says 14");
    lines[11] = "tensor 64 16 layers.0.weight";
    CHECK_REJECTED(sealed(lines), "line 12: the name is 15 bytes but its length field says 16");
    // Names keep their spaces and odd bytes, and error messages escape them.
    m = small();
    m.tensors[0].name = " lay ers\t'0'\xe5\xb1\xa4 ";
    check_equal(ck::parse(ck::serialize(m), "metadata"), m);
    m.ranges[1].offset = 31;
    CHECK_INVALID(m, "range 1 of tensor ' lay ers\\x09\\x270\\x27\xe5\xb1\xa4 ' kind 'param'");
}

TEST_CASE("checkpoint format: rejects ranges outside their tensor or file") {
    ck::metadata m = small();
    m.ranges[1].offset = u64_max;
    CHECK_INVALID(m, "range 1 of tensor 'layers.0.weight' kind 'param': offset "
                     "18446744073709551615 + count 32 overflows");
    m = small();
    m.ranges[1].count = 33;
    CHECK_INVALID(m, "range 1 of tensor 'layers.0.weight' kind 'param' ends at element 65, past "
                     "the tensor's 64 elements");
    m = small();
    m.ranges.push_back({0, 2, 0, 0, 1, unison::dtype::f32, 268});
    CHECK_INVALID(m, "range 6 of tensor 'empty' kind 'param' ends at element 1, past the "
                     "tensor's 0 elements");
    m = small();
    m.ranges[1].count = 0;
    CHECK_INVALID(m, "range 1 of tensor 'layers.0.weight' kind 'param' is empty (count 0)");

    m = small();
    m.ranges[5].file_offset = u64_max - 16;
    CHECK_INVALID(m, "range 5 of tensor 'bias' kind 'exp_avg': file_offset", "overflows");
    m = small();
    m.ranges[5].file_offset = 257;
    CHECK_INVALID(m, "range 5 of tensor 'bias' kind 'exp_avg' needs bytes [257, 289) of file "
                     "'rank-1.bin', which has 288 bytes");
    m = small();
    m.files[0].bytes = 271;
    CHECK_INVALID(m, "range 4 of tensor 'bias' kind 'param' needs bytes [256, 272) of file "
                     "'rank-0.bin', which has 271 bytes");
    // count * size_of(dtype) itself overflows.
    m = small();
    m.tensors[0].numel = u64_max;
    m.ranges[1].count = (u64_max >> 2) + 1;
    CHECK_INVALID(m, "range 1 of tensor 'layers.0.weight' kind 'param': count",
                  "* 4 bytes "
                  "overflows");
}

TEST_CASE("checkpoint format: rejects ranges that overlap or leave gaps") {
    ck::metadata m = small();
    // Elements [16, 64) of param in file 1, overlapping range 0's [0, 32).
    m.ranges[1].offset = 16;
    m.ranges[1].count = 48;
    m.files[1].bytes = 1000;
    m.ranges[1].file_offset = 400;
    CHECK_INVALID(m, "range 1 of tensor 'layers.0.weight' kind 'param' overlaps range 0",
                  "elements [16, 32)");
    // The same range listed twice.
    m = small();
    m.ranges.push_back(m.ranges[3]);
    m.ranges.back().file_offset = 288;
    m.files[1].bytes = 416;
    CHECK_INVALID(m, "range 6 of tensor 'layers.0.weight' kind 'exp_avg' overlaps range 3");

    m = small();
    m.ranges.erase(m.ranges.begin() + 1);
    CHECK_INVALID(m, "tensor 'layers.0.weight' kind 'param' elements [32, 64) are covered by no "
                     "range");
    m = small();
    m.ranges[0].count = 16;
    CHECK_INVALID(m, "tensor 'layers.0.weight' kind 'param' elements [16, 32) are covered by no "
                     "range");
    m = small();
    m.ranges[2].offset = 1;
    m.ranges[2].count = 31;
    CHECK_INVALID(m, "tensor 'layers.0.weight' kind 'exp_avg' elements [0, 1) are covered by no "
                     "range");
    m = small();
    m.ranges.erase(m.ranges.begin() + 5);
    CHECK_INVALID(m, "tensor 'bias' kind 'exp_avg' elements [0, 8) are covered by no range");
    m = small();
    m.tensors[1].numel = 9;
    CHECK_INVALID(m, "tensor 'bias' kind 'param' elements [8, 9) are covered by no range");

    // Two ranges sharing bytes of one file.
    m = small();
    m.ranges[4].file_offset = 100;
    CHECK_INVALID(m, "range 4 of tensor 'bias' kind 'param' shares bytes of file 'rank-0.bin' "
                     "with range 0 of tensor 'layers.0.weight' kind 'param'");
}

TEST_CASE("checkpoint io: durable write, verified read, and what a damaged file says") {
    temporary_directory dir;
    const std::filesystem::path path = dir.path / "rank-0.bin";
    std::string content(100000, '\0');
    std::mt19937_64 rng(3);
    for (char& c : content) {
        c = static_cast<char>(rng());
    }
    const std::uint64_t checksum = hash(content);

    ck::write_file_durably(path, bytes_of(content));
    CHECK_FALSE(std::filesystem::exists(dir.path / "rank-0.bin.tmp"));
    const std::vector<std::byte> back = ck::read_verified(path, content.size(), checksum);
    CHECK(std::equal(back.begin(), back.end(), bytes_of(content).begin(), bytes_of(content).end()));

    // Overwriting replaces the whole file; an empty file round-trips too.
    ck::write_file_durably(path, bytes_of("short"));
    CHECK(ck::read_verified(path, 5, hash("short")).size() == 5);
    ck::write_file_durably(dir.path / "empty", {});
    CHECK(ck::read_verified(dir.path / "empty", 0, hash("")).empty());
    ck::write_file_durably(path, bytes_of(content));

    const std::string name = path.string();
    SUBCASE("truncated") {
        std::filesystem::resize_file(path, content.size() - 1);
        CHECK_THROWS_WITH_AS(ck::read_verified(path, content.size(), checksum),
                             contains(name + ": is 99999 bytes, the metadata says 100000 "
                                             "(truncated?)"),
                             unison::checkpoint_error);
    }
    SUBCASE("longer") {
        CHECK_THROWS_WITH_AS(ck::read_verified(path, content.size() - 1, checksum),
                             contains(name + ": is 100000 bytes"), unison::checkpoint_error);
    }
    SUBCASE("a flipped byte") {
        content[54321] = static_cast<char>(content[54321] ^ 0x10);
        ck::write_file_durably(path, bytes_of(content));
        CHECK_THROWS_WITH_AS(ck::read_verified(path, content.size(), checksum),
                             contains(name + ": checksum mismatch (corrupted)"),
                             unison::checkpoint_error);
    }
    SUBCASE("missing") {
        std::filesystem::remove(path);
        CHECK_THROWS_WITH_AS(ck::read_file(path),
                             contains(name + ": missing (the checkpoint is incomplete)"),
                             unison::checkpoint_error);
        CHECK_THROWS_WITH_AS(ck::read_verified(path, 0, 0), contains("incomplete"),
                             unison::checkpoint_error);
    }
    SUBCASE("a directory") {
        CHECK_THROWS_WITH_AS(ck::read_file(dir.path), contains("is not a regular file"),
                             unison::checkpoint_error);
    }
    SUBCASE("a FIFO is refused at once, not waited on") {
        // Opening a FIFO for reading blocks until a writer comes; read_file must not
        // wait for one. Should it block, the test says so after 10 s and opens the
        // FIFO for writing itself to let it go, so that it fails instead of hanging.
        const std::filesystem::path fifo = dir.path / "rank-0.bin.fifo";
        REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
        std::promise<std::string> result;
        std::future<std::string> done = result.get_future();
        std::thread reader([&] {
            try {
                (void)ck::read_file(fifo);
                result.set_value("read_file returned");
            } catch (const unison::checkpoint_error& e) {
                result.set_value(e.what());
            }
        });
        const bool blocked = done.wait_for(std::chrono::seconds(10)) != std::future_status::ready;
        if (blocked) {
            const int w = ::open(fifo.c_str(), O_WRONLY);
            if (w >= 0) {
                ::close(w);
            }
        }
        reader.join();
        CHECK_FALSE(blocked);
        const std::string what = done.get();
        INFO("read_file said: ", what);
        CHECK(what.find("is not a regular file") != std::string::npos);
    }
    SUBCASE("writing into a directory that does not exist") {
        const std::filesystem::path nowhere = dir.path / "no-such-dir" / "rank-0.bin";
        CHECK_THROWS_WITH_AS(ck::write_file_durably(nowhere, bytes_of(content)),
                             contains(nowhere.string() +
                                      ": cannot create the temporary file "
                                      "'rank-0.bin.tmp': No such file or directory"),
                             unison::checkpoint_error);
    }
    SUBCASE("renaming over a directory fails and removes the temporary file") {
        std::filesystem::create_directory(dir.path / "taken");
        std::filesystem::create_directory(dir.path / "taken" / "child");
        CHECK_THROWS_WITH_AS(ck::write_file_durably(dir.path / "taken", bytes_of(content)),
                             contains("rename to 'taken' of 'taken.tmp' failed"),
                             unison::checkpoint_error);
        CHECK_FALSE(std::filesystem::exists(dir.path / "taken.tmp"));
    }
    SUBCASE("fsync of a directory") {
        CHECK_NOTHROW(ck::fsync_directory(dir.path));
        CHECK_NOTHROW(ck::fsync_directory(""));
        CHECK_THROWS_WITH_AS(ck::fsync_directory(dir.path / "missing"),
                             contains("cannot open the directory to fsync it"),
                             unison::checkpoint_error);
    }
}

TEST_CASE("checkpoint io: the metadata file round-trips through the disk") {
    temporary_directory dir;
    std::mt19937_64 rng(11);
    const ck::metadata m = random_metadata(rng, 20);
    const std::string text = ck::serialize(m);
    ck::write_file_durably(dir.path / "metadata", bytes_of(text));
    const std::vector<std::byte> bytes = ck::read_file(dir.path / "metadata");
    const std::string back(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    check_equal(ck::parse(back, (dir.path / "metadata").string()), m);
}

namespace {

/// One random change to `text`: a byte flipped, inserted or deleted, a truncation, a
/// line duplicated, deleted or swapped, or a number replaced by an edge value.
void mutate(std::string& text, std::mt19937_64& rng) {
    const auto at = [&](std::size_t size) { return size == 0 ? 0 : rng() % size; };
    const auto split = [&] {
        std::vector<std::string> lines;
        for (std::size_t pos = 0; pos < text.size();) {
            std::size_t end = text.find('\n', pos);
            end = end == std::string::npos ? text.size() : end + 1;
            lines.push_back(text.substr(pos, end - pos)); // with its '\n', if any
            pos = end;
        }
        return lines;
    };
    const auto join = [&](const std::vector<std::string>& lines) {
        text.clear();
        for (const std::string& line : lines) {
            text += line;
        }
    };
    switch (rng() % 10) {
    case 0:
        if (!text.empty()) {
            text[at(text.size())] ^= static_cast<char>(1u << (rng() % 8));
        }
        break;
    case 1: {
        const char interesting[] = {' ', '\n', '0', '1', '9', '-', '+', 'x', '\0', '\xff'};
        const char c =
            rng() % 2 ? interesting[rng() % sizeof interesting] : static_cast<char>(rng());
        text.insert(text.begin() + static_cast<std::ptrdiff_t>(at(text.size() + 1)), c);
        break;
    }
    case 2:
        if (!text.empty()) {
            text.erase(at(text.size()), 1);
        }
        break;
    case 3:
        text.resize(at(text.size() + 1));
        break;
    case 4: {
        std::vector<std::string> lines = split();
        if (!lines.empty()) {
            const std::size_t i = at(lines.size());
            lines.insert(lines.begin() + static_cast<std::ptrdiff_t>(at(lines.size() + 1)),
                         lines[i]);
            join(lines);
        }
        break;
    }
    case 5: {
        std::vector<std::string> lines = split();
        if (!lines.empty()) {
            lines.erase(lines.begin() + static_cast<std::ptrdiff_t>(at(lines.size())));
            join(lines);
        }
        break;
    }
    case 6: {
        std::vector<std::string> lines = split();
        if (!lines.empty()) {
            std::swap(lines[at(lines.size())], lines[at(lines.size())]);
            join(lines);
        }
        break;
    }
    default: {
        // A number (a whole space- or newline-separated run of digits) replaced.
        std::vector<std::pair<std::size_t, std::size_t>> numbers;
        for (std::size_t pos = 0; pos < text.size();) {
            std::size_t end = text.find_first_of(" \n", pos);
            end = end == std::string::npos ? text.size() : end;
            if (end > pos && std::all_of(text.begin() + static_cast<std::ptrdiff_t>(pos),
                                         text.begin() + static_cast<std::ptrdiff_t>(end),
                                         [](char c) { return c >= '0' && c <= '9'; })) {
                numbers.emplace_back(pos, end - pos);
            }
            pos = end + 1;
        }
        if (numbers.empty()) {
            break;
        }
        static const char* const edges[] = {"0",
                                            "-1",
                                            "18446744073709551615",
                                            "18446744073709551616",
                                            "99999999999999999999",
                                            "4294967295",
                                            "4294967296",
                                            "1e308",
                                            "nan",
                                            "inf",
                                            ""};
        const auto [pos, size] = numbers[at(numbers.size())];
        const std::string value =
            rng() % 2 ? std::string(edges[rng() % std::size(edges)]) : std::to_string(rng() % 80);
        text.replace(pos, size, value);
        break;
    }
    }
}

} // namespace

TEST_CASE("checkpoint format: parse survives 20000 random mutations") {
    // Every outcome is a checkpoint_error or metadata that validates and round-trips;
    // any other exception, or a crash (under ASan+UBSan), fails.
    const std::uint64_t seed = 0x5eedc4ec4b01ull;
    CAPTURE(seed);
    std::mt19937_64 rng(seed);
    const ck::metadata base = random_metadata(rng, 5);
    const std::string valid = ck::serialize(base);
    const std::string valid_body = body_of(valid);
    REQUIRE(valid.size() > 200);

    int accepted = 0;
    int checksum_rejections = 0;
    int other_rejections = 0;
    for (int i = 0; i < 20000; ++i) {
        // Half the cases get a correct checksum line after mutating, so that the
        // grammar and validation behind the checksum are exercised.
        const bool reseal = rng() % 2 == 0;
        std::string text = reseal ? valid_body : valid;
        for (std::uint64_t n = 1 + rng() % 3; n > 0; --n) {
            mutate(text, rng);
        }
        if (reseal) {
            text = seal(text);
        }
        try {
            const ck::metadata m = ck::parse(text, "fuzz");
            ++accepted;
            try {
                ck::validate(m, "fuzz");
                if (ck::parse(ck::serialize(m), "fuzz") != m) {
                    CAPTURE(i);
                    CAPTURE(text);
                    FAIL_CHECK("accepted metadata does not round-trip");
                }
            } catch (const unison::checkpoint_error& e) {
                CAPTURE(i);
                CAPTURE(text);
                FAIL_CHECK("parse accepted metadata that validate rejects: ", e.what());
            }
        } catch (const unison::checkpoint_error& e) {
            const std::string_view what = e.what();
            ++(what.find("checksum mismatch") != std::string_view::npos ? checksum_rejections
                                                                        : other_rejections);
        } catch (const std::exception& e) {
            CAPTURE(i);
            CAPTURE(text);
            FAIL_CHECK("parse threw something other than checkpoint_error: ", e.what());
        } catch (...) {
            CAPTURE(i);
            CAPTURE(text);
            FAIL_CHECK("parse threw something that is not a std::exception");
        }
    }
    CHECK(accepted > 0);
    CHECK(checksum_rejections > 1000);
    CHECK(other_rejections > 5000);
}

TEST_CASE("checkpoint format: doubles read without std::from_chars read as with it") {
    // checkpoint_parse_double_portable is what libc++ before 20 (no from_chars for
    // double) runs; here it is checked against this library's from_chars, or, where
    // that is missing too, against strtod in the C locale.
    const auto reference = [](std::string_view s) -> std::optional<double> {
#if defined(__cpp_lib_to_chars) && __cpp_lib_to_chars >= 201611L
        double v = 0;
        const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
        if (s.empty() || ec != std::errc{} || end != s.data() + s.size()) {
            return std::nullopt;
        }
        return v;
#else
        // strtod's ERANGE covers subnormals too, which from_chars reads.
        const std::string text(s);
        char* end = nullptr;
        errno = 0;
        const double v = std::strtod(text.c_str(), &end);
        const bool out_of_range = errno == ERANGE && (v == 0 || std::isinf(v));
        if (text.empty() || out_of_range || end != text.c_str() + text.size() ||
            text.front() == '+' || std::isspace(static_cast<unsigned char>(text.front())) ||
            text.find_first_of("xX(") != std::string::npos) {
            return std::nullopt;
        }
        return v;
#endif
    };
    const auto same = [&](std::string_view s) {
        CAPTURE(s);
        const std::optional<double> mine = unison::detail::checkpoint_parse_double_portable(s);
        const std::optional<double> theirs = reference(s);
        REQUIRE(mine.has_value() == theirs.has_value());
        if (mine) {
            CHECK(std::signbit(*mine) == std::signbit(*theirs));
            if (std::isnan(*theirs)) {
                CHECK(std::isnan(*mine));
            } else {
                CHECK(std::bit_cast<std::uint64_t>(*mine) == std::bit_cast<std::uint64_t>(*theirs));
            }
        }
    };
    for (const char* s :
         {"0",
          "-0",
          "1",
          "65536",
          "0.5",
          ".5",
          "-.5e-3",
          "5.",
          "1e5",
          "1E5",
          "1e+05",
          "1e-5",
          "00012.50",
          "3.14159265358979311600",
          "2.2250738585072014e-308",
          "1.7976931348623157e308",
          "inf",
          "-inf",
          "INF",
          "Infinity",
          "-infinity",
          "nan",
          "-nan",
          "NaN",
          "",
          "-",
          ".",
          "-.",
          "e5",
          "1e",
          "1e+",
          "1e-",
          "+1",
          " 1",
          "1 ",
          "1,5",
          "1.2.3",
          "0x10",
          "1e400",
          "-1e400",
          "infinit",
          "nana",
          "1f",
          "--1",
          "1e5.5",
          "1e-400",
          "-1e-400",
          "2e-324",
          "3e-324",
          "4.9e-324",
          "-4.9e-324",
          "1e-310",
          "2.2250738585072011e-308",
          "0e999",
          "-0e-999",
          "0.000",
          "1.7976931348623159e308",
          "-1.7976931348623159e308",
          "0.00000000000000000000000000000000000000000000000000000000000000000000000001e-300"}) {
        same(s);
    }
    // Random finite doubles as the writer writes them (%.17g), and shorter; every
    // tenth subnormal, where the streams and strtod report ERANGE.
    std::mt19937_64 rng(20261207);
    for (int i = 0; i < 20000; ++i) {
        double v = 0;
        do {
            const std::uint64_t bits = rng();
            v = std::bit_cast<double>(i % 10 == 0 ? bits & 0x800fffffffffffffull : bits);
        } while (!std::isfinite(v));
        same(unison::detail::checkpoint_format_double(v));
        std::array<char, 64> text{};
        const int digits = 1 + static_cast<int>(rng() % 17);
        std::snprintf(text.data(), text.size(), "%.*g", digits, v);
        same(text.data());
    }
}
