#pragma once

/// \file
/// The side channel that names late ranks: every MPI communicator keeps a
/// duplicate of its MPI communicator on which each rank, whenever unison polls,
/// answers a peer's question "where are you?" with the call it is in. A rank whose
/// wait times out asks every other rank and waits a bounded time for the answers,
/// so its error can say which ranks have not arrived and where each of them is,
/// and which did not answer at all (dead, hung, or busy outside unison).

#include "unison/mpi/detail/handshake.hpp"

#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace unison::detail {

/// What a rank answers: the call it is in, if any.
struct mpi_peer_report {
    std::int64_t in_call = 0; ///< 1: inside a call on this communicator
    std::int64_t op = 0;
    std::int64_t sequence = 0;
    std::int64_t peer = -1; ///< send/recv only
    std::int64_t tag = 0;   ///< send/recv only
    std::int64_t waiting_for = -1;
    std::int64_t issued = 0; ///< collectives this rank has issued on the communicator

    std::string where() const {
        if (in_call == 0) {
            return "in no call on this communicator (" + std::to_string(issued) +
                   " collectives issued)";
        }
        std::string s =
            "in " + call_label{static_cast<operation>(op), static_cast<std::uint64_t>(sequence),
                               static_cast<int>(peer), static_cast<int>(tag)}
                        .str();
        if (waiting_for >= 0) {
            s += ", waiting to hear from rank " + std::to_string(waiting_for);
        }
        return s;
    }
};

class mpi_peer_channel {
public:
    /// Collective over `comm`, which it duplicates.
    explicit mpi_peer_channel(MPI_Comm comm) {
        MPI_Comm_dup(comm, &side_);
        MPI_Comm_set_errhandler(side_, MPI_ERRORS_RETURN);
        MPI_Comm_rank(side_, &rank_);
        MPI_Comm_size(side_, &size_);
        post();
    }
    mpi_peer_channel(const mpi_peer_channel&) = delete;
    mpi_peer_channel& operator=(const mpi_peer_channel&) = delete;

    /// Answers every question that has arrived with `me`.
    void answer(const mpi_peer_report& me) noexcept {
        for (;;) {
            int flag = 0;
            if (query_ == MPI_REQUEST_NULL ||
                MPI_Test(&query_, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS || flag == 0) {
                break;
            }
            auto& reply =
                replies_.emplace_back(std::make_unique<mpi_peer_report>(me), MPI_REQUEST_NULL);
            if (MPI_Isend(reply.first.get(), sizeof(mpi_peer_report), MPI_BYTE, asker_, reply_tag,
                          side_, &reply.second) != MPI_SUCCESS) {
                replies_.pop_back();
            }
            post();
        }
        while (!replies_.empty()) {
            int flag = 0;
            MPI_Test(&replies_.front().second, &flag, MPI_STATUS_IGNORE);
            if (flag == 0) {
                break;
            }
            replies_.pop_front();
        }
    }

    /// Asks every other rank where it is and collects answers for `budget`,
    /// answering questions meanwhile. It takes the whole budget even when every
    /// answer is in: peers whose own waits time out a moment later ask then, and
    /// this rank must still be here to answer them. Entry r is rank r's answer, or
    /// empty when none came.
    std::vector<std::optional<mpi_peer_report>> ask(const mpi_peer_report& me,
                                                    std::chrono::milliseconds budget) noexcept {
        std::vector<std::optional<mpi_peer_report>> got(static_cast<std::size_t>(size_));
        std::vector<MPI_Request> asks;
        for (int r = 0; r < size_; ++r) {
            if (r != rank_) {
                asks.push_back(MPI_REQUEST_NULL);
                MPI_Isend(&rank_, 1, MPI_INT, r, query_tag, side_, &asks.back());
            }
        }
        mpi_peer_report arrived;
        MPI_Request reply = MPI_REQUEST_NULL;
        const auto deadline = std::chrono::steady_clock::now() + budget;
        while (std::chrono::steady_clock::now() < deadline) {
            answer(me);
            if (reply == MPI_REQUEST_NULL &&
                MPI_Irecv(&arrived, sizeof arrived, MPI_BYTE, MPI_ANY_SOURCE, reply_tag, side_,
                          &reply) != MPI_SUCCESS) {
                break;
            }
            int flag = 0;
            MPI_Status status;
            MPI_Test(&reply, &flag, &status);
            if (flag != 0) {
                got[static_cast<std::size_t>(status.MPI_SOURCE)] = arrived;
                reply = MPI_REQUEST_NULL;
            } else {
                std::this_thread::yield();
            }
        }
        if (reply != MPI_REQUEST_NULL) {
            MPI_Cancel(&reply);
            MPI_Wait(&reply, MPI_STATUS_IGNORE);
        }
        for (MPI_Request& r : asks) {
            if (r != MPI_REQUEST_NULL) {
                MPI_Request_free(&r);
            }
        }
        return got;
    }

    /// Stops answering. With `leak`, the duplicate is kept rather than freed (a
    /// late answer or question must not reach a communicator that reuses it).
    void close(bool leak) noexcept {
        if (query_ != MPI_REQUEST_NULL) {
            MPI_Cancel(&query_);
            MPI_Wait(&query_, MPI_STATUS_IGNORE);
        }
        for (auto& r : replies_) {
            if (r.second != MPI_REQUEST_NULL) {
                MPI_Request_free(&r.second);
                (void)r.first.release(); // MPI may still read it
            }
        }
        replies_.clear();
        if (!leak && side_ != MPI_COMM_NULL) {
            MPI_Comm_free(&side_);
        }
    }

private:
    static constexpr int query_tag = 1;
    static constexpr int reply_tag = 2;

    void post() noexcept {
        if (MPI_Irecv(&asker_, 1, MPI_INT, MPI_ANY_SOURCE, query_tag, side_, &query_) !=
            MPI_SUCCESS) {
            query_ = MPI_REQUEST_NULL;
        }
    }

    MPI_Comm side_ = MPI_COMM_NULL;
    int rank_ = 0, size_ = 1;
    int asker_ = -1;
    MPI_Request query_ = MPI_REQUEST_NULL;
    std::deque<std::pair<std::unique_ptr<mpi_peer_report>, MPI_Request>> replies_;
};

/// The part of a timeout message that names the ranks not in `mine`, the call
/// that timed out, from their answers.
inline std::string describe_peers(const std::vector<std::optional<mpi_peer_report>>& answers,
                                  int rank, const mpi_peer_report& mine,
                                  std::chrono::milliseconds budget) {
    std::string late, arrived;
    int in_it = 0;
    for (std::size_t r = 0; r < answers.size(); ++r) {
        if (static_cast<int>(r) == rank) {
            continue;
        }
        const std::string who = "rank " + std::to_string(r);
        const auto& a = answers[r];
        if (!a) {
            late += (late.empty() ? "" : "; ") + who + " did not answer within " +
                    std::to_string(budget.count()) + " ms (dead, hung, or busy outside unison)";
        } else if (a->in_call != 0 && a->op == mine.op && a->sequence == mine.sequence) {
            arrived += (arrived.empty() ? "" : ", ") + std::to_string(r);
            ++in_it;
        } else {
            late += (late.empty() ? "" : "; ") + who + " is " + a->where();
        }
    }
    if (late.empty()) {
        return "every other rank is in this call too (ranks " + arrived +
               "): a message between them was lost or MPI is stuck";
    }
    return "not in this call: " + late +
           (in_it == 0   ? std::string()
            : in_it == 1 ? " (rank " + arrived + " is in it)"
                         : " (ranks " + arrived + " are in it)");
}

} // namespace unison::detail
