/* Everything a run needs before its first step: the model (pretrained, random, or a
 * LoRA output merged into its base; a reward model's adapter with its head), the
 * tokenizer and chat template, the datasets and their loader, the adapter, the
 * optimizer, activation buffers and the schedule. */
#include "trainer/trainer_internal.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"

static bool dir_has(const char *dir, const char *name) {
    char p[JOB_PATH_BYTES + 64];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return path_exists(p);
}

/* Where the weights come from, before anything loads: the model directory, or for a
 * LoRA output its base (base_model_name_or_path, relative to the adapter directory
 * when not absolute), so the tokenizer can fall back to the base's. */
static int find_base(struct trainer_run *r, struct smelt_error *err) {
    const struct job_spec *s = r->spec;
    if (!path_is_dir(s->model)) return error_set(err, SMELT_ENOTFOUND, "model: %s is not a directory", s->model);
    if (s->model_init_random) return SMELT_OK;
    if (!dir_has(s->model, "adapter_config.json")) {
        snprintf(r->base_path, sizeof r->base_path, "%s", s->model);
        return SMELT_OK;
    }
    struct lora_dir_info info;
    TRY(lora_dir_info(s->model, &info, err));
    if (!info.base_path[0])
        return error_set(err, SMELT_EINVAL, "%s/adapter_config.json: base_model_name_or_path: missing", s->model);
    if (snprintf(r->base_path, sizeof r->base_path, "%s", info.base_path) >= (int)sizeof r->base_path)
        return error_set(err, SMELT_EINVAL, "%s/adapter_config.json: base_model_name_or_path is too long", s->model);
    return SMELT_OK;
}

/* A LoRA output as `model`: its base with the adapter merged in. A reward model's
 * adapter (SEQ_CLS) on a causal LM base makes it a classifier first, with the pad id
 * a new head gets (the tokenizer's, else the config's, else eos: reward.c's rule), and
 * the merge puts the adapter's trained head in it. */
static int load_adapter_output(struct trainer_run *r, struct smelt_error *err) {
    struct lora *adapter;
    int64_t pad = tokenizer_special_ids(r->tok)->pad;
    TRY(lora_load_with_base(r->spec->model, r->base_path, r->spec->backend, pad, &r->model, &adapter, err));
    int rc = lora_merge(adapter, err);
    lora_free(adapter);
    return rc;
}

static int load_model(struct trainer_run *r, struct smelt_error *err) {
    const struct job_spec *s = r->spec;
    if (s->model_init_random) {
        struct model_config config;
        TRY(model_config_load(s->model, &config, err));
        return model_init_random(&config, s->seed, s->backend, &r->model, err);
    }
    /* A new adapter would be trained on base + this adapter merged, but saved naming only
     * the base: loaded there, it would not be the model that was trained. */
    if (dir_has(s->model, "adapter_config.json") && s->has_lora)
        return error_set_field(err, SMELT_EINVAL, "lora",
                               "lora: %s is a LoRA output; a new adapter on it would be saved against its base "
                               "without it. Start the LoRA job from its merged model (save_merged), or train in "
                               "full", s->model);
    if (dir_has(s->model, "adapter_config.json")) return load_adapter_output(r, err);
    return model_load(s->model, s->backend, &r->model, err);
}

static int load_tokenizer(struct trainer_run *r, struct smelt_error *err) {
    const struct job_spec *s = r->spec;
    const char *src = s->tokenizer[0] ? s->tokenizer : s->model;
    /* A LoRA output carries its tokenizer; fall back to its base's otherwise. */
    if (!s->tokenizer[0] && !dir_has(src, "tokenizer.json") && r->base_path[0]) src = r->base_path;
    snprintf(r->tokenizer_dir, sizeof r->tokenizer_dir, "%s", src);
    if (!path_is_dir(src)) { /* a tokenizer.json file: its folder holds the config */
        char *slash = strrchr(r->tokenizer_dir, '/');
        if (slash) *slash = 0;
        else snprintf(r->tokenizer_dir, sizeof r->tokenizer_dir, ".");
    }
    TRY(error_wrap(err, tokenizer_load(src, &r->tok, err), "tokenizer"));
    const char *name = s->chat_template[0] ? s->chat_template : NULL;
    if (dir_has(r->tokenizer_dir, "tokenizer_config.json")) {
        struct smelt_error cerr = {0};
        int rc = chat_template_from_tokenizer_config(r->tokenizer_dir, name, &r->chat, r->tok, &cerr);
        if (rc == SMELT_OK) {
            r->has_chat = true;
        } else if (name) {
            *err = cerr;
            return error_wrap(err, rc, "chat_template");
        } else {
            /* Not fatal: prompt/completion data needs no template; message lists are
             * then refused by the dataset reader. */
            log_warn("no chat template: %s", cerr.message);
        }
    } else if (name) {
        enum chat_template_kind kind;
        TRY(chat_template_from_name(name, &kind, err));
        chat_template_init(&r->chat, kind);
        r->has_chat = true;
    }
    return SMELT_OK;
}

/* One data file, refused when it holds rows of another kind than the job trains on (the
 * loader decides a file's kind by its first row). */
static int load_file(const struct trainer_run *r, const char *path, const char *field,
                     const struct dataset_format *f, struct dataset **out, struct smelt_error *err) {
    enum dataset_kind want = r->spec->type == JOB_SFT          ? DATASET_SFT
                             : job_type_is_rl(r->spec->type) ? DATASET_PROMPTS
                                                             : DATASET_PREFERENCE;
    TRY(dataset_load(path, DATASET_AUTO, f, out, NULL, err));
    if ((*out)->kind == want) return SMELT_OK;
    int rc = error_set_field(err, SMELT_EINVAL, field,
                             "%s: %s holds %s rows; a%s %s job trains on %s rows (datasets/datasets.h)", field,
                             path, dataset_kind_name((*out)->kind), want == DATASET_SFT ? "n" : "",
                             job_type_name(r->spec->type), dataset_kind_name(want));
    dataset_free(*out);
    *out = NULL;
    return rc;
}

static int load_data(struct trainer_run *r, struct smelt_error *err) {
    const struct job_spec *s = r->spec;
    int64_t ctx = r->model->config.max_seq_len;
    int64_t max_len = s->data.max_seq_len ? s->data.max_seq_len : ctx;
    if (max_len > ctx)
        return error_set(err, SMELT_EINVAL, "data.max_seq_len: %lld exceeds the model's context %lld",
                         (long long)max_len, (long long)ctx);
    if (s->hp.batch_tokens > 0 && max_len > s->hp.batch_tokens)
        return error_set(err, SMELT_EINVAL, "hyperparameters.batch_tokens: %lld is below max_seq_len %lld",
                         (long long)s->hp.batch_tokens, (long long)max_len);
    struct dataset_format f = {.tok = r->tok, .chat = r->has_chat ? &r->chat : NULL,
                               .max_seq_len = max_len, .truncation = s->data.truncation,
                               .loss_on = s->data.loss_on, .add_bos = s->data.add_bos};
    TRY(load_file(r, s->data.train, "data.train", &f, &r->train, err));
    if (s->data.validation[0]) TRY(load_file(r, s->data.validation, "data.validation", &f, &r->val, err));
    else if (s->data.validation_fraction > 0)
        TRY(dataset_split(r->train, s->data.validation_fraction, s->seed ^ 0x5eed5917u, &r->val, err));
    /* RL: a batch is the prompts of one iteration, whatever their length. */
    struct dataset_loader_config lc = {.batch_size = (int)s->hp.batch_size,
                                       .max_tokens = job_type_is_rl(s->type) ? 0 : s->hp.batch_tokens,
                                       .shuffle = s->data.shuffle,
                                       .seed = s->seed ^ 0xda7a5eedu};
    return dataset_loader_create(r->train, &lc, &r->loader, err);
}

static int cmp_desc(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x < y) - (x > y);
}

static int seqs_per_row(const struct dataset *ds) { return ds->kind == DATASET_PREFERENCE ? 2 : 1; }

/* The most tokens one micro-batch can hold: batch_tokens when packing, else the
 * batch_size longest rows (examples, or chosen/rejected pairs) together. */
static int64_t longest_batch(const struct dataset *ds, int64_t batch_size) {
    if (!ds) return 0;
    int32_t *len = malloc((size_t)ds->n * sizeof *len);
    if (!len) return -1;
    int per = seqs_per_row(ds);
    for (int64_t i = 0; i < ds->n; i++) {
        len[i] = 0;
        for (int k = 0; k < per; k++) len[i] += ds->examples[i * per + k].n;
    }
    qsort(len, (size_t)ds->n, sizeof *len, cmp_desc);
    int64_t total = 0;
    for (int64_t i = 0; i < ds->n && i < batch_size; i++) total += len[i];
    free(len);
    return total;
}

/* Training FLOPs per token (forward + backward = 3x forward): every linear and the
 * lm_head twice per weight, plus causal attention at the mean sequence length. */
double run_flops_per_token(const struct model *m, double mean_len) {
    const struct model_config *c = &m->config;
    double qd = (double)(c->n_heads * c->head_dim), kd = (double)(c->n_kv_heads * c->head_dim);
    double C = (double)c->hidden_size, F = (double)c->intermediate_size;
    double mlp = c->mlp == MODEL_MLP_SWIGLU ? 3 * C * F : 2 * C * F;
    double head = c->score_head ? 1 : (double)c->vocab_size; /* a reward model's head is [1, C] */
    double linear = (double)c->n_layers * (C * qd + 2 * C * kd + qd * C + mlp) + head * C;
    double attn = (double)c->n_layers * 2.0 * qd * mean_len; /* QK^T and PV, causal half */
    return 3.0 * (2.0 * linear + attn);
}

static int plan(struct trainer_run *r, struct smelt_error *err) {
    const struct job_spec *s = r->spec;
    if (job_type_is_rl(s->type)) return rl_plan(r, err);
    if (s->hp.batch_tokens > 0) {
        r->max_tokens = s->hp.batch_tokens;
    } else {
        int64_t a = longest_batch(r->train, s->hp.batch_size), b = longest_batch(r->val, s->hp.batch_size);
        if (a < 0 || b < 0) return error_set(err, SMELT_ENOMEM, "trainer: out of memory");
        r->max_tokens = a > b ? a : b;
    }
    if (s->hp.max_steps > 0) {
        r->total_steps = s->hp.max_steps;
        r->total_micro = s->hp.max_steps * s->hp.grad_accum;
    } else {
        r->total_micro = 0;
        for (int64_t e = 0; e < s->hp.epochs; e++) {
            int64_t n = dataset_loader_batches_in_epoch(r->loader, e);
            if (n < 0) return error_set(err, SMELT_ENOMEM, "trainer: out of memory counting batches");
            r->total_micro += n;
        }
        r->total_steps = (r->total_micro + s->hp.grad_accum - 1) / s->hp.grad_accum;
    }
    if (r->total_steps < 1) return error_set(err, SMELT_EINVAL, "data.train: no batch to train on");
    r->schedule = (struct lr_schedule){.kind = s->hp.lr_schedule, .peak = s->hp.learning_rate,
                                       .warmup_steps = s->hp.warmup_steps,
                                       .total_steps = r->total_steps,
                                       .min_lr_ratio = s->hp.min_lr_ratio};
    int64_t n_seqs = r->train->n * seqs_per_row(r->train);
    double mean_len = r->train->report.n_tokens > 0 ? (double)r->train->report.n_tokens / (double)n_seqs : 0;
    r->flops_per_token = run_flops_per_token(r->model, mean_len);
    return SMELT_OK;
}

static int setup_trainable(struct trainer_run *r, struct smelt_error *err) {
    const struct job_spec *s = r->spec;
    /* Stage 3 on one rank is the plain run: nothing to shard. */
    bool stage3 = s->hp.zero_stage == 3 && r->dist.ranks > 1;
    if (s->has_lora) {
        TRY(lora_create(r->model, &s->lora, s->seed ^ 0x10aa1234u, &r->lora, err));
        /* Found out now, not after the training: a tied lm_head adapter cannot merge. */
        if (s->save_merged) TRY(error_wrap(err, lora_merge_check(r->lora, err), "save_merged"));
        TRY(lora_attach(r->lora, err));
        lora_set_training(r->lora, true);
        r->params = &r->lora->weights;
        r->grads = &r->lora->grads;
        TRY(run_hash_weights(&r->model->weights, &r->base_hash, err));
    } else {
        if (!stage3) TRY(model_grads_alloc(r->model, err)); /* stage 3: the shard's, zero3.c */
        r->params = &r->model->weights;
        r->grads = &r->model->grads;
    }
    if (stage3) return zero3_run_setup(r, err);
    return dist_optimizer_init(&r->dist, r->params, &r->opt, err);
}

/* rl.true_on_policy: the batch-invariant kernels for this process (the trainer's
 * forward, the reference, the colocated engine) before any op runs; the split
 * placement's workers are started with --batch-invariant (rl_workers.c). */
static int setup_kernels(struct trainer_run *r, struct smelt_error *err) {
    const struct job_spec *s = r->spec;
    if (!job_type_is_rl(s->type) || !s->rl.true_on_policy) return SMELT_OK;
    int rc = ops_set_batch_invariant(s->backend, true, err);
    if (rc) return error_set_field(err, rc, "rl.true_on_policy", "rl.true_on_policy: %s", err->message);
    r->batch_invariant = true;
    return SMELT_OK;
}

int run_setup(struct trainer_run *r, struct smelt_error *err) {
    TRY(setup_kernels(r, err));
    TRY(error_wrap(err, find_base(r, err), "model %s", r->spec->model));
    /* Adapters record their base by absolute path, so the next job finds it from anywhere. */
    char abs[PATH_MAX];
    if (r->base_path[0] && realpath(r->base_path, abs) && strlen(abs) < sizeof r->base_path)
        memcpy(r->base_path, abs, strlen(abs) + 1);
    /* The tokenizer first: a reward model's adapter output needs its pad id to load. */
    TRY(load_tokenizer(r, err));
    TRY(error_wrap(err, load_model(r, err), "model %s", r->spec->model));
    if (tokenizer_vocab_size(r->tok) > r->model->config.vocab_size)
        return error_set(err, SMELT_EINVAL, "tokenizer: %d ids do not fit the model's vocab_size %lld",
                         tokenizer_vocab_size(r->tok), (long long)r->model->config.vocab_size);
    if (r->spec->type == JOB_REWARD) TRY(reward_model_prepare_model(r, err));
    TRY(load_data(r, err));
    TRY(plan(r, err));
    TRY(setup_trainable(r, err));
    TRY(model_acts_alloc(r->model, r->max_tokens, r->spec->hp.recompute, &r->acts, err));
    int64_t n = r->max_tokens;
    TRY(tensor_alloc(&r->logprobs, r->model->backend, DTYPE_F32, 1, &n, err));
    TRY(tensor_alloc(&r->dlogprobs, r->model->backend, DTYPE_F32, 1, &n, err));
    r->host_logprobs = malloc((size_t)n * sizeof *r->host_logprobs);
    if (!r->host_logprobs) return error_set(err, SMELT_ENOMEM, "trainer: out of memory");
    return SMELT_OK;
}

void run_teardown(struct trainer_run *r) {
    /* First, whatever ended the run (an error, a stop): the split placement's rollout
     * workers are stopped and reaped here (rl_workers_stop). */
    rl_state_free(r->rl);
    if (r->batch_invariant) ops_set_batch_invariant(r->spec->backend, false, &(struct smelt_error){0});
    run_metrics_close(r);
    dpo_state_free(r->dpo);
    reward_state_free(r->reward);
    free(r->host_logprobs);
    tensor_free(&r->logprobs);
    tensor_free(&r->dlogprobs);
    model_acts_free(r->acts);
    optimizer_free(&r->opt);
    zero3_free(r->zero3); /* the model's provider: before the model and the comm go */
    lora_free(r->lora);
    dataset_loader_free(r->loader);
    dataset_free(r->train);
    dataset_free(r->val);
    model_free(r->model);
    tokenizer_free(r->tok);
}

int run_hash_weights(const struct tensor *t, uint64_t *out, struct smelt_error *err) {
    int64_t n = tensor_numel(t);
    float *host = malloc((size_t)n * sizeof *host);
    if (!host) return error_set(err, SMELT_ENOMEM, "trainer: out of memory");
    struct tensor h = tensor_f32(host, 1, &n);
    int rc = tensor_copy(&h, t, err);
    uint64_t hash = 0xcbf29ce484222325u; /* FNV-1a over the bytes */
    const unsigned char *p = (const unsigned char *)host;
    for (size_t i = 0; !rc && i < (size_t)n * sizeof *host; i++) hash = (hash ^ p[i]) * 0x100000001b3u;
    free(host);
    *out = hash;
    return rc;
}

int run_copy_tokenizer_files(const struct trainer_run *r, const char *dir, struct smelt_error *err) {
    static const char *const files[] = {"tokenizer.json", "tokenizer_config.json",
                                        "special_tokens_map.json", "chat_template.jinja",
                                        "vocab.json", "merges.txt", "generation_config.json"};
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        char src[JOB_PATH_BYTES + 64], dst[JOB_PATH_BYTES + 64];
        snprintf(src, sizeof src, "%s/%s", r->tokenizer_dir, files[i]);
        if (!path_exists(src)) continue;
        TRY(path_join(dst, sizeof dst, dir, files[i], err));
        char *data;
        size_t len;
        TRY(file_read_all(src, &data, &len, err));
        int rc = file_write_atomic(dst, data, len, err);
        free(data);
        TRY(rc);
    }
    return SMELT_OK;
}
