// ksplit_tc.cu: a probe (not built by Bazel) of a tensor-core product in K slices for 9-32 activation rows
// against cuBLAS, on the 48B preset's narrow products (o_proj: N = 2304, K = 4096; the down projection: N = 2304,
// K = 9216), where cuBLAS streams the weights at 47-64 % of the copy's bandwidth at 32 rows
// (results/gemm_h200.md) and the backend takes cuBLASLt in 2 K slices (kd_cu_lt_gemm_split).
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90,code=[sm_90,compute_90] -I. -Ikernels/include
//     tests/bench/results/tried/ksplit_tc.cu kernels/cuda/gemm_lt.cu -lcublasLt -lcublas -o ksplit_tc
//   (from the repository root; gemm_lt.cu also needs kernels/core/lt_table.c and types.c, compiled with
//   -Ikernels/include, on the link line)
// Results: ../logs/ksplit_tc_h200_tried.log (and tried/README.md): slower than the backend's 2 slices at 32 rows.
//
// The form: C[s][M][N] = A[M][sKS .. (s+1)KS) W[N][same]^T for S slices of KS = K / S keys, each slice's sums
// apart (the backend's next RMSNorm adds them: kd_cu_rmsnorm_add). A grid of G x S blocks, one an SM: block
// (b, s) takes the b-th of G equal runs of W's 8-row groups ("octets": N / 8 of them, 8-9 a block at N = 2304,
// G = 33) over slice s, with that slice of A in its shared memory (M x KS bf16: 64 KiB for o_proj, 144 KiB for
// the down projection at 4 slices). Its NOG x NKG warps: warp (og, kg) takes octet group og (OG octets) and the
// 32-key blocks kg, kg + NKG, ...; in a key block lane (g, q) loads 16 bytes of W row g of each of its octets
// (keys 8q..8q+7) straight into registers, DEPTH key blocks of loads in flight, and feeds them to mma m16n8k16
// as the B operand (W rows the n dimension: 8-row granularity, so the octets split evenly over the blocks), the
// activations the A operand from shared memory (one 16-byte load of row g and one of row g + 8 a 16-row tile);
// the 16 keys of each mma permuted alike in both (physical 8q..8q+3 as 2q, 2q + 1, 2q + 8, 2q + 9). The warps'
// partial sums over their key blocks are added in shared memory in kg order (fixed: the bits do not depend on
// timing). W's first DEPTH key blocks are loaded before griddepcontrol.wait (W is never written).
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
#include "kernels/cuda/gemm_lt.cuh"
#include "tests/bench/results/tried/probe.cuh"

__device__ __forceinline__ uint4 ld_wt(const uint4 *p) {
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
}
// Shared memory of a launch: the A slice (rows of 2 KS + 64 bytes: rows g and g + 1 of a load phase in distinct
// banks), later the warps' partial sums [NKG][16 MT][NOG OG 8] floats.
template <int MT, int NOG, int NKG, int OG>
static size_t ks_smem(int KS) {
    const size_t a = (size_t)16 * MT * (2 * KS + 64), r = (size_t)NKG * 16 * MT * NOG * OG * 8 * 4;
    return std::max(a, r);
}

// A [M][lda], W [N][ldw] bf16; C [S][M][N] fp32 (S = gridDim.y). M <= 16 MT; N % 8 == 0; K % (32 S) == 0; each
// block's octets at most NOG x OG.
template <int MT, int NOG, int NKG, int OG, int DEPTH, int DA>
__global__ void __launch_bounds__(NOG *NKG * 32, 1)
    ks_kernel(const __nv_bfloat16 *__restrict__ A, int lda, const __nv_bfloat16 *__restrict__ W, int ldw,
              float *__restrict__ C, int M, int N, int K) {
    extern __shared__ __align__(16) uint8_t sm[];
    constexpr int NW = NOG * NKG, MR = 16 * MT;
    const int S = gridDim.y, s = blockIdx.y, G = gridDim.x, b = blockIdx.x;
    const int NO = N / 8, o0 = (int)((int64_t)b * NO / G), no = (int)((int64_t)(b + 1) * NO / G) - o0;
    const int KS = K / S, k0 = s * KS, nkb = KS / 32, SA = 2 * KS + 64;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, q = lane % 4;
    const int og = warp % NOG, kg = warp / NOG;
    const int ob = og * OG, nog = no - ob < OG ? no - ob : OG; /* this warp's octets: [ob, ob + nog) of the block's */
    const uint4 *wp = (const uint4 *)(W + (size_t)((o0 + ob) * 8 + g) * ldw + k0) + q;
    const size_t ostep = (size_t)ldw; /* uint4s between octets: 8 rows of ldw bf16 */
    uint4 wb[DEPTH][OG], ab[DEPTH][MT][2];
    float acc[OG][MT][4];
#pragma unroll
    for (int o = 0; o < OG; o++)
#pragma unroll
        for (int t = 0; t < MT; t++) acc[o][t][0] = acc[o][t][1] = acc[o][t][2] = acc[o][t][3] = 0.f;
    const int mine = kg < nkb ? (nkb - kg + NKG - 1) / NKG : 0; /* key blocks kg + j NKG, j < mine */
    auto issue = [&](int j, uint4(&dst)[OG]) {
        const uint4 *p = wp + (size_t)(kg + j * NKG) * 4;
#pragma unroll
        for (int o = 0; o < OG; o++)
            if (o < nog) dst[o] = ld_wt(p + (size_t)o * ostep);
    };
    auto issue_a = [&](int j, uint4(&dst)[MT][2]) { /* DA: this key block's activation fragments */
        const int kb = kg + j * NKG;
#pragma unroll
        for (int t = 0; t < MT; t++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int r = 16 * t + 8 * h + g;
                dst[t][h] = make_uint4(0, 0, 0, 0);
                if (r < M) dst[t][h] = *(const uint4 *)(A + (size_t)r * lda + k0 + kb * 32 + 8 * q);
            }
    };
#pragma unroll
    for (int d = 0; d < DEPTH; d++)
        if (d < mine) issue(d, wb[d]);
    asm volatile("griddepcontrol.wait;" ::: "memory");
    if constexpr (DA) {
#pragma unroll
        for (int d = 0; d < DEPTH; d++)
            if (d < mine) issue_a(d, ab[d]);
    }
    if constexpr (!DA) { /* the A slice: rows < M from A, rows M..MR-1 zero */
        const int c16 = KS / 8;
        for (int i = tid; i < MR * c16; i += NW * 32) {
            const int r = i / c16, c = i % c16;
            uint8_t *dst = sm + (size_t)r * SA + c * 16;
            if (r < M) cp16(dst, A + (size_t)r * lda + k0 + c * 8);
            else *(uint4 *)dst = make_uint4(0, 0, 0, 0);
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
        asm volatile("cp.async.wait_all;" ::: "memory");
    }
    __syncthreads();
    const uint8_t *arow = sm + (size_t)g * SA + q * 16;
    auto compute = [&](int j, const uint4(&w)[OG], const uint4(&a)[MT][2]) {
        const int kb = kg + j * NKG;
#pragma unroll
        for (int t = 0; t < MT; t++) {
            const uint4 a0 = DA ? a[t][0] : *(const uint4 *)(arow + (size_t)(16 * t) * SA + kb * 64);
            const uint4 a1 = DA ? a[t][1] : *(const uint4 *)(arow + (size_t)(16 * t + 8) * SA + kb * 64);
#pragma unroll
            for (int o = 0; o < OG; o++)
                if (o < nog) {
                    mma(acc[o][t], a0.x, a1.x, a0.y, a1.y, w[o].x, w[o].y);
                    mma(acc[o][t], a0.z, a1.z, a0.w, a1.w, w[o].z, w[o].w);
                }
        }
    };
    for (int j0 = 0; j0 < mine; j0 += DEPTH) {
#pragma unroll
        for (int d = 0; d < DEPTH; d++) {
            const int j = j0 + d;
            if (j < mine) {
                compute(j, wb[d], ab[d]);
                if (j + DEPTH < mine) {
                    issue(j + DEPTH, wb[d]);
                    if constexpr (DA) issue_a(j + DEPTH, ab[d]);
                }
            }
        }
    }
    __syncthreads(); /* every warp done with the A slice: its room takes the partial sums */
    float *red = (float *)sm;
    constexpr int RC = NOG * OG * 8; /* columns of a partial-sum row */
#pragma unroll
    for (int o = 0; o < OG; o++)
        if (o < nog)
#pragma unroll
            for (int t = 0; t < MT; t++) {
                float *r0 = red + ((size_t)kg * MR + 16 * t + g) * RC + (ob + o) * 8 + 2 * q;
                r0[0] = acc[o][t][0], r0[1] = acc[o][t][1];
                r0[8 * RC] = acc[o][t][2], r0[8 * RC + 1] = acc[o][t][3];
            }
    __syncthreads();
    const int cols = no * 8;
    float *cs = C + (size_t)s * M * N + (size_t)o0 * 8;
    for (int i = tid; i < M * cols; i += NW * 32) {
        const int m = i / cols, c = i % cols;
        float v = 0.f;
#pragma unroll
        for (int k = 0; k < NKG; k++) v += red[((size_t)k * MR + m) * RC + c];
        cs[(size_t)m * N + c] = v;
    }
}

struct ctx {
    int sms;
    cublasHandle_t hb;
    kd_cu_lt *lt;
    void *ws;
    cudaStream_t st;
    double copy_gbs;
};

// The products of one shape: cublasGemmEx whole, the backend's cuBLASLt in 2 K slices, the form above in S slices;
// each alone (L launches in a graph, each on its own copy of W) and after norm_like_kernel (the form as its
// programmatic dependent). Checked: every slice sum against cublasGemmEx, a sample against float64.
template <int MT, int NOG, int NKG, int OG, int DEPTH, int DA = 0>
static int run(const ctx &x, const char *name, int N, int K, int M, int S) {
    const size_t wel = (size_t)N * K;
    const int L = std::max(4, (int)((400ull << 20) / (wel * 2)) + 1); /* weight copies: more than 6 x the L2 */
    const int G = x.sms / S;
    if ((N / 8 + G - 1) / G > NOG * OG || K % (32 * S) || M > 16 * MT) {
        printf("%s M=%d S=%d: shape outside the form's bounds\n", name, M, S);
        return 1;
    }
    __nv_bfloat16 *W, *A;
    float *C0, *C1, *C2, *xs;
    CK(cudaMalloc(&W, wel * 2 * L));
    CK(cudaMalloc(&A, (size_t)M * K * 2));
    CK(cudaMalloc(&xs, (size_t)M * K * 4));
    CK(cudaMalloc(&C0, (size_t)M * N * 4 * L));
    CK(cudaMalloc(&C1, (size_t)M * N * 4 * L * S));
    CK(cudaMalloc(&C2, (size_t)M * N * 4 * L * 2));
    fill_kernel<<<1024, 256>>>(W, wel * L, 0x1234u + N + K);
    {
        std::vector<float> hx((size_t)M * K);
        for (size_t i = 0; i < hx.size(); i++) hx[i] = (float)((i * 2654435761u + K) % 2001) / 1000.f - 1.f;
        CK(cudaMemcpy(xs, hx.data(), hx.size() * 4, cudaMemcpyHostToDevice));
    }
    norm_like_kernel<<<M, 1024>>>(xs, A, K);
    CK(cudaMemset(C0, 0xff, (size_t)M * N * 4 * L)); /* poison: NaN */
    CK(cudaMemset(C1, 0xff, (size_t)M * N * 4 * L * S));
    CK(cudaMemset(C2, 0xff, (size_t)M * N * 4 * L * 2));
    const size_t smem = ks_smem<MT, NOG, NKG, OG>(K / S);
    auto f = ks_kernel<MT, NOG, NKG, OG, DEPTH, DA>;
    CK(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    CK(cudaDeviceSynchronize());
    cublasSetStream(x.hb, x.st);
    const float one = 1.f, zero = 0.f;
    auto norm = [&]() { norm_like_kernel<<<M, 1024, 0, x.st>>>(xs, A, K); };
    auto cub = [&](int l) {
        cublasGemmEx(x.hb, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &one, W + wel * l, CUDA_R_16BF, K, A, CUDA_R_16BF, K,
                     &zero, C0 + (size_t)M * N * l, CUDA_R_32F, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    };
    auto lt2 = [&](int l) {
        kd_cu_lt_gemm_split(x.lt, M, N, K, A, K, W + wel * l, K, 2, C2 + (size_t)M * N * 2 * l, x.ws, KD_LT_WORKSPACE,
                            x.st);
    };
    auto own = [&](int l, bool pdl) {
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(G, S), cfg.blockDim = dim3(NOG * NKG * 32), cfg.dynamicSmemBytes = smem, cfg.stream = x.st;
        cudaLaunchAttribute at[1];
        at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[0].val.programmaticStreamSerializationAllowed = 1;
        if (pdl) cfg.attrs = at, cfg.numAttrs = 1;
        CK(cudaLaunchKernelEx(&cfg, f, (const __nv_bfloat16 *)A, K, (const __nv_bfloat16 *)(W + wel * l), K,
                              C1 + (size_t)M * N * S * l, M, N, K));
    };
    for (int l = 0; l < L; l++) cub(l), lt2(l), own(l, false);
    CK(cudaStreamSynchronize(x.st));
    CK(cudaGetLastError());
    std::vector<float> c0((size_t)M * N * L), c1((size_t)M * N * L * S), c2((size_t)M * N * L * 2);
    CK(cudaMemcpy(c0.data(), C0, c0.size() * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(c1.data(), C1, c1.size() * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(c2.data(), C2, c2.size() * 4, cudaMemcpyDeviceToHost));
    double worst = 0, worst2 = 0, scale = 0;
    size_t nan = 0;
    for (int l = 0; l < L; l++)
        for (size_t i = 0; i < (size_t)M * N; i++) {
            double v = 0, v2 = 0;
            for (int k = 0; k < S; k++) {
                const float e = c1[((size_t)l * S + k) * M * N + i];
                if (!std::isfinite(e)) nan++;
                v += e;
            }
            for (int k = 0; k < 2; k++) v2 += c2[((size_t)l * 2 + k) * M * N + i];
            const double r = c0[(size_t)l * M * N + i];
            scale = std::max(scale, fabs(r));
            worst = std::max(worst, fabs(v - r)), worst2 = std::max(worst2, fabs(v2 - r));
        }
    std::vector<__nv_bfloat16> ha((size_t)M * K), hw(K);
    CK(cudaMemcpy(ha.data(), A, ha.size() * 2, cudaMemcpyDeviceToHost));
    double worst64 = 0;
    for (int smp = 0; smp < 96; smp++) {
        const int l = smp % L, n = (int)((smp * 2654435761u) % (unsigned)N), m = (smp * 7) % M;
        CK(cudaMemcpy(hw.data(), W + wel * l + (size_t)n * K, K * 2, cudaMemcpyDeviceToHost));
        double r = 0, v = 0;
        for (int k = 0; k < K; k++) r += (double)bf2f(ha[(size_t)m * K + k]) * bf2f(hw[k]);
        for (int k = 0; k < S; k++) v += c1[((size_t)l * S + k) * M * N + (size_t)m * N + n];
        worst64 = std::max(worst64, fabs(r - v) / std::max(1.0, fabs(r)));
    }
    const bool ok = nan == 0 && worst <= 1e-5 * std::max(1.0, scale) * sqrt((double)K) && worst64 < 1e-4;
    const double tc = time_launches(cub, L, x.st), t2 = time_launches(lt2, L, x.st),
                 to = time_launches([&](int l) { own(l, false); }, L, x.st);
    const double tn = time_launches([&](int) { norm(); }, L, x.st);
    const double tn2 = time_launches(
                     [&](int l) {
                         norm();
                         lt2(l);
                     },
                     L, x.st) -
                 tn;
    const double tnp = time_launches(
                     [&](int l) {
                         norm();
                         own(l, true);
                     },
                     L, x.st) -
                 tn;
    const double bytes = wel * 2.0;
    auto pc = [&](double us) { return 100 * bytes / us / 1e3 / x.copy_gbs; };
    printf("%-14s N=%5d K=%5d M=%2d S=%d MT=%d warps %dx%d OG=%d depth %d A %s: cuBLAS %6.2f us (%3.0f %%), "
           "Lt 2 slices "
           "%6.2f (%3.0f %%), form %6.2f (%3.0f %%), Lt2 / form %.3f; after a norm: Lt2 %6.2f, form (dependent) "
           "%6.2f (%3.0f %%), Lt2 / form %.3f | max |sum - cuBLAS| %.2e (Lt2 %.2e, max |C| %.1f), vs float64 %.2e, "
           "NaN %zu: %s\n",
           name, N, K, M, S, MT, NOG, NKG, OG, DEPTH, DA ? "direct" : "smem", tc, pc(tc), t2, pc(t2), to, pc(to),
           t2 / to, tn2, tnp, pc(tnp),
           tn2 / tnp, worst, worst2, scale, worst64, nan, ok ? "ok" : "FAIL");
    fflush(stdout);
    cudaFree(W), cudaFree(A), cudaFree(xs), cudaFree(C0), cudaFree(C1), cudaFree(C2);
    return ok ? 0 : 1;
}

int main() {
    ctx x = {};
    cudaDeviceProp pr;
    CK(cudaGetDeviceProperties(&pr, 0));
    x.sms = pr.multiProcessorCount;
    CK(cudaStreamCreateWithFlags(&x.st, cudaStreamNonBlocking));
    if (cublasCreate(&x.hb) != CUBLAS_STATUS_SUCCESS) return 1;
    CK(kd_cu_lt_create(&x.lt));
    CK(cudaMalloc(&x.ws, KD_LT_WORKSPACE));
    {
        const size_t n = 256ull << 20;
        void *a, *b;
        CK(cudaMalloc(&a, n));
        CK(cudaMalloc(&b, n));
        CK(cudaMemset(a, 1, n));
        const double us = time_launches([&](int) { CK(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, x.st)); }, 3,
                                        x.st);
        x.copy_gbs = 2.0 * n / us / 1e3;
        cudaFree(a), cudaFree(b);
    }
    printf("device: %s, %d SMs; copy floor %.0f GB/s (256 MiB device to device in a graph, read + write)\n",
           pr.name, x.sms,
           x.copy_gbs);
    int bad = 0;
    const char *run_sel = getenv("KS_RUN");
    const int sel = run_sel ? atoi(run_sel) : 0;
    if (sel == 0 || sel == 1) { /* run 1 */
        bad |= run<2, 2, 8, 5, 2>(x, "o_proj", 2304, 4096, 32, 4);
        bad |= run<2, 2, 8, 5, 2>(x, "down_proj", 2304, 9216, 32, 4);
        bad |= run<1, 2, 8, 5, 2>(x, "o_proj", 2304, 4096, 16, 4);
        bad |= run<1, 2, 8, 5, 2>(x, "down_proj", 2304, 9216, 16, 4);
    }
    if (sel == 0 || sel == 2) { /* run 2: 8 slices (16 blocks a slice: A re-read by half as many blocks) */
        bad |= run<2, 3, 4, 6, 2>(x, "o_proj", 2304, 4096, 32, 8);
        bad |= run<2, 3, 4, 6, 2>(x, "down_proj", 2304, 9216, 32, 8);
        bad |= run<2, 2, 4, 9, 2>(x, "o_proj", 2304, 4096, 32, 8);
        bad |= run<2, 2, 4, 9, 2>(x, "down_proj", 2304, 9216, 32, 8);
        bad |= run<2, 3, 4, 6, 3>(x, "down_proj", 2304, 9216, 32, 8);
        bad |= run<1, 3, 4, 6, 2>(x, "o_proj", 2304, 4096, 16, 8);
        bad |= run<1, 3, 4, 6, 2>(x, "down_proj", 2304, 9216, 16, 8);
    }
    if (sel == 0 || sel == 3) { /* run 2: activations straight from the L2 into registers */
        bad |= run<2, 1, 8, 9, 2, 1>(x, "o_proj", 2304, 4096, 32, 4);
        bad |= run<2, 1, 8, 9, 2, 1>(x, "down_proj", 2304, 9216, 32, 4);
        bad |= run<2, 2, 6, 5, 2, 1>(x, "o_proj", 2304, 4096, 32, 4);
        bad |= run<2, 2, 6, 5, 2, 1>(x, "down_proj", 2304, 9216, 32, 4);
        bad |= run<2, 2, 4, 9, 2, 1>(x, "o_proj", 2304, 4096, 32, 8);
        bad |= run<2, 2, 4, 9, 2, 1>(x, "down_proj", 2304, 9216, 32, 8);
        bad |= run<1, 2, 8, 5, 2, 1>(x, "o_proj", 2304, 4096, 16, 4);
        bad |= run<1, 2, 8, 5, 2, 1>(x, "down_proj", 2304, 9216, 16, 4);
    }
    printf(bad ? "SOME CHECKS FAILED\n" : "ALL CHECKS PASSED\n");
    kd_cu_lt_destroy(x.lt);
    cublasDestroy(x.hb);
    return bad;
}
