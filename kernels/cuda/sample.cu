// sample.cu: see sample.cuh. One block of kThreads per logit row.
//
// Top-k and top-p select the kept set by a radix selection over 64-bit keys (the float's
// order-preserving bits above, the inverted index below: descending keys = descending
// logits, lower index first among equal logits, the reference's sort order), eight bits per
// pass from the top, histograms of counts (top-k) or of unnormalised mass exp((l - max) / T)
// (top-p) in shared memory; a pass whose chosen bucket holds one element ends the search.
// The kept set is then "key >= threshold". Draws walk the distribution in index order: a
// thread owns a contiguous chunk, chunk sums are scanned, and the first crossing wins.
// Sums run in another order than the reference's loops, so a decision can differ from it
// only where a uniform, a draft's probability or the top_p mass lies within rounding of a
// boundary (cuda_test.cu checks that every difference is such a tie).
#include <math.h>
#include <stdint.h>

#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/sample.cuh"

namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;

__device__ __forceinline__ uint32_t ord_f(float x) {
    if (x != x) return 0;  // NaN: below every number
    if (x == 0.f) x = 0.f; // -0 and +0 are equal logits
    const uint32_t u = __float_as_uint(x);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ uint64_t key_of(const float *l, int32_t i) {
    return ((uint64_t)ord_f(l[i]) << 32) | (uint64_t)(0xffffffffu - (uint32_t)i);
}

// a beats b as the argmax: NaN never wins (among NaNs the lower index), else larger, then
// lower index.
__device__ __forceinline__ bool beats(float v, int32_t i, float bv, int32_t bi) {
    if (v != v) return bv != bv && i < bi;
    if (bv != bv) return true;
    return v > bv || (v == bv && i < bi);
}

struct Shared {
    double part[kWarps];
    double scan[kThreads];
    double mass[256];
    int32_t cnt[256];
    float bv[kWarps];
    int32_t bi[kWarps];
    int32_t chosen, cnt1, found_tok, last_tok;
    double above;
    uint64_t found_key;
};

__device__ double block_sum(double v, Shared &sh) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
    for (int m = 16; m >= 1; m /= 2) v += __shfl_xor_sync(0xffffffffu, v, m);
    __syncthreads(); // part may still be read by a previous call
    if (lane == 0) sh.part[warp] = v;
    __syncthreads();
    double s = 0;
    for (int w = 0; w < kWarps; w++) s += sh.part[w];
    return s;
}

struct Dist {
    const float *l;
    double mx, T;
    __device__ double e(int32_t i) const {
        const double x = l[i];
        return x == x ? exp((x - mx) / T) : 0.0;
    }
};

// The largest key K >= lo whose measure {key >= K, key >= lo} reaches target (count, or mass
// with MASS); lo when the whole set falls short (rounding).
template <bool MASS>
__device__ uint64_t select_desc(const Dist &d, int32_t V, uint64_t lo, double target, Shared &sh) {
    uint64_t prefix = 0;
    double above = 0;
    for (int shift = 56; shift >= 0; shift -= 8) {
        for (int b = threadIdx.x; b < 256; b += kThreads) sh.cnt[b] = 0, sh.mass[b] = 0;
        __syncthreads();
        const uint64_t hi = shift == 56 ? 0 : ~0ull << (shift + 8);
        for (int32_t i = threadIdx.x; i < V; i += kThreads) {
            const uint64_t k = key_of(d.l, i);
            if (k < lo || (k & hi) != prefix) continue;
            const int b = (int)((k >> shift) & 255);
            atomicAdd(&sh.cnt[b], 1);
            if (MASS) atomicAdd(&sh.mass[b], d.e(i));
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            double cum = above;
            int chosen = -1;
            for (int b = 255; b >= 0; b--) {
                const double m = MASS ? sh.mass[b] : (double)sh.cnt[b];
                if (sh.cnt[b] > 0 && cum + m >= target) {
                    chosen = b;
                    break;
                }
                cum += m;
            }
            sh.chosen = chosen, sh.above = cum, sh.cnt1 = chosen >= 0 ? sh.cnt[chosen] : 0;
        }
        __syncthreads();
        const int chosen = sh.chosen, cnt1 = sh.cnt1;
        above = sh.above;
        __syncthreads();
        if (chosen < 0) return lo;
        prefix |= (uint64_t)chosen << shift;
        if (cnt1 == 1 && shift > 0) { // one element in the bucket: the answer is its key
            const uint64_t m = ~0ull << shift;
            for (int32_t i = threadIdx.x; i < V; i += kThreads) {
                const uint64_t k = key_of(d.l, i);
                if (k >= lo && (k & m) == prefix) sh.found_key = k;
            }
            __syncthreads();
            const uint64_t k = sh.found_key;
            __syncthreads();
            return k;
        }
    }
    return prefix;
}

// The slices a row's argmax is taken in (kd_cu_sample_positions): as many as make about kArgBlocks blocks
// over the launch's rows, from KD_CU_ARG_SLICES (a row or a few: B = 1 is 163840 logits, one block's
// loads for all of them were ~5 GB/s) down to 2. A slice's length is a multiple of 4 (slices start 16-byte
// aligned when the row does).
constexpr int kArgThreads = 256, kArgU = 8, kArgBlocks = 1024;
inline int arg_slices(int64_t n) {
    int S = KD_CU_ARG_SLICES;
    while (S > 2 && n * S > kArgBlocks) S /= 2;
    return S;
}
__device__ __forceinline__ int32_t arg_slice(int32_t V, int S) { return ((V + S - 1) / S + 3) / 4 * 4; }

// Block (row, slice) of S slices: the argmax of the slice (an empty slice: NaN at index 0x7fffffff, which
// `beats` never prefers) into part[row][slice]. kArgThreads threads, each with kArgU 16-byte loads in flight
// a round. A total order, so any visiting order gives the same result. The form before (512 threads over
// each of 32 slices a row, 2-3 loads a thread, then the block's reduction) read the logits at 1.7-1.9 TB/s on an
// H100 at 128-512 rows (49 us for 128 rows of 163840; tests/bench/results/kimi48b_trace_h100.md), the
// step's largest read outside the weights and the state: here a block streams a longer slice (at 128
// rows 8 slices a row, 1024 blocks). Under ncu on an H200 at 128 rows 52.5 -> 29.5 us (84 MB: 1.6 -> 2.8 TB/s),
// at 512 rows (two launches of 256 rows) 99 -> 49 us a launch (tests/bench/results/small_kernels2_ab_h200.md).
__global__ void __launch_bounds__(kArgThreads) argmax_part_kernel(const float *logits, int32_t V, int S, int64_t m0,
                                                                  const kd_cu_spos *pos, kd_cu_argpart *part) {
    kd_dep_start();
    __shared__ float sv[kArgThreads / 32];
    __shared__ int32_t si[kArgThreads / 32];
    if (pos[m0 + blockIdx.x].row < 0) return; // the whole block
    const int32_t len = arg_slice(V, S), a = (int32_t)blockIdx.y * len, b = a + len < V ? a + len : V;
    float bv = __int_as_float(0x7fc00000);
    int32_t bi = 0x7fffffff;
    if (a < V) {
        const float *l = logits + (int64_t)blockIdx.x * V + a;
        const int32_t n = b - a, n4 = ((uintptr_t)l % 16 == 0) ? n / 4 : 0;
        const float4 *l4 = (const float4 *)l;
        for (int32_t j0 = threadIdx.x; j0 < n4; j0 += kArgThreads * kArgU) {
            float4 x[kArgU];
#pragma unroll
            for (int u = 0; u < kArgU; u++) {
                const int32_t j = j0 + u * kArgThreads;
                if (j < n4) x[u] = __ldg(l4 + j);
            }
#pragma unroll
            for (int u = 0; u < kArgU; u++) {
                if (j0 + u * kArgThreads >= n4) break;
                const int32_t j = a + 4 * (j0 + u * kArgThreads);
                if (beats(x[u].x, j, bv, bi)) bv = x[u].x, bi = j;
                if (beats(x[u].y, j + 1, bv, bi)) bv = x[u].y, bi = j + 1;
                if (beats(x[u].z, j + 2, bv, bi)) bv = x[u].z, bi = j + 2;
                if (beats(x[u].w, j + 3, bv, bi)) bv = x[u].w, bi = j + 3;
            }
        }
        for (int32_t i = 4 * n4 + threadIdx.x; i < n; i += kArgThreads) {
            const float v = l[i];
            if (beats(v, a + i, bv, bi)) bv = v, bi = a + i;
        }
    }
#pragma unroll
    for (int m = 16; m >= 1; m /= 2) {
        const float v = __shfl_xor_sync(0xffffffffu, bv, m);
        const int32_t i = __shfl_xor_sync(0xffffffffu, bi, m);
        if (beats(v, i, bv, bi)) bv = v, bi = i;
    }
    if (threadIdx.x % 32 == 0) sv[threadIdx.x / 32] = bv, si[threadIdx.x / 32] = bi;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < kArgThreads / 32; w++)
            if (beats(sv[w], si[w], bv, bi)) bv = sv[w], bi = si[w];
        part[(int64_t)blockIdx.x * KD_CU_ARG_SLICES + blockIdx.y] = kd_cu_argpart{bv, bi};
    }
}

__global__ void __launch_bounds__(kThreads) positions_kernel(const float *logits, int32_t V, int S, int64_t m0,
                                                             const kd_cu_spos *pos, kd_cu_sres *res,
                                                             const kd_cu_argpart *part) {
    kd_dep_start();
    __shared__ Shared sh;
    const int64_t m = m0 + blockIdx.x;
    const kd_cu_spos p = pos[m];
    if (p.row < 0) return; // the whole block
    const float *l = logits + (int64_t)blockIdx.x * V;
    float mxv;
    int32_t amax;
    { // the row's argmax from its slices' (a total order: the same as one pass over the row)
        static_assert(KD_CU_ARG_SLICES <= 32, "one warp reduces the slices");
        float bv = __int_as_float(0x7fc00000);
        int32_t bi = 0x7fffffff;
        if (threadIdx.x < S) {
            const kd_cu_argpart q = part[(int64_t)blockIdx.x * KD_CU_ARG_SLICES + threadIdx.x];
            bv = q.v, bi = q.i;
        }
#pragma unroll
        for (int o = 16; o >= 1; o /= 2) {
            const float v = __shfl_xor_sync(0xffffffffu, bv, o);
            const int32_t i = __shfl_xor_sync(0xffffffffu, bi, o);
            if (beats(v, i, bv, bi)) bv = v, bi = i;
        }
        if (threadIdx.x == 0) sh.bv[0] = bv, sh.bi[0] = bi;
        __syncthreads();
        mxv = sh.bv[0], amax = sh.bi[0] == 0x7fffffff ? 0 : sh.bi[0];
        __syncthreads();
    }
    if (p.greedy) {
        if (threadIdx.x == 0) res[m] = kd_cu_sres{amax, p.draft >= 0 && p.draft == amax};
        return;
    }
    Dist d{l, (double)mxv, p.temperature};
    uint64_t lo = 0;
    if (p.top_k > 0 && p.top_k < V) lo = select_desc<false>(d, V, 0, (double)p.top_k, sh);
    double z = 0;
    for (int32_t i = threadIdx.x; i < V; i += kThreads)
        if (key_of(l, i) >= lo) z += d.e(i);
    z = block_sum(z, sh);
    if (p.top_p < 1) {
        lo = select_desc<true>(d, V, lo, p.top_p * z, sh);
        z = 0;
        for (int32_t i = threadIdx.x; i < V; i += kThreads)
            if (key_of(l, i) >= lo) z += d.e(i);
        z = block_sum(z, sh);
    }
    const int32_t dr = p.draft >= 0 && p.draft < V ? p.draft : -1;
    if (dr >= 0) {
        const double pd = key_of(l, dr) >= lo ? d.e(dr) / z : 0.0;
        if (p.u_acc < pd) {
            if (threadIdx.x == 0) res[m] = kd_cu_sres{dr, 1};
            return;
        }
    }
    // the draw: q_i = p_i (bonus) or p_i without the draft, renormalised (residual)
    auto q = [&](int32_t i) -> double { return i == dr || key_of(l, i) < lo ? 0.0 : d.e(i) / z; };
    double z2 = 1;
    if (dr >= 0) {
        double s = 0;
        for (int32_t i = threadIdx.x; i < V; i += kThreads) s += q(i);
        z2 = block_sum(s, sh);
        if (!(z2 > 0)) { // p was a delta on the draft: accepted
            if (threadIdx.x == 0) res[m] = kd_cu_sres{dr, 1};
            return;
        }
    }
    const int32_t chunk = (V + kThreads - 1) / kThreads;
    const int32_t c0 = threadIdx.x * chunk, c1 = c0 + chunk < V ? c0 + chunk : V;
    double s = 0;
    for (int32_t i = c0; i < c1; i++) {
        const double qi = dr >= 0 ? q(i) / z2 : q(i);
        if (qi > 0) s += qi;
    }
    if (threadIdx.x == 0) sh.found_tok = 0x7fffffff, sh.last_tok = -1;
    sh.scan[threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        double acc = 0;
        for (int t = 0; t < kThreads; t++) {
            const double x = sh.scan[t];
            sh.scan[t] = acc;
            acc += x;
        }
    }
    __syncthreads();
    double acc = sh.scan[threadIdx.x];
    int32_t found = 0x7fffffff, last = -1;
    for (int32_t i = c0; i < c1; i++) {
        const double qi = dr >= 0 ? q(i) / z2 : q(i);
        if (qi <= 0) continue;
        acc += qi;
        last = i;
        if (p.u_draw < acc) {
            found = i;
            break;
        }
    }
    if (found != 0x7fffffff) atomicMin(&sh.found_tok, found);
    if (last >= 0) atomicMax(&sh.last_tok, last);
    __syncthreads();
    if (threadIdx.x == 0) {
        const int32_t t = sh.found_tok != 0x7fffffff ? sh.found_tok : sh.last_tok >= 0 ? sh.last_tok : 0;
        res[m] = kd_cu_sres{t, 0};
    }
}

__global__ void finish_kernel(const kd_cu_srow *rows, int n_rows, const kd_cu_spos *pos, const kd_cu_sres *res,
                              int Tw, int32_t *out) {
    kd_dep_start();
    const int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= n_rows) return;
    const kd_cu_srow w = rows[r];
    int32_t *o = out + (int64_t)r * (Tw + 2);
    if (w.first < 0) {
        o[Tw] = 0, o[Tw + 1] = 0;
        return;
    }
    int a = 0;
    while (a < w.n_draft && res[w.first + a].acc) {
        o[a] = pos[w.first + a].draft;
        a++;
    }
    o[a] = res[w.first + a].tok;
    o[Tw] = a;
    o[Tw + 1] = w.greedy ? 0 : (a < w.n_draft ? a + 2 : w.n_draft + 1);
}

} // namespace

cudaError_t kd_cu_sample_positions(const float *logits, int32_t vocab, int64_t m0, int64_t n, const kd_cu_spos *pos,
                                   kd_cu_sres *res, kd_cu_argpart *part, cudaStream_t s) {
    if (n <= 0) return cudaSuccess;
    if (n > 0x7fffffff || vocab < 1) return cudaErrorInvalidValue;
    const int S = arg_slices(n);
    const cudaError_t e = kd_launch_dep(argmax_part_kernel, dim3((unsigned)n, (unsigned)S), dim3(kArgThreads), 0, s,
                                        logits, vocab, S, m0, pos, part);
    if (e != cudaSuccess) return e;
    return kd_launch_dep(positions_kernel, dim3((unsigned)n), dim3(kThreads), 0, s, logits, vocab, S, m0, pos, res,
                         (const kd_cu_argpart *)part);
}

cudaError_t kd_cu_sample_finish(const kd_cu_srow *rows, int n_rows, const kd_cu_spos *pos, const kd_cu_sres *res,
                                int Tw, int32_t *out, cudaStream_t s) {
    if (n_rows <= 0) return cudaSuccess;
    return kd_launch_dep(finish_kernel, dim3((unsigned)((n_rows + 127) / 128)), dim3(128), 0, s, rows, n_rows, pos, res,
                         Tw, out);
}
