#!/usr/bin/env python3
"""trace_steps.py: where a decode step's time goes on the device, from kernel_trace.c's CSV.

Usage: trace_steps.py TRACE.csv [LABEL [RECORDS]]

A step is one graph replay (the records of one graph launch share a correlation id) together with
the copies and kernels between it and the next replay. For each step: its span (first record's
start to last record's end), the time no record runs (gaps), and each kind of kernel's time on
the step's critical path: every instant of the span is given to the oldest record running then
(under programmatic dependent launches the next kernel starts while the one before finishes; the
instant is the older one's). Per kind of kernel (name and grid): launches, the summed durations and
the critical-path time, mean over the steps; then the last step's first RECORDS records (40).
"""
import csv
import subprocess
import sys
from collections import defaultdict


def demangle(names):
    try:
        out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True)
        return dict(zip(names, out.stdout.split("\n")))
    except (OSError, subprocess.CalledProcessError):
        return {n: n for n in names}


def short(name):
    """Function name with template arguments, without return type and parameter list."""
    name = name.replace("(anonymous namespace)::", "")
    depth, cut = 0, len(name)
    for i, ch in enumerate(name):
        if ch in "<":
            depth += 1
        elif ch in ">":
            depth -= 1
        elif ch == "(" and depth == 0:
            cut = i
            break
    name = name[:cut]
    return name[5:] if name.startswith("void ") else name


def critical(recs):
    """Per record index, the time of the span given to it (the oldest running record)."""
    events = []
    for i, r in enumerate(recs):
        events.append((r["start"], 1, i))
        events.append((r["end"], 0, i))
    events.sort()
    running, share, idle, last = set(), defaultdict(int), 0, None
    for t, is_start, i in events:
        if last is not None:
            if running:
                oldest = min(running, key=lambda j: (recs[j]["start"], j))
                share[oldest] += t - last
            else:
                idle += t - last
        last = t
        if is_start:
            running.add(i)
        else:
            running.discard(i)
    return share, idle


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    label = sys.argv[2] if len(sys.argv) > 2 else sys.argv[1]
    rows = []
    with open(sys.argv[1], newline="") as f:
        for r in csv.DictReader(f):
            if r["kind"] == "mark":
                continue
            rec = {
                "kind": r["kind"], "start": int(r["start_ns"]), "end": int(r["end_ns"]), "graph": int(r["graph"]),
                "corr": int(r["correlation"]), "grid": r["grid_or_bytes"], "name": r["name"],
            }
            rows.append(rec)
    rows.sort(key=lambda r: r["start"])
    names = demangle(sorted({r["name"] for r in rows if r["kind"] == "kernel"}))
    for r in rows:
        if r["kind"] == "kernel":
            r["name"] = short(names.get(r["name"], r["name"]))
        r["key"] = r["name"] if r["kind"] != "kernel" else "%s [%s]" % (r["name"], r["grid"])
    # steps: split at the first record of each graph launch
    first = {}  # a graph launch's first record
    for x in rows:
        if x["graph"] and x["start"] < first.get(x["corr"], x["start"] + 1):
            first[x["corr"]] = x["start"]
    launches = sorted((t, c) for c, t in first.items())
    if not launches:
        print("%s: no graph replays in the trace" % label)
        return 1
    bounds = [t for t, _ in launches] + [max(r["end"] for r in rows) + 1]
    steps = []
    for a, b in zip(bounds, bounds[1:]):
        recs = [r for r in rows if a <= r["start"] < b]
        if recs:
            steps.append(recs)
    stats = defaultdict(lambda: [0, 0, 0, 0])  # launches, duration ns, critical ns, first start offset
    spans, idles = [], []
    for recs in steps:
        share, idle = critical(recs)
        t0 = recs[0]["start"]
        spans.append(max(r["end"] for r in recs) - t0)
        idles.append(idle)
        for i, r in enumerate(recs):
            s = stats[r["key"]]
            s[0] += 1
            s[1] += r["end"] - r["start"]
            s[2] += share.get(i, 0)
    n = len(steps)
    period = ""
    if n > 1:
        period = ", from one replay's start to the next %.1f us" % ((bounds[n - 1] - bounds[0]) / (n - 1) / 1e3)
    print("## %s: %d steps, span %.1f us a step, no record running %.1f us%s" %
          (label, n, sum(spans) / n / 1e3, sum(idles) / n / 1e3, period))
    print()
    print("| kernel [grid] | launches a step | us a step (durations) | us a step (critical path) | us a launch |")
    print("|---|---|---|---|---|")
    for key, s in sorted(stats.items(), key=lambda kv: -kv[1][2]):
        print("| %s | %g | %.1f | %.1f | %.2f |" % (key.replace("|", "\\|"), s[0] / n, s[1] / n / 1e3, s[2] / n / 1e3,
                                                  s[1] / s[0] / 1e3))
    print()
    recs = steps[-1]
    t0 = recs[0]["start"]
    share, _ = critical(recs)
    nrec = int(sys.argv[3]) if len(sys.argv) > 3 else 40
    print("Sequence of the last step (first %d records): start and end from the step's first record, us" % nrec)
    print()
    print("| # | record | start | end | duration | critical |")
    print("|---|---|---|---|---|---|")
    for i, r in enumerate(recs[:nrec]):
        print("| %d | %s | %.2f | %.2f | %.2f | %.2f |" % (i, r["key"].replace("|", "\\|"), (r["start"] - t0) / 1e3,
                                                        (r["end"] - t0) / 1e3, (r["end"] - r["start"]) / 1e3,
                                                        share.get(i, 0) / 1e3))
    return 0


if __name__ == "__main__":
    sys.exit(main())
