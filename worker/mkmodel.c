/* mkmodel.c: random KDA checkpoints (config.json + model.safetensors) from named presets.
 *
 * Every tensor is drawn from its own counter-based stream (splitmix64 keyed by the seed and
 * the tensor name), so a value depends only on (seed, name, index): tensors can be written in
 * any order, in chunks, without holding the model in memory. Scales follow the oracle's
 * recipe: matrices N(0, 1/sqrt(in)), conv weights N(0, 0.5), norm weights U(0.5, 1.5),
 * g_proj.1.bias N(0, 0.5), embeddings N(0, 1) (N(0, 1/sqrt(D)) when tied); A_log =
 * log U(1, 16) and dt_bias = the inverse softplus of a log-uniform dt in [1e-3, 0.1]
 * (flash-linear-attention's init), both fp32. All else is bf16 (round to nearest even). */
#include "mkmodel.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "safetensors.h"

#define KD_CFG(D, L, H, HV, K, V, W, CONV, I, VOCAB, LB_ON, LB, NEG, TIED)                     \
    {.hidden = D, .n_layers = L, .n_heads = H, .n_v_heads = HV, .head_k = K, .head_v = V,       \
     .conv_size = W, .use_short_conv = CONV, .intermediate = I, .vocab = VOCAB, .norm_eps = 1e-6, \
     .use_lower_bound = LB_ON, .lower_bound = LB, .allow_neg_eigval = NEG, .tie_embeddings = TIED}

const kd_preset kd_presets[] = {
    {"tiny", "D=128 L=3 H=2 K=V=32 vocab 384 conv 4 MLP 256; softplus gate, untied head "
             "(the oracle's tiny shape)",
     KD_CFG(128, 3, 2, 2, 32, 32, 4, 1, 256, 384, 0, 0.0, 0, 0)},
    {"tiny-gva", "tiny with grouped value heads HV=4 (H=2), expand_v 2 (V=64), lower-bound gate "
                 "-5, negative eigenvalues (beta x2), tied embeddings",
     KD_CFG(128, 3, 2, 4, 32, 64, 4, 1, 256, 384, 1, -5.0, 1, 1)},
    {"tiny-noconv", "tiny without the short conv (q = silu(q_proj h), no conv state)",
     KD_CFG(128, 3, 2, 2, 32, 32, 4, 0, 256, 384, 0, 0.0, 0, 0)},
    {"tiny-lb", "tiny with the lower-bound gate (lower_bound -5), nothing else changed",
     KD_CFG(128, 3, 2, 2, 32, 32, 4, 1, 256, 384, 1, -5.0, 0, 0)},
    {"tiny-odd", "odd sizes: D=96 L=2 H=2 HV=6 (groups of 3) K=32 V=48 (expand_v 1.5) conv 3 "
                 "MLP 200 vocab 300; softplus gate, negative eigenvalues, untied",
     KD_CFG(96, 2, 2, 6, 32, 48, 3, 1, 200, 300, 0, 0.0, 1, 0)},
    {"tiny-all", "every option at once: no conv, HV=4 (H=2) V=64, lower-bound gate -3, negative "
                 "eigenvalues, tied embeddings; D=128 L=2 vocab 384",
     KD_CFG(128, 2, 2, 4, 32, 64, 4, 0, 256, 384, 1, -3.0, 1, 1)},
    {"small", "D=512 L=2 H=4 K=V=128 vocab 1024 conv 4 MLP 512; softplus gate, untied "
              "(the oracle's small shape: the real head size)",
     KD_CFG(512, 2, 4, 4, 128, 128, 4, 1, 512, 1024, 0, 0.0, 0, 0)},
    {"demo", "D=256 L=4 H=2 K=V=128 vocab 512 conv 4 MLP 768; softplus gate, untied "
             "(the README's demo model, ~4M parameters)",
     KD_CFG(256, 4, 2, 2, 128, 128, 4, 1, 768, 512, 0, 0.0, 0, 0)},
    {"bench-1b", "about 1B parameters for benchmarks: D=2048 L=16 H=16 K=V=128 vocab 32000 "
                 "conv 4 MLP 5632; softplus gate, untied (~2 GB)",
     KD_CFG(2048, 16, 16, 16, 128, 128, 4, 1, 5632, 32000, 0, 0.0, 0, 0)},
    {"kimi-linear-48b-kda", "the KDA layers of Kimi-Linear-48B-A3B as a pure KDA model: "
                            "D=2304 L=20 H=32 K=V=128 vocab 163840 conv 4, dense MLP 9216 in "
                            "place of the MoE; softplus gate, untied (~2.8B params, ~5.6 GB)",
     KD_CFG(2304, 20, 32, 32, 128, 128, 4, 1, 9216, 163840, 0, 0.0, 0, 0)},
    {"kimi-linear-48b-state", "the recurrent state of kimi-linear-48b-kda (L=20 H=HV=32 K=V=128 "
                              "conv 4: 42.8 MiB per request) on a narrow model (D=64 MLP 128 vocab "
                              "1024), for handoff and state-traffic benchmarks on any machine",
     KD_CFG(64, 20, 32, 32, 128, 128, 4, 1, 128, 1024, 0, 0.0, 0, 0)},
    {NULL, NULL, {0}},
};

const kd_preset *kd_preset_find(const char *name) {
    for (const kd_preset *p = kd_presets; p->name; p++)
        if (!strcmp(p->name, name)) return p;
    return NULL;
}

void kd_presets_print(FILE *f) {
    for (const kd_preset *p = kd_presets; p->name; p++)
        fprintf(f, "  %-20s %s\n", p->name, p->about);
}

/* ---------------------------------------------------------------- random streams */

static uint64_t kd_mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Draw c of the stream `key`: splitmix64's c-th output. Uniform in (0, 1], 53 bits. */
static double kd_unif(uint64_t key, uint64_t c) {
    uint64_t z = kd_mix64(key + (c + 1) * 0x9e3779b97f4a7c15ull);
    return ((z >> 11) + 1) * 0x1.0p-53;
}

enum { KD_INIT_NORMAL, KD_INIT_UNIFORM, KD_INIT_A_LOG, KD_INIT_DT_BIAS };

typedef struct kd_mk_tensor {
    char name[96];
    int64_t shape[3];
    int ndim;
    kd_dtype dtype;
    int init;
    double a, b; /* normal: std (a); uniform: [a, b) */
    uint64_t key;
} kd_mk_tensor;

static void kd_put(const kd_mk_tensor *t, void *dst, int64_t j, double v) {
    if (t->dtype == KD_F32) {
        float f = (float)v;
        memcpy((char *)dst + 4 * j, &f, 4);
    } else {
        uint16_t h = kd_f32_to_bf16((float)v);
        memcpy((char *)dst + 2 * j, &h, 2);
    }
}

/* Element i of a normal tensor is one half of the Box-Muller pair i/2. */
static void kd_fill_range(const kd_mk_tensor *t, void *dst, int64_t first, int64_t n) {
    int64_t end = first + n;
    if (t->init == KD_INIT_NORMAL) {
        for (int64_t i = first; i < end;) {
            uint64_t p = (uint64_t)i >> 1;
            double r = t->a * sqrt(-2.0 * log(kd_unif(t->key, 2 * p)));
            double th = 2.0 * M_PI * kd_unif(t->key, 2 * p + 1);
            if (!(i & 1)) {
                kd_put(t, dst, i - first, r * cos(th));
                if (++i >= end) break;
            }
            kd_put(t, dst, i - first, r * sin(th));
            i++;
        }
        return;
    }
    for (int64_t i = first; i < end; i++) {
        double u = kd_unif(t->key, (uint64_t)i), v;
        if (t->init == KD_INIT_UNIFORM) v = t->a + (t->b - t->a) * (1.0 - u);
        else if (t->init == KD_INIT_A_LOG) v = log(1.0 + 15.0 * (1.0 - u));
        else { /* dt in [1e-3, 0.1] log-uniform, dt_bias = softplus^-1(dt) = dt + log(1 - e^-dt) */
            double dt = exp(log(1e-3) + (1.0 - u) * (log(0.1) - log(1e-3)));
            v = dt + log(-expm1(-dt));
        }
        kd_put(t, dst, i - first, v);
    }
}

typedef struct kd_fill_part {
    const kd_mk_tensor *t;
    void *dst;
    int64_t first, n;
} kd_fill_part;

static void *kd_fill_job(void *arg) {
    kd_fill_part *p = arg;
    kd_fill_range(p->t, p->dst, p->first, p->n);
    return NULL;
}

/* The writer's callback: large chunks are split over threads (values do not depend on it). */
static void kd_fill(void *ctx, void *dst, int64_t first, int64_t n) {
    const kd_mk_tensor *t = ctx;
    long nt = n < (1 << 16) ? 1 : sysconf(_SC_NPROCESSORS_ONLN);
    if (nt > 16) nt = 16;
    if (nt <= 1) {
        kd_fill_range(t, dst, first, n);
        return;
    }
    kd_fill_part part[16];
    pthread_t tid[16];
    int started[16] = {0};
    int64_t per = (n / nt + 1) & ~(int64_t)1;
    size_t esize = kd_dtype_size(t->dtype);
    for (long j = 0; j < nt; j++) {
        int64_t b = j * per < n ? j * per : n, e = b + per < n ? b + per : n;
        part[j] = (kd_fill_part){t, (char *)dst + (size_t)b * esize, first + b, e - b};
        started[j] = j > 0 && !pthread_create(&tid[j], NULL, kd_fill_job, &part[j]);
    }
    for (long j = 0; j < nt; j++)
        if (!started[j]) kd_fill_job(&part[j]);
    for (long j = 1; j < nt; j++)
        if (started[j]) pthread_join(tid[j], NULL);
}

static uint64_t kd_name_key(uint64_t seed, const char *name) {
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (const unsigned char *s = (const unsigned char *)name; *s; s++)
        h = (h ^ *s) * 0x100000001b3ull;
    return kd_mix64(kd_mix64(seed + 0x9e3779b97f4a7c15ull) ^ h);
}

/* ---------------------------------------------------------------- files */

static int kd_mkdir_p(const char *dir, kd_err *err) {
    size_t n = strlen(dir);
    if (!n) return kd_fail(err, "empty output directory");
    char *p = malloc(n + 1);
    if (!p) return kd_fail(err, "out of memory");
    memcpy(p, dir, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (p[i] != '/' && p[i] != '\0') continue;
        char c = p[i];
        p[i] = '\0';
        if (mkdir(p, 0777) && errno != EEXIST) {
            kd_fail(err, "cannot create %s: %s", p, strerror(errno));
            free(p);
            return -1;
        }
        p[i] = c;
    }
    free(p);
    struct stat st;
    if (stat(dir, &st) || !S_ISDIR(st.st_mode))
        return kd_fail(err, "%s is not a directory", dir);
    return 0;
}

/* Fewest significant digits that print v so that it reads back exactly. */
static int kd_real_digits(double v) {
    char buf[40];
    for (int p = 1; p < 17; p++) {
        snprintf(buf, sizeof buf, "%.*g", p, v);
        if (strtod(buf, NULL) == v) return p;
    }
    return 17;
}

static int kd_write_config(const kd_config *c, const char *dir, kd_err *err) {
    double expand_v = (double)c->head_v / c->head_k;
    int digits = kd_real_digits(expand_v), d2 = kd_real_digits(c->norm_eps);
    if (d2 > digits) digits = d2;
    if (c->use_lower_bound && (d2 = kd_real_digits(c->lower_bound)) > digits) digits = d2;
    json_t *o = json_object(), *arch = json_array();
    json_array_append_new(arch, json_string("KDAForCausalLM"));
    json_object_set_new(o, "allow_neg_eigval", json_boolean(c->allow_neg_eigval));
    json_object_set_new(o, "architectures", arch);
    json_object_set_new(o, "attn", json_null());
    json_object_set_new(o, "attn_mode", json_string("chunk"));
    json_object_set_new(o, "bos_token_id", json_integer(1));
    json_object_set_new(o, "conv_size", json_integer(c->conv_size));
    json_object_set_new(o, "dtype", json_string("bfloat16"));
    json_object_set_new(o, "eos_token_id", json_integer(2));
    json_object_set_new(o, "expand_v", json_real(expand_v));
    json_object_set_new(o, "fuse_cross_entropy", json_false());
    json_object_set_new(o, "fuse_norm", json_true());
    json_object_set_new(o, "fuse_swiglu", json_true());
    json_object_set_new(o, "head_dim", json_integer(c->head_k));
    json_object_set_new(o, "hidden_act", json_string("swish"));
    json_object_set_new(o, "hidden_ratio", json_integer(4));
    json_object_set_new(o, "hidden_size", json_integer(c->hidden));
    json_object_set_new(o, "initializer_range", json_real(0.02));
    json_object_set_new(o, "intermediate_size", json_integer(c->intermediate));
    json_object_set_new(o, "lower_bound",
                        c->use_lower_bound ? json_real(c->lower_bound) : json_null());
    json_object_set_new(o, "max_position_embeddings", json_integer(2048));
    json_object_set_new(o, "model_type", json_string("kda"));
    json_object_set_new(o, "norm_eps", json_real(c->norm_eps));
    json_object_set_new(o, "num_heads", json_integer(c->n_heads));
    json_object_set_new(o, "num_hidden_layers", json_integer(c->n_layers));
    json_object_set_new(o, "num_v_heads",
                        c->n_v_heads == c->n_heads ? json_null() : json_integer(c->n_v_heads));
    json_object_set_new(o, "pad_token_id", json_null());
    json_object_set_new(o, "tie_word_embeddings", json_boolean(c->tie_embeddings));
    json_object_set_new(o, "use_cache", json_true());
    json_object_set_new(o, "use_short_conv", json_boolean(c->use_short_conv));
    json_object_set_new(o, "vocab_size", json_integer(c->vocab));
    char *text = json_dumps(o, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(digits));
    json_decref(o);
    if (!text) return kd_fail(err, "cannot format config.json");
    size_t n = strlen(dir);
    char *path = malloc(n + 32), *tmp = malloc(n + 32);
    int rc = -1;
    if (path && tmp) {
        snprintf(path, n + 32, "%s/config.json", dir);
        snprintf(tmp, n + 32, "%s/config.json.tmp", dir);
        FILE *f = fopen(tmp, "w");
        if (!f) kd_fail(err, "cannot write %s: %s", tmp, strerror(errno));
        else {
            int bad = fprintf(f, "%s\n", text) < 0;
            bad |= fclose(f) != 0;
            if (bad) kd_fail(err, "cannot write %s", tmp);
            else if (rename(tmp, path))
                kd_fail(err, "cannot rename %s: %s", tmp, strerror(errno));
            else rc = 0;
            if (rc) remove(tmp);
        }
    } else kd_fail(err, "out of memory");
    free(text);
    free(path);
    free(tmp);
    return rc;
}

/* ---------------------------------------------------------------- the checkpoint */

typedef struct kd_mk_list {
    kd_mk_tensor *t;
    size_t n, cap;
    uint64_t seed;
} kd_mk_list;

static kd_mk_tensor *kd_mk_add(kd_mk_list *l, int init, double a, double b, int64_t d0, int64_t d1,
                               int64_t d2, const char *fmt, int layer) {
    kd_mk_tensor *t = &l->t[l->n++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, fmt, layer);
    t->shape[0] = d0, t->shape[1] = d1, t->shape[2] = d2;
    t->ndim = d2 ? 3 : d1 ? 2 : 1;
    t->dtype = (init == KD_INIT_A_LOG || init == KD_INIT_DT_BIAS) ? KD_F32 : KD_BF16;
    t->init = init, t->a = a, t->b = b;
    t->key = kd_name_key(l->seed, t->name);
    return t;
}

/* A linear layer [out, in] with N(0, 1/sqrt(in)) entries. */
static void kd_mk_linear(kd_mk_list *l, int64_t out, int64_t in, const char *fmt, int layer) {
    kd_mk_add(l, KD_INIT_NORMAL, 1.0 / sqrt((double)in), 0, out, in, 0, fmt, layer);
}

static void kd_mk_norm(kd_mk_list *l, int64_t n, const char *fmt, int layer) {
    kd_mk_add(l, KD_INIT_UNIFORM, 0.5, 1.5, n, 0, 0, fmt, layer);
}

/* A depthwise conv [C, 1, W] with N(0, 0.5) entries. */
static void kd_mk_conv(kd_mk_list *l, int64_t ch, int64_t w, const char *fmt, int layer) {
    kd_mk_add(l, KD_INIT_NORMAL, 0.5, 0, ch, 1, w, fmt, layer);
}

int kd_mkmodel(const kd_config *c, uint64_t seed, const char *out_dir, kd_err *err) {
    if (kd_config_check(c, err)) return -1;
    if (kd_mkdir_p(out_dir, err)) return -1;
    int64_t D = c->hidden, QK = kd_config_qk_dim(c), VD = kd_config_v_dim(c), HV = c->n_v_heads;
    int64_t V = c->head_v, K = c->head_k, W = c->conv_size, I = c->intermediate;
    kd_mk_list l = {.cap = 3 + 24 * (size_t)c->n_layers, .seed = seed};
    l.t = calloc(l.cap, sizeof *l.t);
    if (!l.t) return kd_fail(err, "out of memory");

    /* Tied: N(0, 1/sqrt(D)), else the head is dominated by the input token's own embedding
     * (x . x ~ D) and a random model only ever repeats its last token. */
    double emb_std = c->tie_embeddings ? 1.0 / sqrt((double)D) : 1.0;
    kd_mk_add(&l, KD_INIT_NORMAL, emb_std, 0, c->vocab, D, 0, "model.embeddings.weight", 0);
    for (int i = 0; i < c->n_layers; i++) {
        kd_mk_norm(&l, D, "model.layers.%d.attn_norm.weight", i);
        kd_mk_linear(&l, QK, D, "model.layers.%d.attn.q_proj.weight", i);
        kd_mk_linear(&l, QK, D, "model.layers.%d.attn.k_proj.weight", i);
        kd_mk_linear(&l, VD, D, "model.layers.%d.attn.v_proj.weight", i);
        if (c->use_short_conv) {
            kd_mk_conv(&l, QK, W, "model.layers.%d.attn.q_conv1d.weight", i);
            kd_mk_conv(&l, QK, W, "model.layers.%d.attn.k_conv1d.weight", i);
            kd_mk_conv(&l, VD, W, "model.layers.%d.attn.v_conv1d.weight", i);
        }
        kd_mk_linear(&l, V, D, "model.layers.%d.attn.f_proj.0.weight", i);
        kd_mk_linear(&l, HV * K, V, "model.layers.%d.attn.f_proj.1.weight", i);
        kd_mk_linear(&l, HV, D, "model.layers.%d.attn.b_proj.weight", i);
        kd_mk_add(&l, KD_INIT_A_LOG, 0, 0, HV, 0, 0, "model.layers.%d.attn.A_log", i);
        kd_mk_add(&l, KD_INIT_DT_BIAS, 0, 0, HV * K, 0, 0, "model.layers.%d.attn.dt_bias", i);
        kd_mk_linear(&l, V, D, "model.layers.%d.attn.g_proj.0.weight", i);
        kd_mk_linear(&l, VD, V, "model.layers.%d.attn.g_proj.1.weight", i);
        kd_mk_add(&l, KD_INIT_NORMAL, 0.5, 0, VD, 0, 0, "model.layers.%d.attn.g_proj.1.bias", i);
        kd_mk_norm(&l, V, "model.layers.%d.attn.o_norm.weight", i);
        kd_mk_linear(&l, D, VD, "model.layers.%d.attn.o_proj.weight", i);
        kd_mk_norm(&l, D, "model.layers.%d.mlp_norm.weight", i);
        kd_mk_linear(&l, I, D, "model.layers.%d.mlp.gate_proj.weight", i);
        kd_mk_linear(&l, I, D, "model.layers.%d.mlp.up_proj.weight", i);
        kd_mk_linear(&l, D, I, "model.layers.%d.mlp.down_proj.weight", i);
    }
    kd_mk_norm(&l, D, "model.norm.weight", 0);
    if (!c->tie_embeddings) kd_mk_linear(&l, c->vocab, D, "lm_head.weight", 0);

    int rc = -1;
    char *path = NULL;
    kd_st_writer *w = kd_st_writer_new();
    if (!w) {
        kd_fail(err, "out of memory");
        goto done;
    }
    for (size_t j = 0; j < l.n; j++)
        if (kd_st_writer_add_fill(w, l.t[j].name, l.t[j].dtype, l.t[j].ndim, l.t[j].shape, kd_fill,
                                  &l.t[j], err))
            goto done;
    char seed_text[24];
    snprintf(seed_text, sizeof seed_text, "%" PRIu64, seed);
    if (kd_st_writer_meta(w, "format", "pt", err) ||
        kd_st_writer_meta(w, "kdecode_seed", seed_text, err))
        goto done;
    size_t n = strlen(out_dir) + 32;
    if (!(path = malloc(n))) {
        kd_fail(err, "out of memory");
        goto done;
    }
    snprintf(path, n, "%s/model.safetensors", out_dir);
    if (kd_st_writer_write(w, path, err) || kd_write_config(c, out_dir, err)) goto done;
    rc = 0;
done:
    kd_st_writer_free(w);
    free(path);
    free(l.t);
    return rc;
}

/* ---------------------------------------------------------------- `kdecode mkmodel` */

static void kd_mkmodel_usage(FILE *f) {
    fprintf(f, "usage: kdecode mkmodel --preset NAME --seed S --out DIR\n"
               "       kdecode mkmodel --list\n"
               "Writes a random KDA checkpoint (config.json, model.safetensors). Presets:\n");
    kd_presets_print(f);
}

static int kd_parse_u64(const char *s, uint64_t *out) {
    if (*s < '0' || *s > '9') return -1;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end) return -1;
    *out = v;
    return 0;
}

int kd_mkmodel_main(int argc, char **argv) {
    const char *preset = NULL, *out = NULL, *seed_s = NULL;
    int list = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], **dst = NULL;
        if (!strcmp(a, "--list")) list = 1;
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            kd_mkmodel_usage(stdout);
            return 0;
        } else if (!strcmp(a, "--preset")) dst = &preset;
        else if (!strcmp(a, "--seed")) dst = &seed_s;
        else if (!strcmp(a, "--out")) dst = &out;
        else {
            fprintf(stderr, "kdecode mkmodel: unknown argument '%s'\n", a);
            kd_mkmodel_usage(stderr);
            return 2;
        }
        if (dst) {
            if (i + 1 >= argc) {
                fprintf(stderr, "kdecode mkmodel: %s needs a value\n", a);
                return 2;
            }
            *dst = argv[++i];
        }
    }
    if (list) {
        kd_presets_print(stdout);
        return 0;
    }
    uint64_t seed = 0;
    if (!preset || !out || !seed_s) {
        fprintf(stderr, "kdecode mkmodel: --preset, --seed and --out are required\n");
        kd_mkmodel_usage(stderr);
        return 2;
    }
    if (kd_parse_u64(seed_s, &seed)) {
        fprintf(stderr, "kdecode mkmodel: --seed '%s' is not an unsigned 64-bit integer\n", seed_s);
        return 2;
    }
    const kd_preset *p = kd_preset_find(preset);
    if (!p) {
        fprintf(stderr, "kdecode mkmodel: unknown preset '%s'; presets:\n", preset);
        kd_presets_print(stderr);
        return 2;
    }
    kd_err err = {{0}};
    if (kd_mkmodel(&p->config, seed, out, &err)) {
        fprintf(stderr, "kdecode mkmodel: %s\n", err.msg);
        return 1;
    }
    json_t *js = json_string(out);
    char *out_json = js ? json_dumps(js, JSON_ENCODE_ANY) : NULL;
    printf("{\"preset\":\"%s\",\"seed\":%" PRIu64 ",\"out\":%s}\n", p->name, seed,
           out_json ? out_json : "null");
    free(out_json);
    json_decref(js);
    return 0;
}
