#pragma once

/// \file
/// What every communicator decorator (counting_communicator, stepped_communicator)
/// forwards unchanged to the communicator it wraps: rank, size, options, and the
/// device_communicator members when the wrapped type has them. The decorator adds
/// execute, submit and split.

#include "unison/comm/communicator.hpp"

#include <memory>
#include <utility>

namespace unison::detail {

template <communicator C>
class communicator_decorator {
public:
    using request_type = typename C::request_type;

    int rank() const noexcept { return inner_->rank(); }
    int size() const noexcept { return inner_->size(); }
    const comm_options& options() const noexcept { return inner_->options(); }

    C& inner() noexcept { return *inner_; }

    /// Those of `C`, when it is a device_communicator (so a decorated NCCL or
    /// GPU-attached thread communicator still carries its device state).
    static constexpr bool moves_host_memory = unison::moves_host_memory<C>;
    /// Whether `C` does (all_reduce_coalesced).
    static constexpr bool reduces_coalesced = unison::reduces_coalesced<C>;
    void* device_stream() const noexcept requires device_communicator<C> {
        return inner_->device_stream();
    }
    device device_location() const noexcept requires device_communicator<C> {
        return inner_->device_location();
    }

protected:
    /// Wraps `inner`, which must outlive the decorator.
    explicit communicator_decorator(C& inner) noexcept : inner_(&inner) {}
    /// Owns `owned` (a communicator made by split()).
    explicit communicator_decorator(std::shared_ptr<C> owned) noexcept
        : inner_(owned.get()), owned_(std::move(owned)) {}

    C* inner_;

private:
    std::shared_ptr<C> owned_;
};

} // namespace unison::detail
