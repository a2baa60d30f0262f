#pragma once

/// \file
/// What both benchmarks need on every rank: its buffers, and one call of the
/// benchmarked collective through unison's public functions on untyped buffers
/// (the dtype is chosen at run time).

#include "collective_shape.hpp"

#include <unison/comm.hpp>
#include <unison/core.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <vector>

namespace unison::bench {

/// Zeroed, page-aligned host memory owned by one rank.
class host_memory {
public:
    explicit host_memory(std::size_t bytes)
        : size_((std::max<std::size_t>(bytes, 1) + page - 1) / page * page),
          data_(static_cast<std::byte*>(std::aligned_alloc(page, size_))) {
        if (data_ == nullptr) {
            throw std::bad_alloc();
        }
        std::memset(data_.get(), 0, size_); // first touch by the rank that uses it
    }
    std::byte* data() const noexcept { return data_.get(); }

private:
    static constexpr std::size_t page = 4096;
    struct free_deleter {
        void operator()(std::byte* p) const noexcept { std::free(p); }
    };
    std::size_t size_;
    std::unique_ptr<std::byte, free_deleter> data_;
};

/// One call of the benchmarked collective through unison's public functions.
///
/// Host backends run blocking calls. With `pending` set (NCCL), calls are issued
/// with the `_async` forms and their requests kept there, so that timed calls are
/// enqueued back to back as nccl-tests enqueues them; the caller waits for them.
template <communicator Comm>
struct unison_call {
    using request_type = typename Comm::request_type;

    Comm& comm;
    collective_kind collective;
    dtype type;
    reduce_op op;
    int root;
    device location = device::host();
    std::vector<request_type>* pending = nullptr;

    void operator()(const std::byte* send, std::byte* recv, const collective_shape& s,
                    bool in_place) const {
        const std::size_t whole = s.count * static_cast<std::size_t>(comm.size());
        const std::size_t in_count =
            collective == collective_kind::reduce_scatter ? whole : s.count;
        const std::size_t out_count = collective == collective_kind::all_gather ? whole : s.count;
        const const_buffer in{send, in_count, type, location};
        buffer out{recv, out_count, type, location};
        // In place, one buffer holds the larger of input and output (nccl-tests' layout).
        buffer inout{recv, std::max(in_count, out_count), type, location};
        switch (collective) {
        case collective_kind::all_reduce:
            if (in_place) {
                issue([&] { unison::all_reduce(comm, inout, op); },
                      [&] { return unison::all_reduce_async(comm, inout, op); });
            } else {
                issue([&] { unison::all_reduce(comm, in, out, op); },
                      [&] { return unison::all_reduce_async(comm, in, out, op); });
            }
            return;
        case collective_kind::all_gather:
            if (in_place) {
                issue([&] { unison::all_gather(comm, inout); },
                      [&] { return unison::all_gather_async(comm, inout); });
            } else {
                issue([&] { unison::all_gather(comm, in, out); },
                      [&] { return unison::all_gather_async(comm, in, out); });
            }
            return;
        case collective_kind::reduce_scatter:
            if (in_place) {
                issue([&] { unison::reduce_scatter(comm, inout, op); },
                      [&] { return unison::reduce_scatter_async(comm, inout, op); });
            } else {
                issue([&] { unison::reduce_scatter(comm, in, out, op); },
                      [&] { return unison::reduce_scatter_async(comm, in, out, op); });
            }
            return;
        case collective_kind::broadcast:
            if (in_place) {
                issue([&] { unison::broadcast(comm, inout, root); },
                      [&] { return unison::broadcast_async(comm, inout, root); });
            } else {
                issue([&] { unison::broadcast(comm, in, out, root); },
                      [&] { return unison::broadcast_async(comm, in, out, root); });
            }
            return;
        }
    }

private:
    template <class Blocking, class Async>
    void issue(Blocking&& blocking, Async&& async) const {
        if (pending != nullptr) {
            pending->push_back(async());
        } else {
            blocking();
        }
    }
};

} // namespace unison::bench
