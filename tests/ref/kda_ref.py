#!/usr/bin/python3
"""kda_ref.py: an independent float64 forward of a KDA checkpoint (docs KDA.md sections 1-2).

numpy only (Debian python3-numpy; run with /usr/bin/python3). Reads config.json and
model.safetensors (or a sharded model.safetensors.index.json) with its own small parser and
runs the model token-parallel for the projections and token-sequential for the recurrence,
carrying the per-sequence state (conv windows and the K x V states) between calls.

  kda_ref.py --model DIR --prompt-ids 1,2,3 --max-tokens N [--out-logits FILE.npy]
      prints {"tokens": [...], "margins": [...]}: the greedy continuation and the top-1 minus
      top-2 logit at each step. --out-logits saves the prompt logits [T, vocab] (float64).
      With --expect-json FILE (a line {"tokens": [...]}) and/or --expect-logits FILE
      (safetensors with tensor `logits` [T, vocab]) it also compares another implementation
      against this one and exits 1 on a mismatch: logits by ||a - b|| / ||b|| <= --logits-rtol,
      tokens exactly at every step until the first whose margin is <= --margin-min.
  kda_ref.py --self-check ORACLE_DIR
      reproduces the oracle's vectors (a folder with model/ and vectors.safetensors, or a
      folder of such folders): prompt logits, greedy tokens and margins, and the KDA op case.
"""
import argparse
import json
import math
import os
import struct
import sys

import numpy as np

# ---------------------------------------------------------------- safetensors

_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4",
           "I16": "<i2", "I8": "i1", "U8": "u1", "BOOL": "?"}


def read_safetensors(path):
    """Returns ({name: array}, metadata). BF16 is widened exactly to float32."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise ValueError(f"{path}: too short for a safetensors file")
    (n,) = struct.unpack("<Q", blob[:8])
    if 8 + n > len(blob):
        raise ValueError(f"{path}: header length {n} past the end of the file")
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    data = memoryview(blob)[8 + n:]
    meta = header.pop("__metadata__", {}) or {}
    out = {}
    for name, e in header.items():
        b, end = e["data_offsets"]
        shape = tuple(e["shape"])
        raw = data[b:end]
        if e["dtype"] == "BF16":
            a = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        elif e["dtype"] in _DTYPES:
            a = np.frombuffer(raw, dtype=_DTYPES[e["dtype"]])
        else:
            raise ValueError(f"{path}: {name}: unsupported dtype {e['dtype']}")
        if a.size != math.prod(shape):
            raise ValueError(f"{path}: {name}: {a.size} elements for shape {list(shape)}")
        out[name] = a.reshape(shape)
    return out, meta


def read_checkpoint(model_dir):
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
    else:
        shards = ["model.safetensors"]
    tensors = {}
    for s in shards:
        t, _ = read_safetensors(os.path.join(model_dir, s))
        tensors.update(t)
    return tensors


# ---------------------------------------------------------------- the model

def sigmoid(x):
    return np.exp(-np.logaddexp(0.0, -x))


def silu(x):
    return x * sigmoid(x)


def softplus(x):
    return np.logaddexp(0.0, x)


def rms(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def kda_gate(g_raw, A_log, dt_bias, lower_bound):
    """g_raw [T, HV, K], A_log [HV], dt_bias [HV, K] -> log decay [T, HV, K]."""
    a = np.exp(A_log)[:, None]
    if lower_bound is None:
        return -a * softplus(g_raw + dt_bias)
    return lower_bound * sigmoid(a * (g_raw + dt_bias))


def l2n(x):
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + 1e-6)


def kda_recurrence(q, k, v, g, beta, S):
    """q, k [T, H, K] raw; v [T, HV, V]; g [T, HV, K] log decay; beta [T, HV];
    S [HV, K, V] updated in place. Returns o [T, HV, V]."""
    T, H, K = q.shape
    HV = v.shape[1]
    grp = HV // H
    qh = np.repeat(l2n(q), grp, axis=1) * K ** -0.5
    kh = np.repeat(l2n(k), grp, axis=1)
    o = np.empty(v.shape)
    for t in range(T):
        S *= np.exp(g[t])[:, :, None]
        u = beta[t][:, None] * (v[t] - np.einsum("hk,hkv->hv", kh[t], S))
        S += kh[t][:, :, None] * u[:, None, :]
        o[t] = np.einsum("hk,hkv->hv", qh[t], S)
    return o


class KDAModel:
    def __init__(self, model_dir):
        with open(os.path.join(model_dir, "config.json")) as f:
            c = json.load(f)
        if c.get("model_type") != "kda":
            raise ValueError(f"{model_dir}: model_type {c.get('model_type')!r} is not 'kda'")
        if c.get("attn"):
            raise ValueError(f"{model_dir}: softmax attention layers are not supported")
        self.D = c["hidden_size"]
        self.L = c["num_hidden_layers"]
        self.H = c["num_heads"]
        self.HV = c.get("num_v_heads") or self.H
        self.K = c["head_dim"]
        self.V = int(self.K * c.get("expand_v", 1.0))
        self.W = c.get("conv_size", 4)
        self.conv = c.get("use_short_conv", True)
        self.vocab = c["vocab_size"]
        self.eps = c.get("norm_eps", 1e-6)
        self.lower_bound = c.get("lower_bound")
        self.neg = c.get("allow_neg_eigval", False)
        self.tied = c.get("tie_word_embeddings", False)
        self.eos = c.get("eos_token_id")
        if self.HV % self.H:
            raise ValueError(f"{model_dir}: num_v_heads {self.HV} is not a multiple of "
                             f"num_heads {self.H}")
        self.w = {n: a.astype(np.float64) for n, a in read_checkpoint(model_dir).items()}
        self.head = self.w["model.embeddings.weight"] if self.tied else self.w["lm_head.weight"]

    def new_state(self):
        st = []
        for _ in range(self.L):
            s = {"S": np.zeros((self.HV, self.K, self.V))}
            if self.conv:
                qk, vd = self.H * self.K, self.HV * self.V
                for n, c in (("q", qk), ("k", qk), ("v", vd)):
                    s[n] = np.zeros((self.W - 1, c))
            st.append(s)
        return st

    def _conv(self, x, w, hist):
        """Depthwise causal conv + silu over x [T, C] after the W-1 inputs in hist."""
        T, W = x.shape[0], self.W
        xp = np.concatenate([hist, x], 0)
        y = np.zeros_like(x)
        for j in range(W):
            y += xp[j:j + T] * w[:, 0, j]
        return silu(y), xp[xp.shape[0] - (W - 1):]

    def _kda(self, h, p, s):
        T, H, HV, K, V = h.shape[0], self.H, self.HV, self.K, self.V
        w = self.w
        xs = {n: h @ w[p + n + "_proj.weight"].T for n in "qkv"}
        for n in "qkv":
            if self.conv:
                xs[n], s[n] = self._conv(xs[n], w[p + n + "_conv1d.weight"], s[n])
            else:
                xs[n] = silu(xs[n])
        g_raw = (h @ w[p + "f_proj.0.weight"].T) @ w[p + "f_proj.1.weight"].T
        g = kda_gate(g_raw.reshape(T, HV, K), w[p + "A_log"].reshape(HV),
                     w[p + "dt_bias"].reshape(HV, K), self.lower_bound)
        beta = sigmoid(h @ w[p + "b_proj.weight"].T) * (2.0 if self.neg else 1.0)
        o = kda_recurrence(xs["q"].reshape(T, H, K), xs["k"].reshape(T, H, K),
                           xs["v"].reshape(T, HV, V), g, beta, s["S"])
        gate = (h @ w[p + "g_proj.0.weight"].T) @ w[p + "g_proj.1.weight"].T
        gate = gate + w[p + "g_proj.1.bias"]
        o = rms(o, w[p + "o_norm.weight"], self.eps) * sigmoid(gate.reshape(T, HV, V))
        return o.reshape(T, HV * V) @ w[p + "o_proj.weight"].T

    def forward(self, tokens, state):
        """Logits [T, vocab] for tokens following `state` (advanced in place)."""
        w = self.w
        x = w["model.embeddings.weight"][np.asarray(tokens, dtype=np.int64)]
        for i in range(self.L):
            p = f"model.layers.{i}."
            x = x + self._kda(rms(x, w[p + "attn_norm.weight"], self.eps), p + "attn.", state[i])
            h = rms(x, w[p + "mlp_norm.weight"], self.eps)
            m = p + "mlp."
            mid = silu(h @ w[m + "gate_proj.weight"].T) * (h @ w[m + "up_proj.weight"].T)
            x = x + mid @ w[m + "down_proj.weight"].T
        return rms(x, w["model.norm.weight"], self.eps) @ self.head.T

    def generate(self, prompt, n):
        """(prompt logits [T, vocab], greedy tokens [n], margins [n])."""
        state = self.new_state()
        logits = self.forward(prompt, state)
        last, toks, margins = logits[-1], [], []
        for step in range(n):
            top = np.argsort(last)[::-1][:2]
            toks.append(int(top[0]))
            margins.append(float(last[top[0]] - last[top[1]]) if last.size > 1 else math.inf)
            if step + 1 < n:
                last = self.forward([toks[-1]], state)[-1]
        return logits, toks, margins


# ---------------------------------------------------------------- checks

def rel_err(a, b):
    return float(np.linalg.norm(np.asarray(a, np.float64) - b) / np.linalg.norm(b))


def self_check(root):
    """Compares against the oracle's vectors; returns the number of failures."""
    cases = [root] if os.path.exists(os.path.join(root, "vectors.safetensors")) else sorted(
        os.path.join(root, d) for d in os.listdir(root)
        if os.path.exists(os.path.join(root, d, "vectors.safetensors")))
    if not cases:
        print(f"self-check: no vectors.safetensors under {root}")
        return 1
    fails = 0
    for case in cases:
        name = os.path.basename(os.path.normpath(case))
        model = KDAModel(os.path.join(case, "model"))
        vec, meta = read_safetensors(os.path.join(case, "vectors.safetensors"))
        i = 0
        while f"prompt{i}.tokens" in vec:
            p = f"prompt{i}."
            n = vec[p + "greedy"].shape[0]
            logits, toks, margins = model.generate(vec[p + "tokens"].tolist(), n)
            e = rel_err(logits, vec[p + "logits"])
            same = toks == vec[p + "greedy"].tolist()
            dm = float(np.max(np.abs(np.asarray(margins) - vec[p + "margins"])))
            ok = e < 1e-10 and same and dm < 1e-8
            fails += not ok
            print(f"self-check {name} prompt{i} T={len(vec[p + 'tokens'])}: "
                  f"logits rel err {e:.2e}, "
                  f"greedy {'equal' if same else 'DIFFERENT'} ({n} tokens), margins max abs diff "
                  f"{dm:.2e}: {'ok' if ok else 'FAIL'}")
            i += 1
        if "kda.o" in vec:
            lb = meta.get("lower_bound", "None")
            lb = None if lb == "None" else float(lb)
            neg = meta.get("allow_neg_eigval", "False") == "True"
            HV, K = vec["kda.v"].shape[1], vec["kda.q"].shape[2]
            S = vec["kda.initial_state"].copy()
            g = kda_gate(vec["kda.g_raw"], vec["kda.A_log"], vec["kda.dt_bias"].reshape(HV, K), lb)
            beta = sigmoid(vec["kda.beta_raw"]) * (2.0 if neg else 1.0)
            o = kda_recurrence(vec["kda.q"], vec["kda.k"], vec["kda.v"], g, beta, S)
            eo, es = rel_err(o, vec["kda.o"]), rel_err(S, vec["kda.final_state"])
            ok = eo < 1e-10 and es < 1e-10
            fails += not ok
            print(f"self-check {name} kda op: o rel err {eo:.2e}, final state rel err {es:.2e}: "
                  f"{'ok' if ok else 'FAIL'}")
    return fails


def compare(args, model, prompt, logits, toks, margins):
    """Checks another implementation's output against ours; returns the number of failures."""
    fails = 0
    if args.expect_logits:
        t, _ = read_safetensors(args.expect_logits)
        if "logits" not in t:
            print(f"FAIL: {args.expect_logits} has no tensor 'logits'")
            return 1
        got = t["logits"]
        if got.shape != logits.shape:
            print(f"FAIL: logits shape {list(got.shape)}, expected {list(logits.shape)}")
            return 1
        e = rel_err(got, logits)
        per_pos = np.linalg.norm(got - logits, axis=1) / np.linalg.norm(logits, axis=1)
        worst = int(np.argmax(per_pos))
        ok = e <= args.logits_rtol
        fails += not ok
        print(f"prompt logits [{logits.shape[0]}, {logits.shape[1]}]: rel err {e:.2e} "
              f"(limit {args.logits_rtol:g}, worst position {worst}): {'ok' if ok else 'FAIL'}")
    if args.expect_json:
        with open(args.expect_json) as f:
            lines = [ln for ln in f.read().splitlines() if ln.strip()]
        got = json.loads(lines[-1])["tokens"] if lines else None
        if not isinstance(got, list):
            print(f"FAIL: {args.expect_json} holds no {{\"tokens\": [...]}} line")
            return fails + 1
        n_cmp, note = 0, "all steps compared"
        for i, ref in enumerate(toks):
            if margins[i] <= args.margin_min:
                note = (f"stopped comparing at step {i}: reference margin {margins[i]:.2e} "
                        f"<= {args.margin_min:g}")
                break
            if i >= len(got):
                if got and got[-1] == model.eos:
                    note = f"stopped at step {i}: the run ended at eos {model.eos}"
                    break
                print(f"FAIL: the run gave {len(got)} tokens, expected {len(toks)}: {got}")
                return fails + 1
            if got[i] != ref:
                print(f"FAIL: greedy token {i} is {got[i]}, reference {ref} "
                      f"(margin {margins[i]:.3e})\n"
                      f"  got       {got}\n  reference {toks}")
                return fails + 1
            n_cmp += 1
        if len(got) > len(toks):
            print(f"FAIL: the run gave {len(got)} tokens, asked for {len(toks)}")
            return fails + 1
        print(f"greedy tokens: {n_cmp} of {len(toks)} equal ({note}; min margin "
              f"{min(margins[:max(n_cmp, 1)]):.2e})")
    return fails


def parse_ids(s):
    try:
        ids = [int(x) for x in s.split(",") if x.strip() != ""]
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad token id list {s!r}")
    if not ids:
        raise argparse.ArgumentTypeError("empty token id list")
    return ids


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model")
    ap.add_argument("--prompt-ids", type=parse_ids)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--out-logits")
    ap.add_argument("--expect-json")
    ap.add_argument("--expect-logits")
    ap.add_argument("--logits-rtol", type=float, default=1e-4)
    ap.add_argument("--margin-min", type=float, default=1e-3)
    ap.add_argument("--self-check", metavar="ORACLE_DIR")
    args = ap.parse_args()
    if args.self_check:
        fails = self_check(args.self_check)
        print("self-check:", "FAILED" if fails else "passed")
        return 1 if fails else 0
    if not args.model or not args.prompt_ids:
        ap.error("--model and --prompt-ids are required (or --self-check)")
    if args.max_tokens < 0:
        ap.error("--max-tokens must be >= 0")
    model = KDAModel(args.model)
    bad = [t for t in args.prompt_ids if not 0 <= t < model.vocab]
    if bad:
        ap.error(f"token ids out of range [0, {model.vocab}): {bad}")
    logits, toks, margins = model.generate(args.prompt_ids, args.max_tokens)
    if args.out_logits:
        np.save(args.out_logits, logits)
    print(json.dumps({"tokens": toks, "margins": margins}))
    sys.stdout.flush()
    if args.expect_json or args.expect_logits:
        return 1 if compare(args, model, args.prompt_ids, logits, toks, margins) else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
