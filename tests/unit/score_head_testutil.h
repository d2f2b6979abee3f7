/* Helpers shared by the score head tests (test_reward_head.c: the score at each
 * sequence's last token; test_value_head.c: the value at every token). */
#ifndef SMELT_TESTS_SCORE_HEAD_TESTUTIL_H
#define SMELT_TESTS_SCORE_HEAD_TESTUTIL_H

#include "tests/unit/testutil.h"

#include <math.h>

#include "model/model.h"

/* Central finite differences (step 1e-2) of loss(ctx) at 8 random coordinates of m's
 * score head and of hidden [T, C], against what the backward gave: dweight's increment
 * dw - dw0 and dhidden dh. The loss is linear in each coordinate, so the tolerance is
 * tight. */
static inline void score_head_expect_fd(struct test_rng *rng, struct model *m, float *hidden, int64_t T, int64_t C,
                                        const float *dw, const float *dw0, const float *dh,
                                        double (*loss)(void *ctx), void *ctx) {
    float *wm = m->w.score.data;
    for (int k = 0; k < 8; k++) {
        int64_t j = (int64_t)(test_rng_next(rng) % (uint64_t)C), i = (int64_t)(test_rng_next(rng) % (uint64_t)(T * C));
        float *xs[2] = {&wm[j], &hidden[i]};
        double grads[2] = {dw[j] - dw0[j], dh[i]};
        for (int v = 0; v < 2; v++) {
            float saved = *xs[v];
            *xs[v] = saved + 1e-2f;
            double lp = loss(ctx);
            *xs[v] = saved - 1e-2f;
            double lm = loss(ctx);
            *xs[v] = saved;
            double fd = (lp - lm) / 2e-2;
            cr_expect(fabs(fd - grads[v]) <= 1e-3 * fabs(fd) + 1e-4, "%s[%lld]: backward %.6g, fd %.6g",
                      v ? "hidden" : "weight", (long long)(v ? i : j), grads[v], fd);
        }
    }
}

#endif
