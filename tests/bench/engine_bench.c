/* engine_bench.c: the decode engine on the CPU backend. For batch 1, 8, 32, s = 0, 3, 7 and
 * the three commit modes: generated tokens/s, decode steps per generated token, acceptance.
 * The baseline measured in the same run is s = 0 in deferred mode at the same batch size;
 * every row prints its speed as a ratio to it. Drafts: the greedy continuation corrupted at
 * a fixed rate (so acceptance is the same for every mode), the draft gate off; then the draft
 * gate on and off with drafts never and mostly accepted. Also the memory of one slot per
 * mode for a few model shapes (bytes, from the layout; nothing allocated).
 * usage: engine_bench OUT_PREFIX COMMIT COMMAND MODEL_DIR */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kd/backend.h"
#include "tests/bench/host.h"
#include "worker/engine.h"
#include "worker/mkmodel.h"
#include "worker/model.h"

#define GEN 32
#define PROMPT 64

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

typedef struct sink {
    int32_t toks[64][GEN];
    int32_t n[64];
} sink;

static void on_event(void *ctx, const kd_event *ev) {
    sink *s = ctx;
    for (int32_t i = 0; i < ev->n_tokens && s->n[ev->id] < GEN; i++) s->toks[ev->id][s->n[ev->id]++] = ev->tokens[i];
}

typedef struct result {
    int batch, spec;
    kd_commit_mode mode;
    double tok_s, steps_per_tok, accept, seconds, held; /* held: draft tokens held back a generated token */
} result;

static int run_case(kd_model *m, int batch, int spec, kd_commit_mode mode, double corrupt, double min_accept,
                    const int32_t oracle[][GEN], int32_t prompts[][PROMPT], sink *out, result *r) {
    kd_err err;
    kd_backend *be = kd_cpu_backend_create(0, &err);
    if (!be || kd_backend_load(be, &m->config, &m->tensors, &err)) return fprintf(stderr, "%s\n", err.msg), -1;
    kd_engine_config cfg;
    kd_engine_config_defaults(&cfg);
    cfg.max_seqs = batch, cfg.max_spec = spec, cfg.commit = mode, cfg.max_queue = 0;
    cfg.max_batch_tokens = (int64_t)batch * (PROMPT + 1 + spec) + 1;
    cfg.draft_min_accept = min_accept;
    memset(out, 0, sizeof *out);
    kd_engine *e = kd_engine_create(be, m->fingerprint, &cfg, on_event, out, &err);
    if (!e) return fprintf(stderr, "%s\n", err.msg), -1;
    for (int i = 0; i < batch; i++) {
        kd_request_params p = {.id = (uint64_t)i, .prompt = prompts[i], .n_prompt = PROMPT, .max_tokens = GEN,
                               .sampling = {.top_p = 1}, .spec_tokens = spec, .draft = KD_DRAFT_ORACLE,
                               .oracle = oracle ? oracle[i] : NULL, .n_oracle = oracle ? GEN : 0,
                               .oracle_corrupt = corrupt, .eos_id = -1};
        if (kd_engine_submit(e, &p, &err) != KD_SUBMIT_OK) return fprintf(stderr, "%s\n", err.msg), -1;
    }
    kd_engine_step(e, &err); /* prefill: not timed */
    kd_engine_stats s0;
    kd_engine_stats_get(e, &s0);
    double t = now();
    while (kd_engine_has_work(e))
        if (kd_engine_step(e, &err) < 0) return fprintf(stderr, "%s\n", err.msg), -1;
    t = now() - t;
    kd_engine_stats st;
    kd_engine_stats_get(e, &st);
    const double toks = (double)(st.tokens_generated - s0.tokens_generated);
    *r = (result){.batch = batch, .spec = spec, .mode = mode, .tok_s = toks / t, .seconds = t,
                  .held = (double)(st.held - s0.held) / toks,
                  .steps_per_tok = (double)(st.steps - s0.steps) * batch / toks,
                  .accept = st.drafted ? (double)st.accepted / (double)st.drafted : 0};
    kd_engine_free(e);
    kd_backend_free(be);
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 5) return fprintf(stderr, "usage: engine_bench OUT_PREFIX COMMIT COMMAND MODEL_DIR\n"), 2;
    kd_err err;
    kd_model *m = kd_model_open(argv[4], &err);
    if (!m) return fprintf(stderr, "%s\n", err.msg), 1;
    static int32_t prompts[32][PROMPT];
    static int32_t oracle[32][GEN];
    static sink out;
    for (int i = 0; i < 32; i++)
        for (int j = 0; j < PROMPT; j++) prompts[i][j] = (int32_t)((i * 131 + j * 7919 + 17) % m->config.vocab);
    /* the greedy continuations (s = 0), reused as corrupted oracle drafts */
    result base;
    if (run_case(m, 32, 0, KD_COMMIT_DEFERRED, 0, 0, NULL, prompts, &out, &base)) return 1;
    for (int i = 0; i < 32; i++) memcpy(oracle[i], out.toks[i], sizeof oracle[i]);
    const int batches[] = {1, 8, 32}, specs[] = {0, 3, 7};
    result res[27];
    int nres = 0;
    for (int bi = 0; bi < 3; bi++)
        for (int si = 0; si < 3; si++)
            for (int mode = 0; mode < 3; mode++) {
                /* the draft gate off: every draft verified */
                if (run_case(m, batches[bi], specs[si], (kd_commit_mode)mode, 0.2, 0, (const int32_t(*)[GEN])oracle,
                             prompts, &out, &res[nres]))
                    return 1;
                for (int i = 0; i < batches[bi]; i++)
                    if (memcmp(out.toks[i], oracle[i], sizeof oracle[i]))
                        return fprintf(stderr, "tokens differ from s=0 (batch %d s %d %s)\n", batches[bi],
                                       specs[si], kd_commit_mode_name((kd_commit_mode)mode)), 1;
                nres++;
            }
    /* the draft gate (deferred, s = 3): drafts always wrong and mostly right, gate off and at the
     * worker's default; the baseline is s = 0 of the same batch (res[(bi) * 9]) */
    const double corrupts[] = {1.0, 0.2}, gates[] = {0, 0.5};
    result gres[12];
    int ngres = 0;
    for (int bi = 0; bi < 3; bi++)
        for (int ci = 0; ci < 2; ci++)
            for (int gi = 0; gi < 2; gi++) {
                if (run_case(m, batches[bi], 3, KD_COMMIT_DEFERRED, corrupts[ci], gates[gi],
                             (const int32_t(*)[GEN])oracle, prompts, &out, &gres[ngres]))
                    return 1;
                for (int i = 0; i < batches[bi]; i++)
                    if (memcmp(out.toks[i], oracle[i], sizeof oracle[i]))
                        return fprintf(stderr, "tokens differ from s=0 (gate %g, corrupt %g, batch %d)\n", gates[gi],
                                       corrupts[ci], batches[bi]), 1;
                ngres++;
            }
    char cpu[256], date[64];
    kd_bench_host(cpu, sizeof cpu, date, sizeof date);
    FILE *js, *md;
    if (kd_bench_open(argv[1], &js, &md)) return 1;
    const long cores = sysconf(_SC_NPROCESSORS_ONLN);
    fprintf(js, "{\"device\":\"%s (%ld cores)\",\"date\":\"%s\",\"commit\":\"%s\",\"command\":\"%s\",\"model\":\"%s\","
                "\"prompt\":%d,\"generated\":%d,\"draft\":\"oracle, corrupt 0.2\",\"results\":[",
            cpu, cores, date, argv[2], argv[3], argv[4], PROMPT, GEN);
    fprintf(md, "# Decode engine on the CPU backend\n\ndevice: %s (%ld cores); date: %s; commit: %s\n\n"
                "command: `%s`\n\nmodel: bundled demo (preset demo, seed 1); prompt %d tokens; %d tokens "
                "generated per request; drafts: the greedy continuation with 20%% of tokens corrupted, every "
                "one verified (the draft gate off; its own table below). Every "
                "configuration produced the same tokens as s = 0. Ratio: tokens/s over s = 0, deferred, same batch.\n\n"
                "On the CPU the forward is bound by arithmetic (every window token costs a full token of "
                "matrix products), so speculation pays only at small batch; the deferred commit saves state "
                "memory traffic, which is what bounds the GPU decode step (see the CUDA results).\n\n"
                "| batch | s | mode | tokens/s | ratio | steps/token | acceptance |\n|---|---|---|---|---|---|---|\n",
            cpu, cores, date, argv[2], argv[3], PROMPT, GEN);
    for (int i = 0; i < nres; i++) {
        const result *r = &res[i];
        const result *b = &res[(i / 9) * 9]; /* s = 0 deferred of the same batch */
        fprintf(js, "%s{\"batch\":%d,\"spec\":%d,\"mode\":\"%s\",\"tok_s\":%.1f,\"ratio\":%.3f,\"steps_per_token\":%.3f,"
                    "\"acceptance\":%.3f}",
                i ? "," : "", r->batch, r->spec, kd_commit_mode_name(r->mode), r->tok_s, r->tok_s / b->tok_s,
                r->steps_per_tok, r->accept);
        fprintf(md, "| %d | %d | %s | %.0f | %.2f | %.3f | %.2f |\n", r->batch, r->spec, kd_commit_mode_name(r->mode),
                r->tok_s, r->tok_s / b->tok_s, r->steps_per_tok, r->accept);
    }
    fprintf(js, "],\"draft_gate\":[");
    fprintf(md, "\n## The draft gate (deferred, s = 3)\n\nDrafts verified only while the request's recent ones "
                "predict `min accept` accepted tokens a step (0: every draft verified; 0.5: the worker's default). "
                "Drafts: the greedy continuation with every token corrupted (never accepted) or 20%%. Ratio: "
                "tokens/s over s = 0 (deferred) of the same batch, above. held: draft tokens proposed and not "
                "verified, per generated token. Every run produced the same tokens as s = 0.\n\n"
                "| batch | corrupted | min accept | tokens/s | ratio | steps/token | acceptance | held |\n"
                "|---|---|---|---|---|---|---|---|\n");
    for (int i = 0; i < ngres; i++) {
        const result *r = &gres[i];
        const result *b = &res[(i / 4) * 9];
        const double c = corrupts[(i / 2) % 2], g = gates[i % 2];
        fprintf(js, "%s{\"batch\":%d,\"corrupt\":%.1f,\"min_accept\":%.1f,\"tok_s\":%.1f,\"ratio\":%.3f,"
                    "\"steps_per_token\":%.3f,\"acceptance\":%.3f,\"held_per_token\":%.3f}",
                i ? "," : "", r->batch, c, g, r->tok_s, r->tok_s / b->tok_s, r->steps_per_tok, r->accept, r->held);
        fprintf(md, "| %d | %.0f%% | %.1f | %.0f | %.2f | %.3f | %.2f | %.2f |\n", r->batch, c * 100, g, r->tok_s,
                r->tok_s / b->tok_s, r->steps_per_tok, r->accept, r->held);
    }
    /* slot memory per mode */
    fprintf(js, "],\"slot_bytes\":[");
    fprintf(md, "\n## Memory of one request slot (fp32 state, bf16 records where the activation dtype applies)\n\n"
                "| model | s | deferred / eager | store-all | committed state only |\n|---|---|---|---|---|\n");
    const char *shapes[] = {"small", "kimi-linear-48b-kda"};
    int first = 1;
    for (int k = 0; k < 2; k++) {
        const kd_preset *p = kd_preset_find(shapes[k]);
        if (!p) continue;
        for (int s = 3; s <= 7; s += 4) {
            size_t d = kd_slot_bytes(&p->config, 1 + s, KD_COMMIT_DEFERRED, 4, 2);
            size_t a = kd_slot_bytes(&p->config, 1 + s, KD_COMMIT_STORE_ALL, 4, 2);
            kd_state_layout l;
            kd_state_layout_init(&l, &p->config);
            const size_t c0 = (size_t)l.slot_elems * 4;
            fprintf(js, "%s{\"model\":\"%s\",\"spec\":%d,\"deferred\":%zu,\"store_all\":%zu,\"committed\":%zu}",
                    first ? "" : ",", shapes[k], s, d, a, c0);
            fprintf(md, "| %s | %d | %.2f MiB | %.2f MiB | %.2f MiB |\n", shapes[k], s, d / 1048576.0, a / 1048576.0,
                    c0 / 1048576.0);
            first = 0;
        }
    }
    fprintf(js, "]}\n");
    fclose(js), fclose(md);
    kd_model_close(m);
    return 0;
}
