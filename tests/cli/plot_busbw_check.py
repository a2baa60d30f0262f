#!/usr/bin/env python3
"""bench/bandwidth/plot_busbw.py against unison-bench's -J files: the PNG it writes, its
title, the median and band of several runs (against a hand computation from the
files), its log-scale option, and its errors for input that does not fit.

Files come from unison-bench runs on the thread backend, and from copies of them
edited where a layout is needed that the thread backend does not write (an MPI
run with its raw-MPI baseline, nccl-tests' own file, chosen bandwidths).

Usage: plot_busbw_check.py UNISON_BENCH PLOT_BUSBW_PY
Exit status 77 (skipped) where no python3 on the way has matplotlib.
"""

import atexit
import copy
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile

# The python3 first on PATH may be another than Debian's, which has matplotlib.
try:
    import matplotlib  # noqa: F401
except ImportError:
    other = "/usr/bin/python3"
    if os.path.exists(other) and os.path.realpath(other) != os.path.realpath(sys.executable) \
            and subprocess.run([other, "-c", "import matplotlib"],
                               capture_output=True).returncode == 0:
        os.execv(other, [other] + sys.argv)
    print("no python3 with matplotlib: skipped")
    sys.exit(77)

BENCH = os.path.abspath(sys.argv[1])
SCRIPT = os.path.abspath(sys.argv[2])
DIR = tempfile.mkdtemp(prefix="plot_busbw_check.")
atexit.register(shutil.rmtree, DIR, True)
FAILED = []

spec = importlib.util.spec_from_file_location("plot_busbw", SCRIPT)
pb = importlib.util.module_from_spec(spec)
spec.loader.exec_module(pb)


def path(name):
    return os.path.join(DIR, name)


def bench(name, *argv):
    """unison-bench ... -J DIR/name; the file's path."""
    p = subprocess.run([BENCH, *argv, "-J", path(name)], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, f"unison-bench {' '.join(argv)}: exit {p.returncode}\n{p.stderr}"
    return path(name)


def read(p):
    with open(p, encoding="utf-8") as f:
        return json.load(f)


def write(name, doc):
    with open(path(name), "w", encoding="utf-8") as f:
        json.dump(doc, f)
    return path(name)


def plot(*argv, expect=0):
    """plot_busbw.py as a program: (stdout, stderr), the exit status checked."""
    p = subprocess.run([sys.executable, SCRIPT, *argv], capture_output=True, text=True,
                       timeout=120)
    if p.returncode != expect:
        raise AssertionError(f"plot_busbw.py {' '.join(argv)}: exit {p.returncode}, not "
                             f"{expect}\nstdout: {p.stdout[-1500:]}\nstderr: {p.stderr[-1500:]}")
    return p.stdout, p.stderr


def png(p):
    with open(p, "rb") as f:
        return f.read(8) == b"\x89PNG\r\n\x1a\n"


def busbw(doc, side="out_of_place"):
    """{size: [bus_bw of every row at that size]} of a file, read directly."""
    got = {}
    for row in doc["results"]:
        got.setdefault(row["size"], []).append(row[side]["bus_bw"])
    return got


def check(name):
    def wrap(fn):
        try:
            fn()
            print(f"ok: {name}")
        except Exception as e:  # report every failing check, not only the first
            FAILED.append(name)
            print(f"FAILED: {name}: {type(e).__name__}: {e}")
        return fn
    return wrap


# The inputs: three runs of one measurement, a run at 4 ranks, an all-gather, a
# run of every reduction twice over (-o all -N 2).
SIZES = ["-b", "8", "-e", "64K", "-f", "8"]
RUNS = [bench(f"run{k}.json", "-t", "2", *SIZES) for k in (1, 2, 3)]
FOUR = bench("four.json", "-t", "4", *SIZES)
GATHER = bench("gather.json", "-t", "2", "--collective", "all_gather", *SIZES)
OPS = bench("ops.json", "-t", "2", "-b", "8", "-e", "512", "-f", "8", "-o", "all", "-N", "2")

# An MPI run with a raw-MPI baseline, written from the first run: the same rows,
# the baseline's bandwidths half of unison's.
mpi = copy.deepcopy(read(RUNS[0]))
mpi["unison"]["backend"] = "mpi"
raw = copy.deepcopy(mpi["results"])
for row in raw:
    row["out_of_place"]["bus_bw"] /= 2
mpi["unison_baselines"] = [{"name": "raw-mpi", "description": "MPI_Allreduce on the same buffers",
                            "results": raw}]
MPI = write("mpi.json", mpi)

# nccl-tests' own file: no "unison" key, its program name, a device per rank.
nccl = copy.deepcopy(read(FOUR))
del nccl["unison"], nccl["unison_baselines"]
nccl["args"] = ["/opt/nccl-tests/build/all_reduce_perf", "-b", "8", "-e", "64K", "-f", "8"]
NCCL = write("nccl.json", nccl)


def chosen(name, values):
    """A copy of the first run with two sizes, 8 and 16 bytes, of chosen bus
    bandwidths: values[k] is the k-th size's."""
    doc = copy.deepcopy(read(RUNS[0]))
    doc["results"] = []
    for size, bw in zip((8, 16), values):
        row = copy.deepcopy(read(RUNS[0])["results"][0])
        row["size"] = size
        row["out_of_place"]["bus_bw"] = bw
        doc["results"].append(row)
    return write(name, doc)


# Bandwidths chosen so that the median, min and max are known by hand: at 8 bytes
# 1, 5, 3 (median 3, min 1, max 5); at 16 bytes 2, 8, 2 (median 2, min 2, max 8).
HAND = [chosen("hand1.json", (1.0, 2.0)), chosen("hand2.json", (5.0, 8.0)),
        chosen("hand3.json", (3.0, 2.0))]
# Four runs: 1, 2, 3, 4 and 10, 40, 20, 30 (25th and 75th percentiles, linear:
# 1.75 and 3.25, 17.5 and 32.5; medians 2.5 and 25).
QUARTILES = [chosen(f"quart{k}.json", v) for k, v in
             enumerate(((1.0, 10.0), (2.0, 40.0), (3.0, 20.0), (4.0, 30.0)))]


def planned(*argv):
    """The script's Plan for a command line, through its module."""
    return pb.plan([*argv, "-o", path("unused.png")])[1]


def close(a, b):
    return abs(a - b) <= 1e-9 * max(1.0, abs(a), abs(b))


@check("a PNG is written, for one file and for several runs of one label")
def _():
    plot(RUNS[0] + ":two threads", "-o", path("one.png"))
    assert png(path("one.png")), "one.png: no PNG magic bytes"
    plot(*RUNS, "--label", "thread, 3 runs", "--log-y", "-o", path("three.png"))
    assert png(path("three.png")), "three.png: no PNG magic bytes"
    plot(*RUNS, MPI, "--baseline", "raw-mpi", "-o", path("baseline.png"))
    assert png(path("baseline.png")), "baseline.png: no PNG magic bytes"


@check("an output that is not a .png is refused")
def _():
    _, err = plot(RUNS[0], "-o", path("busbw.svg"), expect=2)
    assert "must end in .png" in err, err


@check("the title names the collective, the rank count and the backend")
def _():
    cases = [
        ([RUNS[0]], "all_reduce bus bandwidth, 2 ranks, thread backend, out-of-place"),
        ([RUNS[0], FOUR], "all_reduce bus bandwidth, 2 and 4 ranks, thread backend, out-of-place"),
        ([RUNS[0], MPI],
         "all_reduce bus bandwidth, 2 ranks, thread and mpi backends, out-of-place"),
        ([GATHER, "--side", "in-place"],
         "all_gather bus bandwidth, 2 ranks, thread backend, in-place"),
        ([RUNS[0], GATHER],
         "all_reduce and all_gather bus bandwidth, 2 ranks, thread backend, out-of-place"),
        ([NCCL], "all_reduce bus bandwidth, 4 ranks, nccl backend, out-of-place"),
        ([RUNS[0], "--title", "my title"], "my title"),
    ]
    for argv, title in cases:
        out, _ = plot(*argv, "--print-title")
        assert out == title + "\n", f"{argv}: title {out!r}, not {title!r}"


@check("the drawn figure carries that title, and the PNG is still written with --print-title")
def _():
    p = planned(RUNS[0], FOUR)
    fig = pb.figure(p)
    assert fig.axes[0].get_title() == p.title, fig.axes[0].get_title()
    out, _ = plot(RUNS[0], "--print-title", "-o", path("titled.png"))
    assert out.startswith("all_reduce bus bandwidth") and png(path("titled.png"))


@check("spread(): median, min and max of three runs, by hand")
def _():
    rows = pb.spread({8: [1.0, 5.0, 3.0], 16: [2.0, 8.0, 2.0]})
    assert rows == [(8, 3.0, 1.0, 5.0, 3), (16, 2.0, 2.0, 8.0, 3)], rows
    rows = pb.spread({8: [1.0, 2.0, 3.0, 4.0]}, (25, 75))
    assert rows == [(8, 2.5, 1.75, 3.25, 4)], rows


@check("three files of one label: one line, their median, min and max (chosen bandwidths)")
def _():
    p = planned(*HAND, "--label", "hand")
    assert len(p.series) == 1, [s.label for s in p.series]
    s = p.series[0]
    assert (s.sizes, s.median, s.low, s.high, s.runs) == \
        ([8, 16], [3.0, 2.0], [1.0, 2.0], [5.0, 8.0], [3, 3]), vars(s)
    assert s.label == "hand (median of 3 runs, min to max)", s.label
    # The same through a repeated FILE:LABEL.
    q = planned(*(f"{f}:hand" for f in HAND))
    assert len(q.series) == 1 and q.series[0].median == [3.0, 2.0], vars(q.series[0])


@check("three unison-bench runs of one label: the median, min and max of the files' rows")
def _():
    p = planned(*RUNS, "--label", "thread")
    assert len(p.series) == 1, [s.label for s in p.series]
    s = p.series[0]
    per_file = [busbw(read(f)) for f in RUNS]
    sizes = sorted(per_file[0])
    assert s.sizes == sizes, (s.sizes, sizes)
    for k, size in enumerate(sizes):
        values = sorted(v for got in per_file for v in got[size])
        assert len(values) == 3, values
        assert close(s.median[k], values[1]) and close(s.low[k], values[0]) and \
            close(s.high[k], values[2]), (size, values, s.median[k], s.low[k], s.high[k])
        assert s.runs[k] == 3
    assert "median of 3 runs" in s.label, s.label
    # Each file alone under its own label: three plain lines, no band.
    p = planned(*(f"{f}:run {k}" for k, f in enumerate(RUNS)))
    assert [s.label for s in p.series] == ["run 0", "run 1", "run 2"], \
        [s.label for s in p.series]


@check("files without a label: alike ones are runs of their default label")
def _():
    p = planned(*RUNS, FOUR)
    assert [s.label for s in p.series] == \
        ["thread backend, 2 ranks (median of 3 runs, min to max)", "thread backend, 4 ranks"], \
        [s.label for s in p.series]
    p = planned(RUNS[0], GATHER)  # two collectives: each default label names its own
    assert [s.label for s in p.series] == \
        ["all_reduce, thread backend, 2 ranks", "all_gather, thread backend, 2 ranks"], \
        [s.label for s in p.series]


@check("--band 25-75: the quartiles, interpolated linearly; a bad --band is refused")
def _():
    p = planned(*QUARTILES, "--label", "q", "--band", "25-75")
    s = p.series[0]
    assert s.median == [2.5, 25.0] and s.low == [1.75, 17.5] and s.high == [3.25, 32.5], vars(s)
    assert s.label == "q (median of 4 runs, 25th to 75th percentile)", s.label
    for bad in ("75-25", "0-101", "quartiles"):
        _, err = plot(*QUARTILES, "--label", "q", "--band", bad, "-o", path("x.png"), expect=2)
        assert "--band" in err and bad in err, err


@check("the band is drawn for several runs, not for one, nor with --band none")
def _():
    fig = pb.figure(planned(*HAND, "--label", "hand"))
    assert len(fig.axes[0].collections) == 1, fig.axes[0].collections
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert legend == ["hand (median of 3 runs, min to max)"], legend
    assert not pb.figure(planned(RUNS[0])).axes[0].collections
    fig = pb.figure(planned(*HAND, "--label", "hand", "--band", "none"))
    assert not fig.axes[0].collections
    assert fig.axes[0].get_legend().get_texts()[0].get_text() == "hand (median of 3 runs)"


@check("--log-y: a log bandwidth axis; sizes on a log2 axis either way")
def _():
    for argv, yscale in (([], "linear"), (["--log-y"], "log")):
        ax = pb.figure(planned(*RUNS, "--label", "thread", *argv)).axes[0]
        assert ax.get_yscale() == yscale, (argv, ax.get_yscale())
        assert ax.get_xscale() == "log" and ax.xaxis.get_transform().base == 2, argv
    ax = pb.figure(planned(RUNS[0], "--log-y")).axes[0]
    ticks = [t.get_text() for t in ax.get_xticklabels()]
    assert ticks[0] == "8 B" and ticks[-1] == "32 KiB", ticks


@check("-o all -N 2: a line per reduction, each size's two cycles as two runs; --op keeps one")
def _():
    doc = read(OPS)
    ops = list(dict.fromkeys(r["redop"] for r in doc["results"]))
    p = planned(OPS)
    assert len(p.series) == len(ops) == 5, [s.label for s in p.series]
    for s, op in zip(p.series, ops):
        assert s.label.startswith(f"thread backend, 2 ranks (float, {op}) (median of 2 runs"), \
            s.label
        assert s.runs == [2] * len(s.sizes), s.runs
    # Beside it, a file of one reduction keeps its plain label.
    p = planned(OPS + ":ops", RUNS[0] + ":one")
    assert [s.label.split(" (median")[0] for s in p.series] == \
        [f"ops (float, {op})" for op in ops] + ["one"], [s.label for s in p.series]
    p = planned(OPS, "--op", "max", "--dtype", "float")
    assert len(p.series) == 1, [s.label for s in p.series]
    rows = [r for r in doc["results"] if r["redop"] == "max"]
    got = {}
    for r in rows:
        got.setdefault(r["size"], []).append(r["out_of_place"]["bus_bw"])
    s = p.series[0]
    assert s.sizes == sorted(got)
    for k, size in enumerate(s.sizes):
        a, b = sorted(got[size])
        assert close(s.median[k], (a + b) / 2) and close(s.low[k], a) and close(s.high[k], b)


@check("--baseline raw-mpi: the baseline's rows as a line of their own")
def _():
    p = planned(RUNS[0], MPI, "--baseline", "raw-mpi")
    labels = [s.label for s in p.series]
    assert labels == ["thread backend, 2 ranks", "mpi backend, 2 ranks",
                      "raw-mpi (MPI_Allreduce)"], labels
    raw = busbw(read(MPI)["unison_baselines"][0])
    assert p.series[2].median == [raw[size][0] for size in p.series[2].sizes]


@check("error: files of different collectives, rank counts or backends under one label")
def _():
    for files, what in (([RUNS[0], GATHER], "collective (all_reduce, all_gather)"),
                        ([RUNS[0], FOUR], "rank count (2, 4)"),
                        ([RUNS[0], MPI], "backend (thread, mpi)")):
        _, err = plot(*files, "--label", "one", "-o", path("x.png"), expect=1)
        assert f"label 'one': {files[0]} and {files[1]} differ in {what}" in err, err
    _, err = plot(RUNS[0] + ":same", GATHER + ":same", "-o", path("x.png"), expect=1)
    assert "differ in collective" in err, err
    assert not os.path.exists(path("x.png"))


@check("error: a file without results")
def _():
    doc = read(RUNS[0])
    del doc["results"]
    f = write("noresults.json", doc)
    _, err = plot(f, "-o", path("x.png"), expect=1)
    assert f"{f}: no \"results\" list: not an nccl-tests -J file" in err, err
    doc["results"] = []
    f = write("emptyresults.json", doc)
    _, err = plot(f, "-o", path("x.png"), expect=1)
    assert f"{f}: \"results\" is empty: the run timed no size" in err, err
    doc["results"] = [{"size": 8, "out_of_place": {"bus_bw": "nan"}}]
    f = write("nobw.json", doc)
    _, err = plot(f, "-o", path("x.png"), expect=1)
    assert f"{f}: no out-of-place bus bandwidth in \"results\"" in err, err


@check("error: not JSON, a missing file, a --dtype the file lacks, no recorded baseline")
def _():
    with open(path("text.json"), "w") as f:
        f.write("# nccl-tests\n")
    _, err = plot(path("text.json"), "-o", path("x.png"), expect=1)
    assert f"{path('text.json')}: not JSON" in err, err
    _, err = plot(path("absent.json"), "-o", path("x.png"), expect=1)
    assert f"{path('absent.json')}: No such file or directory" in err, err
    _, err = plot(RUNS[0], "--dtype", "double", "-o", path("x.png"), expect=1)
    assert "(--dtype double: the file has float)" in err, err
    _, err = plot(RUNS[0], "--baseline", "raw-mpi", "-o", path("x.png"), expect=1)
    assert "--baseline raw-mpi: none of the files recorded it" in err, err


@check("usage errors: --label count, no -o, an empty label")
def _():
    _, err = plot(*RUNS, "--label", "a", "--label", "b", "-o", path("x.png"), expect=2)
    assert "--label given 2 time(s) for 3 file(s)" in err, err
    _, err = plot(RUNS[0], expect=2)
    assert "-o/--output is required" in err, err
    _, err = plot(path("absent.json") + ":", "-o", path("x.png"), expect=2)
    assert "empty label after ':'" in err, err


if FAILED:
    print(f"{len(FAILED)} check(s) failed: {', '.join(FAILED)}")
    sys.exit(1)
print("all checks passed")
