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

/* The same proposal from an index that grows with the history, so that a step's lookup does not
 * scan it. Per n-gram length L from n_min to n_top = min(n_max, n_min + KD_NGRAM_LEVELS - 1) (both
 * fixed at init), each candidate end e (L <= e <= n_hist - 1, as kd_ngram_propose's scan) is chained
 * under a hash of the L tokens before it, latest first. A lookup walks the suffix's chain of length
 * n_top, judging each end as the scan does (every end whose match reaches n_top is on it, with ends
 * whose hash lands in the same bucket, which the judgement rejects); if none matched, the chain of
 * n_top - 1, where the first end that matches is the answer (no end matches longer), and so on down
 * to n_min. So the answer is the scan's exactly, and a walk below the top stops at its first true
 * match: the cost is the few ends of a long n-gram, not every occurrence of the last token. Sized
 * once for a history of up to cap tokens (no allocation afterwards): (n_top - n_min + 1) x (buckets +
 * cap) int32, buckets a power of two at least cap. */
#define KD_NGRAM_LEVELS 4
typedef struct kd_ngram_index {
    int32_t n_min, n_top;                /* chains for n-grams of n_min .. n_top tokens */
    uint32_t mask;                       /* buckets - 1 */
    int32_t *head[KD_NGRAM_LEVELS];      /* [buckets]: the latest e of the bucket, -1 none */
    int32_t *prev[KD_NGRAM_LEVELS];      /* [cap]: the e before it in its bucket's chain, -1 none */
    int64_t cap, next;                   /* ends below next are chained */
} kd_ngram_index;

/* 0, or -1 (out of memory, or an argument out of range: cap 1..2^30, 1 <= n_min <= n_max <= 64). */
int kd_ngram_index_init(kd_ngram_index *ix, int64_t cap, int32_t n_min, int32_t n_max);
void kd_ngram_index_free(kd_ngram_index *ix);
/* kd_ngram_propose(hist, n_hist, ix->n_min, n_max, max_draft, out), with hist the history the
 * index has seen so far extended (a history only grows: the earlier tokens never change);
 * n_hist <= cap. n_max may differ from init's (the lookup starts at min(n_max, n_top)). */
int32_t kd_ngram_index_propose(kd_ngram_index *ix, const int32_t *hist, int64_t n_hist, int32_t n_max,
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
