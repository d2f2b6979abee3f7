/* gen.request -> an engine request. Every field of common/msg.h is checked here, before
 * the engine sees the request, so that a refusal names the field in the protocol's words
 * (stop, stop_token_ids), not the engine's. */
#include "rollout/worker_internal.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/json.h"

#define WHERE "gen.request"

static const char *const known_fields[] = {"v", "id", "prompt", "n", "max_new_tokens", "temperature",
                                           "top_k", "top_p", "min_p", "seed", "stop", "stop_token_ids",
                                           "ignore_eos", "more", NULL};

/* Names the field at fault; returns rc so that callers write `return refuse(...)`. */
static int refuse(struct worker_field *field, const char *name, int rc) {
    snprintf(field->name, sizeof field->name, "%s", name);
    field->named = true;
    return rc;
}

const char *worker_header_id(const struct msg *m) {
    json_t *id = m->header ? json_object_get(m->header, "id") : NULL;
    if (!json_is_string(id)) return NULL;
    size_t len = json_string_length(id);
    const char *s = json_string_value(id);
    return len >= 1 && len <= WORKER_ID_BYTES && strlen(s) == len ? s : NULL;
}

static int check_fields(const json_t *h, struct worker_field *field, struct smelt_error *err) {
    const char *key = json_unknown_key(h, known_fields);
    return key ? refuse(field, key, error_set(err, SMELT_EINVAL, WHERE ": unknown field '%.64s'", key)) : SMELT_OK;
}

static int read_id(const json_t *h, char *out, struct worker_field *field, struct smelt_error *err) {
    const char *id;
    if (json_field_string(h, "id", true, NULL, &id, WHERE, err)) return refuse(field, "id", SMELT_EINVAL);
    size_t len = json_string_length(json_object_get(h, "id"));
    if (len < 1 || len > WORKER_ID_BYTES || strlen(id) != len)
        return refuse(field, "id", error_set(err, SMELT_EINVAL, WHERE ": field 'id' must be 1..%d bytes without NUL",
                                             WORKER_ID_BYTES));
    memcpy(out, id, len + 1);
    return SMELT_OK;
}

/* n, max_new_tokens, the sampling fields and the seed. */
static int read_numbers(const json_t *h, struct rollout_request *r, struct worker_field *field, struct smelt_error *err) {
    int64_t n, max_new, top_k, seed;
    double temperature, top_p, min_p;
    if (json_field_int(h, "n", false, 1, 1, 256, &n, WHERE, err)) return refuse(field, "n", SMELT_EINVAL);
    if (json_field_int(h, "max_new_tokens", false, 16, 1, INT32_MAX, &max_new, WHERE, err))
        return refuse(field, "max_new_tokens", SMELT_EINVAL);
    if (json_field_double(h, "temperature", false, 1, 0, FLT_MAX, &temperature, WHERE, err))
        return refuse(field, "temperature", SMELT_EINVAL);
    if (json_field_int(h, "top_k", false, 0, 0, INT64_MAX, &top_k, WHERE, err)) return refuse(field, "top_k", SMELT_EINVAL);
    /* Checked as the sampler's floats: a tiny top_p would round to 0, min_p near 1 to 1. */
    if (json_field_double(h, "top_p", false, 1, -HUGE_VAL, HUGE_VAL, &top_p, WHERE, err))
        return refuse(field, "top_p", SMELT_EINVAL);
    if (!((float)top_p > 0 && top_p <= 1))
        return refuse(field, "top_p", error_set(err, SMELT_EINVAL, WHERE ": field 'top_p' is %g, outside (0, 1]", top_p));
    if (json_field_double(h, "min_p", false, 0, -HUGE_VAL, HUGE_VAL, &min_p, WHERE, err))
        return refuse(field, "min_p", SMELT_EINVAL);
    if (!(min_p >= 0 && (float)min_p < 1))
        return refuse(field, "min_p", error_set(err, SMELT_EINVAL, WHERE ": field 'min_p' is %g, outside [0, 1)", min_p));
    if (json_field_int(h, "seed", false, 0, 0, INT64_MAX, &seed, WHERE, err)) return refuse(field, "seed", SMELT_EINVAL);
    r->n = (int)n;
    r->max_new_tokens = max_new;
    r->sampling = (struct sample_params){.temperature = (float)temperature, .top_k = top_k,
                                         .top_p = (float)top_p, .min_p = (float)min_p};
    r->seed = (uint64_t)seed;
    return SMELT_OK;
}

/* The array of key, or NULL when absent; refuses a non-array or one that is too long. */
static int read_array(const json_t *h, const char *key, size_t most, json_t **out, struct worker_field *field,
                      struct smelt_error *err) {
    json_t *a = json_object_get(h, key);
    *out = NULL;
    if (!a || json_is_null(a)) return SMELT_OK;
    if (!json_is_array(a))
        return refuse(field, key, error_set(err, SMELT_EINVAL, WHERE ": field '%s' must be an array", key));
    if (json_array_size(a) > most)
        return refuse(field, key, error_set(err, SMELT_EINVAL, WHERE ": field '%s' has %zu entries, at most %zu",
                                            key, json_array_size(a), most));
    *out = a;
    return SMELT_OK;
}

static int read_stop_strings(const json_t *h, const struct worker_limits *lim, struct rollout_request *r,
                             struct worker_field *field, struct smelt_error *err) {
    json_t *a;
    if (read_array(h, "stop", ROLLOUT_MAX_STOP, &a, field, err)) return SMELT_EINVAL;
    if (!a || json_array_size(a) == 0) return SMELT_OK;
    if (!lim->tok)
        return refuse(field, "stop", error_set(err, SMELT_EINVAL, WHERE ": field 'stop' needs a tokenizer; this worker has none"));
    for (size_t i = 0; i < json_array_size(a); i++) {
        json_t *s = json_array_get(a, i);
        size_t len = json_is_string(s) ? json_string_length(s) : 0;
        if (!json_is_string(s) || len < 1 || len > WORKER_STOP_STRING_BYTES || strlen(json_string_value(s)) != len)
            return refuse(field, "stop", error_set(err, SMELT_EINVAL, WHERE ": field 'stop' entry %zu must be a string "
                                                   "of 1..%d bytes without NUL", i, WORKER_STOP_STRING_BYTES));
        r->stop_strings[r->n_stop_strings++] = json_string_value(s);
    }
    return SMELT_OK;
}

/* stop_token_ids, then the eos ids unless ignore_eos (each id once). */
static int read_stop_ids(const json_t *h, const struct worker_limits *lim, struct rollout_request *r, struct worker_field *field,
                         struct smelt_error *err) {
    int64_t V = lim->model->config.vocab_size;
    json_t *a;
    bool ignore_eos;
    if (json_field_bool(h, "ignore_eos", false, false, &ignore_eos, WHERE, err))
        return refuse(field, "ignore_eos", SMELT_EINVAL);
    if (read_array(h, "stop_token_ids", ROLLOUT_MAX_STOP, &a, field, err)) return SMELT_EINVAL;
    for (size_t i = 0; a && i < json_array_size(a); i++) {
        json_t *x = json_array_get(a, i);
        if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) >= V)
            return refuse(field, "stop_token_ids",
                          error_set(err, SMELT_EINVAL, WHERE ": field 'stop_token_ids' entry %zu must be a token id in "
                                    "[0, %lld)", i, (long long)V));
        r->stop_ids[r->n_stop_ids++] = (int32_t)json_integer_value(x);
    }
    for (int e = 0; !ignore_eos && e < lim->n_eos; e++) {
        bool have = false;
        for (int i = 0; i < r->n_stop_ids && !have; i++) have = r->stop_ids[i] == lim->eos[e];
        if (have) continue;
        if (r->n_stop_ids == ROLLOUT_MAX_STOP)
            return refuse(field, "stop_token_ids",
                          error_set(err, SMELT_EINVAL, WHERE ": field 'stop_token_ids' and the model's %d eos ids "
                                    "make more than %d stop ids (set ignore_eos or give fewer)", lim->n_eos,
                                    ROLLOUT_MAX_STOP));
        r->stop_ids[r->n_stop_ids++] = lim->eos[e];
    }
    return SMELT_OK;
}

/* The prompt: text in "prompt" or int32 ids in frame 2, exactly one of them. */
static int read_prompt(const struct msg *m, const struct worker_limits *lim, struct worker_request *out,
                       struct worker_field *field, struct smelt_error *err) {
    json_t *text = json_object_get(m->header, "prompt");
    if (text && json_is_null(text)) text = NULL;
    if (m->n_arrays > 1)
        return refuse(field, "prompt", error_set(err, SMELT_EINVAL, WHERE ": %d array frames; at most one "
                                                 "(the prompt's int32 ids)", m->n_arrays));
    if (!text == (m->n_arrays == 0))
        return refuse(field, "prompt", error_set(err, SMELT_EINVAL, WHERE ": give exactly one of field 'prompt' "
                                                 "(text) and frame 2 (int32 ids); got %s",
                                                 text ? "both" : "neither"));
    if (text) {
        if (!json_is_string(text))
            return refuse(field, "prompt", error_set(err, SMELT_EINVAL, WHERE ": field 'prompt' must be a string"));
        if (!lim->tok)
            return refuse(field, "prompt", error_set(err, SMELT_EINVAL, WHERE ": field 'prompt' is text but this worker "
                                                     "has no tokenizer; send int32 ids in frame 2"));
        size_t n = 0;
        /* No special tokens from text: a prompt cannot smuggle in control tokens. */
        int rc = json_string_length(text) > 0
                     ? tokenizer_encode(lim->tok, json_string_value(text), json_string_length(text), false,
                                        &out->prompt_owned, &n, err)
                     : SMELT_OK;
        if (rc) return refuse(field, "prompt", error_wrap(err, rc, WHERE ": field 'prompt'"));
        out->r.prompt = out->prompt_owned;
        out->r.n_prompt = (int64_t)n;
    } else {
        const struct msg_array *ids = &m->arrays[0];
        if (ids->bytes % sizeof(int32_t) != 0)
            return refuse(field, "prompt", error_set(err, SMELT_EINVAL, WHERE ": frame 2 holds %zu bytes, not whole "
                                                     "int32 ids", ids->bytes));
        out->r.prompt = ids->data;
        out->r.n_prompt = (int64_t)(ids->bytes / sizeof(int32_t));
    }
    const struct model_config *c = &lim->model->config;
    if (out->r.n_prompt < 1) return refuse(field, "prompt", error_set(err, SMELT_EINVAL, WHERE ": the prompt is empty"));
    if (out->r.n_prompt >= c->max_seq_len)
        return refuse(field, "prompt", error_set(err, SMELT_EINVAL, WHERE ": the prompt's %lld tokens leave no room in "
                                                 "the model's context of %lld", (long long)out->r.n_prompt,
                                                 (long long)c->max_seq_len));
    for (int64_t i = 0; i < out->r.n_prompt; i++)
        if (out->r.prompt[i] < 0 || out->r.prompt[i] >= c->vocab_size)
            return refuse(field, "prompt", error_set(err, SMELT_EINVAL, WHERE ": prompt token %lld is %d, outside the "
                                                     "vocabulary [0, %lld)", (long long)i, out->r.prompt[i],
                                                     (long long)c->vocab_size));
    return SMELT_OK;
}

/* One sample alone must fit the KV pool, or the engine could never finish it. */
static int check_fits(const struct worker_limits *lim, const struct rollout_request *r, struct worker_field *field,
                      struct smelt_error *err) {
    int64_t ctx = lim->model->config.max_seq_len;
    int64_t need = r->max_new_tokens < ctx - r->n_prompt ? r->n_prompt + r->max_new_tokens : ctx;
    int64_t pool = lim->pool_tokens; /* whole blocks */
    int64_t need_blocks = (need + ROLLOUT_KV_BLOCK_TOKENS - 1) / ROLLOUT_KV_BLOCK_TOKENS;
    int64_t prompt_blocks = (r->n_prompt + ROLLOUT_KV_BLOCK_TOKENS - 1) / ROLLOUT_KV_BLOCK_TOKENS;
    if (prompt_blocks * ROLLOUT_KV_BLOCK_TOKENS > pool)
        return refuse(field, "prompt", error_set(err, SMELT_EINVAL, WHERE ": the prompt's %lld tokens do not fit the "
                                                 "worker's KV cache of %lld tokens", (long long)r->n_prompt,
                                                 (long long)pool));
    if (need_blocks * ROLLOUT_KV_BLOCK_TOKENS > pool)
        return refuse(field, "max_new_tokens", error_set(err, SMELT_EINVAL, WHERE ": prompt plus max_new_tokens "
                                                         "(%lld tokens) do not fit the worker's KV cache of %lld "
                                                         "tokens", (long long)need, (long long)pool));
    return SMELT_OK;
}

int worker_request_parse(const struct msg *m, const struct worker_limits *lim, struct worker_request *out,
                         struct worker_field *field, struct smelt_error *err) {
    memset(out, 0, sizeof *out);
    *field = (struct worker_field){0};
    int rc = msg_check_version(m, err);
    if (rc) {
        refuse(field, "v", rc);
        error_wrap(err, rc, WHERE);
    }
    if (!rc) rc = check_fields(m->header, field, err);
    if (!rc) rc = read_id(m->header, out->id, field, err);
    if (!rc) rc = read_numbers(m->header, &out->r, field, err);
    if (!rc) rc = read_stop_strings(m->header, lim, &out->r, field, err);
    if (!rc) rc = read_stop_ids(m->header, lim, &out->r, field, err);
    if (!rc && json_field_bool(m->header, "more", false, false, &out->more, WHERE, err))
        rc = refuse(field, "more", SMELT_EINVAL);
    if (!rc) rc = read_prompt(m, lim, out, field, err);
    if (!rc) rc = check_fits(lim, &out->r, field, err);
    if (rc) worker_request_free(out);
    return rc;
}

void worker_request_free(struct worker_request *r) {
    free(r->prompt_owned);
    r->prompt_owned = NULL;
}
