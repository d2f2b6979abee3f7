/* The samples generated ahead under max_staleness 1 (the next iteration's, made by the
 * policy version before the update that a checkpoint follows), saved beside the
 * checkpoint so that a resumed job trains on the very samples an uninterrupted one
 * would: the prompt cursor has already moved past their prompts, and the weights that
 * made them are gone.
 *
 * One safetensors file: ids (i32 [tokens]) and logprobs (f32 [tokens]) of every sample
 * one after the other, and per sample (i32 [samples]) its token count, prompt row,
 * policy version and finish reason (an index into FINISH). The metadata names the
 * format; a file of another format, or with counts that do not add up, is refused. */
#include "trainer/trainer_internal.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "model/safetensors.h"
#include "rollout/rollout.h"

#define PENDING_FORMAT "smelt-rl-pending-1"

static const char *const FINISH[] = {ROLLOUT_FINISH_STOP, ROLLOUT_FINISH_LENGTH, ROLLOUT_FINISH_ABORT};
#define N_FINISH ((int)(sizeof FINISH / sizeof *FINISH))

static int finish_index(const char *reason) {
    for (int i = 0; i < N_FINISH; i++)
        if (reason && strcmp(reason, FINISH[i]) == 0) return i;
    return -1;
}

/* Per-sample columns and the flat token arrays, host memory the caller frees. */
struct pending_cols {
    int32_t *n_tokens, *rows, *versions, *finish, *ids;
    float *logprobs;
    int64_t tokens;
};

static void cols_free(struct pending_cols *c) {
    free(c->n_tokens);
    free(c->rows);
    free(c->versions);
    free(c->finish);
    free(c->ids);
    free(c->logprobs);
}

static int cols_alloc(struct pending_cols *c, int64_t n, int64_t tokens, struct smelt_error *err) {
    size_t ns = (size_t)(n ? n : 1), nt = (size_t)(tokens ? tokens : 1);
    c->tokens = tokens;
    c->n_tokens = malloc(ns * sizeof(int32_t));
    c->rows = malloc(ns * sizeof(int32_t));
    c->versions = malloc(ns * sizeof(int32_t));
    c->finish = malloc(ns * sizeof(int32_t));
    c->ids = malloc(nt * sizeof(int32_t));
    c->logprobs = malloc(nt * sizeof(float));
    bool ok = c->n_tokens && c->rows && c->versions && c->finish && c->ids && c->logprobs;
    return ok ? SMELT_OK : error_set(err, SMELT_ENOMEM, "rl: out of memory for %lld pending samples", (long long)n);
}

static int fill_cols(const struct rl_sample *s, int n, struct pending_cols *c, struct smelt_error *err) {
    int64_t off = 0;
    for (int i = 0; i < n; i++) {
        int f = finish_index(s[i].finish_reason);
        if (f < 0 || s[i].row > INT32_MAX || s[i].version > INT32_MAX || s[i].n > INT32_MAX)
            return error_set(err, SMELT_EINVAL, "rl: pending sample %d cannot be saved (row %lld, version %lld)", i,
                             (long long)s[i].row, (long long)s[i].version);
        c->n_tokens[i] = (int32_t)s[i].n;
        c->rows[i] = (int32_t)s[i].row;
        c->versions[i] = (int32_t)s[i].version;
        c->finish[i] = f;
        if (s[i].n) {
            memcpy(c->ids + off, s[i].ids, (size_t)s[i].n * sizeof *c->ids);
            memcpy(c->logprobs + off, s[i].rollout_logp, (size_t)s[i].n * sizeof *c->logprobs);
        }
        off += s[i].n;
    }
    return SMELT_OK;
}

int rl_pending_save(const char *path, const struct rl_sample *s, int n, struct smelt_error *err) {
    int64_t tokens = 0;
    for (int i = 0; i < n; i++) tokens += s[i].n;
    struct pending_cols c = {0};
    int rc = cols_alloc(&c, n, tokens, err);
    if (!rc) rc = fill_cols(s, n, &c, err);
    if (!rc) {
        int64_t ns[1] = {n}, nt[1] = {tokens};
        struct safetensors_tensor_desc t[] = {
            {"ids", tensor_i32(c.ids, 1, nt), DTYPE_I32},
            {"logprobs", tensor_f32(c.logprobs, 1, nt), DTYPE_F32},
            {"n_tokens", tensor_i32(c.n_tokens, 1, ns), DTYPE_I32},
            {"rows", tensor_i32(c.rows, 1, ns), DTYPE_I32},
            {"versions", tensor_i32(c.versions, 1, ns), DTYPE_I32},
            {"finish", tensor_i32(c.finish, 1, ns), DTYPE_I32},
        };
        struct safetensors_kv meta[] = {{"format", PENDING_FORMAT}};
        rc = safetensors_write(path, t, sizeof t / sizeof *t, meta, 1, err);
    }
    cols_free(&c);
    return error_wrap(err, rc, "rl: saving the pending samples");
}

/* The per-sample columns of st into c (allocated), checked against each other and ds. */
static int read_cols(const struct safetensors *st, const struct dataset *ds, int *n_out, struct pending_cols *c,
                     struct smelt_error *err) {
    const char *format = safetensors_metadata_get(st, "format");
    const struct safetensors_entry *e = safetensors_find(st, "n_tokens"), *ids = safetensors_find(st, "ids");
    if (!format || strcmp(format, PENDING_FORMAT) != 0 || !e || !ids || e->ndim != 1 || ids->ndim != 1 ||
        e->numel > INT_MAX)
        return error_set(err, SMELT_EFORMAT, "%s: not a file of pending samples (%s)", st->path, PENDING_FORMAT);
    int64_t n = e->numel, tokens = ids->numel;
    TRY(cols_alloc(c, n, tokens, err));
    int64_t ns[1] = {n}, nt[1] = {tokens};
    struct tensor dst[] = {tensor_i32(c->n_tokens, 1, ns), tensor_i32(c->rows, 1, ns),
                           tensor_i32(c->versions, 1, ns), tensor_i32(c->finish, 1, ns),
                           tensor_i32(c->ids, 1, nt), tensor_f32(c->logprobs, 1, nt)};
    const char *names[] = {"n_tokens", "rows", "versions", "finish", "ids", "logprobs"};
    for (int i = 0; i < 6; i++) TRY(safetensors_read(st, names[i], &dst[i], err));
    int64_t sum = 0;
    for (int64_t i = 0; i < n; i++) {
        if (c->n_tokens[i] < 0 || c->rows[i] < 0 || c->rows[i] >= ds->n || c->versions[i] < 0 || c->finish[i] < 0 ||
            c->finish[i] >= N_FINISH)
            return error_set(err, SMELT_EFORMAT, "%s: pending sample %lld is not one of this job's (row %d of %lld, "
                             "version %d)", st->path, (long long)i, c->rows[i], (long long)ds->n, c->versions[i]);
        sum += c->n_tokens[i];
    }
    if (sum != tokens)
        return error_set(err, SMELT_EFORMAT, "%s: the samples' %lld tokens are not the %lld stored", st->path,
                         (long long)sum, (long long)tokens);
    *n_out = (int)n;
    return SMELT_OK;
}

static int fill_samples(const struct pending_cols *c, int n, struct rl_sample *out, struct smelt_error *err) {
    int64_t off = 0;
    for (int i = 0; i < n; i++) {
        int64_t k = c->n_tokens[i];
        struct rl_sample *x = &out[i];
        *x = (struct rl_sample){.row = c->rows[i], .version = c->versions[i], .n = k,
                                .finish_reason = FINISH[c->finish[i]]};
        x->ids = malloc((size_t)(k ? k : 1) * sizeof *x->ids);
        x->rollout_logp = malloc((size_t)(k ? k : 1) * sizeof *x->rollout_logp);
        if (!x->ids || !x->rollout_logp) return error_set(err, SMELT_ENOMEM, "rl: out of memory");
        memcpy(x->ids, c->ids + off, (size_t)k * sizeof *x->ids);
        memcpy(x->rollout_logp, c->logprobs + off, (size_t)k * sizeof *x->rollout_logp);
        off += k;
    }
    return SMELT_OK;
}

int rl_pending_load(const char *path, const struct dataset *ds, int cap, struct rl_sample *out, int *n_out,
                    struct smelt_error *err) {
    struct safetensors *st;
    TRY(error_wrap(err, safetensors_open(path, &st, err), "rl: the pending samples"));
    struct pending_cols c = {0};
    int n = 0;
    int rc = read_cols(st, ds, &n, &c, err);
    if (!rc && n > cap)
        rc = error_set(err, SMELT_EFORMAT, "%s: %d pending samples, more than an iteration's %d", path, n, cap);
    if (!rc) rc = fill_samples(&c, n, out, err);
    if (rc) rl_samples_clear(out, n);
    cols_free(&c);
    safetensors_close(st);
    *n_out = rc ? 0 : n;
    return rc;
}
