// cuda_backend.cu: the CUDA backend (kd/backend.h), computing the CPU reference backend's
// function (cpu/cpu_backend.c) on one device, one stream.
//
// Activations: fp32 (act_bf16 = 0: weights converted to fp32 on upload, cuBLAS SGEMM; the
// reference mode) or bf16 (GEMM weights bf16 on the device, GEMM inputs bf16, fp32 outputs and
// accumulation: the skinny kernel (gemv.cuh) where it is faster, else cuBLASLt with the
// algorithm gemm_lt.cuh's table names for the shape, measured on an H200; kd_cuda_set_lt).
// The residual stream, norms, gates,
// conv and recurrence are fp32 in both; so is the state (state_dtype = KD_F32).
//
// Device memory, per layer l (the KDA kernels of kda.cuh index states by slot within one
// layer's array, so each kind of per-slot buffer is one allocation [L][slots+1][...]):
//   S      [L][slots+1][HV][K][V]      committed recurrent states
//   win    [L][slots+1][C][W-1]        conv windows in the export layout (C = 2 H K + HV V)
//   hist   [L][slots+1][W-1+Tw][C]     conv history rings: committed inputs and the last verify
//                                      window's (ops.cuh's kd_cu_conv_args; conv_head below)
//   rec_u  [L][slots+1][Tw][HV][V]     corrections          (deferred, eager)
//   rec_kg [L][slots+1][2][Tw][HV][2K] normalised key / decay, two alternating buffers (kg_read)
//   stored [L][slots+1][Tw][HV][K][V]  states after each window position (store-all)
// A slot's committed state in the export layout [L][S | win] is therefore 2 L pieces; the
// state calls copy piece by piece (state_pieces).
//
// Per forward: one upload of the batch's metadata (tokens, per-token rows, fold lists,
// verify rows, prefill rows, logit rows) from a pinned staging buffer, then per layer the
// kernels of ops.cuh, kd_kda_prepare, kd_kda_verify (verify rows) and kd_cu_prefill (prefill
// rows), cuBLAS GEMMs, and at the end the head GEMM in chunks of rows, copied to the host's
// logits (forward) or sampled where they are (forward_sample: cuda/sample.cuh; only the
// tokens, accepted counts and uniforms used come back, [rows][max_window + 2] int32).
// Everything is allocated in create / load / reserve.
//
// CUDA graphs (forward_sample on verify-only batches): the enqueue of one forward (launch)
// is captured per padded shape (rows to the next power of two with one-token scratch
// windows, the longest window, tokens rounded up as graph_rows says, every verify row in the
// fold list); the first batch of a shape runs eagerly with the same layout (or on a captured
// shape of more tokens: cu_forward_sample), a later one captures it, later ones replay.
// kd_cuda_warm_graphs captures them before the first step (a server at start), so that no
// request's step waits for a capture or runs eagerly.
// Per-step inputs (tokens, slots, folds, drafts, uniforms, sampling parameters) live in the
// pinned metadata block whose upload is the graph's first node, so a replay reads this step's
// values; the host waits once per step, for the tokens.
// KDECODE_CUDA_GRAPHS=0 at creation (or kd_cuda_set_graphs) runs every batch eagerly.
// KDECODE_CUDA_LT_TABLE=FILE at creation: an operator's table of cuBLASLt configurations
// (kd/lt_table.h, as `KD_LT_SEARCH=1 gemm_lt_bench` writes it) in place of the built-in one.
//
// The conv's history is a ring a slot and layer (hist): a verify window writes its conv inputs
// at the positions after the committed ones, and committing F of them (the fold at the start of
// the next verify, or an eager commit) advances the slot's ring position (conv_head, host) by F:
// no data moves. Until 2026-12 each slot's window [C][W-1] was folded in place by a kernel
// before the first layer (read and write 2 (W-1) C floats a slot and layer: 0.24 ms of a 6.0 ms
// 48B step at B = 128 on an H200, kimi48b_trace_h200.md). The export-layout window in win is
// kept in step with the ring only where the state calls need it (conv_sync): a read, hash or
// copy of the slot fills it from the ring; after a write, copy or reset the next forward or
// commit fills the ring from it.
// f_proj.1 and g_proj.1 (same rows, same K) run as one launch of the skinny kernel
// (kd_cu_gemm_skinny_pair; kd_cuda_set_pair(0): a launch each) up to 32 rows, then (bf16, K = V)
// as one strided batched cuBLAS launch of the two (their weights in one allocation, the raw and
// output gates in another, so one stride steps from each operand to the other).
// In forwards of at most 4 requests, 16 more blocks of each layer's gated RMSNorm launch
// prefetch gate|up's first rows into the L2 (20 % of it, 12.5 MB on an H200; bulk prefetches,
// kd_cuda_set_prefetch mode 4): the gated norm is the KDA verify's programmatic dependent, so
// these blocks, which neither wait nor read what the step writes, start with the verify and
// fill the L2 while the verify and the norm leave the memory idle; the norm's grid ends when
// they have landed. 48B step on an H200, alternated rounds in one process: B = 1 s = 0 1.704 ->
// 1.654 ms, s = 3 2.003 -> 1.989, B = 2 s = 0 1.951 -> 1.944 (8 blocks or 18.8 MB: slower; logs/
// gnpf_h200.log). 16 more blocks of the MLP RMSNorm's launch (o_proj's dependent) prefetch the next
// 10 % of the L2 of gate|up's rows (kd_cuda_set_prefetch_mlp): 1.656 -> 1.648, 1.995 -> 1.988, 1.951 ->
// 1.936 ms (20 % or more: slower; logs/gnpf_mlp_h200.log); in forwards of at most 2 rows only, since
// the segment-diagonal forms: B = 1 s = 3 (4 rows) 1.812 ms with it, 1.779 without; B = 1 s = 0
// 1.622 / 1.636, B = 2 s = 0 1.731 / 1.729 (logs/gnpf_h200_4f478b1.log). At most 2 requests until the
// one-pass verify let the gated norm be scheduled during its last blocks (85b7682); since, 4 (alternated
// rounds against 2, logs/pfrows4_h200_85b7682.log: B = 3 s = 0 1.906 -> 1.842 ms, B = 4 s = 0 1.931 -> 1.887,
// B = 3 s = 3 and B = 4 s = 3 0.2-0.5 % faster, B = 3-4 s = 1 within 0.2 %; in every step it was 1.5-4.7 %
// slower from B = 32, logs/pfrows_h200_85b7682.log).
// Everything runs on one stream by default. Two uses of a second stream are kept as options
// (benchmarks, tests), off by default because of what they do to the rest of the process: once
// a forward has run work on a second stream beside the step's kernels, every later step of 3-32
// rows runs 2.5-4.5 % slower for the rest of the process (48B step on an H200, B = 32 s = 0
// 3.09 -> 3.21 ms, B = 4 2.17 -> 2.23; tests/bench/results/kimi48b_slow_state_h200.md). Renewing
// the streams, the events, the cuBLAS / cuBLASLt handles and the graphs does not bring the
// fast state back, nor does an idle pause; plain stream order (no programmatic launches) shows
// it too. The options:
// - kd_cuda_set_side_rows: from that many rows the gates' bf16 copy and f_proj.1 run on the
//   second stream beside the conv (the KDA prepare waits for them) and g_proj.1 beside the KDA
//   verify (the gated RMSNorm waits for it), each product with its own cuBLAS handle and
//   workspace. Measured (one H200, 48B): B = 128 s = 3 10.65-10.97 ms with it against
//   10.86-10.87 without, B = 128 s = 0 6.18-6.19 against 6.14-6.16: no gain worth its cost.
// - kd_cuda_set_prefetch modes 1-3: in forwards of at most 2 requests the second stream, forked after each
//   layer's input projection and joined at the end of the forward, prefetches that layer's
//   gate|up first rows, then o_proj's weights, into the L2 (30 % of it, bulk prefetches from a
//   few SMs) while the conv, KDA and norm kernels leave the memory idle. In a process that never
//   used a second stream against one with the prefetch: B = 1 s = 0 1.710 / 1.647 ms, the one
//   point it helps (B = 1 s = 3 1.996 / 2.047, B = 2 s = 0 1.960 / 2.014); mode 4 (above) gains as
//   much on one stream (1.654 against 1.644 ms in the same process). The same prefetch as a kernel
//   of its own in the step's stream holds the next kernel until its prefetches land: 2.355 ms at
//   B = 1 (tests/bench/results/logs/slow_state_probes_h200.log).
// Small kernels go into the launches next to them (kd_cuda_set_fuse; the same bits either way):
// where the skinny kernel takes f_proj.1 + g_proj.1 (at most 8 rows) and the conv + prepare kernel
// below does not run (1 row), the conv into their launch, its blocks
// first (kd_cu_gemm_skinny_pair_conv: both read only the input projection's output). From 2 rows
// the conv of the q and k channels runs in the KDA prepare's kernel
// (kd_cu_conv_prepare: q and k never go to memory; the v channels' conv runs alone just before it,
// 4 channels a thread, so that the verify, which loads v before its programmatic wait, finds it two
// kernels back; conv_prep_rows). Off by default: where the skinny kernel's row form takes the input
// projection (one activation row at the 48B preset), the gates' bf16 copy (f_proj.0 | g_proj.0's
// columns) into its epilogue (kd_cu_gemm_skinny_epi; KD_CUDA_FUSE_COPY), and from 4 rows the v
// channels' conv in f_proj.1 + g_proj.1's launch. 48B steps on an H200 (cuda_bench KD_BENCH_FUSE:
// masks in alternated rounds in one process, medians;
// tests/bench/results/logs/fuse_h200_d66c1ea.log):
// B = 1 s = 0 1.638 ms with all three, 1.627 without the copy, 1.641 with the conv + prepare
// alone (the copy paid at 5af4162, one run each: 1.672 against 1.701 with no fusion, before the
// MLP RMSNorm's prefetch and the row forms' activation loads); the v channels' conv alone
// instead of in the pair's launch at 4-8 rows: B = 1 s = 3 1.972 -> 1.947, B = 4 s = 0 2.172 ->
// 2.135, B = 8 s = 0 2.289 -> 2.250, B = 2 s = 1 1.977 -> 1.964, B = 2 s = 3 2.048 -> 2.041; the
// conv in the pair's launch at 2 rows: B = 2 s = 0 1.920 against 1.971 apart. The conv kernels
// load before their programmatic wait where the order of the step allows it
// (kd_cu_conv_args.early: f_proj.1 + g_proj.1 between them and the input projection; the
// history entries written by earlier forwards).
// Other fusions were measured and left out (tests/bench/results/kimi48b_cuda_h200_8bdf183_fusion_tried.md): the
// conv inside the prepare kernel, and at one activation row the RMSNorms and the gated
// RMSNorm inside the skinny products, were each slower on an H200 (every block of a product
// redoes the row's norm: 1.896 -> 1.950 / 1.968 / 1.915 / 2.027 ms a step at B = 1); so were
// the RMSNorms after o_proj and the down projection written by the last block of those
// products (a count of finished blocks: 1.758 -> 2.041 ms;
// tests/bench/results/tried/epilogue_norms.patch).
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "kd/backend.h"
#include "kernels/cuda/gemm_lt.cuh"
#include "kernels/cuda/gemv.cuh"
#include "kernels/cuda/kda.cuh"
#include "kernels/cuda/ops.cuh"
#include "kernels/cuda/sample.cuh"

namespace {

constexpr size_t kBlasWorkspace = KD_LT_WORKSPACE; // the workspace gemm_lt.cuh's table was measured with
constexpr int64_t kLogitChunk = 256;    // rows of the head GEMM per pass
constexpr size_t kStageBytes = 8u << 20; // pinned staging for state_hash
constexpr int kMaxWindow = 16;          // kd_kda_verify's limit
constexpr int kMaxRecords = 16;         // records a slot (kd_kda_args.Tw), the lazy checkpoint's bound
constexpr int kLazyDefault = 2;         // kd_cuda_set_lazy's factor at creation
constexpr int kLazyHold = 8;            // a kept state's next fold: at most this many records, or two windows
constexpr int kSideRows = 0; // f_proj.1 / g_proj.1 on the second stream from these rows (0: never; above)
// o_proj and the down projection in K slices (kd_cuda_set_ksplit): at most kKsplitRows rows (the partial sums'
// buffer); by default kKsplitNb slices in forwards of kKsplitLo..kKsplitHi rows. Measured on an H200 (48B
// preset, alternated rounds, tests/bench/results/logs/ksplit_h200.log): alone at 128 rows o_proj 9.14 -> 7.63
// us, the down projection 16.90 -> 14.59 in 2 slices (results/gemm_lt_search_h200_ksplit.md); in the step
// 2 slices 0.2-1.6 % faster at 16-128 rows (B = 128 s = 0 5.709 -> 5.692 ms), 1.2 % slower at 256; 4 slices
// 0.3-2.3 % slower at every row count. From 5 rows (below them the skinny kernel takes both products, no
// slices): 5-15 rows were first measured on an H100 (KD_BENCH_KSPLIT, tests/bench/results/logs/ksplit_lo_h100.log):
// 2 slices 2.4-2.5 % faster at 5-8 rows (B = 5 s = 0 2.536 -> 2.475 ms, B = 2 s = 3 2.463 -> 2.406, B = 8 s = 0
// 2.580 -> 2.519), 1.3-1.6 % at 10-16; 3 and 4 slices only 0.9-1.1 % at 5-8 rows (logs/small_rows_defaults_h100.log);
// in that run 0.4-0.8 % slower at 96-128 rows s = 0 and 128 s = 3, where the H200's rounds above keep them.
constexpr int64_t kKsplitRows = 512;
constexpr int kKsplitNb = 2;
constexpr int64_t kKsplitLo = 5, kKsplitHi = 128;

struct cu_layer {
    float *attn_norm, *conv, *A_log, *dt_bias, *g1_bias, *o_norm, *mlp_norm;
    void *w_in;   // [P][D]  q | k | v | f_proj.0 | g_proj.0 | b_proj
    void *f1;     // [HV K][V]
    void *g1;     // [HV V][V]
    void *w_o;    // [D][HV V]
    void *w_gu;   // [2 I][D]  gate | up
    void *w_down; // [D][I]
};

// Offsets (bytes) of the sections of the per-call metadata block.
struct meta_layout {
    size_t tokens, toks, pfolds, vrows, prows, lrows, spos, srows, crows, total;
};

// The launch shape of one forward (what kernels take as host arguments): a CUDA graph is
// captured per shape, the per-step values travel in the metadata block.
struct fwd_shape {
    int64_t N, M;      // tokens, logit rows
    int nv, np, npf, max_len, n_rows;
    int npc;           // the prefill rows' chunks of 8 tokens (kd_kda_prefill's work space)
    int sample;        // 1: sample on the device (kd_cu_sample_*), 0: logits to the host
    float *logits;     // host logits when !sample
};

// Graphs kept (each a decode shape: rows, longest window, tokens); past that the least recently
// replayed one is dropped for a new shape.
constexpr int kMaxGraphs = 96;
enum : uint8_t { CONV_RING = 0, CONV_WIN = 1, CONV_BOTH = 2 }; /* cu_backend.conv_sync */
struct graph_entry {
    int rows, window, tokens;  // padded rows, the longest window, padded tokens (rows 0: unused)
    int seen;          // runs of this shape so far, eager or on a covering graph (cu_forward_sample)
    int64_t used;      // the step that last ran it (graph_clock)
    cudaGraphExec_t exec;
};

struct cu_backend {
    kd_backend base;
    int bf16, dev;
    size_t wsz; // bytes of a weight / activation element fed to GEMMs (4 or 2)
    cudaStream_t stream;
    cublasHandle_t blas;
    void *blas_ws;
    cublasHandle_t blas_side; // the products on the second stream (side_rows): their own handle and workspace
    void *blas_ws_side;
    kd_cu_lt *lt; // bf16 products the skinny kernel does not take (gemm_lt.cuh); NULL: cublasGemmEx
    int lt_mode;  // 0: cublasGemmEx, 1: cuBLASLt's first algorithm, 2: the table too (gemm_lt.cu) (kd_cuda_set_lt)
    // allocations to free (device and pinned host)
    void **dallocs;
    size_t n_dallocs, cap_dallocs;
    void *pinned_meta, *pinned_stage;
    // model
    int64_t D, H, HV, K, V, FF, W, Hw, QK, VD, P, C, vocab;
    cu_layer *layers;
    void *embed, *head;
    float *final_norm;
    // slots
    int64_t slots1; // n_slots + 1
    // Each slot's committed state is one block [L][S | conv window] (the export layout) when a
    // layer's S + window is a multiple of 32 elements (then each layer starts 128-byte
    // aligned), else with each layer padded to that: S and win point at layer 0 of slot 0,
    // lS = lwin is the layer stride within a slot, sstride the slot stride. A handoff then
    // lands in a slot as one contiguous transfer.
    float *S, *win, *hist, *rec_u, *rec_kg, *stored;
    int64_t lS, lwin, lhist, lrec_u, lrec_kg, lstored; // per-layer strides (elements)
    int64_t sstride;                                   // slot stride of S and win (elements)
    int32_t R;        // history ring entries a slot and layer: W - 1 + the longest verify window
    int32_t *kg_read; // host [slots1]: which key/decay buffer holds the slot's last window
    // The lazy checkpoint (kd_kda_row.keep): records for rcap tokens a slot (lazy x the longest
    // window, at most kMaxRecords; rcap = the longest window: off); held[slot]: the tokens the
    // slot's last verify folded without writing its checkpoint, at the start of kg_read's buffer
    // and of the corrections, before its own window's records (the next fold takes them first)
    int32_t lazy, rcap;
    int32_t *held; // host [slots1]
    int32_t *conv_head; // host [slots1]: the ring index of the slot's committed position
    uint8_t *conv_sync; // host [slots1]: CONV_RING, CONV_WIN or CONV_BOTH (which of ring and win is current)
    // work space
    float *x, *proj, *graw, *gate, *q, *k, *v, *qn, *kn, *qk, *decay, *beta, *o, *gu, *lg, *snap;
    float *kda_work; // kd_kda_args.work: the verify's per (row, head) prologue, shared by the layers
    float *pf_work;  // kd_kda_prefill's work space (the prefill recurrence in chunks), shared by the layers
    void *h, *fg0, *ob, *act, *sel;
    int64_t lg_rows;
    meta_layout ml;
    unsigned char *meta_dev;
    // device sampling: per logit row decisions, per row results (device and pinned host)
    kd_cu_sres *sres;
    kd_cu_argpart *sarg; // the argmax slices of each logit row (kd_cu_sample_positions)
    int32_t *sout, *sout_h;
    // CUDA graphs of decode steps (forward_sample on verify-only batches)
    int graphs;
    int skinny; // products that kd_cu_skinny_pick names (bf16 activations) go to kd_cu_gemm_skinny
    int rows_form; // kd_cuda_set_skinny_rows_form: 2-4 rows, K > 256 (0: the pick, -1: cuBLAS, or a form)
    int pair;        // f_proj.1 and g_proj.1 in one launch where the skinny kernel takes both (kd_cuda_set_pair)
    int64_t pair_batched; // their strided batched cuBLAS launches made (kd_cuda_pair_batched)
    int swiglu;      // gate|up and SwiGLU in one launch where the skinny kernel takes gate|up (kd_cuda_set_swiglu)
    int gnorm_early; // the gated RMSNorm loads its gate before its programmatic wait (kd_cuda_set_gnorm_early)
    // o_proj and the down projection in ks_nb K slices (kd_cuda_set_ksplit; 1: whole) in forwards of
    // ks_lo..ks_hi rows; their partial sums in kpart ([KD_KSPLIT_MAX][kpart_rows][D]), added into the
    // residual stream by the RMSNorm after them
    int ks_nb;
    int64_t ks_lo, ks_hi, kpart_rows;
    int64_t ks_launches; // products run in K slices (kd_cuda_ksplit_launches; captured launches counted once)
    int gu16;            // gate|up's output in bf16 where cuBLASLt takes it (kd_cuda_set_gu_bf16)
    float *kpart;
    int fuse; // which neighbouring kernels run as one (KD_CUDA_FUSE_*; kd_cuda_set_fuse)
    int conv_prep;   // the conv + prepare kernel: 0 by rows (conv_prep_rows), 1 at every row count
    unsigned skip;   // benchmarks: kernels left out of the step (KD_CUDA_SKIP_*; kd_cuda_set_skip)
    // L2 prefetch of each layer's o_proj and leading gate|up weights on a second stream
    // (kd_cuda_set_prefetch): at most pf_bytes a layer, in forwards of at most pf_rows rows
    cudaStream_t side;
    cudaEvent_t ev_fork, ev_join;
    // f_proj.1 on the second stream beside the conv, g_proj.1 beside the KDA (kd_cuda_set_side_rows):
    // in forwards of at least side_rows rows (0: never); ev_f / ev_g mark their ends
    int side_rows;
    cudaEvent_t ev_f, ev_g;
    int side_open; // launch: work on the second stream that the step's stream has not joined yet
    int64_t pf_bytes, l2_bytes;
    int pf_rows, pf_mode, pf_blocks; // pf_blocks: mode 4's prefetching blocks
    int64_t pf_mlp_bytes; // mode 4: gate|up's next rows from the MLP RMSNorm's launch (kd_cuda_set_prefetch_mlp)
    int pf_gu_first; // gate|up's first rows before o_proj's weights (kd_cuda_set_prefetch_order)
    graph_entry graph[kMaxGraphs];
    int64_t graphs_captured, graph_replays, graph_clock;
};

cu_backend *SELF(kd_backend *b) { return (cu_backend *)b; }

// The L2 prefetch's bytes a layer when it is on (kd_cuda_set_prefetch(b, -1, ...)): 30 % of the
// L2 (18.9 MB on an H200, measured best with gate|up's rows first: tests/bench/results/kimi48b_cuda_h200.md).
// Mode 4 (the default): 20 % (measured best of 10 / 20 / 30 % at B = 1, logs/gnpf_h200.log).
int64_t default_prefetch_bytes(const cu_backend *cb, int mode) {
    return (mode == 4 ? cb->l2_bytes / 5 : cb->l2_bytes * 3 / 10) & ~(int64_t)15;
}

#define CU(call)                                                                                  \
    do {                                                                                          \
        cudaError_t e_ = (call);                                                                  \
        if (e_ != cudaSuccess)                                                                    \
            return kd_fail(err, "cuda backend: %s: %s (%s)", #call, cudaGetErrorString(e_),       \
                           cudaGetErrorName(e_));                                                 \
    } while (0)

#define KDA(call)                                                                                 \
    do {                                                                                          \
        cudaError_t e_ = (cudaError_t)(call);                                                     \
        if (e_ != cudaSuccess)                                                                    \
            return kd_fail(err, "cuda backend: %s: %s (%s)", #call, cudaGetErrorString(e_),       \
                           cudaGetErrorName(e_));                                                 \
    } while (0)

#define BLAS(call)                                                                                \
    do {                                                                                          \
        cublasStatus_t s_ = (call);                                                               \
        if (s_ != CUBLAS_STATUS_SUCCESS)                                                          \
            return kd_fail(err, "cuda backend: %s: %s", #call, cublasGetStatusString(s_));        \
    } while (0)

int track(cu_backend *cb, void *p, kd_err *err) {
    if (cb->n_dallocs == cb->cap_dallocs) {
        size_t cap = cb->cap_dallocs ? 2 * cb->cap_dallocs : 64;
        void **n = (void **)realloc(cb->dallocs, cap * sizeof *n);
        if (!n) {
            cudaFree(p);
            return kd_fail(err, "cuda backend: out of host memory");
        }
        cb->dallocs = n, cb->cap_dallocs = cap;
    }
    cb->dallocs[cb->n_dallocs++] = p;
    return 0;
}

// Device allocation of n elements of `elem` bytes (at least one element), zeroed.
int dalloc(cu_backend *cb, void **out, int64_t n, size_t elem, const char *what, kd_err *err) {
    *out = NULL;
    if (n < 1) n = 1;
    const size_t bytes = (size_t)n * elem;
    cudaError_t e = cudaMalloc(out, bytes);
    if (e != cudaSuccess) {
        *out = NULL;
        return kd_fail(err, "cuda backend: cudaMalloc of %zu bytes for %s: %s", bytes, what,
                       cudaGetErrorString(e));
    }
    if (track(cb, *out, err)) return *out = NULL, -1;
    CU(cudaMemset(*out, 0, bytes));
    return 0;
}

template <class T>
int dalloc_t(cu_backend *cb, T **out, int64_t n, size_t elem, const char *what, kd_err *err) {
    void *p;
    int rc = dalloc(cb, &p, n, elem, what, err);
    *out = (T *)p;
    return rc;
}

// Waits for the stream and forgets every captured graph.
void drop_graphs(cu_backend *cb) {
    if (cb->stream) cudaStreamSynchronize(cb->stream);
    for (int i = 0; i < kMaxGraphs; i++) {
        if (cb->graph[i].exec) cudaGraphExecDestroy(cb->graph[i].exec);
        cb->graph[i] = graph_entry{0, 0, 0, 0, 0, nullptr};
    }
}

void free_all(cu_backend *cb) {
    if (cb->dev >= 0) cudaSetDevice(cb->dev);
    drop_graphs(cb);
    if (cb->sout_h) cudaFreeHost(cb->sout_h);
    cb->sout_h = NULL;
    for (size_t i = 0; i < cb->n_dallocs; i++) cudaFree(cb->dallocs[i]);
    free(cb->dallocs);
    cb->dallocs = NULL, cb->n_dallocs = cb->cap_dallocs = 0;
    if (cb->pinned_meta) cudaFreeHost(cb->pinned_meta);
    if (cb->pinned_stage) cudaFreeHost(cb->pinned_stage);
    cb->pinned_meta = cb->pinned_stage = NULL;
    free(cb->layers);
    cb->layers = NULL;
    free(cb->kg_read);
    free(cb->held);
    free(cb->conv_head);
    free(cb->conv_sync);
    cb->kg_read = cb->held = cb->conv_head = NULL;
    cb->conv_sync = NULL;
}

void cu_destroy(kd_backend *b) {
    cu_backend *cb = SELF(b);
    free_all(cb);
    if (cb->blas) cublasDestroy(cb->blas);
    if (cb->blas_side) cublasDestroy(cb->blas_side);
    kd_cu_lt_destroy(cb->lt);
    if (cb->blas_ws) cudaFree(cb->blas_ws);
    if (cb->blas_ws_side) cudaFree(cb->blas_ws_side);
    if (cb->ev_f) cudaEventDestroy(cb->ev_f);
    if (cb->ev_g) cudaEventDestroy(cb->ev_g);
    if (cb->ev_fork) cudaEventDestroy(cb->ev_fork);
    if (cb->ev_join) cudaEventDestroy(cb->ev_join);
    if (cb->side) cudaStreamDestroy(cb->side);
    if (cb->stream) cudaStreamDestroy(cb->stream);
    (void)cudaGetLastError();
    free(cb);
}

// ----------------------------------------------------------------------------- load

// Uploads tensor t (numel must be n) to dst + off elements, converted to fp32 or bf16; with
// pitch > 0, as rows of row_len elements, row r at dst + off + r * pitch (n a multiple of row_len).
int upload_rows(void *dst, int64_t off, int to_bf16, const kd_tensor *t, int64_t n, int64_t row_len, int64_t pitch,
                const char *what, int32_t layer, kd_err *err) {
    if (!t->data || kd_tensor_numel(t) != n || (pitch > 0 && (row_len < 1 || n % row_len)))
        return kd_fail(err, "cuda backend: layer %d %s: %s (expected %lld elements)", layer, what,
                       t->data ? "wrong size" : "missing", (long long)n);
    const int64_t chunk = pitch > 0 ? ((1 << 20) / row_len > 0 ? (1 << 20) / row_len : 1) * row_len : 1 << 20;
    float *f = (float *)malloc((size_t)chunk * sizeof(float));
    uint16_t *hb = to_bf16 ? (uint16_t *)malloc((size_t)chunk * sizeof(uint16_t)) : NULL;
    if (!f || (to_bf16 && !hb)) {
        free(f), free(hb);
        return kd_fail(err, "cuda backend: out of host memory uploading %s", what);
    }
    const size_t es = to_bf16 ? 2 : 4;
    for (int64_t i = 0; i < n; i += chunk) {
        const int64_t m = n - i < chunk ? n - i : chunk;
        kd_tensor_to_f32(t, i, m, f);
        const void *src = f;
        if (to_bf16) {
            for (int64_t j = 0; j < m; j++) hb[j] = kd_f32_to_bf16(f[j]);
            src = hb;
        }
        cudaError_t e = pitch > 0 ? cudaMemcpy2D((char *)dst + (size_t)(off + i / row_len * pitch) * es,
                                                 (size_t)pitch * es, src, (size_t)row_len * es, (size_t)row_len * es,
                                                 (size_t)(m / row_len), cudaMemcpyHostToDevice)
                                  : cudaMemcpy((char *)dst + (size_t)(off + i) * es, src, (size_t)m * es,
                                               cudaMemcpyHostToDevice);
        if (e != cudaSuccess) {
            free(f), free(hb);
            return kd_fail(err, "cuda backend: cudaMemcpy uploading layer %d %s: %s", layer, what,
                           cudaGetErrorString(e));
        }
    }
    free(f), free(hb);
    return 0;
}
int upload(cu_backend *cb, void *dst, int64_t off, int to_bf16, const kd_tensor *t, int64_t n, const char *what,
           int32_t layer, kd_err *err) {
    (void)cb;
    return upload_rows(dst, off, to_bf16, t, n, 0, 0, what, layer, err);
}

// A new device tensor of n elements from t: fp32, or the GEMM weight type when `gemm`.
template <class T>
int take(cu_backend *cb, T **out, const kd_tensor *t, int64_t n, int gemm, const char *what,
         int32_t layer, kd_err *err) {
    const int bf = gemm && cb->bf16;
    if (dalloc_t(cb, out, n, bf ? 2 : 4, what, err)) return -1;
    return upload(cb, *out, 0, bf, t, n, what, layer, err);
}

// Two GEMM weights in one allocation, the second right after the first (f_proj.1 | g_proj.1:
// gemm_pair's batched launch steps from one to the other).
int take_pair(cu_backend *cb, void **out0, const kd_tensor *t0, int64_t n0, void **out1, const kd_tensor *t1,
              int64_t n1, const char *what0, const char *what1, int32_t layer, kd_err *err) {
    const size_t elem = cb->bf16 ? 2 : 4;
    if (dalloc(cb, out0, n0 + n1, elem, what0, err)) return -1;
    *out1 = (char *)*out0 + (size_t)n0 * elem;
    return upload(cb, *out0, 0, cb->bf16, t0, n0, what0, layer, err) ||
           upload(cb, *out1, 0, cb->bf16, t1, n1, what1, layer, err);
}

int cu_load(kd_backend *b, const kd_config *c, const kd_model_tensors *w, kd_err *err) {
    cu_backend *cb = SELF(b);
    if (cb->layers) return kd_fail(err, "cuda backend: weights already loaded");
    if (c->head_k != 32 && c->head_k != 64 && c->head_k != 128)
        return kd_fail(err, "cuda backend: head_dim %d not supported (the KDA kernels take 32, 64, 128)",
                       c->head_k);
    if (c->n_v_heads > 65535)
        return kd_fail(err, "cuda backend: %d value heads, at most 65535", c->n_v_heads);
    CU(cudaSetDevice(cb->dev));
    b->config = *c;
    kd_state_layout_init(&b->layout, c);
    cb->D = c->hidden, cb->H = c->n_heads, cb->HV = c->n_v_heads, cb->K = c->head_k;
    cb->V = c->head_v, cb->FF = c->intermediate, cb->vocab = c->vocab;
    cb->W = c->use_short_conv ? c->conv_size : 0;
    cb->Hw = c->use_short_conv ? c->conv_size - 1 : 0;
    cb->QK = kd_config_qk_dim(c), cb->VD = kd_config_v_dim(c);
    cb->P = 2 * cb->QK + cb->VD + 2 * cb->V + cb->HV;
    cb->C = 2 * cb->QK + cb->VD;
    const int64_t D = cb->D, K = cb->K, V = cb->V, HV = cb->HV, FF = cb->FF;
    cb->layers = (cu_layer *)calloc((size_t)c->n_layers, sizeof *cb->layers);
    if (!cb->layers) return kd_fail(err, "cuda backend: out of host memory");
    const size_t ws = cb->wsz;
    if (take(cb, &cb->embed, &w->embed, (int64_t)c->vocab * D, 1, "embeddings", -1, err) ||
        take(cb, &cb->final_norm, &w->final_norm, D, 0, "norm", -1, err))
        goto fail;
    if (c->tie_embeddings) cb->head = cb->embed;
    else if (take(cb, &cb->head, &w->lm_head, (int64_t)c->vocab * D, 1, "lm_head", -1, err))
        goto fail;
    for (int32_t l = 0; l < c->n_layers; l++) {
        const kd_layer_tensors *t = &w->layers[l];
        cu_layer *L = &cb->layers[l];
        if (take(cb, &L->attn_norm, &t->attn_norm, D, 0, "attn_norm", l, err) ||
            take_pair(cb, &L->f1, &t->f_proj1, HV * K * V, &L->g1, &t->g_proj1, HV * V * V, "f_proj.1", "g_proj.1", l,
                      err) ||
            take(cb, &L->A_log, &t->A_log, HV, 0, "A_log", l, err) ||
            take(cb, &L->dt_bias, &t->dt_bias, HV * K, 0, "dt_bias", l, err) ||
            take(cb, &L->g1_bias, &t->g_proj1_bias, HV * V, 0, "g_proj.1.bias", l, err) ||
            take(cb, &L->o_norm, &t->o_norm, V, 0, "o_norm", l, err) ||
            take(cb, &L->w_o, &t->o_proj, D * HV * V, 1, "o_proj", l, err) ||
            take(cb, &L->mlp_norm, &t->mlp_norm, D, 0, "mlp_norm", l, err) ||
            take(cb, &L->w_down, &t->down_proj, D * FF, 1, "down_proj", l, err))
            goto fail;
        if (dalloc(cb, &L->w_in, cb->P * D, ws, "fused input projection", err) ||
            dalloc(cb, &L->w_gu, 2 * FF * D, ws, "fused gate|up", err))
            goto fail;
        {
            const struct {
                const kd_tensor *t;
                int64_t rows;
                const char *what;
            } in[] = {{&t->q_proj, cb->QK, "q_proj"},  {&t->k_proj, cb->QK, "k_proj"},
                      {&t->v_proj, cb->VD, "v_proj"},  {&t->f_proj0, V, "f_proj.0"},
                      {&t->g_proj0, V, "g_proj.0"},    {&t->b_proj, HV, "b_proj"}};
            int64_t off = 0;
            for (size_t i = 0; i < sizeof in / sizeof in[0]; i++) {
                if (upload(cb, L->w_in, off, cb->bf16, in[i].t, in[i].rows * D, in[i].what, l, err))
                    goto fail;
                off += in[i].rows * D;
            }
        }
        /* gate and up rows interleaved (row 2j gate_j, 2j + 1 up_j): one warp of the skinny row or
         * segment-diagonal form holds both and writes SwiGLU's output itself
         * (kd_cu_gemm_skinny_swiglu); kd_cu_swiglu reads the same layout after cuBLAS */
        if (upload_rows(L->w_gu, 0, cb->bf16, &t->gate_proj, FF * D, D, 2 * D, "gate_proj", l, err) ||
            upload_rows(L->w_gu, D, cb->bf16, &t->up_proj, FF * D, D, 2 * D, "up_proj", l, err))
            goto fail;
        if (c->use_short_conv) {
            if (dalloc_t(cb, &L->conv, cb->C * cb->W, 4, "conv weights", err) ||
                upload(cb, L->conv, 0, 0, &t->q_conv, cb->QK * cb->W, "q_conv1d", l, err) ||
                upload(cb, L->conv, cb->QK * cb->W, 0, &t->k_conv, cb->QK * cb->W, "k_conv1d", l, err) ||
                upload(cb, L->conv, 2 * cb->QK * cb->W, 0, &t->v_conv, cb->VD * cb->W, "v_conv1d", l, err))
                goto fail;
        }
    }
    CU(cudaDeviceSynchronize());
    return 0;
fail:
    free_all(cb);
    cb->embed = cb->head = NULL, cb->final_norm = NULL;
    return -1;
}

// --------------------------------------------------------------------------- reserve

size_t align_up(size_t x) { return (x + 255) & ~(size_t)255; }

int cu_reserve(kd_backend *b, int32_t n_slots, int32_t max_rows, int64_t max_tokens, int32_t max_window,
               kd_commit_mode mode, kd_err *err) {
    cu_backend *cb = SELF(b);
    const kd_config *c = &b->config;
    if (!cb->layers) return kd_fail(err, "cuda backend: reserve before load");
    if (max_window > kMaxWindow)
        return kd_fail(err, "cuda backend: verify windows of up to %d tokens requested, the KDA kernels take %d",
                       max_window, kMaxWindow);
    if (max_rows > 65535)
        return kd_fail(err, "cuda backend: %d rows per batch, at most 65535", max_rows);
    if (max_tokens > (int64_t)1 << 30)
        return kd_fail(err, "cuda backend: %lld tokens per batch is too many", (long long)max_tokens);
    CU(cudaSetDevice(cb->dev));
    const int64_t L = c->n_layers, N = max_tokens, Tw = max_window, HV = cb->HV, K = cb->K, V = cb->V;
    const int64_t ssm = b->layout.ssm_elems, conv = b->layout.conv_elems, S1 = (int64_t)n_slots + 1;
    const int store_all = mode == KD_COMMIT_STORE_ALL;
    const int64_t convrec = c->use_short_conv ? cb->C : 0;
    cb->slots1 = S1;
    const int64_t lb = (ssm + conv + 31) / 32 * 32; // a layer's S + window, padded
    cb->R = (int32_t)(cb->Hw + Tw > 0 ? cb->Hw + Tw : 1);
    cb->lS = cb->lwin = lb, cb->sstride = L * lb, cb->lhist = S1 * cb->R * convrec;
    /* the lazy checkpoint in deferred mode only (eager commits fold every window at once) */
    int64_t rc = mode == KD_COMMIT_DEFERRED ? Tw * cb->lazy : Tw;
    if (rc > kMaxRecords) rc = kMaxRecords;
    if (rc < Tw) rc = Tw;
    cb->rcap = (int32_t)rc;
    cb->lrec_u = store_all ? 0 : S1 * rc * HV * V;
    cb->lrec_kg = store_all ? 0 : S1 * 2 * rc * HV * 2 * K;
    cb->lstored = store_all ? S1 * Tw * ssm : 0;
    free(cb->kg_read);
    free(cb->held);
    free(cb->conv_head);
    free(cb->conv_sync);
    cb->kg_read = (int32_t *)calloc((size_t)S1, sizeof *cb->kg_read);
    cb->held = (int32_t *)calloc((size_t)S1, sizeof *cb->held);
    cb->conv_head = (int32_t *)calloc((size_t)S1, sizeof *cb->conv_head);
    cb->conv_sync = (uint8_t *)malloc((size_t)S1);
    if (!cb->kg_read || !cb->held || !cb->conv_head || !cb->conv_sync)
        return kd_fail(err, "cuda backend: out of host memory");
    memset(cb->conv_sync, CONV_BOTH, (size_t)S1); /* windows and rings start as zeros (dalloc) */
    const size_t as = cb->wsz; // activation element fed to GEMMs
    cb->lg_rows = N < kLogitChunk ? N : kLogitChunk;
    if (dalloc_t(cb, &cb->S, S1 * cb->sstride, 4, "recurrent states and conv windows", err) ||
        dalloc_t(cb, &cb->hist, L * cb->lhist, 4, "conv history rings", err) ||
        dalloc_t(cb, &cb->rec_u, L * cb->lrec_u, 4, "correction records", err) ||
        dalloc_t(cb, &cb->rec_kg, L * cb->lrec_kg, 4, "key/decay records", err) ||
        dalloc_t(cb, &cb->stored, L * cb->lstored, 4, "stored window states", err) ||
        dalloc_t(cb, &cb->x, N * cb->D, 4, "residual stream", err) ||
        dalloc(cb, &cb->h, N * cb->D, as, "normed hidden", err) ||
        dalloc_t(cb, &cb->proj, N * cb->P, 4, "fused projection", err) ||
        dalloc(cb, &cb->fg0, cb->bf16 ? N * 2 * V : 1, as, "f_proj.0|g_proj.0 (bf16)", err) ||
        /* one allocation, the output gate after the raw gate (gemm_pair's batched launch) */
        dalloc_t(cb, &cb->graw, N * HV * K + N * cb->VD, 4, "raw gate | output gate", err) ||
        !(cb->gate = cb->graw + N * HV * K) ||
        dalloc_t(cb, &cb->q, N * cb->QK, 4, "q", err) || dalloc_t(cb, &cb->k, N * cb->QK, 4, "k", err) ||
        dalloc_t(cb, &cb->v, N * cb->VD, 4, "v", err) ||
        dalloc_t(cb, &cb->qn, N * cb->QK, 4, "q normed", err) ||
        dalloc_t(cb, &cb->kn, N * cb->QK, 4, "k normed", err) || dalloc_t(cb, &cb->qk, N * cb->H, 4, "q.k", err) ||
        dalloc_t(cb, &cb->decay, N * HV * K, 4, "decay", err) || dalloc_t(cb, &cb->beta, N * HV, 4, "beta", err) ||
        dalloc_t(cb, &cb->o, N * cb->VD, 4, "recurrence output", err) ||
        dalloc(cb, &cb->ob, N * cb->VD, as, "gated norm output", err) ||
        dalloc_t(cb, &cb->gu, N * 2 * cb->FF, 4, "gate|up", err) ||
        dalloc(cb, &cb->act, N * cb->FF, as, "swiglu output", err) ||
        dalloc(cb, &cb->sel, N * cb->D, as, "final norm rows", err) ||
        dalloc_t(cb, &cb->lg, cb->lg_rows * cb->vocab, 4, "logits", err) ||
        dalloc_t(cb, &cb->snap, b->layout.slot_elems, 4, "snapshot", err) ||
        dalloc_t(cb, &cb->kpart, cb->bf16 ? KD_KSPLIT_MAX * (N < kKsplitRows ? N : kKsplitRows) * cb->D : 1, 4,
                 "K slices' partial sums", err) ||
        dalloc_t(cb, &cb->kda_work,
                 store_all ? 1 : (int64_t)kd_kda_work_floats(max_rows, (int32_t)HV, (int32_t)K, (int32_t)rc),
                 4, "KDA verify work space", err) ||
        dalloc_t(cb, &cb->pf_work,
                 (int64_t)kd_kda_prefill_work_floats((int32_t)(N / 8 + max_rows), (int32_t)HV, (int32_t)K), 4,
                 "KDA prefill work space", err))
        return -1;
    cb->kpart_rows = cb->bf16 ? (N < kKsplitRows ? N : kKsplitRows) : 0;
    cb->win = cb->S + ssm; // each layer's window right after its S
    (void)conv;
    meta_layout *ml = &cb->ml;
    size_t off = 0;
    ml->tokens = off, off = align_up(off + (size_t)N * sizeof(int32_t));
    ml->toks = off, off = align_up(off + (size_t)N * sizeof(kd_cu_tok));
    ml->pfolds = off, off = align_up(off + (size_t)max_rows * sizeof(kd_cu_fold));
    ml->vrows = off, off = align_up(off + (size_t)max_rows * sizeof(kd_kda_row));
    ml->prows = off, off = align_up(off + (size_t)max_rows * sizeof(kd_cu_prow));
    ml->lrows = off, off = align_up(off + (size_t)N * sizeof(int32_t));
    ml->spos = off, off = align_up(off + (size_t)N * sizeof(kd_cu_spos));
    ml->srows = off, off = align_up(off + (size_t)max_rows * sizeof(kd_cu_srow));
    ml->crows = off, off = align_up(off + (size_t)L * sizeof(kd_kda_row));
    ml->total = off;
    if (dalloc_t(cb, &cb->meta_dev, (int64_t)ml->total, 1, "batch metadata", err) ||
        dalloc_t(cb, &cb->sres, N, sizeof(kd_cu_sres), "sampling decisions", err) ||
        dalloc_t(cb, &cb->sarg, N * KD_CU_ARG_SLICES, sizeof(kd_cu_argpart), "argmax slices", err) ||
        dalloc_t(cb, &cb->sout, (int64_t)max_rows * (Tw + 2), 4, "sampling results", err))
        return -1;
    CU(cudaMallocHost(&cb->sout_h, (size_t)max_rows * (Tw + 2) * 4));
    CU(cudaMallocHost(&cb->pinned_meta, ml->total));
    CU(cudaMallocHost(&cb->pinned_stage, kStageBytes));
    CU(cudaDeviceSynchronize());
    b->n_slots = n_slots, b->max_rows = max_rows, b->max_tokens = max_tokens;
    b->max_window = max_window, b->mode = mode;
    b->slot_bytes =
        (size_t)(b->layout.slot_elems + L * (cb->R * convrec + (store_all ? Tw * ssm : rc * HV * (V + 4 * K)))) * 4;
    return 0;
}

// ---------------------------------------------------------------------- state pieces

// The 2 L pieces of a slot's committed state (export layout [L][S | win], bytes):
// calls fn(device address, byte offset within [off, off + len), length) for each piece
// that intersects [off, off + len).
template <class F>
int state_pieces(cu_backend *cb, int32_t slot, size_t off, size_t len, F fn) {
    const kd_state_layout *lay = &cb->base.layout;
    const size_t ssm_b = (size_t)lay->ssm_elems * 4, conv_b = (size_t)lay->conv_elems * 4;
    const size_t layer_b = ssm_b + conv_b, end = off + len;
    for (int32_t l = 0; l < cb->base.config.n_layers; l++) {
        const size_t base = (size_t)l * layer_b;
        struct {
            char *dev;
            size_t at, n;
        } p[2] = {{(char *)(cb->S + (size_t)l * cb->lS + (size_t)slot * cb->sstride), base, ssm_b},
                  {(char *)(cb->win + (size_t)l * cb->lwin + (size_t)slot * cb->sstride), base + ssm_b, conv_b}};
        for (int i = 0; i < 2; i++) {
            const size_t lo = p[i].at > off ? p[i].at : off, hi = p[i].at + p[i].n < end ? p[i].at + p[i].n : end;
            if (lo < hi && fn(p[i].dev + (lo - p[i].at), lo - off, hi - lo)) return -1;
        }
    }
    return 0;
}

// The slot's export-layout conv windows from its rings, where the rings are newer (a state call
// reads or copies win next), and the other way (a forward or commit uses the rings next).
int conv_sync(cu_backend *cb, int32_t slot, bool to_ring, kd_err *err) {
    if (cb->lhist == 0 || cb->Hw < 1 || cb->conv_sync[slot] != (to_ring ? CONV_WIN : CONV_RING)) return 0;
    KDA(kd_cu_conv_window(to_ring, (int)cb->base.config.n_layers, cb->C, (int)cb->W, cb->hist, cb->lhist, cb->R, slot,
                          cb->conv_head[slot], cb->win + (size_t)slot * cb->sstride, cb->lwin, cb->stream));
    cb->conv_sync[slot] = CONV_BOTH;
    return 0;
}

int cu_state_read(kd_backend *b, int32_t slot, void *dst, size_t bytes, kd_err *err) {
    cu_backend *cb = SELF(b);
    CU(cudaSetDevice(cb->dev));
    if (conv_sync(cb, slot, false, err)) return -1;
    if (state_pieces(cb, slot, 0, bytes, [&](char *dev, size_t at, size_t n) {
            CU(cudaMemcpyAsync((char *)dst + at, dev, n, cudaMemcpyDefault, cb->stream)); // host or device dst
            return 0;
        }))
        return -1;
    CU(cudaStreamSynchronize(cb->stream));
    return 0;
}

int cu_state_write_part(kd_backend *b, int32_t slot, size_t offset, const void *src, size_t len, kd_err *err) {
    cu_backend *cb = SELF(b);
    CU(cudaSetDevice(cb->dev));
    if (conv_sync(cb, slot, false, err)) return -1; /* the windows this part leaves as they are */
    cb->conv_sync[slot] = CONV_WIN;
    cb->held[slot] = 0; /* the slot's state is what lands (the caller has dropped its records) */
    if (state_pieces(cb, slot, offset, len, [&](char *dev, size_t at, size_t n) {
            CU(cudaMemcpyAsync(dev, (const char *)src + at, n, cudaMemcpyDefault, cb->stream)); // host or device src
            return 0;
        }))
        return -1;
    CU(cudaStreamSynchronize(cb->stream));
    return 0;
}

int cu_state_write(kd_backend *b, int32_t slot, const void *src, size_t bytes, kd_err *err) {
    return cu_state_write_part(b, slot, 0, src, bytes, err);
}

int cu_state_copy(kd_backend *b, int32_t dst, int32_t src, kd_err *err) {
    cu_backend *cb = SELF(b);
    CU(cudaSetDevice(cb->dev));
    const size_t ss = (size_t)cb->sstride; // a slot's whole state is one block
    if (conv_sync(cb, src, false, err)) return -1;
    cb->conv_sync[dst] = CONV_WIN;
    cb->held[dst] = 0;
    CU(cudaMemcpyAsync(cb->S + (size_t)dst * ss, cb->S + (size_t)src * ss, ss * 4, cudaMemcpyDeviceToDevice,
                       cb->stream));
    CU(cudaStreamSynchronize(cb->stream));
    return 0;
}

int cu_reset_slot(kd_backend *b, int32_t slot, kd_err *err) {
    cu_backend *cb = SELF(b);
    CU(cudaSetDevice(cb->dev));
    cb->conv_sync[slot] = CONV_WIN;
    cb->held[slot] = 0;
    CU(cudaMemsetAsync(cb->S + (size_t)slot * cb->sstride, 0, (size_t)cb->sstride * 4, cb->stream));
    CU(cudaStreamSynchronize(cb->stream));
    return 0;
}

// XXH3-64 of the bytes, copied to the host through the pinned staging buffer (for now).
int cu_state_hash(kd_backend *b, int32_t slot, size_t offset, size_t len, uint64_t *out, kd_err *err) {
    cu_backend *cb = SELF(b);
    CU(cudaSetDevice(cb->dev));
    if (conv_sync(cb, slot, false, err)) return -1;
    XXH3_state_t *st = XXH3_createState();
    if (!st) return kd_fail(err, "cuda backend: out of host memory (hash state)");
    XXH3_64bits_reset(st);
    int rc = state_pieces(cb, slot, offset, len, [&](char *dev, size_t at, size_t n) {
        (void)at;
        for (size_t i = 0; i < n; i += kStageBytes) {
            const size_t m = n - i < kStageBytes ? n - i : kStageBytes;
            cudaError_t e = cudaMemcpyAsync(cb->pinned_stage, dev + i, m, cudaMemcpyDeviceToHost, cb->stream);
            if (e == cudaSuccess) e = cudaStreamSynchronize(cb->stream);
            if (e != cudaSuccess)
                return kd_fail(err, "cuda backend: state hash: cudaMemcpyAsync: %s", cudaGetErrorString(e));
            XXH3_64bits_update(st, cb->pinned_stage, m);
        }
        return 0;
    });
    if (rc == 0) *out = XXH3_64bits_digest(st);
    XXH3_freeState(st);
    return rc;
}

/* The regions hold the slot's conv windows as of its last state write, copy into, reset, read or
 * hash (the rings hold them between forwards): a transport writes a slot reset since its last
 * forward (the engine resets the slots it reserves for handoffs), and that write counts. */
int cu_state_regions(kd_backend *b, int32_t slot, kd_dev_region *out, int max, kd_err *err) {
    cu_backend *cb = SELF(b);
    int n = 0;
    if (state_pieces(cb, slot, 0, b->layout.slot_elems * 4, [&](char *dev, size_t at, size_t len) {
            (void)at;
            if (n > 0 && (const char *)out[n - 1].dev + out[n - 1].n_bytes == dev) { // adjacent: one region
                out[n - 1].n_bytes += len;
                return 0;
            }
            if (n == max) return kd_fail(err, "cuda backend: a slot has more than %d state regions", max);
            out[n++] = kd_dev_region{dev, (uint64_t)len};
            return 0;
        }))
        return -1;
    return n;
}

int cu_synchronize(kd_backend *b, kd_err *err) {
    cu_backend *cb = SELF(b);
    CU(cudaSetDevice(cb->dev));
    CU(cudaStreamSynchronize(cb->stream));
    return 0;
}

// ------------------------------------------------------------------------- forward

// Whether the product of these shapes runs in the skinny kernel's row form 5, which takes the
// bf16 copy epilogue (kd_cu_gemm_skinny_epi), with that fusion on.
bool copy_epi(const cu_backend *cb, int64_t M, int64_t N, int64_t K, const void *A, int64_t lda, const void *B,
              int64_t ldb) {
    return cb->bf16 && cb->skinny && (cb->fuse & KD_CUDA_FUSE_COPY) && M <= 4 && kd_cu_skinny_pick(M, N, K) == 5 &&
           kd_cu_skinny_ok(M, N, K, A, lda, B, ldb, KD_SKINNY_MAX_M);
}

// The skinny kernel's form for a product of the forward (0: cuBLAS): kd_cu_skinny_pick's, or for
// 2-4 rows and K > 256 kd_cuda_set_skinny_rows_form's where it names one.
int skinny_form(const cu_backend *cb, int64_t M, int64_t N, int64_t K) {
    if (!cb->bf16 || !cb->skinny) return 0;
    if (cb->rows_form && M >= 2 && M <= 4 && K > 256) return cb->rows_form < 0 ? 0 : cb->rows_form;
    return kd_cu_skinny_pick(M, N, K);
}

// Whether gemm() runs the product in the skinny kernel.
bool skinny_takes(const cu_backend *cb, int64_t M, int64_t N, int64_t K, const void *A, int64_t lda, const void *B,
                  int64_t ldb) {
    return skinny_form(cb, M, N, K) && kd_cu_skinny_ok(M, N, K, A, lda, B, ldb, KD_SKINNY_MAX_M);
}

// C[M][N] = A[M][K] B[N][K]^T + beta C (row-major, leading dimensions given; A in the
// activation type, B in the weight type, C fp32).
// ep: the copy epilogue (kd_cu_gemm_skinny_epi) where copy_epi said the product takes it.
// on_side: on the second stream (cb->side), with its cuBLAS handle and workspace.
int gemm(cu_backend *cb, int64_t M, int64_t N, int64_t K, const void *A, int64_t lda, const void *B, int64_t ldb,
         float beta, float *C, int64_t ldc, const char *what, kd_err *err, const kd_skinny_epi *ep = nullptr,
         bool on_side = false) {
    if (M <= 0) return 0;
    cudaStream_t stream = on_side ? cb->side : cb->stream;
    cublasHandle_t blas = on_side ? cb->blas_side : cb->blas;
    if (M > 0x7fffffff || N > 0x7fffffff || K > 0x7fffffff)
        return kd_fail(err, "cuda backend: GEMM %s too large", what);
    const int form = skinny_form(cb, M, N, K);
    if (form && kd_cu_skinny_ok(M, N, K, A, lda, B, ldb, KD_SKINNY_MAX_M)) {
        const cudaError_t e =
            ep ? kd_cu_gemm_skinny_epi(form, M, N, K, (const __nv_bfloat16 *)A, lda, (const __nv_bfloat16 *)B, ldb,
                                       beta, C, ldc, ep, stream)
               : kd_cu_gemm_skinny_form(form, M, N, K, (const __nv_bfloat16 *)A, lda, (const __nv_bfloat16 *)B, ldb,
                                        beta, C, ldc, stream);
        if (e != cudaSuccess)
            return kd_fail(err, "cuda backend: skinny GEMM %s (M %lld N %lld K %lld): %s", what, (long long)M,
                           (long long)N, (long long)K, cudaGetErrorString(e));
        return 0;
    }
    const float alpha = 1.f;
    cublasStatus_t s = CUBLAS_STATUS_NOT_SUPPORTED;
    const char *call = cb->bf16 ? "cublasGemmEx" : "cublasSgemm";
    if (cb->bf16 && cb->lt && cb->lt_mode > 0) {
        s = kd_cu_lt_gemm(cb->lt, M, N, K, (const __nv_bfloat16 *)A, lda, (const __nv_bfloat16 *)B, ldb, beta, C, ldc,
                          on_side ? cb->blas_ws_side : cb->blas_ws, kBlasWorkspace, stream);
        call = "cublasLtMatmul";
    }
    if (s == CUBLAS_STATUS_NOT_SUPPORTED && cb->bf16) { // no cuBLASLt algorithm: cublasGemmEx's own
        call = "cublasGemmEx";
        s = cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)N, (int)M, (int)K, &alpha, B, CUDA_R_16BF,
                         (int)ldb, A, CUDA_R_16BF, (int)lda, &beta, C, CUDA_R_32F, (int)ldc, CUBLAS_COMPUTE_32F,
                         CUBLAS_GEMM_DEFAULT);
    } else if (!cb->bf16) {
        s = cublasSgemm(blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)N, (int)M, (int)K, &alpha, (const float *)B,
                        (int)ldb, (const float *)A, (int)lda, &beta, C, (int)ldc);
    }
    if (s != CUBLAS_STATUS_SUCCESS)
        return kd_fail(err, "cuda backend: %s (GEMM %s, M %lld N %lld K %lld): %s", call, what, (long long)M,
                       (long long)N, (long long)K, cublasGetStatusString(s));
    return 0;
}

// The product of gemm() with beta 0 into cb->kpart, in cb->ks_nb K slices (kd_cu_lt_gemm_split: [nb][M][N])
// where cuBLASLt takes them, else whole (one block): how many blocks it wrote, -1 on failure. bf16.
int gemm_slices(cu_backend *cb, int64_t M, int64_t N, int64_t K, const void *A, int64_t lda, const void *B,
                int64_t ldb, const char *what, kd_err *err) {
    const int nb = cb->ks_nb;
    if (nb > 1 && K % nb == 0 && K / nb % 8 == 0) {
        const cublasStatus_t s =
            kd_cu_lt_gemm_split(cb->lt, M, N, K, (const __nv_bfloat16 *)A, lda, (const __nv_bfloat16 *)B, ldb, nb,
                                cb->kpart, cb->blas_ws, kBlasWorkspace, cb->stream);
        if (s == CUBLAS_STATUS_SUCCESS) return cb->ks_launches++, nb;
        if (s != CUBLAS_STATUS_NOT_SUPPORTED)
            return kd_fail(err, "cuda backend: cublasLtMatmul (GEMM %s in %d K slices, M %lld N %lld K %lld): %s", what,
                           nb, (long long)M, (long long)N, (long long)K, cublasGetStatusString(s));
    }
    return gemm(cb, M, N, K, A, lda, B, ldb, 0.f, cb->kpart, N, what, err) ? -1 : 1;
}

// Two products of the same M and K with beta 0 (f_proj.1 and g_proj.1): one launch where the
// skinny kernel takes both in the same form (kd_cu_gemm_skinny_pair), else one after the other.
// conv (optional): the conv to run in that launch too, at most 8 rows
// (kd_cu_gemm_skinny_pair_conv; *conv_done says whether it ran).
int gemm_pair(cu_backend *cb, int64_t M, int64_t K, const void *A0, int64_t lda0, const void *W0, int64_t ldw0,
              int64_t N0, float *C0, int64_t ldc0, const void *A1, int64_t lda1, const void *W1, int64_t ldw1,
              int64_t N1, float *C1, int64_t ldc1, const char *what, kd_err *err,
              const kd_cu_conv_args *conv = nullptr, bool *conv_done = nullptr) {
    if (conv_done) *conv_done = false;
    if (M <= 0) return 0;
    const int form = cb->bf16 && cb->skinny && cb->pair ? kd_cu_skinny_pick(M, N0, K) : 0;
    if (form && form <= 8 && form == kd_cu_skinny_pick(M, N1, K) &&
        kd_cu_skinny_ok(M, N0, K, A0, lda0, W0, ldw0, KD_SKINNY_MAX_M) &&
        kd_cu_skinny_ok(M, N1, K, A1, lda1, W1, ldw1, KD_SKINNY_MAX_M)) {
        const kd_skinny_job j0 = {(const __nv_bfloat16 *)A0, lda0, (const __nv_bfloat16 *)W0, ldw0, C0, ldc0, N0};
        const kd_skinny_job j1 = {(const __nv_bfloat16 *)A1, lda1, (const __nv_bfloat16 *)W1, ldw1, C1, ldc1, N1};
        /* at most 8 rows: at 32 the conv's blocks slowed the pair's (3.370 vs 3.320 ms a 48B step at
         * B = 32 on an H200) */
        const bool with_conv = conv && conv_done && M <= 8;
        const cudaError_t e = with_conv ? kd_cu_gemm_skinny_pair_conv(form, M, K, &j0, &j1, 0.f, conv, cb->stream)
                                        : kd_cu_gemm_skinny_pair(form, M, K, &j0, &j1, 0.f, cb->stream);
        if (e == cudaSuccess && with_conv) *conv_done = true;
        if (e != cudaSuccess)
            return kd_fail(err, "cuda backend: skinny GEMM pair %s%s (M %lld N %lld + %lld K %lld): %s", what,
                           with_conv ? " with the conv" : "", (long long)M, (long long)N0, (long long)N1, (long long)K,
                           cudaGetErrorString(e));
        return 0;
    }
    /* past the skinny kernel's rows: one strided batched cuBLAS launch of both where their shapes
     * and leading dimensions match and each operand's second matrix lies after its first (the
     * backend's allocations: take_pair, the gate buffers), else one product after the other */
    const uintptr_t a0 = (uintptr_t)A0, a1 = (uintptr_t)A1, w0 = (uintptr_t)W0, w1 = (uintptr_t)W1;
    const uintptr_t c0 = (uintptr_t)C0, c1 = (uintptr_t)C1;
    if (cb->bf16 && cb->pair && N0 == N1 && lda0 == lda1 && ldw0 == ldw1 &&
        ldc0 == ldc1 && a1 > a0 && w1 > w0 && c1 > c0 && (a1 - a0) % 2 == 0 && (w1 - w0) % 2 == 0 &&
        (c1 - c0) % 4 == 0 && M <= 0x7fffffff && N0 <= 0x7fffffff && K <= 0x7fffffff) {
        const float alpha = 1.f, beta = 0.f;
        const cublasStatus_t s = cublasGemmStridedBatchedEx(
            cb->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)N0, (int)M, (int)K, &alpha, W0, CUDA_R_16BF, (int)ldw0,
            (long long)((w1 - w0) / 2), A0, CUDA_R_16BF, (int)lda0, (long long)((a1 - a0) / 2), &beta, C0, CUDA_R_32F,
            (int)ldc0, (long long)((c1 - c0) / 4), 2, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        if (s != CUBLAS_STATUS_SUCCESS)
            return kd_fail(err, "cuda backend: cublasGemmStridedBatchedEx (GEMM %s, M %lld N %lld K %lld): %s", what,
                           (long long)M, (long long)N0, (long long)K, cublasGetStatusString(s));
        cb->pair_batched++;
        return 0;
    }
    return gemm(cb, M, N0, K, A0, lda0, W0, ldw0, 0.f, C0, ldc0, what, err) ||
           gemm(cb, M, N1, K, A1, lda1, W1, ldw1, 0.f, C1, ldc1, what, err);
}

// Whether the conv + prepare kernel (kd_cu_conv_prepare) runs at N activation rows, else the conv
// (in f_proj.1 + g_proj.1's launch) and the prepare each in their own kernels. From 2 rows, windows
// or single tokens. On an H100 (48B steps, cuda_bench KD_BENCH_CONVPREP: the rule before against the
// one kernel at every row count, alternated rounds in one process; tests/bench/results/logs/
// convprep_ab_h100_321037b.log): 4 rows of windows, where the rule before took the kernels apart,
// B = 1 s = 3 2.183 -> 2.154 ms, B = 2 s = 1 2.196 -> 2.148; 2-3 rows B = 2 s = 0 2.145 -> 2.098, B = 1
// s = 1 2.120 -> 2.096, B = 1 s = 2 2.155 -> 2.135, B = 3 s = 0 the same; at 1 row slower (2.013 ->
// 2.028: there the conv in the row form's pair launch costs nothing on the path). On an H200 the
// 48B table's column with the one kernel at every row count had B = 1 s = 3 1.754 against 1.785 ms
// (kimi48b_cuda_h200.md at ad99bde; 1.759 against 1.808 at 470670e). Until then (from 4f478b1,
// before the conv + prepare kernel's later changes) 4 rows of windows took the kernels apart:
// B = 1 s = 3 1.814 -> 1.780 ms on an H200 then (logs/fuse_h200_4f478b1.log).
bool conv_prep_rows(int64_t N) { return N >= 2; }

// The most activation rows (tokens, where the prefetch as a whole counts requests: pf_rows) of a
// forward in which the MLP RMSNorm's blocks prefetch their share of gate|up (the header says why).
constexpr int64_t kPfMlpMaxRows = 2;

// Offset of an activation-type pointer by n elements.
void *act_at(cu_backend *cb, void *p, int64_t n) { return (char *)p + (size_t)n * cb->wsz; }

kd_kda_args layer_args(cu_backend *cb, int32_t l) {
    kd_kda_args a;
    memset(&a, 0, sizeof a);
    a.H = (int32_t)cb->H, a.HV = (int32_t)cb->HV, a.K = (int32_t)cb->K, a.V = (int32_t)cb->V;
    a.Tw = cb->rcap; // the records' stride and the longest fold (kda.cuh)
    a.state = cb->S + (size_t)l * cb->lS;
    a.slot_stride = cb->sstride;
    a.rec_u = cb->lrec_u ? cb->rec_u + (size_t)l * cb->lrec_u : NULL;
    a.rec_kg = cb->lrec_kg ? cb->rec_kg + (size_t)l * cb->lrec_kg : NULL;
    if (cb->lstored) a.stored = cb->stored + (size_t)l * cb->lstored; // store-all
    else a.work = cb->kda_work;                                      // deferred (a union with stored)
    a.qn = cb->qn, a.kn = cb->kn, a.qk = cb->qk, a.decay = cb->decay, a.beta = cb->beta, a.v = cb->v;
    a.o = cb->o;
    return a;
}

kd_kda_mode kda_mode(const cu_backend *cb) {
    return cb->base.mode == KD_COMMIT_STORE_ALL ? KD_KDA_STORE_ALL : KD_KDA_DEFERRED;
}

// The lazy checkpoint: whether a verify row of a slot that folds F tokens (the held ones and its
// batch row's fold) and runs a window of len keeps its folded state instead of writing it back:
// when its window's records fit after the folded ones (the next verify folds at most F + len),
// and the next fold stays within kLazyHold records or two windows. Measured on an H200 (the KDA
// layer alone, HV = 32, K = V = 128, tests/bench/results/logs/lazy_sweep_h200.log): a state
// written every 2nd / 3rd / 4th / 8th step costs at B = 128 0.99 / 0.95 / 0.95 / 0.97 x the copy at
// T = 1, 1.16 / 1.13 / 1.13 / 1.21 x at T = 2, at T = 4 1.36 / 1.37 / 1.38 x (2nd to 4th): folds of
// more than 8 records cost more than the writes they spare.
int lazy_keep(const cu_backend *cb, int32_t slot, int32_t F, int32_t len) {
    const int32_t hold = 2 * len > kLazyHold ? 2 * len : kLazyHold;
    return cb->rcap > cb->base.max_window && slot != cb->base.n_slots && F > 0 && F + len <= cb->rcap &&
           F + len <= hold;
}

// Fills the pinned metadata block for a batch and returns its launch shape. With sampling
// (params != NULL) the sampler's per-position and per-row entries are filled too. pad_rows
// > 0: the graph layout of a verify-only batch: rows padded to pad_rows with one-token
// scratch windows, tokens to pad_tokens (graph_rows; the rest belong to no row: computed
// and ignored), max_len pad_window, and every token a logit row (only the rows' own are sampled).
// Each token's history ring index: a verify row's slot position advanced by its fold (the
// tokens the last step accepted), a prefill row's as it is (after_forward then advances both).
fwd_shape encode(cu_backend *cb, const kd_batch *batch, const kd_sample_params *params, const double *uniforms,
                 int pad_rows, int pad_window, int pad_tokens) {
    const kd_config *c = &cb->base.config;
    const meta_layout *ml = &cb->ml;
    const int conv = c->use_short_conv, folding = conv && cb->Hw > 0;
    const int Tw = cb->base.max_window, scratch = cb->base.n_slots;
    unsigned char *hm = (unsigned char *)cb->pinned_meta;
    int32_t *tokens = (int32_t *)(hm + ml->tokens), *lrows = (int32_t *)(hm + ml->lrows);
    kd_cu_tok *toks = (kd_cu_tok *)(hm + ml->toks);
    kd_cu_fold *pfolds = (kd_cu_fold *)(hm + ml->pfolds);
    kd_kda_row *vrows = (kd_kda_row *)(hm + ml->vrows);
    kd_cu_prow *prows = (kd_cu_prow *)(hm + ml->prows);
    kd_cu_spos *spos = (kd_cu_spos *)(hm + ml->spos);
    kd_cu_srow *srows = (kd_cu_srow *)(hm + ml->srows);
    fwd_shape sh;
    memset(&sh, 0, sizeof sh);
    int64_t M = 0, t0 = 0;
    const int n_rows = pad_rows > 0 ? pad_rows : batch->n_rows;
    if (params && pad_rows > 0) // positions not sampled (the rows' own are set below)
        for (int64_t t = 0; t < pad_tokens; t++) spos[t].row = -1;
    for (int32_t r = 0; r < n_rows; r++) {
        kd_batch_row row;
        const int32_t *rt;
        static const int32_t zero = 0;
        if (r < batch->n_rows) row = batch->rows[r], rt = batch->tokens + t0;
        else row = kd_batch_row{scratch, 1, KD_LOGITS_NONE, KD_ROW_VERIFY, 0}, rt = &zero;
        const int verify = row.kind == KD_ROW_VERIFY;
        const int32_t ring = verify ? (int32_t)((cb->conv_head[row.slot] + (int64_t)row.fold) % cb->R)
                                    : cb->conv_head[row.slot];
        for (int32_t i = 0; i < row.n_tokens; i++) {
            tokens[t0 + i] = rt[i];
            toks[t0 + i] = kd_cu_tok_make(row.slot, i, (int32_t)t0, verify, ring);
        }
        if (verify) {
            kd_kda_row *vr = &vrows[sh.nv++];
            memset(vr, 0, sizeof *vr);
            vr->slot = row.slot, vr->start = (int32_t)t0, vr->len = row.n_tokens;
            vr->fold = cb->held[row.slot] + row.fold;
            vr->keep = lazy_keep(cb, row.slot, vr->fold, row.n_tokens);
            vr->kg_read = cb->kg_read[row.slot];
            if (row.n_tokens > sh.max_len) sh.max_len = row.n_tokens;
        } else {
            prows[sh.np++] = kd_cu_prow{row.slot, (int32_t)t0, row.n_tokens, sh.npc};
            sh.npc += (row.n_tokens + 7) / 8;
            if (folding) pfolds[sh.npf++] = kd_cu_fold{row.slot, row.n_tokens, (int32_t)t0, ring};
        }
        if (params) {
            kd_cu_srow *sr = &srows[r];
            *sr = kd_cu_srow{-1, 0, 1, 0};
            if (row.logits != KD_LOGITS_NONE) {
                const kd_sample_params &p = params[r];
                const double *u = uniforms + (size_t)r * Tw;
                const int all = row.logits == KD_LOGITS_ALL;
                const int32_t first_pos = all ? 0 : row.n_tokens - 1;
                const int64_t first = pad_rows > 0 ? t0 + first_pos : M;
                sr->first = (int32_t)first, sr->n_draft = all ? row.n_tokens - 1 : 0, sr->greedy = p.temperature == 0;
                for (int32_t i = first_pos; i < row.n_tokens; i++) {
                    const int32_t k = i - first_pos;
                    kd_cu_spos &sp = spos[first + k];
                    sp.row = r, sp.draft = all && i + 1 < row.n_tokens ? rt[i + 1] : -1;
                    sp.top_k = p.top_k, sp.greedy = p.temperature == 0;
                    sp.temperature = p.temperature, sp.top_p = p.top_p;
                    sp.u_acc = sp.greedy ? 0 : u[k];
                    sp.u_draw = sp.greedy ? 0 : u[sp.draft >= 0 ? k + 1 : k];
                }
            }
        }
        if (pad_rows == 0 && row.logits != KD_LOGITS_NONE)
            for (int32_t i = row.logits == KD_LOGITS_ALL ? 0 : row.n_tokens - 1; i < row.n_tokens; i++)
                lrows[M++] = (int32_t)(t0 + i);
        t0 += row.n_tokens;
    }
    if (pad_rows > 0) {
        const int64_t Np = pad_tokens;
        for (int64_t t = t0; t < Np; t++) { // tokens of no row
            tokens[t] = 0;
            toks[t] = kd_cu_tok_make(scratch, 0, (int32_t)t, 0, cb->conv_head[scratch]);
        }
        for (int64_t t = 0; t < Np; t++) lrows[t] = (int32_t)t;
        sh.max_len = pad_window;
        t0 = Np, M = Np;
    }
    sh.N = t0, sh.M = M, sh.n_rows = n_rows, sh.sample = params != NULL;
    return sh;
}

// Enqueues one forward of the encoded batch on the stream (no host wait: graph capture
// records exactly this): the metadata upload, the model, the head in chunks of rows, then
// either the logits to the host or the sampler and its results to the pinned buffer.
int launch_body(cu_backend *cb, const fwd_shape &sh, kd_err *err) {
    kd_backend *b = &cb->base;
    const kd_config *c = &b->config;
    const meta_layout *ml = &cb->ml;
    const int64_t N = sh.N, M = sh.M, D = cb->D, HV = cb->HV, K = cb->K, V = cb->V;
    const int64_t QK = cb->QK, VD = cb->VD, P = cb->P, FF = cb->FF, C = cb->C;
    const int conv = c->use_short_conv;
    const int bf = cb->bf16;
    const int nv = sh.nv, np = sh.np, npf = sh.npf, max_len = sh.max_len;
    cudaStream_t s = cb->stream;
    CU(cudaMemcpyAsync(cb->meta_dev, cb->pinned_meta, ml->total, cudaMemcpyHostToDevice, s));
    const int32_t *d_tokens = (const int32_t *)(cb->meta_dev + ml->tokens);
    const int32_t *d_lrows = (const int32_t *)(cb->meta_dev + ml->lrows);
    const kd_cu_tok *d_toks = (const kd_cu_tok *)(cb->meta_dev + ml->toks);
    const kd_cu_fold *d_pfolds = (const kd_cu_fold *)(cb->meta_dev + ml->pfolds);
    const kd_kda_row *d_vrows = (const kd_kda_row *)(cb->meta_dev + ml->vrows);
    const kd_cu_prow *d_prows = (const kd_cu_prow *)(cb->meta_dev + ml->prows);
    const kd_cu_spos *d_spos = (const kd_cu_spos *)(cb->meta_dev + ml->spos);
    const kd_cu_srow *d_srows = (const kd_cu_srow *)(cb->meta_dev + ml->srows);

    // ---- the model
    KDA(kd_cu_embed(bf, cb->embed, d_tokens, N, D, cb->x, s));
    const kd_kda_mode kmode = kda_mode(cb);
    const unsigned sk = cb->skip;
    /* few rows: their states' traffic leaves the prefetched weights in the L2 until read */
    const bool prefetch = cb->pf_bytes > 0 && nv + np <= cb->pf_rows;
    /* mode 4's shares of each layer's gate|up rows: the gated RMSNorm's blocks [0, pf_gn), the MLP
     * RMSNorm's [pf_gn, pf_gn + pf_mlp); with o_proj first (pf_gu_first 0) the gated RMSNorm's blocks
     * take o_proj's weights [0, pf_gn) instead and the MLP RMSNorm's gate|up's [0, pf_mlp) */
    const int64_t gu_bytes = 2 * FF * D * (int64_t)cb->wsz, o_bytes = D * VD * (int64_t)cb->wsz;
    const bool pf4 = prefetch && cb->pf_mode == 4, pf4o = pf4 && !cb->pf_gu_first;
    const int64_t gn_room = pf4o ? o_bytes : gu_bytes;
    const int64_t pf_gn = pf4 ? (gn_room < cb->pf_bytes ? gn_room : cb->pf_bytes) & ~(int64_t)15 : 0;
    const int64_t gu_done = pf4o ? 0 : pf_gn;
    const int64_t mlp_room = gu_bytes - gu_done < cb->pf_mlp_bytes ? gu_bytes - gu_done : cb->pf_mlp_bytes;
    const int64_t pf_mlp = pf4 && N <= kPfMlpMaxRows ? mlp_room & ~(int64_t)15 : 0;
    /* o_proj and the down projection in K slices (kd_cuda_set_ksplit): the next RMSNorm adds their partial
     * sums into the residual stream */
    const bool ks = bf && cb->lt && cb->lt_mode > 0 && cb->ks_nb > 1 && N >= cb->ks_lo && N <= cb->ks_hi &&
                    N <= cb->kpart_rows && D <= KD_NORM_ADD_MAX_D && !(sk & KD_CUDA_SKIP_NORMS);
    int parts = 0; /* blocks of cb->kpart that the next RMSNorm adds into cb->x */
    for (int32_t l = 0; l < c->n_layers; l++) {
        const cu_layer *Ly = &cb->layers[l];
        float *hist = cb->hist + (size_t)l * cb->lhist;
        // attention block
        if (parts) KDA(kd_cu_rmsnorm_add(bf, cb->h, cb->x, cb->kpart, parts, N, D, Ly->attn_norm, c->norm_eps, s));
        else if (!(sk & KD_CUDA_SKIP_NORMS))
            KDA(kd_cu_rmsnorm(bf, cb->h, cb->x, NULL, N, D, Ly->attn_norm, c->norm_eps, s));
        parts = 0;
        /* at few rows the gates' bf16 copy in the input projection's epilogue */
        const bool copy_fused = bf && !(sk & KD_CUDA_SKIP_IN_PROJ) && copy_epi(cb, N, P, D, cb->h, D, Ly->w_in, D);
        kd_skinny_epi cep = {};
        cep.copy = (__nv_bfloat16 *)cb->fg0, cep.col0 = 2 * QK + VD, cep.ncols = 2 * V;
        if (!(sk & KD_CUDA_SKIP_IN_PROJ) && gemm(cb, N, P, D, cb->h, D, Ly->w_in, D, 0.f, cb->proj, P,
                                                 "input projection", err, copy_fused ? &cep : nullptr))
            return -1;
        if (prefetch && cb->pf_mode != 4) { /* modes 1-3: o_proj's weights and gate|up's first rows (in
                         * pf_gu_first's order) into the L2 while the layer's small kernels leave the
                         * memory idle (a hint: no result depends on it) */
            const int64_t ob = D * VD * (int64_t)cb->wsz;
            const void *w1 = cb->pf_gu_first ? Ly->w_gu : Ly->w_o, *w2 = cb->pf_gu_first ? Ly->w_o : Ly->w_gu;
            const int64_t b1 = cb->pf_gu_first ? gu_bytes : ob, b2 = cb->pf_gu_first ? ob : gu_bytes;
            const int64_t a = (b1 < cb->pf_bytes ? b1 : cb->pf_bytes) & ~(int64_t)15;
            const int64_t r = (b2 < cb->pf_bytes - a ? b2 : cb->pf_bytes - a) & ~(int64_t)15;
            CU(cudaEventRecord(cb->ev_fork, s));
            CU(cudaStreamWaitEvent(cb->side, cb->ev_fork, 0));
            cb->side_open = 1;
            KDA(kd_cu_l2_prefetch(w1, a, cb->pf_mode, cb->side));
            KDA(kd_cu_l2_prefetch(w2, r, cb->pf_mode, cb->side));
        }
        /* the gates' bf16 copy, f_proj.1 and g_proj.1 on the second stream: the conv, then the prepare,
         * runs beside them (the prepare waits for f_proj.1), the verify beside g_proj.1 (the gated
         * RMSNorm waits for it) */
        const bool side = cb->side_rows > 0 && N >= cb->side_rows && !(sk & KD_CUDA_SKIP_FG_PROJ);
        if (side) {
            CU(cudaEventRecord(cb->ev_fork, s));
            CU(cudaStreamWaitEvent(cb->side, cb->ev_fork, 0));
            cb->side_open = 1;
        }
        const void *fa;
        int64_t flda;
        if (bf) {
            if (!(sk & KD_CUDA_SKIP_COPY_COLS) && !copy_fused)
                KDA(kd_cu_copy_cols(1, cb->fg0, cb->proj, N, P, 2 * QK + VD, 2 * V, side ? cb->side : s));
            fa = cb->fg0, flda = 2 * V;
        } else {
            fa = cb->proj + 2 * QK + VD, flda = P;
        }
        if (side) {
            if (gemm(cb, N, HV * K, V, fa, flda, Ly->f1, V, 0.f, cb->graw, HV * K, "f_proj.1", err, nullptr, true))
                return -1;
            CU(cudaEventRecord(cb->ev_f, cb->side));
            if (gemm(cb, N, VD, V, act_at(cb, (void *)fa, V), flda, Ly->g1, V, 0.f, cb->gate, VD, "g_proj.1", err,
                     nullptr, true))
                return -1;
            CU(cudaEventRecord(cb->ev_g, cb->side));
        }
        /* the conv's loads before its programmatic wait (early) where what it reads (the input
         * projection's output, the history rings) was written two or more kernels back: f_proj.1 +
         * g_proj.1 run between, and the rings' entries it reads were written by earlier forwards */
        const int early = !(sk & KD_CUDA_SKIP_FG_PROJ) && !side;
        kd_cu_conv_args ca = {cb->proj,   P,     N,     QK,    VD, d_toks, hist, cb->R, conv ? Ly->conv : NULL,
                              (int)cb->W, cb->q, cb->k, cb->v, 0,  0,      early};
        /* the conv of the q and k channels in the prepare's kernel; then the v channels' conv runs
         * alone or in f_proj.1 + g_proj.1's launch, two kernels before the verify, which loads v
         * before its programmatic wait (kda.cu) */
        kd_cu_prep_args pa = {(int32_t)cb->H, (int32_t)HV, (int32_t)K, 0, cb->graw, cb->proj + 2 * QK + VD + 2 * V,
                              P, Ly->A_log, Ly->dt_bias, c->use_lower_bound, c->allow_neg_eigval,
                              (float)c->lower_bound, cb->qn, cb->kn, cb->qk, cb->decay, cb->beta};
        const bool conv_prep = (cb->conv_prep || conv_prep_rows(N)) &&
                               (cb->fuse & KD_CUDA_FUSE_CONV_PREP) &&
                               !(sk & (KD_CUDA_SKIP_CONV | KD_CUDA_SKIP_PREPARE)) && kd_cu_conv_prepare_ok(&ca, &pa);
        kd_cu_conv_args cv = ca;
        if (conv_prep) cv.c0 = 2 * QK;
        /* the conv + prepare kernel: the v channels' conv just before it */
        ca.early = (early || side) && VD > 0;
        /* the conv in the f/g products' launch where the skinny kernel takes them (both read only
         * the input projection's output) */
        const bool conv_fuse = (cb->fuse & KD_CUDA_FUSE_CONV) && !conv_prep && !(sk & KD_CUDA_SKIP_CONV);
        bool conv_done = false;
        if (!(sk & KD_CUDA_SKIP_FG_PROJ) && !side &&
            gemm_pair(cb, N, V, fa, flda, Ly->f1, V, HV * K, cb->graw, HV * K, act_at(cb, (void *)fa, V), flda, Ly->g1,
                      V, VD, cb->gate, VD, "f_proj.1 + g_proj.1", err, conv_fuse ? &cv : nullptr, &conv_done))
            return -1;
        if (!(sk & KD_CUDA_SKIP_CONV) && !conv_done) { /* the v channels 4 a thread before the conv + prepare kernel */
            if (conv_prep && kd_cu_conv4_ok(&cv)) KDA(kd_cu_conv4(&cv, s));
            else KDA(kd_cu_conv_silu_args(&cv, s));
        }
        /* graw early too where the v channels' conv ran alone, after f_proj.1 (not from the other stream) */
        pa.graw_early = !conv_done && !side;
        if (side) CU(cudaStreamWaitEvent(s, cb->ev_f, 0));
        if (conv_prep) KDA(kd_cu_conv_prepare(&ca, &pa, s));
        if (npf) /* after the conv, which read the entries this overwrites */
            KDA(kd_cu_conv_ring_fill(d_pfolds, npf, C, (int)cb->W, hist, cb->R, cb->proj, P, s));
        if (!(sk & KD_CUDA_SKIP_PREPARE) && !conv_prep)
            KDA(kd_kda_prepare((int32_t)N, pa.H, pa.HV, pa.K, cb->q, cb->k, pa.graw, pa.braw, pa.braw_ld, pa.A_log,
                               pa.dt_bias, pa.use_lb, pa.lb, pa.neg, pa.qn, pa.kn, pa.qk, pa.decay, pa.beta, s));
        if (nv && !(sk & KD_CUDA_SKIP_VERIFY)) {
            kd_kda_args a = layer_args(cb, l);
            a.n_rows = nv, a.rows = d_vrows;
            KDA(kd_kda_verify(&a, kmode, max_len, s));
        }
        if (np && !(sk & KD_CUDA_SKIP_PREFILL))
            KDA(kd_cu_prefill(d_prows, np, sh.npc, (int)cb->H, (int)HV, (int)K, (int)V, cb->S + (size_t)l * cb->lS,
                              cb->sstride, cb->qn, cb->kn, cb->decay, cb->beta, cb->v, cb->o, cb->pf_work, s));
        if (side) {
            CU(cudaStreamWaitEvent(s, cb->ev_g, 0));
            cb->side_open = 0; /* all its work so far */
        }
        /* the gate, its bias and the norm's weights loaded before the norm's programmatic wait where a
         * prepare and a KDA kernel ran since g_proj.1 wrote the gate (launch.cuh; on the second stream
         * g_proj.1 is joined in full) */
        const bool gate_early = cb->gnorm_early && (side || (((nv && !(sk & KD_CUDA_SKIP_VERIFY)) || np) &&
                                                             (conv_prep || !(sk & KD_CUDA_SKIP_PREPARE))));
        if (!(sk & KD_CUDA_SKIP_GATED_NORM))
            KDA(kd_cu_gated_rmsnorm(bf, cb->ob, cb->o, cb->gate, Ly->g1_bias, Ly->o_norm, N, (int)HV, (int)V,
                                    c->norm_eps, s, pf4o ? Ly->w_o : Ly->w_gu, pf_gn, cb->pf_blocks, gate_early));
        if (sk & KD_CUDA_SKIP_O_PROJ) {
            /* benchmarks: left out */
        } else if (ks && !skinny_takes(cb, N, D, VD, cb->ob, VD, Ly->w_o, VD)) {
            if ((parts = gemm_slices(cb, N, D, VD, cb->ob, VD, Ly->w_o, VD, "o_proj", err)) < 0) return -1;
        } else if (gemm(cb, N, D, VD, cb->ob, VD, Ly->w_o, VD, 1.f, cb->x, D, "o_proj", err)) {
            return -1;
        }
        // MLP block
        if (parts)
            KDA(kd_cu_rmsnorm_add(bf, cb->h, cb->x, cb->kpart, parts, N, D, Ly->mlp_norm, c->norm_eps, s,
                                  (const char *)Ly->w_gu + gu_done, pf_mlp, cb->pf_blocks));
        else if (!(sk & KD_CUDA_SKIP_NORMS))
            KDA(kd_cu_rmsnorm(bf, cb->h, cb->x, NULL, N, D, Ly->mlp_norm, c->norm_eps, s,
                              (const char *)Ly->w_gu + gu_done, pf_mlp, cb->pf_blocks));
        parts = 0;
        if (sk & KD_CUDA_SKIP_MLP) {
            /* benchmarks: left out (kd_cuda_set_skip) */
        } else if (const int gf = skinny_form(cb, N, 2 * FF, D);
                   cb->swiglu && (gf == 5 || gf == 11) && N <= 4 &&
                   kd_cu_skinny_ok(N, 2 * FF, D, cb->h, D, Ly->w_gu, D, KD_SKINNY_MAX_M)) { /* gate|up and SwiGLU */
            KDA(kd_cu_gemm_skinny_swiglu(gf, N, FF, D, (const __nv_bfloat16 *)cb->h, D, (const __nv_bfloat16 *)Ly->w_gu,
                                         D, (__nv_bfloat16 *)cb->act, FF, s));
        } else {
            bool gu_done = false; /* gate|up in bf16 and SwiGLU from it (kd_cuda_set_gu_bf16) */
            if (bf && cb->gu16 && cb->lt && cb->lt_mode > 0 && !skinny_takes(cb, N, 2 * FF, D, cb->h, D, Ly->w_gu, D)) {
                const cublasStatus_t st =
                    kd_cu_lt_gemm_bf16(cb->lt, N, 2 * FF, D, (const __nv_bfloat16 *)cb->h, D,
                                       (const __nv_bfloat16 *)Ly->w_gu, D, (__nv_bfloat16 *)cb->gu, 2 * FF, cb->blas_ws,
                                       kBlasWorkspace, s);
                if (st != CUBLAS_STATUS_SUCCESS && st != CUBLAS_STATUS_NOT_SUPPORTED)
                    return kd_fail(err, "cuda backend: cublasLtMatmul (GEMM gate|up in bf16, M %lld): %s",
                                   (long long)N, cublasGetStatusString(st));
                if (st == CUBLAS_STATUS_SUCCESS) {
                    KDA(kd_cu_swiglu_h((__nv_bfloat16 *)cb->act, (const __nv_bfloat16 *)cb->gu, N, FF, s));
                    gu_done = true;
                }
            }
            if (!gu_done) {
                if (gemm(cb, N, 2 * FF, D, cb->h, D, Ly->w_gu, D, 0.f, cb->gu, 2 * FF, "gate|up", err)) return -1;
                KDA(kd_cu_swiglu(bf, cb->act, cb->gu, N, FF, s));
            }
        }
        if (sk & KD_CUDA_SKIP_MLP) {
            /* benchmarks: left out */
        } else if (ks && l + 1 < c->n_layers && !skinny_takes(cb, N, D, FF, cb->act, FF, Ly->w_down, FF)) {
            /* the next layer's input norm adds the slices (the last layer's product goes whole into x, which
             * the final norm reads at the requested rows only) */
            if ((parts = gemm_slices(cb, N, D, FF, cb->act, FF, Ly->w_down, FF, "down_proj", err)) < 0) return -1;
        } else if (gemm(cb, N, D, FF, cb->act, FF, Ly->w_down, FF, 1.f, cb->x, D, "down_proj", err)) {
            return -1;
        }
    }
    // ---- logits: final norm of the requested positions, head GEMM in chunks; each chunk
    // either copied to the host or sampled where it is
    if (M > 0) {
        KDA(kd_cu_rmsnorm(bf, cb->sel, cb->x, d_lrows, M, D, cb->final_norm, c->norm_eps, s));
        for (int64_t m0 = 0; m0 < M; m0 += cb->lg_rows) {
            const int64_t mc = M - m0 < cb->lg_rows ? M - m0 : cb->lg_rows;
            if (!(sk & KD_CUDA_SKIP_HEAD) && gemm(cb, mc, cb->vocab, D, act_at(cb, cb->sel, m0 * D), D, cb->head, D,
                                                   0.f, cb->lg, cb->vocab, "head", err))
                return -1;
            if (sh.sample)
                KDA(kd_cu_sample_positions(cb->lg, (int32_t)cb->vocab, m0, mc, d_spos, cb->sres, cb->sarg, s));
            else
                CU(cudaMemcpyAsync(sh.logits + (size_t)m0 * cb->vocab, cb->lg, (size_t)(mc * cb->vocab) * sizeof(float),
                                   cudaMemcpyDeviceToHost, s));
        }
    }
    if (sh.sample) {
        KDA(kd_cu_sample_finish(d_srows, sh.n_rows, d_spos, cb->sres, b->max_window, cb->sout, s));
        CU(cudaMemcpyAsync(cb->sout_h, cb->sout, (size_t)sh.n_rows * (b->max_window + 2) * 4, cudaMemcpyDeviceToHost,
                           s));
    }
    if (prefetch && cb->pf_mode != 4) { /* the side stream joins the step's stream (a capture ends with both joined) */
        CU(cudaEventRecord(cb->ev_join, cb->side));
        CU(cudaStreamWaitEvent(s, cb->ev_join, 0));
        cb->side_open = 0;
    }
    return 0;
}

// One forward's launches (launch_body). A forward that fails after forking the second stream
// joins it still, so that a capture ends with both streams joined and no work of the second
// stream is left to overlap the next forward's.
int launch(cu_backend *cb, const fwd_shape &sh, kd_err *err) {
    cb->side_open = 0;
    const int rc = launch_body(cb, sh, err);
    if (rc && cb->side_open && cudaEventRecord(cb->ev_join, cb->side) == cudaSuccess)
        cudaStreamWaitEvent(cb->stream, cb->ev_join, 0);
    cb->side_open = 0;
    return rc;
}

// Before a forward of these rows (outside any capture): the rings of slots whose export-layout
// windows are newer (written, copied into or reset since) take them.
int before_forward(cu_backend *cb, const kd_batch *batch, int pad_rows, kd_err *err) {
    for (int32_t r = 0; r < batch->n_rows; r++)
        if (conv_sync(cb, batch->rows[r].slot, true, err)) return -1;
    return pad_rows > batch->n_rows ? conv_sync(cb, cb->base.n_slots, true, err) : 0;
}

// After the stream ran a forward of these rows: each slot's ring position advanced past what
// the forward committed (a verify row's fold, a prefill row's tokens), and a verify wrote its
// key/decay records into the slot's other buffer, or, keeping its folded state (lazy_keep, as
// encode decided), after the records it folded, which the slot now holds.
void after_forward(cu_backend *cb, const kd_batch *batch, int pad_rows) {
    for (int32_t r = 0; r < batch->n_rows; r++) {
        const kd_batch_row &row = batch->rows[r];
        const int64_t n = row.kind == KD_ROW_VERIFY ? row.fold : row.n_tokens;
        cb->conv_head[row.slot] = (int32_t)((cb->conv_head[row.slot] + n) % cb->R);
        cb->conv_sync[row.slot] = CONV_RING;
    }
    if (kda_mode(cb) != KD_KDA_DEFERRED) return;
    for (int32_t r = 0; r < batch->n_rows; r++) {
        const kd_batch_row &row = batch->rows[r];
        if (row.kind != KD_ROW_VERIFY) continue;
        const int32_t F = cb->held[row.slot] + row.fold;
        if (lazy_keep(cb, row.slot, F, row.n_tokens)) {
            cb->held[row.slot] = F;
        } else {
            cb->held[row.slot] = 0;
            cb->kg_read[row.slot] ^= 1;
        }
    }
    for (int32_t r = batch->n_rows; r < pad_rows; r++) cb->kg_read[cb->base.n_slots] ^= 1;
}

int cu_forward(kd_backend *b, const kd_batch *batch, float *logits, kd_err *err) {
    cu_backend *cb = SELF(b);
    if (kd_batch_tokens(batch) == 0) return 0;
    CU(cudaSetDevice(cb->dev));
    if (before_forward(cb, batch, 0, err)) return -1;
    fwd_shape sh = encode(cb, batch, NULL, NULL, 0, 0, 0);
    sh.logits = logits;
    if (launch(cb, sh, err)) return -1;
    CU(cudaStreamSynchronize(cb->stream));
    CU(cudaGetLastError());
    after_forward(cb, batch, 0);
    return 0;
}

constexpr int kGraphTokenDiv = 2, kCaptureCovered = 4; // graph_rows, cu_forward_sample

// A graph's rows for a batch of n rows: the next power of two, at most the reservation's rows.
int graph_pad_rows(const kd_backend *b, int n) {
    int R = 1;
    while (R < n) R *= 2;
    return R > b->max_rows ? b->max_rows : R;
}

// A graph's tokens for n tokens in R rows of windows up to T: n rounded up to a multiple of
// max(4, R / kGraphTokenDiv), at most R * T.
int graph_tokens(int R, int T, int64_t n) {
    const int64_t q = R / kGraphTokenDiv > 4 ? R / kGraphTokenDiv : 4, full = (int64_t)R * T;
    n = (n + q - 1) / q * q;
    return (int)(n < full ? n : full);
}

void unpack_samples(const cu_backend *cb, int n_rows, int32_t *tokens, int32_t *accepted, int32_t *used) {
    const int Tw = cb->base.max_window;
    for (int r = 0; r < n_rows; r++) {
        const int32_t *o = cb->sout_h + (size_t)r * (Tw + 2);
        accepted[r] = o[Tw], used[r] = o[Tw + 1];
        for (int i = 0; i <= o[Tw] && i < Tw; i++) tokens[(size_t)r * Tw + i] = o[i];
    }
}

// The padded shape a decode batch replays a graph of (rows 0: run it eagerly): verify rows
// only, all logits; rows padded to the next power of two within the reservation (one-token
// scratch windows), *window the batch's longest window, *need the batch's tokens (the scratch
// windows' included), *tokens those rounded up to a multiple of max(4, rows / kGraphTokenDiv),
// at most rows * *window. A step where only some requests draft (an n-gram drafter that
// matches now and then) thus runs its products on about its own tokens, not on every row at
// the longest window (48B preset on an H200, results/e2e_graph_tokens_h200.md: 128 requests of
// which a few draft 3 tokens each step, 192 tokens instead of 512), at the cost of more shapes.
// A capture costs more than a step (there, runs with 7-8 new shapes took ~0.1 s longer: some
// 10 ms a capture, not timed apart), so a shape that a captured one of more tokens covers runs
// on that one until it has been seen kCaptureCovered times (the tokens of requests finishing
// one by one pass through shapes that do not come back).
int graph_rows(const cu_backend *cb, const kd_batch *batch, int *window, int *need, int *tokens) {
    const kd_backend *b = &cb->base;
    *window = 0, *need = 0, *tokens = 0;
    if (!cb->graphs || batch->n_rows < 1) return 0;
    int64_t n = 0;
    for (int32_t r = 0; r < batch->n_rows; r++) {
        const kd_batch_row &row = batch->rows[r];
        if (row.kind != KD_ROW_VERIFY || (row.logits != KD_LOGITS_ALL && row.slot != b->n_slots)) return 0;
        if (row.n_tokens > *window) *window = row.n_tokens;
        n += row.n_tokens;
    }
    const int R = graph_pad_rows(b, batch->n_rows);
    if (R < batch->n_rows || (int64_t)R * *window > b->max_tokens) return 0;
    n += R - batch->n_rows;
    *need = (int)n;
    *tokens = graph_tokens(R, *window, n);
    return R;
}

// The entry of a graph shape: its own, else a free one, else the least recently used one's
// (its graph destroyed: the stream is idle, each step waits); marked as used now.
graph_entry *graph_slot(cu_backend *cb, int R, int T, int N) {
    graph_entry *g = NULL;
    for (int i = 0; i < kMaxGraphs && !g; i++)
        if (cb->graph[i].rows == R && cb->graph[i].window == T && cb->graph[i].tokens == N) g = &cb->graph[i];
    if (!g) {
        g = &cb->graph[0];
        for (int i = 1; i < kMaxGraphs && g->rows != 0; i++)
            if (cb->graph[i].rows == 0 || cb->graph[i].used < g->used) g = &cb->graph[i];
        if (g->exec) cudaGraphExecDestroy(g->exec);
        *g = graph_entry{R, T, N, 0, 0, nullptr};
    }
    g->used = ++cb->graph_clock;
    return g;
}

// Captures the forward of a shape into g (nothing runs: the replays read the metadata block).
int capture(cu_backend *cb, graph_entry *g, const fwd_shape &sh, kd_err *err) {
    cudaGraph_t graph = nullptr;
    CU(cudaStreamBeginCapture(cb->stream, cudaStreamCaptureModeThreadLocal));
    const int rc = launch(cb, sh, err);
    const cudaError_t e = cudaStreamEndCapture(cb->stream, &graph);
    if (rc) {
        if (graph) cudaGraphDestroy(graph);
        return -1;
    }
    if (e != cudaSuccess)
        return kd_fail(err, "cuda backend: graph capture of %d rows (%d tokens, windows up to %d): %s", g->rows,
                       g->tokens, g->window, cudaGetErrorString(e));
    const cudaError_t ie = cudaGraphInstantiate(&g->exec, graph, 0);
    cudaGraphDestroy(graph);
    if (ie != cudaSuccess) {
        g->exec = nullptr;
        return kd_fail(err, "cuda backend: graph instantiate of %d rows (%d tokens, windows up to %d): %s", g->rows,
                       g->tokens, g->window, cudaGetErrorString(ie));
    }
    cb->graphs_captured++;
    return 0;
}

int cu_forward_sample(kd_backend *b, const kd_batch *batch, const kd_sample_params *params, const double *uniforms,
                      int32_t *tokens, int32_t *accepted, int32_t *used, kd_err *err) {
    cu_backend *cb = SELF(b);
    if (kd_batch_tokens(batch) == 0) return 0;
    CU(cudaSetDevice(cb->dev));
    int Tp = 0, need = 0, Np = 0;
    const int R = graph_rows(cb, batch, &Tp, &need, &Np);
    if (before_forward(cb, batch, R, err)) return -1;
    graph_entry *g = NULL, *cover = NULL;
    if (R > 0) {
        g = graph_slot(cb, R, Tp, Np);
        if (!g->exec && g->seen < kCaptureCovered) // a captured shape of more tokens, if any, instead of eager
            for (int i = 0; i < kMaxGraphs; i++) {
                graph_entry *c = &cb->graph[i];
                if (c != g && c->exec && c->rows == R && c->window == Tp && c->tokens >= need &&
                    (!cover || c->tokens < cover->tokens))
                    cover = c;
            }
    }
    const fwd_shape sh = encode(cb, batch, params, uniforms, R, Tp, cover ? cover->tokens : Np);
    if (cover) {
        cover->used = cb->graph_clock;
        g->seen++;
        g = cover;
    }
    if (g && !g->exec && g->seen >= 1 && capture(cb, g, sh, err)) return -1; // on the second sight of a shape
    if (g && g->exec) {
        CU(cudaGraphLaunch(g->exec, cb->stream));
        cb->graph_replays++;
    } else {
        if (launch(cb, sh, err)) return -1;
        if (g) g->seen++;
    }
    CU(cudaStreamSynchronize(cb->stream)); // the one wait of a step: the tokens
    CU(cudaGetLastError());
    after_forward(cb, batch, R);
    unpack_samples(cb, batch->n_rows, tokens, accepted, used);
    return 0;
}

// -------------------------------------------------------------------------- commit

int cu_commit(kd_backend *b, int32_t slot, int32_t n, int32_t snap_at, void *snap_dst, kd_err *err) {
    cu_backend *cb = SELF(b);
    const kd_config *c = &b->config;
    const meta_layout *ml = &cb->ml;
    const int64_t ssm = b->layout.ssm_elems, conv = b->layout.conv_elems, layer = b->layout.layer_elems;
    cudaStream_t s = cb->stream;
    CU(cudaSetDevice(cb->dev));
    if (conv_sync(cb, slot, true, err)) return -1;
    unsigned char *hm = (unsigned char *)cb->pinned_meta;
    kd_kda_row *crows = (kd_kda_row *)(hm + ml->crows);
    /* the recurrence folds the tokens the slot holds (lazy checkpoint) before the window's; the conv
     * ring (below) knows only the window */
    const int32_t held = kda_mode(cb) == KD_KDA_DEFERRED ? cb->held[slot] : 0;
    for (int32_t l = 0; l < c->n_layers; l++) {
        memset(&crows[l], 0, sizeof crows[l]);
        crows[l].slot = slot, crows[l].len = held + n, crows[l].snap_at = snap_at > 0 ? held + snap_at : 0;
        crows[l].kg_read = cb->kg_read[slot];
        crows[l].snap = snap_at > 0 ? cb->snap + (size_t)l * layer : NULL;
    }
    CU(cudaMemcpyAsync(cb->meta_dev + ml->crows, hm + ml->crows, ml->total - ml->crows, cudaMemcpyHostToDevice, s));
    const kd_kda_row *d_crows = (const kd_kda_row *)(cb->meta_dev + ml->crows);
    const kd_kda_mode kmode = kda_mode(cb);
    for (int32_t l = 0; l < c->n_layers && held + n > 0; l++) {
        kd_kda_args a = layer_args(cb, l);
        a.n_rows = 1, a.rows = d_crows + l;
        KDA(kd_kda_commit(&a, kmode, s));
    }
    /* the conv: the ring's position advances by n (below); the snapshot's windows those at snap_at */
    if (snap_at > 0 && conv && cb->lhist > 0)
        KDA(kd_cu_conv_window(0, (int)c->n_layers, cb->C, (int)cb->W, cb->hist, cb->lhist, cb->R, slot,
                              (int32_t)((cb->conv_head[slot] + (int64_t)snap_at) % cb->R), cb->snap + ssm, layer, s));
    if (snap_at > 0)
        CU(cudaMemcpyAsync(snap_dst, cb->snap, (size_t)b->layout.slot_elems * 4, cudaMemcpyDeviceToHost, s));
    CU(cudaStreamSynchronize(s));
    CU(cudaGetLastError());
    cb->conv_head[slot] = (int32_t)((cb->conv_head[slot] + (int64_t)n) % cb->R);
    cb->conv_sync[slot] = CONV_RING;
    cb->held[slot] = 0;
    return 0;
}

kd_backend_ops make_ops() {
    kd_backend_ops o;
    memset(&o, 0, sizeof o);
    o.name = "cuda";
    o.destroy = cu_destroy;
    o.load = cu_load;
    o.reserve = cu_reserve;
    o.reset_slot = cu_reset_slot;
    o.forward = cu_forward;
    o.state_read = cu_state_read;
    o.state_write = cu_state_write;
    o.state_copy = cu_state_copy;
    o.state_write_part = cu_state_write_part;
    o.state_hash = cu_state_hash;
    o.commit = cu_commit;
    o.synchronize = cu_synchronize;
    o.forward_sample = cu_forward_sample;
    o.state_regions = cu_state_regions;
    return o;
}

const kd_backend_ops cuda_ops = make_ops();

} // namespace

extern "C" kd_backend *kd_cuda_backend_create(int act_bf16, kd_err *err) {
    if (kd_cuda_device_count() == 0) {
        kd_fail(err, "cuda backend: no usable CUDA device (no GPU, or no driver)");
        return NULL;
    }
    cu_backend *cb = (cu_backend *)calloc(1, sizeof *cb);
    if (!cb) {
        kd_fail(err, "cuda backend: out of host memory");
        return NULL;
    }
    cb->base.ops = &cuda_ops;
    cb->base.state_dtype = KD_F32;
    cb->bf16 = act_bf16 ? 1 : 0;
    cb->wsz = cb->bf16 ? 2 : 4;
    cb->dev = 0;
    const char *graphs_env = getenv("KDECODE_CUDA_GRAPHS");
    cb->graphs = !(graphs_env && !strcmp(graphs_env, "0"));
    cb->lazy = kLazyDefault;
    if (const char *lazy_env = getenv("KDECODE_CUDA_LAZY")) {
        char *end = NULL;
        const long f = strtol(lazy_env, &end, 10);
        if (end == lazy_env || *end || f < 1 || f > kMaxRecords) {
            kd_fail(err, "cuda backend: KDECODE_CUDA_LAZY=%s: not a factor in 1..%d", lazy_env, kMaxRecords);
            free(cb);
            return NULL;
        }
        cb->lazy = (int32_t)f;
    }
    cb->skinny = 1;
    cb->pair = 1;
    cb->swiglu = 1;
    cb->gnorm_early = 1;
    cb->ks_nb = kKsplitNb, cb->ks_lo = kKsplitLo, cb->ks_hi = kKsplitHi;
    /* gate|up in bf16: 0.1-0.8 % faster 48B steps at 32-512 rows on an H200 (alternated rounds,
     * tests/bench/results/logs/gu16_h200.log) */
    cb->gu16 = 1;
    cb->fuse = KD_CUDA_FUSE_DEFAULT;
    cb->side_rows = kSideRows;
    const char *what = NULL;
    cudaError_t e = cudaSetDevice(cb->dev);
    if (e != cudaSuccess) what = "cudaSetDevice";
    if (!what && (e = cudaStreamCreateWithFlags(&cb->stream, cudaStreamNonBlocking)) != cudaSuccess)
        what = "cudaStreamCreateWithFlags";
    if (!what && (e = cudaStreamCreateWithFlags(&cb->side, cudaStreamNonBlocking)) != cudaSuccess)
        what = "cudaStreamCreateWithFlags (prefetch)";
    if (!what && ((e = cudaEventCreateWithFlags(&cb->ev_fork, cudaEventDisableTiming)) != cudaSuccess ||
                  (e = cudaEventCreateWithFlags(&cb->ev_join, cudaEventDisableTiming)) != cudaSuccess ||
                  (e = cudaEventCreateWithFlags(&cb->ev_f, cudaEventDisableTiming)) != cudaSuccess ||
                  (e = cudaEventCreateWithFlags(&cb->ev_g, cudaEventDisableTiming)) != cudaSuccess))
        what = "cudaEventCreateWithFlags";
    int l2 = 0;
    if (!what && (e = cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, cb->dev)) != cudaSuccess)
        what = "cudaDeviceGetAttribute (L2 size)";
    cb->l2_bytes = l2;
    cb->pf_rows = 4, cb->pf_mode = 4, cb->pf_gu_first = 1, cb->pf_blocks = 16; /* above */
    cb->pf_bytes = default_prefetch_bytes(cb, cb->pf_mode);
    cb->pf_mlp_bytes = (cb->l2_bytes / 10) & ~(int64_t)15; /* above */
    if (!what && ((e = cudaMalloc(&cb->blas_ws, kBlasWorkspace)) != cudaSuccess ||
                  (e = cudaMalloc(&cb->blas_ws_side, kBlasWorkspace)) != cudaSuccess))
        what = "cudaMalloc (cuBLAS workspace)";
    if (what) {
        kd_fail(err, "cuda backend: %s: %s", what, cudaGetErrorString(e));
        cu_destroy(&cb->base);
        return NULL;
    }
    cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
    const char *bwhat = "cublasCreate";
    for (int i = 0; i < 2 && st == CUBLAS_STATUS_SUCCESS; i++) { /* the step's stream's handle, the side stream's */
        cublasHandle_t *h = i ? &cb->blas_side : &cb->blas;
        st = cublasCreate(h), bwhat = "cublasCreate";
        if (st == CUBLAS_STATUS_SUCCESS)
            st = cublasSetStream(*h, i ? cb->side : cb->stream), bwhat = "cublasSetStream";
        if (st == CUBLAS_STATUS_SUCCESS)
            st = cublasSetWorkspace(*h, i ? cb->blas_ws_side : cb->blas_ws, kBlasWorkspace),
            bwhat = "cublasSetWorkspace";
        // fp32 mode is the reference: no TF32 (the default math mode, stated explicitly)
        if (st == CUBLAS_STATUS_SUCCESS) st = cublasSetMathMode(*h, CUBLAS_DEFAULT_MATH), bwhat = "cublasSetMathMode";
    }
    if (st != CUBLAS_STATUS_SUCCESS) {
        kd_fail(err, "cuda backend: %s: %s", bwhat, cublasGetStatusString(st));
        cu_destroy(&cb->base);
        return NULL;
    }
    if (cb->bf16 && (e = kd_cu_lt_create(&cb->lt)) != cudaSuccess) {
        kd_fail(err, "cuda backend: cuBLASLt: %s", cudaGetErrorString(e));
        cu_destroy(&cb->base);
        return NULL;
    }
    /* an operator's table of cuBLASLt configurations (kd/lt_table.h): read, and refused with
     * its error, whether or not the bf16 products use it, so a bad file never goes unnoticed */
    if (const char *tf = getenv("KDECODE_CUDA_LT_TABLE"); tf && *tf) {
        kd_lt_entry *tab = NULL;
        kd_err te = {{0}};
        const int n = kd_lt_table_load(tf, &tab, &te);
        if (n >= 0 && cb->lt) e = kd_cu_lt_use_table(cb->lt, tab, n);
        free(tab);
        if (n < 0 || (cb->lt && e != cudaSuccess)) {
            if (n < 0)
                kd_fail(err, "cuda backend: KDECODE_CUDA_LT_TABLE: %s", te.msg);
            else
                kd_fail(err, "cuda backend: KDECODE_CUDA_LT_TABLE: %s", cudaGetErrorString(e));
            cu_destroy(&cb->base);
            return NULL;
        }
    }
    cb->lt_mode = 2;
    return &cb->base;
}

namespace {
cu_backend *as_cuda(kd_backend *b) { return b && b->ops == &cuda_ops ? (cu_backend *)b : nullptr; }
} // namespace

extern "C" int kd_cuda_set_graphs(kd_backend *b, int on) {
    cu_backend *cb = as_cuda(b);
    if (!cb) return -1;
    cb->graphs = on ? 1 : 0;
    return 0;
}

extern "C" int kd_cuda_set_lazy(kd_backend *b, int factor) {
    cu_backend *cb = as_cuda(b);
    if (!cb || b->n_slots > 0 || factor < 1 || factor > kMaxRecords) return -1;
    const int old = cb->lazy;
    cb->lazy = factor;
    return old;
}

extern "C" int32_t kd_cuda_lazy_records(kd_backend *b) {
    cu_backend *cb = as_cuda(b);
    if (!cb || b->n_slots == 0) return -1;
    return cb->rcap > b->max_window ? cb->rcap : 0;
}

extern "C" int32_t kd_cuda_held(kd_backend *b, int32_t slot) {
    cu_backend *cb = as_cuda(b);
    if (!cb || !cb->held || slot < 0 || slot >= cb->slots1) return -1;
    return cb->held[slot];
}

// A setting that changes what the captured graphs hold: the backend with its graphs dropped
// (the next batches capture them again), or NULL when b is not a CUDA backend.
static cu_backend *regraph(kd_backend *b) {
    cu_backend *cb = as_cuda(b);
    if (!cb) return NULL;
    if (cb->dev >= 0) cudaSetDevice(cb->dev);
    drop_graphs(cb);
    return cb;
}

// An on / off switch of the backend that changes what the graphs hold.
static int set_switch(kd_backend *b, int cu_backend::*flag, int on) {
    cu_backend *cb = regraph(b);
    if (!cb) return -1;
    cb->*flag = on ? 1 : 0;
    return 0;
}

extern "C" int kd_cuda_set_pdl(kd_backend *b, int on) {
    if (!regraph(b)) return -1;
    kd_kda_pdl(on ? 1 : 0);
    return 0;
}

extern "C" int kd_cuda_set_pair(kd_backend *b, int on) { return set_switch(b, &cu_backend::pair, on); }

extern "C" int kd_cuda_set_swiglu(kd_backend *b, int on) { return set_switch(b, &cu_backend::swiglu, on); }
extern "C" int kd_cuda_set_gnorm_early(kd_backend *b, int on) {
    return set_switch(b, &cu_backend::gnorm_early, on);
}

extern "C" int kd_cuda_set_gu_bf16(kd_backend *b, int on) { return set_switch(b, &cu_backend::gu16, on); }

extern "C" int kd_cuda_set_ksplit(kd_backend *b, int slices, int64_t min_rows, int64_t max_rows) {
    if (slices < 1 || slices > KD_KSPLIT_MAX || min_rows < 1 || max_rows < min_rows) return -1;
    cu_backend *cb = regraph(b);
    if (!cb) return -1;
    cb->ks_nb = slices, cb->ks_lo = min_rows, cb->ks_hi = max_rows;
    return 0;
}

extern "C" int kd_cuda_set_skinny(kd_backend *b, int on) { return set_switch(b, &cu_backend::skinny, on); }

extern "C" int kd_cuda_set_skinny_rows_form(kd_backend *b, int form) {
    if (form < -1 || form > KD_SKINNY_FORMS) return -1;
    cu_backend *cb = regraph(b);
    if (!cb) return -1;
    cb->rows_form = form;
    return 0;
}


extern "C" int kd_cuda_set_lt(kd_backend *b, int mode) {
    if (mode < 0 || mode > 2) return -1;
    cu_backend *cb = regraph(b);
    if (!cb) return -1;
    cb->lt_mode = mode;
    kd_cu_lt_set_table(cb->lt, mode == 2);
    return 0;
}

extern "C" int kd_cuda_set_fuse(kd_backend *b, int mask) {
    if (mask < 0 || mask > KD_CUDA_FUSE_ALL) return -1;
    cu_backend *cb = regraph(b);
    if (!cb) return -1;
    cb->fuse = mask;
    return 0;
}

extern "C" int kd_cuda_set_side_rows(kd_backend *b, int rows) {
    cu_backend *cb = regraph(b);
    if (!cb || rows < 0) return -1;
    cb->side_rows = rows;
    return 0;
}

extern "C" int kd_cuda_set_conv_prep(kd_backend *b, int always) {
    return set_switch(b, &cu_backend::conv_prep, always);
}

extern "C" int kd_cuda_set_skip(kd_backend *b, unsigned kernels) {
    cu_backend *cb = regraph(b);
    if (!cb) return -1;
    cb->skip = kernels;
    return 0;
}

extern "C" int kd_cuda_set_prefetch(kd_backend *b, int64_t bytes, int max_rows, int mode) {
    if (mode < 1 || mode > 4) return -1;
    cu_backend *cb = regraph(b);
    if (!cb) return -1;
    cb->pf_bytes = bytes < 0 ? default_prefetch_bytes(cb, mode) : bytes, cb->pf_rows = max_rows, cb->pf_mode = mode;
    return 0;
}

extern "C" int kd_cuda_set_prefetch_mlp(kd_backend *b, int64_t bytes) {
    if (bytes < 0) return -1;
    cu_backend *cb = regraph(b);
    if (!cb) return -1;
    cb->pf_mlp_bytes = bytes;
    return 0;
}

extern "C" int kd_cuda_set_prefetch_blocks(kd_backend *b, int blocks) {
    if (blocks < 1 || blocks > 1024) return -1;
    cu_backend *cb = regraph(b);
    if (!cb) return -1;
    cb->pf_blocks = blocks;
    return 0;
}

extern "C" int kd_cuda_set_prefetch_order(kd_backend *b, int gate_up_first) {
    return set_switch(b, &cu_backend::pf_gu_first, gate_up_first);
}

extern "C" int64_t kd_cuda_ksplit_launches(kd_backend *b) {
    cu_backend *cb = as_cuda(b);
    return cb ? cb->ks_launches : -1;
}

extern "C" int64_t kd_cuda_pair_batched(kd_backend *b) {
    cu_backend *cb = as_cuda(b);
    return cb ? cb->pair_batched : -1;
}

extern "C" void kd_cuda_graph_stats(kd_backend *b, int64_t *captured, int64_t *replays) {
    cu_backend *cb = as_cuda(b);
    *captured = cb ? cb->graphs_captured : 0;
    *replays = cb ? cb->graph_replays : 0;
}

// The launch shape of a decode step's graph (encode's padded layout): R verify rows, N tokens,
// windows up to T, every token a logit row, sampled on the device.
static fwd_shape decode_shape(int R, int T, int N) {
    fwd_shape sh;
    memset(&sh, 0, sizeof sh);
    sh.N = N, sh.M = N, sh.nv = R, sh.max_len = T, sh.n_rows = R, sh.sample = 1;
    return sh;
}

extern "C" int kd_cuda_warm_graphs(kd_backend *b, int32_t rows, int32_t max_graphs, kd_err *err) {
    cu_backend *cb = as_cuda(b);
    if (!cb) return 0;
    if (b->n_slots == 0) return kd_fail(err, "kd_cuda_warm_graphs: no slots reserved");
    if (rows < 1 || max_graphs < 0)
        return kd_fail(err, "kd_cuda_warm_graphs: rows %d, graphs %d out of range", rows, max_graphs);
    if (!cb->graphs) return 0;
    if (rows > b->max_rows) rows = b->max_rows;
    if (max_graphs > kMaxGraphs) max_graphs = kMaxGraphs;
    CU(cudaSetDevice(cb->dev));
    int shapes = 0, captured = 0;
    /* pass 0: each (rows, longest window)'s shape of every token, which covers all its steps;
     * pass 1: the shapes of fewer tokens (graph_rows) */
    for (int pass = 0; pass < 2; pass++)
        for (int n = 1, R; n <= rows; n = R + 1) {
            R = graph_pad_rows(b, n);
            for (int T = 1; T <= b->max_window && (int64_t)R * T <= b->max_tokens; T++) {
                const int full = R * T;
                int last = 0;
                for (int64_t need = pass ? R + T - 1 : full; need <= full; need++) {
                    const int N = graph_tokens(R, T, need);
                    if (N == last || (pass == 1 && N == full)) continue;
                    last = N;
                    if (shapes++ == max_graphs) goto done;
                    graph_entry *g = graph_slot(cb, R, T, N);
                    if (g->exec) continue;
                    if (capture(cb, g, decode_shape(R, T, N), err)) return -1;
                    CU(cudaGraphUpload(g->exec, cb->stream));
                    captured++;
                }
            }
        }
done:
    CU(cudaStreamSynchronize(cb->stream));
    return captured;
}

extern "C" int kd_cuda_sample_logits(kd_backend *b, const kd_batch *batch, const float *logits,
                                     const kd_sample_params *params, const double *uniforms, int32_t *tokens,
                                     int32_t *accepted, int32_t *used, kd_err *err) {
    cu_backend *cb = as_cuda(b);
    if (!cb) return kd_fail(err, "kd_cuda_sample_logits: not a CUDA backend");
    if (b->n_slots == 0) return kd_fail(err, "kd_cuda_sample_logits: no slots reserved");
    if (kd_batch_check(batch, b->n_slots, b->max_tokens, b->max_window, b->config.vocab, err)) return -1;
    if (batch->n_rows > b->max_rows) return kd_fail(err, "kd_cuda_sample_logits: too many rows");
    CU(cudaSetDevice(cb->dev));
    const fwd_shape sh = encode(cb, batch, params, uniforms, 0, 0, 0);
    cudaStream_t s = cb->stream;
    CU(cudaMemcpyAsync(cb->meta_dev, cb->pinned_meta, cb->ml.total, cudaMemcpyHostToDevice, s));
    const kd_cu_spos *d_spos = (const kd_cu_spos *)(cb->meta_dev + cb->ml.spos);
    const kd_cu_srow *d_srows = (const kd_cu_srow *)(cb->meta_dev + cb->ml.srows);
    for (int64_t m0 = 0; m0 < sh.M; m0 += cb->lg_rows) {
        const int64_t mc = sh.M - m0 < cb->lg_rows ? sh.M - m0 : cb->lg_rows;
        CU(cudaMemcpyAsync(cb->lg, logits + (size_t)m0 * cb->vocab, (size_t)(mc * cb->vocab) * sizeof(float),
                           cudaMemcpyHostToDevice, s));
        KDA(kd_cu_sample_positions(cb->lg, (int32_t)cb->vocab, m0, mc, d_spos, cb->sres, cb->sarg, s));
    }
    KDA(kd_cu_sample_finish(d_srows, sh.n_rows, d_spos, cb->sres, b->max_window, cb->sout, s));
    CU(cudaMemcpyAsync(cb->sout_h, cb->sout, (size_t)sh.n_rows * (b->max_window + 2) * 4, cudaMemcpyDeviceToHost, s));
    CU(cudaStreamSynchronize(s));
    CU(cudaGetLastError());
    unpack_samples(cb, batch->n_rows, tokens, accepted, used);
    return 0;
}
