#!/usr/bin/python3
"""policy_test: renders every overlay of deploy/k8s with the real `kubectl kustomize`, runs
yamllint on the sources, and checks the rendered objects against the worker itself:

- every flag in the flags ConfigMaps is one `kdecode serve --help` lists, and the real
  binary, started through deploy/docker/entrypoint.sh with those flags, fails only on the
  (missing) model, never on a flag; the entrypoint builds exactly the expected argv;
- probes are native gRPC probes on the port the worker listens on (--listen), readiness and
  startup on "kdecode.v1.Decoder", liveness on ""; containerPorts, Services, annotations
  and the ServiceMonitor agree with --listen and --metrics-listen;
- preStop sleep + --drain-seconds + the worker's shutdown fit in the grace period;
- every container has resources and runs as non-root, without privilege escalation, on a
  read-only root filesystem; the model is mounted read-only;
- the HPA scales on metrics the worker exports (worker/metrics.h) and prometheus-adapter
  serves them; the alert rules use only exported metrics;
- the Dockerfile: multi-stage, non-root USER, `kdecode serve` as the entrypoint, the same
  setup script and Bazel in the build stage, runtime libraries only in the runtime stage.

Outside Bazel: /usr/bin/python3 deploy/k8s/policy_test.py from the repository root, after
`bazel build //worker:kdecode`."""

import os
import re
import json
import shutil
import signal
import stat
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import k8s_testlib as kt  # noqa: E402

GAUGE_RE = re.compile(r"\bkdecode_[a-z0-9_]+")


def metric_names(header):
    """worker/metrics.h -> ({every exported name}, {gauge names}, {histogram names})."""
    def block(enum):
        m = re.search(r"typedef enum %s \{(.*?)\} %s;" % (enum, enum), header, re.S)
        assert m, f"enum {enum} not found in metrics.h"
        return set(GAUGE_RE.findall(m.group(1)))
    hist, counters, gauges = block("kd_metric_hist"), block("kd_metric_counter"), block("kd_metric_gauge")
    names = set(gauges) | set(counters)
    for h in hist:
        names |= {h + "_bucket", h + "_sum", h + "_count"}
    return names, gauges, hist


def base_overlay(name):
    """"gpu+tls" -> "gpu"."""
    return name.split("+")[0]


def make_certs(d):
    """A CA and one certificate signed by it for server and client use (SANs localhost
    and 127.0.0.1), laid out as Secret kdecode-tls's keys: {ca.crt, tls.crt, tls.key}."""
    os.makedirs(d)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2"]
    with open(os.path.join(d, "ext"), "w") as f:
        f.write("subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n")
    for cmd in (
        ["req", "-x509"] + ec + ["-keyout", "ca.key", "-out", "ca.crt", "-subj", "/CN=kdecode-test-ca",
                                 "-addext", "basicConstraints=critical,CA:TRUE",
                                 "-addext", "keyUsage=critical,keyCertSign,cRLSign"],
        ["req"] + ec[:-2] + ["-keyout", "tls.key", "-out", "tls.csr", "-subj", "/CN=kdecode"],
        ["x509", "-req", "-in", "tls.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
         "-days", "2", "-out", "tls.crt", "-extfile", "ext"],
    ):
        r = subprocess.run(["/usr/bin/openssl"] + cmd, cwd=d, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, f"openssl {cmd}: {r.stderr}"
    return d


def label_selector_matches(selector, labels):
    return all(labels.get(k) == v for k, v in selector.items())


class Policy(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = kt.tmpdir("policy.")
        cls.tree = kt.k8s_tree(cls.tmp)
        cls.rendered = {o: kt.render(os.path.join(cls.tree, "overlays", o)) for o in kt.OVERLAYS}
        # each overlay with the mutual-TLS component too (components/tls), as an operator
        # would add it: "<overlay>+tls"
        for o in kt.OVERLAYS:
            d = os.path.join(cls.tree, "overlays", f"_{o}-tls")
            os.makedirs(d)
            with open(os.path.join(d, "kustomization.yaml"), "w") as f:
                f.write(f"resources:\n  - ../{o}\ncomponents:\n  - ../../components/tls\n")
            cls.rendered[f"{o}+tls"] = kt.render(d)
        cls.kdctl = kt.runfile("worker/kdctl", "KDCTL_BIN")
        cls.certs = make_certs(os.path.join(cls.tmp, "certs"))
        cls.adapter = kt.render(os.path.join(cls.tree, "prometheus-adapter"))
        cls.kdecode = kt.runfile("worker/kdecode", "KDECODE_BIN")
        cls.entrypoint = kt.runfile("deploy/docker/entrypoint.sh")
        cls.model = os.environ.get("KDECODE_MODEL") or os.path.dirname(kt.runfile("deploy/demo-model/config.json"))
        cls.scale = float(os.environ.get("KDECODE_TIME_SCALE", "1"))
        with open(kt.runfile("deploy/docker/Dockerfile")) as f:
            cls.dockerfile = f.read()
        with open(kt.runfile("deploy/docker/Dockerfile.dockerignore")) as f:
            cls.dockerignore = f.read()
        with open(kt.runfile("worker/metrics.h")) as f:
            cls.metrics, cls.gauges, cls.hists = metric_names(f.read())
        r = subprocess.run([cls.kdecode, "serve", "--help"], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, f"kdecode serve --help: exit {r.returncode}: {r.stderr}"
        cls.takes_value = kt.parse_help(r.stdout)
        assert {"listen", "metrics-listen", "role", "drain-seconds", "log-json"} <= set(cls.takes_value)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def each_pool(self):
        for overlay, objs in self.rendered.items():
            for pool in kt.POOLS:
                yield overlay, pool, objs, kt.deployment(objs, pool)

    def flags(self, objs, pool):
        return kt.pool_flags(objs, pool, self.takes_value)

    def secret_mounts(self, dep):
        c = kt.container(dep)
        vols = {v["name"]: v for v in dep["spec"]["template"]["spec"]["volumes"]}
        return [m for m in c.get("volumeMounts", []) if "secret" in vols.get(m["name"], {})]

    def local(self, dep, value):
        """A path under a Secret volume's mount -> the test's file of the same key
        (make_certs), as if the kubelet had mounted Secret kdecode-tls there."""
        for m in self.secret_mounts(dep):
            prefix = m["mountPath"].rstrip("/") + "/"
            if value.startswith(prefix):
                path = os.path.join(self.certs, value[len(prefix):])
                assert os.path.exists(path), f"{value}: the Secret has no key {value[len(prefix):]}"
                return path
        return value

    def local_flags_dir(self, dep, data, name):
        return kt.write_flags_dir({k: self.local(dep, v) for k, v in data.items()}, os.path.join(self.tmp, name))

    # ------------------------------------------------------------------ rendering, lint

    def test_overlays_render_all_objects(self):
        want = {("Namespace", "kdecode"), ("Deployment", "kdecode-decode"),
                ("Deployment", "kdecode-prefill"), ("Service", "kdecode-decode"),
                ("Service", "kdecode-prefill"), ("PodDisruptionBudget", "kdecode-decode"),
                ("PodDisruptionBudget", "kdecode-prefill"),
                ("HorizontalPodAutoscaler", "kdecode-decode"), ("ServiceMonitor", "kdecode"),
                ("PrometheusRule", "kdecode")}
        for overlay, objs in self.rendered.items():
            with self.subTest(overlay=overlay):
                idx = kt.index(objs)
                self.assertLessEqual(want, set(idx), f"{overlay}: objects missing")
                cms = [n for k, n in idx if k == "ConfigMap"]
                self.assertEqual(2, len(cms), f"{overlay}: want the two flags ConfigMaps: {cms}")
                for o in objs:
                    if o["kind"] != "Namespace":
                        self.assertEqual("kdecode", o["metadata"].get("namespace"),
                                         f"{overlay}: {o['kind']}/{o['metadata']['name']} namespace")
        for overlay, objs in self.rendered.items():
            claim = ("PersistentVolumeClaim", "kdecode-model") in kt.index(objs)
            self.assertEqual(base_overlay(overlay) == "gpu", claim, f"{overlay}: the model claim")
        kt.render(os.path.join(self.tree, "base"))
        self.assertEqual([("ConfigMap", "adapter-config")], list(kt.index(self.adapter)))

    def test_yamllint(self):
        yl = shutil.which("yamllint") or "/usr/bin/yamllint"
        self.assertTrue(os.access(yl, os.X_OK), "yamllint is missing (deploy/setup.sh installs it)")
        r = subprocess.run([yl, "-s", "-f", "parsable", "-c", os.path.join(self.tree, ".yamllint"), self.tree],
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(0, r.returncode, f"yamllint:\n{r.stdout}{r.stderr}")
        # the adapter's embedded configuration too, as the adapter will read it
        cfg = self.adapter[0]["data"]["config.yaml"]
        r = subprocess.run([yl, "-s", "-c", os.path.join(self.tree, ".yamllint"), "-"], input=cfg,
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(0, r.returncode, f"yamllint (adapter config.yaml):\n{r.stdout}{r.stderr}")

    # ------------------------------------------------------------------ flags vs the worker

    def test_configmap_flags_are_worker_flags(self):
        for overlay, pool, objs, dep in self.each_pool():
            with self.subTest(overlay=overlay, pool=pool):
                cm, mount = kt.flags_configmap(objs, dep)
                self.assertTrue(mount.get("readOnly"), "the flags mount must be read-only")
                data = cm.get("data", {})
                self.assertTrue(data, "empty flags ConfigMap")
                for name, value in data.items():
                    self.assertIn(name, self.takes_value, f"--{name} is not a flag of kdecode serve")
                    self.assertNotEqual("help", name)
                    if self.takes_value[name]:
                        self.assertNotIn(value, ("", "true", "false"), f"--{name} needs a value")
                    else:
                        self.assertIn(value, ("true", "false"), f"--{name} is a switch: true or false")
                self.assertNotIn("debug-handoff-delay-ms", data, "a fault-injection flag in production")
                for a in kt.container(dep).get("args", []):
                    self.assertTrue(a.startswith("--") or not a.startswith("-"), a)

    def test_worker_accepts_the_flags(self):
        """Starts the real kdecode through the entrypoint with each pool's flags; only the
        listen addresses (loopback, any port) and the model (missing) are overridden, after
        the ConfigMap's flags, as container args would be. It must fail on the model only."""
        for overlay, pool, objs, dep in self.each_pool():
            with self.subTest(overlay=overlay, pool=pool):
                cm, _ = kt.flags_configmap(objs, dep)
                d = self.local_flags_dir(dep, cm["data"], f"flags-{overlay}-{pool}")
                missing = os.path.join(self.tmp, "no-such-model")
                env = dict(os.environ, KDECODE_FLAGS_DIR=d, KDECODE_BIN=self.kdecode)
                args = list(kt.container(dep).get("args", [])) + [
                    "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--model", missing]
                r = subprocess.run(["/bin/sh", self.entrypoint] + args, env=env, capture_output=True,
                                   text=True, timeout=120)
                self.assertEqual(1, r.returncode, f"want exit 1 (model load), got {r.returncode}:\n{r.stderr}")
                self.assertIn("load-failed", r.stderr)
                self.assertIn(missing, r.stderr)
                for bad in ("unknown flag", "bad value", "unexpected argument", "go together", "exceeds"):
                    self.assertNotIn(bad, r.stderr)

    def test_worker_serves_with_the_flags(self):
        """The same, with the bundled demo model: the engine's own checks of the flags
        (slots, batch, prefix block against speculation, ...) run at load, so each pool's
        flags must bring a worker to ready; SIGTERM then drains it to exit 0."""
        for overlay, pool, objs, dep in self.each_pool():
            with self.subTest(overlay=overlay, pool=pool):
                cm, _ = kt.flags_configmap(objs, dep)
                d = self.local_flags_dir(dep, cm["data"], f"serve-{overlay}-{pool}")
                env = dict(os.environ, KDECODE_FLAGS_DIR=d, KDECODE_BIN=self.kdecode)
                args = list(kt.container(dep).get("args", [])) + [
                    "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--model", self.model]
                err_path = os.path.join(self.tmp, f"serve-{overlay}-{pool}.err")
                out_path = os.path.join(self.tmp, f"serve-{overlay}-{pool}.out")
                with open(err_path, "w") as err, open(out_path, "w") as out:
                    proc = subprocess.Popen(["/bin/sh", self.entrypoint] + args, env=env, stdin=subprocess.DEVNULL,
                                            stdout=out, stderr=err)
                try:
                    end = time.monotonic() + 60 * self.scale
                    log = ""
                    while time.monotonic() < end and proc.poll() is None:
                        with open(err_path) as f:
                            log = f.read()
                        if "serving kdecode.v1.Decoder" in log:
                            break
                        time.sleep(0.05)
                    self.assertIn("serving kdecode.v1.Decoder", log, f"not ready (exit {proc.poll()}):\n{log}")
                    with open(out_path) as f:
                        port = json.loads(f.readline())["port"]
                    # exec probes (TLS): run them as the kubelet would, against this worker
                    ran = 0
                    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                        cmd = kt.container(dep)[probe].get("exec", {}).get("command")
                        if not cmd:
                            continue
                        ran += 1
                        cmd = [self.kdctl if a == "kdctl" else self.local(dep, a) for a in cmd]
                        i = cmd.index("--target")
                        cmd[i + 1] = f"{kt.host_port(cmd[i + 1])[0]}:{port}"
                        r = subprocess.run(cmd, capture_output=True, text=True, timeout=60 * self.scale)
                        self.assertEqual(0, r.returncode, f"{probe}: {cmd}: {r.stderr}")
                    self.assertEqual(3 if overlay.endswith("+tls") else 0, ran, "exec probes run")
                    proc.send_signal(signal.SIGTERM)
                    self.assertEqual(0, proc.wait(timeout=60 * self.scale))
                finally:
                    if proc.poll() is None:
                        proc.kill()
                        proc.wait()

    def test_entrypoint_argv(self):
        fake = os.path.join(self.tmp, "fake-kdecode")
        with open(fake, "w") as f:
            f.write('#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done\n')
        os.chmod(fake, stat.S_IRWXU)
        for overlay, pool, objs, dep in self.each_pool():
            with self.subTest(overlay=overlay, pool=pool):
                cm, _ = kt.flags_configmap(objs, dep)
                data = dict(cm["data"])
                data["log-json"] = "false"  # a switch turned off is left out
                d = kt.write_flags_dir(data, os.path.join(self.tmp, f"argv-{overlay}-{pool}"))
                extra = ["--max-seqs", "3", "--log-json"]
                env = dict(os.environ, KDECODE_FLAGS_DIR=d, KDECODE_BIN=fake, LC_ALL="C")
                r = subprocess.run(["/bin/sh", self.entrypoint] + extra, env=env, capture_output=True,
                                   text=True, timeout=60)
                self.assertEqual(0, r.returncode, r.stderr)
                got = r.stdout.split("\n")[:-1]
                self.assertEqual(["serve"] + kt.entrypoint_argv(data, extra), got)
                eff = kt.effective_flags(got[1:], self.takes_value)
                self.assertEqual("3", eff["max-seqs"], "container args come last and win")
                self.assertIs(True, eff["log-json"])
        # a file that is no flag name is refused
        d = kt.write_flags_dir({"Bad_Name": "1"}, os.path.join(self.tmp, "argv-bad"))
        r = subprocess.run(["/bin/sh", self.entrypoint], capture_output=True, text=True, timeout=60,
                           env=dict(os.environ, KDECODE_FLAGS_DIR=d, KDECODE_BIN=fake))
        self.assertEqual(2, r.returncode)

    def test_roles_match_pools(self):
        for overlay, pool, objs, dep in self.each_pool():
            with self.subTest(overlay=overlay, pool=pool):
                self.assertEqual(pool, self.flags(objs, pool)["role"])
                self.assertEqual(pool, dep["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"])

    # ------------------------------------------------------------------ ports and probes

    def test_ports_and_probes(self):
        for overlay, pool, objs, dep in self.each_pool():
            with self.subTest(overlay=overlay, pool=pool):
                f = self.flags(objs, pool)
                c = kt.container(dep)
                ghost, gport = kt.host_port(f["listen"])
                mhost, mport = kt.host_port(f["metrics-listen"])
                # the kubelet probes and the Prometheus scrapes come to the pod's IP
                self.assertIn(ghost, ("0.0.0.0", "[::]"), "--listen must bind every interface")
                self.assertIn(mhost, ("0.0.0.0", "[::]"), "--metrics-listen must bind every interface")
                ports = {p["name"]: p["containerPort"] for p in c["ports"]}
                self.assertEqual({"grpc": gport, "metrics": mport}, ports)
                tls = "tls-cert" in f
                secret_paths = [m["mountPath"].rstrip("/") + "/" for m in self.secret_mounts(dep)
                                if m.get("readOnly")]
                for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                    p = c.get(probe)
                    self.assertIsNotNone(p, f"{probe} missing")
                    kinds = [k for k in ("grpc", "httpGet", "exec", "tcpSocket") if k in p]
                    want = kt.LIVENESS_SERVICE if probe == "livenessProbe" else kt.READINESS_SERVICE
                    if not tls:
                        self.assertEqual(["grpc"], kinds, f"{probe}: want a native gRPC probe")
                        self.assertEqual(gport, p["grpc"]["port"], f"{probe}: port is not --listen's")
                        self.assertEqual(want, p["grpc"].get("service", ""), f"{probe}: health service")
                        continue
                    # TLS: the kubelet's gRPC probes are plaintext; kdctl health over TLS
                    self.assertEqual(["exec"], kinds, f"{probe}: with TLS, want an exec probe")
                    cmd = p["exec"]["command"]
                    self.assertEqual(["kdctl", "health"], cmd[:2], f"{probe}: {cmd}")
                    opts = dict(zip(cmd[2::2], cmd[3::2]))
                    self.assertEqual(len(cmd) - 2, 2 * len(opts), f"{probe}: {cmd}")
                    host, port = kt.host_port(opts["--target"])
                    self.assertIn(host, ("localhost", "127.0.0.1"))
                    self.assertEqual(gport, port, f"{probe}: port is not --listen's")
                    self.assertEqual(want, opts.get("--service", ""), f"{probe}: health service")
                    self.assertLess(float(opts["--timeout"]), p.get("timeoutSeconds", 1), f"{probe}: kdctl timeout")
                    for k in ("--tls-ca", "--tls-cert", "--tls-key"):
                        self.assertTrue(any(opts[k].startswith(sp) for sp in secret_paths),
                                        f"{probe}: {k} {opts.get(k)} is not on a read-only Secret mount")
                    self.assertEqual(f["tls-cert"], opts["--tls-cert"])
                ann = dep["spec"]["template"]["metadata"].get("annotations", {})
                self.assertEqual("true", ann.get("prometheus.io/scrape"))
                self.assertEqual(str(mport), ann.get("prometheus.io/port"))
                self.assertEqual("/metrics", ann.get("prometheus.io/path"))

    def test_drain_fits_grace_period(self):
        for overlay, pool, objs, dep in self.each_pool():
            with self.subTest(overlay=overlay, pool=pool):
                f = self.flags(objs, pool)
                drain = float(f.get("drain-seconds", 30))
                spec = dep["spec"]["template"]["spec"]
                grace = spec.get("terminationGracePeriodSeconds", 30)
                pre = kt.container(dep).get("lifecycle", {}).get("preStop")
                self.assertIsNotNone(pre, "no preStop hook")
                if "sleep" in pre:
                    sleep = float(pre["sleep"]["seconds"])
                else:
                    cmd = pre["exec"]["command"]
                    self.assertEqual("sleep", cmd[0], f"preStop should only wait: {cmd}")
                    sleep = float(cmd[1])
                self.assertGreater(sleep, 0)
                self.assertLess(sleep, 30, "a long preStop delays every rollout")
                self.assertLess(drain, grace)
                self.assertLessEqual(sleep + drain + kt.SHUTDOWN_SECONDS, grace,
                                     f"preStop {sleep} s + drain {drain} s + shutdown "
                                     f"{kt.SHUTDOWN_SECONDS} s exceed the grace period {grace} s")

    def test_services_address_workers(self):
        for overlay, pool, objs, dep in self.each_pool():
            with self.subTest(overlay=overlay, pool=pool):
                idx = kt.index(objs)
                svc = idx[("Service", f"kdecode-{pool}")]["spec"]
                self.assertEqual("None", svc.get("clusterIP"), "want a headless Service")
                self.assertFalse(svc.get("publishNotReadyAddresses", False))
                labels = dep["spec"]["template"]["metadata"]["labels"]
                self.assertTrue(label_selector_matches(svc["selector"], labels))
                others = [d for d in objs if d["kind"] == "Deployment" and d is not dep]
                for o in others:
                    self.assertFalse(label_selector_matches(svc["selector"], o["spec"]["template"]["metadata"]["labels"]),
                                     "the Service selects another pool too")
                cports = {p["name"]: p["containerPort"] for p in kt.container(dep)["ports"]}
                sports = {p["name"]: p for p in svc["ports"]}
                self.assertEqual(set(cports), set(sports))
                for name, p in sports.items():
                    self.assertEqual(name, p["targetPort"])
                    self.assertEqual(cports[name], p["port"])

    def test_servicemonitor_scrapes_metrics_port(self):
        for overlay, objs in self.rendered.items():
            with self.subTest(overlay=overlay):
                idx = kt.index(objs)
                sm = idx[("ServiceMonitor", "kdecode")]["spec"]
                for pool in kt.POOLS:
                    svc = idx[("Service", f"kdecode-{pool}")]
                    self.assertTrue(label_selector_matches(sm["selector"]["matchLabels"], svc["metadata"]["labels"]),
                                    f"the ServiceMonitor misses kdecode-{pool}")
                    names = {p["name"] for p in svc["spec"]["ports"]}
                    for ep in sm["endpoints"]:
                        self.assertIn(ep["port"], names)
                        self.assertEqual("/metrics", ep.get("path", "/metrics"))

    # ------------------------------------------------------------------ pods

    def test_resources_and_non_root(self):
        for overlay, pool, objs, dep in self.each_pool():
            with self.subTest(overlay=overlay, pool=pool):
                spec = dep["spec"]["template"]["spec"]
                psc = spec.get("securityContext", {})
                self.assertIs(True, psc.get("runAsNonRoot"))
                self.assertGreater(psc.get("runAsUser", 0), 0)
                self.assertFalse(spec.get("hostNetwork", False) or spec.get("hostPID", False))
                for c in spec["containers"] + spec.get("initContainers", []):
                    res = c.get("resources", {})
                    req, lim = res.get("requests", {}), res.get("limits", {})
                    self.assertIn("cpu", req, f"{c['name']}: no cpu request")
                    self.assertIn("memory", req, f"{c['name']}: no memory request")
                    self.assertIn("memory", lim, f"{c['name']}: no memory limit")
                    if "nvidia.com/gpu" in req or "nvidia.com/gpu" in lim:
                        self.assertEqual(req.get("nvidia.com/gpu"), lim.get("nvidia.com/gpu"),
                                         "extended resources: request = limit")
                    sc = c.get("securityContext", {})
                    self.assertNotEqual(0, sc.get("runAsUser", 1))
                    self.assertIsNot(False, sc.get("runAsNonRoot", True))
                    self.assertIs(False, sc.get("allowPrivilegeEscalation"))
                    self.assertIs(True, sc.get("readOnlyRootFilesystem"))
                    self.assertIn("ALL", sc.get("capabilities", {}).get("drop", []))
                    self.assertFalse(sc.get("privileged", False))
                gpus = kt.container(dep)["resources"]["limits"].get("nvidia.com/gpu")
                backend = self.flags(objs, pool).get("backend", "auto")
                if base_overlay(overlay) == "gpu":
                    self.assertEqual("1", str(gpus))
                    self.assertEqual("auto", backend)
                    self.assertTrue(any(t.get("key") == "nvidia.com/gpu" for t in spec.get("tolerations", [])))
                else:
                    self.assertIsNone(gpus)
                    self.assertEqual("cpu", backend)

    def test_model_mounted_read_only(self):
        for overlay, pool, objs, dep in self.each_pool():
            with self.subTest(overlay=overlay, pool=pool):
                model = self.flags(objs, pool)["model"]
                c = kt.container(dep)
                vols = {v["name"]: v for v in dep["spec"]["template"]["spec"]["volumes"]}
                covering = [m for m in c["volumeMounts"]
                            if model == m["mountPath"] or model.startswith(m["mountPath"].rstrip("/") + "/")]
                if base_overlay(overlay) == "gpu":
                    self.assertEqual(1, len(covering), f"--model {model} is on no volume")
                    m = covering[0]
                    self.assertIs(True, m.get("readOnly"), "the model volume must be mounted read-only")
                    pvc = vols[m["name"]].get("persistentVolumeClaim")
                    self.assertIsNotNone(pvc, "the model volume is no PVC")
                    self.assertIs(True, pvc.get("readOnly"))
                    claim = kt.index(objs)[("PersistentVolumeClaim", pvc["claimName"])]
                    self.assertIn("ReadOnlyMany", claim["spec"]["accessModes"])
                else:
                    # the cpu image's bundled model (deploy/docker/Dockerfile)
                    self.assertTrue(model.startswith("/opt/kdecode/"), model)
                    self.assertIn(model.rstrip("/") + "/", self.dockerfile)
                    self.assertEqual([], covering, "a volume hides the image's model")

    def test_anti_affinity_pdb_and_rollout(self):
        for overlay, pool, objs, dep in self.each_pool():
            with self.subTest(overlay=overlay, pool=pool):
                labels = dep["spec"]["template"]["metadata"]["labels"]
                aa = dep["spec"]["template"]["spec"].get("affinity", {}).get("podAntiAffinity", {})
                terms = [t.get("podAffinityTerm", t) for t in
                         aa.get("preferredDuringSchedulingIgnoredDuringExecution", [])
                         + aa.get("requiredDuringSchedulingIgnoredDuringExecution", [])]
                self.assertTrue(any(t.get("topologyKey") == "kubernetes.io/hostname"
                                    and label_selector_matches(t["labelSelector"]["matchLabels"], labels)
                                    for t in terms), "no anti-affinity between the pool's pods")
                pdbs = [o for o in objs if o["kind"] == "PodDisruptionBudget"
                        and label_selector_matches(o["spec"]["selector"]["matchLabels"], labels)]
                self.assertEqual(1, len(pdbs), "want one PodDisruptionBudget per pool")
                self.assertTrue("maxUnavailable" in pdbs[0]["spec"] or "minAvailable" in pdbs[0]["spec"])
                ru = dep["spec"]["strategy"]["rollingUpdate"]
                self.assertEqual(0, ru["maxUnavailable"], "a rollout must not lower capacity")
                self.assertGreaterEqual(ru["maxSurge"], 1)

    # ------------------------------------------------------------------ autoscaling, alerts

    def test_hpa_on_exported_metric(self):
        rules = kt.yaml.safe_load(self.adapter[0]["data"]["config.yaml"])["rules"]
        served = set()
        for r in rules:
            series = GAUGE_RE.findall(r["seriesQuery"])
            self.assertEqual(1, len(series), r["seriesQuery"])
            self.assertIn(series[0], self.gauges, f"adapter rule on {series[0]}: not a worker gauge")
            self.assertEqual({"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}},
                             r["resources"]["overrides"])
            served.add(r.get("name", {}).get("as") or series[0])
        for overlay, objs in self.rendered.items():
            with self.subTest(overlay=overlay):
                idx = kt.index(objs)
                hpa = idx[("HorizontalPodAutoscaler", "kdecode-decode")]["spec"]
                ref = hpa["scaleTargetRef"]
                dep = idx[(ref["kind"], ref["name"])]
                self.assertEqual("decode", dep["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"])
                self.assertNotIn("replicas", dep["spec"], "the HPA owns the decode pool's replicas")
                self.assertGreaterEqual(hpa["minReplicas"], 2)
                self.assertLessEqual(hpa["minReplicas"], hpa["maxReplicas"])
                self.assertTrue(hpa["metrics"])
                for m in hpa["metrics"]:
                    self.assertEqual("Pods", m["type"])
                    name = m["pods"]["metric"]["name"]
                    self.assertIn(name, self.gauges, f"HPA metric {name} is not a gauge the worker exports")
                    self.assertIn(name, served, f"no prometheus-adapter rule serves {name}")
                    self.assertEqual("AverageValue", m["pods"]["target"]["type"])
                pdb = idx[("PodDisruptionBudget", "kdecode-decode")]["spec"]
                self.assertLess(pdb.get("maxUnavailable", 1), hpa["minReplicas"])

    def test_alerts_use_exported_metrics(self):
        for overlay, objs in self.rendered.items():
            with self.subTest(overlay=overlay):
                rule = kt.index(objs)[("PrometheusRule", "kdecode")]
                n = 0
                for g in rule["spec"]["groups"]:
                    for r in g["rules"]:
                        for name in GAUGE_RE.findall(r["expr"]):
                            self.assertIn(name, self.metrics, f"{r.get('alert') or r.get('record')}: "
                                                              f"{name} is not exported")
                            n += 1
                        if "alert" in r:
                            self.assertIn(r["labels"]["severity"], ("critical", "warning", "info"))
                            self.assertTrue(r["annotations"]["summary"])
                self.assertGreater(n, 5)
                jobs = set(re.findall(r'job=~"([^"]+)"', str(rule)))
                for j in jobs:
                    for pool in kt.POOLS:
                        self.assertRegex(f"kdecode-{pool}", f"^(?:{j})$", "the job label is the Service's name")

    # ------------------------------------------------------------------ the image

    def stages(self):
        """[(name, base, [instructions])] of the Dockerfile (continuation lines joined)."""
        text = re.sub(r"\\\n", " ", self.dockerfile)
        out = []
        for line in text.splitlines():
            s = line.strip()
            if not s or s.startswith("#"):
                continue
            m = re.match(r"FROM\s+(\S+)(?:\s+AS\s+(\S+))?", s, re.I)
            if m:
                out.append((m.group(2), m.group(1), []))
            elif out:
                out[-1][2].append(s)
        return out

    def test_dockerfile(self):
        st = self.stages()
        names = [s[0] for s in st]
        self.assertGreaterEqual(len(st), 3, "want a multi-stage build")
        self.assertEqual("cuda", names[-1], "the default (last) target is the GPU image")
        self.assertIn("cpu", names)
        by = {s[0]: s for s in st}
        build = " ".join(by["build"][2])
        self.assertIn("deploy/setup.sh", build, "the build stage uses the developers' setup script")
        self.assertRegex(build, r"bazel build [^&]*//worker:kdecode")
        self.assertIn("debian:12", self.dockerfile)
        # the runtime stage: slim Debian 12, no compilers, toolkits or -dev packages
        rt = " ".join(by["runtime"][2])
        self.assertIn("slim", self.dockerfile.split("ARG DEBIAN_IMAGE=")[1].split()[0])
        for bad in ("-dev", "gcc", "g++", "bazel ", "cuda-toolkit", "setup.sh", "nvcc"):
            self.assertNotIn(bad, rt, f"runtime stage installs {bad!r}")
        uids = {kt.deployment(objs, p)["spec"]["template"]["spec"]["securityContext"]["runAsUser"]
                for objs in self.rendered.values() for p in kt.POOLS}
        self.assertEqual(1, len(uids))
        uid = uids.pop()
        exposed = set()
        for name in ("runtime", "cpu", "cuda"):
            ins = by[name][2]
            users = [i.split()[1] for i in ins if i.upper().startswith("USER ")]
            if name != "runtime":
                self.assertEqual("runtime", by[name][1], f"{name} builds on the runtime stage")
            self.assertTrue(users, f"{name}: no USER")
            last = users[-1].split(":")[0]
            self.assertTrue(last.isdigit() and int(last) != 0, f"{name}: last USER {users[-1]} is root or a name")
            self.assertEqual(uid, int(last), f"{name}: USER differs from the pods' runAsUser")
            for i in ins:
                if i.upper().startswith("EXPOSE "):
                    exposed |= {int(p.split("/")[0]) for p in i.split()[1:]}
        self.assertNotIn("HEALTHCHECK", " ".join(i for s in st for i in s[2]).upper().split(),
                         "Kubernetes probes the gRPC health service; no HEALTHCHECK")
        ep = [i for i in by["runtime"][2] if i.upper().startswith("ENTRYPOINT ")]
        self.assertEqual(1, len(ep))
        m = re.match(r'ENTRYPOINT\s+\["([^"]+)"\]$', ep[0])
        self.assertIsNotNone(m, "ENTRYPOINT must be the exec form with the entrypoint script alone")
        self.assertRegex(self.dockerfile, r"COPY\s+deploy/docker/entrypoint\.sh\s+" + re.escape(m.group(1)))
        self.assertRegex(self.dockerfile, r"COPY --from=build /out/bin/kdecode [^\n]*/usr/local/bin/")
        with open(self.entrypoint) as f:
            script = f.read()
        self.assertIn("bin=${KDECODE_BIN:-/usr/local/bin/kdecode}", script)
        self.assertRegex(script, r'\nexec "\$bin" serve "\$@"\n')
        self.assertIn("dir=${KDECODE_FLAGS_DIR:-/etc/kdecode/flags}", script)
        for overlay, pool, objs, dep in self.each_pool():
            f = self.flags(objs, pool)
            for k in ("listen", "metrics-listen"):
                self.assertIn(kt.host_port(f[k])[1], exposed, f"{overlay}/{pool}: --{k} port not EXPOSEd")
            # the image tag of each overlay is one of the Dockerfile's targets
            tag = kt.container(dep)["image"].rpartition(":")[2]
            self.assertEqual({"gpu": "cuda", "cpu-demo": "cpu"}[base_overlay(overlay)], tag)
        # the images' default flags (for docker run) agree with the overlays' ConfigMaps
        for target, overlay in (("cuda", "gpu"), ("cpu", "cpu-demo")):
            defaults = dict((n, v) for v, n in re.findall(r"printf '%s\\n' (\S+) >/etc/kdecode/flags/([a-z0-9-]+)",
                                                          " ".join(by[target][2])))
            self.assertLessEqual({"listen", "metrics-listen", "model", "backend"}, set(defaults), target)
            for n in defaults:
                self.assertIn(n, self.takes_value, f"{target}: default flag --{n}")
            for pool in kt.POOLS:
                f = self.flags(self.rendered[overlay], pool)
                for n, v in defaults.items():
                    self.assertEqual(f[n], v, f"image {target} default --{n} vs {overlay}/{pool}")
        # the build context admits what the Dockerfile copies, and not the bazel-* links
        ignore = [ln.strip() for ln in self.dockerignore.splitlines() if ln.strip() and not ln.startswith("#")]
        self.assertEqual("*", ignore[0])
        for d in ("WORKSPACE", "BUILD", ".bazelrc", "deploy/", "kernels/", "proto/", "worker/"):
            self.assertIn("!" + d, ignore)
            copies = [i for s in st for i in s[2] if i.startswith("COPY ") and "--from" not in i]
            self.assertTrue(any(d.rstrip("/") in i.split()[1:-1] or d in i.split()[1:-1] for i in copies),
                            f"the Dockerfile copies no {d}")


if __name__ == "__main__":
    # --time-scale=F (sanitizer builds) stretches the waits; the rest goes to unittest
    for a in list(sys.argv[1:]):
        if a.startswith("--time-scale="):
            os.environ["KDECODE_TIME_SCALE"] = a.split("=", 1)[1]
            sys.argv.remove(a)
    unittest.main(verbosity=2)
