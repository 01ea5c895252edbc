/* model.c: loads a Hugging Face KDA checkpoint directory (KDA.md §1): config.json into a
 * kd_config, the (possibly sharded) safetensors files into kd_tensor views with their names,
 * shapes and dtypes checked. */
#define _GNU_SOURCE
#include "model.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <xxhash.h>

/* config.json and the index are small; anything bigger is not a checkpoint. */
#define KD_MAX_JSON_FILE (256u << 20)

/* ---- config.json ---- */

static int is_null(const json_t *v) { return v == NULL || json_is_null(v); }

/* An int32 field; integral floats (128.0) are accepted, other types are errors. */
static int get_int(json_t *root, const char *what, const char *key, int required, int32_t def,
                   int32_t *out, kd_err *err) {
    json_t *v = json_object_get(root, key);
    if (is_null(v)) {
        if (required) return kd_fail(err, "%s: missing required field %s", what, key);
        *out = def;
        return 0;
    }
    double d;
    if (json_is_integer(v)) d = (double)json_integer_value(v);
    else if (json_is_real(v)) d = json_real_value(v);
    else return kd_fail(err, "%s: %s must be an integer", what, key);
    if (d != floor(d)) return kd_fail(err, "%s: %s = %g must be an integer", what, key, d);
    if (d < INT32_MIN || d > INT32_MAX) return kd_fail(err, "%s: %s = %g is out of range", what, key, d);
    *out = (int32_t)d;
    return 0;
}

static int get_real(json_t *root, const char *what, const char *key, double def, double *out, kd_err *err) {
    json_t *v = json_object_get(root, key);
    if (is_null(v)) {
        *out = def;
        return 0;
    }
    if (!json_is_number(v)) return kd_fail(err, "%s: %s must be a number", what, key);
    *out = json_number_value(v);
    return 0;
}

static int get_bool(json_t *root, const char *what, const char *key, int def, int32_t *out, kd_err *err) {
    json_t *v = json_object_get(root, key);
    if (is_null(v)) {
        *out = def;
        return 0;
    }
    if (!json_is_boolean(v)) return kd_fail(err, "%s: %s must be true or false", what, key);
    *out = json_is_true(v);
    return 0;
}

static int parse_config(json_t *root, const char *what, kd_config *c, int32_t *eos, int32_t *bos, kd_err *err) {
    if (!json_is_object(root)) return kd_fail(err, "%s: config is not a JSON object", what);
    json_t *mt = json_object_get(root, "model_type");
    if (!json_is_string(mt))
        return kd_fail(err, "%s: unsupported model_type (missing or not a string; expected \"kda\")", what);
    if (strcmp(json_string_value(mt), "kda") != 0)
        return kd_fail(err, "%s: unsupported model_type \"%s\" (expected \"kda\")", what, json_string_value(mt));

    /* Features this loader does not implement. */
    if (!is_null(json_object_get(root, "attn")))
        return kd_fail(err, "%s: softmax attention layers not supported (attn is not null)", what);
    json_t *act = json_object_get(root, "hidden_act");
    if (!is_null(act)) {
        if (!json_is_string(act)) return kd_fail(err, "%s: hidden_act must be a string", what);
        const char *a = json_string_value(act);
        if (strcmp(a, "swish") != 0 && strcmp(a, "silu") != 0)
            return kd_fail(err, "%s: hidden_act \"%s\" not supported (only swish/silu)", what, a);
    }
    int32_t flag;
    if (get_bool(root, what, "use_l2warp", 0, &flag, err) != 0) return -1;
    if (flag) return kd_fail(err, "%s: use_l2warp not supported", what);
    if (get_bool(root, what, "safe_gate", 0, &flag, err) != 0) return -1;
    if (flag) return kd_fail(err, "%s: safe_gate not supported", what);
    if (!is_null(json_object_get(root, "attnres_block_size")))
        return kd_fail(err, "%s: attnres_block_size not supported (must be null)", what);

    memset(c, 0, sizeof *c);
    if (get_int(root, what, "hidden_size", 1, 0, &c->hidden, err) != 0 ||
        get_int(root, what, "num_hidden_layers", 1, 0, &c->n_layers, err) != 0 ||
        get_int(root, what, "num_heads", 1, 0, &c->n_heads, err) != 0 ||
        get_int(root, what, "head_dim", 1, 0, &c->head_k, err) != 0 ||
        get_int(root, what, "vocab_size", 1, 0, &c->vocab, err) != 0 ||
        get_int(root, what, "num_v_heads", 0, c->n_heads, &c->n_v_heads, err) != 0 ||
        get_int(root, what, "conv_size", 0, 4, &c->conv_size, err) != 0 ||
        get_bool(root, what, "use_short_conv", 1, &c->use_short_conv, err) != 0 ||
        get_real(root, what, "norm_eps", 1e-6, &c->norm_eps, err) != 0 ||
        get_bool(root, what, "allow_neg_eigval", 0, &c->allow_neg_eigval, err) != 0 ||
        get_bool(root, what, "tie_word_embeddings", 0, &c->tie_embeddings, err) != 0 ||
        get_int(root, what, "eos_token_id", 0, -1, eos, err) != 0 ||
        get_int(root, what, "bos_token_id", 0, -1, bos, err) != 0)
        return -1;
    if (c->n_heads > 0 && c->n_v_heads % c->n_heads != 0)
        return kd_fail(err, "%s: num_v_heads %d is not a multiple of num_heads %d", what, c->n_v_heads,
                       c->n_heads);

    double expand_v = 1.0, hv;
    if (get_real(root, what, "expand_v", 1.0, &expand_v, err) != 0) return -1;
    hv = c->head_k * expand_v;
    if (hv != floor(hv) || hv < INT32_MIN || hv > INT32_MAX)
        return kd_fail(err, "%s: head_dim * expand_v = %d * %g is not an integer", what, c->head_k, expand_v);
    c->head_v = (int32_t)hv;

    if (is_null(json_object_get(root, "intermediate_size"))) {
        /* flash-linear-attention's GatedMLP: int(D * ratio * 2 / 3) rounded up to 256. */
        double ratio = 4.0;
        if (get_real(root, what, "hidden_ratio", 4.0, &ratio, err) != 0) return -1;
        double x = trunc((double)c->hidden * ratio * 2.0 / 3.0);
        if (!(x >= 0 && x <= INT32_MAX - 255))
            return kd_fail(err, "%s: intermediate size from hidden_ratio %g is out of range", what, ratio);
        c->intermediate = (int32_t)(((int64_t)x + 255) / 256 * 256);
    } else if (get_int(root, what, "intermediate_size", 1, 0, &c->intermediate, err) != 0) {
        return -1;
    }

    json_t *lb = json_object_get(root, "lower_bound");
    if (!is_null(lb)) {
        if (!json_is_number(lb)) return kd_fail(err, "%s: lower_bound must be a number or null", what);
        c->use_lower_bound = 1;
        c->lower_bound = json_number_value(lb);
    }

    kd_err cerr;
    if (kd_config_check(c, &cerr) != 0) return kd_fail(err, "%s: %s", what, cerr.msg);
    return 0;
}

int kd_config_parse_json(const char *text, size_t len, const char *what, kd_config *out,
                         int32_t *eos_token_id, int32_t *bos_token_id, kd_err *err) {
    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return kd_fail(err, "%s: bad JSON: %s (line %d, column %d)", what, jerr.text, jerr.line, jerr.column);
    int32_t eos, bos;
    kd_config c;
    int rc = parse_config(root, what, &c, &eos, &bos, err);
    json_decref(root);
    if (rc != 0) return -1;
    *out = c;
    if (eos_token_id) *eos_token_id = eos;
    if (bos_token_id) *bos_token_id = bos;
    return 0;
}

/* ---- files ---- */

static char *join_path(const char *dir, const char *name) {
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') n--;
    char *p = malloc(n + strlen(name) + 2);
    if (p) sprintf(p, "%.*s/%s", (int)n, dir, name);
    return p;
}

static int file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

static char *read_text(const char *path, size_t *len, kd_err *err) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        kd_fail(err, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    char *buf = NULL;
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size > KD_MAX_JSON_FILE) {
        kd_fail(err, "%s: not a regular file of reasonable size", path);
        goto done;
    }
    if (!(buf = malloc((size_t)st.st_size + 1))) {
        kd_fail(err, "%s: out of memory", path);
        goto done;
    }
    *len = fread(buf, 1, (size_t)st.st_size, f);
    if (*len != (size_t)st.st_size) {
        kd_fail(err, "%s: read error", path);
        free(buf);
        buf = NULL;
        goto done;
    }
    buf[*len] = 0;
done:
    fclose(f);
    return buf;
}

/* One tensor of the checkpoint, wherever it lives. */
typedef struct tensor_ref {
    const char *name;
    const kd_st_file *file;
    const kd_st_entry *e;
    int used;
} tensor_ref;

typedef struct loader {
    kd_model *m;
    const char *src;  /* names the checkpoint in "missing tensor" errors */
    tensor_ref *refs; /* sorted by name */
    size_t n_refs;
    kd_err *err;
} loader;

static int cmp_ref(const void *a, const void *b) {
    return strcmp(((const tensor_ref *)a)->name, ((const tensor_ref *)b)->name);
}

static tensor_ref *find_ref(loader *ld, const char *name) {
    tensor_ref key = {.name = name};
    return bsearch(&key, ld->refs, ld->n_refs, sizeof key, cmp_ref);
}

static void format_shape(char *buf, size_t len, int ndim, const int64_t *shape) {
    size_t o = (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < ndim && o < len; i++)
        o += (size_t)snprintf(buf + o, len - o, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (o < len) snprintf(buf + o, len - o, "]");
}

static int bind(loader *ld, const char *name, kd_tensor *dst, int ndim, const int64_t *shape) {
    tensor_ref *r = find_ref(ld, name);
    if (!r) return kd_fail(ld->err, "%s: missing tensor %s", ld->src, name);
    r->used = 1;
    const kd_tensor *t = &r->e->t;
    if (t->dtype != KD_BF16 && t->dtype != KD_F16 && t->dtype != KD_F32 && t->dtype != KD_F64)
        return kd_fail(ld->err, "%s: %s has dtype %s, expected BF16, F16, F32 or F64", r->file->path, name,
                       kd_dtype_name(t->dtype));
    int same = t->ndim == ndim;
    for (int i = 0; same && i < ndim; i++) same = t->shape[i] == shape[i];
    if (!same) {
        char got[128], want[128];
        format_shape(got, sizeof got, t->ndim, t->shape);
        format_shape(want, sizeof want, ndim, shape);
        return kd_fail(ld->err, "%s: %s has shape %s, expected %s", r->file->path, name, got, want);
    }
    *dst = *t;
    return 0;
}

#define BIND(name, dst, ...)                                                                       \
    do {                                                                                           \
        const int64_t *shape_ = (const int64_t[]){__VA_ARGS__};                                    \
        if (bind(ld, name, dst, (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), shape_)) \
            return -1;                                                                             \
    } while (0)

static int bind_layer(loader *ld, int i, kd_layer_tensors *lt) {
    const kd_config *c = &ld->m->config;
    int64_t D = c->hidden, QK = kd_config_qk_dim(c), VD = kd_config_v_dim(c), HV = c->n_v_heads,
            K = c->head_k, V = c->head_v, I = c->intermediate, W = c->conv_size;
    char n[128];
#define LAYER(suffix) (snprintf(n, sizeof n, "model.layers.%d.%s", i, suffix), n)
    BIND(LAYER("attn_norm.weight"), &lt->attn_norm, D);
    BIND(LAYER("attn.q_proj.weight"), &lt->q_proj, QK, D);
    BIND(LAYER("attn.k_proj.weight"), &lt->k_proj, QK, D);
    BIND(LAYER("attn.v_proj.weight"), &lt->v_proj, VD, D);
    if (c->use_short_conv) {
        BIND(LAYER("attn.q_conv1d.weight"), &lt->q_conv, QK, 1, W);
        BIND(LAYER("attn.k_conv1d.weight"), &lt->k_conv, QK, 1, W);
        BIND(LAYER("attn.v_conv1d.weight"), &lt->v_conv, VD, 1, W);
    }
    BIND(LAYER("attn.f_proj.0.weight"), &lt->f_proj0, V, D);
    BIND(LAYER("attn.f_proj.1.weight"), &lt->f_proj1, HV * K, V);
    BIND(LAYER("attn.b_proj.weight"), &lt->b_proj, HV, D);
    BIND(LAYER("attn.A_log"), &lt->A_log, HV);
    BIND(LAYER("attn.dt_bias"), &lt->dt_bias, HV * K);
    BIND(LAYER("attn.g_proj.0.weight"), &lt->g_proj0, V, D);
    BIND(LAYER("attn.g_proj.1.weight"), &lt->g_proj1, VD, V);
    BIND(LAYER("attn.g_proj.1.bias"), &lt->g_proj1_bias, VD);
    BIND(LAYER("attn.o_norm.weight"), &lt->o_norm, V);
    BIND(LAYER("attn.o_proj.weight"), &lt->o_proj, D, VD);
    BIND(LAYER("mlp_norm.weight"), &lt->mlp_norm, D);
    BIND(LAYER("mlp.gate_proj.weight"), &lt->gate_proj, I, D);
    BIND(LAYER("mlp.up_proj.weight"), &lt->up_proj, I, D);
    BIND(LAYER("mlp.down_proj.weight"), &lt->down_proj, D, I);
#undef LAYER
    return 0;
}

static int bind_all(loader *ld) {
    kd_model *m = ld->m;
    const kd_config *c = &m->config;
    kd_model_tensors *t = &m->tensors;
    if (!(t->layers = calloc((size_t)c->n_layers, sizeof *t->layers)))
        return kd_fail(ld->err, "%s: out of memory", m->dir);
    t->n_layers = c->n_layers;
    BIND("model.embeddings.weight", &t->embed, c->vocab, c->hidden);
    BIND("model.norm.weight", &t->final_norm, c->hidden);
    if (c->tie_embeddings) {
        tensor_ref *r = find_ref(ld, "lm_head.weight");
        if (r) r->used = 1; /* ignored: the head is the embeddings */
    } else {
        BIND("lm_head.weight", &t->lm_head, c->vocab, c->hidden);
    }
    for (int i = 0; i < c->n_layers; i++)
        if (bind_layer(ld, i, &t->layers[i]) != 0) return -1;
    for (size_t i = 0; i < ld->n_refs; i++)
        if (!ld->refs[i].used)
            return kd_fail(ld->err, "%s: unexpected tensor %s", ld->refs[i].file->path, ld->refs[i].name);
    return 0;
}

static int add_file(kd_model *m, kd_st_file *f) {
    kd_st_file **p = realloc(m->files, (m->n_files + 1) * sizeof *p);
    if (!p) return -1;
    m->files = p;
    m->files[m->n_files++] = f;
    return 0;
}

static int plain_file_name(const char *s) {
    return *s && !strchr(s, '/') && !strstr(s, "..") && strcmp(s, ".") != 0;
}

static int cmp_str_ptr(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Opens the shards named by the index and checks that index and shards agree exactly. */
static int open_sharded(kd_model *m, const char *index_path, kd_err *err) {
    size_t len = 0;
    char *text = read_text(index_path, &len, err);
    if (!text) return -1;
    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    free(text);
    if (!root)
        return kd_fail(err, "%s: bad JSON: %s (line %d, column %d)", index_path, jerr.text, jerr.line, jerr.column);
    int rc = -1;
    const char **shards = NULL;
    char *path = NULL;
    json_t *map = json_is_object(root) ? json_object_get(root, "weight_map") : NULL;
    if (!json_is_object(map)) {
        kd_fail(err, "%s: weight_map is missing or not an object", index_path);
        goto done;
    }
    size_t n = json_object_size(map), n_shards = 0;
    if (!(shards = malloc((n ? n : 1) * sizeof *shards))) {
        kd_fail(err, "%s: out of memory", index_path);
        goto done;
    }
    const char *name;
    json_t *v;
    json_object_foreach(map, name, v) {
        if (!json_is_string(v)) {
            kd_fail(err, "%s: weight_map entry %s is not a string", index_path, name);
            goto done;
        }
        if (!plain_file_name(json_string_value(v))) {
            kd_fail(err, "%s: shard name \"%s\" of %s is not a plain file name", index_path,
                    json_string_value(v), name);
            goto done;
        }
        shards[n_shards++] = json_string_value(v);
    }
    qsort(shards, n_shards, sizeof *shards, cmp_str_ptr);
    size_t u = 0;
    for (size_t i = 0; i < n_shards; i++)
        if (u == 0 || strcmp(shards[u - 1], shards[i]) != 0) shards[u++] = shards[i];
    n_shards = u;
    for (size_t i = 0; i < n_shards; i++) {
        free(path);
        if (!(path = join_path(m->dir, shards[i]))) {
            kd_fail(err, "%s: out of memory", index_path);
            goto done;
        }
        kd_st_file *f = kd_st_open(path, err);
        if (!f) goto done;
        if (add_file(m, f) != 0) {
            kd_st_close(f);
            kd_fail(err, "%s: out of memory", index_path);
            goto done;
        }
    }
    /* m->files[i] was opened from shards[i]. */
    json_object_foreach(map, name, v) {
        const char **s = bsearch(&(const char *){json_string_value(v)}, shards, n_shards, sizeof *shards, cmp_str_ptr);
        const kd_st_file *f = m->files[s - shards];
        if (!kd_st_find(f, name)) {
            kd_fail(err, "%s: tensor %s listed in the index is missing", f->path, name);
            goto done;
        }
    }
    for (size_t i = 0; i < m->n_files; i++) {
        const kd_st_file *f = m->files[i];
        for (size_t j = 0; j < f->n_entries; j++) {
            json_t *s = json_object_get(map, f->entries[j].name);
            if (!s) {
                kd_fail(err, "%s: tensor %s is not in the index", f->path, f->entries[j].name);
                goto done;
            }
            if (strcmp(json_string_value(s), shards[i]) != 0) {
                kd_fail(err, "%s: tensor %s is mapped to %s in the index", f->path, f->entries[j].name,
                        json_string_value(s));
                goto done;
            }
        }
    }
    rc = 0;
done:
    free(path);
    free(shards);
    json_decref(root);
    return rc;
}

/* The model fingerprint: the config that matters to the math and every tensor (name,
 * dtype, shape, bytes), in name order, through XXH3-64. Two workers agree on it exactly when
 * they compute the same function. */
static int fingerprint(kd_model *m, const loader *ld, kd_err *err) {
    XXH3_state_t *st = XXH3_createState();
    if (!st || XXH3_64bits_reset(st) != XXH_OK) {
        XXH3_freeState(st);
        return kd_fail(err, "%s: out of memory", m->dir);
    }
    const kd_config *c = &m->config;
    char buf[512];
    int n = snprintf(buf, sizeof buf, "kda:D=%d,L=%d,H=%d,HV=%d,K=%d,V=%d,W=%d,conv=%d,I=%d,vocab=%d,"
                     "eps=%.17g,lb=%d:%.17g,neg=%d,tie=%d", c->hidden, c->n_layers, c->n_heads,
                     c->n_v_heads, c->head_k, c->head_v, c->conv_size, c->use_short_conv,
                     c->intermediate, c->vocab, c->norm_eps, c->use_lower_bound, c->lower_bound,
                     c->allow_neg_eigval, c->tie_embeddings);
    XXH3_64bits_update(st, buf, (size_t)n);
    for (size_t i = 0; i < ld->n_refs; i++) {
        const kd_st_entry *e = ld->refs[i].e;
        XXH3_64bits_update(st, e->name, strlen(e->name) + 1);
        XXH3_64bits_update(st, &e->t.dtype, sizeof e->t.dtype);
        XXH3_64bits_update(st, e->t.shape, sizeof e->t.shape[0] * (size_t)e->t.ndim);
        XXH3_64bits_update(st, e->t.data, (size_t)e->nbytes);
    }
    m->fingerprint = XXH3_64bits_digest(st);
    XXH3_freeState(st);
    return 0;
}

kd_model *kd_model_open(const char *dir, kd_err *err) {
    kd_model *m = calloc(1, sizeof *m);
    char *cfg_path = NULL, *st_path = NULL, *idx_path = NULL, *text = NULL;
    loader ld = {.m = m, .err = err};
    if (!m || !(m->dir = strdup(dir)) || !(cfg_path = join_path(dir, "config.json")) ||
        !(st_path = join_path(dir, "model.safetensors")) ||
        !(idx_path = join_path(dir, "model.safetensors.index.json"))) {
        kd_fail(err, "%s: out of memory", dir);
        goto fail;
    }
    size_t len = 0;
    if (!(text = read_text(cfg_path, &len, err))) goto fail;
    if (kd_config_parse_json(text, len, cfg_path, &m->config, &m->eos_token_id, &m->bos_token_id, err) != 0)
        goto fail;

    if (file_exists(st_path)) {
        kd_st_file *f = kd_st_open(st_path, err);
        if (!f) goto fail;
        if (add_file(m, f) != 0) {
            kd_st_close(f);
            kd_fail(err, "%s: out of memory", dir);
            goto fail;
        }
        ld.src = st_path;
    } else if (file_exists(idx_path)) {
        if (open_sharded(m, idx_path, err) != 0) goto fail;
        ld.src = idx_path;
    } else {
        kd_fail(err, "%s: no model.safetensors or model.safetensors.index.json", dir);
        goto fail;
    }

    for (size_t i = 0; i < m->n_files; i++) ld.n_refs += m->files[i]->n_entries;
    if (!(ld.refs = calloc(ld.n_refs ? ld.n_refs : 1, sizeof *ld.refs))) {
        kd_fail(err, "%s: out of memory", dir);
        goto fail;
    }
    size_t k = 0;
    for (size_t i = 0; i < m->n_files; i++)
        for (size_t j = 0; j < m->files[i]->n_entries; j++)
            ld.refs[k++] = (tensor_ref){m->files[i]->entries[j].name, m->files[i], &m->files[i]->entries[j], 0};
    qsort(ld.refs, ld.n_refs, sizeof *ld.refs, cmp_ref);
    for (size_t i = 1; i < ld.n_refs; i++)
        if (strcmp(ld.refs[i - 1].name, ld.refs[i].name) == 0) {
            kd_fail(err, "%s: tensor %s appears in %s and %s", dir, ld.refs[i].name, ld.refs[i - 1].file->path,
                    ld.refs[i].file->path);
            goto fail;
        }
    if (bind_all(&ld) != 0) goto fail;
    if (fingerprint(m, &ld, err)) goto fail;
    free(ld.refs);
    free(text);
    free(cfg_path);
    free(st_path);
    free(idx_path);
    return m;
fail:
    free(ld.refs);
    free(text);
    free(cfg_path);
    free(st_path);
    free(idx_path);
    kd_model_close(m);
    return NULL;
}

void kd_model_close(kd_model *m) {
    if (!m) return;
    for (size_t i = 0; i < m->n_files; i++) kd_st_close(m->files[i]);
    free(m->files);
    free(m->tensors.layers);
    free(m->dir);
    free(m);
}
