/* stream_probe: how fast gRPC alone streams a handoff-sized payload on loopback, with the
 * worker's channel arguments, and whether more streams help.
 *
 *   bazel run //tests/bench/handoff:stream_probe -- [REPS] [--hash] [--spin]
 *
 * A child process runs a gRPC C-core server that reads client-streaming calls of 1 MiB
 * messages (copying each into a buffer, as the decode worker copies a chunk into a slot);
 * the parent sends 42.8 MiB (the kimi-linear-48b-state state) through kd_client, split over
 * 1 stream, 2 streams on one channel, 2 on two channels or 3 on one, the configurations
 * alternated REPS times (default 15) after 2 warm-ups; it prints the median, min and max
 * of each. --hash: the sender hashes each chunk with XXH3 before handing it over (as the
 * prefill worker does); --spin: a thread of the sender spins in sched_yield (as an idle
 * OpenBLAS helper thread does after a call). A probe, not a test. */
#define _GNU_SOURCE
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/time.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include "worker/client.h"

#define TOTAL 44892160u /* bytes of the kimi-linear-48b-state state */
#define CHUNK (1u << 20)
#define MAX_REPS 200

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* ------------------------------------------------------------------ the server (child) */

typedef struct call {
    grpc_call *call;
    grpc_call_details details;
    grpc_metadata_array md;
    grpc_byte_buffer *bb;
    int state; /* 0 requested, 1 reading, 2 answering */
} call;

static grpc_server *g_server;
static grpc_completion_queue *g_cq;
static uint8_t *g_dst;

static void request_one(void) {
    call *c = calloc(1, sizeof *c);
    if (!c) exit(1);
    grpc_call_details_init(&c->details);
    grpc_metadata_array_init(&c->md);
    grpc_server_request_call(g_server, &c->call, &c->details, &c->md, g_cq, g_cq, c);
}

static void read_one(call *c) {
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &c->bb;
    c->state = 1;
    if (grpc_call_start_batch(c->call, &op, 1, c, NULL) != GRPC_CALL_OK) exit(1);
}

static void free_call(call *c) {
    grpc_call_unref(c->call);
    grpc_call_details_destroy(&c->details);
    grpc_metadata_array_destroy(&c->md);
    free(c);
}

static void serve(const char *addr) {
    grpc_init();
    grpc_arg args[] = {
        {GRPC_ARG_INTEGER, GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, {.integer = 64 << 20}},
        {GRPC_ARG_INTEGER, GRPC_ARG_HTTP2_MAX_FRAME_SIZE, {.integer = (1 << 24) - 1}},
        {GRPC_ARG_INTEGER, GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, {.integer = 16 << 20}},
        {GRPC_ARG_INTEGER, GRPC_ARG_HTTP2_BDP_PROBE, {.integer = 0}},
    };
    grpc_channel_args ca = {sizeof args / sizeof args[0], args};
    g_cq = grpc_completion_queue_create_for_next(NULL);
    g_server = grpc_server_create(&ca, NULL);
    grpc_server_register_completion_queue(g_server, g_cq, NULL);
    grpc_server_credentials *cr = grpc_insecure_server_credentials_create();
    if (!grpc_server_add_http2_port(g_server, addr, cr)) exit(1);
    grpc_server_credentials_release(cr);
    grpc_server_start(g_server);
    if (!(g_dst = malloc(CHUNK))) exit(1);
    request_one();
    for (;;) {
        grpc_event ev = grpc_completion_queue_next(g_cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        if (ev.type != GRPC_OP_COMPLETE) continue;
        call *c = ev.tag;
        if (c->state == 0) {
            request_one();
            read_one(c);
        } else if (c->state == 1 && !ev.success) {
            free_call(c);
        } else if (c->state == 1 && c->bb) {
            grpc_byte_buffer_reader r;
            grpc_slice s;
            size_t off = 0;
            if (!grpc_byte_buffer_reader_init(&r, c->bb)) exit(1);
            while (grpc_byte_buffer_reader_next(&r, &s)) {
                size_t n = GRPC_SLICE_LENGTH(s);
                if (n > CHUNK - off) n = CHUNK - off;
                memcpy(g_dst + off, GRPC_SLICE_START_PTR(s), n);
                off += n;
                grpc_slice_unref(s);
            }
            grpc_byte_buffer_reader_destroy(&r);
            grpc_byte_buffer_destroy(c->bb);
            c->bb = NULL;
            read_one(c);
        } else if (c->state == 1) { /* end of the stream: an empty answer */
            grpc_op ops[3];
            memset(ops, 0, sizeof ops);
            grpc_slice e = grpc_empty_slice();
            grpc_byte_buffer *reply = grpc_raw_byte_buffer_create(&e, 1);
            ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
            ops[1].op = GRPC_OP_SEND_MESSAGE;
            ops[1].data.send_message.send_message = reply;
            ops[2].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
            ops[2].data.send_status_from_server.status = GRPC_STATUS_OK;
            c->state = 2;
            if (grpc_call_start_batch(c->call, ops, 3, c, NULL) != GRPC_CALL_OK) exit(1);
            grpc_byte_buffer_destroy(reply);
        } else {
            free_call(c);
        }
    }
}

/* ------------------------------------------------------------------ the client (parent) */

static int g_hash;
static volatile int g_stop;

typedef struct job {
    kd_client *cl;
    const uint8_t *src;
    size_t len, sent;
    uint8_t pre[KD_BYTES_FIELD_HEAD];
    double t_end;
    int failed;
} job;

/* A chunk message as the prefill worker writes it: field 2 (bytes), its length, the bytes. */
static int next_chunk(void *ctx, kd_msg *m) {
    job *j = ctx;
    if (!m) return 0; /* a wait */
    if (j->sent == j->len) return 0;
    const size_t n = j->len - j->sent < CHUNK ? j->len - j->sent : CHUNK;
    if (g_hash) {
        volatile XXH64_hash_t h = XXH3_64bits(j->src + j->sent, n);
        (void)h;
    }
    const size_t k = kd_client_bytes_field_head(j->pre, 2, n);
    *m = (kd_msg){.head = j->pre, .head_len = k, .tail = j->src + j->sent, .tail_len = n};
    j->sent += n;
    return 1;
}

static void *run_job(void *arg) {
    job *j = arg;
    uint8_t *resp = NULL;
    size_t rl = 0;
    kd_call_status st;
    kd_err err;
    if (kd_client_client_stream(j->cl, "/probe/Push", next_chunk, j, 60, &resp, &rl, &st, &err) || st.code) j->failed = 1;
    free(resp);
    j->t_end = now();
    return NULL;
}

static void *spin(void *arg) {
    (void)arg;
    while (!g_stop) sched_yield();
    return NULL;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    int reps = 15, spinning = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--hash")) g_hash = 1;
        else if (!strcmp(argv[i], "--spin")) spinning = 1;
        else if (atoi(argv[i]) > 0 && atoi(argv[i]) <= MAX_REPS) reps = atoi(argv[i]);
        else return fprintf(stderr, "usage: stream_probe [REPS <= %d] [--hash] [--spin]\n", MAX_REPS), 2;
    }
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", 40000 + (int)(getpid() % 20000));
    const pid_t child = fork();
    if (child < 0) return 1;
    if (child == 0) {
        serve(addr);
        return 0;
    }
    usleep(300000);
    grpc_init();
    kd_err err;
    uint8_t *src = malloc(TOTAL);
    kd_client *c1 = kd_client_connect(addr, NULL, &err), *c2 = kd_client_connect(addr, NULL, &err);
    if (!src || !c1 || !c2) return fprintf(stderr, "stream_probe: setup failed\n"), 1;
    for (size_t i = 0; i < TOTAL; i++) src[i] = (uint8_t)((i * 2654435761u) >> 13);
    pthread_t spinner;
    if (spinning && pthread_create(&spinner, NULL, spin, NULL)) return 1;
    static const char *names[] = {"1 stream", "2 streams, 1 channel", "2 streams, 2 channels", "3 streams, 1 channel"};
    static double ms[4][MAX_REPS];
    int failed = 0;
    for (int r = 0; r < reps + 2; r++)
        for (int cfg = 0; cfg < 4; cfg++) {
            const int ns = cfg == 0 ? 1 : cfg == 3 ? 3 : 2;
            const size_t per = (TOTAL / ns + CHUNK - 1) / CHUNK * CHUNK;
            job j[3];
            pthread_t th[3];
            const double t0 = now();
            for (int s = 0; s < ns; s++) {
                const size_t off = per * (size_t)s, len = off + per > TOTAL ? TOTAL - off : per;
                j[s] = (job){.cl = cfg == 2 && s == 1 ? c2 : c1, .src = src + off, .len = len};
                if (pthread_create(&th[s], NULL, run_job, &j[s])) return 1;
            }
            double t_end = 0;
            for (int s = 0; s < ns; s++) {
                pthread_join(th[s], NULL);
                failed |= j[s].failed;
                if (j[s].t_end > t_end) t_end = j[s].t_end;
            }
            if (r >= 2) ms[cfg][r - 2] = (t_end - t0) * 1e3;
        }
    g_stop = 1;
    if (spinning) pthread_join(spinner, NULL);
    printf("42.8 MiB in 1 MiB messages over gRPC on 127.0.0.1, %d alternated repetitions%s%s\n", reps,
           g_hash ? ", XXH3 per chunk on the sender" : "", spinning ? ", a sched_yield spinner in the sender" : "");
    for (int cfg = 0; cfg < 4; cfg++) {
        qsort(ms[cfg], (size_t)reps, sizeof(double), cmp_double);
        printf("%-24s median %6.1f ms  min %6.1f  max %6.1f\n", names[cfg], ms[cfg][reps / 2], ms[cfg][0], ms[cfg][reps - 1]);
    }
    kd_client_close(c1);
    kd_client_close(c2);
    free(src);
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    if (failed) fprintf(stderr, "stream_probe: a call failed\n");
    return failed;
}
