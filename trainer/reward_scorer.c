/* The reward_model grader's scorer (rewards.h: struct reward_model_scorer): a sequence
 * classifier loaded once in the trainer's process, on the policy's backend, frozen (no
 * gradients, no optimizer state), scoring each batch of samples as the reward-model
 * trainer scored its pairs:
 *   - the input is tokenized by datasets' own rule for a preference side
 *     (dataset_tokenize_response) with the reward model's tokenizer: a raw prompt as
 *     [bos] + encode(prompt) + encode(completion) + [eos], a message list through the
 *     reward model's chat template with the completion as the assistant turn's content;
 *   - the completion of a chat prompt loses the text the policy's template puts between
 *     its generation prompt and a turn's content (plain's and llama2's " "), which the
 *     policy generated but the training rows' content does not hold;
 *   - the first max_length tokens are kept (training's "truncate"), sequences are packed
 *     batch_size at a time (no padding) and the score head reads the last token that is
 *     not the pad token (model/score_head.h), as transformers does.
 * Memory: the model's f32 weights, and activations (recomputed layer inputs) and hidden
 * states for the largest batch scored so far (at most batch_size x max_length tokens).
 * Also here: loading a classifier from a directory (a model or a reward model's LoRA
 * output), which PPO's critic shares. */
#include "trainer/trainer_internal.h"

#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "model/score_head.h"
#include "rewards/rewards.h"

#define INFIX_BYTES 64

/* One reward_model grader's model. */
struct rm_handle {
    struct model *model;
    struct model_acts *acts;
    int64_t acts_tokens;             /* what acts holds */
    struct tensor hidden, scores;    /* f32 [cap, C], [cap] on the model's backend */
    int64_t cap;                     /* rows of hidden */
    float *host;                     /* [batch_size] */
    struct tokenizer *tok;
    struct chat_template chat;
    bool has_chat;
    struct dataset_format format;
    int batch_size;
    int64_t max_length;
    char infix[INFIX_BYTES];         /* the policy template's seam before content */
    char field[160];                 /* "rl.reward.grader.graders.rm" */
};

/* ---- loading ---- */

static bool dir_has(const char *dir, const char *name) {
    char p[sizeof ((struct lora_dir_info *)0)->base_path + 64];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return path_exists(p);
}

/* A reward model's LoRA output: its base made a classifier, the adapter (with its head)
 * merged in. */
static int load_adapter(const char *dir, enum backend be, int64_t pad, const char *field, const char *hint,
                        struct model **out, struct smelt_error *err) {
    struct lora_dir_info info;
    TRY(lora_dir_info(dir, &info, err));
    if (!info.seq_cls)
        return error_set_field(err, SMELT_EINVAL, field,
                               "%s: %s is a causal LM's adapter (task_type is not SEQ_CLS): %s", field, dir, hint);
    struct lora *adapter;
    TRY(lora_load_with_base(dir, NULL, be, pad, out, &adapter, err));
    int rc = lora_merge(adapter, err);
    lora_free(adapter);
    return rc;
}

int run_load_classifier(const char *dir, enum backend be, int64_t pad, const char *field, const char *hint,
                        struct model **out, struct smelt_error *err) {
    *out = NULL;
    if (!path_is_dir(dir)) return error_set_field(err, SMELT_ENOTFOUND, field, "%s: %s is not a directory", field, dir);
    int rc = dir_has(dir, "adapter_config.json") ? load_adapter(dir, be, pad, field, hint, out, err)
                                                 : model_load(dir, be, out, err);
    if (rc) {
        error_wrap(err, rc, "%s %s", field, dir);
        snprintf(err->field, sizeof err->field, "%s", field);
        return rc;
    }
    if ((*out)->config.score_head) return SMELT_OK;
    rc = error_set_field(err, SMELT_EINVAL, field, "%s: %s is a causal LM (%s), without a score head: %s", field, dir,
                         (*out)->config.architecture, hint);
    model_free(*out);
    *out = NULL;
    return rc;
}

int reward_model_tokenizer(const char *dir, const struct reward_scorer_config *c, const char *field,
                           struct tokenizer **tok, struct chat_template *chat, bool *has_chat, struct smelt_error *err) {
    struct lora_dir_info info;
    struct smelt_error ignore = {0};
    char tokdir[sizeof info.base_path];
    snprintf(tokdir, sizeof tokdir, "%s", dir);
    *has_chat = false;
    if (!dir_has(dir, "tokenizer.json") && dir_has(dir, "adapter_config.json") && !lora_dir_info(dir, &info, &ignore))
        snprintf(tokdir, sizeof tokdir, "%s", info.base_path);
    TRY(error_wrap(err, tokenizer_load(tokdir, tok, err), "%s: the model's tokenizer", field));
    const char *policy = c->policy_chat ? chat_template_name(c->policy_chat->kind) : NULL;
    if (dir_has(tokdir, "tokenizer_config.json")) {
        *has_chat = !chat_template_from_tokenizer_config(tokdir, NULL, chat, *tok, &ignore) ||
                    (policy && !chat_template_from_tokenizer_config(tokdir, policy, chat, *tok, &ignore));
    } else if (c->policy_chat) {
        *chat = *c->policy_chat;
        *has_chat = true;
    }
    return SMELT_OK;
}

static int load_tokenizer(struct rm_handle *h, const char *dir, const struct reward_scorer_config *c,
                          struct smelt_error *err) {
    return reward_model_tokenizer(dir, c, h->field, &h->tok, &h->chat, &h->has_chat, err);
}

/* What the policy's template puts between its generation prompt and an assistant turn's
 * content: the generation prompt of [user "x"] against the conversation [user "x",
 * assistant "\x01"] (a byte no template writes). "" when the one does not continue
 * into the other. */
static void policy_infix(const struct chat_template *t, char *out, size_t cap) {
    out[0] = 0;
    if (!t) return;
    struct chat_message m[2] = {{.role = "user", .content = "x"}, {.role = "assistant", .content = "\x01"}};
    char *a = NULL, *b = NULL;
    size_t na, nb;
    struct smelt_error ignore = {0};
    if (!chat_render(t, m, 1, true, &a, &na, &ignore) && !chat_render(t, m, 2, false, &b, &nb, &ignore) && nb > na &&
        memcmp(a, b, na) == 0) {
        const char *y = strchr(b + na, '\x01');
        if (y && (size_t)(y - (b + na)) < cap) {
            memcpy(out, b + na, (size_t)(y - (b + na)));
            out[y - (b + na)] = 0;
        }
    }
    free(a);
    free(b);
}

/* rc with err's field set to ref's grader's key, relative to the stage's spec (rewards.h). */
static int at_key(const struct reward_model_ref *ref, const char *key, int rc, struct smelt_error *err) {
    if (rc) snprintf(err->field, sizeof err->field, "%s.%s", ref->field, key);
    return rc;
}

static int check_lengths(struct rm_handle *h, const struct reward_model_ref *ref, struct smelt_error *err) {
    const struct model_config *mc = &h->model->config;
    if (tokenizer_vocab_size(h->tok) > mc->vocab_size)
        return at_key(ref, "model", error_set(err, SMELT_EINVAL, "%s.model: its tokenizer's %d ids do not fit its "
                                              "vocab_size %lld", h->field, tokenizer_vocab_size(h->tok),
                                              (long long)mc->vocab_size), err);
    if (ref->max_length > mc->max_seq_len)
        return at_key(ref, "max_length", error_set(err, SMELT_EINVAL, "%s.max_length: %lld is beyond the reward "
                                                   "model's context (%lld tokens)", h->field,
                                                   (long long)ref->max_length, (long long)mc->max_seq_len), err);
    h->max_length = ref->max_length ? ref->max_length : mc->max_seq_len;
    return SMELT_OK;
}

static void handle_free(void *p) {
    struct rm_handle *h = p;
    if (!h) return;
    tensor_free(&h->hidden);
    tensor_free(&h->scores);
    free(h->host);
    model_acts_free(h->acts);
    model_free(h->model);
    tokenizer_free(h->tok);
    free(h);
}

static int open_model(struct rm_handle *h, const struct reward_model_ref *ref, const struct reward_scorer_config *c,
                      struct smelt_error *err) {
    static const char hint[] = "a reward_model grader scores with a sequence classifier (a reward_model job's "
                               "output, or a base model of that kind)";
    char field[200];
    snprintf(field, sizeof field, "%s.model", h->field);
    TRY(at_key(ref, "model", load_tokenizer(h, ref->dir, c, err), err));
    TRY(at_key(ref, "model", run_load_classifier(ref->dir, c->backend, tokenizer_special_ids(h->tok)->pad, field,
                                                 hint, &h->model, err), err));
    TRY(check_lengths(h, ref, err));
    h->batch_size = ref->batch_size;
    h->host = malloc((size_t)h->batch_size * sizeof *h->host);
    if (!h->host) return error_set(err, SMELT_ENOMEM, "%s: out of memory", h->field);
    h->format = (struct dataset_format){.tok = h->tok, .chat = h->has_chat ? &h->chat : NULL,
                                        .max_seq_len = h->max_length, .add_bos = c->add_bos};
    policy_infix(c->policy_chat, h->infix, sizeof h->infix);
    log_info("%s: reward model %s (%s), %lld parameters (%.1f MiB f32) on %s, up to %d samples of %lld tokens a pass",
             h->field, ref->dir, h->model->config.architecture, (long long)h->model->n_weights,
             (double)h->model->n_weights * 4.0 / (1 << 20), backend_name(c->backend), h->batch_size,
             (long long)h->max_length);
    return SMELT_OK;
}

static int scorer_open(void *ctx, const struct reward_model_ref *ref, void **handle, struct smelt_error *err) {
    const struct reward_scorer_config *c = ctx;
    *handle = NULL;
    struct rm_handle *h = calloc(1, sizeof *h);
    if (!h) return error_set(err, SMELT_ENOMEM, "reward model: out of memory");
    snprintf(h->field, sizeof h->field, "%s.%s", c->where, ref->field);
    int rc = open_model(h, ref, c, err);
    if (rc) {
        handle_free(h);
        return rc;
    }
    *handle = h;
    return SMELT_OK;
}

/* ---- scoring ---- */

/* Sample s as the reward model reads it (at most max_length tokens), into *ex; false
 * with why in r when it cannot be (the sample fails). */
static bool sample_tokens(struct rm_handle *h, const struct reward_sample *s, struct dataset_example *ex,
                          struct reward_model_result *r, int *rc) {
    const char *response = s->completion;
    size_t k = strlen(h->infix);
    if (s->prompt_messages && k && strncmp(response, h->infix, k) == 0) response += k;
    struct smelt_error e = {0};
    *rc = SMELT_OK;
    if (!s->prompt_messages && !s->prompt) {
        snprintf(r->error, sizeof r->error, "the sample has no prompt text for the reward model");
    } else {
        int t = dataset_tokenize_response(&h->format, s->prompt_messages ? NULL : s->prompt, s->prompt_messages,
                                          response, ex, &e);
        if (!t && ex->n > 0) {
            if (ex->n > h->max_length) ex->n = (int32_t)h->max_length;
            return true;
        }
        if (!t) snprintf(e.message, sizeof e.message, "no tokens");
        if (t == SMELT_ENOMEM) *rc = t;
        snprintf(r->error, sizeof r->error, "the reward model cannot read the sample: %.200s", e.message);
    }
    r->failed = true;
    r->score = 0;
    return false;
}

/* Room for T tokens: activations and hidden states, grown to the largest batch. */
static int reserve(struct rm_handle *h, int64_t T, struct smelt_error *err) {
    if (T > h->acts_tokens) {
        model_acts_free(h->acts);
        h->acts = NULL;
        h->acts_tokens = 0;
        TRY(model_acts_alloc(h->model, T, true, &h->acts, err));
        h->acts_tokens = T;
    }
    if (T <= h->cap) return SMELT_OK;
    tensor_free(&h->hidden);
    tensor_free(&h->scores);
    h->cap = 0;
    int64_t shape[2] = {T, h->model->config.hidden_size};
    TRY(tensor_alloc(&h->hidden, h->model->backend, DTYPE_F32, 2, shape, err));
    TRY(tensor_alloc(&h->scores, h->model->backend, DTYPE_F32, 1, shape, err));
    h->cap = T;
    return SMELT_OK;
}

/* Sequences ex[0..S) packed and scored into host[0..S). */
static int forward(struct rm_handle *h, const struct dataset_example *ex, int S, struct smelt_error *err) {
    int64_t T = 0;
    for (int s = 0; s < S; s++) T += ex[s].n;
    int32_t *ids = malloc((size_t)T * sizeof *ids), *cu = malloc((size_t)(S + 1) * sizeof *cu);
    int rc = ids && cu ? reserve(h, T, err) : error_set(err, SMELT_ENOMEM, "%s: out of memory", h->field);
    for (int s = 0, t = 0; !rc && s < S; t += ex[s].n, s++) {
        cu[s] = t;
        memcpy(ids + t, ex[s].ids, (size_t)ex[s].n * sizeof *ids);
    }
    if (!rc) {
        cu[S] = (int32_t)T;
        struct model_batch mb = {.n_tokens = T, .n_seqs = S, .ids = ids, .cu_seqlens = cu};
        int64_t hs[2] = {T, h->model->config.hidden_size}, ss = S;
        struct tensor hidden = tensor_make(h->model->backend, DTYPE_F32, h->hidden.data, 2, hs);
        struct tensor scores = tensor_make(h->model->backend, DTYPE_F32, h->scores.data, 1, &ss);
        struct tensor host = tensor_f32(h->host, 1, &ss);
        rc = model_forward(h->model, h->acts, &mb, NULL, NULL, &hidden, err);
        if (!rc) rc = model_score_forward(h->model, &mb, &hidden, &scores, err);
        if (!rc) rc = tensor_copy(&host, &scores, err);
    }
    free(ids);
    free(cu);
    return rc;
}

/* Samples [i, i + k) of the call: tokenized, the readable ones scored in one pass. */
static int score_chunk(struct rm_handle *h, const struct reward_sample *samples, int k,
                       struct reward_model_result *out, struct smelt_error *err) {
    struct dataset_example *ex = calloc((size_t)k, sizeof *ex);
    int *at = malloc((size_t)k * sizeof *at), S = 0, rc = ex && at ? SMELT_OK : SMELT_ENOMEM;
    for (int i = 0; !rc && i < k; i++) {
        memset(&out[i], 0, sizeof out[i]);
        if (sample_tokens(h, &samples[i], &ex[S], &out[i], &rc)) at[S++] = i;
    }
    if (rc == SMELT_ENOMEM) error_set(err, rc, "%s: out of memory", h->field);
    if (!rc && S) rc = forward(h, ex, S, err);
    for (int s = 0; !rc && s < S; s++) out[at[s]].score = h->host[s];
    for (int s = 0; ex && s < k; s++) dataset_example_free(&ex[s]);
    free(ex);
    free(at);
    return rc;
}

static int scorer_score(void *handle, const struct reward_sample *samples, int n, struct reward_model_result *out,
                        struct smelt_error *err) {
    struct rm_handle *h = handle;
    for (int i = 0; i < n; i += h->batch_size) {
        int k = n - i < h->batch_size ? n - i : h->batch_size;
        TRY(score_chunk(h, samples + i, k, out + i, err));
    }
    return SMELT_OK;
}

void reward_scorer_init(const struct reward_scorer_config *config, struct reward_model_scorer *out) {
    *out = (struct reward_model_scorer){.ctx = (void *)config, .open = scorer_open, .score = scorer_score,
                                        .close = handle_free, .open_generator = reward_generator_open,
                                        .generate = reward_generator_generate, .close_generator = reward_generator_close};
}
