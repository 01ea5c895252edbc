/* sample.c: see sample.h. The distribution and the draws are the kernels' reference
 * (kd/sampling.h); this file adds the per-request generator. */
#include "worker/sample.h"


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

static kd_sample_params params_of(const kd_sampling *s) {
    kd_sample_params p = {.temperature = s->temperature, .top_p = s->top_p, .top_k = s->top_k};
    return p;
}

int32_t kd_argmax(const float *logits, int32_t vocab) { return kd_logits_argmax(logits, vocab); }

void kd_sample_probs(const float *logits, int32_t vocab, const kd_sampling *s, double *probs,
                     int32_t *order) {
    const kd_sample_params p = params_of(s);
    kd_logits_probs(logits, vocab, &p, probs, order);
}

int32_t kd_sample_from(const double *probs, int32_t vocab, double u) {
    return kd_probs_draw(probs, vocab, u);
}

int32_t kd_sample(const float *logits, int32_t vocab, const kd_sampling *s, kd_rng *rng,
                  double *probs, int32_t *order) {
    if (s->temperature == 0) return kd_argmax(logits, vocab);
    kd_sample_probs(logits, vocab, s, probs, order);
    return kd_sample_from(probs, vocab, kd_rng_uniform(rng));
}
