/* lt_table.h: a table of cuBLASLt algorithm configurations by product shape, and its text
 * form (an operator's table for the CUDA backend: KDECODE_CUDA_LT_TABLE=FILE, read when the
 * backend is created; kernels/cuda/gemm_lt.cuh). Plain C, no CUDA: the format is parsed, and
 * tested, on every machine.
 *
 * The text: one entry a line, 13 whitespace-separated decimal integers,
 *   N K m_lo m_hi id tile stages split_k reduction swizzle custom cluster inner
 * products of N x K weights at m_lo..m_hi activation rows run cuBLASLt's algorithm id with
 * those CUBLASLT_ALGO_CONFIG_* values (as `KD_LT_SEARCH=1 gemm_lt_bench` prints and writes
 * them). '#' starts a comment; blank lines are skipped. Two entries of the same N and K may
 * not share a row count. An empty table is valid: every product takes the heuristic's first
 * algorithm (the built-in table off). A configuration cuBLASLt refuses for a product on the
 * device it runs on (cublasLtMatmulAlgoCheck) falls back to the heuristic's first. */
#ifndef KD_LT_TABLE_H
#define KD_LT_TABLE_H

#include <stddef.h>
#include <stdint.h>

#include "kd/types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A whole cuBLASLt algorithm configuration (the CUBLASLT_ALGO_CONFIG_* attributes: algorithm
 * id, tile, stages, K split, reduction scheme, CTA swizzling, custom option, cluster shape,
 * inner shape). */
typedef struct kd_lt_config {
    int32_t id;
    uint32_t tile, stages;
    int32_t split_k;
    uint32_t reduction, swizzle, custom;
    uint16_t cluster, inner;
} kd_lt_config;

/* One entry: products of N x K weights at M in [m_lo, m_hi] run configuration c. */
typedef struct kd_lt_entry {
    int64_t N, K, m_lo, m_hi;
    kd_lt_config c;
} kd_lt_entry;

/* The most entries a table holds, and the largest file read. */
#define KD_LT_TABLE_MAX 4096
#define KD_LT_TABLE_FILE_MAX (1 << 20)

/* Parses len bytes of text into out (at most cap entries): the number of
 * entries, or -1 with the line and the reason in err. */
int kd_lt_table_parse(const char *text, size_t len, kd_lt_entry *out, int cap, kd_err *err);

/* Reads and parses the file at path: the number of entries with *out malloc'd (NULL for none;
 * the caller frees it), or -1 with *out NULL and the path, line and reason in err. */
int kd_lt_table_load(const char *path, kd_lt_entry **out, kd_err *err);

/* The first entry of the n at tab that holds M, N, K, or NULL. */
const kd_lt_entry *kd_lt_table_find(const kd_lt_entry *tab, int n, int64_t M, int64_t N, int64_t K);

#ifdef __cplusplus
}
#endif

#endif
