"""Shared by policy_test.py and pool_test.py: finds the runfiles, renders the kustomize
overlays with the real kubectl, and reads the worker flags out of the rendered objects the
way deploy/docker/entrypoint.sh turns a flags ConfigMap into `kdecode serve` arguments.

Outside Bazel, run the tests from the repository root after `bazel build //worker:kdecode
//worker:kdctl //deploy:demo_model`; they then use bazel-bin/ (or set KDECODE_BIN,
KDCTL_BIN, KDECODE_MODEL)."""

import os
import re
import shutil
import subprocess
import tempfile

import yaml

WORKSPACE = "kdecode"
OVERLAYS = ("gpu", "cpu-demo")
POOLS = ("decode", "prefill")
CONTAINER = "kdecode"
READINESS_SERVICE = "kdecode.v1.Decoder"
LIVENESS_SERVICE = ""
# After the drain, kdecode shuts the server down and waits up to 10 s for the calls to
# close (worker/server.c): the grace period must also cover that.
SHUTDOWN_SECONDS = 10


def _runfile_roots():
    roots = []
    for var in ("TEST_SRCDIR", "RUNFILES_DIR"):
        if os.environ.get(var):
            roots.append(os.path.join(os.environ[var], WORKSPACE))
    here = os.path.dirname(os.path.abspath(__file__))
    # a checkout: deploy/k8s/ -> the repository root, and its bazel-bin for outputs
    repo = os.path.dirname(os.path.dirname(here))
    roots += [repo, os.path.join(repo, "bazel-bin")]
    return roots


def runfile(rel, env=None):
    """The path of a data file (the runfiles under Bazel, else the checkout/bazel-bin)."""
    if env and os.environ.get(env):
        return os.environ[env]
    for root in _runfile_roots():
        p = os.path.join(root, rel)
        if os.path.exists(p):
            return p
    raise FileNotFoundError(f"{rel} not found in the runfiles or the checkout"
                            + (f" (set {env})" if env else ""))


def tmpdir(prefix):
    return tempfile.mkdtemp(prefix=prefix, dir=os.environ.get("TEST_TMPDIR"))


def k8s_tree(dest):
    """Copies deploy/k8s out of the runfiles (symlinks resolved: kustomize refuses files
    whose real path leaves the kustomization root) and returns the copy's path."""
    src = os.path.dirname(runfile("deploy/k8s/base/kustomization.yaml"))
    src = os.path.dirname(src)
    out = os.path.join(dest, "k8s")
    shutil.copytree(src, out, symlinks=False,
                    ignore=shutil.ignore_patterns("*.py", "*.sh", "BUILD", "__pycache__"))
    return out


def kubectl():
    for c in ("/usr/bin/kubectl", "/usr/local/bin/kubectl", shutil.which("kubectl") or ""):
        if c and os.access(c, os.X_OK):
            return c
    raise FileNotFoundError("kubectl is not installed (kubectl kustomize renders the overlays)")


def render(path):
    """`kubectl kustomize PATH` -> the list of objects."""
    r = subprocess.run([kubectl(), "kustomize", path], capture_output=True, text=True,
                       timeout=120)
    if r.returncode != 0:
        raise AssertionError(f"kubectl kustomize {path} failed: {r.stderr}")
    return [d for d in yaml.safe_load_all(r.stdout) if d]


def index(objs):
    """{(kind, name): object}."""
    out = {}
    for o in objs:
        key = (o["kind"], o["metadata"]["name"])
        assert key not in out, f"duplicate object {key}"
        out[key] = o
    return out


def deployment(objs, pool):
    return index(objs)[("Deployment", f"kdecode-{pool}")]


def container(dep, name=CONTAINER):
    for c in dep["spec"]["template"]["spec"]["containers"]:
        if c["name"] == name:
            return c
    raise AssertionError(f"{dep['metadata']['name']}: no container {name}")


def flags_configmap(objs, dep):
    """The ConfigMap mounted as the kdecode container's flags directory
    (KDECODE_FLAGS_DIR)."""
    c = container(dep)
    env = {e["name"]: e.get("value") for e in c.get("env", [])}
    flags_dir = env.get("KDECODE_FLAGS_DIR", "/etc/kdecode/flags")
    mounts = [m for m in c.get("volumeMounts", []) if m["mountPath"] == flags_dir]
    assert len(mounts) == 1, f"{dep['metadata']['name']}: nothing mounted at {flags_dir}"
    vols = {v["name"]: v for v in dep["spec"]["template"]["spec"].get("volumes", [])}
    vol = vols[mounts[0]["name"]]
    assert "configMap" in vol, f"{dep['metadata']['name']}: the flags volume is no ConfigMap"
    return index(objs)[("ConfigMap", vol["configMap"]["name"])], mounts[0]


def entrypoint_argv(data, extra_args=()):
    """The arguments deploy/docker/entrypoint.sh gives `kdecode serve` for a flags
    ConfigMap's data (files in name order; "true": a bare switch; "false" or "": left out)
    followed by the container's args."""
    argv = []
    for name in sorted(data):
        value = str(data[name]).rstrip("\n")
        if value == "true":
            argv.append(f"--{name}")
        elif value not in ("false", ""):
            argv += [f"--{name}", value]
    return argv + list(extra_args)


def write_flags_dir(data, path):
    """Lays out a flags ConfigMap as the kubelet mounts it: one file per key."""
    os.makedirs(path, exist_ok=True)
    for name, value in data.items():
        with open(os.path.join(path, name), "w") as f:
            f.write(str(value))
    return path


def parse_help(text):
    """`kdecode serve --help` -> {flag name: takes a value}. Reads the option column of
    the usage line and of the lines that start with a flag (the part before the first run
    of two spaces), not the descriptions, which mention flags in passing."""
    flags = {}
    for line in text.splitlines():
        s = line.strip()
        if not (s.startswith("--") or s.startswith("usage:")):
            continue
        column = re.split(r"\s{2,}", s)[0]
        for m in re.finditer(r"--([a-z0-9][a-z0-9-]*)( [^\s\[]+)?", column):
            flags[m.group(1)] = flags.get(m.group(1), False) or m.group(2) is not None
    return flags


def effective_flags(argv, takes_value):
    """argv of `kdecode serve` -> {name: value} (last occurrence wins, as with getopt);
    switches map to True."""
    out = {}
    i = 0
    while i < len(argv):
        a = argv[i]
        assert a.startswith("--"), f"unexpected argument {a!r} in {argv}"
        name, eq, val = a[2:].partition("=")
        if name not in takes_value:
            raise AssertionError(f"--{name} is not a flag of kdecode serve")
        if takes_value[name]:
            if not eq:
                i += 1
                assert i < len(argv), f"--{name} lacks its value"
                val = argv[i]
            out[name] = val
        else:
            assert not eq, f"--{name} takes no value"
            out[name] = True
        i += 1
    return out


def host_port(addr):
    host, _, port = addr.rpartition(":")
    return host, int(port)


def pool_flags(objs, pool, takes_value):
    """The effective `kdecode serve` flags of a pool's container, as rendered."""
    dep = deployment(objs, pool)
    cm, _ = flags_configmap(objs, dep)
    argv = entrypoint_argv(cm.get("data", {}), container(dep).get("args", []))
    return effective_flags(argv, takes_value)
