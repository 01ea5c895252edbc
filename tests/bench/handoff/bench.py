#!/usr/bin/python3
"""bench.py: the prefill -> decode state handoff on loopback, against the raw TCP floor.

Run through `bazel run //tests/bench/handoff:bench` (bench.sh passes the paths). Starts one
prefill worker and one decode worker (`kdecode serve --role prefill|decode`, CPU backend) on
the kimi-linear-48b-state model (made here by `kdecode mkmodel`: the recurrent state of
Kimi-Linear-48B's KDA layers, 20 x 32 heads x 128 x 128 fp32 + conv windows = 42.8 MiB per
request, on a narrow model), then, one request at a time:

  Prefill(prompt, decode_target)      -> PrefillResponse.handoff_seconds / handoff_bytes
                                         (prefill side: the stream (header, chunks hashed as
                                         they go, trailer with the checksums) + the decode
                                         worker's write and checksums of the slot bytes + its
                                         acknowledgement), the call's own time (end to end),
                                         prefill_seconds
  Generate(handoff_id, max_tokens=1)  -> time from Prefill's return to the first message
  tcp_floor BYTES 1                   -> the same bytes over a fresh 127.0.0.1 TCP
                                         connection between two processes, acknowledged

interleaved, so that both see the same machine load. Ratio: TCP floor time / handoff time
(= handoff throughput / TCP throughput), median over the requests; target >= 60 %.
Writes OUT.json and OUT.md and prints the markdown.
"""
import argparse
import datetime
import json
import os
import random
import re
import select
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

TARGET = 0.60


def parse_args():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kdecode", required=True)
    ap.add_argument("--floor", required=True)
    ap.add_argument("--proto", required=True)
    ap.add_argument("--out", required=True, help="results path without extension")
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--command", default="bazel run //tests/bench/handoff:bench")
    ap.add_argument("--requests", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--busy", action="store_true",
                    help="keep the decode worker stepping: a long Generate runs on it during the handoffs")
    ap.add_argument("--decode-args", default="", help="extra flags for the decode worker (space-separated)")
    return ap.parse_args()


ARGS = parse_args()
TMP = tempfile.mkdtemp(prefix="handoff_bench.")
os.makedirs(os.path.join(TMP, "proto/kdecode/v1"))
os.makedirs(os.path.join(TMP, "pb"))
shutil.copy(ARGS.proto, os.path.join(TMP, "proto/kdecode/v1/decoder.proto"))
subprocess.run(["/usr/bin/protoc", f"--proto_path={TMP}/proto", f"--python_out={TMP}/pb", "kdecode/v1/decoder.proto"],
               check=True)
sys.path.insert(0, os.path.join(TMP, "pb"))

import grpc  # noqa: E402

from kdecode.v1 import decoder_pb2 as pb  # noqa: E402


class Worker:
    def __init__(self, name, model, args):
        self.log = open(os.path.join(TMP, f"{name}.log"), "wb")
        self.proc = subprocess.Popen([ARGS.kdecode, "serve", "--model", model, "--listen", "127.0.0.1:0", *args],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=self.log)
        line = b""
        deadline = time.monotonic() + 60
        while b"\n" not in line:
            if time.monotonic() > deadline:
                sys.exit(f"bench: {name} printed no listening line; see {self.log.name}")
            if select.select([self.proc.stdout], [], [], 1)[0]:
                chunk = os.read(self.proc.stdout.fileno(), 4096)
                if not chunk:
                    sys.exit(f"bench: {name} exited at start; see {self.log.name}")
                line += chunk
        port = json.loads(line.split(b"\n")[0])["port"]
        self.target = f"127.0.0.1:{port}"
        self.ch = grpc.insecure_channel(self.target)
        self.info = self.ch.unary_unary("/kdecode.v1.Decoder/GetServerInfo",
                                        request_serializer=pb.GetServerInfoRequest.SerializeToString,
                                        response_deserializer=pb.ServerInfo.FromString)
        self.prefill = self.ch.unary_unary("/kdecode.v1.Prefiller/Prefill",
                                           request_serializer=pb.PrefillRequest.SerializeToString,
                                           response_deserializer=pb.PrefillResponse.FromString)
        self.generate = self.ch.unary_stream("/kdecode.v1.Decoder/Generate",
                                             request_serializer=pb.GenerateRequest.SerializeToString,
                                             response_deserializer=pb.GenerateResponse.FromString)
        for _ in range(600):
            try:
                self.info(pb.GetServerInfoRequest(), timeout=5)
                break
            except grpc.RpcError:
                time.sleep(0.1)
        else:
            sys.exit(f"bench: {name} did not load its model; see {self.log.name}")

    def metrics(self):
        m = re.search(r"metrics listening on \S+ \(port (\d+)\)", open(self.log.name).read())
        with urllib.request.urlopen(f"http://127.0.0.1:{m.group(1)}/metrics", timeout=10) as r:
            text = r.read().decode()
        return {k: float(v) for k, v in (ln.rsplit(" ", 1) for ln in text.splitlines() if ln and ln[0] != "#")}

    def stop(self):
        self.ch.close()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def floor_once(nbytes, reps=3):
    out = subprocess.run([ARGS.floor, str(nbytes), str(reps)], capture_output=True, check=True, timeout=120)
    return json.loads(out.stdout)


def main():
    model = os.path.join(TMP, "kimi-linear-48b-state")
    subprocess.run([ARGS.kdecode, "mkmodel", "--preset", "kimi-linear-48b-state", "--seed", "1", "--out", model],
                   check=True, capture_output=True)
    vocab = json.load(open(os.path.join(model, "config.json")))["vocab_size"]
    load0 = os.getloadavg()
    dec = Worker("decode", model, ["--role", "decode", "--max-seqs", "2", "--metrics-listen", "127.0.0.1:0",
                                   *ARGS.decode_args.split()])
    pre = Worker("prefill", model, ["--role", "prefill", "--max-seqs", "2"])
    rng = random.Random(ARGS.seed)
    rows = []
    m0 = None
    busy = None
    busy_t = []  # when each of the busy request's token messages arrived
    windows = []  # (the push's start, as the prefill side timed it, to the first decoded token) a request

    def drain():
        try:
            for r in busy:
                if r.token_ids:
                    busy_t.append(time.monotonic())
        except grpc.RpcError:
            pass  # cancelled at the end

    try:
        if ARGS.busy:  # one request decoding on the decode worker for the whole run (its steps never stop)
            busy = dec.generate(pb.GenerateRequest(prompt_token_ids=[1, 2, 3], max_tokens=4000, ignore_eos=True),
                                timeout=3600)
            next(iter(busy))
            threading.Thread(target=drain, daemon=True).start()
        for i in range(ARGS.warmup + ARGS.requests):
            if i == ARGS.warmup:
                m0 = dec.metrics()
            prompt = [rng.randrange(vocab) for _ in range(ARGS.prompt_len)]
            rid = f"bench-{i}"
            t0 = time.monotonic()
            pr = pre.prefill(pb.PrefillRequest(request_id=rid, prompt_token_ids=prompt, decode_target=dec.target,
                                               ignore_eos=True), timeout=300)
            t1 = time.monotonic()
            first = None
            n_msgs = 0
            for r in dec.generate(pb.GenerateRequest(handoff_id=pr.handoff_id, max_tokens=1, ignore_eos=True),
                                  timeout=300):
                if first is None and r.token_ids:
                    first = time.monotonic()
                n_msgs += 1
            fl = floor_once(pr.handoff_bytes)
            if i < ARGS.warmup:
                continue
            windows.append((t1 - pr.handoff_seconds, first))
            rows.append({"request": rid, "handoff_bytes": pr.handoff_bytes, "handoff_s": pr.handoff_seconds,
                         "prefill_s": pr.prefill_seconds, "prefill_call_s": t1 - t0,
                         "first_decoded_token_s": first - t1, "tcp_floor_s": fl["median_s"],
                         "memcpy_s": fl["memcpy_median_s"]})
            print(f"  {rid}: handoff {pr.handoff_seconds * 1e3:.1f} ms, tcp {fl['median_s'] * 1e3:.1f} ms, "
                  f"call {(t1 - t0) * 1e3:.0f} ms, first decoded token {(first - t1) * 1e3:.1f} ms", flush=True)
        m1 = dec.metrics()
    finally:
        if busy is not None:
            busy.cancel()
        dec.stop()
        pre.stop()
    load1 = os.getloadavg()

    nbytes = rows[0]["handoff_bytes"]
    gib = nbytes / (1 << 30)

    def med(k):
        return statistics.median(r[k] for r in rows)

    def lo(k):
        return min(r[k] for r in rows)

    def hi(k):
        return max(r[k] for r in rows)

    # the busy request's gaps between token messages (about a step each): those that overlap a
    # handoff (from the push's start to the first decoded token) and the others, after the warm-up
    gaps_in, gaps_out = [], []
    t_first = windows[0][0] if windows else 0
    for a, b in zip(busy_t, busy_t[1:]):
        if a < t_first:
            continue
        (gaps_in if any(a < w1 and b > w0 for w0, w1 in windows) else gaps_out).append(b - a)

    def pct(xs, q):
        xs = sorted(xs)
        return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")

    itl = {"during_handoffs": {"n": len(gaps_in), "median_s": pct(gaps_in, 0.5), "p99_s": pct(gaps_in, 0.99),
                               "max_s": max(gaps_in) if gaps_in else float("nan")},
           "otherwise": {"n": len(gaps_out), "median_s": pct(gaps_out, 0.5), "p99_s": pct(gaps_out, 0.99),
                         "max_s": max(gaps_out) if gaps_out else float("nan")}} if ARGS.busy else None
    n_recv = m1["kdecode_handoff_duration_seconds_count"] - m0["kdecode_handoff_duration_seconds_count"]
    recv_mean = (m1["kdecode_handoff_duration_seconds_sum"] - m0["kdecode_handoff_duration_seconds_sum"]) / n_recv
    n_steps = m1["kdecode_step_duration_seconds_count"] - m0["kdecode_step_duration_seconds_count"]
    step_mean = (m1["kdecode_step_duration_seconds_sum"] - m0["kdecode_step_duration_seconds_sum"]) / n_steps
    ratio = med("tcp_floor_s") / med("handoff_s")
    pair_ratio = statistics.median(r["tcp_floor_s"] / r["handoff_s"] for r in rows)
    res = {
        "device": f"{cpu_model()} ({os.cpu_count()} cores)",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": ARGS.commit,
        "command": ARGS.command,
        "load_average_start_end": [round(load0[0], 2), round(load1[0], 2)],
        "model": "kdecode mkmodel --preset kimi-linear-48b-state --seed 1 (20 KDA layers x 32 heads x 128 x 128, "
                 "conv 4; D=64)",
        "transport": "gRPC client streaming, 1 MiB chunks, plaintext, 127.0.0.1",
        "requests": ARGS.requests, "warmup": ARGS.warmup, "prompt_tokens": ARGS.prompt_len,
        "decode_busy": ARGS.busy, "decode_args": ARGS.decode_args,
        "handoff_bytes": nbytes, "handoff_mib": round(nbytes / (1 << 20), 2),
        "median": {k: med(k) for k in rows[0] if k.endswith("_s")},
        "min": {k: lo(k) for k in rows[0] if k.endswith("_s")},
        "max": {k: hi(k) for k in rows[0] if k.endswith("_s")},
        "handoff_gib_s": gib / med("handoff_s"),
        "tcp_floor_gib_s": gib / med("tcp_floor_s"),
        "memcpy_gib_s": gib / med("memcpy_s"),
        "decode_side_receive_mean_s": recv_mean,
        "decode_step_mean_s": step_mean,
        "ratio_tcp_over_handoff": ratio,
        "ratio_median_of_pairs": pair_ratio,
        "target_ratio": TARGET,
        "meets_target": ratio >= TARGET,
        "busy_request_token_gaps": itl,
        "rows": rows,
    }
    with open(ARGS.out + ".json", "w") as f:
        json.dump(res, f, indent=1)
        f.write("\n")

    def ms(x):
        return f"{x * 1e3:.1f}"

    md = [
        "# State handoff (prefill -> decode) on loopback, CPU",
        "",
        f"device: {res['device']}; date: {res['date']}; commit: {res['commit']}; "
        f"load average (1 min) at start/end: {load0[0]:.2f}/{load1[0]:.2f}",
        "",
        f"command: `{res['command']}`",
        "",
        f"model: kimi-linear-48b-state (`kdecode mkmodel --preset kimi-linear-48b-state --seed 1`): "
        f"{nbytes} bytes ({nbytes / (1 << 20):.2f} MiB) of state per request; one prefill worker and one decode "
        f"worker (`kdecode serve --role prefill|decode`, CPU backend) on 127.0.0.1; {ARGS.requests} requests "
        f"after {ARGS.warmup} warm-up, one at a time, prompts of {ARGS.prompt_len} random tokens. "
        "Handoff: `PrefillResponse.handoff_seconds` (prefill side, from the push's start: header, 1 MiB "
        "chunks over gRPC each hashed as it is sent, a trailer with the section checksums; the decode "
        "worker's write into the slot (each piece hashed from the slot as it lands), its check at the "
        "trailer and acknowledgement). TCP floor: `tcp_floor` (tests/bench/handoff/tcp_floor.c), the same "
        "bytes over a fresh 127.0.0.1 connection between two processes in 1 MiB writes into a preallocated "
        "buffer, acknowledged; one run right after each handoff. Ratio: TCP time / handoff time "
        f"(= handoff throughput / TCP throughput), medians; target >= {TARGET:.0%}.",
        "",
        "decode worker: " + ("busy (one request decoding throughout, so a step is always running)" if ARGS.busy
                             else "idle between requests")
        + (f"; extra flags `{ARGS.decode_args}`" if ARGS.decode_args else "") + ".",
        "",
        "| measurement | median | min | max |",
        "|---|---|---|---|",
        f"| handoff, ms (`handoff_seconds`) | {ms(med('handoff_s'))} | {ms(lo('handoff_s'))} | {ms(hi('handoff_s'))} |",
        f"| raw TCP loopback, same bytes, ms | {ms(med('tcp_floor_s'))} | {ms(lo('tcp_floor_s'))} | "
        f"{ms(hi('tcp_floor_s'))} |",
        f"| memcpy of the same bytes, ms (context) | {ms(med('memcpy_s'))} | {ms(lo('memcpy_s'))} | "
        f"{ms(hi('memcpy_s'))} |",
        f"| Prefill call, end to end, ms | {ms(med('prefill_call_s'))} | {ms(lo('prefill_call_s'))} | "
        f"{ms(hi('prefill_call_s'))} |",
        f"| of which prefill compute, ms (`prefill_seconds`) | {ms(med('prefill_s'))} | {ms(lo('prefill_s'))} | "
        f"{ms(hi('prefill_s'))} |",
        f"| Prefill return -> first decoded token, ms | {ms(med('first_decoded_token_s'))} | "
        f"{ms(lo('first_decoded_token_s'))} | {ms(hi('first_decoded_token_s'))} |",
        "",
        "| throughput | GiB/s |",
        "|---|---|",
        f"| handoff | {res['handoff_gib_s']:.2f} |",
        f"| raw TCP loopback | {res['tcp_floor_gib_s']:.2f} |",
        f"| memcpy (one core) | {res['memcpy_gib_s']:.2f} |",
        f"| **ratio handoff / TCP** | **{ratio:.0%}** (median of per-request pairs: {pair_ratio:.0%}; "
        + (f"target >= {TARGET:.0%}, for an idle decode worker: not applicable here) |" if ARGS.busy else
           f"target >= {TARGET:.0%}: {'met' if ratio >= TARGET else 'NOT met'}) |"),
        "",
        *([f"Busy request (decoding on the decode worker throughout): gaps between its token messages, about a "
           f"step each, ms: during a handoff (the push's start to the first decoded token) median "
           f"{ms(itl['during_handoffs']['median_s'])}, p99 {ms(itl['during_handoffs']['p99_s'])}, max "
           f"{ms(itl['during_handoffs']['max_s'])} ({itl['during_handoffs']['n']} gaps); otherwise median "
           f"{ms(itl['otherwise']['median_s'])}, p99 {ms(itl['otherwise']['p99_s'])}, max "
           f"{ms(itl['otherwise']['max_s'])} ({itl['otherwise']['n']} gaps).", ""] if itl else []),
        f"Decode side (kdecode_handoff_duration_seconds, from the PushState call to the verified state): mean "
        f"{ms(recv_mean)} ms. The first decoded token includes one decode step of this model on the CPU "
        f"(kdecode_step_duration_seconds on the decode worker: mean {ms(step_mean)} ms a step).",
        "",
    ]
    with open(ARGS.out + ".md", "w") as f:
        f.write("\n".join(md))
    print("\n".join(md))
    shutil.rmtree(TMP, ignore_errors=True)


if __name__ == "__main__":
    main()
