/* server.c: `kdecode serve` (see server.h). gRPC C core with protobuf-c messages.
 *
 * Threads: the main thread (start-up, model load, signals, drain, shutdown), --cq-threads
 * completion-queue threads (every call's batches complete there), the engine thread (owns
 * the engine, the backend and the model state) and libmicrohttpd's thread for /metrics.
 *
 * A call object carries tags for its batches and a reference count: one per batch in
 * flight, one while the engine owns its request. A Generate call hands its request to the
 * engine thread as a command; the engine's events append tokens to the call under its
 * mutex and start a send when none is in flight, so a slow client gets fewer, larger
 * messages instead of a queue that grows. A cancelled call (client gone, deadline) learns
 * it from RECV_CLOSE_ON_SERVER and aborts its request; the slot is free after the next
 * step boundary. */
#define _GNU_SOURCE
#include "worker/server.h"

#include <errno.h>
#include <getopt.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>
#include <inttypes.h>
#include <malloc.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t by value (push_rx) */
#include <xxhash.h>
#if defined(__x86_64__)
#include <xxh_x86dispatch.h> /* XXH3 on the CPU's widest vector unit (the same digests) */
#endif

#include "grpc/health/v1/health.pb-c.h"
#include "grpc/reflection/v1/reflection.pb-c.h"
#include "kd/backend.h"
#include "kdecode/v1/decoder.pb-c.h"
#include "proto/reflection_data.h"
#include "worker/api.h"
#include "worker/client.h"
#include "worker/engine.h"
#include "worker/metrics.h"
#include "worker/model.h"
#include "worker/nccl_link.h"
#include "worker/run.h"

#define KD_VERSION "0.1.0"

/* ------------------------------------------------------------------------- logging */

static int g_log_json;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* One line per event on stderr: "kdecode: event key=value ..." or a JSON object. */
static void logf_(const char *event, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void logf_(const char *event, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (g_log_json) {
        char esc[2048];
        size_t k = 0;
        for (const char *p = msg; *p && k + 7 < sizeof esc; p++) {
            if (*p == '"' || *p == '\\') esc[k++] = '\\', esc[k++] = *p;
            else if ((unsigned char)*p < 0x20) k += (size_t)snprintf(esc + k, sizeof esc - k, "\\u%04x", *p);
            else esc[k++] = *p;
        }
        esc[k] = 0;
        fprintf(stderr, "{\"ts\":%lld.%03ld,\"event\":\"%s\",\"msg\":\"%s\"}\n", (long long)ts.tv_sec,
                ts.tv_nsec / 1000000, event, esc);
    } else {
        fprintf(stderr, "kdecode: %s %s\n", event, msg);
    }
}

/* ------------------------------------------------------------------------- options */

/* the most slots a decode worker keeps reserved for arriving handoffs (g_srv.pool) */
enum { kHandoffPool = 8 };

typedef struct serve_opts {
    const char *listen, *model_dir, *metrics_listen, *role, *backend;
    const char *tls_cert, *tls_key, *tls_client_ca;
    kd_engine_config eng;
    int32_t default_spec, cq_threads, max_message_bytes, retry_pushback_ms;
    double drain_seconds, handoff_lease_seconds;
    int64_t max_prompt;
    const char *peer_tls_ca;
    int32_t debug_handoff_delay_ms;
    int act_bf16;
    const char *handoff_transport; /* grpc | nccl | auto */
    int32_t nccl_max_links;
    double nccl_idle_seconds, nccl_connect_seconds;
    int32_t handoff_ready_slots;
    int64_t handoff_write_budget; /* bytes of arriving states written between two steps (0: all) */
    int32_t warm_graphs;          /* CUDA graphs of decode steps captured at start */
} serve_opts;

static void usage(FILE *f) {
    fprintf(f,
            "usage: kdecode serve --model DIR [--listen HOST:PORT] [flags]\n"
            "  --listen ADDR            gRPC address (default 127.0.0.1:50051; port 0: any)\n"
            "  --metrics-listen ADDR    Prometheus /metrics on this HTTP address (default off)\n"
            "  --role decode|prefill|both   decode: Decoder (Generate, PushState); prefill:\n"
            "                           Prefiller.Prefill; both: everything (default decode)\n"
            "  --handoff-lease-seconds S  how long a pushed state waits to be claimed (default 30)\n"
            "  --handoff-ready-slots N  free slots a decode worker holds ready for arriving handoffs,\n"
            "                           so that a state's header does not wait for the running\n"
            "                           step (0..8, default 2; given back while requests wait)\n"
            "  --handoff-write-budget B  while requests decode, bytes of arriving states written\n"
            "                           into their slots between two steps; the rest waits, in\n"
            "                           order, for the next (0: everything queued; default 0)\n"
            "  --peer-tls-ca F          roots to verify decode workers when handing off over TLS\n"
            "                           (with --tls-cert/--tls-key as the client certificate)\n"
            "  --debug-handoff-delay-ms MS  sleep between handoff chunks (fault-injection tests)\n"
            "  --handoff-transport grpc|nccl|auto  how states travel between GPU workers: nccl\n"
            "                           sends GPU to GPU (needs --backend cuda), grpc in chunks;\n"
            "                           auto (default): nccl when this worker runs on a GPU, and\n"
            "                           for any peer where a link cannot be made, grpc\n"
            "  --nccl-max-links N       NCCL communicators kept to handoff peers (default 8)\n"
            "  --nccl-idle-seconds S    an unused NCCL communicator is closed after S (default 300)\n"
            "  --nccl-connect-seconds S  creating a communicator must finish within S (default 10)\n"
            "  --backend cpu|cuda|auto  compute backend (default auto: CUDA when a GPU is usable,\n"
            "                           else the CPU)\n"
            "  --activations fp32|bf16  GPU activation type (default bf16; the CPU computes in fp32)\n"
            "  --warm-graphs N          on a GPU, CUDA graphs of decode step shapes captured before\n"
            "                           serving, so that no step waits for a capture (0: none, each\n"
            "                           captured on its second use; default and most: 96)\n"
            "  --max-seqs N             request slots (default 8)\n"
            "  --max-queue N            requests waiting beyond the slots (default 64)\n"
            "  --max-batch-tokens N     tokens per step (default: enough for every slot + 256)\n"
            "  --max-model-len N        prompt + generated tokens (default 8192)\n"
            "  --spec-tokens S          default draft tokens per step (default 3)\n"
            "  --max-spec-tokens S      largest s a request may ask for (default 7)\n"
            "  --draft-min-accept A     n-gram drafts are verified while the request's recent ones\n"
            "                           predict A accepted tokens a step (default 0.5; 0: always)\n"
            "  --commit deferred|eager|store-all   (default deferred)\n"
            "  --prefix-block N         prefix cache block (0: off; default 0)\n"
            "  --prefix-cache-bytes B   prefix cache budget (default 256 MiB)\n"
            "  --drain-seconds S        grace on SIGTERM for what the worker took: running requests,\n"
            "                           Prefills handing off, handoffs arriving or unclaimed (default 30)\n"
            "  --cq-threads N           completion-queue threads (default 2)\n"
            "  --max-message-bytes B    largest request message (default 4 MiB)\n"
            "  --retry-pushback-ms MS   retry hint sent with RESOURCE_EXHAUSTED (default 200)\n"
            "  --tls-cert F --tls-key F [--tls-client-ca F]   TLS, mutual TLS with a client CA\n"
            "  --log-json               log lines as JSON objects\n");
}

static int parse_opts(int argc, char **argv, serve_opts *o) {
    enum { O_LISTEN = 1, O_MODEL, O_METRICS, O_ROLE, O_BACKEND, O_SEQS, O_QUEUE, O_BATCH, O_LEN, O_SPEC,
           O_MAXSPEC, O_COMMIT, O_BLOCK, O_CACHE, O_DRAIN, O_CQ, O_MSG, O_PUSH, O_CERT, O_KEY, O_CA,
           O_JSON, O_LEASE, O_PEERCA, O_DELAY, O_ACT, O_XPORT, O_NLINKS, O_NIDLE, O_NCONN, O_READY, O_WBUDGET,
           O_WARM, O_MINACC, O_HELP };
    static const struct option opts[] = {
        {"listen", required_argument, 0, O_LISTEN}, {"model", required_argument, 0, O_MODEL},
        {"metrics-listen", required_argument, 0, O_METRICS}, {"role", required_argument, 0, O_ROLE},
        {"backend", required_argument, 0, O_BACKEND}, {"max-seqs", required_argument, 0, O_SEQS},
        {"max-queue", required_argument, 0, O_QUEUE}, {"max-batch-tokens", required_argument, 0, O_BATCH},
        {"max-model-len", required_argument, 0, O_LEN}, {"spec-tokens", required_argument, 0, O_SPEC},
        {"max-spec-tokens", required_argument, 0, O_MAXSPEC}, {"commit", required_argument, 0, O_COMMIT},
        {"prefix-block", required_argument, 0, O_BLOCK}, {"prefix-cache-bytes", required_argument, 0, O_CACHE},
        {"drain-seconds", required_argument, 0, O_DRAIN}, {"cq-threads", required_argument, 0, O_CQ},
        {"max-message-bytes", required_argument, 0, O_MSG}, {"retry-pushback-ms", required_argument, 0, O_PUSH},
        {"tls-cert", required_argument, 0, O_CERT}, {"tls-key", required_argument, 0, O_KEY},
        {"tls-client-ca", required_argument, 0, O_CA}, {"log-json", no_argument, 0, O_JSON},
        {"handoff-lease-seconds", required_argument, 0, O_LEASE}, {"peer-tls-ca", required_argument, 0, O_PEERCA},
        {"debug-handoff-delay-ms", required_argument, 0, O_DELAY}, {"activations", required_argument, 0, O_ACT},
        {"handoff-transport", required_argument, 0, O_XPORT}, {"nccl-max-links", required_argument, 0, O_NLINKS},
        {"nccl-idle-seconds", required_argument, 0, O_NIDLE}, {"nccl-connect-seconds", required_argument, 0, O_NCONN},
        {"handoff-ready-slots", required_argument, 0, O_READY},
        {"handoff-write-budget", required_argument, 0, O_WBUDGET}, {"warm-graphs", required_argument, 0, O_WARM},
        {"draft-min-accept", required_argument, 0, O_MINACC},
        {"help", no_argument, 0, O_HELP}, {0, 0, 0, 0}};
    memset(o, 0, sizeof *o);
    kd_engine_config_defaults(&o->eng);
    o->listen = "127.0.0.1:50051", o->role = "decode", o->backend = "auto";
    o->act_bf16 = 1, o->warm_graphs = 96;
    o->eng.max_seqs = 8, o->eng.max_queue = 64, o->eng.max_spec = 7, o->eng.max_model_len = 8192;
    o->eng.prefix_cache_bytes = (size_t)256 << 20;
    o->eng.max_batch_tokens = 0;
    o->default_spec = 3, o->cq_threads = 2, o->max_message_bytes = 4 << 20, o->retry_pushback_ms = 200;
    o->drain_seconds = 30, o->handoff_lease_seconds = 30, o->handoff_ready_slots = 2;
    o->handoff_transport = "auto", o->nccl_max_links = 8, o->nccl_idle_seconds = 300, o->nccl_connect_seconds = 10;
    long long v;
    unsigned long long u;
    int c, li = 0;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "", opts, &li)) != -1) {
        int bad = 0;
        switch (c) {
        case O_LISTEN: o->listen = optarg; break;
        case O_MODEL: o->model_dir = optarg; break;
        case O_METRICS: o->metrics_listen = optarg; break;
        case O_ROLE:
            o->role = optarg;
            bad = strcmp(optarg, "decode") && strcmp(optarg, "prefill") && strcmp(optarg, "both");
            break;
        case O_LEASE: bad = kd_parse_f64(optarg, 0.001, 86400, &o->handoff_lease_seconds); break;
        case O_READY: bad = kd_parse_i64(optarg, 0, kHandoffPool, &v); o->handoff_ready_slots = (int32_t)v; break;
        case O_WBUDGET: bad = kd_parse_i64(optarg, 0, 1ll << 40, &v); o->handoff_write_budget = (int64_t)v; break;
        case O_WARM: bad = kd_parse_i64(optarg, 0, 96, &v); o->warm_graphs = (int32_t)v; break;
        case O_MINACC: bad = kd_parse_f64(optarg, 0, 32, &o->eng.draft_min_accept); break;
        case O_PEERCA: o->peer_tls_ca = optarg; break;
        case O_DELAY: bad = kd_parse_i64(optarg, 0, 60000, &v); o->debug_handoff_delay_ms = (int32_t)v; break;
        case O_XPORT:
            o->handoff_transport = optarg;
            bad = strcmp(optarg, "grpc") && strcmp(optarg, "nccl") && strcmp(optarg, "auto");
            break;
        case O_NLINKS: bad = kd_parse_i64(optarg, 1, 1024, &v); o->nccl_max_links = (int32_t)v; break;
        case O_NIDLE: bad = kd_parse_f64(optarg, 0.001, 86400, &o->nccl_idle_seconds); break;
        case O_NCONN: bad = kd_parse_f64(optarg, 0.001, 3600, &o->nccl_connect_seconds); break;
        case O_BACKEND:
            o->backend = optarg;
            bad = strcmp(optarg, "cpu") && strcmp(optarg, "cuda") && strcmp(optarg, "auto");
            break;
        case O_ACT:
            bad = strcmp(optarg, "fp32") && strcmp(optarg, "bf16");
            o->act_bf16 = !strcmp(optarg, "bf16");
            break;
        case O_SEQS: bad = kd_parse_i64(optarg, 1, 4096, &v); o->eng.max_seqs = (int32_t)v; break;
        case O_QUEUE: bad = kd_parse_i64(optarg, 0, 1 << 20, &v); o->eng.max_queue = (int32_t)v; break;
        case O_BATCH: bad = kd_parse_i64(optarg, 1, 1 << 24, &v); o->eng.max_batch_tokens = v; break;
        case O_LEN: bad = kd_parse_i64(optarg, 2, 1 << 26, &v); o->eng.max_model_len = v; break;
        case O_SPEC: bad = kd_parse_i64(optarg, 0, 31, &v); o->default_spec = (int32_t)v; break;
        case O_MAXSPEC: bad = kd_parse_i64(optarg, 0, 31, &v); o->eng.max_spec = (int32_t)v; break;
        case O_COMMIT: bad = kd_commit_mode_parse(optarg, &o->eng.commit); break;
        case O_BLOCK: bad = kd_parse_i64(optarg, 0, 1 << 20, &v); o->eng.prefix_block = (int32_t)v; break;
        case O_CACHE: bad = kd_parse_u64(optarg, &u); o->eng.prefix_cache_bytes = (size_t)u; break;
        case O_DRAIN: bad = kd_parse_f64(optarg, 0, 86400, &o->drain_seconds); break;
        case O_CQ: bad = kd_parse_i64(optarg, 1, 64, &v); o->cq_threads = (int32_t)v; break;
        case O_MSG: bad = kd_parse_i64(optarg, 1024, 1 << 30, &v); o->max_message_bytes = (int32_t)v; break;
        case O_PUSH: bad = kd_parse_i64(optarg, 0, 3600000, &v); o->retry_pushback_ms = (int32_t)v; break;
        case O_CERT: o->tls_cert = optarg; break;
        case O_KEY: o->tls_key = optarg; break;
        case O_CA: o->tls_client_ca = optarg; break;
        case O_JSON: g_log_json = 1; break;
        case O_HELP: usage(stdout); exit(0);
        default:
            fprintf(stderr, "kdecode serve: unknown flag or missing value: %s\n", argv[optind - 1]);
            usage(stderr);
            return -1;
        }
        if (bad) {
            fprintf(stderr, "kdecode serve: bad value for --%s: '%s'\n", opts[li].name, optarg);
            return -1;
        }
    }
    if (optind < argc) return fprintf(stderr, "kdecode serve: unexpected argument '%s'\n", argv[optind]), -1;
    if (!o->model_dir) return fprintf(stderr, "kdecode serve: --model is required\n"), -1;
    if (!strcmp(o->handoff_transport, "nccl") && !strcmp(o->backend, "cpu"))
        return fprintf(stderr, "kdecode serve: --handoff-transport nccl needs a GPU backend (--backend cuda or auto)\n"),
               -1;
    if (!o->tls_cert != !o->tls_key)
        return fprintf(stderr, "kdecode serve: --tls-cert and --tls-key go together\n"), -1;
    if (o->tls_client_ca && !o->tls_cert)
        return fprintf(stderr, "kdecode serve: --tls-client-ca needs --tls-cert and --tls-key\n"), -1;
    if (o->default_spec > o->eng.max_spec)
        return fprintf(stderr, "kdecode serve: --spec-tokens %d exceeds --max-spec-tokens %d\n", o->default_spec,
                       o->eng.max_spec), -1;
    const int64_t need = (int64_t)o->eng.max_seqs * (1 + o->eng.max_spec) + 1;
    if (o->eng.max_batch_tokens == 0) o->eng.max_batch_tokens = need + 256;
    o->max_prompt = o->eng.max_model_len - 1;
    return 0;
}

/* ---------------------------------------------------------------------- server state */

enum { ST_LOADING = 0, ST_SERVING, ST_DRAINING, ST_STOPPING };

typedef struct tag {
    void (*fn)(void *obj, int ok);
    void *obj;
} tag;

typedef struct gen_call gen_call;
typedef struct watch_call watch_call;
typedef struct handoff handoff;

/* Whatever receives a request's engine events (a Generate or a Prefill call). */
typedef struct sink {
    uint64_t eid;
    void (*on_event)(struct sink *s, const kd_event *ev);
} sink;

typedef struct sect {
    uint64_t offset, size, xxh3;
} sect;

/* Work for the engine thread, in order. Synchronous commands (sync = 1) are answered
 * through done/result under g_srv.mu and freed by the waiter. */
typedef struct cmd {
    enum { CMD_SUBMIT, CMD_ABORT, CMD_ABORT_ALL, CMD_RESERVE, CMD_RELEASE, CMD_WRITE, CMD_VERIFY } kind;
    sink *sink;
    const kd_request_params *params;
    const int32_t *drafts;
    int32_t n_drafts;
    int32_t slot;          /* SUBMIT into a reserved slot (-1: queue), RELEASE, WRITE, VERIFY */
    uint64_t id;           /* ABORT */
    uint64_t offset;       /* WRITE: len bytes from src (owned as data, malloc) or from the
                            * message bb after its first skip bytes (owned); rx: checksums */
    uint8_t *data;
    const uint8_t *src;
    grpc_byte_buffer *bb;
    size_t skip;
    struct push_rx *rx;
    size_t len;
    const sect *sects;     /* VERIFY */
    size_t n_sects;
    int sync, done, result;
    struct cmd *next;
} cmd;

typedef struct server {
    serve_opts o;
    grpc_server *gs;
    grpc_completion_queue *cq;
    pthread_t *cq_threads;
    atomic_int state;
    kd_metrics *metrics;
    kd_metrics_http *metrics_http;
    /* the model and engine: the engine thread's */
    kd_model *model;
    kd_backend *be;
    kd_engine *eng;
    kd_api_limits lim;
    pthread_t engine_thread;
    int engine_started;
    /* everything below under mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    cmd *cmd_head, *cmd_tail;
    int engine_stop;
    gen_call *live;          /* registry of Generate calls that hold a request */
    int n_live;
    /* Generate calls accepted whose last batch (final message and status) has not completed:
     * the drain waits for these too, since a request the engine finished may still have its
     * last tokens on the way, and cancelling the calls would lose them */
    int n_streams;
    int n_calls;             /* call objects alive (for shutdown) */
    uint64_t next_id;
    /* Ids given to requests that came without one: "kd-<tag>-<n>", the tag drawn at start, so
     * that a prefill worker's ids never collide with a decode worker's own (a handoff named
     * "kd-1" by one worker met a live "kd-1" of the other: ALREADY_EXISTS) */
    uint32_t id_tag;
    watch_call *watchers;
    kd_engine_stats snap;    /* published after every step (slots_used: without the pool's) */
    /* Slots the engine thread keeps reserved for arriving handoffs, so that a PushState header
     * takes one at once instead of waiting for the engine thread (which may be inside a step
     * of several milliseconds); refilled between steps, given back while requests wait or
     * the worker is not serving. Not counted as used in GetLoads or the metrics. */
    int32_t pool[kHandoffPool];
    int n_pool, pool_target;
    int pool_wake;           /* the pool wants the engine thread (a slot taken, the state changed) */
    int64_t tokens_in_flight;
    handoff *handoffs;       /* states arrived or arriving by PushState */
    int n_handoffs;
    int n_prefill;           /* Prefill requests in the engine or handing off */
    int n_replies;           /* their answers on the way (the drain waits for them) */
    /* engine thread only: engine id -> sink */
    sink **idmap;
    size_t idmap_cap;
} server;

static server g_srv;
/* the NCCL transport's links (NULL: states travel over gRPC only) */
static kd_nccl *g_nccl;
static const char *g_nccl_off = "--handoff-transport grpc";
static const char *layout_fingerprint(void);
typedef struct push_call push_call;
static int push_nccl_begin(push_call *p, const Kdecode__V1__HandoffHeader *hd, char *msg, size_t len);
static int push_nccl_cancel(push_call *p);
static void push_ready(push_call *p, const char *how);
typedef struct prefill_call prefill_call;
static void *prefill_state_get(prefill_call *p);
static kd_client *peer_client(const char *target, int *owned, kd_err *err);
static void peer_client_drop(const char *target, kd_client *cl);
/* Where an NCCL push's time went (seconds): the link acquired (connected when new), the
 * sender's sum64, the send posted to its completion (the header RPC and its answer included). */
typedef struct nccl_times {
    double link, sum64, xfer;
} nccl_times;
static int prefill_push_nccl(prefill_call *p, kd_client *cl, uint8_t **resp, size_t *resp_len, int *code, char *msg,
                             size_t len, nccl_times *tm, kd_err *err);
static int prefill_state_to_host(prefill_call *p, kd_err *err);
static void prefill_state_put(prefill_call *p);

static gen_call *registry_find(const char *id);
static void enqueue_abort_locked(gen_call *g);
static int handoff_abort_locked(const char *id);
static void gen_on_event(sink *k, const kd_event *ev);
typedef struct gen_call gen_call;
static int handoff_claim(gen_call *g, int32_t *slot, char *msg, size_t len);
static int run_sync(cmd *c);
static int push_write_cmd(const cmd *c, kd_err *err);
static int push_verify_cmd(const cmd *c, kd_err *err);

/* ------------------------------------------------------------------ message helpers */

static grpc_byte_buffer *pack_bb(const ProtobufCMessage *m) {
    size_t n = protobuf_c_message_get_packed_size(m);
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf) return NULL;
    protobuf_c_message_pack(m, buf);
    grpc_slice s = grpc_slice_from_copied_buffer((const char *)buf, n);
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    free(buf);
    return bb;
}

/* Flattens a received message; *data must be freed with grpc_slice_unref(*slice). */
static int read_bb(grpc_byte_buffer *bb, grpc_slice *slice) {
    grpc_byte_buffer_reader r;
    if (!grpc_byte_buffer_reader_init(&r, bb)) return -1;
    *slice = grpc_byte_buffer_reader_readall(&r);
    grpc_byte_buffer_reader_destroy(&r);
    return 0;
}

/* Single-op batches every streaming call starts with: wait for the close (cancellation
 * shows there), and receive the next message. 0 if the batch started. */
static int start_recv_close(grpc_call *call, int *cancelled, tag *t) {
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    op.data.recv_close_on_server.cancelled = cancelled;
    return grpc_call_start_batch(call, &op, 1, t, NULL) == GRPC_CALL_OK ? 0 : -1;
}

static int start_recv_message(grpc_call *call, grpc_byte_buffer **bb, tag *t) {
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = bb;
    return grpc_call_start_batch(call, &op, 1, t, NULL) == GRPC_CALL_OK ? 0 : -1;
}

static void call_ref_count(int delta) {
    pthread_mutex_lock(&g_srv.mu);
    g_srv.n_calls += delta;
    pthread_cond_broadcast(&g_srv.cv);
    pthread_mutex_unlock(&g_srv.mu);
}

/* ------------------------------------------------------------- status-only replies */

/* A call answered with a status and nothing else (unknown method, refusals). */
typedef struct status_call {
    tag t;
    grpc_call *call;
    grpc_slice details;
    grpc_metadata trailer;
    char push[32];
    int has_trailer;
    int cancelled;
    int counted; /* in g_srv.n_replies until the batch completes */
} status_call;

static void status_done(void *obj, int ok) {
    (void)ok;
    status_call *c = obj;
    if (c->counted) {
        pthread_mutex_lock(&g_srv.mu);
        g_srv.n_replies--;
        pthread_cond_broadcast(&g_srv.cv);
        pthread_mutex_unlock(&g_srv.mu);
    }
    grpc_slice_unref(c->details);
    grpc_call_unref(c->call);
    free(c);
    call_ref_count(-1);
}

/* counted: the answer of accepted work (a Prefill), which the drain waits for (status_call) */
static status_call *status_new(int counted) {
    status_call *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    call_ref_count(1);
    if (counted) {
        c->counted = 1;
        pthread_mutex_lock(&g_srv.mu);
        g_srv.n_replies++;
        pthread_mutex_unlock(&g_srv.mu);
    }
    return c;
}

/* Sends initial metadata (unless sent) and the status; takes the call reference. with_close:
 * also wait for the close (unless the caller already has RECV_CLOSE_ON_SERVER in flight). */
static void reply_status_cx(grpc_call *call, int initial_sent, int with_close, grpc_status_code code, const char *msg,
                            long pushback_ms, int counted) {
    status_call *c = status_new(counted);
    if (!c) {
        grpc_call_cancel(call, NULL);
        grpc_call_unref(call);
        return;
    }
    c->t = (tag){status_done, c};
    c->call = call;
    c->details = grpc_slice_from_copied_string(msg);
    grpc_op ops[3];
    memset(ops, 0, sizeof ops);
    int n = 0;
    if (!initial_sent) ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[n].data.send_status_from_server.status = code;
    ops[n].data.send_status_from_server.status_details = &c->details;
    if (pushback_ms >= 0) {
        snprintf(c->push, sizeof c->push, "%ld", pushback_ms);
        c->trailer.key = grpc_slice_from_static_string("grpc-retry-pushback-ms");
        c->trailer.value = grpc_slice_from_copied_string(c->push);
        ops[n].data.send_status_from_server.trailing_metadata_count = 1;
        ops[n].data.send_status_from_server.trailing_metadata = &c->trailer;
        c->has_trailer = 1;
    }
    n++;
    if (with_close) {
        ops[n].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
        ops[n].data.recv_close_on_server.cancelled = &c->cancelled;
        n++;
    }
    const int has_trailer = c->has_trailer;
    grpc_slice trailer = c->trailer.value;
    if (grpc_call_start_batch(call, ops, (size_t)n, &c->t, NULL) != GRPC_CALL_OK) status_done(c, 0);
    if (has_trailer) grpc_slice_unref(trailer); /* the batch holds its own refs */
}

static void reply_status_ex(grpc_call *call, int initial_sent, int with_close, grpc_status_code code, const char *msg,
                            long pushback_ms) {
    reply_status_cx(call, initial_sent, with_close, code, msg, pushback_ms, 0);
}

static void reply_status(grpc_call *call, int initial_sent, grpc_status_code code, const char *msg, long pushback_ms) {
    reply_status_ex(call, initial_sent, 1, code, msg, pushback_ms);
}

/* Sends one message and an OK status (initial metadata too unless sent; RECV_CLOSE unless
 * the caller has one in flight); takes the call reference and the byte buffer. */
static void reply_message_cx(grpc_call *call, grpc_byte_buffer *msg, int initial_sent, int with_close, int counted) {
    status_call *c = status_new(counted);
    if (!c) {
        grpc_byte_buffer_destroy(msg);
        grpc_call_cancel(call, NULL);
        grpc_call_unref(call);
        return;
    }
    c->t = (tag){status_done, c};
    c->call = call;
    c->details = grpc_empty_slice();
    grpc_op ops[4];
    memset(ops, 0, sizeof ops);
    size_t n = 0;
    if (!initial_sent) ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[n].op = GRPC_OP_SEND_MESSAGE;
    ops[n++].data.send_message.send_message = msg;
    ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[n].data.send_status_from_server.status = GRPC_STATUS_OK;
    ops[n++].data.send_status_from_server.status_details = &c->details;
    if (with_close) {
        ops[n].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
        ops[n++].data.recv_close_on_server.cancelled = &c->cancelled;
    }
    if (grpc_call_start_batch(call, ops, n, &c->t, NULL) != GRPC_CALL_OK) status_done(c, 0);
    grpc_byte_buffer_destroy(msg); /* the batch took its own reference */
}

static void reply_message(grpc_call *call, grpc_byte_buffer *msg, int initial_sent, int with_close) {
    reply_message_cx(call, msg, initial_sent, with_close, 0);
}

/* ---------------------------------------------------------------- health and loads */

static int readiness(void) { return atomic_load(&g_srv.state) == ST_SERVING; }

/* Status of a health service name; -1 if unknown. */
static int health_status(const char *service) {
    if (!service[0]) return GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING; /* liveness */
    if (!strcmp(service, "kdecode.v1.Decoder"))
        return readiness() ? GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING
                           : GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING;
    return -1;
}

static void fill_loads(Kdecode__V1__Loads *l) {
    pthread_mutex_lock(&g_srv.mu);
    l->slots_total = g_srv.o.eng.max_seqs;
    l->slots_used = g_srv.snap.slots_used;
    l->waiting = g_srv.n_live - g_srv.snap.slots_used > 0 ? g_srv.n_live - g_srv.snap.slots_used : 0;
    l->queue_capacity = g_srv.o.eng.max_queue;
    l->tokens_in_flight = g_srv.tokens_in_flight;
    l->handoffs_pending = g_srv.n_handoffs;
    pthread_mutex_unlock(&g_srv.mu);
    l->draining = atomic_load(&g_srv.state) >= ST_DRAINING;
}

/* --------------------------------------------------------------------- unary calls */

typedef enum { U_ABORT, U_LOADS, U_INFO, U_HEALTH, U_NCCL } unary_kind;

typedef struct unary_call {
    tag t;
    grpc_call *call;
    unary_kind kind;
    grpc_byte_buffer *recv;
    int stage;
} unary_call;

static void unary_done(void *obj, int ok) {
    unary_call *c = obj;
    if (c->stage == 0) {
        c->stage = 1;
        grpc_call *call = c->call;
        grpc_byte_buffer *bb = c->recv;
        const unary_kind kind = c->kind;
        free(c);
        call_ref_count(-1);
        if (!ok) { /* cancelled before the message came */
            if (bb) grpc_byte_buffer_destroy(bb);
            grpc_call_unref(call);
            return;
        }
        if (!bb) {
            reply_status(call, 1, GRPC_STATUS_INVALID_ARGUMENT, "missing request message", -1);
            return;
        }
        grpc_slice s;
        if (read_bb(bb, &s)) {
            grpc_byte_buffer_destroy(bb);
            reply_status(call, 1, GRPC_STATUS_INTERNAL, "cannot read the request", -1);
            return;
        }
        grpc_byte_buffer_destroy(bb);
        const uint8_t *data = GRPC_SLICE_START_PTR(s);
        const size_t len = GRPC_SLICE_LENGTH(s);
        grpc_byte_buffer *out = NULL;
        grpc_status_code code = GRPC_STATUS_OK;
        char msg[512] = "";
        switch (kind) {
        case U_ABORT: {
            char id[KD_REQUEST_ID_MAX + 1];
            int rc = kd_api_parse_abort(data, len, id, msg, sizeof msg);
            if (rc) {
                code = (grpc_status_code)rc;
                break;
            }
            pthread_mutex_lock(&g_srv.mu);
            gen_call *live = registry_find(id);
            int found = live != NULL;
            if (live) enqueue_abort_locked(live);
            else found = handoff_abort_locked(id);
            pthread_mutex_unlock(&g_srv.mu);
            if (!found) {
                code = GRPC_STATUS_NOT_FOUND;
                snprintf(msg, sizeof msg, "no live request with id '%s'", id);
                break;
            }
            Kdecode__V1__AbortResponse r = KDECODE__V1__ABORT_RESPONSE__INIT;
            out = pack_bb(&r.base);
            break;
        }
        case U_LOADS: {
            Kdecode__V1__GetLoadsRequest *q = kdecode__v1__get_loads_request__unpack(NULL, len, data);
            if (!q) {
                code = GRPC_STATUS_INVALID_ARGUMENT;
                snprintf(msg, sizeof msg, "cannot parse kdecode.v1.GetLoadsRequest");
                break;
            }
            kdecode__v1__get_loads_request__free_unpacked(q, NULL);
            Kdecode__V1__Loads l = KDECODE__V1__LOADS__INIT;
            fill_loads(&l);
            out = pack_bb(&l.base);
            break;
        }
        case U_INFO: {
            Kdecode__V1__GetServerInfoRequest *q = kdecode__v1__get_server_info_request__unpack(NULL, len, data);
            if (!q) {
                code = GRPC_STATUS_INVALID_ARGUMENT;
                snprintf(msg, sizeof msg, "cannot parse kdecode.v1.GetServerInfoRequest");
                break;
            }
            kdecode__v1__get_server_info_request__free_unpacked(q, NULL);
            if (atomic_load(&g_srv.state) == ST_LOADING || !g_srv.eng) {
                code = GRPC_STATUS_UNAVAILABLE;
                snprintf(msg, sizeof msg, "the model is still loading");
                break;
            }
            char fp[17];
            snprintf(fp, sizeof fp, "%016" PRIx64, g_srv.model->fingerprint);
            Kdecode__V1__ServerInfo i = KDECODE__V1__SERVER_INFO__INIT;
            i.version = KD_VERSION;
            i.model_fingerprint = fp;
            i.role = (char *)g_srv.o.role;
            i.backend = (char *)g_srv.be->ops->name;
            i.vocab_size = g_srv.model->config.vocab;
            i.num_layers = g_srv.model->config.n_layers;
            i.hidden_size = g_srv.model->config.hidden;
            i.eos_token_id = g_srv.model->eos_token_id;
            i.max_seqs = g_srv.o.eng.max_seqs;
            i.max_queue = g_srv.o.eng.max_queue;
            i.max_model_len = g_srv.o.eng.max_model_len;
            i.max_spec_tokens = g_srv.o.eng.max_spec;
            i.default_spec_tokens = g_srv.o.default_spec;
            i.prefix_block = g_srv.o.eng.prefix_block;
            i.commit_mode = (char *)kd_commit_mode_name(g_srv.o.eng.commit);
            i.max_message_bytes = g_srv.o.max_message_bytes;
            out = pack_bb(&i.base);
            break;
        }
        case U_NCCL: {
            const int nul =
                kd_api_string_has_nul(&kdecode__v1__nccl_connect_request__descriptor, data, len, msg, sizeof msg);
            Kdecode__V1__NcclConnectRequest *q = nul ? NULL : kdecode__v1__nccl_connect_request__unpack(NULL, len, data);
            if (!q) {
                code = GRPC_STATUS_INVALID_ARGUMENT;
                if (!nul) snprintf(msg, sizeof msg, "cannot parse kdecode.v1.NcclConnectRequest");
                break;
            }
            if (atomic_load(&g_srv.state) != ST_SERVING) {
                code = GRPC_STATUS_UNAVAILABLE;
                snprintf(msg, sizeof msg, "the worker is not serving");
            } else if (!g_nccl) {
                code = GRPC_STATUS_FAILED_PRECONDITION;
                snprintf(msg, sizeof msg, "this worker takes no NCCL handoffs (%s)", g_nccl_off);
            } else if (strcmp(q->model_fingerprint, layout_fingerprint())) {
                code = GRPC_STATUS_FAILED_PRECONDITION;
                snprintf(msg, sizeof msg, "model fingerprint '%.100s' differs from this worker's '%s'",
                         q->model_fingerprint, layout_fingerprint());
            } else {
                kd_dev_region regs[64];
                kd_err rerr;
                const int nr = kd_backend_state_regions(g_srv.be, 0, regs, 64, &rerr);
                uint64_t parts[64];
                for (int i = 0; i < nr; i++) parts[i] = regs[i].n_bytes;
                int rc = nr < 1 ? (snprintf(msg, sizeof msg, "this worker's slots: %.300s", rerr.msg), KD_STATUS_INTERNAL)
                                : kd_nccl_accept(g_nccl, q->comm_id, q->unique_id.data, q->unique_id.len, msg, sizeof msg);
                kd_metrics_set(g_srv.metrics, KD_G_NCCL_LINKS, kd_nccl_count(g_nccl));
                if (rc) {
                    code = (grpc_status_code)rc;
                } else {
                    kd_cuda_info ci;
                    kd_cuda_describe(&ci);
                    Kdecode__V1__NcclConnectResponse r = KDECODE__V1__NCCL_CONNECT_RESPONSE__INIT;
                    r.device = 0;
                    r.device_name = ci.device0_name;
                    r.nccl_version = kd_nccl_version();
                    r.n_recv_parts = (size_t)nr, r.recv_parts = parts;
                    out = pack_bb(&r.base);
                    logf_("nccl-link", "joining communicator %s", q->comm_id);
                }
            }
            kdecode__v1__nccl_connect_request__free_unpacked(q, NULL);
            break;
        }
        case U_HEALTH: {
            const int nul =
                kd_api_string_has_nul(&grpc__health__v1__health_check_request__descriptor, data, len, msg, sizeof msg);
            Grpc__Health__V1__HealthCheckRequest *q =
                nul ? NULL : grpc__health__v1__health_check_request__unpack(NULL, len, data);
            if (!q) {
                code = GRPC_STATUS_INVALID_ARGUMENT;
                if (!nul) snprintf(msg, sizeof msg, "cannot parse grpc.health.v1.HealthCheckRequest");
                break;
            }
            int st = health_status(q->service);
            if (st < 0) {
                code = GRPC_STATUS_NOT_FOUND;
                snprintf(msg, sizeof msg, "unknown service '%.200s'", q->service);
            } else {
                Grpc__Health__V1__HealthCheckResponse r = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
                r.status = (Grpc__Health__V1__HealthCheckResponse__ServingStatus)st;
                out = pack_bb(&r.base);
            }
            grpc__health__v1__health_check_request__free_unpacked(q, NULL);
            break;
        }
        }
        grpc_slice_unref(s);
        if (code != GRPC_STATUS_OK || !out) {
            if (out) grpc_byte_buffer_destroy(out);
            reply_status(call, 1, code == GRPC_STATUS_OK ? GRPC_STATUS_INTERNAL : code, msg[0] ? msg : "out of memory", -1);
            return;
        }
        reply_message(call, out, 1, 1);
    }
}

static void unary_start(grpc_call *call, unary_kind kind) {
    unary_call *c = calloc(1, sizeof *c);
    if (!c) {
        grpc_call_cancel(call, NULL);
        grpc_call_unref(call);
        return;
    }
    call_ref_count(1);
    c->t = (tag){unary_done, c};
    c->call = call;
    c->kind = kind;
    grpc_op ops[2];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[1].op = GRPC_OP_RECV_MESSAGE;
    ops[1].data.recv_message.recv_message = &c->recv;
    if (grpc_call_start_batch(call, ops, 2, &c->t, NULL) != GRPC_CALL_OK) {
        grpc_call_unref(call);
        free(c);
        call_ref_count(-1);
    }
}

/* ------------------------------------------------------------------- Generate calls */

struct gen_call {
    sink s;                       /* first: the engine's events */
    tag t_recv, t_close, t_send;
    grpc_call *call;
    pthread_mutex_t mu;
    int refs;
    kd_generate_req req;
    grpc_byte_buffer *recv_bb, *send_bb;
    int close_cancelled;
    /* outbound, under mu */
    int32_t *toks;
    int32_t n_toks, cap_toks;
    kd_finish finish;
    kd_usage usage;
    int engine_done, send_in_flight, final_sent, md_sent, broken, cancel_sent;
    grpc_slice status_details;
    double t_arrive, t_first, t_last;
    int64_t generated;
    /* registry, under g_srv.mu */
    gen_call *prev, *next;
    int registered;
    int streaming; /* counted in g_srv.n_streams, under g_srv.mu */
};

/* The call's last batch completed, or the call is gone (g->mu not held). */
static void gen_stream_done(gen_call *g) {
    pthread_mutex_lock(&g_srv.mu);
    if (g->streaming) {
        g->streaming = 0;
        g_srv.n_streams--;
        pthread_cond_broadcast(&g_srv.cv);
    }
    pthread_mutex_unlock(&g_srv.mu);
}

static void gen_unref(gen_call *g) {
    pthread_mutex_lock(&g->mu);
    int left = --g->refs;
    pthread_mutex_unlock(&g->mu);
    if (left) return;
    gen_stream_done(g);
    grpc_call_unref(g->call);
    if (g->recv_bb) grpc_byte_buffer_destroy(g->recv_bb);
    if (g->send_bb) grpc_byte_buffer_destroy(g->send_bb);
    grpc_slice_unref(g->status_details);
    kd_generate_req_free(&g->req);
    free(g->toks);
    pthread_mutex_destroy(&g->mu);
    free(g);
    call_ref_count(-1);
}

static gen_call *registry_find(const char *id) { /* g_srv.mu held */
    for (gen_call *g = g_srv.live; g; g = g->next)
        if (!strcmp(g->req.request_id, id)) return g;
    return NULL;
}

static void registry_remove_locked(gen_call *g) {
    if (!g->registered) return;
    if (g->prev) g->prev->next = g->next;
    else g_srv.live = g->next;
    if (g->next) g->next->prev = g->prev;
    g->registered = 0;
    g_srv.n_live--;
    g_srv.tokens_in_flight -= g->req.params.max_tokens - g->generated;
    pthread_cond_broadcast(&g_srv.cv);
}

static void enqueue_locked(cmd *c) {
    c->next = NULL;
    if (g_srv.cmd_tail) g_srv.cmd_tail->next = c;
    else g_srv.cmd_head = c;
    g_srv.cmd_tail = c;
    pthread_cond_broadcast(&g_srv.cv);
}

static void enqueue_abort_locked(gen_call *g) {
    cmd *c = calloc(1, sizeof *c);
    if (!c) return; /* the request runs to its end: bounded by max_tokens */
    c->kind = CMD_ABORT;
    c->id = g->s.eid;
    enqueue_locked(c);
}

static void gen_send_done(void *obj, int ok);

/* Starts the next send if none is in flight (g->mu held). The last message carries the
 * finish reason, the usage and the OK status in the same batch. */
static void gen_maybe_send(gen_call *g) {
    if (g->send_in_flight || g->final_sent || g->broken) return;
    const int final = g->engine_done;
    if (!g->n_toks && !final) return;
    Kdecode__V1__GenerateResponse r = KDECODE__V1__GENERATE_RESPONSE__INIT;
    Kdecode__V1__Usage u = KDECODE__V1__USAGE__INIT;
    r.n_token_ids = (size_t)g->n_toks;
    r.token_ids = g->toks;
    if (!g->md_sent) r.request_id = g->req.request_id;
    if (final) {
        static const Kdecode__V1__FinishReason map[] = {
            KDECODE__V1__FINISH_REASON__FINISH_REASON_UNSPECIFIED, KDECODE__V1__FINISH_REASON__FINISH_REASON_LENGTH,
            KDECODE__V1__FINISH_REASON__FINISH_REASON_STOP, KDECODE__V1__FINISH_REASON__FINISH_REASON_ABORT,
            KDECODE__V1__FINISH_REASON__FINISH_REASON_ERROR};
        r.finish_reason = map[g->finish];
        u.prompt_tokens = g->usage.prompt_tokens;
        u.completion_tokens = g->usage.completion_tokens;
        u.cached_tokens = g->usage.cached_tokens;
        u.drafted_tokens = g->usage.drafted;
        u.accepted_tokens = g->usage.accepted;
        u.steps = g->usage.steps;
        u.queue_seconds = g->usage.queue_seconds;
        u.time_to_first_token_seconds = g->t_first > 0 ? g->t_first - g->t_arrive : 0;
        u.total_seconds = now_s() - g->t_arrive;
        r.usage = &u;
    }
    g->send_bb = pack_bb(&r.base);
    g->n_toks = 0;
    if (!g->send_bb) {
        g->broken = 1;
        return;
    }
    grpc_op ops[3];
    memset(ops, 0, sizeof ops);
    size_t n = 0;
    if (!g->md_sent) ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[n].op = GRPC_OP_SEND_MESSAGE;
    ops[n++].data.send_message.send_message = g->send_bb;
    if (final) {
        const int err = g->finish == KD_FINISH_ERROR;
        g->status_details = grpc_slice_from_static_string(err ? "the compute backend failed" : "");
        ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
        ops[n].data.send_status_from_server.status = err ? GRPC_STATUS_INTERNAL : GRPC_STATUS_OK;
        ops[n++].data.send_status_from_server.status_details = &g->status_details;
        g->final_sent = 1;
    }
    g->md_sent = 1;
    g->send_in_flight = 1;
    g->refs++;
    if (grpc_call_start_batch(g->call, ops, n, &g->t_send, NULL) != GRPC_CALL_OK) {
        g->send_in_flight = 0;
        g->refs--;
        g->broken = 1;
    }
}

static void gen_send_done(void *obj, int ok) {
    gen_call *g = obj;
    pthread_mutex_lock(&g->mu);
    g->send_in_flight = 0;
    grpc_byte_buffer_destroy(g->send_bb);
    g->send_bb = NULL;
    if (!ok) g->broken = 1;
    gen_maybe_send(g);
    const int over = !g->send_in_flight && (g->final_sent || g->broken);
    pthread_mutex_unlock(&g->mu);
    if (over) gen_stream_done(g);
    gen_unref(g);
}

/* The client is gone or the deadline passed (or the call ended normally). */
static void gen_close_done(void *obj, int ok) {
    (void)ok;
    gen_call *g = obj;
    if (g->close_cancelled) {
        pthread_mutex_lock(&g_srv.mu);
        if (g->registered) enqueue_abort_locked(g);
        pthread_mutex_unlock(&g_srv.mu);
        pthread_mutex_lock(&g->mu);
        g->broken = 1;
        pthread_mutex_unlock(&g->mu);
    }
    gen_unref(g);
}

static void gen_recv_done(void *obj, int ok) {
    gen_call *g = obj;
    grpc_byte_buffer *bb = g->recv_bb;
    g->recv_bb = NULL;
    char msg[512] = "";
    int code = KD_STATUS_OK;
    long pushback = -1;
    if (!ok) {
        if (bb) grpc_byte_buffer_destroy(bb);
        gen_unref(g);
        return;
    }
    if (!bb) {
        code = KD_STATUS_INVALID_ARGUMENT;
        snprintf(msg, sizeof msg, "missing request message");
    } else {
        grpc_slice s;
        if (read_bb(bb, &s)) {
            code = KD_STATUS_INTERNAL;
            snprintf(msg, sizeof msg, "cannot read the request");
        } else {
            code = kd_api_parse_generate(GRPC_SLICE_START_PTR(s), GRPC_SLICE_LENGTH(s), &g_srv.lim, &g->req, msg,
                                         sizeof msg);
            grpc_slice_unref(s);
        }
        grpc_byte_buffer_destroy(bb);
    }
    const int state = atomic_load(&g_srv.state);
    /* a draining worker still takes the claims of handoffs it holds: their prompts were
     * computed for it and are here, and the drain waits for them */
    const int claim_draining = state == ST_DRAINING && g->req.handoff_id[0];
    if (code == KD_STATUS_OK && state != ST_SERVING && !claim_draining) {
        code = KD_STATUS_UNAVAILABLE;
        snprintf(msg, sizeof msg, state == ST_LOADING ? "the worker is loading its model" : "the worker is draining");
        kd_metrics_add(g_srv.metrics, KD_C_REJECTED_DRAINING, 1);
    }
    int32_t slot = -1; /* a claimed handoff's */
    if (code == KD_STATUS_OK && g->req.handoff_id[0]) code = handoff_claim(g, &slot, msg, sizeof msg);
    cmd *c = NULL;
    if (code == KD_STATUS_OK) {
        c = calloc(1, sizeof *c);
        pthread_mutex_lock(&g_srv.mu);
        if (!g->req.request_id[0]) snprintf(g->req.request_id, sizeof g->req.request_id, "kd-%08x-%llu",
                                            g_srv.id_tag, (unsigned long long)(g_srv.next_id + 1));
        if (!c) {
            code = KD_STATUS_INTERNAL;
            snprintf(msg, sizeof msg, "out of memory");
        } else if (registry_find(g->req.request_id)) {
            code = KD_STATUS_ALREADY_EXISTS;
            snprintf(msg, sizeof msg, "a live request already has id '%s'", g->req.request_id);
        } else if (slot < 0 && g_srv.n_live + g_srv.n_prefill >= g_srv.o.eng.max_seqs + g_srv.o.eng.max_queue) {
            code = KD_STATUS_RESOURCE_EXHAUSTED;
            snprintf(msg, sizeof msg, "all %d slots and %d queue places are taken; retry later",
                     g_srv.o.eng.max_seqs, g_srv.o.eng.max_queue);
            pushback = g_srv.o.retry_pushback_ms;
        } else {
            g->s.eid = ++g_srv.next_id;
            g->prev = NULL, g->next = g_srv.live;
            if (g_srv.live) g_srv.live->prev = g;
            g_srv.live = g;
            g->registered = 1;
            g_srv.n_live++;
            g->streaming = 1;
            g_srv.n_streams++;
            g_srv.tokens_in_flight += g->req.params.max_tokens;
            pthread_mutex_lock(&g->mu);
            g->refs++; /* the engine's */
            pthread_mutex_unlock(&g->mu);
            c->kind = CMD_SUBMIT, c->sink = &g->s, c->params = &g->req.params;
            c->drafts = g->req.drafts, c->n_drafts = g->req.n_drafts, c->slot = slot;
            slot = -1; /* the engine's now */
            enqueue_locked(c);
            c = NULL;
        }
        pthread_mutex_unlock(&g_srv.mu);
        free(c);
    }
    if (slot >= 0) { /* a claimed handoff whose request could not start: free its slot */
        cmd *r = calloc(1, sizeof *r);
        if (r) {
            r->kind = CMD_RELEASE, r->slot = slot;
            pthread_mutex_lock(&g_srv.mu);
            enqueue_locked(r);
            pthread_mutex_unlock(&g_srv.mu);
        }
    }
    if (code != KD_STATUS_OK) {
        if (code == KD_STATUS_RESOURCE_EXHAUSTED) kd_metrics_add(g_srv.metrics, KD_C_REJECTED_BUSY, 1);
        else if (code == KD_STATUS_INVALID_ARGUMENT || code == KD_STATUS_ALREADY_EXISTS || code == KD_STATUS_NOT_FOUND)
            kd_metrics_add(g_srv.metrics, KD_C_REJECTED_INVALID, 1);
        pthread_mutex_lock(&g->mu);
        g->final_sent = 1; /* nothing else may be sent */
        pthread_mutex_unlock(&g->mu);
        grpc_call_ref(g->call);
        reply_status_ex(g->call, 0, 0, (grpc_status_code)code, msg, pushback);
    }
    gen_unref(g);
}

static void gen_start(grpc_call *call) {
    gen_call *g = calloc(1, sizeof *g);
    if (!g) {
        grpc_call_cancel(call, NULL);
        grpc_call_unref(call);
        return;
    }
    call_ref_count(1);
    pthread_mutex_init(&g->mu, NULL);
    g->call = call;
    g->s.on_event = gen_on_event;
    g->t_recv = (tag){gen_recv_done, g};
    g->t_close = (tag){gen_close_done, g};
    g->t_send = (tag){gen_send_done, g};
    g->t_arrive = now_s();
    g->status_details = grpc_empty_slice();
    g->refs = 2;
    if (start_recv_close(call, &g->close_cancelled, &g->t_close)) g->refs--;
    if (start_recv_message(call, &g->recv_bb, &g->t_recv)) gen_unref(g);
}

/* ----------------------------------------------------------------- the engine thread */

static size_t idmap_slot(uint64_t id) { return (size_t)(id * 0x9e3779b97f4a7c15ull >> 20); }

static int idmap_put(uint64_t id, sink *g) {
    size_t cap = g_srv.idmap_cap;
    for (size_t i = 0; i < cap; i++) {
        size_t k = (idmap_slot(id) + i) & (cap - 1);
        if (!g_srv.idmap[k]) return g_srv.idmap[k] = g, 0;
    }
    return -1;
}

static sink *idmap_get(uint64_t id) {
    size_t cap = g_srv.idmap_cap;
    for (size_t i = 0; i < cap; i++) {
        size_t k = (idmap_slot(id) + i) & (cap - 1);
        if (!g_srv.idmap[k]) return NULL;
        if (g_srv.idmap[k]->eid == id) return g_srv.idmap[k];
    }
    return NULL;
}

static void idmap_del(uint64_t id) { /* backward-shift deletion */
    size_t cap = g_srv.idmap_cap, k = 0, i;
    for (i = 0; i < cap; i++) {
        k = (idmap_slot(id) + i) & (cap - 1);
        if (!g_srv.idmap[k]) return;
        if (g_srv.idmap[k]->eid == id) break;
    }
    if (i == cap) return;
    g_srv.idmap[k] = NULL;
    for (size_t j = (k + 1) & (cap - 1); g_srv.idmap[j]; j = (j + 1) & (cap - 1)) {
        size_t home = idmap_slot(g_srv.idmap[j]->eid) & (cap - 1);
        /* move j back into the hole at k if its home is not within (k, j] */
        int between = k <= j ? (home > k && home <= j) : (home > k || home <= j);
        if (!between) g_srv.idmap[k] = g_srv.idmap[j], g_srv.idmap[j] = NULL, k = j;
    }
}

static void on_engine_event(void *ctx, const kd_event *ev) {
    (void)ctx;
    sink *k = idmap_get(ev->id);
    if (!k) return;
    if (ev->finish != KD_FINISH_NONE) idmap_del(ev->id);
    k->on_event(k, ev);
}

/* Every request's finish counts, whatever carried it. */
static void count_finish(kd_finish f) {
    static const kd_metric_counter reason[] = {KD_C_REQUESTS_FINISHED_LENGTH, KD_C_REQUESTS_FINISHED_LENGTH,
                                               KD_C_REQUESTS_FINISHED_STOP, KD_C_REQUESTS_FINISHED_ABORT,
                                               KD_C_REQUESTS_FINISHED_ERROR};
    kd_metrics_add(g_srv.metrics, reason[f], 1);
}

static void gen_on_event(sink *k, const kd_event *ev) {
    gen_call *g = (gen_call *)k;
    const double t = now_s();
    pthread_mutex_lock(&g->mu);
    if (ev->n_tokens > 0) {
        if (g->n_toks + ev->n_tokens > g->cap_toks) {
            int32_t cap = (g->n_toks + ev->n_tokens) * 2;
            int32_t *p = realloc(g->toks, (size_t)cap * sizeof *p);
            if (p) g->toks = p, g->cap_toks = cap;
        }
        if (g->n_toks + ev->n_tokens <= g->cap_toks) {
            memcpy(g->toks + g->n_toks, ev->tokens, (size_t)ev->n_tokens * sizeof *g->toks);
            g->n_toks += ev->n_tokens;
        }
        if (g->t_first == 0) {
            g->t_first = t;
            kd_metrics_observe(g_srv.metrics, KD_H_TTFT, t - g->t_arrive);
        } else {
            const double per = (t - g->t_last) / ev->n_tokens;
            for (int32_t i = 0; i < ev->n_tokens; i++) kd_metrics_observe(g_srv.metrics, KD_H_ITL, per);
        }
        g->t_last = t;
        g->generated += ev->n_tokens;
        kd_metrics_add(g_srv.metrics, KD_C_GENERATED_TOKENS, (uint64_t)ev->n_tokens);
    }
    if (ev->finish != KD_FINISH_NONE) {
        g->finish = ev->finish;
        g->usage = ev->usage;
        g->engine_done = 1;
    }
    pthread_mutex_unlock(&g->mu);
    /* the books first, so that a client that sees its last token also sees them */
    pthread_mutex_lock(&g_srv.mu);
    g_srv.tokens_in_flight -= ev->n_tokens;
    if (ev->finish != KD_FINISH_NONE) registry_remove_locked(g);
    pthread_mutex_unlock(&g_srv.mu);
    pthread_mutex_lock(&g->mu);
    gen_maybe_send(g);
    const int over = g->engine_done && !g->send_in_flight && g->broken; /* nothing more will be sent */
    pthread_mutex_unlock(&g->mu);
    if (over) gen_stream_done(g);
    if (ev->finish != KD_FINISH_NONE) {
        count_finish(ev->finish);
        kd_metrics_observe(g_srv.metrics, KD_H_E2E, t - g->t_arrive);
        kd_metrics_observe(g_srv.metrics, KD_H_QUEUE, ev->usage.queue_seconds);
        gen_unref(g); /* the engine's reference */
    }
}

/* Publishes the engine's counters to GetLoads and the metrics after a step. */
static void publish(const kd_engine_stats *prev, const kd_engine_stats *st) {
    pthread_mutex_lock(&g_srv.mu);
    g_srv.snap = *st;
    g_srv.snap.slots_used -= g_srv.n_pool; /* free for whoever comes */
    const int32_t used = g_srv.snap.slots_used, ready = g_srv.n_pool;
    pthread_mutex_unlock(&g_srv.mu);
    kd_metrics *m = g_srv.metrics;
    kd_metrics_set(m, KD_G_HANDOFF_SLOTS_READY, ready);
    kd_metrics_set(m, KD_G_SLOTS_USED, used);
    kd_metrics_set(m, KD_G_SLOTS_TOTAL, st->slots_total);
    kd_metrics_set(m, KD_G_SLOT_UTILISATION, st->slots_total ? (double)used / st->slots_total : 0);
    kd_metrics_set(m, KD_G_RUNNING, used);
    kd_metrics_set(m, KD_G_WAITING, st->waiting);
    kd_metrics_set(m, KD_G_PREFIX_ENTRIES, (double)st->prefix.entries);
    kd_metrics_add(m, KD_C_STEPS, (uint64_t)(st->steps - prev->steps));
    kd_metrics_add(m, KD_C_DRAFTED_TOKENS, (uint64_t)(st->drafted - prev->drafted));
    kd_metrics_add(m, KD_C_ACCEPTED_TOKENS, (uint64_t)(st->accepted - prev->accepted));
    kd_metrics_add(m, KD_C_HELD_TOKENS, (uint64_t)(st->held - prev->held));
    kd_metrics_add(m, KD_C_PREFIX_QUERIES, st->prefix.queries - prev->prefix.queries);
    kd_metrics_add(m, KD_C_PREFIX_HITS, st->prefix.hits - prev->prefix.hits);
    kd_metrics_add(m, KD_C_PREFIX_HIT_TOKENS, st->prefix.hit_tokens - prev->prefix.hit_tokens);
    static int64_t captured, replays; /* the backend's so far (engine thread; 0 on the CPU) */
    int64_t c = 0, r = 0;
    kd_cuda_graph_stats(g_srv.be, &c, &r);
    kd_metrics_add(m, KD_C_GRAPH_CAPTURES, (uint64_t)(c - captured));
    kd_metrics_add(m, KD_C_GRAPH_REPLAYS, (uint64_t)(r - replays));
    captured = c, replays = r;
}

/* Engine thread, g_srv.mu held: gives the handoff pool's slots beyond `keep` back to the
 * engine. Returns whether there were any. */
static int pool_shrink_locked(int keep) {
    const int had = g_srv.n_pool;
    while (g_srv.n_pool > keep) kd_engine_release_slot(g_srv.eng, g_srv.pool[--g_srv.n_pool]);
    return g_srv.n_pool != had;
}

static void run_cmd(cmd *c) {
    kd_err err;
    switch (c->kind) {
    case CMD_SUBMIT: {
        sink *k = c->sink;
        kd_request_params p = *c->params;
        p.id = k->eid;
        kd_submit_status rc = KD_SUBMIT_BUSY;
        if (idmap_put(k->eid, k) == 0) {
            if (c->slot < 0) { /* the handoff pool's slots are free for it (refilled once it runs) */
                pthread_mutex_lock(&g_srv.mu);
                pool_shrink_locked(0);
                pthread_mutex_unlock(&g_srv.mu);
            }
            rc = c->slot >= 0 ? kd_engine_submit_reserved(g_srv.eng, c->slot, &p, &err)
                              : kd_engine_submit(g_srv.eng, &p, &err);
            if (rc != KD_SUBMIT_OK) idmap_del(k->eid);
        } else {
            snprintf(err.msg, sizeof err.msg, "request table full");
        }
        if (rc != KD_SUBMIT_OK) { /* admission counted the places; should not happen */
            logf_("submit-failed", "engine id %llu: %s", (unsigned long long)k->eid, err.msg);
            if (c->slot >= 0) kd_engine_release_slot(g_srv.eng, c->slot);
            kd_event ev = {.id = k->eid, .finish = KD_FINISH_ERROR};
            k->on_event(k, &ev);
        } else {
            kd_metrics_add(g_srv.metrics, KD_C_PROMPT_TOKENS, (uint64_t)p.n_prompt);
            if (c->n_drafts) kd_engine_set_drafts(g_srv.eng, k->eid, c->drafts, c->n_drafts);
        }
        break;
    }
    case CMD_ABORT:
        kd_engine_abort(g_srv.eng, c->id); /* unknown: already finished */
        break;
    case CMD_ABORT_ALL: { /* the ids first: aborting changes the map */
        uint64_t *ids = calloc(g_srv.idmap_cap, sizeof *ids);
        size_t n = 0;
        for (size_t i = 0; ids && i < g_srv.idmap_cap; i++)
            if (g_srv.idmap[i]) ids[n++] = g_srv.idmap[i]->eid;
        for (size_t i = 0; i < n; i++) kd_engine_abort(g_srv.eng, ids[i]);
        free(ids);
        break;
    }
    case CMD_RESERVE: /* the pool may have taken the slot freed since the caller looked */
        pthread_mutex_lock(&g_srv.mu);
        c->result = g_srv.n_pool > 0 ? g_srv.pool[--g_srv.n_pool] : kd_engine_reserve_slot(g_srv.eng);
        pthread_mutex_unlock(&g_srv.mu);
        break;
    case CMD_RELEASE:
        kd_engine_release_slot(g_srv.eng, c->slot);
        break;
    case CMD_WRITE:
        c->result = push_write_cmd(c, &err);
        if (c->result) logf_("handoff-write-failed", "%s", err.msg);
        break;
    case CMD_VERIFY:
        if (c->rx) { /* hashed as the chunks landed */
            c->result = push_verify_cmd(c, &err);
            break;
        }
        c->result = 0;
        for (size_t i = 0; i < c->n_sects; i++) {
            uint64_t h = 0;
            if (kd_backend_state_hash(g_srv.be, c->slot, c->sects[i].offset, c->sects[i].size, &h, &err) ||
                h != c->sects[i].xxh3) {
                c->result = (int)i + 1; /* 1-based index of the first bad section */
                break;
            }
        }
        break;
    }
}

/* Runs a command on the engine thread and waits for it (a completion-queue thread waits at
 * most one engine step). Returns its result. */
static int run_sync(cmd *c) {
    c->sync = 1;
    pthread_mutex_lock(&g_srv.mu);
    enqueue_locked(c);
    while (!c->done) pthread_cond_wait(&g_srv.cv, &g_srv.mu);
    pthread_mutex_unlock(&g_srv.mu);
    return c->result;
}

/* Engine thread: brings the handoff pool to its target (the target while serving, with no
 * request waiting for a slot; else empty, the slots back to the engine). st: the engine's
 * counters as last published (current: every command that changes the queue publishes).
 * Returns whether it changed. */
static int pool_adjust(const kd_engine_stats *st) {
    pthread_mutex_lock(&g_srv.mu);
    g_srv.pool_wake = 0;
    const int want = atomic_load(&g_srv.state) == ST_SERVING && st->waiting == 0 ? g_srv.pool_target : 0;
    int changed = pool_shrink_locked(want);
    while (g_srv.n_pool < want) {
        const int32_t s = kd_engine_reserve_slot(g_srv.eng);
        if (s < 0) break;
        g_srv.pool[g_srv.n_pool++] = s, changed = 1;
    }
    pthread_mutex_unlock(&g_srv.mu);
    return changed;
}

static void *engine_main(void *arg) {
    (void)arg;
    kd_engine_stats prev, st;
    kd_engine_stats_get(g_srv.eng, &prev);
    for (;;) {
        if (pool_adjust(&prev)) {
            kd_engine_stats_get(g_srv.eng, &st);
            publish(&prev, &st);
            prev = st;
        }
        pthread_mutex_lock(&g_srv.mu);
        while (!g_srv.cmd_head && !g_srv.engine_stop && !kd_engine_has_work(g_srv.eng) && !g_srv.pool_wake)
            pthread_cond_wait(&g_srv.cv, &g_srv.mu);
        if (g_srv.engine_stop && !g_srv.cmd_head) {
            pthread_mutex_unlock(&g_srv.mu);
            break;
        }
        cmd *list = g_srv.cmd_head;
        g_srv.cmd_head = g_srv.cmd_tail = NULL;
        pthread_mutex_unlock(&g_srv.mu);
        int64_t written = 0; /* bytes of handoffs written into slots since the last step */
        while (list) {
            if (g_srv.o.handoff_write_budget > 0 && written >= g_srv.o.handoff_write_budget &&
                kd_engine_has_work(g_srv.eng)) { /* the rest after the next step, ahead of what came since */
                cmd *last = list;
                while (last->next) last = last->next;
                pthread_mutex_lock(&g_srv.mu);
                last->next = g_srv.cmd_head;
                if (!g_srv.cmd_head) g_srv.cmd_tail = last;
                g_srv.cmd_head = list;
                pthread_mutex_unlock(&g_srv.mu);
                kd_metrics_add(g_srv.metrics, KD_C_HANDOFF_WRITE_DEFERRALS, 1);
                break;
            }
            cmd *c = list;
            list = c->next;
            if (c->kind == CMD_WRITE) written += (int64_t)c->len;
            run_cmd(c);
            if (c->kind != CMD_WRITE) { /* slots may have changed: GetLoads sees it at once */
                kd_engine_stats_get(g_srv.eng, &st);
                publish(&prev, &st);
                prev = st;
            }
            if (c->sync) {
                pthread_mutex_lock(&g_srv.mu);
                c->done = 1;
                pthread_cond_broadcast(&g_srv.cv);
                pthread_mutex_unlock(&g_srv.mu);
            } else {
                if (c->bb) grpc_byte_buffer_destroy(c->bb);
                free(c->data);
                free(c);
            }
        }
        if (kd_engine_has_work(g_srv.eng)) {
            kd_err err;
            const double t0 = now_s();
            int rc = kd_engine_step(g_srv.eng, &err);
            if (rc < 0) logf_("step-failed", "%s", err.msg);
            else if (rc > 0) kd_metrics_observe(g_srv.metrics, KD_H_STEP, now_s() - t0);
            kd_engine_stats_get(g_srv.eng, &st);
            publish(&prev, &st);
            prev = st;
        }
    }
    return NULL;
}

/* -------------------------------------------------------------------- Health.Watch */

struct watch_call {
    tag t_send, t_close, t_recv;
    grpc_call *call;
    char service[256];
    grpc_byte_buffer *recv_bb, *send_bb;
    int refs, sending, last_sent, dirty, closed, md_sent;
    int cancelled;
    watch_call *next;
};

static void watch_unref_locked(watch_call *w) { /* g_srv.mu held */
    if (--w->refs) return;
    for (watch_call **p = &g_srv.watchers; *p; p = &(*p)->next)
        if (*p == w) {
            *p = w->next;
            break;
        }
    if (w->send_bb) grpc_byte_buffer_destroy(w->send_bb);
    if (w->recv_bb) grpc_byte_buffer_destroy(w->recv_bb);
    grpc_call_unref(w->call);
    free(w);
    g_srv.n_calls--;
    pthread_cond_broadcast(&g_srv.cv);
}

static void watch_send_locked(watch_call *w) {
    if (w->sending || w->closed) return;
    int st = health_status(w->service);
    if (st < 0) st = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVICE_UNKNOWN;
    if (w->md_sent && st == w->last_sent) return;
    Grpc__Health__V1__HealthCheckResponse r = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
    r.status = (Grpc__Health__V1__HealthCheckResponse__ServingStatus)st;
    if (!(w->send_bb = pack_bb(&r.base))) return;
    grpc_op ops[2];
    memset(ops, 0, sizeof ops);
    size_t n = 0;
    if (!w->md_sent) ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[n].op = GRPC_OP_SEND_MESSAGE;
    ops[n++].data.send_message.send_message = w->send_bb;
    w->md_sent = 1;
    w->last_sent = st;
    w->sending = 1;
    w->refs++;
    if (grpc_call_start_batch(w->call, ops, n, &w->t_send, NULL) != GRPC_CALL_OK) w->sending = 0, w->refs--;
}

static void watch_send_done(void *obj, int ok) {
    watch_call *w = obj;
    pthread_mutex_lock(&g_srv.mu);
    w->sending = 0;
    grpc_byte_buffer_destroy(w->send_bb);
    w->send_bb = NULL;
    if (!ok) w->closed = 1;
    watch_send_locked(w); /* a change while this one was in flight */
    watch_unref_locked(w);
    pthread_mutex_unlock(&g_srv.mu);
}

static void watch_close_done(void *obj, int ok) {
    (void)ok;
    watch_call *w = obj;
    pthread_mutex_lock(&g_srv.mu);
    w->closed = 1;
    watch_unref_locked(w);
    pthread_mutex_unlock(&g_srv.mu);
}

static void watch_recv_done(void *obj, int ok) {
    watch_call *w = obj;
    pthread_mutex_lock(&g_srv.mu);
    if (ok && w->recv_bb) {
        grpc_slice s;
        if (!read_bb(w->recv_bb, &s)) {
            char why[160] = "cannot parse HealthCheckRequest";
            const int nul = kd_api_string_has_nul(&grpc__health__v1__health_check_request__descriptor,
                                                  GRPC_SLICE_START_PTR(s), GRPC_SLICE_LENGTH(s), why, sizeof why);
            Grpc__Health__V1__HealthCheckRequest *q =
                nul ? NULL
                    : grpc__health__v1__health_check_request__unpack(NULL, GRPC_SLICE_LENGTH(s), GRPC_SLICE_START_PTR(s));
            if (q) {
                snprintf(w->service, sizeof w->service, "%s", q->service);
                grpc__health__v1__health_check_request__free_unpacked(q, NULL);
                watch_send_locked(w);
            } else {
                grpc_call_cancel_with_status(w->call, GRPC_STATUS_INVALID_ARGUMENT, why, NULL);
            }
            grpc_slice_unref(s);
        }
    } else if (ok) {
        grpc_call_cancel_with_status(w->call, GRPC_STATUS_INVALID_ARGUMENT, "missing request message", NULL);
    }
    watch_unref_locked(w);
    pthread_mutex_unlock(&g_srv.mu);
}

static void watch_start(grpc_call *call) {
    watch_call *w = calloc(1, sizeof *w);
    if (!w) {
        grpc_call_cancel(call, NULL);
        grpc_call_unref(call);
        return;
    }
    w->call = call;
    w->t_send = (tag){watch_send_done, w};
    w->t_close = (tag){watch_close_done, w};
    w->t_recv = (tag){watch_recv_done, w};
    pthread_mutex_lock(&g_srv.mu);
    g_srv.n_calls++;
    w->next = g_srv.watchers;
    g_srv.watchers = w;
    w->refs = 3; /* close, recv, and ours until both batches are started */
    if (start_recv_close(call, &w->cancelled, &w->t_close)) w->refs--;
    if (start_recv_message(call, &w->recv_bb, &w->t_recv)) w->refs--;
    watch_unref_locked(w);
    pthread_mutex_unlock(&g_srv.mu);
}

static void set_state(int st) {
    atomic_store(&g_srv.state, st);
    kd_metrics_set(g_srv.metrics, KD_G_READY, st == ST_SERVING);
    kd_metrics_set(g_srv.metrics, KD_G_DRAINING, st >= ST_DRAINING);
    pthread_mutex_lock(&g_srv.mu);
    for (watch_call *w = g_srv.watchers; w; w = w->next) watch_send_locked(w);
    g_srv.pool_wake = 1; /* serving: fill the handoff pool; else empty it */
    pthread_cond_broadcast(&g_srv.cv);
    pthread_mutex_unlock(&g_srv.mu);
}

/* --------------------------------------------------------------- server reflection */

typedef struct refl_call {
    tag t;
    grpc_call *call;
    grpc_byte_buffer *recv_bb, *send_bb;
    int stage; /* 0: receiving, 1: sending */
    int md_sent, cancelled;
    grpc_slice details;
} refl_call;

static int sym_cmp(const void *key, const void *el) {
    return strcmp((const char *)key, ((const kd_refl_symbol *)el)->name);
}

static int file_by_name(const char *name) {
    for (int i = 0; i < kd_refl_n_files; i++)
        if (!strcmp(kd_refl_files[i].name, name)) return i;
    return -1;
}

/* The file and its transitive dependencies, the file first. */
static int collect_files(int f, int *out, int n) {
    for (int i = 0; i < n; i++)
        if (out[i] == f) return n;
    out[n++] = f;
    for (int d = 0; d < kd_refl_files[f].n_deps; d++) n = collect_files(kd_refl_files[f].deps[d], out, n);
    return n;
}

static grpc_byte_buffer *refl_answer(const uint8_t *data, size_t len) {
    char why[160] = "cannot parse ServerReflectionRequest";
    const int nul =
        kd_api_string_has_nul(&grpc__reflection__v1__server_reflection_request__descriptor, data, len, why, sizeof why);
    Grpc__Reflection__V1__ServerReflectionRequest *q =
        nul ? NULL : grpc__reflection__v1__server_reflection_request__unpack(NULL, len, data);
    Grpc__Reflection__V1__ServerReflectionResponse r = GRPC__REFLECTION__V1__SERVER_REFLECTION_RESPONSE__INIT;
    Grpc__Reflection__V1__ListServiceResponse ls = GRPC__REFLECTION__V1__LIST_SERVICE_RESPONSE__INIT;
    Grpc__Reflection__V1__ServiceResponse svc[16], *svcp[16];
    Grpc__Reflection__V1__FileDescriptorResponse fdr = GRPC__REFLECTION__V1__FILE_DESCRIPTOR_RESPONSE__INIT;
    Grpc__Reflection__V1__ErrorResponse er = GRPC__REFLECTION__V1__ERROR_RESPONSE__INIT;
    ProtobufCBinaryData files[16];
    int idx[16];
    if (!q) {
        er.error_code = GRPC_STATUS_INVALID_ARGUMENT;
        er.error_message = why;
        r.message_response_case = GRPC__REFLECTION__V1__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_ERROR_RESPONSE;
        r.error_response = &er;
        return pack_bb(&r.base);
    }
    r.valid_host = q->host;
    r.original_request = q;
    int file = -1;
    const char *missing = NULL;
    switch (q->message_request_case) {
    case GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_LIST_SERVICES: {
        int n = kd_refl_n_services < 16 ? kd_refl_n_services : 16;
        for (int i = 0; i < n; i++) {
            grpc__reflection__v1__service_response__init(&svc[i]);
            svc[i].name = (char *)kd_refl_services[i];
            svcp[i] = &svc[i];
        }
        ls.n_service = (size_t)n;
        ls.service = svcp;
        r.message_response_case = GRPC__REFLECTION__V1__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_LIST_SERVICES_RESPONSE;
        r.list_services_response = &ls;
        break;
    }
    case GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_FILE_BY_FILENAME:
        file = file_by_name(q->file_by_filename);
        if (file < 0) missing = "file not found";
        break;
    case GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_FILE_CONTAINING_SYMBOL: {
        const char *sym = q->file_containing_symbol[0] == '.' ? q->file_containing_symbol + 1 : q->file_containing_symbol;
        const kd_refl_symbol *s = bsearch(sym, kd_refl_symbols, (size_t)kd_refl_n_symbols, sizeof *kd_refl_symbols, sym_cmp);
        if (s) file = s->file;
        else missing = "symbol not found";
        break;
    }
    default:
        missing = "extensions are not used by this server";
        break;
    }
    if (file >= 0) {
        int n = collect_files(file, idx, 0);
        for (int i = 0; i < n; i++) {
            files[i].data = (uint8_t *)kd_refl_files[idx[i]].bytes;
            files[i].len = kd_refl_files[idx[i]].len;
        }
        fdr.n_file_descriptor_proto = (size_t)n;
        fdr.file_descriptor_proto = files;
        r.message_response_case = GRPC__REFLECTION__V1__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_FILE_DESCRIPTOR_RESPONSE;
        r.file_descriptor_response = &fdr;
    } else if (missing) {
        er.error_code = GRPC_STATUS_NOT_FOUND;
        er.error_message = (char *)missing;
        r.message_response_case = GRPC__REFLECTION__V1__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_ERROR_RESPONSE;
        r.error_response = &er;
    }
    grpc_byte_buffer *bb = pack_bb(&r.base);
    grpc__reflection__v1__server_reflection_request__free_unpacked(q, NULL);
    return bb;
}

static void refl_step(void *obj, int ok);

static void refl_free(refl_call *c) {
    if (c->recv_bb) grpc_byte_buffer_destroy(c->recv_bb);
    if (c->send_bb) grpc_byte_buffer_destroy(c->send_bb);
    grpc_slice_unref(c->details);
    grpc_call_unref(c->call);
    free(c);
    call_ref_count(-1);
}

static void refl_recv(refl_call *c) {
    grpc_op ops[2];
    memset(ops, 0, sizeof ops);
    size_t n = 0;
    if (!c->md_sent) ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA, c->md_sent = 1;
    ops[n].op = GRPC_OP_RECV_MESSAGE;
    ops[n++].data.recv_message.recv_message = &c->recv_bb;
    c->stage = 0;
    if (grpc_call_start_batch(c->call, ops, n, &c->t, NULL) != GRPC_CALL_OK) refl_free(c);
}

/* The v1 and v1alpha messages are the same on the wire; one handler serves both. */
static void refl_step(void *obj, int ok) {
    refl_call *c = obj;
    if (c->stage == 2 || !ok) { /* the status went out, or the call broke */
        refl_free(c);
        return;
    }
    if (c->stage == 1) { /* a response went out: wait for the next request */
        grpc_byte_buffer_destroy(c->send_bb);
        c->send_bb = NULL;
        refl_recv(c);
        return;
    }
    grpc_op ops[3];
    memset(ops, 0, sizeof ops);
    if (!c->recv_bb) { /* the client half-closed: finish with OK */
        c->stage = 2;
        ops[0].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
        ops[0].data.send_status_from_server.status = GRPC_STATUS_OK;
        ops[0].data.send_status_from_server.status_details = &c->details;
        ops[1].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
        ops[1].data.recv_close_on_server.cancelled = &c->cancelled;
        if (grpc_call_start_batch(c->call, ops, 2, &c->t, NULL) != GRPC_CALL_OK) refl_free(c);
        return;
    }
    grpc_slice s;
    int bad = read_bb(c->recv_bb, &s);
    grpc_byte_buffer_destroy(c->recv_bb);
    c->recv_bb = NULL;
    if (bad) {
        refl_free(c);
        return;
    }
    c->send_bb = refl_answer(GRPC_SLICE_START_PTR(s), GRPC_SLICE_LENGTH(s));
    grpc_slice_unref(s);
    if (!c->send_bb) {
        refl_free(c);
        return;
    }
    c->stage = 1;
    ops[0].op = GRPC_OP_SEND_MESSAGE;
    ops[0].data.send_message.send_message = c->send_bb;
    if (grpc_call_start_batch(c->call, ops, 1, &c->t, NULL) != GRPC_CALL_OK) refl_free(c);
}

static void refl_start(grpc_call *call) {
    refl_call *c = calloc(1, sizeof *c);
    if (!c) {
        grpc_call_cancel(call, NULL);
        grpc_call_unref(call);
        return;
    }
    call_ref_count(1);
    c->t = (tag){refl_step, c};
    c->call = call;
    c->details = grpc_empty_slice();
    refl_recv(c);
}

/* -------------------------------------------------------------- the state handoff */

#define KD_HANDOFF_CHUNK (1u << 20)

typedef struct push_call push_call;

struct handoff {
    char id[KD_REQUEST_ID_MAX + 1];
    int32_t slot;
    int ready;                    /* all bytes in and verified: claimable */
    double expires;
    int32_t *prompt;              /* prompt then the first token */
    int64_t n_prompt;             /* including the first token */
    push_call *push;              /* while receiving */
    handoff *next;
};

/* The worker's own layout, as a handoff header must describe it. */
typedef struct layout_desc {
    char fingerprint[96];
    size_t n;
    char (*names)[48];
    int64_t (*shapes)[3];
    int *nd;                     /* dims of each section */
    sect *sects;                 /* offset and size (xxh3 unused) */
    uint64_t total;
} layout_desc;

static layout_desc g_layout;

static const char *layout_fingerprint(void) { return g_layout.fingerprint; }

static int layout_init(void) {
    const kd_config *c = &g_srv.model->config;
    const kd_state_layout *l = &g_srv.be->layout;
    const int conv = l->conv_elems > 0;
    g_layout.n = (size_t)c->n_layers * (conv ? 2 : 1);
    g_layout.names = calloc(g_layout.n, sizeof *g_layout.names);
    g_layout.shapes = calloc(g_layout.n, sizeof *g_layout.shapes);
    g_layout.sects = calloc(g_layout.n, sizeof *g_layout.sects);
    g_layout.nd = calloc(g_layout.n, sizeof *g_layout.nd);
    if (!g_layout.names || !g_layout.shapes || !g_layout.sects || !g_layout.nd) return -1;
    const size_t es = kd_dtype_size(g_srv.be->state_dtype);
    size_t k = 0;
    for (int32_t i = 0; i < c->n_layers; i++) {
        const uint64_t base = (uint64_t)i * (uint64_t)l->layer_elems * es;
        snprintf(g_layout.names[k], sizeof g_layout.names[k], "layers.%d.ssm", i);
        g_layout.shapes[k][0] = c->n_v_heads, g_layout.shapes[k][1] = c->head_k, g_layout.shapes[k][2] = c->head_v;
        g_layout.nd[k] = 3;
        g_layout.sects[k++] = (sect){base, (uint64_t)l->ssm_elems * es, 0};
        if (conv) {
            snprintf(g_layout.names[k], sizeof g_layout.names[k], "layers.%d.conv", i);
            g_layout.shapes[k][0] = 2 * kd_config_qk_dim(c) + kd_config_v_dim(c);
            g_layout.shapes[k][1] = c->conv_size - 1;
            g_layout.nd[k] = 2;
            g_layout.sects[k++] = (sect){base + (uint64_t)l->ssm_elems * es, (uint64_t)l->conv_elems * es, 0};
        }
    }
    g_layout.total = kd_backend_state_bytes(g_srv.be);
    snprintf(g_layout.fingerprint, sizeof g_layout.fingerprint, "%016" PRIx64 "/layout-v1/state-%s",
             g_srv.model->fingerprint, kd_dtype_name(g_srv.be->state_dtype));
    return 0;
}

static void layout_free(void) {
    free(g_layout.names), free(g_layout.shapes), free(g_layout.sects), free(g_layout.nd);
    memset(&g_layout, 0, sizeof g_layout);
}

static handoff *handoff_find_locked(const char *id) {
    for (handoff *h = g_srv.handoffs; h; h = h->next)
        if (!strcmp(h->id, id)) return h;
    return NULL;
}

static void handoff_unlink_locked(handoff *h) {
    for (handoff **p = &g_srv.handoffs; *p; p = &(*p)->next)
        if (*p == h) {
            *p = h->next;
            g_srv.n_handoffs--;
            break;
        }
    kd_metrics_set(g_srv.metrics, KD_G_HANDOFFS_PENDING, g_srv.n_handoffs);
}

/* Drops a handoff and frees its slot (async on the engine thread). g_srv.mu held. */
static void handoff_drop_locked(handoff *h, const char *why) {
    handoff_unlink_locked(h);
    cmd *c = calloc(1, sizeof *c);
    if (c) {
        c->kind = CMD_RELEASE, c->slot = h->slot;
        enqueue_locked(c);
    }
    logf_("handoff-dropped", "id=%s slot=%d: %s", h->id, h->slot, why);
    free(h->prompt);
    free(h);
}

/* Expired leases: called by the main thread every few tens of ms. */
static void handoff_expire(void) {
    const double t = now_s();
    pthread_mutex_lock(&g_srv.mu);
    for (handoff *h = g_srv.handoffs, *next; h; h = next) {
        next = h->next;
        if (h->ready && h->expires < t) {
            kd_metrics_add(g_srv.metrics, KD_C_HANDOFF_FAILURES, 1);
            handoff_drop_locked(h, "lease expired");
        }
    }
    pthread_mutex_unlock(&g_srv.mu);
}

/* Validates a header against this worker. On success *h is a new receiving handoff with a
 * reserved slot. Returns a status code and message. */
static int handoff_begin(const Kdecode__V1__HandoffHeader *hd, handoff **out, char *msg, size_t len, long *pushback) {
    if (hd->version != KDECODE__V1__HANDOFF_VERSION__HANDOFF_VERSION_1)
        return snprintf(msg, len, "handoff version %d is not supported (this worker: 1)", (int)hd->version),
               KD_STATUS_FAILED_PRECONDITION;
    if (strcmp(hd->model_fingerprint, g_layout.fingerprint))
        return snprintf(msg, len, "model fingerprint '%.100s' differs from this worker's '%s'", hd->model_fingerprint,
                        g_layout.fingerprint), KD_STATUS_FAILED_PRECONDITION;
    if (!kd_api_valid_request_id(hd->request_id))
        return snprintf(msg, len, "request_id must be 1..%d printable ASCII characters", KD_REQUEST_ID_MAX),
               KD_STATUS_INVALID_ARGUMENT;
    const Kdecode__V1__StateLayout *ly = hd->layout;
    if (!ly || ly->version != KDECODE__V1__HANDOFF_VERSION__HANDOFF_VERSION_1 || ly->total_bytes != g_layout.total ||
        ly->n_sections != g_layout.n)
        return snprintf(msg, len, "state layout does not match this worker's (%zu sections, %" PRIu64 " bytes)", g_layout.n,
                        g_layout.total), KD_STATUS_INVALID_ARGUMENT;
    for (size_t i = 0; i < g_layout.n; i++) {
        const Kdecode__V1__StateSection *se = ly->sections[i];
        const int nd = g_layout.nd[i];
        int same = !strcmp(se->name, g_layout.names[i]) && !strcmp(se->dtype, kd_dtype_name(g_srv.be->state_dtype)) &&
                   se->offset == g_layout.sects[i].offset && se->size == g_layout.sects[i].size &&
                   se->n_shape == (size_t)nd;
        for (int d = 0; same && d < nd; d++) same = se->shape[d] == g_layout.shapes[i][d];
        if (!same)
            return snprintf(msg, len, "state section %zu ('%.60s') does not match this worker's '%s'", i, se->name,
                            g_layout.names[i]), KD_STATUS_INVALID_ARGUMENT;
    }
    const size_t np = hd->n_prompt_token_ids;
    if (np < 1 || (int64_t)np >= g_srv.o.eng.max_model_len)
        return snprintf(msg, len, "prompt of %zu tokens outside [1, %lld)", np, (long long)g_srv.o.eng.max_model_len),
               KD_STATUS_INVALID_ARGUMENT;
    for (size_t i = 0; i <= np; i++) {
        const int32_t t = i < np ? hd->prompt_token_ids[i] : hd->first_token;
        if (t < 0 || t >= g_srv.lim.vocab)
            return snprintf(msg, len, "%s token %d is outside the vocabulary", i < np ? "prompt" : "first", t),
                   KD_STATUS_INVALID_ARGUMENT;
    }
    if (atomic_load(&g_srv.state) != ST_SERVING)
        return snprintf(msg, len, "the worker is not serving"), KD_STATUS_UNAVAILABLE;
    handoff *h = calloc(1, sizeof *h);
    if (h) h->prompt = malloc((np + 1) * sizeof *h->prompt);
    if (!h || !h->prompt) {
        if (h) free(h);
        return snprintf(msg, len, "out of memory"), KD_STATUS_INTERNAL;
    }
    memcpy(h->prompt, hd->prompt_token_ids, np * sizeof *h->prompt);
    h->prompt[np] = hd->first_token;
    h->n_prompt = (int64_t)np + 1;
    snprintf(h->id, sizeof h->id, "%s", hd->request_id);
    pthread_mutex_lock(&g_srv.mu);
    const int dup = handoff_find_locked(h->id) || registry_find(h->id);
    pthread_mutex_unlock(&g_srv.mu);
    if (dup) {
        free(h->prompt), free(h);
        return snprintf(msg, len, "a handoff or live request already has id '%s'", hd->request_id),
               KD_STATUS_ALREADY_EXISTS;
    }
    cmd *c = calloc(1, sizeof *c);
    if (!c) {
        free(h->prompt), free(h);
        return snprintf(msg, len, "out of memory"), KD_STATUS_INTERNAL;
    }
    pthread_mutex_lock(&g_srv.mu);
    h->slot = g_srv.n_pool > 0 ? g_srv.pool[--g_srv.n_pool] : -1;
    if (h->slot >= 0) { /* counted as used from now on (GetLoads); the engine thread refills */
        g_srv.snap.slots_used++;
        g_srv.pool_wake = 1;
        pthread_cond_broadcast(&g_srv.cv);
    }
    pthread_mutex_unlock(&g_srv.mu);
    if (h->slot < 0) { /* none ready (or the worker keeps none): the engine thread reserves one */
        c->kind = CMD_RESERVE;
        h->slot = run_sync(c);
    }
    free(c);
    if (h->slot < 0) {
        free(h->prompt), free(h);
        *pushback = g_srv.o.retry_pushback_ms;
        kd_metrics_add(g_srv.metrics, KD_C_REJECTED_BUSY, 1);
        return snprintf(msg, len, "no free slot for a handoff; retry later"), KD_STATUS_RESOURCE_EXHAUSTED;
    }
    pthread_mutex_lock(&g_srv.mu);
    int raced = handoff_find_locked(h->id) || registry_find(h->id);
    if (!raced) {
        h->next = g_srv.handoffs;
        g_srv.handoffs = h;
        g_srv.n_handoffs++;
        kd_metrics_set(g_srv.metrics, KD_G_HANDOFFS_PENDING, g_srv.n_handoffs);
    } else {
        handoff_drop_locked(h, "duplicate id");
    }
    pthread_mutex_unlock(&g_srv.mu);
    if (raced) return snprintf(msg, len, "a handoff already has this id"), KD_STATUS_ALREADY_EXISTS;
    *out = h;
    return KD_STATUS_OK;
}

/* The decode side's checksums of a push, kept by the engine thread as the chunks land: each
 * piece is written into the slot, then read back from the slot into its section's streaming
 * XXH3 while it is still in cache, so the final check needs no second pass over the state and
 * still covers what landed in the slot, not what was received. Only the engine thread touches
 * it (the writes are queued in order, the final check is a synchronous command after them);
 * a command queued after the call's last write frees it. The prefill side keeps one too, over
 * the bytes it sends (push_rx_hash). */
typedef struct push_rx {
    XXH3_state_t st;              /* section `sect` so far (first: its 64-byte alignment) */
    size_t sect;                  /* sections [0, sect) are complete, their digests in got */
    uint64_t at;                  /* the next byte: writes are contiguous from 0 */
    int failed;                   /* a write or hash failed, or a write out of order */
    uint64_t got[];
} push_rx;

/* written, then hashed back from the slot while it is still in L2 */
#define KD_HASH_PIECE ((size_t)64 << 10)

static push_rx *push_rx_new(void) {
    const size_t bytes = (sizeof(push_rx) + g_layout.n * sizeof(uint64_t) + 63) & ~(size_t)63;
    push_rx *rx = aligned_alloc(64, bytes);
    if (!rx) return NULL;
    memset(rx, 0, bytes);
    XXH3_64bits_reset(&rx->st);
    return rx;
}

/* Closes the sections that end at or before rx->at (every byte of them was fed). */
static void push_rx_close(push_rx *rx) {
    while (rx->sect < g_layout.n && rx->at >= g_layout.sects[rx->sect].offset + g_layout.sects[rx->sect].size) {
        rx->got[rx->sect++] = XXH3_64bits_digest(&rx->st);
        XXH3_64bits_reset(&rx->st);
    }
}

/* The next piece of the payload from rx->at: at most n bytes, inside one section or one gap
 * before a section (*hashed: whether it is a section's). Closes the sections before it. */
static size_t push_rx_piece(push_rx *rx, size_t n, int *hashed) {
    push_rx_close(rx);
    const uint64_t off = rx->at;
    *hashed = 0;
    if (rx->sect < g_layout.n) {
        const sect *se = &g_layout.sects[rx->sect];
        if (off < se->offset) { /* a gap before the section: not covered by a checksum */
            if (n > se->offset - off) n = (size_t)(se->offset - off);
        } else {
            if (n > se->offset + se->size - off) n = (size_t)(se->offset + se->size - off);
            *hashed = 1;
        }
    }
    return n;
}

/* The sender's side: feeds the next len bytes of the payload (in order from byte 0) to their
 * sections' checksums. */
static void push_rx_hash(push_rx *rx, const uint8_t *src, size_t len) {
    while (len) {
        int hashed;
        const size_t n = push_rx_piece(rx, len, &hashed);
        if (hashed) (void)XXH3_64bits_update(&rx->st, src, n);
        src += n, len -= n, rx->at += n;
    }
    push_rx_close(rx);
}

/* Writes bytes [off, off + len) of a pushed state into the slot and, with rx, feeds them as
 * they now are in the slot to their sections' checksums. Engine thread. */
static int push_rx_write(int32_t slot, push_rx *rx, uint64_t off, const uint8_t *src, size_t len, kd_err *err) {
    if (!rx) return kd_backend_state_write_part(g_srv.be, slot, off, src, len, err);
    if (rx->failed) return 0; /* logged once; the final check refuses the state */
    if (off != rx->at) {
        rx->failed = 1;
        return kd_fail(err, "handoff write at %" PRIu64 ", expected %" PRIu64, off, rx->at);
    }
    while (len) {
        int hashed;
        const size_t n = push_rx_piece(rx, len < KD_HASH_PIECE ? len : KD_HASH_PIECE, &hashed);
        if (kd_backend_state_write_part(g_srv.be, slot, off, src, n, err) ||
            (hashed && kd_backend_state_hash_update(g_srv.be, slot, off, n, &rx->st, err))) {
            rx->failed = 1;
            return -1;
        }
        off += n, src += n, len -= n;
        rx->at = off;
    }
    push_rx_close(rx);
    return 0;
}

/* CMD_WRITE: the bytes from src, or from the message's slices after its first skip bytes. */
static int push_write_cmd(const cmd *c, kd_err *err) {
    if (!c->bb) return c->len ? push_rx_write(c->slot, c->rx, c->offset, c->src, c->len, err) : 0;
    const grpc_slice_buffer *sb = &c->bb->data.raw.slice_buffer;
    size_t skip = c->skip, left = c->len;
    uint64_t off = c->offset;
    for (size_t i = 0; i < sb->count && left; i++) {
        const uint8_t *d = GRPC_SLICE_START_PTR(sb->slices[i]);
        size_t n = GRPC_SLICE_LENGTH(sb->slices[i]);
        if (skip >= n) {
            skip -= n;
            continue;
        }
        d += skip, n -= skip, skip = 0;
        if (n > left) n = left;
        if (push_rx_write(c->slot, c->rx, off, d, n, err)) return -1;
        off += n, left -= n;
    }
    if (left) {
        if (c->rx) c->rx->failed = 1;
        return kd_fail(err, "handoff chunk: %zu bytes missing", left);
    }
    return 0;
}

/* CMD_VERIFY with rx: every byte written, every section hashed, each digest as announced.
 * 0, the 1-based index of the first bad section, or -2 if the state could not be written. */
static int push_verify_cmd(const cmd *c, kd_err *err) {
    const push_rx *rx = c->rx;
    if (rx->failed || rx->at != g_layout.total || rx->sect != c->n_sects)
        return kd_fail(err, "the state was not written whole into the slot"), -2;
    for (size_t i = 0; i < c->n_sects; i++)
        if (rx->got[i] != c->sects[i].xxh3) return (int)i + 1;
    return 0;
}

/* PushState: header, chunks, end; one call object, its batches one after another. */
struct push_call {
    tag t_recv, t_close;
    grpc_call *call;
    pthread_mutex_t mu;
    int refs;
    grpc_byte_buffer *recv_bb;
    int close_cancelled, finished;
    handoff *h;
    sect *sects;                  /* the header's checksums (or the trailer's) */
    int trailer;                  /* the header announced a HandoffTrailer with the checksums */
    push_rx *rx;                  /* the engine thread's (NULL: a backend without incremental hashing) */
    cmd *rx_free;                 /* queued at the end to free rx after the last write */
    uint64_t received;
    double t0;
    int nccl;                     /* the state comes over NCCL, straight into the slot */
    kd_nccl_job *job;             /* the NCCL receive, until its completion (under mu) */
    kd_dev_region *regs;          /* the slot's device regions, one per section */
    double t_posted, t_landed;    /* NCCL: receive posted, data landed */
    double t_gpu;                 /* NCCL: the receive's time on the GPU (-1: unknown) */
};

static void push_unref(push_call *p) {
    pthread_mutex_lock(&p->mu);
    int left = --p->refs;
    pthread_mutex_unlock(&p->mu);
    if (left) return;
    if (p->recv_bb) grpc_byte_buffer_destroy(p->recv_bb);
    free(p->regs);
    if (p->rx) { /* after the writes still queued: a no-op write that frees it */
        p->rx_free->kind = CMD_WRITE, p->rx_free->data = (uint8_t *)p->rx;
        pthread_mutex_lock(&g_srv.mu);
        enqueue_locked(p->rx_free);
        pthread_mutex_unlock(&g_srv.mu);
    } else {
        free(p->rx_free);
    }
    free(p->sects);
    grpc_call_unref(p->call);
    pthread_mutex_destroy(&p->mu);
    free(p);
    call_ref_count(-1);
}

/* Ends the push with a status; drops the handoff unless it became claimable. */
static void push_finish(push_call *p, int code, const char *msg, long pushback, grpc_byte_buffer *reply) {
    /* an NCCL receive still running may write into the slot: stop it first; its completion
     * then drops the handoff */
    const int running = code != KD_STATUS_OK && push_nccl_cancel(p);
    /* counted before the drop's log line: whoever reads that line finds the count */
    if (code != KD_STATUS_OK) kd_metrics_add(g_srv.metrics, KD_C_HANDOFF_FAILURES, 1);
    pthread_mutex_lock(&g_srv.mu);
    if (p->h && !running) {
        p->h->push = NULL;
        if (code != KD_STATUS_OK) handoff_drop_locked(p->h, msg);
        p->h = NULL;
    }
    pthread_mutex_unlock(&g_srv.mu);
    p->finished = 1;
    grpc_call_ref(p->call);
    if (!reply) {
        reply_status_ex(p->call, 0, 0, (grpc_status_code)code, msg, pushback);
        return;
    }
    reply_message(p->call, reply, 0, 0);
}

static void push_recv_next(push_call *p) {
    pthread_mutex_lock(&p->mu);
    p->refs++;
    pthread_mutex_unlock(&p->mu);
    if (start_recv_message(p->call, &p->recv_bb, &p->t_recv)) push_unref(p);
}

/* A chunk message as the sender writes it: field 2 (bytes) and nothing else. From the first
 * bytes d[0, have) of a message of len bytes: 1 with the payload's offset and length. */
static int push_chunk_prefix(const uint8_t *d, size_t have, size_t len, size_t *skip, uint64_t *n) {
    if (have < 2 || d[0] != ((2 << 3) | 2)) return 0;
    uint64_t v = 0;
    for (size_t k = 1; k < have && k <= 10; k++) {
        v |= (uint64_t)(d[k] & 0x7f) << (7 * (k - 1));
        if (!(d[k] & 0x80)) {
            *skip = k + 1, *n = v;
            return v == len - (k + 1);
        }
    }
    return 0;
}

/* Queues the write of n chunk bytes (from src, or from bb after skip bytes) at p->received. */
static int push_queue_write(push_call *p, grpc_byte_buffer *bb, size_t skip, uint8_t *data, uint64_t n, char *msg,
                            size_t msglen) {
    if (n > KD_HANDOFF_CHUNK || n > g_layout.total - p->received) {
        snprintf(msg, msglen, "chunk of %" PRIu64 " bytes at %" PRIu64 ": chunks are at most 1 MiB and end at %" PRIu64,
                 n, p->received, g_layout.total);
        return KD_STATUS_INVALID_ARGUMENT;
    }
    cmd *c = n ? calloc(1, sizeof *c) : NULL;
    if (n && !c) {
        snprintf(msg, msglen, "out of memory");
        return KD_STATUS_INTERNAL;
    }
    if (!n) {
        if (bb) grpc_byte_buffer_destroy(bb);
        free(data);
        return KD_STATUS_OK;
    }
    /* into the slot, in order, by the engine thread */
    c->kind = CMD_WRITE, c->slot = p->h->slot, c->offset = p->received, c->len = (size_t)n, c->rx = p->rx;
    c->bb = bb, c->skip = skip, c->data = data, c->src = data;
    p->received += n;
    pthread_mutex_lock(&g_srv.mu);
    enqueue_locked(c);
    pthread_mutex_unlock(&g_srv.mu);
    return KD_STATUS_OK;
}

/* Every byte is in: checks the slot's sections against p->sects and answers (the state
 * becomes claimable) or refuses (DATA_LOSS; the slot is freed). */
static void push_verify_finish(push_call *p) {
    char msg[160];
    cmd *c = calloc(1, sizeof *c);
    int bad = -1;
    if (c) {
        c->kind = CMD_VERIFY, c->slot = p->h->slot, c->sects = p->sects, c->n_sects = g_layout.n;
        c->rx = p->rx;
        bad = run_sync(c);
        free(c);
    }
    if (!bad) {
        push_ready(p, "");
        return;
    }
    if (bad > 0) snprintf(msg, sizeof msg, "checksum mismatch in state section %s", g_layout.names[bad - 1]);
    else snprintf(msg, sizeof msg, "%s", bad == -2 ? "the state could not be written into the slot" : "out of memory");
    push_finish(p, bad > 0 ? KD_STATUS_DATA_LOSS : KD_STATUS_INTERNAL, msg, -1, NULL);
}

static void push_recv_done(void *obj, int ok) {
    push_call *p = obj;
    grpc_byte_buffer *bb = p->recv_bb;
    p->recv_bb = NULL;
    char msg[512] = "";
    long pushback = -1;
    if (!ok || p->finished) { /* the stream broke: the prefill side is gone */
        if (bb) grpc_byte_buffer_destroy(bb);
        if (push_nccl_cancel(p)) { /* a receive was running: its completion drops the handoff */
            push_unref(p);
            return;
        }
        pthread_mutex_lock(&g_srv.mu);
        if (p->h) {
            p->h->push = NULL;
            kd_metrics_add(g_srv.metrics, KD_C_HANDOFF_FAILURES, 1); /* before the drop's log line */
            handoff_drop_locked(p->h, "stream broken");
            p->h = NULL;
        }
        pthread_mutex_unlock(&g_srv.mu);
        push_unref(p);
        return;
    }
    if (!bb) { /* end of stream: complete? verified? */
        if (p->nccl) {
            /* the header was all: the NCCL receive's completion answers */
        } else if (!p->h) {
            push_finish(p, KD_STATUS_INVALID_ARGUMENT, "empty stream: a HandoffHeader comes first", -1, NULL);
        } else if (p->received != g_layout.total) {
            snprintf(msg, sizeof msg, "truncated state: %" PRIu64 " of %" PRIu64 " bytes", p->received, g_layout.total);
            push_finish(p, KD_STATUS_DATA_LOSS, msg, -1, NULL);
        } else if (p->trailer) {
            push_finish(p, KD_STATUS_DATA_LOSS, "truncated stream: it ended without its HandoffTrailer", -1, NULL);
        } else {
            push_verify_finish(p);
        }
        push_unref(p);
        return;
    }
    if (p->nccl) {
        grpc_byte_buffer_destroy(bb);
        push_finish(p, KD_STATUS_INVALID_ARGUMENT, "an NCCL handoff's stream carries only its header", -1, NULL);
        push_unref(p);
        return;
    }
    /* A chunk is the common message: recognised from its first bytes and handed, as gRPC's
     * slices (no flattening copy), to the engine thread, which copies them into the slot. */
    if (p->h && bb->type == GRPC_BB_RAW && bb->data.raw.compression == GRPC_COMPRESS_NONE) {
        const grpc_slice_buffer *sb = &bb->data.raw.slice_buffer;
        uint8_t d[11];
        size_t have = 0, skip = 0;
        for (size_t i = 0; i < sb->count && have < sizeof d; i++) {
            size_t n = GRPC_SLICE_LENGTH(sb->slices[i]);
            if (n > sizeof d - have) n = sizeof d - have;
            memcpy(d + have, GRPC_SLICE_START_PTR(sb->slices[i]), n);
            have += n;
        }
        uint64_t n = 0;
        if (push_chunk_prefix(d, have, grpc_byte_buffer_length(bb), &skip, &n)) {
            const int code = push_queue_write(p, bb, skip, NULL, n, msg, sizeof msg);
            if (code != KD_STATUS_OK) {
                grpc_byte_buffer_destroy(bb);
                push_finish(p, code, msg, -1, NULL);
            } else {
                push_recv_next(p);
            }
            push_unref(p);
            return;
        }
    }
    grpc_slice s;
    if (read_bb(bb, &s)) {
        grpc_byte_buffer_destroy(bb);
        push_finish(p, KD_STATUS_INTERNAL, "cannot read the message", -1, NULL);
        push_unref(p);
        return;
    }
    grpc_byte_buffer_destroy(bb);
    const int nul = kd_api_string_has_nul(&kdecode__v1__push_state_request__descriptor, GRPC_SLICE_START_PTR(s),
                                          GRPC_SLICE_LENGTH(s), msg, sizeof msg);
    Kdecode__V1__PushStateRequest *m =
        nul ? NULL : kdecode__v1__push_state_request__unpack(NULL, GRPC_SLICE_LENGTH(s), GRPC_SLICE_START_PTR(s));
    grpc_slice_unref(s);
    int code = KD_STATUS_OK, answered = 0;
    if (!m) {
        code = KD_STATUS_INVALID_ARGUMENT;
        if (!nul) snprintf(msg, sizeof msg, "cannot parse kdecode.v1.PushStateRequest");
    } else if (!p->h) {
        if (m->msg_case != KDECODE__V1__PUSH_STATE_REQUEST__MSG_HEADER) {
            code = KD_STATUS_INVALID_ARGUMENT;
            snprintf(msg, sizeof msg, "a HandoffHeader comes first");
        } else if (m->header->checksums_in_trailer &&
                   m->header->transport == KDECODE__V1__HANDOFF_TRANSPORT__HANDOFF_TRANSPORT_NCCL) {
            code = KD_STATUS_INVALID_ARGUMENT;
            snprintf(msg, sizeof msg, "checksums_in_trailer is for the gRPC transport (NCCL checks sum64)");
        } else if ((code = handoff_begin(m->header, &p->h, msg, sizeof msg, &pushback)) == KD_STATUS_OK) {
            const int incremental = kd_backend_has_hash_update(g_srv.be);
            p->sects = calloc(g_layout.n, sizeof *p->sects);
            if (incremental) {
                p->rx = push_rx_new();
                p->rx_free = calloc(1, sizeof *p->rx_free);
            }
            if (!p->sects || (incremental && (!p->rx || !p->rx_free))) {
                free(p->rx), free(p->rx_free);
                p->rx = NULL, p->rx_free = NULL;
                code = KD_STATUS_INTERNAL;
                snprintf(msg, sizeof msg, "out of memory");
            } else {
                for (size_t i = 0; i < g_layout.n; i++)
                    p->sects[i] = (sect){g_layout.sects[i].offset, g_layout.sects[i].size,
                                         m->header->layout->sections[i]->xxh3};
                p->trailer = m->header->checksums_in_trailer;
                pthread_mutex_lock(&g_srv.mu);
                p->h->push = p;
                pthread_mutex_unlock(&g_srv.mu);
                const int nccl = m->header->transport == KDECODE__V1__HANDOFF_TRANSPORT__HANDOFF_TRANSPORT_NCCL;
                logf_("handoff-start", "id=%s slot=%d bytes=%" PRIu64 "%s", p->h->id, p->h->slot, g_layout.total,
                      nccl ? " over NCCL" : "");
                if (nccl) code = push_nccl_begin(p, m->header, msg, sizeof msg);
            }
        }
    } else if (m->msg_case == KDECODE__V1__PUSH_STATE_REQUEST__MSG_TRAILER) {
        const Kdecode__V1__HandoffTrailer *tr = m->trailer;
        if (!p->trailer) {
            code = KD_STATUS_INVALID_ARGUMENT;
            snprintf(msg, sizeof msg, "a HandoffTrailer the header did not announce (its checksums are in the header)");
        } else if (tr->n_xxh3 != g_layout.n) {
            code = KD_STATUS_INVALID_ARGUMENT;
            snprintf(msg, sizeof msg, "a HandoffTrailer with %zu checksums for %zu sections", tr->n_xxh3, g_layout.n);
        } else if (p->received != g_layout.total) {
            code = KD_STATUS_DATA_LOSS;
            snprintf(msg, sizeof msg, "truncated state: %" PRIu64 " of %" PRIu64 " bytes before the trailer",
                     p->received, g_layout.total);
        } else {
            for (size_t i = 0; i < g_layout.n; i++) p->sects[i].xxh3 = tr->xxh3[i];
            push_verify_finish(p); /* answers: nothing is read after the trailer */
            answered = 1;
        }
    } else if (m->msg_case != KDECODE__V1__PUSH_STATE_REQUEST__MSG_CHUNK) {
        code = KD_STATUS_INVALID_ARGUMENT;
        snprintf(msg, sizeof msg, "a second header in one stream");
    } else if (m->chunk.len > KD_HANDOFF_CHUNK) {
        code = push_queue_write(p, NULL, 0, NULL, m->chunk.len, msg, sizeof msg);
    } else if (m->chunk.len) {
        uint8_t *data = malloc(m->chunk.len);
        if (!data) {
            code = KD_STATUS_INTERNAL;
            snprintf(msg, sizeof msg, "out of memory");
        } else {
            memcpy(data, m->chunk.data, m->chunk.len);
            code = push_queue_write(p, NULL, 0, data, m->chunk.len, msg, sizeof msg);
            if (code != KD_STATUS_OK) free(data);
        }
    }
    if (code != KD_STATUS_OK && g_nccl && m && m->msg_case == KDECODE__V1__PUSH_STATE_REQUEST__MSG_HEADER &&
        m->header->transport == KDECODE__V1__HANDOFF_TRANSPORT__HANDOFF_TRANSPORT_NCCL)
        kd_nccl_drop(g_nccl, m->header->nccl_comm_id); /* refused: the sender aborts its end */
    if (m) kdecode__v1__push_state_request__free_unpacked(m, NULL);
    if (code != KD_STATUS_OK) push_finish(p, code, msg, pushback, NULL);
    else if (!answered) push_recv_next(p);
    push_unref(p);
}

static void push_close_done(void *obj, int ok) {
    (void)ok;
    if (((push_call *)obj)->close_cancelled) push_nccl_cancel((push_call *)obj); /* e.g. Abort */
    push_unref((push_call *)obj); /* a broken stream shows in the pending receive */
}

/* Once, at the first PushState: freed memory stays in the allocator instead of going back to
 * the kernel. gRPC reads a handoff into 64 KiB buffers that are freed as soon as the engine
 * has copied them; returned to the kernel and faulted in again, they cost one page fault per
 * 4 KiB received (about 11,000 for the 42.8 MiB state). */
static void push_keep_freed_memory(void) {
    mallopt(M_TRIM_THRESHOLD, 256 << 20);
}

static void push_start(grpc_call *call) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, push_keep_freed_memory);
    push_call *p = calloc(1, sizeof *p);
    if (!p) {
        grpc_call_cancel(call, NULL);
        grpc_call_unref(call);
        return;
    }
    call_ref_count(1);
    pthread_mutex_init(&p->mu, NULL);
    p->call = call;
    p->t_recv = (tag){push_recv_done, p};
    p->t_close = (tag){push_close_done, p};
    p->t0 = now_s();
    p->refs = 2; /* close, and ours until the first receive is started */
    if (start_recv_close(call, &p->close_cancelled, &p->t_close)) p->refs--;
    push_recv_next(p);
    push_unref(p);
}

/* Abort of an unclaimed handoff: a ready one is dropped, an arriving one has its stream
 * cancelled (which drops it). g_srv.mu held. Returns whether there was one. */
static int handoff_abort_locked(const char *id) {
    handoff *h = handoff_find_locked(id);
    if (!h) return 0;
    if (h->push) grpc_call_cancel_with_status(h->push->call, GRPC_STATUS_CANCELLED, "aborted", NULL);
    else handoff_drop_locked(h, "aborted");
    return 1;
}

/* Generate with a handoff id: the claim. Fills g->req.params from the handoff. */
static int handoff_claim(gen_call *g, int32_t *slot, char *msg, size_t len) {
    pthread_mutex_lock(&g_srv.mu);
    handoff *h = handoff_find_locked(g->req.handoff_id);
    int code = KD_STATUS_OK;
    const char *rid = g->req.request_id[0] ? g->req.request_id : g->req.handoff_id;
    if (registry_find(rid)) {
        code = KD_STATUS_ALREADY_EXISTS;
        snprintf(msg, len, "a live request already has id '%s'", rid);
    } else if (!h || !h->ready) {
        code = h ? KD_STATUS_FAILED_PRECONDITION : KD_STATUS_NOT_FOUND;
        snprintf(msg, len, h ? "handoff '%s' is still arriving" : "unknown or already claimed handoff '%s'",
                 g->req.handoff_id);
    } else if (h->n_prompt - 1 + g->req.params.max_tokens > g_srv.o.eng.max_model_len) {
        code = KD_STATUS_INVALID_ARGUMENT;
        snprintf(msg, len, "prompt (%lld) + max_tokens (%d) exceeds the model length %lld", (long long)(h->n_prompt - 1),
                 g->req.params.max_tokens, (long long)g_srv.o.eng.max_model_len);
    } else {
        handoff_unlink_locked(h);
        free(g->req.prompt);
        g->req.prompt = h->prompt;
        g->req.params.prompt = h->prompt;
        g->req.params.n_prompt = h->n_prompt;
        if (!g->req.request_id[0]) snprintf(g->req.request_id, sizeof g->req.request_id, "%s", h->id);
        *slot = h->slot;
        free(h);
    }
    pthread_mutex_unlock(&g_srv.mu);
    return code;
}

/* Export buffers of the prefill role (a state each, tens of MiB): kept for reuse, since a
 * fresh one costs a page fault per 4 KiB when the state is written into it. */
#define KD_STATE_POOL 4
static void *g_state_pool[KD_STATE_POOL];
static int g_state_pool_n;

static void *state_buf_get(void) {
    void *b = NULL;
    pthread_mutex_lock(&g_srv.mu);
    if (g_state_pool_n > 0) b = g_state_pool[--g_state_pool_n];
    pthread_mutex_unlock(&g_srv.mu);
    return b ? b : malloc(g_layout.total);
}

static void state_buf_put(void *b) {
    if (!b) return;
    pthread_mutex_lock(&g_srv.mu);
    if (g_state_pool_n < KD_STATE_POOL) g_state_pool[g_state_pool_n++] = b, b = NULL;
    pthread_mutex_unlock(&g_srv.mu);
    free(b);
}

static void state_pool_free(void) {
    while (g_state_pool_n > 0) free(g_state_pool[--g_state_pool_n]);
}

/* Prefiller.Prefill: the prompt runs here (a one-token request whose state is exported at
 * its finish), then a thread streams the state to the decode worker and answers the call. */
typedef struct prefill_call {
    sink s;                       /* first: the engine's events */
    tag t_recv, t_close;
    grpc_call *call;
    grpc_byte_buffer *recv_bb;
    int close_cancelled;
    atomic_int gone;              /* the router cancelled the call (or its deadline passed) */
    pthread_mutex_t mu;
    int refs;
    char id[KD_REQUEST_ID_MAX + 1], target[256];
    int32_t *prompt, *stop;
    kd_request_params params;
    void *state;
    int state_dev;                /* state is device memory (for the NCCL transport) */
    int32_t first_token;
    kd_finish fin;
    int exported;
    kd_usage usage;
    double t0, t_prefilled;
} prefill_call;

static void prefill_unref(prefill_call *p) {
    pthread_mutex_lock(&p->mu);
    int left = --p->refs;
    pthread_mutex_unlock(&p->mu);
    if (left) return;
    if (p->recv_bb) grpc_byte_buffer_destroy(p->recv_bb);
    free(p->prompt), free(p->stop);
    prefill_state_put(p);
    grpc_call_unref(p->call);
    pthread_mutex_destroy(&p->mu);
    free(p);
    call_ref_count(-1);
}

/* The answer counts for the drain until it has gone (n_replies): the caller takes n_prefill
 * back right after. */
static void prefill_reply(prefill_call *p, const Kdecode__V1__PrefillResponse *r, int code, const char *msg) {
    grpc_call_ref(p->call);
    if (code != KD_STATUS_OK || !r) {
        reply_status_cx(p->call, 0, 0, (grpc_status_code)code, msg, -1, 1);
        return;
    }
    grpc_byte_buffer *bb = pack_bb(&r->base);
    if (!bb) {
        reply_status_cx(p->call, 0, 0, GRPC_STATUS_INTERNAL, "out of memory", -1, 1);
        return;
    }
    reply_message_cx(p->call, bb, 0, 0, 1);
}

/* The header of p's handoff: this worker's layout, the request's prompt and first token;
 * the caller adds the checksums (and the transport). secs, secp: g_layout.n each. */
static void handoff_header_fill(prefill_call *p, Kdecode__V1__StateSection *secs, Kdecode__V1__StateSection **secp,
                                Kdecode__V1__StateLayout *ly, Kdecode__V1__HandoffHeader *hd) {
    for (size_t i = 0; i < g_layout.n; i++) {
        kdecode__v1__state_section__init(&secs[i]);
        secs[i].name = g_layout.names[i];
        secs[i].dtype = (char *)kd_dtype_name(g_srv.be->state_dtype);
        secs[i].n_shape = (size_t)g_layout.nd[i];
        secs[i].shape = g_layout.shapes[i];
        secs[i].offset = g_layout.sects[i].offset;
        secs[i].size = g_layout.sects[i].size;
        secp[i] = &secs[i];
    }
    ly->version = KDECODE__V1__HANDOFF_VERSION__HANDOFF_VERSION_1;
    ly->n_sections = g_layout.n, ly->sections = secp, ly->total_bytes = g_layout.total;
    hd->version = KDECODE__V1__HANDOFF_VERSION__HANDOFF_VERSION_1;
    hd->request_id = p->id;
    hd->model_fingerprint = g_layout.fingerprint;
    hd->n_prompt_token_ids = (size_t)p->params.n_prompt;
    hd->prompt_token_ids = p->prompt;
    hd->first_token = p->first_token;
    hd->layout = ly;
}

/* The push: a header, the state in 1 MiB chunks, then a trailer with the sections'
 * checksums, each chunk hashed right before it is handed to gRPC (so that it is in cache when
 * gRPC's write copies it; no pass over the whole state before the header). */
typedef struct push_src {
    prefill_call *p;
    uint8_t pre[KD_BYTES_FIELD_HEAD];
    uint8_t *msg;
    size_t cap;
    uint64_t sent;
    int header_done, trailer_done;
    Kdecode__V1__HandoffHeader *hd;
    push_rx *tx;                  /* the checksums of what was sent */
} push_src;

/* Packs m into ps->msg as the next message. */
static int push_src_pack(push_src *ps, const Kdecode__V1__PushStateRequest *m, kd_msg *out) {
    size_t need = protobuf_c_message_get_packed_size(&m->base);
    if (need > ps->cap) {
        uint8_t *b = realloc(ps->msg, need);
        if (!b) return -1;
        ps->msg = b, ps->cap = need;
    }
    *out = (kd_msg){.head = ps->msg, .head_len = protobuf_c_message_pack(&m->base, ps->msg)};
    return 1;
}

static int push_next(void *ctx, kd_msg *out) {
    push_src *ps = ctx;
    if (!out) return atomic_load(&ps->p->gone) ? -1 : 0; /* the Prefill call is gone: stop the push */
    Kdecode__V1__PushStateRequest m = KDECODE__V1__PUSH_STATE_REQUEST__INIT;
    if (!ps->header_done) {
        m.msg_case = KDECODE__V1__PUSH_STATE_REQUEST__MSG_HEADER;
        m.header = ps->hd;
        ps->header_done = 1;
        return push_src_pack(ps, &m, out);
    }
    if (atomic_load(&ps->p->gone)) return -1;
    if (ps->sent == g_layout.total) {
        if (ps->trailer_done) return 0;
        Kdecode__V1__HandoffTrailer tr = KDECODE__V1__HANDOFF_TRAILER__INIT;
        tr.n_xxh3 = g_layout.n, tr.xxh3 = ps->tx->got;
        m.msg_case = KDECODE__V1__PUSH_STATE_REQUEST__MSG_TRAILER;
        m.trailer = &tr;
        ps->trailer_done = 1;
        return push_src_pack(ps, &m, out);
    }
    if (ps->sent && g_srv.o.debug_handoff_delay_ms > 0) usleep((useconds_t)g_srv.o.debug_handoff_delay_ms * 1000);
    const uint64_t n = g_layout.total - ps->sent < KD_HANDOFF_CHUNK ? g_layout.total - ps->sent : KD_HANDOFF_CHUNK;
    push_rx_hash(ps->tx, (const uint8_t *)ps->p->state + ps->sent, (size_t)n);
    /* a chunk message by hand: field 2 (bytes), its length, then the state bytes themselves,
     * sent from the state buffer without a copy */
    const size_t k = kd_client_bytes_field_head(ps->pre, 2, n);
    *out = (kd_msg){.head = ps->pre, .head_len = k, .tail = (const uint8_t *)ps->p->state + ps->sent, .tail_len = (size_t)n};
    ps->sent += n;
    return 1;
}

static void *prefill_push_main(void *arg) {
    prefill_call *p = arg;
    Kdecode__V1__HandoffHeader hd = KDECODE__V1__HANDOFF_HEADER__INIT;
    Kdecode__V1__StateLayout ly = KDECODE__V1__STATE_LAYOUT__INIT;
    Kdecode__V1__StateSection *secs = calloc(g_layout.n, sizeof *secs), **secp = calloc(g_layout.n, sizeof *secp);
    char msg[600] = "";
    int code = KD_STATUS_OK;
    uint8_t *resp = NULL;
    size_t resp_len = 0;
    const double t_push = now_s();
    push_src ps = {.p = p, .hd = &hd};
    kd_client *cl = NULL;
    nccl_times tm = {0, 0, 0};
    int via_nccl = 0, cl_cached = 0;
    if (!secs || !secp) {
        code = KD_STATUS_INTERNAL;
        snprintf(msg, sizeof msg, "out of memory");
        goto done;
    }
    if (p->state_dev) { /* the NCCL transport first; without a link to this peer, gRPC */
        kd_err nerr;
        int owned = 0;
        if (!(cl = peer_client(p->target, &owned, &nerr))) {
            code = KD_STATUS_UNAVAILABLE;
            snprintf(msg, sizeof msg, "decode worker %s: %.300s", p->target, nerr.msg);
            goto done;
        }
        cl_cached = !owned;
        if (prefill_push_nccl(p, cl, &resp, &resp_len, &code, msg, sizeof msg, &tm, &nerr) == 0) {
            via_nccl = 1;
            goto done;
        }
        kd_metrics_add(g_srv.metrics, KD_C_HANDOFF_NCCL_FALLBACKS, 1);
        logf_("nccl-fallback", "id=%s to=%s: %s; the state goes over gRPC", p->id, p->target, nerr.msg);
        if (!cl_cached) kd_client_close(cl);
        cl = NULL, cl_cached = 0;
        if (prefill_state_to_host(p, &nerr)) {
            code = KD_STATUS_INTERNAL;
            snprintf(msg, sizeof msg, "%.300s", nerr.msg);
            goto done;
        }
    }
    handoff_header_fill(p, secs, secp, &ly, &hd);
    hd.checksums_in_trailer = 1; /* computed as the chunks go (push_next) */
    kd_err err;
    int owned = 0;
    /* a kept client (its channel still connected from the last handoff to this peer) */
    cl = peer_client(p->target, &owned, &err);
    cl_cached = cl && !owned;
    kd_call_status st;
    if (!(ps.tx = push_rx_new())) {
        code = KD_STATUS_INTERNAL;
        snprintf(msg, sizeof msg, "out of memory");
    } else if (!cl) {
        code = KD_STATUS_UNAVAILABLE;
        snprintf(msg, sizeof msg, "decode worker %s: %.300s", p->target, err.msg);
    } else if (kd_client_client_stream(cl, "/kdecode.v1.Decoder/PushState", push_next, &ps, 120, &resp, &resp_len, &st,
                                       &err)) {
        code = KD_STATUS_UNAVAILABLE;
        snprintf(msg, sizeof msg, "decode worker %s: %.300s", p->target, err.msg);
    } else if (st.code != KD_STATUS_OK) {
        code = st.code;
        snprintf(msg, sizeof msg, "decode worker %s: %.300s", p->target, st.details);
    }
done:;
    Kdecode__V1__PushStateResponse *pr = NULL;
    if (code == KD_STATUS_OK && !(pr = kdecode__v1__push_state_response__unpack(NULL, resp_len, resp))) {
        code = KD_STATUS_INTERNAL;
        snprintf(msg, sizeof msg, "decode worker %s: unreadable PushStateResponse", p->target);
    }
    const double t_end = now_s();
    if (code == KD_STATUS_OK && atomic_load(&p->gone)) { /* done, but nobody will claim it */
        Kdecode__V1__AbortRequest ab = KDECODE__V1__ABORT_REQUEST__INIT;
        ab.request_id = pr->handoff_id;
        uint8_t abuf[256], *ar = NULL;
        size_t arl = 0, alen = kdecode__v1__abort_request__pack(&ab, abuf);
        kd_call_status ast;
        if (kd_client_unary(cl, "/kdecode.v1.Decoder/Abort", abuf, alen, 10, &ar, &arl, &ast, &err) == 0) free(ar);
        code = KD_STATUS_CANCELLED;
        snprintf(msg, sizeof msg, "the Prefill call was cancelled; handoff %s aborted", pr->handoff_id);
    }
    if (code == KD_STATUS_OK) {
        Kdecode__V1__PrefillResponse r = KDECODE__V1__PREFILL_RESPONSE__INIT;
        r.handoff_id = pr->handoff_id;
        r.first_token = p->first_token;
        r.prompt_tokens = p->params.n_prompt;
        r.cached_tokens = p->usage.cached_tokens;
        r.handoff_bytes = g_layout.total;
        r.prefill_seconds = p->t_prefilled - p->t0;
        r.handoff_seconds = t_end - t_push;
        r.transfer_seconds = tm.xfer;
        r.transport = via_nccl ? KDECODE__V1__HANDOFF_TRANSPORT__HANDOFF_TRANSPORT_NCCL
                               : KDECODE__V1__HANDOFF_TRANSPORT__HANDOFF_TRANSPORT_GRPC;
        kd_metrics_add(g_srv.metrics, KD_C_HANDOFF_BYTES, g_layout.total);
        kd_metrics_observe(g_srv.metrics, KD_H_HANDOFF, t_end - t_push);
        char how[160] = "";
        if (via_nccl) /* where the time went (the rest: the peer's client, the header, the answer's unpacking) */
            snprintf(how, sizeof how, " (link %.6f s, sum64 %.6f s, transfer %.6f s)", tm.link, tm.sum64, tm.xfer);
        logf_("prefill-handed-off", "id=%s to=%s bytes=%" PRIu64 " in %.6f s over %s%s", p->id, p->target,
              g_layout.total, t_end - t_push, via_nccl ? "NCCL" : "gRPC", how);
        prefill_reply(p, &r, KD_STATUS_OK, "");
    } else {
        kd_metrics_add(g_srv.metrics, KD_C_HANDOFF_FAILURES, 1);
        logf_("prefill-handoff-failed", "id=%s: %s", p->id, msg);
        prefill_reply(p, NULL, code, msg);
    }
    if (pr) kdecode__v1__push_state_response__free_unpacked(pr, NULL);
    free(resp), free(ps.msg), free(ps.tx), free(secs), free(secp);
    if (cl_cached && code == KD_STATUS_UNAVAILABLE) peer_client_drop(p->target, cl);
    else if (!cl_cached) kd_client_close(cl);
    pthread_mutex_lock(&g_srv.mu);
    g_srv.n_prefill--;
    pthread_cond_broadcast(&g_srv.cv);
    pthread_mutex_unlock(&g_srv.mu);
    prefill_unref(p);
    return NULL;
}

static void prefill_on_event(sink *k, const kd_event *ev) {
    prefill_call *p = (prefill_call *)k;
    if (ev->n_tokens > 0) p->first_token = ev->tokens[0];
    if (ev->finish == KD_FINISH_NONE) return;
    p->fin = ev->finish, p->exported = ev->exported, p->usage = ev->usage;
    p->t_prefilled = now_s();
    count_finish(ev->finish);
    if (ev->finish == KD_FINISH_LENGTH && ev->exported) {
        pthread_t th;
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        if (pthread_create(&th, &at, prefill_push_main, p) == 0) {
            pthread_attr_destroy(&at);
            return; /* the thread answers and drops the engine's reference */
        }
        pthread_attr_destroy(&at);
        prefill_reply(p, NULL, KD_STATUS_INTERNAL, "cannot start the handoff");
    } else if (ev->finish == KD_FINISH_STOP) {
        Kdecode__V1__PrefillResponse r = KDECODE__V1__PREFILL_RESPONSE__INIT;
        r.first_token = p->first_token;
        r.finish_reason = KDECODE__V1__FINISH_REASON__FINISH_REASON_STOP;
        r.prompt_tokens = p->params.n_prompt;
        r.cached_tokens = ev->usage.cached_tokens;
        r.prefill_seconds = p->t_prefilled - p->t0;
        prefill_reply(p, &r, KD_STATUS_OK, "");
    } else {
        prefill_reply(p, NULL, ev->finish == KD_FINISH_ABORT ? KD_STATUS_CANCELLED : KD_STATUS_INTERNAL,
                      ev->finish == KD_FINISH_ABORT ? "aborted" : "the compute backend failed");
    }
    pthread_mutex_lock(&g_srv.mu);
    g_srv.n_prefill--;
    pthread_cond_broadcast(&g_srv.cv);
    pthread_mutex_unlock(&g_srv.mu);
    prefill_unref(p);
}

static int prefill_parse(prefill_call *p, const uint8_t *data, size_t len, char *msg, size_t msglen) {
    if (kd_api_string_has_nul(&kdecode__v1__prefill_request__descriptor, data, len, msg, msglen))
        return KD_STATUS_INVALID_ARGUMENT;
    Kdecode__V1__PrefillRequest *m = kdecode__v1__prefill_request__unpack(NULL, len, data);
    if (!m) return snprintf(msg, msglen, "cannot parse kdecode.v1.PrefillRequest"), KD_STATUS_INVALID_ARGUMENT;
    int code = KD_STATUS_INVALID_ARGUMENT;
    const char *why;
    kd_sampling s = {.temperature = 0, .top_k = 0, .top_p = 1, .seed = 0};
    if (m->sampling) {
        s.temperature = m->sampling->temperature, s.top_k = m->sampling->top_k, s.seed = m->sampling->seed;
        s.top_p = m->sampling->top_p == 0 ? 1 : m->sampling->top_p;
    }
    if (m->request_id[0] && !kd_api_valid_request_id(m->request_id))
        snprintf(msg, msglen, "request_id must be 1..%d printable ASCII characters", KD_REQUEST_ID_MAX);
    else if (m->n_prompt_token_ids == 0)
        snprintf(msg, msglen, "prompt_token_ids is empty");
    else if ((int64_t)m->n_prompt_token_ids >= g_srv.o.eng.max_model_len)
        snprintf(msg, msglen, "prompt of %zu tokens is longer than the limit %lld", m->n_prompt_token_ids,
                 (long long)(g_srv.o.eng.max_model_len - 1));
    else if (!m->decode_target[0] || strlen(m->decode_target) >= sizeof p->target)
        snprintf(msg, msglen, "decode_target must name the decode worker (host:port)");
    else if (kd_sampling_check(&s, &why))
        snprintf(msg, msglen, "sampling: %s", why);
    else if (m->n_stop_token_ids > 64)
        snprintf(msg, msglen, "at most 64 stop_token_ids");
    else
        code = KD_STATUS_OK;
    for (size_t i = 0; code == KD_STATUS_OK && i < m->n_prompt_token_ids + m->n_stop_token_ids; i++) {
        int32_t t = i < m->n_prompt_token_ids ? m->prompt_token_ids[i] : m->stop_token_ids[i - m->n_prompt_token_ids];
        if (t < 0 || t >= g_srv.lim.vocab) {
            code = KD_STATUS_INVALID_ARGUMENT;
            snprintf(msg, msglen, "token id %d is outside the vocabulary [0, %d)", t, g_srv.lim.vocab);
        }
    }
    if (code == KD_STATUS_OK) {
        p->prompt = malloc(m->n_prompt_token_ids * sizeof *p->prompt);
        p->stop = malloc((m->n_stop_token_ids + 1) * sizeof *p->stop);
        if (!p->prompt || !p->stop) {
            code = KD_STATUS_INTERNAL;
            snprintf(msg, msglen, "out of memory");
        } else {
            memcpy(p->prompt, m->prompt_token_ids, m->n_prompt_token_ids * sizeof *p->prompt);
            if (m->n_stop_token_ids) memcpy(p->stop, m->stop_token_ids, m->n_stop_token_ids * sizeof *p->stop);
            snprintf(p->id, sizeof p->id, "%s", m->request_id);
            snprintf(p->target, sizeof p->target, "%s", m->decode_target);
            p->params = (kd_request_params){.prompt = p->prompt, .n_prompt = (int64_t)m->n_prompt_token_ids,
                                            .max_tokens = 1, .sampling = s, .stop_ids = p->stop,
                                            .n_stop = (int32_t)m->n_stop_token_ids,
                                            .eos_id = m->ignore_eos ? -1 : g_srv.lim.eos_id};
        }
    }
    kdecode__v1__prefill_request__free_unpacked(m, NULL);
    return code;
}

static void prefill_recv_done(void *obj, int ok) {
    prefill_call *p = obj;
    grpc_byte_buffer *bb = p->recv_bb;
    p->recv_bb = NULL;
    char msg[512] = "";
    int code = KD_STATUS_OK;
    if (!ok) {
        if (bb) grpc_byte_buffer_destroy(bb);
        prefill_unref(p);
        return;
    }
    grpc_slice s;
    if (!bb) {
        code = KD_STATUS_INVALID_ARGUMENT;
        snprintf(msg, sizeof msg, "missing request message");
    } else if (read_bb(bb, &s)) {
        code = KD_STATUS_INTERNAL;
        snprintf(msg, sizeof msg, "cannot read the request");
    } else {
        code = prefill_parse(p, GRPC_SLICE_START_PTR(s), GRPC_SLICE_LENGTH(s), msg, sizeof msg);
        grpc_slice_unref(s);
    }
    if (bb) grpc_byte_buffer_destroy(bb);
    if (code == KD_STATUS_OK && atomic_load(&g_srv.state) != ST_SERVING) {
        code = KD_STATUS_UNAVAILABLE;
        snprintf(msg, sizeof msg, "the worker is not serving");
    }
    if (code == KD_STATUS_OK && !prefill_state_get(p)) {
        code = KD_STATUS_RESOURCE_EXHAUSTED;
        snprintf(msg, sizeof msg, "no memory for the state of this request");
    }
    if (code == KD_STATUS_OK) {
        p->params.export_state = p->state;
        cmd *c = calloc(1, sizeof *c);
        pthread_mutex_lock(&g_srv.mu);
        if (!p->id[0])
            snprintf(p->id, sizeof p->id, "kd-%08x-%llu", g_srv.id_tag, (unsigned long long)(g_srv.next_id + 1));
        if (!c) {
            code = KD_STATUS_INTERNAL;
            snprintf(msg, sizeof msg, "out of memory");
        } else if (g_srv.n_live + g_srv.n_prefill >= g_srv.o.eng.max_seqs + g_srv.o.eng.max_queue) {
            code = KD_STATUS_RESOURCE_EXHAUSTED;
            snprintf(msg, sizeof msg, "all slots and queue places are taken; retry later");
        } else {
            p->s.eid = ++g_srv.next_id;
            g_srv.n_prefill++;
            pthread_mutex_lock(&p->mu);
            p->refs++; /* the engine's, then the push thread's */
            pthread_mutex_unlock(&p->mu);
            c->kind = CMD_SUBMIT, c->sink = &p->s, c->params = &p->params, c->slot = -1;
            enqueue_locked(c);
            c = NULL;
        }
        pthread_mutex_unlock(&g_srv.mu);
        free(c);
    }
    if (code != KD_STATUS_OK) {
        if (code == KD_STATUS_RESOURCE_EXHAUSTED) kd_metrics_add(g_srv.metrics, KD_C_REJECTED_BUSY, 1);
        prefill_reply(p, NULL, code, msg);
    }
    prefill_unref(p);
}

static void prefill_close_done(void *obj, int ok) {
    (void)ok;
    prefill_call *p = obj;
    if (p->close_cancelled) atomic_store(&p->gone, 1); /* the push stops: nobody would claim it */
    prefill_unref(p);
}

static void prefill_start(grpc_call *call) {
    prefill_call *p = calloc(1, sizeof *p);
    if (!p) {
        grpc_call_cancel(call, NULL);
        grpc_call_unref(call);
        return;
    }
    call_ref_count(1);
    pthread_mutex_init(&p->mu, NULL);
    p->s.on_event = prefill_on_event;
    p->call = call;
    p->t_recv = (tag){prefill_recv_done, p};
    p->t_close = (tag){prefill_close_done, p};
    p->t0 = now_s();
    p->refs = 2;
    if (start_recv_close(call, &p->close_cancelled, &p->t_close)) p->refs--;
    if (start_recv_message(call, &p->recv_bb, &p->t_recv)) prefill_unref(p);
}

/* ---------------------------------------------- the NCCL transport, sending side
 * A prefill worker on a GPU exports each state into a device buffer. To hand it over it takes
 * the link to the decode worker (NcclConnect makes one the first time), computes the sections'
 * sum64 on its GPU, sends the header over gRPC, sends the sections with ncclSend and waits for
 * the decode worker's answer and the send's completion. Without a link (the peer has no GPU,
 * runs --handoff-transport grpc, or cannot join) the state goes over gRPC: a log line and
 * kdecode_handoff_nccl_fallbacks_total. */

static void *prefill_state_get(prefill_call *p) {
    if (g_nccl && (p->state = kd_nccl_buf_get(g_nccl, g_layout.total))) {
        p->state_dev = 1;
        return p->state;
    }
    p->state_dev = 0;
    return p->state = state_buf_get();
}

static void prefill_state_put(prefill_call *p) {
    if (p->state_dev) kd_nccl_buf_put(g_nccl, p->state, g_layout.total);
    else state_buf_put(p->state);
    p->state = NULL;
}

/* The state to host memory, for the gRPC transport. */
static int prefill_state_to_host(prefill_call *p, kd_err *err) {
    if (!p->state_dev) return 0;
    void *host = state_buf_get();
    if (!host) return kd_fail(err, "out of memory");
    if (kd_nccl_copy_to_host(g_nccl, host, p->state, g_layout.total, err)) {
        state_buf_put(host);
        return -1;
    }
    kd_nccl_buf_put(g_nccl, p->state, g_layout.total);
    p->state = host, p->state_dev = 0;
    return 0;
}

/* Clients of decode workers, kept (a channel reconnects by itself; calls on one client may
 * run concurrently): a handoff does not pay for a new HTTP/2 connection. Over TLS when
 * --peer-tls-ca is set. Closed at shutdown. */
#define KD_PEER_CLIENTS 32
static struct {
    char target[256];
    kd_client *cl;
} g_peers[KD_PEER_CLIENTS];
static int g_n_peers;

static kd_client *peer_client(const char *target, int *owned, kd_err *err) {
    kd_client *cl = NULL;
    *owned = 0;
    pthread_mutex_lock(&g_srv.mu);
    for (int i = 0; i < g_n_peers && !cl; i++)
        if (!strcmp(g_peers[i].target, target)) cl = g_peers[i].cl;
    pthread_mutex_unlock(&g_srv.mu);
    if (cl) return cl;
    kd_tls_opts tls = {.ca_file = g_srv.o.peer_tls_ca, .cert_file = g_srv.o.peer_tls_ca ? g_srv.o.tls_cert : NULL,
                       .key_file = g_srv.o.peer_tls_ca ? g_srv.o.tls_key : NULL};
    if (strlen(target) >= sizeof g_peers[0].target || !(cl = kd_client_connect(target, &tls, err))) {
        if (cl == NULL && strlen(target) >= sizeof g_peers[0].target) kd_fail(err, "decode target too long");
        return NULL;
    }
    pthread_mutex_lock(&g_srv.mu);
    kd_client *old = NULL;
    for (int i = 0; i < g_n_peers; i++)
        if (!strcmp(g_peers[i].target, target)) old = g_peers[i].cl; /* raced: keep the first */
    if (!old && g_n_peers == KD_PEER_CLIENTS) { /* full: not kept, the caller closes it */
        pthread_mutex_unlock(&g_srv.mu);
        *owned = 1;
        return cl;
    }
    if (!old) {
        snprintf(g_peers[g_n_peers].target, sizeof g_peers[0].target, "%s", target);
        g_peers[g_n_peers++].cl = cl;
    }
    pthread_mutex_unlock(&g_srv.mu);
    if (old) {
        kd_client_close(cl);
        return old;
    }
    return cl;
}

/* A kept client whose peer was unreachable goes (a later handoff connects anew rather than
 * waiting out the channel's reconnect backoff); calls still on it finish first. */
static void peer_client_drop(const char *target, kd_client *cl) {
    int found = 0;
    pthread_mutex_lock(&g_srv.mu);
    for (int i = 0; i < g_n_peers; i++)
        if (g_peers[i].cl == cl && !strcmp(g_peers[i].target, target)) {
            g_peers[i] = g_peers[--g_n_peers];
            found = 1;
            break;
        }
    pthread_mutex_unlock(&g_srv.mu);
    if (found) kd_client_close(cl);
}

static void peer_clients_close(void) {
    while (g_n_peers > 0) kd_client_close(g_peers[--g_n_peers].cl);
}

static int nccl_connect_rpc(void *ctx, kd_nccl_link *l, const char *target, const char *comm_id, const void *uid,
                            size_t uid_len, kd_err *err) {
    Kdecode__V1__NcclConnectRequest q = KDECODE__V1__NCCL_CONNECT_REQUEST__INIT;
    q.comm_id = (char *)comm_id;
    q.unique_id.data = (uint8_t *)uid, q.unique_id.len = uid_len;
    q.model_fingerprint = g_layout.fingerprint;
    uint8_t buf[512], *resp = NULL;
    size_t resp_len = 0;
    if (protobuf_c_message_get_packed_size(&q.base) > sizeof buf) return kd_fail(err, "NcclConnect: request too large");
    const size_t n = protobuf_c_message_pack(&q.base, buf);
    kd_call_status st;
    if (kd_client_unary(ctx, "/kdecode.v1.Decoder/NcclConnect", buf, n, g_srv.o.nccl_connect_seconds, &resp, &resp_len,
                        &st, err))
        return -1;
    if (st.code != KD_STATUS_OK) {
        free(resp);
        return kd_fail(err, "decode worker %s refused NcclConnect: %.300s", target, st.details);
    }
    Kdecode__V1__NcclConnectResponse *r = kdecode__v1__nccl_connect_response__unpack(NULL, resp_len, resp);
    free(resp);
    uint64_t sum = 0;
    int ok = r && r->n_recv_parts >= 1 && r->n_recv_parts <= 4 * g_layout.n;
    for (size_t i = 0; ok && i < r->n_recv_parts; i++) ok = r->recv_parts[i] > 0 && (sum += r->recv_parts[i]) <= g_layout.total;
    ok = ok && sum == g_layout.total && !kd_nccl_link_set_parts(l, r->recv_parts, (int)r->n_recv_parts);
    if (r) kdecode__v1__nccl_connect_response__free_unpacked(r, NULL);
    if (!ok) return kd_fail(err, "decode worker %s: NcclConnect answered no usable receive split", target);
    return 0;
}

/* Device regions of [base, base + total) cut at the given byte counts. */
static int cut_regions(const char *base, const uint64_t *parts, int n, kd_dev_region *out) {
    uint64_t at = 0;
    for (int i = 0; i < n; i++) out[i] = (kd_dev_region){base + at, parts[i]}, at += parts[i];
    return n;
}

/* The layout's sections as device regions, from the regions a slot's state occupies (each
 * section lies within one of them). -1 when they do not cover the layout. */
static int section_regions(const kd_dev_region *r, int n, kd_dev_region *out) {
    uint64_t start = 0;
    int j = 0;
    for (size_t i = 0; i < g_layout.n; i++) {
        const uint64_t off = g_layout.sects[i].offset, size = g_layout.sects[i].size;
        while (j < n && off >= start + r[j].n_bytes) start += r[j++].n_bytes;
        if (j == n || off + size > start + r[j].n_bytes) return -1;
        out[i] = (kd_dev_region){(const char *)r[j].dev + (off - start), size};
    }
    return (int)g_layout.n;
}

typedef struct nccl_src {
    Kdecode__V1__PushStateRequest m;
    uint8_t *buf;
    kd_nccl_link *l;
    const kd_dev_region *regs;
    int n, stage, sent;
    double t_send;
    kd_err err;
} nccl_src;

/* The stream's messages: the header, then (no more messages) the sends. */
static int nccl_next(void *ctx, kd_msg *out) {
    nccl_src *ns = ctx;
    if (!out) return 0; /* (a wait: the NCCL send ends with the link's own timeouts) */
    if (ns->stage++ == 0) {
        if (!(ns->buf = malloc(protobuf_c_message_get_packed_size(&ns->m.base) + 1))) return -1;
        *out = (kd_msg){.head = ns->buf, .head_len = protobuf_c_message_pack(&ns->m.base, ns->buf)};
        return 1;
    }
    if (ns->sent) return 0;
    ns->sent = 1;
    ns->t_send = now_s();
    if (g_srv.o.debug_handoff_delay_ms > 0) { /* fault-injection tests: half of it, a pause, the rest */
        const int half = ns->n / 2;
        if (kd_nccl_send(g_nccl, ns->l, ns->regs, half, &ns->err) || kd_nccl_wait(g_nccl, ns->l, &ns->err)) return -1;
        usleep((useconds_t)g_srv.o.debug_handoff_delay_ms * 1000);
        return kd_nccl_send(g_nccl, ns->l, ns->regs + half, ns->n - half, &ns->err) ? -1 : 0;
    }
    return kd_nccl_send(g_nccl, ns->l, ns->regs, ns->n, &ns->err) ? -1 : 0;
}

/* Pushes p->state (device memory) over NCCL. 0: the push was made, its outcome in *code and
 * msg (and *resp on success); -1: no link (the caller falls back to gRPC, reason in err). */
static int prefill_push_nccl(prefill_call *p, kd_client *cl, uint8_t **resp, size_t *resp_len, int *code, char *msg,
                             size_t len, nccl_times *tm, kd_err *err) {
    const size_t ns_ = g_layout.n;
    kd_dev_region *regs = calloc(ns_, sizeof *regs);
    uint64_t *sums = calloc(ns_, sizeof *sums);
    Kdecode__V1__StateSection *secs = calloc(ns_, sizeof *secs), **secp = calloc(ns_, sizeof *secp);
    int rc = -1;
    if (!regs || !sums || !secs || !secp) {
        kd_fail(err, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < ns_; i++)
        regs[i] = (kd_dev_region){(const char *)p->state + g_layout.sects[i].offset, g_layout.sects[i].size};
    for (int attempt = 0; attempt < 2; attempt++) {
        const double t0 = now_s();
        kd_nccl_link *l = kd_nccl_acquire_to(g_nccl, p->target, nccl_connect_rpc, cl, err);
        kd_metrics_set(g_srv.metrics, KD_G_NCCL_LINKS, kd_nccl_count(g_nccl));
        if (!l) goto out;
        const double t1 = now_s();
        if (kd_nccl_sum64(g_nccl, l, regs, (int)ns_, sums, err)) {
            kd_nccl_release(g_nccl, l, 0);
            goto out;
        }
        tm->link = t1 - t0, tm->sum64 = now_s() - t1;
        Kdecode__V1__HandoffHeader hd = KDECODE__V1__HANDOFF_HEADER__INIT;
        Kdecode__V1__StateLayout ly = KDECODE__V1__STATE_LAYOUT__INIT;
        handoff_header_fill(p, secs, secp, &ly, &hd);
        for (size_t i = 0; i < ns_; i++) secs[i].sum64 = sums[i];
        hd.transport = KDECODE__V1__HANDOFF_TRANSPORT__HANDOFF_TRANSPORT_NCCL;
        hd.nccl_comm_id = (char *)kd_nccl_link_id(l);
        const uint64_t *parts;
        const int np = kd_nccl_link_parts(l, &parts);
        kd_dev_region *send = calloc((size_t)np, sizeof *send);
        if (!send) {
            kd_nccl_release(g_nccl, l, 0);
            kd_fail(err, "out of memory");
            goto out;
        }
        cut_regions(p->state, parts, np, send);
        nccl_src src = {.m = KDECODE__V1__PUSH_STATE_REQUEST__INIT, .l = l, .regs = send, .n = np};
        src.m.msg_case = KDECODE__V1__PUSH_STATE_REQUEST__MSG_HEADER;
        src.m.header = &hd;
        kd_call_status st;
        kd_err serr = {0}, werr = {0};
        const int crc = kd_client_client_stream(cl, "/kdecode.v1.Decoder/PushState", nccl_next, &src, 120, resp, resp_len,
                                                &st, &serr);
        /* the send completes only if the decode worker posted its receive: wait for it after an
         * acceptance; after a refusal the link is aborted below, which ends the send */
        const int accepted = crc == 0 && st.code == KD_STATUS_OK;
        const int waited = accepted && src.sent && !src.err.msg[0] ? kd_nccl_wait(g_nccl, l, &werr) : -1;
        tm->xfer = now_s() - src.t_send;
        free(src.buf), free(send);
        const int ok = accepted && waited == 0;
        kd_nccl_release(g_nccl, l, !ok); /* a link left with a send or receive pending is of no use */
        rc = 0;
        if (ok) {
            *code = KD_STATUS_OK;
            break;
        }
        free(*resp), *resp = NULL, *resp_len = 0;
        if (crc == 0 && st.code == KD_STATUS_FAILED_PRECONDITION && strstr(st.details, "NCCL communicator") &&
            attempt == 0)
            continue; /* the peer dropped the link (idle, restarted): connect anew */
        if (crc) {
            *code = KD_STATUS_UNAVAILABLE;
            snprintf(msg, len, "decode worker %.200s: %.300s", p->target, src.err.msg[0] ? src.err.msg : serr.msg);
        } else if (st.code != KD_STATUS_OK) {
            *code = st.code;
            snprintf(msg, len, "decode worker %.200s: %.300s", p->target, st.details);
        } else {
            *code = KD_STATUS_UNAVAILABLE;
            snprintf(msg, len, "decode worker %.200s: the NCCL send did not complete: %.250s", p->target,
                     src.err.msg[0] ? src.err.msg : werr.msg);
        }
        break;
    }
out:
    free(regs), free(sums), free(secs), free(secp);
    return rc;
}

/* ------------------------------------------- the NCCL transport, receiving side
 * The header names a link (NcclConnect made it); the state lands in the slot's device memory
 * by ncclRecv; the link pool's thread reports the completion, the sections' sum64 are checked
 * on the device, and the push is answered. Until then the slot is never released: a broken
 * stream or an error first cancels the receive (which aborts the link, so nothing writes into
 * the slot any more), and the completion drops the handoff. */

/* The state is in the slot and verified: the handoff becomes claimable. how: the log line's
 * end (the transport's details). */
static void push_ready(push_call *p, const char *how) {
    Kdecode__V1__PushStateResponse r = KDECODE__V1__PUSH_STATE_RESPONSE__INIT;
    pthread_mutex_lock(&g_srv.mu);
    handoff *h = p->h;
    h->ready = 1;
    h->push = NULL;
    h->expires = now_s() + g_srv.o.handoff_lease_seconds;
    r.handoff_id = h->id;
    r.bytes_received = p->received;
    r.lease_seconds = g_srv.o.handoff_lease_seconds;
    grpc_byte_buffer *reply = pack_bb(&r.base);
    p->h = NULL;
    pthread_mutex_unlock(&g_srv.mu);
    kd_metrics_add(g_srv.metrics, KD_C_HANDOFF_BYTES, p->received);
    kd_metrics_observe(g_srv.metrics, KD_H_HANDOFF, now_s() - p->t0);
    logf_("handoff-ready", "id=%s slot=%d bytes=%" PRIu64 " in %.6f s%s", r.handoff_id, h->slot, p->received,
          now_s() - p->t0, how);
    push_finish(p, KD_STATUS_OK, "", -1, reply);
}

/* The receive ended (on the link pool's thread, the link still held). */
static int push_nccl_done(void *ctx, kd_nccl_link *l, int ok, const char *why) {
    push_call *p = ctx;
    char msg[512] = "";
    int code = KD_STATUS_OK, broken = 0;
    pthread_mutex_lock(&p->mu);
    p->job = NULL;
    pthread_mutex_unlock(&p->mu);
    p->t_landed = now_s();
    p->t_gpu = ok ? kd_nccl_link_gpu_seconds(l) : -1.0;
    if (!ok) {
        code = KD_STATUS_UNAVAILABLE;
        snprintf(msg, sizeof msg, "the state transfer over NCCL failed: %.400s", why);
    } else {
        uint64_t *sums = malloc(g_layout.n * sizeof *sums);
        kd_err err;
        if (!sums || kd_nccl_sum64(g_nccl, l, p->regs, (int)g_layout.n, sums, &err)) {
            code = KD_STATUS_INTERNAL, broken = 1;
            snprintf(msg, sizeof msg, "checking the state: %.400s", sums ? err.msg : "out of memory");
        }
        for (size_t i = 0; code == KD_STATUS_OK && i < g_layout.n; i++)
            if (sums[i] != p->sects[i].xxh3) {
                code = KD_STATUS_DATA_LOSS;
                snprintf(msg, sizeof msg, "checksum mismatch in state section %s", g_layout.names[i]);
            }
        free(sums);
        if (code == KD_STATUS_OK) p->received = g_layout.total;
    }
    if (p->finished) { /* already answered (a broken stream or a protocol error) */
        pthread_mutex_lock(&g_srv.mu);
        if (p->h) {
            p->h->push = NULL;
            handoff_drop_locked(p->h, msg[0] ? msg : "the push ended before its state landed");
            p->h = NULL;
        }
        pthread_mutex_unlock(&g_srv.mu);
    } else if (code == KD_STATUS_OK) {
        char how[200];
        const double t = now_s();
        snprintf(how, sizeof how,
                 " over NCCL (receive posted at %.6f s, landed %.6f s later (%.6f s on the GPU), checked %.6f s later)",
                 p->t_posted - p->t0, p->t_landed - p->t_posted, p->t_gpu, t - p->t_landed);
        push_ready(p, how);
    } else {
        push_finish(p, code, msg, -1, NULL);
    }
    push_unref(p);
    return broken;
}

/* A header with transport NCCL, after handoff_begin reserved the slot: posts the receive. */
static int push_nccl_begin(push_call *p, const Kdecode__V1__HandoffHeader *hd, char *msg, size_t len) {
    if (!g_nccl) return snprintf(msg, len, "this worker takes no NCCL handoffs (%s)", g_nccl_off), KD_STATUS_FAILED_PRECONDITION;
    p->nccl = 1;
    for (size_t i = 0; i < g_layout.n; i++) p->sects[i].xxh3 = hd->layout->sections[i]->sum64;
    if (!(p->regs = calloc(g_layout.n, sizeof *p->regs))) return snprintf(msg, len, "out of memory"), KD_STATUS_INTERNAL;
    kd_err err;
    kd_dev_region recv[64];
    const int n = kd_backend_state_regions(g_srv.be, p->h->slot, recv, 64, &err);
    if (n < 1 || section_regions(recv, n, p->regs) < 0)
        return snprintf(msg, len, "the slot's device memory does not match the state layout: %.300s",
                        n < 0 ? err.msg : "other regions"), KD_STATUS_INTERNAL;
    int code = KD_STATUS_OK;
    p->t_posted = now_s();
    pthread_mutex_lock(&p->mu);
    p->refs++; /* the receive's, until push_nccl_done */
    p->job = kd_nccl_recv_async(g_nccl, hd->nccl_comm_id, recv, n, push_nccl_done, p, &code, msg, len);
    const int posted = p->job != NULL;
    if (!posted) p->refs--;
    pthread_mutex_unlock(&p->mu);
    return posted ? KD_STATUS_OK : code;
}

/* Cancels a running NCCL receive; whether there was one (its completion drops the handoff). */
static int push_nccl_cancel(push_call *p) {
    pthread_mutex_lock(&p->mu);
    kd_nccl_job *j = p->job;
    if (j) kd_nccl_cancel(g_nccl, j);
    pthread_mutex_unlock(&p->mu);
    return j != NULL;
}

/* ------------------------------------------------------------- accepting new calls */

typedef struct acceptor {
    tag t;
    grpc_call *call;
    grpc_call_details details;
    grpc_metadata_array md;
} acceptor;

static void accept_next(acceptor *a);

static int method_is(const grpc_call_details *d, const char *m) {
    size_t n = strlen(m);
    return GRPC_SLICE_LENGTH(d->method) == n && !memcmp(GRPC_SLICE_START_PTR(d->method), m, n);
}

static void accepted(void *obj, int ok) {
    acceptor *a = obj;
    if (!ok) { /* shutting down */
        grpc_call_details_destroy(&a->details);
        grpc_metadata_array_destroy(&a->md);
        free(a);
        return;
    }
    grpc_call *call = a->call;
    grpc_call_details *d = &a->details;
    const int decode = strcmp(g_srv.o.role, "prefill") != 0, prefill = strcmp(g_srv.o.role, "decode") != 0;
    if (decode && method_is(d, "/kdecode.v1.Decoder/Generate")) gen_start(call);
    else if (decode && method_is(d, "/kdecode.v1.Decoder/PushState")) push_start(call);
    else if (prefill && method_is(d, "/kdecode.v1.Prefiller/Prefill")) prefill_start(call);
    else if (decode && method_is(d, "/kdecode.v1.Decoder/NcclConnect")) unary_start(call, U_NCCL);
    else if (method_is(d, "/kdecode.v1.Decoder/Abort")) unary_start(call, U_ABORT);
    else if (method_is(d, "/kdecode.v1.Decoder/GetLoads")) unary_start(call, U_LOADS);
    else if (method_is(d, "/kdecode.v1.Decoder/GetServerInfo")) unary_start(call, U_INFO);
    else if (method_is(d, "/grpc.health.v1.Health/Check")) unary_start(call, U_HEALTH);
    else if (method_is(d, "/grpc.health.v1.Health/Watch")) watch_start(call);
    else if (method_is(d, "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo") ||
             method_is(d, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"))
        refl_start(call);
    else {
        char m[300];
        snprintf(m, sizeof m, "unknown method %.*s", (int)GRPC_SLICE_LENGTH(d->method),
                 (const char *)GRPC_SLICE_START_PTR(d->method));
        reply_status(call, 0, GRPC_STATUS_UNIMPLEMENTED, m, -1);
    }
    grpc_call_details_destroy(&a->details);
    grpc_metadata_array_destroy(&a->md);
    accept_next(a);
}

static void accept_next(acceptor *a) {
    a->t = (tag){accepted, a};
    a->call = NULL;
    grpc_call_details_init(&a->details);
    grpc_metadata_array_init(&a->md);
    if (grpc_server_request_call(g_srv.gs, &a->call, &a->details, &a->md, g_srv.cq, g_srv.cq, &a->t) != GRPC_CALL_OK) {
        grpc_call_details_destroy(&a->details);
        grpc_metadata_array_destroy(&a->md);
        free(a);
    }
}

static tag g_shutdown_tag;
static atomic_int g_shutdown_done;

static void shutdown_done(void *obj, int ok) {
    (void)obj, (void)ok;
    atomic_store(&g_shutdown_done, 1);
}

static void *cq_main(void *arg) {
    (void)arg;
    for (;;) {
        grpc_event ev = grpc_completion_queue_next(g_srv.cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        if (ev.type == GRPC_QUEUE_SHUTDOWN) break;
        if (ev.type != GRPC_OP_COMPLETE) continue;
        tag *t = ev.tag;
        t->fn(t->obj, ev.success);
    }
    return NULL;
}

/* ----------------------------------------------------------------------- start-up */

static char *read_file(const char *path, kd_err *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return kd_fail(err, "%s: %s", path, strerror(errno)), NULL;
    char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n + 4096 + 1 > cap) {
            cap = (n + 4096 + 1) * 2;
            if (cap > (64u << 20)) break;
            char *p = realloc(buf, cap);
            if (!p) break;
            buf = p;
        }
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
        if (got == 0) break;
    }
    fclose(f);
    if (!buf) return kd_fail(err, "%s: cannot read", path), NULL;
    buf[n] = 0;
    return buf;
}

static grpc_server_credentials *server_creds(const serve_opts *o, kd_err *err) {
    if (!o->tls_cert) return grpc_insecure_server_credentials_create();
    char *cert = read_file(o->tls_cert, err), *key = cert ? read_file(o->tls_key, err) : NULL;
    char *ca = key && o->tls_client_ca ? read_file(o->tls_client_ca, err) : NULL;
    grpc_server_credentials *c = NULL;
    if (cert && key && (!o->tls_client_ca || ca)) {
        grpc_ssl_pem_key_cert_pair pair = {.private_key = key, .cert_chain = cert};
        c = grpc_ssl_server_credentials_create_ex(
            ca, &pair, 1,
            ca ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE,
            NULL);
        if (!c) kd_fail(err, "TLS: cannot use %s / %s", o->tls_cert, o->tls_key);
    }
    free(cert), free(key), free(ca);
    return c;
}

static volatile sig_atomic_t g_signals;

static void on_signal(int sig) {
    (void)sig;
    if (++g_signals >= 2) {
        static const char m[] = "kdecode: second signal, exiting now\n";
        (void)!write(2, m, sizeof m - 1);
        _exit(1);
    }
}

static int load_model(serve_opts *o) {
    kd_err err;
    double t0 = now_s();
    logf_("loading", "model=%s", o->model_dir);
    if (!(g_srv.model = kd_model_open(o->model_dir, &err))) return logf_("load-failed", "%s", err.msg), -1;
    const kd_config *c = &g_srv.model->config;
    logf_("loading", "config D=%d L=%d H=%d HV=%d K=%d V=%d vocab=%d; converting weights", c->hidden, c->n_layers,
          c->n_heads, c->n_v_heads, c->head_k, c->head_v, c->vocab);
    if (!(g_srv.be = kd_backend_create(o->backend, o->act_bf16, &err)) ||
        kd_backend_load(g_srv.be, c, &g_srv.model->tensors, &err))
        return logf_("load-failed", "%s", err.msg), -1;
    logf_("backend", "%s (asked: %s; CUDA devices: %d)", g_srv.be->ops->name, o->backend, kd_cuda_device_count());
    const char *lt_table = getenv("KDECODE_CUDA_LT_TABLE");
    if (lt_table && *lt_table && !strcmp(g_srv.be->ops->name, "cuda"))
        logf_("backend", "cuBLASLt configurations from KDECODE_CUDA_LT_TABLE=%s%s", lt_table,
              o->act_bf16 ? "" : " (read; unused with fp32 activations)");
    o->eng.max_queue += o->eng.max_seqs; /* the engine's queue also holds the not yet admitted */
    if (!(g_srv.eng = kd_engine_create(g_srv.be, g_srv.model->fingerprint, &o->eng, on_engine_event, NULL, &err)))
        return logf_("load-failed", "%s", err.msg), -1;
    o->eng.max_queue -= o->eng.max_seqs;
    {
        const int32_t lazy = kd_cuda_lazy_records(g_srv.be);
        char lz[96] = "";
        if (lazy > 0)
            snprintf(lz, sizeof lz, "; lazy checkpoint: records for %d tokens a slot and layer (KDECODE_CUDA_LAZY)",
                     lazy);
        logf_("slots", "%d request slots of %.1f MiB (state, conv windows and verify records)%s", g_srv.be->n_slots,
              (double)g_srv.be->slot_bytes / (1 << 20), lz);
    }
    if (o->warm_graphs > 0 && !strcmp(g_srv.be->ops->name, "cuda")) {
        const double tw = now_s();
        const int n = kd_cuda_warm_graphs(g_srv.be, o->eng.max_seqs, o->warm_graphs, &err);
        if (n < 0) return logf_("load-failed", "%s (--warm-graphs 0 captures on first use instead)", err.msg), -1;
        logf_("graphs", "%d decode step shapes captured in %.2f s (up to %d requests, windows up to %d tokens)", n,
              now_s() - tw, o->eng.max_seqs, 1 + o->eng.max_spec);
    }
    if (layout_init()) return logf_("load-failed", "out of memory"), -1;
    const int on_gpu = !strcmp(g_srv.be->ops->name, "cuda");
    if (!strcmp(o->handoff_transport, "nccl") && !on_gpu)
        return logf_("load-failed", "--handoff-transport nccl: the backend is %s (no usable GPU)", g_srv.be->ops->name), -1;
    if (strcmp(o->handoff_transport, "grpc") && !on_gpu) g_nccl_off = "the backend keeps states in host memory";
    if (strcmp(o->handoff_transport, "grpc") && on_gpu) {
        kd_nccl_opts no = {.device = 0, .max_links = o->nccl_max_links, .idle_seconds = o->nccl_idle_seconds,
                           .connect_seconds = o->nccl_connect_seconds,
                           .transfer_seconds = o->handoff_lease_seconds > 10 ? o->handoff_lease_seconds : 10,
                           .warm_bytes = (size_t)g_layout.total};
        if (!(g_nccl = kd_nccl_create(&no, &err))) {
            if (!strcmp(o->handoff_transport, "nccl")) return logf_("load-failed", "NCCL transport: %s", err.msg), -1;
            g_nccl_off = "NCCL is not usable here";
            logf_("nccl-off", "states travel over gRPC: %s", err.msg);
        } else {
            logf_("nccl", "handoff transport %s: NCCL %d on device 0", o->handoff_transport, kd_nccl_version());
        }
    }
    g_srv.lim = (kd_api_limits){.vocab = c->vocab,
                                .eos_id = g_srv.model->eos_token_id < c->vocab ? g_srv.model->eos_token_id : -1,
                                .max_model_len = o->eng.max_model_len, .max_spec = o->eng.max_spec,
                                .default_spec = o->default_spec, .max_prompt = o->max_prompt, .max_stop_ids = 64};
    size_t cap = 16;
    while (cap < 2 * (size_t)(o->eng.max_seqs + o->eng.max_queue) + 2) cap *= 2;
    g_srv.idmap_cap = cap;
    if (!(g_srv.idmap = calloc(cap, sizeof *g_srv.idmap))) return logf_("load-failed", "out of memory"), -1;
    logf_("loaded", "model=%s fingerprint=%016" PRIx64 " backend=%s slots=%d in %.2f s", o->model_dir,
          g_srv.model->fingerprint, g_srv.be->ops->name, o->eng.max_seqs, now_s() - t0);
    return 0;
}

int kd_serve_main(int argc, char **argv) {
    serve_opts *o = &g_srv.o;
    if (parse_opts(argc, argv, o)) return 2;
    pthread_mutex_init(&g_srv.mu, NULL);
    pthread_cond_init(&g_srv.cv, NULL);
    if (getrandom(&g_srv.id_tag, sizeof g_srv.id_tag, GRND_NONBLOCK) != (ssize_t)sizeof g_srv.id_tag) {
        struct timespec ts; /* no entropy yet (never waited for): the clock and the pid still separate workers */
        clock_gettime(CLOCK_REALTIME, &ts);
        g_srv.id_tag = (uint32_t)ts.tv_nsec ^ (uint32_t)ts.tv_sec * 2654435761u ^ (uint32_t)getpid() << 16;
    }
    atomic_store(&g_srv.state, ST_LOADING);
    g_srv.metrics = kd_metrics_create();
    if (!g_srv.metrics) return fprintf(stderr, "kdecode serve: out of memory\n"), 1;
    kd_metrics_set(g_srv.metrics, KD_G_SLOTS_TOTAL, o->eng.max_seqs);
    kd_err err;
    int rc = 1;
    if (o->metrics_listen) {
        int port = 0;
        if (!(g_srv.metrics_http = kd_metrics_http_start(g_srv.metrics, o->metrics_listen, &port, &err))) {
            logf_("error", "metrics: %s", err.msg);
            kd_metrics_free(g_srv.metrics);
            return 1;
        }
        logf_("metrics", "listening on %s (port %d)", o->metrics_listen, port);
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    grpc_init();
    grpc_arg args[] = {
        {GRPC_ARG_INTEGER, GRPC_ARG_ALLOW_REUSEPORT, {.integer = 0}},
        {GRPC_ARG_INTEGER, GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, {.integer = o->max_message_bytes}},
        {GRPC_ARG_INTEGER, GRPC_ARG_MAX_SEND_MESSAGE_LENGTH, {.integer = 64 << 20}},
        /* routers ping idle connections: accept pings every 10 s, without calls, no strikes */
        {GRPC_ARG_INTEGER, GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, {.integer = 10000}},
        {GRPC_ARG_INTEGER, GRPC_ARG_HTTP2_MAX_PING_STRIKES, {.integer = 0}},
        {GRPC_ARG_INTEGER, GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, {.integer = 1}},
        {GRPC_ARG_INTEGER, GRPC_ARG_KEEPALIVE_TIME_MS, {.integer = 60000}},
        {GRPC_ARG_INTEGER, GRPC_ARG_KEEPALIVE_TIMEOUT_MS, {.integer = 20000}},
        /* the state handoff is a bulk stream: large HTTP/2 frames, a deep receive window */
        {GRPC_ARG_INTEGER, GRPC_ARG_HTTP2_MAX_FRAME_SIZE, {.integer = (1 << 24) - 1}},
        {GRPC_ARG_INTEGER, GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, {.integer = 16 << 20}},
        /* that window as set, not re-estimated by BDP pings while a state streams in */
        {GRPC_ARG_INTEGER, GRPC_ARG_HTTP2_BDP_PROBE, {.integer = 0}},
    };
    grpc_channel_args cargs = {.num_args = sizeof args / sizeof args[0], .args = args};
    g_srv.cq = grpc_completion_queue_create_for_next(NULL);
    g_srv.gs = grpc_server_create(&cargs, NULL);
    grpc_server_register_completion_queue(g_srv.gs, g_srv.cq, NULL);
    grpc_server_credentials *creds = server_creds(o, &err);
    int port = creds ? grpc_server_add_http2_port(g_srv.gs, o->listen, creds) : 0;
    if (creds) grpc_server_credentials_release(creds);
    if (port <= 0) {
        logf_("error", "%s", creds ? "cannot listen (address in use or invalid)" : err.msg);
        fprintf(stderr, "kdecode serve: cannot listen on %s\n", o->listen);
        grpc_server_destroy(g_srv.gs);
        grpc_completion_queue_shutdown(g_srv.cq);
        while (grpc_completion_queue_next(g_srv.cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type != GRPC_QUEUE_SHUTDOWN) {
        }
        grpc_completion_queue_destroy(g_srv.cq);
        grpc_shutdown();
        kd_metrics_http_stop(g_srv.metrics_http);
        kd_metrics_free(g_srv.metrics);
        return 1;
    }
    grpc_server_start(g_srv.gs);
    g_srv.cq_threads = calloc((size_t)o->cq_threads, sizeof *g_srv.cq_threads);
    for (int i = 0; i < o->cq_threads; i++) pthread_create(&g_srv.cq_threads[i], NULL, cq_main, NULL);
    for (int i = 0; i < 4 * o->cq_threads + 4; i++) {
        acceptor *a = calloc(1, sizeof *a);
        if (a) accept_next(a);
    }
    /* the port first (scripts read it), then the log line */
    printf("{\"listening\":\"%s\",\"port\":%d,\"tls\":%s}\n", o->listen, port, o->tls_cert ? "true" : "false");
    fflush(stdout);
    logf_("listening", "address=%s port=%d tls=%s mtls=%s", o->listen, port, o->tls_cert ? "yes" : "no",
          o->tls_client_ca ? "yes" : "no");
    if (getenv("KDECODE_REEXEC_FAILED")) { /* worker/main.c: quiet_blas_threads */
        logf_("blas_threads", "could not execute itself again (%s): OpenBLAS's helper threads keep spinning "
              "after each call; set OPENBLAS_THREAD_TIMEOUT=4 in the environment to stop that",
              getenv("KDECODE_REEXEC_FAILED"));
        unsetenv("KDECODE_REEXEC_FAILED");
    }

    if (load_model(o) == 0 && !g_signals) {
        if (strcmp(g_srv.o.role, "prefill")) /* takes handoffs */
            g_srv.pool_target = g_srv.o.eng.max_seqs < o->handoff_ready_slots ? (int)g_srv.o.eng.max_seqs
                                                                             : o->handoff_ready_slots;
        pthread_create(&g_srv.engine_thread, NULL, engine_main, NULL);
        g_srv.engine_started = 1;
        set_state(ST_SERVING);
        logf_("ready", "serving kdecode.v1.Decoder");
        for (int tick = 0; !g_signals; tick++) {
            usleep(50000);
            handoff_expire();
            if (g_nccl && tick % 40 == 0) {
                kd_nccl_reap(g_nccl);
                kd_metrics_set(g_srv.metrics, KD_G_NCCL_LINKS, kd_nccl_count(g_nccl));
            }
        }
        rc = 0;
    }
    /* drain: refuse new requests, let the running ones finish, and with them whatever was
     * already handed to this worker: Prefill requests on their way to a decode worker, and
     * handoffs arriving or waiting for their claim (each bounded by its lease) */
    set_state(ST_DRAINING);
    const double t_drain = now_s();
    pthread_mutex_lock(&g_srv.mu);
    logf_("draining", "running=%d prefills=%d handoffs=%d grace=%.1f s", g_srv.n_live, g_srv.n_prefill,
          g_srv.n_handoffs, o->drain_seconds);
    while ((g_srv.n_live > 0 || g_srv.n_streams > 0 || g_srv.n_prefill > 0 || g_srv.n_replies > 0 ||
            g_srv.n_handoffs > 0) &&
           now_s() - t_drain < o->drain_seconds) {
        pthread_mutex_unlock(&g_srv.mu);
        usleep(20000);
        handoff_expire();
        pthread_mutex_lock(&g_srv.mu);
    }
    /* Health.Watch streams get their NOT_SERVING before the calls are cancelled: a send still in flight
     * then is lost, and with nothing running the drain above ends at once (bounded: a watcher that
     * stopped reading cannot hold the stop) */
    for (const double t_w = now_s(); now_s() - t_w < 1.0;) {
        int sending = 0;
        for (watch_call *w = g_srv.watchers; w; w = w->next) sending |= w->sending;
        if (!sending) break;
        pthread_mutex_unlock(&g_srv.mu);
        usleep(5000);
        pthread_mutex_lock(&g_srv.mu);
    }
    if (g_srv.n_prefill > 0) logf_("drain-timeout", "%d Prefill requests cut", g_srv.n_prefill);
    if (g_srv.n_handoffs > 0) logf_("drain-timeout", "%d handoffs not claimed", g_srv.n_handoffs);
    if (g_srv.n_live > 0) {
        logf_("drain-timeout", "aborting %d requests", g_srv.n_live);
        cmd *c = calloc(1, sizeof *c);
        if (c) c->kind = CMD_ABORT_ALL, enqueue_locked(c);
    } else if (g_srv.n_streams > 0) {
        logf_("drain-timeout", "%d finished requests still sending their last tokens", g_srv.n_streams);
    }
    pthread_mutex_unlock(&g_srv.mu);
    set_state(ST_STOPPING);
    g_shutdown_tag = (tag){shutdown_done, NULL};
    grpc_server_shutdown_and_notify(g_srv.gs, g_srv.cq, &g_shutdown_tag);
    grpc_server_cancel_all_calls(g_srv.gs);
    while (!atomic_load(&g_shutdown_done)) usleep(10000);
    /* every call object gone (cancelled calls abort their requests through the engine) */
    pthread_mutex_lock(&g_srv.mu);
    const double t_calls = now_s();
    while (g_srv.n_calls > 0 && now_s() - t_calls < 10) {
        pthread_mutex_unlock(&g_srv.mu);
        usleep(10000);
        pthread_mutex_lock(&g_srv.mu);
    }
    if (g_srv.n_calls > 0) logf_("shutdown", "%d calls still open", g_srv.n_calls);
    pthread_mutex_unlock(&g_srv.mu);
    kd_nccl_destroy(g_nccl); /* cancels transfers still waiting: their handoffs are dropped */
    g_nccl = NULL;
    pthread_mutex_lock(&g_srv.mu);
    while (g_srv.handoffs) handoff_drop_locked(g_srv.handoffs, "shutting down");
    g_srv.engine_stop = 1;
    pthread_cond_broadcast(&g_srv.cv);
    pthread_mutex_unlock(&g_srv.mu);
    if (g_srv.engine_started) pthread_join(g_srv.engine_thread, NULL);
    grpc_server_destroy(g_srv.gs);
    grpc_completion_queue_shutdown(g_srv.cq);
    for (int i = 0; i < o->cq_threads; i++) pthread_join(g_srv.cq_threads[i], NULL);
    grpc_completion_queue_destroy(g_srv.cq);
    free(g_srv.cq_threads);
    while (g_srv.cmd_head) { /* never run (the engine stopped after the calls ended) */
        cmd *c = g_srv.cmd_head;
        g_srv.cmd_head = c->next;
        if (c->bb) grpc_byte_buffer_destroy(c->bb);
        free(c->data);
        if (!c->sync) free(c);
    }
    kd_engine_free(g_srv.eng);
    kd_backend_free(g_srv.be);
    kd_model_close(g_srv.model);
    free(g_srv.idmap);
    state_pool_free();
    peer_clients_close();
    layout_free();
    /* up to 10 s more where a peer stopped reading what this worker sent: the blocked write started
     * gRPC core's TCP backup poller, which polls 10 s at a time on an executor thread that this
     * joins (deploy/k8s budgets the 10 s in each grace period) */
    grpc_shutdown_blocking();
    kd_metrics_http_stop(g_srv.metrics_http);
    kd_metrics_free(g_srv.metrics);
    logf_("stopped", "exit %d after %.2f s of drain", rc, now_s() - t_drain);
    return rc;
}
