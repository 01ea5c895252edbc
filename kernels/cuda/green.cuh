// green.cuh: benchmarks only. KD_GREEN_SMS=n runs the calling thread's CUDA work on n of the device's SMs
// (a green context over the primary context, the driver's SM partition; Hopper rounds n up to a multiple of 8).
// What for: a GPU with more bandwidth per SM than the one at hand (an H200 has an H100's 132 SMs and 1.43 x its
// bandwidth) is approximated by giving a kernel fewer SMs on the same memory: 96 SMs of an H100 have 1.375 x,
// 88 have 1.5 x its bandwidth an SM, so the share of a step that compute leaves exposed grows as on the faster
// part. Everything measured in the run (the copy floor included) runs on the partition, so ratios compare like
// with like. The driver's functions come through the runtime's entry-point lookup: nothing links libcuda, and a
// machine without a GPU or an older driver gets a clear error.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The partition's SMs as a kernel sees them: each block writes its SM id; returns how many distinct ids a grid of
 * 16 blocks per SM of the whole device ran on (0 on an error). */
static __global__ void kd_green_smid_kernel(unsigned *seen) { /* static: the header may be in several files */
    unsigned id;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
    if (threadIdx.x == 0 && id < 1024) atomicOr(&seen[id], 1u);
}

static inline int kd_green_distinct_sms(void) {
    int dev = 0, sms = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
        return 0;
    unsigned *d = nullptr, h[1024];
    if (cudaMalloc(&d, sizeof h) != cudaSuccess) return 0;
    int n = 0;
    if (cudaMemset(d, 0, sizeof h) == cudaSuccess) {
        kd_green_smid_kernel<<<16 * sms, 64>>>(d);
        if (cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost) == cudaSuccess)
            for (int i = 0; i < 1024; i++) n += h[i] != 0;
    }
    cudaFree(d);
    return n;
}

/* Reads KD_GREEN_SMS; unset or empty: nothing (returns 0). Otherwise makes a green context of at least that many
 * SMs current to the calling thread and returns its SM count; -1 with a message on stderr when the value is not a
 * count in 8..1024 or the driver cannot make the partition. Call first, before other CUDA work of the thread. */
static inline int kd_green_from_env(void) {
    const char *e = getenv("KD_GREEN_SMS");
    if (!e || !*e) return 0;
    char *end = nullptr;
    const long want = strtol(e, &end, 10);
    if (*end || want < 8 || want > 1024) {
        fprintf(stderr, "KD_GREEN_SMS: '%s' is not an SM count in 8..1024\n", e);
        return -1;
    }
    if (cudaFree(nullptr) != cudaSuccess) { /* the primary context first, as the driver advises */
        fprintf(stderr, "KD_GREEN_SMS: no usable CUDA device\n");
        return -1;
    }
    decltype(&::cuDeviceGetDevResource) get_res = nullptr;
    decltype(&::cuDevSmResourceSplitByCount) split = nullptr;
    decltype(&::cuDevResourceGenerateDesc) gen = nullptr;
    decltype(&::cuGreenCtxCreate) create = nullptr;
    decltype(&::cuCtxFromGreenCtx) to_ctx = nullptr;
    decltype(&::cuCtxSetCurrent) set_cur = nullptr;
    struct {
        const char *name;
        void **fn;
    } want_fns[] = {{"cuDeviceGetDevResource", (void **)&get_res}, {"cuDevSmResourceSplitByCount", (void **)&split},
                    {"cuDevResourceGenerateDesc", (void **)&gen},   {"cuGreenCtxCreate", (void **)&create},
                    {"cuCtxFromGreenCtx", (void **)&to_ctx},       {"cuCtxSetCurrent", (void **)&set_cur}};
    for (auto &w : want_fns) {
        cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
        if (cudaGetDriverEntryPointByVersion(w.name, w.fn, 12040, cudaEnableDefault, &q) != cudaSuccess ||
            q != cudaDriverEntryPointSuccess || !*w.fn) {
            fprintf(stderr, "KD_GREEN_SMS: the driver has no %s (green contexts need a CUDA 12.4 driver)\n", w.name);
            return -1;
        }
    }
    int dev = 0;
    cudaGetDevice(&dev);
    CUdevResource all, part, rest;
    memset(&all, 0, sizeof all), memset(&part, 0, sizeof part), memset(&rest, 0, sizeof rest);
    unsigned groups = 1;
    CUdevResourceDesc desc = nullptr;
    CUgreenCtx g = nullptr;
    CUcontext ctx = nullptr;
    CUresult r = get_res((CUdevice)dev, &all, CU_DEV_RESOURCE_TYPE_SM);
    if (r == CUDA_SUCCESS && (long)all.sm.smCount < want) {
        fprintf(stderr, "KD_GREEN_SMS: %ld SMs asked, the device has %u\n", want, all.sm.smCount);
        return -1;
    }
    if (r == CUDA_SUCCESS) r = split(&part, &groups, &all, &rest, 0, (unsigned)want);
    if (r == CUDA_SUCCESS && groups != 1) r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS) r = gen(&desc, &part, 1);
    if (r == CUDA_SUCCESS) r = create(&g, desc, (CUdevice)dev, CU_GREEN_CTX_DEFAULT_STREAM);
    if (r == CUDA_SUCCESS) r = to_ctx(&ctx, g);
    if (r == CUDA_SUCCESS) r = set_cur(ctx);
    if (r != CUDA_SUCCESS) {
        fprintf(stderr, "KD_GREEN_SMS: the driver could not make a partition of %ld SMs (CUresult %d)\n", want, (int)r);
        return -1;
    }
    return (int)part.sm.smCount; /* the green context lives until the process exits */
}
