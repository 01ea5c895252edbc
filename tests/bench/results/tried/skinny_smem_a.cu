// skinny_smem_a.cu: a probe (not built by Bazel) of a tensor-core skinny product for 16-32
// activation rows, against cuBLAS, on the 48B preset's wide products (gate|up, the input
// projection): C[M][N] = A[M][K] W[N][K]^T, bf16 in, fp32 out.
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90,code=[sm_90,compute_90] skinny_smem_a.cu -lcublas -o skinny_smem_a
//   (from the repository root, with -I. and the path: tests/bench/results/tried/skinny_smem_a.cu)
// Results: ../logs/skinny_smem_a_h200_tried.log (and tried/README.md).
//
// The form: a block an SM, all of A in its shared memory (M x K bf16, 144 KiB at M = 32, K = 2304:
// loaded once by asynchronous copies while the warps issue their first weight loads), each warp
// a 16-row tile of W at a time (tiles spread over the blocks first, so every SM streams a like
// share). In a 32-key block lane (g, q) loads 16 bytes of W row g and of row g + 8 (keys 8q..8q+7)
// straight into registers and feeds two mma m16n8k16 per 8 activation rows; the keys of each
// mma are permuted alike in W and A (physical 8q..8q+3 as the fragment's 2q, 2q + 1, 2q + 8,
// 2q + 9), so the activation fragment is one 16-byte shared-memory load of row g. Stages of 4
// key blocks in registers, the next stage's loads issued before this stage's products.
// Why: at 32 rows cuBLAS streams gate|up at 81 % of the copy's bandwidth with 96 blocks of 192
// rows on 132 SMs (results/gemm_lt_h200.md), and the backend's own skinny forms re-read A
// from the L2 for every 16 rows of W (twice W's bytes at M = 32).
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cublas_v2.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernels/cuda/ck.cuh"
#include "tests/bench/results/tried/probe.cuh"

template <int HINT>
__device__ __forceinline__ uint4 ldw(const uint4 *p) {
    uint4 r;
    if constexpr (HINT == 1)
        asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
                     : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                     : "l"(p));
    else
        asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                     : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                     : "l"(p));
    return r;
}
// blocks: one an SM; warps: NW; A [M][K], W [N][K] bf16 row-major; C [M][N] fp32. K % 128 == 0, N % 16 == 0.
// ST: 32-key blocks a stage; HINT 1: the loads ask the L2 for 256-byte fetches
template <int M, int NW, int ST, int HINT>
__global__ void __launch_bounds__(NW * 32, 1)
    skinny_a_kernel(const __nv_bfloat16 *__restrict__ A, const __nv_bfloat16 *__restrict__ W, float *__restrict__ C,
                    int N, int K) {
    extern __shared__ __align__(16) uint8_t sa[];
    const int SA = 2 * K + 64; /* bytes a row: rows g and g + 1 of one load phase in distinct banks */
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, q = lane % 4;
    const int k16 = K / 8; /* 16-byte chunks a row */
    for (int i = tid; i < M * k16; i += NW * 32) cp16(sa + (size_t)(i / k16) * SA + (i % k16) * 16, A + (size_t)i * 8);
    asm volatile("cp.async.commit_group;" ::: "memory");
    const int tiles = N / 16, nkb = K / 32;
    int t = blockIdx.x + gridDim.x * warp;
    uint4 ra[ST], rb[ST];
    const uint4 *w0 = nullptr, *w1 = nullptr;
    auto issue = [&](int kb) {
#pragma unroll
        for (int j = 0; j < ST; j++) ra[j] = ldw<HINT>(w0 + (size_t)(kb + j) * 4), rb[j] = ldw<HINT>(w1 + (size_t)(kb + j) * 4);
    };
    if (t < tiles) {
        w0 = (const uint4 *)(W + (size_t)(t * 16 + g) * K) + q;
        w1 = w0 + (size_t)8 * K / 8;
        issue(0);
    }
    asm volatile("cp.async.wait_all;" ::: "memory");
    __syncthreads();
    for (; t < tiles; t += gridDim.x * NW) {
        float acc[M / 8][4];
#pragma unroll
        for (int nt = 0; nt < M / 8; nt++) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
        const uint8_t *arow = sa + (size_t)g * SA + q * 16;
        for (int kb = 0; kb < nkb; kb += ST) {
            uint4 ca[ST], cb[ST];
#pragma unroll
            for (int j = 0; j < ST; j++) ca[j] = ra[j], cb[j] = rb[j];
            const int nt_ = t + gridDim.x * NW;
            if (kb + ST < nkb) issue(kb + ST);
            else if (nt_ < tiles) { /* the next tile's first stage */
                w0 = (const uint4 *)(W + (size_t)(nt_ * 16 + g) * K) + q;
                w1 = w0 + (size_t)8 * K / 8;
                issue(0);
            }
#pragma unroll
            for (int j = 0; j < ST; j++) {
#pragma unroll
                for (int nt = 0; nt < M / 8; nt++) {
                    const uint4 b = *(const uint4 *)(arow + (size_t)nt * 8 * SA + (size_t)(kb + j) * 64);
                    mma(acc[nt], ca[j].x, cb[j].x, ca[j].y, cb[j].y, b.x, b.y);
                    mma(acc[nt], ca[j].z, cb[j].z, ca[j].w, cb[j].w, b.z, b.w);
                }
            }
        }
        const int n0 = t * 16 + g;
#pragma unroll
        for (int nt = 0; nt < M / 8; nt++) {
            const int m = nt * 8 + 2 * q;
            C[(size_t)m * N + n0] = acc[nt][0];
            C[(size_t)(m + 1) * N + n0] = acc[nt][1];
            C[(size_t)m * N + n0 + 8] = acc[nt][2];
            C[(size_t)(m + 1) * N + n0 + 8] = acc[nt][3];
        }
    }
}

// The same in a decode step's order: launched as a programmatic dependent of the kernel that
// writes A (here norm_like_kernel, as the backend's RMSNorm before gate|up), so its blocks start
// while that kernel runs: each warp takes its first tile from a counter, asks the L2 for the first
// PF 32-key blocks of it and loads its first stage, all before griddepcontrol.wait (W is never
// written); A after it. Tiles come from the counter (ctr[0]) one at a time, so SMs that the kernel
// before holds longer take fewer; the last warp resets the counters for the next launch.
template <int M, int NW, int ST, int PF>
__global__ void __launch_bounds__(NW * 32, 1)
    skinny_a_pdl_kernel(const __nv_bfloat16 *__restrict__ A, const __nv_bfloat16 *__restrict__ W,
                        float *__restrict__ C, int N, int K, unsigned *ctr) {
    extern __shared__ __align__(16) uint8_t sa[];
    const int SA = 2 * K + 64;
    const int tid = threadIdx.x, lane = tid % 32, g = lane / 4, q = lane % 4;
    const int k16 = K / 8, tiles = N / 16, nkb = K / 32;
    auto grab = [&]() {
        unsigned x = 0;
        if (lane == 0) x = atomicAdd(ctr, 1u);
        return (int)__shfl_sync(0xffffffffu, x, 0);
    };
    int t = grab();
    uint4 ra[ST], rb[ST];
    const uint4 *w0 = nullptr, *w1 = nullptr;
    auto issue = [&](int kb) {
#pragma unroll
        for (int j = 0; j < ST; j++) ra[j] = ldw<1>(w0 + (size_t)(kb + j) * 4), rb[j] = ldw<1>(w1 + (size_t)(kb + j) * 4);
    };
    if (t < tiles) {
        const char *base = (const char *)(W + (size_t)t * 16 * K);
        /* 16 rows x PF x 64 bytes: lines of 128 bytes, 16 x PF / 2 of them */
        if constexpr (PF > 0)
            for (int i = lane; i < 16 * (PF / 2); i += 32)
                asm volatile("prefetch.global.L2::evict_last [%0];" ::"l"(base + (size_t)(i / (PF / 2)) * 2 * K +
                                                                   (size_t)(i % (PF / 2)) * 128));
        w0 = (const uint4 *)(W + (size_t)(t * 16 + g) * K) + q;
        w1 = w0 + (size_t)8 * K / 8;
        issue(0);
    }
    asm volatile("griddepcontrol.wait;" ::: "memory");
    for (int i = tid; i < M * k16; i += NW * 32) cp16(sa + (size_t)(i / k16) * SA + (i % k16) * 16, A + (size_t)i * 8);
    asm volatile("cp.async.commit_group;" ::: "memory");
    asm volatile("cp.async.wait_all;" ::: "memory");
    __syncthreads();
    while (t < tiles) {
        float acc[M / 8][4];
#pragma unroll
        for (int nt = 0; nt < M / 8; nt++) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
        const uint8_t *arow = sa + (size_t)g * SA + q * 16;
        int nt_ = -1;
        for (int kb = 0; kb < nkb; kb += ST) {
            uint4 ca[ST], cb[ST];
#pragma unroll
            for (int j = 0; j < ST; j++) ca[j] = ra[j], cb[j] = rb[j];
            if (kb + ST < nkb) issue(kb + ST);
            else if ((nt_ = grab()) < tiles) {
                w0 = (const uint4 *)(W + (size_t)(nt_ * 16 + g) * K) + q;
                w1 = w0 + (size_t)8 * K / 8;
                issue(0);
            }
#pragma unroll
            for (int j = 0; j < ST; j++) {
#pragma unroll
                for (int nt = 0; nt < M / 8; nt++) {
                    const uint4 b = *(const uint4 *)(arow + (size_t)nt * 8 * SA + (size_t)(kb + j) * 64);
                    mma(acc[nt], ca[j].x, cb[j].x, ca[j].y, cb[j].y, b.x, b.y);
                    mma(acc[nt], ca[j].z, cb[j].z, ca[j].w, cb[j].w, b.z, b.w);
                }
            }
        }
        const int n0 = t * 16 + g;
#pragma unroll
        for (int nt = 0; nt < M / 8; nt++) {
            const int m = nt * 8 + 2 * q;
            C[(size_t)m * N + n0] = acc[nt][0];
            C[(size_t)(m + 1) * N + n0] = acc[nt][1];
            C[(size_t)m * N + n0 + 8] = acc[nt][2];
            C[(size_t)(m + 1) * N + n0 + 8] = acc[nt][3];
        }
        t = nt_;
    }
    /* the last warp out resets the counters (every warp has taken its last, failed, tile) */
    if (lane == 0) {
        const unsigned warps = gridDim.x * NW;
        if (atomicAdd(ctr + 1, 1u) == warps - 1) {
            ctr[0] = 0;
            __threadfence();
            ctr[1] = 0;
        }
    }
}

template <int M, int NW, int ST = 4, int HINT = 0>
static int run(const char *name, int N, int K, int sms, cublasHandle_t hb, cudaStream_t st, double copy_gbs) {
    const size_t wel = (size_t)N * K;
    const int L = std::max(4, (int)((400ull << 20) / (wel * 2)) + 1); /* weight copies: more than 6 x the L2 */
    __nv_bfloat16 *W, *A;
    float *C0, *C1;
    CK(cudaMalloc(&W, wel * 2 * L));
    CK(cudaMalloc(&A, (size_t)M * K * 2));
    CK(cudaMalloc(&C0, (size_t)M * N * 4 * L));
    CK(cudaMalloc(&C1, (size_t)M * N * 4 * L));
    fill_kernel<<<1024, 256>>>(W, wel * L, 0x1234u + N);
    fill_kernel<<<64, 256>>>(A, (size_t)M * K, 0x777u + K);
    CK(cudaMemset(C0, 0xff, (size_t)M * N * 4 * L)); /* poison: NaN */
    CK(cudaMemset(C1, 0xff, (size_t)M * N * 4 * L));
    const size_t smem = (size_t)M * (2 * K + 64);
    auto f = skinny_a_kernel<M, NW, ST, HINT>;
    CK(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    CK(cudaStreamSynchronize(0));
    cublasSetStream(hb, st);
    const float one = 1.f, zero = 0.f;
    auto cub = [&](int l) {
        cublasGemmEx(hb, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &one, W + wel * l, CUDA_R_16BF, K, A, CUDA_R_16BF, K, &zero,
                     C0 + (size_t)M * N * l, CUDA_R_32F, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    };
    auto own = [&](int l) { f<<<sms, NW * 32, smem, st>>>(A, W + wel * l, C1 + (size_t)M * N * l, N, K); };
    for (int l = 0; l < L; l++) cub(l), own(l);
    CK(cudaStreamSynchronize(st));
    CK(cudaGetLastError());
    /* checks: every output against cuBLAS (fp32 sums of the same products, another order), a sample against float64 */
    std::vector<float> c0((size_t)M * N * L), c1((size_t)M * N * L);
    CK(cudaMemcpy(c0.data(), C0, c0.size() * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(c1.data(), C1, c1.size() * 4, cudaMemcpyDeviceToHost));
    double worst = 0, scale = 0;
    size_t nan = 0;
    for (size_t i = 0; i < c0.size(); i++) {
        if (!std::isfinite(c1[i])) nan++;
        scale = std::max(scale, (double)fabs(c0[i]));
        worst = std::max(worst, (double)fabs(c0[i] - c1[i]));
    }
    std::vector<__nv_bfloat16> ha((size_t)M * K), hw(K);
    CK(cudaMemcpy(ha.data(), A, ha.size() * 2, cudaMemcpyDeviceToHost));
    double worst64 = 0;
    for (int s = 0; s < 64; s++) {
        const int l = s % L, n = (int)((s * 2654435761u) % (unsigned)N), m = s % M;
        CK(cudaMemcpy(hw.data(), W + wel * l + (size_t)n * K, K * 2, cudaMemcpyDeviceToHost));
        double r = 0;
        for (int k = 0; k < K; k++) r += (double)bf2f(ha[(size_t)m * K + k]) * bf2f(hw[k]);
        worst64 = std::max(worst64, fabs(r - c1[(size_t)l * M * N + (size_t)m * N + n]) / std::max(1.0, fabs(r)));
    }
    const bool ok = nan == 0 && worst <= 1e-5 * std::max(1.0, scale) * sqrt((double)K) && worst64 < 1e-4;
    const double tc = time_launches(cub, L, st), to = time_launches(own, L, st);
    const double bytes = wel * 2.0;
    printf("%-17s N=%6d K=%5d M=%2d warps %2d stage %d hint %d: cuBLAS %7.2f us (%4.0f GB/s, %3.0f %% of copy)  smem-A form %7.2f us "
           "(%4.0f GB/s, %3.0f %%)  cuBLAS / form %.3f  | max |diff| vs cuBLAS %.2e (max |C| %.1f), vs float64 %.2e, "
           "NaN %zu: %s\n",
           name, N, K, M, NW, ST, HINT, tc, bytes / tc / 1e3, 100 * bytes / tc / 1e3 / copy_gbs, to, bytes / to / 1e3,
           100 * bytes / to / 1e3 / copy_gbs, tc / to, worst, scale, worst64, nan, ok ? "ok" : "FAIL");
    cudaFree(W), cudaFree(A), cudaFree(C0), cudaFree(C1);
    return ok ? 0 : 1;
}

// A step's pair: norm_like_kernel then the product, L pairs in a graph (each product its own weights): the
// norm alone, then with cuBLAS (plain stream order), with the form above in plain order, and as its programmatic
// dependent; the product's share = pair - norm alone. Results checked against cuBLAS.
template <int M, int NW, int ST, int PF>
static int run_step(const char *name, int N, int K, int sms, cublasHandle_t hb, cudaStream_t st) {
    const size_t wel = (size_t)N * K;
    const int L = std::max(4, (int)((400ull << 20) / (wel * 2)) + 1);
    __nv_bfloat16 *W, *A;
    float *C0, *C1, *x;
    unsigned *ctr;
    CK(cudaMalloc(&W, wel * 2 * L));
    CK(cudaMalloc(&A, (size_t)M * K * 2));
    CK(cudaMalloc(&x, (size_t)M * K * 4));
    CK(cudaMalloc(&C0, (size_t)M * N * 4 * L));
    CK(cudaMalloc(&C1, (size_t)M * N * 4 * L));
    CK(cudaMalloc(&ctr, 8));
    CK(cudaMemset(ctr, 0, 8));
    fill_kernel<<<1024, 256>>>(W, wel * L, 0x1234u + N);
    {
        std::vector<float> hx((size_t)M * K);
        for (size_t i = 0; i < hx.size(); i++) hx[i] = (float)((i * 2654435761u) % 2001) / 1000.f - 1.f;
        CK(cudaMemcpy(x, hx.data(), hx.size() * 4, cudaMemcpyHostToDevice));
    }
    CK(cudaMemset(C0, 0xff, (size_t)M * N * 4 * L));
    CK(cudaMemset(C1, 0xff, (size_t)M * N * 4 * L));
    const size_t smem = (size_t)M * (2 * K + 64);
    auto f = skinny_a_pdl_kernel<M, NW, ST, PF>;
    CK(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    CK(cudaDeviceSynchronize());
    cublasSetStream(hb, st);
    const float one = 1.f, zero = 0.f;
    auto norm = [&]() { norm_like_kernel<<<M, 1024, 0, st>>>(x, A, K); };
    auto cub = [&](int l) {
        norm();
        cublasGemmEx(hb, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &one, W + wel * l, CUDA_R_16BF, K, A, CUDA_R_16BF, K, &zero,
                     C0 + (size_t)M * N * l, CUDA_R_32F, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    };
    auto own = [&](int l, bool pdl) {
        norm();
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(sms), cfg.blockDim = dim3(NW * 32), cfg.dynamicSmemBytes = smem, cfg.stream = st;
        cudaLaunchAttribute at[1];
        at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[0].val.programmaticStreamSerializationAllowed = 1;
        if (pdl) cfg.attrs = at, cfg.numAttrs = 1;
        CK(cudaLaunchKernelEx(&cfg, f, (const __nv_bfloat16 *)A, (const __nv_bfloat16 *)(W + wel * l),
                              C1 + (size_t)M * N * l, N, K, ctr));
    };
    for (int l = 0; l < L; l++) cub(l), own(l, true);
    CK(cudaStreamSynchronize(st));
    CK(cudaGetLastError());
    std::vector<float> c0((size_t)M * N * L), c1((size_t)M * N * L);
    CK(cudaMemcpy(c0.data(), C0, c0.size() * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(c1.data(), C1, c1.size() * 4, cudaMemcpyDeviceToHost));
    double worst = 0, scale = 0;
    size_t nan = 0;
    for (size_t i = 0; i < c0.size(); i++) {
        if (!std::isfinite(c1[i])) nan++;
        scale = std::max(scale, (double)fabs(c0[i]));
        worst = std::max(worst, (double)fabs(c0[i] - c1[i]));
    }
    const bool ok = nan == 0 && worst <= 1e-5 * std::max(1.0, scale) * sqrt((double)K);
    const double tn = time_launches([&](int) { norm(); }, L, st);
    const double tc = time_launches(cub, L, st), tp = time_launches([&](int l) { own(l, false); }, L, st),
                 td = time_launches([&](int l) { own(l, true); }, L, st);
    unsigned h[2];
    CK(cudaMemcpy(h, ctr, 8, cudaMemcpyDeviceToHost));
    const double bytes = wel * 2.0;
    printf("step %-17s N=%6d K=%5d M=%2d warps %2d stage %d L2 prefetch %2d: norm alone %5.2f us; norm + cuBLAS %6.2f "
           "(product %6.2f, %4.0f GB/s); + form, plain order %6.2f (%6.2f); + form, programmatic %6.2f (%6.2f, %4.0f "
           "GB/s); cuBLAS / form %.3f | max |diff| %.2e (max |C| %.1f), NaN %zu, counters after %u %u: %s\n",
           name, N, K, M, NW, ST, PF, tn, tc, tc - tn, bytes / (tc - tn) / 1e3, tp, tp - tn, td, td - tn,
           bytes / (td - tn) / 1e3, (tc - tn) / (td - tn), worst, scale, nan, h[0], h[1],
           ok && !h[0] && !h[1] ? "ok" : "FAIL");
    cudaFree(W), cudaFree(A), cudaFree(x), cudaFree(C0), cudaFree(C1), cudaFree(ctr);
    return ok && !h[0] && !h[1] ? 0 : 1;
}

int main() {
    setvbuf(stdout, NULL, _IOLBF, 0);
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    cudaStream_t st;
    CK(cudaStreamCreate(&st));
    cublasHandle_t hb;
    if (cublasCreate(&hb) != CUBLAS_STATUS_SUCCESS) return printf("cublasCreate failed\n"), 1;
    /* the copy floor: 2 GiB device to device, read + write */
    void *x, *y;
    const size_t cb = 1ull << 30;
    CK(cudaMalloc(&x, cb));
    CK(cudaMalloc(&y, cb));
    CK(cudaMemset(x, 1, cb));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    float best = 1e9;
    for (int r = 0; r < 5; r++) {
        CK(cudaEventRecord(e0));
        CK(cudaMemcpy(y, x, cb, cudaMemcpyDeviceToDevice));
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        best = std::min(best, ms);
    }
    cudaFree(x), cudaFree(y);
    const double copy_gbs = 2.0 * cb / (best * 1e-3) / 1e9;
    printf("device: %s, %d SMs; copy floor %.0f GB/s (1 GiB device to device, read + write)\n", prop.name,
           prop.multiProcessorCount, copy_gbs);
    const int sms = prop.multiProcessorCount;
    int bad = 0;
    bad += run<32, 9, 4, 1>("gate|up", 18432, 2304, sms, hb, st, copy_gbs);
    bad += run_step<32, 9, 4, 0>("gate|up", 18432, 2304, sms, hb, st);
    bad += run_step<32, 9, 4, 8>("gate|up", 18432, 2304, sms, hb, st);
    bad += run_step<32, 9, 4, 24>("gate|up", 18432, 2304, sms, hb, st);
    bad += run_step<32, 9, 4, 48>("gate|up", 18432, 2304, sms, hb, st);
    bad += run_step<32, 12, 4, 8>("gate|up", 18432, 2304, sms, hb, st);
    bad += run_step<32, 12, 4, 24>("gate|up", 18432, 2304, sms, hb, st);
    bad += run_step<16, 9, 4, 24>("gate|up", 18432, 2304, sms, hb, st);
    bad += run_step<32, 12, 4, 8>("input projection", 12576, 2304, sms, hb, st);
    bad += run_step<32, 12, 4, 24>("input projection", 12576, 2304, sms, hb, st);
    bad += run_step<32, 12, 4, 8>("head", 163840, 2304, sms, hb, st);
    printf("%s\n", bad ? "CHECKS FAILED" : "ALL CHECKS PASSED");
    cublasDestroy(hb);
    return bad ? 1 : 0;
}
