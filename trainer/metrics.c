/* Metrics as JSON lines: output_dir/metrics.jsonl, and stdout for whoever started the
 * trainer (the agent relays stdout to smeltd as events). */
#include "trainer/trainer_internal.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"

/* On resume, lines logged after the checkpoint (by the run that died) are dropped, so
 * the file reads as one uninterrupted run. */
static int keep_through(const char *path, int64_t step, struct smelt_error *err) {
    char *data;
    size_t len;
    int rc = file_read_all(path, &data, &len, err);
    if (rc) return rc;
    char *kept = malloc(len + 1);
    if (!kept) {
        free(data);
        return error_set(err, SMELT_ENOMEM, "metrics: out of memory");
    }
    size_t n_kept = 0;
    for (char *line = data; line < data + len;) {
        char *nl = memchr(line, '\n', (size_t)(data + len - line));
        size_t n = nl ? (size_t)(nl - line) : (size_t)(data + len - line);
        json_t *obj = json_loadb(line, n, 0, NULL);
        json_t *s = obj ? json_object_get(obj, "step") : NULL;
        if (s && json_is_integer(s) && json_integer_value(s) <= step) {
            memcpy(kept + n_kept, line, n);
            n_kept += n;
            kept[n_kept++] = '\n';
        }
        json_decref(obj);
        line += n + 1;
    }
    rc = file_write_atomic(path, kept, n_kept, err);
    free(kept);
    free(data);
    return rc;
}

int run_metrics_open(struct trainer_run *r, int64_t keep_through_step, struct smelt_error *err) {
    char path[JOB_PATH_BYTES + 64];
    int rc = path_join(path, sizeof path, r->spec->output_dir, "metrics.jsonl", err);
    if (rc) return rc;
    if (keep_through_step >= 0 && path_exists(path)) {
        rc = keep_through(path, keep_through_step, err);
        if (rc) return rc;
    }
    r->metrics = fopen(path, keep_through_step >= 0 ? "a" : "w");
    if (!r->metrics) return error_set(err, SMELT_EIO, "%s: cannot open for writing", path);
    return SMELT_OK;
}

void run_metrics_emit(struct trainer_run *r, void *value) {
    json_t *obj = value;
    if (!obj) return;
    char *line = json_dumps(obj, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
    json_decref(obj);
    if (!line) return;
    if (r->metrics) {
        fprintf(r->metrics, "%s\n", line);
        fflush(r->metrics);
    }
    if (!r->quiet) {
        printf("%s\n", line);
        fflush(stdout);
    }
    free(line);
}

void run_metrics_close(struct trainer_run *r) {
    if (r->metrics) fclose(r->metrics);
    r->metrics = NULL;
}
