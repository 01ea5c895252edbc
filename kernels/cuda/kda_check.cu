// kda_check.cu: the KDA decode kernels on a GPU, checked against a float64 reference on
// the host and then timed against the copy floor (a device-to-device copy of the same
// states, in the same run). Run on the device machine: kda_check OUT_DIR COMMIT.
//   check: verify windows of random length with random acceptance, folds, eager commits with
//          snapshots, store-all; several shapes (grouped value heads, V not a multiple of
//          the tile, K = 32/64/128, odd batch sizes); outputs poisoned before each launch; the lazy
//          checkpoint (kd_kda_row.keep: verifies that keep their folded state, folds of held tokens).
//          KD_KDA_BENCH_LAZY_ONLY=1 / KD_KDA_BENCH_LAZY_SWEEP=1: the bench's lazy steps only / at factors 2-8.
//          KD_KDA_ONEPASS_SCHED=0..3: the checks with the one-pass verify's loads in that order (the
//          benchmark sets each line's order itself).
//   bench: HV = 32, K = V = 128, fp32 state, T in {1,2,4,8}, B in {1..512}; graphs of one
//          launch per layer over enough layers that the states exceed the L2 cache
//          (KD_KDA_BENCH_LAYERS=n: at least n, 1..64, for launches with neighbours at every B).
#include <cuda_runtime.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cuda/ck.cuh"
#include "kernels/cuda/green.cuh"
#include "kernels/cuda/kda.cuh"

/* the verify form of the default path (KD_KDA_SPLIT: see kd_kda_split; 1 chosen by size) */
static int g_split_default = 1;
/* the one-pass verify's load order for the checks (KD_KDA_ONEPASS_SCHED: see kd_kda_onepass_sched) */
static int g_sched_default = 1;

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static double urand() {
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return (double)(g_rng >> 11) * 0x1.0p-53;
}
static double nrand() { return sqrt(-2 * log(urand() + 1e-300)) * cos(6.283185307179586 * urand()); }

template <class T> static T *dalloc(size_t n) {
    T *p;
    CK(cudaMalloc(&p, (n ? n : 1) * sizeof(T)));
    return p;
}
static void up(float *d, const std::vector<float> &h) { CK(cudaMemcpy(d, h.data(), h.size() * 4, cudaMemcpyHostToDevice)); }
static std::vector<float> down(const float *d, size_t n) {
    std::vector<float> h(n);
    CK(cudaMemcpy(h.data(), d, n * 4, cudaMemcpyDeviceToHost));
    return h;
}

static double relerr(const std::vector<float> &a, const std::vector<double> &b) {
    double num = 0, den = 0;
    for (size_t i = 0; i < b.size(); i++) {
        if (!(a[i] == a[i])) return INFINITY;
        num += (a[i] - b[i]) * (a[i] - b[i]), den += b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

// ------------------------------------------------------------------- reference (f64)

struct Tok { // one window token, one row: raw inputs
    std::vector<double> q, k, v, g, b; // [H][K], [H][K], [HV][V], [HV][K], [HV]
};

struct Shape {
    int H, HV, K, V, B;
    int lb;
    double lbv;
    int neg;
};

static void ref_step(const Shape &s, const std::vector<double> &A_log, const std::vector<double> &dt, std::vector<double> &S,
                     const Tok &t, std::vector<double> *o) {
    const int K = s.K, V = s.V;
    for (int h = 0; h < s.HV; h++) {
        const int hk = h / (s.HV / s.H);
        double qs = 0, ks = 0;
        for (int c = 0; c < K; c++) qs += t.q[hk * K + c] * t.q[hk * K + c], ks += t.k[hk * K + c] * t.k[hk * K + c];
        std::vector<double> qn(K), kn(K), d(K);
        for (int c = 0; c < K; c++) {
            qn[c] = t.q[hk * K + c] / sqrt(qs + 1e-6) / sqrt((double)K);
            kn[c] = t.k[hk * K + c] / sqrt(ks + 1e-6);
            double z = t.g[h * K + c] + dt[h * K + c], a = exp(A_log[h]);
            double g = s.lb ? s.lbv / (1 + exp(-a * z)) : -a * (z > 30 ? z : log1p(exp(z)));
            d[c] = exp(g);
        }
        double beta = 1 / (1 + exp(-t.b[h])) * (s.neg ? 2 : 1);
        double *Sh = &S[(size_t)h * K * V];
        for (int j = 0; j < V; j++) {
            double kS = 0;
            for (int c = 0; c < K; c++) Sh[c * V + j] *= d[c], kS += Sh[c * V + j] * kn[c];
            double u = beta * (t.v[h * V + j] - kS), os = 0;
            for (int c = 0; c < K; c++) Sh[c * V + j] += kn[c] * u, os += Sh[c * V + j] * qn[c];
            if (o) (*o)[h * V + j] = os;
        }
    }
}

// -------------------------------------------------------------------------- check

// lazy > 1: the lazy checkpoint as the backend runs it (kd_kda_row.keep): records for RC = min(16, lazy x Tw)
// tokens a slot; a verify whose fold and window fit in them keeps its folded state, and the tokens it
// folded stay in the records (held), folded again by the next verify or commit from the old checkpoint.
static int check_shape(const Shape &s, kd_kda_mode mode, int Tw, int steps, int lazy = 1) {
    const int H = s.H, HV = s.HV, K = s.K, V = s.V, B = s.B, slots = B + 1;
    const int RC = std::max(Tw, std::min(16, Tw * lazy)); /* records a slot */
    const size_t hkv = (size_t)K * V, per = HV * hkv;
    // odd batches: slots apart by more than a state (the backend keeps a slot's layers
    // together); the gaps are poisoned and must stay untouched
    const size_t ss = per + (B % 2 ? 32 : 0);
    std::vector<double> A_log(HV), dt(HV * K);
    for (auto &x : A_log) x = log(1 + 15 * urand());
    for (auto &x : dt) x = -2.3 - 4.6 * urand();
    std::vector<float> A_f(A_log.begin(), A_log.end()), dt_f(dt.begin(), dt.end());
    // states: random non-zero
    std::vector<std::vector<double>> ref(B, std::vector<double>(per));
    std::vector<float> st0((size_t)slots * ss, NAN); // the scratch row and the gaps: NaN
    for (int r = 0; r < B; r++)
        for (size_t i = 0; i < per; i++) st0[r * ss + i] = (float)(ref[r][i] = 0.1 * nrand());
    for (int r = 0; r < B; r++)
        for (size_t i = 0; i < per; i++) ref[r][i] = st0[r * ss + i];
    kd_kda_args a = {};
    a.H = H, a.HV = HV, a.K = K, a.V = V, a.Tw = RC;
    a.state = dalloc<float>(slots * ss);
    a.slot_stride = ss == per ? 0 : (int64_t)ss;
    up(a.state, st0);
    a.rec_u = dalloc<float>((size_t)slots * RC * HV * V);
    a.rec_kg = dalloc<float>((size_t)slots * 2 * RC * HV * 2 * K);
    if (mode == KD_KDA_STORE_ALL) {
        a.stored = dalloc<float>((size_t)slots * RC * per);
    } else {
        a.work = dalloc<float>(kd_kda_work_floats(B, HV, K, RC));
        CK(cudaMemset(a.work, 0xff, kd_kda_work_floats(B, HV, K, RC) * 4)); // NaN: read only what is written
    }
    float *dA = dalloc<float>(HV), *ddt = dalloc<float>(HV * K);
    up(dA, A_f), up(ddt, dt_f);
    const int maxN = B * Tw;
    float *q = dalloc<float>(maxN * H * K), *k = dalloc<float>(maxN * H * K), *v = dalloc<float>(maxN * HV * V);
    float *g = dalloc<float>(maxN * HV * K), *b = dalloc<float>(maxN * HV);
    float *qn = dalloc<float>(maxN * H * K), *kn = dalloc<float>(maxN * H * K), *dec = dalloc<float>(maxN * HV * K);
    float *qk = dalloc<float>(maxN * H);
    float *beta = dalloc<float>(maxN * HV), *o = dalloc<float>(maxN * HV * V), *snap = dalloc<float>(B * per);
    kd_kda_row *drows = dalloc<kd_kda_row>(B);
    a.qn = qn, a.kn = kn, a.qk = qk, a.decay = dec, a.beta = beta, a.v = v, a.o = o, a.rows = drows;
    std::vector<std::vector<Tok>> last(B), held(B); /* held: tokens folded by a verify that kept its state */
    std::vector<int> pending(B, 0), parity(B, 0);
    int kept = 0;
    double worst_o = 0, worst_s = 0;
    size_t gap_touched = 0;
    int bad = 0;
    for (int step = 0; step < steps; step++) {
        // rows in a shuffled order, each with its own window length
        std::vector<int> order(B);
        for (int r = 0; r < B; r++) order[r] = r;
        for (int r = B - 1; r > 0; r--) std::swap(order[r], order[(int)(urand() * (r + 1))]);
        std::vector<kd_kda_row> rows(B);
        std::vector<float> hq, hk, hv, hg, hb;
        std::vector<std::vector<Tok>> win(B);
        int N = 0, maxT = 0;
        for (int i = 0; i < B; i++) {
            const int r = order[i], T = 1 + (int)(urand() * Tw);
            maxT = std::max(maxT, T);
            const int F = (int)held[r].size() + pending[r], keep = lazy > 1 && F > 0 && F + T <= RC;
            rows[i] = {r, N, T, F, 0, parity[r], keep, nullptr};
            kept += keep;
            for (int t = 0; t < T; t++) {
                Tok tk;
                tk.q.resize(H * K), tk.k.resize(H * K), tk.v.resize(HV * V), tk.g.resize(HV * K), tk.b.resize(HV);
                for (auto &x : tk.q) x = (float)nrand();
                for (auto &x : tk.k) x = (float)nrand();
                for (auto &x : tk.v) x = (float)nrand();
                for (auto &x : tk.g) x = (float)(2 * nrand());
                for (auto &x : tk.b) x = (float)nrand();
                hq.insert(hq.end(), tk.q.begin(), tk.q.end());
                hk.insert(hk.end(), tk.k.begin(), tk.k.end());
                hv.insert(hv.end(), tk.v.begin(), tk.v.end());
                hg.insert(hg.end(), tk.g.begin(), tk.g.end());
                hb.insert(hb.end(), tk.b.begin(), tk.b.end());
                win[r].push_back(tk);
            }
            N += T;
        }
        up(q, hq), up(k, hk), up(v, hv), up(g, hg), up(b, hb);
        CK(cudaMemcpy(drows, rows.data(), B * sizeof(kd_kda_row), cudaMemcpyHostToDevice));
        CK(cudaMemset(o, 0xff, (size_t)N * HV * V * 4)); // poison: NaN
        a.n_rows = B;
        /* poison what kd_kda_prepare writes: a verify that read it before the prepare kernel
         * finished (its programmatic launch waits for it) would see NaN */
        CK(cudaMemset(qn, 0xff, (size_t)N * H * K * 4));
        CK(cudaMemset(kn, 0xff, (size_t)N * H * K * 4));
        CK(cudaMemset(dec, 0xff, (size_t)N * HV * K * 4));
        CK(cudaMemset(beta, 0xff, (size_t)N * HV * 4));
        CK(cudaMemset(qk, 0xff, (size_t)N * H * 4));
        CK((cudaError_t)kd_kda_prepare(N, H, HV, K, q, k, g, b, HV, dA, ddt, s.lb, (float)s.lbv, s.neg, qn, kn, qk, dec,
                                       beta, 0));
        CK((cudaError_t)kd_kda_verify(&a, mode, maxT, 0));
        CK(cudaDeviceSynchronize());
        std::vector<float> og = down(o, (size_t)N * HV * V);
        for (int i = 0; i < B; i++) {
            const int r = rows[i].slot;
            std::vector<double> S = ref[r], oref((size_t)HV * V), all;
            for (const Tok &tk : held[r]) ref_step(s, A_log, dt, S, tk, nullptr); // the fold: held tokens first
            for (int t = 0; t < pending[r]; t++) ref_step(s, A_log, dt, S, last[r][t], nullptr);
            if (rows[i].keep) { /* the checkpoint stays; the folded tokens are held */
                held[r].insert(held[r].end(), last[r].begin(), last[r].begin() + pending[r]);
            } else {
                ref[r] = S;
                held[r].clear();
            }
            for (int t = 0; t < rows[i].len; t++) {
                ref_step(s, A_log, dt, S, win[r][t], &oref);
                all.insert(all.end(), oref.begin(), oref.end());
            }
            std::vector<float> got(og.begin() + (size_t)rows[i].start * HV * V,
                                   og.begin() + (size_t)(rows[i].start + rows[i].len) * HV * V);
            worst_o = std::max(worst_o, relerr(got, all));
            last[r] = win[r];
            pending[r] = 1 + (int)(urand() * rows[i].len);
            if (mode == KD_KDA_DEFERRED && !rows[i].keep) parity[r] ^= 1;
        }
        // now and then: commit some rows eagerly, with a snapshot part way
        if (step % 3 == 2) {
            std::vector<kd_kda_row> cr;
            for (int r = 0; r < B; r += 2) { /* the held tokens, then some of the last window; the snapshot in it */
                const int nh = (int)held[r].size();
                cr.push_back({r, 0, nh + pending[r], 0, nh + 1 + (int)(urand() * pending[r]), parity[r], 0,
                              snap + (size_t)cr.size() * per});
            }
            CK(cudaMemcpy(drows, cr.data(), cr.size() * sizeof(kd_kda_row), cudaMemcpyHostToDevice));
            a.n_rows = (int)cr.size();
            CK((cudaError_t)kd_kda_commit(&a, mode, 0));
            CK(cudaDeviceSynchronize());
            std::vector<float> sg = down(a.state, slots * ss), sn = down(snap, cr.size() * per);
            for (int r = 0; r < B; r++)
                for (size_t i = per; i < ss; i++)
                    if (!std::isnan(sg[r * ss + i])) gap_touched++;
            for (size_t i = 0; i < cr.size(); i++) {
                const int r = cr[i].slot;
                std::vector<double> S = ref[r];
                std::vector<Tok> toks = held[r];
                toks.insert(toks.end(), last[r].begin(), last[r].end());
                for (int t = 0; t < cr[i].len; t++) {
                    ref_step(s, A_log, dt, S, toks[t], nullptr);
                    if (t + 1 == cr[i].snap_at) {
                        std::vector<float> got(sn.begin() + i * per, sn.begin() + (i + 1) * per);
                        worst_s = std::max(worst_s, relerr(got, S));
                    }
                }
                ref[r] = S;
                std::vector<float> got(sg.begin() + (size_t)r * ss, sg.begin() + (size_t)r * ss + per);
                worst_s = std::max(worst_s, relerr(got, S));
                pending[r] = 0;
                held[r].clear();
            }
        }
    }
    const double tol = 1e-5;
    bad = !(worst_o < tol && worst_s < tol) || gap_touched;
    /* a lazy check whose rows never kept their state checked nothing of it */
    if (lazy > 1 && kept == 0) bad = 1;
    char lz[48] = "";
    if (lazy > 1) snprintf(lz, sizeof lz, " lazy (%d records, %d rows kept)", RC, kept);
    printf("check %-9s H=%d HV=%d K=%3d V=%3d B=%d lb=%d neg=%d%s%s: o rel err %.2e, state/snapshot rel err "
           "%.2e%s  %s\n",
           mode == KD_KDA_DEFERRED ? "deferred" : "store-all", H, HV, K, V, B, s.lb, s.neg,
           ss == per ? "" : " strided", lz, worst_o, worst_s, gap_touched ? " GAPS WRITTEN" : "", bad ? "FAIL" : "ok");
    cudaFree(a.state), cudaFree(a.rec_u), cudaFree(a.rec_kg), cudaFree(a.stored) /* or a.work */, cudaFree(dA), cudaFree(ddt);
    cudaFree(q), cudaFree(k), cudaFree(v), cudaFree(g), cudaFree(b), cudaFree(qn), cudaFree(kn), cudaFree(dec);
    cudaFree(qk), cudaFree(beta), cudaFree(o), cudaFree(snap), cudaFree(drows);
    return bad;
}

// -------------------------------------------------------------------------- bench

struct Res {
    int B, T;
    double copy_us, def_us, all_us, commit_us, def_prev_us, commit_prev_us, fused_us, split_us, onepass_us, copyk_us,
        half_us, op_plain_us, pso_us, op_order_us, lazy_keep_us, lazy_write_us;
    double floor_us() const { return copy_us < copyk_us ? copy_us : copyk_us; }
    /* the lazy checkpoint at factor 2, every draft accepted: a step that keeps its folded state (fold T),
     * then one that folds both windows (2T) and writes it, in turn */
    double lazy_us() const { return 0.5 * (lazy_keep_us + lazy_write_us); }
};

// What the benchmark times at each (B, T), in a graph of L layers, each with its settings (the
// switches of kda.cuh; split -1: the default form) and where its time goes in Res (sweep: printed only).
using ResField = double Res::*;
struct Timed {
    enum Op { COPY, COPY_KERNEL, VERIFY, STORE_ALL, COMMIT, LAZY_KEEP, LAZY_WRITE } op;
    int tc, warps, r, split, pdl, onepass_pdl, hint;
    bool small_only; /* B <= 8 */
    ResField dst;
    const char *sweep;
    int sched = 1; /* kd_kda_onepass_sched */
    int small = 1; /* kd_kda_onepass_small_form */
};
static const Timed kTimed[] = {
    {Timed::COPY, 1, 0, 0, -1, 1, 1, 1, false, &Res::copy_us, nullptr},
    {Timed::VERIFY, 1, 0, 0, -1, 1, 1, 1, false, &Res::def_us, nullptr},          /* the default */
    {Timed::LAZY_KEEP, 1, 0, 0, -1, 1, 1, 1, false, &Res::lazy_keep_us, nullptr}, /* the default form, lazy */
    {Timed::LAZY_WRITE, 1, 0, 0, -1, 1, 1, 1, false, &Res::lazy_write_us, nullptr},
    {Timed::STORE_ALL, 1, 0, 0, -1, 1, 1, 1, false, &Res::all_us, nullptr},
    {Timed::COMMIT, 1, 0, 0, -1, 1, 1, 1, false, &Res::commit_us, nullptr},
    {Timed::VERIFY, 0, 0, 0, -1, 1, 1, 1, false, &Res::def_prev_us, nullptr},     /* the CUDA-core kernels */
    {Timed::COMMIT, 0, 0, 0, -1, 1, 1, 1, false, &Res::commit_prev_us, nullptr},
    {Timed::VERIFY, 1, 4, 0, 0, 1, 1, 1, false, &Res::fused_us, nullptr},         /* one-kernel tensor cores */
    {Timed::VERIFY, 1, 0, 0, 4, 1, 1, 1, false, &Res::split_us, nullptr},
    {Timed::VERIFY, 1, 0, 0, 3, 1, 1, 1, false, &Res::onepass_us, nullptr},
    {Timed::COPY_KERNEL, 1, 0, 0, -1, 1, 1, 1, false, &Res::copyk_us, nullptr},
    {Timed::VERIFY, 1, 0, 0, 5, 1, 1, 1, false, &Res::half_us, nullptr},          /* split, half through smem */
    {Timed::VERIFY, 0, 0, 0, -1, 0, 1, 1, true, &Res::pso_us, "CUDA-core verify, plain stream order"},
    {Timed::VERIFY, 0, 0, 8, -1, 1, 1, 1, true, nullptr, "CUDA-core verify, R = 8"},
    {Timed::VERIFY, 0, 0, 4, -1, 1, 1, 1, true, nullptr, "CUDA-core verify, R = 4"},
    {Timed::VERIFY, 1, 0, 0, 3, 1, 1, 0, false, &Res::op_plain_us, nullptr},      /* one-pass, plain stores */
    {Timed::VERIFY, 1, 0, 0, 3, 1, 0, 1, false, &Res::op_order_us, nullptr},      /* one-pass, plain stream order */
    /* the lazy steps in the split forms (printed only) */
    {Timed::LAZY_KEEP, 1, 0, 0, 5, 1, 1, 1, false, nullptr, "lazy x2 keep, split verify, half"},
    {Timed::LAZY_WRITE, 1, 0, 0, 5, 1, 1, 1, false, nullptr, "lazy x2 write, split verify, half"},
    {Timed::LAZY_KEEP, 1, 0, 0, 4, 1, 1, 1, false, nullptr, "lazy x2 keep, split verify"},
    {Timed::LAZY_WRITE, 1, 0, 0, 4, 1, 1, 1, false, nullptr, "lazy x2 write, split verify"},
    /* the one-pass verify with its state tile loaded first at every window (printed only) */
    {Timed::VERIFY, 1, 0, 0, -1, 1, 1, 1, false, nullptr, "deferred, tile first", 0},
    {Timed::LAZY_KEEP, 1, 0, 0, -1, 1, 1, 1, false, nullptr, "lazy x2 keep, tile first", 0},
    {Timed::LAZY_WRITE, 1, 0, 0, -1, 1, 1, 1, false, nullptr, "lazy x2 write, tile first", 0},
    /* the one-pass verify without its small-window form (printed only; at windows of 3-8 the default's form
     * runs either way, so those lines measure the noise) */
    {Timed::LAZY_KEEP, 1, 0, 0, -1, 1, 1, 1, false, nullptr, "lazy x2 keep, no small form", 1, 0},
    {Timed::LAZY_WRITE, 1, 0, 0, -1, 1, 1, 1, false, nullptr, "lazy x2 write, no small form", 1, 0},
};

// Random fill on the device (the benchmark never times zeros): uniform in [-scale, scale].
__global__ void fill_kernel(float *p, size_t n, uint32_t seed, float scale) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t x = (uint32_t)i ^ (uint32_t)(i >> 32) * 0x9e3779b9u ^ seed;
        x ^= x >> 16, x *= 0x7feb352du, x ^= x >> 15, x *= 0x846ca68bu, x ^= x >> 16;
        p[i] = scale * ((float)(x >> 8) * (2.f / 16777216.f) - 1.f);
    }
}
static void fill(float *p, size_t n, float scale) {
    static uint32_t seed = 12345;
    fill_kernel<<<1024, 256>>>(p, n, seed += 0x6d2b79f5u, scale);
    CK(cudaGetLastError());
}

/* The copy floor's second form: a grid-stride copy in 16-byte accesses (cudaMemcpyAsync of
 * 512 MiB and more measured 2.7 TB/s on an H200 where this kernel moves 3.9 TB/s). */
__global__ void copy4_kernel(const float4 *s, float4 *d, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) d[i] = s[i];
}

int main(int argc, char **argv) {
    const char *out = argc > 1 ? argv[1] : ".";
    const char *commit = argc > 2 ? argv[2] : "unknown";
    /* KD_KDA_BENCH_FOLD (see the bench); KD_KDA_BENCH_LAYERS=n: the bench's graphs have at least n layers */
    int bench_fold = 0, min_layers = 1;
    if (!env_int("KD_KDA_SPLIT", 0, 5, &g_split_default) || !env_int("KD_KDA_ONEPASS_SCHED", 0, 3, &g_sched_default) ||
        !env_int("KD_KDA_BENCH_FOLD", 0, 8, &bench_fold) || !env_int("KD_KDA_BENCH_LAYERS", 1, 64, &min_layers))
        return 2;
    const int green = kd_green_from_env(); /* KD_GREEN_SMS (green.cuh): the run on part of the SMs */
    if (green < 0) return 2;
    int dev = 0;
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, dev));
    printf("device: %s, %d SMs, L2 %d MiB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);
    if (green) printf("green context (KD_GREEN_SMS): %d SMs; a probe kernel ran on %d\n", green, kd_green_distinct_sms());
    g_rng ^= (uint64_t)time(NULL) * 0x2545f4914f6cdd1dull;
    kd_kda_onepass_sched(g_sched_default);
    int fails = 0;
    const Shape shapes[] = {{2, 4, 128, 128, 3, 0, 0, 0}, {2, 2, 32, 32, 5, 1, -5.0, 1}, {1, 3, 64, 48, 2, 0, 0, 1},
                            {4, 4, 128, 128, 1, 0, 0, 0}, {2, 4, 128, 128, 70, 0, 0, 0}, {1, 4, 64, 64, 130, 1, -3.0, 0}};
    /* the default path (the split verify, chosen block shape), its variants, the one-kernel
     * tensor-core verify with each block shape forced, then the CUDA-core kernels: chosen,
     * each tile shape forced, and the closed form */
    struct Cfg {
        int tc, warps, r, split;
        const char *name;
    };
    const Cfg cfgs[] = {{1, 0, 0, 1, "default: verify form chosen by size"},
                        {1, 0, 0, 4, "split verify: prologue kernel + tensor-core verify, dependent launch"},
                        {1, 0, 0, 2, "split verify, plain stream order"},
                        {1, 0, 0, 3, "one-pass verify (8 warps, state staged in shared memory)"},
                        {1, 0, 0, 5, "split verify, half the state through shared memory"},
                        {1, 1, 0, 1, "split verify, 1 warp"},
                        {1, 2, 0, 1, "split verify, 2 warps"},
                        {1, 8, 0, 1, "split verify, 8 warps"},
                        {1, 0, 0, 0, "one-kernel tensor cores, chosen warps"},
                        {1, 1, 0, 0, "one-kernel tensor cores, 1 warp"},
                        {1, 2, 0, 0, "one-kernel tensor cores, 2 warps"},
                        {1, 4, 0, 0, "one-kernel tensor cores, 4 warps"},
                        {1, 8, 0, 0, "one-kernel tensor cores, 8 warps"},
                        {2, 0, 0, 0, "one-kernel tensor cores, 4 warps, 3 blocks per SM"},
                        {0, 0, 0, 0, "CUDA cores, chosen tile"},
                        {0, 0, 16, 0, "CUDA cores, wide (R=8, 4 columns)"},
                        {0, 0, 2, 0, "CUDA cores, narrow R=2"},
                        {0, 0, 8, 0, "CUDA cores, narrow R=8"}};
    /* KD_KDA_CHECK_NEW=1: only the split and one-pass verify, 2: only the CUDA-core kernels,
     * 3: only the one-kernel tensor-core verify, 4: only the one-pass verify, 5: only the one-pass verify's
     * windows of 1-2 with and without its small-window form (each for the sanitizers) */
    const int only = getenv("KD_KDA_CHECK_NEW") ? atoi(getenv("KD_KDA_CHECK_NEW")) : 0;
    const bool only_new = only != 0;
    /* KD_KDA_PROFILE=B,T (for a profiler, or a size off the table's list): no checks, the benchmark at that one
     * size; B in 1..1024, T in 1..8, else refused */
    int prof_b = 0, prof_t = 0;
    if (const char *pe = getenv("KD_KDA_PROFILE")) {
        if (sscanf(pe, "%d,%d", &prof_b, &prof_t) != 2 || prof_b < 1 || prof_b > 1024 || prof_t < 1 || prof_t > 8) {
            fprintf(stderr, "kda_check: KD_KDA_PROFILE=%s: want B,T with B in 1..1024 and T in 1..8\n", pe);
            return 2;
        }
    }
    for (const Cfg &c : cfgs) {
        if (prof_b) break;
        if (only == 1 && c.split == 0) continue;
        if (only == 2 && c.tc != 0) continue;
        if (only == 3 && (c.tc == 0 || c.split != 0)) continue;
        if (only == 4 && c.split != 3) continue;
        if (only == 5) continue;
        kd_kda_tensor_cores(c.tc, c.warps);
        kd_kda_force_r(c.r);
        kd_kda_split(c.split == 1 ? g_split_default : c.split);
        printf("path: %s\n", c.name);
        for (const Shape &s : shapes)
            for (int m = 0; m < 2; m++)
                if (m == 0 || c.warps == 0) fails += check_shape(s, (kd_kda_mode)m, 8, s.B > 8 ? 4 : 12);
        if (c.tc && c.warps == 0) { /* windows of up to 16 (longer ones take the CUDA-core path), folds of up to 16 */
            printf("path: %s, Tw = 16\n", c.name);
            for (const Shape &s : shapes)
                if (s.B <= 5) fails += check_shape(s, KD_KDA_DEFERRED, 16, 12);
        }
        /* the lazy checkpoint: records for 2 windows of 4 or 8 (folds of up to 8 / 16), 4 windows of 1 */
        printf("path: %s, lazy checkpoint\n", c.name);
        for (const Shape &s : shapes) {
            fails += check_shape(s, KD_KDA_DEFERRED, 4, s.B > 8 ? 6 : 12, 2);
            if (s.B <= 5)
                fails += check_shape(s, KD_KDA_DEFERRED, 8, 12, 2), fails += check_shape(s, KD_KDA_DEFERRED, 1, 12, 4);
        }
    }
    /* the one-pass verify with its loads in the orders other than the default's (the prologue's inputs first, at
     * every window since 6709a5c; order 2 is now the same, so it is not checked apart): the state tile first (0),
     * and (3) the inputs first in blocks past the grid's first wave, each at every window; then windows of 1-2
     * tokens with and without the small-window form (kd_kda_onepass_small_form, with and without the lazy
     * checkpoint) */
    if (!prof_b && (only == 0 || only == 1 || only == 4 || only == 5) && g_sched_default == 1) {
        const int forms[][3] = {{0, 1, 0}, {3, 1, 0}, {1, 1, 1}, {1, 0, 1}}; /* order, small form, windows of 2 */
        for (const auto &fm : forms) {
            if (only == 5 && !fm[2]) continue;
            kd_kda_tensor_cores(1, 0), kd_kda_force_r(0), kd_kda_split(3);
            kd_kda_onepass_sched(fm[0]), kd_kda_onepass_small_form(fm[1]);
            if (fm[2]) printf("path: one-pass verify, windows of 1-2, small-window form %s\n", fm[1] ? "on" : "off");
            else printf("path: one-pass verify, loads in order %d at every window\n", fm[0]);
            for (const Shape &s : shapes) {
                if (fm[2]) {
                    fails += check_shape(s, KD_KDA_DEFERRED, 2, s.B > 8 ? 6 : 12);
                    fails += check_shape(s, KD_KDA_DEFERRED, 2, s.B > 8 ? 6 : 12, 2);
                    continue;
                }
                fails += check_shape(s, KD_KDA_DEFERRED, 8, s.B > 8 ? 4 : 12);
                fails += check_shape(s, KD_KDA_DEFERRED, 4, s.B > 8 ? 6 : 12, 2);
            }
        }
        kd_kda_onepass_small_form(1);
    }
    kd_kda_onepass_sched(g_sched_default);
    kd_kda_force_r(0);
    kd_kda_tensor_cores(0, 0);
    kd_kda_closed_form(1);
    if (!only_new && !prof_b) {
        printf("path: CUDA cores, closed form\n");
        for (const Shape &s : shapes) fails += check_shape(s, KD_KDA_DEFERRED, 8, s.B > 8 ? 4 : 12);
        for (const Shape &s : shapes) fails += check_shape(s, KD_KDA_DEFERRED, 4, s.B > 8 ? 6 : 12, 2);
    }
    kd_kda_closed_form(0);
    kd_kda_tensor_cores(1, 0);
    kd_kda_split(g_split_default);
    const bool force = argc > 3 && !strcmp(argv[3], "force"); /* bench even after a failed check */
    if (fails) {
        printf("CHECK FAILED (%d)\n", fails);
        if (!force) return 1;
    }
    if (argc > 3 && !strcmp(argv[3], "check")) {
        printf("ALL CHECKS PASSED\n");
        return 0;
    }
    // ------------------------------------------------------------------- bench
    const int HV = 32, K = 128, V = 128, H = 32, Tw = 8, RC = 16; /* RC: records a slot (the lazy steps' 2T) */
    /* KD_KDA_BENCH_LAZY_ONLY=1: only the copies, the default verify and the lazy steps of the one-pass forms */
    const bool lazy_only = getenv("KD_KDA_BENCH_LAZY_ONLY") && !strcmp(getenv("KD_KDA_BENCH_LAZY_ONLY"), "1");
    const bool lazy_sweep = getenv("KD_KDA_BENCH_LAZY_SWEEP") && !strcmp(getenv("KD_KDA_BENCH_LAZY_SWEEP"), "1");
    const size_t per = (size_t)HV * K * V; // floats per state (2 MiB)
    std::vector<int> Bs = {1, 8, 32, 64, 128, 256, 512};
    const int Ts[] = {1, 2, 4, 8};
    if (prof_b) Bs = {prof_b}; /* KD_KDA_PROFILE: that size, in the list or not */
    std::vector<Res> res;
    cudaStream_t st;
    CK(cudaStreamCreate(&st));
    for (int B : Bs) {
        // enough "layers" that their states exceed the L2 several times over
        const size_t bytes_layer = (size_t)B * per * 4;
        const int L = std::max(min_layers, std::min(64, (int)((256ull << 20) / bytes_layer)));
        std::vector<kd_kda_args> la(L);
        std::vector<float *> bufs;
        const int slots = B + 1;
        kd_kda_row *drows = dalloc<kd_kda_row>(B), *drows_keep = dalloc<kd_kda_row>(B),
                   *drows_write = dalloc<kd_kda_row>(B);
        const int N = B * Tw;
        float *tok = dalloc<float>((size_t)N * (2 * H * K + H + HV * K + HV * V + HV + HV * V));
        {
            std::vector<float> h((size_t)N * (2 * H * K + H + HV * K + HV * V + HV + HV * V));
            for (auto &x : h) x = (float)(0.3 * nrand());
            up(tok, h);
        }
        float *p = tok;
        const float *qn = p; p += (size_t)N * H * K;
        const float *kn = p; p += (size_t)N * H * K;
        const float *qk = p; p += (size_t)N * H;
        float *dec = p; p += (size_t)N * HV * K;
        const float *vv = p; p += (size_t)N * HV * V;
        float *bt = p; p += (size_t)N * HV;
        float *o = p;
        { // decays in (0, 1): exp of a negative gate
            std::vector<float> hd((size_t)N * HV * K), hb((size_t)N * HV);
            for (auto &x : hd) x = (float)exp(-0.05 * urand());
            for (auto &x : hb) x = (float)urand();
            up(dec, hd), up(bt, hb);
        }
        std::vector<float *> stored(L); // each layer's stored states (store-all; a union with work)
        for (int l = 0; l < L; l++) {
            kd_kda_args &a = la[l];
            a = {};
            a.H = H, a.HV = HV, a.K = K, a.V = V, a.Tw = Tw, a.n_rows = B, a.rows = drows;
            a.state = dalloc<float>((size_t)slots * per);
            a.rec_u = dalloc<float>((size_t)slots * RC * HV * V);
            a.rec_kg = dalloc<float>((size_t)slots * 2 * RC * HV * 2 * K);
            stored[l] = dalloc<float>((size_t)slots * Tw * per);
            fill(a.state, (size_t)slots * per, 0.1f);
            fill(stored[l], (size_t)slots * Tw * per, 0.1f);
            fill(a.rec_u, (size_t)slots * RC * HV * V, 0.3f);
            fill(a.rec_kg, (size_t)slots * 2 * RC * HV * 2 * K, 1.f);
            a.qn = qn, a.kn = kn, a.qk = qk, a.decay = dec, a.beta = bt, a.v = vv, a.o = o;
            bufs.push_back(a.state), bufs.push_back(a.rec_u), bufs.push_back(a.rec_kg), bufs.push_back(stored[l]);
        }
        float *copy_dst = dalloc<float>((size_t)L * B * per);
        float *work = dalloc<float>(kd_kda_work_floats(B, HV, K, RC)); // one work space for every layer
        for (int T : Ts) {
            if (prof_b && T != prof_t) continue;
            std::vector<kd_kda_row> rows(B);
            /* steady state: fold T (every draft accepted last step); KD_KDA_BENCH_FOLD=F: min(F, T)
             * (partial acceptance) */
            const int bf = bench_fold;
            for (int r = 0; r < B; r++) rows[r] = {r, r * T, T, bf > 0 && bf < T ? bf : T, 0, 0, 0, nullptr};
            CK(cudaMemcpy(drows, rows.data(), B * sizeof(kd_kda_row), cudaMemcpyHostToDevice));
            /* the lazy steps (records for 2T tokens): fold T and keep, fold 2T and write */
            for (int r = 0; r < B; r++) rows[r] = {r, r * T, T, T, 0, 0, 1, nullptr};
            CK(cudaMemcpy(drows_keep, rows.data(), B * sizeof(kd_kda_row), cudaMemcpyHostToDevice));
            for (int r = 0; r < B; r++) rows[r] = {r, r * T, T, 2 * T, 0, 0, 0, nullptr};
            CK(cudaMemcpy(drows_write, rows.data(), B * sizeof(kd_kda_row), cudaMemcpyHostToDevice));
            Res rr = {B, T, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
            for (const Timed &w : kTimed) {
                if (w.small_only && B > 8) continue;
                if (lazy_only && !(w.op == Timed::COPY || w.op == Timed::COPY_KERNEL || w.dst == &Res::def_us ||
                                   ((w.op == Timed::LAZY_KEEP || w.op == Timed::LAZY_WRITE) && w.split < 0)))
                    continue;
                kd_kda_tensor_cores(w.tc, w.warps);
                kd_kda_force_r(w.r);
                kd_kda_pdl(w.pdl);
                kd_kda_onepass_pdl(w.onepass_pdl);
                kd_kda_store_hint(w.hint);
                kd_kda_onepass_sched(w.sched);
                kd_kda_onepass_small_form(w.small);
                kd_kda_split(w.split < 0 ? g_split_default : w.split);
                cudaGraph_t gph;
                cudaGraphExec_t ge;
                for (int l = 0; l < L; l++) {
                    if (w.op == Timed::STORE_ALL) la[l].stored = stored[l];
                    else la[l].work = work;
                }
                CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
                for (int l = 0; l < L; l++) {
                    if (w.op == Timed::COPY)
                        CK(cudaMemcpyAsync(copy_dst + (size_t)l * B * per, la[l].state, (size_t)B * per * 4,
                                           cudaMemcpyDeviceToDevice, st));
                    else if (w.op == Timed::COPY_KERNEL)
                        copy4_kernel<<<prop.multiProcessorCount * 8, 256, 0, st>>>(
                            (const float4 *)la[l].state, (float4 *)(copy_dst + (size_t)l * B * per), (size_t)B * per / 4);
                    else if (w.op == Timed::COMMIT)
                        CK((cudaError_t)kd_kda_commit(&la[l], KD_KDA_DEFERRED, st));
                    else if (w.op == Timed::LAZY_KEEP || w.op == Timed::LAZY_WRITE) {
                        kd_kda_args a2 = la[l];
                        a2.Tw = 2 * T, a2.rows = w.op == Timed::LAZY_KEEP ? drows_keep : drows_write;
                        CK((cudaError_t)kd_kda_verify(&a2, KD_KDA_DEFERRED, T, st));
                    }
                    else {
                        const kd_kda_mode m = w.op == Timed::STORE_ALL ? KD_KDA_STORE_ALL : KD_KDA_DEFERRED;
                        CK((cudaError_t)kd_kda_verify(&la[l], m, T, st));
                    }
                }
                CK(cudaStreamEndCapture(st, &gph));
                CK(cudaGraphInstantiate(&ge, gph, 0));
                const double us = time_graph(ge, st, 20) * 1e3 / L;
                if (w.dst) rr.*w.dst = us;
                if (w.sweep) printf("  sweep B=%d T=%d %s: %.2f us\n", B, T, w.sweep, us);
                cudaGraphExecDestroy(ge), cudaGraphDestroy(gph);
            }
            kd_kda_tensor_cores(1, 0);
            kd_kda_force_r(0);
            kd_kda_store_hint(1);
            kd_kda_onepass_sched(g_sched_default);
            kd_kda_onepass_small_form(1);
            kd_kda_onepass_pdl(1);
            kd_kda_pdl(1);
            kd_kda_split(g_split_default);
            /* KD_KDA_BENCH_LAZY_SWEEP=1: the lazy checkpoint at factors 2, 3, 4, 8 (records for F x T <= 16
             * tokens), every draft accepted: its steps fold T, 2T, .. (F - 1) T and keep their state, then F x T
             * and write it; each step timed alone (the default form), their mean a step (printed only) */
            if (lazy_sweep)
                for (int F : {2, 3, 4, 8}) {
                    if (F * T > RC) continue;
                    double sum = 0;
                    char steps[160];
                    int off = 0;
                    for (int k = 1; k <= F; k++) {
                        for (int r = 0; r < B; r++) rows[r] = {r, r * T, T, k * T, 0, 0, k < F, nullptr};
                        CK(cudaMemcpy(drows_keep, rows.data(), B * sizeof(kd_kda_row), cudaMemcpyHostToDevice));
                        cudaGraph_t gph;
                        cudaGraphExec_t ge;
                        CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
                        for (int l = 0; l < L; l++) {
                            kd_kda_args a2 = la[l];
                            a2.Tw = F * T, a2.rows = drows_keep, a2.work = work;
                            CK((cudaError_t)kd_kda_verify(&a2, KD_KDA_DEFERRED, T, st));
                        }
                        CK(cudaStreamEndCapture(st, &gph));
                        CK(cudaGraphInstantiate(&ge, gph, 0));
                        const double us = time_graph(ge, st, 20) * 1e3 / L;
                        cudaGraphExecDestroy(ge), cudaGraphDestroy(gph);
                        sum += us;
                        off += snprintf(steps + off, sizeof steps - (size_t)off, " %.2f", us);
                    }
                    printf("  lazy sweep B=%d T=%d x%d: steps%s us, mean %.2f us, %.2fx the copy\n", B, T, F, steps,
                           sum / F, sum / F / rr.floor_us());
                }
            res.push_back(rr);
            printf("B=%3d T=%d: lazy x2: keep %8.2f us, write %8.2f us, mean %8.2f us, %.2fx the copy "
                   "(deferred %.2fx)\n",
                   B, T, rr.lazy_keep_us, rr.lazy_write_us, rr.lazy_us(), rr.lazy_us() / rr.floor_us(),
                   rr.def_us / rr.floor_us());
            printf("B=%3d T=%d: copy %8.2f us (memcpy %8.2f, kernel %8.2f)  deferred %8.2f us (%.2fx; split, half %8.2f us; split %8.2f us; one-pass %8.2f us, %.2fx; "
                   "one-pass with plain stores %8.2f us, %.2fx; in plain stream order %8.2f us, %.2fx; "
                   "one kernel %8.2f us, %.2fx; CUDA cores %8.2f us, %.2fx)  store-all %8.2f us (%.2fx)  commit %8.2f us "
                   "(CUDA cores %8.2f us)\n",
                   B, T, rr.floor_us(), rr.copy_us, rr.copyk_us, rr.def_us, rr.def_us / rr.floor_us(), rr.half_us, rr.split_us, rr.onepass_us, rr.onepass_us / rr.floor_us(),
                   rr.op_plain_us, rr.op_plain_us / rr.floor_us(), rr.op_order_us, rr.op_order_us / rr.floor_us(),
                   rr.fused_us, rr.fused_us / rr.floor_us(),
                   rr.def_prev_us, rr.def_prev_us / rr.floor_us(), rr.all_us, rr.all_us / rr.floor_us(), rr.commit_us,
                   rr.commit_prev_us);
            fflush(stdout);
        }
        for (float *b : bufs) cudaFree(b);
        cudaFree(copy_dst), cudaFree(work), cudaFree(drows), cudaFree(drows_keep), cudaFree(drows_write), cudaFree(tok);
    }
    // results
    char path[512];
    snprintf(path, sizeof path, "%s/kda_h200.json", out);
    FILE *js = fopen(path, "w");
    if (!js) return fprintf(stderr, "kda_check: cannot write %s: %s\n", path, strerror(errno)), 1;
    snprintf(path, sizeof path, "%s/kda_h200.md", out);
    FILE *md = fopen(path, "w");
    if (!md) return fprintf(stderr, "kda_check: cannot write %s: %s\n", path, strerror(errno)), fclose(js), 1;
    char devname[400]; /* a run on part of the SMs says so in its tables */
    if (green)
        snprintf(devname, sizeof devname, "%s, on %d of its %d SMs (KD_GREEN_SMS)", prop.name, green,
                 prop.multiProcessorCount);
    else snprintf(devname, sizeof devname, "%s", prop.name);
    time_t tt = time(NULL);
    char date[64];
    strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", gmtime(&tt));
    char cmd[64]; /* a run on part of the SMs names its setting */
    if (green) snprintf(cmd, sizeof cmd, "KD_GREEN_SMS=%d kda_check", green);
    else snprintf(cmd, sizeof cmd, "kda_check");
    fprintf(js, "{\"device\":\"%s\",\"date\":\"%s\",\"commit\":\"%s\",\"command\":\"%s\","
                "\"state\":\"HV=32 K=V=128 fp32\",\"min_layers\":%d,\"results\":[",
            devname, date, commit, cmd, min_layers);
    fprintf(md, "# KDA layer step on the GPU: deferred verify vs store-all vs the copy floor\n\n"
                "device: %s; date: %s; commit: %s; command: `tests/cuda/run_device.sh` (%s)\n\n"
                "One launch per layer, HV = 32, K = V = 128, fp32 state (2 MiB per request, random); a CUDA graph "
                "of L layers (L chosen so the states exceed L2%s%.0d), median of 20 replays, per layer. copy floor: "
                "the "
                "faster of two device-to-device copies of the same B states (read + write), same graph form: "
                "cudaMemcpyAsync and a grid-stride kernel of 16-byte accesses. Window fold = %s. deferred: the "
                "default dispatch (by size: CUDA cores, one-pass or split); split: the split verify (prologue "
                "kernel, then the tensor-core verify as its dependent launch); one-pass: the one-pass verify (8 "
                "warps, state staged in shared memory; its folded checkpoint stored evict-first, the default; the next "
                "column with plain stores, kd_kda_store_hint(0), the next in plain stream order instead of a "
                "programmatic dependent of the kernel before, kd_kda_onepass_pdl(0)); one kernel: the one-kernel "
                "tensor-core verify; CUDA cores: the CUDA-core kernels; in plain stream order: the CUDA-core verify "
                "(the default at B <= 2) not a programmatic dependent of the kernel before it (in this graph the layer "
                "before's verify, whose blocks let the next layer's start once past their wait); lazy x2: the "
                "default form with the lazy checkpoint at factor 2 (records for 2T tokens, kd_kda_row.keep), whose "
                "steps alternate at full acceptance: one folds T tokens and keeps its state (keep), the next folds "
                "2T and writes it (write); their mean is a step; all from the same run.\n\n"
                "| B | T | copy floor (us) | cudaMemcpyAsync (us) | copy kernel (us) | deferred (us) | deferred / copy "
                "| lazy x2, keep (us) | lazy x2, write (us) | lazy x2, mean / copy "
                "| CUDA cores in plain stream order (us) | split (us) | split, half (us) | one-pass (us) "
                "| one-pass, plain stores (us) | one-pass, plain stream order (us) | one kernel (us) "
                "| CUDA cores (us) | store-all (us) | store-all / copy | eager commit (us) | eager commit, CUDA cores (us) |\n"
                "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
                devname, date, commit, cmd, min_layers > 1 ? ", and at least KD_KDA_BENCH_LAYERS = " : "",
                min_layers > 1 ? min_layers : 0,
                getenv("KD_KDA_BENCH_FOLD") ? "min(KD_KDA_BENCH_FOLD, T): that many drafts of the last window accepted"
                                            : "T (every draft accepted last step)");
    for (size_t i = 0; i < res.size(); i++) {
        const Res &r = res[i];
        char pso[32] = "-", psoj[32] = "null"; /* measured at B <= 8 */
        if (r.pso_us > 0) snprintf(pso, sizeof pso, "%.2f", r.pso_us), snprintf(psoj, sizeof psoj, "%.3f", r.pso_us);
        fprintf(js, "%s{\"B\":%d,\"T\":%d,\"copy_floor_us\":%.3f,\"copy_kernel_us\":%.3f,\"copy_us\":%.3f,"
                    "\"deferred_us\":%.3f,\"lazy2_keep_us\":%.3f,\"lazy2_write_us\":%.3f,"
                    "\"cuda_cores_plain_order_us\":%s,\"deferred_split_us\":%.3f,"
                    "\"deferred_split_half_us\":%.3f,\"deferred_one_pass_us\":%.3f,\"one_pass_plain_stores_us\":%.3f,"
                    "\"one_pass_plain_order_us\":%.3f,\"deferred_one_kernel_us\":%.3f,\"deferred_cuda_cores_us\":%.3f,"
                    "\"store_all_us\":%.3f,\"commit_us\":%.3f,\"commit_cuda_cores_us\":%.3f}",
                i ? "," : "", r.B, r.T, r.floor_us(), r.copyk_us, r.copy_us, r.def_us, r.lazy_keep_us, r.lazy_write_us,
                psoj, r.split_us, r.half_us,
                r.onepass_us, r.op_plain_us, r.op_order_us, r.fused_us, r.def_prev_us, r.all_us, r.commit_us,
                r.commit_prev_us);
        fprintf(md, "| %d | %d | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %s | %.2f | %.2f | %.2f "
                    "| %.2f | %.2f | %.2f "
                    "| %.2f | %.2f | %.2f | %.2f | %.2f |\n",
                r.B, r.T, r.floor_us(), r.copy_us, r.copyk_us, r.def_us, r.def_us / r.floor_us(), r.lazy_keep_us,
                r.lazy_write_us, r.lazy_us() / r.floor_us(), pso, r.split_us,
                r.half_us, r.onepass_us,
                r.op_plain_us, r.op_order_us, r.fused_us, r.def_prev_us, r.all_us,
                r.all_us / r.floor_us(), r.commit_us, r.commit_prev_us);
    }
    fprintf(js, "]}\n");
    fclose(js), fclose(md);
    if (fails) {
        printf("CHECK FAILED (%d)\n", fails);
        return 1;
    }
    printf("ALL CHECKS PASSED\n");
    return 0;
}
