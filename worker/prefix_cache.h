/* prefix_cache.h: exact committed states at block boundaries (align mode, KDA.md §6).
 *
 * The entry for block j of a token sequence holds the state after exactly (j+1)*block
 * tokens (the backend's exported slot state: recurrent state and conv window of every
 * layer). Keys chain: h_0 = H(root, tokens[0..block)), h_j = H(h_{j-1}, block j), with
 * root = H(model fingerprint, block size), 128-bit XXH3, so a key names a whole prefix and
 * a model. Entries live in a pool allocated once at creation (budget / state bytes of
 * them); when full, the least recently used entry is evicted. Single-threaded (the engine
 * thread owns it). Nothing allocates after creation. */
#ifndef KD_PREFIX_CACHE_H
#define KD_PREFIX_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "kd/types.h"

typedef struct kd_hash128 {
    uint64_t lo, hi;
} kd_hash128;

typedef struct kd_prefix_stats {
    uint64_t queries;      /* lookups */
    uint64_t hits;         /* lookups that found at least one block */
    uint64_t hit_tokens;   /* tokens covered by the hits */
    uint64_t inserts;      /* new entries stored */
    uint64_t evictions;
    size_t entries;        /* live entries */
    size_t capacity;       /* entries the budget allows */
    size_t bytes;          /* bytes of the pool (capacity * state_bytes) */
} kd_prefix_stats;

typedef struct kd_prefix_cache kd_prefix_cache;

/* block >= 1; state_bytes > 0. A budget below one state gives capacity 0 (every lookup
 * misses, every insert is dropped) — not an error. NULL with err on out of memory. */
kd_prefix_cache *kd_prefix_cache_create(size_t state_bytes, size_t budget_bytes, int32_t block,
                                        uint64_t model_fingerprint, kd_err *err);
void kd_prefix_cache_free(kd_prefix_cache *c);

int32_t kd_prefix_cache_block(const kd_prefix_cache *c);
kd_hash128 kd_prefix_root(const kd_prefix_cache *c);
/* The key of the block that follows `prev` (block tokens). */
kd_hash128 kd_prefix_chain(kd_hash128 prev, const int32_t *block_tokens, int32_t block);

/* Longest cached prefix of tokens[0..n) made of whole blocks, at most max_blocks blocks.
 * Returns the number of blocks matched (0 on a miss) and points *state at that entry's
 * bytes (valid until the next insert); marks it most recently used; counts a query. */
int64_t kd_prefix_lookup(kd_prefix_cache *c, const int32_t *tokens, int64_t n, int64_t max_blocks,
                         const void **state);

/* Stores `state` as the entry for the prefix tokens[0..n_tokens), n_tokens a positive
 * multiple of the block. key: pass the chain key of that prefix if known (else NULL and it
 * is computed). An existing entry is only marked recently used. Returns 1 stored, 0 already
 * present or no capacity. */
int kd_prefix_insert(kd_prefix_cache *c, const int32_t *tokens, int64_t n_tokens,
                     const kd_hash128 *key, const void *state);

/* Whether the prefix tokens[0..n_tokens) (a multiple of the block) has an entry; does not
 * count as a query or touch the LRU order. Points *state at it when found (tests). */
int kd_prefix_contains(const kd_prefix_cache *c, const int32_t *tokens, int64_t n_tokens,
                       const void **state);

void kd_prefix_cache_stats(const kd_prefix_cache *c, kd_prefix_stats *out);
void kd_prefix_cache_clear(kd_prefix_cache *c);

#endif
