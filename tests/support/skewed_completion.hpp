#pragma once

// A communicator whose requests answer test() differently on different ranks, as
// real timing can: on an "eager" rank test() waits for the call and says it is
// done, on the others it says not yet (wait() still completes it). Code that
// decides what to communicate next from test() (rather than from its own program
// order) then issues blocking calls in a different order on different ranks, and
// with two communicators (a hybrid shard group and its replica group) the ranks
// wait on each other in a cycle: a hang that real timing produces now and then is
// produced every time. Communicators split from it keep the world rank's answer.

#include <unison/comm.hpp>

#include <memory>
#include <utility>

namespace unison::test {

/// Ranks 0 and 3 of every 4 are eager: in a 4-rank world with shard groups {0,1},
/// {2,3} and replica groups {0,2}, {1,3}, each group has one eager and one lazy
/// rank.
inline bool eager_rank(int world_rank) noexcept {
    return world_rank % 4 == 0 || world_rank % 4 == 3;
}

template <communicator C>
class skewed_completion : public detail::communicator_decorator<C> {
    using base = detail::communicator_decorator<C>;
    using base::inner_;

public:
    class request_type {
    public:
        request_type(typename C::request_type inner, bool eager)
            : inner_(std::move(inner)), eager_(eager) {}
        request_type(request_type&&) noexcept = default;
        request_type& operator=(request_type&&) noexcept = default;
        void wait() { inner_.wait(); }
        bool test() {
            if (!eager_) {
                return false;
            }
            inner_.wait();
            return true;
        }

    private:
        typename C::request_type inner_;
        bool eager_;
    };

    /// Wraps `inner`, which must outlive this object.
    explicit skewed_completion(C& inner) : base(inner), eager_(eager_rank(inner.rank())) {}

    void execute(const collective_call& call) { inner_->execute(call); }
    request_type submit(const collective_call& call) { return {inner_->submit(call), eager_}; }
    skewed_completion split(int color, int key) {
        return skewed_completion(std::make_shared<C>(inner_->split(color, key)), eager_);
    }

private:
    skewed_completion(std::shared_ptr<C> owned, bool eager)
        : base(std::move(owned)), eager_(eager) {}

    bool eager_;
};

} // namespace unison::test
