#!/usr/bin/env python3
"""PyTorch FSDP2 on examples/fsdp_transformer's model: the reference for its step
time and memory (docs/performance.md, "fsdp_transformer against PyTorch FSDP2").

    python3 bench/peers/torch_fsdp_transformer.py              # 2 processes, gloo, CPU
    python3 bench/peers/torch_fsdp_transformer.py --plain      # 1 process, no FSDP

The model is the example's, layer for layer: token and learned position
embeddings, pre-LayerNorm blocks (causal multi-head self-attention through a
qkv projection, GELU MLP of width 4 d), a final LayerNorm and the head, GPT-2's
initial values; by default d_model 384, 6 blocks, 6 heads, context 64 (10.7 M
parameters). As in the example, every block is a unit (`fully_shard(block)`) and
the rest is the root (`fully_shard(model)`), parameters are resharded after
forward (gathered again for backward), AdamW (betas 0.9/0.99, decay 1e-2) runs
on the shards after clipping to the global norm 1, one LibTorch thread per rank,
and every rank takes global batch / ranks sequences of the same length.

The tokens are drawn at random from the example's 37-character vocabulary
(step time does not depend on their values). Each process reports its time per
step after the first (mean, as the example prints it) and its peak resident set
size (ru_maxrss), also before the model was built, so that the interpreter's and
the libraries' share can be told apart. `--plain` trains the same model in one
process without FSDP on one rank's share of the batch: the compute of one rank's
step in this PyTorch.
"""

import argparse
import math
import os
import resource
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

VOCAB = 37  # the example's text has 37 distinct characters


class Block(nn.Module):
    def __init__(self, d, heads, layers):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.mlp_proj = nn.Linear(4 * d, d)
        residual_std = 0.02 / math.sqrt(2.0 * layers)
        for lin in (self.qkv, self.proj, self.fc, self.mlp_proj):
            residual = lin is self.proj or lin is self.mlp_proj
            nn.init.normal_(lin.weight, 0.0, residual_std if residual else 0.02)
            nn.init.zeros_(lin.bias)

    def forward(self, x):
        b, t, d = x.shape
        hd = d // self.heads
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, hd).permute(2, 0, 3, 1, 4)
        future = torch.ones(t, t, dtype=torch.bool).triu(1)
        scores = (q @ k.transpose(-2, -1) / math.sqrt(hd)).masked_fill(future, float("-inf"))
        y = (torch.softmax(scores, -1) @ v).transpose(1, 2).reshape(b, t, d)
        h = x + self.proj(y)
        return h + self.mlp_proj(F.gelu(self.fc(self.ln2(h))))


class Transformer(nn.Module):
    def __init__(self, d, heads, layers, context):
        super().__init__()
        self.tokens = nn.Embedding(VOCAB, d)
        self.positions = nn.Parameter(torch.empty(context, d))
        self.blocks = nn.ModuleList(Block(d, heads, layers) for _ in range(layers))
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, VOCAB)
        nn.init.normal_(self.tokens.weight, 0.0, 0.02)
        nn.init.normal_(self.positions, 0.0, 0.02)
        nn.init.normal_(self.head.weight, 0.0, 0.02)
        nn.init.zeros_(self.head.bias)

    def forward(self, ids):
        x = self.tokens(ids) + self.positions[: ids.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def train(rank, world, args, sharded):
    torch.set_num_threads(args.threads)
    floor = rss_mib()
    torch.manual_seed(1234)
    model = Transformer(args.d_model, args.heads, args.layers, args.context)
    if sharded:
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            fully_shard(block, reshard_after_forward=True)
        fully_shard(model, reshard_after_forward=True)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.99), weight_decay=1e-2)
    local = args.batch // world
    gen = torch.Generator().manual_seed(99 + rank)
    times = []
    losses = []
    for step in range(args.steps):
        start = time.perf_counter()
        window = torch.randint(0, VOCAB, (local, args.context + 1), generator=gen)
        logits = model(window[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), window[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        times.append(time.perf_counter() - start)
    after_first = sum(times[1:]) / max(1, len(times) - 1)
    return {
        "rank": rank,
        "s_per_step": after_first,
        "first_s": times[0],
        "rss_floor_mib": floor,
        "rss_peak_mib": rss_mib(),
        "loss_first": losses[0],
        "loss_last": losses[-1],
    }


def worker(rank, world, port, args, queue):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        queue.put(train(rank, world, args, sharded=True))
    finally:
        dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-n", "--processes", type=int, default=2)
    parser.add_argument("--steps", type=int, default=21)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--d-model", type=int, default=384)
    parser.add_argument("--heads", type=int, default=6)
    parser.add_argument("--context", type=int, default=64)
    parser.add_argument("--batch", type=int, default=32, help="global sequences per step")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument("--plain", action="store_true", help="one process, no FSDP, one rank's batch")
    args = parser.parse_args()
    if args.steps < 2 or args.batch % args.processes != 0:
        parser.error("--steps must be at least 2 and --batch a multiple of --processes")

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads before set_num_threads")
    if args.plain:
        results = [train(0, args.processes, args, sharded=False)]
        what = f"plain (no FSDP), 1 process, {args.batch // args.processes} sequences"
    else:
        queue = mp.get_context("spawn").SimpleQueue()
        mp.spawn(worker, args=(args.processes, free_port(), args, queue), nprocs=args.processes)
        results = sorted((queue.get() for _ in range(args.processes)), key=lambda r: r["rank"])
        what = f"FSDP2 fully_shard, gloo, {args.processes} processes"
    params = sum(p.numel() for p in Transformer(args.d_model, args.heads, args.layers, args.context).parameters())
    print(f"{what}; {params} parameters, d_model {args.d_model}, {args.layers} blocks, "
          f"context {args.context}, global batch {args.batch}, {args.threads} thread(s) each")
    for r in results:
        print(f"rank {r['rank']}: time {r['s_per_step']:.3f} s/step after the first "
              f"({r['first_s']:.2f} s); peak RSS {r['rss_peak_mib']:.1f} MiB "
              f"(before the model {r['rss_floor_mib']:.1f} MiB); "
              f"loss {r['loss_first']:.4f} -> {r['loss_last']:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
