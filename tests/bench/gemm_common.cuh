// gemm_common.cuh: what the matrix-product benchmarks share (gemm_bench.cu, gemm_lt_bench.cu):
// the 48B preset's decode-step products, random bf16 fills and the copy floor.
#ifndef KD_BENCH_GEMM_COMMON_CUH
#define KD_BENCH_GEMM_COMMON_CUH

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
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

// What both benchmarks run on: device 0, a non-blocking stream, a cuBLAS handle on it with a
// workspace.
struct BenchEnv {
    cudaDeviceProp prop;
    cudaStream_t st = nullptr;
    cublasHandle_t blas = nullptr;
    void *ws = nullptr;
};

// Checks the command line (OUT_PREFIX COMMIT COMMAND) and sets *e up: -1 when ready, else the
// exit status (2: usage or no CUDA device, 1: cuBLAS), said on stderr.
static inline int bench_open(int argc, char **argv, size_t ws_bytes, BenchEnv *e) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s OUT_PREFIX COMMIT COMMAND\n", argv[0]);
        return 2;
    }
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) return fprintf(stderr, "no CUDA device\n"), 2;
    CK(cudaGetDeviceProperties(&e->prop, 0));
    CK(cudaStreamCreateWithFlags(&e->st, cudaStreamNonBlocking));
    CK(cudaMalloc(&e->ws, ws_bytes));
    cublasStatus_t s = cublasCreate(&e->blas);
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasSetStream(e->blas, e->st);
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasSetWorkspace(e->blas, e->ws, ws_bytes);
    if (s != CUBLAS_STATUS_SUCCESS) return fprintf(stderr, "cuBLAS set-up: %s\n", cublasGetStatusString(s)), 1;
    return -1;
}

static inline void bench_close(BenchEnv *e) {
    if (e->blas) cublasDestroy(e->blas);
    CK(cudaFree(e->ws));
    CK(cudaStreamDestroy(e->st));
}

// The largest |got - ref| (infinite where got has a NaN), and in *mx the largest |ref|: a product's
// output against the reference product's.
static inline double bench_max_error(const std::vector<float> &got, const std::vector<float> &ref, double *mx) {
    double m = 0, err = 0;
    for (size_t i = 0; i < got.size(); i++) {
        m = std::max(m, (double)fabsf(ref[i]));
        const double d = fabs((double)got[i] - ref[i]);
        err = d != d ? INFINITY : std::max(err, d);
    }
    *mx = m;
    return err;
}

// printf into a string.
static inline std::string bench_fmt(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static inline std::string bench_fmt(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    const int n = vsnprintf(nullptr, 0, fmt, ap);
    va_end(ap);
    std::string s(n > 0 ? (size_t)n : 0, '\0');
    va_start(ap, fmt);
    if (n > 0) vsnprintf(&s[0], (size_t)n + 1, fmt, ap);
    va_end(ap);
    return s;
}

// text into the file at path; false, said on stderr, where it could not be written whole.
static inline bool bench_write(const std::string &path, const std::string &text) {
    FILE *f = fopen(path.c_str(), "w");
    const bool ok = f && fwrite(text.data(), 1, text.size(), f) == text.size();
    if (f && fclose(f) != 0) return fprintf(stderr, "%s: could not be written\n", path.c_str()), false;
    if (!ok) fprintf(stderr, "%s: could not be written\n", path.c_str());
    return ok;
}

// OUT_PREFIX.json and OUT_PREFIX.md (argv as bench_open took it): the markdown a title, the line of
// device, date, commit and command, an introduction and the table; false where a file was not written.
static inline bool bench_write_results(char **argv, const char *device, const char *date, const char *title,
                                       const std::string &intro, const std::string &json, const std::string &md) {
    const std::string pre = argv[1];
    const std::string head = bench_fmt("# %s\n\ndevice: %s; date: %s; commit: %s; command: `%s`\n\n", title, device,
                                       date, argv[2], argv[3]);
    const bool j = bench_write(pre + ".json", json);
    return bench_write(pre + ".md", head + intro + md) && j;
}

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
