/* Loading and saving Hugging Face model directories: config.json + safetensors,
 * mapped onto the flat parameter buffer through each parameter's hf_name/part. */
#include "model/model_internal.h"
#include "model/safetensors.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Checkpoint tensors that hold no parameters: rotary caches and GPT-2's causal-mask
 * buffers written by old transformers versions. */
static bool is_buffer_name(const char *name) {
    static const char *const suffixes[] = {".rotary_emb.inv_freq", ".attn.bias", ".attn.masked_bias"};
    size_t n = strlen(name);
    for (size_t i = 0; i < sizeof suffixes / sizeof *suffixes; i++) {
        size_t k = strlen(suffixes[i]);
        if (n >= k && strcmp(name + n - k, suffixes[i]) == 0) return true;
    }
    return false;
}

/* The checkpoint entry for a name; original GPT-2 files omit the "transformer." prefix. */
static const struct safetensors_entry *find_entry(const struct safetensors *st, const char *name) {
    const struct safetensors_entry *e = safetensors_find(st, name);
    if (!e && strncmp(name, "transformer.", 12) == 0) e = safetensors_find(st, name + 12);
    return e;
}

/* Geometry of a parameter's checkpoint tensor: `parts` stacked blocks of the
 * parameter's Linear-layout shape [out, in] (1D: [out]), stored transposed or not. */
static void hf_shape(const struct model_param *p, int *ndim, int64_t shape[2]) {
    *ndim = p->ndim;
    int64_t out = p->shape[0] * p->hf_parts, in = p->shape[1];
    if (p->ndim == 1) {
        shape[0] = out;
        shape[1] = 1;
    } else if (p->hf_transposed) {
        shape[0] = in;
        shape[1] = out;
    } else {
        shape[0] = out;
        shape[1] = in;
    }
}

/* Copies between a parameter (Linear layout, [out, in]) and its block of the full
 * checkpoint tensor. to_param selects the direction. */
static void hf_block_copy(const struct model_param *p, float *param, float *full, bool to_param) {
    int64_t out = p->shape[0], in = p->ndim == 2 ? p->shape[1] : 1, o0 = out * p->hf_part;
    int64_t total_out = out * p->hf_parts;
    for (int64_t o = 0; o < out; o++)
        for (int64_t i = 0; i < in; i++) {
            int64_t fi = p->hf_transposed ? i * total_out + (o0 + o) : (o0 + o) * in + i;
            if (to_param)
                param[o * in + i] = full[fi];
            else
                full[fi] = param[o * in + i];
        }
}

static int load_params(const struct model *m, const struct safetensors *st, float *host,
                       bool *used, struct smelt_error *err) {
    float *full = NULL;
    int rc = SMELT_OK;
    for (int i = 0; i < m->n_params && !rc; i++) {
        const struct model_param *p = &m->params[i];
        const struct safetensors_entry *e = find_entry(st, p->hf_name);
        if (!e) {
            rc = error_set(err, SMELT_ENOTFOUND, "%s: tensor '%s' is missing", st->path, p->hf_name);
            break;
        }
        used[e - st->entries] = true;
        int ndim;
        int64_t shape[2];
        hf_shape(p, &ndim, shape);
        if (p->hf_parts == 1 && !p->hf_transposed) {
            rc = safetensors_read_f32(st, e->name, host + p->offset, ndim, shape, err);
            continue;
        }
        free(full);
        full = malloc((size_t)(shape[0] * shape[1]) * sizeof *full);
        if (!full) {
            rc = error_set(err, SMELT_ENOMEM, "%s: out of memory", p->hf_name);
            break;
        }
        rc = safetensors_read_f32(st, e->name, full, ndim, shape, err);
        if (!rc) hf_block_copy(p, host + p->offset, full, true);
    }
    free(full);
    return rc;
}

static int check_all_used(const struct model *m, const struct safetensors *st, const bool *used,
                          struct smelt_error *err) {
    for (size_t i = 0; i < st->n_entries; i++) {
        const char *name = st->entries[i].name;
        if (used[i] || is_buffer_name(name)) continue;
        /* Tied models sometimes save lm_head too; transformers ignores it, so do we. */
        if (m->config.tie_word_embeddings && strcmp(name, "lm_head.weight") == 0) continue;
        return error_set(err, SMELT_EFORMAT, "%s: tensor '%s' is not part of a %s model with this config%s",
                         st->path, name, model_type_name(m->config.type),
                         m->config.score_head ? " (a sequence classifier: score.weight, no lm_head)" : "");
    }
    return SMELT_OK;
}

int model_load(const char *dir, enum backend backend, struct model **out, struct smelt_error *err) {
    struct model_config cfg;
    int rc = model_config_load(dir, &cfg, err);
    if (rc) return rc;
    struct safetensors *st = NULL;
    rc = safetensors_open(dir, &st, err);
    if (rc) return rc;
    struct model *m = NULL;
    float *host = NULL;
    bool *used = NULL;
    rc = model_create(&cfg, backend, &m, err);
    if (!rc) {
        host = malloc((size_t)m->n_weights * sizeof *host);
        used = calloc(st->n_entries ? st->n_entries : 1, sizeof *used);
        if (!host || !used) rc = error_set(err, SMELT_ENOMEM, "model_load: out of memory");
    }
    if (!rc) rc = load_params(m, st, host, used, err);
    if (!rc) rc = check_all_used(m, st, used, err);
    if (!rc) {
        struct tensor src = tensor_f32(host, 1, &m->n_weights);
        rc = tensor_copy(&m->weights, &src, err);
    }
    free(host);
    free(used);
    safetensors_close(st);
    if (rc) {
        model_free(m);
        return rc;
    }
    *out = m;
    return SMELT_OK;
}

void model_hf_tensors_free(struct model_hf_tensor *tensors, int n) {
    if (!tensors) return;
    for (int i = 0; i < n; i++) free(tensors[i].data);
    free(tensors);
}

int model_hf_tensors(const struct model *m, const float *flat, struct model_hf_tensor **out,
                     int *n_out, struct smelt_error *err) {
    struct model_hf_tensor *t = calloc((size_t)m->n_params, sizeof *t);
    if (!t) return error_set(err, SMELT_ENOMEM, "model_hf_tensors: out of memory");
    int n = 0;
    for (int i = 0; i < m->n_params; i++) {
        const struct model_param *p = &m->params[i];
        struct model_hf_tensor *dst = NULL;
        for (int j = 0; j < n; j++)
            if (strcmp(t[j].name, p->hf_name) == 0) dst = &t[j];
        if (!dst) {
            dst = &t[n++];
            snprintf(dst->name, sizeof dst->name, "%s", p->hf_name);
            hf_shape(p, &dst->ndim, dst->shape);
            dst->data = malloc((size_t)(dst->shape[0] * dst->shape[1]) * sizeof *dst->data);
            if (!dst->data) {
                model_hf_tensors_free(t, n);
                return error_set(err, SMELT_ENOMEM, "model_hf_tensors: out of memory");
            }
        }
        hf_block_copy(p, (float *)flat + p->offset, dst->data, false);
    }
    *out = t;
    *n_out = n;
    return SMELT_OK;
}

int model_save(const struct model *m, const char *dir, bool bf16, struct smelt_error *err) {
    if (!m->weights.data)
        return error_set(err, SMELT_EINVAL, "model_save: the model's parameters are sharded (ZeRO-3): "
                         "gather them into a whole buffer first");
    int rc = dir_create_all(dir, err);
    if (rc) return rc;
    float *host = malloc((size_t)m->n_weights * sizeof *host);
    if (!host) return error_set(err, SMELT_ENOMEM, "model_save: out of memory");
    struct tensor dst = tensor_f32(host, 1, &m->n_weights);
    rc = tensor_copy(&dst, &m->weights, err);
    struct model_hf_tensor *t = NULL;
    int n = 0;
    if (!rc) rc = model_hf_tensors(m, host, &t, &n, err);
    free(host);
    struct safetensors_tensor_desc *desc = NULL;
    if (!rc) {
        desc = calloc((size_t)n, sizeof *desc);
        if (!desc) rc = error_set(err, SMELT_ENOMEM, "model_save: out of memory");
    }
    for (int i = 0; !rc && i < n; i++) {
        desc[i].name = t[i].name;
        desc[i].tensor = tensor_f32(t[i].data, t[i].ndim, t[i].shape);
        desc[i].file_dtype = bf16 ? DTYPE_BF16 : DTYPE_F32;
    }
    /* transformers refuses safetensors metadata without format=pt. */
    const struct safetensors_kv meta[] = {{"format", "pt"}};
    if (!rc) rc = safetensors_write_dir(dir, desc, (size_t)n, meta, 1, 0, err);
    if (!rc) {
        struct model_config cfg = m->config;
        cfg.torch_dtype = bf16 ? DTYPE_BF16 : DTYPE_F32;
        rc = model_config_save(&cfg, dir, err);
    }
    free(desc);
    model_hf_tensors_free(t, n);
    return rc;
}
