/* run.c: `kdecode run`: load a checkpoint, prefill the prompt in chunks, then decode one
 * token at a time on the CPU backend, printing {"tokens":[...],"finish":...}. */
#include "worker/run.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kd/backend.h"
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
            "usage: kdecode run --model DIR --prompt-ids 1,2,3 --max-tokens N\n"
            "         [--temperature T] [--top-k K] [--top-p P] [--seed S]\n"
            "         [--dump-logits FILE] [--prefill-chunk N] [--ignore-eos] [--f64]\n"
            "Generates on the CPU backend and prints {\"tokens\":[...],\"finish\":...}.\n"
            "  --dump-logits FILE  safetensors with `logits` F32 [prompt_len, vocab]\n"
            "  --prefill-chunk N   prompt tokens per forward pass (default 512)\n"
            "  --ignore-eos        do not stop at the model's eos_token_id\n"
            "  --f64               compute in double precision (reference runs)\n");
}

int kd_run_main(int argc, char **argv) {
    enum { O_MODEL = 1, O_PROMPT, O_MAX, O_TEMP, O_TOPK, O_TOPP, O_SEED, O_DUMP, O_CHUNK,
           O_IGNORE_EOS, O_F64, O_HELP };
    static const struct option opts[] = {
        {"model", required_argument, 0, O_MODEL},       {"prompt-ids", required_argument, 0, O_PROMPT},
        {"max-tokens", required_argument, 0, O_MAX},    {"temperature", required_argument, 0, O_TEMP},
        {"top-k", required_argument, 0, O_TOPK},        {"top-p", required_argument, 0, O_TOPP},
        {"seed", required_argument, 0, O_SEED},         {"dump-logits", required_argument, 0, O_DUMP},
        {"prefill-chunk", required_argument, 0, O_CHUNK}, {"ignore-eos", no_argument, 0, O_IGNORE_EOS},
        {"f64", no_argument, 0, O_F64},                 {"help", no_argument, 0, O_HELP},
        {0, 0, 0, 0}};
    const char *model_dir = NULL, *prompt = NULL, *dump = NULL;
    long long max_tokens = -1, chunk = 512;
    kd_sampling samp = {.temperature = 0, .top_k = 0, .top_p = 1, .seed = 0};
    int ignore_eos = 0, use_f64 = 0, o, li = 0;
    optind = 1;
    opterr = 0;
    while ((o = getopt_long(argc, argv, "", opts, &li)) != -1) {
        long long v;
        unsigned long long u;
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

    int rc = 1;
    kd_err err = {{0}};
    kd_backend *be = NULL;
    int32_t *ids = NULL, *out = NULL, *order = NULL;
    float *logits = NULL, *all_logits = NULL;
    double *probs = NULL;
    kd_model *m = kd_model_open(model_dir, &err);
    if (!m) {
        fprintf(stderr, "kdecode run: %s\n", err.msg);
        return 1;
    }
    const kd_config *c = &m->config;
    const char *why = NULL;
    long n_prompt = kd_parse_id_list(prompt, c->vocab, &ids, &why);
    if (n_prompt < 0) {
        fprintf(stderr, "kdecode run: --prompt-ids '%s': %s (vocab %d)\n", prompt, why, c->vocab);
        rc = 2;
        goto done;
    }
    if (n_prompt == 0) {
        fprintf(stderr, "kdecode run: --prompt-ids is empty\n");
        rc = 2;
        goto done;
    }
    if (chunk > n_prompt) chunk = n_prompt;
    be = kd_cpu_backend_create(use_f64, &err);
    if (!be || kd_backend_load(be, c, &m->tensors, &err) ||
        kd_backend_reserve(be, 1, 1, chunk, &err) || kd_backend_reset_slot(be, 0, &err)) {
        fprintf(stderr, "kdecode run: %s\n", err.msg);
        goto done;
    }
    const int32_t V = c->vocab;
    logits = malloc((size_t)chunk * V * sizeof *logits);
    out = malloc(((size_t)max_tokens + 1) * sizeof *out);
    probs = malloc((size_t)V * sizeof *probs);
    order = malloc((size_t)V * sizeof *order);
    if (dump) all_logits = malloc((size_t)n_prompt * V * sizeof *all_logits);
    if (!logits || !out || !probs || !order || (dump && !all_logits)) {
        fprintf(stderr, "kdecode run: out of memory\n");
        goto done;
    }
    /* Prefill chunk by chunk; logits of every position only when dumping. */
    for (long t0 = 0; t0 < n_prompt; t0 += chunk) {
        int32_t n = (int32_t)(n_prompt - t0 < chunk ? n_prompt - t0 : chunk);
        int last = t0 + n == n_prompt;
        kd_batch_row row = {.slot = 0, .n_tokens = n,
                            .logits = dump ? KD_LOGITS_ALL : (last ? KD_LOGITS_LAST : KD_LOGITS_NONE)};
        kd_batch b = {.n_rows = 1, .rows = &row, .tokens = ids + t0};
        if (kd_backend_forward(be, &b, logits, &err)) {
            fprintf(stderr, "kdecode run: %s\n", err.msg);
            goto done;
        }
        if (dump) memcpy(all_logits + (size_t)t0 * V, logits, (size_t)n * V * sizeof *logits);
        if (last && dump) memmove(logits, logits + (size_t)(n - 1) * V, (size_t)V * sizeof *logits);
    }
    kd_rng rng;
    kd_rng_seed(&rng, samp.seed);
    const char *finish = "length";
    long n_out = 0;
    while (n_out < max_tokens) {
        int32_t tok = kd_sample(logits, V, &samp, &rng, probs, order);
        out[n_out++] = tok;
        if (!ignore_eos && tok == m->eos_token_id) {
            finish = "stop";
            break;
        }
        if (n_out == max_tokens) break;
        kd_batch_row row = {.slot = 0, .n_tokens = 1, .logits = KD_LOGITS_LAST};
        kd_batch b = {.n_rows = 1, .rows = &row, .tokens = &tok};
        if (kd_backend_forward(be, &b, logits, &err)) {
            fprintf(stderr, "kdecode run: %s\n", err.msg);
            goto done;
        }
    }
    if (dump) {
        kd_st_writer *w = kd_st_writer_new();
        int64_t shape[2] = {n_prompt, V};
        if (!w || kd_st_writer_add(w, "logits", KD_F32, 2, shape, all_logits, &err) ||
            kd_st_writer_write(w, dump, &err)) {
            fprintf(stderr, "kdecode run: --dump-logits: %s\n", w ? err.msg : "out of memory");
            kd_st_writer_free(w);
            goto done;
        }
        kd_st_writer_free(w);
    }
    printf("{\"tokens\":[");
    for (long i = 0; i < n_out; i++) printf("%s%d", i ? "," : "", out[i]);
    printf("],\"finish\":\"%s\"}\n", finish);
    fflush(stdout);
    rc = 0;
done:
    free(ids), free(out), free(order), free(logits), free(all_logits), free(probs);
    kd_backend_free(be);
    kd_model_close(m);
    return rc;
}
