#!/usr/bin/env python3
"""unison-bench as a drop-in for NVIDIA's nccl-tests 2.19 (its all_reduce_perf and
friends): command lines from nccl-tests' README and from its known consumers run
unchanged, nccl-tests' defaults give its rows, and what its consumers read from the
output (the text table, the closing lines, the -J file) they find.

Three consumers' readers are written again here, from what each one does:
  - Microsoft SuperBench's nccl-bw benchmark: it slices the log from the last line
    that says "out-of-place" to the last "Out of bounds values", finds the column
    names on the line holding "time" and "busbw", and reads every line of the slice
    that starts with a number, counting the columns of the side it wants from the
    end of the line;
  - FlagPerf's interconnect checks: the last field of the "# Avg bus bandwidth" line;
  - nccl-tests' own tools/analyze_perf_json.py: file version 3, config.iterations,
    aggregated_iterations and per_iter_skip, and per result the placement's
    per_iter object (avg_us, min_us, max_us, p99_us, cv_pct, times_us and, with
    several processes, per_process_max_times_us, whose max per iteration must be
    times_us).

Usage: nccl_tests_dropin.py UNISON_BENCH [MPIEXEC_SH]
(the second, scripts/mpiexec.sh, adds the checks under an MPI launcher.)
"""

import json
import os
import re
import subprocess
import sys
import tempfile

BENCH = os.path.abspath(sys.argv[1])
MPIEXEC = sys.argv[2] if len(sys.argv) > 2 else None
DIR = os.path.dirname(BENCH)
FAILED = []


def perf(name):
    """The nccl-tests link next to unison-bench (all_reduce_perf, ...)."""
    return os.path.join(DIR, name)


def run(argv, expect=0, timeout=300, env=None):
    p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                       env=dict(os.environ, **(env or {})))
    if p.returncode != expect:
        raise AssertionError(f"{' '.join(argv)}: exit {p.returncode}, not {expect}\n"
                             f"stdout: {p.stdout[-2000:]}\nstderr: {p.stderr[-2000:]}")
    return p.stdout, p.stderr


def check(name):
    def wrap(fn):
        try:
            fn()
            print(f"ok: {name}")
        except Exception as e:  # report every failing check, not only the first
            FAILED.append(name)
            print(f"FAILED: {name}: {e}")
        return fn
    return wrap


def main_rows(text):
    """The main table's rows as nccl-tests prints them: lines starting with a number."""
    return [line.split() for line in text.splitlines() if re.match(r"^\s*\d", line)]


def superbench_read(text, in_place=False):
    """SuperBench's reading of an nccl-tests log: {size: (time, algbw, busbw)}."""
    lines = text.splitlines()
    oop = max((i for i, l in enumerate(lines) if "out-of-place" in l), default=-1)
    oob = max((i for i, l in enumerate(lines) if "Out of bounds values" in l), default=-1)
    assert oop != -1 and oob != -1, "no 'out-of-place' or no 'Out of bounds values' line"
    body = lines[oop + 1:oob]
    names = None
    for l in body:
        if "time" in l and "busbw" in l:
            names = re.sub(" +", " ", l[1:].strip(" ")).split(" ")
            break
    assert names is not None, "no column names"
    size_at = names.index("size")

    def at(column):
        if in_place:
            return -1 - list(reversed(names)).index(column)
        return names.index(column) - len(names)

    out = {}
    for l in body:
        fields = re.sub(" +", " ", l.strip(" ")).split(" ")
        if not fields or not re.match(r"\d+", fields[0]):
            continue
        size = int(fields[size_at])
        out[size] = (float(fields[at("time")]), float(fields[at("algbw")]),
                     float(fields[at("busbw")]))
    assert out, "no rows"
    return out


def flagperf_read(text):
    """FlagPerf's reading: the last field of the '# Avg bus bandwidth' line."""
    found = [l for l in text.splitlines() if "# Avg bus bandwidth" in l]
    assert len(found) == 1, f"{len(found)} '# Avg bus bandwidth' lines"
    return float(found[0].split()[-1])


def iteration_summary(times, skip):
    """nccl-tests' computeIterStats, from its definition: over the iterations after
    the first `skip`, sorted; p50 the upper median, p95 and p99 by nearest rank."""
    t = sorted(times[skip:])
    n = len(t)

    def nearest(pct):
        return min(n - 1, (n * pct + 99) // 100 - 1)

    mean = sum(t) / n
    stdev = (sum((v - mean) ** 2 for v in t) / n) ** 0.5
    return {"min_us": t[0], "max_us": t[-1], "avg_us": mean, "p50_us": t[n // 2],
            "p95_us": t[nearest(95)], "p99_us": t[nearest(99)], "stdev_us": stdev,
            "cv_pct": stdev / mean * 100 if mean > 0 else 0.0}


def analyze_perf_json_read(doc, processes):
    """What nccl-tests' analyze_perf_json.py reads from a -I -J file, checked."""
    assert doc["version"] == 3, doc["version"]
    cfg = doc["config"]
    iters, skip = cfg["iterations"], cfg["per_iter_skip"]
    assert cfg["aggregated_iterations"] == 1 and cfg["per_iter_timing"] == "true"
    for r in doc["results"]:
        assert list(r) == ["size", "count", "type", "redop", "root", "out_of_place",
                           "out_of_place_per_iter", "in_place", "in_place_per_iter",
                           "actual_iterations", "experiment_name"], list(r)
        for key in ("out_of_place_per_iter", "in_place_per_iter"):
            p = r[key]
            assert p["skipped_iterations"] == skip
            assert len(p["times_us"]) == iters
            want = iteration_summary(p["times_us"], skip)
            for k, v in want.items():
                # the file holds 6 decimals of each
                assert abs(p[k] - v) <= 1e-5 + 1e-6 * abs(v), (key, k, p[k], v)
            rows = p.get("per_process_max_times_us", [])
            assert len(rows) == (processes if processes > 1 else 0), len(rows)
            for i in range(iters if rows else 0):
                assert abs(max(row[i] for row in rows) - p["times_us"][i]) < 1e-5, i
            # the per-iteration mean cannot exceed the slowest call nor undercut
            # the fastest
            assert p["min_us"] <= p["avg_us"] <= p["max_us"]


@check("nccl-tests' defaults: -b 2M -e 8M gives its 7 rows (steps of 1 MiB), 1 warm-up")
def _():
    out, _ = run([perf("all_reduce_perf"), "-b", "2M", "-e", "8M"])
    sizes = [int(r[0]) for r in main_rows(out)]
    assert sizes == [(2 + k) << 20 for k in range(7)], sizes
    assert re.search(r"^# nThread \d+ nGpus 0 minBytes 2097152 maxBytes 8388608 "
                     r"step: 1048576\(bytes\) warmup iters: 1 iters: 20 agg iters: 1 "
                     r"validation: 1 graph: 0 unalign: 0$", out, re.M), out[:800]


@check("nccl-tests' README: all_reduce_perf -b 8 -e 128M -f 2 -g 8 (8 thread ranks)")
def _():
    out, _ = run([perf("all_reduce_perf"), "-b", "8", "-e", "128M", "-f", "2", "-g", "8"])
    rows = main_rows(out)
    assert len(rows) == 25 and all(r[8] == "0" and r[12] == "0" for r in rows), rows[:3]
    assert "backend thread, 8 ranks" in out
    assert flagperf_read(out) > 0


@check("SuperBench's command line and reader (-e 1M instead of its 8G; one process)")
def _():
    argv = [perf("all_reduce_perf"), "-b", "8", "-e", "1M", "-f", "2", "-g", "1", "-c", "0",
            "-n", "20", "-w", "5", "-G", "0", "-d", "float"]
    out, _ = run(argv)
    rows = main_rows(out)
    oop, ip = superbench_read(out), superbench_read(out, in_place=True)
    assert sorted(oop) == [int(r[0]) for r in rows] == sorted(ip), (sorted(oop), len(rows))
    for r in rows:
        size = int(r[0])
        assert oop[size] == (float(r[5]), float(r[6]), float(r[7])), (size, oop[size], r)
        assert ip[size] == (float(r[9]), float(r[10]), float(r[11])), (size, ip[size], r)
    named = re.search(r"^# unison-bench: accepted without effect .*: (.*)$", out, re.M)
    # -g 1 in one process is one rank, as in nccl-tests; -G 0 changes nothing
    assert named and "-G 0" in named[1] and "backend thread, 1 ranks" in out, out[:1200]


@check("--baseline: the consumers still read the main table alone")
def _():
    out, _ = run([BENCH, "-t", "2", "-b", "1K", "-e", "64K", "-f", "4", "--baseline"])
    rows = main_rows(out)
    oop = superbench_read(out)
    assert len(oop) == len(rows) == 4, (len(oop), len(rows))
    for r in rows:
        assert oop[int(r[0])] == (float(r[5]), float(r[6]), float(r[7]))
    assert flagperf_read(out) == float(re.search(r"# Avg bus bandwidth +: (\S+)", out)[1])
    concluded = out.index("# Collective test concluded")
    assert out.index("# Baseline local-add") > concluded
    assert "out-of-place" not in out[concluded:] and "Out of bounds" not in out[concluded:]


@check("-I 1 -K 2 -J: per-iteration columns and the version 3 file nccl-tests' "
       "analyze_perf_json.py reads")
def _():
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "run.json")
        out, _ = run([BENCH, "-t", "3", "-b", "8", "-e", "64K", "-f", "8", "-n", "12", "-I", "1",
                      "-K", "2", "-J", path])
        assert "# Per-Iteration Report:" in out and "summary skips first 2 iterations" in out
        assert re.search(r"#wrong +i_min +i_max +i_p99 +i_cv% +time", out), out[:1500]
        rows = main_rows(out)
        assert rows and all(len(r) == 5 + 2 * 8 for r in rows), rows[0]
        doc = json.load(open(path))
        analyze_perf_json_read(doc, processes=1)
        for r, line in zip(doc["results"], rows):  # the text shows the file's i_* figures
            p = r["out_of_place_per_iter"]
            for k, column in (("min_us", 9), ("max_us", 10), ("p99_us", 11)):
                assert abs(float(line[column]) - p[k]) <= 0.006 * max(1, p[k]), (k, line, p)


@check("-d all -o all: nccl-tests' order of types and reductions, avg skipped on integers")
def _():
    out, _ = run([BENCH, "-t", "2", "-b", "64", "-e", "64", "-d", "all", "-o", "all", "-n", "2"])
    kinds = [(r[2], r[3]) for r in main_rows(out)]
    types = ["int8", "uint8", "int32", "uint32", "int64", "uint64", "half", "float", "double",
             "bfloat16"]
    want = [(t, op) for t in types for op in ("sum", "prod", "max", "min", "avg")
            if op != "avg" or t in ("half", "float", "double", "bfloat16")]
    assert kinds == want, kinds
    assert all(r[8] == "0" and r[12] == "0" for r in main_rows(out))
    out, _ = run([perf("all_gather_perf"), "-t", "2", "-b", "64", "-e", "64", "-d", "all",
                  "-o", "all", "-n", "2"])
    assert [(r[2], r[3]) for r in main_rows(out)] == [(t, "none") for t in types]


@check("sizes as nccl-tests reads them: fractions, units in either case")
def _():
    out, _ = run([BENCH, "-t", "2", "-b", "1.5K", "-e", "3k", "-i", "0.5K", "-n", "2"])
    assert [int(r[0]) for r in main_rows(out)] == [1536, 2048, 2560, 3072]
    for bad in ("-1", "8X", "1.5Q", ""):
        _, err = run([BENCH, "-b", bad], expect=2)
        assert "-b" in err, err


@check("-u, -N, -S, -T, -C, -a: misaligned buffers checked, cycles, timestamps")
def _():
    out, _ = run([BENCH, "-t", "2", "-b", "4K", "-e", "16K", "-f", "2", "-u", "3", "-N", "2",
                  "-S", "1", "-T", "30", "-C", "0", "-a", "1", "-d", "double"])
    rows = main_rows(out)
    assert [int(r[0]) for r in rows] == [4096, 8192, 16384] * 2
    assert all(r[8] == "0" and r[12] == "0" for r in rows)
    assert "unalign: 3" in out
    assert all(re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d$", " ".join(r[-2:])) for r in rows)
    assert re.search(r"#wrong +timestamp$", out, re.M)


@check("nccl-tests' options for NCCL or CUDA: neutral values accepted, others refused")
def _():
    neutral = ["-g", "1", "-m", "1", "-z", "0", "-y", "0", "-G", "0", "-R", "0", "-p", "0",
               "-D", "0", "-V", "16", "-M", "0", "--ngpus=1", "--cudagraph", "0"]
    out, _ = run([BENCH, "-t", "2", "-b", "8", "-e", "8"] + neutral)
    named = re.search(r"^# unison-bench: accepted without effect .*: (.*)$", out, re.M)
    assert named, out[:800]
    for flag in ("-m 1", "-z 0", "-y 0", "-G 0", "-R 0", "-p 0", "-D 0", "-V 16", "-M 0"):
        assert flag in named[1], (flag, named[1])
    for argv, says in ((["-G", "10"], "CUDA graphs are not captured"),
                       (["-z", "1"], "blocking modes"),
                       (["-m", "4"], "aggregated"),
                       (["-x", "1"], "CTA policy"),
                       (["-R", "2"], "registered"),
                       (["-M", "1"], "memory report"),
                       (["-o", "mulsum"], "pre-multiplied sum"),
                       (["-d", "f8e4m3"], "8-bit float"),
                       (["-K", "2"], "-I 1"),
                       (["-I", "1", "-K", "20"], "none of the 20 iterations"),
                       (["-N", "0"], "forever"),
                       (["-B", "thread", "-g", "2", "-B", "mpi"], "one device per rank")):
        _, err = run([BENCH] + argv, expect=2)
        assert says in err, (argv, err)


if MPIEXEC:
    @check("under mpiexec: nccl-tests' README line's flags (-g 1), -t 1, -I with process rows")
    def _():
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "run.json")
            out, _ = run(["bash", MPIEXEC, "-n", "2", perf("all_reduce_perf"), "-b", "8", "-e",
                          "256K", "-f", "8", "-g", "1", "-t", "1", "-I", "1", "-J", path])
            assert "backend mpi, 2 ranks" in out and "-g 1" in out and "-t 1" in out, out[:1200]
            assert len(main_rows(out)) == 6
            analyze_perf_json_read(json.load(open(path)), processes=2)
            assert superbench_read(out) and flagperf_read(out) > 0

if FAILED:
    print(f"{len(FAILED)} check(s) failed: {FAILED}")
    sys.exit(1)
print("nccl-tests drop-in: every check passed")
