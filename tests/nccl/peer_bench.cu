// peer_bench: the floors the NCCL state handoff is measured against, and its checksum.
// Needs 2 GPUs (tests/nccl/run_device.sh runs it on the device machine). Prints one JSON line.
//
// 1. sum64 on the device (kd_cuda_sum64) against the CPU (kd_sum64) on fresh random words,
//    aligned and unaligned regions, every size class; a flipped word and a zeroed region must
//    change it. Outputs poisoned before each run.
// 2. cudaMemcpyPeer of BYTES from GPU 0 to GPU 1 (the issue's baseline), median of 30.
// 3. NCCL send/recv of the same bytes inside this process (two ranks, one per GPU), as one
//    buffer and as the handoff's sections (per layer: 2 MiB recurrent state, the conv window):
//    what NCCL itself costs, without the service around it.
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <random>
#include <vector>

#include "kd/sum64.h"

#define CK(x)                                                                                        \
    do {                                                                                             \
        cudaError_t e_ = (x);                                                                        \
        if (e_ != cudaSuccess) {                                                                     \
            fprintf(stderr, "peer_bench: %s: %s (line %d)\n", #x, cudaGetErrorString(e_), __LINE__);  \
            exit(1);                                                                                 \
        }                                                                                            \
    } while (0)
#define NK(x)                                                                                        \
    do {                                                                                             \
        ncclResult_t r_ = (x);                                                                       \
        if (r_ != ncclSuccess) {                                                                     \
            fprintf(stderr, "peer_bench: %s: %s (line %d)\n", #x, ncclGetErrorString(r_), __LINE__); \
            exit(1);                                                                                 \
        }                                                                                            \
    } while (0)

static double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

static int check_sum64(std::mt19937_64 &rng, int *n_checks) {
    const size_t sizes[] = {4, 8, 12, 16, 20, 60, 4 * 1001, 65536 + 12, 2u << 20, (2u << 20) + 4, 44892160};
    int bad = 0;
    for (size_t sz : sizes) {
        for (int off = 0; off <= 4; off += 4) { // 16-byte aligned and not
            std::vector<uint32_t> h((sz + off) / 4 + 1);
            for (auto &w : h) w = (uint32_t)rng();
            char *d;
            CK(cudaMalloc(&d, sz + off + 16));
            CK(cudaMemcpy(d, h.data(), sz + off, cudaMemcpyHostToDevice));
            const unsigned char *hb = (const unsigned char *)h.data() + off;
            kd_dev_region r[2] = {{d + off, sz}, {d + off, sz}};
            uint64_t out[2] = {0xdeadbeefdeadbeefull, 0xdeadbeefdeadbeefull}, ref = kd_sum64(hb, sz);
            kd_err err;
            if (kd_cuda_sum64(r, 2, out, NULL, NULL, &err)) {
                fprintf(stderr, "peer_bench: %s\n", err.msg);
                exit(1);
            }
            ++*n_checks;
            if (out[0] != ref || out[1] != ref) {
                fprintf(stderr, "sum64 mismatch: size %zu offset %d: gpu %016llx cpu %016llx\n", sz, off,
                        (unsigned long long)out[0], (unsigned long long)ref);
                bad++;
            }
            // one flipped bit of one word changes it
            const size_t w = (size_t)(rng() % (sz / 4));
            uint32_t v;
            memcpy(&v, hb + 4 * w, 4);
            v ^= 1u << (rng() % 32);
            CK(cudaMemcpy(d + off + 4 * w, &v, 4, cudaMemcpyHostToDevice));
            uint64_t flipped = 0;
            if (kd_cuda_sum64(r, 1, &flipped, NULL, NULL, &err)) exit(1);
            ++*n_checks;
            if (flipped == ref) {
                fprintf(stderr, "sum64 did not change with word %zu of %zu flipped\n", w, sz / 4);
                bad++;
            }
            // a zeroed region is not the state
            CK(cudaMemset(d + off, 0, sz));
            uint64_t zero = 0;
            if (kd_cuda_sum64(r, 1, &zero, NULL, NULL, &err)) exit(1);
            std::vector<unsigned char> zh(sz, 0);
            ++*n_checks;
            if (zero == ref || zero != kd_sum64(zh.data(), sz)) {
                fprintf(stderr, "sum64 of zeros: size %zu\n", sz);
                bad++;
            }
            CK(cudaFree(d));
        }
    }
    return bad;
}

// ---- xproc: NCCL between two processes (as the service runs it), one GPU each.
//   peer_bench xproc BYTES GAP_MS REG ISO
// REG 0: cudaMalloc buffers; 1: the same, registered with ncclCommRegister; 2: ncclMemAlloc
// buffers, registered. ISO 1: each process sees only its GPU (CUDA_VISIBLE_DEVICES, as the
// service's tests start workers). The sender (GPU 0) posts its send first, then tells the
// receiver, which times its receive: GPU time between events around ncclRecv, and host time
// from the post to the completion seen by cudaEventSynchronize. GAP_MS of idle between
// transfers (the service's benchmark leaves the GPUs idle between requests). The first transfer
// connects the ranks (a blocking communicator's first send waits for its receive): it is
// posted by both at once and reported apart.
static void xfull(int fd, void *b, size_t n, int wr) {
    for (size_t at = 0; at < n;) {
        ssize_t r = wr ? write(fd, (char *)b + at, n - at) : read(fd, (char *)b + at, n - at);
        if (r <= 0) {
            fprintf(stderr, "peer_bench xproc: pipe closed\n");
            exit(1);
        }
        at += (size_t)r;
    }
}

static double wall_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec * 1e-3;
}

static int xproc_main(int argc, char **argv) {
    const size_t bytes = argc > 2 ? strtoull(argv[2], NULL, 10) : 44892160;
    const int gap_ms = argc > 3 ? atoi(argv[3]) : 0, reg = argc > 4 ? atoi(argv[4]) : 0,
              iso = argc > 5 ? atoi(argv[5]) : 1, iters = 23;
    int to_child[2], to_parent[2];
    if (pipe(to_child) || pipe(to_parent)) return perror("peer_bench xproc: pipe"), 1;
    const pid_t pid = fork(); // before any CUDA call
    if (pid < 0) return perror("peer_bench xproc: fork"), 1;
    const int rank = pid == 0 ? 1 : 0, rfd = rank ? to_child[0] : to_parent[0], wfd = rank ? to_parent[1] : to_child[1];
    // each side keeps only its own ends: when the other process dies, a read sees the end of
    // the pipe (and exits) instead of waiting on a write end it holds itself
    close(rank ? to_child[1] : to_parent[1]);
    close(rank ? to_parent[0] : to_child[0]);
    if (iso) setenv("CUDA_VISIBLE_DEVICES", rank ? "1" : "0", 1);
    CK(cudaSetDevice(iso ? 0 : rank));
    ncclUniqueId uid;
    if (rank == 0) {
        NK(ncclGetUniqueId(&uid));
        xfull(wfd, &uid, sizeof uid, 1);
    } else {
        xfull(rfd, &uid, sizeof uid, 0);
    }
    ncclComm_t comm;
    NK(ncclCommInitRank(&comm, 2, uid, rank));
    char *buf = NULL;
    if (reg == 2) NK(ncclMemAlloc((void **)&buf, bytes));
    else CK(cudaMalloc(&buf, bytes));
    void *h = NULL;
    if (reg) NK(ncclCommRegister(comm, buf, bytes, &h));
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    std::vector<double> gpu, host;
    double first_gpu = 0, first_host = 0;
    int wrong = 0;
    for (int i = 0; i < iters; i++) {
        char go = 'g';
        if (rank == 0) {
            CK(cudaMemsetAsync(buf, 1 + i % 200, bytes, s));
            CK(cudaStreamSynchronize(s));
            if (gap_ms) usleep((useconds_t)gap_ms * 1000);
            NK(ncclSend(buf, bytes, ncclUint8, 1, comm, s)); // the first one connects: both ranks at once
            if (i > 0) xfull(wfd, &go, 1, 1);
            CK(cudaStreamSynchronize(s));
            double r[2];
            xfull(rfd, r, sizeof r, 0);
            if (i == 0) first_gpu = r[0], first_host = r[1];
            else if (i >= 3) gpu.push_back(r[0]), host.push_back(r[1]);
        } else {
            if (i > 0) xfull(rfd, &go, 1, 0);
            const double t0 = wall_us();
            CK(cudaEventRecord(a, s));
            NK(ncclRecv(buf, bytes, ncclUint8, 0, comm, s));
            CK(cudaEventRecord(b, s));
            CK(cudaEventSynchronize(b));
            const double t1 = wall_us();
            float ms;
            CK(cudaEventElapsedTime(&ms, a, b));
            unsigned char e[2];
            CK(cudaMemcpy(e, buf, 1, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(e + 1, buf + bytes - 1, 1, cudaMemcpyDeviceToHost));
            wrong += e[0] != 1 + i % 200 || e[1] != 1 + i % 200;
            double r[2] = {ms * 1e3, t1 - t0};
            xfull(wfd, r, sizeof r, 1);
        }
    }
    if (reg) NK(ncclCommDeregister(comm, h));
    ncclCommDestroy(comm);
    if (reg == 2) ncclMemFree(buf);
    else cudaFree(buf);
    if (rank == 1) {
        xfull(wfd, &wrong, sizeof wrong, 1);
        _exit(0);
    }
    int cw = -1, st = 0;
    xfull(rfd, &cw, sizeof cw, 0);
    waitpid(pid, &st, 0);
    printf("{\"xproc\":1,\"bytes\":%zu,\"gap_ms\":%d,\"registered\":%d,\"isolated\":%d,\"recv_gpu_us\":%.2f,"
           "\"recv_host_us\":%.2f,\"recv_gpu_min_us\":%.2f,\"first_gpu_us\":%.2f,\"first_host_us\":%.2f,"
           "\"wrong\":%d}\n",
           bytes, gap_ms, reg, iso, median(gpu), median(host), *std::min_element(gpu.begin(), gpu.end()), first_gpu,
           first_host, cw);
    fflush(stdout);
    return cw != 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0;
}

int main(int argc, char **argv) {
    setenv("NCCL_NVLS_ENABLE", "0", 1); // no NVLink multicast
    if (argc > 1 && !strcmp(argv[1], "xproc")) return xproc_main(argc, argv);
    const size_t bytes = argc > 1 ? strtoull(argv[1], NULL, 10) : 44892160;
    const size_t layers = argc > 2 ? strtoull(argv[2], NULL, 10) : 20;
    int ndev = 0;
    CK(cudaGetDeviceCount(&ndev));
    std::mt19937_64 rng(std::random_device{}());
    int n_checks = 0;
    CK(cudaSetDevice(0));
    const int bad = check_sum64(rng, &n_checks);
    if (ndev < 2) {
        printf("{\"devices\":%d,\"sum64_checks\":%d,\"sum64_bad\":%d}\n", ndev, n_checks, bad);
        return bad ? 1 : 0;
    }
    // buffers
    char *src, *dst;
    CK(cudaSetDevice(0));
    CK(cudaMalloc(&src, bytes));
    CK(cudaMemset(src, 0x5a, bytes));
    cudaError_t pe = cudaDeviceEnablePeerAccess(1, 0);
    int can01 = 0, can10 = 0;
    CK(cudaDeviceCanAccessPeer(&can01, 0, 1));
    CK(cudaSetDevice(1));
    CK(cudaMalloc(&dst, bytes));
    CK(cudaMemset(dst, 0, bytes));
    if (pe == cudaSuccess) (void)cudaDeviceEnablePeerAccess(0, 0);
    CK(cudaDeviceCanAccessPeer(&can10, 1, 0));
    (void)cudaGetLastError();
    // cudaMemcpyPeer, timed on GPU 0's stream
    CK(cudaSetDevice(0));
    cudaStream_t s0;
    CK(cudaStreamCreateWithFlags(&s0, cudaStreamNonBlocking));
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    std::vector<double> peer;
    for (int i = 0; i < 33; i++) {
        CK(cudaEventRecord(a, s0));
        CK(cudaMemcpyPeerAsync(dst, 1, src, 0, bytes, s0));
        CK(cudaEventRecord(b, s0));
        CK(cudaEventSynchronize(b));
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b));
        if (i >= 3) peer.push_back(ms * 1e3);
    }
    // NCCL in one process: rank 0 on GPU 0 sends, rank 1 on GPU 1 receives
    ncclComm_t comms[2];
    int devs[2] = {0, 1};
    NK(ncclCommInitAll(comms, 2, devs));
    cudaStream_t s1;
    CK(cudaSetDevice(1));
    CK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
    cudaEvent_t a1, b1;
    CK(cudaEventCreate(&a1));
    CK(cudaEventCreate(&b1));
    // the handoff's sections: per layer the state (most of it) then the conv window
    std::vector<size_t> sect;
    const size_t per = bytes / layers, ssm = per >= (2u << 20) ? (2u << 20) : per;
    for (size_t l = 0, at = 0; l < layers; l++) {
        size_t lb = l + 1 == layers ? bytes - at : per;
        sect.push_back(ssm < lb ? ssm : lb);
        if (lb > ssm) sect.push_back(lb - ssm);
        at += lb;
    }
    std::vector<double> one, regions, one_reg;
    void *hsrc = NULL, *hdst = NULL; // the same buffers registered with both ranks (zero-copy)
    for (int mode = 0; mode < 3; mode++) {
        if (mode == 2) { // registration may be refused (cudaMalloc memory): then no such column
            CK(cudaSetDevice(0));
            ncclResult_t r0 = ncclCommRegister(comms[0], src, bytes, &hsrc);
            CK(cudaSetDevice(1));
            ncclResult_t r1 = ncclCommRegister(comms[1], dst, bytes, &hdst);
            if (r0 != ncclSuccess || r1 != ncclSuccess) {
                fprintf(stderr, "peer_bench: ncclCommRegister: %s / %s\n", ncclGetErrorString(r0), ncclGetErrorString(r1));
                one_reg.push_back(-1);
                break;
            }
        }
        for (int i = 0; i < 33; i++) {
            CK(cudaSetDevice(1));
            CK(cudaEventRecord(a1, s1)); // both streams idle: the receiver's span is the transfer's
            CK(cudaSetDevice(0));
            NK(ncclGroupStart());
            size_t at = 0;
            if (mode != 1) {
                NK(ncclSend(src, bytes, ncclUint8, 1, comms[0], s0));
                NK(ncclRecv(dst, bytes, ncclUint8, 0, comms[1], s1));
            } else {
                for (size_t k = 0; k < sect.size(); at += sect[k], k++) {
                    NK(ncclSend(src + at, sect[k], ncclUint8, 1, comms[0], s0));
                    NK(ncclRecv(dst + at, sect[k], ncclUint8, 0, comms[1], s1));
                }
            }
            NK(ncclGroupEnd());
            CK(cudaSetDevice(1));
            CK(cudaEventRecord(b1, s1));
            CK(cudaEventSynchronize(b1));
            CK(cudaSetDevice(0));
            CK(cudaStreamSynchronize(s0));
            float ms;
            CK(cudaEventElapsedTime(&ms, a1, b1));
            if (i >= 3) (mode == 2 ? one_reg : mode ? regions : one).push_back(ms * 1e3);
        }
    }
    // sum64 over the handoff's sections on GPU 1 (what the decode worker checks): work space
    // allocated per call vs kept, right after the transfers (busy clocks)
    std::vector<kd_dev_region> regs;
    for (size_t k = 0, at = 0; k < sect.size(); at += sect[k], k++) regs.push_back({dst + at, sect[k]});
    std::vector<uint64_t> sums(regs.size());
    kd_sum64_scratch keep;
    kd_err serr;
    CK(cudaSetDevice(1));
    if (kd_cuda_sum64_scratch_init(&keep, &serr)) exit(1);
    std::vector<double> t_alloc, t_kept;
    for (int i = 0; i < 23; i++) {
        for (int mode = 0; mode < 2; mode++) {
            struct timespec t0, t1;
            clock_gettime(CLOCK_MONOTONIC, &t0);
            if (kd_cuda_sum64(regs.data(), (int)regs.size(), sums.data(), s1, mode ? &keep : NULL, &serr)) exit(1);
            clock_gettime(CLOCK_MONOTONIC, &t1);
            const double us = (t1.tv_sec - t0.tv_sec) * 1e6 + (t1.tv_nsec - t0.tv_nsec) * 1e-3;
            if (i >= 3) (mode ? t_kept : t_alloc).push_back(us);
        }
    }
    kd_cuda_sum64_scratch_free(&keep);
    // the bytes arrived
    std::vector<unsigned char> back(bytes);
    CK(cudaSetDevice(1));
    CK(cudaMemcpy(back.data(), dst, bytes, cudaMemcpyDeviceToHost));
    size_t wrong = 0;
    for (size_t i = 0; i < bytes; i++) wrong += back[i] != 0x5a;
    CK(cudaSetDevice(0));
    if (hsrc) NK(ncclCommDeregister(comms[0], hsrc));
    CK(cudaSetDevice(1));
    if (hdst) NK(ncclCommDeregister(comms[1], hdst));
    ncclCommDestroy(comms[0]);
    ncclCommDestroy(comms[1]);
    const double pm = median(peer);
    printf("{\"devices\":%d,\"peer_access\":[%d,%d],\"bytes\":%zu,\"sections\":%zu,\"memcpy_peer_us\":%.2f,"
           "\"memcpy_peer_gbps\":%.1f,\"nccl_inproc_one_us\":%.2f,\"nccl_inproc_sections_us\":%.2f,\"nccl_inproc_registered_us\":%.2f,"
           "\"nccl_wrong_bytes\":%zu,\"sum64_checks\":%d,\"sum64_bad\":%d,\"sum64_sections_alloc_us\":%.1f,"
           "\"sum64_sections_kept_us\":%.1f}\n",
           ndev, can01, can10, bytes, sect.size(), pm, bytes / pm * 1e-3, median(one), median(regions), median(one_reg), wrong, n_checks,
           bad, median(t_alloc), median(t_kept));
    return bad || wrong ? 1 : 0;
}
