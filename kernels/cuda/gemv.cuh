// gemv.cuh: the skinny bf16 matrix product of the CUDA backend's decode steps.
//
// C[M][N] = A[M][K] W[N][K]^T + beta C (row-major, leading dimensions given), A and W bf16,
// C fp32, fp32 accumulation, for few activation rows (M <= 32). At decode sizes such a
// product streams its weights once and does little else. Measured on the H200
// (tests/bench/gemm_bench.cu, results/gemm_h200.md): cuBLAS's kernels stream the large
// products of the 48B preset at 3.2-4.3 TB/s already, but not the small ones (f_proj.1 /
// g_proj.1, K = 128: 2.8 us for 1 MB; o_proj at 2.1 TB/s); kd_cu_skinny_pick names the
// shapes where a form of this kernel is faster, and the backend keeps cuBLAS for the rest.
// Every form issues its first weight loads before waiting for the kernel before it
// (programmatic dependent launch, launch.cuh: the weights are never written, so their
// stream overlaps the previous kernel's tail).
//
// The row form (M <= 4): each warp takes whole rows of W; a lane loads 16 bytes of a row per
// 256 keys (a warp reads 512 contiguous bytes of a row at a time), several chunks of one or
// more rows in flight, and a chunk's activation rows (at most 4, from the L1) loaded together
// before its products (one at a time between them, the products of 2-4 rows waited on each
// load in turn: o_proj at M = 4 18.9 -> 12.2 us, M = 1 6.9 -> 6.0); products in fp32 on the
// CUDA cores, warp sums by shuffles. Its split-K variant puts a block's 8 warps on the same
// few rows (each warp every 8th chunk of a row, the block reads 4 KB of a row at a time), then
// sums the warps' partials in shared memory in a fixed order: many more warps in flight when
// N is small and K long (o_proj and the down projection at M = 1).
//
// The tensor-core form: a block takes 16 rows of W; its warps split K in 32-wide key blocks
// and the block adds their 16 x M partial products in shared memory, in a fixed order (the
// result does not depend on timing). Inside a key block lane (g, q) loads 16 bytes of W row
// g, of row g + 8 and of activation row g (keys 8q..8q+7) and feeds them to two mma
// m16n8k16: the sum over keys does not depend on their order, so the same permutation of
// the 16 keys of each mma for W and for A (physical 8q..8q+3 as the fragment's 2q, 2q + 1,
// 2q + 8, 2q + 9) needs no shuffles. Bytes: W once, A once per 16 rows of W (from L2).
//
// The segment-diagonal tensor-core form (M <= 4): a warp reads two rows of W as the row form
// reads one, 256 contiguous bytes of each an instruction, and multiplies them on the tensor
// cores: mma m16n8k16 with W as the B operand, column 4 r + s holding segment s (32 keys) of
// row r, and activation row m's segment s as A's row 4 m + s; the products where the
// segments match are the partial sums, added by shuffles at the end. A lane's 16 bytes of W
// cost 2 mma and half an activation load whatever M is, where the row form's fp32 products
// grow with M (at M = 4 on the H200: the input projection 15.6 us against the row form's 22.4
// and cuBLAS's 17.5). Its split-K variant (form 12) puts a block's 8 warps on two row pairs
// (N small, K long: o_proj and the down projection, 7.4 and 13.7 us against cuBLAS's 9.2 and
// 15.0).
//
// Two fusions ride on the row form: kd_cu_gemm_skinny_epi writes bf16 copies of some of C's
// columns as it stores them (the next kernel's input, instead of a copy kernel), and
// kd_cu_gemm_skinny_pair_conv runs the KDA conv (conv.cuh) in the first blocks of a pair's
// launch. Each saves a kernel boundary of a decode step (cuda_backend.cu).
//
// Measured and not kept: a streaming row form (a grid of what the device holds at once, each
// warp an equal share of row pairs streamed across row boundaries, without the row form's
// last partial wave): slower for every product of the 48B preset but gate|up on the H200
// (o_proj 9.15 vs 6.94 us, the head 182 vs 169; tests/bench/results/tried/stream_gemv.patch).
// And the row forms with the next chunks' weight loads issued before this chunk's products
// (twice the weight registers): slower at every product and row count measured (input
// projection M = 1 17.1 vs 15.9 us, M = 4 26.1 vs 22.3; tried/pipelined_gemv.patch).
#ifndef KD_CUDA_GEMV_CUH
#define KD_CUDA_GEMV_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "kernels/cuda/ops.cuh"

// The most activation rows kd_cu_gemm_skinny takes.
#define KD_SKINNY_MAX_M 32

// Whether kd_cu_gemm_skinny takes this product: 1 <= M <= max_m (<= KD_SKINNY_MAX_M), K a
// positive multiple of 32, leading dimensions multiples of 8 elements, A and W 16-byte
// aligned, N and K below 2^31.
int kd_cu_skinny_ok(int64_t M, int64_t N, int64_t K, const void *A, int64_t lda, const void *W, int64_t ldw,
                    int max_m);

// The form of this kernel that beats cuBLAS at this shape on the H200 (measured by
// tests/bench/gemm_bench.cu), or 0 where cuBLAS is as fast or faster.
int kd_cu_skinny_pick(int64_t M, int64_t N, int64_t K);

// The product above (cudaErrorInvalidValue when kd_cu_skinny_ok(..., KD_SKINNY_MAX_M) is
// false), in the form kd_cu_skinny_pick names (where it names none: the row form up to
// M = 4, the tensor-core form above). beta == 0: C is only written.
cudaError_t kd_cu_gemm_skinny(int64_t M, int64_t N, int64_t K, const __nv_bfloat16 *A, int64_t lda,
                              const __nv_bfloat16 *W, int64_t ldw, float beta, float *C, int64_t ldc,
                              cudaStream_t s);

// The gate|up product and SwiGLU in one kernel: W [2 FF][K] with gate and up rows interleaved
// (row 2j gate_j, row 2j + 1 up_j), Y [M][ldy] bf16, Y[m][j] = bf16(silu(gate) * up) of the fp32
// sums. form: 5 the row form, 11 the segment-diagonal form (M <= 4 both), 0 by M (1: 5, 2-4: 11).
// cudaErrorInvalidValue for another form or where the forms cannot take the shapes
// (kd_cu_skinny_ok, M > 4).
cudaError_t kd_cu_gemm_skinny_swiglu(int form, int64_t M, int64_t FF, int64_t K, const __nv_bfloat16 *A, int64_t lda,
                                     const __nv_bfloat16 *W, int64_t ldw, __nv_bfloat16 *Y, int64_t ldy,
                                     cudaStream_t s);

// One form of it (benchmarks and tests; cudaErrorInvalidValue for an unknown form or one that
// does not take M): 0 the default (by M), 1-4 the tensor-core form (8 warps a block, 4 or 2
// key blocks in flight, interleaved; 4 warps, 4 contiguous / 2 interleaved), 5-8 the row form
// for M <= 4 (rows a warp x 16-byte chunks a row in flight: 2x2, 1x4, 2x4, 4x2), 9-10 the
// split-K row form for M <= 4 (8 warps on 2 or 4 rows, 2 chunks in flight a lane), 11-12 the
// segment-diagonal tensor-core form for M <= 4 (a warp on 2 row pairs, 2 steps of 128 keys in
// flight; 12: split K, the block's 8 warps on 2 row pairs).
#define KD_SKINNY_FORMS 12
cudaError_t kd_cu_gemm_skinny_form(int form, int64_t M, int64_t N, int64_t K, const __nv_bfloat16 *A, int64_t lda,
                                   const __nv_bfloat16 *W, int64_t ldw, float beta, float *C, int64_t ldc,
                                   cudaStream_t s);

// What a product of few rows does besides its sums (kd_cu_gemm_skinny_epi), in place of the
// kernel after it: one launch and one kernel boundary fewer, the same bits. copy: bf16 copies
// of the values stored in C's columns [col0, col0 + ncols) into copy [M][ncols] (what
// kd_cu_copy_cols after the product writes).
typedef struct kd_skinny_epi {
    __nv_bfloat16 *copy;
    int64_t col0, ncols;
} kd_skinny_epi;

// The product in `form` with the epilogue above: the row form 5 (M <= 4) only;
// cudaErrorInvalidValue where the form or the columns do not fit.
cudaError_t kd_cu_gemm_skinny_epi(int form, int64_t M, int64_t N, int64_t K, const __nv_bfloat16 *A, int64_t lda,
                                  const __nv_bfloat16 *W, int64_t ldw, float beta, float *C, int64_t ldc,
                                  const kd_skinny_epi *ep, cudaStream_t s);

// One product of a pair (kd_cu_gemm_skinny_pair, kd_cu_gemm_skinny_pair_conv): C[M][N] = A[M][K] W[N][K]^T + beta C.
typedef struct kd_skinny_job {
    const __nv_bfloat16 *A;
    int64_t lda;
    const __nv_bfloat16 *W;
    int64_t ldw;
    float *C;
    int64_t ldc;
    int64_t N;
} kd_skinny_job;

// Two products of the same M and K in one launch (the first's blocks, then the second's): one
// kernel boundary fewer where two independent products follow each other (f_proj.1 and
// g_proj.1). form as kd_cu_gemm_skinny_form (0: the one kd_cu_skinny_pick names for the
// first), 1-8 only (the split-K row forms are not paired); cudaErrorInvalidValue where
// either product is not taken (kd_cu_skinny_ok, C null or ldc < N).
cudaError_t kd_cu_gemm_skinny_pair(int form, int64_t M, int64_t K, const kd_skinny_job *j0, const kd_skinny_job *j1,
                                   float beta, cudaStream_t s);

// The pair (form as kd_cu_gemm_skinny_pair) and kd_cu_conv_silu(conv) in one launch: the
// conv's blocks first (as many threads as the form's), then the products'; the conv and the
// products are independent (both read the input projection's output, write different arrays),
// so one kernel boundary fewer. The same bits as the two launches (the pair's kernels are these
// with no conv blocks). cudaErrorInvalidValue where either is refused or conv is null.
cudaError_t kd_cu_gemm_skinny_pair_conv(int form, int64_t M, int64_t K, const kd_skinny_job *j0,
                                        const kd_skinny_job *j1, float beta, const kd_cu_conv_args *conv,
                                        cudaStream_t s);

#endif
