/* sum64 on the CPU (kd/sum64.h): the reference the GPU version is tested against, and the
 * checksum of states that live in host memory. */
#include "kd/sum64.h"

#include <string.h>

uint64_t kd_sum64(const void *data, size_t bytes) {
    const unsigned char *p = data;
    const uint64_t n = bytes / 4;
    uint64_t s = 0;
    for (uint64_t i = 0; i < n; i++) {
        uint32_t w;
        memcpy(&w, p + 4 * i, 4); /* little-endian hosts only (as the state layout) */
        s += kd_fmix64(i << 32 | w);
    }
    return kd_fmix64(s ^ (n * KD_SUM64_GOLDEN));
}
