/* cpu/ops.c: the CPU reference operators of the KDA forward (see ops.h), written once for
 * the element type in cpu/real.h. Plain loops: the reference, not the fast path. */
#include "kernels/cpu/ops.h"

#include "kernels/cpu/real.h"

#include <string.h>

void KD_SFX(kd_rmsnorm)(real *y, const real *x, const real *w, int64_t n, double eps) {
    double ss = 0;
    for (int64_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
    real r = (real)(1.0 / sqrt(ss / (double)n + eps));
    for (int64_t i = 0; i < n; i++) y[i] = x[i] * r * w[i];
}

void KD_SFX(kd_conv_silu)(real *y, int64_t ys, const real *x, int64_t xs, int64_t T, int64_t C,
                          real *win, const real *w, int W) {
    const int H = W - 1; /* history per channel */
    for (int64_t c = 0; c < C; c++) {
        real *hist = win + c * H;
        const real *wc = w + c * W;
        for (int64_t t = 0; t < T; t++) {
            real xt = x[t * xs + c];
            real acc = wc[H] * xt;
            for (int j = 0; j < H; j++) acc += wc[j] * hist[j];
            for (int j = 0; j + 1 < H; j++) hist[j] = hist[j + 1];
            if (H > 0) hist[H - 1] = xt;
            y[t * ys + c] = r_silu(acc);
        }
    }
}

void KD_SFX(kd_silu)(real *y, const real *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = r_silu(x[i]);
}

void KD_SFX(kd_kda_gate)(real *g, const real *g_raw, const real *A_log, const real *dt_bias,
                         int64_t HV, int64_t K, int use_lower_bound, double lower_bound) {
    for (int64_t h = 0; h < HV; h++) {
        real a = R_EXP(A_log[h]);
        for (int64_t c = 0; c < K; c++) {
            real z = g_raw[h * K + c] + dt_bias[h * K + c];
            g[h * K + c] = use_lower_bound ? (real)lower_bound * r_sigmoid(a * z)
                                           : -a * r_softplus(z);
        }
    }
}

void KD_SFX(kd_kda_beta)(real *beta, const real *b_raw, int64_t HV, int allow_neg_eigval) {
    for (int64_t h = 0; h < HV; h++) {
        real b = r_sigmoid(b_raw[h]);
        beta[h] = allow_neg_eigval ? 2 * b : b;
    }
}

void KD_SFX(kd_l2norm)(real *x, int64_t n, double eps, double scale) {
    double ss = 0;
    for (int64_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
    real r = (real)(scale / sqrt(ss + eps));
    for (int64_t i = 0; i < n; i++) x[i] *= r;
}

void KD_SFX(kd_gated_rmsnorm)(real *y, const real *o, const real *gate, const real *w, int64_t V,
                              double eps) {
    double ss = 0;
    for (int64_t i = 0; i < V; i++) ss += (double)o[i] * o[i];
    real r = (real)(1.0 / sqrt(ss / (double)V + eps));
    for (int64_t i = 0; i < V; i++) y[i] = o[i] * r * w[i] * r_sigmoid(gate[i]);
}

void KD_SFX(kd_swiglu)(real *y, const real *gate, const real *up, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = r_silu(gate[i]) * up[i];
}

void KD_SFX(kd_kda_recurrent)(real *o, real *S, const real *q, const real *k, const real *v,
                              const real *g, const real *beta, int64_t T, int64_t H, int64_t HV,
                              int64_t K, int64_t V, real *u_out, real *states_out) {
    const int64_t group = HV / H;
    for (int64_t h = 0; h < HV; h++) {
        real *Sh = S + h * K * V;
        const int64_t hk = h / group;
        for (int64_t t = 0; t < T; t++) {
            const real *qt = q + (t * H + hk) * K, *kt = k + (t * H + hk) * K;
            const real *vt = v + (t * HV + h) * V, *gt = g + (t * HV + h) * K;
            real *ot = o + (t * HV + h) * V;
            const real bt = beta[t * HV + h];
            /* Pass 1: decay rows, kS = S^T k. ot holds kS, then u. */
            for (int64_t j = 0; j < V; j++) ot[j] = 0;
            for (int64_t c = 0; c < K; c++) {
                real *row = Sh + c * V;
                const real d = R_EXP(gt[c]), kc = kt[c];
                for (int64_t j = 0; j < V; j++) {
                    row[j] *= d;
                    ot[j] += kc * row[j];
                }
            }
            for (int64_t j = 0; j < V; j++) ot[j] = bt * (vt[j] - ot[j]);
            if (u_out) memcpy(u_out + (t * HV + h) * V, ot, (size_t)V * sizeof(real));
            /* Pass 2: S += k u^T; then o = S^T q (overwrites u, so after the update). */
            for (int64_t c = 0; c < K; c++) {
                real *row = Sh + c * V;
                const real kc = kt[c];
                for (int64_t j = 0; j < V; j++) row[j] += kc * ot[j];
            }
            for (int64_t j = 0; j < V; j++) ot[j] = 0;
            for (int64_t c = 0; c < K; c++) {
                const real *row = Sh + c * V;
                const real qc = qt[c];
                for (int64_t j = 0; j < V; j++) ot[j] += qc * row[j];
            }
            if (states_out)
                memcpy(states_out + (t * HV + h) * K * V, Sh, (size_t)(K * V) * sizeof(real));
        }
    }
}

void KD_SFX(kd_kda_fold)(real *S, const real *kg, const real *u, const real *A_log,
                         const real *dt_bias, int64_t HV, int64_t K, int64_t V, int64_t t_begin,
                         int64_t t_end, int use_lower_bound, double lower_bound, real *work) {
    real *kn = work, *g = work + K;
    for (int64_t h = 0; h < HV; h++) {
        real *Sh = S + h * K * V;
        for (int64_t t = t_begin; t < t_end; t++) {
            const real *rec = kg + (t * HV + h) * 2 * K, *ut = u + (t * HV + h) * V;
            memcpy(kn, rec, (size_t)K * sizeof(real));
            KD_SFX(kd_l2norm)(kn, K, 1e-6, 1.0);
            KD_SFX(kd_kda_gate)(g, rec + K, A_log + h, dt_bias + h * K, 1, K, use_lower_bound,
                                lower_bound);
            for (int64_t c = 0; c < K; c++) {
                real *row = Sh + c * V;
                const real d = R_EXP(g[c]), kc = kn[c];
                for (int64_t j = 0; j < V; j++) {
                    row[j] *= d;
                    row[j] += kc * ut[j];
                }
            }
        }
    }
}

void KD_SFX(kd_conv_fold)(real *win, const real *x, int64_t xs, int64_t n, int64_t C, int W) {
    const int64_t H = W - 1;
    for (int64_t c = 0; c < C; c++) {
        real *w = win + c * H;
        for (int64_t j = 0; j < H; j++) /* ascending: reads only ahead of what it writes */
            w[j] = j + n < H ? w[j + n] : x[(j + n - H) * xs + c];
    }
}
