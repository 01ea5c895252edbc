#!/usr/bin/env python3
"""Which kernels two builds compile alike: the .entry functions of two PTX files (nvcc -ptx of the same source
from two trees) compared after dropping what does not change the code (line records, comments, the anonymous
namespace's per-file hash in mangled names and the per-path hash in the names of internal-linkage statics, such as a
function's static shared array). ptxas turns equal PTX into equal SASS, so a kernel listed SAME runs
the same code in both builds (an A/B need not time it again).
Usage: python3 ptx_same.py A.ptx B.ptx [REGEX]   (REGEX: only entries whose mangled name matches; prints
SAME / DIFF / ONLY-A / ONLY-B and the name, then the counts)"""
import re
import sys

_ANON = re.compile(r"_GLOBAL__N__[0-9a-fA-F]+_")
_INTERNAL = re.compile(r"_INTERNAL_[0-9a-fA-F]+_")  # nvcc's names of internal-linkage statics: a hash of the path
_ENTRY = re.compile(r"^\s*(?:\.visible\s+|\.weak\s+)?\.entry\s+([A-Za-z0-9_$]+)\s*\(", re.M)


def entries(text):
    """{name: body} of the PTX's kernels, with line records (.loc, .file), comments and blank lines dropped and
    anonymous-namespace hashes made alike (in names and bodies)."""
    text = _INTERNAL.sub("_INTERNAL_", _ANON.sub("_GLOBAL__N__", text))
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    out = {}
    starts = list(_ENTRY.finditer(text))
    for i, m in enumerate(starts):
        end = starts[i + 1].start() if i + 1 < len(starts) else len(text)
        lines = []
        for line in text[m.start():end].splitlines():
            s = line.split("//", 1)[0].strip()
            if s and not s.startswith((".loc", ".file")):
                lines.append(s)
        out[m.group(1)] = "\n".join(lines)
    return out


def compare(a_text, b_text, pattern=None):
    """[(verdict, name)] in name order: SAME, DIFF, ONLY-A or ONLY-B."""
    a, b = entries(a_text), entries(b_text)
    rx = re.compile(pattern) if pattern else None
    rows = []
    for name in sorted(set(a) | set(b)):
        if rx and not rx.search(name):
            continue
        if name not in b:
            rows.append(("ONLY-A", name))
        elif name not in a:
            rows.append(("ONLY-B", name))
        else:
            rows.append(("SAME" if a[name] == b[name] else "DIFF", name))
    return rows


def main(argv):
    if len(argv) not in (3, 4):
        print(__doc__.strip().splitlines()[-2], file=sys.stderr)
        return 2
    try:
        with open(argv[1]) as fa, open(argv[2]) as fb:
            rows = compare(fa.read(), fb.read(), argv[3] if len(argv) == 4 else None)
    except (OSError, re.error) as e:
        print(f"ptx_same: {e}", file=sys.stderr)
        return 2
    counts = {}
    for verdict, name in rows:
        print(f"{verdict:6} {name}")
        counts[verdict] = counts.get(verdict, 0) + 1
    print(" ".join(f"{k} {counts[k]}" for k in sorted(counts)) or "no entries")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
