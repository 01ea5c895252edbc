/* client.c: the gRPC C-core client behind client.h (kdctl, the prefill role).
 *
 * One channel per kd_client (insecure, TLS or mutual TLS). Every call gets its own
 * completion queue, so any number of threads can call through one client. A call runs all
 * its batches on that queue and, on every path, waits for each batch it started before it
 * releases the call: ops, byte buffers, metadata arrays, slices, call, queue
 * (shutdown + drain + destroy). Messages are raw bytes; the callers do protobuf-c. */
#include "worker/client.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>

/* Largest response accepted (GetServerInfo and token chunks are far smaller). */
#define KD_CLIENT_MAX_RECV_BYTES (64 * 1024 * 1024)
/* Largest PEM file read for TLS. */
#define KD_CLIENT_MAX_PEM_BYTES (1024 * 1024)

struct kd_client {
    grpc_channel *channel;
};

/* ---- channel ---- */

/* Reads a whole PEM file into a NUL-terminated malloc'd string. */
static char *read_pem(const char *path, const char *what, kd_err *err) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        kd_fail(err, "%s %s: %s", what, path, strerror(errno));
        return NULL;
    }
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    while (buf) {
        if (len + 1 >= cap) {
            char *nb = cap >= KD_CLIENT_MAX_PEM_BYTES ? NULL : realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
        size_t n = fread(buf + len, 1, cap - 1 - len, f);
        len += n;
        if (n == 0) break;
    }
    int bad = ferror(f);
    fclose(f);
    if (!buf) {
        kd_fail(err, "%s %s: too large or out of memory", what, path);
        return NULL;
    }
    if (bad || len == 0) {
        free(buf);
        kd_fail(err, "%s %s: %s", what, path, bad ? "read error" : "empty file");
        return NULL;
    }
    buf[len] = '\0';
    return buf;
}

kd_client *kd_client_connect(const char *target, const kd_tls_opts *tls, kd_err *err) {
    if (!target || !*target) {
        kd_fail(err, "client: empty target");
        return NULL;
    }
    const int use_tls = tls && tls->ca_file;
    if (tls && !tls->ca_file && (tls->cert_file || tls->key_file || tls->server_name)) {
        kd_fail(err, "client: TLS options need a CA file (the roots that verify the server)");
        return NULL;
    }
    if (use_tls && (!tls->cert_file) != (!tls->key_file)) {
        kd_fail(err, "client: a client certificate needs its key and the key its certificate");
        return NULL;
    }

    grpc_channel_credentials *creds = NULL;
    if (use_tls) {
        char *roots = read_pem(tls->ca_file, "CA file", err);
        if (!roots) return NULL;
        char *cert = NULL, *key = NULL;
        if (tls->cert_file) {
            cert = read_pem(tls->cert_file, "certificate", err);
            key = cert ? read_pem(tls->key_file, "key", err) : NULL;
            if (!key) {
                free(cert);
                free(roots);
                return NULL;
            }
        }
        grpc_ssl_pem_key_cert_pair pair = {.private_key = key, .cert_chain = cert};
        creds = grpc_ssl_credentials_create(roots, cert ? &pair : NULL, NULL, NULL);
        /* The credentials keep their own copies. */
        free(roots);
        free(cert);
        free(key);
    } else {
        creds = grpc_insecure_credentials_create();
    }
    if (!creds) {
        kd_fail(err, "client: cannot create channel credentials");
        return NULL;
    }

    grpc_arg args[4];
    size_t nargs = 0;
    args[nargs].type = GRPC_ARG_INTEGER;
    args[nargs].key = (char *)GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
    args[nargs].value.integer = KD_CLIENT_MAX_RECV_BYTES;
    nargs++;
    /* bulk streams (state handoff): large HTTP/2 frames and receive window */
    args[nargs].type = GRPC_ARG_INTEGER;
    args[nargs].key = (char *)GRPC_ARG_HTTP2_MAX_FRAME_SIZE;
    args[nargs].value.integer = (1 << 24) - 1;
    nargs++;
    args[nargs].type = GRPC_ARG_INTEGER;
    args[nargs].key = (char *)GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES;
    args[nargs].value.integer = 16 << 20;
    nargs++;
    if (use_tls && tls->server_name && *tls->server_name) {
        args[nargs].type = GRPC_ARG_STRING;
        args[nargs].key = (char *)GRPC_SSL_TARGET_NAME_OVERRIDE_ARG;
        args[nargs].value.string = (char *)tls->server_name;
        nargs++;
    }
    grpc_channel_args chargs = {.num_args = nargs, .args = args};

    kd_client *c = calloc(1, sizeof *c);
    if (!c) {
        grpc_channel_credentials_release(creds);
        kd_fail(err, "client: out of memory");
        return NULL;
    }
    /* Never NULL: a bad target gives a channel whose calls fail (UNAVAILABLE). */
    c->channel = grpc_channel_create(target, creds, &chargs);
    grpc_channel_credentials_release(creds);
    if (!c->channel) {
        free(c);
        kd_fail(err, "client: cannot create a channel to %s", target);
        return NULL;
    }
    return c;
}

void kd_client_close(kd_client *c) {
    if (!c) return;
    grpc_channel_destroy(c->channel);
    free(c);
}

/* ---- calls ---- */

/* State of one call: everything the batches write into, released by call_end. */
typedef struct call_ctx {
    grpc_completion_queue *cq;
    grpc_call *call;
    grpc_metadata_array initial_md, trailing_md;
    grpc_status_code status;
    grpc_slice details;
    const char *error_string; /* gpr_free */
    grpc_byte_buffer *send_bb;
} call_ctx;

enum { TAG_START = 1, TAG_STATUS = 2, TAG_RECV = 3, TAG_UNARY = 4 };

static gpr_timespec deadline_after(double timeout_s) {
    if (!(timeout_s > 0)) return gpr_inf_future(GPR_CLOCK_MONOTONIC);
    if (timeout_s > 365.0 * 86400.0) timeout_s = 365.0 * 86400.0;
    return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                        gpr_time_from_micros((int64_t)(timeout_s * 1e6), GPR_TIMESPAN));
}

static int call_begin(call_ctx *cc, kd_client *c, const char *method, const uint8_t *req, size_t req_len,
                      double timeout_s, kd_err *err) {
    memset(cc, 0, sizeof *cc);
    grpc_metadata_array_init(&cc->initial_md);
    grpc_metadata_array_init(&cc->trailing_md);
    cc->details = grpc_empty_slice();
    cc->status = GRPC_STATUS_UNKNOWN;
    cc->cq = grpc_completion_queue_create_for_next(NULL);
    if (!cc->cq) return kd_fail(err, "client: cannot create a completion queue");
    /* The method slice need only live through grpc_channel_create_call. */
    grpc_slice m = grpc_slice_from_copied_string(method);
    cc->call = grpc_channel_create_call(c->channel, NULL, GRPC_PROPAGATE_DEFAULTS, cc->cq, m, NULL,
                                        deadline_after(timeout_s), NULL);
    grpc_slice_unref(m);
    if (!cc->call) return kd_fail(err, "client: cannot create a call to %s", method);
    grpc_slice s = grpc_slice_from_copied_buffer((const char *)req, req_len);
    cc->send_bb = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    if (!cc->send_bb) return kd_fail(err, "client: cannot create the request buffer");
    return 0;
}

/* Releases everything; every started batch must have completed. */
static void call_end(call_ctx *cc) {
    if (cc->call) grpc_call_unref(cc->call);
    if (cc->send_bb) grpc_byte_buffer_destroy(cc->send_bb);
    grpc_metadata_array_destroy(&cc->initial_md);
    grpc_metadata_array_destroy(&cc->trailing_md);
    grpc_slice_unref(cc->details);
    if (cc->error_string) gpr_free((void *)cc->error_string);
    if (cc->cq) {
        grpc_completion_queue_shutdown(cc->cq);
        for (;;) {
            grpc_event ev = grpc_completion_queue_next(cc->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
            if (ev.type == GRPC_QUEUE_SHUTDOWN) break;
        }
        grpc_completion_queue_destroy(cc->cq);
    }
    memset(cc, 0, sizeof *cc);
}

static int slice_eq(grpc_slice s, const char *lit) {
    size_t n = strlen(lit);
    return GRPC_SLICE_LENGTH(s) == n && memcmp(GRPC_SLICE_START_PTR(s), lit, n) == 0;
}

/* Copies the status, its details and the retry pushback into st. */
static void fill_status(const call_ctx *cc, kd_call_status *st) {
    st->code = (int)cc->status;
    size_t n = GRPC_SLICE_LENGTH(cc->details);
    if (n >= sizeof st->details) n = sizeof st->details - 1;
    memcpy(st->details, GRPC_SLICE_START_PTR(cc->details), n);
    st->details[n] = '\0';
    if (n == 0 && cc->status != GRPC_STATUS_OK && cc->error_string)
        snprintf(st->details, sizeof st->details, "%s", cc->error_string);
    st->retry_pushback_ms = -1;
    for (size_t i = 0; i < cc->trailing_md.count; i++) {
        const grpc_metadata *md = &cc->trailing_md.metadata[i];
        if (!slice_eq(md->key, "grpc-retry-pushback-ms")) continue;
        char v[32];
        size_t vl = GRPC_SLICE_LENGTH(md->value);
        if (vl == 0 || vl >= sizeof v) continue;
        memcpy(v, GRPC_SLICE_START_PTR(md->value), vl);
        v[vl] = '\0';
        char *end;
        errno = 0;
        long ms = strtol(v, &end, 10);
        if (errno == 0 && *end == '\0' && ms >= 0) st->retry_pushback_ms = ms;
    }
}

/* Flattens a received byte buffer into malloc'd bytes (destroys the buffer). */
static int take_bytes(grpc_byte_buffer *bb, uint8_t **out, size_t *out_len, kd_err *err) {
    grpc_byte_buffer_reader r;
    if (!grpc_byte_buffer_reader_init(&r, bb)) {
        grpc_byte_buffer_destroy(bb);
        return kd_fail(err, "client: cannot read a response message");
    }
    grpc_slice s = grpc_byte_buffer_reader_readall(&r);
    grpc_byte_buffer_reader_destroy(&r);
    size_t n = GRPC_SLICE_LENGTH(s);
    uint8_t *p = malloc(n ? n : 1);
    if (p) memcpy(p, GRPC_SLICE_START_PTR(s), n);
    grpc_slice_unref(s);
    grpc_byte_buffer_destroy(bb);
    if (!p) return kd_fail(err, "client: out of memory (%zu-byte message)", n);
    *out = p;
    *out_len = n;
    return 0;
}

static void status_init(kd_call_status *st) {
    st->code = GRPC_STATUS_UNKNOWN;
    st->details[0] = '\0';
    st->retry_pushback_ms = -1;
}

int kd_client_unary(kd_client *c, const char *method, const uint8_t *req, size_t req_len, double timeout_s,
                    uint8_t **resp, size_t *resp_len, kd_call_status *st, kd_err *err) {
    *resp = NULL;
    *resp_len = 0;
    status_init(st);
    call_ctx cc;
    if (call_begin(&cc, c, method, req, req_len, timeout_s, err) != 0) {
        call_end(&cc);
        return -1;
    }
    grpc_byte_buffer *recv_bb = NULL;
    grpc_op ops[6];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = cc.send_bb;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &cc.initial_md;
    ops[4].op = GRPC_OP_RECV_MESSAGE;
    ops[4].data.recv_message.recv_message = &recv_bb;
    ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[5].data.recv_status_on_client.trailing_metadata = &cc.trailing_md;
    ops[5].data.recv_status_on_client.status = &cc.status;
    ops[5].data.recv_status_on_client.status_details = &cc.details;
    ops[5].data.recv_status_on_client.error_string = &cc.error_string;
    grpc_call_error e = grpc_call_start_batch(cc.call, ops, 6, (void *)(intptr_t)TAG_UNARY, NULL);
    if (e != GRPC_CALL_OK) {
        call_end(&cc);
        return kd_fail(err, "client: %s: start_batch failed (%d)", method, (int)e);
    }
    /* A client batch with RECV_STATUS always completes (after the deadline at the latest). */
    for (;;) {
        grpc_event ev = grpc_completion_queue_next(cc.cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
        if (ev.type == GRPC_OP_COMPLETE && (intptr_t)ev.tag == TAG_UNARY) break;
    }
    fill_status(&cc, st);
    int rc = 0;
    if (recv_bb) {
        if (st->code == GRPC_STATUS_OK) {
            rc = take_bytes(recv_bb, resp, resp_len, err);
        } else {
            grpc_byte_buffer_destroy(recv_bb);
        }
    } else if (st->code == GRPC_STATUS_OK) {
        st->code = GRPC_STATUS_INTERNAL;
        snprintf(st->details, sizeof st->details, "no response message from %s", method);
    }
    call_end(&cc);
    return rc;
}

int kd_client_server_stream(kd_client *c, const char *method, const uint8_t *req, size_t req_len,
                            double timeout_s, kd_stream_fn on_msg, void *ctx, kd_call_status *st, kd_err *err) {
    status_init(st);
    call_ctx cc;
    if (call_begin(&cc, c, method, req, req_len, timeout_s, err) != 0) {
        call_end(&cc);
        return -1;
    }
    /* Batch 1: send the request and half-close; batch 2: the status (completes last);
     * then one RECV_MESSAGE batch at a time until the stream ends. */
    grpc_op ops[4];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = cc.send_bb;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &cc.initial_md;
    grpc_call_error e = grpc_call_start_batch(cc.call, ops, 4, (void *)(intptr_t)TAG_START, NULL);
    if (e != GRPC_CALL_OK) {
        call_end(&cc);
        return kd_fail(err, "client: %s: start_batch failed (%d)", method, (int)e);
    }
    int pending = 1;

    grpc_op sop;
    memset(&sop, 0, sizeof sop);
    sop.op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    sop.data.recv_status_on_client.trailing_metadata = &cc.trailing_md;
    sop.data.recv_status_on_client.status = &cc.status;
    sop.data.recv_status_on_client.status_details = &cc.details;
    sop.data.recv_status_on_client.error_string = &cc.error_string;
    int rc = 0;
    e = grpc_call_start_batch(cc.call, &sop, 1, (void *)(intptr_t)TAG_STATUS, NULL);
    int status_pending = e == GRPC_CALL_OK;
    if (!status_pending) {
        rc = kd_fail(err, "client: %s: start_batch (status) failed (%d)", method, (int)e);
        grpc_call_cancel(cc.call, NULL);
    }
    pending += status_pending;

    grpc_byte_buffer *recv_bb = NULL;
    grpc_op rop;
    memset(&rop, 0, sizeof rop);
    rop.op = GRPC_OP_RECV_MESSAGE;
    rop.data.recv_message.recv_message = &recv_bb;
    int cancelled = 0;
    if (rc == 0 && grpc_call_start_batch(cc.call, &rop, 1, (void *)(intptr_t)TAG_RECV, NULL) == GRPC_CALL_OK)
        pending++;

    while (pending > 0) {
        grpc_event ev = grpc_completion_queue_next(cc.cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
        if (ev.type != GRPC_OP_COMPLETE) continue; /* cannot happen: the queue is not shut down */
        pending--;
        if ((intptr_t)ev.tag != TAG_RECV) continue;
        if (!ev.success || !recv_bb) continue; /* the stream ended (or failed): status follows */
        if (cancelled) {
            grpc_byte_buffer_destroy(recv_bb);
            recv_bb = NULL;
        } else {
            uint8_t *msg = NULL;
            size_t len = 0;
            grpc_byte_buffer *bb = recv_bb;
            recv_bb = NULL;
            if (take_bytes(bb, &msg, &len, err) != 0) {
                rc = -1;
                cancelled = 1;
            } else {
                int stop = on_msg(ctx, msg, len);
                free(msg);
                if (stop) cancelled = 1;
            }
            if (cancelled) grpc_call_cancel(cc.call, NULL);
        }
        /* Keep reading (also after a cancel, to drain) until the stream ends. */
        if (grpc_call_start_batch(cc.call, &rop, 1, (void *)(intptr_t)TAG_RECV, NULL) == GRPC_CALL_OK)
            pending++;
    }
    if (recv_bb) grpc_byte_buffer_destroy(recv_bb);
    if (status_pending) fill_status(&cc, st);
    call_end(&cc);
    return rc;
}

enum { TAG_SEND = 5, TAG_RECV_ONE = 6 };

int kd_client_client_stream(kd_client *c, const char *method, kd_msg_source next, void *ctx, double timeout_s,
                            uint8_t **resp, size_t *resp_len, kd_call_status *st, kd_err *err) {
    *resp = NULL;
    *resp_len = 0;
    status_init(st);
    call_ctx cc;
    if (call_begin(&cc, c, method, (const uint8_t *)"", 0, timeout_s, err) != 0) {
        call_end(&cc);
        return -1;
    }
    /* The response and the status are received from the start, so that a server that
     * refuses early (at the header) stops the sending at once. */
    grpc_byte_buffer *recv_bb = NULL;
    grpc_op ops[2];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[0].data.recv_initial_metadata.recv_initial_metadata = &cc.initial_md;
    ops[1].op = GRPC_OP_RECV_MESSAGE;
    ops[1].data.recv_message.recv_message = &recv_bb;
    int pending = 0, status_done = 0, rc = 0, gave_up = 0;
    if (grpc_call_start_batch(cc.call, ops, 2, (void *)(intptr_t)TAG_RECV_ONE, NULL) == GRPC_CALL_OK) pending++;
    grpc_op sop;
    memset(&sop, 0, sizeof sop);
    sop.op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    sop.data.recv_status_on_client.trailing_metadata = &cc.trailing_md;
    sop.data.recv_status_on_client.status = &cc.status;
    sop.data.recv_status_on_client.status_details = &cc.details;
    sop.data.recv_status_on_client.error_string = &cc.error_string;
    int status_started = grpc_call_start_batch(cc.call, &sop, 1, (void *)(intptr_t)TAG_STATUS, NULL) == GRPC_CALL_OK;
    pending += status_started;
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    int sending = grpc_call_start_batch(cc.call, ops, 1, (void *)(intptr_t)TAG_START, NULL) == GRPC_CALL_OK;
    pending += sending;
    int send_busy = sending;
    while (pending > 0) {
        if (sending && !send_busy && !status_done) { /* the next message, or the half-close */
            kd_msg msg = {0};
            const int more = next(ctx, &msg);
            memset(ops, 0, sizeof ops);
            if (more < 0) {
                grpc_call_cancel(cc.call, NULL);
                rc = kd_fail(err, "client: %s: cancelled by the sender", method);
                sending = 0;
                continue;
            }
            if (more == 0) {
                ops[0].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
                sending = 0;
            } else {
                if (cc.send_bb) grpc_byte_buffer_destroy(cc.send_bb);
                grpc_slice sl[2] = {grpc_slice_from_copied_buffer((const char *)msg.head, msg.head_len),
                                    grpc_empty_slice()};
                size_t ns = 1;
                if (msg.tail && msg.tail_len) sl[ns++] = grpc_slice_from_static_buffer(msg.tail, msg.tail_len);
                cc.send_bb = grpc_raw_byte_buffer_create(sl, ns);
                grpc_slice_unref(sl[0]);
                grpc_slice_unref(sl[1]);
                ops[0].op = GRPC_OP_SEND_MESSAGE;
                ops[0].data.send_message.send_message = cc.send_bb;
            }
            if (grpc_call_start_batch(cc.call, ops, 1, (void *)(intptr_t)TAG_SEND, NULL) == GRPC_CALL_OK) {
                pending++;
                send_busy = 1;
            } else {
                sending = 0;
            }
            continue;
        }
        grpc_event ev = grpc_completion_queue_next(
            cc.cq, gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis(100, GPR_TIMESPAN)), NULL);
        if (ev.type == GRPC_QUEUE_TIMEOUT) { /* still waiting: has the sender given up? */
            if (!gave_up && !status_done && next(ctx, NULL) < 0) {
                gave_up = 1;
                grpc_call_cancel(cc.call, NULL);
                if (rc == 0) rc = kd_fail(err, "client: %s: cancelled by the sender", method);
                sending = 0;
            }
            continue;
        }
        if (ev.type != GRPC_OP_COMPLETE) continue;
        pending--;
        switch ((intptr_t)ev.tag) {
        case TAG_START:
        case TAG_SEND:
            send_busy = 0;
            if (!ev.success) sending = 0; /* the call is over: the status tells why */
            break;
        case TAG_STATUS:
            status_done = 1;
            sending = 0;
            break;
        default:
            break;
        }
    }
    if (status_started) fill_status(&cc, st);
    if (recv_bb) {
        if (st->code == GRPC_STATUS_OK && rc == 0) rc = take_bytes(recv_bb, resp, resp_len, err);
        else grpc_byte_buffer_destroy(recv_bb);
    } else if (st->code == GRPC_STATUS_OK && rc == 0) {
        st->code = GRPC_STATUS_INTERNAL;
        snprintf(st->details, sizeof st->details, "no response message from %s", method);
    }
    call_end(&cc);
    return rc;
}

size_t kd_client_bytes_field_head(uint8_t *pre, uint32_t field, uint64_t n) {
    size_t k = 0;
    pre[k++] = (uint8_t)((field << 3) | 2); /* fields 1..15: a one-byte tag */
    for (uint64_t v = n;; v >>= 7) {
        pre[k++] = (uint8_t)((v & 0x7f) | (v >= 0x80 ? 0x80 : 0));
        if (v < 0x80) break;
    }
    return k;
}
