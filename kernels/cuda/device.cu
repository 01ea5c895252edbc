// device.cu: CUDA device discovery and library versions, for --backend auto and for
// operators (`kdecode devices`). Without a GPU or driver the runtime reports an error
// (often cudaErrorInsufficientDriver, not cudaErrorNoDevice): every failure counts as
// "no device" and the sticky error is cleared. cuBLAS and NCCL report their versions
// without a device.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdio.h>
#include <string.h>

#include "kd/backend.h"

extern "C" int kd_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n;
}

extern "C" void kd_cuda_describe(kd_cuda_info *info) {
    memset(info, 0, sizeof *info);
    cudaRuntimeGetVersion(&info->cudart_version);
    if (cudaDriverGetVersion(&info->driver_version) != cudaSuccess) {
        (void)cudaGetLastError();
        info->driver_version = 0;
    }
    int major = 0, minor = 0, patch = 0;
    if (cublasGetProperty(MAJOR_VERSION, &major) == CUBLAS_STATUS_SUCCESS &&
        cublasGetProperty(MINOR_VERSION, &minor) == CUBLAS_STATUS_SUCCESS &&
        cublasGetProperty(PATCH_LEVEL, &patch) == CUBLAS_STATUS_SUCCESS)
        info->cublas_version = major * 10000 + minor * 100 + patch;
    if (ncclGetVersion(&info->nccl_version) != ncclSuccess) info->nccl_version = 0;
    info->device_count = kd_cuda_device_count();
    if (info->device_count > 0) {
        cudaDeviceProp p;
        if (cudaGetDeviceProperties(&p, 0) == cudaSuccess) {
            snprintf(info->device0_name, sizeof info->device0_name, "%s", p.name);
            info->device0_cc = p.major * 10 + p.minor;
            info->device0_mem_bytes = (int64_t)p.totalGlobalMem;
        } else {
            (void)cudaGetLastError();
        }
    }
}
