/* metrics_test.c: worker/metrics.h, the Prometheus registry and its HTTP exposition.
 *
 * The rendered text is parsed back here by a strict reader of text format 0.0.4 (every line
 * is a HELP, a TYPE or a sample `name{labels} value`; HELP and TYPE once per family, HELP
 * first; samples belong to the family of the TYPE above them; no duplicate series), and the
 * values are checked against what the test put in: counters and gauges one by one,
 * histograms bucket by bucket (an observation counts in every bucket whose le it does not
 * exceed), _sum and _count. Names are the ones the header's comments promise, written out
 * again here. Concurrency: several pthreads update while another renders; totals must be
 * exact and every snapshot self-consistent. HTTP: a plain socket client (HTTP/1.0). */
#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "tests/testutil.h"
#include "worker/metrics.h"

/* ---- what the header promises ---- */

static const struct {
    kd_metric_counter c;
    const char *name, *labels;
} want_counters[] = {
    {KD_C_REQUESTS_FINISHED_LENGTH, "kdecode_requests_finished_total", "reason=\"length\""},
    {KD_C_REQUESTS_FINISHED_STOP, "kdecode_requests_finished_total", "reason=\"stop\""},
    {KD_C_REQUESTS_FINISHED_ABORT, "kdecode_requests_finished_total", "reason=\"abort\""},
    {KD_C_REQUESTS_FINISHED_ERROR, "kdecode_requests_finished_total", "reason=\"error\""},
    {KD_C_REJECTED_INVALID, "kdecode_requests_rejected_total", "reason=\"invalid\""},
    {KD_C_REJECTED_BUSY, "kdecode_requests_rejected_total", "reason=\"busy\""},
    {KD_C_REJECTED_DRAINING, "kdecode_requests_rejected_total", "reason=\"draining\""},
    {KD_C_PROMPT_TOKENS, "kdecode_prompt_tokens_total", ""},
    {KD_C_GENERATED_TOKENS, "kdecode_generation_tokens_total", ""},
    {KD_C_DRAFTED_TOKENS, "kdecode_spec_draft_tokens_total", ""},
    {KD_C_ACCEPTED_TOKENS, "kdecode_spec_accepted_tokens_total", ""},
    {KD_C_HELD_TOKENS, "kdecode_spec_held_tokens_total", ""},
    {KD_C_STEPS, "kdecode_steps_total", ""},
    {KD_C_PREFIX_QUERIES, "kdecode_prefix_cache_queries_total", ""},
    {KD_C_PREFIX_HITS, "kdecode_prefix_cache_hits_total", ""},
    {KD_C_PREFIX_HIT_TOKENS, "kdecode_prefix_cache_hit_tokens_total", ""},
    {KD_C_HANDOFF_BYTES, "kdecode_handoff_bytes_total", ""},
    {KD_C_HANDOFF_FAILURES, "kdecode_handoff_failures_total", ""},
    {KD_C_HANDOFF_NCCL_FALLBACKS, "kdecode_handoff_nccl_fallbacks_total", ""},
    {KD_C_HANDOFF_WRITE_DEFERRALS, "kdecode_handoff_write_deferrals_total", ""},
    {KD_C_GRAPH_CAPTURES, "kdecode_cuda_graph_captures_total", ""},
    {KD_C_GRAPH_REPLAYS, "kdecode_cuda_graph_replays_total", ""},
};

static const struct {
    kd_metric_gauge g;
    const char *name;
} want_gauges[] = {
    {KD_G_RUNNING, "kdecode_requests_running"},
    {KD_G_WAITING, "kdecode_requests_waiting"},
    {KD_G_SLOTS_USED, "kdecode_slots_used"},
    {KD_G_SLOTS_TOTAL, "kdecode_slots_total"},
    {KD_G_SLOT_UTILISATION, "kdecode_slot_utilization"},
    {KD_G_PREFIX_ENTRIES, "kdecode_prefix_cache_entries"},
    {KD_G_READY, "kdecode_ready"},
    {KD_G_DRAINING, "kdecode_draining"},
    {KD_G_HANDOFFS_PENDING, "kdecode_handoffs_pending"},
    {KD_G_NCCL_LINKS, "kdecode_nccl_links"},
    {KD_G_HANDOFF_SLOTS_READY, "kdecode_handoff_slots_ready"},
};

/* min_le / max_le: the range the buckets must cover for the histogram's unit. */
static const struct {
    kd_metric_hist h;
    const char *name;
    double min_le, max_le;
} want_hists[] = {
    {KD_H_TTFT, "kdecode_time_to_first_token_seconds", 0.001, 60},
    {KD_H_ITL, "kdecode_inter_token_latency_seconds", 0.0001, 2},
    {KD_H_E2E, "kdecode_request_duration_seconds", 0.001, 60},
    {KD_H_QUEUE, "kdecode_queue_wait_seconds", 0.001, 60},
    {KD_H_STEP, "kdecode_step_duration_seconds", 0.0001, 2},
    {KD_H_HANDOFF, "kdecode_handoff_duration_seconds", 0.001, 60},
};

#define NELEM(a) (sizeof(a) / sizeof *(a))

/* ---- a strict reader of the exposition format ---- */

typedef struct sample {
    char name[128];
    char labels[256]; /* between the braces, as written; "" without braces */
    double value;
} sample;

typedef struct family {
    char name[128];
    char type[16];
    int helps, types;
} family;

typedef struct expo {
    sample *s;
    int n, cap;
    family f[64];
    int nf;
} expo;

static int name_start(int c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
}
static int name_char(int c) { return name_start(c) || (c >= '0' && c <= '9'); }

/* Reads a metric name at *p into out; returns its length (0: none). */
static size_t read_name(const char **p, char *out, size_t cap) {
    const char *s = *p;
    size_t n = 0;
    if (!name_start((unsigned char)s[0])) return 0;
    while (name_char((unsigned char)s[n])) n++;
    ck_assert_uint_lt(n, cap);
    memcpy(out, s, n);
    out[n] = '\0';
    *p = s + n;
    return n;
}

static family *find_family(expo *e, const char *name) {
    for (int i = 0; i < e->nf; i++)
        if (strcmp(e->f[i].name, name) == 0) return &e->f[i];
    return NULL;
}

static family *get_family(expo *e, const char *name) {
    family *f = find_family(e, name);
    if (f) return f;
    ck_assert_int_lt(e->nf, (int)NELEM(e->f));
    f = &e->f[e->nf++];
    memset(f, 0, sizeof *f);
    snprintf(f->name, sizeof f->name, "%s", name);
    return f;
}

static int ends_with(const char *s, const char *base, const char *suffix) {
    size_t bl = strlen(base);
    return strncmp(s, base, bl) == 0 && strcmp(s + bl, suffix) == 0;
}

static void parse_line(expo *e, const char *line, family **cur) {
    if (line[0] == '#') {
        int help = strncmp(line, "# HELP ", 7) == 0, type = strncmp(line, "# TYPE ", 7) == 0;
        ck_assert_msg(help || type, "unexpected comment line: %s", line);
        const char *p = line + 7;
        char name[128];
        ck_assert_msg(read_name(&p, name, sizeof name) > 0, "bad family name: %s", line);
        ck_assert_msg(*p == ' ' && p[1] != '\0', "missing %s text: %s", help ? "help" : "type",
                      line);
        family *f = get_family(e, name);
        if (help) {
            ck_assert_msg(f->helps == 0 && f->types == 0, "HELP twice or after TYPE: %s", line);
            f->helps++;
        } else {
            ck_assert_msg(f->types == 0, "TYPE twice: %s", line);
            ck_assert_msg(f->helps == 1, "TYPE without HELP before it: %s", line);
            const char *t = p + 1;
            ck_assert_msg(!strcmp(t, "counter") || !strcmp(t, "gauge") || !strcmp(t, "histogram") ||
                              !strcmp(t, "summary") || !strcmp(t, "untyped"),
                          "bad type: %s", line);
            snprintf(f->type, sizeof f->type, "%s", t);
            f->types++;
            *cur = f;
        }
        return;
    }
    if (e->n == e->cap) {
        e->cap = e->cap ? 2 * e->cap : 256;
        e->s = realloc(e->s, (size_t)e->cap * sizeof *e->s);
        ck_assert_ptr_nonnull(e->s);
    }
    sample *s = &e->s[e->n];
    memset(s, 0, sizeof *s);
    const char *p = line;
    ck_assert_msg(read_name(&p, s->name, sizeof s->name) > 0, "bad sample name: %s", line);
    if (*p == '{') {
        const char *lb = ++p;
        for (;;) {
            char lname[128];
            ck_assert_msg(read_name(&p, lname, sizeof lname) > 0 && !strchr(lname, ':'),
                          "bad label name: %s", line);
            ck_assert_msg(p[0] == '=' && p[1] == '"', "bad label: %s", line);
            p += 2;
            while (*p && *p != '"') {
                if (*p == '\\') {
                    ck_assert_msg(p[1] == '\\' || p[1] == '"' || p[1] == 'n', "bad escape: %s",
                                  line);
                    p++;
                }
                p++;
            }
            ck_assert_msg(*p == '"', "unterminated label value: %s", line);
            p++;
            if (*p == ',') {
                p++;
                continue;
            }
            ck_assert_msg(*p == '}', "bad label list: %s", line);
            break;
        }
        size_t n = (size_t)(p - lb);
        ck_assert_uint_lt(n, sizeof s->labels);
        memcpy(s->labels, lb, n);
        s->labels[n] = '\0';
        p++;
    }
    ck_assert_msg(*p == ' ' && p[1] != '\0' && p[1] != ' ', "want one space then a value: %s",
                  line);
    p++;
    char *end;
    errno = 0;
    s->value = strtod(p, &end);
    ck_assert_msg(end != p && *end == '\0', "value does not parse (or a timestamp follows): %s",
                  line);
    if (isinf(s->value))
        ck_assert_msg(!strcmp(p, "+Inf") || !strcmp(p, "-Inf"), "spell Inf as +Inf: %s", line);
    if (isnan(s->value)) ck_assert_msg(!strcmp(p, "NaN"), "spell NaN as NaN: %s", line);

    family *f = *cur;
    ck_assert_msg(f != NULL, "sample before any TYPE: %s", line);
    if (!strcmp(f->type, "histogram"))
        ck_assert_msg(ends_with(s->name, f->name, "_bucket") ||
                          ends_with(s->name, f->name, "_sum") ||
                          ends_with(s->name, f->name, "_count"),
                      "sample %s outside its histogram family %s", s->name, f->name);
    else
        ck_assert_msg(!strcmp(s->name, f->name), "sample %s outside its family %s", s->name,
                      f->name);
    for (int i = 0; i < e->n; i++)
        ck_assert_msg(strcmp(e->s[i].name, s->name) || strcmp(e->s[i].labels, s->labels),
                      "duplicate series: %s", line);
    e->n++;
}

static void parse_expo(const char *text, size_t len, expo *e) {
    memset(e, 0, sizeof *e);
    ck_assert_uint_gt(len, 0);
    ck_assert_uint_eq(strlen(text), len);
    ck_assert_msg(text[len - 1] == '\n', "text must end with a newline");
    ck_assert_msg(!strchr(text, '\r'), "no carriage returns");
    family *cur = NULL;
    const char *p = text;
    char line[1024];
    while (*p) {
        const char *nl = strchr(p, '\n');
        size_t n = (size_t)(nl - p);
        ck_assert_msg(n > 0, "empty line");
        ck_assert_uint_lt(n, sizeof line);
        memcpy(line, p, n);
        line[n] = '\0';
        parse_line(e, line, &cur);
        p = nl + 1;
    }
    for (int i = 0; i < e->nf; i++)
        ck_assert_msg(e->f[i].helps == 1 && e->f[i].types == 1, "family %s: HELP %d, TYPE %d",
                      e->f[i].name, e->f[i].helps, e->f[i].types);
}

static void expo_free(expo *e) { free(e->s); }

static const sample *find(const expo *e, const char *name, const char *labels) {
    for (int i = 0; i < e->n; i++)
        if (!strcmp(e->s[i].name, name) && !strcmp(e->s[i].labels, labels)) return &e->s[i];
    return NULL;
}

static double value_of(const expo *e, const char *name, const char *labels) {
    const sample *s = find(e, name, labels);
    ck_assert_msg(s != NULL, "missing series %s{%s}", name, labels);
    return s->value;
}

static void render_parse(kd_metrics *m, expo *e) {
    char *text = NULL;
    size_t len = 0;
    ck_assert_int_eq(kd_metrics_render(m, &text, &len), 0);
    ck_assert_ptr_nonnull(text);
    parse_expo(text, len, e);
    free(text);
}

/* The buckets of one histogram, in the order written: le bounds and cumulative counts.
 * Checks the shape: le ascending and distinct, last +Inf, counts monotone, +Inf == _count. */
typedef struct buckets {
    double le[64], cum[64];
    int n;
    double count, sum;
} buckets;

static void get_buckets(const expo *e, const char *name, buckets *b) {
    char bn[160], sn[160], cn[160];
    snprintf(bn, sizeof bn, "%s_bucket", name);
    snprintf(sn, sizeof sn, "%s_sum", name);
    snprintf(cn, sizeof cn, "%s_count", name);
    memset(b, 0, sizeof *b);
    for (int i = 0; i < e->n; i++) {
        if (strcmp(e->s[i].name, bn)) continue;
        const char *l = e->s[i].labels;
        ck_assert_msg(!strncmp(l, "le=\"", 4) && l[strlen(l) - 1] == '"' && !strchr(l, ','),
                      "bucket labels %s", l);
        char *end;
        double le = strtod(l + 4, &end);
        ck_assert_msg(*end == '"' && end != l + 4, "bad le %s", l);
        if (isinf(le)) ck_assert_str_eq(l, "le=\"+Inf\"");
        ck_assert_int_lt(b->n, 64);
        b->le[b->n] = le;
        b->cum[b->n] = e->s[i].value;
        if (b->n > 0) {
            ck_assert_msg(le > b->le[b->n - 1], "%s: le not ascending", name);
            ck_assert_msg(b->cum[b->n] >= b->cum[b->n - 1], "%s: buckets not cumulative", name);
        }
        b->n++;
    }
    ck_assert_msg(b->n >= 2, "%s: no buckets", name);
    ck_assert_msg(isinf(b->le[b->n - 1]) && b->le[b->n - 1] > 0, "%s: last bucket not +Inf",
                  name);
    b->count = value_of(e, cn, "");
    b->sum = value_of(e, sn, "");
    ck_assert_msg(b->cum[b->n - 1] == b->count, "%s: +Inf bucket %.17g != _count %.17g", name,
                  b->cum[b->n - 1], b->count);
}

/* Every bucket holds exactly the observations <= le; _sum is their sum. */
static void check_hist(const expo *e, const char *name, const double *obs, int n) {
    buckets b;
    get_buckets(e, name, &b);
    ck_assert_double_eq(b.count, (double)n);
    double sum = 0;
    for (int j = 0; j < n; j++) sum += obs[j];
    for (int i = 0; i < b.n; i++) {
        int want = 0;
        for (int j = 0; j < n; j++) want += obs[j] <= b.le[i];
        ck_assert_msg(b.cum[i] == want, "%s le=%.17g: %.17g, want %d", name, b.le[i], b.cum[i],
                      want);
    }
    ck_assert_msg(fabs(b.sum - sum) <= 1e-12 * fabs(sum), "%s: sum %.17g, want %.17g", name,
                  b.sum, sum);
}

/* ---- values and format ---- */

static void check_families(const expo *e) {
    for (size_t i = 0; i < NELEM(want_counters); i++) {
        family *f = find_family((expo *)e, want_counters[i].name);
        ck_assert_msg(f != NULL, "no family %s", want_counters[i].name);
        ck_assert_str_eq(f->type, "counter");
    }
    for (size_t i = 0; i < NELEM(want_gauges); i++) {
        family *f = find_family((expo *)e, want_gauges[i].name);
        ck_assert_msg(f != NULL, "no family %s", want_gauges[i].name);
        ck_assert_str_eq(f->type, "gauge");
    }
    for (size_t i = 0; i < NELEM(want_hists); i++) {
        family *f = find_family((expo *)e, want_hists[i].name);
        ck_assert_msg(f != NULL, "no family %s", want_hists[i].name);
        ck_assert_str_eq(f->type, "histogram");
    }
    family *f = find_family((expo *)e, "kdecode_build_info");
    ck_assert_ptr_nonnull(f);
    ck_assert_str_eq(f->type, "gauge");
    ck_assert_double_eq(value_of(e, "kdecode_build_info", "version=\"0.1.0\""), 1.0);
    /* nothing else: build_info, 2 labelled + 15 plain counter families, gauges, histograms */
    ck_assert_int_eq(e->nf, 1 + 17 + (int)NELEM(want_gauges) + (int)NELEM(want_hists));
}

START_TEST(fresh_registry_is_zero) {
    kd_metrics *m = kd_metrics_create();
    ck_assert_ptr_nonnull(m);
    expo e;
    render_parse(m, &e);
    check_families(&e);
    for (size_t i = 0; i < NELEM(want_counters); i++) {
        ck_assert_double_eq(value_of(&e, want_counters[i].name, want_counters[i].labels), 0);
        ck_assert_uint_eq(kd_metrics_counter(m, want_counters[i].c), 0);
    }
    for (size_t i = 0; i < NELEM(want_gauges); i++)
        ck_assert_double_eq(value_of(&e, want_gauges[i].name, ""), 0);
    for (size_t i = 0; i < NELEM(want_hists); i++) {
        check_hist(&e, want_hists[i].name, NULL, 0);
        buckets b;
        get_buckets(&e, want_hists[i].name, &b);
        ck_assert_msg(b.le[0] <= want_hists[i].min_le && b.le[b.n - 2] >= want_hists[i].max_le,
                      "%s: finite buckets span [%g, %g], want at least [%g, %g]",
                      want_hists[i].name, b.le[0], b.le[b.n - 2], want_hists[i].min_le,
                      want_hists[i].max_le);
        ck_assert_int_ge(b.n, 10);
        uint64_t c = 1;
        double s = 1;
        kd_metrics_hist(m, want_hists[i].h, &c, &s);
        ck_assert_uint_eq(c, 0);
        ck_assert_double_eq(s, 0);
    }
    expo_free(&e);
    kd_metrics_free(m);
}
END_TEST

START_TEST(values_round_trip) {
    kd_test_rng r;
    kd_test_rng_init(&r, kd_test_seed());
    kd_metrics *m = kd_metrics_create();
    ck_assert_ptr_nonnull(m);

    uint64_t cwant[KD_C_COUNT] = {0};
    for (int k = 0; k < 200; k++) {
        kd_metric_counter c = (kd_metric_counter)(kd_test_rng_u64(&r) % KD_C_COUNT);
        uint64_t n = kd_test_rng_u64(&r) % 3 == 0 ? kd_test_rng_u64(&r) % 1000000 : 1;
        kd_metrics_add(m, c, n);
        cwant[c] += n;
    }
    double gwant[KD_G_COUNT];
    const double fixed[] = {0.1, 1.0 / 3.0, -5, 1e-300, 123456789012345.0, 0.75};
    for (int g = 0; g < KD_G_COUNT; g++) {
        gwant[g] = g < (int)NELEM(fixed) ? fixed[g] : kd_test_rng_normal(&r) * 100;
        kd_metrics_set(m, (kd_metric_gauge)g, 42); /* overwritten: a gauge keeps the last */
        kd_metrics_set(m, (kd_metric_gauge)g, gwant[g]);
    }
    /* Observations over 1e-6 .. 1e3 s (log-uniform), plus exact bucket bounds (le is
     * inclusive), zero and a negative value. */
    enum { NOBS = 600 };
    static double obs[KD_H_COUNT][NOBS + 8];
    int nobs[KD_H_COUNT] = {0};
    const double edges[] = {0.001, 0.0001, 60, 2, 1, 0.0, -0.5, 0.1};
    for (int h = 0; h < KD_H_COUNT; h++) {
        for (int k = 0; k < NOBS; k++) {
            double v = pow(10.0, -6.0 + 9.0 * kd_test_rng_uniform(&r));
            obs[h][nobs[h]++] = v;
            kd_metrics_observe(m, (kd_metric_hist)h, v);
        }
        for (size_t k = 0; k < NELEM(edges); k++) {
            obs[h][nobs[h]++] = edges[k];
            kd_metrics_observe(m, (kd_metric_hist)h, edges[k]);
        }
    }

    expo e;
    render_parse(m, &e);
    check_families(&e);
    for (size_t i = 0; i < NELEM(want_counters); i++) {
        kd_metric_counter c = want_counters[i].c;
        ck_assert_uint_eq(kd_metrics_counter(m, c), cwant[c]);
        ck_assert_double_eq(value_of(&e, want_counters[i].name, want_counters[i].labels),
                            (double)cwant[c]);
    }
    for (size_t i = 0; i < NELEM(want_gauges); i++) {
        kd_metric_gauge g = want_gauges[i].g;
        ck_assert_double_eq(kd_metrics_gauge(m, g), gwant[g]);
        /* exact: the text must read back to the very same double */
        ck_assert_msg(value_of(&e, want_gauges[i].name, "") == gwant[g], "%s: %.17g vs %.17g",
                      want_gauges[i].name, value_of(&e, want_gauges[i].name, ""), gwant[g]);
    }
    for (size_t i = 0; i < NELEM(want_hists); i++) {
        kd_metric_hist h = want_hists[i].h;
        check_hist(&e, want_hists[i].name, obs[h], nobs[h]);
        uint64_t c;
        double s, want = 0;
        kd_metrics_hist(m, h, &c, &s);
        for (int k = 0; k < nobs[h]; k++) want += obs[h][k];
        ck_assert_uint_eq(c, (uint64_t)nobs[h]);
        ck_assert_double_eq_tol(s, want, 1e-12 * want);
    }
    expo_free(&e);
    kd_metrics_free(m);
}
END_TEST

START_TEST(special_values) {
    kd_metrics *m = kd_metrics_create();
    kd_metrics_set(m, KD_G_RUNNING, NAN);
    kd_metrics_set(m, KD_G_WAITING, INFINITY);
    kd_metrics_set(m, KD_G_SLOTS_USED, -INFINITY);
    kd_metrics_observe(m, KD_H_STEP, NAN); /* dropped */
    kd_metrics_observe(m, KD_H_STEP, 0.01);
    kd_metrics_observe(m, KD_H_E2E, INFINITY);
    kd_metrics_add(m, KD_C_HANDOFF_BYTES, UINT64_C(1) << 60);

    char *text;
    size_t len;
    ck_assert_int_eq(kd_metrics_render(m, &text, &len), 0);
    ck_assert_ptr_nonnull(strstr(text, "\nkdecode_requests_running NaN\n"));
    ck_assert_ptr_nonnull(strstr(text, "\nkdecode_requests_waiting +Inf\n"));
    ck_assert_ptr_nonnull(strstr(text, "\nkdecode_slots_used -Inf\n"));
    ck_assert_ptr_nonnull(strstr(text, "\nkdecode_handoff_bytes_total 1152921504606846976\n"));
    ck_assert_ptr_nonnull(strstr(text, "\nkdecode_request_duration_seconds_sum +Inf\n"));
    expo e;
    parse_expo(text, len, &e);
    free(text);

    const double step[] = {0.01};
    check_hist(&e, "kdecode_step_duration_seconds", step, 1);
    buckets b;
    get_buckets(&e, "kdecode_request_duration_seconds", &b);
    ck_assert_double_eq(b.count, 1);
    ck_assert_double_eq(b.cum[b.n - 2], 0); /* only the +Inf bucket holds it */
    ck_assert(isinf(b.sum) && b.sum > 0);
    ck_assert(isnan(kd_metrics_gauge(m, KD_G_RUNNING)));
    expo_free(&e);
    kd_metrics_free(m);
}
END_TEST

START_TEST(null_and_out_of_range) {
    kd_metrics_add(NULL, KD_C_STEPS, 1);
    kd_metrics_set(NULL, KD_G_READY, 1);
    kd_metrics_observe(NULL, KD_H_ITL, 1);
    ck_assert_uint_eq(kd_metrics_counter(NULL, KD_C_STEPS), 0);
    kd_metrics_free(NULL);
    kd_metrics_http_stop(NULL);
    char *text = (char *)"x";
    size_t len = 7;
    ck_assert_int_eq(kd_metrics_render(NULL, &text, &len), -1);

    kd_metrics *m = kd_metrics_create();
    kd_metrics_add(m, KD_C_COUNT, 5);
    kd_metrics_add(m, (kd_metric_counter)-1, 5);
    kd_metrics_set(m, KD_G_COUNT, 5);
    kd_metrics_observe(m, KD_H_COUNT, 5);
    ck_assert_uint_eq(kd_metrics_counter(m, KD_C_COUNT), 0);
    expo e;
    render_parse(m, &e);
    for (int i = 0; i < e.n; i++)
        if (strcmp(e.s[i].name, "kdecode_build_info") && !strstr(e.s[i].name, "_bucket"))
            ck_assert_msg(e.s[i].value == 0, "%s became %g", e.s[i].name, e.s[i].value);
    expo_free(&e);
    kd_err err = {{0}};
    ck_assert_ptr_null(kd_metrics_http_start(NULL, "127.0.0.1:0", NULL, &err));
    ck_assert_uint_gt(strlen(err.msg), 0);
    kd_metrics_free(m);
}
END_TEST

/* ---- concurrency ---- */

enum { NTHREADS = 8, NITER = 50000 };

typedef struct worker_arg {
    kd_metrics *m;
    int id;
} worker_arg;

static void *updater(void *p) {
    worker_arg *a = p;
    for (int i = 0; i < NITER; i++) {
        kd_metrics_add(a->m, KD_C_GENERATED_TOKENS, 1);
        kd_metrics_add(a->m, KD_C_PROMPT_TOKENS, (uint64_t)(i % 7));
        kd_metrics_add(a->m, KD_C_HANDOFF_BYTES, UINT64_C(1) << 33);
        kd_metrics_observe(a->m, KD_H_ITL, 0.5);
        kd_metrics_observe(a->m, KD_H_TTFT, 0.25 * (a->id + 1)); /* dyadic: sums are exact */
        kd_metrics_set(a->m, KD_G_RUNNING, (double)a->id);
    }
    return NULL;
}

static _Atomic int stop_reader;

/* Renders while the updaters run: each snapshot must parse and be self-consistent. */
static void *reader(void *p) {
    kd_metrics *m = p;
    int renders = 0;
    while (!atomic_load(&stop_reader) || renders < 3) {
        expo e;
        render_parse(m, &e);
        buckets b;
        get_buckets(&e, "kdecode_inter_token_latency_seconds", &b);
        ck_assert_double_eq(b.sum, 0.5 * b.count);
        get_buckets(&e, "kdecode_time_to_first_token_seconds", &b);
        double g = value_of(&e, "kdecode_requests_running", "");
        ck_assert(g >= 0 && g < NTHREADS && g == floor(g));
        expo_free(&e);
        renders++;
    }
    return NULL;
}

START_TEST(concurrent_updates_are_exact) {
    kd_metrics *m = kd_metrics_create();
    pthread_t t[NTHREADS], rd;
    worker_arg a[NTHREADS];
    atomic_store(&stop_reader, 0);
    ck_assert_int_eq(pthread_create(&rd, NULL, reader, m), 0);
    for (int i = 0; i < NTHREADS; i++) {
        a[i] = (worker_arg){m, i};
        ck_assert_int_eq(pthread_create(&t[i], NULL, updater, &a[i]), 0);
    }
    for (int i = 0; i < NTHREADS; i++) pthread_join(t[i], NULL);
    atomic_store(&stop_reader, 1);
    pthread_join(rd, NULL);

    uint64_t prompt_per_thread = 0;
    for (int i = 0; i < NITER; i++) prompt_per_thread += (uint64_t)(i % 7);
    ck_assert_uint_eq(kd_metrics_counter(m, KD_C_GENERATED_TOKENS), (uint64_t)NTHREADS * NITER);
    ck_assert_uint_eq(kd_metrics_counter(m, KD_C_PROMPT_TOKENS), NTHREADS * prompt_per_thread);
    ck_assert_uint_eq(kd_metrics_counter(m, KD_C_HANDOFF_BYTES),
                      (uint64_t)NTHREADS * NITER << 33);
    uint64_t c;
    double s;
    kd_metrics_hist(m, KD_H_ITL, &c, &s);
    ck_assert_uint_eq(c, (uint64_t)NTHREADS * NITER);
    ck_assert_double_eq(s, 0.5 * NTHREADS * NITER);
    kd_metrics_hist(m, KD_H_TTFT, &c, &s);
    ck_assert_uint_eq(c, (uint64_t)NTHREADS * NITER);
    double want = 0;
    for (int i = 0; i < NTHREADS; i++) want += 0.25 * (i + 1) * NITER;
    ck_assert_double_eq(s, want);

    expo e;
    render_parse(m, &e);
    ck_assert_double_eq(value_of(&e, "kdecode_generation_tokens_total", ""),
                        (double)NTHREADS * NITER);
    /* TTFT: thread i observed 0.25 (i+1) NITER times */
    buckets b;
    get_buckets(&e, "kdecode_time_to_first_token_seconds", &b);
    for (int i = 0; i < b.n; i++) {
        double w = 0;
        for (int k = 0; k < NTHREADS; k++) w += 0.25 * (k + 1) <= b.le[i] ? NITER : 0;
        ck_assert_double_eq(b.cum[i], w);
    }
    ck_assert_double_eq(b.sum, want);
    expo_free(&e);
    kd_metrics_free(m);
}
END_TEST

/* ---- HTTP ---- */

typedef struct http_resp {
    int status;
    char *raw;     /* everything received, NUL-terminated */
    char *headers; /* inside raw: from the status line up to the blank line */
    char *body;    /* inside raw */
    size_t body_len;
} http_resp;

static int connect_to(int family, int port) {
    int fd = socket(family, SOCK_STREAM, 0);
    ck_assert_int_ge(fd, 0);
    struct timeval tv = {10, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    int rc;
    if (family == AF_INET) {
        struct sockaddr_in a = {0};
        a.sin_family = AF_INET;
        a.sin_port = htons((uint16_t)port);
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        rc = connect(fd, (struct sockaddr *)&a, sizeof a);
    } else {
        struct sockaddr_in6 a = {0};
        a.sin6_family = AF_INET6;
        a.sin6_port = htons((uint16_t)port);
        a.sin6_addr = in6addr_loopback;
        rc = connect(fd, (struct sockaddr *)&a, sizeof a);
    }
    ck_assert_msg(rc == 0, "connect to port %d: %s", port, strerror(errno));
    return fd;
}

static void http_request(int family, int port, const char *method, const char *path,
                         http_resp *r) {
    memset(r, 0, sizeof *r);
    int fd = connect_to(family, port);
    char req[512];
    int n = snprintf(req, sizeof req, "%s %s HTTP/1.0\r\nHost: localhost\r\n%s\r\n", method,
                     path, strcmp(method, "POST") == 0 ? "Content-Length: 0\r\n" : "");
    ck_assert_int_eq(send(fd, req, (size_t)n, MSG_NOSIGNAL), n);
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (cap - len < 2048) buf = realloc(buf, cap *= 2);
        ssize_t k = recv(fd, buf + len, cap - len - 1, 0);
        ck_assert_msg(k >= 0, "recv: %s", strerror(errno));
        if (k == 0) break; /* HTTP/1.0: the server closes after the reply */
        len += (size_t)k;
    }
    close(fd);
    buf[len] = '\0';
    r->raw = buf;
    ck_assert_msg(!strncmp(buf, "HTTP/1.", 7) && buf[8] == ' ', "status line: %.40s", buf);
    r->status = atoi(buf + 9);
    char *sep = strstr(buf, "\r\n\r\n");
    ck_assert_msg(sep != NULL, "no end of headers");
    *sep = '\0';
    r->headers = buf;
    r->body = sep + 4;
    r->body_len = len - (size_t)(r->body - buf);
}

/* A header's value (copied into out), or NULL. */
static const char *header(const http_resp *r, const char *name, char *out, size_t cap) {
    size_t n = strlen(name);
    for (const char *p = strstr(r->headers, "\r\n"); p; p = strstr(p, "\r\n")) {
        p += 2;
        if (!strncasecmp(p, name, n) && p[n] == ':') {
            const char *v = p + n + 1;
            while (*v == ' ') v++;
            const char *e = strstr(v, "\r\n");
            size_t l = e ? (size_t)(e - v) : strlen(v);
            ck_assert_uint_lt(l, cap);
            memcpy(out, v, l);
            out[l] = '\0';
            return out;
        }
    }
    return NULL;
}

static kd_metrics_http *start_ok(kd_metrics *m, const char *listen, int *port) {
    kd_err err = {{0}};
    kd_metrics_http *h = kd_metrics_http_start(m, listen, port, &err);
    ck_assert_msg(h != NULL, "start on %s: %s", listen, err.msg);
    ck_assert_int_gt(*port, 0);
    ck_assert_int_lt(*port, 65536);
    return h;
}

START_TEST(http_serves_metrics) {
    kd_metrics *m = kd_metrics_create();
    kd_metrics_add(m, KD_C_STEPS, 42);
    kd_metrics_add(m, KD_C_REJECTED_BUSY, 3);
    kd_metrics_observe(m, KD_H_STEP, 0.02);
    int port = 0;
    kd_metrics_http *h = start_ok(m, "127.0.0.1:0", &port);

    http_resp r;
    char v[256];
    http_request(AF_INET, port, "GET", "/metrics", &r);
    ck_assert_int_eq(r.status, 200);
    ck_assert_ptr_nonnull(header(&r, "Content-Type", v, sizeof v));
    ck_assert_str_eq(v, "text/plain; version=0.0.4; charset=utf-8");
    ck_assert_ptr_nonnull(header(&r, "Content-Length", v, sizeof v));
    ck_assert_int_eq(atol(v), (long)r.body_len);
    ck_assert_ptr_nonnull(strstr(r.body, "\nkdecode_steps_total 42\n"));
    expo e;
    parse_expo(r.body, r.body_len, &e);
    check_families(&e);
    ck_assert_double_eq(value_of(&e, "kdecode_requests_rejected_total", "reason=\"busy\""), 3);
    const double step[] = {0.02};
    check_hist(&e, "kdecode_step_duration_seconds", step, 1);
    expo_free(&e);
    free(r.raw);

    /* a live registry: the next scrape sees the update; query strings are ignored */
    kd_metrics_add(m, KD_C_STEPS, 1);
    http_request(AF_INET, port, "GET", "/metrics?x=1", &r);
    ck_assert_int_eq(r.status, 200);
    ck_assert_ptr_nonnull(strstr(r.body, "\nkdecode_steps_total 43\n"));
    free(r.raw);

    http_request(AF_INET, port, "GET", "/", &r);
    ck_assert_int_eq(r.status, 200);
    ck_assert_ptr_nonnull(strstr(r.body, "/metrics"));
    free(r.raw);

    http_request(AF_INET, port, "HEAD", "/metrics", &r);
    ck_assert_int_eq(r.status, 200);
    ck_assert_uint_eq(r.body_len, 0);
    free(r.raw);

    const char *missing[] = {"/nope", "/metrics/", "/metricsx", "/favicon.ico"};
    for (size_t i = 0; i < NELEM(missing); i++) {
        http_request(AF_INET, port, "GET", missing[i], &r);
        ck_assert_msg(r.status == 404, "%s: %d", missing[i], r.status);
        free(r.raw);
    }
    const char *methods[] = {"POST", "PUT", "DELETE"};
    for (size_t i = 0; i < NELEM(methods); i++) {
        http_request(AF_INET, port, methods[i], "/metrics", &r);
        ck_assert_msg(r.status == 405, "%s: %d", methods[i], r.status);
        ck_assert_ptr_nonnull(header(&r, "Allow", v, sizeof v));
        ck_assert_ptr_nonnull(strstr(v, "GET"));
        free(r.raw);
    }

    kd_metrics_http_stop(h);
    kd_metrics_free(m);
}
END_TEST

START_TEST(http_bad_listen_strings) {
    kd_metrics *m = kd_metrics_create();
    const char *bad[] = {"",           "127.0.0.1",   "127.0.0.1:",     "127.0.0.1:65536",
                         "127.0.0.1:-1", "127.0.0.1:80x", "127.0.0.1: 80", "::1:80",
                         "[::1",       "[::1]80",     "[::1]:",         "[]:80",
                         "[127.0.0.1]:80", "[::1]:99999999999999999999", "1.2.3.4:0:0"};
    for (size_t i = 0; i < NELEM(bad); i++) {
        kd_err err = {{0}};
        int port = -7;
        kd_metrics_http *h = kd_metrics_http_start(m, bad[i], &port, &err);
        ck_assert_msg(h == NULL, "'%s' was accepted", bad[i]);
        ck_assert_msg(strlen(err.msg) > 0, "'%s': no message", bad[i]);
        ck_assert_msg(strstr(err.msg, "metrics") != NULL, "'%s': %s", bad[i], err.msg);
        ck_assert_int_eq(port, 0);
    }
    kd_err err = {{0}};
    ck_assert_ptr_null(kd_metrics_http_start(m, NULL, NULL, &err));
    ck_assert_uint_gt(strlen(err.msg), 0);
    /* not a local address */
    memset(&err, 0, sizeof err);
    ck_assert_ptr_null(kd_metrics_http_start(m, "192.0.2.1:0", NULL, &err));
    ck_assert_uint_gt(strlen(err.msg), 0);
    kd_metrics_free(m);
}
END_TEST

START_TEST(http_port_in_use) {
    kd_metrics *m = kd_metrics_create();
    /* a listener of the test's own */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    ck_assert_int_eq(listen(fd, 4), 0);
    socklen_t al = sizeof a;
    ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&a, &al), 0);
    int busy = ntohs(a.sin_port);

    char listen_s[64];
    snprintf(listen_s, sizeof listen_s, "127.0.0.1:%d", busy);
    kd_err err = {{0}};
    int port = -1;
    ck_assert_ptr_null(kd_metrics_http_start(m, listen_s, &port, &err));
    ck_assert_msg(strstr(err.msg, listen_s) && strstr(err.msg, "in use"), "message: %s", err.msg);
    close(fd);

    /* a second metrics server on the first one's port */
    kd_metrics_http *h = start_ok(m, "127.0.0.1:0", &port);
    snprintf(listen_s, sizeof listen_s, "127.0.0.1:%d", port);
    memset(&err, 0, sizeof err);
    ck_assert_ptr_null(kd_metrics_http_start(m, listen_s, NULL, &err));
    ck_assert_msg(strstr(err.msg, "in use"), "message: %s", err.msg);
    kd_metrics_http_stop(h);

    /* after a clean stop the port is free again, at once */
    int again = 0;
    h = start_ok(m, listen_s, &again);
    ck_assert_int_eq(again, port);
    kd_metrics_http_stop(h);
    kd_metrics_free(m);
}
END_TEST

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

START_TEST(http_stop_is_clean) {
    kd_metrics *m = kd_metrics_create();
    for (int k = 0; k < 20; k++) {
        int port = 0;
        kd_metrics_http *h = start_ok(m, "127.0.0.1:0", &port);
        if (k % 2) {
            http_resp r;
            http_request(AF_INET, port, "GET", "/metrics", &r);
            ck_assert_int_eq(r.status, 200);
            free(r.raw);
        }
        kd_metrics_http_stop(h);
    }
    /* stop with clients attached: one idle, one with half a request */
    int port = 0;
    kd_metrics_http *h = start_ok(m, "127.0.0.1:0", &port);
    int idle = connect_to(AF_INET, port), half = connect_to(AF_INET, port);
    ck_assert_int_eq(send(half, "GET /metr", 9, MSG_NOSIGNAL), 9);
    usleep(50 * 1000);
    double t0 = now_s();
    kd_metrics_http_stop(h);
    ck_assert_msg(now_s() - t0 < 5.0, "stop took %.2f s", now_s() - t0);
    char c;
    ck_assert_int_le(recv(idle, &c, 1, 0), 0); /* closed by the server */
    ck_assert_int_le(recv(half, &c, 1, 0), 0);
    close(idle);
    close(half);
    kd_metrics_free(m);
}
END_TEST

START_TEST(http_all_interfaces) {
    kd_metrics *m = kd_metrics_create();
    kd_metrics_add(m, KD_C_PREFIX_HITS, 7);
    int port = 0;
    kd_metrics_http *h = start_ok(m, ":0", &port);
    http_resp r;
    http_request(AF_INET, port, "GET", "/metrics", &r);
    ck_assert_int_eq(r.status, 200);
    ck_assert_ptr_nonnull(strstr(r.body, "\nkdecode_prefix_cache_hits_total 7\n"));
    free(r.raw);
    kd_metrics_http_stop(h);

    /* a name: localhost */
    h = start_ok(m, "localhost:0", &port);
    http_request(AF_INET, port, "GET", "/", &r);
    ck_assert_int_eq(r.status, 200);
    free(r.raw);
    kd_metrics_http_stop(h);
    kd_metrics_free(m);
}
END_TEST

static int ipv6_loopback_works(void) {
    int fd = socket(AF_INET6, SOCK_STREAM, 0);
    if (fd < 0) return 0;
    struct sockaddr_in6 a = {0};
    a.sin6_family = AF_INET6;
    a.sin6_addr = in6addr_loopback;
    int ok = bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
    close(fd);
    return ok;
}

START_TEST(http_ipv6) {
    if (!ipv6_loopback_works()) {
        fprintf(stderr, "metrics_test: no IPv6 loopback here; [::1] not tested\n");
        return;
    }
    kd_metrics *m = kd_metrics_create();
    kd_metrics_add(m, KD_C_STEPS, 5);
    int port = 0;
    kd_metrics_http *h = start_ok(m, "[::1]:0", &port);
    http_resp r;
    http_request(AF_INET6, port, "GET", "/metrics", &r);
    ck_assert_int_eq(r.status, 200);
    ck_assert_ptr_nonnull(strstr(r.body, "\nkdecode_steps_total 5\n"));
    free(r.raw);
    kd_metrics_http_stop(h);
    /* all interfaces is dual-stack where IPv6 exists */
    h = start_ok(m, ":0", &port);
    http_request(AF_INET6, port, "GET", "/metrics", &r);
    ck_assert_int_eq(r.status, 200);
    free(r.raw);
    http_request(AF_INET, port, "GET", "/metrics", &r);
    ck_assert_int_eq(r.status, 200);
    free(r.raw);
    kd_metrics_http_stop(h);
    kd_metrics_free(m);
}
END_TEST

int main(void) {
    Suite *s = suite_create("metrics");
    TCase *tc = tcase_create("registry");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, fresh_registry_is_zero);
    tcase_add_test(tc, values_round_trip);
    tcase_add_test(tc, special_values);
    tcase_add_test(tc, null_and_out_of_range);
    tcase_add_test(tc, concurrent_updates_are_exact);
    suite_add_tcase(s, tc);
    TCase *th = tcase_create("http");
    tcase_set_timeout(th, 60);
    tcase_add_test(th, http_serves_metrics);
    tcase_add_test(th, http_bad_listen_strings);
    tcase_add_test(th, http_port_in_use);
    tcase_add_test(th, http_stop_is_clean);
    tcase_add_test(th, http_all_interfaces);
    tcase_add_test(th, http_ipv6);
    suite_add_tcase(s, th);
    return kd_test_run_suite(s);
}
