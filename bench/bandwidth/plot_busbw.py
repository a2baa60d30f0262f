#!/usr/bin/env python3
"""Bus bandwidth against message size, from nccl-tests JSON files, as a PNG.

Reads the files unison-bench -J writes (nccl-tests' own layout, so nccl-tests'
-J files work too) and draws one line per label: bus bandwidth (GB/s) against
size on a log2 axis, out of place or in place. With --baseline raw-mpi, the
raw-MPI baseline that unison-bench --baseline recorded in a file is drawn as a
line of its own.

    plot_busbw.py t.json:"thread backend" m.json:"MPI backend" --baseline raw-mpi \\
        -o busbw.png

A file's label is FILE:LABEL, else its --label (one per file given without
:LABEL, in their order, or a single --label for all of them), else taken from
the file (unison-bench's backend and rank count, or nccl-tests' program name and
rank count). Files with the same label are several runs of one measurement: their
label gets one line, the median at each size, over a shaded band from the least
to the most (--band for percentiles instead), and the legend says how many runs.
A file that repeats sizes (unison-bench or nccl-tests -N) counts as that many runs.

    plot_busbw.py m1.json m2.json m3.json --label "MPI backend" --log-y -o busbw.png

A file with several types or reductions (-d all, -o all) gives a line per type and
reduction; --dtype and --op keep one. The title names the collective, the rank
count and the backend of the files. Needs matplotlib (Debian: python3-matplotlib,
which scripts/install-deps.sh installs); --print-title does not.
"""

import argparse
import json
import math
import os
import re
import statistics
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
    """The file's JSON object, which must hold a non-empty "results" list."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except OSError as e:
        raise InputError(f"{path}: {e.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InputError(f"{path}: not JSON ({e})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("results"), list):
        raise InputError(f"{path}: no \"results\" list: not an nccl-tests -J file")
    if not doc["results"]:
        raise InputError(f"{path}: \"results\" is empty: the run timed no size")
    return doc


def program_of(doc):
    """nccl-tests' binary name from the recorded command line (args[0]), or None."""
    args = doc.get("args")
    if isinstance(args, list) and args:
        return os.path.basename(str(args[0]))
    return None


def describe(doc):
    """(collective, ranks, backend) of a file, each None where it does not say.
    unison-bench records them under "unison"; an nccl-tests file has its program
    name (all_reduce_perf), a device per rank in config.devices, and NCCL."""
    meta = doc.get("unison")
    config = doc.get("config")
    devices = config.get("devices") if isinstance(config, dict) else None
    ranks = len(devices) if isinstance(devices, list) and devices else None
    if isinstance(meta, dict):
        ranks = meta.get("ranks", ranks)
        return meta.get("collective"), ranks, meta.get("backend")
    program = program_of(doc)
    if program is None:
        return None, ranks, None
    collective = program[: -len("_perf")] if program.endswith("_perf") else program
    return collective, ranks, "nccl"


def default_label(doc, path):
    """unison-bench: '<backend> backend, N ranks'; nccl-tests: its program name and
    rank count; else the file's name."""
    meta = doc.get("unison")
    if isinstance(meta, dict) and "backend" in meta:
        return f"{meta['backend']} backend, {meta.get('ranks', '?')} ranks"
    program = program_of(doc)
    if program is not None:
        return f"{program}, {describe(doc)[1] or 0} ranks"
    return os.path.basename(path)


def samples(results, side, path, dtype=None, op=None):
    """Rows of one results list -> {(type, redop): {size: [busbw, ...]}}, a size
    given twice (-N) adding a run. Rows where the side or its bandwidth is missing
    (null, "nan") are skipped, as are rows of another type or reduction than
    dtype or op when these are given."""
    found = {}
    for row in results:
        if not isinstance(row, dict) or "size" not in row:
            raise InputError(f"{path}: a result without \"size\"")
        if (dtype is not None and row.get("type") != dtype) or \
                (op is not None and row.get("redop") != op):
            continue
        values = row.get(side)
        if not isinstance(values, dict):
            continue
        bw = values.get("bus_bw")
        if not isinstance(bw, (int, float)) or isinstance(bw, bool) or not math.isfinite(bw):
            continue
        by_size = found.setdefault((row.get("type"), row.get("redop")), {})
        by_size.setdefault(int(row["size"]), []).append(float(bw))
    return found


def percentile(values, p):
    """The p-th percentile (0 to 100) of values, interpolating linearly between the
    two nearest ranks (numpy's default): [1, 2, 3, 4] at 25 -> 1.75."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("percentile of no values")
    at = (len(ordered) - 1) * p / 100
    low = math.floor(at)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (at - low)


def spread(by_size, band=(0, 100)):
    """{size: [busbw of each run]} -> rows (size, median, low, high, runs) by size,
    low and high the band's percentiles (0 and 100: the least and the most)."""
    rows = []
    for size in sorted(by_size):
        values = by_size[size]
        rows.append((size, statistics.median(values), percentile(values, band[0]),
                     percentile(values, band[1]), len(values)))
    return rows


class Series:
    """One line of the plot: a label's median per size, and its band."""

    def __init__(self, label, rows):
        self.label = label
        self.sizes = [r[0] for r in rows]
        self.median = [r[1] for r in rows]
        self.low = [r[2] for r in rows]
        self.high = [r[3] for r in rows]
        self.runs = [r[4] for r in rows]

    def several(self):
        """Whether some size has more than one run (a band to draw)."""
        return max(self.runs) > 1


def parse_band(text):
    """'min-max' -> (0, 100); 'P-Q' -> (P, Q) percentiles; 'none' -> None."""
    if text == "min-max":
        return (0.0, 100.0)
    if text == "none":
        return None
    m = re.fullmatch(r"(\d+(?:\.\d*)?)-(\d+(?:\.\d*)?)", text)
    if not m or not 0 <= float(m[1]) < float(m[2]) <= 100:
        raise argparse.ArgumentTypeError(
            f"'{text}' is not min-max, none or P-Q with 0 <= P < Q <= 100 (such as 25-75)")
    return (float(m[1]), float(m[2]))


def band_words(band):
    if band == (0.0, 100.0):
        return "min to max"
    return f"{band[0]:g}th to {band[1]:g}th percentile"


def legend_label(label, series, band):
    """'MPI (median of 3 runs, min to max)' for several runs, else the label."""
    if not series.several():
        return label
    least, most = min(series.runs), max(series.runs)
    runs = f"{most}" if least == most else f"{least} to {most}"
    what = f"median of {runs} runs"
    if band is not None:
        what += f", {band_words(band)}"
    return f"{label} ({what})"


def and_list(items):
    """['a'] -> 'a'; ['a', 'b'] -> 'a and b'; ['a', 'b', 'c'] -> 'a, b and c'."""
    items = list(items)
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def title_of(described, side):
    """The default title from the files' (collective, ranks, backend): the
    collective(s), then the rank count(s) and the backend(s), then the side; a
    part left out where some file does not say it."""
    def values(k):
        got = [d[k] for d in described]
        return None if any(v is None for v in got) else list(dict.fromkeys(got))

    collectives, ranks, backends = values(0), values(1), values(2)
    parts = [f"{and_list(map(str, collectives))} bus bandwidth" if collectives
             else "bus bandwidth"]
    if ranks:
        ordered = sorted(ranks) if all(isinstance(r, int) for r in ranks) else ranks
        noun = "rank" if ordered == [1] else "ranks"
        parts.append(f"{and_list(map(str, ordered))} {noun}")
    if backends:
        parts.append(f"{and_list(map(str, backends))} backend{'s' if len(backends) > 1 else ''}")
    parts.append(side)
    return ", ".join(parts)


class Plan:
    """What is drawn: the title, the lines (unison's, then the baselines') and
    whether the bandwidth axis is logarithmic."""

    def __init__(self, title, series, band, log_y):
        self.title = title
        self.series = series
        self.band = band
        self.log_y = log_y


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Bus bandwidth (GB/s) against message size from nccl-tests JSON files "
        "(unison-bench -J or nccl-tests -J), one line per label, as a PNG. Files with the "
        "same label are runs of one measurement: their median is drawn over the band "
        "they span.",
    )
    parser.add_argument("files", nargs="+", metavar="FILE[:LABEL]",
                        help="a -J file, optionally with its line's label after a ':'")
    parser.add_argument("-o", "--output", metavar="PNG",
                        help="the image to write (.png); required unless --print-title")
    parser.add_argument("--label", action="append", default=[], metavar="LABEL",
                        help="the labels of the files given without :LABEL, one --label "
                        "per such file, in their order; or one for all of them (runs of "
                        "one measurement)")
    parser.add_argument("--side", choices=sorted(SIDES), default="out-of-place",
                        help="which of nccl-tests' two columns to plot [out-of-place]")
    parser.add_argument("--baseline", action="append", default=[], choices=BASELINES,
                        help="also draw this baseline of unison-bench --baseline from every "
                        "file that recorded it, as a line of its own (per label)")
    parser.add_argument("--dtype", metavar="TYPE",
                        help="only the rows of this type (a file's \"type\": float, half, "
                        "...) [every type in the files, a line each]")
    parser.add_argument("--op", metavar="OP",
                        help="only the rows of this reduction (a file's \"redop\": sum, "
                        "max, ...) [every one in the files, a line each]")
    parser.add_argument("--band", type=parse_band, default=(0.0, 100.0),
                        metavar="min-max|P-Q|none",
                        help="the shaded band around the median of a label with several "
                        "runs: min-max, the P-th to Q-th percentile (such as 25-75, "
                        "interpolated linearly), or none [min-max]")
    parser.add_argument("--title", help="the plot's title [the collective, the rank "
                        "count, the backend and the side]")
    parser.add_argument("--log-y", action="store_true",
                        help="a logarithmic bandwidth axis, so that the small sizes' "
                        "tiny bandwidths stay visible (sizes are always on a log2 axis)")
    parser.add_argument("--print-title", action="store_true",
                        help="print the title on stdout, and draw nothing unless -o is given")
    args = parser.parse_args(argv)
    if args.output is None and not args.print_title:
        parser.error("-o/--output is required (the .png to write)")
    if args.output is not None and not args.output.lower().endswith(".png"):
        parser.error(f"-o/--output: '{args.output}' must end in .png")
    if len(set(args.baseline)) != len(args.baseline):
        parser.error("--baseline: the same baseline given twice")
    return parser, args


def labeled(parser, args):
    """[(path, label or None)] from the FILE[:LABEL] arguments and --label."""
    try:
        specs = [split_spec(s) for s in args.files]
    except InputError as e:
        parser.error(str(e))
    unlabeled = sum(1 for _, label in specs if label is None)
    if len(args.label) == 1 and unlabeled > 1:
        return [(path, label or args.label[0]) for path, label in specs]
    if args.label and len(args.label) != unlabeled:
        parser.error(f"--label given {len(args.label)} time(s) for {unlabeled} file(s) "
                     "without FILE:LABEL: give one per such file, one for all of them, "
                     "or none")
    labels = iter(args.label)
    return [(path, label if label is not None else next(labels, None))
            for path, label in specs]


def group(files):
    """[(path, label, doc)] -> {label: [(path, doc), ...]} in the order of the labels'
    first files, a file without a label taking its default one (with the
    collective in front when the files time several). The files of one label must
    time the same collective, on as many ranks and the same backend."""
    described = {path: describe(doc) for path, _, doc in files}
    several = len({d[0] for d in described.values()}) > 1
    groups = {}
    for path, label, doc in files:
        if label is None:
            label = default_label(doc, path)
            if several and described[path][0]:
                label = f"{described[path][0]}, {label}"
        groups.setdefault(label, []).append((path, doc))
    for label, members in groups.items():
        first = members[0][0]
        for path, _ in members[1:]:
            for k, what in ((0, "collective"), (1, "rank count"), (2, "backend")):
                a, b = described[first][k], described[path][k]
                if a is not None and b is not None and a != b:
                    raise InputError(
                        f"label '{label}': {first} and {path} differ in {what} ({a}, {b}): "
                        "the files of one label are runs of one measurement; give them "
                        "labels of their own")
    return groups


def lines_of(label, members, take, band):
    """The series of one label from its files: take(path, doc) gives a file's
    {(type, redop): {size: [busbw]}}; the runs of every file are pooled."""
    pooled = {}
    for path, doc in members:
        for pair, by_size in take(path, doc).items():
            into = pooled.setdefault(pair, {})
            for size, values in by_size.items():
                into.setdefault(size, []).extend(values)
    return [(label, pair, Series(label, spread(by_size, band or (0, 100))))
            for pair, by_size in pooled.items()]


def plan(argv):
    """(args, Plan) from the command line; InputError for a file that does not fit."""
    parser, args = parse_args(argv)
    side = SIDES[args.side]
    files = [(path, label, load(path)) for path, label in labeled(parser, args)]
    groups = group(files)
    described = [describe(doc) for _, _, doc in files]

    def main_rows(path, doc):
        found = samples(doc["results"], side, path, args.dtype, args.op)
        if not found:
            raise InputError(f"{path}: no {args.side} bus bandwidth in \"results\""
                             + kept(doc["results"], args))
        return found

    drawn = []
    for label, members in groups.items():
        drawn += lines_of(label, members, main_rows, args.band)
    for name in args.baseline:
        having = {}
        for label, members in groups.items():
            recorded = [(path, b) for path, doc in members
                        for b in doc.get("unison_baselines", [])
                        if isinstance(b, dict) and b.get("name") == name
                        and isinstance(b.get("results"), list)]
            if recorded:
                having[label] = recorded
        if not having:
            raise InputError(f"--baseline {name}: none of the files recorded it "
                             f"(unison-bench --baseline with -B mpi records it)")
        for label, recorded in having.items():
            what = str(recorded[0][1].get("description", "")).split(" ", 1)[0]
            line = f"{name} ({what})" if what else name
            if len(having) > 1:
                line += f", {label}"
            drawn += lines_of(line, recorded,
                              lambda path, b: samples(b["results"], side, path,
                                                      args.dtype, args.op),
                              args.band)
    pairs = {}
    for label, pair, _ in drawn:
        pairs.setdefault(label, set()).add(pair)
    series = []
    for label, (dtype, redop), s in drawn:
        if len(pairs[label]) > 1:  # -d all, -o all: the type and reduction join the label
            label += f" ({dtype})" if redop in (None, "none") else f" ({dtype}, {redop})"
        s.label = legend_label(label, s, args.band)
        series.append(s)
    title = args.title or title_of(described, args.side)
    return args, Plan(title, series, args.band, args.log_y)


def kept(results, args):
    """': kept none of TYPE (the types: ...)', naming what the file has, where
    --dtype or --op left no row."""
    notes = []
    for given, key, flag in ((args.dtype, "type", "--dtype"), (args.op, "redop", "--op")):
        if given is not None:
            present = list(dict.fromkeys(str(r.get(key)) for r in results if isinstance(r, dict)))
            if given not in present:
                notes.append(f"{flag} {given}: the file has {', '.join(present)}")
    return f" ({'; '.join(notes)})" if notes else ""


def figure(p):
    """The matplotlib figure of a Plan (the Agg backend: no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, NullFormatter

    # Past 8 lines (-d all -o all: one per type and reduction) the legend goes to the
    # right of the axes, in columns of at most 22, and the figure widens for it.
    columns = math.ceil(len(p.series) / 22) if len(p.series) > 8 else 0
    fig, ax = plt.subplots(figsize=(8 + 3.2 * columns, 4.5 + 0.5 * bool(columns)), dpi=100)
    handles = []
    for s in p.series:
        sizes, median, low, high = s.sizes, s.median, s.low, s.high
        if p.log_y:  # a log axis has no place for 0 (1 rank's all-reduce moves no bus bytes)
            keep = [i for i, v in enumerate(median) if v > 0]
            if len(keep) < len(median):
                print(f"{PROG}: '{s.label}': {len(median) - len(keep)} size(s) with no bus "
                      "bandwidth (0) left off the log axis", file=sys.stderr)
            sizes, median, low, high = ([xs[i] for i in keep]
                                        for xs in (sizes, median, low, high))
        (line,) = ax.plot(sizes, median, marker="o", markersize=3, linewidth=1.5)
        if s.several() and p.band is not None:
            shade = ax.fill_between(sizes, low, high, color=line.get_color(), alpha=0.25,
                                    linewidth=0)
            handles.append(((shade, line), s.label))
        else:
            handles.append((line, s.label))
    ax.set_xscale("log", base=2)
    if p.log_y:
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    every = [size for s in p.series for size in s.sizes]
    lo, hi = int(math.log2(min(every))), math.ceil(math.log2(max(every)))
    step = max(1, math.ceil((hi - lo + 1) / 12))  # at most about 12 labels
    ticks = [2 ** e for e in range(hi - (hi - lo) // step * step, hi + 1, step)]
    ax.set_xticks(ticks, [human_size(t) for t in ticks], rotation=45, ha="right")
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("message size")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title(p.title)
    ax.grid(True, which="major", alpha=0.3)
    if columns:
        ax.legend([h for h, _ in handles], [label for _, label in handles], ncol=columns,
                  loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="x-small")
    else:
        ax.legend([h for h, _ in handles], [label for _, label in handles])
    fig.tight_layout()
    return fig


def main(argv):
    try:
        args, p = plan(argv)
    except InputError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 1
    if args.print_title:
        print(p.title)
        if args.output is None:
            return 0
    try:
        fig = figure(p)
    except ImportError:
        print(f"{PROG}: needs matplotlib (Debian: apt-get install python3-matplotlib, "
              "or bash scripts/install-deps.sh)", file=sys.stderr)
        return 1
    try:
        fig.savefig(args.output)
    except OSError as e:
        print(f"{PROG}: {args.output}: {e.strerror}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
