// An MPI call that returns an error in the middle of a collective, on 2 or more
// processes. The program defines MPI_Test, MPI_Testall, MPI_Testsome, MPI_Iprobe,
// MPI_Irecv and MPI_Isend itself (MPI's profiling interface: each calls its PMPI_
// twin), so that the last rank can make one of them fail once, with requests of
// the call still posted:
//   1. the first poll after a 64 MiB all_reduce posted a receive of its data (past
//      the handshake, so MPI holds the caller's buffers or the call's scratch; the
//      failure reaches the caller from request.wait());
//   2. a send, while a new communicator's first all_reduce posts its handshake
//      (the failure reaches the caller from the call itself, after its receive
//      was posted);
//   3. a poll in the handshake of the first of two non-blocking all-reduces that
//      post MPI's own collective (`native`), and then, on a new communicator, the
//      first's MPI_Iallreduce itself: the second must not post its MPI_Iallreduce
//      past the failed one, which a peer would match with its own first (every
//      rank's calls then end in errors, none with wrong sums), and on the failing
//      rank it fails at once, saying why, instead of waiting out its timeout.
// Each time the failing rank must get an mpi_error naming the call and the MPI
// function (in the first case also saying that MPI may still use the call's
// buffers; in the second only staging buffers were in MPI's hands), and then have
// its next call refused, saying which call failed: its peers are left in the
// middle of that call. They time out naming it (in the first case a peer may also
// complete, when every message of the failing rank had reached it). The call's
// staging and scratch stay allocated while MPI holds requests on them (under
// AddressSanitizer, a failed call freed with a receive posted shows as a
// heap-use-after-free once the peer's message lands); the caller's buffers are the
// caller's to keep, as the error says, so they outlive MPI here. Every process then
// returns from main and the job ends normally. Run by CTest under mpiexec with a
// wrapper (tests/faults/expect_exit.sh) that checks the exit code, the messages
// and the time.

#include <unison/mpi.hpp>

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <string_view>
#include <vector>

namespace {

std::atomic<int> polls_before_failure{-1};       ///< -1: no poll fails
std::atomic<int> sends_before_failure{-1};       ///< -1: no send fails
std::atomic<int> all_reduces_before_failure{-1}; ///< -1: no MPI_Iallreduce fails
/// Arms the next poll once a receive of at least 64 KiB is posted (a handshake's
/// are smaller).
std::atomic<bool> fail_after_data_receive{false};

/// True for the armed call (once); counts down otherwise.
bool fails(std::atomic<int>& countdown) {
    int left = countdown.load();
    while (left >= 0) {
        if (countdown.compare_exchange_weak(left, left - 1)) {
            return left == 0;
        }
    }
    return false;
}

int failures = 0;

void expect(bool ok, int rank, const std::string& what) {
    if (!ok) {
        std::fprintf(stderr, "mpi_failed_call: rank %d: FAILED: %s\n", rank, what.c_str());
        ++failures;
    }
}

bool contains(std::string_view text, std::string_view part) {
    return text.find(part) != std::string_view::npos;
}

/// What the failing rank must see: `call` fails with an mpi_error naming it and
/// `mpi_call`, and the communicator's next call is refused, naming `call`.
template <class Call>
void expect_failure(unison::mpi_communicator& comm, std::vector<float>& data, Call&& call,
                    const std::string& label, const char* mpi_call, bool buffers_held) {
    try {
        call();
        expect(false, comm.rank(), label + " completed despite the failed " + mpi_call);
    } catch (const unison::mpi_error& e) {
        std::fprintf(stderr, "mpi_failed_call: rank %d caught: %s\n", comm.rank(), e.what());
        expect(e.operation() == label, comm.rank(), "the error names " + e.operation());
        expect(contains(e.what(), mpi_call), comm.rank(), "the error does not name the MPI call");
        expect(contains(e.what(), "MPI may still use this call's buffers") == buffers_held,
               comm.rank(),
               buffers_held ? "the error does not say that MPI may still use the buffers"
                            : "the error says that MPI may use the buffers");
    } catch (const std::exception& e) {
        expect(false, comm.rank(), std::string("another error: ") + e.what());
    }
    try {
        unison::all_reduce(comm, data);
        expect(false, comm.rank(), "the call after the failure was accepted");
    } catch (const unison::error& e) {
        std::fprintf(stderr, "mpi_failed_call: rank %d, next call: %s\n", comm.rank(), e.what());
        expect(contains(e.what(), "unusable since " + label + " failed"), comm.rank(),
               "the next call's error does not say which call failed");
    }
}

/// What its peers see: a timeout of `label` (or, where `may_complete`, the call's
/// completion).
void expect_timeout(unison::mpi_communicator& comm, std::vector<float>& data,
                    const std::string& label, bool may_complete = false) {
    try {
        unison::all_reduce(comm, data);
        expect(may_complete, comm.rank(), label + " completed without the failed rank");
        std::fprintf(stderr, "mpi_failed_call: rank %d: %s completed\n", comm.rank(),
                     label.c_str());
    } catch (const unison::timeout_error& e) {
        std::fprintf(stderr, "mpi_failed_call: rank %d caught: %s\n", comm.rank(), e.what());
        expect(e.operation() == label, comm.rank(), "the timeout names " + e.operation());
    } catch (const std::exception& e) {
        expect(false, comm.rank(), std::string("another error: ") + e.what());
    }
}

} // namespace

extern "C" {
int MPI_Test(MPI_Request* request, int* flag, MPI_Status* status) {
    return fails(polls_before_failure) ? MPI_ERR_OTHER : PMPI_Test(request, flag, status);
}
int MPI_Testall(int count, MPI_Request requests[], int* flag, MPI_Status statuses[]) {
    return fails(polls_before_failure) ? MPI_ERR_OTHER
                                       : PMPI_Testall(count, requests, flag, statuses);
}
int MPI_Testsome(int count, MPI_Request requests[], int* done, int indices[],
                 MPI_Status statuses[]) {
    return fails(polls_before_failure) ? MPI_ERR_OTHER
                                       : PMPI_Testsome(count, requests, done, indices, statuses);
}
int MPI_Iprobe(int source, int tag, MPI_Comm comm, int* flag, MPI_Status* status) {
    return fails(polls_before_failure) ? MPI_ERR_OTHER
                                       : PMPI_Iprobe(source, tag, comm, flag, status);
}
int MPI_Iallreduce(const void* in, void* out, int count, MPI_Datatype type, MPI_Op op,
                   MPI_Comm comm, MPI_Request* request) {
    return fails(all_reduces_before_failure)
               ? MPI_ERR_OTHER
               : PMPI_Iallreduce(in, out, count, type, op, comm, request);
}
int MPI_Irecv(void* data, int count, MPI_Datatype type, int from, int tag, MPI_Comm comm,
              MPI_Request* request) {
    int size = 0;
    MPI_Type_size(type, &size);
    if (static_cast<long>(count) * size >= 65536 && fail_after_data_receive.exchange(false)) {
        polls_before_failure = 0;
    }
    return PMPI_Irecv(data, count, type, from, tag, comm, request);
}
int MPI_Isend(const void* data, int count, MPI_Datatype type, int to, int tag, MPI_Comm comm,
              MPI_Request* request) {
    return fails(sends_before_failure) ? MPI_ERR_OTHER
                                       : PMPI_Isend(data, count, type, to, tag, comm, request);
}
}

int main(int argc, char** argv) {
    using namespace std::chrono_literals;
    // Declared before the environment: MPI may read them until MPI_Finalize.
    std::vector<float> data(std::size_t{16} << 20); // 64 MiB: several steps
    std::vector<float> small(1000);
    std::vector<float> first(std::size_t{1} << 18), second(std::size_t{1} << 18); // 1 MiB each
    unison::mpi_environment env(argc, argv);
    unison::comm_options options;
    options.timeout = 1s;
    int rank = 0;
    {
        unison::mpi_communicator comm(MPI_COMM_WORLD, options);
        rank = comm.rank();
        const int failing = comm.size() - 1;
        std::mt19937 random(17u + static_cast<unsigned>(rank));
        std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
        for (float& x : data) {
            x = uniform(random);
        }
        unison::all_reduce(comm, data); // everyone is here
        if (rank == failing) {
            fail_after_data_receive = true;
            auto request = unison::all_reduce_async(comm, data);
            expect_failure(
                comm, data, [&] { request.wait(); }, "all_reduce #1", "MPI_Test",
                /*buffers_held=*/true);
        } else {
            expect_timeout(comm, data, "all_reduce #1", /*may_complete=*/true);
        }
    }
    {
        unison::mpi_communicator comm(MPI_COMM_WORLD, options);
        const int failing = comm.size() - 1;
        std::fill(small.begin(), small.end(), 0.5f + static_cast<float>(rank));
        if (rank == failing) {
            sends_before_failure = 0;
            expect_failure(
                comm, small, [&] { unison::all_reduce(comm, small); }, "all_reduce #0", "MPI_Isend",
                /*buffers_held=*/false);
        } else {
            expect_timeout(comm, small, "all_reduce #0");
        }
    }
    for (std::atomic<int>* failure : {&polls_before_failure, &all_reduces_before_failure}) {
        unison::comm_options native = options;
        native.all_reduce_algorithm = unison::algorithm::native;
        unison::mpi_communicator comm(MPI_COMM_WORLD, native);
        const int n = comm.size();
        const float ranks_sum = static_cast<float>(n * (n + 1) / 2);
        std::fill(first.begin(), first.end(), 1.0f + static_cast<float>(rank));
        std::fill(second.begin(), second.end(), 100.0f * (1.0f + static_cast<float>(rank)));
        auto a = unison::all_reduce_async(comm, first);
        auto b = unison::all_reduce_async(comm, second);
        if (rank == n - 1) {
            *failure = 0;
        }
        const auto settle = [&](unison::mpi_request& request, const std::vector<float>& data,
                                float want, const char* label) {
            try {
                request.wait();
                const bool right =
                    std::all_of(data.begin(), data.end(), [&](float x) { return x == want; });
                std::fprintf(stderr, "mpi_failed_call: rank %d: %s completed, %s\n", rank, label,
                             right ? "right" : "WRONG");
                expect(right, rank, std::string(label) + " completed with wrong sums");
                expect(rank != n - 1 || std::string_view(label) != "all_reduce #0", rank,
                       "the failed call completed");
            } catch (const unison::error& e) {
                std::fprintf(stderr, "mpi_failed_call: rank %d, native: %s\n", rank, e.what());
                return std::string(e.what());
            }
            return std::string();
        };
        const auto started = std::chrono::steady_clock::now();
        settle(a, first, ranks_sum, "all_reduce #0");
        const std::string second_error = settle(b, second, 100.0f * ranks_sum, "all_reduce #1");
        if (rank == n - 1) {
            // The second call never posts behind the failed first: it fails at once
            // instead of waiting out its timeout.
            expect(contains(second_error, "became unusable while the call waited to post its MPI "
                                          "collective, since all_reduce #0 failed"),
                   rank, "the second call's error does not say the first failed");
            expect(std::chrono::steady_clock::now() - started < 500ms, rank,
                   "the second call waited for its timeout");
        }
    }
    MPI_Barrier(MPI_COMM_WORLD); // every rank is done waiting before the exit's bound starts
    std::fprintf(stderr, "mpi_failed_call: rank %d returns from main with %d failures\n", rank,
                 failures);
    return failures == 0 ? 0 : 1;
}
