/* engine.c: the decode engine (see engine.h): admission, batch building, the deferred
 * RecoverSSM bookkeeping (pending counts, folds, flushes, eager commits near prefix-cache
 * boundaries), drafts, acceptance, stop conditions and events. */
#include "worker/engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "worker/spec.h"

static double mono_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

typedef enum { R_WAITING = 1, R_PREFILL, R_DECODE } req_state;

typedef struct req {
    uint64_t id;
    req_state state;
    int32_t slot;                 /* -1 while waiting */
    int32_t *tokens;              /* prompt, then generated tokens */
    int64_t n_tokens, cap, n_prompt;
    int64_t committed;            /* tokens in the slot's committed state */
    int64_t pending;              /* tokens of the last window not yet committed (folded) */
    int32_t generated, max_tokens;
    kd_sampling sampling;
    kd_rng rng, draft_rng;
    int32_t spec, ngram_min, ngram_max;
    kd_ngram_index ngram;         /* KD_DRAFT_NGRAM: the history's index (spec.h), sized at submit */
    kd_draft_source draft;
    int32_t *stop, n_stop, eos;
    int32_t *oracle, n_oracle;
    double corrupt;
    int32_t *caller_drafts, n_caller_drafts;
    /* the draft gate (kd_engine_config.draft_min_accept): the recent share of this request's drafts
     * that were (or, held back, would have been) accepted, and a held-back proposal being judged
     * against the tokens that follow it */
    double accept_share;
    int32_t shadow[32], n_shadow; /* max_spec <= 31 */
    int64_t shadow_at;            /* tokens[shadow_at] is where its first draft would have gone */
    kd_usage usage;
    void *export_state;
    double t_submit;
} req;

struct kd_engine {
    kd_backend *be;
    kd_engine_config cfg;
    kd_event_fn on_event;
    void *ctx;
    int32_t vocab;
    size_t state_bytes;
    req **slots;                  /* [max_seqs] */
    uint8_t *reserved;            /* [max_seqs]: held for an arriving handoff */
    req **queue;                  /* FIFO ring [q_cap]: admitted at the next step if a slot is free */
    int32_t q_head, q_len, q_cap; /* q_cap = max_seqs + max_queue */
    kd_prefix_cache *pc;
    uint32_t rotate;              /* rotates row order between steps */
    /* step buffers, allocated once */
    kd_batch_row *rows;
    req **row_req;
    int32_t *btok;
    kd_sample_params *sparams;    /* [max_rows] */
    double *uniforms;             /* [max_rows][W]: drawn from each request's generator */
    int32_t *stok, *sacc, *sused; /* forward_sample's answers: [max_rows][W], [max_rows] x2 */
    void *snap;
    kd_engine_stats st;
};

const char *kd_draft_source_name(kd_draft_source d) {
    static const char *names[] = {"none", "ngram", "caller", "oracle"};
    return d >= KD_DRAFT_NONE && d <= KD_DRAFT_ORACLE ? names[d] : "?";
}

int kd_draft_source_parse(const char *s, kd_draft_source *out) {
    for (int d = KD_DRAFT_NONE; d <= KD_DRAFT_ORACLE; d++)
        if (!strcmp(s, kd_draft_source_name((kd_draft_source)d))) return *out = (kd_draft_source)d, 0;
    return -1;
}

const char *kd_finish_name(kd_finish f) {
    static const char *names[] = {"none", "length", "stop", "abort", "error"};
    return f >= KD_FINISH_NONE && f <= KD_FINISH_ERROR ? names[f] : "?";
}

void kd_engine_config_defaults(kd_engine_config *c) {
    memset(c, 0, sizeof *c);
    c->max_seqs = 8;
    c->max_queue = 64;
    c->max_spec = 3;
    c->max_batch_tokens = 512;
    c->max_model_len = 8192;
    c->commit = KD_COMMIT_DEFERRED;
    c->ngram_min = 1;
    c->ngram_max = 3;
    c->draft_min_accept = 0.5;
}

/* The draft gate's threshold (kd_engine_config.draft_min_accept): 0 (off) to 32, not NaN. */
static int min_accept_ok(double x) { return x >= 0 && x <= 32; }

static int config_check(const kd_engine_config *c, kd_err *err) {
    if (c->max_seqs < 1 || c->max_seqs > 4096)
        return kd_fail(err, "engine: max_seqs %d must be in [1, 4096]", c->max_seqs);
    if (c->max_queue < 0 || c->max_queue > (1 << 20))
        return kd_fail(err, "engine: max_queue %d out of range", c->max_queue);
    if (c->max_spec < 0 || c->max_spec > 31)
        return kd_fail(err, "engine: spec tokens %d must be in [0, 31]", c->max_spec);
    const int64_t need = (int64_t)c->max_seqs * (1 + c->max_spec) + 1;
    if (c->max_batch_tokens < need || c->max_batch_tokens > (1 << 24))
        return kd_fail(err, "engine: max_batch_tokens %lld must be at least max_seqs*(1+s)+1 = %lld",
                       (long long)c->max_batch_tokens, (long long)need);
    if (c->max_model_len < 2 || c->max_model_len > (1 << 26))
        return kd_fail(err, "engine: max_model_len %lld out of range", (long long)c->max_model_len);
    if (c->prefix_block < 0 ||
        (c->prefix_block > 0 && c->prefix_block < 2 * (2 * (c->max_spec + 1))))
        return kd_fail(err, "engine: prefix block %d must be at least 2*(2*(s+1)) = %d for s = %d",
                       c->prefix_block, 4 * (c->max_spec + 1), c->max_spec);
    if (c->ngram_min < 1 || c->ngram_max < c->ngram_min || c->ngram_max > 64)
        return kd_fail(err, "engine: ngram sizes [%d, %d] invalid", c->ngram_min, c->ngram_max);
    if (!min_accept_ok(c->draft_min_accept))
        return kd_fail(err, "engine: draft_min_accept %g must be in [0, 32]", c->draft_min_accept);
    if (c->pad_rows < 0 || c->pad_rows > 256)
        return kd_fail(err, "engine: pad_rows %d out of range", c->pad_rows);
    return 0;
}

void kd_engine_free(kd_engine *e) {
    if (!e) return;
    for (int32_t s = 0; e->slots && s < e->cfg.max_seqs; s++)
        if (e->slots[s]) {
            req *r = e->slots[s];
            free(r->tokens), free(r->stop), free(r->oracle), free(r->caller_drafts), free(r);
        }
    for (int32_t i = 0; e->queue && i < e->q_len; i++) {
        req *r = e->queue[(e->q_head + i) % e->q_cap];
        free(r->tokens), free(r->stop), free(r->oracle), free(r->caller_drafts), free(r);
    }
    kd_prefix_cache_free(e->pc);
    free(e->slots), free(e->reserved), free(e->queue), free(e->rows), free(e->row_req), free(e->btok);
    free(e->sparams), free(e->uniforms), free(e->stok), free(e->sacc), free(e->sused), free(e->snap);
    free(e);
}

kd_engine *kd_engine_create(kd_backend *be, uint64_t model_fingerprint, const kd_engine_config *cfg,
                            kd_event_fn on_event, void *ctx, kd_err *err) {
    if (config_check(cfg, err)) return NULL;
    kd_engine *e = calloc(1, sizeof *e);
    if (!e) return kd_fail(err, "engine: out of memory"), NULL;
    e->be = be, e->cfg = *cfg, e->on_event = on_event, e->ctx = ctx;
    e->vocab = be->config.vocab;
    const int32_t pad = cfg->pad_rows > 1 ? cfg->pad_rows : 1;
    const int32_t max_rows = cfg->max_seqs + pad;
    const int64_t max_tokens = cfg->max_batch_tokens + pad;
    if (kd_backend_reserve(be, cfg->max_seqs, max_rows, max_tokens, 1 + cfg->max_spec, cfg->commit,
                           err)) {
        free(e);
        return NULL;
    }
    e->state_bytes = kd_backend_state_bytes(be);
    const size_t W = (size_t)(1 + cfg->max_spec);
    e->slots = calloc((size_t)cfg->max_seqs, sizeof *e->slots);
    e->reserved = calloc((size_t)cfg->max_seqs, 1);
    e->q_cap = cfg->max_seqs + cfg->max_queue;
    e->queue = calloc((size_t)e->q_cap, sizeof *e->queue);
    e->rows = calloc((size_t)max_rows, sizeof *e->rows);
    e->row_req = calloc((size_t)max_rows, sizeof *e->row_req);
    e->btok = calloc((size_t)max_tokens, sizeof *e->btok);
    e->sparams = calloc((size_t)max_rows, sizeof *e->sparams);
    e->uniforms = calloc((size_t)max_rows * W, sizeof *e->uniforms);
    e->stok = calloc((size_t)max_rows * W, sizeof *e->stok);
    e->sacc = calloc((size_t)max_rows, sizeof *e->sacc);
    e->sused = calloc((size_t)max_rows, sizeof *e->sused);
    e->snap = malloc(e->state_bytes);
    if (!e->slots || !e->reserved || !e->queue || !e->rows || !e->row_req || !e->btok || !e->sparams ||
        !e->uniforms || !e->stok || !e->sacc || !e->sused || !e->snap) {
        kd_engine_free(e);
        return kd_fail(err, "engine: out of memory"), NULL;
    }
    if (cfg->prefix_block > 0 &&
        !(e->pc = kd_prefix_cache_create(e->state_bytes, cfg->prefix_cache_bytes, cfg->prefix_block,
                                         model_fingerprint, err))) {
        kd_engine_free(e);
        return NULL;
    }
    e->st.slots_total = cfg->max_seqs;
    return e;
}

/* ------------------------------------------------------------------------- requests */

static req *find(const kd_engine *e, uint64_t id) {
    for (int32_t s = 0; s < e->cfg.max_seqs; s++)
        if (e->slots[s] && e->slots[s]->id == id) return e->slots[s];
    for (int32_t i = 0; i < e->q_len; i++) {
        req *r = e->queue[(e->q_head + i) % e->q_cap];
        if (r->id == id) return r;
    }
    return NULL;
}

static void req_free(req *r) {
    kd_ngram_index_free(&r->ngram);
    free(r->tokens), free(r->stop), free(r->oracle), free(r->caller_drafts), free(r);
}

static int32_t *dup_ids(const int32_t *p, int64_t n) {
    int32_t *d = malloc((size_t)(n > 0 ? n : 1) * sizeof *d);
    if (d && n > 0) memcpy(d, p, (size_t)n * sizeof *d);
    return d;
}

/* Checks a request and builds it (not yet queued or placed). */
static kd_submit_status make_request(kd_engine *e, const kd_request_params *p, req **out, kd_err *err) {
    const char *why;
    const int32_t V = e->vocab;
    if (!p->prompt || p->n_prompt < 1)
        return kd_fail(err, "request %llu: empty prompt", (unsigned long long)p->id), KD_SUBMIT_INVALID;
    if (p->max_tokens < 1)
        return kd_fail(err, "request %llu: max_tokens must be >= 1", (unsigned long long)p->id), KD_SUBMIT_INVALID;
    if (p->n_prompt + p->max_tokens > e->cfg.max_model_len)
        return kd_fail(err, "request %llu: prompt (%lld) + max_tokens (%d) exceeds the model length %lld",
                       (unsigned long long)p->id, (long long)p->n_prompt, p->max_tokens,
                       (long long)e->cfg.max_model_len), KD_SUBMIT_INVALID;
    for (int64_t i = 0; i < p->n_prompt; i++)
        if (p->prompt[i] < 0 || p->prompt[i] >= V)
            return kd_fail(err, "request %llu: prompt token %d at %lld outside the vocabulary [0, %d)",
                           (unsigned long long)p->id, p->prompt[i], (long long)i, V), KD_SUBMIT_INVALID;
    if (kd_sampling_check(&p->sampling, &why))
        return kd_fail(err, "request %llu: %s", (unsigned long long)p->id, why), KD_SUBMIT_INVALID;
    if (p->spec_tokens < 0 || p->spec_tokens > e->cfg.max_spec)
        return kd_fail(err, "request %llu: spec tokens %d must be in [0, %d]", (unsigned long long)p->id,
                       p->spec_tokens, e->cfg.max_spec), KD_SUBMIT_INVALID;
    if (p->draft < KD_DRAFT_NONE || p->draft > KD_DRAFT_ORACLE)
        return kd_fail(err, "request %llu: unknown draft source", (unsigned long long)p->id), KD_SUBMIT_INVALID;
    if (p->ngram_min < 0 || p->ngram_max < 0 || p->ngram_min > 64 || p->ngram_max > 64 ||
        (p->ngram_min && p->ngram_max && p->ngram_max < p->ngram_min))
        return kd_fail(err, "request %llu: bad ngram sizes", (unsigned long long)p->id), KD_SUBMIT_INVALID;
    if (p->n_stop < 0 || p->n_stop > 1024 || (p->n_stop && !p->stop_ids))
        return kd_fail(err, "request %llu: bad stop ids", (unsigned long long)p->id), KD_SUBMIT_INVALID;
    for (int32_t i = 0; i < p->n_stop; i++)
        if (p->stop_ids[i] < 0 || p->stop_ids[i] >= V)
            return kd_fail(err, "request %llu: stop id %d outside the vocabulary", (unsigned long long)p->id,
                           p->stop_ids[i]), KD_SUBMIT_INVALID;
    if (p->eos_id < -1 || p->eos_id >= V)
        return kd_fail(err, "request %llu: eos id %d outside the vocabulary", (unsigned long long)p->id,
                       p->eos_id), KD_SUBMIT_INVALID;
    if (p->n_oracle < 0 || (p->n_oracle && !p->oracle) || !(p->oracle_corrupt >= 0 && p->oracle_corrupt <= 1))
        return kd_fail(err, "request %llu: bad oracle drafts", (unsigned long long)p->id), KD_SUBMIT_INVALID;
    for (int32_t i = 0; i < p->n_oracle; i++)
        if (p->oracle[i] < 0 || p->oracle[i] >= V)
            return kd_fail(err, "request %llu: oracle token outside the vocabulary", (unsigned long long)p->id),
                   KD_SUBMIT_INVALID;
    if (find(e, p->id))
        return kd_fail(err, "request %llu: id already in use", (unsigned long long)p->id), KD_SUBMIT_DUPLICATE;
    req *r = calloc(1, sizeof *r);
    if (!r) return kd_fail(err, "out of memory"), KD_SUBMIT_NOMEM;
    r->id = p->id;
    r->cap = p->n_prompt + p->max_tokens + e->cfg.max_spec + 1;
    r->tokens = malloc((size_t)r->cap * sizeof *r->tokens);
    r->stop = dup_ids(p->stop_ids, p->n_stop);
    r->oracle = dup_ids(p->oracle, p->n_oracle);
    r->caller_drafts = malloc((size_t)(e->cfg.max_spec + 1) * sizeof *r->caller_drafts);
    if (!r->tokens || !r->stop || !r->oracle || !r->caller_drafts) {
        req_free(r);
        return kd_fail(err, "out of memory"), KD_SUBMIT_NOMEM;
    }
    memcpy(r->tokens, p->prompt, (size_t)p->n_prompt * sizeof *r->tokens);
    r->n_tokens = r->n_prompt = p->n_prompt;
    r->slot = -1;
    r->state = R_WAITING;
    r->max_tokens = p->max_tokens;
    r->sampling = p->sampling;
    kd_rng_seed(&r->rng, p->sampling.seed);
    kd_rng_seed(&r->draft_rng, p->sampling.seed ^ 0x5deece66dull);
    r->spec = p->spec_tokens;
    r->draft = p->spec_tokens > 0 ? p->draft : KD_DRAFT_NONE;
    r->ngram_min = p->ngram_min ? p->ngram_min : e->cfg.ngram_min;
    r->ngram_max = p->ngram_max ? p->ngram_max : e->cfg.ngram_max;
    if (r->ngram_max < r->ngram_min) r->ngram_max = r->ngram_min;
    /* the proposer's index of the history: a step's lookup walks the matches of the suffix's n-grams,
     * longest first, instead of scanning the whole history (spec.h; tests/bench/results/ngram_cpu.md) */
    if (r->draft == KD_DRAFT_NGRAM && kd_ngram_index_init(&r->ngram, r->cap, r->ngram_min, r->ngram_max)) {
        const long long cap = (long long)r->cap;
        req_free(r);
        return kd_fail(err, "request %llu: out of memory (n-gram index of %lld tokens)", (unsigned long long)p->id,
                       cap), KD_SUBMIT_NOMEM;
    }
    r->n_stop = p->n_stop;
    r->eos = p->eos_id;
    r->n_oracle = p->n_oracle;
    r->corrupt = p->oracle_corrupt;
    r->usage.prompt_tokens = p->n_prompt;
    r->export_state = p->export_state;
    r->accept_share = 1; /* a new request drafts until its drafts prove poor */
    r->t_submit = mono_s();
    *out = r;
    return KD_SUBMIT_OK;
}

kd_submit_status kd_engine_submit(kd_engine *e, const kd_request_params *p, kd_err *err) {
    int32_t free_slots = 0;
    for (int32_t s = 0; s < e->cfg.max_seqs; s++) free_slots += !e->slots[s] && !e->reserved[s];
    if (e->q_len >= free_slots + e->cfg.max_queue || e->q_len >= e->q_cap)
        return kd_fail(err, "request %llu: queue full (%d waiting)", (unsigned long long)p->id, e->q_len),
               KD_SUBMIT_BUSY;
    req *r;
    kd_submit_status rc = make_request(e, p, &r, err);
    if (rc != KD_SUBMIT_OK) return rc;
    e->queue[(e->q_head + e->q_len) % e->q_cap] = r;
    e->q_len++;
    return KD_SUBMIT_OK;
}

int32_t kd_engine_reserve_slot(kd_engine *e) {
    /* A handoff writes every byte of the state and checks every section's sum before the slot
     * can be claimed (a partial or unverified one is released instead). The reset before makes
     * the slot's state the backend's export layout, where a transport writes it directly
     * (kd_backend_state_regions: a GPU backend keeps the conv windows of running slots elsewhere). */
    for (int32_t s = 0; s < e->cfg.max_seqs; s++)
        if (!e->slots[s] && !e->reserved[s]) {
            kd_err err;
            if (kd_backend_reset_slot(e->be, s, &err)) return -1;
            e->reserved[s] = 1;
            return s;
        }
    return -1;
}

int kd_engine_release_slot(kd_engine *e, int32_t slot) {
    if (slot < 0 || slot >= e->cfg.max_seqs || !e->reserved[slot]) return -1;
    e->reserved[slot] = 0;
    return 0;
}

kd_submit_status kd_engine_submit_reserved(kd_engine *e, int32_t slot, const kd_request_params *p, kd_err *err) {
    if (slot < 0 || slot >= e->cfg.max_seqs || !e->reserved[slot])
        return kd_fail(err, "slot %d is not reserved", slot), KD_SUBMIT_INVALID;
    if (p->n_prompt < 2)
        return kd_fail(err, "a handed-over request needs its prompt and first token"), KD_SUBMIT_INVALID;
    req *r;
    kd_submit_status rc = make_request(e, p, &r, err);
    if (rc != KD_SUBMIT_OK) return rc;
    e->reserved[slot] = 0;
    e->slots[slot] = r;
    r->slot = slot;
    r->committed = r->n_prompt - 1;
    r->state = R_DECODE;
    return KD_SUBMIT_OK;
}

int kd_engine_set_drafts(kd_engine *e, uint64_t id, const int32_t *drafts, int32_t n) {
    req *r = find(e, id);
    if (!r || n < 0 || (n && !drafts)) return -1;
    if (n > e->cfg.max_spec) n = e->cfg.max_spec;
    for (int32_t i = 0; i < n; i++)
        if (drafts[i] < 0 || drafts[i] >= e->vocab) return -1;
    memcpy(r->caller_drafts, drafts, (size_t)n * sizeof *drafts);
    r->n_caller_drafts = n;
    return 0;
}

/* -------------------------------------------------------------- commits and the cache */

/* Commits the first n tokens of the slot's last window now; if the prefix cache is on and a
 * block boundary m lies in (committed, committed + n], the commit also writes the exact
 * state after m tokens, stored as the entry of tokens[0..m). */
static int commit_now(kd_engine *e, req *r, int64_t n, kd_err *err) {
    int32_t snap_at = 0;
    int64_t m = 0;
    if (e->pc) {
        const int64_t block = e->cfg.prefix_block;
        m = (r->committed / block + 1) * block;
        if (m <= r->committed + n) snap_at = (int32_t)(m - r->committed);
    }
    if (kd_backend_commit(e->be, r->slot, (int32_t)n, snap_at, snap_at ? e->snap : NULL, err)) return -1;
    if (snap_at) {
        kd_prefix_insert(e->pc, r->tokens, m, NULL, e->snap);
        e->st.boundary_snapshots++;
    }
    r->committed += n;
    r->pending = 0;
    return 0;
}

/* A flush trigger (KDA.md §5): the slot's pending tokens are committed outside a verify. */
static int flush(kd_engine *e, req *r, kd_err *err) {
    if (r->slot < 0 || r->pending == 0) return 0;
    e->st.flushes++;
    return commit_now(e, r, r->pending, err);
}

/* The seed's rule for rows whose window may reach a block boundary before the next step's
 * fold: decided from the step's inputs only (the committed length and the window). */
static int near_boundary(const kd_engine *e, const req *r, int32_t window) {
    const int64_t block = e->cfg.prefix_block, margin = 2 * (e->cfg.max_spec + 1);
    const int64_t end = r->committed + window, low = end - window - margin, high = end + margin;
    return low < 0 || (low / block) != (high / block);
}

/* Whether committing the request's pending tokens would store a prefix-cache snapshot (a
 * block boundary within them: commit_now's snap_at). */
static int flush_snapshots(const kd_engine *e, const req *r) {
    if (!e->pc || r->pending == 0) return 0;
    const int64_t block = e->cfg.prefix_block;
    return (r->committed / block + 1) * block <= r->committed + r->pending;
}

/* Ends a request: free its slot, report. Its pending tokens are committed (a flush trigger)
 * only where the state leaves the slot (KDA.md §5): an export, or a prefix-cache snapshot at a
 * block boundary they reach. Otherwise the state goes with the request (the slot's next owner
 * resets it, records and all), and folding them would be work for nothing: on a GPU an eager
 * commit of every layer, about 0.18 ms on the step loop for each finishing request (the 48B
 * preset on an H100; tests/bench/results/e2e_finish_h100.md). */
static void finish(kd_engine *e, req *r, kd_finish why, const int32_t *toks, int32_t n) {
    kd_err err;
    int exported = 0;
    if (r->slot >= 0) {
        const int export = r->export_state && why != KD_FINISH_ERROR && why != KD_FINISH_ABORT;
        if ((export || flush_snapshots(e, r)) && flush(e, r, &err)) why = KD_FINISH_ERROR;
        if (export && why != KD_FINISH_ERROR &&
            kd_backend_state_read(e->be, r->slot, r->export_state, e->state_bytes, &err) == 0)
            exported = 1;
        e->slots[r->slot] = NULL;
    }
    r->usage.completion_tokens = r->generated;
    kd_event ev = {.id = r->id, .tokens = toks, .n_tokens = n, .finish = why, .usage = r->usage,
                   .exported = exported, .exported_tokens = r->committed};
    if (e->on_event) e->on_event(e->ctx, &ev);
    req_free(r);
}

int kd_engine_abort(kd_engine *e, uint64_t id) {
    for (int32_t i = 0; i < e->q_len; i++) {
        int32_t at = (e->q_head + i) % e->q_cap;
        if (e->queue[at]->id != id) continue;
        req *r = e->queue[at];
        for (int32_t j = i; j + 1 < e->q_len; j++) /* close the gap, keeping FIFO order */
            e->queue[(e->q_head + j) % e->q_cap] = e->queue[(e->q_head + j + 1) % e->q_cap];
        e->q_len--;
        finish(e, r, KD_FINISH_ABORT, NULL, 0);
        return 0;
    }
    for (int32_t s = 0; s < e->cfg.max_seqs; s++)
        if (e->slots[s] && e->slots[s]->id == id) {
            finish(e, e->slots[s], KD_FINISH_ABORT, NULL, 0);
            return 0;
        }
    return -1;
}

/* ---------------------------------------------------------------------------- steps */

static int admit(kd_engine *e, kd_err *err) {
    for (int32_t s = 0; s < e->cfg.max_seqs && e->q_len > 0; s++) {
        if (e->slots[s] || e->reserved[s]) continue;
        req *r = e->queue[e->q_head];
        e->q_head = (e->q_head + 1) % e->q_cap;
        e->q_len--;
        if (kd_backend_reset_slot(e->be, s, err)) {
            finish(e, r, KD_FINISH_ERROR, NULL, 0);
            return -1;
        }
        r->slot = s;
        e->slots[s] = r;
        r->usage.queue_seconds = mono_s() - r->t_submit;
        const int64_t target = r->n_prompt - 1; /* the last prompt token is x0 of decode */
        if (e->pc && target >= e->cfg.prefix_block) {
            const void *state = NULL;
            int64_t nb = kd_prefix_lookup(e->pc, r->tokens, target, target / e->cfg.prefix_block, &state);
            if (nb > 0) {
                if (kd_backend_state_write(e->be, s, state, e->state_bytes, err)) {
                    finish(e, r, KD_FINISH_ERROR, NULL, 0);
                    return -1;
                }
                r->committed = nb * e->cfg.prefix_block;
                r->usage.cached_tokens = r->committed;
                e->st.cached_tokens += r->committed;
            }
        }
        r->state = r->committed == target ? R_DECODE : R_PREFILL;
    }
    return 0;
}

/* Drafts for a decode row, written to out; returns how many. */
static int32_t propose(kd_engine *e, req *r, int32_t *out) {
    int32_t s = r->spec;
    const int32_t room = r->max_tokens - r->generated - 1; /* never draft past max_tokens */
    if (s > room) s = room;
    if (s <= 0) return 0;
    switch (r->draft) {
    case KD_DRAFT_NGRAM:
        return kd_ngram_index_propose(&r->ngram, r->tokens, r->n_tokens, r->ngram_max, s, out);
    case KD_DRAFT_CALLER: {
        int32_t n = r->n_caller_drafts < s ? r->n_caller_drafts : s;
        memcpy(out, r->caller_drafts, (size_t)n * sizeof *out);
        r->n_caller_drafts = 0;
        return n;
    }
    case KD_DRAFT_ORACLE: {
        int32_t n = 0;
        for (; n < s && r->generated + n < r->n_oracle; n++) {
            int32_t d = r->oracle[r->generated + n];
            if (r->corrupt > 0 && kd_rng_uniform(&r->draft_rng) < r->corrupt)
                d = (int32_t)((d + 1 + kd_rng_next(&r->draft_rng) % (uint64_t)(e->vocab - 1)) % (uint64_t)e->vocab);
            out[n] = d;
        }
        return n;
    }
    default:
        return 0;
    }
}

/* The draft gate. A drafter the worker runs itself (n-gram, oracle) proposes every step, but its
 * drafts are verified only while the request's recent acceptance predicts at least
 * draft_min_accept accepted tokens for them (accept_share x their number); drafts that would not
 * pay for their verify window's cost to the step (every row of a step runs at its longest window
 * on the GPU) are held back. A held-back proposal is judged against the tokens the request then
 * generates, the drafts it would have had accepted (greedy: the same; sampling: a draft equal to
 * the token drawn has the chance of acceptance, the target probability), so acceptance is
 * learned while drafts are held and they come back when the text turns repetitive. The decision
 * depends on the request's own tokens only: its tokens, and a seeded request's samples, do not
 * depend on the other requests of the batch or on timing. Caller drafts are always verified. */
#define GATE_RATE 0.5 /* weight of the newest outcome in accept_share */

static void gate_learn(req *r, int32_t accepted, int32_t drafted) {
    r->accept_share += GATE_RATE * ((double)accepted / drafted - r->accept_share);
}

static int gate_holds(const kd_engine *e, const req *r, int32_t n) {
    return e->cfg.draft_min_accept > 0 && (r->draft == KD_DRAFT_NGRAM || r->draft == KD_DRAFT_ORACLE) &&
           r->accept_share * n < e->cfg.draft_min_accept;
}

/* A held-back proposal against the tokens generated since: judged once it is wrong or whole. */
static void gate_judge(req *r) {
    if (!r->n_shadow) return;
    const int64_t have = r->n_tokens - r->shadow_at;
    int32_t m = 0;
    while (m < r->n_shadow && m < have && r->tokens[r->shadow_at + m] == r->shadow[m]) m++;
    if (m < r->n_shadow && m == have) return; /* right so far: more tokens to come */
    gate_learn(r, m, r->n_shadow);
    r->n_shadow = 0;
}

/* Appends up to n new tokens, stopping after a stop token or at max_tokens. Returns how
 * many were appended; *why says whether the request is done. */
static int32_t append(kd_engine *e, req *r, const int32_t *toks, int32_t n, kd_finish *why) {
    *why = KD_FINISH_NONE;
    int32_t k = 0;
    while (k < n && *why == KD_FINISH_NONE) {
        const int32_t t = toks[k++];
        r->tokens[r->n_tokens++] = t;
        r->generated++;
        if (t == r->eos) *why = KD_FINISH_STOP;
        for (int32_t i = 0; i < r->n_stop && *why == KD_FINISH_NONE; i++)
            if (t == r->stop[i]) *why = KD_FINISH_STOP;
        if (*why == KD_FINISH_NONE && r->generated >= r->max_tokens) *why = KD_FINISH_LENGTH;
    }
    e->st.tokens_generated += k;
    return k;
}

static void fail_all(kd_engine *e) {
    for (int32_t s = 0; s < e->cfg.max_seqs; s++)
        if (e->slots[s]) {
            e->slots[s]->pending = 0; /* the backend failed: nothing to commit */
            finish(e, e->slots[s], KD_FINISH_ERROR, NULL, 0);
        }
}

int kd_engine_step(kd_engine *e, kd_err *err) {
    if (admit(e, err)) return -1;
    const int32_t S = e->cfg.max_seqs;
    int32_t nrows = 0;
    int64_t ntok = 0, budget = e->cfg.max_batch_tokens;
    /* verify windows of running requests, in an order that changes from step to step */
    for (int32_t i = 0; i < S; i++) {
        req *r = e->slots[(i + e->rotate) % S];
        if (!r || r->state != R_DECODE) continue;
        int32_t *win = e->btok + ntok;
        win[0] = r->tokens[r->n_tokens - 1];
        /* the window may differ in length from the last one: the fold reads the last window's
         * records by position (kd_batch_row.fold: 0..its length), so a change of T is not a
         * flush trigger here (KDA.md lists it for layouts whose records follow the window's T) */
        int32_t nd = propose(e, r, win + 1);
        if (nd > 0 && gate_holds(e, r, nd)) {
            if (!r->n_shadow) {
                memcpy(r->shadow, win + 1, (size_t)nd * sizeof *win);
                r->n_shadow = nd, r->shadow_at = r->n_tokens;
            }
            e->st.held += nd;
            nd = 0;
        }
        const int32_t window = 1 + nd;
        e->rows[nrows] = (kd_batch_row){.slot = r->slot, .n_tokens = window, .logits = KD_LOGITS_ALL,
                                        .kind = KD_ROW_VERIFY, .fold = (int32_t)r->pending};
        /* sampling on the backend: the request's parameters and, when it samples, the next
         * `window` uniforms of its generator (peeked; it advances by those used) */
        e->sparams[nrows] = (kd_sample_params){.temperature = r->sampling.temperature,
                                               .top_p = r->sampling.top_p, .top_k = r->sampling.top_k};
        if (r->sampling.temperature > 0) {
            kd_rng peek = r->rng;
            double *u = e->uniforms + (size_t)nrows * (size_t)(1 + e->cfg.max_spec);
            for (int32_t j = 0; j < window; j++) u[j] = kd_rng_uniform(&peek);
        }
        e->row_req[nrows++] = r;
        ntok += window;
        budget -= window;
    }
    /* prefill chunks fill the rest; with the prefix cache they end on block boundaries */
    for (int32_t i = 0; i < S && budget > 0; i++) {
        req *r = e->slots[(i + e->rotate) % S];
        if (!r || r->state != R_PREFILL) continue;
        int64_t chunk = r->n_prompt - 1 - r->committed;
        if (chunk > budget) chunk = budget;
        if (e->pc) {
            const int64_t next = (r->committed / e->cfg.prefix_block + 1) * e->cfg.prefix_block;
            if (r->committed + chunk > next) chunk = next - r->committed;
        }
        memcpy(e->btok + ntok, r->tokens + r->committed, (size_t)chunk * sizeof *e->btok);
        e->rows[nrows] = (kd_batch_row){.slot = r->slot, .n_tokens = (int32_t)chunk,
                                        .logits = KD_LOGITS_NONE, .kind = KD_ROW_PREFILL};
        e->row_req[nrows++] = r;
        ntok += chunk;
        budget -= chunk;
    }
    if (nrows == 0) return 0;
    const int32_t live = nrows;
    while (e->cfg.pad_rows > 1 && nrows % e->cfg.pad_rows) { /* padding: the scratch row */
        e->btok[ntok++] = 0;
        e->rows[nrows] = (kd_batch_row){.slot = S, .n_tokens = 1, .logits = KD_LOGITS_NONE,
                                        .kind = KD_ROW_VERIFY};
        e->row_req[nrows++] = NULL;
    }
    kd_batch batch = {.n_rows = nrows, .rows = e->rows, .tokens = e->btok};
    /* forward and sampling on the backend: only tokens come back */
    if (kd_backend_forward_sample(e->be, &batch, e->sparams, e->uniforms, e->stok, e->sacc, e->sused, err))
        goto fail;
    e->st.steps++;
    e->rotate++;

    for (int32_t i = 0; i < nrows; i++) {
        req *r = e->row_req[i];
        const kd_batch_row *row = &e->rows[i];
        if (!r) continue;
        if (row->kind == KD_ROW_PREFILL) {
            r->committed += row->n_tokens;
            e->st.prefill_tokens += row->n_tokens;
            if (e->pc && r->committed % e->cfg.prefix_block == 0) {
                if (kd_backend_state_read(e->be, r->slot, e->snap, e->state_bytes, err)) goto fail;
                kd_prefix_insert(e->pc, r->tokens, r->committed, NULL, e->snap);
                e->st.boundary_snapshots++;
            }
            if (r->committed == r->n_prompt - 1) r->state = R_DECODE;
            continue;
        }
        /* verify: the fold happened at the start of this window */
        if (row->fold > 0) e->st.folds++;
        r->committed += row->fold;
        r->pending = 0;
        const int32_t window = row->n_tokens;
        const int32_t a = e->sacc[i];
        const int32_t *emit = e->stok + (size_t)i * (size_t)(1 + e->cfg.max_spec);
        for (int32_t j = 0; j < e->sused[i]; j++) kd_rng_uniform(&r->rng);
        r->usage.steps++;
        r->usage.drafted += window - 1;
        r->usage.accepted += a;
        e->st.drafted += window - 1;
        e->st.accepted += a;
        kd_finish why;
        const int32_t k = append(e, r, emit, 1 + a, &why);
        if (window > 1) gate_learn(r, a, window - 1);
        gate_judge(r);
        /* x0 and the accepted drafts enter the state; if a stop token cut the window short,
         * only those that are part of the request's tokens (a snapshot key must be real) */
        const int64_t n = 1 + (k < a ? k : a);
        if (e->cfg.commit == KD_COMMIT_EAGER || (e->pc && near_boundary(e, r, window))) {
            if (commit_now(e, r, n, err)) goto fail;
            e->st.eager_commits++;
        } else {
            if (e->pc && (r->committed / e->cfg.prefix_block) !=
                             ((r->committed + n) / e->cfg.prefix_block))
                e->st.missed_boundaries++; /* the margin rule failed: never expected */
            r->pending = n;
        }
        if (why != KD_FINISH_NONE) {
            finish(e, r, why, emit, k);
        } else {
            kd_event ev = {.id = r->id, .tokens = emit, .n_tokens = k, .usage = r->usage};
            if (e->on_event) e->on_event(e->ctx, &ev);
        }
    }
    return live;
fail:
    fail_all(e);
    return -1;
}

int kd_engine_set_draft_min_accept(kd_engine *e, double min_accept) {
    if (!min_accept_ok(min_accept)) return -1;
    e->cfg.draft_min_accept = min_accept;
    return 0;
}

int kd_engine_has_work(const kd_engine *e) {
    if (e->q_len) return 1;
    for (int32_t s = 0; s < e->cfg.max_seqs; s++)
        if (e->slots[s]) return 1;
    return 0;
}

void kd_engine_stats_get(const kd_engine *e, kd_engine_stats *out) {
    *out = e->st;
    out->slots_used = 0;
    for (int32_t s = 0; s < e->cfg.max_seqs; s++) out->slots_used += e->slots[s] != NULL || e->reserved[s];
    out->waiting = e->q_len;
    if (e->pc) kd_prefix_cache_stats(e->pc, &out->prefix);
    else memset(&out->prefix, 0, sizeof out->prefix);
}

int kd_engine_probe_request(const kd_engine *e, uint64_t id, kd_engine_probe *out) {
    const req *r = find(e, id);
    if (!r) return -1;
    *out = (kd_engine_probe){.slot = r->slot, .committed = r->committed, .pending = r->pending,
                             .tokens = r->tokens, .n_tokens = r->n_tokens};
    return 0;
}

kd_backend *kd_engine_backend(kd_engine *e) { return e->be; }
const kd_prefix_cache *kd_engine_prefix_cache(const kd_engine *e) { return e->pc; }
