/* ngram_bench.c: the engine's n-gram (prompt-lookup) proposals on the host, a decode step's
 * worth of them: R requests, each with a history of P prompt tokens that grows by one token a
 * step, each step one proposal per request (n 1..3, up to 3 drafts, the engine's defaults). Two
 * ways to the same answers: the scan of the whole history (kd_ngram_propose, the engine's way
 * until the index) and the index (kd_ngram_index_propose, the engine's way since); the scan is
 * the baseline of the same run, and every proposal of the two is compared (a difference fails
 * the run). Histories: tokens drawn from a Zipf law over a 32768-token vocabulary (text-like:
 * frequent tokens make long chains), and the same with a block of the history repeated (code
 * or retrieval-like: long matches). Prints the time of a step's proposals per request.
 * usage: ngram_bench OUT_PREFIX COMMIT COMMAND */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tests/bench/host.h"
#include "worker/spec.h"

enum { R = 128, STEPS = 64, VOCAB = 32768 };

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static double uni(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (double)(rng >> 11) * 0x1.0p-53;
}

static double *zipf_cdf(void) {
    double *c = malloc(VOCAB * sizeof *c), s = 0;
    for (int i = 0; i < VOCAB; i++) s += 1.0 / (i + 1), c[i] = s;
    for (int i = 0; i < VOCAB; i++) c[i] /= s;
    return c;
}

static int32_t zipf(const double *cdf) {
    const double u = uni();
    int lo = 0, hi = VOCAB - 1;
    while (lo < hi) {
        const int mid = (lo + hi) / 2;
        if (cdf[mid] < u) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

typedef struct point {
    int64_t prompt;
    int repeated;
    double scan_us, index_us; /* a step's proposals, per request */
    int64_t proposed;         /* proposals that matched (either way: the same) */
} point;

/* One point: R histories, STEPS steps; the time of the scan's and of the index's proposals. */
static int run_point(const double *cdf, int64_t P, int repeated, point *pt) {
    const int64_t cap = P + STEPS + 1;
    int32_t *hist = malloc((size_t)(R * cap) * sizeof *hist);
    kd_ngram_index *ix = calloc(R, sizeof *ix);
    if (!hist || !ix) return fprintf(stderr, "out of memory\n"), -1;
    for (int r = 0; r < R; r++) {
        int32_t *h = hist + r * cap;
        for (int64_t i = 0; i < P; i++) h[i] = zipf(cdf);
        if (repeated && P >= 64) { /* the last quarter copies a block from the first half */
            const int64_t len = P / 4, from = (int64_t)(uni() * (double)(P / 2 - len > 0 ? P / 2 - len : 1));
            memcpy(h + P - len, h + from, (size_t)len * sizeof *h);
        }
        for (int64_t i = P; i < cap; i++) h[i] = zipf(cdf); /* the steps' new tokens */
        if (kd_ngram_index_init(&ix[r], cap, 1, 3)) return fprintf(stderr, "out of memory\n"), -1;
        int32_t o[3];
        kd_ngram_index_propose(&ix[r], h, P, 3, 3, o); /* the prompt chained, as at a request's first step */
    }
    double t_scan = 0, t_index = 0;
    int64_t matched = 0;
    int32_t a[3], b[3];
    for (int s = 0; s < STEPS; s++) {
        const int64_t n = P + s;
        double t0 = now();
        int32_t na[R];
        for (int r = 0; r < R; r++) na[r] = kd_ngram_propose(hist + r * cap, n, 1, 3, 3, a);
        t_scan += now() - t0;
        t0 = now();
        int32_t nb[R];
        for (int r = 0; r < R; r++) nb[r] = kd_ngram_index_propose(&ix[r], hist + r * cap, n, 3, 3, b);
        t_index += now() - t0;
        for (int r = 0; r < R; r++) { /* the same answers (outside the timed loops) */
            const int32_t x = kd_ngram_propose(hist + r * cap, n, 1, 3, 3, a);
            const int32_t y = kd_ngram_index_propose(&ix[r], hist + r * cap, n, 3, 3, b);
            if (x != y || x != na[r] || y != nb[r] || memcmp(a, b, (size_t)x * sizeof *a))
                return fprintf(stderr, "prompt %lld step %d request %d: scan and index differ\n", (long long)P, s, r),
                       -1;
            matched += x > 0;
        }
    }
    for (int r = 0; r < R; r++) kd_ngram_index_free(&ix[r]);
    free(ix), free(hist);
    pt->prompt = P, pt->repeated = repeated, pt->proposed = matched;
    pt->scan_us = t_scan / STEPS / R * 1e6, pt->index_us = t_index / STEPS / R * 1e6;
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 4) return fprintf(stderr, "usage: %s OUT_PREFIX COMMIT COMMAND\n", argv[0]), 2;
    double *cdf = zipf_cdf();
    const int64_t prompts[] = {256, 2048, 8192, 32768};
    point pts[8];
    int np = 0;
    for (int rep = 0; rep < 2; rep++)
        for (size_t i = 0; i < sizeof prompts / sizeof prompts[0]; i++)
            if (run_point(cdf, prompts[i], rep, &pts[np++])) return 1;
    free(cdf);
    char cpu[256], date[64];
    kd_bench_host(cpu, sizeof cpu, date, sizeof date);
    FILE *js, *md;
    if (kd_bench_open(argv[1], &js, &md)) return 1;
    const long cores = sysconf(_SC_NPROCESSORS_ONLN);
    fprintf(js,
            "{\"device\":\"%s (%ld cores)\",\"date\":\"%s\",\"commit\":\"%s\",\"command\":\"%s\",\"requests\":%d,"
            "\"steps\":%d,\"vocab\":%d,\"ngram\":[1,3],\"max_draft\":3,\"points\":[",
            cpu, cores, date, argv[2], argv[3], R, STEPS, VOCAB);
    fprintf(md,
            "# The n-gram proposer on the host: the scan of the history against the index\n\n"
            "device: %s (%ld cores); date: %s; commit: %s\n\ncommand: `%s`\n\n"
            "%d requests, %d decode steps, one proposal a request and step (n-grams of 1-3 tokens, up to 3 "
            "drafts: the engine's defaults); histories of the prompt's length growing by one token a step, "
            "tokens from a Zipf law over %d ids; \"repeated\": the prompt's last quarter copies a block of its "
            "first half. Baseline in the same run: the scan (kd_ngram_propose); every proposal of the index "
            "was compared with the scan's (the same). Time of a step's proposals, per request (a step of R "
            "requests takes R times that on the engine's thread).\n\n"
            "| prompt tokens | history | scan us | index us | scan / index | step of %d requests, scan ms | "
            "index ms | proposals that matched |\n|---|---|---|---|---|---|---|---|\n",
            cpu, cores, date, argv[2], argv[3], R, STEPS, VOCAB, R);
    for (int i = 0; i < np; i++) {
        const point *p = &pts[i];
        fprintf(js,
                "%s{\"prompt\":%lld,\"repeated\":%s,\"scan_us\":%.4f,\"index_us\":%.4f,\"scan_over_index\":%.2f,"
                "\"matched\":%lld}",
                i ? "," : "", (long long)p->prompt, p->repeated ? "true" : "false", p->scan_us, p->index_us,
                p->scan_us / p->index_us, (long long)p->proposed);
        fprintf(md, "| %lld | %s | %.3f | %.3f | %.1f | %.3f | %.3f | %lld of %d |\n", (long long)p->prompt,
                p->repeated ? "repeated" : "Zipf", p->scan_us, p->index_us, p->scan_us / p->index_us,
                p->scan_us * R / 1e3, p->index_us * R / 1e3, (long long)p->proposed, R * STEPS);
        printf("prompt %6lld %-8s scan %9.3f us  index %7.3f us  (%.1f x)\n", (long long)p->prompt,
               p->repeated ? "repeated" : "Zipf", p->scan_us, p->index_us, p->scan_us / p->index_us);
    }
    fprintf(js, "]}\n");
    fclose(js), fclose(md);
    return 0;
}
