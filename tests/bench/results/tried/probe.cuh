// probe.cuh: helpers shared by the standalone probes of this folder (skinny_smem_a.cu, ksplit_tc.cu): cp.async
// and mma wrappers, an RMSNorm-like kernel to stand before a product, a bf16 fill, bf16 to float on the host, and
// the time a launch takes in a CUDA graph of L launches.
#ifndef KD_TRIED_PROBE_CUH
#define KD_TRIED_PROBE_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

#include "kernels/cuda/ck.cuh"

// 16 bytes global -> shared, asynchronously (cp.async; the caller commits and waits).
__device__ __forceinline__ void cp16(void *dst, const void *src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"((unsigned)__cvta_generic_to_shared(dst)), "l"(src));
}

// d += A B, m16n8k16, bf16 in, fp32 sums (A row-major 16 x 16, B column-major 16 x 8).
__device__ __forceinline__ void mma(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                    uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// The kernel before a product in a step: an RMSNorm of M rows of K (a block a row), its bf16 output A; it lets
// its dependent be scheduled at once (its blocks then wait for it).
__global__ void __launch_bounds__(1024) norm_like_kernel(const float *__restrict__ x, __nv_bfloat16 *__restrict__ A,
                                                         int K) {
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    __shared__ float red[32];
    const float *r = x + (size_t)blockIdx.x * K;
    float ss = 0.f;
    for (int i = threadIdx.x; i < K; i += 1024) ss += r[i] * r[i];
    for (int o = 16; o; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = ss;
    __syncthreads();
    if (threadIdx.x < 32) {
        float v = red[threadIdx.x];
        for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (threadIdx.x == 0) red[0] = v;
    }
    __syncthreads();
    const float sc = rsqrtf(red[0] / K + 1e-6f);
    for (int i = threadIdx.x; i < K; i += 1024) A[(size_t)blockIdx.x * K + i] = __float2bfloat16(r[i] * sc);
}

__global__ void fill_kernel(__nv_bfloat16 *p, size_t n, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t x = (uint32_t)i * 0x9e3779b9u ^ seed;
        x ^= x >> 16, x *= 0x7feb352du, x ^= x >> 15, x *= 0x846ca68bu, x ^= x >> 16;
        p[i] = __float2bfloat16((float)(x >> 8) * (2.f / 16777216.f) - 1.f);
    }
}

static float bf2f(__nv_bfloat16 h) {
    uint16_t u;
    memcpy(&u, &h, 2);
    uint32_t x = (uint32_t)u << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}

template <typename Launch>
static double time_launches(Launch launch, int L, cudaStream_t st) { /* us a launch */
    cudaGraph_t gph;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    for (int l = 0; l < L; l++) launch(l);
    CK(cudaStreamEndCapture(st, &gph));
    CK(cudaGraphInstantiate(&ge, gph, 0));
    const double ms = time_graph(ge, st, 15);
    cudaGraphExecDestroy(ge), cudaGraphDestroy(gph);
    return ms * 1e3 / L;
}

#endif
