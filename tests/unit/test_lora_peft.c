/* LoRA against PEFT: adapters PEFT saved on the parity base models
 * (tests/parity/make_lora_fixtures.py) load in smelt with PEFT's logits, logprobs and
 * adapter gradients; smelt saves them back with the same tensor names, shapes and
 * values and an adapter_config.json that says the same; broken adapter directories
 * are refused naming the file and the field or tensor. LoRA reward models (PEFT's
 * SEQ_CLS adapters with the head trained in full, make_reward_lora_fixtures.py) the
 * same way, with scores and the head's gradient, and smelt's own round trip. */
#include "tests/unit/lora_testutil.h"

#include <sys/stat.h>
#include <unistd.h>

/* PEFT saves a targeted lm_head's base weight beside the adapter; smelt does not. */
static const char lm_head_base[] = "base_model.model.lm_head.base_layer.weight";

/* Every tensor of a (PEFT's) and b (smelt's): same names, shapes and bits, but for
 * the lm_head base weight a may hold. */
static void expect_same_tensors(const char *a_path, const char *b_path) {
    struct smelt_error err;
    struct safetensors *a, *b;
    TEST_OK(safetensors_open(a_path, &a, &err), &err);
    TEST_OK(safetensors_open(b_path, &b, &err), &err);
    size_t n_a = a->n_entries - (safetensors_find(a, lm_head_base) != NULL);
    cr_expect_eq(n_a, b->n_entries, "%s has %zu adapter tensors, %s %zu", a_path, n_a, b_path, b->n_entries);
    for (size_t i = 0; i < a->n_entries; i++) {
        if (strcmp(a->entries[i].name, lm_head_base) == 0) continue;
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

/* fixture: the adapter directory's name in tests/data/parity/, on base type. */
static void check_peft_fixture(const char *type, const char *fixture) {
    struct smelt_error err;
    char base[256], adapter[256], path[512], ours[512], out[256];
    snprintf(base, sizeof base, PARITY_DIR "/%s", type);
    snprintf(adapter, sizeof adapter, PARITY_DIR "/%s", fixture);
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

static void check_peft(const char *type) {
    char fixture[64];
    snprintf(fixture, sizeof fixture, "%s-lora", type);
    check_peft_fixture(type, fixture);
}

Test(lora, peft_llama, .init = test_tmp_setup, .fini = test_tmp_teardown) { check_peft("llama"); }
Test(lora, peft_gpt2, .init = test_tmp_setup, .fini = test_tmp_teardown) { check_peft("gpt2"); }
Test(lora, peft_qwen3, .init = test_tmp_setup, .fini = test_tmp_teardown) { check_peft("qwen3"); }
/* c_attn and the output projection, tied to the embeddings (PEFT's train_unembed). */
Test(lora, peft_gpt2_lm_head, .init = test_tmp_setup, .fini = test_tmp_teardown) {
    check_peft_fixture("gpt2", "gpt2-head-lora");
}

/* PEFT's copy of the base lm_head in the file must be the model's own: smelt does not
 * replace base weights from an adapter. */
Test(lora, peft_lm_head_base_of_another_model) {
    struct smelt_error err;
    struct model_config c;
    TEST_OK(model_config_load(PARITY_DIR "/gpt2", &c, &err), &err);
    struct model *m;
    TEST_OK(model_init_random(&c, 3, BACKEND_CPU, &m, &err), &err);
    struct lora *l = NULL;
    TEST_EXPECT_ERROR(lora_load(m, PARITY_DIR "/gpt2-head-lora", &l, &err), SMELT_EUNSUPPORTED, &err);
    cr_expect(strstr(err.message, lm_head_base) != NULL, "%s", err.message);
    model_free(m);
}

/* ---- broken adapter directories ---- */

/* A copy of the fixture adapter src in test_tmp_dir/name with one config field
 * replaced (value NULL: removed; key NULL: config unchanged). */
static const char *copy_adapter_from(const char *src_dir, const char *name, const char *key, const char *value_json,
                                     char *dir, size_t dir_bytes) {
    struct smelt_error err;
    static int copies;
    char unique[128];
    snprintf(unique, sizeof unique, "%s-%d", name, copies++);
    test_tmp_path(dir, dir_bytes, unique);
    cr_assert(mkdir(dir, 0755) == 0, "mkdir %s", dir);
    char src[256], dst[512];
    json_t *cfg;
    snprintf(src, sizeof src, "%s/adapter_config.json", src_dir);
    TEST_OK(json_load_path(src, &cfg, &err), &err);
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
    snprintf(src, sizeof src, "%s/adapter_model.safetensors", src_dir);
    char *data;
    size_t len;
    TEST_OK(file_read_all(src, &data, &len, &err), &err);
    snprintf(dst, sizeof dst, "%s/adapter_model.safetensors", dir);
    TEST_OK(file_write_atomic(dst, data, len, &err), &err);
    free(data);
    return dir;
}

static const char *copy_adapter(const char *name, const char *key, const char *value_json, char *dir,
                                size_t dir_bytes) {
    return copy_adapter_from(PARITY_DIR "/llama-lora", name, key, value_json, dir, dir_bytes);
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

/* Rewrites the tensors of the fixture adapter src into dir, dropping `drop`, reshaping
 * `reshape` to [5, cols] and adding `extra`. */
static void write_tensors_from(const char *src, const char *dir, const char *drop, const char *reshape,
                               const char *extra) {
    struct smelt_error err;
    struct safetensors *st;
    char path[512];
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", src);
    TEST_OK(safetensors_open(path, &st, &err), &err);
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
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    TEST_OK(safetensors_write(path, desc, k, NULL, 0, &err), &err);
    for (size_t i = 0; i < k; i++) free(bufs[i]);
    free(bufs), free(desc);
    safetensors_close(st);
}

static void write_tensors(const char *dir, const char *drop, const char *reshape, const char *extra) {
    write_tensors_from(PARITY_DIR "/llama-lora", dir, drop, reshape, extra);
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

/* ---- LoRA reward models: PEFT's SEQ_CLS adapters, the head trained in full ---- */

/* A reward fixture's sequences packed into one row, dL/dscore per sequence and the pad
 * id (tests/parity/make_reward_lora_fixtures.py's inputs.json). */
struct rm_inputs {
    int64_t T, pad;
    int n_seqs;
    int32_t ids[64], cu[8];
    float weights[8];
};

static void load_rm_inputs(const char *dir, struct rm_inputs *in) {
    char path[300];
    snprintf(path, sizeof path, "%s/inputs.json", dir);
    json_t *root;
    struct smelt_error err;
    TEST_OK(json_load_path(path, &root, &err), &err);
    json_t *seqs = json_object_get(root, "sequences"), *ws = json_object_get(root, "score_weights");
    memset(in, 0, sizeof *in);
    in->pad = json_integer_value(json_object_get(root, "pad_token_id"));
    in->n_seqs = (int)json_array_size(seqs);
    cr_assert(in->n_seqs > 0 && in->n_seqs < 8 && json_array_size(ws) == (size_t)in->n_seqs);
    for (int s = 0; s < in->n_seqs; s++) {
        json_t *seq = json_array_get(seqs, (size_t)s);
        in->cu[s] = (int32_t)in->T;
        in->weights[s] = (float)json_real_value(json_array_get(ws, (size_t)s));
        for (size_t t = 0; t < json_array_size(seq); t++) {
            cr_assert(in->T < 64);
            in->ids[in->T++] = (int32_t)json_integer_value(json_array_get(seq, t));
        }
    }
    in->cu[in->n_seqs] = (int32_t)in->T;
    json_decref(root);
}

static struct model_batch rm_batch(const struct rm_inputs *in) {
    return (struct model_batch){.n_tokens = in->T, .n_seqs = in->n_seqs, .ids = in->ids, .cu_seqlens = in->cu};
}

/* The scores of the batch with whatever head the model reads (an attached adapter's). */
static void rm_scores(struct model *m, struct model_acts *acts, const struct rm_inputs *in, float *hidden,
                      float *scores) {
    int64_t hs[2] = {in->T, m->config.hidden_size}, S = in->n_seqs;
    struct tensor th = tensor_f32(hidden, 2, hs), ts = tensor_f32(scores, 1, &S);
    struct model_batch b = rm_batch(in);
    struct smelt_error err;
    TEST_OK(model_forward(m, acts, &b, NULL, NULL, &th, &err), &err);
    TEST_OK(model_score_forward(m, &b, &th, &ts, &err), &err);
}

/* L = sum_s w[s] score[s] into the adapter's gradients: the head's (score_grad, the
 * frozen base has no gradient buffer), then the LoRA pairs' through the body. */
static void rm_backward(struct lora *l, struct model_acts *acts, const struct rm_inputs *in, float *hidden) {
    struct model *m = l->model;
    int64_t hs[2] = {in->T, m->config.hidden_size}, S = in->n_seqs;
    float *dh = test_zeros_f32(hs[0] * hs[1]);
    struct tensor th = tensor_f32(hidden, 2, hs), tdh = tensor_f32(dh, 2, hs);
    struct tensor tds = tensor_f32((float *)in->weights, 1, &S);
    struct model_batch b = rm_batch(in);
    struct smelt_error err;
    TEST_OK(tensor_zero(&l->grads, &err), &err);
    TEST_OK(model_score_backward(m, &b, &th, &tds, &l->score_grad, &tdh, &err), &err);
    TEST_OK(model_backward(m, acts, NULL, &tdh, &err), &err);
    free(dh);
}

/* FNV-1a over the bytes: has a buffer changed at all? */
static uint64_t hash_f32(const float *x, int64_t n) {
    const unsigned char *p = (const unsigned char *)x;
    uint64_t h = 0xcbf29ce484222325u;
    for (size_t i = 0; i < (size_t)n * sizeof *x; i++) h = (h ^ p[i]) * 0x100000001b3u;
    return h;
}

static double max_abs_diff(const float *a, const float *b, int n) {
    double d = 0;
    for (int i = 0; i < n; i++) d = fmax(d, fabs((double)a[i] - (double)b[i]));
    return d;
}

/* PEFT's adapter on the causal-LM fixture: smelt makes the classifier, loads the head
 * from the adapter and gives PEFT's scores and gradients (LoRA pairs and head);
 * detached, the model's own head scores; merged, the adapter's head is in the model;
 * saved, the directory is PEFT's tensor for tensor, with the same config. */
static void check_peft_reward(const char *type) {
    struct smelt_error err;
    char base[256], dir[256], path[512], ours[512], out[256];
    snprintf(base, sizeof base, PARITY_DIR "/%s", type);
    snprintf(dir, sizeof dir, PARITY_DIR "/%s-rm-lora", type);
    struct rm_inputs in;
    load_rm_inputs(dir, &in);
    struct model *m;
    struct lora *l;
    TEST_OK(lora_load_with_base(dir, base, BACKEND_CPU, in.pad, &m, &l, &err), &err);
    cr_assert(m->config.score_head && m->config.pad_token_id == in.pad, "%s: no classifier with pad %lld", type,
              (long long)in.pad);
    cr_assert(l->score.data && strcmp(l->params[l->n_params - 1].name, "base_model.model.score.weight") == 0,
              "%s: the adapter carries no head", type);
    TEST_OK(lora_attach(l, &err), &err);
    cr_assert(m->w.score.data == l->score.data, "%s: attached, the model does not read the adapter's head", type);
    struct model_acts *acts;
    TEST_OK(model_acts_alloc(m, in.T, false, &acts, &err), &err);
    float *hidden = test_zeros_f32(in.T * m->config.hidden_size), scores[8], own[8], merged[8];
    rm_scores(m, acts, &in, hidden, scores);
    rm_backward(l, acts, &in, hidden);

    struct safetensors *st;
    snprintf(path, sizeof path, "%s/expected.safetensors", dir);
    TEST_OK(safetensors_open(path, &st, &err), &err);
    parity_expect_matches(st, "scores", scores, in.n_seqs, 1e-4, 1e-5);
    const float *g = l->grads.data;
    char name[256];
    for (int i = 0; i < l->n_params; i++) {
        snprintf(name, sizeof name, "grad.%s", l->params[i].name);
        parity_expect_matches(st, name, g + l->params[i].offset, l->params[i].numel, 1e-3, 1e-4);
    }
    cr_expect_eq((size_t)l->n_params + 1, st->n_entries, "%s: PEFT trains other tensors", type);
    safetensors_close(st);

    lora_detach(l);
    cr_expect(m->w.score.data != l->score.data, "%s: detached, the model still reads the adapter's head", type);
    rm_scores(m, acts, &in, hidden, own);
    cr_expect(max_abs_diff(own, scores, in.n_seqs) > 1e-2, "%s: the adapter does not change the scores", type);
    TEST_OK(lora_merge(l, &err), &err);
    rm_scores(m, acts, &in, hidden, merged);
    cr_expect(max_abs_diff(merged, scores, in.n_seqs) < 1e-4 * (1 + fabs(scores[0])),
              "%s: merged scores %g %g %g, attached %g %g %g", type, merged[0], merged[1], merged[2], scores[0], scores[1],
              scores[2]);

    TEST_OK(lora_save(l, test_tmp_path(out, sizeof out, "saved"), base, &err), &err);
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    snprintf(ours, sizeof ours, "%s/adapter_model.safetensors", out);
    expect_same_tensors(path, ours);
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    snprintf(ours, sizeof ours, "%s/adapter_config.json", out);
    expect_same_config(ours, path, type);
    json_t *a, *b;
    TEST_OK(json_load_path(ours, &a, &err), &err);
    TEST_OK(json_load_path(path, &b, &err), &err);
    cr_expect(json_equal(json_object_get(a, "modules_to_save"), json_object_get(b, "modules_to_save")),
              "%s: modules_to_save differs from PEFT's", type);
    json_decref(a);
    json_decref(b);
    free(hidden);
    model_acts_free(acts);
    lora_free(l);
    model_free(m);
}

Test(lora, peft_reward_llama, .init = test_tmp_setup, .fini = test_tmp_teardown) { check_peft_reward("llama"); }
Test(lora, peft_reward_gpt2, .init = test_tmp_setup, .fini = test_tmp_teardown) { check_peft_reward("gpt2"); }

/* smelt's own: an adapter created on a classifier carries a copy of its head (the
 * scores are the model's until it trains), trains it, saves it, and loads back from
 * its directory alone (lora_dir_info, lora_load_with_base) with the same scores; the
 * model's own head and every base weight stay as they were. */
Test(lora, reward_adapter_round_trip, .init = test_tmp_setup, .fini = test_tmp_teardown) {
    struct smelt_error err;
    const char *dir = PARITY_DIR "/llama-rm-lora";
    struct rm_inputs in;
    load_rm_inputs(dir, &in);
    struct model *lm, *m;
    TEST_OK(model_load(PARITY_DIR "/llama", BACKEND_CPU, &lm, &err), &err);
    TEST_OK(model_classifier_from_lm(lm, in.pad, 0.02, 7, &m, &err), &err);
    model_free(lm);
    struct lora_config c = {.rank = 4, .alpha = 8, .n_targets = 2, .targets = {"q_proj", "o_proj"}};
    struct lora *l;
    TEST_OK(lora_create(m, &c, 3, &l, &err), &err);
    cr_assert(l->score.data && l->n_params == 2 * 2 * 2 + 1);
    cr_expect_eq(memcmp(l->score.data, m->w.score.data, sizeof(float) * (size_t)m->config.hidden_size), 0,
                 "the head's copy does not start as the model's head");
    uint64_t hash0 = hash_f32(m->weights.data, m->n_weights);
    struct model_acts *acts;
    TEST_OK(model_acts_alloc(m, in.T, false, &acts, &err), &err);
    float *hidden = test_zeros_f32(in.T * m->config.hidden_size), before[8], trained[8], loaded[8];
    rm_scores(m, acts, &in, hidden, before);
    TEST_OK(lora_attach(l, &err), &err);
    rm_scores(m, acts, &in, hidden, trained);
    cr_expect(max_abs_diff(before, trained, in.n_seqs) == 0, "a new adapter changed the scores");
    lora_fill_random(l, 5, 0.2); /* as training would: B and the head move */
    rm_scores(m, acts, &in, hidden, trained);
    cr_expect(max_abs_diff(before, trained, in.n_seqs) > 1e-2, "the trained adapter does not change the scores");
    cr_expect_eq(hash_f32(m->weights.data, m->n_weights), hash0, "the base weights changed");

    char out[256], base[256];
    test_tmp_path(out, sizeof out, "rm-adapter");
    test_tmp_path(base, sizeof base, "rm-base");
    TEST_OK(model_save(m, base, false, &err), &err);
    TEST_OK(lora_save(l, out, base, &err), &err);
    struct lora_dir_info info;
    TEST_OK(lora_dir_info(out, &info, &err), &err);
    cr_expect(info.seq_cls);
    cr_expect_str_eq(info.base_path, base);
    struct model *m2;
    struct lora *l2;
    TEST_OK(lora_load_with_base(out, NULL, BACKEND_CPU, in.pad, &m2, &l2, &err), &err);
    cr_assert_eq(l2->n_weights, l->n_weights);
    cr_expect_eq(memcmp(l2->weights.data, l->weights.data, sizeof(float) * (size_t)l->n_weights), 0);
    TEST_OK(lora_attach(l2, &err), &err);
    rm_scores(m2, acts, &in, hidden, loaded);
    cr_expect(max_abs_diff(loaded, trained, in.n_seqs) == 0, "loaded %g, trained %g", loaded[0], trained[0]);
    lora_free(l2);
    model_free(m2);
    free(hidden);
    model_acts_free(acts);
    lora_free(l);
    model_free(m);
}

/* What a reward adapter directory may not say or hold. */
Test(lora, reward_adapter_errors, .init = test_tmp_setup, .fini = test_tmp_teardown) {
    struct smelt_error err;
    const char *src = PARITY_DIR "/llama-rm-lora";
    struct model *lm, *rm;
    TEST_OK(model_load(PARITY_DIR "/llama", BACKEND_CPU, &lm, &err), &err);
    TEST_OK(model_classifier_from_lm(lm, 2, 0.02, 7, &rm, &err), &err);
    char dir[256];
    /* A SEQ_CLS adapter needs a classifier to carry its head. */
    expect_load_error(lm, src, SMELT_EINVAL, "SEQ_CLS", "no score head");
    /* Other modules trained in full, other tasks, and a head without SEQ_CLS. */
    copy_adapter_from(src, "mts", "modules_to_save", "[\"classifier\", \"score\", \"embed_tokens\"]", dir, sizeof dir);
    expect_load_error(rm, dir, SMELT_EUNSUPPORTED, "modules_to_save", "embed_tokens");
    copy_adapter_from(src, "task", "task_type", "\"TOKEN_CLS\"", dir, sizeof dir);
    expect_load_error(rm, dir, SMELT_EUNSUPPORTED, "task_type", "TOKEN_CLS");
    copy_adapter_from(src, "causal", "task_type", "\"CAUSAL_LM\"", dir, sizeof dir);
    expect_load_error(rm, dir, SMELT_EUNSUPPORTED, "modules_to_save", "score");
    /* Without its head tensor, or with it under PEFT's in-memory name only. */
    copy_adapter_from(src, "nohead", NULL, NULL, dir, sizeof dir);
    write_tensors_from(src, dir, "base_model.model.score.weight", NULL, NULL);
    expect_load_error(rm, dir, SMELT_ENOTFOUND, "adapter_model.safetensors", "base_model.model.score.weight");
    const char *long_name = "base_model.model.score.modules_to_save.default.weight";
    copy_adapter_from(src, "longname", NULL, NULL, dir, sizeof dir);
    write_tensors_from(src, dir, NULL, NULL, long_name);
    expect_load_error(rm, dir, SMELT_EFORMAT, "adapter_model.safetensors", long_name);
    /* modules_to_save null or ["score"]: PEFT adds its default for SEQ_CLS; both load. */
    struct lora *l;
    TEST_OK(lora_load(rm, copy_adapter_from(src, "null", "modules_to_save", "null", dir, sizeof dir), &l, &err), &err);
    cr_expect(l->score.data != NULL);
    lora_free(l);
    TEST_OK(lora_load(rm, copy_adapter_from(src, "score", "modules_to_save", "[\"score\"]", dir, sizeof dir), &l, &err),
            &err);
    lora_free(l);
    /* No base named: lora_load_with_base needs one given. */
    struct model *m2;
    copy_adapter_from(src, "nobase", "base_model_name_or_path", NULL, dir, sizeof dir);
    TEST_EXPECT_ERROR(lora_load_with_base(dir, NULL, BACKEND_CPU, 2, &m2, &l, &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, "base_model_name_or_path") != NULL, "%s", err.message);
    TEST_OK(lora_load_with_base(dir, PARITY_DIR "/llama", BACKEND_CPU, 2, &m2, &l, &err), &err);
    lora_free(l);
    model_free(m2);
    model_free(rm);
    model_free(lm);
}
