/* sample.c: see sample.h. */
#include "worker/sample.h"

#include <math.h>
#include <stdlib.h>

int kd_sampling_check(const kd_sampling *s, const char **why) {
    if (!(s->temperature >= 0 && s->temperature <= 1e4)) return *why = "temperature must be in [0, 1e4]", -1;
    if (s->top_k < 0) return *why = "top_k must be >= 0", -1;
    if (!(s->top_p > 0 && s->top_p <= 1)) return *why = "top_p must be in (0, 1]", -1;
    return 0;
}

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void kd_rng_seed(kd_rng *r, uint64_t seed) {
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&seed);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t kd_rng_next(kd_rng *r) { /* xoshiro256** */
    uint64_t *s = r->s;
    const uint64_t out = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return out;
}

double kd_rng_uniform(kd_rng *r) { return (double)(kd_rng_next(r) >> 11) * 0x1.0p-53; }

int32_t kd_argmax(const float *logits, int32_t vocab) {
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

void kd_sample_probs(const float *logits, int32_t vocab, const kd_sampling *s, double *probs,
                     int32_t *order) {
    for (int32_t i = 0; i < vocab; i++) probs[i] = 0;
    if (s->temperature == 0) {
        probs[kd_argmax(logits, vocab)] = 1;
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

int32_t kd_sample_from(const double *probs, int32_t vocab, double u) {
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

int32_t kd_sample(const float *logits, int32_t vocab, const kd_sampling *s, kd_rng *rng,
                  double *probs, int32_t *order) {
    if (s->temperature == 0) return kd_argmax(logits, vocab);
    kd_sample_probs(logits, vocab, s, probs, order);
    return kd_sample_from(probs, vocab, kd_rng_uniform(rng));
}
