/* cpu/real.h: the element type of one compilation of the CPU backend (float or double).
 * cpu_backend.c and ops.c are compiled twice, with KD_REAL_F64 = 0 and 1. */
#ifndef KD_CPU_REAL_H
#define KD_CPU_REAL_H

#include <math.h>

#if KD_REAL_F64
typedef double real;
#define KD_SFX(name) name##_f64
#define R_EXP exp
#define R_LOG1P log1p
#define R_SQRT sqrt
#define KD_REAL_DTYPE KD_F64
#define KD_GEMM cblas_dgemm
#else
typedef float real;
#define KD_SFX(name) name##_f32
#define R_EXP expf
#define R_LOG1P log1pf
#define R_SQRT sqrtf
#define KD_REAL_DTYPE KD_F32
#define KD_GEMM cblas_sgemm
#endif

static inline real r_sigmoid(real x) { return (real)1 / ((real)1 + R_EXP(-x)); }
static inline real r_silu(real x) { return x * r_sigmoid(x); }
/* softplus(x) = log(1 + e^x), stable for large |x|. */
static inline real r_softplus(real x) {
    return x > (real)20 ? x : (x < (real)-20 ? R_EXP(x) : R_LOG1P(R_EXP(x)));
}

#endif
