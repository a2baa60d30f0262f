// The MPI backend's exchange schedules (mpi/detail/schedule.hpp), every rank's run in
// one process: messages travel in order between each pair, as MPI delivers them on
// one tag, and a step completes once its message has arrived. For every layout of
// ranks on nodes (blocks, round robin, uneven, random), the schedules must pair up
// without a deadlock or a message left over, and every rank's result must hold
// every rank's data exactly once.

#include <unison/mpi/detail/schedule.hpp>

#include <doctest/doctest.h>

#include <cstddef>
#include <deque>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace {

using unison::detail::exchange_plan;
using unison::detail::exchange_step;
using unison::detail::node_layout;

/// How often each rank's data is in a value.
using contributions = std::vector<int>;

struct outcome {
    bool completed = false;  ///< every rank ran every step
    bool leftovers = false;  ///< a message nobody received
    bool exact = true;       ///< every result holds every rank once
    int most_steps = 0;      ///< the longest schedule
    int results_written = 0; ///< ranks that wrote their result exactly once
};

/// Runs every rank's schedule: two_level over nodes named by `node_of`, or
/// recursive doubling over every rank.
outcome run(const std::vector<int>& node_of, bool two_level) {
    const int n = static_cast<int>(node_of.size());
    struct rank_run {
        exchange_plan plan;
        int at = 0;
        bool posted = false;
        int last_reduce = -1;
        contributions partial, result;
        int writes = 0;
    };
    std::vector<rank_run> ranks(static_cast<std::size_t>(n));
    std::map<std::pair<int, int>, std::deque<contributions>> wire; // (from, to)
    outcome out;
    for (int r = 0; r < n; ++r) {
        rank_run& me = ranks[static_cast<std::size_t>(r)];
        if (two_level) {
            unison::detail::plan_two_level(r, node_layout::of(node_of, r), me.plan);
        } else {
            unison::detail::plan_recursive_doubling(r, n, me.plan);
        }
        me.last_reduce = me.plan.last_reduce();
        me.partial.assign(static_cast<std::size_t>(n), 0);
        me.partial[static_cast<std::size_t>(r)] = 1;
        out.most_steps = std::max(out.most_steps, me.plan.size());
        if (me.plan.size() == 0) {
            me.result = me.partial; // one rank: the copy
            ++me.writes;
        }
    }
    for (bool moved = true; moved;) {
        moved = false;
        for (int r = 0; r < n; ++r) {
            rank_run& me = ranks[static_cast<std::size_t>(r)];
            if (me.at == me.plan.size()) {
                continue;
            }
            const exchange_step& s = me.plan[me.at];
            if (!me.posted) { // the send leaves with the partial result as it is now
                if (s.send) {
                    wire[{r, s.peer}].push_back(me.partial);
                }
                me.posted = true;
                moved = true;
            }
            if (s.recv) {
                auto& q = wire[{s.peer, r}];
                if (q.empty()) {
                    continue;
                }
                const contributions arrived = q.front();
                q.pop_front();
                if (s.final) {
                    me.partial = arrived;
                    me.result = arrived;
                    ++me.writes;
                } else if (s.reduce) {
                    for (int k = 0; k < n; ++k) {
                        me.partial[static_cast<std::size_t>(k)] +=
                            arrived[static_cast<std::size_t>(k)];
                    }
                    if (me.at == me.last_reduce) {
                        me.result = me.partial;
                        ++me.writes;
                    }
                }
            }
            ++me.at;
            me.posted = false;
            moved = true;
        }
    }
    out.completed = true;
    for (const rank_run& me : ranks) {
        out.completed = out.completed && me.at == me.plan.size();
        out.results_written += me.writes == 1 ? 1 : 0;
        out.exact = out.exact && me.result == contributions(static_cast<std::size_t>(n), 1);
    }
    for (const auto& [pair, q] : wire) {
        out.leftovers = out.leftovers || !q.empty();
    }
    return out;
}

void check_layout(const std::vector<int>& node_of, const std::string& name) {
    const int n = static_cast<int>(node_of.size());
    for (bool two_level : {false, true}) {
        CAPTURE(name);
        CAPTURE(n);
        CAPTURE(two_level);
        const outcome o = run(node_of, two_level);
        CHECK(o.completed);
        CHECK_FALSE(o.leftovers);
        CHECK(o.exact);
        CHECK(o.results_written == n);
        CHECK(o.most_steps <= exchange_plan::capacity);
    }
}

} // namespace

TEST_CASE("schedules: recursive doubling and two_level pair up and sum every rank once") {
    std::mt19937 rng(7);
    for (int n = 1; n <= 40; ++n) {
        for (int per : {1, 2, 3, 4, 8}) {
            std::vector<int> blocks(static_cast<std::size_t>(n)), round_robin = blocks;
            const int nodes = (n + per - 1) / per;
            for (int r = 0; r < n; ++r) {
                blocks[static_cast<std::size_t>(r)] = r / per;
                round_robin[static_cast<std::size_t>(r)] = r % nodes;
            }
            check_layout(blocks, "blocks of " + std::to_string(per));
            check_layout(round_robin, "round robin over " + std::to_string(nodes) + " nodes");
        }
        std::vector<int> random(static_cast<std::size_t>(n));
        for (int& node : random) {
            node = static_cast<int>(rng() % 5) * 100; // any names, uneven nodes
        }
        check_layout(random, "random over 5 nodes");
    }
    // Larger: 128 ranks in nodes of 8, and 100 in nodes of 7 and one of 2.
    std::vector<int> big(128), odd(100);
    for (int r = 0; r < 128; ++r) {
        big[static_cast<std::size_t>(r)] = r / 8;
    }
    for (int r = 0; r < 100; ++r) {
        odd[static_cast<std::size_t>(r)] = r / 7;
    }
    check_layout(big, "128 in nodes of 8");
    check_layout(odd, "100 in nodes of 7");
}

TEST_CASE("schedules: two_level sends one message per node across nodes at each step") {
    // 64 ranks in nodes of 8: only the 8 leaders talk across nodes, 3 steps each.
    std::vector<int> node_of(64);
    for (int r = 0; r < 64; ++r) {
        node_of[static_cast<std::size_t>(r)] = r / 8;
    }
    for (int r = 0; r < 64; ++r) {
        exchange_plan plan;
        unison::detail::plan_two_level(r, node_layout::of(node_of, r), plan);
        int across = 0;
        for (int i = 0; i < plan.size(); ++i) {
            across += plan[i].peer / 8 != r / 8 ? 1 : 0;
        }
        CAPTURE(r);
        CHECK(across == (r % 8 == 0 ? 3 : 0));
        // Up and down the node's tree (3 levels), plus the leaders' 3 exchanges.
        CHECK(plan.size() <= 3 + 3 + 3);
    }
    const node_layout l = node_layout::of(node_of, 13);
    CHECK(l.members == std::vector<int>{8, 9, 10, 11, 12, 13, 14, 15});
    CHECK(l.leaders == std::vector<int>{0, 8, 16, 24, 32, 40, 48, 56});
    CHECK(l.node_ranks == 8);
    CHECK_FALSE(l.one_node(64));
    CHECK(node_layout::of(std::vector<int>(5, 3), 2).one_node(5));
}
