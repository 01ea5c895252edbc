// conv.cuh: the short conv + SiLU of the q | k | v channels (kd_cu_conv_silu), as a block's
// share of it: ops.cu's kernel runs it alone, gemv.cu's launch of f_proj.1 + g_proj.1 runs it
// in its first blocks (kd_cu_gemm_skinny_pair_conv). The same code in both: the same bits.
#ifndef KD_CUDA_CONV_CUH
#define KD_CUDA_CONV_CUH

#include <math.h>
#include <stdint.h>

#include "kernels/cuda/ops.cuh"

constexpr int kd_conv_tokens = 4, kd_conv_width_max = 4; /* tokens a group; the widest conv taken that way */
constexpr int kd_conv_block = 256;                           /* threads a block of kd_cu_conv_silu */

__device__ __forceinline__ float kd_silu_(float x) { return x * (1.f / (1.f + expf(-x))); } /* as ops.cu's silu_ */

// The conv's grid for blocks of `threads`: x blocks over the channels, y over the token
// groups (at most 65535; the blocks loop over the rest).
inline void kd_conv_grid(const kd_cu_conv_args &a, int threads, unsigned *gx, unsigned *gy) {
    const int64_t C = 2 * a.QK + a.VD, x = (C + threads - 1) / threads;
    const int64_t rows = !a.w || a.W <= kd_conv_width_max ? (a.N + kd_conv_tokens - 1) / kd_conv_tokens : a.N;
    *gx = (unsigned)(x < 1 ? 1 : x), *gy = (unsigned)(rows < 1 ? 1 : rows > 65535 ? 65535 : rows);
}

// Block (bx, by) of a grid of gy rows of blocks: x over channels (blockDim.x each), y over
// groups of kd_conv_tokens tokens (no division per element; a token's record is the same for
// the whole block). A thread takes its channel's weights once and a group's tokens together:
// their inputs, then their histories, all loads in flight before the first product (one token
// a thread at a time, each load waiting on the last, the kernel ran at a quarter of the memory
// bandwidth with 128 tokens: cuda_bench's left-out table). The same arithmetic, in the same
// order, for every token.
__device__ __forceinline__ void kd_conv_silu_block(const kd_cu_conv_args &a, int bx, int by, int gy) {
    const float *__restrict__ proj = a.proj;
    const kd_cu_tok *__restrict__ toks = a.toks;
    const float *__restrict__ win = a.win;
    const float *__restrict__ w = a.w;
    float *__restrict__ xrec = a.xrec;
    const int64_t P = a.P, N = a.N, QK = a.QK, VD = a.VD, ws = a.ws;
    const int W = a.W, Tw = a.Tw;
    float *const q = a.q, *const k = a.k, *const v = a.v;
    constexpr int G = kd_conv_tokens, WM = kd_conv_width_max;
    const int64_t C = 2 * QK + VD, Hw = W - 1;
    const int64_t c = (int64_t)bx * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float *const dst = c < QK ? q + c : c < 2 * QK ? k + (c - QK) : v + (c - 2 * QK);
    const int64_t dld = c < 2 * QK ? QK : VD;
    if (!w || W <= WM) {
        float wc[WM - 1]; /* the history's taps; wl the current input's */
#pragma unroll
        for (int j = 0; j < WM - 1; j++) wc[j] = w && j < Hw ? w[c * W + j] : 0.f;
        const float wl = w ? w[c * W + Hw] : 0.f;
        for (int64_t t0 = (int64_t)by * G; t0 < N; t0 += (int64_t)gy * G) {
            const int ng = N - t0 < G ? (int)(N - t0) : G;
            float xt[G], xv[G][WM - 1];
            kd_cu_tok tk[G];
#pragma unroll
            for (int g = 0; g < G; g++)
                if (g < ng) {
                    xt[g] = proj[(t0 + g) * P + c];
                    if (w) tk[g] = toks[t0 + g];
                }
            if (w) {
#pragma unroll
                for (int g = 0; g < G; g++)
#pragma unroll
                    for (int j = 0; j < WM - 1; j++)
                        if (g < ng && j < Hw) {
                            // history j holds the input at row position pos - Hw + j
                            const int64_t tau = tk[g].pos - Hw + j;
                            xv[g][j] = tau >= 0 ? proj[(tk[g].start + tau) * P + c]
                                                : win[(int64_t)tk[g].slot * ws + c * Hw + Hw + tau];
                        }
            }
#pragma unroll
            for (int g = 0; g < G; g++) {
                if (g >= ng) break;
                float y;
                if (w) {
                    float acc = wl * xt[g];
#pragma unroll
                    for (int j = 0; j < WM - 1; j++)
                        if (j < Hw) acc += wc[j] * xv[g][j];
                    y = kd_silu_(acc);
                    if (tk[g].verify) xrec[((int64_t)tk[g].slot * Tw + tk[g].pos) * C + c] = xt[g];
                } else {
                    y = kd_silu_(xt[g]);
                }
                dst[(t0 + g) * dld] = y;
            }
        }
        return;
    }
    for (int64_t t = by; t < N; t += gy) { /* wider convs: a token at a time */
        const float xt = proj[t * P + c];
        float y;
        if (w) {
            const kd_cu_tok tk = toks[t];
            const float *wc = w + c * W;
            const float *hist = win + (int64_t)tk.slot * ws + c * Hw;
            float acc = wc[Hw] * xt;
            for (int64_t j = 0; j < Hw; j++) {
                // history j holds the input at row position pos - Hw + j
                const int64_t tau = tk.pos - Hw + j;
                const float xv = tau >= 0 ? proj[(tk.start + tau) * P + c] : hist[Hw + tau];
                acc += wc[j] * xv;
            }
            y = kd_silu_(acc);
            if (tk.verify) xrec[((int64_t)tk.slot * Tw + tk.pos) * C + c] = xt;
        } else {
            y = kd_silu_(xt);
        }
        dst[t * dld] = y;
    }
}

#endif
