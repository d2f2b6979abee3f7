/* smelt-model: small model-directory tasks.
 *
 *   smelt-model init --config config.json --out DIR [--seed N] [--bf16] [--byte-tokenizer]
 *       a randomly initialised model (N(0, 0.02) weights) saved as a HF directory;
 *       --byte-tokenizer adds the byte tokenizer's tokenizer.json (vocab must cover it)
 *   smelt-model logits --model DIR --ids 1,2,3 [--adapter DIR]
 *       prints {"logits": [[...], ...]} for one sequence (for parity checks), with a
 *       PEFT LoRA adapter applied when --adapter is given
 *   smelt-model adapter-save --model DIR --adapter DIR --out DIR
 *       loads a PEFT LoRA adapter onto the model and writes it as smelt saves adapters
 *       (f32; also converts bf16/f16 adapters)
 *   smelt-model info --model DIR
 *       prints the architecture and parameter count */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "lora/lora.h"
#include "model/model.h"

static void usage(FILE *f) {
    fprintf(f, "usage: smelt-model init --config FILE --out DIR [--seed N] [--bf16] [--byte-tokenizer]\n"
               "       smelt-model logits --model DIR --ids 1,2,3 [--adapter DIR]\n"
               "       smelt-model adapter-save --model DIR --adapter DIR --out DIR\n"
               "       smelt-model info --model DIR\n");
}

struct options {
    const char *command, *config, *out, *model, *ids, *adapter;
    uint64_t seed;
    bool bf16, byte_tokenizer;
};

static int parse(int argc, char **argv, struct options *o, struct smelt_error *err) {
    *o = (struct options){0};
    if (argc < 2) return error_set(err, SMELT_EINVAL, "missing command");
    o->command = argv[1];
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        if (strcmp(a, "--bf16") == 0) { o->bf16 = true; continue; }
        if (strcmp(a, "--byte-tokenizer") == 0) { o->byte_tokenizer = true; continue; }
        int rc = args_value(argc, argv, &i, &v, err);
        if (rc) return rc;
        if (strcmp(a, "--config") == 0) o->config = v;
        else if (strcmp(a, "--out") == 0) o->out = v;
        else if (strcmp(a, "--model") == 0) o->model = v;
        else if (strcmp(a, "--ids") == 0) o->ids = v;
        else if (strcmp(a, "--adapter") == 0) o->adapter = v;
        else if (strcmp(a, "--seed") == 0) {
            int64_t s;
            if ((rc = args_int(a, v, 0, INT64_MAX, &s, err))) return rc;
            o->seed = (uint64_t)s;
        } else
            return error_set(err, SMELT_EINVAL, "unknown option %s", a);
    }
    return SMELT_OK;
}

static int cmd_init(const struct options *o, struct smelt_error *err) {
    if (!o->config || !o->out) return error_set(err, SMELT_EINVAL, "init needs --config and --out");
    struct model_config cfg;
    int rc = model_config_load(o->config, &cfg, err);
    if (rc) return rc;
    struct model *m;
    if ((rc = model_init_random(&cfg, o->seed, BACKEND_CPU, &m, err))) return rc;
    rc = model_save(m, o->out, o->bf16, err);
    if (!rc && o->byte_tokenizer) {
        struct tokenizer *tok;
        rc = tokenizer_create_bytes(NULL, 0, &tok, err);
        if (!rc && tokenizer_vocab_size(tok) > cfg.vocab_size)
            rc = error_set(err, SMELT_EINVAL, "the byte tokenizer needs vocab_size >= %d; the config has %lld",
                           tokenizer_vocab_size(tok), (long long)cfg.vocab_size);
        char path[4096];
        if (!rc) rc = path_join(path, sizeof path, o->out, "tokenizer.json", err);
        if (!rc) rc = tokenizer_save(tok, path, err);
        tokenizer_free(tok);
    }
    if (!rc) printf("%s: %s model, %lld parameters\n", o->out, model_type_name(cfg.type), (long long)m->n_weights);
    model_free(m);
    return rc;
}

static int cmd_logits(const struct options *o, struct smelt_error *err) {
    if (!o->model || !o->ids) return error_set(err, SMELT_EINVAL, "logits needs --model and --ids");
    struct model *m;
    int rc = model_load(o->model, BACKEND_CPU, &m, err);
    if (rc) return rc;
    struct lora *adapter = NULL;
    if (o->adapter) {
        rc = lora_load(m, o->adapter, &adapter, err);
        if (!rc) rc = lora_attach(adapter, err);
        if (rc) {
            lora_free(adapter);
            model_free(m);
            return rc;
        }
    }
    int32_t *ids = NULL;
    int64_t n = 0;
    struct model_acts *acts = NULL;
    float *logits = NULL;
    int64_t V = m->config.vocab_size;
    rc = args_int_list("--ids", o->ids, 0, INT32_MAX, &ids, &n, err);
    if (!rc) rc = model_acts_alloc(m, n, false, &acts, err);
    if (!rc && !(logits = malloc((size_t)(n * V) * sizeof *logits)))
        rc = error_set(err, SMELT_ENOMEM, "out of memory");
    if (!rc) {
        int32_t cu[2] = {0, (int32_t)n};
        int64_t shape[2] = {n, V};
        struct tensor tl = tensor_f32(logits, 2, shape);
        struct model_batch b = {.n_tokens = n, .n_seqs = 1, .ids = ids, .cu_seqlens = cu};
        rc = model_forward(m, acts, &b, NULL, &tl, NULL, err);
    }
    if (!rc) {
        printf("{\"logits\": [");
        for (int64_t t = 0; t < n; t++) {
            printf(t ? ", [" : "[");
            for (int64_t v = 0; v < V; v++) printf(v ? ", %.9g" : "%.9g", logits[t * V + v]);
            printf("]");
        }
        printf("]}\n");
    }
    free(logits);
    free(ids);
    model_acts_free(acts);
    lora_free(adapter);
    model_free(m);
    return rc;
}

static int cmd_adapter_save(const struct options *o, struct smelt_error *err) {
    if (!o->model || !o->adapter || !o->out)
        return error_set(err, SMELT_EINVAL, "adapter-save needs --model, --adapter and --out");
    struct model *m;
    int rc = model_load(o->model, BACKEND_CPU, &m, err);
    if (rc) return rc;
    struct lora *adapter;
    rc = lora_load(m, o->adapter, &adapter, err);
    if (!rc) {
        rc = lora_save(adapter, o->out, o->model, err);
        if (!rc) printf("%s: %d adapter tensors, %lld parameters\n", o->out, adapter->n_params, (long long)adapter->n_weights);
        lora_free(adapter);
    }
    model_free(m);
    return rc;
}

static int cmd_info(const struct options *o, struct smelt_error *err) {
    if (!o->model) return error_set(err, SMELT_EINVAL, "info needs --model");
    struct model *m;
    int rc = model_load(o->model, BACKEND_CPU, &m, err);
    if (rc) return rc;
    const struct model_config *c = &m->config;
    printf("%s: %s, %lld layers, hidden %lld, heads %lld/%lld x %lld, mlp %lld, vocab %lld, "
           "context %lld, %lld parameters in %d tensors\n",
           o->model, model_type_name(c->type), (long long)c->n_layers, (long long)c->hidden_size,
           (long long)c->n_heads, (long long)c->n_kv_heads, (long long)c->head_dim,
           (long long)c->intermediate_size, (long long)c->vocab_size, (long long)c->max_seq_len,
           (long long)m->n_weights, m->n_params);
    model_free(m);
    return SMELT_OK;
}

int main(int argc, char **argv) {
    struct options o;
    struct smelt_error err = {0};
    int rc = parse(argc, argv, &o, &err);
    if (!rc) {
        if (strcmp(o.command, "init") == 0) rc = cmd_init(&o, &err);
        else if (strcmp(o.command, "logits") == 0) rc = cmd_logits(&o, &err);
        else if (strcmp(o.command, "info") == 0) rc = cmd_info(&o, &err);
        else if (strcmp(o.command, "adapter-save") == 0) rc = cmd_adapter_save(&o, &err);
        else if (strcmp(o.command, "--help") == 0 || strcmp(o.command, "-h") == 0) {
            usage(stdout);
            return 0;
        } else
            rc = error_set(&err, SMELT_EINVAL, "unknown command '%s'", o.command);
    }
    if (rc) {
        fprintf(stderr, "smelt-model: %s\n", err.message);
        if (rc == SMELT_EINVAL) usage(stderr);
        return rc == SMELT_EINVAL ? 2 : 1;
    }
    return 0;
}
