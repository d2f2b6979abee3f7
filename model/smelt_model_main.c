/* smelt-model: small model-directory tasks.
 *
 *   smelt-model init --config config.json --out DIR [--seed N] [--bf16] [--byte-tokenizer]
 *       a randomly initialised model (N(0, 0.02) weights) saved as a HF directory;
 *       --byte-tokenizer adds the byte tokenizer's tokenizer.json (vocab must cover it)
 *   smelt-model logits --model DIR --ids 1,2,3
 *       prints {"logits": [[...], ...]} for one sequence (for parity checks)
 *   smelt-model info --model DIR
 *       prints the architecture and parameter count
 *   smelt-model score --model DIR [--adapter DIR] (--prompt P --response R [--no-bos] | --ids 1,2,3)
 *       a reward model's score of one sequence: prints {"score": x}; a LoRA reward
 *       model is its adapter directory as --model (its base_model_name_or_path is the
 *       base), or the base as --model and the adapter as --adapter
 *   smelt-model add-score-head --model DIR --out DIR [--seed N] [--pad-id N] [--bf16]
 *       a causal LM turned into a reward model (new score head), saved with its tokenizer
 * Other adapter tasks (logits with an adapter, save, merge) are smelt-lora's (lora/);
 * score reads a reward model's adapter with lora/'s loader, so that a LoRA reward model
 * scores with the same command as a full one. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "lora/lora.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

static void usage(FILE *f) {
    fprintf(f, "usage: smelt-model init --config FILE --out DIR [--seed N] [--bf16] [--byte-tokenizer]\n"
               "       smelt-model logits --model DIR --ids 1,2,3\n"
               "       smelt-model info --model DIR\n"
               "       smelt-model score --model DIR [--adapter DIR] (--prompt P --response R [--no-bos] | --ids 1,2,3)\n"
               "       smelt-model add-score-head --model DIR --out DIR [--seed N] [--pad-id N] [--bf16]\n"
               "  score: a reward model (*ForSequenceClassification) scores one sequence and prints\n"
               "    {\"score\": x}. Text is tokenized as datasets tokenizes a prompt/completion pair:\n"
               "    [bos] + encode(prompt) + encode(response) + [eos], bos and eos when the model\n"
               "    directory's tokenizer has them (--no-bos: without bos, as data.add_bos false).\n"
               "    A LoRA reward model (a PEFT SEQ_CLS adapter with its head): --model ADAPTER_DIR\n"
               "    (the base is its base_model_name_or_path), or --model BASE --adapter DIR; the\n"
               "    tokenizer is the adapter directory's when it has one.\n"
               "  add-score-head: the causal LM in --model with a new score head ~ N(0, 0.02), saved\n"
               "    to --out as a sequence classifier; pad_token_id: --pad-id, else the tokenizer's\n"
               "    pad, else the config's, else eos.\n");
}

struct options {
    const char *command, *config, *out, *model, *adapter, *ids, *prompt, *response;
    uint64_t seed;
    int64_t pad_id; /* -1: not given */
    bool bf16, byte_tokenizer, no_bos;
};

static int parse(int argc, char **argv, struct options *o, struct smelt_error *err) {
    *o = (struct options){0};
    if (argc < 2) return error_set(err, SMELT_EINVAL, "missing command");
    o->command = argv[1];
    const char *seed = NULL, *pad_id = NULL;
    const struct args_option options[] = {
        {"--config", &o->config, NULL}, {"--out", &o->out, NULL}, {"--model", &o->model, NULL},
        {"--ids", &o->ids, NULL},       {"--seed", &seed, NULL},  {"--bf16", NULL, &o->bf16},
        {"--byte-tokenizer", NULL, &o->byte_tokenizer},           {"--prompt", &o->prompt, NULL},
        {"--response", &o->response, NULL}, {"--no-bos", NULL, &o->no_bos},
        {"--pad-id", &pad_id, NULL},    {"--adapter", &o->adapter, NULL}, {NULL, NULL, NULL},
    };
    TRY(args_parse(argc, argv, 2, options, err));
    int64_t s = 0;
    if (seed) TRY(args_int("--seed", seed, 0, INT64_MAX, &s, err));
    o->seed = (uint64_t)s;
    o->pad_id = -1;
    if (pad_id) TRY(args_int("--pad-id", pad_id, 0, INT32_MAX, &o->pad_id, err));
    if (o->adapter && strcmp(o->command, "score") != 0)
        return error_set(err, SMELT_EINVAL, "--adapter goes with score (other adapter tasks are smelt-lora's)");
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

static bool dir_has(const char *dir, const char *name) {
    char path[4096];
    return path_join(path, sizeof path, dir, name, NULL) == SMELT_OK && path_exists(path);
}

/* The model directory's tokenizer, with the special ids its tokenizer_config.json
 * names, as the trainer reads them (a template it cannot use does not matter here). */
static int load_tokenizer(const char *dir, struct tokenizer **out, struct smelt_error *err) {
    TRY(error_wrap(err, tokenizer_load(dir, out, err), "tokenizer"));
    if (dir_has(dir, "tokenizer_config.json")) {
        struct chat_template chat;
        struct smelt_error ignored = {0};
        chat_template_from_tokenizer_config(dir, NULL, &chat, *out, &ignored);
    }
    return SMELT_OK;
}

/* The pad id of the tokenizer in dir, as the trainer reads it; -1 when it has none (or
 * dir has no tokenizer). */
static int64_t tokenizer_pad_id(const char *dir) {
    struct tokenizer *tok = NULL;
    struct smelt_error ignored = {0};
    if (load_tokenizer(dir, &tok, &ignored)) return -1;
    int64_t pad = tokenizer_special_ids(tok)->pad;
    tokenizer_free(tok);
    return pad;
}

/* datasets' raw prompt/completion rule: [bos] + prompt + response + [eos]. */
static int encode_pair(const struct tokenizer *tok, const char *prompt, const char *response,
                       bool bos, int32_t **ids, int64_t *n, struct smelt_error *err) {
    const struct tokenizer_specials *sp = tokenizer_special_ids(tok);
    int32_t *p = NULL, *r = NULL;
    size_t n_p = 0, n_r = 0;
    int rc = tokenizer_encode(tok, prompt, strlen(prompt), false, &p, &n_p, err);
    if (!rc) rc = tokenizer_encode(tok, response, strlen(response), false, &r, &n_r, err);
    size_t total = (bos && sp->bos >= 0) + n_p + n_r + (sp->eos >= 0);
    int32_t *all = rc ? NULL : malloc((total ? total : 1) * sizeof *all);
    if (!rc && !all) rc = error_set(err, SMELT_ENOMEM, "score: out of memory");
    if (!rc) {
        size_t k = 0;
        if (bos && sp->bos >= 0) all[k++] = sp->bos;
        if (n_p) memcpy(all + k, p, n_p * sizeof *p);
        k += n_p;
        if (n_r) memcpy(all + k, r, n_r * sizeof *r);
        k += n_r;
        if (sp->eos >= 0) all[k++] = sp->eos;
        *ids = all;
        *n = (int64_t)total;
    }
    free(p), free(r);
    return rc;
}

static int score_ids(struct model *m, const int32_t *ids, int64_t n, float *score,
                     struct smelt_error *err) {
    if (n < 1) return error_set(err, SMELT_EINVAL, "score: no tokens to score");
    int32_t cu[2] = {0, (int32_t)n};
    struct model_batch b = {.n_tokens = n, .n_seqs = 1, .ids = ids, .cu_seqlens = cu};
    int64_t shape[2] = {n, m->config.hidden_size}, one = 1;
    float *hidden = malloc((size_t)(n * shape[1]) * sizeof *hidden);
    if (!hidden) return error_set(err, SMELT_ENOMEM, "score: out of memory");
    struct tensor th = tensor_f32(hidden, 2, shape), ts = tensor_f32(score, 1, &one);
    struct model_acts *acts = NULL;
    int rc = model_acts_alloc(m, n, false, &acts, err);
    if (!rc) rc = model_forward(m, acts, &b, NULL, NULL, &th, err);
    if (!rc) rc = model_score_forward(m, &b, &th, &ts, err);
    model_acts_free(acts);
    free(hidden);
    return rc;
}

/* The reward model to score with: --model itself, or a LoRA reward model (--adapter,
 * or --model an adapter directory) loaded onto its base and attached. *adapter is NULL
 * for a full model; the caller frees it before *m. tok_dir: where the tokenizer is. */
static int load_scorer(const struct options *o, struct model **m, struct lora **adapter, char *tok_dir,
                       size_t cap, struct smelt_error *err) {
    *adapter = NULL;
    const char *adapter_dir = o->adapter ? o->adapter : dir_has(o->model, "adapter_config.json") ? o->model : NULL;
    snprintf(tok_dir, cap, "%s", o->model);
    if (!adapter_dir) return model_load(o->model, BACKEND_CPU, m, err);
    struct lora_dir_info info;
    TRY(lora_dir_info(adapter_dir, &info, err));
    const char *base = o->adapter ? o->model : info.base_path;
    snprintf(tok_dir, cap, "%s", dir_has(adapter_dir, "tokenizer.json") ? adapter_dir : base);
    /* A causal LM base becomes the classifier with the pad id the trainer gave it. */
    TRY(lora_load_with_base(adapter_dir, base, BACKEND_CPU, tokenizer_pad_id(tok_dir), m, adapter, err));
    int rc = lora_attach(*adapter, err);
    if (rc) {
        lora_free(*adapter);
        model_free(*m);
    }
    return rc;
}

static int cmd_score(const struct options *o, struct smelt_error *err) {
    bool text = o->prompt || o->response;
    if (!o->model || text == (o->ids != NULL) || (text && (!o->prompt || !o->response)))
        return error_set(err, SMELT_EINVAL, "score needs --model and either --prompt and --response, or --ids");
    struct model *m;
    struct lora *adapter;
    char tok_dir[4096];
    TRY(load_scorer(o, &m, &adapter, tok_dir, sizeof tok_dir, err));
    struct tokenizer *tok = NULL;
    int32_t *ids = NULL;
    int64_t n = 0;
    float score = 0;
    int rc = m->config.score_head ? SMELT_OK
             : error_set(err, SMELT_EINVAL, "%s is a %s, not a reward model (*ForSequenceClassification; "
                         "add-score-head makes one)", o->model, m->config.architecture);
    if (!rc && text) rc = load_tokenizer(tok_dir, &tok, err);
    if (!rc && text) rc = encode_pair(tok, o->prompt, o->response, !o->no_bos, &ids, &n, err);
    if (!rc && !text) rc = args_int_list("--ids", o->ids, 0, INT32_MAX, &ids, &n, err);
    if (!rc) rc = score_ids(m, ids, n, &score, err);
    if (!rc) printf("{\"score\": %.9g}\n", (double)score);
    free(ids);
    tokenizer_free(tok);
    lora_free(adapter);
    model_free(m);
    return rc;
}

static int copy_tokenizer_files(const char *from, const char *to, struct smelt_error *err) {
    static const char *const files[] = {"tokenizer.json", "tokenizer_config.json",
                                        "special_tokens_map.json", "chat_template.jinja"};
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        char src[4096], dst[4096], *data = NULL;
        size_t len = 0;
        if (!dir_has(from, files[i])) continue;
        TRY(path_join(src, sizeof src, from, files[i], err));
        TRY(path_join(dst, sizeof dst, to, files[i], err));
        TRY(file_read_all(src, &data, &len, err));
        int rc = file_write_atomic(dst, data, len, err);
        free(data);
        if (rc) return rc;
    }
    return SMELT_OK;
}

/* The pad id for a new head: --pad-id, else the tokenizer's pad, else
 * model_classifier_from_lm's own fallbacks (config, eos). */
static int64_t head_pad_id(const struct options *o) {
    return o->pad_id >= 0 ? o->pad_id : tokenizer_pad_id(o->model);
}

static int cmd_add_score_head(const struct options *o, struct smelt_error *err) {
    if (!o->model || !o->out) return error_set(err, SMELT_EINVAL, "add-score-head needs --model and --out");
    struct model *lm, *rm = NULL;
    TRY(model_load(o->model, BACKEND_CPU, &lm, err));
    int rc = model_classifier_from_lm(lm, head_pad_id(o), 0.02, o->seed, &rm, err);
    if (!rc) rc = model_save(rm, o->out, o->bf16, err);
    if (!rc) rc = copy_tokenizer_files(o->model, o->out, err);
    if (!rc)
        printf("%s: %s, pad_token_id %lld\n", o->out, rm->config.architecture,
               (long long)rm->config.pad_token_id);
    model_free(rm);
    model_free(lm);
    return rc;
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
        else if (strcmp(o.command, "score") == 0) rc = cmd_score(&o, &err);
        else if (strcmp(o.command, "add-score-head") == 0) rc = cmd_add_score_head(&o, &err);
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
