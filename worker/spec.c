/* spec.c: see spec.h. */
#include "worker/spec.h"

#include <stdlib.h>
#include <string.h>
#define XXH_INLINE_ALL /* the n-grams are a few bytes: inlined, a call into the library costs more than the hash */
#include <xxhash.h>

/* The best end so far (e, its match length) of a proposal's search. */
typedef struct best {
    int64_t e;
    int32_t len;
} best;

/* Judges end e: its match length with the suffix, capped at n_max; kept if longer than the best
 * so far (so among equals the first judged, the latest when ends come latest first). Returns 1
 * when the length reached n_max (no later end can do better). */
static int judge(const int32_t *hist, int64_t n_hist, int64_t e, int32_t n_max, best *b) {
    const int32_t *suf_end = hist + n_hist; /* the suffix ends here */
    const int64_t cap = e < n_max ? e : n_max;
    int32_t len = 0;
    while (len < cap && hist[e - 1 - len] == suf_end[-1 - len]) len++;
    if (len <= b->len) return 0;
    b->len = len, b->e = e;
    return len == n_max;
}

/* The tokens that followed the best end, up to max_draft; how many. */
static int32_t proposal(const int32_t *hist, int64_t n_hist, const best *b, int32_t max_draft, int32_t *out) {
    if (b->e < 0) return 0;
    const int64_t avail = n_hist - b->e; /* >= 1 */
    const int32_t n = avail < max_draft ? (int32_t)avail : max_draft;
    for (int32_t i = 0; i < n; i++) out[i] = hist[b->e + i];
    return n;
}

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
    best b = {-1, n_min - 1};
    for (int64_t e = n_hist - 1; e >= n_min; e--)
        if (judge(hist, n_hist, e, n_max, &b)) break;
    return proposal(hist, n_hist, &b, max_draft, out);
}

/* The n tokens before e, hashed (XXH3-64 of their bytes; the chains only need equal n-grams in
 * one bucket, so the byte order does not matter). */
static uint64_t gram_hash(const int32_t *hist, int64_t e, int32_t n) {
    return XXH3_64bits(hist + e - n, (size_t)n * sizeof *hist);
}

int kd_ngram_index_init(kd_ngram_index *ix, int64_t cap, int32_t n_min, int32_t n_max) {
    memset(ix, 0, sizeof *ix);
    if (cap < 1 || cap > ((int64_t)1 << 30) || n_min < 1 || n_max < n_min || n_max > 64) return -1;
    const int32_t levels = n_max - n_min + 1 < KD_NGRAM_LEVELS ? n_max - n_min + 1 : KD_NGRAM_LEVELS;
    uint32_t buckets = 64;
    while (buckets < (uint64_t)cap) buckets *= 2;
    int32_t *mem = malloc((size_t)levels * ((size_t)buckets + (size_t)cap) * sizeof *mem);
    if (!mem) return -1;
    memset(mem, 0xff, (size_t)levels * buckets * sizeof *mem); /* every head -1 */
    for (int32_t i = 0; i < levels; i++)
        ix->head[i] = mem + (size_t)i * buckets, ix->prev[i] = mem + (size_t)levels * buckets + (size_t)i * cap;
    ix->mask = buckets - 1, ix->cap = cap, ix->n_min = n_min, ix->n_top = n_min + levels - 1, ix->next = n_min;
    return 0;
}

void kd_ngram_index_free(kd_ngram_index *ix) {
    free(ix->head[0]); /* the one block (init) */
    memset(ix, 0, sizeof *ix);
}

int32_t kd_ngram_index_propose(kd_ngram_index *ix, const int32_t *hist, int64_t n_hist, int32_t n_max,
                               int32_t max_draft, int32_t *out) {
    const int32_t n_min = ix->n_min;
    if (!ix->head[0] || !hist || !out || n_hist < 2 || n_hist > ix->cap || max_draft <= 0 || n_max < n_min) return 0;
    for (; ix->next <= n_hist - 1; ix->next++) { /* chain the ends this history adds, at each length up to e */
        const int64_t e = ix->next;
        for (int32_t L = n_min; L <= ix->n_top && L <= e; L++) {
            const int32_t i = L - n_min;
            const uint32_t b = (uint32_t)(gram_hash(hist, e, L) & ix->mask);
            ix->prev[i][e] = ix->head[i][b], ix->head[i][b] = (int32_t)e;
        }
    }
    const int32_t top = n_max < ix->n_top ? n_max : ix->n_top;
    for (int32_t L = top; L >= n_min; L--) {
        if (n_hist - 1 < L) continue; /* no end in [L, n_hist - 1] */
        const int32_t i = L - n_min;
        best b = {-1, L - 1};
        /* the scan's judgement on the chain's ends, latest first; an end off the chain matches fewer
         * than L tokens. At the top every end is judged (unless one reaches n_max); below it no end
         * matches more than L (the chain above had none), so the first that matches L is the answer */
        for (int64_t e = ix->head[i][(uint32_t)(gram_hash(hist, n_hist, L) & ix->mask)]; e >= 0; e = ix->prev[i][e])
            if (e <= n_hist - 1 && (judge(hist, n_hist, e, n_max, &b) || (L < top && b.e >= 0)))
                break; /* (an end past n_hist - 1: a longer history's) */
        if (b.e >= 0) return proposal(hist, n_hist, &b, max_draft, out);
    }
    return 0;
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
