#!/usr/bin/env python3
"""Tests of trace_steps.py on traces drawn at random: the critical-path shares against a direct
count over every nanosecond, the steps split at each graph replay, the names shortened."""
import contextlib
import io
import os
import random
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import trace_steps  # noqa: E402


def brute(recs):
    """Every nanosecond's owner (the oldest record running, ties by index) and the idle count."""
    t0, t1 = min(r["start"] for r in recs), max(r["end"] for r in recs)
    share, idle = [0] * len(recs), 0
    for t in range(t0, t1):
        running = [i for i, r in enumerate(recs) if r["start"] <= t < r["end"]]
        if running:
            share[min(running, key=lambda i: (recs[i]["start"], i))] += 1
        else:
            idle += 1
    return share, idle


class CriticalTest(unittest.TestCase):
    def test_random_overlaps(self):
        rng = random.Random(os.urandom(8))
        for _ in range(200):
            recs, t = [], 0
            for _ in range(rng.randint(1, 8)):
                t += rng.randint(0, 30)
                recs.append({"start": t, "end": t + rng.randint(1, 40)})
            share, idle = trace_steps.critical(recs)
            want, want_idle = brute(recs)
            self.assertEqual([share.get(i, 0) for i in range(len(recs))], want, recs)
            self.assertEqual(idle, want_idle, recs)
            span = max(r["end"] for r in recs) - min(r["start"] for r in recs)
            self.assertEqual(sum(want) + idle, span)

    def test_short_names(self):
        self.assertEqual(trace_steps.short("void (anonymous namespace)::k<1, 2>(int, float*)"), "k<1, 2>")
        self.assertEqual(trace_steps.short("nvjet_sm90_tss_64x32"), "nvjet_sm90_tss_64x32")
        self.assertEqual(trace_steps.short("(anonymous namespace)::prep(int)"), "prep")


class StepsTest(unittest.TestCase):
    def test_two_replays(self):
        lines = ["kind,start_ns,end_ns,stream,graph,graph_node,correlation,grid_or_bytes,block,smem,regs,name",
                 "mark,0,0,0,0,0,0,0,0,0,0,start"]
        # two replays (correlation 5 and 9) of a copy and two kernels overlapping by 1 us, then a copy back
        for corr, base in ((5, 1000), (9, 21000)):
            lines.append("memcpy,%d,%d,7,3,1,%d,512,0,0,0,copy kind 1" % (base, base + 1000, corr))
            lines.append("kernel,%d,%d,7,3,2,%d,132,256,0,32,kernel_a" % (base + 2000, base + 6000, corr))
            lines.append("kernel,%d,%d,7,3,3,%d,64,256,0,32,kernel_b" % (base + 5000, base + 9000, corr))
            lines.append("memcpy,%d,%d,7,0,0,%d,16,0,0,0,copy kind 2" % (base + 9500, base + 10000, corr + 1))
        lines.append("mark,40000,40000,0,0,0,0,0,0,0,0,stop")
        with tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False) as f:
            f.write("\n".join(lines) + "\n")
            path = f.name
        try:
            out = io.StringIO()
            sys.argv = ["trace_steps.py", path, "test", "10"]
            with contextlib.redirect_stdout(out):
                rc = trace_steps.main()
        finally:
            os.unlink(path)
        text = out.getvalue()
        self.assertEqual(rc, 0)
        # span 10 us a step, idle 1.0 + 0.5 us, replays 20 us apart
        self.assertIn("## test: 2 steps, span 10.0 us a step, no record running 1.5 us, from one replay's start to "
                      "the next 20.0 us", text)
        self.assertIn("| kernel_a [132] | 1 | 4.0 | 4.0 | 4.00 |", text)   # the older kernel keeps the overlap
        self.assertIn("| kernel_b [64] | 1 | 4.0 | 3.0 | 4.00 |", text)
        self.assertIn("| copy kind 2 | 1 | 0.5 | 0.5 | 0.50 |", text)


if __name__ == "__main__":
    unittest.main()
