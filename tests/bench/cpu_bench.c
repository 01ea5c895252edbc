/* cpu_bench.c: CPU backend throughput. For each model: prefill tokens/s (one prompt in
 * chunks), decode tokens/s at batch 1 and batch 8 (one token per row per step), and the
 * decode step against its roofline: the weight bytes the step must read, timed as a
 * memcpy of the same number of bytes in the same run (the "copy floor").
 * Writes a JSON file and a markdown table (see --out). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kd/backend.h"
#include "tests/bench/host.h"
#include "worker/model.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

typedef struct result {
    char name[128];
    double params_m, prefill_tps, decode1_tps, decode8_tps, step_ms, copy_ms;
} result;

static int bench_model(const char *dir, const char *name, int prompt_len, result *r) {
    kd_err err;
    kd_model *m = kd_model_open(dir, &err);
    if (!m) return fprintf(stderr, "%s\n", err.msg), -1;
    kd_backend *be = kd_cpu_backend_create(0, &err);
    const kd_config *c = &m->config;
    if (!be || kd_backend_load(be, c, &m->tensors, &err) ||
        kd_backend_reserve(be, 8, 8, prompt_len, 8, KD_COMMIT_DEFERRED, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        kd_backend_free(be), kd_model_close(m);
        return -1;
    }
    const int32_t V = c->vocab;
    float *logits = malloc((size_t)8 * V * sizeof *logits);
    int32_t *tok = malloc((size_t)prompt_len * sizeof *tok);
    for (int i = 0; i < prompt_len; i++) tok[i] = (int32_t)((i * 7919u + 13u) % (unsigned)V);
    /* weight bytes the backend streams per step (fp32 copies of every matrix) */
    double params = (double)c->vocab * c->hidden * (c->tie_embeddings ? 1 : 2);
    const double D = c->hidden, QK = kd_config_qk_dim(c), VD = kd_config_v_dim(c);
    params += c->n_layers * (D * (2 * QK + VD + 2 * c->head_v + c->n_v_heads) +
                             c->n_v_heads * (double)c->head_k * c->head_v +
                             c->n_v_heads * (double)c->head_v * c->head_v + VD * D +
                             3.0 * c->intermediate * D);
    snprintf(r->name, sizeof r->name, "%s", name);
    r->params_m = params / 1e6;
    /* prefill: best of 3 */
    double best = 1e30;
    for (int rep = 0; rep < 3; rep++) {
        kd_backend_reset_slot(be, 0, NULL);
        kd_batch_row row = {.slot = 0, .n_tokens = prompt_len, .logits = KD_LOGITS_LAST};
        kd_batch b = {1, &row, tok};
        double t = now();
        kd_backend_forward(be, &b, logits, NULL);
        t = now() - t;
        if (t < best) best = t;
    }
    r->prefill_tps = prompt_len / best;
    /* decode: batch 1 and batch 8, 32 steps each after warm-up */
    for (int bs = 1; bs <= 8; bs += 7) {
        kd_batch_row rows[8];
        for (int i = 0; i < bs; i++) rows[i] = (kd_batch_row){.slot = i, .n_tokens = 1, .logits = KD_LOGITS_LAST};
        kd_batch b = {bs, rows, tok};
        kd_backend_forward(be, &b, logits, NULL);
        const int steps = 32;
        double t = now();
        for (int s = 0; s < steps; s++) kd_backend_forward(be, &b, logits, NULL);
        t = now() - t;
        if (bs == 1) r->decode1_tps = steps / t, r->step_ms = t / steps * 1e3;
        else r->decode8_tps = steps * bs / t;
    }
    /* copy floor: memcpy of the fp32 weight bytes (best of 5) */
    size_t bytes = (size_t)(params * 4);
    char *src = malloc(bytes), *dst = malloc(bytes);
    memset(src, 1, bytes), memset(dst, 0, bytes);
    best = 1e30;
    for (int rep = 0; rep < 5; rep++) {
        double t = now();
        memcpy(dst, src, bytes);
        t = now() - t;
        if (t < best) best = t;
    }
    r->copy_ms = best * 1e3;
    free(src), free(dst), free(logits), free(tok);
    kd_backend_free(be);
    kd_model_close(m);
    return 0;
}

int main(int argc, char **argv) {
    /* usage: cpu_bench OUT_PREFIX COMMIT COMMAND NAME=DIR... */
    if (argc < 5) {
        fprintf(stderr, "usage: cpu_bench OUT_PREFIX COMMIT COMMAND NAME=MODEL_DIR...\n");
        return 2;
    }
    int n = argc - 4;
    result *res = calloc((size_t)n, sizeof *res);
    for (int i = 0; i < n; i++) {
        char *spec = strdup(argv[4 + i]), *eq = strchr(spec, '=');
        if (!eq) return fprintf(stderr, "bad NAME=DIR: %s\n", spec), 2;
        *eq = 0;
        if (bench_model(eq + 1, spec, 256, &res[i])) return 1;
        free(spec);
    }
    char cpu[256], date[64];
    kd_bench_host(cpu, sizeof cpu, date, sizeof date);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    FILE *js, *md;
    if (kd_bench_open(argv[1], &js, &md)) return 1;
    fprintf(js, "{\"device\":\"%s (%ld cores)\",\"date\":\"%s\",\"commit\":\"%s\",\"command\":\"%s\",\"results\":[",
            cpu, cores, date, argv[2], argv[3]);
    fprintf(md, "# CPU backend throughput\n\ndevice: %s (%ld cores); date: %s; commit: %s\n\ncommand: `%s`\n\n",
            cpu, cores, date, argv[2], argv[3]);
    fprintf(md, "| model | params (M) | prefill tok/s (256) | decode tok/s b=1 | decode tok/s b=8 | step ms b=1 | weight copy ms | step / copy |\n");
    fprintf(md, "|---|---|---|---|---|---|---|---|\n");
    for (int i = 0; i < n; i++) {
        result *r = &res[i];
        fprintf(js, "%s{\"model\":\"%s\",\"params_m\":%.2f,\"prefill_tok_s\":%.1f,\"decode_b1_tok_s\":%.1f,"
                    "\"decode_b8_tok_s\":%.1f,\"step_ms_b1\":%.3f,\"weight_copy_ms\":%.3f,\"step_over_copy\":%.2f}",
                i ? "," : "", r->name, r->params_m, r->prefill_tps, r->decode1_tps, r->decode8_tps,
                r->step_ms, r->copy_ms, r->step_ms / r->copy_ms);
        fprintf(md, "| %s | %.2f | %.0f | %.0f | %.0f | %.3f | %.3f | %.2f |\n", r->name, r->params_m,
                r->prefill_tps, r->decode1_tps, r->decode8_tps, r->step_ms, r->copy_ms,
                r->step_ms / r->copy_ms);
        printf("%-8s params %.2fM  prefill %.0f tok/s  decode b1 %.0f tok/s  b8 %.0f tok/s  step/copy %.2f\n",
               r->name, r->params_m, r->prefill_tps, r->decode1_tps, r->decode8_tps, r->step_ms / r->copy_ms);
    }
    fprintf(js, "]}\n");
    fclose(js), fclose(md);
    free(res);
    return 0;
}
