// kernel_trace.c: a CUPTI injection library that records when each kernel, memory copy and memset
// of a CUDA program ran on the device, graph nodes included (so the overlap that programmatic
// dependent launches give inside a replayed graph shows), and writes them as CSV for
// trace_steps.py: `bazel build //tests/bench/trace:libkernel_trace.so` (or by hand: gcc -O2 -shared
// -fPIC -I/usr/local/cuda/include kernel_trace.c -L/usr/local/cuda/lib64 -lcupti -o libkernel_trace.so).
// Use (the driver loads the library and calls InitializeInjection before the first CUDA call):
//   CUDA_INJECTION64_PATH=/abs/libkernel_trace.so KD_TRACE_OUT=trace.csv KD_BENCH_PROFILE=1,3 cuda_bench ...
// Records start at cudaProfilerStart and stop at cudaProfilerStop where the program calls them
// (cuda_bench's KD_BENCH_PROFILE mode does, around its profiled steps); KD_TRACE_ALL=1 records
// from the start. Timestamps are CUPTI's (ns); tracing adds its own cost to each launch, so
// compare traces with each other, not with untraced timings.
#include <cupti.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BUF_BYTES (8u << 20)

static FILE *g_out;
static int g_on;
static CUpti_SubscriberHandle g_sub;

static void report(const char *what, CUptiResult r) {
    if (r == CUPTI_SUCCESS) return;
    const char *s = "?";
    cuptiGetResultString(r, &s);
    fprintf(stderr, "kernel_trace: %s: %s\n", what, s);
}

static void CUPTIAPI buf_request(uint8_t **buf, size_t *size, size_t *max_records) {
    *buf = aligned_alloc(8, BUF_BYTES);
    *size = *buf ? BUF_BYTES : 0;
    *max_records = 0;
}

static void CUPTIAPI buf_done(CUcontext ctx, uint32_t stream, uint8_t *buf, size_t size, size_t valid) {
    (void)ctx, (void)stream, (void)size;
    CUpti_Activity *rec = NULL;
    while (g_out && cuptiActivityGetNextRecord(buf, valid, &rec) == CUPTI_SUCCESS) {
        if (rec->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || rec->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
            const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)rec;
            fprintf(g_out, "kernel,%llu,%llu,%u,%u,%llu,%u,%d,%d,%d,%d,%s\n", (unsigned long long)k->start,
                    (unsigned long long)k->end, k->streamId, k->graphId, (unsigned long long)k->graphNodeId,
                    k->correlationId, k->gridX * k->gridY * k->gridZ, k->blockX * k->blockY * k->blockZ,
                    k->dynamicSharedMemory + k->staticSharedMemory, k->registersPerThread,
                    k->name ? k->name : "?");
        } else if (rec->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
            const CUpti_ActivityMemcpy6 *m = (const CUpti_ActivityMemcpy6 *)rec;
            fprintf(g_out, "memcpy,%llu,%llu,%u,%u,%llu,%u,%llu,%d,0,0,copy kind %d\n", (unsigned long long)m->start,
                    (unsigned long long)m->end, m->streamId, m->graphId, (unsigned long long)m->graphNodeId,
                    m->correlationId, (unsigned long long)m->bytes, 0, (int)m->copyKind);
        } else if (rec->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
            const CUpti_ActivityMemset4 *m = (const CUpti_ActivityMemset4 *)rec;
            fprintf(g_out, "memset,%llu,%llu,%u,%u,%llu,%u,%llu,0,0,0,memset\n", (unsigned long long)m->start,
                    (unsigned long long)m->end, m->streamId, m->graphId, (unsigned long long)m->graphNodeId,
                    m->correlationId, (unsigned long long)m->bytes);
        }
    }
    free(buf);
}

static const CUpti_ActivityKind kKinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                            CUPTI_ACTIVITY_KIND_MEMSET};

static void set_tracing(int on) {
    if (on == g_on) return;
    g_on = on;
    uint64_t ts = 0;
    cuptiGetTimestamp(&ts);
    for (size_t i = 0; i < sizeof kKinds / sizeof kKinds[0]; i++)
        report(on ? "enable" : "disable", on ? cuptiActivityEnable(kKinds[i]) : cuptiActivityDisable(kKinds[i]));
    if (!on) report("flush", cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED));
    if (g_out) fprintf(g_out, "mark,%llu,%llu,0,0,0,0,0,0,0,0,%s\n", (unsigned long long)ts,
                       (unsigned long long)ts, on ? "start" : "stop");
}

static void CUPTIAPI on_api(void *user, CUpti_CallbackDomain dom, CUpti_CallbackId id, const void *data) {
    (void)user;
    const CUpti_CallbackData *cb = (const CUpti_CallbackData *)data;
    const int start = (dom == CUPTI_CB_DOMAIN_RUNTIME_API && id == CUPTI_RUNTIME_TRACE_CBID_cudaProfilerStart_v4000) ||
                      (dom == CUPTI_CB_DOMAIN_DRIVER_API && id == CUPTI_DRIVER_TRACE_CBID_cuProfilerStart);
    const int stop = (dom == CUPTI_CB_DOMAIN_RUNTIME_API && id == CUPTI_RUNTIME_TRACE_CBID_cudaProfilerStop_v4000) ||
                     (dom == CUPTI_CB_DOMAIN_DRIVER_API && id == CUPTI_DRIVER_TRACE_CBID_cuProfilerStop);
    if (start && cb->callbackSite == CUPTI_API_EXIT) set_tracing(1);
    if (stop && cb->callbackSite == CUPTI_API_ENTER) set_tracing(0);
}

static void at_exit(void) {
    set_tracing(0);
    report("flush", cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED));
    if (g_out) fclose(g_out), g_out = NULL;
}

int InitializeInjection(void) {
    const char *path = getenv("KD_TRACE_OUT");
    g_out = fopen(path && *path ? path : "kernel_trace.csv", "w");
    if (!g_out) {
        perror("kernel_trace: KD_TRACE_OUT");
        return 0;
    }
    fprintf(g_out, "kind,start_ns,end_ns,stream,graph,graph_node,correlation,grid_or_bytes,block,smem,regs,name\n");
    report("register", cuptiActivityRegisterCallbacks(buf_request, buf_done));
    report("subscribe", cuptiSubscribe(&g_sub, (CUpti_CallbackFunc)on_api, NULL));
    report("start cb", cuptiEnableCallback(1, g_sub, CUPTI_CB_DOMAIN_RUNTIME_API,
                                           CUPTI_RUNTIME_TRACE_CBID_cudaProfilerStart_v4000));
    report("stop cb", cuptiEnableCallback(1, g_sub, CUPTI_CB_DOMAIN_RUNTIME_API,
                                          CUPTI_RUNTIME_TRACE_CBID_cudaProfilerStop_v4000));
    report("start cb",
           cuptiEnableCallback(1, g_sub, CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuProfilerStart));
    report("stop cb",
           cuptiEnableCallback(1, g_sub, CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuProfilerStop));
    const char *all = getenv("KD_TRACE_ALL");
    if (all && atoi(all)) set_tracing(1);
    atexit(at_exit);
    return 1;
}
