/* spec.h: speculative decoding pieces that do not touch model state: the n-gram
 * (prompt-lookup) proposer and the acceptance of a verify window (KDA.md §3). */
#ifndef KD_SPEC_H
#define KD_SPEC_H

#include <stdint.h>

#include "worker/sample.h"

/* Prompt lookup: for n from n_max down to n_min, find the most recent earlier occurrence of
 * the last n tokens of hist[0..n_hist) and propose up to max_draft tokens that followed it
 * (fewer if the history ends first). Returns the number proposed (0 if none matched). */
int32_t kd_ngram_propose(const int32_t *hist, int64_t n_hist, int32_t n_min, int32_t n_max,
                         int32_t max_draft, int32_t *out);

/* Acceptance of one verify window. logits: [1 + n_draft][vocab], position i scores the token
 * after window token i (window = x0, d_1..d_n). drafts: d_1..d_n (deterministic proposals).
 * Greedy (temperature 0): accept d_i while it equals the argmax at position i-1; emit the
 * argmax at the first mismatch (or after the last draft). With a temperature: accept d_i
 * with probability p_{i-1}(d_i) (p = kd_sample_probs); on rejection draw from p_{i-1} with
 * d_i removed and renormalised; if all are accepted draw the bonus token from p_n. The
 * emitted tokens then follow the target distribution exactly.
 * Writes out[0..a] (a accepted drafts, then one new token) and returns a.
 * probs, order: work space of vocab entries. */
int32_t kd_spec_accept(const float *logits, int32_t vocab, const int32_t *drafts, int32_t n_draft,
                       const kd_sampling *s, kd_rng *rng, double *probs, int32_t *order,
                       int32_t *out);

#endif
