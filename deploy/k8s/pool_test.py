#!/usr/bin/python3
"""pool_test: the cpu-demo pool as local processes. Renders deploy/k8s/overlays/cpu-demo
with kubectl, lays out its flags ConfigMaps as the kubelet mounts them, and starts two
decode workers and one prefill worker through deploy/docker/entrypoint.sh, as the
containers do, with the bundled demo model. Only what a pod gets from Kubernetes differs:
the listen addresses (loopback, any free port: the pod IP and fixed ports of the
manifests would collide on one host) and the model path (the image's /opt/kdecode/
demo-model is the runfiles' copy here); they are container args after the ConfigMap's.

Then, on loopback only:
- readiness and GetServerInfo agree with the ConfigMap (role, slots, queue, prefix block);
- `kdctl load --prefill P --decode D --concurrency 4 --requests 40 --json` through each
  decode worker at once (the prefill -> decode path): 40 ok, no errors, each;
- /metrics of the workers exports the HPA's metrics and counted the work;
- a drain as Kubernetes does it (SIGTERM): streams running on the worker finish with all
  their tokens, readiness turns NOT_SERVING while liveness stays SERVING, new calls get
  UNAVAILABLE, GetLoads says draining, and the worker exits 0 within drain-seconds;
- SIGTERM to the other workers: exit 0 each.

Arguments: --time-scale=F stretches the waits (sanitizer builds). Outside Bazel: from the
repository root after `bazel build //worker:kdecode //worker:kdctl //deploy:demo_model`."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import k8s_testlib as kt  # noqa: E402

SCALE = 1.0
for a in sys.argv[1:]:
    if a.startswith("--time-scale="):
        SCALE = float(a.split("=", 1)[1])
    else:
        sys.exit(f"pool_test: unknown argument {a}")

# Loopback only: a proxy from the environment must not capture 127.0.0.1.
for v in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "grpc_proxy", "all_proxy", "ALL_PROXY"):
    os.environ.pop(v, None)
os.environ["no_proxy"] = "*"

PASSED = 0
FAILED = 0


def check(cond, what, detail=""):
    global PASSED, FAILED
    if cond:
        PASSED += 1
    else:
        FAILED += 1
        print(f"FAIL: {what}" + (f"\n  {detail}" if detail else ""), flush=True)
    return cond


class Worker:
    def __init__(self, name, data, args, tmp):
        self.name = name
        self.flags_dir = kt.write_flags_dir(data, os.path.join(tmp, f"{name}-flags"))
        self.out_path = os.path.join(tmp, f"{name}.out")
        self.err_path = os.path.join(tmp, f"{name}.err")
        env = dict(os.environ, KDECODE_FLAGS_DIR=self.flags_dir, KDECODE_BIN=KDECODE)
        argv = ["/bin/sh", ENTRYPOINT] + list(args) + [
            "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--model", MODEL]
        with open(self.out_path, "w") as out, open(self.err_path, "w") as err:
            # the entrypoint execs kdecode: this pid is the worker's, as PID 1 in a pod
            self.proc = subprocess.Popen(argv, env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL)
        self.port = self.metrics_port = None
        self.signalled = False

    def terminate(self):
        """SIGTERM once, as the kubelet does (a second signal makes kdecode exit at once)."""
        if not self.signalled and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        self.signalled = True

    def log(self):
        try:
            with open(self.err_path) as f:
                return f.read()
        except OSError:
            return ""

    def wait_listening(self, timeout):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                with open(self.out_path) as f:
                    line = f.readline()
                if line.endswith("\n"):
                    self.port = json.loads(line)["port"]
                m = re.search(r"listening on \S+ \(port (\d+)\)", self.log())
                if m:
                    self.metrics_port = int(m.group(1))
                if self.port and self.metrics_port:
                    return True
            except (OSError, ValueError, KeyError):
                pass
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        return False

    @property
    def target(self):
        return f"127.0.0.1:{self.port}"

    def metrics(self):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10) as r:
            text = r.read().decode()
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                out[key] = float(value)
        return out

    def stop(self, timeout):
        """SIGTERM (once), then the exit code, or None if it did not exit in time."""
        self.terminate()
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def kdctl(*args, timeout=60):
    r = subprocess.run([KDCTL] + [str(a) for a in args], capture_output=True, text=True,
                       timeout=timeout * SCALE)
    js = None
    lines = [ln for ln in r.stdout.splitlines() if ln.strip()]
    if lines:
        try:
            js = json.loads(lines[-1])
        except ValueError:
            pass
    return r.returncode, js, r.stderr


def wait_ready(w, timeout):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        rc, _, _ = kdctl("health", "--target", w.target, "--service", kt.READINESS_SERVICE, "--timeout", 2)
        if rc == 0:
            return True
        if w.proc.poll() is not None:
            return False
        time.sleep(0.1)
    return False


def metric_sum(m, name):
    return sum(v for k, v in m.items() if k == name or k.startswith(name + "{"))


def main():
    tmp = kt.tmpdir("pool.")
    workers = []
    try:
        tree = kt.k8s_tree(tmp)
        objs = kt.render(os.path.join(tree, "overlays", "cpu-demo"))
        r = subprocess.run([KDECODE, "serve", "--help"], capture_output=True, text=True, timeout=60)
        takes_value = kt.parse_help(r.stdout)
        cms, args, flags = {}, {}, {}
        for pool in kt.POOLS:
            dep = kt.deployment(objs, pool)
            cm, _ = kt.flags_configmap(objs, dep)
            cms[pool] = cm["data"]
            args[pool] = kt.container(dep).get("args", [])
            flags[pool] = kt.pool_flags(objs, pool, takes_value)
        hpa = kt.index(objs)[("HorizontalPodAutoscaler", "kdecode-decode")]
        hpa_metrics = [m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"]]
        print(f"pool_test: decode flags {flags['decode']}\npool_test: prefill flags {flags['prefill']}", flush=True)

        d1 = Worker("decode-1", cms["decode"], args["decode"], tmp)
        d2 = Worker("decode-2", cms["decode"], args["decode"], tmp)
        p = Worker("prefill", cms["prefill"], args["prefill"], tmp)
        workers = [d1, d2, p]
        for w in workers:
            if not check(w.wait_listening(30 * SCALE), f"{w.name} listens", w.log()):
                return
        for w in workers:
            if not check(wait_ready(w, 60 * SCALE), f"{w.name} becomes ready ({kt.READINESS_SERVICE})", w.log()):
                return
            rc, _, err = kdctl("health", "--target", w.target)
            check(rc == 0, f"{w.name}: liveness (\"\") SERVING", err)

        # GetServerInfo agrees with the ConfigMap
        for w, pool in ((d1, "decode"), (d2, "decode"), (p, "prefill")):
            f = flags[pool]
            rc, info, err = kdctl("info", "--target", w.target, "--json")
            if not check(rc == 0 and info, f"{w.name}: info", err):
                continue
            check(info["role"] == f["role"] == pool, f"{w.name}: role", info)
            check(info["backend"] == f["backend"], f"{w.name}: backend", info)
            check(info["max_seqs"] == int(f["max-seqs"]), f"{w.name}: max_seqs", info)
            check(info["max_queue"] == int(f["max-queue"]), f"{w.name}: max_queue", info)
            check(info["prefix_block"] == int(f.get("prefix-block", 0)), f"{w.name}: prefix_block", info)
            if "spec-tokens" in f:
                check(info["default_spec_tokens"] == int(f["spec-tokens"]), f"{w.name}: spec tokens", info)

        # the prefill -> decode path, through both decode workers at once
        loads = {}
        for i, d in enumerate((d1, d2)):
            loads[d.name] = subprocess.Popen(
                [KDCTL, "load", "--prefill", p.target, "--decode", d.target, "--concurrency", "4",
                 "--requests", "40", "--prompt-seed", str(11 + i), "--json"],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        itl_ms = []
        for name, proc in loads.items():
            try:
                out, err = proc.communicate(timeout=300 * SCALE)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, err = proc.communicate()
            try:
                res = json.loads(out.strip().splitlines()[-1])
            except (ValueError, IndexError):
                check(False, f"kdctl load via {name}: one JSON line", f"{out}\n{err}")
                continue
            print(f"pool_test: load via {name}: {json.dumps(res)}", flush=True)
            check(proc.returncode == 0, f"kdctl load via {name}: exit 0", err)
            check(res["requests"]["total"] == 40 and res["requests"]["ok"] == 40,
                  f"kdctl load via {name}: 40 ok", res["requests"])
            check(res["requests"]["failed"] == 0 and res["errors"] == {} and res["status"] == {"OK": 40},
                  f"kdctl load via {name}: no errors", res)
            check(res["latency_ms"]["ttft"]["count"] == 40, f"kdctl load via {name}: a TTFT per request")
            check(res["latency_ms"]["itl"]["count"] > 0, f"kdctl load via {name}: inter-token latencies")
            if res["latency_ms"]["itl"]["p50"]:
                itl_ms.append(res["latency_ms"]["itl"]["p50"])

        # metrics: the HPA's metrics are exported; the work was counted where it ran
        for d in (d1, d2):
            m = d.metrics()
            for name in hpa_metrics:
                check(name in m, f"{d.name}: /metrics exports the HPA metric {name}")
            check(metric_sum(m, "kdecode_generation_tokens_total") > 0, f"{d.name}: generated tokens counted")
            check(m.get("kdecode_slots_total") == float(flags["decode"]["max-seqs"]), f"{d.name}: slots_total")
            check(m.get("kdecode_ready") == 1.0, f"{d.name}: kdecode_ready 1")
        mp = p.metrics()
        md = d1.metrics()
        check(metric_sum(mp, "kdecode_handoff_bytes_total") + metric_sum(md, "kdecode_handoff_bytes_total") > 0,
              "handoff bytes counted")
        check(metric_sum(mp, "kdecode_handoff_failures_total") == 0, "no handoff failures")

        # the drain of a Kubernetes pod deletion, on decode-1, with streams running
        drain = float(flags["decode"].get("drain-seconds", 30))
        itl = (min(itl_ms) if itl_ms else 10.0) / 1000.0
        n_tok = max(50, min(1500, int(drain / 4 / max(itl, 1e-4))))
        print(f"pool_test: drain: 3 streams of {n_tok} tokens on {d1.name}, drain-seconds {drain}", flush=True)
        streams = [subprocess.Popen(
            [KDCTL, "generate", "--prefill", p.target, "--decode", d1.target, "--prompt-ids", f"{5 + i},17,42,99",
             "--max-tokens", str(n_tok), "--ignore-eos", "--request-id", f"drain-{i}", "--json"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(3)]
        end = time.monotonic() + 30 * SCALE
        running = False
        while time.monotonic() < end and not running:
            rc, ld, _ = kdctl("loads", "--target", d1.target, "--json")
            running = rc == 0 and ld["slots_used"] >= 3 and ld["handoffs_pending"] == 0
            if not running:
                time.sleep(0.02)
        check(running, f"{d1.name}: 3 streams running before SIGTERM")
        t_term = time.monotonic()
        d1.terminate()
        draining = False
        while time.monotonic() < t_term + 5 * SCALE and not draining:
            rc, ld, _ = kdctl("loads", "--target", d1.target, "--json")
            draining = rc == 0 and ld["draining"]
        check(draining, f"{d1.name}: GetLoads reports draining")
        rc, js, err = kdctl("health", "--target", d1.target, "--service", kt.READINESS_SERVICE, "--json")
        check(rc == 1 and js and js.get("status") == "NOT_SERVING", f"{d1.name}: readiness NOT_SERVING while draining",
              f"rc {rc} {js} {err}")
        rc, js, err = kdctl("health", "--target", d1.target, "--json")
        check(rc == 0, f"{d1.name}: liveness still SERVING while draining (no restart)", f"rc {rc} {js} {err}")
        rc, js, err = kdctl("generate", "--target", d1.target, "--prompt-ids", "1,2", "--max-tokens", "2", "--json")
        check(rc == 1 and js and js.get("error", {}).get("name") == "UNAVAILABLE",
              f"{d1.name}: a new Generate while draining gets UNAVAILABLE", f"rc {rc} {js} {err}")
        rc, js, err = kdctl("generate", "--prefill", p.target, "--decode", d1.target, "--prompt-ids", "1,2",
                            "--max-tokens", "4", "--json")
        check(rc == 1 and js and "error" in js, f"prefill -> draining {d1.name} is refused", f"rc {rc} {js} {err}")
        print(f"pool_test: prefill -> draining decode worker: {js}", flush=True)
        for i, s in enumerate(streams):
            try:
                out, err = s.communicate(timeout=(drain + 30) * SCALE)
            except subprocess.TimeoutExpired:
                s.kill()
                out, err = s.communicate()
            try:
                res = json.loads(out.strip().splitlines()[-1])
            except (ValueError, IndexError):
                res = {}
            check(s.returncode == 0 and res.get("finish") == "length" and len(res.get("tokens", [])) == n_tok,
                  f"stream drain-{i} finished with all {n_tok} tokens during the drain",
                  f"rc {s.returncode} finish {res.get('finish')} tokens {len(res.get('tokens', []))} {err}")
        rc = d1.stop(timeout=(drain + 20) * SCALE)
        check(rc == 0, f"{d1.name}: exit 0 after the drain", f"exit {rc}\n{d1.log()[-2000:]}")
        check(time.monotonic() - t_term < drain + kt.SHUTDOWN_SECONDS + 5 * SCALE,
              f"{d1.name}: stopped within drain-seconds + shutdown")
        check("drain-timeout" not in d1.log(), f"{d1.name}: no request cut by the drain timeout")

        # the remaining workers: SIGTERM, idle, exit 0
        for w in (d2, p):
            rc = w.stop(timeout=(float(flags["decode"].get("drain-seconds", 30)) + 20) * SCALE)
            check(rc == 0, f"{w.name}: SIGTERM -> exit 0", f"exit {rc}\n{w.log()[-2000:]}")
    finally:
        for w in workers:
            w.kill()
        if FAILED:
            for w in workers:
                print(f"---- {w.name} log (tail)\n{w.log()[-3000:]}")
        shutil.rmtree(tmp, ignore_errors=True)


KDECODE = kt.runfile("worker/kdecode", "KDECODE_BIN")
KDCTL = kt.runfile("worker/kdctl", "KDCTL_BIN")
ENTRYPOINT = kt.runfile("deploy/docker/entrypoint.sh")
MODEL = os.environ.get("KDECODE_MODEL") or os.path.dirname(kt.runfile("deploy/demo-model/config.json"))

if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # a crash of the test itself counts as a failure
        import traceback
        traceback.print_exc()
        check(False, f"pool_test raised {e!r}")
    if PASSED + FAILED == 0:
        check(False, "no check ran")
    print(f"pool_test: {PASSED} passed, {FAILED} failed")
    sys.exit(1 if FAILED else 0)
