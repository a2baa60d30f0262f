#pragma once

/// \file
/// `counting_communicator`: a decorator that forwards every call to another
/// communicator and records, per operation, how many calls this rank made, how many
/// elements and bytes they named, and how many elements a bandwidth-optimal (ring)
/// algorithm moves per rank for them -- the figure the ZeRO paper's traffic formulas
/// count:
///
/// | operation        | elements per rank (N ranks, `count` as in collective_call) |
/// |------------------|-------------------------------------------------------------|
/// | all_reduce       | 2 count (N - 1) / N                                         |
/// | reduce_scatter   | count (N - 1)          (count = each rank's block)          |
/// | all_gather       | count (N - 1)          (count = each rank's block)          |
/// | all_gatherv      | sum(counts) - counts[rank]                                  |
/// | all_to_all       | count (N - 1)                                               |
/// | broadcast, reduce, send, recv | count                                          |
///
/// Communicators split from it count into the same table, with their own N.

#include "unison/comm/collective.hpp"
#include "unison/comm/communicator.hpp"
#include "unison/comm/detail/decorator.hpp"

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <numeric>

namespace unison {

/// What a counting_communicator recorded for one operation.
struct traffic {
    std::uint64_t calls = 0;
    std::uint64_t elements = 0; ///< sum of the calls' `count`
    std::uint64_t bytes = 0;    ///< elements times the dtype's size
    double ring_elements = 0.0; ///< elements a ring algorithm moves per rank
    double ring_bytes = 0.0;

    traffic& operator+=(const traffic& o) noexcept {
        calls += o.calls;
        elements += o.elements;
        bytes += o.bytes;
        ring_elements += o.ring_elements;
        ring_bytes += o.ring_bytes;
        return *this;
    }
};

/// Counts the traffic of `C` (see the file comment). Models `communicator`, and
/// `device_communicator` when `C` does.
template <communicator C>
class counting_communicator : public detail::communicator_decorator<C> {
    using base = detail::communicator_decorator<C>;
    using base::inner_;

public:
    using typename base::request_type;
    static constexpr std::size_t operation_count = static_cast<std::size_t>(operation::barrier) + 1;
    using table = std::array<traffic, operation_count>;

    /// Wraps `inner`, which must outlive this object and its splits' parents.
    explicit counting_communicator(C& inner) : base(inner), counts_(std::make_shared<table>()) {}

    void execute(const collective_call& call) {
        record(call);
        inner_->execute(call);
    }
    request_type submit(const collective_call& call) {
        record(call);
        return inner_->submit(call);
    }
    counting_communicator split(int color, int key) {
        auto owned = std::make_shared<C>(inner_->split(color, key));
        return counting_communicator(owned, counts_);
    }

    /// What was recorded for `op` (all ranks of a split share the table).
    const traffic& of(operation op) const noexcept {
        return (*counts_)[static_cast<std::size_t>(op)];
    }
    /// The sum over every operation.
    traffic total() const noexcept {
        traffic t;
        for (const traffic& x : *counts_) {
            t += x;
        }
        return t;
    }
    void reset() noexcept { *counts_ = table{}; }

private:
    counting_communicator(std::shared_ptr<C> owned, std::shared_ptr<table> counts)
        : base(std::move(owned)), counts_(std::move(counts)) {}

    void record(const collective_call& call) {
        traffic& t = (*counts_)[static_cast<std::size_t>(call.op)];
        const double n = static_cast<double>(this->size());
        const auto count = static_cast<double>(call.count);
        double ring = 0.0;
        switch (call.op) {
        case operation::all_reduce:
            ring = 2.0 * count * (n - 1.0) / n;
            break;
        case operation::reduce_scatter:
        case operation::all_gather:
        case operation::all_to_all:
            ring = count * (n - 1.0);
            break;
        case operation::all_gatherv:
            ring = static_cast<double>(
                       std::accumulate(call.counts.begin(), call.counts.end(), std::size_t{0})) -
                   count;
            break;
        case operation::broadcast:
        case operation::reduce:
        case operation::send:
        case operation::recv:
            ring = count;
            break;
        case operation::barrier:
            break;
        }
        const double element_bytes = static_cast<double>(size_of(call.type));
        t.calls += 1;
        t.elements += call.count;
        t.bytes += call.count * size_of(call.type);
        t.ring_elements += ring;
        t.ring_bytes += ring * element_bytes;
    }

    std::shared_ptr<table> counts_;
};

} // namespace unison
