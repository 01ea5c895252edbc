/* kd/sum64.h: the checksum of the NCCL state handoff (decoder.proto, StateSection.sum64),
 * computed where the state lives: on the CPU here, on a GPU by kd_cuda_sum64.
 *
 * With the bytes read as n little-endian 32-bit words w[i]:
 *   s = sum_i fmix64((i << 32) | w[i])  (mod 2^64),   sum64 = fmix64(s ^ (n * 0x9E3779B97F4A7C15))
 * fmix64 (MurmurHash3's finalizer) is a bijection, so each term is a bijection of (i, w[i]):
 * changing any one word changes the sum, and the terms can be added in any order, which is
 * what lets thousands of GPU threads compute it at the memory bandwidth. */
#ifndef KD_SUM64_H
#define KD_SUM64_H

#include <stddef.h>
#include <stdint.h>

#include "kd/types.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KD_SUM64_GOLDEN 0x9E3779B97F4A7C15ull

#ifdef __CUDACC__
__host__ __device__
#endif
static inline uint64_t kd_fmix64(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ull;
    k ^= k >> 33;
    return k;
}

/* bytes must be a multiple of 4. */
uint64_t kd_sum64(const void *data, size_t bytes);

/* One device region: n_bytes at dev (a multiple of 4). */
typedef struct kd_dev_region {
    const void *dev;
    uint64_t n_bytes;
} kd_dev_region;

/* Work space of kd_cuda_sum64 kept by a caller that checks often (a handoff link): 64 sums
 * in device memory and in pinned host memory. */
typedef struct kd_sum64_scratch {
    void *dev, *host;
} kd_sum64_scratch;
int kd_cuda_sum64_scratch_init(kd_sum64_scratch *s, kd_err *err);
void kd_cuda_sum64_scratch_free(kd_sum64_scratch *s);

/* sum64 of each of n device regions (device memory of the current CUDA device), computed on
 * the device on `stream` (a cudaStream_t; NULL: the default stream); out[n] on the host.
 * scratch: kept work space, or NULL (then allocated and freed per call). Waits for the
 * result. Fails (with a message) without CUDA or on a device error. */
int kd_cuda_sum64(const kd_dev_region *r, int n, uint64_t *out, void *stream, kd_sum64_scratch *scratch,
                  kd_err *err);

#ifdef __cplusplus
}
#endif
#endif
