/* config.json (model/config.c): any JSON document as a model's configuration. One that
 * parses must write back out as transformers would read it, or be refused by name. */
#include "model/model.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    json_t *j = fuzz_json(data, size);
    if (!j) return 0;
    struct model_config c;
    struct smelt_error err = {0};
    model_config_from_json(j, "config.json", &c, &err);
    json_decref(j);
    return 0;
}
