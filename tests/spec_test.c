/* spec_test.c: the n-gram proposer (hand cases and a naive reference on random histories)
 * and the acceptance of a verify window (KDA.md §3): greedy exactness, and for stochastic
 * acceptance a chi-square goodness-of-fit of the emitted window against the exact target
 * distribution, with a negative control showing that the test can fail. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/testutil.h"
#include "worker/sample.h"
#include "worker/spec.h"

static kd_test_rng trng;

static void setup(void) { kd_test_rng_init(&trng, kd_test_seed()); }

static int32_t rand_below(int32_t n) { return (int32_t)(kd_test_rng_u64(&trng) % (uint64_t)n); }

/* ---------------------------------------------------------------- n-gram proposer */

/* Calls the proposer with an out buffer of exactly max(max_draft, 1) entries (so that the
 * sanitizers catch any write past it) and checks the result against want[0..n_want). */
static void expect_ngram(const int32_t *hist, int64_t n_hist, int32_t n_min, int32_t n_max,
                         int32_t max_draft, const int32_t *want, int32_t n_want) {
    int32_t *out = malloc((size_t)(max_draft > 0 ? max_draft : 1) * sizeof *out);
    int32_t n = kd_ngram_propose(hist, n_hist, n_min, n_max, max_draft, out);
    ck_assert_msg(n == n_want, "n_hist %lld n_min %d n_max %d max_draft %d: got %d want %d",
                  (long long)n_hist, n_min, n_max, max_draft, n, n_want);
    for (int32_t i = 0; i < n; i++)
        ck_assert_msg(out[i] == want[i], "token %d: got %d want %d", i, out[i], want[i]);
    free(out);
}

#define LEN(a) ((int64_t)(sizeof(a) / sizeof(a)[0]))

START_TEST(test_ngram_hand) {
    /* no match at any n */
    static const int32_t none[] = {1, 2, 3, 4, 5};
    expect_ngram(none, LEN(none), 1, 4, 8, NULL, 0);

    /* degenerate arguments */
    static const int32_t two_same[] = {4, 4}, two_diff[] = {4, 5};
    static const int32_t w4[] = {4};
    expect_ngram(two_same, 2, 1, 3, 8, w4, 1);
    expect_ngram(two_diff, 2, 1, 3, 8, NULL, 0);
    expect_ngram(two_same, 1, 1, 3, 8, NULL, 0);  /* n_hist < 2 */
    expect_ngram(two_same, 0, 1, 3, 8, NULL, 0);
    expect_ngram(two_same, -5, 1, 3, 8, NULL, 0);
    expect_ngram(two_same, 2, 1, 3, 0, NULL, 0);  /* max_draft <= 0 */
    expect_ngram(two_same, 2, 1, 3, -1, NULL, 0);
    expect_ngram(two_same, 2, 0, 3, 8, w4, 1);    /* n_min < 1 counts as 1 */
    expect_ngram(two_same, 2, -3, 3, 8, w4, 1);
    expect_ngram(two_same, 2, 2, 1, 8, NULL, 0);  /* empty range */
    expect_ngram(two_same, 2, 1, 0, 8, NULL, 0);

    /* "1 2" occurs three times earlier: the latest occurrence wins */
    static const int32_t several[] = {1, 2, 7, 1, 2, 8, 1, 2, 9, 5, 1, 2};
    static const int32_t w_sev[] = {9, 5, 1, 2};
    expect_ngram(several, LEN(several), 2, 2, 2, w_sev, 2);
    expect_ngram(several, LEN(several), 1, 2, 3, w_sev, 3);
    /* ... running to the end of the history (overlapping the suffix) */
    expect_ngram(several, LEN(several), 2, 2, 100, w_sev, 4);
    /* n_max above the longest match (no 3-gram recurs): still the latest "1 2" */
    expect_ngram(several, LEN(several), 1, 5, 2, w_sev, 2);
    /* with only n = 1 the latest "2" is still the one before 9 */
    expect_ngram(several, LEN(several), 1, 1, 1, w_sev, 1);

    /* longer n preferred: "2" latest -> 30, "1 2" latest -> 20, "5 1 2" -> 10 */
    static const int32_t longer[] = {5, 1, 2, 10, 6, 1, 2, 20, 3, 2, 30, 5, 1, 2};
    static const int32_t w10[] = {10, 6, 1}, w20[] = {20, 3, 2}, w30[] = {30, 5, 1};
    expect_ngram(longer, LEN(longer), 1, 3, 3, w10, 3);
    expect_ngram(longer, LEN(longer), 1, 8, 3, w10, 3);  /* no 4-gram match: falls to 3 */
    expect_ngram(longer, LEN(longer), 3, 3, 1, w10, 1);
    expect_ngram(longer, LEN(longer), 1, 2, 3, w20, 3);
    expect_ngram(longer, LEN(longer), 2, 2, 3, w20, 3);
    expect_ngram(longer, LEN(longer), 1, 1, 3, w30, 3);
    expect_ngram(longer, LEN(longer), 4, 6, 3, NULL, 0); /* n_min above any match */

    /* truncated by the end of history vs by max_draft */
    static const int32_t trunc[] = {1, 2, 3, 1, 2};
    static const int32_t w_tr[] = {3, 1, 2};
    expect_ngram(trunc, LEN(trunc), 1, 2, 10, w_tr, 3);
    expect_ngram(trunc, LEN(trunc), 1, 2, 2, w_tr, 2);
    expect_ngram(trunc, LEN(trunc), 1, 2, 1, w_tr, 1);

    /* self-overlapping occurrence: "7 7 7" at [0, 3) for the suffix at [1, 4) */
    static const int32_t run[] = {7, 7, 7, 7};
    static const int32_t w7[] = {7};
    expect_ngram(run, LEN(run), 1, 3, 5, w7, 1);
    expect_ngram(run, LEN(run), 3, 100, 5, w7, 1);
    expect_ngram(run, LEN(run), 4, 100, 5, NULL, 0); /* a 4-gram would be the suffix itself */

    /* a repeated period: the latest earlier occurrence proposes the last period */
    static const int32_t per[] = {1, 2, 3, 1, 2, 3, 1, 2, 3};
    static const int32_t w_per[] = {1, 2, 3};
    expect_ngram(per, LEN(per), 1, 3, 8, w_per, 3);
    expect_ngram(per, LEN(per), 6, 6, 8, w_per, 3);

    /* negative and large ids are just values */
    static const int32_t odd[] = {-1, INT32_MAX, 0, -1, INT32_MAX};
    static const int32_t w_odd[] = {0, -1, INT32_MAX};
    expect_ngram(odd, LEN(odd), 1, 4, 8, w_odd, 3);
}
END_TEST

/* Naive reference written from the header: for n from n_max down to n_min, scan occurrence
 * starts from the latest possible (start + n <= n_hist - 1) back to 0. */
static int32_t naive_ngram(const int32_t *hist, int64_t n_hist, int32_t n_min, int32_t n_max,
                           int32_t max_draft, int32_t *out) {
    if (n_hist < 2 || max_draft <= 0) return 0;
    if (n_min < 1) n_min = 1;
    for (int64_t n = n_max; n >= n_min; n--) {
        if (n > n_hist - 1) continue;
        const int32_t *suffix = hist + n_hist - n;
        for (int64_t start = n_hist - 1 - n; start >= 0; start--) {
            if (memcmp(hist + start, suffix, (size_t)n * sizeof *hist) != 0) continue;
            int32_t k = 0;
            for (int64_t j = start + n; j < n_hist && k < max_draft; j++) out[k++] = hist[j];
            return k;
        }
    }
    return 0;
}

START_TEST(test_ngram_random) {
    int32_t hist[80], want[16];
    for (int trial = 0; trial < 20000; trial++) {
        int64_t n_hist = rand_below(LEN(hist) + 1);
        int32_t alpha = 1 + rand_below(5);
        for (int64_t i = 0; i < n_hist; i++) hist[i] = rand_below(alpha);
        /* sometimes plant a copy of the tail earlier so that long matches occur */
        if (n_hist > 8 && rand_below(2)) {
            int32_t len = 1 + rand_below(6), at = rand_below((int32_t)(n_hist - len));
            memmove(hist + at, hist + n_hist - len, (size_t)len * sizeof *hist);
        }
        int32_t n_min = rand_below(5), n_max = rand_below(9), max_draft = rand_below(10) - 1;
        int32_t n_want = naive_ngram(hist, n_hist, n_min, n_max, max_draft, want);
        expect_ngram(hist, n_hist, n_min, n_max, max_draft, want, n_want);
    }
}
END_TEST

START_TEST(test_ngram_long) {
    /* A long history of one token: the suffix matches right behind itself at n_max. */
    enum { N = 30000 };
    int32_t *hist = malloc(N * sizeof *hist), out[8], want[8];
    for (int i = 0; i < N; i++) hist[i] = 3;
    ck_assert_int_eq(kd_ngram_propose(hist, N, 1, 8, 8, out), 1);
    ck_assert_int_eq(out[0], 3);
    /* random history over a large alphabet, against the reference */
    for (int i = 0; i < N; i++) hist[i] = rand_below(50);
    for (int k = 0; k < 4; k++) {
        int32_t n_min = 1 + rand_below(2), n_max = n_min + rand_below(6);
        int32_t n_want = naive_ngram(hist, N - k * 997, n_min, n_max, 8, want);
        expect_ngram(hist, N - k * 997, n_min, n_max, 8, want, n_want);
    }
    free(hist);
}
END_TEST

/* The index (kd_ngram_index_propose) against the naive reference at every length of a growing
 * history: small alphabets (many matches, long chains), planted copies of the tail, random n_min,
 * n_max and draft lengths; the out buffer exactly max_draft long (the sanitizers see any write past
 * it). Also a call with a shorter history than the index has seen, and argument errors. */
START_TEST(test_ngram_index) {
    enum { CAP = 300 };
    int32_t hist[CAP], want[16];
    for (int trial = 0; trial < 400; trial++) {
        const int32_t alpha = 1 + rand_below(trial % 3 ? 6 : 400);
        const int32_t n_min = 1 + rand_below(4), max_draft = 1 + rand_below(9);
        const int32_t init_max = n_min + rand_below(7); /* chains up to n_min + 3 (KD_NGRAM_LEVELS) */
        const int64_t len = 1 + rand_below(CAP);
        kd_ngram_index ix;
        ck_assert_int_eq(kd_ngram_index_init(&ix, len, n_min, init_max), 0);
        ck_assert_int_eq(ix.n_top, init_max < n_min + KD_NGRAM_LEVELS - 1 ? init_max : n_min + KD_NGRAM_LEVELS - 1);
        for (int64_t n = 0; n < len; n++) {
            hist[n] = rand_below(alpha);
            if (n > 8 && rand_below(16) == 0) { /* a copy of the tail planted at the end */
                const int32_t c = 1 + rand_below(6), at = rand_below((int32_t)(n - c));
                for (int32_t i = 0; i < c && n < len - 1; i++) hist[++n] = hist[at + i];
            }
            const int32_t n_max = n_min + rand_below(7); /* below, at or above init's */
            int32_t *out = malloc((size_t)max_draft * sizeof *out);
            const int32_t got = kd_ngram_index_propose(&ix, hist, n + 1, n_max, max_draft, out);
            const int32_t n_want = naive_ngram(hist, n + 1, n_min, n_max, max_draft, want);
            ck_assert_msg(got == n_want, "trial %d n_hist %lld n_min %d n_max %d: got %d want %d", trial,
                          (long long)n + 1, n_min, n_max, got, n_want);
            for (int32_t i = 0; i < got; i++) ck_assert_int_eq(out[i], want[i]);
            if (n > 4 && rand_below(8) == 0) { /* a shorter history than the index has chained */
                const int64_t m = n + 1 - rand_below(4);
                const int32_t g2 = kd_ngram_index_propose(&ix, hist, m, n_max, max_draft, out);
                const int32_t w2 = naive_ngram(hist, m, n_min, n_max, max_draft, want);
                ck_assert_int_eq(g2, w2);
                for (int32_t i = 0; i < g2; i++) ck_assert_int_eq(out[i], want[i]);
            }
            free(out);
        }
        int32_t out1[1];
        ck_assert_int_eq(kd_ngram_index_propose(&ix, hist, len + 1, 3, 1, out1), 0); /* past cap */
        ck_assert_int_eq(kd_ngram_index_propose(&ix, hist, len, n_min - 1, 1, out1), 0); /* n_max < n_min */
        kd_ngram_index_free(&ix);
        kd_ngram_index_free(&ix); /* twice: nothing left to free */
    }
    kd_ngram_index bad;
    ck_assert_int_eq(kd_ngram_index_init(&bad, 0, 1, 3), -1);
    ck_assert_int_eq(kd_ngram_index_init(&bad, 10, 0, 3), -1);
    ck_assert_int_eq(kd_ngram_index_init(&bad, 10, 65, 65), -1);
    ck_assert_int_eq(kd_ngram_index_init(&bad, 10, 1, 65), -1);
    ck_assert_int_eq(kd_ngram_index_init(&bad, 10, 3, 2), -1); /* n_max < n_min */
    int32_t out[4];
    ck_assert_int_eq(kd_ngram_index_propose(&bad, hist, 2, 3, 4, out), 0); /* a failed init proposes nothing */
    /* one token repeated: the chain is the whole history, the first end reaches n_max */
    enum { N = 30000 };
    int32_t *h = malloc(N * sizeof *h);
    for (int i = 0; i < N; i++) h[i] = 3;
    kd_ngram_index ix;
    ck_assert_int_eq(kd_ngram_index_init(&ix, N, 1, 8), 0);
    ck_assert_int_eq(kd_ngram_index_propose(&ix, h, N, 8, 4, out), 1);
    ck_assert_int_eq(out[0], 3);
    kd_ngram_index_free(&ix);
    /* a long history whose last token is frequent but whose last 3 tokens occur once, early: the answer
     * is that occurrence (a 3-token match), found on the 3-token chain */
    for (int i = 0; i < N; i++) h[i] = i % 2 ? 7 : 100 + i % 5000;
    h[10] = 41, h[11] = 42, h[12] = 7, h[13] = 99; /* 41 42 7 -> 99 */
    h[N - 3] = 41, h[N - 2] = 42, h[N - 1] = 7;
    ck_assert_int_eq(kd_ngram_index_init(&ix, N, 1, 3), 0);
    ck_assert_int_eq(kd_ngram_index_propose(&ix, h, N, 3, 2, out), 2);
    ck_assert_int_eq(out[0], 99);
    ck_assert_int_eq(out[1], h[14]);
    ck_assert_int_eq(kd_ngram_propose(h, N, 1, 3, 2, want), 2);
    ck_assert_int_eq(want[0], 99);
    kd_ngram_index_free(&ix);
    free(h);
}
END_TEST

/* ---------------------------------------------------------------- greedy acceptance */

static float *rand_logits(int32_t rows, int32_t vocab, double scale) {
    float *l = malloc((size_t)rows * (size_t)vocab * sizeof *l);
    for (int64_t i = 0; i < (int64_t)rows * vocab; i++) l[i] = (float)(scale * kd_test_rng_normal(&trng));
    return l;
}

typedef struct work {
    double *probs;
    int32_t *order, *out;
} work;

static work work_new(int32_t vocab, int32_t n_draft) {
    work w = {malloc((size_t)vocab * sizeof(double)), malloc((size_t)vocab * sizeof(int32_t)),
              malloc((size_t)(n_draft + 1) * sizeof(int32_t))};
    return w;
}

static void work_free(work *w) { free(w->probs), free(w->order), free(w->out); }

static const kd_sampling greedy = {0, 0, 1, 0};

START_TEST(test_greedy) {
    const int32_t bad_ids[] = {-1, INT32_MIN, 0 /* set to vocab below */, INT32_MAX};
    for (int trial = 0; trial < 500; trial++) {
        int32_t vocab = 2 + rand_below(60), n = rand_below(8);
        float *logits = rand_logits(n + 1, vocab, 2.0);
        int32_t arg[9], drafts[8];
        for (int32_t i = 0; i <= n; i++) arg[i] = kd_argmax(logits + (int64_t)i * vocab, vocab);
        work w = work_new(vocab, n);
        kd_rng rng;
        kd_rng_seed(&rng, kd_test_rng_u64(&trng));
        /* all accepted: the bonus is the argmax of the last row */
        memcpy(drafts, arg, (size_t)n * sizeof *drafts);
        ck_assert_int_eq(kd_spec_accept(logits, vocab, drafts, n, &greedy, &rng, w.probs, w.order, w.out), n);
        for (int32_t i = 0; i <= n; i++) ck_assert_int_eq(w.out[i], arg[i]);
        /* corruption at c (another valid id, or an invalid one): a = c */
        for (int32_t c = 0; c < n; c++) {
            for (int kind = 0; kind < 2; kind++) {
                memcpy(drafts, arg, (size_t)n * sizeof *drafts);
                /* later drafts are corrupted too at random: they must not matter */
                for (int32_t j = c + 1; j < n; j++)
                    if (rand_below(2)) drafts[j] = rand_below(vocab);
                if (kind == 0) drafts[c] = (arg[c] + 1 + rand_below(vocab - 1)) % vocab;
                else {
                    int32_t b = rand_below(4);
                    drafts[c] = b == 2 ? vocab : bad_ids[b];
                }
                int32_t a = kd_spec_accept(logits, vocab, drafts, n, &greedy, &rng, w.probs, w.order, w.out);
                ck_assert_int_eq(a, c);
                for (int32_t i = 0; i <= c; i++) ck_assert_int_eq(w.out[i], arg[i]);
            }
        }
        /* no drafts: plain greedy */
        ck_assert_int_eq(kd_spec_accept(logits, vocab, drafts, 0, &greedy, &rng, w.probs, w.order, w.out), 0);
        ck_assert_int_eq(w.out[0], arg[0]);
        ck_assert_int_eq(w.out[0], kd_sample(logits, vocab, &greedy, &rng, w.probs, w.order));
        work_free(&w);
        free(logits);
    }
}
END_TEST

/* top_k = 1 puts all mass on the argmax at any temperature: stochastic acceptance must then
 * behave exactly like greedy for any drafts (p(d) is 1 or 0). */
START_TEST(test_topk1_is_greedy) {
    const kd_sampling s = {1.0, 1, 1, 0};
    for (int trial = 0; trial < 300; trial++) {
        int32_t vocab = 2 + rand_below(30), n = rand_below(6);
        float *logits = rand_logits(n + 1, vocab, 1.0);
        int32_t drafts[6], ref[7];
        for (int32_t i = 0; i < n; i++)
            drafts[i] = rand_below(3) ? kd_argmax(logits + (int64_t)i * vocab, vocab) : rand_below(vocab + 2) - 1;
        work w = work_new(vocab, n);
        kd_rng rng;
        kd_rng_seed(&rng, kd_test_rng_u64(&trng));
        int32_t ar = kd_spec_accept(logits, vocab, drafts, n, &greedy, &rng, w.probs, w.order, ref);
        int32_t a = kd_spec_accept(logits, vocab, drafts, n, &s, &rng, w.probs, w.order, w.out);
        ck_assert_int_eq(a, ar);
        for (int32_t i = 0; i <= a; i++) ck_assert_int_eq(w.out[i], ref[i]);
        work_free(&w);
        free(logits);
    }
}
END_TEST

/* ---------------------------------------------------------------- stochastic acceptance */

/* Upper critical value of chi-square with k degrees of freedom at tail probability ~1e-6
 * (z = 4.7534), Wilson-Hilferty approximation (conservative: 1-10 % above the exact value from
 * 2 degrees of freedom). Every run draws fresh samples for ~25 such checks (a CI run takes the
 * suite twice, plain and under the sanitizers): at 1e-4 a correct sampler failed about one CI
 * run in 400 (seen: [invalid first id] chi2 27.7 >= 26.3 at 5 degrees of freedom, whose mean
 * over 150 fresh runs was 5.01), at 1e-6 one in ~40000; the negative controls below stay far
 * past it (chi2 in the hundreds to thousands). */
static double chi2_crit(int k) {
    const double z = 4.7534;
    double h = 2.0 / (9.0 * k);
    double c = 1 - h + z * sqrt(h);
    return k * c * c * c;
}

/* The window's outcome is (a, t): a accepted drafts then token t. Its exact probability under
 * the target is prod_{i<a} p_i(d_{i+1}) * p_a(t), except that for a < n the token t = d_{a+1}
 * would have been accepted (that outcome belongs to a longer window) so (a, d_{a+1}) has
 * probability 0. An invalid draft id has probability 0. */
static void exact_outcomes(const float *logits, int32_t vocab, const int32_t *drafts, int32_t n,
                           const kd_sampling *s, double *cell /* [(n+1) * vocab] */) {
    double *p = malloc((size_t)vocab * sizeof *p);
    int32_t *order = malloc((size_t)vocab * sizeof *order);
    double reach = 1; /* probability that drafts 1..a were all accepted */
    for (int32_t a = 0; a <= n; a++) {
        kd_sample_probs(logits + (int64_t)a * vocab, vocab, s, p, order);
        for (int32_t t = 0; t < vocab; t++) cell[a * vocab + t] = reach * p[t];
        if (a < n) {
            int32_t d = drafts[a];
            double pd = d >= 0 && d < vocab ? p[d] : 0;
            if (d >= 0 && d < vocab) cell[a * vocab + d] = 0;
            reach *= pd;
        }
    }
    free(p), free(order);
}

typedef int32_t (*accept_fn)(const float *, int32_t, const int32_t *, int32_t, const kd_sampling *,
                             kd_rng *, double *, int32_t *, int32_t *);

typedef struct gof {
    double chi2, crit;
    int df;
    long impossible;  /* outcomes observed where the target has probability 0 */
    long bad_prefix;  /* windows whose accepted part differs from the drafts */
} gof;

/* Runs fn `draws` times (a fresh seed each), tallies the outcomes (a, t) and compares them
 * with the exact target: cells with expected count < 5 are pooled into one bin (merged into
 * the smallest other bin if the pool itself stays under 5). */
static gof run_gof(accept_fn fn, const float *logits, int32_t vocab, const int32_t *drafts,
                   int32_t n, const kd_sampling *s, long draws) {
    int32_t cells = (n + 1) * vocab;
    double *exact = malloc((size_t)cells * sizeof *exact);
    long *count = calloc((size_t)cells, sizeof *count);
    exact_outcomes(logits, vocab, drafts, n, s, exact);
    work w = work_new(vocab, n);
    gof g = {0, 0, 0, 0, 0};
    for (long k = 0; k < draws; k++) {
        kd_rng rng;
        kd_rng_seed(&rng, kd_test_rng_u64(&trng));
        int32_t a = fn(logits, vocab, drafts, n, s, &rng, w.probs, w.order, w.out);
        /* (no ck_assert per draw: a passing one costs a write to Check's pipe) */
        if (!(a >= 0 && a <= n && w.out[a] >= 0 && w.out[a] < vocab))
            ck_abort_msg("a = %d (n %d), token %d (vocab %d)", a, n, a >= 0 && a <= n ? w.out[a] : -1, vocab);
        for (int32_t i = 0; i < a; i++)
            if (w.out[i] != drafts[i]) g.bad_prefix++;
        count[a * vocab + w.out[a]]++;
    }
    double pool_e = 0, pool_o = 0, min_e = INFINITY, min_o = 0;
    int bins = 0;
    for (int32_t c = 0; c < cells; c++) {
        double e = exact[c] * (double)draws, o = (double)count[c];
        if (exact[c] == 0) {
            g.impossible += count[c];
            continue;
        }
        if (e < 5) {
            pool_e += e, pool_o += o;
            continue;
        }
        g.chi2 += (o - e) * (o - e) / e, bins++;
        if (e < min_e) min_e = e, min_o = o;
    }
    if (pool_e > 0) {
        if (pool_e < 5 && bins > 0) { /* fold the pool into the smallest bin */
            g.chi2 -= (min_o - min_e) * (min_o - min_e) / min_e;
            pool_e += min_e, pool_o += min_o, bins--;
        }
        g.chi2 += (pool_o - pool_e) * (pool_o - pool_e) / pool_e, bins++;
    }
    g.df = bins - 1;
    g.crit = g.df > 0 ? chi2_crit(g.df) : 0;
    work_free(&w);
    free(exact), free(count);
    return g;
}

static int gof_pass(const gof *g) {
    return g->impossible == 0 && g->bad_prefix == 0 && (g->df <= 0 || g->chi2 < g->crit);
}

/* Row r's tokens sorted by probability under s, most likely first (ties: lower id). */
static void rank_tokens(const float *row, int32_t vocab, const kd_sampling *s, int32_t *rank) {
    double *p = malloc((size_t)vocab * sizeof *p);
    int32_t *order = malloc((size_t)vocab * sizeof *order);
    kd_sample_probs(row, vocab, s, p, order);
    for (int32_t i = 0; i < vocab; i++) rank[i] = i;
    for (int32_t i = 1; i < vocab; i++) /* insertion sort, stable */
        for (int32_t j = i; j > 0 && p[rank[j]] > p[rank[j - 1]]; j--) {
            int32_t t = rank[j];
            rank[j] = rank[j - 1], rank[j - 1] = t;
        }
    free(p), free(order);
}

enum { DV = 6, DRAWS = 200000 };

/* A variant: sampling settings and, per draft position, which token to propose: the rank
 * under the target at that position (0 = most likely, DV-1 = least likely; outside a top-k
 * or top-p nucleus it has p = 0) or an invalid id (RANK_BAD_LO: -1, RANK_BAD_HI: vocab). */
enum { RANK_BAD_LO = -1, RANK_BAD_HI = -2 };
typedef struct variant {
    const char *name;
    kd_sampling s;
    int32_t n;
    int32_t rank[4];
} variant;

static const variant variants[] = {
    {"T=1", {1.0, 0, 1, 0}, 3, {0, 1, 0}},
    {"T=1 unlikely drafts", {1.0, 0, 1, 0}, 3, {2, 0, 4}},
    {"T=0.7 top_k=3 (draft outside)", {0.7, 3, 1, 0}, 3, {0, 1, 4}},
    {"T=0.7 top_k=3 (first outside)", {0.7, 3, 1, 0}, 2, {5, 0}},
    {"T=1.3 top_p=0.8", {1.3, 0, 0.8, 0}, 4, {0, 1, 0, DV - 1}},
    {"T=1 top_k=4 top_p=0.9", {1.0, 4, 0.9, 0}, 3, {1, 0, 3}},
    {"T=0.5", {0.5, 0, 1, 0}, 3, {0, 0, 1}},
    {"invalid ids", {1.0, 0, 1, 0}, 3, {0, RANK_BAD_HI, 0}},
    {"invalid first id", {1.0, 0, 1, 0}, 2, {RANK_BAD_LO, 0}},
    {"no drafts", {0.9, 0, 0.95, 0}, 0, {0}},
};

static float *variant_setup(const variant *v, int32_t *drafts) {
    float *logits = rand_logits(v->n + 1, DV, 1.0);
    int32_t rank[DV];
    for (int32_t i = 0; i < v->n; i++) {
        if (v->rank[i] == RANK_BAD_LO) drafts[i] = -1;
        else if (v->rank[i] == RANK_BAD_HI) drafts[i] = DV;
        else {
            rank_tokens(logits + (int64_t)i * DV, DV, &v->s, rank);
            drafts[i] = rank[v->rank[i]];
        }
    }
    return logits;
}

START_TEST(test_distribution) {
    const variant *v = &variants[_i];
    kd_test_rng_init(&trng, kd_test_seed() + 0x9e3779b97f4a7c15ull * (uint64_t)(_i + 1));
    int32_t drafts[4];
    float *logits = variant_setup(v, drafts);
    gof g = run_gof(kd_spec_accept, logits, DV, drafts, v->n, &v->s, DRAWS);
    fprintf(stderr, "spec distribution [%s]: chi2 %.1f, df %d, crit %.1f\n", v->name, g.chi2, g.df, g.crit);
    ck_assert_msg(g.bad_prefix == 0, "[%s] accepted tokens differ from the drafts", v->name);
    ck_assert_msg(g.impossible == 0, "[%s] %ld outcomes of target probability 0", v->name, g.impossible);
    ck_assert_msg(g.df > 0, "[%s] degenerate test", v->name);
    ck_assert_msg(g.chi2 < g.crit, "[%s] chi2 %.1f >= %.1f (df %d)", v->name, g.chi2, g.crit, g.df);
    free(logits);
}
END_TEST

/* Negative controls: classic acceptance bugs, run through the same harness, must fail it. */

/* accepts with probability 0.85 p(d) (same support, biased) */
static int32_t biased_accept(const float *logits, int32_t vocab, const int32_t *drafts, int32_t n,
                             const kd_sampling *s, kd_rng *rng, double *probs, int32_t *order,
                             int32_t *out) {
    for (int32_t i = 0; i < n; i++) {
        kd_sample_probs(logits + (int64_t)i * vocab, vocab, s, probs, order);
        int32_t d = drafts[i];
        if (kd_rng_uniform(rng) < 0.85 * probs[d]) {
            out[i] = d;
            continue;
        }
        double z = 1 - probs[d];
        probs[d] = 0;
        for (int32_t j = 0; j < vocab; j++) probs[j] /= z;
        out[i] = kd_sample_from(probs, vocab, kd_rng_uniform(rng));
        return i;
    }
    kd_sample_probs(logits + (int64_t)n * vocab, vocab, s, probs, order);
    out[n] = kd_sample_from(probs, vocab, kd_rng_uniform(rng));
    return n;
}

/* on rejection draws from p itself instead of the residual */
static int32_t no_residual_accept(const float *logits, int32_t vocab, const int32_t *drafts, int32_t n,
                                  const kd_sampling *s, kd_rng *rng, double *probs, int32_t *order,
                                  int32_t *out) {
    for (int32_t i = 0; i < n; i++) {
        kd_sample_probs(logits + (int64_t)i * vocab, vocab, s, probs, order);
        if (kd_rng_uniform(rng) < probs[drafts[i]]) {
            out[i] = drafts[i];
            continue;
        }
        out[i] = kd_sample_from(probs, vocab, kd_rng_uniform(rng));
        return i;
    }
    kd_sample_probs(logits + (int64_t)n * vocab, vocab, s, probs, order);
    out[n] = kd_sample_from(probs, vocab, kd_rng_uniform(rng));
    return n;
}

/* the bonus token drawn from the last draft's row instead of the row after it */
static int32_t wrong_row_accept(const float *logits, int32_t vocab, const int32_t *drafts, int32_t n,
                                const kd_sampling *s, kd_rng *rng, double *probs, int32_t *order,
                                int32_t *out) {
    int32_t a = kd_spec_accept(logits, vocab, drafts, n, s, rng, probs, order, out);
    if (a == n && n > 0) {
        kd_sample_probs(logits + (int64_t)(n - 1) * vocab, vocab, s, probs, order);
        out[n] = kd_sample_from(probs, vocab, kd_rng_uniform(rng));
    }
    return a;
}

START_TEST(test_negative_control) {
    /* fixed, well-spread logits so that each bug has a large effect */
    static const float logits[3 * DV] = {1.0f, 0.2f, -0.5f, 0.6f, -1.0f, 0.0f,
                                         -0.3f, 0.9f, 0.1f, -0.8f, 0.4f, 0.0f,
                                         0.0f, -0.6f, 0.7f, 0.3f, 1.1f, -0.2f};
    const int32_t drafts[2] = {0, 1};
    const kd_sampling s = {1.0, 0, 1, 0};
    const long draws = DRAWS / 4;
    gof g = run_gof(kd_spec_accept, logits, DV, drafts, 2, &s, draws);
    ck_assert_msg(gof_pass(&g), "correct acceptance fails: chi2 %.1f crit %.1f", g.chi2, g.crit);
    g = run_gof(biased_accept, logits, DV, drafts, 2, &s, draws);
    ck_assert_msg(g.impossible == 0 && g.chi2 > g.crit, "biased acceptance not detected: chi2 %.1f crit %.1f",
                  g.chi2, g.crit);
    fprintf(stderr, "negative control [biased]: chi2 %.1f, df %d, crit %.1f\n", g.chi2, g.df, g.crit);
    g = run_gof(wrong_row_accept, logits, DV, drafts, 2, &s, draws);
    ck_assert_msg(g.impossible == 0 && g.chi2 > g.crit, "wrong bonus row not detected: chi2 %.1f crit %.1f",
                  g.chi2, g.crit);
    fprintf(stderr, "negative control [wrong bonus row]: chi2 %.1f, df %d, crit %.1f\n", g.chi2, g.df, g.crit);
    g = run_gof(no_residual_accept, logits, DV, drafts, 2, &s, draws);
    fprintf(stderr, "negative control [no residual]: %ld impossible outcomes\n", g.impossible);
    ck_assert_msg(g.impossible > 0 && !gof_pass(&g), "missing residual not detected");
    /* and the statistic itself: multinomial samples from a slightly wrong distribution */
    double p[DV] = {0.3, 0.2, 0.2, 0.1, 0.1, 0.1}, q[DV] = {0.28, 0.21, 0.2, 0.11, 0.1, 0.1};
    long cnt[DV] = {0};
    for (long k = 0; k < DRAWS; k++) cnt[kd_sample_from(q, DV, kd_test_rng_uniform(&trng))]++;
    double chi2 = 0;
    for (int i = 0; i < DV; i++) chi2 += (cnt[i] - p[i] * DRAWS) * (cnt[i] - p[i] * DRAWS) / (p[i] * DRAWS);
    fprintf(stderr, "negative control [multinomial]: chi2 %.1f, crit %.1f\n", chi2, chi2_crit(DV - 1));
    ck_assert_msg(chi2 > chi2_crit(DV - 1), "wrong distribution not detected: chi2 %.1f", chi2);
    /* Wilson-Hilferty against exact 1e-6 critical values: slightly conservative */
    static const struct { int df; double crit; } tab[] = {{2, 27.631}, {5, 35.888}, {10, 46.863}, {20, 65.421}};
    for (int i = 0; i < 4; i++)
        ck_assert_msg(chi2_crit(tab[i].df) >= tab[i].crit && chi2_crit(tab[i].df) < 1.10 * tab[i].crit,
                      "df %d: %.2f vs %.3f", tab[i].df, chi2_crit(tab[i].df), tab[i].crit);
}
END_TEST

/* With no drafts the stochastic window is exactly kd_sample (same draw from the generator). */
START_TEST(test_no_drafts_is_sample) {
    const kd_sampling s = {0.8, 5, 0.9, 0};
    for (int trial = 0; trial < 2000; trial++) {
        int32_t vocab = 1 + rand_below(40);
        float *logits = rand_logits(1, vocab, 1.5);
        work w = work_new(vocab, 0);
        kd_rng r1, r2;
        uint64_t seed = kd_test_rng_u64(&trng);
        kd_rng_seed(&r1, seed), kd_rng_seed(&r2, seed);
        ck_assert_int_eq(kd_spec_accept(logits, vocab, NULL, 0, &s, &r1, w.probs, w.order, w.out), 0);
        ck_assert_int_eq(w.out[0], kd_sample(logits, vocab, &s, &r2, w.probs, w.order));
        ck_assert(memcmp(&r1, &r2, sizeof r1) == 0);
        work_free(&w);
        free(logits);
    }
}
END_TEST

/* ---------------------------------------------------------------- determinism */

START_TEST(test_determinism) {
    const kd_sampling ss[] = {{1.0, 0, 1, 0}, {0.6, 8, 0.9, 0}, {0, 0, 1, 0}};
    int differ = 0;
    for (int trial = 0; trial < 300; trial++) {
        const kd_sampling *s = &ss[trial % 3];
        int32_t vocab = 2 + rand_below(50), n = rand_below(7);
        float *logits = rand_logits(n + 1, vocab, 1.0);
        int32_t drafts[7], out1[8], out2[8], out3[8];
        int32_t rank[64];
        for (int32_t i = 0; i < n; i++) { /* mostly likely tokens, so that windows run long */
            rank_tokens(logits + (int64_t)i * vocab, vocab, s, rank);
            drafts[i] = rand_below(4) ? rank[rand_below(2)] : rand_below(vocab + 2) - 1;
        }
        work w = work_new(vocab, n);
        uint64_t seed = kd_test_rng_u64(&trng);
        kd_rng r1, r2, r3;
        kd_rng_seed(&r1, seed), kd_rng_seed(&r2, seed), kd_rng_seed(&r3, seed + 1);
        /* several consecutive windows from one generator, as a request would run them */
        for (int step = 0; step < 4; step++) {
            int32_t a1 = kd_spec_accept(logits, vocab, drafts, n, s, &r1, w.probs, w.order, out1);
            int32_t a2 = kd_spec_accept(logits, vocab, drafts, n, s, &r2, w.probs, w.order, out2);
            int32_t a3 = kd_spec_accept(logits, vocab, drafts, n, s, &r3, w.probs, w.order, out3);
            ck_assert_int_eq(a1, a2);
            ck_assert(memcmp(out1, out2, (size_t)(a1 + 1) * sizeof *out1) == 0);
            ck_assert(memcmp(&r1, &r2, sizeof r1) == 0);
            if (a1 != a3 || memcmp(out1, out3, (size_t)(a1 + 1) * sizeof *out1) != 0) differ++;
        }
        work_free(&w);
        free(logits);
    }
    ck_assert_msg(differ > 0, "another seed never changed the outcome");
}
END_TEST

int main(void) {
    Suite *s = suite_create("spec");
    TCase *tc = tcase_create("ngram");
    tcase_add_checked_fixture(tc, setup, NULL);
    tcase_add_test(tc, test_ngram_hand);
    tcase_add_test(tc, test_ngram_random);
    tcase_add_test(tc, test_ngram_long);
    tcase_add_test(tc, test_ngram_index);
    suite_add_tcase(s, tc);

    tc = tcase_create("accept");
    tcase_add_checked_fixture(tc, setup, NULL);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_greedy);
    tcase_add_test(tc, test_topk1_is_greedy);
    tcase_add_test(tc, test_no_drafts_is_sample);
    tcase_add_test(tc, test_determinism);
    tcase_add_loop_test(tc, test_distribution, 0, (int)(sizeof variants / sizeof variants[0]));
    tcase_add_test(tc, test_negative_control);
    suite_add_tcase(s, tc);
    return kd_test_run_suite(s);
}
