// prepare.cuh: the arithmetic of the KDA prepare (kd_kda_prepare in kda.cu, and the conv +
// prepare kernel of ops.cu, kd_cu_conv_prepare): written once, so both give the same bits.
#ifndef KD_CUDA_PREPARE_CUH
#define KD_CUDA_PREPARE_CUH

#include <math.h>

__device__ __forceinline__ float kd_prep_sigmoid(float x) { return 1.f / (1.f + __expf(-x)); }
__device__ __forceinline__ float kd_prep_softplus(float x) {
    return x > 20.f ? x : (x < -20.f ? expf(x) : log1pf(expf(x)));
}
// The log-decay of gate input z (graw + dt_bias) with a = exp(A_log).
__device__ __forceinline__ float kd_prep_gate(float z, float a, int use_lb, float lb) {
    return use_lb ? lb * kd_prep_sigmoid(a * z) : -a * kd_prep_softplus(z);
}
__device__ __forceinline__ float kd_prep_decay(float z, float a, int use_lb, float lb) {
    return expf(kd_prep_gate(z, a, use_lb, lb));
}
__device__ __forceinline__ float kd_prep_beta(float braw, int neg) {
    const float b = 1.f / (1.f + expf(-braw));
    return neg ? 2.f * b : b;
}

// The sums of q.q, k.k and q.k of one key head: each thread's partial sums (sq, sk, sqk) over
// channels 4 t .. 4 t + 3 of its index t (then 4 t + 4 nt .., nt threads), in that order, then a
// butterfly in each warp (kd_prep_warp_sums: every lane ends with its warp's sums), then the warps'
// sums in order (kd_prep_sums; red: G x 3 x 32 floats of shared memory; one barrier, after which
// red may be reused only past another). For G tokens side by side, each in the same order.
// One channel's terms (q, k) into a thread's partial sums, each a fused multiply-add (spelled
// out, so that both kernels round alike whatever the compiler would contract).
__device__ __forceinline__ void kd_prep_acc(float &sq, float &sk, float &sqk, float q, float k) {
    sq = __fmaf_rn(q, q, sq), sk = __fmaf_rn(k, k, sk), sqk = __fmaf_rn(q, k, sqk);
}

template <int G>
__device__ __forceinline__ void kd_prep_warp_sums(float (&sq)[G], float (&sk)[G], float (&sqk)[G]) {
#pragma unroll
    for (int m = 16; m >= 1; m /= 2)
#pragma unroll
        for (int g = 0; g < G; g++) {
            sq[g] += __shfl_xor_sync(0xffffffffu, sq[g], m), sk[g] += __shfl_xor_sync(0xffffffffu, sk[g], m);
            sqk[g] += __shfl_xor_sync(0xffffffffu, sqk[g], m);
        }
}

template <int G>
__device__ __forceinline__ void kd_prep_sums(float (&sq)[G], float (&sk)[G], float (&sqk)[G], float (*red)[3][32]) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    kd_prep_warp_sums<G>(sq, sk, sqk);
    if (lane == 0)
#pragma unroll
        for (int g = 0; g < G; g++) red[g][0][warp] = sq[g], red[g][1][warp] = sk[g], red[g][2][warp] = sqk[g];
    __syncthreads();
#pragma unroll
    for (int g = 0; g < G; g++) {
        sq[g] = sk[g] = sqk[g] = 0.f;
        for (int w = 0; w < (int)(blockDim.x + 31) / 32; w++)
            sq[g] += red[g][0][w], sk[g] += red[g][1][w], sqk[g] += red[g][2][w];
    }
}

// The scales of q (with K^-1/2) and k from their sums of squares.
__device__ __forceinline__ float kd_prep_qscale(float sq, int K) { return rsqrtf(sq + 1e-6f) * rsqrtf((float)K); }
__device__ __forceinline__ float kd_prep_kscale(float sk) { return rsqrtf(sk + 1e-6f); }

#endif
