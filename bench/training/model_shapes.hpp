#pragma once

/// \file
/// The parameter list of the gradient-synchronization benchmarks. The list itself
/// lives in bench/training/model_shapes.json, the one source for unison-ddp-bench (which
/// builds it in at configure time, see bench/CMakeLists.txt) and for
/// bench/peers/torch_ddp_sync.py. The file is a JSON object whose "tensors" array holds
/// {"name": string, "shape": [positive integers]} objects in registration (forward)
/// order; other keys are ignored.

#include <cstddef>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace unison::bench {

/// One parameter tensor (float32).
struct model_tensor {
    std::string name;
    std::vector<std::size_t> shape;

    std::size_t elements() const noexcept {
        std::size_t n = 1;
        for (std::size_t d : shape) {
            n *= d;
        }
        return n;
    }
};

/// A model's parameters, in registration order.
struct model_shapes {
    std::string source; ///< where the list came from, for the report
    std::string description;
    std::vector<model_tensor> tensors;

    std::size_t elements() const noexcept {
        std::size_t n = 0;
        for (const model_tensor& t : tensors) {
            n += t.elements();
        }
        return n;
    }
};

namespace detail {

/// Just enough JSON for the shapes file: objects, arrays, strings, numbers,
/// true/false/null; values other than the ones read are skipped.
class shapes_reader {
public:
    shapes_reader(std::string_view text, std::string_view source) : text_(text), source_(source) {}

    model_shapes read() {
        model_shapes m;
        m.source = std::string(source_);
        bool have_tensors = false;
        object([&](const std::string& key) {
            if (key == "tensors") {
                have_tensors = true;
                array([&] { m.tensors.push_back(tensor()); });
            } else if (key == "description") {
                m.description = string();
            } else {
                skip_value();
            }
        });
        space();
        if (pos_ != text_.size()) {
            fail("text after the top-level object");
        }
        if (!have_tensors || m.tensors.empty()) {
            fail("no \"tensors\" (a non-empty array of {\"name\", \"shape\"} objects)");
        }
        return m;
    }

private:
    model_tensor tensor() {
        model_tensor t;
        bool have_shape = false;
        object([&](const std::string& key) {
            if (key == "name") {
                t.name = string();
            } else if (key == "shape") {
                have_shape = true;
                array([&] { t.shape.push_back(dimension()); });
            } else {
                skip_value();
            }
        });
        if (t.name.empty() || !have_shape || t.shape.empty()) {
            fail("a tensor needs a \"name\" and a non-empty \"shape\"");
        }
        return t;
    }

    /// Calls `member(key)` with the reader at each member's value.
    template <class Member>
    void object(Member&& member) {
        expect('{');
        if (peek() == '}') {
            ++pos_;
            return;
        }
        for (;;) {
            const std::string key = string();
            expect(':');
            member(key);
            if (peek() == ',') {
                ++pos_;
                continue;
            }
            expect('}');
            return;
        }
    }

    /// Calls `element()` with the reader at each element.
    template <class Element>
    void array(Element&& element) {
        expect('[');
        if (peek() == ']') {
            ++pos_;
            return;
        }
        for (;;) {
            element();
            if (peek() == ',') {
                ++pos_;
                continue;
            }
            expect(']');
            return;
        }
    }

    std::string string() {
        expect('"');
        std::string s;
        while (pos_ < text_.size() && text_[pos_] != '"') {
            char c = text_[pos_++];
            if (c == '\\') {
                if (pos_ >= text_.size()) {
                    break;
                }
                c = text_[pos_++];
                switch (c) {
                case 'n':
                    c = '\n';
                    break;
                case 't':
                    c = '\t';
                    break;
                case 'u': // names are ASCII; keep the escape as written
                    s += "\\u";
                    continue;
                default: // '"', '\\', '/'
                    break;
                }
            }
            s += c;
        }
        expect('"');
        return s;
    }

    std::size_t dimension() {
        space();
        std::uint64_t v = 0;
        const std::size_t start = pos_;
        while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
            v = v * 10 + static_cast<std::uint64_t>(text_[pos_++] - '0');
            if (v > (std::uint64_t{1} << 40)) {
                fail("a dimension above 2^40");
            }
        }
        if (pos_ == start || v == 0) {
            fail("a dimension must be a positive integer");
        }
        return static_cast<std::size_t>(v);
    }

    void skip_value() {
        const char c = peek();
        if (c == '{') {
            object([&](const std::string&) { skip_value(); });
        } else if (c == '[') {
            array([&] { skip_value(); });
        } else if (c == '"') {
            (void)string();
        } else {
            const std::size_t start = pos_;
            while (pos_ < text_.size() &&
                   std::string_view(",]} \t\r\n").find(text_[pos_]) == std::string_view::npos) {
                ++pos_;
            }
            if (pos_ == start) {
                fail("a value");
            }
        }
    }

    void space() {
        while (pos_ < text_.size() &&
               std::string_view(" \t\r\n").find(text_[pos_]) != std::string_view::npos) {
            ++pos_;
        }
    }
    char peek() {
        space();
        return pos_ < text_.size() ? text_[pos_] : '\0';
    }
    void expect(char c) {
        if (peek() != c) {
            fail(std::string("expected '") + c + "'");
        }
        ++pos_;
    }

    [[noreturn]] void fail(const std::string& what) const {
        std::size_t line = 1, column = 1;
        for (std::size_t i = 0; i < pos_ && i < text_.size(); ++i) {
            if (text_[i] == '\n') {
                ++line;
                column = 1;
            } else {
                ++column;
            }
        }
        throw std::runtime_error(std::string(source_) + ":" + std::to_string(line) + ":" +
                                 std::to_string(column) + ": " + what);
    }

    std::string_view text_;
    std::string_view source_;
    std::size_t pos_ = 0;
};

} // namespace detail

/// Parses a shapes file's text; errors name `source`, the line and the column.
inline model_shapes parse_model_shapes(std::string_view text, std::string_view source) {
    return detail::shapes_reader(text, source).read();
}

/// Reads and parses the shapes file at `path`.
inline model_shapes load_model_shapes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
        throw std::runtime_error("cannot open " + path);
    }
    std::ostringstream text;
    text << in.rdbuf();
    return parse_model_shapes(text.str(), path);
}

} // namespace unison::bench
