// ck.cuh: for the GPU test and benchmark programs: CK(call), a failed CUDA runtime call prints
// where and why and ends the program (exit status 1); time_graph, the median time of a graph's
// replays; env_int, a whole number from the environment, checked.
#ifndef KD_CUDA_CK_CUH
#define KD_CUDA_CK_CUH

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#include <algorithm>
#include <vector>

#define CK(x)                                                                                     \
    do {                                                                                          \
        cudaError_t e_ = (x);                                                                     \
        if (e_ != cudaSuccess) {                                                                  \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));   \
            exit(1);                                                                              \
        }                                                                                         \
    } while (0)

// The environment variable name as a whole number in [lo, hi] into *v (left as it is when unset): true, or false
// with a message when it is set to anything else (not a number, trailing characters, out of range).
static inline bool env_int(const char *name, long lo, long hi, int *v) {
    const char *s = getenv(name);
    if (!s) return true;
    char *end = nullptr;
    const long x = strtol(s, &end, 10);
    if (end == s || *end || x < lo || x > hi) {
        fprintf(stderr, "%s=%s: want a whole number in %ld..%ld\n", name, s, lo, hi);
        return false;
    }
    *v = (int)x;
    return true;
}

// The median of reps replays of ge on st (ms), after one replay to warm up.
static inline double time_graph(cudaGraphExec_t ge, cudaStream_t st, int reps) {
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(cudaGraphLaunch(ge, st));
    CK(cudaStreamSynchronize(st));
    std::vector<float> ms;
    for (int i = 0; i < reps; i++) {
        CK(cudaEventRecord(e0, st));
        CK(cudaGraphLaunch(ge, st));
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        float t;
        CK(cudaEventElapsedTime(&t, e0, e1));
        ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    return ms[ms.size() / 2];
}

#endif
