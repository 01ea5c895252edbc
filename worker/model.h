/* model.h: loading a Hugging Face KDA checkpoint directory (KDA.md §1).
 *
 * A directory holds config.json and either model.safetensors or
 * model.safetensors.index.json with its shards. The loader parses the config (jansson),
 * maps the files, binds every expected tensor name to a kd_tensor view and checks its
 * shape and dtype (bf16, fp16, fp32 accepted for any tensor, mixed freely). Missing or
 * extra tensors, wrong shapes, unsupported dtypes or features are errors naming the file
 * and the problem. Nothing is copied: the views stay valid until kd_model_close. */
#ifndef KD_MODEL_H
#define KD_MODEL_H

#include "kd/backend.h"
#include "kd/config.h"
#include "kd/weights.h"
#include "safetensors.h"

typedef struct kd_model {
    char *dir;
    kd_config config;
    kd_model_tensors tensors;
    size_t n_files;
    kd_st_file **files;
    int32_t eos_token_id;   /* -1 when the config has none */
    int32_t bos_token_id;   /* -1 when the config has none */
    uint64_t fingerprint;   /* XXH3-64 of the config and every tensor (name, dtype, shape, bytes) */
} kd_model;

/* Parses config.json text (exposed for tests); `what` names the source in errors. */
int kd_config_parse_json(const char *text, size_t len, const char *what, kd_config *out,
                         int32_t *eos_token_id, int32_t *bos_token_id, kd_err *err);

kd_model *kd_model_open(const char *dir, kd_err *err);
void kd_model_close(kd_model *m);

#endif
