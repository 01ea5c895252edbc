// wave_probe.cu: a probe (built by hand, not by Bazel) of what the one-pass KDA verify's shape costs in its
// waves, with the verify's arithmetic replaced by a tunable stand-in. Each block takes one state tile (128 x 128
// fp32, 64 KiB, contiguous; one block a tile as the verify's (row, head) blocks), loads it, runs `iters` rounds of
// 64 independent multiply-adds a thread on its 64 values (a compute phase after the tile has landed, like the
// verify's fold, window product and solve), and either writes the tile back (a written step) or only reduces it
// (a kept step). Forms:
//   staged2: the tile through shared memory by 16-byte cp.async, 2 blocks an SM (the verify's form: its 66 KiB
//            tile and other arrays, about 100 KiB of shared memory, 128 registers a thread);
//   regs2:   the tile straight into registers by 16-byte loads, 2 blocks an SM (the same shared memory reserved);
//   regs3:   the same with 3 blocks an SM (60 KiB of shared memory a block, at most 85 registers a thread).
// The question it answers: how much of a step's time over the copy comes from the waves' lockstep (a wave's blocks
// load together, then compute together while the memory idles) and how much a third block an SM (possible only
// without the shared-memory tile) would win back, before anyone rewrites the verify for it.
// Build (from the repository root, one command):
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90,code=[sm_90,compute_90] -I. tests/bench/trace/wave_probe.cu
//     -o wave_probe
// Run: wave_probe [B ...] (default 128 512): per B (B x 32 tiles), kept and written steps, iters 0, 4, 8, 16, 32,
// each form: the median time of 15 launches and its ratio to a device-to-device copy of the same bytes (kept steps
// read only half of them; the faster of cudaMemcpyAsync and a copy kernel on the SMs, both printed), then one table
// line per point. KD_GREEN_SMS=n runs it all on n SMs (kernels/cuda/green.cuh: more bandwidth an SM, as on an H200).
// Measured on an H100 (tests/bench/results/wave_probe_h100.md / .json): with a compute of up to 1.43 us a
// block after its tile lands (iters 16; 2.67 us at 32) every form stays at the copy's rate: written steps
// 1.006-1.021 x the copy at B = 128 and 512 (staged2 1.015-1.021, regs3 1.010-1.017), kept steps 0.47-0.51 x; only
// at iters 32 do kept steps lose (staged2 0.55-0.59, regs3 0.49-0.52). So on the H100 the waves' lockstep with the
// verify's compute lengths (1.4-3.8 us a block in onepass_trace) costs a few % at most, and a third block an SM
// would win back little; the H200 (1.4 x the bandwidth, the same compute) is where to run it next. On 88 of the
// H100's SMs (KD_GREEN_SMS=88, 1.5 x the bandwidth an SM; logs/wave_probe_green_h100_763d9fe.log) kept steps lose
// from iters 16 (staged2 0.52-0.55 x, regs3 0.47-0.50) and at iters 32 staged2 reads 0.77-0.79, regs3 0.66-0.70.
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#include <algorithm>
#include <vector>

#include "kernels/cuda/ck.cuh"
#include "kernels/cuda/green.cuh"

namespace {

constexpr int kTile = 128 * 128; /* floats */

__device__ float g_sink[256];

__device__ __forceinline__ void cp_async16(float *dst, const float *src) {
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(src) : "memory");
}

/* the stand-in compute: iters rounds of 64 independent multiply-adds on the thread's values */
__device__ __forceinline__ void work(float (&r)[64], int iters) {
    for (int it = 0; it < iters; it++)
#pragma unroll
        for (int j = 0; j < 64; j++) r[j] = fmaf(r[j], 0.999f, 1e-3f);
}

template <bool WRITE>
__device__ __forceinline__ void finish(float (&r)[64], float *t) {
    if (WRITE) {
#pragma unroll
        for (int k = 0; k < 16; k++)
            *(float4 *)(t + (k * 256 + threadIdx.x) * 4) = make_float4(r[4 * k], r[4 * k + 1], r[4 * k + 2], r[4 * k + 3]);
    } else {
        float s = 0.f;
#pragma unroll
        for (int j = 0; j < 64; j++) s += r[j];
        if (s == 1234.5f) g_sink[threadIdx.x] = s; /* never, but the compiler cannot know */
    }
}

template <bool WRITE>
__global__ void __launch_bounds__(256, 2) staged2(float *st, int iters) {
    extern __shared__ __align__(16) float sm[];
    float *t = st + (size_t)blockIdx.x * kTile;
#pragma unroll
    for (int k = 0; k < 16; k++) cp_async16(sm + (k * 256 + threadIdx.x) * 4, t + (k * 256 + threadIdx.x) * 4);
    asm volatile("cp.async.commit_group;\n\tcp.async.wait_group 0;" ::: "memory");
    __syncthreads();
    float r[64];
#pragma unroll
    for (int k = 0; k < 16; k++) {
        const float4 v = *(const float4 *)(sm + (k * 256 + threadIdx.x) * 4);
        r[4 * k] = v.x, r[4 * k + 1] = v.y, r[4 * k + 2] = v.z, r[4 * k + 3] = v.w;
    }
    work(r, iters);
    finish<WRITE>(r, t);
}

template <bool WRITE, int MINB>
__global__ void __launch_bounds__(256, MINB) regs(float *st, int iters) {
    extern __shared__ __align__(16) float sm[]; /* reserved only (the verify's other arrays) */
    float *t = st + (size_t)blockIdx.x * kTile;
    float r[64];
#pragma unroll
    for (int k = 0; k < 16; k++) {
        const float4 v = __ldcg((const float4 *)(t + (k * 256 + threadIdx.x) * 4));
        r[4 * k] = v.x, r[4 * k + 1] = v.y, r[4 * k + 2] = v.z, r[4 * k + 3] = v.w;
    }
    if (threadIdx.x == 0 && iters < 0) sm[0] = r[0]; /* keeps the reservation */
    work(r, iters);
    finish<WRITE>(r, t);
}

/* the stand-in compute alone (no loads), 2 blocks an SM as in a wave of staged2: each block's thread 0 writes the
 * time its block spent in work() */
__global__ void __launch_bounds__(256, 2) calib(int iters, unsigned long long *ns) {
    float r[64];
#pragma unroll
    for (int j = 0; j < 64; j++) r[j] = (float)(threadIdx.x + j);
    __syncthreads();
    unsigned long long t0, t1;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0)::"memory");
    work(r, iters);
    __syncthreads();
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1)::"memory");
    finish<false>(r, nullptr);
    if (threadIdx.x == 0) ns[blockIdx.x] = t1 - t0;
}

/* the copy floor's second form (as kda_check's): a grid-stride copy in 16-byte accesses, on the SMs */
__global__ void copy4(const float4 *s, float4 *d, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) d[i] = s[i];
}

template <class F>
float median_us(F launch, cudaStream_t s, int reps = 15) {
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    launch(), launch(); /* warm */
    std::vector<float> v;
    for (int i = 0; i < reps; i++) {
        CK(cudaEventRecord(a, s));
        launch();
        CK(cudaEventRecord(b, s));
        CK(cudaEventSynchronize(b));
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b));
        v.push_back(ms * 1e3f);
    }
    CK(cudaGetLastError());
    cudaEventDestroy(a), cudaEventDestroy(b);
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

} // namespace

int main(int argc, char **argv) {
    std::vector<int> Bs;
    for (int i = 1; i < argc; i++) {
        const int b = atoi(argv[i]);
        if (b < 1 || b > 1024) {
            fprintf(stderr, "wave_probe: B in 1..1024\n");
            return 2;
        }
        Bs.push_back(b);
    }
    if (Bs.empty()) Bs = {128, 512};
    const int green = kd_green_from_env();
    if (green < 0) return 2;
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
    if (green) printf("green context (KD_GREEN_SMS): %d SMs; a probe kernel ran on %d\n", green, kd_green_distinct_sms());
    cudaStream_t s;
    CK(cudaStreamCreate(&s));
    const size_t sm2 = 100 * 1024, sm3 = 60 * 1024;
    CK(cudaFuncSetAttribute(staged2<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm2));
    CK(cudaFuncSetAttribute(staged2<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm2));
    CK(cudaFuncSetAttribute(regs<true, 2>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm2));
    CK(cudaFuncSetAttribute(regs<false, 2>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm2));
    CK(cudaFuncSetAttribute(regs<true, 3>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm3));
    CK(cudaFuncSetAttribute(regs<false, 3>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm3));
    CK(cudaFuncSetAttribute(calib, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm2));
    {
        int o[3] = {0, 0, 0};
        CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&o[0], staged2<true>, 256, sm2));
        CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&o[1], regs<true, 2>, 256, sm2));
        CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&o[2], regs<true, 3>, 256, sm3));
        printf("blocks an SM: staged2 %d, regs2 %d, regs3 %d\n", o[0], o[1], o[2]);
    }
    {
        const int nb = 2 * prop.multiProcessorCount;
        unsigned long long *dns;
        CK(cudaMalloc(&dns, nb * sizeof(unsigned long long)));
        std::vector<unsigned long long> h(nb);
        printf("the stand-in compute of a block, 2 blocks an SM at once (us):");
        for (int iters : {4, 8, 16, 32}) {
            calib<<<nb, 256, sm2, s>>>(iters, dns);
            calib<<<nb, 256, sm2, s>>>(iters, dns);
            CK(cudaStreamSynchronize(s));
            CK(cudaMemcpy(h.data(), dns, nb * sizeof(unsigned long long), cudaMemcpyDeviceToHost));
            double m = 0;
            for (unsigned long long x : h) m += (double)x;
            printf(" iters %d %.2f;", iters, m / nb / 1e3);
        }
        printf("\n");
        cudaFree(dns);
    }
    printf("| B | step | iters | copy us | staged2 us | regs2 us | regs3 us | staged2 / copy | regs2 / copy | regs3 / copy |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|\n");
    for (int B : Bs) {
        const int n = B * 32;
        const size_t bytes = (size_t)n * kTile * sizeof(float);
        float *st, *dst;
        CK(cudaMalloc(&st, bytes));
        CK(cudaMalloc(&dst, bytes));
        CK(cudaMemset(st, 0, bytes));
        const float copy_api = median_us([&] { CK(cudaMemcpyAsync(dst, st, bytes, cudaMemcpyDeviceToDevice, s)); }, s);
        const float copy_k = median_us(
            [&] { copy4<<<prop.multiProcessorCount * 8, 256, 0, s>>>((const float4 *)st, (float4 *)dst, bytes / 16); }, s);
        const float copy = std::min(copy_api, copy_k);
        printf("B = %d: copy of %.0f MiB: cudaMemcpyAsync %.1f us, copy kernel %.1f us (the floor: the faster)\n", B,
               bytes / 1048576.0, copy_api, copy_k);
        for (int w = 0; w < 2; w++)
            for (int iters : {0, 4, 8, 16, 32}) {
                float t[3];
                if (w) {
                    t[0] = median_us([&] { staged2<true><<<n, 256, sm2, s>>>(st, iters); }, s);
                    t[1] = median_us([&] { regs<true, 2><<<n, 256, sm2, s>>>(st, iters); }, s);
                    t[2] = median_us([&] { regs<true, 3><<<n, 256, sm3, s>>>(st, iters); }, s);
                } else {
                    t[0] = median_us([&] { staged2<false><<<n, 256, sm2, s>>>(st, iters); }, s);
                    t[1] = median_us([&] { regs<false, 2><<<n, 256, sm2, s>>>(st, iters); }, s);
                    t[2] = median_us([&] { regs<false, 3><<<n, 256, sm3, s>>>(st, iters); }, s);
                }
                printf("| %d | %s | %d | %.1f | %.1f | %.1f | %.1f | %.3f | %.3f | %.3f |\n", B, w ? "written" : "kept",
                       iters, copy, t[0], t[1], t[2], t[0] / copy, t[1] / copy, t[2] / copy);
                fflush(stdout);
            }
        cudaFree(st), cudaFree(dst);
    }
    return 0;
}
