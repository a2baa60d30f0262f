// The error hierarchy (unison/core/error.hpp): the what() format, the accessors of
// each class, and that errors raised by a collective carry rank and operation.

#include "unison/core/error.hpp"
#include "unison/thread.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace {

static_assert(std::is_base_of_v<std::runtime_error, unison::error>);
static_assert(std::is_base_of_v<unison::error, unison::argument_error>);
static_assert(std::is_base_of_v<unison::error, unison::mismatch_error>);
static_assert(std::is_base_of_v<unison::error, unison::timeout_error>);
static_assert(std::is_base_of_v<unison::error, unison::peer_error>);
static_assert(std::is_base_of_v<unison::error, unison::mpi_error>);
static_assert(std::is_base_of_v<unison::error, unison::cuda_error>);
static_assert(std::is_base_of_v<unison::error, unison::nccl_error>);

} // namespace

TEST_CASE("errors: what() reads 'unison: rank R: OPERATION: DETAIL'") {
    const unison::error e(3, "all_reduce #12", "the output is too small");
    CHECK(std::string(e.what()) == "unison: rank 3: all_reduce #12: the output is too small");
    CHECK(e.rank() == 3);
    CHECK(e.operation() == "all_reduce #12");
    CHECK(e.code() == 0);

    const unison::error rank0(0, "barrier #0", "x");
    CHECK(std::string(rank0.what()) == "unison: rank 0: barrier #0: x");
}

TEST_CASE("errors: without a known rank, what() leaves the rank out") {
    const unison::argument_error e(-1, "detect_launch", "RANK='x' is not a non-negative integer");
    CHECK(std::string(e.what()) == "unison: detect_launch: RANK='x' is not a non-negative integer");
    CHECK(e.rank() == -1);
    CHECK(e.operation() == "detect_launch");
}

TEST_CASE("errors: backend errors carry the backend's code") {
    const unison::mpi_error mpi(1, "MPI_Allreduce", "MPI_ERR_TRUNCATE", 15);
    CHECK(mpi.code() == 15);
    CHECK(mpi.rank() == 1);
    CHECK(std::string(mpi.what()) == "unison: rank 1: MPI_Allreduce: MPI_ERR_TRUNCATE");

    const unison::cuda_error cuda(2, "cudaMemcpyAsync", "invalid argument", 1);
    CHECK(cuda.code() == 1);
    CHECK(cuda.operation() == "cudaMemcpyAsync");

    const unison::nccl_error nccl(5, "ncclAllReduce", "unhandled system error", 2);
    CHECK(nccl.code() == 2);
    CHECK(nccl.rank() == 5);

    const unison::argument_error argument(0, "broadcast", "root 4 is out of range");
    CHECK(argument.code() == 0);
}

TEST_CASE("errors: a note appended to an error keeps its type, rank, operation and code") {
    const unison::mpi_error first(2, "all_reduce #3", "MPI_Testall failed: MPI_ERR_OTHER", 16);
    const unison::mpi_error noted(first, "; keep the buffers");
    CHECK(std::string(noted.what()) ==
          "unison: rank 2: all_reduce #3: MPI_Testall failed: MPI_ERR_OTHER; keep the buffers");
    CHECK(noted.rank() == 2);
    CHECK(noted.operation() == "all_reduce #3");
    CHECK(noted.code() == 16);
    CHECK(std::string(first.what()) ==
          "unison: rank 2: all_reduce #3: MPI_Testall failed: MPI_ERR_OTHER");
}

TEST_CASE("errors: mismatch_error names the other rank and the field") {
    const unison::mismatch_error e(0, "broadcast #3", "root differs: rank 0 has 0 but rank 2 has 1",
                                   2, "root");
    CHECK(e.rank() == 0);
    CHECK(e.other_rank() == 2);
    CHECK(e.field() == "root");
    CHECK(e.operation() == "broadcast #3");
    CHECK(std::string(e.what()) ==
          "unison: rank 0: broadcast #3: root differs: rank 0 has 0 but rank 2 has 1");
}

TEST_CASE("errors: timeout_error carries the sequence number, peer_error the peer") {
    const unison::timeout_error t(1, "barrier #7", "timed out after 10 ms", 7);
    CHECK(t.sequence() == 7);
    CHECK(t.rank() == 1);
    CHECK(std::string(t.what()) == "unison: rank 1: barrier #7: timed out after 10 ms");

    const unison::timeout_error big(0, "recv #0", "x", std::uint64_t{1} << 40);
    CHECK(big.sequence() == std::uint64_t{1} << 40);

    const unison::peer_error p(3, "all_gather #2", "rank 1 failed", 1);
    CHECK(p.peer() == 1);
    CHECK(p.rank() == 3);
}

TEST_CASE("errors: are caught as unison::error and std::exception") {
    CHECK_THROWS_AS(throw unison::mismatch_error(0, "op", "d", 1, "count"), unison::error);
    CHECK_THROWS_AS(throw unison::timeout_error(0, "op", "d", 0), std::runtime_error);
    CHECK_THROWS_WITH_AS(throw unison::peer_error(4, "op", "d", 0), "unison: rank 4: op: d",
                         std::exception);
}

TEST_CASE("errors: a rejected collective names the calling rank and the operation") {
    std::vector<std::string> messages(2);
    unison::thread_world(2).run([&](unison::thread_communicator& comm) {
        std::vector<std::int32_t> v(8, comm.rank() + 1);
        try {
            unison::all_reduce(comm, v, unison::reduce_op::avg); // avg of integers is rejected
        } catch (const unison::argument_error& e) {
            messages[static_cast<std::size_t>(comm.rank())] = e.what();
        }
    });
    for (int r = 0; r < 2; ++r) {
        const std::string& what = messages[static_cast<std::size_t>(r)];
        INFO(what);
        CHECK(what.rfind("unison: rank " + std::to_string(r) + ": all_reduce: ", 0) == 0);
    }
}

TEST_CASE("errors: mismatched collectives raise mismatch_error on every rank") {
    struct seen {
        std::string what;
        int other_rank = -1;
        std::string field;
    };
    std::vector<seen> errors(3);
    unison::thread_world(3).run([&](unison::thread_communicator& comm) {
        // Rank 2 passes one element more than the others.
        std::vector<float> v(comm.rank() == 2 ? 5 : 4, 1.5f);
        try {
            unison::all_reduce(comm, v);
        } catch (const unison::mismatch_error& e) {
            errors[static_cast<std::size_t>(comm.rank())] = {e.what(), e.other_rank(), e.field()};
        }
    });
    for (int r = 0; r < 3; ++r) {
        const seen& s = errors[static_cast<std::size_t>(r)];
        INFO("rank ", r, ": ", s.what);
        CHECK(s.what.rfind("unison: rank " + std::to_string(r) + ": all_reduce #0: ", 0) == 0);
        CHECK(s.other_rank == 2);
        CHECK(s.field == "count");
    }
}
