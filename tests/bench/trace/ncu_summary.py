#!/usr/bin/env python3
"""Per-kernel summary of an ncu CSV (ncu --csv --print-units base --metrics gpu__time_duration.sum,
dram__bytes_read.sum,dram__bytes_write.sum ...): launches, time, DRAM bytes and rate per kind of kernel,
divided by the number of profiled steps.  Usage: python3 ncu_summary.py NCU.csv [STEPS (default 2)]"""
import collections
import csv
import sys

TIME, READ, WRITE = "gpu__time_duration.sum", "dram__bytes_read.sum", "dram__bytes_write.sum"


def launches(lines):
    """The CSV's launches: {ID: (kernel name, {metric: value})}, from the row that starts with "ID" on
    (ncu prints its own lines before it); rows shorter than the header and values that are not numbers
    are left out."""
    rows = list(csv.reader(lines))
    start = next((i for i, r in enumerate(rows) if r and r[0] == "ID"), None)
    if start is None:
        return {}
    hdr = rows[start]
    ix = {k: hdr.index(k) for k in ("ID", "Kernel Name", "Metric Name", "Metric Value")}
    out = {}
    for r in rows[start + 1:]:
        if len(r) < len(hdr):
            continue
        name, metrics = out.setdefault(r[ix["ID"]], (r[ix["Kernel Name"]], {}))
        try:
            metrics[r[ix["Metric Name"]]] = float(r[ix["Metric Value"]].replace(",", ""))
        except ValueError:
            pass
    return out


def summarize(lc):
    """Per kernel name (its first 60 characters): [launches, seconds, bytes read, bytes written]."""
    agg = collections.defaultdict(lambda: [0, 0.0, 0.0, 0.0])
    for name, m in lc.values():
        a = agg[name[:60]]
        a[0] += 1
        a[1] += m.get(TIME, 0) * 1e-9
        a[2] += m.get(READ, 0)
        a[3] += m.get(WRITE, 0)
    return dict(agg)


def report(agg, n_launches, steps):
    tt = sum(a[1] for a in agg.values()) / steps
    rd = sum(a[2] for a in agg.values()) / steps
    wr = sum(a[3] for a in agg.values()) / steps
    out = ["%d kernels a step, summed %.3f ms a step, DRAM read %.2f GB, written %.2f GB"
           % (n_launches / steps, tt * 1e3, rd / 1e9, wr / 1e9),
           "  %-60s %6s %9s %9s %9s %8s %8s" % ("kernel", "a step", "ms", "us each", "read MB", "wr MB", "GB/s")]
    for n, a in sorted(agg.items(), key=lambda x: -x[1][1]):
        out.append("  %-60s %6.0f %9.3f %9.2f %9.0f %8.0f %8.0f"
                   % (n, a[0] / steps, a[1] / steps * 1e3, a[1] / a[0] * 1e6, a[2] / steps / 1e6,
                      a[3] / steps / 1e6, (a[2] + a[3]) / a[1] / 1e9 if a[1] else 0))
    return "\n".join(out)


def main(argv):
    if len(argv) < 2:
        print(__doc__)
        return 2
    with open(argv[1], newline="") as f:
        lc = launches(f)
    if not lc:
        print("no csv header")
        return 1
    print(report(summarize(lc), len(lc), float(argv[2]) if len(argv) > 2 else 2.0))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
