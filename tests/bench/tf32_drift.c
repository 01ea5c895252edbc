/* tf32_drift: how far a long decode's recurrent state drifts from float64 when its products are
 * formed as the CUDA backend's tensor-core verify forms them (3xTF32: x = hi + lo, kernels/cuda/kda.cu's
 * tf32_hi), on the CPU by emulation: the tensor core's reading of a tf32 operand (its top 19 bits) and
 * the fp32 sums of the three partial products. A bench, not a test: it asserts nothing; it prints,
 * per way of splitting, the state's relative error (Frobenius, against float64) after 100 ... N tokens.
 *
 * The recurrence is the delta rule with a per-channel decay, one token a step, as the verify folds it:
 *   P_j = sum_c (d_c S_cj) k_c,  u_j = beta (v_j - P_j),  S_cj <- d_c S_cj + k_c u_j
 * with L2-normalised random keys, values in [-1, 1), beta in [0.2, 0.8), half of the key channels at
 * decay 0.9999 (a long memory) and the rest in [0.95, 1).
 *
 *   tf32_drift [N]     (default 50000 tokens; K = 128 key channels, 8 value columns)
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { KC = 128, VC = 8 };

typedef enum { ROUND_BOTH, ROUND_HI, TRUNC, PLAIN_FP32, N_MODES } split_mode;
static const char *const mode_name[N_MODES] = {
    "hi and lo rounded to tf32", "hi rounded, lo as it is", "hi truncated, lo as it is (the backend)",
    "plain fp32 products"};

static uint32_t bits(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}
static float from_bits(uint32_t u) {
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}
static float tf32_trunc(float x) { return from_bits(bits(x) & 0xffffe000u); } /* what the tensor core reads */
static float tf32_round(float x) { return from_bits((bits(x) + 0x1000u) & 0xffffe000u); }

static void split(split_mode m, float x, float *hi, float *lo) {
    *hi = m == TRUNC ? tf32_trunc(x) : tf32_round(x);
    *lo = m == ROUND_BOTH ? tf32_round(x - *hi) : x - *hi;
    *lo = tf32_trunc(*lo); /* read as tf32 */
}
/* a b as one 3xTF32 product term: hi*hi + (hi*lo + lo*hi) in fp32 */
static float product(split_mode m, float a, float b) {
    if (m == PLAIN_FP32) return a * b;
    float ah, al, bh, bl;
    split(m, a, &ah, &al);
    split(m, b, &bh, &bl);
    return ah * bh + (ah * bl + al * bh);
}

static double uniform(uint32_t *s) {
    *s = *s * 1664525u + 1013904223u;
    return (double)(*s >> 8) / 16777216.0;
}

int main(int argc, char **argv) {
    long n_tok = 50000;
    if (argc > 2) {
        fprintf(stderr, "usage: tf32_drift [N]\n");
        return 2;
    }
    if (argc == 2) {
        char *end;
        errno = 0;
        n_tok = strtol(argv[1], &end, 10);
        if (errno || *end || end == argv[1] || n_tok < 1 || n_tok > 10000000) {
            fprintf(stderr, "tf32_drift: N must be a whole number of tokens in [1, 10000000]\n");
            return 2;
        }
    }
    static float S[KC][VC];
    static double R[KC][VC];
    printf("state drift from float64 (relative, Frobenius), K = %d, %d value columns\n", KC, VC);
    for (int m = 0; m < N_MODES; m++) {
        uint32_t seed = 12345; /* the same tokens for every mode */
        float d[KC];
        memset(S, 0, sizeof S);
        memset(R, 0, sizeof R);
        for (int c = 0; c < KC; c++) d[c] = (float)(c < KC / 2 ? 0.9999 : 0.95 + 0.05 * uniform(&seed));
        printf("%-42s", mode_name[m]);
        for (long t = 1; t <= n_tok; t++) {
            float k[KC], v[VC];
            double nk = 0;
            for (int c = 0; c < KC; c++) k[c] = (float)(uniform(&seed) - 0.5), nk += (double)k[c] * k[c];
            for (int c = 0; c < KC; c++) k[c] = (float)(k[c] / sqrt(nk));
            for (int j = 0; j < VC; j++) v[j] = (float)(uniform(&seed) * 2 - 1);
            const float beta = (float)(0.2 + 0.6 * uniform(&seed));
            for (int j = 0; j < VC; j++) {
                float p = 0;
                double pr = 0;
                for (int c = 0; c < KC; c++)
                    p += product((split_mode)m, S[c][j] * d[c], k[c]), pr += R[c][j] * d[c] * k[c];
                const float u = beta * (v[j] - p);
                const double ur = beta * (v[j] - pr);
                for (int c = 0; c < KC; c++)
                    S[c][j] = S[c][j] * d[c] + product((split_mode)m, k[c], u), R[c][j] = R[c][j] * d[c] + k[c] * ur;
            }
            if (t == 100 || t == 1000 || t == 10000 || t == n_tok || t % 100000 == 0) {
                double e = 0, r = 0;
                for (int c = 0; c < KC; c++)
                    for (int j = 0; j < VC; j++) e += (S[c][j] - R[c][j]) * (S[c][j] - R[c][j]), r += R[c][j] * R[c][j];
                printf("  t=%ld %.2e", t, sqrt(e / r));
            }
        }
        printf("\n");
    }
    return 0;
}
