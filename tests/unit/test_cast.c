/* The scalar conversions (f16, bf16 <-> f32) and ops_cast: every 16-bit pattern
 * round-trips; f32 -> f16 / bf16 rounding matches a slow reference written from the
 * IEEE 754 definition (round to nearest, ties to even, overflow to inf) on hand-picked
 * edge cases and on a million random f32 patterns. */
#include "tests/unit/testutil.h"

#include <string.h>

static uint32_t bits_of(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}

static float float_of(uint32_t u) {
    float x;
    memcpy(&x, &u, 4);
    return x;
}

/* ---- reference from the definitions ---- */

/* A binary format with `mant_bits` stored mantissa bits and exponent bias `bias`:
 * value of (exp, mant) fields, for finite patterns. */
static double ref_decode(uint32_t sign, uint32_t exp, uint32_t mant, int mant_bits, int bias) {
    double v = exp == 0 ? ldexp((double)mant, 1 - bias - mant_bits)
                        : ldexp(1.0 + ldexp((double)mant, -mant_bits), (int)exp - bias);
    return sign ? -v : v;
}

/* Rounds |x| (finite, in double) to a format with `precision` significant bits, minimum
 * normal exponent emin (value 2^emin) and largest finite value `max_finite`, then
 * encodes it. Ties go to the even significand; a result above max_finite is inf. */
static uint32_t ref_encode(double x, int precision, int emin, double max_finite, int exp_bits) {
    const int mant_bits = precision - 1, bias = (1 << (exp_bits - 1)) - 1;
    const uint32_t sign = signbit(x) ? 1u << (exp_bits + mant_bits) : 0u;
    const uint32_t inf = ((1u << exp_bits) - 1u) << mant_bits;
    double a = fabs(x);
    if (a == 0.0) return sign;
    int e;
    frexp(a, &e); /* a = f * 2^e, f in [0.5, 1): the leading bit is worth 2^(e-1) */
    int quantum_exp = (e - 1 >= emin ? e - 1 : emin) - mant_bits; /* subnormals: fixed quantum */
    double r = ldexp(a, -quantum_exp), fl = floor(r), frac = r - fl;
    double n = fl;
    if (frac > 0.5 || (frac == 0.5 && fmod(fl, 2.0) == 1.0)) n = fl + 1.0;
    double v = ldexp(n, quantum_exp);
    if (v > max_finite) return sign | inf;
    if (v == 0.0) return sign;
    frexp(v, &e);
    if (e - 1 < emin) return sign | (uint32_t)ldexp(v, mant_bits - emin); /* subnormal */
    uint32_t field = (uint32_t)(e - 1 + bias);
    uint32_t mant = (uint32_t)(ldexp(v, mant_bits - (e - 1)) - ldexp(1.0, mant_bits));
    return sign | field << mant_bits | mant;
}

static uint16_t ref_f32_to_f16(float x) { return (uint16_t)ref_encode(x, 11, -14, 65504.0, 5); }
static uint16_t ref_f32_to_bf16(float x) {
    return (uint16_t)ref_encode(x, 8, -126, ldexp(255.0, 120), 8); /* (2 - 2^-7) * 2^127 */
}

static bool f16_is_nan(uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu); }
static bool bf16_is_nan(uint16_t h) { return (h & 0x7f80u) == 0x7f80u && (h & 0x7fu); }

/* ---- every 16-bit pattern ---- */

Test(cast, every_f16_pattern) {
    for (uint32_t h = 0; h < 65536; h++) {
        float f = f16_to_f32((uint16_t)h);
        uint32_t sign = h >> 15, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
        if (exp == 0x1f) {
            if (mant == 0) {
                cr_expect(isinf(f) && !signbit(f) == !sign, "f16 %04x is not inf: %g", h, f);
            } else {
                cr_expect(isnan(f) && !signbit(f) == !sign, "f16 %04x is not a NaN of its sign", h);
                /* A NaN stays NaN, signalling ones come back quiet (bit 9), payload kept. */
                uint16_t back = f32_to_f16(f);
                cr_expect(back == (h | 0x200u), "NaN f16 %04x came back as %04x", h, back);
            }
            continue;
        }
        double want = ref_decode(sign, exp, mant, 10, 15);
        cr_expect((double)f == want && !signbit(f) == !sign, "f16 %04x -> %.10g, expected %.10g", h, f, want);
        uint16_t back = f32_to_f16(f);
        cr_expect(back == h, "f16 %04x -> %g -> %04x", h, f, back);
    }
}

Test(cast, every_bf16_pattern) {
    for (uint32_t h = 0; h < 65536; h++) {
        float f = bf16_to_f32((uint16_t)h);
        uint32_t sign = h >> 15, exp = (h >> 7) & 0xffu, mant = h & 0x7fu;
        uint16_t back = f32_to_bf16(f);
        if (exp == 0xff && mant) {
            cr_expect(isnan(f), "bf16 %04x is not NaN", h);
            cr_expect(back == (h | 0x40u), "NaN bf16 %04x came back as %04x", h, back);
            continue;
        }
        if (exp == 0xff) {
            cr_expect(isinf(f) && !signbit(f) == !sign, "bf16 %04x is not inf", h);
        } else {
            double want = ref_decode(sign, exp, mant, 7, 127);
            cr_expect((double)f == want && !signbit(f) == !sign, "bf16 %04x -> %.10g, expected %.10g", h, f, want);
        }
        cr_expect(back == h, "bf16 %04x -> %g -> %04x", h, f, back);
    }
}

/* ---- f32 -> f16 edge cases ---- */

struct f16_case {
    float x;
    uint16_t want;
    const char *why;
};

Test(cast, f32_to_f16_edges) {
    const float max_half = 65504.0f, overflow = 65520.0f;
    const struct f16_case cases[] = {
        {1.0f, 0x3c00, "one"},
        {1.0f + 0x1p-11f, 0x3c00, "tie between 1 and 1+2^-10 goes to even 1"},
        {1.0f + 3 * 0x1p-11f, 0x3c02, "tie between 1+2^-10 and 1+2^-9 goes to even"},
        {nextafterf(1.0f + 0x1p-11f, 2.0f), 0x3c01, "just above the tie rounds up"},
        {nextafterf(1.0f + 3 * 0x1p-11f, 0.0f), 0x3c01, "just below the tie rounds down"},
        {-1.0f - 0x1p-11f, 0xbc00, "negative tie to even"},
        {max_half, 0x7bff, "largest finite half"},
        {nextafterf(max_half, 0.0f), 0x7bff, "just below 65504"},
        {nextafterf(max_half, INFINITY), 0x7bff, "just above 65504"},
        {nextafterf(overflow, 0.0f), 0x7bff, "just below the overflow threshold 65520"},
        {overflow, 0x7c00, "65520 is a tie between 65504 and 2^16: even is 2^16, so inf"},
        {nextafterf(overflow, INFINITY), 0x7c00, "just above 65520"},
        {-overflow, 0xfc00, "negative overflow"},
        {1e10f, 0x7c00, "far above"},
        {INFINITY, 0x7c00, "inf"},
        {-INFINITY, 0xfc00, "-inf"},
        {0.0f, 0x0000, "zero"},
        {-0.0f, 0x8000, "negative zero keeps its sign"},
        {0x1p-24f, 0x0001, "smallest subnormal half"},
        {-0x1p-24f, 0x8001, "smallest negative subnormal"},
        {0x1p-25f, 0x0000, "half the smallest subnormal: tie to even zero"},
        {nextafterf(0x1p-25f, 1.0f), 0x0001, "just above half the smallest subnormal"},
        {-0x1p-26f, 0x8000, "underflow to negative zero"},
        {3 * 0x1p-25f, 0x0002, "tie between subnormals 1 and 2 goes to 2"},
        {5 * 0x1p-25f, 0x0002, "tie between subnormals 2 and 3 goes to 2"},
        {1023 * 0x1p-24f, 0x03ff, "largest subnormal"},
        {1023.5f * 0x1p-24f, 0x0400, "tie between the largest subnormal and the smallest normal"},
        {0x1p-14f, 0x0400, "smallest normal"},
        {nextafterf(0x1p-14f, 0.0f), 0x0400, "just below the smallest normal rounds up into it"},
        {0x1p-149f, 0x0000, "smallest f32 subnormal"},
        {2.0f - 0x1p-11f, 0x4000, "tie at the top of a binade carries into the exponent"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        uint16_t got = f32_to_f16(cases[i].x);
        cr_expect(got == cases[i].want, "%s: f32 %a -> %04x, expected %04x", cases[i].why,
                  (double)cases[i].x, got, cases[i].want);
        cr_expect(got == ref_f32_to_f16(cases[i].x), "%s: the reference disagrees (%04x)", cases[i].why,
                  ref_f32_to_f16(cases[i].x));
    }
    uint16_t n = f32_to_f16(NAN), mn = f32_to_f16(-NAN);
    cr_expect(f16_is_nan(n) && !(n & 0x8000u), "NaN -> %04x", n);
    cr_expect(f16_is_nan(mn) && (mn & 0x8000u), "-NaN -> %04x", mn);
    /* A NaN whose payload lives only in the low 13 bits must not become inf. */
    uint16_t low = f32_to_f16(float_of(0x7f800001u));
    cr_expect(f16_is_nan(low), "f32 NaN 7f800001 -> %04x", low);
}

/* ---- f32 -> bf16 edge cases ---- */

Test(cast, f32_to_bf16_edges) {
    const struct f16_case cases[] = {
        {1.0f, 0x3f80, "one"},
        {1.0f + 0x1p-8f, 0x3f80, "tie between 1 and 1+2^-7 goes to even 1"},
        {1.0f + 3 * 0x1p-8f, 0x3f82, "tie between 1+2^-7 and 1+2^-6 goes to even"},
        {nextafterf(1.0f + 0x1p-8f, 2.0f), 0x3f81, "just above the tie"},
        {-1.0f - 0x1p-8f, 0xbf80, "negative tie to even"},
        {float_of(0x7f7fffffu), 0x7f80, "largest f32 rounds to inf"},
        {float_of(0x7f7f7fffu), 0x7f7f, "just below the overflow tie"},
        {float_of(0x7f7f8000u), 0x7f80, "overflow tie: even is inf"},
        {INFINITY, 0x7f80, "inf"},
        {-INFINITY, 0xff80, "-inf"},
        {-0.0f, 0x8000, "negative zero"},
        {float_of(0x00000001u), 0x0000, "smallest f32 subnormal rounds to zero"},
        {float_of(0x00008000u), 0x0000, "subnormal tie to even zero"},
        {float_of(0x00018000u), 0x0002, "subnormal tie to even 2"},
        {float_of(0x007fffffu), 0x0080, "largest f32 subnormal rounds up to the smallest normal"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        uint16_t got = f32_to_bf16(cases[i].x);
        cr_expect(got == cases[i].want, "%s: f32 %08x -> %04x, expected %04x", cases[i].why,
                  bits_of(cases[i].x), got, cases[i].want);
        cr_expect(got == ref_f32_to_bf16(cases[i].x), "%s: the reference disagrees (%04x)", cases[i].why,
                  ref_f32_to_bf16(cases[i].x));
    }
    const uint32_t nans[] = {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u, 0x7fffffffu, 0x7f80ffffu};
    for (size_t i = 0; i < sizeof nans / sizeof *nans; i++) {
        uint16_t got = f32_to_bf16(float_of(nans[i]));
        cr_expect(bf16_is_nan(got) && (got >> 15) == (nans[i] >> 31), "NaN %08x -> %04x", nans[i], got);
    }
}

/* ---- random f32 patterns against the reference ---- */

/* Half the patterns uniform over all 2^32; half with the exponent where f16 rounding is
 * interesting (subnormal halves to overflow), a quarter of those forced onto exact ties. */
static uint32_t rand_pattern(struct test_rng *rng, int i, uint32_t tie_bits, uint32_t lo_exp,
                             uint32_t hi_exp) {
    uint32_t u = (uint32_t)test_rng_next(rng);
    if (i % 2 == 0) return u;
    uint32_t exp = lo_exp + (uint32_t)(test_rng_next(rng) % (hi_exp - lo_exp + 1));
    u = (u & 0x807fffffu) | exp << 23;
    if (i % 8 == 1) u = (u & ~(2 * tie_bits - 1)) | tie_bits;
    return u;
}

Test(cast, f32_to_f16_random_vs_reference) {
    struct test_rng rng = {2024};
    int mismatches = 0;
    for (int i = 0; i < 1000000; i++) {
        uint32_t u = rand_pattern(&rng, i, 0x1000u, 127 - 27, 127 + 16);
        float x = float_of(u);
        uint16_t got = f32_to_f16(x);
        if (isnan(x)) {
            if (!f16_is_nan(got) && mismatches++ < 5) cr_expect(0, "NaN %08x -> %04x", u, got);
            continue;
        }
        uint16_t want = ref_f32_to_f16(x);
        if (got != want && mismatches++ < 5) cr_expect(0, "f32 %08x (%a) -> %04x, reference %04x", u, (double)x, got, want);
    }
    cr_expect(mismatches == 0, "%d of 1000000 patterns differ from the reference", mismatches);
}

Test(cast, f32_to_bf16_random_vs_reference) {
    struct test_rng rng = {2025};
    int mismatches = 0;
    for (int i = 0; i < 1000000; i++) {
        uint32_t u = rand_pattern(&rng, i, 0x8000u, 0, 255);
        float x = float_of(u);
        uint16_t got = f32_to_bf16(x);
        if (isnan(x)) {
            if (!bf16_is_nan(got) && mismatches++ < 5) cr_expect(0, "NaN %08x -> %04x", u, got);
            continue;
        }
        uint16_t want = ref_f32_to_bf16(x);
        if (got != want && mismatches++ < 5) cr_expect(0, "f32 %08x (%a) -> %04x, reference %04x", u, (double)x, got, want);
    }
    cr_expect(mismatches == 0, "%d of 1000000 patterns differ from the reference", mismatches);
}

/* ---- ops_cast on tensors ---- */

/* The value of element i of a tensor as f32. */
static float load_as_f32(const void *data, enum dtype dtype, int64_t i) {
    switch (dtype) {
    case DTYPE_BF16: return bf16_to_f32(((const uint16_t *)data)[i]);
    case DTYPE_F16: return f16_to_f32(((const uint16_t *)data)[i]);
    default: return ((const float *)data)[i];
    }
}

static uint32_t stored_bits(const void *data, enum dtype dtype, int64_t i) {
    return dtype == DTYPE_F32 ? ((const uint32_t *)data)[i] : ((const uint16_t *)data)[i];
}

/* What converting the f32 value x to dtype stores. */
static uint32_t expected_bits(float x, enum dtype dtype) {
    switch (dtype) {
    case DTYPE_BF16: return f32_to_bf16(x);
    case DTYPE_F16: return f32_to_f16(x);
    default: return bits_of(x);
    }
}

Test(cast, ops_cast_all_pairs) {
    struct smelt_error err;
    const enum dtype dtypes[] = {DTYPE_F32, DTYPE_BF16, DTYPE_F16};
    const int64_t n = 70007; /* above the parallel threshold, odd, 7 * 10001 */
    struct test_rng rng = {77};
    float *values = test_rand_f32(&rng, n, -70000, 70000); /* overflows f16 at the ends */
    values[0] = -0.0f, values[1] = NAN, values[2] = INFINITY, values[3] = 1e-7f, values[4] = 65520.0f;
    for (int a = 0; a < 3; a++) {
        struct tensor in;
        int64_t in_shape[2] = {7, n / 7};
        TEST_OK(tensor_alloc(&in, BACKEND_CPU, dtypes[a], 2, in_shape, &err), &err);
        for (int64_t i = 0; i < n; i++) {
            uint32_t b = expected_bits(values[i], dtypes[a]);
            if (dtypes[a] == DTYPE_F32) ((uint32_t *)in.data)[i] = b;
            else ((uint16_t *)in.data)[i] = (uint16_t)b;
        }
        for (int b = 0; b < 3; b++) {
            struct tensor out;
            int64_t out_shape[1] = {n}; /* another shape, same numel */
            TEST_OK(tensor_alloc(&out, BACKEND_CPU, dtypes[b], 1, out_shape, &err), &err);
            TEST_OK(ops_cast(&out, &in, &err), &err);
            int bad = 0;
            for (int64_t i = 0; i < n; i++) {
                float x = load_as_f32(in.data, dtypes[a], i);
                uint32_t got = stored_bits(out.data, dtypes[b], i), want = expected_bits(x, dtypes[b]);
                if (got != want && bad++ < 3)
                    cr_expect(0, "%s -> %s element %lld (%g): %x, expected %x", dtype_name(dtypes[a]),
                              dtype_name(dtypes[b]), (long long)i, x, got, want);
            }
            cr_expect(bad == 0, "%s -> %s: %d elements wrong", dtype_name(dtypes[a]), dtype_name(dtypes[b]), bad);
            tensor_free(&out);
        }
        tensor_free(&in);
    }
    free(values);
}

Test(cast, ops_cast_errors) {
    struct smelt_error err;
    float f[6] = {0};
    int32_t i[6] = {0};
    uint16_t h[6] = {0};
    int64_t s6[1] = {6}, s5[1] = {5}, s23[2] = {2, 3};
    struct tensor tf = tensor_f32(f, 1, s6), ti = tensor_i32(i, 1, s6);
    struct tensor th = tensor_make(BACKEND_CPU, DTYPE_F16, h, 2, s23);
    struct tensor th5 = tensor_make(BACKEND_CPU, DTYPE_BF16, h, 1, s5);
    TEST_EXPECT_ERROR(ops_cast(&tf, &ti, &err), SMELT_EUNSUPPORTED, &err);
    cr_expect(strstr(err.message, "i32") != NULL, "message: %s", err.message);
    TEST_EXPECT_ERROR(ops_cast(&ti, &tf, &err), SMELT_EUNSUPPORTED, &err);
    TEST_EXPECT_ERROR(ops_cast(&ti, &ti, &err), SMELT_EUNSUPPORTED, &err);
    TEST_EXPECT_ERROR(ops_cast(&th5, &tf, &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, "out") != NULL, "message: %s", err.message);
    TEST_EXPECT_ERROR(ops_cast(&tf, NULL, &err), SMELT_EINVAL, &err);
    TEST_EXPECT_ERROR(ops_cast(NULL, &tf, &err), SMELT_EINVAL, &err);
    struct tensor nodata = tensor_f32(NULL, 1, s6);
    TEST_EXPECT_ERROR(ops_cast(&th, &nodata, &err), SMELT_EINVAL, &err);
    struct tensor cuda = tensor_make(BACKEND_CUDA, DTYPE_F32, f, 1, s6);
    if (!backend_available(BACKEND_CUDA)) {
        TEST_EXPECT_ERROR(ops_cast(&th, &cuda, &err), SMELT_EUNSUPPORTED, &err);
    } else {
        TEST_EXPECT_ERROR(ops_cast(&th, &cuda, &err), SMELT_EINVAL, &err); /* out is on the CPU */
    }
    TEST_OK(ops_cast(&th, &tf, &err), &err); /* [6] f32 -> [2, 3] f16: numel is what counts */
}
