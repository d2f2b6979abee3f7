/* The CUDA fused attention kernels (kernels/cuda/attention_kernels.cuh), run on the CPU
 * through the emulator, against the CPU backend's ops_attention and its backward.
 *
 * This checks the kernels' logic on machines without a GPU: tiling, causal and sequence
 * masks, GQA head mapping, the online softmax, the accumulating gradients, padding rows,
 * shared-memory layout (the unused tail of shared memory is poisoned and must stay
 * untouched; a read of it poisons the result), and barriers (every thread is a real
 * thread). It cannot check what only a GPU shows: launch limits, the shared-memory
 * opt-in, memory coalescing, speed. tests/gpu/ compares the same op on a real device. */
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>

#include <random>
#include <vector>

#include "cuda_emu.h"
#include "kernels/cuda/attention_kernels.cuh"

extern float attn_shared[EMU_SHARED_FLOATS];

/* f32: the sums run in another order than the CPU's (online softmax, tiles);
 * bf16: inputs are exact bf16 on both sides, outputs rounded once to bf16. */
static const double TOL_F32 = 1e-4, TOL_BF16 = 2e-2;

struct sizes {
    int hq, hkv, dim;
    std::vector<int32_t> lens;
};

static float to_float(float x) { return x; }
static float to_float(bf16 x) { return bf16_to_f32(x.bits); }
static void from_float(float *dst, float x) { *dst = x; }
static void from_float(bf16 *dst, float x) { dst->bits = f32_to_bf16(x); }

template <typename T> static std::vector<T> to_storage(const std::vector<float> &x) {
    std::vector<T> out(x.size());
    for (size_t i = 0; i < x.size(); i++) from_float(&out[i], x[i]);
    return out;
}

template <typename T> static std::vector<float> to_floats(const std::vector<T> &x) {
    std::vector<float> out(x.size());
    for (size_t i = 0; i < x.size(); i++) out[i] = to_float(x[i]);
    return out;
}

/* Random values in [-1, 1), exactly representable in T. */
template <typename T> static std::vector<float> random_values(std::mt19937_64 &rng, size_t n) {
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    std::vector<float> x(n);
    for (auto &v : x) v = dist(rng);
    return to_floats(to_storage<T>(x));
}

/* |got - want| <= tol * max(1, max |want|) everywhere, NaN failing. */
static void expect_close(const char *what, const std::vector<float> &got, const std::vector<float> &want,
                         double tol, const char *label) {
    cr_assert_eq(got.size(), want.size());
    double scale = 1.0;
    for (float w : want) scale = fmax(scale, fabs((double)w));
    size_t worst = 0;
    double worst_diff = -1.0;
    for (size_t i = 0; i < got.size(); i++) {
        double diff = fabs((double)got[i] - want[i]);
        if (!(diff <= worst_diff) || isnan(diff)) {
            worst = i;
            worst_diff = isnan(diff) ? INFINITY : diff;
        }
    }
    cr_expect(worst_diff <= tol * scale, "%s %s: element %zu is %.9g, expected %.9g (tol %g x %g)", label, what,
              worst, got.empty() ? 0.0 : (double)got[worst], want.empty() ? 0.0 : (double)want[worst], tol, scale);
}

/* Poisons shared memory, runs one launch as attention.cu configures it, and checks that
 * nothing past the launch's shared memory was written. */
static void launch_checked(const attn_launch &l, const char *kernel, const std::function<void()> &body) {
    int64_t floats = (int64_t)(l.shared_bytes / sizeof(float));
    cr_assert(floats <= EMU_SHARED_FLOATS, "%s needs %lld floats of shared memory", kernel, (long long)floats);
    for (int64_t i = 0; i < EMU_SHARED_FLOATS; i++) attn_shared[i] = NAN;
    emu_launch(l.grid, l.threads, body);
    for (int64_t i = floats; i < EMU_SHARED_FLOATS; i++)
        if (!isnan(attn_shared[i])) cr_assert_fail("%s wrote shared memory at %lld, past its %lld floats", kernel, (long long)i, (long long)floats);
}

template <typename T> static void check_case(const sizes &z, uint64_t seed) {
    char label[160];
    snprintf(label, sizeof label, "%s Hq %d Hkv %d D %d, %zu sequences", sizeof(T) == 2 ? "bf16" : "f32", z.hq, z.hkv,
             z.dim, z.lens.size());
    std::mt19937_64 rng(seed);
    std::vector<int32_t> cu(1, 0);
    for (int32_t len : z.lens) cu.push_back(cu.back() + len);
    const int64_t T_ = cu.back(), nseq = (int64_t)z.lens.size();
    const size_t nq = (size_t)(T_ * z.hq * z.dim), nkv = (size_t)(T_ * z.hkv * z.dim), nrow = (size_t)(T_ * z.hq);
    const float scale = 1.0f / sqrtf((float)z.dim);

    std::vector<float> q = random_values<T>(rng, nq), k = random_values<T>(rng, nkv), v = random_values<T>(rng, nkv);
    std::vector<float> dout = random_values<T>(rng, nq);
    std::vector<float> dq0 = random_values<T>(rng, nq), dk0 = random_values<T>(rng, nkv), dv0 = random_values<T>(rng, nkv);

    /* The CPU backend's answer, in f32 on the same values. */
    struct smelt_error err;
    int64_t sq_[3] = {T_, z.hq, z.dim}, skv[3] = {T_, z.hkv, z.dim}, srow[2] = {T_, z.hq}, scu = nseq + 1;
    std::vector<float> out_ref(nq), lse_ref(nrow), dq_ref = dq0, dk_ref = dk0, dv_ref = dv0;
    struct tensor tq = tensor_f32(q.data(), 3, sq_), tk = tensor_f32(k.data(), 3, skv), tv = tensor_f32(v.data(), 3, skv);
    struct tensor tout = tensor_f32(out_ref.data(), 3, sq_), tlse = tensor_f32(lse_ref.data(), 2, srow);
    struct tensor tcu = tensor_i32(cu.data(), 1, &scu), tdout = tensor_f32(dout.data(), 3, sq_);
    struct tensor tdq = tensor_f32(dq_ref.data(), 3, sq_), tdk = tensor_f32(dk_ref.data(), 3, skv),
                  tdv = tensor_f32(dv_ref.data(), 3, skv);
    cr_assert_eq(ops_attention(&tout, &tlse, &tq, &tk, &tv, &tcu, scale, &err), 0, "%s", err.message);
    cr_assert_eq(ops_attention_backward(&tdq, &tdk, &tdv, &tdout, &tq, &tk, &tv, &tout, &tlse, &tcu, scale, &err), 0,
                 "%s", err.message);

    /* The kernels, in T, exactly as attention.cu launches them. */
    std::vector<T> eq = to_storage<T>(q), ek = to_storage<T>(k), ev = to_storage<T>(v), edout = to_storage<T>(dout);
    std::vector<T> eout = to_storage<T>(std::vector<float>(nq, NAN));
    std::vector<float> lse_emu(nrow, NAN), delta(nrow, NAN);
    std::vector<T> edq = to_storage<T>(dq0), edk = to_storage<T>(dk0), edv = to_storage<T>(dv0);
    attn_shape sh{z.hq, z.hkv, z.dim, scale};
    int rc = attn_with_head_bound(z.dim, "emu", &err, [&](auto dmax, auto rq) -> int {
        constexpr int DMAX = decltype(dmax)::value, R = decltype(rq)::value, RK = R / 2;
        std::vector<attn_tile> tiles((size_t)attn_tile_count(cu.data(), nseq, attn_tile_rows(R)));
        attn_tiles_fill(tiles.data(), cu.data(), nseq, attn_tile_rows(R));
        std::vector<attn_tile> kv_tiles((size_t)attn_tile_count(cu.data(), nseq, attn_tile_rows(RK)));
        attn_tiles_fill(kv_tiles.data(), cu.data(), nseq, attn_tile_rows(RK));
        if (!tiles.empty()) {
            launch_checked(attn_forward_launch((int64_t)tiles.size(), sh, R), "attention_forward_kernel", [&] {
                attention_forward_kernel<T, DMAX, R>(eout.data(), lse_emu.data(), eq.data(), ek.data(), ev.data(),
                                                     tiles.data(), sh);
            });
        }
        launch_checked(attn_delta_launch((int64_t)nrow), "attention_delta_kernel", [&] {
            attention_delta_kernel<T>(delta.data(), edout.data(), eout.data(), (int64_t)nrow, z.dim);
        });
        if (!tiles.empty())
            launch_checked(attn_dq_launch((int64_t)tiles.size(), sh, R), "attention_dq_kernel", [&] {
                attention_dq_kernel<T, DMAX, R>(edq.data(), edout.data(), eq.data(), ek.data(), ev.data(),
                                                lse_emu.data(), delta.data(), tiles.data(), sh);
            });
        if (!kv_tiles.empty())
            launch_checked(attn_dkv_launch((int64_t)kv_tiles.size(), sh, RK), "attention_dkv_kernel", [&] {
                attention_dkv_kernel<T, DMAX, RK>(edk.data(), edv.data(), edout.data(), eq.data(), ek.data(),
                                                  ev.data(), lse_emu.data(), delta.data(), kv_tiles.data(), sh);
            });
        return 0;
    });
    cr_assert_eq(rc, 0, "%s", err.message);

    double tol = sizeof(T) == 2 ? TOL_BF16 : TOL_F32;
    expect_close("out", to_floats(eout), out_ref, tol, label);
    expect_close("lse", lse_emu, lse_ref, sizeof(T) == 2 ? 1e-5 : 1e-5, label);
    expect_close("dq", to_floats(edq), dq_ref, tol, label);
    expect_close("dk", to_floats(edk), dk_ref, tol, label);
    expect_close("dv", to_floats(edv), dv_ref, tol, label);
}

/* Sequences shorter than, equal to and longer than the tiles (16 rows per thread
 * group: 64-row query tiles, 32-key tiles), an empty one, and a single token. */
static const std::vector<int32_t> LENS = {33, 0, 1, 64, 70, 5};

Test(attention_emu, head_dims_and_groups) {
    const sizes cases[] = {
        {4, 2, 8, LENS},    /* GQA 2, the smallest head */
        {3, 3, 40, LENS},   /* D not a multiple of 8 or 32 */
        {4, 1, 64, {97}},   /* MQA, D exactly the bound */
        {2, 2, 96, {40, 65}}, /* the 128 bound */
    };
    uint64_t seed = 1;
    for (const sizes &z : cases) {
        check_case<float>(z, seed++);
        check_case<bf16>(z, seed++);
    }
}

Test(attention_emu, head_dim_256_bound) {
    check_case<float>({2, 1, 130, {20, 35}}, 11);
    check_case<bf16>({2, 1, 130, {20, 35}}, 12);
}

Test(attention_emu, deterministic) {
    /* Same inputs twice: the same bits (no scheduling-dependent sums). */
    std::mt19937_64 rng(7);
    std::vector<int32_t> cu = {0, 50, 90};
    const int hq = 2, hkv = 1, dim = 16, T_ = 90;
    std::vector<float> q = random_values<float>(rng, (size_t)T_ * hq * dim);
    std::vector<float> k = random_values<float>(rng, (size_t)T_ * hkv * dim), v = random_values<float>(rng, (size_t)T_ * hkv * dim);
    attn_shape sh{hq, hkv, dim, 0.25f};
    std::vector<attn_tile> tiles((size_t)attn_tile_count(cu.data(), 2, attn_tile_rows(4)));
    attn_tiles_fill(tiles.data(), cu.data(), 2, attn_tile_rows(4));
    std::vector<float> a(q.size()), b(q.size()), la(T_ * hq), lb(T_ * hq);
    for (int run = 0; run < 2; run++) {
        float *o = run ? b.data() : a.data(), *l = run ? lb.data() : la.data();
        launch_checked(attn_forward_launch((int64_t)tiles.size(), sh, 4), "attention_forward_kernel", [&] {
            attention_forward_kernel<float, 64, 4>(o, l, q.data(), k.data(), v.data(), tiles.data(), sh);
        });
    }
    cr_expect(memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0, "out differs between runs");
    cr_expect(memcmp(la.data(), lb.data(), la.size() * sizeof(float)) == 0, "lse differs between runs");
}

Test(attention_emu, head_dim_above_bound_refused) {
    struct smelt_error err;
    error_clear(&err);
    int rc = attn_with_head_bound(257, "ops_attention", &err, [](auto, auto) -> int { return 0; });
    cr_expect_eq(rc, SMELT_EUNSUPPORTED);
    cr_expect(strstr(err.message, "head_dim 257") != NULL, "message: %s", err.message);
}
