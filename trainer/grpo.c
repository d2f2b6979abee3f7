/* GRPO (and its RLOO / REINFORCE++ variants), and the loop PPO shares (ppo.c adds the
 * critic, its values, GAE and its steps: r->rl->critic): one run_algo step is one iteration —
 * a batch of prompts, num_generations samples of each from the current policy, their
 * rewards, advantages, then ppo_epochs x minibatches optimizer steps on the samples —
 * after which the policy version is the number of iterations done (in the split
 * placement the new weights are then pushed to the rollout workers, which hold that
 * version from then on). run.c drives the run (checkpoints, evaluation, stopping), so
 * a resumed job continues exactly: the prompt cursor is the loader's, and every random
 * stream is a pure function of the seed, the version and the prompt (rl_sample_seed,
 * run_dropout_seed). */
#include "trainer/trainer_internal.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/common.h"
#include "common/json.h"
#include "rewards/rewards.h"
#include "weightsync/weightsync.h"

#define RL_ERRORS_KEPT 8

struct rl_buffers *rl_buffers(struct trainer_run *r) { return &r->rl->buf; }

struct rl_workers *rl_workers(struct trainer_run *r) { return r->rl ? r->rl->workers : NULL; }

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void rl_state_free(struct rl_state *s) {
    if (!s) return;
    rl_workers_stop(s->workers);
    critic_free(s->critic);
    reward_stage_free(s->reward);
    model_free(s->ref_model);
    json_decref(s->errors);
    rl_samples_clear(s->samples, s->cap * RL_ROUNDS);
    free(s->samples);
    rl_samples_clear(s->ahead, s->cap);
    free(s->ahead);
    free(s->trained);
    free(s->rin);
    free(s->rout);
    free(s->group);
    free(s->rollout);
    free(s->old);
    free(s->ref);
    free(s->cur);
    free(s->mask);
    free(s->adv);
    free(s->coef);
    free(s->start);
    free(s->buf.ids);
    free(s->buf.cu);
    free(s->buf.targets);
    free(s->buf.rows);
    free(s);
}

/* ---- setup ---- */

/* Every prompt row of ds meets the reward's needs (an answer where a verifier wants one). */
static int check_prompts(struct rl_state *rl, const struct dataset *ds, const char *field, struct smelt_error *err) {
    for (int64_t i = 0; ds && i < ds->n; i++) {
        const struct dataset_prompt *p = &ds->prompts[i];
        int rc = reward_stage_check_prompt(rl->reward, p->answer, p->metadata_json, err);
        if (rc) {
            error_wrap(err, rc, "%s: %s:%lld", field, ds->path, (long long)p->line);
            return error_in_field(err, rc, field);
        }
    }
    return SMELT_OK;
}

static int alloc_state(struct trainer_run *r, struct rl_state *rl, struct smelt_error *err) {
    const struct job_spec *s = r->spec;
    int64_t n = (int64_t)rl->cap * RL_ROUNDS;
    rl->cap_tokens = n * s->rl.max_new_tokens;
    rl->samples = calloc((size_t)n, sizeof *rl->samples);
    rl->trained = calloc((size_t)n, sizeof *rl->trained);
    rl->ahead = calloc((size_t)rl->cap, sizeof *rl->ahead);
    rl->rin = calloc((size_t)rl->cap, sizeof *rl->rin);
    rl->rout = calloc((size_t)rl->cap, sizeof *rl->rout);
    rl->group = calloc((size_t)s->rl.num_generations, sizeof *rl->group);
    rl->start = calloc((size_t)n + 1, sizeof *rl->start);
    float **f[] = {&rl->rollout, &rl->old, &rl->ref, &rl->cur, &rl->mask};
    for (size_t i = 0; i < sizeof f / sizeof *f; i++) *f[i] = calloc((size_t)rl->cap_tokens, sizeof(float));
    rl->adv = calloc((size_t)rl->cap_tokens, sizeof *rl->adv);
    rl->coef = calloc((size_t)rl->cap_tokens, sizeof *rl->coef);
    int64_t seqs = n + 1;
    rl->buf.cap_seqs = seqs;
    rl->buf.ids = malloc((size_t)r->max_tokens * sizeof *rl->buf.ids);
    rl->buf.targets = malloc((size_t)r->max_tokens * sizeof *rl->buf.targets);
    rl->buf.cu = malloc((size_t)(seqs + 1) * sizeof *rl->buf.cu);
    rl->buf.rows = malloc((size_t)seqs * sizeof *rl->buf.rows);
    bool ok = rl->samples && rl->trained && rl->ahead && rl->rin && rl->rout && rl->group && rl->start && rl->adv && rl->coef &&
              rl->buf.ids && rl->buf.targets && rl->buf.cu && rl->buf.rows;
    for (size_t i = 0; i < sizeof f / sizeof *f; i++) ok = ok && *f[i];
    return ok ? SMELT_OK : error_set(err, SMELT_ENOMEM, "rl: out of memory for %lld samples", (long long)n);
}

static int copy_reference(struct trainer_run *r, struct smelt_error *err);

int rl_prepare(struct trainer_run *r, struct smelt_error *err) {
    const struct job_spec *s = r->spec;
    struct rl_state *rl = calloc(1, sizeof *rl);
    if (!rl) return error_set(err, SMELT_ENOMEM, "rl: out of memory");
    r->rl = rl;
    json_error_t jerr;
    json_t *spec = json_loads(s->rl.reward, 0, &jerr);
    if (!spec) return error_set(err, SMELT_EINVAL, "rl.reward: %s", jerr.text);
    int rc = reward_stage_create(spec, "rl.reward", &rl->reward, err);
    json_decref(spec);
    TRY(rc);
    /* reward_model graders: their classifiers load here, beside the policy */
    rl->scorer = (struct reward_scorer_config){.backend = s->backend, .add_bos = s->data.add_bos,
                                               .policy_chat = r->has_chat ? &r->chat : NULL, .where = "rl.reward"};
    struct reward_model_scorer scorer;
    reward_scorer_init(&rl->scorer, &scorer);
    TRY(error_in_field(err, reward_stage_set_model_scorer(rl->reward, &scorer, err), "rl.reward"));
    TRY(check_prompts(rl, r->train, "data.train", err));
    TRY(check_prompts(rl, r->val, "data.validation", err));
    job_rl_loss_config(s, &rl->loss);
    rl->steps_per_iteration = s->rl.ppo_epochs * s->rl.minibatches;
    /* true_on_policy promises old logprobs equal to the rollout's: a training forward with
     * adapter dropout is not that forward, so they get a pass of their own then. */
    bool dropout = r->lora && s->lora.dropout > 0;
    rl->old_in_update = rl->steps_per_iteration == 1 && !(s->rl.true_on_policy && dropout);
    rl->cap = (int)(s->hp.batch_size * s->rl.num_generations);
    if (r->val && r->val->n > rl->cap) rl->cap = (int)r->val->n;
    if (s->rl.beta > 0 && !r->lora) TRY(copy_reference(r, err));
    TRY(alloc_state(r, rl, err));
    /* Rank 0 alone generates (docs/distributed.md): only it has workers. */
    if (s->rl.placement == RL_PLACEMENT_SPLIT && r->dist.rank == 0)
        TRY(rl_workers_start(r, rl->cap, &rl->workers, err));
    return SMELT_OK;
}

int rl_plan(struct trainer_run *r, struct smelt_error *err) {
    const struct job_spec *s = r->spec;
    int64_t ctx = r->model->config.max_seq_len;
    int64_t longest = rl_longest_sample(r, r->train), lv = rl_longest_sample(r, r->val);
    if (lv > longest) longest = lv;
    if (longest > ctx)
        return error_set_field(err, SMELT_EINVAL, "rl.max_new_tokens",
                               "rl.max_new_tokens: the longest prompt plus %lld new tokens is %lld tokens, beyond "
                               "the model's context %lld", (long long)s->rl.max_new_tokens, (long long)longest,
                               (long long)ctx);
    int64_t iterations = s->rl.max_iterations;
    if (!iterations)
        for (int64_t e = 0; e < s->hp.epochs; e++) iterations += dataset_loader_batches_in_epoch(r->loader, e);
    int64_t per_minibatch = (s->hp.batch_size * s->rl.num_generations + s->rl.minibatches - 1) / s->rl.minibatches;
    if (s->hp.batch_tokens > 0) {
        if (s->hp.batch_tokens < longest)
            return error_set_field(err, SMELT_EINVAL, "hyperparameters.batch_tokens",
                                   "hyperparameters.batch_tokens: %lld cannot hold the longest sample (%lld tokens)",
                                   (long long)s->hp.batch_tokens, (long long)longest);
        r->max_tokens = s->hp.batch_tokens;
    } else {
        r->max_tokens = longest * (per_minibatch < 16 ? per_minibatch : 16);
    }
    r->total_steps = iterations * s->rl.ppo_epochs * s->rl.minibatches;
    r->total_micro = INT64_MAX / 2; /* an iteration takes what it needs */
    r->schedule = (struct lr_schedule){.kind = s->hp.lr_schedule, .peak = s->hp.learning_rate,
                                       .warmup_steps = s->hp.warmup_steps, .total_steps = r->total_steps,
                                       .min_lr_ratio = s->hp.min_lr_ratio};
    r->flops_per_token = run_flops_per_token(r->model, (double)longest);
    return SMELT_OK;
}

/* ---- one iteration: samples, rewards, advantages ---- */

static struct sample_params sampling(const struct job_spec *s) {
    return (struct sample_params){.temperature = (float)s->rl.temperature, .top_k = s->rl.top_k,
                                  .top_p = (float)s->rl.top_p, .min_p = (float)s->rl.min_p};
}

/* A sample's text: ids the tokenizer has no token for (a model's vocabulary may be
 * larger than its tokenizer's) have none, and special tokens are left out. */
static int decode_text(struct trainer_run *r, const int32_t *ids, int64_t n, char **text, struct smelt_error *err) {
    int32_t *known = malloc((size_t)(n ? n : 1) * sizeof *known);
    if (!known) return error_set(err, SMELT_ENOMEM, "rl: out of memory");
    size_t k = 0, len;
    for (int64_t i = 0; i < n; i++)
        if (tokenizer_id_to_token(r->tok, ids[i])) known[k++] = ids[i];
    int rc = tokenizer_decode(r->tok, known, k, true, text, &len, err);
    free(known);
    return error_wrap(err, rc, "rl: decoding a sample");
}

/* The prompt of each sample of s[0..n) as text, special tokens kept (the prompt as the
 * model saw it), for graders that send it on (endpoint): prompts[i], malloc'd. */
static int decode_prompts(struct trainer_run *r, const struct dataset *ds, const struct rl_sample *s, int n,
                          char **prompts, struct smelt_error *err) {
    for (int i = 0; i < n; i++) {
        const struct dataset_prompt *p = &ds->prompts[s[i].row];
        size_t len;
        TRY(error_wrap(err, tokenizer_decode(r->tok, p->ids, (size_t)p->n, false, &prompts[i], &len, err),
                       "rl: decoding the prompt of %s line %lld", ds->path, (long long)p->line));
    }
    return SMELT_OK;
}

/* Decodes samples s[0..n) of ds and their prompts, and scores them into rl->rout. */
static int score_batch(struct trainer_run *r, const struct dataset *ds, struct rl_sample *s, int n,
                       struct smelt_error *err) {
    struct rl_state *rl = r->rl;
    char **prompts = calloc(n > 0 ? (size_t)n : 1, sizeof *prompts);
    if (!prompts) return error_set(err, SMELT_ENOMEM, "rl: out of memory");
    int rc = decode_prompts(r, ds, s, n, prompts, err);
    for (int i = 0; i < n && !rc; i++) {
        free(s[i].text);
        s[i].text = NULL;
        rc = decode_text(r, s[i].ids, s[i].n, &s[i].text, err);
        const struct dataset_prompt *p = &ds->prompts[s[i].row];
        rl->rin[i] = (struct reward_sample){.prompt = p->text, .prompt_messages = p->messages_json,
                                            .prompt_rendered = prompts[i], .completion = s[i].text,
                                            .answer = p->answer, .metadata_json = p->metadata_json,
                                            .n_completion_tokens = s[i].n, .finish_reason = s[i].finish_reason};
    }
    if (!rc) rc = reward_stage_score(rl->reward, rl->rin, n, rl->rout, err);
    for (int i = 0; i < n; i++) free(prompts[i]);
    free(prompts);
    return rc;
}

/* Keeps one of the iteration's first reward errors for its sample_errors line. The text
 * may quote model output (a grader model's reply, cut at REWARD_ERROR_BYTES): bytes that
 * are not UTF-8 become U+FFFD, or jansson would refuse the whole entry. */
static void keep_error(struct rl_state *rl, int64_t line, const char *text, bool scored) {
    if (!rl->errors || json_array_size(rl->errors) >= RL_ERRORS_KEPT) return;
    json_t *e = json_pack("{s:I, s:o}", "line", (json_int_t)line, "error", json_string_lossy(text, strlen(text)));
    if (e && scored) json_object_set_new(e, "scored", json_true());
    json_array_append_new(rl->errors, e);
}

/* Decodes and scores samples s[0..n) of ds; a sample whose reward fails is reported and
 * left out (failed). */
static int score(struct trainer_run *r, const struct dataset *ds, struct rl_sample *s, int n, int64_t *failed,
                 int64_t *zeroed, struct smelt_error *err) {
    struct rl_state *rl = r->rl;
    TRY(score_batch(r, ds, s, n, err));
    for (int i = 0; i < n; i++) {
        s[i].reward = rl->rout[i].reward;
        s[i].failed = rl->rout[i].failed || !isfinite(s[i].reward);
        memcpy(s[i].scores, rl->rout[i].scores, sizeof s[i].scores);
        if (!s[i].failed && rl->rout[i].warning[0]) { /* a grader that could not grade it: scored 0 */
            (*zeroed)++;
            log_warn("rl: a sample of %s line %lld scored 0: %s", ds->path, (long long)ds->prompts[s[i].row].line,
                     rl->rout[i].warning);
            keep_error(rl, ds->prompts[s[i].row].line, rl->rout[i].warning, true);
        }
        if (!s[i].failed) continue;
        (*failed)++;
        log_warn("rl: the reward of a sample of %s line %lld failed: %s", ds->path,
                 (long long)ds->prompts[s[i].row].line, rl->rout[i].error);
        keep_error(rl, ds->prompts[s[i].row].line, rl->rout[i].error, false);
    }
    return SMELT_OK;
}

/* The group's sequence advantages into adv[0..G) (0 for failed samples, which the
 * group's statistics leave out); false when fewer than 2 samples were scored. PPO
 * (advantage_estimator gae): each sample's reward as it is, which its token rewards
 * take at the last token (ppo.c). */
static int group_advantages(struct trainer_run *r, const struct rl_sample *g, double *adv, bool *usable,
                            struct smelt_error *err) {
    const struct job_spec *s = r->spec;
    int G = (int)s->rl.num_generations, k = 0;
    double *vals = r->rl->group;
    if (s->rl.advantage_estimator == RL_ADV_GAE) { /* PPO: the score itself, for its token rewards */
        for (int i = 0; i < G; i++) adv[i] = g[i].failed ? 0 : g[i].reward;
        *usable = true;
        return SMELT_OK;
    }
    for (int i = 0; i < G; i++)
        if (!g[i].failed) vals[k++] = g[i].reward;
    *usable = k >= 2;
    for (int i = 0; i < G; i++) adv[i] = 0;
    if (!*usable) return SMELT_OK;
    switch (s->rl.advantage_estimator) {
    case RL_ADV_RLOO: TRY(rl_rloo_advantages(vals, 1, k, vals, err)); break;
    case RL_ADV_REINFORCE_PP: /* REINFORCE++-baseline: group-centred, whitened over the batch later */
        TRY(rl_group_advantages(vals, 1, k, false, 0, vals, err));
        break;
    default: TRY(rl_group_advantages(vals, 1, k, s->rl.scale_rewards, 1e-4, vals, err)); break;
    }
    for (int i = 0, j = 0; i < G; i++)
        if (!g[i].failed) adv[i] = vals[j++];
    return SMELT_OK;
}

/* Whether a group teaches nothing: fewer than two scored samples, or equal rewards. */
static bool group_degenerate(const struct rl_sample *g, int G) {
    double rewards[256];
    int k = 0;
    for (int i = 0; i < G; i++)
        if (!g[i].failed) rewards[k++] = g[i].reward;
    return k < 2 || rl_group_is_degenerate(rewards, k);
}

struct iteration {
    int n_samples, n_trained, n_prompts, rounds;
    double verifier_sum[REWARD_MAX_VERIFIERS];   /* each verifier's scores, every round */
    int64_t verifier_n[REWARD_MAX_VERIFIERS];
    int64_t failed, zeroed, groups, groups_degenerate, gen_tokens, trained_tokens;
    double t_generate, t_score, t_reference, t_update, t_sync;
    int64_t sync_bytes;            /* per worker: the model's or the adapter's size */
    int loader_moves;              /* prompt batches drawn: the other ranks' loaders move as many */
};

/* An iteration whose every reward failed trains nothing. RL_MAX_ALL_FAILED of them in a
 * row mean the reward cannot score this job's samples (a service that is down or answers
 * garbage, a grader failing on every output): the job fails saying so, rather than
 * running on to "succeeded" with nothing learned. */
static int check_rewards_work(struct rl_state *rl, const struct iteration *it, struct smelt_error *err) {
    rl->all_failed_streak = it->n_samples > 0 && it->failed == it->n_samples ? rl->all_failed_streak + 1 : 0;
    if (rl->all_failed_streak < RL_MAX_ALL_FAILED) return SMELT_OK;
    const char *why = json_string_value(json_object_get(json_array_get(rl->errors, 0), "error"));
    return error_set(err, SMELT_EINVAL, "rl: the reward of every sample failed in %d iterations in a row; the "
                     "last reason: %s", rl->all_failed_streak, why ? why : "(not kept)");
}

/* Samples from the next prompt batch(es) into rl->samples, scored; with dynamic sampling,
 * groups whose rewards are all equal are dropped and more prompts drawn (at most
 * RL_ROUNDS rounds). */
static int collect(struct trainer_run *r, int64_t version, struct iteration *it, struct smelt_error *err) {
    const struct job_spec *s = r->spec;
    struct rl_state *rl = r->rl;
    int G = (int)s->rl.num_generations;
    struct sample_params sp = sampling(s);
    rl_samples_clear(rl->samples, rl->cap * RL_ROUNDS);
    int64_t kept_groups = 0;
    for (it->rounds = 0; it->rounds < RL_ROUNDS && kept_groups < s->hp.batch_size; it->rounds++) {
        struct rl_sample *out = rl->samples + it->n_samples;
        int n_seqs;
        double t0 = now_s();
        if (it->rounds == 0 && rl->n_ahead > 0) { /* generated during the last update */
            n_seqs = rl->n_ahead / G;
            memcpy(out, rl->ahead, (size_t)rl->n_ahead * sizeof *out);
            memset(rl->ahead, 0, (size_t)rl->n_ahead * sizeof *rl->ahead);
            rl->n_ahead = 0;
        } else {
            const struct dataset_batch *b;
            TRY(dataset_loader_next(r->loader, &b, err));
            it->loader_moves++;
            n_seqs = b->n_seqs;
            TRY(rl_generate(r, r->train, b->rows, n_seqs, G, &sp, s->rl.max_new_tokens, version, out, err));
        }
        double t1 = now_s();
        TRY(score(r, r->train, out, n_seqs * G, &it->failed, &it->zeroed, err));
        it->t_generate += t1 - t0;
        it->t_score += now_s() - t1;
        it->n_samples += n_seqs * G;
        for (int i = 0; i < n_seqs * G; i++)
            for (int v = 0; v < reward_stage_count(rl->reward); v++)
                if (isfinite(rl->rout[i].scores[v])) {
                    it->verifier_sum[v] += rl->rout[i].scores[v];
                    it->verifier_n[v]++;
                }
        it->n_prompts += n_seqs;
        for (int p = 0; p < n_seqs; p++) {
            bool degenerate = group_degenerate(out + p * G, G);
            it->groups++;
            it->groups_degenerate += degenerate;
            kept_groups += !(degenerate && s->rl.dynamic_sampling);
        }
        if (!s->rl.dynamic_sampling) break;
    }
    return SMELT_OK;
}

/* Which samples train, in order, with their tokens laid out in the per-token arrays:
 * not those whose reward failed, nor truncated ones under mask_truncated_completions,
 * nor (dynamic sampling) groups whose rewards are all equal. */
static int select_trained(struct trainer_run *r, struct iteration *it, struct smelt_error *err) {
    const struct job_spec *s = r->spec;
    struct rl_state *rl = r->rl;
    int G = (int)s->rl.num_generations;
    double adv[256];
    int64_t off = 0;
    it->n_trained = 0;
    for (int g = 0; g < it->n_samples / G; g++) {
        struct rl_sample *grp = rl->samples + g * G;
        bool usable;
        TRY(group_advantages(r, grp, adv, &usable, err));
        if (s->rl.dynamic_sampling && (!usable || group_degenerate(grp, G))) continue;
        for (int i = 0; i < G; i++) {
            struct rl_sample *x = &grp[i];
            x->trained = !x->failed && x->n > 0 &&
                         !(s->rl.mask_truncated_completions && strcmp(x->finish_reason, "length") == 0);
            if (!x->trained) continue;
            x->adv = adv[i];
            x->off = off;
            rl->start[it->n_trained] = off;
            memcpy(rl->rollout + off, x->rollout_logp, (size_t)x->n * sizeof(float));
            /* A sample of an older version (max_staleness): its ratios are taken against
             * the logprobs of the version that generated it, which only the rollout has. */
            if (x->version < rl->version) memcpy(rl->old + off, x->rollout_logp, (size_t)x->n * sizeof(float));
            for (int64_t j = 0; j < x->n; j++) {
                rl->mask[off + j] = 1;
                rl->adv[off + j] = x->adv;
            }
            rl->trained[it->n_trained++] = *x;
            off += x->n;
        }
    }
    rl->start[it->n_trained] = off;
    it->trained_tokens = off;
    return SMELT_OK;
}

/* One packed batch through `model` (the policy or a full fine-tune's reference: the same
 * config, so the run's activation buffers serve both) into host_logprobs. */
static int forward_logprobs(struct trainer_run *r, struct model *model, const struct dataset_batch *b,
                            struct smelt_error *err) {
    struct model_batch mb = run_model_batch(b);
    int64_t T = b->n_tokens;
    struct tensor lp = tensor_make(r->logprobs.backend, DTYPE_F32, r->logprobs.data, 1, &T);
    TRY(model_forward(model, r->acts, &mb, &lp, NULL, NULL, err));
    struct tensor host = tensor_f32(r->host_logprobs, 1, &T);
    return tensor_copy(&host, &lp, err);
}

/* A forward pass of `model` over every trained sample (no backward) into dst, per token. */
static int forward_all(struct trainer_run *r, struct model *model, int n, float *dst, struct smelt_error *err) {
    struct rl_sample *ts = r->rl->trained;
    if (r->lora) lora_set_training(r->lora, false);
    int rc = SMELT_OK;
    for (int i = 0; i < n && !rc;) {
        int k = rl_batch_fit(r, r->train, ts + i, n - i);
        struct dataset_batch b;
        rc = rl_batch_build(r, r->train, ts + i, k, &b, err);
        if (!rc) rc = forward_logprobs(r, model, &b, err);
        if (!rc) rl_batch_gather(r, r->train, &b, ts + i, k, dst);
        i += k;
    }
    if (r->lora) lora_set_training(r->lora, true);
    return rc;
}

/* The reference's logprobs: the base with the adapter off (LoRA), or the copy of the
 * starting weights (a full fine-tune) on the policy's activation buffers (the policy's
 * own forward comes after, for its backward). */
static int reference_pass(struct trainer_run *r, int n, struct smelt_error *err) {
    if (!r->lora) return forward_all(r, r->rl->ref_model, n, r->rl->ref, err);
    lora_detach(r->lora);
    int rc = forward_all(r, r->model, n, r->rl->ref, err);
    int arc = lora_attach(r->lora, err);
    return rc ? rc : arc;
}

/* A full fine-tune's reference: a copy of the weights before any update (prepare runs
 * before a checkpoint is restored, so a resumed job copies the same starting weights). */
static int copy_reference(struct trainer_run *r, struct smelt_error *err) {
    TRY(model_init_random(&r->model->config, 0, r->model->backend, &r->rl->ref_model, err));
    return tensor_copy(&r->rl->ref_model->weights, &r->model->weights, err);
}

/* REINFORCE++: token-level returns (the KL to the reference in the reward when beta >
 * 0), whitened over the batch: they replace the per-token advantages. */
static int reinforce_pp(struct trainer_run *r, int n, struct smelt_error *err) {
    struct rl_state *rl = r->rl;
    double *rewards = malloc((size_t)(n ? n : 1) * sizeof *rewards);
    double *returns = malloc((size_t)(rl->start[n] ? rl->start[n] : 1) * sizeof *returns);
    int rc = rewards && returns ? SMELT_OK : error_set(err, SMELT_ENOMEM, "rl: out of memory");
    for (int i = 0; !rc && i < n; i++) rewards[i] = rl->trained[i].adv;
    if (!rc)
        rc = rl_reinforce_pp_advantages(n, rl->start, rl->mask, rl->old, r->spec->rl.beta > 0 ? rl->ref : NULL,
                                        rewards, r->spec->rl.beta, r->spec->rl.kl_estimator, 1.0, rl->adv, returns,
                                        err);
    free(rewards);
    free(returns);
    return rc;
}

/* ---- the update ---- */

struct update_totals {
    struct rl_policy_stats ps;
    double loss;
    int64_t tokens;     /* prompt + generated tokens through the model */
    int64_t micro;
    bool old_from_update;     /* old logprobs were the update's own forward (each rank: its micro-batches) */
    struct ppo_iteration ppo; /* PPO: the critic's values, advantages and steps */
};

/* Offsets of samples [a, b) relative to a's first token (the losses' layout). */
static const int64_t *relative_starts(struct rl_state *rl, int a, int b, int64_t *rel) {
    for (int i = a; i <= b; i++) rel[i - a] = rl->start[i] - rl->start[a];
    return rel;
}

static int micro_step(struct trainer_run *r, int a, int k, struct rl_norm norm, bool old_is_current,
                      struct update_totals *tot, struct smelt_error *err) {
    struct rl_state *rl = r->rl;
    struct rl_sample *ts = rl->trained + a;
    struct dataset_batch b;
    double nll;
    TRY(rl_batch_build(r, r->train, ts, k, &b, err));
    if (r->lora) lora_set_dropout_seed(r->lora, run_dropout_seed(r, tot->micro));
    TRY(run_forward_batch(r, &b, &nll, err));
    rl_batch_gather(r, r->train, &b, ts, k, rl->cur);
    int64_t o = rl->start[a];
    for (int i = 0; old_is_current && i < k; i++)
        if (ts[i].version == rl->version)
            memcpy(rl->old + rl->start[a + i], rl->cur + rl->start[a + i],
                   (size_t)(rl->start[a + i + 1] - rl->start[a + i]) * sizeof *rl->old);
    int64_t *rel = malloc((size_t)(k + 1) * sizeof *rel);
    if (!rel) return error_set(err, SMELT_ENOMEM, "rl: out of memory");
    struct rl_seqs seqs = {.n_seq = k, .start = relative_starts(rl, a, a + k, rel), .logp = rl->cur + o,
                           .old_logp = rl->old + o, .ref_logp = rl->loss.beta > 0 ? rl->ref + o : NULL,
                           .rollout_logp = rl->loss.tis_cap > 0 ? rl->rollout + o : NULL, .mask = rl->mask + o,
                           .adv = rl->adv + o};
    struct rl_policy_stats ps;
    int rc = rl_policy_loss(&rl->loss, &seqs, norm, rl->coef + o, &ps, err);
    free(rel);
    TRY(rc);
    rl_policy_stats_merge(&tot->ps, &ps);
    tot->loss += ps.loss;
    tot->tokens += b.n_tokens;
    tot->micro++;
    rl_batch_scatter(r, r->train, &b, ts, k, rl->coef);
    return run_backward_tokens(r, &b, r->host_logprobs, err);
}

static int norm_of(struct rl_state *rl, int a, int b, struct rl_norm *norm, struct smelt_error *err) {
    *norm = (struct rl_norm){0};
    int64_t *rel = malloc((size_t)(b - a + 1) * sizeof *rel);
    if (!rel) return error_set(err, SMELT_ENOMEM, "rl: out of memory");
    int rc = rl_norm_accumulate(norm, b - a, relative_starts(rl, a, b, rel), rl->mask + rl->start[a], err);
    free(rel);
    return rc;
}

/* One optimizer step on trained samples [a, b). */
static int minibatch_step(struct trainer_run *r, int a, int b, int n, bool old_is_current,
                          struct update_totals *tot, struct step_stats *st, struct smelt_error *err) {
    struct rl_state *rl = r->rl;
    struct rl_norm norm;
    if (rl_loss_type_norm_scope(rl->loss.type) == RL_NORM_GENERATION_BATCH) TRY(norm_of(rl, 0, n, &norm, err));
    else TRY(norm_of(rl, a, b, &norm, err));
    if (b > a && norm.tokens > 0 && rl->critic) TRY(ppo_critic_minibatch(r, a, b, &tot->ppo, err));
    /* Nothing to learn from, or (PPO's critic warmup) the critic alone learns: the step
     * passes without an update of the policy. */
    if (b <= a || norm.tokens == 0 || rl->policy_frozen) {
        st->lr = lr_at(&r->schedule, r->step + 1);
        st->grad_norm = 0;
        st->tokens = 0;
        r->step++;
        return SMELT_OK;
    }
    TRY(tensor_zero(r->grads, err));
    /* Several ranks: each runs its share of the step's micro-batches (dist_mine; the
     * dropout seeds stay those of the global index) and the sums are added over them. */
    bool ranks = r->dist.ranks > 1;
    struct update_totals mine = {.micro = tot->micro}, *acc = ranks ? &mine : tot;
    int64_t tokens_before = acc->tokens;
    for (int i = a, j = 0; i < b; j++) {
        int k = rl_batch_fit(r, r->train, rl->trained + i, b - i);
        if (dist_mine(&r->dist, j)) TRY(micro_step(r, i, k, norm, old_is_current, acc, err));
        else acc->micro++;
        i += k;
    }
    tot->old_from_update |= old_is_current;
    st->tokens = acc->tokens - tokens_before;
    if (ranks) {
        TRY(rl_dist_policy_totals(&r->dist, &mine.ps, &mine.loss, &mine.tokens, err));
        rl_policy_stats_merge(&tot->ps, &mine.ps);
        tot->loss += mine.loss;
        tot->tokens += mine.tokens;
        tot->micro = mine.micro;
        st->tokens = mine.tokens;
    }
    return run_optimizer_step(r, 1.0, st, err);
}

/* ppo_epochs passes over the trained samples, in minibatches: one optimizer step each.
 * With a single step the ratios are taken against the policy itself (TRL's rule: old =
 * current, detached), so no separate pass recomputes old logprobs. */
static int update(struct trainer_run *r, int n, struct update_totals *tot, struct step_stats *st,
                  struct smelt_error *err) {
    const struct job_spec *s = r->spec;
    int M = (int)s->rl.minibatches;
    bool single = r->rl->old_in_update;
    int64_t tokens = 0;
    for (int64_t e = 0; e < s->rl.ppo_epochs; e++)
        for (int m = 0; m < M; m++) {
            int a = (int)((int64_t)n * m / M), b = (int)((int64_t)n * (m + 1) / M);
            TRY(minibatch_step(r, a, b, n, single, tot, st, err));
            tokens += st->tokens;
        }
    st->tokens = tokens;
    return SMELT_OK;
}

/* The split placement: the updated weights to every worker, as the next version. */
static int sync_workers(struct trainer_run *r, int64_t version, struct iteration *it, struct smelt_error *err) {
    struct weightsync_report rep = {0};
    double t0 = now_s();
    TRY(rl_workers_sync(r->rl->workers, r, version, &rep, err));
    it->t_sync = now_s() - t0;
    it->sync_bytes = rep.bytes;
    return SMELT_OK;
}

/* ---- metrics ---- */

static void put(json_t *o, const char *key, double v) { json_object_set_new(o, key, isfinite(v) ? json_real(v) : json_null()); }

/* Mean, standard deviation, min and max of the scored samples' rewards. */
static void reward_metrics(struct trainer_run *r, const struct rl_sample *s, int n, json_t *m) {
    double sum = 0, sq = 0, max = -INFINITY, min = INFINITY;
    int64_t k = 0;
    for (int i = 0; i < n; i++)
        if (!s[i].failed) {
            sum += s[i].reward;
            sq += s[i].reward * s[i].reward;
            if (s[i].reward > max) max = s[i].reward;
            if (s[i].reward < min) min = s[i].reward;
            k++;
        }
    double mean = k ? sum / (double)k : NAN;
    put(m, "reward", mean);
    put(m, "reward_std", k > 1 ? sqrt(fmax(0, (sq - (double)k * mean * mean) / (double)(k - 1))) : NAN);
    put(m, "reward_min", k ? min : NAN);
    put(m, "reward_max", k ? max : NAN);
    (void)r;
}

static void length_metrics(const struct rl_sample *s, int n, json_t *m, int64_t *gen_tokens) {
    int64_t total = 0, max = 0, clipped = 0;
    for (int i = 0; i < n; i++) {
        total += s[i].n;
        if (s[i].n > max) max = s[i].n;
        clipped += strcmp(s[i].finish_reason, "length") == 0;
    }
    *gen_tokens = total;
    put(m, "completions/mean_length", n ? (double)total / n : NAN);
    json_object_set_new(m, "completions/max_length", json_integer(max));
    put(m, "completions/clipped_ratio", n ? (double)clipped / n : NAN);
}

static void verifier_metrics(struct trainer_run *r, const struct iteration *it, json_t *m) {
    struct rl_state *rl = r->rl;
    for (int v = 0; v < reward_stage_count(rl->reward); v++) {
        char key[REWARD_NAME_BYTES + 32];
        snprintf(key, sizeof key, "rewards/%s/mean", reward_stage_name(rl->reward, v));
        put(m, key, it->verifier_n[v] ? it->verifier_sum[v] / (double)it->verifier_n[v] : NAN);
    }
}

static void loss_metrics(const struct update_totals *t, int64_t steps, json_t *m) {
    const struct rl_policy_stats *p = &t->ps;
    double nt = p->n_tokens ? (double)p->n_tokens : NAN;
    put(m, "kl", p->kl_sum / nt);
    put(m, "ppo_kl", p->ppo_kl_sum / nt);
    put(m, "clip_ratio/low_mean", (double)p->clip_low / nt);
    put(m, "clip_ratio/high_mean", (double)p->clip_high / nt);
    put(m, "clip_ratio/region_mean", (double)(p->clip_low + p->clip_high) / nt);
    put(m, "clip_ratio/dual_mean", (double)p->clip_dual / nt);
    put(m, "ratio_mean", p->ratio_sum / nt);
    put(m, "ratio_max", p->n_tokens ? p->ratio_max : NAN);
    put(m, "tis/weight_mean", p->tis_weight_sum / nt);
    put(m, "tis/cut_ratio", (double)(p->tis_truncated + p->tis_masked) / nt);
    (void)steps;
}

json_t *rl_rewards_json(const struct rl_sample *s, int n, int cap) {
    json_t *arr = json_array();
    int k = n < cap ? n : cap;
    for (int j = 0; arr && j < k; j++) {
        const struct rl_sample *x = &s[(int)((int64_t)j * n / k)]; /* evenly spaced when n > cap */
        if (json_array_append_new(arr, !x->failed && isfinite(x->reward) ? json_real(x->reward) : json_null())) {
            json_decref(arr);
            return NULL;
        }
    }
    return arr;
}

/* A sample's score from each verifier, by its metrics name (null where it failed). */
static json_t *sample_scores(const struct reward_stage *rs, const struct rl_sample *x) {
    json_t *o = json_object();
    for (int v = 0; o && v < reward_stage_count(rs); v++)
        json_object_set_new(o, reward_stage_name(rs, v), isfinite(x->scores[v]) ? json_real(x->scores[v])
                                                                                  : json_null());
    return o;
}

static json_t *sample_json(struct trainer_run *r, const struct rl_sample *x) {
    char *prompt = NULL;
    size_t len;
    struct smelt_error ignore = {0};
    const struct dataset_prompt *p = &r->train->prompts[x->row];
    if (tokenizer_decode(r->tok, p->ids, (size_t)p->n, false, &prompt, &len, &ignore)) prompt = NULL;
    json_t *o = json_pack("{s:o, s:o, s:o, s:s, s:I, s:o*}", "prompt",
                          prompt ? json_string_lossy(prompt, len) : json_null(), "completion",
                          json_string_lossy(x->text ? x->text : "", x->text ? strlen(x->text) : 0), "reward",
                          !x->failed && isfinite(x->reward) ? json_real(x->reward) : json_null(), "finish_reason",
                          x->finish_reason, "line", (json_int_t)p->line, "scores",
                          sample_scores(r->rl->reward, x));
    free(prompt);
    return o;
}

/* A few samples of the iteration, for the page (the first of the first groups), and the
 * rewards of all of them (bounded: the line stays small). */
static void samples_line(struct trainer_run *r, int n) {
    struct rl_state *rl = r->rl;
    json_t *arr = json_array();
    int G = (int)r->spec->rl.num_generations;
    for (int i = 0; arr && i < n && json_array_size(arr) < 3; i += G) {
        json_t *o = sample_json(r, &rl->samples[i]);
        if (o) json_array_append_new(arr, o);
    }
    run_metrics_emit(r, json_pack("{s:s, s:I, s:o, s:o*, s:I}", "type", "samples", "step", (json_int_t)r->step,
                                  "samples", arr, "rewards", rl_rewards_json(rl->samples, n, RL_SAMPLES_REWARDS_KEPT),
                                  "rewards_total", (json_int_t)n));
}

/* ---- the step (one iteration) and its validation ---- */

/* The held-out score before any update: what the run's improvement is measured from. */
static int start_eval(struct trainer_run *r, struct smelt_error *err) {
    r->rl->recorded_start_eval = true;
    if (r->step > 0 || !r->val) return SMELT_OK;
    void *metrics;
    double loss;
    TRY(rl_validate(r, &metrics, &loss, err));
    json_t *line = json_pack("{s:s, s:I}", "type", "eval", "step", (json_int_t)0);
    if (line && metrics) json_object_update_new(line, metrics);
    else json_decref(metrics);
    run_metrics_emit(r, line);
    return SMELT_OK;
}

/* The passes before the update: the reference's logprobs (beta > 0), the old policy's
 * (when the update takes several steps, or a reward needs them first, or the policy
 * does not step this iteration), REINFORCE++'s returns, PPO's critic and GAE. */
static int before_update(struct trainer_run *r, int n, struct update_totals *tot, struct smelt_error *err) {
    const struct job_spec *s = r->spec;
    struct rl_state *rl = r->rl;
    bool reinforce = s->rl.advantage_estimator == RL_ADV_REINFORCE_PP;
    bool kl_reward = rl->critic && s->rl.kl_in_reward && s->rl.beta > 0;
    if (s->rl.beta > 0) TRY(reference_pass(r, n, err));
    if (!rl->old_in_update || reinforce || kl_reward || rl->policy_frozen) {
        TRY(forward_all(r, r->model, n, rl->old, err));
        for (int i = 0; i < n; i++) /* samples of an older version keep their generator's */
            if (rl->trained[i].version < rl->version)
                memcpy(rl->old + rl->start[i], rl->rollout + rl->start[i],
                       (size_t)(rl->start[i + 1] - rl->start[i]) * sizeof *rl->old);
    }
    if (reinforce) TRY(reinforce_pp(r, n, err));
    if (rl->critic) TRY(ppo_advantages(r, n, &tot->ppo, err));
    return SMELT_OK;
}

/* max_staleness 1: the next iteration's prompts go to the workers now, to be generated
 * by this version while the update runs (not after the run's last iteration). */
static int submit_ahead(struct trainer_run *r, struct smelt_error *err) {
    const struct job_spec *s = r->spec;
    struct rl_state *rl = r->rl;
    if (s->rl.max_staleness == 0 || (rl->version + 1) * rl->steps_per_iteration >= r->total_steps) return SMELT_OK;
    const struct dataset_batch *b;
    TRY(dataset_loader_next(r->loader, &b, err));
    if (r->dist.rank != 0) return SMELT_OK; /* rank 0 generates; the others' cursor moves as its */
    struct sample_params sp = sampling(s);
    int G = (int)s->rl.num_generations;
    TRY(rl_generate_submit(r, r->train, b->rows, b->n_seqs, G, &sp, s->rl.max_new_tokens, rl->version, rl->ahead,
                           err));
    rl->n_ahead = b->n_seqs * G;
    rl->ahead_in_flight = true;
    return SMELT_OK;
}

/* The samples submit_ahead asked for, once the update is done (before the weight sync:
 * a worker never mixes two versions in one batch). */
static int collect_ahead(struct trainer_run *r, struct iteration *it, struct smelt_error *err) {
    struct rl_state *rl = r->rl;
    if (!rl->ahead_in_flight) return SMELT_OK;
    rl->ahead_in_flight = false;
    double t0 = now_s();
    int rc = rl_generate_collect(r, r->train, rl->n_ahead, (int)r->spec->rl.num_generations, rl->ahead, err);
    it->t_generate += now_s() - t0;
    if (rc) rl->n_ahead = 0;
    return rc;
}

/* The rollout/trainer mismatch over the samples of the current version: only for them
 * does the trainer hold the weights that generated them. */
static int mismatch(struct rl_state *rl, int n, struct rl_mismatch *mm, struct smelt_error *err) {
    int64_t T = rl->start[n];
    float *mask = malloc((size_t)(T ? T : 1) * sizeof *mask);
    if (!mask) return error_set(err, SMELT_ENOMEM, "rl: out of memory");
    memcpy(mask, rl->mask, (size_t)T * sizeof *mask);
    for (int i = 0; i < n; i++)
        if (rl->trained[i].version < rl->version)
            for (int64_t t = rl->start[i]; t < rl->start[i + 1]; t++) mask[t] = 0;
    int rc = rl_logprob_mismatch(rl->old, rl->rollout, mask, T, mm, err);
    free(mask);
    return rc;
}

/* How many versions behind the policy the trained samples were generated: mean, max. */
static void lag_metrics(const struct rl_state *rl, int n, json_t *m) {
    double sum = 0;
    int64_t max = 0;
    for (int i = 0; i < n; i++) {
        int64_t lag = rl->version - rl->trained[i].version;
        sum += (double)lag;
        if (lag > max) max = lag;
    }
    put(m, "version_lag", n ? sum / n : 0);
    json_object_set_new(m, "version_lag_max", json_integer(max));
}

int rl_save_state(struct trainer_run *r, const char *dir, struct smelt_error *err) {
    struct rl_state *rl = r->rl;
    SMELT_ASSERT(!rl->ahead_in_flight);
    if (rl->n_ahead == 0) return SMELT_OK;
    char path[JOB_PATH_BYTES + 64];
    TRY(path_join(path, sizeof path, dir, "rl_pending.safetensors", err));
    return rl_pending_save(path, rl->ahead, rl->n_ahead, err);
}

int rl_restore_state(struct trainer_run *r, const char *dir, struct smelt_error *err) {
    struct rl_state *rl = r->rl;
    char path[JOB_PATH_BYTES + 64];
    TRY(path_join(path, sizeof path, dir, "rl_pending.safetensors", err));
    rl_samples_clear(rl->ahead, rl->cap);
    rl->n_ahead = 0;
    if (access(path, F_OK) != 0) return SMELT_OK;
    return rl_pending_load(path, r->train, rl->cap, rl->ahead, &rl->n_ahead, err);
}

/* The iteration's scored samples: rank 0 generates and scores them (after the run's
 * first held-out evaluation), and with several ranks sends them, or its failure, to the
 * others (rl_dist_share), whose prompt cursors then move as rank 0's did. */
static int produce(struct trainer_run *r, int64_t version, struct iteration *it, struct smelt_error *err) {
    struct rl_state *rl = r->rl;
    int rc = SMELT_OK;
    if (r->dist.rank == 0) {
        if (!rl->recorded_start_eval) rc = start_eval(r, err);
        if (!rc) rc = collect(r, version, it, err);
    }
    rl->recorded_start_eval = true;
    TRY(rl_dist_share(r, rc, it, sizeof *it, it->n_samples, err));
    for (int i = 0; r->dist.rank != 0 && i < it->loader_moves; i++) {
        const struct dataset_batch *b;
        TRY(dataset_loader_next(r->loader, &b, err));
    }
    return SMELT_OK;
}

int rl_step(struct trainer_run *r, int64_t n_micro, struct step_stats *st, struct smelt_error *err) {
    (void)n_micro;
    struct rl_state *rl = r->rl;
    int64_t version = r->step / rl->steps_per_iteration;
    rl->version = version;
    struct iteration it = {0};
    json_decref(rl->errors);
    rl->errors = json_array();
    rl->policy_frozen = rl->critic && version < r->spec->rl.critic_warmup_iterations;
    TRY(produce(r, version, &it, err));
    TRY(select_trained(r, &it, err));
    int n = it.n_trained;
    struct update_totals tot = {0};
    double t0 = now_s();
    TRY(before_update(r, n, &tot, err));
    it.t_reference = now_s() - t0;
    TRY(rl_dist_lead_outcome(r, submit_ahead(r, err), err));
    t0 = now_s();
    TRY(update(r, n, &tot, st, err));
    if (tot.old_from_update) TRY(rl_dist_gather_old(r, n, err));
    it.t_update = now_s() - t0;
    int rc = collect_ahead(r, &it, err);
    if (!rc && rl->workers) rc = sync_workers(r, version + 1, &it, err);
    TRY(rl_dist_lead_outcome(r, rc, err));
    struct rl_mismatch mm = {0};
    TRY(mismatch(rl, n, &mm, err));

    json_t *m = json_object();
    if (!m) return error_set(err, SMELT_ENOMEM, "rl: out of memory");
    st->loss = rl->policy_frozen ? NAN : tot.loss / (double)rl->steps_per_iteration;
    st->trained = it.trained_tokens;
    reward_metrics(r, rl->samples, it.n_samples, m);
    verifier_metrics(r, &it, m);
    length_metrics(rl->samples, it.n_samples, m, &it.gen_tokens);
    loss_metrics(&tot, rl->steps_per_iteration, m);
    bool groups = r->spec->rl.advantage_estimator != RL_ADV_GAE; /* PPO has none */
    put(m, "frac_reward_zero_std", it.groups && groups ? (double)it.groups_degenerate / (double)it.groups : NAN);
    put(m, "rollout/logprob_diff_mean", mm.n_tokens ? mm.mean_abs : NAN);
    put(m, "rollout/logprob_diff_max", mm.n_tokens ? mm.max_abs : NAN);
    put(m, "rollout/kl", mm.n_tokens ? mm.kl_k3 : NAN);
    json_object_set_new(m, "iteration", json_integer(version + 1));
    json_object_set_new(m, "policy_version", json_integer(version + 1));
    lag_metrics(rl, n, m);
    json_object_set_new(m, "samples", json_integer(it.n_samples));
    json_object_set_new(m, "samples_trained", json_integer(n));
    json_object_set_new(m, "samples_failed", json_integer(it.failed));
    json_object_set_new(m, "samples_graded_zero", json_integer(it.zeroed));
    json_object_set_new(m, "prompts", json_integer(it.n_prompts));
    put(m, "time/generate_s", it.t_generate);
    put(m, "time/score_s", it.t_score);
    put(m, "time/reference_s", it.t_reference);
    put(m, "time/update_s", it.t_update);
    put(m, "time/sync_s", it.t_sync); /* the sync's time (the sync_ms), begin to the last ack */
    json_object_set_new(m, "sync_bytes", json_integer(it.sync_bytes));
    json_object_set_new(m, "sync_transport", json_string(rl->workers ? rl_workers_transport(rl->workers) : "none"));
    put(m, "generate_tokens_per_s", it.t_generate > 0 ? (double)it.gen_tokens / it.t_generate : NAN);
    if (rl->critic) ppo_metrics(&tot.ppo, m);
    st->metrics = m;
    if (r->dist.rank == 0) samples_line(r, it.n_samples);
    if (it.failed || it.zeroed) /* one line per iteration: the service records a line per (type, step) */
        run_metrics_emit(r, json_pack("{s:s, s:I, s:s, s:I, s:I, s:I, s:O}", "type", "sample_errors", "step",
                                      (json_int_t)r->step, "file", r->train->path, "count",
                                      (json_int_t)(it.failed + it.zeroed), "failed", (json_int_t)it.failed, "zeroed",
                                      (json_int_t)it.zeroed, "errors", rl->errors));
    rc = check_rewards_work(rl, &it, err);
    if (rc) { /* the job ends here: no train line for this iteration */
        json_decref(st->metrics);
        st->metrics = NULL;
    }
    return rc;
}

/* Greedy generation on the held-out prompts (at most eval.accuracy_examples when set):
 * the mean reward and the pass rate of the first verifier ("accuracy"). */
int rl_validate(struct trainer_run *r, void **metrics, double *val_loss, struct smelt_error *err) {
    struct rl_state *rl = r->rl;
    *metrics = NULL;
    *val_loss = NAN;
    if (!r->val) return SMELT_OK;
    int64_t n = r->val->n, lim = r->spec->eval.accuracy_examples;
    if (lim > 0 && lim < n) n = lim;
    if (n > rl->cap) n = rl->cap;
    int64_t *rows = malloc((size_t)n * sizeof *rows);
    if (!rows) return error_set(err, SMELT_ENOMEM, "rl: out of memory");
    for (int64_t i = 0; i < n; i++) rows[i] = i;
    struct rl_sample *s = rl->samples; /* free between iterations */
    rl_samples_clear(s, rl->cap * RL_ROUNDS);
    struct sample_params greedy = {.temperature = 0, .top_p = 1};
    int64_t failed = 0, version = r->step / rl->steps_per_iteration;
    int rc = rl_generate(r, r->val, rows, (int)n, 1, &greedy, r->spec->rl.max_new_tokens, version, s, err);
    free(rows);
    int64_t zeroed = 0;
    if (!rc) rc = score(r, r->val, s, (int)n, &failed, &zeroed, err);
    double sum = 0, pass = 0;
    int64_t k = 0;
    for (int64_t i = 0; !rc && i < n; i++)
        if (!s[i].failed) {
            sum += s[i].reward;
            pass += rl->rout[i].scores[0] >= 1;
            k++;
        }
    rl_samples_clear(s, (int)n);
    TRY(rc);
    json_t *m = json_object();
    if (!m) return error_set(err, SMELT_ENOMEM, "rl: out of memory");
    put(m, "val_reward", k ? sum / (double)k : NAN);
    put(m, "val_accuracy", k ? pass / (double)k : NAN);
    json_object_set_new(m, "val_samples", json_integer(n));
    json_object_set_new(m, "val_samples_failed", json_integer(failed));
    json_object_set_new(m, "val_samples_graded_zero", json_integer(zeroed));
    *metrics = m;
    return SMELT_OK;
}

const struct run_algo GRPO_ALGO = {.prepare = rl_prepare, .step = rl_step, .validate = rl_validate,
                                   .save_state = rl_save_state, .restore_state = rl_restore_state};
