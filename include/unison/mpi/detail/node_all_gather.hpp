#pragma once

/// \file
/// The MPI backend's node-aware all_gather (algorithm::two_level; mpi/tuning.hpp
/// says when): after the call check, each node's blocks gathered at its lowest
/// rank, those leaders exchanging whole nodes' blocks (Bruck's doubling, any number
/// of nodes), each leader sending the result to the ranks of its node
/// (schedule.hpp, plan_node_all_gather). Every block travels straight from and
/// into the callers' outputs, no scratch: a message whose blocks are not one run of
/// consecutive ranks goes as one message of an indexed datatype over its runs (so
/// that a peer gets one message per step, whatever the layout; runs past a GiB are
/// cut into several). Only leaders send across nodes, one message a step carrying
/// whole nodes, where recursive doubling sends every rank's and the ring pays
/// n - 1 latencies.

#include "unison/comm/collective.hpp"
#include "unison/core/dtype.hpp"
#include "unison/mpi/detail/handshake.hpp"
#include "unison/mpi/detail/mpi_check.hpp"
#include "unison/mpi/detail/schedule.hpp"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

namespace unison::detail {

/// One all_gather by plan_node_all_gather's schedule. The operation that owns it
/// keeps the call, the label and the plan alive.
class mpi_node_all_gather {
public:
    /// The all_gather `call` (call.count elements from every rank), the
    /// `sequence`-th collective of `rank` on `comm`, by `plan` (this rank's); errors
    /// name `label`. Its messages take the ring's tag, which no other algorithm of
    /// the same call uses. `segment_bytes` (the largest message) is a parameter for
    /// the tests only.
    mpi_node_all_gather(MPI_Comm comm, int rank, const collective_call& call,
                        const call_label& label, std::uint64_t sequence,
                        std::span<const gather_step> plan,
                        std::size_t segment_bytes = mpi_message_max_bytes)
        : comm_(comm), rank_(rank), call_(call), label_(label),
          tag_(mpi_tag(mpi_ring_tag_base, mpi_ring_tags, sequence)), plan_(plan),
          es_(size_of(call.type)),
          segment_(std::clamp<std::size_t>(segment_bytes / size_of(call.type), 1, INT_MAX)) {}
    mpi_node_all_gather(const mpi_node_all_gather&) = delete;
    mpi_node_all_gather& operator=(const mpi_node_all_gather&) = delete;

    /// Copies this rank's block into its output (unless in place) and posts the
    /// first step.
    void start() {
        std::byte* mine = output() + static_cast<std::size_t>(rank_) * call_.count * es_;
        if (call_.send != mine && call_.count != 0) {
            std::memcpy(mine, call_.send, call_.count * es_);
        }
        step_ = 0;
        if (call_.count != 0 && !plan_.empty()) {
            post_step();
        }
    }

    /// Moves on as this step's messages complete; true when the last step is done.
    bool progress() {
        if (call_.count == 0) {
            return true;
        }
        while (step_ < static_cast<int>(plan_.size())) {
            if (!requests_.complete(rank_, label_.str())) {
                return false;
            }
            if (++step_ < static_cast<int>(plan_.size())) {
                post_step();
            }
        }
        return true;
    }

    /// True when none of its requests is in MPI's hands.
    bool idle() const noexcept { return requests_.idle(); }

    /// The rank of this step's first receive not yet complete; -1 when none is awaited.
    int waiting_for() const noexcept { return requests_.waiting_for(); }

    /// Gives the call up (after a timeout; never driven again): cancels the posted
    /// receives, waiting at most `budget` for the cancellations, and frees the sends
    /// (MPI only reads their buffers). True when no receive is left in MPI's hands.
    bool cancel(std::chrono::steady_clock::duration budget) noexcept {
        return requests_.cancel(budget);
    }

private:
    std::byte* output() const noexcept { return static_cast<std::byte*>(call_.recv); }

    /// A run of consecutive ranks' blocks in the output, in elements.
    struct run {
        std::size_t at = 0, count = 0;
    };

    /// Calls f(runs) for the messages of `blocks`, each a span of runs: the runs of
    /// consecutive ranks, as many together as fit segment_ elements (one message per
    /// peer and step below a GiB), a longer run alone, cut into segments. Sender and
    /// receiver list the same blocks, so they group them alike.
    template <class F>
    void for_each_message(const std::vector<int>& blocks, F&& f) {
        runs_.clear();
        for (std::size_t i = 0; i < blocks.size();) {
            std::size_t k = i + 1;
            while (k < blocks.size() && blocks[k] == blocks[k - 1] + 1) {
                ++k;
            }
            runs_.push_back(
                {static_cast<std::size_t>(blocks[i]) * call_.count,
                 static_cast<std::size_t>(blocks[k - 1] - blocks[i] + 1) * call_.count});
            i = k;
        }
        for (std::size_t i = 0; i < runs_.size();) {
            if (runs_[i].count > segment_) {
                for (std::size_t at = 0; at < runs_[i].count; at += segment_) {
                    const run piece{runs_[i].at + at, std::min(segment_, runs_[i].count - at)};
                    f(std::span<const run>(&piece, 1));
                }
                ++i;
                continue;
            }
            std::size_t k = i, total = 0;
            while (k < runs_.size() && total + runs_[k].count <= segment_) {
                total += runs_[k++].count;
            }
            f(std::span<const run>(runs_).subspan(i, k - i));
            i = k;
        }
    }

    /// Posts one message of `runs` to or from `peer`: one run as it is, several as
    /// one message of an indexed datatype (freed at once; MPI keeps it while the
    /// message is in flight).
    void post(std::span<const run> runs, int peer, bool send) {
        const MPI_Datatype t = mpi_datatype(call_.type);
        MPI_Request* request = requests_.add(peer);
        if (runs.size() == 1) {
            std::byte* at = output() + runs.front().at * es_;
            const int count = static_cast<int>(runs.front().count);
            check(send ? MPI_Isend(at, count, t, peer, tag_, comm_, request)
                       : MPI_Irecv(at, count, t, peer, tag_, comm_, request),
                  send ? "MPI_Isend (node all_gather)" : "MPI_Irecv (node all_gather)");
            return;
        }
        lengths_.clear();
        displacements_.clear();
        for (const run& r : runs) {
            lengths_.push_back(static_cast<int>(r.count));
            displacements_.push_back(static_cast<MPI_Aint>(r.at * es_));
        }
        MPI_Datatype type = MPI_DATATYPE_NULL;
        check(MPI_Type_create_hindexed(static_cast<int>(runs.size()), lengths_.data(),
                                       displacements_.data(), t, &type),
              "MPI_Type_create_hindexed (node all_gather)");
        check(MPI_Type_commit(&type), "MPI_Type_commit (node all_gather)");
        const int rc = send ? MPI_Isend(output(), 1, type, peer, tag_, comm_, request)
                            : MPI_Irecv(output(), 1, type, peer, tag_, comm_, request);
        MPI_Type_free(&type);
        check(rc, send ? "MPI_Isend (node all_gather)" : "MPI_Irecv (node all_gather)");
    }

    /// Posts step step_: every receive, then every send, all from and into the
    /// output, which holds this rank's block from start() on (a rank's step never
    /// receives into a block it sends).
    void post_step() {
        const gather_step& s = plan_[static_cast<std::size_t>(step_)];
        requests_.clear();
        for (const gather_message& m : s.recvs) {
            for_each_message(m.blocks,
                             [&](std::span<const run> runs) { post(runs, m.peer, false); });
        }
        requests_.receives_posted();
        for (const gather_message& m : s.sends) {
            for_each_message(m.blocks,
                             [&](std::span<const run> runs) { post(runs, m.peer, true); });
        }
    }

    void check(int rc, const char* what) const {
        if (rc != MPI_SUCCESS) {
            throw_mpi_error(rc, rank_, label_.str(), what);
        }
    }

    MPI_Comm comm_;
    int rank_;
    const collective_call& call_;
    const call_label& label_;
    int tag_;
    std::span<const gather_step> plan_;
    std::size_t es_;
    std::size_t segment_; ///< elements per message at most
    int step_ = 0;
    mpi_step_requests requests_;          ///< this step's: receives, then sends
    std::vector<run> runs_;               ///< one message's runs (for_each_message)
    std::vector<int> lengths_;            ///< an indexed datatype's, in elements
    std::vector<MPI_Aint> displacements_; ///< ... and its runs' offsets, in bytes
};

} // namespace unison::detail
