/* api.h: decoding and validating API requests (proto/kdecode/v1) into engine parameters.
 * Everything here is pure: bytes in, a gRPC status code and message or a request out. The
 * server and the fuzz target share it. Status codes are gRPC's numbers. */
#ifndef KD_API_H
#define KD_API_H

#include <stddef.h>
#include <stdint.h>

#include "worker/engine.h"

enum {
    KD_STATUS_OK = 0,
    KD_STATUS_CANCELLED = 1,
    KD_STATUS_INVALID_ARGUMENT = 3,
    KD_STATUS_DEADLINE_EXCEEDED = 4,
    KD_STATUS_NOT_FOUND = 5,
    KD_STATUS_ALREADY_EXISTS = 6,
    KD_STATUS_RESOURCE_EXHAUSTED = 8,
    KD_STATUS_FAILED_PRECONDITION = 9,
    KD_STATUS_UNIMPLEMENTED = 12,
    KD_STATUS_INTERNAL = 13,
    KD_STATUS_UNAVAILABLE = 14,
    KD_STATUS_DATA_LOSS = 15
};

#define KD_REQUEST_ID_MAX 128

/* What a request is checked against: the model and the worker's settings. */
typedef struct kd_api_limits {
    int32_t vocab;
    int32_t eos_id;            /* -1: none */
    int64_t max_model_len;
    int32_t max_spec;          /* the engine's max_spec */
    int32_t default_spec;      /* s when the request leaves it unset */
    int64_t max_prompt;        /* prompt tokens (also bounded by max_model_len - 1) */
    int32_t max_stop_ids;
} kd_api_limits;

/* A decoded Generate request; owns its arrays. params points into them. */
typedef struct kd_generate_req {
    char request_id[KD_REQUEST_ID_MAX + 1];
    char handoff_id[KD_REQUEST_ID_MAX + 1]; /* "" unless the request claims a handoff */
    int32_t *prompt, *stop, *drafts;
    int32_t n_drafts;
    kd_request_params params;  /* id is left 0 for the server to assign */
} kd_generate_req;

/* Decodes and validates GenerateRequest bytes. Returns KD_STATUS_OK or an error status with
 * a message naming the field ("prompt_token_ids[3] = 5000 is outside the vocabulary [0,
 * 1024)"). On error *out holds nothing to free. */
int kd_api_parse_generate(const uint8_t *buf, size_t len, const kd_api_limits *lim,
                          kd_generate_req *out, char *msg, size_t msglen);
void kd_generate_req_free(kd_generate_req *r);

/* Decodes AbortRequest bytes: the request id. */
int kd_api_parse_abort(const uint8_t *buf, size_t len, char id[KD_REQUEST_ID_MAX + 1], char *msg,
                       size_t msglen);

/* A request id is 1..128 bytes of printable ASCII. */
int kd_api_valid_request_id(const char *id);
/* 1 when a string field of the message (at any depth) holds a NUL byte, with "<message>.<field>
 * holds a NUL byte" in msg (msglen bytes; NULL: no message). protobuf-c decodes strings as C
 * strings, so an id "ab\0cd" would arrive as "ab": such requests are refused (INVALID_ARGUMENT)
 * before they are decoded. descriptor: the message's ProtobufCMessageDescriptor; buf: its wire
 * form (anything malformed is left to the decoder). */
int kd_api_string_has_nul(const void *descriptor, const uint8_t *buf, size_t len, char *msg, size_t msglen);

#endif
