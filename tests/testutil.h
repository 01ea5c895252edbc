/* testutil.h: helpers shared by the Check tests. */
#ifndef KD_TESTUTIL_H
#define KD_TESTUTIL_H

#include <stddef.h>
#include <stdint.h>

/* Path of a file or folder under the oracle directory (../shared/oracle beside the
 * checkout; inside `bazel test` the @oracle runfiles). Returns buf, or NULL when the
 * oracle cannot be found (the caller fails the test: the oracle is required). */
const char *kd_test_oracle(char *buf, size_t len, const char *rel);

/* A fresh temporary directory (removed by kd_test_rmtree). */
char *kd_test_tmpdir(void);
void kd_test_rmtree(const char *dir);

/* Seed for random test inputs: KDECODE_TEST_SEED if set, else drawn fresh (time and pid),
 * printed once so that a failure can be replayed. */
uint64_t kd_test_seed(void);
/* xoshiro256** style generator for tests. */
typedef struct kd_test_rng {
    uint64_t s[4];
} kd_test_rng;
void kd_test_rng_init(kd_test_rng *r, uint64_t seed);
uint64_t kd_test_rng_u64(kd_test_rng *r);
double kd_test_rng_uniform(kd_test_rng *r);  /* [0, 1) */
double kd_test_rng_normal(kd_test_rng *r);   /* N(0, 1) */

/* Runs a Check suite (frees it); returns the process exit code. */
struct Suite;
int kd_test_run_suite(struct Suite *s);

/* ||a - b|| / ||b|| */
double kd_test_rel_err_f32_f64(const float *a, const double *b, size_t n);
double kd_test_rel_err_f64(const double *a, const double *b, size_t n);

#endif
