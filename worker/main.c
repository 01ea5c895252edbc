/* main.c: the `kdecode` program: subcommands over the engine and the model tools. */
#include <stdio.h>
#include <string.h>

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

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "run")) return kd_run_main(argc - 1, argv + 1);
    if (!strcmp(cmd, "serve")) return kd_serve_main(argc - 1, argv + 1);
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
