// gemv.cu: see gemv.cuh.
#include <cuda_bf16.h>
#include <stdint.h>

#include "kernels/cuda/conv.cuh"
#include "kernels/cuda/gemv.cuh"
#include "kernels/cuda/launch.cuh"

namespace {

// 16 bytes of weights: read once, not kept in L1.
__device__ __forceinline__ uint4 ld_weights(const __nv_bfloat16 *p) {
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
}

__device__ __forceinline__ void mma_bf16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// The two mma of 16 keys held as 16 bytes a lane: A's rows g and g + 8 in lo and hi, B's column
// g in b (physical keys 8q .. 8q + 3, then 8q + 4 .. 8q + 7, as the fragments' 2q, 2q + 1,
// 2q + 8, 2q + 9: the same permutation for both operands).
__device__ __forceinline__ void mma_16keys(float (&c)[4], uint4 lo, uint4 hi, uint4 b) {
    mma_bf16(c, lo.x, hi.x, lo.y, hi.y, b.x, b.y);
    mma_bf16(c, lo.z, hi.z, lo.w, hi.w, b.z, b.w);
}

__device__ __forceinline__ void store_c(float *c, float sum, float beta) { *c = beta != 0.f ? sum + beta * *c : sum; }

// ---- the tensor-core form: a block of NW warps takes 16 rows of W, its warps split K in
// 32-wide key blocks (interleaved, or CONTIG: each a contiguous range), U of them in flight
// a warp; NT: activation rows in tiles of 8 (M <= 8 NT). KB: K / 32.
// (tc_body: block bx of the grid's product; the kernels below call it with their block index)
template <int NT, int NW, int U, bool CONTIG>
__device__ __forceinline__ void tc_body(int bx, int M, int N, int KB, const __nv_bfloat16 *A, int64_t lda,
                                        const __nv_bfloat16 *W, int64_t ldw, float beta, float *C, int64_t ldc) {
    __shared__ float red[NW][8 * NT][17]; /* [warp][activation row][weight row] */
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
    const int64_t n0 = (int64_t)bx * 16;
    const bool live0 = n0 + g < N, live1 = n0 + g + 8 < N;
    const __nv_bfloat16 *w0 = W + (live0 ? (n0 + g) * ldw : 0) + 8 * q;
    const __nv_bfloat16 *w1 = W + (live1 ? (n0 + g + 8) * ldw : 0) + 8 * q;
    const uint4 zero = make_uint4(0, 0, 0, 0);
    const int per = (KB + NW - 1) / NW;
    const int kbs = CONTIG ? warp * per : warp, step = CONTIG ? 1 : NW;
    const int kbe = CONTIG ? min(KB, kbs + per) : KB;
    uint4 wa[U], wb[U];
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int kb = kbs + u * step;
        wa[u] = kb < kbe && live0 ? ld_weights(w0 + kb * 32) : zero;
        wb[u] = kb < kbe && live1 ? ld_weights(w1 + kb * 32) : zero;
    }
    kd_dep_start(); /* A and C come from the kernels before; the weights are never written */
    float acc[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; nt++) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
    for (int kb0 = kbs; kb0 < kbe; kb0 += U * step) {
        uint4 x[U][NT];
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                const int kb = kb0 + u * step, m = nt * 8 + g;
                x[u][nt] = kb < kbe && m < M ? __ldg((const uint4 *)(A + m * lda + kb * 32 + 8 * q)) : zero;
            }
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++) mma_16keys(acc[nt], wa[u], wb[u], x[u][nt]);
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int kb = kb0 + (U + u) * step;
            wa[u] = kb < kbe && live0 ? ld_weights(w0 + kb * 32) : zero;
            wb[u] = kb < kbe && live1 ? ld_weights(w1 + kb * 32) : zero;
        }
    }
    /* acc[nt]: (weight row g, activation rows nt 8 + 2q, + 1), then weight row g + 8 */
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        red[warp][nt * 8 + 2 * q][g] = acc[nt][0], red[warp][nt * 8 + 2 * q + 1][g] = acc[nt][1];
        red[warp][nt * 8 + 2 * q][g + 8] = acc[nt][2], red[warp][nt * 8 + 2 * q + 1][g + 8] = acc[nt][3];
    }
    __syncthreads();
    for (int i = threadIdx.x; i < 16 * 8 * NT; i += NW * 32) {
        const int r = i % 16, m = i / 16;
        const int64_t n = n0 + r;
        if (m >= M || n >= N) continue;
        float sum = 0.f;
#pragma unroll
        for (int w = 0; w < NW; w++) sum += red[w][m][r];
        store_c(C + m * ldc + n, sum, beta);
    }
}

template <int NT, int NW, int U, bool CONTIG>
__global__ void __launch_bounds__(NW * 32) skinny_tc_kernel(int M, int N, int KB, const __nv_bfloat16 *A, int64_t lda,
                                                            const __nv_bfloat16 *W, int64_t ldw, float beta, float *C,
                                                            int64_t ldc) {
    tc_body<NT, NW, U, CONTIG>(blockIdx.x, M, N, KB, A, lda, W, ldw, beta, C, ldc);
}

// Two products in one launch, and optionally the conv before them: blocks [0, cg.x cg.y) run
// the conv (kd_conv_silu_block; none when cg.x is 0), the next nb0 the first product, the rest
// the second.
struct conv_grid {
    int x, y;
};

template <int NT, int NW, int U, bool CONTIG>
__global__ void __launch_bounds__(NW * 32) skinny_tc_pair_kernel(int M, int KB, kd_skinny_job j0, kd_skinny_job j1,
                                                                 int nb0, float beta, kd_cu_conv_args ca,
                                                                 conv_grid cg) {
    const int b = (int)blockIdx.x - cg.x * cg.y;
    if (b < 0) {
        kd_conv_silu_block(ca, (int)blockIdx.x % cg.x, (int)blockIdx.x / cg.x, cg.y); /* waits first: ca.early 0 */
    } else if (b < nb0) {
        tc_body<NT, NW, U, CONTIG>(b, M, (int)j0.N, KB, j0.A, j0.lda, j0.W, j0.ldw, beta, j0.C, j0.ldc);
    } else {
        tc_body<NT, NW, U, CONTIG>(b - nb0, M, (int)j1.N, KB, j1.A, j1.lda, j1.W, j1.ldw, beta, j1.C, j1.ldc);
    }
}

// ---- the row form (M <= MT <= 4): each warp takes RW rows of W whole, a lane 16 bytes of a
// row per 256 keys (the warp reads 512 contiguous bytes of a row at a time), U such chunks a
// row in flight; fp32 products on the CUDA cores, warp sums by shuffles. K % 8 == 0.
__device__ __forceinline__ void bf16x8(uint4 v, float (&f)[8]) {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; i++) f[2 * i] = __uint_as_float(w[i] << 16), f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
}
// A warp's sums over rows r0 .. r0 + RW - 1 of W times the M activation rows, over the lane's
// chunks c0, c0 + STEP, ... (STEP 1: the whole row; 8: a warp's share of a split row), U in
// flight; the first loads are issued before the programmatic wait (weights are never written).
template <int MT, int RW, int U, int STEP>
__device__ __forceinline__ void row_partials(float (&acc)[RW][MT], int M, int N, int K, const __nv_bfloat16 *A,
                                             int64_t lda, const __nv_bfloat16 *W, int64_t ldw, int64_t r0, int first,
                                             int lane) {
    const int nch = (K / 8 + 31) / 32; /* 16-byte chunks a lane takes of a row (the last maybe partial) */
    const uint4 zero = make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int r = 0; r < RW; r++)
#pragma unroll
        for (int m = 0; m < MT; m++) acc[r][m] = 0.f;
    uint4 w[RW][U];
    auto load = [&](int c0) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int c = c0 + u * STEP, k = (c * 32 + lane) * 8;
#pragma unroll
            for (int r = 0; r < RW; r++)
                w[r][u] = c < nch && k < K && r0 + r < N ? ld_weights(W + (r0 + r) * ldw + k) : zero;
        }
    };
    load(first);
    kd_dep_start();
    for (int c0 = first; c0 < nch; c0 += U * STEP) {
        uint4 xa[U][MT]; /* every activation chunk of these U chunks first: their loads in flight together */
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int c = c0 + u * STEP, k = (c * 32 + lane) * 8;
#pragma unroll
            for (int m = 0; m < MT; m++)
                xa[u][m] = c < nch && k < K && m < M ? __ldg((const uint4 *)(A + m * lda + k)) : zero;
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int c = c0 + u * STEP, k = (c * 32 + lane) * 8;
            if (c >= nch || k >= K) continue;
#pragma unroll
            for (int m = 0; m < MT; m++) {
                if (m >= M) break;
                float xf[8];
                bf16x8(xa[u][m], xf);
#pragma unroll
                for (int r = 0; r < RW; r++) {
                    float wf[8];
                    bf16x8(w[r][u], wf);
#pragma unroll
                    for (int e = 0; e < 8; e++) acc[r][m] = fmaf(wf[e], xf[e], acc[r][m]);
                }
            }
        }
        load(c0 + U * STEP);
    }
#pragma unroll
    for (int r = 0; r < RW; r++)
#pragma unroll
        for (int m = 0; m < MT; m++)
#pragma unroll
            for (int o = 16; o >= 1; o /= 2) acc[r][m] += __shfl_xor_sync(0xffffffffu, acc[r][m], o);
}

// SWIGLU (RW = 2, N even): W's rows interleave gate and up (row 2j gate_j, 2j + 1 up_j), and the
// kernel writes act[m][j] = bf16(silu(gate) * up) into Y (leading dimension ldc) instead of C.
// COPY: also bf16 copies of C's columns [ep.col0, ep.col0 + ep.ncols) into ep.copy (the value
// stored in C, rounded).
template <int MT, int RW, int U, bool SWIGLU, bool COPY = false>
__device__ __forceinline__ void row_body(int bx, int M, int N, int K, const __nv_bfloat16 *A, int64_t lda,
                                         const __nv_bfloat16 *W, int64_t ldw, float beta, float *C, int64_t ldc,
                                         __nv_bfloat16 *Y, const kd_skinny_epi &ep = kd_skinny_epi{}) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t r0 = ((int64_t)bx * 8 + warp) * RW;
    float acc[RW][MT];
    row_partials<MT, RW, U, 1>(acc, M, N, K, A, lda, W, ldw, r0, 0, lane);
    if (SWIGLU) {
#pragma unroll
        for (int m = 0; m < MT; m++)
            if (lane == 0 && m < M && r0 + 1 < N) {
                const float g = acc[0][m], u = acc[RW - 1][m];
                Y[m * ldc + r0 / 2] = __float2bfloat16_rn(g * (1.f / (1.f + expf(-g))) * u); /* as kd_cu_swiglu */
            }
    } else {
#pragma unroll
        for (int r = 0; r < RW; r++)
#pragma unroll
            for (int m = 0; m < MT; m++)
                if (lane == 0 && m < M && r0 + r < N) {
                    float *c = C + m * ldc + r0 + r;
                    store_c(c, acc[r][m], beta);
                    if (COPY && r0 + r >= ep.col0 && r0 + r < ep.col0 + ep.ncols)
                        ep.copy[m * ep.ncols + (r0 + r - ep.col0)] = __float2bfloat16_rn(*c);
                }
    }
}

template <int MT, int RW, int U, bool SWIGLU = false, bool COPY = false>
__global__ void __launch_bounds__(256) skinny_row_kernel(int M, int N, int K, const __nv_bfloat16 *A, int64_t lda,
                                                         const __nv_bfloat16 *W, int64_t ldw, float beta, float *C,
                                                         int64_t ldc, __nv_bfloat16 *Y, kd_skinny_epi ep) {
    row_body<MT, RW, U, SWIGLU, COPY>(blockIdx.x, M, N, K, A, lda, W, ldw, beta, C, ldc, Y, ep);
}

// Blocks an SM the compiler keeps registers for, so that the forms keep what they had before the
// conv's history ring (its index and wrap took them from 64-80 registers a thread to 84-93, a block
// an SM fewer): 4 (64 registers) for forms 5 and 6 at 1 row and 5 at 2; 3 (85) for form 6 at 2
// rows, 7 and 8 at 1 and 5 at 3-4 (ptxas -v: no spills but form 5 at 3-4 rows' 8 bytes, as before).
constexpr int row_pair_minb(int MT, int RW, int U) {
    if ((MT == 1 && RW == 1 && U == 4) || (MT <= 2 && RW == 2 && U == 2)) return 4;
    if ((MT == 2 && RW == 1 && U == 4) || (MT == 1 && RW == 2 && U == 4) || (MT == 1 && RW == 4)) return 3;
    return MT == 4 && RW == 2 && U == 2 ? 3 : 1;
}

template <int MT, int RW, int U>
__global__ void __launch_bounds__(256, row_pair_minb(MT, RW, U))
    skinny_row_pair_kernel(int M, int K, kd_skinny_job j0, kd_skinny_job j1, int nb0, float beta, kd_cu_conv_args ca,
                           conv_grid cg) {
    const int b = (int)blockIdx.x - cg.x * cg.y;
    if (b < 0) {
        kd_conv_silu_block(ca, (int)blockIdx.x % cg.x, (int)blockIdx.x / cg.x, cg.y); /* waits first: ca.early 0 */
    } else if (b < nb0) {
        row_body<MT, RW, U, false>(b, M, (int)j0.N, K, j0.A, j0.lda, j0.W, j0.ldw, beta, j0.C, j0.ldc, nullptr);
    } else {
        row_body<MT, RW, U, false>(b - nb0, M, (int)j1.N, K, j1.A, j1.lda, j1.W, j1.ldw, beta, j1.C, j1.ldc, nullptr);
    }
}

// The conv's share of a pair's launch in blocks of `threads` (none without a conv).
conv_grid pair_conv_grid(const kd_cu_conv_args *conv, int threads) {
    conv_grid g = {0, 0};
    if (conv) {
        unsigned gx = 0, gy = 0;
        kd_conv_grid(*conv, threads, &gx, &gy);
        g.x = (int)gx, g.y = (int)gy;
    }
    return g;
}

template <int NW, int U, bool CONTIG>
cudaError_t launch_tc(int m, int n, int kb, const __nv_bfloat16 *A, int64_t lda, const __nv_bfloat16 *W, int64_t ldw,
                      float beta, float *C, int64_t ldc, cudaStream_t s) {
    const dim3 grid((unsigned)((n + 15) / 16)), block(NW * 32);
    switch ((m + 7) / 8) {
    case 1: return kd_launch_dep(skinny_tc_kernel<1, NW, U, CONTIG>, grid, block, 0, s, m, n, kb, A, lda, W, ldw, beta, C, ldc);
    case 2: return kd_launch_dep(skinny_tc_kernel<2, NW, U, CONTIG>, grid, block, 0, s, m, n, kb, A, lda, W, ldw, beta, C, ldc);
    case 3: return kd_launch_dep(skinny_tc_kernel<3, NW, U, CONTIG>, grid, block, 0, s, m, n, kb, A, lda, W, ldw, beta, C, ldc);
    default: return kd_launch_dep(skinny_tc_kernel<4, NW, U, CONTIG>, grid, block, 0, s, m, n, kb, A, lda, W, ldw, beta, C, ldc);
    }
}

// ---- the split-K row form (M <= MT <= 4): a block of 8 warps takes RW rows of W; its warps
// split each row's 16-byte chunks (warp w: chunks w, w + 8, ...: the block reads 4 KB of a row
// at a time), U chunks a row in flight a lane; warp sums by shuffles, then the 8 warps' sums
// in shared memory in a fixed order. Many more warps than the row form at small N (the down
// projection and o_proj of the 48B preset: N = 2304).
template <int MT, int RW, int U>
__global__ void __launch_bounds__(256) skinny_rowk_kernel(int M, int N, int K, const __nv_bfloat16 *A, int64_t lda,
                                                          const __nv_bfloat16 *W, int64_t ldw, float beta, float *C,
                                                          int64_t ldc) {
    __shared__ float red[8][RW][MT];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t r0 = (int64_t)blockIdx.x * RW;
    float acc[RW][MT];
    row_partials<MT, RW, U, 8>(acc, M, N, K, A, lda, W, ldw, r0, warp, lane);
#pragma unroll
    for (int r = 0; r < RW; r++)
#pragma unroll
        for (int m = 0; m < MT; m++)
            if (lane == 0) red[warp][r][m] = acc[r][m];
    __syncthreads();
    if (threadIdx.x < RW * MT) {
        const int r = threadIdx.x / MT, m = threadIdx.x % MT;
        if (m < M && r0 + r < N) {
            float sum = 0.f;
#pragma unroll
            for (int x = 0; x < 8; x++) sum += red[x][r][m];
            store_c(C + m * ldc + r0 + r, sum, beta);
        }
    }
}

template <int RW, int U>
cudaError_t launch_rowk(int m, int n, int k, const __nv_bfloat16 *A, int64_t lda, const __nv_bfloat16 *W, int64_t ldw,
                        float beta, float *C, int64_t ldc, cudaStream_t s) {
    const dim3 grid((unsigned)((n + RW - 1) / RW)), block(256);
    switch (m) {
#define KD_SKINNY_ROWK(MT) \
    kd_launch_dep(skinny_rowk_kernel<MT, RW, U>, grid, block, 0, s, m, n, k, A, lda, W, ldw, beta, C, ldc)
    case 1: return KD_SKINNY_ROWK(1);
    case 2: return KD_SKINNY_ROWK(2);
    default: return KD_SKINNY_ROWK(4);
#undef KD_SKINNY_ROWK
    }
}

// ---- the segment-diagonal tensor-core row form (M <= 4): a warp takes pairs of rows of W and
// reads them as the row form does, 256 contiguous bytes of each row of a pair an instruction
// (lane l: row l / 16, keys 8 (l % 16) .. of the 128-key step), and feeds them to mma
// m16n8k16 as its B operand: column n = 4 rr + s holds row rr's segment s (32 keys) of the
// step, lane (g, q) keys 8q .. 8q + 7 (the keys' order inside an mma is the same permutation
// for A and B, as in the tensor-core form). The A operand's row i = 4 m + s holds activation
// row m's segment s, so C[i][n] is a segment's partial sum where s(i) == s(n) (a quarter of
// the 16 x 8 products: the tensor cores have room to spare), and the 4 segments of (m, rr)
// are added by shuffles at the end. Per 16 bytes of W a lane issues 2 mma (of the same 16
// keys) and half an activation load, instead of 8 M fp32 multiply-adds on the CUDA cores.
// SPLIT: the block's 8 warps share its RP pairs (warp w: steps w, w + 8, ...), their sums
// added in shared memory in a fixed order; otherwise a warp takes RP pairs whole. U steps in
// flight; a segment past K is read as zeros (K % 32 == 0).
// MINB (__launch_bounds__'s blocks an SM) steers ptxas's register budget, and both forms were
// measured sensitive to it on the H200 (tests/bench/results/logs/gemm_seg_h200_tried*.log): the
// whole-row form with 1 takes 80 registers (16 more, likely a second set of weight registers for
// the next steps' loads; not read in the machine code) and runs the input projection at M = 4 in
// 15.6 us, gate|up in 23.2, with no minimum 64 (18.7, 28.1);
// the split form with 5 takes 48, so that o_proj's 576 blocks fit in one wave (7.4 us; with
// 52 registers, 4 blocks an SM, 9.4).
// SWIGLU (not SPLIT; N even): W's rows interleave gate and up as the row form's (each pair one
// gate_j, up_j), and the kernel writes Y[m][j] = bf16(silu(gate) * up) (leading dimension ldc)
// instead of C.
template <int RP, int U, bool SPLIT, int MINB, bool SWIGLU = false>
__global__ void __launch_bounds__(256, MINB) skinny_seg_kernel(int M, int N, int K, const __nv_bfloat16 *A, int64_t lda,
                                                               const __nv_bfloat16 *W, int64_t ldw, float beta,
                                                               float *C, int64_t ldc, __nv_bfloat16 *Y) {
    static_assert(!(SPLIT && SWIGLU), "the split form writes C only");
    __shared__ float red[SPLIT ? 8 : 1][RP][4][2];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
    const int64_t r0 = SPLIT ? (int64_t)blockIdx.x * 2 * RP : ((int64_t)blockIdx.x * 8 + warp) * 2 * RP;
    const int ks = (K + 127) / 128, first = SPLIT ? warp : 0, step = SPLIT ? 8 : 1;
    const int koff = (g % 4) * 32 + q * 8; /* this lane's keys in a step, for W and A alike */
    const int ma = g / 4, mb = g / 4 + 2;  /* the activation rows of this lane's A rows g, g + 8 */
    const uint4 zero = make_uint4(0, 0, 0, 0);
    uint4 w[RP][U];
    auto load = [&](int j0) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int j = j0 + u * step, k = j * 128 + koff;
#pragma unroll
            for (int p = 0; p < RP; p++) {
                const int64_t r = r0 + 2 * p + lane / 16;
                w[p][u] = j < ks && k < K && r < N ? ld_weights(W + r * ldw + k) : zero;
            }
        }
    };
    float acc[RP][4];
#pragma unroll
    for (int p = 0; p < RP; p++) acc[p][0] = acc[p][1] = acc[p][2] = acc[p][3] = 0.f;
    load(first);
    kd_dep_start(); /* A and C come from the kernels before; the weights are never written */
    for (int j0 = first; j0 < ks; j0 += U * step) {
        uint4 xa[U], xb[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int j = j0 + u * step, k = j * 128 + koff;
            const bool in = j < ks && k < K;
            xa[u] = in && ma < M ? __ldg((const uint4 *)(A + ma * lda + k)) : zero;
            xb[u] = in && mb < M ? __ldg((const uint4 *)(A + mb * lda + k)) : zero;
        }
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int p = 0; p < RP; p++) mma_16keys(acc[p], xa[u], xb[u], w[p][u]);
        load(j0 + U * step);
    }
    /* acc[p]: C[i][n] at (i, n) = (g, 2q), (g, 2q + 1), (g + 8, 2q), (g + 8, 2q + 1); s(i) = g % 4,
     * s(n) = n % 4, rr = n / 4 = q / 2. Kept where s(i) == s(n): t = g % 4 - 2 (q % 2) in {0, 1}. */
    const int t = (g % 4) - 2 * (q % 2);
    const bool keep = t == 0 || t == 1;
    float v[RP][2];
#pragma unroll
    for (int p = 0; p < RP; p++) {
        v[p][0] = keep ? (t ? acc[p][1] : acc[p][0]) : 0.f; /* activation row g / 4 */
        v[p][1] = keep ? (t ? acc[p][3] : acc[p][2]) : 0.f; /* activation row g / 4 + 2 */
#pragma unroll
        for (int o : {1, 4, 8}) /* the lanes of one (g / 4, q / 2): bits 0, 2, 3 of the lane */
#pragma unroll
            for (int h = 0; h < 2; h++) v[p][h] += __shfl_xor_sync(0xffffffffu, v[p][h], o);
    }
    /* lane 16 a + 2 rr (a = g / 4, rr = q / 2) holds rows m = a, a + 2 of W row r0 + 2p + rr */
    const bool owner = (lane & 13) == 0;
    const int a = lane / 16, rr = (lane / 2) % 2;
    if (SPLIT) {
#pragma unroll
        for (int p = 0; p < RP; p++)
            if (owner) red[warp][p][a][rr] = v[p][0], red[warp][p][a + 2][rr] = v[p][1];
        __syncthreads();
        if (threadIdx.x < RP * 8) {
            const int p = threadIdx.x / 8, m = (threadIdx.x / 2) % 4, r = threadIdx.x % 2;
            const int64_t n = r0 + 2 * p + r;
            if (m < M && n < N) {
                float sum = 0.f;
#pragma unroll
                for (int x = 0; x < 8; x++) sum += red[x][p][m][r];
                store_c(C + m * ldc + n, sum, beta);
            }
        }
    } else if (SWIGLU) {
#pragma unroll
        for (int p = 0; p < RP; p++) {
            const float u0 = __shfl_down_sync(0xffffffffu, v[p][0], 2), u1 = __shfl_down_sync(0xffffffffu, v[p][1], 2);
            const int64_t j = r0 / 2 + p; /* lane 16 a: gate_j; lane 16 a + 2: up_j */
            if (owner && rr == 0 && 2 * j < N) {
                const float g0 = v[p][0], g1 = v[p][1]; /* silu(g) u as kd_cu_swiglu */
                if (a < M) Y[a * ldc + j] = __float2bfloat16_rn(g0 * (1.f / (1.f + expf(-g0))) * u0);
                if (a + 2 < M) Y[(a + 2) * ldc + j] = __float2bfloat16_rn(g1 * (1.f / (1.f + expf(-g1))) * u1);
            }
        }
    } else if (owner) {
#pragma unroll
        for (int p = 0; p < RP; p++) {
            const int64_t n = r0 + 2 * p + rr;
            if (n >= N) continue;
            if (a < M) store_c(C + a * ldc + n, v[p][0], beta);
            if (a + 2 < M) store_c(C + (a + 2) * ldc + n, v[p][1], beta);
        }
    }
}

template <int RP, int U, bool SPLIT, int MINB, bool SWIGLU = false>
cudaError_t launch_seg(int m, int n, int k, const __nv_bfloat16 *A, int64_t lda, const __nv_bfloat16 *W, int64_t ldw,
                       float beta, float *C, int64_t ldc, cudaStream_t s, __nv_bfloat16 *Y = nullptr) {
    const int64_t rows = SPLIT ? 2 * RP : 16 * RP; /* rows a block */
    const dim3 grid((unsigned)((n + rows - 1) / rows)), block(256);
    return kd_launch_dep(skinny_seg_kernel<RP, U, SPLIT, MINB, SWIGLU>, grid, block, 0, s, m, n, k, A, lda, W, ldw,
                         beta, C, ldc, Y);
}

template <int RW, int U, bool SWIGLU = false, bool COPY = false>
cudaError_t launch_row(int m, int n, int k, const __nv_bfloat16 *A, int64_t lda, const __nv_bfloat16 *W, int64_t ldw,
                       float beta, float *C, int64_t ldc, cudaStream_t s, __nv_bfloat16 *Y = nullptr,
                       const kd_skinny_epi &ep = kd_skinny_epi{}) {
    const dim3 grid((unsigned)((n + 8 * RW - 1) / (8 * RW))), block(256);
    switch (m) {
#define KD_SKINNY_ROW(MT)                                                                                   \
    kd_launch_dep(skinny_row_kernel<MT, RW, U, SWIGLU, COPY>, grid, block, 0, s, m, n, k, A, lda, W, ldw, beta, C, \
                  ldc, Y, ep)
    case 1: return KD_SKINNY_ROW(1);
    case 2: return KD_SKINNY_ROW(2);
    default: return KD_SKINNY_ROW(4);
#undef KD_SKINNY_ROW
    }
}

template <int NW, int U, bool CONTIG>
cudaError_t launch_tc_pair(int m, int kb, const kd_skinny_job &j0, const kd_skinny_job &j1, float beta,
                           const kd_cu_conv_args *conv, cudaStream_t s) {
    const int nb0 = (int)((j0.N + 15) / 16), nb1 = (int)((j1.N + 15) / 16);
    const conv_grid cg = pair_conv_grid(conv, NW * 32);
    kd_cu_conv_args ca = conv ? *conv : kd_cu_conv_args{};
    ca.early = 0; /* the input projection may be the kernel just before */
    const dim3 grid((unsigned)(cg.x * cg.y + nb0 + nb1)), block(NW * 32);
    switch ((m + 7) / 8) {
#define KD_SKINNY_TC2(NT) \
    kd_launch_dep(skinny_tc_pair_kernel<NT, NW, U, CONTIG>, grid, block, 0, s, m, kb, j0, j1, nb0, beta, ca, cg)
    case 1: return KD_SKINNY_TC2(1);
    case 2: return KD_SKINNY_TC2(2);
    case 3: return KD_SKINNY_TC2(3);
    default: return KD_SKINNY_TC2(4);
#undef KD_SKINNY_TC2
    }
}

template <int RW, int U>
cudaError_t launch_row_pair(int m, int k, const kd_skinny_job &j0, const kd_skinny_job &j1, float beta,
                            const kd_cu_conv_args *conv, cudaStream_t s) {
    const int nb0 = (int)((j0.N + 8 * RW - 1) / (8 * RW)), nb1 = (int)((j1.N + 8 * RW - 1) / (8 * RW));
    const conv_grid cg = pair_conv_grid(conv, 256);
    kd_cu_conv_args ca = conv ? *conv : kd_cu_conv_args{};
    ca.early = 0; /* the input projection may be the kernel just before */
    const dim3 grid((unsigned)(cg.x * cg.y + nb0 + nb1)), block(256);
    switch (m) {
#define KD_SKINNY_ROW2(MT) \
    kd_launch_dep(skinny_row_pair_kernel<MT, RW, U>, grid, block, 0, s, m, k, j0, j1, nb0, beta, ca, cg)
    case 1: return KD_SKINNY_ROW2(1);
    case 2: return KD_SKINNY_ROW2(2);
    default: return KD_SKINNY_ROW2(4);
#undef KD_SKINNY_ROW2
    }
}

} // namespace

int kd_cu_skinny_ok(int64_t M, int64_t N, int64_t K, const void *A, int64_t lda, const void *W, int64_t ldw,
                    int max_m) {
    if (max_m > KD_SKINNY_MAX_M) max_m = KD_SKINNY_MAX_M;
    return M >= 1 && M <= max_m && N >= 1 && N < (1ll << 31) && K >= 32 && K < (1ll << 31) && K % 32 == 0 &&
           lda >= K && ldw >= K && lda % 8 == 0 && ldw % 8 == 0 && ((uintptr_t)A & 15) == 0 &&
           ((uintptr_t)W & 15) == 0;
}

int kd_cu_skinny_pick(int64_t M, int64_t N, int64_t K) {
    /* From gemm_bench on the H200 (tests/bench/results/gemm_h200.md), per launch in a graph
     * with the weights out of L2, cuBLAS's nvjet kernels already stream the large products at
     * 3.2-4.3 TB/s; the skinny kernel wins where they cannot fill the machine or a row's
     * loads: K <= 256 (f_proj.1 / g_proj.1 at 48B: 1.68-2.58 vs 2.77-2.85 us at M = 1..32);
     * at M = 1 the split-K row form where N is small and K long (o_proj 5.99 vs cuBLAS 9.28;
     * the down projection 12.84 vs 14.88), the row form up to K = 4096 otherwise (the input
     * projection 15.6 vs 17.4, gate|up 23.0 vs 24.4, the head 166.5 vs 171.9). At M = 2-4 the
     * segment-diagonal tensor-core forms: their cost hardly grows with M, where the row forms'
     * CUDA-core products do (M = 4 on the H200, forms 11 / 12 against cuBLAS: the input
     * projection 15.6 vs 17.5 us, gate|up 23.2 vs 24.5, the head 172.6 vs 173.4, o_proj 7.4 vs
     * 9.2 (form 12, split K), the down projection 13.7 vs 15.0;
     * logs/gemm_seg_h200_tried*.log). */
    if (M < 1 || M > KD_SKINNY_MAX_M) return 0;
    if (K <= 256) return M == 1 ? 5 : 4;
    if (M == 1 && K >= 4096 && N <= 4096) return 9;
    if (M == 1 && K <= 4096) return 5;
    if (M >= 2 && M <= 4) return N <= 4096 && K >= 4096 ? 12 : 11;
    return 0;
}

cudaError_t kd_cu_gemm_skinny_form(int form, int64_t M, int64_t N, int64_t K, const __nv_bfloat16 *A, int64_t lda,
                                   const __nv_bfloat16 *W, int64_t ldw, float beta, float *C, int64_t ldc,
                                   cudaStream_t s) {
    if (!kd_cu_skinny_ok(M, N, K, A, lda, W, ldw, KD_SKINNY_MAX_M) || ldc < N) return cudaErrorInvalidValue;
    const int m = (int)M, n = (int)N, k = (int)K, kb = (int)(K / 32);
    if (form == 0) form = kd_cu_skinny_pick(M, N, K);
    if (form == 0) form = M <= 4 ? 5 : 1;
    if (form >= 5 && M > 4) return cudaErrorInvalidValue;
    switch (form) {
    case 1: return launch_tc<8, 4, false>(m, n, kb, A, lda, W, ldw, beta, C, ldc, s);
    case 2: return launch_tc<8, 2, false>(m, n, kb, A, lda, W, ldw, beta, C, ldc, s);
    case 3: return launch_tc<4, 4, true>(m, n, kb, A, lda, W, ldw, beta, C, ldc, s);
    case 4: return launch_tc<4, 2, false>(m, n, kb, A, lda, W, ldw, beta, C, ldc, s);
    case 5: return launch_row<2, 2>(m, n, k, A, lda, W, ldw, beta, C, ldc, s);
    case 6: return launch_row<1, 4>(m, n, k, A, lda, W, ldw, beta, C, ldc, s);
    case 7: return launch_row<2, 4>(m, n, k, A, lda, W, ldw, beta, C, ldc, s);
    case 8: return launch_row<4, 2>(m, n, k, A, lda, W, ldw, beta, C, ldc, s);
    case 9: return launch_rowk<2, 2>(m, n, k, A, lda, W, ldw, beta, C, ldc, s);
    case 10: return launch_rowk<4, 2>(m, n, k, A, lda, W, ldw, beta, C, ldc, s);
    case 11: return launch_seg<2, 2, false, 1>(m, n, k, A, lda, W, ldw, beta, C, ldc, s);
    case 12: return launch_seg<2, 2, true, 5>(m, n, k, A, lda, W, ldw, beta, C, ldc, s);
    default: return cudaErrorInvalidValue;
    }
}

cudaError_t kd_cu_gemm_skinny_epi(int form, int64_t M, int64_t N, int64_t K, const __nv_bfloat16 *A, int64_t lda,
                                  const __nv_bfloat16 *W, int64_t ldw, float beta, float *C, int64_t ldc,
                                  const kd_skinny_epi *ep, cudaStream_t s) {
    if (!ep || !ep->copy || form != 5 || !kd_cu_skinny_ok(M, N, K, A, lda, W, ldw, KD_SKINNY_MAX_M) || ldc < N ||
        M > 4 || !C || ep->col0 < 0 || ep->ncols < 1 || ep->col0 + ep->ncols > N)
        return cudaErrorInvalidValue;
    return launch_row<2, 2, false, true>((int)M, (int)N, (int)K, A, lda, W, ldw, beta, C, ldc, s, nullptr, *ep);
}

cudaError_t kd_cu_gemm_skinny_swiglu(int form, int64_t M, int64_t FF, int64_t K, const __nv_bfloat16 *A, int64_t lda,
                                     const __nv_bfloat16 *W, int64_t ldw, __nv_bfloat16 *Y, int64_t ldy,
                                     cudaStream_t s) {
    if (M > 4 || FF < 1 || !kd_cu_skinny_ok(M, 2 * FF, K, A, lda, W, ldw, KD_SKINNY_MAX_M) || ldy < FF || !Y)
        return cudaErrorInvalidValue;
    if (form == 0) form = M == 1 ? 5 : 11;
    const int m = (int)M, n = (int)(2 * FF), k = (int)K;
    switch (form) {
    case 5: return launch_row<2, 2, true>(m, n, k, A, lda, W, ldw, 0.f, nullptr, ldy, s, Y);
    case 11: return launch_seg<2, 2, false, 1, true>(m, n, k, A, lda, W, ldw, 0.f, nullptr, ldy, s, Y);
    default: return cudaErrorInvalidValue;
    }
}

cudaError_t kd_cu_gemm_skinny(int64_t M, int64_t N, int64_t K, const __nv_bfloat16 *A, int64_t lda,
                              const __nv_bfloat16 *W, int64_t ldw, float beta, float *C, int64_t ldc,
                              cudaStream_t s) {
    return kd_cu_gemm_skinny_form(0, M, N, K, A, lda, W, ldw, beta, C, ldc, s);
}

namespace {

// kd_cu_gemm_skinny_pair with, where conv is not null, the conv in the same launch.
cudaError_t pair_launch(int form, int64_t M, int64_t K, const kd_skinny_job *j0, const kd_skinny_job *j1, float beta,
                        const kd_cu_conv_args *conv, cudaStream_t s) {
    if (!j0 || !j1 || (conv && (conv->N < 1 || (conv->w && conv->W < 1)))) return cudaErrorInvalidValue;
    for (const kd_skinny_job *j : {j0, j1})
        if (!kd_cu_skinny_ok(M, j->N, K, j->A, j->lda, j->W, j->ldw, KD_SKINNY_MAX_M) || j->ldc < j->N || !j->C)
            return cudaErrorInvalidValue;
    const conv_grid cg = pair_conv_grid(conv, 128); /* the most blocks the conv can take (4-warp blocks) */
    if ((j0->N + 15) / 16 + (j1->N + 15) / 16 + (int64_t)cg.x * cg.y >= (1ll << 31)) return cudaErrorInvalidValue;
    if (form == 0) form = kd_cu_skinny_pick(M, j0->N, K);
    if (form == 0) form = M <= 4 ? 5 : 1;
    if (form >= 5 && M > 4) return cudaErrorInvalidValue;
    const int m = (int)M, k = (int)K, kb = (int)(K / 32);
    switch (form) {
    case 1: return launch_tc_pair<8, 4, false>(m, kb, *j0, *j1, beta, conv, s);
    case 2: return launch_tc_pair<8, 2, false>(m, kb, *j0, *j1, beta, conv, s);
    case 3: return launch_tc_pair<4, 4, true>(m, kb, *j0, *j1, beta, conv, s);
    case 4: return launch_tc_pair<4, 2, false>(m, kb, *j0, *j1, beta, conv, s);
    case 5: return launch_row_pair<2, 2>(m, k, *j0, *j1, beta, conv, s);
    case 6: return launch_row_pair<1, 4>(m, k, *j0, *j1, beta, conv, s);
    case 7: return launch_row_pair<2, 4>(m, k, *j0, *j1, beta, conv, s);
    case 8: return launch_row_pair<4, 2>(m, k, *j0, *j1, beta, conv, s);
    default: return cudaErrorInvalidValue; /* the split-K row forms (9, 10) are not paired */
    }
}

} // namespace

cudaError_t kd_cu_gemm_skinny_pair(int form, int64_t M, int64_t K, const kd_skinny_job *j0, const kd_skinny_job *j1,
                                   float beta, cudaStream_t s) {
    return pair_launch(form, M, K, j0, j1, beta, nullptr, s);
}

cudaError_t kd_cu_gemm_skinny_pair_conv(int form, int64_t M, int64_t K, const kd_skinny_job *j0,
                                        const kd_skinny_job *j1, float beta, const kd_cu_conv_args *conv,
                                        cudaStream_t s) {
    return conv ? pair_launch(form, M, K, j0, j1, beta, conv, s) : cudaErrorInvalidValue;
}
