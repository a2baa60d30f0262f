#!/usr/bin/env python3
"""A per-call cost model of data-parallel gradient synchronization: predicts one
synchronization of bench/model_shapes.json's gradients as one all-reduce per
tensor, in buckets, and as one flat all-reduce, from an all-reduce sweep.

    mpiexec -n 2 --mca btl self,tcp unison-bench -B mpi -b 8 -e 32M -f 4 --format csv > sweep.csv
    python3 bench/cost_model.py sweep.csv
    python3 bench/cost_model.py --latency-us 5 --gbps 12.5      # a network given by hand

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
    args = p.parse_args()

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
