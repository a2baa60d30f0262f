// Tuning rules (comm/tuning_rules.hpp): what a file of rules says, what it matches,
// the errors that name the line and the field of a malformed one, and
// UNISON_TUNING_FILE.

#include <unison/comm/options.hpp>
#include <unison/comm/tuning_rules.hpp>
#include <unison/core/detail/parse_bytes.hpp>
#include <unison/core/error.hpp>

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <optional>
#include <string>
#include <unistd.h>
#include <utility>

namespace {

using unison::algorithm;
using unison::operation;
using unison::tuning_rules;

/// The message of the argument_error that parsing `text` throws ("" if none).
std::string refusal(const std::string& text) {
    try {
        (void)tuning_rules::parse(text, "rules.txt");
    } catch (const unison::argument_error& e) {
        return e.what();
    }
    return "";
}

/// Unsets UNISON_TUNING_FILE when it goes, however the test ends.
struct unset_tuning_file {
    unset_tuning_file() = default;
    unset_tuning_file(const unset_tuning_file&) = delete;
    unset_tuning_file& operator=(const unset_tuning_file&) = delete;
    ~unset_tuning_file() { ::unsetenv("UNISON_TUNING_FILE"); }
};

/// The message of the argument_error that comm_options::from_env() throws ("" if
/// none).
std::string env_refusal() {
    try {
        (void)unison::comm_options::from_env();
    } catch (const unison::argument_error& e) {
        return e.what();
    }
    return "";
}

/// A file name of its own in the temporary directory.
std::string temporary_path(const char* name) {
    const char* dir = std::getenv("TMPDIR");
    return std::string(dir != nullptr && *dir != '\0' ? dir : "/tmp") + "/unison-" +
           std::to_string(::getpid()) + "-" + name;
}

} // namespace

TEST_CASE("tuning rules: fields, ranges and the first rule that matches") {
    const tuning_rules t = tuning_rules::parse(R"(# measured on our nodes of 8
mpi all_reduce     4    4   16K-64K   rabenseifner   # the node's memory
mpi all_reduce     2-3  *   64K-      ring
mpi	all_reduce	*	1	-32K	automatic
mpi all_reduce     *    1   -1M       two_level
mpi reduce_scatter 8-   8   1.5M      native
mpi all_gather     *    2-4 4096-8K   neighbour_exchange
)",
                                               "ours.rules");
    REQUIRE(t.rules().size() == 6);
    CHECK(t.source() == "ours.rules");
    CHECK(t.rules()[0].line == 2);
    CHECK(t.rules()[3].line == 5);

    // A range of sizes includes its start and stops below its end.
    CHECK(t.find(operation::all_reduce, 16 * 1024, 4, 4) == algorithm::rabenseifner);
    CHECK(t.find(operation::all_reduce, 64 * 1024 - 1, 4, 4) == algorithm::rabenseifner);
    CHECK_FALSE(t.find(operation::all_reduce, 64 * 1024, 4, 4).has_value());
    CHECK_FALSE(t.find(operation::all_reduce, 16 * 1024 - 1, 4, 4).has_value());
    // Ranks and node ranks: both ends included, * anything.
    CHECK_FALSE(t.find(operation::all_reduce, 32 * 1024, 4, 2).has_value());
    CHECK(t.find(operation::all_reduce, 64 * 1024, 2, 2) == algorithm::ring);
    CHECK(t.find(operation::all_reduce, std::numeric_limits<std::size_t>::max() - 1, 3, 1) ==
          algorithm::ring);
    CHECK_FALSE(t.find(operation::all_reduce, 64 * 1024, 4, 4).has_value());
    // The first rule that matches decides: automatic leaves a hole in the wider
    // rule after it.
    CHECK(t.find(operation::all_reduce, 8 * 1024, 16, 1) == algorithm::automatic);
    CHECK(t.find(operation::all_reduce, 32 * 1024, 16, 1) == algorithm::two_level);
    CHECK_FALSE(t.find(operation::all_reduce, 1024 * 1024, 16, 1).has_value());
    // One size alone, an open rank range, and the collective must be the rule's.
    CHECK(t.find(operation::reduce_scatter, 1536 * 1024, 64, 8) == algorithm::native);
    CHECK_FALSE(t.find(operation::reduce_scatter, 1536 * 1024 + 1, 64, 8).has_value());
    CHECK_FALSE(t.find(operation::reduce_scatter, 1536 * 1024, 7, 8).has_value());
    CHECK_FALSE(t.find(operation::all_gather, 1536 * 1024, 64, 8).has_value());
    CHECK(t.find(operation::all_gather, 4096, 8, 3) == algorithm::neighbour_exchange);
    CHECK_FALSE(t.find(operation::all_gather, 8192, 8, 3).has_value());
    CHECK_FALSE(t.find(operation::broadcast, 4096, 8, 3).has_value());

    CHECK(tuning_rules().empty());
    CHECK(tuning_rules::parse("\n  # nothing but comments\n\t\n").empty());
    // A UTF-8 byte-order mark, as some editors write, is not part of the first field.
    CHECK(tuning_rules::parse("\xEF\xBB\xBFmpi all_reduce * * 0- ring\n").rules().size() == 1);
}

TEST_CASE("tuning rules: the canonical form is the same however a file spells them") {
    const tuning_rules a = tuning_rules::parse("mpi all_reduce 2-4 * 64K-1M ring\n", "a");
    const tuning_rules b = tuning_rules::parse(
        "# the same rule\r\nmpi  all_reduce\t2-4 *  65536-1024K  ring  \r\n", "b");
    CHECK(a.canonical() == b.canonical());
    CHECK(a.canonical().find("65536-1048576 ring") != std::string::npos);
    const tuning_rules c = tuning_rules::parse("mpi all_reduce 2-4 * 64K-1M rabenseifner\n", "c");
    CHECK(a.canonical() != c.canonical());
    CHECK(tuning_rules().canonical().empty());
}

TEST_CASE("tuning rules: a malformed line is refused with its line and field") {
    const auto refused = [](const std::string& text, const std::string& line,
                            const std::string& detail) {
        CAPTURE(text);
        const std::string message = refusal(text);
        CHECK(message.find("rules.txt:" + line + ": ") != std::string::npos);
        CHECK(message.find(detail) != std::string::npos);
    };
    refused("# fine\nmpi all_reduce 2 2 64K\n", "2", "6 fields");
    refused("mpi all_reduce 2 2 64K ring extra\n", "1", "this line 7");
    refused("nccl all_reduce 2 2 64K native\n", "1", "backend 'nccl'");
    refused("mpi broadcast 2 2 64K native\n", "1", "collective 'broadcast'");
    refused("mpi all_reduce 0 2 64K ring\n", "1", "ranks '0'");
    refused("mpi all_reduce 4-2 2 64K ring\n", "1", "ranks '4-2' is empty");
    refused("mpi all_reduce two * 64K ring\n", "1", "ranks 'two'");
    refused("mpi all_reduce 2 x 64K ring\n", "1", "node_ranks 'x'");
    refused("mpi all_reduce 2 2 64Q ring\n", "1", "bytes '64Q'");
    refused("mpi all_reduce 2 2 - ring\n", "1", "bytes '-'");
    refused("mpi all_reduce 2 2 1M-64K ring\n", "1", "bytes '1M-64K' is empty");
    refused("mpi all_reduce 2 2 64K-64K ring\n", "1", "is empty");
    refused("mpi all_reduce 2 2 64K rings\n", "1", "algorithm 'rings'");
    // An algorithm the collective does not have, with the ones it has.
    refused("mpi reduce_scatter 2 2 64K ring\n", "1",
            "is not one the reduce_scatter has: automatic, rabenseifner, native, rank_ordered");
    refused("mpi all_gather * * 64K- rabenseifner\n", "1", "algorithm 'rabenseifner'");
    // The error is the library's argument_error, naming no rank.
    CHECK(refusal("mpi all_reduce 2 2 64K rings\n").rfind("unison: tuning rules: ", 0) == 0);
}

TEST_CASE("tuning rules: UNISON_TUNING_FILE is read, and a file that is not rules is refused") {
    const std::string path = temporary_path("tuning.rules");
    {
        std::ofstream out(path);
        out << "mpi all_reduce * * 1M- ring\n";
    }
    const unset_tuning_file unset;
    ::setenv("UNISON_TUNING_FILE", path.c_str(), 1);
    const unison::comm_options o = unison::comm_options::from_env();
    REQUIRE(o.tuning.rules().size() == 1);
    CHECK(o.tuning.source() == path);
    CHECK(o.tuning.find(operation::all_reduce, 1 << 20, 8, 8) == algorithm::ring);
    {
        std::ofstream out(path);
        out << "mpi all_reduce * * 1M- ring\nmpi all_reduce * * 1M- butterfly\n";
    }
    std::string message = env_refusal();
    CHECK(message.find(path + ":2: algorithm 'butterfly'") != std::string::npos);
    CHECK(message.find("(from UNISON_TUNING_FILE)") != std::string::npos);
    std::remove(path.c_str());
    message = env_refusal();
    CHECK(message.find("cannot read '" + path + "'") != std::string::npos);
    CHECK(message.find("No such file") != std::string::npos);
    // A directory is not a file of rules.
    const char* dir = std::getenv("TMPDIR");
    const std::string directory = dir != nullptr && *dir != '\0' ? dir : "/tmp";
    ::setenv("UNISON_TUNING_FILE", directory.c_str(), 1);
    message = env_refusal();
    CHECK(message.find("cannot read '" + directory + "': a directory") != std::string::npos);
    ::setenv("UNISON_TUNING_FILE", "", 1);
    CHECK(unison::comm_options::from_env().tuning.empty());
}

TEST_CASE("sizes read as people write them, as nccl-tests reads them") {
    using unison::detail::parse_bytes;
    const std::pair<const char*, std::size_t> good[] = {{"0", 0},
                                                        {"4096", 4096},
                                                        {"64K", 65536},
                                                        {"64k", 65536},
                                                        {"1.5K", 1536},
                                                        {"0.5M", 524288},
                                                        {"1e3", 1000},
                                                        {"2.5e1K", 25600},
                                                        {"1E+2", 100},
                                                        {"100e-2", 1},
                                                        {"64KB", 65536},
                                                        {"64KiB", 65536},
                                                        {"8B", 8},
                                                        {"3 G", 3221225472},
                                                        {"1.75", 1},
                                                        {".5K", 512},
                                                        {"4.K", 4096},
                                                        {"1M", 1048576},
                                                        {"16777216", 16777216},
                                                        {"1.00000000000", 1},
                                                        {"1.00000000000K", 1024},
                                                        {"0.50000000000M", 524288},
                                                        {"0.00048828125M", 512},
                                                        {"0.1M", 104857},
                                                        {"1e-3", 0}};
    for (const auto& size : good) { // not a structured binding: Clang 14's CAPTURE cannot take one
        const std::string text = size.first;
        CAPTURE(text);
        CHECK(parse_bytes(text) == std::optional<std::size_t>(size.second));
    }
    for (const char* bad : {"", "-1", "K", ".", "1e", "1e+", "1x", "1KiBB", "1iB", "1e999", "1e19",
                            "+5", "0x10", "1.5.5", "nan", "inf"}) {
        CAPTURE(std::string(bad));
        CHECK_FALSE(parse_bytes(bad).has_value());
    }
}
