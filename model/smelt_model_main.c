/* smelt-model: small model-directory tasks.
 *
 *   smelt-model init --config config.json --out DIR [--seed N] [--bf16] [--byte-tokenizer]
 *       a randomly initialised model (N(0, 0.02) weights) saved as a HF directory;
 *       --byte-tokenizer adds the byte tokenizer's tokenizer.json (vocab must cover it)
 *   smelt-model logits --model DIR --ids 1,2,3
 *       prints {"logits": [[...], ...]} for one sequence (for parity checks)
 *   smelt-model info --model DIR
 *       prints the architecture and parameter count
 * Adapter tasks (logits with an adapter, save, merge) are smelt-lora's (lora/). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

static void usage(FILE *f) {
    fprintf(f, "usage: smelt-model init --config FILE --out DIR [--seed N] [--bf16] [--byte-tokenizer]\n"
               "       smelt-model logits --model DIR --ids 1,2,3\n"
               "       smelt-model info --model DIR\n");
}

struct options {
    const char *command, *config, *out, *model, *ids;
    uint64_t seed;
    bool bf16, byte_tokenizer;
};

static int parse(int argc, char **argv, struct options *o, struct smelt_error *err) {
    *o = (struct options){0};
    if (argc < 2) return error_set(err, SMELT_EINVAL, "missing command");
    o->command = argv[1];
    const char *seed = NULL;
    const struct args_option options[] = {
        {"--config", &o->config, NULL}, {"--out", &o->out, NULL}, {"--model", &o->model, NULL},
        {"--ids", &o->ids, NULL},       {"--seed", &seed, NULL},  {"--bf16", NULL, &o->bf16},
        {"--byte-tokenizer", NULL, &o->byte_tokenizer}, {NULL, NULL, NULL},
    };
    TRY(args_parse(argc, argv, 2, options, err));
    int64_t s = 0;
    if (seed) TRY(args_int("--seed", seed, 0, INT64_MAX, &s, err));
    o->seed = (uint64_t)s;
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
    TRY(model_load(o->model, BACKEND_CPU, &m, err));
    int32_t *ids = NULL;
    int64_t n = 0;
    int rc = args_int_list("--ids", o->ids, 0, INT32_MAX, &ids, &n, err);
    if (!rc) rc = model_write_logits_json(m, ids, n, stdout, err);
    free(ids);
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
    backend_cpu_select_kernels(argv);
    struct options o;
    struct smelt_error err = {0};
    int rc = parse(argc, argv, &o, &err);
    if (!rc) {
        if (strcmp(o.command, "init") == 0) rc = cmd_init(&o, &err);
        else if (strcmp(o.command, "logits") == 0) rc = cmd_logits(&o, &err);
        else if (strcmp(o.command, "info") == 0) rc = cmd_info(&o, &err);
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
