#!/usr/bin/env python3
"""Per-warp instruction counts of the SASS ncu executed (ncu -i REPORT --page source --print-source sass --csv,
from a report taken with --section SourceCounters): for each kernel in the CSV, the instructions a warp executed,
then by opcode (with its share of the warp stall samples), and with --list every instruction executed (its index
in the SASS, times a warp, share of the stall samples, the instruction). A launch's warps are the count of its
first instruction (every warp runs it once). Usage: python3 sass_summary.py SASS.csv [--list]"""
import collections
import csv
import re
import sys

COUNT, STALL, SOURCE = "Instructions Executed", "Warp Stall Sampling (All Samples)", "Source"
OPCODE = re.compile(r"(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)")


def kernels(lines):
    """The CSV's kernels: [(name, [(instruction, executed, stall samples)])], a kernel from each "Kernel Name"
    row to the next; rows shorter than their header and counts that are not numbers are left out."""
    out = []
    rows = list(csv.reader(lines))
    i = 0
    while i < len(rows):
        r = rows[i]
        if r and r[0] == "Kernel Name" and i + 1 < len(rows):
            name, hdr = (r[1] if len(r) > 1 else ""), rows[i + 1]
            insts = []
            ix = {k: hdr.index(k) for k in (COUNT, STALL, SOURCE) if k in hdr}
            i += 2
            while i < len(rows) and not (rows[i] and rows[i][0] == "Kernel Name"):
                row = rows[i]
                i += 1
                if len(ix) < 3 or len(row) < len(hdr):
                    continue
                try:
                    n = float(row[ix[COUNT]].replace(",", "") or 0)
                    s = float(row[ix[STALL]].replace(",", "") or 0)
                except ValueError:
                    continue
                insts.append((row[ix[SOURCE]].strip(), n, s))
            out.append((name, insts))
        else:
            i += 1
    return out


def summarize(insts):
    """(warps, instructions a warp, {opcode: [a warp, stall samples]}, stall samples in all)."""
    warps = insts[0][1] if insts and insts[0][1] > 0 else 1.0
    ops = collections.defaultdict(lambda: [0.0, 0.0])
    total = stalls = 0.0
    for src, n, s in insts:
        m = OPCODE.match(src)
        op = m.group(1) if m else src
        ops[op][0] += n / warps
        ops[op][1] += s
        total += n
        stalls += s
    return warps, total / warps, dict(ops), stalls


def main(argv):
    if len(argv) < 2:
        print(__doc__)
        return 2
    with open(argv[1], newline="") as f:
        ks = kernels(f)
    for name, insts in ks:
        if not insts:
            print("== %s: no SASS rows with instruction counts (a report taken without --section SourceCounters?)"
                  % name)
            continue
        warps, per_warp, ops, stalls = summarize(insts)
        print("== %s: %d warps, %.0f instructions a warp" % (name, warps, per_warp))
        top = sorted(ops.items(), key=lambda kv: -kv[1][0])
        print(", ".join("%s %.0f (%.0f%% st)" % (op, c, 100 * s / max(stalls, 1)) for op, (c, s) in top))
        if "--list" in argv:
            for i, (src, n, s) in enumerate(insts):
                if n > 0:
                    print("%5d %7.2f %5.1f%% %s" % (i, n / warps, 100 * s / max(stalls, 1), src))
    return 0 if ks else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
