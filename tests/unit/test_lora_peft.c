/* LoRA against PEFT: adapters PEFT saved on the parity base models
 * (tests/parity/make_lora_fixtures.py) load in smelt with PEFT's logits, logprobs and
 * adapter gradients; smelt saves them back with the same tensor names, shapes and
 * values and an adapter_config.json that says the same; broken adapter directories
 * are refused naming the file and the field or tensor. */
#include "tests/unit/lora_testutil.h"

#include <sys/stat.h>
#include <unistd.h>

/* Every tensor of a and b: same names, shapes and bits. */
static void expect_same_tensors(const char *a_path, const char *b_path) {
    struct smelt_error err;
    struct safetensors *a, *b;
    TEST_OK(safetensors_open(a_path, &a, &err), &err);
    TEST_OK(safetensors_open(b_path, &b, &err), &err);
    cr_expect_eq(a->n_entries, b->n_entries, "%s has %zu tensors, %s %zu", a_path, a->n_entries, b_path, b->n_entries);
    for (size_t i = 0; i < a->n_entries; i++) {
        const struct safetensors_entry *ea = &a->entries[i], *eb = safetensors_find(b, ea->name);
        cr_expect(eb != NULL, "%s lacks %s", b_path, ea->name);
        if (!eb) continue;
        cr_expect(ea->ndim == eb->ndim && ea->shape[0] == eb->shape[0] && ea->shape[1] == eb->shape[1] &&
                  ea->dtype == eb->dtype, "%s: shape or dtype differs", ea->name);
        cr_expect(ea->nbytes == eb->nbytes && memcmp(ea->data, eb->data, ea->nbytes) == 0, "%s: values differ", ea->name);
    }
    safetensors_close(a);
    safetensors_close(b);
}

static bool json_list_has(const json_t *list, const char *s) {
    size_t i;
    const json_t *v;
    json_array_foreach(list, i, v) if (json_is_string(v) && strcmp(json_string_value(v), s) == 0) return true;
    return false;
}

/* The same set of names; PEFT's "all-linear" saves full module paths, which smelt
 * writes as the names of the kinds it wraps in every layer. */
static void expect_same_targets(const json_t *ours, const json_t *peft, const char *type) {
    bool full_paths = false;
    size_t i;
    const json_t *v;
    json_array_foreach(peft, i, v) full_paths |= strchr(json_string_value(v), '.') != NULL;
    if (full_paths) {
        static const char *const all[] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
        cr_expect_eq(json_array_size(ours), 7, "%s: target_modules", type);
        for (int k = 0; k < 7; k++) cr_expect(json_list_has(ours, all[k]), "%s: %s not in target_modules", type, all[k]);
        return;
    }
    cr_expect_eq(json_array_size(ours), json_array_size(peft), "%s: target_modules differ in length", type);
    json_array_foreach(peft, i, v) cr_expect(json_list_has(ours, json_string_value(v)), "%s: target %s missing", type,
                                             json_string_value(v));
}

static void expect_same_config(const char *ours_path, const char *peft_path, const char *type) {
    struct smelt_error err;
    json_t *ours, *peft;
    TEST_OK(json_load_path(ours_path, &ours, &err), &err);
    TEST_OK(json_load_path(peft_path, &peft, &err), &err);
    static const char *const same[] = {"r", "lora_alpha", "lora_dropout", "fan_in_fan_out", "use_rslora", "use_dora",
                                       "bias", "peft_type", "task_type"};
    for (size_t i = 0; i < sizeof same / sizeof *same; i++)
        cr_expect(json_equal(json_object_get(ours, same[i]), json_object_get(peft, same[i])), "%s: '%s' differs from PEFT's",
                  type, same[i]);
    expect_same_targets(json_object_get(ours, "target_modules"), json_object_get(peft, "target_modules"), type);
    cr_expect_str_eq(json_string_value(json_object_get(ours, "base_model_name_or_path")),
                     json_string_value(json_object_get(peft, "base_model_name_or_path")));
    json_decref(ours);
    json_decref(peft);
}

static void check_peft(const char *type) {
    struct smelt_error err;
    char base[256], adapter[256], path[512], ours[512], out[256];
    snprintf(base, sizeof base, PARITY_DIR "/%s", type);
    snprintf(adapter, sizeof adapter, PARITY_DIR "/%s-lora", type);
    struct model *m;
    struct lora *l;
    TEST_OK(model_load(base, BACKEND_CPU, &m, &err), &err);
    TEST_OK(lora_load(m, adapter, &l, &err), &err);
    TEST_OK(lora_attach(l, &err), &err);
    struct parity_packed p;
    parity_load_inputs(type, &p);
    int64_t V = m->config.vocab_size;
    float *logits = test_zeros_f32(p.T * V), lp[64];
    struct model_acts *acts;
    TEST_OK(model_acts_alloc(m, p.T, false, &acts, &err), &err);
    lora_forward(m, acts, &p, logits, lp);
    lora_backward(m, acts, &p);

    struct safetensors *st;
    snprintf(path, sizeof path, "%s/expected.safetensors", adapter);
    TEST_OK(safetensors_open(path, &st, &err), &err);
    char name[256];
    parity_expect_outputs(st, &p, logits, lp, V);
    const float *g = l->grads.data;
    for (int i = 0; i < l->n_params; i++) {
        snprintf(name, sizeof name, "grad.%s", l->params[i].name);
        parity_expect_matches(st, name, g + l->params[i].offset, l->params[i].numel, 1e-3, 1e-4);
    }
    cr_expect_eq((size_t)l->n_params + 2 * (size_t)p.n_seqs, st->n_entries, "%s: PEFT has other adapter tensors", type);
    safetensors_close(st);

    /* Saved by smelt: PEFT's tensors exactly, and the same config. */
    TEST_OK(lora_save(l, test_tmp_path(out, sizeof out, "saved"), base, &err), &err);
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", adapter);
    snprintf(ours, sizeof ours, "%s/adapter_model.safetensors", out);
    expect_same_tensors(path, ours);
    snprintf(path, sizeof path, "%s/adapter_config.json", adapter);
    snprintf(ours, sizeof ours, "%s/adapter_config.json", out);
    expect_same_config(ours, path, type);

    free(logits);
    model_acts_free(acts);
    lora_free(l);
    model_free(m);
}

Test(lora, peft_llama, .init = test_tmp_setup, .fini = test_tmp_teardown) { check_peft("llama"); }
Test(lora, peft_gpt2, .init = test_tmp_setup, .fini = test_tmp_teardown) { check_peft("gpt2"); }
Test(lora, peft_qwen3, .init = test_tmp_setup, .fini = test_tmp_teardown) { check_peft("qwen3"); }

/* ---- broken adapter directories ---- */

/* A copy of the llama fixture's adapter in test_tmp_dir/name with one config field
 * replaced (value NULL: removed; key NULL: config unchanged). */
static const char *copy_adapter(const char *name, const char *key, const char *value_json, char *dir,
                                size_t dir_bytes) {
    struct smelt_error err;
    static int copies;
    char unique[128];
    snprintf(unique, sizeof unique, "%s-%d", name, copies++);
    test_tmp_path(dir, dir_bytes, unique);
    cr_assert(mkdir(dir, 0755) == 0, "mkdir %s", dir);
    char src[256], dst[512];
    json_t *cfg;
    TEST_OK(json_load_path(PARITY_DIR "/llama-lora/adapter_config.json", &cfg, &err), &err);
    if (key && value_json) {
        json_error_t jerr;
        json_t *v = json_loads(value_json, JSON_DECODE_ANY, &jerr);
        cr_assert(v, "%s", value_json);
        json_object_set_new(cfg, key, v);
    } else if (key) {
        json_object_del(cfg, key);
    }
    snprintf(dst, sizeof dst, "%s/adapter_config.json", dir);
    TEST_OK(json_save_atomic(cfg, JSON_INDENT(2), dst, &err), &err);
    json_decref(cfg);
    snprintf(src, sizeof src, PARITY_DIR "/llama-lora/adapter_model.safetensors");
    char *data;
    size_t len;
    TEST_OK(file_read_all(src, &data, &len, &err), &err);
    snprintf(dst, sizeof dst, "%s/adapter_model.safetensors", dir);
    TEST_OK(file_write_atomic(dst, data, len, &err), &err);
    free(data);
    return dir;
}

static void expect_load_error(struct model *m, const char *dir, int code, const char *want1, const char *want2) {
    struct smelt_error err;
    struct lora *l = NULL;
    TEST_EXPECT_ERROR(lora_load(m, dir, &l, &err), code, &err);
    cr_expect(strstr(err.message, want1) != NULL, "'%s' not in: %s", want1, err.message);
    if (want2) cr_expect(strstr(err.message, want2) != NULL, "'%s' not in: %s", want2, err.message);
    cr_expect(l == NULL);
}

static void expect_config_refused(struct model *m, const char *key, const char *value, int code) {
    char dir[256];
    copy_adapter(key, key, value, dir, sizeof dir);
    expect_load_error(m, dir, code, "adapter_config.json", key);
}

Test(lora, load_config_errors, .init = test_tmp_setup, .fini = test_tmp_teardown) {
    struct smelt_error err;
    struct model *m;
    TEST_OK(model_load(PARITY_DIR "/llama", BACKEND_CPU, &m, &err), &err);
    expect_config_refused(m, "use_dora", "true", SMELT_EUNSUPPORTED);
    expect_config_refused(m, "rank_pattern", "{\"q_proj\": 8}", SMELT_EUNSUPPORTED);
    expect_config_refused(m, "alpha_pattern", "{\"q_proj\": 8}", SMELT_EUNSUPPORTED);
    expect_config_refused(m, "layers_to_transform", "[0]", SMELT_EUNSUPPORTED);
    expect_config_refused(m, "modules_to_save", "[\"lm_head\"]", SMELT_EUNSUPPORTED);
    expect_config_refused(m, "lora_bias", "true", SMELT_EUNSUPPORTED);
    expect_config_refused(m, "some_future_feature", "{\"on\": true}", SMELT_EUNSUPPORTED);
    expect_config_refused(m, "bias", "\"all\"", SMELT_EUNSUPPORTED);
    expect_config_refused(m, "peft_type", "\"LOHA\"", SMELT_EUNSUPPORTED);
    expect_config_refused(m, "r", "0", SMELT_EINVAL);
    expect_config_refused(m, "lora_alpha", "0", SMELT_EINVAL);
    expect_config_refused(m, "lora_dropout", "1.0", SMELT_EINVAL);
    expect_config_refused(m, "target_modules", "\".*q_proj\"", SMELT_EUNSUPPORTED);
    expect_config_refused(m, "target_modules", "[\"q_proj\", \"c_attn\"]", SMELT_EINVAL);
    expect_config_refused(m, "target_modules", "[]", SMELT_EINVAL);

    /* Off features and inert fields load; so does "all-linear" (this adapter has them all). */
    char dir[256];
    struct lora *l;
    TEST_OK(lora_load(m, copy_adapter("off", "a_future_feature", "null", dir, sizeof dir), &l, &err), &err);
    lora_free(l);
    TEST_OK(lora_load(m, copy_adapter("all", "target_modules", "\"all-linear\"", dir, sizeof dir), &l, &err), &err);
    cr_expect_eq(l->n_params, 28);
    lora_free(l);
    TEST_OK(lora_load(m, copy_adapter("inert", "init_lora_weights", "\"gaussian\"", dir, sizeof dir), &l, &err), &err);
    lora_free(l);
    /* A rank that disagrees with the tensors: the tensor's shape is refused. */
    copy_adapter("rank8", "r", "8", dir, sizeof dir);
    expect_load_error(m, dir, SMELT_EINVAL, "adapter_model.safetensors", "lora_A.weight");
    /* Fewer targets than tensors: the extra tensors are refused. */
    copy_adapter("fewer", "target_modules", "[\"q_proj\", \"k_proj\", \"v_proj\", \"o_proj\", \"gate_proj\", \"up_proj\"]",
                 dir, sizeof dir);
    expect_load_error(m, dir, SMELT_EFORMAT, "adapter_model.safetensors", "down_proj");
    model_free(m);
}

/* Rewrites the llama fixture's tensors into dir, dropping `drop`, reshaping `reshape`
 * to [5, cols] and adding `extra`. */
static void write_tensors(const char *dir, const char *drop, const char *reshape, const char *extra) {
    struct smelt_error err;
    struct safetensors *st;
    TEST_OK(safetensors_open(PARITY_DIR "/llama-lora/adapter_model.safetensors", &st, &err), &err);
    size_t n = st->n_entries;
    struct safetensors_tensor_desc *desc = calloc(n + 1, sizeof *desc);
    float **bufs = calloc(n + 1, sizeof *bufs);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        const struct safetensors_entry *e = &st->entries[i];
        if (drop && strcmp(e->name, drop) == 0) continue;
        int64_t shape[2] = {e->shape[0], e->shape[1]};
        if (reshape && strcmp(e->name, reshape) == 0) shape[0] = 5;
        bufs[k] = test_zeros_f32(shape[0] * shape[1]);
        memcpy(bufs[k], e->data, (size_t)(e->numel < shape[0] * shape[1] ? e->numel : shape[0] * shape[1]) * sizeof(float));
        desc[k] = (struct safetensors_tensor_desc){.name = e->name, .tensor = tensor_f32(bufs[k], 2, shape),
                                                   .file_dtype = DTYPE_F32};
        k++;
    }
    if (extra) {
        int64_t shape[2] = {4, 32};
        bufs[k] = test_zeros_f32(128);
        desc[k] = (struct safetensors_tensor_desc){.name = extra, .tensor = tensor_f32(bufs[k], 2, shape),
                                                   .file_dtype = DTYPE_F32};
        k++;
    }
    char path[512];
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    TEST_OK(safetensors_write(path, desc, k, NULL, 0, &err), &err);
    for (size_t i = 0; i < k; i++) free(bufs[i]);
    free(bufs), free(desc);
    safetensors_close(st);
}

Test(lora, load_tensor_errors, .init = test_tmp_setup, .fini = test_tmp_teardown) {
    struct smelt_error err;
    struct model *m;
    TEST_OK(model_load(PARITY_DIR "/llama", BACKEND_CPU, &m, &err), &err);
    char dir[256];
    const char *q1b = "base_model.model.model.layers.1.self_attn.q_proj.lora_B.weight";
    copy_adapter("missing", NULL, NULL, dir, sizeof dir);
    write_tensors(dir, q1b, NULL, NULL);
    expect_load_error(m, dir, SMELT_ENOTFOUND, "adapter_model.safetensors", q1b);
    copy_adapter("shape", NULL, NULL, dir, sizeof dir);
    write_tensors(dir, NULL, q1b, NULL);
    expect_load_error(m, dir, SMELT_EINVAL, "adapter_model.safetensors", q1b);
    copy_adapter("extra", NULL, NULL, dir, sizeof dir);
    const char *extra = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight";
    write_tensors(dir, NULL, NULL, extra);
    expect_load_error(m, dir, SMELT_EFORMAT, "adapter_model.safetensors", extra);
    /* The unchanged rewrite loads: the errors above are the edits'. */
    copy_adapter("same", NULL, NULL, dir, sizeof dir);
    write_tensors(dir, NULL, NULL, NULL);
    struct lora *l;
    TEST_OK(lora_load(m, dir, &l, &err), &err);
    lora_free(l);
    /* No weights file, no config, a base of another architecture. */
    copy_adapter("noweights", NULL, NULL, dir, sizeof dir);
    char path[512];
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    cr_assert(unlink(path) == 0);
    expect_load_error(m, dir, SMELT_ENOTFOUND, "adapter_model.safetensors", NULL);
    test_tmp_path(dir, sizeof dir, "empty");
    cr_assert(mkdir(dir, 0755) == 0);
    expect_load_error(m, dir, SMELT_EIO, "adapter_config.json", NULL);
    struct model *gpt2;
    TEST_OK(model_load(PARITY_DIR "/gpt2", BACKEND_CPU, &gpt2, &err), &err);
    expect_load_error(gpt2, PARITY_DIR "/llama-lora", SMELT_EINVAL, "adapter_config.json", "names no linear layer");
    model_free(gpt2);
    model_free(m);
}
