#pragma once

/// \file
/// The NCCL backend: collectives on device memory, enqueued on the communicator's
/// CUDA stream. A blocking call enqueues and then polls the stream against the
/// deadline; on timeout the NCCL communicator is aborted (ncclCommAbort), which is
/// the only way NCCL offers to get a stuck kernel off the GPU.

#include "unison/comm/communicator.hpp"
#include "unison/comm/detail/matching.hpp"
#include "unison/comm/detail/trace.hpp"
#include "unison/comm/detail/validate.hpp"
#include "unison/comm/launcher.hpp"
#include "unison/core/detail/clock.hpp"
#include "unison/cuda/check.hpp"
#include "unison/nccl/detail/nccl_check.hpp"
#include "unison/nccl/tuning.hpp"
#include "unison/rendezvous/launch.hpp"
#include "unison/rendezvous/tcp_store.hpp"

#include <cuda_runtime_api.h>
#include <nccl.h>

#if UNISON_HAS_MPI()
#include "unison/mpi/detail/mpi_check.hpp"
#include "unison/mpi/launch.hpp"
#endif

#include <cstddef>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace unison {

namespace detail {

/// Everything one NCCL communicator owns; requests point at it.
struct nccl_rank_state {
    nccl_rank_state(ncclComm_t c, cudaStream_t s, int dev, bool owns, comm_options o)
        : comm(c), stream(s), device(dev), owns_comm(owns), options(o) {
        UNISON_CHECK_NCCL(ncclCommUserRank(comm, &rank), -1, "nccl_communicator");
        UNISON_CHECK_NCCL(ncclCommCount(comm, &size), rank, "nccl_communicator");
    }
    nccl_rank_state(const nccl_rank_state&) = delete;
    nccl_rank_state& operator=(const nccl_rank_state&) = delete;
    ~nccl_rank_state() {
        if (scratch != nullptr) {
            cudaFree(scratch);
        }
        if (owns_comm) {
            if (aborted) {
                return; // ncclCommAbort already released it
            }
            ncclCommDestroy(comm);
            if (owns_stream) {
                cudaStreamDestroy(stream);
            }
        }
    }

    /// Polls `event` (recorded after `label`'s work) until it completes; checks
    /// NCCL's asynchronous errors while waiting and aborts the communicator at the
    /// deadline.
    void wait(cudaEvent_t event, const std::string& label, std::uint64_t seq) {
        const auto deadline = clock::now() + options.timeout;
        for (std::size_t polls = 1;; ++polls) {
            const cudaError_t q = cudaEventQuery(event);
            if (q == cudaSuccess) {
                return;
            }
            if (q != cudaErrorNotReady) {
                throw_cuda_error(q, rank, label, "cudaEventQuery");
            }
            if ((polls & 255) == 0) {
                ncclResult_t async = ncclSuccess;
                UNISON_CHECK_NCCL(ncclCommGetAsyncError(comm, &async), rank, label);
                if (async != ncclSuccess && async != ncclInProgress) {
                    throw_nccl_error(async, rank, label, "asynchronous NCCL error");
                }
                if (clock::now() >= deadline) {
                    ncclCommAbort(comm);
                    aborted = true;
                    throw timeout_error(rank, label,
                                        "not complete after " +
                                            std::to_string(options.timeout.count()) +
                                            " ms; the NCCL communicator was aborted",
                                        seq);
                }
                std::this_thread::yield();
            }
        }
    }

    void check_usable(operation op) const {
        if (aborted) {
            throw error(rank, to_string(op),
                        "this communicator was aborted after a timeout; build a new one");
        }
    }

    /// Device scratch of at least `bytes` (the matching check and barrier use it).
    void* scratch_of(std::size_t bytes) {
        if (bytes > scratch_bytes) {
            if (scratch != nullptr) {
                UNISON_CHECK_CUDA(cudaFree(scratch), rank, "scratch");
            }
            UNISON_CHECK_CUDA(cudaMalloc(&scratch, bytes), rank, "scratch");
            scratch_bytes = bytes;
        }
        return scratch;
    }

    ncclComm_t comm;
    cudaStream_t stream;
    int device;
    bool owns_comm;
    bool owns_stream = false;
    bool aborted = false;
    comm_options options;
    int rank = 0;
    int size = 1;
    std::uint64_t sequence = 0;
    std::uint64_t p2p_sequence = 0;
    void* scratch = nullptr;
    std::size_t scratch_bytes = 0;
};

} // namespace detail

/// A pending NCCL operation: a CUDA event recorded on the communicator's stream
/// after the operation. wait() polls it against the timeout.
class [[nodiscard]] nccl_request {
public:
    nccl_request() = default;
    nccl_request(nccl_request&& o) noexcept
        : state_(o.state_), event_(std::exchange(o.event_, nullptr)), label_(std::move(o.label_)),
          sequence_(o.sequence_), span_(std::exchange(o.span_, {})) {}
    nccl_request& operator=(nccl_request&& o) noexcept {
        if (this != &o) {
            finish_quietly();
            state_ = o.state_;
            event_ = std::exchange(o.event_, nullptr);
            label_ = std::move(o.label_);
            sequence_ = o.sequence_;
            span_ = std::exchange(o.span_, {});
        }
        return *this;
    }
    /// Waits for an operation still in flight (errors are dropped; call wait() to see them).
    ~nccl_request() { finish_quietly(); }

    /// Blocks the host until the operation has completed on the device.
    void wait() {
        if (event_ == nullptr) {
            return;
        }
        cudaEvent_t e = std::exchange(event_, nullptr);
        try {
            state_->wait(e, label_, sequence_);
        } catch (...) {
            span_.end("error");
            cudaEventDestroy(e);
            throw;
        }
        span_.end(); // when the host saw it complete
        cudaEventDestroy(e);
    }
    /// True once the operation has completed on the device.
    bool test() {
        const bool done = event_ == nullptr || cudaEventQuery(event_) == cudaSuccess;
        if (done) {
            span_.end();
        }
        return done;
    }
    /// The event recorded after the operation: make another stream wait on it with
    /// cudaStreamWaitEvent to order compute after communication without a host wait.
    cudaEvent_t event() const noexcept { return event_; }

private:
    friend class nccl_communicator;
    nccl_request(detail::nccl_rank_state* s, cudaEvent_t e, std::string label, std::uint64_t seq)
        : state_(s), event_(e), label_(std::move(label)), sequence_(seq) {}
    void finish_quietly() noexcept {
        try {
            wait();
        } catch (...) {
        }
    }

    detail::nccl_rank_state* state_ = nullptr;
    cudaEvent_t event_ = nullptr;
    std::string label_;
    std::uint64_t sequence_ = 0;
    detail::collective_span span_; ///< the call on the timeline, ended when seen done
};

/// A communicator over an NCCL communicator and a CUDA stream. Models `communicator`;
/// tensors must live on this communicator's device.
class nccl_communicator {
public:
    using request_type = nccl_request;

#if UNISON_HAS_MPI()
    /// Bootstraps NCCL over MPI: rank 0 creates the unique id and broadcasts it. The
    /// device is the launcher's local rank (never the global rank), see local_device;
    /// where no launcher variable gives it, the rank among the ranks of `mpi` that
    /// share this node (mpi_launch).
    static nccl_communicator from_mpi(MPI_Comm mpi,
                                      comm_options options = comm_options::from_env()) {
        nccl_check_options(options, -1, "nccl_communicator::from_mpi");
        int rank = 0, size = 1;
        UNISON_CHECK_MPI(MPI_Comm_rank(mpi, &rank), -1, "nccl_communicator::from_mpi");
        UNISON_CHECK_MPI(MPI_Comm_size(mpi, &size), rank, "nccl_communicator::from_mpi");
        int devices = 0;
        UNISON_CHECK_CUDA(cudaGetDeviceCount(&devices), rank, "nccl_communicator::from_mpi");
        launch_info info = detect_launch();
        if (info.launcher == "none" || !info.local_from_launcher) {
            info = mpi_launch(mpi); // collective over `mpi`, as this function is
        }
        const int device = local_device(info, devices);
        UNISON_CHECK_CUDA(cudaSetDevice(device), rank, "nccl_communicator::from_mpi");
        ncclUniqueId id{};
        if (rank == 0) {
            UNISON_CHECK_NCCL(ncclGetUniqueId(&id), rank, "nccl_communicator::from_mpi");
        }
        UNISON_CHECK_MPI(MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, mpi), rank,
                         "nccl_communicator::from_mpi");
        ncclComm_t comm = nullptr;
        UNISON_CHECK_NCCL(ncclCommInitRank(&comm, size, id, rank), rank,
                          "nccl_communicator::from_mpi");
        cudaStream_t stream = nullptr;
        UNISON_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), rank,
                          "nccl_communicator::from_mpi");
        nccl_communicator c(comm, stream, device, true, options);
        c.state_->owns_stream = true;
        return c;
    }
#endif

    /// Bootstraps NCCL over the store's rendezvous (no MPI: torchrun, Kubernetes; see
    /// tcp_store::from_env): rank 0 creates the unique id and the store carries it to
    /// the others. The device is the local rank (store_launch: the launcher's
    /// LOCAL_RANK, else this rank's place among the ranks on its host). Collective
    /// over the store's ranks; every rank waits for rank 0's id at most the store's
    /// timeout, and a rank 0 that cannot make one says why on every rank.
    static nccl_communicator from_store(tcp_store& store,
                                        comm_options options = comm_options::from_env()) {
        const char* operation = "nccl_communicator::from_store";
        const int rank = store.rank();
        nccl_check_options(options, rank, operation);
        int devices = 0;
        UNISON_CHECK_CUDA(cudaGetDeviceCount(&devices), rank, operation);
        const int device = local_device(store_launch(store), devices);
        UNISON_CHECK_CUDA(cudaSetDevice(device), rank, operation);
        // Rank 0 sends a status byte and the id, or a zero byte and why it has none,
        // so that no rank waits out the timeout for an id that will never come.
        std::vector<std::byte> message(1 + sizeof(ncclUniqueId));
        std::string failure;
        if (rank == 0) {
            ncclUniqueId id{};
            const ncclResult_t r = ncclGetUniqueId(&id);
            if (r == ncclSuccess) {
                message[0] = std::byte{1};
                std::memcpy(message.data() + 1, &id, sizeof id);
            } else {
                failure = std::string("ncclGetUniqueId: ") + ncclGetErrorString(r);
                message.assign(1, std::byte{0});
                const auto* p = reinterpret_cast<const std::byte*>(failure.data());
                message.insert(message.end(), p, p + failure.size());
            }
        }
        const std::vector<std::byte> got = store.broadcast("nccl unique id", message, 0);
        if (!failure.empty()) {
            throw nccl_error(rank, operation, failure);
        }
        if (got.empty() || got[0] != std::byte{1} || got.size() != 1 + sizeof(ncclUniqueId)) {
            const std::string why =
                got.size() > 1
                    ? std::string(reinterpret_cast<const char*>(got.data() + 1), got.size() - 1)
                    : std::string("an empty message");
            throw peer_error(rank, operation, "rank 0 has no NCCL unique id to share: " + why, 0);
        }
        ncclUniqueId id{};
        std::memcpy(&id, got.data() + 1, sizeof id);
        ncclComm_t comm = nullptr;
        UNISON_CHECK_NCCL(ncclCommInitRank(&comm, store.size(), id, rank), rank, operation);
        cudaStream_t stream = nullptr;
        UNISON_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), rank,
                          operation);
        nccl_communicator c(comm, stream, device, true, options);
        c.state_->owns_stream = true;
        return c;
    }

    /// Adopts `comm` and `stream` on `device` without taking ownership.
    nccl_communicator(ncclComm_t comm, cudaStream_t stream, int device,
                      comm_options options = comm_options::from_env())
        : nccl_communicator(comm, stream, device, false,
                            (nccl_check_options(options, -1, "nccl_communicator"), options)) {}

    int rank() const noexcept {
        return state_->rank;
    }
    int size() const noexcept {
        return state_->size;
    }
    /// The algorithm that carries an all-reduce of `bytes`: native, NCCL's own
    /// choice, at every size (nccl/tuning.hpp).
    algorithm all_reduce_algorithm(std::size_t /*bytes*/) const noexcept {
        return algorithm::native;
    }
    const comm_options& options() const noexcept {
        return state_->options;
    }
    ncclComm_t native_handle() const noexcept {
        return state_->comm;
    }
    cudaStream_t stream() const noexcept {
        return state_->stream;
    }
    int device() const noexcept {
        return state_->device;
    }
    /// Moves device memory of its device only (device_communicator).
    static constexpr bool moves_host_memory = false;
    /// stream(), untyped.
    void* device_stream() const noexcept {
        return static_cast<void*>(state_->stream);
    }
    /// cuda:device().
    unison::device device_location() const noexcept {
        return unison::device::cuda(state_->device);
    }

    /// Enqueues `call` and waits for it on the host (bounded by the timeout).
    void execute(const collective_call& call) {
        nccl_request r = submit(call);
        r.wait();
    }

    /// Enqueues `call` on the stream and returns a request holding an event after it.
    nccl_request submit(const collective_call& call) {
        detail::nccl_rank_state& s = *state_;
        s.check_usable(call.op);
        const bool p2p = call.op == operation::send || call.op == operation::recv;
        if (call.op != operation::barrier &&
            (!call.location.is_cuda() || call.location.index != s.device)) {
            throw argument_error(
                s.rank, to_string(call.op),
                "the NCCL backend moves memory of its device cuda:" + std::to_string(s.device) +
                    ", and the data is on " + to_string(call.location));
        }
        if (p2p && call.tag != 0) {
            throw argument_error(s.rank, to_string(call.op),
                                 "NCCL matches sends and receives by order, not by tag; use tag 0");
        }
        const std::uint64_t seq = p2p ? s.p2p_sequence++ : s.sequence++;
        const std::string label = detail::operation_label(call.op, seq);
        if (!p2p && s.options.check_matching) {
            check_matching(call, label);
        }
        detail::collective_span span;
        span.begin(s.rank, call, s.size, static_cast<std::int64_t>(seq));
        enqueue(call, label);
        cudaEvent_t e = nullptr;
        UNISON_CHECK_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), s.rank, label);
        UNISON_CHECK_CUDA(cudaEventRecord(e, s.stream), s.rank, label);
        nccl_request r(&s, e, label, seq);
        r.span_ = std::move(span);
        return r;
    }

    /// Collective: ncclCommSplit by `color` (>= 0) and `key`; shares this stream.
    nccl_communicator split(int color, int key) {
        if (color < 0) {
            throw argument_error(rank(), "split",
                                 "color " + std::to_string(color) +
                                     " is negative; every rank needs a group");
        }
        ncclComm_t sub = nullptr;
        UNISON_CHECK_NCCL(ncclCommSplit(state_->comm, color, key, &sub, nullptr), rank(), "split");
        return nccl_communicator(sub, state_->stream, state_->device, true, state_->options);
    }

private:
    nccl_communicator(ncclComm_t comm, cudaStream_t stream, int device, bool owns,
                      comm_options options)
        : state_(std::make_unique<detail::nccl_rank_state>(comm, stream, device, owns, options)) {
        log(log_level::info, rank(), [&] {
            return "nccl_communicator made: rank " + std::to_string(rank()) + " of " +
                   std::to_string(size()) + " on cuda:" + std::to_string(device) + ", timeout " +
                   std::to_string(options.timeout.count()) + " ms";
        });
    }

    void enqueue(const collective_call& c, const std::string& label) {
        detail::nccl_rank_state& s = *state_;
        const ncclDataType_t t = detail::nccl_datatype(c.type);
        const std::size_t es = size_of(c.type);
        ncclComm_t comm = s.comm;
        cudaStream_t st = s.stream;
        switch (c.op) {
        case operation::all_reduce:
            UNISON_CHECK_NCCL(ncclAllReduce(c.send, c.recv, c.count, t,
                                            detail::nccl_op(c.reduction, s.size), comm, st),
                              s.rank, label);
            return;
        case operation::reduce_scatter:
            UNISON_CHECK_NCCL(ncclReduceScatter(c.send, c.recv, c.count, t,
                                                detail::nccl_op(c.reduction, s.size), comm, st),
                              s.rank, label);
            return;
        case operation::all_gather:
            UNISON_CHECK_NCCL(ncclAllGather(c.send, c.recv, c.count, t, comm, st), s.rank, label);
            return;
        case operation::all_gatherv: {
            UNISON_CHECK_NCCL(ncclGroupStart(), s.rank, label);
            std::size_t offset = 0;
            for (int q = 0; q < s.size; ++q) {
                const std::size_t n = c.counts[static_cast<std::size_t>(q)];
                UNISON_CHECK_NCCL(ncclBroadcast(q == s.rank ? c.send : nullptr,
                                                static_cast<std::byte*>(c.recv) + offset * es, n, t,
                                                q, comm, st),
                                  s.rank, label);
                offset += n;
            }
            UNISON_CHECK_NCCL(ncclGroupEnd(), s.rank, label);
            return;
        }
        case operation::broadcast:
            UNISON_CHECK_NCCL(ncclBroadcast(c.send, c.recv, c.count, t, c.root, comm, st), s.rank,
                              label);
            return;
        case operation::reduce:
            UNISON_CHECK_NCCL(ncclReduce(c.send, c.recv, c.count, t,
                                         detail::nccl_op(c.reduction, s.size), c.root, comm, st),
                              s.rank, label);
            return;
        case operation::all_to_all: {
            UNISON_CHECK_NCCL(ncclGroupStart(), s.rank, label);
            for (int q = 0; q < s.size; ++q) {
                const std::size_t off = static_cast<std::size_t>(q) * c.count * es;
                UNISON_CHECK_NCCL(
                    ncclSend(static_cast<const std::byte*>(c.send) + off, c.count, t, q, comm, st),
                    s.rank, label);
                UNISON_CHECK_NCCL(
                    ncclRecv(static_cast<std::byte*>(c.recv) + off, c.count, t, q, comm, st),
                    s.rank, label);
            }
            UNISON_CHECK_NCCL(ncclGroupEnd(), s.rank, label);
            return;
        }
        case operation::send:
            UNISON_CHECK_NCCL(ncclSend(c.send, c.count, t, c.root, comm, st), s.rank, label);
            return;
        case operation::recv:
            UNISON_CHECK_NCCL(ncclRecv(c.recv, c.count, t, c.root, comm, st), s.rank, label);
            return;
        case operation::barrier: {
            void* one = s.scratch_of(sizeof(float));
            UNISON_CHECK_NCCL(ncclAllReduce(one, one, 1, ncclFloat32, ncclSum, comm, st), s.rank,
                              label);
            return;
        }
        }
    }

    /// All-gathers the call signatures through device scratch and compares them.
    void check_matching(const collective_call& call, const std::string& label) {
        detail::nccl_rank_state& s = *state_;
        const detail::call_signature mine = detail::signature_of(call);
        constexpr std::size_t bytes = sizeof(detail::call_signature);
        auto* dev =
            static_cast<std::byte*>(s.scratch_of(bytes * static_cast<std::size_t>(s.size + 1)));
        std::vector<detail::call_signature> all(static_cast<std::size_t>(s.size));
        UNISON_CHECK_CUDA(cudaMemcpyAsync(dev, &mine, bytes, cudaMemcpyHostToDevice, s.stream),
                          s.rank, label);
        UNISON_CHECK_NCCL(ncclAllGather(dev, dev + bytes, bytes, ncclUint8, s.comm, s.stream),
                          s.rank, label);
        UNISON_CHECK_CUDA(cudaMemcpyAsync(all.data(), dev + bytes, bytes * all.size(),
                                          cudaMemcpyDeviceToHost, s.stream),
                          s.rank, label);
        cudaEvent_t e = nullptr;
        UNISON_CHECK_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), s.rank, label);
        UNISON_CHECK_CUDA(cudaEventRecord(e, s.stream), s.rank, label);
        try {
            s.wait(e, label + " (matching check)", s.sequence - 1);
        } catch (...) {
            cudaEventDestroy(e);
            throw;
        }
        cudaEventDestroy(e);
        for (int q = 1; q < s.size; ++q) {
            detail::check_signature(s.rank, label, 0, all[0], q, all[static_cast<std::size_t>(q)]);
        }
    }

    std::unique_ptr<detail::nccl_rank_state> state_;
};

static_assert(request<nccl_request>);
static_assert(device_communicator<nccl_communicator>);

} // namespace unison
