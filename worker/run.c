/* run.c: `kdecode run`: offline generation through the decode engine on the CPU backend
 * (chunked prefill, speculative verify windows, the chosen commit mode, the prefix cache),
 * printing one JSON line with the tokens and the step statistics. */
#include "worker/run.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kd/backend.h"
#include "worker/engine.h"
#include "worker/model.h"
#include "worker/safetensors.h"
#include "worker/sample.h"

int kd_parse_i64(const char *s, long long lo, long long hi, long long *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

int kd_parse_u64(const char *s, unsigned long long *out) {
    char *end;
    errno = 0;
    if (*s == '-') return -1;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end) return -1;
    *out = v;
    return 0;
}

int kd_parse_f64(const char *s, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v) || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

long kd_parse_id_list(const char *s, long long hi, int32_t **out, const char **why) {
    size_t cap = 1;
    for (const char *p = s; *p; p++) cap += *p == ',';
    int32_t *ids = malloc(cap * sizeof *ids);
    char *copy = strdup(s);
    long n = 0;
    if (!ids || !copy) {
        *why = "out of memory";
        goto fail;
    }
    char *save = NULL;
    for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        long long v;
        if (kd_parse_i64(tok, 0, hi - 1, &v)) {
            *why = "token id not an integer in [0, vocab)";
            goto fail;
        }
        ids[n++] = (int32_t)v;
    }
    /* strtok skips empty fields: "1,,2" or ",1" must not pass silently */
    if (!*s || s[0] == ',' || s[strlen(s) - 1] == ',' || strstr(s, ",,")) {
        *why = "empty token id in the list";
        goto fail;
    }
    free(copy);
    *out = ids;
    return n;
fail:
    free(ids);
    free(copy);
    return -1;
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: kdecode run --model DIR --prompt-ids 1,2,3 --max-tokens N [flags]\n"
            "Generates on the CPU backend and prints one JSON line:\n"
            "  {\"tokens\":[...],\"finish\":...,\"steps\":...,\"drafted\":...,\"accepted\":...,\"held\":...,\n"
            "   \"prefix_hit_tokens\":...}  (with --batch B > 1 also \"batch\":[[...],...])\n"
            "sampling:    --temperature T (0: greedy) --top-k K --top-p P --seed S\n"
            "speculation: --spec-tokens S (0..31) --draft none|ngram|oracle [--draft-corrupt P]\n"
            "             (oracle: the greedy continuation, computed first; for tests)\n"
            "             --draft-min-accept A (drafts verified while they are expected to\n"
            "             earn A accepted tokens a step; default 0.5, 0: always)\n"
            "state:       --commit deferred|eager|store-all\n"
            "             --prefix-block N [--prefix-cache-bytes B] (align-mode prefix cache)\n"
            "batching:    --batch B (B copies of the prompt, seeds S..S+B-1)\n"
            "             --prefill-chunk N (per-step token budget, default 512)\n"
            "backend:     --backend cpu|cuda|auto (default cpu) --activations fp32|bf16 (GPU)\n"
            "other:       --dump-logits FILE (safetensors `logits` F32 [prompt_len, vocab])\n"
            "             --ignore-eos  --f64 (double precision reference)\n");
}

typedef struct run_out {
    int32_t *toks; /* [batch][max_tokens] */
    int32_t *n;
    kd_finish *fin;
    int32_t max_tokens;
} run_out;

static void on_event(void *ctx, const kd_event *ev) {
    run_out *o = ctx;
    for (int32_t i = 0; i < ev->n_tokens && o->n[ev->id] < o->max_tokens; i++)
        o->toks[ev->id * (uint64_t)o->max_tokens + (uint64_t)o->n[ev->id]++] = ev->tokens[i];
    if (ev->finish != KD_FINISH_NONE) o->fin[ev->id] = ev->finish;
}

/* Logits of every prompt position, in one prefill, for --dump-logits. */
static int dump_logits(kd_model *m, int use_f64, const int32_t *ids, long n, const char *path, kd_err *err) {
    const int32_t V = m->config.vocab;
    int rc = -1;
    float *all = malloc((size_t)n * V * sizeof *all);
    kd_backend *be = kd_cpu_backend_create(use_f64, err);
    kd_st_writer *w = NULL;
    if (!all || !be) goto done;
    if (kd_backend_load(be, &m->config, &m->tensors, err) ||
        kd_backend_reserve(be, 1, 1, n, 1, KD_COMMIT_DEFERRED, err))
        goto done;
    kd_batch_row row = {.slot = 0, .n_tokens = (int32_t)n, .logits = KD_LOGITS_ALL};
    kd_batch b = {.n_rows = 1, .rows = &row, .tokens = ids};
    if (kd_backend_forward(be, &b, all, err)) goto done;
    int64_t shape[2] = {n, V};
    if (!(w = kd_st_writer_new())) {
        kd_fail(err, "out of memory");
        goto done;
    }
    if (kd_st_writer_add(w, "logits", KD_F32, 2, shape, all, err) || kd_st_writer_write(w, path, err)) goto done;
    rc = 0;
done:
    if (!all) kd_fail(err, "out of memory for %ld x %d logits", n, V);
    kd_st_writer_free(w);
    kd_backend_free(be);
    free(all);
    return rc;
}

/* Runs `batch` copies of the prompt through a fresh engine; fills out and the stats. */
static const char *g_backend = "cpu";
static int g_act_bf16;

static int generate(kd_model *m, int use_f64, const kd_engine_config *cfg, const kd_request_params *proto,
                    int32_t batch, run_out *out, kd_engine_stats *st, kd_err *err) {
    int rc = -1;
    kd_engine *e = NULL;
    kd_backend *be = use_f64 ? kd_cpu_backend_create(1, err) : kd_backend_create(g_backend, g_act_bf16, err);
    if (!be || kd_backend_load(be, &m->config, &m->tensors, err)) goto done;
    if (!(e = kd_engine_create(be, m->fingerprint, cfg, on_event, out, err))) goto done;
    for (int32_t i = 0; i < batch; i++) {
        kd_request_params p = *proto;
        p.id = (uint64_t)i;
        p.sampling.seed = proto->sampling.seed + (uint64_t)i;
        if (kd_engine_submit(e, &p, err) != KD_SUBMIT_OK) goto done;
    }
    while (kd_engine_has_work(e))
        if (kd_engine_step(e, err) < 0) goto done;
    kd_engine_stats_get(e, st);
    rc = 0;
done:
    kd_engine_free(e);
    kd_backend_free(be);
    return rc;
}

int kd_run_main(int argc, char **argv) {
    enum { O_MODEL = 1, O_PROMPT, O_MAX, O_TEMP, O_TOPK, O_TOPP, O_SEED, O_DUMP, O_CHUNK,
           O_IGNORE_EOS, O_F64, O_SPEC, O_DRAFT, O_CORRUPT, O_COMMIT, O_BLOCK, O_CACHE, O_BATCH,
           O_BACKEND, O_ACT, O_MINACC, O_HELP };
    static const struct option opts[] = {
        {"model", required_argument, 0, O_MODEL},       {"prompt-ids", required_argument, 0, O_PROMPT},
        {"max-tokens", required_argument, 0, O_MAX},    {"temperature", required_argument, 0, O_TEMP},
        {"top-k", required_argument, 0, O_TOPK},        {"top-p", required_argument, 0, O_TOPP},
        {"seed", required_argument, 0, O_SEED},         {"dump-logits", required_argument, 0, O_DUMP},
        {"prefill-chunk", required_argument, 0, O_CHUNK}, {"ignore-eos", no_argument, 0, O_IGNORE_EOS},
        {"f64", no_argument, 0, O_F64},                 {"spec-tokens", required_argument, 0, O_SPEC},
        {"draft", required_argument, 0, O_DRAFT},       {"draft-corrupt", required_argument, 0, O_CORRUPT},
        {"commit", required_argument, 0, O_COMMIT},     {"prefix-block", required_argument, 0, O_BLOCK},
        {"prefix-cache-bytes", required_argument, 0, O_CACHE}, {"batch", required_argument, 0, O_BATCH},
        {"backend", required_argument, 0, O_BACKEND},   {"activations", required_argument, 0, O_ACT},
        {"draft-min-accept", required_argument, 0, O_MINACC},
        {"help", no_argument, 0, O_HELP},               {0, 0, 0, 0}};
    const char *model_dir = NULL, *prompt = NULL, *dump = NULL;
    long long max_tokens = -1, chunk = 512, spec = 0, block = 0, batch = 1, v;
    unsigned long long cache_bytes = 256ull << 20, u;
    double corrupt = 0, min_accept = -1;
    kd_sampling samp = {.temperature = 0, .top_k = 0, .top_p = 1, .seed = 0};
    kd_draft_source draft = KD_DRAFT_NGRAM;
    kd_commit_mode commit = KD_COMMIT_DEFERRED;
    int ignore_eos = 0, use_f64 = 0, o, li = 0, draft_set = 0;
    optind = 1;
    opterr = 0;
    while ((o = getopt_long(argc, argv, "", opts, &li)) != -1) {
        int bad = 0;
        switch (o) {
        case O_MODEL: model_dir = optarg; break;
        case O_PROMPT: prompt = optarg; break;
        case O_MAX: bad = kd_parse_i64(optarg, 0, 1 << 24, &max_tokens); break;
        case O_TEMP: bad = kd_parse_f64(optarg, 0, 1e4, &samp.temperature); break;
        case O_TOPK: bad = kd_parse_i64(optarg, 0, 1 << 30, &v); samp.top_k = (int32_t)v; break;
        case O_TOPP: bad = kd_parse_f64(optarg, 1e-9, 1, &samp.top_p); break;
        case O_SEED: bad = kd_parse_u64(optarg, &u); samp.seed = u; break;
        case O_DUMP: dump = optarg; break;
        case O_CHUNK: bad = kd_parse_i64(optarg, 1, 1 << 20, &chunk); break;
        case O_IGNORE_EOS: ignore_eos = 1; break;
        case O_F64: use_f64 = 1; break;
        case O_SPEC: bad = kd_parse_i64(optarg, 0, 31, &spec); break;
        case O_DRAFT: bad = kd_draft_source_parse(optarg, &draft) || draft == KD_DRAFT_CALLER; draft_set = 1; break;
        case O_CORRUPT: bad = kd_parse_f64(optarg, 0, 1, &corrupt); break;
        case O_MINACC: bad = kd_parse_f64(optarg, 0, 32, &min_accept); break;
        case O_COMMIT: bad = kd_commit_mode_parse(optarg, &commit); break;
        case O_BLOCK: bad = kd_parse_i64(optarg, 1, 1 << 20, &block); break;
        case O_CACHE: bad = kd_parse_u64(optarg, &cache_bytes); break;
        case O_BATCH: bad = kd_parse_i64(optarg, 1, 4096, &batch); break;
        case O_BACKEND: g_backend = optarg; bad = strcmp(optarg, "cpu") && strcmp(optarg, "cuda") && strcmp(optarg, "auto"); break;
        case O_ACT: bad = strcmp(optarg, "fp32") && strcmp(optarg, "bf16"); g_act_bf16 = !strcmp(optarg, "bf16"); break;
        case O_HELP: usage(stdout); return 0;
        default:
            fprintf(stderr, "kdecode run: unknown flag or missing value: %s\n", argv[optind - 1]);
            usage(stderr);
            return 2;
        }
        if (bad) {
            fprintf(stderr, "kdecode run: bad value for --%s: '%s'\n", opts[li].name, optarg);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "kdecode run: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (!model_dir || !prompt || max_tokens < 0) {
        fprintf(stderr, "kdecode run: --model, --prompt-ids and --max-tokens are required\n");
        usage(stderr);
        return 2;
    }
    if (draft_set && draft == KD_DRAFT_NONE) spec = 0;

    int rc = 1;
    kd_err err = {{0}};
    int32_t *ids = NULL;
    run_out out = {0}, ref = {0};
    kd_model *m = kd_model_open(model_dir, &err);
    if (!m) {
        fprintf(stderr, "kdecode run: %s\n", err.msg);
        return 1;
    }
    const char *why = NULL;
    long n_prompt = kd_parse_id_list(prompt, m->config.vocab, &ids, &why);
    if (n_prompt <= 0) {
        fprintf(stderr, "kdecode run: --prompt-ids '%s': %s (vocab %d)\n", prompt,
                n_prompt ? why : "empty", m->config.vocab);
        rc = 2;
        goto done;
    }
    if (dump && dump_logits(m, use_f64, ids, n_prompt, dump, &err)) {
        fprintf(stderr, "kdecode run: --dump-logits %s: %s\n", dump, err.msg);
        goto done;
    }
    kd_engine_stats st = {0};
    if (max_tokens > 0) {
        kd_engine_config cfg;
        kd_engine_config_defaults(&cfg);
        cfg.max_seqs = (int32_t)batch;
        cfg.max_queue = 0;
        cfg.max_spec = (int32_t)spec;
        cfg.commit = commit;
        cfg.max_model_len = n_prompt + max_tokens + 1;
        cfg.max_batch_tokens = chunk + batch * (1 + spec) + 1;
        cfg.prefix_block = (int32_t)block;
        cfg.prefix_cache_bytes = (size_t)cache_bytes;
        if (min_accept >= 0) cfg.draft_min_accept = min_accept;
        kd_request_params p = {.prompt = ids, .n_prompt = n_prompt, .max_tokens = (int32_t)max_tokens,
                               .sampling = samp, .spec_tokens = (int32_t)spec, .draft = draft,
                               .eos_id = ignore_eos ? -1 : m->eos_token_id};
        if (p.eos_id >= m->config.vocab) p.eos_id = -1;
        out.max_tokens = (int32_t)max_tokens;
        out.toks = calloc((size_t)batch * (size_t)max_tokens, sizeof *out.toks);
        out.n = calloc((size_t)batch, sizeof *out.n);
        out.fin = calloc((size_t)batch, sizeof *out.fin);
        if (!out.toks || !out.n || !out.fin) {
            fprintf(stderr, "kdecode run: out of memory\n");
            goto done;
        }
        if (draft == KD_DRAFT_ORACLE && spec > 0) { /* first the greedy continuation */
            kd_engine_config rcfg = cfg;
            rcfg.max_seqs = 1, rcfg.max_spec = 0, rcfg.prefix_block = 0;
            rcfg.max_batch_tokens = chunk + 2;
            kd_request_params rp = p;
            rp.sampling.temperature = 0, rp.spec_tokens = 0, rp.draft = KD_DRAFT_NONE, rp.eos_id = -1;
            ref.max_tokens = (int32_t)max_tokens;
            ref.toks = calloc((size_t)max_tokens, sizeof *ref.toks);
            ref.n = calloc(1, sizeof *ref.n);
            ref.fin = calloc(1, sizeof *ref.fin);
            kd_engine_stats rst;
            if (!ref.toks || !ref.n || !ref.fin || generate(m, use_f64, &rcfg, &rp, 1, &ref, &rst, &err)) {
                fprintf(stderr, "kdecode run: %s\n", ref.toks ? err.msg : "out of memory");
                goto done;
            }
            p.oracle = ref.toks, p.n_oracle = ref.n[0], p.oracle_corrupt = corrupt;
        }
        if (generate(m, use_f64, &cfg, &p, (int32_t)batch, &out, &st, &err)) {
            fprintf(stderr, "kdecode run: %s\n", err.msg);
            rc = strstr(err.msg, "engine:") || strstr(err.msg, "request") ? 2 : 1;
            goto done;
        }
    }
    printf("{\"tokens\":[");
    for (int32_t i = 0; out.n && i < out.n[0]; i++) printf("%s%d", i ? "," : "", out.toks[i]);
    printf("],\"finish\":\"%s\",\"steps\":%lld,\"drafted\":%lld,\"accepted\":%lld,\"held\":%lld,"
           "\"prefix_hit_tokens\":%lld",
           out.fin ? kd_finish_name(out.fin[0]) : "length", (long long)st.steps, (long long)st.drafted,
           (long long)st.accepted, (long long)st.held, (long long)st.cached_tokens);
    if (batch > 1 && out.n) {
        printf(",\"batch\":[");
        for (long long b = 0; b < batch; b++) {
            printf("%s[", b ? "," : "");
            for (int32_t i = 0; i < out.n[b]; i++) printf("%s%d", i ? "," : "", out.toks[b * max_tokens + i]);
            printf("]");
        }
        printf("]");
    }
    printf("}\n");
    fflush(stdout);
    rc = 0;
done:
    free(ids), free(out.toks), free(out.n), free(out.fin), free(ref.toks), free(ref.n), free(ref.fin);
    kd_model_close(m);
    return rc;
}
