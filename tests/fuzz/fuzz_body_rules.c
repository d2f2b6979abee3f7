/* The Tinker SDK's JSON request bodies against their rules (server/body_rules.c's
 * body_check over server/tinker_rules.c's tables): any JSON document, checked against
 * every table as the handlers check it (where ""). A refusal of an object must name its
 * field (err.field, which the API returns as the error's param) and say why; anything
 * else than an object is refused whole (the handlers' server_body_object refuses it
 * before body_check). */
#include "server/tinker_api.h"
#include "tests/fuzz/fuzz.h"

static const struct {
    const char *name;
    const struct body_rule *rules;
} TABLES[] = {
    {"client_config", TINKER_CLIENT_CONFIG},   {"telemetry", TINKER_TELEMETRY},
    {"create_session", TINKER_CREATE_SESSION}, {"finish_session", TINKER_FINISH_SESSION},
    {"heartbeat", TINKER_HEARTBEAT},           {"create_model", TINKER_CREATE_MODEL},
    {"get_info", TINKER_GET_INFO},             {"optim_step", TINKER_OPTIM_STEP},
    {"save_weights", TINKER_SAVE_WEIGHTS},     {"save_for_sampler", TINKER_SAVE_FOR_SAMPLER},
    {"load_weights", TINKER_LOAD_WEIGHTS},     {"create_sampler", TINKER_CREATE_SAMPLER},
    {"sample", TINKER_SAMPLE},                 {"retrieve_future", TINKER_RETRIEVE_FUTURE},
    {"cancel_future", TINKER_CANCEL_FUTURE},   {"weights_info", TINKER_WEIGHTS_INFO},
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    json_t *j = fuzz_json(data, size);
    if (!j) return 0;
    for (size_t t = 0; t < sizeof TABLES / sizeof TABLES[0]; t++) {
        struct smelt_error err = {0};
        int rc = body_check(j, TABLES[t].rules, "", &err);
        if (!json_is_object(j) && (rc == 0 || !err.message[0])) abort();
        if (rc == 0 || !json_is_object(j)) continue;
        if (!err.field[0] || !err.message[0] || (err.code != SMELT_EINVAL && err.code != SMELT_EUNSUPPORTED)) {
            fprintf(stderr, "%s: code %d, field '%s': %s\n", TABLES[t].name, err.code, err.field, err.message);
            abort(); /* a refusal that names no field */
        }
    }
    json_decref(j);
    return 0;
}
