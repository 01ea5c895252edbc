/* lt_table_test: the text form of cuBLASLt configuration tables (kd/lt_table.h), an operator's
 * input (KDECODE_CUDA_LT_TABLE): every field's range, malformed lines refused with their line,
 * overlapping entries refused, files too large or missing, and random tables read back as
 * written. (That the CUDA backend runs a table's configurations: cuda_test on a GPU.) */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kd/lt_table.h"
#include "testutil.h"

static int parse(const char *text, kd_lt_entry *out, int cap, kd_err *err) {
    memset(err, 0, sizeof *err);
    return kd_lt_table_parse(text, strlen(text), out, cap, err);
}

/* Comments, blank lines, tabs and CRLF; the values as written; find by rows. */
START_TEST(reads_a_table) {
    const char *text = "# N K m_lo m_hi id tile stages split_k reduction swizzle custom cluster inner\r\n"
                       "\n"
                       "2304 4096 12 24  66 183 35 4 2 0 4 4 0   # o_proj, K split in 4\r\n"
                       "\t2304\t4096\t48\t48\t66\t312\t35\t1\t0\t1\t1\t2\t3\n"
                       "   \t  \n"
                       "18432 2304 8 8 66 486 35 1 0 0 7 2 0#no space before the comment";
    kd_lt_entry t[8];
    kd_err err;
    const int n = parse(text, t, 8, &err);
    ck_assert_msg(n == 3, "%d entries (%s)", n, err.msg);
    ck_assert_int_eq(t[0].N, 2304);
    ck_assert_int_eq(t[0].K, 4096);
    ck_assert_int_eq(t[0].m_lo, 12);
    ck_assert_int_eq(t[0].m_hi, 24);
    ck_assert_int_eq(t[0].c.id, 66);
    ck_assert_uint_eq(t[0].c.tile, 183);
    ck_assert_uint_eq(t[0].c.stages, 35);
    ck_assert_int_eq(t[0].c.split_k, 4);
    ck_assert_uint_eq(t[0].c.reduction, 2);
    ck_assert_uint_eq(t[0].c.swizzle, 0);
    ck_assert_uint_eq(t[0].c.custom, 4);
    ck_assert_uint_eq(t[0].c.cluster, 4);
    ck_assert_uint_eq(t[0].c.inner, 0);
    ck_assert_uint_eq(t[1].c.swizzle, 1);
    ck_assert_uint_eq(t[1].c.inner, 3);
    ck_assert_int_eq(t[2].N, 18432);
    ck_assert_uint_eq(t[2].c.custom, 7);
    ck_assert_ptr_eq(kd_lt_table_find(t, n, 12, 2304, 4096), &t[0]);
    ck_assert_ptr_eq(kd_lt_table_find(t, n, 24, 2304, 4096), &t[0]);
    ck_assert_ptr_null(kd_lt_table_find(t, n, 25, 2304, 4096));
    ck_assert_ptr_null(kd_lt_table_find(t, n, 11, 2304, 4096));
    ck_assert_ptr_eq(kd_lt_table_find(t, n, 48, 2304, 4096), &t[1]);
    ck_assert_ptr_null(kd_lt_table_find(t, n, 48, 2304, 9216));
    ck_assert_ptr_eq(kd_lt_table_find(t, n, 8, 18432, 2304), &t[2]);
    /* an empty table, and one of comments only: no entries, valid */
    ck_assert_int_eq(parse("", t, 8, &err), 0);
    ck_assert_int_eq(parse("# nothing\n\n  # here\n", t, 8, &err), 0);
    ck_assert_int_eq(kd_lt_table_parse(NULL, 0, t, 8, &err), 0);
}
END_TEST

/* Every malformed line is refused, naming its line; the fields at the ends of their ranges
 * are taken. */
START_TEST(refuses_bad_lines) {
    static const struct {
        const char *text, *says;
    } bad[] = {
        {"2304 4096 12 24 66 183 35 4 2 0 4 4\n", "line 1: 12 fields"},
        {"\n\n2304 4096 12 24 66 183 35 4 2 0 4 4 0 9\n", "line 3: more than 13"},
        {"2304 4096 12 24 -66 183 35 4 2 0 4 4 0\n", "field 5 (id)"},
        {"2304 4096 12 24 +66 183 35 4 2 0 4 4 0\n", "not a decimal"},
        {"2304 4096 12 24 66 1.5 35 4 2 0 4 4 0\n", "field 6 (tile)"},
        {"2304 0x10 12 24 66 183 35 4 2 0 4 4 0\n", "field 2 (K)"},
        {"0 4096 12 24 66 183 35 4 2 0 4 4 0\n", "field 1 (N) = 0 out of range"},
        {"2147483648 4096 12 24 66 183 35 4 2 0 4 4 0\n", "field 1 (N)"},
        {"2304 4096 0 24 66 183 35 4 2 0 4 4 0\n", "field 3 (m_lo)"},
        {"2304 4096 12 24 66 4294967296 35 4 2 0 4 4 0\n", "field 6 (tile)"},
        {"2304 4096 12 24 66 183 35 0 2 0 4 4 0\n", "field 8 (split_k)"},
        {"2304 4096 12 24 66 183 35 4 2 0 4 65536 0\n", "field 12 (cluster)"},
        {"2304 4096 12 24 66 183 35 4 2 0 4 4 99999999999999999999999999\n", "field 13 (inner)"},
        {"2304 4096 25 24 66 183 35 4 2 0 4 4 0\n", "m_lo 25 above m_hi 24"},
        {"2304 4096 12 24 66 183 35 4 2 0 4 4 0\n2304 4096 24 30 66 183 35 4 2 0 4 4 0\n", "line 2: rows 24..30"},
        {"1 1 1 1 0 0 0 1 0 0 0 0 0\n# ok\n1 1 1 1 0 0 0 1 0 0 0 0 0\n", "overlap line 1"},
    };
    kd_lt_entry t[8];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        kd_err err;
        for (int k = 0; k < 8; k++) memset(&t[k], 0xa5, sizeof t[k]);
        ck_assert_msg(parse(bad[i].text, t, 8, &err) == -1, "case %zu taken", i);
        ck_assert_msg(strstr(err.msg, bad[i].says) != NULL, "case %zu: '%s' does not say '%s'", i, err.msg,
                      bad[i].says);
    }
    /* the ends of the ranges */
    kd_err err;
    const char *edge = "2147483647 1 2147483647 2147483647 2147483647 4294967295 4294967295 2147483647 4294967295 "
                       "4294967295 4294967295 65535 65535\n"
                       "1 1 1 1 0 0 0 1 0 0 0 0 0\n";
    ck_assert_msg(parse(edge, t, 8, &err) == 2, "%s", err.msg);
    ck_assert_int_eq(t[0].N, 2147483647);
    ck_assert_int_eq(t[0].c.id, 2147483647);
    ck_assert_uint_eq(t[0].c.tile, 4294967295u);
    ck_assert_int_eq(t[0].c.split_k, 2147483647);
    ck_assert_uint_eq(t[0].c.cluster, 65535);
    ck_assert_uint_eq(t[0].c.inner, 65535);
    /* the same rows of other shapes do not overlap */
    ck_assert_int_eq(parse("1 2 5 9 0 0 0 1 0 0 0 0 0\n2 1 5 9 0 0 0 1 0 0 0 0 0\n1 2 10 10 0 0 0 1 0 0 0 0 0\n", t,
                           8, &err),
                     3);
    /* a NUL byte: not text */
    const char nul[] = "1 1 1 1 0 0 0 1 0 0 0 0 0\n\0\n";
    ck_assert_int_eq(kd_lt_table_parse(nul, sizeof nul - 1, t, 8, &err), -1);
    ck_assert_ptr_nonnull(strstr(err.msg, "NUL"));
    /* more entries than the room given */
    ck_assert_int_eq(parse("1 1 1 1 0 0 0 1 0 0 0 0 0\n1 1 2 2 0 0 0 1 0 0 0 0 0\n1 1 3 3 0 0 0 1 0 0 0 0 0\n", t,
                           2, &err),
                     -1);
    ck_assert_ptr_nonnull(strstr(err.msg, "line 3: more than 2 entries"));
}
END_TEST

/* Random tables written as text read back field for field, and find returns each entry. */
START_TEST(random_round_trip) {
    kd_test_rng r;
    kd_test_rng_init(&r, kd_test_seed() ^ 0x17);
    enum { kMax = 300 };
    kd_lt_entry *want = malloc(sizeof *want * kMax), *got = malloc(sizeof *got * kMax);
    char *text = malloc(kMax * 160);
    ck_assert(want && got && text);
    for (int trial = 0; trial < 50; trial++) {
        const int n = (int)(kd_test_rng_u64(&r) % kMax);
        size_t len = 0;
        for (int i = 0; i < n; i++) {
            kd_lt_entry *e = &want[i];
            memset(e, 0, sizeof *e);
            e->N = 1 + (int64_t)(kd_test_rng_u64(&r) % 200000), e->K = 1 + i; /* distinct shapes: no overlap */
            e->m_lo = 1 + (int64_t)(kd_test_rng_u64(&r) % 512);
            e->m_hi = e->m_lo + (int64_t)(kd_test_rng_u64(&r) % 64);
            kd_lt_config *c = &e->c;
            c->id = (int32_t)(kd_test_rng_u64(&r) % 100), c->tile = (uint32_t)kd_test_rng_u64(&r);
            c->stages = (uint32_t)kd_test_rng_u64(&r), c->split_k = 1 + (int32_t)(kd_test_rng_u64(&r) % 16);
            c->reduction = (uint32_t)(kd_test_rng_u64(&r) % 8), c->swizzle = (uint32_t)(kd_test_rng_u64(&r) % 2);
            c->custom = (uint32_t)(kd_test_rng_u64(&r) % 8), c->cluster = (uint16_t)kd_test_rng_u64(&r);
            c->inner = (uint16_t)kd_test_rng_u64(&r);
            len += (size_t)sprintf(text + len, "%s%lld %lld %lld %lld %d %u %u %d %u %u %u %u %u%s\n",
                                   i % 3 == 0 ? "  " : "", (long long)e->N, (long long)e->K, (long long)e->m_lo,
                                   (long long)e->m_hi, c->id, c->tile, c->stages, c->split_k, c->reduction,
                                   c->swizzle, c->custom, c->cluster, c->inner, i % 4 == 1 ? " # note" : "");
        }
        kd_err err = {{0}};
        const int m = kd_lt_table_parse(text, len, got, kMax, &err);
        ck_assert_msg(m == n, "trial %d: %d of %d entries (%s)", trial, m, n, err.msg);
        for (int i = 0; i < n; i++) {
            ck_assert_int_eq(got[i].N, want[i].N);
            ck_assert_int_eq(got[i].K, want[i].K);
            ck_assert_int_eq(got[i].m_lo, want[i].m_lo);
            ck_assert_int_eq(got[i].m_hi, want[i].m_hi);
            ck_assert(!memcmp(&got[i].c, &want[i].c, sizeof got[i].c));
            const uint64_t span = (uint64_t)(want[i].m_hi - want[i].m_lo + 1);
            const int64_t M = want[i].m_lo + (int64_t)(kd_test_rng_u64(&r) % span);
            ck_assert_ptr_eq(kd_lt_table_find(got, m, M, want[i].N, want[i].K), &got[i]);
            ck_assert_ptr_null(kd_lt_table_find(got, m, want[i].m_hi + 1, want[i].N, want[i].K));
        }
    }
    free(want), free(got), free(text);
}
END_TEST

static char *write_file(const char *dir, const char *name, const char *data, size_t len) {
    char *path = malloc(strlen(dir) + strlen(name) + 2);
    ck_assert_ptr_nonnull(path);
    sprintf(path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(data, 1, len, f), len);
    ck_assert_int_eq(fclose(f), 0);
    return path;
}

/* Files: a table, an empty one, a missing one, one too large, one with a bad line. */
START_TEST(loads_files) {
    char *dir = kd_test_tmpdir();
    ck_assert_ptr_nonnull(dir);
    kd_err err = {{0}};
    kd_lt_entry *t = (kd_lt_entry *)1;
    const char *ok = "# a table\n2304 9216 384 384 66 105 35 1 0 0 0 2 0\n12576 2304 8 16 66 448 35 1 0 0 1 2 0\n";
    char *p = write_file(dir, "ok.table", ok, strlen(ok));
    ck_assert_int_eq(kd_lt_table_load(p, &t, &err), 2);
    ck_assert_ptr_nonnull(t);
    ck_assert_int_eq(t[1].m_hi, 16);
    ck_assert_uint_eq(t[1].c.tile, 448);
    free(t), free(p);
    p = write_file(dir, "empty.table", "", 0);
    t = (kd_lt_entry *)1;
    ck_assert_int_eq(kd_lt_table_load(p, &t, &err), 0);
    ck_assert_ptr_null(t);
    free(p);
    t = (kd_lt_entry *)1;
    char missing[512];
    snprintf(missing, sizeof missing, "%s/no-such.table", dir);
    ck_assert_int_eq(kd_lt_table_load(missing, &t, &err), -1);
    ck_assert_ptr_null(t);
    ck_assert_msg(strstr(err.msg, missing) && strstr(err.msg, "No such file"), "%s", err.msg);
    /* a directory */
    t = (kd_lt_entry *)1;
    ck_assert_int_eq(kd_lt_table_load(dir, &t, &err), -1);
    ck_assert_ptr_null(t);
    ck_assert_msg(strstr(err.msg, dir) && strstr(err.msg, "directory"), "%s", err.msg);
    /* one byte over the limit, of comment lines: refused for its size, not parsed */
    const size_t big = KD_LT_TABLE_FILE_MAX + 1;
    char *data = malloc(big);
    ck_assert_ptr_nonnull(data);
    for (size_t i = 0; i < big; i++) data[i] = i % 64 == 63 ? '\n' : '#';
    p = write_file(dir, "big.table", data, big);
    ck_assert_int_eq(kd_lt_table_load(p, &t, &err), -1);
    ck_assert_ptr_null(t);
    ck_assert_msg(strstr(err.msg, "larger than"), "%s", err.msg);
    free(p);
    /* at the limit: read whole */
    p = write_file(dir, "limit.table", data, big - 1);
    ck_assert_msg(kd_lt_table_load(p, &t, &err) == 0, "%s", err.msg);
    free(p), free(data);
    const char *bad = "2304 9216 384 384 66 105 35 1 0 0 0 2 0\n2304 9216 x 384 66 105 35 1 0 0 0 2 0\n";
    p = write_file(dir, "bad.table", bad, strlen(bad));
    ck_assert_int_eq(kd_lt_table_load(p, &t, &err), -1);
    ck_assert_ptr_null(t);
    ck_assert_msg(strstr(err.msg, p) && strstr(err.msg, "line 2: field 3 (m_lo)"), "%s", err.msg);
    free(p);
    kd_test_rmtree(dir);
    free(dir);
}
END_TEST

int main(void) {
    Suite *s = suite_create("lt_table");
    TCase *tc = tcase_create("cpu");
    tcase_add_test(tc, reads_a_table);
    tcase_add_test(tc, refuses_bad_lines);
    tcase_add_test(tc, random_round_trip);
    tcase_add_test(tc, loads_files);
    suite_add_tcase(s, tc);
    return kd_test_run_suite(s);
}
