#!/usr/bin/env python3
"""Tests of sass_summary.py on source-page CSVs written here from instructions drawn at random: the warps taken
from the first instruction, the counts a warp by opcode (predicated instructions under their opcode) against a
direct count, several kernels in one CSV, short rows and counts that are not numbers left out."""
import csv
import io
import os
import random
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sass_summary  # noqa: E402

HDR = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Warp Stall Sampling (Not-issued Samples)",
       "# Samples", "Instructions Executed", "Thread Instructions Executed"]
OPS = ["FFMA", "IMAD.WIDE.U32", "LDG.E.128", "MUFU.EX2", "BRA", "SHFL.BFLY", "ISETP.GE.AND", "BSYNC", "EXIT"]


def draw(rng, warps):
    """[(source, executed, stall samples)] of one launch: the first instruction run by every warp."""
    insts = [("LDC R1, c[0x0][0x28]", warps, rng.randrange(0, 50))]
    for _ in range(rng.randrange(5, 60)):
        op = rng.choice(OPS)
        pred = rng.choice(["", "@P0  ", "@!P1  ", "@!PT  ", "@UP0  "])
        n = warps * rng.choice([0, 0.25, 0.5, 1, 2, 3])
        insts.append(("%s%s R%d, R%d" % (pred, op, rng.randrange(99), rng.randrange(99)), n, rng.randrange(0, 40)))
    return insts


def write(kernel_list, junk=True):
    buf = io.StringIO()
    w = csv.writer(buf, quoting=csv.QUOTE_ALL)
    for name, insts in kernel_list:
        w.writerow(["Kernel Name", name, ""])
        w.writerow(HDR)
        for i, (src, n, s) in enumerate(insts):
            w.writerow(["0x%x" % (0x7f0000 + 16 * i), "      " + src, str(s), str(s), str(s),
                        "{:,}".format(int(n)), "{:,}".format(int(32 * n))])
            if junk and i == 2:
                w.writerow(["0xdead", "short row"])
                w.writerow(["0xbeef", "FADD R1, R2", "x", "x", "x", "not a number", "0"])
    buf.seek(0)
    return buf


class SassSummaryTest(unittest.TestCase):
    def test_random_kernels(self):
        rng = random.Random()
        ks = [("kernel_%d<%d>(args)" % (k, rng.randrange(9)), draw(rng, 32 * rng.randrange(1, 4096)))
              for k in range(rng.randrange(1, 4))]
        got = sass_summary.kernels(write(ks))
        self.assertEqual([g[0] for g in got], [k[0] for k in ks])
        for (name, insts), (gname, ginsts) in zip(ks, got):
            self.assertEqual(len(ginsts), len(insts))  # the junk rows left out
            warps, per_warp, ops, stalls = sass_summary.summarize(ginsts)
            self.assertEqual(warps, insts[0][1])
            want = {}
            for src, n, _ in insts:
                op = src.split()[-3] if src.startswith("@") else src.split()[0]
                want[op.split(".")[0]] = want.get(op.split(".")[0], 0.0) + int(n) / warps
            self.assertEqual(set(ops), set(want))
            for op, v in want.items():
                self.assertAlmostEqual(ops[op][0], v, places=9)
            self.assertAlmostEqual(per_warp, sum(int(n) for _, n, _ in insts) / warps, places=9)
            self.assertEqual(stalls, sum(s for _, _, s in insts))

    def test_main_prints_each_kernel(self):
        rng = random.Random()
        ks = [("k%d" % i, draw(rng, 64)) for i in range(2)]
        path = os.path.join(os.environ.get("TEST_TMPDIR", "/tmp"), "sass_%d.csv" % os.getpid())
        with open(path, "w", newline="") as f:
            f.write(write(ks).getvalue())
        out = io.StringIO()
        old, sys.stdout = sys.stdout, out
        try:
            rc = sass_summary.main(["sass_summary.py", path, "--list"])
        finally:
            sys.stdout = old
            os.remove(path)
        self.assertEqual(rc, 0)
        text = out.getvalue()
        for name, insts in ks:
            self.assertIn("== %s: 64 warps" % name, text)
        self.assertEqual(sum(1 for l in text.splitlines() if l.startswith("==")), 2)

    def test_no_counts(self):
        """a source page without the counters' columns: the kernel named, no rows, a line that says so"""
        buf = io.StringIO()
        w = csv.writer(buf, quoting=csv.QUOTE_ALL)
        w.writerow(["Kernel Name", "k0", ""])
        w.writerow(["Address", "Source"])
        w.writerow(["0x10", "FFMA R1, R2, R3, R4"])
        got = sass_summary.kernels(io.StringIO(buf.getvalue()))
        self.assertEqual(got, [("k0", [])])
        path = os.path.join(os.environ.get("TEST_TMPDIR", "/tmp"), "sass_nc_%d.csv" % os.getpid())
        with open(path, "w", newline="") as f:
            f.write(buf.getvalue())
        out = io.StringIO()
        old, sys.stdout = sys.stdout, out
        try:
            sass_summary.main(["sass_summary.py", path])
        finally:
            sys.stdout = old
            os.remove(path)
        self.assertIn("k0: no SASS rows", out.getvalue())

    def test_empty(self):
        self.assertEqual(sass_summary.kernels(io.StringIO("==PROF== nothing\n")), [])


if __name__ == "__main__":
    unittest.main()
