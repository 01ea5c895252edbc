// launch_chain.cu: what a kernel boundary costs in a decode step's chain of small dependent
// kernels, against a grid-wide barrier inside one kernel (a probe, not built by Bazel; its
// question: what a cooperative "megakernel" of a layer's small kernels could save at 1-4 rows).
//   nvcc -O3 -std=c++17 -I. -gencode=arch=compute_90,code=[sm_90,compute_90] \
//        tests/bench/results/tried/launch_chain.cu -o launch_chain          (from the repository root)
//
// Each link reads what the link before wrote (n floats, through the L2) and writes its own, as the
// backend's conv, prepare, verify and norms do at one request. Timed in a CUDA graph of L links,
// median of 15 replays, per link: (a) kernels in plain stream order; (b) kernels as programmatic
// dependents (griddepcontrol.wait, then launch_dependents, like kd_launch_dep); (c) one cooperative
// kernel with a grid-wide barrier between links (cooperative_groups grid.sync); for grids of 1, 32 and
// 132 blocks of 256 threads and 1 or 16 KiB a link. Each variant's last output is checked.
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <vector>

#include "kernels/cuda/ck.cuh"

namespace cg = cooperative_groups;

// out[i] = in[i] * 0.5 + 1 over n floats, grid-stride
__device__ __forceinline__ void link(const float *in, float *out, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) out[i] = in[i] * 0.5f + 1.f;
}

__global__ void plain_kernel(const float *in, float *out, int n) { link(in, out, n); }

__global__ void pdl_kernel(const float *in, float *out, int n) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    link(in, out, n);
}

__global__ void coop_kernel(float *buf, int n, int L) {
    cg::grid_group grid = cg::this_grid();
    for (int l = 0; l < L; l++) {
        link(buf + (size_t)(l % 2) * n, buf + (size_t)((l + 1) % 2) * n, n);
        grid.sync();
    }
}

static bool check(const float *d, int n, int L) {
    std::vector<float> h(n);
    CK(cudaMemcpy(h.data(), d, n * 4, cudaMemcpyDeviceToHost));
    double want = 1.0; /* the start value 1, L links of x / 2 + 1 */
    for (int l = 0; l < L; l++) want = want * 0.5 + 1.0;
    for (int i = 0; i < n; i++)
        if (fabs(h[i] - want) > 1e-5) return false;
    return true;
}

// f<<<blocks, 256, 0, st>>>(args...) with one launch attribute (programmatic or cooperative) set
template <typename... Kp, typename... Ap>
static void launch_with(cudaLaunchAttributeID id, void (*f)(Kp...), int blocks, cudaStream_t st, Ap... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(blocks), cfg.blockDim = dim3(256), cfg.stream = st;
    cudaLaunchAttribute at[1];
    at[0].id = id;
    if (id == cudaLaunchAttributeCooperative) at[0].val.cooperative = 1;
    else at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at, cfg.numAttrs = 1;
    CK(cudaLaunchKernelEx(&cfg, f, args...));
}

__global__ void ones(float *p, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) p[i] = 1.f;
}

int main() {
    setvbuf(stdout, NULL, _IOLBF, 0);
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
    cudaStream_t st;
    CK(cudaStreamCreate(&st));
    const int L = 200;
    int bad = 0;
    for (int kib : {1, 16}) {
        const int n = kib * 256;
        float *buf;
        CK(cudaMalloc(&buf, (size_t)2 * n * 4));
        for (int blocks : {1, 32, prop.multiProcessorCount}) {
            double us[3];
            bool ok[3];
            for (int v = 0; v < 3; v++) {
                ones<<<64, 256, 0, st>>>(buf, n);
                CK(cudaStreamSynchronize(st));
                cudaGraph_t gph;
                cudaGraphExec_t ge;
                CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
                if (v < 2) {
                    for (int l = 0; l < L; l++) {
                        const float *in = buf + (size_t)(l % 2) * n;
                        float *out = buf + (size_t)((l + 1) % 2) * n;
                        if (v == 0) {
                            plain_kernel<<<blocks, 256, 0, st>>>(in, out, n);
                        } else {
                            launch_with(cudaLaunchAttributeProgrammaticStreamSerialization, pdl_kernel, blocks, st, in,
                                        out, n);
                        }
                    }
                } else {
                    launch_with(cudaLaunchAttributeCooperative, coop_kernel, blocks, st, buf, n, L);
                }
                CK(cudaStreamEndCapture(st, &gph));
                CK(cudaGraphInstantiate(&ge, gph, 0));
                /* one replay from the start value, checked; then the timing (values keep changing: no matter) */
                CK(cudaGraphLaunch(ge, st));
                CK(cudaStreamSynchronize(st));
                ok[v] = check(buf + (size_t)(L % 2) * n, n, L);
                us[v] = time_graph(ge, st, 15) * 1e3 / L;
                cudaGraphExecDestroy(ge), cudaGraphDestroy(gph);
            }
            printf("%2d KiB a link, %3d blocks: plain stream order %.2f us a link, programmatic %.2f, "
                   "grid barrier %.2f "
                   "(checks %s %s %s)\n",
                   kib, blocks, us[0], us[1], us[2], ok[0] ? "ok" : "FAIL", ok[1] ? "ok" : "FAIL",
                   ok[2] ? "ok" : "FAIL");
            bad += !ok[0] + !ok[1] + !ok[2];
        }
        cudaFree(buf);
    }
    printf("%s\n", bad ? "CHECKS FAILED" : "ALL CHECKS PASSED");
    return bad ? 1 : 0;
}
