/* Dataset files (datasets/): any bytes as an uploaded JSONL file of each kind, validated
 * as smeltd validates an upload (the first byte picks the kind). */
#include "datasets/datasets.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    static const enum dataset_kind kinds[] = {DATASET_SFT, DATASET_PREFERENCE, DATASET_PROMPTS};
    enum dataset_kind kind = kinds[data[0] % 3];
    const char *path = fuzz_file(data + 1, size - 1, "rows.jsonl");
    struct dataset_report report;
    struct smelt_error err = {0};
    dataset_validate_file(path, kind, &report, &err);
    return 0;
}
