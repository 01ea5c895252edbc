/* select.c: picking a backend by name (--backend cpu|cuda|auto). */
#include <string.h>

#include "kd/backend.h"

kd_backend *kd_backend_create(const char *name, int act_bf16, kd_err *err) {
    if (!strcmp(name, "cpu")) return kd_cpu_backend_create(0, err);
    if (!strcmp(name, "cuda")) return kd_cuda_backend_create(act_bf16, err);
    if (!strcmp(name, "auto")) {
        if (kd_cuda_device_count() > 0) {
            kd_backend *b = kd_cuda_backend_create(act_bf16, err);
            if (b) return b;
        }
        return kd_cpu_backend_create(0, err); /* no usable GPU: the CPU reference */
    }
    kd_fail(err, "unknown backend '%s' (cpu, cuda or auto)", name);
    return NULL;
}
