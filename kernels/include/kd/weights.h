/* kd/weights.h: the tensors of a KDA checkpoint, as host views (KDA.md §1 names).
 * Shapes are [out, in] for linear layers. The views point into mapped checkpoint files
 * owned by the loader; a backend copies/converts what it needs in its load call. */
#ifndef KD_WEIGHTS_H
#define KD_WEIGHTS_H

#include "kd/config.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kd_layer_tensors {
    kd_tensor attn_norm;              /* [D] */
    kd_tensor q_proj, k_proj;         /* [H*K, D] */
    kd_tensor v_proj;                 /* [HV*V, D] */
    kd_tensor q_conv, k_conv;         /* [H*K, 1, W]  (absent without short conv) */
    kd_tensor v_conv;                 /* [HV*V, 1, W] */
    kd_tensor f_proj0;                /* [V, D] */
    kd_tensor f_proj1;                /* [HV*K, V] */
    kd_tensor b_proj;                 /* [HV, D] */
    kd_tensor A_log;                  /* [HV] */
    kd_tensor dt_bias;                /* [HV*K] */
    kd_tensor g_proj0;                /* [V, D] */
    kd_tensor g_proj1;                /* [HV*V, V] */
    kd_tensor g_proj1_bias;           /* [HV*V] */
    kd_tensor o_norm;                 /* [V] */
    kd_tensor o_proj;                 /* [D, HV*V] */
    kd_tensor mlp_norm;               /* [D] */
    kd_tensor gate_proj, up_proj;     /* [I, D] */
    kd_tensor down_proj;              /* [D, I] */
} kd_layer_tensors;

typedef struct kd_model_tensors {
    kd_tensor embed;       /* [vocab, D] */
    kd_tensor final_norm;  /* [D] */
    kd_tensor lm_head;     /* [vocab, D]; data == NULL when tied */
    int32_t n_layers;
    kd_layer_tensors *layers;
} kd_model_tensors;

#ifdef __cplusplus
}
#endif
#endif
