/* config.c: range and consistency checks of a model shape. */
#include "kd/config.h"

/* Generous limits: far above any real KDA model, low enough that every derived size
 * (state bytes, weight elements) fits comfortably in int64. */
#define KD_LIM_DIM (1 << 20)
#define KD_LIM_LAYERS 4096
#define KD_LIM_HEADS 4096
#define KD_LIM_HEAD_DIM 4096
#define KD_LIM_CONV 64
#define KD_LIM_VOCAB (1 << 24)

int kd_config_check(const kd_config *c, kd_err *err) {
#define RANGE(field, lo, hi)                                                                  \
    if (c->field < (lo) || c->field > (hi))                                                   \
        return kd_fail(err, "config: %s = %d is out of range [%d, %d]", #field, (int)c->field, \
                       (int)(lo), (int)(hi));
    RANGE(hidden, 1, KD_LIM_DIM);
    RANGE(n_layers, 1, KD_LIM_LAYERS);
    RANGE(n_heads, 1, KD_LIM_HEADS);
    RANGE(n_v_heads, 1, KD_LIM_HEADS);
    RANGE(head_k, 1, KD_LIM_HEAD_DIM);
    RANGE(head_v, 1, KD_LIM_HEAD_DIM);
    RANGE(intermediate, 1, KD_LIM_DIM);
    RANGE(vocab, 1, KD_LIM_VOCAB);
    if (c->use_short_conv) RANGE(conv_size, 1, KD_LIM_CONV);
#undef RANGE
    if (c->n_v_heads % c->n_heads != 0)
        return kd_fail(err, "config: num_v_heads %d is not a multiple of num_heads %d",
                       c->n_v_heads, c->n_heads);
    if (kd_config_qk_dim(c) > KD_LIM_DIM || kd_config_v_dim(c) > KD_LIM_DIM)
        return kd_fail(err, "config: heads x head_dim too large (%lld, %lld)",
                       (long long)kd_config_qk_dim(c), (long long)kd_config_v_dim(c));
    if (!(c->norm_eps > 0.0 && c->norm_eps < 1.0))
        return kd_fail(err, "config: norm_eps = %g must be in (0, 1)", c->norm_eps);
    if (c->use_lower_bound && !(c->lower_bound < 0.0 && c->lower_bound > -1e6))
        return kd_fail(err, "config: lower_bound = %g must be negative", c->lower_bound);
    return 0;
}
