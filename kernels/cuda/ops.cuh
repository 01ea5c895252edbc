// ops.cuh: the CUDA operators of the KDA forward other than the recurrence (kda.cuh): the
// device side of the CUDA backend (cuda_backend.cu), mirroring the CPU reference operators
// (cpu/ops.c) one for one. Host launchers, all asynchronous on the given stream; each
// returns the launch's cudaError_t (cudaSuccess, or the error of the launch itself).
//
// Element types: the residual stream, GEMM outputs, norms, gates, conv and recurrence are
// fp32. `bf16` selects the type of what a launcher writes for a GEMM to read (0: float,
// 1: __nv_bfloat16): the bf16 activation mode feeds bf16 into cuBLAS.
//
// Per-slot state buffers (one layer): conv history rings hist [slots+1][W-1+Tw][C] (the
// committed inputs and the last verify window's: kd_cu_conv_args), recurrent states
// [slots+1][HV][K][V]; the conv windows in the export layout [slots+1][C][W-1] (oldest first, the
// CPU layout) only for the state calls (kd_cu_conv_window).
#ifndef KD_CUDA_OPS_CUH
#define KD_CUDA_OPS_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "kernels/cuda/kda.cuh"

// One token of a batch: its row's slot, its position in the row, the row's first token
// in the batch, and vring: bit 0 whether the row is a verify window (its conv inputs are
// recorded), the bits above the index in the slot's conv history ring (kd_cu_conv_args) of the
// row's position 0 (kd_cu_tok_make). Four words, as before the ring: the kernels that run the conv
// hold a group of tokens' entries in registers (with a fifth field f_proj.1 + g_proj.1's launch
// with the conv took 8-14 more registers a thread).
typedef struct kd_cu_tok {
    int32_t slot, pos, start, vring;
} kd_cu_tok;
static inline kd_cu_tok kd_cu_tok_make(int32_t slot, int32_t pos, int32_t start, int verify, int32_t ring) {
    kd_cu_tok t = {slot, pos, start, (int32_t)(((uint32_t)ring << 1) | (verify ? 1u : 0u))};
    return t;
}

// A prefill row's conv inputs into its slot's history ring: the last min(n, W - 1) of
// x_i = proj[start + i] (i < n) at ring index (ring + i) mod R (kd_cu_conv_ring_fill).
typedef struct kd_cu_fold {
    int32_t slot, n, start, ring;
} kd_cu_fold;

// A prefill row of the recurrence: tokens [start, start + len) of the batch, advancing the
// committed state of `slot` in place.
typedef kd_kda_prow kd_cu_prow; /* kda.cuh */

// x[t][:] = table[tok[t]][:] (table: [vocab][D], float or bf16 per table_bf16), x fp32.
cudaError_t kd_cu_embed(int table_bf16, const void *table, const int32_t *tok, int64_t N,
                        int64_t D, float *x, cudaStream_t s);

// y[m] = rms(x[rows ? rows[m] : m], w) for m < M (vectors of D; eps as the CPU: sum of
// squares in double). y: [M][D], float or bf16 per out_bf16. pf_bytes > 0: pf_blocks more blocks
// prefetch [pf, pf + pf_bytes) into the L2, as kd_cu_gated_rmsnorm's.
cudaError_t kd_cu_rmsnorm(int out_bf16, void *y, const float *x, const int32_t *rows, int64_t M,
                          int64_t D, const float *w, double eps, cudaStream_t s, const void *pf = nullptr,
                          int64_t pf_bytes = 0, int pf_blocks = 0);

// The norm above of x[m] + parts[0][m] + ... + parts[np - 1][m] (parts: np blocks of [M][D], each
// dense; added in that order), which is also written back to x[m] for m < M (the residual
// stream after a product whose K slices were left apart: kd_cu_lt_gemm_split). np in
// 1..KD_NORM_ADD_MAX, D at most KD_NORM_ADD_MAX_D (one pass of the norm's threads); else
// cudaErrorInvalidValue.
#define KD_NORM_ADD_MAX 8
#define KD_NORM_ADD_MAX_D 8192
cudaError_t kd_cu_rmsnorm_add(int out_bf16, void *y, float *x, const float *parts, int np, int64_t M, int64_t D,
                              const float *w, double eps, cudaStream_t s, const void *pf = nullptr,
                              int64_t pf_bytes = 0, int pf_blocks = 0);

// dst[t][i] = src[t * ld + off + i] for t < N, i < width (dst dense [N][width], float or
// bf16 per out_bf16).
cudaError_t kd_cu_copy_cols(int out_bf16, void *dst, const float *src, int64_t N, int64_t ld,
                            int64_t off, int64_t width, cudaStream_t s);

// Short conv + SiLU of the q | k | v channels (C = 2*QK + VD) of the fused projection
// proj [N][P] (channels at columns 0..C-1), per token from its slot's conv history and the
// earlier inputs of its row: y_t = silu(w[W-1] x_t + sum_j w[j] hist_j). Writes q [N][QK],
// k [N][QK], v [N][VD]. The history: a ring of R >= W - 1 + (the longest verify window)
// entries a slot, hist + (s R + i) C the C inputs of ring index i of slot s; a row's position p
// is at index (tok.ring + p) mod R, so its history entries (positions -W+1 .. -1) are the slot's
// committed inputs, and a verify row writes its inputs (the records the next step commits by
// advancing the ring's position, no data moved) at its own positions. w == NULL: no conv,
// y = silu(x) (hist unused).
// kd_cu_conv_silu's arguments, as one (kernels/cuda/conv.cuh), the channels it takes: [c0, c1),
// c1 = 0 meaning all C, and `early`: 1 when everything the conv reads (proj, toks, the history
// entries) was written two or more kernels before it in the stream (the caller knows the order),
// so that it may load before its programmatic wait (kernels/cuda/launch.cuh).
typedef struct kd_cu_conv_args {
    const float *proj;
    int64_t P, N, QK, VD;
    const kd_cu_tok *toks;
    float *hist;
    int R;
    const float *w;
    int W;
    float *q, *k, *v;
    int64_t c0, c1;
    int early;
} kd_cu_conv_args;

cudaError_t kd_cu_conv_silu(const float *proj, int64_t P, int64_t N, int64_t QK, int64_t VD,
                            const kd_cu_tok *toks, float *hist, int R, const float *w, int W, float *q, float *k,
                            float *v, cudaStream_t s);
// The same from its arguments, the channels [a->c0, a->c1) only.
cudaError_t kd_cu_conv_silu_args(const kd_cu_conv_args *a, cudaStream_t s);

// kd_kda_prepare's arguments (kernels/cuda/kda.cuh), as one: per token and key head h < H the
// conv's q and k L2-normalised (q also scaled by K^-1/2) into qn, kn [N][H][K] and their
// product into qk [N][H] (when not NULL); per token and value head h < HV the decay
// exp(gate(graw + dt_bias[h])) into decay [N][HV][K] (graw [N][HV][K]) and
// beta = sigmoid(braw[n * braw_ld + h]) (doubled with allow_neg) into beta [N][HV]. graw_early:
// for kd_cu_conv_prepare, 1 when graw too was written two or more kernels back (it is then
// loaded with the conv's inputs, before the programmatic wait).
typedef struct kd_cu_prep_args {
    int32_t H, HV, K, graw_early;
    const float *graw, *braw;
    int64_t braw_ld;
    const float *A_log, *dt_bias;
    int32_t use_lb, neg;
    float lb;
    float *qn, *kn, *qk, *decay, *beta;
} kd_cu_prep_args;

// The conv of the q and k channels (conv->q, conv->k unused: nothing written there) and the
// prepare in one kernel, the same bits as kd_cu_conv_silu then kd_kda_prepare: a warp a (token,
// key head), 4 channels a lane, so the conv's q and k never leave the warp. The v channels are
// not touched: kd_cu_conv_silu_args with c0 = 2 QK does them. Needs (kd_cu_conv_prepare_ok) K a
// multiple of 4 up to 128, a conv of width 4, every channel ([c0, c1) = all), 16-byte aligned
// arrays (P, the windows' stride and C multiples of 4), else cudaErrorInvalidValue.
int kd_cu_conv_prepare_ok(const kd_cu_conv_args *conv, const kd_cu_prep_args *p);

// kd_cu_conv_silu_args's work for channels [conv->c0, C) (c1 = 0 or C), 4 channels a thread in
// 16-byte accesses (the same bits): needs (kd_cu_conv4_ok) a conv of width 4, c0, QK, C, P and
// the windows' stride multiples of 4, 16-byte aligned arrays, else cudaErrorInvalidValue.
int kd_cu_conv4_ok(const kd_cu_conv_args *conv);
cudaError_t kd_cu_conv4(const kd_cu_conv_args *conv, cudaStream_t s);
// The same with its form named (tests): 0 as kd_cu_conv4 (two tokens a thread once a token a thread takes more than
// one wave of blocks), 1 a token a thread, 2 two tokens a thread.
cudaError_t kd_cu_conv4_form(const kd_cu_conv_args *conv, int form, cudaStream_t s);
cudaError_t kd_cu_conv_prepare(const kd_cu_conv_args *conv, const kd_cu_prep_args *p, cudaStream_t s);
// The same with its form named (tests): 0 as kd_cu_conv_prepare (the first where the device holds the whole grid
// at once, else the second), 1 the head's taps in registers, 2 in shared memory (fewer registers: more blocks an SM).
cudaError_t kd_cu_conv_prepare_form(const kd_cu_conv_args *conv, const kd_cu_prep_args *p, int form,
                                    cudaStream_t s);

// Prefill rows' last inputs into their slots' history rings (kd_cu_fold), one thread per
// (row, channel): run after the row's conv, which read the entries these overwrite.
cudaError_t kd_cu_conv_ring_fill(const kd_cu_fold *folds, int n_folds, int64_t C, int W, float *hist, int R,
                                 const float *proj, int64_t P, cudaStream_t s);

// Between one slot's history rings and a conv window in the export layout ([C][W-1], entry j
// of channel c the input at position j - W + 1 before the committed one), for L layers: layer
// l's ring of the slot at hist + l * lhist + slot R C, its window at win + l * lwin; head: the
// ring index of the committed position. to_ring: window -> ring, else ring -> window.
cudaError_t kd_cu_conv_window(int to_ring, int L, int64_t C, int W, float *hist, int64_t lhist, int R, int32_t slot,
                              int32_t head, float *win, int64_t lwin, cudaStream_t s);

// The KDA recurrence of prefill rows on the committed state in place, token by token (forms 0, 1)
// or in chunks of 8 tokens (form 3, the default): per token S <- diag(decay) S;
// u = beta (v - S^T kn); S += kn u^T; o = S^T qn (KDA.md §2.6).
// qn, kn [N][H][K]; decay [N][HV][K]; beta [N][HV]; v, o [N][HV][V]; state
// slot s's [HV][K][V] at state + s * state_stride. K must be 32, 64 or 128 (else
// cudaErrorInvalidValue).
// Forms (kd_cu_prefill_form, process-wide; default 3):
// 0: a block of 32 threads a 32-column stripe of one head's state, a column a thread (K of its
//    floats in registers): every token two dependent chains of K FMAs a thread and two block
//    barriers around a load of the token's q, k and decay.
// 1: a block of 128 threads the same stripe, a column 4 threads (K / 4 floats each, their sums
//    joined by two shuffles): chains of K / 4 (two accumulators each), and the next token's q,
//    k, decay, beta and v loaded into registers while this one computes, then stored into the
//    other half of a double buffer in shared memory: one barrier a token, no load on its path.
// 3: in chunks of 8 tokens on tensor cores (kd_kda_prefill, kda.cuh), with n_chunks and work as
//    there (forms 0 and 1 ignore them); at odd V form 1. The default: results/prefill_h200.md. (Form 2,
//    a column 8 threads, was measured and dropped: results/tried/README.md.)
cudaError_t kd_cu_prefill(const kd_cu_prow *rows, int n_rows, int n_chunks, int H, int HV, int K, int V,
                          float *state, int64_t state_stride, const float *qn, const float *kn, const float *decay,
                          const float *beta, const float *v, float *o, float *work, cudaStream_t s);
// Sets the form kd_cu_prefill launches (0, 1 or 3, above; anything else is ignored) and returns the
// previous one: benchmarks and tests.
int kd_cu_prefill_form(int form);

// Per (token, value head): y = rms(o, w) * sigmoid(gate + bias), o and gate [N][HV][V],
// bias [HV][V], w [V]. y: [N][HV][V], float or bf16 per out_bf16. pf_bytes > 0: pf_blocks more
// blocks prefetch [pf, pf + pf_bytes) (memory nothing writes during the step; 16-byte aligned, a
// multiple of 16 bytes) into the L2 with bulk prefetches, from the start of the kernel before
// (a hint; the kernel's grid ends when they have landed). gate_early: gate, bias and w are loaded
// before the kernel's programmatic wait (gate written two or more kernels back: launch.cuh).
cudaError_t kd_cu_gated_rmsnorm(int out_bf16, void *y, const float *o, const float *gate,
                                const float *bias, const float *w, int64_t N, int HV, int V,
                                double eps, cudaStream_t s, const void *pf = nullptr, int64_t pf_bytes = 0,
                                int pf_blocks = 0, int gate_early = 0);

// y[t][i] = silu(gu[t][2i]) * gu[t][2i + 1]; gu [N][2 FF] with gate and up interleaved (the
// backend's gate|up weights are, so that one warp of the skinny row form holds both: gemv.cuh
// kd_cu_gemm_skinny_swiglu), y [N][FF] (float or bf16).
cudaError_t kd_cu_swiglu(int out_bf16, void *y, const float *gu, int64_t N, int64_t FF,
                         cudaStream_t s);
// The same from gate|up in bf16 (gu [N][2 FF] of bf16, kd_cu_lt_gemm_bf16), into bf16.
cudaError_t kd_cu_swiglu_h(__nv_bfloat16 *y, const __nv_bfloat16 *gu, int64_t N, int64_t FF, cudaStream_t s);

// Weights into the L2 cache ahead of the product that reads them: bytes [p, p + bytes) of
// memory nothing writes during the step, as hints (modes 1 and 2 read nothing into registers
// and return once the prefetches are issued; p 16-byte aligned, bytes a multiple of 16). mode 1:
// one prefetch.global.L2 per 128-byte line; 2: cp.async.bulk.prefetch.L2 of 16 KiB a thread,
// from the first few blocks (a few SMs' copy engines: a trickle that leaves the memory to the
// kernels running meanwhile); 3: 4-byte loads with the L2's 256-byte fetch, one a 256 bytes.
// The backend can run it on a second stream (kd_cuda_set_prefetch modes 1-3; not the default,
// which prefetches from the norms' launches: cuda_backend.cu) while a layer's latency-bound
// kernels leave the memory idle.
cudaError_t kd_cu_l2_prefetch(const void *p, int64_t bytes, int mode, cudaStream_t s);

#endif
