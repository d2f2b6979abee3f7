/* Checkpoints: output_dir/checkpoints/step-N/ holds everything a run needs to continue
 * exactly — weights (f32, so nothing is rounded) or the adapter, both Adam moments,
 * the step, the data cursor and the spec it was trained with, and whatever else the
 * algorithm keeps (struct run_algo's save_state: PPO's critic/ and its moments). A
 * checkpoint is written into a temporary directory and renamed into place, so a crash
 * never leaves a torn one. */
#include "trainer/trainer_internal.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "common/common.h"

#define CKPT_PATH_BYTES (JOB_PATH_BYTES + 128)

/* The spec's fields that change the numbers: resuming with any of them different would
 * not continue the same run. */
static int training_spec(const struct job_spec *spec, json_t **out, struct smelt_error *err) {
    void *v;
    TRY(job_spec_to_json(spec, &v, err));
    json_t *j = v;
    static const char *const ignored[] = {"eval", "checkpoint", "output_dir", "save_merged",
                                          "save_dtype", "log_every_steps"};
    for (size_t i = 0; i < sizeof ignored / sizeof *ignored; i++) json_object_del(j, ignored[i]);
    /* The stage changes where the moments live, not the numbers: a checkpoint resumes
     * at any stage, on any number of ranks (the shard table, world.json); nor does the
     * collectives' timeout change them. */
    json_object_del(json_object_get(j, "hyperparameters"), "zero_stage");
    json_object_del(json_object_get(j, "hyperparameters"), "comm_timeout_s"); /* a wait, not a number */
    *out = j;
    return SMELT_OK;
}

/* The first key path where a and b differ, into dst. */
static bool first_difference(const json_t *a, const json_t *b, const char *prefix, char *dst, size_t cap) {
    if (json_is_object(a) && json_is_object(b)) {
        const char *key;
        json_t *va;
        json_object_foreach((json_t *)a, key, va) {
            char path[256];
            snprintf(path, sizeof path, "%s%s%s", prefix, *prefix ? "." : "", key);
            if (first_difference(va, json_object_get(b, key), path, dst, cap)) return true;
        }
        json_t *vb;
        json_object_foreach((json_t *)b, key, vb) if (!json_object_get(a, key)) {
            snprintf(dst, cap, "%s%s%s", prefix, *prefix ? "." : "", key);
            return true;
        }
        return false;
    }
    if (a && b && json_equal((json_t *)a, (json_t *)b)) return false;
    snprintf(dst, cap, "%s", prefix);
    return true;
}

/* snprintf that refuses to truncate. */
static int fmt_path(char *dst, size_t cap, struct smelt_error *err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int fmt_path(char *dst, size_t cap, struct smelt_error *err, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(dst, cap, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= cap) return error_set(err, SMELT_EINVAL, "path too long: %.200s...", dst);
    return SMELT_OK;
}

static int step_of(const char *name, int64_t *step) {
    if (strncmp(name, "step-", 5) != 0 || !name[5]) return -1;
    char *end;
    long long s = strtoll(name + 5, &end, 10);
    if (*end || s < 0) return -1;
    *step = s;
    return 0;
}

/* The step numbers of the checkpoints present, ascending; *steps malloc'd. */
static int list_checkpoints(const char *dir, int64_t **steps, int64_t *n, struct smelt_error *err) {
    *steps = NULL;
    *n = 0;
    DIR *d = opendir(dir);
    if (!d) return errno == ENOENT ? SMELT_OK : error_set(err, SMELT_EIO, "%s: %s", dir, strerror(errno));
    int64_t cap = 0;
    struct dirent *e;
    int rc = SMELT_OK;
    while ((e = readdir(d))) {
        int64_t s;
        if (step_of(e->d_name, &s)) continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 16;
            int64_t *grown = realloc(*steps, (size_t)cap * sizeof *grown);
            if (!grown) {
                rc = error_set(err, SMELT_ENOMEM, "checkpoints: out of memory");
                break;
            }
            *steps = grown;
        }
        (*steps)[(*n)++] = s;
    }
    closedir(d);
    for (int64_t i = 1; i < *n; i++) /* insertion sort: a handful of entries */
        for (int64_t j = i; j > 0 && (*steps)[j - 1] > (*steps)[j]; j--) {
            int64_t t = (*steps)[j];
            (*steps)[j] = (*steps)[j - 1];
            (*steps)[j - 1] = t;
        }
    return rc;
}

static int checkpoints_dir(const struct job_spec *spec, char *dst, size_t cap, struct smelt_error *err) {
    return path_join(dst, cap, spec->output_dir, "checkpoints", err);
}

int trainer_checkpoint_latest(const char *output_dir, char *dst, size_t cap, struct smelt_error *err) {
    char dir[CKPT_PATH_BYTES];
    TRY(path_join(dir, sizeof dir, output_dir, "checkpoints", err));
    int64_t *steps, n;
    TRY(list_checkpoints(dir, &steps, &n, err));
    int64_t last = n ? steps[n - 1] : -1;
    free(steps);
    if (last < 0) return error_set(err, SMELT_ENOTFOUND, "%s: no checkpoint", dir);
    return fmt_path(dst, cap, err, "%s/step-%lld", dir, (long long)last);
}

static int write_state(const struct trainer_run *r, const char *path, struct smelt_error *err) {
    json_t *spec;
    TRY(training_spec(r->spec, &spec, err));
    struct dataset_cursor c = dataset_loader_cursor(r->loader);
    json_t *root = json_pack("{s:I, s:I, s:I, s:f, s:{s:I, s:I}, s:I, s:o}", "step", (json_int_t)r->step,
                             "micro_batches", (json_int_t)r->micro_done, "tokens", (json_int_t)r->tokens_done,
                             "elapsed_s", r->elapsed_s, "cursor", "epoch", (json_int_t)c.epoch, "index",
                             (json_int_t)c.index, "seed", (json_int_t)r->spec->seed, "spec", spec);
    if (!root) return error_set(err, SMELT_ENOMEM, "trainer_state.json: out of memory");
    int rc = json_save_atomic(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17), path, err);
    json_decref(root);
    return rc;
}

static int prune(const struct trainer_run *r, const char *dir, struct smelt_error *err) {
    int64_t keep = r->spec->checkpoint.keep_last;
    if (keep <= 0) return SMELT_OK;
    int64_t *steps, n;
    TRY(list_checkpoints(dir, &steps, &n, err));
    int rc = SMELT_OK;
    for (int64_t i = 0; i + keep < n && !rc; i++) {
        char old[CKPT_PATH_BYTES];
        rc = fmt_path(old, sizeof old, err, "%s/step-%lld", dir, (long long)steps[i]);
        if (!rc) rc = dir_remove_all(old, err);
    }
    free(steps);
    return rc;
}

/* world.json: the ranks and stage that wrote the checkpoint and its table of optimizer
 * shards (offset and length in the flat buffer, and the file). */
static int write_world(const struct trainer_run *r, const char *path, struct smelt_error *err) {
    const struct dist *d = &r->dist;
    int64_t total = r->opt.total;
    json_t *shards = json_array();
    for (int k = 0; shards && k < (dist_sharded(d) ? d->ranks : 1); k++) {
        size_t off = 0, len = (size_t)total;
        char file[64];
        if (dist_sharded(d)) comm_shard((size_t)total, d->ranks, k, &off, &len);
        if (dist_sharded(d)) snprintf(file, sizeof file, "optimizer-rank-%d.safetensors", k);
        else snprintf(file, sizeof file, "optimizer.safetensors");
        if (r->opt.n_pieces) { /* stage 3, full: a piece of every parameter unit */
            int64_t plen;
            json_t *pieces = zero3_run_pieces(r, k, &plen);
            json_array_append_new(shards, json_pack("{s:i, s:o, s:I, s:s}", "rank", k, "pieces", pieces, "len",
                                                    (json_int_t)plen, "file", file));
            continue;
        }
        json_array_append_new(shards, json_pack("{s:i, s:I, s:I, s:s}", "rank", k, "offset", (json_int_t)off, "len",
                                                (json_int_t)len, "file", file));
    }
    json_t *root = json_pack("{s:i, s:I, s:I, s:o}", "ranks", d->ranks, "zero_stage", (json_int_t)d->stage,
                             "total", (json_int_t)total, "shards", shards);
    if (!root) return error_set(err, SMELT_ENOMEM, "world.json: out of memory");
    int rc = json_save_atomic(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER, path, err);
    json_decref(root);
    return rc;
}

/* What rank 0 writes: the weights, the whole moments (unsharded), the algorithm's state,
 * world.json (several ranks) and trainer_state.json last. */
static int write_rank0(struct trainer_run *r, const char *tmp, struct smelt_error *err) {
    char p[CKPT_PATH_BYTES + 64];
    if (r->lora) {
        snprintf(p, sizeof p, "%s/adapter", tmp);
        TRY(lora_save(r->lora, p, r->base_path, err));
    } else {
        snprintf(p, sizeof p, "%s/model", tmp);
        TRY(model_save(r->model, p, false, err));
    }
    if (!dist_sharded(&r->dist)) {
        snprintf(p, sizeof p, "%s/optimizer.safetensors", tmp);
        TRY(optimizer_save(&r->opt, p, err));
    }
    if (r->algo->save_state) TRY(r->algo->save_state(r, tmp, err));
    if (r->dist.ranks > 1) {
        snprintf(p, sizeof p, "%s/world.json", tmp);
        TRY(write_world(r, p, err));
    }
    snprintf(p, sizeof p, "%s/trainer_state.json", tmp);
    return write_state(r, p, err);
}

static int publish(struct trainer_run *r, const char *dir, const char *tmp, const char *final,
                   struct smelt_error *err) {
    TRY(dir_remove_all(final, err)); /* a stale one from a run that died after it */
    if (rename(tmp, final) != 0) return error_set(err, SMELT_EIO, "%s: cannot rename into place: %s", final, strerror(errno));
    TRY(prune(r, dir, err));
    run_metrics_emit(r, json_pack("{s:s, s:I, s:o}", "type", "checkpoint", "step", (json_int_t)r->step,
                                  "path", json_sprintf("checkpoints/step-%lld", (long long)r->step)));
    return SMELT_OK;
}

/* Unsharded, rank 0 writes it all and the others go on. Sharded: rank 0 makes the
 * temporary directory, each rank writes its moments into it, rank 0 the rest and renames
 * it; barriers between, so no rank writes into a directory not there yet and none goes
 * on before the checkpoint is in place. */
int run_checkpoint_save(struct trainer_run *r, struct smelt_error *err) {
    struct dist *d = &r->dist;
    bool sharded = dist_sharded(d), lead = d->rank == 0;
    if (!lead && !sharded) return SMELT_OK;
    char dir[CKPT_PATH_BYTES], tmp[CKPT_PATH_BYTES], final[CKPT_PATH_BYTES], p[CKPT_PATH_BYTES + 64];
    TRY(checkpoints_dir(r->spec, dir, sizeof dir, err));
    TRY(fmt_path(tmp, sizeof tmp, err, "%s/.step-%lld.tmp", dir, (long long)r->step));
    TRY(fmt_path(final, sizeof final, err, "%s/step-%lld", dir, (long long)r->step));
    if (lead) {
        TRY(dir_remove_all(tmp, err));
        TRY(dir_create_all(tmp, err));
    }
    if (sharded) {
        TRY(dist_barrier(d, err));
        snprintf(p, sizeof p, "%s/optimizer-rank-%d.safetensors", tmp, d->rank);
        TRY(optimizer_save(&r->opt, p, err));
        TRY(dist_barrier(d, err));
    }
    /* Stage 3, full: rank 0 writes the whole weights (model/, as one process does, so
     * any layout resumes from them), which every rank's pieces make up. */
    bool gather = r->zero3 && !r->lora;
    if (gather) TRY(zero3_unshard(r->zero3, lead, err));
    int rc = SMELT_OK;
    if (lead) {
        rc = write_rank0(r, tmp, err);
        if (!rc) rc = publish(r, dir, tmp, final, err);
    }
    if (gather) {
        int rrc = zero3_reshard(r->zero3, rc ? &(struct smelt_error){0} : err);
        if (!rc) rc = rrc;
    }
    TRY(rc);
    return sharded ? dist_barrier(d, err) : SMELT_OK;
}

static int restore_weights(struct trainer_run *r, const char *ckpt, struct smelt_error *err) {
    char p[CKPT_PATH_BYTES + 64];
    if (r->lora) {
        snprintf(p, sizeof p, "%s/adapter", ckpt);
        struct lora *saved;
        TRY(lora_load(r->model, p, &saved, err));
        int rc = saved->n_weights == r->lora->n_weights
                     ? tensor_copy(&r->lora->weights, &saved->weights, err)
                     : error_set(err, SMELT_EINVAL, "%s: the adapter's layout differs from this job's", p);
        lora_free(saved);
        return rc;
    }
    snprintf(p, sizeof p, "%s/model", ckpt);
    /* Loaded on the host and copied over: a second full model on the device could
     * exceed its memory. */
    struct model *saved;
    TRY(model_load(p, BACKEND_CPU, &saved, err));
    int rc = saved->n_weights != r->model->n_weights
                 ? error_set(err, SMELT_EINVAL, "%s: the model's layout differs from this job's", p)
             : r->zero3 ? zero3_set_params(r->zero3, saved->weights.data, err) /* this rank's pieces */
                        : tensor_copy(&r->model->weights, &saved->weights, err);
    model_free(saved);
    return rc;
}

/* This rank's moments from the checkpoint's shards, whatever the ranks and stage that
 * wrote it: world.json's ranks (optimizer-rank-R.safetensors each, when it was sharded),
 * else optimizer.safetensors. File names are made here, never read from the file. */
static int restore_moments(struct trainer_run *r, const char *ckpt, struct smelt_error *err) {
    char p[CKPT_PATH_BYTES + 64];
    snprintf(p, sizeof p, "%s/world.json", ckpt);
    json_int_t ranks = 1, stage = 0;
    if (path_exists(p)) {
        json_t *world;
        TRY(json_load_path(p, &world, err));
        int bad = json_unpack(world, "{s:I, s:I}", "ranks", &ranks, "zero_stage", &stage);
        json_decref(world);
        if (bad || ranks < 1 || ranks > 65536 || stage < 0)
            return error_set(err, SMELT_EFORMAT, "%s: missing or mistyped ranks or zero_stage", p);
    }
    int n = ranks > 1 && stage >= 1 ? (int)ranks : 1;
    char **paths = calloc((size_t)n, sizeof *paths);
    int rc = paths ? SMELT_OK : error_set(err, SMELT_ENOMEM, "checkpoint: out of memory");
    for (int k = 0; k < n && !rc; k++) {
        paths[k] = malloc(CKPT_PATH_BYTES + 64);
        if (!paths[k]) rc = error_set(err, SMELT_ENOMEM, "checkpoint: out of memory");
        else if (n == 1) rc = fmt_path(paths[k], CKPT_PATH_BYTES + 64, err, "%s/optimizer.safetensors", ckpt);
        else rc = fmt_path(paths[k], CKPT_PATH_BYTES + 64, err, "%s/optimizer-rank-%d.safetensors", ckpt, k);
    }
    if (!rc) rc = optimizer_load_shards(&r->opt, (const char *const *)paths, n, err);
    for (int k = 0; paths && k < n; k++) free(paths[k]);
    free(paths);
    return rc;
}

int run_checkpoint_restore(struct trainer_run *r, const char *resume, int64_t *step_out,
                           struct smelt_error *err) {
    char ckpt[CKPT_PATH_BYTES], p[CKPT_PATH_BYTES + 64];
    if (strcmp(resume, "latest") == 0) TRY(trainer_checkpoint_latest(r->spec->output_dir, ckpt, sizeof ckpt, err));
    else if (snprintf(ckpt, sizeof ckpt, "%s", resume) >= (int)sizeof ckpt)
        return error_set(err, SMELT_EINVAL, "--resume: path too long");
    snprintf(p, sizeof p, "%s/trainer_state.json", ckpt);
    json_t *state;
    TRY(json_load_path(p, &state, err));
    json_t *want = NULL;
    int rc = training_spec(r->spec, &want, err);
    char field[256];
    json_int_t step = 0, micro = 0, tokens = 0, epoch = 0, index = 0;
    double elapsed = 0;
    if (!rc && json_unpack(state, "{s:I, s:I, s:I, s:F, s:{s:I, s:I}}", "step", &step, "micro_batches", &micro,
                           "tokens", &tokens, "elapsed_s", &elapsed, "cursor", "epoch", &epoch, "index", &index))
        rc = error_set(err, SMELT_EFORMAT, "%s: missing or mistyped step, micro_batches, tokens, elapsed_s or cursor", p);
    if (!rc && first_difference(want, json_object_get(state, "spec"), "", field, sizeof field))
        rc = error_set(err, SMELT_EINVAL, "%s: the spec differs from the checkpoint's at \"%s\"; a resumed run must train the same job", p, field);
    json_decref(want);
    json_decref(state);
    if (rc) return rc;
    if (step < 0 || step > r->total_steps || micro < 0)
        return error_set(err, SMELT_EFORMAT, "%s: step %lld is outside this run's %lld steps", p, (long long)step,
                         (long long)r->total_steps);
    TRY(restore_weights(r, ckpt, err));
    TRY(restore_moments(r, ckpt, err));
    if (r->algo->restore_state) TRY(r->algo->restore_state(r, ckpt, err));
    struct dataset_cursor c = {.epoch = epoch, .index = index};
    TRY(dataset_loader_seek(r->loader, &c, err));
    r->step = step;
    r->micro_done = micro;
    r->tokens_done = tokens;
    r->elapsed_s = elapsed;
    *step_out = step;
    return SMELT_OK;
}
