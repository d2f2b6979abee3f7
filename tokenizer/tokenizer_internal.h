/* Private to tokenizer/tokenizer*.c: the tokenizer's parts and the helpers they share.
 *
 * The pipeline follows Hugging Face `tokenizers` step by step, because ids must match
 * it exactly:
 *
 *   text ─ added tokens (normalized=false) ─ normalizer ─ added tokens (normalized=true)
 *        ─ pre-tokenizer ─ BPE per piece ─ ids
 *   ids ─ token strings ─ decoder chain ─ bytes
 *
 * Text moves through encode as a list of pieces: byte ranges in one growing arena.
 * Splitting a piece only adds ranges; a step that rewrites a piece (a normalizer,
 * ByteLevel's byte mapping, Metaspace's ▁) appends the new text to the arena and points
 * the piece at it. A piece that is an added token carries its id and is left alone by
 * every later step.
 *
 * Invalid UTF-8 is carried, never repaired: a byte that does not start a valid character
 * is a one-byte unit that normalizers copy, regexes never match (PCRE2_MATCH_INVALID_UTF),
 * ByteLevel maps like any byte, and BPE turns into a byte-fallback token or unk. */
#ifndef SMELT_TOKENIZER_INTERNAL_H
#define SMELT_TOKENIZER_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <jansson.h>
#include <pcre2.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "tokenizer/tokenizer.h"

/* Ids above this are refused at load: no real vocabulary comes near, and it bounds the
 * id-indexed tables a hostile file could make us allocate. */
#define TOK_MAX_ID (1 << 24)

/* ---- growable byte buffer, id list (tokenizer_util.c) ---------------------------- */

struct tok_bytes {
    char *data; /* not NUL-terminated unless a caller appends one */
    size_t len, cap;
};
int tok_bytes_reserve(struct tok_bytes *b, size_t extra, struct smelt_error *err);
int tok_bytes_append(struct tok_bytes *b, const void *src, size_t n, struct smelt_error *err);
void tok_bytes_free(struct tok_bytes *b);

struct tok_ids {
    int32_t *items;
    size_t count, cap;
};
int tok_ids_push(struct tok_ids *ids, int32_t id, struct smelt_error *err);

/* ---- UTF-8 and character classes (tokenizer_util.c) ------------------------------- */

/* Byte length (1-4) of the valid UTF-8 character at s[0..n) and its code point in *cp;
 * 0 when s does not start with one (overlong, surrogate, > U+10FFFF, truncated). */
size_t tok_utf8_decode(const char *s, size_t n, int32_t *cp);
/* Length of the unit at s: a valid character, or 1 for a byte that starts none. */
size_t tok_utf8_unit(const char *s, size_t n);
size_t tok_utf8_encode(int32_t cp, char out[4]);
bool tok_is_whitespace(int32_t cp); /* Unicode White_Space, as Rust's char::is_whitespace */
bool tok_is_numeric(int32_t cp);    /* general category Nd, Nl, No */
bool tok_is_alnum(int32_t cp);      /* letters and numbers (L*, N*) */

/* ---- hash maps (tokenizer_map.c) -------------------------------------------------- */

/* Open addressing, linear probing, load <= 1/2. Keys are copied into the map. */
struct tok_str_slot {
    uint64_t hash;
    uint32_t off, len; /* key bytes in keys.data; len == UINT32_MAX marks an empty slot */
    int32_t value;
};
struct tok_str_map {
    struct tok_str_slot *slots;
    size_t cap, count;
    struct tok_bytes keys;
};
int tok_str_map_put(struct tok_str_map *m, const char *key, size_t len, int32_t value,
                    struct smelt_error *err); /* overwrites an existing key */
bool tok_str_map_get(const struct tok_str_map *m, const char *key, size_t len, int32_t *value);
void tok_str_map_free(struct tok_str_map *m);

struct tok_pair_slot {
    uint64_t key; /* left id << 32 | right id */
    int32_t rank; /* -1 marks an empty slot */
    int32_t merged;
};
struct tok_pair_map {
    struct tok_pair_slot *slots;
    size_t cap, count;
};
int tok_pair_map_put(struct tok_pair_map *m, int32_t left, int32_t right, int32_t rank,
                     int32_t merged, struct smelt_error *err); /* overwrites */
bool tok_pair_map_get(const struct tok_pair_map *m, int32_t left, int32_t right,
                      int32_t *rank, int32_t *merged);
void tok_pair_map_free(struct tok_pair_map *m);

/* ---- patterns: {"String": s} or {"Regex": r} (tokenizer_pattern.c) ---------------- */

struct tok_pattern {
    char *literal;  /* String pattern (NULL for a regex) */
    size_t literal_len;
    pcre2_code *re; /* Regex pattern, compiled with UTF, UCP, MATCH_INVALID_UTF */
};

/* A cover of a piece: consecutive ranges, each a match of the pattern or not. */
struct tok_segment {
    size_t start, end;
    bool is_match;
};
struct tok_segments {
    struct tok_segment *items;
    size_t count, cap;
};

int tok_pattern_parse(const json_t *obj, const char *where, struct tok_pattern *p,
                      struct smelt_error *err);
int tok_pattern_compile_regex(const char *source, const char *where, struct tok_pattern *p,
                              struct smelt_error *err);
void tok_pattern_free(struct tok_pattern *p);
/* Fills out (cleared first) with the cover of s[0..n) by matches of p; an empty s gives
 * one empty non-match, as `tokenizers` does. */
int tok_pattern_find(const struct tok_pattern *p, const char *s, size_t n,
                     struct tok_segments *out, struct smelt_error *err);
/* The same cover where each character with pred(cp) true is a match of its own. */
int tok_chars_find(bool (*pred)(int32_t cp, const void *ctx), const void *ctx, const char *s,
                   size_t n, struct tok_segments *out, struct smelt_error *err);
int tok_segments_push(struct tok_segments *s, size_t start, size_t end, bool is_match,
                      struct smelt_error *err);

/* ---- pieces of text during encode (tokenizer_encode.c) ---------------------------- */

struct tok_piece {
    size_t off, len;  /* in tok_text.arena */
    int32_t added_id; /* >= 0: an added token, final; -1: text still to tokenize */
    bool at_start;    /* the piece begins at byte 0 of the input (Metaspace "first") */
};
struct tok_pieces {
    struct tok_piece *items;
    size_t count, cap;
};
struct tok_text {
    struct tok_bytes arena;
    struct tok_pieces pieces; /* current list */
    struct tok_pieces next;   /* scratch: a step builds the new list here, then swaps */
    struct tok_segments segs; /* scratch for pattern matches */
    struct tok_bytes scratch;
};
int tok_pieces_push(struct tok_pieces *p, struct tok_piece piece, struct smelt_error *err);
/* Swaps next into pieces and empties next. */
void tok_text_commit(struct tok_text *t);

/* ---- normalizers (tokenizer_normalize.c) ------------------------------------------ */

enum tok_norm_kind {
    TOK_NORM_NFC, TOK_NORM_NFD, TOK_NORM_NFKC, TOK_NORM_NFKD,
    TOK_NORM_REPLACE, TOK_NORM_PREPEND, TOK_NORM_SEQUENCE,
};
struct tok_normalizer {
    enum tok_norm_kind kind;
    struct tok_pattern pattern; /* Replace */
    char *content;              /* Replace, Prepend */
    size_t content_len;
    struct tok_normalizer *items; /* Sequence */
    size_t n_items;
};
/* json null or absent → *out = NULL (no normalizer). */
int tok_normalizer_parse(const json_t *j, const char *where, struct tok_normalizer **out,
                         struct smelt_error *err);
void tok_normalizer_free(struct tok_normalizer *n);
/* out = n(in); out is emptied first and must not alias in. */
int tok_normalize(const struct tok_normalizer *n, const char *in, size_t len,
                  struct tok_bytes *out, struct smelt_error *err);

/* ---- pre-tokenizers (tokenizer_pretok.c) ------------------------------------------ */

enum tok_pretok_kind {
    TOK_PRETOK_SPLIT, TOK_PRETOK_BYTE_LEVEL, TOK_PRETOK_METASPACE, TOK_PRETOK_DIGITS,
    TOK_PRETOK_SEQUENCE,
};
enum tok_split_behavior {
    TOK_SPLIT_REMOVED, TOK_SPLIT_ISOLATED, TOK_SPLIT_MERGED_WITH_PREVIOUS,
    TOK_SPLIT_MERGED_WITH_NEXT, TOK_SPLIT_CONTIGUOUS,
};
enum tok_prepend_scheme { TOK_PREPEND_ALWAYS, TOK_PREPEND_FIRST, TOK_PREPEND_NEVER };
struct tok_pretok {
    enum tok_pretok_kind kind;
    struct tok_pattern pattern; /* Split; ByteLevel with use_regex (the GPT-2 regex) */
    enum tok_split_behavior behavior;
    bool invert;
    bool add_prefix_space, use_regex;       /* ByteLevel */
    char replacement[4];                    /* Metaspace: one character, usually ▁ */
    size_t replacement_len;
    enum tok_prepend_scheme prepend_scheme; /* Metaspace */
    bool split;                             /* Metaspace */
    bool individual_digits;                 /* Digits */
    struct tok_pretok *items;               /* Sequence */
    size_t n_items;
};
int tok_pretok_parse(const json_t *j, const char *where, struct tok_pretok **out,
                     struct smelt_error *err);
void tok_pretok_free(struct tok_pretok *p);
int tok_pretokenize(const struct tok_pretok *p, struct tok_text *t, struct smelt_error *err);
/* Splits every text piece of t at the matches of pattern, per behavior and invert (also
 * ByteLevel's use_regex split). */
int tok_split_pieces(struct tok_text *t, const struct tok_pattern *pattern,
                     enum tok_split_behavior behavior, bool invert, struct smelt_error *err);
/* Metaspace's prepend_scheme, or the older add_prefix_space (pre-tokenizer and decoder). */
int tok_parse_prepend_scheme(const json_t *obj, const char *where,
                             enum tok_prepend_scheme *out, struct smelt_error *err);

/* GPT-2's byte ↔ printable-character mapping (tokenizer_bytelevel.c). */
int32_t tok_byte_to_char(unsigned char b); /* the code point standing for byte b */
#define TOK_GPT2_REGEX \
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"
/* Appends the ByteLevel image of in[0..n) to out. */
int tok_bytelevel_map(const char *in, size_t n, struct tok_bytes *out, struct smelt_error *err);
/* Appends the bytes the characters of in stand for; false (nothing appended) when some
 * character is outside the table, as `tokenizers` then keeps the token's own bytes. */
int tok_bytelevel_unmap(const char *in, size_t n, struct tok_bytes *out, bool *ok,
                        struct smelt_error *err);

/* ---- decoders (tokenizer_decoder.c) ------------------------------------------------ */

enum tok_dec_kind {
    TOK_DEC_BYTE_LEVEL, TOK_DEC_METASPACE, TOK_DEC_BYTE_FALLBACK, TOK_DEC_FUSE,
    TOK_DEC_STRIP, TOK_DEC_REPLACE, TOK_DEC_SEQUENCE,
};
struct tok_decoder {
    enum tok_dec_kind kind;
    struct tok_pattern pattern; /* Replace */
    char *content;              /* Replace */
    size_t content_len;
    char strip[4];              /* Strip: the character, as UTF-8 */
    size_t strip_len, strip_start, strip_stop;
    char replacement[4];        /* Metaspace */
    size_t replacement_len;
    enum tok_prepend_scheme prepend_scheme;
    struct tok_decoder *items;  /* Sequence */
    size_t n_items;
};
/* A list of byte strings, the currency of decoders. */
struct tok_strlist {
    struct tok_bytes data;
    size_t *off, *len;
    size_t count, cap;
};
int tok_strlist_push(struct tok_strlist *l, const char *s, size_t n, struct smelt_error *err);
void tok_strlist_clear(struct tok_strlist *l);
void tok_strlist_free(struct tok_strlist *l);

int tok_decoder_parse(const json_t *j, const char *where, struct tok_decoder **out,
                      struct smelt_error *err);
void tok_decoder_free(struct tok_decoder *d);
/* out = d(in); out is cleared first. */
int tok_decoder_apply(const struct tok_decoder *d, const struct tok_strlist *in,
                      struct tok_strlist *out, struct smelt_error *err);

/* ---- BPE model (tokenizer_bpe.c) --------------------------------------------------- */

struct tok_bpe {
    struct tok_str_map vocab;   /* token → id */
    struct tok_bytes pool;      /* token strings, each NUL-terminated */
    int64_t *token_off;         /* [n_slots] offset in pool, -1 for an id with no token */
    int32_t n_slots;            /* 1 + the largest model id */
    struct tok_pair_map merges; /* (left, right) → rank, merged id */
    int32_t (*merge_list)[2];   /* [n_merges] (left, right) by rank, for saving */
    size_t n_merges;
    char *unk_token;            /* NULL when none */
    int32_t unk_id;
    char *prefix, *suffix;      /* continuing_subword_prefix, end_of_word_suffix or NULL */
    size_t prefix_len, suffix_len;
    bool byte_fallback, fuse_unk, ignore_merges;
    int32_t byte_ids[256];      /* <0xNN> ids for byte fallback; -1 when absent */
};
/* Reusable scratch for one encode call. */
struct tok_bpe_work {
    struct tok_bpe_symbol *symbols;
    size_t symbols_cap;
    struct tok_bpe_merge *heap;
    size_t heap_cap;
    struct tok_bytes key;
};
int tok_bpe_parse(const json_t *model, const char *where, struct tok_bpe *bpe,
                  struct smelt_error *err);
void tok_bpe_free(struct tok_bpe *bpe);
const char *tok_bpe_token(const struct tok_bpe *bpe, int32_t id); /* NULL when none */
int tok_bpe_encode(const struct tok_bpe *bpe, const char *word, size_t n,
                   struct tok_bpe_work *w, struct tok_ids *out, struct smelt_error *err);
void tok_bpe_work_free(struct tok_bpe_work *w);

/* ---- added tokens (tokenizer_added.c) ---------------------------------------------- */

struct tok_added {
    char *content;
    size_t len;
    char *match; /* what is searched for: content, normalized when `normalized` */
    size_t match_len;
    int32_t id;
    bool special, single_word, lstrip, rstrip, normalized;
};
struct tok_added_set {
    struct tok_added *items;
    size_t count, n_normalized;    /* n_normalized: how many have normalized=true */
    struct tok_str_map by_content; /* content → index in items */
    uint32_t *order;               /* indices sorted by first match byte, then longest first */
    uint32_t bucket[257];          /* order[bucket[b] .. bucket[b+1]) start with byte b */
};
int tok_added_parse(const json_t *arr, const char *where, struct tok_added_set *set,
                    struct smelt_error *err);
/* Fills each token's match string (normalizing those with normalized=true) and builds
 * the search index. */
int tok_added_prepare(struct tok_added_set *set, const struct tok_normalizer *norm,
                      struct smelt_error *err);
void tok_added_free(struct tok_added_set *set);
/* Splits the text pieces of t at the added tokens whose `normalized` flag equals
 * normalized; special tokens only when allow_special. */
int tok_added_split(const struct tok_added_set *set, bool normalized, bool allow_special,
                    struct tok_text *t, struct smelt_error *err);

/* ---- the tokenizer ------------------------------------------------------------------ */

struct tokenizer {
    char *source;              /* the file it came from, for messages */
    struct tok_bpe bpe;
    struct tok_added_set added;
    int32_t n_ids;             /* 1 + the largest id of the model or an added token */
    int32_t *added_of_id;      /* [n_ids] index into added.items, or -1 */
    struct tok_normalizer *normalizer;
    struct tok_pretok *pretok;
    struct tok_decoder *decoder;
    /* Copies of the small config sections, written back by tokenizer_save. */
    json_t *normalizer_json, *pretok_json, *post_json, *decoder_json;
    struct tokenizer_specials specials;
};

/* Builds a tokenizer from a parsed tokenizer.json (borrowed). where names the source in
 * every message. (tokenizer_load.c) */
int tok_build(const json_t *root, const char *where, struct tokenizer **out,
              struct smelt_error *err);
/* GPT-2's encoder.json (token → id) + vocab.bpe (merges), read as the equivalent
 * tokenizer.json (tokenizer_gpt2.c). */
int tok_load_gpt2(const char *encoder_path, const char *merges_path, struct tokenizer **out,
                  struct smelt_error *err);
/* bos/eos/pad/unk from the post-processor template and well-known token names
 * (tokenizer_vocab.c). */
int tok_infer_specials(struct tokenizer *tok, const json_t *post, const char *where,
                       struct smelt_error *err);
/* The post-processor types accepted (their ids are not added by encode). */
int tok_post_check(const json_t *post, const char *where, struct smelt_error *err);

#endif
