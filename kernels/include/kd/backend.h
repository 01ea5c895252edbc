/* kd/backend.h: the compute interface every backend implements (a C vtable, in the style
 * of ggml-backend). The engine talks only to this; nothing here knows about gRPC.
 *
 * Model state lives in the backend, in request slots allocated once by kd_backend_reserve:
 * slots 0..n_slots-1 belong to requests and slot n_slots is the scratch row (rows of a
 * batch that own no request point there). The *committed* state of one slot is, per KDA
 * layer, the recurrent state S [HV][K][V] followed by the conv window [3 convs][channels]
 * [W-1] (kd_state_layout), in the backend's state element type: that is what state_read /
 * state_write / state_copy move (handoff, prefix cache).
 *
 * Two kinds of rows (KDA.md §3-5):
 * - PREFILL: advances the committed state by the row's tokens, in order (chunked prefill
 *   is a sequence of such rows). The slot must hold no uncommitted verify records.
 * - VERIFY: a speculative window of 1..max_window tokens (x0 and the drafts). First folds
 *   `fold` tokens of the slot's previous window into the committed state (the deferred
 *   RecoverSSM: pending = 1 + accepted of the last step), then runs the window from that
 *   state without committing it, and keeps per-token records so that any prefix of the
 *   window can be committed later: by the fold of the next verify, or by kd_backend_commit
 *   (eager commits, flushes).
 * In store-all mode (the stock baseline) the records are the full states after each window
 * position instead, and a fold selects one of them. */
#ifndef KD_BACKEND_H
#define KD_BACKEND_H

#include "kd/config.h"
#include "kd/sampling.h"
#include "kd/sum64.h"
#include "kd/weights.h"

#ifdef __cplusplus
extern "C" {
#endif

struct XXH3_state_s; /* xxhash.h's XXH3_state_t */

typedef enum kd_logits_mode {
    KD_LOGITS_NONE = 0, /* no logits for this row */
    KD_LOGITS_LAST = 1, /* logits of the last token only */
    KD_LOGITS_ALL = 2   /* logits of every token of the row */
} kd_logits_mode;

typedef enum kd_row_kind {
    KD_ROW_PREFILL = 0,
    KD_ROW_VERIFY = 1
} kd_row_kind;

typedef struct kd_batch_row {
    int32_t slot;     /* 0..n_slots (n_slots = scratch row) */
    int32_t n_tokens; /* >= 1 (<= max_window for VERIFY); consecutive in kd_batch.tokens */
    int32_t logits;   /* kd_logits_mode */
    int32_t kind;     /* kd_row_kind */
    int32_t fold;     /* VERIFY: tokens of the previous window to commit first (0..its length) */
} kd_batch_row;

/* How verify windows keep what they did (see the top of this file). */
typedef enum kd_commit_mode {
    KD_COMMIT_DEFERRED = 0, /* records; commit folded into the next verify */
    KD_COMMIT_EAGER = 1,    /* records; the engine commits right after sampling */
    KD_COMMIT_STORE_ALL = 2 /* one full state per window position (stock approach) */
} kd_commit_mode;

const char *kd_commit_mode_name(kd_commit_mode m);
int kd_commit_mode_parse(const char *s, kd_commit_mode *out);

typedef struct kd_batch {
    int32_t n_rows;
    const kd_batch_row *rows;
    const int32_t *tokens; /* sum of n_tokens, row after row */
} kd_batch;

/* Number of logit rows a batch produces (rows in order, positions in order). */
int64_t kd_batch_logit_rows(const kd_batch *b);
int64_t kd_batch_tokens(const kd_batch *b);
/* Validates a batch against the reserved sizes and the vocabulary. */
int kd_batch_check(const kd_batch *b, int32_t n_slots, int64_t max_tokens, int32_t max_window,
                   int32_t vocab, kd_err *err);

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
    /* Allocates n_slots + 1 state slots (zeroed, with records for windows of up to
     * max_window tokens in the given mode) and work space for batches of up to max_tokens
     * tokens and max_rows rows. Called once after load; sets the fields below. */
    int (*reserve)(kd_backend *b, int32_t n_slots, int32_t max_rows, int64_t max_tokens,
                   int32_t max_window, kd_commit_mode mode, kd_err *err);
    /* Zeroes a slot's state (a fresh sequence). */
    int (*reset_slot)(kd_backend *b, int32_t slot, kd_err *err);
    /* Runs a batch; logits: [kd_batch_logit_rows(batch)][vocab] floats. */
    int (*forward)(kd_backend *b, const kd_batch *batch, float *logits, kd_err *err);
    /* State copy out of / into a slot (layout above, state_dtype elements). */
    int (*state_read)(kd_backend *b, int32_t slot, void *dst, size_t bytes, kd_err *err);
    int (*state_write)(kd_backend *b, int32_t slot, const void *src, size_t bytes, kd_err *err);
    /* Copies slot src's state to slot dst. */
    int (*state_copy)(kd_backend *b, int32_t dst, int32_t src, kd_err *err);
    /* Writes bytes [offset, offset + len) of a slot's committed state (a handoff arriving in
     * chunks; on a GPU through a staging buffer into device memory). */
    int (*state_write_part)(kd_backend *b, int32_t slot, size_t offset, const void *src, size_t len,
                            kd_err *err);
    /* XXH3-64 of bytes [offset, offset + len) of a slot's committed state, computed where the
     * state lives: what landed in the slot, not what was sent. */
    int (*state_hash)(kd_backend *b, int32_t slot, size_t offset, size_t len, uint64_t *out, kd_err *err);
    /* Optional (NULL: not offered). Feeds bytes [offset, offset + len) of a slot's committed
     * state, read where the state lives, into a streaming XXH3-64 state: a handoff hashes each
     * piece right after writing it (what landed, while in cache) instead of a second pass. */
    int (*state_hash_update)(kd_backend *b, int32_t slot, size_t offset, size_t len, struct XXH3_state_s *h,
                             kd_err *err);
    /* Commits the first n tokens of the slot's last verify window (dropping the rest).
     * If 1 <= snap_at <= n, also writes the committed state after snap_at of them to
     * snap_dst (state bytes, host memory): the exact boundary state for the prefix cache. */
    int (*commit)(kd_backend *b, int32_t slot, int32_t n, int32_t snap_at, void *snap_dst,
                  kd_err *err);
    /* Waits for queued work (no-op on the CPU). */
    int (*synchronize)(kd_backend *b, kd_err *err);
    /* Device memory of a slot's committed state, for transports that move it GPU to GPU (NULL
     * in backends that keep the state in host memory): fills out[] with its non-empty regions in
     * the export layout's order (per layer: S, then the conv window) and returns their number,
     * or -1 with a message when more than max. Valid until the backend is destroyed; the
     * caller orders its own streams against the backend's (it synchronizes after each op).
     * The regions hold the state as of the slot's last reset, state write, copy into, read or
     * hash (the CUDA backend keeps running slots' conv windows elsewhere); a transport writes
     * a slot reset (or written) since its last forward or commit. */
    int (*state_regions)(kd_backend *b, int32_t slot, kd_dev_region *out, int max, kd_err *err);
    /* Runs a batch like forward and samples its logits where they are (on a GPU: only the
     * tokens come back); see kd_backend_forward_sample. */
    int (*forward_sample)(kd_backend *b, const kd_batch *batch, const kd_sample_params *params,
                          const double *uniforms, int32_t *tokens, int32_t *accepted, int32_t *used,
                          kd_err *err);
} kd_backend_ops;

struct kd_backend {
    const kd_backend_ops *ops;
    kd_dtype state_dtype;  /* element type of state_read/state_write */
    kd_config config;      /* set by load */
    kd_state_layout layout;/* set by load */
    int32_t n_slots;       /* set by reserve (request slots; scratch = n_slots) */
    int32_t max_rows;
    int64_t max_tokens;
    int32_t max_window;
    kd_commit_mode mode;
    size_t slot_bytes;     /* memory per slot: committed state plus records, set by reserve */
    int32_t *records;      /* [n_slots + 1]: tokens recorded by the slot's last verify and not
                            * committed or dropped since (0: the state is committed) */
};

/* Thin wrappers that check arguments before calling the backend. */
int kd_backend_load(kd_backend *b, const kd_config *c, const kd_model_tensors *w, kd_err *err);
int kd_backend_reserve(kd_backend *b, int32_t n_slots, int32_t max_rows, int64_t max_tokens,
                       int32_t max_window, kd_commit_mode mode, kd_err *err);
/* Bytes of one slot's memory in a mode, without reserving (capacity planning, benchmarks). The CUDA
 * backend's lazy checkpoint (kd_cuda_set_lazy) keeps records for more tokens than max_window: after
 * reserve, kd_backend.slot_bytes is the figure. */
size_t kd_slot_bytes(const kd_config *c, int32_t max_window, kd_commit_mode mode,
                     size_t state_elem_bytes, size_t act_elem_bytes);
int kd_backend_reset_slot(kd_backend *b, int32_t slot, kd_err *err);
int kd_backend_forward(kd_backend *b, const kd_batch *batch, float *logits, kd_err *err);
/* Runs a batch and samples it (kd/sampling.h) instead of returning logits. Per batch row r,
 * by its logits mode:
 * - KD_LOGITS_ALL (n_tokens <= max_window): the row is a speculative window x0, d_1..d_n
 *   (n = n_tokens - 1, the drafts are the row's own tokens): kd_accept_window with
 *   params[r] and the uniforms uniforms[r * max_window ...];
 * - KD_LOGITS_LAST: one token drawn from the last position's logits (a window of no drafts);
 * - KD_LOGITS_NONE: nothing (accepted[r] = used[r] = 0).
 * Writes tokens[r * max_window + 0..a] (the a accepted drafts, then the new token),
 * accepted[r] = a and used[r] = the uniforms the row consumed (0 when greedy): the caller's
 * generator advances by that many. The CPU reference gives exactly kd_accept_window's
 * answers; a GPU gives the same tokens except where a uniform, the top_p mass or a draft's
 * acceptance probability lies within float rounding of a decision boundary (its sums run in
 * another order). uniforms: [n_rows][max_window], each in [0, 1). */
int kd_backend_forward_sample(kd_backend *b, const kd_batch *batch, const kd_sample_params *params,
                              const double *uniforms, int32_t *tokens, int32_t *accepted, int32_t *used,
                              kd_err *err);
/* The reference of forward_sample's sampling on host logits ([kd_batch_logit_rows][vocab], as
 * forward returns them); probs, order: work space of vocab entries. */
void kd_sample_batch_ref(const kd_batch *batch, const float *logits, int32_t vocab, int32_t max_window,
                         const kd_sample_params *params, const double *uniforms, double *probs,
                         int32_t *order, int32_t *tokens, int32_t *accepted, int32_t *used);
size_t kd_backend_state_bytes(const kd_backend *b);
int kd_backend_state_read(kd_backend *b, int32_t slot, void *dst, size_t bytes, kd_err *err);
int kd_backend_state_write(kd_backend *b, int32_t slot, const void *src, size_t bytes,
                           kd_err *err);
/* Tests and debugging: the committed checkpoint of a slot even while a window's records are
 * pending (deferred and eager modes only; in store-all the checkpoint is not kept apart). */
int kd_backend_checkpoint_read(kd_backend *b, int32_t slot, void *dst, size_t bytes, kd_err *err);
int kd_backend_state_copy(kd_backend *b, int32_t dst, int32_t src, kd_err *err);
int kd_backend_state_write_part(kd_backend *b, int32_t slot, size_t offset, const void *src, size_t len,
                                kd_err *err);
int kd_backend_state_hash(kd_backend *b, int32_t slot, size_t offset, size_t len, uint64_t *out, kd_err *err);
/* Whether the backend offers state_hash_update, and the checked call (-1 without it). */
int kd_backend_has_hash_update(const kd_backend *b);
int kd_backend_state_hash_update(kd_backend *b, int32_t slot, size_t offset, size_t len, struct XXH3_state_s *h,
                                 kd_err *err);
int kd_backend_commit(kd_backend *b, int32_t slot, int32_t n, int32_t snap_at, void *snap_dst,
                      kd_err *err);
/* The device regions of a slot's state (see state_regions); -1 with a message on a backend
 * without device memory. */
int kd_backend_state_regions(kd_backend *b, int32_t slot, kd_dev_region *out, int max, kd_err *err);
void kd_backend_free(kd_backend *b);

/* The CPU reference backend: fp32 (use_f64 = 0) or fp64 throughout (for tests).
 * Matrix products go through OpenBLAS on all cores. */
kd_backend *kd_cpu_backend_create(int use_f64, kd_err *err);

/* The CUDA backend on device 0: activations fp32 (act_bf16 = 0: fp32 weights, SGEMM; the
 * reference mode) or bf16 (bf16 weights and GEMM inputs, fp32 accumulation and outputs);
 * norms, gates, recurrence and the state in fp32 (state_dtype KD_F32). NULL with a message
 * when no device is usable, or when the environment's KDECODE_CUDA_LT_TABLE names a table
 * of cuBLASLt configurations (kd/lt_table.h) that cannot be read or does not parse (a table
 * that does replaces the built-in one for the bf16 products). */
kd_backend *kd_cuda_backend_create(int act_bf16, kd_err *err);

/* By name: "cpu", "cuda" (fails without a usable device) or "auto" (CUDA when a device is
 * usable, else the CPU; where a device is usable but the CUDA backend cannot be made, that
 * failure). act_bf16: bf16 activations on the GPU (the CPU computes in fp32). */
kd_backend *kd_backend_create(const char *name, int act_bf16, kd_err *err);

/* CUDA backend switches and test hooks (no-ops / failures on other backends):
 * graphs: forward_sample on decode batches (every row a verify window with all logits, no
 * prefill) replays a CUDA graph captured per padded shape (rows padded to the next power
 * of two with the scratch row, the longest window, tokens rounded up: cuda_backend.cu's
 * graph_rows); the first batch of a shape runs eagerly (or on a captured shape of the same rows
 * and window and more tokens), a later one captures it. On by default, off with the
 * environment KDECODE_CUDA_GRAPHS=0 at creation or kd_cuda_set_graphs(b, 0). */
int kd_cuda_set_graphs(kd_backend *b, int on);
/* The lazy checkpoint (KDA.md §7; deferred mode): records for up to factor x max_window tokens a
 * slot (at most 16), so that a verify whose fold and window fit in them keeps its folded state
 * instead of writing it back, and the next verify (or commit) folds both windows' tokens from the
 * checkpoint before: at factor 2 and every draft accepted, a slot's state is written every other
 * step. 1: off (every verify that folds writes its checkpoint). The environment's KDECODE_CUDA_LAZY
 * at creation sets it too. Before reserve (it sizes the records); returns the factor it replaces,
 * or -1 (nothing changed) on another backend, after reserve or for a factor outside 1..16. */
int kd_cuda_set_lazy(kd_backend *b, int factor);
/* The records a slot and layer hold when the lazy checkpoint is on (more than the longest window),
 * else 0; -1 on another backend or before reserve. For operators' logs. */
int32_t kd_cuda_lazy_records(kd_backend *b);
/* Tests: the tokens of a slot that its last verify folded without writing its checkpoint (0 when
 * the checkpoint is the committed state before the slot's window; -1 on another backend). */
int32_t kd_cuda_held(kd_backend *b, int32_t slot);
/* Captures the graphs of decode steps of up to `rows` requests before the first step, at most
 * max_graphs shapes (at most the backend's 96): first, for each padded row count and longest
 * window, the shape of every row at that window (which covers every step of those rows and
 * windows, so none runs eagerly), then the shapes of fewer tokens, fewest rows first. Call after
 * reserve, while no forward runs. Returns the graphs captured (0 on other
 * backends or with graphs off), or -1 with a message. */
int kd_cuda_warm_graphs(kd_backend *b, int32_t rows, int32_t max_graphs, kd_err *err);
/* Programmatic dependent launches between the CUDA backend's kernels (on by default; see
 * kernels/cuda/launch.cuh), or plain stream order: process-wide; drops the captured graphs
 * (the next batches capture them again). Benchmarks. */
int kd_cuda_set_pdl(kd_backend *b, int on);
/* f_proj.1 and g_proj.1 in one launch (on by default): of the skinny GEMM kernel where it
 * takes both (the same results as a launch each), else of cuBLAS's strided batched GEMM (bf16,
 * same shapes; cuBLAS's kernel for a batch of two may sum in another order than for one); or
 * one launch each (off). Drops the captured graphs. Benchmarks and tests. */
int kd_cuda_set_pair(kd_backend *b, int on);
/* How many of those batched cuBLAS launches the backend has made (captured launches counted
 * once), -1 for a backend that is not CUDA. Tests. */
int64_t kd_cuda_pair_batched(kd_backend *b);
/* The gate|up product and SwiGLU in one launch where the skinny kernel's row or
 * segment-diagonal form takes gate|up (on by default), or SwiGLU in its own kernel after it
 * (off; the same bits); drops the captured graphs. Benchmarks. */
int kd_cuda_set_swiglu(kd_backend *b, int on);
/* The gated RMSNorm loads its gate, bias and weights before its programmatic wait where two kernels
 * ran since g_proj.1 wrote the gate (on by default), or after it (off; the same bits); drops the
 * captured graphs. Benchmarks and tests. */
int kd_cuda_set_gnorm_early(kd_backend *b, int on);
/* The gate|up product's output in bf16 (fp32 sums rounded once at the store; SwiGLU reads it) where
 * cuBLASLt takes it (bf16 activations, not the skinny kernel's rows; on by default), or in fp32
 * (off). Not the same bits. Drops the captured graphs. Benchmarks and tests. */
int kd_cuda_set_gu_bf16(kd_backend *b, int on);
/* o_proj and the down projection (bf16, where cuBLAS takes them) in `slices` equal K slices, one
 * product of a strided batch each with its partial sums apart, which the RMSNorm after the product
 * adds into the residual stream (kernels/cuda/gemm_lt.cuh: twice the thread blocks where a
 * product has few output tiles), in forwards of min_rows..max_rows activation rows (at most 512);
 * slices 1: whole, with the residual added by the product (beta 1). By default 2 slices at 5-128
 * rows (measured faster there: kernels/cuda/cuda_backend.cu). Sums in another order than whole:
 * not the same bits. Drops the captured graphs; -1 for slices outside 1..KD_KSPLIT_MAX or
 * min_rows < 1 or max_rows < min_rows. Benchmarks and tests. */
#define KD_KSPLIT_MAX 4
int kd_cuda_set_ksplit(kd_backend *b, int slices, int64_t min_rows, int64_t max_rows);
/* How many products the backend has run in K slices (captured launches counted once), -1 for a
 * backend that is not CUDA. Tests. */
int64_t kd_cuda_ksplit_launches(kd_backend *b);
/* The backend's own skinny GEMM kernel for the products of few activation rows where it
 * beats cuBLAS (bf16 activations; on by default), or cuBLAS for every product (off); drops
 * the captured graphs. Benchmarks. */
int kd_cuda_set_skinny(kd_backend *b, int on);
/* The products of 2-4 activation rows and more than 256 keys (bf16 activations, the skinny
 * kernel on): 0, the default, as kd_cu_skinny_pick names (kernels/cuda/gemv.cuh: its
 * segment-diagonal tensor-core forms); -1 cuBLAS; a form of the skinny kernel, that form.
 * Drops the captured graphs; -1 for an unknown form. Benchmarks. */
int kd_cuda_set_skinny_rows_form(kd_backend *b, int form);
/* How the bf16 products that the skinny kernel does not take run: 0 cublasGemmEx (its default
 * algorithm), 1 cuBLASLt with the first algorithm of its heuristic, 2 (the default) cuBLASLt
 * with the algorithm kernels/cuda/gemm_lt.cuh's table names for the shape where it names one
 * (the built-in table, measured on an H200, taken on devices of compute capability 9.0 with
 * at least 132 SMs, elsewhere as 1; an operator's KDECODE_CUDA_LT_TABLE on any device). Drops
 * the captured graphs; -1 for another mode or a backend that is not
 * CUDA. Benchmarks and tests. */
int kd_cuda_set_lt(kd_backend *b, int mode);
/* Neighbouring kernels run as one: where the skinny GEMM's row form takes the products (few
 * activation rows), KD_CUDA_FUSE_COPY, the gates' bf16 copy in the input projection's
 * epilogue (off by default), and KD_CUDA_FUSE_CONV, the conv and f_proj.1 + g_proj.1 in one
 * launch (each block one or the other) where the kernel of KD_CUDA_FUSE_CONV_PREP does not run:
 * the conv of the q and k channels and the KDA prepare in one kernel (by row count,
 * kd_cuda_set_conv_prep; K a multiple of 4 up to 128, a conv of width 4; the v channels' conv
 * then runs alone just before it). Else each its own kernel. The same bits either way
 * (cuda_test compares them); drops the captured graphs; -1 for an unknown bit. Benchmarks and
 * tests. */
enum {
    KD_CUDA_FUSE_COPY = 1,
    KD_CUDA_FUSE_CONV = 2,
    KD_CUDA_FUSE_CONV_PREP = 4,
    KD_CUDA_FUSE_ALL = 7,
    /* the copy stays apart (measured faster so on an H200: kernels/cuda/cuda_backend.cu) */
    KD_CUDA_FUSE_DEFAULT = KD_CUDA_FUSE_CONV | KD_CUDA_FUSE_CONV_PREP
};
int kd_cuda_set_fuse(kd_backend *b, int mask);
/* The conv + prepare kernel (KD_CUDA_FUSE_CONV_PREP) at every row count where it applies
 * (always != 0), or (0, the default) only at the row counts where it was measured faster than
 * the two kernels apart. The same bits either way; drops the captured graphs. Benchmarks and
 * tests. */
int kd_cuda_set_conv_prep(kd_backend *b, int always);
/* In forwards of at least `rows` activation rows (0: never, the default; kernels/cuda/cuda_backend.cu
 * says why), the gates' bf16 copy and f_proj.1 run on
 * a second stream beside the conv and g_proj.1 beside the KDA kernels (forked after the input
 * projection; f_proj.1 joined before the KDA prepare, g_proj.1 before the gated RMSNorm), each
 * its own launch; else all on the step's stream (one launch where the skinny kernel takes them).
 * The same bits either way; drops the captured graphs; -1 for rows < 0. Benchmarks and tests. */
int kd_cuda_set_side_rows(kd_backend *b, int rows);
/* Benchmarks only, to place a step's time without a timeline profiler: leaves the named
 * kernels of every layer (or the head's product) out of the step, so its results are WRONG;
 * the time a step loses is what those kernels cost on its critical path. 0 (the default)
 * leaves nothing out; drops the captured graphs. */
enum {
    KD_CUDA_SKIP_NORMS = 1,       /* the attention and MLP RMSNorms */
    KD_CUDA_SKIP_IN_PROJ = 2,     /* the input projection */
    KD_CUDA_SKIP_COPY_COLS = 4,   /* the bf16 copy of the low-rank gates' inputs */
    KD_CUDA_SKIP_FG_PROJ = 8,     /* f_proj.1 and g_proj.1 */
    KD_CUDA_SKIP_CONV = 16,       /* the short conv + SiLU */
    KD_CUDA_SKIP_PREPARE = 32,    /* the KDA prepare (norms, decay, beta) */
    KD_CUDA_SKIP_VERIFY = 64,     /* the KDA verify */
    KD_CUDA_SKIP_GATED_NORM = 128, /* the output's gated RMSNorm */
    KD_CUDA_SKIP_O_PROJ = 256,    /* o_proj */
    KD_CUDA_SKIP_MLP = 512,       /* gate|up (+ SwiGLU) and the down projection */
    KD_CUDA_SKIP_HEAD = 1024,     /* the head's product (sampling still runs) */
    KD_CUDA_SKIP_PREFILL = 2048   /* the recurrence of prefill rows */
};
int kd_cuda_set_skip(kd_backend *b, unsigned kernels);
/* The L2 prefetch of weights (by default mode 4, 20 % of the L2, at most 4 requests): in forwards
 * of at most max_rows rows (more rows' state traffic would evict the weights before they are
 * read), each layer's
 * gate|up first rows and o_proj's weights (kd_cuda_set_prefetch_order), at most `bytes` a
 * layer (< 0: the default, 20 % of the device's L2 for mode 4, 30 % for modes 1-3; 0: off), are
 * prefetched into the L2 while the layer's latency-bound kernels (conv, KDA, norms) leave the
 * memory idle; mode 1-3 on a second stream (kernels/cuda/ops.cuh kd_cu_l2_prefetch), 4 from
 * blocks of the gated RMSNorm's launch (kd_cuda_set_prefetch_blocks) and of the MLP RMSNorm's
 * (kd_cuda_set_prefetch_mlp). The same
 * results either way; drops the captured graphs. Benchmarks and tests; -1 for a bad mode or a
 * backend that is not CUDA. */
int kd_cuda_set_prefetch(kd_backend *b, int64_t bytes, int max_rows, int mode);
/* The prefetch's order: gate|up's first rows first (1, the default), or o_proj's weights
 * first (0; in mode 4 the gated RMSNorm's blocks then take o_proj's weights and the MLP RMSNorm's
 * gate|up's first rows); drops the captured graphs. Benchmarks and tests. */
int kd_cuda_set_prefetch_order(kd_backend *b, int gate_up_first);
/* Mode 4 of kd_cuda_set_prefetch (the default): gate|up's first rows (at most `bytes` a layer)
 * prefetched by `blocks` (1-1024; default 16) more blocks of the gated RMSNorm's launch, which
 * start with the KDA verify before it, on the step's stream; modes 1-3 run on a second stream
 * (kernels/cuda/cuda_backend.cu says why they are not the default). Drops the captured graphs;
 * benchmarks and tests; -1 for a bad count. */
int kd_cuda_set_prefetch_blocks(kd_backend *b, int blocks);
/* Mode 4: at most `bytes` more of gate|up's rows (after the gated RMSNorm's share) from as many
 * blocks of the MLP RMSNorm's launch, which start with o_proj (default 10 % of the L2; 0: none).
 * Drops the captured graphs; benchmarks and tests; -1 for bytes < 0. */
int kd_cuda_set_prefetch_mlp(kd_backend *b, int64_t bytes);
/* Graphs captured so far and replays (statistics). */
void kd_cuda_graph_stats(kd_backend *b, int64_t *captured, int64_t *replays);
/* Samples host logits ([kd_batch_logit_rows][vocab]) with the device's sampling kernels, as
 * forward_sample would after a forward of this batch (which is not run): tests. */
int kd_cuda_sample_logits(kd_backend *b, const kd_batch *batch, const float *logits,
                          const kd_sample_params *params, const double *uniforms, int32_t *tokens,
                          int32_t *accepted, int32_t *used, kd_err *err);

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
