// gemm_lt_bench.cu: which cuBLASLt algorithm streams each decode-step product of the
// Kimi-Linear-48B KDA preset fastest at 2-512 activation rows, against cublasGemmEx's default
// (what the CUDA backend called before kd_cu_lt, gemm_lt.cuh) and against the copy floor
// measured in the same run. Needs a GPU (tests/cuda/run_device.sh, not a bazel test):
//   gemm_lt_bench OUT_PREFIX COMMIT COMMAND
// writes OUT_PREFIX.json and OUT_PREFIX.md; every candidate's time goes to stdout.
//
// Candidates: cuBLASLt's heuristic list for the shape (up to 32 algorithms, 32 MiB of
// workspace), and for its first 4 the same algorithm with the K dimension split 2-16 ways
// (where cublasLtMatmulAlgoCheck takes it). Each: a CUDA graph of L launches, each on its own
// copy of the weights (together more than 4 times the L2), median of 15 replays, per launch;
// its output against cublasGemmEx's (max error relative to the largest magnitude). The
// backend's pick (its table, gemm_lt.cu) is timed in the same way in its own column.
//
// KD_LT_SEARCH=1 gemm_lt_bench OUT_PREFIX COMMIT COMMAND: beyond the heuristic's list, every
// configuration cuBLASLt accepts (cublasLtMatmulAlgoCheck) for the preset's products of more than 256
// keys but the head, or for KD_LT_SEARCH_SHAPES=NxK,... (another model's weights), at KD_LT_SEARCH_MS rows
// (default 32,128): the heuristic's answers, then for each algorithm id with each answer's inner and
// cluster shape (and with the defaults) its tiles x stages (only its automatic stage counts where it has
// any) x cuBLASLt's K split (KD_LT_SEARCH_SPLITS, default 1,2,4,8; screened: 3 replays), then for the 8
// fastest every cluster shape x CTA
// swizzling x custom option, then the 5 fastest of all timed again as above (15 replays) beside
// cublasGemmEx and the heuristic's first. Every candidate's output is checked against cublasGemmEx's
// before it is timed. Writes OUT_PREFIX.json / .md (the best configuration found per product and row
// count) and OUT_PREFIX.table: those at least 2 % faster than the heuristic's first, as an operator's
// table for KDECODE_CUDA_LT_TABLE (kd/lt_table.h), read back with the backend's parser.
// KD_LT_SEARCH_BATCH=1,4,...: each product also searched as a strided batch of that many K slices,
// each slice's partial sums written apart (nb x M x N, checked by their sum; the time is the batch's
// alone: a consumer of the product adds the partial sums), a K split that needs no reduction kernel.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <algorithm>
#include <string>
#include <vector>

#include "kernels/cuda/ck.cuh"
#include "kernels/cuda/gemm_lt.cuh"
#include "tests/bench/gemm_common.cuh"

static uint64_t g_rng = 0x452821e638d01377ull; /* the weights' and activations' random fill */

#define LT(x)                                                                                          \
    do {                                                                                               \
        cublasStatus_t s_ = (x);                                                                       \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                             \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cublasGetStatusString(s_));     \
            exit(1);                                                                                   \
        }                                                                                              \
    } while (0)

struct Cand {
    cublasLtMatmulAlgo_t algo;
    std::string label;
};

static std::string algo_str(const cublasLtMatmulAlgo_t &a) {
    int32_t id = 0, splitk = 0;
    uint32_t tile = 0, red = 0, swz = 0, custom = 0, stages = 0;
    uint16_t inner = 0, cluster = 0;
    size_t w;
    cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id, &w);
    cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, &w);
    cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof splitk, &w);
    cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &red, sizeof red, &w);
    cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &swz, sizeof swz, &w);
    cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, &custom, sizeof custom, &w);
    cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof stages, &w);
    cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID, &inner, sizeof inner, &w);
    cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster, sizeof cluster, &w);
    char b[160];
    snprintf(b, sizeof b, "id %d tile %u stages %u splitk %d red %u swz %u custom %u inner %u cluster %u", id, tile,
             stages, splitk, red, swz, custom, (unsigned)inner, (unsigned)cluster);
    return b;
}

// cuBLASLt's view of C^T[N][M] = W[N][K] A[M][K]^T in column-major terms: op(W) = W^T of a K x N
// matrix (ld K), A a K x M matrix (ld K), C an N x M matrix (ld N).
struct LtProduct {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t lw = nullptr, la = nullptr, lc = nullptr;
    /* nb > 1: the K dimension cut into nb slices of K / nb keys, one product of the batch each (W and A
     * at the slice's first key, ld K), each slice's C[M][N] of its own (nb partial sums, one after another) */
    LtProduct(int N, int K, int M, int nb = 1) {
        LT(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        const cublasOperation_t tr = CUBLAS_OP_T, nt = CUBLAS_OP_N;
        LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &tr, sizeof tr));
        LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &nt, sizeof nt));
        LT(cublasLtMatrixLayoutCreate(&lw, CUDA_R_16BF, K / nb, N, K));
        LT(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, K / nb, M, K));
        LT(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, N, M, N));
        if (nb > 1) {
            const int32_t cnt = nb;
            const int64_t ko = K / nb, co = (int64_t)N * M;
            for (cublasLtMatrixLayout_t l : {lw, la, lc}) {
                LT(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &cnt, sizeof cnt));
                const int64_t off = l == lc ? co : ko;
                LT(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &off,
                                                    sizeof off));
            }
        }
    }
    LtProduct(const LtProduct &) = delete;
    LtProduct &operator=(const LtProduct &) = delete;
    ~LtProduct() {
        cublasLtMatrixLayoutDestroy(lw), cublasLtMatrixLayoutDestroy(la), cublasLtMatrixLayoutDestroy(lc);
        cublasLtMatmulDescDestroy(op);
    }
};

// A CUDA graph of one launch on each copy of the weights, median of reps replays, per launch (us).
template <typename F>
static double time_launches(cudaStream_t st, const BenchBuffers &bb, F launch, int reps) {
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    for (int l = 0; l < bb.L; l++) launch(bb.W[l]);
    CK(cudaStreamEndCapture(st, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    const double us = time_graph(ge, st, reps) * 1e3 / bb.L;
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
    return us;
}

// ------------------------------------------------------------------ KD_LT_SEARCH

// One configuration of cuBLASLt's algorithm descriptor: kd_lt_config (gemm_lt.cuh), the form
// the backend's table holds; its descriptor made by kd_cu_lt_config_algo.
using LtCfg = kd_lt_config;

static bool lt_cfg_algo(cublasLtHandle_t lt, const LtCfg &c, cublasLtMatmulAlgo_t *a) {
    return kd_cu_lt_config_algo(lt, &c, a) != 0;
}

// The configuration of a descriptor cuBLASLt filled in (the heuristic's answers).
static LtCfg lt_cfg_read(const cublasLtMatmulAlgo_t &a) {
    LtCfg c = {};
    size_t n;
    auto get = [&](cublasLtMatmulAlgoConfigAttributes_t at, void *x, size_t sz) {
        cublasLtMatmulAlgoConfigGetAttribute(&a, at, x, sz, &n);
    };
    get(CUBLASLT_ALGO_CONFIG_ID, &c.id, sizeof c.id);
    get(CUBLASLT_ALGO_CONFIG_TILE_ID, &c.tile, sizeof c.tile);
    get(CUBLASLT_ALGO_CONFIG_STAGES_ID, &c.stages, sizeof c.stages);
    get(CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &c.split_k, sizeof c.split_k);
    get(CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &c.reduction, sizeof c.reduction);
    get(CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &c.swizzle, sizeof c.swizzle);
    get(CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, &c.custom, sizeof c.custom);
    get(CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &c.cluster, sizeof c.cluster);
    get(CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID, &c.inner, sizeof c.inner);
    return c;
}

// A capability that is a list (tiles, stages): empty where the algorithm has none.
static std::vector<uint32_t> lt_cap_list(const cublasLtMatmulAlgo_t &a, cublasLtMatmulAlgoCapAttributes_t at) {
    size_t n = 0;
    if (cublasLtMatmulAlgoCapGetAttribute(&a, at, nullptr, 0, &n) != CUBLAS_STATUS_SUCCESS || n < sizeof(uint32_t))
        return {};
    std::vector<uint32_t> v(n / sizeof(uint32_t));
    if (cublasLtMatmulAlgoCapGetAttribute(&a, at, v.data(), v.size() * sizeof(uint32_t), &n) != CUBLAS_STATUS_SUCCESS)
        return {};
    return v;
}
template <typename T>
static T lt_cap(const cublasLtMatmulAlgo_t &a, cublasLtMatmulAlgoCapAttributes_t at) {
    T x{};
    size_t n = 0;
    if (cublasLtMatmulAlgoCapGetAttribute(&a, at, &x, sizeof x, &n) != CUBLAS_STATUS_SUCCESS) return T{};
    return x;
}

static std::string lt_cfg_str(const LtCfg &c) {
    return bench_fmt("id %d tile %u stages %u splitk %d red %u swz %u custom %u cluster %u inner %u", c.id, c.tile,
                     c.stages, c.split_k, c.reduction, c.swizzle, c.custom, (unsigned)c.cluster, (unsigned)c.inner);
}

static int lt_search(BenchEnv &env, cublasLtHandle_t lt, double copy_bw, int argc, char **argv) {
    (void)argc;
    const cudaStream_t st = env.st;
    const size_t ws_bytes = KD_LT_WORKSPACE;
    std::vector<int> Ms;
    {
        const char *e = getenv("KD_LT_SEARCH_MS");
        std::string list = e && *e ? e : "32,128";
        for (const char *p = list.c_str();;) {
            char *end = nullptr;
            const long m = strtol(p, &end, 10);
            if (end == p || m < 1 || m > 512 || (*end != ',' && *end != '\0') ||
                std::find(Ms.begin(), Ms.end(), (int)m) != Ms.end())
                return fprintf(stderr, "KD_LT_SEARCH_MS=%s: rows in 1..512, comma-separated, each once\n",
                               list.c_str()),
                       2;
            Ms.push_back((int)m);
            if (*end == '\0') break;
            p = end + 1;
        }
    }
    /* the products: KD_LT_SEARCH_SHAPES=NxK,NxK,... (another model's weights N x K), else the 48B preset's of
     * more than 256 keys but the head (the skinny kernel takes the f / g products; the head streams at the copy
     * rate) */
    std::vector<BenchShape> shapes;
    std::vector<std::string> names;
    if (const char *e = getenv("KD_LT_SEARCH_SHAPES"); e && *e) {
        for (const char *p = e;;) {
            char *x = nullptr, *end = nullptr;
            const long n = strtol(p, &x, 10);
            const long k = x != p && *x == 'x' ? strtol(x + 1, &end, 10) : 0;
            if (n < 1 || n > (1 << 20) || k < 1 || k > (1 << 20) || !end || end == x + 1 ||
                (*end != ',' && *end != '\0') || names.size() >= 64)
                return fprintf(stderr,
                               "KD_LT_SEARCH_SHAPES=%s: NxK pairs (each 1..2^20), comma-separated, at most 64\n", e),
                       2;
            names.push_back(bench_fmt("%ldx%ld", n, k));
            shapes.push_back({nullptr, (int)n, (int)k});
            if (*end == '\0') break;
            p = end + 1;
        }
        for (size_t i = 0; i < shapes.size(); i++) shapes[i].name = names[i].c_str();
    } else {
        for (const BenchShape &sh : kPresetProducts)
            if (sh.K > 256 && sh.N <= 20000) shapes.push_back(sh);
    }
    /* KD_LT_SEARCH_BATCH=1,4,...: each product also as a batch of that many K slices (LtProduct), its partial
     * sums left apart (a consumer adds them); KD_LT_SEARCH_SPLITS: cuBLASLt's own K splits tried */
    auto int_list = [](const char *var, const char *dflt, int lo, int hi, std::vector<int> *out) {
        const char *e = getenv(var);
        std::string list = e && *e ? e : dflt;
        for (const char *p = list.c_str();;) {
            char *end = nullptr;
            const long v = strtol(p, &end, 10);
            if (end == p || v < lo || v > hi || (*end != ',' && *end != '\0') || out->size() >= 16)
                return fprintf(stderr, "%s=%s: at most 16 numbers in %d..%d, comma-separated\n", var, list.c_str(), lo,
                               hi),
                       false;
            out->push_back((int)v);
            if (*end == '\0') return true;
            p = end + 1;
        }
    };
    std::vector<int> batches, split_list;
    if (!int_list("KD_LT_SEARCH_BATCH", "1", 1, 16, &batches) ||
        !int_list("KD_LT_SEARCH_SPLITS", "1,2,4,8", 1, 16, &split_list))
        return 2;
    const int maxM = *std::max_element(Ms.begin(), Ms.end());
    const int maxB = *std::max_element(batches.begin(), batches.end());
    int ids[256], nids = 0;
    LT(cublasLtMatmulAlgoGetIds(lt, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_16BF, CUDA_R_16BF, CUDA_R_32F, CUDA_R_32F,
                                256, ids, &nids));
    printf("search: %d algorithm ids\n", nids);
    std::string md = "| product | N | K | M | cublasGemmEx us | Lt heuristic's first us | best found us | best / "
                     "cublasGemmEx | best, of copy bandwidth | best configuration | configurations timed |\n"
                     "|---|---|---|---|---|---|---|---|---|---|---|\n";
    char date[64];
    std::string json = bench_json_head(env.prop.name, date, argv[2], argv[3], copy_bw);
    /* an operator's table (kd/lt_table.h, KDECODE_CUDA_LT_TABLE) of the configurations found at least 2 %
     * faster than the heuristic's first: OUT.table */
    std::string table = bench_fmt("# cuBLASLt configurations found by KD_LT_SEARCH=1 gemm_lt_bench on %s (commit %s): "
                                  "at least 2 %% faster than the heuristic's first\n# N K m_lo m_hi id tile stages "
                                  "split_k reduction swizzle custom cluster inner\n",
                                  env.prop.name, argv[2]);
    bool first = true;
    int bad = 0;
    for (const BenchShape &sh : shapes) {
        BenchBuffers bb(sh, maxM, &g_rng);
        float *Cb = nullptr; /* the batches' partial sums */
        CK(cudaMalloc(&Cb, (size_t)maxB * maxM * sh.N * 4));
        for (int M : Ms)
        for (int nb : batches) {
            if (sh.K % nb || sh.K / nb % 64) continue;
            const std::string pn = nb > 1 ? bench_fmt("%s, K in %d", sh.name, nb) : std::string(sh.name);
            const char *pname = pn.c_str();
            float *const Cx = nb > 1 ? Cb : bb.C;
            const size_t csz = (size_t)nb * M * sh.N;
            const float alpha = 1.f, beta = 0.f;
            const LtProduct pr(sh.N, sh.K, M, nb);
            cublasLtMatmulDesc_t op = pr.op;
            cublasLtMatrixLayout_t lw = pr.lw, la = pr.la, lc = pr.lc;
            std::vector<float> ref((size_t)M * sh.N), got(csz), sum((size_t)M * sh.N);
            auto time_it = [&](auto launch, int reps) { return time_launches(st, bb, launch, reps); };
            auto gemmex = [&](const void *w, float *c) {
                LT(cublasGemmEx(env.blas, CUBLAS_OP_T, CUBLAS_OP_N, sh.N, M, sh.K, &alpha, w, CUDA_R_16BF, sh.K, bb.A,
                                CUDA_R_16BF, sh.K, &beta, c, CUDA_R_32F, sh.N, CUBLAS_COMPUTE_32F,
                                CUBLAS_GEMM_DEFAULT));
            };
            CK(cudaMemsetAsync(bb.Cref, 0xff, (size_t)M * sh.N * 4, st));
            gemmex(bb.W[0], bb.Cref);
            CK(cudaStreamSynchronize(st));
            CK(cudaMemcpy(ref.data(), bb.Cref, ref.size() * 4, cudaMemcpyDeviceToHost));
            /* a candidate: runs once into C (poisoned first), its output checked, then timed */
            auto try_cfg = [&](const LtCfg &c, int reps, double *us) {
                cublasLtMatmulAlgo_t a;
                cublasLtMatmulHeuristicResult_t chk;
                if (!lt_cfg_algo(lt, c, &a) || cublasLtMatmulAlgoCheck(lt, op, lw, la, lc, lc, &a, &chk) !=
                                                   CUBLAS_STATUS_SUCCESS ||
                    chk.workspaceSize > ws_bytes)
                    return false;
                auto run = [&](const void *w) {
                    return cublasLtMatmul(lt, op, &alpha, w, lw, bb.A, la, &beta, Cx, lc, Cx, lc, &a, env.ws,
                                          ws_bytes, st);
                };
                CK(cudaMemsetAsync(Cx, 0xff, csz * 4, st));
                if (run(bb.W[0]) != CUBLAS_STATUS_SUCCESS) return false;
                CK(cudaStreamSynchronize(st));
                CK(cudaMemcpy(got.data(), Cx, got.size() * 4, cudaMemcpyDeviceToHost));
                for (size_t i = 0; i < sum.size(); i++) {
                    float x = 0.f;
                    for (int b = 0; b < nb; b++) x += got[(size_t)b * sum.size() + i];
                    sum[i] = x;
                }
                double mx;
                const double err = bench_max_error(sum, ref, &mx);
                if (!(err <= 1e-4 * mx)) {
                    printf("MISMATCH %s M=%d %s: max error %.3g of %.3g\n", pname, M, lt_cfg_str(c).c_str(), err, mx);
                    bad++;
                    return false;
                }
                *us = time_it([&](const void *w) { LT(run(w)); }, reps);
                return true;
            };
            std::vector<std::pair<double, LtCfg>> timed;
            /* the heuristic's answers (up to 32): each timed as it is, and each one's algorithm id, inner shape
             * and cluster shape a family searched below beside every id's defaults (the Hopper kernels' ids run
             * only with the inner or cluster shape the heuristic gives them) */
            std::vector<cublasLtMatmulHeuristicResult_t> heur(32);
            int nheur = 0;
            {
                cublasLtMatmulPreference_t pref;
                LT(cublasLtMatmulPreferenceCreate(&pref));
                LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                                        sizeof ws_bytes));
                if (cublasLtMatmulAlgoGetHeuristic(lt, op, lw, la, lc, lc, pref, (int)heur.size(), heur.data(),
                                                   &nheur) != CUBLAS_STATUS_SUCCESS)
                    nheur = 0;
                cublasLtMatmulPreferenceDestroy(pref);
            }
            std::vector<LtCfg> families;
            auto add_family = [&](const LtCfg &f) {
                for (const LtCfg &g : families)
                    if (g.id == f.id && g.inner == f.inner && g.cluster == f.cluster) return;
                families.push_back(f);
            };
            for (int h = 0; h < nheur; h++) {
                const LtCfg c = lt_cfg_read(heur[h].algo);
                double us;
                if (h < 4) printf("search: %s M=%d heuristic #%d: %s\n", pname, M, h, lt_cfg_str(c).c_str());
                if (try_cfg(c, 3, &us)) timed.push_back({us, c});
                LtCfg f = {};
                f.id = c.id, f.inner = c.inner, f.cluster = c.cluster, f.stages = c.stages;
                add_family(f);
            }
            for (int i = 0; i < nids; i++) {
                LtCfg f = {};
                f.id = ids[i], f.stages = CUBLASLT_MATMUL_STAGES_UNDEFINED;
                add_family(f);
            }
            const size_t n_heur = timed.size();
            const std::vector<int> &splits = split_list;
            for (const LtCfg &fam : families) { /* (1) tiles x stages x K splits of each family */
                cublasLtMatmulAlgo_t a;
                if (cublasLtMatmulAlgoInit(lt, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_16BF, CUDA_R_16BF, CUDA_R_32F,
                                           CUDA_R_32F, fam.id, &a) != CUBLAS_STATUS_SUCCESS)
                    continue;
                std::vector<uint32_t> tiles = lt_cap_list(a, CUBLASLT_ALGO_CAP_TILE_IDS),
                                      stages = lt_cap_list(a, CUBLASLT_ALGO_CAP_STAGES_IDS);
                if (tiles.empty()) tiles.push_back(CUBLASLT_MATMUL_TILE_UNDEFINED);
                if (stages.empty()) stages.push_back(CUBLASLT_MATMUL_STAGES_UNDEFINED);
                /* where the algorithm has automatic stage counts (8xAUTO and up: the K step fixed, the count
                 * chosen by cuBLASLt), only those and the heuristic's: the fixed counts multiply the search for
                 * little */
                std::vector<uint32_t> autos;
                for (uint32_t sg : stages)
                    if (sg >= CUBLASLT_MATMUL_STAGES_8xAUTO && sg < CUBLASLT_MATMUL_STAGES_END) autos.push_back(sg);
                if (!autos.empty()) {
                    if (fam.stages != CUBLASLT_MATMUL_STAGES_UNDEFINED &&
                        std::find(autos.begin(), autos.end(), fam.stages) == autos.end())
                        autos.push_back(fam.stages);
                    stages = autos;
                }
                const size_t before = timed.size();
                const int32_t splitk_ok = lt_cap<int32_t>(a, CUBLASLT_ALGO_CAP_SPLITK_SUPPORT);
                const uint32_t red_mask = lt_cap<uint32_t>(a, CUBLASLT_ALGO_CAP_REDUCTION_SCHEME_MASK);
                for (uint32_t t : tiles)
                    for (uint32_t sg : stages)
                        for (int32_t sk : splits) {
                            if (sk > 1 && !splitk_ok) continue;
                            LtCfg c = {fam.id, t, sg, sk, CUBLASLT_REDUCTION_SCHEME_NONE, 0, 0, fam.cluster, fam.inner};
                            const uint32_t reds[] = {CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE,
                                                     CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE,
                                                     CUBLASLT_REDUCTION_SCHEME_INPLACE};
                            double us;
                            if (sk == 1) {
                                if (try_cfg(c, 3, &us)) timed.push_back({us, c});
                                continue;
                            }
                            for (uint32_t r : reds) {
                                if (!(red_mask & r)) continue;
                                c.reduction = r;
                                if (try_cfg(c, 3, &us)) {
                                    timed.push_back({us, c});
                                    break;
                                }
                            }
                        }
                if (timed.size() > before)
                    printf("search: %s M=%d id %d inner %u cluster %u: %zu tiles x %zu stages, %zu ran\n", pname, M,
                           fam.id, (unsigned)fam.inner, (unsigned)fam.cluster, tiles.size(), stages.size(),
                           timed.size() - before);
            }
            printf("search: %s M=%d: %d heuristic answers (%zu ran), %zu families\n", pname, M, nheur, n_heur,
                   families.size());
            const size_t n1 = timed.size();
            std::sort(timed.begin(), timed.end(), [](const auto &x, const auto &y) { return x.first < y.first; });
            const size_t top = std::min<size_t>(8, timed.size());
            for (size_t k = 0; k < top; k++) { /* (2) cluster shapes x swizzling x custom options of the 8 fastest */
                const LtCfg base = timed[k].second;
                cublasLtMatmulAlgo_t a;
                if (!lt_cfg_algo(lt, base, &a)) continue;
                const uint32_t swz_ok = lt_cap<uint32_t>(a, CUBLASLT_ALGO_CAP_CTA_SWIZZLING_SUPPORT);
                const int32_t cmax = std::min<int32_t>(7, lt_cap<int32_t>(a, CUBLASLT_ALGO_CAP_CUSTOM_OPTION_MAX));
                for (uint16_t cl = CUBLASLT_CLUSTER_SHAPE_AUTO; cl <= CUBLASLT_CLUSTER_SHAPE_4x4x1; cl++)
                    for (uint32_t sw = 0; sw <= (swz_ok ? 1u : 0u); sw++)
                        for (int32_t cu = 0; cu <= cmax; cu++) {
                            LtCfg c = base;
                            c.cluster = cl, c.swizzle = sw, c.custom = (uint32_t)cu;
                            if (cl == base.cluster && sw == base.swizzle && (uint32_t)cu == base.custom) continue;
                            double us;
                            if (try_cfg(c, 3, &us)) timed.push_back({us, c});
                        }
            }
            std::sort(timed.begin(), timed.end(), [](const auto &x, const auto &y) { return x.first < y.first; });
            /* (3) the 5 fastest again, as the main table times, beside cublasGemmEx and the heuristic's first */
            const double ex_us = time_it([&](const void *w) { gemmex(w, bb.C); }, 15);
            double h_us = -1;
            if (nheur > 0)
                h_us = time_it(
                    [&](const void *w) {
                        LT(cublasLtMatmul(lt, op, &alpha, w, lw, bb.A, la, &beta, Cx, lc, Cx, lc, &heur[0].algo,
                                          env.ws, ws_bytes, st));
                    },
                    15);
            double best = 1e30;
            LtCfg best_c = {};
            for (size_t k = 0; k < std::min<size_t>(5, timed.size()); k++) {
                double us;
                if (try_cfg(timed[k].second, 15, &us)) {
                    printf("search: %s M=%d %8.2f us (screened %8.2f)  %s\n", pname, M, us, timed[k].first,
                           lt_cfg_str(timed[k].second).c_str());
                    if (us < best) best = us, best_c = timed[k].second;
                }
            }
            printf("search: %-18s N=%6d K=%5d M=%3d gemmEx %8.2f us, Lt first %8.2f, best %8.2f (%s); %zu timed (%zu "
                   "in the first pass)\n",
                   pname, sh.N, sh.K, M, ex_us, h_us, best, best < 1e30 ? lt_cfg_str(best_c).c_str() : "-",
                   timed.size(), n1);
            fflush(stdout);
            const bool found = best < 1e30;
            if (found && nb == 1 && h_us > 0 && best <= 0.98 * h_us)
                table += bench_fmt("%d %d %d %d %d %u %u %d %u %u %u %u %u  # %s: %.2f -> %.2f us\n", sh.N, sh.K, M, M,
                                   best_c.id, best_c.tile, best_c.stages, best_c.split_k, best_c.reduction,
                                   best_c.swizzle, best_c.custom, (unsigned)best_c.cluster, (unsigned)best_c.inner,
                                   sh.name, h_us, best);
            md += bench_fmt("| %s | %d | %d | %d | %.2f | %.2f | %s | %s | %s | %s | %zu |\n",
                            bench_md_cell(pname).c_str(), sh.N, sh.K, M, ex_us, h_us,
                            found ? bench_fmt("%.2f", best).c_str() : "-",
                            found ? bench_fmt("%.2f", best / ex_us).c_str() : "-",
                            found ? bench_fmt("%.0f %%", 100.0 * bb.wbytes / (best * 1e-6) / copy_bw).c_str() : "-",
                            found ? lt_cfg_str(best_c).c_str() : "-", timed.size());
            json += bench_fmt("%s    {\"product\": \"%s\", \"N\": %d, \"K\": %d, \"M\": %d, \"gemmex_us\": %.3f, "
                              "\"lt_first_us\": %.3f, \"best_us\": %.3f, \"best_config\": \"%s\", \"timed\": %zu}",
                              first ? "" : ",\n", pname, sh.N, sh.K, M, ex_us, h_us, found ? best : -1.0,
                              found ? lt_cfg_str(best_c).c_str() : "-", timed.size());
            first = false;
        }
        cudaFree(Cb);
    }
    json += "\n  ]\n}\n";
    const std::string intro = bench_fmt(
        "bf16 weights [N][K] and activations [M][K], fp32 output, beta 0; a CUDA graph of launches, each on its own "
        "copy of the weights (more than 4 x the L2), per launch. Copy floor in the same run: %.0f GB/s (read + "
        "write). Searched (KD_LT_SEARCH=1): the heuristic's answers (up to 32), then for each algorithm id "
        "with the inner and cluster shape of each answer, and with the defaults, its tiles x stages (its "
        "automatic stage counts where it has any) x K split (KD_LT_SEARCH_SPLITS, default 1 / 2 / 4 / 8; 3 replays "
        "each), then cluster shapes "
        "x CTA swizzling x custom options of the 8 fastest; the 5 fastest "
        "timed again with 15 replays (median) beside cublasGemmEx and the heuristic's first algorithm. Every "
        "candidate's output checked against cublasGemmEx's first.\n\n",
        copy_bw / 1e9);
    const bool wrote = bench_write_results(argv, env.prop.name, date,
                                           "cuBLASLt configurations searched for the 48B preset's products", intro,
                                           json, md);
    const std::string tpath = std::string(argv[1]) + ".table";
    FILE *tf = fopen(tpath.c_str(), "w");
    bool twrote = false;
    if (tf) {
        twrote = fputs(table.c_str(), tf) >= 0;
        twrote = fclose(tf) == 0 && twrote;
    }
    if (!twrote) fprintf(stderr, "%s: could not write\n", tpath.c_str());
    if (twrote) { /* read back as the backend reads it */
        kd_lt_entry *tab = nullptr;
        kd_err te = {{0}};
        const int n = kd_lt_table_load(tpath.c_str(), &tab, &te);
        printf("search: %s: %d entries%s%s\n", tpath.c_str(), n, n < 0 ? ", refused: " : "", n < 0 ? te.msg : "");
        free(tab);
        twrote = n >= 0;
    }
    printf(bad ? "GEMM LT SEARCH: %d MISMATCHES\n" : "GEMM LT SEARCH DONE\n", bad);
    return bad || !wrote || !twrote ? 1 : 0;
}

int main(int argc, char **argv) {
    const size_t ws_bytes = KD_LT_WORKSPACE;
    BenchEnv env;
    if (const int rc = bench_open(argc, argv, ws_bytes, &env); rc >= 0) return rc;
    const cudaDeviceProp &prop = env.prop;
    const cudaStream_t st = env.st;
    const cublasHandle_t blas = env.blas;
    void *const ws = env.ws;
    cublasLtHandle_t lt;
    LT(cublasLtCreate(&lt));
    kd_cu_lt *pick = nullptr;
    if (kd_cu_lt_create(&pick) != cudaSuccess) return printf("kd_cu_lt_create failed\n"), 1;

    const double copy_bw = bench_copy_bandwidth(st); /* the copy floor */
    printf("device: %s; copy floor %.0f GB/s (read + write)\n", prop.name, copy_bw / 1e9);
    if (getenv("KD_LT_SEARCH")) {
        const int rc = lt_search(env, lt, copy_bw, argc, argv);
        kd_cu_lt_destroy(pick);
        cublasLtDestroy(lt);
        bench_close(&env);
        return rc;
    }

    const int Ms[] = {2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512};
    const int maxM = 512;
    std::string md = "| product | N | K | M | cublasGemmEx us | GB/s | Lt heuristic's first us | best us | best / "
                     "cublasGemmEx | best, of copy bandwidth | best candidate | backend's pick us | pick / "
                     "cublasGemmEx |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
    char date[64];
    std::string json = bench_json_head(prop.name, date, argv[2], argv[3], copy_bw);
    char buf[4096];
    bool first = true;
    int bad = 0;
    for (const BenchShape &sh : kPresetProducts) {
        BenchBuffers bb(sh, maxM, &g_rng);
        const size_t wbytes = bb.wbytes;
        const std::vector<void *> &W = bb.W;
        void *const A = bb.A;
        float *const C = bb.C, *const Cref = bb.Cref;
        for (int M : Ms) {
            const float alpha = 1.f, beta = 0.f;
            const LtProduct pr(sh.N, sh.K, M);
            cublasLtMatmulDesc_t op = pr.op;
            cublasLtMatrixLayout_t lw = pr.lw, la = pr.la, lc = pr.lc;
            cublasLtMatmulPreference_t pref;
            LT(cublasLtMatmulPreferenceCreate(&pref));
            LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                                    sizeof ws_bytes));
            cublasLtMatmulHeuristicResult_t res[32];
            int nres = 0;
            LT(cublasLtMatmulAlgoGetHeuristic(lt, op, lw, la, lc, lc, pref, 32, res, &nres));
            std::vector<Cand> cands;
            for (int i = 0; i < nres; i++) {
                char l[32];
                snprintf(l, sizeof l, "rank %d", i);
                cands.push_back({res[i].algo, l});
            }
            for (int i = 0; i < std::min(nres, 4); i++) {
                const int splits[] = {2, 3, 4, 6, 8, 12, 16};
                for (int sk : splits) {
                    cublasLtMatmulAlgo_t a = res[i].algo;
                    const uint32_t red = CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE;
                    if (cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &sk, sizeof sk) !=
                            CUBLAS_STATUS_SUCCESS ||
                        cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &red,
                                                             sizeof red) != CUBLAS_STATUS_SUCCESS)
                        continue;
                    cublasLtMatmulHeuristicResult_t chk;
                    if (cublasLtMatmulAlgoCheck(lt, op, lw, la, lc, lc, &a, &chk) != CUBLAS_STATUS_SUCCESS ||
                        chk.workspaceSize > ws_bytes)
                        continue;
                    char l[48];
                    snprintf(l, sizeof l, "rank %d split-K %d", i, sk);
                    cands.push_back({a, l});
                }
            }
            std::vector<float> ref((size_t)M * sh.N), got((size_t)M * sh.N);
            auto check = [&](const char *what) {
                CK(cudaMemcpy(got.data(), C, got.size() * 4, cudaMemcpyDeviceToHost));
                double mx;
                const double err = bench_max_error(got, ref, &mx);
                if (!(err <= 1e-4 * mx)) {
                    printf("MISMATCH %s M=%d %s: max error %.3g of %.3g\n", sh.name, M, what, err, mx);
                    bad++;
                    return false;
                }
                return true;
            };
            auto time_it = [&](auto launch) { return time_launches(st, bb, launch, 15); };
            // cublasGemmEx, the reference output and the baseline
            auto gemmex = [&](const void *w, float *c) {
                LT(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, sh.N, M, sh.K, &alpha, w, CUDA_R_16BF, sh.K, A,
                                CUDA_R_16BF, sh.K, &beta, c, CUDA_R_32F, sh.N, CUBLAS_COMPUTE_32F,
                                CUBLAS_GEMM_DEFAULT));
            };
            CK(cudaMemsetAsync(Cref, 0xff, (size_t)M * sh.N * 4, st));
            gemmex(W[0], Cref);
            CK(cudaStreamSynchronize(st));
            CK(cudaMemcpy(ref.data(), Cref, ref.size() * 4, cudaMemcpyDeviceToHost));
            const double ex_us = time_it([&](const void *w) { gemmex(w, C); });
            double best = 1e30, first_us = -1;
            std::string best_label = "-", best_cfg;
            for (size_t c = 0; c < cands.size(); c++) {
                auto run = [&](const void *w) {
                    return cublasLtMatmul(lt, op, &alpha, w, lw, A, la, &beta, C, lc, C, lc, &cands[c].algo, ws,
                                          ws_bytes, st);
                };
                CK(cudaMemsetAsync(C, 0xff, (size_t)M * sh.N * 4, st));
                if (run(W[0]) != CUBLAS_STATUS_SUCCESS) {
                    printf("  %s M=%d %s: refused\n", sh.name, M, cands[c].label.c_str());
                    continue;
                }
                CK(cudaStreamSynchronize(st));
                if (!check(cands[c].label.c_str())) continue;
                const double us = time_it([&](const void *w) { LT(run(w)); });
                if (c == 0) first_us = us;
                printf("  %s M=%d %-22s %8.2f us  %s\n", sh.name, M, cands[c].label.c_str(), us,
                       algo_str(cands[c].algo).c_str());
                if (us < best) best = us, best_label = cands[c].label, best_cfg = algo_str(cands[c].algo);
            }
            // the backend's pick (kd_cu_lt_gemm), as the backend calls it
            double pick_us = -1;
            {
                auto run = [&](const void *w) {
                    return kd_cu_lt_gemm(pick, M, sh.N, sh.K, (const __nv_bfloat16 *)A, sh.K,
                                         (const __nv_bfloat16 *)w, sh.K, 0.f, C, sh.N, ws, ws_bytes, st);
                };
                CK(cudaMemsetAsync(C, 0xff, (size_t)M * sh.N * 4, st));
                const cublasStatus_t s = run(W[0]);
                if (s == CUBLAS_STATUS_SUCCESS) {
                    CK(cudaStreamSynchronize(st));
                    if (check("the backend's pick"))
                        pick_us = time_it([&](const void *w) { LT(run(w)); });
                } else {
                    printf("MISMATCH %s M=%d: kd_cu_lt_gemm: %s\n", sh.name, M, cublasGetStatusString(s));
                    bad++;
                }
            }
            const double gbs = wbytes / (ex_us * 1e-6) / 1e9;
            const std::string cell = bench_md_cell(sh.name);
            snprintf(buf, sizeof buf,
                     "| %s | %d | %d | %d | %.2f | %.0f | %.2f | %.2f | %.2f | %.0f %% | %s (%s) | %.2f | %.2f |\n",
                     cell.c_str(), sh.N, sh.K, M, ex_us, gbs, first_us, best, best / ex_us,
                     100.0 * wbytes / (best * 1e-6) / copy_bw, best_label.c_str(), best_cfg.c_str(), pick_us,
                     pick_us / ex_us);
            md += buf;
            printf("%-20s N=%6d K=%5d M=%3d gemmEx %8.2f us (%5.0f GB/s) Lt first %8.2f best %8.2f (%s; %s) "
                   "pick %8.2f; %d candidates\n",
                   sh.name, sh.N, sh.K, M, ex_us, gbs, first_us, best, best_label.c_str(), best_cfg.c_str(), pick_us,
                   (int)cands.size());
            snprintf(buf, sizeof buf,
                     "%s    {\"product\": \"%s\", \"N\": %d, \"K\": %d, \"M\": %d, \"gemmex_us\": %.3f, "
                     "\"lt_first_us\": %.3f, \"best_us\": %.3f, \"best\": \"%s\", \"best_config\": \"%s\", "
                     "\"pick_us\": %.3f, \"candidates\": %d}",
                     first ? "" : ",\n", sh.name, sh.N, sh.K, M, ex_us, first_us, best, best_label.c_str(),
                     best_cfg.c_str(), pick_us, (int)cands.size());
            json += buf;
            first = false;
            cublasLtMatmulPreferenceDestroy(pref);
        }
    }
    json += "\n  ]\n}\n";
    const std::string intro = bench_fmt(
        "bf16 weights [N][K] and activations [M][K], fp32 output, beta 0; a CUDA graph of launches, each on its own "
        "copy of the weights (more than 4 x the L2), median of 15 replays, per launch. Copy floor in the same run: "
        "%.0f GB/s (read + write). Candidates: cuBLASLt's heuristic list (up to 32, 32 MiB of workspace) and its "
        "first 4 with K split 2-16 ways; best: the fastest of them; the backend's pick: kd_cu_lt_gemm "
        "(gemm_lt.cuh).\n\n",
        copy_bw / 1e9);
    const bool wrote = bench_write_results(argv, prop.name, date,
                                           "cuBLASLt algorithms for the 48B preset's products at 2-512 rows", intro,
                                           json, md);
    kd_cu_lt_destroy(pick);
    cublasLtDestroy(lt);
    bench_close(&env);
    printf(bad ? "GEMM LT BENCH: %d MISMATCHES\n" : "GEMM LT BENCH DONE\n", bad);
    return bad || !wrote ? 1 : 0;
}
