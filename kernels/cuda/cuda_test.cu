// cuda_test.cu: the CUDA backend against the CPU reference backend and the oracle. Needs a
// GPU (run by tests/cuda/run_device.sh on the device machine, not a bazel test):
//   cuda_test ORACLE_DIR [quick | skinny | fused | prefill]
// ORACLE_DIR holds tiny/ and small/ (model/ and vectors.safetensors), like ../shared/oracle.
// `quick`: the random models only, fewer steps (for compute-sanitizer); `skinny`: the skinny
// GEMM's checks (f) alone, as in quick (for racecheck, too slow for the quick mode's models);
// `fused`: (g)'s conv + prepare cases alone, few steps, in plain stream order (for racecheck:
// its kernel filter failed with an internal error on the conv's kernels, so it checks them all);
// `prefill`: random models of K = 32, 64 and 128 (V = 48, 64, 128, 320) in each form of the prefill
// recurrence (kd_cu_prefill_form), few steps, in plain stream order (for racecheck: under it the quick
// mode's cuBLASLt table checks end in an internal error, "failed to handle a hardware exception").
// Exit: 0 all passed ("ALL CUDA CHECKS PASSED"), 1 a check failed, 2 no CUDA device or bad usage.
//
// (a) Random models in memory (several shapes: grouped value heads with V = 2K, K = V = 128,
//     no conv, conv of width 2 and 1, lower-bound gate, negative eigenvalues, tied
//     embeddings; bf16 / f16 / fp32 tensors mixed) run through the same calls on both
//     backends: state writes, batches of prefill and verify rows (random lengths, folds,
//     logits modes, odd row counts, a scratch row among them), commits with snapshots, in
//     each commit mode, fp32 and bf16 activations. Compared: logits of every batch (outputs
//     poisoned with NaN first), folded checkpoints, snapshots, committed states (per layer,
//     recurrent state and conv window apart, so that a failure points at an op), and the
//     state calls (hash, partial writes, copy, reset) on the GPU alone.
// (b) The oracle checkpoints: logits of every prompt position, greedy continuations through
//     T = 1 verify windows (deferred, eager, store-all), fp32 and bf16 activations; the same
//     greedy continuations through forward_sample replaying CUDA graphs (3 rows padded to 4).
// (c) Device sampling (forward_sample's kernels) against the reference kd_sample_batch_ref
//     on random logits (vocab 257 and 163840, ties planted): greedy exact; sampled rows exact
//     unless the reference, with the uniforms or top_p moved by 1e-9 relative, gives the
//     GPU's answer (a tie within rounding, counted and bounded).
// (d) CUDA graphs: decode steps of 1..8 rows (padded to 1, 2, 4, 8) on a backend replaying
//     graphs against one running eagerly: tokens, accepted counts and uniforms used equal.
// (e) The engine on the GPU against the engine on the CPU: a long randomized run (requests
//     joining, finishing and aborted, n-gram / caller / no drafts, greedy and sampled, stop
//     tokens), in each commit mode (eager with the prefix cache), and deferred with it too (the lazy
//     checkpoint under eager commits with snapshots): every request's tokens
//     and finish equal.
// (f) The skinny bf16 GEMM (gemv.cuh), every form, against a float64 reference: odd shapes,
//     padded leading dimensions, beta 0 and 1; the products it must refuse; the gate|up product
//     with SwiGLU in its epilogue (kd_cu_gemm_skinny_swiglu); the bf16 copy epilogue
//     (kd_cu_gemm_skinny_epi) against the C it stored, bit for bit.
// (g) Every slot's state read and written back before each forward (the conv history rings through
//     the export layout and back) against none: bf16 backends replaying graphs, single-token logits bit for bit, then
//     decode steps with every token and acceptance equal. The same for the L2 prefetch of
//     weights (kd_cuda_set_prefetch, each mode) in every forward against none, and for
//     f_proj.1 and g_proj.1 in one launch (kd_cuda_set_pair) against two, and for the gates' bf16
//     copy in the input projection's epilogue, the conv in f_proj.1 + g_proj.1's launch and the
//     conv of q and k in the KDA prepare's kernel (kd_cuda_set_fuse) against their own kernels, and
//     for gate|up and SwiGLU in one launch (kd_cuda_set_swiglu) against two;
//     that kernel (kd_cu_conv_prepare, with kd_cu_conv4 for the v channels; both of its forms, the
//     taps in registers and in shared memory) also alone against the conv and kd_kda_prepare, bit
//     for bit, on fresh random inputs of five head shapes.
//     The skinny kernel's pairs (kd_cu_gemm_skinny_pair), every form that pairs, against
//     float64 references.
// (h) The cuBLASLt products (gemm_lt.cuh) against a float64 reference: odd shapes, padded
//     leading dimensions, beta 0 and 1, and every shape of its table at both ends of its row
//     range with the table's algorithm (sampled outputs; no NaN left of the poison); its plans
//     kept once a shape, the oldest replaced past KD_LT_PLANS; the shapes it must refuse.
// (i) The prefill recurrence (kd_cu_prefill) in each form against a float64 recurrence: rows of
//     0 to 300 tokens (chunks of 8 and partial ones), grouped value heads, K = 32 / 64 / 128, V up
//     to 320, decays from 1e-30 to 1; the state's padding and the slots no row names untouched.
//     The random models of (a) run each form too (the default, 3; 0 and 1 on some shapes).
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <algorithm>
#include <deque>
#include <string>
#include <vector>

#include <xxhash.h>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "kd/backend.h"
#include "kernels/cuda/gemm_lt.cuh"
#include "kernels/cuda/gemv.cuh"
#include "kernels/cuda/kda.cuh"
#include "kernels/cuda/ops.cuh"
extern "C" {
#include "worker/engine.h"
#include "worker/model.h"
#include "worker/safetensors.h"
}

#include <map>

// ------------------------------------------------------------------------- reporting

static int g_checks, g_failed;
static bool g_plain_order; /* graph_case and random_case: GPU backends in plain stream order (kd_cuda_set_pdl 0) */

static bool report(bool ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool report(bool ok, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("%s ", ok ? "PASS" : "FAIL");
    vprintf(fmt, ap);
    printf("\n");
    fflush(stdout);
    va_end(ap);
    g_checks++;
    if (!ok) g_failed++;
    return ok;
}

static void note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void note(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("     ");
    vprintf(fmt, ap);
    printf("\n");
    fflush(stdout);
    va_end(ap);
}

// ||a - b|| / ||b||; infinite when a or b holds a NaN or infinity.
static double rel(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i]) || !isfinite(b[i])) return INFINITY;
        const double d = (double)a[i] - b[i];
        num += d * d, den += (double)b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static double rel_d(const float *a, const double *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i])) return INFINITY;
        const double d = (double)a[i] - b[i];
        num += d * d, den += b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static size_t first_nan(const float *a, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(a[i])) return i;
    return n;
}

static std::vector<float> poisoned(size_t n) { return std::vector<float>(n ? n : 1, NAN); }

// ------------------------------------------------------------------------------ rng

struct Rng {
    uint64_t s;
    explicit Rng(uint64_t seed) : s(seed ^ 0x9e3779b97f4a7c15ull) {}
    uint64_t next() {
        uint64_t z = (s += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
    }
    int uni(int n) { return (int)(next() % (uint64_t)n); } // [0, n)
    double u01() { return (double)(next() >> 11) * 0x1.0p-53; }
    double normal() {
        double u1 = u01(), u2 = u01();
        if (u1 < 1e-300) u1 = 1e-300;
        return sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2);
    }
};

// --------------------------------------------------------------------- random model

struct Spec {
    const char *name;
    int D, L, H, HV, K, V, W, conv, I, vocab;
    int lb;
    double lbv;
    int neg, tied, mixed; // mixed: some tensors fp32 / f16 instead of bf16
};

struct RandModel {
    kd_config c;
    kd_model_tensors w;
    std::vector<kd_layer_tensors> layers;
    std::deque<std::vector<unsigned char>> store;
};

enum Fill { NORMAL, ONE_PLUS, ALOG, DTBIAS };

static kd_tensor make(RandModel &m, Rng &r, kd_dtype dt, std::vector<int64_t> shape, Fill f, double scale) {
    kd_tensor t;
    memset(&t, 0, sizeof t);
    t.dtype = dt;
    t.ndim = (int32_t)shape.size();
    int64_t n = 1;
    for (size_t i = 0; i < shape.size(); i++) t.shape[i] = shape[i], n *= shape[i];
    m.store.emplace_back((size_t)n * kd_dtype_size(dt));
    unsigned char *p = m.store.back().data();
    for (int64_t i = 0; i < n; i++) {
        double x = 0;
        switch (f) {
        case NORMAL: x = scale * r.normal(); break;
        case ONE_PLUS: x = 1 + scale * r.normal(); break;
        case ALOG: x = log(1 + 15 * r.u01()); break;
        case DTBIAS: x = -2.3 - 4.6 * r.u01(); break;
        }
        if (dt == KD_F32) {
            float v = (float)x;
            memcpy(p + 4 * i, &v, 4);
        } else if (dt == KD_BF16) {
            uint16_t v = kd_f32_to_bf16((float)x);
            memcpy(p + 2 * i, &v, 2);
        } else {
            uint16_t v = kd_f32_to_f16((float)x);
            memcpy(p + 2 * i, &v, 2);
        }
    }
    t.data = p;
    return t;
}

static void build_model(RandModel &m, const Spec &s, uint64_t seed) {
    Rng r(seed);
    kd_config &c = m.c;
    memset(&c, 0, sizeof c);
    c.hidden = s.D, c.n_layers = s.L, c.n_heads = s.H, c.n_v_heads = s.HV, c.head_k = s.K, c.head_v = s.V;
    c.conv_size = s.W, c.use_short_conv = s.conv, c.intermediate = s.I, c.vocab = s.vocab, c.norm_eps = 1e-6;
    c.use_lower_bound = s.lb, c.lower_bound = s.lbv, c.allow_neg_eigval = s.neg, c.tie_embeddings = s.tied;
    const int64_t D = s.D, QK = (int64_t)s.H * s.K, VD = (int64_t)s.HV * s.V, K = s.K, V = s.V, HV = s.HV;
    const kd_dtype B = KD_BF16, F = KD_F32, alt = s.mixed ? KD_F32 : KD_BF16, alt16 = s.mixed ? KD_F16 : KD_BF16;
    const double sd = 1 / sqrt((double)D);
    m.layers.resize((size_t)s.L);
    for (int l = 0; l < s.L; l++) {
        kd_layer_tensors &t = m.layers[(size_t)l];
        memset(&t, 0, sizeof t);
        t.attn_norm = make(m, r, B, {D}, ONE_PLUS, 0.1);
        t.q_proj = make(m, r, B, {QK, D}, NORMAL, sd);
        t.k_proj = make(m, r, B, {QK, D}, NORMAL, sd);
        t.v_proj = make(m, r, alt, {VD, D}, NORMAL, sd);
        if (s.conv) {
            t.q_conv = make(m, r, B, {QK, 1, s.W}, NORMAL, 0.5);
            t.k_conv = make(m, r, B, {QK, 1, s.W}, NORMAL, 0.5);
            t.v_conv = make(m, r, alt, {VD, 1, s.W}, NORMAL, 0.5);
        }
        t.f_proj0 = make(m, r, B, {V, D}, NORMAL, sd);
        t.f_proj1 = make(m, r, B, {HV * K, V}, NORMAL, 1 / sqrt((double)V));
        t.b_proj = make(m, r, B, {HV, D}, NORMAL, sd);
        t.A_log = make(m, r, F, {HV}, ALOG, 0);
        t.dt_bias = make(m, r, F, {HV * K}, DTBIAS, 0);
        t.g_proj0 = make(m, r, B, {V, D}, NORMAL, sd);
        t.g_proj1 = make(m, r, B, {VD, V}, NORMAL, 1 / sqrt((double)V));
        t.g_proj1_bias = make(m, r, alt, {VD}, NORMAL, 0.5);
        t.o_norm = make(m, r, alt16, {V}, ONE_PLUS, 0.1);
        t.o_proj = make(m, r, B, {D, VD}, NORMAL, 1 / sqrt((double)VD));
        t.mlp_norm = make(m, r, alt16, {D}, ONE_PLUS, 0.1);
        t.gate_proj = make(m, r, B, {s.I, D}, NORMAL, sd);
        t.up_proj = make(m, r, B, {s.I, D}, NORMAL, sd);
        t.down_proj = make(m, r, B, {D, s.I}, NORMAL, 1 / sqrt((double)s.I));
    }
    memset(&m.w, 0, sizeof m.w);
    m.w.embed = make(m, r, B, {s.vocab, D}, NORMAL, 1.0);
    m.w.final_norm = make(m, r, B, {D}, ONE_PLUS, 0.1);
    if (!s.tied) m.w.lm_head = make(m, r, alt, {s.vocab, D}, NORMAL, sd);
    m.w.n_layers = s.L;
    m.w.layers = m.layers.data();
}

// ------------------------------------------------------------------ backend pairs

struct Pair {
    kd_backend *cpu = nullptr, *gpu = nullptr;
    std::string label;
    size_t sb = 0;  // state bytes
    int32_t vocab = 0;
    kd_config c;
    double tol_l = 0, tol_s = 0;
};

static const char *act_name(int bf) { return bf ? "bf16" : "fp32"; }

static std::string row_desc(const kd_batch_row &r, int32_t scratch) {
    char buf[96];
    char slot[16];
    if (r.slot == scratch) snprintf(slot, sizeof slot, "scratch");
    else snprintf(slot, sizeof slot, "s%d", r.slot);
    if (r.kind == KD_ROW_VERIFY) snprintf(buf, sizeof buf, "v%d/f%d@%s", r.n_tokens, r.fold, slot);
    else snprintf(buf, sizeof buf, "p%d@%s", r.n_tokens, slot);
    std::string s = buf;
    s += r.logits == KD_LOGITS_ALL ? ":all" : r.logits == KD_LOGITS_LAST ? ":last" : ":none";
    return s;
}

// Committed states of a slot on both backends (or checkpoints with `checkpoint`), compared
// whole and per layer (recurrent state, conv window).
static bool compare_states(Pair &p, int32_t slot, const char *what, bool checkpoint) {
    std::vector<float> a(p.sb / 4), b(p.sb / 4);
    kd_err err;
    int rc = checkpoint ? kd_backend_checkpoint_read(p.gpu, slot, a.data(), p.sb, &err)
                        : kd_backend_state_read(p.gpu, slot, a.data(), p.sb, &err);
    if (rc) return report(false, "%s %s slot %d: gpu read: %s", p.label.c_str(), what, slot, err.msg);
    rc = checkpoint ? kd_backend_checkpoint_read(p.cpu, slot, b.data(), p.sb, &err)
                    : kd_backend_state_read(p.cpu, slot, b.data(), p.sb, &err);
    if (rc) return report(false, "%s %s slot %d: cpu read: %s", p.label.c_str(), what, slot, err.msg);
    const double e = rel(a.data(), b.data(), a.size());
    const bool ok = e < p.tol_s;
    report(ok, "%s %s slot %d: state rel err %.3e (tol %.0e)", p.label.c_str(), what, slot, e, p.tol_s);
    if (!ok) {
        const kd_state_layout &L = p.gpu->layout;
        for (int32_t l = 0; l < p.c.n_layers; l++) {
            const size_t o = (size_t)l * L.layer_elems;
            const double es = rel(a.data() + o, b.data() + o, (size_t)L.ssm_elems);
            const double ec = L.conv_elems ? rel(a.data() + o + L.ssm_elems, b.data() + o + L.ssm_elems, (size_t)L.conv_elems) : 0;
            const size_t nan = first_nan(a.data() + o, (size_t)L.layer_elems);
            note("layer %d: ssm rel err %.3e, conv window rel err %.3e%s", l, es, ec,
                 nan < (size_t)L.layer_elems ? " (non-finite values on the gpu)" : "");
            // the first few worst elements of the layer's recurrent state: [h][c][j]
            const int64_t K = p.c.head_k, V = p.c.head_v;
            size_t worst = 0;
            double wd = -1;
            for (int64_t i = 0; i < L.ssm_elems; i++) {
                double d = fabs((double)a[o + i] - b[o + i]);
                if (!(d <= wd)) wd = d, worst = (size_t)i;
            }
            note("  worst ssm element h=%lld c=%lld j=%lld: gpu %.6g cpu %.6g", (long long)(worst / (K * V)),
                 (long long)(worst / V % K), (long long)(worst % V), a[o + worst], b[o + worst]);
            if (L.conv_elems) {
                const int64_t Hw = p.c.conv_size - 1;
                wd = -1, worst = 0;
                for (int64_t i = 0; i < L.conv_elems; i++) {
                    double d = fabs((double)a[o + L.ssm_elems + i] - b[o + L.ssm_elems + i]);
                    if (!(d <= wd)) wd = d, worst = (size_t)i;
                }
                note("  worst conv element channel %lld tap %lld: gpu %.6g cpu %.6g", (long long)(worst / Hw),
                     (long long)(worst % Hw), a[o + L.ssm_elems + worst], b[o + L.ssm_elems + worst]);
            }
        }
    }
    return ok;
}

// Logits of one batch: whole and per logit row; the worst row named.
static bool compare_logits(Pair &p, const char *what, const kd_batch &b, const float *g, const float *c) {
    const int64_t M = kd_batch_logit_rows(&b);
    if (M == 0) return true;
    const size_t V = (size_t)p.vocab;
    const double whole = rel(g, c, (size_t)M * V);
    double worst = 0;
    int64_t m = 0, wm = 0;
    int wr = 0, wpos = 0;
    for (int32_t r = 0; r < b.n_rows; r++) {
        const kd_batch_row &row = b.rows[r];
        if (row.logits == KD_LOGITS_NONE) continue;
        for (int32_t t = row.logits == KD_LOGITS_ALL ? 0 : row.n_tokens - 1; t < row.n_tokens; t++, m++) {
            const double e = rel(g + m * V, c + m * V, V);
            if (!(e <= worst)) worst = e, wm = m, wr = r, wpos = t;
        }
    }
    std::string rows;
    for (int32_t r = 0; r < b.n_rows; r++) rows += (r ? " " : "") + row_desc(b.rows[r], p.gpu->n_slots);
    const bool ok = whole < p.tol_l && worst < 3 * p.tol_l;
    report(ok, "%s %s [%s]: logits rel err %.3e, worst row %d pos %d: %.3e (tol %.0e)", p.label.c_str(), what,
           rows.c_str(), whole, wr, wpos, worst, p.tol_l);
    if (!ok) {
        const size_t nan = first_nan(g, (size_t)M * V);
        if (nan < (size_t)M * V) note("first non-finite gpu logit: logit row %zu, column %zu", nan / V, nan % V);
        note("worst logit row %lld: gpu[0..3] %.6g %.6g %.6g %.6g | cpu %.6g %.6g %.6g %.6g", (long long)wm,
             g[wm * V], g[wm * V + 1 % V], g[wm * V + 2 % V], g[wm * V + 3 % V], c[wm * V], c[wm * V + 1 % V],
             c[wm * V + 2 % V], c[wm * V + 3 % V]);
    }
    return ok;
}

static bool forward_both(Pair &p, const char *what, const kd_batch &b, std::vector<float> &lg, std::vector<float> &lc) {
    const size_t n = (size_t)kd_batch_logit_rows(&b) * (size_t)p.vocab;
    lg = poisoned(n), lc = poisoned(n);
    kd_err err;
    if (kd_backend_forward(p.cpu, &b, lc.data(), &err))
        return report(false, "%s %s: cpu forward: %s", p.label.c_str(), what, err.msg);
    if (kd_backend_forward(p.gpu, &b, lg.data(), &err))
        return report(false, "%s %s: gpu forward: %s", p.label.c_str(), what, err.msg);
    return compare_logits(p, what, b, lg.data(), lc.data());
}

static bool commit_both(Pair &p, int32_t slot, int32_t n, int32_t snap_at, const char *what) {
    std::vector<float> sg = poisoned(p.sb / 4), sc = poisoned(p.sb / 4);
    kd_err err;
    if (kd_backend_commit(p.cpu, slot, n, snap_at, snap_at ? sc.data() : nullptr, &err))
        return report(false, "%s %s: cpu commit: %s", p.label.c_str(), what, err.msg);
    if (kd_backend_commit(p.gpu, slot, n, snap_at, snap_at ? sg.data() : nullptr, &err))
        return report(false, "%s %s: gpu commit: %s", p.label.c_str(), what, err.msg);
    bool ok = true;
    if (snap_at) {
        const double e = rel(sg.data(), sc.data(), sg.size());
        ok = report(e < p.tol_s, "%s %s slot %d: commit %d snapshot at %d rel err %.3e (tol %.0e)", p.label.c_str(),
                    what, slot, n, snap_at, e, p.tol_s);
    }
    char buf[128];
    snprintf(buf, sizeof buf, "%s commit %d (snapshot %d)", what, n, snap_at);
    return compare_states(p, slot, buf, false) && ok;
}

// The state calls on the GPU alone: hash vs XXH3 of the read bytes, partial writes, copy, reset.
static void state_api_checks(Pair &p, Rng &r) {
    kd_backend *g = p.gpu;
    const size_t sb = p.sb;
    std::vector<unsigned char> a(sb), b(sb);
    kd_err err;
    bool ok = kd_backend_state_read(g, 0, a.data(), sb, &err) == 0;
    uint64_t h = 0;
    ok = ok && kd_backend_state_hash(g, 0, 0, sb, &h, &err) == 0;
    report(ok && h == XXH3_64bits(a.data(), sb), "%s state_hash whole slot == XXH3 of state_read%s%s", p.label.c_str(),
           ok ? "" : ": ", ok ? "" : err.msg);
    for (int i = 0; i < 4; i++) {
        size_t off = (size_t)(r.next() % sb), len = (size_t)(r.next() % (sb - off + 1));
        ok = kd_backend_state_hash(g, 0, off, len, &h, &err) == 0;
        report(ok && h == XXH3_64bits(a.data() + off, len), "%s state_hash bytes [%zu, +%zu) == XXH3", p.label.c_str(),
               off, len);
    }
    // partial writes in uneven chunks, then read back bitwise
    for (size_t i = 0; i < sb / 4; i++) { // finite floats
        float f = (float)r.normal();
        memcpy(&b[4 * i], &f, 4);
    }
    ok = true;
    for (size_t off = 0; off < sb && ok;) {
        size_t len = 1 + (size_t)(r.next() % (sb / 3 + 1));
        if (len > sb - off) len = sb - off;
        ok = kd_backend_state_write_part(g, 1, off, b.data() + off, len, &err) == 0;
        off += len;
    }
    std::vector<unsigned char> c(sb);
    ok = ok && kd_backend_state_read(g, 1, c.data(), sb, &err) == 0;
    report(ok && !memcmp(b.data(), c.data(), sb), "%s state_write_part in chunks, read back bitwise", p.label.c_str());
    ok = kd_backend_state_copy(g, 2, 1, &err) == 0 && kd_backend_state_read(g, 2, c.data(), sb, &err) == 0;
    report(ok && !memcmp(b.data(), c.data(), sb), "%s state_copy slot 1 -> 2 bitwise", p.label.c_str());
    ok = kd_backend_state_read(g, 0, c.data(), sb, &err) == 0;
    report(ok && !memcmp(a.data(), c.data(), sb), "%s slot 0 untouched by writes to slots 1, 2", p.label.c_str());
    ok = kd_backend_reset_slot(g, 2, &err) == 0 && kd_backend_state_read(g, 2, c.data(), sb, &err) == 0;
    bool zero = ok;
    for (size_t i = 0; i < sb && zero; i++) zero = c[i] == 0;
    report(zero, "%s reset_slot zeroes the state", p.label.c_str());
    ok = kd_backend_state_read(g, 1, c.data(), sb, &err) == 0;
    report(ok && !memcmp(b.data(), c.data(), sb), "%s reset of slot 2 leaves slot 1", p.label.c_str());
    ok = g->ops->synchronize(g, &err) == 0;
    report(ok, "%s synchronize%s%s", p.label.c_str(), ok ? "" : ": ", ok ? "" : err.msg);
}

static void random_case(const Spec &s, int bf, kd_commit_mode mode, uint64_t seed, int steps, const char *tag = "") {
    RandModel m;
    build_model(m, s, seed);
    Pair p;
    char lab[160];
    snprintf(lab, sizeof lab, "[%s %s %s%s]", s.name, act_name(bf), kd_commit_mode_name(mode), tag);
    p.label = lab;
    p.c = m.c;
    p.vocab = m.c.vocab;
    p.tol_l = bf ? 2e-2 : 1e-4;
    p.tol_s = bf ? 5e-2 : 1e-5;
    kd_err err;
    const int32_t NS = 5, ROWS = 7, TW = 8;
    const int64_t TOK = 320;
    const int ks_nb = 2 + (int)(seed / 1000 % 2);
    p.cpu = kd_cpu_backend_create(0, &err);
    if (!p.cpu) {
        report(false, "%s cpu backend: %s", lab, err.msg);
        return;
    }
    p.gpu = kd_cuda_backend_create(bf, &err);
    if (!p.gpu) {
        report(false, "%s cuda backend create: %s", lab, err.msg);
        kd_backend_free(p.cpu);
        return;
    }
    bool ok = kd_backend_load(p.cpu, &m.c, &m.w, &err) == 0 &&
              kd_backend_reserve(p.cpu, NS, ROWS, TOK, TW, mode, &err) == 0;
    if (!report(ok, "%s cpu load + reserve%s%s", lab, ok ? "" : ": ", ok ? "" : err.msg)) goto done;
    /* the conv + prepare kernel at every row count where it applies (by default only from 4 rows); bf16: o_proj
     * and the down projection in 2 or 3 K slices at every row count where cuBLAS takes them (kd_cuda_set_ksplit;
     * a width that does not divide runs whole into the slices' buffer, one block), with 3 slices cuBLAS for
     * every product (the skinny kernel off) and gate|up's output in fp32 (kd_cuda_set_gu_bf16 0), with 2 in
     * bf16 (the default) */
    ok = kd_backend_load(p.gpu, &m.c, &m.w, &err) == 0 &&
         kd_backend_reserve(p.gpu, NS, ROWS, TOK, TW, mode, &err) == 0 &&
         kd_cuda_set_conv_prep(p.gpu, 1) == 0 &&
         (!bf || (kd_cuda_set_ksplit(p.gpu, ks_nb, 1, 512) == 0 && kd_cuda_set_skinny(p.gpu, ks_nb == 2) == 0 &&
                  kd_cuda_set_gu_bf16(p.gpu, ks_nb == 2) == 0)) &&
         (!g_plain_order || kd_cuda_set_pdl(p.gpu, 0) == 0);
    if (!report(ok, "%s gpu load + reserve (D=%d L=%d H=%d HV=%d K=%d V=%d conv=%d W=%d I=%d vocab=%d lb=%d neg=%d tied=%d)%s%s",
                lab, s.D, s.L, s.H, s.HV, s.K, s.V, s.conv, s.W, s.I, s.vocab, s.lb, s.neg, s.tied, ok ? "" : ": ",
                ok ? "" : err.msg))
        goto done;
    p.sb = kd_backend_state_bytes(p.gpu);
    if (!report(p.sb == kd_backend_state_bytes(p.cpu) && p.gpu->state_dtype == KD_F32,
                "%s state bytes %zu (cpu %zu), state dtype f32", lab, p.sb, kd_backend_state_bytes(p.cpu)))
        goto done;
    {
        Rng r(seed * 7919 + (uint64_t)mode * 31 + (uint64_t)bf);
        const kd_state_layout &L = p.gpu->layout;
        // random committed states, the same on both; read back bitwise
        for (int32_t slot = 0; slot < NS; slot++) {
            std::vector<float> st((size_t)L.slot_elems), back((size_t)L.slot_elems);
            for (int32_t l = 0; l < m.c.n_layers; l++) {
                float *o = st.data() + (size_t)l * L.layer_elems;
                for (int64_t i = 0; i < L.ssm_elems; i++) o[i] = (float)(0.2 * r.normal());
                for (int64_t i = 0; i < L.conv_elems; i++) o[L.ssm_elems + i] = (float)r.normal();
            }
            ok = kd_backend_state_write(p.cpu, slot, st.data(), p.sb, &err) == 0 &&
                 kd_backend_state_write(p.gpu, slot, st.data(), p.sb, &err) == 0 &&
                 kd_backend_state_read(p.gpu, slot, back.data(), p.sb, &err) == 0;
            report(ok && !memcmp(st.data(), back.data(), p.sb), "%s state_write + state_read slot %d bitwise%s%s", lab,
                   slot, ok ? "" : ": ", ok ? "" : err.msg);
        }
        std::vector<int32_t> recorded(NS, 0), accepted(NS, 0);
        std::vector<float> lg, lc;
        for (int step = 0; step < steps; step++) {
            // rows: an odd number of slots in random order, a scratch row now and then
            std::vector<int32_t> order(NS);
            for (int i = 0; i < NS; i++) order[i] = i;
            for (int i = NS - 1; i > 0; i--) std::swap(order[i], order[r.uni(i + 1)]);
            const int nr = step == 0 ? NS : 1 + 2 * r.uni(3); // 1, 3, 5
            std::vector<kd_batch_row> rows;
            std::vector<int32_t> tok;
            for (int i = 0; i < nr; i++) {
                kd_batch_row row;
                memset(&row, 0, sizeof row);
                row.slot = order[i];
                const bool verify = step > 0 && (recorded[row.slot] > 0 || r.uni(3) != 0);
                if (verify) {
                    row.kind = KD_ROW_VERIFY;
                    row.n_tokens = 1 + r.uni(TW);
                    row.fold = recorded[row.slot] > 0 ? accepted[row.slot] : 0;
                } else {
                    row.kind = KD_ROW_PREFILL;
                    static const int first[NS] = {1, 7, 13, 2, 31};
                    row.n_tokens = step == 0 ? first[i] : 1 + r.uni(12);
                }
                row.logits = r.uni(3);
                rows.push_back(row);
            }
            if (r.uni(2) == 0) { // the scratch row (padding): garbage, no logits
                kd_batch_row row;
                memset(&row, 0, sizeof row);
                row.slot = NS, row.n_tokens = 1 + r.uni(TW), row.logits = KD_LOGITS_NONE;
                row.kind = r.uni(2) ? KD_ROW_VERIFY : KD_ROW_PREFILL;
                rows.insert(rows.begin() + r.uni((int)rows.size() + 1), row);
            }
            for (const kd_batch_row &row : rows)
                for (int i = 0; i < row.n_tokens; i++) tok.push_back(r.uni(p.vocab));
            kd_batch b;
            b.n_rows = (int32_t)rows.size(), b.rows = rows.data(), b.tokens = tok.data();
            char what[64];
            snprintf(what, sizeof what, "step %d", step);
            forward_both(p, what, b, lg, lc);
            for (const kd_batch_row &row : rows) {
                if (row.slot == NS) continue;
                if (row.kind == KD_ROW_VERIFY) {
                    /* a verify that kept its folded state (the lazy checkpoint: kd_cuda_held) left its
                     * checkpoint as it was; its tokens are compared at the next commit or written checkpoint */
                    if (row.fold > 0 && mode != KD_COMMIT_STORE_ALL && kd_cuda_held(p.gpu, row.slot) == 0) {
                        snprintf(what, sizeof what, "step %d folded checkpoint (fold %d)", step, row.fold);
                        compare_states(p, row.slot, what, true);
                    }
                    recorded[row.slot] = row.n_tokens;
                    accepted[row.slot] = 1 + r.uni(row.n_tokens);
                } else {
                    recorded[row.slot] = 0;
                    snprintf(what, sizeof what, "step %d after prefill", step);
                    compare_states(p, row.slot, what, false);
                }
            }
            // commits: always in eager mode, now and then otherwise (the rest fold next time)
            for (int32_t slot = 0; slot < NS; slot++) {
                if (!recorded[slot] || (mode != KD_COMMIT_EAGER && r.uni(3) != 0)) continue;
                const int32_t n = accepted[slot], snap = r.uni(n + 1);
                snprintf(what, sizeof what, "step %d", step);
                commit_both(p, slot, n, snap, what);
                recorded[slot] = 0;
            }
        }
        for (int32_t slot = 0; slot < NS; slot++) {
            if (recorded[slot]) commit_both(p, slot, accepted[slot], 0, "final");
            else compare_states(p, slot, "final", false);
            recorded[slot] = 0;
        }
        // a long prefill with every logit: the head GEMM in several chunks
        {
            kd_batch_row row;
            memset(&row, 0, sizeof row);
            row.slot = 4, row.n_tokens = 300, row.logits = KD_LOGITS_ALL, row.kind = KD_ROW_PREFILL;
            std::vector<int32_t> tok(300);
            for (auto &t : tok) t = r.uni(p.vocab);
            kd_batch b;
            b.n_rows = 1, b.rows = &row, b.tokens = tok.data();
            ok = kd_backend_reset_slot(p.cpu, 4, &err) == 0 && kd_backend_reset_slot(p.gpu, 4, &err) == 0;
            report(ok, "%s reset_slot 4 on both", lab);
            forward_both(p, "long prefill from zero", b, lg, lc);
            compare_states(p, 4, "after long prefill", false);
        }
        /* the forwards of more than 32 tokens ran f_proj.1 and g_proj.1 as one batched cuBLAS
         * launch where their shapes match (bf16, K = V); compared with the CPU above */
        const int64_t nb = kd_cuda_pair_batched(p.gpu);
        report(bf && s.K == s.V ? nb > 0 : nb == 0, "%s f_proj.1 + g_proj.1 batched cuBLAS launches: %lld", lab,
               (long long)nb);
        /* bf16: the products in K slices where their widths divide (else whole, into one block), compared with
         * the CPU above */
        auto divides = [&](int64_t w) { return w % ks_nb == 0 && w / ks_nb % 8 == 0; };
        const bool sliced = bf && s.D <= 8192 && (divides((int64_t)s.HV * s.V) || (s.L > 1 && divides(s.I)));
        const int64_t nks = kd_cuda_ksplit_launches(p.gpu);
        report(sliced ? nks > 0 : nks == 0, "%s products in %d K slices: %lld", lab, ks_nb, (long long)nks);
        state_api_checks(p, r);
    }
done:
    kd_backend_free(p.gpu);
    kd_backend_free(p.cpu);
}

/* The K slices' default range (kd_cuda_set_ksplit untouched): a bf16 backend runs o_proj (and the down
 * projection but the last layer's) in K slices in forwards of 5..128 tokens and whole outside them, where
 * the skinny kernel does not take them (products of more than 256 keys, as the 48B preset's: spec I); every
 * forward's logits and states compared with the CPU. The random cases above set the range themselves
 * (1..512), so this is the one check that the defaults reach the sliced path where they were measured to
 * pay. */
static void ksplit_default_case(const Spec &s, uint64_t seed) {
    RandModel m;
    build_model(m, s, seed);
    Pair p;
    char lab[160];
    snprintf(lab, sizeof lab, "[%s bf16 default K slices]", s.name);
    p.label = lab;
    p.c = m.c;
    p.vocab = m.c.vocab;
    p.tol_l = 2e-2;
    p.tol_s = 5e-2;
    kd_err err;
    const int32_t NS = 6;
    p.cpu = kd_cpu_backend_create(0, &err);
    p.gpu = p.cpu ? kd_cuda_backend_create(1, &err) : nullptr;
    bool ok = p.cpu && p.gpu && kd_backend_load(p.cpu, &m.c, &m.w, &err) == 0 &&
              kd_backend_reserve(p.cpu, NS, 1, 256, 4, KD_COMMIT_DEFERRED, &err) == 0 &&
              kd_backend_load(p.gpu, &m.c, &m.w, &err) == 0 &&
              kd_backend_reserve(p.gpu, NS, 1, 256, 4, KD_COMMIT_DEFERRED, &err) == 0;
    if (report(ok, "%s two backends%s%s", lab, ok ? "" : ": ", ok ? "" : err.msg)) {
        p.sb = kd_backend_state_bytes(p.gpu);
        Rng r(seed * 13 + 5);
        const int32_t counts[NS] = {4, 5, 8, 15, 128, 129};
        for (int32_t i = 0; i < NS; i++) {
            kd_batch_row row;
            memset(&row, 0, sizeof row);
            row.slot = i, row.n_tokens = counts[i], row.logits = KD_LOGITS_LAST, row.kind = KD_ROW_PREFILL;
            std::vector<int32_t> tok((size_t)counts[i]);
            for (auto &t : tok) t = r.uni(p.vocab);
            kd_batch b;
            b.n_rows = 1, b.rows = &row, b.tokens = tok.data();
            char what[64];
            snprintf(what, sizeof what, "prefill of %d tokens", counts[i]);
            std::vector<float> lg, lc;
            const int64_t before = kd_cuda_ksplit_launches(p.gpu);
            forward_both(p, what, b, lg, lc);
            compare_states(p, i, what, false);
            const int64_t ran = kd_cuda_ksplit_launches(p.gpu) - before;
            const bool want = counts[i] >= 5 && counts[i] <= 128;
            report(want ? ran > 0 : ran == 0, "%s %s: %lld products in K slices (%s)", lab, what, (long long)ran,
                   want ? "the default's range, 5..128 tokens" : "outside the default's range: none");
        }
    }
    kd_backend_free(p.gpu);
    kd_backend_free(p.cpu);
}

// ----------------------------------------------------------------------------- oracle

static std::vector<int32_t> ints(const kd_st_file *f, const char *name) {
    std::vector<int32_t> v;
    const kd_st_entry *e = kd_st_find(f, name);
    if (!e) return v;
    const int64_t n = kd_tensor_numel(&e->t);
    for (int64_t i = 0; i < n; i++) v.push_back((int32_t)kd_tensor_get_f64(&e->t, i));
    return v;
}

static int32_t argmax(const float *x, int32_t n) {
    int32_t best = 0;
    for (int32_t j = 1; j < n; j++)
        if (x[j] > x[best]) best = j;
    return best;
}

static void oracle_case(const char *dir, const char *name, int bf, kd_commit_mode mode, bool logits) {
    char path[2048], lab[96];
    snprintf(lab, sizeof lab, "[oracle %s %s %s]", name, act_name(bf), kd_commit_mode_name(mode));
    kd_err err;
    snprintf(path, sizeof path, "%s/%s/model", dir, name);
    kd_model *m = kd_model_open(path, &err);
    if (!report(m != nullptr, "%s open %s%s%s", lab, path, m ? "" : ": ", m ? "" : err.msg)) return;
    snprintf(path, sizeof path, "%s/%s/vectors.safetensors", dir, name);
    kd_st_file *vec = kd_st_open(path, &err);
    if (!report(vec != nullptr, "%s open %s%s%s", lab, path, vec ? "" : ": ", vec ? "" : err.msg)) {
        kd_model_close(m);
        return;
    }
    kd_backend *g = kd_cuda_backend_create(bf, &err);
    bool ok = g && kd_backend_load(g, &m->config, &m->tensors, &err) == 0 &&
              kd_backend_reserve(g, 1, 1, 256, 8, mode, &err) == 0;
    if (report(ok, "%s backend create + load + reserve%s%s", lab, ok ? "" : ": ", ok ? "" : err.msg)) {
        const int32_t V = m->config.vocab;
        for (int pr = 0; pr < 3; pr++) {
            char key[64];
            snprintf(key, sizeof key, "prompt%d.tokens", pr);
            std::vector<int32_t> tok = ints(vec, key);
            snprintf(key, sizeof key, "prompt%d.greedy", pr);
            std::vector<int32_t> greedy = ints(vec, key);
            snprintf(key, sizeof key, "prompt%d.logits", pr);
            const kd_st_entry *le = kd_st_find(vec, key);
            const int64_t n = (int64_t)tok.size();
            if (!report(n > 0 && !greedy.empty() && le && kd_tensor_numel(&le->t) == n * V, "%s prompt%d vectors present",
                        lab, pr))
                continue;
            std::vector<double> ref((size_t)(n * V));
            kd_tensor_to_f64(&le->t, 0, n * V, ref.data());
            std::vector<float> lg = poisoned((size_t)(n * V));
            kd_batch_row row;
            memset(&row, 0, sizeof row);
            row.slot = 0, row.n_tokens = (int32_t)n, row.logits = KD_LOGITS_ALL, row.kind = KD_ROW_PREFILL;
            kd_batch b;
            b.n_rows = 1, b.rows = &row, b.tokens = tok.data();
            ok = kd_backend_reset_slot(g, 0, &err) == 0 && kd_backend_forward(g, &b, lg.data(), &err) == 0;
            if (!report(ok, "%s prompt%d prefill forward%s%s", lab, pr, ok ? "" : ": ", ok ? "" : err.msg)) continue;
            if (logits) {
                const double tol = bf ? 1e-2 : 1e-4;
                const double e = rel_d(lg.data(), ref.data(), (size_t)(n * V));
                double worst = 0;
                int64_t wt = 0;
                for (int64_t t = 0; t < n; t++) {
                    const double et = rel_d(lg.data() + t * V, ref.data() + t * V, (size_t)V);
                    if (!(et <= worst)) worst = et, wt = t;
                }
                report(e < tol && worst < 3 * tol,
                       "%s prompt%d (%lld tokens): logits rel err %.3e, worst position %lld: %.3e (tol %.0e, per position %.0e)",
                       lab, pr, (long long)n, e, (long long)wt, worst, tol, 3 * tol);
            }
            // greedy continuation through T = 1 verify windows
            int32_t best = argmax(lg.data() + (n - 1) * V, V), agree = 0, first_bad = -1;
            std::vector<float> one = poisoned((size_t)V);
            for (size_t i = 0; i < greedy.size(); i++) {
                if (best == greedy[i]) agree++;
                else if (first_bad < 0) first_bad = (int32_t)i;
                if (i + 1 == greedy.size()) break;
                kd_batch_row v;
                memset(&v, 0, sizeof v);
                v.slot = 0, v.n_tokens = 1, v.logits = KD_LOGITS_LAST, v.kind = KD_ROW_VERIFY;
                v.fold = (i > 0 && mode != KD_COMMIT_EAGER) ? 1 : 0;
                kd_batch vb;
                vb.n_rows = 1, vb.rows = &v, vb.tokens = &best;
                std::fill(one.begin(), one.end(), NAN);
                ok = kd_backend_forward(g, &vb, one.data(), &err) == 0;
                if (ok && mode == KD_COMMIT_EAGER) ok = kd_backend_commit(g, 0, 1, 0, nullptr, &err) == 0;
                if (!ok) {
                    report(false, "%s prompt%d greedy step %zu: %s", lab, pr, i, err.msg);
                    break;
                }
                best = argmax(one.data(), V);
            }
            if (bf)
                note("%s prompt%d: bf16 greedy agrees with the oracle on %d of %zu tokens (informational)", lab, pr, agree,
                     greedy.size());
            else
                report(agree == (int32_t)greedy.size(), "%s prompt%d: greedy %d/%zu tokens exact%s", lab, pr, agree,
                       greedy.size(), first_bad >= 0 ? " (first mismatch at step shown below)" : "");
            if (!bf && first_bad >= 0) note("first greedy mismatch at step %d", first_bad);
        }
    }
    kd_backend_free(g);
    kd_st_close(vec);
    kd_model_close(m);
}

// ------------------------------------------------------------------- device sampling

static kd_backend *sampling_backend(RandModel &m, int32_t vocab, int32_t rows, int32_t tw, uint64_t seed) {
    const Spec sp = {"sampling", 32, 1, 1, 1, 32, 32, 4, 1, 32, vocab, 0, 0, 0, 0, 0};
    build_model(m, sp, seed);
    kd_err err;
    kd_backend *g = kd_cuda_backend_create(0, &err);
    if (!g || kd_backend_load(g, &m.c, &m.w, &err) ||
        kd_backend_reserve(g, rows, rows, (int64_t)rows * tw, tw, KD_COMMIT_DEFERRED, &err)) {
        report(false, "sampling backend (vocab %d): %s", vocab, err.msg);
        kd_backend_free(g);
        return nullptr;
    }
    return g;
}

// The reference on one row, with the row's uniforms scaled by fu and top_p by fp.
static void ref_row(const kd_batch &b, int32_t r, const std::vector<float> &lg, int64_t m0, int32_t V, int32_t tw,
                    kd_sample_params p, const double *u, double fu, double fp, std::vector<double> &probs,
                    std::vector<int32_t> &order, int32_t *tok, int32_t *acc, int32_t *used) {
    kd_batch one;
    int64_t t0 = 0;
    for (int32_t q = 0; q < r; q++) t0 += b.rows[q].n_tokens;
    kd_batch_row row = b.rows[r];
    row.slot = 0;
    one.n_rows = 1, one.rows = &row, one.tokens = b.tokens + t0;
    std::vector<double> uu(tw);
    for (int32_t i = 0; i < tw; i++) uu[i] = std::min(u[i] * fu, 0.9999999999999999);
    p.top_p = std::min(1.0, p.top_p * fp);
    kd_sample_batch_ref(&one, lg.data() + m0 * V, V, tw, &p, uu.data(), probs.data(), order.data(), tok, acc, used);
}

static void sampling_case(int32_t V, uint64_t seed, int rounds) {
    const int32_t R = 40, TW = 8;
    RandModel m;
    kd_backend *g = sampling_backend(m, V, R, TW, seed);
    if (!g) return;
    Rng r(seed);
    std::vector<double> probs(V), pr(V);
    std::vector<int32_t> order(V);
    int64_t rows_checked = 0, greedy_rows = 0, sampled_rows = 0, ties = 0, accepted = 0, drafts = 0, bad = 0;
    for (int round = 0; round < rounds; round++) {
        std::vector<kd_batch_row> rows;
        std::vector<kd_sample_params> params;
        std::vector<double> uni;
        for (int32_t i = 0; i < R; i++) {
            kd_batch_row row;
            memset(&row, 0, sizeof row);
            row.slot = i;
            const int kind = r.uni(8);
            row.kind = kind == 0 ? KD_ROW_PREFILL : KD_ROW_VERIFY;
            row.n_tokens = 1 + r.uni(TW);
            row.logits = kind == 0 ? KD_LOGITS_LAST : kind == 1 ? KD_LOGITS_NONE : kind == 2 ? KD_LOGITS_LAST : KD_LOGITS_ALL;
            rows.push_back(row);
            kd_sample_params p;
            memset(&p, 0, sizeof p);
            static const double temps[] = {0, 0, 0.3, 0.7, 1.0, 1.6};
            static const double tops[] = {1, 1, 0.95, 0.8, 0.5, 0.05};
            const int32_t ks[] = {0, 0, 1, 5, 50, V - 1, V + 3};
            p.temperature = temps[r.uni(6)], p.top_p = tops[r.uni(6)], p.top_k = ks[r.uni(7)];
            params.push_back(p);
            for (int32_t j = 0; j < TW; j++) uni.push_back(r.u01());
        }
        // logits position by position, then the drafts from them
        kd_batch b;
        b.n_rows = R, b.rows = rows.data();
        const int64_t M = kd_batch_logit_rows(&b);
        std::vector<float> lg((size_t)(M * V));
        std::vector<int32_t> tok;
        int64_t m = 0;
        for (int32_t i = 0; i < R; i++) {
            const kd_batch_row &row = rows[i];
            const int32_t nl = row.logits == KD_LOGITS_ALL ? row.n_tokens : row.logits == KD_LOGITS_LAST ? 1 : 0;
            std::vector<int32_t> best(nl);
            for (int32_t q = 0; q < nl; q++, m++) {
                float *l = lg.data() + m * V;
                const double scale = r.uni(3) == 0 ? 8 : r.uni(2) ? 2 : 0.5;
                for (int32_t j = 0; j < V; j++) l[j] = (float)(scale * r.normal());
                if (r.uni(3) == 0) { // planted ties: copies of the maximum and of other values
                    int32_t mx = 0;
                    for (int32_t j = 1; j < V; j++)
                        if (l[j] > l[mx]) mx = j;
                    for (int c = 0; c < 3; c++) l[r.uni(V)] = l[mx];
                    for (int c = 0; c < V / 50 + 2; c++) l[r.uni(V)] = l[r.uni(V)];
                    if (r.uni(4) == 0) l[r.uni(V)] = -0.0f, l[r.uni(V)] = 0.0f;
                }
                best[q] = argmax(l, V);
            }
            tok.push_back(r.uni(V)); // x0
            for (int32_t q = 1; q < row.n_tokens; q++) {
                const int c = r.uni(4);
                const int32_t prev = row.logits == KD_LOGITS_ALL ? best[q - 1] : 0;
                tok.push_back(c < 2 ? prev : c == 2 ? (int32_t)std::min(V - 1, prev + r.uni(3)) : r.uni(V));
            }
        }
        b.tokens = tok.data();
        std::vector<int32_t> gt((size_t)R * TW, -7), ga(R, -7), gu(R, -7), ct((size_t)R * TW, -9), ca(R), cu(R);
        kd_err err;
        if (kd_cuda_sample_logits(g, &b, lg.data(), params.data(), uni.data(), gt.data(), ga.data(), gu.data(), &err)) {
            report(false, "sampling vocab %d round %d: %s", V, round, err.msg);
            break;
        }
        kd_sample_batch_ref(&b, lg.data(), V, TW, params.data(), uni.data(), probs.data(), order.data(), ct.data(),
                            ca.data(), cu.data());
        m = 0;
        for (int32_t i = 0; i < R; i++) {
            const kd_batch_row &row = rows[i];
            const int64_t m0 = m;
            m += row.logits == KD_LOGITS_ALL ? row.n_tokens : row.logits == KD_LOGITS_LAST ? 1 : 0;
            if (row.logits == KD_LOGITS_NONE) {
                if (ga[i] != 0 || gu[i] != 0) bad++, note("vocab %d row %d (no logits): accepted %d used %d", V, i, ga[i], gu[i]);
                continue;
            }
            rows_checked++;
            const bool greedy = params[i].temperature == 0;
            greedy ? greedy_rows++ : sampled_rows++;
            if (row.logits == KD_LOGITS_ALL) drafts += row.n_tokens - 1, accepted += ca[i];
            bool same = ga[i] == ca[i] && gu[i] == cu[i];
            for (int32_t q = 0; same && q <= ca[i]; q++) same = gt[(size_t)i * TW + q] == ct[(size_t)i * TW + q];
            if (same) continue;
            bool tie = false;
            if (!greedy) // a tie within rounding: the reference, nudged by 1e-9, agrees with the GPU
                for (double fu : {1.0, 1 - 1e-9, 1 + 1e-9})
                    for (double fp : {1.0, 1 - 1e-9, 1 + 1e-9}) {
                        int32_t t2[8], a2, u2;
                        ref_row(b, i, lg, m0, V, TW, params[i], uni.data() + (size_t)i * TW, fu, fp, pr, order, t2,
                                &a2, &u2);
                        bool eq = a2 == ga[i] && u2 == gu[i];
                        for (int32_t q = 0; eq && q <= a2; q++) eq = t2[q] == gt[(size_t)i * TW + q];
                        tie = tie || eq;
                    }
            if (tie) {
                ties++;
                continue;
            }
            bad++;
            if (bad <= 5)
                note("vocab %d round %d row %d (%s, T %.2f k %d p %.2f): gpu a=%d used %d tok %d | cpu a=%d used %d tok %d",
                     V, round, i, row_desc(row, R).c_str(), params[i].temperature, params[i].top_k, params[i].top_p,
                     ga[i], gu[i], gt[(size_t)i * TW + std::max(0, std::min(ga[i], TW - 1))], ca[i], cu[i],
                     ct[(size_t)i * TW + ca[i]]);
        }
    }
    report(bad == 0 && ties * 100 <= sampled_rows + 100,
           "device sampling vocab %d: %lld rows (%lld greedy, %lld sampled), drafts accepted %lld of %lld; "
           "differences %lld, ties within rounding %lld",
           V, (long long)rows_checked, (long long)greedy_rows, (long long)sampled_rows, (long long)accepted,
           (long long)drafts, (long long)bad, (long long)ties);
    kd_backend_free(g);
}

// ------------------------------------------------------------------------ CUDA graphs

// variant 1 instead: two bf16 backends replaying graphs, the second reading every slot's
// checkpoint before each forward and writing it back where the slot has no records (a write
// drops them), so its conv windows go from the history rings to the export layout and back
// (cuda_backend.cu's conv_sync); single-token steps of each slot first, their logits compared bit
// for bit, then as above. Variants 2-4: the same with the
// first prefetching weights into the L2 (kd_cuda_set_prefetch mode 1-3) in every forward, the
// second never (variant 6: mode 2 with gate|up's rows before o_proj's, kd_cuda_set_prefetch_order).
// Variant 5: the same with f_proj.1 and g_proj.1 in one launch (kd_cuda_set_pair) on the first only.
// Variants 7 / 8: the same with the gates' bf16 copy in the input projection's epilogue / the
// conv and f_proj.1 + g_proj.1 in one launch (kd_cuda_set_fuse) on the first only. Variant 9:
// the conv of q and k in the prepare's kernel at every row count (kd_cuda_set_conv_prep; the v
// channels' conv alone) on the first, every kernel its own on the second; variant 10: the same
// with the v channels' conv in f_proj.1 + g_proj.1's launch on the first, the whole conv there on
// the second. Variant 11: f_proj.1 and g_proj.1 on the second stream in every forward
// (kd_cuda_set_side_rows 1) on the first, never on the second. Variant 12: as 2-4 with mode 4 (the
// prefetch from 3 more blocks of the gated RMSNorm's launch, its first 4 KiB, and of the MLP
// RMSNorm's, the rest: kd_cuda_set_prefetch_blocks, kd_cuda_set_prefetch_mlp). Variant 13: gate|up
// and SwiGLU in one launch (kd_cuda_set_swiglu) on the first, SwiGLU in its own kernel on the second.
// Variant 14: the one-pass KDA verify at every batch size (kd_kda_split(3)) on both, its checkpoint
// stores evict-first (kd_kda_store_hint, a process-wide switch set before each backend's forward) on
// the first, plain on the second. Variant 15: the one-pass KDA verify at every batch size on both; on
// the first the gated RMSNorm loads its gate before its programmatic wait (kd_cuda_set_gnorm_early),
// on the second after it. Variant 16: as variant 0 (graphs on the first, off on the second) with bf16
// activations, o_proj and the down projection in 2 K slices on both at every row count (kd_cuda_set_ksplit),
// gate|up's output in bf16 (kd_cuda_set_gu_bf16) and cuBLAS for every product (the skinny kernel off).
// Variants 17 and 18: as variant 0 (18 with bf16 activations) with the first backend's graphs captured
// before the first step (kd_cuda_warm_graphs): 17 every shape, 18 only each (rows, window)'s shape of
// every row at that window; no step may then run eagerly (replays == steps), and in 17 none captures.
static void graph_case(const Spec &s, uint64_t seed, int steps, int variant = 0) {
    RandModel m;
    build_model(m, s, seed);
    const int32_t NS = 8, TW = 4;
    const bool warm = variant == 17 || variant == 18;
    const bool folds = variant >= 1 && variant != 16 && !warm; /* two bf16 backends with graphs, logits compared first */
    const int fuse_masks[4][2] = {{KD_CUDA_FUSE_COPY, 0},
                                  {KD_CUDA_FUSE_CONV, 0},
                                  {KD_CUDA_FUSE_CONV_PREP, 0},
                                  {KD_CUDA_FUSE_CONV | KD_CUDA_FUSE_CONV_PREP, KD_CUDA_FUSE_CONV}};
    kd_err err;
    const int bf16 = folds || variant == 16 || variant == 18;
    kd_backend *be[2] = {kd_cuda_backend_create(bf16, &err), kd_cuda_backend_create(bf16, &err)};
    bool ok = be[0] && be[1];
    for (int i = 0; i < 2 && ok; i++)
        ok = kd_backend_load(be[i], &m.c, &m.w, &err) == 0 &&
             kd_backend_reserve(be[i], NS, NS, 96, TW, KD_COMMIT_DEFERRED, &err) == 0 &&
             kd_cuda_set_graphs(be[i], folds || i == 0) == 0 &&
             (variant < 2 || variant == 5 || (variant >= 7 && variant != 12) ||
              kd_cuda_set_prefetch(be[i], i == 0 ? (variant == 12 ? 4096 : -1) : 0, i == 0 ? 1 << 20 : 0,
                                   variant == 12 ? 4 : variant >= 6 ? 2 : variant - 1) == 0) &&
             (variant != 12 || (kd_cuda_set_prefetch_blocks(be[i], 3) == 0 &&
                                kd_cuda_set_prefetch_mlp(be[i], i == 0 ? 1 << 20 : 0) == 0)) &&
             kd_cuda_set_prefetch_order(be[i], variant == 6) == 0 &&
             (variant != 5 || kd_cuda_set_pair(be[i], i == 0) == 0) &&
             (variant < 7 || variant > 10 || kd_cuda_set_fuse(be[i], fuse_masks[variant - 7][i]) == 0) &&
             kd_cuda_set_conv_prep(be[i], variant == 9 || variant == 10) == 0 &&
             (variant != 11 || kd_cuda_set_side_rows(be[i], i == 0 ? 1 : 0) == 0) &&
             (variant != 13 || kd_cuda_set_swiglu(be[i], i == 0) == 0) &&
             (variant != 15 || kd_cuda_set_gnorm_early(be[i], i == 0) == 0) &&
             (variant != 16 || (kd_cuda_set_ksplit(be[i], 2, 1, 512) == 0 && kd_cuda_set_skinny(be[i], 0) == 0 &&
                                kd_cuda_set_gu_bf16(be[i], 1) == 0)) &&
             (!g_plain_order || kd_cuda_set_pdl(be[i], 0) == 0);
    /* variants 17 / 18: the first backend's graphs before any forward; the shapes of full windows are the
     * padded row counts 1, 2, 4, 8 times the windows 1..TW */
    int warmed = 0, warmed_again = -1;
    const int full_shapes = 4 * TW;
    if (ok && warm) {
        warmed = kd_cuda_warm_graphs(be[0], NS, variant == 17 ? 96 : full_shapes, &err);
        warmed_again = warmed >= 0 ? kd_cuda_warm_graphs(be[0], NS, 96, &err) : -1;
        ok = warmed > 0 && (variant == 18 || warmed_again == 0);
        report(ok && (variant == 17 ? warmed > full_shapes : warmed == full_shapes),
               "[warmed graphs %s] %d shapes captured before the first step (%s), again: %d new%s%s", s.name, warmed,
               variant == 17 ? "all of 1..8 rows, windows 1..4" : "every row at each window only", warmed_again,
               ok ? "" : ": ", ok ? "" : err.msg);
        if (variant == 18) { /* the rest are captured on use: count from here */
            int64_t c0 = 0, r0 = 0;
            kd_cuda_graph_stats(be[0], &c0, &r0);
            warmed = (int)c0;
        }
    }
    char tag[64], vs[160];
    if (variant >= 2 && variant <= 4) snprintf(tag, sizeof tag, "L2 prefetch mode %d", variant - 1);
    else if (variant == 6) snprintf(tag, sizeof tag, "L2 prefetch mode 2, gate|up first");
    else if (variant == 12) snprintf(tag, sizeof tag, "L2 prefetch mode 4 (gated norm's blocks)");
    else snprintf(tag, sizeof tag, "%s", variant == 0   ? "graphs"
                                            : variant == 1 ? "state round trips"
                                            : variant == 7 ? "copy epilogue"
                                            : variant == 8 ? "conv + f/g launch"
                                            : variant == 9 ? "conv + prepare"
                                            : variant == 10 ? "conv + prepare, v conv + f/g launch"
                                            : variant == 11 ? "f/g on a second stream"
                                            : variant == 13 ? "gate|up + SwiGLU launch"
                                            : variant == 14 ? "one-pass verify, store hint"
                                            : variant == 15 ? "one-pass verify, early norm"
                                            : variant == 16 ? "graphs, K slices"
                                            : variant == 17 ? "warmed graphs"
                                            : variant == 18 ? "warmed graphs, bf16"
                                                           : "f/g product pair");
    snprintf(vs, sizeof vs, "%s",
             variant == 0   ? "graphs on / off"
             : variant == 17 ? "graphs captured before the first step / off"
             : variant == 18 ? "bf16, graphs of full windows captured before the first step / off"
             : variant == 16 ? "o_proj and the down projection in 2 K slices, gate|up in bf16 on both; graphs on / off"
             : variant == 1 ? "bf16, as they are / every slot's state read and written back before each forward"
             : variant == 5 ? "bf16, f_proj.1 and g_proj.1 in one launch / two"
             : variant == 7 ? "bf16, the gates' copy in the input projection / its own kernel"
             : variant == 8 ? "bf16, the conv and f_proj.1 + g_proj.1 in one launch / their own"
             : variant == 9 ? "bf16, the q and k conv in the prepare's kernel / every kernel its own"
             : variant == 10 ? "bf16, the q and k conv in the prepare's kernel and the v conv in f_proj.1 + "
                               "g_proj.1's launch / the whole conv there"
             : variant == 11 ? "bf16, f_proj.1 and g_proj.1 on a second stream in every forward / never"
             : variant == 13 ? "bf16, gate|up and SwiGLU in one launch / two"
             : variant == 14 ? "bf16, the one-pass verify's checkpoint stores evict-first / plain"
             : variant == 15 ? "bf16, the gated RMSNorm's gate loaded before its programmatic wait / after"
                            : "bf16, weights prefetched into the L2 in every forward / never");
    if (!report(ok, "[%s %s] two backends (%s)%s%s", tag, s.name, vs, ok ? "" : ": ", ok ? "" : err.msg)) {
        kd_backend_free(be[0]), kd_backend_free(be[1]);
        return;
    }
    /* variant 14: the backend about to run decides the store hint (graphs capture the kernel it picks);
     * variant 1: the second backend's slots read and written back (recorded: below) */
    const size_t sb = kd_backend_state_bytes(be[1]);
    std::vector<float> st(sb / 4 + 1);
    std::vector<int32_t> last(NS, 1), recorded(NS, 0);
    int64_t reads = 0, writes = 0, trip_fail = 0;
    auto hint = [&](int i) {
        if (variant == 14) kd_kda_store_hint(i == 0);
        if (variant == 1 && i == 1)
            for (int32_t slot = 0; slot < NS; slot++) {
                trip_fail += kd_backend_checkpoint_read(be[1], slot, st.data(), sb, &err) != 0, reads++;
                if (recorded[slot] == 0)
                    trip_fail += kd_backend_state_write(be[1], slot, st.data(), sb, &err) != 0, writes++;
            }
    };
    int hint0 = 1; /* the process's setting, restored below */
    if (variant == 14) hint0 = kd_kda_store_hint(1), kd_kda_split(3);
    if (variant == 15) kd_kda_split(3);
    Rng r(seed + 5);
    // prompts into every slot (eager on both)
    {
        std::vector<kd_batch_row> rows;
        std::vector<int32_t> tok;
        for (int32_t i = 0; i < NS; i++) {
            kd_batch_row row;
            memset(&row, 0, sizeof row);
            row.slot = i, row.n_tokens = 3 + r.uni(6), row.kind = KD_ROW_PREFILL, row.logits = KD_LOGITS_NONE;
            rows.push_back(row);
            for (int q = 0; q < row.n_tokens; q++) tok.push_back(r.uni(s.vocab));
        }
        kd_batch b;
        b.n_rows = NS, b.rows = rows.data(), b.tokens = tok.data();
        for (int i = 0; i < 2; i++) hint(i), ok = ok && kd_backend_forward(be[i], &b, nullptr, &err) == 0;
        report(ok, "[%s %s] prompts into %d slots%s%s", tag, s.name, NS, ok ? "" : ": ", ok ? "" : err.msg);
    }
    if (folds) { /* single-token steps of each slot (the second folds its record): logits bit for bit */
        for (int rep = 0; rep < 2 && ok; rep++) {
            size_t differ = 0;
            for (int32_t i = 0; i < NS && ok; i++) {
                kd_batch_row row;
                memset(&row, 0, sizeof row);
                row.slot = i, row.kind = KD_ROW_VERIFY, row.logits = KD_LOGITS_ALL, row.n_tokens = 1;
                row.fold = recorded[i];
                const int32_t tk = r.uni(s.vocab);
                kd_batch b;
                b.n_rows = 1, b.rows = &row, b.tokens = &tk;
                std::vector<float> lg[2] = {poisoned(s.vocab), poisoned(s.vocab)};
                for (int j = 0; j < 2 && ok; j++) hint(j), ok = kd_backend_forward(be[j], &b, lg[j].data(), &err) == 0;
                if (ok) differ += memcmp(lg[0].data(), lg[1].data(), (size_t)s.vocab * 4) != 0;
                recorded[i] = 1, last[i] = ok ? argmax(lg[1].data(), s.vocab) : 1;
            }
            report(ok && differ == 0, "[%s %s] single-token verify logits of %d slots (%s): %zu differ%s%s", tag,
                   s.name, NS, rep ? "each folding its record" : "no fold", differ, ok ? "" : ": ", ok ? "" : err.msg);
        }
    }
    int64_t rows_total = 0, diffs = 0, acc_total = 0;
    std::vector<int> sizes;
    for (int step = 0; step < steps && ok; step++) {
        const int k = 1 + (step < 8 ? step : r.uni(NS)); // every count 1..8 early on
        std::vector<int32_t> order(NS);
        for (int i = 0; i < NS; i++) order[i] = i;
        for (int i = NS - 1; i > 0; i--) std::swap(order[i], order[r.uni(i + 1)]);
        std::vector<kd_batch_row> rows;
        std::vector<int32_t> tok;
        std::vector<kd_sample_params> params;
        std::vector<double> uni;
        for (int i = 0; i < k; i++) {
            kd_batch_row row;
            memset(&row, 0, sizeof row);
            row.slot = order[i], row.kind = KD_ROW_VERIFY, row.logits = KD_LOGITS_ALL;
            row.n_tokens = 1 + r.uni(TW), row.fold = recorded[row.slot];
            rows.push_back(row);
            tok.push_back(last[row.slot]);
            for (int q = 1; q < row.n_tokens; q++) tok.push_back(r.uni(3) ? last[row.slot] : r.uni(s.vocab));
            kd_sample_params p;
            memset(&p, 0, sizeof p);
            p.temperature = r.uni(2) ? 0 : 0.8, p.top_p = r.uni(2) ? 1 : 0.9, p.top_k = r.uni(2) ? 0 : 20;
            params.push_back(p);
            for (int q = 0; q < TW; q++) uni.push_back(r.u01());
        }
        kd_batch b;
        b.n_rows = k, b.rows = rows.data(), b.tokens = tok.data();
        std::vector<int32_t> t[2], a[2], u[2];
        for (int i = 0; i < 2 && ok; i++) {
            t[i].assign((size_t)k * TW, -1), a[i].assign(k, -1), u[i].assign(k, -1);
            hint(i);
            ok = kd_backend_forward_sample(be[i], &b, params.data(), uni.data(), t[i].data(), a[i].data(), u[i].data(),
                                           &err) == 0;
        }
        if (!report(ok, "[%s %s] step %d (%d rows)%s%s", tag, s.name, step, k, ok ? "" : ": ", ok ? "" : err.msg))
            break;
        for (int i = 0; i < k; i++) {
            bool same = a[0][i] == a[1][i] && u[0][i] == u[1][i];
            for (int q = 0; same && q <= a[1][i]; q++) same = t[0][(size_t)i * TW + q] == t[1][(size_t)i * TW + q];
            if (!same) {
                diffs++;
                if (diffs <= 3)
                    note("[%s %s] step %d row %d: first a=%d tok %d, second a=%d tok %d", tag, s.name, step, i, a[0][i],
                         t[0][(size_t)i * TW + std::max(0, std::min(a[0][i], TW - 1))], a[1][i],
                         t[1][(size_t)i * TW + a[1][i]]);
            }
            const int32_t slot = rows[i].slot;
            recorded[slot] = 1 + a[1][i];
            last[slot] = t[1][(size_t)i * TW + a[1][i]];
            acc_total += a[1][i];
            rows_total++;
        }
    }
    if (variant == 14) kd_kda_store_hint(hint0), kd_kda_split(1);
    if (variant == 15) kd_kda_split(1);
    int64_t cap = 0, rep = 0, cap1 = 0, rep1 = 0;
    kd_cuda_graph_stats(be[0], &cap, &rep);
    kd_cuda_graph_stats(be[1], &cap1, &rep1);
    if (variant == 1)
        report(reads > 0 && writes > 0 && trip_fail == 0,
               "[%s %s] %lld checkpoint reads, %lld writes back, %lld failed", tag, s.name, (long long)reads,
               (long long)writes, (long long)trip_fail);
    if (folds) {
        report(ok && diffs == 0 && rows_total > 0,
               "[%s %s] %d steps, %lld rows (1..8 per step): %s, the same on every row (differences %lld, drafts "
               "accepted %lld)",
               tag, s.name, steps, (long long)rows_total, vs, (long long)diffs, (long long)acc_total);
        kd_backend_free(be[0]), kd_backend_free(be[1]);
        return;
    }
    if (variant == 16)
        report(kd_cuda_ksplit_launches(be[0]) > 0 && kd_cuda_ksplit_launches(be[1]) > 0,
               "[%s %s] products run in K slices: %lld (graphs), %lld (eager)", tag, s.name,
               (long long)kd_cuda_ksplit_launches(be[0]), (long long)kd_cuda_ksplit_launches(be[1]));
    if (warm)
        report(ok && rep == steps && (variant == 18 || cap == warmed) && cap >= warmed,
               "[%s %s] every step on a graph: replays %lld of %d steps; graphs captured %lld (%d before the first "
               "step)", tag, s.name, (long long)rep, steps, (long long)cap, warmed);
    report(ok && diffs == 0 && cap >= 1 && rep > 0 && cap1 == 0 && rep1 == 0,
           "[graphs %s] %d steps, %lld rows (1..8 per step, padded to 1/2/4/8 rows, tokens to a multiple of 4 up to "
           "rows x the longest window): graph replay == eager on every row "
           "(differences %lld, drafts accepted %lld); graphs captured %lld, replays %lld (eager backend: %lld)",
           s.name, steps, (long long)rows_total, (long long)diffs, (long long)acc_total, (long long)cap, (long long)rep,
           (long long)cap1);
    kd_backend_free(be[0]), kd_backend_free(be[1]);
}

// The oracle's greedy continuations through forward_sample with graphs: 3 copies of the
// prompt decoded side by side (3 rows padded to 4 with the scratch row).
static void oracle_graph_case(const char *dir, const char *name) {
    char path[2048], lab[96];
    snprintf(lab, sizeof lab, "[oracle %s fp32 deferred, graphs]", name);
    kd_err err;
    snprintf(path, sizeof path, "%s/%s/model", dir, name);
    kd_model *m = kd_model_open(path, &err);
    if (!report(m != nullptr, "%s open %s%s%s", lab, path, m ? "" : ": ", m ? "" : err.msg)) return;
    snprintf(path, sizeof path, "%s/%s/vectors.safetensors", dir, name);
    kd_st_file *vec = kd_st_open(path, &err);
    kd_backend *g = vec ? kd_cuda_backend_create(0, &err) : nullptr;
    bool ok = g && kd_backend_load(g, &m->config, &m->tensors, &err) == 0 &&
              kd_backend_reserve(g, 3, 4, 1024, 4, KD_COMMIT_DEFERRED, &err) == 0 && kd_cuda_set_graphs(g, 1) == 0;
    if (report(ok, "%s backend%s%s", lab, ok ? "" : ": ", ok ? "" : err.msg)) {
        for (int pr = 0; pr < 3; pr++) {
            char key[64];
            snprintf(key, sizeof key, "prompt%d.tokens", pr);
            std::vector<int32_t> tok = ints(vec, key);
            snprintf(key, sizeof key, "prompt%d.greedy", pr);
            std::vector<int32_t> greedy = ints(vec, key);
            const int32_t n = (int32_t)tok.size();
            if (n < 2 || greedy.empty()) continue;
            std::vector<kd_batch_row> rows(3);
            std::vector<int32_t> btok;
            for (int i = 0; i < 3; i++) {
                memset(&rows[i], 0, sizeof rows[i]);
                rows[i].slot = i, rows[i].n_tokens = n - 1, rows[i].kind = KD_ROW_PREFILL;
                btok.insert(btok.end(), tok.begin(), tok.end() - 1);
                ok = ok && kd_backend_reset_slot(g, i, &err) == 0;
            }
            kd_batch b;
            b.n_rows = 3, b.rows = rows.data(), b.tokens = btok.data();
            ok = ok && kd_backend_forward(g, &b, nullptr, &err) == 0;
            int32_t x[3] = {tok[n - 1], tok[n - 1], tok[n - 1]}, agree[3] = {0, 0, 0};
            kd_sample_params p[3];
            memset(p, 0, sizeof p);
            for (auto &q : p) q.top_p = 1;
            double uni[12] = {0};
            for (size_t i = 0; i < greedy.size() && ok; i++) {
                for (int j = 0; j < 3; j++) {
                    memset(&rows[j], 0, sizeof rows[j]);
                    rows[j].slot = j, rows[j].n_tokens = 1, rows[j].kind = KD_ROW_VERIFY, rows[j].logits = KD_LOGITS_ALL;
                    rows[j].fold = i > 0 ? 1 : 0;
                }
                b.tokens = x;
                int32_t t[12], a[3], u[3];
                ok = kd_backend_forward_sample(g, &b, p, uni, t, a, u, &err) == 0;
                for (int j = 0; j < 3 && ok; j++) {
                    x[j] = t[j * 4];
                    agree[j] += x[j] == greedy[i];
                }
            }
            report(ok && agree[0] == (int32_t)greedy.size() && agree[1] == agree[0] && agree[2] == agree[0],
                   "%s prompt%d: greedy %d/%d/%d of %zu tokens exact through graph replays%s%s", lab, pr, agree[0],
                   agree[1], agree[2], greedy.size(), ok ? "" : ": ", ok ? "" : err.msg);
        }
        int64_t cap = 0, rep = 0;
        kd_cuda_graph_stats(g, &cap, &rep);
        report(cap >= 1 && rep > 0, "%s graphs captured %lld, replays %lld", lab, (long long)cap, (long long)rep);
    }
    kd_backend_free(g);
    if (vec) kd_st_close(vec);
    kd_model_close(m);
}

// ------------------------------------------------------------------ engine GPU == CPU

struct EngineLog {
    std::map<uint64_t, std::vector<int32_t>> toks;
    std::map<uint64_t, int> finish;
};

static void engine_event(void *ctx, const kd_event *ev) {
    EngineLog *l = (EngineLog *)ctx;
    std::vector<int32_t> &v = l->toks[ev->id];
    v.insert(v.end(), ev->tokens, ev->tokens + ev->n_tokens);
    if (ev->finish != KD_FINISH_NONE) l->finish[ev->id] = ev->finish;
}

static void engine_case(const Spec &s, kd_commit_mode mode, int prefix, uint64_t seed, int steps) {
    char lab[128];
    snprintf(lab, sizeof lab, "[engine %s %s%s]", s.name, kd_commit_mode_name(mode), prefix ? " +prefix cache" : "");
    RandModel m;
    build_model(m, s, seed);
    kd_err err;
    kd_backend *be[2] = {kd_cpu_backend_create(0, &err), kd_cuda_backend_create(0, &err)};
    bool ok = be[0] && be[1] && kd_backend_load(be[0], &m.c, &m.w, &err) == 0 &&
              kd_backend_load(be[1], &m.c, &m.w, &err) == 0;
    kd_engine_config cfg;
    kd_engine_config_defaults(&cfg);
    cfg.max_seqs = 6, cfg.max_queue = 8, cfg.max_spec = 3, cfg.max_batch_tokens = 6 * 4 + 1 + 40;
    cfg.max_model_len = 512, cfg.commit = mode;
    if (prefix) cfg.prefix_block = 16, cfg.prefix_cache_bytes = 64u << 20;
    EngineLog log[2];
    kd_engine *e[2] = {nullptr, nullptr};
    for (int i = 0; i < 2 && ok; i++) ok = (e[i] = kd_engine_create(be[i], 1234, &cfg, engine_event, &log[i], &err)) != nullptr;
    if (!report(ok, "%s engines on cpu and gpu%s%s", lab, ok ? "" : ": ", ok ? "" : err.msg)) goto done;
    {
        Rng r(seed * 3 + 1);
        uint64_t next_id = 1;
        std::vector<uint64_t> live;
        int64_t submitted = 0, aborted = 0;
        for (int step = 0; step < steps && ok; step++) {
            const int arrivals = step < steps - 40 ? r.uni(3) == 0 ? 1 + r.uni(3) : 0 : 0;
            for (int a = 0; a < arrivals; a++) {
                std::vector<int32_t> prompt;
                const int n = 2 + r.uni(60), period = 1 + r.uni(9);
                std::vector<int32_t> pat(period);
                for (auto &x : pat) x = r.uni(s.vocab);
                for (int i = 0; i < n; i++) prompt.push_back(r.uni(5) ? pat[i % period] : r.uni(s.vocab));
                int32_t stop = r.uni(s.vocab);
                kd_request_params p;
                memset(&p, 0, sizeof p);
                p.id = next_id++, p.prompt = prompt.data(), p.n_prompt = n, p.max_tokens = 1 + r.uni(48);
                p.sampling.temperature = r.uni(2) ? 0 : 0.5 + r.u01();
                p.sampling.top_k = r.uni(3) ? 0 : 1 + r.uni(30);
                p.sampling.top_p = r.uni(3) ? 1 : 0.85;
                p.sampling.seed = r.next();
                p.spec_tokens = r.uni(4);
                const int d = r.uni(4);
                p.draft = p.spec_tokens == 0 ? KD_DRAFT_NONE : d < 2 ? KD_DRAFT_NGRAM : d == 2 ? KD_DRAFT_CALLER : KD_DRAFT_NONE;
                if (p.draft == KD_DRAFT_NONE) p.spec_tokens = 0;
                p.eos_id = -1;
                if (r.uni(4) == 0) p.stop_ids = &stop, p.n_stop = 1;
                kd_submit_status st[2];
                for (int i = 0; i < 2; i++) st[i] = kd_engine_submit(e[i], &p, &err);
                if (st[0] != st[1]) {
                    ok = report(false, "%s step %d: submit answered %d on cpu, %d on gpu", lab, step, st[0], st[1]);
                    break;
                }
                if (st[0] == KD_SUBMIT_OK) live.push_back(p.id), submitted++;
            }
            if (!live.empty() && r.uni(25) == 0) {
                const uint64_t id = live[(size_t)r.uni((int)live.size())];
                const int a0 = kd_engine_abort(e[0], id), a1 = kd_engine_abort(e[1], id);
                aborted += a0 == 0;
                if (a0 != a1) ok = report(false, "%s step %d: abort of %llu answered %d / %d", lab, step, (unsigned long long)id, a0, a1);
            }
            for (uint64_t id : live) { // caller drafts (ignored by requests that draft otherwise)
                int32_t d[3] = {r.uni(s.vocab), r.uni(s.vocab), r.uni(s.vocab)};
                const int nd = r.uni(4);
                for (int i = 0; i < 2; i++) kd_engine_set_drafts(e[i], id, d, nd);
            }
            int n[2];
            for (int i = 0; i < 2 && ok; i++) {
                n[i] = kd_engine_step(e[i], &err);
                if (n[i] < 0) ok = report(false, "%s step %d: %s step: %s", lab, step, i ? "gpu" : "cpu", err.msg);
            }
            if (ok && n[0] != n[1]) ok = report(false, "%s step %d: %d rows on cpu, %d on gpu", lab, step, n[0], n[1]);
            std::vector<uint64_t> still;
            for (uint64_t id : live)
                if (!log[0].finish.count(id)) still.push_back(id);
            live.swap(still);
        }
        for (int i = 0; i < 2 && ok; i++) // drain
            for (int guard = 0; kd_engine_has_work(e[i]) && guard < 4000 && ok; guard++)
                if (kd_engine_step(e[i], &err) < 0) ok = report(false, "%s drain: %s", lab, err.msg);
        int64_t tokens = 0, differ = 0;
        uint64_t first_bad = 0;
        for (auto &kv : log[0].toks) {
            tokens += (int64_t)kv.second.size();
            const bool same = log[1].toks.count(kv.first) && log[1].toks[kv.first] == kv.second &&
                              log[1].finish[kv.first] == log[0].finish[kv.first];
            if (!same && !differ++) first_bad = kv.first;
        }
        if (log[1].toks.size() != log[0].toks.size()) differ++;
        kd_engine_stats st[2];
        kd_engine_stats_get(e[0], &st[0]);
        kd_engine_stats_get(e[1], &st[1]);
        int64_t cap = 0, rep = 0;
        kd_cuda_graph_stats(be[1], &cap, &rep);
        report(ok && differ == 0,
               "%s %lld requests (%lld aborted), %lld tokens, %lld steps: gpu tokens == cpu tokens for every request "
               "(%lld differ); drafted %lld accepted %lld (gpu %lld/%lld); folds %lld, eager commits %lld, flushes %lld; "
               "gpu graphs captured %lld, replays %lld",
               lab, (long long)submitted, (long long)aborted, (long long)tokens, (long long)st[0].steps, (long long)differ,
               (long long)st[0].drafted, (long long)st[0].accepted, (long long)st[1].drafted, (long long)st[1].accepted,
               (long long)st[0].folds, (long long)st[0].eager_commits, (long long)st[0].flushes, (long long)cap,
               (long long)rep);
        if (differ && log[1].toks.count(first_bad)) {
            const std::vector<int32_t> &x = log[0].toks[first_bad], &y = log[1].toks[first_bad];
            size_t at = 0;
            while (at < x.size() && at < y.size() && x[at] == y[at]) at++;
            note("first differing request %llu: %zu tokens cpu, %zu gpu, first difference at %zu",
                 (unsigned long long)first_bad, x.size(), y.size(), at);
        }
    }
done:
    for (int i = 0; i < 2; i++) kd_engine_free(e[i]);
    for (int i = 0; i < 2; i++) kd_backend_free(be[i]);
}

// ------------------------------------------------------------------- skinny GEMM (f)

static uint16_t to_bf16_bits(float x) { /* round to nearest even (finite x) */
    uint32_t u;
    memcpy(&u, &x, 4);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
static double from_bf16_bits(uint16_t b) {
    const uint32_t u = (uint32_t)b << 16;
    float x;
    memcpy(&x, &u, 4);
    return x;
}

// A device copy of h (cudaMalloc + cudaMemcpy); false on a CUDA error (*d may then hold an
// allocation to free).
template <class T>
static bool to_dev(void **d, const std::vector<T> &h) {
    return cudaMalloc(d, h.size() * sizeof(T)) == cudaSuccess &&
           cudaMemcpy(*d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice) == cudaSuccess;
}

// The conv + prepare kernel (kd_cu_conv_prepare, the v channels by kd_cu_conv4_form: form 1 with a token a
// thread, form 2 with two) against the
// kernels apart (kd_cu_conv_silu_args over every channel, then kd_kda_prepare), bit for bit, on
// fresh random inputs: a batch of verify rows (1..4 tokens) and prefill rows (1..9 tokens, so
// histories from the slot's conv history ring and from the row's earlier inputs), the rings of 8
// slots random but where the verify rows write their records (poisoned), each row at a random
// ring position (histories and records wrapping around), outputs poisoned alike beforehand.
// Compared: v, qn, kn, qk, decay, beta and the rings (no poison left: every record written); a
// mismatch names the array, element and both values.
static void conv_prep_case(int H, int HV, int K, int V, int use_lb, int neg, int early, int form, uint64_t seed) {
    Rng r(seed);
    const int NS = 8, TW = 4, W = 4, RN = W - 1 + TW;
    const int64_t QK = (int64_t)H * K, VD = (int64_t)HV * V, C = 2 * QK + VD, P = (C + HV + 3) / 4 * 4;
    std::vector<kd_cu_tok> toks;
    std::vector<float> ring0((size_t)(NS * RN * C));
    for (auto &x : ring0) x = (float)r.normal();
    for (int32_t slot = 0; slot < NS; slot++) { /* one row a slot, in a random order of kinds */
        const bool verify = r.uni(2);
        const int n = verify ? 1 + r.uni(TW) : 1 + r.uni(9), base = r.uni(RN);
        const int32_t start = (int32_t)toks.size();
        for (int i = 0; i < n; i++) {
            toks.push_back(kd_cu_tok_make(slot, i, start, verify, base));
            if (verify)
                for (int64_t c = 0; c < C; c++) ring0[((size_t)slot * RN + (base + i) % RN) * C + c] = NAN;
        }
    }
    const int64_t N = (int64_t)toks.size();
    auto fill = [&](size_t n, double scale) {
        std::vector<float> v(n);
        for (auto &x : v) x = (float)(scale * r.normal());
        return v;
    };
    const std::vector<float> proj = fill((size_t)(N * P), 1.0), w = fill((size_t)(C * W), 0.5),
                             graw = fill((size_t)(N * HV * K), 1.0),
                             alog = fill((size_t)HV, 0.5), dtb = fill((size_t)(HV * K), 0.5);
    struct Out {
        const char *name;
        size_t n;
        void *d[2];
    } outs[] = {{"v", (size_t)(N * VD), {}},          {"qn", (size_t)(N * QK), {}},    {"kn", (size_t)(N * QK), {}},
                {"qk", (size_t)(N * H), {}},          {"decay", (size_t)(N * HV * K), {}},
                {"beta", (size_t)(N * HV), {}},       {"rings", ring0.size(), {}},
                {"q", (size_t)(N * QK), {}},          {"k", (size_t)(N * QK), {}}};
    const int n_cmp = 7; /* q and k: the apart path's alone (the one kernel writes neither) */
    void *dproj = nullptr, *dw = nullptr, *dgraw = nullptr, *dalog = nullptr, *ddtb = nullptr, *dtoks = nullptr;
    bool ok = to_dev(&dproj, proj) && to_dev(&dw, w) && to_dev(&dgraw, graw) && to_dev(&dalog, alog) &&
              to_dev(&ddtb, dtb) && to_dev(&dtoks, toks);
    for (auto &o : outs)
        for (int j = 0; j < 2; j++) ok = ok && to_dev(&o.d[j], o.n == ring0.size() ? ring0 : poisoned(o.n));
    cudaError_t e = cudaSuccess;
    bool fused4 = false;
    if (ok) {
        auto F = [&](int i, int j) { return (float *)outs[i].d[j]; };
        kd_cu_conv_args ca = {(const float *)dproj, P,       N,       QK,      VD, (const kd_cu_tok *)dtoks, F(6, 0),
                              RN,                   (const float *)dw, W, F(7, 0), F(8, 0), F(0, 0), 0, 0, early};
        kd_cu_prep_args pa = {H, HV, K, 0, (const float *)dgraw, (const float *)dproj + C, P, (const float *)dalog,
                              (const float *)ddtb, use_lb, neg, 0.5f, F(1, 1), F(2, 1), F(3, 1), F(4, 1), F(5, 1)};
        pa.graw_early = early; /* every input was written before the launch */
        /* the kernels apart into set 0 */
        e = kd_cu_conv_silu_args(&ca, 0);
        if (e == cudaSuccess)
            e = (cudaError_t)kd_kda_prepare((int32_t)N, H, HV, K, F(7, 0), F(8, 0), pa.graw, pa.braw, P, pa.A_log,
                                            pa.dt_bias, use_lb, 0.5f, neg, F(1, 0), F(2, 0), F(3, 0), F(4, 0), F(5, 0),
                                            0);
        /* the one kernel (and the v channels' conv 4 a thread) into set 1 */
        kd_cu_conv_args cb = ca, cv = ca;
        cb.hist = F(6, 1), cb.q = F(7, 1), cb.k = F(8, 1), cb.v = F(0, 1);
        cv = cb, cv.c0 = 2 * QK;
        fused4 = kd_cu_conv_prepare_ok(&cb, &pa) && kd_cu_conv4_ok(&cv);
        if (e == cudaSuccess && fused4) e = kd_cu_conv4_form(&cv, form, 0); /* a token / two tokens a thread */
        if (e == cudaSuccess && fused4) e = kd_cu_conv_prepare_form(&cb, &pa, form, 0);
        if (e == cudaSuccess) e = cudaDeviceSynchronize();
        ok = e == cudaSuccess && fused4;
    }
    std::string what;
    size_t bad = 0, unwritten = 0;
    for (int i = 0; i < n_cmp && ok; i++) {
        std::vector<float> h[2] = {std::vector<float>(outs[i].n), std::vector<float>(outs[i].n)};
        for (int j = 0; j < 2; j++)
            ok = ok && cudaMemcpy(h[j].data(), outs[i].d[j], outs[i].n * 4, cudaMemcpyDeviceToHost) == cudaSuccess;
        size_t n = 0, first = 0;
        for (size_t x = 0; x < outs[i].n && ok; x++) {
            if (memcmp(&h[0][x], &h[1][x], 4) != 0 && !n++) first = x;
            if (i == 6 && (std::isnan(h[0][x]) || std::isnan(h[1][x]))) unwritten++; /* a record left out */
        }
        if (n) { /* each array that differs: how many, its first element */
            char m[200];
            snprintf(m, sizeof m, "; %s: %zu, first [%zu] %.9g (apart) / %.9g (one kernel)", outs[i].name, n, first,
                     h[0][first], h[1][first]);
            what += m, bad += n;
        }
    }
    report(ok && bad == 0 && unwritten == 0,
           "[conv + prepare kernel H=%d HV=%d K=%d V=%d N=%lld%s%s%s, taps in %s] against the kernels apart, bit for "
           "bit: %s, %zu elements differ%s, %zu ring entries unwritten",
           H, HV, K, V, (long long)N, use_lb ? " lower-bound gate" : "", neg ? " negative eigenvalues" : "",
           early ? " early loads" : "",
           form == 1 ? "registers, v conv a token a thread" : "shared memory, v conv two tokens a thread",
           ok ? "ran" : !fused4 && e == cudaSuccess ? "shape refused" : cudaGetErrorString(e),
           bad, what.c_str(), unwritten);
    for (auto &o : outs) cudaFree(o.d[0]), cudaFree(o.d[1]);
    for (void *d : {dproj, dw, dgraw, dalog, ddtb, dtoks}) cudaFree(d);
    (void)cudaGetLastError();
}

static void conv_prep_checks(uint64_t seed) {
    const int shapes[][4] = {{2, 4, 32, 64}, {1, 1, 128, 128}, {2, 2, 64, 64}, {4, 4, 4, 8}, {3, 6, 16, 32}};
    int i = 0;
    for (const auto &sh : shapes)
        for (int v = 0; v < 3; v++, i++)
            for (int form = 1; form <= 2; form++) /* both forms of the one kernel (kd_cu_conv_prepare_form) */
                conv_prep_case(sh[0], sh[1], sh[2], sh[3], v == 1, v == 2, v != 0, form, seed + i);
}

// kd_cu_prefill in one form against a float64 recurrence (KDA.md §2.6) on fresh random inputs:
// rows of random lengths (one long, some 1-9 tokens, one empty) over distinct slots of a padded
// state (slot stride past HV K V, the padding and the slots no row names poisoned and checked
// untouched), grouped value heads, normalised keys and queries, betas in (0, 1), decays from
// 1e-30 to 1 (some exactly 1, some tiny: products that underflow); o poisoned. Compared: o and
// the rows' states (relative error over each), NaN anywhere fails.
static void prefill_case(int form, int H, int HV, int K, int V, int long_len, uint64_t seed) {
    Rng r(seed);
    const int NS = 6;
    const int lens[NS] = {long_len, 1 + r.uni(9), 0, 8, 1 + r.uni(9), 9 + r.uni(24)};
    const int slot_of[NS] = {3, 0, 5, 6, 2, 1}; /* slot 4 (and 7) named by no row */
    const int64_t SS = (int64_t)HV * K * V + 40, NSL = 8;
    std::vector<kd_cu_prow> rows(NS);
    int64_t N = 0;
    int32_t nch = 0; /* chunks of 8 tokens (form 3's work space) */
    for (int i = 0; i < NS; i++) rows[i].slot = slot_of[i], rows[i].start = (int32_t)N, rows[i].len = lens[i],
                                 rows[i].chunk = nch, N += lens[i], nch += (lens[i] + 7) / 8;
    std::vector<float> q((size_t)(N * H * K)), k(q.size()), d((size_t)(N * HV * K)), b((size_t)(N * HV)),
        v((size_t)(N * HV * V)), st((size_t)(NSL * SS), NAN);
    for (int64_t n = 0; n < N * H; n++) { /* unit keys, queries scaled by K^-1/2 */
        double nk = 0, nq = 0;
        for (int c = 0; c < K; c++) {
            k[n * K + c] = (float)r.normal(), q[n * K + c] = (float)r.normal();
            nk += (double)k[n * K + c] * k[n * K + c], nq += (double)q[n * K + c] * q[n * K + c];
        }
        for (int c = 0; c < K; c++)
            k[n * K + c] = (float)(k[n * K + c] / sqrt(nk)), q[n * K + c] = (float)(q[n * K + c] / sqrt(nq * K));
    }
    for (auto &x : d) {
        const int kind = r.uni(10);
        x = kind == 0 ? 1.f : kind == 1 ? (float)(1e-30 * r.u01()) : (float)exp(-2.0 * r.u01());
    }
    for (auto &x : b) x = (float)r.u01();
    for (auto &x : v) x = (float)r.normal();
    for (int i = 0; i < NS; i++)
        for (int64_t e = 0; e < (int64_t)HV * K * V; e++) st[(size_t)(slot_of[i] * SS + e)] = (float)(0.2 * r.normal());
    const std::vector<float> st0 = st;
    /* float64 reference */
    std::vector<double> ro((size_t)(N * HV * V)), rs(st.begin(), st.end());
    for (int i = 0; i < NS; i++)
        for (int h = 0; h < HV; h++) {
            double *S = rs.data() + (size_t)(slot_of[i] * SS + (int64_t)h * K * V);
            const int hk = h / (HV / H);
            for (int t = 0; t < lens[i]; t++) {
                const int64_t n = rows[i].start + t;
                const float *kk = &k[(size_t)((n * H + hk) * K)], *qq = &q[(size_t)((n * H + hk) * K)],
                            *dd = &d[(size_t)((n * HV + h) * K)];
                for (int c = 0; c < K; c++)
                    for (int j = 0; j < V; j++) S[c * V + j] *= dd[c];
                for (int j = 0; j < V; j++) {
                    double ks = 0;
                    for (int c = 0; c < K; c++) ks += kk[c] * S[c * V + j];
                    const double u = b[(size_t)(n * HV + h)] * (v[(size_t)((n * HV + h) * V + j)] - ks);
                    double os = 0;
                    for (int c = 0; c < K; c++) S[c * V + j] += kk[c] * u, os += qq[c] * S[c * V + j];
                    ro[(size_t)((n * HV + h) * V + j)] = os;
                }
            }
        }
    void *dq = nullptr, *dk = nullptr, *dd = nullptr, *db = nullptr, *dv = nullptr, *ds = nullptr, *dout = nullptr,
         *drows = nullptr, *dwork = nullptr;
    bool ok = to_dev(&dq, q) && to_dev(&dk, k) && to_dev(&dd, d) && to_dev(&db, b) && to_dev(&dv, v) &&
              to_dev(&ds, st) && to_dev(&dout, poisoned(ro.size())) && to_dev(&drows, rows) &&
              to_dev(&dwork, poisoned(kd_kda_prefill_work_floats(nch, HV, K)));
    cudaError_t e = cudaErrorMemoryAllocation;
    const int was = kd_cu_prefill_form(form);
    if (ok)
        e = kd_cu_prefill((const kd_cu_prow *)drows, NS, nch, H, HV, K, V, (float *)ds, SS, (const float *)dq,
                          (const float *)dk, (const float *)dd, (const float *)db, (const float *)dv, (float *)dout,
                          (float *)dwork, 0);
    kd_cu_prefill_form(was);
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    std::vector<float> go(ro.size()), gs(st.size());
    ok = e == cudaSuccess && cudaMemcpy(go.data(), dout, go.size() * 4, cudaMemcpyDeviceToHost) == cudaSuccess &&
         cudaMemcpy(gs.data(), ds, gs.size() * 4, cudaMemcpyDeviceToHost) == cudaSuccess;
    double eo = ok ? rel_d(go.data(), ro.data(), go.size()) : INFINITY, es = 0;
    size_t touched = 0;
    for (int64_t sl = 0; sl < NSL && ok; sl++) {
        const bool named = std::find(slot_of, slot_of + NS, (int)sl) != slot_of + NS;
        for (int64_t x = 0; x < SS; x++) { /* padding and unnamed slots: bit for bit as they were */
            const size_t at = (size_t)(sl * SS + x);
            if ((!named || x >= (int64_t)HV * K * V) && memcmp(&gs[at], &st0[at], 4)) touched++;
        }
        if (named) es = std::max(es, rel_d(gs.data() + sl * SS, rs.data() + sl * SS, (size_t)HV * K * V));
    }
    report(ok && eo < 1e-5 && es < 1e-5 && touched == 0,
           "[prefill form %d H=%d HV=%d K=%d V=%d, rows of %d/%d/%d/%d/%d/%d tokens] against float64: o rel err %.2e, "
           "states rel err %.2e (tol 1e-5), %zu entries outside the rows' states written%s%s",
           form, H, HV, K, V, lens[0], lens[1], lens[2], lens[3], lens[4], lens[5], eo, es, touched, ok ? "" : ": ",
           ok ? "" : cudaGetErrorString(e));
    for (void *p : {dq, dk, dd, db, dv, ds, dout, drows, dwork}) cudaFree(p);
    (void)cudaGetLastError();
}

static void prefill_checks(uint64_t seed) {
    const int shapes[][5] = {{2, 4, 32, 48, 70}, {1, 2, 64, 64, 41}, {2, 2, 128, 128, 300}, {1, 1, 128, 320, 17}};
    int i = 0;
    for (const auto &sh : shapes)
        for (int form : {0, 1, 3}) prefill_case(form, sh[0], sh[1], sh[2], sh[3], sh[4], seed + i++);
}

// kd_cu_gemm_skinny against a float64 reference on fresh random bf16 inputs: each output
// within 1e-5 of the sum of its terms' magnitudes (fp32 accumulation of exact products),
// beta 0 over a NaN-poisoned C and beta 1 over a random one, leading dimensions wider than
// K and N, N not a multiple of 16; products it must refuse are refused.
// One product of the skinny kernel's checks: random bf16 A and W, C poisoned (beta 0) or
// random (beta 1), a float64 reference; check() compares the device's C and that the padding
// between its rows was not written.
struct SkinnyProb {
    int M, N, K;
    int64_t lda, ldw, ldc;
    float beta;
    std::vector<uint16_t> a, w;
    std::vector<float> c0, c;
    std::vector<double> ref, mag;
    void *da = NULL, *dw = NULL, *dc = NULL;
    SkinnyProb(int M_, int N_, int K_, int pad, float beta_, Rng &r)
        : M(M_), N(N_), K(K_), lda(K_ + pad), ldw(K_ + 8 * (pad > 0)), ldc(N_ + pad), beta(beta_) {
        a.resize((size_t)M * lda), w.resize((size_t)N * ldw), c0.resize((size_t)M * ldc);
        for (auto &x : a) x = to_bf16_bits((float)r.normal());
        for (auto &x : w) x = to_bf16_bits((float)(0.05 * r.normal()));
        for (auto &x : c0) x = beta != 0.f ? (float)r.normal() : NAN;
        ref.resize((size_t)M * N), mag.resize((size_t)M * N);
        for (int m = 0; m < M; m++)
            for (int n = 0; n < N; n++) {
                double sum = 0, sa = 0;
                for (int k = 0; k < K; k++) {
                    const double t = from_bf16_bits(a[(size_t)m * lda + k]) * from_bf16_bits(w[(size_t)n * ldw + k]);
                    sum += t, sa += fabs(t);
                }
                const double cc = beta != 0.f ? (double)beta * c0[(size_t)m * ldc + n] : 0.0;
                ref[(size_t)m * N + n] = sum + cc, mag[(size_t)m * N + n] = sa + fabs(cc);
            }
    }
    SkinnyProb(const SkinnyProb &) = delete; /* owns its device buffers */
    SkinnyProb &operator=(const SkinnyProb &) = delete;
    ~SkinnyProb() { cudaFree(da), cudaFree(dw), cudaFree(dc); }
    bool upload() { return to_dev(&da, a) && to_dev(&dw, w) && to_dev(&dc, c0); }
    kd_skinny_job job() const {
        return kd_skinny_job{(const __nv_bfloat16 *)da, lda, (const __nv_bfloat16 *)dw, ldw, (float *)dc, ldc, N};
    }
    bool fetch() {
        c.resize(c0.size());
        return cudaMemcpy(c.data(), dc, c.size() * 4, cudaMemcpyDeviceToHost) == cudaSuccess;
    }
    /* max error of the terms' magnitude; bad: over 1e-5; pad_touched: padding written */
    void check(double &worst, size_t &bad, size_t &pad_touched) const {
        worst = 0, bad = 0, pad_touched = 0;
        for (int m = 0; m < M; m++) {
            for (int n = 0; n < N; n++) {
                const size_t i = (size_t)m * N + n;
                const double d = fabs((double)c[(size_t)m * ldc + n] - ref[i]) / (mag[i] + 1e-30);
                if (!(d <= 1e-5)) bad++;
                if (d > worst || d != d) worst = d;
            }
            for (int64_t n = N; n < ldc; n++) /* the padding between rows of C is not written */
                if (memcmp(&c[(size_t)m * ldc + n], &c0[(size_t)m * ldc + n], 4)) pad_touched++;
        }
    }
};

static void skinny_case(int form, int M, int N, int K, int pad, float beta, uint64_t seed) {
    Rng r(seed);
    SkinnyProb p(M, N, K, pad, beta, r);
    bool ok = p.upload();
    cudaError_t e = cudaErrorUnknown;
    if (ok) {
        e = kd_cu_gemm_skinny_form(form, M, N, K, (const __nv_bfloat16 *)p.da, p.lda, (const __nv_bfloat16 *)p.dw,
                                   p.ldw, beta, (float *)p.dc, p.ldc, 0);
        ok = e == cudaSuccess && cudaDeviceSynchronize() == cudaSuccess && p.fetch();
    }
    double worst = 0;
    size_t bad = 0, pad_touched = 0;
    if (ok) p.check(worst, bad, pad_touched);
    report(ok && bad == 0 && pad_touched == 0,
           "[skinny GEMM form %d M=%d N=%d K=%d lda=%lld ldw=%lld ldc=%lld beta=%g] %s: max error %.2e of the "
           "terms' magnitude (%zu over 1e-5), %zu padding elements touched",
           form, M, N, K, (long long)p.lda, (long long)p.ldw, (long long)p.ldc, beta,
           ok ? "ran" : cudaGetErrorString(e), worst, bad, pad_touched);
    (void)cudaGetLastError();
}

// kd_cu_gemm_skinny_pair: two products of different N (and padding) in one launch, each
// against its own float64 reference.
static void skinny_pair_case(int form, int M, int N0, int N1, int K, float beta, uint64_t seed) {
    Rng r(seed);
    SkinnyProb p0(M, N0, K, 8, beta, r), p1(M, N1, K, 0, beta, r);
    bool ok = p0.upload() && p1.upload();
    cudaError_t e = cudaErrorUnknown;
    if (ok) {
        const kd_skinny_job j0 = p0.job(), j1 = p1.job();
        e = kd_cu_gemm_skinny_pair(form, M, K, &j0, &j1, beta, 0);
        ok = e == cudaSuccess && cudaDeviceSynchronize() == cudaSuccess && p0.fetch() && p1.fetch();
    }
    double w0 = 0, w1 = 0;
    size_t b0 = 0, b1 = 0, t0 = 0, t1 = 0;
    if (ok) p0.check(w0, b0, t0), p1.check(w1, b1, t1);
    report(ok && b0 + b1 == 0 && t0 + t1 == 0,
           "[skinny GEMM pair form %d M=%d N=%d + %d K=%d beta=%g] %s: max error %.2e / %.2e of the terms' magnitude "
           "(%zu / %zu over 1e-5), %zu padding elements touched",
           form, M, N0, N1, K, beta, ok ? "ran" : cudaGetErrorString(e), w0, w1, b0, b1, t0 + t1);
    (void)cudaGetLastError();
}

// kd_cu_gemm_skinny_swiglu against a float64 reference: gate and up rows interleaved in W,
// Y = bf16(silu(gate) * up) over a NaN-poisoned Y whose padding between rows must stay.
static void skinny_swiglu_case(int form, int M, int FF, int K, int pad, uint64_t seed) {
    Rng r(seed);
    const int64_t lda = K + pad, ldw = K + 8 * (pad > 0), ldy = FF + pad;
    std::vector<uint16_t> a((size_t)M * lda), w((size_t)2 * FF * ldw), y0((size_t)M * ldy, 0x7fc0);
    for (auto &x : a) x = to_bf16_bits((float)r.normal());
    for (auto &x : w) x = to_bf16_bits((float)(0.05 * r.normal()));
    void *da = NULL, *dw = NULL, *dy = NULL;
    bool ok = to_dev(&da, a) && to_dev(&dw, w) && to_dev(&dy, y0);
    cudaError_t e = cudaErrorUnknown;
    std::vector<uint16_t> y(y0.size());
    if (ok) {
        e = kd_cu_gemm_skinny_swiglu(form, M, FF, K, (const __nv_bfloat16 *)da, lda, (const __nv_bfloat16 *)dw, ldw,
                                     (__nv_bfloat16 *)dy, ldy, 0);
        ok = e == cudaSuccess && cudaDeviceSynchronize() == cudaSuccess &&
             cudaMemcpy(y.data(), dy, y.size() * 2, cudaMemcpyDeviceToHost) == cudaSuccess;
    }
    double worst = 0;
    size_t bad = 0, pad_touched = 0;
    for (int m = 0; ok && m < M; m++) {
        for (int j = 0; j < FF; j++) {
            double g = 0, u = 0, mg = 0, mu = 0;
            for (int k = 0; k < K; k++) {
                const double x = from_bf16_bits(a[(size_t)m * lda + k]);
                const double tg = x * from_bf16_bits(w[(size_t)(2 * j) * ldw + k]);
                const double tu = x * from_bf16_bits(w[(size_t)(2 * j + 1) * ldw + k]);
                g += tg, u += tu, mg += fabs(tg), mu += fabs(tu);
            }
            const double ref = g / (1.0 + exp(-g)) * u, got = from_bf16_bits(y[(size_t)m * ldy + j]);
            /* bf16 rounding of the result, plus fp32 accumulation in gate and up */
            const double d = fabs(got - ref) / (4e-3 * fabs(ref) + 1e-5 * (1 + mg) * (1 + mu));
            if (!(d <= 1)) bad++;
            if (d > worst || d != d) worst = d;
        }
        for (int64_t j = FF; j < ldy; j++)
            if (y[(size_t)m * ldy + j] != y0[(size_t)m * ldy + j]) pad_touched++;
    }
    report(ok && bad == 0 && pad_touched == 0,
           "[skinny gate|up + SwiGLU form %d M=%d FF=%d K=%d lda=%lld ldw=%lld ldy=%lld] %s: worst error %.2f of the "
           "tolerance (%zu over), %zu padding elements touched",
           form, M, FF, K, (long long)lda, (long long)ldw, (long long)ldy, ok ? "ran" : cudaGetErrorString(e), worst,
           bad, pad_touched);
    cudaFree(da), cudaFree(dw), cudaFree(dy);
    (void)cudaGetLastError();
}

// kd_cu_gemm_skinny_epi: the copy epilogue (form 5) gives bf16 of the C it stored, bit for
// bit, over a NaN-poisoned copy whose other columns stay; C itself against the float64
// reference.
static void skinny_epi_case(int M, int N, int K, int pad, float beta, uint64_t seed) {
    Rng r(seed);
    SkinnyProb p(M, N, K, pad, beta, r);
    const int64_t c0 = N / 3, nc = N - N / 3 - 1 > 0 ? N - N / 3 - 1 : 1;
    const size_t ny = (size_t)M * nc;
    std::vector<uint16_t> y0(ny + 64, 0x7fc0), y(ny + 64);
    void *dy = NULL;
    bool ok = p.upload() && to_dev(&dy, y0);
    kd_skinny_epi ep = {(__nv_bfloat16 *)dy, c0, nc};
    cudaError_t e = cudaErrorUnknown;
    if (ok) {
        e = kd_cu_gemm_skinny_epi(5, M, N, K, (const __nv_bfloat16 *)p.da, p.lda, (const __nv_bfloat16 *)p.dw, p.ldw,
                                  beta, (float *)p.dc, p.ldc, &ep, 0);
        ok = e == cudaSuccess && cudaDeviceSynchronize() == cudaSuccess && p.fetch() &&
             cudaMemcpy(y.data(), dy, y.size() * 2, cudaMemcpyDeviceToHost) == cudaSuccess;
    }
    size_t diff = 0;
    for (int m = 0; ok && m < M; m++)
        for (int64_t j = 0; j < nc; j++)
            diff += y[(size_t)m * nc + j] != to_bf16_bits(p.c[(size_t)m * p.ldc + c0 + j]);
    for (size_t i = ny; ok && i < y.size(); i++) diff += y[i] != y0[i]; /* past the copy: untouched */
    double worst = 0;
    size_t bad = 0, pad_touched = 0;
    if (ok) p.check(worst, bad, pad_touched);
    report(ok && diff == 0 && bad == 0 && pad_touched == 0,
           "[skinny GEMM bf16 copy epilogue M=%d N=%d K=%d beta=%g] %s: %zu of %zu outputs differ from bf16 of C "
           "(or past the copy), C's max error %.2e of the terms' magnitude (%zu over 1e-5), %zu padding elements "
           "touched",
           M, N, K, beta, ok ? "ran" : cudaGetErrorString(e), diff, y.size(), worst, bad, pad_touched);
    cudaFree(dy);
    (void)cudaGetLastError();
}

static void skinny_checks(uint64_t seed, bool quick) {
    struct S {
        int M, N, K, pad;
        float beta;
    };
    const S full[] = {{1, 40, 256, 8, 0.f},    {3, 2304, 2304, 8, 1.f}, {8, 17, 512, 0, 0.f},
                      {13, 100, 9216, 16, 1.f}, {32, 1030, 4096, 8, 0.f}, {16, 4096, 128, 0, 0.f},
                      {5, 20000, 96, 8, 1.f},  {24, 33, 32, 0, 1.f},   {2, 4099, 9216, 8, 1.f},
                      {4, 1000, 160, 0, 0.f}};
    for (size_t i = 0; i < sizeof full / sizeof full[0]; i++) {
        if (quick && i % 2) continue;
        for (int form = 0; form <= KD_SKINNY_FORMS; form++) /* the row forms (5..) take M <= 4 */
            if (form < 5 || full[i].M <= 4)
                skinny_case(form, full[i].M, full[i].N, full[i].K, full[i].pad, full[i].beta, seed + i);
    }
    /* pairs: every form that pairs, f_proj.1 / g_proj.1's shape of the 48B preset and odd ones */
    const int pr[][4] = {{1, 4096, 4096, 128}, {3, 4096, 4096, 128}, {8, 4096, 4096, 128}, {1, 37, 300, 256},
                         {4, 1001, 17, 96}, {13, 100, 33, 512}};
    for (size_t i = 0; i < sizeof pr / sizeof pr[0]; i++)
        for (int form = 0; form <= 8; form++)
            if ((form < 5 || pr[i][0] <= 4) && (!quick || i % 2 == 0))
                skinny_pair_case(form, pr[i][0], pr[i][1], pr[i][2], pr[i][3], form % 2 ? 1.f : 0.f,
                                 seed + 200 + 10 * i + form);
    { /* refused before any launch: the split-K forms; a product without C (addresses never read) */
        const __nv_bfloat16 *fake = (const __nv_bfloat16 *)(uintptr_t)256;
        const kd_skinny_job j = {fake, 256, fake, 256, (float *)(uintptr_t)256, 64, 64}, nc = {fake, 256, fake, 256,
                                                                                                NULL, 64, 64};
        const cudaError_t e9 = kd_cu_gemm_skinny_pair(9, 1, 256, &j, &j, 0.f, 0);
        const cudaError_t en = kd_cu_gemm_skinny_pair(5, 1, 256, &j, &nc, 0.f, 0);
        report(e9 == cudaErrorInvalidValue && en == cudaErrorInvalidValue && cudaGetLastError() == cudaSuccess,
               "[skinny GEMM pair refuses form 9 and a product without C] %s, %s", cudaGetErrorName(e9),
               cudaGetErrorName(en));
    }
    /* the copy epilogue: the 48B preset's input projection and an odd shape */
    skinny_epi_case(1, 12576, 2304, 0, 0.f, seed + 400);
    skinny_epi_case(3, 1001, 96, 8, 1.f, seed + 401);
    { /* refused: another form, no copy, columns past N */
        const __nv_bfloat16 *fake = (const __nv_bfloat16 *)(uintptr_t)256;
        float *fc = (float *)(uintptr_t)256;
        const kd_skinny_epi cp = {(__nv_bfloat16 *)(uintptr_t)256, 0, 8}, none = {NULL, 0, 8},
                            past = {(__nv_bfloat16 *)(uintptr_t)256, 60, 8};
        const cudaError_t e1 = kd_cu_gemm_skinny_epi(9, 1, 64, 256, fake, 256, fake, 256, 0.f, fc, 64, &cp, 0);
        const cudaError_t e2 = kd_cu_gemm_skinny_epi(5, 1, 64, 256, fake, 256, fake, 256, 0.f, fc, 64, &none, 0);
        const cudaError_t e3 = kd_cu_gemm_skinny_epi(5, 1, 64, 256, fake, 256, fake, 256, 0.f, fc, 64, &past, 0);
        report(e1 == cudaErrorInvalidValue && e2 == cudaErrorInvalidValue && e3 == cudaErrorInvalidValue &&
                   cudaGetLastError() == cudaSuccess,
               "[skinny GEMM copy epilogue refused: form 9, no copy, columns past N] %s %s %s", cudaGetErrorName(e1),
               cudaGetErrorName(e2), cudaGetErrorName(e3));
        /* the pair with the conv: only in the forms that pair, only with a conv to run */
        const kd_skinny_job j = {fake, 256, fake, 256, fc, 64, 64};
        const kd_cu_conv_args ca = {fc, 64, 1, 16, 16, NULL, fc, 7, NULL, 4, fc, fc, fc, 0, 0, 0};
        const cudaError_t e4 = kd_cu_gemm_skinny_pair_conv(9, 1, 256, &j, &j, 0.f, &ca, 0);
        const cudaError_t e5 = kd_cu_gemm_skinny_pair_conv(5, 1, 256, &j, &j, 0.f, NULL, 0);
        report(e4 == cudaErrorInvalidValue && e5 == cudaErrorInvalidValue && cudaGetLastError() == cudaSuccess,
               "[skinny GEMM pair with the conv refused: form 9, no conv] %s %s", cudaGetErrorName(e4),
               cudaGetErrorName(e5));
    }
    /* form 0 (1 row: the row form, 2-4: the segment-diagonal form), then each form at every M */
    const int sw[][4] = {{1, 9216, 2304, 8}, {2, 9216, 2304, 8}, {4, 9216, 2304, 0}, {1, 37, 256, 0},
                         {3, 100, 512, 8},   {4, 1000, 96, 0},   {2, 33, 160, 8}};
    for (size_t i = 0; i < sizeof sw / sizeof sw[0]; i++)
        for (int form : {0, 5, 11})
            if (!quick || (form == 0 && i != 2))
                skinny_swiglu_case(form, sw[i][0], sw[i][1], sw[i][2], sw[i][3], seed + 100 + 10 * i + form);
    {
        const __nv_bfloat16 *fake = (const __nv_bfloat16 *)(uintptr_t)256;
        __nv_bfloat16 *fy = (__nv_bfloat16 *)(uintptr_t)256;
        const cudaError_t e = kd_cu_gemm_skinny_swiglu(0, 5, 64, 256, fake, 256, fake, 256, fy, 64, 0);
        const cudaError_t e12 = kd_cu_gemm_skinny_swiglu(12, 2, 64, 256, fake, 256, fake, 256, fy, 64, 0);
        report(e == cudaErrorInvalidValue && e12 == cudaErrorInvalidValue && cudaGetLastError() == cudaSuccess,
               "[skinny gate|up + SwiGLU refuses M=5 and form 12] %s %s", cudaGetErrorName(e), cudaGetErrorName(e12));
    }
    /* refused: too many rows, K not a multiple of 32, a leading dimension not a multiple of 8 */
    const int refused[][5] = {{33, 64, 256, 256, 256}, {4, 64, 100, 100, 100}, {4, 64, 256, 260, 256}};
    for (const auto &x : refused) {
        const cudaError_t e = kd_cu_gemm_skinny(x[0], x[1], x[2], (const __nv_bfloat16 *)NULL, x[3],
                                                (const __nv_bfloat16 *)NULL, x[4], 0.f, NULL, x[1], 0);
        report(e == cudaErrorInvalidValue && cudaGetLastError() == cudaSuccess,
               "[skinny GEMM refuses M=%d N=%d K=%d lda=%d ldw=%d] %s", x[0], x[1], x[2], x[3], x[4],
               cudaGetErrorName(e));
    }
}

// --------------------------------------------------------------- cuBLASLt products (h)

// bf16 bits of a value of at most 2^emax drawn from a hash of (seed, row, column): sign, one of
// 4 exponents and 7 mantissa bits, so device and host make the same numbers without copying
// hundreds of megabytes of weights.
__host__ __device__ static inline uint16_t hash_bf16(uint64_t seed, uint64_t i, int emax) {
    uint64_t z = seed + i * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    const uint32_t sign = (uint32_t)(z & 1), ex = (uint32_t)(127 + emax - 3 + ((z >> 1) & 3)),
                   mant = (uint32_t)((z >> 3) & 0x7f);
    return (uint16_t)(sign << 15 | ex << 7 | mant);
}

__global__ void hash_fill_kernel(uint16_t *p, int64_t rows, int64_t cols, int64_t ld, uint64_t seed, int emax) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < rows * cols;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / cols, c = i % cols;
        p[r * ld + c] = hash_bf16(seed, (uint64_t)i, emax);
    }
}

// One product through kd_cu_lt_gemm: hashed bf16 A [M][lda] and W [N][ldw], C [M][ldc] NaN
// (beta 0) or random (beta 1), padding of C's rows NaN; checked at `samples` random outputs
// (every output where samples is 0) against float64, within 1e-5 of the terms' magnitude;
// every output of C finite, its padding untouched. nb > 1: through kd_cu_lt_gemm_split instead (nb K
// slices, C nb dense blocks of [M][N], beta 0, pad 0 for C), the slices' sum checked as above.
// c16: through kd_cu_lt_gemm_bf16 (C bf16, beta 0), within 2^-8 of the output more (its rounding).
// A device array of out.size() fp32 (bf16 = 0) or bf16 (bf16 = 1) values back into out as fp32.
static bool fetch_f32(std::vector<float> &out, const void *d, int bf16) {
    if (!bf16) return cudaMemcpy(out.data(), d, out.size() * 4, cudaMemcpyDeviceToHost) == cudaSuccess;
    std::vector<uint16_t> h(out.size());
    if (cudaMemcpy(h.data(), d, h.size() * 2, cudaMemcpyDeviceToHost) != cudaSuccess) return false;
    for (size_t i = 0; i < h.size(); i++) out[i] = (float)from_bf16_bits(h[i]);
    return true;
}

static void lt_case(kd_cu_lt *lt, int64_t M, int64_t N, int64_t K, int pad, float beta, uint64_t seed, int samples,
                    const char *what, void *ws, int nb = 1, bool c16 = false) {
    const int64_t lda = K + pad, ldw = K + pad, ldc = nb > 1 ? N : N + pad, nc = M * ldc * nb;
    void *da = NULL, *dw = NULL, *dc = NULL;
    std::vector<float> c0((size_t)nc);
    Rng r(seed);
    for (auto &x : c0) x = beta != 0.f ? (float)r.normal() : NAN;
    for (int64_t m = 0; m < M * nb; m++)
        for (int64_t n = N; n < ldc; n++) c0[(size_t)(m * ldc + n)] = NAN;
    std::vector<uint16_t> c0h((size_t)nc, 0x7fc0); /* bf16 NaN */
    bool ok = cudaMalloc(&da, (size_t)(M * lda) * 2) == cudaSuccess &&
              cudaMalloc(&dw, (size_t)(N * ldw) * 2) == cudaSuccess && (c16 ? to_dev(&dc, c0h) : to_dev(&dc, c0));
    cublasStatus_t st = CUBLAS_STATUS_NOT_INITIALIZED;
    if (ok) {
        hash_fill_kernel<<<1024, 256>>>((uint16_t *)da, M, K, lda, seed * 2 + 1, 0);
        hash_fill_kernel<<<1024, 256>>>((uint16_t *)dw, N, K, ldw, seed * 2 + 2, -4);
        ok = cudaGetLastError() == cudaSuccess;
    }
    if (ok) {
        const __nv_bfloat16 *A = (const __nv_bfloat16 *)da, *W = (const __nv_bfloat16 *)dw;
        st = nb > 1 ? kd_cu_lt_gemm_split(lt, M, N, K, A, lda, W, ldw, nb, (float *)dc, ws, KD_LT_WORKSPACE, 0)
             : c16  ? kd_cu_lt_gemm_bf16(lt, M, N, K, A, lda, W, ldw, (__nv_bfloat16 *)dc, ldc, ws, KD_LT_WORKSPACE, 0)
                    : kd_cu_lt_gemm(lt, M, N, K, A, lda, W, ldw, beta, (float *)dc, ldc, ws, KD_LT_WORKSPACE, 0);
        ok = st == CUBLAS_STATUS_SUCCESS && cudaDeviceSynchronize() == cudaSuccess;
    }
    std::vector<float> c(c0.size());
    if (ok) ok = fetch_f32(c, dc, c16);
    double worst = 0;
    size_t bad = 0, nonfinite = 0, pad_touched = 0, checked = 0;
    if (ok) {
        for (int64_t m = 0; m < M * nb; m++) {
            for (int64_t n = 0; n < N; n++) nonfinite += !std::isfinite(c[(size_t)(m * ldc + n)]);
            for (int64_t n = N; n < ldc; n++) pad_touched += !std::isnan(c[(size_t)(m * ldc + n)]);
        }
        const int64_t total = samples > 0 ? samples : M * N;
        for (int64_t i = 0; i < total; i++, checked++) {
            const int64_t m = samples > 0 ? (int64_t)(r.next() % (uint64_t)M) : i / N,
                          n = samples > 0 ? (int64_t)(r.next() % (uint64_t)N) : i % N;
            double sum = 0, mag = 0;
            for (int64_t k = 0; k < K; k++) {
                const double t = from_bf16_bits(hash_bf16(seed * 2 + 1, (uint64_t)(m * K + k), 0)) *
                                 from_bf16_bits(hash_bf16(seed * 2 + 2, (uint64_t)(n * K + k), -4));
                sum += t, mag += fabs(t);
            }
            double got = 0; /* the slices' partial sums added (one block where nb is 1) */
            for (int b = 0; b < nb; b++) got += c[(size_t)((b * M + m) * ldc + n)];
            const double cc = beta != 0.f && nb == 1 && !c16 ? (double)beta * c0[(size_t)(m * ldc + n)] : 0.0;
            const double tol = c16 ? fabs(sum) / 256 : 0.0; /* bf16: the output's rounding */
            const double d = fabs(got - (sum + cc)) / (mag + fabs(cc) + 1e-30);
            if (!(d <= 1e-5 + tol / (mag + fabs(cc) + 1e-30))) bad++;
            if (d > worst || d != d) worst = d;
        }
    }
    char form[32] = "";
    if (nb > 1) snprintf(form, sizeof form, " in %d K slices,", nb);
    else if (c16) snprintf(form, sizeof form, ", bf16 out,");
    report(ok && bad == 0 && nonfinite == 0 && pad_touched == 0,
           "[cuBLASLt GEMM%s %s M=%lld N=%lld K=%lld pad=%d beta=%g] %s: max error %.2e of the terms' magnitude "
           "(%zu of %zu checked over the bound), %zu outputs not finite, %zu padding elements touched",
           form, what, (long long)M, (long long)N,
           (long long)K, pad, beta, ok ? "ran" : st != CUBLAS_STATUS_SUCCESS ? cublasGetStatusString(st) : "CUDA error",
           worst, bad, checked, nonfinite, pad_touched);
    cudaFree(da), cudaFree(dw), cudaFree(dc);
    (void)cudaGetLastError();
}

// kd_cu_rmsnorm_add on fresh random rows: x [M + 1][D] (row M a neighbour), np slices of partial sums
// [np][M][D], weights; y poisoned (NaN, fp32 or bf16, also a row M). Checked: x[m] written back as ((x + p0) + p1)
// ... in fp32, bit for bit against the host's same sums; y against float64 within 1e-5 (fp32) or 1e-2 (bf16) of
// each output's magnitude (+ 1e-6 of the row's largest); row M of x and of y untouched; refused arguments.
static void norm_add_case(int64_t M, int64_t D, int np, int bf, uint64_t seed) {
    Rng r(seed);
    std::vector<float> x((size_t)((M + 1) * D)), parts((size_t)(np * M * D)), w((size_t)D);
    for (auto &v : x) v = (float)r.normal();
    for (auto &v : parts) v = (float)r.normal();
    for (auto &v : w) v = (float)(0.5 + r.u01());
    std::vector<float> y0((size_t)((M + 1) * D), NAN);
    std::vector<uint16_t> y0h(y0.size(), 0x7fc0);
    void *dx = NULL, *dp = NULL, *dw = NULL, *dy = NULL;
    bool ok = to_dev(&dx, x) && to_dev(&dp, parts) && to_dev(&dw, w) && (bf ? to_dev(&dy, y0h) : to_dev(&dy, y0));
    const double eps = 1e-6;
    cudaError_t e = cudaErrorUnknown;
    if (ok) {
        e = kd_cu_rmsnorm_add(bf, dy, (float *)dx, (const float *)dp, np, M, D, (const float *)dw, eps, 0);
        ok = e == cudaSuccess && cudaDeviceSynchronize() == cudaSuccess;
    }
    std::vector<float> xg(x.size()), yg(y0.size());
    if (ok) ok = cudaMemcpy(xg.data(), dx, xg.size() * 4, cudaMemcpyDeviceToHost) == cudaSuccess;
    if (ok) ok = fetch_f32(yg, dy, bf);
    size_t x_diff = 0, y_bad = 0, touched = 0;
    double worst = 0;
    const double tol = bf ? 1e-2 : 1e-5;
    for (int64_t m = 0; ok && m < M; m++) {
        std::vector<float> v((size_t)D);
        double ss = 0, big = 0;
        for (int64_t i = 0; i < D; i++) {
            float a = x[(size_t)(m * D + i)];
            for (int p = 0; p < np; p++) a += parts[(size_t)((p * M + m) * D + i)];
            v[(size_t)i] = a, ss += (double)a * a;
            x_diff += memcmp(&a, &xg[(size_t)(m * D + i)], 4) != 0;
        }
        const double rr = 1.0 / sqrt(ss / (double)D + eps);
        for (int64_t i = 0; i < D; i++) big = std::max(big, fabs(v[(size_t)i] * rr * w[(size_t)i]));
        for (int64_t i = 0; i < D; i++) {
            const double ref = v[(size_t)i] * rr * w[(size_t)i], got = yg[(size_t)(m * D + i)];
            const double d = fabs(got - ref) / (fabs(ref) + 1e-6 * big);
            if (!(d <= tol)) y_bad++;
            if (d > worst || d != d) worst = d;
        }
    }
    for (int64_t i = 0; ok && i < D; i++)
        touched += memcmp(&x[(size_t)(M * D + i)], &xg[(size_t)(M * D + i)], 4) != 0 ||
                   !std::isnan(yg[(size_t)(M * D + i)]);
    report(ok && x_diff == 0 && y_bad == 0 && touched == 0,
           "[RMSNorm adding %d slices %s M=%lld D=%lld] %s: residual written back %zu differ (bit for bit), output max "
           "error %.2e (%zu over %.0e), neighbour row elements touched %zu",
           np, bf ? "bf16" : "fp32", (long long)M, (long long)D, ok ? "ran" : cudaGetErrorString(e), x_diff, worst,
           y_bad, tol, touched);
    const cudaError_t a = kd_cu_rmsnorm_add(bf, dy, (float *)dx, (const float *)dp, 0, M, D, (const float *)dw, eps, 0),
                      b = kd_cu_rmsnorm_add(bf, dy, (float *)dx, (const float *)dp, np, M, KD_NORM_ADD_MAX_D + 1,
                                            (const float *)dw, eps, 0),
                      c = kd_cu_rmsnorm_add(bf, dy, (float *)dx, (const float *)dp, KD_NORM_ADD_MAX + 1, M, D,
                                            (const float *)dw, eps, 0);
    report(a == cudaErrorInvalidValue && b == cudaErrorInvalidValue && c == cudaErrorInvalidValue,
           "[RMSNorm adding slices: refused] no slice, D %d, %d slices: %s / %s / %s", KD_NORM_ADD_MAX_D + 1,
           KD_NORM_ADD_MAX + 1, cudaGetErrorString(a), cudaGetErrorString(b), cudaGetErrorString(c));
    cudaFree(dx), cudaFree(dp), cudaFree(dw), cudaFree(dy);
    (void)cudaGetLastError();
}

// kd_backend_create by name with the environment's KDECODE_CUDA_LT_TABLE (the worker's
// --backend): "auto" on a usable GPU whose backend cannot be made (a table that does not parse,
// a file that is missing) fails with that reason instead of running on the CPU; a table that
// parses gives the CUDA backend; "cpu" does not read it. The variable as it was afterwards.
static void backend_select_checks() {
    const char *was = getenv("KDECODE_CUDA_LT_TABLE");
    std::string saved = was ? was : "";
    /* Two files made by mkstemp(3) in $TMPDIR (else /tmp). Its template must end in exactly six
     * 'X' characters, which it overwrites in place with a unique suffix; the code is complete. */
    const char *td = getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    std::string tb_path = std::string(td) + "/kd_lt_table_XXXXXX", tg_path = tb_path;
    char *bad = &tb_path[0], *good = &tg_path[0];
    const int fb = mkstemp(bad), fg = mkstemp(good);
    const char *tb = "# the fields of one entry, the last missing\n2304 4096 48 48 66 312 35 1 0 0 1 2\n";
    const char *tg = "2304 4096 48 48 66 312 35 1 0 0 1 2 0\n";
    const bool files = fb >= 0 && fg >= 0 && write(fb, tb, strlen(tb)) == (ssize_t)strlen(tb) &&
                       write(fg, tg, strlen(tg)) == (ssize_t)strlen(tg);
    if (fb >= 0) close(fb);
    if (fg >= 0) close(fg);
    report(files, "[backend selection: table files written] %s %s", bad, good);
    struct Case {
        const char *name, *file;
        int bf;
        const char *want; // the backend made, or NULL: refused with a message holding `err`
        const char *err;
    } cases[] = {
        {"auto", bad, 1, nullptr, "line 2: 12 fields"},
        {"cuda", bad, 0, nullptr, "line 2: 12 fields"},
        {"auto", "/nonexistent/kd_lt_table", 1, nullptr, "KDECODE_CUDA_LT_TABLE"},
        {"auto", good, 1, "cuda", nullptr},
        {"auto", "", 0, "cuda", nullptr},
        {"cpu", bad, 0, "cpu", nullptr},
        {"gpu", "", 0, nullptr, "unknown backend"},
    };
    for (const Case &c : cases) {
        if (*c.file) setenv("KDECODE_CUDA_LT_TABLE", c.file, 1);
        else unsetenv("KDECODE_CUDA_LT_TABLE");
        kd_err err = {{0}};
        kd_backend *b = kd_backend_create(c.name, c.bf, &err);
        const char *got = b ? b->ops->name : nullptr;
        const bool ok = c.want ? got && !strcmp(got, c.want) : !b && strstr(err.msg, c.err) != nullptr;
        report(ok, "[backend selection: --backend %s, KDECODE_CUDA_LT_TABLE=%s] %s (%s)", c.name,
               *c.file ? c.file : "(unset)", got ? got : "refused", err.msg);
        if (b) kd_backend_free(b);
    }
    if (was) setenv("KDECODE_CUDA_LT_TABLE", saved.c_str(), 1);
    else unsetenv("KDECODE_CUDA_LT_TABLE");
    if (fb >= 0) unlink(bad);
    if (fg >= 0) unlink(good);
}

static void lt_checks(uint64_t seed, bool quick) {
    kd_cu_lt *lt = NULL;
    void *ws = NULL;
    const cudaError_t e = kd_cu_lt_create(&lt);
    if (!report(e == cudaSuccess && lt && cudaMalloc(&ws, KD_LT_WORKSPACE) == cudaSuccess,
                "[cuBLASLt GEMM handle] %s", cudaGetErrorString(e))) {
        kd_cu_lt_destroy(lt);
        return;
    }
    struct S {
        int M, N, K, pad;
        float beta;
    };
    const S shapes[] = {{1, 40, 256, 8, 0.f},   {5, 2304, 2304, 8, 1.f}, {33, 17, 512, 0, 0.f},
                        {64, 100, 9216, 16, 1.f}, {128, 1030, 4096, 8, 0.f}, {77, 4096, 128, 0, 1.f},
                        {300, 2000, 96, 4, 0.f},  {512, 33, 100, 2, 1.f}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        if (!quick || i % 2 == 0)
            lt_case(lt, shapes[i].M, shapes[i].N, shapes[i].K, shapes[i].pad, shapes[i].beta, seed + i, 0, "shape",
                    ws);
    int plans = 0, picked = 0;
    kd_cu_lt_stats(lt, &plans, &picked);
    const int n_shapes = quick ? 4 : 8;
    report(plans == n_shapes, "[cuBLASLt GEMM plans: one a shape] %d plans after %d shapes", plans, n_shapes);
    lt_case(lt, shapes[0].M, shapes[0].N, shapes[0].K, shapes[0].pad, shapes[0].beta, seed + 50, 0, "again", ws);
    kd_cu_lt_stats(lt, &plans, NULL);
    report(plans == n_shapes, "[cuBLASLt GEMM plans: a shape seen before makes none] %d plans", plans);
    /* K slices (kd_cu_lt_gemm_split) and bf16 outputs (kd_cu_lt_gemm_bf16), the 48B preset's shapes among them;
     * shapes they refuse */
    lt_case(lt, 128, 2304, 4096, 8, 0.f, seed + 60, 4096, "o_proj", ws, 2);
    lt_case(lt, 37, 300, 9216, 0, 0.f, seed + 61, 0, "shape", ws, 3);
    if (!quick) lt_case(lt, 128, 2304, 9216, 0, 0.f, seed + 62, 4096, "down projection", ws, 2);
    if (quick) lt_case(lt, 64, 4096, 2304, 8, 0.f, seed + 63, 4096, "shape", ws, 1, true); /* sanitizers */
    else lt_case(lt, 128, 18432, 2304, 0, 0.f, seed + 63, 4096, "gate|up", ws, 1, true);
    lt_case(lt, 5, 97, 200, 4, 0.f, seed + 64, 0, "shape", ws, 1, true);
    {
        const __nv_bfloat16 *p = (const __nv_bfloat16 *)ws; /* never read: the arguments are refused first */
        float *c = (float *)ws;
        const cublasStatus_t a = kd_cu_lt_gemm_split(lt, 4, 8, 100, p, 100, p, 100, 3, c, ws, KD_LT_WORKSPACE, 0),
                             b = kd_cu_lt_gemm_split(lt, 4, 8, 96, p, 96, p, 96, 1, c, ws, KD_LT_WORKSPACE, 0),
                             d = kd_cu_lt_gemm_split(lt, 4, 8, 96, p, 96, p, 96, KD_LT_MAX_SLICES + 1, c, ws,
                                                     KD_LT_WORKSPACE, 0),
                             f = kd_cu_lt_gemm_split(lt, 4, 8, 60, p, 60, p, 60, 3, c, ws, KD_LT_WORKSPACE, 0);
        report(a == CUBLAS_STATUS_INVALID_VALUE && b == CUBLAS_STATUS_INVALID_VALUE &&
                   d == CUBLAS_STATUS_INVALID_VALUE && f == CUBLAS_STATUS_INVALID_VALUE,
               "[cuBLASLt GEMM in K slices: refused] K 100 in 3, 1 slice, %d slices, slices of 20 keys (not a "
               "multiple of 8): %s / %s / %s / %s", KD_LT_MAX_SLICES + 1, cublasGetStatusString(a),
               cublasGetStatusString(b), cublasGetStatusString(d), cublasGetStatusString(f));
    }
    // the table's shapes at both ends of each entry's rows, with its algorithm where the device is the kind measured
    int major = 0, minor = 0, sms = 0, dev = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    const bool measured_kind = major == 9 && minor == 0 && sms >= 132;
    const kd_lt_entry *tab = NULL;
    const int nt = kd_cu_lt_table(&tab);
    int runs = 0;
    for (int i = 0; i < nt; i++) {
        if (tab[i].N < 1) continue;
        for (int e = 0; e < (tab[i].m_lo == tab[i].m_hi ? 1 : 2); e++) { /* a row count once */
            const int64_t M = e ? tab[i].m_hi : tab[i].m_lo;
            if (quick && tab[i].N * tab[i].K > (64 << 20) / 2) continue; /* sanitizers: weights up to 64 MB */
            int p0 = 0;
            kd_cu_lt_stats(lt, NULL, &p0);
            char what[64];
            snprintf(what, sizeof what, "table entry %d (algorithm %d tile %u split-K %d)", i, tab[i].c.id,
                     tab[i].c.tile, tab[i].c.split_k);
            lt_case(lt, M, tab[i].N, tab[i].K, 0, (i + (int)M) % 2 ? 1.f : 0.f, seed + 100 + 2 * i + (M == tab[i].m_hi),
                    4096, what, ws);
            int p1 = 0;
            kd_cu_lt_stats(lt, NULL, &p1);
            report(p1 == p0 + (measured_kind ? 1 : 0),
                   "[cuBLASLt GEMM %s M=%lld: the table's algorithm %s] plans with a table choice %d -> %d", what,
                   (long long)M, measured_kind ? "taken" : "not taken on another kind of device", p0, p1);
            runs++;
        }
    }
    note("cuBLASLt table: %d entries, %d products checked (device cc %d.%d, %d SMs)", nt, runs, major, minor, sms);
    // an operator's table (kd_cu_lt_use_table, as KDECODE_CUDA_LT_TABLE gives it): it replaces the built-in one
    {
        const char *text = "# o_proj at 48 rows as the built-in table has it; an algorithm id cuBLASLt does not have\n"
                           "2304 4096 48 48 66 312 35 1 0 0 1 2 0\n"
                           "64 512 8 8 999999 1 1 1 0 0 0 0 0\n";
        kd_lt_entry ut[4];
        kd_err te = {{0}};
        const int nu = kd_lt_table_parse(text, strlen(text), ut, 4, &te);
        const cudaError_t ue = nu == 2 ? kd_cu_lt_use_table(lt, ut, nu) : cudaErrorInvalidValue;
        int q0 = -1, q1 = -1, q2 = -1, q3 = -1;
        kd_cu_lt_stats(lt, &plans, &q0);
        report(nu == 2 && ue == cudaSuccess && plans == 0 && q0 == 0,
               "[cuBLASLt operator's table: set, the plans made dropped] %d entries (%s), %s, %d plans", nu, te.msg,
               cudaGetErrorString(ue), plans);
        lt_case(lt, 48, 2304, 4096, 0, 0.f, seed + 300, 4096, "operator's table entry", ws);
        kd_cu_lt_stats(lt, NULL, &q1);
        report(q1 == (measured_kind ? 1 : q1), "[cuBLASLt operator's table: its configuration taken%s] %d",
               measured_kind ? "" : " (not asserted on another kind of device)", q1);
        lt_case(lt, 8, 64, 512, 0, 1.f, seed + 301, 0, "operator's table, an unknown algorithm", ws);
        lt_case(lt, 128, 2304, 9216, 0, 0.f, seed + 302, 4096, "operator's table, a built-in entry's shape", ws);
        kd_cu_lt_stats(lt, NULL, &q2);
        report(q2 == q1, "[cuBLASLt operator's table: an unknown algorithm and shapes it lacks take the heuristic's "
                         "first] picked %d -> %d", q1, q2);
        const cudaError_t e0 = kd_cu_lt_use_table(lt, NULL, 0);
        lt_case(lt, 128, 2304, 9216, 0, 1.f, seed + 303, 4096, "an empty operator's table", ws);
        kd_cu_lt_stats(lt, NULL, &q3);
        const cudaError_t bad1 = kd_cu_lt_use_table(lt, NULL, 3), bad2 = kd_cu_lt_use_table(lt, ut, -1);
        report(e0 == cudaSuccess && q3 == 0 && bad1 == cudaErrorInvalidValue && bad2 == cudaErrorInvalidValue,
               "[cuBLASLt operator's table: an empty one turns the built-in table off (picked %d); no entries "
               "given or a negative count refused: %s, %s]",
               q3, cudaGetErrorString(bad1), cudaGetErrorString(bad2));
    }
    // past KD_LT_PLANS shapes the oldest plans are replaced; the products stay right
    for (int M = 1; M <= KD_LT_PLANS + 4; M++)
        lt_case(lt, M, 24, 32, 0, 0.f, seed + 1000 + M, M > KD_LT_PLANS - 2 ? 0 : 64, "many shapes", ws);
    kd_cu_lt_stats(lt, &plans, NULL);
    report(plans == KD_LT_PLANS, "[cuBLASLt GEMM plans: at most %d] %d", KD_LT_PLANS, plans);
    kd_cu_lt_set_table(lt, 0);
    kd_cu_lt_stats(lt, &plans, NULL);
    report(plans == 0, "[cuBLASLt GEMM plans dropped when the table is switched] %d", plans);
    /* refused: no rows, a leading dimension below K or N, no output, too many rows */
    const int64_t bad[][6] = {{0, 64, 256, 256, 256, 64}, {4, 64, 256, 128, 256, 64}, {4, 64, 256, 256, 100, 64},
                              {4, 64, 256, 256, 256, 32}, {(int64_t)1 << 31, 64, 256, 256, 256, 64}};
    for (const auto &x : bad) {
        const __nv_bfloat16 *fake = (const __nv_bfloat16 *)ws;
        const cublasStatus_t s =
            kd_cu_lt_gemm(lt, x[0], x[1], x[2], fake, x[3], fake, x[4], 0.f, (float *)ws, x[5], ws, KD_LT_WORKSPACE, 0);
        report(s == CUBLAS_STATUS_INVALID_VALUE && cudaGetLastError() == cudaSuccess,
               "[cuBLASLt GEMM refuses M=%lld N=%lld K=%lld lda=%lld ldw=%lld ldc=%lld] %s", (long long)x[0],
               (long long)x[1], (long long)x[2], (long long)x[3], (long long)x[4], (long long)x[5],
               cublasGetStatusString(s));
    }
    const cublasStatus_t s0 =
        kd_cu_lt_gemm(lt, 4, 64, 256, NULL, 256, (const __nv_bfloat16 *)ws, 256, 0.f, (float *)ws, 64, ws,
                      KD_LT_WORKSPACE, 0);
    report(s0 == CUBLAS_STATUS_INVALID_VALUE, "[cuBLASLt GEMM refuses no A] %s", cublasGetStatusString(s0));
    kd_cu_lt_stats(lt, &plans, NULL);
    report(plans == 0, "[cuBLASLt GEMM: refused products make no plan] %d", plans);
    kd_cu_lt_destroy(lt);
    cudaFree(ws);
}

// ------------------------------------------------------------------------------ main

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 2 || (argc > 2 && strcmp(argv[2], "quick") && strcmp(argv[2], "skinny") && strcmp(argv[2], "fused") &&
                      strcmp(argv[2], "prefill"))) {
        fprintf(stderr, "usage: %s ORACLE_DIR [quick | skinny | fused | prefill]\n", argv[0]);
        return 2;
    }
    const bool quick = argc > 2;
    const bool skinny_only = quick && !strcmp(argv[2], "skinny"); /* the skinny kernel's checks alone (sanitizers) */
    kd_cuda_info info;
    kd_cuda_describe(&info);
    if (kd_cuda_device_count() == 0) {
        printf("no CUDA device\n");
        return 2;
    }
    printf("device: %s (cc %d, %.1f GiB), cudart %d, driver %d, cublas %d\n", info.device0_name, info.device0_cc,
           info.device0_mem_bytes / 1073741824.0, info.cudart_version, info.driver_version, info.cublas_version);
    uint64_t seed = 20251129;
    if (getenv("KDECODE_TEST_SEED")) seed = strtoull(getenv("KDECODE_TEST_SEED"), NULL, 0);
    printf("seed: KDECODE_TEST_SEED=%llu\n", (unsigned long long)seed);
    // name, D, L, H, HV, K, V, W, conv, I, vocab, lb, lbv, neg, tied, mixed
    const Spec specs[] = {
        {"A:H2-HV4-K32-V64", 96, 2, 2, 4, 32, 64, 4, 1, 160, 211, 0, 0, 0, 0, 1},
        {"B:K128-V128", 128, 2, 2, 2, 128, 128, 4, 1, 192, 300, 0, 0, 0, 0, 0},
        {"C:noconv-lb-neg-tied", 64, 3, 1, 2, 64, 128, 4, 0, 128, 150, 1, -5.0, 1, 1, 1},
        {"D:W2-lb-tied", 64, 1, 2, 2, 32, 32, 2, 1, 96, 97, 1, -3.0, 0, 1, 0},
        {"E:W1-HV3-V48", 48, 2, 1, 3, 64, 48, 1, 1, 64, 120, 0, 0, 1, 0, 1},
        /* value heads wider than 256: the gated norm's loop past one round of loads per lane */
        {"F:HV2-K32-V320", 64, 1, 1, 2, 32, 320, 4, 1, 64, 97, 0, 0, 0, 0, 0},
        /* a model width past the RMSNorm's first pass (1024 threads of 8 channels): its later passes */
        {"G:D8224", 8224, 1, 1, 1, 32, 32, 4, 1, 64, 97, 0, 0, 0, 0, 0},
        /* an MLP width not a multiple of 4: SwiGLU's one-column kernel (else 4 columns a thread) */
        {"H:I66", 64, 1, 1, 2, 32, 32, 4, 1, 66, 97, 0, 0, 0, 0, 1},
        /* products of more than 256 keys (bf16): the skinny kernel's segment-diagonal form at 2-4 rows */
        {"I:D384-V192", 384, 1, 2, 2, 64, 192, 4, 1, 320, 97, 0, 0, 0, 0, 0},
    };
    const kd_commit_mode modes[] = {KD_COMMIT_DEFERRED, KD_COMMIT_EAGER, KD_COMMIT_STORE_ALL};
    if (quick && !strcmp(argv[2], "fused")) { /* the conv + prepare kernel's cases alone (racecheck) */
        g_plain_order = true;
        conv_prep_checks(seed + 37);
        for (int v = 9; v <= 10; v++) graph_case(specs[0], seed + 25 + v, 4, v);
        graph_case(specs[1], seed + 35, 4, 9);
        graph_case(specs[1], seed + 44, 4, 14);
        graph_case(specs[1], seed + 46, 4, 15);
        printf("%s (%d checks, the conv + prepare cases and the store hint alone)\n",
               g_failed ? "CUDA CHECKS FAILED" : "ALL CUDA CHECKS PASSED", g_checks);
        return g_failed ? 1 : 0;
    }
    if (quick && !strcmp(argv[2], "prefill")) { /* the prefill recurrence's forms alone (racecheck) */
        g_plain_order = true;
        prefill_checks(seed + 53);
        for (int form : {0, 1, 3}) {
            kd_cu_prefill_form(form);
            char tag[32];
            snprintf(tag, sizeof tag, ", prefill form %d", form);
            for (int i : {0, 1, 4, 5}) random_case(specs[i], 0, KD_COMMIT_DEFERRED, seed + 1000 * i + 7 + form, 2, tag);
        }
        kd_cu_prefill_form(3);
        printf("%s (%d checks, the prefill recurrence's cases alone)\n",
               g_failed ? "CUDA CHECKS FAILED" : "ALL CUDA CHECKS PASSED", g_checks);
        return g_failed ? 1 : 0;
    }
    skinny_checks(seed + 41, quick);
    if (skinny_only) {
        printf("%s (%d checks, the skinny GEMM's alone)\n", g_failed ? "CUDA CHECKS FAILED" : "ALL CUDA CHECKS PASSED",
               g_checks);
        return g_failed ? 1 : 0;
    }
    conv_prep_checks(seed + 37);
    prefill_checks(seed + 53);
    norm_add_case(7, 2304, 2, 1, seed + 48);
    norm_add_case(3, 96, 1, 0, seed + 49);
    norm_add_case(2, 8192, 3, 0, seed + 50);
    norm_add_case(5, 33, 2, 1, seed + 51);
    /* not in the skinny mode (racecheck): these run cuBLAS's kernels, none of this project's; racecheck
     * reported hazards inside them (its Hopper nvjet kernels; logs/cuda_test_racecheck_cublas_h200_b911e05.log) */
    lt_checks(seed + 43, quick);
    backend_select_checks();
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++)
        for (int bf = 0; bf < 2; bf++)
            for (kd_commit_mode mode : modes) {
                if (quick && (bf || i >= 3)) continue;
                random_case(specs[i], bf, mode, seed + 1000 * i, quick ? 4 : (bf ? 8 : 14));
            }
    if (!quick) ksplit_default_case(specs[8], seed + 61);
    /* the prefill recurrence's other forms (kd_cu_prefill_form; the cases above run the default) */
    for (int form : {0, 1}) {
        kd_cu_prefill_form(form);
        char tag[32];
        snprintf(tag, sizeof tag, ", prefill form %d", form);
        for (int i : {0, 1, 2, 4, 5}) {
            if (form == 0 && (i == 0 || i == 2)) continue;
            random_case(specs[i], 0, KD_COMMIT_DEFERRED, seed + 1000 * i + 7 + form, 4, tag);
        }
        if (form == 1) random_case(specs[1], 1, KD_COMMIT_EAGER, seed + 1000 + 9 + form, 4, tag);
    }
    kd_cu_prefill_form(3);
    sampling_case(257, seed + 11, quick ? 2 : 12);
    sampling_case(163840, seed + 12, quick ? 1 : 3);
    graph_case(specs[0], seed + 21, quick ? 10 : 40);
    if (!quick) graph_case(specs[1], seed + 22, 30);
    graph_case(specs[0], seed + 23, quick ? 10 : 30, 1);
    if (!quick) graph_case(specs[1], seed + 24, 30, 1);
    for (int pm = 1; pm <= 3; pm++) graph_case(specs[pm == 2 ? 1 : 0], seed + 24 + pm, quick ? 8 : 30, 1 + pm);
    graph_case(specs[0], seed + 28, quick ? 8 : 30, 5);
    if (!quick) graph_case(specs[1], seed + 29, 30, 5);
    graph_case(specs[quick ? 0 : 1], seed + 30, quick ? 8 : 30, 6);
    graph_case(specs[0], seed + 32, quick ? 8 : 30, 7);
    graph_case(specs[quick ? 0 : 1], seed + 33, quick ? 8 : 30, 8);
    graph_case(specs[0], seed + 34, quick ? 8 : 30, 9);
    if (!quick) graph_case(specs[1], seed + 35, 30, 9);
    graph_case(specs[quick ? 0 : 1], seed + 36, quick ? 8 : 30, 10);
    graph_case(specs[0], seed + 37, quick ? 8 : 30, 11);
    graph_case(specs[quick ? 0 : 1], seed + 39, quick ? 8 : 30, 12);
    if (!quick) graph_case(specs[1], seed + 38, 30, 11);
    graph_case(specs[8], seed + 40, quick ? 8 : 30, 13);
    graph_case(specs[1], seed + 44, quick ? 8 : 30, 14);
    graph_case(specs[0], seed + 45, quick ? 8 : 30, 15);
    graph_case(specs[1], seed + 46, quick ? 8 : 30, 15);
    graph_case(specs[0], seed + 47, quick ? 8 : 30, 16);
    graph_case(specs[0], seed + 48, quick ? 12 : 40, 17);
    graph_case(specs[quick ? 0 : 1], seed + 49, quick ? 12 : 40, 18);
    if (!quick) {
        for (const char *name : {"tiny", "small"}) {
            for (kd_commit_mode mode : modes) oracle_case(argv[1], name, 0, mode, mode == KD_COMMIT_DEFERRED);
            oracle_case(argv[1], name, 1, KD_COMMIT_DEFERRED, true);
            oracle_graph_case(argv[1], name);
        }
        for (kd_commit_mode mode : modes) engine_case(specs[0], mode, mode == KD_COMMIT_EAGER, seed + 31, 400);
        /* deferred commits with the prefix cache: eager commits with snapshots near block boundaries, of slots
         * whose lazy checkpoint may hold the last window's tokens (kd_cuda_set_lazy) */
        engine_case(specs[0], KD_COMMIT_DEFERRED, 1, seed + 32, 400);
    }
    if (g_failed) {
        printf("CUDA CHECKS FAILED: %d of %d checks\n", g_failed, g_checks);
        return 1;
    }
    printf("ALL CUDA CHECKS PASSED (%d checks)\n", g_checks);
    return 0;
}
