// kda.cuh: the KDA recurrence on the GPU for decode: the fused deferred verify, the eager
// commit, and the stock store-all verify (KDA.md §3-6). C ABI launchers for the backend and
// the benchmark.
//
// State layout (per layer; the CPU backend's and the handoff's): S [slot][HV][K][V] fp32,
// slot n_slots is the scratch row. Records per slot: corrections u [Tw][HV][V] fp32 and raw
// key/gate kg [2][Tw][HV][2K] fp32 (two buffers, alternating); store-all keeps states
// [Tw][HV][K][V] instead.
//
// Tiling and launch shape. One block of 128 threads per (row, value head, tile of value
// columns). Each value column j of a head evolves independently (u_j needs only column j),
// so a column is owned by R adjacent lanes, each holding K/R of its K rows in registers:
// S^T k and S^T q are sums over a column's rows, done in registers then over R lanes with
// shuffles: no shared-memory reductions, no block barriers inside the token loop. A block
// covers 128/R columns; R (1, 2, 4) is chosen so that the grid fills the chip (R = 4 at
// small batch: 4x more blocks; R = 1 at large batch: fewer shuffles). Loads and stores of
// S are coalesced along V (lanes of one row index cover consecutive columns).
//
// Bytes per (row, head) and step, K = V = 128: the state is 64 KiB. deferred: read 64 KiB,
// write 64 KiB (the folded checkpoint), plus records: read pending*(512 B corrections +
// 1 KiB key/gate), write T*(512 B + 1 KiB): 128 KiB + 3 KiB at T = 4, independent of T but
// for the records. store-all: read 64 KiB, write T*64 KiB (1 + T states). copy floor of the
// same state: read 64 KiB + write 64 KiB. So deferred is the copy floor plus ~2.5 %.
#ifndef KD_CUDA_KDA_CUH
#define KD_CUDA_KDA_CUH

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
    int32_t kg_read;  // which of the slot's two key/gate record buffers holds the last window
                      // (the fold reads it; a verify writes the other: blocks of one head
                      // read the old records while another block writes the new ones)
    float *snap;      // commit: where ([HV][K][V] fp32)
} kd_kda_row;

typedef struct kd_kda_args {
    int32_t H, HV, K, V, Tw;   // heads, value heads, key dim, value dim, max window
    int32_t n_rows;
    const kd_kda_row *rows;    // device
    float *state;              // [slots+1][HV][K][V]
    float *rec_u;              // [slots+1][Tw][HV][V]      (deferred, eager)
    float *rec_kg;             // [slots+1][2][Tw][HV][2K]  (deferred, eager)
    float *stored;             // [slots+1][Tw][HV][K][V]   (store-all)
    // per token of the batch (verify): normalised q (scaled) and k, decay exp(g), beta, v;
    // the raw key and gate for the records
    const float *qn, *kn;      // [N][H][K]
    const float *decay;        // [N][HV][K]
    const float *beta;         // [N][HV]
    const float *v;            // [N][HV][V]
    const float *kraw;         // [N][H][K]
    const float *graw;         // [N][HV][K]
    float *o;                  // [N][HV][V]
    // gate parameters (for folds recomputed from raw records)
    const float *A_log;        // [HV]
    const float *dt_bias;      // [HV*K]
    int32_t use_lower_bound, allow_neg_eigval;
    float lower_bound;
} kd_kda_args;

typedef enum { KD_KDA_DEFERRED = 0, KD_KDA_STORE_ALL = 1 } kd_kda_mode;

// Verify windows: deferred (fold + write the checkpoint + run + records) or store-all
// (read the accepted state, run, write every state). 0 on success, else a cudaError_t.
int kd_kda_verify(const kd_kda_args *a, kd_kda_mode mode, int max_len, void *stream);
// Benchmarks: force the lanes per value column (2, 4, 8 at K = 128; 0: choose).
void kd_kda_force_r(int r);
// Tests and benchmarks: the deferred verify in closed form (see kda.cu) instead of token by
// token (the default).
void kd_kda_closed_form(int on);
// Commits: fold rows[i].len records into the checkpoint (and snapshot), deferred/eager
// records, or copy stored[len-1] (store-all).
int kd_kda_commit(const kd_kda_args *a, kd_kda_mode mode, void *stream);
// The per-token prologue of a window: q, k L2-normalised (q scaled by K^-1/2), the decay
// exp(g) from the raw gate, beta = sigmoid(b) (x2 with negative eigenvalues).
int kd_kda_prepare(int32_t N, int32_t H, int32_t HV, int32_t K, const float *q, const float *k,
                   const float *graw, const float *braw, const float *A_log, const float *dt_bias,
                   int32_t use_lower_bound, float lower_bound, int32_t allow_neg_eigval, float *qn,
                   float *kn, float *decay, float *beta, void *stream);

#ifdef __cplusplus
}
#endif
#endif
