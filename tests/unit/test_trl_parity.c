/* Preference and reward losses against Hugging Face TRL's own code: the fixtures of
 * tests/parity/make_trl_fixtures.py (tests/data/trl/, README there). For each
 * preference pair smelt's model_forward gives the summed response logprobs under the
 * policy (tests/data/parity/llama) and the reference (tests/data/trl/llama-ref) with the
 * trainer's targets (next token at response positions, none at prompt ones), compared
 * with TRL's; pref_pair_loss on TRL's logprobs must give TRL's loss and TRL's autograd
 * dL/dlogps; the reward model's scores (model_score_forward) and reward_pair_loss must
 * give RewardTrainer's. */
#include "tests/unit/parity_testutil.h"

#include <string.h>

#include "model/model.h"
#include "trainer/preference_loss.h"

#define TRL_DIR "tests/data/trl"
/* TRL's DPO losses and logprobs are float32 (its fused LM head), ORPO's odds ratio too;
 * SimPO and the reward model run in float64. smelt's forward is float32. */
#define LOGPROB_RTOL 1e-5
#define LOSS_RTOL 1e-5
#define LOSS_ATOL 1e-7

static json_t *load_fixture(void) {
    json_t *root;
    struct smelt_error err;
    TEST_OK(json_load_path(TRL_DIR "/pairs.json", &root, &err), &err);
    return root;
}

static double num(const json_t *obj, const char *key) {
    json_t *v = json_object_get(obj, key);
    cr_assert(json_is_number(v), "fixture: %s missing", key);
    return json_number_value(v);
}

static void expect_near(const char *what, const char *name, int pair, double got, double want, double rtol,
                        double atol) {
    cr_expect(fabs(got - want) <= rtol * fabs(want) + atol, "%s %s pair %d: smelt %.9g, TRL %.9g", what, name, pair,
              got, want);
}

/* Appends ids (a JSON array) to the row; returns the count. */
static int64_t append_ids(const json_t *arr, int32_t *ids, int64_t at, int64_t cap) {
    int64_t n = (int64_t)json_array_size(arr);
    cr_assert(at + n <= cap);
    for (int64_t i = 0; i < n; i++) ids[at + i] = (int32_t)json_integer_value(json_array_get(arr, (size_t)i));
    return n;
}

/* A pair as the trainer packs it: prompt+chosen and prompt+rejected in one row, the
 * target of a position the next token when that token is a response token, else -1. */
struct packed_pair {
    int32_t ids[64], targets[64], cu[3];
    int64_t T, n_response[2];
};

static void pack_pair(const json_t *pair, struct packed_pair *p) {
    memset(p, 0, sizeof *p);
    const json_t *prompt = json_object_get(pair, "prompt");
    const char *responses[2] = {"chosen", "rejected"};
    for (int s = 0; s < 2; s++) {
        int64_t start = p->T, np = append_ids(prompt, p->ids, p->T, 64);
        int64_t nr = append_ids(json_object_get(pair, responses[s]), p->ids, p->T + np, 64);
        p->cu[s] = (int32_t)start;
        p->T += np + nr;
        p->n_response[s] = nr;
        for (int64_t t = start; t < p->T; t++) p->targets[t] = t + 1 < p->T && t + 1 >= start + np ? p->ids[t + 1] : -1;
    }
    p->cu[2] = (int32_t)p->T;
}

/* Summed response logprobs of the pair's two sequences under m. */
static void response_sums(struct model *m, struct model_acts *acts, const struct packed_pair *p, double sums[2]) {
    float lp[64];
    int64_t T = p->T;
    struct tensor tlp = tensor_f32(lp, 1, &T);
    struct model_batch b = {.n_tokens = T, .n_seqs = 2, .ids = p->ids, .cu_seqlens = p->cu, .targets = p->targets};
    struct smelt_error err;
    TEST_OK(model_forward(m, acts, &b, &tlp, NULL, NULL, &err), &err);
    for (int s = 0; s < 2; s++) {
        sums[s] = 0;
        for (int32_t t = p->cu[s]; t < p->cu[s + 1]; t++)
            if (p->targets[t] >= 0) sums[s] += lp[t];
    }
}


static void config_of(const json_t *cfg, struct pref_config *c) {
    struct smelt_error err;
    *c = (struct pref_config){.beta = num(cfg, "beta"), .simpo_gamma = 0.5};
    TEST_OK(pref_loss_from_name(json_string_value(json_object_get(cfg, "type")), &c->type, &err), &err);
    if (json_object_get(cfg, "label_smoothing")) c->label_smoothing = num(cfg, "label_smoothing");
    if (json_object_get(cfg, "rpo_alpha")) c->rpo_alpha = num(cfg, "rpo_alpha");
    if (json_object_get(cfg, "simpo_gamma")) c->simpo_gamma = num(cfg, "simpo_gamma");
    TEST_OK(pref_config_check(c, &err), &err);
}

/* The whole chain on smelt's side: pref_pair_loss on the logprobs smelt's forward gave
 * against TRL's loss (ORPO's is compared in the losses test only: its NLL differs).
 * float32 logprobs move the loss by |dL/dlogp| * 1e-5 * |logp|, hence 1e-4. */
static void expect_loss_of_own_logprobs(const json_t *c, const json_t *pair, int i, const double pol[2],
                                        const double rf[2]) {
    struct pref_config cfg;
    config_of(json_object_get(c, "config"), &cfg);
    if (cfg.type == PREF_LOSS_ORPO) return;
    struct pref_pair p = {.policy_chosen = pol[0], .policy_rejected = pol[1], .ref_chosen = rf[0],
                          .ref_rejected = rf[1],
                          .n_chosen = (int64_t)json_array_size(json_object_get(pair, "chosen")),
                          .n_rejected = (int64_t)json_array_size(json_object_get(pair, "rejected"))};
    struct pref_result r;
    pref_pair_loss(&cfg, &p, &r);
    const json_t *want = json_array_get(json_object_get(c, "pairs"), (size_t)i);
    expect_near("loss of smelt's logprobs", json_string_value(json_object_get(c, "name")), i, r.loss,
                num(want, "loss"), 1e-4, 1e-6);
}

/* smelt's summed response logprobs of every pair against those TRL recorded in every
 * case (DPO's from its fused LM head in float32, SimPO's and ORPO's from the logits in
 * float64), policy and reference. */
Test(trl_parity, logprobs_and_loss) {
    json_t *root = load_fixture();
    struct smelt_error err;
    struct model *policy = parity_model_load("llama", ""), *ref;
    TEST_OK(model_load(TRL_DIR "/llama-ref", BACKEND_CPU, &ref, &err), &err);
    struct model_acts *acts;
    TEST_OK(model_acts_alloc(policy, 64, false, &acts, &err), &err);
    const json_t *pairs = json_object_get(root, "pairs"), *cases = json_object_get(root, "cases");
    cr_assert(json_array_size(pairs) > 0 && json_array_size(cases) > 0);
    for (size_t i = 0; i < json_array_size(pairs); i++) {
        struct packed_pair p;
        pack_pair(json_array_get(pairs, i), &p);
        double pol[2], rf[2];
        response_sums(policy, acts, &p, pol);
        response_sums(ref, acts, &p, rf); /* same config: the activations fit both */
        for (size_t k = 0; k < json_array_size(cases); k++) {
            const json_t *c = json_array_get(cases, k), *want = json_array_get(json_object_get(c, "pairs"), i);
            const char *name = json_string_value(json_object_get(c, "name"));
            expect_near("policy_chosen", name, (int)i, pol[0], num(want, "policy_chosen"), LOGPROB_RTOL, 0);
            expect_near("policy_rejected", name, (int)i, pol[1], num(want, "policy_rejected"), LOGPROB_RTOL, 0);
            if (!json_object_get(want, "ref_chosen")) continue;
            expect_near("ref_chosen", name, (int)i, rf[0], num(want, "ref_chosen"), LOGPROB_RTOL, 0);
            expect_near("ref_rejected", name, (int)i, rf[1], num(want, "ref_rejected"), LOGPROB_RTOL, 0);
            expect_loss_of_own_logprobs(c, json_array_get(pairs, i), (int)i, pol, rf);
        }
    }
    model_acts_free(acts);
    model_free(policy), model_free(ref);
    json_decref(root);
}

/* pref_pair_loss on TRL's own logprobs: TRL's loss and gradient. ORPO: TRL's NLL term
 * covers the prompt tokens too (smelt's covers the response only), so the fixture holds
 * TRL's odds-ratio part and the test removes smelt's NLL (-pc/nc, gradient -1/nc). */
Test(trl_parity, losses) {
    json_t *root = load_fixture();
    const json_t *pairs = json_object_get(root, "pairs"), *cases = json_object_get(root, "cases");
    for (size_t k = 0; k < json_array_size(cases); k++) {
        const json_t *c = json_array_get(cases, k);
        const char *name = json_string_value(json_object_get(c, "name"));
        struct pref_config cfg;
        config_of(json_object_get(c, "config"), &cfg);
        for (size_t i = 0; i < json_array_size(pairs); i++) {
            const json_t *pair = json_array_get(pairs, i), *want = json_array_get(json_object_get(c, "pairs"), i);
            struct pref_pair p = {
                .policy_chosen = num(want, "policy_chosen"), .policy_rejected = num(want, "policy_rejected"),
                .n_chosen = (int64_t)json_array_size(json_object_get(pair, "chosen")),
                .n_rejected = (int64_t)json_array_size(json_object_get(pair, "rejected"))};
            if (pref_loss_needs_reference(cfg.type))
                p.ref_chosen = num(want, "ref_chosen"), p.ref_rejected = num(want, "ref_rejected");
            struct pref_result r;
            pref_pair_loss(&cfg, &p, &r);
            if (cfg.type == PREF_LOSS_ORPO) {
                double nc = (double)p.n_chosen;
                expect_near("odds-ratio loss", name, (int)i, r.loss + p.policy_chosen / nc, num(want, "loss_or"),
                            LOSS_RTOL, LOSS_ATOL);
                expect_near("d_chosen", name, (int)i, r.d_chosen + 1.0 / nc, num(want, "d_or_chosen"), LOSS_RTOL,
                            LOSS_ATOL);
                expect_near("d_rejected", name, (int)i, r.d_rejected, num(want, "d_or_rejected"), LOSS_RTOL, LOSS_ATOL);
                continue;
            }
            expect_near("loss", name, (int)i, r.loss, num(want, "loss"), LOSS_RTOL, LOSS_ATOL);
            expect_near("d_chosen", name, (int)i, r.d_chosen, num(want, "d_chosen"), LOSS_RTOL, LOSS_ATOL);
            expect_near("d_rejected", name, (int)i, r.d_rejected, num(want, "d_rejected"), LOSS_RTOL, LOSS_ATOL);
        }
    }
    json_decref(root);
}

/* The reward model: smelt's scores of TRL's tokenized rows (eos appended by TRL, = pad,
 * so the score is read at the token before it) against RewardTrainer's, then
 * reward_pair_loss with the row's margin and center_rewards_coefficient against
 * RewardTrainer.compute_loss and its autograd dL/dscore. */
Test(trl_parity, reward) {
    json_t *root = load_fixture();
    struct smelt_error err;
    struct model *m = parity_model_load("llama", "-rm");
    struct model_acts *acts;
    TEST_OK(model_acts_alloc(m, 64, false, &acts, &err), &err);
    int64_t C = m->config.hidden_size;
    float *hidden = test_zeros_f32(64 * C);
    const json_t *cases = json_object_get(root, "reward_cases");
    cr_assert(json_array_size(cases) > 0);
    for (size_t k = 0; k < json_array_size(cases); k++) {
        const json_t *c = json_array_get(cases, k), *pairs = json_object_get(c, "pairs");
        const char *name = json_string_value(json_object_get(c, "name"));
        double center = num(c, "center_rewards_coefficient");
        for (size_t i = 0; i < json_array_size(pairs); i++) {
            const json_t *want = json_array_get(pairs, i);
            int32_t ids[64], cu[3] = {0};
            int64_t nc = append_ids(json_object_get(want, "chosen"), ids, 0, 64);
            int64_t T = nc + append_ids(json_object_get(want, "rejected"), ids, nc, 64), S = 2;
            cu[1] = (int32_t)nc, cu[2] = (int32_t)T;
            float scores[2];
            int64_t hs[2] = {T, C};
            struct tensor th = tensor_f32(hidden, 2, hs), ts = tensor_f32(scores, 1, &S);
            struct model_batch b = {.n_tokens = T, .n_seqs = 2, .ids = ids, .cu_seqlens = cu};
            TEST_OK(model_forward(m, acts, &b, NULL, NULL, &th, &err), &err);
            TEST_OK(model_score_forward(m, &b, &th, &ts, &err), &err);
            double rc = num(want, "score_chosen"), rr = num(want, "score_rejected");
            expect_near("score_chosen", name, (int)i, scores[0], rc, LOGPROB_RTOL, 1e-6);
            expect_near("score_rejected", name, (int)i, scores[1], rr, LOGPROB_RTOL, 1e-6);
            struct reward_pair_result r;
            reward_pair_loss(rc, rr, num(want, "margin"), center, &r);
            expect_near("loss", name, (int)i, r.loss, num(want, "loss"), 1e-9, 1e-12);
            expect_near("d_chosen", name, (int)i, r.d_chosen, num(want, "d_chosen"), 1e-9, 1e-12);
            expect_near("d_rejected", name, (int)i, r.d_rejected, num(want, "d_rejected"), 1e-9, 1e-12);
        }
    }
    free(hidden);
    model_acts_free(acts);
    model_free(m);
    json_decref(root);
}
