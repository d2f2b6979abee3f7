/* Private to tokenizer/chat_template*.c: a rendered conversation as a list of pieces.
 *
 * Every template builds the same thing: the rendered text cut where tokenization must
 * treat it differently. chat_render concatenates the pieces; chat_tokenize looks the
 * control tokens up as ids and encodes the text in between. Piece text is borrowed
 * (message content, string literals, the template's bos/eos) and lives as long as the
 * call that built it. */
#ifndef SMELT_TOKENIZER_CHAT_TEMPLATE_INTERNAL_H
#define SMELT_TOKENIZER_CHAT_TEMPLATE_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

#include "tokenizer/tokenizer.h"

enum chat_piece_kind {
    CHAT_PIECE_TEXT,    /* template text: "assistant\n", " ", "<<SYS>>\n" */
    CHAT_PIECE_CONTENT, /* (part of) a message's content: never becomes a control token */
    CHAT_PIECE_TOKEN,   /* a control token the tokenizer must have: <|im_start|>, bos, eos */
    CHAT_PIECE_MARKER,  /* a control token when the tokenizer has it as a special token,
                         * plain template text otherwise: [INST] (Mistral v3 has it,
                         * Llama 2 does not), <think> */
};

struct chat_piece {
    const char *text;
    size_t len;
    enum chat_piece_kind kind;
    bool trained; /* part of the assistant's output: its mask bit */
};

struct chat_pieces {
    struct chat_piece *items;
    size_t count, cap;
};

/* Validates the messages and cuts the conversation into pieces (out starts empty; the
 * caller frees out->items, also on error). */
int chat_build_pieces(const struct chat_template *t, const struct chat_message *messages,
                      size_t n, bool add_generation_prompt, struct chat_pieces *out,
                      struct smelt_error *err);

#endif
