#!/usr/bin/env python3
"""The NCCL state handoff on two GPUs (needs no package beyond the standard library: it
drives `kdecode serve` and `kdctl`). Run by tests/nccl/run_device.sh:

  device_test.py --bin DIR --out DIR [--requests N] [--bench N] [--floor-json FILE]

1. Equality: a decode worker on GPU 1, prefill workers on GPU 0 (one with
   --handoff-transport nccl, one with grpc). For randomized requests (prompt lengths,
   max_tokens, speculation on/off), the greedy tokens through prefill -> NCCL -> decode must
   equal those through the gRPC transport and aggregated Generate on the decode worker; every
   NCCL Prefill must report the NCCL transport, and the decode worker must end idle.
2. Faults: a prefill worker killed (-9) halfway through its sends (--debug-handoff-delay-ms)
   leaves no reserved slot and no pending handoff, and the decode worker serves on (through
   the surviving prefill worker's link too); a decode worker restarted under a prefill
   worker's live link (the stale link is refused, the prefill worker connects anew).
3. Benchmark on the kimi-linear-48b-state model (42.8 MiB of state): PrefillResponse's
   handoff_seconds and transfer_seconds over NCCL and over gRPC, against cudaMemcpyPeer of the
   same bytes measured by peer_bench in the same run. With --busy, one request decodes on the
   decode worker throughout (handoffs arrive mid-step); --decode-args adds flags to its decode
   worker (e.g. "--handoff-ready-slots 0").
Writes nccl_h200.json (+ logs) under --out; exits non-zero when a check fails."""
import argparse
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import time

ARGS = None
FAILS = []
LOGS = None


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        FAILS.append(what)
    return ok


class Server:
    n = 0

    def __init__(self, name, model, gpu_order, args, extra_env=None):
        Server.n += 1
        self.name = f"{name}-{Server.n}"
        self.log = os.path.join(LOGS, f"{self.name}.log")
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=gpu_order, NCCL_NVLS_ENABLE="0", **(extra_env or {}))
        cmd = [os.path.join(ARGS.bin, "kdecode"), "serve", "--model", model, "--listen", "127.0.0.1:0",
               "--backend", "cuda", "--activations", "fp32", "--metrics-listen", "127.0.0.1:0", *args]
        self.f = open(self.log, "wb")
        self.p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.f, env=env)
        line = self.p.stdout.readline().decode()
        m = re.search(r'"port":(\d+)', line)
        if not m:
            raise RuntimeError(f"{self.name}: no port: {line!r}\n{self.tail()}")
        self.target = f"127.0.0.1:{m.group(1)}"
        deadline = time.monotonic() + 180
        while "ready" not in self.text():
            if self.p.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} did not get ready\n{self.tail()}")
            time.sleep(0.1)

    def text(self):
        with open(self.log, "rb") as f:
            return f.read().decode(errors="replace")

    def tail(self, n=30):
        return "\n".join(self.text().splitlines()[-n:])

    def metrics(self):
        m = re.search(r"metrics listening on \S+ \(port (\d+)\)", self.text())
        import urllib.request
        with urllib.request.urlopen(f"http://127.0.0.1:{m.group(1)}/metrics", timeout=10) as r:
            out = {}
            for line in r.read().decode().splitlines():
                if line and not line.startswith("#"):
                    k, v = line.rsplit(" ", 1)
                    out[k] = float(v)
            return out

    def kill(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGKILL)
            self.p.wait()

    def stop(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                return self.p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.kill()
                return -9
        return self.p.returncode


def kdctl(*args, timeout=120):
    out = subprocess.run([os.path.join(ARGS.bin, "kdctl"), *map(str, args)], capture_output=True, timeout=timeout)
    return out.returncode, out.stdout.decode(), out.stderr.decode()


def gen(target, prompt, max_tokens, spec, prefill=None, stats=False):
    a = ["generate", "--target", target, "--timeout", 60, "--prompt-ids", ",".join(map(str, prompt)), "--max-tokens", max_tokens,
         "--ignore-eos", "--json", *(["--spec-tokens", spec] if spec else ["--draft", "none"])]
    if prefill:
        a += ["--prefill", prefill, "--decode", target]
    if stats:
        a += ["--handoff-stats"]
    rc, out, err = kdctl(*a)
    if rc != 0:
        return None, f"rc {rc}: {err.strip()}"
    return json.loads(out), ""


def loads(target):
    rc, out, err = kdctl("loads", "--target", target, "--json")
    return json.loads(out) if rc == 0 else {"error": err}


def wait_idle(target, what, timeout=60):
    deadline = time.monotonic() + timeout
    while True:
        ld = loads(target)
        if ld.get("slotsUsed", ld.get("slots_used", 0)) == 0 and ld.get("handoffsPending",
                                                                         ld.get("handoffs_pending", 0)) == 0:
            return check(True, f"{what}: decode worker idle ({ld})")
        if time.monotonic() > deadline:
            return check(False, f"{what}: decode worker not idle after {timeout} s: {ld}")
        time.sleep(0.2)


def equality(demo):
    D = Server("decode", demo, "1,0", ["--role", "decode", "--handoff-transport", "nccl", "--max-seqs", "4"])
    P = Server("prefill-nccl", demo, "0,1", ["--role", "prefill", "--handoff-transport", "nccl"])
    G = Server("prefill-grpc", demo, "0,1", ["--role", "prefill", "--handoff-transport", "grpc"])
    rng = random.Random(ARGS.seed)
    bad = 0
    n_nccl = 0
    for i in range(ARGS.requests):
        prompt = [rng.randrange(512) for _ in range(rng.randint(1, 48))]
        if rng.random() < 0.3:  # repetitive prompts give the n-gram drafter something to find
            prompt = (prompt[:5] * 10)[:rng.randint(6, 50)]
        mt = rng.randint(1, 24)
        spec = rng.choice([0, 3])
        a, ea = gen(D.target, prompt, mt, spec)
        b, eb = gen(D.target, prompt, mt, spec, prefill=P.target, stats=True)
        c, ec = gen(D.target, prompt, mt, spec, prefill=G.target, stats=True)
        if not (a and b and c):
            bad += 1
            check(False, f"request {i}: a call failed: {ea} | {eb} | {ec}")
            continue
        tr = b.get("prefill", {}).get("transport") if mt > 1 else "HANDOFF_TRANSPORT_NCCL"
        n_nccl += tr == "HANDOFF_TRANSPORT_NCCL"
        same = a["tokens"] == b["tokens"] == c["tokens"]
        if not same or tr != "HANDOFF_TRANSPORT_NCCL":
            bad += 1
            check(False, f"request {i} (prompt {len(prompt)}, max {mt}, s {spec}): aggregated {a['tokens']} "
                         f"nccl {b['tokens']} ({tr}) grpc {c['tokens']}")
    check(bad == 0, f"equality: {ARGS.requests} randomized requests, NCCL == gRPC == aggregated tokens "
                    f"({n_nccl} over NCCL)")
    wait_idle(D.target, "after the equality run")
    m = P.metrics()
    check(m.get("kdecode_handoff_nccl_fallbacks_total", 0) == 0, "no fallback to gRPC on the NCCL prefill worker")
    check(m.get("kdecode_nccl_links", 0) == 1, f"one NCCL link on the prefill worker ({m.get('kdecode_nccl_links')})")

    # faults: a prefill worker killed halfway through its sends
    K = Server("prefill-killed", demo, "0,1", ["--role", "prefill", "--handoff-transport", "nccl",
                                               "--debug-handoff-delay-ms", "4000"])
    prompt = [7, 8, 9, 10, 11]
    expected, _ = gen(D.target, prompt, 6, 0)
    args = ["generate", "--target", D.target, "--prefill", K.target, "--decode", D.target, "--prompt-ids",
            ",".join(map(str, prompt)), "--max-tokens", "6", "--json"]
    bg = subprocess.Popen([os.path.join(ARGS.bin, "kdctl"), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while True:  # the header is in and the receive posted: the first half lands, then a pause
        ld = loads(D.target)
        if ld.get("handoffsPending", ld.get("handoffs_pending", 0)) == 1 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    time.sleep(1.0)
    check(ld.get("handoffsPending", ld.get("handoffs_pending", 0)) == 1, f"a handoff arriving before the kill ({ld})")
    K.kill()
    bg.wait(timeout=60)
    t0 = time.monotonic()
    wait_idle(D.target, "prefill worker killed mid-transfer", timeout=60)
    print(f"     (slot freed {time.monotonic() - t0:.2f} s after the kill)")
    b, eb = gen(D.target, prompt, 6, 0, prefill=P.target, stats=True)
    check(b is not None and expected is not None and b["tokens"] == expected["tokens"],
          f"after the kill: a handoff through the other prefill worker ({eb})")
    a, ea = gen(D.target, [1, 2, 3], 4, 0)
    check(a is not None, f"after the kill: aggregated Generate ({ea})")
    dtext = D.text()
    check("NCCL transfer" in dtext and "handoff-dropped" in dtext, "the decode worker logged the dropped transfer")

    # a refused header (no free slot): Prefill answers RESOURCE_EXHAUSTED at once (the sender
    # aborts the link rather than waiting out its send), and a later handoff makes a new link
    F = Server("decode-full", demo, "1,0", ["--role", "decode", "--handoff-transport", "nccl", "--max-seqs", "1",
                                            "--max-queue", "0"])
    ok1, _ = gen(F.target, [4, 5, 6], 2, 0, prefill=P.target, stats=True)  # the link exists
    long_run = subprocess.Popen([os.path.join(ARGS.bin, "kdctl"), "generate", "--target", F.target, "--prompt-ids",
                                 "9,9,9", "--max-tokens", "6000", "--ignore-eos", "--json", "--draft", "none"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while loads(F.target).get("slots_used", 0) < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    t0 = time.monotonic()
    refused, er = gen(F.target, [4, 5, 6], 4, 0, prefill=P.target, stats=True)
    dt = time.monotonic() - t0
    still = long_run.poll() is None
    check(ok1 is not None and refused is None and "RESOURCE_EXHAUSTED" in er.upper().replace(" ", "_") and dt < 5,
          f"a full decode worker refuses the NCCL header: {er.strip()[:160]} in {dt:.2f} s (long request running: {still})")
    long_run.wait(timeout=120)
    again, ea = gen(F.target, [4, 5, 6], 4, 0, prefill=P.target, stats=True)
    check(again is not None and again.get("prefill", {}).get("transport") == "HANDOFF_TRANSPORT_NCCL",
          f"after the refusal: the next handoff over NCCL on a new link ({ea})")
    wait_idle(F.target, "the 1-slot decode worker")
    F.stop()

    # the decode worker restarts under the prefill worker's live link: refused as unknown, the
    # prefill worker connects anew and the request goes through
    D.stop()
    D2 = Server("decode-restarted", demo, "1,0", ["--role", "decode", "--handoff-transport", "nccl", "--max-seqs", "4",
                                                   "--listen", D.target])
    b, eb = gen(D2.target, prompt, 6, 0, prefill=P.target, stats=True)
    check(b is not None and b["tokens"] == expected["tokens"]
          and b.get("prefill", {}).get("transport") == "HANDOFF_TRANSPORT_NCCL",
          f"after the decode worker's restart: the prefill worker connects anew ({eb} {b and b.get('prefill')})")
    wait_idle(D2.target, "after the restart")
    for s in (P, G, D2):
        check(s.stop() == 0, f"{s.name} stops cleanly on SIGTERM")


def bench(m48, floor, env=None):
    D = Server("decode48", m48, "1,0", ["--role", "decode", "--handoff-transport", "nccl", "--max-seqs", "4",
                                        *(["--max-model-len", "1000000"] if ARGS.busy else []),
                                        *ARGS.decode_args.split()], env)
    P = Server("prefill48-nccl", m48, "0,1", ["--role", "prefill", "--handoff-transport", "nccl"], env)
    G = Server("prefill48-grpc", m48, "0,1", ["--role", "prefill", "--handoff-transport", "grpc"], env)
    prompt = list(range(1, 17))
    res = {}
    busy = None
    if ARGS.busy:  # one request decodes on the decode worker throughout: handoffs arrive mid-step
        busy = subprocess.Popen([os.path.join(ARGS.bin, "kdctl"), "generate", "--target", D.target, "--timeout", "600",
                                 "--prompt-ids", "7,8,9", "--max-tokens", "999000", "--ignore-eos", "--json",
                                 "--draft", "none"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while loads(D.target).get("slots_used", 0) < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)
        res["busy"] = busy.poll() is None
    for name, pw in (("nccl", P), ("grpc", G)):
        hs, xs, e2e = [], [], []
        for i in range(ARGS.bench + 3):
            t0 = time.monotonic()
            r, e = gen(D.target, prompt, 2, 0, prefill=pw.target, stats=True)
            dt = time.monotonic() - t0
            if not r:
                check(False, f"bench {name}: {e}")
                break
            if i >= 3:
                hs.append(r["prefill"]["handoffSeconds" if "handoffSeconds" in r["prefill"] else "handoff_seconds"])
                xs.append(r["prefill"].get("transferSeconds", r["prefill"].get("transfer_seconds", 0)))
                e2e.append(dt)
        if hs:
            res[name] = {"handoff_us_median": statistics.median(hs) * 1e6, "handoff_us_min": min(hs) * 1e6,
                         "transfer_us_median": statistics.median(xs) * 1e6, "transfer_us_min": min(xs) * 1e6,
                         "request_ms_median": statistics.median(e2e) * 1e3, "n": len(hs)}
    # the decode side's own view of each NCCL handoff: header to verified state
    ready = re.findall(r"handoff-ready id=\S+ slot=\d+ bytes=\d+ in ([0-9.]+) s over NCCL \(receive posted at "
                       r"([0-9.]+) s, landed ([0-9.]+) s later \(([-0-9.]+) s on the GPU\), checked ([0-9.]+) s later\)",
                       D.text())
    if ready and "nccl" in res:
        ready = ready[3:] or ready
        for i, k in enumerate(("decode_side", "decode_posted", "decode_landed", "decode_gpu", "decode_checked")):
            res["nccl"][k + "_us_median"] = statistics.median(float(r[i]) for r in ready) * 1e6
    if busy:
        check(busy.poll() is None, "the busy request decoded throughout the benchmark")
        busy.kill()
        busy.wait()
    wait_idle(D.target, "after the benchmark")
    for s in (P, G, D):
        s.stop()
    res["floor"] = floor
    return res


def main():
    global ARGS, LOGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--bench", type=int, default=20)
    ap.add_argument("--seed", type=int, default=int(time.time()))
    ap.add_argument("--floor-json")
    ap.add_argument("--bench-only", action="store_true", help="the benchmark alone")
    ap.add_argument("--env", action="append", default=[], help="K=V for the benchmark's servers (NCCL tuning)")
    ap.add_argument("--tag", default="nccl_device", help="name of the result files")
    ap.add_argument("--busy", action="store_true", help="the benchmark with one request decoding on the decode worker")
    ap.add_argument("--decode-args", default="", help="more flags for the benchmark's decode worker")
    ARGS = ap.parse_args()
    LOGS = os.path.join(ARGS.out, "logs")
    os.makedirs(LOGS, exist_ok=True)
    print(f"seed {ARGS.seed}", flush=True)
    kd = os.path.join(ARGS.bin, "kdecode")
    demo, m48 = "/tmp/kd-demo", "/tmp/kd-48b-state"
    subprocess.run([kd, "mkmodel", "--preset", "demo", "--seed", "1", "--out", demo], check=True, capture_output=True)
    subprocess.run([kd, "mkmodel", "--preset", "kimi-linear-48b-state", "--seed", "1", "--out", m48], check=True,
                   capture_output=True)
    floor = json.load(open(ARGS.floor_json)) if ARGS.floor_json else {}
    if not ARGS.bench_only:
        try:
            equality(demo)
        except Exception as e:  # a server that did not start: the rest still runs
            check(False, f"equality/faults: {e}")
    res = {}
    env = dict(kv.split("=", 1) for kv in ARGS.env)
    try:
        res = bench(m48, floor, env)
    except Exception as e:
        check(False, f"bench: {e}")
    res["env"] = env
    res["decode_args"] = ARGS.decode_args
    res["fails"] = FAILS
    res["requests"] = ARGS.requests
    res["seed"] = ARGS.seed
    with open(os.path.join(ARGS.out, ARGS.tag + ".json"), "w") as f:
        json.dump(res, f, indent=1)
    n = res.get("nccl", {})
    g = res.get("grpc", {})
    pu = floor.get("memcpy_peer_us")
    lines = ["| measurement (42.8 MiB state) | median us |", "|---|---|"]
    if pu:
        lines.append(f"| cudaMemcpyPeer GPU0->GPU1 (the floor) | {pu:.1f} |")
        lines.append(f"| NCCL in one process, one send of all bytes | {floor.get('nccl_inproc_one_us', 0):.1f} |")
        lines.append(f"| NCCL in one process, one send per section | {floor.get('nccl_inproc_sections_us', 0):.1f} |")
        if floor.get("nccl_inproc_registered_us", -1) > 0:
            lines.append(f"| NCCL in one process, buffers registered (ncclCommRegister) | "
                         f"{floor['nccl_inproc_registered_us']:.1f} |")
        if "sum64_sections_kept_us" in floor:
            lines.append(f"| sum64 of the 40 sections on GPU 1, work space kept / allocated per call | "
                         f"{floor['sum64_sections_kept_us']:.1f} / {floor['sum64_sections_alloc_us']:.1f} |")
    for k, v in (("NCCL transfer (send to completion)", n.get("transfer_us_median")),
                 ("NCCL handoff (Prefill's handoff_seconds)", n.get("handoff_us_median")),
                 ("decode side: header to verified state", n.get("decode_side_us_median")),
                 ("decode side: header to receive posted", n.get("decode_posted_us_median")),
                 ("decode side: receive posted to data landed", n.get("decode_landed_us_median")),
                 ("decode side: the receive on the GPU (CUDA events around ncclRecv)", n.get("decode_gpu_us_median")),
                 ("decode side: landed to checksums checked", n.get("decode_checked_us_median")),
                 ("gRPC handoff", g.get("handoff_us_median"))):
        if v:
            lines.append(f"| {k} | {v:.1f} |")
    if pu and n.get("handoff_us_median"):
        landed = n.get("decode_landed_us_median") or n["transfer_us_median"]
        lines.append("")
        lines.append(f"ratio cudaMemcpyPeer / NCCL data (receive posted to landed): {pu / landed:.2f}; "
                     f"/ whole handoff (handoff_seconds): {pu / n['handoff_us_median']:.2f} (target >= 0.80)")
        res["ratio_data"], res["ratio_handoff"] = pu / landed, pu / n["handoff_us_median"]
        if n.get("decode_gpu_us_median", -1) > 0:
            lines.append(f"ratio cudaMemcpyPeer / the receive's GPU time: {pu / n['decode_gpu_us_median']:.2f}")
            res["ratio_gpu"] = pu / n["decode_gpu_us_median"]
    with open(os.path.join(ARGS.out, ARGS.tag + ".json"), "w") as f:
        json.dump(res, f, indent=1)
    with open(os.path.join(ARGS.out, ARGS.tag + ".md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n" + "\n".join(lines))
    print(f"\n{len(FAILS)} failed checks")
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
