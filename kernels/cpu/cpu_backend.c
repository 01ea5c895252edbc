/* cpu/cpu_backend.c: the CPU reference backend (KDA.md §2), compiled once per element type
 * (cpu/real.h). Weights are converted to the element type at load; matrix products go
 * through OpenBLAS (all cores); conv, gates, norms and the KDA recurrence are plain C
 * (cpu/ops.c).
 *
 * Per layer, the six input projections that read the normed hidden state (q, k, v,
 * f_proj.0, g_proj.0, b_proj) are one fused matrix, so a batch of N tokens costs one GEMM
 * [N, D] x [D, P]; likewise MLP gate and up. Per-token work (conv, recurrence) runs row by
 * row from each row's slot state. */
#include <cblas.h>
#undef I /* cblas.h pulls in complex.h */
#include <stdlib.h>
#include <xxhash.h>
#if defined(__x86_64__)
#include <xxh_x86dispatch.h> /* XXH3 on the CPU's widest vector unit (the same digests) */
#endif

#include "kd/backend.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/real.h"

typedef struct cpu_layer {
    real *attn_norm, *w_in;              /* w_in: [P][D] = q | k | v | f0 | g0 | b */
    real *conv;                          /* [QK + QK + VD][W] (q, k, v channels) */
    real *f1, *A_log, *dt_bias, *g1, *g1_bias, *o_norm, *w_o;
    real *mlp_norm, *w_gu, *w_down;      /* w_gu: [2I][D] = gate | up */
} cpu_layer;

typedef struct cpu_backend {
    kd_backend base;
    int64_t QK, VD, P;   /* q/k width H*K, value width HV*V, fused projection width */
    cpu_layer *layers;
    real *embed, *final_norm, *head; /* head == embed when tied */
    /* Slot memory, (n_slots + 1) slots of slot_total elements: the committed state of every
     * layer first ([L][S | conv window], the export layout), then per layer the records of
     * the last verify window: conv inputs [T][C], and either corrections [T][HV][V] plus
     * raw key/gate [T][HV][2K] (deferred, eager) or full states [T][HV][K][V] (store-all). */
    real *state;
    int64_t conv_ch;                 /* C = 2*QK + VD with short conv, else 0 */
    int64_t rec_layer, slot_total;   /* elements */
    /* work space, sized for max_tokens */
    real *x, *h, *proj, *q, *k, *v, *graw, *g, *beta, *gate, *o, *gu, *sel, *lg;
    real *tmp_state, *tmp_win, *fold_work;
    /* forward_sample: logits of up to sample_rows positions, the sampler's work space */
    float *slg;
    double *sprobs;
    int32_t *sorder;
    int64_t sample_rows;
} cpu_backend;

#define SELF(b) ((cpu_backend *)(b))

static void cpu_free_all(cpu_backend *cb) {
    if (cb->layers) {
        for (int32_t l = 0; l < cb->base.config.n_layers; l++) {
            cpu_layer *L = &cb->layers[l];
            real **p[] = {&L->attn_norm, &L->w_in, &L->conv, &L->f1, &L->A_log, &L->dt_bias,
                          &L->g1, &L->g1_bias, &L->o_norm, &L->w_o, &L->mlp_norm, &L->w_gu,
                          &L->w_down};
            for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) free(*p[i]);
        }
        free(cb->layers);
    }
    if (cb->head != cb->embed) free(cb->head);
    free(cb->embed), free(cb->final_norm), free(cb->state);
    real **ws[] = {&cb->x, &cb->h, &cb->proj, &cb->q, &cb->k, &cb->v, &cb->graw, &cb->g,
                   &cb->beta, &cb->gate, &cb->o, &cb->gu, &cb->sel, &cb->lg, &cb->tmp_state,
                   &cb->tmp_win, &cb->fold_work};
    for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++) free(*ws[i]), *ws[i] = NULL;
    free(cb->slg), free(cb->sprobs), free(cb->sorder);
    cb->slg = NULL, cb->sprobs = NULL, cb->sorder = NULL;
}

static void cpu_destroy(kd_backend *b) {
    cpu_free_all(SELF(b));
    free(b);
}

static real *alloc_real(int64_t n) {
    if (n <= 0) n = 1;
    return malloc((size_t)n * sizeof(real));
}

/* Converts tensor t (numel must be n) into dst + off. */
static int put(real *dst, int64_t off, const kd_tensor *t, int64_t n, const char *what,
               int32_t layer, kd_err *err) {
    if (!t->data || kd_tensor_numel(t) != n)
        return kd_fail(err, "cpu backend: layer %d %s: %s (expected %lld elements)", layer,
                       what, t->data ? "wrong size" : "missing", (long long)n);
    for (int64_t i = 0; i < n; i += 65536) {
        int64_t m = n - i < 65536 ? n - i : 65536;
#if KD_REAL_F64
        kd_tensor_to_f64(t, i, m, dst + off + i);
#else
        kd_tensor_to_f32(t, i, m, dst + off + i);
#endif
    }
    return 0;
}

static real *take(const kd_tensor *t, int64_t n, const char *what, int32_t layer, kd_err *err) {
    real *p = alloc_real(n);
    if (!p) {
        kd_fail(err, "cpu backend: out of memory for %s", what);
        return NULL;
    }
    if (put(p, 0, t, n, what, layer, err)) {
        free(p);
        return NULL;
    }
    return p;
}

static int cpu_load(kd_backend *b, const kd_config *c, const kd_model_tensors *w, kd_err *err) {
    cpu_backend *cb = SELF(b);
    if (cb->layers) return kd_fail(err, "cpu backend: weights already loaded");
    const int64_t D = c->hidden, K = c->head_k, V = c->head_v, HV = c->n_v_heads;
    const int64_t FF = c->intermediate, W = c->conv_size;
    cb->QK = kd_config_qk_dim(c);
    cb->VD = kd_config_v_dim(c);
    cb->P = 2 * cb->QK + cb->VD + 2 * V + HV;
    b->config = *c;
    kd_state_layout_init(&b->layout, c);
    cb->layers = calloc((size_t)c->n_layers, sizeof *cb->layers);
    if (!cb->layers) return kd_fail(err, "cpu backend: out of memory");
    if (!(cb->embed = take(&w->embed, (int64_t)c->vocab * D, "embeddings", -1, err))) goto fail;
    if (!(cb->final_norm = take(&w->final_norm, D, "norm", -1, err))) goto fail;
    if (c->tie_embeddings) cb->head = cb->embed;
    else if (!(cb->head = take(&w->lm_head, (int64_t)c->vocab * D, "lm_head", -1, err)))
        goto fail;
    for (int32_t l = 0; l < c->n_layers; l++) {
        const kd_layer_tensors *t = &w->layers[l];
        cpu_layer *L = &cb->layers[l];
#define TAKE(field, src, n) \
        if (!(L->field = take(&t->src, (n), #src, l, err))) goto fail;
        TAKE(attn_norm, attn_norm, D);
        TAKE(f1, f_proj1, HV * K * V);
        TAKE(A_log, A_log, HV);
        TAKE(dt_bias, dt_bias, HV * K);
        TAKE(g1, g_proj1, HV * V * V);
        TAKE(g1_bias, g_proj1_bias, HV * V);
        TAKE(o_norm, o_norm, V);
        TAKE(w_o, o_proj, D * HV * V);
        TAKE(mlp_norm, mlp_norm, D);
        TAKE(w_down, down_proj, D * FF);
#undef TAKE
        if (!(L->w_in = alloc_real(cb->P * D)) || !(L->w_gu = alloc_real(2 * FF * D))) {
            kd_fail(err, "cpu backend: out of memory");
            goto fail;
        }
        int64_t off = 0;
        const struct { const kd_tensor *t; int64_t rows; const char *what; } in[] = {
            {&t->q_proj, cb->QK, "q_proj"}, {&t->k_proj, cb->QK, "k_proj"},
            {&t->v_proj, cb->VD, "v_proj"}, {&t->f_proj0, V, "f_proj.0"},
            {&t->g_proj0, V, "g_proj.0"},   {&t->b_proj, HV, "b_proj"}};
        for (size_t i = 0; i < sizeof in / sizeof in[0]; i++) {
            if (put(L->w_in, off, in[i].t, in[i].rows * D, in[i].what, l, err)) goto fail;
            off += in[i].rows * D;
        }
        if (put(L->w_gu, 0, &t->gate_proj, FF * D, "gate_proj", l, err) ||
            put(L->w_gu, FF * D, &t->up_proj, FF * D, "up_proj", l, err))
            goto fail;
        if (c->use_short_conv) {
            if (!(L->conv = alloc_real((2 * cb->QK + cb->VD) * W))) {
                kd_fail(err, "cpu backend: out of memory");
                goto fail;
            }
            if (put(L->conv, 0, &t->q_conv, cb->QK * W, "q_conv1d", l, err) ||
                put(L->conv, cb->QK * W, &t->k_conv, cb->QK * W, "k_conv1d", l, err) ||
                put(L->conv, 2 * cb->QK * W, &t->v_conv, cb->VD * W, "v_conv1d", l, err))
                goto fail;
        }
    }
    return 0;
fail:
    cpu_free_all(cb);
    cb->layers = NULL, cb->embed = cb->head = cb->final_norm = NULL;
    return -1;
}

static int cpu_reserve(kd_backend *b, int32_t n_slots, int32_t max_rows, int64_t max_tokens,
                       int32_t max_window, kd_commit_mode mode, kd_err *err) {
    cpu_backend *cb = SELF(b);
    const kd_config *c = &b->config;
    if (!cb->layers) return kd_fail(err, "cpu backend: reserve before load");
    const int64_t T = max_tokens, D = c->hidden, HV = c->n_v_heads, K = c->head_k;
    const int64_t Tw = max_window, V = c->head_v;
    cb->conv_ch = c->use_short_conv ? 2 * cb->QK + cb->VD : 0;
    cb->rec_layer = Tw * cb->conv_ch +
                    (mode == KD_COMMIT_STORE_ALL ? Tw * b->layout.ssm_elems : Tw * HV * (V + 2 * K));
    cb->slot_total = b->layout.slot_elems + c->n_layers * cb->rec_layer;
    cb->state = calloc((size_t)n_slots + 1, (size_t)cb->slot_total * sizeof(real));
    cb->x = alloc_real(T * D), cb->h = alloc_real(T * D), cb->proj = alloc_real(T * cb->P);
    cb->q = alloc_real(T * cb->QK), cb->k = alloc_real(T * cb->QK), cb->v = alloc_real(T * cb->VD);
    cb->graw = alloc_real(T * HV * K), cb->g = alloc_real(T * HV * K), cb->beta = alloc_real(T * HV);
    cb->gate = alloc_real(T * cb->VD), cb->o = alloc_real(T * cb->VD);
    cb->gu = alloc_real(T * 2 * c->intermediate), cb->sel = alloc_real(T * D);
    cb->lg = KD_REAL_DTYPE == KD_F32 ? NULL : alloc_real(T * c->vocab);
    cb->tmp_state = alloc_real(b->layout.ssm_elems);
    cb->tmp_win = alloc_real(b->layout.conv_elems);
    cb->fold_work = alloc_real(2 * K);
    /* logit rows of a batch sampled by forward_sample: a window (<= max_window) or one
     * position per row, and never more than the tokens */
    cb->sample_rows = (int64_t)max_rows * max_window < T ? (int64_t)max_rows * max_window : T;
    cb->slg = malloc((size_t)(cb->sample_rows * c->vocab) * sizeof *cb->slg);
    cb->sprobs = malloc((size_t)c->vocab * sizeof *cb->sprobs);
    cb->sorder = malloc((size_t)c->vocab * sizeof *cb->sorder);
    if (!cb->slg || !cb->sprobs || !cb->sorder) {
        free(cb->state), cb->state = NULL;
        return kd_fail(err, "cpu backend: out of memory for sampling %lld positions",
                       (long long)cb->sample_rows);
    }
    if (!cb->state || !cb->x || !cb->h || !cb->proj || !cb->q || !cb->k || !cb->v ||
        !cb->graw || !cb->g || !cb->beta || !cb->gate || !cb->o || !cb->gu || !cb->sel ||
        (KD_REAL_DTYPE != KD_F32 && !cb->lg) || !cb->tmp_state || !cb->tmp_win || !cb->fold_work) {
        free(cb->state), cb->state = NULL;
        return kd_fail(err, "cpu backend: out of memory for %d slots and %lld tokens", n_slots,
                       (long long)max_tokens);
    }
    b->n_slots = n_slots, b->max_rows = max_rows, b->max_tokens = max_tokens;
    b->max_window = max_window, b->mode = mode;
    b->slot_bytes = (size_t)cb->slot_total * sizeof(real);
    return 0;
}

static real *slot_state(cpu_backend *cb, int32_t slot) {
    return cb->state + (size_t)slot * (size_t)cb->slot_total;
}

static real *layer_state(cpu_backend *cb, int32_t slot, int32_t l) {
    return slot_state(cb, slot) + (size_t)l * (size_t)cb->base.layout.layer_elems;
}

/* Records of one layer: conv inputs [T][C], then the mode's part. */
static real *layer_records(cpu_backend *cb, int32_t slot, int32_t l) {
    return slot_state(cb, slot) + cb->base.layout.slot_elems + (size_t)l * (size_t)cb->rec_layer;
}

static int cpu_reset_slot(kd_backend *b, int32_t slot, kd_err *err) {
    (void)err;
    memset(slot_state(SELF(b), slot), 0, (size_t)b->layout.slot_elems * sizeof(real));
    return 0;
}

/* Commits records [t0, t1) of layer l of a slot into its committed state (the fold). In
 * store-all mode the state after t1 tokens is stored whole: it is copied, not folded. */
static void fold_layer(cpu_backend *cb, int32_t slot, int32_t l, int32_t t0, int32_t t1) {
    const kd_config *c = &cb->base.config;
    const int64_t HV = c->n_v_heads, K = c->head_k, V = c->head_v, Tw = cb->base.max_window;
    real *S = layer_state(cb, slot, l), *win = S + cb->base.layout.ssm_elems;
    real *rec = layer_records(cb, slot, l), *xrec = rec, *mode_rec = rec + Tw * cb->conv_ch;
    if (t1 <= t0) return;
    if (cb->conv_ch)
        KD_SFX(kd_conv_fold)(win, xrec + t0 * cb->conv_ch, cb->conv_ch, t1 - t0, cb->conv_ch,
                             c->conv_size);
    if (cb->base.mode == KD_COMMIT_STORE_ALL) {
        memcpy(S, mode_rec + (t1 - 1) * cb->base.layout.ssm_elems,
               (size_t)cb->base.layout.ssm_elems * sizeof(real));
        return;
    }
    const real *u = mode_rec, *kg = mode_rec + Tw * HV * V;
    KD_SFX(kd_kda_fold)(S, kg, u, cb->layers[l].A_log, cb->layers[l].dt_bias, HV, K, V, t0, t1,
                        c->use_lower_bound, c->lower_bound, cb->fold_work);
}

static int cpu_commit(kd_backend *b, int32_t slot, int32_t n, int32_t snap_at, void *snap_dst,
                      kd_err *err) {
    (void)err;
    cpu_backend *cb = SELF(b);
    for (int32_t l = 0; l < b->config.n_layers; l++) {
        if (snap_at > 0) {
            fold_layer(cb, slot, l, 0, snap_at);
            memcpy((real *)snap_dst + (size_t)l * b->layout.layer_elems, layer_state(cb, slot, l),
                   (size_t)b->layout.layer_elems * sizeof(real));
        }
        fold_layer(cb, slot, l, snap_at, n);
    }
    return 0;
}

/* C[M][N] = A[M][K] * B[N][K]^T + beta * C (row-major, leading dims given). */
static void gemm_nt(int64_t M, int64_t N, int64_t K, const real *A, int64_t lda, const real *B,
                    int64_t ldb, real beta, real *C, int64_t ldc) {
    if (M == 0) return;
    KD_GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, (int)M, (int)N, (int)K, 1, A, (int)lda, B,
            (int)ldb, beta, C, (int)ldc);
}

static void kda_layer(cpu_backend *cb, int32_t l, const kd_batch *batch, int64_t N) {
    const kd_config *c = &cb->base.config;
    const cpu_layer *L = &cb->layers[l];
    const int64_t D = c->hidden, H = c->n_heads, HV = c->n_v_heads, K = c->head_k,
                  V = c->head_v, P = cb->P, QK = cb->QK, VD = cb->VD, W = c->conv_size;
    real *x = cb->x, *h = cb->h, *proj = cb->proj;

    for (int64_t t = 0; t < N; t++) KD_SFX(kd_rmsnorm)(h + t * D, x + t * D, L->attn_norm, D, c->norm_eps);
    gemm_nt(N, P, D, h, D, L->w_in, D, 0, proj, P);
    /* g_raw = f_proj.1(f_proj.0 h); output gate = g_proj.1(g_proj.0 h) + bias. */
    gemm_nt(N, HV * K, V, proj + 2 * QK + VD, P, L->f1, V, 0, cb->graw, HV * K);
    gemm_nt(N, VD, V, proj + 2 * QK + VD + V, P, L->g1, V, 0, cb->gate, VD);
    for (int64_t t = 0; t < N; t++) {
        real *gt = cb->gate + t * VD;
        for (int64_t i = 0; i < VD; i++) gt[i] += L->g1_bias[i];
        KD_SFX(kd_kda_gate)(cb->g + t * HV * K, cb->graw + t * HV * K, L->A_log, L->dt_bias, HV, K,
                            c->use_lower_bound, c->lower_bound);
        KD_SFX(kd_kda_beta)(cb->beta + t * HV, proj + t * P + 2 * QK + VD + 2 * V, HV,
                            c->allow_neg_eigval);
    }
    /* Per row: short conv from the slot's window, L2 norms, recurrence from the slot's S.
     * A verify row first folds its pending tokens, then runs from copies of the committed
     * window and state and writes records instead of committing. */
    const int64_t Tw = cb->base.max_window, C = cb->conv_ch;
    int64_t t0 = 0;
    for (int32_t r = 0; r < batch->n_rows; r++) {
        const kd_batch_row *row = &batch->rows[r];
        const int64_t n = row->n_tokens;
        const int verify = row->kind == KD_ROW_VERIFY;
        real *S = layer_state(cb, row->slot, l), *win = S + cb->base.layout.ssm_elems;
        real *rec = layer_records(cb, row->slot, l), *mode_rec = rec + Tw * C;
        const real *in = proj + t0 * P;
        real *q = cb->q + t0 * QK, *k = cb->k + t0 * QK, *v = cb->v + t0 * VD;
        const real *src = S; /* the state the window starts from */
        if (verify && row->fold > 0) {
            if (cb->base.mode == KD_COMMIT_STORE_ALL) { /* stock: read the accepted state */
                if (C) KD_SFX(kd_conv_fold)(win, rec, C, row->fold, C, (int)W);
                src = mode_rec + (row->fold - 1) * cb->base.layout.ssm_elems;
            } else {
                fold_layer(cb, row->slot, l, 0, row->fold);
            }
        }
        if (c->use_short_conv) {
            const int64_t Wm = W - 1;
            real *w0 = win;
            if (verify) { /* the window runs on a copy; its inputs become records */
                memcpy(cb->tmp_win, win, (size_t)cb->base.layout.conv_elems * sizeof(real));
                w0 = cb->tmp_win;
                for (int64_t t = 0; t < n; t++) memcpy(rec + t * C, in + t * P, (size_t)C * sizeof(real));
            }
            KD_SFX(kd_conv_silu)(q, QK, in, P, n, QK, w0, L->conv, (int)W);
            KD_SFX(kd_conv_silu)(k, QK, in + QK, P, n, QK, w0 + QK * Wm, L->conv + QK * W, (int)W);
            KD_SFX(kd_conv_silu)(v, VD, in + 2 * QK, P, n, VD, w0 + 2 * QK * Wm,
                                 L->conv + 2 * QK * W, (int)W);
        } else {
            for (int64_t t = 0; t < n; t++) {
                KD_SFX(kd_silu)(q + t * QK, in + t * P, QK);
                KD_SFX(kd_silu)(k + t * QK, in + t * P + QK, QK);
                KD_SFX(kd_silu)(v + t * VD, in + t * P + 2 * QK, VD);
            }
        }
        if (verify && cb->base.mode != KD_COMMIT_STORE_ALL) { /* raw key and gate records */
            real *kg = mode_rec + Tw * HV * V;
            for (int64_t t = 0; t < n; t++)
                for (int64_t hv = 0; hv < HV; hv++) {
                    real *dst = kg + (t * HV + hv) * 2 * K;
                    memcpy(dst, k + t * QK + (hv / (HV / H)) * K, (size_t)K * sizeof(real));
                    memcpy(dst + K, cb->graw + (t0 + t) * HV * K + hv * K, (size_t)K * sizeof(real));
                }
        }
        for (int64_t t = 0; t < n * H; t++) {
            KD_SFX(kd_l2norm)(q + t * K, K, 1e-6, 1.0 / sqrt((double)K));
            KD_SFX(kd_l2norm)(k + t * K, K, 1e-6, 1.0);
        }
        real *state = S, *u_out = NULL, *states_out = NULL;
        if (verify) {
            memcpy(cb->tmp_state, src, (size_t)cb->base.layout.ssm_elems * sizeof(real));
            state = cb->tmp_state;
            if (cb->base.mode == KD_COMMIT_STORE_ALL) states_out = mode_rec;
            else u_out = mode_rec;
        }
        KD_SFX(kd_kda_recurrent)(cb->o + t0 * VD, state, q, k, v, cb->g + t0 * HV * K,
                                 cb->beta + t0 * HV, n, H, HV, K, V, u_out, states_out);
        t0 += n;
    }
    for (int64_t t = 0; t < N * HV; t++)
        KD_SFX(kd_gated_rmsnorm)(cb->o + t * V, cb->o + t * V, cb->gate + t * V, L->o_norm, V,
                                 c->norm_eps);
    gemm_nt(N, D, VD, cb->o, VD, L->w_o, VD, 1, x, D);
}

static void mlp_layer(cpu_backend *cb, int32_t l, int64_t N) {
    const kd_config *c = &cb->base.config;
    const cpu_layer *L = &cb->layers[l];
    const int64_t D = c->hidden, FF = c->intermediate;
    for (int64_t t = 0; t < N; t++)
        KD_SFX(kd_rmsnorm)(cb->h + t * D, cb->x + t * D, L->mlp_norm, D, c->norm_eps);
    gemm_nt(N, 2 * FF, D, cb->h, D, L->w_gu, D, 0, cb->gu, 2 * FF);
    for (int64_t t = 0; t < N; t++)
        KD_SFX(kd_swiglu)(cb->gu + t * 2 * FF, cb->gu + t * 2 * FF, cb->gu + t * 2 * FF + FF, FF);
    gemm_nt(N, D, FF, cb->gu, 2 * FF, L->w_down, FF, 1, cb->x, D);
}

static int cpu_forward(kd_backend *b, const kd_batch *batch, float *logits, kd_err *err) {
    (void)err;
    cpu_backend *cb = SELF(b);
    const kd_config *c = &b->config;
    const int64_t D = c->hidden, N = kd_batch_tokens(batch);
    for (int64_t t = 0; t < N; t++)
        memcpy(cb->x + t * D, cb->embed + (int64_t)batch->tokens[t] * D, (size_t)D * sizeof(real));
    for (int32_t l = 0; l < c->n_layers; l++) {
        kda_layer(cb, l, batch, N);
        mlp_layer(cb, l, N);
    }
    /* Final norm of the positions that want logits, then one GEMM with the head. */
    int64_t M = 0, t0 = 0;
    for (int32_t r = 0; r < batch->n_rows; r++) {
        const kd_batch_row *row = &batch->rows[r];
        int64_t first = row->logits == KD_LOGITS_ALL ? 0 : row->n_tokens - 1;
        if (row->logits != KD_LOGITS_NONE)
            for (int64_t t = first; t < row->n_tokens; t++, M++)
                KD_SFX(kd_rmsnorm)(cb->sel + M * D, cb->x + (t0 + t) * D, cb->final_norm, D,
                                   c->norm_eps);
        t0 += row->n_tokens;
    }
#if KD_REAL_F64
    gemm_nt(M, c->vocab, D, cb->sel, D, cb->head, D, 0, cb->lg, c->vocab);
    for (int64_t i = 0; i < M * c->vocab; i++) logits[i] = (float)cb->lg[i];
#else
    gemm_nt(M, c->vocab, D, cb->sel, D, cb->head, D, 0, logits, c->vocab);
#endif
    return 0;
}

/* The reference of the device-side sampling: forward into the backend's own logits, then
 * kd/sampling.h row by row. */
static int cpu_forward_sample(kd_backend *b, const kd_batch *batch, const kd_sample_params *params,
                              const double *uniforms, int32_t *tokens, int32_t *accepted, int32_t *used,
                              kd_err *err) {
    cpu_backend *cb = SELF(b);
    const int64_t M = kd_batch_logit_rows(batch);
    if (M > cb->sample_rows)
        return kd_fail(err, "cpu backend: %lld logit rows to sample, reserved %lld", (long long)M,
                       (long long)cb->sample_rows);
    if (cpu_forward(b, batch, cb->slg, err)) return -1;
    kd_sample_batch_ref(batch, cb->slg, b->config.vocab, b->max_window, params, uniforms, cb->sprobs,
                        cb->sorder, tokens, accepted, used);
    return 0;
}

static int cpu_state_read(kd_backend *b, int32_t slot, void *dst, size_t bytes, kd_err *err) {
    (void)err;
    memcpy(dst, slot_state(SELF(b), slot), bytes);
    return 0;
}

static int cpu_state_write(kd_backend *b, int32_t slot, const void *src, size_t bytes,
                           kd_err *err) {
    (void)err;
    memcpy(slot_state(SELF(b), slot), src, bytes);
    return 0;
}

static int cpu_state_copy(kd_backend *b, int32_t dst, int32_t src, kd_err *err) {
    (void)err;
    memcpy(slot_state(SELF(b), dst), slot_state(SELF(b), src),
           (size_t)b->layout.slot_elems * sizeof(real));
    return 0;
}

static int cpu_state_write_part(kd_backend *b, int32_t slot, size_t offset, const void *src, size_t len,
                                kd_err *err) {
    (void)err;
    memcpy((char *)slot_state(SELF(b), slot) + offset, src, len);
    return 0;
}

static int cpu_state_hash(kd_backend *b, int32_t slot, size_t offset, size_t len, uint64_t *out, kd_err *err) {
    (void)err;
    *out = XXH3_64bits((const char *)slot_state(SELF(b), slot) + offset, len);
    return 0;
}

static int cpu_state_hash_update(kd_backend *b, int32_t slot, size_t offset, size_t len, XXH3_state_t *h,
                                 kd_err *err) {
    if (XXH3_64bits_update(h, (const char *)slot_state(SELF(b), slot) + offset, len) != XXH_OK)
        return kd_fail(err, "state hash: XXH3 update failed");
    return 0;
}

static int cpu_synchronize(kd_backend *b, kd_err *err) {
    (void)b, (void)err;
    return 0;
}

static const kd_backend_ops cpu_ops = {
#if KD_REAL_F64
    .name = "cpu-f64",
#else
    .name = "cpu",
#endif
    .destroy = cpu_destroy,
    .load = cpu_load,
    .reserve = cpu_reserve,
    .reset_slot = cpu_reset_slot,
    .forward = cpu_forward,
    .state_read = cpu_state_read,
    .state_write = cpu_state_write,
    .state_copy = cpu_state_copy,
    .commit = cpu_commit,
    .state_write_part = cpu_state_write_part,
    .state_hash = cpu_state_hash,
    .state_hash_update = cpu_state_hash_update,
    .synchronize = cpu_synchronize,
    .forward_sample = cpu_forward_sample,
};

kd_backend *KD_SFX(kd_cpu_create)(kd_err *err) {
    cpu_backend *cb = calloc(1, sizeof *cb);
    if (!cb) {
        kd_fail(err, "cpu backend: out of memory");
        return NULL;
    }
    cb->base.ops = &cpu_ops;
    cb->base.state_dtype = KD_REAL_DTYPE;
    return &cb->base;
}
