// copy_forms.cu: which access pattern moves device memory fastest on this GPU (a probe, not built by
// Bazel): nvcc -O3 -std=c++17 -gencode=arch=compute_90,code=[sm_90,compute_90] copy_forms.cu -o copy_forms
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); exit(1);} } while (0)

__global__ void c_grid1(const float4 *s, float4 *d, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) d[i] = s[i];
}
template <int U>
__global__ void c_gridU(const float4 *s, float4 *d, size_t n) {
    const size_t st = (size_t)gridDim.x * blockDim.x;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += st * U) {
        float4 v[U];
#pragma unroll
        for (int u = 0; u < U; u++) if (i + u * st < n) v[u] = s[i + u * st];
#pragma unroll
        for (int u = 0; u < U; u++) if (i + u * st < n) d[i + u * st] = v[u];
    }
}
template <int U>
__global__ void c_gridU_hint(const float4 *s, float4 *d, size_t n) {
    const size_t st = (size_t)gridDim.x * blockDim.x;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += st * U) {
        float4 v[U];
#pragma unroll
        for (int u = 0; u < U; u++) if (i + u * st < n) v[u] = __ldcs(s + i + u * st);
#pragma unroll
        for (int u = 0; u < U; u++) if (i + u * st < n) __stcs(d + i + u * st, v[u]);
    }
}
// a block a contiguous 64 KB chunk (like a head's state), 256 threads, 16 loads in flight
__global__ void c_chunk(const float4 *s, float4 *d, size_t n) {
    const size_t per = 4096; // float4s = 64 KB
    for (size_t c = blockIdx.x; c * per < n; c += gridDim.x) {
        float4 v[16];
        const size_t b = c * per + threadIdx.x;
#pragma unroll
        for (int u = 0; u < 16; u++) v[u] = s[b + u * 256];
#pragma unroll
        for (int u = 0; u < 16; u++) d[b + u * 256] = v[u];
    }
}
// bulk copies: a ring of NS stages of SB bytes a block, one thread issues
__device__ __forceinline__ uint32_t sa(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }
template <int NS, int SB>
__global__ void __launch_bounds__(32) c_bulk(const char *s, char *d, size_t bytes) {
    extern __shared__ __align__(128) char sm[];
    __shared__ __align__(8) uint64_t bar[NS];
    if (threadIdx.x != 0) return;
    for (int i = 0; i < NS; i++) asm volatile("mbarrier.init.shared.b64 [%0], 1;" ::"r"(sa(&bar[i])));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    const size_t nch = bytes / SB;
    uint32_t phase[NS];
    for (int i = 0; i < NS; i++) phase[i] = 0;
    size_t c0 = blockIdx.x;
    // prologue: fill the ring
    int k = 0;
    for (size_t c = c0; c < nch && k < NS; c += gridDim.x, k++) {
        asm volatile("mbarrier.arrive.expect_tx.shared.b64 _, [%0], %1;" ::"r"(sa(&bar[k])), "r"(SB) : "memory");
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                     ::"r"(sa(sm + k * SB)), "l"(s + c * SB), "r"(SB), "r"(sa(&bar[k])) : "memory");
    }
    k = 0;
    for (size_t c = c0; c < nch; c += gridDim.x) {
        // wait the stage
        uint32_t ok = 0;
        while (!ok) asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                                 : "=r"(ok) : "r"(sa(&bar[k])), "r"(phase[k]) : "memory");
        phase[k] ^= 1;
        asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(d + c * SB), "r"(sa(sm + k * SB)), "r"(SB) : "memory");
        asm volatile("cp.async.bulk.commit_group;" ::: "memory");
        const size_t cn = c + (size_t)NS * gridDim.x;
        if (cn < nch) {
            // the stage is reused: its store must have read shared memory
            asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(0) : "memory");
            asm volatile("mbarrier.arrive.expect_tx.shared.b64 _, [%0], %1;" ::"r"(sa(&bar[k])), "r"(SB) : "memory");
            asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                         ::"r"(sa(sm + k * SB)), "l"(s + cn * SB), "r"(SB), "r"(sa(&bar[k])) : "memory");
        }
        k = (k + 1) % NS;
    }
    asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}

// Copy form f (the names in main) of bytes from s to d on st.
static void launch_form(int f, const char *s, char *d, size_t bytes, int sms, cudaStream_t st) {
    const size_t n = bytes / 16;
    const float4 *s4 = (const float4 *)s;
    float4 *d4 = (float4 *)d;
    switch (f) {
    case 0: CK(cudaMemcpyAsync(d, s, bytes, cudaMemcpyDeviceToDevice, st)); break;
    case 1: c_grid1<<<sms * 8, 256, 0, st>>>(s4, d4, n); break;
    case 2: c_gridU<4><<<sms * 8, 256, 0, st>>>(s4, d4, n); break;
    case 3: c_gridU<8><<<sms * 8, 256, 0, st>>>(s4, d4, n); break;
    case 4: c_gridU_hint<4><<<sms * 8, 256, 0, st>>>(s4, d4, n); break;
    case 5: c_chunk<<<sms * 4, 256, 0, st>>>(s4, d4, n); break;
    case 6: c_bulk<4, 16384><<<sms * 4, 32, 65536, st>>>(s, d, bytes); break;
    case 7: c_bulk<8, 8192><<<sms * 4, 32, 65536, st>>>(s, d, bytes); break;
    case 8: c_bulk<4, 32768><<<sms * 2, 32, 131072, st>>>(s, d, bytes); break;
    case 9: c_bulk<6, 16384><<<sms * 2, 32, 98304, st>>>(s, d, bytes); break;
    }
}

int main() {
    int dev = 0; cudaDeviceProp p; CK(cudaGetDeviceProperties(&p, dev));
    const int sms = p.multiProcessorCount;
    const size_t sizes[] = {64ull << 20, 128ull << 20, 256ull << 20, 512ull << 20, 1024ull << 20};
    const int NB = 3; // buffers rotated so nothing stays in the L2
    char *bufs[2 * NB];
    for (int i = 0; i < 2 * NB; i++) { CK(cudaMalloc(&bufs[i], 1024ull << 20)); CK(cudaMemset(bufs[i], i + 1, 1024ull << 20)); }
    cudaStream_t st; CK(cudaStreamCreate(&st));
    cudaEvent_t e0, e1; CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
    const char *names[] = {"cudaMemcpyAsync", "grid 16B x1", "grid 16B x4", "grid 16B x8", "grid x4 .cs hints", "64KB chunk a block", "bulk 4x16KB 4/SM", "bulk 8x8KB 4/SM", "bulk 4x32KB 2/SM", "bulk 6x16KB 2/SM"};
    const int NF = 10;
    CK(cudaFuncSetAttribute(c_bulk<4, 16384>, cudaFuncAttributeMaxDynamicSharedMemorySize, 65536));
    CK(cudaFuncSetAttribute(c_bulk<8, 8192>, cudaFuncAttributeMaxDynamicSharedMemorySize, 65536));
    CK(cudaFuncSetAttribute(c_bulk<4, 32768>, cudaFuncAttributeMaxDynamicSharedMemorySize, 131072));
    CK(cudaFuncSetAttribute(c_bulk<6, 16384>, cudaFuncAttributeMaxDynamicSharedMemorySize, 98304));
    printf("device %s, %d SMs\n", p.name, sms);
    printf("| bytes MB |");
    for (int f = 0; f < NF; f++) printf(" %s GB/s |", names[f]);
    printf("\n|---|");
    for (int f = 0; f < NF; f++) printf("---|");
    printf("\n");
    for (size_t bytes : sizes) {
        printf("| %zu |", bytes >> 20);
        for (int f = 0; f < NF; f++) {
            std::vector<float> ts;
            for (int rep = 0; rep < 12; rep++) {
                const char *s = bufs[(rep % NB) * 2]; char *d = bufs[(rep % NB) * 2 + 1];
                CK(cudaEventRecord(e0, st));
                launch_form(f, s, d, bytes, sms, st);
                CK(cudaEventRecord(e1, st));
                CK(cudaEventSynchronize(e1));
                CK(cudaGetLastError());
                float ms; CK(cudaEventElapsedTime(&ms, e0, e1));
                if (rep >= 2) ts.push_back(ms);
            }
            std::sort(ts.begin(), ts.end());
            const double med = ts[ts.size() / 2];
            printf(" %.0f |", 2.0 * bytes / (med * 1e-3) / 1e9);
            fflush(stdout);
        }
        printf("\n");
    }
    // correctness of each form on a pattern
    {
        const size_t bytes = 64ull << 20, n = bytes / 4;
        std::vector<uint32_t> h(n), g(n);
        for (size_t i = 0; i < n; i++) h[i] = (uint32_t)(i * 2654435761u);
        CK(cudaMemcpy(bufs[0], h.data(), bytes, cudaMemcpyHostToDevice));
        for (int f = 0; f < NF; f++) {
            CK(cudaMemset(bufs[1], 0xff, bytes));
            const char *s = bufs[0]; char *d = bufs[1];
            launch_form(f, s, d, bytes, sms, st);
            CK(cudaStreamSynchronize(st));
            CK(cudaMemcpy(g.data(), bufs[1], bytes, cudaMemcpyDeviceToHost));
            size_t bad = 0;
            for (size_t i = 0; i < n; i++) bad += g[i] != h[i];
            printf("check %s: %s (%zu words differ)\n", names[f], bad ? "FAIL" : "ok", bad);
        }
    }
    return 0;
}
