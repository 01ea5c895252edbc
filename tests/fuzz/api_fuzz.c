/* api_fuzz.c: libFuzzer target for worker/api.c (GenerateRequest / AbortRequest decoding and
 * validation). Built with clang -fsanitize=fuzzer,address,undefined by api_fuzz_test.sh.
 *
 * Input: byte 0 picks the limits (bits 0-2) and the size of the message buffer (bits 3-4);
 * the rest is the serialized message. Both parsers run on the rest. Checked:
 *   - OK: the request is consistent with the limits (ids in the vocabulary, prompt or handoff
 *     exactly one, lengths, sampling ranges, speculation and n-gram sizes, eos) and with an
 *     independent protobuf-c decode of the same bytes; the arrays are fully readable.
 *   - error: a known status code, a non-empty NUL-terminated message within the buffer,
 *     nothing left to free in *out.
 *   - everything freed (LeakSanitizer), no overflow (the message and id buffers are heap
 *     blocks of exactly the size given), no undefined behaviour (UBSan aborts). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kdecode/v1/decoder.pb-c.h"
#include "worker/api.h"

#define CHECK(c)                                                                                  \
    do {                                                                                          \
        if (!(c)) {                                                                               \
            fprintf(stderr, "api_fuzz: invariant failed at %s:%d: %s\n", __FILE__, __LINE__, #c); \
            abort();                                                                              \
        }                                                                                         \
    } while (0)

/* Limit configurations: the server's defaults with the demo model, a degenerate tiny one,
 * a large one, one where only a handoff with max_tokens 1 can pass, and a prompt cap below
 * the model length. */
static const kd_api_limits k_limits[8] = {
    {.vocab = 1024, .eos_id = 2, .max_model_len = 8192, .max_spec = 7, .default_spec = 3,
     .max_prompt = 8192, .max_stop_ids = 64},
    {.vocab = 1, .eos_id = -1, .max_model_len = 2, .max_spec = 0, .default_spec = 0,
     .max_prompt = 1, .max_stop_ids = 0},
    {.vocab = 1 << 20, .eos_id = 0, .max_model_len = (int64_t)1 << 40, .max_spec = 64,
     .default_spec = 0, .max_prompt = (int64_t)1 << 40, .max_stop_ids = 1024},
    {.vocab = 16, .eos_id = 15, .max_model_len = 1, .max_spec = 3, .default_spec = 3,
     .max_prompt = 100, .max_stop_ids = 4},
    {.vocab = 256, .eos_id = 255, .max_model_len = 64, .max_spec = 7, .default_spec = 7,
     .max_prompt = 8, .max_stop_ids = 2},
    {.vocab = 2, .eos_id = 1, .max_model_len = 4, .max_spec = 1, .default_spec = 1,
     .max_prompt = 4, .max_stop_ids = 1},
    {.vocab = 32000, .eos_id = 31999, .max_model_len = 4096, .max_spec = 7, .default_spec = 0,
     .max_prompt = 4096, .max_stop_ids = 64},
    {.vocab = 1024, .eos_id = 2, .max_model_len = 8192, .max_spec = 7, .default_spec = 3,
     .max_prompt = 8192, .max_stop_ids = 64},
};

static const size_t k_msglen[4] = {256, 40, 2, 512};

static int known_status(int rc) {
    switch (rc) {
    case KD_STATUS_INVALID_ARGUMENT:
    case KD_STATUS_RESOURCE_EXHAUSTED:
    case KD_STATUS_FAILED_PRECONDITION:
    case KD_STATUS_INTERNAL: return 1;
    default: return 0;
    }
}

static void check_message(const char *msg, size_t msglen) {
    CHECK(memchr(msg, '\0', msglen) != NULL); /* terminated inside the buffer */
    CHECK(msg[0] != '\0');                    /* and not empty */
}

/* Reads every element (ASan checks that the allocation holds n of them). */
static int ids_in_range(const int32_t *ids, int64_t n, int32_t vocab) {
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= vocab) return 0;
    return 1;
}

static int same_ids(const int32_t *a, const int32_t *b, size_t n) {
    return n == 0 || memcmp(a, b, n * sizeof *a) == 0;
}

static void check_ok(const kd_generate_req *r, const kd_api_limits *lim, const uint8_t *buf, size_t len) {
    const kd_request_params *p = &r->params;
    /* ids: terminated, empty or valid */
    CHECK(memchr(r->request_id, '\0', sizeof r->request_id) != NULL);
    CHECK(memchr(r->handoff_id, '\0', sizeof r->handoff_id) != NULL);
    CHECK(!r->request_id[0] || kd_api_valid_request_id(r->request_id));
    CHECK(!r->handoff_id[0] || kd_api_valid_request_id(r->handoff_id));
    /* exactly one of a prompt and a handoff */
    CHECK(p->n_prompt >= 0);
    CHECK((p->n_prompt >= 1) != (r->handoff_id[0] != '\0'));
    CHECK(r->prompt && r->stop && r->drafts); /* all three allocated on success */
    CHECK(p->prompt == r->prompt && p->stop_ids == r->stop);
    /* lengths */
    const int64_t max_prompt = lim->max_prompt < lim->max_model_len - 1 ? lim->max_prompt : lim->max_model_len - 1;
    CHECK(p->n_prompt <= max_prompt);
    CHECK(p->max_tokens >= 1);
    CHECK(p->n_prompt + p->max_tokens <= lim->max_model_len);
    CHECK(ids_in_range(p->prompt, p->n_prompt, lim->vocab));
    CHECK(p->n_stop >= 0 && p->n_stop <= lim->max_stop_ids);
    CHECK(ids_in_range(p->stop_ids, p->n_stop, lim->vocab));
    CHECK(r->n_drafts >= 0 && r->n_drafts <= lim->max_spec);
    CHECK(ids_in_range(r->drafts, r->n_drafts, lim->vocab));
    /* sampling */
    CHECK(p->sampling.temperature >= 0 && p->sampling.temperature <= 1e4);
    CHECK(p->sampling.top_k >= 0);
    CHECK(p->sampling.top_p > 0 && p->sampling.top_p <= 1);
    /* speculation */
    CHECK(p->spec_tokens >= 0 && p->spec_tokens <= lim->max_spec);
    CHECK(p->draft == KD_DRAFT_NONE || p->draft == KD_DRAFT_NGRAM || p->draft == KD_DRAFT_CALLER);
    CHECK(p->spec_tokens > 0 || p->draft == KD_DRAFT_NONE);
    CHECK(p->ngram_min >= 0 && p->ngram_min <= 64);
    CHECK(p->ngram_max >= 0 && p->ngram_max <= 64);
    CHECK(!p->ngram_min || !p->ngram_max || p->ngram_min <= p->ngram_max);
    CHECK(p->eos_id == -1 || p->eos_id == lim->eos_id);
    CHECK(p->id == 0 && p->oracle == NULL && p->n_oracle == 0);

    /* against an independent decode of the same bytes */
    Kdecode__V1__GenerateRequest *m = kdecode__v1__generate_request__unpack(NULL, len, buf);
    CHECK(m != NULL);
    CHECK((size_t)p->n_prompt == m->n_prompt_token_ids);
    CHECK(same_ids(p->prompt, m->prompt_token_ids, m->n_prompt_token_ids));
    CHECK((size_t)p->n_stop == m->n_stop_token_ids);
    CHECK(same_ids(p->stop_ids, m->stop_token_ids, m->n_stop_token_ids));
    CHECK(p->max_tokens == m->max_tokens);
    CHECK(strcmp(r->request_id, m->request_id) == 0);
    CHECK(strcmp(r->handoff_id, m->handoff_id) == 0);
    CHECK(p->eos_id == (m->ignore_eos ? -1 : lim->eos_id));
    if (m->sampling) {
        CHECK(p->sampling.temperature == m->sampling->temperature);
        CHECK(p->sampling.top_k == m->sampling->top_k);
        CHECK(p->sampling.top_p == (m->sampling->top_p == 0 ? 1 : m->sampling->top_p));
        CHECK(p->sampling.seed == m->sampling->seed);
    } else {
        CHECK(p->sampling.temperature == 0 && p->sampling.top_k == 0 && p->sampling.top_p == 1);
    }
    const Kdecode__V1__SpeculationParams *sp = m->speculation;
    if (sp) {
        CHECK((size_t)r->n_drafts == sp->n_draft_token_ids);
        CHECK(same_ids(r->drafts, sp->draft_token_ids, sp->n_draft_token_ids));
        CHECK(p->ngram_min == sp->ngram_min && p->ngram_max == sp->ngram_max);
        if (sp->source == KDECODE__V1__DRAFT_SOURCE__DRAFT_SOURCE_NONE) CHECK(p->spec_tokens == 0);
        else if (sp->num_draft_tokens > 0 || sp->source != KDECODE__V1__DRAFT_SOURCE__DRAFT_SOURCE_UNSPECIFIED)
            CHECK(p->spec_tokens == sp->num_draft_tokens);
        else CHECK(p->spec_tokens == lim->default_spec);
        if (sp->source == KDECODE__V1__DRAFT_SOURCE__DRAFT_SOURCE_CALLER && p->spec_tokens > 0)
            CHECK(p->draft == KD_DRAFT_CALLER);
    } else {
        CHECK(r->n_drafts == 0);
        CHECK(p->spec_tokens == lim->default_spec);
        CHECK(p->ngram_min == 0 && p->ngram_max == 0);
    }
    kdecode__v1__generate_request__free_unpacked(m, NULL);
}

static void fuzz_generate(const uint8_t *buf, size_t len, const kd_api_limits *lim, size_t msglen) {
    char *msg = malloc(msglen); /* exactly msglen bytes: a write past it is an ASan report */
    CHECK(msg != NULL);
    memset(msg, 0, msglen);
    kd_generate_req r;
    memset(&r, 0xA5, sizeof r); /* the parser must not rely on *out being zeroed */
    int rc = kd_api_parse_generate(buf, len, lim, &r, msg, msglen);
    if (rc == KD_STATUS_OK) {
        check_ok(&r, lim, buf, len);
        kd_generate_req_free(&r);
        CHECK(r.prompt == NULL && r.stop == NULL && r.drafts == NULL);
        kd_generate_req_free(&r); /* idempotent */
    } else {
        CHECK(known_status(rc));
        check_message(msg, msglen);
        /* "on error *out holds nothing to free" */
        CHECK(r.prompt == NULL && r.stop == NULL && r.drafts == NULL);
        kd_generate_req_free(&r);
        /* a protobuf-c parse failure must be reported as such */
        Kdecode__V1__GenerateRequest *m = kdecode__v1__generate_request__unpack(NULL, len, buf);
        if (!m) CHECK(rc == KD_STATUS_INVALID_ARGUMENT);
        else kdecode__v1__generate_request__free_unpacked(m, NULL);
    }
    free(msg);
}

static void fuzz_abort(const uint8_t *buf, size_t len, size_t msglen) {
    char *msg = malloc(msglen);
    char *id = malloc(KD_REQUEST_ID_MAX + 1);
    CHECK(msg != NULL && id != NULL);
    memset(msg, 0, msglen);
    memset(id, 0x5A, KD_REQUEST_ID_MAX + 1);
    int rc = kd_api_parse_abort(buf, len, id, msg, msglen);
    if (rc == KD_STATUS_OK) {
        CHECK(memchr(id, '\0', KD_REQUEST_ID_MAX + 1) != NULL);
        CHECK(kd_api_valid_request_id(id));
        Kdecode__V1__AbortRequest *m = kdecode__v1__abort_request__unpack(NULL, len, buf);
        CHECK(m != NULL);
        CHECK(strcmp(id, m->request_id) == 0);
        kdecode__v1__abort_request__free_unpacked(m, NULL);
    } else {
        CHECK(rc == KD_STATUS_INVALID_ARGUMENT);
        check_message(msg, msglen);
    }
    free(id);
    free(msg);
}

static void fuzz_request_id(const uint8_t *buf, size_t len) {
    char *s = malloc(len + 1);
    CHECK(s != NULL);
    memcpy(s, buf, len);
    s[len] = '\0';
    int ok = kd_api_valid_request_id(s);
    size_t n = strlen(s);
    int want = n >= 1 && n <= KD_REQUEST_ID_MAX;
    for (size_t i = 0; want && i < n; i++) want = s[i] > ' ' && s[i] <= '~';
    CHECK(ok == want);
    free(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const kd_api_limits *lim = &k_limits[data[0] & 7];
    const size_t msglen = k_msglen[(data[0] >> 3) & 3];
    const uint8_t *buf = data + 1;
    const size_t len = size - 1;
    /* a copy of exactly len bytes, so a read past the message is an ASan report */
    uint8_t *copy = malloc(len ? len : 1);
    CHECK(copy != NULL);
    if (len) memcpy(copy, buf, len);
    fuzz_generate(copy, len, lim, msglen);
    fuzz_abort(copy, len, msglen);
    if (len <= 2 * KD_REQUEST_ID_MAX) fuzz_request_id(copy, len);
    free(copy);
    return 0;
}
