/* sample.h: turning logits into tokens. Greedy (temperature 0) or temperature / top-k /
 * top-p with a per-request seeded generator, so a seed reproduces a sequence exactly.
 * kd_sample_probs exposes the processed distribution for rejection sampling of drafts. */
#ifndef KD_SAMPLE_H
#define KD_SAMPLE_H

#include <stdint.h>

#include "kd/sampling.h"

typedef struct kd_sampling {
    double temperature; /* 0: greedy */
    int32_t top_k;      /* 0: off */
    double top_p;       /* 1: off; in (0, 1] */
    uint64_t seed;
} kd_sampling;

/* Checks ranges; returns 0 or -1 and a static message. */
int kd_sampling_check(const kd_sampling *s, const char **why);

typedef struct kd_rng {
    uint64_t s[4];
} kd_rng;

void kd_rng_seed(kd_rng *r, uint64_t seed);
uint64_t kd_rng_next(kd_rng *r);
double kd_rng_uniform(kd_rng *r); /* [0, 1), 53 bits */

/* Lowest index of the largest logit (NaN never wins). */
int32_t kd_argmax(const float *logits, int32_t vocab);

/* probs[vocab] = the distribution sampling draws from: softmax(logits / T) restricted to
 * the top-k and then the smallest top-p nucleus, renormalised. Greedy puts all mass on the
 * argmax. `order` is work space of vocab int32. */
void kd_sample_probs(const float *logits, int32_t vocab, const kd_sampling *s, double *probs,
                     int32_t *order);

/* Draws from probs with uniform u in [0, 1). */
int32_t kd_sample_from(const double *probs, int32_t vocab, double u);

/* One token: greedy, or a draw from kd_sample_probs with the request's generator.
 * probs and order: work space of vocab entries each (unused when greedy). */
int32_t kd_sample(const float *logits, int32_t vocab, const kd_sampling *s, kd_rng *rng,
                  double *probs, int32_t *order);

#endif
