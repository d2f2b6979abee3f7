/* GPT-2's byte-level alphabet: every byte stands for a printable character, so that a
 * vocabulary of strings can hold arbitrary bytes. Printable Latin-1 bytes ('!'..'~',
 * '¡'..'¬', '®'..'ÿ') stand for themselves; the other 68 bytes, in increasing order, for
 * U+0100..U+0143 (a space is 'Ġ' U+0120, a newline 'Ċ' U+010A). */
#include "tokenizer/tokenizer_internal.h"

static bool byte_is_printable(unsigned b) {
    return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
}

int32_t tok_byte_to_char(unsigned char b) {
    if (byte_is_printable(b)) return b;
    if (b <= 32) return 256 + b;              /* 0..32    → U+0100..U+0120 */
    if (b <= 160) return 256 + 33 + (b - 127); /* 127..160 → U+0121..U+0142 */
    return 256 + 67;                           /* 173      → U+0143 */
}

/* The byte a code point stands for, or -1. */
static int char_to_byte(int32_t cp) {
    if (cp < 256) return byte_is_printable((unsigned)cp) ? cp : -1;
    int32_t k = cp - 256;
    if (k < 33) return k;
    if (k < 67) return 127 + (k - 33);
    if (k == 67) return 173;
    return -1;
}

int tok_bytelevel_map(const char *in, size_t n, struct tok_bytes *out, struct smelt_error *err) {
    int rc = tok_bytes_reserve(out, 2 * n, err);
    if (rc) return rc;
    char *w = out->data + out->len;
    for (size_t i = 0; i < n; i++) {
        int32_t cp = tok_byte_to_char((unsigned char)in[i]);
        if (cp < 0x80) {
            *w++ = (char)cp;
        } else { /* all code points here are below U+0800: two bytes */
            *w++ = (char)(0xC0 | (cp >> 6));
            *w++ = (char)(0x80 | (cp & 0x3F));
        }
    }
    out->len = (size_t)(w - out->data);
    return SMELT_OK;
}

int tok_bytelevel_unmap(const char *in, size_t n, struct tok_bytes *out, bool *ok,
                        struct smelt_error *err) {
    size_t start = out->len;
    int rc = tok_bytes_reserve(out, n, err);
    if (rc) return rc;
    for (size_t i = 0; i < n;) {
        int32_t cp;
        size_t k = tok_utf8_decode(in + i, n - i, &cp);
        int b = k ? char_to_byte(cp) : -1;
        if (b < 0) {
            out->len = start;
            *ok = false;
            return SMELT_OK;
        }
        out->data[out->len++] = (char)b;
        i += k;
    }
    *ok = true;
    return SMELT_OK;
}
