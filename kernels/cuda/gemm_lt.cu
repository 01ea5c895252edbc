// gemm_lt.cu: cuBLASLt products with an algorithm chosen per shape (gemm_lt.cuh).
#include "kernels/cuda/gemm_lt.cuh"

#include <stdlib.h>
#include <string.h>

namespace {

struct Plan {
    int64_t M, N, K, lda, ldw, ldc; // K: of one slice where nb > 1
    int nb;                         // 1, or a batch of nb K slices (kd_cu_lt_gemm_split)
    int c16;                        // C in bf16 (kd_cu_lt_gemm_bf16), else fp32
    size_t ws_bytes;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t lw, la, lc;
    cublasLtMatmulAlgo_t algo;
    int picked; // the algorithm is the table's choice
};

// A configuration of cuBLASLt's Hopper algorithm (id 66, automatic stage count 35) with the
// tile, custom option, cluster shape and K split found (a split's partial sums reduced through
// the workspace, in the compute type (reduction 2) or the output type (4): both fp32 here, and
// deterministic).
constexpr kd_lt_config hopper(uint32_t tile, uint32_t custom, uint16_t cluster, int32_t split_k = 1,
                              uint32_t reduction = 2) {
    return {66, tile, 35, split_k, split_k > 1 ? reduction : 0u, 0, custom, cluster, 0};
}

// Measured on the H200 (tests/bench/gemm_lt_bench.cu; 32 MiB of workspace): the 48B preset's
// shapes where a choice ran faster than the heuristic's first, at the row counts measured (a
// range only where the same choice won at every row count measured in it). A step's products
// have rows x window rows (graphs pad the rows to a power of two): 2^k and 3 x 2^k are
// measured. From the main table (results/gemm_lt_h200.md): where a candidate of the
// heuristic's list of 32 (or one of its first 4 with K split) ran at least 4 % faster (the
// run-to-run spread is up to about 3 %): o_proj 2-8 and the head, the candidate's configuration
// as that table prints it (the down projection at 2-4 rows, K split 16 ways, was 4 % faster at
// c11b690 and 5 % slower at b7c7e08, where a split of 8 was the best: left out; at 2-4 rows the
// step runs the skinny kernel's forms, not cuBLAS). From the search (results/gemm_lt_search_h200.md,
// KD_LT_SEARCH=1: every configuration cuBLASLt accepts, the 5 fastest re-timed beside the
// heuristic's first in the same process): at least 2 % faster there, and re-timed by the main
// table's pick column (gate|up at 64 rows, 2 % faster in the search, was 3 % slower there at
// c11b690: left out). The figures: the heuristic's first -> this choice, us. The head runs in
// chunks of at most 256 rows (cuda_backend.cu).
const kd_lt_entry kPicks[] = {
    {2304, 4096, 2, 8, hopper(448, 1, 4, 8, 4)}, // o_proj: 9.24 -> 8.75 at 2 rows, 9.14 -> 8.80 at 4, 9.18 -> 8.83 at 8
    {2304, 4096, 12, 12, hopper(183, 4, 4, 4)}, // 9.25 -> 8.95
    {2304, 4096, 24, 24, hopper(183, 4, 4, 4)}, // 9.35 -> 9.02
    {2304, 4096, 32, 32, hopper(12, 2, 4)},     // 9.44 -> 9.10
    {2304, 4096, 48, 48, hopper(312, 1, 2)},    // 9.68 -> 8.66
    {2304, 4096, 64, 64, hopper(59, 0, 2)},     // 9.25 -> 8.70
    {2304, 4096, 96, 96, hopper(92, 0, 7)},     // 11.03 -> 9.51
    {2304, 4096, 128, 128, hopper(92, 0, 2)},   // 9.79 -> 9.14
    {2304, 4096, 192, 192, hopper(15, 0, 2)},   // 11.96 -> 9.72
    {2304, 4096, 256, 256, hopper(124, 0, 2)},  // 11.24 -> 10.09
    {2304, 4096, 384, 384, hopper(18, 0, 3)},   // 18.24 -> 13.17
    {2304, 4096, 512, 512, hopper(125, 4, 2)},  // 15.88 -> 14.86
    {2304, 9216, 128, 128, hopper(80, 0, 2)},   // down_proj: 19.05 -> 16.88
    {2304, 9216, 192, 192, hopper(15, 0, 2)},   // 19.94 -> 18.96
    {2304, 9216, 256, 256, hopper(124, 0, 2)},  // 25.67 -> 19.84
    {2304, 9216, 384, 384, hopper(105, 0, 2)},  // 34.20 -> 27.09
    {2304, 9216, 512, 512, hopper(125, 0, 2)},  // 32.35 -> 30.43
    {12576, 2304, 8, 16, hopper(448, 1, 2)},    // input projection: 17.70 -> 17.10 at 8, 17.68 -> 17.10 at 12,
                                                // 17.78 -> 16.99 at 16
    {12576, 2304, 24, 24, hopper(183, 4, 4)},   // 18.09 -> 17.38
    {12576, 2304, 32, 32, hopper(449, 1, 2)},   // 18.37 -> 17.59
    {12576, 2304, 48, 48, hopper(450, 1, 2)},   // 18.64 -> 17.68
    {12576, 2304, 64, 64, hopper(104, 0, 4)},   // 18.86 -> 17.71
    {12576, 2304, 128, 128, hopper(27, 0, 2)},  // 19.93 -> 18.76
    {12576, 2304, 192, 192, hopper(183, 0, 2)}, // 22.09 -> 21.40
    {12576, 2304, 384, 384, hopper(184, 0, 2)}, // 33.06 -> 32.04
    {12576, 2304, 512, 512, hopper(20, 1, 5)},  // 43.21 -> 42.32
    {18432, 2304, 8, 8, hopper(486, 7, 2)},     // gate|up: 24.34 -> 23.40
    {18432, 2304, 12, 12, hopper(487, 3, 2)},   // 24.68 -> 23.58
    {18432, 2304, 16, 16, hopper(487, 7, 2)},   // 24.71 -> 23.89
    {18432, 2304, 24, 24, hopper(193, 6, 2)},   // 24.81 -> 23.82
    {18432, 2304, 32, 32, hopper(220, 4, 4)},   // 25.39 -> 24.67
    {18432, 2304, 48, 48, hopper(183, 6, 2)},   // 26.33 -> 24.44
    {18432, 2304, 128, 128, hopper(183, 0, 2)}, // 27.86 -> 26.68
    {18432, 2304, 192, 192, hopper(217, 0, 2)}, // 36.65 -> 30.22
    {18432, 2304, 512, 512, hopper(184, 2, 5)}, // 64.24 -> 60.27
    {163840, 2304, 64, 64, hopper(18, 1, 3)},   // head: 202.4 -> 190.2
    {163840, 2304, 128, 128, hopper(20, 1, 3)}, // 224.7 -> 206.9
    {163840, 2304, 256, 256, hopper(197, 2, 5)}, // 300.0 -> 273.9
};
const int kNumPicks = (int)(sizeof kPicks / sizeof kPicks[0]);

void plan_free(Plan *p) {
    if (p->lc) cublasLtMatrixLayoutDestroy(p->lc);
    if (p->la) cublasLtMatrixLayoutDestroy(p->la);
    if (p->lw) cublasLtMatrixLayoutDestroy(p->lw);
    if (p->op) cublasLtMatmulDescDestroy(p->op);
    memset(p, 0, sizeof *p);
}

} // namespace

struct kd_cu_lt {
    cublasLtHandle_t h;
    int on;       // a table is used (kd_cu_lt_set_table)
    int table_ok; // the device is of the kind the built-in table was measured on
    int user_set; // an operator's table (kd_cu_lt_use_table) replaces the built-in one
    kd_lt_entry *user;
    int n_user;
    Plan plans[KD_LT_PLANS];
    int n, next; // plans held; the one replaced next when all are held
};

cudaError_t kd_cu_lt_create(kd_cu_lt **out) {
    *out = nullptr;
    int dev = 0, major = 0, minor = 0, sms = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (e != cudaSuccess) return e;
    kd_cu_lt *lt = (kd_cu_lt *)calloc(1, sizeof *lt);
    if (!lt) return cudaErrorMemoryAllocation;
    if (cublasLtCreate(&lt->h) != CUBLAS_STATUS_SUCCESS) {
        free(lt);
        return cudaErrorInitializationError;
    }
    lt->table_ok = major == 9 && minor == 0 && sms >= 132;
    lt->on = 1;
    *out = lt;
    return cudaSuccess;
}

static void drop_plans(kd_cu_lt *lt) {
    for (int i = 0; i < lt->n; i++) plan_free(&lt->plans[i]);
    lt->n = lt->next = 0;
}

void kd_cu_lt_destroy(kd_cu_lt *lt) {
    if (!lt) return;
    drop_plans(lt);
    cublasLtDestroy(lt->h);
    free(lt->user);
    free(lt);
}

void kd_cu_lt_set_table(kd_cu_lt *lt, int on) {
    if (!lt || lt->on == !!on) return;
    lt->on = !!on;
    drop_plans(lt);
}

cudaError_t kd_cu_lt_use_table(kd_cu_lt *lt, const kd_lt_entry *tab, int n) {
    if (!lt || n < 0 || (n > 0 && !tab)) return cudaErrorInvalidValue;
    kd_lt_entry *copy = nullptr;
    if (n > 0) {
        copy = (kd_lt_entry *)malloc(sizeof *copy * (size_t)n);
        if (!copy) return cudaErrorMemoryAllocation;
        memcpy(copy, tab, sizeof *copy * (size_t)n);
    }
    free(lt->user);
    lt->user = copy, lt->n_user = n, lt->user_set = 1;
    drop_plans(lt);
    return cudaSuccess;
}

int kd_cu_lt_table(const kd_lt_entry **out) {
    *out = kPicks;
    return kNumPicks;
}

int kd_cu_lt_config_algo(cublasLtHandle_t h, const kd_lt_config *cp, cublasLtMatmulAlgo_t *a) {
    const kd_lt_config &c = *cp;
    if (cublasLtMatmulAlgoInit(h, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_16BF, CUDA_R_16BF, CUDA_R_32F, CUDA_R_32F,
                               c.id, a) != CUBLAS_STATUS_SUCCESS)
        return 0;
    const struct {
        cublasLtMatmulAlgoConfigAttributes_t at;
        const void *v;
        size_t n;
    } set[] = {{CUBLASLT_ALGO_CONFIG_TILE_ID, &c.tile, sizeof c.tile},
               {CUBLASLT_ALGO_CONFIG_STAGES_ID, &c.stages, sizeof c.stages},
               {CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &c.split_k, sizeof c.split_k},
               {CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &c.reduction, sizeof c.reduction},
               {CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &c.swizzle, sizeof c.swizzle},
               {CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, &c.custom, sizeof c.custom},
               {CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &c.cluster, sizeof c.cluster},
               {CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID, &c.inner, sizeof c.inner}};
    for (const auto &x : set)
        if (cublasLtMatmulAlgoConfigSetAttribute(a, x.at, x.v, x.n) != CUBLAS_STATUS_SUCCESS) return 0;
    return 1;
}

void kd_cu_lt_stats(const kd_cu_lt *lt, int *plans, int *picked) {
    int n = 0, k = 0;
    if (lt)
        for (int i = 0; i < lt->n; i++)
            if (lt->plans[i].op) n++, k += lt->plans[i].picked;
    if (plans) *plans = n;
    if (picked) *picked = k;
}

namespace {

// A new plan for the shape in *p (its key set): descriptors, then the algorithm.
cublasStatus_t plan_make(kd_cu_lt *lt, Plan *p) {
    cublasStatus_t s = cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    const cublasOperation_t tr = CUBLAS_OP_T, nt = CUBLAS_OP_N;
    // column-major terms: C^T (N x M, ld ldc) = op(W) A^T, W^T of a K x N matrix (ld ldw), A^T a
    // K x M matrix (ld lda)
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &tr, sizeof tr);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &nt, sizeof nt);
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatrixLayoutCreate(&p->lw, CUDA_R_16BF, p->K, p->N, p->ldw);
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatrixLayoutCreate(&p->la, CUDA_R_16BF, p->K, p->M, p->lda);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatrixLayoutCreate(&p->lc, p->c16 ? CUDA_R_16BF : CUDA_R_32F, p->N, p->M, p->ldc);
    if (p->nb > 1) { /* slice b: W and A from key b K, C the b-th [M][N] block */
        const int32_t cnt = p->nb;
        const int64_t ko = p->K, co = p->N * p->M;
        const cublasLtMatrixLayout_t ls[] = {p->lw, p->la, p->lc};
        for (int i = 0; i < 3 && s == CUBLAS_STATUS_SUCCESS; i++) {
            const int64_t off = i == 2 ? co : ko;
            s = cublasLtMatrixLayoutSetAttribute(ls[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &cnt, sizeof cnt);
            if (s == CUBLAS_STATUS_SUCCESS)
                s = cublasLtMatrixLayoutSetAttribute(ls[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &off,
                                                     sizeof off);
        }
    }
    cublasLtMatmulPreference_t pref = nullptr;
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatmulPreferenceCreate(&pref);
    const size_t ws = p->ws_bytes;
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    const kd_lt_entry *hit = !lt->on || p->nb > 1 || p->c16 ? nullptr
                             : lt->user_set ? kd_lt_table_find(lt->user, lt->n_user, p->M, p->N, p->K)
                             : lt->table_ok ? kd_lt_table_find(kPicks, kNumPicks, p->M, p->N, p->K)
                                            : nullptr;
    cublasLtMatmulHeuristicResult_t res;
    int nres = 0;
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulAlgoGetHeuristic(lt->h, p->op, p->lw, p->la, p->lc, p->lc, pref, 1, &res, &nres);
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (s == CUBLAS_STATUS_SUCCESS && nres < 1) s = CUBLAS_STATUS_NOT_SUPPORTED;
    if (s != CUBLAS_STATUS_SUCCESS) return s;
    p->algo = res.algo;
    cublasLtMatmulAlgo_t a;
    int ok = hit && kd_cu_lt_config_algo(lt->h, &hit->c, &a);
    if (ok) { /* cuBLASLt accepts it for these descriptors within the workspace given */
        cublasLtMatmulHeuristicResult_t chk;
        ok = cublasLtMatmulAlgoCheck(lt->h, p->op, p->lw, p->la, p->lc, p->lc, &a, &chk) == CUBLAS_STATUS_SUCCESS &&
             chk.workspaceSize <= ws;
    }
    if (ok) p->algo = a, p->picked = 1;
    return CUBLAS_STATUS_SUCCESS;
}

// The plan of a product (made on its first use), or nullptr with *st set.
Plan *plan_for(kd_cu_lt *lt, int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldw, int64_t ldc, int nb,
               int c16, size_t ws_bytes, cublasStatus_t *st) {
    for (int i = 0; i < lt->n; i++) {
        Plan *q = &lt->plans[i];
        if (q->M == M && q->N == N && q->K == K && q->lda == lda && q->ldw == ldw && q->ldc == ldc && q->nb == nb &&
            q->c16 == c16 && q->ws_bytes == ws_bytes)
            return q;
    }
    const bool appended = lt->n < KD_LT_PLANS;
    Plan *p;
    if (appended) p = &lt->plans[lt->n++];
    else p = &lt->plans[lt->next], lt->next = (lt->next + 1) % KD_LT_PLANS, plan_free(p);
    p->M = M, p->N = N, p->K = K, p->lda = lda, p->ldw = ldw, p->ldc = ldc, p->nb = nb, p->c16 = c16;
    p->ws_bytes = ws_bytes;
    *st = plan_make(lt, p);
    if (*st != CUBLAS_STATUS_SUCCESS) {
        plan_free(p); // not kept: an empty slot (M = 0 matches no product) or none taken
        if (appended) lt->n--;
        return nullptr;
    }
    return p;
}

// A product of a plan (made on its first use): C = A W^T + beta C, nb K slices (C the nb blocks), C in bf16
// where c16.
cublasStatus_t lt_run(kd_cu_lt *lt, int64_t M, int64_t N, int64_t K, const __nv_bfloat16 *A, int64_t lda,
                      const __nv_bfloat16 *W, int64_t ldw, int nb, int c16, float beta, void *C, int64_t ldc, void *ws,
                      size_t ws_bytes, cudaStream_t s) {
    const int64_t big = (int64_t)1 << 31;
    if (!lt || !A || !W || !C || M < 1 || N < 1 || K < 1 || M >= big || N >= big || K >= big || lda < K ||
        ldw < K || ldc < N || lda >= big || ldw >= big || ldc >= big || nb < 1 || nb > KD_LT_MAX_SLICES ||
        K % nb || (nb > 1 && (K / nb % 8 || ldc != N)))
        return CUBLAS_STATUS_INVALID_VALUE;
    cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
    const Plan *p = plan_for(lt, M, N, K / nb, lda, ldw, ldc, nb, c16, ws_bytes, &st);
    if (!p) return st;
    const float alpha = 1.f;
    return cublasLtMatmul(lt->h, p->op, &alpha, W, p->lw, A, p->la, &beta, C, p->lc, C, p->lc, &p->algo, ws, ws_bytes,
                          s);
}

} // namespace

cublasStatus_t kd_cu_lt_gemm(kd_cu_lt *lt, int64_t M, int64_t N, int64_t K, const __nv_bfloat16 *A, int64_t lda,
                             const __nv_bfloat16 *W, int64_t ldw, float beta, float *C, int64_t ldc, void *ws,
                             size_t ws_bytes, cudaStream_t s) {
    return lt_run(lt, M, N, K, A, lda, W, ldw, 1, 0, beta, C, ldc, ws, ws_bytes, s);
}

cublasStatus_t kd_cu_lt_gemm_split(kd_cu_lt *lt, int64_t M, int64_t N, int64_t K, const __nv_bfloat16 *A, int64_t lda,
                                   const __nv_bfloat16 *W, int64_t ldw, int nb, float *C, void *ws, size_t ws_bytes,
                                   cudaStream_t s) {
    if (nb < 2) return CUBLAS_STATUS_INVALID_VALUE;
    return lt_run(lt, M, N, K, A, lda, W, ldw, nb, 0, 0.f, C, N, ws, ws_bytes, s);
}

cublasStatus_t kd_cu_lt_gemm_bf16(kd_cu_lt *lt, int64_t M, int64_t N, int64_t K, const __nv_bfloat16 *A, int64_t lda,
                                  const __nv_bfloat16 *W, int64_t ldw, __nv_bfloat16 *C, int64_t ldc, void *ws,
                                  size_t ws_bytes, cudaStream_t s) {
    return lt_run(lt, M, N, K, A, lda, W, ldw, 1, 1, 0.f, C, ldc, ws, ws_bytes, s);
}
