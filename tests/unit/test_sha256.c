/* server/sha256: the NIST FIPS 180-4 example vectors (empty, "abc", the 448- and
 * 896-bit messages, a million 'a'), every padding edge around the 56- and 64-byte
 * block boundaries (against Python's hashlib), and binary input with NULs. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "server/sha256.h"

static void expect_hex(const void *data, size_t len, const char *want) {
    char got[65];
    memset(got, 'x', sizeof got);
    sha256_hex(data, len, got);
    cr_assert_eq(got[64], '\0');
    cr_assert_str_eq(got, want, "sha256 of %zu bytes", len);
}

Test(sha256, nist_short_messages) {
    expect_hex("", 0, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    expect_hex("abc", 3, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    const char *m448 = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    expect_hex(m448, strlen(m448),
               "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    const char *m896 = "abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmn"
                       "hijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu";
    expect_hex(m896, strlen(m896),
               "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
}

Test(sha256, nist_million_a) {
    size_t n = 1000000;
    char *a = malloc(n);
    cr_assert(a);
    memset(a, 'a', n);
    expect_hex(a, n, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
    free(a);
}

Test(sha256, padding_edges) {
    static const struct { size_t n; const char *hex; } cases[] = {
        {55, "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318"},
        {56, "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a"},
        {63, "7d3e74a05d7db15bce4ad9ec0658ea98e3f06eeecf16b4c6fff2da457ddc2f34"},
        {64, "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb"},
        {65, "635361c48bb9eab14198e76ea8ab7f1a41685d6ad62aa9146d301d4f17eb0ae0"},
        {119, "31eba51c313a5c08226adf18d4a359cfdfd8d2e816b13f4af952f7ea6584dcfb"},
        {120, "2f3d335432c70b580af0e8e1b3674a7c020d683aa5f73aaaedfdc55af904c21c"},
    };
    char a[128];
    memset(a, 'a', sizeof a);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        expect_hex(a, cases[i].n, cases[i].hex);
}

Test(sha256, binary_input_and_raw_digest) {
    unsigned char data[768];
    for (size_t i = 0; i < sizeof data; i++) data[i] = (unsigned char)(i % 256);
    expect_hex(data, sizeof data,
               "f3a25aa93aa2fbba28d79260535bbd6a5eb0fc1c24a8b0f04e12b484c1dfe363");
    uint8_t raw[32];
    sha256("abc", 3, raw);
    cr_assert_eq(raw[0], 0xba);
    cr_assert_eq(raw[31], 0xad);
}
