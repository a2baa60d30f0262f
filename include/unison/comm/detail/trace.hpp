#pragma once

/// \file
/// A collective's span on the timeline (core/timeline.hpp): begun by the backend
/// when the call is issued, marked when it starts moving data where the backend
/// can tell, ended when it completes. Every backend keeps one per call in flight.

#include "unison/comm/collective.hpp"
#include "unison/core/timeline.hpp"

#include <cstdint>
#include <string>
#include <string_view>

namespace unison::detail {

/// nccl-tests' size of a call: the larger of what a rank sends and receives.
inline std::size_t call_bytes(const collective_call& c, int size) noexcept {
    const std::size_t block = c.count * size_of(c.type);
    switch (c.op) {
    case operation::reduce_scatter:
    case operation::all_gather:
    case operation::all_to_all:
        return block * static_cast<std::size_t>(size);
    default:
        return block;
    }
}

class collective_span {
public:
    /// Records the call's issue on `rank`'s collectives lane (nothing when the
    /// timeline is off). `algorithm`: what carries it, where the backend chooses.
    /// `sequence`: the call's number among its kind on this communicator, where the
    /// backend knows it when the call is issued (-1: not).
    void begin(int rank, const collective_call& c, int size, std::int64_t sequence = -1,
               std::string_view algorithm = {}) {
        if (!timeline::enabled()) {
            return;
        }
        end("superseded"); // a call never ended keeps the trace's pairs whole
        rank_ = rank;
        id_ = timeline::next_id(rank);
        const std::size_t bytes = call_bytes(c, size);
        name_ = std::string(to_string(c.op)) + " " + timeline::size_text(bytes);
        std::string args = "\"bytes\":" + std::to_string(bytes) +
                           ",\"count\":" + std::to_string(c.count) + ",\"dtype\":\"" +
                           std::string(to_string(c.type)) + "\",\"ranks\":" + std::to_string(size);
        if (sequence >= 0) {
            args += ",\"sequence\":" + std::to_string(sequence);
        }
        if (c.op == operation::all_reduce || c.op == operation::reduce_scatter ||
            c.op == operation::reduce) {
            args += ",\"op\":\"" + std::string(to_string(c.reduction)) + "\"";
        }
        if (!algorithm.empty()) {
            args += ",\"algorithm\":\"" + std::string(algorithm) + "\"";
        }
        if (c.tag != 0) {
            args += ",\"tag\":" + std::to_string(c.tag);
        }
        if (c.step != 0) {
            args += ",\"step\":" + std::to_string(c.step);
        }
        timeline::begin(rank, timeline::lane::collectives, "collective", name_, id_,
                        std::move(args));
    }

    /// The call started on this rank (its turn came on the backend's progress
    /// thread).
    void started() { step("started"); }

    /// A moment of the call: "peers arrived" when every rank of it has (the wait
    /// for the others ends there).
    void step(const char* what) {
        if (id_ != 0) {
            timeline::step(rank_, timeline::lane::collectives, "collective", what, id_);
        }
    }

    /// The call completed (`outcome` null) or ended otherwise ("error", "abandoned").
    /// Only the first end after a begin is recorded.
    void end(const char* outcome = nullptr) noexcept {
        if (id_ == 0) {
            return;
        }
        try {
            timeline::end(rank_, timeline::lane::collectives, "collective", name_, id_,
                          outcome != nullptr ? "\"outcome\":\"" + std::string(outcome) + "\""
                                             : std::string());
        } catch (...) { // out of memory while recording: the trace loses this end
        }
        id_ = 0;
    }

    bool open() const noexcept { return id_ != 0; }

private:
    int rank_ = -1;
    std::uint64_t id_ = 0;
    std::string name_;
};

} // namespace unison::detail
