#pragma once

/// \file
/// `ddp`: data parallelism assembled from a communicator, a `bucketed_reducer` and
/// the initial broadcast of parameters and buffers from one rank.
///
///     unison::ddp<Comm, unison::policy::mixed_precision<unison::dtype::f32, unison::dtype::bf16>>
///         dp(comm, {.bucket_bytes = 25 << 20});
///     for (auto* p : model.parameters()) {
///         dp.add_parameter(p->value, p->grad, p->name);
///     }
///     dp.start();                              // same parameters on every rank
///     // each step: backward hooks call dp.mark_ready(i); then
///     if (dp.finish()) {                       // averaged gradients in place
///         optimizer.step();                    // (false: a micro-batch that accumulates)
///     }

#include "unison/comm/collectives.hpp"
#include "unison/core/detail/hash.hpp"
#include "unison/ddp/bucketed_reducer.hpp"
#include "unison/parallel/detail/control.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

namespace unison {

/// Data parallelism over communicator `C`, assembled from `Policies`
/// (ddp/policies.hpp) and `ddp_options`.
template <communicator C, class... Policies>
class ddp {
public:
    using reducer_type = bucketed_reducer<C, Policies...>;
    using hook_type = typename reducer_type::hook_type;

    /// Parameters and buffers are broadcast in chunks of at most this many bytes.
    static constexpr std::size_t broadcast_chunk_bytes = std::size_t{64} << 20;

    /// Keeps a reference to `comm`, which must outlive this object.
    explicit ddp(C& comm, ddp_options options = {}, hook_type hook = {})
        : comm_(&comm), reducer_(comm, options, std::move(hook)) {}

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
        add_state(p, reducer_.name(i), state_kind::parameter);
        return i;
    }

    /// Registers a buffer (running statistics, any dtype): broadcast by `start()`
    /// and `broadcast_buffers()`, never reduced.
    template <writable_tensor B>
    void add_buffer(B&& b, std::string name = {}) {
        add_state(as_buffer(b), name.empty() ? "buffer #" + std::to_string(buffers_) : name,
                  state_kind::buffer);
        ++buffers_;
    }

    /// Registers a parameter that is not trained (frozen: no gradient): broadcast by
    /// `start()` so every rank starts from the same values, then left alone.
    template <writable_tensor P>
    void add_frozen_parameter(P&& param, std::string name = {}) {
        add_state(as_buffer(param), name.empty() ? "frozen #" + std::to_string(frozen_) : name,
                  state_kind::frozen);
        ++frozen_;
    }

    /// Collective: checks that every rank registered the same parameters and buffers
    /// (sizes, dtypes and kinds, in order; a difference is a mismatch_error naming
    /// the first entry that differs) before anything moves, copies them from rank
    /// `root` to all ranks, then starts the reducer (which checks the gradients).
    void start(int root = 0) {
        std::vector<std::uint64_t> hashes;
        hashes.reserve(states_.size());
        for (const state& s : states_) {
            const std::uint64_t v[3] = {s.data.count, static_cast<std::uint64_t>(s.data.type),
                                        static_cast<std::uint64_t>(s.kind)};
            hashes.push_back(detail::fnv1a64(v, sizeof v));
        }
        detail::verify_same_entries(
            *comm_, reducer_.placement(), hashes,
            [&](std::size_t k) {
                const state& s = states_[k];
                return std::string(s.kind == state_kind::parameter ? "parameter"
                                   : s.kind == state_kind::buffer  ? "buffer"
                                                                   : "frozen parameter") +
                       " '" + s.name + "' (" + std::to_string(s.data.count) + " " +
                       std::string(to_string(s.data.type)) + ")";
            },
            {"ddp start", "registered", "parameters and buffers", "of different sizes or dtypes",
             "every rank must register the same parameters and buffers in the same order"});
        broadcast_state(root, /*buffers_only=*/false);
        reducer_.start();
    }

    /// Collective: re-broadcasts the buffers only (PyTorch DDP's broadcast_buffers).
    void broadcast_buffers(int root = 0) { broadcast_state(root, /*buffers_only=*/true); }

    /// Gradient `i` (add_parameter's index) is final for this backward pass: call it
    /// from the gradient's backward hook (see bucketed_reducer::mark_ready).
    void mark_ready(std::size_t i) { reducer_.mark_ready(i); }
    /// Ends a backward pass: true when the gradients were synchronized (averaged in
    /// place); false on a micro-batch that only accumulates (see
    /// bucketed_reducer::finish).
    [[nodiscard]] bool finish() { return reducer_.finish(); }

    /// For `unison::cuda::use_device` (parallel/device.cuh): device gradients.
    template <class Installer>
    void install_device(Installer& installer) {
        reducer_.install_device(installer);
    }

    reducer_type& reducer() noexcept { return reducer_; }
    C& communicator() noexcept { return *comm_; }

private:
    enum class state_kind : std::uint8_t { parameter, buffer, frozen };
    struct state {
        buffer data;
        std::string name;
        state_kind kind = state_kind::parameter;
    };

    void add_state(const buffer& b, std::string name, state_kind kind) {
        states_.push_back(state{b, std::move(name), kind});
    }

    /// Packs the states' bytes into chunks and broadcasts each as u8: one collective
    /// per 64 MiB instead of one per tensor.
    void broadcast_state(int root, bool buffers_only) {
        auto& comm = reducer_.step_communicator(); // stamped with the pass count
        // Device tensors are read on the communicator's stream: after what the
        // compute stream has queued (a forward that updated the buffers).
        if (std::any_of(states_.begin(), states_.end(),
                        [](const state& s) { return !s.data.location.is_host(); })) {
            reducer_.placement().order_before(comm, "ddp broadcast");
        }
        std::vector<std::uint8_t> chunk;
        std::vector<const state*> in_chunk;
        auto flush = [&] {
            if (chunk.empty()) {
                return;
            }
            broadcast(comm, chunk, root);
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
            if (buffers_only && s.kind != state_kind::buffer) {
                continue;
            }
            const std::size_t bytes = s.data.count * size_of(s.data.type);
            if (!s.data.location.is_host()) { // device memory: in place, one tensor per call
                broadcast(comm, buffer{s.data.data, bytes, dtype::u8, s.data.location}, root);
                continue;
            }
            if (!chunk.empty() && chunk.size() + bytes > broadcast_chunk_bytes) {
                flush();
            }
            if (bytes >= broadcast_chunk_bytes) { // a large tensor goes on its own, in place
                broadcast(comm, buffer{s.data.data, bytes, dtype::u8}, root);
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
    std::size_t buffers_ = 0, frozen_ = 0;
};

} // namespace unison
