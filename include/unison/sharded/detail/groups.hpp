#pragma once

/// \file
/// The ranks a strategy shards over and the ranks that hold the same shard. A
/// strategy (sharded/detail/strategy.hpp) names one as `groups<C>`:
/// - `flat_groups`: one shard group, the whole communicator; no replicas.
/// - `hybrid_groups`: shard groups of `shard_group_size` consecutive ranks, and
///   replica groups across them (rank r's replica group holds the ranks with the
///   same place in their shard group); gradients are reduce-scattered in the shard
///   group and their shards all-reduced across the replica group.
/// Each holds its communicators stamped with the iteration count
/// (comm/stepped_communicator.hpp), so it is neither copied nor moved.

#include "unison/comm/communicator.hpp"
#include "unison/comm/stepped_communicator.hpp"
#include "unison/core/error.hpp"
#include "unison/sharded/options.hpp"

#include <cstdint>
#include <optional>
#include <string>

namespace unison::detail {

template <communicator C>
class flat_groups {
public:
    /// Completing a reduction is local work, so one may be completed whenever its
    /// request says it is done.
    static constexpr bool completion_is_collective = false;

    flat_groups(C& comm, const shard_options&, const std::string&) : shard_(&comm), steps_(comm) {}
    flat_groups(const flat_groups&) = delete;
    flat_groups& operator=(const flat_groups&) = delete;

    C& shard() noexcept { return *shard_; }
    const C& shard() const noexcept { return *shard_; }
    stepped_communicator<C>& shard_steps() noexcept { return steps_; }
    const stepped_communicator<C>& shard_steps() const noexcept { return steps_; }
    /// The replica group, stamped (null: there is none).
    stepped_communicator<C>* replica_steps() noexcept { return nullptr; }
    /// Stamps `step` on every later call.
    void set_step(std::uint64_t step) noexcept { steps_.set_step(step); }

private:
    C* shard_;
    stepped_communicator<C> steps_;
};

template <communicator C>
class hybrid_groups {
public:
    /// Completing a reduction all-reduces across the replica group: a collective,
    /// so only the program's order may decide when (see sharded_parameters::progress).
    static constexpr bool completion_is_collective = true;

    /// Splits `comm` (collective); `owner` names the object in the error when
    /// `options.shard_group_size` does not divide the ranks.
    hybrid_groups(C& comm, const shard_options& options, const std::string& owner)
        : shard_(split(comm, options, owner, true)), replica_(split(comm, options, owner, false)),
          steps_(shard_), replica_steps_(replica_) {}
    hybrid_groups(const hybrid_groups&) = delete;
    hybrid_groups& operator=(const hybrid_groups&) = delete;

    C& shard() noexcept { return shard_; }
    const C& shard() const noexcept { return shard_; }
    stepped_communicator<C>& shard_steps() noexcept { return steps_; }
    const stepped_communicator<C>& shard_steps() const noexcept { return steps_; }
    stepped_communicator<C>* replica_steps() noexcept { return &replica_steps_; }
    void set_step(std::uint64_t step) noexcept {
        steps_.set_step(step);
        replica_steps_.set_step(step);
    }

private:
    static C split(C& comm, const shard_options& options, const std::string& owner, bool shard) {
        const int n = comm.size();
        const int g = options.shard_group_size;
        if (g < 1 || n % g != 0) {
            throw argument_error(comm.rank(), owner + " construction",
                                 "shard::hybrid needs a shard_group_size that divides the " +
                                     std::to_string(n) + " ranks; got " + std::to_string(g));
        }
        return comm.split(shard ? comm.rank() / g : comm.rank() % g, comm.rank());
    }

    C shard_, replica_;
    stepped_communicator<C> steps_, replica_steps_;
};

} // namespace unison::detail
