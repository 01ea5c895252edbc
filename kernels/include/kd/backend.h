/* kd/backend.h: the compute interface every backend implements (a C vtable, in the style
 * of ggml-backend). The engine talks only to this; nothing here knows about gRPC.
 *
 * Model state lives in the backend, in request slots allocated once by kd_backend_reserve:
 * slots 0..n_slots-1 belong to requests and slot n_slots is the scratch row (rows of a
 * batch that own no request point there). The state of one slot is, per KDA layer, the
 * recurrent state S [HV][K][V] followed by the conv window [3 convs][channels][W-1]
 * (see kd_state_layout), in the backend's state element type.
 *
 * A forward call advances each row's slot by that row's tokens, in order, and writes
 * float logits for the positions the row asks for. Rows of one batch must use distinct
 * slots. Prefill in chunks is a sequence of forward calls on the same slot. */
#ifndef KD_BACKEND_H
#define KD_BACKEND_H

#include "kd/config.h"
#include "kd/weights.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum kd_logits_mode {
    KD_LOGITS_NONE = 0, /* no logits for this row */
    KD_LOGITS_LAST = 1, /* logits of the last token only */
    KD_LOGITS_ALL = 2   /* logits of every token of the row */
} kd_logits_mode;

typedef struct kd_batch_row {
    int32_t slot;     /* 0..n_slots (n_slots = scratch row) */
    int32_t n_tokens; /* >= 1; this row's tokens are consecutive in kd_batch.tokens */
    int32_t logits;   /* kd_logits_mode */
} kd_batch_row;

typedef struct kd_batch {
    int32_t n_rows;
    const kd_batch_row *rows;
    const int32_t *tokens; /* sum of n_tokens, row after row */
} kd_batch;

/* Number of logit rows a batch produces (rows in order, positions in order). */
int64_t kd_batch_logit_rows(const kd_batch *b);
int64_t kd_batch_tokens(const kd_batch *b);
/* Validates a batch against the reserved sizes and the vocabulary. */
int kd_batch_check(const kd_batch *b, int32_t n_slots, int64_t max_tokens, int32_t vocab,
                   kd_err *err);

/* Layout of one slot's state, in elements of the backend's state type. */
typedef struct kd_state_layout {
    int64_t ssm_elems;   /* per layer: HV*K*V */
    int64_t conv_elems;  /* per layer: 3 conv windows, (W-1) per channel; 0 without conv */
    int64_t layer_elems; /* ssm_elems + conv_elems */
    int64_t slot_elems;  /* n_layers * layer_elems */
} kd_state_layout;

void kd_state_layout_init(kd_state_layout *l, const kd_config *c);

typedef struct kd_backend kd_backend;

typedef struct kd_backend_ops {
    const char *name;
    void (*destroy)(kd_backend *b);
    /* Copies/converts the weights it needs; the views may be unmapped afterwards. */
    int (*load)(kd_backend *b, const kd_config *c, const kd_model_tensors *w, kd_err *err);
    /* Allocates n_slots + 1 state slots (zeroed) and work space for batches of up to
     * max_tokens tokens and max_rows rows. Called once after load. */
    int (*reserve)(kd_backend *b, int32_t n_slots, int32_t max_rows, int64_t max_tokens,
                   kd_err *err);
    /* Zeroes a slot's state (a fresh sequence). */
    int (*reset_slot)(kd_backend *b, int32_t slot, kd_err *err);
    /* Runs a batch; logits: [kd_batch_logit_rows(batch)][vocab] floats. */
    int (*forward)(kd_backend *b, const kd_batch *batch, float *logits, kd_err *err);
    /* State copy out of / into a slot (layout above, state_dtype elements). */
    int (*state_read)(kd_backend *b, int32_t slot, void *dst, size_t bytes, kd_err *err);
    int (*state_write)(kd_backend *b, int32_t slot, const void *src, size_t bytes, kd_err *err);
    /* Copies slot src's state to slot dst. */
    int (*state_copy)(kd_backend *b, int32_t dst, int32_t src, kd_err *err);
    /* Waits for queued work (no-op on the CPU). */
    int (*synchronize)(kd_backend *b, kd_err *err);
} kd_backend_ops;

struct kd_backend {
    const kd_backend_ops *ops;
    kd_dtype state_dtype;  /* element type of state_read/state_write */
    kd_config config;      /* set by load */
    kd_state_layout layout;/* set by load */
    int32_t n_slots;       /* set by reserve (request slots; scratch = n_slots) */
    int32_t max_rows;
    int64_t max_tokens;
};

/* Thin wrappers that check arguments before calling the backend. */
int kd_backend_load(kd_backend *b, const kd_config *c, const kd_model_tensors *w, kd_err *err);
int kd_backend_reserve(kd_backend *b, int32_t n_slots, int32_t max_rows, int64_t max_tokens,
                       kd_err *err);
int kd_backend_reset_slot(kd_backend *b, int32_t slot, kd_err *err);
int kd_backend_forward(kd_backend *b, const kd_batch *batch, float *logits, kd_err *err);
size_t kd_backend_state_bytes(const kd_backend *b);
int kd_backend_state_read(kd_backend *b, int32_t slot, void *dst, size_t bytes, kd_err *err);
int kd_backend_state_write(kd_backend *b, int32_t slot, const void *src, size_t bytes,
                           kd_err *err);
int kd_backend_state_copy(kd_backend *b, int32_t dst, int32_t src, kd_err *err);
void kd_backend_free(kd_backend *b);

/* The CPU reference backend: fp32 (use_f64 = 0) or fp64 throughout (for tests).
 * Matrix products go through OpenBLAS on all cores. */
kd_backend *kd_cpu_backend_create(int use_f64, kd_err *err);

/* CUDA: number of usable devices (0 without a GPU or driver; never fails). */
int kd_cuda_device_count(void);

/* What the CUDA side of this build sees (versions as the libraries encode them). */
typedef struct kd_cuda_info {
    int cudart_version;  /* e.g. 13000 */
    int driver_version;  /* 0 without a driver */
    int cublas_version;  /* major*10000 + minor*100 + patch */
    int nccl_version;    /* e.g. 22809 */
    int device_count;
    char device0_name[256];
    int device0_cc;      /* compute capability, e.g. 90 */
    int64_t device0_mem_bytes;
} kd_cuda_info;
void kd_cuda_describe(kd_cuda_info *info);

#ifdef __cplusplus
}
#endif
#endif
