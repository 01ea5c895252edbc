// launch.cuh: programmatic dependent launches of the CUDA backend's kernels.
//
// A kernel launched with kd_launch_dep starts with kd_dep_start(): it waits for the kernel
// before it in the stream to finish and its writes to be visible (griddepcontrol.wait; a
// no-op in plain stream order), then lets the kernel after it be scheduled
// (griddepcontrol.launch_dependents). The next kernel's blocks are thus set up while this one
// runs (inside a CUDA graph too: the capture keeps the programmatic edges), but none of them
// reads anything written in the stream before its own wait, and a kernel is only scheduled
// once the kernel before it has passed its wait: the chain keeps stream order for every
// byte. Some kernels load before their wait: the skinny GEMM (gemv.cu) and the RMSNorm
// (ops.cu) their weights, which are never written, and the CUDA-core and one-pass KDA
// verifies, the conv kernels (conv.cuh, ops.cu's conv + prepare, where the backend says so:
// kd_cu_conv_args.early) and the gated RMSNorm its gate (gate_early), which rely on the last point
// (what they load early was written two or more kernels back, so it is complete once their
// predecessor has started). The KDA verifies let their successor be scheduled only after their
// own wait, which keeps that point.
// Some blocks never wait: the norms' prefetching blocks (ops.cu prefetch_share) read nothing
// the step writes and write nothing, so they trigger at once and exit. The chain still holds:
// the kernel after waits for the whole grid, whose other blocks waited for the kernel before;
// but a grid made only of such blocks would break it (its successor could start before the
// kernel before it has finished).
//
// Measured and not kept: the norms triggering before their wait, so that the weight product
// after each is scheduled while the product before it finishes: no change in a 48B step on
// the H200, 1.804 vs 1.799 ms at B = 1 (likely because the next product's blocks find no room
// on the SMs before that product's blocks leave;
// tests/bench/results/logs/cuda_bench_h200_early_trigger_tried.log).
#ifndef KD_CUDA_LAUNCH_CUH
#define KD_CUDA_LAUNCH_CUH

#include <cuda_runtime.h>

// 1 (the default): launches are programmatic; 0: plain stream order (kd_kda_pdl; benchmarks).
// Defined in kda.cu.
extern int kd_cuda_pdl;

__device__ __forceinline__ void kd_dep_start() {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

// Asynchronous copies global -> shared (cp.async): no registers held while they land; 4 or 16
// bytes (both ends aligned to it), then commit, wait for all / all but the last group.
__device__ __forceinline__ void cp_async4(float *dst, const float *src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"((unsigned)__cvta_generic_to_shared(dst)), "l"(src));
}
__device__ __forceinline__ void cp_async16(float *dst, const float *src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"((unsigned)__cvta_generic_to_shared(dst)), "l"(src));
}
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_all;" ::: "memory"); }
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait1() { asm volatile("cp.async.wait_group 1;" ::: "memory"); }

template <typename... Kp, typename... Ap>
inline cudaError_t kd_launch_dep(void (*f)(Kp...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, Ap... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid, cfg.blockDim = block, cfg.dynamicSmemBytes = smem, cfg.stream = s;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    if (kd_cuda_pdl) cfg.attrs = at, cfg.numAttrs = 1;
    return cudaLaunchKernelEx(&cfg, f, args...);
}

#endif
