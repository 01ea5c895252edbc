/* client.h: a small gRPC client on the C core for kdctl and the prefill role: one channel
 * (insecure, TLS or mutual TLS), unary calls and server-streaming calls with raw message
 * bytes. Thread-safe in the sense of gRPC channels: one kd_client can be shared by
 * threads, each call has its own completion queue. */
#ifndef KD_CLIENT_H
#define KD_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#include "kd/types.h"

typedef struct kd_tls_opts {
    const char *ca_file;       /* PEM roots to verify the server (NULL: plaintext) */
    const char *cert_file;     /* client certificate and key (mutual TLS), or NULL */
    const char *key_file;
    const char *server_name;   /* override the name checked in the server certificate */
} kd_tls_opts;

typedef struct kd_client kd_client;

/* Needs grpc_init() done by the program. */
kd_client *kd_client_connect(const char *target, const kd_tls_opts *tls, kd_err *err);
void kd_client_close(kd_client *c);

/* The outcome of a call: the status code (gRPC numbering), its message and, for
 * RESOURCE_EXHAUSTED, the server's retry pushback in ms (-1 if none). */
typedef struct kd_call_status {
    int code;
    char details[512];
    long retry_pushback_ms;
} kd_call_status;

/* A unary call; *resp is malloc'd (free it). timeout_s <= 0: no deadline. Returns 0 when
 * the call completed (whatever its status), -1 on a local failure (err). */
int kd_client_unary(kd_client *c, const char *method, const uint8_t *req, size_t req_len, double timeout_s,
                    uint8_t **resp, size_t *resp_len, kd_call_status *st, kd_err *err);

/* A server-streaming call: on_msg is called for every response message as it arrives;
 * returning non-zero from it cancels the call. */
typedef int (*kd_stream_fn)(void *ctx, const uint8_t *msg, size_t len);
int kd_client_server_stream(kd_client *c, const char *method, const uint8_t *req, size_t req_len,
                            double timeout_s, kd_stream_fn on_msg, void *ctx, kd_call_status *st, kd_err *err);

/* A client-streaming call: next(ctx, &msg) yields each request message (1), the end of the
 * stream (0) or cancels the call (-1). A message is head (copied; valid until the next call
 * to next) followed by tail (sent without a copy: it must stay valid until the call
 * returns), so bulk bytes go out with one copy fewer. While the call waits (a message in
 * flight to a slow or stuck peer, or the answer), next(ctx, NULL) is called about every
 * 100 ms: -1 cancels the call (the sender gave up), anything else goes on. The one response
 * comes back as with kd_client_unary. */
typedef struct kd_msg {
    const uint8_t *head;
    size_t head_len;
    const uint8_t *tail; /* may be NULL */
    size_t tail_len;
} kd_msg;
typedef int (*kd_msg_source)(void *ctx, kd_msg *msg);
/* The head of a message whose only field is `field` (length-delimited: bytes) holding n bytes:
 * the tag and the varint length, into pre (at least KD_BYTES_FIELD_HEAD bytes); returns its
 * length. The n bytes then go as the kd_msg's tail, without a copy. */
#define KD_BYTES_FIELD_HEAD 11
size_t kd_client_bytes_field_head(uint8_t *pre, uint32_t field, uint64_t n);
int kd_client_client_stream(kd_client *c, const char *method, kd_msg_source next, void *ctx, double timeout_s,
                            uint8_t **resp, size_t *resp_len, kd_call_status *st, kd_err *err);

#endif
