/* nccl_link.c: NCCL links for the state handoff (see nccl_link.h). */
#include "nccl_link.h"

#include <cuda_runtime_api.h>
#include <errno.h>
#include <nccl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "api.h"
#include "kd/sum64.h"

enum { ROLE_SEND = 0, ROLE_RECV = 1 };

/* A blocking communicator being created on a thread of its own (see link_join). Shared by the
 * link and the thread: whoever lets go of it last frees it. */
typedef struct joiner {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs;                      /* the link's and the thread's */
    int state;                     /* 0 joining, 1 joined, -1 failed */
    ncclComm_t comm;               /* state 1: the link takes it */
    char msg[300];
    ncclUniqueId uid;
    int rank, device;
    size_t warm_bytes;
    double seconds;
} joiner;

struct kd_nccl_link {
    kd_nccl_link *next;
    int role;
    char key[256];                 /* sender: the target; receiver: the comm id */
    char id[KD_NCCL_ID_MAX + 1];   /* the comm id */
    ncclComm_t comm;
    joiner *j;                     /* the communicator while it is being created (blocking mode) */
    cudaStream_t stream;
    cudaEvent_t ev;
    cudaEvent_t t0, t1;            /* receiver: around the last receive, timed on the GPU */
    int busy, joined, creating;
    double last_used;
    uint64_t *parts;               /* sender: the peer's receive split */
    int n_parts;
    kd_sum64_scratch sums;         /* checksum work space */
};

enum { JOB_POSTING = 0, JOB_RUNNING = 1 };

struct kd_nccl_job {
    kd_nccl_job *next;
    kd_nccl_link *l;
    int state, cancelled;
    double deadline;
    kd_nccl_done_fn done;
    void *ctx;
};

typedef struct failed_target {
    char target[256];
    double until;
} failed_target;

#define KD_NCCL_FAILED_MAX 16
#define KD_NCCL_RETRY_SECONDS 30.0

struct kd_nccl {
    kd_nccl_opts o;
    pthread_mutex_t mu;
    pthread_cond_t cv;             /* links released, jobs queued */
    kd_nccl_link *links;
    int n_links;
    kd_nccl_job *jobs;
    int stop;
    pthread_t waiter;
    int waiter_started;
    failed_target failed[KD_NCCL_FAILED_MAX];
    void *bufs[4];                 /* device buffers kept for reuse, of buf_bytes each */
    int n_bufs;
    size_t buf_bytes;
    int nonblocking;               /* transfers on non-blocking communicators (KDECODE_NCCL_NONBLOCKING=1) */
};

/* Joiner threads that outlived their link's deadline and still wait inside NCCL (a peer that
 * never joined): bounded, so that a misbehaving peer cannot pile up threads. */
static int g_stray_joiners;
#define KD_NCCL_STRAY_MAX 8

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Waits here sleep 20 us at a time: transfers take ~100 us and more. The calling thread's timer
 * slack is cut to 1 us first (Linux lets a sleep run 50 us late by default, which was a third
 * of a transfer). */
static void nap(void) {
    static __thread int slack_set;
    if (!slack_set) slack_set = 1, (void)prctl(PR_SET_TIMERSLACK, 1000UL, 0UL, 0UL, 0UL);
    struct timespec ts = {0, 20000};
    nanosleep(&ts, NULL);
}

int kd_nccl_version(void) {
    int v = 0;
    return ncclGetVersion(&v) == ncclSuccess ? v : 0;
}

int kd_nccl_valid_id(const char *id) {
    size_t n = id ? strlen(id) : 0;
    if (n < 1 || n > KD_NCCL_ID_MAX) return 0;
    for (size_t i = 0; i < n; i++) {
        const char c = id[i];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == '.' ||
              c == '-'))
            return 0;
    }
    return 1;
}

/* Aborts and frees a link that is out of the list (or never was in it). */
static void joiner_let_go(joiner *j);

static void link_free(kd_nccl *n, kd_nccl_link *l) {
    if (l->j) joiner_let_go(l->j), l->j = NULL;
    cudaSetDevice(n->o.device);
    if (l->comm) ncclCommAbort(l->comm); /* stops any transfer still running on it */
    if (l->stream) cudaStreamSynchronize(l->stream);
    if (l->ev) cudaEventDestroy(l->ev);
    if (l->t0) cudaEventDestroy(l->t0);
    if (l->t1) cudaEventDestroy(l->t1);
    if (l->stream) cudaStreamDestroy(l->stream);
    kd_cuda_sum64_scratch_free(&l->sums);
    (void)cudaGetLastError();
    free(l->parts);
    free(l);
}

static void unlink_locked(kd_nccl *n, kd_nccl_link *l) {
    for (kd_nccl_link **p = &n->links; *p; p = &(*p)->next)
        if (*p == l) {
            *p = l->next;
            n->n_links--;
            return;
        }
}

static kd_nccl_link *find_locked(kd_nccl *n, int role, const char *key) {
    for (kd_nccl_link *l = n->links; l; l = l->next)
        if (l->role == role && !strcmp(l->key, key)) return l;
    return NULL;
}

/* Makes room for one more link: evicts the least recently used idle one. 0, or -1 when all
 * are busy. The evicted link is returned in *out for freeing outside the lock. */
static int room_locked(kd_nccl *n, kd_nccl_link **out) {
    *out = NULL;
    if (n->n_links < n->o.max_links) return 0;
    kd_nccl_link *lru = NULL;
    for (kd_nccl_link *l = n->links; l; l = l->next)
        if (!l->busy && (!lru || l->last_used < lru->last_used)) lru = l;
    if (!lru) return -1;
    unlink_locked(n, lru);
    *out = lru;
    return 0;
}

static kd_nccl_link *link_new(kd_nccl *n, int role, const char *key, char *msg, size_t len) {
    kd_nccl_link *l = calloc(1, sizeof *l);
    if (!l) return snprintf(msg, len, "out of memory"), NULL;
    l->role = role;
    snprintf(l->key, sizeof l->key, "%s", key);
    cudaError_t e = cudaSetDevice(n->o.device);
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&l->stream, cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&l->ev, cudaEventDisableTiming);
    if (e == cudaSuccess && role == ROLE_RECV) e = cudaEventCreate(&l->t0);
    if (e == cudaSuccess && role == ROLE_RECV) e = cudaEventCreate(&l->t1);
    kd_err err;
    if (e != cudaSuccess || kd_cuda_sum64_scratch_init(&l->sums, &err)) {
        snprintf(msg, len, "CUDA: %.300s", e != cudaSuccess ? cudaGetErrorString(e) : err.msg);
        link_free(n, l);
        return NULL;
    }
    return l;
}

/* The link lets go of its joiner: a thread still joining frees it when it ends (and aborts
 * the communicator it made); a communicator made and not taken is aborted here. */
static void joiner_let_go(joiner *j) {
    pthread_mutex_lock(&j->mu);
    ncclComm_t c = j->state == 1 ? j->comm : NULL;
    j->comm = NULL;
    if (j->state == 0) __atomic_add_fetch(&g_stray_joiners, 1, __ATOMIC_SEQ_CST);
    const int last = --j->refs == 0;
    pthread_mutex_unlock(&j->mu);
    if (c) ncclCommAbort(c);
    if (last) pthread_cond_destroy(&j->cv), pthread_mutex_destroy(&j->mu), free(j);
}

/* One transfer of warm_bytes between the two ranks, so that NCCL connects the channels and
 * protocols a state's transfer uses now, not inside the first handoff (on a blocking
 * communicator a send or receive that must connect waits for its peer on the host). The
 * stream is polled against the deadline; past it the communicator is aborted. */
static int warm_up(ncclComm_t c, int rank, size_t bytes, double deadline, char *msg, size_t len) {
    void *b = NULL;
    cudaStream_t s = NULL;
    if (bytes < 4) bytes = 4;
    cudaError_t e = cudaMalloc(&b, bytes);
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        snprintf(msg, len, "CUDA: %s", cudaGetErrorString(e));
        if (b) cudaFree(b);
        return -1;
    }
    ncclResult_t r = rank == 0 ? ncclSend(b, bytes, ncclUint8, 1, c, s) : ncclRecv(b, bytes, ncclUint8, 0, c, s);
    int rc = 0;
    if (r != ncclSuccess) {
        snprintf(msg, len, "first transfer: %s (%s)", ncclGetErrorString(r), ncclGetLastError(c));
        rc = -1;
    } else {
        while ((e = cudaStreamQuery(s)) == cudaErrorNotReady && now_s() < deadline) nap();
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            snprintf(msg, len, "first transfer: %s", e == cudaErrorNotReady ? "timed out" : cudaGetErrorString(e));
            rc = -1;
        }
    }
    if (rc) ncclCommAbort(c); /* ends a transfer still waiting for its peer */
    cudaStreamSynchronize(s);
    cudaStreamDestroy(s);
    cudaFree(b);
    (void)cudaGetLastError();
    return rc;
}

static void *joiner_main(void *arg) {
    joiner *j = arg;
    char msg[300] = "";
    ncclComm_t c = NULL;
    const double deadline = now_s() + j->seconds;
    cudaError_t e = cudaSetDevice(j->device);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 1;
    ncclResult_t r = e == cudaSuccess ? ncclCommInitRankConfig(&c, 2, j->uid, j->rank, &cfg) : ncclSystemError;
    if (r != ncclSuccess) {
        snprintf(msg, sizeof msg, "ncclCommInitRankConfig: %s", e == cudaSuccess ? ncclGetErrorString(r)
                                                                                : cudaGetErrorString(e));
        if (c) ncclCommAbort(c);
        c = NULL;
    } else if (warm_up(c, j->rank, j->warm_bytes, deadline, msg, sizeof msg)) {
        c = NULL; /* aborted */
    }
    pthread_mutex_lock(&j->mu);
    const int alone = j->refs == 1; /* the link let go: nobody takes the communicator */
    if (alone) __atomic_sub_fetch(&g_stray_joiners, 1, __ATOMIC_SEQ_CST);
    j->state = c ? 1 : -1;
    j->comm = alone ? NULL : c;
    snprintf(j->msg, sizeof j->msg, "%s", msg);
    pthread_cond_broadcast(&j->cv);
    const int last = --j->refs == 0;
    pthread_mutex_unlock(&j->mu);
    if (alone && c) ncclCommAbort(c);
    if (last) pthread_cond_destroy(&j->cv), pthread_mutex_destroy(&j->mu), free(j);
    return NULL;
}

/* Starts joining. Blocking mode (the default): the communicator is a blocking one, so that a
 * transfer is launched by the calling thread at once (a non-blocking communicator launches each
 * group from a thread NCCL starts for it, which measured ~140 us per transfer on the H200), made
 * on a thread of its own so that the caller still waits with a deadline (link_settle). */
static int link_join(kd_nccl *n, kd_nccl_link *l, const ncclUniqueId *uid, int rank, char *msg, size_t len) {
    cudaSetDevice(n->o.device);
    if (n->nonblocking) {
        ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
        cfg.blocking = 0;
        ncclResult_t r = ncclCommInitRankConfig(&l->comm, 2, *uid, rank, &cfg);
        if (r != ncclSuccess && r != ncclInProgress) {
            snprintf(msg, len, "ncclCommInitRankConfig: %s", ncclGetErrorString(r));
            return -1;
        }
        return 0;
    }
    if (__atomic_load_n(&g_stray_joiners, __ATOMIC_SEQ_CST) >= KD_NCCL_STRAY_MAX)
        return snprintf(msg, len, "%d NCCL joins are still waiting for peers that never came", KD_NCCL_STRAY_MAX), -1;
    joiner *j = calloc(1, sizeof *j);
    if (!j) return snprintf(msg, len, "out of memory"), -1;
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    j->refs = 2;
    j->uid = *uid;
    j->rank = rank;
    j->device = n->o.device;
    j->warm_bytes = n->o.warm_bytes;
    j->seconds = n->o.connect_seconds;
    pthread_attr_t at;
    pthread_t t;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    const int rc = pthread_create(&t, &at, joiner_main, j);
    pthread_attr_destroy(&at);
    if (rc) {
        pthread_cond_destroy(&j->cv), pthread_mutex_destroy(&j->mu), free(j);
        return snprintf(msg, len, "cannot start a thread to join the communicator"), -1;
    }
    l->j = j;
    return 0;
}

/* Polls the communicator's state until it is not in progress or the deadline passes. */
static int comm_settle(ncclComm_t c, double deadline, const char *what, char *msg, size_t len) {
    for (;;) {
        ncclResult_t st = ncclInProgress;
        ncclResult_t r = ncclCommGetAsyncError(c, &st);
        if (r != ncclSuccess) return snprintf(msg, len, "%s: %s", what, ncclGetErrorString(r)), -1;
        if (st == ncclSuccess) return 0;
        if (st != ncclInProgress)
            return snprintf(msg, len, "%s: %s (%s)", what, ncclGetErrorString(st), ncclGetLastError(c)), -1;
        if (now_s() > deadline) return snprintf(msg, len, "%s: timed out", what), -1;
        nap();
    }
}

/* Waits until the link's communicator is made (either mode), at most until deadline. */
static int link_settle(kd_nccl_link *l, double deadline, char *msg, size_t len) {
    joiner *j = l->j;
    if (!j) return comm_settle(l->comm, deadline, "joining", msg, len);
    pthread_mutex_lock(&j->mu);
    while (j->state == 0 && now_s() < deadline) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 20000000;
        if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
        pthread_cond_timedwait(&j->cv, &j->mu, &ts);
    }
    const int st = j->state;
    if (st == 1) l->comm = j->comm, j->comm = NULL;
    if (st == -1) snprintf(msg, len, "joining: %s", j->msg);
    if (st == 0) snprintf(msg, len, "joining: timed out");
    pthread_mutex_unlock(&j->mu);
    l->j = NULL;
    joiner_let_go(j);
    return st == 1 ? 0 : -1;
}

/* ------------------------------------------------------------------ the pool's thread */

static void *waiter_main(void *arg) {
    kd_nccl *n = arg;
    cudaSetDevice(n->o.device);
    pthread_mutex_lock(&n->mu);
    while (!n->stop || n->jobs) {
        if (!n->jobs) {
            pthread_cond_wait(&n->cv, &n->mu);
            continue;
        }
        /* take the finished jobs off the list */
        kd_nccl_job *fin = NULL;
        const double t = now_s();
        for (kd_nccl_job **p = &n->jobs; *p;) {
            kd_nccl_job *j = *p;
            int finished = 0;
            if (j->cancelled || n->stop) {
                finished = -1;
            } else if (t > j->deadline) {
                finished = -2;
            } else {
                ncclResult_t st = ncclSuccess;
                if (ncclCommGetAsyncError(j->l->comm, &st) != ncclSuccess ||
                    (st != ncclSuccess && st != ncclInProgress)) {
                    finished = -3;
                } else if (j->state == JOB_POSTING) {
                    if (st == ncclSuccess) {
                        if (cudaEventRecord(j->l->t1, j->l->stream) == cudaSuccess &&
                            cudaEventRecord(j->l->ev, j->l->stream) == cudaSuccess)
                            j->state = JOB_RUNNING;
                        else finished = -4;
                    }
                } else {
                    cudaError_t e = cudaEventQuery(j->l->ev);
                    if (e == cudaSuccess) finished = 1;
                    else if (e != cudaErrorNotReady) finished = -4;
                }
            }
            if (finished) {
                *p = j->next;
                j->state = finished;
                j->next = fin;
                fin = j;
            } else {
                p = &j->next;
            }
        }
        const int more = n->jobs != NULL;
        pthread_mutex_unlock(&n->mu);
        for (kd_nccl_job *j = fin, *next; j; j = next) {
            next = j->next;
            static const char *why[] = {"", "cancelled", "timed out", "NCCL reported an error", "CUDA error"};
            const int ok = j->state == 1;
            char msg[300];
            if (!ok) {
                snprintf(msg, sizeof msg, "NCCL transfer %s%s%s", why[-j->state],
                         j->state == -3 ? ": " : "", j->state == -3 ? ncclGetLastError(j->l->comm) : "");
                /* abort before telling: then nothing writes into the regions any more */
                pthread_mutex_lock(&n->mu);
                unlink_locked(n, j->l);
                pthread_mutex_unlock(&n->mu);
                link_free(n, j->l);
                j->l = NULL;
            }
            const int broken = j->done(j->ctx, j->l, ok, ok ? "" : msg);
            if (j->l) kd_nccl_release(n, j->l, broken);
            free(j);
        }
        if (more) nap();
        pthread_mutex_lock(&n->mu);
    }
    pthread_mutex_unlock(&n->mu);
    return NULL;
}

/* ------------------------------------------------------------------------ the pool */

kd_nccl *kd_nccl_create(const kd_nccl_opts *o, kd_err *err) {
    int v = kd_nccl_version();
    if (!v) {
        kd_fail(err, "NCCL is not usable");
        return NULL;
    }
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || o->device < 0 || o->device >= count) {
        (void)cudaGetLastError();
        kd_fail(err, "no usable CUDA device %d for the NCCL transport", o->device);
        return NULL;
    }
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    kd_nccl *n = calloc(1, sizeof *n);
    if (!n) {
        kd_fail(err, "out of memory");
        return NULL;
    }
    n->o = *o;
    const char *nb = getenv("KDECODE_NCCL_NONBLOCKING");
    n->nonblocking = nb && !strcmp(nb, "1");
    if (n->o.max_links < 1) n->o.max_links = 1;
    pthread_mutex_init(&n->mu, NULL);
    pthread_cond_init(&n->cv, NULL);
    if (pthread_create(&n->waiter, NULL, waiter_main, n)) {
        kd_fail(err, "cannot start the NCCL transfer thread");
        kd_nccl_destroy(n);
        return NULL;
    }
    n->waiter_started = 1;
    return n;
}

void kd_nccl_destroy(kd_nccl *n) {
    if (!n) return;
    pthread_mutex_lock(&n->mu);
    n->stop = 1;
    pthread_cond_broadcast(&n->cv);
    pthread_mutex_unlock(&n->mu);
    if (n->waiter_started) pthread_join(n->waiter, NULL); /* cancels what is left */
    while (n->links) {
        kd_nccl_link *l = n->links;
        n->links = l->next;
        link_free(n, l);
    }
    cudaSetDevice(n->o.device);
    while (n->n_bufs > 0) cudaFree(n->bufs[--n->n_bufs]);
    pthread_cond_destroy(&n->cv);
    pthread_mutex_destroy(&n->mu);
    free(n);
}

void *kd_nccl_buf_get(kd_nccl *n, size_t bytes) {
    void *b = NULL;
    pthread_mutex_lock(&n->mu);
    if (n->n_bufs > 0 && n->buf_bytes == bytes) b = n->bufs[--n->n_bufs];
    pthread_mutex_unlock(&n->mu);
    if (b) return b;
    cudaSetDevice(n->o.device);
    if (cudaMalloc(&b, bytes) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    return b;
}

void kd_nccl_buf_put(kd_nccl *n, void *buf, size_t bytes) {
    if (!buf) return;
    pthread_mutex_lock(&n->mu);
    if (n->n_bufs < (int)(sizeof n->bufs / sizeof *n->bufs) && (n->n_bufs == 0 || bytes == n->buf_bytes)) {
        n->buf_bytes = bytes;
        n->bufs[n->n_bufs++] = buf, buf = NULL;
    }
    pthread_mutex_unlock(&n->mu);
    if (buf) {
        cudaSetDevice(n->o.device);
        cudaFree(buf);
    }
}

int kd_nccl_copy_to_host(kd_nccl *n, void *dst, const void *src, size_t bytes, kd_err *err) {
    cudaSetDevice(n->o.device);
    cudaError_t e = cudaMemcpy(dst, src, bytes, cudaMemcpyDefault);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return kd_fail(err, "copying a state to the host: %s", cudaGetErrorString(e));
    }
    return 0;
}

int kd_nccl_sum64(kd_nccl *n, kd_nccl_link *l, const kd_dev_region *r, int count, uint64_t *out, kd_err *err) {
    cudaSetDevice(n->o.device);
    return kd_cuda_sum64(r, count, out, l->stream, &l->sums, err);
}

int kd_nccl_count(kd_nccl *n) {
    pthread_mutex_lock(&n->mu);
    int c = n->n_links;
    pthread_mutex_unlock(&n->mu);
    return c;
}

void kd_nccl_reap(kd_nccl *n) {
    const double t = now_s();
    kd_nccl_link *dead = NULL;
    pthread_mutex_lock(&n->mu);
    for (kd_nccl_link **p = &n->links; *p;) {
        kd_nccl_link *l = *p;
        if (!l->busy && t - l->last_used > n->o.idle_seconds) {
            *p = l->next;
            n->n_links--;
            l->next = dead;
            dead = l;
        } else {
            p = &l->next;
        }
    }
    pthread_mutex_unlock(&n->mu);
    while (dead) {
        kd_nccl_link *l = dead;
        dead = l->next;
        link_free(n, l);
    }
}

const char *kd_nccl_link_id(const kd_nccl_link *l) { return l->id; }

int kd_nccl_link_set_parts(kd_nccl_link *l, const uint64_t *parts, int n) {
    uint64_t *p = n > 0 ? malloc((size_t)n * sizeof *p) : NULL;
    if (n > 0 && !p) return -1;
    if (n > 0) memcpy(p, parts, (size_t)n * sizeof *p);
    free(l->parts);
    l->parts = p, l->n_parts = n;
    return 0;
}

int kd_nccl_link_parts(const kd_nccl_link *l, const uint64_t **parts) {
    *parts = l->parts;
    return l->n_parts;
}

void *kd_nccl_link_stream(kd_nccl_link *l) { return l->stream; }

void kd_nccl_release(kd_nccl *n, kd_nccl_link *l, int broken) {
    pthread_mutex_lock(&n->mu);
    if (broken) unlink_locked(n, l);
    l->busy = 0;
    l->last_used = now_s();
    pthread_cond_broadcast(&n->cv);
    pthread_mutex_unlock(&n->mu);
    if (broken) link_free(n, l);
}

/* ------------------------------------------------------------------------- sender */

kd_nccl_link *kd_nccl_acquire_to(kd_nccl *n, const char *target, kd_nccl_connect_fn connect, void *ctx,
                                 kd_err *err) {
    const double deadline = now_s() + n->o.connect_seconds;
    kd_nccl_link *evicted = NULL, *l = NULL, *fresh = NULL;
    char msg[400] = "";
    pthread_mutex_lock(&n->mu);
    for (;;) {
        l = find_locked(n, ROLE_SEND, target);
        if (l && !l->busy) {
            l->busy = 1;
            pthread_mutex_unlock(&n->mu);
            if (fresh) link_free(n, fresh);
            return l;
        }
        if (!l) {
            for (int i = 0; i < KD_NCCL_FAILED_MAX; i++)
                if (n->failed[i].until > now_s() && !strcmp(n->failed[i].target, target)) {
                    pthread_mutex_unlock(&n->mu);
                    if (fresh) link_free(n, fresh);
                    kd_fail(err, "creating an NCCL link to %s failed less than %.0f s ago", target,
                            KD_NCCL_RETRY_SECONDS);
                    return NULL;
                }
            if (fresh) break;
            /* a new link: its stream and event are made outside the lock, then look again */
            pthread_mutex_unlock(&n->mu);
            if (!(fresh = link_new(n, ROLE_SEND, target, msg, sizeof msg))) {
                kd_fail(err, "NCCL link to %s: %s", target, msg);
                return NULL;
            }
            pthread_mutex_lock(&n->mu);
            continue;
        }
        /* another handoff to the same peer holds it (or is creating it): one transfer at a time */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 50000000;
        if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
        pthread_cond_timedwait(&n->cv, &n->mu, &ts);
        if (now_s() > deadline) {
            pthread_mutex_unlock(&n->mu);
            if (fresh) link_free(n, fresh);
            kd_fail(err, "the NCCL link to %s stayed busy for %.1f s", target, n->o.connect_seconds);
            return NULL;
        }
    }
    if (room_locked(n, &evicted)) {
        pthread_mutex_unlock(&n->mu);
        link_free(n, fresh);
        kd_fail(err, "all %d NCCL links are busy", n->o.max_links);
        return NULL;
    }
    l = fresh; /* in the pool, busy, while it connects: others to this target wait for it */
    l->busy = 1;
    l->next = n->links;
    n->links = l;
    n->n_links++;
    pthread_mutex_unlock(&n->mu);
    if (evicted) link_free(n, evicted);

    ncclUniqueId uid;
    uint64_t rnd[2] = {0, 0};
    if (getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd) rnd[0] = (uint64_t)(now_s() * 1e9) ^ (uint64_t)getpid();
    snprintf(l->id, sizeof l->id, "nccl-%016llx%016llx", (unsigned long long)rnd[0], (unsigned long long)rnd[1]);
    cudaSetDevice(n->o.device);
    kd_err cerr;
    ncclResult_t r = ncclGetUniqueId(&uid);
    if (r != ncclSuccess) {
        snprintf(msg, sizeof msg, "ncclGetUniqueId: %s", ncclGetErrorString(r));
    } else if (connect(ctx, l, target, l->id, &uid, sizeof uid, &cerr)) {
        snprintf(msg, sizeof msg, "%.390s", cerr.msg);
    } else if (!link_join(n, l, &uid, ROLE_SEND, msg, sizeof msg) && !link_settle(l, deadline, msg, sizeof msg)) {
        l->joined = 1;
        return l;
    }
    pthread_mutex_lock(&n->mu);
    unlink_locked(n, l);
    int slot = 0;
    for (int i = 0; i < KD_NCCL_FAILED_MAX; i++)
        if (n->failed[i].until < n->failed[slot].until) slot = i;
    snprintf(n->failed[slot].target, sizeof n->failed[slot].target, "%s", target);
    n->failed[slot].until = now_s() + KD_NCCL_RETRY_SECONDS;
    pthread_cond_broadcast(&n->cv);
    pthread_mutex_unlock(&n->mu);
    link_free(n, l);
    kd_fail(err, "NCCL link to %s: %s", target, msg);
    return NULL;
}

static int group_regions(kd_nccl_link *l, const kd_dev_region *r, int count, int send, char *msg, size_t len) {
    ncclResult_t res = ncclGroupStart();
    for (int i = 0; res == ncclSuccess && i < count; i++)
        res = send ? ncclSend(r[i].dev, (size_t)r[i].n_bytes, ncclUint8, 1, l->comm, l->stream)
                   : ncclRecv((void *)r[i].dev, (size_t)r[i].n_bytes, ncclUint8, 0, l->comm, l->stream);
    ncclResult_t e = ncclGroupEnd();
    if (res == ncclSuccess) res = e;
    if (res != ncclSuccess && res != ncclInProgress)
        return snprintf(msg, len, "%s: %s (%s)", send ? "ncclSend" : "ncclRecv", ncclGetErrorString(res),
                        ncclGetLastError(l->comm)), -1;
    return 0;
}

int kd_nccl_send(kd_nccl *n, kd_nccl_link *l, const kd_dev_region *r, int count, kd_err *err) {
    char msg[400];
    cudaSetDevice(n->o.device);
    if (group_regions(l, r, count, 1, msg, sizeof msg)) return kd_fail(err, "%s", msg);
    return 0;
}

int kd_nccl_wait(kd_nccl *n, kd_nccl_link *l, kd_err *err) {
    char msg[400];
    const double deadline = now_s() + n->o.transfer_seconds;
    cudaSetDevice(n->o.device);
    if (comm_settle(l->comm, deadline, "NCCL transfer", msg, sizeof msg)) return kd_fail(err, "%s", msg);
    cudaError_t e = cudaEventRecord(l->ev, l->stream);
    while (e == cudaSuccess) {
        e = cudaEventQuery(l->ev);
        if (e == cudaSuccess) return 0;
        if (e != cudaErrorNotReady) break;
        e = cudaSuccess;
        ncclResult_t st = ncclSuccess;
        if (ncclCommGetAsyncError(l->comm, &st) != ncclSuccess || (st != ncclSuccess && st != ncclInProgress))
            return kd_fail(err, "NCCL transfer: %s", ncclGetLastError(l->comm));
        if (now_s() > deadline) return kd_fail(err, "NCCL transfer: not complete after %.1f s", n->o.transfer_seconds);
        nap();
    }
    (void)cudaGetLastError();
    return kd_fail(err, "NCCL transfer: CUDA: %s", cudaGetErrorString(e));
}

/* ----------------------------------------------------------------------- receiver */

int kd_nccl_accept(kd_nccl *n, const char *comm_id, const void *uid, size_t uid_len, char *msg, size_t msglen) {
    if (!kd_nccl_valid_id(comm_id))
        return snprintf(msg, msglen, "comm_id must be 1..%d characters of [0-9A-Za-z_.-]", KD_NCCL_ID_MAX), KD_STATUS_INVALID_ARGUMENT;
    if (uid_len != sizeof(ncclUniqueId))
        return snprintf(msg, msglen, "unique_id must be %zu bytes, not %zu", sizeof(ncclUniqueId), uid_len), KD_STATUS_INVALID_ARGUMENT;
    kd_nccl_link *evicted = NULL, *old = NULL;
    pthread_mutex_lock(&n->mu);
    old = find_locked(n, ROLE_RECV, comm_id);
    if (old && old->busy) {
        pthread_mutex_unlock(&n->mu);
        return snprintf(msg, msglen, "communicator '%s' exists and is in use", comm_id), KD_STATUS_ALREADY_EXISTS;
    }
    if (old) unlink_locked(n, old);
    if (room_locked(n, &evicted)) {
        pthread_mutex_unlock(&n->mu);
        if (old) link_free(n, old);
        return snprintf(msg, msglen, "all %d NCCL links are busy; retry later", n->o.max_links), KD_STATUS_RESOURCE_EXHAUSTED;
    }
    pthread_mutex_unlock(&n->mu);
    if (old) link_free(n, old);
    if (evicted) link_free(n, evicted);
    kd_nccl_link *l = link_new(n, ROLE_RECV, comm_id, msg, msglen);
    if (!l) return KD_STATUS_INTERNAL;
    snprintf(l->id, sizeof l->id, "%s", comm_id);
    ncclUniqueId u;
    memcpy(&u, uid, sizeof u);
    if (link_join(n, l, &u, ROLE_RECV, msg, msglen)) {
        link_free(n, l);
        return KD_STATUS_INTERNAL;
    }
    l->last_used = now_s();
    pthread_mutex_lock(&n->mu);
    l->next = n->links;
    n->links = l;
    n->n_links++;
    pthread_mutex_unlock(&n->mu);
    return 0;
}

kd_nccl_job *kd_nccl_recv_async(kd_nccl *n, const char *comm_id, const kd_dev_region *r, int count,
                                kd_nccl_done_fn done, void *ctx, int *code, char *msg, size_t msglen) {
    pthread_mutex_lock(&n->mu);
    kd_nccl_link *l = kd_nccl_valid_id(comm_id) ? find_locked(n, ROLE_RECV, comm_id) : NULL;
    if (!l || l->busy) {
        pthread_mutex_unlock(&n->mu);
        *code = KD_STATUS_FAILED_PRECONDITION;
        snprintf(msg, msglen, "NCCL communicator '%.64s' is %s here; connect anew", comm_id,
                 l ? "busy" : "unknown");
        return NULL;
    }
    l->busy = 1;
    pthread_mutex_unlock(&n->mu);
    kd_nccl_job *j = calloc(1, sizeof *j);
    if (!j) {
        kd_nccl_release(n, l, 0);
        *code = KD_STATUS_INTERNAL;
        snprintf(msg, msglen, "out of memory");
        return NULL;
    }
    cudaSetDevice(n->o.device);
    if (!l->joined) { /* the sender has joined before it sends a header: this is short */
        if (link_settle(l, now_s() + n->o.connect_seconds, msg, msglen)) {
            kd_nccl_release(n, l, 1);
            free(j);
            *code = KD_STATUS_FAILED_PRECONDITION;
            return NULL;
        }
        l->joined = 1;
    }
    const cudaError_t te = cudaEventRecord(l->t0, l->stream);
    if (te != cudaSuccess) (void)cudaGetLastError(), snprintf(msg, msglen, "CUDA: %s", cudaGetErrorString(te));
    if (te != cudaSuccess || group_regions(l, r, count, 0, msg, msglen)) {
        kd_nccl_release(n, l, 1);
        free(j);
        *code = KD_STATUS_FAILED_PRECONDITION;
        return NULL;
    }
    j->l = l;
    j->done = done;
    j->ctx = ctx;
    j->deadline = now_s() + n->o.transfer_seconds;
    pthread_mutex_lock(&n->mu);
    j->next = n->jobs;
    n->jobs = j;
    pthread_cond_broadcast(&n->cv);
    pthread_mutex_unlock(&n->mu);
    return j;
}

void kd_nccl_drop(kd_nccl *n, const char *comm_id) {
    pthread_mutex_lock(&n->mu);
    kd_nccl_link *l = find_locked(n, ROLE_RECV, comm_id);
    if (l && !l->busy) unlink_locked(n, l);
    else l = NULL;
    pthread_mutex_unlock(&n->mu);
    if (l) link_free(n, l);
}

void kd_nccl_cancel(kd_nccl *n, kd_nccl_job *j) {
    pthread_mutex_lock(&n->mu);
    for (kd_nccl_job *k = n->jobs; k; k = k->next)
        if (k == j) k->cancelled = 1;
    pthread_mutex_unlock(&n->mu);
}

double kd_nccl_link_gpu_seconds(kd_nccl_link *l) {
    float ms = -1.f;
    if (!l->t0 || !l->t1 || cudaEventElapsedTime(&ms, l->t0, l->t1) != cudaSuccess) {
        (void)cudaGetLastError();
        return -1.0;
    }
    return ms * 1e-3;
}
