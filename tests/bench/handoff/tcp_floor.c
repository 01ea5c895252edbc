/* tcp_floor: the raw TCP loopback floor for the handoff benchmark.
 *
 *   tcp_floor BYTES REPS [CHUNK [WARMUP]]
 *
 * Moves BYTES over a fresh 127.0.0.1 connection REPS times, between two processes (the
 * receiver forks the sender), the way a handoff moves a state: the sender connects, writes
 * the payload from a filled buffer in CHUNK-byte writes (default 1 MiB, the handoff's chunk),
 * then waits for a 1-byte acknowledgement; the receiver reads everything into one
 * preallocated, already touched buffer (the "slot") and acknowledges. The sender times each
 * repetition from before connect() to the acknowledgement (what PrefillResponse.handoff_seconds
 * spans on the prefill side), after WARMUP untimed repetitions (default 1: the first
 * connection of a process pays one-off costs). Also times a memcpy of the same bytes (a single-core memory
 * floor, for context). Prints one JSON line:
 *   {"bytes":B,"reps":R,"chunk":C,"seconds":[...],"median_s":..,"min_s":..,
 *    "median_gib_s":..,"memcpy_median_s":..,"memcpy_gib_s":..}
 * No dependencies beyond libc. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void die(const char *what) {
    fprintf(stderr, "tcp_floor: %s: %s\n", what, strerror(errno));
    exit(1);
}

static int write_all(int fd, const void *buf, size_t n) {
    const char *p = buf;
    while (n) {
        ssize_t k = write(fd, p, n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        p += k, n -= (size_t)k;
    }
    return 0;
}

static int read_all(int fd, void *buf, size_t n) {
    char *p = buf;
    while (n) {
        ssize_t k = read(fd, p, n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        p += k, n -= (size_t)k;
    }
    return 0;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    double *s = malloc((size_t)n * sizeof *s);
    if (!s) die("malloc");
    memcpy(s, v, (size_t)n * sizeof *s);
    qsort(s, (size_t)n, sizeof *s, cmp_d);
    double m = n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
    free(s);
    return m;
}

/* The sender (child): REPS connections, each timed to its acknowledgement; the times go
 * back through the pipe. */
static void sender(int port, size_t bytes, int reps, int warmup, size_t chunk, int out_fd) {
    char *buf = malloc(bytes);
    if (!buf) die("malloc");
    for (size_t i = 0; i < bytes; i++) buf[i] = (char)(i * 131 + 7);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    for (int r = -warmup; r < reps; r++) {
        const double t0 = now_s();
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        if (fd < 0) die("socket");
        if (connect(fd, (struct sockaddr *)&a, sizeof a)) die("connect");
        for (size_t off = 0; off < bytes; off += chunk) {
            size_t n = bytes - off < chunk ? bytes - off : chunk;
            if (write_all(fd, buf + off, n)) die("write");
        }
        char ack;
        if (read_all(fd, &ack, 1)) die("read ack");
        const double dt = now_s() - t0;
        close(fd);
        if (r >= 0 && write_all(out_fd, &dt, sizeof dt)) die("pipe");
    }
    free(buf);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: tcp_floor BYTES REPS [CHUNK [WARMUP]]\n");
        return 2;
    }
    const size_t bytes = strtoull(argv[1], NULL, 10);
    const int reps = atoi(argv[2]);
    const size_t chunk = argc > 3 ? strtoull(argv[3], NULL, 10) : (size_t)1 << 20;
    const int warmup = argc > 4 ? atoi(argv[4]) : 1;
    if (!bytes || reps < 1 || !chunk || warmup < 0) {
        fprintf(stderr, "tcp_floor: BYTES, REPS and CHUNK must be positive\n");
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    int ls = socket(AF_INET, SOCK_STREAM, 0);
    if (ls < 0) die("socket");
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t al = sizeof a;
    if (bind(ls, (struct sockaddr *)&a, sizeof a) || listen(ls, 4) || getsockname(ls, (struct sockaddr *)&a, &al))
        die("listen");
    /* the "slot": allocated and touched before any transfer, as the decode worker's are */
    char *slot = malloc(bytes), *src = malloc(bytes);
    if (!slot || !src) die("malloc");
    memset(slot, 0, bytes);
    memset(src, 1, bytes);
    int pfd[2];
    if (pipe(pfd)) die("pipe");
    pid_t pid = fork();
    if (pid < 0) die("fork");
    if (pid == 0) {
        close(pfd[0]);
        close(ls);
        sender(ntohs(a.sin_port), bytes, reps, warmup, chunk, pfd[1]);
        _exit(0);
    }
    close(pfd[1]);
    for (int r = -warmup; r < reps; r++) {
        int fd = accept(ls, NULL, NULL);
        if (fd < 0) die("accept");
        if (read_all(fd, slot, bytes)) die("read payload");
        if (write_all(fd, "k", 1)) die("write ack");
        char extra;
        (void)!read(fd, &extra, 1); /* the sender's close */
        close(fd);
    }
    double *sec = calloc((size_t)reps, sizeof *sec);
    if (!sec) die("calloc");
    for (int r = 0; r < reps; r++)
        if (read_all(pfd[0], &sec[r], sizeof sec[r])) die("read times");
    int st = 0;
    waitpid(pid, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st)) {
        fprintf(stderr, "tcp_floor: the sender failed\n");
        return 1;
    }
    double *mc = calloc((size_t)reps, sizeof *mc);
    if (!mc) die("calloc");
    for (int r = 0; r < reps; r++) {
        const double t0 = now_s();
        memcpy(slot, src, bytes);
        mc[r] = now_s() - t0;
        src[r % bytes] ^= slot[(r * 4099) % bytes]; /* keep the copies observable */
    }
    double mn = sec[0];
    for (int r = 1; r < reps; r++) mn = sec[r] < mn ? sec[r] : mn;
    const double med = median(sec, reps), mcm = median(mc, reps), gib = (double)bytes / (1u << 30);
    printf("{\"bytes\":%zu,\"reps\":%d,\"warmup\":%d,\"chunk\":%zu,\"seconds\":[", bytes, reps, warmup, chunk);
    for (int r = 0; r < reps; r++) printf("%s%.6f", r ? "," : "", sec[r]);
    printf("],\"median_s\":%.6f,\"min_s\":%.6f,\"median_gib_s\":%.3f,\"memcpy_median_s\":%.6f,\"memcpy_gib_s\":%.3f}\n",
           med, mn, gib / med, mcm, gib / mcm);
    free(sec), free(mc), free(slot), free(src);
    close(ls);
    return 0;
}
