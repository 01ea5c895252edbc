/* cpu/ops.h: the CPU reference operators of a KDA model (KDA.md §2), one set per element
 * type (suffix _f32 / _f64, compiled from the same source). All pointers are host memory;
 * nothing allocates. Each op is tested against an independent float64 reference. */
#ifndef KD_CPU_OPS_H
#define KD_CPU_OPS_H

#include <stdint.h>

#define KD_OPS_DECLARE(real, sfx)                                                            \
    /* y = x * (mean(x^2) + eps)^-1/2 * w, for one vector of n (y may alias x). */           \
    void kd_rmsnorm_##sfx(real *y, const real *x, const real *w, int64_t n, double eps);    \
    /* Causal depthwise conv + SiLU over T steps of C channels. x, y: [T][C] with row         \
     * strides xs, ys (y may alias x). win: [C][W-1] the last W-1 inputs of each channel     \
     * (oldest first), updated to the last W-1 inputs after the T steps. w: [C][W]. */       \
    void kd_conv_silu_##sfx(real *y, int64_t ys, const real *x, int64_t xs, int64_t T,       \
                            int64_t C, real *win, const real *w, int W);                     \
    /* y = silu(x) elementwise (no conv: use_short_conv false). */                          \
    void kd_silu_##sfx(real *y, const real *x, int64_t n);                                   \
    /* KDA gate for one token: g[HV*K] = log decay from g_raw[HV*K] (KDA.md §2.4). */       \
    void kd_kda_gate_##sfx(real *g, const real *g_raw, const real *A_log, const real *dt_bias, \
                           int64_t HV, int64_t K, int use_lower_bound, double lower_bound);  \
    /* beta[HV] = sigmoid(b_raw) (x2 with allow_neg_eigval). */                              \
    void kd_kda_beta_##sfx(real *beta, const real *b_raw, int64_t HV, int allow_neg_eigval); \
    /* x *= scale / sqrt(sum(x^2) + eps) for one vector of n. */                            \
    void kd_l2norm_##sfx(real *x, int64_t n, double eps, double scale);                      \
    /* y = rms(o, w) * sigmoid(gate) for one value head of V (y may alias o). */             \
    void kd_gated_rmsnorm_##sfx(real *y, const real *o, const real *gate, const real *w,    \
                                int64_t V, double eps);                                      \
    /* y = silu(gate) * up, n elements (y may alias gate). */                               \
    void kd_swiglu_##sfx(real *y, const real *gate, const real *up, int64_t n);             \
    /* The KDA recurrence for T tokens of one sequence (KDA.md §2.6), from state S           \
     * [HV][K][V] (updated in place). q, k: [T][H][K] already L2-normalised (q also scaled   \
     * by K^-1/2: kd_l2norm); v: [T][HV][V]; g: [T][HV][K] log decay; beta: [T][HV];         \
     * o: [T][HV][V]. Value head j reads q/k head j / (HV/H). Optional outputs (NULL: none):  \
     * u_out [T][HV][V] the corrections u_t (RecoverSSM records); states_out [T][HV][K][V]   \
     * the state after each token (the store-all baseline). */                               \
    void kd_kda_recurrent_##sfx(real *o, real *S, const real *q, const real *k, const real *v, \
                                const real *g, const real *beta, int64_t T, int64_t H,       \
                                int64_t HV, int64_t K, int64_t V, real *u_out,               \
                                real *states_out);                                           \
    /* RecoverSSM commit (KDA.md §4): folds records t_begin..t_end-1 into S [HV][K][V]:      \
     * S <- diag(exp g_t) S + khat_t u_t^T, with khat = L2norm(raw k) and g = gate(raw g)         \
     * recomputed exactly as the verify did. kg: [T][HV][2K] raw key then raw gate per value \
     * head; u: [T][HV][V]. work: 2K elements. */                                           \
    void kd_kda_fold_##sfx(real *S, const real *kg, const real *u, const real *A_log,         \
                           const real *dt_bias, int64_t HV, int64_t K, int64_t V,            \
                           int64_t t_begin, int64_t t_end, int use_lower_bound,              \
                           double lower_bound, real *work);                                  \
    /* Conv window fold: win [C][W-1] becomes the last W-1 inputs of (win, x_0..x_{n-1}),    \
     * x: [n][C] (row stride xs). */                                                         \
    void kd_conv_fold_##sfx(real *win, const real *x, int64_t xs, int64_t n, int64_t C, int W);

KD_OPS_DECLARE(float, f32)
KD_OPS_DECLARE(double, f64)

#endif
