/* score_model and label_model graders on a batch: each sample's messages rendered from
 * the grader's templates, the whole batch handed to the owner's generator (rewards.h:
 * struct reward_model_scorer's generate; rewards/ loads no model), each reply read:
 *   score_model: the reply (trimmed) is one number, or OpenAI's structured output
 *     {"result": number, ...}; it must lie in range (a model answering outside the scale
 *     it was given is a bad reply, not a score to clamp silently);
 *   label_model: the reply (trimmed, one trailing "." dropped) is one of labels, or
 *     {"result": label}; 1 when the label is in passing_labels, else 0.
 * A reply that is neither fails the sample, quoting its start. A template reading the
 * completion's JSON that the completion lacks scores 0 without asking the model (the
 * stage's rule for the completion's side). Fields: model_grader_spec.c. */
#include "rewards/graders_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rewards/rewards_internal.h"

int grader_lm_open(struct reward_grader *g, const struct reward_model_scorer *scorer, struct smelt_error *err) {
    struct grader_lm *lm = g->lm;
    if (!scorer->open_generator || !scorer->generate) {
        error_set(err, SMELT_EINVAL, "%s.model: this scorer cannot run a grader model (%s graders generate)", g->path,
                  lm->label ? "label_model" : "score_model");
        snprintf(err->field, sizeof err->field, "%s.model", g->path);
        return SMELT_EINVAL;
    }
    struct reward_model_ref ref = {.model = lm->model, .dir = lm->model_dir ? lm->model_dir : lm->model,
                                   .field = g->path, .batch_size = 1};
    lm->scorer = *scorer;
    int rc = scorer->open_generator(scorer->ctx, &ref, &lm->handle, err);
    if (rc && !err->field[0]) snprintf(err->field, sizeof err->field, "%s.model", g->path);
    return rc;
}

/* ---- rendering ---- */

struct batch {
    struct reward_prompt *prompts;     /* [n] */
    struct reward_message *messages;   /* [n * n_msgs] */
    struct reward_buf *texts;          /* [n * n_msgs] */
    struct reward_generation *gen;     /* [n] */
};

static void batch_free(struct batch *b, int n, int n_msgs) {
    for (int i = 0; b->texts && i < n * n_msgs; i++) reward_buf_free(&b->texts[i]);
    for (int i = 0; b->gen && i < n; i++) free(b->gen[i].text);
    free(b->prompts);
    free(b->messages);
    free(b->texts);
    free(b->gen);
}

/* Sample s's messages into the batch's slot i; its result when it cannot be asked. */
static int render(struct grader_lm *lm, const struct reward_sample *s, int i, struct batch *b) {
    struct grader_context c;
    grader_context_init(&c, s->answer, s->metadata_json, s->completion);
    struct grader_lm_result *r = &lm->results[i];
    int rc = SMELT_OK;
    for (int k = 0; k < lm->n_msgs && !rc; k++) {
        struct reward_buf *t = &b->texts[i * lm->n_msgs + k];
        rc = grader_template_render(&lm->msgs[k].content, &c, t, r->why, sizeof r->why);
        b->messages[i * lm->n_msgs + k] = (struct reward_message){.role = lm->msgs[k].role, .content = t->p};
    }
    grader_context_reset(&c);
    if (rc == GRADER_ZERO) r->score = 0;
    else r->status = rc;
    if (rc) return rc < 0 ? rc : SMELT_OK;
    b->prompts[i] = (struct reward_prompt){.messages = &b->messages[i * lm->n_msgs], .n = lm->n_msgs};
    return SMELT_OK;
}

/* ---- reading a reply ---- */

/* The reply's "result" when it is a JSON object holding one (OpenAI's structured output). */
static json_t *structured(const char *reply) {
    json_t *v = json_loads(reply, JSON_DECODE_ANY, NULL), *r = json_object_get(v, "result");
    if (r) json_incref(r);
    json_decref(v);
    return r;
}

static int bad_reply(struct grader_lm_result *r, const char *reply, const char *expected) {
    size_t n = strlen(reply);
    snprintf(r->why, sizeof r->why, "the grader model's reply \"%.60s%s\" is not %.150s", reply, n > 60 ? "..." : "",
             expected);
    return r->status = GRADER_FAILED;
}

static void read_score(const struct grader_lm *lm, const char *reply, struct grader_lm_result *r) {
    size_t s = 0, e = strlen(reply);
    double v;
    json_t *j = structured(reply);
    reward_trim(reply, &s, &e);
    bool ok = j ? json_is_number(j) : reward_number_whole(reply + s, e - s, &v);
    if (j && ok) v = json_number_value(j);
    json_decref(j);
    if (!ok || !isfinite(v)) {
        bad_reply(r, reply, "a number (or {\"result\": number})");
        return;
    }
    if (v < lm->range[0] || v > lm->range[1]) {
        snprintf(r->why, sizeof r->why, "the grader model's score %g is outside range [%g, %g]", v, lm->range[0],
                 lm->range[1]);
        r->status = GRADER_FAILED;
        return;
    }
    r->score = v;
}

static void read_label(const struct grader_lm *lm, const char *reply, struct grader_lm_result *r) {
    json_t *j = structured(reply);
    const char *text = j && json_is_string(j) ? json_string_value(j) : reply;
    size_t s = 0, e = strlen(text);
    reward_normalize_span(text, &s, &e, REWARD_NORMALIZE_STRIP_PERIOD);
    int found = -1;
    for (int k = 0; k < lm->n_labels && found < 0; k++)
        if (strlen(lm->labels[k]) == e - s && memcmp(lm->labels[k], text + s, e - s) == 0) found = k;
    json_decref(j);
    if (found < 0) {
        char expected[200];
        snprintf(expected, sizeof expected, "one of the labels (%s%s)", lm->labels[0], lm->n_labels > 1 ? ", ..." : "");
        bad_reply(r, reply, expected);
        return;
    }
    r->score = 0;
    for (int p = 0; p < lm->n_passing; p++)
        if (strcmp(lm->passing[p], lm->labels[found]) == 0) r->score = 1;
}

/* ---- the batch ---- */

static int ask(struct reward_grader *g, struct batch *b, int n, struct smelt_error *err) {
    struct grader_lm *lm = g->lm;
    if (!lm->handle) {
        for (int i = 0; i < n; i++)
            if (b->prompts[i].n) {
                lm->results[i].status = GRADER_FAILED;
                snprintf(lm->results[i].why, sizeof lm->results[i].why, "no grader model is loaded here: %s graders "
                         "run in the trainer (smelt-trainer), which loads %.120s", lm->label ? "label_model" :
                         "score_model", lm->model);
            }
        return SMELT_OK;
    }
    TRY(error_wrap(err, lm->scorer.generate(lm->handle, b->prompts, n, &lm->params, b->gen, err), "%s (%s)", g->path,
                   lm->label ? "label_model" : "score_model"));
    for (int i = 0; i < n; i++) {
        struct grader_lm_result *r = &lm->results[i];
        if (!b->prompts[i].n) continue;
        if (b->gen[i].failed || !b->gen[i].text) {
            snprintf(r->why, sizeof r->why, "%s", b->gen[i].failed ? b->gen[i].error : "the grader model gave no reply");
            r->status = GRADER_FAILED;
        } else if (lm->label) {
            read_label(lm, b->gen[i].text, r);
        } else {
            read_score(lm, b->gen[i].text, r);
        }
    }
    return SMELT_OK;
}

static int run_one(struct reward_grader *g, const struct reward_sample *samples, int n, struct smelt_error *err) {
    struct grader_lm *lm = g->lm;
    size_t cells = (size_t)(n > 0 ? n : 1) * (size_t)lm->n_msgs;
    free(lm->results);
    lm->n = 0;
    lm->results = calloc(n > 0 ? (size_t)n : 1, sizeof *lm->results);
    struct batch b = {.prompts = calloc(n > 0 ? (size_t)n : 1, sizeof *b.prompts),
                      .messages = calloc(cells, sizeof *b.messages), .texts = calloc(cells, sizeof *b.texts),
                      .gen = calloc(n > 0 ? (size_t)n : 1, sizeof *b.gen)};
    int rc = lm->results && b.prompts && b.messages && b.texts && b.gen ? SMELT_OK : SMELT_ENOMEM;
    if (!rc) lm->n = n;
    for (int i = 0; !rc && i < n; i++) rc = render(lm, &samples[i], i, &b);
    if (rc == SMELT_ENOMEM) error_set(err, rc, "%s: out of memory", g->path);
    if (!rc && n > 0) rc = ask(g, &b, n, err);
    batch_free(&b, n, lm->n_msgs);
    return rc;
}

static bool is_lm(const struct reward_grader *g) {
    return g->type == GRADER_SCORE_MODEL || g->type == GRADER_LABEL_MODEL;
}

int grader_lm_prepare(struct reward_grader *g, const struct reward_sample *samples, int n, struct smelt_error *err) {
    if (is_lm(g)) TRY(run_one(g, samples, n, err));
    for (int k = 0; k < g->n_sub; k++)
        if (is_lm(&g->sub[k])) TRY(run_one(&g->sub[k], samples, n, err));
    return SMELT_OK;
}

int grader_lm_result(const struct grader_lm *lm, int i, double *score, char *why, size_t why_n) {
    SMELT_ASSERT(i >= 0 && i < lm->n);
    const struct grader_lm_result *r = &lm->results[i];
    if (r->status) {
        snprintf(why, why_n, "%s", r->why);
        return GRADER_FAILED;
    }
    *score = r->score;
    return SMELT_OK;
}

int grader_lm_check_row(const struct reward_grader *g, struct grader_context *c, struct smelt_error *err) {
    for (int k = 0; k < g->lm->n_msgs; k++) {
        const char *field = NULL;
        char why[REWARD_ERROR_BYTES];
        if (grader_template_check_row(&g->lm->msgs[k].content, c, &field, why, sizeof why))
            return error_set_field(err, SMELT_EINVAL, field, "%s.input[%d].content: %s", g->path, k, why);
    }
    return SMELT_OK;
}
