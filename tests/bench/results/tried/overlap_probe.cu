// overlap_probe.cu: whether the compute-bound matrix products and the memory-bound state traffic of a large
// decode step run faster side by side on two streams than one after the other (a probe, not built by Bazel):
// nvcc -O3 -std=c++17 -gencode=arch=compute_90,code=[sm_90,compute_90] overlap_probe.cu -lcublas -o overlap_probe
//
// The question behind it (B = 128 s = 3 of the 48B preset, 512 tokens a step): the weight products are bound by
// the tensor cores there (2.5 TFLOP a step), the KDA verify by the memory (2 MiB of state a request and layer, read
// and written). Two half batches as independent forwards on two streams could overlap one half's products with the
// other half's verify. Stand-ins, per layer: the MLP of M activation rows (the first argument, 256 unless
// given: gate|up [18432][2304], then the down projection [2304][9216], bf16, cuBLAS, fp32 outputs) on one stream;
// a copy of 64 requests' states (128 MiB, the grid-stride kernel of copy_forms.cu, 4 loads in flight a thread) on
// the other. L = 20 layers, each its own weights and states (more than the L2). Printed: each alone, both side by
// side, and the overlap (alone + alone - side by side) / the shorter; medians of 7 after a warm-up. Checks: every
// copy against its source, sampled outputs of each product against float64 sums on the host.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <vector>

#define CK(x)                                                                                                          \
    do {                                                                                                               \
        cudaError_t e_ = (x);                                                                                          \
        if (e_ != cudaSuccess) {                                                                                       \
            printf("%s: %s\n", #x, cudaGetErrorString(e_));                                                            \
            exit(1);                                                                                                   \
        }                                                                                                              \
    } while (0)
#define CB(x)                                                                                                          \
    do {                                                                                                               \
        cublasStatus_t s_ = (x);                                                                                       \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                                             \
            printf("%s: cublas status %d\n", #x, (int)s_);                                                             \
            exit(1);                                                                                                   \
        }                                                                                                              \
    } while (0)

constexpr int L = 20, D = 2304, FF = 9216, REQ = 64;
static int M = 256; /* activation rows: the first argument, 256 unless given */
constexpr size_t kStateFloats = (size_t)REQ * 32 * 128 * 128; /* 64 requests x 2 MiB */

template <int U>
__global__ void copy_kernel(const float4 *s, float4 *d, size_t n) {
    const size_t st = (size_t)gridDim.x * blockDim.x;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += st * U) {
        float4 v[U];
#pragma unroll
        for (int u = 0; u < U; u++)
            if (i + u * st < n) v[u] = s[i + u * st];
#pragma unroll
        for (int u = 0; u < U; u++)
            if (i + u * st < n) d[i + u * st] = v[u];
    }
}

__global__ void fill_bf16(__nv_bfloat16 *p, size_t n, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t x = (uint32_t)i * 2654435761u ^ seed;
        x ^= x >> 15, x *= 2246822519u, x ^= x >> 13;
        p[i] = __float2bfloat16_rn(((float)(x & 0xffff) / 65536.f - 0.5f) * 0.25f);
    }
}

__global__ void fill_f32(float *p, size_t n, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t x = (uint32_t)i * 2246822519u ^ seed;
        x ^= x >> 16, x *= 2654435761u, x ^= x >> 13;
        p[i] = (float)(x & 0xffffff) / 16777216.f - 0.5f;
    }
}

struct Work {
    std::vector<__nv_bfloat16 *> wgu, wd;
    std::vector<float *> src, dst;
    __nv_bfloat16 *a = nullptr, *act = nullptr; /* the MLP's input [M][D], its SwiGLU stand-in [M][FF] */
    float *gu = nullptr, *out = nullptr;        /* gate|up's output [M][2 FF], the down projection's [M][D] */
    int copy_blocks = 0;
};

static void products(cublasHandle_t h, const Work &w, cudaStream_t s) {
    const float one = 1.f, zero = 0.f;
    CB(cublasSetStream(h, s));
    for (int l = 0; l < L; l++) {
        CB(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, 2 * FF, M, D, &one, w.wgu[l], CUDA_R_16BF, D, w.a, CUDA_R_16BF, D,
                        &zero, w.gu, CUDA_R_32F, 2 * FF, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        CB(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, D, M, FF, &one, w.wd[l], CUDA_R_16BF, FF, w.act, CUDA_R_16BF, FF,
                        &zero, w.out, CUDA_R_32F, D, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
}

static void copies(const Work &w, cudaStream_t s) {
    for (int l = 0; l < L; l++)
        copy_kernel<4><<<w.copy_blocks, 256, 0, s>>>((const float4 *)w.src[l], (float4 *)w.dst[l], kStateFloats / 4);
    CK(cudaGetLastError());
}

/* mode 0: products alone, 1: copies alone, 2: both side by side (fork and join through events), 3: one after
 * the other on one stream */
static double run(cublasHandle_t h, const Work &w, cudaStream_t a, cudaStream_t b, int mode) {
    cudaEvent_t t0, t1, fork, join;
    CK(cudaEventCreate(&t0));
    CK(cudaEventCreate(&t1));
    CK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
    CK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
    CK(cudaEventRecord(t0, a));
    if (mode == 0 || mode == 3) products(h, w, a);
    if (mode == 1 || mode == 3) copies(w, a);
    if (mode == 2) {
        CK(cudaEventRecord(fork, a));
        CK(cudaStreamWaitEvent(b, fork, 0));
        products(h, w, a);
        copies(w, b);
        CK(cudaEventRecord(join, b));
        CK(cudaStreamWaitEvent(a, join, 0));
    }
    CK(cudaEventRecord(t1, a));
    CK(cudaEventSynchronize(t1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, t0, t1));
    CK(cudaEventDestroy(t0));
    CK(cudaEventDestroy(t1));
    CK(cudaEventDestroy(fork));
    CK(cudaEventDestroy(join));
    return ms;
}

static float bf(__nv_bfloat16 x) { return __bfloat162float(x); }

/* sampled outputs of the last layer's products (run once more alone) against float64 sums */
static int check_products(cublasHandle_t h, Work &w, cudaStream_t s) {
    products(h, w, s);
    CK(cudaStreamSynchronize(s));
    std::vector<__nv_bfloat16> a((size_t)M * D), act((size_t)M * FF), wg(D), wdr(FF);
    std::vector<float> gu((size_t)M * 2 * FF), out((size_t)M * D);
    CK(cudaMemcpy(a.data(), w.a, a.size() * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(act.data(), w.act, act.size() * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(gu.data(), w.gu, gu.size() * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(out.data(), w.out, out.size() * 4, cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int t = 0; t < 64; t++) {
        const int m = (t * 37) % M, n = (t * 7919) % (2 * FF), nd = (t * 613) % D;
        CK(cudaMemcpy(wg.data(), w.wgu[L - 1] + (size_t)n * D, D * 2, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(wdr.data(), w.wd[L - 1] + (size_t)nd * FF, FF * 2, cudaMemcpyDeviceToHost));
        double r1 = 0, s1 = 0, r2 = 0, s2 = 0;
        for (int k = 0; k < D; k++) {
            const double p = (double)bf(a[(size_t)m * D + k]) * bf(wg[k]);
            r1 += p, s1 += fabs(p);
        }
        for (int k = 0; k < FF; k++) {
            const double p = (double)bf(act[(size_t)m * FF + k]) * bf(wdr[k]);
            r2 += p, s2 += fabs(p);
        }
        const double e1 = fabs(gu[(size_t)m * 2 * FF + n] - r1), e2 = fabs(out[(size_t)m * D + nd] - r2);
        if (!(e1 <= 1e-4 * s1 + 1e-6) || !(e2 <= 1e-4 * s2 + 1e-6)) {
            if (bad < 5) printf("MISMATCH m %d: gate|up[%d] %.6g vs %.6g, down[%d] %.6g vs %.6g\n", m, n,
                                gu[(size_t)m * 2 * FF + n], r1, nd, out[(size_t)m * D + nd], r2);
            bad++;
        }
    }
    return bad;
}

static int check_copies(const Work &w) {
    int bad = 0;
    std::vector<float> x(kStateFloats), y(kStateFloats);
    for (int l : {0, L - 1}) {
        CK(cudaMemcpy(x.data(), w.src[l], kStateFloats * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(y.data(), w.dst[l], kStateFloats * 4, cudaMemcpyDeviceToHost));
        if (x != y) printf("MISMATCH copy of layer %d\n", l), bad++;
    }
    return bad;
}

int main(int argc, char **argv) {
    if (argc > 1) M = atoi(argv[1]);
    if (M < 1 || M > 4096) {
        printf("usage: overlap_probe [rows 1-4096]\n");
        return 2;
    }
    int dev = 0, sms = 0;
    CK(cudaSetDevice(dev));
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, dev));
    const uint32_t seed = (uint32_t)time(nullptr); /* fresh data each run */
    printf("device: %s, %d SMs, L2 %d MiB; seed %u\n", prop.name, sms, prop.l2CacheSize >> 20, seed);
    Work w;
    for (int l = 0; l < L; l++) {
        __nv_bfloat16 *p, *q;
        float *s, *d;
        CK(cudaMalloc(&p, (size_t)2 * FF * D * 2));
        CK(cudaMalloc(&q, (size_t)D * FF * 2));
        CK(cudaMalloc(&s, kStateFloats * 4));
        CK(cudaMalloc(&d, kStateFloats * 4));
        fill_bf16<<<1024, 256>>>(p, (size_t)2 * FF * D, seed + 11u * l + 1u);
        fill_bf16<<<1024, 256>>>(q, (size_t)D * FF, seed + 11u * l + 2u);
        fill_f32<<<1024, 256>>>(s, kStateFloats, seed + 11u * l + 3u);
        CK(cudaMemset(d, 0xff, kStateFloats * 4)); /* poisoned: the checks see what the copies wrote */
        w.wgu.push_back(p), w.wd.push_back(q), w.src.push_back(s), w.dst.push_back(d);
    }
    CK(cudaMalloc(&w.a, (size_t)M * D * 2));
    CK(cudaMalloc(&w.act, (size_t)M * FF * 2));
    CK(cudaMalloc(&w.gu, (size_t)M * 2 * FF * 4));
    CK(cudaMalloc(&w.out, (size_t)M * D * 4));
    fill_bf16<<<256, 256>>>(w.a, (size_t)M * D, seed + 7u);
    fill_bf16<<<256, 256>>>(w.act, (size_t)M * FF, seed + 9u);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    cublasHandle_t h;
    CB(cublasCreate(&h));
    cudaStream_t a, b;
    CK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));

    const double flop = 2.0 * L * M * ((double)2 * FF * D + (double)D * FF);
    const double bytes = 2.0 * L * kStateFloats * 4;
    int bad = 0;
    printf("rows %d; per step: products %.3f TFLOP (weights %.2f GB), state copies %.2f GB (read + write)\n", M,
           flop / 1e12,
           L * 3.0 * FF * D * 2 / 1e9, bytes / 1e9);
    printf("| copy blocks | products alone ms | TFLOP/s | copies alone ms | GB/s | side by side ms | one stream ms | "
           "overlap |\n|---|---|---|---|---|---|---|---|\n");
    for (int blocks : {sms * 8, sms * 4, sms * 2, sms, sms / 2}) {
        w.copy_blocks = blocks;
        for (int mode = 0; mode < 4; mode++) run(h, w, a, b, mode); /* warm-up */
        std::vector<double> t[4];
        for (int r = 0; r < 7; r++)
            for (int mode = 0; mode < 4; mode++) t[mode].push_back(run(h, w, a, b, mode));
        double med[4];
        for (int mode = 0; mode < 4; mode++) {
            std::sort(t[mode].begin(), t[mode].end());
            med[mode] = t[mode][3];
        }
        const double ov = (med[0] + med[1] - med[2]) / std::min(med[0], med[1]);
        printf("| %d | %.3f | %.0f | %.3f | %.0f | %.3f | %.3f | %.2f |\n", blocks, med[0], flop / med[0] / 1e9, med[1],
               bytes / med[1] / 1e6, med[2], med[3], ov);
        bad += check_copies(w);
        CK(cudaMemset(w.dst[0], 0xff, kStateFloats * 4));
        CK(cudaMemset(w.dst[L - 1], 0xff, kStateFloats * 4));
        CK(cudaDeviceSynchronize());
    }
    w.copy_blocks = sms * 4;
    copies(w, a);
    CK(cudaStreamSynchronize(a));
    bad += check_copies(w) + check_products(h, w, a);
    printf(bad ? "OVERLAP PROBE: %d MISMATCHES\n" : "OVERLAP PROBE DONE (checks passed)\n", bad);
    for (int l = 0; l < L; l++) {
        CK(cudaFree(w.wgu[l]));
        CK(cudaFree(w.wd[l]));
        CK(cudaFree(w.src[l]));
        CK(cudaFree(w.dst[l]));
    }
    CK(cudaFree(w.a));
    CK(cudaFree(w.act));
    CK(cudaFree(w.gu));
    CK(cudaFree(w.out));
    CK(cudaStreamDestroy(a));
    CK(cudaStreamDestroy(b));
    CB(cublasDestroy(h));
    return bad ? 1 : 0;
}
