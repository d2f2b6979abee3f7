/* PPO: grpo.c's iteration (prompts -> samples -> rewards -> reference and old logprobs
 * -> ppo_epochs x minibatches of clipped-surrogate steps -> weight sync), with a critic
 * (critic.c) in place of the group baseline:
 *   - before the update, the critic's values of every generated token (old values), the
 *     token rewards (the sample's score at its last token; with rl.kl_in_reward,
 *     -beta * KL(old, ref) at every token, k1 by default: OpenRLHF's compute_reward,
 *     veRL's apply_kl_penalty, TRL PPOTrainer's), GAE per sample (gamma, lambda) and
 *     the advantages whitened over the batch (veRL masked_whiten, TRL whiten);
 *   - in every minibatch, beside the policy's step, one critic step on the clipped
 *     value loss against those returns and old values;
 *   - checkpoints carry the critic's weights and moments; the output holds it in
 *     output/critic/ (a reward model's layout: smelt-model score loads it).
 * docs/algorithms.md (PPO) gives the formulas and their TRL / OpenRLHF / veRL names. */
#include "trainer/trainer_internal.h"

#include <jansson.h>
#include <math.h>
#include <time.h>

#include "common/common.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int ppo_prepare(struct trainer_run *r, struct smelt_error *err) {
    if (r->model->config.score_head)
        return error_set_field(err, SMELT_EINVAL, "model",
                               "model: %s is a sequence classifier (%s), which cannot generate: a ppo policy is a "
                               "causal LM (a reward model goes to rl.critic_model)", r->spec->model,
                               r->model->config.architecture);
    TRY(rl_prepare(r, err));
    return critic_create(r, r->rl->cap_tokens, &r->rl->critic, err);
}

/* Sample i's token rewards and GAE: its advantages into rl->adv, returns into the critic's. */
static int sample_gae(struct trainer_run *r, int i, struct ppo_iteration *pi, struct smelt_error *err) {
    const struct job_spec *s = r->spec;
    struct rl_state *rl = r->rl;
    struct critic *c = rl->critic;
    int64_t o = rl->start[i], len = rl->start[i + 1] - o;
    double beta = s->rl.kl_in_reward ? s->rl.beta : 0;
    for (int64_t t = o; beta > 0 && t < o + len; t++)
        pi->kl_sum += rl_kl_estimate(s->rl.kl_estimator, rl->old[t], rl->ref[t], NULL);
    TRY(rl_token_rewards(rl->old + o, beta > 0 ? rl->ref + o : NULL, rl->mask + o, len, rl->trained[i].adv, beta,
                         s->rl.kl_estimator, c->rewards + o, err));
    return rl_gae(c->old + o, c->rewards + o, rl->mask + o, len, s->rl.gamma, s->rl.lambda, rl->adv + o,
                  c->returns + o, err);
}

int ppo_advantages(struct trainer_run *r, int n, struct ppo_iteration *pi, struct smelt_error *err) {
    struct rl_state *rl = r->rl;
    struct critic *c = rl->critic;
    double t0 = now_s();
    TRY(critic_values(r, n, c->old, err));
    for (int i = 0; i < n; i++) TRY(error_wrap(err, sample_gae(r, i, pi, err), "ppo: sample %d", i));
    int64_t tokens = rl->start[n];
    for (int64_t t = 0; t < tokens; t++) {
        pi->value_sum += c->old[t];
        pi->returns_sum += c->returns[t];
        pi->adv_sum += rl->adv[t];
    }
    pi->tokens = tokens;
    pi->kl_in_reward = r->spec->rl.kl_in_reward && r->spec->rl.beta > 0;
    /* A single token has no variance to whiten by: it keeps its advantage. */
    if (r->spec->rl.whiten_advantages && tokens >= 2) TRY(rl_whiten(rl->adv, rl->mask, tokens, true, err));
    pi->t_critic += now_s() - t0;
    return SMELT_OK;
}

int ppo_critic_minibatch(struct trainer_run *r, int a, int b, struct ppo_iteration *pi, struct smelt_error *err) {
    double t0 = now_s();
    TRY(critic_step(r, a, b, &pi->ct, err));
    pi->t_critic += now_s() - t0;
    return SMELT_OK;
}

static void put(json_t *o, const char *key, double v) { json_object_set_new(o, key, isfinite(v) ? json_real(v) : json_null()); }

void ppo_metrics(const struct ppo_iteration *pi, json_t *m) {
    const struct critic_totals *ct = &pi->ct;
    double nt = pi->tokens ? (double)pi->tokens : NAN, steps = ct->steps ? (double)ct->steps : NAN;
    double vt = ct->n_tokens ? (double)ct->n_tokens : NAN;
    put(m, "critic/value_mean", pi->value_sum / nt);
    put(m, "critic/returns_mean", pi->returns_sum / nt);
    put(m, "critic/advantages_mean", pi->adv_sum / nt);
    put(m, "critic/vf_loss", ct->loss / steps);
    put(m, "critic/vf_clipfrac", (double)ct->clipped / vt);
    put(m, "critic/vpred_mean", ct->value_sum / vt);
    put(m, "critic/grad_norm", ct->grad_norm_sum / steps);
    put(m, "time/critic_s", pi->t_critic);
    if (pi->kl_in_reward) put(m, "kl", pi->kl_sum / nt);
}

/* ---- checkpoints and outputs ---- */

static int ppo_save_state(struct trainer_run *r, const char *dir, struct smelt_error *err) {
    TRY(critic_save_state(r->rl->critic, dir, err));
    return rl_save_state(r, dir, err);
}

static int ppo_restore_state(struct trainer_run *r, const char *dir, struct smelt_error *err) {
    TRY(critic_restore_state(r->rl->critic, dir, err));
    return rl_restore_state(r, dir, err);
}

/* output/critic/: the critic as a reward model's directory (config, weights, tokenizer). */
static int ppo_save_outputs(struct trainer_run *r, const char *out, struct smelt_error *err) {
    char dir[JOB_PATH_BYTES + 128];
    TRY(path_join(dir, sizeof dir, out, "critic", err));
    TRY(dir_create_all(dir, err));
    TRY(model_save(r->rl->critic->model, dir, r->spec->save_bf16, err));
    return run_copy_tokenizer_files(r, dir, err);
}

const struct run_algo PPO_ALGO = {.prepare = ppo_prepare, .step = rl_step, .validate = rl_validate,
                                  .save_state = ppo_save_state, .restore_state = ppo_restore_state,
                                  .save_outputs = ppo_save_outputs};
