/* mkmodel.h: random KDA checkpoints in Hugging Face format (same tensor names and dtypes
 * as flash-linear-attention's save_pretrained: bf16 weights, fp32 A_log and dt_bias), for
 * tests and benchmarks. Deterministic: the same preset and seed give the same bytes. */
#ifndef KD_MKMODEL_H
#define KD_MKMODEL_H

#include <stdint.h>
#include <stdio.h>

#include "kd/config.h"

typedef struct kd_preset {
    const char *name;
    const char *about;
    kd_config config;
} kd_preset;

/* NULL-terminated by a zero entry (name == NULL). */
extern const kd_preset kd_presets[];
const kd_preset *kd_preset_find(const char *name);
void kd_presets_print(FILE *f);

/* Writes out_dir/config.json and out_dir/model.safetensors (creating out_dir). */
int kd_mkmodel(const kd_config *c, uint64_t seed, const char *out_dir, kd_err *err);

/* The `kdecode mkmodel` subcommand: argv[0] is the subcommand name, then
 * --preset NAME --seed S --out DIR, or --list. Returns 0, 1 (the write failed) or
 * 2 (bad usage; message on stderr). */
int kd_mkmodel_main(int argc, char **argv);

#endif
