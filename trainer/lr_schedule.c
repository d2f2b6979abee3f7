/* Learning-rate schedules: linear warmup, then constant, linear or cosine decay to a
 * floor (transformers' get_*_schedule_with_warmup, plus min_lr_ratio). */
#include "trainer/trainer.h"

#include <math.h>
#include <string.h>

static const char *const schedule_names[] = {"constant", "linear", "cosine"};

const char *lr_schedule_name(enum lr_schedule_kind kind) {
    return (unsigned)kind < 3 ? schedule_names[kind] : "?";
}

int lr_schedule_from_name(const char *name, enum lr_schedule_kind *out, struct smelt_error *err) {
    for (int i = 0; i < 3; i++)
        if (strcmp(name, schedule_names[i]) == 0) {
            *out = (enum lr_schedule_kind)i;
            return SMELT_OK;
        }
    return error_set(err, SMELT_EINVAL, "unknown schedule \"%s\" (constant, linear, cosine)", name);
}

double lr_at(const struct lr_schedule *s, int64_t step) {
    if (step < 1) step = 1;
    if (step <= s->warmup_steps) return s->peak * (double)step / (double)s->warmup_steps;
    if (s->kind == LR_SCHEDULE_CONSTANT) return s->peak;
    int64_t span = s->total_steps - s->warmup_steps;
    double progress = span > 0 ? (double)(step - s->warmup_steps) / (double)span : 1.0;
    if (progress > 1.0) progress = 1.0;
    double decay = s->kind == LR_SCHEDULE_LINEAR ? 1.0 - progress : 0.5 * (1.0 + cos(M_PI * progress));
    return s->peak * (s->min_lr_ratio + (1.0 - s->min_lr_ratio) * decay);
}
