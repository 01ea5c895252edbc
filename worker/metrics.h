/* metrics.h: the worker's Prometheus metrics and their HTTP exposition (text format 0.0.4
 * on GET /metrics, served by libmicrohttpd on its own port and threads). Every update is
 * thread-safe and cheap (engine thread, completion-queue threads); rendering takes a
 * consistent snapshot. Names are prefixed kdecode_. */
#ifndef KD_METRICS_H
#define KD_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "kd/types.h"

typedef enum kd_metric_hist {
    KD_H_TTFT = 0,        /* kdecode_time_to_first_token_seconds */
    KD_H_ITL,             /* kdecode_inter_token_latency_seconds (per token of a step) */
    KD_H_E2E,             /* kdecode_request_duration_seconds */
    KD_H_QUEUE,           /* kdecode_queue_wait_seconds */
    KD_H_STEP,            /* kdecode_step_duration_seconds */
    KD_H_HANDOFF,         /* kdecode_handoff_duration_seconds */
    KD_H_COUNT
} kd_metric_hist;

typedef enum kd_metric_counter {
    KD_C_REQUESTS_FINISHED_LENGTH = 0, /* kdecode_requests_finished_total{reason="length"} */
    KD_C_REQUESTS_FINISHED_STOP,       /* ...{reason="stop"} */
    KD_C_REQUESTS_FINISHED_ABORT,      /* ...{reason="abort"} (abort, cancel, deadline) */
    KD_C_REQUESTS_FINISHED_ERROR,      /* ...{reason="error"} */
    KD_C_REJECTED_INVALID,             /* kdecode_requests_rejected_total{reason="invalid"} */
    KD_C_REJECTED_BUSY,                /* ...{reason="busy"} (RESOURCE_EXHAUSTED) */
    KD_C_REJECTED_DRAINING,            /* ...{reason="draining"} (UNAVAILABLE) */
    KD_C_PROMPT_TOKENS,                /* kdecode_prompt_tokens_total */
    KD_C_GENERATED_TOKENS,             /* kdecode_generation_tokens_total */
    KD_C_DRAFTED_TOKENS,               /* kdecode_spec_draft_tokens_total */
    KD_C_ACCEPTED_TOKENS,              /* kdecode_spec_accepted_tokens_total */
    KD_C_HELD_TOKENS,                  /* kdecode_spec_held_tokens_total */
    KD_C_STEPS,                        /* kdecode_steps_total */
    KD_C_PREFIX_QUERIES,               /* kdecode_prefix_cache_queries_total */
    KD_C_PREFIX_HITS,                  /* kdecode_prefix_cache_hits_total */
    KD_C_PREFIX_HIT_TOKENS,            /* kdecode_prefix_cache_hit_tokens_total */
    KD_C_HANDOFF_BYTES,                /* kdecode_handoff_bytes_total */
    KD_C_HANDOFF_FAILURES,             /* kdecode_handoff_failures_total */
    KD_C_HANDOFF_NCCL_FALLBACKS,       /* kdecode_handoff_nccl_fallbacks_total */
    KD_C_HANDOFF_WRITE_DEFERRALS,      /* kdecode_handoff_write_deferrals_total */
    KD_C_GRAPH_CAPTURES,               /* kdecode_cuda_graph_captures_total */
    KD_C_GRAPH_REPLAYS,                /* kdecode_cuda_graph_replays_total */
    KD_C_COUNT
} kd_metric_counter;

typedef enum kd_metric_gauge {
    KD_G_RUNNING = 0,     /* kdecode_requests_running */
    KD_G_WAITING,         /* kdecode_requests_waiting */
    KD_G_SLOTS_USED,      /* kdecode_slots_used */
    KD_G_SLOTS_TOTAL,     /* kdecode_slots_total */
    KD_G_SLOT_UTILISATION,/* kdecode_slot_utilization (used / total, 0..1; for autoscaling) */
    KD_G_PREFIX_ENTRIES,  /* kdecode_prefix_cache_entries */
    KD_G_READY,           /* kdecode_ready (1 serving, 0 loading or draining) */
    KD_G_DRAINING,        /* kdecode_draining */
    KD_G_HANDOFFS_PENDING,/* kdecode_handoffs_pending */
    KD_G_NCCL_LINKS,      /* kdecode_nccl_links */
    KD_G_HANDOFF_SLOTS_READY, /* kdecode_handoff_slots_ready */
    KD_G_COUNT
} kd_metric_gauge;

typedef struct kd_metrics kd_metrics;

kd_metrics *kd_metrics_create(void);
void kd_metrics_free(kd_metrics *m);

void kd_metrics_observe(kd_metrics *m, kd_metric_hist h, double seconds);
void kd_metrics_add(kd_metrics *m, kd_metric_counter c, uint64_t n);
void kd_metrics_set(kd_metrics *m, kd_metric_gauge g, double v);
/* Test access: a counter's / gauge's value; a histogram's count and sum. */
uint64_t kd_metrics_counter(kd_metrics *m, kd_metric_counter c);
double kd_metrics_gauge(kd_metrics *m, kd_metric_gauge g);
void kd_metrics_hist(kd_metrics *m, kd_metric_hist h, uint64_t *count, double *sum);

/* Prometheus text exposition of everything (HELP and TYPE lines, histogram buckets with
 * le labels, _sum, _count). *out is malloc'd. 0 or -1 (out of memory). */
int kd_metrics_render(kd_metrics *m, char **out, size_t *len);

/* Serves GET /metrics (and GET / with a pointer to it; 404 otherwise) on listen, "host:port"
 * (port 0: any free port, reported in *bound_port). */
typedef struct kd_metrics_http kd_metrics_http;
kd_metrics_http *kd_metrics_http_start(kd_metrics *m, const char *listen, int *bound_port, kd_err *err);
void kd_metrics_http_stop(kd_metrics_http *h);

#endif
