/* safetensors.h: reading (mmap, fully validated) and writing safetensors files.
 *
 * Format: 8-byte little-endian header length N, N bytes of JSON
 * {"name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, ...,
 *  "__metadata__": {"k": "v"}}, then the data block. Offsets are relative to the data block.
 * Every file is untrusted: header length past the end, bad JSON, unknown dtype, a shape
 * whose byte size disagrees with its offsets, offsets outside the data, overlapping
 * tensors, duplicate names: each is an error naming the file and the problem. */
#ifndef KD_SAFETENSORS_H
#define KD_SAFETENSORS_H

#include "kd/types.h"

typedef struct kd_st_entry {
    char *name;
    kd_tensor t;      /* data points into the mapping */
    uint64_t offset;  /* within the data block */
    uint64_t nbytes;
} kd_st_entry;

typedef struct kd_st_file {
    char *path;
    void *map;            /* whole file, read-only */
    size_t map_len;
    size_t n_entries;
    kd_st_entry *entries; /* sorted by name */
    size_t n_meta;
    char **meta_keys, **meta_values;
} kd_st_file;

/* Maps and validates a file. Returns NULL with err set on any problem. */
kd_st_file *kd_st_open(const char *path, kd_err *err);
void kd_st_close(kd_st_file *f);
/* NULL if absent. */
const kd_st_entry *kd_st_find(const kd_st_file *f, const char *name);
const char *kd_st_meta(const kd_st_file *f, const char *key);

/* Writer: add tensors, then write the file. */
typedef struct kd_st_writer kd_st_writer;
kd_st_writer *kd_st_writer_new(void);
/* Copies numel(shape) elements of dtype from data (host order: little-endian). */
int kd_st_writer_add(kd_st_writer *w, const char *name, kd_dtype dtype, int ndim,
                     const int64_t *shape, const void *data, kd_err *err);
/* A tensor whose bytes are produced at write time, in order, by fill(ctx, dst, first, n):
 * write elements first..first+n-1 to dst (n is at most a few MiB worth). Lets a writer
 * stream multi-GiB checkpoints without holding them in memory. ctx must outlive the write. */
typedef void (*kd_st_fill_fn)(void *ctx, void *dst, int64_t first, int64_t n);
int kd_st_writer_add_fill(kd_st_writer *w, const char *name, kd_dtype dtype, int ndim,
                          const int64_t *shape, kd_st_fill_fn fill, void *ctx, kd_err *err);
int kd_st_writer_meta(kd_st_writer *w, const char *key, const char *value, kd_err *err);
/* Writes atomically (temp file + rename). */
int kd_st_writer_write(kd_st_writer *w, const char *path, kd_err *err);
void kd_st_writer_free(kd_st_writer *w);

#endif
