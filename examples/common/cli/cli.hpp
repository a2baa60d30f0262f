// The examples' command lines: one small parser, so that every example answers
// -h/--help (usage on stdout, exit 0), --version, and names what it refuses (an
// unknown option, a missing value, a value out of range) on stderr with exit 2.
// Header-only C++20; like nn/, it does not depend on unison (the caller passes the
// version text), so an example copied alone builds against an installed copy.
//
//   cli::parser p("ddp_mlp", "Data-parallel training of an MLP.", unison::version_string);
//   p.value("--steps", "N", s.steps, 1, 1 << 30, "optimizer steps");
//   p.flag("--adam", s.adam, "AdamW instead of SGD");
//   if (const auto exit_code = p.parse(argc, argv)) {
//       return *exit_code;
//   }
#pragma once

#include <charconv>
#include <cstdio>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

namespace cli {

class parser {
public:
    parser(std::string program, std::string summary, std::string version)
        : program_(std::move(program)), summary_(std::move(summary)), version_(std::move(version)) {
    }

    /// `flag VALUE`: a number in [low, high], the whole text ("12x", "abc" and ""
    /// are refused).
    template <class T>
    parser& value(std::string name, std::string meta, T& out, T low, T high, std::string help) {
        static_assert(std::is_arithmetic_v<T>);
        std::ostringstream range;
        range << low << ", " << high;
        help += " [" + range.str() + "]";
        options_.push_back({std::move(name), std::move(meta), std::move(help),
                            [this, &out, low, high](std::string_view f, std::string_view given) {
                                T v{};
                                const char* last = given.data() + given.size();
                                const auto [end, ec] = std::from_chars(given.data(), last, v);
                                if (ec == std::errc() && end == last && v >= low && v <= high) {
                                    out = v;
                                    return true;
                                }
                                std::ostringstream bounds;
                                bounds << "[" << low << ", " << high << "]";
                                fail(std::string(f) + " '" + std::string(given) +
                                     "' is not a number in " + bounds.str());
                                return false;
                            }});
        return *this;
    }

    /// `flag TEXT`: any non-empty text (a path, a name).
    parser& text(std::string name, std::string meta, std::string& out, std::string help) {
        options_.push_back({std::move(name), std::move(meta), std::move(help),
                            [this, &out](std::string_view f, std::string_view given) {
                                if (given.empty()) {
                                    fail(std::string(f) + " needs a non-empty value");
                                    return false;
                                }
                                out = std::string(given);
                                return true;
                            }});
        return *this;
    }

    /// `flag` alone: sets `out` to true.
    parser& flag(std::string name, bool& out, std::string help) {
        options_.push_back(
            {std::move(name), "", std::move(help), [&out](std::string_view, std::string_view) {
                 out = true;
                 return true;
             }});
        return *this;
    }

    /// Reads the command line. Empty: go on. Otherwise the process should exit with
    /// the code given: 0 after -h/--help or --version, 2 after an error (already
    /// printed, with the usage).
    [[nodiscard]] std::optional<int> parse(int argc, char** argv) {
        for (int i = 1; i < argc; ++i) {
            const std::string_view arg = argv[i];
            if (arg == "-h" || arg == "--help") {
                print_usage(stdout);
                return 0;
            }
            if (arg == "--version") {
                std::printf("%s (unison %s)\n", program_.c_str(), version_.c_str());
                return 0;
            }
            const option* o = find(arg);
            if (o == nullptr) {
                fail("unknown option '" + std::string(arg) + "'");
                print_usage(stderr);
                return 2;
            }
            std::string_view value;
            if (!o->meta.empty()) {
                if (i + 1 >= argc) {
                    fail(std::string(arg) + " needs a value (" + o->meta + ")");
                    print_usage(stderr);
                    return 2;
                }
                value = argv[++i];
            }
            if (!o->read(arg, value)) {
                return 2;
            }
        }
        return std::nullopt;
    }

    /// The usage text, as -h prints it.
    void print_usage(std::FILE* to) const {
        std::string line = "usage: " + program_;
        for (const option& o : options_) {
            line += " [" + o.flag + (o.meta.empty() ? "" : " " + o.meta) + "]";
        }
        std::fprintf(to, "%s\n\n%s\n\n", line.c_str(), summary_.c_str());
        for (const option& o : options_) {
            const std::string left = o.flag + (o.meta.empty() ? "" : " " + o.meta);
            std::fprintf(to, "  %-20s %s\n", left.c_str(), o.help.c_str());
        }
        std::fprintf(to, "  %-20s %s\n  %-20s %s\n", "-h, --help", "this text", "--version",
                     "the program's and unison's version");
    }

private:
    struct option {
        std::string flag;
        std::string meta; // empty: takes no value
        std::string help;
        std::function<bool(std::string_view, std::string_view)> read;
    };

    const option* find(std::string_view flag) const {
        for (const option& o : options_) {
            if (o.flag == flag) {
                return &o;
            }
        }
        return nullptr;
    }

    void fail(const std::string& what) const {
        std::fprintf(stderr, "%s: %s\n", program_.c_str(), what.c_str());
    }

    std::string program_;
    std::string summary_;
    std::string version_;
    std::vector<option> options_;
};

} // namespace cli
