/* testutil.c: see testutil.h. */
#define _GNU_SOURCE
#include "tests/testutil.h"

#include <check.h>
#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static int exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0;
}

const char *kd_test_oracle(char *buf, size_t len, const char *rel) {
    const char *env = getenv("KDECODE_ORACLE");
    const char *srcdir = getenv("TEST_SRCDIR");
    char cand[3][1024];
    int n = 0;
    if (env) snprintf(cand[n++], sizeof cand[0], "%s", env);
    if (srcdir) {
        snprintf(cand[n++], sizeof cand[0], "%s/oracle", srcdir);
        snprintf(cand[n++], sizeof cand[0], "%s/kdecode/external/oracle", srcdir);
    }
    for (int i = 0; i < n; i++) {
        snprintf(buf, len, "%s/%s", cand[i], rel);
        if (exists(buf)) return buf;
    }
    snprintf(buf, len, "../shared/oracle/%s", rel);
    if (exists(buf)) return buf;
    fprintf(stderr, "oracle file %s not found (set KDECODE_ORACLE)\n", rel);
    return NULL;
}

char *kd_test_tmpdir(void) {
    const char *base = getenv("TEST_TMPDIR");
    if (!base) base = "/tmp";
    size_t n = strlen(base) + 32;
    char *p = malloc(n);
    if (!p) return NULL;
    snprintf(p, n, "%s/kdtest.XXXXXX", base);
    if (!mkdtemp(p)) {
        free(p);
        return NULL;
    }
    return p;
}

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

void kd_test_rmtree(const char *dir) {
    if (dir) nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

uint64_t kd_test_seed(void) {
    static uint64_t seed;
    static int have;
    if (!have) {
        const char *env = getenv("KDECODE_TEST_SEED");
        if (env) seed = strtoull(env, NULL, 0);
        else {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            seed = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^ ((uint64_t)getpid() << 40);
        }
        have = 1;
        fprintf(stderr, "test seed: KDECODE_TEST_SEED=%llu\n", (unsigned long long)seed);
    }
    return seed;
}

static uint64_t splitmix(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void kd_test_rng_init(kd_test_rng *r, uint64_t seed) {
    for (int i = 0; i < 4; i++) r->s[i] = splitmix(&seed);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t kd_test_rng_u64(kd_test_rng *r) {
    uint64_t *s = r->s;
    uint64_t out = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0], s[3] ^= s[1], s[1] ^= s[2], s[0] ^= s[3], s[2] ^= t, s[3] = rotl(s[3], 45);
    return out;
}

double kd_test_rng_uniform(kd_test_rng *r) { return (kd_test_rng_u64(r) >> 11) * 0x1.0p-53; }

double kd_test_rng_normal(kd_test_rng *r) {
    double u1 = kd_test_rng_uniform(r), u2 = kd_test_rng_uniform(r);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

double kd_test_rel_err_f32_f64(const float *a, const double *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        num += d * d, den += b[i] * b[i];
    }
    if (!(num == num)) return INFINITY; /* NaN */
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

double kd_test_rel_err_f64(const double *a, const double *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = a[i] - b[i];
        num += d * d, den += b[i] * b[i];
    }
    if (!(num == num)) return INFINITY;
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

int kd_test_run_suite(Suite *s) {
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
