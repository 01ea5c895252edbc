/* prefix_cache_test.c: the align-mode prefix cache (worker/prefix_cache.h, KDA.md §6).
 *
 * Keys are checked against the byte layout of the spec, hashed here in one shot with
 * XXH3-128; the cache is checked by hand-written scenarios (longest prefix, LRU order,
 * capacity 0, counters) and by a randomized model check against a naive reference (a list
 * of token prefixes, states and last-use ticks). Random inputs come from kd_test_seed(). */
#include <check.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "tests/testutil.h"
#include "worker/prefix_cache.h"

static int heq(kd_hash128 a, kd_hash128 b) { return a.lo == b.lo && a.hi == b.hi; }

static void le(unsigned char *p, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; i++) p[i] = (unsigned char)(v >> (8 * i));
}

/* The spec, hashed in one shot: root = H("kdecode-prefix-v1" ‖ fp ‖ block). */
static kd_hash128 spec_root(uint64_t fp, int32_t block) {
    unsigned char b[17 + 8 + 4];
    memcpy(b, "kdecode-prefix-v1", 17);
    le(b + 17, fp, 8);
    le(b + 25, (uint32_t)block, 4);
    XXH128_hash_t h = XXH3_128bits(b, sizeof b);
    return (kd_hash128){h.low64, h.high64};
}

/* key_j = H(prev.lo ‖ prev.hi ‖ tokens of block j). */
static kd_hash128 spec_chain(kd_hash128 prev, const int32_t *t, int32_t block) {
    unsigned char *b = malloc(16 + 4 * (size_t)block);
    le(b, prev.lo, 8);
    le(b + 8, prev.hi, 8);
    for (int32_t i = 0; i < block; i++) le(b + 16 + 4 * i, (uint32_t)t[i], 4);
    XXH128_hash_t h = XXH3_128bits(b, 16 + 4 * (size_t)block);
    free(b);
    return (kd_hash128){h.low64, h.high64};
}

static kd_hash128 key_of(kd_hash128 root, const int32_t *t, int64_t n, int32_t block) {
    for (int64_t i = 0; i < n; i += block) root = kd_prefix_chain(root, t + i, block);
    return root;
}

static uint64_t rnd(kd_test_rng *r, uint64_t n) { return n ? kd_test_rng_u64(r) % n : 0; }

static kd_prefix_cache *mk(size_t state_bytes, size_t cap, int32_t block, uint64_t fp) {
    kd_err err = {{0}};
    kd_prefix_cache *c = kd_prefix_cache_create(state_bytes, cap * state_bytes, block, fp, &err);
    ck_assert_msg(c != NULL, "create: %s", err.msg);
    return c;
}

static void fill_state(unsigned char *s, size_t n, uint64_t tag) {
    for (size_t i = 0; i < n; i++) s[i] = (unsigned char)(tag * 131 + i * 7 + (tag >> 8));
}

/* ---- keys ---- */

START_TEST(keys_match_spec) {
    kd_test_rng r;
    kd_test_rng_init(&r, kd_test_seed());
    static const int32_t blocks[] = {1, 2, 3, 16, 255, 256, 257, 1000};
    for (size_t bi = 0; bi < sizeof blocks / sizeof *blocks; bi++) {
        int32_t block = blocks[bi];
        uint64_t fp = kd_test_rng_u64(&r);
        kd_prefix_cache *c = mk(8, 4, block, fp);
        ck_assert_int_eq(kd_prefix_cache_block(c), block);
        kd_hash128 root = kd_prefix_root(c), want = spec_root(fp, block);
        ck_assert(heq(root, want));
        int32_t *t = malloc(3 * (size_t)block * sizeof *t);
        for (int32_t i = 0; i < 3 * block; i++) t[i] = (int32_t)kd_test_rng_u64(&r); /* negatives too */
        kd_hash128 h = root;
        for (int j = 0; j < 3; j++) {
            h = kd_prefix_chain(h, t + j * block, block);
            want = spec_chain(want, t + j * block, block);
            ck_assert_msg(heq(h, want), "block %d, chain step %d", block, j);
        }
        free(t);
        kd_prefix_cache_free(c);
    }
}
END_TEST

START_TEST(keys_sensitivity) {
    kd_test_rng r;
    kd_test_rng_init(&r, kd_test_seed());
    enum { B = 4, NB = 4, N = B * NB };
    int32_t t[N], u[N];
    for (int i = 0; i < N; i++) t[i] = (int32_t)rnd(&r, 1000) * 2; /* even: t[i] ^ 1 differs */
    kd_hash128 root = spec_root(42, B), k = key_of(root, t, N, B);
    /* every token matters, including a single bit of it */
    for (int i = 0; i < N; i++) {
        memcpy(u, t, sizeof t);
        u[i] ^= 1;
        ck_assert_msg(!heq(key_of(root, u, N, B), k), "token %d ignored", i);
        u[i] = t[i] ^ INT32_MIN;
        ck_assert_msg(!heq(key_of(root, u, N, B), k), "high bit of token %d ignored", i);
    }
    /* order matters, within a block and across blocks */
    for (int i = 0; i + 1 < N; i++) {
        memcpy(u, t, sizeof t);
        if (u[i] == u[i + 1]) u[i + 1] += 2;
        kd_hash128 k1 = key_of(root, u, N, B);
        int32_t x = u[i];
        u[i] = u[i + 1];
        u[i + 1] = x;
        ck_assert_msg(!heq(key_of(root, u, N, B), k1), "swap %d/%d ignored", i, i + 1);
    }
    /* block boundaries: the same tokens split differently (same root) give another key */
    kd_hash128 two = kd_prefix_chain(kd_prefix_chain(root, t, 2), t + 2, 2);
    ck_assert(!heq(two, kd_prefix_chain(root, t, 4)));
    /* prefixes of different length differ, and the key is not the previous one */
    ck_assert(!heq(key_of(root, t, B, B), key_of(root, t, 2 * B, B)));
    ck_assert(!heq(kd_prefix_chain(root, t, B), root));
    /* the root depends on the fingerprint and the block size, hence every key */
    ck_assert(!heq(spec_root(42, B), spec_root(43, B)));
    ck_assert(!heq(spec_root(42, B), spec_root(42, 2 * B)));
    ck_assert(!heq(key_of(spec_root(43, B), t, N, B), k));
    ck_assert(!heq(key_of(spec_root(42, 2 * B), t, N, 2 * B), k));
    kd_prefix_cache *a = mk(4, 1, B, 42), *b = mk(4, 1, B, 43), *d = mk(4, 1, 2 * B, 42);
    ck_assert(heq(kd_prefix_root(a), spec_root(42, B)));
    ck_assert(!heq(kd_prefix_root(a), kd_prefix_root(b)));
    ck_assert(!heq(kd_prefix_root(a), kd_prefix_root(d)));
    kd_prefix_cache_free(a);
    kd_prefix_cache_free(b);
    kd_prefix_cache_free(d);
}
END_TEST

/* ---- scenarios ---- */

START_TEST(insert_lookup_random) {
    kd_test_rng r;
    kd_test_rng_init(&r, kd_test_seed());
    for (int round = 0; round < 20; round++) {
        int32_t block = 1 + (int32_t)rnd(&r, 9);
        size_t sb = 1 + rnd(&r, 200);
        int nb = 1 + (int)rnd(&r, 12);
        kd_prefix_cache *c = mk(sb, (size_t)nb, block, kd_test_rng_u64(&r));
        int64_t n = (int64_t)nb * block;
        int32_t *t = malloc((size_t)(n + block) * sizeof *t);
        unsigned char *st = malloc((size_t)nb * sb);
        for (int64_t i = 0; i < n + block; i++) t[i] = (int32_t)rnd(&r, 50000);
        for (int j = 0; j < nb; j++) {
            fill_state(st + j * sb, sb, kd_test_rng_u64(&r));
            kd_hash128 k = key_of(kd_prefix_root(c), t, (int64_t)(j + 1) * block, block);
            ck_assert_int_eq(kd_prefix_insert(c, t, (int64_t)(j + 1) * block, (j & 1) ? &k : NULL,
                                              st + j * sb), 1);
        }
        for (int j = 0; j < nb; j++) { /* exact bytes of each block */
            const void *p;
            ck_assert(kd_prefix_contains(c, t, (int64_t)(j + 1) * block, &p));
            ck_assert(memcmp(p, st + j * sb, sb) == 0);
        }
        /* every length, with a partial block at the end: the deepest whole block */
        for (int64_t len = 0; len <= n + block - 1; len++) {
            const void *p = (const void *)1;
            int64_t want = len / block > nb ? nb : len / block;
            ck_assert_int_eq(kd_prefix_lookup(c, t, len, INT64_MAX, &p), want);
            if (want) ck_assert(memcmp(p, st + (want - 1) * sb, sb) == 0);
            else ck_assert_ptr_null(p);
        }
        /* a change inside block j: j blocks match */
        int64_t pos = (int64_t)rnd(&r, (uint64_t)n);
        t[pos] += 1;
        const void *p;
        ck_assert_int_eq(kd_prefix_lookup(c, t, n, INT64_MAX, &p), pos / block);
        free(t);
        free(st);
        kd_prefix_cache_free(c);
    }
}
END_TEST

START_TEST(longest_contiguous_prefix) {
    enum { B = 3, S = 16 };
    kd_prefix_cache *c = mk(S, 8, B, 7);
    int32_t t[6 * B];
    unsigned char st[5][S];
    for (int i = 0; i < 6 * B; i++) t[i] = 100 + i;
    for (int j = 0; j < 5; j++) {
        fill_state(st[j], S, (uint64_t)j + 1);
        if (j != 3) ck_assert_int_eq(kd_prefix_insert(c, t, (j + 1) * B, NULL, st[j]), 1);
    }
    const void *p;
    ck_assert(!kd_prefix_contains(c, t, 4 * B, &p));
    ck_assert_ptr_null(p);
    ck_assert(kd_prefix_contains(c, t, 5 * B, &p)); /* present, but not reachable */
    ck_assert_int_eq(kd_prefix_lookup(c, t, 6 * B, INT64_MAX, &p), 3);
    ck_assert(memcmp(p, st[2], S) == 0);
    /* max_blocks limits the match */
    ck_assert_int_eq(kd_prefix_lookup(c, t, 6 * B, 2, &p), 2);
    ck_assert(memcmp(p, st[1], S) == 0);
    ck_assert_int_eq(kd_prefix_lookup(c, t, 6 * B, 1, &p), 1);
    ck_assert(memcmp(p, st[0], S) == 0);
    ck_assert_int_eq(kd_prefix_lookup(c, t, 6 * B, 0, &p), 0);
    ck_assert_ptr_null(p);
    ck_assert_int_eq(kd_prefix_lookup(c, t, 6 * B, -5, &p), 0);
    /* fill the gap: now all five */
    ck_assert_int_eq(kd_prefix_insert(c, t, 4 * B, NULL, st[3]), 1);
    ck_assert_int_eq(kd_prefix_lookup(c, t, 6 * B, INT64_MAX, &p), 5);
    ck_assert(memcmp(p, st[4], S) == 0);
    ck_assert_int_eq(kd_prefix_lookup(c, t, 5 * B - 1, INT64_MAX, &p), 4);
    ck_assert_int_eq(kd_prefix_lookup(c, t, 6 * B, 4, &p), 4);
    ck_assert(memcmp(p, st[3], S) == 0);
    /* bad lengths for insert / contains are refused */
    ck_assert_int_eq(kd_prefix_insert(c, t, B + 1, NULL, st[0]), 0);
    ck_assert_int_eq(kd_prefix_insert(c, t, 0, NULL, st[0]), 0);
    ck_assert(!kd_prefix_contains(c, t, B + 1, NULL));
    ck_assert(!kd_prefix_contains(c, t, 0, NULL));
    kd_prefix_stats s;
    kd_prefix_cache_stats(c, &s);
    ck_assert_uint_eq(s.entries, 5);
    kd_prefix_cache_free(c);
}
END_TEST

/* Prefix i is the single block {i}: independent entries. */
static int has(kd_prefix_cache *c, int32_t i) { return kd_prefix_contains(c, &i, 1, NULL); }
static int put(kd_prefix_cache *c, int32_t i) {
    unsigned char s[4];
    fill_state(s, 4, (uint64_t)i);
    return kd_prefix_insert(c, &i, 1, NULL, s);
}
static int64_t get(kd_prefix_cache *c, int32_t i) {
    const void *p;
    int64_t m = kd_prefix_lookup(c, &i, 1, 1, &p);
    unsigned char s[4];
    fill_state(s, 4, (uint64_t)i);
    if (m) ck_assert(memcmp(p, s, 4) == 0);
    return m;
}

START_TEST(lru_order) {
    kd_prefix_cache *c = mk(4, 3, 1, 0);
    ck_assert(put(c, 1) && put(c, 2) && put(c, 3)); /* LRU order: 1 2 3 */
    ck_assert_int_eq(get(c, 1), 1);                  /* 2 3 1 */
    ck_assert(put(c, 4));                            /* evicts 2: 3 1 4 */
    ck_assert(!has(c, 2) && has(c, 1) && has(c, 3) && has(c, 4));
    ck_assert_int_eq(put(c, 3), 0); /* re-insert touches: 1 4 3 */
    ck_assert(put(c, 5));           /* evicts 1: 4 3 5 */
    ck_assert(!has(c, 1) && has(c, 3) && has(c, 4) && has(c, 5));
    ck_assert_int_eq(get(c, 9), 0); /* a miss touches nothing */
    ck_assert(has(c, 4));           /* contains touches nothing */
    ck_assert(put(c, 6));           /* evicts 4: 3 5 6 */
    ck_assert(!has(c, 4) && has(c, 3) && has(c, 5) && has(c, 6));
    ck_assert_int_eq(get(c, 3), 1); /* 5 6 3 */
    ck_assert_int_eq(get(c, 5), 1); /* 6 3 5 */
    ck_assert(put(c, 7));           /* evicts 6 */
    ck_assert(!has(c, 6) && has(c, 3) && has(c, 5) && has(c, 7));
    ck_assert(put(c, 8)); /* evicts 3 */
    ck_assert(!has(c, 3));
    kd_prefix_stats s;
    kd_prefix_cache_stats(c, &s);
    ck_assert_uint_eq(s.entries, 3);
    ck_assert_uint_eq(s.evictions, 5);
    ck_assert_uint_eq(s.inserts, 8);
    kd_prefix_cache_free(c);

    /* a chain hit refreshes every block it walked, the deepest last */
    c = mk(4, 4, 2, 0);
    int32_t t[6] = {1, 2, 3, 4, 5, 6}, x[2] = {9, 9}, y[2] = {8, 8};
    unsigned char s4[4] = {0};
    ck_assert(kd_prefix_insert(c, t, 2, NULL, s4) && kd_prefix_insert(c, t, 4, NULL, s4));
    ck_assert(kd_prefix_insert(c, x, 2, NULL, s4) && kd_prefix_insert(c, t, 6, NULL, s4));
    const void *p;
    ck_assert_int_eq(kd_prefix_lookup(c, t, 6, INT64_MAX, &p), 3); /* x, t0, t1, t2 */
    ck_assert(kd_prefix_insert(c, y, 2, NULL, s4));                 /* evicts x */
    ck_assert(!kd_prefix_contains(c, x, 2, NULL));
    ck_assert_int_eq(kd_prefix_lookup(c, t, 6, 1, &p), 1); /* t1 t2 y t0 */
    ck_assert(kd_prefix_insert(c, x, 2, NULL, s4));        /* evicts t1 */
    ck_assert(!kd_prefix_contains(c, t, 4, NULL) && kd_prefix_contains(c, t, 6, NULL));
    ck_assert_int_eq(kd_prefix_lookup(c, t, 6, INT64_MAX, &p), 1);
    kd_prefix_cache_free(c);
}
END_TEST

START_TEST(capacity_zero) {
    int32_t t[4] = {1, 2, 3, 4};
    unsigned char s[100] = {0};
    size_t budgets[] = {0, 1, 99};
    for (int i = 0; i < 3; i++) {
        kd_err err = {{0}};
        kd_prefix_cache *c = kd_prefix_cache_create(100, budgets[i], 2, 5, &err);
        ck_assert_msg(c != NULL, "%s", err.msg);
        ck_assert_int_eq(kd_prefix_insert(c, t, 4, NULL, s), 0);
        ck_assert_int_eq(kd_prefix_insert(c, t, 2, NULL, s), 0);
        const void *p = s;
        ck_assert_int_eq(kd_prefix_lookup(c, t, 4, INT64_MAX, &p), 0);
        ck_assert_ptr_null(p);
        ck_assert(!kd_prefix_contains(c, t, 2, &p));
        kd_prefix_cache_clear(c);
        kd_prefix_stats st;
        kd_prefix_cache_stats(c, &st);
        ck_assert_uint_eq(st.capacity, 0);
        ck_assert_uint_eq(st.bytes, 0);
        ck_assert_uint_eq(st.entries, 0);
        ck_assert_uint_eq(st.inserts, 0);
        ck_assert_uint_eq(st.queries, 1);
        ck_assert_uint_eq(st.hits, 0);
        kd_prefix_cache_free(c);
    }
}
END_TEST

START_TEST(reinsert_and_stats) {
    enum { B = 2, S = 10 };
    kd_err err = {{0}};
    kd_prefix_cache *c = kd_prefix_cache_create(S, 3 * S + S - 1, B, 1, &err); /* not a multiple */
    ck_assert(c != NULL);
    int32_t t[8] = {5, 6, 7, 8, 9, 10, 11, 12};
    unsigned char a[S], b[S];
    fill_state(a, S, 1);
    fill_state(b, S, 2);
    ck_assert_int_eq(kd_prefix_insert(c, t, 2, NULL, a), 1);
    ck_assert_int_eq(kd_prefix_insert(c, t, 2, NULL, b), 0); /* no duplicate, no overwrite */
    kd_hash128 k = key_of(kd_prefix_root(c), t, 2, B);
    ck_assert_int_eq(kd_prefix_insert(c, t, 2, &k, b), 0);
    const void *p;
    ck_assert(kd_prefix_contains(c, t, 2, &p));
    ck_assert(memcmp(p, a, S) == 0);
    kd_prefix_stats s;
    kd_prefix_cache_stats(c, &s);
    ck_assert_uint_eq(s.entries, 1);
    ck_assert_uint_eq(s.inserts, 1);
    ck_assert_uint_eq(s.capacity, 3);
    ck_assert_uint_eq(s.bytes, 3 * S);

    ck_assert_int_eq(kd_prefix_insert(c, t, 4, NULL, b), 1);
    ck_assert_int_eq(kd_prefix_lookup(c, t, 8, INT64_MAX, &p), 2); /* hit, 4 tokens */
    ck_assert(memcmp(p, b, S) == 0);
    ck_assert_int_eq(kd_prefix_lookup(c, t, 3, INT64_MAX, &p), 1); /* hit, 2 tokens */
    ck_assert_int_eq(kd_prefix_lookup(c, t + 1, 7, INT64_MAX, &p), 0); /* miss */
    ck_assert_int_eq(kd_prefix_lookup(c, t, 1, INT64_MAX, &p), 0);     /* no whole block */
    ck_assert(kd_prefix_contains(c, t, 4, NULL));                      /* not a query */
    ck_assert_int_eq(kd_prefix_insert(c, t, 6, NULL, a), 1);
    ck_assert_int_eq(kd_prefix_insert(c, t, 8, NULL, a), 1); /* evicts t[0..4) */
    kd_prefix_cache_stats(c, &s);
    ck_assert_uint_eq(s.queries, 4);
    ck_assert_uint_eq(s.hits, 2);
    ck_assert_uint_eq(s.hit_tokens, 6);
    ck_assert_uint_eq(s.inserts, 4);
    ck_assert_uint_eq(s.evictions, 1);
    ck_assert_uint_eq(s.entries, 3);
    ck_assert_uint_eq(s.capacity, 3);

    kd_prefix_cache_clear(c); /* drops entries, keeps counters */
    kd_prefix_cache_stats(c, &s);
    ck_assert_uint_eq(s.entries, 0);
    ck_assert_uint_eq(s.inserts, 4);
    ck_assert_uint_eq(s.queries, 4);
    ck_assert(!kd_prefix_contains(c, t, 4, NULL));
    ck_assert_int_eq(kd_prefix_lookup(c, t, 8, INT64_MAX, &p), 0);
    for (int j = 1; j <= 4; j++) ck_assert_int_eq(kd_prefix_insert(c, t, 2 * j, NULL, a), 1);
    kd_prefix_cache_stats(c, &s);
    ck_assert_uint_eq(s.entries, 3);
    ck_assert_uint_eq(s.evictions, 2);
    kd_prefix_cache_free(c);
}
END_TEST

START_TEST(create_errors) {
    kd_err err = {{0}};
    ck_assert_ptr_null(kd_prefix_cache_create(16, 1024, 0, 1, &err));
    ck_assert(strstr(err.msg, "block") != NULL);
    err.msg[0] = 0;
    ck_assert_ptr_null(kd_prefix_cache_create(16, 1024, -3, 1, &err));
    ck_assert(err.msg[0] != 0);
    err.msg[0] = 0;
    ck_assert_ptr_null(kd_prefix_cache_create(0, 1024, 4, 1, &err));
    ck_assert(strstr(err.msg, "state_bytes") != NULL);
    ck_assert_ptr_null(kd_prefix_cache_create(0, 0, 0, 1, NULL)); /* err may be NULL */
    /* sizes that overflow are refused before allocating */
    err.msg[0] = 0;
    ck_assert_ptr_null(kd_prefix_cache_create(1, SIZE_MAX, 4, 1, &err));
    ck_assert(err.msg[0] != 0);
    err.msg[0] = 0;
    ck_assert_ptr_null(kd_prefix_cache_create(1, SIZE_MAX / 8, 4, 1, &err));
    ck_assert(err.msg[0] != 0);
    kd_prefix_cache_free(NULL);
}
END_TEST

/* ---- model check against a naive reference ---- */

typedef struct ref_entry {
    int32_t *tok; /* copy of the prefix */
    int64_t n;
    unsigned char *state;
    uint64_t tick; /* last use */
} ref_entry;

typedef struct ref_cache {
    ref_entry *e;
    size_t n, cap, sb;
    uint64_t tick;
} ref_cache;

static ref_entry *ref_find(ref_cache *r, const int32_t *t, int64_t n) {
    for (size_t i = 0; i < r->n; i++)
        if (r->e[i].n == n && memcmp(r->e[i].tok, t, (size_t)n * sizeof *t) == 0) return &r->e[i];
    return NULL;
}

static void ref_drop(ref_cache *r, size_t i) {
    free(r->e[i].tok);
    free(r->e[i].state);
    r->e[i] = r->e[--r->n];
}

static int ref_insert(ref_cache *r, const int32_t *t, int64_t n, const unsigned char *state) {
    ref_entry *x = ref_find(r, t, n);
    if (x) return x->tick = ++r->tick, 0;
    if (!r->cap) return 0;
    if (r->n == r->cap) {
        size_t lru = 0;
        for (size_t i = 1; i < r->n; i++)
            if (r->e[i].tick < r->e[lru].tick) lru = i;
        ref_drop(r, lru);
    }
    x = &r->e[r->n++];
    x->tok = malloc((size_t)n * sizeof *t);
    memcpy(x->tok, t, (size_t)n * sizeof *t);
    x->n = n;
    x->state = malloc(r->sb);
    memcpy(x->state, state, r->sb);
    x->tick = ++r->tick;
    return 1;
}

static int64_t ref_lookup(ref_cache *r, const int32_t *t, int64_t n, int64_t max, int32_t block,
                          const unsigned char **state) {
    int64_t got = 0;
    *state = NULL;
    for (int64_t j = 1; j <= n / block && j <= max; j++) {
        ref_entry *x = ref_find(r, t, j * block);
        if (!x) break;
        x->tick = ++r->tick;
        *state = x->state;
        got = j;
    }
    return got;
}

static void ref_clear(ref_cache *r) {
    while (r->n) ref_drop(r, r->n - 1);
}

START_TEST(model_check) {
    kd_test_rng r;
    kd_test_rng_init(&r, kd_test_seed());
    enum { NSEQ = 6, MAXB = 7 };
    long total_evictions = 0, total_hits = 0;
    for (int round = 0; round < 40; round++) {
        int32_t block = 1 + (int32_t)rnd(&r, 4);
        size_t sb = 1 + rnd(&r, 40);
        size_t cap = round % 8 == 0 ? rnd(&r, 2) : round % 4 == 1 ? 8 + rnd(&r, 40) : 1 + rnd(&r, 6);
        int64_t len = (int64_t)MAXB * block + block - 1; /* room for a partial block */
        kd_prefix_cache *c = mk(sb, cap, block, kd_test_rng_u64(&r));
        ref_cache ref = {calloc(cap + 1, sizeof(ref_entry)), 0, cap, sb, 0};
        /* sequences that share prefixes: each copies part of an earlier one, then diverges */
        int32_t seq[NSEQ][MAXB * 4 + 3];
        int32_t vocab = 2 + (int32_t)rnd(&r, 3);
        for (int s = 0; s < NSEQ; s++) {
            int64_t keep = s ? (int64_t)rnd(&r, (uint64_t)len + 1) : 0;
            int p = s ? (int)rnd(&r, (uint64_t)s) : 0;
            for (int64_t i = 0; i < len; i++) seq[s][i] = i < keep ? seq[p][i] : (int32_t)rnd(&r, (uint64_t)vocab);
        }
        unsigned char *st = malloc(sb);
        uint64_t queries = 0, hits = 0, hit_tokens = 0, inserts = 0;
        for (int op = 0; op < 300; op++) {
            const int32_t *t = seq[rnd(&r, NSEQ)];
            uint64_t what = rnd(&r, 100);
            if (what < 45) {
                int64_t n = (1 + (int64_t)rnd(&r, MAXB)) * block;
                fill_state(st, sb, kd_test_rng_u64(&r));
                kd_hash128 k = key_of(kd_prefix_root(c), t, n, block);
                int want = ref_insert(&ref, t, n, st);
                ck_assert_int_eq(kd_prefix_insert(c, t, n, rnd(&r, 2) ? &k : NULL, st), want);
                inserts += (uint64_t)want;
            } else if (what < 80) {
                int64_t n = (int64_t)rnd(&r, (uint64_t)len + 1);
                int64_t max = rnd(&r, 4) ? INT64_MAX : (int64_t)rnd(&r, MAXB + 1);
                const unsigned char *ws;
                const void *p;
                int64_t want = ref_lookup(&ref, t, n, max, block, &ws);
                ck_assert_int_eq(kd_prefix_lookup(c, t, n, max, &p), want);
                queries++;
                if (want) {
                    ck_assert(memcmp(p, ws, sb) == 0);
                    hits++;
                    hit_tokens += (uint64_t)(want * block);
                } else {
                    ck_assert_ptr_null(p);
                }
            } else if (what < 99) {
                int64_t n = (1 + (int64_t)rnd(&r, MAXB)) * block;
                const void *p;
                ref_entry *x = ref_find(&ref, t, n);
                ck_assert_int_eq(kd_prefix_contains(c, t, n, &p), x != NULL);
                if (x) ck_assert(memcmp(p, x->state, sb) == 0);
            } else {
                kd_prefix_cache_clear(c);
                ref_clear(&ref);
            }
            kd_prefix_stats s;
            kd_prefix_cache_stats(c, &s);
            ck_assert_uint_eq(s.entries, ref.n);
        }
        /* every live reference entry is in the cache with its bytes */
        for (size_t i = 0; i < ref.n; i++) {
            const void *p;
            ck_assert(kd_prefix_contains(c, ref.e[i].tok, ref.e[i].n, &p));
            ck_assert(memcmp(p, ref.e[i].state, sb) == 0);
        }
        kd_prefix_stats s;
        kd_prefix_cache_stats(c, &s);
        ck_assert_uint_eq(s.queries, queries);
        ck_assert_uint_eq(s.hits, hits);
        ck_assert_uint_eq(s.hit_tokens, hit_tokens);
        ck_assert_uint_eq(s.inserts, inserts);
        ck_assert_uint_eq(s.capacity, cap);
        total_evictions += (long)s.evictions;
        total_hits += (long)hits;
        ref_clear(&ref);
        free(ref.e);
        free(st);
        kd_prefix_cache_free(c);
    }
    ck_assert_msg(total_evictions > 500 && total_hits > 500, "weak test: %ld evictions, %ld hits",
                  total_evictions, total_hits);
}
END_TEST

int main(void) {
    Suite *s = suite_create("prefix_cache");
    TCase *tc = tcase_create("keys");
    tcase_add_test(tc, keys_match_spec);
    tcase_add_test(tc, keys_sensitivity);
    suite_add_tcase(s, tc);
    tc = tcase_create("cache");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, insert_lookup_random);
    tcase_add_test(tc, longest_contiguous_prefix);
    tcase_add_test(tc, lru_order);
    tcase_add_test(tc, capacity_zero);
    tcase_add_test(tc, reinsert_and_stats);
    tcase_add_test(tc, create_errors);
    tcase_add_test(tc, model_check);
    suite_add_tcase(s, tc);
    return kd_test_run_suite(s);
}
