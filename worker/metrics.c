/* metrics.c: see metrics.h.
 *
 * Storage:
 *   counters   _Atomic uint64_t, relaxed fetch_add (totals are exact; no ordering is implied
 *              between different counters).
 *   gauges     the bits of a double in an _Atomic uint64_t (relaxed store/load).
 *   histograms one small mutex per histogram, held for three additions, so a render sees
 *              buckets, _count and _sum of one histogram that agree with each other. The
 *              bucket index is found before the lock is taken. NaN observations are dropped
 *              (they would poison _sum forever); +-Inf land in the first / +Inf bucket.
 *
 * Rendering is Prometheus text format 0.0.4. Doubles are written in the shortest form that
 * reads back to the same double (%.15g, %.16g or %.17g), with +Inf, -Inf and NaN spelled the
 * way Prometheus expects. The worker never calls setlocale, so printf's decimal point is '.'.
 *
 * HTTP: libmicrohttpd with its own polling thread (epoll/poll/select, whichever MHD picks).
 * The kd_metrics object must outlive the server started on it. Every update function accepts
 * m == NULL as a no-op, so callers without metrics need no checks of their own. */
#include "worker/metrics.h"

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <microhttpd.h>

#define KD_METRICS_VERSION "0.1.0"
#define KD_MAX_BOUNDS 24

/* ---- metric descriptions ---- */

typedef struct counter_desc {
    const char *name;
    const char *help;
    const char *reason; /* label value of the reason label, or NULL */
} counter_desc;

static const counter_desc counter_descs[] = {
    {"kdecode_requests_finished_total",
     "Requests that finished, by reason (length, stop, abort, error).", "length"},
    {"kdecode_requests_finished_total", NULL, "stop"},
    {"kdecode_requests_finished_total", NULL, "abort"},
    {"kdecode_requests_finished_total", NULL, "error"},
    {"kdecode_requests_rejected_total",
     "Requests rejected before they ran, by reason (invalid, busy, draining).", "invalid"},
    {"kdecode_requests_rejected_total", NULL, "busy"},
    {"kdecode_requests_rejected_total", NULL, "draining"},
    {"kdecode_prompt_tokens_total", "Prompt tokens received.", NULL},
    {"kdecode_generation_tokens_total", "Tokens generated.", NULL},
    {"kdecode_spec_draft_tokens_total", "Speculative draft tokens verified.", NULL},
    {"kdecode_spec_accepted_tokens_total", "Speculative draft tokens accepted.", NULL},
    {"kdecode_spec_held_tokens_total",
     "Draft tokens proposed but not verified: the request's recent drafts were accepted too rarely "
     "(--draft-min-accept).", NULL},
    {"kdecode_steps_total", "Engine steps run.", NULL},
    {"kdecode_prefix_cache_queries_total", "Prefix cache lookups.", NULL},
    {"kdecode_prefix_cache_hits_total", "Prefix cache lookups that found a prefix.", NULL},
    {"kdecode_prefix_cache_hit_tokens_total", "Prompt tokens served from the prefix cache.",
     NULL},
    {"kdecode_handoff_bytes_total", "Bytes of state transferred by handoffs.", NULL},
    {"kdecode_handoff_failures_total", "Handoffs that failed.", NULL},
    {"kdecode_handoff_nccl_fallbacks_total",
     "Handoffs that went over gRPC because no NCCL link to the decode worker could be made.", NULL},
    {"kdecode_handoff_write_deferrals_total",
     "Times the engine left arriving state chunks for after the next step (--handoff-write-budget).", NULL},
    {"kdecode_cuda_graph_captures_total",
     "CUDA graphs of decode step shapes captured (at start, --warm-graphs, and on first use).", NULL},
    {"kdecode_cuda_graph_replays_total", "Decode steps run as a CUDA graph replay.", NULL},
};
_Static_assert(sizeof counter_descs / sizeof *counter_descs == KD_C_COUNT,
               "one description per counter");

typedef struct gauge_desc {
    const char *name;
    const char *help;
} gauge_desc;

static const gauge_desc gauge_descs[] = {
    {"kdecode_requests_running", "Requests in the running batch."},
    {"kdecode_requests_waiting", "Requests queued, waiting for a slot."},
    {"kdecode_slots_used", "Decode slots in use."},
    {"kdecode_slots_total", "Decode slots configured."},
    {"kdecode_slot_utilization", "Slots used / slots total (0..1)."},
    {"kdecode_prefix_cache_entries", "Entries in the prefix cache."},
    {"kdecode_ready", "1 while serving, 0 while loading or draining."},
    {"kdecode_draining", "1 while draining."},
    {"kdecode_handoffs_pending", "Handoffs in flight."},
    {"kdecode_nccl_links", "NCCL communicators to handoff peers (state handoff over NCCL)."},
    {"kdecode_handoff_slots_ready", "Free slots held ready for arriving handoffs (counted as free in slots_used)."},
};
_Static_assert(sizeof gauge_descs / sizeof *gauge_descs == KD_G_COUNT,
               "one description per gauge");

/* Upper bounds (le), ascending. Long: request-scale latencies, 1 ms .. 60 s. Short:
 * per-token and per-step latencies, 0.1 ms .. 2 s, dense around the 5-50 ms of decode. */
static const double bounds_long[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1,
                                     0.25,  0.5,    0.75,  1,    2.5,   5,    7.5,   10,
                                     15,    20,     30,    45,   60};
static const double bounds_short[] = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.0075,
                                      0.01,   0.015,   0.02,   0.025, 0.03,   0.04,  0.05,
                                      0.075,  0.1,     0.25,   0.5,   1,      2};
_Static_assert(sizeof bounds_long / sizeof *bounds_long <= KD_MAX_BOUNDS, "bounds");
_Static_assert(sizeof bounds_short / sizeof *bounds_short <= KD_MAX_BOUNDS, "bounds");

typedef struct hist_desc {
    const char *name;
    const char *help;
    const double *bounds;
    int n_bounds;
} hist_desc;

#define BOUNDS(b) b, (int)(sizeof b / sizeof *b)
static const hist_desc hist_descs[] = {
    {"kdecode_time_to_first_token_seconds",
     "Time from request arrival to its first generated token.", BOUNDS(bounds_long)},
    {"kdecode_inter_token_latency_seconds",
     "Time between consecutive generated tokens of a request (per token of a step).",
     BOUNDS(bounds_short)},
    {"kdecode_request_duration_seconds", "Time from request arrival to its end.",
     BOUNDS(bounds_long)},
    {"kdecode_queue_wait_seconds", "Time a request waited for a slot.", BOUNDS(bounds_long)},
    {"kdecode_step_duration_seconds", "Duration of one engine step.", BOUNDS(bounds_short)},
    {"kdecode_handoff_duration_seconds", "Duration of a state handoff.", BOUNDS(bounds_long)},
};
#undef BOUNDS
_Static_assert(sizeof hist_descs / sizeof *hist_descs == KD_H_COUNT,
               "one description per histogram");

/* ---- the registry ---- */

typedef struct hist {
    pthread_mutex_t mu;
    uint64_t buckets[KD_MAX_BOUNDS + 1]; /* per bucket (not cumulative); last is +Inf */
    uint64_t count;
    double sum;
} hist;

struct kd_metrics {
    _Atomic uint64_t counters[KD_C_COUNT];
    _Atomic uint64_t gauges[KD_G_COUNT]; /* bits of a double */
    hist hists[KD_H_COUNT];
};

static uint64_t dbits(double v) {
    uint64_t u;
    memcpy(&u, &v, sizeof u);
    return u;
}

static double bitsd(uint64_t u) {
    double v;
    memcpy(&v, &u, sizeof v);
    return v;
}

kd_metrics *kd_metrics_create(void) {
    kd_metrics *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    for (int c = 0; c < KD_C_COUNT; c++) atomic_init(&m->counters[c], 0);
    for (int g = 0; g < KD_G_COUNT; g++) atomic_init(&m->gauges[g], dbits(0.0));
    for (int h = 0; h < KD_H_COUNT; h++) {
        if (pthread_mutex_init(&m->hists[h].mu, NULL) != 0) {
            while (h-- > 0) pthread_mutex_destroy(&m->hists[h].mu);
            free(m);
            return NULL;
        }
    }
    return m;
}

void kd_metrics_free(kd_metrics *m) {
    if (!m) return;
    for (int h = 0; h < KD_H_COUNT; h++) pthread_mutex_destroy(&m->hists[h].mu);
    free(m);
}

/* Index of the first bound >= v (le is inclusive), n when v is above every bound. */
static int bucket_of(const double *b, int n, double v) {
    int lo = 0, hi = n;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (v <= b[mid])
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

void kd_metrics_observe(kd_metrics *m, kd_metric_hist h, double seconds) {
    if (!m || (unsigned)h >= KD_H_COUNT || isnan(seconds)) return;
    const hist_desc *d = &hist_descs[h];
    int i = bucket_of(d->bounds, d->n_bounds, seconds);
    hist *x = &m->hists[h];
    pthread_mutex_lock(&x->mu);
    x->buckets[i]++;
    x->count++;
    x->sum += seconds;
    pthread_mutex_unlock(&x->mu);
}

void kd_metrics_add(kd_metrics *m, kd_metric_counter c, uint64_t n) {
    if (!m || (unsigned)c >= KD_C_COUNT) return;
    atomic_fetch_add_explicit(&m->counters[c], n, memory_order_relaxed);
}

void kd_metrics_set(kd_metrics *m, kd_metric_gauge g, double v) {
    if (!m || (unsigned)g >= KD_G_COUNT) return;
    atomic_store_explicit(&m->gauges[g], dbits(v), memory_order_relaxed);
}

uint64_t kd_metrics_counter(kd_metrics *m, kd_metric_counter c) {
    if (!m || (unsigned)c >= KD_C_COUNT) return 0;
    return atomic_load_explicit(&m->counters[c], memory_order_relaxed);
}

double kd_metrics_gauge(kd_metrics *m, kd_metric_gauge g) {
    if (!m || (unsigned)g >= KD_G_COUNT) return 0.0;
    return bitsd(atomic_load_explicit(&m->gauges[g], memory_order_relaxed));
}

void kd_metrics_hist(kd_metrics *m, kd_metric_hist h, uint64_t *count, double *sum) {
    uint64_t c = 0;
    double s = 0.0;
    if (m && (unsigned)h < KD_H_COUNT) {
        hist *x = &m->hists[h];
        pthread_mutex_lock(&x->mu);
        c = x->count;
        s = x->sum;
        pthread_mutex_unlock(&x->mu);
    }
    if (count) *count = c;
    if (sum) *sum = s;
}

/* ---- text exposition ---- */

typedef struct sbuf {
    char *p;
    size_t len, cap;
    int oom;
} sbuf;

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...) {
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        size_t room = b->cap - b->len;
        int n = vsnprintf(b->p + b->len, room, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->oom = 1;
            return;
        }
        if ((size_t)n < room) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap * 2;
        while (cap - b->len <= (size_t)n) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
}

/* A double as Prometheus reads it: the shortest of %.15g/%.16g/%.17g that reads back to
 * the same value; +Inf, -Inf, NaN. */
static const char *fmt_double(char buf[40], double v) {
    if (isnan(v)) return "NaN";
    if (isinf(v)) return v > 0 ? "+Inf" : "-Inf";
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(buf, 40, "%.*g", prec, v);
        if (prec == 17 || strtod(buf, NULL) == v) break;
    }
    return buf;
}

static void family_header(sbuf *b, const char *name, const char *help, const char *type) {
    sb_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

int kd_metrics_render(kd_metrics *m, char **out, size_t *len) {
    if (!m || !out) return -1;
    *out = NULL;
    if (len) *len = 0;

    /* Snapshot first (counters and gauges are single loads; a histogram's fields are read
     * together under its lock), format afterwards without holding anything. */
    uint64_t counters[KD_C_COUNT];
    double gauges[KD_G_COUNT];
    hist snap[KD_H_COUNT];
    for (int c = 0; c < KD_C_COUNT; c++)
        counters[c] = atomic_load_explicit(&m->counters[c], memory_order_relaxed);
    for (int g = 0; g < KD_G_COUNT; g++)
        gauges[g] = bitsd(atomic_load_explicit(&m->gauges[g], memory_order_relaxed));
    for (int h = 0; h < KD_H_COUNT; h++) {
        hist *x = &m->hists[h];
        pthread_mutex_lock(&x->mu);
        memcpy(snap[h].buckets, x->buckets, sizeof x->buckets);
        snap[h].count = x->count;
        snap[h].sum = x->sum;
        pthread_mutex_unlock(&x->mu);
    }

    sbuf b = {malloc(16384), 0, 16384, 0};
    if (!b.p) return -1;
    char num[40];

    family_header(&b, "kdecode_build_info", "Build information; the value is always 1.",
                  "gauge");
    sb_printf(&b, "kdecode_build_info{version=\"%s\"} 1\n", KD_METRICS_VERSION);

    for (int c = 0; c < KD_C_COUNT; c++) {
        const counter_desc *d = &counter_descs[c];
        if (d->help) family_header(&b, d->name, d->help, "counter");
        if (d->reason)
            sb_printf(&b, "%s{reason=\"%s\"} %" PRIu64 "\n", d->name, d->reason, counters[c]);
        else
            sb_printf(&b, "%s %" PRIu64 "\n", d->name, counters[c]);
    }

    for (int g = 0; g < KD_G_COUNT; g++) {
        const gauge_desc *d = &gauge_descs[g];
        family_header(&b, d->name, d->help, "gauge");
        sb_printf(&b, "%s %s\n", d->name, fmt_double(num, gauges[g]));
    }

    for (int h = 0; h < KD_H_COUNT; h++) {
        const hist_desc *d = &hist_descs[h];
        const hist *x = &snap[h];
        family_header(&b, d->name, d->help, "histogram");
        uint64_t cum = 0;
        for (int i = 0; i < d->n_bounds; i++) {
            cum += x->buckets[i];
            sb_printf(&b, "%s_bucket{le=\"%s\"} %" PRIu64 "\n", d->name,
                      fmt_double(num, d->bounds[i]), cum);
        }
        cum += x->buckets[d->n_bounds];
        sb_printf(&b, "%s_bucket{le=\"+Inf\"} %" PRIu64 "\n", d->name, cum);
        sb_printf(&b, "%s_sum %s\n", d->name, fmt_double(num, x->sum));
        sb_printf(&b, "%s_count %" PRIu64 "\n", d->name, x->count);
    }

    if (b.oom) {
        free(b.p);
        return -1;
    }
    *out = b.p;
    if (len) *len = b.len;
    return 0;
}

/* ---- HTTP ---- */

#define CONTENT_TYPE_METRICS "text/plain; version=0.0.4; charset=utf-8"
#define CONTENT_TYPE_TEXT "text/plain; charset=utf-8"

struct kd_metrics_http {
    kd_metrics *m;
    struct MHD_Daemon *daemon;
    /* MHD's error messages while MHD_start_daemon runs (on the caller's thread); after a
     * successful start, messages from the daemon thread are dropped. */
    _Atomic int capture;
    char log[256];
};

static void mhd_logger(void *cls, const char *fmt, va_list ap) {
    kd_metrics_http *h = cls;
    if (!atomic_load(&h->capture) || h->log[0]) return; /* keep the first message */
    vsnprintf(h->log, sizeof h->log, fmt, ap);
    size_t n = strlen(h->log);
    while (n > 0 && (h->log[n - 1] == '\n' || h->log[n - 1] == '\r' || h->log[n - 1] == ' '))
        h->log[--n] = '\0';
}

static enum MHD_Result reply(struct MHD_Connection *conn, unsigned int status,
                             const char *content_type, char *body, size_t len, int owned) {
    struct MHD_Response *r = MHD_create_response_from_buffer(
        len, body, owned ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
    if (!r) {
        if (owned) free(body);
        return MHD_NO;
    }
    enum MHD_Result ok = MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
    if (ok == MHD_YES && status == MHD_HTTP_METHOD_NOT_ALLOWED)
        ok = MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
    if (ok == MHD_YES) ok = MHD_queue_response(conn, status, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result reply_static(struct MHD_Connection *conn, unsigned int status,
                                    const char *content_type, const char *body) {
    return reply(conn, status, content_type, (char *)body, strlen(body), 0);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_data_size,
                                  void **con_cls) {
    (void)version;
    (void)upload_data;
    (void)con_cls;
    kd_metrics_http *h = cls;
    int is_metrics = strcmp(url, "/metrics") == 0;
    int is_root = strcmp(url, "/") == 0;
    if (!is_metrics && !is_root)
        return reply_static(conn, MHD_HTTP_NOT_FOUND, CONTENT_TYPE_TEXT,
                            "not found; metrics are at /metrics\n");
    if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 && strcmp(method, MHD_HTTP_METHOD_HEAD) != 0) {
        /* Answered at once: the request body (if any) is never read, and MHD closes the
         * connection after this reply. */
        *upload_data_size = 0;
        return reply_static(conn, MHD_HTTP_METHOD_NOT_ALLOWED, CONTENT_TYPE_TEXT,
                            "method not allowed; use GET\n");
    }
    if (is_root)
        return reply_static(conn, MHD_HTTP_OK, CONTENT_TYPE_TEXT,
                            "kdecode decode worker. Prometheus metrics are at /metrics\n");
    char *text;
    size_t len;
    if (kd_metrics_render(h->m, &text, &len) != 0)
        return reply_static(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, CONTENT_TYPE_TEXT,
                            "out of memory\n");
    return reply(conn, MHD_HTTP_OK, CONTENT_TYPE_METRICS, text, len, 1);
}

typedef struct listen_addr {
    struct sockaddr_storage ss;
    int any; /* ":port": all interfaces */
    int port;
} listen_addr;

/* "host:port", "[v6]:port" or ":port"; host numeric or a name getaddrinfo resolves. */
static int parse_listen(const char *s, listen_addr *a, kd_err *err) {
    memset(a, 0, sizeof *a);
    if (!s || !*s) return kd_fail(err, "metrics: empty listen address (want host:port)");
    char host[256];
    const char *port;
    int bracketed = 0;
    if (s[0] == '[') {
        const char *close = strchr(s, ']');
        if (!close) return kd_fail(err, "metrics: listen address '%s': missing ']'", s);
        if (close[1] != ':')
            return kd_fail(err, "metrics: listen address '%s': want [addr]:port", s);
        size_t n = (size_t)(close - s - 1);
        if (n == 0 || n >= sizeof host)
            return kd_fail(err, "metrics: listen address '%s': bad IPv6 address", s);
        memcpy(host, s + 1, n);
        host[n] = '\0';
        port = close + 2;
        bracketed = 1;
    } else {
        const char *colon = strrchr(s, ':');
        if (!colon) return kd_fail(err, "metrics: listen address '%s': want host:port", s);
        size_t n = (size_t)(colon - s);
        if (memchr(s, ':', n))
            return kd_fail(err,
                           "metrics: listen address '%s': an IPv6 address needs brackets, "
                           "[addr]:port",
                           s);
        if (n >= sizeof host)
            return kd_fail(err, "metrics: listen address '%s': host too long", s);
        memcpy(host, s, n);
        host[n] = '\0';
        port = colon + 1;
    }

    if (!*port) return kd_fail(err, "metrics: listen address '%s': missing port", s);
    long p = 0;
    for (const char *c = port; *c; c++) {
        if (*c < '0' || *c > '9' || p > 65535)
            return kd_fail(err, "metrics: listen address '%s': bad port '%s'", s, port);
        p = p * 10 + (*c - '0');
    }
    if (p > 65535)
        return kd_fail(err, "metrics: listen address '%s': port %ld out of range", s, p);
    a->port = (int)p;

    if (!bracketed && !*host) {
        a->any = 1;
        return 0;
    }
    if (!bracketed) {
        struct sockaddr_in *in = (struct sockaddr_in *)&a->ss;
        if (inet_pton(AF_INET, host, &in->sin_addr) == 1) {
            in->sin_family = AF_INET;
            in->sin_port = htons((uint16_t)p);
            return 0;
        }
    } else {
        struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&a->ss;
        if (inet_pton(AF_INET6, host, &in6->sin6_addr) == 1) {
            in6->sin6_family = AF_INET6;
            in6->sin6_port = htons((uint16_t)p);
            return 0;
        }
        return kd_fail(err, "metrics: listen address '%s': '%s' is not an IPv6 address", s,
                       host);
    }
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    int rc = getaddrinfo(host, NULL, &hints, &res);
    if (rc != 0 || !res)
        return kd_fail(err, "metrics: listen address '%s': cannot resolve '%s': %s", s, host,
                       rc ? gai_strerror(rc) : "no address");
    const struct addrinfo *pick = NULL;
    for (const struct addrinfo *r = res; r && !pick; r = r->ai_next)
        if (r->ai_family == AF_INET) pick = r; /* IPv4 first: what "localhost" usually means */
    for (const struct addrinfo *r = res; r && !pick; r = r->ai_next)
        if (r->ai_family == AF_INET6) pick = r;
    if (!pick || pick->ai_addrlen > sizeof a->ss) {
        freeaddrinfo(res);
        return kd_fail(err, "metrics: listen address '%s': no IPv4 or IPv6 address for '%s'",
                       s, host);
    }
    memcpy(&a->ss, pick->ai_addr, pick->ai_addrlen);
    if (pick->ai_family == AF_INET)
        ((struct sockaddr_in *)&a->ss)->sin_port = htons((uint16_t)p);
    else
        ((struct sockaddr_in6 *)&a->ss)->sin6_port = htons((uint16_t)p);
    freeaddrinfo(res);
    return 0;
}

static struct MHD_Daemon *start_daemon(kd_metrics_http *h, const struct sockaddr *sa, int port,
                                       unsigned int extra_flags) {
    unsigned int flags = MHD_USE_AUTO | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG |
                         extra_flags;
    h->log[0] = '\0';
    /* The port argument is not used for binding (the address carries it), only in MHD's
     * error messages. */
    return MHD_start_daemon(flags, (uint16_t)port, NULL, NULL, on_request, h,
                            MHD_OPTION_EXTERNAL_LOGGER, mhd_logger, h, /* must be first */
                            MHD_OPTION_SOCK_ADDR, sa,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)30,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned int)64,
                            MHD_OPTION_END);
}

kd_metrics_http *kd_metrics_http_start(kd_metrics *m, const char *listen, int *bound_port,
                                       kd_err *err) {
    if (bound_port) *bound_port = 0;
    if (!m) {
        kd_fail(err, "metrics: no metrics to serve");
        return NULL;
    }
    listen_addr a;
    if (parse_listen(listen, &a, err) != 0) return NULL;

    kd_metrics_http *h = calloc(1, sizeof *h);
    if (!h) {
        kd_fail(err, "metrics: out of memory");
        return NULL;
    }
    h->m = m;
    atomic_init(&h->capture, 1);

    if (a.any) {
        /* All interfaces: one dual-stack IPv6 socket; plain IPv4 where IPv6 is missing. */
        struct sockaddr_in6 in6 = {0};
        in6.sin6_family = AF_INET6;
        in6.sin6_addr = in6addr_any;
        in6.sin6_port = htons((uint16_t)a.port);
        h->daemon = start_daemon(h, (const struct sockaddr *)&in6, a.port, MHD_USE_DUAL_STACK);
        if (!h->daemon) {
            struct sockaddr_in in = {0};
            in.sin_family = AF_INET;
            in.sin_addr.s_addr = htonl(INADDR_ANY);
            in.sin_port = htons((uint16_t)a.port);
            h->daemon = start_daemon(h, (const struct sockaddr *)&in, a.port, 0);
        }
    } else {
        unsigned int extra = a.ss.ss_family == AF_INET6 ? MHD_USE_IPv6 : 0;
        h->daemon = start_daemon(h, (const struct sockaddr *)&a.ss, a.port, extra);
    }
    if (!h->daemon) {
        kd_fail(err, "metrics: cannot serve HTTP on %s: %s", listen,
                h->log[0] ? h->log : "libmicrohttpd failed to start");
        free(h);
        return NULL;
    }
    atomic_store(&h->capture, 0);

    const union MHD_DaemonInfo *info = MHD_get_daemon_info(h->daemon, MHD_DAEMON_INFO_BIND_PORT);
    int port = info ? (int)info->port : 0;
    if (port <= 0) port = a.port;
    if (port <= 0) {
        MHD_stop_daemon(h->daemon);
        free(h);
        kd_fail(err, "metrics: listening on %s, but cannot tell which port", listen);
        return NULL;
    }
    if (bound_port) *bound_port = port;
    return h;
}

void kd_metrics_http_stop(kd_metrics_http *h) {
    if (!h) return;
    MHD_stop_daemon(h->daemon);
    free(h);
}
