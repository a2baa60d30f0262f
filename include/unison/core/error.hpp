#pragma once

/// \file
/// The error hierarchy. Every error says which rank raised it, in which operation,
/// and what was wrong; backend errors also carry the backend's own code.

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

namespace unison {

/// Base of every error unison throws. what() reads
/// "unison: rank R: OPERATION: DETAIL".
///
/// The message is the error's own string, not std::runtime_error's: libstdc++
/// shares that one between copies and counts the copies inside its library, where
/// ThreadSanitizer cannot see the atomics, so an error copied on one thread and
/// read on another (the thread backend and Gloo hand errors between threads) is
/// reported as a race. Each copy here owns its text.
class error : public std::runtime_error {
public:
    error(int rank, std::string_view operation, std::string_view detail, int code = 0)
        : std::runtime_error(""), message_(format(rank, operation, detail)), rank_(rank),
          operation_(operation), code_(code) {}

    /// `e`, with `more` appended to its message (same rank, operation and code).
    error(const error& e, std::string_view more)
        : std::runtime_error(""), message_(e.message_ + std::string(more)), rank_(e.rank_),
          operation_(e.operation_), code_(e.code_) {}

    const char* what() const noexcept override { return message_.c_str(); }
    /// The rank that raised the error, or -1 where no rank is known.
    int rank() const noexcept { return rank_; }
    /// The operation that failed, for example "all_reduce #12".
    const std::string& operation() const noexcept { return operation_; }
    /// The backend's error code (MPI, CUDA or NCCL), 0 for unison's own errors.
    int code() const noexcept { return code_; }

private:
    static std::string format(int rank, std::string_view operation, std::string_view detail) {
        std::string s = "unison: ";
        if (rank >= 0) {
            s += "rank " + std::to_string(rank) + ": ";
        }
        s += operation;
        s += ": ";
        s += detail;
        return s;
    }

    std::string message_;
    int rank_;
    std::string operation_;
    int code_;
};

/// An argument was invalid (sizes, counts, dtypes, ranks); thrown before any data
/// moved, and the communicator stays usable.
class argument_error : public error {
public:
    using error::error;
};

/// Ranks called collectives that do not match (operation, count, dtype, op or root).
class mismatch_error : public error {
public:
    mismatch_error(int rank, std::string_view operation, std::string_view detail, int other_rank,
                   std::string_view field)
        : error(rank, operation, detail), other_rank_(other_rank), field_(field) {}
    /// With the two values that differ, where the field is a number (a call's tag
    /// or step): `reference_rank` called with `reference_value`, `other_rank` with
    /// `other_value`.
    mismatch_error(int rank, std::string_view operation, std::string_view detail, int other_rank,
                   std::string_view field, int reference_rank, std::int64_t reference_value,
                   std::int64_t other_value)
        : error(rank, operation, detail), other_rank_(other_rank), field_(field),
          reference_rank_(reference_rank), reference_value_(reference_value),
          other_value_(other_value) {}

    /// The rank whose call differs from the reference rank's.
    int other_rank() const noexcept { return other_rank_; }
    /// The field that differs: "operation", "count", "dtype", "op", "root", "tag",
    /// "step" or "device".
    const std::string& field() const noexcept { return field_; }
    /// Where the field is a number: the rank compared with (-1 otherwise) and the
    /// values the two ranks passed.
    int reference_rank() const noexcept { return reference_rank_; }
    std::int64_t reference_value() const noexcept { return reference_value_; }
    std::int64_t other_value() const noexcept { return other_value_; }

private:
    int other_rank_;
    std::string field_;
    int reference_rank_ = -1;
    std::int64_t reference_value_ = 0, other_value_ = 0;
};

/// A blocking wait ran past the communicator's timeout.
class timeout_error : public error {
public:
    timeout_error(int rank, std::string_view operation, std::string_view detail,
                  std::uint64_t sequence)
        : error(rank, operation, detail), sequence_(sequence) {}

    /// The sequence number of the collective that timed out (0-based, per communicator).
    std::uint64_t sequence() const noexcept { return sequence_; }

private:
    std::uint64_t sequence_;
};

/// Another rank failed or left, so this rank's collective cannot complete.
class peer_error : public error {
public:
    peer_error(int rank, std::string_view operation, std::string_view detail, int peer)
        : error(rank, operation, detail), peer_(peer) {}

    /// The rank that failed or left first.
    int peer() const noexcept { return peer_; }

private:
    int peer_;
};

/// An MPI call returned an error; code() is the MPI error code.
class mpi_error : public error {
public:
    using error::error;
};

/// A CUDA runtime call returned an error; code() is the cudaError_t value.
class cuda_error : public error {
public:
    using error::error;
};

/// An NCCL call returned an error; code() is the ncclResult_t value.
class nccl_error : public error {
public:
    using error::error;
};

} // namespace unison
