/* A run from its start to its end, whatever it trains: setup and resume, the loop of
 * optimizer steps (the algorithm's own, struct run_algo: sft.c, dpo.c, reward.c, grpo.c,
 * ppo.c), metrics lines,
 * evaluation, checkpoints, stopping on a signal, and the outputs. */
#include "trainer/trainer_internal.h"

#include <jansson.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/common.h"

/* Set from smelt-trainer's signal handler, which may run on an OpenMP thread
 * rather than the training one: a lock-free atomic, which a handler may write (C11
 * 7.14.1.1), not a volatile sig_atomic_t, which orders nothing between threads. */
_Static_assert(ATOMIC_INT_LOCK_FREE == 2, "signal handlers need a lock-free atomic_int");
static atomic_int stop_requested;

void trainer_request_stop(void) { atomic_store(&stop_requested, 1); }

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t mix(uint64_t a, uint64_t b) {
    return rng_mix64(a ^ (b + RNG_GOLDEN + (a << 6) + (a >> 2)));
}

uint64_t run_dropout_seed(const struct trainer_run *r, int64_t micro) {
    return mix(mix(r->spec->seed, (uint64_t)r->step + 1), (uint64_t)micro);
}

int run_optimizer_step(struct trainer_run *r, double grad_scale, struct step_stats *st,
                       struct smelt_error *err) {
    const struct job_spec *s = r->spec;
    st->lr = lr_at(&r->schedule, r->step + 1);
    struct adamw_step a = {.grad_scale = grad_scale, .max_norm = s->hp.max_grad_norm, .lr = st->lr,
                           .beta1 = s->hp.beta1, .beta2 = s->hp.beta2, .eps = s->hp.eps,
                           .weight_decay = s->hp.weight_decay};
    if (r->zero3 && !r->lora) TRY(zero3_run_optimizer_step(r, &a, &st->grad_norm, err));
    else TRY(dist_optimizer_step(&r->dist, &r->opt, r->params, r->grads, &a, &st->grad_norm, err));
    r->step++;
    r->tokens_done += st->tokens;
    return SMELT_OK;
}

static json_t *number_or_null(double x) { return isfinite(x) ? json_real(x) : json_null(); }

/* {"type": type, "step": step} followed by metrics (stolen; may be NULL). */
static json_t *metrics_line(const char *type, int64_t step, json_t *metrics) {
    json_t *line = json_pack("{s:s, s:I}", "type", type, "step", (json_int_t)step);
    if (line && metrics) json_object_update_new(line, metrics);
    else json_decref(metrics);
    return line;
}

static void emit_train(struct trainer_run *r, struct step_stats *st, int64_t tokens, double seconds) {
    struct dataset_cursor c = dataset_loader_cursor(r->loader);
    double epoch = (double)c.epoch + (r->train->n ? (double)c.index / (double)r->train->n : 0);
    double tps = seconds > 0 ? (double)tokens / seconds : 0;
    double flops = tps * r->flops_per_token;
    /* MFU needs the device's peak; the CPU has none we can trust, so it is reported only
     * when SMELT_PEAK_FLOPS says what it is. */
    const char *peak_env = getenv("SMELT_PEAK_FLOPS");
    double peak = peak_env ? strtod(peak_env, NULL) : 0;
    json_t *line = json_pack("{s:s, s:I, s:f, s:o, s:f, s:o, s:I, s:I, s:f, s:f, s:o, s:f}",
                             "type", "train", "step", (json_int_t)r->step, "epoch", epoch,
                             "loss", number_or_null(st->loss), "lr", st->lr,
                             "grad_norm", number_or_null(st->grad_norm),
                             "tokens", (json_int_t)st->tokens, "trained_tokens", (json_int_t)st->trained,
                             "tokens_per_s", tps, "flops_per_s", flops,
                             "mfu", peak > 0 ? json_real(flops / peak) : json_null(),
                             "elapsed_s", r->elapsed_s);
    if (line && st->metrics) json_object_update_new(line, st->metrics);
    else json_decref(st->metrics);
    st->metrics = NULL;
    run_metrics_emit(r, line);
}

static int evaluate(struct trainer_run *r, struct smelt_error *err) {
    void *metrics;
    double loss;
    TRY(r->algo->validate(r, &metrics, &loss, err));
    if (metrics) run_metrics_emit(r, metrics_line("eval", r->step, metrics));
    return SMELT_OK;
}

static int save_outputs(struct trainer_run *r, struct smelt_error *err) {
    const struct job_spec *s = r->spec;
    char out[JOB_PATH_BYTES + 64], merged[JOB_PATH_BYTES + 64];
    TRY(path_join(out, sizeof out, s->output_dir, "output", err));
    TRY(dir_remove_all(out, err));
    TRY(dir_create_all(out, err));
    if (r->lora) {
        TRY(lora_save(r->lora, out, r->base_path, err));
        TRY(run_copy_tokenizer_files(r, out, err));
        if (s->save_merged) {
            TRY(path_join(merged, sizeof merged, out, "merged", err));
            lora_detach(r->lora);
            TRY(lora_merge(r->lora, err));
            TRY(model_save(r->model, merged, s->save_bf16, err));
            TRY(run_copy_tokenizer_files(r, merged, err));
        }
    } else {
        TRY(model_save(r->model, out, s->save_bf16, err));
        TRY(run_copy_tokenizer_files(r, out, err));
    }
    return r->algo->save_outputs ? r->algo->save_outputs(r, out, err) : SMELT_OK;
}

/* The final line: the validation metrics ({"val_loss": null} without validation data)
 * and the greedy accuracy (null for a reward model, which has no lm_head to generate
 * with: its val_rewards/accuracies is the accuracy that means something). */
static int emit_final(struct trainer_run *r, struct trainer_result *res, struct smelt_error *err) {
    void *metrics;
    TRY(r->algo->validate(r, &metrics, &res->val_loss, err));
    int64_t n_generate = r->model->config.score_head || r->rl ? 0 : r->spec->eval.accuracy_examples;
    int rc = run_accuracy(r, n_generate, &res->accuracy, &res->accuracy_examples, err);
    if (rc) {
        json_decref(metrics);
        return rc;
    }
    json_t *line = metrics_line("final", r->step, metrics ? metrics : json_pack("{s:n}", "val_loss"));
    if (line) {
        json_object_set_new(line, "accuracy", number_or_null(res->accuracy));
        json_object_set_new(line, "accuracy_examples", json_integer((json_int_t)res->accuracy_examples));
    }
    run_metrics_emit(r, line);
    return SMELT_OK;
}

/* A rank other than 0's part in the final validation, which rank 0 runs first thing in finish. */
static int final_validation_share(struct trainer_run *r, struct smelt_error *err) {
    void *metrics = NULL;
    double loss;
    int rc = r->algo->validate(r, &metrics, &loss, err);
    json_decref(metrics);
    return rc;
}

static int finish(struct trainer_run *r, struct trainer_result *res, struct smelt_error *err) {
    TRY(emit_final(r, res, err));
    if (r->lora) {
        uint64_t hash;
        TRY(run_hash_weights(&r->model->weights, &hash, err));
        res->base_unchanged = hash == r->base_hash;
        if (!res->base_unchanged) return error_set(err, SMELT_EBACKEND, "LoRA training changed the frozen base weights");
    }
    TRY(save_outputs(r, err));
    TRY(path_join(res->output, sizeof res->output, r->spec->output_dir, "output", err));
    return SMELT_OK;
}

/* The start line: the run's size, its ranks and what this rank allocated. */
static json_t *start_line(const struct trainer_run *r) {
    const struct job_spec *s = r->spec;
    struct dist_sizes z;
    dist_sizes(&r->dist, r->params, r->grads, &r->opt, &z);
    if (r->zero3) zero3_run_sizes(r, &z);
    /* Stage 3 (full): params is the rank's shard; the count is the whole buffer's. */
    int64_t trainable = r->zero3 && !r->lora ? r->model->n_weights : tensor_numel(r->params);
    json_t *line = json_pack("{s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:i, s:I, s:I, s:I, s:I, s:{s:s, s:s, s:i}}",
                     "type", "start", "step", (json_int_t)r->step, "total_steps", (json_int_t)r->total_steps,
                     "trainable_params", (json_int_t)trainable,
                     "model_params", (json_int_t)r->model->n_weights, "train_examples", (json_int_t)r->train->n,
                     "val_examples", (json_int_t)(r->val ? r->val->n : 0),
                     "train_tokens", (json_int_t)r->train->report.n_tokens, "ranks", r->dist.ranks,
                     "zero_stage", (json_int_t)s->hp.zero_stage, "rank_optimizer_bytes", (json_int_t)z.optimizer_bytes,
                     "rank_param_bytes", (json_int_t)z.param_bytes, "rank_grad_bytes", (json_int_t)z.grad_bytes,
                     "compute", "backend", backend_name(s->backend), "blas_kernels", backend_cpu_blas_kernels(),
                     "cpu_threads", backend_cpu_threads());
    if (line && r->zero3) json_object_set_new(line, "zero3", zero3_run_bytes_json(r));
    return line;
}

/* spec.json, as this run reads it (rank 0, fresh starts). */
static int save_spec(const struct job_spec *s, struct smelt_error *err) {
    void *spec_json;
    char p[JOB_PATH_BYTES + 64];
    TRY(job_spec_to_json(s, &spec_json, err));
    int rc = path_join(p, sizeof p, s->output_dir, "spec.json", err);
    if (!rc) rc = json_save_atomic(spec_json, JSON_INDENT(2) | JSON_PRESERVE_ORDER, p, err);
    json_decref(spec_json);
    return rc;
}

static int start(struct trainer_run *r, const struct trainer_options *o, struct smelt_error *err) {
    const struct job_spec *s = r->spec;
    struct dist_config dc = {.rank = o->rank, .ranks = o->ranks, .stage = (int)s->hp.zero_stage,
                             .rendezvous = o->rendezvous, .run_id = o->run_id,
                             .timeout_ms = o->comm_timeout_ms > 0 ? o->comm_timeout_ms : trainer_comm_timeout_ms(s),
                             .job_keys = o->job_keys};
    TRY(dist_open(&r->dist, &dc, err));
    bool lead = r->dist.rank == 0;
    TRY(dir_create_all(s->output_dir, err));
    char ckpt[JOB_PATH_BYTES + 128];
    struct smelt_error ignore = {0};
    bool have_ckpt = trainer_checkpoint_latest(s->output_dir, ckpt, sizeof ckpt, &ignore) == SMELT_OK;
    if (!o->resume && have_ckpt)
        return error_set(err, SMELT_EINVAL, "%s holds checkpoints (%s); resume it (--resume) or choose another output_dir",
                         s->output_dir, ckpt);
    TRY(run_setup(r, err));
    if (r->algo->prepare) TRY(r->algo->prepare(r, err));
    int64_t resumed = -1;
    if (o->resume) {
        TRY(run_checkpoint_restore(r, o->resume, &resumed, err));
        if (lead) log_info("resumed from step %lld of %lld", (long long)resumed, (long long)r->total_steps);
    } else if (lead) {
        TRY(save_spec(s, err));
    }
    if (!lead) return SMELT_OK; /* only rank 0 writes the job directory's shared files */
    TRY(run_metrics_open(r, resumed, err));
    run_metrics_emit(r, start_line(r));
    return SMELT_OK;
}

/* Whether steps (before, after] hold a multiple of every (0: never): an RL iteration
 * takes several optimizer steps at once. */
static bool crossed(int64_t before, int64_t after, int64_t every) {
    return every > 0 && before / every != after / every;
}

/* One step, timed, and its train line when one is due. */
static int timed_step(struct trainer_run *r, struct trainer_result *res, int64_t *since_tokens, double *since_s,
                      struct smelt_error *err) {
    const struct job_spec *s = r->spec;
    int64_t n_micro = s->hp.grad_accum;
    if (s->hp.max_steps == 0 && r->total_micro - r->micro_done < n_micro) n_micro = r->total_micro - r->micro_done;
    struct step_stats st = {0};
    int64_t before = r->step;
    double t0 = now_s();
    TRY(r->algo->step(r, n_micro, &st, err));
    double dt = now_s() - t0;
    r->elapsed_s += dt;
    *since_s += dt;
    *since_tokens += st.tokens;
    res->last_loss = st.loss;
    if (crossed(before, r->step, s->log_every_steps) || r->step == r->total_steps) {
        emit_train(r, &st, *since_tokens, *since_s);
        *since_tokens = 0;
        *since_s = 0;
    }
    json_decref(st.metrics);
    return SMELT_OK;
}

/* Stop after this step? A signal reaches the ranks at different times, so with several
 * ranks they vote: any rank's request stops them all after the same step. */
static int should_stop(struct trainer_run *r, const struct trainer_options *o, bool *stop, struct smelt_error *err) {
    *stop = atomic_load(&stop_requested) || (o->stop_after_step > 0 && r->step >= o->stop_after_step);
    if (r->dist.ranks <= 1) return SMELT_OK;
    double votes = *stop ? 1 : 0;
    TRY(dist_sum(&r->dist, &votes, 1, err));
    *stop = votes > 0;
    return SMELT_OK;
}

static int loop(struct trainer_run *r, const struct trainer_options *o, struct trainer_result *res,
                struct smelt_error *err) {
    const struct job_spec *s = r->spec;
    int64_t since_tokens = 0;
    double since_s = 0;
    bool saved_at_step = false;
    while (r->step < r->total_steps) {
        int64_t before = r->step;
        TRY(timed_step(r, res, &since_tokens, &since_s, err));
        bool last = r->step == r->total_steps;
        saved_at_step = false;
        /* Rank 0 reports. The ranks share the validation (run_passes_shared), or at
         * stage 3 each runs all of it (every pass gathers units); otherwise (RL) rank 0
         * validates alone while the others wait in their next collective. */
        bool validates = r->dist.rank == 0 || r->zero3 || run_passes_shared(r);
        if (!last && validates && crossed(before, r->step, s->eval.every_steps)) TRY(evaluate(r, err));
        if (!last && crossed(before, r->step, s->checkpoint.every_steps)) {
            TRY(run_checkpoint_save(r, err));
            saved_at_step = true;
        }
        bool stop = false;
        if (!last) TRY(should_stop(r, o, &stop, err));
        if (stop) {
            if (!saved_at_step) TRY(run_checkpoint_save(r, err));
            res->stopped = true;
            log_info("stopped after step %lld; continue with --resume", (long long)r->step);
            return SMELT_OK;
        }
    }
    return run_checkpoint_save(r, err);
}

int trainer_run(const struct job_spec *spec, const struct trainer_options *options,
                struct trainer_result *result, struct smelt_error *err) {
    static const struct trainer_options defaults = {0};
    const struct trainer_options *o = options ? options : &defaults;
    memset(result, 0, sizeof *result);
    result->val_loss = result->accuracy = result->last_loss = NAN;
    struct trainer_run r = {.spec = spec, .quiet = o->quiet, .job_keys = o->job_keys,
                            .algo = spec->type == JOB_DPO      ? &DPO_ALGO
                                    : spec->type == JOB_REWARD ? &REWARD_ALGO
                                    : spec->type == JOB_GRPO   ? &GRPO_ALGO
                                    : spec->type == JOB_PPO    ? &PPO_ALGO
                                                               : &SFT_ALGO};
    atomic_store(&stop_requested, 0);
    int rc = dist_check(spec, o, err);
    r.quiet |= o->rank > 0; /* rank 0 reports for all */
    if (!rc) rc = start(&r, o, err);
    if (!rc) rc = loop(&r, o, result, err);
    /* The final validation and the outputs are rank 0's; the others are done. At stage 3
     * they first serve the gathers that give rank 0 the whole model (a transient copy). */
    if (!rc && !result->stopped && r.zero3) rc = zero3_unshard(r.zero3, r.dist.rank == 0, err);
    if (!rc && !result->stopped && r.dist.rank == 0) rc = finish(&r, result, err);
    else if (!rc && !result->stopped && run_passes_shared(&r)) rc = final_validation_share(&r, err);
    result->steps = r.step;
    run_teardown(&r);
    dist_close(&r.dist);
    return rc;
}
