/* kd/config.h: the shape and options of a KDA model (KDA.md §1-2), independent of files. */
#ifndef KD_CONFIG_H
#define KD_CONFIG_H

#include "kd/types.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kd_config {
    int32_t hidden;          /* D */
    int32_t n_layers;        /* L (all KDA layers; softmax-attention layers are not supported yet) */
    int32_t n_heads;         /* H: query/key heads */
    int32_t n_v_heads;       /* HV: value heads, a multiple of H (grouped value heads) */
    int32_t head_k;          /* K: key head dim */
    int32_t head_v;          /* V = K * expand_v */
    int32_t conv_size;       /* W: short conv width (>= 1) */
    int32_t use_short_conv;  /* 0: q = silu(q_proj h) etc., no conv state */
    int32_t intermediate;    /* I: MLP width */
    int32_t vocab;
    double norm_eps;         /* RMSNorm eps (attn_norm, mlp_norm, o_norm, final norm) */
    int32_t use_lower_bound; /* 1: g = lb * sigmoid(exp(A_log) * (g_raw + dt_bias)) */
    double lower_bound;      /* lb < 0 when use_lower_bound */
    int32_t allow_neg_eigval;/* beta doubled */
    int32_t tie_embeddings;  /* head = embeddings */
} kd_config;

/* Checks ranges and consistency (HV % H == 0, sizes > 0 and small enough that every
 * derived byte count fits in int64). Returns 0 or -1 with a message. */
int kd_config_check(const kd_config *c, kd_err *err);

/* Derived sizes (elements). */
static inline int64_t kd_config_qk_dim(const kd_config *c) { return (int64_t)c->n_heads * c->head_k; }
static inline int64_t kd_config_v_dim(const kd_config *c) { return (int64_t)c->n_v_heads * c->head_v; }
/* Recurrent state of one layer: HV x K x V. */
static inline int64_t kd_config_ssm_elems(const kd_config *c) {
    return (int64_t)c->n_v_heads * c->head_k * c->head_v;
}
/* Conv window of one layer: (W-1) past inputs for each q, k and v channel (0 without conv). */
static inline int64_t kd_config_conv_elems(const kd_config *c) {
    if (!c->use_short_conv) return 0;
    return (int64_t)(c->conv_size - 1) * (2 * kd_config_qk_dim(c) + kd_config_v_dim(c));
}

#ifdef __cplusplus
}
#endif
#endif
