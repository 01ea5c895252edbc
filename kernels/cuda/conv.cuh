// conv.cuh: the short conv + SiLU of the q | k | v channels (kd_cu_conv_silu), as a block's
// share of it: ops.cu's kernel runs it alone, gemv.cu's launch of f_proj.1 + g_proj.1 runs it
// in its first blocks (kd_cu_gemm_skinny_pair_conv). The same code in both: the same bits.
#ifndef KD_CUDA_CONV_CUH
#define KD_CUDA_CONV_CUH

#include <math.h>
#include <stdint.h>

#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/ops.cuh"

constexpr int kd_conv_tokens = 4, kd_conv_width_max = 4; /* tokens a group; the widest conv taken that way */
constexpr int kd_conv_block = 256;                           /* threads a block of kd_cu_conv_silu */

__device__ __forceinline__ float kd_silu_(float x) { return x * (1.f / (1.f + expf(-x))); } /* as ops.cu's silu_ */

// The conv's sum with its roundings spelled out: the current input's product, then each history's
// fused in (j = 0, 1, ..). Every kernel that computes it (conv.cuh's, ops.cu's 4-channel ones)
// then gives the same bits: left to the compiler, `a * b + c * d` may become either fma, and did
// differ between two kernels by an ulp (cuda_test's conv + prepare kernel checks).
__device__ __forceinline__ float kd_conv_first(float w, float x) { return __fmul_rn(w, x); }
__device__ __forceinline__ float kd_conv_add(float acc, float w, float x) { return __fmaf_rn(w, x, acc); }

// The row of the history ring (kd_cu_conv_args) holding position p (-W < p < R - W + 1) of the
// token's row: slot s's ring index (tk.ring + p) mod R, as a row of C inputs.
__device__ __forceinline__ int64_t kd_ring_row(const kd_cu_tok &tk, int p, int R) {
    int i = (int)((uint32_t)tk.vring >> 1) + p;
    i = i < 0 ? i + R : i >= R ? i - R : i;
    return (int64_t)tk.slot * R + i;
}

// The conv's grid for blocks of `threads`: x blocks over the channels [c0, c1), y over the token
// groups (at most 65535; the blocks loop over the rest).
inline void kd_conv_grid(const kd_cu_conv_args &a, int threads, unsigned *gx, unsigned *gy) {
    const int64_t C = 2 * a.QK + a.VD, x = ((a.c1 ? a.c1 : C) - a.c0 + threads - 1) / threads;
    const int64_t rows = !a.w || a.W <= kd_conv_width_max ? (a.N + kd_conv_tokens - 1) / kd_conv_tokens : a.N;
    *gx = (unsigned)(x < 1 ? 1 : x), *gy = (unsigned)(rows < 1 ? 1 : rows > 65535 ? 65535 : rows);
}

// The taps of channel c (no conv: zeros): wc the history's, wl the current input's.
__device__ __forceinline__ void kd_conv_taps(const kd_cu_conv_args &a, int64_t c, float (&wc)[kd_conv_width_max - 1],
                                             float &wl) {
    const int Hw = a.W - 1;
#pragma unroll
    for (int j = 0; j < kd_conv_width_max - 1; j++) wc[j] = a.w && j < Hw ? a.w[c * a.W + j] : 0.f;
    wl = a.w ? a.w[c * a.W + Hw] : 0.f;
}

// What a thread loads for channels ch[0..NC) of the ng (<= G) tokens from t0, for a conv of width
// at most kd_conv_width_max (or none): the inputs, the tokens' entries, then the histories (all
// loads in flight before the first product: one token a thread at a time, each load waiting on
// the last, the kernel ran at a quarter of the memory bandwidth with 128 tokens, cuda_bench's
// left-out table).
template <int NC, int G> struct kd_conv_in {
    float xt[NC][G], xv[NC][G][kd_conv_width_max - 1];
    int32_t rec[G]; /* the ring row a verify token's inputs go to (kd_ring_row), else -1 */
};

template <int NC, int G>
__device__ __forceinline__ void kd_conv_load(const kd_cu_conv_args &a, const int64_t (&ch)[NC], int64_t t0, int ng,
                                             kd_conv_in<NC, G> &in) {
    const float *__restrict__ proj = a.proj;
    const kd_cu_tok *__restrict__ toks = a.toks;
    const float *__restrict__ hist = a.hist;
    const int64_t P = a.P, C = 2 * a.QK + a.VD, Hw = a.W - 1;
    const bool conv = a.w != nullptr;
    constexpr int WM = kd_conv_width_max;
    kd_cu_tok tk[G];
#pragma unroll
    for (int g = 0; g < G; g++) {
        in.rec[g] = -1;
        if (g < ng) {
#pragma unroll
            for (int i = 0; i < NC; i++) in.xt[i][g] = proj[(t0 + g) * P + ch[i]];
            if (conv) tk[g] = toks[t0 + g];
        }
    }
    if (conv) {
#pragma unroll
        for (int g = 0; g < G; g++)
#pragma unroll
            for (int j = 0; j < WM - 1; j++)
                if (g < ng && j < Hw) {
                    // history j holds the input at row position pos - Hw + j
                    const int64_t tau = tk[g].pos - Hw + j;
#pragma unroll
                    for (int i = 0; i < NC; i++)
                        in.xv[i][g][j] = tau >= 0 ? proj[(tk[g].start + tau) * P + ch[i]]
                                                  : hist[kd_ring_row(tk[g], (int)tau, a.R) * C + ch[i]];
                }
#pragma unroll
        for (int g = 0; g < G; g++)
            if (g < ng && (tk[g].vring & 1)) in.rec[g] = (int32_t)kd_ring_row(tk[g], tk[g].pos, a.R);
    }
}

// From what kd_conv_load loaded: y[i][g] the conv + SiLU (the same arithmetic, in the same order,
// for every token and channel); a verify row's inputs go to its records.
template <int NC, int G>
__device__ __forceinline__ void kd_conv_out(const kd_cu_conv_args &a, const int64_t (&ch)[NC],
                                            const float (&wc)[NC][kd_conv_width_max - 1], const float (&wl)[NC],
                                            int ng, const kd_conv_in<NC, G> &in, float (&y)[NC][G]) {
    float *__restrict__ hist = a.hist;
    const int64_t C = 2 * a.QK + a.VD, Hw = a.W - 1;
    const bool conv = a.w != nullptr;
#pragma unroll
    for (int g = 0; g < G; g++) {
        if (g >= ng) break;
#pragma unroll
        for (int i = 0; i < NC; i++) {
            if (conv) {
                float acc = kd_conv_first(wl[i], in.xt[i][g]);
#pragma unroll
                for (int j = 0; j < kd_conv_width_max - 1; j++)
                    if (j < Hw) acc = kd_conv_add(acc, wc[i][j], in.xv[i][g][j]);
                y[i][g] = kd_silu_(acc);
                if (in.rec[g] >= 0) hist[(int64_t)in.rec[g] * C + ch[i]] = in.xt[i][g];
            } else {
                y[i][g] = kd_silu_(in.xt[i][g]);
            }
        }
    }
}

// Block (bx, by) of a grid of gy rows of blocks: x over the channels [c0, c1) (blockDim.x each),
// y over groups of kd_conv_tokens tokens (no division per element; a token's record is the same
// for the whole block). A thread takes its channel's weights once and a group's tokens together.
// It waits for the kernel before (kd_dep_start) first, or with a.early after its first group's
// loads: everything the conv reads must then have been written two or more kernels back
// (launch.cuh), which the caller vouches for.
__device__ __forceinline__ void kd_conv_silu_block(const kd_cu_conv_args &a, int bx, int by, int gy) {
    const float *__restrict__ proj = a.proj;
    const kd_cu_tok *__restrict__ toks = a.toks;
    float *__restrict__ hist = a.hist;
    const float *__restrict__ w = a.w;
    const int64_t P = a.P, N = a.N, QK = a.QK, VD = a.VD;
    const int W = a.W;
    float *const q = a.q, *const k = a.k, *const v = a.v;
    constexpr int G = kd_conv_tokens, WM = kd_conv_width_max;
    const int64_t C = 2 * QK + VD, Hw = W - 1, c1 = a.c1 ? a.c1 : C;
    const int64_t c = a.c0 + (int64_t)bx * blockDim.x + threadIdx.x;
    const bool fast = !w || W <= WM, early = a.early && fast;
    if (!early || c >= c1) kd_dep_start();
    if (c >= c1) return;
    float *const dst = c < QK ? q + c : c < 2 * QK ? k + (c - QK) : v + (c - 2 * QK);
    const int64_t dld = c < 2 * QK ? QK : VD;
    if (fast) {
        float wc[1][WM - 1], wl[1], y[1][G];
        kd_conv_taps(a, c, wc[0], wl[0]);
        const int64_t cc[1] = {c};
        for (int64_t t0 = (int64_t)by * G; t0 < N; t0 += (int64_t)gy * G) {
            const int ng = N - t0 < G ? (int)(N - t0) : G;
            kd_conv_in<1, G> in;
            kd_conv_load<1, G>(a, cc, t0, ng, in);
            if (early && t0 == (int64_t)by * G) kd_dep_start();
            kd_conv_out<1, G>(a, cc, wc, wl, ng, in, y);
#pragma unroll
            for (int g = 0; g < G; g++)
                if (g < ng) dst[(t0 + g) * dld] = y[0][g];
        }
        if (early && (int64_t)by * G >= N) kd_dep_start();
        return;
    }
    for (int64_t t = by; t < N; t += gy) { /* wider convs: a token at a time */
        const float xt = proj[t * P + c];
        float y;
        if (w) {
            const kd_cu_tok tk = toks[t];
            const float *wc = w + c * W;
            float acc = kd_conv_first(wc[Hw], xt);
            for (int64_t j = 0; j < Hw; j++) {
                // history j holds the input at row position pos - Hw + j
                const int64_t tau = tk.pos - Hw + j;
                const float xv =
                    tau >= 0 ? proj[(tk.start + tau) * P + c] : hist[kd_ring_row(tk, (int)tau, a.R) * C + c];
                acc = kd_conv_add(acc, wc[j], xv);
            }
            y = kd_silu_(acc);
            if (tk.vring & 1) hist[kd_ring_row(tk, tk.pos, a.R) * C + c] = xt;
        } else {
            y = kd_silu_(xt);
        }
        dst[t * dld] = y;
    }
}

#endif
