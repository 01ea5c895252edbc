/* backend.c: argument checks around the backend vtable, batch helpers, state layout. */
#include <stdlib.h>

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

int kd_batch_check(const kd_batch *b, int32_t n_slots, int64_t max_tokens, int32_t vocab,
                   kd_err *err) {
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
                       kd_err *err) {
    if (n_slots < 1 || max_rows < 1 || max_tokens < 1 || max_rows > n_slots + 1)
        return kd_fail(err, "backend %s: bad reservation (slots %d, rows %d, tokens %lld)",
                       b->ops->name, n_slots, max_rows, (long long)max_tokens);
    if (b->n_slots) return kd_fail(err, "backend %s: already reserved", b->ops->name);
    return b->ops->reserve(b, n_slots, max_rows, max_tokens, err);
}

static int check_slot(const kd_backend *b, int32_t slot, kd_err *err) {
    if (b->n_slots == 0) return kd_fail(err, "backend %s: no slots reserved", b->ops->name);
    if (slot < 0 || slot > b->n_slots)
        return kd_fail(err, "backend %s: slot %d out of range [0, %d]", b->ops->name, slot,
                       b->n_slots);
    return 0;
}

int kd_backend_reset_slot(kd_backend *b, int32_t slot, kd_err *err) {
    if (check_slot(b, slot, err)) return -1;
    return b->ops->reset_slot(b, slot, err);
}

int kd_backend_forward(kd_backend *b, const kd_batch *batch, float *logits, kd_err *err) {
    if (b->n_slots == 0) return kd_fail(err, "backend %s: no slots reserved", b->ops->name);
    if (kd_batch_check(batch, b->n_slots, b->max_tokens, b->config.vocab, err)) return -1;
    if (batch->n_rows > b->max_rows)
        return kd_fail(err, "batch: %d rows, reserved %d", batch->n_rows, b->max_rows);
    if (kd_batch_logit_rows(batch) > 0 && !logits)
        return kd_fail(err, "batch: logits requested without an output buffer");
    return b->ops->forward(b, batch, logits, err);
}

size_t kd_backend_state_bytes(const kd_backend *b) {
    return (size_t)b->layout.slot_elems * kd_dtype_size(b->state_dtype);
}

int kd_backend_state_read(kd_backend *b, int32_t slot, void *dst, size_t bytes, kd_err *err) {
    if (check_slot(b, slot, err)) return -1;
    if (bytes != kd_backend_state_bytes(b))
        return kd_fail(err, "state read: %zu bytes, a slot holds %zu", bytes,
                       kd_backend_state_bytes(b));
    return b->ops->state_read(b, slot, dst, bytes, err);
}

int kd_backend_state_write(kd_backend *b, int32_t slot, const void *src, size_t bytes,
                           kd_err *err) {
    if (check_slot(b, slot, err)) return -1;
    if (bytes != kd_backend_state_bytes(b))
        return kd_fail(err, "state write: %zu bytes, a slot holds %zu", bytes,
                       kd_backend_state_bytes(b));
    return b->ops->state_write(b, slot, src, bytes, err);
}

int kd_backend_state_copy(kd_backend *b, int32_t dst, int32_t src, kd_err *err) {
    if (check_slot(b, dst, err) || check_slot(b, src, err)) return -1;
    if (dst == src) return 0;
    return b->ops->state_copy(b, dst, src, err);
}

void kd_backend_free(kd_backend *b) {
    if (b) b->ops->destroy(b);
}
