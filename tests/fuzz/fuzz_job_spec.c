/* The job spec (trainer/job_spec.c): any JSON document, as smeltd's API and
 * smelt-trainer --spec hand it over. A spec that parses must also write back out. */
#include "tests/fuzz/fuzz.h"
#include "trainer/trainer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    json_t *j = fuzz_json(data, size);
    if (!j) return 0;
    struct job_spec spec;
    struct smelt_error err = {0};
    if (job_spec_from_json(j, NULL, &spec, &err) == 0) {
        void *back = NULL;
        if (job_spec_to_json(&spec, &back, &err) != 0) abort(); /* a parsed spec always writes back */
        json_decref(back);
    }
    json_decref(j);
    return 0;
}
