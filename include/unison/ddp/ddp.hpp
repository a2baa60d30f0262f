#pragma once

/// \file
/// `ddp`: data parallelism assembled from a communicator, a `bucketed_reducer` and
/// the initial broadcast of parameters and buffers from one rank.
///
///     unison::ddp<unison::mpi_communicator, unison::policy::reduce_dtype<unison::dtype::bf16>>
///         dp(comm);
///     for (auto* p : model.parameters()) {
///         dp.add_parameter(p->value, p->grad, p->name);
///     }
///     dp.start();                              // same parameters on every rank
///     // each step: backward hooks call dp.mark_ready(i); then
///     dp.finish();                             // averaged gradients in place
///     optimizer.step();

#include "unison/comm/collectives.hpp"
#include "unison/ddp/bucketed_reducer.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

namespace unison {

inline namespace UNISON_TU_ABI {

template <communicator C, class... Policies>
class ddp {
public:
    using reducer_type = bucketed_reducer<C, Policies...>;
    using hook_type = typename reducer_type::hook_type;

    /// Parameters and buffers are broadcast in chunks of at most this many bytes.
    static constexpr std::size_t broadcast_chunk_bytes = std::size_t{64} << 20;

    /// Keeps a reference to `comm`, which must outlive this object.
    explicit ddp(C& comm, hook_type hook = {}) : comm_(&comm), reducer_(comm, std::move(hook)) {}

    /// Registers a parameter and its gradient (same element count); returns the
    /// index that the gradient's backward hook passes to `mark_ready`.
    template <writable_tensor P, writable_tensor G>
    std::size_t add_parameter(P&& param, G&& grad, std::string name = {}) {
        const buffer p = as_buffer(param);
        const buffer g = as_buffer(grad);
        if (p.count != g.count) {
            throw argument_error(comm_->rank(), "ddp add_parameter",
                                 "parameter '" + name + "' has " + std::to_string(p.count) +
                                     " elements but its gradient " + std::to_string(g.count));
        }
        const std::size_t i = reducer_.add(grad, std::move(name));
        add_state(p, reducer_.name(i));
        return i;
    }

    /// Registers a buffer (running statistics, any dtype): broadcast by `start()`
    /// and `broadcast_buffers()`, never reduced.
    template <writable_tensor B>
    void add_buffer(B&& b, std::string name = {}) {
        add_state(as_buffer(b), name.empty() ? "buffer #" + std::to_string(buffers_) : name);
        states_.back().is_buffer = true;
        ++buffers_;
    }

    /// Collective: copies every parameter and buffer from rank `root` to all ranks,
    /// then starts the reducer (which checks that all ranks registered the same
    /// gradients).
    void start(int root = 0) {
        broadcast_state(root, /*buffers_only=*/false);
        reducer_.start();
    }

    /// Collective: re-broadcasts the buffers only (PyTorch DDP's broadcast_buffers).
    void broadcast_buffers(int root = 0) { broadcast_state(root, /*buffers_only=*/true); }

    void mark_ready(std::size_t i) { reducer_.mark_ready(i); }
    bool finish() { return reducer_.finish(); }

    reducer_type& reducer() noexcept { return reducer_; }
    C& communicator() noexcept { return *comm_; }

private:
    struct state {
        buffer data;
        std::string name;
        bool is_buffer = false;
    };

    void add_state(const buffer& b, std::string name) {
        states_.push_back(state{b, std::move(name), false});
    }

    /// Packs the states' bytes into chunks and broadcasts each as u8: one collective
    /// per 64 MiB instead of one per tensor.
    void broadcast_state(int root, bool buffers_only) {
        std::vector<std::uint8_t> chunk;
        std::vector<const state*> in_chunk;
        auto flush = [&] {
            if (chunk.empty()) {
                return;
            }
            broadcast(*comm_, chunk, root);
            std::size_t offset = 0;
            for (const state* s : in_chunk) {
                const std::size_t bytes = s->data.count * size_of(s->data.type);
                if (comm_->rank() != root) {
                    std::memcpy(s->data.data, chunk.data() + offset, bytes);
                }
                offset += bytes;
            }
            chunk.clear();
            in_chunk.clear();
        };
        for (const state& s : states_) {
            if (buffers_only && !s.is_buffer) {
                continue;
            }
            const std::size_t bytes = s.data.count * size_of(s.data.type);
            if (!s.data.location.is_host()) { // device memory: in place, one tensor per call
                broadcast(*comm_, buffer{s.data.data, bytes, dtype::u8, s.data.location}, root);
                continue;
            }
            if (!chunk.empty() && chunk.size() + bytes > broadcast_chunk_bytes) {
                flush();
            }
            if (bytes >= broadcast_chunk_bytes) { // a large tensor goes on its own, in place
                broadcast(*comm_, buffer{s.data.data, bytes, dtype::u8}, root);
                continue;
            }
            const auto* p = static_cast<const std::uint8_t*>(s.data.data);
            chunk.insert(chunk.end(), p, p + bytes);
            in_chunk.push_back(&s);
        }
        flush();
    }

    C* comm_;
    reducer_type reducer_;
    std::vector<state> states_;
    std::size_t buffers_ = 0;
};

} // namespace UNISON_TU_ABI

} // namespace unison
