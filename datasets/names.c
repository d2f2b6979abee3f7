/* The names job specs and the HTTP API use for dataset kinds and options. */
#include "datasets/datasets.h"

#include <string.h>

static const char *const kind_names[] = {
    [DATASET_AUTO] = "auto", [DATASET_SFT] = "sft",
    [DATASET_PREFERENCE] = "preference", [DATASET_PROMPTS] = "prompts",
};
static const char *const truncation_names[] = {
    [DATASET_TRUNCATE_ERROR] = "error", [DATASET_TRUNCATE_DROP] = "drop",
    [DATASET_TRUNCATE_RIGHT] = "truncate",
};
static const char *const loss_on_names[] = {
    [DATASET_LOSS_COMPLETION] = "completion", [DATASET_LOSS_ALL] = "all",
};

#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

static const char *name_of(const char *const *names, int n, int value) {
    return value >= 0 && value < n ? names[value] : "unknown";
}

/* Finds name in names; the error lists the known ones. */
static int value_of(const char *const *names, int n, const char *what, const char *name,
                    int *out, struct smelt_error *err) {
    for (int i = 0; name && i < n; i++) {
        if (!strcmp(name, names[i])) {
            *out = i;
            return SMELT_OK;
        }
    }
    char known[128] = "";
    for (int i = 0; i < n; i++) {
        strncat(known, names[i], sizeof known - strlen(known) - 1);
        if (i + 1 < n) strncat(known, ", ", sizeof known - strlen(known) - 1);
    }
    return error_set(err, SMELT_EINVAL, "%s: unknown value \"%s\" (expected one of %s)", what,
                     name ? name : "(null)", known);
}

const char *dataset_kind_name(enum dataset_kind kind) {
    return name_of(kind_names, COUNT(kind_names), (int)kind);
}

int dataset_kind_from_name(const char *name, enum dataset_kind *out, struct smelt_error *err) {
    int v;
    int rc = value_of(kind_names, COUNT(kind_names), "dataset kind", name, &v, err);
    if (!rc) *out = (enum dataset_kind)v;
    return rc;
}

const char *dataset_truncation_name(enum dataset_truncation t) {
    return name_of(truncation_names, COUNT(truncation_names), (int)t);
}

int dataset_truncation_from_name(const char *name, enum dataset_truncation *out,
                                 struct smelt_error *err) {
    int v;
    int rc = value_of(truncation_names, COUNT(truncation_names), "truncation", name, &v, err);
    if (!rc) *out = (enum dataset_truncation)v;
    return rc;
}

const char *dataset_loss_on_name(enum dataset_loss_on l) {
    return name_of(loss_on_names, COUNT(loss_on_names), (int)l);
}

int dataset_loss_on_from_name(const char *name, enum dataset_loss_on *out, struct smelt_error *err) {
    int v;
    int rc = value_of(loss_on_names, COUNT(loss_on_names), "loss_on", name, &v, err);
    if (!rc) *out = (enum dataset_loss_on)v;
    return rc;
}
