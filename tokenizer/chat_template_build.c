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

/* Jinja's "roles must alternate" check (Llama 2, Mistral v0.1, Gemma): after an optional leading
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

/* '<think>\n' + reasoning + '\n</think>\n\n', as Qwen3's Jinja writes the block. */
static int push_think_block(struct chat_pieces *p, const char *reason, size_t len, bool trained,
                            struct smelt_error *err) {
    int rc = push_str(p, "<think>", CHAT_PIECE_MARKER, trained, err);
    if (!rc) rc = push_str(p, "\n", CHAT_PIECE_TEXT, trained, err);
    if (!rc) rc = push(p, reason, len, CHAT_PIECE_CONTENT, trained, err);
    if (!rc) rc = push_str(p, "\n", CHAT_PIECE_TEXT, trained, err);
    if (!rc) rc = push_str(p, "</think>", CHAT_PIECE_MARKER, trained, err);
    if (!rc) rc = push_str(p, "\n\n", CHAT_PIECE_TEXT, trained, err);
    return rc;
}

/* Qwen3's assistant turn. Content holding "</think>" is split into reasoning (after the
 * last <think> before the first </think>) and answer (after the last </think>). Turns
 * after the last user query that are the final message or have reasoning keep a
 * <think> block (empty when there is no reasoning); earlier turns lose their reasoning.
 * nothink (enable_thinking=false) renders the same text, but its generation prompt
 * already holds the empty block, so the model never writes one: an empty block is then
 * prompt, not trained, and the prompt's pieces stay a prefix of the conversation's. */
static int qwen3_assistant(struct chat_pieces *p, const char *c, size_t i, size_t n, size_t last_query,
                           bool nothink, struct smelt_error *err) {
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
    int rc = push_think_block(p, rs.text, rs.len, !nothink || rs.len > 0, err);
    if (!rc) rc = push_stripped(p, answer, answer_len, CHAT_PIECE_CONTENT, true, STRIP_NEWLINE, true, false, err);
    return rc;
}

/* Qwen2.5's Jinja without tools, minus its default system prompt; with qwen3, Qwen3's
 * Jinja without tools and with enable_thinking undefined (qwen3-nothink: false). Every
 * message renders as '<|im_start|>' + role + '\n' + content + '<|im_end|>\n'. */
static int build_chatml(enum chat_template_kind kind, const struct chat_message *m, size_t n, bool gen,
                        struct chat_pieces *p, struct smelt_error *err) {
    bool qwen3 = kind != CHAT_TEMPLATE_CHATML, nothink = kind == CHAT_TEMPLATE_QWEN3_NOTHINK;
    size_t last_query = qwen3 ? qwen3_last_query(m, n) : 0;
    int rc = SMELT_OK;
    for (size_t i = 0; !rc && i < n; i++) {
        bool asst = !strcmp(m[i].role, "assistant");
        rc = push_str(p, "<|im_start|>", CHAT_PIECE_TOKEN, false, err);
        if (!rc) rc = push_str(p, m[i].role, CHAT_PIECE_TEXT, false, err);
        if (!rc) rc = push_str(p, "\n", CHAT_PIECE_TEXT, false, err);
        if (!rc && asst && qwen3) rc = qwen3_assistant(p, m[i].content, i, n, last_query, nothink, err);
        else if (!rc) rc = push_str(p, m[i].content, CHAT_PIECE_CONTENT, asst, err);
        if (!rc) rc = push_str(p, "<|im_end|>", CHAT_PIECE_TOKEN, asst, err);
        if (!rc) rc = push_str(p, "\n", CHAT_PIECE_TEXT, false, err);
    }
    if (!rc && gen) rc = push_str(p, "<|im_start|>", CHAT_PIECE_TOKEN, false, err);
    if (!rc && gen) rc = push_str(p, "assistant\n", CHAT_PIECE_TEXT, false, err);
    if (!rc && gen && nothink) rc = push_think_block(p, "", 0, false, err);
    return rc;
}

/* ---- Llama 3 and Llama 3.1+ ---- */

/* '<|start_header_id|>' + role + '<|end_header_id|>\n\n' */
static int push_llama3_header(struct chat_pieces *p, const char *role, struct smelt_error *err) {
    int rc = push_str(p, "<|start_header_id|>", CHAT_PIECE_TOKEN, false, err);
    if (!rc) rc = push_str(p, role, CHAT_PIECE_TEXT, false, err);
    if (!rc) rc = push_str(p, "<|end_header_id|>", CHAT_PIECE_TOKEN, false, err);
    if (!rc) rc = push_str(p, "\n\n", CHAT_PIECE_TEXT, false, err);
    return rc;
}

/* Llama 3.1-3.3's system block, emitted with or without a system message (no tools, no
 * builtin_tools): the header, 'Cutting Knowledge Date: December 2023\n', 'Today Date: '
 * + date_string + '\n\n', the first system message | trim, '<|eot_id|>'. */
static int push_llama31_system(struct chat_pieces *p, const char *system, struct smelt_error *err) {
    int rc = push_llama3_header(p, "system", err);
    if (!rc) rc = push_str(p, "Cutting Knowledge Date: December 2023\nToday Date: " CHAT_LLAMA31_DATE "\n\n",
                           CHAT_PIECE_TEXT, false, err);
    if (!rc && system)
        rc = push_stripped(p, system, strlen(system), CHAT_PIECE_CONTENT, false, STRIP_SPACE, true, true, err);
    if (!rc) rc = push_str(p, "<|eot_id|>", CHAT_PIECE_TOKEN, false, err);
    return rc;
}

/* Meta-Llama-3-*-Instruct: bos_token + per message '<|start_header_id|>' + role +
 * '<|end_header_id|>\n\n' + content | trim + '<|eot_id|>'. Llama 3.1+ (dated): bos, the
 * system block holding the first message if it is a system one, then the rest the same
 * way (a later system message too, as its Jinja does). */
static int build_llama3(const struct chat_template *t, const struct chat_message *m, size_t n, bool gen,
                        bool dated, struct chat_pieces *p, struct smelt_error *err) {
    int rc = need_token(t, "bos", t->bos, err);
    if (!rc) rc = push_str(p, t->bos, CHAT_PIECE_TOKEN, false, err);
    size_t first = dated && !strcmp(m[0].role, "system");
    if (!rc && dated) rc = push_llama31_system(p, first ? m[0].content : NULL, err);
    for (size_t i = first; !rc && i < n; i++) {
        const char *c = m[i].content;
        bool asst = !strcmp(m[i].role, "assistant");
        rc = push_llama3_header(p, m[i].role, err);
        if (!rc) rc = push_stripped(p, c, strlen(c), CHAT_PIECE_CONTENT, asst, STRIP_SPACE, true, true, err);
        if (!rc) rc = push_str(p, "<|eot_id|>", CHAT_PIECE_TOKEN, asst, err);
    }
    if (!rc && gen) rc = push_llama3_header(p, "assistant", err);
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

/* ---- Gemma and Phi-3 ---- */

/* Gemma 3 (google/gemma-3-*-it): bos_token, then per message after an optional first
 * system one '<start_of_turn>' + ('model' for assistant, else the role) + '\n' + (the
 * system content + '\n\n' on the first turn) + content | trim + '<end_of_turn>\n';
 * user/assistant alternating from user. The system content is not trimmed: it is not
 * part of the trimmed message. Gemma 1.1/2's Jinja is the same but raises on a system
 * message (smelt folds it, as Gemma 3 does). Where its alternation check lets a later
 * system message through (at an odd position), smelt refuses it, as for llama2. */
static int build_gemma(const struct chat_template *t, const struct chat_message *m, size_t n, bool gen,
                       struct chat_pieces *p, struct smelt_error *err) {
    int rc = check_alternation(t, m, n, true, err);
    if (!rc) rc = need_token(t, "bos", t->bos, err);
    if (!rc) rc = push_str(p, t->bos, CHAT_PIECE_TOKEN, false, err);
    bool has_system = !strcmp(m[0].role, "system");
    for (size_t i = has_system; !rc && i < n; i++) {
        const char *c = m[i].content;
        bool asst = !strcmp(m[i].role, "assistant");
        rc = push_str(p, "<start_of_turn>", CHAT_PIECE_TOKEN, false, err);
        if (!rc) rc = push_str(p, asst ? "model\n" : "user\n", CHAT_PIECE_TEXT, false, err);
        if (!rc && has_system && i == 1) rc = push_str(p, m[0].content, CHAT_PIECE_CONTENT, false, err);
        if (!rc && has_system && i == 1) rc = push_str(p, "\n\n", CHAT_PIECE_TEXT, false, err);
        if (!rc) rc = push_stripped(p, c, strlen(c), CHAT_PIECE_CONTENT, asst, STRIP_SPACE, true, true, err);
        if (!rc) rc = push_str(p, "<end_of_turn>", CHAT_PIECE_TOKEN, asst, err);
        if (!rc) rc = push_str(p, "\n", CHAT_PIECE_TEXT, false, err);
    }
    if (!rc && gen) rc = push_str(p, "<start_of_turn>", CHAT_PIECE_TOKEN, false, err);
    if (!rc && gen) rc = push_str(p, "model\n", CHAT_PIECE_TEXT, false, err);
    return rc;
}

/* Phi-3-mini-*-instruct: per message '<|' + role + '|>\n' + content + '<|end|>\n', any
 * order, nothing stripped; then '<|assistant|>\n' as the generation prompt, or else
 * eos_token. That eos follows the last <|end|>, which is where the model stops, so it
 * is never generated and not trained. */
static int build_phi3(const struct chat_template *t, const struct chat_message *m, size_t n, bool gen,
                      struct chat_pieces *p, struct smelt_error *err) {
    int rc = gen ? SMELT_OK : need_token(t, "eos", t->eos, err);
    for (size_t i = 0; !rc && i < n; i++) {
        bool asst = !strcmp(m[i].role, "assistant");
        const char *open = asst ? "<|assistant|>" : !strcmp(m[i].role, "user") ? "<|user|>" : "<|system|>";
        rc = push_str(p, open, CHAT_PIECE_TOKEN, false, err);
        if (!rc) rc = push_str(p, "\n", CHAT_PIECE_TEXT, false, err);
        if (!rc) rc = push_str(p, m[i].content, CHAT_PIECE_CONTENT, asst, err);
        if (!rc) rc = push_str(p, "<|end|>", CHAT_PIECE_TOKEN, asst, err);
        if (!rc) rc = push_str(p, "\n", CHAT_PIECE_TEXT, false, err);
    }
    if (!rc && gen) rc = push_str(p, "<|assistant|>", CHAT_PIECE_TOKEN, false, err);
    if (!rc && gen) rc = push_str(p, "\n", CHAT_PIECE_TEXT, false, err);
    if (!rc && !gen) rc = push_str(p, t->eos, CHAT_PIECE_TOKEN, false, err);
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
    case CHAT_TEMPLATE_CHATML:
    case CHAT_TEMPLATE_QWEN3:
    case CHAT_TEMPLATE_QWEN3_NOTHINK: rc = build_chatml(t->kind, messages, n, gen, out, err); break;
    case CHAT_TEMPLATE_LLAMA3: rc = build_llama3(t, messages, n, gen, false, out, err); break;
    case CHAT_TEMPLATE_LLAMA31: rc = build_llama3(t, messages, n, gen, true, out, err); break;
    case CHAT_TEMPLATE_LLAMA2: rc = build_llama2(t, messages, n, out, err); break;
    case CHAT_TEMPLATE_MISTRAL: rc = build_mistral(t, messages, n, out, err); break;
    case CHAT_TEMPLATE_GEMMA: rc = build_gemma(t, messages, n, gen, out, err); break;
    case CHAT_TEMPLATE_PHI3: rc = build_phi3(t, messages, n, gen, out, err); break;
    case CHAT_TEMPLATE_PLAIN: rc = build_plain(t, messages, n, gen, out, err); break;
    default: rc = error_set(err, SMELT_EINVAL, "chat template: unknown kind %d", (int)t->kind);
    }
    return rc;
}
