#pragma once

/// \file
/// The schedules of the MPI backend's checked exchange (handshake.hpp): for one
/// rank, the peers each step sends to and receives from, and what the received data
/// is for. Two schedules: recursive doubling over every rank (with a group of three,
/// five or seven for rank counts of that many times a power of two, and the usual
/// fold of the ranks beyond the participants otherwise), and the node-aware two-level one (a binomial tree
/// inside each node up to its lowest rank, recursive doubling among those leaders,
/// the tree back down). And the node-aware all_gather's (node_all_gather.hpp runs
/// it, after the call check): each node's blocks gathered at its lowest rank, those
/// leaders exchanging whole nodes' blocks by Bruck's doubling, the result sent down
/// a binomial tree of each node's ranks. And the neighbour exchange's all-gather
/// (ring_allreduce.hpp runs it), step by step. They are plain functions of the rank and of which ranks
/// share a node, with no MPI in them, so that a test can run every rank's schedule
/// in one process and check that the messages pair up and that every result holds
/// every rank's data once.

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <span>
#include <unordered_map>
#include <vector>

namespace unison::detail {

/// Which ranks share a node, as one rank sees it.
struct node_layout {
    std::vector<int> members; ///< the ranks on this rank's node, ascending
    std::vector<int> leaders; ///< the lowest rank of every node, ascending
    std::vector<int> node;    ///< every rank's node: its leader's index in `leaders`
    int node_ranks = 1;       ///< the most ranks any node holds

    /// The layout that rank `rank` sees when rank r's node is named `node_of[r]`
    /// (any value; equal values share a node).
    static node_layout of(std::span<const int> node_of, int rank) {
        node_layout l;
        std::unordered_map<int, int> count, index;
        for (std::size_t r = 0; r < node_of.size(); ++r) {
            const int key = node_of[r];
            if (count[key]++ == 0) {
                index[key] = static_cast<int>(l.leaders.size());
                l.leaders.push_back(static_cast<int>(r));
            }
            l.node.push_back(index[key]);
            l.node_ranks = std::max(l.node_ranks, count[key]);
            if (key == node_of[static_cast<std::size_t>(rank)]) {
                l.members.push_back(static_cast<int>(r));
            }
        }
        return l;
    }
    /// Every rank on one node.
    bool one_node(int size) const noexcept { return node_ranks >= size; }
};

/// The largest group that ends recursive doubling (doubling_shape_of): 3, 5 or 7
/// times a power of two ranks meet in groups of that many instead of folding.
inline constexpr int max_group = 7;
/// The most peers of one step: a pair's one, or the others of a group.
inline constexpr int max_step_peers = max_group - 1;

/// One step of a checked exchange: this rank's message to each of its peers, each
/// peer's message to it, or both, posted together. In a group every member sends
/// its partial result to the others and reduces them all in the group's order, so
/// that every member holds the same bits.
struct exchange_step {
    /// In the group's order, this rank left out; -1 past `count`.
    std::array<int, max_step_peers> peers = [] {
        std::array<int, max_step_peers> none{};
        none.fill(-1);
        return none;
    }();
    int count = 1; ///< peers in this step
    int place = 0; ///< this rank's place in the group's order
    bool send = false;
    bool recv = false;
    bool reduce = false; ///< fold the received data into the partial result
    bool final = false;  ///< the received data is the result (and passes on from here)

    int peer(int i = 0) const noexcept { return peers[static_cast<std::size_t>(i)]; }

    /// A step with one peer.
    static constexpr exchange_step with(int peer, bool send, bool recv, bool reduce,
                                        bool final) noexcept {
        exchange_step s;
        s.peers[0] = peer;
        s.send = send;
        s.recv = recv;
        s.reduce = reduce;
        s.final = final;
        return s;
    }
};

/// A rank's steps, in order.
class exchange_plan {
public:
    /// Up the tree, the fold, recursive doubling and down the tree, for any int
    /// rank count: at most 31 + 2 + 1 + 31 + 31 steps.
    static constexpr int capacity = 128;

    void clear() noexcept { size_ = 0; }
    void add(exchange_step s) noexcept { steps_[static_cast<std::size_t>(size_++)] = s; }
    int size() const noexcept { return size_; }
    const exchange_step& operator[](int i) const noexcept {
        return steps_[static_cast<std::size_t>(i)];
    }
    /// The step whose reduction completes this rank's result, or -1 when the result
    /// arrives whole (a final step comes after the last reduction, or none reduces).
    int last_reduce() const noexcept {
        int last = -1;
        for (int i = 0; i < size_; ++i) {
            if (steps_[static_cast<std::size_t>(i)].final) {
                last = -1;
            } else if (steps_[static_cast<std::size_t>(i)].reduce) {
                last = i;
            }
        }
        return last;
    }

private:
    std::array<exchange_step, capacity> steps_{};
    int size_ = 0;
};

/// How recursive doubling among `count` participants goes: `participants` of them
/// exchange, the rest fold into them. A count of q times a power of two, q = 3, 5
/// or 7, exchanges as it is, pairs within each q-th of them and then one step in
/// groups of q (where the fold took two more steps of the whole buffer), when each
/// q-th is whole nodes of `node_ranks` (the most ranks a node holds; 1: a rank per
/// node) or they share one node: a group that spans a node boundary sends every
/// rank's share through the node's one link (simulated, 12 ranks on nodes of 8:
/// Rabenseifner's 1.28-1.49x MPI's best from 2 MiB, against 1.01-1.03x with the
/// fold). Any other count folds into the largest power of two below it. `steps`:
/// on the longest path.
struct doubling_shape {
    int participants = 1;
    int group = 1; ///< the group that ends it: 3, 5 or 7 (1: none, pairs only)
    int steps = 0;
};

constexpr doubling_shape doubling_shape_of(int count, int node_ranks = 1) noexcept {
    const auto log2 = [](int v) {
        return static_cast<int>(std::bit_width(static_cast<unsigned>(v))) - 1;
    };
    const int two = static_cast<int>(std::bit_floor(static_cast<unsigned>(count)));
    for (int q = 3; q <= max_group; q += 2) {
        if (count >= q && count % q == 0 && std::has_single_bit(static_cast<unsigned>(count / q)) &&
            (node_ranks <= 1 || node_ranks >= count || (count / q) % node_ranks == 0)) {
            return {count, q, 1 + log2(count / q)};
        }
    }
    return {two, 1, log2(two) + (count > two ? 2 : 0)};
}

/// Appends recursive doubling among `count` participants, this rank being
/// participant `me` and participant i rank `rank_of(i)`, with c =
/// doubling_shape_of(count, node_ranks).participants and rem = count - c. Of the first 2 rem
/// participants, each even one hands its data to the odd one after it and gets
/// the result back at the end (MPICH's fold); the other c, numbered v = 0 .. c - 1,
/// exchange with the partner at distance 1, 2, 4, ...; when c is q times a power
/// of two p (a group of q), within each q-th (v = i + p place, i < p), and then in
/// groups of q, i, i + p, ..., i + (q - 1) p, each sending to the q - 1 others.
/// Rabenseifner's schedules (rabenseifner.hpp) meet the same partners in the same
/// order.
template <class RankOf>
void add_recursive_doubling(int me, int count, RankOf rank_of, exchange_plan& plan,
                            int node_ranks = 1) {
    const doubling_shape shape = doubling_shape_of(count, node_ranks);
    const int rem = count - shape.participants;
    if (me < 2 * rem && me % 2 == 0) {
        plan.add(exchange_step::with(rank_of(me + 1), true, true, false, true));
        return;
    }
    if (me < 2 * rem) {
        plan.add(exchange_step::with(rank_of(me - 1), false, true, true, false));
    }
    const auto participant = [&](int v) { return rank_of(v < rem ? v * 2 + 1 : v + rem); };
    const int v = me < 2 * rem ? me / 2 : me - rem;
    // q places of p participants each (v = i + p place; one place without a group):
    // pairs within the place, then the group, i + p t.
    const int places = shape.group;
    const int p = shape.participants / places;
    const int i = v % p, place = v / p;
    for (int mask = 1; mask < p; mask <<= 1) {
        plan.add(exchange_step::with(participant((i ^ mask) + p * place), true, true, true, false));
    }
    if (places > 1) {
        exchange_step s = exchange_step::with(-1, true, true, true, false);
        s.count = places - 1;
        s.place = place;
        for (int t = 0, k = 0; t < places; ++t) {
            if (t != place) {
                s.peers[static_cast<std::size_t>(k++)] = participant(i + p * t);
            }
        }
        plan.add(s);
    }
    if (me < 2 * rem) {
        plan.add(exchange_step::with(rank_of(me - 1), true, false, false, false));
    }
}

/// Recursive doubling over ranks 0 .. size - 1.
inline void plan_recursive_doubling(int rank, int size, exchange_plan& plan, int node_ranks = 1) {
    plan.clear();
    add_recursive_doubling(
        rank, size, [](int i) { return i; }, plan, node_ranks);
}

/// The two-level schedule of `rank` over `nodes`: inside its node, a binomial tree
/// of the node's ranks (in ascending order, index i) reduces into the lowest: at
/// distance 1, 2, 4, ... an index with that bit set sends its partial result to
/// the index below and waits for the result; one without receives and folds.
/// The node's lowest ranks (one per node) then run recursive doubling among
/// themselves, and the result goes back down the same tree, the farthest child
/// first. Only the leaders' messages cross between nodes, one per node and step.
inline void plan_two_level(int rank, const node_layout& nodes, exchange_plan& plan) {
    plan.clear();
    const std::vector<int>& m = nodes.members;
    const int n = static_cast<int>(m.size());
    const int me = static_cast<int>(std::find(m.begin(), m.end(), rank) - m.begin()); // in the node
    int mask = 1;
    for (; mask < n; mask <<= 1) {
        if ((me & mask) != 0) {
            plan.add(exchange_step::with(m[static_cast<std::size_t>(me - mask)], true, true, false,
                                         true));
            break;
        }
        if (me + mask < n) {
            plan.add(exchange_step::with(m[static_cast<std::size_t>(me + mask)], false, true, true,
                                         false));
        }
    }
    if (me == 0) {
        const std::vector<int>& l = nodes.leaders;
        const int at = static_cast<int>(std::find(l.begin(), l.end(), rank) - l.begin());
        add_recursive_doubling(
            at, static_cast<int>(l.size()), [&](int i) { return l[static_cast<std::size_t>(i)]; },
            plan);
    }
    for (mask >>= 1; mask > 0; mask >>= 1) {
        if (me + mask < n) {
            plan.add(exchange_step::with(m[static_cast<std::size_t>(me + mask)], true, false, false,
                                         false));
        }
    }
}

/// One message of the node-aware all_gather: the blocks of `blocks` (ranks,
/// ascending), to or from `peer`. Sender and receiver list the same blocks, so the
/// runs of consecutive ranks that the message travels as pair up.
struct gather_message {
    int peer = -1;
    std::vector<int> blocks;
};

/// One step of the node-aware all_gather: messages posted together, all complete
/// before the next step.
struct gather_step {
    std::vector<gather_message> sends, recvs;
};

/// The node-aware all_gather of `rank` over `nodes`, whose nodes are numbered by
/// their leaders (the lowest rank of each), L of them:
/// 1. every rank but a leader sends its block to its leader and, in the same step,
///    posts the receive of every other block from its parent in the node's
///    binomial tree (the node's ranks in ascending order, index i; the parent of i
///    is i less its lowest set bit);
/// 2. a leader receives its node's blocks, then runs Bruck's all-gather among the
///    leaders, any L: at distance d = 1, 2, 4, ... < L, leader j sends the nodes
///    it holds, j .. j + min(d, L - d) - 1 (mod L), to leader j - d and receives
///    as many from leader j + d, so that after ceil(log2 L) steps it holds all L;
///    a node's blocks go as one message, whole runs of consecutive ranks;
/// 3. a leader, and then every rank with children in the tree, sends each child
///    every block but the child's own, the farthest child first: log2(k) hops
///    down a node of k ranks, no rank sending the whole buffer more than log2(k)
///    times. A node of at most `flat_max_ranks` ranks is a tree of one level
///    instead: the leader sends to each rank, and each rank receives from it.
/// Only the leaders' messages cross between nodes, each carrying whole nodes.
inline std::vector<gather_step> plan_node_all_gather(int rank, const node_layout& nodes,
                                                     int flat_max_ranks = 1) {
    std::vector<gather_step> plan;
    const std::vector<int>& m = nodes.members;
    const int n = static_cast<int>(nodes.node.size());
    const int k = static_cast<int>(m.size());
    const int me = static_cast<int>(std::find(m.begin(), m.end(), rank) - m.begin());
    const int leader = m.front();
    const auto all_but = [n](int r) {
        std::vector<int> b;
        b.reserve(static_cast<std::size_t>(n > 0 ? n - 1 : 0));
        for (int q = 0; q < n; ++q) {
            if (q != r) {
                b.push_back(q);
            }
        }
        return b;
    };
    // The node's tree: the parent and the children of index `me`, farthest first.
    const bool flat = k <= flat_max_ranks;
    const int lowest =
        me == 0 ? static_cast<int>(std::bit_ceil(static_cast<unsigned>(k))) : (me & -me);
    gather_step down;
    if (flat && me == 0) {
        for (std::size_t i = 1; i < m.size(); ++i) {
            down.sends.push_back({m[i], all_but(m[i])});
        }
    }
    for (int mask = lowest >> 1; !flat && mask > 0; mask >>= 1) {
        if (me + mask < k) {
            const int child = m[static_cast<std::size_t>(me + mask)];
            down.sends.push_back({child, all_but(child)});
        }
    }
    if (rank != leader) {
        gather_step s;
        s.sends.push_back({leader, {rank}});
        s.recvs.push_back(
            {flat ? leader : m[static_cast<std::size_t>(me - lowest)], all_but(rank)});
        plan.push_back(std::move(s));
        if (!down.sends.empty()) {
            plan.push_back(std::move(down));
        }
        return plan;
    }
    if (k > 1) {
        gather_step s;
        for (std::size_t i = 1; i < m.size(); ++i) {
            s.recvs.push_back({m[i], {m[i]}});
        }
        plan.push_back(std::move(s));
    }
    const std::vector<int>& l = nodes.leaders;
    const int nodes_count = static_cast<int>(l.size());
    const int j = static_cast<int>(std::find(l.begin(), l.end(), rank) - l.begin());
    // The blocks of nodes first .. first + count - 1 (mod L), ascending.
    const auto blocks_of = [&](int first, int count) {
        std::vector<bool> in(static_cast<std::size_t>(nodes_count), false);
        for (int c = 0; c < count; ++c) {
            in[static_cast<std::size_t>((first + c) % nodes_count)] = true;
        }
        std::vector<int> b;
        for (int q = 0; q < n; ++q) {
            if (in[static_cast<std::size_t>(nodes.node[static_cast<std::size_t>(q)])]) {
                b.push_back(q);
            }
        }
        return b;
    };
    for (int d = 1; d < nodes_count; d <<= 1) {
        const int count = std::min(d, nodes_count - d);
        gather_step s;
        s.sends.push_back({l[static_cast<std::size_t>((j - d + nodes_count) % nodes_count)],
                           blocks_of(j, count)});
        s.recvs.push_back(
            {l[static_cast<std::size_t>((j + d) % nodes_count)], blocks_of(j + d, count)});
        plan.push_back(std::move(s));
    }
    if (!down.sends.empty()) {
        plan.push_back(std::move(down));
    }
    return plan;
}

/// One step of the neighbour exchange's all-gather over an even number of ranks
/// `n`, as one rank sees it: the peer it trades with, and the first of the blocks
/// it sends and of those it receives (block q is rank q's), `blocks` of each in a
/// row.
struct neighbour_step {
    int peer = 0;
    int send_block = 0;
    int recv_block = 0;
    int blocks = 1;
};

/// Step `g` (0 to n/2 - 1) of rank `rank`'s neighbour exchange over `n` ranks, n
/// even. Step 0 swaps the rank's block with its partner's (rank ^ 1), so that both
/// hold their pair p = rank / 2 (blocks 2p and 2p + 1). In step g >= 1 the rank
/// trades, with the neighbour outside its pair (odd g: rank + d, d = +1 for the
/// pair's odd rank, -1 for its even one, around the ring) or with its partner
/// (even g), the pair it received in step g - 1 (its own in step 1), and receives
/// pair p + d (g + 1) / 2 (odd g) or p - d g / 2 (even g), mod n/2: the outer
/// neighbour hands it the pairs further along its side, the partner those from
/// the other side, so every pair arrives once.
constexpr neighbour_step neighbour_exchange_step(int rank, int n, int g) noexcept {
    if (g == 0) {
        return {rank ^ 1, rank, rank ^ 1, 1};
    }
    const int pairs = n / 2, p = rank / 2, d = rank % 2 == 1 ? 1 : -1;
    const auto pair_at = [&](int step) {
        const int at = step % 2 == 1 ? p + d * ((step + 1) / 2) : p - d * (step / 2);
        return (at % pairs + pairs) % pairs;
    };
    const int peer = g % 2 == 0 ? rank ^ 1 : (rank + d + n) % n;
    return {peer, 2 * (g == 1 ? p : pair_at(g - 1)), 2 * pair_at(g), 2};
}

} // namespace unison::detail
