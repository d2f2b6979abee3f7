/* The score_model / label_model graders' generator (rewards.h: struct
 * reward_model_scorer's open_generator, generate, close_generator): the grader's model,
 * a causal LM (a base model or a job's output, full or a LoRA adapter merged into its
 * base), loaded once in the trainer's process on the policy's backend and frozen. Each
 * batch:
 *   - every prompt's messages through the grader model's own chat template, the
 *     generation prompt appended (chat_tokenize: message text can never produce a
 *     control token), with its own tokenizer;
 *   - all of them through one paged rollout engine (rollout/, continuous batching),
 *     created for the batch and freed before returning, so its KV cache is not held
 *     while the policy trains; prompt i draws from stream (seed, i), so a batch with the
 *     same seed gives the same replies, and temperature 0 is greedy;
 *   - generation ends at the model's eos ids or the tokenizer's, at max_tokens, or at
 *     the model's context; replies are decoded without special tokens (and without ids
 *     the tokenizer lacks, as the policy's samples are).
 * A prompt longer than the model's context fails its sample, saying so. */
#include "trainer/trainer_internal.h"

#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "rollout/rollout.h"

struct gen_handle {
    struct model *model;
    struct tokenizer *tok;
    struct chat_template chat;
    char field[200]; /* "rl.reward.grader.graders.judge" */
};

void reward_generator_close(void *p) {
    struct gen_handle *h = p;
    if (!h) return;
    model_free(h->model);
    tokenizer_free(h->tok);
    free(h);
}

/* A causal LM from dir: a model directory, or a causal LoRA output merged into its base. */
static int load_lm(struct gen_handle *h, const char *dir, enum backend be, struct smelt_error *err) {
    if (!path_is_dir(dir)) return error_set(err, SMELT_ENOTFOUND, "%s.model: %s is not a directory", h->field, dir);
    char p[4200];
    snprintf(p, sizeof p, "%s/adapter_config.json", dir);
    if (path_exists(p)) {
        struct lora *adapter;
        TRY(error_wrap(err, lora_load_with_base(dir, NULL, be, -1, &h->model, &adapter, err), "%s.model %s",
                       h->field, dir));
        int rc = lora_merge(adapter, err);
        lora_free(adapter);
        TRY(rc);
    } else {
        TRY(error_wrap(err, model_load(dir, be, &h->model, err), "%s.model %s", h->field, dir));
    }
    if (h->model->config.score_head)
        return error_set(err, SMELT_EINVAL, "%s.model: %s is a sequence classifier (%s): a %s grader needs a model "
                         "that generates text (use a reward_model grader for a classifier)", h->field, dir,
                         h->model->config.architecture, "score_model / label_model");
    return SMELT_OK;
}

static int open_lm(struct gen_handle *h, const struct reward_model_ref *ref, const struct reward_scorer_config *c,
                   struct smelt_error *err) {
    bool has_chat;
    TRY(reward_model_tokenizer(ref->dir, c, h->field, &h->tok, &h->chat, &has_chat, err));
    if (!has_chat)
        return error_set(err, SMELT_EINVAL, "%s.model: %s has no chat template (tokenizer_config.json) to render the "
                         "grader's messages with", h->field, ref->dir);
    TRY(load_lm(h, ref->dir, c->backend, err));
    if (tokenizer_vocab_size(h->tok) > h->model->config.vocab_size)
        return error_set(err, SMELT_EINVAL, "%s.model: its tokenizer's %d ids do not fit its vocab_size %lld",
                         h->field, tokenizer_vocab_size(h->tok), (long long)h->model->config.vocab_size);
    log_info("%s: grader model %s (%s, chat template %s), %lld parameters on %s", h->field, ref->dir,
             h->model->config.architecture, chat_template_name(h->chat.kind), (long long)h->model->n_weights,
             backend_name(c->backend));
    return SMELT_OK;
}

int reward_generator_open(void *ctx, const struct reward_model_ref *ref, void **handle, struct smelt_error *err) {
    const struct reward_scorer_config *c = ctx;
    *handle = NULL;
    struct gen_handle *h = calloc(1, sizeof *h);
    if (!h) return error_set(err, SMELT_ENOMEM, "grader model: out of memory");
    snprintf(h->field, sizeof h->field, "%s.%s", c->where, ref->field);
    int rc = open_lm(h, ref, c, err);
    if (rc) {
        snprintf(err->field, sizeof err->field, "%s.model", ref->field);
        reward_generator_close(h);
        return rc;
    }
    *handle = h;
    return SMELT_OK;
}

int reward_generator_prompt_ids(void *handle, const struct reward_prompt *prompt, int32_t **ids, size_t *n,
                                struct smelt_error *err) {
    struct gen_handle *h = handle;
    struct chat_message m[REWARD_MAX_PROMPT_MESSAGES];
    if (prompt->n < 1 || prompt->n > REWARD_MAX_PROMPT_MESSAGES)
        return error_set(err, SMELT_EINVAL, "%s: %d messages", h->field, prompt->n);
    for (int k = 0; k < prompt->n; k++)
        m[k] = (struct chat_message){.role = prompt->messages[k].role, .content = prompt->messages[k].content};
    uint8_t *mask = NULL;
    int rc = chat_tokenize(&h->chat, h->tok, m, (size_t)prompt->n, true, ids, &mask, n, err);
    free(mask);
    return rc;
}

/* ---- a batch ---- */

struct batch {
    struct rollout_request *q; /* [n] */
    int32_t **ids;             /* [n] prompt ids (NULL: the sample is not asked) */
    int n_asked;
    int64_t kv_tokens;         /* prompt + reply tokens of every request */
};

/* Prompt i's request, or its failure in out[i]. */
static int request(struct gen_handle *h, const struct reward_prompt *pr, int i, const struct reward_generate_params *p,
                   struct batch *b, struct reward_generation *out) {
    struct smelt_error e = {0};
    size_t n_ids = 0;
    int rc = reward_generator_prompt_ids(h, pr, &b->ids[i], &n_ids, &e);
    int64_t ctx = h->model->config.max_seq_len;
    if (rc == SMELT_ENOMEM) return rc;
    if (!rc && (int64_t)n_ids >= ctx) snprintf(e.message, sizeof e.message, "%zu tokens, the model's context is %lld",
                                               n_ids, (long long)ctx);
    if (rc || (int64_t)n_ids >= ctx) {
        out[i].failed = true;
        snprintf(out[i].error, sizeof out[i].error, "the grader model cannot read its prompt: %.200s", e.message);
        free(b->ids[i]);
        b->ids[i] = NULL;
        return SMELT_OK;
    }
    int64_t room = ctx - (int64_t)n_ids, max = p->max_tokens < room ? p->max_tokens : room;
    b->q[i] = (struct rollout_request){
        .id = (uint64_t)i, .prompt = b->ids[i], .n_prompt = (int64_t)n_ids, .n = 1, .max_new_tokens = max,
        .sampling = {.temperature = (float)p->temperature, .top_p = (float)p->top_p},
        .seed = rng_mix64(p->seed ^ ((uint64_t)i * RNG_GOLDEN + 1)) >> 1};
    rl_stop_ids(h->model, h->tok, &b->q[i]);
    b->kv_tokens += (int64_t)n_ids + max + ROLLOUT_KV_BLOCK_TOKENS;
    b->n_asked++;
    return SMELT_OK;
}

/* A reply's text as the policy's samples are decoded (grpo.c): ids the tokenizer has no
 * token for (a model's vocabulary may be larger than its tokenizer's, and a sampling judge
 * can draw one) have no text, rather than failing the whole batch. */
static int decode_reply(struct gen_handle *h, const struct rollout_result *res, char **text,
                        struct smelt_error *err) {
    int32_t *known = malloc((size_t)(res->n ? res->n : 1) * sizeof *known);
    if (!known) return error_set(err, SMELT_ENOMEM, "%s: out of memory", h->field);
    size_t k = 0, len;
    for (int64_t i = 0; i < res->n; i++)
        if (tokenizer_id_to_token(h->tok, res->ids[i])) known[k++] = res->ids[i];
    int rc = tokenizer_decode(h->tok, known, k, true, text, &len, err);
    free(known);
    return rc;
}

static int take(struct gen_handle *h, struct rollout_engine *e, struct reward_generation *out,
                struct smelt_error *err) {
    struct rollout_result *res;
    int k;
    TRY(rollout_engine_take(e, &res, &k, err));
    int rc = SMELT_OK;
    for (int i = 0; i < k && !rc; i++) rc = decode_reply(h, &res[i], &out[res[i].request_id].text, err);
    rollout_results_free(res, k);
    return rc;
}

static int run_engine(struct gen_handle *h, struct batch *b, int n, struct reward_generation *out,
                      struct smelt_error *err) {
    int64_t seqs = b->n_asked < 256 ? b->n_asked : 256;
    struct rollout_config ec = {.kv_memory_bytes = b->kv_tokens * model_kv_bytes_per_token(h->model),
                                .max_batch_tokens = 2048, .max_seqs = (int)seqs, .prefill_chunk = 512};
    struct rollout_engine *e;
    TRY(error_wrap(err, rollout_engine_create(h->model, h->tok, &ec, &e, err), "%s: rollout engine", h->field));
    int rc = SMELT_OK;
    for (int i = 0; i < n && !rc; i++)
        if (b->ids[i]) rc = rollout_engine_add(e, &b->q[i], err);
    while (!rc && !rollout_engine_idle(e)) {
        rc = rollout_engine_step(e, err);
        if (!rc) rc = take(h, e, out, err);
    }
    if (!rc) rc = take(h, e, out, err);
    rollout_engine_free(e);
    return rc;
}

int reward_generator_generate(void *handle, const struct reward_prompt *prompts, int n,
                              const struct reward_generate_params *p, struct reward_generation *out,
                              struct smelt_error *err) {
    struct gen_handle *h = handle;
    struct batch b = {.q = calloc(n > 0 ? (size_t)n : 1, sizeof *b.q), .ids = calloc(n > 0 ? (size_t)n : 1,
                                                                                      sizeof *b.ids)};
    int rc = b.q && b.ids ? SMELT_OK : SMELT_ENOMEM;
    for (int i = 0; i < n; i++) out[i] = (struct reward_generation){0};
    for (int i = 0; !rc && i < n; i++)
        if (prompts[i].n) rc = request(h, &prompts[i], i, p, &b, out);
    if (rc) error_set(err, rc, "%s: out of memory", h->field);
    if (!rc && b.n_asked) rc = run_engine(h, &b, n, out, err);
    for (int i = 0; b.ids && i < n; i++) free(b.ids[i]);
    free(b.ids);
    free(b.q);
    return rc;
}
