#pragma once

/// \file
/// `mpi_environment`: MPI's initialization and finalization for a program that uses
/// the MPI backend (see mpi_communicator.hpp).

#include "unison/mpi/detail/abandoned.hpp"
#include "unison/mpi/detail/mpi_check.hpp"
#include "unison/mpi/launch.hpp"

#include <mpi.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <string_view>
#include <thread>

namespace unison {

/// Initializes MPI (MPI_THREAD_FUNNELED) unless it already is, and finalizes it on
/// destruction if this object initialized it. Then checks that the launcher's
/// environment and MPI agree on the job (mpi/launch.hpp): under torchrun without an
/// MPI launcher every process would otherwise be a world of its own and train
/// alone. On a disagreement it finalizes MPI (if it initialized it) and throws
/// argument_error naming the launcher's variables.
///
/// Leaving after a peer is gone: MPI_Finalize waits for every process of the job,
/// so a process whose call timed out because a peer stopped answering (a hung or
/// stopped process; a killed one ends the job through the launcher) would wait
/// there forever. So before finalizing, every process meets the others in a
/// non-blocking barrier. A process that abandoned a call after a timeout
/// (timeout_error) waits for it only as long as that call's timeout: if some
/// process does not arrive, it writes to stderr which call timed out and which
/// rank it was waiting for, and ends the whole job with
/// `MPI_Abort(MPI_COMM_WORLD, abort_exit_code)`, which the launcher turns into the
/// job's exit status. Processes without an abandoned call wait as long as it
/// takes (the others may still be saving a checkpoint), as MPI_Finalize would,
/// and so does a process whose abandoned calls were followed by a communicator
/// spanning the whole job (every process was alive then: the job recovered).
///
/// Every process of the job constructs one (it duplicates MPI_COMM_WORLD, a
/// collective): in a job that mixes programs, each must use mpi_environment, or
/// none.
class mpi_environment {
public:
    /// The exit status of a job that this process ended because a peer never came
    /// back: 75, sysexits' EX_TEMPFAIL (the job may succeed when run again, for
    /// example resumed from its last checkpoint).
    static constexpr int abort_exit_code = 75;

    mpi_environment(int& argc, char**& argv) {
        int initialized = 0;
        MPI_Initialized(&initialized);
        if (!initialized) {
            int provided = 0;
            UNISON_CHECK_MPI(MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided), -1,
                             "mpi_environment");
            owner_ = true;
        }
        int rank = 0, size = 1;
        MPI_Comm_rank(MPI_COMM_WORLD, &rank);
        MPI_Comm_size(MPI_COMM_WORLD, &size);
        try {
            detail::check_launch_matches(detect_launch(), rank, size, "mpi_environment");
        } catch (...) {
            if (owner_) {
                MPI_Finalize();
            }
            throw;
        }
        if (owner_) {
            // The exit barrier's own context: nothing the program posts on
            // MPI_COMM_WORLD can match it.
            if (const int rc = MPI_Comm_dup(MPI_COMM_WORLD, &exit_comm_); rc != MPI_SUCCESS) {
                MPI_Finalize();
                throw error(
                    rank, "mpi_environment",
                    "MPI_Comm_dup(MPI_COMM_WORLD) failed with MPI error " + std::to_string(rc), rc);
            }
        }
    }
    mpi_environment(const mpi_environment&) = delete;
    mpi_environment& operator=(const mpi_environment&) = delete;

    ~mpi_environment() {
        int finalized = 0;
        MPI_Finalized(&finalized);
        if (!owner_ || finalized) {
            return;
        }
        if (!everyone_arrives(std::uncaught_exceptions() > uncaught_)) {
            end_after_timeout();
        }
        MPI_Comm_free(&exit_comm_);
        MPI_Finalize();
    }

    /// Ends the whole job from this process, for an error after which it cannot go on
    /// while the others may be waiting for it in a collective: writes `message` and a
    /// newline to stderr, waits `abort_output_grace`, then calls
    /// `MPI_Abort(MPI_COMM_WORLD, exit_code)`, which the launcher turns into the job's
    /// exit status. The wait is there because the message is the only account of why
    /// the job ended and it is in a pipe to the launcher: MPICH's Hydra can act on the
    /// abort before it has forwarded that pipe, and then drops it (about one run in
    /// ten of a 2-rank job that fails at once, on a 2-core machine). Call it from the
    /// thread that initialized MPI (MPI_THREAD_FUNNELED). Where MPI is not initialized,
    /// or already finalized (an mpi_environment whose constructor threw finalizes
    /// it), there is no job to abort: it writes the message and exits with
    /// `exit_code` at once. Does not return.
    [[noreturn]] static void abort_job(std::string_view message, int exit_code = 1) noexcept {
        // One write with its newline where it fits, so that the lines of ranks that
        // fail together do not interleave.
        std::array<char, 16384> line;
        if (message.size() < line.size()) {
            std::memcpy(line.data(), message.data(), message.size());
            line[message.size()] = '\n';
            std::fwrite(line.data(), 1, message.size() + 1, stderr);
        } else {
            std::fwrite(message.data(), 1, message.size(), stderr);
            std::fputc('\n', stderr);
        }
        std::fflush(stderr);
        int initialized = 0, finalized = 0;
        MPI_Initialized(&initialized);
        MPI_Finalized(&finalized);
        if (initialized != 0 && finalized == 0) {
            std::this_thread::sleep_for(abort_output_grace);
            MPI_Abort(MPI_COMM_WORLD, exit_code);
        }
        std::_Exit(exit_code); // MPI_Abort does not return; if it did, leave anyway
    }

    /// abort_job for an exception caught where the job cannot go on: "`program`:
    /// what()", with abort_exit_code (75, try again) for a timeout_error, which says
    /// that a peer stopped answering, and 1 for anything else.
    [[noreturn]] static void abort_job(std::string_view program, const std::exception& e) {
        const bool timed_out = dynamic_cast<const timeout_error*>(&e) != nullptr;
        abort_job(std::string(program) + ": " + e.what(), timed_out ? abort_exit_code : 1);
    }

    /// How long abort_job waits between writing why and calling MPI_Abort.
    static constexpr std::chrono::milliseconds abort_output_grace{500};

private:
    /// Collective: whether every process reached its exit barrier; bounded by the
    /// longest timeout of this process's abandoned calls, unbounded without any.
    /// `unwinding`: an exception is leaving mpi_environment's scope, perhaps on this
    /// process alone, while the others wait for it in a collective until their
    /// timeout (5 minutes by default); if they have not all arrived within
    /// `unwinding_note_after`, it says so, since the exception's own message comes
    /// only once this wait is over.
    bool everyone_arrives(bool unwinding) {
        MPI_Request request = MPI_REQUEST_NULL;
        if (MPI_Ibarrier(exit_comm_, &request) != MPI_SUCCESS) {
            return true; // let MPI_Finalize report what is wrong
        }
        const auto abandoned = detail::abandoned_calls::instance().first();
        if (!abandoned) {
            if (unwinding && !arrives_within(request, unwinding_note_after)) {
                int rank = -1;
                MPI_Comm_rank(MPI_COMM_WORLD, &rank);
                std::fprintf(stderr,
                             "unison: rank %d: mpi_environment: an exception is leaving its "
                             "scope, and not every process has reached the end of the job; "
                             "MPI_Finalize waits for them all, so this process waits too (one "
                             "that waits for it in a collective gives up at its timeout). To "
                             "end the job at once, catch the exception within that scope and "
                             "call mpi_environment::abort_job\n",
                             rank);
                std::fflush(stderr);
            }
            MPI_Wait(&request, MPI_STATUS_IGNORE);
            return true;
        }
        // false: the request is abandoned with the job
        return arrives_within(request, detail::abandoned_calls::instance().longest_timeout());
    }

    [[noreturn]] static void end_after_timeout() {
        int rank = -1;
        MPI_Comm_rank(MPI_COMM_WORLD, &rank);
        const auto call = detail::abandoned_calls::instance().first();
        const std::string why =
            call->label + " timed out after " + std::to_string(call->timeout.count()) + " ms" +
            (call->waiting_for >= 0 ? ", waiting to hear from rank " +
                                          std::to_string(call->waiting_for) + " of its communicator"
                                    : std::string()) +
            ", and not every process reached the end of the job within that time";
        abort_job("unison: rank " + std::to_string(rank) + ": mpi_environment: " + why +
                      "; MPI_Finalize would wait for them forever, so this process ends the job: "
                      "MPI_Abort with exit code " +
                      std::to_string(abort_exit_code),
                  abort_exit_code);
    }

    /// Whether `request` completes within `limit` (polled every millisecond).
    static bool arrives_within(MPI_Request& request, std::chrono::milliseconds limit) {
        const auto deadline = std::chrono::steady_clock::now() + limit;
        for (;;) {
            int done = 0;
            MPI_Test(&request, &done, MPI_STATUS_IGNORE);
            if (done != 0) {
                return true;
            }
            if (std::chrono::steady_clock::now() >= deadline) {
                return false;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
    }

    /// How long a process that an exception is leaving waits for the others at the
    /// end of the job before it says why it waits (everyone_arrives).
    static constexpr std::chrono::milliseconds unwinding_note_after{1000};

    bool owner_ = false;
    int uncaught_ = std::uncaught_exceptions(); ///< at construction
    MPI_Comm exit_comm_ = MPI_COMM_NULL;
};

} // namespace unison
