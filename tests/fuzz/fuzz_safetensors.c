/* The safetensors format (model/safetensors_read.c): any bytes as a .safetensors file.
 * One that opens has every tensor read into f32 when its dtype converts (what loading
 * a model does), the reads bounded by the header's offsets. */
#include "model/model.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_file(data, size, "model.safetensors");
    struct safetensors *st = NULL;
    struct smelt_error err = {0};
    if (safetensors_open(path, &st, &err) != 0) return 0;
    for (size_t i = 0; i < st->n_entries; i++) {
        const struct safetensors_entry *e = &st->entries[i];
        int64_t n = 1;
        for (int d = 0; d < e->ndim; d++) n *= e->shape[d];
        if (n > (1 << 20)) continue;
        float *buf = malloc((size_t)(n ? n : 1) * sizeof *buf);
        if (!buf) abort();
        safetensors_read_f32(st, e->name, buf, e->ndim, e->shape, &err);
        free(buf);
    }
    safetensors_close(st);
    return 0;
}
