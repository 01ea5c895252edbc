/* spec.c: see spec.h. */
#include "worker/spec.h"

/* One backward scan over the candidate match ends e (the occurrence is hist[e-len, e), e <=
 * n_hist - 1 so it is never the suffix itself); len(e) is the common suffix length of
 * hist[0..e) and hist[0..n_hist), capped at n_max. The answer is the longest len (>= n_min),
 * latest e among equals; the scan runs from the latest e, so the first e that reaches n_max
 * ends it. O(n_hist * n_max). Arguments out of range: n_min < 1 counts as 1; an empty range
 * (n_max < n_min), max_draft <= 0 or n_hist < 2 propose nothing. */
int32_t kd_ngram_propose(const int32_t *hist, int64_t n_hist, int32_t n_min, int32_t n_max,
                         int32_t max_draft, int32_t *out) {
    if (!hist || !out || n_hist < 2 || max_draft <= 0) return 0;
    if (n_min < 1) n_min = 1;
    if (n_max < n_min) return 0;
    const int32_t *suf_end = hist + n_hist; /* the suffix ends here */
    int64_t best_e = -1;
    int32_t best_len = n_min - 1;
    for (int64_t e = n_hist - 1; e >= n_min; e--) {
        int64_t cap = e < n_max ? e : n_max;
        int32_t len = 0;
        while (len < cap && hist[e - 1 - len] == suf_end[-1 - len]) len++;
        if (len > best_len) {
            best_len = len, best_e = e;
            if (len == n_max) break;
        }
    }
    if (best_e < 0) return 0;
    int64_t avail = n_hist - best_e; /* >= 1 */
    int32_t n = avail < max_draft ? (int32_t)avail : max_draft;
    for (int32_t i = 0; i < n; i++) out[i] = hist[best_e + i];
    return n;
}

int32_t kd_spec_accept(const float *logits, int32_t vocab, const int32_t *drafts, int32_t n_draft,
                       const kd_sampling *s, kd_rng *rng, double *probs, int32_t *order,
                       int32_t *out) {
    if (vocab <= 0) { /* nothing to score: no token exists; emit 0 and accept nothing */
        out[0] = 0;
        return 0;
    }
    if (n_draft < 0 || !drafts) n_draft = 0;
    if (s->temperature == 0) { /* greedy: invalid draft ids never equal an argmax */
        for (int32_t i = 0;; i++) {
            int32_t t = kd_argmax(logits + (int64_t)i * vocab, vocab);
            if (i == n_draft || drafts[i] != t) {
                out[i] = t;
                return i;
            }
            out[i] = t;
        }
    }
    for (int32_t i = 0; i < n_draft; i++) {
        kd_sample_probs(logits + (int64_t)i * vocab, vocab, s, probs, order);
        int32_t d = drafts[i];
        if (d >= 0 && d < vocab) { /* an id outside the vocabulary is rejected without a draw */
            if (kd_rng_uniform(rng) < probs[d]) {
                out[i] = d;
                continue;
            }
            /* rejected: the residual p with d removed, renormalised */
            probs[d] = 0;
            double z = 0;
            for (int32_t j = 0; j < vocab; j++) z += probs[j];
            if (!(z > 0)) { /* p was a delta on d (cannot reject exactly); accept it */
                out[i] = d;
                continue;
            }
            for (int32_t j = 0; j < vocab; j++) probs[j] /= z;
        }
        out[i] = kd_sample_from(probs, vocab, kd_rng_uniform(rng));
        return i;
    }
    kd_sample_probs(logits + (int64_t)n_draft * vocab, vocab, s, probs, order);
    out[n_draft] = kd_sample_from(probs, vocab, kd_rng_uniform(rng));
    return n_draft;
}
