// gemm_bench.cu: the decode-step matrix products of the Kimi-Linear-48B KDA preset at few
// activation rows (M in {1, 4, 8, 32}): cuBLAS (cublasGemmEx, bf16 in, fp32 out, as the CUDA
// backend calls it) against each form of the backend's skinny GEMM kernel (gemv.cuh), and
// against the copy floor measured in the same run. Needs a GPU (run by
// tests/cuda/run_device.sh, not a bazel test):
//   gemm_bench OUT_PREFIX COMMIT COMMAND
// writes OUT_PREFIX.json and OUT_PREFIX.md.
//
// Each product: a CUDA graph of L launches, each on its own copy of the weights (together
// more than 4 times the L2), median of 15 replays, per launch. Bandwidth = weight bytes /
// time (the activations and outputs are small beside them). Each form's output is compared
// with cuBLAS's first (max error relative to the output's largest magnitude).
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <algorithm>
#include <string>
#include <vector>

#include "kernels/cuda/ck.cuh"
#include "kernels/cuda/gemv.cuh"
#include "tests/bench/gemm_common.cuh"

static uint64_t g_rng = 0x243f6a8885a308d3ull; /* the weights' and activations' random fill */

int main(int argc, char **argv) {
    std::vector<int> Ms = {1, 4, 8, 32};
    if (const char *ms = getenv("KD_GEMM_MS")) { /* e.g. "2,3,4": other row counts; read first, before
                                                   * the device is taken */
        Ms.clear();
        const char *c = ms;
        for (;;) {
            char *end = nullptr;
            const long v = strtol(c, &end, 10);
            if (end == c || v < 1 || v > KD_SKINNY_MAX_M || (*end && *end != ',')) {
                fprintf(stderr, "gemm_bench: KD_GEMM_MS: row counts 1..%d separated by commas\n", KD_SKINNY_MAX_M);
                return 2;
            }
            Ms.push_back((int)v);
            if (!*end) break;
            c = end + 1;
        }
    }
    BenchEnv env;
    if (const int rc = bench_open(argc, argv, 32u << 20, &env); rc >= 0) return rc;
    const cudaDeviceProp &prop = env.prop;
    const cudaStream_t st = env.st;
    const cublasHandle_t blas = env.blas;

    const double copy_bw = bench_copy_bandwidth(st); /* the copy floor */
    printf("device: %s; copy floor %.0f GB/s (read + write)\n", prop.name, copy_bw / 1e9);

    const int nforms = KD_SKINNY_FORMS;
    std::string md = "| product | N | K | M | cuBLAS us | cuBLAS GB/s |";
    std::string sep = "|---|---|---|---|---|---|";
    for (int f = 0; f <= nforms; f++) {
        char h[64];
        snprintf(h, sizeof h, " form %d us |", f);
        md += h, sep += "---|";
    }
    md += " best skinny / cuBLAS | best skinny, of copy bandwidth | form 0, weights in the L2 us |\n" + sep +
          "---|---|---|\n";
    char date[64];
    std::string json = bench_json_head(prop.name, date, argv[2], argv[3], copy_bw);
    char buf[4096];
    bool first = true;
    int bad = 0;
    for (const BenchShape &sh : kPresetProducts) {
        BenchBuffers bb(sh, 32, &g_rng);
        const size_t wbytes = bb.wbytes;
        const int L = bb.L;
        const std::vector<void *> &W = bb.W;
        void *const A = bb.A;
        float *const C = bb.C, *const Cref = bb.Cref;
        for (int M : Ms) {
            std::vector<double> us(nforms + 1, -1);
            double cublas_us = 0;
            std::vector<float> ref((size_t)M * sh.N), got((size_t)M * sh.N);
            // form -1: cuBLAS
            for (int f = -1; f <= nforms; f++) {
                const float alpha = 1.f, beta = 0.f;
                auto launch = [&](const void *w, float *c) -> bool {
                    if (f < 0)
                        return cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, sh.N, M, sh.K, &alpha, w, CUDA_R_16BF,
                                            sh.K, A, CUDA_R_16BF, sh.K, &beta, c, CUDA_R_32F, sh.N, CUBLAS_COMPUTE_32F,
                                            CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS;
                    return kd_cu_gemm_skinny_form(f, M, sh.N, sh.K, (const __nv_bfloat16 *)A, sh.K,
                                                  (const __nv_bfloat16 *)w, sh.K, beta, c, sh.N, st) == cudaSuccess;
                };
                // correctness against cuBLAS on the first copy
                CK(cudaMemsetAsync(f < 0 ? Cref : C, 0xff, (size_t)M * sh.N * 4, st));
                if (!launch(W[0], f < 0 ? Cref : C)) {
                    (void)cudaGetLastError();
                    continue; /* this form does not take M */
                }
                CK(cudaStreamSynchronize(st));
                if (f >= 0) {
                    CK(cudaMemcpy(got.data(), C, got.size() * 4, cudaMemcpyDeviceToHost));
                    double mx;
                    const double err = bench_max_error(got, ref, &mx);
                    if (!(err <= 1e-4 * mx)) {
                        printf("MISMATCH %s M=%d form %d: max error %.3g of %.3g\n", sh.name, M, f, err, mx);
                        bad++;
                    }
                } else {
                    CK(cudaMemcpy(ref.data(), Cref, ref.size() * 4, cudaMemcpyDeviceToHost));
                }
                cudaGraph_t g;
                cudaGraphExec_t ge;
                CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
                for (int l = 0; l < L; l++) launch(W[l], C);
                CK(cudaStreamEndCapture(st, &g));
                CK(cudaGraphInstantiate(&ge, g, 0));
                (f < 0 ? cublas_us : us[(size_t)f]) = time_graph(ge, st, 15) * 1e3 / L;
                CK(cudaGraphExecDestroy(ge));
                CK(cudaGraphDestroy(g));
            }
            /* form 0 with the same weights in every launch: from the L2 where they fit in half of it
             * (what a product gains when its weights were prefetched there) */
            double l2_us = -1;
            if (2 * wbytes <= (size_t)prop.l2CacheSize) {
                cudaGraph_t g;
                cudaGraphExec_t ge;
                CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
                for (int l = 0; l < L; l++)
                    kd_cu_gemm_skinny_form(0, M, sh.N, sh.K, (const __nv_bfloat16 *)A, sh.K,
                                           (const __nv_bfloat16 *)W[0], sh.K, 0.f, C, sh.N, st);
                CK(cudaStreamEndCapture(st, &g));
                CK(cudaGraphInstantiate(&ge, g, 0));
                l2_us = time_graph(ge, st, 15) * 1e3 / L;
                CK(cudaGraphExecDestroy(ge));
                CK(cudaGraphDestroy(g));
            }
            double best = 1e30;
            for (int f = 1; f <= nforms; f++)
                if (us[(size_t)f] > 0) best = std::min(best, us[(size_t)f]);
            const double gbs = wbytes / (cublas_us * 1e-6) / 1e9, best_bw = wbytes / (best * 1e-6);
            const std::string cell = bench_md_cell(sh.name);
            snprintf(buf, sizeof buf, "| %s | %d | %d | %d | %.2f | %.0f |", cell.c_str(), sh.N, sh.K, M, cublas_us,
                     gbs);
            md += buf;
            for (int f = 0; f <= nforms; f++) {
                if (us[(size_t)f] > 0) snprintf(buf, sizeof buf, " %.2f |", us[(size_t)f]);
                else snprintf(buf, sizeof buf, " - |");
                md += buf;
            }
            snprintf(buf, sizeof buf, " %.2f | %.0f %% |", best / cublas_us, 100 * best_bw / copy_bw);
            md += buf;
            if (l2_us > 0) snprintf(buf, sizeof buf, " %.2f |\n", l2_us);
            else snprintf(buf, sizeof buf, " - |\n");
            md += buf;
            printf("%-20s N=%6d K=%5d M=%2d cuBLAS %8.2f us (%5.0f GB/s); forms:", sh.name, sh.N, sh.K, M, cublas_us, gbs);
            for (int f = 0; f <= nforms; f++) printf(" %.2f", us[(size_t)f]);
            printf("; form 0 from the L2 %.2f\n", l2_us);
            std::string forms = "[";
            for (int f = 0; f <= nforms; f++) {
                snprintf(buf, sizeof buf, "%s%.3f", f ? ", " : "", us[(size_t)f]);
                forms += buf;
            }
            forms += "]";
            snprintf(buf, sizeof buf,
                     "%s    {\"product\": \"%s\", \"N\": %d, \"K\": %d, \"M\": %d, \"cublas_us\": %.3f, "
                     "\"form_us\": %s, \"form0_l2_us\": %.3f}",
                     first ? "" : ",\n", sh.name, sh.N, sh.K, M, cublas_us, forms.c_str(), l2_us);
            json += buf;
            first = false;
        }
    }
    json += "\n  ]\n}\n";
    const std::string intro = bench_fmt(
        "bf16 weights [N][K] and activations [M][K], fp32 output; a CUDA graph of launches, each on its own copy of "
        "the weights (more than 4 x the L2), median of 15 replays, per launch. Copy floor in the same run: %.0f GB/s "
        "(read + write). Forms: gemv.cuh (0: kd_cu_gemm_skinny's choice, kd_cu_skinny_pick's form where it names "
        "one, else by M). The last column: form 0 with the same weights in every launch, read from the L2 where "
        "they fit in half of it.\n\n",
        copy_bw / 1e9);
    const bool wrote = bench_write_results(argv, prop.name, date,
                                           "Skinny matrix products of the Kimi-Linear-48B KDA preset: cuBLAS vs the "
                                           "backend's kernel",
                                           intro, json, md);
    bench_close(&env);
    printf(bad ? "GEMM BENCH: %d MISMATCHES\n" : "GEMM BENCH DONE\n", bad);
    return bad || !wrote ? 1 : 0;
}
