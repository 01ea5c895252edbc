/* engine.h: the decode engine (DESIGN.md "Engine", KDA.md §3-6). One thread owns it: the
 * request slots, the step loop, sampling, drafts and the prefix cache. Callers submit
 * requests and abort them between steps; each step reports new tokens through a callback.
 *
 * A request's life: waiting (no slot yet) -> prefill (its prompt but the last token enters
 * the slot's state in chunks, from the longest cached prefix) -> decode (each step one verify
 * window: the last token x0, not yet in the state, and up to s drafts) -> finished (slot
 * freed). The deferred RecoverSSM keeps pending = 1 + accepted per slot and lets the next
 * verify fold it; rows near a prefix-cache block boundary, and every row in eager mode, are
 * committed right after sampling. Nothing allocates inside a step. */
#ifndef KD_ENGINE_H
#define KD_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "kd/backend.h"
#include "worker/prefix_cache.h"
#include "worker/sample.h"

typedef enum kd_draft_source {
    KD_DRAFT_NONE = 0,   /* s = 0: one token per step */
    KD_DRAFT_NGRAM = 1,  /* prompt lookup over the request's own tokens */
    KD_DRAFT_CALLER = 2, /* drafts supplied with kd_engine_set_drafts before each step */
    KD_DRAFT_ORACLE = 3  /* tests: a known continuation, corrupted at a given rate */
} kd_draft_source;

const char *kd_draft_source_name(kd_draft_source d);
int kd_draft_source_parse(const char *s, kd_draft_source *out);

typedef struct kd_engine_config {
    int32_t max_seqs;           /* request slots */
    int32_t max_queue;          /* waiting requests beyond the slots */
    int32_t max_spec;           /* largest s: verify windows of up to 1 + max_spec tokens */
    int64_t max_batch_tokens;   /* per step: verify windows first, prefill chunks fill the rest;
                                 * at least max_seqs * (1 + max_spec) + 1 */
    int64_t max_model_len;      /* prompt + generated tokens of one request */
    kd_commit_mode commit;
    int32_t prefix_block;       /* 0: no prefix cache; else >= 4 * (max_spec + 1) */
    size_t prefix_cache_bytes;
    int32_t ngram_min, ngram_max; /* defaults for requests that leave them 0 */
    double draft_min_accept;    /* the n-gram and oracle drafters' drafts are verified only while
                                 * the request's recent acceptance predicts at least this many
                                 * accepted tokens a step (engine.c, the draft gate); 0: always */
    int32_t pad_rows;           /* pad each batch with scratch-row windows up to a multiple of
                                 * this (as a captured CUDA graph would); 0 or 1: none */
} kd_engine_config;

void kd_engine_config_defaults(kd_engine_config *c);

typedef struct kd_request_params {
    uint64_t id;                /* unique among live requests */
    const int32_t *prompt;      /* copied at submit */
    int64_t n_prompt;           /* >= 1 */
    int32_t max_tokens;         /* >= 1 */
    kd_sampling sampling;
    int32_t spec_tokens;        /* s, 0..max_spec */
    kd_draft_source draft;
    int32_t ngram_min, ngram_max; /* 0: the worker's defaults */
    const int32_t *stop_ids;    /* copied; generation stops after emitting one of these */
    int32_t n_stop;
    int32_t eos_id;             /* -1: none (or ignore the model's) */
    const int32_t *oracle;      /* KD_DRAFT_ORACLE: the continuation to propose (copied) */
    int32_t n_oracle;
    double oracle_corrupt;      /* probability that a proposed token is replaced */
    void *export_state;         /* if set (kd_backend_state_bytes bytes): the slot's committed
                                 * state is copied here when the request finishes (the prefill
                                 * role hands it to a decode worker) */
} kd_request_params;

typedef enum kd_finish {
    KD_FINISH_NONE = 0,
    KD_FINISH_LENGTH,
    KD_FINISH_STOP,
    KD_FINISH_ABORT,
    KD_FINISH_ERROR
} kd_finish;

const char *kd_finish_name(kd_finish f);

typedef struct kd_usage {
    int64_t prompt_tokens, completion_tokens;
    int64_t cached_tokens;      /* prompt tokens restored from the prefix cache */
    int64_t drafted, accepted;  /* draft tokens verified / accepted (held-back ones not counted) */
    int64_t steps;              /* decode steps (verify windows) */
    double queue_seconds;       /* from submit to a slot */
} kd_usage;

typedef struct kd_event {
    uint64_t id;
    const int32_t *tokens;      /* new tokens (valid during the callback) */
    int32_t n_tokens;
    kd_finish finish;           /* NONE while running */
    kd_usage usage;
    int exported;               /* with the finish: export_state holds the state after every
                                 * prompt and accepted token but the last emitted one */
    int64_t exported_tokens;    /* how many tokens that state holds */
} kd_event;

typedef void (*kd_event_fn)(void *ctx, const kd_event *ev);

typedef enum kd_submit_status {
    KD_SUBMIT_OK = 0,
    KD_SUBMIT_INVALID = -1,     /* bad parameters (err says which) */
    KD_SUBMIT_BUSY = -2,        /* queue full: retry later */
    KD_SUBMIT_DUPLICATE = -3,   /* id already live */
    KD_SUBMIT_NOMEM = -4
} kd_submit_status;

typedef struct kd_engine_stats {
    int32_t slots_total, slots_used, waiting;
    int64_t steps, tokens_generated, drafted, accepted;
    int64_t held;               /* draft tokens proposed but held back by the draft gate */
    int64_t prefill_tokens, cached_tokens;
    int64_t folds, eager_commits, flushes, boundary_snapshots, missed_boundaries;
    kd_prefix_stats prefix;
} kd_engine_stats;

typedef struct kd_engine kd_engine;

/* Takes a loaded, not yet reserved backend (reserved here; the engine does not own it). */
kd_engine *kd_engine_create(kd_backend *be, uint64_t model_fingerprint, const kd_engine_config *cfg,
                            kd_event_fn on_event, void *ctx, kd_err *err);
void kd_engine_free(kd_engine *e);

kd_submit_status kd_engine_submit(kd_engine *e, const kd_request_params *p, kd_err *err);
/* Finishes a request (waiting or running) with KD_FINISH_ABORT; 0, or -1 if unknown. */
int kd_engine_abort(kd_engine *e, uint64_t id);
/* Drafts for the request's next step (KD_DRAFT_CALLER); at most its s are used. */
int kd_engine_set_drafts(kd_engine *e, uint64_t id, const int32_t *drafts, int32_t n);
/* One step. Returns the number of requests that took part (0: nothing to do), -1 on a
 * backend failure (every running request then finishes with KD_FINISH_ERROR). */
int kd_engine_step(kd_engine *e, kd_err *err);
int kd_engine_has_work(const kd_engine *e);
/* kd_engine_config.draft_min_accept from the next step on (benchmarks compare the gate on and off
 * on one engine); 0, or -1 if outside [0, 32]. */
int kd_engine_set_draft_min_accept(kd_engine *e, double min_accept);

/* Disaggregation (a state computed by a prefill worker). A reserved slot belongs to no
 * request until claimed; admission skips it. The slot is reset (its state zero, in the backend's
 * export layout, where a transport may write it directly). Returns the slot or -1 if none is
 * free (or the reset failed). */
int32_t kd_engine_reserve_slot(kd_engine *e);
/* Frees a reserved, unclaimed slot (expired lease, abort, failed transfer). */
int kd_engine_release_slot(kd_engine *e, int32_t slot);
/* Starts a request in a reserved slot whose committed state holds p->prompt but its last
 * token: p->prompt is the prompt followed by the first token the prefill worker sampled,
 * which becomes x0 of the first verify window (no prompt token runs again). */
kd_submit_status kd_engine_submit_reserved(kd_engine *e, int32_t slot, const kd_request_params *p, kd_err *err);
void kd_engine_stats_get(const kd_engine *e, kd_engine_stats *out);

/* Test hooks: a live request's slot (-1 if waiting/unknown), its committed and pending token
 * counts, and its tokens (prompt then generated). */
typedef struct kd_engine_probe {
    int32_t slot;
    int64_t committed, pending;
    const int32_t *tokens;
    int64_t n_tokens;
} kd_engine_probe;
int kd_engine_probe_request(const kd_engine *e, uint64_t id, kd_engine_probe *out);
kd_backend *kd_engine_backend(kd_engine *e);
const kd_prefix_cache *kd_engine_prefix_cache(const kd_engine *e);

#endif
