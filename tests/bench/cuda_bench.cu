// cuda_bench.cu: the whole decode step and end-to-end tokens/s of the Kimi-Linear-48B KDA
// preset (kdecode mkmodel --preset kimi-linear-48b-kda) on the CUDA backend, bf16 weights
// and activations, fp32 state, deferred commits. Needs a GPU (run by tests/cuda/run_device.sh,
// not a bazel test). The weights are random bf16 built in host memory here (one random
// buffer shared by every tensor of a kind: the speed does not depend on the values), so
// nothing of 5.6 GB has to travel.
//   cuda_bench OUT_PREFIX COMMIT COMMAND
// writes OUT_PREFIX.json and OUT_PREFIX.md.
//   KD_BENCH_PROFILE=B,s cuda_bench ...: only that decode step, graphs on: 3 warm-up steps, then
//   two between cudaProfilerStart and cudaProfilerStop (for `ncu --profile-from-start off`),
//   nothing written; with KD_BENCH_PREFETCH=0 also without the L2 prefetch of weights, with
//   KD_BENCH_SKIP=mask with those kinds of kernel left out (kd_cuda_set_skip; wrong results).
//   KD_BENCH_GNPF=1 cuda_bench ...: only steps of 1-2 requests, the L2 prefetch's mode 4 (blocks of
//   the gated and MLP RMSNorms' launches) by bytes and blocks against none, alternated over 5 rounds, then the
//   second stream's prefetch; steps of 4 and 32 rows between, for the slow state (printed only).
//   KD_BENCH_HINT=1 cuda_bench ...: only steps of 8-128 requests, the one-pass verify's checkpoint stores
//   plain or evict-first (the default; kd_kda_store_hint), alternated over 5 rounds (printed only).
//   KD_BENCH_SCHED=0|2|3 cuda_bench ...: only steps of 4-128 requests, the one-pass verify's loads in that order
//   (kd_kda_onepass_sched: 0 the state tile first) or the default order, alternated over 5 rounds (printed only).
//   KD_BENCH_SMALL=1 cuda_bench ...: only steps of 1-128 requests at s = 0 and 1, the one-pass verify with its
//   small-window form (kd_kda_onepass_small_form, the default) and without, alternated over 5 rounds (printed
//   only).
//   KD_BENCH_LT=1 cuda_bench ...: only steps of 4-128 requests at s = 0, 2, 3 (12-512 rows), the products
//   cuBLASLt takes with gemm_lt.cuh's table or with its heuristic's first (kd_cuda_set_lt), alternated over
//   5 rounds (printed only).
//   KD_BENCH_GNORM=1 cuda_bench ...: only steps of 1-128 requests, the gated RMSNorm loading its gate before its
//   programmatic wait (the default) or after it (kd_cuda_set_gnorm_early), alternated over 5 rounds (printed only;
//   until the one-pass verify's trigger became unconditional, with and without it too:
//   results/logs/gnorm_h200_85b7682.log).
//   KD_BENCH_KSPLIT=1 cuda_bench ...: only steps of 5-512 rows, o_proj and the down projection in KD_KSPLIT_NB
//   (default 2) K slices at every row count (kd_cuda_set_ksplit) or whole, alternated over 5 rounds (printed only).
//   KD_BENCH_GU16=1 cuda_bench ...: only steps of 5-512 rows, gate|up's output in bf16 or fp32 (kd_cuda_set_gu_bf16),
//   alternated over 5 rounds (printed only).
//   KD_BENCH_PFROWS=1 cuda_bench ...: only steps of 4-128 requests, the L2 prefetch's mode 4 in steps of at most 2
//   requests (the default until it became 4) or in every step (kd_cuda_set_prefetch), alternated over 5 rounds
//   (printed only).
//   KD_PFROWS_N=n with it: n requests instead of any, at steps of 2-5 requests.
//   KD_BENCH_PFO=1 cuda_bench ...: only steps of 8-128 requests, mode 4 in every step with o_proj's weights from the
//   gated RMSNorm's blocks (kd_cuda_set_prefetch_order 0; KD_PFO_BYTES a layer, default 20 % of the L2) against
//   the default, alternated over 5 rounds (printed only).
//   KD_BENCH_PAIR=1 cuda_bench ...: only steps of 12-512 rows, f_proj.1 and g_proj.1 in one launch (cuBLAS's
//   strided batched GEMM past 32 rows) or a launch each (kd_cuda_set_pair), alternated over 5 rounds (printed only).
//   KD_BENCH_FUSE=1 cuda_bench ...: only steps of 1-8 requests, the fusion masks (kd_cuda_set_fuse)
//   alternated over 5 rounds (printed only). KD_BENCH_ROWS_FORM=1: likewise the products of 2-4
//   rows in the pick's forms, cuBLAS and other forms of the skinny GEMM (kd_cuda_set_skinny_rows_form),
//   and SwiGLU in gate|up's launch or apart (kd_cuda_set_swiglu). KD_BENCH_CONVPREP=1: steps of 1-8 rows,
//   the conv + prepare kernel by rows (the default, conv_prep_rows) or at every row count (kd_cuda_set_conv_prep),
//   alternated over 5 rounds (printed only).
//   KD_BENCH_PREFILL=1 cuda_bench ...: only prefill forwards (1-32 prompts of 32-1536 tokens, eager) with the
//   recurrence's forms 1 and 3 (kd_cu_prefill_form) and without it (KD_CUDA_SKIP_PREFILL), alternated over 7
//   rounds (the first dropped), medians into OUT_PREFIX.json and .md.
//   KD_BENCH_STEPS=1 cuda_bench ...: only steps of 1-128 requests at s = 0 and 3 with the defaults, 5 rounds of 20
//   each, their medians (printed only): two builds run alternately in one session compare their kernels.
//   KD_BENCH_E2E=1 cuda_bench ...: only the end-to-end runs (3), their table printed (nothing written): two
//   builds run alternately in one session compare the engine and the backend's batching. KD_BENCH_E2E_PASSES=n
//   (2-4, with or without it): the end-to-end runs n times in the process (later passes find the decode shapes'
//   CUDA graphs captured, as a server that has run a while). KD_BENCH_WARM=n (0-96, with or without it): the
//   decode shapes' graphs captured before the end-to-end runs (kd_cuda_warm_graphs, as a server at start,
//   at most n), its time printed.
//   KD_BENCH_SIDE_SWEEP=1 cuda_bench ...: only decode steps of 4-96 rows (B rows of s + 1 tokens),
//   graphs on, f_proj.1 and g_proj.1 on the step's stream against on the second stream
//   (kd_cuda_set_side_rows 0 / 1), alternated over 5 rounds: medians into OUT_PREFIX.json and .md.
//
// (1) The copy floor: cudaMemcpy device to device of 2 GiB, bandwidth = bytes read + written
//     over the time (best of 10).
// (2) Decode steps (forward_sample, greedy, every draft accepted so each fold is the whole
//     previous window) at B in {1, 32, 128} rows and s in {0, 3} drafts, CUDA graphs on (and
//     off, for the launch overhead; and with cuBLAS for every product instead of the skinny
//     GEMM kernel): step time against the roofline = (every weight byte + the state bytes
//     read and written) / copy bandwidth. The variants that use a second stream run last, after
//     (3): a process that has used one steps slower at 3-32 rows for good (cuda_backend.cu).
// (3) The engine end to end on 32 and 128 requests of a repetitive 128-token prompt, 128
//     new tokens each, greedy: n-gram drafts (s = 3) and no speculation (s = 0): tokens/s
//     over the whole run and over the decode phase. With random weights the model rarely
//     repeats its prompt, so n-gram drafts are rejected; a third run drafts the greedy
//     continuation of the s = 0 run (the oracle drafter: what a drafter that is always right
//     would give).
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "kd/backend.h"
#include "kernels/cuda/ck.cuh"
#include "kernels/cuda/kda.cuh"
#include "kernels/cuda/ops.cuh"
extern "C" {
#include "worker/engine.h"
#include "worker/mkmodel.h"
}

/* kd_cuda_set_skip's bits in order (KD_CUDA_SKIP_*), as the table names them */
static const int kAblate = 11;
static const char *const kAblateName[kAblate] = {"RMSNorms",   "input projection", "gates' bf16 copy",
                                                 "f_proj.1 + g_proj.1", "conv", "KDA prepare", "KDA verify",
                                                 "gated RMSNorm", "o_proj", "MLP", "head"};

/* the weight products (their time alone: every other kind left out) and the rest */
static const unsigned kProducts = KD_CUDA_SKIP_IN_PROJ | KD_CUDA_SKIP_FG_PROJ | KD_CUDA_SKIP_O_PROJ | KD_CUDA_SKIP_MLP |
                                  KD_CUDA_SKIP_HEAD;
static const unsigned kOthers = KD_CUDA_SKIP_NORMS | KD_CUDA_SKIP_COPY_COLS | KD_CUDA_SKIP_CONV | KD_CUDA_SKIP_PREPARE |
                                KD_CUDA_SKIP_VERIFY | KD_CUDA_SKIP_GATED_NORM;

static double now() {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* a results JSON's first fields, up to the command's (argv: OUT_PREFIX COMMIT COMMAND) */
static std::string json_head(const char *device, const char *date, char **argv) {
    return std::string("{\n  \"device\": \"") + device + "\",\n  \"date\": \"" + date + "\",\n  \"commit\": \"" +
           argv[2] + "\",\n  \"command\": \"" + argv[3] + "\",\n";
}

/* PREFIX.json and PREFIX.md (argv[1]) of a mode that writes its own results: the page's title, the device, date,
 * commit and command line, then text (its description and table) */
static void write_results(char **argv, const char *device, const char *date, const char *title,
                          const std::string &json, const std::string &text) {
    const std::string pj = std::string(argv[1]) + ".json", pm = std::string(argv[1]) + ".md";
    FILE *f = fopen(pj.c_str(), "w");
    if (f) fputs(json.c_str(), f), fclose(f);
    FILE *g = fopen(pm.c_str(), "w");
    if (g)
        fprintf(g, "# %s\n\ndevice: %s; date: %s; commit: %s; command: `%s`\n\n%s", title, device, date, argv[2],
                argv[3], text.c_str()),
            fclose(g);
    if (!f || !g) fprintf(stderr, "cannot write %s or %s\n", pj.c_str(), pm.c_str());
}

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static uint64_t rnd() {
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return g_rng;
}

// A bf16 buffer of n random values, uniform with the given standard deviation.
static std::vector<uint16_t> *random_bf16(size_t n, double sd) {
    std::vector<uint16_t> *v = new std::vector<uint16_t>(n);
    const double a = sd * sqrt(3.0);
    for (size_t i = 0; i < n; i++) {
        const double u = (double)(rnd() >> 11) * 0x1.0p-53 * 2 - 1;
        (*v)[i] = kd_f32_to_bf16((float)(a * u));
    }
    return v;
}

static kd_tensor tensor(kd_dtype dt, const void *data, std::vector<int64_t> shape) {
    kd_tensor t;
    memset(&t, 0, sizeof t);
    t.dtype = dt, t.ndim = (int32_t)shape.size(), t.data = data;
    for (size_t i = 0; i < shape.size(); i++) t.shape[i] = shape[i];
    return t;
}

struct Sink {
    int64_t tokens = 0;
    int64_t finished = 0;
    std::map<uint64_t, std::vector<int32_t>> toks;
};
static void on_event(void *ctx, const kd_event *ev) {
    Sink *s = (Sink *)ctx;
    s->tokens += ev->n_tokens;
    std::vector<int32_t> &v = s->toks[ev->id];
    v.insert(v.end(), ev->tokens, ev->tokens + ev->n_tokens);
    if (ev->finish != KD_FINISH_NONE) s->finished++;
}

// The end-to-end runs' backend calls, timed (a copy of the backend's table with these in its
// place): forward_sample's and commit's wall time, so that a decode-phase step splits into the
// backend's forward and what the engine does around it.
static const kd_backend_ops *g_real_ops;
static double g_fs_s, g_commit_s;
static int64_t g_fs_n, g_commit_n;
static int timed_forward_sample(kd_backend *b, const kd_batch *batch, const kd_sample_params *params,
                                const double *uniforms, int32_t *tokens, int32_t *accepted, int32_t *used,
                                kd_err *err) {
    const double t0 = now();
    const int rc = g_real_ops->forward_sample(b, batch, params, uniforms, tokens, accepted, used, err);
    g_fs_s += now() - t0, g_fs_n++;
    return rc;
}
static int timed_commit(kd_backend *b, int32_t slot, int32_t n, int32_t snap_at, void *snap_dst, kd_err *err) {
    const double t0 = now();
    const int rc = g_real_ops->commit(b, slot, n, snap_at, snap_dst, err);
    g_commit_s += now() - t0, g_commit_n++;
    return rc;
}

// Decode steps of Bn verify rows (slots 0 .. Bn - 1) of T random tokens below vocab, greedy, each
// row folding rec[r] records (then T: every draft accepted): warm steps, then n timed, in the
// backend's current settings. The mean ms a timed step, or -1 with the error printed. profile: the
// timed steps between cudaProfilerStart and the caller's cudaProfilerStop.
static double time_steps(kd_backend *be, int Bn, int T, int64_t vocab, int warm, int n, std::vector<int32_t> &rec,
                         bool profile) {
    const int Tw = be->max_window;
    std::vector<kd_batch_row> rows((size_t)Bn);
    std::vector<int32_t> tok((size_t)Bn * T), ot((size_t)Bn * Tw), oa((size_t)Bn), ou((size_t)Bn);
    std::vector<kd_sample_params> sp((size_t)Bn);
    std::vector<double> uni((size_t)Bn * Tw, 0.5);
    for (auto &p : sp) memset(&p, 0, sizeof p), p.top_p = 1;
    kd_err err;
    double tstart = 0;
    for (int it = 0; it < warm + n; it++) {
        if (it == warm) tstart = now();
        if (it == warm && profile) cudaDeviceSynchronize(), cudaProfilerStart();
        for (int r = 0; r < Bn; r++) {
            rows[(size_t)r] = kd_batch_row{r, T, KD_LOGITS_ALL, KD_ROW_VERIFY, rec[(size_t)r]};
            for (int i = 0; i < T; i++) tok[(size_t)r * T + i] = (int32_t)(rnd() % (uint64_t)vocab);
        }
        kd_batch b = {Bn, rows.data(), tok.data()};
        if (kd_backend_forward_sample(be, &b, sp.data(), uni.data(), ot.data(), oa.data(), ou.data(), &err)) {
            printf("B=%d s=%d: %s\n", Bn, T - 1, err.msg);
            return -1;
        }
        for (int r = 0; r < Bn; r++) rec[(size_t)r] = T;
    }
    return (now() - tstart) / n * 1e3;
}

// Steps of B requests with windows of s + 1 at each point, a setting off (m = 0, `off`) and on
// (m = 1, `on`) in alternated rounds (set(be, m) drops the graphs captured with the other), 5
// rounds of 20 steps each; prints each one's median and the ratio off / it, then leaves it on.
static void ab_rounds(kd_backend *be, int64_t vocab, const char *tag, const int (*pts)[2], size_t n,
                      const char *off, const char *on, const char *off_short, void (*set)(kd_backend *, int)) {
    static std::vector<int32_t> rec(128, 0);
    for (size_t i = 0; i < n; i++) {
        std::vector<double> t[2];
        for (int r = 0; r < 5; r++)
            for (int m = 0; m < 2; m++) {
                set(be, m);
                t[m].push_back(time_steps(be, pts[i][0], 1 + pts[i][1], vocab, 3, 20, rec, false));
            }
        for (int m = 0; m < 2; m++) {
            std::sort(t[m].begin(), t[m].end());
            printf("%s: B=%d s=%d (%d rows) %s step %.3f ms (median of 5 rounds of 20; %s / this %.3f)\n", tag,
                   pts[i][0], pts[i][1], pts[i][0] * (1 + pts[i][1]), m ? on : off, t[m][2], off_short,
                   t[0][2] / t[m][2]);
        }
    }
    set(be, 1);
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s OUT_PREFIX COMMIT COMMAND\n", argv[0]);
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (kd_cuda_device_count() == 0) {
        printf("no CUDA device\n");
        return 2;
    }
    kd_cuda_info info;
    kd_cuda_describe(&info);
    char date[32];
    time_t tt = time(NULL);
    strftime(date, sizeof date, "%Y-%m-%d", gmtime(&tt));
    printf("device: %s, cudart %d, driver %d, cublas %d\n", info.device0_name, info.cudart_version,
           info.driver_version, info.cublas_version);

    // (1) the copy floor
    double copy_bw = 0;
    {
        const size_t bytes = (size_t)2 << 30;
        void *a = nullptr, *b = nullptr;
        if (cudaMalloc(&a, bytes) || cudaMalloc(&b, bytes)) return printf("cudaMalloc failed\n"), 1;
        cudaMemset(a, 1, bytes);
        cudaEvent_t e0, e1;
        cudaEventCreate(&e0), cudaEventCreate(&e1);
        float best = 1e30f;
        for (int i = 0; i < 10; i++) {
            cudaEventRecord(e0);
            cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
            cudaEventRecord(e1);
            cudaEventSynchronize(e1);
            float ms;
            cudaEventElapsedTime(&ms, e0, e1);
            if (ms < best) best = ms;
        }
        copy_bw = 2.0 * bytes / (best * 1e-3);
        printf("copy floor: 2 GiB device to device in %.3f ms: %.0f GB/s (read + write)\n", best, copy_bw / 1e9);
        cudaFree(a), cudaFree(b);
    }

    // the model: the preset's config, random bf16 weights
    const kd_preset *pre = kd_preset_find("kimi-linear-48b-kda");
    if (!pre) return printf("preset missing\n"), 1;
    const kd_config c = pre->config;
    const int64_t D = c.hidden, L = c.n_layers, H = c.n_heads, HV = c.n_v_heads, K = c.head_k, V = c.head_v;
    const int64_t QK = H * K, VD = HV * V, I = c.intermediate, W = c.conv_size, VOC = c.vocab;
    double t0 = now();
    const double sd = 1 / sqrt((double)D);
    std::vector<uint16_t> *big = random_bf16((size_t)(VOC * D), sd);  // embed, head, every D-wide matrix
    std::vector<uint16_t> *wide = random_bf16((size_t)(D * (I > VD ? I : VD)), 1 / sqrt((double)I)); // o_proj, down
    std::vector<uint16_t> *sq = random_bf16((size_t)(HV * K * V), 1 / sqrt((double)V));              // f1, g1
    std::vector<uint16_t> *conv = random_bf16((size_t)((2 * QK + VD) * W), 0.5);
    std::vector<uint16_t> *small = random_bf16((size_t)(VD > D ? VD : D), 0.5);
    std::vector<float> ones((size_t)(D > VD ? D : VD), 1.0f), alog((size_t)HV), dtb((size_t)(HV * K));
    for (auto &x : alog) x = (float)log(1 + 15 * ((rnd() >> 11) * 0x1.0p-53));
    for (auto &x : dtb) x = (float)(-2.3 - 4.6 * ((rnd() >> 11) * 0x1.0p-53));
    std::vector<kd_layer_tensors> layers((size_t)L);
    const kd_dtype B = KD_BF16, F = KD_F32;
    for (int64_t l = 0; l < L; l++) {
        kd_layer_tensors &t = layers[(size_t)l];
        memset(&t, 0, sizeof t);
        t.attn_norm = tensor(F, ones.data(), {D});
        t.q_proj = tensor(B, big->data(), {QK, D});
        t.k_proj = tensor(B, big->data() + QK * D, {QK, D});
        t.v_proj = tensor(B, big->data() + 2 * QK * D, {VD, D});
        t.q_conv = tensor(B, conv->data(), {QK, 1, W});
        t.k_conv = tensor(B, conv->data() + QK * W, {QK, 1, W});
        t.v_conv = tensor(B, conv->data() + 2 * QK * W, {VD, 1, W});
        t.f_proj0 = tensor(B, big->data() + 3 * QK * D, {V, D});
        t.f_proj1 = tensor(B, sq->data(), {HV * K, V});
        t.b_proj = tensor(B, big->data() + 4 * QK * D, {HV, D});
        t.A_log = tensor(F, alog.data(), {HV});
        t.dt_bias = tensor(F, dtb.data(), {HV * K});
        t.g_proj0 = tensor(B, big->data() + 5 * QK * D, {V, D});
        t.g_proj1 = tensor(B, sq->data(), {VD, V});
        t.g_proj1_bias = tensor(B, small->data(), {VD});
        t.o_norm = tensor(F, ones.data(), {V});
        t.o_proj = tensor(B, wide->data(), {D, VD});
        t.mlp_norm = tensor(F, ones.data(), {D});
        t.gate_proj = tensor(B, big->data() + 6 * QK * D, {I, D});
        t.up_proj = tensor(B, big->data() + 7 * QK * D, {I, D});
        t.down_proj = tensor(B, wide->data(), {D, I});
    }
    kd_model_tensors w;
    memset(&w, 0, sizeof w);
    w.embed = tensor(B, big->data(), {VOC, D});
    w.final_norm = tensor(F, ones.data(), {D});
    w.lm_head = tensor(B, big->data() + 1000 * D, {VOC - 1000, D}); // a different view, same size below
    w.lm_head.shape[0] = VOC;
    w.lm_head.data = big->data();
    w.n_layers = (int32_t)L;
    w.layers = layers.data();
    kd_err err;
    kd_backend *be = kd_cuda_backend_create(1, &err);
    if (!be || kd_backend_load(be, &c, &w, &err)) return printf("backend: %s\n", err.msg), 1;
    const double t_load = now() - t0;
    // weight bytes as the device holds them (bf16 GEMM weights, fp32 small parameters)
    const int64_t P = 2 * QK + VD + 2 * V + HV;
    const double wl = 2.0 * (P * D + HV * K * V + VD * V + D * VD + 2 * I * D + D * I) +
                      4.0 * (D + HV + HV * K + VD + V + D + (2 * QK + VD) * W);
    const double weight_bytes = L * wl + 2.0 * VOC * D + 4.0 * D; // layers + head (+ final norm)
    printf("model: %s: D=%lld L=%lld H=%lld K=V=%lld I=%lld vocab=%lld; %.2f GB of weights on the device "
           "(head %.2f GB); built and loaded in %.1f s\n",
           pre->name, (long long)D, (long long)L, (long long)H, (long long)K, (long long)I, (long long)VOC,
           weight_bytes / 1e9, 2.0 * VOC * D / 1e9, t_load);

    // the engine owns the reservation: 128 slots, windows of 4
    kd_engine_config cfg;
    kd_engine_config_defaults(&cfg);
    cfg.max_seqs = 128, cfg.max_queue = 256, cfg.max_spec = 3, cfg.max_batch_tokens = 128 * 4 + 1 + 1024;
    cfg.max_model_len = 4096;
    Sink sink;
    kd_engine *e = kd_engine_create(be, 1, &cfg, on_event, &sink, &err);
    if (!e) return printf("engine: %s\n", err.msg), 1;
    const kd_state_layout &lay = be->layout;
    const int64_t C = 2 * QK + VD;

    const int side_rows_default = 0; /* kd_cuda_set_side_rows: the backend's default (never) */
    if (getenv("KD_BENCH_GNPF")) { /* the prefetch from blocks of the gated RMSNorm's launch (mode 4) */
        static std::vector<int32_t> rec(128, 0);
        auto small = [&](const char *st) {
            kd_cuda_set_prefetch(be, 0, 0, 1);
            double a = 0, b = 0;
            for (int r = 0; r < 3; r++) {
                a += time_steps(be, 4, 1, VOC, 3, 20, rec, false) / 3;
                b += time_steps(be, 32, 1, VOC, 3, 20, rec, false) / 3;
            }
            printf("gnpf: %-40s B=4 s=0 %.3f ms, B=32 s=0 %.3f ms\n", st, a, b);
        };
        int l2b = 0;
        cudaDeviceGetAttribute(&l2b, cudaDevAttrL2CacheSize, 0);
        struct Cf {
            int mode, blocks;
            double frac, mlp; /* of the L2: the gated norm's share, the MLP norm's */
        };
        std::vector<Cf> cfs = {{0, 0, 0, 0},       {4, 16, 0.2, 0},   {4, 16, 0.2, 0.1}, {4, 16, 0.2, 0.2},
                               {4, 16, 0.2, 0.3}, {4, 32, 0.2, 0.2}, {4, 16, 0.1, 0.2}, {4, 16, 0.3, 0.1}};
        const int pts[][2] = {{1, 0}, {1, 3}, {2, 0}};
        small("fresh");
        for (const auto &pt : pts) {
            std::vector<std::vector<double>> t(cfs.size());
            for (int r = 0; r < 5; r++)
                for (size_t i = 0; i < cfs.size(); i++) {
                    const Cf &c = cfs[i];
                    kd_cuda_set_prefetch(be, c.mode ? (int64_t)(c.frac * l2b) & ~(int64_t)15 : 0, 2, c.mode ? 4 : 1);
                    if (c.mode) kd_cuda_set_prefetch_blocks(be, c.blocks);
                    kd_cuda_set_prefetch_mlp(be, (int64_t)(c.mlp * l2b) & ~(int64_t)15);
                    t[i].push_back(time_steps(be, pt[0], 1 + pt[1], VOC, 3, 20, rec, false));
                }
            for (size_t i = 0; i < cfs.size(); i++) {
                std::sort(t[i].begin(), t[i].end());
                char nm[96];
                snprintf(nm, sizeof nm, "%.1f MB + MLP norm %.1f MB, %d blocks", cfs[i].frac * l2b / 1e6,
                         cfs[i].mlp * l2b / 1e6, cfs[i].blocks);
                printf("gnpf: B=%d s=%d %-40s step %.3f ms (median of 5 rounds of 20; none / this %.3f)\n", pt[0],
                       pt[1], cfs[i].mode ? nm : "none", t[i][2], t[0][2] / t[i][2]);
            }
        }
        small("after the mode 4 sweep");
        for (int r = 0; r < 3; r++) { /* the second stream's prefetch last (its slow state after) */
            kd_cuda_set_prefetch(be, -1, 2, 2);
            const double a = time_steps(be, 1, 1, VOC, 3, 20, rec, false);
            printf("gnpf: B=1 s=0 second stream's prefetch (18.9 MB class, mode 2) step %.3f ms\n", a);
        }
        small("after the second stream's prefetch");
        kd_engine_free(e);
        kd_backend_free(be);
        return 0;
    }
    if (getenv("KD_BENCH_HINT")) { /* the one-pass verify's checkpoint stores evict-first or plain, alternated */
        static std::vector<int32_t> rec(128, 0);
        const int pts[][2] = {{32, 0}, {32, 3}, {128, 0}, {128, 3}, {8, 0}};
        for (const auto &pt : pts) {
            std::vector<double> t[2];
            for (int r = 0; r < 5; r++)
                for (int h = 0; h < 2; h++) {
                    kd_kda_store_hint(h);
                    kd_cuda_set_fuse(be, KD_CUDA_FUSE_DEFAULT); /* drops the graphs captured with the other */
                    t[h].push_back(time_steps(be, pt[0], 1 + pt[1], VOC, 3, 20, rec, false));
                }
            for (int h = 0; h < 2; h++) {
                std::sort(t[h].begin(), t[h].end());
                printf("hint: B=%d s=%d stores %s step %.3f ms (median of 5 rounds of 20; plain / this %.3f)\n", pt[0],
                       pt[1], h ? "evict-first" : "plain", t[h][2], t[0][2] / t[h][2]);
            }
        }
        kd_kda_store_hint(1);
        kd_engine_free(e);
        kd_backend_free(be);
        return 0;
    }
    if (getenv("KD_BENCH_SCHED")) { /* the one-pass verify's loads: an order forced, or the default */
        static int alt;
        if (!env_int("KD_BENCH_SCHED", 0, 3, &alt) || alt == 1) {
            fprintf(stderr, "KD_BENCH_SCHED: 0, 2 or 3 (the order compared with the default)\n");
            return 2;
        }
        char nm[48];
        snprintf(nm, sizeof nm, "loads in order %d", alt);
        const int pts[][2] = {{32, 0}, {32, 3}, {64, 3}, {128, 0}, {128, 3}, {8, 3}, {4, 1}};
        ab_rounds(be, VOC, "sched", pts, sizeof pts / sizeof pts[0], nm, "the default", "forced",
                  [](kd_backend *x, int m) {
                      kd_kda_onepass_sched(m ? 1 : alt);
                      kd_cuda_set_fuse(x, KD_CUDA_FUSE_DEFAULT); /* drops the graphs captured with the other */
                  });
        kd_engine_free(e);
        kd_backend_free(be);
        return 0;
    }
    if (getenv("KD_BENCH_SMALL")) { /* the one-pass verify's small-window form (the default) or not */
        const int pts[][2] = {{32, 0}, {128, 0}, {64, 1}, {128, 1}, {8, 1}, {1, 1}};
        ab_rounds(be, VOC, "small", pts, sizeof pts / sizeof pts[0], "the default", "without the small-window form",
                  "the default", [](kd_backend *x, int m) {
                      kd_kda_onepass_small_form(m ? 0 : 1);
                      kd_cuda_set_fuse(x, KD_CUDA_FUSE_DEFAULT); /* drops the graphs captured with the other */
                  });
        kd_kda_onepass_small_form(1);
        kd_engine_free(e);
        kd_backend_free(be);
        return 0;
    }
    if (getenv("KD_BENCH_LT")) { /* cuBLASLt's table against its heuristic's first, windows of 3 too (3 x 2^k rows) */
        const int pts[][2] = {{4, 2}, {8, 2}, {16, 2}, {32, 2}, {64, 2}, {128, 2}, {32, 0}, {128, 0}, {32, 3}};
        ab_rounds(be, VOC, "lt", pts, sizeof pts / sizeof pts[0], "the heuristic's first", "the table", "first",
                  [](kd_backend *x, int m) { kd_cuda_set_lt(x, m ? 2 : 1); });
        kd_engine_free(e);
        kd_backend_free(be);
        return 0;
    }
    if (getenv("KD_BENCH_GNORM")) { /* the gated norm's early gate */
        const int pts[][2] = {{1, 0}, {1, 3}, {4, 0}, {8, 3}, {32, 0}, {32, 3}, {128, 0}, {128, 3}};
        ab_rounds(be, VOC, "gnorm", pts, sizeof pts / sizeof pts[0], "after the wait", "before", "after",
                  [](kd_backend *x, int m) {
                      kd_cuda_set_gnorm_early(x, m);
                  });
        kd_engine_free(e);
        kd_backend_free(be);
        return 0;
    }
    if (getenv("KD_BENCH_KSPLIT")) { /* o_proj and the down projection in K slices, or whole */
        static int nb = 2;
        if (!env_int("KD_KSPLIT_NB", 1, KD_KSPLIT_MAX, &nb)) return 2;
        const int pts[][2] = {{5, 0},  {2, 3},  {6, 0},  {8, 0},  {10, 0}, {3, 3},   {12, 0}, {15, 0},
                              {4, 3},  {8, 3},  {16, 3}, {32, 0}, {32, 1}, {32, 3},  {64, 0}, {96, 0},
                              {128, 0}, {64, 3}, {128, 3}};
        char on[32];
        snprintf(on, sizeof on, "in %d K slices", nb);
        ab_rounds(be, VOC, "ksplit", pts, sizeof pts / sizeof pts[0], "whole", on, "whole", [](kd_backend *x, int m) {
            if (kd_cuda_set_ksplit(x, m ? nb : 1, 1, 512)) printf("ksplit: kd_cuda_set_ksplit(%d) refused\n", nb);
        });
        kd_engine_free(e);
        kd_backend_free(be);
        return 0;
    }
    if (getenv("KD_BENCH_PREFILL")) { /* prefill forwards (eager): the recurrence's forms, and without it */
        const int pcs[][2] = {{1, 64}, {1, 512}, {1, 1536}, {2, 768}, {4, 384}, {6, 64}, {12, 128}, {32, 32}};
        const int forms[] = {1, 3}, NF = 2; /* column v < NF: form forms[v]; v == NF: without the recurrence */
        std::string md = "| prompts | tokens each | forward ms, form 1 | form 3 | without the recurrence | "
                         "recurrence ms, form 1 | form 3 | recurrence, form 1 / form 3 | forward, form 1 / form 3 | "
                         "prompt tokens/s, form 1 | form 3 |\n|---|---|---|---|---|---|---|---|---|---|---|\n",
                    js = json_head(info.device0_name, date, argv) + "  \"rounds\": 6,\n  \"points\": [\n";
        char line[768];
        for (const auto &pc : pcs) {
            std::vector<kd_batch_row> rows((size_t)pc[0]);
            std::vector<int32_t> tok((size_t)pc[0] * pc[1]);
            for (auto &x : tok) x = (int32_t)(rnd() % (uint64_t)VOC);
            for (int r = 0; r < pc[0]; r++) {
                memset(&rows[(size_t)r], 0, sizeof rows[0]);
                rows[(size_t)r].slot = r, rows[(size_t)r].n_tokens = pc[1], rows[(size_t)r].kind = KD_ROW_PREFILL;
                rows[(size_t)r].logits = KD_LOGITS_NONE;
            }
            kd_batch b;
            b.n_rows = pc[0], b.rows = rows.data(), b.tokens = tok.data();
            std::vector<double> t[NF + 1];
            for (int round = 0; round < 7; round++)
                for (int v = 0; v <= NF; v++) {
                    kd_cu_prefill_form(v < NF ? forms[v] : 1);
                    kd_cuda_set_skip(be, v == NF ? KD_CUDA_SKIP_PREFILL : 0);
                    for (int r = 0; r < pc[0]; r++)
                        if (kd_backend_reset_slot(be, r, &err)) return printf("reset: %s\n", err.msg), 1;
                    const double t0 = now();
                    if (kd_backend_forward(be, &b, nullptr, &err)) return printf("prefill: %s\n", err.msg), 1;
                    if (round > 0) t[v].push_back(now() - t0);
                }
            double f[NF + 1]; /* medians of 6, ms */
            for (int v = 0; v <= NF; v++) std::sort(t[v].begin(), t[v].end()), f[v] = 0.5e3 * (t[v][2] + t[v][3]);
            const double tk = pc[0] * pc[1] * 1e3;
            snprintf(line, sizeof line,
                     "| %d | %d | %.3f | %.3f | %.3f | %.3f | %.3f | %.2f | %.2f | %.0f | %.0f |\n", pc[0], pc[1], f[0],
                     f[1], f[2], f[0] - f[2], f[1] - f[2], (f[0] - f[2]) / (f[1] - f[2]), f[0] / f[1], tk / f[0],
                     tk / f[1]);
            md += line;
            printf("prefill: %s", line);
            snprintf(line, sizeof line,
                     "%s    {\"prompts\": %d, \"tokens\": %d, \"forward_ms_form1\": %.4f, \"forward_ms_form3\": %.4f, "
                     "\"forward_ms_without_recurrence\": %.4f}",
                     &pc == &pcs[0] ? "" : ",\n", pc[0], pc[1], f[0], f[1], f[2]);
            js += line;
        }
        js += "\n  ]\n}\n";
        kd_cu_prefill_form(3);
        kd_cuda_set_skip(be, 0);
        write_results(argv, info.device0_name, date, "Kimi-Linear-48B KDA preset: prefill forwards, the KDA "
                      "recurrence's forms", js,
                      "Eager forwards of prefill rows (no logits) from zeroed slots, bf16 activations, fp32 state: "
                      "the recurrence (kd_cu_prefill) in form 1 (token by token, a column 4 threads, the next token "
                      "prefetched), form 3 (chunks of 8 tokens on tensor cores: kd_kda_prefill; the default), and "
                      "the same forward without it (KD_CUDA_SKIP_PREFILL), the three "
                      "alternated over 7 rounds, the first dropped; medians of 6. The recurrence's time is the "
                      "forward's less the forward without it.\n\n" + md);
        kd_engine_free(e);
        kd_backend_free(be);
        return 0;
    }
    if (getenv("KD_BENCH_STEPS")) { /* this build's steps, for a comparison between builds */
        static std::vector<int32_t> rec(128, 0);
        const int pts[][2] = {{1, 0}, {1, 3}, {4, 3}, {8, 3}, {32, 0}, {32, 3}, {64, 0}, {128, 0}, {64, 3}, {128, 3}};
        for (const auto &pt : pts) {
            std::vector<double> t;
            for (int r = 0; r < 5; r++) t.push_back(time_steps(be, pt[0], 1 + pt[1], VOC, 3, 20, rec, false));
            std::sort(t.begin(), t.end());
            printf("steps: B=%d s=%d (%d rows) step %.3f ms (median of 5 rounds of 20; %.3f-%.3f)\n", pt[0], pt[1],
                   pt[0] * (1 + pt[1]), t[2], t[0], t[4]);
        }
        kd_engine_free(e);
        kd_backend_free(be);
        return 0;
    }
    if (getenv("KD_BENCH_GU16")) { /* gate|up's output in bf16, or fp32 */
        const int pts[][2] = {{5, 0}, {2, 3}, {8, 0}, {12, 0}, {4, 3}, {8, 3}, {32, 0}, {32, 3}, {64, 0}, {128, 0},
                              {64, 3}, {128, 3}};
        ab_rounds(be, VOC, "gu16", pts, sizeof pts / sizeof pts[0], "fp32", "bf16", "fp32",
                  [](kd_backend *x, int m) { kd_cuda_set_gu_bf16(x, m); });
        kd_engine_free(e);
        kd_backend_free(be);
        return 0;
    }
    if (getenv("KD_BENCH_PFROWS")) { /* mode 4 in steps of at most 2 requests (the default until 4) or more */
        static int rows_on = 1 << 20;
        if (!env_int("KD_PFROWS_N", 1, 1 << 20, &rows_on)) return 2;
        const int pts_any[][2] = {{4, 0}, {8, 0}, {8, 3}, {32, 0}, {32, 3}, {64, 0}, {128, 0}, {128, 3}};
        const int pts_few[][2] = {{2, 1}, {2, 3}, {3, 0}, {3, 1}, {3, 3}, {4, 0}, {4, 1}, {4, 3}, {5, 0}};
        const bool few = rows_on < 5;
        char on[32];
        snprintf(on, sizeof on, "at most %d requests", rows_on);
        ab_rounds(be, VOC, "pfrows", few ? pts_few : pts_any, few ? 9 : 8, "at most 2 requests",
                  rows_on < (1 << 20) ? on : "any", "2",
                  [](kd_backend *x, int m) { kd_cuda_set_prefetch(x, -1, m ? rows_on : 2, 4); });
        kd_engine_free(e);
        kd_backend_free(be);
        return 0;
    }
    if (getenv("KD_BENCH_PFO")) { /* mode 4 in every step, o_proj's weights from the gated norm's blocks, or none */
        static int64_t bytes = -1;
        if (const char *v = getenv("KD_PFO_BYTES")) bytes = atoll(v);
        const int pts[][2] = {{8, 0}, {8, 3}, {32, 0}, {32, 3}, {64, 0}, {128, 0}, {128, 3}};
        ab_rounds(be, VOC, "pfo", pts, sizeof pts / sizeof pts[0], "the default (none past 4 requests)",
                  "o_proj's weights", "default", [](kd_backend *x, int m) {
                      kd_cuda_set_prefetch(x, m ? bytes : -1, m ? 1 << 20 : 4, 4);
                      kd_cuda_set_prefetch_order(x, !m);
                  });
        kd_engine_free(e);
        kd_backend_free(be);
        return 0;
    }
    if (getenv("KD_BENCH_PAIR")) { /* f_proj.1 + g_proj.1 in one launch or two, past the skinny kernel's rows */
        const int pts[][2] = {{12, 0}, {16, 0}, {4, 3}, {24, 0}, {6, 3}, {16, 3}, {32, 1}, {32, 3}, {64, 0}, {128, 0},
                              {64, 3}, {128, 3}};
        ab_rounds(be, VOC, "pair", pts, sizeof pts / sizeof pts[0], "a launch each", "one launch", "two",
                  [](kd_backend *x, int m) { kd_cuda_set_pair(x, m); });
        kd_engine_free(e);
        kd_backend_free(be);
        return 0;
    }
    if (getenv("KD_BENCH_CONVPREP")) { /* the conv + prepare kernel by rows or at every row count */
        /* 4 rows of windows (1 x 4, 2 x 2), 2-3 rows (windows, single tokens), 1 row, 4-8 rows; where the rule and
         * every row count agree (from 2 rows since the rule's change, conv_prep_rows) the two columns are the A/B's
         * noise. The kernels apart at 2-4 rows: KD_BENCH_FUSE's mask 2 (the conv in f_proj.1 + g_proj.1's launch) */
        const int pts[][2] = {{1, 3}, {2, 1}, {1, 1}, {1, 2}, {2, 0}, {3, 0}, {1, 0}, {4, 0}, {2, 3}, {8, 0}};
        ab_rounds(be, VOC, "conv_prep", pts, sizeof pts / sizeof pts[0], "by rows", "every row count", "by rows",
                  [](kd_backend *x, int m) { kd_cuda_set_conv_prep(x, m); });
        kd_cuda_set_conv_prep(be, 0);
        kd_engine_free(e);
        kd_backend_free(be);
        return 0;
    }
    if (getenv("KD_BENCH_FUSE")) { /* the fusion masks (kd_cuda_set_fuse) in alternated rounds */
        static std::vector<int32_t> rec(128, 0);
        const int masks[] = {KD_CUDA_FUSE_DEFAULT, KD_CUDA_FUSE_ALL, KD_CUDA_FUSE_COPY | KD_CUDA_FUSE_CONV,
                             KD_CUDA_FUSE_CONV, KD_CUDA_FUSE_CONV_PREP, 0};
        const int nm = (int)(sizeof masks / sizeof masks[0]);
        const int pts[][2] = {{1, 0}, {1, 3}, {2, 0}, {1, 1}, {3, 0}, {4, 0}, {8, 0}, {2, 1}, {2, 3}};
        for (const auto &pt : pts) {
            std::vector<std::vector<double>> t((size_t)nm);
            for (int r = 0; r < 5; r++)
                for (int i = 0; i < nm; i++) {
                    kd_cuda_set_fuse(be, masks[i]);
                    t[(size_t)i].push_back(time_steps(be, pt[0], 1 + pt[1], VOC, 3, 20, rec, false));
                }
            for (int i = 0; i < nm; i++) {
                std::sort(t[(size_t)i].begin(), t[(size_t)i].end());
                printf("fuse: B=%d s=%d mask %d (copy %d conv %d conv+prepare %d) step %.3f ms (median of 5 rounds "
                       "of 20; default / this %.3f)\n",
                       pt[0], pt[1], masks[i], !!(masks[i] & KD_CUDA_FUSE_COPY), !!(masks[i] & KD_CUDA_FUSE_CONV),
                       !!(masks[i] & KD_CUDA_FUSE_CONV_PREP), t[(size_t)i][2], t[0][2] / t[(size_t)i][2]);
            }
        }
        kd_cuda_set_fuse(be, KD_CUDA_FUSE_DEFAULT);
        kd_engine_free(e);
        kd_backend_free(be);
        return 0;
    }
    if (getenv("KD_BENCH_ROWS_FORM")) { /* products of 2-4 rows: the pick, cuBLAS, other skinny forms */
        static std::vector<int32_t> rec(128, 0);
        /* {rows form, SwiGLU in gate|up's launch}: the default first, then SwiGLU apart, cuBLAS, single forms */
        const int cfg[][2] = {{0, 1}, {0, 0}, {-1, 1}, {11, 1}, {12, 1}, {5, 1}, {9, 1}};
        const int nc = (int)(sizeof cfg / sizeof cfg[0]);
        const int pts[][2] = {{1, 3}, {1, 1}, {2, 0}, {4, 0}, {1, 2}, {3, 0}};
        for (const auto &pt : pts) {
            std::vector<double> t[sizeof cfg / sizeof cfg[0]];
            for (int r = 0; r < 5; r++)
                for (int i = 0; i < nc; i++) {
                    kd_cuda_set_skinny_rows_form(be, cfg[i][0]);
                    kd_cuda_set_swiglu(be, cfg[i][1]);
                    t[i].push_back(time_steps(be, pt[0], 1 + pt[1], VOC, 3, 20, rec, false));
                }
            for (int i = 0; i < nc; i++) {
                std::sort(t[i].begin(), t[i].end());
                printf("rows_form: B=%d s=%d form %2d SwiGLU %s step %.3f ms (median of 5 rounds of 20; cuBLAS / this "
                       "%.3f)\n",
                       pt[0], pt[1], cfg[i][0], cfg[i][1] ? "fused" : "apart", t[i][2], t[2][2] / t[i][2]);
            }
        }
        kd_cuda_set_skinny_rows_form(be, 0);
        kd_cuda_set_swiglu(be, 1);
        kd_engine_free(e);
        kd_backend_free(be);
        return 0;
    }
    if (getenv("KD_BENCH_SIDE_SWEEP")) { /* where the second stream starts to pay */
        const int pts[][2] = {{4, 0}, {8, 0}, {16, 0}, {24, 0}, {32, 0}, {48, 0}, {64, 0}, {96, 0},
                              {2, 3}, {4, 3}, {6, 3}, {8, 3}, {12, 3}, {16, 3}, {24, 3}};
        std::vector<int32_t> rec0(128, 0);
        std::string md = "| B | s | rows | step ms, f/g on the step's stream | step ms, on a second stream | "
                         "second / first |\n|---|---|---|---|---|---|\n",
                    js = json_head(info.device0_name, date, argv) +
                         "  \"rounds\": 5,\n  \"steps_per_round\": 20,\n  \"points\": [\n";
        char line[256];
        for (const auto &pt : pts) {
            const int Bn = pt[0], T = 1 + pt[1];
            std::vector<double> t[2];
            for (int round = 0; round < 5; round++)
                for (int side = 0; side < 2; side++) {
                    kd_cuda_set_side_rows(be, side);
                    const double ms = time_steps(be, Bn, T, VOC, 3, 20, rec0, false);
                    if (ms < 0) return 1;
                    t[side].push_back(ms);
                }
            for (auto &v : t) std::sort(v.begin(), v.end());
            snprintf(line, sizeof line, "| %d | %d | %d | %.3f | %.3f | %.3f |\n", Bn, pt[1], Bn * T, t[0][2], t[1][2],
                     t[1][2] / t[0][2]);
            md += line;
            printf("%s", line);
            snprintf(line, sizeof line,
                     "%s    {\"B\": %d, \"s\": %d, \"rows\": %d, \"step_ms_one_stream\": %.4f, "
                     "\"step_ms_second_stream\": %.4f}",
                     &pt == &pts[0] ? "" : ",\n", Bn, pt[1], Bn * T, t[0][2], t[1][2]);
            js += line;
        }
        js += "\n  ]\n}\n";
        kd_cuda_set_side_rows(be, side_rows_default);
        char text[640];
        snprintf(text, sizeof text,
                 "Decode steps (graphs, greedy, every draft accepted) of B rows of s + 1 tokens, with f_proj.1 "
                 "and g_proj.1 on the step's stream (kd_cuda_set_side_rows 0) and on the second stream "
                 "(kd_cuda_set_side_rows 1), the two alternated over 5 rounds of 20 steps (3 warm-up "
                 "steps each); medians. The backend's default takes the second stream from %d rows.\n\n",
                 side_rows_default);
        write_results(argv, info.device0_name, date,
                      "Kimi-Linear-48B KDA preset: f_proj.1 and g_proj.1 on a second stream, by rows", js, text + md);
        kd_engine_free(e);
        kd_backend_free(be);
        return 0;
    }

    // (2) decode steps
    std::string json = "{\n  \"device\": \"" + std::string(info.device0_name) + "\",\n  \"date\": \"" + date +
                       "\",\n  \"commit\": \"" + argv[2] + "\",\n  \"command\": \"" + argv[3] + "\",\n";
    char buf[1024];
    snprintf(buf, sizeof buf, "  \"preset\": \"%s\",\n  \"copy_bandwidth_GBps\": %.1f,\n  \"weight_bytes\": %.0f,\n",
             pre->name, copy_bw / 1e9, weight_bytes);
    json += buf;
    json += "  \"steps\": [\n";
    std::string md = "| B | s | tokens/step | step (graphs) ms | step (eager) ms | step (graphs, plain stream order) ms | "
                     "step (graphs, cuBLAS for every product) ms | "
                     "step (graphs, no L2 prefetch) ms | "
                     "step (graphs, f_proj.1 and g_proj.1 one launch each) ms | "
                     "step (graphs, no fusion) ms | step (graphs, copy fused) ms | step (graphs, conv fused) ms | "
                     "step (graphs, cublasGemmEx) ms | step (graphs, cuBLASLt's first algorithm) ms | "
                     "step (graphs, one-pass verify in stream order) ms | step (graphs, conv and prepare apart) ms | "
                     "step (graphs, conv + prepare at every row count) ms | "
                     "step (graphs, f_proj.1 and g_proj.1 on a second stream from 33 rows) ms | "
                     "step (graphs, f_proj.1 and g_proj.1 on a second stream at every row count) ms | "
                     "bytes/step GB | roofline ms | of roofline |\n"
                     "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
    std::vector<int32_t> rec(129, 0);
    std::string abl_md = "| B | s | step ms |";
    for (int i = 0; i < kAblate; i++) abl_md += std::string(" ") + kAblateName[i] + " |";
    abl_md += " step with the weight products alone ms | step without them ms |\n|---|---|---|";
    for (int i = 0; i < kAblate + 2; i++) abl_md += "---|";
    abl_md += "\n";
    std::string abl_json;
    /* the L2 prefetch sweep: bytes a layer (o_proj's first, then gate|up's) and mode */
    int l2 = 0;
    cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0);
    /* as the backend's defaults (mode 4: from blocks of the gated RMSNorm's launch) */
    const int pf_rows_default = 2, pf_mode_default = 4, pf_order_default = 1;
    struct PfConf {
        double l2_frac; /* of the L2; < 0: o_proj's bytes */
        int mode;
        int gu_first; /* gate|up's first rows before o_proj's weights */
    };
    static const int kPfN = 9;
    const PfConf kPf[kPfN] = {{-1, 2, 0},  {0.15, 2, 0}, {0.5, 2, 0}, {0.9, 2, 0}, {0.5, 1, 0},
                              {0.15, 2, 1}, {0.3, 2, 1},  {0.5, 2, 1}, {0.9, 2, 1}};
    auto pf_bytes = [&](const PfConf &p) -> int64_t {
        return p.l2_frac < 0 ? D * VD * 2 : (int64_t)(p.l2_frac * l2) & ~(int64_t)15;
    };
    auto pf_name = [&](const PfConf &p) -> std::string {
        char t[64];
        if (p.l2_frac < 0) snprintf(t, sizeof t, "o_proj %.1f MB, mode %d", D * VD * 2 / 1e6, p.mode);
        else snprintf(t, sizeof t, "%.1f MB, mode %d%s", pf_bytes(p) / 1e6, p.mode, p.gu_first ? ", gate|up first" : "");
        return t;
    };
    std::string pf_md = "| B | s | no prefetch (first pass) ms |", pf_json;
    for (int i = 0; i < kPfN; i++) { /* "gate|up" escaped for the table */
        std::string n = pf_name(kPf[i]);
        for (size_t at = n.find('|'); at != std::string::npos; at = n.find('|', at + 2)) n.insert(at, "\\");
        pf_md += " " + n + " |";
    }
    pf_md += "\n|---|---|---|";
    for (int i = 0; i < kPfN; i++) pf_md += "---|";
    pf_md += "\n";
    bool first = true;
    int fails = 0;
    int prof_b = -1, prof_s = -1;
    if (const char *pe = getenv("KD_BENCH_PROFILE"))
        if (sscanf(pe, "%d,%d", &prof_b, &prof_s) != 2) return printf("KD_BENCH_PROFILE=B,s\n"), 2;
    unsigned prof_skip = 0; /* the profiled step with these kinds of kernel left out (kd_cuda_set_skip) */
    if (const char *ps = getenv("KD_BENCH_SKIP"))
        if (prof_b < 0 || sscanf(ps, "%u", &prof_skip) != 1 || kd_cuda_set_skip(be, prof_skip) != 0)
            return printf("KD_BENCH_SKIP=mask (with KD_BENCH_PROFILE; kd_cuda_set_skip's bits)\n"), 2;
    /* The six points, measured in two passes: first every variant that keeps the step on one
     * stream, at every point, then the end-to-end runs (3), then the variants that put work on
     * a second stream (the L2 prefetch in modes 1-3, f_proj.1 / g_proj.1 beside the conv and KDA kernels):
     * once a process has run those, its later steps of 3-32 rows run slower for good
     * (kernels/cuda/cuda_backend.cu), so what they are compared with is measured before. */
    static const size_t kPoints = 6;
    static const int kPts[kPoints][2] = {{1, 0}, {1, 3}, {32, 0}, {32, 3}, {128, 0}, {128, 3}};
    struct PointRes {
        /* ms[1]: graphs, ms[0]: eager, ms[2]: graphs with the kernels in plain stream order
         * (no programmatic dependent launches), ms[3]: graphs with cuBLAS for every product
         * (no skinny GEMM kernel), ms[4]: unused (it was the conv windows' folds one launch a layer,
         * before the conv history rings), ms[5]: graphs without the L2 prefetch of weights,
         * ms[6]: graphs with f_proj.1 and g_proj.1 one launch
         * each, ms[7]: graphs with the gates' copy, the conv and f_proj.1 + g_proj.1 in their own
         * kernels (kd_cuda_set_fuse(0)), ms[8] / ms[9]: only the copy / only the conv fused,
         * ms[10] / ms[11]: the products cuBLAS takes through cublasGemmEx / cuBLASLt's first
         * algorithm instead of gemm_lt.cuh's table (kd_cuda_set_lt), ms[12]: the one-pass KDA
         * verify in plain stream order (kd_kda_onepass_pdl(0)), ms[13]: the conv and the KDA
         * prepare in their own kernels (all fusions but KD_CUDA_FUSE_CONV_PREP), ms[14]: the conv +
         * prepare kernel at every row count (kd_cuda_set_conv_prep), ms[15] / ms[16]: f_proj.1 and
         * g_proj.1 on the second stream from 33 rows / at every row count (kd_cuda_set_side_rows) */
        double ms[17];
        /* graphs with each kind of kernel left out in turn (kd_cuda_set_skip: wrong results,
         * timing only): abl[i] with bit i; only[0] with the weight products alone, only[1] with
         * everything else alone; graphs with the L2 prefetch in every step, pf[i] with kPf[i] */
        double abl[kAblate], only[2], pf[kPfN];
    };
    std::vector<PointRes> R(kPoints);
    memset(R.data(), 0, sizeof(PointRes) * kPoints);
    /* v: 0 graphs, 1 eager, 2-16 the ms[] columns, then the left-out runs, then the sweep */
    const int v_abl = 17, v_only = v_abl + kAblate, v_pf = v_only + 2, n_v = v_pf + kPfN;
    auto second_stream = [&](int v) { return v == 15 || v == 16 || v >= v_pf; };
    /* pass 0 or 1; -1 on a failed step, 1 when the profiled step has run */
    auto run_pass = [&](int pass) -> int {
        for (size_t p = 0; p < kPoints; p++) {
            const int Bn = kPts[p][0], s = kPts[p][1], T = 1 + s;
            if (prof_b >= 0 && (Bn != prof_b || s != prof_s)) continue;
            PointRes &r = R[p];
            for (int v = 0; v < (prof_b >= 0 ? 1 : n_v); v++) {
                if (second_stream(v) != (pass == 1) || v == 4) continue;
                const int graphs = v != 1;
                kd_cuda_set_pdl(be, v != 2);
                kd_cuda_set_skinny(be, v != 3);
                if (v == 5) kd_cuda_set_prefetch(be, 0, 0, 1);
                else if (v >= v_pf) kd_cuda_set_prefetch(be, pf_bytes(kPf[v - v_pf]), 1 << 20, kPf[v - v_pf].mode);
                else kd_cuda_set_prefetch(be, -1, pf_rows_default, pf_mode_default);
                kd_cuda_set_prefetch_order(be, v >= v_pf ? kPf[v - v_pf].gu_first : pf_order_default);
                if (prof_b >= 0 && getenv("KD_BENCH_PREFETCH") && !strcmp(getenv("KD_BENCH_PREFETCH"), "0"))
                    kd_cuda_set_prefetch(be, 0, 0, 1); /* profiling the step without the L2 prefetch */
                kd_cuda_set_pair(be, v != 6);
                kd_cuda_set_fuse(be, v == 7   ? 0
                                     : v == 8 ? KD_CUDA_FUSE_COPY
                                     : v == 9  ? KD_CUDA_FUSE_CONV
                                     : v == 13 ? KD_CUDA_FUSE_DEFAULT & ~KD_CUDA_FUSE_CONV_PREP
                                               : KD_CUDA_FUSE_DEFAULT);
                kd_kda_onepass_pdl(v != 12);
                kd_cuda_set_conv_prep(be, v == 14);
                kd_cuda_set_side_rows(be, v == 15 ? 33 : v == 16 ? 1 : side_rows_default);
                kd_cuda_set_lt(be, v == 10 ? 0 : v == 11 ? 1 : 2);
                kd_cuda_set_skip(be, v >= v_abl && v < v_only ? 1u << (v - v_abl)
                                     : v == v_only        ? kOthers
                                     : v == v_only + 1    ? kProducts
                                                          : prof_skip);
                kd_cuda_set_graphs(be, graphs);
                const double t = time_steps(be, Bn, T, VOC, 3, prof_b >= 0 ? 2 : graphs ? 30 : 10, rec, prof_b >= 0);
                if (t < 0) return -1;
                if (v >= v_pf) r.pf[v - v_pf] = t;
                else if (v >= v_only) r.only[v - v_only] = t;
                else if (v >= v_abl) r.abl[v - v_abl] = t;
                else r.ms[v == 0 ? 1 : v == 1 ? 0 : v] = t;
            }
            kd_cuda_set_pdl(be, 1);
            kd_cuda_set_skinny(be, 1);
            kd_cuda_set_skip(be, 0);
            kd_cuda_set_prefetch(be, -1, pf_rows_default, pf_mode_default);
            kd_cuda_set_prefetch_order(be, pf_order_default);
            kd_cuda_set_pair(be, 1);
            kd_cuda_set_fuse(be, KD_CUDA_FUSE_DEFAULT);
            kd_cuda_set_lt(be, 2);
            kd_kda_onepass_pdl(1);
            kd_cuda_set_conv_prep(be, 0);
            kd_cuda_set_side_rows(be, side_rows_default);
            kd_cuda_set_graphs(be, 1);
            if (prof_b >= 0) {
                cudaDeviceSynchronize();
                cudaProfilerStop();
                printf("profiled B=%d s=%d: 2 steps, %.3f ms each (with the profiler)\n", Bn, s, r.ms[1]);
                return 1;
            }
        }
        return 0;
    };
    const bool e2e_only = getenv("KD_BENCH_E2E") != nullptr;
    int rc = e2e_only ? 0 : run_pass(0);
    if (rc) return rc < 0 ? 1 : 0;
    if (e2e_only) { /* the end-to-end runs' decode steps as the step table times them, for comparison */
        std::vector<int32_t> rec0(128, 0);
        for (int Bn : {32, 128}) {
            const double ms = time_steps(be, Bn, 1, VOC, 3, 20, rec0, false);
            if (ms < 0) return 1;
            printf("step (graphs) B=%d s=0: %.3f ms (time_steps: mean of 20 after 3)\n", Bn, ms);
        }
    }

    // free the slots for the engine: commit what the step runs left recorded
    for (int r = 0; r < 128; r++)
        if (kd_backend_reset_slot(be, r, &err)) return printf("reset: %s\n", err.msg), 1;

    // (3) end to end (before any step that uses a second stream)
    std::string e2e_json;
    std::string md2 = "| requests | drafts | prompt | new tokens | total s | tokens/s (all) | decode s | tokens/s (decode) | "
                      "steps | slowest decode step ms | graphs captured | accepted/drafted | held |\n"
                      "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
    const int PROMPT = 128, GEN = 128;
    std::vector<int32_t> prompt(PROMPT), pat(16);
    g_rng = 0x2545f4914f6cdd1dull; /* the prompts whatever was timed before (runs of two commits compare) */
    for (auto &x : pat) x = (int32_t)(rnd() % (uint64_t)VOC);
    bool e2e_first = true;
    uint64_t id = 1;
    static kd_backend_ops timed_ops;
    g_real_ops = be->ops, timed_ops = *be->ops;
    timed_ops.forward_sample = timed_forward_sample, timed_ops.commit = timed_commit;
    std::vector<std::vector<int32_t>> cont(128);
    int e2e_passes = 1, n_warm = -1;
    if (!env_int("KD_BENCH_E2E_PASSES", 1, 4, &e2e_passes) || !env_int("KD_BENCH_WARM", 0, 96, &n_warm)) return 2;
    if (n_warm >= 0) {
        const double tw = now();
        const int got = kd_cuda_warm_graphs(be, cfg.max_seqs, n_warm, &err);
        if (got < 0) return printf("warm graphs: %s\n", err.msg), 1;
        printf("graphs captured before the end-to-end runs: %d in %.3f s (%.2f ms each)\n", got, now() - tw,
               got ? (now() - tw) * 1e3 / got : 0.0);
    }
    for (int pass = 0; pass < e2e_passes; pass++)
        for (int nreq : {32, 128})
            for (int mode = 0; mode < 4; mode++) {
                /* none; n-gram drafts with the draft gate (the worker's default) and without; the
                 * oracle's (the no-draft run's continuation) without */
                static const char *const dname[] = {"none", "ngram", "ngram-ungated", "oracle"};
                static const char *const dlabel[] = {"none", "n-gram, s = 3", "n-gram, s = 3, no gate",
                                                     "oracle, s = 3, no gate"};
                const int s = mode ? 3 : 0;
                kd_engine_set_draft_min_accept(e, mode == 1 ? cfg.draft_min_accept : 0);
                kd_engine_stats st0;
                kd_engine_stats_get(e, &st0);
                sink = Sink();
                for (int q = 0; q < nreq; q++) {
                    for (int i = 0; i < PROMPT; i++) prompt[(size_t)i] = pat[(size_t)((i + q) % 16)];
                    kd_request_params p;
                    memset(&p, 0, sizeof p);
                    p.id = id++, p.prompt = prompt.data(), p.n_prompt = PROMPT, p.max_tokens = GEN;
                    p.sampling.top_p = 1, p.spec_tokens = s, p.eos_id = -1;
                    p.draft = mode == 0 ? KD_DRAFT_NONE : mode <= 2 ? KD_DRAFT_NGRAM : KD_DRAFT_ORACLE;
                    if (mode == 3) p.oracle = cont[(size_t)q].data(), p.n_oracle = (int32_t)cont[(size_t)q].size();
                    if (kd_engine_submit(e, &p, &err) != KD_SUBMIT_OK) return printf("submit: %s\n", err.msg), 1;
                }
                int64_t cap0 = 0, rep0 = 0, cap1 = 0, rep1 = 0;
                kd_cuda_graph_stats(be, &cap0, &rep0);
                const double ts = now();
                double tdec = 0, slowest = 0; /* the longest decode-phase step */
                int64_t tok_dec = 0; /* tokens generated when the decode phase starts */
                std::vector<double> dsteps; /* the decode phase's steps, s (engine step, wall) */
                double fs0 = 0, cm0 = 0;
                int64_t fsn0 = 0, cmn0 = 0;
                be->ops = &timed_ops; /* only around the steps: the kd_cuda_* calls know the backend by its table */
                while (kd_engine_has_work(e)) {
                    const double t0 = now();
                    if (kd_engine_step(e, &err) < 0) return printf("step: %s\n", err.msg), 1;
                    if (tdec > 0) dsteps.push_back(now() - t0);
                    if (tdec > 0 && now() - t0 > slowest) slowest = now() - t0;
                    if (tdec == 0 && sink.toks.size() >= (size_t)nreq) { // every request has its first token
                        tdec = now(), tok_dec = sink.tokens;
                        fs0 = g_fs_s, cm0 = g_commit_s, fsn0 = g_fs_n, cmn0 = g_commit_n;
                    }
                }
                const double tend = now();
                be->ops = g_real_ops;
                kd_engine_stats st1;
                kd_engine_stats_get(e, &st1);
                const int64_t gen = st1.tokens_generated - st0.tokens_generated, steps = st1.steps - st0.steps;
                if (mode == 0) // the continuations, for the oracle drafter
                    for (int q = 0; q < nreq; q++) cont[(size_t)q] = sink.toks[id - (uint64_t)nreq + (uint64_t)q];
                const int64_t dr = st1.drafted - st0.drafted, ac = st1.accepted - st0.accepted,
                              held = st1.held - st0.held;
                const double dec_tok = (double)(sink.tokens - tok_dec), dec_s = tend - tdec;
                kd_cuda_graph_stats(be, &cap1, &rep1);
                printf("end to end: %d requests, s=%d %s: %lld tokens in %.2f s: %.0f tokens/s; decode phase %.0f "
                       "tokens/s; "
                       "%lld steps (slowest decode step %.2f ms); accepted %lld of %lld drafts; graphs captured "
                       "%lld, replays %lld\n",
                       nreq, s, dname[mode], (long long)gen, tend - ts,
                       gen / (tend - ts), dec_tok / dec_s, (long long)steps, slowest * 1e3, (long long)ac,
                       (long long)dr,
                       (long long)(cap1 - cap0), (long long)(rep1 - rep0));
                if (!dsteps.empty()) { /* where the decode phase's time goes: steps and between them */
                    std::vector<double> v = dsteps;
                    std::sort(v.begin(), v.end());
                    double sum = 0;
                    for (double x : v) sum += x;
                    const double med = v[v.size() / 2];
                    printf("end to end: %d requests, s=%d %s: decode phase %zu steps: median %.3f ms, p10 %.3f, p90 "
                           "%.3f, max %.3f; steps %.3f s of the phase's %.3f s; over the median %.3f s\n",
                           nreq, s, dname[mode], v.size(), med * 1e3,
                           v[v.size() / 10] * 1e3, v[v.size() * 9 / 10] * 1e3, v.back() * 1e3, sum, dec_s,
                           sum - med * (double)v.size());
                    printf("end to end: %d requests, s=%d %s: decode phase: forward_sample %lld calls %.3f s (%.3f ms "
                           "each), commit %lld calls %.3f s, the rest of the steps %.3f s\n",
                           nreq, s, dname[mode], (long long)(g_fs_n - fsn0),
                           g_fs_s - fs0, g_fs_n > fsn0 ? (g_fs_s - fs0) * 1e3 / (double)(g_fs_n - fsn0) : 0.0,
                           (long long)(g_commit_n - cmn0), g_commit_s - cm0, sum - (g_fs_s - fs0) - (g_commit_s - cm0));
                }
                if (sink.finished != nreq) fails++;
                snprintf(buf, sizeof buf,
                         "%s    {\"pass\": %d, \"requests\": %d, \"spec\": %d, \"drafter\": \"%s\", \"prompt\": %d, "
                         "\"new_tokens\": %lld, "
                         "\"seconds\": %.3f, \"tokens_per_s\": %.1f, \"decode_seconds\": %.3f, "
                         "\"decode_tokens_per_s\": %.1f, "
                         "\"steps\": %lld, \"slowest_decode_step_ms\": %.3f, \"drafted\": %lld, \"accepted\": %lld, "
                         "\"held\": %lld, \"graphs_captured\": %lld}",
                         e2e_first ? "" : ",\n", pass + 1, nreq, s,
                         dname[mode], PROMPT,
                         (long long)gen, tend - ts, gen / (tend - ts),
                         dec_s, dec_tok / dec_s, (long long)steps, slowest * 1e3, (long long)dr, (long long)ac,
                         (long long)held, (long long)(cap1 - cap0));
                e2e_json += buf;
                e2e_first = false;
                snprintf(buf, sizeof buf,
                         "| %d | %s%s | %d | %lld | %.2f | %.0f | %.2f | %.0f | %lld | %.2f | %lld | %lld/%lld | %lld |\n",
                         nreq,
                         dlabel[mode],
                         pass == 0 ? "" : pass == 1 ? " (pass 2)" : pass == 2 ? " (pass 3)" : " (pass 4)", PROMPT,
                         (long long)gen, tend - ts, gen / (tend - ts), dec_s, dec_tok / dec_s, (long long)steps,
                         slowest * 1e3, (long long)(cap1 - cap0), (long long)ac, (long long)dr, (long long)held);
                md2 += buf;
            }
    if (e2e_only) {
        int64_t gcap = 0, grep = 0;
        kd_cuda_graph_stats(be, &gcap, &grep);
        printf("%s\nCUDA graphs captured %lld, replays %lld\n", md2.c_str(), (long long)gcap, (long long)grep);
        kd_engine_free(e);
        kd_backend_free(be);
        return fails ? 1 : 0;
    }

    // the second-stream variants of the decode steps (2), last
    for (int r = 0; r < 128; r++)
        if (kd_backend_reset_slot(be, r, &err)) return printf("reset: %s\n", err.msg), 1;
    std::fill(rec.begin(), rec.end(), 0);
    if (run_pass(1)) return 1;

    for (size_t p = 0; p < kPoints; p++) {
        const int Bn = kPts[p][0], s = kPts[p][1], T = 1 + s;
        const double *ms = R[p].ms, *abl = R[p].abl, *only = R[p].only, *pf = R[p].pf;
        // bytes: every weight, the embedding rows, per row and layer the checkpoint and conv
        // window read and written once (the fold), the window's records written (and read by
        // the next fold), conv inputs likewise
        const double per_row_layer = 2.0 * 4 * (lay.ssm_elems + lay.conv_elems) +
                                     2.0 * 4 * T * (HV * V + HV * 2 * K + C);
        const double bytes = weight_bytes + 2.0 * Bn * T * D + (double)Bn * L * per_row_layer;
        const double roof = bytes / copy_bw * 1e3;
        const double frac = roof / ms[1];
        printf("B=%3d s=%d: step %.3f ms (graphs), %.3f ms (eager), %.3f ms (graphs, plain stream order), %.3f ms "
               "(graphs, cuBLAS for every product), %.3f ms "
               "(graphs, no L2 prefetch), %.3f ms "
               "(graphs, f_proj.1 and g_proj.1 one launch each), %.3f ms "
               "(graphs, "
               "no fusion), %.3f / %.3f ms (graphs, only the copy / the conv fused), %.3f / %.3f ms (graphs, "
               "cublasGemmEx / cuBLASLt's first algorithm), %.3f ms (graphs, one-pass verify in stream order), "
               "%.3f ms (graphs, conv and prepare apart), %.3f ms (graphs, conv + prepare at every row count), "
               "%.3f / %.3f ms (graphs, f/g on a second stream from 33 rows / at every row count); "
               "%.2f GB/step; roofline %.3f ms: %.1f %%\n",
               Bn, s, ms[1], ms[0], ms[2], ms[3], ms[5], ms[6], ms[7], ms[8], ms[9], ms[10], ms[11], ms[12],
               ms[13], ms[14], ms[15], ms[16], bytes / 1e9, roof, 100 * frac);
        snprintf(buf, sizeof buf,
                 "%s    {\"B\": %d, \"s\": %d, \"step_ms_graphs\": %.4f, \"step_ms_eager\": %.4f, \"bytes\": %.0f, "
                 "\"step_ms_graphs_stream_order\": %.4f, \"step_ms_graphs_cublas\": %.4f, "
                 "\"step_ms_graphs_no_prefetch\": %.4f, "
                 "\"step_ms_graphs_fg_unpaired\": %.4f, \"step_ms_graphs_no_fusion\": %.4f, "
                 "\"step_ms_graphs_copy_fused\": %.4f, \"step_ms_graphs_conv_fused\": %.4f, "
                 "\"step_ms_graphs_gemmex\": %.4f, \"step_ms_graphs_lt_first\": %.4f, "
                 "\"step_ms_graphs_onepass_stream_order\": %.4f, \"step_ms_graphs_conv_prepare_apart\": %.4f, "
                 "\"step_ms_graphs_conv_prepare_always\": %.4f, \"step_ms_graphs_fg_side_from_33\": %.4f, "
                 "\"step_ms_graphs_fg_side_always\": %.4f, \"step_ms_products_only\": %.4f, "
                 "\"step_ms_products_left_out\": %.4f, \"roofline_ms\": %.4f, \"fraction_of_roofline\": %.3f}",
                 first ? "" : ",\n", Bn, s, ms[1], ms[0], bytes, ms[2], ms[3], ms[5], ms[6], ms[7], ms[8],
                 ms[9], ms[10], ms[11], ms[12], ms[13], ms[14], ms[15], ms[16], only[0], only[1], roof, frac);
        json += buf;
        first = false;
        snprintf(buf, sizeof buf,
                 "| %d | %d | %d | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f "
                 "| %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.2f | %.3f | %.1f %% |\n",
                 Bn, s, Bn * T, ms[1], ms[0], ms[2], ms[3], ms[5], ms[6], ms[7], ms[8], ms[9], ms[10],
                 ms[11], ms[12], ms[13], ms[14], ms[15], ms[16], bytes / 1e9, roof, 100 * frac);
        md += buf;
        /* the L2 prefetch in every step, by bytes a layer and mode */
        snprintf(buf, sizeof buf, "| %d | %d | %.3f |", Bn, s, ms[5]);
        pf_md += buf;
        printf("B=%3d s=%d L2 prefetch in every step (ms):", Bn, s);
        for (int i = 0; i < kPfN; i++) {
            snprintf(buf, sizeof buf, " %.3f |", pf[i]);
            pf_md += buf;
            printf(" %s %.3f%s", pf_name(kPf[i]).c_str(), pf[i], i + 1 < kPfN ? "," : "\n");
            snprintf(buf, sizeof buf, "%s{\"B\": %d, \"s\": %d, \"prefetch\": \"%s\", \"bytes\": %lld, "
                     "\"mode\": %d, \"gate_up_first\": %d, \"step_ms\": %.4f}", pf_json.empty() ? "" : ",\n    ",
                     Bn, s, pf_name(kPf[i]).c_str(), (long long)pf_bytes(kPf[i]), kPf[i].mode, kPf[i].gu_first,
                     pf[i]);
            pf_json += buf;
        }
        pf_md += "\n";
        /* what each kind of kernel costs a step on its critical path: the step's time less the time
         * with it left out */
        snprintf(buf, sizeof buf, "| %d | %d | %.3f |", Bn, s, ms[1]);
        abl_md += buf;
        for (int i = 0; i < kAblate; i++) {
            snprintf(buf, sizeof buf, " %.3f |", ms[1] - abl[i]);
            abl_md += buf;
            snprintf(buf, sizeof buf, "%s{\"B\": %d, \"s\": %d, \"left_out\": \"%s\", \"step_ms\": %.4f}",
                     abl_json.empty() ? "" : ",\n    ", Bn, s, kAblateName[i], abl[i]);
            abl_json += buf;
        }
        snprintf(buf, sizeof buf, " %.3f | %.3f |\n", only[0], only[1]);
        abl_md += buf;
        printf("B=%3d s=%d: the weight products alone %.3f ms, everything else alone %.3f ms\n", Bn, s, only[0],
               only[1]);
        printf("B=%3d s=%d left out (ms a step less):", Bn, s);
        for (int i = 0; i < kAblate; i++)
            printf(" %s %.3f%s", kAblateName[i], ms[1] - abl[i], i + 1 < kAblate ? "," : "\n");
    }
    json += "\n  ],\n  \"left_out\": [\n    " + abl_json + "\n  ],\n  \"l2_prefetch\": [\n    " + pf_json +
            "\n  ],\n  \"end_to_end\": [\n" + e2e_json;
    int64_t cap = 0, rep = 0;
    kd_cuda_graph_stats(be, &cap, &rep);
    snprintf(buf, sizeof buf, "\n  ],\n  \"graphs_captured\": %lld,\n  \"graph_replays\": %lld\n}\n", (long long)cap,
             (long long)rep);
    json += buf;
    std::string pj = std::string(argv[1]) + ".json", pm = std::string(argv[1]) + ".md";
    FILE *f = fopen(pj.c_str(), "w");
    if (f) fputs(json.c_str(), f), fclose(f);
    f = fopen(pm.c_str(), "w");
    if (f) {
        fprintf(f, "# Kimi-Linear-48B KDA preset: decode step and end to end on the CUDA backend\n\n");
        fprintf(f, "device: %s; date: %s; commit: %s; command: `%s`\n\n", info.device0_name, date, argv[2], argv[3]);
        fprintf(f, "Preset `%s` (D=%lld, L=%lld, H=HV=%lld, K=V=%lld, MLP %lld, vocab %lld), random bf16 weights "
                   "(%.2f GB on the device), bf16 activations, fp32 state, deferred commits, greedy sampling on the "
                   "device. Copy floor measured in the same run: %.0f GB/s (2 GiB cudaMemcpy device to device, read + "
                   "write).\n\n",
                pre->name, (long long)D, (long long)L, (long long)H, (long long)K, (long long)I, (long long)VOC,
                weight_bytes / 1e9, copy_bw / 1e9);
        fprintf(f, "## Decode step (forward + sampling, only token ids come back)\n\n"
                   "Roofline = (all weight bytes + per row and layer the state read and written once by the fold, the "
                   "window's records and conv inputs written and read back) / copy bandwidth. Every draft accepted, so "
                   "each step folds the whole previous window. The products where the backend's skinny GEMM kernel "
                   "beats cuBLAS (gemv.cuh, kd_cu_skinny_pick) go to it; the cuBLAS column runs every product through "
                   "cuBLAS, the next runs without the L2 "
                   "prefetch of weights (by default from blocks of the gated and MLP RMSNorms' launches in steps of "
                   "at most %d requests: kd_cuda_set_prefetch mode 4), the next with f_proj.1 and g_proj.1 in a launch "
                   "each (kd_cuda_set_pair(0)), the next with the conv and the KDA prepare in their own kernels "
                   "instead of f_proj.1 + g_proj.1's launch and the conv + prepare kernel (kd_cuda_set_fuse(0)), the "
                   "next two with only the gates' bf16 copy (into the input projection's epilogue at one row; off by "
                   "default) / only the conv (into f_proj.1 + g_proj.1's launch) fused, the next two with the "
                   "products cuBLAS "
                   "takes through cublasGemmEx / cuBLASLt's first algorithm instead of the algorithm "
                   "kernels/cuda/gemm_lt.cuh's table names (kd_cuda_set_lt), the next with the one-pass KDA verify "
                   "(from B = 3) in plain stream order instead of a programmatic dependent of the KDA "
                   "prepare (kd_kda_onepass_pdl(0)), the next with the conv of the q and k channels and the KDA "
                   "prepare in their own kernels instead of one (every fusion but KD_CUDA_FUSE_CONV_PREP; the default "
                   "takes the one kernel by row count, kernels/cuda/cuda_backend.cu conv_prep_rows), the next with the "
                   "one kernel at every row count (kd_cuda_set_conv_prep), the last two with f_proj.1 and g_proj.1 "
                   "on a second stream beside the conv and the KDA kernels from 33 rows / at every row count "
                   "(kd_cuda_set_side_rows; never by default), in the same run. The columns that use a second "
                   "stream (the last two and the prefetch table below) are measured last, after every "
                   "other column at every point and after the end-to-end runs: a process that has run work on a "
                   "second stream runs its later steps of 3-32 rows slower for good "
                   "(kernels/cuda/cuda_backend.cu, results/kimi48b_slow_state_h200.md).\n\n%s\n",
                pf_rows_default, md.c_str());
        fprintf(f, "### Where a step's time goes\n\nEach kind of kernel left out of every layer in turn "
                   "(kd_cuda_set_skip: the results are wrong, the timing is what that kernel costs the step on its "
                   "critical path; with the conv or the KDA prepare left out, the other runs in its own kernel): the "
                   "step's time (graphs) less the time without it, ms; the last two columns: the "
                   "step's time with only the weight products (input projection, f_proj.1 + g_proj.1, o_proj, "
                   "MLP, head) and with everything but them.\n\n%s\n",
                abl_md.c_str());
        fprintf(f, "### The L2 prefetch of weights\n\nSteps (graphs) with each layer's o_proj weights, then "
                   "gate|up's first rows (or the other way round), prefetched into the L2 (%d MB) on a second "
                   "stream after the input "
                   "projection, in every step whatever its rows (the default instead: mode 4, from blocks of "
                   "the gated and MLP RMSNorms' launches, in steps of at most %d requests), by "
                   "bytes a layer and mode (kd_cu_l2_prefetch: 1 a prefetch a 128-byte line, 2 bulk prefetches of "
                   "16 KiB, 3 loads with the L2's 256-byte fetch); \"gate|up first\": gate|up's first rows before "
                   "o_proj's weights (kd_cuda_set_prefetch_order), ms; measured after the other columns "
                   "(above).\n\n%s\n",
                l2 >> 20, pf_rows_default, pf_md.c_str());
        fprintf(f, "## End to end (engine, %d-token repetitive prompt, %d new tokens per request, greedy)\n\n%s\n"
                   "\"decode\" starts once every request has its first token (prefill done; its tokens counted from "
                   "there: until 2026-12-03 it started once as many tokens as requests had come, inside the prefill "
                   "at 128 requests). Random weights: the n-gram "
                   "drafter is only accepted where the random model repeats its prompt; the oracle rows draft the "
                   "greedy continuation of the no-speculation run (right until a step's bf16 rounding parts a "
                   "request from it). \"n-gram\" runs with the draft gate, the worker's default (a request's "
                   "drafts are verified while its recent ones predict 0.5 accepted tokens a step; held: drafts "
                   "proposed and not verified), the \"no gate\" rows without it.\n",
                PROMPT, GEN, md2.c_str());
        fprintf(f, "\nCUDA graphs captured %lld, replays %lld.\n", (long long)cap, (long long)rep);
        fclose(f);
    }
    kd_engine_free(e);
    kd_backend_free(be);
    delete big, delete wide, delete sq, delete conv, delete small;
    printf("%s\n", fails ? "BENCH INCOMPLETE" : "BENCH DONE");
    return fails ? 1 : 0;
}
