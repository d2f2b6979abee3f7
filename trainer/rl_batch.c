/* RL samples through the trainer's model: a sample is its prompt followed by its
 * generated tokens, packed with others into one row; the logprob of generated token j
 * sits at position n_prompt - 1 + j (the model's logprob at t scores token t + 1), and
 * so does PPO's value of the state before it (the critic's output at that position). */
#include "trainer/trainer_internal.h"

#include <string.h>

#include "common/common.h"

static int64_t sample_tokens(const struct dataset *ds, const struct rl_sample *s) {
    return ds->prompts[s->row].n + s->n;
}

int64_t rl_longest_sample(const struct trainer_run *r, const struct dataset *ds) {
    int64_t longest = 0;
    for (int64_t i = 0; ds && i < ds->n; i++)
        if (ds->prompts[i].n > longest) longest = ds->prompts[i].n;
    return longest + r->spec->rl.max_new_tokens;
}

int rl_batch_fit(const struct trainer_run *r, const struct dataset *ds, const struct rl_sample *s, int n) {
    int64_t tokens = 0;
    int k = 0;
    while (k < n && tokens + sample_tokens(ds, &s[k]) <= r->max_tokens) tokens += sample_tokens(ds, &s[k++]);
    return k > 0 ? k : 1; /* rl_plan sized max_tokens for the longest sample */
}

int rl_batch_build(struct trainer_run *r, const struct dataset *ds, const struct rl_sample *s, int n,
                   struct dataset_batch *b, struct smelt_error *err) {
    struct rl_buffers *buf = rl_buffers(r);
    int64_t t = 0;
    b->n_targets = 0;
    for (int i = 0; i < n; i++) {
        const struct dataset_prompt *p = &ds->prompts[s[i].row];
        int64_t len = p->n + s[i].n;
        if (t + len > r->max_tokens || i >= buf->cap_seqs)
            return error_set(err, SMELT_EINVAL, "rl: %d samples of %lld tokens do not fit a micro-batch of %lld", n,
                             (long long)(t + len), (long long)r->max_tokens);
        buf->cu[i] = (int32_t)t;
        buf->rows[i] = s[i].row;
        memcpy(buf->ids + t, p->ids, (size_t)p->n * sizeof *p->ids);
        memcpy(buf->ids + t + p->n, s[i].ids, (size_t)s[i].n * sizeof *s[i].ids);
        for (int64_t j = 0; j < len; j++) {
            bool generated_next = j + 1 >= p->n && j + 1 < len;
            buf->targets[t + j] = generated_next ? buf->ids[t + j + 1] : -1;
            b->n_targets += generated_next;
        }
        t += len;
    }
    buf->cu[n] = (int32_t)t;
    *b = (struct dataset_batch){.n_tokens = t, .n_seqs = n, .ids = buf->ids, .cu_seqlens = buf->cu,
                                .targets = buf->targets, .n_targets = b->n_targets, .rows = buf->rows};
    return SMELT_OK;
}

void rl_batch_gather_from(const struct dataset *ds, const struct dataset_batch *b, const struct rl_sample *s, int n,
                          const float *src, float *dst) {
    for (int i = 0; i < n; i++) {
        const float *at = src + b->cu_seqlens[i] + ds->prompts[s[i].row].n - 1;
        memcpy(dst + s[i].off, at, (size_t)s[i].n * sizeof *at);
    }
}

void rl_batch_gather(const struct trainer_run *r, const struct dataset *ds, const struct dataset_batch *b,
                     const struct rl_sample *s, int n, float *dst) {
    rl_batch_gather_from(ds, b, s, n, r->host_logprobs, dst);
}

void rl_batch_scatter_to(const struct dataset *ds, const struct dataset_batch *b, const struct rl_sample *s, int n,
                         const double *coef, float *dst) {
    memset(dst, 0, (size_t)b->n_tokens * sizeof *dst);
    for (int i = 0; i < n; i++) {
        float *at = dst + b->cu_seqlens[i] + ds->prompts[s[i].row].n - 1;
        for (int64_t j = 0; j < s[i].n; j++) at[j] = (float)coef[s[i].off + j];
    }
}

void rl_batch_scatter(struct trainer_run *r, const struct dataset *ds, const struct dataset_batch *b,
                      const struct rl_sample *s, int n, const double *coef) {
    rl_batch_scatter_to(ds, b, s, n, coef, r->host_logprobs);
}
