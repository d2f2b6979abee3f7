/* chat_template_build: each template family as C that cuts a conversation into pieces
 * (chat_template_internal.h). Every family mirrors its Hugging Face Jinja template
 * statement by statement for plain conversations; the comment above each builder names
 * the Jinja it follows, and docs/chat-templates.md has the rendered formats. */
#include "tokenizer/chat_template_internal.h"

#include <stdlib.h>
#include <string.h>

static int push(struct chat_pieces *p, const char *text, size_t len, enum chat_piece_kind kind,
                bool trained, struct smelt_error *err) {
    if (p->count == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 32;
        struct chat_piece *items = realloc(p->items, cap * sizeof *items);
        if (!items) return error_set(err, SMELT_ENOMEM, "chat template: out of memory for %zu pieces", cap);
        p->items = items;
        p->cap = cap;
    }
    p->items[p->count++] = (struct chat_piece){text, len, kind, trained};
    return SMELT_OK;
}

static int push_str(struct chat_pieces *p, const char *s, enum chat_piece_kind kind, bool trained,
                    struct smelt_error *err) {
    return push(p, s, strlen(s), kind, trained, err);
}

/* ---- Python's str.strip(), which Jinja's `| trim` and `.strip()` call ---- */

/* Bytes of the Python whitespace character (str.isspace) that starts s, or 0. Matched
 * on the UTF-8 bytes: U+0009-000D, U+001C-001F, U+0020, U+0085, U+00A0, U+1680,
 * U+2000-200A, U+2028, U+2029, U+202F, U+205F, U+3000. */
static size_t py_space_len(const unsigned char *s, size_t len) {
    if (len >= 1 && ((s[0] >= 0x09 && s[0] <= 0x0D) || (s[0] >= 0x1C && s[0] <= 0x20))) return 1;
    if (len >= 2 && s[0] == 0xC2 && (s[1] == 0x85 || s[1] == 0xA0)) return 2;
    if (len < 3) return 0;
    if (s[0] == 0xE1 && s[1] == 0x9A && s[2] == 0x80) return 3;
    if (s[0] == 0xE2 && s[1] == 0x80 &&
        ((s[2] >= 0x80 && s[2] <= 0x8A) || s[2] == 0xA8 || s[2] == 0xA9 || s[2] == 0xAF))
        return 3;
    if (s[0] == 0xE2 && s[1] == 0x81 && s[2] == 0x9F) return 3;
    if (s[0] == 0xE3 && s[1] == 0x80 && s[2] == 0x80) return 3;
    return 0;
}

/* Which characters a strip removes: Python whitespace (strip()) or '\n' (strip('\n')). */
enum strip_set { STRIP_SPACE, STRIP_NEWLINE };

static size_t strip_char_len(const char *s, size_t len, enum strip_set set) {
    if (set == STRIP_NEWLINE) return len && s[0] == '\n';
    return py_space_len((const unsigned char *)s, len);
}

static void strip_front(struct chat_piece *pc, enum strip_set set) {
    size_t k;
    while (pc->len && (k = strip_char_len(pc->text, pc->len, set)) > 0) {
        pc->text += k;
        pc->len -= k;
    }
}

/* Scans forward so multi-byte whitespace is found from its first byte. A byte that
 * starts no whitespace character counts as text, so bytes that are not UTF-8 stay. */
static void strip_back(struct chat_piece *pc, enum strip_set set) {
    size_t end = 0;
    for (size_t i = 0; i < pc->len;) {
        size_t k = strip_char_len(pc->text + i, pc->len - i, set);
        if (k) {
            i += k;
        } else {
            i++;
            end = i;
        }
    }
    pc->len = end;
}

/* Strips the concatenation of p->items[first..count) as one string: leading characters
 * from the front pieces, trailing ones from the back, pieces emptied on the way. */
static void strip_pieces(struct chat_pieces *p, size_t first, enum strip_set set, bool front, bool back) {
    for (size_t i = first; front && i < p->count; i++) {
        strip_front(&p->items[i], set);
        if (p->items[i].len) break;
    }
    for (size_t i = p->count; back && i > first; i--) {
        strip_back(&p->items[i - 1], set);
        if (p->items[i - 1].len) break;
    }
}

/* Pushes s as one piece of kind and then strips it. */
static int push_stripped(struct chat_pieces *p, const char *s, size_t len, enum chat_piece_kind kind,
                         bool trained, enum strip_set set, bool front, bool back,
                         struct smelt_error *err) {
    int rc = push(p, s, len, kind, trained, err);
    if (!rc) strip_pieces(p, p->count - 1, set, front, back);
    return rc;
}

/* ---- validation shared by every family ---- */

enum role { ROLE_SYSTEM, ROLE_USER, ROLE_ASSISTANT };

static int role_of(const struct chat_message *m, size_t i, enum role *out, struct smelt_error *err) {
    if (!m->role) return error_set(err, SMELT_EINVAL, "chat message %zu has no role", i);
    if (!m->content) return error_set(err, SMELT_EINVAL, "chat message %zu (%s) has no content", i, m->role);
    if (!strcmp(m->role, "system")) *out = ROLE_SYSTEM;
    else if (!strcmp(m->role, "user")) *out = ROLE_USER;
    else if (!strcmp(m->role, "assistant")) *out = ROLE_ASSISTANT;
    else
        return error_set(err, SMELT_EINVAL,
                         "chat message %zu: unknown role '%.64s' (expected system, user or assistant)", i,
                         m->role);
    return SMELT_OK;
}

/* Jinja's "roles must alternate" check (Llama 2, Mistral v0.1): after an optional leading
 * system message (allow_system), user at even positions, assistant at odd ones. */
static int check_alternation(const struct chat_template *t, const struct chat_message *m, size_t n,
                             bool allow_system, struct smelt_error *err) {
    const char *name = chat_template_name(t->kind);
    size_t start = 0;
    for (size_t i = 0; i < n; i++) {
        enum role r = !strcmp(m[i].role, "system") ? ROLE_SYSTEM
                      : !strcmp(m[i].role, "user") ? ROLE_USER : ROLE_ASSISTANT; /* validated */
        if (r == ROLE_SYSTEM && i == 0 && allow_system) {
            start = 1;
            continue;
        }
        if (r == ROLE_SYSTEM && !allow_system)
            return error_set(err, SMELT_EINVAL,
                             "chat message %zu: the %s template has no system role (its Jinja refuses it); "
                             "put the instructions in the first user message", i, name);
        if (r == ROLE_SYSTEM)
            return error_set(err, SMELT_EINVAL,
                             "chat message %zu: the %s template allows a system message only first", i, name);
        enum role want = (i - start) % 2 == 0 ? ROLE_USER : ROLE_ASSISTANT;
        if (r != want)
            return error_set(err, SMELT_EINVAL,
                             "chat message %zu: the %s template needs roles alternating user/assistant/user/..."
                             " after an optional system message; got %s where %s was expected", i, name,
                             m[i].role, want == ROLE_USER ? "user" : "assistant");
    }
    if (start == n)
        return error_set(err, SMELT_EINVAL, "chat messages: the %s template needs a user message after the "
                         "system message", name);
    return SMELT_OK;
}

static int need_token(const struct chat_template *t, const char *what, const char *value,
                      struct smelt_error *err) {
    if (value[0]) return SMELT_OK;
    return error_set(err, SMELT_EINVAL, "the %s template needs a %s token and this one has none "
                     "(set %s_token in tokenizer_config.json)", chat_template_name(t->kind), what, what);
}

/* ---- ChatML (Qwen2/Qwen2.5) and Qwen3 ---- */

/* Qwen3's ns.last_query_index: the last user message that is not a wrapped tool
 * response, else n - 1. */
static size_t qwen3_last_query(const struct chat_message *m, size_t n) {
    static const char open[] = "<tool_response>", close[] = "</tool_response>";
    for (size_t i = n; i-- > 0;) {
        if (strcmp(m[i].role, "user")) continue;
        size_t len = strlen(m[i].content);
        bool wrapped = len >= sizeof open - 1 && !memcmp(m[i].content, open, sizeof open - 1) &&
                       len >= sizeof close - 1 &&
                       !memcmp(m[i].content + len - (sizeof close - 1), close, sizeof close - 1);
        if (!wrapped) return i;
    }
    return n - 1;
}

static const char *find_last(const char *s, size_t len, const char *needle) {
    size_t k = strlen(needle);
    for (size_t i = len; i >= k; i--)
        if (!memcmp(s + i - k, needle, k)) return s + i - k;
    return NULL;
}

/* Qwen3's assistant turn. Content holding "</think>" is split into reasoning (after the
 * last <think> before the first </think>) and answer (after the last </think>). Turns
 * after the last user query that are the final message or have reasoning keep a
 * <think> block (empty when there is no reasoning); earlier turns lose their reasoning. */
static int qwen3_assistant(struct chat_pieces *p, const char *c, size_t i, size_t n, size_t last_query,
                           struct smelt_error *err) {
    const char *answer = c, *reason = "";
    size_t answer_len = strlen(c), reason_len = 0;
    const char *first_close = strstr(c, "</think>");
    if (first_close) {
        const char *last_close = find_last(c, answer_len, "</think>");
        answer = last_close + 8;
        answer_len = strlen(answer);
        const char *open = find_last(c, (size_t)(first_close - c), "<think>");
        reason = open ? open + 7 : c;
        reason_len = (size_t)(first_close - reason);
    }
    /* The split's rstrip('\n')/lstrip('\n') and the block's strip('\n') in one. */
    struct chat_piece rs = {reason, reason_len, CHAT_PIECE_CONTENT, true};
    strip_front(&rs, STRIP_NEWLINE);
    strip_back(&rs, STRIP_NEWLINE);
    bool think = i > last_query && (i == n - 1 || rs.len > 0);
    if (!think) {
        if (first_close) return push_stripped(p, answer, answer_len, CHAT_PIECE_CONTENT, true, STRIP_NEWLINE,
                                              true, false, err);
        return push(p, answer, answer_len, CHAT_PIECE_CONTENT, true, err);
    }
    int rc = push_str(p, "<think>", CHAT_PIECE_MARKER, true, err);
    if (!rc) rc = push_str(p, "\n", CHAT_PIECE_TEXT, true, err);
    if (!rc) rc = push(p, rs.text, rs.len, CHAT_PIECE_CONTENT, true, err);
    if (!rc) rc = push_str(p, "\n", CHAT_PIECE_TEXT, true, err);
    if (!rc) rc = push_str(p, "</think>", CHAT_PIECE_MARKER, true, err);
    if (!rc) rc = push_str(p, "\n\n", CHAT_PIECE_TEXT, true, err);
    if (!rc) rc = push_stripped(p, answer, answer_len, CHAT_PIECE_CONTENT, true, STRIP_NEWLINE, true, false, err);
    return rc;
}

/* Qwen2.5's Jinja without tools, minus its default system prompt; with qwen3, Qwen3's
 * Jinja without tools and with enable_thinking undefined. Every message renders as
 * '<|im_start|>' + role + '\n' + content + '<|im_end|>\n'. */
static int build_chatml(const struct chat_message *m, size_t n, bool gen, bool qwen3,
                        struct chat_pieces *p, struct smelt_error *err) {
    size_t last_query = qwen3 ? qwen3_last_query(m, n) : 0;
    int rc = SMELT_OK;
    for (size_t i = 0; !rc && i < n; i++) {
        bool asst = !strcmp(m[i].role, "assistant");
        rc = push_str(p, "<|im_start|>", CHAT_PIECE_TOKEN, false, err);
        if (!rc) rc = push_str(p, m[i].role, CHAT_PIECE_TEXT, false, err);
        if (!rc) rc = push_str(p, "\n", CHAT_PIECE_TEXT, false, err);
        if (!rc && asst && qwen3) rc = qwen3_assistant(p, m[i].content, i, n, last_query, err);
        else if (!rc) rc = push_str(p, m[i].content, CHAT_PIECE_CONTENT, asst, err);
        if (!rc) rc = push_str(p, "<|im_end|>", CHAT_PIECE_TOKEN, asst, err);
        if (!rc) rc = push_str(p, "\n", CHAT_PIECE_TEXT, false, err);
    }
    if (!rc && gen) rc = push_str(p, "<|im_start|>", CHAT_PIECE_TOKEN, false, err);
    if (!rc && gen) rc = push_str(p, "assistant\n", CHAT_PIECE_TEXT, false, err);
    return rc;
}

/* ---- Llama 3 ---- */

/* Meta-Llama-3-*-Instruct: bos_token + per message '<|start_header_id|>' + role +
 * '<|end_header_id|>\n\n' + content | trim + '<|eot_id|>'. */
static int build_llama3(const struct chat_template *t, const struct chat_message *m, size_t n, bool gen,
                        struct chat_pieces *p, struct smelt_error *err) {
    int rc = need_token(t, "bos", t->bos, err);
    if (!rc) rc = push_str(p, t->bos, CHAT_PIECE_TOKEN, false, err);
    for (size_t i = 0; !rc && i < n; i++) {
        const char *c = m[i].content;
        bool asst = !strcmp(m[i].role, "assistant");
        rc = push_str(p, "<|start_header_id|>", CHAT_PIECE_TOKEN, false, err);
        if (!rc) rc = push_str(p, m[i].role, CHAT_PIECE_TEXT, false, err);
        if (!rc) rc = push_str(p, "<|end_header_id|>", CHAT_PIECE_TOKEN, false, err);
        if (!rc) rc = push_str(p, "\n\n", CHAT_PIECE_TEXT, false, err);
        if (!rc) rc = push_stripped(p, c, strlen(c), CHAT_PIECE_CONTENT, asst, STRIP_SPACE, true, true, err);
        if (!rc) rc = push_str(p, "<|eot_id|>", CHAT_PIECE_TOKEN, asst, err);
    }
    if (!rc && gen) rc = push_str(p, "<|start_header_id|>", CHAT_PIECE_TOKEN, false, err);
    if (!rc && gen) rc = push_str(p, "assistant", CHAT_PIECE_TEXT, false, err);
    if (!rc && gen) rc = push_str(p, "<|end_header_id|>", CHAT_PIECE_TOKEN, false, err);
    if (!rc && gen) rc = push_str(p, "\n\n", CHAT_PIECE_TEXT, false, err);
    return rc;
}

/* ---- Llama 2 and Mistral v0.1 ---- */

/* '[INST] ' + user + ' [/INST]'; the caller strips (Llama 2) or not (Mistral). */
static int push_inst_open(struct chat_pieces *p, struct smelt_error *err) {
    int rc = push_str(p, "[INST]", CHAT_PIECE_MARKER, false, err);
    if (!rc) rc = push_str(p, " ", CHAT_PIECE_TEXT, false, err);
    return rc;
}

static int push_inst_close(struct chat_pieces *p, struct smelt_error *err) {
    int rc = push_str(p, " ", CHAT_PIECE_TEXT, false, err);
    if (!rc) rc = push_str(p, "[/INST]", CHAT_PIECE_MARKER, false, err);
    return rc;
}

/* Llama-2-*-chat-hf: per user turn bos_token + '[INST] ' + content.strip() + ' [/INST]',
 * the first user turn's content prefixed with '<<SYS>>\n' + system + '\n<</SYS>>\n\n'
 * before the strip; per assistant turn ' ' + content.strip() + ' ' + eos_token. */
static int build_llama2(const struct chat_template *t, const struct chat_message *m, size_t n,
                        struct chat_pieces *p, struct smelt_error *err) {
    int rc = check_alternation(t, m, n, true, err);
    if (!rc) rc = need_token(t, "bos", t->bos, err);
    if (!rc) rc = need_token(t, "eos", t->eos, err);
    bool has_system = !strcmp(m[0].role, "system");
    for (size_t i = has_system; !rc && i < n; i++) {
        const char *c = m[i].content;
        if (!strcmp(m[i].role, "assistant")) {
            rc = push_str(p, " ", CHAT_PIECE_TEXT, true, err);
            if (!rc) rc = push_stripped(p, c, strlen(c), CHAT_PIECE_CONTENT, true, STRIP_SPACE, true, true, err);
            if (!rc) rc = push_str(p, " ", CHAT_PIECE_TEXT, true, err);
            if (!rc) rc = push_str(p, t->eos, CHAT_PIECE_TOKEN, true, err);
            continue;
        }
        rc = push_str(p, t->bos, CHAT_PIECE_TOKEN, false, err);
        if (!rc) rc = push_inst_open(p, err);
        size_t first = p->count;
        if (!rc && has_system && i == 1) {
            rc = push_str(p, "<<SYS>>\n", CHAT_PIECE_TEXT, false, err);
            if (!rc) rc = push_str(p, m[0].content, CHAT_PIECE_CONTENT, false, err);
            if (!rc) rc = push_str(p, "\n<</SYS>>\n\n", CHAT_PIECE_TEXT, false, err);
        }
        if (!rc) rc = push_str(p, c, CHAT_PIECE_CONTENT, false, err);
        if (!rc) strip_pieces(p, first, STRIP_SPACE, true, true);
        if (!rc) rc = push_inst_close(p, err);
    }
    return rc;
}

/* Mistral-7B-Instruct-v0.1 (original template): bos_token once, then per user turn
 * '[INST] ' + content + ' [/INST]' and per assistant turn content + eos_token. */
static int build_mistral(const struct chat_template *t, const struct chat_message *m, size_t n,
                         struct chat_pieces *p, struct smelt_error *err) {
    int rc = check_alternation(t, m, n, false, err);
    if (!rc) rc = need_token(t, "bos", t->bos, err);
    if (!rc) rc = need_token(t, "eos", t->eos, err);
    if (!rc) rc = push_str(p, t->bos, CHAT_PIECE_TOKEN, false, err);
    for (size_t i = 0; !rc && i < n; i++) {
        if (!strcmp(m[i].role, "assistant")) {
            rc = push_str(p, m[i].content, CHAT_PIECE_CONTENT, true, err);
            if (!rc) rc = push_str(p, t->eos, CHAT_PIECE_TOKEN, true, err);
            continue;
        }
        rc = push_inst_open(p, err);
        if (!rc) rc = push_str(p, m[i].content, CHAT_PIECE_CONTENT, false, err);
        if (!rc) rc = push_inst_close(p, err);
    }
    return rc;
}

/* ---- plain ---- */

/* smelt's own format for models without a chat template: bos (if any) once, then
 * "System: {content}\n", "User: {content}\n", "Assistant: {content}{eos}\n"; the
 * generation prompt is "Assistant:", so the model produces " {content}{eos}". */
static int build_plain(const struct chat_template *t, const struct chat_message *m, size_t n, bool gen,
                       struct chat_pieces *p, struct smelt_error *err) {
    int rc = need_token(t, "eos", t->eos, err);
    if (!rc && t->bos[0]) rc = push_str(p, t->bos, CHAT_PIECE_TOKEN, false, err);
    for (size_t i = 0; !rc && i < n; i++) {
        if (!strcmp(m[i].role, "assistant")) {
            rc = push_str(p, "Assistant:", CHAT_PIECE_TEXT, false, err);
            if (!rc) rc = push_str(p, " ", CHAT_PIECE_TEXT, true, err);
            if (!rc) rc = push_str(p, m[i].content, CHAT_PIECE_CONTENT, true, err);
            if (!rc) rc = push_str(p, t->eos, CHAT_PIECE_TOKEN, true, err);
        } else {
            rc = push_str(p, !strcmp(m[i].role, "system") ? "System: " : "User: ", CHAT_PIECE_TEXT, false, err);
            if (!rc) rc = push_str(p, m[i].content, CHAT_PIECE_CONTENT, false, err);
        }
        if (!rc) rc = push_str(p, "\n", CHAT_PIECE_TEXT, false, err);
    }
    if (!rc && gen) rc = push_str(p, "Assistant:", CHAT_PIECE_TEXT, false, err);
    return rc;
}

int chat_build_pieces(const struct chat_template *t, const struct chat_message *messages, size_t n,
                      bool add_generation_prompt, struct chat_pieces *out, struct smelt_error *err) {
    if (!t || (int)t->kind < 0 || (int)t->kind >= CHAT_TEMPLATE_COUNT)
        return error_set(err, SMELT_EINVAL, "chat template: no template or an unknown kind");
    if (n == 0) return error_set(err, SMELT_EINVAL, "chat messages: the list is empty");
    if (!messages) return error_set(err, SMELT_EINVAL, "chat messages: %zu messages but no array", n);
    for (size_t i = 0; i < n; i++) {
        enum role r;
        int rc = role_of(&messages[i], i, &r, err);
        if (rc) return rc;
    }
    int rc;
    bool gen = add_generation_prompt;
    switch (t->kind) {
    case CHAT_TEMPLATE_CHATML: rc = build_chatml(messages, n, gen, false, out, err); break;
    case CHAT_TEMPLATE_QWEN3: rc = build_chatml(messages, n, gen, true, out, err); break;
    case CHAT_TEMPLATE_LLAMA3: rc = build_llama3(t, messages, n, gen, out, err); break;
    case CHAT_TEMPLATE_LLAMA2: rc = build_llama2(t, messages, n, out, err); break;
    case CHAT_TEMPLATE_MISTRAL: rc = build_mistral(t, messages, n, out, err); break;
    case CHAT_TEMPLATE_PLAIN: rc = build_plain(t, messages, n, gen, out, err); break;
    default: rc = error_set(err, SMELT_EINVAL, "chat template: unknown kind %d", (int)t->kind);
    }
    return rc;
}
