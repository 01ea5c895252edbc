"""Per-kernel summary of an ncu CSV (ncu --csv --print-units base --metrics gpu__time_duration.sum,
dram__bytes_read.sum,dram__bytes_write.sum ...): launches, time, DRAM bytes and rate per kind of kernel,
divided by the number of profiled steps.  Usage: python3 ncu_summary.py NCU.csv [STEPS (default 2)]"""
import csv, sys, collections
# ncu --csv --print-units base output: one row per (kernel launch, metric)
rows = list(csv.reader(open(sys.argv[1])))
hdr = None
for i, r in enumerate(rows):
    if r and r[0] == "ID":
        hdr = r; start = i + 1; break
if hdr is None:
    print("no csv header"); sys.exit(0)
ix = {k: hdr.index(k) for k in ("ID", "Kernel Name", "Metric Name", "Metric Value")}
per = collections.defaultdict(dict)
name = {}
for r in rows[start:]:
    if len(r) < len(hdr): continue
    i = r[ix["ID"]]; name[i] = r[ix["Kernel Name"]]
    try: per[i][r[ix["Metric Name"]]] = float(r[ix["Metric Value"]].replace(",", ""))
    except ValueError: pass
steps = float(sys.argv[2]) if len(sys.argv) > 2 else 2.0
agg = collections.defaultdict(lambda: [0, 0.0, 0.0, 0.0])
for i, m in per.items():
    n = name[i][:60]
    a = agg[n]; a[0] += 1; a[1] += m.get("gpu__time_duration.sum", 0) * 1e-9
    a[2] += m.get("dram__bytes_read.sum", 0); a[3] += m.get("dram__bytes_write.sum", 0)
tt = sum(a[1] for a in agg.values()) / steps
rd = sum(a[2] for a in agg.values()) / steps; wr = sum(a[3] for a in agg.values()) / steps
print("%d kernels a step, summed %.3f ms a step, DRAM read %.2f GB, written %.2f GB"
      % (len(per) / steps, tt * 1e3, rd / 1e9, wr / 1e9))
print("  %-60s %6s %9s %9s %9s %8s %8s" % ("kernel", "a step", "ms", "us each", "read MB", "wr MB", "GB/s"))
for n, a in sorted(agg.items(), key=lambda x: -x[1][1]):
    print("  %-60s %6.0f %9.3f %9.2f %9.0f %8.0f %8.0f" % (n, a[0] / steps, a[1] / steps * 1e3, a[1] / a[0] * 1e6,
          a[2] / steps / 1e6, a[3] / steps / 1e6, (a[2] + a[3]) / a[1] / 1e9 if a[1] else 0))
