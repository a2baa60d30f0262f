#pragma once

/// \file
/// The timeline: with `UNISON_TIMELINE=path`, every rank records what unison did
/// and when, and writes it at exit to `path.<rank>.json` as a Chrome trace-event
/// file (the JSON object format: {"traceEvents": [...]}), which Perfetto
/// (ui.perfetto.dev) and chrome://tracing open, and scripts/timeline.py merges
/// across ranks and draws as a PNG.
///
/// What is recorded, each event on the rank that did it (the trace's "pid" is the
/// rank, so a merged trace has one process per rank):
///   - every collective: an async span (ph "b"/"e", cat "collective") from the call
///     to its completion, named "all_reduce 4 MiB", with the bytes, count, dtype,
///     reduction, tag, step and, where the backend chooses one, the algorithm, and
///     the moments it started and its peers arrived (ph "n") where the backend
///     can tell;
///   - DDP: each bucket's reduction as a span (cat "ddp") from its launch to its
///     unpacking, and an instant when it became ready;
///   - sharding (FSDP, ZeRO): each unit's gather and gradient reduction as spans
///     (cat "fsdp"), its release as an instant;
///   - the optimizer step and the user's own phases (`timeline::scope`, cat
///     "compute"): complete events (ph "X") on the rank's compute lane.
/// Times are microseconds of the system clock, so that the files of processes on
/// one machine line up.
///
/// Off (the default), an event point costs one relaxed atomic load and a branch;
/// nothing is allocated. On, each event is appended to its rank's list under a
/// mutex and the files are written when the process exits (or at `flush()`).

#include "unison/core/error.hpp"

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace unison::timeline {

/// The thread lanes ("tid") of a rank's events.
enum class lane : int { compute = 0, collectives = 1, ddp = 2, fsdp = 3 };

namespace detail {

/// 1 on, 0 off, -1 not read yet.
inline std::atomic<int>& switch_state() noexcept {
    static std::atomic<int> state{-1};
    return state;
}

inline std::string escaped(std::string_view s) {
    std::string out;
    out.reserve(s.size() + 2);
    for (char c : s) {
        if (c == '"' || c == '\\') {
            out += '\\';
            out += c;
        } else if (static_cast<unsigned char>(c) < 0x20) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
            out += buf;
        } else {
            out += c;
        }
    }
    return out;
}

/// One trace event, already in the file's terms.
struct event {
    char ph = 'X';
    lane tid = lane::compute;
    double ts = 0;        ///< us
    double dur = 0;       ///< us, for "X"
    std::uint64_t id = 0; ///< for "b" and "e"
    std::string cat;
    std::string name;
    std::string args; ///< the members of the "args" object, JSON, or ""
};

/// Every rank's events in this process, written at exit.
class recorder {
public:
    recorder() = default;
    recorder(const recorder&) = delete;
    recorder& operator=(const recorder&) = delete;
    ~recorder() {
        try {
            flush();
        } catch (const std::exception& e) { // at exit there is no one to tell but stderr
            std::fprintf(stderr, "%s\n", e.what());
        } catch (...) {
            std::fputs("unison: UNISON_TIMELINE: writing the timeline failed\n", stderr);
        }
    }

    void add(int rank, event e) {
        std::lock_guard lock(mutex_);
        events_[rank].push_back(std::move(e));
    }

    std::uint64_t next_id(int rank) {
        std::lock_guard lock(mutex_);
        return ++ids_[rank];
    }

    /// Writes path.<rank>.json for every rank that recorded an event (again, whole,
    /// when called twice). Throws unison::error when a file cannot be written.
    void flush() {
        const char* path = std::getenv("UNISON_TIMELINE");
        if (path == nullptr || *path == '\0') {
            return;
        }
        std::lock_guard lock(mutex_);
        for (const auto& [rank, events] : events_) {
            write(std::string(path) + "." + std::to_string(rank) + ".json", rank, events);
        }
    }

private:
    static void write(const std::string& file, int rank, const std::vector<event>& events) {
        std::FILE* f = std::fopen(file.c_str(), "w");
        if (f == nullptr) {
            throw error(rank, "UNISON_TIMELINE",
                        "cannot create '" + file + "': " + std::strerror(errno));
        }
        std::fprintf(f,
                     "{\"displayTimeUnit\":\"us\",\"otherData\":{\"producer\":\"unison\","
                     "\"rank\":%d},\"traceEvents\":[\n",
                     rank);
        std::fprintf(f,
                     "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"ts\":0,"
                     "\"args\":{\"name\":\"rank %d\"}},\n"
                     "{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,"
                     "\"ts\":0,\"args\":{\"sort_index\":%d}}",
                     rank, rank, rank, rank);
        constexpr const char* lanes[] = {"compute", "collectives", "ddp buckets", "fsdp units"};
        for (int t = 0; t < 4; ++t) {
            std::fprintf(f,
                         ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,"
                         "\"ts\":0,\"args\":{\"name\":\"%s\"}}",
                         rank, t, lanes[t]);
        }
        for (const event& e : events) {
            std::fprintf(f,
                         ",\n{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"%c\",\"ts\":%.3f,"
                         "\"pid\":%d,\"tid\":%d",
                         escaped(e.name).c_str(), escaped(e.cat).c_str(), e.ph, e.ts, rank,
                         static_cast<int>(e.tid));
            if (e.ph == 'X') {
                std::fprintf(f, ",\"dur\":%.3f", e.dur);
            }
            if (e.ph == 'b' || e.ph == 'e' || e.ph == 'n') {
                std::fprintf(f, ",\"id\":\"0x%llx\"", static_cast<unsigned long long>(e.id));
            }
            if (e.ph == 'i') {
                std::fputs(",\"s\":\"t\"", f);
            }
            if (!e.args.empty()) {
                std::fprintf(f, ",\"args\":{%s}", e.args.c_str());
            }
            std::fputs("}", f);
        }
        std::fputs("\n]}\n", f);
        const bool ok = std::fflush(f) == 0 && !std::ferror(f);
        if (std::fclose(f) != 0 || !ok) {
            throw error(rank, "UNISON_TIMELINE", "writing '" + file + "' failed");
        }
    }

    std::mutex mutex_;
    std::map<int, std::vector<event>> events_;
    std::map<int, std::uint64_t> ids_;
};

inline recorder& global() {
    static recorder r;
    return r;
}

} // namespace detail

/// Whether UNISON_TIMELINE is set (read once per process).
inline bool enabled() noexcept {
    int s = detail::switch_state().load(std::memory_order_relaxed);
    if (s < 0) {
        const char* path = std::getenv("UNISON_TIMELINE");
        s = path != nullptr && *path != '\0' ? 1 : 0;
        if (s == 1) {
            (void)detail::global(); // constructed now, so destroyed (and written) at exit
        }
        detail::switch_state().store(s, std::memory_order_relaxed);
    }
    return s == 1;
}

/// Now, in the trace's microseconds.
inline double now_us() noexcept {
    return std::chrono::duration<double, std::micro>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
}

/// A new id for an async span of `rank`.
inline std::uint64_t next_id(int rank) {
    return detail::global().next_id(rank);
}

/// An async span's start (ph "b") and end (ph "e"): same rank, category, name and id.
inline void begin(int rank, lane l, std::string_view cat, std::string name, std::uint64_t id,
                  std::string args = {}) {
    detail::global().add(
        rank, {'b', l, now_us(), 0, id, std::string(cat), std::move(name), std::move(args)});
}
inline void end(int rank, lane l, std::string_view cat, std::string name, std::uint64_t id,
                std::string args = {}) {
    detail::global().add(
        rank, {'e', l, now_us(), 0, id, std::string(cat), std::move(name), std::move(args)});
}
/// A moment within an async span (ph "n"): same rank, category and id.
inline void step(int rank, lane l, std::string_view cat, std::string name, std::uint64_t id,
                 std::string args = {}) {
    detail::global().add(
        rank, {'n', l, now_us(), 0, id, std::string(cat), std::move(name), std::move(args)});
}
/// A moment (ph "i").
inline void instant(int rank, lane l, std::string_view cat, std::string name,
                    std::string args = {}) {
    detail::global().add(
        rank, {'i', l, now_us(), 0, 0, std::string(cat), std::move(name), std::move(args)});
}
/// A span that already ended (ph "X"), from `start_us` to now.
inline void complete(int rank, lane l, std::string_view cat, std::string name, double start_us,
                     std::string args = {}) {
    const double end_us = now_us();
    detail::global().add(rank, {'X', l, start_us, end_us - start_us, 0, std::string(cat),
                                std::move(name), std::move(args)});
}

/// Writes the files now (they are written at exit anyway): for a program that
/// leaves through std::_Exit or MPI_Abort. Throws unison::error naming the file.
inline void flush() {
    if (enabled()) {
        detail::global().flush();
    }
}

/// Marks a phase of the caller's own (forward, backward, a data load) on `rank`'s
/// compute lane, from construction to destruction; nothing when the timeline is off.
///
///     { unison::timeline::scope s(comm.rank(), "backward"); loss.backward(); }
class scope {
public:
    scope(int rank, std::string name, lane l = lane::compute, std::string_view cat = "compute")
        : on_(enabled()), rank_(rank), lane_(l), cat_(cat) {
        if (on_) {
            name_ = std::move(name);
            start_ = now_us();
        }
    }
    scope(const scope&) = delete;
    scope& operator=(const scope&) = delete;
    ~scope() {
        if (on_) {
            try {
                complete(rank_, lane_, cat_, std::move(name_), start_);
            } catch (...) { // out of memory while recording: the trace loses one event
            }
        }
    }

private:
    bool on_;
    int rank_;
    lane lane_;
    std::string_view cat_;
    std::string name_;
    double start_ = 0;
};

/// "4 MiB", "512 B": a size for an event's name.
inline std::string size_text(std::size_t bytes) {
    const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    double v = static_cast<double>(bytes);
    while (v >= 1024 && u < 4) {
        v /= 1024;
        ++u;
    }
    char buf[32];
    std::snprintf(buf, sizeof buf,
                  v == static_cast<double>(static_cast<std::uint64_t>(v)) ? "%.0f %s" : "%.1f %s",
                  v, units[u]);
    return buf;
}

} // namespace unison::timeline
