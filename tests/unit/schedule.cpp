// The MPI backend's exchange schedules (mpi/detail/schedule.hpp), every rank's run in
// one process: messages travel in order between each pair, as MPI delivers them on
// one tag, and a step completes once its messages have arrived. For every layout of
// ranks on nodes (blocks, round robin, uneven, random), the schedules must pair up
// without a deadlock or a message left over, every rank's result must hold every
// rank's data exactly once, and every rank must have summed in the same order (the
// same bits): a pair's two operands commute, a group sums in its order.

#include <unison/mpi/detail/schedule.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
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

/// A value: its contributions, and how it was summed ("3", "(0+1)", "(0+1+2)"),
/// a pair's operands in a canonical order since a + b and b + a are the same bits.
struct value {
    contributions from;
    std::string sum;
};

struct outcome {
    bool completed = false;  ///< every rank ran every step
    bool leftovers = false;  ///< a message nobody received
    bool exact = true;       ///< every result holds every rank once
    bool same_order = true;  ///< every rank's result summed in the same order
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
        value partial, result;
        int writes = 0;
    };
    std::vector<rank_run> ranks(static_cast<std::size_t>(n));
    std::map<std::pair<int, int>, std::deque<value>> wire; // (from, to)
    outcome out;
    for (int r = 0; r < n; ++r) {
        rank_run& me = ranks[static_cast<std::size_t>(r)];
        if (two_level) {
            unison::detail::plan_two_level(r, node_layout::of(node_of, r), me.plan);
        } else {
            unison::detail::plan_recursive_doubling(r, n, me.plan);
        }
        me.last_reduce = me.plan.last_reduce();
        me.partial.from.assign(static_cast<std::size_t>(n), 0);
        me.partial.from[static_cast<std::size_t>(r)] = 1;
        me.partial.sum = std::to_string(r);
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
            if (!me.posted) { // the sends leave with the partial result as it is now
                for (int k = 0; s.send && k < s.count; ++k) {
                    wire[{r, s.peer(k)}].push_back(me.partial);
                }
                me.posted = true;
                moved = true;
            }
            if (s.recv) {
                bool all_here = true;
                for (int k = 0; k < s.count; ++k) {
                    all_here = all_here && !wire[{s.peer(k), r}].empty();
                }
                if (!all_here) {
                    continue;
                }
                std::vector<value> arrived;
                for (int k = 0; k < s.count; ++k) {
                    auto& q = wire[{s.peer(k), r}];
                    arrived.push_back(q.front());
                    q.pop_front();
                }
                if (s.final) {
                    me.partial = arrived[0];
                    me.result = arrived[0];
                    ++me.writes;
                } else if (s.reduce) {
                    // The group's values in its order, this rank's at its place.
                    arrived.insert(arrived.begin() + s.place, me.partial);
                    if (arrived.size() == 2 && arrived[1].sum < arrived[0].sum) {
                        std::swap(arrived[0], arrived[1]);
                    }
                    value sum{contributions(static_cast<std::size_t>(n), 0), "("};
                    for (std::size_t a = 0; a < arrived.size(); ++a) {
                        for (int k = 0; k < n; ++k) {
                            sum.from[static_cast<std::size_t>(k)] +=
                                arrived[a].from[static_cast<std::size_t>(k)];
                        }
                        sum.sum += (a == 0 ? "" : "+") + arrived[a].sum;
                    }
                    sum.sum += ")";
                    me.partial = sum;
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
        out.exact = out.exact && me.result.from == contributions(static_cast<std::size_t>(n), 1);
        out.same_order = out.same_order && me.result.sum == ranks[0].result.sum;
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
        CHECK(o.same_order);
        CHECK(o.results_written == n);
        CHECK(o.most_steps <= exchange_plan::capacity);
    }
}

/// Calls check(node_of, name) for every layout the schedules are tried on: 1 to 40
/// ranks in blocks of 1, 2, 3, 4 and 8 ranks, round robin over as many nodes, and
/// at random over 5 nodes (from `seed`); then 128 ranks in nodes of 8 and 100 in
/// nodes of 7 and one of 2.
template <class Check>
void for_every_layout(unsigned seed, Check&& check) {
    std::mt19937 rng(seed);
    for (int n = 1; n <= 40; ++n) {
        for (int per : {1, 2, 3, 4, 8}) {
            std::vector<int> blocks(static_cast<std::size_t>(n)), round_robin = blocks;
            const int nodes = (n + per - 1) / per;
            for (int r = 0; r < n; ++r) {
                blocks[static_cast<std::size_t>(r)] = r / per;
                round_robin[static_cast<std::size_t>(r)] = r % nodes;
            }
            check(blocks, "blocks of " + std::to_string(per));
            check(round_robin, "round robin over " + std::to_string(nodes) + " nodes");
        }
        std::vector<int> random(static_cast<std::size_t>(n));
        for (int& node : random) {
            node = static_cast<int>(rng() % 5) * 100; // any names, uneven nodes
        }
        check(random, "random over 5 nodes");
    }
    std::vector<int> big(128), odd(100);
    for (int r = 0; r < 128; ++r) {
        big[static_cast<std::size_t>(r)] = r / 8;
    }
    for (int r = 0; r < 100; ++r) {
        odd[static_cast<std::size_t>(r)] = r / 7;
    }
    check(big, "128 in nodes of 8");
    check(odd, "100 in nodes of 7");
}

} // namespace

TEST_CASE("schedules: recursive doubling and two_level pair up and sum every rank once") {
    for_every_layout(7, check_layout);
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
            across += plan[i].peer() / 8 != r / 8 ? 1 : 0;
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

TEST_CASE("schedules: 3, 5 or 7 times a power of two end in a group of that many, others fold") {
    using unison::detail::doubling_shape_of;
    // q, 2q, 4q, ...: log2(n / q) pairs, then one step of the group; no fold.
    for (int q : {3, 5, 7}) {
        for (int n = q, steps = 1; n <= q * 1024; n *= 2, ++steps) {
            CAPTURE(n);
            CHECK(doubling_shape_of(n).group == q);
            CHECK(doubling_shape_of(n).participants == n);
            CHECK(doubling_shape_of(n).steps == steps);
            for (int r : {0, n / 2, n - 1}) {
                exchange_plan plan;
                unison::detail::plan_recursive_doubling(r, n, plan);
                CHECK(plan.size() == steps);
                // pairs at distance 1, 2, 4, ... within the q-th of the ranks r is in
                const int p = n / q, i = r % p, place = r / p;
                for (int s = 0, mask = 1; s + 1 < plan.size(); ++s, mask <<= 1) {
                    CHECK(plan[s].count == 1);
                    CHECK(plan[s].peer() == ((i ^ mask) + p * place));
                }
                // then the group: i, i + p, ..., i + (q - 1) p, this one at its place
                const exchange_step& g = plan[plan.size() - 1];
                CHECK(g.count == q - 1);
                CHECK(g.place == place);
                for (int k = 0, t = 0; t < q; ++t) {
                    if (t != place) {
                        CHECK(g.peer(k++) == i + p * t);
                    }
                }
            }
        }
    }
    // Over nodes of several ranks only when each q-th is whole nodes, or on one node.
    CHECK(doubling_shape_of(24, 8).group == 3);
    CHECK(doubling_shape_of(12, 4).group == 3);
    CHECK(doubling_shape_of(6, 6).group == 3);
    CHECK(doubling_shape_of(6, 8).group == 3);
    CHECK(doubling_shape_of(40, 8).group == 5);
    CHECK(doubling_shape_of(20, 4).group == 5);
    CHECK(doubling_shape_of(5, 8).group == 5);
    CHECK(doubling_shape_of(56, 8).group == 7);
    CHECK(doubling_shape_of(7, 7).group == 7);
    for (const auto& layout : {std::pair{12, 8}, {12, 6}, {10, 8}, {20, 8}, {14, 8}, {14, 4}}) {
        const int n = layout.first, per = layout.second;
        CAPTURE(n);
        CAPTURE(per);
        CHECK(doubling_shape_of(n, per).group == 1);
        CHECK(doubling_shape_of(n, per).participants ==
              static_cast<int>(std::bit_floor(static_cast<unsigned>(n))));
    }
    // Powers of two and the rest as before: 9 = 8 + a fold, 11 = 8 + 3 folded, ...
    for (int n : {2, 4, 9, 11, 13, 18, 27, 1000}) {
        CAPTURE(n);
        CHECK(doubling_shape_of(n).group == 1);
        CHECK(doubling_shape_of(n).participants ==
              static_cast<int>(std::bit_floor(static_cast<unsigned>(n))));
    }
}

namespace {

/// Runs every rank's node-aware all_gather schedule over nodes named by `node_of`:
/// a message carries the blocks its sender lists, which the sender must hold when
/// it posts the step, and must list the same blocks as the receive it meets (the
/// runs both cut them into then pair up). Every rank must end with every block,
/// none received twice, only leaders may send across nodes, once per step, and no
/// rank may send the whole buffer more often than its node's tree is deep.
void check_node_all_gather(const std::vector<int>& node_of, const std::string& name,
                           int flat_max_ranks) {
    using unison::detail::gather_message;
    using unison::detail::gather_step;
    const int n = static_cast<int>(node_of.size());
    CAPTURE(name);
    CAPTURE(n);
    CAPTURE(flat_max_ranks);
    struct rank_run {
        std::vector<gather_step> plan;
        std::size_t at = 0;
        bool posted = false;
        std::vector<int> holds; ///< how often each block arrived (or was its own)
    };
    std::vector<rank_run> ranks(static_cast<std::size_t>(n));
    std::map<std::pair<int, int>, std::deque<std::vector<int>>> wire; // (from, to)
    bool sends_held = true, lists_pair = true, leaders_only = true, shallow = true;
    std::size_t most_steps = 0;
    int nodes = 0;
    for (int r = 0; r < n; ++r) {
        rank_run& me = ranks[static_cast<std::size_t>(r)];
        const node_layout l = node_layout::of(node_of, r);
        nodes = static_cast<int>(l.leaders.size());
        me.plan = unison::detail::plan_node_all_gather(r, l, flat_max_ranks);
        me.holds.assign(static_cast<std::size_t>(n), 0);
        me.holds[static_cast<std::size_t>(r)] = 1;
        most_steps = std::max(most_steps, me.plan.size());
        int down = 0; // messages down the node's tree
        for (const gather_step& s : me.plan) {
            int across = 0;
            for (const gather_message& m : s.sends) {
                const bool other_node = node_of[static_cast<std::size_t>(m.peer)] !=
                                        node_of[static_cast<std::size_t>(r)];
                across += other_node ? 1 : 0;
                down += !other_node && m.blocks != std::vector<int>{r} ? 1 : 0;
            }
            leaders_only = leaders_only && (across == 0 || (r == l.members.front() && across == 1));
        }
        const int k = static_cast<int>(l.members.size());
        const int depth = k <= flat_max_ranks
                              ? k - 1 // one level: the leader sends to each
                              : static_cast<int>(std::bit_width(static_cast<unsigned>(k - 1)));
        shallow = shallow && down <= depth;
    }
    for (bool moved = true; moved;) {
        moved = false;
        for (int r = 0; r < n; ++r) {
            rank_run& me = ranks[static_cast<std::size_t>(r)];
            if (me.at == me.plan.size()) {
                continue;
            }
            const gather_step& s = me.plan[me.at];
            if (!me.posted) {
                for (const gather_message& m : s.sends) {
                    for (int b : m.blocks) {
                        sends_held = sends_held && me.holds[static_cast<std::size_t>(b)] > 0;
                    }
                    wire[{r, m.peer}].push_back(m.blocks);
                }
                me.posted = true;
                moved = true;
            }
            bool all_here = true;
            for (const gather_message& m : s.recvs) {
                all_here = all_here && !wire[{m.peer, r}].empty();
            }
            if (!all_here) {
                continue;
            }
            for (const gather_message& m : s.recvs) {
                auto& q = wire[{m.peer, r}];
                lists_pair = lists_pair && q.front() == m.blocks;
                for (int b : q.front()) {
                    ++me.holds[static_cast<std::size_t>(b)];
                }
                q.pop_front();
            }
            ++me.at;
            me.posted = false;
            moved = true;
        }
    }
    bool completed = true, exact = true, leftovers = false;
    for (const rank_run& me : ranks) {
        completed = completed && me.at == me.plan.size();
        exact = exact && me.holds == std::vector<int>(static_cast<std::size_t>(n), 1);
    }
    for (const auto& [pair, q] : wire) {
        leftovers = leftovers || !q.empty();
    }
    CHECK(completed);
    CHECK_FALSE(leftovers);
    CHECK(sends_held);
    CHECK(lists_pair);
    CHECK(exact);
    CHECK(leaders_only);
    CHECK(shallow);
    // Gather, ceil(log2 L) exchanges among the leaders, the node's share.
    const int bruck = static_cast<int>(std::bit_width(static_cast<unsigned>(nodes - 1)));
    CHECK(most_steps <= static_cast<std::size_t>(bruck + 2));
}

/// Down a binomial tree in every node, and from the leader directly in nodes of up
/// to 8 (the MPI backend's choice) or in every node.
void check_layouts(const std::vector<int>& node_of, const std::string& name) {
    for (int flat_max_ranks : {1, 8, 1 << 20}) {
        check_node_all_gather(node_of, name, flat_max_ranks);
    }
}

} // namespace

TEST_CASE("schedules: the node-aware all_gather gives every rank every block once") {
    for_every_layout(11, check_layouts);
    // Nodes in order: a leader's message to another leader is one run per node, and
    // to its node's ranks two runs (the blocks before and after theirs).
    std::vector<int> eight(64);
    for (int r = 0; r < 64; ++r) {
        eight[static_cast<std::size_t>(r)] = r / 8;
    }
    const auto plan = unison::detail::plan_node_all_gather(8, node_layout::of(eight, 8));
    REQUIRE(plan.size() == 5); // gather, 3 exchanges, down the node's tree
    CHECK(plan[0].recvs.size() == 7);
    CHECK(plan[1].sends.front().peer == 0);
    CHECK(plan[1].recvs.front().peer == 16);
    CHECK(plan[3].sends.front().blocks.size() == 32); // nodes 1-4 to leader 1 - 4 = 5 (40)
    CHECK(plan[3].sends.front().peer == 40);
    // The node's binomial tree, the farthest child first: 8 -> 12, 10, 9; 12 -> 14, 13.
    REQUIRE(plan[4].sends.size() == 3);
    CHECK(plan[4].sends[0].peer == 12);
    CHECK(plan[4].sends[1].peer == 10);
    CHECK(plan[4].sends[2].peer == 9);
    CHECK(plan[4].sends[0].blocks.size() == 63);
    const auto member = unison::detail::plan_node_all_gather(13, node_layout::of(eight, 13));
    REQUIRE(member.size() == 1);
    CHECK(member[0].sends.front().peer == 8);
    CHECK(member[0].sends.front().blocks == std::vector<int>{13});
    CHECK(member[0].recvs.front().peer == 12);
    CHECK(member[0].recvs.front().blocks.size() == 63);
    // One level in nodes of up to flat_max_ranks: the leader sends to its 7 ranks.
    const auto flat = unison::detail::plan_node_all_gather(8, node_layout::of(eight, 8), 8);
    REQUIRE(flat.size() == 5);
    CHECK(flat[4].sends.size() == 7);
    CHECK(unison::detail::plan_node_all_gather(13, node_layout::of(eight, 13), 8)[0]
              .recvs.front()
              .peer == 8);
    const auto inner = unison::detail::plan_node_all_gather(12, node_layout::of(eight, 12));
    REQUIRE(inner.size() == 2);
    CHECK(inner[0].recvs.front().peer == 8);
    REQUIRE(inner[1].sends.size() == 2);
    CHECK(inner[1].sends[0].peer == 14);
    CHECK(inner[1].sends[1].peer == 13);
}

TEST_CASE("schedules: the neighbour exchange pairs up and gives every rank every block once") {
    // Every even rank count to 130, every rank's steps side by side: the peers name
    // each other, each sends what its peer expects, only blocks it holds, and each
    // receives only blocks it lacks; after n / 2 steps every rank holds all n.
    using unison::detail::neighbour_exchange_step;
    for (int n = 2; n <= 130; n += 2) {
        CAPTURE(n);
        std::vector<std::vector<bool>> holds(static_cast<std::size_t>(n),
                                             std::vector<bool>(static_cast<std::size_t>(n)));
        for (int r = 0; r < n; ++r) {
            holds[static_cast<std::size_t>(r)][static_cast<std::size_t>(r)] = true;
        }
        std::size_t bad = 0;
        for (int g = 0; g < n / 2; ++g) {
            auto next = holds;
            for (int r = 0; r < n; ++r) {
                const auto mine = neighbour_exchange_step(r, n, g);
                const auto theirs = neighbour_exchange_step(mine.peer, n, g);
                bad += theirs.peer != r || mine.peer == r || mine.peer < 0 || mine.peer >= n;
                bad += theirs.send_block != mine.recv_block || theirs.blocks != mine.blocks;
                bad += mine.blocks != (g == 0 ? 1 : 2);
                bad += mine.recv_block + mine.blocks > n || mine.send_block + mine.blocks > n;
                for (int b = 0; b < mine.blocks; ++b) {
                    const auto sent = static_cast<std::size_t>(mine.send_block + b);
                    const auto got = static_cast<std::size_t>(mine.recv_block + b);
                    bad += sent < holds[0].size() && !holds[static_cast<std::size_t>(r)][sent];
                    if (got < holds[0].size()) {
                        bad += holds[static_cast<std::size_t>(r)][got];
                        next[static_cast<std::size_t>(r)][got] = true;
                    }
                }
            }
            holds = std::move(next);
        }
        CHECK(bad == 0);
        for (int r = 0; r < n; ++r) {
            CHECK(std::count(holds[static_cast<std::size_t>(r)].begin(),
                             holds[static_cast<std::size_t>(r)].end(), true) == n);
        }
    }
}
