/* trainer/: schedules against their closed forms, the optimizer against ops_adamw and
 * torch's clipping rule, the job spec's validation, and whole SFT runs on a tiny model:
 * the task is learned (held-out accuracy, falling losses), a stopped-and-resumed run
 * logs bit-identical losses (full and LoRA), LoRA leaves the base untouched, outputs
 * serve as the next job's model, and invalid data stops a job before it trains. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/common.h"
#include "model/model.h"
#include "testutil.h"
#include "trainer_testutil.h"
#include "trainer/trainer.h"

/* ---- schedules ---- */

Test(trainer, lr_schedules_match_closed_forms) {
    struct lr_schedule s = {.kind = LR_SCHEDULE_COSINE, .peak = 1e-3, .warmup_steps = 10,
                            .total_steps = 110, .min_lr_ratio = 0.1};
    cr_expect_float_eq(lr_at(&s, 1), 1e-4, 1e-15);
    cr_expect_float_eq(lr_at(&s, 10), 1e-3, 1e-15);
    /* halfway through the decay: cos(pi/2) = 0 -> min + (1 - min) / 2 */
    cr_expect_float_eq(lr_at(&s, 60), 1e-3 * (0.1 + 0.9 * 0.5), 1e-15);
    cr_expect_float_eq(lr_at(&s, 110), 1e-4, 1e-15);
    cr_expect_float_eq(lr_at(&s, 500), 1e-4, 1e-15);
    s.kind = LR_SCHEDULE_LINEAR;
    cr_expect_float_eq(lr_at(&s, 35), 1e-3 * (0.1 + 0.9 * 0.75), 1e-15);
    s.kind = LR_SCHEDULE_CONSTANT;
    cr_expect_float_eq(lr_at(&s, 5), 5e-4, 1e-15);
    cr_expect_float_eq(lr_at(&s, 100), 1e-3, 1e-15);
    s.warmup_steps = 0;
    s.kind = LR_SCHEDULE_COSINE;
    s.min_lr_ratio = 0;
    cr_expect_float_eq(lr_at(&s, 1), 1e-3 * 0.5 * (1 + cos(M_PI / 110)), 1e-15);
}

/* ---- optimizer ---- */

Test(trainer, optimizer_clips_like_torch_and_matches_adamw) {
    struct smelt_error err = {0};
    enum { N = 37 };
    struct test_rng rng = {7};
    float *w = test_rand_f32(&rng, N, -1, 1), *g = test_rand_f32(&rng, N, -3, 3);
    float *w_ref = malloc(N * sizeof *w_ref), *m_ref = test_zeros_f32(N), *v_ref = test_zeros_f32(N);
    memcpy(w_ref, w, N * sizeof *w);
    int64_t n = N;
    struct tensor tw = tensor_f32(w, 1, &n), tg = tensor_f32(g, 1, &n);
    struct optimizer opt;
    TEST_OK(optimizer_init(&opt, &tw, &err), &err);
    double norm2 = 0;
    for (int i = 0; i < N; i++) norm2 += (double)g[i] * g[i] * 0.25; /* grad_scale 0.5 */
    double norm, max_norm = 1.0;
    TEST_OK(optimizer_step(&opt, &tw, &tg, 0.5, max_norm, 1e-2, 0.9, 0.999, 1e-8, 0.1, &norm, &err), &err);
    cr_expect_float_eq(norm, sqrt(norm2), 1e-9 * sqrt(norm2));
    /* Reference: the same update through ops_adamw with torch's clip coefficient. */
    struct tensor rw = tensor_f32(w_ref, 1, &n), rm = tensor_f32(m_ref, 1, &n), rv = tensor_f32(v_ref, 1, &n);
    struct adamw_config c = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.1f,
                             .grad_scale = (float)(0.5 * max_norm / (sqrt(norm2) + 1e-6)), .step = 1};
    TEST_OK(ops_adamw(&rw, &rm, &rv, &tg, &c, &err), &err);
    for (int i = 0; i < N; i++) cr_expect_eq(w[i], w_ref[i], "w[%d] %.9g vs %.9g", i, w[i], w_ref[i]);

    /* Moments and step survive a save/load. */
    char path[256];
    test_tmp_setup();
    TEST_OK(optimizer_save(&opt, test_tmp_path(path, sizeof path, "opt.safetensors"), &err), &err);
    struct optimizer back;
    TEST_OK(optimizer_init(&back, &tw, &err), &err);
    TEST_OK(optimizer_load(&back, path, &err), &err);
    cr_expect_eq(back.step, 1);
    cr_expect_eq(memcmp(back.m.data, opt.m.data, N * sizeof(float)), 0);
    cr_expect_eq(memcmp(back.v.data, opt.v.data, N * sizeof(float)), 0);
    /* A non-finite gradient is refused before anything changes. */
    g[3] = NAN;
    TEST_EXPECT_ERROR(optimizer_step(&opt, &tw, &tg, 1.0, 1.0, 1e-3, 0.9, 0.999, 1e-8, 0, &norm, &err), SMELT_EINVAL, &err);
    optimizer_free(&back);
    optimizer_free(&opt);
    test_tmp_teardown();
    free(w), free(g), free(w_ref), free(m_ref), free(v_ref);
}

/* ---- the spec ---- */

static int spec_from(const char *text, struct job_spec *spec, struct smelt_error *err) {
    json_error_t jerr;
    json_t *j = json_loads(text, 0, &jerr);
    cr_assert(j, "bad test JSON: %s", jerr.text);
    int rc = job_spec_from_json(j, "spec.json", spec, err);
    json_decref(j);
    return rc;
}

Test(trainer, spec_defaults_and_round_trip) {
    struct smelt_error err = {0};
    struct job_spec s;
    TEST_OK(spec_from("{\"type\":\"sft\",\"model\":\"m\",\"data\":{\"train\":\"t.jsonl\"},\"output_dir\":\"o\"}", &s, &err), &err);
    cr_expect_eq(s.hp.epochs, 1);
    cr_expect_eq(s.hp.batch_size, 8);
    cr_expect_float_eq(s.hp.learning_rate, 1e-4, 1e-12);
    cr_expect_eq(s.hp.lr_schedule, LR_SCHEDULE_COSINE);
    cr_expect_float_eq(s.hp.max_grad_norm, 1.0, 0);
    cr_expect_eq(trainer_comm_timeout_ms(&s), TRAINER_COMM_TIMEOUT_MS);
    cr_expect(s.data.add_bos && s.data.shuffle && !s.has_lora);
    cr_expect_eq(s.backend, BACKEND_CPU);
    void *j;
    TEST_OK(job_spec_to_json(&s, &j, &err), &err);
    struct job_spec back;
    TEST_OK(job_spec_from_json(j, "round trip", &back, &err), &err);
    cr_expect_eq(memcmp(&s, &back, sizeof s), 0, "the spec changed through JSON");
    json_decref(j);
}

/* Each bad spec must fail naming the field: in the message, and as a path in err.field
 * (what smeltd reports as `param`). */
Test(trainer, spec_errors_name_the_field) {
    static const struct {
        const char *json, *needle, *field;
    } cases[] = {
        {"[]", "JSON object", ""},
        {"{\"type\":\"sft\",\"model\":\"m\",\"data\":{\"train\":\"t\"},\"output_dir\":\"o\",\"bogus\":1}", "bogus", "bogus"},
        {"{\"type\":\"dpo2\",\"model\":\"m\",\"data\":{\"train\":\"t\"},\"output_dir\":\"o\"}", "type", "type"},
        {"{\"type\":\"sft\",\"data\":{\"train\":\"t\"},\"output_dir\":\"o\"}", "model", "model"},
        {"{\"type\":\"sft\",\"model\":\"m\",\"output_dir\":\"o\"}", "data", "data"},
        {"{\"type\":\"sft\",\"model\":\"m\",\"data\":{\"train\":\"t\"}}", "output_dir", "output_dir"},
        {"{\"type\":\"sft\",\"model\":\"m\",\"data\":{\"train\":\"t\",\"extra\":1},\"output_dir\":\"o\"}", "extra", "data.extra"},
        {"{\"type\":\"sft\",\"model\":\"m\",\"data\":{\"train\":\"t\"},\"output_dir\":\"o\",\"hyperparameters\":{\"learning_rate\":-1}}", "learning_rate", "hyperparameters.learning_rate"},
        {"{\"type\":\"sft\",\"model\":\"m\",\"data\":{\"train\":\"t\"},\"output_dir\":\"o\",\"hyperparameters\":{\"epochs\":\"3\"}}", "epochs", "hyperparameters.epochs"},
        {"{\"type\":\"sft\",\"model\":\"m\",\"data\":{\"train\":\"t\"},\"output_dir\":\"o\",\"hyperparameters\":{\"batch_size\":0}}", "batch_size", "hyperparameters.batch_size"},
        {"{\"type\":\"sft\",\"model\":\"m\",\"data\":{\"train\":\"t\"},\"output_dir\":\"o\",\"hyperparameters\":{\"lr_schedule\":\"step\"}}", "lr_schedule", "hyperparameters.lr_schedule"},
        {"{\"type\":\"sft\",\"model\":\"m\",\"data\":{\"train\":\"t\"},\"output_dir\":\"o\",\"hyperparameters\":{\"beta2\":1}}", "beta2", "hyperparameters.beta2"},
        {"{\"type\":\"sft\",\"model\":\"m\",\"data\":{\"train\":\"t\"},\"output_dir\":\"o\",\"hyperparameters\":{\"comm_timeout_s\":0}}", "comm_timeout_s", "hyperparameters.comm_timeout_s"},
        {"{\"type\":\"sft\",\"model\":\"m\",\"data\":{\"train\":\"t\",\"truncation\":\"cut\"},\"output_dir\":\"o\"}", "truncation", "data.truncation"},
        {"{\"type\":\"sft\",\"model\":\"m\",\"data\":{\"train\":\"t\",\"validation\":\"v\",\"validation_fraction\":0.1},\"output_dir\":\"o\"}", "validation_fraction", "data.validation_fraction"},
        {"{\"type\":\"sft\",\"model\":\"m\",\"data\":{\"train\":\"t\",\"max_seq_len\":64},\"output_dir\":\"o\",\"hyperparameters\":{\"batch_tokens\":32}}", "batch_tokens", "hyperparameters.batch_tokens"},
        {"{\"type\":\"sft\",\"model\":\"m\",\"model_init\":\"random\",\"data\":{\"train\":\"t\"},\"output_dir\":\"o\",\"lora\":{\"rank\":4}}", "lora", "lora"},
        {"{\"type\":\"sft\",\"model\":\"m\",\"data\":{\"train\":\"t\"},\"output_dir\":\"o\",\"lora\":{\"rank\":0}}", "rank", "lora.rank"},
        {"{\"type\":\"sft\",\"model\":\"m\",\"data\":{\"train\":\"t\"},\"output_dir\":\"o\",\"lora\":{\"rnak\":4}}", "rnak", "lora.rnak"},
        {"{\"type\":\"sft\",\"model\":\"m\",\"data\":{\"train\":\"t\"},\"output_dir\":\"o\",\"save_merged\":true}", "save_merged", "save_merged"},
        {"{\"type\":\"sft\",\"model\":\"m\",\"data\":{\"train\":\"t\"},\"output_dir\":\"o\",\"backend\":\"tpu\"}", "backend", "backend"},
        {"{\"type\":\"sft\",\"model\":\"m\",\"data\":{\"train\":\"t\"},\"output_dir\":\"o\",\"eval\":{\"every_steps\":-2}}", "every_steps", "eval.every_steps"},
        {"{\"type\":\"sft\",\"model\":\"m\",\"data\":{\"train\":\"t\"},\"output_dir\":\"o\",\"chat_template\":\"jinja\"}", "chat_template", "chat_template"},
        {"{\"type\":\"sft\",\"model\":\"m\",\"data\":{\"train\":\"t\"},\"output_dir\":\"o\",\"seed\":-1}", "seed", "seed"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        struct smelt_error err = {0};
        struct job_spec s;
        cr_expect_neq(spec_from(cases[i].json, &s, &err), SMELT_OK, "case %zu accepted", i);
        cr_expect(strstr(err.message, cases[i].needle), "case %zu: \"%s\" does not name %s", i, err.message,
                  cases[i].needle);
        cr_expect_str_eq(err.field, cases[i].field, "case %zu: %s", i, err.message);
    }
}

/* JOB_HP_FIELDS drives both directions: a value of every field other than its default
 * is parsed and written back by job_spec_to_json unchanged. */
Test(trainer, hp_table_round_trip) {
    for (int i = 0; i < JOB_N_HP_FIELDS; i++) {
        const struct job_hp_field *f = &JOB_HP_FIELDS[i];
        json_t *value = f->kind == JOB_FIELD_INT      ? json_integer((json_int_t)f->max)
                        : f->kind == JOB_FIELD_NUMBER ? json_real(f->max)
                        : f->kind == JOB_FIELD_BOOL   ? json_boolean(f->def == 0)
                                                      : json_string(f->def_name);
        json_t *spec = json_pack("{s:s, s:s, s:{s:s}, s:s, s:{s:O}}", "type", "sft", "model", "m", "data",
                                 "train", "t", "output_dir", "o", "hyperparameters", f->name, value);
        struct smelt_error err = {0};
        struct job_spec s;
        TEST_OK(job_spec_from_json(spec, "spec", &s, &err), &err);
        void *back;
        TEST_OK(job_spec_to_json(&s, &back, &err), &err);
        json_t *got = json_object_get(json_object_get(back, "hyperparameters"), f->name);
        cr_expect(json_equal(got, value) || (json_is_number(got) && json_number_value(got) == json_number_value(value)),
                  "%s did not come back", f->name);
        json_decref(back);
        json_decref(spec);
        json_decref(value);
    }
}

/* ---- whole runs on a tiny model ---- */

/* Reversal of short strings: a task a tiny model learns in under two hundred steps. */
static void make_data(const char *path, int n, int offset) {
    FILE *f = fopen(path, "w");
    cr_assert(f);
    for (int i = 0; i < n; i++) {
        char s[4] = {(char)('a' + (i + offset) % 7), (char)('a' + (i * 3 + offset) % 5), (char)('a' + (i / 5 + offset) % 6), 0};
        fprintf(f, "{\"prompt\": \"%s>\", \"completion\": \"%c%c%c\"}\n", s, s[2], s[1], s[0]);
    }
    fclose(f);
}

static void setup_run(struct test_run_paths *p, bool pretrained) {
    test_run_paths_init(p, pretrained);
    make_data(p->train, 96, 0);
    make_data(p->val, 16, 3);
}

static void load_spec(const struct test_run_paths *p, const char *model, const char *out, const char *extra,
                      struct job_spec *spec) {
    char text[4096];
    snprintf(text, sizeof text,
             "{\"type\":\"sft\",\"model\":\"%s\",%s\"data\":{\"train\":\"%s\",\"validation\":\"%s\",\"max_seq_len\":16},"
             "\"output_dir\":\"%s\",\"seed\":5}",
             model, extra, p->train, p->val, out);
    struct smelt_error err = {0};
    test_write_text(p->spec, text);
    TEST_OK(job_spec_load(p->spec, spec, &err), &err);
}

/* The train losses of metrics.jsonl, by step (1-based; [0] unused). */
/* Runs the spec uninterrupted into p->out, then stopped after stop_at and resumed into
 * out2; expects the same n losses to the bit. */
static void expect_resume_identical(const struct test_run_paths *p, const char *hp, int n, int stop_at,
                                    char *out2, size_t out2_cap, double *straight) {
    struct smelt_error err = {0};
    struct job_spec spec;
    struct trainer_result res;
    struct trainer_options quiet = {.quiet = true};
    load_spec(p, p->model, p->out, hp, &spec);
    TEST_OK(trainer_run(&spec, &quiet, &res, &err), &err);
    cr_expect_eq(res.steps, n);
    cr_expect(!spec.has_lora || res.base_unchanged);
    cr_assert_eq(test_read_losses(p->out, straight, 16), n);
    snprintf(out2, out2_cap, "%s2", p->out);
    load_spec(p, p->model, out2, hp, &spec);
    struct trainer_options stop = {.quiet = true, .stop_after_step = stop_at};
    TEST_OK(trainer_run(&spec, &stop, &res, &err), &err);
    cr_expect(res.stopped);
    cr_expect_eq(res.steps, stop_at);
    /* A fresh start over existing checkpoints is refused rather than mixing runs. */
    TEST_EXPECT_ERROR(trainer_run(&spec, &quiet, &res, &err), SMELT_EINVAL, &err);
    struct trainer_options resume = {.quiet = true, .resume = "latest"};
    TEST_OK(trainer_run(&spec, &resume, &res, &err), &err);
    cr_expect_eq(res.steps, n);
    double resumed[16];
    cr_assert_eq(test_read_losses(out2, resumed, 16), n);
    for (int s = 1; s <= n; s++)
        cr_expect_eq(straight[s], resumed[s], "step %d: %.17g uninterrupted vs %.17g resumed", s, straight[s], resumed[s]);
}

static const char *const full_hp =
    "\"model_init\":\"random\",\"hyperparameters\":{\"max_steps\":8,\"batch_size\":8,\"grad_accum\":2,"
    "\"learning_rate\":0.01,\"warmup_steps\":2},\"checkpoint\":{\"every_steps\":3},";

Test(trainer, full_run_resumes_bit_identically) {
    struct test_run_paths p;
    setup_run(&p, false);
    struct smelt_error err = {0};
    struct job_spec spec;
    struct trainer_result res;
    struct trainer_options quiet = {.quiet = true}, resume = {.quiet = true, .resume = "latest"};
    double straight[16], resumed[16];
    char out2[600];
    expect_resume_identical(&p, full_hp, 8, 5, out2, sizeof out2, straight);
    cr_expect(straight[8] < straight[1], "the loss did not fall: %g -> %g", straight[1], straight[8]);

    /* Resuming from an earlier checkpoint replays the same steps too. */
    char ck[700];
    snprintf(ck, sizeof ck, "%s/checkpoints/step-3", out2);
    struct trainer_options from3 = {.quiet = true, .resume = ck};
    load_spec(&p, p.model, out2, full_hp, &spec);
    TEST_OK(trainer_run(&spec, &from3, &res, &err), &err);
    cr_assert_eq(test_read_losses(out2, resumed, 16), 8);
    for (int s = 1; s <= 8; s++) cr_expect_eq(straight[s], resumed[s], "step %d after resuming from 3", s);

    /* A changed hyperparameter is refused on resume, naming it. */
    const char *other = "\"model_init\":\"random\",\"hyperparameters\":{\"max_steps\":8,\"batch_size\":8,\"grad_accum\":2,"
                        "\"learning_rate\":0.02,\"warmup_steps\":2},\"checkpoint\":{\"every_steps\":3},";
    load_spec(&p, p.model, out2, other, &spec);
    TEST_EXPECT_ERROR(trainer_run(&spec, &resume, &res, &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, "learning_rate"), "%s", err.message);

    /* The output is a model directory the next job can start from. */
    char next_out[600], next_model[600];
    snprintf(next_out, sizeof next_out, "%s/next", p.out);
    snprintf(next_model, sizeof next_model, "%s/output", p.out);
    load_spec(&p, next_model, next_out, "\"hyperparameters\":{\"max_steps\":1},", &spec);
    TEST_OK(trainer_run(&spec, &quiet, &res, &err), &err);
    test_tmp_teardown();
}

/* The validation loss of the first "eval" line of out_dir/metrics.jsonl. */
static double first_eval_loss(const char *out_dir) {
    char path[600], line[4096];
    snprintf(path, sizeof path, "%s/metrics.jsonl", out_dir);
    FILE *f = fopen(path, "r");
    cr_assert(f, "no %s", path);
    double first = NAN;
    while (isnan(first) && fgets(line, sizeof line, f)) {
        json_t *j = json_loads(line, 0, NULL);
        const char *type = j ? json_string_value(json_object_get(j, "type")) : NULL;
        if (type && strcmp(type, "eval") == 0) first = json_real_value(json_object_get(j, "val_loss"));
        json_decref(j);
    }
    fclose(f);
    return first;
}

/* The reversal task trained to the end: the held-out strings (none of them in the
 * training set) must come out reversed. An untrained model scores 0 (three letters
 * and the end token exactly, from 260 ids), and so does a trainer that does not learn.
 * This run scored 15/16 or 16/16 with each of seeds 1..9 and its losses fell about
 * 100-fold, so the margins below survive a change of seed or summation order. */
Test(trainer, the_example_task_is_learned) {
    struct test_run_paths p;
    setup_run(&p, false);
    struct smelt_error err = {0};
    struct job_spec spec;
    struct trainer_result res;
    struct trainer_options quiet = {.quiet = true};
    load_spec(&p, p.model, p.out,
              "\"model_init\":\"random\",\"hyperparameters\":{\"epochs\":25,\"batch_tokens\":128,"
              "\"learning_rate\":0.003,\"warmup_steps\":3},\"eval\":{\"every_steps\":10,\"accuracy_examples\":16},",
              &spec);
    TEST_OK(trainer_run(&spec, &quiet, &res, &err), &err);
    cr_expect_eq(res.accuracy_examples, 16);
    cr_expect(res.accuracy >= 0.75, "held-out accuracy %g: the model did not learn to reverse", res.accuracy);
    /* Step 1 is logged before any update: the untrained loss, about ln 260. */
    enum { MAX_STEPS = 256 };
    double train[MAX_STEPS];
    int n = test_read_losses(p.out, train, MAX_STEPS);
    cr_assert(n >= 100, "%d steps", n);
    cr_expect(train[1] > 4.0, "untrained loss %g, expected about ln 260", train[1]);
    cr_expect(train[n] < 0.1 * train[1], "train loss %g -> %g", train[1], train[n]);
    double first = first_eval_loss(p.out);
    cr_expect(isfinite(first));
    cr_expect(res.val_loss < 0.1 * first, "validation loss %g (step 10) -> %g", first, res.val_loss);
    test_tmp_teardown();
}

static const char *const lora_hp =
    "\"hyperparameters\":{\"max_steps\":6,\"batch_size\":8,\"learning_rate\":0.01},"
    "\"lora\":{\"rank\":4,\"alpha\":8,\"dropout\":0.1,\"target_modules\":[\"q_proj\",\"v_proj\",\"down_proj\"]},"
    "\"checkpoint\":{\"every_steps\":2},\"save_merged\":true,";

Test(trainer, lora_run_resumes_bit_identically_and_keeps_the_base) {
    struct test_run_paths p;
    setup_run(&p, true);
    struct smelt_error err = {0};
    struct job_spec spec;
    struct trainer_result res;
    struct trainer_options quiet = {.quiet = true};
    double straight[16];
    char out2[600];
    expect_resume_identical(&p, lora_hp, 6, 3, out2, sizeof out2, straight);

    /* The base directory's weights are unchanged on disk too. */
    struct model *base, *fresh;
    struct model_config c;
    TEST_OK(model_load(p.model, BACKEND_CPU, &base, &err), &err);
    TEST_OK(model_config_load(p.model, &c, &err), &err);
    TEST_OK(model_init_random(&c, 99, BACKEND_CPU, &fresh, &err), &err);
    cr_expect_eq(memcmp(base->weights.data, fresh->weights.data, (size_t)base->n_weights * sizeof(float)), 0);
    model_free(fresh);
    model_free(base);

    /* output/ is a PEFT adapter, output/merged a model; both serve as the next base. */
    char adapter_cfg[700], merged[700], next_out[700], next_model[700];
    snprintf(adapter_cfg, sizeof adapter_cfg, "%s/output/adapter_config.json", out2);
    cr_expect(path_exists(adapter_cfg));
    snprintf(merged, sizeof merged, "%s/output/merged/config.json", out2);
    cr_expect(path_exists(merged));
    snprintf(next_out, sizeof next_out, "%s/next", p.out);
    snprintf(next_model, sizeof next_model, "%s/output", out2);
    load_spec(&p, next_model, next_out, "\"hyperparameters\":{\"max_steps\":1},", &spec);
    TEST_OK(trainer_run(&spec, &quiet, &res, &err), &err);

    /* A LoRA job on the adapter output is refused: its adapter would be saved against the
     * base without the adapter it was trained on top of. */
    snprintf(next_out, sizeof next_out, "%s/next-lora", p.out);
    load_spec(&p, next_model, next_out, "\"hyperparameters\":{\"max_steps\":1},\"lora\":{\"rank\":4},", &spec);
    TEST_EXPECT_ERROR(trainer_run(&spec, &quiet, &res, &err), SMELT_EINVAL, &err);
    cr_expect_str_eq(err.field, "lora", "%s", err.message);
    cr_expect(strstr(err.message, "save_merged") != NULL, "%s", err.message);
    test_tmp_teardown();
}

/* A LoRA on lm_head (tied on the tiny model) trains and is saved; with save_merged the
 * job is refused at setup, before any training, since a tied head cannot merge. */
Test(trainer, lora_on_a_tied_lm_head_trains_but_cannot_merge) {
    struct test_run_paths p;
    setup_run(&p, true);
    struct smelt_error err = {0};
    struct job_spec spec;
    struct trainer_result res;
    struct trainer_options quiet = {.quiet = true};
    static const char hp[] = "\"hyperparameters\":{\"max_steps\":2,\"batch_size\":4,\"learning_rate\":0.01},"
                             "\"lora\":{\"rank\":2,\"target_modules\":[\"q_proj\",\"lm_head\"]},";
    load_spec(&p, p.model, p.out, hp, &spec);
    TEST_OK(trainer_run(&spec, &quiet, &res, &err), &err);
    char path[700];
    snprintf(path, sizeof path, "%s/output/adapter_model.safetensors", p.out);
    struct safetensors *st;
    TEST_OK(safetensors_open(path, &st, &err), &err);
    cr_expect(safetensors_find(st, "base_model.model.lm_head.lora_B.weight") != NULL, "no lm_head adapter saved");
    safetensors_close(st);
    char out2[600], merged_hp[512];
    snprintf(out2, sizeof out2, "%s-merged", p.out);
    snprintf(merged_hp, sizeof merged_hp, "%s\"save_merged\":true,", hp);
    load_spec(&p, p.model, out2, merged_hp, &spec);
    TEST_EXPECT_ERROR(trainer_run(&spec, &quiet, &res, &err), SMELT_EUNSUPPORTED, &err);
    cr_expect(strstr(err.message, "save_merged") && strstr(err.message, "tie_word_embeddings"), "%s", err.message);
    snprintf(path, sizeof path, "%s/checkpoints", out2);
    cr_expect(!path_exists(path), "the refused job trained");
    test_tmp_teardown();
}

Test(trainer, invalid_data_stops_the_job_before_training) {
    struct test_run_paths p;
    setup_run(&p, false);
    test_write_text(p.train, "{\"prompt\": \"ab>\", \"completion\": \"ba\"}\n"
                        "{\"prompt\": \"cd>\", \"completion\": \"\"}\n");
    struct smelt_error err = {0};
    struct job_spec spec;
    struct trainer_result res;
    struct trainer_options quiet = {.quiet = true};
    load_spec(&p, p.model, p.out, "\"model_init\":\"random\",", &spec);
    TEST_EXPECT_ERROR(trainer_run(&spec, &quiet, &res, &err), SMELT_EFORMAT, &err);
    cr_expect(strstr(err.message, ":2:") && strstr(err.message, "completion"), "%s", err.message);
    char ck[600];
    snprintf(ck, sizeof ck, "%s/checkpoints", p.out);
    cr_expect(!path_exists(ck), "a checkpoint was written for invalid data");
    cr_expect_eq(res.steps, 0);
    test_tmp_teardown();
}

/* hyperparameters.comm_timeout_s is the ranks' collective timeout in milliseconds. */
Test(trainer, comm_timeout_from_the_spec) {
    struct smelt_error err = {0};
    struct job_spec s;
    TEST_OK(spec_from("{\"type\":\"sft\",\"model\":\"m\",\"data\":{\"train\":\"t\"},\"output_dir\":\"o\","
                      "\"hyperparameters\":{\"comm_timeout_s\":1.5}}", &s, &err), &err);
    cr_expect_eq(trainer_comm_timeout_ms(&s), 1500);
    TEST_OK(spec_from("{\"type\":\"sft\",\"model\":\"m\",\"data\":{\"train\":\"t\"},\"output_dir\":\"o\","
                      "\"hyperparameters\":{\"comm_timeout_s\":604800}}", &s, &err), &err);
    cr_expect_eq(trainer_comm_timeout_ms(&s), 604800000);
}
