/* model/rope.c and config_rope.c: each scaled rope table equals the one transformers
 * computes (tests/data/parity/rope_tables.json, made by tests/parity/make_rope_fixtures.py
 * on the rope_scaling of Llama 3.1/3.2, Qwen2.5 YaRN, DeepSeek-style YaRN and small
 * configs) within 2 f32 ulps — torch's vectorised f32 pow is not correctly rounded (1 ulp
 * off at some exponents), smelt's is; the scale multiplies cos and sin (a float64 check of a scaled
 * rotation and of its backward); config.json's scaling is read back as written; and
 * what smelt does not implement is refused naming the field. */
#include <string.h>

#include "model/model.h"
#include "tests/unit/parity_testutil.h"

static json_t *fixture_cases(void) {
    json_t *root = NULL;
    struct smelt_error err = {0};
    TEST_OK(json_load_path(PARITY_DIR "/rope_tables.json", &root, &err), &err);
    json_t *cases = json_object_get(root, "cases");
    cr_assert(json_array_size(cases) >= 5);
    json_incref(cases);
    json_decref(root);
    return cases;
}

Test(rope_scaling, tables_equal_transformers) {
    json_t *cases = fixture_cases();
    size_t k;
    json_t *cs;
    json_array_foreach(cases, k, cs) {
        const char *name = json_string_value(json_object_get(cs, "name"));
        struct model_config c;
        struct smelt_error err = {0};
        TEST_OK(model_config_from_json(json_object_get(cs, "config"), name, &c, &err), &err);
        json_t *want = json_object_get(cs, "inv_freq");
        cr_assert_eq((int64_t)json_array_size(want), c.head_dim / 2, "%s", name);
        float *got = test_zeros_f32(c.head_dim / 2), scale = 0;
        TEST_OK(model_rope_table(&c, got, &scale, &err), &err);
        int64_t off = 0;
        for (int64_t i = 0; i < c.head_dim / 2; i++) {
            float w = (float)json_real_value(json_array_get(want, (size_t)i));
            if (!(fabsf(got[i] - w) <= 2 * (nextafterf(w, INFINITY) - w))) {
                if (!off) cr_log_error("%s: inv_freq[%lld] %.9g, transformers %.9g", name, (long long)i, got[i], w);
                off++;
            }
        }
        cr_expect_eq(off, 0, "%s: %lld of %lld entries beyond 2 ulps", name, (long long)off,
                     (long long)c.head_dim / 2);
        cr_expect_eq(scale, (float)json_real_value(json_object_get(cs, "attention_scaling")), "%s: scale %.9g", name,
                     scale);
        free(got);
    }
    json_decref(cases);
}

/* y = s R(a) x against float64; the backward is its transpose: <y, g> = <x, dx>. */
Test(rope_scaling, the_scale_multiplies_the_rotation_and_its_backward) {
    enum { T = 5, H = 2, D = 8 };
    float x[T * H * D], y[T * H * D], g[T * H * D], dx[T * H * D] = {0};
    int32_t pos[T] = {0, 1, 7, 100, 3};
    float inv_freq[D / 2] = {1.0f, 0.25f, 0.0625f, 0.001f};
    for (int i = 0; i < T * H * D; i++) x[i] = sinf((float)i * 0.7f), g[i] = cosf((float)i * 0.3f);
    int64_t sh[3] = {T, H, D}, n = T;
    struct tensor tx = tensor_f32(x, 3, sh), ty = tensor_f32(y, 3, sh), tg = tensor_f32(g, 3, sh),
                  tdx = tensor_f32(dx, 3, sh), tp = tensor_i32(pos, 1, &n);
    struct ops_rope_freqs f = {inv_freq, D / 2, 1.25f};
    struct smelt_error err = {0};
    TEST_OK(ops_rope_with(&ty, &tx, &tp, &f, &err), &err);
    TEST_OK(ops_rope_with_backward(&tdx, &tg, &tp, &f, &err), &err);
    double yg = 0, xdx = 0;
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < D / 2; i++) {
                int at = (t * H + h) * D + i;
                double a = (double)((float)pos[t] * inv_freq[i]), c = 1.25 * cos(a), s = 1.25 * sin(a);
                cr_expect_float_eq(y[at], x[at] * c - x[at + D / 2] * s, 1e-5);
                cr_expect_float_eq(y[at + D / 2], x[at + D / 2] * c + x[at] * s, 1e-5);
            }
    for (int i = 0; i < T * H * D; i++) yg += (double)y[i] * g[i], xdx += (double)x[i] * dx[i];
    cr_expect(fabs(yg - xdx) < 1e-4 * fabs(yg) + 1e-5, "<y,g> %g, <x,dx> %g", yg, xdx);
    f.n = 3;
    TEST_EXPECT_ERROR(ops_rope_with(&ty, &tx, &tp, &f, &err), SMELT_EINVAL, &err);
    f.n = D / 2, f.scale = 0;
    TEST_EXPECT_ERROR(ops_rope_with(&ty, &tx, &tp, &f, &err), SMELT_EINVAL, &err);
}

static struct model_config config_of(const char *text) {
    json_t *j = json_loads(text, 0, NULL);
    cr_assert(j, "%s", text);
    struct model_config c;
    struct smelt_error err = {0};
    TEST_OK(model_config_from_json(j, "cfg.json", &c, &err), &err);
    json_decref(j);
    return c;
}

#define SMALL(extra)                                                                                              \
    "{\"model_type\": \"llama\", \"hidden_size\": 64, \"num_hidden_layers\": 1, \"num_attention_heads\": 4, "     \
    "\"intermediate_size\": 32, \"vocab_size\": 50, \"max_position_embeddings\": 4096" extra "}"

Test(rope_scaling, written_and_read_back) {
    const char *const texts[] = {
        SMALL(", \"rope_scaling\": {\"type\": \"linear\", \"factor\": 2}"),
        SMALL(", \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8, \"low_freq_factor\": 1, "
              "\"high_freq_factor\": 4, \"original_max_position_embeddings\": 1024}"),
        SMALL(", \"rope_parameters\": {\"rope_type\": \"yarn\", \"rope_theta\": 1e6, \"factor\": 4, "
              "\"original_max_position_embeddings\": 1024, \"mscale\": 1, \"mscale_all_dim\": 0.5, \"truncate\": false}"),
        SMALL(", \"original_max_position_embeddings\": 512, \"rope_scaling\": {\"rope_type\": \"yarn\", "
              "\"factor\": null}"),
    };
    for (size_t i = 0; i < sizeof texts / sizeof *texts; i++) {
        struct model_config c = config_of(texts[i]), back;
        json_t *j = NULL;
        struct smelt_error err = {0};
        TEST_OK(model_config_to_json(&c, &j, &err), &err);
        TEST_OK(model_config_from_json(j, "written", &back, &err), &err);
        cr_expect(model_rope_scaling_equal(&c.rope_scaling, &back.rope_scaling), "%s", texts[i]);
        cr_expect_eq(c.rope_theta, back.rope_theta);
        json_decref(j);
    }
    struct model_config c = config_of(texts[3]);
    cr_expect_eq(c.rope_scaling.original_max_position_embeddings, 512, "the top level's wins");
    cr_expect_eq(c.rope_scaling.factor, 8.0, "null factor: max_position_embeddings / original");
    cr_expect_eq(c.rope_scaling.beta_fast, 32);
    cr_expect(c.rope_scaling.truncate);
    c = config_of(texts[2]);
    cr_expect_eq(c.rope_theta, 1e6);
    cr_expect(!c.rope_scaling.truncate);
}

static void expect_refused(const char *text, int code, const char *field, const char *says) {
    json_t *j = json_loads(text, 0, NULL);
    cr_assert(j, "%s", text);
    struct model_config c;
    struct smelt_error err = {0};
    TEST_EXPECT_ERROR(model_config_from_json(j, "cfg.json", &c, &err), code, &err);
    cr_expect_str_eq(err.field, field, "%s", err.message);
    cr_expect(strstr(err.message, says), "'%s' lacks '%s'", err.message, says);
    json_decref(j);
}

Test(rope_scaling, refusals_name_the_field) {
    expect_refused(SMALL(", \"rope_scaling\": {\"rope_type\": \"dynamic\", \"factor\": 2}"), SMELT_EUNSUPPORTED,
                   "rope_scaling", "'dynamic' is not implemented");
    expect_refused(SMALL(", \"rope_parameters\": {\"rope_type\": \"longrope\", \"short_factor\": [1]}"),
                   SMELT_EUNSUPPORTED, "rope_parameters", "'longrope' is not implemented");
    expect_refused(SMALL(", \"rope_scaling\": {\"rope_type\": \"linear\"}"), SMELT_EINVAL, "factor", "factor");
    expect_refused(SMALL(", \"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 0.5}"), SMELT_EINVAL, "factor",
                   "factor");
    expect_refused(SMALL(", \"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 2, \"beta_fast\": 3}"),
                   SMELT_EUNSUPPORTED, "rope_scaling", "rope_scaling.beta_fast is not a parameter of rope_type "
                   "'linear'");
    expect_refused(SMALL(", \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8, \"low_freq_factor\": 1}"),
                   SMELT_EINVAL, "high_freq_factor", "high_freq_factor");
    expect_refused(SMALL(", \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8, \"low_freq_factor\": 4, "
                         "\"high_freq_factor\": 1}"),
                   SMELT_EINVAL, "high_freq_factor", "must be above low_freq_factor");
    expect_refused(SMALL(", \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4, \"truncate\": 1}"),
                   SMELT_EINVAL, "truncate", "truncate");
    expect_refused(SMALL(", \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4, "
                         "\"partial_rotary_factor\": 0.5}"),
                   SMELT_EUNSUPPORTED, "partial_rotary_factor", "partial_rotary_factor 0.5");
}
