/* Opening a rendezvous store from its spec (file:DIR, smeltd:ENDPOINT), and the checks and clock comm/ shares. */
#include <string.h>
#include <time.h>

#include "comm/comm_internal.h"

int comm_name_check(const char *name, const char *field, struct smelt_error *err) {
    if (!name || !*name)
        return error_set_field(err, SMELT_EINVAL, field, "%s is empty", field);
    size_t n = strlen(name);
    if (n > 64)
        return error_set_field(err, SMELT_EINVAL, field, "%s is %zu bytes (at most 64)", field, n);
    if (name[0] == '.')
        return error_set_field(err, SMELT_EINVAL, field, "%s starts with '.'", field);
    for (size_t i = 0; i < n; i++) {
        char c = name[i];
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '-' || c == '_' || c == '.';
        if (!ok)
            return error_set_field(err, SMELT_EINVAL, field,
                                   "%s has '%c' at byte %zu (letters, digits, '-', '_', '.')",
                                   field, c, i);
    }
    return SMELT_OK;
}

int comm_store_open(const char *spec, const char *job, struct comm_store **out,
                    struct smelt_error *err) {
    return comm_store_open_keys(spec, job, NULL, out, err);
}

int comm_store_open_keys(const char *spec, const char *job, const struct curve_job_keys *keys,
                         struct comm_store **out, struct smelt_error *err) {
    *out = NULL;
    TRY(comm_name_check(job, "job", err));
    if (!spec)
        return error_set_field(err, SMELT_EINVAL, "rendezvous", "rendezvous is missing");
    if (strncmp(spec, "file:", 5) == 0) {
        if (!spec[5])
            return error_set_field(err, SMELT_EINVAL, "rendezvous",
                                   "rendezvous 'file:' names no folder");
        return comm_store_file_create(spec + 5, job, out, err);
    }
    if (strncmp(spec, "smeltd:", 7) == 0) {
        if (!spec[7])
            return error_set_field(err, SMELT_EINVAL, "rendezvous",
                                   "rendezvous 'smeltd:' names no endpoint");
        return comm_store_smeltd_create(spec + 7, job, keys, out, err);
    }
    return error_set_field(err, SMELT_EINVAL, "rendezvous",
                           "rendezvous '%.64s' is neither file:DIR nor smeltd:ENDPOINT", spec);
}

void comm_store_close(struct comm_store *store) {
    if (!store) return;
    store->ops->close(store->impl);
}

