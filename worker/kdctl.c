/* kdctl.c: the kdecode client CLI: one-off calls (generate, loads, info, abort, health) and
 * a load generator (load), all through worker/client.h.
 *
 * Exit codes: 0 success; 1 the call failed (a non-OK status or a local failure; health:
 * anything but SERVING; load: no request succeeded); 2 a usage error (unknown flag,
 * missing value, bad number, bad --data file). --json makes stdout machine-readable:
 * exactly one JSON line per command (on error {"error": {...}}); messages go to stderr. */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <grpc/grpc.h> /* defines: grpc_init, grpc_shutdown_blocking */
#include <jansson.h>

#include "grpc/health/v1/health.pb-c.h" /* defines: Grpc__Health__V1__HealthCheck{Request,Response} */
#include "kdecode/v1/decoder.pb-c.h"    /* defines: Kdecode__V1__* messages */
#include "worker/client.h"              /* defines: kd_client_connect, kd_client_unary, ... */

#define M_GENERATE "/kdecode.v1.Decoder/Generate"
#define M_ABORT "/kdecode.v1.Decoder/Abort"
#define M_LOADS "/kdecode.v1.Decoder/GetLoads"
#define M_INFO "/kdecode.v1.Decoder/GetServerInfo"
#define M_HEALTH "/grpc.health.v1.Health/Check"
#define M_PREFILL "/kdecode.v1.Prefiller/Prefill"

#define EXIT_FAIL 1
#define EXIT_USAGE 2
#define UNARY_DEFAULT_TIMEOUT_S 10.0
#define JSON_FLAGS (JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(10))

/* ---- small helpers ---- */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static const char *const STATUS_NAMES[] = {
    "OK",        "CANCELLED",          "UNKNOWN",      "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
    "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED",
    "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"};
#define N_STATUS ((int)(sizeof STATUS_NAMES / sizeof STATUS_NAMES[0]))

static const char *status_name(int code) {
    return code >= 0 && code < N_STATUS ? STATUS_NAMES[code] : "UNKNOWN";
}

static const char *const FINISH_NAMES[] = {"unspecified", "length", "stop", "abort", "error"};
#define N_FINISH 5

static const char *finish_name(int f) {
    return f >= 0 && f < N_FINISH ? FINISH_NAMES[f] : "unspecified";
}

/* A JSON number, or null when not finite (jansson refuses NaN and infinities). */
static json_t *jnum(double v) {
    return isfinite(v) ? json_real(v) : json_null();
}

/* A JSON string; null when the bytes are not UTF-8. */
static json_t *jstr(const char *s) {
    json_t *j = json_string(s ? s : "");
    return j ? j : json_null();
}

/* Prints one JSON line on stdout and releases the value. */
static void print_json(json_t *v) {
    char *s = json_dumps(v, JSON_FLAGS | JSON_ENCODE_ANY);
    if (s) {
        fputs(s, stdout);
        fputc('\n', stdout);
        free(s);
    }
    fflush(stdout);
    json_decref(v);
}

/* ---- id lists ---- */

typedef struct id_list {
    int32_t *v;
    size_t n;
} id_list;

static void ids_free(id_list *l) {
    free(l->v);
    l->v = NULL;
    l->n = 0;
}

static int ids_copy(id_list *dst, const id_list *src) {
    ids_free(dst);
    if (src->n == 0) return 0;
    dst->v = malloc(src->n * sizeof *dst->v);
    if (!dst->v) return -1;
    memcpy(dst->v, src->v, src->n * sizeof *dst->v);
    dst->n = src->n;
    return 0;
}

/* "1,2,3" (or "" for an empty list) into int32 ids >= 0. */
static int ids_parse(const char *s, id_list *out, char *why, size_t whylen) {
    ids_free(out);
    if (!*s) return 0;
    size_t cap = 1;
    for (const char *p = s; *p; p++) cap += *p == ',';
    out->v = malloc(cap * sizeof *out->v);
    if (!out->v) return snprintf(why, whylen, "out of memory"), -1;
    const char *p = s;
    for (;;) {
        char *end;
        errno = 0;
        while (*p == ' ') p++;
        long long v = strtoll(p, &end, 10);
        if (end == p || errno || v < 0 || v > INT32_MAX) {
            snprintf(why, whylen, "bad token id list \"%s\" (comma-separated integers 0..%d)", s, INT32_MAX);
            ids_free(out);
            return -1;
        }
        out->v[out->n++] = (int32_t)v;
        p = end;
        while (*p == ' ') p++;
        if (*p == '\0') return 0;
        if (*p != ',') {
            snprintf(why, whylen, "bad token id list \"%s\" (comma-separated integers)", s);
            ids_free(out);
            return -1;
        }
        p++;
    }
}

/* ---- options ---- */

enum {
    CMD_GENERATE = 1 << 0,
    CMD_LOADS = 1 << 1,
    CMD_INFO = 1 << 2,
    CMD_ABORT = 1 << 3,
    CMD_HEALTH = 1 << 4,
    CMD_LOAD = 1 << 5,
};
#define CMD_ALL (CMD_GENERATE | CMD_LOADS | CMD_INFO | CMD_ABORT | CMD_HEALTH | CMD_LOAD)
#define CMD_GEN (CMD_GENERATE | CMD_LOAD)

static const struct {
    const char *name;
    int cmd;
} COMMANDS[] = {
    {"generate", CMD_GENERATE}, {"loads", CMD_LOADS},   {"info", CMD_INFO},
    {"abort", CMD_ABORT},       {"health", CMD_HEALTH}, {"load", CMD_LOAD},
};

/* The parsed command line. Integers are held as int64 and range-checked by the table. */
static struct {
    const char *target;
    bool json;
    const char *tls_ca, *tls_cert, *tls_key, *tls_server_name;
    double timeout;
    /* generate (and load) */
    id_list prompt_ids, draft_ids, stop_ids;
    int64_t max_tokens, top_k, spec_tokens, ngram_min, ngram_max;
    double temperature, top_p;
    uint64_t seed;
    int draft; /* index into DRAFT_CHOICES == DraftSource */
    bool ignore_eos;
    const char *request_id;
    /* health */
    const char *service;
    /* the disaggregated path: Prefill on one worker, then Generate on another */
    const char *prefill, *decode;
    int handoff_stats;
    /* load */
    int64_t concurrency, requests, prompt_len, vocab;
    double rate, duration;
    const char *data;
    int arrival; /* index into ARRIVAL_CHOICES */
    uint64_t prompt_seed;
} O;

static const char *const DRAFT_CHOICES[] = {"default", "none", "ngram", "caller", NULL};
static const char *const ARRIVAL_CHOICES[] = {"poisson", "fixed", NULL};

typedef enum { F_STR, F_BOOL, F_INT, F_U64, F_DBL, F_IDS, F_CHOICE } flag_kind;

typedef struct flag_def {
    const char *name;
    flag_kind kind;
    unsigned cmds;
    void *dst;
    double lo, hi;              /* F_INT, F_DBL: accepted range */
    const char *const *choices; /* F_CHOICE: the index goes to *(int *)dst */
    const char *help;
} flag_def;

#define I32MAX 2147483647.0
static const flag_def FLAGS[] = {
    {"--target", F_STR, CMD_ALL, &O.target, 0, 0, NULL, "ADDR  the worker (host:port, or any gRPC target)"},
    {"--json", F_BOOL, CMD_ALL, &O.json, 0, 0, NULL, "      one JSON line on stdout"},
    {"--tls-ca", F_STR, CMD_ALL, &O.tls_ca, 0, 0, NULL, "FILE  TLS: PEM roots that verify the server"},
    {"--tls-cert", F_STR, CMD_ALL, &O.tls_cert, 0, 0, NULL, "FILE  mutual TLS: client certificate (PEM)"},
    {"--tls-key", F_STR, CMD_ALL, &O.tls_key, 0, 0, NULL, "FILE  mutual TLS: client key (PEM)"},
    {"--tls-server-name", F_STR, CMD_ALL, &O.tls_server_name, 0, 0, NULL, "NAME  name expected in the server certificate"},
    {"--timeout", F_DBL, CMD_ALL, &O.timeout, 0, 1e7, NULL,
     "SECONDS  per-call deadline (default 10 for unary calls, none for generate/load; 0: none)"},
    {"--prompt-ids", F_IDS, CMD_GEN, &O.prompt_ids, 0, 0, NULL, "1,2,3  prompt token ids"},
    {"--max-tokens", F_INT, CMD_GEN, &O.max_tokens, 0, I32MAX, NULL, "N  tokens to generate (load default 16)"},
    {"--temperature", F_DBL, CMD_GEN, &O.temperature, 0, 1e9, NULL, "T  0: greedy"},
    {"--top-k", F_INT, CMD_GEN, &O.top_k, 0, I32MAX, NULL, "K"},
    {"--top-p", F_DBL, CMD_GEN, &O.top_p, 0, 1, NULL, "P"},
    {"--seed", F_U64, CMD_GEN, &O.seed, 0, 0, NULL, "S  sampling seed"},
    {"--spec-tokens", F_INT, CMD_GEN, &O.spec_tokens, 0, I32MAX, NULL, "S  draft tokens per step"},
    {"--draft", F_CHOICE, CMD_GEN, &O.draft, 0, 0, DRAFT_CHOICES, "none|ngram|caller|default  draft source"},
    {"--draft-ids", F_IDS, CMD_GEN, &O.draft_ids, 0, 0, NULL, "4,5  caller drafts (implies --draft caller)"},
    {"--ngram-min", F_INT, CMD_GEN, &O.ngram_min, 0, I32MAX, NULL, "N  prompt-lookup n-gram sizes"},
    {"--ngram-max", F_INT, CMD_GEN, &O.ngram_max, 0, I32MAX, NULL, "N"},
    {"--stop-ids", F_IDS, CMD_GEN, &O.stop_ids, 0, 0, NULL, "7,8  stop after any of these tokens"},
    {"--ignore-eos", F_BOOL, CMD_GEN, &O.ignore_eos, 0, 0, NULL, "      do not stop at end of sequence"},
    {"--request-id", F_STR, CMD_GEN | CMD_ABORT, &O.request_id, 0, 0, NULL,
     "ID  request id (load: ghz templates such as {{.RequestNumber}} are expanded)"},
    {"--prefill", F_STR, CMD_GEN, &O.prefill, 0, 0, NULL,
     "ADDR  route through a prefill worker (Prefill, then Generate on --decode)"},
    {"--decode", F_STR, CMD_GEN, &O.decode, 0, 0, NULL, "ADDR  the decode worker (with --prefill; default --target)"},
    {"--handoff-stats", F_BOOL, CMD_GEN, &O.handoff_stats, 0, 0, NULL,
     "      generate --json --prefill: add the PrefillResponse (timings, transport) as \"prefill\""},
    {"--service", F_STR, CMD_HEALTH, &O.service, 0, 0, NULL, "NAME  health service (default \"\": liveness)"},
    {"--concurrency", F_INT, CMD_LOAD, &O.concurrency, 1, 4096, NULL, "C  worker threads (calls in flight)"},
    {"--rate", F_DBL, CMD_LOAD, &O.rate, 1e-6, 1e7, NULL, "R  open loop: start R requests/s in total"},
    {"--arrival", F_CHOICE, CMD_LOAD, &O.arrival, 0, 0, ARRIVAL_CHOICES, "poisson|fixed  open-loop arrivals"},
    {"--duration", F_DBL, CMD_LOAD, &O.duration, 1e-3, 1e7, NULL, "SECONDS  start requests for this long"},
    {"--requests", F_INT, CMD_LOAD, &O.requests, 1, 1e15, NULL, "N  start at most N requests"},
    {"--data", F_STR, CMD_LOAD, &O.data, 0, 0, NULL, "FILE  JSON GenerateRequest(s), ghz format, round-robin"},
    {"--prompt-len", F_INT, CMD_LOAD, &O.prompt_len, 1, 1e7, NULL, "N  random prompt length (default 16)"},
    {"--vocab", F_INT, CMD_LOAD, &O.vocab, 1, I32MAX, NULL, "V  random prompt ids in [0, V) (default: GetServerInfo)"},
    {"--prompt-seed", F_U64, CMD_LOAD, &O.prompt_seed, 0, 0, NULL, "S  seed of the random prompts and arrivals"},
};
#define N_FLAGS (sizeof FLAGS / sizeof FLAGS[0])
static bool GIVEN[N_FLAGS];

/* Whether the flag storing into dst was on the command line. */
static bool given(const void *dst) {
    for (size_t i = 0; i < N_FLAGS; i++)
        if (FLAGS[i].dst == dst) return GIVEN[i];
    return false;
}

static void usage(FILE *f) {
    fputs("usage: kdctl <command> --target ADDR [--json] [--timeout SECONDS]\n"
          "             [--tls-ca FILE [--tls-cert FILE --tls-key FILE] [--tls-server-name NAME]]\n"
          "commands:\n"
          "  generate --prompt-ids 1,2,3 --max-tokens N [sampling/speculation flags]\n"
          "           streams the tokens; --json: one line {tokens, finish, request_id, usage}\n"
          "  loads    GetLoads          info    GetServerInfo\n"
          "  abort --request-id ID      health [--service NAME] (exit 0 only if SERVING)\n"
          "  load --concurrency C (--duration SECONDS | --requests N) [--rate R] [--data FILE]\n"
          "           [generate flags: with --data they override every entry]\n"
          "           a load generator: TTFT, inter-token latency, end-to-end percentiles\n"
          "flags:\n",
          f);
    for (size_t i = 0; i < N_FLAGS; i++) fprintf(f, "  %-18s %s\n", FLAGS[i].name, FLAGS[i].help);
}

static int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int usage_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("kdctl: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputs(" (kdctl --help lists the flags)\n", stderr);
    va_end(ap);
    return EXIT_USAGE;
}

static int parse_value(const flag_def *fd, const char *v) {
    char why[200];
    char *end;
    errno = 0;
    switch (fd->kind) {
    case F_STR:
        *(const char **)fd->dst = v;
        return 0;
    case F_BOOL:
        *(bool *)fd->dst = true;
        return 0;
    case F_INT: {
        long long x = strtoll(v, &end, 10);
        if (!*v || *end || errno || (double)x < fd->lo || (double)x > fd->hi)
            return usage_error("%s: \"%s\" is not an integer in [%.0f, %.0f]", fd->name, v, fd->lo, fd->hi);
        *(int64_t *)fd->dst = x;
        return 0;
    }
    case F_U64: {
        if (!isdigit((unsigned char)v[0])) return usage_error("%s: \"%s\" is not an unsigned integer", fd->name, v);
        unsigned long long x = strtoull(v, &end, 10);
        if (*end || errno) return usage_error("%s: \"%s\" is not an unsigned 64-bit integer", fd->name, v);
        *(uint64_t *)fd->dst = x;
        return 0;
    }
    case F_DBL: {
        double x = strtod(v, &end);
        if (!*v || *end || errno || !isfinite(x) || x < fd->lo || x > fd->hi)
            return usage_error("%s: \"%s\" is not a number in [%g, %g]", fd->name, v, fd->lo, fd->hi);
        *(double *)fd->dst = x;
        return 0;
    }
    case F_IDS:
        if (ids_parse(v, (id_list *)fd->dst, why, sizeof why) != 0) return usage_error("%s: %s", fd->name, why);
        return 0;
    case F_CHOICE:
        for (int i = 0; fd->choices[i]; i++) {
            if (strcmp(v, fd->choices[i]) == 0) {
                *(int *)fd->dst = i;
                return 0;
            }
        }
        return usage_error("%s: \"%s\" is not one of the choices (%s)", fd->name, v, fd->help);
    }
    return EXIT_USAGE;
}

/* Parses the flags after the command. Returns 0, EXIT_USAGE, or -1 for --help. */
static int parse_flags(int cmd, const char *cmdname, int argc, char **argv) {
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) return -1;
        if (strncmp(a, "--", 2) != 0) return usage_error("%s: unexpected argument \"%s\"", cmdname, a);
        const char *eq = strchr(a, '=');
        size_t nlen = eq ? (size_t)(eq - a) : strlen(a);
        const flag_def *fd = NULL;
        size_t fi = 0;
        for (; fi < N_FLAGS; fi++) {
            if (strlen(FLAGS[fi].name) == nlen && strncmp(FLAGS[fi].name, a, nlen) == 0) {
                fd = &FLAGS[fi];
                break;
            }
        }
        if (!fd) return usage_error("%s: unknown flag %.*s", cmdname, (int)nlen, a);
        if (!(fd->cmds & cmd)) return usage_error("%s: flag %s does not apply to this command", cmdname, fd->name);
        if (GIVEN[fi]) return usage_error("%s: flag %s given twice", cmdname, fd->name);
        GIVEN[fi] = true;
        const char *v;
        if (fd->kind == F_BOOL) {
            if (eq) return usage_error("%s: flag %s takes no value", cmdname, fd->name);
            v = "";
        } else if (eq) {
            v = eq + 1;
        } else {
            if (i + 1 >= argc || strncmp(argv[i + 1], "--", 2) == 0)
                return usage_error("%s: flag %s needs a value", cmdname, fd->name);
            v = argv[++i];
        }
        int rc = parse_value(fd, v);
        if (rc) return rc;
    }
    return 0;
}

static void opts_free(void) {
    ids_free(&O.prompt_ids);
    ids_free(&O.draft_ids);
    ids_free(&O.stop_ids);
}

/* ---- protobuf messages as JSON (proto field names) ---- */

static json_t *msg_to_json(const ProtobufCMessage *m);

static size_t field_elem_size(ProtobufCType t) {
    switch (t) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32:
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32:
    case PROTOBUF_C_TYPE_FLOAT:
    case PROTOBUF_C_TYPE_ENUM:
        return 4;
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64:
    case PROTOBUF_C_TYPE_DOUBLE:
        return 8;
    case PROTOBUF_C_TYPE_BOOL:
        return sizeof(protobuf_c_boolean);
    case PROTOBUF_C_TYPE_STRING:
    case PROTOBUF_C_TYPE_MESSAGE:
        return sizeof(void *);
    case PROTOBUF_C_TYPE_BYTES:
        return sizeof(ProtobufCBinaryData);
    }
    return 0;
}

static json_t *field_to_json(const ProtobufCFieldDescriptor *f, const void *p) {
    switch (f->type) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32:
        return json_integer(*(const int32_t *)p);
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32:
        return json_integer(*(const uint32_t *)p);
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
        return json_integer(*(const int64_t *)p);
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64:
        return json_integer((json_int_t) * (const uint64_t *)p);
    case PROTOBUF_C_TYPE_FLOAT:
        return jnum(*(const float *)p);
    case PROTOBUF_C_TYPE_DOUBLE:
        return jnum(*(const double *)p);
    case PROTOBUF_C_TYPE_BOOL:
        return json_boolean(*(const protobuf_c_boolean *)p);
    case PROTOBUF_C_TYPE_ENUM: {
        int v = *(const int *)p;
        const ProtobufCEnumValue *ev = protobuf_c_enum_descriptor_get_value(f->descriptor, v);
        return ev ? json_string(ev->name) : json_integer(v);
    }
    case PROTOBUF_C_TYPE_STRING:
        return jstr(*(char *const *)p);
    case PROTOBUF_C_TYPE_BYTES: {
        const ProtobufCBinaryData *b = p;
        char *hex = malloc(b->len * 2 + 1);
        if (!hex) return json_null();
        for (size_t i = 0; i < b->len; i++) snprintf(hex + 2 * i, 3, "%02x", b->data[i]);
        hex[b->len * 2] = '\0';
        json_t *j = json_string(hex);
        free(hex);
        return j;
    }
    case PROTOBUF_C_TYPE_MESSAGE: {
        const ProtobufCMessage *m = *(ProtobufCMessage *const *)p;
        return m ? msg_to_json(m) : json_null();
    }
    }
    return json_null();
}

/* Every field of m (defaults included), under its proto name; enums by name. */
static json_t *msg_to_json(const ProtobufCMessage *m) {
    const ProtobufCMessageDescriptor *d = m->descriptor;
    const char *base = (const char *)m;
    json_t *o = json_object();
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            size_t n = *(const size_t *)(base + f->quantifier_offset);
            const char *arr = *(char *const *)(base + f->offset);
            size_t sz = field_elem_size(f->type);
            json_t *a = json_array();
            for (size_t j = 0; j < n; j++) json_array_append_new(a, field_to_json(f, arr + j * sz));
            json_object_set_new(o, f->name, a);
            continue;
        }
        if ((f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) && *(const uint32_t *)(base + f->quantifier_offset) != f->id)
            continue;
        json_object_set_new(o, f->name, field_to_json(f, base + f->offset));
    }
    return o;
}

/* Human output of a flat message: "name: value" per field, in proto order. */
static void print_fields(const ProtobufCMessage *m) {
    json_t *o = msg_to_json(m);
    const ProtobufCMessageDescriptor *d = m->descriptor;
    for (unsigned i = 0; i < d->n_fields; i++) {
        json_t *v = json_object_get(o, d->fields[i].name);
        if (!v) continue;
        if (json_is_string(v)) {
            printf("%s: %s\n", d->fields[i].name, json_string_value(v));
        } else {
            char *s = json_dumps(v, JSON_FLAGS | JSON_ENCODE_ANY);
            printf("%s: %s\n", d->fields[i].name, s ? s : "?");
            free(s);
        }
    }
    json_decref(o);
}

/* ---- reporting call failures ---- */

/* A non-OK status: a message on stderr and, with --json, {"error": {...}} on stdout. */
static int report_status(const char *what, const kd_call_status *st) {
    if (st->retry_pushback_ms >= 0)
        fprintf(stderr, "kdctl: %s: %s: %s (retry after %ld ms)\n", what, status_name(st->code), st->details,
                st->retry_pushback_ms);
    else
        fprintf(stderr, "kdctl: %s: %s: %s\n", what, status_name(st->code), st->details);
    if (O.json) {
        json_t *e = json_object();
        json_object_set_new(e, "code", json_integer(st->code));
        json_object_set_new(e, "name", json_string(status_name(st->code)));
        json_object_set_new(e, "message", jstr(st->details));
        if (st->retry_pushback_ms >= 0) json_object_set_new(e, "retry_pushback_ms", json_integer(st->retry_pushback_ms));
        json_t *o = json_object();
        json_object_set_new(o, "error", e);
        print_json(o);
    }
    return EXIT_FAIL;
}

/* A local failure (no status from the server). */
static int report_local(const char *what, const kd_err *err) {
    kd_call_status st = {.code = 2, .retry_pushback_ms = -1};
    snprintf(st.details, sizeof st.details, "%s", err->msg);
    return report_status(what, &st);
}

static double call_timeout(void) {
    return given(&O.timeout) ? O.timeout : UNARY_DEFAULT_TIMEOUT_S;
}

/* A unary call with protobuf-c messages. Returns 0 with *out set, or the exit code after
 * reporting the failure. */
static int unary(kd_client *cl, const char *method, const char *what, const ProtobufCMessage *req,
                 const ProtobufCMessageDescriptor *rd, ProtobufCMessage **out) {
    *out = NULL;
    size_t len = protobuf_c_message_get_packed_size(req);
    uint8_t *buf = malloc(len ? len : 1);
    if (!buf) return fprintf(stderr, "kdctl: out of memory\n"), EXIT_FAIL;
    protobuf_c_message_pack(req, buf);
    uint8_t *resp = NULL;
    size_t rlen = 0;
    kd_call_status st;
    kd_err err = {{0}};
    int rc = kd_client_unary(cl, method, buf, len, call_timeout(), &resp, &rlen, &st, &err);
    free(buf);
    if (rc != 0) return report_local(what, &err);
    if (st.code != 0) {
        free(resp);
        return report_status(what, &st);
    }
    *out = protobuf_c_message_unpack(rd, NULL, rlen, resp);
    free(resp);
    if (!*out) {
        kd_call_status bad = {.code = 13, .retry_pushback_ms = -1};
        snprintf(bad.details, sizeof bad.details, "cannot parse the %s response", rd->name);
        return report_status(what, &bad);
    }
    return 0;
}

/* ---- generate requests (shared by generate and load) ---- */

/* One GenerateRequest shape: from the flags, or one --data entry plus flag overrides. */
typedef struct gen_req {
    char *request_id; /* may hold ghz templates ({{.RequestNumber}}); NULL: "" */
    char *handoff_id;
    id_list prompt;
    bool random_prompt; /* load: draw prompt_len ids below vocab per request */
    int32_t max_tokens;
    bool has_sampling;
    double temperature, top_p;
    int32_t top_k;
    uint64_t seed;
    bool has_spec;
    int32_t num_draft, ngram_min, ngram_max;
    int source;
    id_list drafts;
    id_list stop;
    bool ignore_eos;
} gen_req;

static void gen_req_free(gen_req *g) {
    free(g->request_id);
    free(g->handoff_id);
    ids_free(&g->prompt);
    ids_free(&g->drafts);
    ids_free(&g->stop);
    memset(g, 0, sizeof *g);
}

/* Applies the generate flags given on the command line over g. */
static int gen_req_apply_flags(gen_req *g) {
    if (given(&O.request_id)) {
        free(g->request_id);
        if (!(g->request_id = strdup(O.request_id))) return -1;
    }
    if (given(&O.prompt_ids)) {
        if (ids_copy(&g->prompt, &O.prompt_ids) != 0) return -1;
        g->random_prompt = false;
    }
    if (given(&O.max_tokens)) g->max_tokens = (int32_t)O.max_tokens;
    if (given(&O.temperature)) g->has_sampling = true, g->temperature = O.temperature;
    if (given(&O.top_k)) g->has_sampling = true, g->top_k = (int32_t)O.top_k;
    if (given(&O.top_p)) g->has_sampling = true, g->top_p = O.top_p;
    if (given(&O.seed)) g->has_sampling = true, g->seed = O.seed;
    if (given(&O.spec_tokens)) g->has_spec = true, g->num_draft = (int32_t)O.spec_tokens;
    if (given(&O.draft)) g->has_spec = true, g->source = O.draft;
    if (given(&O.ngram_min)) g->has_spec = true, g->ngram_min = (int32_t)O.ngram_min;
    if (given(&O.ngram_max)) g->has_spec = true, g->ngram_max = (int32_t)O.ngram_max;
    if (given(&O.draft_ids)) {
        g->has_spec = true;
        if (ids_copy(&g->drafts, &O.draft_ids) != 0) return -1;
        if (!given(&O.draft) && g->source == KDECODE__V1__DRAFT_SOURCE__DRAFT_SOURCE_UNSPECIFIED)
            g->source = KDECODE__V1__DRAFT_SOURCE__DRAFT_SOURCE_CALLER;
    }
    if (given(&O.stop_ids) && ids_copy(&g->stop, &O.stop_ids) != 0) return -1;
    if (given(&O.ignore_eos)) g->ignore_eos = true;
    return 0;
}

/* Serializes g with the given request id and prompt. Returns malloc'd bytes or NULL. */
static uint8_t *gen_req_pack(const gen_req *g, const char *rid, const int32_t *prompt, size_t n_prompt,
                             size_t *len) {
    Kdecode__V1__GenerateRequest m = KDECODE__V1__GENERATE_REQUEST__INIT;
    Kdecode__V1__SamplingParams sp = KDECODE__V1__SAMPLING_PARAMS__INIT;
    Kdecode__V1__SpeculationParams sc = KDECODE__V1__SPECULATION_PARAMS__INIT;
    m.request_id = (char *)rid;
    m.n_prompt_token_ids = n_prompt;
    m.prompt_token_ids = (int32_t *)prompt;
    if (g->handoff_id) m.handoff_id = g->handoff_id;
    m.max_tokens = g->max_tokens;
    if (g->has_sampling) {
        sp.temperature = g->temperature;
        sp.top_k = g->top_k;
        sp.top_p = g->top_p;
        sp.seed = g->seed;
        m.sampling = &sp;
    }
    if (g->has_spec) {
        sc.num_draft_tokens = g->num_draft;
        sc.source = (Kdecode__V1__DraftSource)g->source;
        sc.ngram_min = g->ngram_min;
        sc.ngram_max = g->ngram_max;
        sc.n_draft_token_ids = g->drafts.n;
        sc.draft_token_ids = g->drafts.v;
        m.speculation = &sc;
    }
    m.n_stop_token_ids = g->stop.n;
    m.stop_token_ids = g->stop.v;
    m.ignore_eos = g->ignore_eos;
    *len = kdecode__v1__generate_request__get_packed_size(&m);
    uint8_t *buf = malloc(*len ? *len : 1);
    if (buf) kdecode__v1__generate_request__pack(&m, buf);
    return buf;
}

/* Expands ghz templates: {{.RequestNumber}} becomes k, any other {{...}} a suffix unique to
 * this process and request ("<pid hex>-<k>"). Text without templates is copied. */
static void expand_template(const char *t, uint64_t k, char *out, size_t cap) {
    size_t o = 0;
    while (t && *t && o + 1 < cap) {
        if (t[0] == '{' && t[1] == '{') {
            const char *e = strstr(t + 2, "}}");
            if (e) {
                const char *a = t + 2, *b = e;
                while (a < b && isspace((unsigned char)*a)) a++;
                while (b > a && isspace((unsigned char)b[-1])) b--;
                char tmp[64];
                if (b - a == 14 && memcmp(a, ".RequestNumber", 14) == 0)
                    snprintf(tmp, sizeof tmp, "%" PRIu64, k);
                else
                    snprintf(tmp, sizeof tmp, "%lx-%" PRIu64, (unsigned long)getpid(), k);
                for (const char *p = tmp; *p && o + 1 < cap; p++) out[o++] = *p;
                t = e + 2;
                continue;
            }
        }
        out[o++] = *t++;
    }
    out[o] = '\0';
}

/* ---- --data: ghz-style JSON GenerateRequest(s) ---- */

/* camelCase → snake_case (proto3 JSON accepts both spellings). */
static void snake(const char *k, char *out, size_t cap) {
    size_t o = 0;
    for (; *k && o + 2 < cap; k++) {
        if (isupper((unsigned char)*k)) {
            out[o++] = '_';
            out[o++] = (char)tolower((unsigned char)*k);
        } else {
            out[o++] = *k;
        }
    }
    out[o] = '\0';
}

typedef struct data_ctx {
    const char *path;
    size_t index;
    char why[300];
} data_ctx;

static int data_fail(data_ctx *dc, const char *field, const char *what) {
    snprintf(dc->why, sizeof dc->why, "%s: entry %zu: %s: %s", dc->path, dc->index, field, what);
    return -1;
}

/* An integer in [lo, hi] from a JSON number or numeric string (proto3 JSON). */
static int j_int(data_ctx *dc, const char *field, json_t *v, long long lo, long long hi, long long *out) {
    long long x;
    if (json_is_integer(v)) {
        x = json_integer_value(v);
    } else if (json_is_real(v)) {
        double d = json_real_value(v);
        if (d != floor(d) || d < -9.2e18 || d > 9.2e18) return data_fail(dc, field, "not an integer");
        x = (long long)d;
    } else if (json_is_string(v)) {
        const char *s = json_string_value(v);
        char *end;
        errno = 0;
        x = strtoll(s, &end, 10);
        if (!*s || *end || errno) return data_fail(dc, field, "not an integer");
    } else {
        return data_fail(dc, field, "not an integer");
    }
    if (x < lo || x > hi) return data_fail(dc, field, "out of range");
    *out = x;
    return 0;
}

static int j_u64(data_ctx *dc, const char *field, json_t *v, uint64_t *out) {
    if (json_is_string(v)) {
        const char *s = json_string_value(v);
        char *end;
        errno = 0;
        if (!isdigit((unsigned char)s[0])) return data_fail(dc, field, "not an unsigned integer");
        unsigned long long x = strtoull(s, &end, 10);
        if (*end || errno) return data_fail(dc, field, "not an unsigned 64-bit integer");
        *out = x;
        return 0;
    }
    long long x;
    if (j_int(dc, field, v, 0, INT64_MAX, &x) != 0) return -1;
    *out = (uint64_t)x;
    return 0;
}

static int j_double(data_ctx *dc, const char *field, json_t *v, double *out) {
    if (json_is_number(v)) {
        *out = json_number_value(v);
        return 0;
    }
    if (json_is_string(v)) {
        const char *s = json_string_value(v);
        char *end;
        double d = strtod(s, &end);
        if (*s && !*end && isfinite(d)) {
            *out = d;
            return 0;
        }
    }
    return data_fail(dc, field, "not a number");
}

static int j_ids(data_ctx *dc, const char *field, json_t *v, id_list *out) {
    ids_free(out);
    if (!json_is_array(v)) return data_fail(dc, field, "not an array of token ids");
    size_t n = json_array_size(v);
    if (n == 0) return 0;
    out->v = malloc(n * sizeof *out->v);
    if (!out->v) return data_fail(dc, field, "out of memory");
    for (size_t i = 0; i < n; i++) {
        long long x;
        if (j_int(dc, field, json_array_get(v, i), INT32_MIN, INT32_MAX, &x) != 0) {
            ids_free(out);
            return -1;
        }
        out->v[out->n++] = (int32_t)x;
    }
    return 0;
}

static int j_string(data_ctx *dc, const char *field, json_t *v, char **out) {
    if (!json_is_string(v)) return data_fail(dc, field, "not a string");
    free(*out);
    *out = strdup(json_string_value(v));
    return *out ? 0 : data_fail(dc, field, "out of memory");
}

static int data_sampling(data_ctx *dc, json_t *o, gen_req *g) {
    if (!json_is_object(o)) return data_fail(dc, "sampling", "not an object");
    g->has_sampling = true;
    const char *key;
    json_t *v;
    json_object_foreach(o, key, v) {
        char k[64];
        snake(key, k, sizeof k);
        long long x;
        if (json_is_null(v)) continue;
        if (strcmp(k, "temperature") == 0) {
            if (j_double(dc, key, v, &g->temperature) != 0) return -1;
        } else if (strcmp(k, "top_p") == 0) {
            if (j_double(dc, key, v, &g->top_p) != 0) return -1;
        } else if (strcmp(k, "top_k") == 0) {
            if (j_int(dc, key, v, INT32_MIN, INT32_MAX, &x) != 0) return -1;
            g->top_k = (int32_t)x;
        } else if (strcmp(k, "seed") == 0) {
            if (j_u64(dc, key, v, &g->seed) != 0) return -1;
        } else {
            return data_fail(dc, key, "unknown field of SamplingParams");
        }
    }
    return 0;
}

static int data_speculation(data_ctx *dc, json_t *o, gen_req *g) {
    if (!json_is_object(o)) return data_fail(dc, "speculation", "not an object");
    g->has_spec = true;
    const char *key;
    json_t *v;
    json_object_foreach(o, key, v) {
        char k[64];
        snake(key, k, sizeof k);
        long long x;
        if (json_is_null(v)) continue;
        if (strcmp(k, "num_draft_tokens") == 0 || strcmp(k, "ngram_min") == 0 || strcmp(k, "ngram_max") == 0) {
            if (j_int(dc, key, v, INT32_MIN, INT32_MAX, &x) != 0) return -1;
            if (strcmp(k, "num_draft_tokens") == 0)
                g->num_draft = (int32_t)x;
            else if (strcmp(k, "ngram_min") == 0)
                g->ngram_min = (int32_t)x;
            else
                g->ngram_max = (int32_t)x;
        } else if (strcmp(k, "source") == 0) {
            if (json_is_string(v)) {
                const ProtobufCEnumValue *ev =
                    protobuf_c_enum_descriptor_get_value_by_name(&kdecode__v1__draft_source__descriptor,
                                                                 json_string_value(v));
                if (!ev) return data_fail(dc, key, "not a DraftSource name (DRAFT_SOURCE_NGRAM, ...)");
                g->source = ev->value;
            } else {
                if (j_int(dc, key, v, 0, 3, &x) != 0) return -1;
                g->source = (int)x;
            }
        } else if (strcmp(k, "draft_token_ids") == 0) {
            if (j_ids(dc, key, v, &g->drafts) != 0) return -1;
        } else {
            return data_fail(dc, key, "unknown field of SpeculationParams");
        }
    }
    return 0;
}

static int data_entry(data_ctx *dc, json_t *o, gen_req *g) {
    if (!json_is_object(o)) return data_fail(dc, "(entry)", "not a JSON object");
    const char *key;
    json_t *v;
    json_object_foreach(o, key, v) {
        char k[64];
        snake(key, k, sizeof k);
        long long x;
        if (json_is_null(v)) continue;
        if (strcmp(k, "request_id") == 0) {
            if (j_string(dc, key, v, &g->request_id) != 0) return -1;
        } else if (strcmp(k, "handoff_id") == 0) {
            if (j_string(dc, key, v, &g->handoff_id) != 0) return -1;
        } else if (strcmp(k, "prompt_token_ids") == 0) {
            if (j_ids(dc, key, v, &g->prompt) != 0) return -1;
        } else if (strcmp(k, "max_tokens") == 0) {
            if (j_int(dc, key, v, INT32_MIN, INT32_MAX, &x) != 0) return -1;
            g->max_tokens = (int32_t)x;
        } else if (strcmp(k, "sampling") == 0) {
            if (data_sampling(dc, v, g) != 0) return -1;
        } else if (strcmp(k, "speculation") == 0) {
            if (data_speculation(dc, v, g) != 0) return -1;
        } else if (strcmp(k, "stop_token_ids") == 0) {
            if (j_ids(dc, key, v, &g->stop) != 0) return -1;
        } else if (strcmp(k, "ignore_eos") == 0) {
            if (!json_is_boolean(v)) return data_fail(dc, key, "not a boolean");
            g->ignore_eos = json_is_true(v);
        } else {
            return data_fail(dc, key, "unknown field of GenerateRequest");
        }
    }
    return 0;
}

/* Reads --data: one GenerateRequest object or an array of them. */
static int data_load(const char *path, gen_req **out, size_t *n_out, char *why, size_t whylen) {
    *out = NULL;
    *n_out = 0;
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root) return snprintf(why, whylen, "%s:%d: %s", path, je.line, je.text), -1;
    size_t n = json_is_array(root) ? json_array_size(root) : 1;
    if (n == 0) {
        json_decref(root);
        return snprintf(why, whylen, "%s: an empty array", path), -1;
    }
    gen_req *g = calloc(n, sizeof *g);
    if (!g) {
        json_decref(root);
        return snprintf(why, whylen, "out of memory"), -1;
    }
    data_ctx dc = {.path = path};
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        dc.index = i;
        rc = data_entry(&dc, json_is_array(root) ? json_array_get(root, i) : root, &g[i]);
    }
    json_decref(root);
    if (rc != 0) {
        snprintf(why, whylen, "%s", dc.why);
        for (size_t i = 0; i < n; i++) gen_req_free(&g[i]);
        free(g);
        return -1;
    }
    *out = g;
    *n_out = n;
    return 0;
}

/* ---- generate ---- */

typedef struct gen_stream {
    int32_t *tokens;
    size_t n, cap;
    int finish;
    bool has_usage;
    Kdecode__V1__Usage usage;
    char request_id[256];
    bool print; /* human mode: print tokens as they arrive */
    bool bad;   /* a response did not parse */
    bool oom;
} gen_stream;

static int gen_on_msg(void *ctx, const uint8_t *msg, size_t len) {
    gen_stream *gs = ctx;
    Kdecode__V1__GenerateResponse *r = kdecode__v1__generate_response__unpack(NULL, len, msg);
    if (!r) {
        gs->bad = true;
        return 1;
    }
    if (gs->n + r->n_token_ids > gs->cap) {
        size_t cap = gs->cap ? gs->cap : 64;
        while (cap < gs->n + r->n_token_ids) cap *= 2;
        int32_t *t = realloc(gs->tokens, cap * sizeof *t);
        if (!t) {
            gs->oom = true;
            kdecode__v1__generate_response__free_unpacked(r, NULL);
            return 1;
        }
        gs->tokens = t;
        gs->cap = cap;
    }
    for (size_t i = 0; i < r->n_token_ids; i++) {
        if (gs->print) printf(gs->n ? " %d" : "%d", r->token_ids[i]);
        gs->tokens[gs->n++] = r->token_ids[i];
    }
    if (gs->print && r->n_token_ids) fflush(stdout);
    if (r->request_id[0] && !gs->request_id[0]) snprintf(gs->request_id, sizeof gs->request_id, "%s", r->request_id);
    if (r->finish_reason) gs->finish = r->finish_reason;
    if (r->usage) {
        gs->usage = *r->usage;
        gs->usage.base.n_unknown_fields = 0;
        gs->usage.base.unknown_fields = NULL;
        gs->has_usage = true;
    }
    kdecode__v1__generate_response__free_unpacked(r, NULL);
    return 0;
}

/* The prefill worker's client in router mode (--prefill), else NULL. */
static kd_client *g_pcl;
/* generate --json: the PrefillResponse (timings, transport), printed with the tokens */
static int g_keep_prefill;
static json_t *g_prefill;

/* One Generate, directly or, with --prefill, as a minimal router: Prefill on the prefill
 * worker (which samples the first token and hands the state to --decode), the first token
 * passed to on_msg as a GenerateResponse, then Generate with the handoff id on the decode
 * worker for the rest. The caller sees one stream either way. */
static int do_generate(kd_client *cl, const gen_req *g, const char *rid, const int32_t *prompt, size_t n_prompt,
                       double timeout, kd_stream_fn on_msg, void *ctx, kd_call_status *st, kd_err *err) {
    size_t len;
    if (!g_pcl) {
        uint8_t *buf = gen_req_pack(g, rid, prompt, n_prompt, &len);
        if (!buf) return kd_fail(err, "out of memory");
        int rc = kd_client_server_stream(cl, M_GENERATE, buf, len, timeout, on_msg, ctx, st, err);
        free(buf);
        return rc;
    }
    Kdecode__V1__PrefillRequest pr = KDECODE__V1__PREFILL_REQUEST__INIT;
    Kdecode__V1__SamplingParams sp = KDECODE__V1__SAMPLING_PARAMS__INIT;
    pr.request_id = (char *)rid;
    pr.n_prompt_token_ids = n_prompt;
    pr.prompt_token_ids = (int32_t *)prompt;
    if (g->has_sampling) {
        sp.temperature = g->temperature, sp.top_k = g->top_k, sp.top_p = g->top_p, sp.seed = g->seed;
        pr.sampling = &sp;
    }
    pr.decode_target = (char *)O.decode;
    pr.n_stop_token_ids = g->stop.n;
    pr.stop_token_ids = g->stop.v;
    pr.ignore_eos = g->ignore_eos;
    len = kdecode__v1__prefill_request__get_packed_size(&pr);
    uint8_t *buf = malloc(len ? len : 1), *resp = NULL;
    size_t resp_len = 0;
    if (!buf) return kd_fail(err, "out of memory");
    kdecode__v1__prefill_request__pack(&pr, buf);
    int rc = kd_client_unary(g_pcl, M_PREFILL, buf, len, timeout, &resp, &resp_len, st, err);
    free(buf);
    if (rc != 0 || st->code != 0) {
        free(resp);
        return rc;
    }
    Kdecode__V1__PrefillResponse *r = kdecode__v1__prefill_response__unpack(NULL, resp_len, resp);
    free(resp);
    if (!r) return kd_fail(err, "cannot parse the PrefillResponse");
    if (g_keep_prefill) {
        json_decref(g_prefill);
        g_prefill = msg_to_json(&r->base);
    }
    /* the first token, as the first message of the stream */
    Kdecode__V1__GenerateResponse first = KDECODE__V1__GENERATE_RESPONSE__INIT;
    Kdecode__V1__Usage u = KDECODE__V1__USAGE__INIT;
    int32_t tok = r->first_token;
    first.n_token_ids = 1;
    first.token_ids = &tok;
    first.request_id = r->handoff_id[0] ? r->handoff_id : (char *)rid;
    const int done = r->finish_reason == KDECODE__V1__FINISH_REASON__FINISH_REASON_STOP || g->max_tokens <= 1;
    if (done) {
        first.finish_reason = r->finish_reason ? r->finish_reason : KDECODE__V1__FINISH_REASON__FINISH_REASON_LENGTH;
        u.prompt_tokens = r->prompt_tokens, u.completion_tokens = 1, u.cached_tokens = r->cached_tokens;
        first.usage = &u;
    }
    len = kdecode__v1__generate_response__get_packed_size(&first);
    buf = malloc(len ? len : 1);
    if (!buf) {
        kdecode__v1__prefill_response__free_unpacked(r, NULL);
        return kd_fail(err, "out of memory");
    }
    kdecode__v1__generate_response__pack(&first, buf);
    const int stop = on_msg(ctx, buf, len);
    free(buf);
    if (done || stop) {
        if (r->handoff_id[0]) { /* nobody will claim it: free the decode worker's slot now */
            Kdecode__V1__AbortRequest ab = KDECODE__V1__ABORT_REQUEST__INIT;
            ab.request_id = r->handoff_id;
            uint8_t abuf[256], *ar = NULL;
            size_t alen = kdecode__v1__abort_request__pack(&ab, abuf), arl;
            kd_call_status ast;
            kd_err aerr;
            if (kd_client_unary(cl, M_ABORT, abuf, alen, UNARY_DEFAULT_TIMEOUT_S, &ar, &arl, &ast, &aerr) == 0) free(ar);
        }
        kdecode__v1__prefill_response__free_unpacked(r, NULL);
        st->code = 0, st->details[0] = 0, st->retry_pushback_ms = -1;
        return 0;
    }
    gen_req h = *g;
    h.handoff_id = r->handoff_id;
    h.max_tokens = g->max_tokens - 1;
    buf = gen_req_pack(&h, rid, NULL, 0, &len);
    kdecode__v1__prefill_response__free_unpacked(r, NULL);
    if (!buf) return kd_fail(err, "out of memory");
    rc = kd_client_server_stream(cl, M_GENERATE, buf, len, timeout, on_msg, ctx, st, err);
    free(buf);
    return rc;
}

static int cmd_generate(kd_client *cl) {
    gen_req g = {0};
    if (gen_req_apply_flags(&g) != 0) {
        gen_req_free(&g);
        return fprintf(stderr, "kdctl: out of memory\n"), EXIT_FAIL;
    }
    char rid[512];
    expand_template(g.request_id, 0, rid, sizeof rid);
    gen_stream gs = {.print = !O.json};
    kd_call_status st;
    kd_err err = {{0}};
    double timeout = given(&O.timeout) ? O.timeout : 0;
    g_keep_prefill = O.json && O.handoff_stats;
    int rc = do_generate(cl, &g, rid, g.prompt.v, g.prompt.n, timeout, gen_on_msg, &gs, &st, &err);
    gen_req_free(&g);
    if (gs.print && gs.n) printf("\n");
    int ret = 0;
    if (rc != 0) {
        ret = report_local("Generate", &err);
    } else if (gs.bad || gs.oom) {
        kd_call_status bad = {.code = 13, .retry_pushback_ms = -1};
        snprintf(bad.details, sizeof bad.details, "%s", gs.bad ? "cannot parse a GenerateResponse" : "out of memory");
        ret = report_status("Generate", &bad);
    } else if (st.code != 0) {
        ret = report_status("Generate", &st);
    } else if (O.json) {
        json_t *o = json_object();
        json_t *toks = json_array();
        for (size_t i = 0; i < gs.n; i++) json_array_append_new(toks, json_integer(gs.tokens[i]));
        json_object_set_new(o, "tokens", toks);
        json_object_set_new(o, "finish", json_string(finish_name(gs.finish)));
        json_object_set_new(o, "request_id", jstr(gs.request_id));
        json_object_set_new(o, "usage", gs.has_usage ? msg_to_json(&gs.usage.base) : json_null());
        if (g_prefill) json_object_set_new(o, "prefill", g_prefill), g_prefill = NULL;
        print_json(o);
    } else {
        printf("finish: %s  request_id: %s\n", finish_name(gs.finish), gs.request_id);
        if (gs.has_usage) {
            const Kdecode__V1__Usage *u = &gs.usage;
            printf("usage: prompt %" PRId64 ", completion %" PRId64 ", cached %" PRId64 ", drafted %" PRId64
                   ", accepted %" PRId64 ", steps %" PRId64 "; queue %.3f ms, ttft %.3f ms, total %.3f ms\n",
                   u->prompt_tokens, u->completion_tokens, u->cached_tokens, u->drafted_tokens, u->accepted_tokens,
                   u->steps, u->queue_seconds * 1e3, u->time_to_first_token_seconds * 1e3, u->total_seconds * 1e3);
        }
    }
    free(gs.tokens);
    json_decref(g_prefill);
    g_prefill = NULL;
    return ret;
}

/* ---- loads, info, abort, health ---- */

static int show_message(ProtobufCMessage *m) {
    if (O.json)
        print_json(msg_to_json(m));
    else
        print_fields(m);
    protobuf_c_message_free_unpacked(m, NULL);
    return 0;
}

static int cmd_loads(kd_client *cl) {
    Kdecode__V1__GetLoadsRequest req = KDECODE__V1__GET_LOADS_REQUEST__INIT;
    ProtobufCMessage *resp;
    int rc = unary(cl, M_LOADS, "GetLoads", &req.base, &kdecode__v1__loads__descriptor, &resp);
    return rc ? rc : show_message(resp);
}

static int cmd_info(kd_client *cl) {
    Kdecode__V1__GetServerInfoRequest req = KDECODE__V1__GET_SERVER_INFO_REQUEST__INIT;
    ProtobufCMessage *resp;
    int rc = unary(cl, M_INFO, "GetServerInfo", &req.base, &kdecode__v1__server_info__descriptor, &resp);
    return rc ? rc : show_message(resp);
}

static int cmd_abort(kd_client *cl) {
    Kdecode__V1__AbortRequest req = KDECODE__V1__ABORT_REQUEST__INIT;
    req.request_id = (char *)O.request_id;
    ProtobufCMessage *resp;
    int rc = unary(cl, M_ABORT, "Abort", &req.base, &kdecode__v1__abort_response__descriptor, &resp);
    if (rc) return rc;
    if (O.json)
        print_json(msg_to_json(resp));
    else
        printf("aborted %s\n", O.request_id);
    protobuf_c_message_free_unpacked(resp, NULL);
    return 0;
}

static int cmd_health(kd_client *cl) {
    Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    req.service = (char *)(O.service ? O.service : "");
    ProtobufCMessage *resp;
    int rc = unary(cl, M_HEALTH, "Health.Check", &req.base, &grpc__health__v1__health_check_response__descriptor,
                   &resp);
    if (rc) return rc;
    Grpc__Health__V1__HealthCheckResponse *h = (Grpc__Health__V1__HealthCheckResponse *)resp;
    int serving = h->status == GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING;
    if (O.json) {
        print_json(msg_to_json(resp));
    } else {
        const ProtobufCEnumValue *ev = protobuf_c_enum_descriptor_get_value(
            &grpc__health__v1__health_check_response__serving_status__descriptor, h->status);
        printf("%s\n", ev ? ev->name : "UNKNOWN");
    }
    protobuf_c_message_free_unpacked(resp, NULL);
    return serving ? 0 : EXIT_FAIL;
}

/* ---- load: sample sets and their summaries ---- */

typedef struct dvec {
    double *v;
    size_t n, cap;
} dvec;

typedef struct wsample {
    double v, w;
} wsample;

typedef struct wvec {
    wsample *v;
    size_t n, cap;
} wvec;

static bool dvec_push(dvec *d, double x) {
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 256;
        double *v = realloc(d->v, cap * sizeof *v);
        if (!v) return false;
        d->v = v;
        d->cap = cap;
    }
    d->v[d->n++] = x;
    return true;
}

static bool wvec_push(wvec *d, double x, double w) {
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 256;
        wsample *v = realloc(d->v, cap * sizeof *v);
        if (!v) return false;
        d->v = v;
        d->cap = cap;
    }
    d->v[d->n++] = (wsample){x, w};
    return true;
}

static bool dvec_append(dvec *d, const dvec *s) {
    for (size_t i = 0; i < s->n; i++)
        if (!dvec_push(d, s->v[i])) return false;
    return true;
}

static bool wvec_append(wvec *d, const wvec *s) {
    for (size_t i = 0; i < s->n; i++)
        if (!wvec_push(d, s->v[i].v, s->v[i].w)) return false;
    return true;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int cmp_wsample(const void *a, const void *b) {
    double x = ((const wsample *)a)->v, y = ((const wsample *)b)->v;
    return x < y ? -1 : x > y;
}

/* count (samples, or summed weights), mean, min, p50, p90, p99, max; in the unit of the
 * samples times scale. Percentiles are nearest-rank, so p50 <= p90 <= p99. */
typedef struct summary {
    double count, mean, min, p50, p90, p99, max;
} summary;

static summary summarize_w(wvec *s, double scale) {
    summary r = {0, NAN, NAN, NAN, NAN, NAN, NAN};
    if (s->n == 0) return r;
    qsort(s->v, s->n, sizeof *s->v, cmp_wsample);
    double total = 0, sum = 0;
    for (size_t i = 0; i < s->n; i++) total += s->v[i].w, sum += s->v[i].v * s->v[i].w;
    if (!(total > 0)) return r;
    const double qs[3] = {0.50, 0.90, 0.99};
    double *outs[3] = {&r.p50, &r.p90, &r.p99};
    for (int q = 0; q < 3; q++) {
        double target = qs[q] * total, cum = 0;
        size_t i = 0;
        for (; i + 1 < s->n; i++) {
            cum += s->v[i].w;
            if (cum >= target) break;
        }
        *outs[q] = s->v[i].v * scale;
    }
    r.count = total;
    r.mean = sum / total * scale;
    r.min = s->v[0].v * scale;
    r.max = s->v[s->n - 1].v * scale;
    return r;
}

static summary summarize(dvec *d, double scale) {
    summary r = {0, NAN, NAN, NAN, NAN, NAN, NAN};
    if (d->n == 0) return r;
    qsort(d->v, d->n, sizeof *d->v, cmp_double);
    double sum = 0;
    for (size_t i = 0; i < d->n; i++) sum += d->v[i];
    const double qs[3] = {0.50, 0.90, 0.99};
    double *outs[3] = {&r.p50, &r.p90, &r.p99};
    for (int q = 0; q < 3; q++) {
        double rank = ceil(qs[q] * (double)d->n);
        size_t i = rank < 1 ? 0 : (size_t)rank - 1;
        if (i >= d->n) i = d->n - 1;
        *outs[q] = d->v[i] * scale;
    }
    r.count = (double)d->n;
    r.mean = sum / (double)d->n * scale;
    r.min = d->v[0] * scale;
    r.max = d->v[d->n - 1] * scale;
    return r;
}

static json_t *summary_json(const summary *s) {
    json_t *o = json_object();
    json_object_set_new(o, "count", json_integer((json_int_t)s->count));
    json_object_set_new(o, "mean", jnum(s->mean));
    json_object_set_new(o, "min", jnum(s->min));
    json_object_set_new(o, "p50", jnum(s->p50));
    json_object_set_new(o, "p90", jnum(s->p90));
    json_object_set_new(o, "p99", jnum(s->p99));
    json_object_set_new(o, "max", jnum(s->max));
    return o;
}

static void summary_row(const char *name, const summary *s) {
    if (s->count == 0) {
        printf("  %-9s %9d %10s %10s %10s %10s %10s\n", name, 0, "-", "-", "-", "-", "-");
        return;
    }
    printf("  %-9s %9.0f %10.3f %10.3f %10.3f %10.3f %10.3f\n", name, s->count, s->mean, s->p50, s->p90, s->p99,
           s->max);
}

/* ---- load: workers ---- */

static volatile sig_atomic_t g_stop;   /* first SIGINT: start no more requests */
static volatile sig_atomic_t g_cancel; /* second SIGINT: cancel the calls in flight */

static void on_sigint(int sig) {
    (void)sig;
    if (g_stop) g_cancel = 1;
    g_stop = 1;
}

typedef struct load_stats {
    dvec ttft, e2e, late; /* seconds */
    wvec itl;             /* seconds per token, weighted by tokens */
    uint64_t status[N_STATUS + 1]; /* by gRPC code; [N_STATUS]: other codes */
    uint64_t client_errors;         /* local failures (no status) */
    uint64_t finish[N_FINISH];
    uint64_t tokens, prompt_tokens;
    char *msg[N_STATUS + 2]; /* the first message per code; [N_STATUS + 1]: client errors */
    bool oom;
} load_stats;

typedef struct load_shared {
    kd_client *cl;
    const gen_req *reqs;
    size_t nreqs;
    int32_t vocab, prompt_len;
    double timeout;
    bool open, poisson;
    double rate;
    double t0, duration;   /* duration: +inf without --duration */
    uint64_t max_requests; /* UINT64_MAX without --requests */
    pthread_mutex_t mu;    /* guards what follows */
    uint64_t started;
    double next_t; /* open loop: the next scheduled start, seconds after t0 */
    uint64_t rng;
    bool done;
} load_shared;

typedef struct load_worker {
    load_shared *sh;
    pthread_t th;
    uint64_t rng;
    int32_t *prompt; /* random prompt buffer (prompt_len) */
    load_stats st;
} load_worker;

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static double rng_unit(uint64_t *s) {
    return (double)(splitmix(s) >> 11) * 0x1.0p-53;
}

static void sleep_until(double t) {
    for (;;) {
        double d = t - now_s();
        if (d <= 0 || g_stop) return;
        if (d > 0.1) d = 0.1;
        struct timespec ts = {.tv_sec = (time_t)d, .tv_nsec = (long)((d - (double)(time_t)d) * 1e9)};
        nanosleep(&ts, NULL);
    }
}

typedef struct load_call {
    load_worker *w;
    double t_start, t_last;
    bool got_first, bad;
    double ttft;
    uint64_t tokens;
    int finish;
} load_call;

static int load_on_msg(void *ctx, const uint8_t *msg, size_t len) {
    load_call *lc = ctx;
    double t = now_s();
    Kdecode__V1__GenerateResponse *r = kdecode__v1__generate_response__unpack(NULL, len, msg);
    if (!r) {
        lc->bad = true;
        return 1;
    }
    size_t n = r->n_token_ids;
    if (n > 0) {
        if (!lc->got_first) {
            lc->got_first = true;
            lc->ttft = t - lc->t_start;
        } else if (!wvec_push(&lc->w->st.itl, (t - lc->t_last) / (double)n, (double)n)) {
            lc->w->st.oom = true;
        }
        lc->t_last = t;
        lc->tokens += n;
    }
    if (r->finish_reason) lc->finish = r->finish_reason;
    kdecode__v1__generate_response__free_unpacked(r, NULL);
    return g_cancel ? 1 : 0;
}

static void keep_msg(load_stats *st, int slot, const char *msg) {
    if (!st->msg[slot]) st->msg[slot] = strdup(msg);
}

static void load_one(load_worker *w, uint64_t k) {
    load_shared *sh = w->sh;
    load_stats *st = &w->st;
    const gen_req *g = &sh->reqs[k % sh->nreqs];
    char rid[512];
    expand_template(g->request_id, k, rid, sizeof rid);
    const int32_t *prompt = g->prompt.v;
    size_t n_prompt = g->prompt.n;
    if (g->random_prompt) {
        for (int32_t i = 0; i < sh->prompt_len; i++) w->prompt[i] = (int32_t)(splitmix(&w->rng) % (uint64_t)sh->vocab);
        prompt = w->prompt;
        n_prompt = (size_t)sh->prompt_len;
    }
    load_call lc = {.w = w};
    size_t itl_mark = st->itl.n;
    kd_call_status cs;
    kd_err err = {{0}};
    lc.t_start = now_s();
    int rc = do_generate(sh->cl, g, rid, prompt, n_prompt, sh->timeout, load_on_msg, &lc, &cs, &err);
    double t_end = now_s();
    st->tokens += lc.tokens;
    if (rc != 0 || lc.bad) {
        st->client_errors++;
        keep_msg(st, N_STATUS + 1, rc != 0 ? err.msg : "cannot parse a GenerateResponse");
        st->itl.n = itl_mark;
        return;
    }
    int code = cs.code >= 0 && cs.code < N_STATUS ? cs.code : N_STATUS;
    st->status[code]++;
    if (cs.code != 0) {
        keep_msg(st, code, cs.details);
        st->itl.n = itl_mark;
        return;
    }
    st->prompt_tokens += n_prompt;
    st->finish[lc.finish >= 0 && lc.finish < N_FINISH ? lc.finish : 0]++;
    if (!dvec_push(&st->e2e, t_end - lc.t_start)) st->oom = true;
    if (lc.got_first && !dvec_push(&st->ttft, lc.ttft)) st->oom = true;
}

static void *load_worker_main(void *arg) {
    load_worker *w = arg;
    load_shared *sh = w->sh;
    for (;;) {
        double sched = 0;
        pthread_mutex_lock(&sh->mu);
        bool stop = sh->done || g_stop || sh->started >= sh->max_requests;
        if (!stop) {
            if (sh->open) {
                sched = sh->next_t;
                if (sched >= sh->duration) {
                    stop = true;
                } else {
                    double gap = sh->poisson ? -log(1.0 - rng_unit(&sh->rng)) / sh->rate : 1.0 / sh->rate;
                    sh->next_t += gap;
                }
            } else if (now_s() - sh->t0 >= sh->duration) {
                stop = true;
            }
        }
        uint64_t k = sh->started;
        if (stop)
            sh->done = true;
        else
            sh->started++;
        pthread_mutex_unlock(&sh->mu);
        if (stop) break;
        if (sh->open) {
            sleep_until(sh->t0 + sched);
            if (g_stop) break;
            if (!dvec_push(&w->st.late, now_s() - (sh->t0 + sched))) w->st.oom = true;
        }
        load_one(w, k);
    }
    return NULL;
}

static void load_stats_free(load_stats *s) {
    free(s->ttft.v);
    free(s->e2e.v);
    free(s->late.v);
    free(s->itl.v);
    for (int i = 0; i < N_STATUS + 2; i++) free(s->msg[i]);
    memset(s, 0, sizeof *s);
}

static bool load_stats_merge(load_stats *d, load_stats *s) {
    bool ok = dvec_append(&d->ttft, &s->ttft) && dvec_append(&d->e2e, &s->e2e) && dvec_append(&d->late, &s->late) &&
              wvec_append(&d->itl, &s->itl);
    for (int i = 0; i <= N_STATUS; i++) d->status[i] += s->status[i];
    d->client_errors += s->client_errors;
    for (int i = 0; i < N_FINISH; i++) d->finish[i] += s->finish[i];
    d->tokens += s->tokens;
    d->prompt_tokens += s->prompt_tokens;
    for (int i = 0; i < N_STATUS + 2; i++) {
        if (!d->msg[i] && s->msg[i]) {
            d->msg[i] = s->msg[i];
            s->msg[i] = NULL;
        }
    }
    d->oom |= s->oom || !ok;
    return ok;
}

static const char *stat_slot_name(int i) {
    return i < N_STATUS ? STATUS_NAMES[i] : i == N_STATUS ? "OTHER" : "CLIENT_ERROR";
}

static void load_report(const load_shared *sh, load_stats *t, int concurrency, double elapsed) {
    uint64_t ok = t->status[0], failed = t->client_errors;
    for (int i = 1; i <= N_STATUS; i++) failed += t->status[i];
    uint64_t total = ok + failed;
    summary ttft = summarize(&t->ttft, 1e3), e2e = summarize(&t->e2e, 1e3), late = summarize(&t->late, 1e3);
    summary itl = summarize_w(&t->itl, 1e3);
    uint64_t late_n = 0;
    for (size_t i = 0; i < t->late.n; i++) late_n += t->late.v[i] > 1e-3;
    double rps = elapsed > 0 ? (double)ok / elapsed : 0, tps = elapsed > 0 ? (double)t->tokens / elapsed : 0;

    if (O.json) {
        json_t *o = json_object();
        json_object_set_new(o, "mode", json_string(sh->open ? "open" : "closed"));
        json_object_set_new(o, "concurrency", json_integer(concurrency));
        json_object_set_new(o, "rate", sh->open ? jnum(sh->rate) : json_null());
        json_object_set_new(o, "arrival", sh->open ? json_string(sh->poisson ? "poisson" : "fixed") : json_null());
        json_object_set_new(o, "duration_seconds", jnum(sh->duration));
        json_object_set_new(o, "elapsed_seconds", jnum(elapsed));
        json_t *rq = json_object();
        json_object_set_new(rq, "total", json_integer((json_int_t)total));
        json_object_set_new(rq, "ok", json_integer((json_int_t)ok));
        json_object_set_new(rq, "failed", json_integer((json_int_t)failed));
        json_object_set_new(o, "requests", rq);
        json_t *codes = json_object(), *errs = json_object(), *msgs = json_object();
        for (int i = 0; i <= N_STATUS + 1; i++) {
            uint64_t c = i <= N_STATUS ? t->status[i] : t->client_errors;
            if (!c) continue;
            json_object_set_new(codes, stat_slot_name(i), json_integer((json_int_t)c));
            if (i == 0) continue;
            json_object_set_new(errs, stat_slot_name(i), json_integer((json_int_t)c));
            if (t->msg[i]) json_object_set_new(msgs, stat_slot_name(i), jstr(t->msg[i]));
        }
        json_object_set_new(o, "status", codes);
        json_object_set_new(o, "errors", errs);
        json_object_set_new(o, "error_messages", msgs);
        json_t *fin = json_object();
        for (int i = 1; i < N_FINISH; i++) json_object_set_new(fin, FINISH_NAMES[i], json_integer((json_int_t)t->finish[i]));
        if (t->finish[0]) json_object_set_new(fin, FINISH_NAMES[0], json_integer((json_int_t)t->finish[0]));
        json_object_set_new(o, "finish", fin);
        json_t *tok = json_object();
        json_object_set_new(tok, "generated", json_integer((json_int_t)t->tokens));
        json_object_set_new(tok, "prompt", json_integer((json_int_t)t->prompt_tokens));
        json_object_set_new(o, "tokens", tok);
        json_t *tp = json_object();
        json_object_set_new(tp, "requests_per_second", jnum(rps));
        json_object_set_new(tp, "tokens_per_second", jnum(tps));
        json_object_set_new(o, "throughput", tp);
        json_t *lat = json_object();
        json_object_set_new(lat, "ttft", summary_json(&ttft));
        json_object_set_new(lat, "itl", summary_json(&itl));
        json_object_set_new(lat, "e2e", summary_json(&e2e));
        json_object_set_new(o, "latency_ms", lat);
        if (sh->open) {
            json_object_set_new(o, "lateness_ms", summary_json(&late));
            json_object_set_new(o, "late_requests", json_integer((json_int_t)late_n));
        }
        if (t->oom) json_object_set_new(o, "incomplete", json_string("out of memory: some samples were dropped"));
        print_json(o);
        return;
    }
    if (sh->open)
        printf("load: open loop, %.6g req/s (%s arrivals), %d workers", sh->rate, sh->poisson ? "poisson" : "fixed",
               concurrency);
    else
        printf("load: closed loop, %d workers", concurrency);
    if (isfinite(sh->duration)) printf(", %.6g s", sh->duration);
    printf(" (ran %.3f s)\n", elapsed);
    printf("requests: %" PRIu64 " (ok %" PRIu64 ", failed %" PRIu64 ")\n", total, ok, failed);
    for (int i = 1; i <= N_STATUS + 1; i++) {
        uint64_t c = i <= N_STATUS ? t->status[i] : t->client_errors;
        if (c) printf("  %-20s %8" PRIu64 "  %s\n", stat_slot_name(i), c, t->msg[i] ? t->msg[i] : "");
    }
    printf("finish: length %" PRIu64 ", stop %" PRIu64 ", abort %" PRIu64 ", error %" PRIu64 "\n", t->finish[1],
           t->finish[2], t->finish[3], t->finish[4]);
    printf("throughput: %.2f req/s, %.1f tokens/s (%" PRIu64 " tokens)\n", rps, tps, t->tokens);
    printf("  %-9s %9s %10s %10s %10s %10s %10s\n", "ms", "count", "mean", "p50", "p90", "p99", "max");
    summary_row("ttft", &ttft);
    summary_row("itl", &itl);
    summary_row("e2e", &e2e);
    if (sh->open) {
        summary_row("lateness", &late);
        printf("late starts (> 1 ms): %" PRIu64 " of %zu\n", late_n, t->late.n);
    }
    if (t->oom) printf("warning: out of memory, some samples were dropped\n");
}

/* The vocabulary for random prompts: --vocab, else GetServerInfo. */
static int load_vocab(kd_client *cl, int32_t *vocab) {
    if (given(&O.vocab)) {
        *vocab = (int32_t)O.vocab;
        return 0;
    }
    Kdecode__V1__GetServerInfoRequest req = KDECODE__V1__GET_SERVER_INFO_REQUEST__INIT;
    ProtobufCMessage *resp;
    int rc = unary(cl, M_INFO, "GetServerInfo (for the vocabulary; or give --vocab)", &req.base,
                   &kdecode__v1__server_info__descriptor, &resp);
    if (rc) return rc;
    *vocab = ((Kdecode__V1__ServerInfo *)resp)->vocab_size;
    protobuf_c_message_free_unpacked(resp, NULL);
    if (*vocab <= 0) return fprintf(stderr, "kdctl: the server reports vocab_size 0; give --vocab\n"), EXIT_FAIL;
    return 0;
}

static int cmd_load(kd_client *cl) {
    gen_req *reqs = NULL;
    size_t nreqs = 0;
    int ret = 0;
    if (O.data) {
        char why[400];
        if (data_load(O.data, &reqs, &nreqs, why, sizeof why) != 0) return usage_error("load: --data %s", why);
    } else {
        reqs = calloc(1, sizeof *reqs);
        if (!reqs) return fprintf(stderr, "kdctl: out of memory\n"), EXIT_FAIL;
        nreqs = 1;
        reqs[0].random_prompt = true;
        reqs[0].max_tokens = 16;
    }
    for (size_t i = 0; i < nreqs; i++) {
        if (gen_req_apply_flags(&reqs[i]) != 0) {
            { fprintf(stderr, "kdctl: out of memory\n"); ret = EXIT_FAIL; }
            goto out;
        }
    }
    load_shared sh = {
        .cl = cl,
        .reqs = reqs,
        .nreqs = nreqs,
        .prompt_len = given(&O.prompt_len) ? (int32_t)O.prompt_len : 16,
        .timeout = given(&O.timeout) ? O.timeout : 0,
        .open = given(&O.rate),
        .poisson = O.arrival == 0,
        .rate = O.rate,
        .duration = given(&O.duration) ? O.duration : INFINITY,
        .max_requests = given(&O.requests) ? (uint64_t)O.requests : UINT64_MAX,
    };
    if (reqs[0].random_prompt && (ret = load_vocab(cl, &sh.vocab)) != 0) goto out;
    uint64_t seed = given(&O.prompt_seed) ? O.prompt_seed : (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    sh.rng = seed;
    pthread_mutex_init(&sh.mu, NULL);

    int conc = (int)O.concurrency;
    load_worker *ws = calloc((size_t)conc, sizeof *ws);
    if (!ws) {
        pthread_mutex_destroy(&sh.mu);
        { fprintf(stderr, "kdctl: out of memory\n"); ret = EXIT_FAIL; }
        goto out;
    }
    struct sigaction sa = {.sa_handler = on_sigint}, old;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old);

    sh.t0 = now_s();
    int started = 0;
    for (int i = 0; i < conc; i++) {
        ws[i].sh = &sh;
        ws[i].rng = seed ^ (0xD1B54A32D192ED03ULL * (uint64_t)(i + 1));
        if (!(ws[i].prompt = malloc((size_t)sh.prompt_len * sizeof(int32_t)))) break;
        if (pthread_create(&ws[i].th, NULL, load_worker_main, &ws[i]) != 0) {
            free(ws[i].prompt);
            ws[i].prompt = NULL;
            break;
        }
        started++;
    }
    if (started < conc) fprintf(stderr, "kdctl: load: started only %d of %d workers\n", started, conc);
    for (int i = 0; i < started; i++) pthread_join(ws[i].th, NULL);
    double elapsed = now_s() - sh.t0;
    sigaction(SIGINT, &old, NULL);

    load_stats total = {0};
    for (int i = 0; i < conc; i++) {
        load_stats_merge(&total, &ws[i].st);
        load_stats_free(&ws[i].st);
        free(ws[i].prompt);
    }
    free(ws);
    pthread_mutex_destroy(&sh.mu);
    if (started == 0) {
        { fprintf(stderr, "kdctl: load: no worker thread started\n"); ret = EXIT_FAIL; }
    } else {
        load_report(&sh, &total, started, elapsed);
        uint64_t all = total.client_errors;
        for (int i = 0; i <= N_STATUS; i++) all += total.status[i];
        if (all > 0 && total.status[0] == 0) {
            fprintf(stderr, "kdctl: load: no request succeeded\n");
            ret = EXIT_FAIL;
        }
    }
    load_stats_free(&total);
out:
    for (size_t i = 0; i < nreqs; i++) gen_req_free(&reqs[i]);
    free(reqs);
    return ret;
}

/* ---- main ---- */

static int check_required(int cmd, const char *name) {
    if (O.decode && !O.prefill) return usage_error("%s: --decode goes with --prefill", name);
    if (O.prefill && !O.decode) O.decode = O.target;
    if (O.prefill && !O.decode) return usage_error("%s: --prefill needs --decode (or --target)", name);
    if (!O.target) O.target = O.decode;
    if (!O.target) return usage_error("%s: --target is required", name);
    if ((O.tls_cert || O.tls_key || O.tls_server_name) && !O.tls_ca)
        return usage_error("%s: --tls-cert, --tls-key and --tls-server-name need --tls-ca", name);
    if ((!O.tls_cert) != (!O.tls_key)) return usage_error("%s: --tls-cert and --tls-key go together", name);
    if (cmd == CMD_GENERATE) {
        if (!given(&O.prompt_ids)) return usage_error("generate: --prompt-ids is required");
        if (!given(&O.max_tokens)) return usage_error("generate: --max-tokens is required");
    }
    if (cmd == CMD_ABORT && !O.request_id) return usage_error("abort: --request-id is required");
    if (cmd == CMD_LOAD) {
        if (!given(&O.concurrency)) return usage_error("load: --concurrency is required");
        if (!given(&O.duration) && !given(&O.requests)) return usage_error("load: --duration (or --requests) is required");
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return EXIT_USAGE;
    }
    const char *name = argv[1];
    if (strcmp(name, "--help") == 0 || strcmp(name, "-h") == 0 || strcmp(name, "help") == 0) {
        usage(stdout);
        return 0;
    }
    int cmd = 0;
    for (size_t i = 0; i < sizeof COMMANDS / sizeof COMMANDS[0]; i++)
        if (strcmp(name, COMMANDS[i].name) == 0) cmd = COMMANDS[i].cmd;
    if (!cmd) return usage_error("unknown command \"%s\"", name);
    int rc = parse_flags(cmd, name, argc - 2, argv + 2);
    if (rc == -1) {
        usage(stdout);
        opts_free();
        return 0;
    }
    if (rc == 0) rc = check_required(cmd, name);
    if (rc) {
        opts_free();
        return rc;
    }

    grpc_init();
    kd_tls_opts tls = {.ca_file = O.tls_ca, .cert_file = O.tls_cert, .key_file = O.tls_key,
                       .server_name = O.tls_server_name};
    kd_err err = {{0}};
    kd_client *cl = kd_client_connect(O.target, &tls, &err);
    if (cl && O.prefill && !(g_pcl = kd_client_connect(O.prefill, &tls, &err))) {
        kd_client_close(cl);
        cl = NULL;
    }
    if (!cl) {
        rc = report_local("connect", &err);
    } else {
        switch (cmd) {
        case CMD_GENERATE: rc = cmd_generate(cl); break;
        case CMD_LOADS: rc = cmd_loads(cl); break;
        case CMD_INFO: rc = cmd_info(cl); break;
        case CMD_ABORT: rc = cmd_abort(cl); break;
        case CMD_HEALTH: rc = cmd_health(cl); break;
        case CMD_LOAD: rc = cmd_load(cl); break;
        }
        kd_client_close(cl);
        kd_client_close(g_pcl);
    }
    grpc_shutdown_blocking();
    opts_free();
    return rc;
}
