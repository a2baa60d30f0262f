#!/usr/bin/env python3
"""Turns unison-bench's measurements on a cluster into tuning rules for it.

unison's MPI backend picks an algorithm per call from thresholds measured on a few
machines and in simulation (include/unison/mpi/tuning.hpp). Where another
cluster's memory or network moves them, measure every algorithm there and let the
measurements decide, without a rebuild:

    for i in 1 2 3; do
      mpiexec -n 8 unison-bench -B mpi -b 8 -e 64M -f 2 -n 50 -w 5 --format csv \\
          --algorithm all >> sweep.csv
    done
    scripts/tuning-rules.py --node-ranks 8 sweep.csv > cluster.rules
    UNISON_TUNING_FILE=cluster.rules mpiexec -n 8 ./train

For each collective, rank count and size measured (by every algorithm at least
--min-runs times), the algorithm with the lowest median time wins. Where the run that asked for `automatic` was measured too, a
rule overrides the built-in choice only where the winner beats it by more than
--margin (noise is not a reason to change); elsewhere the winner is written
outright. Consecutive sizes with the same winner become one rule, from the first
of them up to the next size measured (after the largest: up to where the sweep's
next step would have been), so that sizes below and above the sweep keep the
built-in tuning. Rows of other backends and of the baselines are left out; a run
with a wrong result is refused. Measure with UNISON_TUNING_FILE unset: the
`automatic` rows then show the built-in choice, which the margin is kept against.
The CSV does not say how the ranks sat on nodes: --node-ranks says it (the rules
otherwise hold for any layout). The speed-up in each rule's comment is over the
built-in choice, or over the next best where no automatic run was measured.

The rules go to standard output (or -o), one per line with the speed-up and the
number of measurements (rows) behind it as a comment; include/unison/comm/tuning_rules.hpp
describes the format. Exit status: 0, 1 when no rule could be made from the input
(no MPI rows), 2 for a bad command line or input.
"""

import argparse
import collections
import csv
import re
import statistics
import sys

COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather")


class BadInput(Exception):
    """Measurements that no rule should be made from."""


def size_text(n):
    """A size as the rules read it: K, M or G where it divides exactly."""
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return str(n)


def time_of(row, place):
    oop, ip = row["oop_time_us"], row["ip_time_us"]
    if place == "out":
        return float(oop)
    if place == "in":
        return float(ip)
    return (float(oop) + float(ip)) / 2


def read(paths, place, dtype, op):
    """{(collective, ranks): {size: {algorithm: [times]}}}, and the built-in choice
    {(collective, ranks, size): algorithm} where an automatic run was measured."""
    times = collections.defaultdict(lambda: collections.defaultdict(lambda: collections.defaultdict(list)))
    builtin = {}
    for path in paths:
        with open(path, newline="") as f:
            header = None
            for line, fields in enumerate(csv.reader(f), start=1):
                if not fields:
                    continue
                if fields[0] == "table":  # a header, repeated by runs appended to one file
                    header = fields
                    continue
                if header is None:
                    raise BadInput(f"{path}:{line}: a row before any header: not unison-bench's "
                                   "--format csv")
                if len(fields) != len(header):
                    raise BadInput(f"{path}:{line}: {len(fields)} fields under a header of "
                                   f"{len(header)}")
                row = dict(zip(header, fields))
                if row.get("table") != "unison" or row.get("backend") != "mpi":
                    continue
                if row.get("collective") not in COLLECTIVES:
                    continue
                if row.get("dtype") != dtype:
                    continue
                if row["collective"] != "all_gather" and row.get("op") != op:
                    continue  # an all_gather reduces nothing: its op is "none"
                if "requested" not in row:
                    raise BadInput(f"{path}: no 'requested' column: measure with a "
                                   "unison-bench that writes it")
                if row["requested"].endswith("+rules"):
                    raise BadInput(f"{path}:{line}: measured with tuning rules loaded "
                                   "(UNISON_TUNING_FILE): its automatic rows are not the "
                                   "built-in choice; measure with it unset")
                if row["oop_wrong"] not in ("0", "") or row["ip_wrong"] not in ("0", ""):
                    raise BadInput(f"{path}:{line}: a wrong result ({row['algorithm']} at "
                                   f"{row['size']} bytes): fix that first")
                key = (row["collective"], int(row["ranks"]))
                size = int(row["size"])
                ran = row["algorithm"]
                times[key][size][ran].append(time_of(row, place))
                if row["requested"] == "automatic":
                    builtin[key + (size,)] = ran
    return times, builtin


def next_step(sizes):
    """Where a sweep of `sizes` (ascending) would have measured next: the same factor
    again (unison-bench's -f), or the same step when the last three sizes are evenly
    spaced (-f 1 -i), or one byte past the last."""
    if len(sizes) < 2 or sizes[-2] == 0:
        return sizes[-1] + 1
    if len(sizes) >= 3 and sizes[-1] - sizes[-2] == sizes[-2] - sizes[-3]:
        return sizes[-1] + (sizes[-1] - sizes[-2])
    if sizes[-1] % sizes[-2] == 0:
        return sizes[-1] * (sizes[-1] // sizes[-2])
    return sizes[-1] + (sizes[-1] - sizes[-2])


def choose(times, builtin, margin, min_runs):
    """[(collective, ranks, start, end, algorithm, (least, most speed-up), runs)], and
    how many cells were left to the built-in tuning for want of runs."""
    rules = []
    thin = 0
    for (collective, ranks), by_size in sorted(times.items()):
        sizes = sorted(by_size)
        picks = []
        for size in sizes:
            if min(len(t) for t in by_size[size].values()) < min_runs:
                thin += 1
                picks.append(None)
                continue
            medians = {a: max(statistics.median(t), 1e-9) for a, t in by_size[size].items()}
            winner = min(medians, key=lambda a: (medians[a], a))
            base = builtin.get((collective, ranks, size))
            if base is not None and base in medians:
                if medians[base] <= medians[winner] * (1 + margin):
                    picks.append(None)
                    continue
                gain = medians[base] / medians[winner]
            else:
                others = [m for a, m in medians.items() if a != winner]
                gain = min(others) / medians[winner] if others else 1.0
            picks.append((winner, gain, len(by_size[size][winner])))
        i = 0
        while i < len(sizes):
            if picks[i] is None:
                i += 1
                continue
            j = i
            while j + 1 < len(sizes) and picks[j + 1] is not None and picks[j + 1][0] == picks[i][0]:
                j += 1
            end = sizes[j + 1] if j + 1 < len(sizes) else next_step(sizes)
            gains = [picks[k][1] for k in range(i, j + 1)]
            runs = min(picks[k][2] for k in range(i, j + 1))
            rules.append((collective, ranks, sizes[i], end, picks[i][0],
                          (min(gains), max(gains)), runs))
            i = j + 1
    return rules, thin


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    p.add_argument("csv", nargs="+", help="unison-bench --format csv output (appended runs are fine)")
    p.add_argument("--node-ranks", default="*",
                   help="the most ranks one node held in the runs (mpi_communicator::node_ranks(): "
                        "the rank count on one node, 1 with a rank per node), as the rules' "
                        "node_ranks field: N, A-B, A- or * [*]")
    p.add_argument("--dtype", default="float",
                   help="the rows' dtype to read (rules hold for any dtype: sweep the one "
                        "that training reduces) [float]")
    p.add_argument("--op", default="sum",
                   help="the rows' reduction to read (all_gather rows have none) [sum]")
    p.add_argument("--place", choices=("in", "out", "both"), default="both",
                   help="time in place, out of place, or the mean of both [both]")
    p.add_argument("--margin", type=float, default=0.05,
                   help="how much faster than the built-in choice a winner must be to override "
                        "it, as a fraction [0.05]")
    p.add_argument("--min-runs", type=int, default=3,
                   help="measurements (rows) each algorithm needs at a size for that size to "
                        "get a rule: one run on a shared machine is noise [3]")
    p.add_argument("-o", "--output", help="the rules file to write [standard output]")
    a = p.parse_args()
    if a.margin < 0:
        p.error("--margin must be 0 or more")
    if a.min_runs < 1:
        p.error("--min-runs must be 1 or more")
    count = r"[1-9][0-9]{0,8}"
    bounds = re.fullmatch(rf"\*|({count})(-({count})?)?", a.node_ranks)
    if not bounds or (bounds.group(3) and int(bounds.group(3)) < int(bounds.group(1))):
        p.error(f"--node-ranks '{a.node_ranks}' is not N, A-B (A <= B), A- or * (counts from 1)")
    try:
        times, builtin = read(a.csv, a.place, a.dtype, a.op)
    except BadInput as e:
        print(f"tuning-rules.py: {e}", file=sys.stderr)
        return 2
    except (OSError, KeyError, ValueError) as e:
        print(f"tuning-rules.py: cannot read the measurements: {e!r}", file=sys.stderr)
        return 2
    if not times:
        print(f"tuning-rules.py: no unison rows of the MPI backend with dtype {a.dtype} and op "
              f"{a.op} in " + ", ".join(a.csv), file=sys.stderr)
        return 1
    rules, thin = choose(times, builtin, a.margin, a.min_runs)
    lines = [
        "# unison tuning rules, from " + ", ".join(a.csv),
        "# time: " + {"in": "in place", "out": "out of place",
                      "both": "the mean of in place and out of place"}[a.place] +
        f"; a built-in choice kept unless beaten by more than {a.margin * 100:g}%",
        "# backend  collective      ranks  node_ranks  bytes              algorithm",
    ]
    for collective, ranks, start, end, algorithm, (lo, hi), runs in rules:
        gain = f"{lo:.2f}x" if abs(hi - lo) < 0.005 else f"{lo:.2f}-{hi:.2f}x"
        lines.append(f"mpi        {collective:<15} {ranks:<6} {a.node_ranks:<11} "
                     f"{size_text(start) + ('' if end == start + 1 else '-' + size_text(end)):<18} "
                     f"{algorithm:<20} "
                     f"# {gain} faster, {runs} measurement{'s' if runs != 1 else ''}")
    if thin:
        lines.append(f"# {thin} collective, rank count and size cells had fewer than "
                     f"{a.min_runs} measurements of some algorithm: left to the built-in tuning")
        print(f"tuning-rules.py: {thin} cells had fewer than {a.min_runs} measurements of some "
              "algorithm and got no rule (--min-runs)", file=sys.stderr)
    if not rules:
        lines.append("# (no rule: the built-in tuning held, or too few runs, everywhere measured)")
    text = "\n".join(lines) + "\n"
    if a.output:
        with open(a.output, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
