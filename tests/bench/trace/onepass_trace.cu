// onepass_trace.cu: a probe (built by hand, not by Bazel) of the one-pass KDA verify's blocks in time: when
// each block of a launch started, when its prologue's halves ended (threads 0 and 128), when the halves of its
// state tile had landed (after the block's barriers) and when it ended, from %globaltimer (kda.cu's
// KD_KDA_TRACE hooks, compiled only into this probe). It showed the blocks moving in step (the grid's first
// blocks load at once and land together; a start staggered by up to 4 us changed nothing) and the
// prologue ending after the state had landed, hence kd_kda_onepass_sched.
// Build (from the repository root, one command):
//   nvcc -O3 -std=c++17 -DKD_KDA_TRACE -gencode=arch=compute_90,code=[sm_90,compute_90] -I. -Ikernels/include
//     tests/bench/trace/onepass_trace.cu kernels/cuda/kda.cu -o onepass_trace
// Run: onepass_trace [B ...]   (default 128 512). Per B, T, step (keep: fold T and keep the state, the lazy
// checkpoint's first step; write: fold 2T and write it; deferred: fold T and write) and load order
// (kd_kda_onepass_sched 0 / 2, twice, alternated; KD_TRACE_SCHEDS=a,b,...: others; KD_TRACE_T=t: that window
// alone): the graph's time per layer, then from one traced launch the
// means per block of: start -> the tile's first half landed (the prologue included), -> its second half, ->
// the end, the prologue's ends (fold half, window half) after the start; the blocks resident and those
// still waiting for their state, on average and at the 10th / 50th percentile of the launch's time.
// KD_GREEN_SMS=n: on n SMs (kernels/cuda/green.cuh). trace_ab.sh beside it times two builds against each other.
// Built without -DKD_KDA_TRACE it prints the times alone, from the kernels as the backend compiles them (the hooks
// hold a few registers: in some forms ptxas spills with them and not without), which is the build for an A/B of
// times.
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#include <algorithm>
#include <vector>

#include "kernels/cuda/ck.cuh"
#include "kernels/cuda/green.cuh"
#include "kernels/cuda/kda.cuh"

extern "C" void kd_kda_trace_set(const float *state, unsigned long long *buf);

__global__ void fill_kernel(float *p, size_t n, float scale, unsigned seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        unsigned x = (unsigned)i * 2654435761u ^ seed;
        x ^= x >> 13, x *= 0x5bd1e995u, x ^= x >> 15;
        p[i] = scale * ((float)(x & 0xffff) / 65536.f - 0.5f);
    }
}
__global__ void decay_kernel(float *p, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = 0.95f + 0.05f * (float)((i * 2654435761u) & 1023) / 1024.f;
}
template <class T> static T *dalloc(size_t n) {
    T *p;
    CK(cudaMalloc(&p, (n ? n : 1) * sizeof(T)));
    return p;
}

int main(int argc, char **argv) {
    std::vector<int> Bs;
    for (int i = 1; i < argc; i++)
        Bs.push_back(atoi(argv[i]));
    if (Bs.empty())
        Bs = {128, 512};
    /* KD_TRACE_T: one window only (1, 2, 4 or 8; default all) */
    int only_t = 0;
    if (!env_int("KD_TRACE_T", 1, 8, &only_t) || (only_t && only_t != 1 && only_t != 2 && only_t != 4 && only_t != 8)) {
        fprintf(stderr, "KD_TRACE_T: 1, 2, 4 or 8\n");
        return 2;
    }
    /* KD_TRACE_SCHEDS: the load orders to compare, in turn (default 0,2,0,2) */
    std::vector<int> scheds = {0, 2, 0, 2};
    if (const char *e = getenv("KD_TRACE_SCHEDS")) {
        scheds.clear();
        for (const char *q = e; *q;) {
            char *end;
            const long v = strtol(q, &end, 10);
            if (end == q || v < 0 || v > 3) {
                fprintf(stderr, "KD_TRACE_SCHEDS: a comma-separated list of 0..3\n");
                return 2;
            }
            scheds.push_back((int)v);
            q = *end == ',' ? end + 1 : end;
        }
    }
    const int green = kd_green_from_env(); /* KD_GREEN_SMS: on part of the SMs (green.cuh) */
    if (green < 0) return 2;
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    if (green) printf("green context (KD_GREEN_SMS): %d SMs; a probe kernel ran on %d\n", green, kd_green_distinct_sms());
    const int HV = 32, H = 32, K = 128, V = 128, RC = 16, nsm = green ? green : prop.multiProcessorCount;
    const size_t per = (size_t)HV * K * V;
    cudaStream_t st;
    CK(cudaStreamCreate(&st));
    printf("device: %s, %d SMs\n", prop.name, nsm);
    for (int B : Bs) {
        const int L = std::max(1, (int)((256ull << 20) / ((size_t)B * per * 4)));
        const int slots = B + 1, N = B * 8;
        std::vector<kd_kda_args> la(L);
        std::vector<float *> bufs;
        float *tok = dalloc<float>((size_t)N * (2 * H * K + H + HV * K + HV * V + HV + HV * V));
        fill_kernel<<<1024, 256>>>(tok, (size_t)N * (2 * H * K + H + HV * K + HV * V + HV + HV * V), 0.6f, 7);
        float *p = tok;
        const float *qn = p;
        p += (size_t)N * H * K;
        const float *kn = p;
        p += (size_t)N * H * K;
        const float *qk = p;
        p += (size_t)N * H;
        float *dec = p;
        p += (size_t)N * HV * K;
        const float *vv = p;
        p += (size_t)N * HV * V;
        float *bt = p;
        p += (size_t)N * HV;
        float *o = p;
        decay_kernel<<<1024, 256>>>(dec, (size_t)N * HV * K);
        fill_kernel<<<64, 256>>>(bt, (size_t)N * HV, 1.f, 3);
        for (int l = 0; l < L; l++) {
            kd_kda_args &a = la[l];
            a = {};
            a.H = H, a.HV = HV, a.K = K, a.V = V, a.n_rows = B;
            a.state = dalloc<float>((size_t)slots * per);
            a.rec_u = dalloc<float>((size_t)slots * RC * HV * V);
            a.rec_kg = dalloc<float>((size_t)slots * 2 * RC * HV * 2 * K);
            fill_kernel<<<1024, 256>>>(a.state, (size_t)slots * per, 0.2f, 11 + l);
            fill_kernel<<<1024, 256>>>(a.rec_u, (size_t)slots * RC * HV * V, 0.6f, 101 + l);
            decay_kernel<<<1024, 256>>>(a.rec_kg, (size_t)slots * 2 * RC * HV * 2 * K);
            a.qn = qn, a.kn = kn, a.qk = qk, a.decay = dec, a.beta = bt, a.v = vv, a.o = o;
            bufs.push_back(a.state), bufs.push_back(a.rec_u), bufs.push_back(a.rec_kg);
        }
        kd_kda_row *drows = dalloc<kd_kda_row>(B);
        const size_t nblk = (size_t)B * HV;
        unsigned long long *dtr = dalloc<unsigned long long>(nblk * 8);
        std::vector<unsigned long long> tr(nblk * 8);
        for (int T : {1, 2, 4, 8})
            for (int step = 0; step < 3; step++) { /* 0 keep, 1 write, 2 deferred */
                if (only_t && T != only_t) continue;
                std::vector<kd_kda_row> rows(B);
                for (int r = 0; r < B; r++)
                    rows[r] = {r, r * T, T, step == 1 ? 2 * T : T, 0, 0, step == 0, nullptr};
                CK(cudaMemcpy(drows, rows.data(), B * sizeof(kd_kda_row), cudaMemcpyHostToDevice));
                for (int sched : scheds) {
                    kd_kda_onepass_sched(sched);
                    cudaGraph_t gph;
                    cudaGraphExec_t ge;
                    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
                    for (int l = 0; l < L; l++) {
                        kd_kda_args a2 = la[l];
                        a2.Tw = step == 2 ? T : 2 * T, a2.rows = drows;
                        CK((cudaError_t)kd_kda_verify(&a2, KD_KDA_DEFERRED, T, st));
                    }
                    CK(cudaStreamEndCapture(st, &gph));
                    CK(cudaGraphInstantiate(&ge, gph, 0));
                    printf("B=%3d T=%d %-8s sched %d", B, T,
                           step == 0   ? "keep"
                           : step == 1 ? "write"
                                       : "deferred",
                           sched);
                    printf(" %7.2f us", time_graph(ge, st, 20) * 1e3 / L);
#ifdef KD_KDA_TRACE
                    /* one traced replay: the middle layer */
                    CK(cudaMemset(dtr, 0, nblk * 8 * 8));
                    kd_kda_trace_set(la[L / 2].state, dtr);
                    CK(cudaGraphLaunch(ge, st));
                    CK(cudaStreamSynchronize(st));
                    kd_kda_trace_set(nullptr, nullptr);
                    CK(cudaMemcpy(tr.data(), dtr, nblk * 8 * 8, cudaMemcpyDeviceToHost));
                    unsigned long long t0 = ~0ull, t1 = 0;
                    double ld = 0, l2 = 0, cp = 0, pf = 0, pw = 0;
                    size_t npf = 0, npw = 0; /* the blocks whose prologue stamps are there and after their start */
                    for (size_t b = 0; b < nblk; b++) {
                        const unsigned long long *e = &tr[b * 8];
                        t0 = std::min(t0, e[1]), t1 = std::max(t1, e[4]);
                        ld += (double)(e[2] - e[1]), l2 += (double)(e[3] - e[2]), cp += (double)(e[4] - e[3]);
                        /* stamps of threads 0 and 128: a window half's stamp was seen missing or before its block's
                         * start in a few blocks (an unsigned difference then reads as ~1.8e19 ns), so those are left
                         * out of the means */
                        if (e[5] >= e[1]) pf += (double)(e[5] - e[1]), npf++;
                        if (e[6] >= e[1]) pw += (double)(e[6] - e[1]), npw++;
                    }
                    /* resident and loading blocks over the launch, 100 ns bins */
                    const size_t nb = (size_t)((t1 - t0) / 100 + 1);
                    std::vector<int> res(nb + 1, 0), lo(nb + 1, 0);
                    for (size_t b = 0; b < nblk; b++) {
                        const unsigned long long *e = &tr[b * 8];
                        for (size_t i = (e[1] - t0) / 100; i <= (e[4] - t0) / 100 && i < nb; i++)
                            res[i]++;
                        for (size_t i = (e[1] - t0) / 100; i <= (e[3] - t0) / 100 && i < nb; i++)
                            lo[i]++;
                    }
                    double rs = 0, ls = 0;
                    for (size_t i = 0; i < nb; i++)
                        rs += res[i], ls += lo[i];
                    std::vector<int> los(lo.begin(), lo.begin() + nb);
                    std::sort(los.begin(), los.end());
                    printf(
                        " | traced %.2f us: load %.2f + %.2f, compute %.2f us a block (prologue done: fold half %.2f, "
                        "window half %.2f); resident %.0f, loading %.0f (p10 %d, p50 %d)\n",
                        (t1 - t0) / 1e3, ld / nblk / 1e3, l2 / nblk / 1e3, cp / nblk / 1e3,
                        npf ? pf / npf / 1e3 : 0.0, npw ? pw / npw / 1e3 : 0.0, rs / nb, ls / nb, los[nb / 10],
                        los[nb / 2]);
#else
                    printf("\n"); /* built without the hooks: the times alone */
#endif
                    fflush(stdout);
                    cudaGraphExecDestroy(ge), cudaGraphDestroy(gph);
                }
                kd_kda_onepass_sched(1);
            }
        for (float *b : bufs)
            cudaFree(b);
        cudaFree(tok), cudaFree(drows), cudaFree(dtr);
    }
    return 0;
}
