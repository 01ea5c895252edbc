/* safetensors.c: safetensors reader (mmap, full validation of the untrusted header) and
 * writer (aligned tensors, streamed fill callbacks, atomic temp file + rename). */
#define _GNU_SOURCE
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c assumes a little-endian host"
#endif

/* Far above any real header (a few MB for thousands of tensors). */
#define KD_ST_MAX_HEADER (100u << 20)
/* Largest piece handed to a fill callback. */
#define KD_ST_FILL_CHUNK (4u << 20)

static int dtype_from_name(const char *s, kd_dtype *out) {
    for (int t = 0; t < KD_DTYPE_COUNT; t++)
        if (strcmp(s, kd_dtype_name((kd_dtype)t)) == 0) {
            *out = (kd_dtype)t;
            return 0;
        }
    return -1;
}

/* Byte size of shape x dtype; -1 on overflow (result must fit int64). */
static int shape_bytes(int ndim, const int64_t *shape, kd_dtype dt, uint64_t *out) {
    uint64_t n = kd_dtype_size(dt);
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0 || __builtin_mul_overflow(n, (uint64_t)shape[i], &n)) return -1;
    }
    if (n > (uint64_t)INT64_MAX) return -1;
    *out = n;
    return 0;
}

static void format_shape(char *buf, size_t len, int ndim, const int64_t *shape) {
    size_t o = (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < ndim && o < len; i++)
        o += (size_t)snprintf(buf + o, len - o, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (o < len) snprintf(buf + o, len - o, "]");
}

/* ---- reader ---- */

void kd_st_close(kd_st_file *f) {
    if (!f) return;
    for (size_t i = 0; i < f->n_entries; i++) free(f->entries[i].name);
    free(f->entries);
    for (size_t i = 0; i < f->n_meta; i++) {
        free(f->meta_keys[i]);
        free(f->meta_values[i]);
    }
    free(f->meta_keys);
    free(f->meta_values);
    if (f->map) munmap(f->map, f->map_len);
    free(f->path);
    free(f);
}

static int cmp_entry_name(const void *a, const void *b) {
    return strcmp(((const kd_st_entry *)a)->name, ((const kd_st_entry *)b)->name);
}

static int cmp_entry_offset(const void *a, const void *b) {
    const kd_st_entry *x = *(const kd_st_entry *const *)a, *y = *(const kd_st_entry *const *)b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

static int parse_metadata(kd_st_file *f, json_t *meta, kd_err *err) {
    if (!json_is_object(meta)) return kd_fail(err, "%s: __metadata__ is not an object", f->path);
    size_t n = json_object_size(meta);
    f->meta_keys = calloc(n ? n : 1, sizeof(char *));
    f->meta_values = calloc(n ? n : 1, sizeof(char *));
    if (!f->meta_keys || !f->meta_values) return kd_fail(err, "%s: out of memory", f->path);
    const char *key;
    json_t *val;
    json_object_foreach(meta, key, val) {
        if (!json_is_string(val))
            return kd_fail(err, "%s: metadata value of \"%s\" is not a string", f->path, key);
        f->meta_keys[f->n_meta] = strdup(key);
        f->meta_values[f->n_meta] = strdup(json_string_value(val));
        f->n_meta++;
        if (!f->meta_keys[f->n_meta - 1] || !f->meta_values[f->n_meta - 1])
            return kd_fail(err, "%s: out of memory", f->path);
    }
    return 0;
}

/* Validates one tensor entry and fills e (except name). */
static int parse_entry(const kd_st_file *f, const char *name, json_t *v, uint64_t data_len,
                       const unsigned char *data, kd_st_entry *e, kd_err *err) {
    const char *p = f->path;
    if (!json_is_object(v)) return kd_fail(err, "%s: tensor %s: entry is not an object", p, name);
    json_t *dt = json_object_get(v, "dtype"), *shape = json_object_get(v, "shape"),
           *offs = json_object_get(v, "data_offsets");
    if (!json_is_string(dt)) return kd_fail(err, "%s: tensor %s: dtype is missing or not a string", p, name);
    if (dtype_from_name(json_string_value(dt), &e->t.dtype) != 0)
        return kd_fail(err, "%s: tensor %s: unsupported dtype \"%s\"", p, name, json_string_value(dt));
    if (!json_is_array(shape)) return kd_fail(err, "%s: tensor %s: shape is missing or not a list", p, name);
    size_t nd = json_array_size(shape);
    if (nd > KD_MAX_DIMS)
        return kd_fail(err, "%s: tensor %s: shape has %zu dims, at most %d supported", p, name, nd,
                       KD_MAX_DIMS);
    e->t.ndim = (int32_t)nd;
    for (size_t i = 0; i < nd; i++) {
        json_t *d = json_array_get(shape, i);
        if (!json_is_integer(d) || json_integer_value(d) < 0)
            return kd_fail(err, "%s: tensor %s: shape is not a list of non-negative integers", p, name);
        e->t.shape[i] = json_integer_value(d);
    }
    if (!json_is_array(offs) || json_array_size(offs) != 2 || !json_is_integer(json_array_get(offs, 0)) ||
        !json_is_integer(json_array_get(offs, 1)))
        return kd_fail(err, "%s: tensor %s: data_offsets is not a list of two integers", p, name);
    json_int_t b = json_integer_value(json_array_get(offs, 0)), end = json_integer_value(json_array_get(offs, 1));
    if (b < 0 || end < b)
        return kd_fail(err, "%s: tensor %s: bad data_offsets [%lld, %lld]", p, name, (long long)b, (long long)end);
    uint64_t nbytes;
    char sh[160];
    format_shape(sh, sizeof sh, e->t.ndim, e->t.shape);
    if (shape_bytes(e->t.ndim, e->t.shape, e->t.dtype, &nbytes) != 0)
        return kd_fail(err, "%s: tensor %s: shape %s is too large", p, name, sh);
    if (nbytes != (uint64_t)(end - b))
        return kd_fail(err, "%s: tensor %s: size mismatch: shape %s of %s is %llu bytes, data_offsets [%lld, %lld] span %llu",
                       p, name, sh, kd_dtype_name(e->t.dtype), (unsigned long long)nbytes, (long long)b,
                       (long long)end, (unsigned long long)(end - b));
    if ((uint64_t)end > data_len)
        return kd_fail(err, "%s: tensor %s: data_offsets [%lld, %lld] past the end of the data block (%llu bytes)",
                       p, name, (long long)b, (long long)end, (unsigned long long)data_len);
    e->offset = (uint64_t)b;
    e->nbytes = nbytes;
    e->t.data = data + b;
    return 0;
}

static int parse_header(kd_st_file *f, const char *text, size_t len, uint64_t data_len,
                        const unsigned char *data, kd_err *err) {
    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return kd_fail(err, "%s: bad JSON header: %s (line %d, column %d)", f->path, jerr.text,
                       jerr.line, jerr.column);
    int rc = -1;
    kd_st_entry **by_off = NULL;
    if (!json_is_object(root)) {
        kd_fail(err, "%s: header is not a JSON object", f->path);
        goto done;
    }
    size_t n = json_object_size(root);
    f->entries = calloc(n ? n : 1, sizeof(kd_st_entry));
    if (!f->entries) {
        kd_fail(err, "%s: out of memory", f->path);
        goto done;
    }
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        if (strcmp(key, "__metadata__") == 0) {
            if (parse_metadata(f, val, err) != 0) goto done;
            continue;
        }
        kd_st_entry *e = &f->entries[f->n_entries];
        if (parse_entry(f, key, val, data_len, data, e, err) != 0) goto done;
        if (!(e->name = strdup(key))) {
            kd_fail(err, "%s: out of memory", f->path);
            goto done;
        }
        f->n_entries++;
    }
    qsort(f->entries, f->n_entries, sizeof *f->entries, cmp_entry_name);
    for (size_t i = 1; i < f->n_entries; i++)
        if (strcmp(f->entries[i - 1].name, f->entries[i].name) == 0) {
            kd_fail(err, "%s: duplicate tensor name %s", f->path, f->entries[i].name);
            goto done;
        }
    /* Overlaps: sort non-empty tensors by offset, each must start at or after the
     * previous end. */
    by_off = malloc((f->n_entries ? f->n_entries : 1) * sizeof *by_off);
    if (!by_off) {
        kd_fail(err, "%s: out of memory", f->path);
        goto done;
    }
    size_t m = 0;
    for (size_t i = 0; i < f->n_entries; i++)
        if (f->entries[i].nbytes) by_off[m++] = &f->entries[i];
    qsort(by_off, m, sizeof *by_off, cmp_entry_offset);
    for (size_t i = 1; i < m; i++)
        if (by_off[i]->offset < by_off[i - 1]->offset + by_off[i - 1]->nbytes) {
            kd_fail(err, "%s: tensors %s and %s overlap", f->path, by_off[i - 1]->name, by_off[i]->name);
            goto done;
        }
    rc = 0;
done:
    free(by_off);
    json_decref(root);
    return rc;
}

kd_st_file *kd_st_open(const char *path, kd_err *err) {
    kd_st_file *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(path))) {
        free(f);
        kd_fail(err, "%s: out of memory", path);
        return NULL;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        kd_fail(err, "%s: cannot open: %s", path, strerror(errno));
        goto fail;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        kd_fail(err, "%s: not a regular file", path);
        close(fd);
        goto fail;
    }
    uint64_t size = (uint64_t)st.st_size;
    if (size < 8) {
        kd_fail(err, "%s: file is too short (%llu bytes) for a safetensors header", path,
                (unsigned long long)size);
        close(fd);
        goto fail;
    }
    void *map = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) {
        kd_fail(err, "%s: mmap failed: %s", path, strerror(errno));
        goto fail;
    }
    f->map = map;
    f->map_len = (size_t)size;
    uint64_t hlen;
    memcpy(&hlen, map, 8);
    if (hlen > KD_ST_MAX_HEADER) {
        kd_fail(err, "%s: header length %llu is too large", path, (unsigned long long)hlen);
        goto fail;
    }
    if (hlen > size - 8) {
        kd_fail(err, "%s: header length %llu is past the end of the file (%llu bytes)", path,
                (unsigned long long)hlen, (unsigned long long)size);
        goto fail;
    }
    const unsigned char *base = map;
    if (parse_header(f, (const char *)base + 8, (size_t)hlen, size - 8 - hlen, base + 8 + hlen, err) != 0)
        goto fail;
    return f;
fail:
    kd_st_close(f);
    return NULL;
}

const kd_st_entry *kd_st_find(const kd_st_file *f, const char *name) {
    size_t lo = 0, hi = f->n_entries;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(name, f->entries[mid].name);
        if (c == 0) return &f->entries[mid];
        if (c < 0) hi = mid;
        else lo = mid + 1;
    }
    return NULL;
}

const char *kd_st_meta(const kd_st_file *f, const char *key) {
    for (size_t i = 0; i < f->n_meta; i++)
        if (strcmp(f->meta_keys[i], key) == 0) return f->meta_values[i];
    return NULL;
}

/* ---- writer ---- */

typedef struct st_item {
    char *name;
    kd_dtype dtype;
    int ndim;
    int64_t shape[KD_MAX_DIMS];
    uint64_t nbytes;
    void *data;          /* owned copy, or NULL when fill is set */
    kd_st_fill_fn fill;
    void *ctx;
} st_item;

struct kd_st_writer {
    size_t n, cap;
    st_item *items;
    size_t n_meta;
    char **meta_keys, **meta_values;
};

kd_st_writer *kd_st_writer_new(void) { return calloc(1, sizeof(kd_st_writer)); }

void kd_st_writer_free(kd_st_writer *w) {
    if (!w) return;
    for (size_t i = 0; i < w->n; i++) {
        free(w->items[i].name);
        free(w->items[i].data);
    }
    free(w->items);
    for (size_t i = 0; i < w->n_meta; i++) {
        free(w->meta_keys[i]);
        free(w->meta_values[i]);
    }
    free(w->meta_keys);
    free(w->meta_values);
    free(w);
}

/* jansson keeps only valid UTF-8 strings. */
static int valid_utf8(const char *s) {
    json_t *j = json_string(s);
    json_decref(j);
    return j != NULL;
}

/* Appends a tensor without data; the caller sets data or fill. */
static st_item *add_item(kd_st_writer *w, const char *name, kd_dtype dtype, int ndim, const int64_t *shape,
                         kd_err *err) {
    if (!name || !*name || !valid_utf8(name)) {
        kd_fail(err, "safetensors writer: bad tensor name");
        return NULL;
    }
    if (strcmp(name, "__metadata__") == 0) {
        kd_fail(err, "safetensors writer: __metadata__ is not a tensor name");
        return NULL;
    }
    if ((int)dtype < 0 || dtype >= KD_DTYPE_COUNT) {
        kd_fail(err, "safetensors writer: %s: bad dtype %d", name, (int)dtype);
        return NULL;
    }
    if (ndim < 0 || ndim > KD_MAX_DIMS) {
        kd_fail(err, "safetensors writer: %s: %d dims, at most %d supported", name, ndim, KD_MAX_DIMS);
        return NULL;
    }
    uint64_t nbytes;
    if (shape_bytes(ndim, shape, dtype, &nbytes) != 0 || nbytes > SIZE_MAX) {
        kd_fail(err, "safetensors writer: %s: bad or too large shape", name);
        return NULL;
    }
    if (w->n == w->cap) {
        size_t cap = w->cap ? 2 * w->cap : 64;
        st_item *p = realloc(w->items, cap * sizeof *p);
        if (!p) {
            kd_fail(err, "safetensors writer: out of memory");
            return NULL;
        }
        w->items = p, w->cap = cap;
    }
    st_item *it = &w->items[w->n];
    memset(it, 0, sizeof *it);
    it->dtype = dtype, it->ndim = ndim, it->nbytes = nbytes;
    if (ndim) memcpy(it->shape, shape, (size_t)ndim * sizeof *shape);
    if (!(it->name = strdup(name))) {
        kd_fail(err, "safetensors writer: out of memory");
        return NULL;
    }
    w->n++;
    return it;
}

int kd_st_writer_add(kd_st_writer *w, const char *name, kd_dtype dtype, int ndim,
                     const int64_t *shape, const void *data, kd_err *err) {
    st_item *it = add_item(w, name, dtype, ndim, shape, err);
    if (!it) return -1;
    if (!it->nbytes) return 0;
    if (!data || !(it->data = malloc((size_t)it->nbytes))) {
        free(it->name);
        w->n--;
        return kd_fail(err, "safetensors writer: %s: %s", name, data ? "out of memory" : "no data");
    }
    memcpy(it->data, data, (size_t)it->nbytes);
    return 0;
}

int kd_st_writer_add_fill(kd_st_writer *w, const char *name, kd_dtype dtype, int ndim,
                          const int64_t *shape, kd_st_fill_fn fill, void *ctx, kd_err *err) {
    if (!fill) return kd_fail(err, "safetensors writer: %s: no fill callback", name ? name : "?");
    st_item *it = add_item(w, name, dtype, ndim, shape, err);
    if (!it) return -1;
    it->fill = fill, it->ctx = ctx;
    return 0;
}

int kd_st_writer_meta(kd_st_writer *w, const char *key, const char *value, kd_err *err) {
    if (!key || !value || !valid_utf8(key) || !valid_utf8(value))
        return kd_fail(err, "safetensors writer: bad metadata key or value");
    for (size_t i = 0; i < w->n_meta; i++)
        if (strcmp(w->meta_keys[i], key) == 0) {
            char *v = strdup(value);
            if (!v) return kd_fail(err, "safetensors writer: out of memory");
            free(w->meta_values[i]);
            w->meta_values[i] = v;
            return 0;
        }
    char **k = realloc(w->meta_keys, (w->n_meta + 1) * sizeof *k);
    if (!k) return kd_fail(err, "safetensors writer: out of memory");
    w->meta_keys = k;
    char **v = realloc(w->meta_values, (w->n_meta + 1) * sizeof *v);
    if (!v) return kd_fail(err, "safetensors writer: out of memory");
    w->meta_values = v;
    char *ks = strdup(key), *vs = strdup(value);
    if (!ks || !vs) {
        free(ks);
        free(vs);
        return kd_fail(err, "safetensors writer: out of memory");
    }
    w->meta_keys[w->n_meta] = ks;
    w->meta_values[w->n_meta] = vs;
    w->n_meta++;
    return 0;
}

static int write_all(int fd, const void *buf, size_t n) {
    const char *p = buf;
    while (n) {
        ssize_t k = write(fd, p, n);
        if (k < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += k, n -= (size_t)k;
    }
    return 0;
}

static int cmp_str_ptr(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Builds the header (padded with spaces to a multiple of 8) and each tensor's offset. */
static char *build_header(const kd_st_writer *w, uint64_t *offsets, size_t *hlen, kd_err *err) {
    json_t *root = json_object();
    char *text = NULL, *out = NULL;
    if (!root) goto oom;
    if (w->n_meta) {
        json_t *meta = json_object();
        if (!meta || json_object_set_new(root, "__metadata__", meta) != 0) goto oom;
        for (size_t i = 0; i < w->n_meta; i++)
            if (json_object_set_new(meta, w->meta_keys[i], json_string(w->meta_values[i])) != 0) goto oom;
    }
    uint64_t off = 0;
    for (size_t i = 0; i < w->n; i++) {
        const st_item *it = &w->items[i];
        uint64_t a = kd_dtype_size(it->dtype);
        off = (off + a - 1) / a * a;
        offsets[i] = off;
        json_t *e = json_object(), *shape = json_array();
        if (!e || !shape || json_object_set_new(root, it->name, e) != 0) {
            json_decref(shape);
            goto oom;
        }
        if (json_object_set_new(e, "dtype", json_string(kd_dtype_name(it->dtype))) != 0 ||
            json_object_set_new(e, "shape", shape) != 0)
            goto oom;
        for (int d = 0; d < it->ndim; d++)
            if (json_array_append_new(shape, json_integer(it->shape[d])) != 0) goto oom;
        json_t *offs = json_pack("[II]", (json_int_t)off, (json_int_t)(off + it->nbytes));
        if (!offs || json_object_set_new(e, "data_offsets", offs) != 0) goto oom;
        off += it->nbytes;
    }
    if (!(text = json_dumps(root, JSON_COMPACT))) goto oom;
    size_t n = strlen(text), padded = (n + 7) / 8 * 8;
    if (!(out = malloc(padded))) goto oom;
    memcpy(out, text, n);
    memset(out + n, ' ', padded - n);
    *hlen = padded;
    free(text);
    json_decref(root);
    return out;
oom:
    free(text);
    json_decref(root);
    kd_fail(err, "safetensors writer: out of memory building the header");
    return NULL;
}

static int write_tensor(int fd, const st_item *it, unsigned char *buf) {
    if (!it->fill) return it->nbytes ? write_all(fd, it->data, (size_t)it->nbytes) : 0;
    size_t esize = kd_dtype_size(it->dtype);
    int64_t per = (int64_t)(KD_ST_FILL_CHUNK / esize), total = (int64_t)(it->nbytes / esize);
    for (int64_t first = 0; first < total; first += per) {
        int64_t n = total - first < per ? total - first : per;
        it->fill(it->ctx, buf, first, n);
        if (write_all(fd, buf, (size_t)n * esize) != 0) return -1;
    }
    return 0;
}

int kd_st_writer_write(kd_st_writer *w, const char *path, kd_err *err) {
    /* Duplicate names would silently collapse into one JSON key. */
    char **names = malloc((w->n ? w->n : 1) * sizeof *names);
    if (!names) return kd_fail(err, "%s: out of memory", path);
    for (size_t i = 0; i < w->n; i++) names[i] = w->items[i].name;
    qsort(names, w->n, sizeof *names, cmp_str_ptr);
    for (size_t i = 1; i < w->n; i++)
        if (strcmp(names[i - 1], names[i]) == 0) {
            kd_fail(err, "%s: duplicate tensor name %s", path, names[i]);
            free(names);
            return -1;
        }
    free(names);

    uint64_t *offsets = malloc((w->n ? w->n : 1) * sizeof *offsets);
    if (!offsets) return kd_fail(err, "%s: out of memory", path);
    size_t hlen = 0;
    char *header = build_header(w, offsets, &hlen, err);
    if (!header) {
        free(offsets);
        return -1;
    }
    int need_buf = 0;
    for (size_t i = 0; i < w->n; i++) need_buf |= w->items[i].fill != NULL;
    unsigned char *buf = need_buf ? malloc(KD_ST_FILL_CHUNK) : NULL;
    size_t tlen = strlen(path) + 32;
    char *tmp = malloc(tlen);
    int fd = -1, rc = -1, created = 0;
    if ((need_buf && !buf) || !tmp) {
        kd_fail(err, "%s: out of memory", path);
        goto done;
    }
    snprintf(tmp, tlen, "%s.tmp.%ld", path, (long)getpid());
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        kd_fail(err, "%s: cannot create %s: %s", path, tmp, strerror(errno));
        goto done;
    }
    created = 1;
    uint64_t hl = hlen, pos = 0;
    static const unsigned char zeros[8];
    if (write_all(fd, &hl, 8) != 0 || write_all(fd, header, hlen) != 0) goto io_error;
    for (size_t i = 0; i < w->n; i++) {
        if (write_all(fd, zeros, (size_t)(offsets[i] - pos)) != 0 || write_tensor(fd, &w->items[i], buf) != 0)
            goto io_error;
        pos = offsets[i] + w->items[i].nbytes;
    }
    if (fsync(fd) != 0) goto io_error;
    int cfd = fd;
    fd = -1;
    if (close(cfd) != 0) goto io_error;
    if (rename(tmp, path) != 0) {
        kd_fail(err, "%s: cannot rename %s into place: %s", path, tmp, strerror(errno));
        goto done;
    }
    rc = 0;
    goto done;
io_error:
    kd_fail(err, "%s: write failed: %s", path, strerror(errno));
done:
    if (fd >= 0) close(fd);
    if (rc != 0 && created) unlink(tmp);
    free(tmp);
    free(buf);
    free(header);
    free(offsets);
    return rc;
}
