#!/usr/bin/env python3
"""PyTorch's counterparts of unison-kernels-gbench (bench/gbench/kernels_gbench.cu): the
same GPU, the same element counts, the same byte counting, the same timing.

    python3 bench/peers/torch_kernels.py                        # sizes as the gbench picks them
    python3 bench/peers/torch_kernels.py --elements 134217728   # the gbench context's `elements`
    CUDA_VISIBLE_DEVICES=3 python3 bench/peers/torch_kernels.py

Not part of unison's build or tests; run it by hand next to unison-kernels-gbench
and compare the GB/s and vs_copy columns. Without a CUDA device it prints a
SKIPPED line and exits 0.

Sizes. Every flat tensor holds `elements` elements; by default the smallest
array (a bf16 one) is at least max(4 x L2, 256 MiB), computed exactly as the
gbench does, so both run on the same counts. The tensor list of the foreach
benchmarks is the gbench's pack layout: as many GPT-style transformer layers of
hidden size 1024 as fit in `elements` (q, k, v, out: d x d + d each; two layer
norms: d + d each; fc1: 4d x d + 4d; fc2: d x 4d + d).

Timing. A few untimed launches, then --batches batches of --batch back-to-back
launches between two torch.cuda.Event on a dedicated stream; the time is the
mean per call (what Google Benchmark reports for the gbench's manual time).

Bytes per call, as the gbench counts them (what the operation must move, each
array read once and written once, in 1e9 B/s):
  copy                     dst.copy_(src), f32: 4 read + 4 written per element
  adamw (fused, foreach)   one flat f32 parameter: read p, g, m, v (16) + write
                           p, m, v (12) = 28 per parameter
  sgd momentum             read p, g, buf (12) + write p, buf (8) = 20
  average_cast-like        torch.mul(src_f32, 1/8, out=dst_bf16): 4 + 2
  _foreach_mul_            the layout's f32 tensors scaled by 1/8 in place:
                           4 read + 4 written (vs the gbench's pack f32_to_f32)
  _foreach_copy_ to bf16   the layout's f32 tensors cast into bf16 views of one
                           bucket, no scale: 4 + 2 (vs pack f32_to_bf16)
  _foreach_norm            the layout's f32 tensors: 4 read (vs multi_norm)
vs_copy is GB/s over the copy's GB/s measured in the same run.
"""

import argparse
import sys

MIB = 1 << 20


def default_elements(l2_bytes):
    """The gbench's default: the smallest (bf16) array at least max(4 x L2, 256 MiB)."""
    min_bytes = max(4 * l2_bytes, 256 * MIB)
    return round_up((min_bytes + 1) // 2, 1 << 16)


def round_up(n, multiple):
    return (n + multiple - 1) // multiple * multiple


def layer_shapes(d):
    """One transformer layer's parameter shapes, in registration order (16 tensors)."""
    shapes = []
    for _ in range(4):  # q, k, v, out
        shapes += [(d, d), (d,)]
    shapes += [(d,), (d,)]  # ln1
    shapes += [(4 * d, d), (4 * d,)]  # fc1
    shapes += [(d, 4 * d), (d,)]  # fc2
    shapes += [(d,), (d,)]  # ln2
    return shapes


def transformer_layout(budget):
    """The gbench's transformer_layout: whole layers of hidden 1024 (halved, down to
    64, until two fit) filling `budget` elements. Returns (hidden, layers, shapes)."""
    def per_layer(h):
        return 12 * h * h + 13 * h

    d = 1024
    while d > 64 and 2 * per_layer(d) > budget:
        d //= 2
    layers = max(1, budget // per_layer(d))
    return d, layers, layer_shapes(d) * layers


def numel(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--elements", type=int, default=0,
                   help="elements per flat tensor (rounded up to a multiple of 256, as the "
                        "gbench's --elements); default: the gbench's default for this GPU")
    p.add_argument("--batch", type=int, default=5,
                   help="launches between two events (default 5, as the gbench)")
    p.add_argument("--batches", type=int, default=20, help="timed batches (default 20)")
    p.add_argument("--warmup", type=int, default=3, help="untimed launches first (default 3)")
    p.add_argument("--device", type=int, default=0, help="CUDA device index (default 0)")
    args = p.parse_args()
    if args.elements < 0 or args.batch < 1 or args.batches < 1 or args.warmup < 0:
        p.error("--elements must be >= 0, --batch and --batches >= 1, --warmup >= 0")
    return args


def main():
    args = parse_args()
    try:
        import torch
    except ImportError:
        print("torch_kernels.py: PyTorch is not installed (pip install torch); nothing was run",
              file=sys.stderr)
        return 1
    if not torch.cuda.is_available():
        print("SKIPPED: torch.cuda.is_available() is False; torch_kernels.py needs a CUDA "
              "device and a CUDA build of PyTorch")
        return 0

    dev = torch.device("cuda", args.device)
    torch.cuda.set_device(dev)
    props = torch.cuda.get_device_properties(dev)
    l2 = int(getattr(props, "L2_cache_size", 0) or 0)
    if args.elements:
        n = round_up(args.elements, 256)
    else:
        n = default_elements(l2)
    hidden, layers, shapes = transformer_layout(n)
    total = sum(numel(s) for s in shapes)
    if total > n:
        print(f"--elements={n} is too small for one transformer layer ({total} elements)",
              file=sys.stderr)
        return 2

    stream = torch.cuda.Stream(dev)

    def filled(count, dtype=torch.float32, scale=1.0, positive=False):
        """+-scale * [0.5, 1.5): no zeros, denormals or NaNs; alternate signs."""
        t = torch.empty(count, device=dev, dtype=torch.float32).uniform_(0.5, 1.5).mul_(scale)
        if not positive:
            t[::2].neg_()
        return t if dtype == torch.float32 else t.to(dtype)

    def time_per_call(launch):
        """Mean seconds per launch over the timed batches, on the dedicated stream."""
        stream.wait_stream(torch.cuda.current_stream(dev))  # the data was made there
        with torch.cuda.stream(stream):
            for _ in range(args.warmup):
                launch()
            stream.synchronize()
            start = torch.cuda.Event(enable_timing=True)
            stop = torch.cuda.Event(enable_timing=True)
            ms = 0.0
            for _ in range(args.batches):
                start.record(stream)
                for _ in range(args.batch):
                    launch()
                stop.record(stream)
                stop.synchronize()
                ms += start.elapsed_time(stop)
        return ms * 1e-3 / (args.batches * args.batch)

    def free():
        torch.cuda.synchronize(dev)
        torch.cuda.empty_cache()

    rows = []  # (name, unison counterpart, bytes per call, seconds per call)

    def record(name, counterpart, nbytes, launch):
        rows.append((name, counterpart, nbytes, time_per_call(launch)))

    def skipped(name, counterpart, why):
        rows.append((name, counterpart, 0, None))
        print(f"note: {name} left out: {why}", file=sys.stderr)

    # -------------------------------------------------------------- copy (the reference)
    src = filled(n)
    dst = torch.empty_like(src)
    record("copy (dst.copy_(src))", "copy/float4_kernel", 8 * n, lambda: dst.copy_(src))

    # ------------------------------------------------------- average_cast-like
    out_bf16 = torch.empty(n, device=dev, dtype=torch.bfloat16)
    try:
        record("mul(src, 1/8, out=bf16)", "average_cast/f32_to_bf16", 6 * n,
               lambda: torch.mul(src, 0.125, out=out_bf16))
    except RuntimeError as e:
        skipped("mul(src, 1/8, out=bf16)", "average_cast/f32_to_bf16", e)
    del src, dst, out_bf16
    free()

    # ------------------------------------------------------------ optimizers
    def optimizer_row(name, counterpart, nbytes, make):
        p = torch.nn.Parameter(filled(n))
        p.grad = filled(n, scale=1e-2)
        try:
            opt = make([p])
            opt.step()  # creates the state, untimed
        except (TypeError, RuntimeError, ValueError) as e:
            skipped(name, counterpart, e)
        else:
            record(name, counterpart, nbytes, opt.step)
            del opt
        del p
        free()

    optimizer_row("AdamW fused=True", "adamw/f32", 28 * n,
                  lambda ps: torch.optim.AdamW(ps, lr=1e-3, weight_decay=1e-2, fused=True))
    optimizer_row("AdamW foreach=True", "adamw/f32", 28 * n,
                  lambda ps: torch.optim.AdamW(ps, lr=1e-3, weight_decay=1e-2, foreach=True))
    optimizer_row("SGD momentum fused=True", "sgd_momentum/f32", 20 * n,
                  lambda ps: torch.optim.SGD(ps, lr=1e-2, momentum=0.9, fused=True))
    optimizer_row("SGD momentum foreach=True", "sgd_momentum/f32", 20 * n,
                  lambda ps: torch.optim.SGD(ps, lr=1e-2, momentum=0.9, foreach=True))

    # ------------------------------------------- foreach over the layout's tensors
    flat = filled(total)
    grads = []
    offset = 0
    for s in shapes:
        grads.append(flat[offset:offset + numel(s)].view(s))
        offset += numel(s)
    record("_foreach_mul_(grads, 1/8)", "pack/f32_to_f32/scale:0.125", 8 * total,
           lambda: torch._foreach_mul_(grads, 0.125))
    if hasattr(torch, "_foreach_copy_"):
        bucket = torch.empty(total, device=dev, dtype=torch.bfloat16)
        views = []
        offset = 0
        for s in shapes:
            views.append(bucket[offset:offset + numel(s)].view(s))
            offset += numel(s)
        try:
            record("_foreach_copy_(bf16 bucket, grads)", "pack/f32_to_bf16/scale:0.125",
                   6 * total, lambda: torch._foreach_copy_(views, grads))
        except RuntimeError as e:
            skipped("_foreach_copy_(bf16 bucket, grads)", "pack/f32_to_bf16/scale:0.125", e)
        del views, bucket
    else:
        skipped("_foreach_copy_(bf16 bucket, grads)", "pack/f32_to_bf16/scale:0.125",
                "this PyTorch has no torch._foreach_copy_")
    # _foreach_mul_ above rescaled the values; put them back for the norm.
    del grads, flat
    free()
    flat = filled(total)
    grads = []
    offset = 0
    for s in shapes:
        grads.append(flat[offset:offset + numel(s)].view(s))
        offset += numel(s)
    record("_foreach_norm(grads)", "multi_norm/f32", 4 * total,
           lambda: torch._foreach_norm(grads))
    del grads, flat
    free()

    # -------------------------------------------------------------------- report
    copy_bps = rows[0][2] / rows[0][3]
    print(f"GPU          cuda:{args.device} {props.name}")
    print(f"L2 cache     {l2} bytes ({l2 / MIB:.1f} MiB)"
          + ("" if l2 else " (this PyTorch does not report it: pass --elements)"))
    print(f"elements     {n} per flat tensor (f32 {4 * n / MIB:.1f} MiB, bf16 {2 * n / MIB:.1f} MiB)")
    print(f"layout       {layers} transformer layers, hidden {hidden}: {len(shapes)} tensors, "
          f"{total} elements")
    print(f"PyTorch      {torch.__version__}, CUDA {torch.version.cuda}")
    print(f"timing       {args.warmup} untimed, then {args.batches} x {args.batch} launches "
          "between torch.cuda.Event on one stream; mean per call")
    print("bytes        what one call must move (each array read once, written once), as "
          "unison-kernels-gbench counts; GB/s = 1e9 B/s; vs_copy = GB/s / copy's GB/s")
    print()
    header = f"{'benchmark':<36} {'bytes/call':>14} {'ms/call':>9} {'GB/s':>8} {'vs_copy':>8}  unison"
    print(header)
    print("-" * len(header))
    for name, counterpart, nbytes, seconds in rows:
        if seconds is None:
            print(f"{name:<36} {'-':>14} {'-':>9} {'-':>8} {'-':>8}  {counterpart}")
            continue
        bps = nbytes / seconds
        print(f"{name:<36} {nbytes:>14} {seconds * 1e3:>9.3f} {bps * 1e-9:>8.1f} "
              f"{bps / copy_bps:>8.3f}  {counterpart}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
