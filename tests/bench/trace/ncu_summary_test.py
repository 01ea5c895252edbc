#!/usr/bin/env python3
"""Tests of ncu_summary.py on CSVs written here from launches drawn at random: every launch and metric read
back, the sums per kernel against a direct count, ncu's own lines before the header skipped, bad rows left out."""
import csv
import io
import os
import random
import re
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ncu_summary  # noqa: E402

HDR = ["ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream", "Block Size",
       "Grid Size", "Device", "CC", "Section Name", "Metric Name", "Metric Unit", "Metric Value"]


def write(launch_list, junk=True):
    """launch_list: [(name, time ns, read bytes, write bytes)] as ncu --csv --print-units base writes them,
    one row a metric, values with thousands separators."""
    buf = io.StringIO()
    if junk:
        buf.write("==PROF== Connected to process 123\n==PROF== Profiling \"k\": 0%....100%\n")
    w = csv.writer(buf, quoting=csv.QUOTE_ALL)
    w.writerow(HDR)
    for i, (name, t, rd, wr) in enumerate(launch_list):
        for metric, unit, v in ((ncu_summary.READ, "byte", rd), (ncu_summary.WRITE, "byte", wr),
                                (ncu_summary.TIME, "nsecond", t)):
            w.writerow([str(i), "1", "bench", "h", name, "1", "13", "(128, 1, 1)", "(8, 1, 1)", "0", "9.0",
                        "Command line profiler metrics", metric, unit, "{:,}".format(v)])
    buf.seek(0)
    return buf


class SummaryTest(unittest.TestCase):
    def test_random_launches(self):
        rng = random.Random()
        names = ["kernel_%d<%s>(args)" % (i, "x" * rng.randrange(0, 80)) for i in range(rng.randrange(2, 9))]
        ls = [(rng.choice(names), rng.randrange(1000, 10 ** 6), rng.randrange(0, 10 ** 9), rng.randrange(0, 10 ** 9))
              for _ in range(rng.randrange(20, 200))]
        lc = ncu_summary.launches(write(ls))
        self.assertEqual(len(lc), len(ls))
        agg = ncu_summary.summarize(lc)
        for name in set(n for n, *_ in ls):
            mine = [x for x in ls if x[0] == name]
            a = agg[name[:60]]
            self.assertEqual(a[0], len(mine))
            self.assertAlmostEqual(a[1], sum(x[1] for x in mine) * 1e-9, places=12)
            self.assertEqual(a[2], sum(x[2] for x in mine))
            self.assertEqual(a[3], sum(x[3] for x in mine))
        steps = rng.choice([1, 2, 4])
        text = ncu_summary.report(agg, len(lc), steps)
        total_ms = sum(x[1] for x in ls) * 1e-6 / steps
        # the report's figure is the rounded sum of floats: within half its last digit (and a little
        # float error) of the exact sum, not necessarily the same rounding as %.3f of it
        m = re.search(r"summed ([0-9.]+) ms a step", text.splitlines()[0])
        self.assertIsNotNone(m, text)
        self.assertLessEqual(abs(float(m.group(1)) - total_ms), 0.0005 + 1e-9, text)
        self.assertEqual(len(text.splitlines()), 2 + len(agg))

    def test_no_header_and_bad_rows(self):
        self.assertEqual(ncu_summary.launches(io.StringIO("==PROF== nothing profiled\n")), {})
        buf = write([("k", 5000, 10, 20)], junk=False)
        text = buf.getvalue() + '"1","1"\n' + ",".join('"%s"' % x for x in
                                                         ["2", "1", "b", "h", "k", "1", "13", "", "", "0", "9.0", "s",
                                                          ncu_summary.TIME, "nsecond", "n/a"]) + "\n"
        lc = ncu_summary.launches(io.StringIO(text))
        self.assertEqual(sorted(lc), ["0", "2"])  # the short row left out; the launch with no number kept, empty
        self.assertEqual(lc["2"][1], {})
        self.assertEqual(ncu_summary.summarize(lc)["k"][0], 2)


if __name__ == "__main__":
    unittest.main()
