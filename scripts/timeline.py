#!/usr/bin/env python3
"""unison's timeline files (UNISON_TIMELINE=path writes path.<rank>.json): check,
merge, draw.

    timeline.py check path.0.json path.1.json      # Trace Event Format, every begin ended
    timeline.py merge path -o trace.json            # path.*.json -> one trace (Perfetto)
    timeline.py draw path -o step.png [--step K]    # one training step as a PNG

`check` exits 1 naming the first problem: a missing or mistyped required field
(name, ph, ts, pid, tid; dur for "X"; cat and id for async events), an async
span ("b") without its end ("e", same pid, cat, id and name) or an end without
its begin, an unknown phase.

`draw` shows one step, one band per rank: the rank's own phases (forward,
backward, step: what the program marked with unison::timeline::scope, and the
optimizer step) on its compute row, and under it what unison did at the same
time: collectives, DDP bucket reductions, FSDP unit gathers and reductions. A
step runs from the K-th "forward" phase of rank 0 (default the second, past the
first step's warm-up) to the next one. Needs matplotlib.
"""

import argparse
import glob
import json
import os
import re
import sys

PROG = "timeline.py"
ASYNC = {"b", "e", "n"}
KNOWN = {"b", "e", "n", "X", "i", "M", "B", "E"}


class TraceError(Exception):
    """A file that is not a valid trace, or that lacks what was asked for."""


def load(path):
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except OSError as e:
        raise TraceError(f"{path}: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise TraceError(f"{path}: not JSON: {e}") from None
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    if not isinstance(events, list):
        raise TraceError(f"{path}: no \"traceEvents\" list")
    return events


def rank_files(prefix):
    """The files of `prefix` (path.<rank>.json), in rank order; or `prefix` itself."""
    if os.path.isfile(prefix):
        return [prefix]
    found = []
    for f in glob.glob(glob.escape(prefix) + ".*.json"):
        m = re.fullmatch(re.escape(prefix) + r"\.(\d+)\.json", f)
        if m:
            found.append((int(m[1]), f))
    if not found:
        raise TraceError(f"no {prefix}.<rank>.json files (UNISON_TIMELINE={prefix})")
    return [f for _, f in sorted(found)]


def check_events(events, where):
    """Raises TraceError at the first event that breaks the Trace Event Format as
    unison writes it, or a span left open."""
    open_spans = {}
    for i, e in enumerate(events):
        at = f"{where}: event {i} ({e.get('name', '?')!r})"
        if not isinstance(e, dict):
            raise TraceError(f"{where}: event {i} is not an object")
        for key, kind in (("name", str), ("ph", str), ("pid", int), ("tid", int)):
            if not isinstance(e.get(key), kind):
                raise TraceError(f"{at}: no {key} of type {kind.__name__}")
        ph = e["ph"]
        if ph not in KNOWN:
            raise TraceError(f"{at}: unknown phase {ph!r}")
        if ph != "M" and not isinstance(e.get("ts"), (int, float)):
            raise TraceError(f"{at}: no numeric ts")
        if ph == "X" and not (isinstance(e.get("dur"), (int, float)) and e["dur"] >= 0):
            raise TraceError(f"{at}: a complete event without a duration >= 0")
        if ph in ASYNC:
            if not isinstance(e.get("cat"), str) or not isinstance(e.get("id"), (str, int)):
                raise TraceError(f"{at}: an async event without cat and id")
            key = (e["pid"], e["cat"], e["id"])
            if ph == "b":
                if key in open_spans:
                    raise TraceError(f"{at}: begins span {key} again before it ended")
                open_spans[key] = (e["name"], e["ts"])
            elif ph == "e":
                if key not in open_spans:
                    raise TraceError(f"{at}: ends span {key}, which never began")
                name, ts = open_spans.pop(key)
                if name != e["name"] or e["ts"] < ts:
                    raise TraceError(f"{at}: ends span {key} begun as {name!r} at {ts}")
            elif key not in open_spans:
                raise TraceError(f"{at}: a step of span {key}, which is not open")
    if open_spans:
        key, (name, _) = next(iter(open_spans.items()))
        raise TraceError(f"{where}: {len(open_spans)} span(s) never ended, "
                         f"the first {name!r} {key}")


def merged(prefix):
    events = []
    for f in rank_files(prefix):
        events.extend(load(f))
    return events


def spans(events):
    """(pid, lane, name, start, end, cat) for every span: X events and b/e pairs."""
    out, opened = [], {}
    for e in events:
        ph = e.get("ph")
        if ph == "X":
            out.append((e["pid"], e.get("cat", ""), e["name"], e["ts"], e["ts"] + e["dur"]))
        elif ph == "b":
            opened[(e["pid"], e["cat"], e["id"])] = e
        elif ph == "e":
            b = opened.pop((e["pid"], e["cat"], e["id"]), None)
            if b is not None:
                out.append((e["pid"], e["cat"], e["name"], b["ts"], e["ts"]))
    return out


ROWS = ("compute", "collective", "ddp", "fsdp")
COLORS = {"compute": "#4c72b0", "collective": "#dd8452", "ddp": "#55a868", "fsdp": "#8172b3"}
LABELS = {"compute": "the program's phases and the optimizer step",
          "collective": "collectives", "ddp": "DDP bucket reductions",
          "fsdp": "FSDP/ZeRO unit gathers and reductions"}


def step_window(all_spans, k):
    starts = sorted(s for p, c, n, s, _ in all_spans if p == 0 and c == "compute" and
                    n == "forward")
    if len(starts) < k:
        raise TraceError(f"rank 0 marked {len(starts)} 'forward' phase(s); --step {k} needs "
                         f"{k} (mark forward with unison::timeline::scope)")
    begin = starts[k - 1]
    end = starts[k] if len(starts) > k else max(e for *_, e in all_spans)
    return begin, end


def draw(prefix, output, k, title):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError:
        raise TraceError("drawing needs matplotlib (Debian: python3-matplotlib)") from None
    all_spans = spans(merged(prefix))
    begin, end = step_window(all_spans, k)
    ranks = sorted({p for p, *_ in all_spans})
    fig, ax = plt.subplots(figsize=(11, 1.0 + 1.1 * len(ranks)))
    band = len(ROWS) + 1
    for r in ranks:
        for j, row in enumerate(ROWS):
            y = (len(ranks) - 1 - r) * band + (len(ROWS) - 1 - j)
            bars = sorted(((s - begin) / 1e3, (e - s) / 1e3) for p, c, _, s, e in all_spans
                          if p == r and c == row and e > begin and s < end)
            # Spans in flight at once (buckets, prefetched gathers) get a sub-row each.
            rows_end, placed = [], []
            for x, w in bars:
                k = next((i for i, t in enumerate(rows_end) if t <= x), len(rows_end))
                if k == len(rows_end):
                    rows_end.append(x + w)
                else:
                    rows_end[k] = x + w
                placed.append((k, x, w))
            n = max(1, len(rows_end))
            for k in range(n):
                mine = [(x, w) for j, x, w in placed if j == k]
                if mine:
                    ax.broken_barh(mine, (y + 0.1 + 0.8 * k / n, 0.8 / n),
                                   facecolors=COLORS[row], edgecolors="white", linewidth=0.3)
            if row == "compute":
                for p, c, n, s, e in all_spans:
                    if p == r and c == row and s >= begin and e <= end and (e - s) > 0.08 * (end - begin):
                        ax.text((s + e) / 2e3 - begin / 1e3, y + 0.5, n, ha="center",
                                va="center", fontsize=7, color="white")
    ax.set_yticks([(len(ranks) - 1 - r) * band + (len(ROWS) - 1) / 2 for r in ranks])
    ax.set_yticklabels([f"rank {r}" for r in ranks])
    ax.set_xlim(0, (end - begin) / 1e3)
    ax.set_xlabel("ms from the start of the step")
    ax.set_title(title or f"one step ({os.path.basename(prefix)}, {len(ranks)} ranks)")
    ax.legend(handles=[Patch(color=COLORS[r], label=LABELS[r]) for r in ROWS],
              loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=2, fontsize=8, frameon=False)
    fig.tight_layout()
    fig.savefig(output, dpi=120)
    plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("check", help="validate timeline files")
    c.add_argument("files", nargs="+")
    m = sub.add_parser("merge", help="one trace of every rank's file")
    m.add_argument("prefix", help="UNISON_TIMELINE's path (its path.<rank>.json files)")
    m.add_argument("-o", "--output", required=True)
    d = sub.add_parser("draw", help="one step as a PNG")
    d.add_argument("prefix", help="UNISON_TIMELINE's path, or a merged trace")
    d.add_argument("-o", "--output", required=True, metavar="PNG")
    d.add_argument("--step", type=int, default=2, help="which step (1: the first) [2]")
    d.add_argument("--title")
    args = p.parse_args(argv)
    try:
        if args.command == "check":
            for f in args.files:
                check_events(load(f), f)
            print(f"{PROG}: {len(args.files)} file(s) OK")
        elif args.command == "merge":
            events = merged(args.prefix)
            check_events(events, args.prefix)
            with open(args.output, "w", encoding="utf-8") as f:
                json.dump({"displayTimeUnit": "us", "traceEvents": events}, f)
            print(f"{PROG}: {len(events)} events of {len(rank_files(args.prefix))} rank(s) "
                  f"-> {args.output}")
        else:
            if not args.output.endswith(".png"):
                p.error(f"-o/--output: '{args.output}' must end in .png")
            if args.step < 1:
                p.error("--step counts from 1")
            draw(args.prefix, args.output, args.step, args.title)
            print(f"{PROG}: step {args.step} -> {args.output}")
    except TraceError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
