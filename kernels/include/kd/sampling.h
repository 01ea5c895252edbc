/* kd/sampling.h: logits processing, sampling and the acceptance of a speculative window,
 * the reference that every backend's forward_sample reproduces (kd/backend.h). Randomness
 * comes in as uniform numbers drawn by the caller, so two backends given the same uniforms
 * make the same choices (up to ties within float rounding; see forward_sample).
 *
 * The distribution of one position: softmax(logits / temperature) restricted to the top_k
 * largest logits and then to the smallest prefix (in the order of descending logit, lower
 * index first among equal logits) whose mass reaches top_p, renormalised. Draws walk the
 * distribution in index order: the first token whose cumulative mass exceeds u. Greedy
 * (temperature 0) is the argmax, the lowest index among equal maxima (NaN never wins). */
#ifndef KD_SAMPLING_H
#define KD_SAMPLING_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kd_sample_params {
    double temperature; /* 0: greedy; else in (0, 1e4] */
    double top_p;       /* (0, 1]; 1: off */
    int32_t top_k;      /* 0: off */
    int32_t reserved;   /* 0 */
} kd_sample_params;

/* Lowest index of the largest logit (NaN never wins). */
int32_t kd_logits_argmax(const float *logits, int32_t vocab);

/* probs[vocab] = the distribution sampling draws from (see above); greedy puts all mass on
 * the argmax. order: work space of vocab int32. */
void kd_logits_probs(const float *logits, int32_t vocab, const kd_sample_params *p, double *probs,
                     int32_t *order);

/* Draws from probs with u in [0, 1): the first index (ascending) whose cumulative mass
 * exceeds u; past the summed mass (rounding), the last index with mass (0 if none). */
int32_t kd_probs_draw(const double *probs, int32_t vocab, double u);

/* Acceptance of one verify window. logits: [1 + n_draft][vocab], position i scores the
 * token after window token i (window = x0, d_1..d_n). Greedy: accept d_i while it equals the
 * argmax at position i-1; emit the argmax at the first mismatch (or after the last draft).
 * Sampled: accept d_i when the next uniform is below p_{i-1}(d_i); on rejection draw (next
 * uniform) from p_{i-1} with d_i removed and renormalised; if all are accepted draw the
 * bonus token from p_n (next uniform). A draft id outside the vocabulary is rejected
 * without a uniform. Uniforms are taken from u in order; at most n_draft + 1 are read;
 * *used (may be NULL) says how many. Writes out[0..a] (a accepted drafts, then the new
 * token) and returns a. probs, order: work space of vocab entries. */
int32_t kd_accept_window(const float *logits, int32_t vocab, const int32_t *drafts, int32_t n_draft,
                         const kd_sample_params *p, const double *u, int32_t *used, double *probs,
                         int32_t *order, int32_t *out);

#ifdef __cplusplus
}
#endif
#endif
