#pragma once

/// \file
/// The error a checkpoint's files raise when they are missing, truncated, corrupted
/// or malformed, or cannot be written.

#include "unison/core/error.hpp"

#include <string>
#include <utility>

namespace unison {

/// A checkpoint file could not be written, or what was read is not a complete and
/// consistent checkpoint. what() reads "unison: checkpoint: FILE: PROBLEM".
class checkpoint_error : public error {
public:
    checkpoint_error(std::string file, std::string problem)
        : error(-1, "checkpoint", file + ": " + problem), file_(std::move(file)),
          problem_(std::move(problem)) {}

    /// The file (or directory) the problem was found in.
    const std::string& file() const noexcept { return file_; }
    /// What was wrong with it, without the file name.
    const std::string& problem() const noexcept { return problem_; }

private:
    std::string file_;
    std::string problem_;
};

} // namespace unison
