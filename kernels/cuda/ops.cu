// ops.cu: see ops.cuh. Plain kernels written for correctness against the CPU reference
// (cpu/ops.c), in the same operation order where that is cheap (conv taps, norms with a
// double sum of squares, sigmoid as 1 / (1 + exp(-x))); the fast paths come later.
#include <cuda_bf16.h>
#include <math.h>

#include <atomic>

#include "kernels/cuda/conv.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/ops.cuh"
#include "kernels/cuda/prepare.cuh"

namespace {

constexpr int kBlock = 256;

__device__ __forceinline__ float sigmoid_(float x) { return 1.f / (1.f + expf(-x)); }
// The same with the division by the hardware's reciprocal (2 ulp; gated_rmsnorm_row4's).
__device__ __forceinline__ float sigmoid_rcp_(float x) { return __fdividef(1.f, 1.f + expf(-x)); }
__device__ __forceinline__ float silu_(float x) { return x * sigmoid_(x); }

template <class T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }

// A 1-D grid for n elements with a grid-stride loop (at most 2^20 blocks).
inline unsigned blocks_for(int64_t n) {
    int64_t b = (n + kBlock - 1) / kBlock;
    if (b < 1) b = 1;
    if (b > (1 << 20)) b = 1 << 20;
    return (unsigned)b;
}

// A 2-D grid: x covers `width` columns with kBlock threads each, y the rows (at most 65535
// blocks; kernels loop over the rest).
inline dim3 grid_2d(int64_t width, int64_t rows) {
    const int64_t x = (width + kBlock - 1) / kBlock;
    return dim3((unsigned)(x < 1 ? 1 : x), (unsigned)(rows < 1 ? 1 : rows > 65535 ? 65535 : rows));
}

#define GRID_LOOP(i, n) \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (int64_t)gridDim.x * blockDim.x)

template <class W>
__global__ void embed_kernel(const W *table, const int32_t *tok, int64_t N, int64_t D, float *x) {
    GRID_LOOP(i, N * D) {
        const int64_t t = i / D, c = i % D;
        x[i] = to_f32(table[(int64_t)tok[t] * D + c]);
    }
}

// Block-wide sum of a double (blockDim.x a multiple of 32, at most 1024).
__device__ double block_sum(double v) {
    __shared__ double part[32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
    for (int m = 16; m >= 1; m /= 2) v += __shfl_xor_sync(0xffffffffu, v, m);
    __syncthreads(); // part may still be read by a previous call
    if (lane == 0) part[warp] = v;
    __syncthreads();
    double s = 0;
    const int nw = (int)(blockDim.x + 31) / 32;
    for (int w = 0; w < nw; w++) s += part[w];
    return s;
}

// One block a row. Each thread issues its loads of a pass together (U elements in flight),
// so a row of a few thousand costs one memory round trip a pass, not one per loop trip (at
// M = 1 this kernel was ~9 us, 41 times a step of the 48B preset). The block is sized so that
// its first pass covers rows of up to 1024 kNormU (rmsnorm_threads): that pass's norm weights
// are loaded before the programmatic wait (they are never written) and its inputs stay in
// registers for the output, so at the 48B preset's D = 2304 the kernel waits on memory once
// after the kernel before it, not three times (the weights came from DRAM after the sum).
// The prefetching blocks of a norm's launch (gated_rmsnorm_kernel, rmsnorm_kernel): block `b` of
// `nb` lets the kernel after be scheduled, then bulk-prefetches its share of [pf, pf + bytes) into
// the L2, 16 KiB chunks, chunk c from block c % nb. It neither waits nor reads what the step
// writes; the grid ends once the prefetches have landed.
__device__ __forceinline__ void prefetch_share(const char *pf, int64_t bytes, int64_t b, int64_t nb) {
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    constexpr int64_t kChunk = 16 << 10;
    const int64_t nchunks = (bytes + kChunk - 1) / kChunk;
    for (int64_t c = (int64_t)threadIdx.x * nb + b; c < nchunks; c += (int64_t)blockDim.x * nb) {
        const int64_t o0 = c * kChunk, left = bytes - o0;
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(pf + o0),
                     "r"((uint32_t)(left < kChunk ? left : kChunk))
                     : "memory");
    }
}

constexpr int kNormU = 8;
inline unsigned rmsnorm_threads(int64_t D) {
    const int64_t t = ((D + kNormU - 1) / kNormU + 31) / 32 * 32;
    return (unsigned)(t < 32 ? 32 : t > 1024 ? 1024 : t);
}
// The residual's slices (kd_cu_rmsnorm_add): x[m] += parts[0][m] + ... + parts[np - 1][m], in that
// order, each of the row's elements by the thread that normalizes it (one pass: D <= kNormU x 1024).
struct norm_add {
    float *x;
    const float *parts;
    int np;
    int64_t pstride; // elements from one slice to the next
};

// The kernel's body (rmsnorm_kernel, and rmsnorm_add_wide_kernel for the residual's slices).
template <class Y, bool ADD>
__device__ __forceinline__ void rmsnorm_row(Y *__restrict__ y, const float *__restrict__ x, const int32_t *rows,
                                            int64_t D, const float *__restrict__ w, double eps, unsigned nm,
                                            const char *pf, int64_t pf_bytes, norm_add ad) {
    if (blockIdx.x >= nm) { /* the prefetching blocks (kd_cu_rmsnorm's pf_blocks) */
        prefetch_share(pf, pf_bytes, blockIdx.x - nm, gridDim.x - nm);
        return;
    }
    constexpr int U = kNormU;
    const int64_t m = blockIdx.x, nt = blockDim.x, i0 = threadIdx.x;
    float g0[U], v0[U]; /* the first pass's weights and inputs */
#pragma unroll
    for (int u = 0; u < U; u++) g0[u] = i0 + u * nt < D ? __ldg(w + i0 + u * nt) : 0.f;
    kd_dep_start();
    const float *xr = ADD ? nullptr : x + (rows ? (int64_t)rows[m] : m) * D;
    double ss = 0;
    if (ADD) { /* x is written here: plain loads, then the sums stored back */
        float *xa = ad.x + m * D;
#pragma unroll
        for (int u = 0; u < U; u++) v0[u] = i0 + u * nt < D ? xa[i0 + u * nt] : 0.f;
        for (int p = 0; p < ad.np; p += 2) { /* two slices' loads in flight together, added in order */
            const float *pr = ad.parts + p * ad.pstride + m * D;
            const bool two = p + 1 < ad.np;
            float s0[U], s1[U];
#pragma unroll
            for (int u = 0; u < U; u++) {
                const bool in = i0 + u * nt < D;
                s0[u] = in ? __ldg(pr + i0 + u * nt) : 0.f;
                s1[u] = in && two ? __ldg(pr + ad.pstride + i0 + u * nt) : 0.f;
            }
#pragma unroll
            for (int u = 0; u < U; u++) {
                v0[u] += s0[u];
                if (two) v0[u] += s1[u];
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++)
            if (i0 + u * nt < D) xa[i0 + u * nt] = v0[u];
    } else {
#pragma unroll
        for (int u = 0; u < U; u++) v0[u] = i0 + u * nt < D ? __ldg(xr + i0 + u * nt) : 0.f;
    }
#pragma unroll
    for (int u = 0; u < U; u++) ss += (double)v0[u] * v0[u];
    for (int64_t i1 = i0 + U * nt; !ADD && i1 < D; i1 += U * nt) { /* longer rows: further passes */
        float v[U];
#pragma unroll
        for (int u = 0; u < U; u++) v[u] = i1 + u * nt < D ? __ldg(xr + i1 + u * nt) : 0.f;
#pragma unroll
        for (int u = 0; u < U; u++) ss += (double)v[u] * v[u];
    }
    ss = block_sum(ss);
    const float r = (float)(1.0 / sqrt(ss / (double)D + eps));
    Y *yr = y + m * D;
#pragma unroll
    for (int u = 0; u < U; u++)
        if (i0 + u * nt < D) yr[i0 + u * nt] = from_f32<Y>(v0[u] * r * g0[u]);
    for (int64_t i1 = i0 + U * nt; !ADD && i1 < D; i1 += U * nt) {
        float v[U], g[U];
#pragma unroll
        for (int u = 0; u < U; u++)
            if (i1 + u * nt < D) v[u] = __ldg(xr + i1 + u * nt), g[u] = __ldg(w + i1 + u * nt);
#pragma unroll
        for (int u = 0; u < U; u++)
            if (i1 + u * nt < D) yr[i1 + u * nt] = from_f32<Y>(v[u] * r * g[u]);
    }
}

// Blocks of up to 1024 threads (rmsnorm_threads): at most 64 registers.
template <class Y, bool ADD>
__global__ void __launch_bounds__(1024) rmsnorm_kernel(Y *__restrict__ y, const float *__restrict__ x,
                                                       const int32_t *rows, int64_t D, const float *__restrict__ w,
                                                       double eps, unsigned nm, const char *pf, int64_t pf_bytes,
                                                       norm_add ad) {
    rmsnorm_row<Y, ADD>(y, x, rows, D, w, eps, nm, pf, pf_bytes, ad);
}
// The same for the residual's slices with the registers the compiler chooses (119 at sm_90): both slices'
// loads in flight at once, where the 64-register form loads one slice after the other (measured on an H200:
// 48B steps at 16-128 rows 0.4-0.9 % faster). kd_cu_rmsnorm_add takes it where its blocks fit
// (cudaFuncGetAttributes' maxThreadsPerBlock), the 64-register form for wider rows.
template <class Y>
__global__ void rmsnorm_add_wide_kernel(Y *__restrict__ y, const float *__restrict__ x, const int32_t *rows,
                                        int64_t D, const float *__restrict__ w, double eps, unsigned nm,
                                        const char *pf, int64_t pf_bytes, norm_add ad) {
    rmsnorm_row<Y, true>(y, x, rows, D, w, eps, nm, pf, pf_bytes, ad);
}

template <class Y>
__global__ void copy_cols_kernel(Y *dst, const float *src, int64_t N, int64_t ld, int64_t off, int64_t width) {
    kd_dep_start();
    GRID_LOOP(i, N * width) {
        const int64_t t = i / width, c = i % width;
        dst[i] = from_f32<Y>(src[t * ld + off + c]);
    }
}

// The conv + SiLU alone (conv.cuh; f_proj.1 + g_proj.1's launch may run it instead).
__global__ void __launch_bounds__(kd_conv_block, 4) conv_silu_kernel(const kd_cu_conv_args a) {
    kd_conv_silu_block(a, (int)blockIdx.x, (int)blockIdx.y, (int)gridDim.y);
}

// The conv of the q and k channels and the prepare (kd_cu_conv_prepare), 4 channels a lane in
// 16-byte accesses: warp w of block (x, h) takes token 4 x + w and key head h, lane l the head's
// channels 4 l .. 4 l + 3 of q and of k, and the decays and betas of h's value heads for that
// token. One element a thread (and a block a head), the kernel was bound by issuing its
// instructions, not by memory: 74 % of issue slots busy, 21 % of the DRAM bandwidth, 58 us a
// layer at 512 tokens on an H200 (logs/ncu_full_conv_prepare_b128s3_h200_c7cbea1.txt); here the
// addresses, loads and sums are shared by 4 channels and no barrier is needed. A conv of width 4
// (its 3 history entries: the row's earlier inputs, or the slot's history ring, a 16-byte load
// for 4 channels each). With a.early the conv's loads (the inputs, the token's entry, the
// histories) and beta's are issued before the programmatic wait, and with p.graw_early the first
// value head's gate inputs too. The arithmetic is conv.cuh's and prepare.cuh's, in their order
// (the sums of squares 4 channels a lane, then across the warp, as kd_kda_prepare's): the same
// bits as the conv kernel followed by kd_kda_prepare.
__device__ __forceinline__ float4 ld4(const float *p) { return *(const float4 *)p; }
__device__ __forceinline__ void st4(float *p, float4 v) { *(float4 *)p = v; }
__device__ __forceinline__ float f4at(const float4 &v, int i) {
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

constexpr int kConv4Hw = kd_conv_width_max - 1; /* history entries of a conv of width 4 */

// The conv's loads for NS groups of 4 channels ch[s] .. ch[s] + 3 of token t (entry tk), a conv of
// width 4: the inputs xt[s], then the histories hx[s][i][j] (history j of channel ch[s] + i): the
// row's earlier inputs, or the slot's history ring, whose 4 channels' entries of a position are
// contiguous.
template <int NS>
__device__ __forceinline__ void conv4_load(const kd_cu_conv_args &a, const int64_t (&ch)[NS], int64_t t,
                                           const kd_cu_tok &tk, float4 (&xt)[NS], float (&hx)[NS][4][kConv4Hw]) {
    constexpr int HW = kConv4Hw;
    const int64_t P = a.P, C = 2 * a.QK + a.VD;
#pragma unroll
    for (int s = 0; s < NS; s++) xt[s] = ld4(a.proj + t * P + ch[s]);
#pragma unroll
    for (int j = 0; j < HW; j++) {
        // history j holds the input at row position pos - HW + j
        const int tau = tk.pos - HW + j;
        const float *src = tau >= 0 ? a.proj + ((int64_t)tk.start + tau) * P : a.hist + kd_ring_row(tk, tau, a.R) * C;
#pragma unroll
        for (int s = 0; s < NS; s++) {
            const float4 x = ld4(src + ch[s]);
            hx[s][0][j] = x.x, hx[s][1][j] = x.y, hx[s][2][j] = x.z, hx[s][3][j] = x.w;
        }
    }
}

// From conv4_load's values and the taps tap(s, i) (channel ch[s] + i's 4, the last the current
// input's; from registers or shared memory, each as it is used): y[s][i] the conv + SiLU (conv.cuh's
// order: the same bits); a verify row's inputs go to its records.
template <int NS, typename Taps>
__device__ __forceinline__ void conv4_out(const kd_cu_conv_args &a, const int64_t (&ch)[NS], Taps tap,
                                          const kd_cu_tok &tk, const float4 (&xt)[NS],
                                          const float (&hx)[NS][4][kConv4Hw], float (&y)[NS][4]) {
#pragma unroll
    for (int s = 0; s < NS; s++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const float4 w = tap(s, i);
            float acc = kd_conv_first(w.w, f4at(xt[s], i));
#pragma unroll
            for (int j = 0; j < kConv4Hw; j++) acc = kd_conv_add(acc, f4at(w, j), hx[s][i][j]);
            y[s][i] = kd_silu_(acc);
        }
    if (tk.vring & 1)
#pragma unroll
        for (int s = 0; s < NS; s++)
            st4(a.hist + kd_ring_row(tk, tk.pos, a.R) * (2 * a.QK + a.VD) + ch[s], xt[s]);
}

// The conv of channels [a.c0, C), 4 a thread in 16-byte accesses, G tokens a block row (blocks
// loop over the tokens past 65535 G): the v channels when the conv + prepare kernel takes q and k
// (one channel a thread, that conv was bound by issuing its instructions too: 67 % of issue
// slots, 1.3 TB/s at 512 tokens on an H200). The same bits as kd_cu_conv_silu. With a.early the
// first tokens' loads are issued before the programmatic wait. G = 2 (kd_cu_conv4_form, by size
// past one wave of blocks): each thread's two tokens' loads in flight together and the taps loaded
// once for both; a token a thread ran at 34 % of the issue slots and 25 % of the DRAM bandwidth at
// 512 tokens on an H200, its blocks waiting on their loads
// (logs/ncu_full_conv4_conv_prepare_b128s3_h200_dd18661.txt). Alone under ncu on an H100 at 512
// tokens: 16.0 -> 14.2-14.5 us a launch (tests/bench/results/small_kernels_ab_h100.md).
template <int G>
__global__ void __launch_bounds__(128) conv4_kernel(const kd_cu_conv_args a) {
    const int64_t C = 2 * a.QK + a.VD, c = a.c0 + 4 * ((int64_t)blockIdx.x * blockDim.x + threadIdx.x);
    const bool live = c < C;
    const int64_t ch[1] = {c};
    const float4 z4 = make_float4(0.f, 0.f, 0.f, 0.f);
    float4 tp[1][4];
#pragma unroll
    for (int i = 0; i < 4; i++) tp[0][i] = live ? ld4(a.w + (c + i) * 4) : z4; /* never written */
    if (!a.early) kd_dep_start();
    for (int64_t t0 = (int64_t)blockIdx.y * G; t0 < a.N; t0 += (int64_t)gridDim.y * G) {
        kd_cu_tok tk[G] = {};
        float4 xt[G][1];
        float hx[G][1][4][kConv4Hw] = {};
#pragma unroll
        for (int g = 0; g < G; g++) {
            xt[g][0] = z4;
            if (t0 + g < a.N) {
                tk[g] = a.toks[t0 + g];
                if (live) conv4_load<1>(a, ch, t0 + g, tk[g], xt[g], hx[g]);
            }
        }
        if (a.early && t0 == (int64_t)blockIdx.y * G) kd_dep_start();
#pragma unroll
        for (int g = 0; g < G; g++)
            if (live && t0 + g < a.N) {
                const int64_t t = t0 + g;
                float y[1][4];
                conv4_out<1>(a, ch, [&](int s, int i) { return tp[s][i]; }, tk[g], xt[g], hx[g], y);
                float *dst = c < a.QK ? a.q + t * a.QK + c : c < 2 * a.QK ? a.k + t * a.QK + (c - a.QK)
                                                                         : a.v + t * a.VD + (c - 2 * a.QK);
                st4(dst, make_float4(y[0][0], y[0][1], y[0][2], y[0][3]));
            }
    }
}

// A warp a token and key head, a block 4 tokens of one head. Two forms, the same arithmetic (the same bits):
// SM false holds the head's taps in registers, loaded first (102 registers at sm_90: 4 blocks an SM); SM true
// puts them and the first value head's dt_bias in shared memory by asynchronous copies (no registers held), each
// read as it is used, and fits 64 registers (8 blocks an SM). kd_cu_conv_prepare takes the first where its
// grid fits the device at once, the second past that: at 128 rows (1024 blocks) the first ran in two waves on
// an H200's 132 SMs (13.1 us a layer in the 48B step at 86c77fd, ncu; the second 11.5), while at 64 rows the
// second made the step 0.6-0.9 % slower (a barrier and shared-memory reads on each warp's path).
template <bool SM>
__global__ void __launch_bounds__(128, SM ? 8 : 1)
    conv_prepare_kernel(const kd_cu_conv_args a, const kd_cu_prep_args p) {
    __shared__ __align__(16) float tps[SM ? 2 : 1][SM ? 128 * 4 : 4]; /* [q | k][channel][tap] (K <= 128) */
    __shared__ __align__(16) float dts[SM ? 128 : 4];
    const int h = blockIdx.y, lane = threadIdx.x % 32, K = p.K, H = p.H, HV = p.HV, R = HV / H, hv0 = h * R;
    const int c = 4 * lane;
    const bool live = c < K;
    const int64_t t = (int64_t)blockIdx.x * 4 + threadIdx.x / 32;
    const bool tok = t < a.N;
    const int64_t ch[2] = {(int64_t)h * K + c, a.QK + (int64_t)h * K + c};
    const float4 z4 = make_float4(0.f, 0.f, 0.f, 0.f);
    // taps and dt_bias (never written): in flight before the programmatic wait. tp[s][i]: the 4 taps of
    // channel ch[s] + i, the last the current input's (SM false)
    float4 tp[2][4], dtb0 = z4;
    if constexpr (SM) {
        for (int i = threadIdx.x; i < 2 * K; i += blockDim.x)
            cp_async16(&tps[i / K][i % K * 4], a.w + ((i / K) * a.QK + (int64_t)h * K + i % K) * 4);
        for (int i = threadIdx.x; i < K / 4; i += blockDim.x)
            cp_async16(dts + 4 * i, p.dt_bias + (int64_t)hv0 * K + 4 * i);
        cp_async_commit();
    } else {
#pragma unroll
        for (int s = 0; s < 2; s++)
#pragma unroll
            for (int i = 0; i < 4; i++) tp[s][i] = live ? ld4(a.w + (ch[s] + i) * 4) : z4;
        dtb0 = live ? ld4(p.dt_bias + (int64_t)hv0 * K + c) : z4;
    }
    const bool gearly = a.early && p.graw_early, lt = live && tok;
    float4 gz = z4, xt[2] = {z4, z4};
    float hx[2][4][kConv4Hw] = {}; /* history j of channel ch[s] + i */
    float bz = 0.f;
    kd_cu_tok tk = {0, 0, 0, 0};
    if (!a.early) kd_dep_start();
    const float *grow = p.graw + (t * HV + hv0) * K + c;
    if (gearly && lt) gz = ld4(grow);
    if (tok) {
        tk = a.toks[t];
        if (lane == 0) bz = p.braw[t * p.braw_ld + hv0]; /* the input projection's, like the conv's inputs */
    }
    if (lt) conv4_load<2>(a, ch, t, tk, xt, hx);
    if (a.early) kd_dep_start();
    if (!gearly && lt) gz = ld4(grow);
    if constexpr (SM) {
        cp_async_wait();
        __syncthreads();
    }
    // the conv + SiLU (conv.cuh's order), the records of a verify row's inputs
    float y[2][4] = {};
    if (lt) {
        if constexpr (SM)
            conv4_out<2>(a, ch, [&](int s, int i) { return *(const float4 *)&tps[s][(c + i) * 4]; }, tk, xt, hx, y);
        else
            conv4_out<2>(a, ch, [&](int s, int i) { return tp[s][i]; }, tk, xt, hx, y);
    }
    // decays and betas of the value heads hv0 .. hv0 + R - 1
    for (int r = 0; r < R && tok; r++) {
        const int hv = hv0 + r;
        const float A = expf(p.A_log[hv]);
        if (live) {
            const float4 dtb = r ? ld4(p.dt_bias + (int64_t)hv * K + c) : SM ? *(const float4 *)&dts[c] : dtb0;
            const float4 g = r ? ld4(grow + r * K) : gz;
            const int lb = p.use_lb;
            st4(p.decay + (t * HV + hv) * K + c,
                make_float4(kd_prep_decay(g.x + dtb.x, A, lb, p.lb), kd_prep_decay(g.y + dtb.y, A, lb, p.lb),
                            kd_prep_decay(g.z + dtb.z, A, lb, p.lb), kd_prep_decay(g.w + dtb.w, A, lb, p.lb)));
        }
        if (lane == 0) p.beta[t * HV + hv] = kd_prep_beta(r ? p.braw[t * p.braw_ld + hv] : bz, p.neg);
    }
    // the norms of q and k (prepare.cuh's order: 4 channels a lane, then the warp's butterfly)
    float sq[1] = {0.f}, sk[1] = {0.f}, sqk[1] = {0.f};
    if (lt)
#pragma unroll
        for (int i = 0; i < 4; i++) kd_prep_acc(sq[0], sk[0], sqk[0], y[0][i], y[1][i]);
    kd_prep_warp_sums<1>(sq, sk, sqk);
    if (lt) {
        const float q0 = 0.f + sq[0], k0 = 0.f + sk[0], qk0 = 0.f + sqk[0]; /* the one warp's share, as kd_prep_sums */
        const float iq = kd_prep_qscale(q0, K), ik = kd_prep_kscale(k0);
        const int64_t e = (t * H + h) * K + c;
        st4(p.qn + e, make_float4(y[0][0] * iq, y[0][1] * iq, y[0][2] * iq, y[0][3] * iq));
        st4(p.kn + e, make_float4(y[1][0] * ik, y[1][1] * ik, y[1][2] * ik, y[1][3] * ik));
        if (p.qk && lane == 0) p.qk[t * H + h] = qk0 * iq * ik;
    }
}

// Prefill rows' last min(n, W - 1) inputs into their slots' history rings (kd_cu_fold). Block
// (x, y): 256 channels of rows y, y + gridDim.y, ...
__global__ void conv_ring_fill_kernel(const kd_cu_fold *folds, int n_folds, int64_t C, int W, float *hist, int R,
                                      const float *proj, int64_t P) {
    kd_dep_start();
    const int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    for (int fi = blockIdx.y; fi < n_folds; fi += gridDim.y) {
        const kd_cu_fold f = folds[fi];
        for (int64_t i = f.n > W - 1 ? f.n - (W - 1) : 0; i < f.n; i++)
            hist[((int64_t)f.slot * R + ((int64_t)f.ring + i) % R) * C + c] = proj[((int64_t)f.start + i) * P + c];
    }
}

// One slot's rings <-> export-layout windows ([C][W-1]) of L layers (blockIdx.y the layer).
__global__ void conv_window_kernel(int to_ring, int64_t C, int W, float *hist, int64_t lhist, int R, int32_t slot,
                                   int32_t head, float *win, int64_t lwin) {
    const int64_t Hw = W - 1, i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, l = blockIdx.y;
    if (i >= C * Hw) return;
    const int64_t c = i / Hw, j = i % Hw, at = ((int64_t)head - Hw + j + R) % R;
    float *h = hist + l * lhist + ((int64_t)slot * R + at) * C + c, *w = win + l * lwin + i;
    if (to_ring) *h = *w;
    else *w = *h;
}

// One block per (column tile of 32, value head, prefill row); a thread owns one value
// column of the head's state (K rows in registers). Per token, the block stages q, k and
// the decay in shared memory.
template <int K>
__global__ void __launch_bounds__(32) prefill_kernel(const kd_cu_prow *rows, int H, int HV, int V, float *state,
                                                     int64_t ss, const float *qn, const float *kn, const float *decay,
                                                     const float *beta, const float *v, float *o) {
    __shared__ float sq[K], sk[K], sd[K];
    const kd_cu_prow r = rows[blockIdx.z];
    const int h = blockIdx.y, hk = h / (HV / H);
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    const bool live = j < V;
    float *S = state + (size_t)r.slot * ss + (size_t)h * K * V;
    float st[K];
#pragma unroll
    for (int c = 0; c < K; c++) st[c] = live ? S[(size_t)c * V + j] : 0.f;
    for (int t = 0; t < r.len; t++) {
        const size_t n = (size_t)r.start + t;
        __syncthreads();
        for (int c = threadIdx.x; c < K; c += blockDim.x) {
            sq[c] = qn[(n * H + hk) * K + c];
            sk[c] = kn[(n * H + hk) * K + c];
            sd[c] = decay[(n * HV + h) * K + c];
        }
        __syncthreads();
        const float b = beta[n * HV + h];
        float ks = 0.f;
#pragma unroll
        for (int c = 0; c < K; c++) {
            st[c] *= sd[c];
            ks += sk[c] * st[c];
        }
        const float u = b * ((live ? v[(n * HV + h) * V + j] : 0.f) - ks);
        float os = 0.f;
#pragma unroll
        for (int c = 0; c < K; c++) {
            st[c] += sk[c] * u;
            os += sq[c] * st[c];
        }
        if (live) o[(n * HV + h) * V + j] = os;
    }
    if (live)
#pragma unroll
        for (int c = 0; c < K; c++) S[(size_t)c * V + j] = st[c];
}

// kd_cu_prefill's form 1 (ops.cuh), TPC = 4 threads a column (8 was measured: 2 % faster at one long prompt,
// 7-25 % slower from two, results/prefill_h200.md), CPB = 128 / TPC columns a block: thread t takes
// column j = the stripe's t / TPC, part p = t % TPC, holding rows c = p + TPC i (i < K / TPC) of the
// column; the TPC parts of a column are neighbouring lanes, so their sums join with xor shuffles.
// Threads t < K load the next token's q, k and decay entry c = t, t < CPB its v of column t, t == 32
// its beta; all into registers at the top of a token, stored into the idle half of the double buffer
// after the token's arithmetic, then one barrier.
template <int K>
__global__ void __launch_bounds__(128) prefill4_kernel(const kd_cu_prow *rows, int H, int HV, int V, float *state,
                                                       int64_t ss, const float *qn, const float *kn,
                                                       const float *decay, const float *beta, const float *v,
                                                       float *o) {
    constexpr int TPC = 4, KP = K / TPC, CPB = 128 / TPC;
    static_assert(K % (2 * TPC) == 0 && K <= 128,
                  "K / TPC rows a thread, in pairs; q, k and decay loaded a thread an entry");
    __shared__ float sq[2][K], sk[2][K], sd[2][K], sv[2][CPB], sb[2];
    const kd_cu_prow r = rows[blockIdx.z];
    const int h = blockIdx.y, hk = h / (HV / H);
    /* lane & (TPC - 1), not tid % TPC: known non-negative, the indexing stays in 32-bit shifts (the signed
     * form cost 34 more registers and ~1.5 x the time at K = 128) */
    const int tid = threadIdx.x, lane = tid & 31, p = lane & (TPC - 1);
    const int j0 = blockIdx.x * CPB, jl = (tid >> 5) * (32 / TPC) + lane / TPC, j = j0 + jl;
    const bool live = j < V;
    float *S = state + (size_t)r.slot * ss + (size_t)h * K * V;
    float st[KP];
#pragma unroll
    for (int i = 0; i < KP; i++) st[i] = live ? S[(size_t)(p + TPC * i) * V + j] : 0.f;
    /* the next token's inputs, in registers until the buffer half they go to is idle */
    float a = 0.f, b = 0.f, c = 0.f, va = 0.f, bb = 0.f;
    auto fetch_all = [&](size_t n) {
        if (tid < K) {
            a = qn[(n * H + hk) * K + tid];
            b = kn[(n * H + hk) * K + tid];
            c = decay[(n * HV + h) * K + tid];
        }
        if (tid < CPB) va = j0 + tid < V ? v[(n * HV + h) * V + j0 + tid] : 0.f;
        if (tid == 32) bb = beta[n * HV + h];
    };
    auto store_all = [&](int buf) {
        if (tid < K) sq[buf][tid] = a, sk[buf][tid] = b, sd[buf][tid] = c;
        if (tid < CPB) sv[buf][tid] = va;
        if (tid == 32) sb[buf] = bb;
    };
    if (r.len > 0) {
        fetch_all((size_t)r.start);
        store_all(0);
    }
    __syncthreads();
    for (int t = 0; t < r.len; t++) {
        const int cur = t & 1;
        const size_t n = (size_t)r.start + t;
        if (t + 1 < r.len) fetch_all(n + 1);
        const float *q_ = sq[cur], *k_ = sk[cur], *d_ = sd[cur];
        float k0 = 0.f, k1 = 0.f;
#pragma unroll
        for (int i = 0; i < KP; i += 2) { /* KP is even: two chains */
            const int c0 = p + TPC * i, c1 = c0 + TPC;
            st[i] *= d_[c0];
            st[i + 1] *= d_[c1];
            k0 += k_[c0] * st[i];
            k1 += k_[c1] * st[i + 1];
        }
        float ks = k0 + k1;
#pragma unroll
        for (int m = 1; m < TPC; m <<= 1) ks += __shfl_xor_sync(0xffffffffu, ks, m);
        const float u = sb[cur] * (sv[cur][jl] - ks);
        float o0 = 0.f, o1 = 0.f;
#pragma unroll
        for (int i = 0; i < KP; i += 2) {
            const int c0 = p + TPC * i, c1 = c0 + TPC;
            st[i] += k_[c0] * u;
            st[i + 1] += k_[c1] * u;
            o0 += q_[c0] * st[i];
            o1 += q_[c1] * st[i + 1];
        }
        float os = o0 + o1;
#pragma unroll
        for (int m = 1; m < TPC; m <<= 1) os += __shfl_xor_sync(0xffffffffu, os, m);
        if (live && p == 0) o[(n * HV + h) * V + j] = os;
        if (t + 1 < r.len) store_all(cur ^ 1);
        __syncthreads();
    }
    if (live)
#pragma unroll
        for (int i = 0; i < KP; i++) S[(size_t)(p + TPC * i) * V + j] = st[i];
}

__device__ __forceinline__ float4 ldg4(const float *p) { return __ldg((const float4 *)p); }
__device__ __forceinline__ void st4(__nv_bfloat16 *p, float4 v) { /* 4 outputs in bf16: one 8-byte store */
    __nv_bfloat162 x[2] = {__floats2bfloat162_rn(v.x, v.y), __floats2bfloat162_rn(v.z, v.w)};
    *(uint2 *)p = *(const uint2 *)x;
}
template <class Y>
__device__ __forceinline__ bool aligned16(const float *o, const float *gate, const float *bias, const float *w,
                                          const Y *y) {
    return (((uintptr_t)o | (uintptr_t)gate | (uintptr_t)bias | (uintptr_t)w) & 15) == 0 &&
           ((uintptr_t)y & (4 * sizeof(Y) - 1)) == 0;
}
// A row of V <= 128 (V % 4 == 0, 16-byte aligned rows) of gated_rmsnorm_kernel: lane l the channels 4 l .. 4 l + 3,
// each of o, the gate, the bias and w in one 16-byte load, y in one store. The loop below (V up to 32 x 8 a round,
// a lane's channels 32 apart, 4-byte accesses and guards for the 8) issued 580 instructions a warp at 128 channels
// (ncu, an H100), which kept an H200 61 % busy issuing (logs/ncu_full_conv4_conv_prepare_b128s3_h200_dd18661.txt);
// this form 314. Alone under ncu on an H100 a launch at 512 rows took 21.0 -> 14.0 us, at 128 rows 7.7 -> 6.1 us
// (tests/bench/results/small_kernels_ab_h100.md). The same arithmetic: the sum of squares in double (the lane's 4
// in order, then the warp's butterfly), r from it in double as kd_gated_rmsnorm on the CPU (by rsqrt: 1 / sqrt in
// double, a division and a square root, took ~50 of the 314 instructions), y = o r w sigmoid(gate + bias), the
// sigmoid's division by the hardware's reciprocal (2 ulp): 314 -> 274 instructions a warp, under ncu on an H200
// 5.79 -> 5.50 us a launch at 128 rows and 13.9 -> 12.5 us at 512 (tests/bench/results/small_kernels2_ab_h200.md).
template <class Y>
__device__ __forceinline__ void gated_rmsnorm_row4(Y *yt, const float *ot, const float *gt, const float *bt,
                                                   const float *w, int V, double eps, int lane, bool live,
                                                   int gate_early) {
    const int i = 4 * lane;
    const bool mine = live && i < V;
    float4 g = make_float4(0.f, 0.f, 0.f, 0.f), b = g, ww = g, v = g;
    if (gate_early && mine) g = ldg4(gt + i), b = ldg4(bt + i), ww = ldg4(w + i);
    kd_dep_start();
    if (!live) return;
    if (mine) {
        v = ldg4(ot + i);
        if (!gate_early) g = ldg4(gt + i), b = ldg4(bt + i), ww = ldg4(w + i);
    }
    double ss = (double)v.x * v.x;
    ss += (double)v.y * v.y;
    ss += (double)v.z * v.z;
    ss += (double)v.w * v.w;
#pragma unroll
    for (int m = 16; m >= 1; m /= 2) ss += __shfl_xor_sync(0xffffffffu, ss, m);
    const float r = (float)rsqrt(ss / (double)V + eps);
    if (mine)
        st4(yt + i, make_float4(v.x * r * ww.x * sigmoid_rcp_(g.x + b.x), v.y * r * ww.y * sigmoid_rcp_(g.y + b.y),
                                 v.z * r * ww.z * sigmoid_rcp_(g.z + b.z), v.w * r * ww.w * sigmoid_rcp_(g.w + b.w)));
}
// One warp per (token, value head). The blocks from nb on (kd_cu_gated_rmsnorm's pf_blocks)
// only prefetch [pf, pf + pf_bytes) into the L2, 16 KiB a bulk prefetch, chunk c from block
// nb + c % pf_blocks: they neither wait nor read anything the step writes (the weights are never
// written), so they start with the kernel before (its programmatic dependent) and the grid ends
// once the others have and the prefetches have landed. With gate_early (and V <= 256) the gate,
// bias and weights are loaded before the programmatic wait: the gate must then have been written
// two or more kernels back (launch.cuh; the backend's comes from g_proj.1, before the KDA kernels).
// Value heads of up to 128 channels (V % 4 == 0, 16-byte aligned arrays) go to gated_rmsnorm_row4.
template <class Y>
__global__ void gated_rmsnorm_kernel(Y *y, const float *o, const float *gate, const float *bias, const float *w,
                                     int64_t NH, int HV, int V, double eps, unsigned nb, const char *pf,
                                     int64_t pf_bytes, int gate_early) {
    if (blockIdx.x >= nb) {
        prefetch_share(pf, pf_bytes, blockIdx.x - nb, gridDim.x - nb);
        return;
    }
    const int64_t th = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    constexpr int U = 8;
    const bool live = th < NH, pre = gate_early && V <= 32 * U;
    const int h = (int)(th % HV);
    const float *ot = o + th * V, *gt = gate + th * V, *bt = bias + (int64_t)h * V;
    if (V <= 128 && V % 4 == 0 && aligned16(o, gate, bias, w, y)) {
        gated_rmsnorm_row4(y + th * V, ot, gt, bt, w, V, eps, lane, live, gate_early);
        return;
    }
    float g[U], b[U], ww[U]; /* with pre: the whole row's, before the wait */
    if (pre && live)
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int i = lane + 32 * u;
            if (i < V) g[u] = __ldg(gt + i), b[u] = __ldg(bt + i), ww[u] = __ldg(w + i);
        }
    kd_dep_start();
    if (!live) return;
    // loads first (up to U per lane in flight), as in rmsnorm_kernel
    double ss = 0;
    for (int i0 = lane; i0 < V; i0 += 32 * U) {
        float v[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int i = i0 + 32 * u;
            if (i < V) {
                v[u] = __ldg(ot + i);
                if (!pre) g[u] = __ldg(gt + i), b[u] = __ldg(bt + i), ww[u] = __ldg(w + i);
            } else {
                v[u] = 0.f;
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++) ss += (double)v[u] * v[u];
        if (i0 == lane && V <= 32 * U) { // the whole row is in registers: finish here
#pragma unroll
            for (int m = 16; m >= 1; m /= 2) ss += __shfl_xor_sync(0xffffffffu, ss, m);
            const float r = (float)(1.0 / sqrt(ss / (double)V + eps));
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int i = i0 + 32 * u;
                if (i < V) y[th * V + i] = from_f32<Y>(v[u] * r * ww[u] * sigmoid_(g[u] + b[u]));
            }
            return;
        }
    }
#pragma unroll
    for (int m = 16; m >= 1; m /= 2) ss += __shfl_xor_sync(0xffffffffu, ss, m);
    const float r = (float)(1.0 / sqrt(ss / (double)V + eps));
    for (int i = lane; i < V; i += 32) y[th * V + i] = from_f32<Y>(ot[i] * r * w[i] * sigmoid_(gt[i] + bt[i]));
}

// Gate and up of column c of a token's row (interleaved: gate c, up c, gate c + 1, ...), fp32 or bf16.
__device__ __forceinline__ float2 gu_at(const float *row, int64_t c) { return make_float2(row[2 * c], row[2 * c + 1]); }
__device__ __forceinline__ float2 gu_at(const __nv_bfloat16 *row, int64_t c) {
    return __bfloat1622float2(*(const __nv_bfloat162 *)(row + 2 * c));
}

// Grid: x over columns, y over tokens.
template <class Y, class G>
__global__ void swiglu_kernel(Y *y, const G *gu, int64_t N, int64_t FF) {
    kd_dep_start();
    const int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= FF) return;
    for (int64_t t = blockIdx.y; t < N; t += gridDim.y) {
        const float2 g = gu_at(gu + t * 2 * FF, c);
        y[t * FF + c] = from_f32<Y>(silu_(g.x) * g.y);
    }
}

// The same, 4 columns a thread (FF a multiple of 4, gu 16-byte and y 4-element aligned): 16-byte
// loads (two of fp32 gate|up, one of bf16) and one store of 4 outputs, so each thread has 4 times the
// bytes in flight (the one-column kernel streamed gate|up's outputs at 1.5 TB/s at 512 tokens on an
// H200: tests/bench/results/logs/ncu_kernels_b32s0_b128s3_h200_c0f9772.txt). The same arithmetic for
// every element.
template <class Y> struct Out4;
template <> struct Out4<float> {
    typedef float4 T;
    static __device__ __forceinline__ float4 make(float a, float b, float c, float d) {
        return make_float4(a, b, c, d);
    }
};
template <> struct Out4<__nv_bfloat16> {
    struct __align__(8) T {
        __nv_bfloat162 lo, hi;
    };
    static __device__ __forceinline__ T make(float a, float b, float c, float d) {
        T o;
        o.lo.x = __float2bfloat16_rn(a), o.lo.y = __float2bfloat16_rn(b);
        o.hi.x = __float2bfloat16_rn(c), o.hi.y = __float2bfloat16_rn(d);
        return o;
    }
};

// Gate and up of columns c .. c + 3 (p: the row at column c).
__device__ __forceinline__ void gu4_at(const float *p, float2 (&g)[4]) {
    const float4 a = ((const float4 *)p)[0], b = ((const float4 *)p)[1];
    g[0] = make_float2(a.x, a.y), g[1] = make_float2(a.z, a.w);
    g[2] = make_float2(b.x, b.y), g[3] = make_float2(b.z, b.w);
}
__device__ __forceinline__ void gu4_at(const __nv_bfloat16 *p, float2 (&g)[4]) {
    const uint4 r = *(const uint4 *)p;
    g[0] = __bfloat1622float2(*(const __nv_bfloat162 *)&r.x), g[1] = __bfloat1622float2(*(const __nv_bfloat162 *)&r.y);
    g[2] = __bfloat1622float2(*(const __nv_bfloat162 *)&r.z), g[3] = __bfloat1622float2(*(const __nv_bfloat162 *)&r.w);
}

template <class Y, class G>
__global__ void swiglu4_kernel(Y *y, const G *gu, int64_t N, int64_t FF) {
    kd_dep_start();
    const int64_t c = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * 4;
    if (c >= FF) return;
    for (int64_t t = blockIdx.y; t < N; t += gridDim.y) {
        float2 g[4];
        gu4_at(gu + t * 2 * FF + 2 * c, g);
        *(typename Out4<Y>::T *)(y + t * FF + c) = Out4<Y>::make(silu_(g[0].x) * g[0].y, silu_(g[1].x) * g[1].y,
                                                                 silu_(g[2].x) * g[2].y, silu_(g[3].x) * g[3].y);
    }
}

} // namespace

cudaError_t kd_cu_embed(int table_bf16, const void *table, const int32_t *tok, int64_t N, int64_t D, float *x,
                        cudaStream_t s) {
    if (N <= 0) return cudaSuccess;
    if (table_bf16)
        embed_kernel<<<blocks_for(N * D), kBlock, 0, s>>>((const __nv_bfloat16 *)table, tok, N, D, x);
    else
        embed_kernel<<<blocks_for(N * D), kBlock, 0, s>>>((const float *)table, tok, N, D, x);
    return cudaGetLastError();
}

// A norm's prefetching blocks (prefetch_share): their count, or -1 for bad arguments.
static int64_t prefetch_blocks(const void *pf, int64_t pf_bytes, int pf_blocks) {
    if (pf_bytes < 0 || pf_blocks < 0 || pf_blocks > 1024 || (pf_bytes > 0 && (!pf || ((uintptr_t)pf & 15))) ||
        (pf_bytes & 15))
        return -1;
    return pf_bytes > 0 ? pf_blocks : 0;
}

// The most threads a block of kernel f may have (its registers), 0 where the runtime does not say.
static int max_threads(const void *f) {
    cudaFuncAttributes at;
    return cudaFuncGetAttributes(&at, f) == cudaSuccess ? at.maxThreadsPerBlock : 0;
}

cudaError_t kd_cu_rmsnorm(int out_bf16, void *y, const float *x, const int32_t *rows, int64_t M, int64_t D,
                          const float *w, double eps, cudaStream_t s, const void *pf, int64_t pf_bytes, int pf_blocks) {
    if (M <= 0) return cudaSuccess;
    const int64_t pb = prefetch_blocks(pf, pf_bytes, pf_blocks);
    if (pb < 0 || M + pb > 0x7fffffff) return cudaErrorInvalidValue;
    const dim3 block(rmsnorm_threads(D)), grid((unsigned)(M + pb));
    const norm_add none = {nullptr, nullptr, 0, 0};
    if (out_bf16)
        return kd_launch_dep(rmsnorm_kernel<__nv_bfloat16, false>, grid, block, 0, s, (__nv_bfloat16 *)y, x, rows, D,
                             w, eps, (unsigned)M, (const char *)pf, pf_bytes, none);
    return kd_launch_dep(rmsnorm_kernel<float, false>, grid, block, 0, s, (float *)y, x, rows, D, w, eps, (unsigned)M,
                         (const char *)pf, pf_bytes, none);
}

cudaError_t kd_cu_rmsnorm_add(int out_bf16, void *y, float *x, const float *parts, int np, int64_t M, int64_t D,
                              const float *w, double eps, cudaStream_t s, const void *pf, int64_t pf_bytes,
                              int pf_blocks) {
    if (M <= 0) return cudaSuccess;
    const int64_t pb = prefetch_blocks(pf, pf_bytes, pf_blocks);
    if (pb < 0 || M + pb > 0x7fffffff || !x || !parts || np < 1 || np > KD_NORM_ADD_MAX || D < 1 ||
        D > KD_NORM_ADD_MAX_D)
        return cudaErrorInvalidValue;
    const dim3 block(rmsnorm_threads(D)), grid((unsigned)(M + pb));
    const norm_add ad = {x, parts, np, M * D};
    /* x is read through ad.x alone (the kernel's x, restrict-qualified and read-only, unused) */
    if (out_bf16) {
        static const int wide = max_threads((const void *)rmsnorm_add_wide_kernel<__nv_bfloat16>);
        return kd_launch_dep((int)block.x <= wide ? rmsnorm_add_wide_kernel<__nv_bfloat16>
                                                  : rmsnorm_kernel<__nv_bfloat16, true>,
                             grid, block, 0, s, (__nv_bfloat16 *)y, (const float *)nullptr, (const int32_t *)nullptr,
                             D, w, eps, (unsigned)M, (const char *)pf, pf_bytes, ad);
    }
    static const int wide = max_threads((const void *)rmsnorm_add_wide_kernel<float>);
    return kd_launch_dep((int)block.x <= wide ? rmsnorm_add_wide_kernel<float> : rmsnorm_kernel<float, true>, grid,
                         block, 0, s, (float *)y, (const float *)nullptr, (const int32_t *)nullptr, D, w, eps,
                         (unsigned)M, (const char *)pf, pf_bytes, ad);
}

cudaError_t kd_cu_copy_cols(int out_bf16, void *dst, const float *src, int64_t N, int64_t ld, int64_t off,
                            int64_t width, cudaStream_t s) {
    if (N <= 0 || width <= 0) return cudaSuccess;
    if (out_bf16)
        return kd_launch_dep(copy_cols_kernel<__nv_bfloat16>, dim3(blocks_for(N * width)), dim3(kBlock), 0, s,
                             (__nv_bfloat16 *)dst, src, N, ld, off, width);
    return kd_launch_dep(copy_cols_kernel<float>, dim3(blocks_for(N * width)), dim3(kBlock), 0, s, (float *)dst, src, N,
                         ld, off, width);
}

cudaError_t kd_cu_conv_silu(const float *proj, int64_t P, int64_t N, int64_t QK, int64_t VD, const kd_cu_tok *toks,
                            float *hist, int R, const float *w, int W, float *q, float *k, float *v, cudaStream_t s) {
    const kd_cu_conv_args a = {proj, P, N, QK, VD, toks, hist, R, w, W, q, k, v, 0, 0, 0};
    return kd_cu_conv_silu_args(&a, s);
}

cudaError_t kd_cu_conv_silu_args(const kd_cu_conv_args *a, cudaStream_t s) {
    const int64_t C = 2 * a->QK + a->VD;
    if (a->N <= 0) return cudaSuccess;
    if ((a->w && (a->W < 1 || a->R < a->W - 1)) || a->c0 < 0 || a->c1 < 0 || a->c1 > C) return cudaErrorInvalidValue;
    if (a->c0 >= (a->c1 ? a->c1 : C)) return cudaSuccess; /* no channel */
    unsigned gx = 0, gy = 0;
    kd_conv_grid(*a, kd_conv_block, &gx, &gy);
    return kd_launch_dep(conv_silu_kernel, dim3(gx, gy), dim3(kd_conv_block), 0, s, *a);
}

static bool al16(const void *p) { return ((uintptr_t)p & 15) == 0; }

// How many blocks of the conv + prepare kernel's register form (which 0) or of the v conv's form of a token a thread
// (1) the current device holds at once (blocks an SM x SMs), each device's first answer kept (0 where the runtime
// does not say).
static int64_t blocks_fit(int which) {
    constexpr int kDevs = 64;
    static std::atomic<int64_t> known[2][kDevs]; /* forwards of backends on other threads may ask at once */
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0) return 0;
    if (dev < kDevs) {
        const int64_t k = known[which][dev].load(std::memory_order_relaxed);
        if (k > 0) return k;
    }
    int per_sm = 0, sms = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, which ? (const void *)conv4_kernel<1>
                                                                     : (const void *)conv_prepare_kernel<false>,
                                                      128, 0) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
        return 0;
    const int64_t n = (int64_t)per_sm * sms;
    if (dev < kDevs) known[which][dev].store(n, std::memory_order_relaxed);
    return n;
}

int kd_cu_conv_prepare_ok(const kd_cu_conv_args *a, const kd_cu_prep_args *p) {
    const int64_t C = 2 * a->QK + a->VD;
    return p->K >= 4 && p->K <= 128 && p->K % 4 == 0 && p->H >= 1 && p->H <= 65535 && p->HV % p->H == 0 &&
           a->QK == (int64_t)p->H * p->K && a->w && a->W == kd_conv_width_max && a->R >= a->W - 1 && a->P % 4 == 0 &&
           C % 4 == 0 && al16(a->proj) && al16(a->hist) && al16(a->w) && al16(p->graw) &&
           al16(p->dt_bias) && al16(p->decay) && al16(p->qn) && al16(p->kn) && a->c0 == 0 && a->c1 == 0;
}

int kd_cu_conv4_ok(const kd_cu_conv_args *a) {
    const int64_t C = 2 * a->QK + a->VD;
    return a->w && a->W == kd_conv_width_max && a->R >= a->W - 1 && a->c0 >= 0 && a->c0 % 4 == 0 && a->c0 < C &&
           (a->c1 == 0 || a->c1 == C) && C % 4 == 0 && a->QK % 4 == 0 && a->P % 4 == 0 && al16(a->proj) &&
           al16(a->hist) && al16(a->w) && al16(a->q) && al16(a->k) && al16(a->v);
}

cudaError_t kd_cu_conv4_form(const kd_cu_conv_args *a, int form, cudaStream_t s) {
    if (a->N <= 0) return cudaSuccess;
    if (!kd_cu_conv4_ok(a) || form < 0 || form > 2) return cudaErrorInvalidValue;
    const int64_t C = 2 * a->QK + a->VD, x = ((C - a->c0) / 4 + 127) / 128;
    /* by size: two tokens a thread once a token a thread takes more than one wave of blocks */
    const int g = form ? form : x * a->N > blocks_fit(1) ? 2 : 1;
    const int64_t rows = (a->N + g - 1) / g, y = rows < 65535 ? rows : 65535;
    return kd_launch_dep(g == 2 ? conv4_kernel<2> : conv4_kernel<1>, dim3((unsigned)x, (unsigned)y), dim3(128), 0, s,
                         *a);
}

cudaError_t kd_cu_conv4(const kd_cu_conv_args *a, cudaStream_t s) { return kd_cu_conv4_form(a, 0, s); }

cudaError_t kd_cu_conv_prepare_form(const kd_cu_conv_args *conv, const kd_cu_prep_args *p, int form,
                                    cudaStream_t s) {
    if (conv->N <= 0) return cudaSuccess;
    if (!kd_cu_conv_prepare_ok(conv, p) || form < 0 || form > 2) return cudaErrorInvalidValue;
    const int64_t blocks = (conv->N + 3) / 4; /* a token a warp */
    if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
    const dim3 grid((unsigned)blocks, (unsigned)p->H);
    if (form == 1 || (form == 0 && blocks * p->H <= blocks_fit(0)))
        return kd_launch_dep(conv_prepare_kernel<false>, grid, dim3(128), 0, s, *conv, *p);
    return kd_launch_dep(conv_prepare_kernel<true>, grid, dim3(128), 0, s, *conv, *p);
}

cudaError_t kd_cu_conv_prepare(const kd_cu_conv_args *conv, const kd_cu_prep_args *p, cudaStream_t s) {
    return kd_cu_conv_prepare_form(conv, p, 0, s);
}

cudaError_t kd_cu_conv_ring_fill(const kd_cu_fold *folds, int n_folds, int64_t C, int W, float *hist, int R,
                                 const float *proj, int64_t P, cudaStream_t s) {
    if (n_folds <= 0 || C <= 0 || W <= 1) return cudaSuccess;
    if ((C + kBlock - 1) / kBlock > 0x7fffffff || R < W - 1) return cudaErrorInvalidValue;
    const dim3 grid((unsigned)((C + kBlock - 1) / kBlock), (unsigned)(n_folds > 65535 ? 65535 : n_folds));
    return kd_launch_dep(conv_ring_fill_kernel, grid, dim3(kBlock), 0, s, folds, n_folds, C, W, hist, R, proj, P);
}

cudaError_t kd_cu_conv_window(int to_ring, int L, int64_t C, int W, float *hist, int64_t lhist, int R, int32_t slot,
                              int32_t head, float *win, int64_t lwin, cudaStream_t s) {
    if (L <= 0 || C <= 0 || W <= 1) return cudaSuccess;
    const int64_t blocks = (C * (W - 1) + kBlock - 1) / kBlock;
    if (blocks > 0x7fffffff || L > 65535 || R < W - 1 || head < 0 || head >= R || slot < 0)
        return cudaErrorInvalidValue;
    conv_window_kernel<<<dim3((unsigned)blocks, (unsigned)L), kBlock, 0, s>>>(to_ring, C, W, hist, lhist, R, slot, head,
                                                                               win, lwin);
    return cudaGetLastError();
}

static std::atomic<int> g_prefill_form{3};

int kd_cu_prefill_form(int form) {
    if (form != 0 && form != 1 && form != 3) return g_prefill_form.load();
    return g_prefill_form.exchange(form);
}

template <int K>
static void launch_prefill(int form, dim3 grid, cudaStream_t s, const kd_cu_prow *rows, int H, int HV, int V,
                           float *state, int64_t ss, const float *qn, const float *kn, const float *decay,
                           const float *beta, const float *v, float *o) {
    if (form == 1)
        prefill4_kernel<K><<<grid, 128, 0, s>>>(rows, H, HV, V, state, ss, qn, kn, decay, beta, v, o);
    else
        prefill_kernel<K><<<grid, 32, 0, s>>>(rows, H, HV, V, state, ss, qn, kn, decay, beta, v, o);
}

cudaError_t kd_cu_prefill(const kd_cu_prow *rows, int n_rows, int n_chunks, int H, int HV, int K, int V,
                          float *state, int64_t state_stride, const float *qn, const float *kn, const float *decay,
                          const float *beta, const float *v, float *o, float *work, cudaStream_t s) {
    if (n_rows <= 0) return cudaSuccess;
    if (n_rows > 65535 || HV > 65535 || H < 1 || HV % H) return cudaErrorInvalidValue;
    const dim3 grid((unsigned)((V + 31) / 32), (unsigned)HV, (unsigned)n_rows);
    const int form = g_prefill_form.load(std::memory_order_relaxed);
    if (form == 3 && V % 2 == 0)
        return (cudaError_t)kd_kda_prefill(rows, n_rows, n_chunks, H, HV, K, V, state, state_stride, qn, kn, decay,
                                           beta, v, o, work, s);
    switch (K) {
    case 32: launch_prefill<32>(form, grid, s, rows, H, HV, V, state, state_stride, qn, kn, decay, beta, v, o); break;
    case 64: launch_prefill<64>(form, grid, s, rows, H, HV, V, state, state_stride, qn, kn, decay, beta, v, o); break;
    case 128: launch_prefill<128>(form, grid, s, rows, H, HV, V, state, state_stride, qn, kn, decay, beta, v, o); break;
    default: return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

cudaError_t kd_cu_gated_rmsnorm(int out_bf16, void *y, const float *o, const float *gate, const float *bias,
                                const float *w, int64_t N, int HV, int V, double eps, cudaStream_t s,
                                const void *pf, int64_t pf_bytes, int pf_blocks, int gate_early) {
    const int64_t NH = N * HV;
    if (NH <= 0) return cudaSuccess;
    const int64_t blocks = (NH + 3) / 4, pb = prefetch_blocks(pf, pf_bytes, pf_blocks);
    if (pb < 0 || blocks + pb > 0x7fffffff) return cudaErrorInvalidValue;
    const dim3 grid((unsigned)(blocks + pb));
    if (out_bf16)
        return kd_launch_dep(gated_rmsnorm_kernel<__nv_bfloat16>, grid, dim3(128), 0, s, (__nv_bfloat16 *)y, o, gate,
                             bias, w, NH, HV, V, eps, (unsigned)blocks, (const char *)pf, pf_bytes, gate_early);
    return kd_launch_dep(gated_rmsnorm_kernel<float>, grid, dim3(128), 0, s, (float *)y, o, gate, bias, w, NH, HV, V,
                         eps, (unsigned)blocks, (const char *)pf, pf_bytes, gate_early);
}

template <class G>
static cudaError_t swiglu_launch(int out_bf16, void *y, const G *gu, int64_t N, int64_t FF, cudaStream_t s) {
    if (N <= 0) return cudaSuccess;
    if (FF % 4 == 0 && (uintptr_t)gu % 16 == 0 && (uintptr_t)y % (out_bf16 ? 8 : 16) == 0) {
        if (out_bf16)
            return kd_launch_dep(swiglu4_kernel<__nv_bfloat16, G>, grid_2d(FF / 4, N), dim3(kBlock), 0, s,
                                 (__nv_bfloat16 *)y, gu, N, FF);
        return kd_launch_dep(swiglu4_kernel<float, G>, grid_2d(FF / 4, N), dim3(kBlock), 0, s, (float *)y, gu, N, FF);
    }
    if (out_bf16)
        return kd_launch_dep(swiglu_kernel<__nv_bfloat16, G>, grid_2d(FF, N), dim3(kBlock), 0, s, (__nv_bfloat16 *)y,
                             gu, N, FF);
    return kd_launch_dep(swiglu_kernel<float, G>, grid_2d(FF, N), dim3(kBlock), 0, s, (float *)y, gu, N, FF);
}

cudaError_t kd_cu_swiglu(int out_bf16, void *y, const float *gu, int64_t N, int64_t FF, cudaStream_t s) {
    return swiglu_launch(out_bf16, y, gu, N, FF, s);
}

cudaError_t kd_cu_swiglu_h(__nv_bfloat16 *y, const __nv_bfloat16 *gu, int64_t N, int64_t FF, cudaStream_t s) {
    return swiglu_launch(1, y, gu, N, FF, s);
}

namespace {

constexpr int kPrefetchBlocks = 32;

__global__ void __launch_bounds__(kBlock) l2_prefetch_kernel(const char *p, int64_t bytes, int mode, uint32_t *sink) {
    const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, nt = (int64_t)gridDim.x * blockDim.x;
    if (mode == 1) {
        for (int64_t o = t * 128; o < bytes; o += nt * 128) asm volatile("prefetch.global.L2 [%0];" ::"l"(p + o));
    } else if (mode == 2) {
        /* thread t issues chunk t: a step's chunks come from the first few blocks, so a few SMs'
         * copy engines (about 0.17 TB/s each) prefetch: measured, that trickle is what helps. The
         * same chunks spread over 128 SMs (3-4 TB/s) flood the memory while the KDA kernels run and
         * slow them more than the products gain: 1.822 vs 1.803 ms a B = 1 step without prefetch,
         * against 1.788 for this form (logs/cuda_bench_h200_prefetch_spread_tried.log) */
        constexpr int64_t kChunk = 16 << 10;
        for (int64_t o = t * kChunk; o < bytes; o += nt * kChunk) {
            const uint32_t n = (uint32_t)(bytes - o < kChunk ? bytes - o : kChunk);
            asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p + o), "r"(n) : "memory");
        }
    } else { /* four loads in flight a thread; their words reach `sink` only when it is set (never:
              * it keeps the loads in the code) */
        const int64_t st = nt * 256;
        uint32_t acc = 0;
        for (int64_t o = t * 256; o < bytes; o += 4 * st) {
            uint32_t r[4];
#pragma unroll
            for (int u = 0; u < 4; u++) {
                const char *a = o + u * st < bytes ? p + o + u * st : p;
                asm volatile("ld.global.nc.L1::no_allocate.L2::256B.u32 %0, [%1];" : "=r"(r[u]) : "l"(a));
            }
            acc ^= r[0] ^ r[1] ^ r[2] ^ r[3];
        }
        if (sink) *sink = acc;
    }
}

} // namespace

cudaError_t kd_cu_l2_prefetch(const void *p, int64_t bytes, int mode, cudaStream_t s) {
    if (bytes <= 0) return cudaSuccess;
    if (!p || ((uintptr_t)p & 15) || (bytes & 15) || mode < 1 || mode > 3) return cudaErrorInvalidValue;
    int64_t blocks = (bytes + kBlock * 128 - 1) / (kBlock * 128);
    if (blocks > kPrefetchBlocks) blocks = kPrefetchBlocks;
    l2_prefetch_kernel<<<(unsigned)blocks, kBlock, 0, s>>>((const char *)p, bytes, mode, nullptr);
    return cudaGetLastError();
}
