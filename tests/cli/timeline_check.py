#!/usr/bin/env python3
"""UNISON_TIMELINE end to end: a DDP run and a ZeRO-3 run of the examples write one
Chrome trace-event file per rank that follows the Trace Event Format (checked here
from its definition, not with unison's own checker), every span they begin ends,
and the events say what happened: collectives with their bytes and algorithm,
DDP buckets around their all-reduces, FSDP units' gathers and reductions, the
optimizer step and the program's own phases. scripts/timeline.py checks, merges
and draws them, and refuses a broken file. Without the variable nothing is
written.

Usage: timeline_check.py DDP_MLP ZERO_ADAMW TIMELINE_PY [MPIEXEC_SH]
"""

import json
import os
import subprocess
import sys
import tempfile

DDP, ZERO, TOOL = (os.path.abspath(a) for a in sys.argv[1:4])
MPIEXEC = sys.argv[4] if len(sys.argv) > 4 else None
FAILED = []


def check(name):
    def wrap(fn):
        try:
            fn()
            print(f"ok: {name}")
        except Exception as e:  # every failing check is reported
            FAILED.append(name)
            print(f"FAILED: {name}: {type(e).__name__}: {e}")
        return fn
    return wrap


def train(argv, prefix=None, cwd=None, steps=3):
    """Three steps are too few for ddp_mlp's loss to halve, so it exits 1 after
    training; the files are written all the same."""
    env = dict(os.environ)
    env.pop("UNISON_TIMELINE", None)
    if prefix is not None:
        env["UNISON_TIMELINE"] = prefix
    p = subprocess.run(argv + ["--steps", str(steps)], capture_output=True, text=True,
                       timeout=180, env=env, cwd=cwd)
    assert ": loss " in p.stdout, f"{argv}: {p.stdout[-500:]} {p.stderr[-1500:]}"
    return p


def events_of(path):
    doc = json.load(open(path))
    assert isinstance(doc, dict) and isinstance(doc["traceEvents"], list), path
    return doc["traceEvents"]


def trace_event_format(events, rank):
    """The format's required fields per phase, and every async begin ended once, in
    order (Trace Event Format: "b"/"e" match on cat and id; "X" carries dur)."""
    opened = {}
    for e in events:
        assert isinstance(e["name"], str) and e["ph"] in "benXiM", e
        assert e["pid"] == rank and isinstance(e["tid"], int), e
        if e["ph"] == "M":
            continue
        assert isinstance(e["ts"], (int, float)) and e["ts"] > 0, e
        if e["ph"] == "X":
            assert e["dur"] >= 0, e
        if e["ph"] in "ben":
            key = (e["cat"], e["id"])
            if e["ph"] == "b":
                assert key not in opened, e
                opened[key] = e
            else:
                assert key in opened, e
                if e["ph"] == "e":
                    b = opened.pop(key)
                    assert b["name"] == e["name"] and b["ts"] <= e["ts"], (b, e)
    assert not opened, f"never ended: {list(opened.values())[:3]}"


def spans(events):
    out, opened = [], {}
    for e in events:
        if e["ph"] == "X":
            out.append(dict(e, end=e["ts"] + e["dur"]))
        elif e["ph"] == "b":
            opened[(e["cat"], e["id"])] = e
        elif e["ph"] == "e":
            out.append(dict(opened.pop((e["cat"], e["id"])), end=e["ts"]))
    return out


@check("off: nothing written without UNISON_TIMELINE")
def _():
    with tempfile.TemporaryDirectory() as d:
        train([DDP, "-t", "2"], cwd=d)
        assert os.listdir(d) == [], os.listdir(d)


@check("DDP on 2 thread ranks: a valid trace per rank, buckets around their all-reduces")
def _():
    with tempfile.TemporaryDirectory() as d:
        prefix = os.path.join(d, "ddp")
        train([DDP, "-t", "2"], prefix)
        assert sorted(os.listdir(d)) == ["ddp.0.json", "ddp.1.json"], os.listdir(d)
        for rank in (0, 1):
            events = events_of(f"{prefix}.{rank}.json")
            trace_event_format(events, rank)
            s = spans(events)
            phases = [x["name"] for x in s if x["cat"] == "compute"]
            assert phases.count("forward") == 3 and phases.count("backward") == 3, phases
            buckets = [x for x in s if x["cat"] == "ddp"]
            reduces = [x for x in s if x["cat"] == "collective" and
                       x["name"].startswith("all_reduce") and x["args"]["bytes"] > 1000]
            assert len(buckets) == 3 and len(reduces) == 3, (len(buckets), len(reduces))
            for b, r in zip(buckets, reduces):
                assert b["ts"] <= r["ts"] and r["end"] <= b["end"], (b, r)
                assert r["args"]["bytes"] == b["args"]["bytes"] and r["args"]["dtype"] == "float"
                assert r["args"]["algorithm"] == "rank_ordered" and r["args"]["op"] == "avg"
            ready = [e for e in events if e["ph"] == "i" and e["name"] == "bucket 0 ready"]
            assert len(ready) == 3
            started = [e for e in events if e["ph"] == "n" and e["name"] == "started"]
            assert len(started) >= 3, len(started)
            # every collective of the thread backend says when its peers arrived
            arrived = {e["id"] for e in events if e["ph"] == "n" and e["name"] == "peers arrived"}
            begun = {e["id"] for e in events if e["ph"] == "b" and e["cat"] == "collective"}
            assert arrived == begun, (len(arrived), len(begun))


@check("ZeRO-3 on 2 thread ranks: unit gathers and reductions, the optimizer step")
def _():
    with tempfile.TemporaryDirectory() as d:
        prefix = os.path.join(d, "zero")
        train([ZERO, "-t", "2"], prefix)
        for rank in (0, 1):
            events = events_of(f"{prefix}.{rank}.json")
            trace_event_format(events, rank)
            s = spans(events)
            names = [x["name"] for x in s if x["cat"] == "fsdp"]
            gathers = [n for n in names if n.startswith("gather unit ")]
            reduces = [n for n in names if n.startswith("reduce unit ")]
            assert gathers and reduces, names[:10]
            # every unit's gradient is reduced once per step
            units = {n.split()[-1] for n in reduces}
            assert len(reduces) == 3 * len(units), (len(reduces), units)
            steps = [x for x in s if x["name"] == "optimizer step"]
            assert len(steps) == 3, len(steps)
            kinds = {x["name"].split()[0] for x in s if x["cat"] == "collective"}
            assert {"all_gather", "reduce_scatter"} <= kinds, kinds
            releases = [e for e in events if e["ph"] == "i" and e["name"].startswith("release")]
            assert releases


@check("scripts/timeline.py: check, merge and draw; a broken file refused")
def _():
    with tempfile.TemporaryDirectory() as d:
        prefix = os.path.join(d, "ddp")
        train([DDP, "-t", "2"], prefix)
        files = [f"{prefix}.0.json", f"{prefix}.1.json"]
        subprocess.run([sys.executable, TOOL, "check"] + files, check=True, timeout=60)
        merged = os.path.join(d, "all.json")
        subprocess.run([sys.executable, TOOL, "merge", prefix, "-o", merged], check=True,
                       timeout=60)
        pids = {e["pid"] for e in events_of(merged)}
        assert pids == {0, 1}, pids
        doc = json.load(open(files[0]))
        doc["traceEvents"] = [e for e in doc["traceEvents"] if e["ph"] != "e"]
        broken = os.path.join(d, "broken.json")
        json.dump(doc, open(broken, "w"))
        p = subprocess.run([sys.executable, TOOL, "check", broken], capture_output=True,
                           text=True, timeout=60)
        assert p.returncode == 1 and "never ended" in p.stderr, (p.returncode, p.stderr)
        python = None
        for candidate in (sys.executable, "/usr/bin/python3"):
            if subprocess.run([candidate, "-c", "import matplotlib"],
                              capture_output=True).returncode == 0:
                python = candidate
                break
        if python is None:
            print("  (no python3 with matplotlib: the PNG was not drawn)")
            return
        png = os.path.join(d, "step.png")
        subprocess.run([python, TOOL, "draw", prefix, "-o", png], check=True, timeout=120)
        with open(png, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"


@check("a path that cannot be written is named on stderr")
def _():
    p = train([DDP, "-t", "2"], "/nonexistent-dir/x")
    assert "UNISON_TIMELINE" in p.stderr, p.stderr[-500:]


if MPIEXEC:
    @check("DDP under mpiexec: each process writes its rank's file, the algorithm named")
    def _():
        with tempfile.TemporaryDirectory() as d:
            prefix = os.path.join(d, "mpi")
            env_run = ["bash", MPIEXEC, "-n", "2", DDP]
            # Enough steps for the loss to halve: a process that exits non-zero makes
            # mpiexec kill the others, maybe before they wrote their files.
            p = train(env_run, prefix, steps=20)
            assert p.returncode == 0, p.stdout[-500:]
            for rank in (0, 1):
                events = events_of(f"{prefix}.{rank}.json")
                trace_event_format(events, rank)
                algs = {x["args"].get("algorithm") for x in spans(events)
                        if x["cat"] == "collective" and x["name"].startswith("all_reduce")}
                assert algs and None not in algs, algs
                arrived = [e for e in events if e["ph"] == "n" and e["name"] == "peers arrived"]
                assert arrived, "no 'peers arrived' on MPI"

if FAILED:
    print(f"{len(FAILED)} check(s) failed: {FAILED}")
    sys.exit(1)
print("timeline: every check passed")
