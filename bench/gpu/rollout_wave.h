/* bench/gpu/rollout_wave.h — one "wave" of the rollout engine, shared by the generation
 * benchmarks bench/rollout_cpu.c and bench/gpu/generate_gpu.c: a batch of requests
 * submitted at once (greedy, no stop ids, so every sequence generates exactly
 * max_new_tokens — checked), stepped until the engine is idle; and the random prompts
 * they feed it. Static inline: each bench is one .c file linked alone.
 *
 * Ownership: struct bench_prompts owns its arrays (bench_prompts_free). The engine is
 * the caller's. */
#ifndef SMELT_BENCH_ROLLOUT_WAVE_H
#define SMELT_BENCH_ROLLOUT_WAVE_H

#include <stdlib.h>
#include <string.h>

#include "bench/gpu/bench_gpu.h" /* bench_sync_clock */
#include "common/common.h"
#include "rollout/rollout.h"

struct bench_prompts {
    int32_t **ids;   /* [n][lens[i]] */
    int64_t *lens;   /* [n] */
    int64_t n;
};

static inline void bench_prompts_free(struct bench_prompts *p) {
    for (int64_t i = 0; p->ids && i < p->n; i++) free(p->ids[i]);
    free(p->ids);
    free(p->lens);
    memset(p, 0, sizeof *p);
}

static inline int bench_prompts_alloc(struct bench_prompts *p, int64_t n, struct smelt_error *err) {
    p->n = n;
    p->ids = calloc((size_t)n, sizeof *p->ids);
    p->lens = calloc((size_t)n, sizeof *p->lens);
    if (!p->ids || !p->lens) return error_set(err, SMELT_ENOMEM, "prompts: out of memory");
    return SMELT_OK;
}

/* n prompts of min_len..max_len ids below vocab_size, from seed: for each prompt one
 * draw for its length, then one per id. */
static inline int bench_prompts_random(int64_t n, int64_t min_len, int64_t max_len, int64_t vocab_size,
                                       uint64_t seed, struct bench_prompts *p, struct smelt_error *err) {
    int rc = bench_prompts_alloc(p, n, err);
    struct rng rng;
    rng_seed(&rng, seed);
    for (int64_t i = 0; !rc && i < n; i++) {
        p->lens[i] = min_len + (int64_t)(rng_next(&rng) % (uint64_t)(max_len - min_len + 1));
        p->ids[i] = malloc((size_t)p->lens[i] * sizeof *p->ids[i]);
        if (!p->ids[i]) return error_set(err, SMELT_ENOMEM, "prompts: out of memory");
        for (int64_t t = 0; t < p->lens[i]; t++) p->ids[i][t] = (int32_t)(rng_next(&rng) % (uint64_t)vocab_size);
    }
    return rc;
}

/* What waves did, summed over the waves given the same totals. */
struct wave_totals {
    int64_t generated_tokens, prompt_tokens, peak_blocks_used;
};

/* Called after every engine step with its wall time, measured from before the step to
 * after backend_sync (so device work is inside), and the engine's counters around it. */
struct wave_step_hook {
    void (*fn)(void *ctx, double seconds, const struct rollout_stats *before, const struct rollout_stats *after);
    void *ctx;
    enum backend backend;   /* the model's: what to wait for before reading the clock */
};

/* One wave: batch requests (prompt indices first, first + 1, ... wrapping around the
 * list) submitted at once, stepped until idle. Adds to totals; outputs (may be NULL)
 * get each request's ids at its position in the wave; hook may be NULL. */
static inline int wave_run(struct rollout_engine *e, const struct bench_prompts *p, int64_t first, int64_t batch,
                           int64_t max_new, struct wave_totals *totals, int32_t **outputs,
                           const struct wave_step_hook *hook, struct smelt_error *err) {
    for (int64_t r = 0; r < batch; r++) {
        int64_t k = (first + r) % p->n;
        struct rollout_request req = {.id = (uint64_t)r, .prompt = p->ids[k], .n_prompt = p->lens[k], .n = 1,
                                      .sampling = {.temperature = 0, .top_p = 1}, .max_new_tokens = max_new};
        int rc = rollout_engine_add(e, &req, err);
        if (rc) return error_wrap(err, rc, "prompt %lld", (long long)k);
        totals->prompt_tokens += p->lens[k];
    }
    int rc = SMELT_OK;
    while (!rc && !rollout_engine_idle(e)) {
        struct rollout_stats before = rollout_engine_stats(e);
        double t0 = 0, t1 = 0;
        if (hook) rc = bench_sync_clock(hook->backend, &t0, err);
        if (!rc) rc = rollout_engine_step(e, err);
        if (!rc && hook) rc = bench_sync_clock(hook->backend, &t1, err);
        if (!rc && hook) {
            struct rollout_stats after = rollout_engine_stats(e);
            hook->fn(hook->ctx, t1 - t0, &before, &after);
        }
        struct rollout_stats st = rollout_engine_stats(e);
        if (st.n_blocks - st.free_blocks > totals->peak_blocks_used) totals->peak_blocks_used = st.n_blocks - st.free_blocks;
        struct rollout_result *res = NULL;
        int n = 0;
        if (!rc) rc = rollout_engine_take(e, &res, &n, err);
        for (int i = 0; !rc && i < n; i++) {
            if (res[i].n != max_new)
                rc = error_set(err, SMELT_EINVAL, "request %llu generated %lld tokens, not %lld (finish: %s)",
                               (unsigned long long)res[i].request_id, (long long)res[i].n, (long long)max_new,
                               res[i].finish_reason);
            else if (outputs)
                memcpy(outputs[res[i].request_id], res[i].ids, (size_t)max_new * sizeof *res[i].ids);
            totals->generated_tokens += res[i].n;
        }
        rollout_results_free(res, n);
    }
    return rc;
}

#endif
