/* prefix_cache.c: see prefix_cache.h (KDA.md §6).
 *
 * Keys: root = XXH3-128("kdecode-prefix-v1" ‖ fingerprint u64 ‖ block i32), then
 * key_j = XXH3-128(key_{j-1}.lo u64 ‖ key_{j-1}.hi u64 ‖ block j's int32 tokens), every
 * integer as little-endian bytes. The chain hash streams through a stack XXH3 state, so it
 * works for any block size without allocating.
 *
 * Storage, all allocated in create: `pool` holds capacity states of state_bytes each;
 * `ent` the per-entry key and LRU links; `slot` a hash index (open addressing, linear
 * probing, backward-shift deletion, size a power of two >= 2 * capacity, so a probe always
 * reaches an empty slot). Live entries are always ent[0..n): a new one takes ent[n] until
 * the pool is full, then the evicted LRU tail's place.
 *
 * LRU: a doubly linked list, head = most recently used. A lookup hit touches every block it
 * walked, from the first to the deepest, so the returned entry is the most recently used
 * and a hot prefix keeps its ancestors (without them the chain walk could not reach it). */
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include "worker/prefix_cache.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#define KD_NONE SIZE_MAX

typedef struct kd_prefix_entry {
    kd_hash128 key;
    size_t prev, next; /* LRU links (KD_NONE at the ends) */
} kd_prefix_entry;

struct kd_prefix_cache {
    size_t state_bytes, cap, n; /* n live entries: ent[0..n) */
    int32_t block;
    kd_hash128 root;
    unsigned char *pool;
    kd_prefix_entry *ent;
    size_t *slot, mask; /* hash index: entry number or KD_NONE */
    size_t head, tail;  /* LRU: head most recent */
    kd_prefix_stats st;
};

static void put_le64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static void put_le32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static kd_hash128 from_xxh(XXH128_hash_t h) { return (kd_hash128){h.low64, h.high64}; }

static int key_eq(kd_hash128 a, kd_hash128 b) { return a.lo == b.lo && a.hi == b.hi; }

kd_hash128 kd_prefix_chain(kd_hash128 prev, const int32_t *block_tokens, int32_t block) {
    unsigned char buf[1024];
    XXH3_state_t st;
    XXH3_INITSTATE(&st);
    XXH3_128bits_reset(&st);
    put_le64(buf, prev.lo);
    put_le64(buf + 8, prev.hi);
    XXH3_128bits_update(&st, buf, 16);
    for (int32_t i = 0; i < block;) {
        int32_t m = block - i < (int32_t)(sizeof buf / 4) ? block - i : (int32_t)(sizeof buf / 4);
        for (int32_t k = 0; k < m; k++) put_le32(buf + 4 * k, (uint32_t)block_tokens[i + k]);
        XXH3_128bits_update(&st, buf, (size_t)m * 4);
        i += m;
    }
    return from_xxh(XXH3_128bits_digest(&st));
}

static kd_hash128 make_root(uint64_t fingerprint, int32_t block) {
    static const char tag[] = "kdecode-prefix-v1";
    unsigned char buf[sizeof tag - 1 + 8 + 4];
    memcpy(buf, tag, sizeof tag - 1);
    put_le64(buf + sizeof tag - 1, fingerprint);
    put_le32(buf + sizeof tag - 1 + 8, (uint32_t)block);
    return from_xxh(XXH3_128bits(buf, sizeof buf));
}

/* Key of tokens[0..n_tokens); n_tokens must be a positive multiple of the block. */
static kd_hash128 prefix_key(const kd_prefix_cache *c, const int32_t *tokens, int64_t n_tokens) {
    kd_hash128 h = c->root;
    for (int64_t i = 0; i < n_tokens; i += c->block) h = kd_prefix_chain(h, tokens + i, c->block);
    return h;
}

/* ---- hash index ---- */

static size_t home(const kd_prefix_cache *c, kd_hash128 k) { return (size_t)(k.lo ^ k.hi) & c->mask; }

/* Slot position holding key k, or the empty slot where the probe ended (slot[] == KD_NONE). */
static size_t probe(const kd_prefix_cache *c, kd_hash128 k) {
    size_t i = home(c, k);
    while (c->slot[i] != KD_NONE && !key_eq(c->ent[c->slot[i]].key, k)) i = (i + 1) & c->mask;
    return i;
}

static size_t find(const kd_prefix_cache *c, kd_hash128 k) {
    return c->cap ? c->slot[probe(c, k)] : KD_NONE;
}

static void index_remove(kd_prefix_cache *c, kd_hash128 k) {
    size_t i = probe(c, k);
    for (size_t j = i;;) { /* backward shift: pull back later entries whose probe crosses i */
        j = (j + 1) & c->mask;
        if (c->slot[j] == KD_NONE) break;
        size_t h = home(c, c->ent[c->slot[j]].key);
        /* the entry at j may move to i iff its home is not cyclically in (i, j] */
        if (((j - h) & c->mask) >= ((j - i) & c->mask)) {
            c->slot[i] = c->slot[j];
            i = j;
        }
    }
    c->slot[i] = KD_NONE;
}

/* ---- LRU list ---- */

static void lru_unlink(kd_prefix_cache *c, size_t e) {
    kd_prefix_entry *x = &c->ent[e];
    if (x->prev != KD_NONE) c->ent[x->prev].next = x->next;
    else c->head = x->next;
    if (x->next != KD_NONE) c->ent[x->next].prev = x->prev;
    else c->tail = x->prev;
}

static void lru_push_front(kd_prefix_cache *c, size_t e) {
    c->ent[e].prev = KD_NONE;
    c->ent[e].next = c->head;
    if (c->head != KD_NONE) c->ent[c->head].prev = e;
    else c->tail = e;
    c->head = e;
}

static void touch(kd_prefix_cache *c, size_t e) {
    if (c->head == e) return;
    lru_unlink(c, e);
    lru_push_front(c, e);
}

/* ---- public ---- */

kd_prefix_cache *kd_prefix_cache_create(size_t state_bytes, size_t budget_bytes, int32_t block,
                                        uint64_t model_fingerprint, kd_err *err) {
    if (block < 1) return kd_fail(err, "prefix cache: block must be >= 1 (got %d)", (int)block), NULL;
    if (state_bytes == 0) return kd_fail(err, "prefix cache: state_bytes must be > 0"), NULL;
    size_t cap = budget_bytes / state_bytes, tsize = 1;
    while (cap && tsize / 2 < cap) { /* smallest power of two >= 2 * cap */
        if (tsize > SIZE_MAX / 2) return kd_fail(err, "prefix cache: %zu entries overflow", cap), NULL;
        tsize *= 2;
    }
    if (cap && (cap > SIZE_MAX / sizeof(kd_prefix_entry) || tsize > SIZE_MAX / sizeof(size_t)))
        return kd_fail(err, "prefix cache: %zu entries overflow", cap), NULL;

    kd_prefix_cache *c = calloc(1, sizeof *c);
    if (!c) return kd_fail(err, "prefix cache: out of memory"), NULL;
    c->state_bytes = state_bytes;
    c->cap = cap;
    c->block = block;
    c->root = make_root(model_fingerprint, block);
    c->head = c->tail = KD_NONE;
    c->st.capacity = cap;
    c->st.bytes = cap * state_bytes; /* <= budget_bytes: no overflow */
    if (cap) {
        c->pool = malloc(cap * state_bytes);
        c->ent = malloc(cap * sizeof *c->ent);
        c->slot = malloc(tsize * sizeof *c->slot);
        c->mask = tsize - 1;
        if (!c->pool || !c->ent || !c->slot) {
            kd_prefix_cache_free(c);
            return kd_fail(err, "prefix cache: out of memory (%zu entries of %zu bytes)", cap,
                           state_bytes), NULL;
        }
        for (size_t i = 0; i < tsize; i++) c->slot[i] = KD_NONE;
    }
    return c;
}

void kd_prefix_cache_free(kd_prefix_cache *c) {
    if (!c) return;
    free(c->pool);
    free(c->ent);
    free(c->slot);
    free(c);
}

int32_t kd_prefix_cache_block(const kd_prefix_cache *c) { return c->block; }

kd_hash128 kd_prefix_root(const kd_prefix_cache *c) { return c->root; }

int64_t kd_prefix_lookup(kd_prefix_cache *c, const int32_t *tokens, int64_t n, int64_t max_blocks,
                         const void **state) {
    int64_t nb = n > 0 ? n / c->block : 0, got = 0;
    if (nb > max_blocks) nb = max_blocks > 0 ? max_blocks : 0;
    c->st.queries++;
    if (state) *state = NULL;
    if (!c->cap) return 0;
    kd_hash128 h = c->root;
    size_t last = KD_NONE;
    for (int64_t j = 0; j < nb; j++) {
        h = kd_prefix_chain(h, tokens + j * c->block, c->block);
        size_t e = find(c, h);
        if (e == KD_NONE) break;
        touch(c, e); /* first to deepest: the returned entry ends most recent */
        last = e;
        got = j + 1;
    }
    if (got) {
        c->st.hits++;
        c->st.hit_tokens += (uint64_t)got * (uint64_t)c->block;
        if (state) *state = c->pool + last * c->state_bytes;
    }
    return got;
}

int kd_prefix_insert(kd_prefix_cache *c, const int32_t *tokens, int64_t n_tokens,
                     const kd_hash128 *key, const void *state) {
    if (!c->cap || n_tokens <= 0 || n_tokens % c->block) return 0;
    kd_hash128 k = key ? *key : prefix_key(c, tokens, n_tokens);
    size_t i = probe(c, k), e = c->slot[i];
    if (e != KD_NONE) {
        touch(c, e);
        return 0;
    }
    if (c->n < c->cap) e = c->n++;
    else { /* evict the least recently used; its removal may shift the probe's empty slot */
        e = c->tail;
        lru_unlink(c, e);
        index_remove(c, c->ent[e].key);
        c->st.evictions++;
        i = probe(c, k);
    }
    c->ent[e].key = k;
    c->slot[i] = e;
    lru_push_front(c, e);
    memcpy(c->pool + e * c->state_bytes, state, c->state_bytes);
    c->st.inserts++;
    return 1;
}

int kd_prefix_contains(const kd_prefix_cache *c, const int32_t *tokens, int64_t n_tokens,
                       const void **state) {
    if (state) *state = NULL;
    if (!c->cap || n_tokens <= 0 || n_tokens % c->block) return 0;
    size_t e = find(c, prefix_key(c, tokens, n_tokens));
    if (e == KD_NONE) return 0;
    if (state) *state = c->pool + e * c->state_bytes;
    return 1;
}

void kd_prefix_cache_stats(const kd_prefix_cache *c, kd_prefix_stats *out) {
    *out = c->st;
    out->entries = c->n;
}

void kd_prefix_cache_clear(kd_prefix_cache *c) {
    for (size_t i = 0; c->cap && i <= c->mask; i++) c->slot[i] = KD_NONE;
    c->n = 0;
    c->head = c->tail = KD_NONE;
}
