// sum64 on the GPU (kd/sum64.h): the NCCL handoff's checksum of what landed in a slot, or of
// what a prefill worker is about to send, without moving the state to the host.
//
// One launch for up to kMaxRegions regions: blockIdx.y picks the region, blocks of the x
// dimension stride over its words with 16-byte loads (when the region is 16-byte aligned),
// each thread adds its terms into a 64-bit sum, a warp reduces with shuffles and one lane per
// warp adds into the region's total with a 64-bit atomicAdd. Addition modulo 2^64 commutes,
// so the result does not depend on the launch shape. Memory-bound: one read of the bytes.
#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

#include "kd/sum64.h"

namespace {

constexpr int kMaxRegions = 64;
constexpr int kThreads = 256;

struct Regions {
    const uint32_t *p[kMaxRegions];
    uint64_t n[kMaxRegions]; // words
};

__global__ void sum64_kernel(Regions r, unsigned long long *out) {
    const int j = blockIdx.y;
    const uint32_t *p = r.p[j];
    const uint64_t n = r.n[j];
    const uint64_t tid = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x, stride = (uint64_t)gridDim.x * blockDim.x;
    uint64_t s = 0;
    if (((uintptr_t)p & 15) == 0) {
        const uint4 *q = (const uint4 *)p;
        const uint64_t n4 = n / 4;
        for (uint64_t i = tid; i < n4; i += stride) {
            const uint4 v = __ldg(q + i);
            const uint64_t b = i * 4;
            s += kd_fmix64(b << 32 | v.x) + kd_fmix64((b + 1) << 32 | v.y) + kd_fmix64((b + 2) << 32 | v.z) +
                 kd_fmix64((b + 3) << 32 | v.w);
        }
        for (uint64_t i = n4 * 4 + tid; i < n; i += stride) s += kd_fmix64(i << 32 | __ldg(p + i));
    } else {
        for (uint64_t i = tid; i < n; i += stride) s += kd_fmix64(i << 32 | __ldg(p + i));
    }
    for (int o = 16; o; o >>= 1) s += __shfl_down_sync(0xffffffffu, s, o);
    if ((threadIdx.x & 31) == 0 && s) atomicAdd(out + j, (unsigned long long)s);
}

} // namespace

extern "C" int kd_cuda_sum64_scratch_init(kd_sum64_scratch *s, kd_err *err) {
    s->dev = s->host = NULL;
    cudaError_t e = cudaMalloc(&s->dev, sizeof(unsigned long long) * kMaxRegions);
    if (e == cudaSuccess) e = cudaMallocHost(&s->host, sizeof(unsigned long long) * kMaxRegions);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        kd_cuda_sum64_scratch_free(s);
        return kd_fail(err, "sum64 work space: %s", cudaGetErrorString(e));
    }
    return 0;
}

extern "C" void kd_cuda_sum64_scratch_free(kd_sum64_scratch *s) {
    if (s->dev) cudaFree(s->dev);
    if (s->host) cudaFreeHost(s->host);
    s->dev = s->host = NULL;
}

extern "C" int kd_cuda_sum64(const kd_dev_region *r, int n, uint64_t *out, void *stream_, kd_sum64_scratch *scratch,
                             kd_err *err) {
    cudaStream_t stream = (cudaStream_t)stream_;
    if (n <= 0) return 0;
    int dev = 0, sms = 132;
    if (cudaGetDevice(&dev) == cudaSuccess) cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    kd_sum64_scratch own = {NULL, NULL};
    if (!scratch) {
        if (kd_cuda_sum64_scratch_init(&own, err)) return -1;
        scratch = &own;
    }
    unsigned long long *d = (unsigned long long *)scratch->dev, *h = (unsigned long long *)scratch->host;
    cudaError_t e = cudaSuccess;
    for (int at = 0; e == cudaSuccess && at < n; at += kMaxRegions) {
        const int m = n - at < kMaxRegions ? n - at : kMaxRegions;
        Regions g;
        memset(&g, 0, sizeof g);
        uint64_t most = 0;
        for (int i = 0; i < m; i++) {
            if (r[at + i].n_bytes % 4) {
                kd_cuda_sum64_scratch_free(&own);
                return kd_fail(err, "sum64: region of %llu bytes is not whole 32-bit words",
                               (unsigned long long)r[at + i].n_bytes);
            }
            g.p[i] = (const uint32_t *)r[at + i].dev;
            g.n[i] = r[at + i].n_bytes / 4;
            if (g.n[i] > most) most = g.n[i];
        }
        e = cudaMemsetAsync(d, 0, sizeof *d * m, stream);
        if (e != cudaSuccess) break;
        // enough blocks to fill the GPU a few times over, split among the regions
        uint64_t bx = (most + (uint64_t)kThreads * 16 - 1) / ((uint64_t)kThreads * 16);
        const uint64_t cap = (uint64_t)(4 * sms + m - 1) / m + 1;
        if (bx > cap) bx = cap;
        if (bx < 1) bx = 1;
        sum64_kernel<<<dim3((unsigned)bx, (unsigned)m), kThreads, 0, stream>>>(g, d);
        e = cudaGetLastError();
        if (e == cudaSuccess) e = cudaMemcpyAsync(h, d, sizeof *d * m, cudaMemcpyDeviceToHost, stream);
        if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
        for (int i = 0; e == cudaSuccess && i < m; i++) out[at + i] = kd_fmix64((uint64_t)h[i] ^ (g.n[i] * KD_SUM64_GOLDEN));
    }
    kd_cuda_sum64_scratch_free(&own);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return kd_fail(err, "sum64 on the device: %s", cudaGetErrorString(e));
    }
    return 0;
}
