// sample.cuh: logits processing, sampling and the acceptance of speculative windows on the
// device (the CUDA side of forward_sample, kd/backend.h), reproducing the host reference
// kd/sampling.h: greedy argmax; temperature, top-k and top-p; rejection sampling of drafts.
// The host supplies the uniforms, so both make the same choices from the same seeds.
//
// Two launches (three: kd_cu_sample_positions first takes each row's argmax in slices, a block
// each: up to KD_CU_ARG_SLICES a row, fewer the more rows a launch has).
// kd_cu_sample_positions: one block per logit row (a window position) decides that position alone: greedy: the argmax and whether the draft after it equals it;
// sampled: whether the draft is accepted (u_acc < p(draft)) and the token drawn otherwise
// (from p without the draft, renormalised; at the last position of a window, the bonus
// token from p). kd_cu_sample_finish: one thread per batch row walks its positions: the
// first rejected one ends the window. Only the finish's small result leaves the device.
#ifndef KD_CUDA_SAMPLE_CUH
#define KD_CUDA_SAMPLE_CUH

#include <cuda_runtime.h>
#include <stdint.h>

// One logit row to decide (a window position).
typedef struct kd_cu_spos {
    int32_t row;        // batch row; -1: nothing to do (padding)
    int32_t draft;      // the draft after this position, -1: the window's last position
    int32_t top_k;      // 0: off
    int32_t greedy;     // temperature 0
    double temperature, top_p;
    double u_acc, u_draw; // the uniforms of the acceptance test and of the draw
} kd_cu_spos;

// One batch row's window: logit rows [first, first + n_draft] (first < 0: no logits).
typedef struct kd_cu_srow {
    int32_t first, n_draft, greedy, pad;
} kd_cu_srow;

// A position's decision.
typedef struct kd_cu_sres {
    int32_t tok, acc;
} kd_cu_sres;

// The argmax of one slice of a logit row (work space of kd_cu_sample_positions).
typedef struct kd_cu_argpart {
    float v;
    int32_t i;
} kd_cu_argpart;
// The most slices of a row whose argmaxes a first launch takes in parallel (one block each), so
// that a row's argmax is not one block reading the whole vocabulary (B = 1: 163840 logits); a
// launch of many rows takes fewer (sample.cu, arg_slices).
#define KD_CU_ARG_SLICES 32

// Decides logit rows m0 .. m0 + n - 1 (spos indices) from logits [n][vocab] (row i of the
// buffer is logit row m0 + i). res: [logit rows]; part: work space of n * KD_CU_ARG_SLICES.
cudaError_t kd_cu_sample_positions(const float *logits, int32_t vocab, int64_t m0, int64_t n,
                                   const kd_cu_spos *pos, kd_cu_sres *res, kd_cu_argpart *part, cudaStream_t s);

// out: [n_rows][Tw + 2]: the row's tokens (accepted drafts, then the new token), then the
// accepted count and the uniforms used.
cudaError_t kd_cu_sample_finish(const kd_cu_srow *rows, int n_rows, const kd_cu_spos *pos,
                                const kd_cu_sres *res, int Tw, int32_t *out, cudaStream_t s);

#endif
