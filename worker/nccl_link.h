/* nccl_link.h: the NCCL transport of the state handoff (decoder.proto, HANDOFF_TRANSPORT_NCCL).
 *
 * A link is a two-rank NCCL communicator between one prefill worker (rank 0, the sender) and
 * one decode worker (rank 1, the receiver). The sender creates it lazily, the first time it
 * hands a state to that decode worker: ncclGetUniqueId, the unique id to the peer through
 * Decoder.NcclConnect (the caller's connect function), then both ranks join. Links live in a
 * bounded pool on each side, carry one handoff at a time (NCCL matches sends and receives in
 * issue order, so a link is held exclusively from the header to the end of the transfer),
 * and are torn down (ncclCommAbort) when a transfer fails or times out, when the peer is
 * lost, or after idle_seconds unused. Nothing here waits on a peer without a deadline:
 * communicators are blocking ones (a transfer is launched by the calling thread, without the
 * thread NCCL starts per group of a non-blocking one) created on a thread of their own, with a
 * first transfer of warm_bytes that connects what later transfers use, while the caller waits
 * for it with a deadline; KDECODE_NCCL_NONBLOCKING=1 selects non-blocking communicators.
 *
 * Transfers go straight between device buffers (the sender's export buffer, the receiver's
 * slot) on a stream of the link's own; nothing is staged through the host. */
#ifndef KD_NCCL_LINK_H
#define KD_NCCL_LINK_H

#include <stddef.h>

#include "kd/sum64.h"
#include "kd/types.h"

typedef struct kd_nccl kd_nccl;
typedef struct kd_nccl_link kd_nccl_link;
typedef struct kd_nccl_job kd_nccl_job;

typedef struct kd_nccl_opts {
    int device;              /* CUDA device ordinal the state lives on */
    int max_links;           /* communicators kept on this side */
    double idle_seconds;     /* an unused link is torn down after this long */
    double connect_seconds;  /* creating a communicator: both ranks joined within this */
    double transfer_seconds; /* a transfer not complete after this is aborted */
    size_t warm_bytes;       /* a new link moves this many bytes once before its first handoff */
} kd_nccl_opts;

#define KD_NCCL_UID_BYTES 128
#define KD_NCCL_ID_MAX 64

/* NULL with a message without a usable CUDA device or NCCL. Sets NCCL_NVLS_ENABLE=0 unless
 * the environment sets it (no NVLink multicast: point-to-point transfers do not need it). */
kd_nccl *kd_nccl_create(const kd_nccl_opts *o, kd_err *err);
void kd_nccl_destroy(kd_nccl *n);
/* Communicators alive on this side. */
int kd_nccl_count(kd_nccl *n);
/* Tears down links idle for longer than idle_seconds (call every few seconds). */
void kd_nccl_reap(kd_nccl *n);
int kd_nccl_version(void);

/* Device buffers of `bytes` (the sender's export buffers), kept for reuse (a few). */
void *kd_nccl_buf_get(kd_nccl *n, size_t bytes);
void kd_nccl_buf_put(kd_nccl *n, void *buf, size_t bytes);
/* Device (or host) memory to host memory. */
int kd_nccl_copy_to_host(kd_nccl *n, void *dst, const void *src, size_t bytes, kd_err *err);
/* sum64 of regions of device memory, on the device, on the link's stream with its kept work
 * space (kd_cuda_sum64 on the pool's device). */
int kd_nccl_sum64(kd_nccl *n, kd_nccl_link *l, const kd_dev_region *r, int count, uint64_t *out, kd_err *err);

/* 1..KD_NCCL_ID_MAX characters of [0-9A-Za-z_.-]. */
int kd_nccl_valid_id(const char *id);

/* ---- sender (prefill worker) */

/* Sends the NcclConnect RPC: 0 when the peer started joining, else -1 with a message. */
typedef int (*kd_nccl_connect_fn)(void *ctx, kd_nccl_link *l, const char *target, const char *comm_id,
                                  const void *uid, size_t uid_len, kd_err *err);

/* The link to target, held exclusively until kd_nccl_release; created (through connect) when
 * there is none. NULL with a message when none can be had (no room, the peer refused or did
 * not join in time, or a creation for this target failed in the last retry_seconds). */
kd_nccl_link *kd_nccl_acquire_to(kd_nccl *n, const char *target, kd_nccl_connect_fn connect, void *ctx,
                                 kd_err *err);
const char *kd_nccl_link_id(const kd_nccl_link *l);
/* The peer's receive split (NcclConnectResponse.recv_parts), kept with the link. */
int kd_nccl_link_set_parts(kd_nccl_link *l, const uint64_t *parts, int n);
int kd_nccl_link_parts(const kd_nccl_link *l, const uint64_t **parts);
/* Queues one ncclSend per region (one group) on the link's stream. */
int kd_nccl_send(kd_nccl *n, kd_nccl_link *l, const kd_dev_region *r, int count, kd_err *err);
/* Waits for what was queued on the link, at most transfer_seconds. -1 with a message on an
 * error or a timeout (then release the link as broken). */
int kd_nccl_wait(kd_nccl *n, kd_nccl_link *l, kd_err *err);
/* Gives a held link back; broken: aborts its communicator and forgets it (any transfer on it
 * stops writing before this returns). */
void kd_nccl_release(kd_nccl *n, kd_nccl_link *l, int broken);

/* ---- receiver (decode worker) */

/* Joins the communicator of a unique id as rank 1, under comm_id (without waiting for the
 * join to finish). Returns 0, or a gRPC status code with a message: RESOURCE_EXHAUSTED when
 * every link is busy, INVALID_ARGUMENT for a bad id, INTERNAL when NCCL refuses. */
int kd_nccl_accept(kd_nccl *n, const char *comm_id, const void *uid, size_t uid_len, char *msg, size_t msglen);

/* Called once per job from the pool's thread, with the link still held: ok = 1 when the
 * data landed (the callback may check it on the link's stream, see kd_nccl_link_stream);
 * ok = 0 when the transfer failed, timed out or was cancelled, in which case the link has
 * already been aborted and nothing writes into the regions any more. Returns nonzero to
 * have the link torn down. */
typedef int (*kd_nccl_done_fn)(void *ctx, kd_nccl_link *l, int ok, const char *msg);

/* Takes the link comm_id (waiting up to connect_seconds for its join), posts one ncclRecv per
 * region into them and returns a job whose completion done reports; the pool releases the
 * link after done. NULL with a status code in *code and a message when there is no such link
 * (FAILED_PRECONDITION: the sender must connect anew) or it is busy or broken. */
kd_nccl_job *kd_nccl_recv_async(kd_nccl *n, const char *comm_id, const kd_dev_region *r, int count,
                                kd_nccl_done_fn done, void *ctx, int *code, char *msg, size_t msglen);
/* Tears down the idle link comm_id, if there is one (its sender gave up on it: a header it
 * sent was refused, so its send is pending and the link is out of step). */
void kd_nccl_drop(kd_nccl *n, const char *comm_id);
/* Stops a job that has not completed yet (its done then reports ok = 0); a no-op for a job
 * whose done has already been called or is running. */
void kd_nccl_cancel(kd_nccl *n, kd_nccl_job *j);
/* Seconds the link's last receive took on the GPU (CUDA events around it; the sender posts
 * first, so this is the transfer itself), or -1 when not known. In done, with ok = 1. */
double kd_nccl_link_gpu_seconds(kd_nccl_link *l);
/* The link's CUDA stream (a cudaStream_t), for work that must follow its transfers. */
void *kd_nccl_link_stream(kd_nccl_link *l);

#endif
