/* PEFT adapter configs (lora/io_config.c): any JSON document as adapter_config.json or a
 * job's lora block. */
#include "lora/lora.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    json_t *j = fuzz_json(data, size);
    if (!j) return 0;
    struct lora_config c;
    struct smelt_error err = {0};
    lora_config_from_json(j, "adapter_config.json", &c, &err);
    json_decref(j);
    return 0;
}
