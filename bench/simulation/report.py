#!/usr/bin/env python3
"""Tables and a picture from bench/simulation/simulate.sh's CSV.

    python3 bench/simulation/report.py sweep.csv [-o ratios.png] [--algorithm automatic]

Prints, per platform, a Markdown table of unison's time over the better of the
simulated MPI_Allreduce's selectors (ompi, mpich) by rank count and size, with the
algorithm unison ran; with -o, draws the same ratios as one heat map per platform
(matplotlib). Rows marked wrong are reported and make the exit status 1.
"""

import argparse
import collections
import csv
import sys


def size_label(b):
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= scale and b % scale == 0:
            return f"{b // scale} {unit}"
    return f"{b} B"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv")
    ap.add_argument("-o", "--output", help="PNG of the ratios")
    ap.add_argument("--algorithm", default="automatic", help="unison's row to compare")
    args = ap.parse_args()

    ours = {}
    chosen = {}
    mpi = collections.defaultdict(dict)
    wrong = 0
    with open(args.csv) as f:
        for r in csv.DictReader(f):
            if r["correct"] == "wrong":
                wrong += 1
                print("wrong result:", r, file=sys.stderr)
            key = (r["platform"], int(r["ranks"]), int(r["bytes"]))
            if r["algorithm"] == "mpi":
                mpi[key][r["selector"]] = float(r["us"])
            elif r["algorithm"] == args.algorithm:
                ours[key] = float(r["us"])
                chosen[key] = r["chosen"]
    ratio = {}
    for key, us in ours.items():
        if mpi.get(key):
            ratio[key] = us / min(mpi[key].values())
    platforms = sorted({k[0] for k in ratio})
    short = {"recursive_doubling": "rd", "two_level": "2lvl", "rabenseifner": "rab",
             "ring": "ring", "native": "mpi", "rank_ordered": "direct",
             "neighbour_exchange": "nx"}
    for p in platforms:
        ranks = sorted({k[1] for k in ratio if k[0] == p})
        sizes = sorted({k[2] for k in ratio if k[0] == p})
        print(f"\n{p}: unison ({args.algorithm}) over the better MPI selector\n")
        print("| ranks | " + " | ".join(size_label(b) for b in sizes) + " |")
        print("|---|" + "---|" * len(sizes))
        for n in ranks:
            cells = []
            for b in sizes:
                k = (p, n, b)
                if k in ratio:
                    cells.append(f"{ratio[k]:.2f} {short.get(chosen[k], chosen[k])}")
                else:
                    cells.append("")
            print(f"| {n} | " + " | ".join(cells) + " |")
        worst = max(ratio[k] for k in ratio if k[0] == p)
        print(f"\nworst: {worst:.2f}")
    if args.output:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.colors import TwoSlopeNorm

        fig, axes = plt.subplots(1, len(platforms), figsize=(5.2 * len(platforms), 4.2),
                                 squeeze=False)
        norm = TwoSlopeNorm(vmin=0.5, vcenter=1.0, vmax=2.0)
        for ax, p in zip(axes[0], platforms):
            ranks = sorted({k[1] for k in ratio if k[0] == p})
            sizes = sorted({k[2] for k in ratio if k[0] == p})
            grid = [[ratio.get((p, n, b), float("nan")) for b in sizes] for n in ranks]
            im = ax.imshow(grid, cmap="RdYlGn_r", norm=norm, aspect="auto", origin="lower")
            for i, n in enumerate(ranks):
                for j, b in enumerate(sizes):
                    v = grid[i][j]
                    if v == v:
                        ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=7)
            ax.set_xticks(range(len(sizes)), [size_label(b) for b in sizes], rotation=45,
                          fontsize=8)
            ax.set_yticks(range(len(ranks)), [str(n) for n in ranks], fontsize=8)
            ax.set_xlabel("all-reduce size")
            ax.set_ylabel("ranks")
            ax.set_title(f"{p}: unison / best simulated MPI", fontsize=10)
        fig.colorbar(im, ax=axes[0].tolist(), shrink=0.8, label="time ratio (lower is better)")
        fig.savefig(args.output, dpi=110, bbox_inches="tight")
        print(f"\nwrote {args.output}")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
