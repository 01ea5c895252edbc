/* cpu/cpu_create.c: picks the float or double build of the CPU backend. */
#include "kd/backend.h"

kd_backend *kd_cpu_create_f32(kd_err *err);
kd_backend *kd_cpu_create_f64(kd_err *err);

kd_backend *kd_cpu_backend_create(int use_f64, kd_err *err) {
    return use_f64 ? kd_cpu_create_f64(err) : kd_cpu_create_f32(err);
}
