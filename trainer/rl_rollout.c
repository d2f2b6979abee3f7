/* Generation for the RL loop: the prompts of an iteration, n samples each, through the
 * paged engine.
 *   Colocated placement: the engine runs in the trainer's process on the trainer's own
 *   model (one copy of the weights, the adapter applied unmerged), and is created for
 *   each generation and freed before the update, so its KV cache is not held while the
 *   trainer's activations are.
 *   Split placement: the same requests go to the smelt-rollout workers (rl_workers.c),
 *   whose engines are set up as the colocated one is (rl_engine_config), so that one
 *   worker makes the same samples.
 *
 * Every sample's stream is seeded from (job seed, policy version, prompt row, sample):
 * a resumed job draws the same samples as one never stopped. */
#include "trainer/trainer_internal.h"

#include <stdlib.h>

#include "common/common.h"
#include "rollout/rollout.h"

/* 63 bits: the workers' protocol carries a seed as a JSON integer (at most 2^63 - 1),
 * and both placements must draw the same streams. */
uint64_t rl_sample_seed(const struct trainer_run *r, int64_t version, int64_t row) {
    uint64_t z = rng_mix64(r->spec->seed ^ 0x67e9e7a7e5eedull);
    z = rng_mix64(z ^ ((uint64_t)version + RNG_GOLDEN));
    return rng_mix64(z ^ ((uint64_t)row * RNG_GOLDEN + 1)) >> 1;
}

/* The ids that end a sample: the model's eos ids and the tokenizer's. */
void rl_stop_ids(const struct model *m, const struct tokenizer *tok, struct rollout_request *q) {
    const struct model_config *c = &m->config;
    int64_t cand[MODEL_CONFIG_MAX_EOS + 1];
    int n = 0;
    for (int i = 0; i < c->n_eos_token_ids; i++) cand[n++] = c->eos_token_ids[i];
    cand[n++] = tokenizer_special_ids(tok)->eos;
    for (int i = 0; i < n && q->n_stop_ids < ROLLOUT_MAX_STOP; i++) {
        bool have = cand[i] < 0 || cand[i] >= c->vocab_size;
        for (int k = 0; k < q->n_stop_ids && !have; k++) have = q->stop_ids[k] == cand[i];
        if (!have) q->stop_ids[q->n_stop_ids++] = (int32_t)cand[i];
    }
}

void rl_engine_config(const struct trainer_run *r, const struct dataset *ds, int64_t n_seqs,
                      struct rollout_config *out) {
    const struct job_spec *s = r->spec;
    int64_t per_seq = rl_longest_sample(r, ds) + ROLLOUT_KV_BLOCK_TOKENS; /* a partial block each */
    int64_t need = n_seqs * per_seq * model_kv_bytes_per_token(r->model), cap = s->rl.kv_memory_mb << 20;
    *out = (struct rollout_config){.kv_memory_bytes = need < cap ? need : cap, .max_batch_tokens = 2048,
                                   .max_seqs = (int)(n_seqs < 256 ? n_seqs : 256), .prefill_chunk = 512};
}

/* Files each result as sample (request id) * n + index of out. */
static int take_results(struct rollout_engine *e, int n, struct rl_sample *out, struct smelt_error *err) {
    struct rollout_result *res;
    int k;
    TRY(rollout_engine_take(e, &res, &k, err));
    for (int i = 0; i < k; i++) {
        struct rl_sample *x = &out[res[i].request_id * (uint64_t)n + (uint64_t)res[i].sample_index];
        x->ids = res[i].ids;
        x->rollout_logp = res[i].logprobs;
        x->n = res[i].n;
        x->finish_reason = res[i].finish_reason;
        res[i].ids = NULL;
        res[i].logprobs = NULL;
    }
    rollout_results_free(res, k);
    return SMELT_OK;
}

/* The colocated placement: an engine on the trainer's model, freed before returning. */
static int generate_colocated(struct trainer_run *r, const struct dataset *ds, const struct rollout_request *q,
                              int n_prompts, int n, struct rl_sample *out, struct smelt_error *err) {
    struct rollout_config ec;
    struct rollout_engine *e;
    rl_engine_config(r, ds, (int64_t)n_prompts * n, &ec);
    TRY(error_wrap(err, rollout_engine_create(r->model, r->tok, &ec, &e, err), "rollout engine"));
    if (r->lora) lora_set_training(r->lora, false);
    int rc = SMELT_OK;
    for (int p = 0; p < n_prompts && !rc; p++) rc = rollout_engine_add(e, &q[p], err);
    while (!rc && !rollout_engine_idle(e)) {
        rc = rollout_engine_step(e, err);
        if (!rc) rc = take_results(e, n, out, err);
    }
    if (!rc) rc = take_results(e, n, out, err);
    if (r->lora) lora_set_training(r->lora, true);
    rollout_engine_free(e);
    return rc;
}

/* out[p * n + k] named for their prompt and version, and the requests for them (the
 * caller frees *q). */
static int prepare(struct trainer_run *r, const struct dataset *ds, const int64_t *rows, int n_prompts, int n,
                   const struct sample_params *sp, int64_t max_new_tokens, int64_t version, struct rl_sample *out,
                   struct rollout_request **q_out, struct smelt_error *err) {
    for (int p = 0; p < n_prompts; p++)
        for (int k = 0; k < n; k++) out[p * n + k] = (struct rl_sample){.row = rows[p], .version = version};
    struct rollout_request *q = calloc((size_t)(n_prompts > 0 ? n_prompts : 1), sizeof *q);
    if (!q) return error_set(err, SMELT_ENOMEM, "rl: out of memory");
    for (int p = 0; p < n_prompts; p++) {
        const struct dataset_prompt *dp = &ds->prompts[rows[p]];
        q[p] = (struct rollout_request){.id = (uint64_t)p, .prompt = dp->ids, .n_prompt = dp->n, .n = n,
                                        .sampling = *sp, .seed = rl_sample_seed(r, version, rows[p]),
                                        .max_new_tokens = max_new_tokens};
        rl_stop_ids(r->model, r->tok, &q[p]);
    }
    *q_out = q;
    return SMELT_OK;
}

/* Every sample of out[0..n_samples) finished. */
static int check_finished(const struct dataset *ds, const struct rl_sample *out, int n_samples, int n,
                          struct smelt_error *err) {
    for (int i = 0; i < n_samples; i++)
        if (!out[i].ids && out[i].n == 0 && !out[i].finish_reason)
            return error_set(err, SMELT_EBACKEND, "rollout: sample %d of prompt line %lld never finished", i % n,
                             (long long)ds->prompts[out[i].row].line);
    return SMELT_OK;
}

int rl_generate(struct trainer_run *r, const struct dataset *ds, const int64_t *rows, int n_prompts, int n,
                const struct sample_params *sp, int64_t max_new_tokens, int64_t version, struct rl_sample *out,
                struct smelt_error *err) {
    struct rollout_request *q;
    TRY(prepare(r, ds, rows, n_prompts, n, sp, max_new_tokens, version, out, &q, err));
    int rc = r->spec->rl.placement == RL_PLACEMENT_SPLIT
                 ? rl_workers_generate(rl_workers(r), r, q, n_prompts, version, out, err)
                 : generate_colocated(r, ds, q, n_prompts, n, out, err);
    free(q);
    return rc ? rc : check_finished(ds, out, n_prompts * n, n, err);
}

int rl_generate_submit(struct trainer_run *r, const struct dataset *ds, const int64_t *rows, int n_prompts, int n,
                       const struct sample_params *sp, int64_t max_new_tokens, int64_t version,
                       struct rl_sample *out, struct smelt_error *err) {
    SMELT_ASSERT(r->spec->rl.placement == RL_PLACEMENT_SPLIT);
    struct rollout_request *q;
    TRY(prepare(r, ds, rows, n_prompts, n, sp, max_new_tokens, version, out, &q, err));
    int rc = rl_workers_submit(rl_workers(r), r, q, n_prompts, version, err);
    free(q);
    return rc;
}

int rl_generate_collect(struct trainer_run *r, const struct dataset *ds, int n_samples, int n, struct rl_sample *out,
                        struct smelt_error *err) {
    TRY(rl_workers_collect(rl_workers(r), out, err));
    return check_finished(ds, out, n_samples, n, err);
}

void rl_samples_clear(struct rl_sample *s, int n) {
    for (int i = 0; s && i < n; i++) {
        free(s[i].ids);
        free(s[i].rollout_logp);
        free(s[i].text);
        s[i] = (struct rl_sample){0};
    }
}
