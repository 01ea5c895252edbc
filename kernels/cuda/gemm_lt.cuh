// gemm_lt.cuh: the bf16 matrix products of the CUDA backend that its skinny kernel (gemv.cuh)
// does not take, through cuBLASLt with an algorithm chosen per shape.
//
// C[M][N] = A[M][K] W[N][K]^T + beta C (row-major, leading dimensions given), A and W bf16, C
// fp32, fp32 accumulation. cublasGemmEx runs as fast as the first algorithm of cuBLASLt's
// heuristic for the shape (at every shape measured); at the decode step's row counts (tens to
// hundreds of rows against weights of thousands of rows) that is often not the fastest of the
// algorithms cuBLAS has: measured on the H200
// (tests/bench/gemm_lt_bench.cu, results/gemm_lt_h200.md and gemm_lt_search_h200.md),
// the backend's table names for the 48B preset's shapes the whole configuration (algorithm,
// tile, cluster shape, K split, option: often one the heuristic does not offer at that shape)
// that was fastest there. The choice
// is a table, not a timing at run time: the same build on the same device and cuBLAS always
// runs the same algorithm, so a product's bits do not depend on a race between candidates.
//
// A plan (descriptors and algorithm) is made on a shape's first product and kept (at most
// KD_LT_PLANS; past that the oldest is replaced): a product's host cost is a lookup and the
// cublasLtMatmul call, and a graph capture records only the kernels.
#ifndef KD_CUDA_GEMM_LT_CUH
#define KD_CUDA_GEMM_LT_CUH

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "kd/lt_table.h"

// The workspace the products may use (split-K partial sums); the caller's, at least this size.
#define KD_LT_WORKSPACE (32u << 20)
// The most plans kept.
#define KD_LT_PLANS 256

typedef struct kd_cu_lt kd_cu_lt;

// The table's types (kd_lt_config, kd_lt_entry) and its text form: kd/lt_table.h.
// A choice is checked by cublasLtMatmulAlgoCheck when its plan is made: where cuBLASLt
// refuses it (another cuBLAS than the one measured), the product takes the heuristic's first.

// The algorithm descriptor of configuration *c (bf16 inputs, fp32 output and accumulation): 1,
// or 0 where cuBLASLt does not know the algorithm id or refuses an attribute's value. Whether
// it runs a given product is cublasLtMatmulAlgoCheck's to say.
int kd_cu_lt_config_algo(cublasLtHandle_t h, const kd_lt_config *c, cublasLtMatmulAlgo_t *a);

// A handle for the current device; cudaErrorInitializationError where cuBLASLt could not start
// (*out NULL), cudaErrorMemoryAllocation where memory ran out.
cudaError_t kd_cu_lt_create(kd_cu_lt **out);
void kd_cu_lt_destroy(kd_cu_lt *lt);

// Whether a table is used (1, the default: the built-in one on a device of the kind it was
// measured on, or the operator's) or every product takes the heuristic's first algorithm (0);
// a change drops the plans made.
void kd_cu_lt_set_table(kd_cu_lt *lt, int on);

// An operator's table (kd/lt_table.h; the CUDA backend reads KDECODE_CUDA_LT_TABLE) in place
// of the built-in one, on any device: the n entries copied (0: no entries, so the heuristic's
// first everywhere). cudaErrorMemoryAllocation where the copy cannot be made (the table as
// it was), cudaErrorInvalidValue for n < 0 or no entries given. Drops the plans made.
cudaError_t kd_cu_lt_use_table(kd_cu_lt *lt, const kd_lt_entry *tab, int n);

// The built-in table (used on a device of compute capability 9.0 with at least 132 SMs, the
// H200 kind it was measured on; tests): its entries in *out, their number returned.
int kd_cu_lt_table(const kd_lt_entry **out);

// The product above on stream s, with the workspace given. CUBLAS_STATUS_INVALID_VALUE for
// shapes out of range (any dimension below 1 or at least 2^31, a leading dimension below its
// row), CUBLAS_STATUS_NOT_SUPPORTED where cuBLASLt has no algorithm for it; the caller may
// then fall back to cublasGemmEx.
cublasStatus_t kd_cu_lt_gemm(kd_cu_lt *lt, int64_t M, int64_t N, int64_t K, const __nv_bfloat16 *A, int64_t lda,
                             const __nv_bfloat16 *W, int64_t ldw, float beta, float *C, int64_t ldc, void *ws,
                             size_t ws_bytes, cudaStream_t s);

// The most K slices of kd_cu_lt_gemm_split.
#define KD_LT_MAX_SLICES 8

// The product above with its K dimension cut into nb equal slices (2..KD_LT_MAX_SLICES; K / nb a
// multiple of 8), one product of a strided batch each, each slice's sum apart: C[b][M][N] (dense,
// nb blocks of M x N) = A[M][bK/nb .. (b+1)K/nb) W[N][same]^T, beta 0. Twice as many blocks of
// cuBLAS's kernel where a product has few output tiles (the 48B preset's o_proj and down
// projection at 128 rows, N = 2304: tests/bench/results/gemm_lt_search_h200.md); whoever reads
// C adds the slices (kd_cu_rmsnorm_add). Always the heuristic's first algorithm for the batch.
// CUBLAS_STATUS_INVALID_VALUE for shapes out of range, as above.
cublasStatus_t kd_cu_lt_gemm_split(kd_cu_lt *lt, int64_t M, int64_t N, int64_t K, const __nv_bfloat16 *A,
                                   int64_t lda, const __nv_bfloat16 *W, int64_t ldw, int nb, float *C, void *ws,
                                   size_t ws_bytes, cudaStream_t s);

// The product of kd_cu_lt_gemm with beta 0 and C in bf16 (fp32 accumulation, rounded once at the store):
// half the bytes written, and read by whoever reads C (gate|up, read by SwiGLU: kd_cu_swiglu_h). Always
// the heuristic's first algorithm. CUBLAS_STATUS_INVALID_VALUE for shapes out of range, as above.
cublasStatus_t kd_cu_lt_gemm_bf16(kd_cu_lt *lt, int64_t M, int64_t N, int64_t K, const __nv_bfloat16 *A, int64_t lda,
                                  const __nv_bfloat16 *W, int64_t ldw, __nv_bfloat16 *C, int64_t ldc, void *ws,
                                  size_t ws_bytes, cudaStream_t s);

// How many plans it holds, and how many of them run a choice of the table (tests).
void kd_cu_lt_stats(const kd_cu_lt *lt, int *plans, int *picked);

#endif
