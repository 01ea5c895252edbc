/* api.c: see api.h. */
#include "worker/api.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kdecode/v1/decoder.pb-c.h"

static int bad(char *msg, size_t len, int code, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int bad(char *msg, size_t len, int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, len, fmt, ap);
    va_end(ap);
    return code;
}

static int get_varint(const uint8_t *b, size_t len, size_t *pos, uint64_t *v) {
    uint64_t x = 0;
    for (int s = 0; s < 64 && *pos < len; s += 7) {
        const uint8_t c = b[(*pos)++];
        x |= (uint64_t)(c & 0x7f) << s;
        if (!(c & 0x80)) {
            *v = x;
            return 1;
        }
    }
    return 0;
}

static int has_nul(const ProtobufCMessageDescriptor *d, const uint8_t *b, size_t len, int depth,
                   const ProtobufCMessageDescriptor **md, const ProtobufCFieldDescriptor **fd) {
    size_t pos = 0;
    while (pos < len) {
        uint64_t key, n;
        if (!get_varint(b, len, &pos, &key)) return 0;
        switch (key & 7) {
        case 0:
            if (!get_varint(b, len, &pos, &n)) return 0;
            break;
        case 1:
            if (len - pos < 8) return 0;
            pos += 8;
            break;
        case 5:
            if (len - pos < 4) return 0;
            pos += 4;
            break;
        case 2: {
            if (!get_varint(b, len, &pos, &n) || n > len - pos) return 0;
            const uint64_t fn = key >> 3;
            const ProtobufCFieldDescriptor *f =
                fn <= UINT32_MAX ? protobuf_c_message_descriptor_get_field(d, (unsigned)fn) : NULL;
            if (f && f->type == PROTOBUF_C_TYPE_STRING && memchr(b + pos, 0, (size_t)n)) {
                *md = d, *fd = f;
                return 1;
            }
            if (f && f->type == PROTOBUF_C_TYPE_MESSAGE && depth < 32 &&
                has_nul(f->descriptor, b + pos, (size_t)n, depth + 1, md, fd))
                return 1;
            pos += (size_t)n;
            break;
        }
        default: return 0; /* groups, invalid wire types: the decoder refuses them */
        }
    }
    return 0;
}

int kd_api_string_has_nul(const void *descriptor, const uint8_t *buf, size_t len, char *msg, size_t msglen) {
    const ProtobufCMessageDescriptor *md = NULL;
    const ProtobufCFieldDescriptor *fd = NULL;
    if (!has_nul(descriptor, buf, len, 0, &md, &fd)) return 0;
    if (msg && msglen) snprintf(msg, msglen, "%s.%s holds a NUL byte", md->name, fd->name);
    return 1;
}

int kd_api_valid_request_id(const char *id) {
    size_t n = strlen(id);
    if (n < 1 || n > KD_REQUEST_ID_MAX) return 0;
    for (size_t i = 0; i < n; i++)
        if (id[i] < 0x21 || id[i] > 0x7e) return 0;
    return 1;
}

static int check_ids(const int32_t *ids, size_t n, int32_t vocab, const char *field, char *msg, size_t len) {
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= vocab)
            return bad(msg, len, KD_STATUS_INVALID_ARGUMENT, "%s[%zu] = %d is outside the vocabulary [0, %d)",
                       field, i, ids[i], vocab);
    return KD_STATUS_OK;
}

static int32_t *copy_ids(const int32_t *ids, size_t n) {
    int32_t *p = malloc((n ? n : 1) * sizeof *p);
    if (p && n) memcpy(p, ids, n * sizeof *p);
    return p;
}

int kd_api_parse_generate(const uint8_t *buf, size_t len, const kd_api_limits *lim, kd_generate_req *out,
                          char *msg, size_t msglen) {
    memset(out, 0, sizeof *out);
    if (kd_api_string_has_nul(&kdecode__v1__generate_request__descriptor, buf, len, msg, msglen))
        return KD_STATUS_INVALID_ARGUMENT;
    Kdecode__V1__GenerateRequest *m = kdecode__v1__generate_request__unpack(NULL, len, buf);
    if (!m) return bad(msg, msglen, KD_STATUS_INVALID_ARGUMENT, "cannot parse kdecode.v1.GenerateRequest");
    int rc = KD_STATUS_INVALID_ARGUMENT;
    const size_t n_prompt = m->n_prompt_token_ids;
    if (m->request_id[0] && !kd_api_valid_request_id(m->request_id)) {
        bad(msg, msglen, rc, "request_id must be 1..%d printable ASCII characters", KD_REQUEST_ID_MAX);
        goto done;
    }
    if (m->handoff_id[0] && !kd_api_valid_request_id(m->handoff_id)) {
        bad(msg, msglen, rc, "handoff_id must be 1..%d printable ASCII characters", KD_REQUEST_ID_MAX);
        goto done;
    }
    if (m->handoff_id[0] && n_prompt) {
        bad(msg, msglen, rc, "give prompt_token_ids or handoff_id, not both");
        goto done;
    }
    if (!m->handoff_id[0] && n_prompt == 0) {
        bad(msg, msglen, rc, "prompt_token_ids is empty");
        goto done;
    }
    const int64_t max_prompt = lim->max_prompt < lim->max_model_len - 1 ? lim->max_prompt : lim->max_model_len - 1;
    if ((int64_t)n_prompt > max_prompt) {
        bad(msg, msglen, rc, "prompt of %zu tokens is longer than the limit %lld", n_prompt, (long long)max_prompt);
        goto done;
    }
    if ((rc = check_ids(m->prompt_token_ids, n_prompt, lim->vocab, "prompt_token_ids", msg, msglen))) goto done;
    rc = KD_STATUS_INVALID_ARGUMENT;
    if (m->max_tokens < 1) {
        bad(msg, msglen, rc, "max_tokens = %d must be at least 1", m->max_tokens);
        goto done;
    }
    if ((int64_t)n_prompt + m->max_tokens > lim->max_model_len) {
        bad(msg, msglen, rc, "prompt (%zu) + max_tokens (%d) exceeds the model length %lld", n_prompt,
            m->max_tokens, (long long)lim->max_model_len);
        goto done;
    }
    kd_sampling s = {.temperature = 0, .top_k = 0, .top_p = 1, .seed = 0};
    if (m->sampling) {
        s.temperature = m->sampling->temperature;
        s.top_k = m->sampling->top_k;
        s.top_p = m->sampling->top_p == 0 ? 1 : m->sampling->top_p;
        s.seed = m->sampling->seed;
        if (!(s.temperature >= 0 && s.temperature <= 1e4)) {
            bad(msg, msglen, rc, "sampling.temperature = %g must be in [0, 10000]", s.temperature);
            goto done;
        }
        if (s.top_k < 0) {
            bad(msg, msglen, rc, "sampling.top_k = %d must be >= 0", s.top_k);
            goto done;
        }
        if (!(s.top_p > 0 && s.top_p <= 1)) {
            bad(msg, msglen, rc, "sampling.top_p = %g must be in (0, 1]", s.top_p);
            goto done;
        }
    }
    int32_t spec = lim->default_spec;
    kd_draft_source draft = KD_DRAFT_NGRAM;
    int32_t ng_min = 0, ng_max = 0;
    const Kdecode__V1__SpeculationParams *sp = m->speculation;
    if (sp) {
        if (sp->num_draft_tokens < 0 || sp->num_draft_tokens > lim->max_spec) {
            bad(msg, msglen, rc, "speculation.num_draft_tokens = %d must be in [0, %d]", sp->num_draft_tokens,
                lim->max_spec);
            goto done;
        }
        if (sp->num_draft_tokens > 0 || sp->source != KDECODE__V1__DRAFT_SOURCE__DRAFT_SOURCE_UNSPECIFIED)
            spec = sp->num_draft_tokens;
        switch (sp->source) {
        case KDECODE__V1__DRAFT_SOURCE__DRAFT_SOURCE_UNSPECIFIED:
        case KDECODE__V1__DRAFT_SOURCE__DRAFT_SOURCE_NGRAM: draft = KD_DRAFT_NGRAM; break;
        case KDECODE__V1__DRAFT_SOURCE__DRAFT_SOURCE_NONE: draft = KD_DRAFT_NONE, spec = 0; break;
        case KDECODE__V1__DRAFT_SOURCE__DRAFT_SOURCE_CALLER: draft = KD_DRAFT_CALLER; break;
        default:
            bad(msg, msglen, rc, "speculation.source = %d is not a DraftSource", (int)sp->source);
            goto done;
        }
        if (sp->ngram_min < 0 || sp->ngram_max < 0 || sp->ngram_min > 64 || sp->ngram_max > 64 ||
            (sp->ngram_min && sp->ngram_max && sp->ngram_max < sp->ngram_min)) {
            bad(msg, msglen, rc, "speculation.ngram_min/ngram_max = %d/%d invalid (0..64, min <= max)",
                sp->ngram_min, sp->ngram_max);
            goto done;
        }
        ng_min = sp->ngram_min, ng_max = sp->ngram_max;
        if (sp->n_draft_token_ids > (size_t)lim->max_spec) {
            bad(msg, msglen, rc, "speculation.draft_token_ids has %zu tokens, at most %d", sp->n_draft_token_ids,
                lim->max_spec);
            goto done;
        }
        if ((rc = check_ids(sp->draft_token_ids, sp->n_draft_token_ids, lim->vocab, "speculation.draft_token_ids",
                            msg, msglen)))
            goto done;
        rc = KD_STATUS_INVALID_ARGUMENT;
    }
    if (m->n_stop_token_ids > (size_t)lim->max_stop_ids) {
        bad(msg, msglen, rc, "stop_token_ids has %zu entries, at most %d", m->n_stop_token_ids, lim->max_stop_ids);
        goto done;
    }
    if ((rc = check_ids(m->stop_token_ids, m->n_stop_token_ids, lim->vocab, "stop_token_ids", msg, msglen)))
        goto done;
    out->prompt = copy_ids(m->prompt_token_ids, n_prompt);
    out->stop = copy_ids(m->stop_token_ids, m->n_stop_token_ids);
    out->n_drafts = sp ? (int32_t)sp->n_draft_token_ids : 0;
    out->drafts = copy_ids(sp ? sp->draft_token_ids : NULL, (size_t)out->n_drafts);
    if (!out->prompt || !out->stop || !out->drafts) {
        kd_generate_req_free(out);
        rc = bad(msg, msglen, KD_STATUS_INTERNAL, "out of memory");
        goto done;
    }
    snprintf(out->request_id, sizeof out->request_id, "%s", m->request_id);
    snprintf(out->handoff_id, sizeof out->handoff_id, "%s", m->handoff_id);
    out->params = (kd_request_params){
        .prompt = out->prompt, .n_prompt = (int64_t)n_prompt, .max_tokens = m->max_tokens, .sampling = s,
        .spec_tokens = spec, .draft = spec > 0 ? draft : KD_DRAFT_NONE, .ngram_min = ng_min, .ngram_max = ng_max,
        .stop_ids = out->stop, .n_stop = (int32_t)m->n_stop_token_ids,
        .eos_id = m->ignore_eos ? -1 : lim->eos_id};
    rc = KD_STATUS_OK;
done:
    kdecode__v1__generate_request__free_unpacked(m, NULL);
    return rc;
}

void kd_generate_req_free(kd_generate_req *r) {
    free(r->prompt), free(r->stop), free(r->drafts);
    r->prompt = r->stop = r->drafts = NULL;
}

int kd_api_parse_abort(const uint8_t *buf, size_t len, char id[KD_REQUEST_ID_MAX + 1], char *msg, size_t msglen) {
    if (kd_api_string_has_nul(&kdecode__v1__abort_request__descriptor, buf, len, msg, msglen))
        return KD_STATUS_INVALID_ARGUMENT;
    Kdecode__V1__AbortRequest *m = kdecode__v1__abort_request__unpack(NULL, len, buf);
    if (!m) return bad(msg, msglen, KD_STATUS_INVALID_ARGUMENT, "cannot parse kdecode.v1.AbortRequest");
    int rc = KD_STATUS_OK;
    if (!kd_api_valid_request_id(m->request_id))
        rc = bad(msg, msglen, KD_STATUS_INVALID_ARGUMENT, "request_id must be 1..%d printable ASCII characters",
                 KD_REQUEST_ID_MAX);
    else
        snprintf(id, KD_REQUEST_ID_MAX + 1, "%s", m->request_id);
    kdecode__v1__abort_request__free_unpacked(m, NULL);
    return rc;
}
