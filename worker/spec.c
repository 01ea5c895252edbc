/* spec.c: see spec.h. */
#include "worker/spec.h"

#include <stdlib.h>

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

/* The window's logic is the kernels' reference (kd_accept_window, which backends reproduce
 * on the device); here the uniforms come from the request's generator: n_draft + 1 of them
 * are drawn from a copy, and the generator advances by as many as the window used, so the
 * stream of draws is exactly what drawing one at a time would give. */
int32_t kd_spec_accept(const float *logits, int32_t vocab, const int32_t *drafts, int32_t n_draft,
                       const kd_sampling *s, kd_rng *rng, double *probs, int32_t *order,
                       int32_t *out) {
    if (n_draft < 0 || !drafts) n_draft = 0;
    const kd_sample_params p = {.temperature = s->temperature, .top_p = s->top_p, .top_k = s->top_k};
    double local[64] = {0}, *u = local;
    int32_t nu = s->temperature == 0 ? 0 : n_draft + 1;
    if (nu > 64 && !(u = malloc((size_t)nu * sizeof *u))) { /* longer than any engine window */
        u = local;             /* out of memory: judge the first 63 drafts only */
        n_draft = 63, nu = 64;
    }
    kd_rng peek = *rng;
    for (int32_t i = 0; i < nu; i++) u[i] = kd_rng_uniform(&peek);
    int32_t used = 0;
    const int32_t a = kd_accept_window(logits, vocab, drafts, n_draft, &p, u, &used, probs, order, out);
    for (int32_t i = 0; i < used; i++) kd_rng_uniform(rng);
    if (u != local) free(u);
    return a;
}
