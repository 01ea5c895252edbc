/* reflection_data.h: the API's descriptors, generated at build time (gen_reflection.py) from
 * `protoc --descriptor_set_out --include_imports`, for the server reflection service. */
#ifndef KD_REFLECTION_DATA_H
#define KD_REFLECTION_DATA_H

#include <stddef.h>

typedef struct kd_refl_file {
    const char *name;            /* e.g. "kdecode/v1/decoder.proto" */
    const unsigned char *bytes;  /* serialized google.protobuf.FileDescriptorProto */
    size_t len;
    const int *deps;             /* indices into kd_refl_files */
    int n_deps;
} kd_refl_file;

typedef struct kd_refl_symbol {
    const char *name;            /* fully qualified: package.Message, package.Service.Method */
    int file;
} kd_refl_symbol;

extern const kd_refl_file kd_refl_files[];
extern const int kd_refl_n_files;
extern const kd_refl_symbol kd_refl_symbols[]; /* sorted by name (strcmp) */
extern const int kd_refl_n_symbols;
extern const char *const kd_refl_services[];
extern const int kd_refl_n_services;

#endif
