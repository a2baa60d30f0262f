#!/usr/bin/env python3
"""A per-call cost model of data-parallel gradient synchronization: predicts one
synchronization of bench/training/model_shapes.json's gradients as one all-reduce per
tensor, in buckets, and as one flat all-reduce, from an all-reduce sweep.

    mpiexec -n 2 --mca btl self,tcp unison-bench -B mpi -b 8 -e 32M -f 4 --format csv > sweep.csv
    python3 bench/training/cost_model.py sweep.csv
    python3 bench/training/cost_model.py --latency-us 5 --gbps 12.5      # a network given by hand

Model: one all-reduce of s bytes costs  t(s) = a + s / b  (a: the per-call latency,
b: the effective bandwidth, algbw), fitted to the sweep's out-of-place times by
least squares on the relative error (the sizes span seven decades). Calls are
taken to run one after another (a link carries one at a time), so

    per-tensor  = sum over tensors of t(size)
    bucketed    = sum over buckets of t(bucket bytes)
    flat        = t(all bytes)

Buckets are formed as unison's reducer forms them after its rebuild: gradients in
backward order (the reverse of the list), a bucket closed once it holds at least
its cap (the first bucket's cap is --first, the others' --bucket).

Memory passes: unison's reducer over the thread and MPI backends reduces a
bucket in place between its gradients, and every mode divides inside the
reduction (avg), so none of them makes a pass over memory of its own. A reducer
that packs (a custom hook, mixed precision, or a backend without
all_reduce_coalesced) makes two: packing, and unpacking with the division. With
--packing and --copy-gbps G those two are added to bucketed, each costing
bytes / G (G is memcpy's bytes copied per second). On a real network the packing
of a bucket overlaps earlier buckets on the wire, the slower of the two; over
loopback TCP the CPU does the wire's work too, and the passes show.

At scale (--scale): what one training step communicates at 8 to 1024 ranks, for a
GPT-2-small (124M parameters) and a GPT-3-XL-sized (1.3B) model, under the MPI
backend's all-reduce algorithms and the tuning's choice among them (the rules of
include/unison/mpi/tuning.hpp, mirrored here and checked against the algorithm
the simulation reports). Per all-reduce of m bytes over p ranks, with a the
latency of one message and b the bandwidth, P the largest power of two <= p and
f = 1 when p is not one (the fold: 2 (a + m/b) more), to first order (the model
sums each message's own cost along the critical path; when p is q = 3, 5 or 7
times a power of two, P = p / q and a group of q takes the fold's place: a +
(q-1) m/b, for Rabenseifner 2 (a + (q-1)/q m/(P b)), the group reduce-scattering
its block and gathering it back):

    recursive doubling  log2(P) (a + m/b)                  + f 2 (a + m/b)
    Rabenseifner        2 log2(P) a + 2 (P-1)/P m/b        + f 2 (a + m/b)
    ring                2 (p-1) (a + m/(p b))
    direct exchange     2 (a + (p-1)/p m/b)    (3 to 8 ranks: p - 1 messages at once)

and a reduce-scatter or all-gather (recursive halving or doubling: unison's own
reduce-scatter over several nodes and all-gather below 64 KiB, MPI's at scale
otherwise) log2(P) a + (p-1)/p m/b. A DDP step all-reduces its gradients in
buckets (--bucket, --first); a FSDP step all-gathers each unit's parameters
twice (forward and backward) and reduce-scatters its gradients. Calls run one
after another and compute is left out: these are the step's communication
times, the floor a step approaches when backward hides nothing.

    python3 bench/training/cost_model.py --scale --latency-us 2 --gbps 12.5
    python3 bench/training/cost_model.py --scale --check sim.csv    # a and b fitted to the
                                                           # simulation's smallest N,
                                                           # checked at the others

A message's cost depends on its size as SMPI's (and a real MPI's) does: a and b
below the eager limit (64 KiB, simulate.sh's setting), a rendezvous' own a and b
from it; --check fits all four.
"""

import argparse
import csv
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
MIB = 1 << 20


def load_sizes(path, element_bytes):
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    sizes = []
    for t in doc["tensors"]:
        n = 1
        for d in t["shape"]:
            n *= int(d)
        sizes.append(n * element_bytes)
    return sizes


def fit(points):
    """a, b of t = a + s / b minimizing sum ((a + s c - t) / t)^2, c = 1 / b."""
    # Normal equations of the weighted linear least squares in (a, c), weights 1/t^2.
    saa = sac = scc = sat = sct = 0.0
    for s, t in points:
        w = 1.0 / (t * t)
        saa += w
        sac += w * s
        scc += w * s * s
        sat += w * t
        sct += w * s * t
    det = saa * scc - sac * sac
    a = (sat * scc - sac * sct) / det
    c = (saa * sct - sac * sat) / det
    return a, 1.0 / c


def read_sweep(path):
    points = []
    with open(path, encoding="utf-8") as f:
        rows = [line for line in f if not line.startswith("#")]
    for row in csv.DictReader(rows):
        if row.get("table", "unison") != "unison":
            continue
        points.append((float(row["size"]), float(row["oop_time_us"]) * 1e-6))
    if len(points) < 2:
        raise SystemExit(f"{path}: fewer than two unison rows to fit")
    return points


def buckets(sizes, first_cap, cap):
    out, current, limit = [], 0, first_cap
    for s in reversed(sizes):
        current += s
        if current >= limit:
            out.append(current)
            current, limit = 0, cap
    if current:
        out.append(current)
    return out


# ---- At scale ----------------------------------------------------------------

KIB = 1024

# mpi/tuning.hpp, mirrored (check_against_simulation tells when they drift apart:
# the simulation's driver reports the algorithm the C++ tuning chose).
TUNING = {
    "node_ring_max_ranks": 3,
    "node_ring_min_bytes": 64 * KIB,
    "node_large_ring_max_ranks": 4,
    "node_large_ring_min_bytes": 1 * MIB,
    "node_rabenseifner_min_bytes": 64 * KIB,
    "few_ranks_rabenseifner_min_bytes": 2 * MIB,
    "some_ranks_rabenseifner_min_bytes": 16 * KIB,
    "many_ranks_rabenseifner_min_bytes": 16 * KIB,
    "odd_few_ring_min_bytes": 64 * KIB,
    "odd_some_ranks": 8,
    "odd_some_ring_min_bytes": 2 * MIB,
    "odd_rabenseifner_min_bytes": 64 * KIB,
    "ring_min_bytes_per_rank": 512 * KIB,
    "two_nodes_two_level_min_bytes": 8 * KIB,
    "few_nodes_two_level_min_bytes": 2 * KIB,
    "many_nodes_two_level_min_bytes": 1 * KIB,
    "two_level_max_bytes": 32 * KIB,
    "two_level_bounds_node_ranks": 8,
    "two_level_largest_scaled_node_ranks": 32,
    "direct_max_ranks": 8,
    "direct_min_bytes": 32 * KIB,
}

# Ranks per node on each simulated platform (bench/simulation/platforms/).
PLATFORM_NODE_RANKS = {"flat": 1, "two_level": 8, "fat_tree": 1}


def read_tuning(path):
    """The thresholds of tuning.hpp, where they can be read (else TUNING's)."""
    import re
    t = dict(TUNING)
    try:
        text = open(path, encoding="utf-8").read()
    except OSError:
        return t
    for name in t:
        m = re.search(r"constexpr\s+\w+(?:::\w+)?\s+" + name + r"\s*=\s*([^;]+);", text)
        if m:
            expr = m.group(1).replace(" ", "")
            value = 1
            for factor in expr.split("*"):
                value *= int(factor)
            t[name] = value
    return t


def pow2_floor(p):
    return 1 << (p.bit_length() - 1)


def group_of(p):
    """The group that ends p ranks' recursive doubling (mpi/detail/schedule.hpp's
    doubling_shape_of, a rank per node): q when p is q = 3, 5 or 7 times a power of
    two, else 1 (pairs, and the fold when p is not a power of two)."""
    for q in (3, 5, 7):
        if p >= q and p % q == 0 and (p // q) & (p // q - 1) == 0:
            return q
    return 1


def uneven_two_level(p, node_ranks):
    """mpi_tuning::uneven_two_level: nodes filled in order, the last not full and
    holding fewer than half a node, or one of three nodes."""
    if node_ranks <= 1 or p <= node_ranks:
        return False
    last, nodes = p % node_ranks, -(-p // node_ranks)
    return last != 0 and (2 * last < node_ranks or nodes == 3)


def tuned(t, m, p, node_ranks=1):
    """The algorithm mpi_tuning::all_reduce picks (its rules, in Python), over p
    ranks of which at most node_ranks share a node."""
    one_node = node_ranks >= p
    if node_ranks <= 1 and 3 <= p <= t["direct_max_ranks"] and m >= t["direct_min_bytes"]:
        return "rank_ordered"  # the direct exchange
    if uneven_two_level(p, node_ranks):
        return "two_level"
    flat = tuned_by_size(t, m, p, one_node)
    if one_node or node_ranks <= 1:
        return flat
    nodes = -(-p // node_ranks)
    least = (t["two_nodes_two_level_min_bytes"] if nodes <= 2 else
             t["few_nodes_two_level_min_bytes"] if nodes <= 4 else
             t["many_nodes_two_level_min_bytes"])
    # Larger nodes take two_level sooner (mpi_tuning::two_level_min_bytes): the
    # bound falls with the square of the node's size over 8, up to nodes of 32.
    measured, largest = t["two_level_bounds_node_ranks"], t["two_level_largest_scaled_node_ranks"]
    size = min(max(node_ranks, measured), largest)
    least = least * measured * measured // (size * size)
    if m < least:
        return flat
    if m < t["two_level_max_bytes"]:
        return "two_level" if flat in ("recursive_doubling", "rabenseifner") else flat
    if p > t["odd_some_ranks"]:
        return "rabenseifner" if flat in ("recursive_doubling", "ring") else flat
    if flat == "ring":  # up to odd_some_ranks, not a power of two
        return "two_level" if nodes == 2 else "rabenseifner"
    return "two_level" if flat == "recursive_doubling" else flat


def tuned_by_size(t, m, p, one_node):
    if p <= 1:
        return "recursive_doubling"
    if one_node and p <= t["node_ring_max_ranks"]:
        return "recursive_doubling" if m < t["node_ring_min_bytes"] else "ring"
    if one_node and p <= t["node_large_ring_max_ranks"] and m >= t["node_large_ring_min_bytes"]:
        return "ring"
    if p & (p - 1):
        if p <= t["odd_some_ranks"]:
            ring_from = t["odd_few_ring_min_bytes"] if p <= 4 else t["odd_some_ring_min_bytes"]
            return "recursive_doubling" if m < ring_from else "ring"
        # across nodes the fold costs recursive doubling the same: from a power of two's
        if m < t["odd_rabenseifner_min_bytes" if one_node else "many_ranks_rabenseifner_min_bytes"]:
            return "recursive_doubling"
        return "ring" if m // p >= t["ring_min_bytes_per_rank"] else "rabenseifner"
    if one_node:
        least = t["node_rabenseifner_min_bytes"]
    elif p == 2:
        least = float("inf")
    elif p <= 4:
        least = t["few_ranks_rabenseifner_min_bytes"]
    elif p <= 8:
        least = t["some_ranks_rabenseifner_min_bytes"]
    else:
        least = t["many_ranks_rabenseifner_min_bytes"]
    return "recursive_doubling" if m < least else "rabenseifner"


class network:
    """A message of s bytes costs a + s / b: (a, b) = (eager_a, eager_b) below the
    eager limit, (rendezvous_a, rendezvous_b) from it (a rendezvous waits for its
    receive: SMPI, like real MPIs, charges it several latencies)."""

    def __init__(self, a, b, rendezvous_a=None, rendezvous_b=None, eager_limit=64 * KIB):
        self.a, self.b = a, b
        self.ra = a if rendezvous_a is None else rendezvous_a
        self.rb = b if rendezvous_b is None else rendezvous_b
        self.eager_limit = eager_limit

    def terms(self, s):
        """(messages, bytes) of one message of s bytes, per regime: eager, rendezvous."""
        return (1, s, 0, 0) if s < self.eager_limit else (0, 0, 1, s)

    def cost(self, terms):
        ne, be, nr, br = terms
        return ne * self.a + be / self.b + nr * self.ra + br / self.rb


def add(x, y, k=1):
    return tuple(u + k * v for u, v in zip(x, y))


def all_reduce_terms(algo, m, p, net):
    """The messages on an all-reduce's critical path, as network.terms sums."""
    zero = (0, 0, 0, 0)
    if p <= 1:
        return zero
    big = pow2_floor(p)
    fold = zero if big == p else add(zero, net.terms(m), 2)
    q = group_of(p)
    if q > 1:  # a group of q: each buffer to the q - 1 others, no fold
        big = p // q
        ne, be, nr, br = net.terms(m)
        fold = (ne, (q - 1) * be, nr, (q - 1) * br)
    steps = big.bit_length() - 1
    if algo in ("recursive_doubling", "two_level"):  # one level: the same messages
        return add(fold, net.terms(m), steps)
    if algo == "rabenseifner":  # a group reduce-scatters a p-th, then gathers it back
        out = fold
        if q > 1:
            ne, be, nr, br = net.terms(m / (big * q))
            out = (2 * ne, 2 * (q - 1) * be, 2 * nr, 2 * (q - 1) * br)
        for k in range(1, steps + 1):  # halving, then doubling back
            out = add(out, net.terms(m / (1 << k)), 2)
        return out
    if algo == "ring":
        return add(zero, net.terms(m / p), 2 * (p - 1))
    if algo == "rank_ordered":  # the direct exchange: two steps of p - 1 messages of
        ne, be, nr, br = net.terms(m / p)  # m / p, side by side on one link
        return add(zero, (ne, be * (p - 1), nr, br * (p - 1)), 2)
    raise ValueError(algo)


def all_reduce_time(algo, m, p, net):
    return net.cost(all_reduce_terms(algo, m, p, net))


def gather_time(m, p, net):
    """A reduce-scatter or all-gather of m bytes in all, by recursive halving or
    doubling (one exchange more when p is not a power of two; a group of q first
    when p is q = 3, 5 or 7 times one, taken at an all-gather's size)."""
    if p <= 1:
        return 0.0
    big = pow2_floor(p)
    out = (0, 0, 0, 0) if big == p else net.terms(m / p)
    q = group_of(p)
    if q > 1:  # a group of q first: a block to each of the q - 1 others
        big = p // q
        ne, be, nr, br = net.terms(m / p)
        out = (ne, (q - 1) * be, nr, (q - 1) * br)
    for k in range(1, big.bit_length()):
        out = add(out, net.terms(m / (1 << k)))
    return net.cost(out)


def solve(matrix, rhs):
    """Gaussian elimination with partial pivoting (no numpy needed)."""
    n = len(rhs)
    a = [row[:] + [r] for row, r in zip(matrix, rhs)]
    for c in range(n):
        pivot = max(range(c, n), key=lambda r: abs(a[r][c]))
        a[c], a[pivot] = a[pivot], a[c]
        if abs(a[c][c]) < 1e-300:
            raise SystemExit("the fit is singular: give more sizes on both sides of the "
                             "eager limit")
        for r in range(n):
            if r != c:
                f = a[r][c] / a[c][c]
                a[r] = [x - f * y for x, y in zip(a[r], a[c])]
    return [a[i][n] / a[i][i] for i in range(n)]


def gpt_tensors(layers, d, vocab, ctx):
    """Parameter counts of a GPT-2-style model, in registration order."""
    out = [vocab * d, ctx * d]  # token and position embeddings (the head is tied)
    blocks = []
    for _ in range(layers):
        block = [d, d, 3 * d * d, 3 * d, d * d, d, d, d, 4 * d * d, 4 * d, 4 * d * d, d]
        blocks.append(block)
        out += block
    out += [d, d]  # final layer norm
    return out, blocks


MODELS = {
    "124M": dict(layers=12, d=768, vocab=50257, ctx=1024),
    "1.3B": dict(layers=24, d=2048, vocab=50257, ctx=2048),
}


def check_against_simulation(path, t, ranks_fit, drift_only=False, node_ranks_two_level=8):
    """a, b fitted to the simulation's automatic rows at the smallest rank count
    (flat platform), then every row at the other counts predicted from them. The
    CSV does not say how many ranks a two_level node held: node_ranks_two_level
    (simulate.sh's --node-ranks, 8 unless it was given)."""
    node_ranks_of = dict(PLATFORM_NODE_RANKS, two_level=node_ranks_two_level)
    rows, checked = [], []
    with open(path, encoding="utf-8") as f:
        for r in csv.DictReader(f):
            if r.get("platform") == "platform":  # a repeated header line
                continue
            if r["algorithm"] != "automatic":
                continue
            row = (int(r["ranks"]), int(r["bytes"]), r["chosen"], float(r["us"]) * 1e-6)
            node_ranks = node_ranks_of.get(r["platform"], 1)
            checked.append((r["platform"], node_ranks) + row)
            if r["platform"] == "flat":
                rows.append(row)
    drift = [(pl, p, m, c, tuned(t, m, p, k)) for pl, k, p, m, c, _ in checked
             if c != tuned(t, m, p, k)]
    for pl, p, m, c, mine in drift:
        print(f"  tuning drift: {pl}, {p} ranks, {m} B: the C++ tuning ran {c}, "
              f"this model {mine}")
    if drift_only:
        print(f"{len(checked)} rows, {len(drift)} tuning drifts")
        raise SystemExit(1 if drift else 0)
    if not rows:
        raise SystemExit(f"{path}: no automatic rows on the flat platform")
    fit_at = ranks_fit or min(p for p, _, _, _ in rows)
    # Least squares on the relative error over the rows at fit_at, each through its
    # own algorithm's messages: t = ne a + be / b + nr ra + br / rb.
    probe = network(1.0, 1.0)
    normal = [[0.0] * 4 for _ in range(4)]
    rhs = [0.0] * 4
    for p, m, c, us in rows:
        if p != fit_at:
            continue
        x = all_reduce_terms(c, m, p, probe)
        w = 1.0 / (us * us)
        for i in range(4):
            rhs[i] += w * x[i] * us
            for j in range(4):
                normal[i][j] += w * x[i] * x[j]
    a, inv_b, ra, inv_rb = solve(normal, rhs)
    net = network(a, 1.0 / inv_b, ra, 1.0 / inv_rb)
    print(f"fit at {fit_at} ranks: messages under {net.eager_limit // KIB} KiB "
          f"{a * 1e6:.2f} us + bytes at {net.b / 1e9:.2f} GB/s, larger ones "
          f"{ra * 1e6:.2f} us + bytes at {net.rb / 1e9:.2f} GB/s")
    worst = 1.0
    print(f"  {'ranks':>5} {'bytes':>10} {'algorithm':>18} {'simulated us':>13} "
          f"{'model us':>10} {'model/sim':>9}")
    for p, m, c, us in sorted(rows):
        model = all_reduce_time(c, m, p, net)
        ratio = model / us
        if p != fit_at:
            worst = max(worst, ratio, 1 / ratio)
        print(f"  {p:>5} {m:>10} {c:>18} {us * 1e6:>13.1f} {model * 1e6:>10.1f} {ratio:>9.2f}")
    print(f"  worst at the other rank counts: {worst:.2f}x either way; "
          f"{len(drift)} tuning drifts")
    return net


def scale(args):
    t = read_tuning(os.path.join(HERE, "..", "..", "include", "unison", "mpi", "tuning.hpp"))
    if args.check:
        net = check_against_simulation(args.check, t, args.fit_ranks, args.drift_only,
                                       args.node_ranks)
    elif args.latency_us is not None and args.gbps is not None:
        net = network(args.latency_us * 1e-6, args.gbps * 1e9)
    else:
        raise SystemExit("--scale needs --check sim.csv, or --latency-us and --gbps")
    ranks = [int(x) for x in args.ranks.split(",")]
    print(f"\none training step's communication; fp32 gradients, DDP buckets of {args.bucket:g} MiB "
          f"(first {args.first:g} MiB), FSDP units of one block, bf16 parameters gathered")
    for name, shape in MODELS.items():
        sizes, blocks = gpt_tensors(**shape)
        params = sum(sizes)
        grads = [4 * n for n in sizes]
        bucket_list = buckets(grads, args.first * MIB, args.bucket * MIB)
        # FSDP units: the embeddings (and final norm) as one, then each block.
        units = [sum(sizes) - sum(sum(bl) for bl in blocks)] + [sum(bl) for bl in blocks]
        print(f"\n{name}: {params / 1e6:.1f} M parameters, {len(bucket_list)} DDP buckets, "
              f"{len(units)} FSDP units")
        print(f"  {'ranks':>5} {'DDP tuned ms':>12} {'ring ms':>9} {'rd ms':>9} {'rab ms':>9} "
              f"{'flat ms':>8} {'FSDP ms':>9}  tuned picks")
        for p in ranks:
            per = {algo: sum(all_reduce_time(algo, m, p, net) for m in bucket_list)
                   for algo in ("ring", "recursive_doubling", "rabenseifner")}
            picks = [tuned(t, m, p) for m in bucket_list]
            ddp = sum(all_reduce_time(tuned(t, m, p), m, p, net) for m in bucket_list)
            flat = all_reduce_time(tuned(t, 4 * params, p), 4 * params, p, net)
            fsdp = sum(2 * gather_time(2 * n, p, net) + gather_time(4 * n, p, net)
                       for n in units)
            kinds = ", ".join(f"{picks.count(k)} {k[:4]}" for k in sorted(set(picks)))
            print(f"  {p:>5} {ddp * 1e3:>12.2f} {per['ring'] * 1e3:>9.2f} "
                  f"{per['recursive_doubling'] * 1e3:>9.2f} {per['rabenseifner'] * 1e3:>9.2f} "
                  f"{flat * 1e3:>8.2f} {fsdp * 1e3:>9.2f}  {kinds}")
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("sweep", nargs="?", help="unison-bench --format csv output to fit")
    p.add_argument("--latency-us", type=float, help="a, instead of fitting a sweep")
    p.add_argument("--gbps", type=float, help="b in GB/s (1e9 B/s), instead of fitting")
    p.add_argument("--shapes", default=os.path.join(HERE, "model_shapes.json"))
    p.add_argument("--element-bytes", type=int, default=4)
    p.add_argument("--bucket", type=float, default=25.0, help="bucket cap, MiB [25]")
    p.add_argument("--first", type=float, default=1.0, help="first bucket's cap, MiB [1]")
    p.add_argument("--copy-gbps", type=float, help="memcpy GB/s, for --packing")
    p.add_argument("--packing", action="store_true",
                   help="bucketed packs and unpacks: two memory passes at --copy-gbps")
    p.add_argument("--scale", action="store_true",
                   help="a DDP and a FSDP step of 124M and 1.3B models at --ranks")
    p.add_argument("--ranks", default="8,16,32,64,128,256,512,1024")
    p.add_argument("--check", help="--scale: a simulate.sh CSV to fit a, b to and check")
    p.add_argument("--fit-ranks", type=int, help="--check: the rank count to fit at "
                   "[the smallest]")
    p.add_argument("--node-ranks", type=int, default=PLATFORM_NODE_RANKS["two_level"],
                   help="--check: ranks per node of the two_level rows, as simulate.sh's "
                   "--node-ranks [8]")
    p.add_argument("--drift-only", action="store_true",
                   help="--check: only compare the algorithms chosen with this model's "
                   "mirror of the tuning; exit status 1 when they differ")
    args = p.parse_args()
    if args.scale:
        return scale(args)

    if args.sweep:
        points = read_sweep(args.sweep)
        a, b = fit(points)
        print(f"fit of {len(points)} sizes from {args.sweep}: latency {a * 1e6:.2f} us, "
              f"bandwidth {b / 1e9:.3f} GB/s")
        for s, t in points:
            model = a + s / b
            print(f"  {int(s):>10d} B  measured {t * 1e6:10.1f} us  model {model * 1e6:10.1f} us"
                  f"  ({model / t:5.2f})")
    elif args.latency_us is not None and args.gbps is not None:
        a, b = args.latency_us * 1e-6, args.gbps * 1e9
        print(f"given: latency {args.latency_us:.2f} us, bandwidth {args.gbps:.3f} GB/s")
    else:
        p.error("give a sweep to fit, or --latency-us and --gbps")

    sizes = load_sizes(args.shapes, args.element_bytes)
    cost = lambda s: a + s / b  # noqa: E731
    bucket_list = buckets(sizes, args.first * MIB, args.bucket * MIB)
    per_tensor = sum(cost(s) for s in sizes)
    bucketed = sum(cost(s) for s in bucket_list)
    flat = cost(sum(sizes))
    if args.packing:
        if not args.copy_gbps:
            p.error("--packing needs --copy-gbps")
        one_pass = sum(sizes) / (args.copy_gbps * 1e9)
        bucketed += 2 * one_pass
        print(f"packing: two memory passes at {args.copy_gbps:.2f} GB/s, "
              f"{one_pass * 1e3:.2f} ms each, added to bucketed")
    print(f"{len(sizes)} gradients, {sum(sizes) / 1e6:.1f} MB; buckets (MiB): "
          + " ".join(f"{s / MIB:.2f}" for s in bucket_list))
    print(f"  per-tensor  {len(sizes):4d} calls  {per_tensor * 1e3:9.2f} ms  "
          f"({per_tensor / bucketed:.2f}x bucketed)")
    print(f"  bucketed    {len(bucket_list):4d} calls  {bucketed * 1e3:9.2f} ms")
    print(f"  flat           1 call   {flat * 1e3:9.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
