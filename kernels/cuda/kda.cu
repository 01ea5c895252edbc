// kda.cu: the decode-time KDA kernels (see kda.cuh for the layouts, tiling and bytes).
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "kernels/cuda/kda.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/prepare.cuh"

namespace {

// Elements between two slots' states in a layer's state array (the backend keeps each slot's
// whole state contiguous, layer after layer; 0 means packed [slots][HV][K][V]).
__device__ __forceinline__ size_t kda_sstride(const kd_kda_args &a) {
    return a.slot_stride ? (size_t)a.slot_stride : (size_t)a.HV * a.K * a.V;
}

// Where a verify writes its window's records (kda.cuh, kd_kda_row.keep): from the start of the
// slot's other key/decay buffer, or, for a row that keeps its folded state, right after the
// records it folded, in the same buffer (the fold reads records [0, fold), the window writes
// [fold, fold + len): no block of the launch reads what another writes).
__device__ __forceinline__ int rec_off(const kd_kda_row &row) { return row.keep ? row.fold : 0; }
__device__ __forceinline__ float *kg_new_base(const kd_kda_args &a, const kd_kda_row &row, size_t slot, int K) {
    return a.rec_kg + ((slot * 2 + (row.kg_read ^ (row.keep ? 0 : 1))) * a.Tw + rec_off(row)) * (size_t)a.HV * 2 * K;
}

constexpr int kThreads = 128;

// Asynchronous copies global -> shared (launch.cuh's cp_async*: all of a block's staging in
// flight at once, with the state's loads; no registers held): 16 bytes when both ends allow it, else 4.
__device__ __forceinline__ void pdl_trigger() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

template <int R>
__device__ __forceinline__ float group_sum(float x) {
#pragma unroll
    for (int m = R / 2; m >= 1; m /= 2) x += __shfl_xor_sync(0xffffffffu, x, m);
    return x;
}

// Shared-memory layout of per-token vectors of K: each lane group's KR rows padded by 4
// floats, so the R groups of a warp, reading 16 bytes each, fall into distinct banks.
template <int KR, int R>
__device__ __forceinline__ int pidx(int t, int c) {
    return t * (KR + 4) * R + (c / KR) * (KR + 4) + c % KR;
}

// Records [0, n) of one head (each the key L2-normalised and the decay, as kd_kda_prepare
// made them for that window) into shared memory sk / sd (pidx layout).
template <int KR, int R>
__device__ void stage_records(const kd_kda_args &a, const float *kg, int h, int n, float *sk, float *sd) {
    const int K = a.K;
    for (int i = threadIdx.x; i < n * K; i += kThreads) {
        const int t = i / K, c = i % K;
        const float *rk = kg + ((size_t)t * a.HV + h) * 2 * K;
        sk[pidx<KR, R>(t, c)] = rk[c];
        sd[pidx<KR, R>(t, c)] = rk[K + c];
    }
}

// A lane's NC value columns of KR state rows, loaded / stored as float4 when NC = 4.
template <int KR, int NC>
__device__ __forceinline__ void load_tile(float (&st)[KR][NC], const float *src, int r0, int j, int V, bool live) {
#pragma unroll
    for (int i = 0; i < KR; i++) {
        const float *p = src + (size_t)(r0 + i) * V + j;
        if constexpr (NC == 4) {
            const float4 x = live ? *(const float4 *)p : make_float4(0.f, 0.f, 0.f, 0.f);
            st[i][0] = x.x, st[i][1] = x.y, st[i][2] = x.z, st[i][3] = x.w;
        } else {
#pragma unroll
            for (int n = 0; n < NC; n++) st[i][n] = live ? p[n] : 0.f;
        }
    }
}

template <int KR, int NC>
__device__ __forceinline__ void store_tile(const float (&st)[KR][NC], float *dst, int r0, int j, int V) {
#pragma unroll
    for (int i = 0; i < KR; i++) {
        float *p = dst + (size_t)(r0 + i) * V + j;
        if constexpr (NC == 4) *(float4 *)p = make_float4(st[i][0], st[i][1], st[i][2], st[i][3]);
        else
#pragma unroll
            for (int n = 0; n < NC; n++) p[n] = st[i][n];
    }
}

// st <- diag(d) st + k u^T over the lane's tile, for one token (a fold step).
template <int KR, int NC>
__device__ __forceinline__ void fold_tile(float (&st)[KR][NC], const float *d, const float *k, const float (&u)[NC]) {
#pragma unroll
    for (int i4 = 0; i4 < KR / 4; i4++) {
        const float4 d4 = ((const float4 *)d)[i4], k4 = ((const float4 *)k)[i4];
        const float dd[4] = {d4.x, d4.y, d4.z, d4.w}, kk[4] = {k4.x, k4.y, k4.z, k4.w};
#pragma unroll
        for (int e = 0; e < 4; e++)
#pragma unroll
            for (int n = 0; n < NC; n++) st[4 * i4 + e][n] = st[4 * i4 + e][n] * dd[e] + kk[e] * u[n];
    }
}

// One block: (value-column tile, value head, row). A lane holds KR rows x NC columns of the
// head's state in registers; R lanes (adjacent) share a column set and split K. Per-token
// vectors (q, k, decay; the fold's key and decay) sit in shared memory, read 16 bytes at a
// time and used for NC columns: shared-memory traffic per state element and token is
// 12/NC bytes, which with NC = 4 leaves the FP pipes, not the LDS pipe, as the limit. v,
// beta and the fold's corrections are staged there too: no global loads on the token loop.
template <int KR, int R, int NC, bool STORE_ALL>
__global__ void __launch_bounds__(kThreads) verify_kernel(const kd_kda_args a) {
    extern __shared__ __align__(16) float smem[];
    constexpr int K = KR * R, CB = kThreads / R * NC, KP = (KR + 4) * R;
    static_assert(KR % 4 == 0, "rows per lane must be a multiple of 4");
    const kd_kda_row row = a.rows[blockIdx.z];
    const int h = blockIdx.y, hk = h / (a.HV / a.H), V = a.V, Tw = a.Tw;
    const int part = threadIdx.x % R, jl = threadIdx.x / R * NC, j = blockIdx.x * CB + jl;
    const int c0 = part * (KR + 4), r0 = part * KR;
    const bool live = j < V; // V is a multiple of NC
    const int T = row.len, F = row.fold;
    float *wq = smem, *wk = wq + T * KP, *wd = wk + T * KP, *fk = wd + T * KP, *fd = fk + Tw * KP;
    float *sv = fd + Tw * KP, *su = sv + T * CB, *sb = su + Tw * CB; // v [T][CB], u [F][CB], beta [T]
    float *skq = sb + 16;                                             // qk [T] (deferred)
    const size_t slot = (size_t)row.slot, hkv = (size_t)K * V;
    // the state first: its loads are in flight while the block stages the rest
    float *S = a.state + slot * kda_sstride(a) + h * hkv;
    const float *src = S;
    if (STORE_ALL && F > 0) src = a.stored + ((slot * Tw + (F - 1)) * a.HV + h) * hkv;
    float st[KR][NC];
    load_tile<KR, NC>(st, src, r0, j, V, live);
    const float *kg_old = a.rec_kg + ((slot * 2 + row.kg_read) * Tw) * (size_t)a.HV * 2 * K;
    float *kg_new = kg_new_base(a, row, slot, K);
    const bool fold = !STORE_ALL && F > 0;
    // Staging by asynchronous copies: every load in flight at once with the state's, no
    // registers held, little address arithmetic (16 bytes a copy when the arrays allow it; at
    // B = 1 the staging's waits and index arithmetic, not the state's arithmetic, were the
    // time). Group A is what earlier steps and kernels wrote (v, the records): it is issued,
    // with the state's loads, before pdl_wait, so under a programmatic launch it overlaps the
    // kernel before (kd_kda_prepare or kd_cu_conv_prepare: qn, kn, qk, decay, beta, conv records); group B
    // (those five) comes after the wait, and lands while the block folds. The records are the
    // normalised keys and decays of the last window as prepare made them: the fold needs no
    // arithmetic of its own before it starts.
    const int tid = threadIdx.x;
    constexpr int K4 = K / 4;
    for (int i = tid; i < T * CB; i += kThreads) {
        const int t = i / CB, jj = blockIdx.x * CB + i % CB;
        if (jj < V) cp_async4(sv + i, a.v + (((size_t)row.start + t) * a.HV + h) * V + jj);
        else sv[i] = 0.f;
    }
    if (fold) {
        for (int i = tid; i < F * CB; i += kThreads) {
            const int t = i / CB, jj = blockIdx.x * CB + i % CB;
            if (jj < V) cp_async4(su + i, a.rec_u + ((slot * Tw + t) * a.HV + h) * V + jj);
            else su[i] = 0.f;
        }
        // the fold records: key into fk, decay into fd
        const bool alr = ((uintptr_t)kg_old & 15) == 0;
        for (int i = tid; i < F * 2 * K4; i += kThreads) {
            const int t = i / (2 * K4), c = i % (2 * K4) * 4;
            float *dst = c < K ? fk + pidx<KR, R>(t, c) : fd + pidx<KR, R>(t, c - K);
            const float *src = kg_old + ((size_t)t * a.HV + h) * 2 * K + c;
            if (alr) {
                cp_async16(dst, src);
            } else {
#pragma unroll
                for (int e = 0; e < 4; e++) cp_async4(dst + e, src + e);
            }
        }
    }
    cp_async_commit();
    pdl_wait(); // the kernel before has finished (a no-op without a programmatic launch)
    pdl_trigger(); // the kernel after may be scheduled (it waits for this one: launch.cuh)
    const bool al = (((uintptr_t)a.qn | (uintptr_t)a.kn | (uintptr_t)a.decay) & 15) == 0;
    for (int i = tid; i < T * K4; i += kThreads) {
        const int t = i / K4, c = i % K4 * 4, pi = pidx<KR, R>(t, c);
        const size_t n = (size_t)row.start + t;
        const float *q = a.qn + (n * a.H + hk) * K + c, *k = a.kn + (n * a.H + hk) * K + c;
        const float *d = a.decay + (n * a.HV + h) * K + c;
        if (al) {
            cp_async16(wq + pi, q), cp_async16(wk + pi, k), cp_async16(wd + pi, d);
        } else {
#pragma unroll
            for (int e = 0; e < 4; e++) cp_async4(wq + pi + e, q + e), cp_async4(wk + pi + e, k + e), cp_async4(wd + pi + e, d + e);
        }
    }
    if (tid < T) cp_async4(sb + tid, a.beta + ((size_t)row.start + tid) * a.HV + h);
    if (!STORE_ALL && tid >= 32 && tid < 32 + T) cp_async4(skq + tid - 32, a.qk + ((size_t)row.start + tid - 32) * a.H + hk);
    cp_async_commit();
    if (fold) {
        cp_async_wait1(); // group A
        __syncthreads();
        for (int t = 0; t < F; t++) {
            float u[NC];
#pragma unroll
            for (int n = 0; n < NC; n++) u[n] = su[t * CB + jl + n];
            fold_tile<KR, NC>(st, fd + t * KP + c0, fk + t * KP + c0, u);
        }
        if (live && !row.keep) store_tile<KR, NC>(st, S, r0, j, V); // the folded checkpoint, written once
    }
    cp_async_wait(); // group B
    __syncthreads();
    // the window, from registers; with one column a lane, its K-row sums run as P independent
    // chains (the serial FMA latency of KR rows was a third of a B = 1 step)
    constexpr int P = NC == 1 ? 4 : 1;
    if constexpr (!STORE_ALL) {
        // Deferred: no state after the window is kept, so each position is one pass over the
        // lane's rows and one round of shuffles. With S' = D_t S (S as the last position left
        // it): u_t = beta_t (v_t - k_t.S'), o_t = q_t.(S' + k_t u_t) = q_t.S' + (q_t.k_t) u_t
        // (q_t.k_t from kd_kda_prepare), so k.S' and q.S' are summed side by side; the rank-one
        // update k_t u_t is applied as the next position's pass starts (and never after the
        // last). (Keeping k_t in registers for that, instead of reading it again from shared
        // memory, measured 2 % slower at B = 1.)
        float pu[NC];
        for (int t = 0; t < T; t++) {
            const size_t n = (size_t)row.start + t;
            const float4 *d4 = (const float4 *)(wd + t * KP + c0), *k4 = (const float4 *)(wk + t * KP + c0);
            const float4 *q4 = (const float4 *)(wq + t * KP + c0), *p4 = (const float4 *)(wk + (t - 1) * KP + c0);
            float ks[P][NC], qs[P][NC];
#pragma unroll
            for (int p = 0; p < P; p++)
#pragma unroll
                for (int m = 0; m < NC; m++) ks[p][m] = 0.f, qs[p][m] = 0.f;
            if (t > 0) {
#pragma unroll
                for (int i4 = 0; i4 < KR / 4; i4++) {
                    const float4 d = d4[i4], kk = k4[i4], q = q4[i4], pp = p4[i4];
                    const float dd[4] = {d.x, d.y, d.z, d.w}, kv[4] = {kk.x, kk.y, kk.z, kk.w};
                    const float qv[4] = {q.x, q.y, q.z, q.w}, pv[4] = {pp.x, pp.y, pp.z, pp.w};
#pragma unroll
                    for (int e = 0; e < 4; e++) {
#pragma unroll
                        for (int m = 0; m < NC; m++) {
                            float x = (st[4 * i4 + e][m] + pv[e] * pu[m]) * dd[e];
                            st[4 * i4 + e][m] = x;
                            ks[e % P][m] += x * kv[e], qs[e % P][m] += x * qv[e];
                        }
                    }
                }
            } else {
#pragma unroll
                for (int i4 = 0; i4 < KR / 4; i4++) {
                    const float4 d = d4[i4], kk = k4[i4], q = q4[i4];
                    const float dd[4] = {d.x, d.y, d.z, d.w}, kv[4] = {kk.x, kk.y, kk.z, kk.w};
                    const float qv[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
                    for (int e = 0; e < 4; e++) {
#pragma unroll
                        for (int m = 0; m < NC; m++) {
                            float x = st[4 * i4 + e][m] * dd[e];
                            st[4 * i4 + e][m] = x;
                            ks[e % P][m] += x * kv[e], qs[e % P][m] += x * qv[e];
                        }
                    }
                }
            }
#pragma unroll
            for (int m = 0; m < NC; m++) {
#pragma unroll
                for (int p = 1; p < P; p++) ks[0][m] += ks[p][m], qs[0][m] += qs[p][m];
                pu[m] = sb[t] * (sv[t * CB + jl + m] - group_sum<R>(ks[0][m]));
                qs[0][m] = group_sum<R>(qs[0][m]) + skq[t] * pu[m];
            }
            if (live && part == 0) {
#pragma unroll
                for (int m = 0; m < NC; m++) {
                    a.o[(n * a.HV + h) * V + j + m] = qs[0][m];
                    a.rec_u[((slot * Tw + rec_off(row) + t) * a.HV + h) * V + j + m] = pu[m];
                }
            }
        }
        // the window's keys and decays, from shared memory: the next step's fold records,
        // shared out among the head's blocks, after the window (off its serial chain)
        const bool al4 = ((uintptr_t)kg_new & 15) == 0;
        for (int i = blockIdx.x * kThreads + tid; i < T * 2 * K4; i += gridDim.x * kThreads) {
            const int t = i / (2 * K4), c = i % (2 * K4) * 4;
            const float *src = c < K ? wk + pidx<KR, R>(t, c) : wd + pidx<KR, R>(t, c - K);
            float *dst = kg_new + ((size_t)t * a.HV + h) * 2 * K + c;
            if (al4) {
                *(float4 *)dst = *(const float4 *)src;
            } else {
#pragma unroll
                for (int e = 0; e < 4; e++) dst[e] = src[e];
            }
        }
    } else { // store-all: every position's state is stored, so it is updated in place
        for (int t = 0; t < T; t++) {
            const size_t n = (size_t)row.start + t;
            const float4 *d4 = (const float4 *)(wd + t * KP + c0), *k4 = (const float4 *)(wk + t * KP + c0);
            const float4 *q4 = (const float4 *)(wq + t * KP + c0);
            float ks[P][NC], os[P][NC], u[NC];
#pragma unroll
            for (int p = 0; p < P; p++)
#pragma unroll
                for (int m = 0; m < NC; m++) ks[p][m] = 0.f, os[p][m] = 0.f;
#pragma unroll
            for (int i4 = 0; i4 < KR / 4; i4++) {
                const float4 d = d4[i4], kk = k4[i4];
                const float dd[4] = {d.x, d.y, d.z, d.w}, kv[4] = {kk.x, kk.y, kk.z, kk.w};
#pragma unroll
                for (int e = 0; e < 4; e++)
#pragma unroll
                    for (int m = 0; m < NC; m++) {
                        st[4 * i4 + e][m] *= dd[e];
                        ks[e % P][m] += st[4 * i4 + e][m] * kv[e];
                    }
            }
#pragma unroll
            for (int m = 0; m < NC; m++) {
#pragma unroll
                for (int p = 1; p < P; p++) ks[0][m] += ks[p][m];
                u[m] = sb[t] * (sv[t * CB + jl + m] - group_sum<R>(ks[0][m]));
            }
#pragma unroll
            for (int i4 = 0; i4 < KR / 4; i4++) {
                const float4 kk = k4[i4], q = q4[i4];
                const float kv[4] = {kk.x, kk.y, kk.z, kk.w}, qv[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
                for (int e = 0; e < 4; e++)
#pragma unroll
                    for (int m = 0; m < NC; m++) {
                        st[4 * i4 + e][m] += kv[e] * u[m];
                        os[e % P][m] += st[4 * i4 + e][m] * qv[e];
                    }
            }
#pragma unroll
            for (int m = 0; m < NC; m++) {
#pragma unroll
                for (int p = 1; p < P; p++) os[0][m] += os[p][m];
            }
            float o1[NC];
#pragma unroll
            for (int m = 0; m < NC; m++) o1[m] = group_sum<R>(os[0][m]);
            if (live && part == 0) {
#pragma unroll
                for (int m = 0; m < NC; m++) {
                    a.o[(n * a.HV + h) * V + j + m] = o1[m];
                }
            }
            if (live) store_tile<KR, NC>(st, a.stored + ((slot * Tw + t) * a.HV + h) * hkv, r0, j, V);
        }
    }
}

// The deferred verify in closed form (the records make the window's states affine in S0):
// with cp_t = prod_{s<=t} d_s, M_tr = sum_c k_t k_r prod_{r<s<=t} d_s (r < t) and
// N_tr = sum_c q_t k_r prod_{r<s<=t} d_s (r <= t), per value column j:
//   P1_t = (k_t o cp_t) . S0[:, j],  P2_t = (q_t o cp_t) . S0[:, j]
//   u_t  = beta_t (v_t - P1_t - sum_{r<t} M_tr u_r),   o_t = P2_t + sum_{r<=t} N_tr u_r
// so the window never updates the state: 2 T K multiply-adds per column, all independent
// (against 4 T K on a serial chain), and the fold of the last window is closed form too:
// S = cpF o S0 + sum_t (k_t o prod_{t<s<F} d_s) u_t^T, (F + 1) K per column. Every product
// of decays is formed directly (no division), all factors <= 1: nothing can overflow.
template <int KR, int R, int NC>
__global__ void __launch_bounds__(kThreads) verify_wy_kernel(const kd_kda_args a) {
    extern __shared__ __align__(16) float smem[];
    constexpr int K = KR * R, CB = kThreads / R * NC, KP = (KR + 4) * R;
    static_assert(KR % 4 == 0, "rows per lane must be a multiple of 4");
    const kd_kda_row row = a.rows[blockIdx.z];
    const int h = blockIdx.y, hk = h / (a.HV / a.H), V = a.V, Tw = a.Tw;
    const int part = threadIdx.x % R, jl = threadIdx.x / R * NC, j = blockIdx.x * CB + jl;
    const int c0 = part * (KR + 4), r0 = part * KR;
    const bool live = j < V;
    const int T = row.len, F = row.fold;
    float *wq = smem, *wk = wq + T * KP, *wd = wk + T * KP, *wa = wd + T * KP, *wb = wa + T * KP;
    float *fk = wb + T * KP, *fd = fk + Tw * KP, *fw = fd + Tw * KP, *cpF = fw + Tw * KP;
    float *sv = cpF + KP, *su = sv + T * CB, *sb = su + Tw * CB, *M = sb + 16, *N = M + 16 * 16;
    float *P1 = N + 16 * 16, *P2 = P1 + T * CB, *U = P2 + T * CB;
    const size_t slot = (size_t)row.slot, hkv = (size_t)K * V;
    float *S = a.state + slot * kda_sstride(a) + h * hkv;
    float st[KR][NC];
    load_tile<KR, NC>(st, S, r0, j, V, live); // in flight while the block stages the rest
    for (int i = threadIdx.x; i < T * K; i += kThreads) {
        const int t = i / K, c = i % K, pi = pidx<KR, R>(t, c);
        const size_t n = (size_t)row.start + t;
        wq[pi] = a.qn[(n * a.H + hk) * K + c];
        wk[pi] = a.kn[(n * a.H + hk) * K + c];
        wd[pi] = a.decay[(n * a.HV + h) * K + c];
    }
    for (int i = threadIdx.x; i < T * CB; i += kThreads) {
        const int t = i / CB, jj = blockIdx.x * CB + i % CB;
        sv[i] = jj < V ? a.v[(((size_t)row.start + t) * a.HV + h) * V + jj] : 0.f;
    }
    if (threadIdx.x < T) sb[threadIdx.x] = a.beta[((size_t)row.start + threadIdx.x) * a.HV + h];
    const float *kg_old = a.rec_kg + ((slot * 2 + row.kg_read) * Tw) * (size_t)a.HV * 2 * K;
    float *kg_new = kg_new_base(a, row, slot, K);
    if (F > 0) {
        for (int i = threadIdx.x; i < F * CB; i += kThreads) {
            const int t = i / CB, jj = blockIdx.x * CB + i % CB;
            su[i] = jj < V ? a.rec_u[((slot * Tw + t) * a.HV + h) * V + jj] : 0.f;
        }
        stage_records<KR, R>(a, kg_old, h, F, fk, fd);
    }
    __syncthreads();
    // per key channel: the fold's and the window's decay products
    for (int c = threadIdx.x; c < K; c += kThreads) {
        float p = 1.f;
        for (int t = F - 1; t >= 0; t--) { /* fw_t = k_t * prod_{t<s<F} d_s */
            const int pi = pidx<KR, R>(t, c);
            fw[pi] = fk[pi] * p;
            p *= fd[pi];
        }
        cpF[pidx<KR, R>(0, c)] = p;
        p = 1.f;
        for (int t = 0; t < T; t++) {
            const int pi = pidx<KR, R>(t, c);
            p *= wd[pi];
            wa[pi] = wk[pi] * p;
            wb[pi] = wq[pi] * p;
        }
    }
    // M and N: a warp per r, lanes over K
    {
        const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
        for (int r = warp; r < T; r += kThreads / 32) {
            float w[K / 32 > 0 ? K / 32 : 1];
#pragma unroll
            for (int e = 0; e < K / 32; e++) w[e] = wk[pidx<KR, R>(r, lane + 32 * e)];
            for (int t = r; t < T; t++) {
                float m = 0.f, nn = 0.f;
#pragma unroll
                for (int e = 0; e < K / 32; e++) {
                    const int pi = pidx<KR, R>(t, lane + 32 * e);
                    if (t > r) w[e] *= wd[pi];
                    nn += wq[pi] * w[e];
                    m += wk[pi] * w[e];
                }
#pragma unroll
                for (int o = 16; o >= 1; o /= 2) nn += __shfl_xor_sync(0xffffffffu, nn, o), m += __shfl_xor_sync(0xffffffffu, m, o);
                if (lane == 0) N[t * 16 + r] = nn, M[t * 16 + r] = t > r ? m : 0.f;
            }
        }
    }
    __syncthreads();
    // the fold, closed form, and the checkpoint written once
    if (F > 0) {
        const float4 *c4 = (const float4 *)(cpF + c0);
#pragma unroll
        for (int i4 = 0; i4 < KR / 4; i4++) {
            const float4 cc = c4[i4];
            const float cv[4] = {cc.x, cc.y, cc.z, cc.w};
#pragma unroll
            for (int e = 0; e < 4; e++)
#pragma unroll
                for (int m = 0; m < NC; m++) st[4 * i4 + e][m] *= cv[e];
        }
        for (int t = 0; t < F; t++) {
            float u[NC];
#pragma unroll
            for (int m = 0; m < NC; m++) u[m] = su[t * CB + jl + m];
            const float4 *w4 = (const float4 *)(fw + t * KP + c0);
#pragma unroll
            for (int i4 = 0; i4 < KR / 4; i4++) {
                const float4 ww = w4[i4];
                const float wv[4] = {ww.x, ww.y, ww.z, ww.w};
#pragma unroll
                for (int e = 0; e < 4; e++)
#pragma unroll
                    for (int m = 0; m < NC; m++) st[4 * i4 + e][m] += wv[e] * u[m];
            }
        }
        if (live && !row.keep) store_tile<KR, NC>(st, S, r0, j, V);
    }
    // the window: 2T independent dot products per column
    for (int t = 0; t < T; t++) {
        const float4 *a4 = (const float4 *)(wa + t * KP + c0), *b4 = (const float4 *)(wb + t * KP + c0);
        float p1[NC], p2[NC];
#pragma unroll
        for (int m = 0; m < NC; m++) p1[m] = 0.f, p2[m] = 0.f;
#pragma unroll
        for (int i4 = 0; i4 < KR / 4; i4++) {
            const float4 aa = a4[i4], bb = b4[i4];
            const float av[4] = {aa.x, aa.y, aa.z, aa.w}, bv[4] = {bb.x, bb.y, bb.z, bb.w};
#pragma unroll
            for (int e = 0; e < 4; e++)
#pragma unroll
                for (int m = 0; m < NC; m++) {
                    p1[m] += st[4 * i4 + e][m] * av[e];
                    p2[m] += st[4 * i4 + e][m] * bv[e];
                }
        }
#pragma unroll
        for (int m = 0; m < NC; m++) {
            p1[m] = group_sum<R>(p1[m]);
            p2[m] = group_sum<R>(p2[m]);
            if (part == 0) P1[t * CB + jl + m] = p1[m], P2[t * CB + jl + m] = p2[m];
        }
    }
    __syncwarp();
    // the small triangular part, per column, on the column's first lane
    if (part == 0) {
        for (int t = 0; t < T; t++) {
            const size_t n = (size_t)row.start + t;
#pragma unroll
            for (int m = 0; m < NC; m++) {
                const int col = jl + m;
                float x = sv[t * CB + col] - P1[t * CB + col];
                for (int r = 0; r < t; r++) x -= M[t * 16 + r] * U[r * CB + col];
                const float u = sb[t] * x;
                U[t * CB + col] = u;
                float o = P2[t * CB + col];
                for (int r = 0; r <= t; r++) o += N[t * 16 + r] * U[r * CB + col];
                if (live) {
                    a.o[(n * a.HV + h) * V + j + m] = o;
                    a.rec_u[((slot * Tw + rec_off(row) + t) * a.HV + h) * V + j + m] = u;
                }
            }
        }
    }
    // the window's keys and decays, staged above: the next step's fold records (one block a head)
    if (blockIdx.x == 0) {
        for (int i = threadIdx.x; i < T * K; i += kThreads) {
            const int t = i / K, c = i % K;
            float *r = kg_new + ((size_t)t * a.HV + h) * 2 * K;
            r[c] = wk[pidx<KR, R>(t, c)];
            r[K + c] = wd[pidx<KR, R>(t, c)];
        }
    }
}

// Commit (eager, flush): fold len records into the checkpoint, snapshot after snap_at.
template <int KR, int R, int NC>
__global__ void __launch_bounds__(kThreads) commit_kernel(const kd_kda_args a) {
    extern __shared__ __align__(16) float smem[];
    constexpr int K = KR * R, CB = kThreads / R * NC, KP = (KR + 4) * R;
    const kd_kda_row row = a.rows[blockIdx.z];
    const int h = blockIdx.y, V = a.V, Tw = a.Tw, n = row.len;
    const int part = threadIdx.x % R, jl = threadIdx.x / R * NC, j = blockIdx.x * CB + jl;
    const int c0 = part * (KR + 4), r0 = part * KR;
    const bool live = j < V;
    const size_t slot = (size_t)row.slot, hkv = (size_t)K * V;
    float *fk = smem, *fd = fk + Tw * KP, *su = fd + Tw * KP;
    float *S = a.state + slot * kda_sstride(a) + h * hkv;
    float st[KR][NC];
    load_tile<KR, NC>(st, S, r0, j, V, live);
    for (int i = threadIdx.x; i < n * CB; i += kThreads) {
        const int t = i / CB, jj = blockIdx.x * CB + i % CB;
        su[i] = jj < V ? a.rec_u[((slot * Tw + t) * a.HV + h) * V + jj] : 0.f;
    }
    stage_records<KR, R>(a, a.rec_kg + ((slot * 2 + row.kg_read) * Tw) * (size_t)a.HV * 2 * K, h, n, fk, fd);
    __syncthreads();
    for (int t = 0; t < n; t++) {
        float u[NC];
#pragma unroll
        for (int m = 0; m < NC; m++) u[m] = su[t * CB + jl + m];
        fold_tile<KR, NC>(st, fd + t * KP + c0, fk + t * KP + c0, u);
        if (t + 1 == row.snap_at && live) store_tile<KR, NC>(st, row.snap + (size_t)h * hkv, r0, j, V);
    }
    if (live) store_tile<KR, NC>(st, S, r0, j, V);
}

// Store-all commit: the checkpoint (and snapshot) are copies of stored states.
__global__ void commit_store_all_kernel(const kd_kda_args a) {
    const kd_kda_row row = a.rows[blockIdx.y];
    const size_t hkv = (size_t)a.K * a.V, per = (size_t)a.HV * hkv, slot = (size_t)row.slot;
    const float *last = a.stored + (slot * a.Tw + (row.len - 1)) * per;
    const float *snap = row.snap_at ? a.stored + (slot * a.Tw + (row.snap_at - 1)) * per : nullptr;
    float *S = a.state + slot * kda_sstride(a);
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < per; i += (size_t)gridDim.x * blockDim.x) {
        S[i] = last[i];
        if (snap) row.snap[i] = snap[i];
    }
}

// Per token and head: q, k normalised (q scaled), decay, beta (prepare.cuh's arithmetic). The
// sums of q.q, k.k and q.k in prepare.cuh's order (thread t: channels 4 t .. 4 t + 3, then 4
// blockDim.x on; the conv + prepare kernel's, so both give the same bits); the decays and the
// normalised q and k a channel a thread. The first round's loads are all issued before the
// first product (at one token a step the kernel is a chain of load latencies).
__global__ void prepare_kernel(int32_t H, int32_t HV, int32_t K, const float *__restrict__ q,
                               const float *__restrict__ k, const float *__restrict__ graw,
                               const float *__restrict__ braw, int64_t braw_ld, const float *__restrict__ A_log,
                               const float *__restrict__ dt_bias, int32_t use_lb, float lb, int32_t neg,
                               float *__restrict__ qn, float *__restrict__ kn, float *__restrict__ qk,
                               float *__restrict__ decay, float *__restrict__ beta) {
    kd_dep_start();
    const size_t n = blockIdx.x;
    const int h = blockIdx.y, t = threadIdx.x, nt = blockDim.x;
    const bool kh = h < H, vh = h < HV; /* q and k of key head h; decay and beta of value head h */
    __shared__ float red[1][3][32];
    const float *qi = q + (n * H + h) * K, *ki = k + (n * H + h) * K, *gi = graw + (n * HV + h) * K;
    const float *di = dt_bias + (size_t)h * K;
    const float A = vh ? expf(A_log[h]) : 0.f, b = vh && t == 0 ? braw[n * braw_ld + h] : 0.f;
    const float g0 = vh && t < K ? gi[t] : 0.f, d0 = vh && t < K ? di[t] : 0.f;
    float qv[4], kv[4]; /* channels 4 t .. 4 t + 3 */
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int c = 4 * t + i;
        qv[i] = kh && c < K ? qi[c] : 0.f, kv[i] = kh && c < K ? ki[c] : 0.f;
    }
    if (vh) {
        if (t == 0) beta[n * HV + h] = kd_prep_beta(b, neg);
        float *de = decay + (n * HV + h) * K;
        if (t < K) de[t] = kd_prep_decay(g0 + d0, A, use_lb, lb);
        for (int c = t + nt; c < K; c += nt) de[c] = kd_prep_decay(gi[c] + di[c], A, use_lb, lb);
    }
    if (!kh) return; /* the same for the whole block */
    float sq[1] = {0.f}, sk[1] = {0.f}, sqk[1] = {0.f};
#pragma unroll
    for (int i = 0; i < 4; i++)
        if (4 * t + i < K) kd_prep_acc(sq[0], sk[0], sqk[0], qv[i], kv[i]);
    for (int c0 = 4 * (t + nt); c0 < K; c0 += 4 * nt) /* K > 4 blockDim.x */
        for (int c = c0; c < c0 + 4 && c < K; c++) kd_prep_acc(sq[0], sk[0], sqk[0], qi[c], ki[c]);
    kd_prep_sums<1>(sq, sk, sqk, red);
    const float iq = kd_prep_qscale(sq[0], K), ik = kd_prep_kscale(sk[0]);
    float *qo = qn + (n * H + h) * K, *ko = kn + (n * H + h) * K;
    for (int c = t; c < K; c += nt) qo[c] = qi[c] * iq, ko[c] = ki[c] * ik;
    if (qk && t == 0) qk[n * H + h] = sqk[0] * iq * ik;
}

// ------------------------------------------------------------------ tensor-core path
// The deferred verify and the commit as small matrix products (see kda.cuh): per (row,
// value head, tile of 16*NW value columns), the head's state is held transposed, S^T (V x K),
// in the accumulator layout of mma.m16n8k8 (warp w: value rows [16w, 16w+16); lane (g, q)
// holds rows v = 2g, 2g+1 and key channels 8kt + 2q, 8kt + 2q + 1 of every 8-channel tile kt).
// That layout is also the A-operand layout of the next product once the key channels of a
// tile are read in the order (2q, 2q+1) -> (q, q+4): the contraction order is free, so the
// B operand is read with the same permutation and no data moves between the two products.
//   fold:    S_F^T = S0^T diag(cp) + U^T Wf        (V x F) (F x K): m16 n8 k8 per 8 records
//   window:  P^T   = S_F^T [B o K; B o Q]^T         (V x K) (K x 2T): m16 n8 k8, 2T <= 16
// fp32 accuracy with 3xTF32: x = hi + lo (hi = x truncated to tf32, one AND; lo = x - hi, exact
// in fp32, |lo| < 2^-10 |x|, passed as it is: the tensor core reads a tf32 operand's top 19 bits,
// so lo is truncated there), x y ~ hi_x hi_y + hi_x lo_y + lo_x hi_y; the dropped lo_x lo_y and
// the truncation of lo are < 2^-20 relative per product, about fp32's own rounding of a K-term sum.
// Rounding hi (+ 0x1000 first) and lo (the same again) halved that but cost 4 integer instructions
// a B-operand pair and 1 an A-operand value, much of the one-pass verify's non-mma work at
// T = 4-8: truncated, its steps on an H100's 88 SMs (the H200 proxy; B = 128, 512) were 1.2-4.3 %
// faster at T = 4 and 3.0-6.1 % at T = 8, within 0.7 % at T = 1-2 (two A/Bs: lo as it is, then hi
// truncated), the float64 checks' worst relative error went 5.1e-7 (hi rounded) -> 1.1e-6
// (tolerance 1e-5), the oracle's greedy tokens stayed exact, and a 50000-token state recurrence
// at decay 0.9999 drifts 6.1e-7 from float64 against 4.3e-7 for plain fp32 products
// (tests/bench/tf32_drift.c; tests/bench/results/tf32_split_ab_h100.md).

__device__ __forceinline__ uint32_t tf32_hi(float x) { // x truncated to tf32 (toward zero)
    return __float_as_uint(x) & 0xffffe000u;
}

__device__ __forceinline__ void mma_tf32(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

struct frag_a { // an A operand split into its tf32 high and low parts
    uint32_t h[4], l[4];
    __device__ __forceinline__ void set(float a0, float a1, float a2, float a3) {
        const float x[4] = {a0, a1, a2, a3};
#pragma unroll
        for (int i = 0; i < 4; i++) h[i] = tf32_hi(x[i]), l[i] = __float_as_uint(x[i] - __uint_as_float(h[i]));
    }
};

// d += a b, 3xTF32; b given as (hi0, hi1, lo0, lo1)
__device__ __forceinline__ void mma3(float (&d)[4], const frag_a &a, uint32_t bh0, uint32_t bh1, uint32_t bl0,
                                     uint32_t bl1) {
    mma_tf32(d, a.l[0], a.l[1], a.l[2], a.l[3], bh0, bh1);
    mma_tf32(d, a.h[0], a.h[1], a.h[2], a.h[3], bl0, bl1);
    mma_tf32(d, a.h[0], a.h[1], a.h[2], a.h[3], bh0, bh1);
}

// B operand fragment (hi, lo) of two floats
__device__ __forceinline__ void split2(float x, float y, uint32_t &h0, uint32_t &h1, uint32_t &l0, uint32_t &l1) {
    h0 = tf32_hi(x), h1 = tf32_hi(y);
    l0 = __float_as_uint(x - __uint_as_float(h0)), l1 = __float_as_uint(y - __uint_as_float(h1));
}

__device__ __forceinline__ void put_split(float *hi, float *lo, int i, float x) {
    const float h = __uint_as_float(tf32_hi(x));
    hi[i] = h, lo[i] = __uint_as_float(tf32_hi(x - h));
}

// The lane's 2 x 8kt.. state values of one head, [kt][c-fragment], from / to [K][V].
template <int KT, int KT0 = 0, int KT1 = KT> /* key tiles [KT0, KT1) */
__device__ __forceinline__ void tc_load(float (&s)[KT][4], const float *S, int V, int va, int q, bool live) {
#pragma unroll
    for (int kt = KT0; kt < KT1; kt++) {
        const float *p = S + (size_t)(kt * 8 + 2 * q) * V + va;
        const float2 x = live ? *(const float2 *)p : make_float2(0.f, 0.f);
        const float2 y = live ? *(const float2 *)(p + V) : make_float2(0.f, 0.f);
        s[kt][0] = x.x, s[kt][1] = y.x, s[kt][2] = x.y, s[kt][3] = y.y;
    }
}
template <int KT, int KT0 = 0, bool CS = false> /* key tiles [KT0, KT); CS: evict-first stores (st.global.cs) */
__device__ __forceinline__ void tc_store(const float (&s)[KT][4], float *S, int V, int va, int q) {
#pragma unroll
    for (int kt = KT0; kt < KT; kt++) {
        float *p = S + (size_t)(kt * 8 + 2 * q) * V + va;
        if constexpr (CS) {
            __stcs((float2 *)p, make_float2(s[kt][0], s[kt][2]));
            __stcs((float2 *)(p + V), make_float2(s[kt][1], s[kt][3]));
        } else {
            *(float2 *)p = make_float2(s[kt][0], s[kt][2]);
            *(float2 *)(p + V) = make_float2(s[kt][1], s[kt][3]);
        }
    }
}

// n floats, dst 16-byte aligned
__device__ __forceinline__ void fetch(float *dst, const float *src, int n) {
    if ((((uintptr_t)src) & 15) == 0 && (n & 3) == 0)
        for (int i = threadIdx.x; i < n / 4; i += blockDim.x) cp_async16(dst + 4 * i, src + 4 * i);
    else
        for (int i = threadIdx.x; i < n; i += blockDim.x) cp_async4(dst + i, src + i);
}

// The state tile of a head into shared memory, [K][CB] at row stride SP = CB + 4 (the
// mma-layout reads, 8 bytes per lane, then fall into distinct banks), by asynchronous 16-byte
// copies (no registers held while they fly).
template <int K, int CB>
__device__ __forceinline__ void tile_fetch(float *st, const float *S, int V, int j0, int r0 = 0, int r1 = K) {
    constexpr int SP = CB + 4;
    const bool vec = V % 4 == 0 && (((uintptr_t)S) & 15) == 0;
    for (int i = r0 * (CB / 4) + threadIdx.x; i < r1 * (CB / 4); i += blockDim.x) {
        const int c = i / (CB / 4), j = i % (CB / 4) * 4;
        float *d = st + c * SP + j;
        const float *src = S + (size_t)c * V + j0 + j;
        if (vec && j0 + j < V) cp_async16(d, src);
        else
            for (int e = 0; e < 4; e++) {
                if (j0 + j + e < V) cp_async4(d + e, src + e);
                else d[e] = 0.f;
            }
    }
}
// The same for a whole column block (j0 + CB <= V) whose rows are 16-byte aligned (V % 4 == 0, S aligned): rows
// [R0, R1) by NTH threads, each at fixed strides, unrolled, 16 bytes a copy. tile_fetch's general loop spent ~30
// instructions a copy on its index arithmetic and guards, which in the one-pass verify was 23 % of a kept step's
// instructions (ncu, B = 128 T = 4: 512 of 2234 a warp).
template <int CB, int NTH, int R0, int R1>
__device__ __forceinline__ void tile_fetch_full(float *st, const float *S, int V, int j0) {
    constexpr int SP = CB + 4, CPR = CB / 4, RPP = NTH / CPR; /* 16-byte copies a row, rows a pass */
    static_assert(NTH % CPR == 0 && (R1 - R0) % RPP == 0, "whole passes");
    const int r = R0 + (int)threadIdx.x / CPR, j = (int)threadIdx.x % CPR * 4;
    const float *src = S + (size_t)r * V + j0 + j;
    float *d = st + r * SP + j;
    const size_t step = (size_t)RPP * V;
#pragma unroll
    for (int p = 0; p < (R1 - R0) / RPP; p++) cp_async16(d + p * RPP * SP, src + p * step);
}
// n rows of CB floats (row t at src + t * stride, 16-byte aligned: stride % 4 == 0) into dst + t * DP, 16 bytes a copy
template <int CB, int DP, int NTH>
__device__ __forceinline__ void rows_fetch_full(float *dst, const float *src, size_t stride, int n) {
    constexpr int CPR = CB / 4;
    for (int i = threadIdx.x; i < n * CPR; i += NTH) {
        const int t = i / CPR, jj = i % CPR * 4;
        cp_async16(dst + t * DP + jj, src + t * stride + jj);
    }
}
// The lane's mma-layout values (value columns vl, vl + 1) from the tile.
template <int KT, int SP, int KT0 = 0, int KT1 = KT> /* key tiles [KT0, KT1) */
__device__ __forceinline__ void tile_to_regs(float (&s)[KT][4], const float *st, int vl, int q) {
#pragma unroll
    for (int kt = KT0; kt < KT1; kt++) {
        const float2 x = *(const float2 *)(st + (kt * 8 + 2 * q) * SP + vl);
        const float2 y = *(const float2 *)(st + (kt * 8 + 2 * q + 1) * SP + vl);
        s[kt][0] = x.x, s[kt][1] = y.x, s[kt][2] = x.y, s[kt][3] = y.y;
    }
}
// The fold's records t < n of one head: the normalised key (kr) and the decay (fd), [t][K],
// fetched into shared memory (asynchronously: cp_async_wait + barrier).
template <int K>
__device__ __forceinline__ void tc_fetch_records(const kd_kda_args &a, const float *kg, int h, int n, float *kr,
                                                 float *fd) {
    for (int t = 0; t < n; t++) {
        const float *rk = kg + ((size_t)t * a.HV + h) * 2 * K;
        fetch(kr + t * K, rk, K);
        fetch(fd + t * K, rk + K, K);
    }
}

// Fold weights of channel c for the first n records: wf_t = k_t prod_{t<s<n} d_s (split;
// rows n..FR-1 zero); returns prod_{s<n} d_s.
template <int K>
__device__ __forceinline__ float tc_fold_weights(int c, int n, int FR, const float *kr, const float *fd, float *wh,
                                                 float *wl) {
    constexpr int KP = K + 8;
    float p = 1.f;
    for (int t = FR - 1; t >= 0; t--) {
        float w = 0.f;
        if (t < n) w = kr[t * K + c] * p, p *= fd[t * K + c];
        put_split(wh, wl, t * KP + c, w);
    }
    return p;
}

// s (the lane's S0^T tile) <- S0^T diag(cp) + U^T Wf, U's fragments in u[ft] (records 8ft..).
template <int K>
__device__ __forceinline__ void tc_fold(float (&s)[K / 8][4], const float *cp, const frag_a (&u)[2], int nft,
                                        const float *wh, const float *wl, int g, int q, int KP) {
    constexpr int KT = K / 8;
#pragma unroll
    for (int kt = 0; kt < KT; kt++) {
        const float2 c = *(const float2 *)(cp + kt * 8 + 2 * q);
        s[kt][0] *= c.x, s[kt][1] *= c.y, s[kt][2] *= c.x, s[kt][3] *= c.y;
    }
#pragma unroll
    for (int ft = 0; ft < 2; ft++) {
        if (ft >= nft) break;
        const int r0 = (ft * 8 + q) * KP, r1 = r0 + 4 * KP;
#pragma unroll
        for (int kt = 0; kt < KT; kt++) {
            const int c = kt * 8 + g;
            mma3(s[kt], u[ft], __float_as_uint(wh[r0 + c]), __float_as_uint(wh[r1 + c]), __float_as_uint(wl[r0 + c]),
                 __float_as_uint(wl[r1 + c]));
        }
    }
}

// U^T fragments of records t < n (A operand: rows v = va, va + 1; columns t), 0 elsewhere.
__device__ __forceinline__ void tc_load_u(frag_a (&u)[2], const kd_kda_args &a, size_t slot, int h, int n, int va,
                                          int q, bool live) {
#pragma unroll
    for (int ft = 0; ft < 2; ft++) {
        const int t0 = ft * 8 + q, t1 = t0 + 4;
        float2 x = make_float2(0.f, 0.f), y = make_float2(0.f, 0.f);
        if (live && t0 < n) x = *(const float2 *)(a.rec_u + ((slot * a.Tw + t0) * a.HV + h) * a.V + va);
        if (live && t1 < n) y = *(const float2 *)(a.rec_u + ((slot * a.Tw + t1) * a.HV + h) * a.V + va);
        u[ft].set(x.x, x.y, y.x, y.y);
    }
}

// The window product P^T = S_F^T A^T into P [value column][17] (columns vl, vl + 1), two
// accumulators per n tile (even / odd kt), hi*hi and the low-order terms apart. bfrag(nt, kt,
// h0, h1, l0, l1) gives the B fragment of A (rows nt * 8 + g, channels kt * 8 + 2q, 2q + 1),
// split into tf32 hi / lo.
template <int NT>
__device__ __forceinline__ void tc_window_zero(float (&acc)[4][NT][4]) {
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++) acc[i][nt][0] = acc[i][nt][1] = acc[i][nt][2] = acc[i][nt][3] = 0.f;
}
// Key tiles [KT0, KT1) of the product into acc.
template <int K, int NT, int KT0, int KT1, class BFrag>
__device__ __forceinline__ void tc_window_acc(const float (&s)[K / 8][4], BFrag bfrag, float (&acc)[4][NT][4]) {
#pragma unroll
    for (int kt = KT0; kt < KT1; kt++) {
        frag_a x;
        x.set(s[kt][0], s[kt][2], s[kt][1], s[kt][3]);
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            uint32_t h0, h1, l0, l1;
            bfrag(nt, kt, h0, h1, l0, l1);
            float(&big)[4] = acc[(kt & 1) * 2][nt], (&small)[4] = acc[(kt & 1) * 2 + 1][nt];
            mma_tf32(small, x.l[0], x.l[1], x.l[2], x.l[3], h0, h1);
            mma_tf32(small, x.h[0], x.h[1], x.h[2], x.h[3], l0, l1);
            mma_tf32(big, x.h[0], x.h[1], x.h[2], x.h[3], h0, h1);
        }
    }
}
template <int NT>
__device__ __forceinline__ void tc_window_put(const float (&acc)[4][NT][4], float *P, int vl, int q) {
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        float r[4];
#pragma unroll
        for (int i = 0; i < 4; i++) r[i] = (acc[0][nt][i] + acc[2][nt][i]) + (acc[1][nt][i] + acc[3][nt][i]);
        const int n0 = nt * 8 + 2 * q;
        P[vl * 17 + n0] = r[0], P[vl * 17 + n0 + 1] = r[1];
        P[(vl + 1) * 17 + n0] = r[2], P[(vl + 1) * 17 + n0 + 1] = r[3];
    }
}
template <int K, int NT, class BFrag>
__device__ __forceinline__ void tc_window(const float (&s)[K / 8][4], BFrag bfrag, float *P, int vl, int q) {
    float acc[4][NT][4];
    tc_window_zero<NT>(acc);
    tc_window_acc<K, NT, 0, K / 8>(s, bfrag, acc);
    tc_window_put<NT>(acc, P, vl, q);
}

// B fragments of the window's A [n][K + 8], fp32 in shared memory (split into tf32 hi / lo).
template <int K>
struct smem_bfrag {
    const float *aw;
    int g, q;
    __device__ __forceinline__ void operator()(int nt, int kt, uint32_t &h0, uint32_t &h1, uint32_t &l0,
                                               uint32_t &l1) const {
        const float2 bb = *(const float2 *)(aw + (nt * 8 + g) * (K + 8) + kt * 8 + 2 * q);
        split2(bb.x, bb.y, h0, h1, l0, l1);
    }
};
// The window with A in shared memory.
template <int K, int NT>
__device__ __forceinline__ void tc_window_smem(const float (&s)[K / 8][4], const float *aw, float *P, int vl, int g,
                                               int q) {
    tc_window<K, NT>(s, smem_bfrag<K>{aw, g, q}, P, vl, q);
}

// The triangular solve of one value column (col in the block's CB), for the prefill's chunks:
// u_t = beta_t (v_t - P_t - sum_{r<t} M_tr u_r), o_t = P_{T+t} + sum_{r<=t} N_tr u_r; out(t, u_t, o_t)
// for t < T. The verify kernels have their own copy (tc_solve_column, below).
template <class Out>
__device__ __forceinline__ void tc_solve(int T, int CB, int col, const float *sv, const float *sb, const float *P,
                                         const float *M, const float *N, Out out) {
    float U[8];
#pragma unroll
    for (int t = 0; t < 8; t++) {
        if (t < T) {
            float x = sv[t * CB + col] - P[col * 17 + t];
#pragma unroll
            for (int r = 0; r < t; r++) x -= M[t * 8 + r] * U[r];
            U[t] = sb[t] * x;
            float o = P[col * 17 + T + t];
#pragma unroll
            for (int r = 0; r <= t; r++) o += N[t * 8 + r] * U[r];
            out(t, U[t], o);
        }
    }
}
// The same solve for a verify window's column j of the head, writing o and the corrections.
// Written out, not through tc_solve: with tc_solve and a storing lambda the verify kernels compiled
// differently (the one-pass verify at T = 8 2-8.5 % slower from B = 64 on an H200, T <= 4 the same;
// tests/bench/results/logs/builds_h200_930518c.log); in this form their PTX is as it was before
// tc_solve (the one-pass, split and one-kernel tensor-core verify and the commit kernels alike).
__device__ __forceinline__ void tc_solve_column(const kd_kda_args &a, size_t start, size_t rrow, int h, int T,
                                                int CB, int col, int j, const float *sv, const float *sb,
                                                const float *P, const float *M, const float *N) {
    float U[8];
#pragma unroll
    for (int t = 0; t < 8; t++) {
        if (t < T) {
            float x = sv[t * CB + col] - P[col * 17 + t];
#pragma unroll
            for (int r = 0; r < t; r++) x -= M[t * 8 + r] * U[r];
            U[t] = sb[t] * x;
            float o = P[col * 17 + T + t];
#pragma unroll
            for (int r = 0; r <= t; r++) o += N[t * 8 + r] * U[r];
            const size_t n = start + t;
            a.o[(n * a.HV + h) * a.V + j] = o;
            a.rec_u[((rrow + t) * a.HV + h) * a.V + j] = U[t];
        }
    }
}

// Shared memory of the tensor-core verify, in floats (see verify_tc_kernel).
__host__ __device__ constexpr int tc_verify_smem(int K, int NW, int NT, int FR) {
    return (2 * FR * K + 24 * K > NW * 16 * 17 ? 2 * FR * K + 24 * K : NW * 16 * 17) + 2 * FR * (K + 8) +
           2 * NT * 8 * (K + 8) + K + 128 + 8 * NW * 16 + 8;
}

// The deferred verify on tensor cores. Block: NW warps, 16 value columns each, of one
// (row, value head). Phases: (0) the state tile and the fold's corrections into registers;
// (1) records, the window's q, k, decay, v, beta into shared memory; (2) per key channel
// the fold weights and the window's decayed keys / queries (split hi/lo), and the T x T
// matrices M, N; (3) fold (mma), checkpoint store, window products (mma) into P;
// (4) per value column the triangular solve: u and o.
template <int K, int NW, int NT, int MINB>
__global__ void __launch_bounds__(NW * 32, MINB) verify_tc_kernel(const kd_kda_args a) {
    extern __shared__ __align__(16) float smem[];
    constexpr int KT = K / 8, KP = K + 8, CB = NW * 16, NTH = NW * 32;
    const kd_kda_row row = a.rows[blockIdx.z];
    const int h = blockIdx.y, hk = h / (a.HV / a.H), V = a.V, Tw = a.Tw, T = row.len, F = row.fold;
    const int FR = (Tw + 7) / 8 * 8, tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, q = lane % 4;
    const int va = blockIdx.x * CB + warp * 16 + 2 * g;
    const bool live = va < V; // V is even
    const size_t slot = (size_t)row.slot;
    float *S = a.state + slot * kda_sstride(a) + h * (size_t)K * V;
    float *fk = smem, *fd = fk + FR * K, *wk = fd + FR * K, *wq = wk + 8 * K, *wd = wq + 8 * K;
    float *P = smem; // [CB][17], phases 3-4, over the staging area of phases 1-2
    float *wfh = smem + (2 * FR * K + 24 * K > CB * 17 ? 2 * FR * K + 24 * K : CB * 17), *wfl = wfh + FR * KP;
    float *awh = wfl + FR * KP, *awl = awh + NT * 8 * KP, *cpF = awl + NT * 8 * KP, *M = cpF + K, *N = M + 64;
    float *sv = N + 64, *sb = sv + 8 * CB;
    // (0)
    float s[KT][4];
    tc_load<KT>(s, S, V, va, q, live);
    frag_a u[2];
    tc_load_u(u, a, slot, h, F, va, q, live);
    // (1) every staging copy in flight at once
    const float *kg_old = a.rec_kg + ((slot * 2 + row.kg_read) * Tw) * (size_t)a.HV * 2 * K;
    float *kg_new = kg_new_base(a, row, slot, K);
    tc_fetch_records<K>(a, kg_old, h, F, fk, fd);
    for (int t = 0; t < T; t++) {
        const size_t n = (size_t)row.start + t;
        fetch(wk + t * K, a.kn + (n * a.H + hk) * K, K);
        fetch(wq + t * K, a.qn + (n * a.H + hk) * K, K);
        fetch(wd + t * K, a.decay + (n * a.HV + h) * K, K);
    }
    for (int i = tid; i < T * CB; i += NTH) {
        const int t = i / CB, j = blockIdx.x * CB + i % CB;
        if (j < V) cp_async4(sv + i, a.v + (((size_t)row.start + t) * a.HV + h) * V + j);
        else sv[i] = 0.f;
    }
    if (tid < T) cp_async4(sb + tid, a.beta + ((size_t)row.start + tid) * a.HV + h);
    cp_async_wait();
    __syncthreads();
    // (2) the window's T x T matrices (a warp per 4 pairs r <= t, reductions interleaved),
    // then per key channel the fold weights and the window's decayed keys / queries
    for (int p0 = warp * 4; p0 < T * (T + 1) / 2; p0 += NW * 4) {
        float m[4], nn[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            m[i] = nn[i] = 0.f;
            const int pr = p0 + i;
            if (pr >= T * (T + 1) / 2) continue;
            int t = 0;
            while ((t + 1) * (t + 2) / 2 <= pr) t++;
            const int r = pr - t * (t + 1) / 2;
#pragma unroll
            for (int e = 0; e < K / 32; e++) {
                const int c = lane + 32 * e;
                float w = wk[r * K + c];
                for (int x = r + 1; x <= t; x++) w *= wd[x * K + c];
                m[i] += wk[t * K + c] * w, nn[i] += wq[t * K + c] * w;
            }
        }
#pragma unroll
        for (int o = 16; o >= 1; o /= 2)
#pragma unroll
            for (int i = 0; i < 4; i++)
                m[i] += __shfl_xor_sync(0xffffffffu, m[i], o), nn[i] += __shfl_xor_sync(0xffffffffu, nn[i], o);
        if (lane == 0)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int pr = p0 + i;
                if (pr >= T * (T + 1) / 2) break;
                int t = 0;
                while ((t + 1) * (t + 2) / 2 <= pr) t++;
                const int r = pr - t * (t + 1) / 2;
                M[t * 8 + r] = t > r ? m[i] : 0.f, N[t * 8 + r] = nn[i];
            }
    }
    __syncthreads();
    for (int c = tid; c < K; c += NTH) {
        cpF[c] = tc_fold_weights<K>(c, F, FR, fk, fd, wfh, wfl);
        float p = 1.f;
        for (int t = 0; t < T; t++) {
            p *= wd[t * K + c];
            put_split(awh, awl, t * KP + c, wk[t * K + c] * p);
            put_split(awh, awl, (T + t) * KP + c, wq[t * K + c] * p);
        }
        for (int r = 2 * T; r < NT * 8; r++) awh[r * KP + c] = awl[r * KP + c] = 0.f;
    }
    __syncthreads();
    // (3) the fold and the checkpoint, written once
    if (F > 0) {
        tc_fold<K>(s, cpF, u, (F + 7) / 8, wfh, wfl, g, q, KP);
        if (live && !row.keep) tc_store<KT>(s, S, V, va, q);
    }
    // the window: P^T = S_F^T A^T, B pre-split in shared memory
    tc_window<K, NT>(
        s,
        [&](int nt, int kt, uint32_t &h0, uint32_t &h1, uint32_t &l0, uint32_t &l1) {
            const int o = (nt * 8 + g) * KP + kt * 8 + 2 * q;
            const float2 bh = *(const float2 *)(awh + o), bl = *(const float2 *)(awl + o);
            h0 = __float_as_uint(bh.x), h1 = __float_as_uint(bh.y), l0 = __float_as_uint(bl.x), l1 = __float_as_uint(bl.y);
        },
        P, warp * 16 + 2 * g, q);
    __syncthreads();
    // the window's keys and decays (the new records), this block's share: loads issued
    // before the solve, stores after it (one round trip, not one per element)
    constexpr int PER = (8 * K + NTH - 1) / NTH;
    float kv[PER], gv[PER];
    const int rs = NTH * gridDim.x, ri = blockIdx.x * NTH + tid;
#pragma unroll
    for (int it = 0; it < PER; it++) {
        const int i = ri + it * rs, t = i / K, c = i % K;
        const size_t n = (size_t)row.start + t;
        if (i < T * K) kv[it] = a.kn[(n * a.H + hk) * K + c], gv[it] = a.decay[(n * a.HV + h) * K + c];
    }
    // (4) per value column: u_t = beta_t (v_t - P_t - sum_{r<t} M_tr u_r), o_t = P_{T+t} + sum_{r<=t} N_tr u_r
    if (tid < CB && blockIdx.x * CB + tid < V)
        tc_solve_column(a, (size_t)row.start, slot * a.Tw + rec_off(row), h, T, CB, tid, blockIdx.x * CB + tid, sv, sb,
                        P, M, N);
#pragma unroll
    for (int it = 0; it < PER; it++) {
        const int i = ri + it * rs, t = i / K, c = i % K;
        if (i < T * K) {
            float *r = kg_new + ((size_t)t * a.HV + h) * 2 * K;
            r[c] = kv[it], r[K + c] = gv[it];
        }
    }
}

__host__ __device__ constexpr int tc_commit_smem(int K, int FR) { return 2 * FR * K + 4 * FR * (K + 8) + 2 * K; }

// The commit on tensor cores: S_n^T = S0^T diag(cp_n) + U^T Wf_n, and the snapshot the same
// way with the weights of its first snap_at records, tile by tile. Block as verify_tc_kernel.
template <int K, int NW>
__global__ void __launch_bounds__(NW * 32) commit_tc_kernel(const kd_kda_args a) {
    extern __shared__ __align__(16) float smem[];
    constexpr int KT = K / 8, KP = K + 8, CB = NW * 16, NTH = NW * 32;
    const kd_kda_row row = a.rows[blockIdx.z];
    const int h = blockIdx.y, V = a.V, Tw = a.Tw, n = row.len, m = row.snap_at <= row.len ? row.snap_at : 0;
    const int FR = (Tw + 7) / 8 * 8, tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, q = lane % 4;
    const int va = blockIdx.x * CB + warp * 16 + 2 * g;
    const bool live = va < V;
    const size_t slot = (size_t)row.slot, hkv = (size_t)K * V;
    float *S = a.state + slot * kda_sstride(a) + h * hkv, *snap = m > 0 ? row.snap + (size_t)h * hkv : nullptr;
    float *fk = smem, *fd = fk + FR * K, *wh = fd + FR * K, *wl = wh + FR * KP, *mh = wl + FR * KP, *ml = mh + FR * KP;
    float *cpn = ml + FR * KP, *cpm = cpn + K;
    float s[KT][4];
    tc_load<KT>(s, S, V, va, q, live);
    frag_a u[2];
    tc_load_u(u, a, slot, h, n, va, q, live);
    tc_fetch_records<K>(a, a.rec_kg + ((slot * 2 + row.kg_read) * Tw) * (size_t)a.HV * 2 * K, h, n, fk, fd);
    cp_async_wait();
    __syncthreads();
    for (int c = tid; c < K; c += NTH) {
        cpn[c] = tc_fold_weights<K>(c, n, FR, fk, fd, wh, wl);
        if (m > 0) cpm[c] = tc_fold_weights<K>(c, m, FR, fk, fd, mh, ml);
    }
    __syncthreads();
#pragma unroll
    for (int kt = 0; kt < KT; kt++) {
        if (m > 0) {
            float x[1][4] = {{s[kt][0], s[kt][1], s[kt][2], s[kt][3]}};
            tc_fold<8>(x, cpm + kt * 8, u, (m + 7) / 8, mh + kt * 8, ml + kt * 8, g, q, KP);
            if (live) tc_store<1>(x, snap + (size_t)kt * 8 * V, V, va, q);
        }
        float y[1][4] = {{s[kt][0], s[kt][1], s[kt][2], s[kt][3]}};
        tc_fold<8>(y, cpn + kt * 8, u, (n + 7) / 8, wh + kt * 8, wl + kt * 8, g, q, KP);
        if (live) tc_store<1>(y, S + (size_t)kt * 8 * V, V, va, q);
    }
}

// ---------------------------------------------------------- split verify (default)
// The same arithmetic as verify_tc_kernel, in two launches: tc_prologue_kernel does the
// O(T^2 K) per (row, value head) work once (one block per (row, head), a thread per key
// channel) and writes it to a.work; verify_split_kernel is then load -> fold mma -> store ->
// window mma -> triangular solve -> store. The verify is launched as a programmatic
// dependent of the prologue: its blocks issue the state and correction loads, then wait
// for the prologue grid (griddepcontrol.wait) before reading a.work.
// a.work per (row, head), floats: Wf [FR][K] (fold weights), cpF [K], A [16][K] (rows t:
// b_t o k_t, rows T + t: b_t o q_t), M [8][8], N [8][8].
__host__ __device__ constexpr size_t tc_work_floats(int K, int FR) { return (size_t)(FR + 1 + 16) * K + 128; }


// Warp sums of 16 values at once in 16 shuffles (instead of 5 per value): each step keeps
// half of the values and adds the partner lane's copy of that half. Afterwards lane l holds
// the sum of value 8 b4 + 4 b3 + 2 b2 + b1 (b_i: bit i of l) over the warp.
template <int H>
__device__ __forceinline__ void warp_sum16_step(float (&v)[16], int lane) {
    const bool up = lane & (2 * H);
#pragma unroll
    for (int i = 0; i < H; i++) {
        const float lo = v[i], hi = v[i + H];
        const float keep = up ? hi : lo, send = up ? lo : hi;
        v[i] = keep + __shfl_xor_sync(0xffffffffu, send, 2 * H);
    }
}
__device__ __forceinline__ float warp_sum16(float (&v)[16], int lane) {
    warp_sum16_step<8>(v, lane), warp_sum16_step<4>(v, lane), warp_sum16_step<2>(v, lane), warp_sum16_step<1>(v, lane);
    return v[0] + __shfl_xor_sync(0xffffffffu, v[0], 1);
}
__device__ __forceinline__ int warp_sum16_index(int lane) { return (lane >> 1) & 15; }

// A warp's sums over its channels of M_tr = k_t x_tr (r < t) and N_tr = q_t x_tr (r <= t),
// x_tr = k_r prod_{r<s<=t} d_s, into mn[t * 8 + r] and mn[64 + t * 8 + r] (t < T): per t, the
// 2 t + 1 sums side by side. kw, qw, dw: this lane's channel of the window's tokens.
__device__ __forceinline__ void window_sums(const float (&kw)[8], const float (&qw)[8], const float (&dw)[8], int T,
                                            int lane, float *mn) {
    if (T < 1) return;
    float x[8];
    x[0] = kw[0];
    {
        float n0 = qw[0] * kw[0];
#pragma unroll
        for (int o = 16; o >= 1; o /= 2) n0 += __shfl_xor_sync(0xffffffffu, n0, o);
        if (lane == 0) mn[0] = 0.f, mn[64] = n0; /* M_00 = 0 */
    }
#pragma unroll
    for (int t = 1; t < 8; t++) {
        if (t >= T) break;
        float v[16]; /* M_t0..M_t7, N_t0..N_t7 */
#pragma unroll
        for (int r = 0; r < 8; r++) {
            if (r < t) x[r] *= dw[t];
            if (r == t) x[r] = kw[t];
            v[r] = r < t ? kw[t] * x[r] : 0.f;
            v[8 + r] = r <= t ? qw[t] * x[r] : 0.f;
        }
        const float s = warp_sum16(v, lane);
        const int i = warp_sum16_index(lane);
        if (!(lane & 1)) mn[(i / 8) * 64 + t * 8 + i % 8] = s;
    }
}

// The same sums packed (the one-pass verify's window half): the window's T^2 nonzero entries, slot t^2 + r for
// M_tr (r < t) and t^2 + t + r for N_tr (r <= t), reduced 16 at a time by warp_sum16 (NG groups: 1 covers T <= 4,
// 4 cover T <= 8) instead of 16 slots (most of them zeros) for each t; the diagonal M_tt (read as 0 by onepass_mn)
// is written as 0. A group is reduced once its last token is in and skipped when it holds no t < T.
// Static PTX shuffles 142 -> 41 (NT = 1), 133 -> 80 (NT = 2). Measured on an H100 against the per-token sums
// (onepass_trace, two builds alternated, tests/bench/results/window_sums_ab_h100.md): on 88 SMs (the H200
// proxy) kept steps 3.0-3.5 % faster at T = 4 and 1.0-2.1 % at T = 8, written and deferred steps 0.5-1.1 % at
// T = 4 and 1.2-2.1 % at T = 8 (B = 64-512); on 132 SMs at T = 4-8 kept steps 0.3-1.9 % faster, the rest
// within 0.4 %.
// The small-window form (VAR = 1, windows of 1-2) keeps window_sums: with the packed sums compiled into it its
// written steps were 2-4 % slower on 88 SMs at T = 1-2 (a different compile of the whole kernel; choosing
// window_sums at run time for T <= 2 did not recover it); with window_sums its code is as before (identical PTX).
template <int NG>
__device__ __forceinline__ void window_sums_packed(const float (&kw)[8], const float (&qw)[8], const float (&dw)[8],
                                                   int T, int lane, float *mn) {
    constexpr int TMAX = NG == 1 ? 4 : 8;
    static_assert(NG * 16 == TMAX * TMAX, "groups of 16 slots cover t < TMAX");
    float v[NG * 16], x[8];
#pragma unroll
    for (int i = 0; i < NG * 16; i++) v[i] = 0.f;
#pragma unroll
    for (int t = 0; t < TMAX; t++) {
        if (t < T) {
#pragma unroll
            for (int r = 0; r < t; r++) x[r] *= dw[t];
            x[t] = kw[t];
#pragma unroll
            for (int r = 0; r < t; r++) v[t * t + r] = kw[t] * x[r];
#pragma unroll
            for (int r = 0; r <= t; r++) v[t * t + t + r] = qw[t] * x[r];
        }
#pragma unroll
        for (int g = 0; g < NG; g++)
            if (t * t < 16 * (g + 1) && (t + 1) * (t + 1) >= 16 * (g + 1) && 16 * g < T * T) { /* group g is full */
                float w[16];
#pragma unroll
                for (int i = 0; i < 16; i++) w[i] = v[16 * g + i];
                const float sum = warp_sum16(w, lane);
                const int sl = 16 * g + warp_sum16_index(lane), ts = (int)sqrtf((float)sl + 0.5f), o = sl - ts * ts;
                if (!(lane & 1) && ts < T) mn[(o < ts ? ts * 8 + o : 64 + ts * 8 + o - ts)] = sum;
            }
    }
    if (lane < T) mn[lane * 9] = 0.f; /* M_tt */
}

template <int K>
__global__ void __launch_bounds__(K, 1024 / K) tc_prologue_kernel(const kd_kda_args a) {
    /* per warp: M and N as [8][8] each (sums over the warp's channels) */
    constexpr int NWP = K / 32, NR = 128;
    __shared__ float red[NWP][NR];
    __shared__ float skg[2][16][K]; /* the records' key and decay, each thread its own channel */
    pdl_trigger();
    const kd_kda_row row = a.rows[blockIdx.y];
    const int h = blockIdx.x, hk = h / (a.HV / a.H), T = row.len, F = row.fold, FR = (a.Tw + 7) / 8 * 8;
    const int c = threadIdx.x, lane = c % 32, warp = c / 32;
    const size_t slot = (size_t)row.slot;
    const float *kg_old = a.rec_kg + ((slot * 2 + row.kg_read) * a.Tw) * (size_t)a.HV * 2 * K;
    float *kg_new = kg_new_base(a, row, slot, K);
    float *w = a.work + ((size_t)blockIdx.y * a.HV + h) * tc_work_floats(K, FR);
    // every load first: the records into shared memory (no registers held), the window's
    // keys, queries and decays into registers
    for (int t = 0; t < F; t++) {
        const float *rk = kg_old + ((size_t)t * a.HV + h) * 2 * K;
        cp_async4(&skg[0][t][c], rk + c), cp_async4(&skg[1][t][c], rk + K + c);
    }
    float kw[8], qw[8], dw[8];
#pragma unroll
    for (int t = 0; t < 8; t++) {
        if (t >= T) break;
        const size_t n = (size_t)row.start + t;
        kw[t] = a.kn[(n * a.H + hk) * K + c], qw[t] = a.qn[(n * a.H + hk) * K + c];
        dw[t] = a.decay[(n * a.HV + h) * K + c];
    }
    // the new records (the window's keys and decays); the fold reads the other buffer
#pragma unroll
    for (int t = 0; t < 8; t++) {
        if (t >= T) break;
        float *r = kg_new + ((size_t)t * a.HV + h) * 2 * K;
        r[c] = kw[t], r[K + c] = dw[t];
    }
    // M_tr = sum_c k_t x_tr (r < t), N_tr = sum_c q_t x_tr (r <= t), x_tr = k_r prod_{r<s<=t} d_s:
    // per t, the 2 (t + 1) warp sums side by side
    window_sums(kw, qw, dw, T, lane, &red[warp][0]);
    cp_async_wait();
    __syncthreads();
    // per channel: the fold weights (backwards), the window's decayed keys and queries (forwards)
    float p = 1.f;
    for (int t = F - 1; t >= 0; t--) {
        w[t * K + c] = skg[0][t][c] * p;
        p *= skg[1][t][c];
    }
    w[FR * K + c] = p;
    float b = 1.f;
    float *aw = w + (FR + 1) * K;
#pragma unroll
    for (int t = 0; t < 8; t++) {
        if (t >= T) break;
        b *= dw[t];
        aw[t * K + c] = kw[t] * b;
        aw[(T + t) * K + c] = qw[t] * b;
    }
    // M and N, full 8 x 8 (zeros outside r <= t < T)
    for (int i = c; i < 128; i += K) {
        const int mat = i / 64, t = i % 64 / 8, r = i % 8;
        float s = 0.f;
        if (r <= t && t < T && (mat == 1 || r < t))
#pragma unroll
            for (int y = 0; y < NWP; y++) s += red[y][i];
        w[(FR + 17) * K + i] = s;
    }
}

__host__ __device__ constexpr int tc_split_smem(int K, int NW, int NT, int FR, bool half = false) {
    return FR * (K + 8) + K + NT * 8 * (K + 8) + 128 + 8 * NW * 16 + 16 + FR * (NW * 16 + 8) + NW * 16 * 17 +
           (half ? K / 2 * (NW * 16 + 4) : 0);
}


// s <- S0^T diag(cpF) for key tiles [KT0, KT1) of the lane's tile
template <int KT, int KT0, int KT1>
__device__ __forceinline__ void scale_keys(float (&s)[KT][4], const float *cpF, int q) {
#pragma unroll
    for (int kt = KT0; kt < KT1; kt++) {
        const float2 cc = *(const float2 *)(cpF + kt * 8 + 2 * q);
        s[kt][0] *= cc.x, s[kt][1] *= cc.y, s[kt][2] *= cc.x, s[kt][3] *= cc.y;
    }
}
// The U^T fragment of record tile ft from U [t][UP]: rows v = vl, vl + 1; columns t = 8ft + q,
// 8ft + q + 4 (0 past F)
__device__ __forceinline__ frag_a records_frag(const float *su, int UP, int F, int ft, int vl, int q) {
    const int t0 = ft * 8 + q;
    float2 x = make_float2(0.f, 0.f), y = make_float2(0.f, 0.f);
    if (t0 < F) x = *(const float2 *)(su + t0 * UP + vl);
    if (t0 + 4 < F) y = *(const float2 *)(su + (t0 + 4) * UP + vl);
    frag_a u;
    u.set(x.x, x.y, y.x, y.y);
    return u;
}
// The fold from shared memory: s (the lane's S0^T tile) <- S0^T diag(cpF) + U^T Wf, with
// U [t][UP] (value columns vl, vl + 1 of records t < F) and Wf [t][K + 8] in fp32 (split
// into tf32 hi / lo here).
template <int K, int KT0 = 0, int KT1 = K / 8> /* key tiles [KT0, KT1) */
__device__ __forceinline__ void tc_fold_smem(float (&s)[K / 8][4], const float *cpF, const float *su, int UP,
                                             const float *wf, int F, int vl, int g, int q) {
    constexpr int KP = K + 8;
    scale_keys<K / 8, KT0, KT1>(s, cpF, q);
#pragma unroll
    for (int ft = 0; ft < 2; ft++) {
        if (ft * 8 >= F) break;
        const frag_a u = records_frag(su, UP, F, ft, vl, q);
        const int r0 = (ft * 8 + q) * KP, r1 = r0 + 4 * KP;
#pragma unroll
        for (int kt = KT0; kt < KT1; kt++) {
            uint32_t h0, h1, l0, l1;
            split2(wf[r0 + kt * 8 + g], wf[r1 + kt * 8 + g], h0, h1, l0, l1);
            mma3(s[kt], u, h0, h1, l0, l1);
        }
    }
}



// HALF: only the state's first K / 2 key channels go to registers as they load; the other half
// is copied into shared memory and taken after the first is folded, stored and multiplied
// (half the registers for the state: more blocks per SM).
template <int K, int NW, int NT, int MINB, bool PDL, bool HALF>
__global__ void __launch_bounds__(NW * 32, MINB) verify_split_kernel(const kd_kda_args a) {
    extern __shared__ __align__(16) float smem[];
    constexpr int KT = K / 8, KP = K + 8, CB = NW * 16, NTH = NW * 32;
    const kd_kda_row row = a.rows[blockIdx.z];
    const int h = blockIdx.y, V = a.V, Tw = a.Tw, T = row.len, F = row.fold;
    const int FR = (Tw + 7) / 8 * 8, tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, q = lane % 4;
    const int va = blockIdx.x * CB + warp * 16 + 2 * g;
    const bool live = va < V;
    const size_t slot = (size_t)row.slot;
    float *S = a.state + slot * kda_sstride(a) + h * (size_t)K * V;
    float *wf = smem, *cpF = wf + FR * KP, *aw = cpF + K, *M = aw + NT * 8 * KP, *N = M + 64;
    float *sv = N + 64, *sb = sv + 8 * CB, *su = sb + 16, *P = su + FR * (CB + 8);
    float *st = P + CB * 17 - (K / 2) * (CB + 4); /* (HALF) rows K / 2.. of the state tile at st + row * (CB + 4) */
    // the state, the fold's corrections, v and beta: not written by the prologue kernel
    float s[KT][4];
    if (HALF) {
        tc_load<KT, 0, KT / 2>(s, S, V, va, q, live);
        tile_fetch<K, CB>(st, S, V, blockIdx.x * CB, K / 2, K);
    } else {
        tc_load<KT>(s, S, V, va, q, live);
    }
    for (int i = tid; i < F * CB; i += NTH) {
        const int t = i / CB, j = blockIdx.x * CB + i % CB;
        if (j < V) cp_async4(su + t * (CB + 8) + i % CB, a.rec_u + ((slot * Tw + t) * a.HV + h) * V + j);
        else su[t * (CB + 8) + i % CB] = 0.f;
    }
    for (int i = tid; i < T * CB; i += NTH) {
        const int t = i / CB, j = blockIdx.x * CB + i % CB;
        if (j < V) cp_async4(sv + i, a.v + (((size_t)row.start + t) * a.HV + h) * V + j);
        else sv[i] = 0.f;
    }
    if (tid < T) cp_async4(sb + tid, a.beta + ((size_t)row.start + tid) * a.HV + h);
    const int nf = (F + 7) / 8 * 8;
    for (int i = F * K + tid; i < nf * K; i += NTH) wf[i / K * KP + i % K] = 0.f;
    for (int i = 2 * T * K + tid; i < NT * 8 * K; i += NTH) aw[i / K * KP + i % K] = 0.f;
    if (PDL) pdl_wait();
    const float *w = a.work + ((size_t)blockIdx.z * a.HV + h) * tc_work_floats(K, FR);
    for (int t = 0; t < F; t++) fetch(wf + t * KP, w + t * K, K);
    fetch(cpF, w + FR * K, K);
    for (int t = 0; t < 2 * T; t++) fetch(aw + t * KP, w + (FR + 1 + t) * K, K);
    fetch(M, w + (FR + 17) * K, 128);
    cp_async_wait();
    __syncthreads();
    // the fold and the checkpoint, written once
    const int vl = warp * 16 + 2 * g;
    if (HALF) {
        float acc[4][NT][4];
        tc_window_zero<NT>(acc);
        const smem_bfrag<K> bf{aw, g, q};
        if (F > 0) {
            tc_fold_smem<K, 0, KT / 2>(s, cpF, su, CB + 8, wf, F, vl, g, q);
            if (live && !row.keep) tc_store<KT / 2>(*(float(*)[KT / 2][4])s, S, V, va, q);
        }
        tc_window_acc<K, NT, 0, KT / 2>(s, bf, acc);
        tile_to_regs<KT, CB + 4, KT / 2, KT>(s, st, vl, q);
        if (F > 0) {
            tc_fold_smem<K, KT / 2, KT>(s, cpF, su, CB + 8, wf, F, vl, g, q);
            if (live && !row.keep) tc_store<KT, KT / 2>(s, S, V, va, q);
        }
        tc_window_acc<K, NT, KT / 2, KT>(s, bf, acc);
        tc_window_put<NT>(acc, P, vl, q);
    } else {
        if (F > 0) {
            tc_fold_smem<K>(s, cpF, su, CB + 8, wf, F, vl, g, q);
            if (live && !row.keep) tc_store<KT>(s, S, V, va, q);
        }
        tc_window_smem<K, NT>(s, aw, P, vl, g, q);
    }
    __syncthreads();
    for (int col = tid; col < CB; col += NTH)
        if (blockIdx.x * CB + col < V)
            tc_solve_column(a, (size_t)row.start, slot * a.Tw + rec_off(row), h, T, CB, col, blockIdx.x * CB + col, sv,
                            sb, P, M, N);
}

// ------------------------------------------------------------ one-pass verify
// verify_split_kernel and tc_prologue_kernel in one block per (row, value head, 128 value
// columns): 8 warps. The state tile goes to shared memory by asynchronous copies (no
// registers held), while the block's two halves compute the prologue: threads [0, 128)
// the fold weights from the records (keys and decays), threads [128, 256) the window
// (decayed keys and queries and the warps' sums for M and N; they also copy the new
// key/decay records); after the block's barrier the window half adds the sums into M and N
// (a named barrier of that half alone, before, left racecheck reporting hazards across the
// block's later barriers). Then each warp takes its 16 columns of the state into registers
// (the mma accumulator layout), folds, stores, and runs the window product, each over the
// tile's first half of key channels while the second lands, then over the second (a row that
// keeps its checkpoint at a window of 3-4 skips the fold's mma: onepass_ff_g); the solve
// follows. Nothing goes through a work space in device memory.
// Launched as a programmatic dependent (kd_kda_onepass_pdl): the state tile, the fold's
// corrections and v (written two or more kernels back, or by earlier steps) are in flight
// before the block waits for the kernel before it (kd_kda_prepare), whose outputs (the window's
// keys, queries, decays and beta) it reads after.
// Load order (SCHED, kd_kda_onepass_sched). The grid's first blocks all issue their tiles at once
// and a block's loads land behind what its SM issued before them: traced on an H200
// (tests/bench/trace/onepass_trace.cu, B = 128, kept steps of the lazy checkpoint) with the tile
// issued first, the window half's prologue ended 5.8 us after the block's start at T = 4 (4.2 at
// T = 1), the fold half's 5.3 (4.6), and the block passed its first barrier at 6.4 (4.8): it waited
// on the prologue's loads, not the state. SCHED 1 loads the records' keys and decays before the
// tile and the window's inputs before the tile's second half: 5.1 / 4.1 / 5.7 us at T = 4 (3.3 /
// 3.3 / 3.7 at T = 1), the layer step 2-9 % faster at T = 2 / 4 (deferred B = 8 T = 4 12.8 -> 11.6
// us, B = 128 196.3 -> 186.2; the lazy checkpoint's kept steps B = 128 T = 2 120.7 -> 110.4), the
// same at T = 1 (tests/bench/results/kda_h200.md, the "tile first" lines of its log). At T = 8
// (NT = 2) the window half's prologue ends last in either order and SCHED 1 was 1-2 % slower, so
// those windows keep the tile first in the grid's first wave, whose blocks start while the kernel
// before still runs, and load all of the prologue's inputs first after it (SCHED 3: those blocks
// start once the kernel before has finished, since each first-wave block waits for it). On an H100
// (kda_check's "tile first" lines, tests/bench/results/kda_h100.md) SCHED 3 against the tile first at
// T = 8: the lazy checkpoint's mean step 0.7-2.5 % faster from B = 32 (B = 64 125.1 -> 122.0 us), deferred
// steps within -1.7 / +1.0 %. At T <= 4 SCHED 3 was slower than SCHED 1 (B = 128 kept steps T = 4
// 175.1 -> 191.7 us in the trace probe, 48B steps up to 4.4 %: logs/onepass_sched3_h100_e980118.log).
// ptxas reported 8 bytes of spills in the SCHED 1 form, 16 in SCHED 3's (none in SCHED 0), included in
// the times above; none in any K = 128 form since the early window (ad1d8c1).
// Since the copies of whole column blocks issue in ~4 instructions instead of ~30 (tile_fetch_full), SCHED 1
// is the default at windows of 5-8 too: on an H100 (onepass_trace, T = 8, B = 128 / 512, one build each) SCHED
// 3 with the fast copies was 6-17 % slower than before them, SCHED 1 with them 1-10 % faster than SCHED 3
// before them (kept steps B = 128 196.1 -> 176.2 us), and on 88 of its SMs (KD_GREEN_SMS, an H200's bandwidth
// an SM) 10-15 % faster (kept 278.7 -> 239.2, written 371.6 -> 327.6, deferred 327.6 -> 297.8):
// tests/bench/results/logs/fast_copies_h100.log.

// Small windows on the CUDA cores, in the lane's mma-layout registers (rows kt * 8 + 2q, + 1 of
// value columns vl, vl + 1): the fold of F <= 2 records and the window product of T <= 2
// tokens in plain fp32, one or two multiply-adds an element and product, where the 3xTF32
// mma costs its operand splits (the one-pass verify at B = 512, T = 1 executed twice the
// eager commit's instructions, issuing on half of its cycles: ncu, logs/ncu_stalls_*).
template <int KT, int KT0, int KT1> /* key tiles [KT0, KT1) */
__device__ __forceinline__ void cc_fold(float (&s)[KT][4], const float *cpF, const float *su, int UP, const float *wf,
                                        int KP, int F, int vl, int q) {
    float2 u0 = make_float2(0.f, 0.f), u1 = make_float2(0.f, 0.f); /* records 0, 1 at columns vl, vl + 1 */
    if (F > 0) u0 = *(const float2 *)(su + vl);
    if (F > 1) u1 = *(const float2 *)(su + UP + vl);
#pragma unroll
    for (int kt = KT0; kt < KT1; kt++) {
        const int r = kt * 8 + 2 * q;
        const float2 c = *(const float2 *)(cpF + r), w0 = *(const float2 *)(wf + r);
        const float2 w1 = F > 1 ? *(const float2 *)(wf + KP + r) : make_float2(0.f, 0.f);
        s[kt][0] = fmaf(u1.x, w1.x, fmaf(u0.x, w0.x, s[kt][0] * c.x));
        s[kt][1] = fmaf(u1.x, w1.y, fmaf(u0.x, w0.y, s[kt][1] * c.y));
        s[kt][2] = fmaf(u1.y, w1.x, fmaf(u0.y, w0.x, s[kt][2] * c.x));
        s[kt][3] = fmaf(u1.y, w1.y, fmaf(u0.y, w0.y, s[kt][3] * c.y));
    }
}
// P [value column][17] columns vl, vl + 1, rows n < 2T <= 4 of A [n][K + 8] (the window's
// decayed keys, then queries): the lane's rows of key tiles [KT0, KT1) into acc (zeroed first when
// zero), then the 4 lanes of its column pair (cc_window_put).
template <int KT, int KT0, int KT1>
__device__ __forceinline__ void cc_window_acc(const float (&s)[KT][4], const float *aw, int KP, int T,
                                              float (&acc)[2][4], int q, bool zero) {
    if (zero)
#pragma unroll
        for (int n = 0; n < 4; n++) acc[0][n] = acc[1][n] = 0.f;
#pragma unroll
    for (int kt = KT0; kt < KT1; kt++) {
        const int r = kt * 8 + 2 * q;
#pragma unroll
        for (int n = 0; n < 4; n++) {
            if (n >= 2 * T) break;
            const float2 x = *(const float2 *)(aw + n * KP + r);
            acc[0][n] = fmaf(s[kt][1], x.y, fmaf(s[kt][0], x.x, acc[0][n]));
            acc[1][n] = fmaf(s[kt][3], x.y, fmaf(s[kt][2], x.x, acc[1][n]));
        }
    }
}
/* the 4 lanes' sums of a column pair into P */
__device__ __forceinline__ void cc_window_put(float (&acc)[2][4], int T, float *P, int vl, int q) {
#pragma unroll
    for (int n = 0; n < 4; n++) {
        if (n >= 2 * T) break;
#pragma unroll
        for (int c = 0; c < 2; c++) {
            acc[c][n] += __shfl_xor_sync(0xffffffffu, acc[c][n], 1);
            acc[c][n] += __shfl_xor_sync(0xffffffffu, acc[c][n], 2);
        }
        if (q == 0) P[vl * 17 + n] = acc[0][n], P[(vl + 1) * 17 + n] = acc[1][n];
    }
}

// The one-pass verify's prologue inputs, thread c's channel: the F records' normalised keys and decays
// (written by earlier steps), and the window's keys, queries and decays (kd_kda_prepare's outputs).
template <int K>
__device__ __forceinline__ void onepass_records(const kd_kda_args &a, const kd_kda_row &row, size_t slot, int h, int F,
                                                int c, bool act, float (&kr)[16], float (&d)[16]) {
    const float *kg_old = a.rec_kg + ((slot * 2 + row.kg_read) * a.Tw) * (size_t)a.HV * 2 * K;
#pragma unroll
    for (int t = 0; t < 16; t++) {
        kr[t] = 0.f, d[t] = 1.f;
        if (t < F && act) {
            const float *rk = kg_old + ((size_t)t * a.HV + h) * 2 * K;
            kr[t] = rk[c], d[t] = rk[K + c];
        }
    }
}
template <int K>
__device__ __forceinline__ void onepass_window_in(const kd_kda_args &a, const kd_kda_row &row, int h, int hk, int T,
                                                  int c, bool act, float (&kw)[8], float (&qw)[8], float (&dw)[8]) {
#pragma unroll
    for (int t = 0; t < 8; t++) {
        kw[t] = qw[t] = dw[t] = 0.f;
        if (t < T && act) {
            const size_t n = (size_t)row.start + t;
            kw[t] = a.kn[(n * a.H + hk) * K + c], qw[t] = a.qn[(n * a.H + hk) * K + c];
            dw[t] = a.decay[(n * a.HV + h) * K + c];
        }
    }
}

__host__ __device__ constexpr int tc_onepass_smem(int K, int NT, int FR) {
    /* state [K][132], corrections [FR][136], v [8][128], beta, fold weights [FR][K + 8], cpF,
     * window keys / queries [NT * 8][K + 8], M and N, partial sums [8 warps][16 + 128], P [128][17] */
    return K * 132 + FR * 136 + 8 * 128 + 16 + FR * (K + 8) + K + NT * 8 * (K + 8) + 128 + 8 * 144 + 128 * 17;
}

// The one-pass verify's threads and the floats of a warp's partial sums (16, then M and N's 128)
constexpr int kOnepassThreads = 256, kOnepassNR = 144;
// The one-pass verify's prologue (threads [0, 128): c = tid, [128, 256): c = tid - 128). The fold half:
// the fold weights W [F][K + 8] and cpF from the records' keys and decays.
template <int K>
__device__ __forceinline__ void onepass_fold_weights(const float (&kr)[16], const float (&d)[16], int F, int c,
                                                     bool act, float *wf, float *cpF) {
    float p = 1.f;
#pragma unroll
    for (int t = 15; t >= 0; t--)
        if (t < F) {
            if (act) wf[t * (K + 8) + c] = kr[t] * p;
            p *= d[t];
        }
    if (act) cpF[c] = p;
}
// The window half: the new key/decay records (by the head's first block, first), the warps' sums for M and
// N (into mn), the decayed keys and queries A [2T][K + 8].
template <int K, int NT, bool PACKED>
__device__ __forceinline__ void onepass_window_prep(const kd_kda_args &a, const kd_kda_row &row, size_t slot, int h,
                                                    int T, int c, bool act, bool first, const float (&kw)[8],
                                                    const float (&qw)[8], const float (&dw)[8], int lane, float *mn,
                                                    float *aw) {
    float *kg_new = kg_new_base(a, row, slot, K);
    if (first && act)
#pragma unroll
        for (int t = 0; t < 8; t++)
            if (t < T) {
                float *r = kg_new + ((size_t)t * a.HV + h) * 2 * K;
                r[c] = kw[t], r[K + c] = dw[t];
            }
    if constexpr (PACKED)
        window_sums_packed<NT == 1 ? 1 : 4>(kw, qw, dw, T, lane, mn);
    else
        window_sums(kw, qw, dw, T, lane, mn);
    float b = 1.f;
#pragma unroll
    for (int t = 0; t < 8; t++)
        if (t < T) {
            b *= dw[t];
            if (act) aw[t * (K + 8) + c] = kw[t] * b, aw[(T + t) * (K + 8) + c] = qw[t] * b;
        }
}
// The rows past F and 2T zeroed for the mma, which reads whole 8-row tiles (small folds and windows on the
// CUDA cores read only the rows they use)
template <int K, int NT>
__device__ __forceinline__ void onepass_pad(float *wf, float *aw, int F, int T, bool ccf, bool ccw, int tid) {
    if (!ccf)
        for (int i = F * K + tid; i < (F + 7) / 8 * 8 * K; i += kOnepassThreads) wf[i / K * (K + 8) + i % K] = 0.f;
    if (!ccw)
        for (int i = 2 * T * K + tid; i < NT * 8 * K; i += kOnepassThreads) aw[i / K * (K + 8) + i % K] = 0.f;
}
// M, N from the window warps' sums (red [8][kOnepassNR], warps 4-7): 128 entries, one per thread c of the
// window half
__device__ __forceinline__ void onepass_mn(const float *red, float *M, int c, int T) {
    constexpr int NR = kOnepassNR;
    const int t = c % 64 / 8, r = c % 8;
    float x = 0.f;
    if (r <= t && t < T) {
        const int i = 16 + c / 64 * 64 + t * 8 + r;
        x = (red[4 * NR + i] + red[5 * NR + i]) + (red[6 * NR + i] + red[7 * NR + i]);
    }
    M[c] = x; /* M and N are contiguous */
}

// The fold-free kept step: a row that keeps its checkpoint (the lazy checkpoint) needs the folded
// state S_F = diag(cpF) S + W^T U (fold weights W [F][K], corrections U [F][V]) only through the
// window product S_F^T A^T = (diag(cpF) S)^T A^T + U^T (W A^T), so the state is only scaled and the
// rank-F term enters the product through G = W A^T [F][2T] (here) and one more mma a record tile
// (onepass_ff_add), instead of an mma a record tile and key tile. Taken at windows of 3-4 (NT = 1)
// with folds of 3 or more (smaller ones fold on the CUDA cores). Measured on an H100 (kda_check, kept
// steps, the same build with and without): T = 4 2.8-5.1 % faster from B = 8 (B = 128 146.7 -> 139.7
// us), T = 1-2 unchanged (not taken); at windows of 5-8 it was 6-9 % slower (B = 128 T = 8 190.1 ->
// 206.5 us), so not taken there: the blocks' compute gets shorter but their tile's second half lands ~2 us
// later (tests/bench/results/tried/README.md, ff_wide_tried.patch); 48B steps within +-1 %, the noise of that
// benchmark (tests/bench/results/logs/fold_free_h100_23eab87.log). G [16][17] from W [F][K + 8] and
// A [2T][K + 8] in shared memory: 8 threads an entry, 4 channels at a time, then their sums by
// shuffles. A pass takes 4 records x 8 window rows (2T <= 8: windows of up to 4), with no division (the
// entry's record and row by a runtime 2T were ~25 instructions a warp of a kept step's ~1600: ncu); kept steps
// at T = 4 0.5 % faster on an H100, 2.6-3.0 % on 88 of its SMs (tests/bench/results/logs/ff_g_nodiv_h100.log,
// which also has the key head without its divisions when HV = H: windows of 8 10-16 % slower, not kept).
template <int K>
__device__ __forceinline__ void onepass_ff_g(const float *wf, const float *aw, int F, int T, float *G, int tid) {
    constexpr int KP = K + 8;
    const int j = tid % 8, n = tid / 8 % 8;
    for (int f0 = 0; f0 < F; f0 += kOnepassThreads / 64) { /* the whole warp shuffles */
        const int f = f0 + tid / 64;
        const bool live = f < F && n < 2 * T;
        float x = 0.f;
        if (live) {
            const float *w = wf + f * KP, *b = aw + n * KP;
#pragma unroll
            for (int m = 0; m < K / 32; m++) {
                const float4 u = *(const float4 *)(w + m * 32 + j * 4), v = *(const float4 *)(b + m * 32 + j * 4);
                x = fmaf(u.x, v.x, fmaf(u.y, v.y, fmaf(u.z, v.z, fmaf(u.w, v.w, x))));
            }
        }
        x += __shfl_xor_sync(0xffffffffu, x, 1);
        x += __shfl_xor_sync(0xffffffffu, x, 2);
        x += __shfl_xor_sync(0xffffffffu, x, 4);
        if (live && j == 0) G[f * 17 + n] = x;
    }
}
// acc[0] += U^T G for the warp's columns vl, vl + 1 (rows of G past F and columns past 2T read as 0)
template <int NT>
__device__ __forceinline__ void onepass_ff_add(float (&acc)[4][NT][4], const float *su, int UP, const float *G, int F,
                                               int T, int vl, int g, int q) {
#pragma unroll
    for (int ft = 0; ft < 2; ft++) {
        if (ft * 8 >= F) break;
        const int t0 = ft * 8 + q;
        const frag_a u = records_frag(su, UP, F, ft, vl, q);
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            const int n = nt * 8 + g;
            const float b0 = t0 < F && n < 2 * T ? G[t0 * 17 + n] : 0.f;
            const float b1 = t0 + 4 < F && n < 2 * T ? G[(t0 + 4) * 17 + n] : 0.f;
            uint32_t h0, h1, l0, l1;
            split2(b0, b1, h0, h1, l0, l1);
            mma3(acc[0][nt], u, h0, h1, l0, l1);
        }
    }
}

#ifdef KD_KDA_TRACE
/* probe builds only (nvcc -DKD_KDA_TRACE: tests/bench/trace/onepass_trace.cu): the one-pass verify's blocks
 * in time (the layer whose state is kd_trace_state: per block its SM, start, prologue ends, state halves landed,
 * end, from %globaltimer); none of it in other builds */
__device__ const float *kd_trace_state;
__device__ unsigned long long *kd_trace_buf;
__device__ __forceinline__ unsigned long long kd_gtime() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)::"memory");
    return t;
}
#define KD_TRACE_DECL unsigned long long tr_[4];
#define KD_TRACE_AT(i) if (threadIdx.x == 0) tr_[i] = kd_gtime();
#define KD_TRACE_START KD_TRACE_AT(0)
#define KD_TRACE_END                                                                                            \
    KD_TRACE_AT(3)                                                                                              \
    if (threadIdx.x == 0 && a.state == kd_trace_state && kd_trace_buf) {                                        \
        unsigned sm;                                                                                            \
        asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));                                                         \
        const unsigned lin = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);                    \
        unsigned long long *b = kd_trace_buf + (size_t)lin * 8;                                                 \
        b[0] = sm, b[1] = tr_[0], b[2] = tr_[1], b[3] = tr_[2], b[4] = tr_[3];                                  \
    }
#define KD_TRACE_PRO(i)                                                                                         \
    if ((threadIdx.x == 0 || threadIdx.x == 128) && a.state == kd_trace_state && kd_trace_buf) {                \
        const unsigned lin = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);                    \
        kd_trace_buf[(size_t)lin * 8 + 5 + threadIdx.x / 128 + i] = kd_gtime();                                 \
    }
#else
#define KD_TRACE_DECL
#define KD_TRACE_AT(i)
#define KD_TRACE_START
#define KD_TRACE_END
#define KD_TRACE_PRO(i)
#endif

/* VAR 1 (kd_kda_onepass_small_form, the default for launches whose windows are all of 1-2 tokens, where the
 * fold-free kept step is never taken): the form without that step's code. Measured on an H100 (kda_check's
 * lazy lines, one build, 2fe57cf): kept steps at T = 2 0.5-1.7 % faster from B = 8 (B = 256 222.6 -> 218.9 us,
 * B = 512 432.5 -> 425.9), at T = 1 0-0.7 %, written steps unchanged; a form also without the early window was
 * 3-10 % slower than this one (tests/bench/results/logs/ws_small_h100_2fe57cf.log) */
template <int K, int NT, bool CS = false, int SCHED = 0, int VAR = 0>
__global__ void __launch_bounds__(256, 2) verify_onepass_kernel(const kd_kda_args a) {
    static_assert(VAR == 0 || VAR == 1, "VAR: 0 or 1");
    extern __shared__ __align__(16) float smem[];
    KD_TRACE_DECL
    KD_TRACE_START
    constexpr int KT = K / 8, KP = K + 8, CB = 128, SP = CB + 4, UP = CB + 8, NTH = kOnepassThreads, NR = kOnepassNR;
    const kd_kda_row row = a.rows[blockIdx.z];
    const int h = blockIdx.y, hk = h / (a.HV / a.H), V = a.V, Tw = a.Tw, T = row.len, F = row.fold;
    const int FR = (Tw + 7) / 8 * 8, tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, q = lane % 4;
    const int j0 = blockIdx.x * CB;
    const size_t slot = (size_t)row.slot;
    float *S = a.state + slot * kda_sstride(a) + h * (size_t)K * V;
    float *st = smem, *su = st + K * SP, *sv = su + FR * UP, *sb = sv + 8 * CB, *wf = sb + 16, *cpF = wf + FR * KP;
    float *aw = cpF + K, *M = aw + NT * 8 * KP, *N = M + 64, *red = N + 64, *P = red + 8 * NR;
    // (0) asynchronous copies, in two groups: the state tile's first K / 2 rows with the fold's
    // corrections, v and beta, then its other half (folded and stored while that half lands).
    // SCHED 1 (the prologue's inputs first): the records' keys and decays go to registers before the
    // tile's copies are issued, the window's keys, queries and decays (after the wait: the kernel
    // before wrote them) before its second half's.
    const int c = tid % 128;
    const bool act = c < K;
    float kr[16], d[16];          /* the prologue's inputs: threads [0, 128) the records' keys and decays, */
    float kw[8], qw[8], dw[8];    /* threads [128, 256) the window's keys, queries and decays */
    /* SCHED 3: blocks of the grid's first wave (2 an SM) in the order of SCHED 0, the later ones (they start
     * after the kernel before has finished, since every first-wave block waits for it) with all of the
     * prologue's inputs loaded before the tile */
    bool later = false;
    if constexpr (SCHED == 3) {
        unsigned nsm;
        asm("mov.u32 %0, %%nsmid;" : "=r"(nsm));
        later = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z) >= 2 * nsm;
    }
    if (SCHED == 1 || later)
        if (tid < 128) onepass_records<K>(a, row, slot, h, F, c, act, kr, d);
    if (later) {
        pdl_wait();
        if (tid >= 128) onepass_window_in<K>(a, row, h, hk, T, c, act, kw, qw, dw);
    }
    /* a whole, 16-byte aligned column block (the rule at V = 128 and the backend's layouts): every copy 16 bytes,
     * unrolled at fixed strides (tile_fetch_full; the general loops' index arithmetic was a quarter of a kept
     * step's instructions) */
    const bool full = V % 4 == 0 && j0 + CB <= V && (((uintptr_t)S | (uintptr_t)a.rec_u | (uintptr_t)a.v) & 15) == 0;
    if (full) {
        tile_fetch_full<CB, NTH, 0, K / 2>(st, S, V, j0);
        rows_fetch_full<CB, UP, NTH>(su, a.rec_u + ((slot * Tw) * a.HV + h) * V + j0, (size_t)a.HV * V, F);
        rows_fetch_full<CB, CB, NTH>(sv, a.v + ((size_t)row.start * a.HV + h) * V + j0, (size_t)a.HV * V, T);
    } else {
        tile_fetch<K, CB>(st, S, V, j0, 0, K / 2);
        for (int i = tid; i < F * CB; i += NTH) {
            const int t = i / CB, jj = i % CB;
            if (j0 + jj < V) cp_async4(su + t * UP + jj, a.rec_u + ((slot * Tw + t) * a.HV + h) * V + j0 + jj);
            else su[t * UP + jj] = 0.f;
        }
        for (int i = tid; i < T * CB; i += NTH) {
            const int t = i / CB, jj = i % CB;
            if (j0 + jj < V) cp_async4(sv + i, a.v + (((size_t)row.start + t) * a.HV + h) * V + j0 + jj);
            else sv[i] = 0.f;
        }
    }
    cp_async_commit();
    if (SCHED != 1) {
        if (full) tile_fetch_full<CB, NTH, K / 2, K>(st, S, V, j0);
        else tile_fetch<K, CB>(st, S, V, j0, K / 2, K);
        cp_async_commit();
    }
    pdl_wait(); // the kernel before has finished (a no-op in plain stream order)
    /* the kernel after may be scheduled once every block is here (the backend's gated RMSNorm: its blocks set
     * up during the last blocks of this one, and load their gate early). Measured with and without on an
     * H200 (with the norm's early gate, alternated rounds): 0.3-1.0 % faster 48B steps at B = 1-128
     * (tests/bench/results/logs/gnorm_h200_85b7682.log) */
    pdl_trigger();
    /* beta, read by the solve (barriers later): loaded now, stored to shared memory after the prologue,
     * so that its latency overlaps the records' loads instead of coming before them (the first warp's
     * threads store it; a store right after the load kept that warp, and the block, one load longer) */
    const float bload = tid < T ? a.beta[((size_t)row.start + tid) * a.HV + h] : 0.f;
    if constexpr (SCHED == 1) {
        if (tid >= 128) onepass_window_in<K>(a, row, h, hk, T, c, act, kw, qw, dw);
        if (full) tile_fetch_full<CB, NTH, K / 2, K>(st, S, V, j0);
        else tile_fetch<K, CB>(st, S, V, j0, K / 2, K);
        cp_async_commit();
    }
    // (1) the prologue, in two halves
    if (tid < 128) { /* the records (keys and decays): fold weights */
        if (SCHED == 0 || (SCHED == 3 && !later)) onepass_records<K>(a, row, slot, h, F, c, act, kr, d);
        onepass_fold_weights<K>(kr, d, F, c, act, wf, cpF);
    } else { /* the window: decayed keys and queries, M and N; the new records */
        if (SCHED == 0 || (SCHED == 3 && !later)) onepass_window_in<K>(a, row, h, hk, T, c, act, kw, qw, dw);
        onepass_window_prep<K, NT, VAR == 0>(a, row, slot, h, T, c, act, blockIdx.x == 0, kw, qw, dw, lane,
                                             red + warp * NR + 16, aw);
    }
    KD_TRACE_PRO(0)
    /* small folds and windows on the CUDA cores (cc_fold, cc_window_acc) */
    const bool ccf = F <= 2, ccw = T <= 2;
    /* the fold-free kept step (onepass_ff_g; block-uniform) at windows of 3-4 with folds of 3 or more */
    const bool ff = VAR == 0 && NT == 1 && row.keep && !ccf && !ccw;
    float *G = red; /* [16][17]: red's first 4 warps' part is unused */
    onepass_pad<K, NT>(wf, aw, F, T, ccf, ccw, tid);
    if (tid < T) sb[tid] = bload;
    cp_async_wait1();
    __syncthreads();
    KD_TRACE_AT(1)
    if (tid >= 128) onepass_mn(red, M, c, T); /* read by the solve, after two more barriers */
    if (ff) onepass_ff_g<K>(wf, aw, F, T, G, tid); /* read after the next barrier */
    // (2) per warp: 16 columns of S^T into registers, fold, store, window product (the first half of
    // the key channels while the second lands)
    const int vl = warp * 16 + 2 * g;
    const bool live = j0 + vl < V;
    float s[KT][4];
    tile_to_regs<KT, SP, 0, KT / 2>(s, st, vl, q);
    if (ff) scale_keys<KT, 0, KT / 2>(s, cpF, q);
    else if (F > 0) {
        if (ccf) cc_fold<KT, 0, KT / 2>(s, cpF, su, UP, wf, KP, F, vl, q);
        else tc_fold_smem<K, 0, KT / 2>(s, cpF, su, UP, wf, F, vl, g, q);
        if (live && !row.keep) tc_store<KT / 2, 0, CS>(*(float(*)[KT / 2][4])s, S, V, j0 + vl, q);
    }
    /* the window product over the first half's key channels now, while the second half lands (the same
     * sums in the same order as in one product after it; measured on an H100 against one product after the
     * second half: the lazy checkpoint's kept steps 0-3.8 % faster, written steps 0-1.2 %, 48B steps
     * 0.1-1.1 %, nowhere slower; tests/bench/results/logs/early_window_h100_23eab87.log. It also left
     * ptxas no spills in the K = 128 forms, which had 4-16 bytes) */
    float acc[4][NT][4];
    float cacc[2][4];
    if (ccw) cc_window_acc<KT, 0, KT / 2>(s, aw, KP, T, cacc, q, true);
    else tc_window_zero<NT>(acc), tc_window_acc<K, NT, 0, KT / 2>(s, smem_bfrag<K>{aw, g, q}, acc);
    cp_async_wait();
    __syncthreads();
    KD_TRACE_AT(2)
    tile_to_regs<KT, SP, KT / 2, KT>(s, st, vl, q);
    if (ff) scale_keys<KT, KT / 2, KT>(s, cpF, q);
    else if (F > 0) {
        if (ccf) cc_fold<KT, KT / 2, KT>(s, cpF, su, UP, wf, KP, F, vl, q);
        else tc_fold_smem<K, KT / 2, KT>(s, cpF, su, UP, wf, F, vl, g, q);
        if (live && !row.keep) tc_store<KT, KT / 2, CS>(s, S, V, j0 + vl, q);
    }
    if (ccw) cc_window_acc<KT, KT / 2, KT>(s, aw, KP, T, cacc, q, false), cc_window_put(cacc, T, P, vl, q);
    else {
        tc_window_acc<K, NT, KT / 2, KT>(s, smem_bfrag<K>{aw, g, q}, acc);
        if (ff) onepass_ff_add<NT>(acc, su, UP, G, F, T, vl, g, q);
        tc_window_put<NT>(acc, P, vl, q);
    }
    __syncthreads();
    // (3) per value column: the triangular solve
    if (tid < CB && j0 + tid < V)
        tc_solve_column(a, (size_t)row.start, slot * Tw + rec_off(row), h, T, CB, tid, j0 + tid, sv, sb, P, M, N);
    KD_TRACE_END
}

/* The closed form is exact and halves the multiply-adds, but measured slower on an H200
 * (its per-block prologue, O(T^2 K), is repeated by every column tile of a head): off by
 * default until that prologue moves into kd_kda_prepare. */
int g_closed_form;

/* The CUDA-core verify is launched as a programmatic dependent of the kernel before it
 * (kd_kda_pdl(0): plain stream order): its blocks start while that kernel finishes and load
 * everything it cannot have written (see verify_kernel). Past its wait it lets the kernel after
 * it be scheduled (the backend's gated RMSNorm, whose prefetching blocks then run beside it:
 * cuda_backend.cu); that kernel waits for it before it reads anything. The contract: the kernel right
 * before kd_kda_verify in the stream writes none of the state, the records or v (the
 * backend's is kd_kda_prepare or kd_cu_conv_prepare, which write qn, kn, qk, decay and beta,
 * and the latter the conv records of the q and k channels), and it lets the
 * verify be scheduled only once the kernels before it have finished (in plain stream order,
 * or launched by kd_launch_dep, which waits before it triggers: launch.cuh), since v comes
 * from the kernel two back. */
template <typename F>
cudaError_t launch_pdl(F f, dim3 grid, size_t sm, cudaStream_t s, const kd_kda_args *a) {
    if (sm > 48 * 1024) cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm);
    return kd_launch_dep(f, grid, dim3(kThreads), sm, s, *a);
}

template <int KR, int R, int NC>
cudaError_t launch_verify(const kd_kda_args *a, kd_kda_mode mode, int max_len, cudaStream_t s) {
    constexpr int K = KR * R, CB = kThreads / R * NC;
    dim3 grid((a->V + CB - 1) / CB, a->HV, a->n_rows);
    const size_t sm = ((size_t)(3 * max_len + 2 * a->Tw) * (K + 4 * R) + (size_t)(max_len + a->Tw) * CB + 32) * sizeof(float);
    if (mode == KD_KDA_STORE_ALL) {
        return launch_pdl(verify_kernel<KR, R, NC, true>, grid, sm, s, a);
    } else if (!g_closed_form) {
        return launch_pdl(verify_kernel<KR, R, NC, false>, grid, sm, s, a);
    } else {
        const size_t smw = ((size_t)(5 * max_len + 3 * a->Tw + 1) * (K + 4 * R) +
                            (size_t)(max_len + a->Tw + 3 * max_len) * CB + 16 + 2 * 256) * sizeof(float);
        auto f = verify_wy_kernel<KR, R, NC>;
        if (smw > 48 * 1024) cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smw);
        f<<<grid, kThreads, smw, s>>>(*a);
    }
    return cudaGetLastError();
}

template <int KR, int R, int NC>
cudaError_t launch_commit(const kd_kda_args *a, cudaStream_t s) {
    constexpr int K = KR * R, CB = kThreads / R * NC;
    dim3 grid((a->V + CB - 1) / CB, a->HV, a->n_rows);
    const size_t sm = ((size_t)(2 * a->Tw) * (K + 4 * R) + (size_t)a->Tw * CB) * sizeof(float);
    commit_kernel<KR, R, NC><<<grid, kThreads, sm, s>>>(*a);
    return cudaGetLastError();
}

int g_force_r; /* tests and benchmarks: force a shape (0: choose) */

/* The tile shape. "Wide" (R = 8 lanes of 16 rows, 4 columns each) keeps shared-memory
 * traffic low and is the choice when the grid is large; "narrow" (1 column per lane, R as
 * small as registers allow) makes more blocks when the batch is small. g_force_r: 2, 4, 8
 * narrow with that R; 16: wide. */
int g_tc = 1, g_tc_warps; /* the tensor-core path (default) and its warps per block (0: choose) */
/* The verify's form: 1 (default) chosen by size (verify_form); forced (tests, benchmarks):
 * 4 the split verify with the verify a programmatic dependent of the prologue, the state in
 * registers only, 2 the same in plain stream order (both need a.work), 5 the split verify
 * with half the state through shared memory (the default's form from B = 32), 3 the
 * one-pass verify, 0 the one-kernel verify (verify_tc_kernel, with the rule of tc_ok). */
int g_split = 1;

enum { FORM_ONE_KERNEL, FORM_SPLIT, FORM_ONE_PASS, FORM_CUDA_CORES, FORM_SPLIT_HALF };

/* The default, from the H200 measurements (tests/bench/results/kda_h200.md, HV = 32,
 * K = V = 128), by (row, head, 128-column) tiles: up to 64 (B <= 2), the CUDA-core kernels
 * (a programmatic dependent launch; faster than the one-pass verify there up to T = 8); above,
 * the one-pass verify. Each was the fastest measured there. Until the records carried the
 * prepared keys and decays, the split verify (half of the state through shared memory) was
 * the fastest from B = 32; since, the one-pass verify is 5-13 % faster than it at every size
 * from B = 32 to 512 and every window (its prologue had been the records' norms and
 * exponentials, which the split form's separate kernel computed once a head). */
int verify_form(const kd_kda_args *a) {
    if (g_split == 0) return FORM_ONE_KERNEL;
    if (g_split == 3) return FORM_ONE_PASS;
    if (g_split == 5) return a->work ? FORM_SPLIT_HALF : FORM_ONE_PASS;
    if (g_split == 2 || g_split == 4) return a->work ? FORM_SPLIT : FORM_ONE_PASS;
    if (g_tc_warps) return a->work ? FORM_SPLIT : FORM_ONE_KERNEL; /* block shapes of the split verify */
    const long tiles = (long)a->n_rows * a->HV * ((a->V + 127) / 128);
    if (tiles <= 64) return FORM_CUDA_CORES;
    return FORM_ONE_PASS;
}

bool tc_ok(const kd_kda_args *a, int max_len) {
    if (!g_tc || g_force_r || g_closed_form || a->V % 2 || max_len > 8 || (a->K != 32 && a->K != 64 && a->K != 128))
        return false;
    if (g_tc_warps || g_tc == 2) return true; /* forced (tests, benchmarks) */
    if (max_len > 0 && g_split && g_tc == 1) return verify_form(a) != FORM_CUDA_CORES;
    /* Commits: tensor cores except up to 64 (row, head, 128-column) tiles (B <= 2 at HV = 32),
     * where the CUDA-core commit is faster (H200, B = 1: 3.6-7.2 us against 6.2-7.4 us for
     * windows of 1-8; B = 8: 13.2-17.8 against 12.1-13.5). The one-kernel verify
     * (kd_kda_split(0)): tensor cores for windows of up to 4 tokens when the grid has at least
     * two 4-warp blocks per SM (B >= 8 at HV = 32), else the CUDA-core kernels (the rule of
     * the H200 measurements before the split and one-pass forms). */
    if (max_len == 0) return (long)a->n_rows * a->HV * ((a->V + 127) / 128) > 64;
    return max_len <= 4 && (long)a->n_rows * a->HV * ((a->V + 63) / 64) >= 264;
}

/* Warps per block (16 value columns each): 4 (measured fastest at every batch size). */
int tc_warps(const kd_kda_args *a) {
    (void)a;
    return g_tc_warps ? g_tc_warps : 4;
}

template <int K, int NW, int NT, int MINB = 1>
cudaError_t launch_verify_tc(const kd_kda_args *a, cudaStream_t s) {
    const size_t sm = (size_t)tc_verify_smem(K, NW, NT, (a->Tw + 7) / 8 * 8) * sizeof(float);
    auto f = verify_tc_kernel<K, NW, NT, MINB>;
    if (sm > 48 * 1024) cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm);
    f<<<dim3((a->V + NW * 16 - 1) / (NW * 16), a->HV, a->n_rows), NW * 32, sm, s>>>(*a);
    return cudaGetLastError();
}

template <int K, int NW, int NT, int MINB, bool HALF = false>
cudaError_t launch_verify_split(const kd_kda_args *a, cudaStream_t s) {
    tc_prologue_kernel<K><<<dim3(a->HV, a->n_rows), K, 0, s>>>(*a);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    const size_t sm = (size_t)tc_split_smem(K, NW, NT, (a->Tw + 7) / 8 * 8, HALF) * sizeof(float);
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((a->V + NW * 16 - 1) / (NW * 16), a->HV, a->n_rows);
    cfg.blockDim = dim3(NW * 32);
    cfg.dynamicSmemBytes = sm;
    cfg.stream = s;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    if (g_split != 2) {
        cfg.attrs = at, cfg.numAttrs = 1;
        auto f = verify_split_kernel<K, NW, NT, MINB, true, HALF>;
        if (sm > 48 * 1024) cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm);
        return cudaLaunchKernelEx(&cfg, f, *a);
    }
    auto f = verify_split_kernel<K, NW, NT, MINB, false, HALF>;
    if (sm > 48 * 1024) cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm);
    return cudaLaunchKernelEx(&cfg, f, *a);
}

int g_onepass_pdl = 1; /* kd_kda_onepass_pdl */
/* kd_kda_store_hint: the one-pass verify's checkpoint stores evict-first (st.global.cs), so that its dirty
 * lines leave the L2 while the verify still streams states, not during the weight products after it
 * (48B steps on an H200, alternated rounds in one process, plain / evict-first: B = 32 s = 0 3.090 /
 * 3.051 ms, s = 3 3.829 / 3.773; B = 128 s = 0 6.139 / 6.122, s = 3 10.721 / 10.653; B = 8 2.266 /
 * 2.253; tests/bench/results/logs/hint_h200_d9b32a0.log) */
int g_store_cs = 1;
int g_onepass_sched = 1; /* kd_kda_onepass_sched */
int g_onepass_small = 1;  /* kd_kda_onepass_small_form */

template <int K, int NT>
cudaError_t launch_verify_onepass(const kd_kda_args *a, int max_len, cudaStream_t s) {
    const size_t sm = (size_t)tc_onepass_smem(K, NT, (a->Tw + 7) / 8 * 8) * sizeof(float);
    /* by default (1, and 2) the prologue's inputs first (SCHED 1) at every window; see the kernel's comment */
    const int sched = g_onepass_sched == 2 ? 1 : g_onepass_sched;
    auto f = sched == 1   ? (g_store_cs ? verify_onepass_kernel<K, NT, true, 1> : verify_onepass_kernel<K, NT, false, 1>)
             : sched == 3 ? (g_store_cs ? verify_onepass_kernel<K, NT, true, 3> : verify_onepass_kernel<K, NT, false, 3>)
                          : (g_store_cs ? verify_onepass_kernel<K, NT, true, 0> : verify_onepass_kernel<K, NT, false, 0>);
    /* the small-window form (the default, kd_kda_onepass_small_form): K = 128, the default order, launches
     * whose windows are all of 1-2 tokens */
    if constexpr (K == 128 && NT == 1)
        if (g_onepass_small && g_onepass_sched == 1 && max_len <= 2)
            f = g_store_cs ? verify_onepass_kernel<K, NT, true, 1, 1> : verify_onepass_kernel<K, NT, false, 1, 1>;
    cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm);
    if (!(kd_cuda_pdl && g_onepass_pdl)) {
        f<<<dim3((a->V + 127) / 128, a->HV, a->n_rows), 256, sm, s>>>(*a);
        return cudaGetLastError();
    }
    return kd_launch_dep(f, dim3((a->V + 127) / 128, a->HV, a->n_rows), dim3(256), sm, s, *a);
}

template <int K, int NW>
cudaError_t launch_commit_tc(const kd_kda_args *a, cudaStream_t s) {
    const size_t sm = (size_t)tc_commit_smem(K, (a->Tw + 7) / 8 * 8) * sizeof(float);
    auto f = commit_tc_kernel<K, NW>;
    if (sm > 48 * 1024) cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm);
    f<<<dim3((a->V + NW * 16 - 1) / (NW * 16), a->HV, a->n_rows), NW * 32, sm, s>>>(*a);
    return cudaGetLastError();
}

template <int K>
int dispatch_tc(const kd_kda_args *a, bool commit, int max_len, cudaStream_t s) {
#define KD_TC(NW)                                                                                             \
    return (int)(commit ? launch_commit_tc<K, NW>(a, s)                                                       \
                        : max_len > 4 ? launch_verify_tc<K, NW, 2>(a, s) : launch_verify_tc<K, NW, 1>(a, s))
    const int nw = tc_warps(a);
    const int form = commit || g_tc != 1 ? FORM_ONE_KERNEL : verify_form(a);
    if (form == FORM_ONE_PASS)
        return (int)(max_len > 4 ? launch_verify_onepass<K, 2>(a, max_len, s) : launch_verify_onepass<K, 1>(a, max_len, s));
    if (form == FORM_SPLIT_HALF || (form == FORM_SPLIT && g_split == 1 && nw == 4)) /* forced: the default from B = 32 until the records were prepared */
        return (int)(max_len > 4 ? launch_verify_split<K, 4, 2, 5, true>(a, s) : launch_verify_split<K, 4, 1, 6, true>(a, s));
    if (form == FORM_SPLIT) {
#define KD_SPLIT(NW, MINB) \
    return (int)(max_len > 4 ? launch_verify_split<K, NW, 2, MINB>(a, s) : launch_verify_split<K, NW, 1, MINB>(a, s))
        switch (nw) {
        case 1: KD_SPLIT(1, 16);
        case 2: KD_SPLIT(2, 8);
        case 8: KD_SPLIT(8, 2);
        default: KD_SPLIT(4, 4);
        }
#undef KD_SPLIT
    }
    if (nw == 4 && g_tc == 1 && !commit) /* 4 warps, registers capped for 4 blocks per SM (measured faster) */
        return (int)(max_len > 4 ? launch_verify_tc<K, 4, 2, 4>(a, s) : launch_verify_tc<K, 4, 1, 4>(a, s));
    switch (nw) {
    case 1: KD_TC(1);
    case 2: KD_TC(2);
    case 8: KD_TC(8);
    default: KD_TC(4);
    }
#undef KD_TC
}

template <bool COMMIT>
int dispatch(const kd_kda_args *a, kd_kda_mode mode, int max_len, cudaStream_t s) {
    if ((COMMIT || mode == KD_KDA_DEFERRED) && tc_ok(a, COMMIT ? 0 : max_len)) {
        if (a->K == 128) return dispatch_tc<128>(a, COMMIT, max_len, s);
        if (a->K == 64) return dispatch_tc<64>(a, COMMIT, max_len, s);
        return dispatch_tc<32>(a, COMMIT, max_len, s);
    }
    const long narrow_blocks = (long)a->n_rows * a->HV * ((a->V + 31) / 32);
    int r = g_force_r;
    /* small grids (B <= 2 at HV = 32): R = 4 (H200, B = 1, deferred, T = 1 / 2 / 4 / 8: 3.5 /
     * 4.0 / 5.0 / 7.1 us against 4.7 / 5.3 / 6.7 / 9.1 with R = 8, and 4.7 / 5.0 / 6.1 / 7.6
     * with R = 8 lanes of 2 columns; R = 8 had been faster for windows of up to 2 before the
     * window took one pass a position) */
    if (!r) r = a->V % 4 == 0 && a->K % 64 == 0 && narrow_blocks >= 512 ? 16 : (narrow_blocks >= 256 ? 2 : 4);
    if (r == 16 && (a->V % 4 || a->K % 64)) r = 4;
    while (r != 16 && a->K / r > 64) r *= 2;
    while (r != 16 && r > 1 && a->K / r < 8) r /= 2;
#define KD_GO(KR, R, NC) return COMMIT ? (int)launch_commit<KR, R, NC>(a, s) : (int)launch_verify<KR, R, NC>(a, mode, max_len, s)
    switch (a->K) {
    case 32: if (r == 1) KD_GO(32, 1, 1); if (r == 2) KD_GO(16, 2, 1); KD_GO(8, 4, 1);
    case 64: if (r == 16) KD_GO(8, 8, 4); if (r == 1) KD_GO(64, 1, 1); if (r == 2) KD_GO(32, 2, 1); if (r == 4) KD_GO(16, 4, 1); KD_GO(8, 8, 1);
    case 128: if (r == 16) KD_GO(16, 8, 4); if (r == 2) KD_GO(64, 2, 1); if (r == 4) KD_GO(32, 4, 1); KD_GO(16, 8, 1);
    default: return (int)cudaErrorInvalidValue;
    }
#undef KD_GO
}

// ------------------------------------------------------------ prefill in chunks
// The prefill recurrence (kd_kda_prefill) over a row's tokens in chunks of C = 8, each chunk the
// deferred verify's arithmetic on the state it starts from (kda.cuh): the window product P^T =
// S^T [b o k; b o q]^T, the triangular solve for the chunk's u and o, then the fold S <- S diag(cp)
// + U^T Wf, so that the state advances 8 tokens at a time by tensor-core products (3xTF32) and
// stays in registers from the row's first token to its last. All products of decays run forward
// from 1 within a chunk (no quotients): nothing overflows whatever the gates.
// Two kernels. prefill_prep_kernel: what does not depend on the state, for every (chunk, value
// head) at once (a block each, a thread a key channel): the decayed keys and queries, the fold
// weights and cp, M and N (window_sums), into the work space, (25 K + 128) floats a (chunk, head):
// 13 KiB at K = 128, written once and read by the head's V / 32 column blocks (L2). Then
// prefill_chunk_kernel: a block of 2 warps a (row, value head, 32 value columns), serial over the
// row's chunks; each chunk's work (and v, beta) lands in shared memory by asynchronous copies two
// chunks ahead (three buffers, one barrier a chunk), so a chunk is the window product, the solve
// (16 lanes a warp, a column each) and the fold, nothing else on its path.
constexpr int kPC = 8; /* tokens a chunk */
__host__ __device__ constexpr int pc_work(int K) { return 25 * K + 128; } /* floats a (chunk, head) */

template <int K>
__global__ void __launch_bounds__(K) prefill_prep_kernel(const kd_kda_prow *rows, int n_rows, int H, int HV,
                                                         const float *qn, const float *kn, const float *decay,
                                                         float *work) {
    constexpr int C = kPC, NWP = K / 32;
    __shared__ float red[NWP][128];
    const int z = blockIdx.x, h = blockIdx.y, hk = h / (HV / H), c = threadIdx.x, lane = c % 32;
    int lo = 0, hi = n_rows - 1; /* the last row whose first chunk is <= z */
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (rows[mid].chunk <= z) lo = mid;
        else hi = mid - 1;
    }
    const kd_kda_prow r = rows[lo];
    const int j = z - r.chunk, T = min(C, r.len - j * C);
    if (j < 0 || T < 1) return; /* no chunk of any row (the caller's count is past them) */
    float kw[C], qw[C], dw[C];
#pragma unroll
    for (int t = 0; t < C; t++) {
        kw[t] = qw[t] = 0.f, dw[t] = 1.f;
        if (t < T) {
            const size_t n = (size_t)r.start + j * C + t;
            kw[t] = kn[(n * H + hk) * K + c], qw[t] = qn[(n * H + hk) * K + c];
            dw[t] = decay[(n * HV + h) * K + c];
        }
    }
    float *w = work + ((size_t)z * HV + h) * pc_work(K), *aw = w, *wf = w + 16 * K, *cp = wf + 8 * K;
    float b = 1.f;
#pragma unroll
    for (int t = 0; t < C; t++) {
        if (t < T) {
            b *= dw[t];
            aw[t * K + c] = kw[t] * b, aw[(T + t) * K + c] = qw[t] * b;
        } else { /* rows 2T..15 (read by the mma; their columns of P unused) */
            aw[(T + t) * K + c] = 0.f, aw[(C + t) * K + c] = 0.f;
        }
    }
    float p = 1.f;
#pragma unroll
    for (int t = C - 1; t >= 0; t--) {
        wf[t * K + c] = t < T ? kw[t] * p : 0.f;
        if (t < T) p *= dw[t];
    }
    cp[c] = p;
    window_sums(kw, qw, dw, T, lane, &red[c / 32][0]);
    __syncthreads();
    for (int i = c; i < 128; i += K) { /* M (i < 64) and N, [8][8], zeros outside r < t < T / r <= t < T */
        const int t = i % 64 / 8, rr = i % 8;
        float x = 0.f;
        if (t < T && (i < 64 ? rr < t : rr <= t))
#pragma unroll
            for (int y = 0; y < NWP; y++) x += red[y][i];
        w[25 * K + i] = x;
    }
}

template <int K>
__global__ void __launch_bounds__(64, 4) prefill_chunk_kernel(const kd_kda_prow *rows, int HV, int V, float *state,
                                                              int64_t ss, const float *work, const float *beta,
                                                              const float *v, float *o) {
    extern __shared__ __align__(16) float smem[];
    constexpr int C = kPC, KT = K / 8, KP = K + 8, CB = 32, UP = CB + 8, W = pc_work(K);
    /* a buffer: the chunk's work with rows at stride KP (aw [16], wf [8], cp, then M | N), v [C][CB], beta [C] */
    constexpr int BUF = 25 * KP + 128 + C * CB + C;
    const kd_kda_prow r = rows[blockIdx.z];
    const int h = blockIdx.y, tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, q = lane % 4;
    const int j0 = blockIdx.x * CB, nc = (r.len + C - 1) / C;
    float *P = smem + 3 * BUF, *su = P + CB * 17;
    for (int i = tid; i < 3 * C * CB; i += 64) smem[i / (C * CB) * BUF + 25 * KP + 128 + i % (C * CB)] = 0.f;
    __syncthreads(); /* v's columns past V stay 0 (never copied) */
    auto stage = [&](int ci) { /* chunk ci into buffer ci % 3; one group a call, empty past the row */
        if (ci < nc) {
            float *d = smem + ci % 3 * BUF;
            const float *w = work + ((size_t)(r.chunk + ci) * HV + h) * W;
            for (int i = tid; i < W / 4; i += 64) { /* 16-byte copies; rows of K at stride KP */
                const int e = 4 * i, row = e / K;
                cp_async16(d + (row < 25 ? row * KP + e % K : 25 * KP + e - 25 * K), w + e);
            }
            const int T = min(C, r.len - ci * C);
            for (int i = tid; i < T * CB; i += 64) {
                const int t = i / CB, jj = i % CB;
                if (j0 + jj < V)
                    cp_async4(d + 25 * KP + 128 + i, v + (((size_t)r.start + ci * C + t) * HV + h) * V + j0 + jj);
            }
            if (tid < T) cp_async4(d + 25 * KP + 128 + C * CB + tid, beta + ((size_t)r.start + ci * C + tid) * HV + h);
        }
        cp_async_commit();
    };
    const int vl = warp * 16 + 2 * g, va = j0 + vl;
    const bool live = va < V;
    float *S = state + (size_t)r.slot * ss + (size_t)h * K * V;
    float s[KT][4];
    stage(0);
    stage(1);
    tc_load<KT>(s, S, V, va, q, live);
    for (int ci = 0; ci < nc; ci++) {
        cp_async_wait1(); /* chunk ci has landed (ci + 1 may still fly) */
        __syncthreads();  /* for every thread's copies; and buffer (ci + 2) % 3 is no longer read */
        stage(ci + 2);
        const int T = min(C, r.len - ci * C);
        const float *aw = smem + ci % 3 * BUF, *wf = aw + 16 * KP, *cp = wf + 8 * KP, *mn = cp + KP,
                    *sv = mn + 128, *sb = sv + C * CB;
        tc_window_smem<K, 2>(s, aw, P, vl, g, q);
        __syncwarp();
        if (lane < 16) {
            const int col = warp * 16 + lane, j = j0 + col;
            tc_solve(T, CB, col, sv, sb, P, mn, mn + 64, [&](int t, float u, float y) {
                if (j < V) o[(((size_t)r.start + ci * C + t) * HV + h) * V + j] = y;
                su[t * UP + col] = u;
            });
        }
        __syncwarp();
        tc_fold_smem<K>(s, cp, su, UP, wf, T, vl, g, q);
    }
    cp_async_wait();
    if (live) tc_store<KT>(s, S, V, va, q);
}

__host__ __device__ constexpr int pc_smem(int K) { /* three buffers, P [32][17], U [8][40] */
    return 3 * (25 * (K + 8) + 128 + kPC * 32 + kPC) + 32 * 17 + 8 * 40;
}

template <int K>
cudaError_t launch_prefill_chunks(const kd_kda_prow *rows, int n_rows, int n_chunks, int H, int HV, int V,
                                  float *state, int64_t ss, const float *qn, const float *kn, const float *decay,
                                  const float *beta, const float *v, float *o, float *work, cudaStream_t s) {
    prefill_prep_kernel<K><<<dim3((unsigned)n_chunks, (unsigned)HV), K, 0, s>>>(rows, n_rows, H, HV, qn, kn, decay,
                                                                                work);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    const size_t sm = (size_t)pc_smem(K) * sizeof(float);
    auto f = prefill_chunk_kernel<K>;
    if (sm > 48 * 1024) cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm);
    f<<<dim3((unsigned)((V + 31) / 32), (unsigned)HV, (unsigned)n_rows), 64, sm, s>>>(rows, HV, V, state, ss, work,
                                                                                    beta, v, o);
    return cudaGetLastError();
}

} // namespace

int kd_cuda_pdl = 1;

extern "C" void kd_kda_force_r(int r) { g_force_r = r; }
extern "C" void kd_kda_closed_form(int on) { g_closed_form = on; }
extern "C" void kd_kda_tensor_cores(int on, int warps) { g_tc = on, g_tc_warps = warps; }
extern "C" void kd_kda_split(int mode) { g_split = mode; }
extern "C" void kd_kda_pdl(int on) { kd_cuda_pdl = on; }
extern "C" size_t kd_kda_work_floats(int32_t n_rows, int32_t HV, int32_t K, int32_t Tw) {
    return (size_t)n_rows * HV * tc_work_floats(K, (Tw + 7) / 8 * 8);
}

extern "C" int kd_kda_verify(const kd_kda_args *a, kd_kda_mode mode, int max_len, void *stream) {
    if (a->n_rows == 0) return 0;
    if (a->Tw > 16 || max_len > a->Tw || max_len < 1 || (mode == KD_KDA_DEFERRED && !a->qk))
        return (int)cudaErrorInvalidValue;
    return dispatch<false>(a, mode, max_len, (cudaStream_t)stream);
}

extern "C" void kd_kda_onepass_pdl(int on) { g_onepass_pdl = on; }
extern "C" int kd_kda_onepass_small_form(int form) {
    if (form < 0 || form > 1) return -1;
    const int was = g_onepass_small;
    g_onepass_small = form;
    return was;
}
extern "C" int kd_kda_onepass_sched(int sched) {
    if (sched < 0 || sched > 3) return -1;
    const int was = g_onepass_sched;
    g_onepass_sched = sched;
    return was;
}
extern "C" int kd_kda_store_hint(int on) {
    const int was = g_store_cs;
    g_store_cs = on != 0;
    return was;
}

extern "C" int kd_kda_commit(const kd_kda_args *a, kd_kda_mode mode, void *stream) {
    if (a->n_rows == 0) return 0;
    cudaStream_t s = (cudaStream_t)stream;
    if (mode == KD_KDA_STORE_ALL) {
        commit_store_all_kernel<<<dim3(64, a->n_rows), 256, 0, s>>>(*a);
        return (int)cudaGetLastError();
    }
    return dispatch<true>(a, mode, 0, s);
}

extern "C" int kd_kda_prepare(int32_t N, int32_t H, int32_t HV, int32_t K, const float *q, const float *k,
                              const float *graw, const float *braw, int64_t braw_ld, const float *A_log,
                              const float *dt_bias, int32_t use_lower_bound, float lower_bound,
                              int32_t allow_neg_eigval, float *qn, float *kn, float *qk, float *decay, float *beta,
                              void *stream) {
    if (N == 0) return 0;
    dim3 grid(N, H > HV ? H : HV);
    const int threads = K >= 128 ? 128 : (K + 31) / 32 * 32;
    return (int)kd_launch_dep(prepare_kernel, grid, dim3(threads), 0, (cudaStream_t)stream, H, HV, K, q, k, graw, braw,
                              braw_ld, A_log, dt_bias, use_lower_bound, lower_bound, allow_neg_eigval, qn, kn, qk,
                              decay, beta);
}

extern "C" size_t kd_kda_prefill_work_floats(int32_t n_chunks, int32_t HV, int32_t K) {
    return (size_t)(n_chunks > 0 ? n_chunks : 0) * (size_t)(HV > 0 ? HV : 0) * (size_t)pc_work(K);
}

extern "C" int kd_kda_prefill(const kd_kda_prow *rows, int32_t n_rows, int32_t n_chunks, int32_t H, int32_t HV,
                              int32_t K, int32_t V, float *state, int64_t state_stride, const float *qn,
                              const float *kn, const float *decay, const float *beta, const float *v, float *o,
                              float *work, void *stream) {
    if (n_rows <= 0 || n_chunks <= 0) return 0;
    if (n_rows > 65535 || HV > 65535 || H < 1 || HV % H || V < 2 || V % 2 || !work) return (int)cudaErrorInvalidValue;
    cudaStream_t s = (cudaStream_t)stream;
#define KD_PC(KK)                                                                                                  \
    return (int)launch_prefill_chunks<KK>(rows, n_rows, n_chunks, H, HV, V, state, state_stride, qn, kn, decay, beta, \
                                          v, o, work, s)
    switch (K) {
    case 32: KD_PC(32);
    case 64: KD_PC(64);
    case 128: KD_PC(128);
    default: return (int)cudaErrorInvalidValue;
    }
#undef KD_PC
}
#ifdef KD_KDA_TRACE
extern "C" void kd_kda_trace_set(const float *state, unsigned long long *buf) {
    cudaMemcpyToSymbol(kd_trace_state, &state, sizeof state);
    cudaMemcpyToSymbol(kd_trace_buf, &buf, sizeof buf);
}
#endif
