/* Reward specs and grader configs (rewards/spec.c, graders.c): any JSON document as an RL
 * job's reward block (verifiers, OpenAI graders, python and endpoint graders: creating a
 * stage starts no process and makes no request). One that is accepted writes back out
 * and is accepted again. */
#include "rewards/rewards.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    json_t *j = fuzz_json(data, size);
    if (!j) return 0;
    struct reward_stage *stage = NULL;
    struct smelt_error err = {0};
    if (reward_stage_create(j, "reward", &stage, &err) == 0) {
        json_t *back = NULL;
        if (reward_stage_to_json(stage, &back, &err) != 0) abort();
        struct reward_stage *again = NULL;
        if (reward_stage_create(back, "reward (written back)", &again, &err) != 0) {
            fprintf(stderr, "a stage's own spec is refused: %s\n", err.message);
            abort();
        }
        reward_stage_free(again);
        json_decref(back);
        reward_stage_free(stage);
    }
    json_decref(j);
    return 0;
}
