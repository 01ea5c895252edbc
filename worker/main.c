/* main.c: the `kdecode` program: subcommands over the engine and the model tools. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kd/backend.h"
#include "worker/mkmodel.h"
#include "worker/run.h"
#include "worker/server.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: kdecode <command> [flags]\n"
            "commands:\n"
            "  serve     run the gRPC decode worker\n"
            "  run       generate tokens offline from a checkpoint (CPU backend)\n"
            "  mkmodel   write a random checkpoint from a preset (--list to see them)\n"
            "  devices   print the CUDA devices and library versions this build sees (JSON)\n"
            "  help      this text\n"
            "Run `kdecode <command> --help` for a command's flags.\n");
}

/* OpenBLAS's helper threads spin (sched_yield) for about 2^28 cycles, a tenth of a second,
 * after each call before they sleep. A worker calls BLAS in bursts (a step, a prefill), and
 * that spin competes for the CPU with the gRPC threads that stream a state handoff right
 * after a prefill (2-vCPU machine, 42.8 MiB state: handoff medians 26-37 ms with the spin,
 * 28-34 ms without, tails of ~50 ms down to ~40; the decode step unchanged;
 * tests/bench/results/handoff_cpu.md). The library reads OPENBLAS_THREAD_TIMEOUT once, as it
 * loads (before main), so `serve` sets it (2^4 cycles: sleep at once) and executes itself
 * again (same process id), unless the operator has set it. If that fails (no /proc, say),
 * the variable is set but has no effect, and serve goes on: it says so in its log
 * (KDECODE_REEXEC_FAILED carries the reason to the server, which logs after its options). */
static void quiet_blas_threads(char **argv) {
    if (getenv("OPENBLAS_THREAD_TIMEOUT") || setenv("OPENBLAS_THREAD_TIMEOUT", "4", 1)) return;
    execv("/proc/self/exe", argv);
    setenv("KDECODE_REEXEC_FAILED", strerror(errno), 1);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "run")) return kd_run_main(argc - 1, argv + 1);
    if (!strcmp(cmd, "serve")) {
        quiet_blas_threads(argv);
        return kd_serve_main(argc - 1, argv + 1);
    }
    if (!strcmp(cmd, "mkmodel")) return kd_mkmodel_main(argc - 1, argv + 1);
    if (!strcmp(cmd, "devices")) {
        if (argc > 2) {
            fprintf(stderr, "kdecode devices: takes no arguments\n");
            return 2;
        }
        kd_cuda_info ci;
        kd_cuda_describe(&ci);
        printf("{\"cuda_devices\":%d,\"cudart\":%d,\"driver\":%d,\"cublas\":%d,\"nccl\":%d",
               ci.device_count, ci.cudart_version, ci.driver_version, ci.cublas_version,
               ci.nccl_version);
        if (ci.device_count > 0)
            printf(",\"device0\":{\"name\":\"%s\",\"cc\":%d,\"memory_bytes\":%lld}",
                   ci.device0_name, ci.device0_cc, (long long)ci.device0_mem_bytes);
        printf("}\n");
        return 0;
    }
    if (!strcmp(cmd, "help") || !strcmp(cmd, "--help") || !strcmp(cmd, "-h")) {
        usage(stdout);
        return 0;
    }
    fprintf(stderr, "kdecode: unknown command '%s'\n", cmd);
    usage(stderr);
    return 2;
}
