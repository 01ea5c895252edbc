// kda.cuh: the KDA recurrence on the GPU for decode: the deferred verify, the eager
// commit, and the stock store-all verify (KDA.md §3-6); and for prefill, the recurrence in chunks
// of 8 tokens with the verify's products (kd_kda_prefill). C ABI launchers for the backend and
// the benchmark.
//
// State layout (per layer; the CPU backend's and the handoff's): S [slot][HV][K][V] fp32,
// slot n_slots is the scratch row. Records per slot (Tw of them: kd_kda_args): corrections u [Tw][HV][V] fp32 and
// key/decay kg [2][Tw][HV][2K] fp32 (two buffers, alternating): the window's normalised key
// and decay exactly as kd_kda_prepare made them, so a fold repeats the window's arithmetic
// without recomputing a norm or an exponential; store-all keeps states [Tw][HV][K][V] instead.
//
// Tensor-core verify (kda.cu). The records make the window affine in the folded checkpoint
// S_F (KDA.md §4), so per (row, value head) the step is two small matrix products against
// the K x V state plus O(T^2) per column:
//   fold:    S_F^T = S0^T diag(cp) + U^T Wf        Wf_t = k_t o prod_{t<s<F} d_s   (F <= 16)
//   window:  P^T   = S_F^T [b_t o k_t ; b_t o q_t]^T   b_t = prod_{s<=t} d_s        (2T <= 16)
//   u_t = beta_t (v_t - P_t - sum_{r<t} M_tr u_r),  o_t = P_{T+t} + sum_{r<=t} N_tr u_r
// (M_tr = sum_c k_t k_r prod_{r<s<=t} d_s, N_tr likewise with q_t), so the window never
// updates the state. Both products run as mma.m16n8k8 tf32 with a 3xTF32 split (x = hi +
// lo, hi truncated; hi*hi + hi*lo + lo*hi): fp32-level error (~1e-6 relative; the float64
// check's worst is 1.1e-6, kda.cu's tf32_hi). A warp holds a 16 x K slice of S^T in
// registers in the mma accumulator layout, which is also the A-operand layout of the window
// product once the contraction order inside each 8-channel tile is permuted (2q, 2q+1 ->
// q, q+4); the B operand is read
// with the same permutation, so the fold's output feeds the window product without moving.
// The O(T^2 K) prologue (the fold weights, the decayed keys and queries, M and N: running
// products, a thread per key channel) runs once per (row, head). The default is the
// one-pass form above B = 2 at HV = 32 and the CUDA-core kernels up to it (kda.cu,
// verify_form; each the fastest measured on an H200 in its range); the split form was the
// default from B = 32 until the records carried the prepared keys and decays:
// - split: tc_prologue_kernel, one block per (row, head), writes the
//   prologue to kd_kda_args.work (its warp sums of M and N reduce 16 values per 16 shuffles,
//   the records go to shared memory: 64 registers, 8 blocks per SM; measured at B = 128 on an
//   H200 it went from 41 to 16 us at T = 1); verify_split_kernel (4 warps, 64 value columns)
//   is launched as its programmatic dependent: it issues the state, correction, v and beta
//   loads, waits for the prologue grid, and is then load -> fold mma -> store -> window mma
//   -> solve -> store. By default (HALF) only the first half of the key channels of its state
//   tile loads into registers; the other half is copied into shared memory and taken after
//   the first half is folded, stored and multiplied: 80 registers instead of 128, 6 blocks per
//   SM instead of 4 (T <= 4; 5 at T <= 8), 0-8 % faster from B = 32 on an H200.
// - one-pass (the default above B = 2): verify_onepass_kernel, 8 warps
//   per (row, head, 128 value columns), 2 blocks per SM. The state tile goes to shared
//   memory by asynchronous copies while the block's two halves compute the prologue (the
//   records / the window), then each warp takes its columns into registers. Folds of up to 2
//   records and windows of up to 2 tokens (no speculation, or one draft) run there on the
//   CUDA cores in plain fp32 instead (1 + F multiply-adds an element for the fold, 2T for the
//   window, where the 3xTF32 mma spends more instructions on its operand splits than on the
//   products: at B = 512, T = 1 the kernel had executed twice the eager commit's
//   instructions; 1.17 -> 1.07 x the copy on an H200). It writes the folded checkpoint with
//   evict-first stores (kd_kda_store_hint): in a 48B step the plain stores' dirty lines were
//   still leaving the L2 during the weight products after the verify (kda.cu has the figures).
//   The prologue's inputs are loaded first, the window's before the tile's second half
//   (kd_kda_onepass_sched): a block otherwise waited on them, not on its state. A whole column block's
//   copies go 16 bytes at a time at fixed strides (tile_fetch_full).
// - CUDA cores at B <= 2 (below), for the verify and the commit.
// The one-kernel form (verify_tc_kernel: each 64-column block computes the prologue
// itself) and the commit (commit_tc_kernel, the default above B = 2) use the same
// products.
// Arithmetic per state element and step on the CUDA cores: ~4 (the checkpoint decay and
// the hi/lo split) instead of 2F + 4T (24 at T = F = 4) token by token; tensor-core work:
// 3 x (8 [fold] + 8 or 16 [window]) x 2 flops per element, under 100 us at B = 512.
//
// Fallback (kd_kda_tensor_cores(0, 0), kd_kda_force_r, kd_kda_closed_form, windows over 8,
// odd V, store-all, the smallest batches): CUDA-core kernels, token by token. One block of
// 128 threads per (row, value head, tile of value columns). Each value column j of a head
// evolves independently (u_j needs only column j), so a column is owned by R adjacent lanes,
// each holding K/R of its K rows in registers: S^T k and S^T q are sums over a column's
// rows, done in registers then over R lanes with shuffles. R (1, 2, 4, 8) is chosen so that
// the grid fills the chip.
//
// Bytes per (row, value head) and step, K = V = 128, F = T (every draft accepted): the
// state is 64 KiB, read once and written once (128 KiB, the copy floor's bytes). Records:
// read F x (512 B corrections + 1 KiB key/decay), write T x 1.5 KiB. Window inputs: q, k,
// decay and v, 2 KiB per token (the new key/decay records are copies of what is staged),
// and o, 512 B. In all 128 + 5.5 T KiB: 1.04 / 1.09 / 1.17 / 1.34 x the copy's bytes at
// T = 1 / 2 / 4 / 8.
// The split form adds its work space, written once and read back: (F + 1 + 2T) KiB (1.08 /
// 1.16 / 1.30 / 1.60 x in all); measured at B >= 256 it runs at the copy's bandwidth, so
// its time over the copy's is that ratio (tests/bench/results/kda_h200.md). store-all:
// read 64 KiB, write T x 64 KiB (1 + T states).
//
// Lazy checkpoint (kd_kda_row.keep; KDA.md §7): the fold's output is the window's starting state
// whether or not it is written back, so a verify may leave the checkpoint as it was, keep the
// folded records where they are and append its window's records after them; the next verify (or
// commit) folds them all from the old checkpoint (a fold of up to 16 records: Tw, the records a
// slot, is then the records' capacity rather than the longest window). The backend keeps a
// slot's state when the records fit and the next fold stays within 8 records or two windows
// (cuda_backend.cu, lazy_keep): at its default, records for two of the longest windows, a state is
// written at most every other step (windows of the longest length: every other step; windows of
// one token where the longest is 4: every 8th). Per (row, value head) and step at F = T, a write
// every other step, the state then costs 64 + 32 KiB on average instead of 128 (records: the
// written step reads 2T of them): measured on
// an H200, T = 1 at 0.89-0.99 x the copy from B = 64 (1.10-1.21 x writing every step), T = 2 at
// 1.00-1.12 x, T = 4 at 1.14-1.28 x, T = 8 at 1.53-1.73 x (tests/bench/results/kda_h200.md, "lazy x2",
// at c0b0dce). Since the fast copies (6709a5c), on an H100 on 88 of its SMs (KD_GREEN_SMS: an H200's
// bandwidth an SM, which reproduced those H200 ratios at T = 4-8 within -0.03 / +0.05): T = 4 at
// 1.05-1.15 x, T = 8 at 1.38-1.50 x from B = 64 (tests/bench/results/h200_proxy_h100.md).
#ifndef KD_CUDA_KDA_CUH
#define KD_CUDA_KDA_CUH

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// One row of a KDA batch (a verify window, or the rows of a commit).
typedef struct kd_kda_row {
    int32_t slot;     // state / record slot
    int32_t start;    // first token of the row in the per-token arrays
    int32_t len;      // window tokens (verify) or tokens to commit (commit)
    int32_t fold;     // verify: pending tokens of the last window to fold first
    int32_t snap_at;  // commit: write the state after this many tokens (0: none)
    int32_t kg_read;  // which of the slot's two key/decay record buffers holds the last window
                      // (the fold reads it; a verify writes the other: blocks of one head
                      // read the old records while another block writes the new ones)
    int32_t keep;     // verify, lazy checkpoint: 1: the folded state is not written back (the
                      // checkpoint stays as it was) and the window's records go right after the
                      // fold's `fold` records, in the same buffers (kg_read's), so that the next
                      // verify folds them all from the old checkpoint; 0: the usual deferred verify
    float *snap;      // commit: where ([HV][K][V] fp32)
} kd_kda_row;

typedef struct kd_kda_args {
    int32_t H, HV, K, V, Tw;   // heads, value heads, key dim, value dim, records a slot (at least the
                               // longest window; more with the lazy checkpoint: see keep; at most 16)
    int32_t n_rows;
    const kd_kda_row *rows;    // device
    float *state;              // slot s's [HV][K][V] at state + s * slot_stride
    int64_t slot_stride;       // elements between slots' states (0: HV*K*V, packed)
    float *rec_u;              // [slots+1][Tw][HV][V]      (deferred, eager)
    float *rec_kg;             // [slots+1][2][Tw][HV][2K]  (deferred, eager): per token and value
                               // head the normalised key and the decay of a window (kn, decay)
    // One of two, by mode (a union: see the size note below):
    union {
        float *stored;         // store-all: [slots+1][Tw][HV][K][V]
        // deferred: the verify's work space (device, kd_kda_work_floats(n_rows, HV, K, Tw)
        // floats, reused by every layer): the per (row, head) prologue of the split verify.
        // NULL: the one-kernel verify.
        float *work;
    };
    // per token of the batch (verify): normalised q (scaled) and k, decay exp(g), beta, v
    // (kd_kda_prepare's outputs; the verify copies kn and decay into the records)
    const float *qn, *kn;      // [N][H][K]
    const float *qk;           // [N][H]: qn . kn (deferred)
    const float *decay;        // [N][HV][K]
    const float *beta;         // [N][HV]
    const float *v;            // [N][HV][V]
    float *o;                  // [N][HV][V]
} kd_kda_args;
// Every kernel takes kd_kda_args by value, and its size matters: at 136 bytes (one pointer
// more than now) every launch of the B = 1 verify took 0.55 us longer on an H200, in a graph
// and in plain stream order alike (3.9 -> 4.5 us at T = 1, 5.1 -> 5.6 us at T = 4; the same
// kernel code, only a field added at the end). Keep it at 128 bytes or less.
#ifdef __cplusplus
static_assert(sizeof(kd_kda_args) <= 128, "kd_kda_args: at most 128 bytes (see above)");
#else
_Static_assert(sizeof(kd_kda_args) <= 128, "kd_kda_args: at most 128 bytes (see above)");
#endif

typedef enum { KD_KDA_DEFERRED = 0, KD_KDA_STORE_ALL = 1 } kd_kda_mode;

// Verify windows: deferred (fold + write the checkpoint + run + records) or store-all
// (read the accepted state, run, write every state). 0 on success, else a cudaError_t.
int kd_kda_verify(const kd_kda_args *a, kd_kda_mode mode, int max_len, void *stream);
// The one-pass verify as a programmatic dependent launch of the kernel before it (1, the
// default: its state tile, the fold's corrections and v are in flight before it waits for that
// kernel, under the contract of kd_kda_pdl below) or in plain stream order (0; benchmarks).
void kd_kda_onepass_pdl(int on);
// The one-pass verify writes the folded checkpoint with evict-first stores (1, st.global.cs: the
// default, see kda.cu) or plain ones (0; benchmarks and tests). Returns the setting it replaces.
int kd_kda_store_hint(int on);
// The one-pass verify's loads: 1 (the default; 2 the same) the prologue's inputs first (the records' keys
// and decays before the state tile, the window's keys, queries and decays before its second half); 0 the
// state tile first, 3 the state tile first in the grid's first wave and all of the prologue's inputs before it
// in the blocks after (until the fast copies, the default at windows of 5-8), at every window (tests,
// benchmarks). See kda.cu, verify_onepass_kernel. Returns the setting it replaces, or -1 (and
// changes nothing) for a value outside 0..3.
int kd_kda_onepass_sched(int sched);
// Launches of the one-pass verify (K = 128, the default order) whose windows are all of 1-2 tokens: 1 (the
// default) take a form without the fold-free kept step's code (never taken there; 0.5-1.7 % faster kept steps
// at T = 2 on an H100), 0 the general form (benchmarks). Returns the setting it replaces, or -1 (and changes
// nothing) for a value outside 0..1.
int kd_kda_onepass_small_form(int form);
// Benchmarks: force the lanes per value column (2, 4, 8 at K = 128; 0: choose).
void kd_kda_force_r(int r);
// Tests and benchmarks: the deferred verify in closed form (see kda.cu) instead of token by
// token (the default).
void kd_kda_closed_form(int on);
// Tests and benchmarks: the tensor-core path (1, the default; 2: its 4-warp verify without
// the register cap (3 blocks per SM instead of 4); 0: the CUDA-core kernels) and its warps
// per block (1, 2, 4, 8; 0: choose). kd_kda_force_r and kd_kda_closed_form
// select the CUDA-core kernels too.
void kd_kda_tensor_cores(int on, int warps);
// Tests and benchmarks: the verify's form. 1 (the default): chosen by size (kda.cu,
// verify_form); forced: 4 the split verify (a prologue kernel, then the tensor-core verify
// as its programmatic dependent; needs a.work), 2 the same in plain stream order, 3 the
// one-pass verify, 5 the split verify with half the state staged in shared memory (the
// default's split form), 0 the one-kernel tensor-core verify.
void kd_kda_split(int mode);
// The CUDA-core verify as a programmatic dependent launch of the kernel before it (1, the
// default) or in plain stream order (0; benchmarks). See kda.cu for the contract.
void kd_kda_pdl(int on);
// Floats of kd_kda_args.work for n_rows rows.
size_t kd_kda_work_floats(int32_t n_rows, int32_t HV, int32_t K, int32_t Tw);
// Commits: fold rows[i].len records into the checkpoint (and snapshot), deferred/eager
// records, or copy stored[len-1] (store-all).
int kd_kda_commit(const kd_kda_args *a, kd_kda_mode mode, void *stream);
// The per-token prologue of a window: q, k L2-normalised (q scaled by K^-1/2), their product
// qk (may be NULL), the decay exp(g) from the raw gate, beta = sigmoid(b) (x2 with negative
// eigenvalues). braw: token n's HV raw betas at braw + n * braw_ld (HV when packed; the backend
// reads them in place from the input projection's output).
int kd_kda_prepare(int32_t N, int32_t H, int32_t HV, int32_t K, const float *q, const float *k,
                   const float *graw, const float *braw, int64_t braw_ld, const float *A_log,
                   const float *dt_bias, int32_t use_lower_bound, float lower_bound, int32_t allow_neg_eigval,
                   float *qn, float *kn, float *qk, float *decay, float *beta, void *stream);

// A prefill row: tokens [start, start + len) of the batch advance the committed state of slot;
// chunk: the row's first chunk (of 8 tokens) in kd_kda_prefill's work space (rows in order: each
// row's chunk is the last one's plus its ceil(len / 8)).
typedef struct kd_kda_prow {
    int32_t slot, start, len, chunk;
} kd_kda_prow;
// The prefill recurrence of those rows on the committed states in place (KDA.md §2.6), in chunks
// of 8 tokens on tensor cores (kda.cu, prefill_prep_kernel and prefill_chunk_kernel): per chunk the
// verify's window product, triangular solve and fold, the state in registers across the row.
// n_chunks: the rows' chunks in all; work: kd_kda_prefill_work_floats(n_chunks, HV, K) floats
// (device). Inputs and outputs as kd_cu_prefill's (ops.cuh). K 32, 64 or 128, V even; else
// cudaErrorInvalidValue. 0 on success, else a cudaError_t.
int kd_kda_prefill(const kd_kda_prow *rows, int32_t n_rows, int32_t n_chunks, int32_t H, int32_t HV, int32_t K,
                   int32_t V, float *state, int64_t state_stride, const float *qn, const float *kn,
                   const float *decay, const float *beta, const float *v, float *o, float *work, void *stream);
size_t kd_kda_prefill_work_floats(int32_t n_chunks, int32_t HV, int32_t K);

#ifdef __cplusplus
}
#endif
#endif
