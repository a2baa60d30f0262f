#pragma once

// What the two translation units of this test share: the types of one DDP and one
// sharding engine, and the training functions defined in host_side.cpp (compiled
// by the host compiler) that device_side.cu (compiled by nvcc) calls on objects it
// built and, in the GPU cases, put on the device. One definition of each class
// serves both: nothing in ddp/ or sharded/ depends on the compiler.

#include <unison/ddp.hpp>
#include <unison/sharded.hpp>
#include <unison/thread.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

namespace mixed {

using comm_type = unison::thread_communicator;
using ddp_type = unison::ddp<comm_type>;
using fsdp_type = unison::fsdp<comm_type, unison::policy::zero<3>, unison::optim::sgd>;

/// A deterministic value in [-1, 1) for element `i` of tensor `t` in `step` on `rank`.
inline double grad_value(int step, int rank, std::size_t t, std::size_t i) {
    std::uint64_t z = static_cast<std::uint64_t>(step) * 0x9e3779b97f4a7c15ull +
                      static_cast<std::uint64_t>(rank) * 0xbf58476d1ce4e5b9ull +
                      t * 0x94d049bb133111ebull + i;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return static_cast<double>(z >> 11) * 0x1.0p-52 - 1.0;
}

/// Defined in host_side.cpp: one DDP synchronization of `dp`'s `gradients` gradients
/// (every one marked ready, last first, then finish()); returns finish()'s result.
bool ddp_sync(ddp_type& dp, std::size_t gradients);

/// Writes this rank's gradient of parameter `j` of unit `k` (host or device memory).
using gradient_writer = std::function<void(std::size_t k, std::size_t j, unison::view<float>)>;
/// Copies a parameter's values to the host (from host or device memory).
using value_reader = std::function<std::vector<float>(unison::view<float>)>;

/// Defined in host_side.cpp: one training step of `engine` (every unit's forward
/// scope, every unit's backward scope in reverse with `write` filling its
/// gradients, then step()). Returns the step's global gradient norm.
double fsdp_step(fsdp_type& engine, const std::vector<unison::unit_handle>& units,
                 const gradient_writer& write);

/// Defined in host_side.cpp: the full values of every parameter, unit by unit.
std::vector<std::vector<float>> fsdp_values(fsdp_type& engine,
                                            const std::vector<unison::unit_handle>& units,
                                            const value_reader& read);

} // namespace mixed
