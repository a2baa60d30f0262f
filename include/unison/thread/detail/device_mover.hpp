#pragma once

/// \file
/// The thread backend's hook for device memory. thread_communicator.hpp is a host
/// header and launches nothing; a `device_mover`, attached to a rank by
/// `unison::cuda::use_device` (unison/thread/device.cuh, compiled by nvcc), owns the
/// rank's CUDA stream and events and enqueues the rank's share of each collective
/// as kernels and device copies that read the peers' buffers.
///
/// Per collective on device data, every rank: records `ready` after its inputs
/// (record_ready), meets the others at the barrier, makes its stream wait for every
/// peer's `ready` and enqueues its share (move), records `done` (record_done),
/// meets the others again, makes its stream wait for every peer's `done`
/// (wait_peers) and waits on the host, bounded by the timeout, for its stream
/// (synchronize). The host never waits on a peer's GPU work without a deadline.

#include "unison/comm/collective.hpp"

#include <chrono>
#include <memory>
#include <string>

namespace unison::detail {

class device_mover {
public:
    virtual ~device_mover() = default;
    /// The CUDA device this rank's collectives run on.
    virtual int device() const = 0;
    /// This rank's stream (a cudaStream_t).
    virtual void* stream() const = 0;
    /// Records and returns this rank's `ready` event (a cudaEvent_t).
    virtual void* record_ready() = 0;
    /// Enqueues rank `rank`'s share of `calls[rank].op` among `n` ranks, after the
    /// peers' `ready` events.
    virtual void move(const collective_call* const* calls, void* const* ready, int rank, int n) = 0;
    /// Records and returns this rank's `done` event.
    virtual void* record_done() = 0;
    /// Makes this rank's stream wait for every peer's `done` event.
    virtual void wait_peers(void* const* done, int n) = 0;
    /// Waits on the host until this rank's stream has done everything so far;
    /// throws timeout_error naming `rank` and `label` after `timeout`.
    virtual void synchronize(int rank, const std::string& label,
                             std::chrono::milliseconds timeout) = 0;
    /// A mover for a communicator split from this one: same device and stream.
    virtual std::unique_ptr<device_mover> clone() const = 0;
};

} // namespace unison::detail
