/* select.c: picking a backend by name (--backend cpu|cuda|auto). */
#include <string.h>

#include "kd/backend.h"

kd_backend *kd_backend_create(const char *name, int act_bf16, kd_err *err) {
    if (!strcmp(name, "cpu")) return kd_cpu_backend_create(0, err);
    if (!strcmp(name, "cuda")) return kd_cuda_backend_create(act_bf16, err);
    if (!strcmp(name, "auto")) {
        /* a usable GPU whose backend cannot be made (its memory, a bad KDECODE_CUDA_LT_TABLE) is an
         * error, not a quiet run on the CPU */
        if (kd_cuda_device_count() > 0) return kd_cuda_backend_create(act_bf16, err);
        return kd_cpu_backend_create(0, err); /* no usable GPU: the CPU reference */
    }
    kd_fail(err, "unknown backend '%s' (cpu, cuda or auto)", name);
    return NULL;
}
