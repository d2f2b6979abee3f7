/* smelt-lora: LoRA adapter tasks on a model directory. It lives in lora/ because it
 * uses both lora/ and model/, and lora/ sits above model/.
 *
 *   smelt-lora logits --model DIR --adapter DIR --ids 1,2,3
 *       prints {"logits": [[...], ...]} for one sequence with the PEFT adapter applied
 *       unmerged (for parity checks against PEFT)
 *   smelt-lora save --model DIR --adapter DIR --out DIR
 *       loads a PEFT adapter onto the model and writes it as smelt saves adapters (f32;
 *       also converts bf16/f16 adapters)
 *   smelt-lora merge --model DIR --adapter DIR --out DIR [--bf16]
 *       writes the model with the adapter merged into its weights (W += s B A) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "lora/lora.h"
#include "model/model.h"

static void usage(FILE *f) {
    fprintf(f, "usage: smelt-lora logits --model DIR --adapter DIR --ids 1,2,3\n"
               "       smelt-lora save --model DIR --adapter DIR --out DIR\n"
               "       smelt-lora merge --model DIR --adapter DIR --out DIR [--bf16]\n");
}

struct options {
    const char *command, *model, *adapter, *ids, *out;
    bool bf16;
};

static int parse(int argc, char **argv, struct options *o, struct smelt_error *err) {
    *o = (struct options){0};
    if (argc < 2) return error_set(err, SMELT_EINVAL, "missing command");
    o->command = argv[1];
    const struct args_option options[] = {
        {"--model", &o->model, NULL}, {"--adapter", &o->adapter, NULL}, {"--ids", &o->ids, NULL},
        {"--out", &o->out, NULL},     {"--bf16", NULL, &o->bf16},       {NULL, NULL, NULL},
    };
    TRY(args_parse(argc, argv, 2, options, err));
    if (!o->model || !o->adapter) return error_set(err, SMELT_EINVAL, "%s needs --model and --adapter", o->command);
    return SMELT_OK;
}

/* The model with the adapter loaded (not attached); both are the caller's to free. */
static int load(const struct options *o, struct model **m, struct lora **adapter, struct smelt_error *err) {
    TRY(model_load(o->model, BACKEND_CPU, m, err));
    int rc = lora_load(*m, o->adapter, adapter, err);
    if (rc) model_free(*m);
    return rc;
}

static int cmd_logits(const struct options *o, struct model *m, struct lora *adapter, struct smelt_error *err) {
    if (!o->ids) return error_set(err, SMELT_EINVAL, "logits needs --ids");
    int32_t *ids = NULL;
    int64_t n = 0;
    int rc = args_int_list("--ids", o->ids, 0, INT32_MAX, &ids, &n, err);
    if (!rc) rc = lora_attach(adapter, err);
    if (!rc) rc = model_write_logits_json(m, ids, n, stdout, err);
    free(ids);
    return rc;
}

static int cmd_save(const struct options *o, const struct lora *adapter, struct smelt_error *err) {
    if (!o->out) return error_set(err, SMELT_EINVAL, "save needs --out");
    TRY(lora_save(adapter, o->out, o->model, err));
    printf("%s: %d adapter tensors, %lld parameters\n", o->out, adapter->n_params, (long long)adapter->n_weights);
    return SMELT_OK;
}

static int cmd_merge(const struct options *o, struct model *m, const struct lora *adapter, struct smelt_error *err) {
    if (!o->out) return error_set(err, SMELT_EINVAL, "merge needs --out");
    TRY(lora_merge(adapter, err));
    TRY(model_save(m, o->out, o->bf16, err));
    printf("%s: %s model with the adapter merged\n", o->out, model_type_name(m->config.type));
    return SMELT_OK;
}

static int run(const struct options *o, struct smelt_error *err) {
    bool logits = strcmp(o->command, "logits") == 0, save = strcmp(o->command, "save") == 0;
    if (!logits && !save && strcmp(o->command, "merge") != 0)
        return error_set(err, SMELT_EINVAL, "unknown command '%s'", o->command);
    struct model *m;
    struct lora *adapter;
    TRY(load(o, &m, &adapter, err));
    int rc = logits ? cmd_logits(o, m, adapter, err) : save ? cmd_save(o, adapter, err) : cmd_merge(o, m, adapter, err);
    lora_free(adapter);
    model_free(m);
    return rc;
}

int main(int argc, char **argv) {
    backend_cpu_select_kernels(argv);
    if (argc == 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
        usage(stdout);
        return 0;
    }
    struct options o;
    struct smelt_error err = {0};
    int rc = parse(argc, argv, &o, &err);
    if (!rc) rc = run(&o, &err);
    if (rc) {
        fprintf(stderr, "smelt-lora: %s\n", err.message);
        if (rc == SMELT_EINVAL) usage(stderr);
        return rc == SMELT_EINVAL ? 2 : 1;
    }
    return 0;
}
