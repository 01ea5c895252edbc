/* lt_table.c: the text form of cuBLASLt configuration tables (kd/lt_table.h). */
#include "kd/lt_table.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { kFields = 13 };

/* The fields in the order of a line, with their ranges. */
static const struct {
    const char *name;
    uint64_t lo, hi;
} kField[kFields] = {
    {"N", 1, INT32_MAX},        {"K", 1, INT32_MAX},         {"m_lo", 1, INT32_MAX},     {"m_hi", 1, INT32_MAX},
    {"id", 0, INT32_MAX},       {"tile", 0, UINT32_MAX},     {"stages", 0, UINT32_MAX},  {"split_k", 1, INT32_MAX},
    {"reduction", 0, UINT32_MAX}, {"swizzle", 0, UINT32_MAX}, {"custom", 0, UINT32_MAX}, {"cluster", 0, UINT16_MAX},
    {"inner", 0, UINT16_MAX},
};

static int is_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f'; }

/* One line (without its newline; comments not yet cut): 1 and *e, 0 for a blank or comment line,
 * -1 with err. */
static int parse_line(const char *p, const char *end, int line, kd_lt_entry *e, kd_err *err) {
    uint64_t v[kFields];
    int n = 0;
    for (;;) {
        while (p < end && is_space(*p)) p++;
        if (p == end || *p == '#') break;
        const char *t = p;
        while (p < end && !is_space(*p) && *p != '#') p++;
        if (n == kFields) return kd_fail(err, "line %d: more than %d fields", line, kFields);
        uint64_t x = 0;
        for (const char *q = t; q < p; q++) {
            if (*q < '0' || *q > '9')
                return kd_fail(err, "line %d: field %d (%s): '%.*s' is not a decimal number", line, n + 1,
                               kField[n].name, (int)(p - t > 32 ? 32 : p - t), t);
            if (x > kField[n].hi) break; /* out of range already: no overflow */
            x = x * 10 + (uint64_t)(*q - '0');
        }
        if (x < kField[n].lo || x > kField[n].hi)
            return kd_fail(err, "line %d: field %d (%s) = %.*s out of range %llu..%llu", line, n + 1, kField[n].name,
                           (int)(p - t > 32 ? 32 : p - t), t, (unsigned long long)kField[n].lo,
                           (unsigned long long)kField[n].hi);
        v[n++] = x;
    }
    if (n == 0) return 0;
    if (n < kFields)
        return kd_fail(err, "line %d: %d fields, expected %d (N K m_lo m_hi id tile stages split_k reduction "
                            "swizzle custom cluster inner)",
                       line, n, kFields);
    if (v[2] > v[3]) return kd_fail(err, "line %d: m_lo %llu above m_hi %llu", line, (unsigned long long)v[2],
                                    (unsigned long long)v[3]);
    memset(e, 0, sizeof *e);
    e->N = (int64_t)v[0], e->K = (int64_t)v[1], e->m_lo = (int64_t)v[2], e->m_hi = (int64_t)v[3];
    kd_lt_config *c = &e->c;
    c->id = (int32_t)v[4], c->tile = (uint32_t)v[5], c->stages = (uint32_t)v[6], c->split_k = (int32_t)v[7];
    c->reduction = (uint32_t)v[8], c->swizzle = (uint32_t)v[9], c->custom = (uint32_t)v[10];
    c->cluster = (uint16_t)v[11], c->inner = (uint16_t)v[12];
    return 1;
}

int kd_lt_table_parse(const char *text, size_t len, kd_lt_entry *out, int cap, kd_err *err) {
    if (!text && len) return kd_fail(err, "no text");
    if (memchr(text ? text : "", '\0', len)) return kd_fail(err, "not a text file (a NUL byte)");
    int n = 0, line = 0;
    int lines[KD_LT_TABLE_MAX]; /* each entry's line, for the overlap message */
    for (const char *p = text, *end = text + len; p && p < end;) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *le = nl ? nl : end;
        line++;
        kd_lt_entry e;
        const int r = parse_line(p, le, line, &e, err);
        if (r < 0) return -1;
        if (r > 0) {
            if (n >= cap || n >= KD_LT_TABLE_MAX)
                return kd_fail(err, "line %d: more than %d entries", line,
                               cap < KD_LT_TABLE_MAX ? cap : KD_LT_TABLE_MAX);
            for (int i = 0; i < n; i++)
                if (out[i].N == e.N && out[i].K == e.K && out[i].m_lo <= e.m_hi && e.m_lo <= out[i].m_hi)
                    return kd_fail(err, "line %d: rows %lld..%lld of N=%lld K=%lld overlap line %d's", line,
                                   (long long)e.m_lo, (long long)e.m_hi, (long long)e.N, (long long)e.K, lines[i]);
            lines[n] = line;
            out[n++] = e;
        }
        p = nl ? nl + 1 : end;
    }
    return n;
}

int kd_lt_table_load(const char *path, kd_lt_entry **out, kd_err *err) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return kd_fail(err, "%s: %s", path, strerror(errno));
    char *buf = malloc(KD_LT_TABLE_FILE_MAX + 1);
    kd_lt_entry *tab = malloc(sizeof *tab * KD_LT_TABLE_MAX);
    size_t len = 0;
    int n = -1;
    if (!buf || !tab) {
        kd_fail(err, "%s: out of memory", path);
    } else {
        size_t r;
        errno = 0;
        while (len <= KD_LT_TABLE_FILE_MAX && (r = fread(buf + len, 1, KD_LT_TABLE_FILE_MAX + 1 - len, f)) > 0)
            len += r;
        if (ferror(f)) {
            kd_fail(err, "%s: %s", path, errno ? strerror(errno) : "read error");
        } else if (len > KD_LT_TABLE_FILE_MAX) {
            kd_fail(err, "%s: larger than %d bytes", path, KD_LT_TABLE_FILE_MAX);
        } else {
            kd_err e = {{0}};
            n = kd_lt_table_parse(buf, len, tab, KD_LT_TABLE_MAX, &e);
            if (n < 0) kd_fail(err, "%s: %s", path, e.msg);
        }
    }
    fclose(f);
    free(buf);
    if (n > 0) {
        kd_lt_entry *t = realloc(tab, sizeof *tab * (size_t)n);
        *out = t ? t : tab;
    } else {
        free(tab);
    }
    return n;
}

const kd_lt_entry *kd_lt_table_find(const kd_lt_entry *tab, int n, int64_t M, int64_t N, int64_t K) {
    for (int i = 0; i < n; i++)
        if (tab[i].N == N && tab[i].K == K && M >= tab[i].m_lo && M <= tab[i].m_hi) return &tab[i];
    return NULL;
}
