/* smelt-generate: text (or token ids) in, a continuation out, through the plain
 * recompute reference generator. The oracle the rollout engine is checked against.
 *
 *   smelt-generate --model DIR --prompt "Once upon" [--max-new-tokens 64]
 *                  [--temperature 0] [--top-k 0] [--top-p 1] [--min-p 0] [--seed 0]
 *                  [--prompt-ids 1,2,3] [--json] [--backend cpu|cuda|auto] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

static void usage(FILE *f) {
    fprintf(f, "usage: smelt-generate --model DIR (--prompt TEXT | --prompt-ids 1,2,3)\n"
               "         [--max-new-tokens N] [--temperature T] [--top-k K] [--top-p P] [--min-p P]\n"
               "         [--seed S] [--backend cpu|cuda|auto] [--json] [--bos]\n"
               "  --bos prepends the tokenizer's bos to --prompt (as raw-text SFT jobs train)\n");
}

struct options {
    const char *model_dir, *prompt, *prompt_ids, *backend;
    struct generate_params gen;
    bool json, bos;
};

static int parse(int argc, char **argv, struct options *o, struct smelt_error *err) {
    *o = (struct options){.backend = "auto",
                          .gen = {.max_new_tokens = 64, .temperature = 0, .top_p = 1}};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        int64_t n;
        double d;
        int rc = SMELT_OK;
        if (strcmp(a, "--json") == 0) {
            o->json = true;
            continue;
        }
        if (strcmp(a, "--bos") == 0) {
            o->bos = true;
            continue;
        }
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            exit(0);
        }
        rc = args_value(argc, argv, &i, &v, err);
        if (rc) return rc;
        if (strcmp(a, "--model") == 0) o->model_dir = v;
        else if (strcmp(a, "--prompt") == 0) o->prompt = v;
        else if (strcmp(a, "--prompt-ids") == 0) o->prompt_ids = v;
        else if (strcmp(a, "--backend") == 0) o->backend = v;
        else if (strcmp(a, "--max-new-tokens") == 0) {
            if (!(rc = args_int(a, v, 1, 1 << 20, &n, err))) o->gen.max_new_tokens = n;
        } else if (strcmp(a, "--top-k") == 0) {
            if (!(rc = args_int(a, v, 0, 1 << 30, &n, err))) o->gen.top_k = n;
        } else if (strcmp(a, "--seed") == 0) {
            if (!(rc = args_int(a, v, 0, INT64_MAX, &n, err))) o->gen.seed = (uint64_t)n;
        } else if (strcmp(a, "--temperature") == 0) {
            if (!(rc = args_double(a, v, 0, 100, &d, err))) o->gen.temperature = (float)d;
        } else if (strcmp(a, "--top-p") == 0) {
            if (!(rc = args_double(a, v, 1e-6, 1, &d, err))) o->gen.top_p = (float)d;
        } else if (strcmp(a, "--min-p") == 0) {
            if (!(rc = args_double(a, v, 0, 0.999999, &d, err))) o->gen.min_p = (float)d;
        } else
            return error_set(err, SMELT_EINVAL, "unknown option %s", a);
        if (rc) return rc;
    }
    if (!o->model_dir) return error_set(err, SMELT_EINVAL, "--model is required");
    if (!o->prompt == !o->prompt_ids) return error_set(err, SMELT_EINVAL, "give exactly one of --prompt and --prompt-ids");
    return SMELT_OK;
}

static void print_json(const int32_t *prompt, int64_t n_prompt, const struct generate_result *r,
                       const char *text) {
    json_t *o = json_object(), *pi = json_array(), *ids = json_array(), *lps = json_array();
    for (int64_t i = 0; i < n_prompt; i++) json_array_append_new(pi, json_integer(prompt[i]));
    for (int64_t i = 0; i < r->n; i++) {
        json_array_append_new(ids, json_integer(r->ids[i]));
        json_array_append_new(lps, json_real(r->logprobs[i]));
    }
    json_object_set_new(o, "prompt_ids", pi);
    json_object_set_new(o, "ids", ids);
    json_object_set_new(o, "logprobs", lps);
    json_object_set_new(o, "finish_reason", json_string(r->finish_reason));
    if (text) json_object_set_new(o, "text", json_string_lossy(text, strlen(text)));
    char *s = json_dumps(o, JSON_COMPACT);
    if (s) puts(s);
    free(s);
    json_decref(o);
}

static int run(const struct options *o, struct smelt_error *err) {
    enum backend be;
    int rc = backend_from_name(o->backend, &be, err);
    if (rc) return rc;
    struct model *m = NULL;
    struct tokenizer *tok = NULL;
    int32_t *prompt = NULL, stops[MODEL_CONFIG_MAX_EOS + 1];
    int64_t n_prompt = 0;
    size_t n_ids = 0;
    char *text = NULL;
    struct generate_result r = {0};
    rc = model_load(o->model_dir, be, &m, err);
    /* A tokenizer is needed for text in or out; model dirs without one take ids. */
    if (!rc) {
        int trc = tokenizer_load(o->model_dir, &tok, err);
        if (trc && o->prompt) rc = trc;
        if (trc) error_clear(err);
    }
    if (!rc && o->prompt) {
        rc = tokenizer_encode(tok, o->prompt, strlen(o->prompt), false, &prompt, &n_ids, err);
        n_prompt = (int64_t)n_ids;
        /* --bos: the prompt as a raw-text SFT job trained it ([bos] + text). */
        int32_t bos = tokenizer_special_ids(tok)->bos;
        if (!rc && o->bos && bos < 0) rc = error_set(err, SMELT_EINVAL, "--bos: the tokenizer has no bos token");
        if (!rc && o->bos) {
            int32_t *with = realloc(prompt, (size_t)(n_prompt + 1) * sizeof *with);
            if (!with) rc = error_set(err, SMELT_ENOMEM, "out of memory");
            else {
                prompt = with;
                memmove(prompt + 1, prompt, (size_t)n_prompt * sizeof *prompt);
                prompt[0] = bos;
                n_prompt++;
            }
        }
    } else if (!rc) {
        rc = args_int_list("--prompt-ids", o->prompt_ids, 0, INT32_MAX, &prompt, &n_prompt, err);
    }
    if (!rc) {
        struct generate_params gen = o->gen;
        int n_stop = 0;
        for (int i = 0; i < m->config.n_eos_token_ids; i++) stops[n_stop++] = (int32_t)m->config.eos_token_ids[i];
        if (tok && tokenizer_special_ids(tok)->eos >= 0) stops[n_stop++] = tokenizer_special_ids(tok)->eos;
        gen.stop_ids = stops;
        gen.n_stop_ids = n_stop;
        rc = model_generate_reference(m, prompt, n_prompt, &gen, &r, err);
    }
    if (!rc && tok) {
        size_t len;
        rc = tokenizer_decode(tok, r.ids, (size_t)r.n, true, &text, &len, err);
    }
    if (!rc) {
        if (o->json) {
            print_json(prompt, n_prompt, &r, text);
        } else if (text) {
            printf("%s\n", text);
        } else {
            for (int64_t i = 0; i < r.n; i++) printf(i ? ",%d" : "%d", r.ids[i]);
            printf("\n");
        }
    }
    free(text);
    free(prompt);
    generate_result_free(&r);
    tokenizer_free(tok);
    model_free(m);
    return rc;
}

int main(int argc, char **argv) {
    backend_cpu_select_kernels(argv);
    struct options o;
    struct smelt_error err = {0};
    int rc = parse(argc, argv, &o, &err);
    if (rc) {
        fprintf(stderr, "smelt-generate: %s\n", err.message);
        usage(stderr);
        return 2;
    }
    rc = run(&o, &err);
    if (rc) {
        fprintf(stderr, "smelt-generate: %s\n", err.message);
        return 1;
    }
    return 0;
}
