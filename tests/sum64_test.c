/* sum64_test: the NCCL handoff's checksum (kd/sum64.h) on the CPU. The GPU version is checked
 * against this one on the device (tests/nccl/peer_bench.cu). */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "kd/sum64.h"
#include "testutil.h"

/* Expected values from an independent implementation of the definition in decoder.proto
 * (Python integers: sum of fmix64((i << 32) | w) mod 2^64, then fmix64(s ^ n * golden)). */
START_TEST(known_answers) {
    uint32_t w[10];
    for (uint32_t i = 0; i < 10; i++) w[i] = i * 0x01010101u;
    ck_assert_uint_eq(kd_sum64(w, sizeof w), 0x73e824ef88f42375ull);
    uint32_t f[7];
    for (int i = 0; i < 7; i++) f[i] = 0xffffffffu;
    ck_assert_uint_eq(kd_sum64(f, sizeof f), 0x3a267cbe021ddbf7ull);
    ck_assert_uint_eq(kd_sum64(f, 0), 0);
}
END_TEST

/* Any change of one word, anywhere, changes the sum (guaranteed by the construction: the
 * terms are bijections of (index, word)); so do zeroing, swapping and length. */
START_TEST(detects_changes) {
    kd_test_rng r;
    kd_test_rng_init(&r, kd_test_seed());
    for (int trial = 0; trial < 200; trial++) {
        const size_t n = 1 + kd_test_rng_u64(&r) % 5000;
        uint32_t *w = malloc((n + 1) * sizeof *w);
        ck_assert_ptr_nonnull(w);
        for (size_t i = 0; i < n; i++) w[i] = (uint32_t)kd_test_rng_u64(&r);
        const uint64_t h = kd_sum64(w, n * 4);
        ck_assert_uint_eq(kd_sum64(w, n * 4), h); /* deterministic */
        const size_t at = kd_test_rng_u64(&r) % n;
        const uint32_t old = w[at];
        w[at] ^= 1u << (kd_test_rng_u64(&r) % 32);
        ck_assert_uint_ne(kd_sum64(w, n * 4), h);
        w[at] = old;
        if (n > 1) {
            size_t b = kd_test_rng_u64(&r) % n;
            if (b == at) b = (at + 1) % n;
            if (w[at] != w[b]) {
                uint32_t t = w[at];
                w[at] = w[b], w[b] = t;
                ck_assert_uint_ne(kd_sum64(w, n * 4), h);
                w[b] = w[at], w[at] = t;
            }
        }
        ck_assert_uint_eq(kd_sum64(w, n * 4), h);
        w[n] = 0;
        ck_assert_uint_ne(kd_sum64(w, (n + 1) * 4), h); /* one more (zero) word */
        uint32_t *z = calloc(n, sizeof *z);
        ck_assert_ptr_nonnull(z);
        int all_zero = 1;
        for (size_t i = 0; i < n; i++) all_zero &= w[i] == 0;
        if (!all_zero) ck_assert_uint_ne(kd_sum64(z, n * 4), h);
        free(z), free(w);
    }
}
END_TEST

/* Unaligned input gives the same result as aligned. */
START_TEST(unaligned) {
    kd_test_rng r;
    kd_test_rng_init(&r, kd_test_seed() ^ 1);
    unsigned char *buf = malloc(4096 + 3);
    ck_assert_ptr_nonnull(buf);
    for (int i = 0; i < 4096 + 3; i++) buf[i] = (unsigned char)kd_test_rng_u64(&r);
    uint32_t *al = malloc(4096);
    ck_assert_ptr_nonnull(al);
    for (int off = 1; off <= 3; off++) {
        memcpy(al, buf + off, 4096);
        ck_assert_uint_eq(kd_sum64(buf + off, 4096), kd_sum64(al, 4096));
    }
    free(al), free(buf);
}
END_TEST

int main(void) {
    Suite *s = suite_create("sum64");
    TCase *tc = tcase_create("cpu");
    tcase_add_test(tc, known_answers);
    tcase_add_test(tc, detects_changes);
    tcase_add_test(tc, unaligned);
    suite_add_tcase(s, tc);
    return kd_test_run_suite(s);
}
