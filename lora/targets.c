/* Which linears an adapter wraps: the module kinds of each architecture in PEFT's
 * names, and target names resolved against them the way PEFT matches module names. */
#include "lora/lora_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct lora_kind llama_kinds[] = {
    {"q_proj", "self_attn.q_proj", LORA_DIM_C, LORA_DIM_QD, {MODEL_LINEAR_Q}, 1},
    {"k_proj", "self_attn.k_proj", LORA_DIM_C, LORA_DIM_KD, {MODEL_LINEAR_K}, 1},
    {"v_proj", "self_attn.v_proj", LORA_DIM_C, LORA_DIM_KD, {MODEL_LINEAR_V}, 1},
    {"o_proj", "self_attn.o_proj", LORA_DIM_QD, LORA_DIM_C, {MODEL_LINEAR_O}, 1},
    {"gate_proj", "mlp.gate_proj", LORA_DIM_C, LORA_DIM_F, {MODEL_LINEAR_GATE}, 1},
    {"up_proj", "mlp.up_proj", LORA_DIM_C, LORA_DIM_F, {MODEL_LINEAR_UP}, 1},
    {"down_proj", "mlp.down_proj", LORA_DIM_F, LORA_DIM_C, {MODEL_LINEAR_DOWN}, 1},
};

static const struct lora_kind gpt2_kinds[] = {
    {"c_attn", "attn.c_attn", LORA_DIM_C, LORA_DIM_3C,
     {MODEL_LINEAR_Q, MODEL_LINEAR_K, MODEL_LINEAR_V}, 3},
    {"c_proj", "attn.c_proj", LORA_DIM_C, LORA_DIM_C, {MODEL_LINEAR_O}, 1},
    {"c_fc", "mlp.c_fc", LORA_DIM_C, LORA_DIM_F, {MODEL_LINEAR_FC}, 1},
    {"c_proj", "mlp.c_proj", LORA_DIM_F, LORA_DIM_C, {MODEL_LINEAR_PROJ}, 1},
};

#define COUNT(a) ((int)(sizeof(a) / sizeof *(a)))

static bool is_gpt2(const struct model *model) { return model->config.type == MODEL_TYPE_GPT2; }

const struct lora_kind *lora_kinds(const struct model *model, int *n_kinds) {
    *n_kinds = is_gpt2(model) ? COUNT(gpt2_kinds) : COUNT(llama_kinds);
    return is_gpt2(model) ? gpt2_kinds : llama_kinds;
}

const char *lora_block_prefix(const struct model *model) {
    return is_gpt2(model) ? "transformer.h.%lld." : "model.layers.%lld.";
}

int64_t lora_dim(const struct model *model, enum lora_dim dim) {
    const struct model_config *c = &model->config;
    switch (dim) {
    case LORA_DIM_C: return c->hidden_size;
    case LORA_DIM_QD: return c->n_heads * c->head_dim;
    case LORA_DIM_KD: return c->n_kv_heads * c->head_dim;
    case LORA_DIM_F: return c->intermediate_size;
    case LORA_DIM_3C: return 3 * c->hidden_size;
    }
    SMELT_ASSERT(!"unknown lora_dim");
    return 0;
}

/* The short forms smelt accepts for PEFT's Llama-family names. */
static const char *expand_short(const char *name) {
    static const char *const pairs[][2] = {{"q", "q_proj"}, {"k", "k_proj"}, {"v", "v_proj"},
                                           {"o", "o_proj"}, {"gate", "gate_proj"},
                                           {"up", "up_proj"}, {"down", "down_proj"}};
    for (int i = 0; i < COUNT(pairs); i++)
        if (strcmp(name, pairs[i][0]) == 0) return pairs[i][1];
    return name;
}

/* PEFT's rule: the full module name equals the target or ends with "." + target. */
static bool suffix_match(const char *full, const char *target) {
    size_t n = strlen(full), k = strlen(target);
    if (k == 0 || k > n) return false;
    if (strcmp(full + n - k, target) != 0) return false;
    return k == n || full[n - k - 1] == '.';
}

static void module_path(const char *prefix, int64_t layer, const struct lora_kind *kind,
                        char *buf, size_t bytes) {
    char block[64];
    snprintf(block, sizeof block, prefix, (long long)layer);
    snprintf(buf, bytes, "%s%s", block, kind->path);
}

/* Marks what name matches in sel; returns how many modules it matched. lm_head is
 * matched by name only ("all-linear" leaves it out, as PEFT does the output layer),
 * and only where the model has one (has_head). */
static int64_t select_name(const char *prefix, const struct lora_kind *kinds, int n_kinds, bool has_head,
                           const char *name, struct lora_selection *sel) {
    bool all = strcmp(name, "all-linear") == 0;
    name = expand_short(name);
    int64_t matched = 0;
    if (!all && has_head && suffix_match(LORA_HEAD_PATH, name)) {
        sel->lm_head = true;
        matched++;
    }
    char path[256];
    for (int64_t l = 0; l < sel->n_layers; l++)
        for (int k = 0; k < n_kinds; k++) {
            module_path(prefix, l, &kinds[k], path, sizeof path);
            if (all || suffix_match(path, name)) {
                sel->wrapped[l * n_kinds + k] = true;
                matched++;
            }
        }
    return matched;
}

void lora_selection_free(struct lora_selection *sel) {
    free(sel->wrapped);
    sel->wrapped = NULL;
}

int lora_select(const struct model *model, const char *const *names, int n_names,
                const char *where, struct lora_selection *out, struct smelt_error *err) {
    int n_kinds;
    const struct lora_kind *kinds = lora_kinds(model, &n_kinds);
    const char *prefix = lora_block_prefix(model);
    struct lora_selection sel = {.n_layers = model->config.n_layers, .n_kinds = n_kinds};
    sel.wrapped = calloc((size_t)(sel.n_layers * n_kinds), sizeof *sel.wrapped);
    if (!sel.wrapped) return error_set(err, SMELT_ENOMEM, "%s: out of memory", where);
    static const char *const llama_default[] = {"q_proj", "v_proj"}, *const gpt2_default[] = {"c_attn"};
    if (n_names == 0) {
        names = is_gpt2(model) ? gpt2_default : llama_default;
        n_names = is_gpt2(model) ? COUNT(gpt2_default) : COUNT(llama_default);
    }
    bool classifier = model->config.score_head;
    for (int i = 0; i < n_names; i++) {
        if (select_name(prefix, kinds, n_kinds, !classifier, names[i], &sel) > 0) continue;
        lora_selection_free(&sel);
        if (classifier && suffix_match(LORA_HEAD_PATH, names[i]))
            return error_set(err, SMELT_EINVAL,
                             "%s: target_modules: '%s': this model is a sequence classifier: it has no lm_head "
                             "(its head, score, trains in full beside the adapter, PEFT's modules_to_save)",
                             where, names[i]);
        return error_set(err, SMELT_EINVAL,
                         "%s: target_modules: '%s' names no linear layer of this %s model",
                         where, names[i], model_type_name(model->config.type));
    }
    *out = sel;
    return SMELT_OK;
}

bool lora_target_known(const char *name) {
    if (strcmp(name, "all-linear") == 0 || strcmp(name, LORA_HEAD_PATH) == 0) return true;
    name = expand_short(name);
    /* Any block: try a layer number as written in name when it holds one. */
    struct {
        const char *prefix;
        const struct lora_kind *kinds;
        int n;
    } archs[] = {{"model.layers.%lld.", llama_kinds, COUNT(llama_kinds)},
                 {"transformer.h.%lld.", gpt2_kinds, COUNT(gpt2_kinds)}};
    long long layer = 0;
    const char *digits = strpbrk(name, "0123456789");
    if (digits) layer = strtoll(digits, NULL, 10);
    char path[256];
    for (int a = 0; a < COUNT(archs); a++)
        for (int k = 0; k < archs[a].n; k++) {
            module_path(archs[a].prefix, layer, &archs[a].kinds[k], path, sizeof path);
            if (suffix_match(path, name)) return true;
        }
    return false;
}

/* Whether every kind with this leaf is in the set. */
static bool leaf_complete(const struct lora_kind *kinds, int n_kinds, const bool *set, int k) {
    for (int j = 0; j < n_kinds; j++)
        if (strcmp(kinds[j].leaf, kinds[k].leaf) == 0 && !set[j]) return false;
    return true;
}

void lora_selection_names(const struct model *model, const struct lora_selection *sel,
                          char names[][32], int max_names, int *n_names, bool *uniform) {
    int n_kinds;
    const struct lora_kind *kinds = lora_kinds(model, &n_kinds);
    SMELT_ASSERT(n_kinds <= LORA_MAX_KINDS && n_kinds == sel->n_kinds);
    bool any[LORA_MAX_KINDS] = {false};
    *uniform = true;
    for (int64_t l = 0; l < sel->n_layers; l++)
        for (int k = 0; k < n_kinds; k++) {
            bool w = sel->wrapped[l * n_kinds + k];
            any[k] |= w;
            if (w != sel->wrapped[k]) *uniform = false;
        }
    int n = 0;
    for (int k = 0; k < n_kinds; k++) {
        if (!any[k]) continue;
        bool by_leaf = leaf_complete(kinds, n_kinds, any, k);
        const char *name = by_leaf ? kinds[k].leaf : kinds[k].path;
        bool dup = false;
        for (int i = 0; i < n; i++) dup |= strcmp(names[i], name) == 0;
        if (dup) continue;
        SMELT_ASSERT(n < max_names);
        snprintf(names[n++], 32, "%s", name);
    }
    if (sel->lm_head) {
        SMELT_ASSERT(n < max_names);
        snprintf(names[n++], 32, "%s", LORA_HEAD_PATH);
    }
    *n_names = n;
}
