#!/usr/bin/env python3
"""Bus bandwidth against message size, from nccl-tests JSON files, as a PNG.

Reads the files unison-bench -J writes (nccl-tests' own layout, so nccl-tests'
-J files work too) and draws one line per file: bus bandwidth (GB/s) against
size on a log2 axis, out of place or in place. With --baseline raw-mpi, the
raw-MPI baseline that unison-bench --baseline recorded in a file is drawn as a
line of its own.

    plot_busbw.py t.json:"thread backend" m.json:"MPI backend" --baseline raw-mpi \\
        -o busbw.png

A file's label is FILE:LABEL, else its --label (one per file given without
:LABEL, in their order), else taken from the file (unison-bench's backend and
rank count, or nccl-tests' program name and rank count). Needs
matplotlib (Debian: python3-matplotlib, which scripts/install-deps.sh installs).
"""

import argparse
import json
import math
import os
import sys

PROG = "plot_busbw.py"
SIDES = {"out-of-place": "out_of_place", "in-place": "in_place"}
# Baselines with a bus bandwidth: local-add moves bytes on one rank and has none.
BASELINES = ("raw-mpi",)


class InputError(Exception):
    """A file that is not an nccl-tests JSON file, or lacks what was asked for."""


def human_size(n):
    """8 -> '8 B', 65536 -> '64 KiB', 2**26 -> '64 MiB'."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:g} {unit}"
        n /= 1024
    return f"{n:g} TiB"


def split_spec(spec):
    """'FILE' or 'FILE:LABEL' -> (path, label or None). A path that exists as given
    wins, so a file name with ':' in it still reads."""
    if os.path.exists(spec) or ":" not in spec:
        return spec, None
    path, label = spec.rsplit(":", 1)
    if not label:
        raise InputError(f"'{spec}': empty label after ':'")
    return path, label


def load(path):
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except OSError as e:
        raise InputError(f"{path}: {e.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InputError(f"{path}: not JSON ({e})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("results"), list):
        raise InputError(f"{path}: no \"results\" list: not an nccl-tests -J file")
    return doc


def default_label(doc, path):
    """unison-bench: '<backend> backend, N ranks'; nccl-tests: its program name and
    rank count; else the file's name."""
    meta = doc.get("unison")
    if isinstance(meta, dict) and "backend" in meta:
        return f"{meta['backend']} backend, {meta.get('ranks', '?')} ranks"
    args = doc.get("args")
    if isinstance(args, list) and args:
        devices = doc.get("config", {}).get("devices", [])
        return f"{os.path.basename(str(args[0]))}, {len(devices)} ranks"
    return os.path.basename(path)


def collective_of(doc):
    meta = doc.get("unison")
    if isinstance(meta, dict) and "collective" in meta:
        return meta["collective"]
    args = doc.get("args")
    if isinstance(args, list) and args:
        name = os.path.basename(str(args[0]))
        return name[: -len("_perf")] if name.endswith("_perf") else name
    return None


def series(results, side, path):
    """Rows of one results list -> {(type, redop): ([size], [busbw])}, skipping the
    rows where the side or its bandwidth is missing (null, "nan")."""
    lines = {}
    for row in results:
        if not isinstance(row, dict) or "size" not in row:
            raise InputError(f"{path}: a result without \"size\"")
        values = row.get(side)
        if not isinstance(values, dict):
            continue
        bw = values.get("bus_bw")
        if not isinstance(bw, (int, float)) or isinstance(bw, bool) or not math.isfinite(bw):
            continue
        sizes, bws = lines.setdefault((row.get("type"), row.get("redop")), ([], []))
        sizes.append(int(row["size"]))
        bws.append(float(bw))
    return lines


def add_lines(out, lines, label):
    """One plotted line per (type, redop); the pair joins the label when a file
    holds more than one (nccl-tests' -d all)."""
    for (dtype, redop), (sizes, bws) in lines.items():
        suffix = f" ({dtype}, {redop})" if len(lines) > 1 else ""
        out.append((label + suffix, sizes, bws))


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Bus bandwidth (GB/s) against message size from nccl-tests JSON files "
        "(unison-bench -J or nccl-tests -J), one line per file, as a PNG.",
    )
    parser.add_argument("files", nargs="+", metavar="FILE[:LABEL]",
                        help="a -J file, optionally with its line's label after a ':'")
    parser.add_argument("-o", "--output", required=True, metavar="PNG",
                        help="the image to write (.png)")
    parser.add_argument("--label", action="append", default=[], metavar="LABEL",
                        help="the labels of the files given without :LABEL, one --label "
                        "per such file, in their order")
    parser.add_argument("--side", choices=sorted(SIDES), default="out-of-place",
                        help="which of nccl-tests' two columns to plot [out-of-place]")
    parser.add_argument("--baseline", action="append", default=[], choices=BASELINES,
                        help="also draw this baseline of unison-bench --baseline from every "
                        "file that recorded it, as a line of its own")
    parser.add_argument("--title", help="the plot's title [the collective and the side]")
    parser.add_argument("--log-y", action="store_true",
                        help="a logarithmic bandwidth axis (small sizes stay visible)")
    args = parser.parse_args(argv)
    if not args.output.lower().endswith(".png"):
        parser.error(f"-o/--output: '{args.output}' must end in .png")
    if len(set(args.baseline)) != len(args.baseline):
        parser.error("--baseline: the same baseline given twice")
    return parser, args


def main(argv):
    parser, args = parse_args(argv)
    try:
        specs = [split_spec(s) for s in args.files]
    except InputError as e:
        parser.error(str(e))
    unlabeled = sum(1 for _, label in specs if label is None)
    if args.label and len(args.label) != unlabeled:
        parser.error(f"--label given {len(args.label)} time(s) for {unlabeled} file(s) "
                     "without FILE:LABEL: give one per such file, or none")

    side = SIDES[args.side]
    lines, collectives = [], set()
    labels = iter(args.label)
    try:
        docs = [(path, label, load(path)) for path, label in specs]
        for path, label, doc in docs:
            label = label or next(labels, None) or default_label(doc, path)
            collectives.add(collective_of(doc))
            found = series(doc["results"], side, path)
            if not found:
                raise InputError(f"{path}: no {args.side} bus bandwidth in \"results\"")
            add_lines(lines, found, label)
        for name in args.baseline:
            sources = [(path, label or default_label(doc, path), b)
                       for path, label, doc in docs
                       for b in doc.get("unison_baselines", [])
                       if isinstance(b, dict) and b.get("name") == name and "results" in b]
            if not sources:
                raise InputError(f"--baseline {name}: none of the files recorded it "
                                 f"(unison-bench --baseline with -B mpi records it)")
            for path, file_label, b in sources:
                what = str(b.get("description", "")).split(" ", 1)[0]
                label = f"{name} ({what})" if what else name
                if len(sources) > 1:
                    label += f", {file_label}"
                add_lines(lines, series(b["results"], side, path), label)
    except InputError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 1

    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import NullFormatter
    except ImportError:
        print(f"{PROG}: needs matplotlib (Debian: apt-get install python3-matplotlib, "
              "or bash scripts/install-deps.sh)", file=sys.stderr)
        return 1

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    for label, sizes, bws in lines:
        ax.plot(sizes, bws, marker="o", markersize=3, linewidth=1.5, label=label)
    ax.set_xscale("log", base=2)
    if args.log_y:
        ax.set_yscale("log")
    every = [s for _, sizes, _ in lines for s in sizes]
    lo, hi = int(math.log2(min(every))), math.ceil(math.log2(max(every)))
    step = max(1, math.ceil((hi - lo + 1) / 12))  # at most about 12 labels
    ticks = [2 ** e for e in range(hi - (hi - lo) // step * step, hi + 1, step)]
    ax.set_xticks(ticks, [human_size(t) for t in ticks], rotation=45, ha="right")
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("message size")
    ax.set_ylabel("bus bandwidth (GB/s)")
    collective = next(iter(collectives)) if len(collectives) == 1 else None
    what = f"{collective} bus bandwidth" if collective else "bus bandwidth"
    ax.set_title(args.title or f"{what}, {args.side}")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    try:
        fig.savefig(args.output)
    except OSError as e:
        print(f"{PROG}: {args.output}: {e.strerror}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
