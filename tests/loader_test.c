/* loader_test.c: the safetensors reader/writer and the KDA checkpoint loader: oracle
 * checkpoints, round trips, sharded checkpoints, and many malformed inputs (each must give
 * an error naming the problem, never a crash). */
#define _GNU_SOURCE
#include <check.h>
#include <dirent.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tests/testutil.h"
#include "worker/model.h"
#include "worker/safetensors.h"

#define EXPECT_MSG(msg, needle)                                                              \
    ck_assert_msg(strstr((msg), (needle)) != NULL, "error \"%s\" does not mention \"%s\"", \
                  (msg), (needle))

/* ---- small helpers ---- */

static char *path_join(const char *dir, const char *name) {
    char *p = NULL;
    ck_assert_int_ge(asprintf(&p, "%s/%s", dir, name), 0);
    return p;
}

static void write_bytes(const char *path, const void *buf, size_t len) {
    FILE *f = fopen(path, "wb");
    ck_assert_msg(f != NULL, "cannot create %s", path);
    ck_assert_uint_eq(fwrite(buf, 1, len, f), len);
    ck_assert_int_eq(fclose(f), 0);
}

static unsigned char *read_bytes(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *buf = malloc((size_t)n + 1);
    ck_assert_ptr_nonnull(buf);
    ck_assert_uint_eq(fread(buf, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return buf;
}

static void write_text(const char *path, const char *text) { write_bytes(path, text, strlen(text)); }

/* A safetensors file from raw header text and data_len bytes of data. */
static void write_raw_st(const char *path, const char *header, size_t data_len) {
    size_t n = strlen(header);
    unsigned char *buf = malloc(8 + n + data_len + 1);
    ck_assert_ptr_nonnull(buf);
    uint64_t h = n;
    memcpy(buf, &h, 8);
    memcpy(buf + 8, header, n);
    memset(buf + 8 + n, 0x3c, data_len);
    write_bytes(path, buf, 8 + n + data_len);
    free(buf);
}

/* Opening must fail with a message that starts with the path and mentions needle. */
static void expect_st_fail(const char *path, const char *needle) {
    kd_err err = {{0}};
    kd_st_file *f = kd_st_open(path, &err);
    if (f) kd_st_close(f);
    ck_assert_msg(f == NULL, "%s: opened, expected an error mentioning \"%s\"", path, needle);
    ck_assert_msg(strncmp(err.msg, path, strlen(path)) == 0, "error \"%s\" does not start with the path", err.msg);
    EXPECT_MSG(err.msg, needle);
}

static void expect_raw_fail(const char *dir, const char *header, size_t data_len, const char *needle) {
    char *p = path_join(dir, "bad.safetensors");
    write_raw_st(p, header, data_len);
    expect_st_fail(p, needle);
    free(p);
}

static void fill_random(void *dst, kd_dtype dt, int64_t n, uint64_t seed) {
    kd_test_rng r;
    kd_test_rng_init(&r, seed);
    unsigned char *p = dst;
    for (int64_t i = 0; i < n; i++) {
        float x = (float)(kd_test_rng_normal(&r) * 0.5);
        switch (dt) {
        case KD_F32: memcpy(p + 4 * i, &x, 4); break;
        case KD_F64: { double d = kd_test_rng_normal(&r); memcpy(p + 8 * i, &d, 8); break; }
        case KD_BF16: { uint16_t h = kd_f32_to_bf16(x); memcpy(p + 2 * i, &h, 2); break; }
        case KD_F16: { uint16_t h = kd_f32_to_f16(x); memcpy(p + 2 * i, &h, 2); break; }
        case KD_I64: { int64_t v = (int64_t)kd_test_rng_u64(&r); memcpy(p + 8 * i, &v, 8); break; }
        case KD_I32: { int32_t v = (int32_t)kd_test_rng_u64(&r); memcpy(p + 4 * i, &v, 4); break; }
        default: ck_abort_msg("bad dtype");
        }
    }
}

static int64_t numel(int ndim, const int64_t *shape) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    return n;
}

/* Files in dir other than . and .. */
static int count_files(const char *dir) {
    DIR *d = opendir(dir);
    ck_assert_ptr_nonnull(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n;
}

/* ---- a KDA checkpoint generator, independent of model.c ---- */

typedef struct tspec {
    char name[128];
    int ndim;
    int64_t shape[KD_MAX_DIMS];
    int layer;  /* -1: model level */
    size_t off; /* offsetof in kd_layer_tensors or kd_model_tensors */
} tspec;

static void add_spec(tspec *s, size_t *n, int layer, size_t off, const char *name, int ndim, int64_t a,
                     int64_t b, int64_t c) {
    tspec *t = &s[(*n)++];
    memset(t, 0, sizeof *t);
    if (layer >= 0) snprintf(t->name, sizeof t->name, "model.layers.%d.%s", layer, name);
    else snprintf(t->name, sizeof t->name, "%s", name);
    t->ndim = ndim, t->layer = layer, t->off = off;
    t->shape[0] = a, t->shape[1] = b, t->shape[2] = c;
}

/* Every tensor KDA.md §1 names for c (lm_head only when asked). */
static size_t list_tensors(const kd_config *c, int with_lm_head, tspec *s) {
    int64_t D = c->hidden, QK = (int64_t)c->n_heads * c->head_k, VD = (int64_t)c->n_v_heads * c->head_v,
            HV = c->n_v_heads, K = c->head_k, V = c->head_v, I = c->intermediate, W = c->conv_size;
    size_t n = 0;
#define M(f) offsetof(kd_model_tensors, f)
#define L(f) offsetof(kd_layer_tensors, f)
    add_spec(s, &n, -1, M(embed), "model.embeddings.weight", 2, c->vocab, D, 0);
    for (int i = 0; i < c->n_layers; i++) {
        add_spec(s, &n, i, L(attn_norm), "attn_norm.weight", 1, D, 0, 0);
        add_spec(s, &n, i, L(q_proj), "attn.q_proj.weight", 2, QK, D, 0);
        add_spec(s, &n, i, L(k_proj), "attn.k_proj.weight", 2, QK, D, 0);
        add_spec(s, &n, i, L(v_proj), "attn.v_proj.weight", 2, VD, D, 0);
        if (c->use_short_conv) {
            add_spec(s, &n, i, L(q_conv), "attn.q_conv1d.weight", 3, QK, 1, W);
            add_spec(s, &n, i, L(k_conv), "attn.k_conv1d.weight", 3, QK, 1, W);
            add_spec(s, &n, i, L(v_conv), "attn.v_conv1d.weight", 3, VD, 1, W);
        }
        add_spec(s, &n, i, L(f_proj0), "attn.f_proj.0.weight", 2, V, D, 0);
        add_spec(s, &n, i, L(f_proj1), "attn.f_proj.1.weight", 2, HV * K, V, 0);
        add_spec(s, &n, i, L(b_proj), "attn.b_proj.weight", 2, HV, D, 0);
        add_spec(s, &n, i, L(A_log), "attn.A_log", 1, HV, 0, 0);
        add_spec(s, &n, i, L(dt_bias), "attn.dt_bias", 1, HV * K, 0, 0);
        add_spec(s, &n, i, L(g_proj0), "attn.g_proj.0.weight", 2, V, D, 0);
        add_spec(s, &n, i, L(g_proj1), "attn.g_proj.1.weight", 2, VD, V, 0);
        add_spec(s, &n, i, L(g_proj1_bias), "attn.g_proj.1.bias", 1, VD, 0, 0);
        add_spec(s, &n, i, L(o_norm), "attn.o_norm.weight", 1, V, 0, 0);
        add_spec(s, &n, i, L(o_proj), "attn.o_proj.weight", 2, D, VD, 0);
        add_spec(s, &n, i, L(mlp_norm), "mlp_norm.weight", 1, D, 0, 0);
        add_spec(s, &n, i, L(gate_proj), "mlp.gate_proj.weight", 2, I, D, 0);
        add_spec(s, &n, i, L(up_proj), "mlp.up_proj.weight", 2, I, D, 0);
        add_spec(s, &n, i, L(down_proj), "mlp.down_proj.weight", 2, D, I, 0);
    }
    add_spec(s, &n, -1, M(final_norm), "model.norm.weight", 1, D, 0, 0);
    if (with_lm_head) add_spec(s, &n, -1, M(lm_head), "lm_head.weight", 2, c->vocab, D, 0);
#undef M
#undef L
    return n;
}

static kd_tensor *tensor_of(kd_model *m, const tspec *s) {
    char *base = s->layer < 0 ? (char *)&m->tensors : (char *)&m->tensors.layers[s->layer];
    return (kd_tensor *)(base + s->off);
}

typedef struct gen_opts {
    uint64_t seed;
    int mixed;                    /* random dtype per tensor (BF16, F16, F32, F64) */
    int lm_head;                  /* write lm_head even when tied */
    int no_lm_head;               /* never write lm_head */
    const char *drop;             /* leave this tensor out */
    const char *extra;            /* add this unexpected tensor */
    const char *reshape;          /* first dim + 1 */
    const char *bad_dtype;        /* written as I32 */
    int n_shards;                 /* 0: model.safetensors; else index + shards */
    const char *index_skip;       /* left out of the weight_map */
    const char *index_extra;      /* raw JSON members appended to the weight_map */
    const char *config_override;  /* "key=json;key=;..." (empty json removes the key) */
    int conv_tensors;             /* write conv tensors even without short conv */
    const char *dup;              /* also written into the next shard */
} gen_opts;

static kd_dtype pick_dtype(const gen_opts *o, const tspec *s, size_t i) {
    if (o->bad_dtype && strcmp(s->name, o->bad_dtype) == 0) return KD_I32;
    if (o->mixed) {
        static const kd_dtype d[] = {KD_BF16, KD_F16, KD_F32, KD_F64};
        return d[(o->seed + i * 7) % 4];
    }
    if (strstr(s->name, "A_log") || strstr(s->name, "dt_bias")) return KD_F32;
    return KD_BF16;
}

static uint64_t tensor_seed(const gen_opts *o, size_t i) { return o->seed * 1000003u + i; }

/* config.json text for c, with "key=value;" overrides applied (value "" removes). */
static char *config_text(const kd_config *c, const char *override) {
    char kv[40][2][128];
    int n = 0;
#define KV(k, ...) (snprintf(kv[n][0], 128, "%s", k), snprintf(kv[n][1], 128, __VA_ARGS__), n++)
    KV("model_type", "\"kda\"");
    KV("architectures", "[\"KDAForCausalLM\"]");
    KV("hidden_size", "%d", c->hidden);
    KV("num_hidden_layers", "%d", c->n_layers);
    KV("num_heads", "%d", c->n_heads);
    KV("num_v_heads", "%d", c->n_v_heads);
    KV("head_dim", "%d", c->head_k);
    KV("expand_v", "%.17g", (double)c->head_v / c->head_k);
    KV("conv_size", "%d", c->conv_size);
    KV("use_short_conv", "%s", c->use_short_conv ? "true" : "false");
    KV("intermediate_size", "%d", c->intermediate);
    KV("hidden_ratio", "4");
    KV("vocab_size", "%d", c->vocab);
    KV("norm_eps", "%.17g", c->norm_eps);
    if (c->use_lower_bound) KV("lower_bound", "%.17g", c->lower_bound);
    else KV("lower_bound", "null");
    KV("allow_neg_eigval", "%s", c->allow_neg_eigval ? "true" : "false");
    KV("tie_word_embeddings", "%s", c->tie_embeddings ? "true" : "false");
    KV("attn", "null");
    KV("hidden_act", "\"swish\"");
    KV("use_l2warp", "false");
    KV("safe_gate", "false");
    KV("attnres_block_size", "null");
    KV("fuse_norm", "true");
    KV("bos_token_id", "1");
    KV("eos_token_id", "2");
    KV("pad_token_id", "null");
    if (override) {
        char *copy = strdup(override), *save = NULL;
        for (char *tok = strtok_r(copy, ";", &save); tok; tok = strtok_r(NULL, ";", &save)) {
            char *eq = strchr(tok, '=');
            ck_assert_ptr_nonnull(eq);
            *eq = 0;
            int j = 0;
            while (j < n && strcmp(kv[j][0], tok) != 0) j++;
            if (j == n) snprintf(kv[n++][0], 128, "%s", tok);
            snprintf(kv[j][1], 128, "%s", eq + 1);
        }
        free(copy);
    }
#undef KV
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    fprintf(f, "{\n");
    int first = 1;
    for (int j = 0; j < n; j++) {
        if (!kv[j][1][0]) continue;
        fprintf(f, "%s  \"%s\": %s", first ? "" : ",\n", kv[j][0], kv[j][1]);
        first = 0;
    }
    fprintf(f, "\n}\n");
    fclose(f);
    return text;
}

/* Writes config.json and the tensors of c into dir (created). */
static void gen_model(const char *dir, const kd_config *c, const gen_opts *o) {
    mkdir(dir, 0755);
    char *cfg = config_text(c, o->config_override), *p = path_join(dir, "config.json");
    write_text(p, cfg);
    free(cfg);
    free(p);

    kd_config cc = *c;
    if (o->conv_tensors) cc.use_short_conv = 1;
    int with_head = !o->no_lm_head && (!c->tie_embeddings || o->lm_head);
    tspec *s = calloc((size_t)c->n_layers * 24 + 8, sizeof *s);
    size_t n = list_tensors(&cc, with_head, s);
    if (o->extra) add_spec(s, &n, -1, 0, o->extra, 1, 4, 0, 0);

    int nw = o->n_shards ? o->n_shards : 1;
    kd_st_writer *w[8];
    kd_err err;
    for (int k = 0; k < nw; k++) w[k] = kd_st_writer_new();
    char *index = NULL;
    size_t ilen = 0;
    FILE *fi = open_memstream(&index, &ilen);
    fprintf(fi, "{\"metadata\": {\"total_size\": 0}, \"weight_map\": {");
    int first = 1;
    for (size_t i = 0; i < n; i++) {
        if (o->drop && strcmp(s[i].name, o->drop) == 0) continue;
        kd_dtype dt = pick_dtype(o, &s[i], i);
        int64_t shape[KD_MAX_DIMS];
        memcpy(shape, s[i].shape, sizeof shape);
        if (o->reshape && strcmp(s[i].name, o->reshape) == 0) shape[0]++;
        int64_t ne = numel(s[i].ndim, shape);
        void *buf = malloc((size_t)ne * kd_dtype_size(dt) + 1);
        fill_random(buf, dt, ne, tensor_seed(o, i));
        int k = (int)(i % (size_t)nw);
        ck_assert_msg(kd_st_writer_add(w[k], s[i].name, dt, s[i].ndim, shape, buf, &err) == 0, "%s", err.msg);
        if (o->dup && strcmp(s[i].name, o->dup) == 0)
            ck_assert(kd_st_writer_add(w[(k + 1) % nw], s[i].name, dt, s[i].ndim, shape, buf, &err) == 0);
        free(buf);
        if (o->index_skip && strcmp(s[i].name, o->index_skip) == 0) continue;
        fprintf(fi, "%s\n  \"%s\": \"model-%05d-of-%05d.safetensors\"", first ? "" : ",", s[i].name, k + 1, nw);
        first = 0;
    }
    if (o->index_extra) fprintf(fi, "%s\n  %s", first ? "" : ",", o->index_extra);
    fprintf(fi, "\n}}\n");
    fclose(fi);
    for (int k = 0; k < nw; k++) {
        char name[64];
        if (o->n_shards) snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", k + 1, nw);
        else snprintf(name, sizeof name, "model.safetensors");
        p = path_join(dir, name);
        ck_assert_msg(kd_st_writer_write(w[k], p, &err) == 0, "%s", err.msg);
        free(p);
        kd_st_writer_free(w[k]);
    }
    if (o->n_shards) {
        p = path_join(dir, "model.safetensors.index.json");
        write_text(p, index);
        free(p);
    }
    free(index);
    free(s);
}

/* Every view of m has the dtype, shape and exact bytes gen_model wrote. */
static void verify_model(kd_model *m, const kd_config *c, const gen_opts *o) {
    tspec *s = calloc((size_t)c->n_layers * 24 + 8, sizeof *s);
    size_t n = list_tensors(c, !c->tie_embeddings, s);
    for (size_t i = 0; i < n; i++) {
        const kd_tensor *t = tensor_of(m, &s[i]);
        kd_dtype dt = pick_dtype(o, &s[i], i);
        ck_assert_msg(t->data != NULL, "%s not bound", s[i].name);
        ck_assert_msg(t->dtype == dt, "%s: dtype %s, expected %s", s[i].name, kd_dtype_name(t->dtype),
                      kd_dtype_name(dt));
        ck_assert_int_eq(t->ndim, s[i].ndim);
        for (int d = 0; d < t->ndim; d++) ck_assert_int_eq(t->shape[d], s[i].shape[d]);
        int64_t ne = numel(s[i].ndim, s[i].shape);
        size_t nb = (size_t)ne * kd_dtype_size(dt);
        void *want = malloc(nb + 1);
        fill_random(want, dt, ne, tensor_seed(o, i));
        ck_assert_msg(memcmp(t->data, want, nb) == 0, "%s: bytes differ", s[i].name);
        free(want);
    }
    if (c->tie_embeddings) ck_assert_ptr_null(m->tensors.lm_head.data);
    if (!c->use_short_conv)
        for (int i = 0; i < c->n_layers; i++) {
            ck_assert_ptr_null(m->tensors.layers[i].q_conv.data);
            ck_assert_ptr_null(m->tensors.layers[i].v_conv.data);
        }
    free(s);
}

static kd_config base_config(void) {
    kd_config c = {0};
    c.hidden = 32, c.n_layers = 2, c.n_heads = 2, c.n_v_heads = 2, c.head_k = 8, c.head_v = 8;
    c.conv_size = 4, c.use_short_conv = 1, c.intermediate = 64, c.vocab = 50, c.norm_eps = 1e-6;
    return c;
}

/* Grouped value heads, expand_v 2, no conv, lower-bound gate, neg eigval, tied head. */
static kd_config variant_config(void) {
    kd_config c = {0};
    c.hidden = 24, c.n_layers = 3, c.n_heads = 2, c.n_v_heads = 4, c.head_k = 8, c.head_v = 16;
    c.conv_size = 3, c.use_short_conv = 0, c.intermediate = 40, c.vocab = 37, c.norm_eps = 1e-5;
    c.use_lower_bound = 1, c.lower_bound = -5, c.allow_neg_eigval = 1, c.tie_embeddings = 1;
    return c;
}

static void check_config_eq(const kd_config *a, const kd_config *b) {
    ck_assert_int_eq(a->hidden, b->hidden);
    ck_assert_int_eq(a->n_layers, b->n_layers);
    ck_assert_int_eq(a->n_heads, b->n_heads);
    ck_assert_int_eq(a->n_v_heads, b->n_v_heads);
    ck_assert_int_eq(a->head_k, b->head_k);
    ck_assert_int_eq(a->head_v, b->head_v);
    ck_assert_int_eq(a->use_short_conv, b->use_short_conv);
    if (a->use_short_conv) ck_assert_int_eq(a->conv_size, b->conv_size);
    ck_assert_int_eq(a->intermediate, b->intermediate);
    ck_assert_int_eq(a->vocab, b->vocab);
    ck_assert(a->norm_eps == b->norm_eps);
    ck_assert_int_eq(a->use_lower_bound, b->use_lower_bound);
    if (a->use_lower_bound) ck_assert(a->lower_bound == b->lower_bound);
    ck_assert_int_eq(a->allow_neg_eigval, b->allow_neg_eigval);
    ck_assert_int_eq(a->tie_embeddings, b->tie_embeddings);
}

/* Opening dir must fail with a message mentioning each needle (NULL-terminated). */
static void expect_model_fail(const char *dir, const char *needle, const char *needle2) {
    kd_err err = {{0}};
    kd_model *m = kd_model_open(dir, &err);
    if (m) kd_model_close(m);
    ck_assert_msg(m == NULL, "%s: loaded, expected an error mentioning \"%s\"", dir, needle);
    EXPECT_MSG(err.msg, needle);
    if (needle2) EXPECT_MSG(err.msg, needle2);
}

/* Generates a checkpoint with options o into a fresh subdir and expects an error. */
static void gen_fail(const char *tmp, const kd_config *c, const gen_opts *o, const char *needle,
                     const char *needle2) {
    static int k;
    char name[32];
    snprintf(name, sizeof name, "m%d", k++);
    char *dir = path_join(tmp, name);
    gen_model(dir, c, o);
    expect_model_fail(dir, needle, needle2);
    free(dir);
}

/* ---- oracle checkpoints ---- */

static kd_model *open_oracle(const char *rel) {
    char path[1024];
    ck_assert_msg(kd_test_oracle(path, sizeof path, rel) != NULL, "oracle %s missing", rel);
    kd_err err;
    kd_model *m = kd_model_open(path, &err);
    ck_assert_msg(m != NULL, "%s", err.msg);
    return m;
}

static void check_shape(const kd_tensor *t, kd_dtype dt, int ndim, int64_t a, int64_t b, int64_t c) {
    ck_assert_ptr_nonnull(t->data);
    ck_assert_str_eq(kd_dtype_name(t->dtype), kd_dtype_name(dt));
    ck_assert_int_eq(t->ndim, ndim);
    int64_t s[3] = {a, b, c};
    for (int i = 0; i < ndim; i++) ck_assert_int_eq(t->shape[i], s[i]);
}

START_TEST(oracle_tiny) {
    kd_model *m = open_oracle("tiny/model");
    const kd_config *c = &m->config;
    kd_config want = {0};
    want.hidden = 128, want.n_layers = 3, want.n_heads = 2, want.n_v_heads = 2, want.head_k = 32;
    want.head_v = 32, want.conv_size = 4, want.use_short_conv = 1, want.intermediate = 256;
    want.vocab = 384, want.norm_eps = 1e-6;
    check_config_eq(c, &want);
    ck_assert_int_eq(m->eos_token_id, 2);
    ck_assert_int_eq(m->bos_token_id, 1);
    ck_assert_uint_eq(m->n_files, 1);
    ck_assert_str_eq(kd_st_meta(m->files[0], "format"), "pt");
    const kd_model_tensors *t = &m->tensors;
    ck_assert_int_eq(t->n_layers, 3);
    check_shape(&t->embed, KD_BF16, 2, 384, 128, 0);
    check_shape(&t->lm_head, KD_BF16, 2, 384, 128, 0);
    check_shape(&t->final_norm, KD_BF16, 1, 128, 0, 0);
    for (int i = 0; i < 3; i++) {
        const kd_layer_tensors *l = &t->layers[i];
        check_shape(&l->A_log, KD_F32, 1, 2, 0, 0);
        check_shape(&l->dt_bias, KD_F32, 1, 64, 0, 0);
        check_shape(&l->q_proj, KD_BF16, 2, 64, 128, 0);
        check_shape(&l->v_conv, KD_BF16, 3, 64, 1, 4);
        check_shape(&l->f_proj1, KD_BF16, 2, 64, 32, 0);
        check_shape(&l->g_proj1_bias, KD_BF16, 1, 64, 0, 0);
        check_shape(&l->o_proj, KD_BF16, 2, 128, 64, 0);
        check_shape(&l->down_proj, KD_BF16, 2, 128, 256, 0);
    }
    /* Values read independently from the file. */
    ck_assert(kd_tensor_get_f64(&t->layers[0].A_log, 0) == 2.2840874195098877);
    ck_assert(kd_tensor_get_f64(&t->layers[0].A_log, 1) == 2.5079591274261475);
    ck_assert(kd_tensor_get_f64(&t->layers[1].dt_bias, 5) == -3.806241035461426);
    ck_assert(kd_tensor_get_f64(&t->embed, 0) == -0.22265625);
    ck_assert(kd_tensor_get_f64(&t->embed, 1000) == 0.376953125);
    ck_assert(kd_tensor_get_f64(&t->lm_head, 77) == -0.1171875);
    ck_assert(kd_tensor_get_f64(&t->layers[1].q_proj, 123) == -0.09326171875);
    ck_assert(kd_tensor_get_f64(&t->final_norm, 3) == 0.66796875);
    ck_assert(kd_tensor_get_f64(&t->layers[0].v_conv, 7) == 0.0380859375);
    /* Views point into the mapping. */
    const char *lo = m->files[0]->map, *hi = lo + m->files[0]->map_len;
    ck_assert((const char *)t->embed.data > lo && (const char *)t->embed.data + 384 * 128 * 2 <= hi);
    kd_model_close(m);
}
END_TEST

START_TEST(oracle_small) {
    kd_model *m = open_oracle("small/model");
    const kd_config *c = &m->config;
    ck_assert_int_eq(c->hidden, 512);
    ck_assert_int_eq(c->n_layers, 2);
    ck_assert_int_eq(c->n_heads, 4);
    ck_assert_int_eq(c->n_v_heads, 4);
    ck_assert_int_eq(c->head_k, 128);
    ck_assert_int_eq(c->head_v, 128);
    ck_assert_int_eq(c->intermediate, 512);
    ck_assert_int_eq(c->vocab, 1024);
    ck_assert_int_eq(c->use_lower_bound, 0);
    ck_assert_int_eq(c->tie_embeddings, 0);
    const kd_model_tensors *t = &m->tensors;
    check_shape(&t->embed, KD_BF16, 2, 1024, 512, 0);
    check_shape(&t->layers[1].q_proj, KD_BF16, 2, 512, 512, 0);
    check_shape(&t->layers[0].A_log, KD_F32, 1, 4, 0, 0);
    check_shape(&t->layers[1].dt_bias, KD_F32, 1, 512, 0, 0);
    check_shape(&t->layers[0].k_conv, KD_BF16, 3, 512, 1, 4);
    check_shape(&t->layers[0].gate_proj, KD_BF16, 2, 512, 512, 0);
    ck_assert(kd_tensor_get_f64(&t->layers[0].A_log, 0) == 0.21562500298023224);
    ck_assert(kd_tensor_get_f64(&t->layers[0].A_log, 1) == 1.9877817630767822);
    ck_assert(kd_tensor_get_f64(&t->layers[1].dt_bias, 5) == -4.727962017059326);
    ck_assert(kd_tensor_get_f64(&t->embed, 0) == 0.734375);
    ck_assert(kd_tensor_get_f64(&t->embed, 1000) == 0.046875);
    ck_assert(kd_tensor_get_f64(&t->lm_head, 77) == -0.0240478515625);
    ck_assert(kd_tensor_get_f64(&t->layers[1].q_proj, 123) == -0.041015625);
    ck_assert(kd_tensor_get_f64(&t->final_norm, 3) == 1.0078125);
    ck_assert(kd_tensor_get_f64(&t->layers[0].v_conv, 7) == -0.14453125);
    kd_model_close(m);
}
END_TEST

/* Compares every view of two models (same config). */
static void compare_models(kd_model *a, kd_model *b) {
    check_config_eq(&a->config, &b->config);
    ck_assert_int_eq(a->tensors.n_layers, b->tensors.n_layers);
    size_t per = sizeof(kd_layer_tensors) / sizeof(kd_tensor);
    for (int i = -1; i < a->tensors.n_layers; i++) {
        const kd_tensor *x = i < 0 ? &a->tensors.embed : (const kd_tensor *)&a->tensors.layers[i];
        const kd_tensor *y = i < 0 ? &b->tensors.embed : (const kd_tensor *)&b->tensors.layers[i];
        size_t cnt = i < 0 ? 3 : per; /* embed, final_norm, lm_head */
        for (size_t j = 0; j < cnt; j++) {
            ck_assert((x[j].data == NULL) == (y[j].data == NULL));
            if (!x[j].data) continue;
            ck_assert(x[j].data != y[j].data);
            ck_assert_int_eq(x[j].dtype, y[j].dtype);
            ck_assert_int_eq(x[j].ndim, y[j].ndim);
            for (int d = 0; d < x[j].ndim; d++) ck_assert_int_eq(x[j].shape[d], y[j].shape[d]);
            size_t nb = (size_t)kd_tensor_numel(&x[j]) * kd_dtype_size(x[j].dtype);
            ck_assert(memcmp(x[j].data, y[j].data, nb) == 0);
        }
    }
}

/* The tiny oracle re-written by our writer as 3 shards + index loads identical views. */
START_TEST(oracle_resharded) {
    char src[1024], *tmp = kd_test_tmpdir();
    ck_assert_ptr_nonnull(kd_test_oracle(src, sizeof src, "tiny/model/model.safetensors"));
    kd_err err;
    kd_st_file *f = kd_st_open(src, &err);
    ck_assert_msg(f != NULL, "%s", err.msg);
    for (int nshards = 2; nshards <= 3; nshards++) {
        char sub[16];
        snprintf(sub, sizeof sub, "s%d", nshards);
        char *dir = path_join(tmp, sub);
        mkdir(dir, 0755);
        kd_st_writer *w[3];
        for (int k = 0; k < nshards; k++) w[k] = kd_st_writer_new();
        char *index = NULL;
        size_t ilen = 0;
        FILE *fi = open_memstream(&index, &ilen);
        fprintf(fi, "{\"metadata\": {}, \"weight_map\": {");
        for (size_t i = 0; i < f->n_entries; i++) {
            const kd_st_entry *e = &f->entries[i];
            int k = (int)(i * 7 % (size_t)nshards);
            ck_assert(kd_st_writer_add(w[k], e->name, e->t.dtype, e->t.ndim, e->t.shape, e->t.data, &err) == 0);
            fprintf(fi, "%s\"%s\": \"part%d.safetensors\"", i ? ", " : "", e->name, k);
        }
        fprintf(fi, "}}");
        fclose(fi);
        for (int k = 0; k < nshards; k++) {
            char name[32];
            snprintf(name, sizeof name, "part%d.safetensors", k);
            char *p = path_join(dir, name);
            ck_assert_msg(kd_st_writer_write(w[k], p, &err) == 0, "%s", err.msg);
            kd_st_writer_free(w[k]);
            free(p);
        }
        char *p = path_join(dir, "model.safetensors.index.json");
        write_text(p, index);
        free(p);
        free(index);
        char cfg[1024];
        size_t clen;
        kd_test_oracle(cfg, sizeof cfg, "tiny/model/config.json");
        unsigned char *ctext = read_bytes(cfg, &clen);
        p = path_join(dir, "config.json");
        write_bytes(p, ctext, clen);
        free(p);
        free(ctext);

        kd_model *a = open_oracle("tiny/model");
        kd_model *b = kd_model_open(dir, &err);
        ck_assert_msg(b != NULL, "%s", err.msg);
        ck_assert_uint_eq(b->n_files, (size_t)nshards);
        compare_models(a, b);
        kd_model_close(a);
        kd_model_close(b);
        free(dir);
    }
    kd_st_close(f);
    kd_test_rmtree(tmp);
    free(tmp);
}
END_TEST

/* ---- generated checkpoints ---- */

START_TEST(generated_variants) {
    char *tmp = kd_test_tmpdir();
    kd_test_rng r;
    kd_test_rng_init(&r, kd_test_seed() ^ 0x51);
    kd_config cs[2] = {base_config(), variant_config()};
    for (int v = 0; v < 2; v++)
        for (int mixed = 0; mixed <= 1; mixed++)
            for (int shards = 0; shards <= 3; shards += 3) {
                gen_opts o = {.seed = kd_test_rng_u64(&r) >> 8, .mixed = mixed, .n_shards = shards};
                char sub[32];
                snprintf(sub, sizeof sub, "v%d_%d_%d", v, mixed, shards);
                char *dir = path_join(tmp, sub);
                gen_model(dir, &cs[v], &o);
                kd_err err;
                kd_model *m = kd_model_open(dir, &err);
                ck_assert_msg(m != NULL, "%s", err.msg);
                check_config_eq(&m->config, &cs[v]);
                ck_assert_uint_eq(m->n_files, shards ? (size_t)shards : 1);
                verify_model(m, &cs[v], &o);
                kd_model_close(m);
                free(dir);
            }
    /* Tied with lm_head present: accepted and ignored. */
    kd_config c = variant_config();
    gen_opts o = {.seed = 5, .lm_head = 1};
    char *dir = path_join(tmp, "tied_head");
    gen_model(dir, &c, &o);
    kd_err err;
    kd_model *m = kd_model_open(dir, &err);
    ck_assert_msg(m != NULL, "%s", err.msg);
    verify_model(m, &c, &o);
    kd_model_close(m);
    free(dir);
    kd_test_rmtree(tmp);
    free(tmp);
}
END_TEST

START_TEST(model_errors) {
    char *tmp = kd_test_tmpdir();
    kd_config c = base_config(), vc = variant_config();
    gen_opts o;
#define FAIL_WITH(cfg, needle, needle2, ...)  \
    do {                                      \
        o = (gen_opts){.seed = 3, __VA_ARGS__}; \
        gen_fail(tmp, &(cfg), &o, needle, needle2); \
    } while (0)
    FAIL_WITH(c, "missing tensor model.layers.1.attn.dt_bias", "model.safetensors",
              .drop = "model.layers.1.attn.dt_bias");
    FAIL_WITH(c, "missing tensor model.embeddings.weight", NULL, .drop = "model.embeddings.weight");
    FAIL_WITH(c, "unexpected tensor model.layers.0.attn.extra.weight", "model.safetensors",
              .extra = "model.layers.0.attn.extra.weight");
    FAIL_WITH(c, "model.layers.1.attn.q_proj.weight has shape [17, 32], expected [16, 32]", "model.safetensors",
              .reshape = "model.layers.1.attn.q_proj.weight");
    FAIL_WITH(c, "model.layers.0.attn.k_conv1d.weight has shape [17, 1, 4], expected [16, 1, 4]", NULL,
              .reshape = "model.layers.0.attn.k_conv1d.weight");
    FAIL_WITH(c, "model.norm.weight has dtype I32", NULL, .bad_dtype = "model.norm.weight");
    FAIL_WITH(c, "missing tensor lm_head.weight", NULL, .no_lm_head = 1);
    FAIL_WITH(vc, "unexpected tensor", "conv1d", .conv_tensors = 1);
    FAIL_WITH(c, "unexpected tensor", "conv1d", .config_override = "use_short_conv=false");
    /* config.json problems */
    FAIL_WITH(c, "missing required field hidden_size", "config.json", .config_override = "hidden_size=");
    FAIL_WITH(c, "missing required field vocab_size", NULL, .config_override = "vocab_size=null");
    FAIL_WITH(c, "hidden_size must be an integer", NULL, .config_override = "hidden_size=\"32\"");
    FAIL_WITH(c, "num_heads = 2.5 must be an integer", NULL, .config_override = "num_heads=2.5");
    FAIL_WITH(c, "num_hidden_layers must be an integer", NULL, .config_override = "num_hidden_layers=true");
    FAIL_WITH(c, "use_short_conv must be true or false", NULL, .config_override = "use_short_conv=1");
    FAIL_WITH(c, "tie_word_embeddings must be true or false", NULL,
              .config_override = "tie_word_embeddings=\"yes\"");
    FAIL_WITH(c, "norm_eps must be a number", NULL, .config_override = "norm_eps=\"1e-6\"");
    FAIL_WITH(c, "eos_token_id must be an integer", NULL, .config_override = "eos_token_id=[1,2]");
    FAIL_WITH(c, "lower_bound must be a number", NULL, .config_override = "lower_bound=\"-5\"");
    FAIL_WITH(c, "unsupported model_type \"gla\"", NULL, .config_override = "model_type=\"gla\"");
    FAIL_WITH(c, "unsupported model_type", NULL, .config_override = "model_type=");
    FAIL_WITH(c, "softmax attention layers not supported", NULL,
              .config_override = "attn={\"layers\": [1], \"num_heads\": 2}");
    FAIL_WITH(c, "hidden_act \"gelu\" not supported", NULL, .config_override = "hidden_act=\"gelu\"");
    FAIL_WITH(c, "use_l2warp not supported", NULL, .config_override = "use_l2warp=true");
    FAIL_WITH(c, "safe_gate not supported", NULL, .config_override = "safe_gate=true");
    FAIL_WITH(c, "attnres_block_size not supported", NULL, .config_override = "attnres_block_size=64");
    FAIL_WITH(c, "num_v_heads 3 is not a multiple of num_heads 2", NULL, .config_override = "num_v_heads=3");
    FAIL_WITH(c, "expand_v", "not an integer", .config_override = "expand_v=0.3");
    FAIL_WITH(c, "hidden = 0 is out of range", "config.json", .config_override = "hidden_size=0");
    FAIL_WITH(c, "lower_bound", "must be negative", .config_override = "lower_bound=0.5");
    FAIL_WITH(c, "duplicate", NULL, .config_override = "hidden_size=32, \"hidden_size\": 32");
    /* index problems */
    FAIL_WITH(c, "listed in the index is missing", NULL, .n_shards = 2,
              .index_extra = "\"model.layers.0.attn.ghost\": \"model-00001-of-00002.safetensors\"");
    FAIL_WITH(c, "model.layers.0.attn.A_log is not in the index", NULL, .n_shards = 2,
              .index_skip = "model.layers.0.attn.A_log");
    FAIL_WITH(c, "model.embeddings.weight listed in the index is missing", NULL, .n_shards = 2,
              .index_skip = "model.embeddings.weight",
              .index_extra = "\"model.embeddings.weight\": \"model-00002-of-00002.safetensors\"");
    FAIL_WITH(c, "model.norm.weight is mapped to model-0000", NULL, .n_shards = 2, .dup = "model.norm.weight");
    FAIL_WITH(c, "missing-shard.safetensors: cannot open", NULL, .n_shards = 2,
              .index_extra = "\"x\": \"missing-shard.safetensors\"");
    FAIL_WITH(c, "shard name \"../model-00001-of-00002.safetensors\"", "not a plain file name", .n_shards = 2,
              .index_extra = "\"x\": \"../model-00001-of-00002.safetensors\"");
    FAIL_WITH(c, "not a plain file name", NULL, .n_shards = 2, .index_extra = "\"x\": \"sub/a.safetensors\"");
    FAIL_WITH(c, "weight_map entry x is not a string", NULL, .n_shards = 2, .index_extra = "\"x\": 3");
    FAIL_WITH(c, "missing tensor model.layers.1.mlp.up_proj.weight", "index.json", .n_shards = 3,
              .drop = "model.layers.1.mlp.up_proj.weight");
    FAIL_WITH(c, "model.layers.0.mlp_norm.weight has dtype I32", NULL, .n_shards = 3,
              .bad_dtype = "model.layers.0.mlp_norm.weight");
#undef FAIL_WITH
    /* Hand-made directories. */
    char *dir = path_join(tmp, "nothing");
    mkdir(dir, 0755);
    expect_model_fail(dir, "config.json: cannot open", NULL);
    char *p = path_join(dir, "config.json");
    char *cfg = config_text(&c, NULL);
    write_text(p, cfg);
    free(cfg);
    expect_model_fail(dir, "no model.safetensors or model.safetensors.index.json", NULL);
    char *idx = path_join(dir, "model.safetensors.index.json");
    write_text(idx, "{\"weight_map\": {\"a\": \"b\",");
    expect_model_fail(dir, "model.safetensors.index.json: bad JSON", NULL);
    write_text(idx, "[1, 2]");
    expect_model_fail(dir, "weight_map is missing or not an object", NULL);
    write_text(idx, "{\"metadata\": {}}");
    expect_model_fail(dir, "weight_map is missing or not an object", NULL);
    write_text(idx, "{\"weight_map\": {}}");
    expect_model_fail(dir, "missing tensor", NULL);
    char *st = path_join(dir, "model.safetensors");
    write_bytes(st, "\x10\0\0\0", 4);
    expect_model_fail(dir, "model.safetensors: file is too short", NULL);
    write_text(p, "{\"model_type\": \"kda\",");
    expect_model_fail(dir, "config.json: bad JSON", NULL);
    write_text(p, "[\"kda\"]");
    expect_model_fail(dir, "config is not a JSON object", NULL);
    free(st);
    free(idx);
    free(p);
    free(dir);
    kd_test_rmtree(tmp);
    free(tmp);
}
END_TEST

/* An I64 tensor of the right shape (gen_model's bad_dtype writes I32). */
START_TEST(model_int64_tensor) {
    char *tmp = kd_test_tmpdir();
    kd_config c = base_config();
    gen_opts o = {.seed = 9};
    char *dir = path_join(tmp, "m");
    gen_model(dir, &c, &o);
    /* Rewrite model.safetensors with one tensor as I64 of the right shape. */
    char *p = path_join(dir, "model.safetensors");
    kd_err err;
    kd_st_file *f = kd_st_open(p, &err);
    ck_assert_msg(f != NULL, "%s", err.msg);
    kd_st_writer *w = kd_st_writer_new();
    for (size_t i = 0; i < f->n_entries; i++) {
        const kd_st_entry *e = &f->entries[i];
        if (strcmp(e->name, "model.layers.1.attn.o_norm.weight") == 0) {
            int64_t *z = calloc((size_t)kd_tensor_numel(&e->t), 8);
            ck_assert(kd_st_writer_add(w, e->name, KD_I64, e->t.ndim, e->t.shape, z, &err) == 0);
            free(z);
        } else {
            ck_assert(kd_st_writer_add(w, e->name, e->t.dtype, e->t.ndim, e->t.shape, e->t.data, &err) == 0);
        }
    }
    kd_st_close(f);
    ck_assert_msg(kd_st_writer_write(w, p, &err) == 0, "%s", err.msg);
    kd_st_writer_free(w);
    expect_model_fail(dir, "model.layers.1.attn.o_norm.weight has dtype I64", "model.safetensors");
    free(p);
    free(dir);
    kd_test_rmtree(tmp);
    free(tmp);
}
END_TEST

/* ---- config.json parsing ---- */

static void parse_ok(const char *text, kd_config *c, int32_t *eos, int32_t *bos) {
    kd_err err;
    ck_assert_msg(kd_config_parse_json(text, strlen(text), "cfg", c, eos, bos, &err) == 0, "%s", err.msg);
}

static void parse_fail(const char *text, const char *needle) {
    kd_err err = {{0}};
    kd_config c;
    int32_t e, b;
    ck_assert_msg(kd_config_parse_json(text, strlen(text), "cfg", &c, &e, &b, &err) != 0, "parsed: %s", text);
    ck_assert_msg(strncmp(err.msg, "cfg: ", 5) == 0, "error \"%s\" does not name the source", err.msg);
    EXPECT_MSG(err.msg, needle);
}

#define MIN_CFG "\"model_type\": \"kda\", \"hidden_size\": 128, \"num_hidden_layers\": 2, " \
                "\"num_heads\": 2, \"head_dim\": 32, \"vocab_size\": 100"

START_TEST(config_defaults) {
    kd_config c;
    int32_t eos = 7, bos = 7;
    parse_ok("{" MIN_CFG "}", &c, &eos, &bos);
    ck_assert_int_eq(c.hidden, 128);
    ck_assert_int_eq(c.n_layers, 2);
    ck_assert_int_eq(c.n_heads, 2);
    ck_assert_int_eq(c.n_v_heads, 2);
    ck_assert_int_eq(c.head_k, 32);
    ck_assert_int_eq(c.head_v, 32);
    ck_assert_int_eq(c.conv_size, 4);
    ck_assert_int_eq(c.use_short_conv, 1);
    ck_assert_int_eq(c.intermediate, 512); /* int(128*4*2/3) = 341 -> 512 */
    ck_assert_int_eq(c.vocab, 100);
    ck_assert(c.norm_eps == 1e-6);
    ck_assert_int_eq(c.use_lower_bound, 0);
    ck_assert_int_eq(c.allow_neg_eigval, 0);
    ck_assert_int_eq(c.tie_embeddings, 0);
    ck_assert_int_eq(eos, -1);
    ck_assert_int_eq(bos, -1);

    parse_ok("{" MIN_CFG ", \"num_v_heads\": null, \"intermediate_size\": null, \"lower_bound\": null,"
             " \"eos_token_id\": null, \"bos_token_id\": 0, \"expand_v\": null, \"attn\": null, \"conv_size\": null,"
             " \"hidden_ratio\": 2, \"some_future_key\": {\"x\": [1]}}", &c, &eos, &bos);
    ck_assert_int_eq(c.n_v_heads, 2);
    ck_assert_int_eq(c.head_v, 32);
    ck_assert_int_eq(c.conv_size, 4);
    ck_assert_int_eq(c.intermediate, 256); /* int(128*2*2/3) = 170 -> 256 */
    ck_assert_int_eq(eos, -1);
    ck_assert_int_eq(bos, 0);

    /* flash-linear-attention truncates before rounding: int(385*1*2/3) = 256 -> 256. */
    parse_ok("{\"model_type\": \"kda\", \"hidden_size\": 385, \"num_hidden_layers\": 1, \"num_heads\": 1,"
             " \"head_dim\": 8, \"vocab_size\": 10, \"hidden_ratio\": 1}", &c, NULL, NULL);
    ck_assert_int_eq(c.intermediate, 256);
    parse_ok("{\"model_type\": \"kda\", \"hidden_size\": 2048, \"num_hidden_layers\": 1, \"num_heads\": 16,"
             " \"head_dim\": 128, \"vocab_size\": 10}", &c, NULL, NULL);
    ck_assert_int_eq(c.intermediate, 5632); /* int(5461.33) = 5461 -> 5632 */

    parse_ok("{" MIN_CFG ", \"num_v_heads\": 4, \"expand_v\": 2, \"use_short_conv\": false, \"conv_size\": 0,"
             " \"intermediate_size\": 96.0, \"lower_bound\": -5, \"allow_neg_eigval\": true,"
             " \"tie_word_embeddings\": true, \"norm_eps\": 1e-5, \"hidden_act\": \"silu\","
             " \"eos_token_id\": 3.0, \"use_l2warp\": false, \"safe_gate\": null}", &c, &eos, &bos);
    ck_assert_int_eq(c.n_v_heads, 4);
    ck_assert_int_eq(c.head_v, 64);
    ck_assert_int_eq(c.use_short_conv, 0);
    ck_assert_int_eq(c.intermediate, 96);
    ck_assert_int_eq(c.use_lower_bound, 1);
    ck_assert(c.lower_bound == -5.0);
    ck_assert_int_eq(c.allow_neg_eigval, 1);
    ck_assert_int_eq(c.tie_embeddings, 1);
    ck_assert(c.norm_eps == 1e-5);
    ck_assert_int_eq(eos, 3);
    ck_assert_int_eq(bos, -1);
    /* expand_v 0.5 with head_dim 32 -> 16 is an integer. */
    parse_ok("{" MIN_CFG ", \"expand_v\": 0.5}", &c, NULL, NULL);
    ck_assert_int_eq(c.head_v, 16);
}
END_TEST

START_TEST(config_errors) {
    parse_fail("", "bad JSON");
    parse_fail("{\"model_type\": \"kda\"", "bad JSON");
    parse_fail("[]", "not a JSON object");
    parse_fail("{}", "unsupported model_type");
    parse_fail("{\"model_type\": 3}", "unsupported model_type");
    parse_fail("{\"model_type\": \"kimi_linear\"}", "unsupported model_type \"kimi_linear\"");
    parse_fail("{\"model_type\": \"kda\"}", "missing required field hidden_size");
    parse_fail("{" MIN_CFG ", \"head_dim\": 32}", "duplicate");
    const char *missing[] = {"hidden_size", "num_hidden_layers", "num_heads", "head_dim", "vocab_size"};
    for (int i = 0; i < 5; i++) {
        char text[512], need[64];
        snprintf(text, sizeof text, "{\"model_type\": \"kda\"%s%s%s%s%s}",
                 i == 0 ? "" : ", \"hidden_size\": 64", i == 1 ? "" : ", \"num_hidden_layers\": 1",
                 i == 2 ? "" : ", \"num_heads\": 2", i == 3 ? "" : ", \"head_dim\": 16",
                 i == 4 ? "" : ", \"vocab_size\": 10");
        snprintf(need, sizeof need, "missing required field %s", missing[i]);
        parse_fail(text, need);
    }
    parse_fail("{" MIN_CFG ", \"num_v_heads\": \"4\"}", "num_v_heads must be an integer");
    parse_fail("{" MIN_CFG ", \"conv_size\": 4.5}", "conv_size = 4.5 must be an integer");
    parse_fail("{" MIN_CFG ", \"intermediate_size\": false}", "intermediate_size must be an integer");
#define REQ(v) "{\"model_type\": \"kda\", \"hidden_size\": 128, \"num_hidden_layers\": 2, \"head_dim\": 32, " v "}"
    parse_fail(REQ("\"num_heads\": 2, \"vocab_size\": 1e12"), "vocab_size = 1e+12 is out of range");
    parse_fail(REQ("\"num_heads\": 2, \"vocab_size\": 2.5"), "vocab_size = 2.5 must be an integer");
    parse_fail(REQ("\"num_heads\": 2, \"vocab_size\": \"big\""), "vocab_size must be an integer");
    parse_fail(REQ("\"num_heads\": -2, \"vocab_size\": 10"), "n_heads = -2 is out of range");
    parse_fail(REQ("\"num_heads\": 0, \"vocab_size\": 10"), "out of range");
    parse_fail(REQ("\"num_heads\": [2], \"vocab_size\": 10"), "num_heads must be an integer");
#undef REQ
    parse_fail("{" MIN_CFG ", \"allow_neg_eigval\": 0}", "allow_neg_eigval must be true or false");
    parse_fail("{" MIN_CFG ", \"expand_v\": \"2\"}", "expand_v must be a number");
    parse_fail("{" MIN_CFG ", \"expand_v\": 1.01}", "not an integer");
    parse_fail("{" MIN_CFG ", \"hidden_ratio\": \"4\"}", "hidden_ratio must be a number");
    parse_fail("{" MIN_CFG ", \"hidden_act\": 1}", "hidden_act must be a string");
    parse_fail("{" MIN_CFG ", \"hidden_act\": \"relu\"}", "hidden_act \"relu\" not supported");
    parse_fail("{" MIN_CFG ", \"attn\": {\"layers\": []}}", "softmax attention layers not supported");
    parse_fail("{" MIN_CFG ", \"use_l2warp\": true}", "use_l2warp not supported");
    parse_fail("{" MIN_CFG ", \"use_l2warp\": \"no\"}", "use_l2warp must be true or false");
    parse_fail("{" MIN_CFG ", \"safe_gate\": true}", "safe_gate not supported");
    parse_fail("{" MIN_CFG ", \"attnres_block_size\": 8}", "attnres_block_size not supported");
    parse_fail("{" MIN_CFG ", \"num_v_heads\": 5}", "not a multiple of num_heads");
    parse_fail("{" MIN_CFG ", \"norm_eps\": 0}", "norm_eps");
    parse_fail("{" MIN_CFG ", \"bos_token_id\": \"<s>\"}", "bos_token_id must be an integer");
}
END_TEST

/* ---- safetensors writer/reader ---- */

typedef struct fill_ctx {
    kd_dtype dt;
    uint64_t seed;
    int64_t next, total, max_bytes, calls;
    const unsigned char *want; /* expected bytes of the whole tensor */
} fill_ctx;

static void fill_cb(void *ctx, void *dst, int64_t first, int64_t n) {
    fill_ctx *c = ctx;
    ck_assert_int_eq(first, c->next); /* in order, no gaps */
    ck_assert_int_ge(n, 1);
    ck_assert_int_le(first + n, c->total);
    int64_t nb = n * (int64_t)kd_dtype_size(c->dt);
    if (nb > c->max_bytes) c->max_bytes = nb;
    memcpy(dst, c->want + first * (int64_t)kd_dtype_size(c->dt), (size_t)nb);
    c->next = first + n;
    c->calls++;
}

START_TEST(roundtrip_random) {
    char *tmp = kd_test_tmpdir();
    kd_test_rng r;
    kd_test_rng_init(&r, kd_test_seed() ^ 0x7777);
    char *p = path_join(tmp, "rt.safetensors");
    for (int iter = 0; iter < 25; iter++) {
        enum { N = 24 };
        int n = 1 + (int)(kd_test_rng_u64(&r) % N);
        char names[N][32];
        kd_dtype dts[N];
        int nds[N];
        int64_t shapes[N][KD_MAX_DIMS];
        unsigned char *data[N];
        fill_ctx ctx[N];
        kd_st_writer *w = kd_st_writer_new();
        kd_err err;
        for (int i = 0; i < n; i++) {
            snprintf(names[i], 32, "t%02d.%llx", i, (unsigned long long)(kd_test_rng_u64(&r) & 0xffff));
            dts[i] = (kd_dtype)(kd_test_rng_u64(&r) % KD_DTYPE_COUNT);
            nds[i] = (int)(kd_test_rng_u64(&r) % (KD_MAX_DIMS + 1));
            for (int d = 0; d < nds[i]; d++) shapes[i][d] = (int64_t)(kd_test_rng_u64(&r) % 7);
            if (kd_test_rng_u64(&r) % 3) /* mostly non-empty */
                for (int d = 0; d < nds[i]; d++) shapes[i][d] += 1;
            int64_t ne = numel(nds[i], shapes[i]);
            data[i] = malloc((size_t)ne * kd_dtype_size(dts[i]) + 1);
            fill_random(data[i], dts[i], ne, kd_test_rng_u64(&r));
            if (kd_test_rng_u64(&r) % 2) {
                ctx[i] = (fill_ctx){.dt = dts[i], .total = ne, .want = data[i]};
                ck_assert_msg(kd_st_writer_add_fill(w, names[i], dts[i], nds[i], shapes[i], fill_cb, &ctx[i], &err) == 0,
                              "%s", err.msg);
            } else {
                ctx[i].total = -1;
                ck_assert_msg(kd_st_writer_add(w, names[i], dts[i], nds[i], shapes[i], data[i], &err) == 0, "%s",
                              err.msg);
            }
        }
        ck_assert(kd_st_writer_meta(w, "format", "pt", &err) == 0);
        ck_assert(kd_st_writer_meta(w, "note", "unicode \xc3\xa9 \"quoted\"", &err) == 0);
        ck_assert(kd_st_writer_meta(w, "format", "kd", &err) == 0); /* replaces */
        ck_assert_msg(kd_st_writer_write(w, p, &err) == 0, "%s", err.msg);
        kd_st_writer_free(w);
        ck_assert_int_eq(count_files(tmp), 1); /* no temp file left */

        kd_st_file *f = kd_st_open(p, &err);
        ck_assert_msg(f != NULL, "%s", err.msg);
        uint64_t hlen;
        memcpy(&hlen, f->map, 8);
        ck_assert_uint_eq(hlen % 8, 0);
        ck_assert_uint_eq(f->n_entries, (size_t)n);
        ck_assert_uint_eq(f->n_meta, 2);
        ck_assert_str_eq(kd_st_meta(f, "format"), "kd");
        ck_assert_str_eq(kd_st_meta(f, "note"), "unicode \xc3\xa9 \"quoted\"");
        ck_assert_ptr_null(kd_st_meta(f, "absent"));
        ck_assert_ptr_null(kd_st_find(f, "absent"));
        ck_assert_ptr_null(kd_st_find(f, "t"));
        for (size_t i = 1; i < f->n_entries; i++) ck_assert(strcmp(f->entries[i - 1].name, f->entries[i].name) < 0);
        uint64_t prev_end = 0;
        for (int i = 0; i < n; i++) {
            const kd_st_entry *e = kd_st_find(f, names[i]);
            ck_assert_msg(e != NULL, "%s missing", names[i]);
            ck_assert_str_eq(e->name, names[i]);
            ck_assert_int_eq(e->t.dtype, dts[i]);
            ck_assert_int_eq(e->t.ndim, nds[i]);
            for (int d = 0; d < nds[i]; d++) ck_assert_int_eq(e->t.shape[d], shapes[i][d]);
            size_t nb = (size_t)numel(nds[i], shapes[i]) * kd_dtype_size(dts[i]);
            ck_assert_uint_eq(e->nbytes, nb);
            ck_assert(memcmp(e->t.data, data[i], nb) == 0);
            /* insertion order, each tensor aligned to its element size (also in memory) */
            ck_assert_uint_ge(e->offset, prev_end);
            prev_end = e->offset + e->nbytes;
            ck_assert_uint_eq(e->offset % kd_dtype_size(dts[i]), 0);
            ck_assert_uint_eq((uintptr_t)e->t.data % kd_dtype_size(dts[i]), 0);
            if (ctx[i].total >= 0) {
                ck_assert_int_eq(ctx[i].next, ctx[i].total);
                ck_assert_int_eq(ctx[i].calls, ctx[i].total > 0 ? 1 : 0);
            }
            free(data[i]);
        }
        kd_st_close(f);
    }
    free(p);
    kd_test_rmtree(tmp);
    free(tmp);
}
END_TEST

/* Big fill tensors are produced in chunks of at most 4 MiB. */
static void big_fill(void *ctx, void *dst, int64_t first, int64_t n) {
    fill_ctx *c = ctx;
    ck_assert_int_eq(first, c->next);
    size_t es = kd_dtype_size(c->dt);
    if (n * (int64_t)es > c->max_bytes) c->max_bytes = n * (int64_t)es;
    for (int64_t i = 0; i < n; i++) {
        float v = (float)((first + i) % 4096);
        if (c->dt == KD_F32) memcpy((char *)dst + 4 * i, &v, 4);
        else {
            uint16_t h = c->dt == KD_BF16 ? kd_f32_to_bf16(v) : kd_f32_to_f16(v);
            memcpy((char *)dst + 2 * i, &h, 2);
        }
    }
    c->next = first + n;
    c->calls++;
}

START_TEST(fill_chunks) {
    char *tmp = kd_test_tmpdir();
    char *p = path_join(tmp, "big.safetensors");
    kd_st_writer *w = kd_st_writer_new();
    kd_err err;
    int64_t s1[2] = {1500, 2001}, s2[1] = {2500001}, s3[1] = {3};
    fill_ctx a = {.dt = KD_F32, .total = s1[0] * s1[1]}, b = {.dt = KD_BF16, .total = s2[0]},
             c = {.dt = KD_F16, .total = 3};
    ck_assert(kd_st_writer_add_fill(w, "a", KD_F32, 2, s1, big_fill, &a, &err) == 0);
    ck_assert(kd_st_writer_add_fill(w, "b", KD_BF16, 1, s2, big_fill, &b, &err) == 0);
    ck_assert(kd_st_writer_add_fill(w, "c", KD_F16, 1, s3, big_fill, &c, &err) == 0);
    ck_assert(kd_st_writer_add_fill(w, "d", KD_F16, 1, s3, NULL, NULL, &err) != 0);
    ck_assert_msg(kd_st_writer_write(w, p, &err) == 0, "%s", err.msg);
    kd_st_writer_free(w);
    ck_assert_int_le(a.max_bytes, 4 << 20);
    ck_assert_int_le(b.max_bytes, 4 << 20);
    ck_assert_int_ge(a.calls, 3);
    ck_assert_int_ge(b.calls, 2);
    ck_assert_int_eq(a.next, a.total);
    ck_assert_int_eq(b.next, b.total);
    ck_assert_int_eq(c.calls, 1);
    kd_st_file *f = kd_st_open(p, &err);
    ck_assert_msg(f != NULL, "%s", err.msg);
    const kd_st_entry *ea = kd_st_find(f, "a"), *eb = kd_st_find(f, "b"), *ec = kd_st_find(f, "c");
    ck_assert(ea && eb && ec);
    for (int64_t i = 0; i < a.total; i += 997)
        ck_assert(kd_tensor_get_f64(&ea->t, i) == (double)(i % 4096));
    ck_assert(kd_tensor_get_f64(&ea->t, a.total - 1) == (double)((a.total - 1) % 4096));
    for (int64_t i = 0; i < b.total; i += 1009) {
        double want = kd_bf16_to_f32(kd_f32_to_bf16((float)(i % 4096)));
        ck_assert(kd_tensor_get_f64(&eb->t, i) == want);
    }
    ck_assert(kd_tensor_get_f64(&ec->t, 2) == 2.0);
    kd_st_close(f);
    free(p);
    kd_test_rmtree(tmp);
    free(tmp);
}
END_TEST

/* bf16, f16 and f32 tensors in one file read back exactly. */
START_TEST(mixed_dtypes_exact) {
    char *tmp = kd_test_tmpdir();
    char *p = path_join(tmp, "mixed.safetensors");
    enum { N = 37 };
    float vals[N];
    for (int i = 0; i < N; i++) vals[i] = (float)((i - 18) * 0.125); /* exact in all three */
    vals[0] = 65504.0f;                                          /* f16 max; bf16 rounds */
    vals[1] = 1.0f / 16384;                                      /* small normal */
    vals[2] = -0.0f;
    uint16_t bf[N], hf[N];
    for (int i = 0; i < N; i++) bf[i] = kd_f32_to_bf16(vals[i]), hf[i] = kd_f32_to_f16(vals[i]);
    int64_t shape[2] = {N, 1}, shape1[1] = {N}, shape3[3] = {1, N, 1};
    kd_err err;
    kd_st_writer *w = kd_st_writer_new();
    ck_assert(kd_st_writer_add(w, "w.bf16", KD_BF16, 1, shape1, bf, &err) == 0); /* 74 bytes */
    ck_assert(kd_st_writer_add(w, "w.f32", KD_F32, 2, shape, vals, &err) == 0);  /* needs alignment */
    ck_assert(kd_st_writer_add(w, "w.f16", KD_F16, 3, shape3, hf, &err) == 0);
    ck_assert(kd_st_writer_meta(w, "kind", "mixed", &err) == 0);
    ck_assert_msg(kd_st_writer_write(w, p, &err) == 0, "%s", err.msg);
    kd_st_writer_free(w);
    kd_st_file *f = kd_st_open(p, &err);
    ck_assert_msg(f != NULL, "%s", err.msg);
    const kd_st_entry *eb = kd_st_find(f, "w.bf16"), *ef = kd_st_find(f, "w.f32"), *eh = kd_st_find(f, "w.f16");
    ck_assert(eb && ef && eh);
    ck_assert_int_eq(eb->t.dtype, KD_BF16);
    ck_assert_int_eq(ef->t.dtype, KD_F32);
    ck_assert_int_eq(eh->t.dtype, KD_F16);
    ck_assert_uint_eq(ef->offset % 4, 0);
    float out[N];
    kd_tensor_to_f32(&ef->t, 0, N, out);
    for (int i = 0; i < N; i++) {
        ck_assert(kd_tensor_get_f64(&ef->t, i) == vals[i]);
        ck_assert(memcmp(&out[i], &vals[i], 4) == 0);
        ck_assert(kd_tensor_get_f64(&eh->t, i) == vals[i]);
        if (i != 0) ck_assert(kd_tensor_get_f64(&eb->t, i) == vals[i]);
    }
    ck_assert(kd_tensor_get_f64(&eb->t, 0) == 65536.0); /* bf16 rounding of 65504 */
    ck_assert(memcmp(eb->t.data, bf, sizeof bf) == 0);
    ck_assert(memcmp(eh->t.data, hf, sizeof hf) == 0);
    kd_tensor_to_f32(&eb->t, 3, 5, out);
    for (int i = 0; i < 5; i++) ck_assert(out[i] == vals[3 + i]);
    ck_assert_str_eq(kd_st_meta(f, "kind"), "mixed");
    kd_st_close(f);
    free(p);
    kd_test_rmtree(tmp);
    free(tmp);
}
END_TEST

START_TEST(writer_errors) {
    char *tmp = kd_test_tmpdir();
    char *p = path_join(tmp, "w.safetensors");
    kd_err err = {{0}};
    int64_t s[5] = {2, 2, 2, 2, 2}, neg[1] = {-1}, huge[3] = {1ll << 40, 1ll << 40, 1ll << 40};
    float data[32] = {0};
    kd_st_writer *w = kd_st_writer_new();
    ck_assert(kd_st_writer_add(w, "x", KD_F32, 5, s, data, &err) != 0);
    EXPECT_MSG(err.msg, "dims");
    ck_assert(kd_st_writer_add(w, "x", KD_F32, 1, neg, data, &err) != 0);
    ck_assert(kd_st_writer_add(w, "x", KD_F32, 3, huge, data, &err) != 0);
    ck_assert(kd_st_writer_add(w, "x", KD_DTYPE_COUNT, 1, s, data, &err) != 0);
    ck_assert(kd_st_writer_add(w, "__metadata__", KD_F32, 1, s, data, &err) != 0);
    ck_assert(kd_st_writer_add(w, "", KD_F32, 1, s, data, &err) != 0);
    ck_assert(kd_st_writer_add(w, "bad\xff", KD_F32, 1, s, data, &err) != 0);
    ck_assert(kd_st_writer_add(w, "x", KD_F32, 1, s, NULL, &err) != 0);
    ck_assert(kd_st_writer_meta(w, "k", "bad\xc3", &err) != 0);
    ck_assert(kd_st_writer_add(w, "x", KD_F32, 1, s, data, &err) == 0);
    ck_assert(kd_st_writer_add(w, "y", KD_I32, 0, s, data, &err) == 0); /* scalar */
    ck_assert(kd_st_writer_add(w, "x", KD_F16, 1, s, data, &err) == 0);
    ck_assert(kd_st_writer_write(w, p, &err) != 0);
    EXPECT_MSG(err.msg, "duplicate tensor name x");
    ck_assert_int_eq(count_files(tmp), 0);
    kd_st_writer_free(w);

    /* Missing directory: error, nothing left behind. */
    w = kd_st_writer_new();
    ck_assert(kd_st_writer_add(w, "x", KD_F32, 1, s, data, &err) == 0);
    char *bad = path_join(tmp, "no/such/dir.safetensors");
    ck_assert(kd_st_writer_write(w, bad, &err) != 0);
    EXPECT_MSG(err.msg, "no/such/dir.safetensors");
    free(bad);
    /* A directory in the way of the rename: the temp file is removed. */
    char *d = path_join(tmp, "adir");
    mkdir(d, 0755);
    char *inner = path_join(d, "keep");
    write_text(inner, "x");
    ck_assert(kd_st_writer_write(w, d, &err) != 0);
    EXPECT_MSG(err.msg, "rename");
    ck_assert_int_eq(count_files(tmp), 1);
    free(inner);
    free(d);
    /* Overwrite is atomic and complete; an empty writer writes a valid empty file. */
    ck_assert(kd_st_writer_write(w, p, &err) == 0);
    kd_st_writer_free(w);
    w = kd_st_writer_new();
    ck_assert(kd_st_writer_write(w, p, &err) == 0);
    kd_st_writer_free(w);
    kd_st_file *f = kd_st_open(p, &err);
    ck_assert_msg(f != NULL, "%s", err.msg);
    ck_assert_uint_eq(f->n_entries, 0);
    ck_assert_uint_eq(f->map_len % 8, 0);
    kd_st_close(f);
    ck_assert_int_eq(count_files(tmp), 2);
    kd_st_writer_free(NULL);
    kd_st_close(NULL);
    kd_model_close(NULL);
    free(p);
    kd_test_rmtree(tmp);
    free(tmp);
}
END_TEST

START_TEST(malformed_headers) {
    char *tmp = kd_test_tmpdir();
    char *p = path_join(tmp, "bad.safetensors");
    /* Files too short, missing, not regular. */
    write_bytes(p, "", 0);
    expect_st_fail(p, "too short");
    write_bytes(p, "\x02\0\0\0\0\0\0", 7);
    expect_st_fail(p, "too short");
    char *none = path_join(tmp, "none.safetensors");
    expect_st_fail(none, "cannot open");
    free(none);
    expect_st_fail(tmp, "not a regular file");
    /* Header length past the end, and absurdly large. */
    unsigned char buf[64];
    uint64_t h = 40;
    memcpy(buf, &h, 8);
    memset(buf + 8, ' ', 32);
    memcpy(buf + 8, "{}", 2);
    write_bytes(p, buf, 8 + 32);
    expect_st_fail(p, "past the end of the file");
    h = 1ull << 40;
    memcpy(buf, &h, 8);
    write_bytes(p, buf, 40);
    expect_st_fail(p, "too large");
    h = UINT64_MAX;
    memcpy(buf, &h, 8);
    write_bytes(p, buf, 40);
    expect_st_fail(p, "too large");
    h = 32;
    memcpy(buf, &h, 8);
    write_bytes(p, buf, 40);
    {
        kd_err e;
        kd_st_file *f = kd_st_open(p, &e);
        ck_assert_msg(f != NULL, "%s", e.msg); /* "{}" + spaces is a valid empty file */
        kd_st_close(f);
    }

    expect_raw_fail(tmp, "", 0, "bad JSON");
    expect_raw_fail(tmp, "{\"a\": ", 0, "bad JSON");
    expect_raw_fail(tmp, "{\"a\": {}} x", 0, "bad JSON");
    expect_raw_fail(tmp, "\x01\x02", 0, "bad JSON");
    expect_raw_fail(tmp, "{\"a\xff\": 1}", 0, "bad JSON");
    expect_raw_fail(tmp, "[1, 2]", 0, "not a JSON object");
    expect_raw_fail(tmp, "{\"a\": 3}", 0, "tensor a: entry is not an object");
    expect_raw_fail(tmp, "{\"a\": {\"shape\": [1], \"data_offsets\": [0, 4]}}", 4, "dtype");
    expect_raw_fail(tmp, "{\"a\": {\"dtype\": 4, \"shape\": [1], \"data_offsets\": [0, 4]}}", 4, "dtype");
    expect_raw_fail(tmp, "{\"w\": {\"dtype\": \"F8_E4M3\", \"shape\": [4], \"data_offsets\": [0, 4]}}", 4,
                    "tensor w: unsupported dtype \"F8_E4M3\"");
    expect_raw_fail(tmp, "{\"w\": {\"dtype\": \"bf16\", \"shape\": [2], \"data_offsets\": [0, 4]}}", 4,
                    "unsupported dtype \"bf16\"");
    expect_raw_fail(tmp, "{\"w\": {\"dtype\": \"BOOL\", \"shape\": [4], \"data_offsets\": [0, 4]}}", 4,
                    "unsupported dtype \"BOOL\"");
    const char *bad_shapes[] = {"[-1]", "[2.5]", "[\"2\"]", "{}", "3", "[[1]]", "null", "[true]"};
    for (int i = 0; i < 8; i++) {
        char hdr[256];
        snprintf(hdr, sizeof hdr, "{\"w\": {\"dtype\": \"F32\", \"shape\": %s, \"data_offsets\": [0, 4]}}", bad_shapes[i]);
        expect_raw_fail(tmp, hdr, 8, "tensor w: shape");
    }
    expect_raw_fail(tmp, "{\"w\": {\"dtype\": \"F32\", \"data_offsets\": [0, 4]}}", 8, "tensor w: shape");
    expect_raw_fail(tmp, "{\"w\": {\"dtype\": \"F32\", \"shape\": [1,1,1,1,1], \"data_offsets\": [0, 4]}}", 8,
                    "5 dims");
    const char *bad_offs[] = {"[0]", "[0, 4, 8]", "[\"0\", \"4\"]", "[0, 4.0]", "4", "null", "[]"};
    for (int i = 0; i < 7; i++) {
        char hdr[256];
        snprintf(hdr, sizeof hdr, "{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": %s}}", bad_offs[i]);
        expect_raw_fail(tmp, hdr, 8, "data_offsets is not a list of two integers");
    }
    expect_raw_fail(tmp, "{\"w\": {\"dtype\": \"F32\", \"shape\": [1]}}", 8, "data_offsets");
    expect_raw_fail(tmp, "{\"w\": {\"dtype\": \"F32\", \"shape\": [0], \"data_offsets\": [4, 0]}}", 8,
                    "bad data_offsets [4, 0]");
    expect_raw_fail(tmp, "{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [-4, 0]}}", 8,
                    "bad data_offsets");
    /* Offsets outside the data block. */
    expect_raw_fail(tmp, "{\"w\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0, 16]}}", 12,
                    "past the end of the data block");
    expect_raw_fail(tmp, "{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [9223372036854775803, 9223372036854775807]}}",
                    12, "past the end of the data block");
    expect_raw_fail(tmp, "{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 99999999999999999999]}}",
                    12, "bad JSON"); /* integer overflow in the JSON itself */
    /* Size mismatch, incl. overflow of the byte size. */
    expect_raw_fail(tmp, "{\"w\": {\"dtype\": \"F32\", \"shape\": [3], \"data_offsets\": [0, 16]}}", 16,
                    "tensor w: size mismatch");
    expect_raw_fail(tmp, "{\"w\": {\"dtype\": \"BF16\", \"shape\": [2, 3], \"data_offsets\": [0, 16]}}", 16,
                    "size mismatch");
    expect_raw_fail(tmp, "{\"w\": {\"dtype\": \"F64\", \"shape\": [4294967296, 4294967296], \"data_offsets\": [0, 0]}}",
                    16, "too large");
    expect_raw_fail(tmp, "{\"w\": {\"dtype\": \"I64\", \"shape\": [2305843009213693952], \"data_offsets\": [0, 0]}}",
                    16, "too large");
    expect_raw_fail(tmp, "{\"w\": {\"dtype\": \"I32\", \"shape\": [1152921504606846976, 2], \"data_offsets\": [0, 0]}}",
                    16, "too large");
    /* Overlaps. */
    expect_raw_fail(tmp, "{\"a\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0, 16]},"
                         " \"b\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [12, 20]}}", 32,
                    "tensors a and b overlap");
    expect_raw_fail(tmp, "{\"b\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [4, 12]},"
                         " \"a\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0, 16]}}", 32, "overlap");
    expect_raw_fail(tmp, "{\"a\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [8, 24]},"
                         " \"b\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [8, 24]}}", 32, "overlap");
    /* Duplicate names. */
    expect_raw_fail(tmp, "{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]},"
                         " \"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]}}", 8, "duplicate");
    /* Metadata. */
    expect_raw_fail(tmp, "{\"__metadata__\": {\"a\": 1}}", 0, "metadata value of \"a\" is not a string");
    expect_raw_fail(tmp, "{\"__metadata__\": {\"a\": \"x\", \"b\": null}}", 0, "metadata value of \"b\"");
    expect_raw_fail(tmp, "{\"__metadata__\": [\"a\"]}", 0, "__metadata__ is not an object");
    /* Valid corner cases: empty tensors, zero-size at the end, gaps, trailing bytes, extra keys. */
    {
        char *ok = path_join(tmp, "ok.safetensors");
        write_raw_st(ok, "{\"e\": {\"dtype\": \"F32\", \"shape\": [0, 3], \"data_offsets\": [12, 12]},"
                         " \"s\": {\"dtype\": \"I64\", \"shape\": [], \"data_offsets\": [16, 24]},"
                         " \"z\": {\"dtype\": \"F16\", \"shape\": [0], \"data_offsets\": [24, 24]},"
                         " \"a\": {\"dtype\": \"F32\", \"shape\": [3], \"data_offsets\": [0, 12], \"extra\": 1},"
                         " \"__metadata__\": {}}    ", 30);
        kd_err e;
        kd_st_file *f = kd_st_open(ok, &e);
        ck_assert_msg(f != NULL, "%s", e.msg);
        ck_assert_uint_eq(f->n_entries, 4);
        ck_assert_str_eq(f->entries[0].name, "a");
        ck_assert_str_eq(f->entries[3].name, "z");
        ck_assert_int_eq(kd_st_find(f, "s")->t.ndim, 0);
        ck_assert_int_eq(kd_tensor_numel(&kd_st_find(f, "s")->t), 1);
        kd_st_close(f);
        free(ok);
    }
    free(p);
    kd_test_rmtree(tmp);
    free(tmp);
}
END_TEST

/* A small valid file (written by the writer) and its bytes. */
static unsigned char *small_file(const char *path, size_t *len) {
    kd_st_writer *w = kd_st_writer_new();
    kd_err err;
    int64_t s1[2] = {3, 5}, s2[1] = {7}, s3[3] = {2, 1, 3};
    unsigned char data[256];
    for (int i = 0; i < 256; i++) data[i] = (unsigned char)(i * 37 + 11);
    ck_assert(kd_st_writer_add(w, "model.a.weight", KD_BF16, 2, s1, data, &err) == 0);
    ck_assert(kd_st_writer_add(w, "model.b", KD_F32, 1, s2, data, &err) == 0);
    ck_assert(kd_st_writer_add(w, "model.c", KD_F16, 3, s3, data, &err) == 0);
    ck_assert(kd_st_writer_add(w, "model.d", KD_I64, 1, s2, data, &err) == 0);
    ck_assert(kd_st_writer_meta(w, "format", "pt", &err) == 0);
    ck_assert_msg(kd_st_writer_write(w, path, &err) == 0, "%s", err.msg);
    kd_st_writer_free(w);
    return read_bytes(path, len);
}

START_TEST(truncated_files) {
    char *tmp = kd_test_tmpdir();
    char *src = path_join(tmp, "src.safetensors"), *p = path_join(tmp, "cut.safetensors");
    size_t len;
    unsigned char *full = small_file(src, &len);
    uint64_t hlen;
    memcpy(&hlen, full, 8);
    kd_err err;
    kd_st_file *f = kd_st_open(src, &err);
    ck_assert_msg(f != NULL, "%s", err.msg);
    kd_st_close(f);
    /* Every cut through the length field, the header and the first data bytes. */
    size_t upto = 8 + (size_t)hlen + 16;
    ck_assert_uint_lt(upto, len);
    for (size_t cut = 0; cut <= upto; cut++) {
        write_bytes(p, full, cut);
        kd_err e = {{0}};
        f = kd_st_open(p, &e);
        ck_assert_msg(f == NULL, "cut at %zu of %zu opened", cut, len);
        ck_assert_msg(strncmp(e.msg, p, strlen(p)) == 0 && e.msg[strlen(p)] == ':', "message: %s", e.msg);
        if (cut < 8) EXPECT_MSG(e.msg, "too short");
        else if (cut < 8 + hlen) EXPECT_MSG(e.msg, "past the end of the file");
        else EXPECT_MSG(e.msg, "past the end of the data block");
    }
    /* Random cuts anywhere. */
    kd_test_rng r;
    kd_test_rng_init(&r, kd_test_seed() ^ 0x1234);
    for (int i = 0; i < 100; i++) {
        size_t cut = (size_t)(kd_test_rng_u64(&r) % len);
        write_bytes(p, full, cut);
        f = kd_st_open(p, &err);
        ck_assert_msg(f == NULL, "cut at %zu of %zu opened", cut, len);
    }
    /* The full file still opens from the same path. */
    write_bytes(p, full, len);
    f = kd_st_open(p, &err);
    ck_assert_msg(f != NULL, "%s", err.msg);
    kd_st_close(f);
    free(full);
    free(src);
    free(p);
    kd_test_rmtree(tmp);
    free(tmp);
}
END_TEST

/* Random byte flips of a header: either a clean error or a file whose every entry is valid. */
START_TEST(fuzz_header) {
    char *tmp = kd_test_tmpdir();
    char *src = path_join(tmp, "src.safetensors"), *p = path_join(tmp, "fuzz.safetensors");
    size_t len;
    unsigned char *full = small_file(src, &len), *buf = malloc(len);
    uint64_t hlen;
    memcpy(&hlen, full, 8);
    kd_test_rng seeder;
    kd_test_rng_init(&seeder, kd_test_seed() ^ 0xf00d);
    static const char special[] = "{}[]\",:-.0123456789eE \\ntfu";
    int opened = 0;
    for (int iter = 0; iter < 400; iter++) {
        uint64_t seed = kd_test_rng_u64(&seeder);
        kd_test_rng r;
        kd_test_rng_init(&r, seed);
        memcpy(buf, full, len);
        int nflip = 1 + (int)(kd_test_rng_u64(&r) % 4);
        for (int k = 0; k < nflip; k++) {
            uint64_t what = kd_test_rng_u64(&r) % 16;
            size_t pos = what == 0 ? (size_t)(kd_test_rng_u64(&r) % 8) /* length field */
                                   : 8 + (size_t)(kd_test_rng_u64(&r) % hlen);
            if (what < 6) buf[pos] ^= (unsigned char)(1u << (kd_test_rng_u64(&r) % 8));
            else if (what < 12) buf[pos] = (unsigned char)special[kd_test_rng_u64(&r) % (sizeof special - 1)];
            else buf[pos] = (unsigned char)kd_test_rng_u64(&r);
        }
        write_bytes(p, buf, len);
        kd_err e = {{0}};
        kd_st_file *f = kd_st_open(p, &e);
        if (!f) {
            ck_assert_msg(strncmp(e.msg, p, strlen(p)) == 0 && strlen(e.msg) > strlen(p) + 2,
                          "iteration seed %llu: bad message \"%s\"", (unsigned long long)seed, e.msg);
            continue;
        }
        opened++;
        const unsigned char *lo = (const unsigned char *)f->map, *hi = lo + f->map_len;
        uint64_t fh;
        memcpy(&fh, f->map, 8);
        for (size_t i = 0; i < f->n_entries; i++) {
            const kd_st_entry *e2 = &f->entries[i];
            if (i) ck_assert(strcmp(f->entries[i - 1].name, e2->name) < 0);
            ck_assert_ptr_eq(kd_st_find(f, e2->name), e2);
            ck_assert_uint_eq(e2->nbytes, (uint64_t)kd_tensor_numel(&e2->t) * kd_dtype_size(e2->t.dtype));
            const unsigned char *d = e2->t.data;
            ck_assert_msg(d >= lo + 8 + fh && d + e2->nbytes <= hi, "iteration seed %llu: %s outside the file",
                          (unsigned long long)seed, e2->name);
            volatile unsigned char sink = 0;
            for (uint64_t b = 0; b < e2->nbytes; b++) sink ^= d[b];
            (void)sink;
        }
        kd_st_close(f);
    }
    ck_assert_int_lt(opened, 400); /* the flips did break things */
    free(buf);
    free(full);
    free(src);
    free(p);
    kd_test_rmtree(tmp);
    free(tmp);
}
END_TEST

/* A broken file inside a model directory: the model error names the file. */
START_TEST(model_bad_file) {
    char *tmp = kd_test_tmpdir();
    kd_config c = base_config();
    gen_opts o = {.seed = 4, .n_shards = 2};
    char *dir = path_join(tmp, "m");
    gen_model(dir, &c, &o);
    char *shard = path_join(dir, "model-00002-of-00002.safetensors");
    size_t len;
    unsigned char *b = read_bytes(shard, &len);
    write_bytes(shard, b, len - 1);
    expect_model_fail(dir, "model-00002-of-00002.safetensors: tensor", "past the end of the data block");
    b[8] = '[';
    write_bytes(shard, b, len);
    expect_model_fail(dir, "model-00002-of-00002.safetensors: bad JSON", NULL);
    free(b);
    free(shard);
    free(dir);
    kd_test_rmtree(tmp);
    free(tmp);
}
END_TEST

int main(void) {
    Suite *s = suite_create("loader");
    TCase *tc = tcase_create("oracle");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, oracle_tiny);
    tcase_add_test(tc, oracle_small);
    tcase_add_test(tc, oracle_resharded);
    suite_add_tcase(s, tc);
    tc = tcase_create("safetensors");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, roundtrip_random);
    tcase_add_test(tc, fill_chunks);
    tcase_add_test(tc, mixed_dtypes_exact);
    tcase_add_test(tc, writer_errors);
    tcase_add_test(tc, malformed_headers);
    tcase_add_test(tc, truncated_files);
    tcase_add_test(tc, fuzz_header);
    suite_add_tcase(s, tc);
    tc = tcase_create("model");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, config_defaults);
    tcase_add_test(tc, config_errors);
    tcase_add_test(tc, generated_variants);
    tcase_add_test(tc, model_errors);
    tcase_add_test(tc, model_int64_tensor);
    tcase_add_test(tc, model_bad_file);
    suite_add_tcase(s, tc);
    return kd_test_run_suite(s);
}
