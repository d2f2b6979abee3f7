/* Helpers for tests that run the trainer: reading what it wrote. */
#ifndef SMELT_TESTS_TRAINER_TESTUTIL_H
#define SMELT_TESTS_TRAINER_TESTUTIL_H

#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>

/* loss[step] for every "train" line of out_dir/metrics.jsonl (steps 1.. in order, below
 * cap); returns the last step. */
static inline int test_read_losses(const char *out_dir, double *loss, int cap) {
    char path[700], line[4096];
    snprintf(path, sizeof path, "%s/metrics.jsonl", out_dir);
    FILE *f = fopen(path, "r");
    cr_assert(f, "no %s", path);
    int last = 0;
    while (fgets(line, sizeof line, f)) {
        json_t *j = json_loads(line, 0, NULL);
        cr_assert(j, "bad metrics line %s", line);
        const char *type = json_string_value(json_object_get(j, "type"));
        if (type && strcmp(type, "train") == 0) {
            int step = (int)json_integer_value(json_object_get(j, "step"));
            cr_assert(step > 0 && step < cap);
            cr_expect(step == last + 1, "steps out of order: %d after %d", step, last);
            loss[step] = json_real_value(json_object_get(j, "loss"));
            last = step;
        }
        json_decref(j);
    }
    fclose(f);
    return last;
}

#endif
