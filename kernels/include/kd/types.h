/* kd/types.h: element types, host tensor views, error reporting.
 *
 * Shared by every part of kdecode. Nothing here allocates. */
#ifndef KD_TYPES_H
#define KD_TYPES_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Element types of checkpoint tensors and host buffers. */
typedef enum kd_dtype {
    KD_F32 = 0,
    KD_F16 = 1,
    KD_BF16 = 2,
    KD_F64 = 3,
    KD_I64 = 4,
    KD_I32 = 5,
    KD_DTYPE_COUNT
} kd_dtype;

size_t kd_dtype_size(kd_dtype t);
const char *kd_dtype_name(kd_dtype t); /* safetensors spelling: "F32", "BF16", ... */

#define KD_MAX_DIMS 4

/* A read-only view of a host tensor (usually mmapped checkpoint bytes, which may be
 * unaligned: read elements with kd_tensor_get_f64 or memcpy, never through a cast). */
typedef struct kd_tensor {
    const void *data; /* NULL: absent (e.g. lm_head of a tied model) */
    kd_dtype dtype;
    int32_t ndim;
    int64_t shape[KD_MAX_DIMS];
} kd_tensor;

int64_t kd_tensor_numel(const kd_tensor *t);
/* Element i (row-major) converted to double; handles every floating dtype. */
double kd_tensor_get_f64(const kd_tensor *t, int64_t i);
/* Converts n elements starting at element `first` to float / double. */
void kd_tensor_to_f32(const kd_tensor *t, int64_t first, int64_t n, float *out);
void kd_tensor_to_f64(const kd_tensor *t, int64_t first, int64_t n, double *out);

/* IEEE half / bfloat16 conversions (bf16 from float rounds to nearest even). */
float kd_bf16_to_f32(uint16_t h);
uint16_t kd_f32_to_bf16(float f);
float kd_f16_to_f32(uint16_t h);
uint16_t kd_f32_to_f16(float f);

/* Error text carried out of a failed call: "where: what". */
typedef struct kd_err {
    char msg[512];
} kd_err;

/* Formats into err (if not NULL) and returns -1, so callers write `return kd_fail(err, ...)`. */
int kd_fail(kd_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#ifdef __cplusplus
}
#endif
#endif
