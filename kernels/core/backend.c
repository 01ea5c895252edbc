/* backend.c: argument checks around the backend vtable, batch helpers, state layout. */
#include <stdlib.h>
#include <string.h>

#include "kd/backend.h"

void kd_state_layout_init(kd_state_layout *l, const kd_config *c) {
    l->ssm_elems = kd_config_ssm_elems(c);
    l->conv_elems = kd_config_conv_elems(c);
    l->layer_elems = l->ssm_elems + l->conv_elems;
    l->slot_elems = (int64_t)c->n_layers * l->layer_elems;
}

int64_t kd_batch_tokens(const kd_batch *b) {
    int64_t n = 0;
    for (int32_t r = 0; r < b->n_rows; r++) n += b->rows[r].n_tokens;
    return n;
}

int64_t kd_batch_logit_rows(const kd_batch *b) {
    int64_t n = 0;
    for (int32_t r = 0; r < b->n_rows; r++) {
        if (b->rows[r].logits == KD_LOGITS_LAST) n += 1;
        else if (b->rows[r].logits == KD_LOGITS_ALL) n += b->rows[r].n_tokens;
    }
    return n;
}

const char *kd_commit_mode_name(kd_commit_mode m) {
    switch (m) {
    case KD_COMMIT_DEFERRED: return "deferred";
    case KD_COMMIT_EAGER: return "eager";
    case KD_COMMIT_STORE_ALL: return "store-all";
    }
    return "?";
}

int kd_commit_mode_parse(const char *s, kd_commit_mode *out) {
    for (int m = KD_COMMIT_DEFERRED; m <= KD_COMMIT_STORE_ALL; m++)
        if (!strcmp(s, kd_commit_mode_name((kd_commit_mode)m))) return *out = (kd_commit_mode)m, 0;
    return -1;
}

size_t kd_slot_bytes(const kd_config *c, int32_t max_window, kd_commit_mode mode,
                     size_t state_elem_bytes, size_t act_elem_bytes) {
    kd_state_layout l;
    kd_state_layout_init(&l, c);
    const size_t T = (size_t)max_window, HV = (size_t)c->n_v_heads;
    const size_t conv_ch = c->use_short_conv ? (size_t)(2 * kd_config_qk_dim(c) + kd_config_v_dim(c)) : 0;
    size_t per_layer = T * conv_ch * act_elem_bytes; /* the window's conv inputs */
    if (mode == KD_COMMIT_STORE_ALL) per_layer += T * (size_t)l.ssm_elems * state_elem_bytes;
    else per_layer += T * HV * ((size_t)c->head_v * 4 + 2 * (size_t)c->head_k * act_elem_bytes);
    return (size_t)l.slot_elems * state_elem_bytes + (size_t)c->n_layers * per_layer;
}

int kd_batch_check(const kd_batch *b, int32_t n_slots, int64_t max_tokens, int32_t max_window,
                   int32_t vocab, kd_err *err) {
    if (!b || b->n_rows < 0 || (b->n_rows > 0 && (!b->rows || !b->tokens)))
        return kd_fail(err, "batch: malformed");
    int64_t total = 0;
    for (int32_t r = 0; r < b->n_rows; r++) {
        const kd_batch_row *row = &b->rows[r];
        if (row->slot < 0 || row->slot > n_slots)
            return kd_fail(err, "batch: row %d slot %d out of range [0, %d]", r, row->slot,
                           n_slots);
        if (row->n_tokens < 1) return kd_fail(err, "batch: row %d has no tokens", r);
        if (row->logits < KD_LOGITS_NONE || row->logits > KD_LOGITS_ALL)
            return kd_fail(err, "batch: row %d bad logits mode %d", r, row->logits);
        if (row->kind == KD_ROW_VERIFY) {
            if (row->n_tokens > max_window)
                return kd_fail(err, "batch: row %d verify window of %d tokens, at most %d", r,
                               row->n_tokens, max_window);
            if (row->fold < 0 || row->fold > max_window)
                return kd_fail(err, "batch: row %d fold %d out of range", r, row->fold);
        } else if (row->kind == KD_ROW_PREFILL) {
            if (row->fold != 0) return kd_fail(err, "batch: row %d prefill with a fold", r);
        } else {
            return kd_fail(err, "batch: row %d bad kind %d", r, row->kind);
        }
        for (int32_t q = 0; q < r; q++)
            if (b->rows[q].slot == row->slot && row->slot != n_slots)
                return kd_fail(err, "batch: rows %d and %d share slot %d", q, r, row->slot);
        total += row->n_tokens;
        if (total > max_tokens)
            return kd_fail(err, "batch: more than %lld tokens", (long long)max_tokens);
    }
    for (int64_t i = 0; i < total; i++)
        if (b->tokens[i] < 0 || b->tokens[i] >= vocab)
            return kd_fail(err, "batch: token %d at %lld outside the vocabulary [0, %d)",
                           b->tokens[i], (long long)i, vocab);
    return 0;
}

int kd_backend_load(kd_backend *b, const kd_config *c, const kd_model_tensors *w, kd_err *err) {
    if (kd_config_check(c, err)) return -1;
    if (!w || w->n_layers != c->n_layers || !w->layers)
        return kd_fail(err, "backend %s: tensors do not match the config", b->ops->name);
    return b->ops->load(b, c, w, err);
}

int kd_backend_reserve(kd_backend *b, int32_t n_slots, int32_t max_rows, int64_t max_tokens,
                       int32_t max_window, kd_commit_mode mode, kd_err *err) {
    if (n_slots < 1 || n_slots > (1 << 20) || max_rows < 1 || max_tokens < 1 ||
        max_rows > (1 << 20) || max_window < 1 || max_window > 64 ||
        mode < KD_COMMIT_DEFERRED || mode > KD_COMMIT_STORE_ALL)
        return kd_fail(err,
                       "backend %s: bad reservation (slots %d, rows %d, tokens %lld, window %d)",
                       b->ops->name, n_slots, max_rows, (long long)max_tokens, max_window);
    if (b->n_slots) return kd_fail(err, "backend %s: already reserved", b->ops->name);
    b->records = calloc((size_t)n_slots + 1, sizeof *b->records);
    if (!b->records) return kd_fail(err, "backend %s: out of memory", b->ops->name);
    if (b->ops->reserve(b, n_slots, max_rows, max_tokens, max_window, mode, err)) {
        free(b->records);
        b->records = NULL;
        b->n_slots = 0;
        return -1;
    }
    return 0;
}

static int check_slot(const kd_backend *b, int32_t slot, kd_err *err) {
    if (b->n_slots == 0) return kd_fail(err, "backend %s: no slots reserved", b->ops->name);
    if (slot < 0 || slot > b->n_slots)
        return kd_fail(err, "backend %s: slot %d out of range [0, %d]", b->ops->name, slot,
                       b->n_slots);
    return 0;
}

/* A slot whose state must leave it (copy, export) or be advanced by a prefill must hold no
 * uncommitted verify records: the engine flushes first (KDA.md §5 flush triggers). */
static int check_committed(const kd_backend *b, int32_t slot, const char *what, kd_err *err) {
    if (slot != b->n_slots && b->records[slot] != 0)
        return kd_fail(err, "backend %s: %s of slot %d with %d uncommitted window tokens", b->ops->name,
                       what, slot, b->records[slot]);
    return 0;
}

int kd_backend_reset_slot(kd_backend *b, int32_t slot, kd_err *err) {
    if (check_slot(b, slot, err)) return -1;
    if (b->ops->reset_slot(b, slot, err)) return -1;
    b->records[slot] = 0;
    return 0;
}

/* The checks shared by forward and forward_sample (slots, folds against the records). */
static int check_forward(kd_backend *b, const kd_batch *batch, kd_err *err) {
    if (b->n_slots == 0) return kd_fail(err, "backend %s: no slots reserved", b->ops->name);
    if (kd_batch_check(batch, b->n_slots, b->max_tokens, b->max_window, b->config.vocab, err))
        return -1;
    if (batch->n_rows > b->max_rows)
        return kd_fail(err, "batch: %d rows, reserved %d", batch->n_rows, b->max_rows);
    for (int32_t r = 0; r < batch->n_rows; r++) {
        const kd_batch_row *row = &batch->rows[r];
        if (row->slot == b->n_slots) continue; /* scratch: whatever it holds is garbage */
        if (row->kind == KD_ROW_PREFILL) {
            if (check_committed(b, row->slot, "prefill", err)) return -1;
        } else if (row->fold > b->records[row->slot] ||
                   (b->records[row->slot] > 0 && row->fold == 0)) {
            return kd_fail(err, "batch: row %d folds %d tokens, slot %d has %d recorded", r,
                           row->fold, row->slot, b->records[row->slot]);
        }
    }
    return 0;
}

static void note_records(kd_backend *b, const kd_batch *batch) {
    for (int32_t r = 0; r < batch->n_rows; r++) {
        const kd_batch_row *row = &batch->rows[r];
        b->records[row->slot] = row->kind == KD_ROW_VERIFY ? row->n_tokens : 0;
    }
}

int kd_backend_forward(kd_backend *b, const kd_batch *batch, float *logits, kd_err *err) {
    if (check_forward(b, batch, err)) return -1;
    if (kd_batch_logit_rows(batch) > 0 && !logits)
        return kd_fail(err, "batch: logits requested without an output buffer");
    if (b->ops->forward(b, batch, logits, err)) return -1;
    note_records(b, batch);
    return 0;
}

int kd_backend_forward_sample(kd_backend *b, const kd_batch *batch, const kd_sample_params *params,
                              const double *uniforms, int32_t *tokens, int32_t *accepted, int32_t *used,
                              kd_err *err) {
    if (check_forward(b, batch, err)) return -1;
    if (!b->ops->forward_sample)
        return kd_fail(err, "backend %s: no forward_sample", b->ops->name);
    if (batch->n_rows > 0 && (!params || !uniforms || !tokens || !accepted || !used))
        return kd_fail(err, "forward_sample: missing parameters or outputs");
    for (int32_t r = 0; r < batch->n_rows; r++) {
        const kd_batch_row *row = &batch->rows[r];
        if (row->logits == KD_LOGITS_NONE) continue;
        const kd_sample_params *p = &params[r];
        if (row->logits == KD_LOGITS_ALL && row->n_tokens > b->max_window)
            return kd_fail(err, "forward_sample: row %d samples a window of %d tokens, at most %d", r,
                           row->n_tokens, b->max_window);
        if (!(p->temperature >= 0 && p->temperature <= 1e4) || p->top_k < 0 ||
            !(p->top_p > 0 && p->top_p <= 1))
            return kd_fail(err, "forward_sample: row %d has bad sampling parameters", r);
        const int32_t nu = row->logits == KD_LOGITS_ALL ? row->n_tokens : 1;
        if (p->temperature > 0)
            for (int32_t i = 0; i < nu; i++) {
                const double u = uniforms[(size_t)r * b->max_window + i];
                if (!(u >= 0 && u < 1))
                    return kd_fail(err, "forward_sample: row %d uniform %d outside [0, 1)", r, i);
            }
    }
    if (b->ops->forward_sample(b, batch, params, uniforms, tokens, accepted, used, err)) return -1;
    note_records(b, batch);
    return 0;
}

void kd_sample_batch_ref(const kd_batch *batch, const float *logits, int32_t vocab, int32_t max_window,
                         const kd_sample_params *params, const double *uniforms, double *probs,
                         int32_t *order, int32_t *tokens, int32_t *accepted, int32_t *used) {
    int64_t m = 0, t0 = 0;
    for (int32_t r = 0; r < batch->n_rows; r++) {
        const kd_batch_row *row = &batch->rows[r];
        accepted[r] = used[r] = 0;
        if (row->logits == KD_LOGITS_ALL) {
            accepted[r] = kd_accept_window(logits + m * vocab, vocab, batch->tokens + t0 + 1, row->n_tokens - 1,
                                           &params[r], uniforms + (size_t)r * max_window, &used[r], probs,
                                           order, tokens + (size_t)r * max_window);
            m += row->n_tokens;
        } else if (row->logits == KD_LOGITS_LAST) {
            kd_accept_window(logits + m * vocab, vocab, NULL, 0, &params[r], uniforms + (size_t)r * max_window,
                             &used[r], probs, order, tokens + (size_t)r * max_window);
            m += 1;
        }
        t0 += row->n_tokens;
    }
}

int kd_backend_commit(kd_backend *b, int32_t slot, int32_t n, int32_t snap_at, void *snap_dst,
                      kd_err *err) {
    if (check_slot(b, slot, err)) return -1;
    if (n < 0 || n > b->records[slot])
        return kd_fail(err, "commit: %d tokens, slot %d has %d recorded", n, slot, b->records[slot]);
    if (snap_at < 0 || snap_at > n || (snap_at > 0 && !snap_dst))
        return kd_fail(err, "commit: bad snapshot position %d of %d", snap_at, n);
    /* with nothing of the window kept, a backend may still hold earlier tokens to fold (a lazy checkpoint) */
    if ((n > 0 || b->records[slot] > 0) && b->ops->commit(b, slot, n, snap_at, snap_dst, err)) return -1;
    b->records[slot] = 0;
    return 0;
}

size_t kd_backend_state_bytes(const kd_backend *b) {
    return (size_t)b->layout.slot_elems * kd_dtype_size(b->state_dtype);
}

int kd_backend_state_read(kd_backend *b, int32_t slot, void *dst, size_t bytes, kd_err *err) {
    if (check_slot(b, slot, err) || check_committed(b, slot, "state read", err)) return -1;
    if (bytes != kd_backend_state_bytes(b))
        return kd_fail(err, "state read: %zu bytes, a slot holds %zu", bytes,
                       kd_backend_state_bytes(b));
    return b->ops->state_read(b, slot, dst, bytes, err);
}

int kd_backend_checkpoint_read(kd_backend *b, int32_t slot, void *dst, size_t bytes, kd_err *err) {
    if (check_slot(b, slot, err)) return -1;
    if (b->mode == KD_COMMIT_STORE_ALL)
        return kd_fail(err, "checkpoint read: not kept apart in store-all mode");
    if (bytes != kd_backend_state_bytes(b))
        return kd_fail(err, "checkpoint read: %zu bytes, a slot holds %zu", bytes,
                       kd_backend_state_bytes(b));
    return b->ops->state_read(b, slot, dst, bytes, err);
}

int kd_backend_state_write(kd_backend *b, int32_t slot, const void *src, size_t bytes,
                           kd_err *err) {
    if (check_slot(b, slot, err)) return -1;
    if (bytes != kd_backend_state_bytes(b))
        return kd_fail(err, "state write: %zu bytes, a slot holds %zu", bytes,
                       kd_backend_state_bytes(b));
    if (b->ops->state_write(b, slot, src, bytes, err)) return -1;
    b->records[slot] = 0;
    return 0;
}

int kd_backend_state_copy(kd_backend *b, int32_t dst, int32_t src, kd_err *err) {
    if (check_slot(b, dst, err) || check_slot(b, src, err) ||
        check_committed(b, src, "state copy", err))
        return -1;
    if (dst == src) return 0;
    if (b->ops->state_copy(b, dst, src, err)) return -1;
    b->records[dst] = 0;
    return 0;
}

static int check_range(const kd_backend *b, size_t offset, size_t len, const char *what, kd_err *err) {
    const size_t total = kd_backend_state_bytes(b);
    if (offset > total || len > total - offset)
        return kd_fail(err, "%s: bytes [%zu, +%zu) outside the state of %zu bytes", what, offset, len, total);
    return 0;
}

int kd_backend_state_write_part(kd_backend *b, int32_t slot, size_t offset, const void *src, size_t len,
                                kd_err *err) {
    if (check_slot(b, slot, err) || check_range(b, offset, len, "state write", err)) return -1;
    if (len == 0) return 0;
    if (b->ops->state_write_part(b, slot, offset, src, len, err)) return -1;
    b->records[slot] = 0;
    return 0;
}

int kd_backend_state_hash(kd_backend *b, int32_t slot, size_t offset, size_t len, uint64_t *out, kd_err *err) {
    if (check_slot(b, slot, err) || check_committed(b, slot, "state hash", err) ||
        check_range(b, offset, len, "state hash", err))
        return -1;
    return b->ops->state_hash(b, slot, offset, len, out, err);
}

int kd_backend_has_hash_update(const kd_backend *b) {
    return b->ops->state_hash_update != NULL;
}

int kd_backend_state_hash_update(kd_backend *b, int32_t slot, size_t offset, size_t len, struct XXH3_state_s *h,
                                 kd_err *err) {
    if (!b->ops->state_hash_update)
        return kd_fail(err, "backend %s: no incremental state hash", b->ops->name);
    if (check_slot(b, slot, err) || check_committed(b, slot, "state hash", err) ||
        check_range(b, offset, len, "state hash", err))
        return -1;
    return b->ops->state_hash_update(b, slot, offset, len, h, err);
}

void kd_backend_free(kd_backend *b) {
    if (!b) return;
    free(b->records);
    b->records = NULL;
    b->ops->destroy(b);
}

int kd_backend_state_regions(kd_backend *b, int32_t slot, kd_dev_region *out, int max, kd_err *err) {
    if (!b->ops->state_regions)
        return kd_fail(err, "the %s backend keeps request state in host memory (no device regions)", b->ops->name);
    if (slot < 0 || slot > b->n_slots) return kd_fail(err, "slot %d outside 0..%d", slot, b->n_slots);
    return b->ops->state_regions(b, slot, out, max, err);
}
