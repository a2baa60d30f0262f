#!/usr/bin/env python3
"""PyTorch's gradient synchronization on the parameters of model_shapes.json, the
reference for unison-ddp-bench (same tensors, same units).

    python3 bench/peers/torch_ddp_sync.py                 # 2 processes, gloo, CPU
    python3 bench/peers/torch_ddp_sync.py -n 50 --format json

Two processes are started with torch.multiprocessing.spawn and meet over gloo on
127.0.0.1. The module has one parameter per entry of model_shapes.json (same
shapes, same order). Every time is the slowest rank's, from a barrier to the end;
the table gives the median and the minimum over -n iterations after -w warm-up.

  backward        loss.backward() on the plain module, no DDP, where the loss is
                  sum over parameters of (p * c).sum() with a per-tensor constant c,
                  so backward does nothing but write each gradient (fresh tensors:
                  grads are set to None before every iteration)
  ddp             the same backward under DistributedDataParallel (gloo,
                  bucket_cap_mb 25, first bucket 1 MiB); it returns once the
                  gradients are averaged
  ddp - backward  the difference: what DDP's synchronization adds to backward
                  (compare with unison-ddp-bench's `bucketed`)
  backward-acc, ddp-view, ddp-view - backward-acc
                  the same with gradients kept and zeroed in place between
                  iterations, and DDP with gradient_as_bucket_view=True, whose
                  gradients live in its buckets (compare with `bucketed-view`)
  per-tensor      dist.all_reduce(async_op=True) per gradient in backward order,
                  wait for all, divide by the world size (unison's `per-tensor`)
  flat            one dist.all_reduce of all gradients in one tensor, then the
                  division (unison's `flat`)

GB/s is gradient bytes / median time, as in unison-ddp-bench. Every mode's
result is checked once, after the timed iterations, against the mean of the
ranks' values (#wrong counts wrong elements).
"""

import argparse
import json
import math
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

HERE = os.path.dirname(os.path.abspath(__file__))
MIB = 1 << 20


def load_shapes(path):
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    tensors = [(t["name"], [int(d) for d in t["shape"]]) for t in doc["tensors"]]
    if not tensors or any(not s or min(s) < 1 for _, s in tensors):
        raise ValueError(f"{path}: every tensor needs a non-empty shape of positive sizes")
    return tensors


class ShapesModule(torch.nn.Module):
    """One parameter per tensor of the list, registered in its order."""

    def __init__(self, tensors):
        super().__init__()
        for name, shape in tensors:
            self.register_parameter(name.replace(".", "_"),
                                    torch.nn.Parameter(torch.zeros(shape)))

    def forward(self, coefficients):
        # backward writes grad = c into every element and computes nothing else
        loss = None
        for p, c in zip(self.parameters(), coefficients):
            term = (p * c).sum()
            loss = term if loss is None else loss + term
        return loss


def coefficient(rank, t):
    """The constant of tensor t on `rank`: exact in float, and so is the mean."""
    return (1 + (t * 7 + rank * 13) % 64) / 64 + rank


def pattern(t, shape):
    """Elementwise values (k / 256, k in 1..1024) for the all-reduce modes."""
    i = torch.arange(math.prod(shape), dtype=torch.int64)
    k = ((i * 2654435761 + (t + 1) * 40503) >> 7) % 1024 + 1
    return (k.to(torch.float32) / 256).view(shape)


def slowest(times):
    """Per-iteration maximum over the ranks."""
    t = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def total(count):
    t = torch.tensor([count], dtype=torch.int64)
    dist.all_reduce(t)
    return int(t.item())


def time_backward(module, coefficients, iters, warmup, zero_in_place):
    """Times loss.backward() (forward untimed); returns the per-iteration times."""
    times = []
    params = list(module.parameters())
    for it in range(warmup + iters):
        for p in params:
            if zero_in_place and p.grad is not None:
                p.grad.zero_()
            else:
                p.grad = None
        loss = module(coefficients)
        dist.barrier()
        start = time.perf_counter()
        loss.backward()
        elapsed = time.perf_counter() - start
        if it >= warmup:
            times.append(elapsed)
    return slowest(times)


def wrong_after_backward(params, rank, world):
    wrong = 0
    for t, p in enumerate(params):
        expected = sum(coefficient(r, t) for r in range(world)) / world
        wrong += int((p.grad - expected).abs().gt(1e-6 * expected).sum().item())
    return wrong


def time_all_reduce(grads, patterns, rank, world, iters, warmup, flat):
    """Times the per-tensor (or flat) all-reduce of already written gradients."""
    times = []
    for it in range(warmup + iters):
        for g, p in zip(grads, patterns):
            g.copy_(p).add_(rank)
        dist.barrier()
        start = time.perf_counter()
        if flat is not None:
            dist.all_reduce(flat)
            flat.div_(world)
        else:
            works = [dist.all_reduce(g, async_op=True) for g in reversed(grads)]
            for w in works:
                w.wait()
            for g in reversed(grads):
                g.div_(world)
        elapsed = time.perf_counter() - start
        if it >= warmup:
            times.append(elapsed)
    wrong = 0
    for g, p in zip(grads, patterns):
        expected = p + (world - 1) / 2
        wrong += int((g - expected).abs().gt(1e-6 * expected).sum().item())
    return slowest(times), total(wrong)


def ddp_bucket_sizes(model):
    """DDP's bucket sizes in bytes, from its logging data (a private API, so only
    informative; DDP logs the rebuilt buckets from its 10th iteration on)."""
    try:
        data = model._get_ddp_logging_data()
        sizes = data.get("rebuilt_bucket_sizes") or data.get("bucket_sizes", "")
        return [int(s) for s in str(sizes).split(",") if s.strip()]
    except Exception:  # noqa: BLE001
        return []


def worker(rank, world, port, args, tensors, queue):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    results = []
    coefficients = [coefficient(rank, t) for t in range(len(tensors))]
    modes = args.modes

    def add(mode, times, wrong=None, bucket=None, calls=None, buckets=None):
        results.append({"mode": mode, "times": times, "wrong": wrong, "bucket_mib": bucket,
                        "calls": calls, "bucket_sizes": buckets or []})

    for zero_in_place in (False, True):
        plain_mode, ddp_mode = (("backward-acc", "ddp-view") if zero_in_place
                                else ("backward", "ddp"))
        if ddp_mode not in modes:
            continue
        plain = ShapesModule(tensors)
        add(plain_mode, time_backward(plain, coefficients, args.iters, args.warmup,
                                      zero_in_place))
        del plain
        model = DistributedDataParallel(ShapesModule(tensors),
                                        bucket_cap_mb=args.bucket_cap_mb,
                                        gradient_as_bucket_view=zero_in_place)
        times = time_backward(model, coefficients, args.iters, args.warmup, zero_in_place)
        wrong = total(wrong_after_backward(list(model.parameters()), rank, world))
        buckets = ddp_bucket_sizes(model)
        add(ddp_mode, times, wrong, args.bucket_cap_mb, len(buckets) or None, buckets)
        del model

    if "per-tensor" in modes or "flat" in modes:
        patterns = [pattern(t, s) for t, (_, s) in enumerate(tensors)]
        if "per-tensor" in modes:
            grads = [torch.empty(s) for _, s in tensors]
            times, wrong = time_all_reduce(grads, patterns, rank, world, args.iters,
                                           args.warmup, None)
            add("per-tensor", times, wrong, calls=len(grads))
            del grads
        if "flat" in modes:
            flat = torch.empty(sum(math.prod(s) for _, s in tensors))
            grads = [g.view(s) for g, (_, s) in
                     zip(flat.split([math.prod(s) for _, s in tensors]), tensors)]
            times, wrong = time_all_reduce(grads, patterns, rank, world, args.iters,
                                           args.warmup, flat)
            add("flat", times, wrong, calls=1)
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        queue.put(results)


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def summarize(results, nbytes):
    """Table rows: each mode's median and min, plus the differences DDP - backward."""
    rows = []
    by_mode = {}
    for r in results:
        row = {"mode": r["mode"], "bucket_mib": r["bucket_mib"], "calls": r["calls"],
               "median_ms": statistics.median(r["times"]) * 1e3,
               "min_ms": min(r["times"]) * 1e3, "wrong": r["wrong"],
               "bucket_sizes": r["bucket_sizes"], "sync": r["mode"] not in
               ("backward", "backward-acc")}
        by_mode[r["mode"]] = row
        rows.append(row)
        base = {"ddp": "backward", "ddp-view": "backward-acc"}.get(r["mode"])
        if base in by_mode:
            b = by_mode[base]
            rows.append({"mode": f"{r['mode']} - {base}", "bucket_mib": r["bucket_mib"],
                         "calls": r["calls"], "median_ms": row["median_ms"] - b["median_ms"],
                         "min_ms": row["min_ms"] - b["min_ms"], "wrong": r["wrong"],
                         "bucket_sizes": [], "sync": True})
    for row in rows:
        row["gbps"] = (nbytes / (row["median_ms"] / 1e3) / 1e9
                       if row["sync"] and row["median_ms"] > 0 else None)
    return rows


def main():
    parser = argparse.ArgumentParser(
        description="PyTorch DDP's gradient synchronization on model_shapes.json "
                    "(gloo, CPU), in unison-ddp-bench's units.")
    parser.add_argument("-n", "--iters", type=int, default=20, help="timed iterations [20]")
    parser.add_argument("-w", "--warmup", type=int, default=5,
                        help="untimed iterations first; DDP rebuilds its buckets after "
                             "the first [5]")
    parser.add_argument("-p", "--processes", type=int, default=2, help="ranks [2]")
    parser.add_argument("-m", "--modes", default="ddp,ddp-view,per-tensor,flat",
                        help="comma-separated: ddp, ddp-view (each with its backward "
                             "baseline), per-tensor, flat [all]")
    parser.add_argument("--bucket-cap-mb", type=float, default=25,
                        help="DDP's bucket_cap_mb [25]")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads per process [1]")
    parser.add_argument("--shapes", default=os.path.join(HERE, "..", "training", "model_shapes.json"),
                        help="the parameter list [bench/training/model_shapes.json]")
    parser.add_argument("--format", choices=("text", "json"), default="text")
    args = parser.parse_args()
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = set(args.modes) - {"ddp", "ddp-view", "per-tensor", "flat"}
    if unknown or args.iters < 1 or args.warmup < 0 or args.processes < 1:
        parser.error(f"bad -m/-n/-w/-p (unknown modes: {sorted(unknown)})")

    tensors = load_shapes(args.shapes)
    elements = sum(math.prod(s) for _, s in tensors)
    nbytes = elements * 4
    queue = mp.get_context("spawn").SimpleQueue()
    mp.spawn(worker, args=(args.processes, free_port(), args, tensors, queue),
             nprocs=args.processes, join=True)
    rows = summarize(queue.get(), nbytes)
    wrong = sum(r["wrong"] or 0 for r in rows)

    if args.format == "json":
        json.dump({"benchmark": "torch_ddp_sync", "torch": torch.__version__,
                   "backend": "gloo", "ranks": args.processes, "shapes": args.shapes,
                   "tensors": len(tensors), "elements": elements, "bytes": nbytes,
                   "iters": args.iters, "warmup_iters": args.warmup,
                   "threads": args.threads, "results": rows, "summary": {"wrong": wrong}},
                  sys.stdout, indent=2)
        print()
    else:
        print(f"# torch_ddp_sync: torch {torch.__version__}, gloo on 127.0.0.1, CPU, "
              f"{args.processes} processes, {args.threads} intra-op thread(s) each")
        print(f"# gradients: {args.shapes}: {len(tensors)} float tensors, {elements} "
              f"elements ({nbytes / 1e6:.1f} MB)")
        print(f"# time: barrier to the end, slowest rank; median and min of {args.iters} "
              f"iterations after {args.warmup} warm-up")
        print("# GB/s: gradient bytes / median time (synchronizations only)")
        print("#")
        print(f"# {'mode':<27} {'bucket':>6} {'calls':>5} {'median':>9} {'min':>9} "
              f"{'GB/s':>7} {'#wrong':>7}")
        print(f"# {'':<27} {'(MiB)':>6} {'':>5} {'(ms)':>9} {'(ms)':>9}")
        for r in rows:
            bucket = "-" if r["bucket_mib"] is None else f"{r['bucket_mib']:g}"
            calls = "-" if r["calls"] is None else str(r["calls"])
            gbps = "-" if r["gbps"] is None else f"{r['gbps']:.2f}"
            wrong_text = "-" if r["wrong"] is None else str(r["wrong"])
            print(f"  {r['mode']:<27} {bucket:>6} {calls:>5} {r['median_ms']:9.2f} "
                  f"{r['min_ms']:9.2f} {gbps:>7} {wrong_text:>7}")
        layouts = [(r["mode"], r["bucket_sizes"]) for r in rows if r["bucket_sizes"]]
        if layouts:
            print("#\n# DDP's bucket sizes after its rebuild (MiB):")
            for mode, sizes in layouts:
                print(f"#   {mode}: " + " ".join(f"{s / MIB:.2f}" for s in sizes))
        print(f"# Wrong values: {wrong} {'OK' if wrong == 0 else 'FAILED'}")
    return 0 if wrong == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
