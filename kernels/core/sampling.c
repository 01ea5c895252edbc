/* sampling.c: see kd/sampling.h. The reference: plain loops in double, a sort for top-k /
 * top-p (the CUDA backend selects the same set by radix selection, cuda/sample.cu). */
#include "kd/sampling.h"

#include <math.h>
#include <stdlib.h>

int32_t kd_logits_argmax(const float *logits, int32_t vocab) {
    int32_t best = 0;
    for (int32_t i = 1; i < vocab; i++)
        if (logits[i] > logits[best] || (logits[best] != logits[best] && logits[i] == logits[i]))
            best = i;
    return best;
}

static _Thread_local const float *sort_logits; /* qsort has no context argument */
static int by_logit_desc(const void *a, const void *b) {
    int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    float x = sort_logits[i], y = sort_logits[j];
    if (x > y) return -1;
    if (x < y) return 1;
    return (i > j) - (i < j);
}

void kd_logits_probs(const float *logits, int32_t vocab, const kd_sample_params *s, double *probs,
                     int32_t *order) {
    for (int32_t i = 0; i < vocab; i++) probs[i] = 0;
    if (s->temperature == 0) {
        probs[kd_logits_argmax(logits, vocab)] = 1;
        return;
    }
    int32_t n = vocab;
    for (int32_t i = 0; i < vocab; i++) order[i] = i;
    sort_logits = logits;
    qsort(order, (size_t)vocab, sizeof *order, by_logit_desc);
    if (s->top_k > 0 && s->top_k < n) n = s->top_k;
    const double mx = logits[order[0]];
    double z = 0;
    for (int32_t i = 0; i < n; i++) {
        double l = logits[order[i]];
        double p = l == l ? exp((l - mx) / s->temperature) : 0;
        probs[order[i]] = p;
        z += p;
    }
    if (s->top_p < 1) { /* the smallest prefix (in logit order) whose mass reaches top_p */
        double acc = 0;
        int32_t keep = n;
        for (int32_t i = 0; i < n; i++) {
            acc += probs[order[i]] / z;
            if (acc >= s->top_p) {
                keep = i + 1;
                break;
            }
        }
        for (int32_t i = keep; i < n; i++) z -= probs[order[i]], probs[order[i]] = 0;
        n = keep;
    }
    for (int32_t i = 0; i < n; i++) probs[order[i]] /= z;
}

int32_t kd_probs_draw(const double *probs, int32_t vocab, double u) {
    double acc = 0;
    int32_t last = -1;
    for (int32_t i = 0; i < vocab; i++) {
        if (probs[i] <= 0) continue;
        acc += probs[i];
        last = i;
        if (u < acc) return i;
    }
    return last < 0 ? 0 : last; /* rounding: u beyond the summed mass */
}

int32_t kd_accept_window(const float *logits, int32_t vocab, const int32_t *drafts, int32_t n_draft,
                         const kd_sample_params *s, const double *u, int32_t *used, double *probs,
                         int32_t *order, int32_t *out) {
    int32_t nu = 0;
    if (used) *used = 0;
    if (vocab <= 0) { /* nothing to score: no token exists; emit 0 and accept nothing */
        out[0] = 0;
        return 0;
    }
    if (n_draft < 0 || !drafts) n_draft = 0;
    if (s->temperature == 0) { /* greedy: invalid draft ids never equal an argmax */
        for (int32_t i = 0;; i++) {
            int32_t t = kd_logits_argmax(logits + (int64_t)i * vocab, vocab);
            if (i == n_draft || drafts[i] != t) {
                out[i] = t;
                return i;
            }
            out[i] = t;
        }
    }
    for (int32_t i = 0; i < n_draft; i++) {
        kd_logits_probs(logits + (int64_t)i * vocab, vocab, s, probs, order);
        int32_t d = drafts[i];
        if (d >= 0 && d < vocab) { /* an id outside the vocabulary is rejected without a draw */
            if (u[nu++] < probs[d]) {
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
        out[i] = kd_probs_draw(probs, vocab, u[nu++]);
        if (used) *used = nu;
        return i;
    }
    kd_logits_probs(logits + (int64_t)n_draft * vocab, vocab, s, probs, order);
    out[n_draft] = kd_probs_draw(probs, vocab, u[nu++]);
    if (used) *used = nu;
    return n_draft;
}
