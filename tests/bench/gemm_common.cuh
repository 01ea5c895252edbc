// gemm_common.cuh: what the matrix-product benchmarks share (gemm_bench.cu, gemm_lt_bench.cu):
// the 48B preset's decode-step products, random bf16 fills and the copy floor.
#ifndef KD_BENCH_GEMM_COMMON_CUH
#define KD_BENCH_GEMM_COMMON_CUH

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <algorithm>
#include <string>
#include <vector>

#include "kernels/cuda/ck.cuh"

// A product C[M][N] = A[M][K] W[N][K]^T of the Kimi-Linear-48B KDA preset's decode step.
struct BenchShape {
    const char *name;
    int N, K;
};
static const BenchShape kPresetProducts[] = {{"input projection", 12576, 2304}, {"f_proj.1 / g_proj.1", 4096, 128},
                                             {"o_proj", 2304, 4096},           {"gate|up", 18432, 2304},
                                             {"down_proj", 2304, 9216},         {"head", 163840, 2304}};

// Uniform in [-1, 1) from the xorshift state *s.
static inline double bench_urand(uint64_t *s) {
    *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
    return (double)(*s >> 11) * 0x1.0p-52 - 1.0;
}

static inline uint16_t bench_bf16_bits(float x) { /* round to nearest even (finite x) */
    uint32_t u;
    memcpy(&u, &x, 4);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// n bf16 values uniform in [-scale, scale) into device memory d.
static inline void bench_fill_bf16(void *d, size_t n, double scale, uint64_t *s) {
    std::vector<uint16_t> h(n);
    for (auto &x : h) x = bench_bf16_bits((float)(scale * bench_urand(s)));
    CK(cudaMemcpy(d, h.data(), n * 2, cudaMemcpyHostToDevice));
}

// The copy floor: 1 GiB device to device on st (read + write bytes a second), best of 10.
static inline double bench_copy_bandwidth(cudaStream_t st) {
    const size_t bytes = 1ull << 30;
    void *a, *b;
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(cudaMalloc(&a, bytes));
    CK(cudaMalloc(&b, bytes));
    CK(cudaMemset(a, 1, bytes));
    double bw = 0;
    for (int i = 0; i < 11; i++) {
        CK(cudaEventRecord(e0, st));
        CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, st));
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (i) bw = std::max(bw, 2.0 * bytes / (ms * 1e-3));
    }
    CK(cudaFree(a));
    CK(cudaFree(b));
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    return bw;
}

// The weights of one product, L copies (together more than 256 MiB, so that a graph of L
// launches each on its own copy reads them from memory, not the L2), and activations and two
// outputs for up to max_m rows.
struct BenchBuffers {
    size_t wbytes;
    int L;
    std::vector<void *> W;
    void *A = nullptr;
    float *C = nullptr, *Cref = nullptr;
    BenchBuffers(const BenchShape &sh, int max_m, uint64_t *rng)
        : wbytes((size_t)sh.N * sh.K * 2),
          L((int)std::max<size_t>(4, std::min<size_t>(64, (256ull << 20) / wbytes + 1))), W((size_t)L) {
        for (auto &w : W) {
            CK(cudaMalloc(&w, wbytes));
            bench_fill_bf16(w, (size_t)sh.N * sh.K, 1.0 / sqrt((double)sh.K), rng);
        }
        CK(cudaMalloc(&A, (size_t)max_m * sh.K * 2));
        bench_fill_bf16(A, (size_t)max_m * sh.K, 1.0, rng);
        CK(cudaMalloc(&C, (size_t)max_m * sh.N * 4));
        CK(cudaMalloc(&Cref, (size_t)max_m * sh.N * 4));
    }
    BenchBuffers(const BenchBuffers &) = delete;
    BenchBuffers &operator=(const BenchBuffers &) = delete;
    ~BenchBuffers() {
        for (auto &w : W) cudaFree(w);
        cudaFree(A), cudaFree(C), cudaFree(Cref);
    }
};

// A name as a markdown table cell ("gate|up" with its '|' escaped).
static inline std::string bench_md_cell(const char *name) {
    std::string cell = name;
    for (size_t at = cell.find('|'); at != std::string::npos; at = cell.find('|', at + 2)) cell.insert(at, "\\");
    return cell;
}

// The results' JSON up to its rows: device, date (the UTC time now, also in *date), commit,
// command, copy bandwidth.
static inline std::string bench_json_head(const char *device, char (&date)[64], const char *commit,
                                          const char *command, double copy_bw) {
    const time_t t = time(NULL);
    strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", gmtime(&t));
    char buf[256];
    snprintf(buf, sizeof buf, "  \"copy_bandwidth_GBps\": %.1f,\n  \"rows\": [\n", copy_bw / 1e9);
    return "{\n  \"device\": \"" + std::string(device) + "\",\n  \"date\": \"" + date + "\",\n  \"commit\": \"" +
           commit + "\",\n  \"command\": \"" + command + "\",\n" + buf;
}

#endif
