#pragma once

// Where a case keeps its tensors. The cases compute their inputs on the host
// (reference.hpp), put them where the backend under test moves memory with
// `Space::make`, run the collective on `tensor.view()`, and check what
// `Space::read` brings back against the double-precision reference. The host
// space hands the host_buffer itself through; the device space of
// tests/cuda/backends.hpp copies it to the communicator's GPU and back.
//
// The engines' cases (DDP, sharding) also write and read memory the engine hands
// out (a gradient inside a bucket) with `Space::store` and `Space::load`, and put
// the engine itself in the space with `Space::attach` (an engine_space).

#include "reference.hpp"

#include <unison/comm/communicator.hpp>

#include <concepts>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

namespace unison::test {

/// A memory space for communicator `C`:
///   `Space::make(comm, values)` -- a `Space::tensor` on `comm`'s memory holding
///       `values` (a host_buffer), whose `view()` is the `buffer` to pass;
///   `Space::read(comm, tensor)` -- the tensor's elements as a host_buffer, once
///       every collective `comm` ran on it has completed;
///   `Space::on_host` -- whether the tensors are host memory.
template <class Space, class C>
concept memory_space = communicator<C> &&
    requires(C& comm, host_buffer values, typename Space::tensor& t) {
    { Space::make(comm, std::move(values)) } -> std::same_as<typename Space::tensor>;
    { t.view() } -> std::same_as<buffer>;
    { Space::read(comm, std::as_const(t)) } -> std::convertible_to<const host_buffer&>;
    { Space::on_host } -> std::convertible_to<bool>;
};

/// A memory space the engines' cases can use:
///   `Space::store(comm, dst, values)` -- copies `dst.count` elements of
///       `dst.type` from host memory `values` into `dst`;
///   `Space::load(comm, src, values)` -- copies `src` into host memory `values`
///       once every operation on it has completed;
///   `Space::attach(comm, engine)` -- puts an engine (bucketed_reducer, ddp,
///       sharded_parameters, fsdp) in the space, before anything is added to it.
template <class Space, class C>
concept engine_space = memory_space<Space, C> &&
    requires(C& comm, buffer dst, const_buffer src, void* out, const void* in) {
    Space::store(comm, dst, in);
    Space::load(comm, src, out);
};

/// `v`'s elements (memory an engine hands out, in `Space`) on the host.
template <class Space, communicator C, class T>
std::vector<std::remove_const_t<T>> load_view(C& comm, view<T> v) {
    std::vector<std::remove_const_t<T>> out(v.size);
    Space::load(comm, const_buffer(v.data, v.size, dtype_of<std::remove_const_t<T>>, v.location),
                out.data());
    return out;
}

/// Writes `values` (v.size of them) into `v` in `Space`.
template <class Space, communicator C, class T>
void store_view(C& comm, view<T> v, const std::vector<T>& values) {
    Space::store(comm, buffer{v.data, v.size, dtype_of<T>, v.location}, values.data());
}

/// Adds `delta(i)` to every element i of `v` in `Space` on the host, as a framework's
/// backward adds into a gradient.
template <class Space, communicator C, class T, class F>
void add_to_view(C& comm, view<T> v, F&& delta) {
    std::vector<T> values = load_view<Space>(comm, v);
    for (std::size_t i = 0; i < values.size(); ++i) {
        values[i] += static_cast<T>(delta(i));
    }
    store_view<Space>(comm, v, values);
}

/// Host memory: the tensor is the host_buffer itself, moved in and read in place.
struct host_space {
    using tensor = host_buffer;
    static constexpr bool on_host = true;

    template <communicator C>
    static host_buffer make(C&, host_buffer values) {
        return values;
    }
    template <communicator C>
    static const host_buffer& read(C&, const host_buffer& t) {
        return t;
    }
    template <communicator C>
    static void store(C&, buffer dst, const void* values) {
        std::memcpy(dst.data, values, dst.count * size_of(dst.type));
    }
    template <communicator C>
    static void load(C&, const_buffer src, void* values) {
        std::memcpy(values, src.data, src.count * size_of(src.type));
    }
    /// Host memory is where every engine starts.
    template <communicator C, class Engine>
    static void attach(C&, Engine&) {}
};

/// Host memory that the training cases treat as another space: their model stages
/// its values and gradients through copies in it (staged_ddp_binding,
/// sharded_binding), as it does on a GPU, so the staging itself runs where no GPU
/// is.
struct staged_host_space : host_space {
    static constexpr bool on_host = false;
};

} // namespace unison::test
