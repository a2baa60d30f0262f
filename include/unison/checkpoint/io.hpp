#pragma once

/// \file
/// POSIX file helpers for checkpoints: a durable write (temporary file, fsync, rename,
/// fsync of the directory), so that a crash leaves either the old file or the whole
/// new one, and whole-file reads checked against what the metadata says. Linux.

#include "unison/checkpoint/error.hpp"
#include "unison/checkpoint/format.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

namespace unison::detail {

/// strerror's text for `code`.
inline std::string checkpoint_errno_text(int code) {
    return std::generic_category().message(code);
}

/// Owns a file descriptor: closes it on scope exit (the error paths, where a failed
/// close adds nothing) unless release()d for a close whose result is checked.
class checkpoint_fd {
public:
    explicit checkpoint_fd(int fd) noexcept : fd_(fd) {}
    checkpoint_fd(const checkpoint_fd&) = delete;
    checkpoint_fd& operator=(const checkpoint_fd&) = delete;
    ~checkpoint_fd() {
        if (fd_ >= 0) {
            ::close(fd_);
        }
    }

    int get() const noexcept { return fd_; }
    int release() noexcept { return std::exchange(fd_, -1); }

private:
    int fd_;
};

/// open(2) with O_CLOEXEC, retried on EINTR; -1 with errno set on failure.
inline int checkpoint_open(const std::filesystem::path& path, int flags, mode_t mode = 0) {
    int fd = -1;
    do {
        fd = ::open(path.c_str(), flags | O_CLOEXEC, mode);
    } while (fd < 0 && errno == EINTR);
    return fd;
}

/// fsync(2), retried on EINTR; 0 or errno.
inline int checkpoint_fsync(int fd) {
    while (::fsync(fd) != 0) {
        if (errno != EINTR) {
            return errno;
        }
    }
    return 0;
}

} // namespace unison::detail

namespace unison::checkpoint {

/// fsync(2)s the directory `directory` ("" is the current one), so that the names
/// created or renamed in it survive a crash. Throws checkpoint_error naming it.
inline void fsync_directory(const std::filesystem::path& directory) {
    const std::filesystem::path dir = directory.empty() ? std::filesystem::path(".") : directory;
    const int raw = detail::checkpoint_open(dir, O_RDONLY | O_DIRECTORY);
    if (raw < 0) {
        throw checkpoint_error(dir.string(), "cannot open the directory to fsync it: " +
                                                 detail::checkpoint_errno_text(errno));
    }
    detail::checkpoint_fd fd(raw);
    // EINVAL: a file system that cannot sync directories (some network and FUSE ones);
    // there is nothing more to do there.
    if (const int code = detail::checkpoint_fsync(fd.get()); code != 0 && code != EINVAL) {
        throw checkpoint_error(dir.string(), "fsync of the directory failed: " +
                                                 detail::checkpoint_errno_text(code));
    }
    if (::close(fd.release()) != 0) {
        throw checkpoint_error(dir.string(), "close of the directory failed: " +
                                                 detail::checkpoint_errno_text(errno));
    }
}

/// Writes `data` to `path` durably: to `path` + ".tmp" first (looping over partial
/// writes), fsync, close, rename over `path`, then fsync of the containing directory.
/// A crash leaves the old `path` or the complete new one. Throws checkpoint_error
/// naming `path` and the step that failed; the temporary file is removed then.
inline void write_file_durably(const std::filesystem::path& path, std::span<const std::byte> data) {
    const std::string name = path.string();
    std::filesystem::path temporary = path;
    temporary += ".tmp";
    const std::string shown = detail::checkpoint_quote(temporary.filename().string());

    const int raw = detail::checkpoint_open(temporary, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (raw < 0) {
        throw checkpoint_error(name, "cannot create the temporary file " + shown + ": " +
                                         detail::checkpoint_errno_text(errno));
    }
    detail::checkpoint_fd fd(raw);
    // Removes the temporary file and throws; `code` is the errno of the failed step.
    const auto fail = [&](const std::string& step, int code) {
        ::unlink(temporary.c_str());
        throw checkpoint_error(name, step + " " + shown +
                                         " failed: " + detail::checkpoint_errno_text(code));
    };

    // write(2) may write less than asked (signals, quotas, pipes) and caps one call
    // at about 2 GiB; loop until everything is written.
    constexpr std::size_t max_chunk = std::size_t{1} << 30;
    for (std::size_t done = 0; done < data.size();) {
        const std::size_t chunk = std::min(data.size() - done, max_chunk);
        const ssize_t n = ::write(fd.get(), data.data() + done, chunk);
        if (n < 0) {
            if (errno == EINTR) {
                continue;
            }
            fail("write to", errno);
        }
        if (n == 0) {
            fail("write to", EIO); // no progress and no error: give up rather than spin
        }
        done += static_cast<std::size_t>(n);
    }
    if (const int code = detail::checkpoint_fsync(fd.get()); code != 0) {
        fail("fsync of", code);
    }
    // close can report a deferred write error (NFS); it is not retried on EINTR,
    // since Linux frees the descriptor either way.
    if (::close(fd.release()) != 0) {
        fail("close of", errno);
    }
    if (::rename(temporary.c_str(), path.c_str()) != 0) {
        fail("rename to " + detail::checkpoint_quote(path.filename().string()) + " of", errno);
    }
    fsync_directory(path.parent_path());
}

/// The whole content of `path`. Throws checkpoint_error naming `path`: "missing (the
/// checkpoint is incomplete)" when it does not exist, the system's reason otherwise.
inline std::vector<std::byte> read_file(const std::filesystem::path& path) {
    const std::string name = path.string();
    // O_NONBLOCK: opening a FIFO (or a device) must not wait for a writer before the
    // check below refuses it; on a regular file it changes nothing.
    const int raw = detail::checkpoint_open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY);
    if (raw < 0) {
        const int code = errno;
        if (code == ENOENT) {
            throw checkpoint_error(name, "missing (the checkpoint is incomplete)");
        }
        throw checkpoint_error(name, "cannot open: " + detail::checkpoint_errno_text(code));
    }
    detail::checkpoint_fd fd(raw);
    struct stat info {};
    if (::fstat(fd.get(), &info) != 0) {
        throw checkpoint_error(name, "cannot stat: " + detail::checkpoint_errno_text(errno));
    }
    if (!S_ISREG(info.st_mode)) {
        throw checkpoint_error(name, "is not a regular file");
    }

    // Sized from fstat, grown if the file is longer than that by the time it is read.
    std::vector<std::byte> data(static_cast<std::size_t>(info.st_size) + 1);
    std::size_t size = 0;
    for (;;) {
        if (size == data.size()) {
            data.resize(data.size() * 2);
        }
        const ssize_t n = ::read(fd.get(), data.data() + size, data.size() - size);
        if (n < 0) {
            if (errno == EINTR) {
                continue;
            }
            throw checkpoint_error(name, "read failed: " + detail::checkpoint_errno_text(errno));
        }
        if (n == 0) {
            break;
        }
        size += static_cast<std::size_t>(n);
    }
    data.resize(size);
    return data;
}

/// The whole content of `path`, checked to be `expected_bytes` long and to hash to
/// `expected_checksum` (checkpoint::checksum of format `version`), as the
/// checkpoint's metadata says. Throws checkpoint_error naming `path` otherwise.
inline std::vector<std::byte> read_verified(const std::filesystem::path& path,
                                            std::uint64_t expected_bytes,
                                            std::uint64_t expected_checksum,
                                            std::uint32_t version = format_version) {
    std::vector<std::byte> data = read_file(path);
    if (data.size() != expected_bytes) {
        throw checkpoint_error(
            path.string(), "is " + std::to_string(data.size()) + " bytes, the metadata says " +
                               std::to_string(expected_bytes) +
                               (data.size() < expected_bytes ? " (truncated?)"
                                                             : " (overwritten by another run?)"));
    }
    if (const std::uint64_t sum = checksum(version, data.data(), data.size());
        sum != expected_checksum) {
        throw checkpoint_error(path.string(), "checksum mismatch (corrupted): its bytes hash to " +
                                                  detail::checkpoint_hex(sum) +
                                                  ", the metadata says " +
                                                  detail::checkpoint_hex(expected_checksum));
    }
    return data;
}

} // namespace unison::checkpoint
