/* types.c: dtype helpers, half/bfloat16 conversion, error formatting. */
#include <math.h>
#include <stdio.h>

#include "kd/types.h"

size_t kd_dtype_size(kd_dtype t) {
    switch (t) {
    case KD_F32: return 4;
    case KD_F16: return 2;
    case KD_BF16: return 2;
    case KD_F64: return 8;
    case KD_I64: return 8;
    case KD_I32: return 4;
    default: return 0;
    }
}

const char *kd_dtype_name(kd_dtype t) {
    switch (t) {
    case KD_F32: return "F32";
    case KD_F16: return "F16";
    case KD_BF16: return "BF16";
    case KD_F64: return "F64";
    case KD_I64: return "I64";
    case KD_I32: return "I32";
    default: return "?";
    }
}

int64_t kd_tensor_numel(const kd_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

float kd_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t kd_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even */
    return (uint16_t)(u >> 16);
}

float kd_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    float f;
    if (exp == 0) { /* zero or subnormal: man * 2^-24 */
        f = ldexpf((float)man, -24);
        return sign ? -f : f;
    }
    uint32_t u;
    if (exp == 31) u = sign | 0x7f800000u | (man << 13);
    else u = sign | ((exp + 112u) << 23) | (man << 13);
    memcpy(&f, &u, 4);
    return f;
}

uint16_t kd_f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    float a = fabsf(f);
    if (isnan(f)) return sign | 0x7e00u;
    if (a >= 65520.0f) return sign | 0x7c00u; /* overflow to inf */
    if (a < 6.103515625e-05f) { /* subnormal half: round a / 2^-24 to nearest even */
        float m = nearbyintf(a * 16777216.0f);
        return sign | (uint16_t)m;
    }
    uint32_t au = u & 0x7fffffffu;
    uint32_t exp = (au >> 23) - 112u;
    uint32_t man = au & 0x7fffffu;
    uint32_t h = (exp << 10) | (man >> 13);
    uint32_t rest = man & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++;
    return sign | (uint16_t)h;
}

double kd_tensor_get_f64(const kd_tensor *t, int64_t i) {
    const unsigned char *p = (const unsigned char *)t->data + (size_t)i * kd_dtype_size(t->dtype);
    switch (t->dtype) {
    case KD_F32: { float v; memcpy(&v, p, 4); return v; }
    case KD_F64: { double v; memcpy(&v, p, 8); return v; }
    case KD_BF16: { uint16_t v; memcpy(&v, p, 2); return kd_bf16_to_f32(v); }
    case KD_F16: { uint16_t v; memcpy(&v, p, 2); return kd_f16_to_f32(v); }
    case KD_I64: { int64_t v; memcpy(&v, p, 8); return (double)v; }
    case KD_I32: { int32_t v; memcpy(&v, p, 4); return v; }
    default: return NAN;
    }
}

void kd_tensor_to_f32(const kd_tensor *t, int64_t first, int64_t n, float *out) {
    const unsigned char *p = (const unsigned char *)t->data + (size_t)first * kd_dtype_size(t->dtype);
    if (t->dtype == KD_F32) { memcpy(out, p, (size_t)n * 4); return; }
    if (t->dtype == KD_BF16) {
        for (int64_t i = 0; i < n; i++) {
            uint16_t v;
            memcpy(&v, p + 2 * i, 2);
            out[i] = kd_bf16_to_f32(v);
        }
        return;
    }
    for (int64_t i = 0; i < n; i++) out[i] = (float)kd_tensor_get_f64(t, first + i);
}

void kd_tensor_to_f64(const kd_tensor *t, int64_t first, int64_t n, double *out) {
    for (int64_t i = 0; i < n; i++) out[i] = kd_tensor_get_f64(t, first + i);
}

int kd_fail(kd_err *err, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
    }
    return -1;
}
