/* model/config: real Hugging Face config.json files of each supported family parsed to
 * the values transformers uses, the defaults of each config class, every refusal, and
 * the config.json round trip. */
#include "tests/unit/testutil.h"

#include <ftw.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "model/config.h"

/* ---- configs as published on the Hugging Face Hub ---- */

static const char *const qwen25_05b =
    "{\"architectures\": [\"Qwen2ForCausalLM\"], \"attention_dropout\": 0.0,"
    " \"bos_token_id\": 151643, \"eos_token_id\": 151643, \"hidden_act\": \"silu\","
    " \"hidden_size\": 896, \"initializer_range\": 0.02, \"intermediate_size\": 4864,"
    " \"max_position_embeddings\": 32768, \"max_window_layers\": 24, \"model_type\": \"qwen2\","
    " \"num_attention_heads\": 14, \"num_hidden_layers\": 24, \"num_key_value_heads\": 2,"
    " \"rms_norm_eps\": 1e-06, \"rope_theta\": 1000000.0, \"sliding_window\": 32768,"
    " \"tie_word_embeddings\": true, \"torch_dtype\": \"bfloat16\","
    " \"transformers_version\": \"4.40.1\", \"use_cache\": true, \"use_mrope\": false,"
    " \"use_sliding_window\": false, \"vocab_size\": 151936}";

static const char *const qwen3_06b =
    "{\"architectures\": [\"Qwen3ForCausalLM\"], \"attention_bias\": false,"
    " \"attention_dropout\": 0.0, \"bos_token_id\": 151643, \"eos_token_id\": 151645,"
    " \"head_dim\": 128, \"hidden_act\": \"silu\", \"hidden_size\": 1024,"
    " \"initializer_range\": 0.02, \"intermediate_size\": 3072,"
    " \"max_position_embeddings\": 40960, \"max_window_layers\": 28, \"model_type\": \"qwen3\","
    " \"num_attention_heads\": 16, \"num_hidden_layers\": 28, \"num_key_value_heads\": 8,"
    " \"rms_norm_eps\": 1e-06, \"rope_scaling\": null, \"rope_theta\": 1000000,"
    " \"sliding_window\": null, \"tie_word_embeddings\": true, \"torch_dtype\": \"bfloat16\","
    " \"transformers_version\": \"4.51.0\", \"use_cache\": true, \"use_sliding_window\": false,"
    " \"vocab_size\": 151936}";

/* %s: the rope_scaling value. */
static const char *const llama32_1b_fmt =
    "{\"architectures\": [\"LlamaForCausalLM\"], \"attention_bias\": false,"
    " \"attention_dropout\": 0.0, \"bos_token_id\": 128000,"
    " \"eos_token_id\": [128001, 128008, 128009], \"head_dim\": 64, \"hidden_act\": \"silu\","
    " \"hidden_size\": 2048, \"initializer_range\": 0.02, \"intermediate_size\": 8192,"
    " \"max_position_embeddings\": 131072, \"mlp_bias\": false, \"model_type\": \"llama\","
    " \"num_attention_heads\": 32, \"num_hidden_layers\": 16, \"num_key_value_heads\": 8,"
    " \"pretraining_tp\": 1, \"rms_norm_eps\": 1e-05, \"rope_scaling\": %s,"
    " \"rope_theta\": 500000.0, \"tie_word_embeddings\": true, \"torch_dtype\": \"bfloat16\","
    " \"transformers_version\": \"4.45.0.dev0\", \"use_cache\": true, \"vocab_size\": 128256}";

static const char *const llama3_rope =
    "{\"factor\": 32.0, \"high_freq_factor\": 4.0, \"low_freq_factor\": 1.0,"
    " \"original_max_position_embeddings\": 8192, \"rope_type\": \"llama3\"}";

static const char *const llama2_7b =
    "{\"architectures\": [\"LlamaForCausalLM\"], \"bos_token_id\": 1, \"eos_token_id\": 2,"
    " \"hidden_act\": \"silu\", \"hidden_size\": 4096, \"initializer_range\": 0.02,"
    " \"intermediate_size\": 11008, \"max_position_embeddings\": 4096,"
    " \"model_type\": \"llama\", \"num_attention_heads\": 32, \"num_hidden_layers\": 32,"
    " \"num_key_value_heads\": 32, \"pretraining_tp\": 1, \"rms_norm_eps\": 1e-05,"
    " \"rope_scaling\": null, \"tie_word_embeddings\": false, \"torch_dtype\": \"float16\","
    " \"transformers_version\": \"4.31.0.dev0\", \"use_cache\": true, \"vocab_size\": 32000}";

static const char *const mistral_7b_v01 =
    "{\"architectures\": [\"MistralForCausalLM\"], \"bos_token_id\": 1, \"eos_token_id\": 2,"
    " \"hidden_act\": \"silu\", \"hidden_size\": 4096, \"initializer_range\": 0.02,"
    " \"intermediate_size\": 14336, \"max_position_embeddings\": 32768,"
    " \"model_type\": \"mistral\", \"num_attention_heads\": 32, \"num_hidden_layers\": 32,"
    " \"num_key_value_heads\": 8, \"rms_norm_eps\": 1e-05, \"rope_theta\": 10000.0,"
    " \"sliding_window\": 4096, \"tie_word_embeddings\": false, \"torch_dtype\": \"bfloat16\","
    " \"transformers_version\": \"4.34.0.dev0\", \"use_cache\": true, \"vocab_size\": 32000}";

static const char *const gpt2_small =
    "{\"activation_function\": \"gelu_new\", \"architectures\": [\"GPT2LMHeadModel\"],"
    " \"attn_pdrop\": 0.1, \"bos_token_id\": 50256, \"embd_pdrop\": 0.1,"
    " \"eos_token_id\": 50256, \"initializer_range\": 0.02, \"layer_norm_epsilon\": 1e-05,"
    " \"model_type\": \"gpt2\", \"n_ctx\": 1024, \"n_embd\": 768, \"n_head\": 12,"
    " \"n_layer\": 12, \"n_positions\": 1024, \"resid_pdrop\": 0.1,"
    " \"summary_activation\": null, \"summary_first_dropout\": 0.1,"
    " \"summary_proj_to_labels\": true, \"summary_type\": \"cls_index\","
    " \"summary_use_proj\": true,"
    " \"task_specific_params\": {\"text-generation\": {\"do_sample\": true, \"max_length\": 50}},"
    " \"vocab_size\": 50257}";

/* ---- helpers ---- */

static json_t *parse(const char *text) {
    json_t *j = NULL;
    struct smelt_error err;
    TEST_OK(json_load_buffer(text, strlen(text), "test config", &j, &err), &err);
    return j;
}

static struct model_config load_ok(const char *text) {
    json_t *j = parse(text);
    struct model_config c;
    struct smelt_error err;
    TEST_OK(model_config_from_json(j, "cfg.json", &c, &err), &err);
    json_decref(j);
    return c;
}

/* text must be refused with code, the message naming where and containing want. */
static void expect_refused(const char *text, int code, const char *want) {
    json_t *j = parse(text);
    struct model_config c;
    struct smelt_error err;
    TEST_EXPECT_ERROR(model_config_from_json(j, "cfg.json", &c, &err), code, &err);
    cr_expect(strstr(err.message, "cfg.json") != NULL, "names the file: %s", err.message);
    cr_expect(strstr(err.message, want) != NULL, "mentions '%s': %s (config %s)", want,
              err.message, text);
    json_decref(j);
}

/* A small config of the given type with one extra "key": value fragment (or ""). */
static char *small(const char *type, const char *extra) {
    static char buf[1024];
    snprintf(buf, sizeof buf,
             "{\"model_type\": \"%s\", \"hidden_size\": 64, \"num_hidden_layers\": 2,"
             " \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
             " \"intermediate_size\": 128, \"vocab_size\": 100%s%s}",
             type, extra[0] ? ", " : "", extra);
    return buf;
}

/* Every field of a equals b's. */
static void expect_same_config(const struct model_config *a, const struct model_config *b) {
#define SAME(f) cr_expect(a->f == b->f, "field %s differs", #f)
    SAME(type); SAME(hidden_size); SAME(n_layers); SAME(n_heads); SAME(n_kv_heads);
    SAME(head_dim); SAME(intermediate_size); SAME(vocab_size); SAME(max_position_embeddings);
    SAME(max_seq_len); SAME(norm); SAME(mlp); SAME(positions); SAME(norm_eps); SAME(rope_theta);
    cr_expect(model_rope_scaling_equal(&a->rope_scaling, &b->rope_scaling), "field rope_scaling differs");
    SAME(qkv_bias); SAME(o_bias); SAME(mlp_bias); SAME(qk_norm); SAME(tie_word_embeddings);
    SAME(sliding_window); SAME(max_window_layers); SAME(torch_dtype); SAME(bos_token_id);
    SAME(pad_token_id); SAME(n_eos_token_ids);
    for (int i = 0; i < a->n_eos_token_ids; i++) SAME(eos_token_ids[i]);
#undef SAME
    cr_expect_str_eq(a->architecture, b->architecture);
    cr_expect_str_eq(a->hidden_act, b->hidden_act);
}

static void expect_roundtrip(const struct model_config *c) {
    struct smelt_error err;
    json_t *j = NULL;
    TEST_OK(model_config_to_json(c, &j, &err), &err);
    struct model_config back;
    TEST_OK(model_config_from_json(j, "written", &back, &err), &err);
    expect_same_config(c, &back);
    /* Written again, the JSON is identical. */
    json_t *j2 = NULL;
    TEST_OK(model_config_to_json(&back, &j2, &err), &err);
    cr_expect(json_equal(j, j2), "to_json is not stable");
    json_decref(j);
    json_decref(j2);
}

/* ---- the real configs ---- */

Test(model_config, qwen2_5_0_5b) {
    struct model_config c = load_ok(qwen25_05b);
    cr_expect_eq(c.type, MODEL_TYPE_QWEN2);
    cr_expect_str_eq(c.architecture, "Qwen2ForCausalLM");
    cr_expect_eq(c.hidden_size, 896);
    cr_expect_eq(c.n_layers, 24);
    cr_expect_eq(c.n_heads, 14);
    cr_expect_eq(c.n_kv_heads, 2);
    cr_expect_eq(c.head_dim, 64);
    cr_expect_eq(c.intermediate_size, 4864);
    cr_expect_eq(c.vocab_size, 151936);
    cr_expect_eq(c.max_position_embeddings, 32768);
    cr_expect_eq(c.max_seq_len, 32768, "use_sliding_window false: no cap");
    cr_expect_eq(c.sliding_window, 0);
    cr_expect_eq(c.max_window_layers, 24);
    cr_expect_eq(c.norm, MODEL_NORM_RMSNORM);
    cr_expect_eq(c.mlp, MODEL_MLP_SWIGLU);
    cr_expect_eq(c.positions, MODEL_POS_ROPE);
    cr_expect_eq(c.norm_eps, 1e-6);
    cr_expect_eq(c.rope_theta, 1e6);
    cr_expect(c.qkv_bias && !c.o_bias && !c.mlp_bias && !c.qk_norm);
    cr_expect(c.tie_word_embeddings);
    cr_expect_eq(c.torch_dtype, DTYPE_BF16);
    cr_expect_eq(c.bos_token_id, 151643);
    cr_expect_eq(c.n_eos_token_ids, 1);
    cr_expect_eq(c.eos_token_ids[0], 151643);
    cr_expect_eq(c.pad_token_id, -1);
    cr_expect_str_eq(c.hidden_act, "silu");
    expect_roundtrip(&c);
}

Test(model_config, qwen3_0_6b) {
    struct model_config c = load_ok(qwen3_06b);
    cr_expect_eq(c.type, MODEL_TYPE_QWEN3);
    cr_expect_eq(c.hidden_size, 1024);
    cr_expect_eq(c.head_dim, 128, "explicit head_dim, not hidden / heads = 64");
    cr_expect_eq(c.n_heads, 16);
    cr_expect_eq(c.n_kv_heads, 8);
    cr_expect_eq(c.n_layers, 28);
    cr_expect_eq(c.intermediate_size, 3072);
    cr_expect_eq(c.max_seq_len, 40960);
    cr_expect(c.qk_norm && !c.qkv_bias && !c.o_bias && !c.mlp_bias);
    cr_expect(c.tie_word_embeddings);
    cr_expect_eq(c.rope_theta, 1e6);
    cr_expect_eq(c.eos_token_ids[0], 151645);
    expect_roundtrip(&c);
}

Test(model_config, llama_3_2_1b) {
    char text[2048];
    snprintf(text, sizeof text, llama32_1b_fmt, llama3_rope);
    struct model_config c = load_ok(text);
    cr_expect_eq(c.rope_scaling.type, MODEL_ROPE_LLAMA3);
    cr_expect_eq(c.rope_scaling.factor, 32.0);
    cr_expect_eq(c.rope_scaling.low_freq_factor, 1.0);
    cr_expect_eq(c.rope_scaling.high_freq_factor, 4.0);
    cr_expect_eq(c.rope_scaling.original_max_position_embeddings, 8192);
    expect_roundtrip(&c);
    /* The same model without its rope scaling parses as unscaled. */
    snprintf(text, sizeof text, llama32_1b_fmt, "null");
    c = load_ok(text);
    cr_expect_eq(c.rope_scaling.type, MODEL_ROPE_DEFAULT);
    cr_expect_eq(c.type, MODEL_TYPE_LLAMA);
    cr_expect_eq(c.hidden_size, 2048);
    cr_expect_eq(c.head_dim, 64);
    cr_expect_eq(c.n_kv_heads, 8);
    cr_expect_eq(c.n_layers, 16);
    cr_expect_eq(c.vocab_size, 128256);
    cr_expect_eq(c.norm_eps, 1e-5);
    cr_expect_eq(c.rope_theta, 500000.0);
    cr_expect(c.tie_word_embeddings);
    cr_expect(!c.qkv_bias && !c.o_bias && !c.mlp_bias && !c.qk_norm);
    cr_expect_eq(c.n_eos_token_ids, 3);
    cr_expect_eq(c.eos_token_ids[2], 128009);
    snprintf(text, sizeof text, llama32_1b_fmt, "{\"rope_type\": \"default\"}");
    load_ok(text);
    expect_roundtrip(&c);
}

Test(model_config, llama_2_7b) {
    struct model_config c = load_ok(llama2_7b);
    cr_expect_eq(c.n_kv_heads, 32);
    cr_expect_eq(c.head_dim, 128);
    cr_expect_eq(c.max_seq_len, 4096);
    cr_expect_eq(c.rope_theta, 10000.0, "LlamaConfig default");
    cr_expect(!c.tie_word_embeddings);
    cr_expect_eq(c.torch_dtype, DTYPE_F16);
    cr_expect_eq(c.bos_token_id, 1);
    expect_roundtrip(&c);
}

Test(model_config, mistral_7b_v0_1) {
    struct model_config c = load_ok(mistral_7b_v01);
    cr_expect_eq(c.type, MODEL_TYPE_MISTRAL);
    cr_expect_eq(c.n_kv_heads, 8);
    cr_expect_eq(c.head_dim, 128);
    cr_expect_eq(c.intermediate_size, 14336);
    cr_expect_eq(c.max_position_embeddings, 32768);
    cr_expect_eq(c.sliding_window, 4096);
    cr_expect_eq(c.max_seq_len, 4096, "capped at the sliding window");
    cr_expect(!c.qkv_bias && !c.o_bias && !c.mlp_bias);
    expect_roundtrip(&c);
    /* Mistral v0.2 disables the window. */
    struct model_config v2 = load_ok(small("mistral", "\"sliding_window\": null, "
                                                      "\"max_position_embeddings\": 32768"));
    cr_expect_eq(v2.sliding_window, 0);
    cr_expect_eq(v2.max_seq_len, 32768);
    expect_roundtrip(&v2);
}

Test(model_config, gpt2) {
    struct model_config c = load_ok(gpt2_small);
    cr_expect_eq(c.type, MODEL_TYPE_GPT2);
    cr_expect_str_eq(c.architecture, "GPT2LMHeadModel");
    cr_expect_eq(c.hidden_size, 768);
    cr_expect_eq(c.n_layers, 12);
    cr_expect_eq(c.n_heads, 12);
    cr_expect_eq(c.n_kv_heads, 12);
    cr_expect_eq(c.head_dim, 64);
    cr_expect_eq(c.intermediate_size, 3072, "n_inner absent: 4 * n_embd");
    cr_expect_eq(c.vocab_size, 50257);
    cr_expect_eq(c.max_position_embeddings, 1024);
    cr_expect_eq(c.max_seq_len, 1024);
    cr_expect_eq(c.norm, MODEL_NORM_LAYERNORM);
    cr_expect_eq(c.mlp, MODEL_MLP_GELU);
    cr_expect_eq(c.positions, MODEL_POS_LEARNED);
    cr_expect_eq(c.norm_eps, 1e-5);
    cr_expect_eq(c.rope_theta, 0.0);
    cr_expect(c.qkv_bias && c.o_bias && c.mlp_bias && !c.qk_norm);
    cr_expect(c.tie_word_embeddings, "GPT2Config inherits tie_word_embeddings=True");
    cr_expect_eq(c.torch_dtype, DTYPE_F32, "no torch_dtype: float32");
    cr_expect_str_eq(c.hidden_act, "gelu_new");
    expect_roundtrip(&c);

    struct smelt_error err;
    json_t *j = NULL;
    TEST_OK(model_config_to_json(&c, &j, &err), &err);
    cr_expect_eq(json_integer_value(json_object_get(j, "n_embd")), 768);
    cr_expect_null(json_object_get(j, "hidden_size"), "GPT-2 uses its own field names");
    cr_expect_str_eq(json_string_value(json_object_get(j, "activation_function")), "gelu_new");
    json_decref(j);
}

/* ---- defaults of each transformers config class ---- */

Test(model_config, class_defaults) {
    struct model_config c = load_ok("{\"model_type\": \"llama\"}");
    cr_expect_eq(c.hidden_size, 4096);
    cr_expect_eq(c.n_layers, 32);
    cr_expect_eq(c.n_kv_heads, 32, "llama: num_key_value_heads defaults to the heads");
    cr_expect_eq(c.head_dim, 128);
    cr_expect_eq(c.intermediate_size, 11008);
    cr_expect_eq(c.vocab_size, 32000);
    cr_expect_eq(c.max_position_embeddings, 2048);
    cr_expect_eq(c.norm_eps, 1e-6);
    cr_expect_eq(c.rope_theta, 10000.0);
    cr_expect(!c.tie_word_embeddings);
    cr_expect_str_eq(c.architecture, "LlamaForCausalLM");

    c = load_ok("{\"model_type\": \"mistral\"}");
    cr_expect_eq(c.n_kv_heads, 8);
    cr_expect_eq(c.intermediate_size, 14336);
    cr_expect_eq(c.max_position_embeddings, 131072);
    cr_expect_eq(c.sliding_window, 4096, "MistralConfig: sliding_window=4096");
    cr_expect_eq(c.max_seq_len, 4096);

    c = load_ok("{\"model_type\": \"qwen2\"}");
    cr_expect_eq(c.n_kv_heads, 32);
    cr_expect_eq(c.vocab_size, 151936);
    cr_expect_eq(c.max_position_embeddings, 32768);
    cr_expect_eq(c.max_window_layers, 28);
    cr_expect_eq(c.sliding_window, 0);

    c = load_ok("{\"model_type\": \"qwen3\", \"hidden_size\": 64, \"num_attention_heads\": 4,"
                " \"num_key_value_heads\": 2}");
    cr_expect_eq(c.head_dim, 128, "Qwen3Config: head_dim=128 whatever hidden / heads is");
    /* The default of 32 kv heads cannot serve 4 query heads. */
    expect_refused("{\"model_type\": \"qwen3\", \"num_attention_heads\": 4}", SMELT_EINVAL,
                   "num_key_value_heads 32");

    c = load_ok("{\"model_type\": \"qwen3\", \"head_dim\": null, \"hidden_size\": 64,"
                " \"num_attention_heads\": 4, \"num_key_value_heads\": null}");
    cr_expect_eq(c.head_dim, 16, "explicit null: hidden / heads");
    cr_expect_eq(c.n_kv_heads, 4, "explicit null: the head count");

    c = load_ok("{\"model_type\": \"gpt2\"}");
    cr_expect_eq(c.hidden_size, 768);
    cr_expect_eq(c.intermediate_size, 3072);
    cr_expect_eq(c.vocab_size, 50257);
    cr_expect(c.tie_word_embeddings);

    c = load_ok("{\"model_type\": \"gpt2\", \"hidden_size\": 128, \"num_attention_heads\": 4,"
                " \"n_inner\": null, \"activation_function\": \"gelu_pytorch_tanh\"}");
    cr_expect_eq(c.hidden_size, 128, "GPT2Config maps hidden_size to n_embd");
    cr_expect_eq(c.head_dim, 32);
    cr_expect_eq(c.intermediate_size, 512);

    /* transformers 5 writes dtype and rope_parameters. */
    c = load_ok(small("qwen2", "\"dtype\": \"float16\", \"rope_parameters\": "
                               "{\"rope_type\": \"default\", \"rope_theta\": 5e5}"));
    cr_expect_eq(c.torch_dtype, DTYPE_F16);
    cr_expect_eq(c.rope_theta, 5e5);

    c = load_ok(small("llama", "\"attention_bias\": true, \"mlp_bias\": false, "
                               "\"hidden_act\": \"swish\""));
    cr_expect(c.qkv_bias && c.o_bias && !c.mlp_bias);
    expect_roundtrip(&c);
    c = load_ok(small("qwen3", "\"attention_bias\": true"));
    cr_expect(c.qkv_bias && c.o_bias && !c.mlp_bias);
    expect_roundtrip(&c);
    c = load_ok(small("qwen2", "\"head_dim\": 32"));
    cr_expect_eq(c.head_dim, 32);
    expect_roundtrip(&c);
}

Test(model_config, qwen_sliding_window) {
    /* Enabled and some layer slides: the served length is capped at the window. */
    struct model_config c = load_ok(small("qwen2", "\"use_sliding_window\": true, "
                                          "\"sliding_window\": 1024, \"max_window_layers\": 1"));
    cr_expect_eq(c.sliding_window, 1024);
    cr_expect_eq(c.max_seq_len, 1024);
    expect_roundtrip(&c);
    /* Enabled but no layer at or above max_window_layers: nothing slides. */
    c = load_ok(small("qwen3", "\"use_sliding_window\": true, \"sliding_window\": 1024, "
                               "\"max_window_layers\": 2"));
    cr_expect_eq(c.sliding_window, 0);
    cr_expect_eq(c.max_seq_len, 32768);
    /* layer_types decides when present. */
    c = load_ok(small("qwen2", "\"use_sliding_window\": true, \"sliding_window\": 512, "
                               "\"max_window_layers\": 0, "
                               "\"layer_types\": [\"full_attention\", \"full_attention\"]"));
    cr_expect_eq(c.max_seq_len, 32768);
    c = load_ok(small("qwen2", "\"use_sliding_window\": true, \"sliding_window\": 512, "
                               "\"layer_types\": [\"full_attention\", \"sliding_attention\"]"));
    cr_expect_eq(c.max_seq_len, 512);
    /* A window longer than the context changes nothing. */
    c = load_ok(small("mistral", "\"sliding_window\": 100000, \"max_position_embeddings\": 4096"));
    cr_expect_eq(c.max_seq_len, 4096);
    expect_roundtrip(&c);
}

/* ---- refusals ---- */

Test(model_config, refusals) {
    expect_refused("{\"hidden_size\": 64}", SMELT_EINVAL, "model_type");
    expect_refused("{\"model_type\": \"mixtral\"}", SMELT_EUNSUPPORTED, "mixtral");
    expect_refused("{\"model_type\": \"gemma\"}", SMELT_EUNSUPPORTED, "gemma");
    expect_refused("{\"model_type\": 3}", SMELT_EINVAL, "model_type");
    static const char *const scalings[] = {"dynamic", "longrope", "ntk"};
    char extra[256];
    for (size_t i = 0; i < sizeof scalings / sizeof *scalings; i++) {
        snprintf(extra, sizeof extra, "\"rope_scaling\": {\"type\": \"%s\", \"factor\": 2.0}",
                 scalings[i]);
        expect_refused(small("llama", extra), SMELT_EUNSUPPORTED, scalings[i]);
        snprintf(extra, sizeof extra, "\"rope_scaling\": {\"rope_type\": \"%s\", \"factor\": 4}",
                 scalings[i]);
        expect_refused(small("qwen2", extra), SMELT_EUNSUPPORTED, "rope_scaling.rope_type");
    }
    expect_refused(small("qwen3", "\"rope_parameters\": {\"rope_type\": \"dynamic\", \"factor\": 4}"),
                   SMELT_EUNSUPPORTED, "rope_parameters.rope_type 'dynamic'");
    expect_refused(small("llama", "\"rope_scaling\": {\"factor\": 2.0}"), SMELT_EINVAL,
                   "rope_scaling");
    expect_refused(small("llama", "\"rope_scaling\": \"linear\""), SMELT_EINVAL, "rope_scaling");
    expect_refused(small("llama", "\"partial_rotary_factor\": 0.5"), SMELT_EUNSUPPORTED,
                   "partial_rotary_factor");
    cr_expect(load_ok(small("llama", "\"mlp_bias\": true")).mlp_bias, "gate/up/down biases are built");
    cr_expect(!load_ok(small("llama", "\"mlp_bias\": false")).mlp_bias);
    expect_refused(small("llama", "\"rope_theta\": 0"), SMELT_EINVAL, "rope_theta");
    expect_refused(small("llama", "\"hidden_act\": \"gelu\""), SMELT_EUNSUPPORTED, "hidden_act 'gelu'");
    expect_refused(small("qwen2", "\"hidden_act\": \"relu\""), SMELT_EUNSUPPORTED, "relu");
    expect_refused("{\"model_type\": \"gpt2\", \"activation_function\": \"relu\"}",
                   SMELT_EUNSUPPORTED, "activation_function 'relu'");
    expect_refused("{\"model_type\": \"gpt2\", \"scale_attn_by_inverse_layer_idx\": true}",
                   SMELT_EUNSUPPORTED, "scale_attn_by_inverse_layer_idx");
    expect_refused("{\"model_type\": \"gpt2\", \"add_cross_attention\": true}",
                   SMELT_EUNSUPPORTED, "add_cross_attention");
    expect_refused("{\"model_type\": \"gpt2\", \"scale_attn_weights\": false}",
                   SMELT_EUNSUPPORTED, "scale_attn_weights");
    expect_refused("{\"model_type\": \"gpt2\", \"n_embd\": 100, \"n_head\": 12}", SMELT_EINVAL,
                   "n_head");
    expect_refused(small("llama", "\"quantization_config\": {\"quant_method\": \"awq\"}"),
                   SMELT_EUNSUPPORTED, "quantization_config");
    expect_refused(small("qwen2", "\"torch_dtype\": \"float64\""), SMELT_EUNSUPPORTED, "float64");
    expect_refused(small("qwen2", "\"layer_types\": [\"full_attention\"]"), SMELT_EINVAL,
                   "layer_types");
    expect_refused(small("qwen2", "\"layer_types\": [\"full_attention\", \"chunked_attention\"]"),
                   SMELT_EUNSUPPORTED, "chunked_attention");
    expect_refused(small("llama", "\"eos_token_id\": [1, 2, 3, 4, 5, 6, 7, 8, 9]"), SMELT_EINVAL,
                   "eos_token_id");
    expect_refused(small("llama", "\"eos_token_id\": [1, \"x\"]"), SMELT_EINVAL, "eos_token_id");
    expect_refused(small("llama", "\"architectures\": \"LlamaForCausalLM\""), SMELT_EINVAL,
                   "architectures");
}

Test(model_config, inconsistent_dimensions) {
    /* hidden not divisible by heads without head_dim; fine with it */
    expect_refused("{\"model_type\": \"llama\", \"hidden_size\": 100, \"num_attention_heads\": 3,"
                   " \"num_key_value_heads\": 3}",
                   SMELT_EINVAL, "not divisible");
    struct model_config c = load_ok("{\"model_type\": \"llama\", \"hidden_size\": 100, "
                                    "\"num_attention_heads\": 3, \"num_key_value_heads\": 3, "
                                    "\"head_dim\": 32}");
    cr_expect_eq(c.head_dim, 32);
    expect_roundtrip(&c);
    expect_refused("{\"model_type\": \"llama\", \"hidden_size\": 64, \"num_attention_heads\": 4,"
                   " \"num_key_value_heads\": 3}",
                   SMELT_EINVAL, "num_key_value_heads 3");
    expect_refused("{\"model_type\": \"llama\", \"num_attention_heads\": 4, "
                   "\"num_key_value_heads\": 8, \"hidden_size\": 64}",
                   SMELT_EINVAL, "num_key_value_heads 8");
    expect_refused(small("llama", "\"head_dim\": 15"), SMELT_EINVAL, "head_dim 15");
    static const char *const zeros[] = {"hidden_size",       "num_hidden_layers",
                                        "num_attention_heads", "intermediate_size",
                                        "vocab_size",        "max_position_embeddings",
                                        "head_dim"};
    char text[512];
    for (size_t i = 0; i < sizeof zeros / sizeof *zeros; i++) {
        snprintf(text, sizeof text, "{\"model_type\": \"qwen2\", \"%s\": 0}", zeros[i]);
        expect_refused(text, SMELT_EINVAL, zeros[i]);
        snprintf(text, sizeof text, "{\"model_type\": \"qwen2\", \"%s\": -8}", zeros[i]);
        expect_refused(text, SMELT_EINVAL, zeros[i]);
    }
    expect_refused("{\"model_type\": \"qwen2\", \"hidden_size\": \"896\"}", SMELT_EINVAL,
                   "hidden_size");
    expect_refused("{\"model_type\": \"qwen2\", \"vocab_size\": 1e12}", SMELT_EINVAL,
                   "vocab_size");
    expect_refused("{\"model_type\": \"qwen2\", \"rms_norm_eps\": -1}", SMELT_EINVAL,
                   "rms_norm_eps");
    expect_refused("{\"model_type\": \"qwen2\", \"tie_word_embeddings\": 1}", SMELT_EINVAL,
                   "tie_word_embeddings");
    expect_refused("[]", SMELT_EINVAL, "object");
}

/* ---- writing ---- */

Test(model_config, to_json_fields) {
    struct model_config c = load_ok(qwen25_05b);
    struct smelt_error err;
    json_t *j = NULL;
    TEST_OK(model_config_to_json(&c, &j, &err), &err);
    cr_expect_str_eq(json_string_value(json_array_get(json_object_get(j, "architectures"), 0)),
                     "Qwen2ForCausalLM");
    cr_expect_str_eq(json_string_value(json_object_get(j, "model_type")), "qwen2");
    cr_expect_eq(json_integer_value(json_object_get(j, "num_key_value_heads")), 2);
    cr_expect_null(json_object_get(j, "head_dim"), "Qwen2Config has no head_dim");
    cr_expect(json_is_null(json_object_get(j, "rope_scaling")));
    cr_expect(json_is_false(json_object_get(j, "use_sliding_window")));
    cr_expect_str_eq(json_string_value(json_object_get(j, "torch_dtype")), "bfloat16");
    cr_expect(json_is_true(json_object_get(j, "tie_word_embeddings")));
    json_decref(j);
}

Test(model_config, to_json_refuses_what_config_json_cannot_say) {
    struct smelt_error err;
    json_t *j = (json_t *)0x1;
    struct model_config c = load_ok(llama2_7b);
    c.o_bias = true; /* llama's attention_bias covers q, k, v and o together */
    TEST_EXPECT_ERROR(model_config_to_json(&c, &j, &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, "qkv_bias") || strstr(err.message, "o_bias"), "%s", err.message);
    cr_expect_null(j);
    c = load_ok(gpt2_small);
    c.n_kv_heads = 4;
    TEST_EXPECT_ERROR(model_config_to_json(&c, &j, &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, "n_kv_heads"), "%s", err.message);
    c = load_ok(qwen3_06b);
    c.max_seq_len = 7;
    TEST_EXPECT_ERROR(model_config_to_json(&c, &j, &err), SMELT_EINVAL, &err);
    c = load_ok(qwen3_06b);
    c.head_dim = 7;
    TEST_EXPECT_ERROR(model_config_to_json(&c, &j, &err), SMELT_EINVAL, &err);
    c.type = MODEL_TYPE_COUNT;
    TEST_EXPECT_ERROR(model_config_to_json(&c, &j, &err), SMELT_EINVAL, &err);
    TEST_EXPECT_ERROR(model_config_to_json(NULL, &j, &err), SMELT_EINVAL, &err);
}

/* ---- files ---- */


Test(model_config, save_and_load_files, .init = test_tmp_setup, .fini = test_tmp_teardown) {
    struct smelt_error err;
    struct model_config c = load_ok(mistral_7b_v01), back;
    char dir[128], path[160];
    snprintf(dir, sizeof dir, "%s/out/model", test_tmp_dir);
    TEST_OK(model_config_save(&c, dir, &err), &err);
    TEST_OK(model_config_load(dir, &back, &err), &err);
    expect_same_config(&c, &back);
    snprintf(path, sizeof path, "%s/config.json", dir);
    TEST_OK(model_config_load(path, &back, &err), &err);
    char *text = NULL;
    size_t len = 0;
    TEST_OK(file_read_all(path, &text, &len, &err), &err);
    cr_expect(len > 0 && text[len - 1] == '\n', "ends with a newline");
    cr_expect(strstr(text, "\"architectures\"") < strstr(text, "\"vocab_size\""), "sorted keys");
    cr_expect(strstr(text, "\"rms_norm_eps\": 1e-5,"), "short reals: %s", text);
    free(text);

    /* A real that 15 digits cannot hold is written with all 17. */
    c.rope_theta = 1.0 / 3.0;
    TEST_OK(model_config_save(&c, dir, &err), &err);
    TEST_OK(model_config_load(dir, &back, &err), &err);
    cr_expect_eq(back.rope_theta, 1.0 / 3.0);

    snprintf(path, sizeof path, "%s/missing.json", test_tmp_dir);
    TEST_EXPECT_ERROR(model_config_load(path, &back, &err), SMELT_ENOTFOUND, &err);
    cr_expect(strstr(err.message, path), "%s", err.message);
    TEST_EXPECT_ERROR(model_config_load(test_tmp_dir, &back, &err), SMELT_ENOTFOUND, &err);
    snprintf(path, sizeof path, "%s/bad.json", test_tmp_dir);
    FILE *f = fopen(path, "w");
    cr_assert(f);
    fputs("{\"model_type\": \"llama\",", f);
    fclose(f);
    TEST_EXPECT_ERROR(model_config_load(path, &back, &err), SMELT_EFORMAT, &err);
    cr_expect(strstr(err.message, path), "%s", err.message);
    f = fopen(path, "w");
    cr_assert(f);
    fputs("{\"model_type\": \"llama\", \"num_key_value_heads\": 5}", f);
    fclose(f);
    TEST_EXPECT_ERROR(model_config_load(path, &back, &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, path) && strstr(err.message, "num_key_value_heads"), "%s",
              err.message);
}
