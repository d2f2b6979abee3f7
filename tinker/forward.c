/* forward and forward_backward: the request's data checked whole (every error names
 * data[i]...), packed as one batch, the target tokens' logprobs, the loss of
 * trainer/rl_loss.h per datum, and (forward_backward) the backward into the model's
 * adapter gradients, which accumulate until optim_step. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "tinker/tinker_internal.h"

enum loss_kind { LOSS_CE, LOSS_IS, LOSS_PPO, LOSS_CISPO, LOSS_DRO };
static const char *const LOSS_NAMES[] = {"cross_entropy", "importance_sampling", "ppo", "cispo", "dro"};
#define N_LOSSES 5

/* One datum's views into the request's frames. */
struct datum {
    int64_t n, off;                 /* tokens, and where they start in the packed batch */
    const int32_t *target;
    const float *weights, *q, *adv; /* weights (cross_entropy); sampling logprobs, advantages */
};

struct fwd {
    enum loss_kind loss;
    double clip_low, clip_high, beta;
    int n_data;
    struct datum *d;
    int64_t T;
    const int32_t *tokens;
};

static int loss_config(const json_t *h, struct fwd *f, struct smelt_error *err) {
    const char *name;
    TRY(json_field_string(h, "loss_fn", true, NULL, &name, "request", err));
    int k = 0;
    while (k < N_LOSSES && strcmp(LOSS_NAMES[k], name) != 0) k++;
    if (k == N_LOSSES)
        return error_set_field(err, SMELT_EINVAL, "loss_fn", "loss_fn: unknown \"%s\" (cross_entropy, "
                               "importance_sampling, ppo, cispo, dro)", name);
    f->loss = (enum loss_kind)k;
    const json_t *c = json_object_get(h, "loss_fn_config");
    if (c && !json_is_null(c) && !json_is_object(c))
        return error_set_field(err, SMELT_EINVAL, "loss_fn_config", "loss_fn_config: must be an object");
    static const char *const clip_keys[] = {"clip_low_threshold", "clip_high_threshold", NULL};
    static const char *const dro_keys[] = {"beta", NULL}, *const none[] = {NULL};
    const char *const *allowed = f->loss == LOSS_PPO || f->loss == LOSS_CISPO ? clip_keys
                                 : f->loss == LOSS_DRO                        ? dro_keys
                                                                              : none;
    const char *bad = c ? json_unknown_key(c, allowed) : NULL;
    if (bad)
        return error_set_field(err, SMELT_EINVAL, "loss_fn_config", "loss_fn_config: \"%s\" is not a setting of %s",
                               bad, name);
    bool cispo = f->loss == LOSS_CISPO;
    int rc = json_field_double(c, "clip_low_threshold", false, cispo ? TINKER_CISPO_CLIP_LOW : TINKER_PPO_CLIP_LOW,
                               0.0, 1e9, &f->clip_low, "loss_fn_config", err);
    if (!rc)
        rc = json_field_double(c, "clip_high_threshold", false, cispo ? TINKER_CISPO_CLIP_HIGH : TINKER_PPO_CLIP_HIGH,
                               0.0, 1e9, &f->clip_high, "loss_fn_config", err);
    if (!rc) rc = json_field_double(c, "beta", f->loss == LOSS_DRO, 0.0, 0.0, 1e9, &f->beta, "loss_fn_config", err);
    if (rc) return error_in_field(err, rc, "loss_fn_config");
    if (f->loss == LOSS_PPO && !(f->clip_low > 0.0 && f->clip_low <= 1.0 && f->clip_high >= 1.0))
        return error_set_field(err, SMELT_EINVAL, "loss_fn_config", "loss_fn_config: ppo needs 0 < "
                               "clip_low_threshold <= 1 <= clip_high_threshold, got %g and %g", f->clip_low,
                               f->clip_high);
    if (f->clip_high < f->clip_low)
        return error_set_field(err, SMELT_EINVAL, "loss_fn_config.clip_high_threshold", "loss_fn_config."
                               "clip_high_threshold: %g is below clip_low_threshold %g", f->clip_high, f->clip_low);
    return SMELT_OK;
}

/* Frame i after the header (0: tokens, 1: int64 inputs as int32, 2: float32) as 4-byte
 * values. */
static const void *frame(const struct msg *m, int i, int64_t *n) {
    *n = i < m->n_arrays ? (int64_t)(m->arrays[i].bytes / 4) : 0;
    return i < m->n_arrays ? m->arrays[i].data : NULL;
}

/* data[i].loss_fn_inputs.NAME: dtype, shape [n] and offset checked; *out its values. */
static int input_view(const struct msg *m, const json_t *inputs, int i, const char *name, int64_t n,
                      const void **out, struct smelt_error *err) {
    char field[SMELT_ERROR_FIELD_BYTES];
    snprintf(field, sizeof field, "data[%d].loss_fn_inputs.%s", i, name);
    const json_t *in = json_object_get(inputs, name);
    if (!json_is_object(in)) return error_set_field(err, SMELT_EINVAL, field, "%s: required by this loss_fn", field);
    bool is_int = strcmp(name, "target_tokens") == 0;
    const char *dtype = json_string_value(json_object_get(in, "dtype"));
    if (!dtype || strcmp(dtype, is_int ? "int64" : "float32") != 0)
        return error_set_field(err, SMELT_EINVAL, field, "%s: dtype %s, expected %s", field, dtype ? dtype : "missing",
                               is_int ? "int64" : "float32");
    const json_t *shape = json_object_get(in, "shape");
    if (!json_is_array(shape) || json_array_size(shape) != 1 || !json_is_integer(json_array_get(shape, 0)))
        return error_set_field(err, SMELT_EINVAL, field, "%s: shape must be [n], one dimension", field);
    json_int_t len = json_integer_value(json_array_get(shape, 0));
    if (len != n)
        return error_set_field(err, SMELT_EINVAL, field, "%s: length %lld, model_input has %lld tokens", field,
                               (long long)len, (long long)n);
    const json_t *off = json_object_get(in, "offset");
    int64_t have;
    const char *base = frame(m, is_int ? 1 : 2, &have);
    if (!json_is_integer(off) || json_integer_value(off) < 0 || json_integer_value(off) > have - n)
        return error_set_field(err, SMELT_EINVAL, field, "%s: offset must be an integer with offset + %lld within "
                               "the %lld values of frame %d", field, (long long)n, (long long)have, is_int ? 3 : 4);
    *out = base + 4 * json_integer_value(off);
    return SMELT_OK;
}

static int floats_finite(const float *x, int64_t n, int i, const char *name, struct smelt_error *err) {
    for (int64_t t = 0; t < n; t++)
        if (!isfinite(x[t]))
            return error_set_field(err, SMELT_EINVAL, "data", "data[%d].loss_fn_inputs.%s[%lld]: %g is not finite", i,
                                   name, (long long)t, (double)x[t]);
    return SMELT_OK;
}

static int ids_in_vocab(const int32_t *ids, int64_t n, int64_t V, int i, const char *what, struct smelt_error *err) {
    for (int64_t t = 0; t < n; t++)
        if (ids[t] < 0 || ids[t] >= V)
            return error_set_field(err, SMELT_EINVAL, "data", "data[%d].%s[%lld]: token id %d outside the vocabulary "
                                   "(0..%lld)", i, what, (long long)t, ids[t], (long long)V - 1);
    return SMELT_OK;
}

/* Checks keys: exactly the inputs the loss takes. */
static int input_keys(const json_t *inputs, enum loss_kind loss, int i, struct smelt_error *err) {
    static const char *const ce[] = {"target_tokens", "weights", NULL};
    static const char *const rl[] = {"target_tokens", "logprobs", "advantages", NULL};
    const char *bad = json_unknown_key(inputs, loss == LOSS_CE ? ce : rl);
    if (!bad) return SMELT_OK;
    char field[SMELT_ERROR_FIELD_BYTES];
    snprintf(field, sizeof field, "data[%d].loss_fn_inputs.%s", i, bad);
    return error_set_field(err, SMELT_EINVAL, field, "%s: not an input of loss_fn %s", field, LOSS_NAMES[loss]);
}

static int datum_parse(const struct msg *m, const json_t *dj, int i, struct fwd *f, const struct model *base,
                       struct smelt_error *err) {
    struct datum *d = &f->d[i];
    char where[48];
    snprintf(where, sizeof where, "data[%d]", i);
    int64_t n;
    int rc = json_field_int(dj, "n_tokens", true, 0, 1, base->config.max_seq_len, &n, where, err);
    if (rc) return error_in_field(err, rc, where);
    const json_t *inputs = json_object_get(dj, "inputs");
    if (!json_is_object(inputs))
        return error_set_field(err, SMELT_EINVAL, where, "%s.loss_fn_inputs: required object", where);
    TRY(input_keys(inputs, f->loss, i, err));
    d->n = n, d->off = f->T;
    const void *p;
    TRY(input_view(m, inputs, i, "target_tokens", n, &p, err));
    d->target = p;
    TRY(ids_in_vocab(d->target, n, base->config.vocab_size, i, "loss_fn_inputs.target_tokens", err));
    if (f->loss == LOSS_CE) {
        TRY(input_view(m, inputs, i, "weights", n, &p, err));
        d->weights = p;
        return floats_finite(d->weights, n, i, "weights", err);
    }
    TRY(input_view(m, inputs, i, "logprobs", n, &p, err));
    d->q = p;
    TRY(floats_finite(d->q, n, i, "logprobs", err));
    TRY(input_view(m, inputs, i, "advantages", n, &p, err));
    d->adv = p;
    return floats_finite(d->adv, n, i, "advantages", err);
}

static int data_parse(const struct msg *m, const struct model *base, struct fwd *f, struct smelt_error *err) {
    const json_t *data = json_object_get(m->header, "data");
    if (!json_is_array(data) || json_array_size(data) == 0)
        return error_set_field(err, SMELT_EINVAL, "data", "data: a non-empty array of data is required");
    f->n_data = (int)json_array_size(data);
    if (!(f->d = calloc((size_t)f->n_data, sizeof *f->d))) return error_set(err, SMELT_ENOMEM, "data: out of memory");
    for (int i = 0; i < f->n_data; i++) {
        TRY(datum_parse(m, json_array_get(data, i), i, f, base, err));
        f->T += f->d[i].n;
    }
    int64_t have;
    f->tokens = frame(m, 0, &have);
    if (have != f->T)
        return error_set_field(err, SMELT_EINVAL, "data", "data: the model inputs hold %lld tokens, frame 2 has %lld",
                               (long long)f->T, (long long)have);
    for (int i = 0; i < f->n_data; i++)
        TRY(ids_in_vocab(f->tokens + f->d[i].off, f->d[i].n, base->config.vocab_size, i, "model_input.tokens", err));
    return SMELT_OK;
}

/* ---- the loss of one datum ---- */

static int ppo_token(const struct fwd *f, const struct datum *d, const float *lp, int64_t t, double *coef, double *l,
                     struct smelt_error *err) {
    struct rl_policy_config c;
    rl_policy_config_default(RL_LOSS_GRPO, &c);
    c.agg = RL_AGG_SUM, c.eps_low = 1.0 - f->clip_low, c.eps_high = f->clip_high - 1.0;
    int64_t start[2] = {0, 1};
    float mask = 1.0f;
    double adv = d->adv[t];
    struct rl_seqs s = {.n_seq = 1, .start = start, .logp = lp + t, .old_logp = d->q + t, .mask = &mask, .adv = &adv};
    struct rl_policy_stats st;
    TRY(rl_policy_loss(&c, &s, (struct rl_norm){0, 0}, coef, &st, err));
    *l = st.loss;
    return SMELT_OK;
}

/* coef and elementwise loss of d's tokens (lp: its logprobs); returns the sum in *loss. */
static int datum_loss(const struct fwd *f, const struct datum *d, const float *lp, double *coef, double *el,
                      double *loss, struct smelt_error *err) {
    if (f->loss == LOSS_PPO) {
        *loss = 0;
        for (int64_t t = 0; t < d->n; t++) {
            TRY(ppo_token(f, d, lp, t, coef + t, el + t, err));
            *loss += el[t];
        }
        return SMELT_OK;
    }
    static const enum rl_token_loss kinds[] = {[LOSS_CE] = RL_TOKEN_CROSS_ENTROPY,
                                               [LOSS_IS] = RL_TOKEN_IMPORTANCE_SAMPLING,
                                               [LOSS_CISPO] = RL_TOKEN_CISPO, [LOSS_DRO] = RL_TOKEN_DRO};
    struct rl_token_inputs in = {.n = d->n, .logp = lp, .weights = d->weights, .sampling_logp = d->q, .adv = d->adv,
                                 .clip_low = f->clip_low, .clip_high = f->clip_high, .beta = f->beta};
    return rl_token_loss(kinds[f->loss], &in, coef, el, loss, err);
}

/* ---- the pass ---- */

struct pass {
    struct model_acts *acts;
    struct tensor lp_dev, dlp_dev;
    int32_t *cu, *targets;
    float *lp, *dlp;
    double *coef, *el;
};

static void pass_free(struct pass *p) {
    model_acts_free(p->acts);
    tensor_free(&p->lp_dev);
    tensor_free(&p->dlp_dev);
    free(p->cu), free(p->targets), free(p->lp), free(p->dlp), free(p->coef), free(p->el);
}

static int pass_alloc(const struct model *base, const struct fwd *f, struct pass *p, struct smelt_error *err) {
    size_t T = (size_t)f->T;
    p->cu = malloc(((size_t)f->n_data + 1) * sizeof *p->cu);
    p->targets = malloc(T * sizeof *p->targets);
    p->lp = malloc(T * sizeof *p->lp), p->dlp = malloc(T * sizeof *p->dlp);
    p->coef = malloc(T * sizeof *p->coef), p->el = malloc(T * sizeof *p->el);
    if (!p->cu || !p->targets || !p->lp || !p->dlp || !p->coef || !p->el)
        return error_set(err, SMELT_ENOMEM, "forward: out of memory for %lld tokens", (long long)f->T);
    TRY(tensor_alloc(&p->lp_dev, base->backend, DTYPE_F32, 1, &f->T, err));
    TRY(tensor_alloc(&p->dlp_dev, base->backend, DTYPE_F32, 1, &f->T, err));
    return model_acts_alloc(base, f->T, false, &p->acts, err);
}

/* Forward, losses, and (backward) the adapter's gradients; base has the adapter on. */
static int pass_run(struct model *base, const struct fwd *f, bool backward, struct pass *p, double *total,
                    struct smelt_error *err) {
    p->cu[0] = 0;
    for (int i = 0; i < f->n_data; i++) {
        p->cu[i + 1] = (int32_t)(f->d[i].off + f->d[i].n);
        memcpy(p->targets + f->d[i].off, f->d[i].target, (size_t)f->d[i].n * sizeof(int32_t));
    }
    struct model_batch b = {.n_tokens = f->T, .n_seqs = f->n_data, .ids = f->tokens, .cu_seqlens = p->cu,
                            .targets = p->targets};
    TRY(model_forward(base, p->acts, &b, &p->lp_dev, NULL, NULL, err));
    struct tensor host = tensor_f32(p->lp, 1, &f->T);
    TRY(tensor_copy(&host, &p->lp_dev, err));
    *total = 0;
    for (int i = 0; i < f->n_data; i++) {
        const struct datum *d = &f->d[i];
        double loss;
        int rc = datum_loss(f, d, p->lp + d->off, p->coef + d->off, p->el + d->off, &loss, err);
        if (rc) return error_wrap(err, rc, "data[%d]", i);
        *total += loss;
    }
    if (!backward) return SMELT_OK;
    for (int64_t t = 0; t < f->T; t++) p->dlp[t] = (float)p->coef[t];
    struct tensor dhost = tensor_f32(p->dlp, 1, &f->T);
    TRY(tensor_copy(&p->dlp_dev, &dhost, err));
    return model_backward(base, p->acts, &p->dlp_dev, NULL, err);
}

/* {metrics: {"loss:sum"}, outputs: [[["logprobs", n], ["elementwise_loss", n]] per datum]}
 * and frame 2: each datum's logprobs then its elementwise loss. */
static int reply_build(const struct fwd *f, const struct pass *p, double total, struct tinker_reply *out,
                       struct smelt_error *err) {
    float *vals = malloc(2 * (size_t)f->T * sizeof *vals);
    json_t *outputs = json_array();
    if (!vals || !outputs) {
        free(vals);
        json_decref(outputs);
        return error_set(err, SMELT_ENOMEM, "forward: out of memory");
    }
    int64_t k = 0;
    for (int i = 0; i < f->n_data; i++) {
        const struct datum *d = &f->d[i];
        memcpy(vals + k, p->lp + d->off, (size_t)d->n * sizeof *vals);
        for (int64_t t = 0; t < d->n; t++) vals[k + d->n + t] = (float)p->el[d->off + t];
        k += 2 * d->n;
        json_array_append_new(outputs, json_pack("[[s,I],[s,I]]", "logprobs", (json_int_t)d->n, "elementwise_loss",
                                                 (json_int_t)d->n));
    }
    out->result = json_pack("{s:{s:f}, s:o}", "metrics", "loss:sum", total, "outputs", outputs);
    if (!out->result) {
        free(vals);
        return error_set(err, SMELT_ENOMEM, "forward: out of memory");
    }
    return tinker_reply_add(out, vals, 2 * (size_t)f->T * sizeof *vals, err);
}

int tinker_op_forward(struct tinker_worker *w, const struct msg *m, bool backward, struct tinker_reply *out,
                      struct smelt_error *err) {
    int64_t t0 = mono_ms();
    struct tinker_model *tm;
    TRY(tinker_model_of(w, m->header, &tm, err));
    struct fwd f = {0};
    struct pass p = {0};
    double total = 0;
    int rc = loss_config(m->header, &f, err);
    if (!rc) rc = data_parse(m, w->base, &f, err);
    if (!rc) rc = pass_alloc(w->base, &f, &p, err);
    if (!rc) rc = lora_attach(tm->lora, err);
    if (!rc) {
        rc = pass_run(w->base, &f, backward, &p, &total, err);
        lora_detach(tm->lora);
    }
    if (!rc) rc = reply_build(&f, &p, total, out, err);
    if (!rc && backward)
        tinker_metrics_write(w, "forward_backward", tm, json_object_get(out->result, "metrics"),
                             (double)(mono_ms() - t0));
    pass_free(&p);
    free(f.d);
    return rc;
}
